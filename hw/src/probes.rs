//! Calibration probes and ceilings, measured in the same run as the scenario: device-to-device
//! `cuMemcpy` bandwidth (the ceiling of a copy-bound dispatch/combine on one GPU), small-copy
//! latency, a 16-byte-vector copy kernel at several block counts (per-SM copy rate), kernel
//! launch overhead, flag round-trip latency, and peer copies when several GPUs are in use.
//!
//! Figures are medians of CUDA-event-timed repetitions, each after an L2 flush.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::error::HwError;
use crate::exec::{Device, Devices};
use crate::kernel_args;

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 }
}

/// min, p10, p50, p90 and max of `v` (sorted here), one decimal: how the diagnostic stamps
/// (`EPTWIN_CLUSTER_TIMES`, `EPTWIN_LL_TIMES`) are logged.
pub(crate) fn percentiles(v: &mut [f64]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!(
        "min {:.1} p10 {:.1} p50 {:.1} p90 {:.1} max {:.1}",
        at(0.0),
        at(0.1),
        at(0.5),
        at(0.9),
        at(1.0)
    )
}

/// Time `op` `reps` times on one device (L2 flushed before each), median in microseconds.
pub(crate) fn time_us(
    devs: &mut Devices,
    idx: usize,
    reps: usize,
    op: impl FnMut(&Device) -> Result<(), HwError>,
) -> Result<f64, HwError> {
    time_reps(devs, idx, reps, true, op)
}

/// `reps` timed runs of `op` between two CUDA events after one untimed warm-up run (module
/// load, TLB, clocks), optionally flushing L2 before each; the median in microseconds.
fn time_reps(
    devs: &mut Devices,
    idx: usize,
    reps: usize,
    flush_l2: bool,
    mut op: impl FnMut(&Device) -> Result<(), HwError>,
) -> Result<f64, HwError> {
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..reps + 1 {
        if flush_l2 {
            devs.flush_l2()?;
        }
        let dev = &devs.list[idx];
        let (a, b) = (dev.gpu.new_event()?, dev.gpu.new_event()?);
        dev.gpu.record(&a)?;
        op(dev)?;
        dev.gpu.record(&b)?;
        dev.gpu.wait("probe", devs.host_timeout_ms, &|| None)?;
        if rep > 0 {
            samples.push(a.elapsed_ms(&b)? as f64 * 1e3);
        }
    }
    Ok(median(samples))
}

/// Run every probe on the placement's GPUs; keys go into the result's measurements.
pub fn run(devs: &mut Devices) -> Result<BTreeMap<String, Value>, HwError> {
    let mut m = BTreeMap::new();
    let big = 1usize << 30;
    let (src, dst) = {
        let g = &devs.list[0].gpu;
        let src = g.alloc(big)?;
        let dst = g.alloc(big)?;
        // Never time on zeros: fill the source with a pattern.
        g.memset_u32(src.ptr, 0x3c5a_a5c3, big / 4)?;
        g.memset_u32(dst.ptr, 0, big / 4)?;
        (src, dst)
    };
    let sm_count = devs.list[0].gpu.sm_count;

    // cuMemcpy device-to-device at several sizes.
    let mut by_size = serde_json::Map::new();
    let mut copy_1g_us = 0.0;
    let mut small_us = 0.0;
    for bytes in [4096usize, 65_536, 1 << 20, 16 << 20, 256 << 20, 1 << 30] {
        let reps = if bytes >= 256 << 20 { 10 } else { 20 };
        let us = time_us(devs, 0, reps, |d| d.gpu.copy_dtod(dst.ptr, src.ptr, bytes))?;
        by_size.insert(bytes.to_string(), json!(round3(us)));
        if bytes == 1 << 30 {
            copy_1g_us = us;
        }
        if bytes == 4096 {
            small_us = us;
        }
    }
    let memcpy_gbps = big as f64 / (copy_1g_us * 1e3);
    m.insert("probe.memcpy_dtod_bw_gbps".into(), json!(round3(memcpy_gbps)));
    m.insert("probe.memcpy_dtod_read_write_bw_gbps".into(), json!(round3(2.0 * memcpy_gbps)));
    m.insert("probe.memcpy_dtod_us_by_bytes".into(), Value::Object(by_size));
    m.insert("probe.memcpy_small_4KiB_latency_us".into(), json!(round3(small_us)));

    // The copy kernel, full grid and a sweep of block counts (1024 threads per block).
    let copy_bytes = 256usize << 20;
    let n_int4 = (copy_bytes / 16) as u64;
    let mut by_blocks = serde_json::Map::new();
    let mut per_sm = 0.0;
    let occupancy = {
        let d = &devs.list[0];
        d.gpu.occupancy(d.module("probes")?.function("probe_copy"), 1024)?.max(1)
    };
    let full = sm_count * occupancy;
    let mut blocks_list = vec![1u32, 2, 4, 8, 16, 32, sm_count / 2, sm_count, full];
    blocks_list.dedup();
    for blocks in blocks_list {
        let (s, t) = (src.ptr, dst.ptr);
        let us = time_us(devs, 0, 5, |d| {
            let f = d.module("probes")?.function("probe_copy");
            let mut a = kernel_args![s, t, n_int4];
            // SAFETY: both buffers hold n_int4 int4.
            unsafe { d.gpu.launch(f, blocks, 1024, &mut a) }
        })?;
        let gbps = copy_bytes as f64 / (us * 1e3);
        by_blocks.insert(blocks.to_string(), json!(round3(gbps)));
        if blocks == 1 {
            per_sm = gbps;
        }
        if blocks == full {
            m.insert("probe.copy_kernel_bw_gbps".into(), json!(round3(gbps)));
        }
    }
    m.insert("probe.copy_kernel_bw_gbps_by_blocks".into(), Value::Object(by_blocks));
    m.insert("probe.copy_kernel_one_block_bw_gbps".into(), json!(round3(per_sm)));

    // Launch overhead: one empty kernel between two events, and 1000 back to back.
    let empty_us = time_us(devs, 0, 20, |d| {
        let f = d.module("probes")?.function("probe_empty");
        // SAFETY: no parameters.
        unsafe { d.gpu.launch(f, 1, 32, &mut []) }
    })?;
    m.insert("probe.empty_kernel_event_us".into(), json!(round3(empty_us)));
    let burst_us = time_us(devs, 0, 3, |d| {
        let f = d.module("probes")?.function("probe_empty");
        for _ in 0..1000 {
            // SAFETY: no parameters.
            unsafe { d.gpu.launch(f, 1, 32, &mut [])? };
        }
        Ok(())
    })?;
    m.insert("probe.launch_interval_us".into(), json!(round3(burst_us / 1000.0)));

    // Flag round trip between two blocks of one GPU (release store / acquire poll).
    let iters = 10_000i32;
    let flags = devs.list[0].gpu.alloc(4096)?;
    let out = devs.list[0].gpu.alloc(8)?;
    {
        let d = &devs.list[0];
        d.gpu.memset_u8(flags.ptr, 0, 4096)?;
        devs.clear_errors()?;
        let (ping, pong, role, o, err, to) =
            (flags.ptr, flags.ptr + 2048, -1i32, out.ptr, d.err.ptr, devs.timeout_ns());
        let f = d.module("probes")?.function("probe_pingpong");
        let mut a = kernel_args![ping, pong, role, iters, o, err, to];
        // SAFETY: flag words and output are live; two blocks of one thread each are resident.
        unsafe { d.gpu.launch(f, 2, 32, &mut a)? };
    }
    devs.finish("flag ping-pong probe")?;
    let mut ns = [0u64];
    devs.list[0].gpu.download(out.ptr, &mut ns)?;
    let rtt = ns[0] as f64 / iters as f64;
    m.insert("probe.flag_roundtrip_same_gpu_ns".into(), json!(round3(rtt)));
    m.insert("probe.flag_latency_same_gpu_ns".into(), json!(round3(rtt / 2.0)));

    flush_writeback_probe(devs, &mut m, src.ptr, dst.ptr, big)?;
    memory_model_probes(devs, &mut m, src.ptr, dst.ptr, big)?;

    if devs.list.len() > 1 {
        peer_probes(devs, &mut m)?;
    }
    Ok(m)
}

/// Where the L2 stands when an op is timed: what a short op pays for the flush's dirty lines.
/// Every op is timed right after `flush_l2` (a 256 MB memset), whose last L2-full of lines may
/// still be dirty when the op starts; each line the op brings in would then first write one
/// back. The probe times a full-grid copy (new lines: source and destination) and a read
/// (source only) of `bytes` in three states: right after the flush (as every op is timed),
/// after the flush and an untimed read of 256 MB elsewhere (the L2 full of clean lines, the
/// dirty ones written back before the timing), and after the flush and 2 ms idle (whether the
/// L2 writes dirty lines back by itself). After-flush minus after-clean is what the flush's
/// write-backs cost the op.
fn flush_writeback_probe(
    devs: &mut Devices,
    m: &mut BTreeMap<String, Value>,
    src: u64,
    dst: u64,
    big: usize,
) -> Result<(), HwError> {
    const CLEAN_BYTES: usize = 256 << 20;
    let sm_count = devs.list[0].gpu.sm_count;
    let sink = devs.list[0].gpu.alloc(64)?;
    // The cleaner reads the source buffer's upper half, which no timed op touches.
    let clean_src = src + (big / 2) as u64;
    let sink_ptr = sink.ptr;
    let read = |d: &Device, from: u64, bytes: usize| -> Result<(), HwError> {
        let f = d.module("probes")?.function("probe_read");
        let n_int4 = (bytes / 16) as u64;
        let mut a = kernel_args![from, n_int4, sink_ptr];
        // SAFETY: `from` holds `bytes` readable bytes; the sink is 64 bytes.
        unsafe { d.gpu.launch(f, sm_count, 1024, &mut a) }
    };
    let copy = |d: &Device, bytes: usize| -> Result<(), HwError> {
        let f = d.module("probes")?.function("probe_copy");
        let n_int4 = (bytes / 16) as u64;
        let mut a = kernel_args![src, dst, n_int4];
        // SAFETY: both buffers hold `big` >= bytes bytes.
        unsafe { d.gpu.launch(f, sm_count, 1024, &mut a) }
    };
    let mut out = serde_json::Map::new();
    for mib in [4usize, 8, 16, 32, 64, 128] {
        let bytes = mib << 20;
        for kind in ["copy", "read"] {
            let op = |d: &Device| if kind == "copy" { copy(d, bytes) } else { read(d, src, bytes) };
            let mut states = serde_json::Map::new();
            for state in ["after_flush", "after_clean", "after_idle"] {
                let mut samples = Vec::new();
                for rep in 0..8 {
                    devs.flush_l2()?;
                    let d = &devs.list[0];
                    match state {
                        "after_clean" => read(d, clean_src, CLEAN_BYTES)?,
                        "after_idle" => {
                            d.gpu.wait("flush probe", devs.host_timeout_ms, &|| None)?;
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                        _ => {}
                    }
                    let (a, b) = (d.gpu.new_event()?, d.gpu.new_event()?);
                    d.gpu.record(&a)?;
                    op(d)?;
                    d.gpu.record(&b)?;
                    d.gpu.wait("flush probe", devs.host_timeout_ms, &|| None)?;
                    if rep > 0 {
                        samples.push(a.elapsed_ms(&b)? as f64 * 1e3);
                    }
                }
                states.insert(format!("{state}_us"), json!(round3(median(samples))));
            }
            out.insert(format!("{kind}_{mib}MiB"), Value::Object(states));
        }
    }
    m.insert("probe.flush_writeback".into(), Value::Object(out));
    Ok(())
}

/// Like [`time_us`] without the L2 flush: the operation runs once untimed first, so that a
/// working set that fits in L2 is resident when the timed repetitions start.
fn time_us_warm(
    devs: &mut Devices,
    idx: usize,
    reps: usize,
    op: impl FnMut(&Device) -> Result<(), HwError>,
) -> Result<f64, HwError> {
    time_reps(devs, idx, reps, false, op)
}

/// Bytes of one chunk of the warp-copy probes: a 7,168-byte row (hidden 7168 in FP8; half a
/// BF16 row), the unit the transport kernels' warps copy.
const CHUNK_BYTES: usize = 7168;
/// The L2-resident working set of a probe side: 12 MiB (source and destination together stay
/// well inside the 60 MB L2).
const L2_REGION_BYTES: usize = 12 << 20;

/// Probes for the simulator's one-GPU memory model: the transport kernels' warp copy with the
/// source and destination either L2-resident or streaming through HBM, from one warp to the
/// whole GPU; dependent-load latency from L2 and HBM, idle and with every SM loading; single
/// operations (atomic, acquire load, one message copy, copy + release); the flag latency at
/// .gpu scope. `src` and `dst` are `big`-byte buffers.
fn memory_model_probes(
    devs: &mut Devices,
    m: &mut BTreeMap<String, Value>,
    src: u64,
    dst: u64,
    big: usize,
) -> Result<(), HwError> {
    let chunk_int4 = (CHUNK_BYTES / 16) as i32;
    let big_chunks = (big / CHUNK_BYTES) as u64;
    let l2_chunks = (L2_REGION_BYTES / CHUNK_BYTES) as u64;
    // (name, source chunks, destination chunks, L2-resident on both sides).
    let variants = [
        ("l2_to_l2", l2_chunks, l2_chunks, true),
        ("hbm_to_hbm", big_chunks, big_chunks, false),
        ("l2_to_hbm", l2_chunks, big_chunks, false),
        ("hbm_to_l2", big_chunks, l2_chunks, false),
    ];
    let mut copies = serde_json::Map::new();
    for (name, src_chunks, dst_chunks, resident) in variants {
        let shapes: &[(u32, u32)] = match name {
            "l2_to_l2" => &[
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
            "hbm_to_hbm" => &[(1, 32), (1, 512), (1, 1024), (132, 1024), (192, 512), (264, 512)],
            _ => &[(1, 32), (1, 1024), (132, 1024), (192, 512)],
        };
        let mut by_shape = serde_json::Map::new();
        for &(blocks, threads) in shapes {
            let warps = (blocks * threads / 32) as u64;
            let n_chunks = if resident {
                (warps * 64).max(4096)
            } else {
                (warps * 32).clamp(4096, big_chunks)
            };
            let (s, d) = (src, dst);
            let launch = |dev: &Device| {
                let f = dev.module("probes")?.function("probe_warp_copy");
                let mut a = kernel_args![s, d, chunk_int4, n_chunks, src_chunks, dst_chunks];
                // SAFETY: chunk indices wrap inside both buffers (src_chunks, dst_chunks ≤ big).
                unsafe { dev.gpu.launch(f, blocks, threads, &mut a) }
            };
            let us = if resident {
                time_us_warm(devs, 0, 5, launch)?
            } else {
                time_us(devs, 0, 5, launch)?
            };
            let gbps = (n_chunks * CHUNK_BYTES as u64) as f64 / (us * 1e3);
            by_shape.insert(format!("{blocks}x{threads}"), json!(round3(gbps)));
        }
        copies.insert(name.into(), Value::Object(by_shape));
    }
    m.insert("probe.warp_copy_bw_gbps".into(), Value::Object(copies));

    // The ring handoff of the normal kernels alone (producer warp → L2-resident ring slot →
    // consumer warp on another SM → HBM): bytes handed over per second, at the normal kernels'
    // grid (also with the consumer dropping each consumed slot from L2, as the kernels do) and
    // at one 1,024-thread block per SM. Two slots per warp pair keep every ring in L2 (1,536
    // pairs × 2 × 7,168 B = 22 MB at 192 × 512).
    let slots = 2i32;
    let cpw = 64i32;
    let ring = devs.list[0].gpu.alloc(64 << 20)?;
    let flags = devs.list[0].gpu.alloc(4 << 20)?;
    let mut handoff = serde_json::Map::new();
    for (blocks, threads, discard) in [(192u32, 512u32, 0i32), (192, 512, 1), (132, 1024, 0)] {
        let pairs = (blocks / 2 * threads / 32) as u64;
        devs.list[0].gpu.memset_u8(flags.ptr, 0, 4 << 20)?;
        devs.clear_errors()?;
        let (s, d, r, f) = (src, dst, ring.ptr, flags.ptr);
        let (err, to) = (devs.list[0].err.ptr, devs.timeout_ns());
        let mut launches = 0i32;
        let launch = |dev: &Device| {
            let k = dev.module("probes")?.function("probe_ring_handoff");
            let base = launches * cpw;
            launches += 1;
            let mut a = kernel_args![
                s, d, r, f, chunk_int4, cpw, slots, base, discard, big_chunks, big_chunks, err, to
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
        handoff.insert(key, json!(round3(bytes as f64 / (us * 1e3))));
    }
    m.insert("probe.ring_handoff_bw_gbps".into(), Value::Object(handoff));

    // Dependent loads: ns per load of thread 0, and the whole launch's loads per second.
    let out = devs.list[0].gpu.alloc(64)?;
    let sink = devs.list[0].gpu.alloc(64)?;
    let mut chase = serde_json::Map::new();
    let l2_int4 = (8u64 << 20) / 16;
    let big_int4 = big as u64 / 16;
    for (name, n_int4, blocks, threads, iters, resident) in [
        ("l2_1x32", l2_int4, 1u32, 32u32, 4000i32, true),
        ("hbm_1x32", big_int4, 1, 32, 4000, false),
        ("l2_132x1024", l2_int4, 132, 1024, 48, true),
        ("hbm_132x1024", big_int4, 132, 1024, 48, false),
    ] {
        let (b, o, k) = (src, out.ptr, sink.ptr);
        let launch = |dev: &Device| {
            let f = dev.module("probes")?.function("probe_chase");
            let mut a = kernel_args![b, n_int4, iters, o, k];
            // SAFETY: every int4 index is < n_int4, inside the buffer.
            unsafe { dev.gpu.launch(f, blocks, threads, &mut a) }
        };
        let us =
            if resident { time_us_warm(devs, 0, 5, launch)? } else { time_us(devs, 0, 5, launch)? };
        let mut ns = [0u64];
        devs.list[0].gpu.download(out.ptr, &mut ns)?;
        let loads = (blocks * threads) as f64 * iters as f64;
        chase.insert(
            name.into(),
            json!({
                "ns_per_load_thread0": round3(ns[0] as f64 / iters as f64),
                "launch_us": round3(us),
                "loads_per_us": round3(loads / us),
            }),
        );
    }
    m.insert("probe.dependent_load".into(), Value::Object(chase));

    // Single operations of one warp.
    let flags = devs.list[0].gpu.alloc(4096)?;
    let mut ops = serde_json::Map::new();
    for (name, mode, iters) in [
        ("atomic_add_ns", 0i32, 4000i32),
        ("acquire_load_gpu_ns", 1, 4000),
        ("warp_copy_7168B_ns", 2, 2000),
        ("warp_copy_7168B_release_ns", 3, 2000),
    ] {
        devs.list[0].gpu.memset_u8(flags.ptr, 0, 4096)?;
        devs.flush_l2()?;
        let (f_, s, d, o) = (flags.ptr, src, dst, out.ptr);
        {
            let dev = &devs.list[0];
            let f = dev.module("probes")?.function("probe_op_latency");
            let mut a = kernel_args![f_, s, d, chunk_int4, mode, iters, o];
            // SAFETY: dst holds iters chunks (2000 × 7168 B < big); flags hold 1024 ints.
            unsafe { dev.gpu.launch(f, 1, 32, &mut a)? };
        }
        devs.finish("operation latency probe")?;
        let mut ns = [0u64];
        devs.list[0].gpu.download(out.ptr, &mut ns)?;
        ops.insert(name.into(), json!(round3(ns[0] as f64 / iters as f64)));
    }
    m.insert("probe.op_latency".into(), Value::Object(ops));

    // Flag ping-pong at .gpu scope (the transport kernels' scope on one GPU).
    let iters = 10_000i32;
    {
        let d = &devs.list[0];
        d.gpu.memset_u8(flags.ptr, 0, 4096)?;
        devs.clear_errors()?;
        let (ping, pong, o, err, to) =
            (flags.ptr, flags.ptr + 2048, out.ptr, d.err.ptr, devs.timeout_ns());
        let f = d.module("probes")?.function("probe_pingpong_gpu");
        let mut a = kernel_args![ping, pong, iters, o, err, to];
        // SAFETY: flag words and output are live; two blocks of one warp each are resident.
        unsafe { d.gpu.launch(f, 2, 32, &mut a)? };
    }
    devs.finish("gpu-scope flag ping-pong probe")?;
    let mut ns = [0u64];
    devs.list[0].gpu.download(out.ptr, &mut ns)?;
    m.insert(
        "probe.flag_latency_same_gpu_gpu_scope_ns".into(),
        json!(round3(ns[0] as f64 / iters as f64 / 2.0)),
    );
    ll_send_chain_probe(devs, m, src, dst, big)?;
    Ok(())
}

/// Hidden size, BF16 row and FP8 message of the low-latency scenarios on one H200
/// (`scenarios/h200-ep8-ll-*.toml`: hidden 7168, FP8 dispatch with one scale per 128 channels;
/// hw/src/low_latency/mod.rs `msg_stride`).
const LL_HIDDEN: usize = 7168;
const LL_ROW_INT4: i32 = (LL_HIDDEN * 2 / 16) as i32;
const LL_MSG_INT4: i32 = ((16 + LL_HIDDEN + LL_HIDDEN / 128 * 4) / 16) as i32;
const LL_MSG_STRIDE: usize = (16 + LL_HIDDEN + LL_HIDDEN / 128 * 4).div_ceil(128) * 128;
/// EP8, top-8 of 256 experts: one slot counter per (source rank, expert).
const LL_RANKS: usize = 8;
const LL_TOPK: usize = 8;
const LL_EXPERTS: usize = 256;

/// The expert indices of `items` (token, rank) items, ranks interleaved as the kernel deals
/// them (item = token · 8 + rank): top-8 distinct experts, one from each group of 32, drawn
/// with a fixed LCG, as counter indices `rank · 256 + expert`.
fn ll_probe_topk(items: usize) -> Vec<i32> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut out = Vec::with_capacity(items * LL_TOPK);
    for it in 0..items {
        let rank = it % LL_RANKS;
        for k in 0..LL_TOPK {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let e = k * (LL_EXPERTS / LL_TOPK) + (state >> 33) as usize % (LL_EXPERTS / LL_TOPK);
            out.push((rank * LL_EXPERTS + e) as i32);
        }
    }
    out
}

/// The low-latency dispatch's send loop alone (`probe_ll_send`): per (token, rank) item the
/// FP8 cast from HBM, a named barrier, then 8 warps each load an expert index, take a slot with
/// a returning atomic, copy the 7,408-byte message from the staging buffer into the slot and
/// release-add a finish counter; optionally the count-signalling tail. One block alone and
/// every SM together (132 × 1,024 as the kernel runs), at the 128-token scenario's 1,024 items
/// and at 32 rounds per block, and with single steps left out to see what each costs under
/// load. Per shape: the launch (CUDA events, L2 flushed before), the send loop's span and
/// the tail's (%globaltimer), and one sending warp's time per round split into its steps.
fn ll_send_chain_probe(
    devs: &mut Devices,
    m: &mut BTreeMap<String, Value>,
    src: u64,
    dst: u64,
    big: usize,
) -> Result<(), HwError> {
    const CAST: i32 = 1;
    const ATOMIC: i32 = 2;
    const RELEASE: i32 = 4;
    const TAIL: i32 = 8;
    const ALL: i32 = CAST | ATOMIC | RELEASE | TAIL;
    let sms = devs.list[0].gpu.sm_count;
    let rounds = 32usize;
    let max_items = sms as usize * rounds;
    let counters_n = (LL_RANKS * LL_EXPERTS) as i32;
    let g = &devs.list[0].gpu;
    let staging = g.alloc(max_items * LL_MSG_STRIDE)?;
    let topk = g.alloc(max_items * LL_TOPK * 4)?;
    let ctrs = g.alloc(3 * counters_n as usize * 4)?;
    let expect_buf = g.alloc(counters_n as usize * 4)?;
    let out = g.alloc((sms as usize * 9) * 8)?;
    let topk_host = ll_probe_topk(max_items);
    g.upload(&topk, &topk_host)?;
    g.memset_u8(staging.ptr, 0, staging.bytes)?;
    // Every item reads its own row and every message has its own slot (no index wraps).
    if max_items * LL_HIDDEN * 2 > big {
        return Err(HwError::Setup {
            context: "low-latency send chain probe".into(),
            message: format!("{max_items} rows of {} B do not fit {big} B", LL_HIDDEN * 2),
        });
    }
    let slots_per_counter = (big / LL_MSG_STRIDE / counters_n as usize) as i32;
    // The full chain first: the variants without the cast copy the messages it staged.
    let full = format!("{sms}x1024");
    // (name, blocks, items, steps, then the receive loop on the messages just sent).
    let shapes: [(String, u32, usize, i32, bool); 7] = [
        ("1x1024".into(), 1, 64, ALL, false),
        (format!("{full}_1024items"), sms, 1024, ALL, true),
        (full.clone(), sms, max_items, ALL, true),
        (format!("{full}_no_atomic"), sms, max_items, ALL & !ATOMIC, false),
        (format!("{full}_no_release"), sms, max_items, ALL & !RELEASE, false),
        (format!("{full}_no_cast"), sms, max_items, ALL & !CAST, false),
        (format!("{full}_copy_only"), sms, max_items, 0, false),
    ];
    let mut res = serde_json::Map::new();
    for (name, blocks, items, mode, with_recv) in shapes {
        let mut expect = vec![0i32; counters_n as usize];
        for &e in &topk_host[..items * LL_TOPK] {
            expect[e as usize] += 1;
        }
        {
            let g = &devs.list[0].gpu;
            g.upload(&expect_buf, &expect)?;
            g.memset_u8(ctrs.ptr, 0, ctrs.bytes)?;
        }
        devs.clear_errors()?;
        let (x, st, rv, tk) = (src, staging.ptr, dst, topk.ptr);
        let (counters, finish, flags) =
            (ctrs.ptr, ctrs.ptr + counters_n as u64 * 4, ctrs.ptr + 2 * counters_n as u64 * 4);
        let (ex, o, err, to) = (expect_buf.ptr, out.ptr, devs.list[0].err.ptr, devs.timeout_ns());
        let (row_int4, msg_int4, msg_bytes) = (LL_ROW_INT4, LL_MSG_INT4, LL_MSG_STRIDE as i32);
        let (topk_n, items_i) = (LL_TOPK as i32, items as i32);
        let mut launch_no = 0i32;
        let launch = |dev: &Device| {
            let f = dev.module("probes")?.function("probe_ll_send");
            launch_no += 1;
            let mut a = kernel_args![
                x,
                st,
                rv,
                tk,
                counters,
                finish,
                flags,
                ex,
                row_int4,
                msg_int4,
                msg_bytes,
                topk_n,
                counters_n,
                items_i,
                slots_per_counter,
                mode,
                launch_no,
                o,
                err,
                to
            ];
            // SAFETY: items ≤ max_items staged messages, topk rows and x rows (asserted to fit
            // the `big`-byte src); recv slots are < counters_n × slots_per_counter, inside the
            // `big`-byte dst; expert indices are < counters_n, the size of counters, finish,
            // flags and expect; out
            // holds 9 words per block; every block is resident (one 1,024-thread block per SM
            // at most), so the tail's polls wait only on running blocks.
            unsafe { dev.gpu.launch(f, blocks, 1024, &mut a) }
        };
        let us = time_us(devs, 0, 5, launch)?;
        devs.finish("low-latency send chain probe")?;
        let mut words = vec![0u64; blocks as usize * 9];
        devs.list[0].gpu.download(out.ptr, &mut words)?;
        let (per_block, cycles) = words.split_at(blocks as usize * 8);
        let start = per_block.chunks(8).map(|b| b[5]).min().unwrap_or(0);
        let loop_end = per_block.chunks(8).map(|b| b[6]).max().unwrap_or(0);
        let tail_end = per_block.chunks(8).map(|b| b[7]).max().unwrap_or(0);
        // Per block: ns per round and each step's share, cycles converted with the block's
        // own loop (clock64 cycles against %globaltimer ns); means over blocks.
        let mut steps = [0f64; 5];
        let mut counted = 0f64;
        for (b, c) in per_block.chunks(8).zip(cycles) {
            if b[0] == 0 || *c == 0 {
                continue;
            }
            let ns_per_cycle = (b[6] - b[5]) as f64 / *c as f64;
            let r = b[0] as f64;
            steps[0] += (b[6] - b[5]) as f64 / r;
            for k in 1..5 {
                steps[k] += b[k] as f64 * ns_per_cycle / r;
            }
            counted += 1.0;
        }
        let mean = |v: f64| round3(v / counted.max(1.0));
        res.insert(
            name.clone(),
            json!({
                "launch_us": round3(us),
                "loop_us": round3(loop_end.saturating_sub(start) as f64 / 1e3),
                "tail_us": round3(tail_end.saturating_sub(loop_end) as f64 / 1e3),
                "ns_per_round": mean(steps[0]),
                "cast_barrier_ns": mean(steps[1]),
                "index_atomic_ns": mean(steps[2]),
                "copy_ns": mean(steps[3]),
                "release_loop_ns": mean(steps[4]),
            }),
        );
        if with_recv {
            // The kernel's receive (every step), and at the low-latency 128-token item count
            // the same with steps left out, to tell what each step costs under full load.
            let variants: &[(&str, i32)] = if items == 1024 {
                &[
                    ("", RECV_ALL),
                    ("_no_discard", RECV_ALL & !RECV_DISCARD),
                    ("_no_payload", RECV_ALL & !RECV_PAYLOAD),
                    ("_no_scales", RECV_ALL & !RECV_SCALES),
                    ("_header_only", RECV_HEADER),
                    ("_polls_only", 0),
                ]
            } else {
                &[("", RECV_ALL)]
            };
            for &(suffix, steps) in variants {
                let r = ll_recv_after_send(
                    devs,
                    LlSendBufs {
                        x: src,
                        staging: staging.ptr,
                        recv: dst,
                        topk: topk.ptr,
                        ctrs: ctrs.ptr,
                    },
                    &expect,
                    blocks,
                    items,
                    slots_per_counter,
                    src + (256 << 20),
                    big - (256 << 20),
                    us,
                    steps,
                )?;
                res.insert(format!("{name}_then_recv{suffix}"), r);
            }
        }
    }
    m.insert("probe.ll_send_chain".into(), Value::Object(res));
    Ok(())
}

/// Device buffers of the send chain probe (one counters region: slot counters, finish
/// counters, count flags, `LL_RANKS · LL_EXPERTS` ints each).
#[derive(Clone, Copy)]
struct LlSendBufs {
    x: u64,
    staging: u64,
    recv: u64,
    topk: u64,
    ctrs: u64,
}

/// The receive loop's steps per message (`LL_RECV_*` in kernels/cuda/probes.cu): the header
/// load, the payload copy, the scale loads, the discard.
const RECV_HEADER: i32 = 1;
const RECV_PAYLOAD: i32 = 2;
const RECV_SCALES: i32 = 4;
const RECV_DISCARD: i32 = 8;
const RECV_ALL: i32 = RECV_HEADER | RECV_PAYLOAD | RECV_SCALES | RECV_DISCARD;

/// The low-latency dispatch's receive loop (`probe_ll_recv`) right after a full send launch
/// (`probe_ll_send`, every step, with the count signalling) of `items` items, as hook mode
/// runs the two kernels: both launches timed together (CUDA events, L2 flushed before), the
/// receive's part as that less `send_us` (the send alone, same shape), the receive launch's
/// own span (%globaltimer), and one receive group's poll and message time per item. `packed`
/// is `packed_bytes` of scratch for the packed rows; `steps` the receive's steps to run
/// (`RECV_*`).
#[allow(clippy::too_many_arguments)]
fn ll_recv_after_send(
    devs: &mut Devices,
    b: LlSendBufs,
    expect: &[i32],
    blocks: u32,
    items: usize,
    slots_per_counter: i32,
    packed: u64,
    packed_bytes: usize,
    send_us: f64,
    steps: i32,
) -> Result<Value, HwError> {
    let local = LL_EXPERTS / LL_RANKS;
    let counters_n = (LL_RANKS * LL_EXPERTS) as i32;
    let payload_int4 = (LL_HIDDEN / 16) as i32;
    let num_scales = (LL_HIDDEN / 128) as i32;
    // Packed rows per local expert: what every source sends it.
    let mut capacity = 0usize;
    for lr in 0..LL_RANKS {
        for le in 0..local {
            let rows: i32 = (0..LL_RANKS).map(|s| expect[s * LL_EXPERTS + lr * local + le]).sum();
            capacity = capacity.max(rows as usize);
        }
    }
    let rows = LL_RANKS * local * capacity;
    if rows * LL_HIDDEN > packed_bytes {
        return Err(HwError::Setup {
            context: "low-latency receive probe".into(),
            message: format!("{rows} packed rows of {LL_HIDDEN} B do not fit {packed_bytes} B"),
        });
    }
    let (side, rout) = {
        let g = &devs.list[0].gpu;
        let side = g.alloc(rows * (LL_HIDDEN / 128 * 4 + 8))?;
        let rout = g.alloc(blocks as usize * 8 * 8)?;
        g.memset_u8(b.ctrs, 0, 3 * counters_n as usize * 4)?;
        (side, rout)
    };
    devs.clear_errors()?;
    let g = &devs.list[0].gpu;
    let expect_buf = g.alloc(counters_n as usize * 4)?;
    g.upload(&expect_buf, expect)?;
    let (counters, finish, flags) =
        (b.ctrs, b.ctrs + counters_n as u64 * 4, b.ctrs + 2 * counters_n as u64 * 4);
    let (scales, info) = (side.ptr, side.ptr + (rows * (LL_HIDDEN / 128 * 4)) as u64);
    let (ex, err, to) = (expect_buf.ptr, devs.list[0].err.ptr, devs.timeout_ns());
    let send_out = g.alloc(blocks as usize * 9 * 8)?;
    let (so, ro) = (send_out.ptr, rout.ptr);
    let (row_int4, msg_int4, msg_bytes) = (LL_ROW_INT4, LL_MSG_INT4, LL_MSG_STRIDE as i32);
    let (topk_n, items_i, mode) = (LL_TOPK as i32, items as i32, 15i32);
    let (ranks, local_i, cap, wpg) = (LL_RANKS as i32, local as i32, capacity as i32, 4i32);
    let mut launch_no = 0i32;
    let both = |dev: &Device| {
        launch_no += 1;
        let f = dev.module("probes")?.function("probe_ll_send");
        let mut a = kernel_args![
            b.x,
            b.staging,
            b.recv,
            b.topk,
            counters,
            finish,
            flags,
            ex,
            row_int4,
            msg_int4,
            msg_bytes,
            topk_n,
            counters_n,
            items_i,
            slots_per_counter,
            mode,
            launch_no,
            so,
            err,
            to
        ];
        // SAFETY: as in ll_send_chain_probe (same buffers, items and grid).
        unsafe { dev.gpu.launch(f, blocks, 1024, &mut a)? };
        let f = dev.module("probes")?.function("probe_ll_recv");
        let mut a = kernel_args![
            b.recv,
            flags,
            packed,
            scales,
            info,
            msg_bytes,
            payload_int4,
            num_scales,
            ranks,
            local_i,
            slots_per_counter,
            cap,
            wpg,
            steps,
            launch_no,
            ro,
            err,
            to
        ];
        // SAFETY: the messages read are the slots the send launch just filled (counter ×
        // slots_per_counter + slot, inside recv); packed rows < LL_RANKS × local × capacity fit
        // `packed_bytes` (checked) and the side buffer holds their scales and two info ints;
        // rout holds 8 words per block; the flags the receive polls were all set by the send
        // launch before it, on the same stream.
        unsafe { dev.gpu.launch(f, blocks, 1024, &mut a) }
    };
    let us = time_us(devs, 0, 5, both)?;
    devs.finish("low-latency receive probe")?;
    let mut words = vec![0u64; blocks as usize * 8];
    devs.list[0].gpu.download(rout.ptr, &mut words)?;
    let start = words.chunks(8).map(|w| w[4]).min().unwrap_or(0);
    let end = words.chunks(8).map(|w| w[5]).max().unwrap_or(0);
    let (mut poll_ns, mut msg_ns, mut n_items, mut n_msgs) = (0f64, 0f64, 0f64, 0f64);
    for w in words.chunks(8) {
        if w[0] == 0 || w[6] == 0 {
            continue;
        }
        let ns_per_cycle = (w[5] - w[4]) as f64 / w[6] as f64;
        poll_ns += w[2] as f64 * ns_per_cycle;
        msg_ns += w[3] as f64 * ns_per_cycle;
        n_items += w[0] as f64;
        n_msgs += w[1] as f64;
    }
    let per_item = |v: f64| round3(v / n_items.max(1.0));
    Ok(json!({
        "launch_us": round3(us),
        "recv_us": round3(us - send_us),
        "recv_loop_us": round3(end.saturating_sub(start) as f64 / 1e3),
        "poll_ns_per_item": per_item(poll_ns),
        "messages_ns_per_item": per_item(msg_ns),
        "messages_per_item": per_item(n_msgs),
    }))
}

/// Peer copy bandwidth and flag latency for every pair of GPUs in use.
fn peer_probes(devs: &mut Devices, m: &mut BTreeMap<String, Value>) -> Result<(), HwError> {
    let bytes = 256usize << 20;
    let mut bw = serde_json::Map::new();
    let mut lat = serde_json::Map::new();
    for a in 0..devs.list.len() {
        for b in 0..devs.list.len() {
            if a == b {
                continue;
            }
            let src = devs.list[a].gpu.alloc(bytes)?;
            let dst = devs.list[b].gpu.alloc(bytes)?;
            devs.list[a].gpu.memset_u32(src.ptr, 0x1234_5678, bytes / 4)?;
            // With peer access enabled and unified addressing, a device-to-device copy on GPU
            // a's stream moves the bytes over the link.
            let (s, t) = (src.ptr, dst.ptr);
            let us = time_us(devs, a, 5, |d| d.gpu.copy_dtod(t, s, bytes))?;
            let key = format!("{}->{}", devs.list[a].gpu.ordinal, devs.list[b].gpu.ordinal);
            bw.insert(key.clone(), json!(round3(bytes as f64 / (us * 1e3))));

            // Ping-pong: each side polls memory on its own GPU.
            let ping = devs.list[b].gpu.alloc(128)?;
            let pong = devs.list[a].gpu.alloc(128)?;
            let out = devs.list[a].gpu.alloc(8)?;
            devs.list[b].gpu.memset_u8(ping.ptr, 0, 128)?;
            devs.list[a].gpu.memset_u8(pong.ptr, 0, 128)?;
            devs.sync("peer probe setup")?;
            devs.clear_errors()?;
            let iters = 2000i32;
            for (side, idx) in [(1i32, b), (0i32, a)] {
                let d = &devs.list[idx];
                let (pi, po, o, err, to) =
                    (ping.ptr, pong.ptr, out.ptr, d.err.ptr, devs.timeout_ns());
                let f = d.module("probes")?.function("probe_pingpong");
                let mut args = kernel_args![pi, po, side, iters, o, err, to];
                // SAFETY: peer access is enabled between a and b; flags are live.
                unsafe { d.gpu.launch(f, 1, 32, &mut args)? };
            }
            devs.finish("peer flag probe")?;
            let mut ns = [0u64];
            devs.list[a].gpu.download(out.ptr, &mut ns)?;
            lat.insert(key, json!(round3(ns[0] as f64 / iters as f64 / 2.0)));
        }
    }
    m.insert("probe.peer_copy_bw_gbps".into(), Value::Object(bw));
    m.insert("probe.flag_latency_peer_ns".into(), Value::Object(lat));
    Ok(())
}

pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// The NCCL all-to-all baseline on the same data: every (source, destination) rank pair sends
/// `rows[s][d] · row_bytes` bytes with grouped `ncclSend`/`ncclRecv`. NCCL refuses two ranks of
/// one communicator on one GPU, so co-located ranks' chunks travel within their GPU's single
/// communicator rank (a send to itself); across GPUs they go to the peer's rank.
pub fn nccl_alltoall(
    devs: &mut Devices,
    comms: &crate::nccl::Comms,
    gpu_of_rank: &[u32],
    rows: &[Vec<u64>],
    row_bytes: u64,
) -> Result<(f64, u64), HwError> {
    let n = rows.len();
    let idx_of = |gpu: u32| {
        devs.list
            .iter()
            .position(|d| d.gpu.ordinal == gpu as usize)
            .expect("rank GPU is in the placement")
    };
    // Per rank: one send buffer (its chunks to every destination) and one receive buffer.
    let mut send = Vec::with_capacity(n);
    let mut recv = Vec::with_capacity(n);
    for r in 0..n {
        let g = &devs.list[idx_of(gpu_of_rank[r])].gpu;
        let out: u64 = rows[r].iter().sum::<u64>() * row_bytes;
        let inn: u64 = rows.iter().map(|row| row[r]).sum::<u64>() * row_bytes;
        let s = g.alloc(out as usize)?;
        g.memset_u32(s.ptr, 0x5a5a_1234, s.bytes / 4)?;
        send.push(s);
        recv.push(g.alloc(inn as usize)?);
    }
    let mut pairs = Vec::new();
    let mut recv_off = vec![0u64; n];
    for s in 0..n {
        let mut send_off = 0u64;
        for d in 0..n {
            let bytes = rows[s][d] * row_bytes;
            if bytes > 0 {
                pairs.push(crate::nccl::Transfer {
                    src_comm: idx_of(gpu_of_rank[s]),
                    dst_comm: idx_of(gpu_of_rank[d]),
                    send_ptr: send[s].ptr + send_off,
                    recv_ptr: recv[d].ptr + recv_off[d],
                    bytes,
                });
            }
            send_off += bytes;
            recv_off[d] += bytes;
        }
    }
    let total: u64 = pairs.iter().map(|p| p.bytes).sum();
    let mut samples = Vec::new();
    for rep in 0..11 {
        devs.flush_l2()?;
        let starts: Vec<_> =
            devs.list.iter().map(|d| d.gpu.new_event()).collect::<Result<_, _>>()?;
        let ends: Vec<_> = devs.list.iter().map(|d| d.gpu.new_event()).collect::<Result<_, _>>()?;
        for (d, e) in devs.list.iter().zip(&starts) {
            d.gpu.record(e)?;
        }
        comms.alltoallv(devs, &pairs)?;
        for (d, e) in devs.list.iter().zip(&ends) {
            d.gpu.record(e)?;
        }
        for d in &devs.list {
            d.gpu.wait("NCCL all-to-all baseline", devs.host_timeout_ms, &|| None)?;
        }
        if rep > 0 {
            let mut worst = 0f64;
            for (a, b) in starts.iter().zip(&ends) {
                worst = worst.max(a.elapsed_ms(b)? as f64 * 1e3);
            }
            samples.push(worst);
        }
    }
    Ok((median(samples), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_nothing_say_none() {
        assert_eq!(percentiles(&mut []), "none");
        assert_eq!(percentiles(&mut [3.0, 1.0, 2.0]), "min 1.0 p10 1.0 p50 2.0 p90 3.0 max 3.0");
    }

    #[test]
    fn median_of_samples() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }

    #[test]
    fn ll_probe_routing_is_top8_of_the_items_rank() {
        let items = 1024;
        let topk = ll_probe_topk(items);
        assert_eq!(topk.len(), items * LL_TOPK);
        for (it, row) in topk.chunks(LL_TOPK).enumerate() {
            let rank = it % LL_RANKS;
            let mut experts: Vec<usize> =
                row.iter().map(|&c| c as usize - rank * LL_EXPERTS).collect();
            assert!(experts.iter().all(|&e| e < LL_EXPERTS), "item {it}: {row:?}");
            experts.sort_unstable();
            experts.dedup();
            assert_eq!(experts.len(), LL_TOPK, "item {it}: distinct experts");
        }
        // The message stride the kernels use (hw/src/low_latency/mod.rs), and the probe's sizes.
        assert_eq!(LL_MSG_STRIDE as u64, crate::low_latency::msg_stride(LL_HIDDEN as u32, true));
        assert_eq!(LL_MSG_INT4 * 16, 16 + 7168 + 224);
        assert_eq!(LL_ROW_INT4, 896);
    }
}
