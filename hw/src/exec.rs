//! What every op on the hardware shares: the GPUs of a placement with their loaded modules,
//! L2 flushing, the device error records of bounded waits, CUDA-event timing across GPUs,
//! output digests and the failure list of a check.

use std::collections::BTreeMap;

use eptwin_engine::api::OpSample;

use crate::cuda::{DeviceBuffer, Event, Gpu, Module};
use crate::error::{ErrorRecord, HwError};
use crate::kernel_args;
use eptwin_group::GroupWatch;

/// DeepEP's tests flush L2 with a 256 MB memset before every timed call (docs/design.md, DeepEP
/// §17).
pub const L2_FLUSH_BYTES: usize = 256_000_000;

/// One GPU of the placement with its per-GPU state.
pub struct Device {
    pub gpu: Gpu,
    pub flush: DeviceBuffer,
    pub err: DeviceBuffer,
    pub digest: DeviceBuffer,
    /// Loaded modules by name ("layout", "intranode", ...).
    pub modules: BTreeMap<&'static str, Module>,
    /// Job ranks placed on this GPU (consecutive).
    pub ranks: Vec<u32>,
}

impl Device {
    pub fn new(gpu: Gpu, ranks: Vec<u32>) -> Result<Device, HwError> {
        let flush = gpu.alloc(L2_FLUSH_BYTES)?;
        let err = gpu.alloc(std::mem::size_of::<ErrorRecord>())?;
        let digest = gpu.alloc(8)?;
        gpu.memset_u8(err.ptr, 0, err.bytes)?;
        Ok(Device { gpu, flush, err, digest, modules: BTreeMap::new(), ranks })
    }

    pub fn module(&self, name: &str) -> Result<&Module, HwError> {
        self.modules.get(name).ok_or_else(|| HwError::Setup {
            context: format!("GPU {}", self.gpu.ordinal),
            message: format!("module {name} is not loaded"),
        })
    }

    pub fn rank_base(&self) -> u32 {
        self.ranks.first().copied().unwrap_or(0)
    }

    /// Blocks of `threads` resident per SM for every kernel of `kernels` in `module`: the
    /// fewest of them.
    pub fn occupancy(&self, module: &str, kernels: &[&str], threads: u32) -> Result<u32, HwError> {
        let m = self.module(module)?;
        let mut resident = u32::MAX;
        for k in kernels {
            resident = resident.min(self.gpu.occupancy(m.function(k), threads)?);
        }
        Ok(resident)
    }

    /// (registers per thread, local memory bytes per thread): the most any kernel of
    /// `kernels` in `module` uses.
    pub fn resources(&self, module: &str, kernels: &[&str]) -> Result<(i32, i32), HwError> {
        let m = self.module(module)?;
        let (mut registers, mut local) = (0, 0);
        for k in kernels {
            let (r, l) = self.gpu.function_resources(m.function(k))?;
            registers = registers.max(r);
            local = local.max(l);
        }
        Ok((registers, local))
    }
}

/// The device a rank's GPU ordinal names (every rank's GPU is in the placement).
pub(crate) fn dev_of(devs: &mut Devices, gpu: u32) -> &mut Device {
    devs.list
        .iter_mut()
        .find(|d| d.gpu.ordinal == gpu as usize)
        .expect("every rank's GPU is in the placement")
}

pub(crate) fn dev_of_ref(devs: &Devices, gpu: u32) -> &Device {
    devs.list
        .iter()
        .find(|d| d.gpu.ordinal == gpu as usize)
        .expect("every rank's GPU is in the placement")
}

/// What runs on every stream right before a timed launch (`processes::ProcessBarrier` in a
/// multi-process run).
pub trait LaunchBarrier {
    /// Queue the barrier on the streams of `list` (`Devices::list`), each wait bounded by
    /// `timeout_ns`.
    fn launch(&mut self, list: &[Device], timeout_ns: u64) -> Result<(), HwError>;
}

/// The GPUs of one job (this process's, in a multi-process run).
pub struct Devices {
    pub list: Vec<Device>,
    flush_value: u32,
    pub kernel_timeout_ms: u64,
    pub host_timeout_ms: u64,
    /// Multi-process runs: the GPU-side barrier before each timed launch.
    pub barrier: Option<Box<dyn LaunchBarrier>>,
    /// Multi-process runs: stream waits end as soon as the process group has failed.
    pub watch: Option<GroupWatch>,
    /// `EPTWIN_L2_CLEAN=1`: every flush is followed by a read of the flush buffer.
    pub l2_clean: bool,
    /// A straggler's late start before the next timed launch, per device (ns; empty: none);
    /// set by `faults::OpFaults::before_op`, consumed by [`Devices::barrier_before_launch`].
    pub launch_delay_ns: Vec<u64>,
}

impl Devices {
    pub fn new(list: Vec<Device>, kernel_timeout_ms: u64) -> Self {
        // The host waits long enough for every chained bounded wait to give up first.
        let host_timeout_ms = kernel_timeout_ms * 4 + 30_000;
        Devices {
            list,
            flush_value: 0,
            kernel_timeout_ms,
            host_timeout_ms,
            barrier: None,
            watch: None,
            l2_clean: false,
            launch_delay_ns: Vec::new(),
        }
    }

    /// Right before a timed launch: in a multi-process run, every stream waits on the GPU for
    /// every other process's streams (untimed), so launch skew between processes is not
    /// measured and what each process queued before (counter resets, poisoning) is done before
    /// any peer writes. Nothing in a single-process run. Then a straggler's stream waits out
    /// its delay (`fault_delay`), so its CUDA-event start comes after it.
    pub fn barrier_before_launch(&mut self) -> Result<(), HwError> {
        let timeout_ns = self.timeout_ns();
        if let Some(b) = self.barrier.as_mut() {
            b.launch(&self.list, timeout_ns)?;
        }
        delay_launches(&self.list, std::mem::take(&mut self.launch_delay_ns))
    }

    pub fn timeout_ns(&self) -> u64 {
        self.kernel_timeout_ms * 1_000_000
    }

    /// Overwrite 256 MB on every GPU so that the next op starts with a cold L2 (its last
    /// L2-full of lines dirty). With `l2_clean`, then read the 256 MB back in ascending order:
    /// the reads' misses evict the dirty lines first, so the op starts with clean lines only.
    pub fn flush_l2(&mut self) -> Result<(), HwError> {
        self.flush_value = self.flush_value.wrapping_add(0x0101_0101);
        for d in &self.list {
            d.gpu.memset_u32(d.flush.ptr, self.flush_value, L2_FLUSH_BYTES / 4)?;
            if self.l2_clean {
                let f = d.module("probes")?.function("probe_read");
                let (from, n_int4, sink) =
                    (d.flush.ptr, (L2_FLUSH_BYTES / 16) as u64, d.digest.ptr);
                let mut a = kernel_args![from, n_int4, sink];
                // SAFETY: the flush buffer holds L2_FLUSH_BYTES; every word of it is equal, so
                // the reader's xor is 0 and it never writes the (8-byte) digest word.
                unsafe { d.gpu.launch(f, d.gpu.sm_count, 1024, &mut a)? };
            }
        }
        Ok(())
    }

    pub fn clear_errors(&self) -> Result<(), HwError> {
        for d in &self.list {
            d.gpu.memset_u8(d.err.ptr, 0, d.err.bytes)?;
        }
        Ok(())
    }

    /// Wait for every GPU (host watchdog; in a multi-process run also until the group fails),
    /// then turn a device error record into an error.
    pub fn finish(&self, op: &str) -> Result<(), HwError> {
        let group_failed = || self.watch.as_ref().and_then(|w| w.failure()).map(|f| f.to_string());
        for d in &self.list {
            d.gpu.wait(op, self.host_timeout_ms, &group_failed)?;
        }
        for d in &self.list {
            let mut rec = [ErrorRecord::default()];
            d.gpu.download(d.err.ptr, &mut rec)?;
            if rec[0].flag != 0 {
                return Err(HwError::KernelTimeout {
                    op: op.to_string(),
                    what: format!(
                        "GPU {}: {}",
                        d.gpu.ordinal,
                        rec[0].describe(self.kernel_timeout_ms)
                    ),
                });
            }
        }
        Ok(())
    }

    /// Synchronise every GPU (between setup steps).
    pub fn sync(&self, what: &str) -> Result<(), HwError> {
        for d in &self.list {
            d.gpu.synchronize(what)?;
        }
        Ok(())
    }
}

/// CUDA events on every GPU: `mark(name)` records one per GPU; intervals are the maximum over
/// GPUs (every rank's op ends when its slowest kernel does).
pub struct Timer {
    marks: Vec<(String, Vec<Event>)>,
}

impl Timer {
    pub fn start(devs: &Devices) -> Result<Timer, HwError> {
        let mut t = Timer { marks: Vec::new() };
        t.mark(devs, "start")?;
        Ok(t)
    }

    pub fn mark(&mut self, devs: &Devices, name: &str) -> Result<(), HwError> {
        let mut evs = Vec::with_capacity(devs.list.len());
        for d in &devs.list {
            let ev = d.gpu.new_event()?;
            d.gpu.record(&ev)?;
            evs.push(ev);
        }
        self.marks.push((name.to_string(), evs));
        Ok(())
    }

    /// Nanoseconds from mark `from` to mark `to`, maximum over GPUs (after `Devices::finish`).
    pub fn between_ns(&self, from: &str, to: &str) -> Result<f64, HwError> {
        let find = |n: &str| {
            self.marks.iter().find(|(m, _)| m == n).map(|(_, e)| e).ok_or_else(|| HwError::Setup {
                context: "timer".into(),
                message: format!("no mark {n}"),
            })
        };
        let (a, b) = (find(from)?, find(to)?);
        let mut worst = 0f64;
        for (ea, eb) in a.iter().zip(b) {
            worst = worst.max(ea.elapsed_ms(eb)? as f64 * 1e6);
        }
        Ok(worst)
    }
}

/// A region of device memory hashed as rows (see `digest_rows` in testdata.cu).
pub struct DigestRegion {
    pub ptr: u64,
    pub num_rows: u64,
    pub row_words: i32,
    pub row_stride_words: u64,
    /// Optional per-group valid-row counts (device pointer) and rows per group.
    pub row_counts: u64,
    pub rows_per_group: i32,
}

/// The order-independent digest of the regions on one device.
pub fn digest(dev: &Device, regions: &[DigestRegion]) -> Result<u64, HwError> {
    dev.gpu.memset_u8(dev.digest.ptr, 0, 8)?;
    let f = dev.module("testdata")?.function("digest_rows");
    for r in regions {
        if r.num_rows == 0 || r.row_words == 0 {
            continue;
        }
        let out = dev.digest.ptr;
        let mut args = kernel_args![
            r.ptr,
            r.num_rows,
            r.row_words,
            r.row_stride_words,
            r.row_counts,
            r.rows_per_group,
            out
        ];
        // SAFETY: the regions lie inside live allocations of this device (callers).
        unsafe { dev.gpu.launch(f, dev.gpu.sm_count * 4, 256, &mut args)? };
    }
    let mut v = [0u64];
    dev.gpu.download(dev.digest.ptr, &mut v)?;
    Ok(v[0])
}

/// The digest of each rank's regions (`regions_of(rank)`), for every rank on every device of
/// `devs`. The digests of a device's ranks sum (wrapping) to the digest of all their regions.
pub fn digest_ranks(
    devs: &Devices,
    regions_of: impl Fn(u32) -> Vec<DigestRegion>,
) -> Result<BTreeMap<u32, u64>, HwError> {
    let mut out = BTreeMap::new();
    for dev in &devs.list {
        for &r in &dev.ranks {
            out.insert(r, digest(dev, &regions_of(r))?);
        }
    }
    Ok(out)
}

/// Records an iteration's output digest against the reference one (the host-checked
/// iteration's, or the first seen before it: a mismatch means ranks raced) and, for the
/// host-checked iteration, the byte-for-byte check's checks and failures; that iteration's digest
/// becomes the reference from then on.
pub fn record_digest(
    sample: &mut OpSample,
    reference: &mut Option<u64>,
    digest: u64,
    op: &str,
    host_check: Option<(Vec<String>, Vec<String>)>,
) {
    sample.checks.push("output digest equals the host-checked iteration's".into());
    match *reference {
        None => *reference = Some(digest),
        Some(r) if r != digest => sample.failures.push(format!(
            "{op} output digest {digest:#018x} differs from the checked iteration's {r:#018x} \
             (a race between ranks?)"
        )),
        _ => {}
    }
    if let Some((checks, failures)) = host_check {
        sample.checks.extend(checks);
        sample.failures.extend(failures);
        *reference = Some(digest);
    }
}

/// Failures of one check, capped so that a broken kernel does not print a million lines.
#[derive(Debug, Default)]
pub struct Failures {
    pub lines: Vec<String>,
    pub total: u64,
}

impl Failures {
    pub const MAX_LINES: usize = 8;

    pub fn push(&mut self, line: impl FnOnce() -> String) {
        self.total += 1;
        if self.lines.len() < Self::MAX_LINES {
            self.lines.push(line());
        }
    }

    pub fn extend(&mut self, other: Failures) {
        self.total += other.total;
        for l in other.lines {
            if self.lines.len() < Self::MAX_LINES {
                self.lines.push(l);
            }
        }
    }

    pub fn into_lines(self, check: &str) -> Vec<String> {
        let mut out: Vec<String> =
            self.lines.into_iter().map(|l| format!("{check}: {l}")).collect();
        if self.total as usize > out.len() {
            out.push(format!("{check}: {} mismatches in all", self.total));
        }
        out
    }
}

/// Whether two bf16 results agree within bf16 rounding (one unit in the last place of the
/// expected value, plus a little for cancellation).
pub fn bf16_close(got: f32, want: f32, scale: f32) -> bool {
    if got.is_nan() || want.is_nan() {
        return false;
    }
    (got - want).abs() <= want.abs() * (1.0 / 128.0) + scale * 1e-6
}

/// Queue `fault_delay` on the stream of each device whose launch is late (`delays_ns` per
/// device, as `faults::OpFaults::delays_ns` gives; empty or 0: not late).
fn delay_launches(list: &[Device], delays_ns: Vec<u64>) -> Result<(), HwError> {
    for (dev, delay_ns) in list.iter().zip(delays_ns) {
        if delay_ns == 0 {
            continue;
        }
        let f = dev.module("sync")?.function("fault_delay");
        let mut a = kernel_args![delay_ns];
        // SAFETY: args match fault_delay(u64); it touches no memory.
        unsafe { dev.gpu.launch(f, 1, 32, &mut a)? };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use eptwin_engine::api::JobId;
    use eptwin_engine::api::OpKind;

    #[test]
    fn digests_are_checked_against_the_host_checked_iteration() {
        let sample = |i| OpSample::new(JobId(0), OpKind::Dispatch, i, false, 1.0);
        let mut reference = None;
        // A warmup sets the reference; the host-checked iteration replaces it with its own.
        let mut warm = sample(0);
        record_digest(&mut warm, &mut reference, 7, "dispatch", None);
        assert!(warm.failures.is_empty());
        let mut checked = sample(0);
        let host = (vec!["rows match".to_string()], vec!["row 3 differs".to_string()]);
        record_digest(&mut checked, &mut reference, 9, "dispatch", Some(host));
        assert_eq!(reference, Some(9));
        assert_eq!(checked.checks.len(), 2);
        assert!(checked.failures[0].contains("differs from the checked iteration's"));
        assert_eq!(checked.failures[1], "row 3 differs");
        // Later iterations must reproduce the checked digest.
        let mut same = sample(1);
        record_digest(&mut same, &mut reference, 9, "dispatch", None);
        assert!(same.failures.is_empty());
        let mut raced = sample(2);
        record_digest(&mut raced, &mut reference, 8, "combine", None);
        assert!(raced.failures[0].starts_with("combine output digest 0x0000000000000008"));
        assert_eq!(reference, Some(9));
    }

    #[test]
    fn failures_are_capped() {
        let mut f = Failures::default();
        for i in 0..20 {
            f.push(|| format!("row {i}"));
        }
        let lines = f.into_lines("dispatch data");
        assert_eq!(lines.len(), Failures::MAX_LINES + 1);
        assert!(lines.last().unwrap().contains("20 mismatches"));
    }

    #[test]
    fn bf16_tolerance() {
        assert!(bf16_close(1.0, 1.0, 1.0));
        assert!(bf16_close(1.0078125, 1.0, 1.0));
        assert!(!bf16_close(1.03, 1.0, 1.0));
        assert!(!bf16_close(f32::NAN, 1.0, 1.0));
    }
}
