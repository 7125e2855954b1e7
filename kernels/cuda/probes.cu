// Copy probes for calibrating the simulator's GPU profile: device-local (and, with several
// GPUs, peer) copy bandwidth of a 16-byte-vector copy kernel at a chosen number of blocks,
// flag round-trip latency between two blocks (same GPU or across GPUs), and an empty kernel
// for launch overhead.
#include "common.cuh"

// Grid-stride copy of `n_int4` int4, four independent loads in flight per thread.
extern "C" __global__ void __launch_bounds__(1024, 1)
    probe_copy(const int4* __restrict__ src, int4* __restrict__ dst, u64 n_int4) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n_int4; i += 4 * stride) {
        const int4 a = ld_nc_v4(src + i), b = ld_nc_v4(src + i + stride);
        const int4 c = ld_nc_v4(src + i + 2 * stride), d = ld_nc_v4(src + i + 3 * stride);
        st_na_v4(dst + i, a);
        st_na_v4(dst + i + stride, b);
        st_na_v4(dst + i + 2 * stride, c);
        st_na_v4(dst + i + 3 * stride, d);
    }
    for (; i < n_int4; i += stride) st_na_v4(dst + i, ld_nc_v4(src + i));
}

// Read-only pass over n_int4 int4 (16-byte vector loads, grid-stride): the flush probe's
// cleaner, which replaces the L2's dirty lines by clean ones, and its read-only timed op.
extern "C" __global__ void __launch_bounds__(1024, 1)
    probe_read(const int4* __restrict__ src, u64 n_int4, int* sink) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    int acc = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n_int4; i += stride) {
        const int4 v = ld_nc_v4(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678) sink[0] = acc;
}

extern "C" __global__ void probe_empty() {}

// Ping-pong between role 0 and role 1 through two flags, `iters` round trips; role 0 writes the
// elapsed %globaltimer nanoseconds to out_ns[0]. With role < 0 the role is blockIdx.x (both
// sides in one launch on one GPU); across GPUs each GPU launches one side.
extern "C" __global__ void probe_pingpong(int* ping, int* pong, int role, int iters, u64* out_ns,
                                          ErrorRecord* err, u64 timeout_ns) {
    if (threadIdx.x != 0) return;
    const int me = role < 0 ? (int)blockIdx.x : role;
    const u64 t0 = globaltimer_ns();
    for (int i = 1; i <= iters; ++i) {
        if (me == 0) {
            st_release_sys(ping, i);
            int v;
            while ((v = ld_acquire_sys(pong)) != i) {
                if (globaltimer_ns() - t0 > timeout_ns || error_raised(err)) {
                    record_timeout(err, WAIT_PROBE_FLAG, 0, -1, 1, -1, i, v);
                    return;
                }
            }
        } else {
            int v;
            while ((v = ld_acquire_sys(ping)) != i) {
                if (globaltimer_ns() - t0 > timeout_ns || error_raised(err)) {
                    record_timeout(err, WAIT_PROBE_FLAG, 1, -1, 0, -1, i, v);
                    return;
                }
            }
            st_release_sys(pong, i);
        }
    }
    if (me == 0) out_ns[0] = globaltimer_ns() - t0;
}

// ---------------------------------------------------------------------------------------------
// Probes for the simulator's one-GPU memory model (engine/profiles/h200-single.toml): what the
// transport kernels' own access patterns cost when the data is L2-resident or streams through
// HBM, one warp alone and the whole GPU together, and the latency of the single operations
// their dependency chains are made of.
// ---------------------------------------------------------------------------------------------

// The transport kernels' copy primitive alone: every warp copies whole chunks of `chunk_int4`
// int4 with UNROLLED_WARP_COPY (7 loads in flight per lane, L2-coherent loads, stores that skip
// L1) — chunk c from source chunk c % src_chunks to destination chunk c % dst_chunks. A small
// src/dst_chunks keeps that side resident in L2 across passes; a large one streams it to HBM.
extern "C" __global__ void __launch_bounds__(1024, 1)
    probe_warp_copy(const int4* __restrict__ src, int4* __restrict__ dst, int chunk_int4,
                    u64 n_chunks, u64 src_chunks, u64 dst_chunks) {
    const int lane = threadIdx.x % 32;
    const u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    for (u64 c = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; c < n_chunks; c += warps) {
        const int4* s = src + (c % src_chunks) * (u64)chunk_int4;
        int4* d = dst + (c % dst_chunks) * (u64)chunk_int4;
        UNROLLED_WARP_COPY(7, lane, chunk_int4, d, s, ld_cg_v4, st_na_v4);
    }
}

// Dependent 16-byte loads (one in flight per thread), coalesced like the low-latency kernels'
// row loops (a warp reads 512 contiguous bytes): thread t of T reads int4 t, t + T, t + 2T, ...
// (mod n_int4), the next address waiting for the loaded value (it never equals the marker, so
// the walk is fixed but cannot be issued ahead). Thread 0 of block 0 writes its %globaltimer
// nanoseconds to out_ns[0]. A region that fits in L2 (warmed first) measures L2 hits, a large
// one HBM.
extern "C" __global__ void __launch_bounds__(1024, 1)
    probe_chase(const int4* __restrict__ buf, u64 n_int4, int iters, u64* out_ns, int* sink) {
    const u64 total = (u64)gridDim.x * blockDim.x;
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 i = t % n_int4;
    int acc = 0;
    const u64 t0 = globaltimer_ns();
    for (int k = 0; k < iters; ++k) {
        const int4 v = ld_cg_v4(buf + i);
        acc += v.x;
        i = (i + total + (v.x == 0x7fffffff ? 1 : 0)) % n_int4;
    }
    const u64 t1 = globaltimer_ns();
    if (t == 0) out_ns[0] = t1 - t0;
    if (acc == 0x12345678) sink[0] = acc;
}

DEVICE void st_release_gpu(int* p, int v) {
    asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// One warp, `iters` repetitions of one operation, %globaltimer nanoseconds of the loop into
// out_ns[0]. mode 0: a returning atomicAdd (lane 0; the next waits for its result). mode 1: an
// acquire load at .gpu scope (lane 0, dependent). mode 2: a warp copy of one `chunk_int4` chunk
// (src L2-resident: the same chunk; dst a fresh chunk each time). mode 3: the same copy, then
// __syncwarp and a red.release.gpu add (the low-latency sender's per-message step).
extern "C" __global__ void probe_op_latency(int* flags, const int4* __restrict__ src,
                                            int4* __restrict__ dst, int chunk_int4, int mode,
                                            int iters, u64* out_ns) {
    const int lane = threadIdx.x % 32;
    if (threadIdx.x >= 32) return;
    int v = 0;
    const u64 t0 = globaltimer_ns();
    for (int k = 0; k < iters; ++k) {
        if (mode == 0) {
            if (lane == 0) v = atomicAdd(flags + (v < 0 ? 1 : 0), 1);
        } else if (mode == 1) {
            if (lane == 0) v += ld_acquire_gpu(flags + 32 + (v < 0 ? 1 : 0));
        } else {
            int4* d = dst + (u64)k * chunk_int4;
            UNROLLED_WARP_COPY(7, lane, chunk_int4, d, src, ld_cg_v4, st_na_v4);
            if (mode == 3) {
                __syncwarp();
                if (lane == 0) red_add_release_gpu(flags + 64, 1);
            }
        }
    }
    const u64 t1 = globaltimer_ns();
    if (lane == 0) {
        out_ns[0] = t1 - t0;
        if (v == 0x12345678) flags[96] = v;
    }
}

// probe_pingpong with .gpu-scope release/acquire: the flag scope the transport kernels use when
// every rank shares one GPU (hw.flag_scope = "gpu"). Two blocks of one launch.
extern "C" __global__ void probe_pingpong_gpu(int* ping, int* pong, int iters, u64* out_ns,
                                              ErrorRecord* err, u64 timeout_ns) {
    if (threadIdx.x != 0) return;
    const int me = (int)blockIdx.x;
    const u64 t0 = globaltimer_ns();
    for (int i = 1; i <= iters; ++i) {
        if (me == 0) {
            st_release_gpu(ping, i);
            int v;
            while ((v = ld_acquire_gpu(pong)) != i) {
                if (globaltimer_ns() - t0 > timeout_ns || error_raised(err)) {
                    record_timeout(err, WAIT_PROBE_FLAG, 0, -1, 1, -1, i, v);
                    return;
                }
            }
        } else {
            int v;
            while ((v = ld_acquire_gpu(ping)) != i) {
                if (globaltimer_ns() - t0 > timeout_ns || error_raised(err)) {
                    record_timeout(err, WAIT_PROBE_FLAG, 1, -1, 0, -1, i, v);
                    return;
                }
            }
            st_release_gpu(pong, i);
        }
    }
    if (me == 0) out_ns[0] = globaltimer_ns() - t0;
}

// The normal kernels' ring handoff alone: the first half of the grid produces, the second half
// consumes. Warp w of producer block b and warp w of consumer block b + gridDim.x / 2 share a
// ring of `slots` chunks of `chunk_int4` int4: the producer copies chunks from `src` (streamed
// from HBM) into the ring and publishes a tail with a release store; the consumer polls the
// tail (acquire), copies the slot out to `dst` (streamed to HBM) and publishes the head, which
// the producer waits for before reusing a slot. Every ring slot is stored by one SM and loaded
// once by another, as in the transport kernels; the copy probes never do that (their L2-resident
// sources are read-only and re-read). `base` makes the flags monotonic across launches (zero
// them once): launch k passes base = k * chunks_per_warp. Flags are 128 bytes apart. With
// `discard` the consumer drops each slot's lines from L2 after copying it, as the kernels do
// (chunk_int4 * 16 must then be a multiple of 128).
extern "C" __global__ void __launch_bounds__(1024, 1)
    probe_ring_handoff(const int4* __restrict__ src, int4* __restrict__ dst, int4* ring, int* flags,
                       int chunk_int4, int chunks_per_warp, int slots, int base, int discard,
                       u64 src_chunks, u64 dst_chunks, ErrorRecord* err, u64 timeout_ns) {
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    const int half = gridDim.x / 2;
    const bool producer = (int)blockIdx.x < half;
    const int pair = ((int)blockIdx.x % half) * warps + threadIdx.x / 32;
    int4* my_ring = ring + (u64)pair * slots * chunk_int4;
    int* tail = flags + (u64)pair * 64;
    int* head = tail + 32;
    const u64 t0 = globaltimer_ns();
    for (int i = 0; i < chunks_per_warp; ++i) {
        int4* slot = my_ring + (u64)(i % slots) * chunk_int4;
        const u64 c = (u64)pair * chunks_per_warp + i;
        // Producer: room for chunk i once the consumer is past chunk i - slots. Consumer:
        // chunk i once the tail passes it.
        const int* poll = producer ? head : tail;
        const int need = producer ? base + i - slots + 1 : base + i + 1;
        int ok = 1;
        if (lane == 0 && (!producer || i >= slots)) {
            int v;
            while ((v = ld_acquire_gpu(poll)) < need) {
                if (globaltimer_ns() - t0 > timeout_ns || error_raised(err)) {
                    record_timeout(err, WAIT_PROBE_FLAG, pair, -1, producer ? 1 : 0, -1, need, v);
                    ok = 0;
                    break;
                }
            }
        }
        // Also orders the other lanes' accesses after lane 0's acquire.
        if (!__shfl_sync(0xffffffffu, ok, 0)) return;
        if (producer) {
            UNROLLED_WARP_COPY(7, lane, chunk_int4, slot, src + (c % src_chunks) * chunk_int4,
                               ld_cg_v4, st_na_v4);
        } else {
            UNROLLED_WARP_COPY(7, lane, chunk_int4, dst + (c % dst_chunks) * chunk_int4, slot,
                               ld_cg_v4, st_na_v4);
            if (discard) {
                __syncwarp();
                warp_discard(slot, chunk_int4 * 16, lane);
            }
        }
        __syncwarp();
        if (lane == 0) st_release_gpu(producer ? tail : head, base + i + 1);
    }
}

DEVICE u64 clock_cycles() {
    u64 c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
    return c;
}

// BF16 x8 (one int4) to floats, as the low-latency kernels unpack them.
DEVICE void probe_unpack_bf16x8(int4 v, float* f) {
    const u32 w[4] = {(u32)v.x, (u32)v.y, (u32)v.z, (u32)v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        f[2 * j] = bf16_to_f32((u16)(w[j] & 0xffffu));
        f[2 * j + 1] = bf16_to_f32((u16)(w[j] >> 16));
    }
}

#define LL_SEND_CAST 1
#define LL_SEND_ATOMIC 2
#define LL_SEND_RELEASE 4
#define LL_SEND_TAIL 8
#define LL_PROBE_COUNT_BASE 65536
#define LL_RECV_HEADER 1
#define LL_RECV_PAYLOAD 2
#define LL_RECV_SCALES 4
#define LL_RECV_DISCARD 8

// The low-latency dispatch's send loop alone (`ll_dispatch`, LL_PHASE_SEND, in
// kernels/cuda/low_latency.cu), on synthetic data, with the steps of one sending warp timed.
// Items (one token of one rank each) are dealt to the blocks as the kernel deals them (item
// blockIdx.x, then + gridDim.x, ...); per item: all warps but the last cast the BF16 row
// `x[it]` (HBM) to FP8 with one scale per 128 channels into the item's staging message
// (`msg_bytes` apart), named barrier, then warp k < topk_n: load the expert index
// topk[it * topk_n + k], returning atomicAdd on counters[e] for the slot, header store, warp
// copy of the message's `msg_int4 - 1` int4 after the header from the staging buffer (ld.cg) into
// recv slot e * slots_per_counter + slot % slots_per_counter (st.na), __syncwarp,
// red.release.gpu on finish[e]. The host sizes x (items rows), staging (items messages) and recv
// (counters_n * slots_per_counter messages) so that no index wraps (a 64-bit modulo would add a
// long instruction sequence the kernel does not have). `mode` bits drop steps to see what each
// costs under load: LL_SEND_CAST (without: the staged message is not rewritten), LL_SEND_ATOMIC
// (without: the slot is the item's round), LL_SEND_RELEASE (without: a relaxed add),
// LL_SEND_TAIL (the count signalling: after
// __syncthreads each block polls the finish counters it owns, [b * per, (b + 1) * per) with
// per = ceil(counters_n / gridDim.x), until each holds expect[e] * launch_no, then stores a
// .gpu release flag carrying the launch and the count, launch_no * LL_PROBE_COUNT_BASE +
// expect[e] — as the kernel signals the count). Lane 0 of warp 0 sums clock64 cycles per step:
// out[b * 8 + 0..8] = {rounds, cast+barrier, index load + atomic, copy, release and loop back,
// %globaltimer at loop start, at loop end, after the tail}, plus the loop's clock64 cycles in
// out[gridDim.x * 8 + b] to convert cycles to ns.
extern "C" __global__ void __launch_bounds__(1024, 1)
    probe_ll_send(const int4* __restrict__ x, u8* staging, u8* recv, const int* topk,
                  int* counters, int* finish, int* flags, const int* expect, int row_int4,
                  int msg_int4, int msg_bytes, int topk_n, int counters_n, int items,
                  int slots_per_counter, int mode, int launch_no, u64* out,
                  ErrorRecord* err, u64 timeout_ns) {
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int cast_threads = blockDim.x - 32;
    const int hidden = row_int4 * 8;
    u64 s_cast = 0, s_atomic = 0, s_copy = 0, s_rest = 0, rounds = 0;
    const u64 g0 = globaltimer_ns();
    const u64 c_begin = clock_cycles();
    u64 c3 = c_begin;
    if (warp < (int)(blockDim.x / 32) - 1) {
        for (int it = blockIdx.x; it < items; it += gridDim.x) {
            const u64 c0 = clock_cycles();
            if (rounds > 0) s_rest += c0 - c3;
            u8* msg = staging + (u64)it * msg_bytes;
            if (mode & LL_SEND_CAST) {
                const int4* xr = x + (u64)it * row_int4;
                for (int i = tid; i < row_int4; i += cast_threads) {
                    const int4 v = ld_nc_v4(xr + i);
                    float f[8];
                    probe_unpack_bf16x8(v, f);
                    float amax = 0.0f;
#pragma unroll
                    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(f[j]));
#pragma unroll
                    for (int m = 8; m > 0; m >>= 1)
                        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
                    amax = fmaxf(amax, 1e-4f);
                    const float scale = 448.0f / amax, scale_inv = amax / 448.0f;
                    const u32 w0 = (u32)f32x2_to_e4m3x2(f[0] * scale, f[1] * scale) |
                                   ((u32)f32x2_to_e4m3x2(f[2] * scale, f[3] * scale) << 16);
                    const u32 w1 = (u32)f32x2_to_e4m3x2(f[4] * scale, f[5] * scale) |
                                   ((u32)f32x2_to_e4m3x2(f[6] * scale, f[7] * scale) << 16);
                    *(uint2*)(msg + 16 + i * 8) = make_uint2(w0, w1);
                    if (lane % 16 == 0) ((float*)(msg + 16 + hidden))[i / 16] = scale_inv;
                }
            }
            named_barrier(1, cast_threads);
            const u64 c1 = clock_cycles();
            u64 c2 = c1;
            if (warp < topk_n) {
                const int e = topk[(u64)it * topk_n + warp];
                int slot = 0;
                if (mode & LL_SEND_ATOMIC) {
                    if (lane == 0) slot = atomicAdd(counters + e, 1);
                } else {
                    slot = it / (int)gridDim.x + e;
                }
                slot = __shfl_sync(0xffffffffu, slot, 0);
                c2 = clock_cycles();
                u8* dst = recv + ((u64)e * slots_per_counter + (u64)(slot % slots_per_counter)) *
                                     msg_bytes;
                if (lane == 0) *(int4*)dst = make_int4(it, warp, 0, 0);
                UNROLLED_WARP_COPY(7, lane, msg_int4 - 1, (int4*)dst + 1, (const int4*)msg + 1,
                                   ld_cg_v4, st_na_v4);
                __syncwarp();
                c3 = clock_cycles();
                if (lane == 0) {
                    if (mode & LL_SEND_RELEASE) red_add_release_gpu(finish + e, 1);
                    else atomicAdd(finish + e, 1);
                }
            } else {
                c3 = c2;
            }
            s_cast += c1 - c0;
            s_atomic += c2 - c1;
            s_copy += c3 - c2;
            ++rounds;
        }
    }
    const u64 c_end = clock_cycles();
    if (rounds > 0) s_rest += c_end - c3;
    const u64 g1 = globaltimer_ns();
    __syncthreads();
    if (mode & LL_SEND_TAIL) {
        const int per = (counters_n + (int)gridDim.x - 1) / (int)gridDim.x;
        const int lo = min((int)blockIdx.x * per, counters_n), hi = min(lo + per, counters_n);
        for (int j = lo + tid; j < hi; j += blockDim.x) {
            const int want = expect[j] * launch_no;
            int v;
            while ((v = ld_acquire_gpu(finish + j)) < want) {
                if (globaltimer_ns() - g0 > timeout_ns || error_raised(err)) {
                    record_timeout(err, WAIT_PROBE_FLAG, blockIdx.x, -1, -1, j, want, v);
                    break;
                }
            }
            st_release_gpu(flags + j, launch_no * LL_PROBE_COUNT_BASE + expect[j]);
        }
        __syncthreads();
    }
    const u64 g2 = globaltimer_ns();
    if (tid == 0) {
        u64* o = out + (u64)blockIdx.x * 8;
        o[0] = rounds;
        o[1] = s_cast;
        o[2] = s_atomic;
        o[3] = s_copy;
        o[4] = s_rest;
        o[5] = g0;
        o[6] = g1;
        o[7] = g2;
        out[(u64)gridDim.x * 8 + blockIdx.x] = c_end - c_begin;
    }
}

// The low-latency dispatch's receive loop alone (`ll_dispatch`, LL_PHASE_RECV), reading the
// messages a `probe_ll_send` launch (number `launch_no`, with LL_SEND_TAIL) just stored, as
// the kernel's receive does in one launch or right after the send kernel in hook mode. Items
// (receiving rank lr, source src, local expert le) are dealt to groups of `wpg` warps as the
// kernel deals them; per item the group's first lane polls the count flags of sources
// 0..=src (acquire; flag = launch_no * LL_PROBE_COUNT_BASE + count), the packed position being
// the prefix of lower sources' counts, then the group's warps take its messages in turn: the
// header (ld.cg), its two fields stored, the FP8 payload (`payload_int4` int4) copied into the
// packed rows (ld.cg, st.na), the `num_scales` scales, and the message dropped from L2 — each
// step only where its bit of `steps` is set (LL_RECV_*: the kernel does all four; the probe
// leaves steps out to time each one). The send probe put message i of counter c = src * experts + lr * local + le
// of that launch in slot ((launch_no - 1) * count + i) % slots_per_counter of the counter.
// The first lane of each block's first group sums clock64 cycles of its polls and of its
// messages (to the group's second barrier): out[b * 8 + 0..6] = {items, messages, poll
// cycles, message cycles, %globaltimer at start, at end}, out[b * 8 + 6] = clock64 cycles of
// the whole loop, to convert cycles to ns.
extern "C" __global__ void __launch_bounds__(1024, 1)
    probe_ll_recv(const u8* recv, const int* flags, int4* packed, float* scales, int* info,
                  int msg_bytes, int payload_int4, int num_scales, int ranks, int local,
                  int slots_per_counter, int capacity, int wpg, int steps, int launch_no,
                  u64* out, ErrorRecord* err, u64 timeout_ns) {
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int G = gridDim.x;
    const int groups = (int)(blockDim.x / 32) / wpg;
    const int group = warp / wpg, sub_warp = warp % wpg;
    const int experts = ranks * local;
    const int recv_items = ranks * local * ranks;
    __shared__ int shared_n[32], shared_begin[32];
    const bool timed = group == 0 && sub_warp == 0 && lane == 0;
    u64 s_poll = 0, s_msgs = 0, n_items = 0, n_msgs = 0;
    const u64 g0 = globaltimer_ns();
    const u64 c_begin = clock_cycles();
    for (int base = blockIdx.x * groups; base < recv_items; base += G * groups) {
        const int item = base + group;
        if (group >= groups || item >= recv_items) continue;
        const int lr = item % ranks, rest = item / ranks;
        const int src = rest % ranks, le = rest / ranks;
        const u64 c0 = clock_cycles();
        if (sub_warp == 0 && lane == 0) {
            int begin = 0, n = 0;
            for (int s = 0; s <= src; ++s) {
                const int* f = flags + s * experts + lr * local + le;
                const u64 t0 = globaltimer_ns();
                int v;
                while ((v = ld_acquire_gpu(f)) / LL_PROBE_COUNT_BASE < launch_no) {
                    if (globaltimer_ns() - t0 > timeout_ns || error_raised(err)) {
                        record_timeout(err, WAIT_PROBE_FLAG, lr, -1, s, lr * local + le, launch_no,
                                       v);
                        v = launch_no * LL_PROBE_COUNT_BASE;
                        break;
                    }
                }
                const int c = v % LL_PROBE_COUNT_BASE;
                if (s < src) begin += c; else n = c;
            }
            if (begin + n > capacity) n = 0, begin = 0;
            shared_n[group] = n;
            shared_begin[group] = begin;
        }
        named_barrier(2 + group, wpg * 32);
        const u64 c1 = clock_cycles();
        const int n = shared_n[group], begin = shared_begin[group];
        const u64 cnt = (u64)src * experts + lr * local + le;
        for (int i = sub_warp; i < n; i += wpg) {
            const int slot = ((launch_no - 1) * n + i) % slots_per_counter;
            const u8* m = recv + (cnt * slots_per_counter + slot) * (u64)msg_bytes;
            const u64 row = (u64)(lr * local + le) * capacity + begin + i;
            if (steps & LL_RECV_HEADER) {
                const int4 hdr = ld_cg_v4((const int4*)m);
                if (lane == 0) {
                    info[2 * row] = hdr.x;
                    info[2 * row + 1] = hdr.y;
                }
            }
            if (steps & LL_RECV_PAYLOAD)
                UNROLLED_WARP_COPY(7, lane, payload_int4, packed + row * payload_int4,
                                   (const int4*)(m + 16), ld_cg_v4, st_na_v4);
            if (steps & LL_RECV_SCALES)
                for (int j = lane; j < num_scales; j += 32)
                    scales[row * num_scales + j] =
                        ld_cg_f32((const float*)(m + 16 + payload_int4 * 16) + j);
            if (steps & LL_RECV_DISCARD) {
                __syncwarp();
                warp_discard(m, msg_bytes, lane);
            }
        }
        named_barrier(2 + group, wpg * 32);
        if (timed) {
            const u64 c2 = clock_cycles();
            s_poll += c1 - c0;
            s_msgs += c2 - c1;
            n_items += 1;
            n_msgs += n;
        }
    }
    const u64 c_end = clock_cycles();
    const u64 g1 = globaltimer_ns();
    if (tid == 0) {
        u64* o = out + (u64)blockIdx.x * 8;
        o[0] = n_items;
        o[1] = n_msgs;
        o[2] = s_poll;
        o[3] = s_msgs;
        o[4] = g0;
        o[5] = g1;
        o[6] = c_end - c_begin;
        o[7] = 0;
    }
}
