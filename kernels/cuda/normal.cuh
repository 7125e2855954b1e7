// The normal kernels' host interface (hw/src/intranode.rs mirrors both structs field for field)
// and the NVL buffer's metadata accessor, shared by `intranode.cu` and `intranode_cluster.cu`.
#pragma once
#include "common.cuh"

// Per-rank pointers (host: hw/src/intranode.rs `NormalRankArgs`, same field order).
struct NormalRankArgs {
    // Source side (this rank's tokens).
    const int4* x;                   // [num_tokens][hidden_int4] dispatch payload (fp8 or bf16)
    const float* x_scales;           // [num_tokens][num_scales] (fp8 only)
    const int* topk_idx;             // [num_tokens][num_topk]
    const float* topk_weights;       // [num_tokens][num_topk]
    const u8* is_token_in_rank;      // [num_tokens][NUM_RANKS]  (layout)
    const int* num_tokens_per_rank;  // [NUM_RANKS]              (layout)
    const int* num_tokens_per_expert;  // [num_experts]          (layout)
    int* channel_prefix_matrix;      // [NUM_RANKS][num_channels] inclusive, tokens to each rank
    int* send_head;                  // [num_tokens][NUM_RANKS] ring index of each sent token
    // Receiver side.
    int* rank_prefix;                // [NUM_RANKS] inclusive prefix of tokens received per source
    int* num_recv_tokens_per_expert;  // [num_local_experts]
    int* num_recv_tokens;            // [1]
    int4* recv_x;                    // [num_recv][hidden_int4]
    float* recv_x_scales;            // [num_recv][num_scales]
    int* recv_src_idx;               // [num_recv]
    int* recv_topk_idx;              // [num_recv][num_topk] local expert index or -1
    float* recv_topk_weights;        // [num_recv][num_topk]
    int* recv_channel_offset;        // [NUM_RANKS][num_channels]
    // Combine.
    const int4* combine_x;           // [num_recv][combine_hidden_int4] bf16 expert outputs
    const float* combine_topk_weights;  // [num_recv][num_topk]
    int4* combined_x;                // [num_tokens][combine_hidden_int4] bf16
    float* combined_topk_weights;    // [num_tokens][num_topk]
    u8* buffer;                      // this rank's NVL buffer
    int num_tokens;
    int reserved;
};

// Launch parameters and the NVL buffer layout (host: `NormalParams`, same field order).
struct NormalParams {
    u64 timeout_ns;
    u64 off_recv_counts;         // int [NUM_RANKS]
    u64 off_recv_expert_counts;  // int [NUM_RANKS][num_local_experts]
    u64 off_barrier;             // int, monotonic
    u64 off_d_start, off_d_end, off_d_head, off_d_tail;  // int [num_channels][NUM_RANKS] each
    u64 off_c_head, off_c_tail;                          // int [num_channels][NUM_RANKS] each
    u64 off_x;                   // [num_channels][NUM_RANKS][nvl_recv][slot_bytes]
    u64 off_src_idx;             // int [num_channels][NUM_RANKS][nvl_recv]
    u64 off_topk_idx;            // int [...][nvl_recv][num_topk]
    u64 off_topk_weights;        // float [...][nvl_recv][num_topk]
    u64 off_scales;              // float [...][nvl_recv][num_scales]
    u64 slot_bytes;              // stride of one payload slot (multiple of 128)
    int num_channels;
    int num_experts;
    int num_topk;
    int hidden_int4;             // dispatch payload int4 per token
    int combine_hidden_int4;     // bf16 combine payload int4 per token
    int num_scales;
    int nvl_send;
    int nvl_recv;
    int rank_base;
    int num_local_ranks;
    int blocks_per_rank;
    int use_discard;
    int epoch;                   // barrier epoch: the barrier waits for NUM_RANKS * epoch arrivals
    int reserved;
};

DEVICE int* meta(u8* buffer, u64 off) { return (int*)(buffer + off); }

// BF16 partials summed in FP32 (the combine's reduction).
DEVICE void accumulate_bf16x8(float* acc, int4 v) {
    const u32 w[4] = {(u32)v.x, (u32)v.y, (u32)v.z, (u32)v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        acc[2 * j] += bf16_to_f32((u16)(w[j] & 0xffffu));
        acc[2 * j + 1] += bf16_to_f32((u16)(w[j] >> 16));
    }
}

DEVICE int4 pack_bf16x8(const float* acc) {
    u32 w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
        w[j] = (u32)f32_to_bf16(acc[2 * j]) | ((u32)f32_to_bf16(acc[2 * j + 1]) << 16);
    return make_int4((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
}

