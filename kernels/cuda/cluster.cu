// Ring handoff through distributed shared memory (Hopper thread-block clusters, sm_90+): a
// probe of whether DeepEP's two-copy intranode algorithm could approach the memcpy rate when the
// ranks share one GPU.
//
// With the rings in global memory (the transport kernels, `probe_ring_handoff`) every byte
// crosses the L2 four times (input read, ring write, ring read, output write) against memcpy's
// two, and the L2 bounds the kernels near 60 % of memcpy (results/h200/README.md). Here the ring
// slots live in the *receiver block's shared memory*: the producer reads its input from global
// memory and stores it straight into a peer block's shared memory over the cluster's SM-to-SM
// network; the consumer copies the slot from its own shared memory to the output. Only the input
// read and the output write touch L2 and HBM, as in a memcpy.
//
// Shape (the intranode dispatch's channel, one block per rank): a cluster of CLUSTER_SIZE blocks
// is one channel of CLUSTER_SIZE ranks. In each block the first half of the warps produce, the
// second half consume. Producer warp w of block r sends to block d = w % CLUSTER_SIZE (its
// `sub` = w / CLUSTER_SIZE-th ring from source r there); consumer warp c of block r drains ring
// (source s = c % CLUSTER_SIZE, sub = c / CLUSTER_SIZE) of its own shared memory. The tail of a
// ring sits in the consumer's shared memory, its head in the producer's; both are published with
// release stores and polled with acquire loads at cluster scope, like the transport kernels' ring
// flags at `.gpu`/`.sys` scope. Clusters are independent (a channel never waits on another), so
// clusters beyond what the GPU holds at once simply run later.
//
// Compile-time parameters (NVRTC -D): CLUSTER_SIZE (blocks per cluster, ≤ 8 is portable),
// CL_THREADS (threads per block), CL_UNROLL (16-byte loads in flight per lane).
#include "common.cuh"
#include "cluster.cuh"

#ifndef CLUSTER_SIZE
#define CLUSTER_SIZE 8
#endif
#ifndef CL_THREADS
#define CL_THREADS 512
#endif
#ifndef CL_UNROLL
#define CL_UNROLL 14
#endif

constexpr int kClWarps = CL_THREADS / 32;
constexpr int kClProducers = kClWarps / 2;
constexpr int kClPerDest = kClProducers / CLUSTER_SIZE;
static_assert(kClPerDest >= 1 && kClProducers % CLUSTER_SIZE == 0,
              "half the warps must split evenly over the cluster's blocks");

// Lane 0 waits until the flag at `addr` reaches `need`; false (after recording it) on timeout.
DEVICE bool cluster_wait(u32 addr, int need, int lane, u64 t0, u64 timeout_ns, ErrorRecord* err,
                         int block, int peer, int producer) {
    int ok = 1;
    if (lane == 0) {
        int v;
        while ((v = ld_acquire_cluster(addr)) < need) {
            if (globaltimer_ns() - t0 > timeout_ns || error_raised(err)) {
                record_timeout(err, WAIT_PROBE_FLAG, block, -1, peer, producer, need, v);
                ok = 0;
                break;
            }
        }
    }
    // Also orders the other lanes' accesses after lane 0's acquire.
    return __shfl_sync(0xffffffffu, ok, 0) != 0;
}

// Bytes handed over = gridDim.x * kClProducers * chunks_per_warp * chunk_int4 * 16. Producer
// warp p of block b reads chunks (b * kClProducers + p) * chunks_per_warp + i of `src` (modulo
// src_chunks); the consumer of that ring writes the same chunk index of `dst` (modulo
// dst_chunks), so dst equals src chunk for chunk. Dynamic shared memory:
// CLUSTER_SIZE * kClPerDest * slots * chunk_int4 * 16 bytes of rings, then 2 * CLUSTER_SIZE *
// kClPerDest ints of flags.
extern "C" __global__ void __cluster_dims__(CLUSTER_SIZE, 1, 1) __launch_bounds__(CL_THREADS, 1)
    probe_cluster_handoff(const int4* __restrict__ src, int4* __restrict__ dst, int chunk_int4,
                          int chunks_per_warp, int slots, u64 src_chunks, u64 dst_chunks,
                          ErrorRecord* err, u64 timeout_ns) {
    extern __shared__ __align__(128) u8 cl_smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 me = cluster_ctarank();
    const int rings = CLUSTER_SIZE * kClPerDest;
    const u32 ring_bytes = (u32)slots * (u32)chunk_int4 * 16u;
    int* tails = (int*)(cl_smem + (u64)rings * ring_bytes);  // [source][sub], in the consumer
    int* heads = tails + rings;                              // [destination][sub], in the producer
    for (int i = threadIdx.x; i < 2 * rings; i += blockDim.x) tails[i] = 0;
    // No block touches a peer's shared memory before the peer has zeroed its flags.
    cluster_sync_all();
    const u64 t0 = globaltimer_ns();
    const u64 block = blockIdx.x;
    if (warp < kClProducers) {
        const int d = warp % CLUSTER_SIZE, sub = warp / CLUSTER_SIZE;
        const int ring = (int)me * kClPerDest + sub;  // this warp's ring in block d
        const u32 ring_addr = map_to_rank(smem_addr(cl_smem + (u64)ring * ring_bytes), d);
        const u32 tail_addr = map_to_rank(smem_addr(tails + ring), d);
        const u32 head_addr = map_to_rank(smem_addr(heads + d * kClPerDest + sub), me);
        const u64 first = (block * kClProducers + warp) * (u64)chunks_per_warp;
        for (int i = 0; i < chunks_per_warp; ++i) {
            if (i >= slots && !cluster_wait(head_addr, i - slots + 1, lane, t0, timeout_ns, err,
                                            (int)block, d, 1))
                break;
            const int4* s = src + ((first + i) % src_chunks) * chunk_int4;
            const u32 slot = ring_addr + (u32)(i % slots) * (u32)chunk_int4 * 16u;
            for (int j0 = lane; j0 < chunk_int4; j0 += 32 * CL_UNROLL) {
                int4 v[CL_UNROLL];
#pragma unroll
                for (int k = 0; k < CL_UNROLL; ++k) {
                    const int j = j0 + k * 32;
                    if (j < chunk_int4) v[k] = ld_nc_v4(s + j);
                }
#pragma unroll
                for (int k = 0; k < CL_UNROLL; ++k) {
                    const int j = j0 + k * 32;
                    if (j < chunk_int4) st_cluster_v4(slot + (u32)j * 16u, v[k]);
                }
            }
            __syncwarp();
            if (lane == 0) st_release_cluster(tail_addr, i + 1);
        }
    } else {
        const int c = warp - kClProducers;
        const int s_rank = c % CLUSTER_SIZE, sub = c / CLUSTER_SIZE;
        const int ring = s_rank * kClPerDest + sub;
        const u32 ring_addr = smem_addr(cl_smem + (u64)ring * ring_bytes);
        const u32 tail_addr = map_to_rank(smem_addr(tails + ring), me);
        const u32 head_addr = map_to_rank(smem_addr(heads + (int)me * kClPerDest + sub), s_rank);
        // The ring's producer: warp sub * CLUSTER_SIZE + me of block s_rank of this cluster.
        const u64 pblock = block - me + (u64)s_rank;
        const u64 first = (pblock * kClProducers + (u64)(sub * CLUSTER_SIZE + (int)me)) *
                          (u64)chunks_per_warp;
        for (int i = 0; i < chunks_per_warp; ++i) {
            if (!cluster_wait(tail_addr, i + 1, lane, t0, timeout_ns, err, (int)block, s_rank, 0))
                break;
            int4* o = dst + ((first + i) % dst_chunks) * chunk_int4;
            const u32 slot = ring_addr + (u32)(i % slots) * (u32)chunk_int4 * 16u;
            for (int j0 = lane; j0 < chunk_int4; j0 += 32 * CL_UNROLL) {
                int4 v[CL_UNROLL];
#pragma unroll
                for (int k = 0; k < CL_UNROLL; ++k) {
                    const int j = j0 + k * 32;
                    if (j < chunk_int4) v[k] = ld_shared_v4(slot + (u32)j * 16u);
                }
#pragma unroll
                for (int k = 0; k < CL_UNROLL; ++k) {
                    const int j = j0 + k * 32;
                    if (j < chunk_int4) st_na_v4(o + j, v[k]);
                }
            }
            __syncwarp();
            if (lane == 0) st_release_cluster(head_addr, i + 1);
        }
    }
    // No block leaves while a peer may still store into its shared memory or poll its flags.
    cluster_sync_all();
}

// ---- The same handoff with the Tensor Memory Accelerator (bulk async copies) ----
//
// The producer does not stage rows in registers: one thread issues
// `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes`, which copies a chunk from
// global memory straight into the consumer block's ring slot and counts its bytes on the
// consumer's per-slot mbarrier; the consumer waits on that mbarrier, then one thread writes the
// slot out with `cp.async.bulk.global.shared::cta` and, once the bulk store has read the slot,
// re-arms the slot's mbarrier and returns the slot to the producer (head flag, release store at
// cluster scope, in the producer's shared memory). DeepEP's intranode kernels on Hopper move
// rows with the same TMA bulk copies (`tma_load_1d` / `tma_store_1d`).

// Same arguments, grid and byte accounting as probe_cluster_handoff, plus `store`: 0 = the
// consumer returns each slot as soon as its chunk has landed, without storing it (the handoff
// alone: the only HBM traffic is the producers' reads, so a rate that binds here is the
// handoff's own, not the memory's). Dynamic shared memory: the
// rings, then one 8-byte mbarrier per (ring, slot), then one head flag per ring. (A one-block
// multicast at the producer's own offsets instead of the mapped addresses measured the same,
// 2026-12-02 16:11 UTC.)
extern "C" __global__ void __cluster_dims__(CLUSTER_SIZE, 1, 1) __launch_bounds__(CL_THREADS, 1)
    probe_cluster_tma_handoff(const int4* __restrict__ src, int4* __restrict__ dst, int chunk_int4,
                              int chunks_per_warp, int slots, u64 src_chunks, u64 dst_chunks,
                              ErrorRecord* err, u64 timeout_ns, int store) {
    extern __shared__ __align__(128) u8 cl_smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 me = cluster_ctarank();
    const int rings = CLUSTER_SIZE * kClPerDest;
    const u32 chunk_bytes = (u32)chunk_int4 * 16u;
    const u32 ring_bytes = (u32)slots * chunk_bytes;
    const u32 bars = smem_addr(cl_smem + (u64)rings * ring_bytes);  // u64 [ring][slot]
    int* heads = (int*)(cl_smem + (u64)rings * ring_bytes + (u64)rings * slots * 8);
    const int n = chunks_per_warp;
    for (int i = threadIdx.x; i < rings; i += blockDim.x) heads[i] = 0;
    for (int i = threadIdx.x; i < rings * slots; i += blockDim.x) {
        mbar_init(bars + 8u * i, 1);
        // Armed for the first fill of every slot that will be used.
        if (i % slots < n) mbar_arrive_expect_tx(bars + 8u * i, chunk_bytes);
    }
    mbar_init_fence();
    cluster_sync_all();
    const u64 t0 = globaltimer_ns();
    const u64 block = blockIdx.x;
    bool ok = true;
    if (warp < kClProducers) {
        const int d = warp % CLUSTER_SIZE, sub = warp / CLUSTER_SIZE;
        const int ring = (int)me * kClPerDest + sub;  // this warp's ring in block d
        const u32 ring_addr = map_to_rank(smem_addr(cl_smem + (u64)ring * ring_bytes), d);
        const u32 bar_addr = map_to_rank(bars + 8u * (u32)(ring * slots), d);
        const u32 head_addr = map_to_rank(smem_addr(heads + d * kClPerDest + sub), me);
        const u64 first = (block * kClProducers + warp) * (u64)n;
        if (lane == 0) {
            for (int i = 0; i < n && ok; ++i) {
                if (i >= slots) {
                    int v;
                    while ((v = ld_acquire_cluster(head_addr)) < i - slots + 1) {
                        if (globaltimer_ns() - t0 > timeout_ns || error_raised(err)) {
                            record_timeout(err, WAIT_PROBE_FLAG, (int)block, -1, d, 1, i - slots + 1, v);
                            ok = false;
                            break;
                        }
                    }
                    if (!ok) break;
                }
                const int s = i % slots;
                tma_load_to_cluster(ring_addr + (u32)s * chunk_bytes,
                                    src + ((first + i) % src_chunks) * chunk_int4, chunk_bytes,
                                    bar_addr + 8u * (u32)s);
            }
        }
    } else {
        const int c = warp - kClProducers;
        const int s_rank = c % CLUSTER_SIZE, sub = c / CLUSTER_SIZE;
        const int ring = s_rank * kClPerDest + sub;
        const u32 ring_addr = smem_addr(cl_smem + (u64)ring * ring_bytes);
        const u32 bar_addr = bars + 8u * (u32)(ring * slots);
        const u32 head_addr = map_to_rank(smem_addr(heads + (int)me * kClPerDest + sub), s_rank);
        const u64 pblock = block - me + (u64)s_rank;
        const u64 first = (pblock * kClProducers + (u64)(sub * CLUSTER_SIZE + (int)me)) * (u64)n;
        if (lane == 0) {
            for (int i = 0; i < n; ++i) {
                const int s = i % slots;
                const u32 parity = (u32)(i / slots) & 1u;
                while (!mbar_try_wait(bar_addr + 8u * (u32)s, parity)) {
                    if (globaltimer_ns() - t0 > timeout_ns || error_raised(err)) {
                        record_timeout(err, WAIT_PROBE_FLAG, (int)block, -1, s_rank, 0, i + 1, i);
                        ok = false;
                        break;
                    }
                }
                if (!ok) break;
                if (store) {
                    fence_proxy_async_shared();
                    tma_store_from_shared(dst + ((first + i) % dst_chunks) * chunk_int4,
                                          ring_addr + (u32)s * chunk_bytes, chunk_bytes);
                    // Slot s goes back as soon as the store has read it (the normal cluster
                    // kernels' receivers do the same): re-arm it and hand it back.
                    tma_store_wait_read_all();
                }
                if (i + slots < n) mbar_arrive_expect_tx(bar_addr + 8u * (u32)s, chunk_bytes);
                st_release_cluster(head_addr, i + 1);
            }
            tma_store_wait_all();
        }
    }
    __syncwarp();
    // No block leaves while a peer may still copy into its shared memory or poll its flags.
    cluster_sync_all();
}
