//! The `#[repr(C)]` mirrors of the low-latency kernels' argument structs: same fields, same
//! order, same offsets as the CUDA declarations (checked by the layout tests below).

/// Same fields, same order as `LlRankArgs` in low_latency.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LlRankArgs {
    pub(super) x: u64,
    pub(super) topk_idx: u64,
    pub(super) topk_weights: u64,
    pub(super) send_buf: u64,
    pub(super) atomic_counter: u64,
    pub(super) finish_counter: u64,
    pub(super) recv_buf: u64,
    pub(super) recv_count: u64,
    pub(super) packed_recv_x: u64,
    pub(super) packed_recv_scales: u64,
    pub(super) packed_recv_src_info: u64,
    pub(super) packed_recv_slot: u64,
    pub(super) packed_recv_layout_range: u64,
    pub(super) packed_recv_count: u64,
    pub(super) combine_x: u64,
    pub(super) combine_recv_buf: u64,
    pub(super) combine_recv_flag: u64,
    pub(super) combined_x: u64,
    pub(super) num_tokens: i32,
    pub(super) reserved: i32,
    pub(super) wire_recv_area: u64,
    pub(super) wire_send_area: u64,
    pub(super) ring_slots: u64,
    pub(super) ring_ticket: u64,
    pub(super) count_seen: u64,
    pub(super) ring_mask: u64,
    pub(super) recv_area_offset: u64,
    pub(super) send_area_offset: u64,
}

/// Same fields, same order as `LlParams` in low_latency.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LlParams {
    pub(super) timeout_ns: u64,
    pub(super) msg_bytes: u64,
    pub(super) combine_slot_bytes: u64,
    pub(super) num_ranks: i32,
    pub(super) num_experts: i32,
    pub(super) num_topk: i32,
    pub(super) max_tokens: i32,
    pub(super) capacity: i32,
    pub(super) rank_base: i32,
    pub(super) num_local_ranks: i32,
    pub(super) phases: i32,
    pub(super) use_discard: i32,
    pub(super) warps_per_group: i32,
    pub(super) dispatch_fp8: i32,
    pub(super) reserved: i32,
    pub(super) wire: eptwin_wire::protocol::LlLayout,
    pub(super) ranks_per_node: i32,
    pub(super) qps_per_peer: i32,
    pub(super) call: i32,
    pub(super) reserved2: i32,
    pub(super) block_times: u64,
}

#[cfg(test)]
mod tests {
    //! Expected offsets written from the C declarations (pointers and `u64` are 8 bytes, `int` 4;
    //! a struct's size rounds up to its largest member's alignment).

    use std::mem::{offset_of, size_of};

    use super::*;

    /// `LlRankArgs` in kernels/cuda/low_latency.cu: 18 pointers, `int num_tokens`, `int
    /// reserved`, then the wire's 5 pointers and 3 `u64`.
    #[test]
    fn ll_rank_args_matches_the_cuda_declaration() {
        assert_eq!(size_of::<LlRankArgs>(), 216);
        assert_eq!(offset_of!(LlRankArgs, x), 0);
        assert_eq!(offset_of!(LlRankArgs, topk_idx), 8);
        assert_eq!(offset_of!(LlRankArgs, topk_weights), 16);
        assert_eq!(offset_of!(LlRankArgs, send_buf), 24);
        assert_eq!(offset_of!(LlRankArgs, atomic_counter), 32);
        assert_eq!(offset_of!(LlRankArgs, finish_counter), 40);
        assert_eq!(offset_of!(LlRankArgs, recv_buf), 48);
        assert_eq!(offset_of!(LlRankArgs, recv_count), 56);
        assert_eq!(offset_of!(LlRankArgs, packed_recv_x), 64);
        assert_eq!(offset_of!(LlRankArgs, packed_recv_scales), 72);
        assert_eq!(offset_of!(LlRankArgs, packed_recv_src_info), 80);
        assert_eq!(offset_of!(LlRankArgs, packed_recv_slot), 88);
        assert_eq!(offset_of!(LlRankArgs, packed_recv_layout_range), 96);
        assert_eq!(offset_of!(LlRankArgs, packed_recv_count), 104);
        assert_eq!(offset_of!(LlRankArgs, combine_x), 112);
        assert_eq!(offset_of!(LlRankArgs, combine_recv_buf), 120);
        assert_eq!(offset_of!(LlRankArgs, combine_recv_flag), 128);
        assert_eq!(offset_of!(LlRankArgs, combined_x), 136);
        assert_eq!(offset_of!(LlRankArgs, num_tokens), 144);
        assert_eq!(offset_of!(LlRankArgs, reserved), 148);
        assert_eq!(offset_of!(LlRankArgs, wire_recv_area), 152);
        assert_eq!(offset_of!(LlRankArgs, wire_send_area), 160);
        assert_eq!(offset_of!(LlRankArgs, ring_slots), 168);
        assert_eq!(offset_of!(LlRankArgs, ring_ticket), 176);
        assert_eq!(offset_of!(LlRankArgs, count_seen), 184);
        assert_eq!(offset_of!(LlRankArgs, ring_mask), 192);
        assert_eq!(offset_of!(LlRankArgs, recv_area_offset), 200);
        assert_eq!(offset_of!(LlRankArgs, send_area_offset), 208);
    }

    /// `LlParams` in kernels/cuda/low_latency.cu: 3 `u64`, 12 `int`, `LlLayout` (14 `u64`),
    /// 4 `int`, a pointer.
    #[test]
    fn ll_params_matches_the_cuda_declaration() {
        assert_eq!(size_of::<LlParams>(), 208);
        assert_eq!(offset_of!(LlParams, timeout_ns), 0);
        assert_eq!(offset_of!(LlParams, msg_bytes), 8);
        assert_eq!(offset_of!(LlParams, combine_slot_bytes), 16);
        assert_eq!(offset_of!(LlParams, num_ranks), 24);
        assert_eq!(offset_of!(LlParams, num_experts), 28);
        assert_eq!(offset_of!(LlParams, num_topk), 32);
        assert_eq!(offset_of!(LlParams, max_tokens), 36);
        assert_eq!(offset_of!(LlParams, capacity), 40);
        assert_eq!(offset_of!(LlParams, rank_base), 44);
        assert_eq!(offset_of!(LlParams, num_local_ranks), 48);
        assert_eq!(offset_of!(LlParams, phases), 52);
        assert_eq!(offset_of!(LlParams, use_discard), 56);
        assert_eq!(offset_of!(LlParams, warps_per_group), 60);
        assert_eq!(offset_of!(LlParams, dispatch_fp8), 64);
        assert_eq!(offset_of!(LlParams, reserved), 68);
        assert_eq!(offset_of!(LlParams, wire), 72);
        assert_eq!(offset_of!(LlParams, ranks_per_node), 184);
        assert_eq!(offset_of!(LlParams, qps_per_peer), 188);
        assert_eq!(offset_of!(LlParams, call), 192);
        assert_eq!(offset_of!(LlParams, reserved2), 196);
        assert_eq!(offset_of!(LlParams, block_times), 200);
    }
}
