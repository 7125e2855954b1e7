//! Probes for the simulator's one-GPU memory model (docs/calibration.md): the transport
//! kernels' warp copy with the source and destination either L2-resident or streaming through
//! HBM, from one warp to the whole GPU; the normal kernels' ring handoff alone;
//! dependent-load latency from L2 and HBM, idle and with every SM loading; single operations
//! (atomic, acquire load, one message copy, copy + release); the flag latency at .gpu scope;
//! then the low-latency send and receive loops (`super::ll_send`). `src` and `dst` are
//! `big`-byte buffers.

use std::collections::BTreeMap;

use super::{Buffers, ll_send, time_us, time_us_warm};
use crate::error::HwError;
use crate::exec::{Device, Devices};
use crate::kernel_args;
use crate::measurements::{DependentLoad, OpLatency, Probes, WarpCopies, round3};

/// Bytes of one chunk of the warp-copy probes: a 7,168-byte row (hidden 7168 in FP8; half a
/// BF16 row), the unit the transport kernels' warps copy.
const CHUNK_BYTES: usize = 7168;
/// The L2-resident working set of a probe side: 12 MiB (source and destination together stay
/// well inside the 60 MB L2).
const L2_REGION_BYTES: usize = 12 << 20;
const CHUNK_INT4: i32 = (CHUNK_BYTES / 16) as i32;

pub(super) fn probes(devs: &mut Devices, b: &Buffers, p: &mut Probes) -> Result<(), HwError> {
    let (src, dst, big) = b.spans();
    p.warp_copy_bw_gbps = Some(warp_copies(devs, src, dst, big)?);
    p.ring_handoff_bw_gbps = Some(ring_handoff(devs, src, dst, big)?);
    let out = devs.list[0].gpu.alloc(64)?;
    p.dependent_load = Some(dependent_loads(devs, src, big, out.ptr)?);
    let flags = devs.list[0].gpu.alloc(4096)?;
    p.op_latency = Some(op_latency(devs, src, dst, flags.ptr, out.ptr)?);
    p.flag_latency_same_gpu_gpu_scope_ns = Some(gpu_scope_flag(devs, flags.ptr, out.ptr)?);
    ll_send::chain(devs, b, p)
}

/// One placement of the warp copy's source and destination: their chunks, whether both are
/// L2-resident, the `(blocks, threads)` shapes, and the map the figures go to.
type WarpCopyVariant<'a> = (u64, u64, bool, &'a [(u32, u32)], &'a mut BTreeMap<String, f64>);

/// The warp copy by `"<blocks>x<threads>"` for each placement of source and destination.
fn warp_copies(devs: &mut Devices, src: u64, dst: u64, big: usize) -> Result<WarpCopies, HwError> {
    let big_chunks = (big / CHUNK_BYTES) as u64;
    let l2_chunks = (L2_REGION_BYTES / CHUNK_BYTES) as u64;
    let mut copies = WarpCopies::default();
    // (source chunks, destination chunks, L2-resident on both sides, shapes, the result).
    let variants: [WarpCopyVariant<'_>; 4] = [
        (
            l2_chunks,
            l2_chunks,
            true,
            &[
                (1, 32),
                (1, 512),
                (1, 1024),
                (8, 1024),
                (32, 1024),
                (66, 1024),
                (132, 1024),
                (192, 512),
                (264, 512),
            ],
            &mut copies.l2_to_l2,
        ),
        (
            big_chunks,
            big_chunks,
            false,
            &[(1, 32), (1, 512), (1, 1024), (132, 1024), (192, 512), (264, 512)],
            &mut copies.hbm_to_hbm,
        ),
        (
            l2_chunks,
            big_chunks,
            false,
            &[(1, 32), (1, 1024), (132, 1024), (192, 512)],
            &mut copies.l2_to_hbm,
        ),
        (
            big_chunks,
            l2_chunks,
            false,
            &[(1, 32), (1, 1024), (132, 1024), (192, 512)],
            &mut copies.hbm_to_l2,
        ),
    ];
    for (src_chunks, dst_chunks, resident, shapes, by_shape) in variants {
        for &(blocks, threads) in shapes {
            let warps = (blocks * threads / 32) as u64;
            let n_chunks = if resident {
                (warps * 64).max(4096)
            } else {
                (warps * 32).clamp(4096, big_chunks)
            };
            let launch = |dev: &Device| {
                let f = dev.module("probes")?.function("probe_warp_copy");
                let mut a = kernel_args![src, dst, CHUNK_INT4, n_chunks, src_chunks, dst_chunks];
                // SAFETY: chunk indices wrap inside both buffers (src_chunks, dst_chunks ≤ big).
                unsafe { dev.gpu.launch(f, blocks, threads, &mut a) }
            };
            let us = if resident {
                time_us_warm(devs, 0, 5, launch)?
            } else {
                time_us(devs, 0, 5, launch)?
            };
            let gbps = (n_chunks * CHUNK_BYTES as u64) as f64 / (us * 1e3);
            by_shape.insert(format!("{blocks}x{threads}"), round3(gbps));
        }
    }
    Ok(copies)
}

/// The ring handoff of the normal kernels alone (producer warp → L2-resident ring slot →
/// consumer warp on another SM → HBM): bytes handed over per second, at the normal kernels'
/// grid (also with the consumer dropping each consumed slot from L2, as the kernels do) and
/// at one 1,024-thread block per SM. Two slots per warp pair keep every ring in L2 (1,536
/// pairs × 2 × 7,168 B = 22 MB at 192 × 512).
fn ring_handoff(
    devs: &mut Devices,
    src: u64,
    dst: u64,
    big: usize,
) -> Result<BTreeMap<String, f64>, HwError> {
    let big_chunks = (big / CHUNK_BYTES) as u64;
    let (slots, cpw) = (2i32, 64i32);
    let ring = devs.list[0].gpu.alloc(64 << 20)?;
    let flags = devs.list[0].gpu.alloc(4 << 20)?;
    let mut handoff = BTreeMap::new();
    for (blocks, threads, discard) in [(192u32, 512u32, 0i32), (192, 512, 1), (132, 1024, 0)] {
        let pairs = (blocks / 2 * threads / 32) as u64;
        devs.list[0].gpu.memset_u8(flags.ptr, 0, 4 << 20)?;
        devs.clear_errors()?;
        let (r, f) = (ring.ptr, flags.ptr);
        let (err, to) = (devs.list[0].err.ptr, devs.timeout_ns());
        let mut launches = 0i32;
        let launch = |dev: &Device| {
            let k = dev.module("probes")?.function("probe_ring_handoff");
            let base = launches * cpw;
            launches += 1;
            let c = CHUNK_INT4;
            let mut a = kernel_args![
                src, dst, r, f, c, cpw, slots, base, discard, big_chunks, big_chunks, err, to
            ];
            // SAFETY: pairs × slots chunks fit the 64 MiB ring and pairs × 256 B the 4 MiB of
            // flags; chunk indices wrap inside src and dst; all blocks are resident (the grid
            // is at most one 1,024-thread or two 512-thread blocks per SM).
            unsafe { dev.gpu.launch(k, blocks, threads, &mut a) }
        };
        let us = time_us(devs, 0, 5, launch)?;
        devs.finish("ring handoff probe")?;
        let bytes = pairs * cpw as u64 * CHUNK_BYTES as u64;
        let key = format!("{blocks}x{threads}{}", if discard == 1 { "_discard" } else { "" });
        handoff.insert(key, round3(bytes as f64 / (us * 1e3)));
    }
    Ok(handoff)
}

/// Dependent loads: ns per load of thread 0, and the whole launch's loads per second.
fn dependent_loads(
    devs: &mut Devices,
    src: u64,
    big: usize,
    out: u64,
) -> Result<BTreeMap<String, DependentLoad>, HwError> {
    let sink = devs.list[0].gpu.alloc(64)?;
    let mut chase = BTreeMap::new();
    let l2_int4 = (8u64 << 20) / 16;
    let big_int4 = big as u64 / 16;
    for (name, n_int4, blocks, threads, iters, resident) in [
        ("l2_1x32", l2_int4, 1u32, 32u32, 4000i32, true),
        ("hbm_1x32", big_int4, 1, 32, 4000, false),
        ("l2_132x1024", l2_int4, 132, 1024, 48, true),
        ("hbm_132x1024", big_int4, 132, 1024, 48, false),
    ] {
        let k = sink.ptr;
        let launch = |dev: &Device| {
            let f = dev.module("probes")?.function("probe_chase");
            let mut a = kernel_args![src, n_int4, iters, out, k];
            // SAFETY: every int4 index is < n_int4, inside the buffer.
            unsafe { dev.gpu.launch(f, blocks, threads, &mut a) }
        };
        let us =
            if resident { time_us_warm(devs, 0, 5, launch)? } else { time_us(devs, 0, 5, launch)? };
        let mut ns = [0u64];
        devs.list[0].gpu.download(out, &mut ns)?;
        let loads = (blocks * threads) as f64 * iters as f64;
        chase.insert(
            name.to_string(),
            DependentLoad {
                ns_per_load_thread0: round3(ns[0] as f64 / iters as f64),
                launch_us: round3(us),
                loads_per_us: round3(loads / us),
            },
        );
    }
    Ok(chase)
}

/// Single operations of one warp: an atomic add, an acquire load, a 7,168-byte message copy,
/// and the copy with a release after it.
fn op_latency(
    devs: &mut Devices,
    src: u64,
    dst: u64,
    flags: u64,
    out: u64,
) -> Result<OpLatency, HwError> {
    let mut ns_per_op = [0.0; 4];
    for (i, (mode, iters)) in
        [(0i32, 4000i32), (1, 4000), (2, 2000), (3, 2000)].into_iter().enumerate()
    {
        devs.list[0].gpu.memset_u8(flags, 0, 4096)?;
        devs.flush_l2()?;
        {
            let dev = &devs.list[0];
            let f = dev.module("probes")?.function("probe_op_latency");
            let mut a = kernel_args![flags, src, dst, CHUNK_INT4, mode, iters, out];
            // SAFETY: dst holds iters chunks (2000 × 7168 B < big); flags hold 1024 ints.
            unsafe { dev.gpu.launch(f, 1, 32, &mut a)? };
        }
        devs.finish("operation latency probe")?;
        let mut ns = [0u64];
        devs.list[0].gpu.download(out, &mut ns)?;
        ns_per_op[i] = round3(ns[0] as f64 / iters as f64);
    }
    let [atomic_add_ns, acquire_load_gpu_ns, warp_copy_7168b_ns, warp_copy_7168b_release_ns] =
        ns_per_op;
    Ok(OpLatency {
        atomic_add_ns,
        acquire_load_gpu_ns,
        warp_copy_7168b_ns,
        warp_copy_7168b_release_ns,
    })
}

/// Flag ping-pong at .gpu scope (the transport kernels' scope on one GPU), one way.
fn gpu_scope_flag(devs: &mut Devices, flags: u64, out: u64) -> Result<f64, HwError> {
    let iters = 10_000i32;
    {
        let d = &devs.list[0];
        d.gpu.memset_u8(flags, 0, 4096)?;
        devs.clear_errors()?;
        let (ping, pong, err, to) = (flags, flags + 2048, d.err.ptr, devs.timeout_ns());
        let f = d.module("probes")?.function("probe_pingpong_gpu");
        let mut a = kernel_args![ping, pong, iters, out, err, to];
        // SAFETY: flag words and output are live; two blocks of one warp each are resident.
        unsafe { d.gpu.launch(f, 2, 32, &mut a)? };
    }
    devs.finish("gpu-scope flag ping-pong probe")?;
    let mut ns = [0u64];
    devs.list[0].gpu.download(out, &mut ns)?;
    Ok(round3(ns[0] as f64 / iters as f64 / 2.0))
}
