//! The ring handoff through thread-block-cluster shared memory (`kernels/cuda/cluster.cu`):
//! how fast DeepEP's two-copy intranode handoff (source → ring slot → output) can go on one GPU
//! when the ring slots live in the receiving block's shared memory instead of global memory, so
//! that only the input read and the output write touch L2 and HBM. Opt-in
//! (`EPTWIN_CLUSTER_PROBE=1`, sm_90 or newer): the design probe of the cluster kernels
//! (`intranode_cluster.cu`) and where the simulator's model of them takes its rates and chain
//! latencies from (docs/calibration.md, "h200-single").
//!
//! Two kernels: warps copy each chunk through registers into the peer block's shared memory, or
//! one thread per ring issues TMA bulk copies (global → peer shared memory with the consumer's
//! mbarrier counting the bytes; shared memory → global for the output). Each configuration
//! copies ≈ 0.94 GB from a 1 GiB source with a distinct pattern per 32-bit word into a 1 GiB
//! output; after the timed launches the whole output range is downloaded and
//! compared word for word with the source, so a figure is only reported for a handoff that
//! delivered every byte to its place.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::error::HwError;
use crate::exec::Devices;
use crate::kernel_args;
use crate::probes::{round3, time_us};

const BUFFER_BYTES: usize = 1 << 30;

/// One probe configuration: the module (compiled with `CL_THREADS = threads`), clusters of 8
/// blocks in the grid, ring slots per (source, producer warp).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeShape {
    /// `probe_cluster_handoff` (warps copy through registers) or `probe_cluster_tma_handoff`
    /// (bulk async copies).
    pub kernel: &'static str,
    pub module: &'static str,
    pub threads: u32,
    pub clusters: u32,
    pub slots: u32,
    /// Bytes per handed-over chunk (7,168: one FP8 row of the normal kernels).
    pub chunk_bytes: u32,
}

pub const CLUSTER_SIZE: u32 = 8;

/// Module names and their `CL_THREADS` (the lib compiles each with these defines).
pub const MODULES: [(&str, u32); 2] = [("cluster_512", 512), ("cluster_1024", 1024)];

impl ProbeShape {
    fn producers_per_block(&self) -> u32 {
        self.threads / 32 / 2
    }

    fn tma(&self) -> bool {
        self.kernel == "probe_cluster_tma_handoff"
    }

    /// Dynamic shared memory: the rings, then a tail and a head flag per ring (warp copies) or
    /// an 8-byte mbarrier per slot and a head flag per ring (bulk copies).
    pub fn smem_bytes(&self) -> u32 {
        let rings = self.producers_per_block();
        let flags = if self.tma() { rings * self.slots * 8 + rings * 4 } else { 2 * rings * 4 };
        rings * self.slots * self.chunk_bytes + flags
    }

    fn key(&self) -> String {
        let kind = if self.tma() { "tma_" } else { "" };
        let blocks = self.clusters * CLUSTER_SIZE;
        let (t, c, n, b) = (self.threads, self.clusters, self.slots, self.chunk_bytes);
        format!("{kind}{blocks}x{t}_{c}cl_{n}x{b}B")
    }
}

/// The configurations measured. One block per SM holds at most 16 clusters of 8 blocks at once
/// on 132 SMs (the rings fill shared memory); more clusters run as later waves.
pub fn shapes() -> Vec<ProbeShape> {
    let warp = |module, threads, clusters, slots| ProbeShape {
        kernel: "probe_cluster_handoff",
        module,
        threads,
        clusters,
        slots,
        chunk_bytes: 7168,
    };
    let tma = |module, threads, clusters, slots, chunk_bytes| ProbeShape {
        kernel: "probe_cluster_tma_handoff",
        module,
        threads,
        clusters,
        slots,
        chunk_bytes,
    };
    vec![
        warp("cluster_512", 512, 16, 2),
        warp("cluster_1024", 1024, 16, 2),
        warp("cluster_1024", 1024, 32, 2),
        tma("cluster_512", 512, 16, 4, 7168),
        tma("cluster_512", 512, 32, 4, 7168),
        tma("cluster_512", 512, 64, 4, 7168),
        tma("cluster_512", 512, 128, 4, 7168),
        tma("cluster_512", 512, 64, 8, 3584),
        tma("cluster_512", 512, 64, 2, 14336),
        tma("cluster_512", 512, 128, 2, 14336),
        tma("cluster_1024", 1024, 64, 2, 7168),
        // One cluster alone (no other SM touches memory): the per-chunk chain with one slot
        // (no pipelining), and one pair's pipelined rate with the kernels' slot shapes (3 FP8
        // dispatch slots of 7,472 B, 2 BF16 combine slots of 14,368 B).
        tma("cluster_512", 512, 1, 1, 7168),
        tma("cluster_512", 512, 1, 4, 7168),
        tma("cluster_512", 512, 1, 3, 7472),
        tma("cluster_512", 512, 1, 2, 14368),
    ]
}

/// The shapes of the kinds named in `EPTWIN_CLUSTER_PROBE_ONLY` (`warp` or `tma`; both when
/// unset): a kernel that faults takes the context down, so kinds can run in separate processes.
fn selected(fit: u32) -> Vec<ProbeShape> {
    let only = std::env::var("EPTWIN_CLUSTER_PROBE_ONLY").unwrap_or_default();
    let kind = |s: &ProbeShape| if s.tma() { "tma" } else { "warp" };
    let mut v = shapes();
    v.extend(waves(fit));
    v.extend(kernel_slots(fit));
    v.into_iter().filter(|s| only.is_empty() || only.split(',').any(|k| k == kind(s))).collect()
}

/// One whole wave with the normal cluster kernels' slot shapes (dispatch 3 x 7,472 B, combine
/// 2 x 14,368 B per source).
fn kernel_slots(fit: u32) -> Vec<ProbeShape> {
    [(3, 7472), (2, 14368)]
        .into_iter()
        .map(|(slots, chunk_bytes)| ProbeShape {
            kernel: "probe_cluster_tma_handoff",
            module: "cluster_512",
            threads: 512,
            clusters: fit.max(1),
            slots,
            chunk_bytes,
        })
        .collect()
}

/// The TMA handoff with whole waves: `fit` (the clusters resident at once) times 1, 2, 4, 8.
fn waves(fit: u32) -> Vec<ProbeShape> {
    let mut v = Vec::new();
    for (slots, chunk_bytes) in [(4, 7168), (2, 14336)] {
        for waves in [1, 2, 4, 8] {
            v.push(ProbeShape {
                kernel: "probe_cluster_tma_handoff",
                module: "cluster_512",
                threads: 512,
                clusters: fit.max(1) * waves,
                slots,
                chunk_bytes,
            });
        }
    }
    v
}

/// Chunks each producer warp hands over so that a launch moves about 0.94 GB.
fn chunks_per_warp(s: &ProbeShape) -> u32 {
    let warps = s.clusters * CLUSTER_SIZE * s.producers_per_block();
    ((BUFFER_BYTES as u64 * 7 / 8) / (warps as u64 * s.chunk_bytes as u64)) as u32
}

/// Measure every shape on the first GPU; `probe.cluster_handoff_bw_gbps` (bytes handed over per
/// second) and the check's outcome per shape.
pub fn run(devs: &mut Devices) -> Result<BTreeMap<String, Value>, HwError> {
    let mut m = BTreeMap::new();
    let words = BUFFER_BYTES / 4;
    let pattern: Vec<u32> =
        (0..words as u32).map(|i| i.wrapping_mul(0x9e37_79b1) ^ 0x5bd1_e995).collect();
    let (src, dst) = {
        let g = &devs.list[0].gpu;
        let src = g.alloc(BUFFER_BYTES)?;
        g.upload(&src, &pattern)?;
        (src, g.alloc(BUFFER_BYTES)?)
    };
    let mut bw = serde_json::Map::new();
    let mut checks = serde_json::Map::new();
    let mut out = vec![0u32; words];
    // Clusters of the bulk-copy kernel that fit at once (the same for both chunk sizes: one
    // block per SM either way).
    let fit = {
        let d = &devs.list[0];
        let probe = waves(1)[0];
        let f = d.module(probe.module)?.function(probe.kernel);
        d.gpu.set_max_dynamic_smem(f, probe.smem_bytes())?;
        d.gpu.max_active_clusters(f, CLUSTER_SIZE, probe.threads, probe.smem_bytes())?
    };
    m.insert("probe.cluster_handoff_max_active_clusters".into(), json!(fit));
    for s in selected(fit) {
        let cpw = chunks_per_warp(&s);
        let resident;
        let chunk_int4 = (s.chunk_bytes / 16) as i32;
        let total_chunks = (BUFFER_BYTES / s.chunk_bytes as usize) as u64;
        let smem = s.smem_bytes();
        {
            let d = &devs.list[0];
            let f = d.module(s.module)?.function(s.kernel);
            d.gpu.set_max_dynamic_smem(f, smem)?;
            d.gpu.memset_u32(dst.ptr, 0, words)?;
            // How many clusters run at once: the rest of the grid runs in later waves.
            resident = d.gpu.max_active_clusters(f, s.clusters * CLUSTER_SIZE, s.threads, smem)?;
        }
        devs.clear_errors()?;
        let (sp, dp, slots, cpw_i) = (src.ptr, dst.ptr, s.slots as i32, cpw as i32);
        let (err, to) = (devs.list[0].err.ptr, devs.timeout_ns());
        let blocks = s.clusters * CLUSTER_SIZE;
        let launch = |dev: &crate::exec::Device| {
            let f = dev.module(s.module)?.function(s.kernel);
            let mut a =
                kernel_args![sp, dp, chunk_int4, cpw_i, slots, total_chunks, total_chunks, err, to];
            // SAFETY: every chunk index is < total_chunks (the launch covers 7/8 of the 1 GiB
            // buffers without wrapping); the dynamic shared memory is what the kernel's layout
            // needs for `slots` (smem_bytes) and the function was allowed that much above.
            unsafe { dev.gpu.launch_with_smem(f, blocks, s.threads, smem, &mut a) }
        };
        let us = time_us(devs, 0, 5, launch)?;
        devs.finish("cluster handoff probe")?;
        let moved =
            blocks as u64 * s.producers_per_block() as u64 * cpw as u64 * s.chunk_bytes as u64;
        devs.list[0].gpu.download(dst.ptr, &mut out)?;
        let moved_words = (moved / 4) as usize;
        let wrong = out[..moved_words].iter().zip(&pattern).filter(|(a, b)| a != b).count();
        bw.insert(s.key(), json!(round3(moved as f64 / (us * 1e3))));
        checks.insert(
            s.key(),
            json!({
                "bytes": moved,
                "wrong_words": wrong,
                "kernel_us": round3(us),
                "smem_bytes": smem,
                "max_active_clusters": resident,
            }),
        );
        eprintln!(
            "eptwin hw: cluster handoff {}: {:.1} GB/s ({} bytes in {:.1} us, {} wrong words, \
             {} clusters resident at once)",
            s.key(),
            moved as f64 / (us * 1e3),
            moved,
            us,
            wrong,
            resident
        );
    }
    m.insert("probe.cluster_handoff_bw_gbps".into(), Value::Object(bw));
    m.insert("probe.cluster_handoff_checks".into(), Value::Object(checks));
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_fits_shared_memory_and_the_buffers() {
        for s in shapes().into_iter().chain(waves(16)).chain(waves(0)).chain(kernel_slots(15)) {
            // 227 KiB of dynamic shared memory per block on sm_90.
            assert!(s.smem_bytes() <= 232_448, "{s:?}: {} bytes", s.smem_bytes());
            let warps = s.clusters * CLUSTER_SIZE * s.producers_per_block();
            let bytes = warps as u64 * chunks_per_warp(&s) as u64 * s.chunk_bytes as u64;
            assert!(bytes <= BUFFER_BYTES as u64, "{s:?}");
            assert!(bytes >= BUFFER_BYTES as u64 * 3 / 4, "{s:?}");
            assert_eq!(s.chunk_bytes % 16, 0, "bulk copies move multiples of 16 bytes");
            assert!(MODULES.iter().any(|&(m, t)| m == s.module && t == s.threads));
        }
    }
}
