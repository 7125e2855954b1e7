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

use eptwin_engine::api::ClusterSlot;
use eptwin_kernels::ModuleId;

use crate::compile::Compiler;
use crate::error::HwError;
use crate::exec::Devices;
use crate::kernel_args;
use crate::kernel_defines;
use crate::measurements::{HandoffCheck, Probes, ReduceCheck, round3};
use crate::probes::time_us;

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
    /// Whether the consumers store each chunk to the output (bulk copies only: without, the
    /// handoff alone is measured and the output is not checked).
    pub store: bool,
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
        let nostore = if self.store { "" } else { "_nostore" };
        format!("{kind}{blocks}x{t}_{c}cl_{n}x{b}B{nostore}")
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
        store: true,
    };
    let tma = |module, threads, clusters, slots, chunk_bytes| ProbeShape {
        kernel: "probe_cluster_tma_handoff",
        module,
        threads,
        clusters,
        slots,
        chunk_bytes,
        store: true,
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

/// The shapes of the kinds named in `only` (`EPTWIN_CLUSTER_PROBE_ONLY`: `warp` or `tma`; both
/// when empty): a kernel that faults takes the context down, so kinds can run in separate
/// processes. `load` selects only the [`load_shapes`] (which `tma` includes).
fn selected(fit: u32, only: &str) -> Vec<ProbeShape> {
    if only == "load" {
        return load_shapes(fit);
    }
    let kind = |s: &ProbeShape| if s.tma() { "tma" } else { "warp" };
    let mut v = shapes();
    v.extend(waves(fit));
    v.extend(kernel_slots(fit));
    v.extend(handoff_only(fit));
    v.extend(load_shapes(fit));
    v.into_iter().filter(|s| only.is_empty() || only.split(',').any(|k| k == kind(s))).collect()
}

/// The handoff as more of the GPU loads memory: 1, 2, 4, 8 clusters and a whole wave
/// (`fit`), every cluster the same. One slot without stores: a pair's period is its refill
/// chain alone (head seen, bulk copy from HBM, landed), so these measure the refill's latency
/// at each load. Four 7,168 B slots without stores: each SM's intake at each load. The
/// combine's 2 × 14,368 B slots with and without stores: its pairs at each load. Shapes the
/// other families already measure are left out.
fn load_shapes(fit: u32) -> Vec<ProbeShape> {
    let fit = fit.max(1);
    let mut counts: Vec<u32> = [1, 2, 4, 8, fit].into_iter().filter(|&k| k <= fit).collect();
    counts.dedup();
    let mut v = Vec::new();
    for k in counts {
        v.push(tma_512(k, 1, 7168, false));
        if k != 1 && k != fit {
            v.push(tma_512(k, 4, 7168, false));
            v.push(tma_512(k, 2, 14368, true));
        }
        if k != fit {
            v.push(tma_512(k, 2, 14368, false));
        }
    }
    v
}

/// A bulk-copy probe shape of the 512-thread module (what every family but `shapes` uses).
fn tma_512(clusters: u32, slots: u32, chunk_bytes: u32, store: bool) -> ProbeShape {
    ProbeShape {
        kernel: "probe_cluster_tma_handoff",
        module: "cluster_512",
        threads: 512,
        clusters,
        slots,
        chunk_bytes,
        store,
    }
}

/// One whole wave with the normal cluster kernels' slot shapes (dispatch 3 x 7,472 B, combine
/// 2 x 14,368 B per source).
fn kernel_slots(fit: u32) -> Vec<ProbeShape> {
    [(3, 7472), (2, 14368)]
        .into_iter()
        .map(|(slots, chunk_bytes)| tma_512(fit.max(1), slots, chunk_bytes, true))
        .collect()
}

/// The handoff without the consumers' stores: one whole wave with the two chunk sizes of
/// `waves` and the combine's slots, and one cluster alone. With stores a whole wave is bound by
/// HBM (every byte read and written once, like a memcpy), which hides the handoff's own rate;
/// without them HBM sees only the reads (docs/calibration.md, "h200-single").
fn handoff_only(fit: u32) -> Vec<ProbeShape> {
    [(fit.max(1), 4, 7168), (fit.max(1), 2, 14336), (fit.max(1), 2, 14368), (1, 4, 7168)]
        .into_iter()
        .map(|(clusters, slots, chunk_bytes)| tma_512(clusters, slots, chunk_bytes, false))
        .collect()
}

/// The TMA handoff with whole waves: `fit` (the clusters resident at once) times 1, 2, 4, 8.
fn waves(fit: u32) -> Vec<ProbeShape> {
    let mut v = Vec::new();
    for (slots, chunk_bytes) in [(4, 7168), (2, 14336)] {
        for waves in [1, 2, 4, 8] {
            v.push(tma_512(fit.max(1) * waves, slots, chunk_bytes, true));
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
fn run(devs: &mut Devices, only: &str, p: &mut Probes) -> Result<(), HwError> {
    let words = BUFFER_BYTES / 4;
    let pattern: Vec<u32> =
        (0..words as u32).map(|i| i.wrapping_mul(0x9e37_79b1) ^ 0x5bd1_e995).collect();
    let (src, dst) = {
        let g = &devs.list[0].gpu;
        let src = g.alloc(BUFFER_BYTES)?;
        g.upload(&src, &pattern)?;
        (src, g.alloc(BUFFER_BYTES)?)
    };
    let mut bw = BTreeMap::new();
    let mut checks = BTreeMap::new();
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
    p.cluster_handoff_max_active_clusters = Some(fit);
    for s in selected(fit, only) {
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
        let store = s.store as i32;
        let launch = |dev: &crate::exec::Device| {
            let f = dev.module(s.module)?.function(s.kernel);
            let mut a = kernel_args![
                sp,
                dp,
                chunk_int4,
                cpw_i,
                slots,
                total_chunks,
                total_chunks,
                err,
                to,
                store
            ];
            // The register-copy kernel has no `store` (it always stores): one argument fewer.
            let a = if s.tma() { &mut a[..] } else { &mut a[..9] };
            // SAFETY: every chunk index is < total_chunks (the launch covers 7/8 of the 1 GiB
            // buffers without wrapping); the dynamic shared memory is what the kernel's layout
            // needs for `slots` (smem_bytes) and the function was allowed that much above.
            unsafe { dev.gpu.launch_with_smem(f, blocks, s.threads, smem, a) }
        };
        let us = time_us(devs, 0, 5, launch)?;
        devs.finish("cluster handoff probe")?;
        let moved =
            blocks as u64 * s.producers_per_block() as u64 * cpw as u64 * s.chunk_bytes as u64;
        // Without stores nothing reaches the output: only the handoff's completion is checked
        // (every consumer saw every chunk land, or the kernel would have timed out).
        let wrong = if s.store {
            devs.list[0].gpu.download(dst.ptr, &mut out)?;
            let moved_words = (moved / 4) as usize;
            Some(out[..moved_words].iter().zip(&pattern).filter(|(a, b)| a != b).count() as u64)
        } else {
            None
        };
        bw.insert(s.key(), round3(moved as f64 / (us * 1e3)));
        checks.insert(
            s.key(),
            HandoffCheck {
                bytes: moved,
                wrong_words: wrong,
                kernel_us: round3(us),
                smem_bytes: smem,
                max_active_clusters: resident,
            },
        );
        tracing::info!(
            "cluster handoff {}: {:.1} GB/s ({} bytes in {:.1} us, {} wrong words, \
             {} clusters resident at once)",
            s.key(),
            moved as f64 / (us * 1e3),
            moved,
            us,
            wrong.map_or("unchecked".to_string(), |w| w.to_string()),
            resident
        );
    }
    p.cluster_handoff_bw_gbps = Some(bw);
    p.cluster_handoff_checks = Some(checks);
    Ok(())
}

/// The cluster probes (`EPTWIN_CLUSTER_PROBE=1`): the handoff shapes `only` selects, the
/// combine's reducer and the launch costs, each module compiled here. Thread-block clusters
/// need sm_90; on an older GPU nothing runs and the log says so. Opt-in, and never gating a
/// run's kernels.
pub fn run_all(
    compiler: &Compiler,
    devs: &mut Devices,
    only: &str,
    p: &mut Probes,
) -> Result<(), HwError> {
    if devs.list[0].gpu.compute_capability.0 < 9 {
        tracing::warn!("EPTWIN_CLUSTER_PROBE ignored: thread-block clusters need sm_90");
        return Ok(());
    }
    for (name, threads) in MODULES {
        compiler.load(devs, ModuleId::Cluster, name, &kernel_defines::cluster(threads))?;
    }
    run(devs, only, p)?;
    let defines = vec![("NUM_RANKS", REDUCE_RANKS.to_string())];
    compiler.load(devs, ModuleId::IntranodeCluster, REDUCE_MODULE, &defines)?;
    run_reduce(devs, p)?;
    run_launch(devs, p)
}

/// Module name of the reducer probe: `intranode_cluster.cu` compiled for 8 ranks (the combine
/// block's shape at EP8).
pub const REDUCE_MODULE: &str = "intranode_cluster_probe";
pub const REDUCE_RANKS: u32 = 8;
/// Threads of a combine block at 8 ranks (`kCombineClusterThreads = 4 · NUM_RANKS · 32`).
const REDUCE_THREADS: u32 = 4 * REDUCE_RANKS * 32;
/// Tokens each block reduces per launch.
const REDUCE_TOKENS: u32 = 64;
/// Sources per token measured (the combine's tokens visit 1..=8 ranks; ≈ 5.3 on average for
/// uniform top-8 routing over 8 ranks).
pub const REDUCE_SOURCES: [u32; 4] = [1, 2, 4, 8];

/// The shared memory of a combine block at hidden `hidden`, top-k `topk`, `slots` per source:
/// rows and weights, the mbarriers and heads the probe leaves unused (the combine kernel's
/// layout, engine `cluster_ring`).
fn combine_slot_bytes() -> u64 {
    ClusterSlot::combine(7168, 8).expect("the probe's shape moves in bulk").slot_bytes
}

fn reduce_smem_bytes(hidden: u32, topk: u32, slots: u32) -> u32 {
    let slot = ClusterSlot::combine(hidden, topk).expect("the probe's shape moves in bulk");
    slot.smem_bytes(REDUCE_RANKS, slots) as u32
}

/// The combine's reduction alone (`probe_cluster_reduce`): per token, `k` partial rows already
/// in shared memory reduced by a combine block's reducer threads into an output row, on one
/// block and on a block per SM at once. `probe.cluster_reduce_ns_per_token` (median over blocks
/// of the kernel's own timer, per token) and the check that every output element and weight is
/// the exact sum `k (k + 1) / 2`.
fn run_reduce(devs: &mut Devices, p: &mut Probes) -> Result<(), HwError> {
    // The EP8 DeepSeek shape of the committed scenarios: BF16 rows of hidden 7,168, top-8, two
    // slots per source (what fits a block's shared memory: hw/src/normal/rings.rs
    // cluster_shape).
    let (hidden, topk, slots) = (7168u32, 8u32, 2u32);
    let hidden_int4 = (hidden * 2 / 16) as i32;
    let smem = reduce_smem_bytes(hidden, topk, slots);
    let sm_count = devs.list[0].gpu.sm_count;
    let max_rows = (sm_count * REDUCE_TOKENS) as usize;
    let row_bytes = hidden as usize * 2;
    let (out, out_w, ns) = {
        let g = &devs.list[0].gpu;
        (
            g.alloc(max_rows * row_bytes)?,
            g.alloc(max_rows * topk as usize * 4)?,
            g.alloc(sm_count as usize * 8)?,
        )
    };
    let mut per_token = BTreeMap::new();
    let mut checks = BTreeMap::new();
    for blocks in [1, sm_count] {
        for k in REDUCE_SOURCES {
            let rows = (blocks * REDUCE_TOKENS) as usize;
            {
                let d = &devs.list[0];
                let f = d.module(REDUCE_MODULE)?.function("probe_cluster_reduce");
                d.gpu.set_max_dynamic_smem(f, smem)?;
                d.gpu.memset_u32(out.ptr, 0, rows * row_bytes / 4)?;
                d.gpu.memset_u32(out_w.ptr, 0, rows * topk as usize)?;
            }
            let (op, wp, np) = (out.ptr, out_w.ptr, ns.ptr);
            let (topk_i, slots_i, k_i, tokens_i) =
                (topk as i32, slots as i32, k as i32, REDUCE_TOKENS as i32);
            let launch = |dev: &crate::exec::Device| {
                let f = dev.module(REDUCE_MODULE)?.function("probe_cluster_reduce");
                let mut a = kernel_args![op, wp, hidden_int4, topk_i, slots_i, k_i, tokens_i, np];
                // SAFETY: the kernel writes rows [0, blocks · REDUCE_TOKENS) of `out` and
                // `out_w` (allocated for a block per SM) and `blocks` words of `ns`; its
                // dynamic shared memory is the combine block's layout for `slots`, allowed above.
                unsafe { dev.gpu.launch_with_smem(f, blocks, REDUCE_THREADS, smem, &mut a) }
            };
            let us = time_us(devs, 0, 5, launch)?;
            devs.finish("cluster reduce probe")?;
            let g = &devs.list[0].gpu;
            let mut block_ns = vec![0u64; blocks as usize];
            g.download(ns.ptr, &mut block_ns)?;
            block_ns.sort_unstable();
            let ns_per_token = block_ns[block_ns.len() / 2] as f64 / REDUCE_TOKENS as f64;
            // Every element k (k + 1) / 2 in bf16 (exact for k ≤ 8), every weight the same.
            let want = k * (k + 1) / 2;
            let want_bf16 = ((want as f32).to_bits() >> 16) as u16;
            let mut got = vec![0u16; rows * hidden as usize];
            g.download(out.ptr, &mut got)?;
            let mut got_w = vec![0f32; rows * topk as usize];
            g.download(out_w.ptr, &mut got_w)?;
            let wrong = (got.iter().filter(|&&v| v != want_bf16).count()
                + got_w.iter().filter(|&&w| w != want as f32).count())
                as u64;
            let key = format!("{blocks}blk.k{k}");
            per_token.insert(key.clone(), round3(ns_per_token));
            checks.insert(
                key.clone(),
                ReduceCheck {
                    tokens_per_block: REDUCE_TOKENS,
                    kernel_us: round3(us),
                    block_ns_min: block_ns[0],
                    block_ns_max: block_ns[block_ns.len() - 1],
                    wrong_values: wrong,
                },
            );
            tracing::info!(
                "cluster reduce {key}: {ns_per_token:.1} ns per token (median of {blocks} \
                 blocks; launch {us:.1} us; {wrong} wrong values)"
            );
        }
    }
    p.cluster_reduce_ns_per_token = Some(per_token);
    p.cluster_reduce_checks = Some(checks);
    Ok(())
}

/// Clusters of the normal kernels' grid the launch probe times: `num_sms = 30`, one cluster per
/// channel (the committed H200 scenarios).
const LAUNCH_CLUSTERS: u32 = 15;

/// A launch probe shape: its key, kernel, grid, block size and dynamic shared memory (the
/// `_frame` kernel takes the combine's slots per source and slot bytes).
fn launch_shapes(sm_count: u32) -> Vec<(String, &'static str, u32, u32, u32)> {
    let n = REDUCE_RANKS;
    let dispatch = ClusterSlot::dispatch(7168, 8, eptwin_engine::api::Dtype::Fp8)
        .expect("the probe's shape moves in bulk")
        .smem_bytes(n, 3) as u32;
    let combine = reduce_smem_bytes(7168, 8, 2);
    let blocks = LAUNCH_CLUSTERS * n;
    vec![
        ("plain_1x32".into(), "probe_launch_plain", 1, 32, 0),
        (format!("plain_{sm_count}x1024"), "probe_launch_plain", sm_count, 1024, 0),
        (format!("plain_{blocks}x1024_smem{combine}"), "probe_launch_plain", blocks, 1024, combine),
        (
            format!("dispatch_cluster_{blocks}x{}_smem{dispatch}", 2 * n * 32),
            "probe_launch_dispatch_cluster",
            blocks,
            2 * n * 32,
            dispatch,
        ),
        (
            format!("combine_cluster_{blocks}x{REDUCE_THREADS}_smem{combine}"),
            "probe_launch_combine_cluster",
            blocks,
            REDUCE_THREADS,
            combine,
        ),
        (
            format!("combine_cluster_frame_{blocks}x{REDUCE_THREADS}_smem{combine}"),
            "probe_launch_combine_cluster_frame",
            blocks,
            REDUCE_THREADS,
            combine,
        ),
    ]
}

/// What a launch costs as the ops' CUDA events see it, after the same L2 flush
/// (`probe.cluster_launch_us`): empty kernels, with and without the normal cluster kernels'
/// clusters, block size and dynamic shared memory, on their grid (15 clusters of 8 blocks),
/// and a plain one-warp and full-grid launch to hold them against
/// (`probe.empty_kernel_event_us` is the one-warp one of the probes module). Median of 20.
fn run_launch(devs: &mut Devices, p: &mut Probes) -> Result<(), HwError> {
    let sm_count = devs.list[0].gpu.sm_count;
    let mut us_by_shape = BTreeMap::new();
    // The frame kernel's mbarriers lie after the combine's 2 slots per source.
    let (slots, slot_bytes) = (2i32, combine_slot_bytes() as i32);
    for (key, kernel, grid, threads, smem) in launch_shapes(sm_count) {
        {
            let d = &devs.list[0];
            let f = d.module(REDUCE_MODULE)?.function(kernel);
            if smem > 0 {
                d.gpu.set_max_dynamic_smem(f, smem)?;
            }
        }
        let us = time_us(devs, 0, 20, |dev| {
            let f = dev.module(REDUCE_MODULE)?.function(kernel);
            let mut frame = kernel_args![slots, slot_bytes];
            let args: &mut [_] = if kernel.ends_with("_frame") { &mut frame } else { &mut [] };
            // SAFETY: the kernels touch no global memory; the frame kernel's mbarriers lie
            // after 2 slots of `slot_bytes` per source inside the combine's shared memory,
            // allowed above; cluster grids are whole clusters of NUM_RANKS blocks.
            unsafe { dev.gpu.launch_with_smem(f, grid, threads, smem, args) }
        })?;
        tracing::info!("launch {key}: {us:.3} us between the events");
        us_by_shape.insert(key, round3(us));
    }
    p.cluster_launch_us = Some(us_by_shape);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launch_probe_takes_the_normal_kernels_grid_and_shared_memory() {
        let shapes = launch_shapes(132);
        let keys: Vec<&str> = shapes.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(
            keys,
            [
                "plain_1x32",
                "plain_132x1024",
                "plain_120x1024_smem230048",
                "dispatch_cluster_120x512_smem179936",
                "combine_cluster_120x1024_smem230048",
                "combine_cluster_frame_120x1024_smem230048",
            ]
        );
        // The H200 results' hw.cluster_kernels: 179,936 and 230,048 bytes, 512 and 1,024 threads.
        assert_eq!((shapes[3].3, shapes[3].4), (512, 179_936));
        assert_eq!((shapes[4].3, shapes[4].4), (1024, 230_048));
    }

    #[test]
    fn every_shape_fits_shared_memory_and_the_buffers() {
        for s in shapes()
            .into_iter()
            .chain(waves(16))
            .chain(waves(0))
            .chain(kernel_slots(15))
            .chain(handoff_only(15))
            .chain(load_shapes(15))
            .chain(load_shapes(1))
        {
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

    #[test]
    fn load_shapes_step_up_to_the_whole_wave_without_repeats() {
        let v = load_shapes(15);
        let keys: Vec<String> = v.iter().map(|s| s.key()).collect();
        assert!(keys.contains(&"tma_8x512_1cl_1x7168B_nostore".to_string()));
        assert!(keys.contains(&"tma_120x512_15cl_1x7168B_nostore".to_string()));
        assert!(keys.contains(&"tma_64x512_8cl_2x14368B".to_string()));
        // The families measured elsewhere are not measured twice.
        let others: Vec<String> =
            handoff_only(15).iter().chain(&kernel_slots(15)).map(|s| s.key()).collect();
        for k in &keys {
            assert!(!others.contains(k), "{k} is measured by another family");
            assert_eq!(keys.iter().filter(|x| *x == k).count(), 1, "{k} twice");
        }
        assert!(load_shapes(1).iter().all(|s| s.clusters == 1));
    }
}
