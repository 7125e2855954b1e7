//! The `#[repr(C)]` mirrors of the normal kernels' argument structs: same fields, same order,
//! same offsets as the CUDA declarations (checked by the layout tests below).

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LayoutRankArgs {
    pub(super) topk_idx: u64,
    pub(super) num_tokens_per_rank: u64,
    pub(super) num_tokens_per_expert: u64,
    pub(super) is_token_in_rank: u64,
    pub(super) num_tokens: i32,
    pub(super) reserved: i32,
}

/// Same fields, same order as `NormalRankArgs` in intranode.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct NormalRankArgs {
    pub(super) x: u64,
    pub(super) x_scales: u64,
    pub(super) topk_idx: u64,
    pub(super) topk_weights: u64,
    pub(super) is_token_in_rank: u64,
    pub(super) num_tokens_per_rank: u64,
    pub(super) num_tokens_per_expert: u64,
    pub(super) channel_prefix_matrix: u64,
    pub(super) send_head: u64,
    pub(super) rank_prefix: u64,
    pub(super) num_recv_tokens_per_expert: u64,
    pub(super) num_recv_tokens: u64,
    pub(super) recv_x: u64,
    pub(super) recv_x_scales: u64,
    pub(super) recv_src_idx: u64,
    pub(super) recv_topk_idx: u64,
    pub(super) recv_topk_weights: u64,
    pub(super) recv_channel_offset: u64,
    pub(super) combine_x: u64,
    pub(super) combine_topk_weights: u64,
    pub(super) combined_x: u64,
    pub(super) combined_topk_weights: u64,
    pub(super) buffer: u64,
    pub(super) num_tokens: i32,
    pub(super) reserved: i32,
}

/// Same fields, same order as `NormalParams` in intranode.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct NormalParams {
    pub(super) timeout_ns: u64,
    pub(super) off_recv_counts: u64,
    pub(super) off_recv_expert_counts: u64,
    pub(super) off_barrier: u64,
    pub(super) off_d_start: u64,
    pub(super) off_d_end: u64,
    pub(super) off_d_head: u64,
    pub(super) off_d_tail: u64,
    pub(super) off_c_head: u64,
    pub(super) off_c_tail: u64,
    pub(super) off_x: u64,
    pub(super) off_src_idx: u64,
    pub(super) off_topk_idx: u64,
    pub(super) off_topk_weights: u64,
    pub(super) off_scales: u64,
    pub(super) slot_bytes: u64,
    pub(super) num_channels: i32,
    pub(super) num_experts: i32,
    pub(super) num_topk: i32,
    pub(super) hidden_int4: i32,
    pub(super) combine_hidden_int4: i32,
    pub(super) num_scales: i32,
    pub(super) nvl_send: i32,
    pub(super) nvl_recv: i32,
    pub(super) rank_base: i32,
    pub(super) num_local_ranks: i32,
    pub(super) blocks_per_rank: i32,
    pub(super) use_discard: i32,
    pub(super) epoch: i32,
    pub(super) reserved: i32,
}

/// Same fields, same order as `InternodeRankArgs` in internode.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct InternodeRankArgs {
    pub(super) x: u64,
    pub(super) x_scales: u64,
    pub(super) topk_idx: u64,
    pub(super) topk_weights: u64,
    pub(super) is_token_in_rank: u64,
    pub(super) recv_rank_prefix: u64,
    pub(super) recv_channel_offset: u64,
    pub(super) num_recv_tokens: u64,
    pub(super) num_recv_tokens_per_expert: u64,
    pub(super) recv_x: u64,
    pub(super) recv_x_scales: u64,
    pub(super) recv_src_idx: u64,
    pub(super) recv_topk_idx: u64,
    pub(super) recv_topk_weights: u64,
    pub(super) combine_x: u64,
    pub(super) combine_topk_weights: u64,
    pub(super) combined_x: u64,
    pub(super) combined_topk_weights: u64,
    pub(super) nvl: u64,
    pub(super) fwd_log: u64,
    pub(super) state: u64,
    pub(super) recv_area: u64,
    pub(super) send_area: u64,
    pub(super) ring_slots: u64,
    pub(super) ring_ticket: u64,
    pub(super) ring_mask: u64,
    pub(super) recv_area_offset: u64,
    pub(super) send_area_offset: u64,
    pub(super) num_tokens: i32,
    pub(super) reserved: i32,
}

/// Same fields, same order as `InternodeParams` in internode.cu (the wire layout is the
/// protocol's own `#[repr(C)]` struct, which wire.cuh declares field for field).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct InternodeParams {
    pub(super) wire: eptwin_wire::protocol::NormalLayout,
    pub(super) timeout_ns: u64,
    pub(super) nvl_slot_bytes: u64,
    pub(super) nvl_meta_offset: u64,
    pub(super) nvl_topk_idx_offset: u64,
    pub(super) nvl_topk_weights_offset: u64,
    pub(super) nvl_scales_offset: u64,
    pub(super) nvl_counters_offset: u64,
    pub(super) nvl_dispatch_slots_offset: u64,
    pub(super) nvl_combine_slots_offset: u64,
    pub(super) fwd_log_stride: u64,
    pub(super) num_ranks: i32,
    pub(super) num_nodes: i32,
    pub(super) num_channels: i32,
    pub(super) num_experts: i32,
    pub(super) num_topk: i32,
    pub(super) hidden_int4: i32,
    pub(super) combine_hidden_int4: i32,
    pub(super) num_scales: i32,
    pub(super) nvl_recv: i32,
    pub(super) rank_base: i32,
    pub(super) num_local_ranks: i32,
    pub(super) qps_per_peer: i32,
}

#[cfg(test)]
mod tests {
    //! Expected offsets written from the C declarations (pointers and `u64` are 8 bytes, `int` 4;
    //! a struct's size rounds up to its largest member's alignment).

    use std::mem::{offset_of, size_of};

    use super::*;

    /// `LayoutRankArgs` in kernels/cuda/layout.cu: four pointers, then `int num_tokens`;
    /// the C struct's tail padding (to 40 bytes) is `reserved` here.
    #[test]
    fn layout_rank_args_matches_the_cuda_declaration() {
        assert_eq!(size_of::<LayoutRankArgs>(), 40);
        assert_eq!(offset_of!(LayoutRankArgs, topk_idx), 0);
        assert_eq!(offset_of!(LayoutRankArgs, num_tokens_per_rank), 8);
        assert_eq!(offset_of!(LayoutRankArgs, num_tokens_per_expert), 16);
        assert_eq!(offset_of!(LayoutRankArgs, is_token_in_rank), 24);
        assert_eq!(offset_of!(LayoutRankArgs, num_tokens), 32);
        assert_eq!(offset_of!(LayoutRankArgs, reserved), 36);
    }

    /// `NormalRankArgs` in kernels/cuda/normal.cuh: 23 pointers, `int num_tokens`, `int reserved`.
    #[test]
    fn normal_rank_args_matches_the_cuda_declaration() {
        assert_eq!(size_of::<NormalRankArgs>(), 192);
        assert_eq!(offset_of!(NormalRankArgs, x), 0);
        assert_eq!(offset_of!(NormalRankArgs, x_scales), 8);
        assert_eq!(offset_of!(NormalRankArgs, topk_idx), 16);
        assert_eq!(offset_of!(NormalRankArgs, topk_weights), 24);
        assert_eq!(offset_of!(NormalRankArgs, is_token_in_rank), 32);
        assert_eq!(offset_of!(NormalRankArgs, num_tokens_per_rank), 40);
        assert_eq!(offset_of!(NormalRankArgs, num_tokens_per_expert), 48);
        assert_eq!(offset_of!(NormalRankArgs, channel_prefix_matrix), 56);
        assert_eq!(offset_of!(NormalRankArgs, send_head), 64);
        assert_eq!(offset_of!(NormalRankArgs, rank_prefix), 72);
        assert_eq!(offset_of!(NormalRankArgs, num_recv_tokens_per_expert), 80);
        assert_eq!(offset_of!(NormalRankArgs, num_recv_tokens), 88);
        assert_eq!(offset_of!(NormalRankArgs, recv_x), 96);
        assert_eq!(offset_of!(NormalRankArgs, recv_x_scales), 104);
        assert_eq!(offset_of!(NormalRankArgs, recv_src_idx), 112);
        assert_eq!(offset_of!(NormalRankArgs, recv_topk_idx), 120);
        assert_eq!(offset_of!(NormalRankArgs, recv_topk_weights), 128);
        assert_eq!(offset_of!(NormalRankArgs, recv_channel_offset), 136);
        assert_eq!(offset_of!(NormalRankArgs, combine_x), 144);
        assert_eq!(offset_of!(NormalRankArgs, combine_topk_weights), 152);
        assert_eq!(offset_of!(NormalRankArgs, combined_x), 160);
        assert_eq!(offset_of!(NormalRankArgs, combined_topk_weights), 168);
        assert_eq!(offset_of!(NormalRankArgs, buffer), 176);
        assert_eq!(offset_of!(NormalRankArgs, num_tokens), 184);
        assert_eq!(offset_of!(NormalRankArgs, reserved), 188);
    }

    /// `NormalParams` in kernels/cuda/normal.cuh: 16 `u64`, then 14 `int`.
    #[test]
    fn normal_params_matches_the_cuda_declaration() {
        assert_eq!(size_of::<NormalParams>(), 184);
        assert_eq!(offset_of!(NormalParams, timeout_ns), 0);
        assert_eq!(offset_of!(NormalParams, off_recv_counts), 8);
        assert_eq!(offset_of!(NormalParams, off_recv_expert_counts), 16);
        assert_eq!(offset_of!(NormalParams, off_barrier), 24);
        assert_eq!(offset_of!(NormalParams, off_d_start), 32);
        assert_eq!(offset_of!(NormalParams, off_d_end), 40);
        assert_eq!(offset_of!(NormalParams, off_d_head), 48);
        assert_eq!(offset_of!(NormalParams, off_d_tail), 56);
        assert_eq!(offset_of!(NormalParams, off_c_head), 64);
        assert_eq!(offset_of!(NormalParams, off_c_tail), 72);
        assert_eq!(offset_of!(NormalParams, off_x), 80);
        assert_eq!(offset_of!(NormalParams, off_src_idx), 88);
        assert_eq!(offset_of!(NormalParams, off_topk_idx), 96);
        assert_eq!(offset_of!(NormalParams, off_topk_weights), 104);
        assert_eq!(offset_of!(NormalParams, off_scales), 112);
        assert_eq!(offset_of!(NormalParams, slot_bytes), 120);
        assert_eq!(offset_of!(NormalParams, num_channels), 128);
        assert_eq!(offset_of!(NormalParams, num_experts), 132);
        assert_eq!(offset_of!(NormalParams, num_topk), 136);
        assert_eq!(offset_of!(NormalParams, hidden_int4), 140);
        assert_eq!(offset_of!(NormalParams, combine_hidden_int4), 144);
        assert_eq!(offset_of!(NormalParams, num_scales), 148);
        assert_eq!(offset_of!(NormalParams, nvl_send), 152);
        assert_eq!(offset_of!(NormalParams, nvl_recv), 156);
        assert_eq!(offset_of!(NormalParams, rank_base), 160);
        assert_eq!(offset_of!(NormalParams, num_local_ranks), 164);
        assert_eq!(offset_of!(NormalParams, blocks_per_rank), 168);
        assert_eq!(offset_of!(NormalParams, use_discard), 172);
        assert_eq!(offset_of!(NormalParams, epoch), 176);
        assert_eq!(offset_of!(NormalParams, reserved), 180);
    }

    /// `InternodeRankArgs` in kernels/cuda/internode.cu: 25 pointers, 3 `u64`, 2 `int`.
    #[test]
    fn internode_rank_args_match_the_cuda_declaration() {
        assert_eq!(size_of::<InternodeRankArgs>(), 232);
        assert_eq!(offset_of!(InternodeRankArgs, x), 0);
        assert_eq!(offset_of!(InternodeRankArgs, is_token_in_rank), 32);
        assert_eq!(offset_of!(InternodeRankArgs, recv_rank_prefix), 40);
        assert_eq!(offset_of!(InternodeRankArgs, recv_channel_offset), 48);
        assert_eq!(offset_of!(InternodeRankArgs, num_recv_tokens), 56);
        assert_eq!(offset_of!(InternodeRankArgs, num_recv_tokens_per_expert), 64);
        assert_eq!(offset_of!(InternodeRankArgs, recv_x), 72);
        assert_eq!(offset_of!(InternodeRankArgs, recv_topk_weights), 104);
        assert_eq!(offset_of!(InternodeRankArgs, combine_x), 112);
        assert_eq!(offset_of!(InternodeRankArgs, combine_topk_weights), 120);
        assert_eq!(offset_of!(InternodeRankArgs, combined_x), 128);
        assert_eq!(offset_of!(InternodeRankArgs, combined_topk_weights), 136);
        assert_eq!(offset_of!(InternodeRankArgs, nvl), 144);
        assert_eq!(offset_of!(InternodeRankArgs, fwd_log), 152);
        assert_eq!(offset_of!(InternodeRankArgs, state), 160);
        assert_eq!(offset_of!(InternodeRankArgs, recv_area), 168);
        assert_eq!(offset_of!(InternodeRankArgs, send_area), 176);
        assert_eq!(offset_of!(InternodeRankArgs, ring_slots), 184);
        assert_eq!(offset_of!(InternodeRankArgs, ring_ticket), 192);
        assert_eq!(offset_of!(InternodeRankArgs, ring_mask), 200);
        assert_eq!(offset_of!(InternodeRankArgs, recv_area_offset), 208);
        assert_eq!(offset_of!(InternodeRankArgs, send_area_offset), 216);
        assert_eq!(offset_of!(InternodeRankArgs, num_tokens), 224);
        assert_eq!(offset_of!(InternodeRankArgs, reserved), 228);
    }

    /// `InternodeParams` in kernels/cuda/internode.cu: `NormalLayout` (21 `u64`), 10 `u64`,
    /// 12 `int`.
    #[test]
    fn internode_params_match_the_cuda_declaration() {
        assert_eq!(size_of::<InternodeParams>(), 296);
        assert_eq!(offset_of!(InternodeParams, wire), 0);
        assert_eq!(offset_of!(InternodeParams, timeout_ns), 168);
        assert_eq!(offset_of!(InternodeParams, nvl_slot_bytes), 176);
        assert_eq!(offset_of!(InternodeParams, nvl_meta_offset), 184);
        assert_eq!(offset_of!(InternodeParams, nvl_topk_idx_offset), 192);
        assert_eq!(offset_of!(InternodeParams, nvl_topk_weights_offset), 200);
        assert_eq!(offset_of!(InternodeParams, nvl_scales_offset), 208);
        assert_eq!(offset_of!(InternodeParams, nvl_counters_offset), 216);
        assert_eq!(offset_of!(InternodeParams, nvl_dispatch_slots_offset), 224);
        assert_eq!(offset_of!(InternodeParams, nvl_combine_slots_offset), 232);
        assert_eq!(offset_of!(InternodeParams, fwd_log_stride), 240);
        assert_eq!(offset_of!(InternodeParams, num_ranks), 248);
        assert_eq!(offset_of!(InternodeParams, num_nodes), 252);
        assert_eq!(offset_of!(InternodeParams, num_channels), 256);
        assert_eq!(offset_of!(InternodeParams, num_experts), 260);
        assert_eq!(offset_of!(InternodeParams, num_topk), 264);
        assert_eq!(offset_of!(InternodeParams, hidden_int4), 268);
        assert_eq!(offset_of!(InternodeParams, combine_hidden_int4), 272);
        assert_eq!(offset_of!(InternodeParams, num_scales), 276);
        assert_eq!(offset_of!(InternodeParams, nvl_recv), 280);
        assert_eq!(offset_of!(InternodeParams, rank_base), 284);
        assert_eq!(offset_of!(InternodeParams, num_local_ranks), 288);
        assert_eq!(offset_of!(InternodeParams, qps_per_peer), 292);
    }
}
