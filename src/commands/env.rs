//! `eptwin env`: the environment DeepEP's `Buffer.__init__` (V1) or `ElasticBuffer.__init__`
//! (V2) leaves, as `export` lines; `--explain` says why for each and what V2 and NCCL end up with.

use std::path::Path;

use anyhow::{Result, bail};
use eptwin_engine::deepep::elastic;
use eptwin_engine::deepep::env::{EnvOrigin, shell_quote};

use super::load_plan;
use crate::{ExitCode, outln};

pub fn env(scenario: &Path, job: Option<&str>, explain: bool) -> Result<ExitCode> {
    let Some(plan) = load_plan(scenario) else { return Ok(ExitCode::BadInput) };
    let chosen = match job {
        Some(name) => match plan.jobs.iter().find(|j| j.name == name) {
            Some(j) => j,
            None => bail!(
                "no job {name:?} in {}; jobs: {}",
                scenario.display(),
                plan.jobs.iter().map(|j| j.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        },
        None if plan.jobs.len() == 1 => &plan.jobs[0],
        None => bail!(
            "{} has several jobs; pass --job NAME ({})",
            scenario.display(),
            plan.jobs.iter().map(|j| j.name.as_str()).collect::<Vec<_>>().join(", ")
        ),
    };
    let elastic = chosen.deepep().and_then(|d| d.elastic);
    for (name, var) in &chosen.env {
        let line = format!("export {name}={}", shell_quote(&var.value));
        if !explain {
            outln!("{line}");
            continue;
        }
        let meaning = if elastic.is_some() {
            elastic::v2_var(name).map(|v| v.meaning)
        } else {
            nvshmem_meaning(name)
        };
        let note = match (var.origin, &var.source, &var.overwritten) {
            (EnvOrigin::User, ..) if meaning.is_some() => {
                format!("user value; DeepEP does not touch it; {}", meaning.unwrap_or_default())
            }
            (EnvOrigin::User, ..) => "user value; DeepEP does not touch it".to_string(),
            (EnvOrigin::UserKeptByDeepEp, Some(src), _) => {
                format!("user value kept by DeepEP ({src})")
            }
            (EnvOrigin::DeepEp, Some(src), Some(old)) => {
                format!("written by DeepEP ({src}); user value {old:?} overwritten")
            }
            (EnvOrigin::DeepEp, Some(src), None) => format!("written by DeepEP ({src})"),
            _ => String::new(),
        };
        outln!("{line}  # {note}");
    }
    if let Some(e) = elastic {
        // What V2 and NCCL GIN end up with (comments: nothing to export).
        let sl_why = if e.sl_from_env {
            "EP_OVERRIDE_RDMA_SL overrides sl_idx (elastic.py:323-324)"
        } else {
            "sl_idx (elastic.py:243, default 3)"
        };
        let vl = chosen.vl().map_or("the RoCE priority".to_string(), |v| format!("VL{}", v.0));
        let mode = if e.hybrid { "hybrid" } else { "direct" };
        let lines = [
            format!("# V2: GIN QPs carry SL {} -> {vl}: {sl_why}; ginTrafficClass", e.sl),
            format!(
                "# V2: {mode} mode, {} x {} (scale-out x scale-up) over {} NVLink domain(s) of {} (NCCL's LSA team)",
                e.num_scaleout_ranks, e.num_scaleup_ranks, e.num_rdma_ranks, e.num_nvlink_ranks
            ),
            format!(
                "# V2: {} QPs allocated ({}), {} per call, queue depth {} (kGinQPDepth), {:?} connections",
                e.num_allocated_qps,
                if e.hybrid { "65 with fast RDMA atomics, else 129" } else { "17 in direct mode" },
                e.num_qps,
                elastic::GIN_QP_DEPTH,
                e.connection
            ),
            format!(
                "# V2: {} SMs per call{} x {} channels per SM = {} channels",
                e.num_sms,
                if e.num_sms_auto { " (get_theoretical_num_sms)" } else { "" },
                e.channels_per_sm,
                e.num_channels
            ),
            format!(
                "# V2: buffer {} bytes{}",
                e.num_bytes,
                if e.gin_disabled { "; EP_DISABLE_GIN: NVLink only" } else { "" }
            ),
        ];
        for l in lines {
            if explain {
                outln!("{l}");
            }
        }
    }
    Ok(ExitCode::Ok)
}

/// What NVSHMEM does with a variable DeepEP V1 leaves to the user.
fn nvshmem_meaning(name: &str) -> Option<&'static str> {
    Some(match name {
        "NVSHMEM_IB_SL" => {
            "the SL of every IBGDA QP of the job; the subnet manager's SL2VL picks its VL"
        }
        "NVSHMEM_IB_TRAFFIC_CLASS" => "the traffic class of the job's QPs (RoCE DSCP / IB GRH)",
        "NVSHMEM_QP_DEPTH" => "the WQ depth of every QP, a power of two in 128..=32768",
        "NVSHMEM_HCA_LIST" | "NVSHMEM_ENABLE_NIC_PE_MAPPING" => "which NIC each PE uses",
        "NVSHMEM_IB_GID_INDEX" => "the RoCE GID NVSHMEM uses",
        _ => return None,
    })
}
