// Shared device helpers for every eptwin kernel module.
//
// No CUDA headers are included: NVRTC compiles these sources with no include path, so the few
// types and conversions we need (bf16, e4m3) are written here with plain bit operations or PTX,
// and the host (hw/src/data.rs) mirrors them bit for bit.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define DEVICE __device__ __forceinline__

// ---------------------------------------------------------------------------------------------
// Bounded waits. Every spin-wait reads %globaltimer and gives up after `timeout_ns`; the first
// waiter that gives up records what it waited for here, and the host turns the record into an
// error naming the rank / channel / peer / expert (never a hang).
// ---------------------------------------------------------------------------------------------

// Kinds of wait (mirrored by hw/src/error.rs `WaitKind`).
#define WAIT_NOTIFY_BARRIER 1
#define WAIT_DISPATCH_OFFSETS 2
#define WAIT_DISPATCH_RING_SPACE 3
#define WAIT_DISPATCH_TAIL 4
#define WAIT_COMBINE_RING_SPACE 5
#define WAIT_COMBINE_TAIL 6
#define WAIT_LL_SEND_DONE 7
#define WAIT_LL_RECV_COUNT 8
#define WAIT_LL_COMBINE_FLAG 9
#define WAIT_PROBE_FLAG 10
#define WAIT_PROCESS_BARRIER 11
#define WAIT_DOORBELL_SLOT 12
#define WAIT_RDMA_CREDIT 13
#define WAIT_RDMA_COUNT 14
#define WAIT_RDMA_TAIL 15
#define WAIT_NVL_SPACE 16
#define WAIT_NVL_TAIL 17
#define WAIT_FORWARD_STALL 18
// Not waits: a ring delivered something its layout does not allow (the op fails naming it).
#define BAD_UNEXPECTED_TOKEN 19
#define BAD_WRONG_TOKEN 20

struct ErrorRecord {
    int flag;       // 0 = no error; set once by the first waiter that timed out
    int kind;       // WAIT_*
    int rank;       // the waiting rank (job rank)
    int channel;    // channel, or -1
    int peer;       // the rank waited for, or -1
    int expert;     // the expert waited for, or -1
    int expected;   // the value waited for
    int observed;   // the last value seen
};

DEVICE u64 globaltimer_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

DEVICE void record_timeout(ErrorRecord* rec, int kind, int rank, int channel, int peer,
                           int expert, int expected, int observed) {
    if (atomicCAS(&rec->flag, 0, 1) == 0) {
        rec->kind = kind;
        rec->rank = rank;
        rec->channel = channel;
        rec->peer = peer;
        rec->expert = expert;
        rec->expected = expected;
        rec->observed = observed;
        __threadfence_system();
    }
}

// Once any waiter timed out, others stop waiting at once instead of each burning its own timeout.
DEVICE bool error_raised(const ErrorRecord* rec) {
    return *(volatile const int*)&rec->flag != 0;
}

// ---------------------------------------------------------------------------------------------
// Memory-model helpers (PTX ISA "Memory Consistency Model"). Flags crossing GPUs use .sys scope;
// data is ordered by the flag's release/acquire pair.
// ---------------------------------------------------------------------------------------------

DEVICE int ld_acquire_sys(const int* p) {
    int v;
    asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

DEVICE int ld_acquire_gpu(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

DEVICE int ld_volatile(const int* p) {
    int v;
    asm volatile("ld.volatile.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

DEVICE void st_release_sys(int* p, int v) {
    asm volatile("st.release.sys.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

DEVICE void st_relaxed_sys(int* p, int v) {
    asm volatile("st.relaxed.sys.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

DEVICE void red_add_release_sys(int* p, int v) {
    asm volatile("red.release.sys.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

DEVICE void red_add_release_gpu(int* p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Flags between ranks (ring tails and heads, counts, barriers) at the narrowest scope that
// covers every rank of the job: .gpu when all ranks share one GPU (FLAG_SCOPE_SYS=0, set by
// the host), .sys when peers sit on other GPUs. A .sys release has to drain writes to the
// whole system and costs far more than a .gpu one.
#ifndef FLAG_SCOPE_SYS
#define FLAG_SCOPE_SYS 1
#endif
#if FLAG_SCOPE_SYS
#define FLAG_SCOPE "sys"
#else
#define FLAG_SCOPE "gpu"
#endif

DEVICE int ld_acquire_flag(const int* p) {
    int v;
    asm volatile("ld.acquire." FLAG_SCOPE ".global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

DEVICE int ld_relaxed_flag(const int* p) {
    int v;
    asm volatile("ld.relaxed." FLAG_SCOPE ".global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

DEVICE void st_release_flag(int* p, int v) {
    asm volatile("st.release." FLAG_SCOPE ".global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

DEVICE void st_relaxed_flag(int* p, int v) {
    asm volatile("st.relaxed." FLAG_SCOPE ".global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

DEVICE void red_add_release_flag(int* p, int v) {
    asm volatile("red.release." FLAG_SCOPE ".global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Read-only inputs (never written during the kernel): non-coherent path, no L1 allocation.
DEVICE int4 ld_nc_v4(const int4* p) {
    int4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Data another block wrote during this kernel, read after an acquire: bypass L1 (.cg) so a line
// cached from a previous lap of a ring buffer can never be returned.
DEVICE int4 ld_cg_v4(const int4* p) {
    int4 v;
    asm volatile("ld.global.cg.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

DEVICE int ld_cg_s32(const int* p) {
    int v;
    asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

DEVICE float ld_cg_f32(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

DEVICE void st_na_v4(int4* p, int4 v);

// L2 eviction priorities (Hopper): ring slots are stored evict-last so they survive until the
// receiver reads them moments later; outputs and once-read inputs are evict-first so that their
// streaming does not push ring slots out. USE_L2_HINTS=0 compiles plain accesses instead.
#ifndef USE_L2_HINTS
#define USE_L2_HINTS 1
#endif

DEVICE u64 l2_policy_evict_first() {
    u64 p = 0;
#if USE_L2_HINTS
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}

DEVICE u64 l2_policy_evict_last() {
    u64 p = 0;
#if USE_L2_HINTS
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}

DEVICE int4 ld_cg_v4_hint(const int4* p, u64 pol) {
#if USE_L2_HINTS
    int4 v;
    asm volatile("ld.global.cg.L2::cache_hint.v4.s32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
    return v;
#else
    return ld_cg_v4(p);
#endif
}

DEVICE int4 ld_nc_v4_hint(const int4* p, u64 pol) {
#if USE_L2_HINTS
    int4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.s32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
    return v;
#else
    return ld_nc_v4(p);
#endif
}

DEVICE void st_na_v4_hint(int4* p, int4 v, u64 pol) {
#if USE_L2_HINTS
    asm volatile("st.global.L1::no_allocate.L2::cache_hint.v4.s32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p),
                 "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(pol));
#else
    st_na_v4(p, v);
#endif
}

DEVICE void st_na_v4(int4* p, int4 v) {
    asm volatile("st.global.L1::no_allocate.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w));
}

// A consumed ring-buffer line is dead: drop it from L2 without writing it back to HBM. When
// several ranks share one GPU the ring lives in the same HBM as everything else, and the
// write-back of consumed slots would otherwise double the memory traffic of the transport.
// The line must be 128-byte aligned (slots are).
DEVICE void discard_l2_line(const void* p) {
    asm volatile("discard.global.L2 [%0], 128;" ::"l"(p) : "memory");
}

DEVICE void named_barrier(int id, int num_threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_threads));
}

// Warp-cooperative copy of `n` int4 with `UNROLL` loads in flight per lane.
#define UNROLLED_WARP_COPY(UNROLL, LANE, N, DST, SRC, LD, ST)                                 \
    {                                                                                         \
        const int __n = (N);                                                                  \
        const int __full = __n / (32 * (UNROLL)) * (32 * (UNROLL));                           \
        for (int __i = (LANE); __i < __full; __i += 32 * (UNROLL)) {                          \
            int4 __v[(UNROLL)];                                                               \
            _Pragma("unroll") for (int __j = 0; __j < (UNROLL); ++__j) __v[__j] =             \
                LD((SRC) + __i + __j * 32);                                                   \
            _Pragma("unroll") for (int __j = 0; __j < (UNROLL); ++__j)                        \
                ST((DST) + __i + __j * 32, __v[__j]);                                         \
        }                                                                                     \
        for (int __i = __full + (LANE); __i < __n; __i += 32) ST((DST) + __i, LD((SRC) + __i)); \
    }

// Drop `bytes` (a multiple of 128) starting at the 128-byte aligned `p` from L2, warp-wide.
DEVICE void warp_discard(const void* p, int bytes, int lane) {
    const char* c = (const char*)p;
    for (int off = lane * 128; off < bytes; off += 32 * 128) discard_l2_line(c + off);
}

// ---------------------------------------------------------------------------------------------
// Number formats. bf16 rounding is round-to-nearest-even on finite values (the inputs here are
// always finite); e4m3 uses the hardware conversion with saturation, as DeepEP does.
// ---------------------------------------------------------------------------------------------

DEVICE float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

DEVICE u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// Two floats to two e4m3 bytes: `lo` in the low byte.
DEVICE u16 f32x2_to_e4m3x2(float lo, float hi) {
    u16 r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

// e4m3 byte to float (exact): sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities.
DEVICE float e4m3_to_f32(u8 v) {
    const u32 sign = (v >> 7) & 1u, exp = (v >> 3) & 0xfu, man = v & 7u;
    float mag;
    if (exp == 0) {
        mag = (float)man * 0.001953125f;  // man * 2^-9
    } else {
        mag = __uint_as_float(((exp + 120u) << 23) | (man << 20));  // (1 + man/8) * 2^(exp-7)
    }
    return sign ? -mag : mag;
}

// The token range a channel owns (DeepEP `get_channel_task_range`).
DEVICE void channel_task_range(int num_tokens, int num_channels, int channel, int& start,
                               int& end) {
    const int per_channel = (num_tokens + num_channels - 1) / num_channels;
    start = min(per_channel * channel, num_tokens);
    end = min(start + per_channel, num_tokens);
}

DEVICE int warp_reduce_sum(int v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}
