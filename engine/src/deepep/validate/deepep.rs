//! A DeepEP job (`[job.buffer]` + `[job.workload]`): its rank geometry and NVLink domains,
//! then the `buffer` and `workload` rules, the mode's (`normal` or `low_latency`), and the
//! NVLink check of PCIe SKUs; the job's typed settings when nothing failed.

use super::{Job, buffer, low_latency, normal, workload};
use crate::deepep::buffer::BufferSettings;
use crate::deepep::config::{EpMode, num_rdma_ranks};
use crate::deepep::env::NvshmemSettings;
use crate::diag::Diagnostics;
use crate::ids::{GpuId, Rank};
use crate::plan::DeepEpJob;
use crate::scenario::schema::{BufferSpec, NvlinkKind, WorkloadSpec};
use crate::topology::{
    DeclaredProbe, NUM_MAX_NVL_PEERS, NUM_MAX_RDMA_PEERS, NvlinkCheckMode, check_nvlink_connections,
};
use crate::workload::Workload;

/// `launch.cuh` instantiation domains.
const INTRANODE_RANKS: [u32; 3] = [2, 4, 8];
const INTERNODE_NODES: [u32; 9] = [2, 3, 4, 6, 8, 12, 16, 18, 20];

/// The job's rules in DeepEP's order; its settings unless the workload's shape is unusable
/// (then the mode's rules are skipped, they would only repeat it). `nvshmem` is the job's
/// final NVSHMEM settings; `bypass` is eptwin's `DISABLE_NVLINK_CHECK`.
pub(super) fn check(
    job: &Job<'_>,
    b: &BufferSpec,
    w: &WorkloadSpec,
    nvshmem: &NvshmemSettings,
    bypass: bool,
    d: &mut Diagnostics<'_>,
) -> Option<DeepEpJob> {
    let n = job.ranks.len() as u32;
    let mode = EpMode::new(b.low_latency_mode, n);
    check_rank_counts(job, b, mode, d);
    check_nvl_domains(job, b, mode, d);
    buffer::check(job, b, mode, d);
    let shape = workload::check(job, b, w, mode, d)?;
    let routing_file = workload::routing_file(job, w, d);
    let configs = match mode {
        EpMode::LowLatency => {
            if shape.experts_divisible {
                low_latency::check(job, b, w, shape.local_experts, nvshmem, d);
            }
            (None, None)
        }
        EpMode::Intranode | EpMode::Internode => normal::check(job, b, w, mode, d),
    };
    check_nvlink(job, bypass, d);
    let job = DeepEpJob::new(mode, BufferSettings::from(b), Workload::from_spec(w, n), configs, n);
    Some(match routing_file {
        Some(loaded) => job.with_routing_file(loaded),
        None => job,
    })
}

/// Rank counts DeepEP accepts and its kernels are instantiated for (deep_ep.cpp:158-161,
/// launch.cuh).
fn check_rank_counts(job: &Job<'_>, b: &BufferSpec, mode: EpMode, d: &mut Diagnostics<'_>) {
    let (prefix, name) = (job.prefix.as_str(), job.name());
    let n = job.ranks.len() as u32;
    let nodes = num_rdma_ranks(n);
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
}

/// Normal kernels: ranks [8k, 8k+8) of the group must share one NVLink domain (issue #76).
fn check_nvl_domains(job: &Job<'_>, b: &BufferSpec, mode: EpMode, d: &mut Diagnostics<'_>) {
    let (prefix, name, ranks, topo) = (job.prefix.as_str(), job.name(), job.ranks, job.topo);
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    let n = ranks.len() as u32;
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
}

/// The NVLink check of PCIe SKUs (utils.py check_nvlink_connections, eptwin's bypass).
pub(super) fn check_nvlink(job: &Job<'_>, bypass: bool, d: &mut Diagnostics<'_>) {
    let (prefix, name, ranks, topo, profile) =
        (job.prefix.as_str(), job.name(), job.ranks, job.topo, job.profile);
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
