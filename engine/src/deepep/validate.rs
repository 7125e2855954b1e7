//! Every rule DeepEP V1 (and NVSHMEM, and the fabric) enforces on a configuration, plus
//! advisories that are not errors. Sources are cited per rule (deepep.md §5 and friends).
//! The validator reports everything it finds, never just the first problem.

use std::collections::BTreeMap;

use super::config::{
    self, Config, Direction, EpMode, INT_MAX, hint_hidden_bytes, low_latency_rdma_size_hint,
    num_rdma_ranks,
};
use super::env::{self, MAX_QP_DEPTH, MIN_QP_DEPTH, NvshmemSettings, effective_env, parse_env_u64};
use crate::diag::Diagnostics;
use crate::fabric::FabricQos;
use crate::ids::{GpuId, Rank, Sl};
use crate::profile::{self, HardwareProfile};
use crate::scenario::schema::{
    BufferSpec, Dtype, FabricKind, JobSpec, NvlinkKind, OpKind, RoutingKind, Scenario,
    TrafficPattern, WorkloadSpec,
};
use crate::scenario::source::SourceMap;
use crate::topology::{
    DeclaredProbe, NUM_MAX_NVL_PEERS, NUM_MAX_RDMA_PEERS, NvlinkCheckMode, Topology,
    check_nvlink_connections,
};

/// `launch.cuh` instantiation domains.
const INTRANODE_RANKS: [u32; 3] = [2, 4, 8];
const INTERNODE_NODES: [u32; 9] = [2, 3, 4, 6, 8, 12, 16, 18, 20];
const LL_HIDDEN: [u32; 8] = [2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192];
/// `NUM_MAX_LOCAL_EXPERTS` (configs.cuh).
const NUM_MAX_LOCAL_EXPERTS: u32 = 1024;
/// Normal kernels: `num_topk ≤ 32` (intranode.cu:237, internode.cu:514); LL: ≤ 11.
const NORMAL_MAX_TOPK: u32 = 32;
const LL_MAX_TOPK: u32 = 11;
/// ibgda_device.cuh static assert: minimum QP depth.
const IBGDA_MIN_QP_DEPTH: u32 = 64;
/// Normal internode combine: `num_rdma_ranks ≤ 24` (internode.cu:2358).
const COMBINE_MAX_RDMA_RANKS: u32 = 24;

/// Everything the validator learned that the planner reuses.
#[derive(Debug, Clone)]
pub struct Validated {
    pub profile: HardwareProfile,
    pub topology: Topology,
    pub qos: FabricQos,
    /// Sorted global ranks per job.
    pub job_ranks: Vec<Vec<u32>>,
}

/// Validate a parsed scenario. Returns the diagnostics (errors and advisories) and, when there
/// are no errors, the resolved pieces.
pub fn validate(
    scn: &Scenario,
    src: &SourceMap,
) -> (Vec<crate::diag::Diagnostic>, Option<Validated>) {
    let mut d = Diagnostics::new(src);
    let validated = validate_into(scn, &mut d);
    let ok = !d.has_errors();
    (d.items, validated.filter(|_| ok))
}

fn validate_into(scn: &Scenario, d: &mut Diagnostics<'_>) -> Option<Validated> {
    if scn.name.is_empty()
        || !scn.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        d.error(
            "name",
            "name",
            None,
            format!(
                "{:?}: a scenario name becomes a file name; use letters, digits, '-', '_', '.'",
                scn.name
            ),
        );
    }

    let profile = match profile::resolve(&scn.cluster) {
        Ok(p) => p,
        Err(e) => {
            d.error("profile", &e.key, None, e.message);
            return None;
        }
    };
    // Ranges and limits first: the rules below compute with these values.
    let in_range = profile::ranges::check(&profile, d);
    if !(crate::scenario::limits::check(scn, &profile, d) && in_range) {
        return None;
    }
    let topology = Topology::from_profile(&profile.cluster);
    check_cluster(&topology, d);

    let qos = match FabricQos::from_params(&profile.fabric) {
        Ok(q) => Some(q),
        Err(errors) => {
            for (key, message) in errors {
                let base = key.split('[').next().unwrap_or(&key).to_string();
                let written = scn.cluster.fabric.is_some()
                    && d.source().has(&format!("cluster.fabric.{base}"));
                let path = if written {
                    format!("cluster.fabric.{key}")
                } else {
                    "cluster.profile".into()
                };
                d.error("fabric", &path, None, message);
            }
            None
        }
    };

    if scn.jobs.is_empty() {
        d.error("jobs", "job", None, "a scenario needs at least one [[job]]".into());
    }
    let mut names = BTreeMap::new();
    let mut job_ranks = Vec::new();
    let mut job_vls = Vec::new();
    for (i, job) in scn.jobs.iter().enumerate() {
        let prefix = format!("job[{i}]");
        if let Some(first) = names.insert(job.name.clone(), i) {
            d.error(
                "job-name",
                &format!("{prefix}.name"),
                Some(&job.name),
                format!("the name is already used by job[{first}]; job names must be unique"),
            );
        }
        let ranks = match job.ranks.resolve(topology.num_ranks()) {
            Ok(r) => r,
            Err(message) => {
                d.error("job-ranks", &format!("{prefix}.ranks"), Some(&job.name), message);
                job_ranks.push(Vec::new());
                job_vls.push(None);
                continue;
            }
        };
        let uses_nvshmem = job
            .buffer
            .as_ref()
            .is_some_and(|b| EpMode::new(b.low_latency_mode, ranks.len() as u32).uses_nvshmem());
        let sl = check_job_env(job, &prefix, &profile, uses_nvshmem, d);
        if let Some(qos) = &qos {
            job_vls.push(check_job_sl(job, &prefix, sl, qos, d));
        } else {
            job_vls.push(None);
        }
        match (&job.buffer, &job.workload, &job.traffic) {
            (Some(buffer), Some(workload), None) => {
                check_deepep_job(job, &prefix, buffer, workload, &ranks, &topology, &profile, d)
            }
            (None, None, Some(traffic)) => check_traffic_job(job, &prefix, traffic, &ranks, d),
            (_, _, Some(_)) => d.error(
                "job-kind",
                &format!("{prefix}.traffic"),
                Some(&job.name),
                "a job has either [job.buffer] + [job.workload] (DeepEP) or [job.traffic] (background), not both".into(),
            ),
            (buffer, workload, None) => {
                let missing = if buffer.is_none() { "buffer" } else { "workload" };
                let _ = workload;
                d.error(
                    "job-kind",
                    &prefix,
                    Some(&job.name),
                    format!("missing [job.{missing}]: a DeepEP job needs [job.buffer] and [job.workload]; a background job needs [job.traffic]"),
                );
            }
        }
        job_ranks.push(ranks);
    }

    // Isolation advice: jobs sharing a VL share its buffers and arbitration turn. One advisory
    // per job, naming the first job on its VL (one per pair grew quadratically with jobs).
    let mut on_vl: BTreeMap<u8, (usize, usize)> = BTreeMap::new(); // VL → (first job, jobs)
    for (j, vl) in job_vls.iter().enumerate() {
        let Some(vl) = vl else { continue };
        let (first, before) = *on_vl.entry(vl.0).and_modify(|e| e.1 += 1).or_insert((j, 0));
        if before > 0 {
            let more = if before > 1 {
                format!(" and {} other job(s)", before - 1)
            } else {
                String::new()
            };
            d.advisory(
                "shared-vl",
                &format!("job[{j}].env"),
                Some(&scn.jobs[j].name),
                format!(
                    "shares VL{} with job {:?}{more}: no isolation between them (DeepEP README recommends separate VLs via NVSHMEM_IB_SL)",
                    vl.0, scn.jobs[first].name
                ),
            );
        }
    }

    let qos = qos?;
    Some(Validated { profile, topology, qos, job_ranks })
}

fn check_cluster(t: &Topology, d: &mut Diagnostics<'_>) {
    for (value, key) in
        [(t.nodes, "nodes"), (t.gpus_per_node, "gpus_per_node"), (t.ranks_per_gpu, "ranks_per_gpu")]
    {
        if value == 0 {
            d.error(
                "cluster-shape",
                &format!("cluster.{key}"),
                None,
                format!("{key} = 0; must be at least 1"),
            );
        }
    }
    match t.nvlink {
        NvlinkKind::Mnnvl => {
            let dom = t.nvlink_domain_gpus;
            if dom == 0 || !dom.is_multiple_of(t.gpus_per_node.max(1)) {
                d.error(
                    "mnnvl-domain",
                    "cluster.nvlink_domain_gpus",
                    None,
                    format!("{dom} GPUs per MNNVL domain: must be a positive multiple of gpus_per_node = {}", t.gpus_per_node),
                );
            } else if !t.num_gpus().is_multiple_of(dom) {
                d.advisory(
                    "mnnvl-domain",
                    "cluster.nvlink_domain_gpus",
                    None,
                    format!("{} GPUs do not fill whole {dom}-GPU NVLink domains: the last domain is partial", t.num_gpus()),
                );
            }
        }
        NvlinkKind::PciePairs if !t.gpus_per_node.is_multiple_of(2) => d.error(
            "pcie-pairs",
            "cluster.gpus_per_node",
            None,
            format!(
                "nvlink = \"pcie-pairs\" bridges GPUs in pairs: gpus_per_node = {} must be even",
                t.gpus_per_node
            ),
        ),
        _ => {}
    }
}

/// NVSHMEM and eptwin variables; returns the SL the job's QPs use.
fn check_job_env(
    job: &JobSpec,
    prefix: &str,
    profile: &HardwareProfile,
    uses_nvshmem: bool,
    d: &mut Diagnostics<'_>,
) -> Sl {
    let name = Some(job.name.as_str());
    let mut sl = Sl(0);
    for (var, value) in &job.env {
        let key = format!("{prefix}.env.{var}");
        match var.as_str() {
            "NVSHMEM_IB_SL" => match parse_env_u64(value) {
                Some(v) if v <= 15 => {
                    sl = Sl(v as u8);
                    if profile.fabric.kind == FabricKind::Roce && v > 7 {
                        d.error("roce-priority", &key, name, format!("NVSHMEM_IB_SL = {v} is the Ethernet priority on RoCE: must be 0..=7"));
                    }
                }
                _ => d.error("ib-sl", &key, name, format!("NVSHMEM_IB_SL = {value:?}: a service level is an integer 0..=15 (4-bit LRH field)")),
            },
            "NVSHMEM_QP_DEPTH" => match parse_env_u64(value) {
                Some(v) if (MIN_QP_DEPTH as u64..=MAX_QP_DEPTH as u64).contains(&v) => {
                    if !v.is_power_of_two() {
                        d.advisory("qp-depth-pow2", &key, name, format!("NVSHMEM rounds NVSHMEM_QP_DEPTH = {v} up to {}", env::effective_qp_depth(v)));
                    }
                    if v > profile.nic.max_qp_depth as u64 {
                        d.error("qp-depth-nic", &key, name, format!("{v} exceeds the NIC's maximum QP depth {}", profile.nic.max_qp_depth));
                    }
                }
                Some(v) => d.error("qp-depth-range", &key, name, format!("NVSHMEM_QP_DEPTH = {v}: NVSHMEM accepts {MIN_QP_DEPTH}..={MAX_QP_DEPTH} (a power of two); DeepEP's IBGDA layer needs ≥ {IBGDA_MIN_QP_DEPTH}")),
                None => d.error("qp-depth-range", &key, name, format!("NVSHMEM_QP_DEPTH = {value:?} is not an integer")),
            },
            "NVSHMEM_IB_TRAFFIC_CLASS"
                if !matches!(parse_env_u64(value), Some(v) if v <= 255) => {
                    d.error("traffic-class", &key, name, format!("{value:?}: a traffic class is an integer 0..=255"));
                }
            "DISABLE_NVLINK_CHECK"
                if !matches!(value.as_str(), "0" | "1") => {
                    d.error("disable-nvlink-check", &key, name, format!("{value:?}: use \"1\" to bypass eptwin's NVLink check or \"0\""));
                }
            "NVSHMEM_DISABLE_P2P" | "NVSHMEM_IBGDA_NUM_RC_PER_PE" | "NVSHMEM_IB_ENABLE_IBGDA" | "NVSHMEM_MAX_TEAMS"
            | "NVSHMEM_DISABLE_NVLS" | "NVSHMEM_CUMEM_GRANULARITY" | "NVSHMEM_DISABLE_MNNVL" => {
                let kept = var == "NVSHMEM_DISABLE_MNNVL" && job.buffer.as_ref().is_some_and(|b| b.allow_mnnvl);
                if uses_nvshmem && !kept {
                    d.advisory(
                        "env-overwritten",
                        &key,
                        name,
                        format!("DeepEP's Buffer.__init__ writes {var} itself; this value is overwritten (see `eptwin env`)"),
                    );
                }
            }
            other if other.starts_with("NVSHMEM_") => d.advisory(
                "env-not-modelled",
                &key,
                name,
                format!("{other} is passed through to the environment but not modelled by the simulator"),
            ),
            _ => {}
        }
    }
    sl
}

/// The SL → VL mapping must deliver the job's packets to a VL the arbiter serves.
fn check_job_sl(
    job: &JobSpec,
    prefix: &str,
    sl: Sl,
    qos: &FabricQos,
    d: &mut Diagnostics<'_>,
) -> Option<crate::ids::Vl> {
    let key = if job.env.contains_key("NVSHMEM_IB_SL") {
        format!("{prefix}.env.NVSHMEM_IB_SL")
    } else {
        "cluster.fabric.sl2vl".into()
    };
    if qos.kind == FabricKind::Roce {
        return None;
    }
    match qos.vl_of(sl) {
        None => {
            d.error("sl-dropped", &key, Some(&job.name), format!("SL{} maps to VL15 in sl2vl: its packets are dropped (VL15 carries subnet management only)", sl.0));
            None
        }
        Some(vl) => {
            if !qos.vl_is_scheduled(vl) {
                d.error(
                    "vl-never-scheduled",
                    &key,
                    Some(&job.name),
                    format!("SL{} → VL{}, which has no entry with weight > 0 in vlarb_high or vlarb_low: the arbiter never sends it and the job stalls", sl.0, vl.0),
                );
            }
            Some(vl)
        }
    }
}

fn check_traffic_job(
    job: &JobSpec,
    prefix: &str,
    traffic: &crate::scenario::schema::TrafficSpec,
    ranks: &[u32],
    d: &mut Diagnostics<'_>,
) {
    let name = Some(job.name.as_str());
    let key = |k: &str| format!("{prefix}.traffic.{k}");
    if ranks.len() < 2 {
        d.error(
            "traffic-ranks",
            &format!("{prefix}.ranks"),
            name,
            "background traffic needs at least 2 ranks".into(),
        );
    }
    if traffic.bytes_per_rank.bytes() == 0 {
        d.error(
            "traffic-bytes",
            &key("bytes_per_rank"),
            name,
            "bytes_per_rank = 0 moves nothing".into(),
        );
    }
    if traffic.message_bytes.is_some_and(|m| m.bytes() == 0) {
        d.error("traffic-message", &key("message_bytes"), name, "message_bytes must be > 0".into());
    }
    if traffic.qps_per_peer == 0 {
        d.error("traffic-qps", &key("qps_per_peer"), name, "qps_per_peer must be ≥ 1".into());
    }
    match (traffic.pattern, traffic.incast_target) {
        (TrafficPattern::Incast, None) => d.error(
            "incast-target",
            &key("incast_target"),
            name,
            "pattern = \"incast\" needs incast_target (a global rank of this job)".into(),
        ),
        (TrafficPattern::Incast, Some(t)) if !ranks.contains(&t) => d.error(
            "incast-target",
            &key("incast_target"),
            name,
            format!("incast_target = {t} is not one of the job's ranks"),
        ),
        (p, Some(_)) if p != TrafficPattern::Incast => d.advisory(
            "incast-target",
            &key("incast_target"),
            name,
            "incast_target is ignored unless pattern = \"incast\"".into(),
        ),
        _ => {}
    }
    if traffic.ops.iter().any(|&op| op != OpKind::Transfer) {
        d.error(
            "traffic-ops",
            &key("ops"),
            name,
            "background jobs run ops = [\"transfer\"]".into(),
        );
    }
    if traffic.iterations == 0 {
        d.error("iterations", &key("iterations"), name, "iterations must be ≥ 1".into());
    }
}

#[allow(clippy::too_many_arguments)]
fn check_deepep_job(
    job: &JobSpec,
    prefix: &str,
    b: &BufferSpec,
    w: &WorkloadSpec,
    ranks: &[u32],
    topo: &Topology,
    profile: &HardwareProfile,
    d: &mut Diagnostics<'_>,
) {
    let name = Some(job.name.as_str());
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    let wkey = |k: &str| format!("{prefix}.workload.{k}");
    let n = ranks.len() as u32;
    let mode = EpMode::new(b.low_latency_mode, n);
    let nodes = num_rdma_ranks(n);
    let mode_word = match mode {
        EpMode::Intranode => "normal intranode",
        EpMode::Internode => "normal internode",
        EpMode::LowLatency => "low-latency",
    };

    // --- Rank geometry (deep_ep.cpp:158-161, launch.cuh) ---
    if !(n < NUM_MAX_NVL_PEERS || n.is_multiple_of(NUM_MAX_NVL_PEERS)) {
        d.error("num-ranks", &format!("{prefix}.ranks"), name, format!("{n} ranks: DeepEP needs fewer than 8 or a multiple of 8 (deep_ep.cpp:159 host assert)"));
    }
    if !b.low_latency_mode && n > NUM_MAX_NVL_PEERS * NUM_MAX_RDMA_PEERS {
        d.error("num-ranks", &format!("{prefix}.ranks"), name, format!("{n} ranks: normal kernels support at most 8 x 20 = 160 (deep_ep.cpp:158); use low_latency_mode"));
    }
    match mode {
        EpMode::Intranode if !INTRANODE_RANKS.contains(&n) => d.error(
            "kernel-instantiation",
            &format!("{prefix}.ranks"),
            name,
            format!("{n} ranks: intranode kernels are instantiated for 2, 4 or 8 ranks only (launch.cuh)"),
        ),
        EpMode::Internode if n.is_multiple_of(NUM_MAX_NVL_PEERS) && !INTERNODE_NODES.contains(&nodes) => d.error(
            "kernel-instantiation",
            &format!("{prefix}.ranks"),
            name,
            format!("{nodes} nodes (EP{n}): internode kernels are instantiated for 2, 3, 4, 6, 8, 12, 16, 18 or 20 nodes (launch.cuh)"),
        ),
        _ => {}
    }
    // Ranks [8k, 8k+8) of the group must share one NVLink domain for normal kernels (issue #76).
    if mode != EpMode::LowLatency {
        for group in ranks.chunks(NUM_MAX_NVL_PEERS as usize) {
            let gpus: Vec<GpuId> = group.iter().map(|&r| topo.gpu_of(Rank(r))).collect();
            let first = gpus[0];
            if let Some(bad) = gpus.iter().find(|&&g| !topo.nvlink_connected(first, g)) {
                d.error(
                    "nvl-domain",
                    &format!("{prefix}.ranks"),
                    name,
                    format!(
                        "normal kernels need ranks [8k, 8k+8) in one NVLink domain (NUM_MAX_NVL_PEERS = 8; DeepEP issue #76): GPU {} and GPU {} are not NVLink-connected (nvlink = \"{}\")",
                        first.0, bad.0, topo.nvlink
                    ),
                );
                break;
            }
            let cross_node = gpus.iter().any(|&g| topo.node_of_gpu(g) != topo.node_of_gpu(first));
            if cross_node && !b.use_fabric {
                d.error(
                    "nvl-fabric-handles",
                    &bkey("use_fabric"),
                    name,
                    "8 ranks of one DeepEP node span physical nodes: CUDA IPC handles cannot cross trays; set use_fabric = true (fabric handles in an IMEX domain)".into(),
                );
                break;
            }
        }
        if mode == EpMode::Internode
            && !(topo.gpus_per_node * topo.ranks_per_gpu).is_multiple_of(NUM_MAX_NVL_PEERS)
        {
            d.advisory(
                "gpus-per-node",
                "cluster.gpus_per_node",
                name,
                "normal internode kernels are hard-wired to 8 GPUs per node; other counts are not recommended (DeepEP #104, #296)".into(),
            );
        }
        if matches!(topo.nvlink, NvlinkKind::None | NvlinkKind::PciePairs) && n > 2 {
            d.advisory(
                "normal-needs-nvlink",
                "cluster.nvlink",
                name,
                "normal mode relies on NVLink; PCIe peers are not optimised (DeepEP #216, #462)"
                    .into(),
            );
        }
    }

    // --- Buffer sizes (deep_ep.cpp:152-161) ---
    let nvl_bytes = b.num_nvl_bytes.bytes();
    let rdma_bytes = b.num_rdma_bytes.bytes();
    if !nvl_bytes.is_multiple_of(128) {
        d.error(
            "buffer-align",
            &bkey("num_nvl_bytes"),
            name,
            format!(
                "{nvl_bytes} is not a multiple of 128 (NUM_BUFFER_ALIGNMENT_BYTES; deep_ep.cpp:152)"
            ),
        );
    }
    if !rdma_bytes.is_multiple_of(128) {
        d.error(
            "buffer-align",
            &bkey("num_rdma_bytes"),
            name,
            format!("{rdma_bytes} is not a multiple of 128 (deep_ep.cpp:154)"),
        );
    }
    if nvl_bytes > INT_MAX && rdma_bytes != 0 {
        d.error(
            "buffer-int-max",
            &bkey("num_nvl_bytes"),
            name,
            format!("{nvl_bytes} > INT_MAX while num_rdma_bytes > 0 (deep_ep.cpp:153)"),
        );
    }
    if !b.low_latency_mode && rdma_bytes > INT_MAX {
        d.error(
            "buffer-int-max",
            &bkey("num_rdma_bytes"),
            name,
            format!(
                "{rdma_bytes} > INT_MAX is allowed only with low_latency_mode (deep_ep.cpp:155)"
            ),
        );
    }
    if rdma_bytes > 0 && !(n > NUM_MAX_NVL_PEERS || b.low_latency_mode) {
        d.error("rdma-bytes-intranode", &bkey("num_rdma_bytes"), name, format!("num_rdma_bytes = {rdma_bytes} with {n} ranks in normal mode: an RDMA buffer needs > 8 ranks or low_latency_mode (deep_ep.cpp:160-161)"));
    }
    if mode.uses_nvshmem() && b.num_qps_per_rank == 0 {
        d.error(
            "qps-positive",
            &bkey("num_qps_per_rank"),
            name,
            "num_qps_per_rank must be > 0 when NVSHMEM is initialised (buffer.py:107)".into(),
        );
    }
    if !b.num_sms.is_multiple_of(2) || b.num_sms == 0 {
        d.error("num-sms-even", &bkey("num_sms"), name, format!("num_sms = {}: must be even and > 0 (Buffer.set_num_sms, buffer.py:162); channels = num_sms / 2", b.num_sms));
    }
    if b.num_sms > profile.gpu.sm_count {
        d.error(
            "num-sms-device",
            &bkey("num_sms"),
            name,
            format!(
                "num_sms = {} exceeds the {} SMs of a {}",
                b.num_sms, profile.gpu.sm_count, profile.gpu.name
            ),
        );
    }
    if b.allow_mnnvl && topo.nvlink != NvlinkKind::Mnnvl {
        d.advisory("mnnvl-unused", &bkey("allow_mnnvl"), name, format!("allow_mnnvl has no effect without a multi-node NVLink domain (cluster nvlink = \"{}\")", topo.nvlink));
    }
    if topo.nvlink == NvlinkKind::Mnnvl && !b.allow_mnnvl && mode == EpMode::LowLatency {
        d.advisory("mnnvl-disabled", &bkey("allow_mnnvl"), name, "allow_mnnvl = false writes NVSHMEM_DISABLE_MNNVL=1: peers on other trays of the NVLink domain are reached over RDMA".into());
    }

    // --- Workload shape ---
    if w.tokens_per_rank == 0 {
        d.error("tokens", &wkey("tokens_per_rank"), name, "tokens_per_rank must be ≥ 1".into());
    }
    if w.hidden == 0 || w.experts == 0 || w.topk == 0 {
        d.error(
            "workload-shape",
            &format!("{prefix}.workload"),
            name,
            "hidden, experts and topk must all be ≥ 1".into(),
        );
        return;
    }
    let divisible = w.experts.is_multiple_of(n);
    if !divisible {
        d.error("experts-divisible", &wkey("experts"), name, format!("{} experts over {n} ranks: num_experts % num_ranks must be 0 (deep_ep.cpp:1555; layout)", w.experts));
    }
    let local_experts = w.experts / n;
    if local_experts > NUM_MAX_LOCAL_EXPERTS {
        d.error(
            "local-experts",
            &wkey("experts"),
            name,
            format!(
                "{local_experts} experts per rank > NUM_MAX_LOCAL_EXPERTS = 1024 (deep_ep.cpp:522)"
            ),
        );
    }
    if w.topk > w.experts {
        d.error("topk", &wkey("topk"), name, format!("top-{} of {} experts", w.topk, w.experts));
    }
    let max_topk = if b.low_latency_mode { LL_MAX_TOPK } else { NORMAL_MAX_TOPK };
    if w.topk > max_topk {
        d.error(
            "topk",
            &wkey("topk"),
            name,
            format!(
                "topk = {}: {mode_word} kernels support at most {max_topk} ({})",
                w.topk,
                if b.low_latency_mode {
                    "internode_ll.cu:494-502"
                } else {
                    "intranode.cu:237, internode.cu:514 device trap"
                }
            ),
        );
    }
    if w.dispatch_dtype == Dtype::Logfmt {
        d.error(
            "dtype",
            &wkey("dispatch_dtype"),
            name,
            "LogFMT is a combine encoding; dispatch is \"fp8\" or \"bf16\"".into(),
        );
    }
    match w.combine_dtype {
        Dtype::Fp8 => d.error(
            "dtype",
            &wkey("combine_dtype"),
            name,
            "DeepEP combines in \"bf16\" (or \"logfmt\" in low-latency mode)".into(),
        ),
        Dtype::Logfmt if !b.low_latency_mode => d.error(
            "dtype",
            &wkey("combine_dtype"),
            name,
            "LogFMT combine exists only in low-latency mode (use_logfmt)".into(),
        ),
        _ => {}
    }
    match w.routing {
        RoutingKind::NodeLimited => match w.topk_groups {
            Some(0) => {
                d.error("topk-groups", &wkey("topk_groups"), name, "topk_groups must be ≥ 1".into())
            }
            Some(g) if g > nodes => d.error(
                "topk-groups",
                &wkey("topk_groups"),
                name,
                format!("topk_groups = {g} but the job spans only {nodes} DeepEP node(s)"),
            ),
            Some(g) if g * (w.experts / nodes) < w.topk => d.error(
                "topk-groups",
                &wkey("topk_groups"),
                name,
                format!(
                    "{g} node(s) x {} experts per node cannot supply top-{}",
                    w.experts / nodes,
                    w.topk
                ),
            ),
            _ => {}
        },
        RoutingKind::Zipf => {
            if !w.skew.is_some_and(|s| s > 0.0 && s.is_finite()) {
                d.error(
                    "zipf-skew",
                    &wkey("skew"),
                    name,
                    "routing = \"zipf\" needs skew > 0 (the Zipf exponent)".into(),
                );
            }
        }
        RoutingKind::Uniform => {}
    }
    if w.topk_groups.is_some() && w.routing != RoutingKind::NodeLimited {
        d.advisory(
            "topk-groups",
            &wkey("topk_groups"),
            name,
            "topk_groups is used only with routing = \"node-limited\"".into(),
        );
    }
    if w.masked_selections as u64 > w.tokens_per_rank as u64 * w.topk as u64 {
        d.error(
            "masked",
            &wkey("masked_selections"),
            name,
            "more masked selections than (token, slot) entries".into(),
        );
    }
    if w.iterations == 0 {
        d.error("iterations", &wkey("iterations"), name, "iterations must be ≥ 1".into());
    }
    if w.ops.is_empty() {
        d.error("ops", &wkey("ops"), name, "ops is empty: nothing to run".into());
    }
    for (i, op) in w.ops.iter().enumerate() {
        match op {
            OpKind::Transfer => d.error("ops", &wkey("ops"), name, "\"transfer\" belongs to [job.traffic] jobs; DeepEP jobs run dispatch, combine, barrier".into()),
            OpKind::Combine if !w.ops[..i].contains(&OpKind::Dispatch) => {
                d.error("ops", &wkey("ops"), name, "combine needs the handle of an earlier dispatch: put \"dispatch\" before \"combine\"".into())
            }
            _ => {}
        }
    }
    if w.hook && !b.low_latency_mode {
        d.error(
            "hook",
            &wkey("hook"),
            name,
            "hook mode (return_recv_hook) exists only for low-latency kernels".into(),
        );
    }
    if w.num_max_dispatch_tokens_per_rank.is_some() && !b.low_latency_mode {
        d.advisory(
            "ll-only",
            &wkey("num_max_dispatch_tokens_per_rank"),
            name,
            "num_max_dispatch_tokens_per_rank sizes low-latency buffers only".into(),
        );
    }

    let user_env = &job.env;
    let settings = NvshmemSettings::from_env(&effective_env(user_env, Some(b), Some(mode)));
    match mode {
        EpMode::LowLatency if divisible => {
            check_low_latency(prefix, name, b, w, n, local_experts, settings, topo, d)
        }
        EpMode::LowLatency => {}
        EpMode::Intranode | EpMode::Internode => check_normal(prefix, name, b, w, n, mode, d),
    }

    // --- NVLink check (utils.py check_nvlink_connections, eptwin's bypass) ---
    let bypass = user_env.get("DISABLE_NVLINK_CHECK").is_some_and(|v| v == "1");
    let mut gpus: Vec<u32> = ranks.iter().map(|&r| topo.gpu_of(Rank(r)).0).collect();
    gpus.dedup();
    let probe = DeclaredProbe {
        topology: topo.clone(),
        gpu_name: profile.gpu.name.clone(),
        label: "declared topology".into(),
    };
    // DeepEP asserts group.size() ≤ 2 on PCIE SKUs: the group is ranks, not GPUs.
    let rank_gpus: Vec<u32> = ranks.iter().map(|&r| topo.gpu_of(Rank(r)).0).collect();
    if profile.gpu.name.contains("PCIE")
        && !bypass
        && let Ok(report) =
            check_nvlink_connections(&probe, &gpus, &[], NvlinkCheckMode::DeepEp, false)
    {
        let mut failures = report.failures;
        if rank_gpus.len() > 2 && !failures.iter().any(|f| f.contains("group size")) {
            failures.push(format!(
                "PCIe GPUs only have pairwise NVLink connections: group size {} > 2 (utils.py:75)",
                rank_gpus.len()
            ));
        }
        for f in failures {
            d.error("nvlink-check", &format!("{prefix}.ranks"), name, format!("{f}; set DISABLE_NVLINK_CHECK = \"1\" in [job.env] (eptwin's bypass; DeepEP has none) to run anyway"));
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn check_low_latency(
    prefix: &str,
    name: Option<&str>,
    b: &BufferSpec,
    w: &WorkloadSpec,
    n: u32,
    local_experts: u32,
    settings: NvshmemSettings,
    topo: &Topology,
    d: &mut Diagnostics<'_>,
) {
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    let wkey = |k: &str| format!("{prefix}.workload.{k}");
    let t = w.max_dispatch_tokens_per_rank();
    if w.tokens_per_rank > t {
        d.error("ll-tokens", &wkey("tokens_per_rank"), name, format!("{} tokens > num_max_dispatch_tokens_per_rank = {t} (x.size(0) ≤ T, deep_ep.cpp:1552)", w.tokens_per_rank));
    }
    let needed_depth = (t as u64 + 1) * 2;
    if (settings.qp_depth as u64) < needed_depth {
        let key = format!("{prefix}.env.NVSHMEM_QP_DEPTH");
        // Advice that can be followed: a depth NVSHMEM accepts, or fewer tokens per call.
        let fix = if needed_depth <= MAX_QP_DEPTH as u64 {
            format!("set NVSHMEM_QP_DEPTH ≥ {}", needed_depth.next_power_of_two())
        } else {
            let max_t = MAX_QP_DEPTH / 2 - 1;
            let knob = if w.num_max_dispatch_tokens_per_rank.is_some() {
                "num_max_dispatch_tokens_per_rank"
            } else {
                "tokens_per_rank"
            };
            format!(
                "no depth fits: NVSHMEM's largest, {MAX_QP_DEPTH}, allows T ≤ {max_t}; dispatch at most {max_t} tokens per call ({knob} ≤ {max_t}), or this cannot run in low-latency mode"
            )
        };
        d.error(
            "ll-qp-depth",
            &key,
            name,
            format!(
                "QP depth {} < 2·(T+1) = {needed_depth} for T = {t}: DeepEP refuses every LL dispatch/combine (buffer.py:602, 656; PR #430); {fix}",
                settings.qp_depth,
            ),
        );
    }
    if !w.hidden.is_multiple_of(128) {
        d.error(
            "ll-hidden",
            &wkey("hidden"),
            name,
            format!("hidden = {} must be a multiple of 128 (deep_ep.cpp:1551)", w.hidden),
        );
    }
    if w.dispatch_dtype == Dtype::Fp8 && !w.hidden.is_multiple_of(512) {
        d.error(
            "ll-fp8-hidden",
            &wkey("hidden"),
            name,
            format!("FP8 dispatch needs hidden % 512 == 0, found {} (deep_ep.cpp:1602)", w.hidden),
        );
    }
    if !LL_HIDDEN.contains(&w.hidden) {
        d.error("kernel-instantiation", &wkey("hidden"), name, format!("hidden = {}: low-latency kernels are instantiated for 2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192 (launch.cuh)", w.hidden));
    }
    if !(n as u64 * t as u64).is_multiple_of(4) {
        d.error(
            "ll-tma",
            &wkey("num_max_dispatch_tokens_per_rank"),
            name,
            format!("num_ranks · T = {n}·{t} must be a multiple of 4 (TMA; deep_ep.cpp:1598)"),
        );
    }
    if b.num_qps_per_rank < local_experts {
        d.error(
            "ll-qps-ge-local-experts",
            &bkey("num_qps_per_rank"),
            name,
            format!("{} QPs per rank < {local_experts} local experts: the LL kernel traps on the device (internode_ll.cu:285, QP = local expert index); need ≥ {local_experts}", b.num_qps_per_rank),
        );
    } else if b.num_qps_per_rank != local_experts {
        d.advisory(
            "ll-qps-eq-local-experts",
            &bkey("num_qps_per_rank"),
            name,
            format!("{} QPs with {local_experts} local experts: LL uses QP = local expert index, so {} QPs stay idle; DeepEP's README advises equal counts (performance, not correctness)", b.num_qps_per_rank, b.num_qps_per_rank - local_experts),
        );
    }
    let hint = low_latency_rdma_size_hint(t, w.hidden, w.experts);
    if b.num_rdma_bytes.bytes() < hint {
        d.error(
            "ll-buffer-size",
            &bkey("num_rdma_bytes"),
            name,
            format!("{} bytes < get_low_latency_rdma_size_hint(T={t}, hidden={}, experts={}) = {hint} ({}); DeepEP asserts the layout fits", b.num_rdma_bytes.bytes(), w.hidden, w.experts, crate::units::ByteSize(hint)),
        );
    }
    if b.num_nvl_bytes.bytes() > 0 && n > NUM_MAX_NVL_PEERS {
        d.advisory(
            "ll-nvl-bytes",
            &bkey("num_nvl_bytes"),
            name,
            "low-latency kernels do not use the NVL buffer".into(),
        );
    }
    if b.allow_nvlink_for_low_latency_mode
        && matches!(topo.nvlink, NvlinkKind::PciePairs | NvlinkKind::None)
    {
        d.advisory(
            "ll-nvlink-pcie",
            &bkey("allow_nvlink_for_low_latency_mode"),
            name,
            "over PCIe, NVSHMEM P2P stores may break memory ordering (buffer.py docstring)".into(),
        );
    }
    if w.hook && b.allow_nvlink_for_low_latency_mode {
        d.advisory("ll-hook-nvlink", &wkey("hook"), name, "hook mode with NVLink peers: stores complete only when data has moved, so overlap is weaker (\"somehow incompatible\", buffer.py docstring)".into());
    }
}

#[allow(clippy::too_many_arguments)]
fn check_normal(
    prefix: &str,
    name: Option<&str>,
    b: &BufferSpec,
    w: &WorkloadSpec,
    n: u32,
    mode: EpMode,
    d: &mut Diagnostics<'_>,
) {
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    let nodes = num_rdma_ranks(n);
    let hb = hint_hidden_bytes(w.hidden);
    let mut nvl_hint = 0u64;
    let mut rdma_hint = 0u64;
    for (direction, explicit, key) in [
        (Direction::Dispatch, &b.dispatch_config, "dispatch_config"),
        (Direction::Combine, &b.combine_config, "combine_config"),
    ] {
        let Some(cfg) = Config::resolve(direction, n, b.num_sms, explicit) else {
            d.error(
                "tuned-config",
                &bkey(key),
                name,
                format!(
                    "no tuned Config for EP{n} (get_{}_config asserts num_ranks in {{{}}}, buffer.py:259/289): set all four chunk sizes in [job.buffer.{key}]",
                    if direction == Direction::Dispatch { "dispatch" } else { "combine" },
                    config::tuned_rank_counts().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
                ),
            );
            continue;
        };
        let ck = |k: &str| format!("{prefix}.buffer.{key}.{k}");
        if cfg.num_max_nvl_chunked_send_tokens == 0 || cfg.num_max_rdma_chunked_send_tokens == 0 {
            d.error("config-chunks", &bkey(key), name, "chunk sizes must be ≥ 1".into());
            continue;
        }
        if cfg.num_max_nvl_chunked_send_tokens >= cfg.num_max_nvl_chunked_recv_tokens {
            d.error(
                "config-nvl-chunks",
                &ck("num_max_nvl_chunked_send_tokens"),
                name,
                format!(
                    "nvl send {} must be < nvl recv {} (Config ctor, config.hpp)",
                    cfg.num_max_nvl_chunked_send_tokens, cfg.num_max_nvl_chunked_recv_tokens
                ),
            );
        }
        if cfg.num_max_rdma_chunked_send_tokens > cfg.rdma_recv_rounded() / 2 {
            d.error(
                "config-rdma-lazy-head",
                &ck("num_max_rdma_chunked_send_tokens"),
                name,
                format!("rdma send {} > rdma recv (rounded up to {}) / 2: RDMA lazy head update needs send ≤ recv/2 (config.hpp:46-49)", cfg.num_max_rdma_chunked_send_tokens, cfg.rdma_recv_rounded()),
            );
        }
        if mode == EpMode::Internode && direction == Direction::Combine {
            let recv = cfg.num_max_nvl_chunked_recv_tokens;
            if nodes > COMBINE_MAX_RDMA_RANKS {
                d.error(
                    "combine-rdma-ranks",
                    &format!("{prefix}.ranks"),
                    name,
                    format!("{nodes} nodes > 24 for internode combine (internode.cu:2358)"),
                );
            }
            if recv % nodes != 0 {
                d.error(
                    "combine-nvl-recv",
                    &ck("num_max_nvl_chunked_recv_tokens"),
                    name,
                    format!("nvl recv {recv} % {nodes} nodes != 0 (internode.cu:2358-2368)"),
                );
            } else if recv / nodes
                <= cfg.num_max_rdma_chunked_send_tokens.max(cfg.num_max_nvl_chunked_send_tokens)
            {
                d.error(
                    "combine-nvl-recv",
                    &ck("num_max_nvl_chunked_recv_tokens"),
                    name,
                    format!("nvl recv {recv} / {nodes} nodes = {} must exceed max(rdma send, nvl send) = {} (internode.cu:2358-2368)", recv / nodes, cfg.num_max_rdma_chunked_send_tokens.max(cfg.num_max_nvl_chunked_send_tokens)),
                );
            }
        }
        nvl_hint = nvl_hint.max(cfg.nvl_buffer_size_hint(hb, n));
        rdma_hint = rdma_hint.max(cfg.rdma_buffer_size_hint(hb, n));
    }
    if b.num_nvl_bytes.bytes() < nvl_hint {
        d.error(
            "nvl-buffer-size",
            &bkey("num_nvl_bytes"),
            name,
            format!("{} bytes < NVL size hint {nvl_hint} ({}) for these Configs; DeepEP asserts the hint fits (get_nvl_buffer_size_hint)", b.num_nvl_bytes.bytes(), crate::units::ByteSize(nvl_hint)),
        );
    }
    if mode == EpMode::Internode {
        if b.num_rdma_bytes.bytes() < rdma_hint {
            d.error(
                "rdma-buffer-size",
                &bkey("num_rdma_bytes"),
                name,
                format!("{} bytes < RDMA size hint {rdma_hint} ({}); DeepEP asserts the hint fits (get_rdma_buffer_size_hint)", b.num_rdma_bytes.bytes(), crate::units::ByteSize(rdma_hint)),
            );
        }
        let channels = b.num_sms / 2;
        if !(b.num_qps_per_rank == channels || b.num_qps_per_rank >= b.num_sms) {
            d.error(
                "normal-qps",
                &bkey("num_qps_per_rank"),
                name,
                format!(
                    "{} QPs with {} SMs: normal internode needs num_qps_per_rank == channels ({channels}) or ≥ num_sms ({}) — data on QP channel, credits on channel + {channels}; the kernel traps otherwise (internode.cu:492)",
                    b.num_qps_per_rank, b.num_sms, b.num_sms
                ),
            );
        } else if b.num_qps_per_rank == channels {
            d.advisory("normal-qps-shared", &bkey("num_qps_per_rank"), name, "num_qps_per_rank == channels: head-credit atomics wrap onto the data QP (concurrent submission on one QP caused timeouts before PR #181)".into());
        }
    }
}

#[cfg(test)]
mod tests;
