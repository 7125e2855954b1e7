// Low-latency dispatch and combine, after DeepEP V1 `internode_ll.cu` on its NVLink path.
//
// Dispatch: each token is cast to FP8 with one scale per 128 channels (in the kernel), staged
// once, and stored once per (token, selected expert) into that expert's slot on the owning rank:
// `recv_buf[local_expert][src_rank][slot]`, slot = atomicAdd on a per-expert counter. When a
// rank has sent everything for an expert, one signal carries the count (`-count - 1`) to
// `recv_count[local_expert][src_rank]` — for every expert, zero-token ones too. Receivers wait
// for the counts and pack the messages into `packed_recv_x[local_expert][...]`.
// Combine: each expert output row goes back to its token's source rank as one BF16 store into
// `combine_recv_buf[token][topk_slot]`, then one flag per (expert, source rank); the source
// waits for all flags and computes the top-k weighted sum.
//
// One launch covers every rank on this GPU with a grid no larger than what is resident at once
// (the host sizes it with the occupancy API): blocks wait on each other, never on blocks that
// are not running. Deviations from DeepEP, for eight ranks sharing one GPU: the packed position
// of a source's block is the prefix of the counts of lower source ranks (deterministic, no
// atomic, no grid sync); the combine receive slot is (token, top-k slot) instead of (global
// expert, token), which keeps the buffer at T·K rows instead of E·T; the counters are zeroed by
// the host before the launch instead of by the previous launch.
//
// Ranks on other nodes (LlParams::ranks_per_node > 0, with the job's ranks split into nodes of
// that many): their messages go through the CPU-proxy wire in the protocol's layout
// (hw/src/internode/low_latency.rs `LlLayout`, docs/internode-wire.md), DeepEP's RDMA path. The
// token's message is staged once in the send region (header {token, 0, 0, 0}: a staged message
// serves every destination, so it cannot carry the top-k slot) and a `Write` per (token,
// selected expert) on QP `local expert` lands it in `[local expert][source rank][slot]` of the
// owner's receive area; then a `Flag` adds `count + 1` to that expert's cumulative count, after
// the writes (one doorbell ring per rank, records in ticket order). Receivers take a remote
// source's messages from the receive region (packed top-k slot -1: not known there) and local
// ones as above. Combine sends a remote source each row into its `[global expert][token]` slot
// and a `Flag` adding 1 per (expert, source) call; the source waits for `call + 1` and reads
// those rows from the receive region.
//
// Compile-time parameters: HIDDEN, LL_THREADS (threads per block), and two measurement aids
// (hw/src/options.rs): LL_COMBINE_PREFETCH (0 or 1: the combine's receive loop prefetches the
// next item's top-k indices into L2; `EPTWIN_LL_COMBINE_PREFETCH`) and LL_TIMES (0 or 1: the
// combine stamps, per block, %globaltimer at its start, at each send group's last item, when its
// receive loop has seen its first rank's flags and at the end of its receive loop into
// `LlParams::block_times`; `EPTWIN_LL_TIMES`).
#include "common.cuh"
#include "wire.cuh"

#ifndef HIDDEN
#error "HIDDEN must be defined"
#endif
#ifndef LL_THREADS
#define LL_THREADS 1024
#endif
#ifndef LL_COMBINE_PREFETCH
#define LL_COMBINE_PREFETCH 0
#endif
#ifndef LL_TIMES
#define LL_TIMES 0
#endif

#define FINISH_TAG (1 << 30)
#define LL_PHASE_SEND 1
#define LL_PHASE_RECV 2
#define LL_MAX_ITEMS_PER_BLOCK 128
#define LL_MAX_GROUPS 32
// LL_TIMES words per block: start, one per send group (at most 32 warps / 1 warp per group),
// receive loop end, receive loop start (its first rank's flags seen).
#define LL_TIME_WORDS (3 + LL_MAX_GROUPS)

// DeepEP's low-latency hidden sizes (2048 ... 8192) are multiples of 512; 256 keeps every
// 128-channel group of the FP8 cast inside one half-warp of fully active warps.
static_assert(HIDDEN % 256 == 0, "hidden must be a multiple of 256");
constexpr int kHiddenBf16Int4 = HIDDEN / 8;
constexpr int kNumScales = HIDDEN / 128;
constexpr int kNumWarps = LL_THREADS / 32;

// Per-rank pointers (host: hw/src/low_latency.rs `LlRankArgs`, same field order).
struct LlRankArgs {
    const int4* x;                    // [num_tokens][HIDDEN] bf16
    const int* topk_idx;              // [num_tokens][num_topk], -1 = masked
    const float* topk_weights;        // [num_tokens][num_topk]
    u8* send_buf;                     // [max_tokens][msg_bytes] staged messages
    int* atomic_counter;              // [num_experts] slot counters (zeroed by the host)
    int* finish_counter;              // [num_experts] (zeroed by the host)
    u8* recv_buf;                     // [local_experts][num_ranks][max_tokens][msg_bytes]
    int* recv_count;                  // [local_experts][num_ranks] (zeroed by the host)
    int4* packed_recv_x;              // [local_experts][capacity][payload_int4]
    float* packed_recv_scales;        // [local_experts][capacity][kNumScales]
    int* packed_recv_src_info;        // [local_experts][capacity] source token index
    int* packed_recv_slot;            // [local_experts][capacity] top-k slot at the source
    long long* packed_recv_layout_range;  // [local_experts][num_ranks]: begin | count << 32
    int* packed_recv_count;           // [local_experts]
    const int4* combine_x;            // [local_experts][capacity][HIDDEN] bf16 expert outputs
    u8* combine_recv_buf;             // [max_tokens][num_topk][combine_slot_bytes]
    int* combine_recv_flag;           // [num_experts] (zeroed by the host)
    int4* combined_x;                 // [num_tokens][HIDDEN] bf16
    int num_tokens;
    int reserved;
    // The wire towards ranks on other nodes (unused when LlParams::ranks_per_node is 0).
    u8* wire_recv_area;               // this rank's area of its node's receive region (mapped)
    u8* wire_send_area;               // this rank's area of its node's send region (mapped)
    u8* ring_slots;                   // the rank's doorbell ring (mapped)
    u64* ring_ticket;                 // its ticket counter (device)
    u64* count_seen;                  // [2][local experts][num_ranks] remote counts, by call parity
    u64 ring_mask;
    u64 recv_area_offset;             // local index × receive area bytes
    u64 send_area_offset;             // local index × send area bytes
};

// Host: `LlParams`, same field order.
struct LlParams {
    u64 timeout_ns;
    u64 msg_bytes;           // dispatch message stride (header + payload + scales, 128-aligned)
    u64 combine_slot_bytes;  // combine receive slot stride (2·HIDDEN, 128-aligned)
    int num_ranks;
    int num_experts;
    int num_topk;
    int max_tokens;          // T = num_max_dispatch_tokens_per_rank
    int capacity;            // packed rows per local expert
    int rank_base;
    int num_local_ranks;
    int phases;
    int use_discard;
    int warps_per_group;
    int dispatch_fp8;        // 1: FP8 + scales, 0: BF16
    int reserved;
    LlLayout wire;           // receive / send areas of the wire
    int ranks_per_node;      // 0: every rank on one node (no wire)
    int qps_per_peer;
    int call;                // calls of this op before this one (cumulative counters)
    int reserved2;
    u64* block_times;        // LL_TIMES: LL_TIME_WORDS per block (the combine's stamps), else null
};

DEVICE bool ll_remote(const LlParams& p, int a, int b) {
    return p.ranks_per_node > 0 && a / p.ranks_per_node != b / p.ranks_per_node;
}

DEVICE u32 ll_qp(const LlParams& p, int src, int dst, int local_expert) {
    const int R = p.ranks_per_node;
    return qp_index(src / R, dst / R, R, R, src % R, dst % R, p.qps_per_peer, local_expert);
}

// The receive-region offset of `rank`'s area (every node's region has the same layout).
DEVICE u64 ll_area(const LlParams& p, int rank) {
    return (u64)(rank % p.ranks_per_node) * p.wire.recv_area_bytes;
}

DEVICE void unpack_bf16x8(int4 v, float* f) {
    const u32 w[4] = {(u32)v.x, (u32)v.y, (u32)v.z, (u32)v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        f[2 * j] = bf16_to_f32((u16)(w[j] & 0xffffu));
        f[2 * j + 1] = bf16_to_f32((u16)(w[j] >> 16));
    }
}

extern "C" __global__ void __launch_bounds__(LL_THREADS, 1)
    ll_dispatch(const LlRankArgs* args, LlParams p, ErrorRecord* err) {
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int G = gridDim.x;
    const int E = p.num_experts, N = p.num_ranks, K = p.num_topk, L = E / N;
    constexpr int kCastThreads = (kNumWarps - 1) * 32;
    static_assert(kCastThreads % 16 == 0, "a 128-channel group must not straddle iterations");
    const int payload_bytes = p.dispatch_fp8 ? HIDDEN : 2 * HIDDEN;
    const int msg_int4 = (16 + payload_bytes + (p.dispatch_fp8 ? kNumScales * 4 : 0)) / 16;

    // (local rank, expert) pairs whose count this block signals.
    const int items = p.num_local_ranks * E;
    const int per_block = (items + G - 1) / G;
    const int item_begin = min((int)blockIdx.x * per_block, items);
    const int item_end = min(item_begin + per_block, items);
    __shared__ int shared_expected[LL_MAX_ITEMS_PER_BLOCK];

    if (p.phases & LL_PHASE_SEND) {
        if (warp == kNumWarps - 1) {
            // Counting warp: tokens each of this block's (rank, expert) pairs will send.
            for (int j = item_begin; j < item_end;) {
                const int lr = j / E, e_begin = j % E;
                const int e_end = min(E, e_begin + (item_end - j));
                const LlRankArgs& a = args[p.rank_base + lr];
                for (int x = lane; x < e_end - e_begin; x += 32) shared_expected[j - item_begin + x] = 0;
                __syncwarp();
                for (int i = lane; i < a.num_tokens * K; i += 32) {
                    const int e = a.topk_idx[i];
                    if (e >= e_begin && e < e_end) atomicAdd(&shared_expected[j - item_begin + e - e_begin], 1);
                }
                __syncwarp();
                for (int x = lane; x < e_end - e_begin; x += 32)
                    red_add_release_gpu(a.finish_counter + e_begin + x,
                                        FINISH_TAG - shared_expected[j - item_begin + x]);
                j += e_end - e_begin;
            }
        } else {
            // Cast and send, one (token, rank) per block at a time; ranks interleaved so that all
            // co-located ranks progress together as they would on separate GPUs.
            const int total = p.num_local_ranks * p.max_tokens;
            for (int it = blockIdx.x; it < total; it += G) {
                const int lr = it % p.num_local_ranks, t = it / p.num_local_ranks;
                const int rank = p.rank_base + lr;
                const LlRankArgs& a = args[rank];
                if (t >= a.num_tokens) continue;
                u8* msg = a.send_buf + (u64)t * p.msg_bytes;
                const int4* x = a.x + (u64)t * kHiddenBf16Int4;
                for (int i = tid; i < kHiddenBf16Int4; i += kCastThreads) {
                    const int4 v = ld_nc_v4(x + i);
                    if (p.dispatch_fp8) {
                        float f[8];
                        unpack_bf16x8(v, f);
                        float amax = 0.0f;
#pragma unroll
                        for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(f[j]));
#pragma unroll
                        for (int m = 8; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
                        amax = fmaxf(amax, 1e-4f);
                        const float scale = 448.0f / amax, scale_inv = amax / 448.0f;
                        u32 w0 = (u32)f32x2_to_e4m3x2(f[0] * scale, f[1] * scale) |
                                 ((u32)f32x2_to_e4m3x2(f[2] * scale, f[3] * scale) << 16);
                        u32 w1 = (u32)f32x2_to_e4m3x2(f[4] * scale, f[5] * scale) |
                                 ((u32)f32x2_to_e4m3x2(f[6] * scale, f[7] * scale) << 16);
                        *(uint2*)(msg + 16 + i * 8) = make_uint2(w0, w1);
                        if (lane % 16 == 0) ((float*)(msg + 16 + HIDDEN))[i / 16] = scale_inv;
                    } else {
                        *(int4*)(msg + 16 + i * 16) = v;
                    }
                }
                named_barrier(1, kCastThreads);
                if (p.ranks_per_node > 0) {
                    // Stage the message once for every destination on another node.
                    bool any_remote = false;
                    for (int k = 0; k < K; ++k) {
                        const int e = a.topk_idx[t * K + k];
                        any_remote |= e >= 0 && ll_remote(p, rank, e / L);
                    }
                    if (any_remote) {
                        int4* st = (int4*)(a.wire_send_area + ll_dispatch_staging(p.wire, t));
                        if (tid == 0) st[0] = make_int4(t, 0, 0, 0);
                        for (int i = tid; i < msg_int4 - 1; i += kCastThreads)
                            st[1 + i] = ld_cg_v4((const int4*)msg + 1 + i);
                        __threadfence_system();
                        named_barrier(1, kCastThreads);
                    }
                }
                if (warp < K) {
                    const int e = a.topk_idx[t * K + warp];
                    if (e >= 0) {
                        int slot = 0;
                        if (lane == 0) slot = atomicAdd(a.atomic_counter + e, 1);
                        slot = __shfl_sync(0xffffffffu, slot, 0);
                        const int dst_rank = e / L, le = e % L;
                        if (ll_remote(p, rank, dst_rank)) {
                            if (lane == 0) {
                                const DoorbellRing ring = {a.ring_slots, a.ring_ticket, a.ring_mask};
                                doorbell_push(ring, DOORBELL_WRITE, ll_qp(p, rank, dst_rank, le),
                                              a.send_area_offset + ll_dispatch_staging(p.wire, t),
                                              ll_area(p, dst_rank) + ll_dispatch_recv(p.wire, le, rank, slot),
                                              (u32)p.wire.dispatch_msg_bytes, 0,
                                              wire_tag(TAG_LL_DISPATCH_DATA, rank, le, t), p.timeout_ns,
                                              err, rank, WAIT_DOORBELL_SLOT);
                            }
                        } else {
                            u8* dst = args[dst_rank].recv_buf +
                                      (((u64)le * N + rank) * p.max_tokens + slot) * p.msg_bytes;
                            if (lane == 0) *(int4*)dst = make_int4(t, warp, 0, 0);
                            UNROLLED_WARP_COPY(7, lane, msg_int4 - 1, (int4*)dst + 1,
                                               (const int4*)msg + 1, ld_cg_v4, st_na_v4);
                        }
                        __syncwarp();
                        if (lane == 0) red_add_release_gpu(a.finish_counter + e, 1);
                    }
                }
            }
        }
        __syncthreads();
        // Count signalling: once every token for an expert is stored, tell its owner how many.
        for (int j = item_begin + tid; j < item_end; j += LL_THREADS) {
            const int lr = j / E, e = j % E, rank = p.rank_base + lr;
            const LlRankArgs& a = args[rank];
            const u64 t0 = globaltimer_ns();
            int v;
            while ((v = ld_acquire_gpu(a.finish_counter + e)) != FINISH_TAG) {
                if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                    record_timeout(err, WAIT_LL_SEND_DONE, rank, -1, -1, e, FINISH_TAG, v);
                    break;
                }
            }
            const int count = shared_expected[j - item_begin];
            if (ll_remote(p, rank, e / L)) {
                const DoorbellRing ring = {a.ring_slots, a.ring_ticket, a.ring_mask};
                doorbell_push(ring, DOORBELL_FLAG, ll_qp(p, rank, e / L, e % L), 0,
                              ll_area(p, e / L) + ll_dispatch_count(p.wire, e % L, rank), 8,
                              (u64)count + 1, wire_tag(TAG_LL_DISPATCH_COUNT, rank, e % L, count),
                              p.timeout_ns, err, rank, WAIT_DOORBELL_SLOT);
            } else {
                st_release_flag(args[e / L].recv_count + (e % L) * N + rank, -count - 1);
            }
        }
    }

    if (p.phases & LL_PHASE_RECV) {
        const int wpg = p.warps_per_group;
        const int groups = kNumWarps / wpg;
        const int group = warp / wpg, sub_warp = warp % wpg;
        const int payload_int4 = payload_bytes / 16;
        __shared__ int shared_n[LL_MAX_GROUPS], shared_begin[LL_MAX_GROUPS];
        const int recv_items = p.num_local_ranks * L * N;
        for (int base = blockIdx.x * groups; base < recv_items; base += G * groups) {
            const int item = base + group;
            if (group >= groups || item >= recv_items) continue;
            const int lr = item % p.num_local_ranks, rest = item / p.num_local_ranks;
            const int src = rest % N, le = rest / N;
            const int rank = p.rank_base + lr;
            const LlRankArgs& a = args[rank];
            if (sub_warp == 0 && lane == 0) {
                int begin = 0, n = 0;
                bool ok = true;
                for (int s = 0; s <= src && ok; ++s) {
                    const u64 t0 = globaltimer_ns();
                    int c;
                    if (ll_remote(p, rank, s)) {
                        // Cumulative over calls: this call's count is what it added.
                        const u64 seen = a.count_seen[((u64)(p.call & 1) * L + le) * N + s];
                        const u64* cp = (const u64*)(a.wire_recv_area + ll_dispatch_count(p.wire, le, s));
                        u64 v;
                        while ((v = ld_acquire_sys_u64(cp)) <= seen) {
                            if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                                record_timeout(err, WAIT_LL_RECV_COUNT, rank, -1, s, rank * L + le,
                                               (int)seen + 1, (int)v);
                                ok = false;
                                break;
                            }
                        }
                        c = (int)(v - seen - 1);
                        if (ok && s == src) a.count_seen[((u64)((p.call + 1) & 1) * L + le) * N + s] = v;
                    } else {
                        while ((c = ld_acquire_flag(a.recv_count + le * N + s)) == 0) {
                            if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                                record_timeout(err, WAIT_LL_RECV_COUNT, rank, -1, s, rank * L + le, 1, 0);
                                ok = false;
                                break;
                            }
                        }
                        c = -c - 1;
                    }
                    if (s < src) begin += c; else n = c;
                }
                if (!ok || n < 0 || n > p.max_tokens || begin < 0 || begin + n > p.capacity) n = 0, begin = 0;
                shared_n[group] = n;
                shared_begin[group] = begin;
                a.packed_recv_layout_range[le * N + src] = (long long)begin | ((long long)n << 32);
                if (src == N - 1) a.packed_recv_count[le] = begin + n;
            }
            named_barrier(2 + group, wpg * 32);
            const int n = shared_n[group], begin = shared_begin[group];
            const bool remote_src = ll_remote(p, rank, src);
            const u8* src_base = remote_src
                ? a.wire_recv_area + ll_dispatch_recv(p.wire, le, src, 0)
                : a.recv_buf + ((u64)le * N + src) * p.max_tokens * p.msg_bytes;
            const u64 stride = remote_src ? p.wire.dispatch_msg_bytes : p.msg_bytes;
            for (int i = sub_warp; i < n; i += wpg) {
                const u8* m = src_base + (u64)i * stride;
                const u64 row = (u64)le * p.capacity + begin + i;
                if (remote_src) {
                    const int4 hdr = ld_sys_v4((const int4*)m);
                    if (lane == 0) {
                        a.packed_recv_src_info[row] = hdr.x;
                        a.packed_recv_slot[row] = -1;
                    }
                    UNROLLED_WARP_COPY(7, lane, payload_int4, a.packed_recv_x + row * payload_int4,
                                       (const int4*)(m + 16), ld_sys_v4, st_na_v4);
                    if (p.dispatch_fp8)
                        for (int j = lane; j < kNumScales; j += 32)
                            a.packed_recv_scales[row * kNumScales + j] = ld_sys_f32((const float*)(m + 16 + HIDDEN) + j);
                    continue;
                }
                const int4 hdr = ld_cg_v4((const int4*)m);
                if (lane == 0) {
                    a.packed_recv_src_info[row] = hdr.x;
                    a.packed_recv_slot[row] = hdr.y;
                }
                UNROLLED_WARP_COPY(7, lane, payload_int4, a.packed_recv_x + row * payload_int4,
                                   (const int4*)(m + 16), ld_cg_v4, st_na_v4);
                if (p.dispatch_fp8)
                    for (int j = lane; j < kNumScales; j += 32)
                        a.packed_recv_scales[row * kNumScales + j] = ld_cg_f32((const float*)(m + 16 + HIDDEN) + j);
                if (p.use_discard) {
                    __syncwarp();
                    warp_discard(m, (int)p.msg_bytes, lane);
                }
            }
            named_barrier(2 + group, wpg * 32);
        }
    }
}

// One token's top-k weighted sum into `combined_x`, thread `tid`'s 16-byte columns: one slot
// load per selected expert, each after the previous one's multiply-add. kAllLocal (every rank on
// this node) compiles out the per-slot remote test: its `e / L` and the `.sys` load's memory
// clobber (which makes every link reload the `args` pointers) cost the one-GPU combine 2.7 % on
// an H100 (results/h100/ll-combine-local/).
template <bool kAllLocal>
DEVICE void ll_combine_reduce(const LlParams& p, const LlRankArgs& a, int rank, int t,
                              const int4* recv, int tid) {
    const int K = p.num_topk, L = p.num_experts / p.num_ranks;
    const int slot_int4 = (int)(p.combine_slot_bytes / 16);
    for (int i = tid; i < kHiddenBf16Int4; i += LL_THREADS) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int k = 0; k < K; ++k) {
            const int e = a.topk_idx[t * K + k];
            if (e < 0) continue;
            const float w = a.topk_weights[t * K + k];
            float f[8];
            const int4 v = !kAllLocal && ll_remote(p, rank, e / L)
                ? ld_sys_v4((const int4*)(a.wire_recv_area + ll_combine_recv(p.wire, e, t)) + i)
                : ld_cg_v4(recv + (u64)k * slot_int4 + i);
            unpack_bf16x8(v, f);
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[j] = __fmaf_rn(w, f[j], acc[j]);
        }
        u32 w4[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            w4[j] = (u32)f32_to_bf16(acc[2 * j]) | ((u32)f32_to_bf16(acc[2 * j + 1]) << 16);
        st_na_v4(a.combined_x + (u64)t * kHiddenBf16Int4 + i,
                 make_int4((int)w4[0], (int)w4[1], (int)w4[2], (int)w4[3]));
    }
}

extern "C" __global__ void __launch_bounds__(LL_THREADS, 1)
    ll_combine(const LlRankArgs* args, LlParams p, ErrorRecord* err) {
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int G = gridDim.x;
    const int E = p.num_experts, N = p.num_ranks, K = p.num_topk, L = E / N;
    const int slot_int4 = (int)(p.combine_slot_bytes / 16);
#if LL_TIMES
    u64* stamps = p.block_times + (u64)blockIdx.x * LL_TIME_WORDS;
    if (tid == 0) stamps[0] = globaltimer_ns();
#endif

    if (p.phases & LL_PHASE_SEND) {
        const int wpg = p.warps_per_group;
        const int groups = kNumWarps / wpg;
        const int group = warp / wpg, sub_warp = warp % wpg;
        const int items = p.num_local_ranks * L * N;
        for (int base = blockIdx.x * groups; base < items; base += G * groups) {
            const int item = base + group;
            if (group >= groups || item >= items) continue;
            const int lr = item % p.num_local_ranks, rest = item / p.num_local_ranks;
            const int dst = rest % N, le = rest / N;
            const int rank = p.rank_base + lr;
            const LlRankArgs& a = args[rank];
            const long long range = a.packed_recv_layout_range[le * N + dst];
            const int begin = (int)(range & 0xffffffffll), n = (int)(range >> 32);
            const bool remote_dst = ll_remote(p, rank, dst);
            u8* dst_buf = args[dst].combine_recv_buf;
            for (int i = sub_warp; i < n; i += wpg) {
                const u64 row = (u64)le * p.capacity + begin + i;
                const int t = a.packed_recv_src_info[row], k = a.packed_recv_slot[row];
                const int4* s = a.combine_x + row * kHiddenBf16Int4;
                if (remote_dst) {
                    const u64 staged = ll_combine_staging(p.wire, le, dst, i);
                    UNROLLED_WARP_COPY(7, lane, kHiddenBf16Int4, (int4*)(a.wire_send_area + staged), s,
                                       ld_nc_v4, st_na_v4);
                    __threadfence_system();
                    __syncwarp();
                    if (lane == 0) {
                        const DoorbellRing ring = {a.ring_slots, a.ring_ticket, a.ring_mask};
                        doorbell_push(ring, DOORBELL_WRITE, ll_qp(p, rank, dst, le), a.send_area_offset + staged,
                                      ll_area(p, dst) + ll_combine_recv(p.wire, rank * L + le, t),
                                      (u32)p.wire.combine_msg_bytes, 0,
                                      wire_tag(TAG_LL_COMBINE_DATA, rank, le, t), p.timeout_ns, err,
                                      rank, WAIT_DOORBELL_SLOT);
                    }
                    continue;
                }
                int4* d = (int4*)(dst_buf + ((u64)t * K + k) * p.combine_slot_bytes);
                UNROLLED_WARP_COPY(7, lane, kHiddenBf16Int4, d, s, ld_nc_v4, st_na_v4);
            }
            named_barrier(2 + group, wpg * 32);
            if (sub_warp == 0 && lane == 0) {
                if (remote_dst) {
                    const DoorbellRing ring = {a.ring_slots, a.ring_ticket, a.ring_mask};
                    doorbell_push(ring, DOORBELL_FLAG, ll_qp(p, rank, dst, le), 0,
                                  ll_area(p, dst) + ll_combine_flag(p.wire, rank * L + le), 8, 1,
                                  wire_tag(TAG_LL_COMBINE_FLAG, rank, le, dst), p.timeout_ns, err, rank,
                                  WAIT_DOORBELL_SLOT);
                } else {
                    red_add_release_flag(args[dst].combine_recv_flag + rank * L + le, 1);
                }
            }
        }
#if LL_TIMES
        if (sub_warp == 0 && lane == 0 && group < groups) stamps[1 + group] = globaltimer_ns();
#endif
    }

    if (p.phases & LL_PHASE_RECV) {
        // Bit per local rank whose flags this block has seen; every thread keeps the same copy.
        unsigned verified = 0;
        const int total = p.num_local_ranks * p.max_tokens;
        for (int it = blockIdx.x; it < total; it += G) {
            const int lr = it % p.num_local_ranks, t = it / p.num_local_ranks;
            const int rank = p.rank_base + lr;
            const LlRankArgs& a = args[rank];
#if LL_COMBINE_PREFETCH
            // The first slot load below waits on `topk_idx[t * K]` (`if (e < 0) continue`),
            // a line nothing has touched since the flush: fetching the next item's line into
            // L2 now, a token ahead, measures what that dependent HBM load costs per token.
            if (tid == 0 && it + G < total) {
                const int next_t = (it + G) / p.num_local_ranks;
                const LlRankArgs& na = args[p.rank_base + (it + G) % p.num_local_ranks];
                if (next_t < na.num_tokens)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(na.topk_idx + next_t * K));
            }
#endif
            if (t >= a.num_tokens) continue;
            if (!((verified >> lr) & 1)) {
                for (int e = tid; e < E; e += LL_THREADS) {
                    const u64 t0 = globaltimer_ns();
                    if (ll_remote(p, rank, e / L)) {
                        const u64* fp = (const u64*)(a.wire_recv_area + ll_combine_flag(p.wire, e));
                        u64 v;
                        while ((v = ld_acquire_sys_u64(fp)) < (u64)p.call + 1) {
                            if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                                record_timeout(err, WAIT_LL_COMBINE_FLAG, rank, -1, e / L, e, p.call + 1, (int)v);
                                break;
                            }
                        }
                        continue;
                    }
                    while (ld_acquire_flag(a.combine_recv_flag + e) == 0) {
                        if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                            record_timeout(err, WAIT_LL_COMBINE_FLAG, rank, -1, e / L, e, 1, 0);
                            break;
                        }
                    }
                }
                __syncthreads();
#if LL_TIMES
                if (tid == 0 && verified == 0) stamps[2 + LL_MAX_GROUPS] = globaltimer_ns();
#endif
                verified |= 1u << lr;
            }
            const int4* recv = (const int4*)(a.combine_recv_buf + (u64)t * K * p.combine_slot_bytes);
            if (p.ranks_per_node == 0)
                ll_combine_reduce<true>(p, a, rank, t, recv, tid);
            else
                ll_combine_reduce<false>(p, a, rank, t, recv, tid);
            if (p.use_discard) {
                __syncthreads();
                if (warp < K && a.topk_idx[t * K + warp] >= 0 && !ll_remote(p, rank, a.topk_idx[t * K + warp] / L))
                    warp_discard(recv + (u64)warp * slot_int4, (int)p.combine_slot_bytes, lane);
            }
        }
#if LL_TIMES
        if (tid == 0) stamps[1 + LL_MAX_GROUPS] = globaltimer_ns();
#endif
    }
}
