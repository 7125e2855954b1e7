// Dispatch layout (DeepEP `get_dispatch_layout`): from `topk_idx`, the tokens each rank and
// each expert receives from this rank and the `is_token_in_rank` matrix.
//
// One block per co-located rank (blockIdx.x); shared-memory histograms, so the outputs need no
// zeroing before the launch and the counts come out the same on every run.
#include "common.cuh"

struct LayoutRankArgs {
    const int* topk_idx;         // [num_tokens][num_topk], -1 = masked
    int* num_tokens_per_rank;    // [num_ranks]
    int* num_tokens_per_expert;  // [num_experts]
    u8* is_token_in_rank;        // [num_tokens][num_ranks]
    int num_tokens;
};

#define LAYOUT_MAX_RANKS 64
#define LAYOUT_MAX_EXPERTS 1024

extern "C" __global__ void __launch_bounds__(1024, 1)
    get_dispatch_layout(const LayoutRankArgs* args, int num_ranks, int num_experts, int num_topk) {
    __shared__ int rank_count[LAYOUT_MAX_RANKS];
    __shared__ int expert_count[LAYOUT_MAX_EXPERTS];
    const LayoutRankArgs a = args[blockIdx.x];
    const int experts_per_rank = num_experts / num_ranks;
    for (int i = threadIdx.x; i < num_experts; i += blockDim.x) expert_count[i] = 0;
    for (int i = threadIdx.x; i < num_ranks; i += blockDim.x) rank_count[i] = 0;
    __syncthreads();
    for (int t = threadIdx.x; t < a.num_tokens; t += blockDim.x) {
        u64 mask = 0;
        for (int k = 0; k < num_topk; ++k) {
            const int e = a.topk_idx[t * num_topk + k];
            if (e >= 0) {
                atomicAdd(&expert_count[e], 1);
                mask |= 1ull << (e / experts_per_rank);
            }
        }
        for (int r = 0; r < num_ranks; ++r) {
            const bool in = (mask >> r) & 1ull;
            a.is_token_in_rank[t * num_ranks + r] = in ? 1 : 0;
            if (in) atomicAdd(&rank_count[r], 1);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < num_experts; i += blockDim.x)
        a.num_tokens_per_expert[i] = expert_count[i];
    for (int i = threadIdx.x; i < num_ranks; i += blockDim.x)
        a.num_tokens_per_rank[i] = rank_count[i];
}
