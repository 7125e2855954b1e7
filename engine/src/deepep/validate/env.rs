//! A job's environment: the NVSHMEM variables (parsed once, here, into typed settings) and
//! eptwin's own; the lane its SL selects; jobs sharing a VL.

use super::{IBGDA_MIN_QP_DEPTH, Job};
use crate::deepep::env::{
    MAX_QP_DEPTH, MIN_QP_DEPTH, NvshmemSettings, effective_qp_depth, parse_env_bool, parse_env_u64,
};
use crate::diag::Diagnostics;
use crate::fabric::{FabricQos, Lane};
use crate::ids::{Sl, Vl};
use crate::scenario::schema::{FabricKind, Scenario};

/// What the user's variables say, before DeepEP's writes (`deepep::env::effective_env`).
#[derive(Debug, Clone, Copy)]
pub(super) struct UserEnv {
    pub nvshmem: NvshmemSettings,
    /// `DISABLE_NVLINK_CHECK = "1"`: eptwin's bypass of the PCIe NVLink check.
    pub disable_nvlink_check: bool,
}

/// NVSHMEM and eptwin variables: every malformed value reported, every value parsed.
pub(super) fn check_job_env(job: &Job<'_>, uses_nvshmem: bool, d: &mut Diagnostics<'_>) -> UserEnv {
    let (prefix, name, profile) = (job.prefix.as_str(), job.name(), job.profile);
    let mut s = NvshmemSettings::default();
    let mut disable_nvlink_check = false;
    for (var, value) in &job.spec.env {
        let key = format!("{prefix}.env.{var}");
        match var.as_str() {
            "NVSHMEM_IB_SL" => match parse_env_u64(value) {
                Some(v) if v <= 15 => {
                    s.ib_sl = v as u8;
                    if profile.fabric.kind == FabricKind::Roce && v > 7 {
                        d.error("roce-priority", &key, name, format!("NVSHMEM_IB_SL = {v} is the Ethernet priority on RoCE: must be 0..=7"));
                    }
                }
                _ => d.error("ib-sl", &key, name, format!("NVSHMEM_IB_SL = {value:?}: a service level is an integer 0..=15 (4-bit LRH field)")),
            },
            "NVSHMEM_QP_DEPTH" => match parse_env_u64(value) {
                Some(v) if (MIN_QP_DEPTH as u64..=MAX_QP_DEPTH as u64).contains(&v) => {
                    s.qp_depth = effective_qp_depth(v);
                    if !v.is_power_of_two() {
                        d.advisory("qp-depth-pow2", &key, name, format!("NVSHMEM rounds NVSHMEM_QP_DEPTH = {v} up to {}", effective_qp_depth(v)));
                    }
                    if v > profile.nic.max_qp_depth as u64 {
                        d.error("qp-depth-nic", &key, name, format!("{v} exceeds the NIC's maximum QP depth {}", profile.nic.max_qp_depth));
                    }
                }
                Some(v) => {
                    // Out of range: NVSHMEM would clamp it (the LL depth rule still reads it).
                    s.qp_depth = effective_qp_depth(v);
                    d.error("qp-depth-range", &key, name, format!("NVSHMEM_QP_DEPTH = {v}: NVSHMEM accepts {MIN_QP_DEPTH}..={MAX_QP_DEPTH} (a power of two); DeepEP's IBGDA layer needs ≥ {IBGDA_MIN_QP_DEPTH}"));
                }
                None => d.error("qp-depth-range", &key, name, format!("NVSHMEM_QP_DEPTH = {value:?} is not an integer")),
            },
            "NVSHMEM_IB_TRAFFIC_CLASS" => match parse_env_u64(value) {
                Some(v) if v <= 255 => {
                    s.traffic_class = Some(v as u8);
                    not_modelled(&key, name, var, d);
                }
                _ => d.error("traffic-class", &key, name, format!("{value:?}: a traffic class is an integer 0..=255")),
            },
            "NVSHMEM_IB_GID_INDEX" => {
                // Only the hardware backend's RDMA layer reads it (RoCE GID selection); a value
                // that is not an index leaves NVSHMEM's own choice.
                s.gid_index = value.trim().parse::<i64>().ok().and_then(|v| u32::try_from(v).ok());
                not_modelled(&key, name, var, d);
            }
            "DISABLE_NVLINK_CHECK" => {
                disable_nvlink_check = value == "1";
                if !matches!(value.as_str(), "0" | "1") {
                    d.error("disable-nvlink-check", &key, name, format!("{value:?}: use \"1\" to bypass eptwin's NVLink check or \"0\""));
                }
            }
            "NVSHMEM_DISABLE_P2P" | "NVSHMEM_IBGDA_NUM_RC_PER_PE" | "NVSHMEM_IB_ENABLE_IBGDA" | "NVSHMEM_MAX_TEAMS"
            | "NVSHMEM_DISABLE_NVLS" | "NVSHMEM_CUMEM_GRANULARITY" | "NVSHMEM_DISABLE_MNNVL" => {
                match var.as_str() {
                    "NVSHMEM_DISABLE_P2P" => s.disable_p2p = parse_env_bool(value),
                    "NVSHMEM_DISABLE_MNNVL" => s.disable_mnnvl = parse_env_bool(value),
                    "NVSHMEM_IBGDA_NUM_RC_PER_PE" => {
                        s.num_rc_per_pe = parse_env_u64(value).map_or(2, |v| v as u32)
                    }
                    _ => {}
                }
                let kept = var == "NVSHMEM_DISABLE_MNNVL" && job.spec.buffer.as_ref().is_some_and(|b| b.allow_mnnvl);
                if uses_nvshmem && !kept {
                    d.advisory(
                        "env-overwritten",
                        &key,
                        name,
                        format!("DeepEP's Buffer.__init__ writes {var} itself; this value is overwritten (see `eptwin env`)"),
                    );
                }
            }
            other if other.starts_with("NVSHMEM_") => not_modelled(&key, name, other, d),
            _ => {}
        }
    }
    UserEnv { nvshmem: s, disable_nvlink_check }
}

fn not_modelled(key: &str, name: Option<&str>, var: &str, d: &mut Diagnostics<'_>) {
    d.advisory(
        "env-not-modelled",
        key,
        name,
        format!("{var} is passed through to the environment but not modelled by the simulator"),
    );
}

/// The lane the job's SL selects. On InfiniBand the SL → VL mapping must deliver the job's
/// packets to a VL the arbiter serves; `None` (reported) when the SL's packets are dropped.
pub(super) fn check_job_sl(
    job: &Job<'_>,
    sl: Sl,
    qos: &FabricQos,
    d: &mut Diagnostics<'_>,
) -> Option<Lane> {
    let prefix = &job.prefix;
    let key = if job.spec.env.contains_key("NVSHMEM_IB_SL") {
        format!("{prefix}.env.NVSHMEM_IB_SL")
    } else {
        "cluster.fabric.sl2vl".into()
    };
    if qos.kind == FabricKind::Roce {
        return qos.lane_of(sl);
    }
    match qos.vl_of(sl) {
        None => {
            d.error("sl-dropped", &key, job.name(), format!("SL{} maps to VL15 in sl2vl: its packets are dropped (VL15 carries subnet management only)", sl.0));
            None
        }
        Some(vl) => {
            if !qos.vl_is_scheduled(vl) {
                d.error(
                    "vl-never-scheduled",
                    &key,
                    job.name(),
                    format!("SL{} → VL{}, which has no entry with weight > 0 in vlarb_high or vlarb_low: the arbiter never sends it and the job stalls", sl.0, vl.0),
                );
            }
            qos.lane_of(sl)
        }
    }
}

/// Isolation advice: jobs sharing a VL share its buffers and arbitration turn.
pub(super) fn check_shared_vls(scn: &Scenario, job_vls: &[Option<Vl>], d: &mut Diagnostics<'_>) {
    if scn.jobs.len() > 1 {
        for (i, a) in job_vls.iter().enumerate() {
            for (j, b) in job_vls.iter().enumerate().skip(i + 1) {
                if let (Some(a), Some(b)) = (a, b)
                    && a == b
                {
                    d.advisory(
                        "shared-vl",
                        &format!("job[{j}].env"),
                        Some(&scn.jobs[j].name),
                        format!(
                            "shares VL{} with job {:?}: no isolation between them (DeepEP README recommends separate VLs via NVSHMEM_IB_SL)",
                            a.0, scn.jobs[i].name
                        ),
                    );
                }
            }
        }
    }
}
