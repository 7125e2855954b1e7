//! Calibration probes and ceilings, measured in the same run as the scenario: device-to-device
//! `cuMemcpy` bandwidth (the ceiling of a copy-bound dispatch/combine on one GPU), small-copy
//! latency, a 16-byte-vector copy kernel at several block counts (per-SM copy rate), kernel
//! launch overhead, flag round-trip latency (this module); what the L2 flush costs an op
//! (`flush`); the one-GPU memory model's probes (`memory`, with the low-latency send and
//! receive loops in `ll_send`); peer copies when several GPUs are in use (`peer`); and the
//! opt-in cluster probes (`cluster`). Each fills its fields of [`Probes`].
//!
//! Figures are medians of CUDA-event-timed repetitions, each after an L2 flush.

pub mod cluster;
mod flush;
mod ll_send;
mod memory;
mod peer;

use std::collections::BTreeMap;

use crate::cuda::DeviceBuffer;
use crate::error::HwError;
use crate::exec::{Device, Devices};
use crate::kernel_args;
use crate::measurements::{Probes, round3};

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
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

/// Two 1 GiB buffers on the first GPU the probes copy between (the source holds a pattern).
struct Buffers {
    src: DeviceBuffer,
    dst: DeviceBuffer,
    bytes: usize,
}

impl Buffers {
    /// Device addresses of the source and destination, and their size.
    fn spans(&self) -> (u64, u64, usize) {
        (self.src.ptr, self.dst.ptr, self.bytes)
    }
}

/// Run every probe on the placement's GPUs, filling their fields of `p`.
pub fn run(devs: &mut Devices, p: &mut Probes) -> Result<(), HwError> {
    let bytes = 1usize << 30;
    let b = {
        let g = &devs.list[0].gpu;
        let (src, dst) = (g.alloc(bytes)?, g.alloc(bytes)?);
        // Never time on zeros: fill the source with a pattern.
        g.memset_u32(src.ptr, 0x3c5a_a5c3, bytes / 4)?;
        g.memset_u32(dst.ptr, 0, bytes / 4)?;
        Buffers { src, dst, bytes }
    };
    memcpy(devs, &b, p)?;
    copy_kernel(devs, &b, p)?;
    launches(devs, p)?;
    flag_pingpong(devs, p)?;
    flush::writeback(devs, &b, p)?;
    memory::probes(devs, &b, p)?;
    if devs.list.len() > 1 {
        peer::probes(devs, p)?;
    }
    Ok(())
}

/// `cuMemcpy` device-to-device at several sizes.
fn memcpy(devs: &mut Devices, b: &Buffers, p: &mut Probes) -> Result<(), HwError> {
    let mut by_size = BTreeMap::new();
    let (mut copy_1g_us, mut small_us) = (0.0, 0.0);
    let (src, dst) = (b.src.ptr, b.dst.ptr);
    for bytes in [4096usize, 65_536, 1 << 20, 16 << 20, 256 << 20, 1 << 30] {
        let reps = if bytes >= 256 << 20 { 10 } else { 20 };
        let us = time_us(devs, 0, reps, |d| d.gpu.copy_dtod(dst, src, bytes))?;
        by_size.insert(bytes.to_string(), round3(us));
        if bytes == 1 << 30 {
            copy_1g_us = us;
        }
        if bytes == 4096 {
            small_us = us;
        }
    }
    let memcpy_gbps = b.bytes as f64 / (copy_1g_us * 1e3);
    p.memcpy_dtod_bw_gbps = Some(round3(memcpy_gbps));
    p.memcpy_dtod_read_write_bw_gbps = Some(round3(2.0 * memcpy_gbps));
    p.memcpy_dtod_us_by_bytes = Some(by_size);
    p.memcpy_small_4kib_latency_us = Some(round3(small_us));
    Ok(())
}

/// The copy kernel, full grid and a sweep of block counts (1024 threads per block).
fn copy_kernel(devs: &mut Devices, b: &Buffers, p: &mut Probes) -> Result<(), HwError> {
    let sm_count = devs.list[0].gpu.sm_count;
    let copy_bytes = 256usize << 20;
    let n_int4 = (copy_bytes / 16) as u64;
    let mut by_blocks = BTreeMap::new();
    let mut per_sm = 0.0;
    let occupancy = devs.list[0].occupancy("probes", &["probe_copy"], 1024)?.max(1);
    let full = sm_count * occupancy;
    let mut blocks_list = vec![1u32, 2, 4, 8, 16, 32, sm_count / 2, sm_count, full];
    blocks_list.dedup();
    for blocks in blocks_list {
        let (s, t) = (b.src.ptr, b.dst.ptr);
        let us = time_us(devs, 0, 5, |d| {
            let f = d.module("probes")?.function("probe_copy");
            let mut a = kernel_args![s, t, n_int4];
            // SAFETY: both buffers hold n_int4 int4.
            unsafe { d.gpu.launch(f, blocks, 1024, &mut a) }
        })?;
        let gbps = copy_bytes as f64 / (us * 1e3);
        by_blocks.insert(blocks.to_string(), round3(gbps));
        if blocks == 1 {
            per_sm = gbps;
        }
        if blocks == full {
            p.copy_kernel_bw_gbps = Some(round3(gbps));
        }
    }
    p.copy_kernel_bw_gbps_by_blocks = Some(by_blocks);
    p.copy_kernel_one_block_bw_gbps = Some(round3(per_sm));
    Ok(())
}

/// Launch overhead: one empty kernel between two events, and 1000 back to back.
fn launches(devs: &mut Devices, p: &mut Probes) -> Result<(), HwError> {
    let empty_us = time_us(devs, 0, 20, |d| {
        let f = d.module("probes")?.function("probe_empty");
        // SAFETY: no parameters.
        unsafe { d.gpu.launch(f, 1, 32, &mut []) }
    })?;
    p.empty_kernel_event_us = Some(round3(empty_us));
    let burst_us = time_us(devs, 0, 3, |d| {
        let f = d.module("probes")?.function("probe_empty");
        for _ in 0..1000 {
            // SAFETY: no parameters.
            unsafe { d.gpu.launch(f, 1, 32, &mut [])? };
        }
        Ok(())
    })?;
    p.launch_interval_us = Some(round3(burst_us / 1000.0));
    Ok(())
}

/// Flag round trip between two blocks of one GPU (release store / acquire poll).
fn flag_pingpong(devs: &mut Devices, p: &mut Probes) -> Result<(), HwError> {
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
    p.flag_roundtrip_same_gpu_ns = Some(round3(rtt));
    p.flag_latency_same_gpu_ns = Some(round3(rtt / 2.0));
    Ok(())
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
}
