//! Dependent-load chains of DeepEP's low-latency kernels that no copy rate covers, each at the
//! load latency `eptwin calibrate` measures (`[gpu.memory]` `load_*_ns`, docs/calibration.md
//! "The low-latency kernels on one GPU"). A profile without those latencies has no chains: its
//! fitted per-round costs (`[deepep]` `ll_*`) stand in for them.

use eptwin_engine::api::Workload;

use crate::core::Core;
use crate::core::time::Time;
use crate::params::{OneGpu, Params};

/// Bytes one round of `UNROLLED_WARP_COPY(7, ...)` moves per warp: 7 loads of 16 B per lane.
const WARP_COPY_ROUND_BYTES: u64 = 7 * 32 * 16;
/// Bytes of a dispatch message's header (the source token index), before its payload.
const MSG_HEADER_BYTES: u64 = 16;
/// `topk_idx` entries one lane of the counting warp loads at once (`#pragma unroll 8`).
const COUNT_LOADS_IN_FLIGHT: u64 = 8;
/// Warps resident on an SM at full occupancy (sm_90: 2,048 threads), as the busy-latency probe
/// runs them (`probe.dependent_load.hbm_132x1024`: 132 blocks of 1,024 threads).
const WARPS_PER_SM: u64 = 32;

/// Dependent loads of one dispatch row a receive warp unpacks (`internode_ll.cu`, the receive
/// loop): the source-info load, one per copy round of the message's payload, one for the
/// scales.
pub fn recv_row_loads(msg_bytes: u64) -> u64 {
    2 + msg_bytes.saturating_sub(MSG_HEADER_BYTES).div_ceil(WARP_COPY_ROUND_BYTES)
}

/// The dependent load rounds of a dispatch block's counting warp (`internode_ll.cu`, the last
/// warp of every block): its 32 lanes read all `tokens × topk` entries of `topk_idx`, strided by
/// 32, eight in flight per lane, to count the tokens of the block's experts. The block's
/// `__syncthreads` before the count sends waits for it, so with many (token, top-k) pairs it,
/// not the block's tokens, sets when the counts leave: DeepEP's send kernel at hidden 2,048
/// runs nearly as long as at 7,168 (docs/calibration.md).
pub fn count_chain_loads(tokens: u32, topk: u32) -> u64 {
    (tokens as u64 * topk as u64).div_ceil(32).div_ceil(COUNT_LOADS_IN_FLIGHT)
}

/// Dependent loads of one combine row a send warp copies (`internode_ll.cu`, the combine's send
/// loop): its source index, then one per copy round of the BF16 row.
pub fn combine_row_loads(msg_bytes: u64) -> u64 {
    1 + msg_bytes.div_ceil(WARP_COPY_ROUND_BYTES)
}

/// A dependent HBM load's latency with `loading_warps` warps of the GPU loading at once:
/// `load_hbm_ns` alone, `load_hbm_busy_ns` with every warp slot of every SM loading (the probe's
/// 132 blocks of 1,024 threads), the queueing in between taken as proportional to the share of
/// those warps that load.
pub fn loaded_hbm_latency(g: &OneGpu, loading_warps: u64, sm_count: u32) -> Time {
    between_idle_and_busy(g.load_hbm, g.load_hbm_busy, loading_warps, sm_count)
}

fn between_idle_and_busy(idle: Time, busy: Time, loading_warps: u64, sm_count: u32) -> Time {
    let full = (sm_count as u64 * WARPS_PER_SM).max(1);
    idle + busy.saturating_sub(idle) * loading_warps.min(full) / full
}

/// HBM bytes of hook mode's dispatch receive kernel unpacking `msg_bytes` of messages: the
/// messages are read from HBM (the GEMM between the send and the hook evicted them); the rows
/// it writes stay in L2 (15 MB at 256 tokens × top-8, 30 MB with the rows read: within the
/// 50 MB and more of an sm_90 L2) and are written back after the kernel; each line it brings in (read or written) evicts one, and the
/// dirty ones among them, at most `flush_dirty` of what the GEMM's output stream left dirty
/// (measured as `flush_dirty_bytes` for the timing's 256 MB memset, the same stream of
/// stores), are written back during the kernel.
pub fn hook_recv_dram_bytes(msg_bytes: u64, flush_dirty: u64) -> u64 {
    msg_bytes + flush_dirty.min(2 * msg_bytes)
}

/// When GPU `gpu`'s memory has served hook mode's dispatch receive kernel of `msg_bytes`,
/// starting at `at`: with the rows' load chains known (`chained`, the GPU's memory measured)
/// the kernel's HBM traffic ([`hook_recv_dram_bytes`]) at the HBM rate, else its bytes at the
/// device copy rate.
pub fn hook_recv_hbm_end(
    core: &mut Core,
    gpu: u32,
    at: Time,
    msg_bytes: u64,
    chained: bool,
) -> Time {
    let hbm = &mut core.gpus.gpus[gpu as usize].hbm;
    match core.params.one_gpu.as_ref() {
        Some(g) if chained => {
            let dram = hook_recv_dram_bytes(msg_bytes, g.flush_dirty);
            hbm.reserve_for(at, msg_bytes, g.dram_rate.time(dram)).1
        }
        _ => hbm.reserve(at, msg_bytes).1,
    }
}

/// The chains of one low-latency op, in time (0: not this op's, or no latencies measured).
#[derive(Debug, Clone, Copy, Default)]
pub struct Chains {
    /// The counting warp's reads of `topk_idx` (from HBM: the op's index array is read once).
    pub count: Time,
    /// One row a receive warp unpacks: from HBM under load in hook mode (the test's GEMM
    /// flushed L2 before the receive kernel), from L2 fused (the send phase just wrote it).
    pub recv_row: Time,
    /// One row a combine send warp copies back: the expert outputs are read from HBM, with
    /// every warp of the GPU loading at once.
    pub combine_row: Time,
}

impl Chains {
    /// A dispatch of workload `w`, its receive kernel `recv_warps` warps.
    pub fn dispatch(params: &Params, w: &Workload, msg_bytes: u64, recv_warps: u64) -> Self {
        let Some(g) = params.one_gpu.as_ref() else { return Self::default() };
        let (tokens, topk) = (w.tokens_per_rank, w.topk);
        let rows = tokens as u64 * topk as u64;
        let row_load = if w.hook {
            loaded_hbm_latency(g, rows.min(recv_warps), params.sm_count)
        } else {
            g.load_l2
        };
        Chains {
            count: count_chain_loads(tokens, topk) * g.load_hbm,
            recv_row: recv_row_loads(msg_bytes) * row_load,
            combine_row: 0,
        }
    }

    pub fn combine(params: &Params, msg_bytes: u64) -> Self {
        let Some(g) = params.one_gpu.as_ref() else { return Self::default() };
        Chains { combine_row: combine_row_loads(msg_bytes) * g.load_hbm_busy, ..Self::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eptwin_engine::api::ll_dispatch_msg_bytes;
    use eptwin_engine::testing::proptest_config;
    use proptest::prelude::*;

    #[test]
    fn rows_of_the_sweep_take_the_copy_rounds_of_their_payload() {
        use eptwin_engine::api::Dtype;
        // FP8 payloads of 2,048 / 4,096 / 7,168 channels plus scales: 1, 2 and 3 copy rounds
        // of 3,584 B (7,168 + 224 B of scales spill into a third).
        let loads = |h| recv_row_loads(ll_dispatch_msg_bytes(h, Dtype::Fp8));
        assert_eq!((loads(2048), loads(4096), loads(7168)), (3, 4, 5));
        // BF16 combine rows of 4,096 / 8,192 / 14,336 B: 2, 3 and 4 copy rounds.
        assert_eq!((combine_row_loads(4096), combine_row_loads(8192)), (3, 4));
        assert_eq!(combine_row_loads(14336), 5);
    }

    #[test]
    fn hook_receive_reads_its_messages_and_writes_back_at_most_the_dirty_lines() {
        // 64 messages of 7,408 B bring 2 x 474 KB of lines in: all of it evicts dirty lines.
        assert_eq!(hook_recv_dram_bytes(474_112, 5_500_000), 474_112 * 3);
        // 2,048 messages (15.2 MB): the 5.5 MB left dirty are all that is written back.
        assert_eq!(hook_recv_dram_bytes(15_171_584, 5_500_000), 15_171_584 + 5_500_000);
        assert_eq!(hook_recv_dram_bytes(0, 5_500_000), 0);
    }

    #[test]
    fn a_load_waits_longer_the_more_warps_of_the_gpu_load() {
        let at = |warps| between_idle_and_busy(480, 911, warps, 132);
        assert_eq!((at(0), at(132 * 32), at(1_000_000)), (480, 911, 911));
        // A quarter of the warp slots loading: a quarter of the queueing.
        assert_eq!(at(33 * 32), 480 + 431 / 4);
    }

    #[test]
    fn the_counting_warp_reads_eight_entries_per_lane_at_once() {
        // 8 tokens x top-8 = 64 entries: two per lane, one round; 128 x 8: 32 per lane, 4.
        assert_eq!(count_chain_loads(8, 8), 1);
        assert_eq!(count_chain_loads(128, 8), 4);
        assert_eq!(count_chain_loads(256, 8), 8);
        assert_eq!(count_chain_loads(128, 1), 1);
        assert_eq!(count_chain_loads(0, 8), 0);
    }

    proptest! {
        #![proptest_config(proptest_config(256))]
        #[test]
        fn chains_grow_with_the_work(t in 1u32..4096, k in 1u32..16, b in 16u64..64_000) {
            prop_assert!(count_chain_loads(t + 1, k) >= count_chain_loads(t, k));
            prop_assert!(count_chain_loads(t, k + 1) >= count_chain_loads(t, k));
            prop_assert!(recv_row_loads(b + 1) >= recv_row_loads(b));
            prop_assert!(combine_row_loads(b + 1) >= combine_row_loads(b));
            prop_assert!(hook_recv_dram_bytes(b + 1, 5_000_000) > hook_recv_dram_bytes(b, 5_000_000));
            prop_assert!(hook_recv_dram_bytes(b, 5_000_000) <= 3 * b);
            let w = b / 16;
            let at = |w| between_idle_and_busy(480, 911, w, 132);
            prop_assert!(at(w + 1) >= at(w) && (480..=911).contains(&at(w)));
            // Never more rounds than one per lane's entries, never fewer than a lane's share / 8.
            let per_lane = (t as u64 * k as u64).div_ceil(32);
            prop_assert!(count_chain_loads(t, k) <= per_lane);
            prop_assert!(count_chain_loads(t, k) * COUNT_LOADS_IN_FLIGHT >= per_lane);
        }
    }
}
