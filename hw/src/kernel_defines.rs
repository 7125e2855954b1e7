//! The compile-time parameters (`-D` macros) each kernel module is built with.

use eptwin_kernels::ModuleId;

use crate::options::HwOptions;

/// Threads per block of the normal kernels to try, best first: DeepEP's 768 when the grid fits
/// with one block per SM; with several ranks on one GPU, fewer threads so that `min_blocks`
/// blocks fit per SM within the register file (65,536 registers per SM: 64 per thread at 1,024
/// threads per SM). Each is a whole number of warps per rank.
pub fn normal_thread_candidates(num_ranks: u32, min_blocks: u32) -> Vec<u32> {
    let candidates: &[u32] = match min_blocks {
        0 | 1 => &[768, 512, 256],
        2 => &[512, 256],
        _ => &[256],
    };
    let mut out: Vec<u32> =
        candidates.iter().copied().filter(|t| t % (32 * num_ranks) == 0).collect();
    if out.is_empty() {
        out.push(32 * num_ranks);
    }
    out
}

pub fn normal_threads(num_ranks: u32, min_blocks: u32) -> u32 {
    normal_thread_candidates(num_ranks, min_blocks)[0]
}

/// Scope of the flags between ranks: `.gpu` when every rank of the job is on one GPU, `.sys`
/// when peers are on other GPUs (common.cuh `FLAG_SCOPE_SYS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlagScope {
    Gpu,
    Sys,
}

impl FlagScope {
    pub fn define(self) -> (&'static str, String) {
        ("FLAG_SCOPE_SYS", if self == FlagScope::Sys { "1" } else { "0" }.to_string())
    }
    pub fn as_str(self) -> &'static str {
        match self {
            FlagScope::Gpu => "gpu",
            FlagScope::Sys => "sys",
        }
    }
}

/// Warps that reduce one token together in the normal combine (intranode.cu
/// `COMBINE_GROUP_WARPS`): 5, or `wanted` (`HwOptions::combine_group_warps`) for experiments.
pub fn combine_group_warps(threads: u32, wanted: Option<u32>) -> u32 {
    let warps = threads / 32;
    let wanted = wanted.unwrap_or(5);
    // At least one group beside the head-updater warp, at most 13 groups (named barriers).
    wanted.clamp(1, warps.saturating_sub(1).max(1)).max((warps.saturating_sub(1)).div_ceil(13))
}

pub fn intranode(
    num_ranks: u32,
    threads: u32,
    min_blocks: u32,
    scope: FlagScope,
    options: &HwOptions,
) -> Vec<(&'static str, String)> {
    vec![
        ("NUM_RANKS", num_ranks.to_string()),
        ("NUM_THREADS", threads.to_string()),
        ("MIN_BLOCKS", min_blocks.to_string()),
        scope.define(),
        (
            "COMBINE_GROUP_WARPS",
            combine_group_warps(threads, options.combine_group_warps).to_string(),
        ),
        // L2 eviction-priority hints on ring and streaming accesses (common.cuh `USE_L2_HINTS`).
        ("USE_L2_HINTS", if options.l2_hints { "1" } else { "0" }.to_string()),
    ]
}

pub fn low_latency(
    hidden: u32,
    threads: u32,
    scope: FlagScope,
    options: &HwOptions,
) -> Vec<(&'static str, String)> {
    vec![
        ("HIDDEN", hidden.to_string()),
        ("LL_THREADS", threads.to_string()),
        scope.define(),
        // The combine's receive loop fetches the next item's top-k indices into L2 ahead
        // (low_latency.cu `LL_COMBINE_PREFETCH`).
        ("LL_COMBINE_PREFETCH", if options.ll_combine_prefetch { "1" } else { "0" }.to_string()),
        // The combine's per-block stamps (low_latency.cu `LL_TIMES`).
        ("LL_TIMES", if options.ll_times { "1" } else { "0" }.to_string()),
    ]
}

/// The normal internode kernels: ranks per node (the NVL peers of a forwarder), 512 threads.
pub fn internode(ranks_per_node: u32, scope: FlagScope) -> Vec<(&'static str, String)> {
    vec![
        ("RANKS_PER_NODE", ranks_per_node.to_string()),
        ("NUM_THREADS", INTERNODE_THREADS.to_string()),
        scope.define(),
    ]
}

/// Threads per block of the normal internode kernels (internode.cu lays its roles out for 16
/// warps).
pub const INTERNODE_THREADS: u32 = 512;

/// The cluster handoff probe at `threads` per block: 16-byte loads in flight per lane chosen so
/// that the registers fit one block of that size per SM (64 per thread at 1,024 threads).
pub fn cluster(threads: u32) -> Vec<(&'static str, String)> {
    let unroll = if threads > 512 { 7 } else { 14 };
    vec![("CL_THREADS", threads.to_string()), ("CL_UNROLL", unroll.to_string())]
}

/// Define sets that cover what the backend compiles (for the compile test).
pub fn representative(id: ModuleId) -> Vec<Vec<(&'static str, String)>> {
    match id {
        ModuleId::Intranode => {
            let o = HwOptions::default();
            vec![
                intranode(8, normal_threads(8, 2), 2, FlagScope::Gpu, &o),
                intranode(8, normal_threads(8, 1), 1, FlagScope::Sys, &o),
                intranode(4, normal_threads(4, 1), 1, FlagScope::Sys, &o),
                intranode(2, normal_threads(2, 1), 1, FlagScope::Gpu, &o),
            ]
        }
        ModuleId::LowLatency => {
            let prefetch =
                HwOptions { ll_combine_prefetch: true, ll_times: true, ..HwOptions::default() };
            vec![
                low_latency(7168, 1024, FlagScope::Gpu, &HwOptions::default()),
                low_latency(4096, 1024, FlagScope::Sys, &prefetch),
            ]
        }
        ModuleId::Cluster => vec![cluster(512), cluster(1024)],
        ModuleId::IntranodeCluster => vec![vec![("NUM_RANKS", "8".to_string())]],
        ModuleId::Internode => {
            vec![
                internode(8, FlagScope::Gpu),
                internode(4, FlagScope::Sys),
                internode(1, FlagScope::Gpu),
            ]
        }
        _ => vec![Vec::new()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_whole_warps_per_rank() {
        for n in [1, 2, 4, 8] {
            for b in [1, 2, 3] {
                let t = normal_threads(n, b);
                assert_eq!(t % (32 * n), 0, "{n} ranks, {b} blocks/SM: {t}");
                assert!(t * b <= 2048, "fits the SM's thread limit");
            }
        }
        assert_eq!(normal_threads(8, 1), 768);
        assert_eq!(normal_threads(8, 2), 512);
        for t in [256, 512, 768] {
            let g = combine_group_warps(t, None);
            let groups = (t / 32 - 1) / g;
            assert!((1..=13).contains(&groups), "{t} threads: {g} warps per group");
        }
    }
}
