// Normal internode dispatch and combine over the CPU-proxy wire, after DeepEP V1 `internode.cu`
// (docs/design.md, DeepEP §9-§10; the protocol: docs/internode-wire.md, hw/src/internode/).
//
// Rails and forwarding as DeepEP: a token goes over the wire once per destination node, to the
// rank with the same local index (the rail peer), with the mask of that node's local ranks it
// is for; a forwarder there copies it over "NVLink" (direct stores into the destination rank's
// NVL buffer) to every rank of the mask; receivers drain into `recv_x`. The own node is reached
// the same way, through the rank's own receive area, without the wire. Combine goes the other
// way: NVLink first, to the rank with the token source's local index, which reduces the
// partials of its node and sends one BF16 row per (token, source node) back over the wire; the
// source reduces across nodes.
//
// Wire bytes and order are the protocol's (hw/src/internode/mod.rs): per (source rank, rail
// peer, channel) a ring of `rdma_recv` slots in the peer's receive area; the sender stages up
// to `rdma_send` tokens in its send area, then publishes `Write` records (one per contiguous
// run of slots) and a `Flag` on the tail, all on QP `channel`, after a `Flag` announcing the
// call's count; the forwarder returns credits on QP `channel + C` every `rdma_send` tokens and
// at the end. Counters only grow (calls continue where the last left off): each rank keeps its
// cumulative positions in `state` (device memory).
//
// Where the proxy makes DeepEP's IBGDA details moot, the roles are simpler (same structure,
// same bytes): a channel is two blocks, the even one with one RDMA sender warp per destination
// node (staging, credits and doorbells in one warp: the proxy posts the work requests) and one
// NVL receiver warp per forwarding rank; the odd one with one forwarder warp per local
// destination rank and a coordinator warp (counts, minimum position, credits). In combine the
// even block has one NVL sender warp per forwarding rank and a group of 8 warps receiving
// from the wire and reducing across nodes, token by token; the odd block reduces its node's
// partials token by token with all its threads. DeepEP's notify kernel (the count exchange
// before dispatch) is replaced by its cached-layout path: where each source's rows land in
// `recv_x` comes from the host (`recv_rank_prefix`, `recv_channel_offset`: what a previous
// dispatch's handle carries); the counts the kernel observes are its own.
//
// Every kernel of a launch is resident at once (the host checks occupancy): warps wait on each
// other across blocks and ranks. Every wait is bounded by %globaltimer.
//
// Compile-time parameters (NVRTC -D): RANKS_PER_NODE (≤ 8), NUM_THREADS (512), FLAG_SCOPE_SYS.
#include "common.cuh"
#include "normal.cuh"
#include "wire.cuh"

#ifndef RANKS_PER_NODE
#error "RANKS_PER_NODE must be defined"
#endif
#ifndef NUM_THREADS
#define NUM_THREADS 512
#endif
#define MAX_NODES 16

constexpr int R = RANKS_PER_NODE;
constexpr int kWarps = NUM_THREADS / 32;
constexpr int kSenderWarps = kWarps / 2;
constexpr int kReceiverGroupThreads = NUM_THREADS / 2;
static_assert(NUM_THREADS == 512, "the roles below are laid out for 16 warps");
static_assert(R >= 1 && R <= 8, "one NVL warp per local rank, at most 8 (DeepEP's NVL peers)");
static_assert(R < kWarps, "forwarder warps plus the coordinator warp");

#define FULL_MASK 0xffffffffu

// Per-rank counters kept across calls (u64, [kind][node][channel]).
#define ST_D_SENT 0        // dispatch tokens sent towards each node (ring sequence)
#define ST_D_CONSUMED 1    // dispatch tokens forwarded from each node (= credits returned)
#define ST_D_COUNT_SEEN 2  // the DispatchCount value last seen from each node
#define ST_C_SENT 3        // combine rows sent towards each source node
#define ST_C_CONSUMED 4    // combine rows received from each node (= credits returned)
#define ST_FWD_COUNT 5     // this call's dispatch tokens from each node (read by combine)

// NVL buffer counters (int, [kind][channel][peer local rank]), cumulative.
#define NVL_D_HEAD 0
#define NVL_D_TAIL 1
#define NVL_C_HEAD 2
#define NVL_C_TAIL 3

// Per-rank pointers (host: hw/src/intranode/args.rs `InternodeRankArgs`, same order).
struct InternodeRankArgs {
    const int4* x;                   // [num_tokens][hidden_int4] dispatch payload (fp8 or bf16)
    const float* x_scales;           // [num_tokens][num_scales]
    const int* topk_idx;             // [num_tokens][num_topk] global experts, -1 = masked
    const float* topk_weights;       // [num_tokens][num_topk]
    const u8* is_token_in_rank;      // [num_tokens][num_ranks] (layout kernel)
    const int* recv_rank_prefix;     // [num_ranks] inclusive prefix of rows per source rank
    const int* recv_channel_offset;  // [num_ranks][num_channels] first row of each channel
    int* num_recv_tokens;            // [1], counted here
    int* num_recv_tokens_per_expert; // [num_local_experts], counted here
    int4* recv_x;                    // [num_recv][hidden_int4]
    float* recv_x_scales;            // [num_recv][num_scales]
    int* recv_src_idx;               // [num_recv]
    int* recv_topk_idx;              // [num_recv][num_topk] local expert or -1
    float* recv_topk_weights;        // [num_recv][num_topk]
    const int4* combine_x;           // [num_recv][combine_hidden_int4] bf16 expert outputs
    const float* combine_topk_weights;  // [num_recv][num_topk]
    int4* combined_x;                // [num_tokens][combine_hidden_int4]
    float* combined_topk_weights;    // [num_tokens][num_topk]
    u8* nvl;                         // this rank's NVL buffer (rings other ranks store into)
    u64* fwd_log;                    // [num_nodes][num_channels][fwd_log_stride]: token | mask << 32
    u64* state;                      // [6][num_nodes][num_channels] (ST_*)
    u8* recv_area;                   // this rank's area of its node's receive region (mapped)
    u8* send_area;                   // this rank's area of its node's send region (mapped)
    u8* ring_slots;                  // the rank's doorbell ring (mapped)
    u64* ring_ticket;                // its ticket counter (device)
    u64 ring_mask;
    u64 recv_area_offset;            // offset of this area (and of every rail peer's) in a region
    u64 send_area_offset;
    int num_tokens;
    int reserved;
};

// Host: hw/src/intranode/args.rs `InternodeParams`, same field order.
struct InternodeParams {
    NormalLayout wire;
    u64 timeout_ns;
    u64 nvl_slot_bytes;              // NVL slot: payload | meta {token, source node} | top-k | weights | scales
    u64 nvl_meta_offset;
    u64 nvl_topk_idx_offset;
    u64 nvl_topk_weights_offset;
    u64 nvl_scales_offset;
    u64 nvl_counters_offset;         // int [4][num_channels][R]
    u64 nvl_dispatch_slots_offset;   // [num_channels][R][nvl_recv] (ring from forwarder l)
    u64 nvl_combine_slots_offset;    // [num_channels][R][nvl_recv] (ring from sender l)
    u64 fwd_log_stride;
    int num_ranks;
    int num_nodes;
    int num_channels;
    int num_experts;
    int num_topk;
    int hidden_int4;
    int combine_hidden_int4;
    int num_scales;
    int nvl_recv;
    int rank_base;
    int num_local_ranks;
    int qps_per_peer;
};

DEVICE u64 st_index(const InternodeParams& p, int kind, int node, int channel) {
    return ((u64)kind * p.num_nodes + node) * p.num_channels + channel;
}

DEVICE int* nvl_counter(u8* nvl, const InternodeParams& p, int kind, int channel, int peer) {
    return (int*)(nvl + p.nvl_counters_offset) + ((u64)kind * p.num_channels + channel) * R + peer;
}

DEVICE u8* nvl_slot(u8* nvl, const InternodeParams& p, bool combine, int channel, int peer, int seq) {
    const u64 base = combine ? p.nvl_combine_slots_offset : p.nvl_dispatch_slots_offset;
    const u64 slot = ((u64)channel * R + peer) * p.nvl_recv + (u64)((unsigned)seq % (unsigned)p.nvl_recv);
    return nvl + base + slot * p.nvl_slot_bytes;
}

// Local-rank bits of `node` that token `t` goes to (DeepEP's SourceMeta mask).
DEVICE u32 node_mask(const InternodeRankArgs& a, int num_ranks, int t, int node) {
    const u8* row = a.is_token_in_rank + (u64)t * num_ranks + node * R;
    u32 m = 0;
#pragma unroll
    for (int l = 0; l < R; ++l) m |= (row[l] != 0 ? 1u : 0u) << l;
    return m;
}

DEVICE int rows_before(const InternodeRankArgs& a, int src) {
    return src > 0 ? a.recv_rank_prefix[src - 1] : 0;
}

// Rows this rank receives from `src` in `channel` (the cached layout).
DEVICE int layout_count(const InternodeRankArgs& a, const InternodeParams& p, int src, int channel) {
    const int* off = a.recv_channel_offset + src * p.num_channels;
    const int total = a.recv_rank_prefix[src] - rows_before(a, src);
    const int end = channel + 1 < p.num_channels ? off[channel + 1] : total;
    return end - off[channel];
}

// One token's dispatch slot (payload | meta | scales | top-k indices | weights), written by one
// warp into a slot of host memory (staging, or the own node's ring).
DEVICE void write_dispatch_slot(const InternodeRankArgs& a, const InternodeParams& p, u8* slot,
                                int t, u32 mask, int lane) {
    const NormalLayout& w = p.wire;
    const int K = p.num_topk, S = p.num_scales;
    const int4* src = a.x + (u64)t * p.hidden_int4;
    int4* dst = (int4*)slot;
    for (int i = lane; i < p.hidden_int4; i += 32) dst[i] = ld_nc_v4(src + i);
    if (lane == 0) *(u64*)(slot + w.dispatch_meta_offset) = (u64)(u32)t | ((u64)mask << 32);
    float* sc = (float*)(slot + w.dispatch_scales_offset);
    for (int i = lane; i < S; i += 32) sc[i] = a.x_scales[(u64)t * S + i];
    if (lane < K) {
        ((int*)(slot + w.dispatch_topk_idx_offset))[lane] = a.topk_idx[(u64)t * K + lane];
        ((float*)(slot + w.dispatch_topk_weights_offset))[lane] = a.topk_weights[(u64)t * K + lane];
    }
}

// The RDMA sender of one (channel, destination node): count, then batches of up to
// `rdma_send` tokens within the peer's credits.
DEVICE void dispatch_send(const InternodeRankArgs& a, const InternodeParams& p, ErrorRecord* err,
                          const DoorbellRing& ring, int rank, int node, int lr, int channel,
                          int dst_node, int lane) {
    const NormalLayout& w = p.wire;
    int ts, te;
    channel_task_range(a.num_tokens, p.num_channels, channel, ts, te);
    int count = 0;
    for (int t0 = ts; t0 < te; t0 += 32) {
        const int t = t0 + lane;
        const bool in = t < te && node_mask(a, p.num_ranks, t, dst_node) != 0;
        count += __popc(__ballot_sync(FULL_MASK, in));
    }
    const bool own = dst_node == node;
    const u32 qp = qp_index(node, dst_node, R, 1, lr, 0, p.qps_per_peer, channel);
    const int peer = dst_node * R + lr;
    u64* sent_at = a.state + st_index(p, ST_D_SENT, dst_node, channel);
    u64 sent = *sent_at;
    int ok = 1;
    if (lane == 0) {
        const u64 counter = nl_counter(w, COUNTER_DISPATCH_COUNT, node, channel);
        if (own) {
            u64* c = (u64*)(a.recv_area + counter);
            st_release_sys_u64(c, ld_relaxed_sys_u64(c) + count + 1);
        } else {
            ok = doorbell_push(ring, DOORBELL_FLAG, qp, 0, a.recv_area_offset + counter, 8,
                               (u64)count + 1, wire_tag(TAG_DISPATCH_COUNT, rank, channel, count),
                               p.timeout_ns, err, rank, WAIT_DOORBELL_SLOT);
        }
    }
    if (!__shfl_sync(FULL_MASK, ok, 0)) return;
    const u64* head_ptr = (const u64*)(a.recv_area + nl_counter(w, COUNTER_DISPATCH_HEAD, dst_node, channel));
    int done = 0, cursor = ts;
    while (done < count) {
        const int batch = min((int)w.dispatch_send_tokens, count - done);
        if (lane == 0) {
            const u64 t0 = globaltimer_ns();
            u64 head;
            while (sent + batch - (head = ld_acquire_sys_u64(head_ptr)) > w.dispatch_ring_slots) {
                if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                    record_timeout(err, WAIT_RDMA_CREDIT, rank, channel, peer, -1,
                                   (int)(sent + batch - w.dispatch_ring_slots), (int)head);
                    ok = 0;
                    break;
                }
            }
        }
        if (!__shfl_sync(FULL_MASK, ok, 0)) return;
        int staged = 0;
        while (staged < batch && cursor < te) {
            const int t = cursor + lane;
            const u32 m = t < te ? node_mask(a, p.num_ranks, t, dst_node) : 0u;
            u32 bits = __ballot_sync(FULL_MASK, m != 0);
            int last = -1;
            while (bits != 0 && staged < batch) {
                const int i = __ffs(bits) - 1;
                bits &= bits - 1;
                const u32 mm = __shfl_sync(FULL_MASK, m, i);
                const u64 seq = sent + staged;
                u8* slot = own ? a.recv_area + nl_dispatch_slot(w, node, channel, seq)
                               : a.send_area + nl_dispatch_staging(w, dst_node, channel, seq);
                write_dispatch_slot(a, p, slot, cursor + i, mm, lane);
                ++staged;
                last = i;
            }
            cursor = bits == 0 ? cursor + 32 : cursor + last + 1;
        }
        // Every lane's slot stores reach the system before the records that name them.
        __threadfence_system();
        __syncwarp();
        if (lane == 0) {
            const u64 end = sent + batch;
            const u64 tail = nl_counter(w, COUNTER_DISPATCH_TAIL, node, channel);
            if (own) {
                st_release_sys_u64((u64*)(a.recv_area + tail), end);
            } else {
                u64 seq = sent;
                while (ok && seq < end) {
                    const u64 room = w.dispatch_ring_slots - seq % w.dispatch_ring_slots;
                    const u64 run = min(room, end - seq);
                    ok = doorbell_push(ring, DOORBELL_WRITE, qp,
                                       a.send_area_offset + nl_dispatch_staging(w, dst_node, channel, seq),
                                       a.recv_area_offset + nl_dispatch_slot(w, node, channel, seq),
                                       (u32)(run * w.dispatch_token_bytes), 0,
                                       wire_tag(TAG_DISPATCH_DATA, rank, channel, seq), p.timeout_ns,
                                       err, rank, WAIT_DOORBELL_SLOT);
                    seq += run;
                }
                if (ok)
                    ok = doorbell_push(ring, DOORBELL_FLAG, qp, 0, a.recv_area_offset + tail, 8,
                                       (u64)batch, wire_tag(TAG_DISPATCH_TAIL, rank, channel, end),
                                       p.timeout_ns, err, rank, WAIT_DOORBELL_SLOT);
            }
        }
        if (!__shfl_sync(FULL_MASK, ok, 0)) return;
        sent += batch;
        done += batch;
    }
    if (lane == 0) *sent_at = sent;
}

// The NVL receiver of the ring from forwarding rank `lf` of this node: every token of every
// source (node, lf) in this channel, placed at its row of the cached layout.
DEVICE void dispatch_nvl_receive(const InternodeRankArgs& a, const InternodeParams& p,
                                 ErrorRecord* err, int rank, int node, int channel, int lf,
                                 int lane, int* cursor /* [MAX_NODES], this warp's */) {
    const int K = p.num_topk, S = p.num_scales;
    int expected = 0;
    for (int n = 0; n < p.num_nodes; ++n) expected += layout_count(a, p, n * R + lf, channel);
    if (lane < p.num_nodes) cursor[lane] = 0;
    __syncwarp();
    int* head_ptr = nvl_counter(a.nvl, p, NVL_D_HEAD, channel, lf);
    const int* tail_ptr = nvl_counter(a.nvl, p, NVL_D_TAIL, channel, lf);
    int head = ld_volatile(head_ptr);
    int got = 0;
    while (got < expected) {
        int tail = head;
        if (lane == 0) {
            const u64 t0 = globaltimer_ns();
            while ((tail = ld_acquire_flag(tail_ptr)) == head) {
                if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                    record_timeout(err, WAIT_NVL_TAIL, rank, channel, node * R + lf, -1, head + 1, tail);
                    break;
                }
            }
        }
        tail = __shfl_sync(FULL_MASK, tail, 0);
        if (tail == head) return;
        for (int i = head; i < tail; ++i) {
            const u8* slot = nvl_slot(a.nvl, p, false, channel, lf, i);
            const int* meta = (const int*)(slot + p.nvl_meta_offset);
            const int t = ld_cg_s32(meta), src_node = ld_cg_s32(meta + 1);
            const int src = src_node * R + lf;
            const bool known = src_node >= 0 && src_node < p.num_nodes;
            const int k = known ? cursor[src_node] : 0;
            const int cnt = known ? layout_count(a, p, src, channel) : 0;
            __syncwarp();
            if (!known || k >= cnt) {
                if (lane == 0)
                    record_timeout(err, BAD_UNEXPECTED_TOKEN, rank, channel, src, -1, cnt, k + 1);
                continue;
            }
            const u64 row = (u64)rows_before(a, src) + a.recv_channel_offset[src * p.num_channels + channel] + k;
            UNROLLED_WARP_COPY(4, lane, p.hidden_int4, a.recv_x + row * p.hidden_int4,
                               (const int4*)slot, ld_cg_v4, st_na_v4);
            const float* ss = (const float*)(slot + p.nvl_scales_offset);
            for (int j = lane; j < S; j += 32) a.recv_x_scales[row * S + j] = ld_cg_f32(ss + j);
            if (lane < K) {
                const int le = ld_cg_s32((const int*)(slot + p.nvl_topk_idx_offset) + lane);
                a.recv_topk_idx[row * K + lane] = le;
                a.recv_topk_weights[row * K + lane] =
                    ld_cg_f32((const float*)(slot + p.nvl_topk_weights_offset) + lane);
                if (le >= 0) atomicAdd(a.num_recv_tokens_per_expert + le, 1);
            }
            if (lane == 0) {
                a.recv_src_idx[row] = t;
                atomicAdd(a.num_recv_tokens, 1);
                cursor[src_node] = k + 1;
            }
            __syncwarp();
        }
        got += tail - head;
        head = tail;
        __syncwarp();
        if (lane == 0) st_release_flag(head_ptr, head);
    }
}

extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)
    internode_dispatch(const InternodeRankArgs* args, InternodeParams p, ErrorRecord* err) {
    const int blocks_per_rank = 2 * p.num_channels;
    const int local = blockIdx.x / blocks_per_rank, sm = blockIdx.x % blocks_per_rank;
    const int channel = sm / 2;
    const bool is_forwarder = sm % 2 == 1;
    const int rank = p.rank_base + local, node = rank / R, lr = rank % R;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const InternodeRankArgs& a = args[rank];
    const NormalLayout& w = p.wire;
    const int C = p.num_channels, K = p.num_topk, S = p.num_scales, L = p.num_experts / p.num_ranks;

    __shared__ volatile long long sh_count[MAX_NODES];  // tokens from each node this call, -1 = not yet
    __shared__ volatile int sh_pos[R][MAX_NODES];        // forwarder warp's tokens passed, per node
    __shared__ u64 sh_base[MAX_NODES];                    // ring position of each node at call start
    __shared__ int sh_cursor[R][MAX_NODES];               // NVL receivers' rows per source node

    if (!is_forwarder) {
        const DoorbellRing ring = {a.ring_slots, a.ring_ticket, a.ring_mask};
        if (warp < kSenderWarps) {
            for (int n = warp; n < p.num_nodes; n += kSenderWarps)
                dispatch_send(a, p, err, ring, rank, node, lr, channel, n, lane);
        } else if (warp - kSenderWarps < R) {
            const int lf = warp - kSenderWarps;
            dispatch_nvl_receive(a, p, err, rank, node, channel, lf, lane, sh_cursor[lf]);
        }
        return;
    }

    for (int i = threadIdx.x; i < MAX_NODES; i += NUM_THREADS) {
        sh_count[i] = -1;
        sh_base[i] = i < p.num_nodes ? a.state[st_index(p, ST_D_CONSUMED, i, channel)] : 0;
    }
    for (int i = threadIdx.x; i < R * MAX_NODES; i += NUM_THREADS) sh_pos[i / MAX_NODES][i % MAX_NODES] = 0;
    __syncthreads();

    if (warp == kWarps - 1) {
        // Coordinator: lane n reads node n's count, then returns credits for the slots every
        // forwarder warp has passed (DeepEP's forwarder coordinator).
        const int n = lane;
        if (n >= p.num_nodes) return;
        const DoorbellRing ring = {a.ring_slots, a.ring_ticket, a.ring_mask};
        const u64 seen = a.state[st_index(p, ST_D_COUNT_SEEN, n, channel)];
        const u64* count_ptr = (const u64*)(a.recv_area + nl_counter(w, COUNTER_DISPATCH_COUNT, n, channel));
        u64 t0 = globaltimer_ns();
        u64 v;
        while ((v = ld_acquire_sys_u64(count_ptr)) <= seen) {
            if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                record_timeout(err, WAIT_RDMA_COUNT, rank, channel, n * R + lr, -1, (int)seen + 1, (int)v);
                return;
            }
        }
        const long long count = (long long)(v - seen - 1);
        a.state[st_index(p, ST_D_COUNT_SEEN, n, channel)] = v;
        a.state[st_index(p, ST_FWD_COUNT, n, channel)] = (u64)count;
        sh_count[n] = count;
        const u64 base = sh_base[n];
        const u32 qp = qp_index(node, n, R, 1, lr, 0, p.qps_per_peer, channel + C);
        const u64 head = nl_counter(w, COUNTER_DISPATCH_HEAD, node, channel);
        long long returned = 0;
        t0 = globaltimer_ns();
        while (returned < count) {
            long long m = count;
            for (int f = 0; f < R; ++f) m = min(m, (long long)sh_pos[f][n]);
            const long long owed = m - returned;
            if (owed > 0 && (owed >= (long long)w.dispatch_send_tokens || m == count)) {
                if (n == node) {
                    st_release_sys_u64((u64*)(a.recv_area + head), base + m);
                } else if (!doorbell_push(ring, DOORBELL_FLAG, qp, 0, a.recv_area_offset + head, 8,
                                          (u64)owed, wire_tag(TAG_DISPATCH_CREDIT, rank, channel, base + m),
                                          p.timeout_ns, err, rank, WAIT_DOORBELL_SLOT)) {
                    return;
                }
                returned = m;
                t0 = globaltimer_ns();
            } else if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                record_timeout(err, WAIT_FORWARD_STALL, rank, channel, n * R + lr, -1, (int)count, (int)m);
                return;
            }
        }
        a.state[st_index(p, ST_D_CONSUMED, n, channel)] = base + count;
        return;
    }
    if (warp >= R) return;

    // Forwarder of local destination rank `lt`: round-robin over source nodes (rotated per
    // channel against incast), every token of each node's ring in order; the ones whose mask
    // names `lt` are copied into lt's NVL ring from this rank.
    const int lt = warp;
    const int dest = node * R + lt;
    u8* dnvl = args[dest].nvl;
    int* tail_ptr = nvl_counter(dnvl, p, NVL_D_TAIL, channel, lr);
    const int* head_ptr = nvl_counter(dnvl, p, NVL_D_HEAD, channel, lr);
    int my_tail = ld_volatile(tail_ptr);
    int cached_head = ld_acquire_flag(head_ptr);
    u64 last_progress = globaltimer_ns();
    while (true) {
        bool all_done = true, progress = false;
        for (int i = 0; i < p.num_nodes; ++i) {
            const int n = (i + channel) % p.num_nodes;
            // One value for the whole warp (the coordinator may be writing it).
            const long long count = __shfl_sync(FULL_MASK, (long long)sh_count[n], 0);
            if (count < 0) {
                all_done = false;
                continue;
            }
            int pos = __shfl_sync(FULL_MASK, (int)sh_pos[lt][n], 0);
            if (pos >= count) continue;
            all_done = false;
            u64 tail = 0;
            if (lane == 0)
                tail = ld_acquire_sys_u64((const u64*)(a.recv_area + nl_counter(w, COUNTER_DISPATCH_TAIL, n, channel)));
            tail = __shfl_sync(FULL_MASK, tail, 0);
            const u64 base = sh_base[n];
            const long long avail = min((long long)(tail - base) - pos, count - pos);
            for (long long j = 0; j < avail; ++j) {
                const u64 seq = base + pos;
                const u8* slot = a.recv_area + nl_dispatch_slot(w, n, channel, seq);
                u64 meta = 0;
                if (lane == 0) meta = ld_relaxed_sys_u64((const u64*)(slot + w.dispatch_meta_offset));
                meta = __shfl_sync(FULL_MASK, meta, 0);
                const int t = (int)(u32)meta;
                const u32 mask = (u32)(meta >> 32);
                if (lt == 0 && lane == 0) a.fwd_log[((u64)n * C + channel) * p.fwd_log_stride + pos] = meta;
                if ((mask >> lt) & 1u) {
                    int ok = 1;
                    if (lane == 0 && my_tail - cached_head >= p.nvl_recv) {
                        const u64 t0 = globaltimer_ns();
                        while (my_tail - (cached_head = ld_acquire_flag(head_ptr)) >= p.nvl_recv) {
                            if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                                record_timeout(err, WAIT_NVL_SPACE, rank, channel, dest, -1,
                                               my_tail - p.nvl_recv + 1, cached_head);
                                ok = 0;
                                break;
                            }
                        }
                    }
                    if (!__shfl_sync(FULL_MASK, ok, 0)) return;
                    u8* ds = nvl_slot(dnvl, p, false, channel, lr, my_tail);
                    for (int k = lane; k < p.hidden_int4; k += 32)
                        ((int4*)ds)[k] = ld_sys_v4((const int4*)slot + k);
                    const float* ss = (const float*)(slot + w.dispatch_scales_offset);
                    for (int k = lane; k < S; k += 32) ((float*)(ds + p.nvl_scales_offset))[k] = ld_sys_f32(ss + k);
                    if (lane < K) {
                        const int e = ld_sys_s32((const int*)(slot + w.dispatch_topk_idx_offset) + lane);
                        const float wt = ld_sys_f32((const float*)(slot + w.dispatch_topk_weights_offset) + lane);
                        const int le = (e >= dest * L && e < (dest + 1) * L) ? e - dest * L : -1;
                        ((int*)(ds + p.nvl_topk_idx_offset))[lane] = le;
                        ((float*)(ds + p.nvl_topk_weights_offset))[lane] = le >= 0 ? wt : 0.0f;
                    }
                    if (lane == 0) {
                        ((int*)(ds + p.nvl_meta_offset))[0] = t;
                        ((int*)(ds + p.nvl_meta_offset))[1] = n;
                    }
                    ++my_tail;
                    __syncwarp();
                    if (lane == 0) st_release_flag(tail_ptr, my_tail);
                }
                ++pos;
                __syncwarp();
                if (lane == 0) sh_pos[lt][n] = pos;
                progress = true;
            }
        }
        if (all_done) break;
        if (progress) {
            last_progress = globaltimer_ns();
        } else if (globaltimer_ns() - last_progress > p.timeout_ns || error_raised(err)) {
            if (lane == 0) record_timeout(err, WAIT_RDMA_TAIL, rank, channel, -1, -1, 0, 0);
            return;
        }
    }
}

extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)
    internode_combine(const InternodeRankArgs* args, InternodeParams p, ErrorRecord* err) {
    const int blocks_per_rank = 2 * p.num_channels;
    const int local = blockIdx.x / blocks_per_rank, sm = blockIdx.x % blocks_per_rank;
    const int channel = sm / 2;
    const bool is_forwarder = sm % 2 == 1;
    const int rank = p.rank_base + local, node = rank / R, lr = rank % R;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const InternodeRankArgs& a = args[rank];
    const NormalLayout& w = p.wire;
    const int C = p.num_channels, K = p.num_topk, H = p.combine_hidden_int4;
    const DoorbellRing ring = {a.ring_slots, a.ring_ticket, a.ring_mask};

    __shared__ int sh_head[R];
    __shared__ int sh_fail;
    __shared__ int sh_pos[MAX_NODES], sh_returned[MAX_NODES];
    __shared__ u64 sh_base[MAX_NODES];
    __shared__ u64 sh_sent;

    if (!is_forwarder && warp < R) {
        // NVL sender towards forwarding rank `lf`: this rank's rows of every source (n, lf) in
        // this channel, source nodes ascending, rows in order (the order the forwarder reduces).
        const int lf = warp, fwd = node * R + lf;
        u8* fnvl = args[fwd].nvl;
        int* tail_ptr = nvl_counter(fnvl, p, NVL_C_TAIL, channel, lr);
        const int* head_ptr = nvl_counter(fnvl, p, NVL_C_HEAD, channel, lr);
        int my_tail = ld_volatile(tail_ptr);
        int cached_head = ld_acquire_flag(head_ptr);
        for (int n = 0; n < p.num_nodes; ++n) {
            const int src = n * R + lf;
            const u64 row0 = (u64)rows_before(a, src) + a.recv_channel_offset[src * C + channel];
            const int cnt = layout_count(a, p, src, channel);
            for (int j = 0; j < cnt; ++j) {
                const u64 row = row0 + j;
                int ok = 1;
                if (lane == 0 && my_tail - cached_head >= p.nvl_recv) {
                    const u64 t0 = globaltimer_ns();
                    while (my_tail - (cached_head = ld_acquire_flag(head_ptr)) >= p.nvl_recv) {
                        if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                            record_timeout(err, WAIT_NVL_SPACE, rank, channel, fwd, -1,
                                           my_tail - p.nvl_recv + 1, cached_head);
                            ok = 0;
                            break;
                        }
                    }
                }
                if (!__shfl_sync(FULL_MASK, ok, 0)) return;
                u8* ds = nvl_slot(fnvl, p, true, channel, lr, my_tail);
                const int4* s = a.combine_x + row * H;
                UNROLLED_WARP_COPY(4, lane, H, (int4*)ds, s, ld_nc_v4, st_na_v4);
                if (lane < K)
                    ((float*)(ds + p.nvl_topk_weights_offset))[lane] = a.combine_topk_weights[row * K + lane];
                if (lane == 0) {
                    ((int*)(ds + p.nvl_meta_offset))[0] = a.recv_src_idx[row];
                    ((int*)(ds + p.nvl_meta_offset))[1] = n;
                }
                ++my_tail;
                __syncwarp();
                if (lane == 0) st_release_flag(tail_ptr, my_tail);
            }
        }
        return;
    }

    if (!is_forwarder) {
        if (warp < kSenderWarps) return;
        // Receiver group: this rank's tokens of the channel, one at a time, each the sum of the
        // partial rows of every node it went to (DeepEP's RDMA receivers' reduction).
        const int gtid = tid - kSenderWarps * 32;
        if (gtid < MAX_NODES) {
            sh_pos[gtid] = 0;
            sh_returned[gtid] = 0;
            sh_base[gtid] = gtid < p.num_nodes ? a.state[st_index(p, ST_C_CONSUMED, gtid, channel)] : 0;
        }
        if (gtid == 0) sh_fail = 0;
        named_barrier(1, kReceiverGroupThreads);
        int ts, te;
        channel_task_range(a.num_tokens, C, channel, ts, te);
        auto credit = [&](int n, int upto) {
            const int owed = upto - sh_returned[n];
            if (owed <= 0) return true;
            sh_returned[n] = upto;
            const u64 head = nl_counter(w, COUNTER_COMBINE_HEAD, node, channel);
            if (n == node) {
                st_release_sys_u64((u64*)(a.recv_area + head), sh_base[n] + upto);
                return true;
            }
            const u32 qp = qp_index(node, n, R, 1, lr, 0, p.qps_per_peer, channel + C);
            return doorbell_push(ring, DOORBELL_FLAG, qp, 0, a.recv_area_offset + head, 8, (u64)owed,
                                 wire_tag(TAG_COMBINE_CREDIT, rank, channel, sh_base[n] + upto),
                                 p.timeout_ns, err, rank, WAIT_DOORBELL_SLOT);
        };
        for (int t = ts; t < te; ++t) {
            if (gtid == 0) {
                for (int n = 0; n < p.num_nodes && !sh_fail; ++n) {
                    if (node_mask(a, p.num_ranks, t, n) == 0) continue;
                    const u64 want = sh_base[n] + sh_pos[n];
                    const u64* tail_ptr = (const u64*)(a.recv_area + nl_counter(w, COUNTER_COMBINE_TAIL, n, channel));
                    const u64 t0 = globaltimer_ns();
                    u64 tail;
                    while ((tail = ld_acquire_sys_u64(tail_ptr)) <= want) {
                        if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                            record_timeout(err, WAIT_RDMA_TAIL, rank, channel, n * R + lr, -1, (int)want + 1, (int)tail);
                            sh_fail = 1;
                            break;
                        }
                    }
                    if (sh_fail) break;
                    const u8* slot = a.recv_area + nl_combine_slot(w, n, channel, want);
                    const int named = ld_sys_s32((const int*)(slot + w.combine_meta_offset));
                    if (named != t) {
                        record_timeout(err, BAD_WRONG_TOKEN, rank, channel, n * R + lr, -1, t, named);
                        sh_fail = 1;
                    }
                }
            }
            named_barrier(1, kReceiverGroupThreads);
            if (sh_fail) return;
            for (int i = gtid; i < H; i += kReceiverGroupThreads) {
                float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                for (int n = 0; n < p.num_nodes; ++n) {
                    if (node_mask(a, p.num_ranks, t, n) == 0) continue;
                    const u8* slot = a.recv_area + nl_combine_slot(w, n, channel, sh_base[n] + sh_pos[n]);
                    accumulate_bf16x8(acc, ld_sys_v4((const int4*)slot + i));
                }
                st_na_v4(a.combined_x + (u64)t * H + i, pack_bf16x8(acc));
            }
            if (gtid < K) {
                float wsum = 0.0f;
                for (int n = 0; n < p.num_nodes; ++n) {
                    if (node_mask(a, p.num_ranks, t, n) == 0) continue;
                    const u8* slot = a.recv_area + nl_combine_slot(w, n, channel, sh_base[n] + sh_pos[n]);
                    wsum += ld_sys_f32((const float*)(slot + w.combine_topk_weights_offset) + gtid);
                }
                a.combined_topk_weights[(u64)t * K + gtid] = wsum;
            }
            named_barrier(1, kReceiverGroupThreads);
            if (gtid == 0) {
                for (int n = 0; n < p.num_nodes; ++n) {
                    if (node_mask(a, p.num_ranks, t, n) == 0) continue;
                    ++sh_pos[n];
                    if (sh_pos[n] - sh_returned[n] >= (int)w.combine_send_tokens && !credit(n, sh_pos[n]))
                        sh_fail = 1;
                }
            }
        }
        if (gtid == 0) {
            for (int n = 0; n < p.num_nodes && !sh_fail; ++n) {
                if (!credit(n, sh_pos[n])) break;
                a.state[st_index(p, ST_C_CONSUMED, n, channel)] = sh_base[n] + sh_pos[n];
            }
        }
        return;
    }

    // Forwarder: for every token this rank forwarded in dispatch (source nodes ascending, ring
    // order), the sum of its node's partials, sent back over the wire to the token's source.
    if (tid < R) sh_head[tid] = ld_volatile(nvl_counter(a.nvl, p, NVL_C_HEAD, channel, tid));
    if (tid == 0) sh_fail = 0;
    __syncthreads();
    for (int n = 0; n < p.num_nodes; ++n) {
        const int count = (int)a.state[st_index(p, ST_FWD_COUNT, n, channel)];
        if (tid == 0) sh_sent = a.state[st_index(p, ST_C_SENT, n, channel)];
        __syncthreads();
        const u64 sent = sh_sent;
        const bool own = n == node;
        const u32 qp = qp_index(node, n, R, 1, lr, 0, p.qps_per_peer, channel);
        const u64* head_ptr = (const u64*)(a.recv_area + nl_counter(w, COUNTER_COMBINE_HEAD, n, channel));
        const u64 send_tokens = w.combine_send_tokens;
        for (int j = 0; j < count; ++j) {
            const u64 meta = a.fwd_log[((u64)n * C + channel) * p.fwd_log_stride + j];
            const int t = (int)(u32)meta;
            const u32 mask = (u32)(meta >> 32);
            if (tid == 0) {
                if (j % send_tokens == 0) {
                    const u64 batch = min(send_tokens, (u64)(count - j));
                    const u64 t0 = globaltimer_ns();
                    u64 head;
                    while (sent + j + batch - (head = ld_acquire_sys_u64(head_ptr)) > w.combine_ring_slots) {
                        if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                            record_timeout(err, WAIT_RDMA_CREDIT, rank, channel, n * R + lr, -1,
                                           (int)(sent + j + batch - w.combine_ring_slots), (int)head);
                            sh_fail = 1;
                            break;
                        }
                    }
                }
                for (int l = 0; l < R && !sh_fail; ++l) {
                    if (!((mask >> l) & 1u)) continue;
                    const int* tail_ptr = nvl_counter(a.nvl, p, NVL_C_TAIL, channel, l);
                    const u64 t0 = globaltimer_ns();
                    int tail;
                    while ((tail = ld_acquire_flag(tail_ptr)) <= sh_head[l]) {
                        if (globaltimer_ns() - t0 > p.timeout_ns || error_raised(err)) {
                            record_timeout(err, WAIT_NVL_TAIL, rank, channel, node * R + l, -1, sh_head[l] + 1, tail);
                            sh_fail = 1;
                            break;
                        }
                    }
                    if (sh_fail) break;
                    const int named = ld_cg_s32((const int*)(nvl_slot(a.nvl, p, true, channel, l, sh_head[l]) + p.nvl_meta_offset));
                    if (named != t) {
                        record_timeout(err, BAD_WRONG_TOKEN, rank, channel, node * R + l, -1, t, named);
                        sh_fail = 1;
                    }
                }
            }
            __syncthreads();
            if (sh_fail) return;
            const u64 seq = sent + j;
            u8* dst = own ? a.recv_area + nl_combine_slot(w, node, channel, seq)
                          : a.send_area + nl_combine_staging(w, n, channel, seq);
            for (int i = tid; i < H; i += NUM_THREADS) {
                float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                for (int l = 0; l < R; ++l) {
                    if (!((mask >> l) & 1u)) continue;
                    const u8* s = nvl_slot(a.nvl, p, true, channel, l, sh_head[l]);
                    accumulate_bf16x8(acc, ld_cg_v4((const int4*)s + i));
                }
                ((int4*)dst)[i] = pack_bf16x8(acc);
            }
            if (tid < K) {
                float wsum = 0.0f;
                for (int l = 0; l < R; ++l) {
                    if (!((mask >> l) & 1u)) continue;
                    const u8* s = nvl_slot(a.nvl, p, true, channel, l, sh_head[l]);
                    wsum += ld_cg_f32((const float*)(s + p.nvl_topk_weights_offset) + tid);
                }
                ((float*)(dst + w.combine_topk_weights_offset))[tid] = wsum;
            }
            if (tid == 0) *(u64*)(dst + w.combine_meta_offset) = (u64)(u32)t;
            __threadfence_system();
            __syncthreads();
            if (tid == 0) {
                for (int l = 0; l < R; ++l) {
                    if (!((mask >> l) & 1u)) continue;
                    ++sh_head[l];
                    st_release_flag(nvl_counter(a.nvl, p, NVL_C_HEAD, channel, l), sh_head[l]);
                }
                if ((j + 1) % send_tokens == 0 || j + 1 == count) {
                    const u64 end = sent + j + 1;
                    const u64 first = sent + (u64)j / send_tokens * send_tokens;
                    const u64 tail = nl_counter(w, COUNTER_COMBINE_TAIL, node, channel);
                    if (own) {
                        st_release_sys_u64((u64*)(a.recv_area + tail), end);
                    } else {
                        bool ok = true;
                        u64 s = first;
                        while (ok && s < end) {
                            const u64 run = min(w.combine_ring_slots - s % w.combine_ring_slots, end - s);
                            ok = doorbell_push(ring, DOORBELL_WRITE, qp,
                                               a.send_area_offset + nl_combine_staging(w, n, channel, s),
                                               a.recv_area_offset + nl_combine_slot(w, node, channel, s),
                                               (u32)(run * w.combine_token_bytes), 0,
                                               wire_tag(TAG_COMBINE_DATA, rank, channel, s), p.timeout_ns,
                                               err, rank, WAIT_DOORBELL_SLOT);
                            s += run;
                        }
                        if (ok)
                            ok = doorbell_push(ring, DOORBELL_FLAG, qp, 0, a.recv_area_offset + tail, 8,
                                               end - first, wire_tag(TAG_COMBINE_TAIL, rank, channel, end),
                                               p.timeout_ns, err, rank, WAIT_DOORBELL_SLOT);
                        if (!ok) sh_fail = 1;
                    }
                }
            }
            __syncthreads();
            if (sh_fail) return;
        }
        if (tid == 0) a.state[st_index(p, ST_C_SENT, n, channel)] = sent + count;
        __syncthreads();
    }
}
