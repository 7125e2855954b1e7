// Normal (high-throughput) intranode dispatch and combine, after DeepEP V1 `intranode.cu`.
//
// Channels of sender/receiver blocks: block 2c sends channel c, block 2c+1 receives it. Per
// (channel, source rank) a ring buffer of `nvl_recv` token slots lives in the *receiver's*
// NVL buffer (a peer pointer over NVLink, or device-local when ranks share a GPU). The sender
// pushes up to `nvl_send` tokens, then publishes the tail with a release store; the receiver
// polls the tail with acquire loads, drains the slots into its output and publishes the head.
// Combine mirrors it: the expert side pushes each received row back to its source rank, which
// sums the partials of every rank the token visited.
//
// Where the work split differs from DeepEP's (same protocol, same bytes on the wire): the
// dispatch sender reads each token once and stores it into every destination's ring (DeepEP
// gives each destination its own warps, which re-read the token per destination), and the
// combine receiver reduces one token per group of warps with exact ring heads (DeepEP: one
// warp per token, heads from a min over warps). Both keep the data in flight small enough to
// stay in L2 when the rings share one GPU's memory; results/h200/README.md has the numbers.
//
// One launch covers every rank placed on this GPU: blocks [l * blocks_per_rank,
// (l + 1) * blocks_per_rank) belong to local rank l (= job rank rank_base + l). All blocks
// must be resident at once (senders and receivers spin on each other); the host sizes the
// grid and MIN_BLOCKS from the occupancy API and refuses to launch otherwise.
//
// Compile-time parameters (NVRTC -D): NUM_RANKS (ranks of the job), NUM_THREADS (threads per
// block), MIN_BLOCKS (resident blocks per SM needed for co-residency).
#include "common.cuh"
#include "normal.cuh"

#ifndef NUM_RANKS
#error "NUM_RANKS must be defined"
#endif
#ifndef NUM_THREADS
#define NUM_THREADS 768
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
// Warps that reduce one combined token together.
#ifndef COMBINE_GROUP_WARPS
#define COMBINE_GROUP_WARPS 5
#endif

constexpr int kThreadsPerRank = NUM_THREADS / NUM_RANKS;
constexpr int kWarpsPerRank = kThreadsPerRank / 32;
static_assert(kThreadsPerRank % 32 == 0, "threads per rank must be whole warps");
static_assert(NUM_RANKS <= 14, "one named barrier per rank group");


// Barrier across every rank of the job (one thread per local rank calls it): what this rank
// wrote before is visible to all once each has counted in (epoch-numbered, never reset).
DEVICE void barrier_ranks(const NormalRankArgs* args, const NormalParams& p, u8* my, int rank,
                          ErrorRecord* err) {
    __threadfence_system();
    for (int d = 0; d < NUM_RANKS; ++d) red_add_release_flag(meta(args[d].buffer, p.off_barrier), 1);
    const int target = NUM_RANKS * p.epoch;
    const u64 t0 = globaltimer_ns();
    int v;
    while ((v = ld_acquire_flag(meta(my, p.off_barrier))) < target) {
        if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
            record_timeout(err, WAIT_NOTIFY_BARRIER, rank, -1, -1, -1, target, v);
            break;
        }
    }
}

// Exchange per-rank and per-expert counts, build the channel prefix matrix, clean the dispatch
// ring metadata and barrier across ranks (DeepEP `notify_dispatch`). One block per local rank.
extern "C" __global__ void __launch_bounds__(1024, 1)
    intranode_notify_dispatch(const NormalRankArgs* args, NormalParams p, ErrorRecord* err) {
    const int rank = p.rank_base + blockIdx.x;
    const NormalRankArgs a = args[rank];
    const int C = p.num_channels, L = p.num_experts / NUM_RANKS;
    u8* my = a.buffer;
    for (int i = threadIdx.x; i < C * NUM_RANKS; i += blockDim.x) {
        meta(my, p.off_d_start)[i] = 0;
        meta(my, p.off_d_end)[i] = 0;
        meta(my, p.off_d_head)[i] = 0;
        meta(my, p.off_d_tail)[i] = 0;
    }
    for (int i = threadIdx.x; i < NUM_RANKS * C; i += blockDim.x) {
        const int d = i / C, c = i % C;
        int ts, te;
        channel_task_range(a.num_tokens, C, c, ts, te);
        int count = 0;
        for (int t = ts; t < te; ++t) count += a.is_token_in_rank[t * NUM_RANKS + d];
        a.channel_prefix_matrix[i] = count;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < NUM_RANKS; d += blockDim.x) {
        int run = 0;
        for (int c = 0; c < C; ++c) {
            run += a.channel_prefix_matrix[d * C + c];
            a.channel_prefix_matrix[d * C + c] = run;
        }
    }
    for (int d = threadIdx.x; d < NUM_RANKS; d += blockDim.x)
        meta(args[d].buffer, p.off_recv_counts)[rank] = a.num_tokens_per_rank[d];
    for (int i = threadIdx.x; i < NUM_RANKS * L; i += blockDim.x) {
        const int d = i / L, le = i % L;
        meta(args[d].buffer, p.off_recv_expert_counts)[rank * L + le] = a.num_tokens_per_expert[i];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        barrier_ranks(args, p, my, rank, err);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int s = 0; s < NUM_RANKS; ++s) {
            run += ld_cg_s32(meta(my, p.off_recv_counts) + s);
            a.rank_prefix[s] = run;
        }
        *a.num_recv_tokens = run;
    }
    for (int le = threadIdx.x; le < L; le += blockDim.x) {
        int sum = 0;
        for (int s = 0; s < NUM_RANKS; ++s) sum += ld_cg_s32(meta(my, p.off_recv_expert_counts) + s * L + le);
        a.num_recv_tokens_per_expert[le] = sum;
    }
}

extern "C" __global__ void __launch_bounds__(NUM_THREADS, MIN_BLOCKS)
    intranode_dispatch(const NormalRankArgs* args, NormalParams p, ErrorRecord* err) {
    const int local = blockIdx.x / p.blocks_per_rank, sm_id = blockIdx.x % p.blocks_per_rank;
    const int rank = p.rank_base + local;
    const int channel = sm_id / 2;
    const bool is_sender = sm_id % 2 == 0;
    const int C = p.num_channels, R = p.nvl_recv, K = p.num_topk, S = p.num_scales;
    const int hidden_int4 = p.hidden_int4;
    const int slot_int4 = (int)(p.slot_bytes / 16);
    const int L = p.num_experts / NUM_RANKS;
    const int thread_id = threadIdx.x, lane = thread_id % 32;
    const int responsible_rank = thread_id / kThreadsPerRank;
    const int thread_in_rank = thread_id % kThreadsPerRank;
    const int warp_in_rank = thread_in_rank / 32;
    const NormalRankArgs& a = args[rank];

    if (is_sender) {
        // The whole block sends this channel's tokens, window by window: a window is the next
        // nvl_send tokens, so no ring gets more than nvl_send tokens per published tail (DeepEP's
        // chunking). Each token is read once and stored into the ring of every rank it goes to
        // (DeepEP's warps-per-destination read a token once per destination, which on one GPU
        // is several extra passes over the input through L2 and HBM). Warps split a token's
        // hidden dimension so that one batch of loads covers their part.
        constexpr int kNumWarps = NUM_THREADS / 32;
        const int warp = thread_id / 32;
        const int W = min(p.nvl_send, 32);
        const int P = max(1, kNumWarps / W);
        const int ring = channel * NUM_RANKS + rank;  // ring (channel, source = this rank) on each dst
        __shared__ u8* sh_buf[NUM_RANKS];
        __shared__ unsigned sh_mask[NUM_RANKS];
        __shared__ int sh_tail[NUM_RANKS];
        if (thread_id < NUM_RANKS) sh_buf[thread_id] = args[thread_id].buffer;
        // Offsets are sent as `-value - 1` so that 0 means "not yet written".
        if (warp == 0 && lane < NUM_RANKS) {
            const int* cpm = a.channel_prefix_matrix + lane * C;
            u8* buf = args[lane].buffer;
            st_relaxed_flag(meta(buf, p.off_d_start) + ring, -(channel > 0 ? cpm[channel - 1] : 0) - 1);
            st_relaxed_flag(meta(buf, p.off_d_end) + ring, -cpm[channel] - 1);
        }
        __syncthreads();

        int ts, te;
        channel_task_range(a.num_tokens, C, channel, ts, te);
        const int L_ = L;
        const u64 pol_keep = l2_policy_evict_last();
        int my_tail = 0, my_head = 0;  // warp 0, lane d: ring d's tail and last head seen
        for (int w0 = ts; w0 < te; w0 += W) {
            const int nw = min(W, te - w0);
            if (warp == 0) {
                // Which ranks each token of the window goes to: lane l holds token w0 + l.
                u32 bits = 0;
                if (lane < nw) {
#pragma unroll
                    for (int d = 0; d < NUM_RANKS; ++d)
                        bits |= (a.is_token_in_rank[(w0 + lane) * NUM_RANKS + d] != 0 ? 1u : 0u) << d;
                }
                unsigned my_mask = 0;
#pragma unroll
                for (int d = 0; d < NUM_RANKS; ++d) {
                    const unsigned m = __ballot_sync(0xffffffffu, (bits >> d) & 1u);
                    const int tail_d = __shfl_sync(0xffffffffu, my_tail, d);
                    if (lane == d) my_mask = m;
                    // send_head: the ring index each token gets, or -1 (combine reads it back).
                    if (lane < nw)
                        a.send_head[(w0 + lane) * NUM_RANKS + d] =
                            ((bits >> d) & 1u) ? tail_d + __popc(m & ((1u << lane) - 1u)) : -1;
                }
                if (lane < NUM_RANKS) {
                    const int need = __popc(my_mask);
                    // Room for this window's tokens; the head is re-read only when needed.
                    if (R - (my_tail - my_head) < need) {
                        const int* head_ptr = meta(args[lane].buffer, p.off_d_head) + ring;
                        const u64 t0 = globaltimer_ns();
                        while (true) {
                            my_head = ld_relaxed_flag(head_ptr);
                            if (R - (my_tail - my_head) >= need) break;
                            if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                                record_timeout(err, WAIT_DISPATCH_RING_SPACE, rank, channel, lane, -1,
                                               need, R - (my_tail - my_head));
                                break;
                            }
                        }
                    }
                    sh_mask[lane] = my_mask;
                    sh_tail[lane] = my_tail;
                    my_tail += need;
                }
            }
            __syncthreads();
            for (int item = warp; item < nw * P; item += kNumWarps) {
                const int i = item / P, q = item % P;
                const int t = w0 + i;
                const int4* src_x = a.x + (u64)t * hidden_int4;
                // Slot of token i in destination d's ring, or -1 (from shared memory where used:
                // the registers hold the loads in flight).
                auto slot_of = [&](int d) {
                    const unsigned m = sh_mask[d];
                    return ((m >> i) & 1u) ? (sh_tail[d] + __popc(m & ((1u << i) - 1u))) % R : -1;
                };
                for (int j0 = q * 32 + lane; j0 < hidden_int4; j0 += 4 * 32 * P) {
                    int4 v[4];
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const int j = j0 + k * 32 * P;
                        if (j < hidden_int4) v[k] = ld_nc_v4(src_x + j);
                    }
                    for (int d = 0; d < NUM_RANKS; ++d) {
                        const int sd = slot_of(d);
                        if (sd < 0) continue;
                        int4* dst_x = (int4*)(sh_buf[d] + p.off_x + ((u64)ring * R + sd) * p.slot_bytes);
#pragma unroll
                        for (int k = 0; k < 4; ++k) {
                            const int j = j0 + k * 32 * P;
                            if (j < hidden_int4) st_na_v4_hint(dst_x + j, v[k], pol_keep);
                        }
                    }
                }
                if (q == 0) {
                    const int e = lane < K ? a.topk_idx[t * K + lane] : -1;
                    const float w_v = lane < K ? a.topk_weights[t * K + lane] : 0.0f;
                    const float s0 = lane < S ? a.x_scales[t * S + lane] : 0.0f;
                    const float s1 = lane + 32 < S ? a.x_scales[t * S + lane + 32] : 0.0f;
                    for (int d = 0; d < NUM_RANKS; ++d) {
                        const int sd = slot_of(d);
                        if (sd < 0) continue;
                        u8* buf = sh_buf[d];
                        const u64 sl = (u64)ring * R + sd;
                        if (lane == 0) (meta(buf, p.off_src_idx))[sl] = t;
                        if (lane < K) {
                            const int le = (e >= d * L_ && e < (d + 1) * L_) ? e - d * L_ : -1;
                            meta(buf, p.off_topk_idx)[sl * K + lane] = le;
                            ((float*)(buf + p.off_topk_weights))[sl * K + lane] = le >= 0 ? w_v : 0.0f;
                        }
                        float* ss = (float*)(buf + p.off_scales) + sl * S;
                        if (lane < S) ss[lane] = s0;
                        if (lane + 32 < S) ss[lane + 32] = s1;
                        for (int jj = lane + 64; jj < S; jj += 32) ss[jj] = a.x_scales[t * S + jj];
                    }
                }
            }
            // Publish the new tails once every warp stored its part of the window.
            __syncthreads();
            if (warp == 0 && lane < NUM_RANKS && sh_mask[lane] != 0)
                st_release_flag(meta(args[lane].buffer, p.off_d_tail) + ring, my_tail);
        }
    } else {
        const int src = responsible_rank;
        u8* buf = a.buffer;
        const int ring = channel * NUM_RANKS + src;
        const int* start_ptr = meta(buf, p.off_d_start) + ring;
        const int* end_ptr = meta(buf, p.off_d_end) + ring;
        int* head_ptr = meta(buf, p.off_d_head) + ring;
        const int* tail_ptr = meta(buf, p.off_d_tail) + ring;
        const int4* slot_x = (const int4*)(buf + p.off_x + (u64)ring * R * p.slot_bytes);
        const int* slot_src = meta(buf, p.off_src_idx) + (u64)ring * R;
        const int* slot_topk = meta(buf, p.off_topk_idx) + (u64)ring * R * K;
        const float* slot_w = (const float*)(buf + p.off_topk_weights) + (u64)ring * R * K;
        const float* slot_s = (const float*)(buf + p.off_scales) + (u64)ring * R * S;

        __shared__ volatile int shared_tail[NUM_RANKS];
        __shared__ volatile int shared_abort[NUM_RANKS];
        __shared__ volatile int shared_offsets[NUM_RANKS][2];
        if (thread_in_rank == 0) {
            int start = 0, end = 0, abort = 0;
            const u64 t0 = globaltimer_ns();
            while ((start = ld_relaxed_flag(start_ptr)) == 0 || (end = ld_relaxed_flag(end_ptr)) == 0) {
                if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                    record_timeout(err, WAIT_DISPATCH_OFFSETS, rank, channel, src, -1, 1, 0);
                    abort = 1;
                    break;
                }
            }
            shared_offsets[src][0] = start;
            shared_offsets[src][1] = end;
            shared_abort[src] = abort;
        }
        named_barrier(1 + src, kThreadsPerRank);
        if (shared_abort[src]) return;
        int total_offset = -shared_offsets[src][0] - 1;
        int num_to_recv = -shared_offsets[src][1] - 1 - total_offset;
        if (warp_in_rank == 0 && lane == 0) a.recv_channel_offset[src * C + channel] = total_offset;
        total_offset += src > 0 ? a.rank_prefix[src - 1] : 0;

        const u64 pol_first = l2_policy_evict_first();
        auto ld_first = [pol_first](const int4* ptr) { return ld_cg_v4_hint(ptr, pol_first); };
        auto st_first = [pol_first](int4* ptr, int4 v) { st_na_v4_hint(ptr, v, pol_first); };
        int cached_head = 0;
        while (num_to_recv > 0) {
            if (thread_in_rank == 0) {
                int tail = cached_head, abort = 0;
                const u64 t0 = globaltimer_ns();
                while ((tail = ld_acquire_flag(tail_ptr)) == cached_head) {
                    if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                        record_timeout(err, WAIT_DISPATCH_TAIL, rank, channel, src, -1,
                                       cached_head + 1, tail);
                        abort = 1;
                        break;
                    }
                }
                shared_tail[src] = tail;
                shared_abort[src] = abort;
            }
            named_barrier(1 + src, kThreadsPerRank);
            if (shared_abort[src]) break;
            const int cached_tail = shared_tail[src];
            const int n = cached_tail - cached_head;
            // One warp per token moves the payload and its metadata together, so every load of
            // a token is in flight at once (no separate, serialised passes over side arrays).
            for (int i = warp_in_rank; i < n; i += kWarpsPerRank) {
                const int slot = (cached_head + i) % R;
                const int row = total_offset + i;
                const int src_v = lane == 0 ? ld_cg_s32(slot_src + slot) : 0;
                const int topk_v = lane < K ? ld_cg_s32(slot_topk + slot * K + lane) : 0;
                const float w_v = lane < K ? ld_cg_f32(slot_w + slot * K + lane) : 0.0f;
                const float s0 = lane < S ? ld_cg_f32(slot_s + slot * S + lane) : 0.0f;
                const float s1 = lane + 32 < S ? ld_cg_f32(slot_s + slot * S + lane + 32) : 0.0f;
                const int4* s = slot_x + (u64)slot * slot_int4;
                int4* d = a.recv_x + (u64)row * hidden_int4;
                UNROLLED_WARP_COPY(7, lane, hidden_int4, d, s, ld_first, st_first);
                if (lane == 0) a.recv_src_idx[row] = src_v;
                if (lane < K) {
                    a.recv_topk_idx[row * K + lane] = topk_v;
                    a.recv_topk_weights[row * K + lane] = w_v;
                }
                if (lane < S) a.recv_x_scales[(u64)row * S + lane] = s0;
                if (lane + 32 < S) a.recv_x_scales[(u64)row * S + lane + 32] = s1;
                for (int j = lane + 64; j < S; j += 32)
                    a.recv_x_scales[(u64)row * S + j] = ld_cg_f32(slot_s + slot * S + j);
                if (p.use_discard) {
                    __syncwarp();
                    warp_discard(s, (hidden_int4 * 16 + 127) / 128 * 128, lane);
                }
            }
            cached_head += n;
            total_offset += n;
            num_to_recv -= n;
            named_barrier(1 + src, kThreadsPerRank);
            if (warp_in_rank == kWarpsPerRank - 1 && lane == 0) st_release_flag(head_ptr, cached_head);
        }
    }
}

// Before combine (DeepEP `cached_notify_combine`): clean the combine ring metadata, and rewrite
// the send_head entries of tokens not sent to a rank as `-next_head - 1`, so that a receiver
// warp passing such a token can still advance that ring's head. One block per local rank.
extern "C" __global__ void __launch_bounds__(1024, 1)
    intranode_notify_combine(const NormalRankArgs* args, NormalParams p, ErrorRecord* err) {
    const int rank = p.rank_base + blockIdx.x;
    const NormalRankArgs a = args[rank];
    const int C = p.num_channels;
    u8* my = a.buffer;
    for (int i = threadIdx.x; i < C * NUM_RANKS; i += blockDim.x) {
        meta(my, p.off_c_head)[i] = 0;
        meta(my, p.off_c_tail)[i] = 0;
    }
    for (int i = threadIdx.x; i < C * NUM_RANKS; i += blockDim.x) {
        const int c = i / NUM_RANKS, d = i % NUM_RANKS;
        int ts, te;
        channel_task_range(a.num_tokens, C, c, ts, te);
        int last_head = a.channel_prefix_matrix[d * C + c] -
                        (c > 0 ? a.channel_prefix_matrix[d * C + c - 1] : 0);
        for (int t = te - 1; t >= ts; --t) {
            const int h = a.send_head[t * NUM_RANKS + d];
            if (h < 0)
                a.send_head[t * NUM_RANKS + d] = -last_head - 1;
            else
                last_head = h;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        barrier_ranks(args, p, my, rank, err);
    }
}

extern "C" __global__ void __launch_bounds__(NUM_THREADS, MIN_BLOCKS)
    intranode_combine(const NormalRankArgs* args, NormalParams p, ErrorRecord* err) {
    constexpr int kNumWarps = NUM_THREADS / 32;
    const int local = blockIdx.x / p.blocks_per_rank, sm_id = blockIdx.x % p.blocks_per_rank;
    const int rank = p.rank_base + local;
    const int channel = sm_id / 2;
    const bool is_sender = sm_id % 2 == 0;
    const int C = p.num_channels, R = p.nvl_recv, K = p.num_topk;
    const int hidden_int4 = p.combine_hidden_int4;
    const int slot_int4 = (int)(p.slot_bytes / 16);
    const int thread_id = threadIdx.x, lane = thread_id % 32, warp = thread_id / 32;
    const NormalRankArgs& a = args[rank];

    if (is_sender) {
        // This rank holds expert outputs; send the rows it received from `dst` in `channel`
        // back to `dst`, in the order they arrived.
        const int dst = thread_id / kThreadsPerRank;
        const int warp_in_rank = (thread_id % kThreadsPerRank) / 32;
        u8* buf = args[dst].buffer;
        const int ring = channel * NUM_RANKS + rank;
        const int* head_ptr = meta(buf, p.off_c_head) + ring;
        int* tail_ptr = meta(buf, p.off_c_tail) + ring;
        int4* slot_x = (int4*)(buf + p.off_x + (u64)ring * R * p.slot_bytes);
        int* slot_src = meta(buf, p.off_src_idx) + (u64)ring * R;
        float* slot_w = (float*)(buf + p.off_topk_weights) + (u64)ring * R * K;

        const int rank_offset = dst > 0 ? a.rank_prefix[dst - 1] : 0;
        const int num_rank_tokens = a.rank_prefix[dst] - rank_offset;
        const int channel_offset = a.recv_channel_offset[dst * C + channel];
        const int num_channel_tokens =
            (channel == C - 1 ? num_rank_tokens : a.recv_channel_offset[dst * C + channel + 1]) -
            channel_offset;
        const int ts = rank_offset + channel_offset, te = ts + num_channel_tokens;
        const u64 pol_keep = l2_policy_evict_last(), pol_first = l2_policy_evict_first();
        auto st_keep = [pol_keep](int4* ptr, int4 v) { st_na_v4_hint(ptr, v, pol_keep); };
        auto ld_first = [pol_first](const int4* ptr) { return ld_nc_v4_hint(ptr, pol_first); };
        int current_tail = 0, cached_head = 0;
        for (int t = ts; t < te;) {
            if (lane == 0 && R - (current_tail - cached_head) < p.nvl_send) {
                const u64 t0 = globaltimer_ns();
                while (true) {
                    cached_head = ld_relaxed_flag(head_ptr);
                    if (R - (current_tail - cached_head) >= p.nvl_send) break;
                    if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                        record_timeout(err, WAIT_COMBINE_RING_SPACE, rank, channel, dst, -1,
                                       p.nvl_send, R - (current_tail - cached_head));
                        break;
                    }
                }
            }
            __syncwarp();
            const int chunk = min(p.nvl_send, te - t);
            for (int i = warp_in_rank; i < chunk; i += kWarpsPerRank) {
                const int slot = (current_tail + i) % R;
                int4* d = slot_x + (u64)slot * slot_int4;
                const int4* s = a.combine_x + (u64)(t + i) * hidden_int4;
                UNROLLED_WARP_COPY(7, lane, hidden_int4, d, s, ld_first, st_keep);
                if (lane == 0) slot_src[slot] = a.recv_src_idx[t + i];
                if (lane < K) slot_w[slot * K + lane] = a.combine_topk_weights[(t + i) * K + lane];
            }
            t += chunk;
            current_tail += chunk;
            named_barrier(1 + dst, kThreadsPerRank);
            if (warp_in_rank == 0 && lane == 0) st_release_flag(tail_ptr, current_tail);
        }
    } else {
        // This rank is the tokens' source: sum the partials of every rank each token visited.
        // Groups of kGroupWarps warps reduce one token each (DeepEP: one warp per token). Fewer
        // tokens in flight per block keeps the partials a block waits for small enough to stay
        // in L2 between the sender's store and this load, and each token still has hundreds of
        // independent loads in flight.
        constexpr int kGroupWarps = COMBINE_GROUP_WARPS;
        constexpr int kGroups = (kNumWarps - 1) / kGroupWarps;
        static_assert(kGroups >= 1 && kGroups <= 13, "reducer groups use named barriers 2..14");
        // pending[g][d]: the first slot of ring d that group g still needs (its current token's
        // slot, or the next slot a later token uses); INT_MAX once the group is done. A ring's
        // head is the minimum over groups: exactly the first slot still needed.
        __shared__ volatile int pending[kGroups][NUM_RANKS];
        __shared__ int group_off[kGroups][NUM_RANKS];
        __shared__ int group_exp[kGroups][NUM_RANKS];
        for (int i = thread_id; i < kGroups * NUM_RANKS; i += NUM_THREADS) pending[i / NUM_RANKS][i % NUM_RANKS] = 0;
        __syncthreads();
        u8* buf = a.buffer;
        const int4* ring_x = (const int4*)(buf + p.off_x);
        const float* ring_w = (const float*)(buf + p.off_topk_weights);
        int ts, te;
        channel_task_range(a.num_tokens, C, channel, ts, te);

        if (warp == 0) {
            // Queue-head updater.
            if (lane < NUM_RANKS) {
                int* head_ptr = meta(buf, p.off_c_head) + channel * NUM_RANKS + lane;
                int last_head = 0;
                while (true) {
                    int min_head = 0x7fffffff;
                    for (int g = 0; g < kGroups; ++g) min_head = min(min_head, pending[g][lane]);
                    if (min_head == 0x7fffffff) break;
                    if (min_head > last_head) st_release_flag(head_ptr, last_head = min_head);
                }
            }
        } else if (warp - 1 < kGroups * kGroupWarps) {
            const int g = (warp - 1) / kGroupWarps, sub = (warp - 1) % kGroupWarps;
            const int gthreads = kGroupWarps * 32, gtid = sub * 32 + lane;
            const int* tail_base = meta(buf, p.off_c_tail) + channel * NUM_RANKS;
            const u64 pol_first = l2_policy_evict_first();
            int cached_tail = 0;  // leader warp, lane < NUM_RANKS
            for (int t = ts + g; t < te; t += kGroups) {
                if (sub == 0 && lane < NUM_RANKS) {
                    const int expected = a.send_head[t * NUM_RANKS + lane];
                    pending[g][lane] = expected >= 0 ? expected : -expected - 1;
                    if (expected >= 0 && cached_tail <= expected) {
                        const u64 t0 = globaltimer_ns();
                        while ((cached_tail = ld_acquire_flag(tail_base + lane)) <= expected) {
                            if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                                record_timeout(err, WAIT_COMBINE_TAIL, rank, channel, lane, -1,
                                               expected + 1, cached_tail);
                                break;
                            }
                        }
                    }
                    group_exp[g][lane] = expected;
                    // int4 offset of the slot in the ring area (the host checks 31 bits).
                    group_off[g][lane] =
                        expected >= 0 ? ((channel * NUM_RANKS + lane) * R + expected % R) * slot_int4 : -1;
                }
                named_barrier(2 + g, gthreads);
                // Slot offsets are read from shared memory where used: the registers go to the
                // NUM_RANKS loads in flight per position.
                const int* off = group_off[g];
                for (int i = gtid; i < hidden_int4; i += gthreads) {
                    int4 v[NUM_RANKS];
#pragma unroll
                    for (int j = 0; j < NUM_RANKS; ++j) {
                        const int o = off[j];
                        if (o >= 0) v[j] = ld_cg_v4_hint(ring_x + o + i, pol_first);
                    }
                    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
                    for (int j = 0; j < NUM_RANKS; ++j)
                        if (off[j] >= 0) accumulate_bf16x8(acc, v[j]);
                    st_na_v4_hint(a.combined_x + (u64)t * hidden_int4 + i, pack_bf16x8(acc), pol_first);
                }
                if (gtid < K) {
                    float w = 0.0f;
                    for (int j = 0; j < NUM_RANKS; ++j) {
                        const int o = off[j];
                        if (o >= 0) w += ld_cg_f32(ring_w + (o / slot_int4) * K + gtid);
                    }
                    a.combined_topk_weights[t * K + gtid] = w;
                }
                named_barrier(2 + g, gthreads);
                if (p.use_discard) {
                    const int lines = (hidden_int4 * 16 + 127) / 128;
                    for (int j = 0; j < NUM_RANKS; ++j) {
                        const int o = off[j];
                        if (o >= 0)
                            for (int l = gtid; l < lines; l += gthreads) discard_l2_line(ring_x + o + l * 8);
                    }
                    named_barrier(2 + g, gthreads);
                }
                // This token's slots are consumed.
                if (sub == 0 && lane < NUM_RANKS) {
                    const int e = group_exp[g][lane];
                    pending[g][lane] = e >= 0 ? e + 1 : -e - 1;
                }
            }
            if (sub == 0 && lane < NUM_RANKS) pending[g][lane] = 0x7fffffff;
        }
    }
}
