//! The scenario's QP budget per NIC against the device's limits (`ibv_query_device` as
//! `ibv_devinfo -v` prints it): QPs × depth per mode, V1 and V2.

use std::collections::BTreeMap;

use eptwin_engine::api::EpMode;

use super::affinity::assignments;
use super::{Ctx, skip};
use crate::report::{Finding, Status};
use crate::subject::{Api, JobSubject, V2_GIN_QP_DEPTH, v2_auto_qps};

/// One mlx5 send WQE basic block (`MLX5_SEND_WQE_BB`, rdma-core mlx5dv.h): the send queue's
/// bytes per entry.
const WQE_BYTES: u64 = 64;

/// ConnectX-8's `hca_type`: V2 counts it as having fast RDMA atomics (DeepEP §16).
pub const FAST_ATOMICS_HCA: &str = "MT4131";

/// RC QPs one rank creates, and their depth; the rule that gives them, for the report.
pub fn qps_per_rank(job: &JobSubject, fast_atomics: bool) -> (u64, u32, String) {
    let q = job.qps_per_peer as u64;
    match job.api {
        Api::V1 => match job.mode {
            Some(EpMode::LowLatency) => {
                let peers = job.num_ranks.saturating_sub(1) as u64;
                (
                    q * peers,
                    job.nvshmem.qp_depth,
                    format!("V1 LL: num_qps_per_rank {q} × (ranks − 1) {peers}"),
                )
            }
            Some(EpMode::Internode) => {
                let peers = job.nodes.saturating_sub(1) as u64;
                (
                    q * peers,
                    job.nvshmem.qp_depth,
                    format!(
                        "V1 normal: num_qps_per_rank {q} × (nodes − 1) {peers} on the rank's rail"
                    ),
                )
            }
            _ => (0, job.nvshmem.qp_depth, "no RDMA QPs".into()),
        },
        Api::V2 { allow_hybrid_mode, num_allocated_qps, .. } => {
            let per_peer = if num_allocated_qps > 0 {
                num_allocated_qps
            } else {
                v2_auto_qps(allow_hybrid_mode, fast_atomics)
            } as u64;
            let (peers, kind) = if allow_hybrid_mode {
                (job.nodes.saturating_sub(1) as u64, "hybrid (rail): (nodes − 1)")
            } else {
                (job.num_ranks.saturating_sub(1) as u64, "direct (full): (ranks − 1)")
            };
            let source = if num_allocated_qps > 0 { "num_allocated_qps" } else { "automatic" };
            (
                per_peer * peers,
                V2_GIN_QP_DEPTH,
                format!("V2 GIN {kind} {peers} × {per_peer} QPs per peer ({source})"),
            )
        }
    }
}

#[derive(Default)]
struct NicLoad {
    qps: u64,
    depth: u32,
    lines: Vec<String>,
}

const TITLE: &str = "QP budget per NIC (QPs × depth vs ibv_query_device)";

pub fn budget(ctx: &Ctx<'_>) -> Finding {
    let Some(s) = ctx.subject else {
        return skip(
            "qp-budget",
            TITLE,
            "no scenario: the QP count comes from a scenario's buffers",
        );
    };
    let all = assignments(ctx);
    if all.is_empty() {
        return skip("qp-budget", TITLE, "no job crosses nodes: no RDMA QPs");
    }
    let mut load: BTreeMap<String, NicLoad> = BTreeMap::new();
    for a in &all {
        let Some(job) = s.jobs.iter().find(|j| j.name == a.job) else { continue };
        for r in &a.ranks {
            let Some(nic) = &r.nic else { continue };
            let fast =
                ctx.facts.nic(nic).and_then(|n| n.hca_type.as_deref()) == Some(FAST_ATOMICS_HCA);
            let (qps, depth, rule) = qps_per_rank(job, fast);
            let l = load.entry(nic.clone()).or_default();
            l.qps += qps;
            l.depth = l.depth.max(depth);
            l.lines.push(format!(
                "job {:?} local rank {}: {qps} QPs of depth {depth} ({rule})",
                job.name, r.local_rank
            ));
        }
    }
    let v2 = s.jobs.iter().any(|j| j.is_v2() && j.crosses_nodes());
    let (mut details, mut over, mut unknown) = (Vec::new(), Vec::new(), Vec::new());
    for (nic, l) in &load {
        let wqe_mib = (l.qps * l.depth as u64 * WQE_BYTES) >> 20;
        let Some(info) = ctx.facts.devinfo_of(nic) else {
            unknown.push(nic.clone());
            details.push(format!(
                "{nic}: {} QPs of depth ≤ {} (≈ {wqe_mib} MiB of send queues); limits unknown",
                l.qps, l.depth
            ));
            details.extend(l.lines.iter().map(|x| format!("  {x}")));
            continue;
        };
        let limit = |k: &str| info.number(k);
        let (max_qp, max_wr, max_cqe, max_cq) =
            (limit("max_qp"), limit("max_qp_wr"), limit("max_cqe"), limit("max_cq"));
        let show = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or("?".into());
        details.push(format!(
            "{nic}: {} QPs of depth ≤ {} (≈ {wqe_mib} MiB of send queues) vs max_qp {}, max_qp_wr {}, max_cqe {}, max_cq {}",
            l.qps, l.depth, show(max_qp), show(max_wr), show(max_cqe), show(max_cq)
        ));
        details.extend(l.lines.iter().map(|x| format!("  {x}")));
        if max_qp.is_some_and(|m| l.qps > m) {
            over.push(format!("{nic}: {} QPs > max_qp {}", l.qps, show(max_qp)));
        }
        if max_cq.is_some_and(|m| l.qps > m) {
            over.push(format!("{nic}: {} CQs (one per QP) > max_cq {}", l.qps, show(max_cq)));
        }
        if max_wr.is_some_and(|m| l.depth as u64 > m) {
            over.push(format!("{nic}: depth {} > max_qp_wr {}", l.depth, show(max_wr)));
        }
        if max_cqe.is_some_and(|m| l.depth as u64 > m) {
            over.push(format!("{nic}: depth {} > max_cqe {}", l.depth, show(max_cqe)));
        }
    }
    let prevents: &[&'static str] =
        if v2 { &["DeepEP #649", "DeepEP #134"] } else { &["DeepEP #134"] };
    if !over.is_empty() {
        return Finding::new("qp-budget", TITLE, Status::Fail, over.join("; "))
            .details(details)
            .why("every QP is created, with its send queue and CQ, when the Buffer is built: past max_qp / max_cq ibv_create_qp fails, past max_qp_wr / max_cqe the depth is refused (EINVAL) — V2's GIN creates its QPs per peer the same way", prevents)
            .fix(if v2 {
                "lower V2's QPs (num_allocated_qps, or direct mode's 17), spread the ranks over more NICs, or use a device profile with more QPs (VFs often get fewer)"
            } else {
                "lower num_qps_per_rank (LL needs ≥ local experts; normal mode ≥ num_sms or = num_sms / 2) or NVSHMEM_QP_DEPTH (LL needs ≥ 2·(T+1)), or spread the ranks over more NICs"
            });
    }
    if !unknown.is_empty() {
        let why = ctx
            .node
            .verbs
            .devinfo()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "not listed by ibv_devinfo".into());
        return Finding::new(
            "qp-budget",
            TITLE,
            Status::Skip,
            format!("device limits of {} unknown: {why}", unknown.join(", ")),
        )
        .details(details);
    }
    let total: u64 = load.values().map(|l| l.qps).sum();
    Finding::new(
        "qp-budget",
        TITLE,
        Status::Ok,
        format!("{total} QPs on {} NIC(s), within every limit", load.len()),
    )
    .details(details)
}
