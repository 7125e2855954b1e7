// Normal intranode dispatch with the rings in the receiving block's shared memory (sm_90+,
// every rank of the job on this GPU). The same protocol and outputs as `intranode_dispatch`
// (DeepEP V1): per (channel, source) a ring of `sm_slots` token slots in the receiver's memory,
// the sender pushes each token into the ring of every rank it goes to, the receiver drains the
// ring in order into its output and hands the slots back with a head counter. What differs is
// where the ring lives and how bytes move (results/h200/README.md, "Rings in shared memory"):
//
// * one cluster of NUM_RANKS blocks per channel, block r = rank r (the channel's sender and
//   receiver of that rank in one block): rings are in the receiver block's shared memory, so the
//   only L2/HBM traffic is the input read and the output write;
// * the sender's warp for destination d stages the token's metadata in its own shared memory
//   and one lane issues three bulk copies into the slot of the destination block: the row and
//   its scales from global memory (TMA), the metadata from the staging area; all three count
//   their bytes on the slot's mbarrier, which is the ring's tail;
// * the receiver's warp for source s waits on the slot's mbarrier (acquire), copies the metadata
//   out, issues TMA bulk stores of row and scales to its output and, once the stores have read
//   the slot, re-arms its mbarrier and returns it (head, a release store into the sender block).
//
// The per-channel counts and the output offsets come from the source ranks' channel prefix
// matrices, which the notify kernel wrote before this launch (all ranks share the GPU, so the
// receiver reads them directly instead of waiting for the sender to publish start/end).
//
// Compile-time parameters (NVRTC -D): NUM_RANKS (≤ 8: one portable cluster).
#include "common.cuh"
#include "cluster.cuh"
#include "normal.cuh"

#ifndef NUM_RANKS
#error "NUM_RANKS must be defined"
#endif
static_assert(NUM_RANKS <= 8, "one portable cluster of NUM_RANKS blocks per channel");

constexpr int kClusterThreads = 2 * NUM_RANKS * 32;  // a sender and a receiver warp per peer

// Shared memory per (source, slot): the row, its scales, and the metadata (top-k global
// experts, top-k weights, source token index in a 16-byte word), each in its own array
// [source][slot] so that consecutive slots of a source hold consecutive rows and scales (their
// output rows are consecutive too: one bulk store can take several); every part is a 16-byte
// multiple for the bulk copies.
extern "C" __global__ void __cluster_dims__(NUM_RANKS, 1, 1) __launch_bounds__(kClusterThreads, 1)
    intranode_dispatch_cluster(const NormalRankArgs* args, NormalParams p, ErrorRecord* err,
                               int sm_slots, int slot_bytes, u64* warp_ns) {
    extern __shared__ __align__(128) u8 ring_smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int me = (int)cluster_ctarank();
    const int channel = blockIdx.x / NUM_RANKS;
    const int rank = p.rank_base + me;
    const int C = p.num_channels, K = p.num_topk, S = p.num_scales, R = sm_slots;
    const int L = p.num_experts / NUM_RANKS;
    const u32 row_bytes = (u32)p.hidden_int4 * 16u, scale_bytes = (u32)S * 4u;
    const u32 meta_bytes = 8u * (u32)K + 16u;
    const u32 tx_bytes = (u32)slot_bytes;  // row + scales + metadata
    const NormalRankArgs& a = args[rank];

    // Layout: rows [source][R], scales [source][R], metadata [source][R], then the sender's
    // token-index staging [destination][R] of 16 bytes, then mbarriers u64 [source][R], then
    // heads int [destination]. The staging words are bulk-copy sources, which must be 16-byte
    // aligned: right after the rings (16-byte multiples) they are for any rank count (after
    // the 4-byte heads they would not be for 2 or 6 ranks).
    const u32 nslots = (u32)(NUM_RANKS * R);
    const u32 rows = smem_addr(ring_smem);
    const u32 scales = rows + nslots * row_bytes;
    const u32 metas = scales + nslots * scale_bytes;
    const u32 stage = metas + nslots * meta_bytes;
    const u32 bars = stage + nslots * 16u;
    int* heads = (int*)(ring_smem + (u64)nslots * ((u64)slot_bytes + 16u + 8u));
    for (int i = threadIdx.x; i < NUM_RANKS; i += blockDim.x) heads[i] = 0;
    // One arrival completes a slot's phase: the receiver's re-arm, which announces the bytes the
    // bulk copies will bring.
    for (int i = threadIdx.x; i < NUM_RANKS * R; i += blockDim.x) mbar_init(bars + 8u * i, 1);
    mbar_init_fence();
    cluster_sync_all();
    const u64 t0 = globaltimer_ns();
    // Diagnostics (EPTWIN_CLUSTER_TIMES=1): when each block started and each warp finished.
    u64* times = warp_ns != nullptr ? warp_ns + (u64)blockIdx.x * (1 + kClusterThreads / 32) : nullptr;
    if (times != nullptr && threadIdx.x == 0) times[0] = t0;

    int ts, te;
    channel_task_range(a.num_tokens, C, channel, ts, te);
    if (warp < NUM_RANKS) {
        // Sender for destination d: this rank's tokens of the channel, in order.
        const int d = warp;
        const u32 first = (u32)(me * R);  // this source's first slot in every array of block d
        const u32 d_rows = map_to_rank(rows + first * row_bytes, d);
        const u32 d_scales = map_to_rank(scales + first * scale_bytes, d);
        const u32 d_metas = map_to_rank(metas + first * meta_bytes, d);
        const u32 d_bars = map_to_rank(bars + 8u * first, d);
        const u32 my_head = map_to_rank(smem_addr(heads + d), me);
        int sent = 0;
        bool ok = true;
        for (int w0 = ts; w0 < te && ok; w0 += 32) {
            const int t_lane = w0 + lane;
            const bool in = t_lane < te && a.is_token_in_rank[(u64)t_lane * NUM_RANKS + d] != 0;
            const unsigned mask = __ballot_sync(0xffffffffu, in);
            if (t_lane < te)
                a.send_head[(u64)t_lane * NUM_RANKS + d] =
                    in ? sent + __popc(mask & ((1u << lane) - 1u)) : -1;
            for (unsigned m = mask; m != 0 && ok; m &= m - 1) {
                const int t = w0 + __ffs(m) - 1;
                const int j = sent++;
                const u32 slot = (u32)(j % R);
                if (j >= R) {
                    int v = 0;
                    if (lane == 0) {
                        while ((v = ld_acquire_cluster(my_head)) < j - R + 1) {
                            if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                                record_timeout(err, WAIT_DISPATCH_RING_SPACE, rank, channel, d, -1,
                                               j - R + 1, v);
                                v = -1;
                                break;
                            }
                        }
                    }
                    if (__shfl_sync(0xffffffffu, v, 0) < 0) {
                        ok = false;
                        break;
                    }
                    // Lane 0's acquire of the head orders every lane's stores into the slot.
                    __syncwarp();
                }
                // The metadata travels by bulk copies too: the token's top-k experts and weights
                // straight from global memory (the receiver keeps its own experts), its index
                // from a staging word (free since head > j - R: the copy that last read it has
                // landed). No global load sits on the sender's per-token path.
                const u32 st_addr = stage + ((u32)d * (u32)R + slot) * 16u;
                if (lane == 0) {
                    st_shared_u32(st_addr, (u32)t);
                    fence_proxy_async_shared();
                    const u32 bar = d_bars + 8u * slot;
                    const u32 meta = d_metas + slot * meta_bytes;
                    tma_load_to_cluster(d_rows + slot * row_bytes, a.x + (u64)t * p.hidden_int4,
                                        row_bytes, bar);
                    if (scale_bytes > 0)
                        tma_load_to_cluster(d_scales + slot * scale_bytes, a.x_scales + (u64)t * S,
                                            scale_bytes, bar);
                    tma_load_to_cluster(meta, a.topk_idx + (u64)t * K, 4u * K, bar);
                    tma_load_to_cluster(meta + 4u * K, a.topk_weights + (u64)t * K, 4u * K, bar);
                    bulk_copy_smem_to_cluster(meta + 8u * K, st_addr, 16u, bar);
                }
            }
        }
    } else {
        // Receiver for source s: its tokens of this channel, into rows after the lower sources'.
        const int s = warp - NUM_RANKS;
        const int* cpm = args[p.rank_base + s].channel_prefix_matrix + me * C;
        const int start = channel > 0 ? cpm[channel - 1] : 0;
        const int n = cpm[channel] - start;
        const int base_row = start + (s > 0 ? a.rank_prefix[s - 1] : 0);
        if (lane == 0) a.recv_channel_offset[s * C + channel] = start;
        const u32 first = (u32)(s * R);
        const u32 s_rows = rows + first * row_bytes, s_scales = scales + first * scale_bytes;
        const u32 s_metas = metas + first * meta_bytes, s_bars = bars + 8u * first;
        const u32 s_head = map_to_rank(smem_addr(heads + me), s);
        if (lane == 0)
            for (int k = 0; k < R && k < n; ++k) mbar_arrive_expect_tx(s_bars + 8u * k, tx_bytes);
        for (int j = 0; j < n;) {
            const u32 slot = (u32)(j % R);
            int got = 0;
            if (lane == 0) {
                got = 1;
                while (!mbar_try_wait_cluster(s_bars + 8u * slot, (u32)(j / R) & 1u)) {
                    if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                        record_timeout(err, WAIT_DISPATCH_TAIL, rank, channel, s, -1, j + 1, j);
                        got = 0;
                        break;
                    }
                }
                // Slots after it up to the ring's end that have landed too go in the same
                // stores (their rows are consecutive in shared memory and in the output): when
                // the receiver falls behind, it catches up with fewer, larger bulk stores.
                if (got)
                    while (j + got < n && (int)slot + got < R &&
                           mbar_try_wait_cluster(s_bars + 8u * (slot + (u32)got),
                                                 (u32)((j + got) / R) & 1u))
                        ++got;
            }
            got = __shfl_sync(0xffffffffu, got, 0);
            if (got == 0) break;
            // Lane 0's acquire orders every lane's reads of the slots' metadata.
            __syncwarp();
            const int row = base_row + j;
            if (lane == 0) {
                // The bulk stores first: the metadata's small global stores overlap them.
                fence_proxy_async_shared();
                tma_store_nocommit(a.recv_x + (u64)row * p.hidden_int4, s_rows + slot * row_bytes,
                                   (u32)got * row_bytes);
                if (scale_bytes > 0)
                    tma_store_nocommit(a.recv_x_scales + (u64)row * S, s_scales + slot * scale_bytes,
                                       (u32)got * scale_bytes);
                tma_commit();
            }
            for (int i = 0; i < got; ++i) {
                const u32 meta = s_metas + (slot + (u32)i) * meta_bytes;
                if (lane == 0) a.recv_src_idx[row + i] = (int)ld_shared_u32(meta + 8u * K);
                if (lane < K) {
                    // Global expert ids: keep this rank's, as local indices; -1 and weight 0 else.
                    const int e = (int)ld_shared_u32(meta + 4u * lane);
                    const int le = (e >= me * L && e < (me + 1) * L) ? e - me * L : -1;
                    const float w = __uint_as_float(ld_shared_u32(meta + 4u * (K + lane)));
                    a.recv_topk_idx[(u64)(row + i) * K + lane] = le;
                    a.recv_topk_weights[(u64)(row + i) * K + lane] = le >= 0 ? w : 0.0f;
                }
            }
            __syncwarp();
            if (lane == 0) {
                // The slots go back as soon as the stores have read them, without waiting for
                // the next token: the sender may refill them while it is in flight.
                tma_store_wait_read_all();
                for (int i = 0; i < got; ++i)
                    if (j + i + R < n) mbar_arrive_expect_tx(s_bars + 8u * (slot + (u32)i), tx_bytes);
                st_release_cluster(s_head, j + got);
            }
            j += got;
        }
        if (lane == 0) tma_store_wait_all();
    }
    __syncwarp();
    if (times != nullptr && lane == 0) times[1 + warp] = globaltimer_ns();
    // No block leaves while a peer may still copy into its shared memory or signal its heads.
    cluster_sync_all();
}

// Normal intranode combine, same layout (one cluster of NUM_RANKS blocks per channel, rings in
// the receiving block's shared memory). Sender warp d of block r returns, in arrival order, the
// expert outputs of the rows rank r received from rank d in this channel: one TMA bulk copy of
// the BF16 row and one of its top-k weights from global memory into slot j % R of ring r in
// block d, counted on the slot's mbarrier. The receiver warps of block r (the tokens' source)
// take the channel's tokens in order; for each, the leader lanes wait on the slot of every rank
// the token went to (`send_head` gives its index in that ring), all receiver warps sum the
// partials out of shared memory in FP32 and write the combined row, then the slots are re-armed
// and handed back (head, a release store into the sender block).
// The combine's blocks: the sender warps, then three reducer warps per peer (the reduction of
// one token at a time is on each channel's critical path).
constexpr int kCombineClusterThreads = 4 * NUM_RANKS * 32;
constexpr int kCombineReducerThreads = kCombineClusterThreads - NUM_RANKS * 32;
// Diagnostics: per block of the combine, when its first kTokenStamps tokens had every partial
// in shared memory and when their reduction was done (hw/src/intranode.rs CLUSTER_TOKEN_STAMPS).
constexpr int kTokenStamps = 32;
// And per ring leader, when its wait for each of its ring's first kRingStamps elements ended:
// the element's landing, where the leader was already waiting for it (the first always is)
// (hw/src/intranode/warp_times.rs CLUSTER_RING_STAMPS).
constexpr int kRingStamps = 4;

// One token's reduction by the combine's reducer threads (`rtid` of kCombineReducerThreads),
// between the two named barriers of the token: the partial row of every ring j with
// slot[j] >= 0 (slot index j * R + e % R, written by ring j's leader) summed in fp32 into one
// bf16 row at `out`; threads rtid < K sum the top-k weights into `out_w`. The leaders resolve the
// slot once per ring and the reducers only scale it: a `% R` per (thread, source), the argument
// reloads the asm "memory" clobbers forced and a dependent division chain per weight were most of
// the reduction's time (results/h200/probe-run/tokens3-log.txt, reduce-log.txt).
DEVICE void reduce_token(const int* slot, u32 rings, u32 wts, u32 row_bytes, int hidden_int4,
                         int K, int4* out, float* out_w, int rtid) {
    u32 src[NUM_RANKS];
    u32 mask = 0;
#pragma unroll
    for (int j = 0; j < NUM_RANKS; ++j) {
        const int k = slot[j];
        src[j] = rings + (u32)(k >= 0 ? k : 0) * row_bytes;
        mask |= (k >= 0 ? 1u : 0u) << j;
    }
    for (int i = rtid; i < hidden_int4; i += kCombineReducerThreads) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
        for (int h = 0; h < NUM_RANKS; h += 4) {
            int4 v[4];
#pragma unroll
            for (int j = 0; j < 4 && h + j < NUM_RANKS; ++j)
                if ((mask >> (h + j)) & 1u) v[j] = ld_shared_v4(src[h + j] + 16u * (u32)i);
#pragma unroll
            for (int j = 0; j < 4 && h + j < NUM_RANKS; ++j)
                if ((mask >> (h + j)) & 1u) accumulate_bf16x8(acc, v[j]);
        }
        st_na_v4(out + i, pack_bf16x8(acc));
    }
    if (rtid < K) {
        float w[NUM_RANKS];
#pragma unroll
        for (int j = 0; j < NUM_RANKS; ++j) {
            const int k = slot[j];
            w[j] = k >= 0 ? __uint_as_float(ld_shared_u32(wts + ((u32)k * (u32)K + (u32)rtid) * 4u)) : 0.0f;
        }
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < NUM_RANKS; ++j) sum += w[j];
        out_w[rtid] = sum;
    }
}

extern "C" __global__ void __cluster_dims__(NUM_RANKS, 1, 1) __launch_bounds__(kCombineClusterThreads, 1)
    intranode_combine_cluster(const NormalRankArgs* args, NormalParams p, ErrorRecord* err,
                              int sm_slots, int slot_bytes, u64* warp_ns) {
    extern __shared__ __align__(128) u8 ring_smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int me = (int)cluster_ctarank();
    const int channel = blockIdx.x / NUM_RANKS;
    const int rank = p.rank_base + me;
    const int C = p.num_channels, K = p.num_topk, R = sm_slots;
    const int hidden_int4 = p.combine_hidden_int4;
    const u32 row_bytes = (u32)hidden_int4 * 16u;
    const u32 tx_bytes = row_bytes + 4u * K;
    const NormalRankArgs& a = args[rank];

    // Layout: rows [source][R], top-k weights [source][R] (every row 128-byte aligned), then
    // mbarriers u64 [source][R], then heads int [destination].
    const u32 rings = smem_addr(ring_smem);
    const u32 wts = rings + (u32)(NUM_RANKS * R) * row_bytes;
    const u32 bars = rings + (u32)(NUM_RANKS * R) * (u32)slot_bytes;
    int* heads = (int*)(ring_smem + (u64)NUM_RANKS * R * slot_bytes + (u64)NUM_RANKS * R * 8);
    __shared__ int expected[NUM_RANKS];
    __shared__ __align__(16) int token_slot[NUM_RANKS];  // expected[d] as a slot index, or -1
    __shared__ int abort_flag;
    if (threadIdx.x == 0) abort_flag = 0;
    for (int i = threadIdx.x; i < NUM_RANKS; i += blockDim.x) heads[i] = 0;
    for (int i = threadIdx.x; i < NUM_RANKS * R; i += blockDim.x) mbar_init(bars + 8u * i, 1);
    mbar_init_fence();
    cluster_sync_all();
    const u64 t0 = globaltimer_ns();
    u64* times =
        warp_ns != nullptr ? warp_ns + (u64)blockIdx.x * (1 + kCombineClusterThreads / 32 + 2 * kTokenStamps +
                                                 NUM_RANKS * kRingStamps)
                           : nullptr;
    if (times != nullptr && threadIdx.x == 0) times[0] = t0;
    u64* token_ns = times != nullptr ? times + 1 + kCombineClusterThreads / 32 : nullptr;
    u64* ring_ns = token_ns != nullptr ? token_ns + 2 * kTokenStamps : nullptr;

    if (warp < NUM_RANKS) {
        const int d = warp;
        const int rank_offset = d > 0 ? a.rank_prefix[d - 1] : 0;
        const int num_rank_tokens = a.rank_prefix[d] - rank_offset;
        const int channel_offset = a.recv_channel_offset[d * C + channel];
        const int n = (channel == C - 1 ? num_rank_tokens : a.recv_channel_offset[d * C + channel + 1]) -
                      channel_offset;
        const int first = rank_offset + channel_offset;
        const u32 d_rows = map_to_rank(rings + (u32)(me * R) * row_bytes, d);
        const u32 d_wts = map_to_rank(wts + (u32)(me * R) * 4u * K, d);
        const u32 d_bars = map_to_rank(bars + 8u * (u32)(me * R), d);
        const u32 my_head = map_to_rank(smem_addr(heads + d), me);
        if (lane == 0) {
            for (int j = 0; j < n; ++j) {
                if (j >= R) {
                    int v;
                    bool ok = true;
                    while ((v = ld_acquire_cluster(my_head)) < j - R + 1) {
                        if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                            record_timeout(err, WAIT_COMBINE_RING_SPACE, rank, channel, d, -1,
                                           j - R + 1, v);
                            ok = false;
                            break;
                        }
                    }
                    if (!ok) break;
                }
                const int slot = j % R;

                const u32 bar = d_bars + 8u * (u32)slot;
                const u64 row = (u64)(first + j);
                tma_load_to_cluster(d_rows + (u32)slot * row_bytes, a.combine_x + row * hidden_int4,
                                    row_bytes, bar);
                tma_load_to_cluster(d_wts + (u32)slot * 4u * K, a.combine_topk_weights + row * K,
                                    4u * K, bar);
            }
        }
    } else {
        // Receivers: warps NUM_RANKS.. reduce together; lane 0 of receiver warp d < NUM_RANKS
        // leads ring d
        // (one waiting lane per warp: lanes of one warp spinning on different mbarriers would
        // serialise their potentially blocking try_waits).
        const int rtid = threadIdx.x - NUM_RANKS * 32, rthreads = kCombineReducerThreads;
        const bool leader = lane == 0 && warp < 2 * NUM_RANKS;
        int ts, te;
        channel_task_range(a.num_tokens, C, channel, ts, te);
        const int d = warp - NUM_RANKS;  // the leader's ring
        int n_d = 0;
        u32 d_bars = 0, d_head = 0;
        if (leader) {
            const int* cpm = a.channel_prefix_matrix + d * C;
            n_d = cpm[channel] - (channel > 0 ? cpm[channel - 1] : 0);
            d_bars = bars + 8u * (u32)(d * R);
            d_head = map_to_rank(smem_addr(heads + me), d);
            for (int k = 0; k < R && k < n_d; ++k) mbar_arrive_expect_tx(d_bars + 8u * k, tx_bytes);
        }
        // The leader loads the next token's send_head entry while it waits for this one's
        // partial: the load (HBM: the dispatch wrote it before the timing flushed L2) leaves the
        // critical path.
        int e_next = (leader && ts < te) ? a.send_head[(u64)ts * NUM_RANKS + d] : -1;
        for (int t = ts; t < te; ++t) {
            if (leader) {
                const int e = e_next;
                if (t + 1 < te) e_next = a.send_head[(u64)(t + 1) * NUM_RANKS + d];
                if (e >= 0) {
                    while (!mbar_try_wait_cluster(d_bars + 8u * (u32)(e % R), (u32)(e / R) & 1u)) {
                        if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                            record_timeout(err, WAIT_COMBINE_TAIL, rank, channel, d, -1, e + 1, e);
                            abort_flag = 1;
                            break;
                        }
                    }
                    if (ring_ns != nullptr && e < kRingStamps) ring_ns[d * kRingStamps + e] = globaltimer_ns();
                }
                expected[d] = e;
                token_slot[d] = e >= 0 ? d * R + e % R : -1;
            }
            named_barrier(1, rthreads);
            if (token_ns != nullptr && rtid == 0 && t - ts < kTokenStamps) token_ns[2 * (t - ts)] = globaltimer_ns();
            if (abort_flag) break;
            reduce_token(token_slot, rings, wts, row_bytes, hidden_int4, K,
                         a.combined_x + (u64)t * hidden_int4, a.combined_topk_weights + (u64)t * K,
                         rtid);
            // Every receiver thread is done with this token's slots.
            named_barrier(1, rthreads);
            if (token_ns != nullptr && rtid == 0 && t - ts < kTokenStamps)
                token_ns[2 * (t - ts) + 1] = globaltimer_ns();
            if (leader) {
                const int e = expected[d];
                if (e >= 0) {
                    if (e + R < n_d) mbar_arrive_expect_tx(d_bars + 8u * (u32)(e % R), tx_bytes);
                    st_release_cluster(d_head, e + 1);
                }
            }
        }
    }
    __syncwarp();
    if (times != nullptr && lane == 0) times[1 + warp] = globaltimer_ns();
    cluster_sync_all();
}

// Probe of the combine's reduction alone (hw/src/cluster_probe.rs `run_reduce`; the simulator's
// per-token reducer cost, docs/calibration.md "h200-single"). Each block is shaped like a
// combine block (kCombineClusterThreads threads, the same reducer threads and named barrier)
// and holds, like one, NUM_RANKS rings of R slots of partial rows and top-k weights in its
// shared memory, already landed: ring j's rows are bf16 (j + 1) everywhere and its weights
// (j + 1). For `tokens` tokens the leaders name the first `sources` rings (slot t % R), and the
// reducers reduce them with `reduce_token` between the combine's two named barriers into rows
// blockIdx.x * tokens + t of `out` / `out_w`. No sender and no waiting: the time per token is
// the reduction's own, with every block of the grid doing the same at once. block_ns[b] = time
// from the first token's barrier to the last one's.
extern "C" __global__ void __launch_bounds__(kCombineClusterThreads, 1)
    probe_cluster_reduce(int4* out, float* out_w, int hidden_int4, int K, int R, int sources,
                         int tokens, u64* block_ns) {
    extern __shared__ __align__(128) u8 ring_smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 row_bytes = (u32)hidden_int4 * 16u;
    const u32 rings = smem_addr(ring_smem);
    const u32 wts = rings + (u32)(NUM_RANKS * R) * row_bytes;
    __shared__ __align__(16) int token_slot[NUM_RANKS];
    for (int i = threadIdx.x; i < NUM_RANKS * R * hidden_int4; i += blockDim.x) {
        const int j = i / (R * hidden_int4);
        const u32 b = __float_as_uint((float)(j + 1)) >> 16;  // bf16 of j + 1 (exact)
        const int v = (int)(b | (b << 16));
        st_shared_v4(rings + 16u * (u32)i, make_int4(v, v, v, v));
    }
    for (int i = threadIdx.x; i < NUM_RANKS * R * K; i += blockDim.x)
        st_shared_u32(wts + 4u * (u32)i, __float_as_uint((float)(i / (R * K) + 1)));
    __syncthreads();
    if (warp < NUM_RANKS) return;  // the combine's sender warps
    const int rtid = threadIdx.x - NUM_RANKS * 32;
    const bool leader = lane == 0 && warp < 2 * NUM_RANKS;
    const int d = warp - NUM_RANKS;
    u64 start = 0;
    for (int t = 0; t < tokens; ++t) {
        if (leader) token_slot[d] = d < sources ? d * R + t % R : -1;
        named_barrier(1, kCombineReducerThreads);
        if (t == 0 && rtid == 0) start = globaltimer_ns();
        const u64 row = (u64)blockIdx.x * tokens + t;
        reduce_token(token_slot, rings, wts, row_bytes, hidden_int4, K, out + row * hidden_int4,
                     out_w + row * K, rtid);
        named_barrier(1, kCombineReducerThreads);
    }
    if (rtid == 0) block_ns[blockIdx.x] = globaltimer_ns() - start;
}

// The launch alone (hw/src/cluster_probe.rs `run_launch`): empty kernels with the cluster
// kernels' cluster shape and block size, and one without clusters, launched with the kernels'
// grids and dynamic shared memory, to time what a launch costs as the ops' CUDA events see it
// (after the same L2 flush).
extern "C" __global__ void __launch_bounds__(kCombineClusterThreads, 1) probe_launch_plain() {}
extern "C" __global__ void __cluster_dims__(NUM_RANKS, 1, 1) __launch_bounds__(kClusterThreads, 1)
    probe_launch_dispatch_cluster() {}
extern "C" __global__ void __cluster_dims__(NUM_RANKS, 1, 1) __launch_bounds__(kCombineClusterThreads, 1)
    probe_launch_combine_cluster() {}
// The combine kernel's frame without its work: the mbarriers of `R` slots per source initialised
// and fenced, the cluster barrier before the first token, the one at exit.
extern "C" __global__ void __cluster_dims__(NUM_RANKS, 1, 1) __launch_bounds__(kCombineClusterThreads, 1)
    probe_launch_combine_cluster_frame(int R, int slot_bytes) {
    extern __shared__ __align__(128) u8 ring_smem[];
    const u32 bars = smem_addr(ring_smem) + (u32)(NUM_RANKS * R) * (u32)slot_bytes;
    for (int i = threadIdx.x; i < NUM_RANKS * R; i += blockDim.x) mbar_init(bars + 8u * i, 1);
    mbar_init_fence();
    cluster_sync_all();
    cluster_sync_all();
}
