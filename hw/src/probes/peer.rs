//! Peer copies and flag latency between the GPUs in use (`probe.peer_copy_bw_gbps`,
//! `probe.flag_latency_peer_ns`), when a placement uses several.

use std::collections::BTreeMap;

use super::time_us;
use crate::error::HwError;
use crate::exec::Devices;
use crate::kernel_args;
use crate::measurements::{Probes, round3};

/// Peer copy bandwidth and flag latency for every pair of GPUs in use.
pub(super) fn probes(devs: &mut Devices, p: &mut Probes) -> Result<(), HwError> {
    let bytes = 256usize << 20;
    let mut bw = BTreeMap::new();
    let mut lat = BTreeMap::new();
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
            bw.insert(key.clone(), round3(bytes as f64 / (us * 1e3)));

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
            lat.insert(key, round3(ns[0] as f64 / iters as f64 / 2.0));
        }
    }
    p.peer_copy_bw_gbps = Some(bw);
    p.flag_latency_peer_ns = Some(lat);
    Ok(())
}
