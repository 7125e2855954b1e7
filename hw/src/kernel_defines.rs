//! The compile-time parameters (`-D` macros) each kernel module is built with.

use eptwin_kernels::ModuleId;

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

pub fn intranode(num_ranks: u32, threads: u32, min_blocks: u32) -> Vec<(&'static str, String)> {
    vec![
        ("NUM_RANKS", num_ranks.to_string()),
        ("NUM_THREADS", threads.to_string()),
        ("MIN_BLOCKS", min_blocks.to_string()),
    ]
}

pub fn low_latency(hidden: u32, threads: u32) -> Vec<(&'static str, String)> {
    vec![("HIDDEN", hidden.to_string()), ("LL_THREADS", threads.to_string())]
}

/// Define sets that cover what the backend compiles (for the compile test).
pub fn representative(id: ModuleId) -> Vec<Vec<(&'static str, String)>> {
    match id {
        ModuleId::Intranode => vec![
            intranode(8, normal_threads(8, 2), 2),
            intranode(8, normal_threads(8, 1), 1),
            intranode(4, normal_threads(4, 1), 1),
            intranode(2, normal_threads(2, 1), 1),
        ],
        ModuleId::LowLatency => vec![low_latency(7168, 1024), low_latency(4096, 1024)],
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
    }
}
