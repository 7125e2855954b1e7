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
