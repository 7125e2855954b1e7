//! Dependent-load chains of DeepEP's low-latency kernels that no copy rate covers, each at the
//! load latency `eptwin calibrate` measures (`[gpu.memory]` `load_*_ns`, docs/calibration.md
//! "The low-latency kernels on one GPU"). A profile without those latencies has no chains: its
//! fitted per-round costs (`[deepep]` `ll_*`) stand in for them.

use crate::core::time::Time;
use crate::params::Params;

/// Bytes one round of `UNROLLED_WARP_COPY(7, ...)` moves per warp: 7 loads of 16 B per lane.
const WARP_COPY_ROUND_BYTES: u64 = 7 * 32 * 16;
/// Bytes of a dispatch message's header (the source token index), before its payload.
const MSG_HEADER_BYTES: u64 = 16;
/// `topk_idx` entries one lane of the counting warp loads at once (`#pragma unroll 8`).
const COUNT_LOADS_IN_FLIGHT: u64 = 8;

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
    pub fn dispatch(params: &Params, tokens: u32, topk: u32, hook: bool, msg_bytes: u64) -> Self {
        let Some(g) = params.one_gpu.as_ref() else { return Self::default() };
        let row_load = if hook { g.load_hbm_busy } else { g.load_l2 };
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
            // Never more rounds than one per lane's entries, never fewer than a lane's share / 8.
            let per_lane = (t as u64 * k as u64).div_ceil(32);
            prop_assert!(count_chain_loads(t, k) <= per_lane);
            prop_assert!(count_chain_loads(t, k) * COUNT_LOADS_IN_FLIGHT >= per_lane);
        }
    }
}
