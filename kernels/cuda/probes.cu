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
