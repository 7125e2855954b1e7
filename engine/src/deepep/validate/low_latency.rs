//! Low-latency kernels (`internode_ll.cu`): buffer capacity, QP depth and QPs per rank,
//! hidden sizes the kernels are instantiated for, the RDMA buffer's size hint.

use super::Job;
use crate::deepep::config::low_latency_rdma_size_hint;
use crate::deepep::env::MAX_QP_DEPTH;
use crate::deepep::env::NvshmemSettings;
use crate::diag::Diagnostics;
use crate::scenario::schema::{BufferSpec, Dtype, NvlinkKind, WorkloadSpec};
use crate::topology::NUM_MAX_NVL_PEERS;

const LL_HIDDEN: [u32; 8] = [2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192];
pub(super) fn check(
    job: &Job<'_>,
    b: &BufferSpec,
    w: &WorkloadSpec,
    local_experts: u32,
    settings: &NvshmemSettings,
    d: &mut Diagnostics<'_>,
) {
    check_capacity(job, w, settings, d);
    check_hidden(job, w, d);
    check_qps_and_buffer(job, b, w, local_experts, d);
}

/// The buffer capacity T against the tokens and the QP depth.
fn check_capacity(
    job: &Job<'_>,
    w: &WorkloadSpec,
    settings: &NvshmemSettings,
    d: &mut Diagnostics<'_>,
) {
    let (prefix, name) = (job.prefix.as_str(), job.name());
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
}

/// The hidden sizes the kernels are instantiated for, and TMA's alignment of the receive
/// buffer.
fn check_hidden(job: &Job<'_>, w: &WorkloadSpec, d: &mut Diagnostics<'_>) {
    let (prefix, name) = (job.prefix.as_str(), job.name());
    let wkey = |k: &str| format!("{prefix}.workload.{k}");
    let n = job.ranks.len() as u32;
    let t = w.max_dispatch_tokens_per_rank();
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
}

/// QPs per rank against the local experts, the RDMA buffer against its size hint, and
/// advice on NVLink peers.
fn check_qps_and_buffer(
    job: &Job<'_>,
    b: &BufferSpec,
    w: &WorkloadSpec,
    local_experts: u32,
    d: &mut Diagnostics<'_>,
) {
    let (prefix, name, topo) = (job.prefix.as_str(), job.name(), job.topo);
    let n = job.ranks.len() as u32;
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    let wkey = |k: &str| format!("{prefix}.workload.{k}");
    let t = w.max_dispatch_tokens_per_rank();
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
