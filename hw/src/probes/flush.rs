//! What the L2 flush before every timed op costs a short op (`probe.flush_writeback`).

use std::collections::BTreeMap;

use super::{Buffers, median};
use crate::error::HwError;
use crate::exec::{Device, Devices};
use crate::kernel_args;
use crate::measurements::{FlushStates, Probes, round3};

/// Where the L2 stands when an op is timed: what a short op pays for the flush's dirty lines.
/// Every op is timed right after `flush_l2` (a 256 MB memset), whose last L2-full of lines may
/// still be dirty when the op starts; each line the op brings in would then first write one
/// back. The probe times a full-grid copy (new lines: source and destination) and a read
/// (source only) of `bytes` in three states: right after the flush (as every op is timed),
/// after the flush and an untimed read of 256 MB elsewhere (the L2 full of clean lines, the
/// dirty ones written back before the timing), and after the flush and 2 ms idle (whether the
/// L2 writes dirty lines back by itself). After-flush minus after-clean is what the flush's
/// write-backs cost the op.
pub(super) fn writeback(devs: &mut Devices, b: &Buffers, p: &mut Probes) -> Result<(), HwError> {
    let (src, dst, big) = b.spans();
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
    let mut out = BTreeMap::new();
    for mib in [4usize, 8, 16, 32, 64, 128] {
        let bytes = mib << 20;
        for kind in ["copy", "read"] {
            let op = |d: &Device| if kind == "copy" { copy(d, bytes) } else { read(d, src, bytes) };
            let mut states = [0.0; 3];
            for (i, state) in ["after_flush", "after_clean", "after_idle"].into_iter().enumerate() {
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
                states[i] = round3(median(samples));
            }
            let [after_flush_us, after_clean_us, after_idle_us] = states;
            let states = FlushStates { after_flush_us, after_clean_us, after_idle_us };
            out.insert(format!("{kind}_{mib}MiB"), states);
        }
    }
    p.flush_writeback = Some(out);
    Ok(())
}
