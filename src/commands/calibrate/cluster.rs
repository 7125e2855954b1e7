//! The `cluster_*` keys of `[gpu.memory]`: the simulator's model of the backend's cluster
//! kernels (sim/src/hwkernels/cluster.rs) from the cluster handoff, reducer and launch probes
//! (hw/src/cluster_probe.rs; docs/calibration.md, "h200-single"), solved as there:
//!
//! * one cluster alone, 4 × 7,168 B and 2 × 14,368 B slots (the consumer's stores bind):
//!   `cluster_store_ns` and `cluster_bulk_copy_gbps` from the two chunk sizes;
//! * one slot without stores: a pair's period is its refill, `fill + 7,168 B / bulk`, with one
//!   cluster (`cluster_fill_ns`) and a whole wave (`cluster_fill_wave_ns`);
//! * one cluster without stores, both chunk sizes: each block's intake per chunk,
//!   `cluster_ingest_chunk_ns + b / cluster_sm_ingest_gbps`;
//! * whole waves of at least two slots: `cluster_transfer_l2_ns`, the L2's time per bulk transfer
//!   closest to all of them (least squares on a 1 ps grid up to 3 ns), and
//!   `cluster_handoff_bw_gbps` the fastest wave without stores (a lower bound);
//! * the reducer: `cluster_reduce_ns + k × cluster_reduce_source_ns`, least squares over the k
//!   sources on the block-per-SM shapes; the frame: the launch probe's frame less its empty
//!   kernel.

use std::collections::BTreeMap;

use serde_json::Value;

use super::derive::{MemRates, Probes, cluster_constants};
use super::writer::Measured;

/// One parsed cluster probe shape (`tma_{blocks}x{threads}_{clusters}cl_{slots}x{chunk}B[_nostore]`),
/// its bytes, and its mean time less the launch over every run that measured it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub blocks: f64,
    pub threads: f64,
    pub clusters: f64,
    pub slots: f64,
    pub chunk: f64,
    pub bytes: f64,
    pub store: bool,
    /// Kernel time less the launch, µs.
    pub t_us: f64,
    /// Per chunk a producer warp sends, ns: the pair's period.
    pub pair_ns: f64,
}

fn parse_key(key: &str) -> Option<(f64, f64, f64, f64, f64, bool)> {
    let rest = key.strip_prefix("tma_")?;
    let (rest, store) = match rest.strip_suffix("_nostore") {
        Some(r) => (r, false),
        None => (rest, true),
    };
    let (bt, rest) = rest.split_once('_')?;
    let (blocks, threads) = bt.split_once('x')?;
    let (cl, rest) = rest.split_once("cl_")?;
    let (slots, chunk) = rest.strip_suffix('B')?.split_once('x')?;
    let n = |s: &str| s.parse::<u64>().ok().map(|v| v as f64);
    Some((n(blocks)?, n(threads)?, n(cl)?, n(slots)?, n(chunk)?, store))
}

/// Every checked shape over every cluster probe run, averaged.
pub fn shapes(p: &Probes, launch_us: f64) -> BTreeMap<String, Shape> {
    let mut acc: BTreeMap<String, (f64, Vec<f64>)> = BTreeMap::new();
    for run in p.runs.get("probe.cluster_handoff_checks").into_iter().flatten() {
        for (key, c) in run.as_object().into_iter().flatten() {
            let wrong = c.get("wrong_words").and_then(Value::as_u64);
            let (Some(bytes), Some(us)) = (
                c.get("bytes").and_then(Value::as_f64),
                c.get("kernel_us").and_then(Value::as_f64),
            ) else {
                continue;
            };
            // Shapes without stores are not checked word for word (wrong_words null).
            if wrong.is_some_and(|w| w != 0) || parse_key(key).is_none() {
                continue;
            }
            acc.entry(key.clone()).or_insert((bytes, Vec::new())).1.push(us);
        }
    }
    acc.into_iter()
        .filter_map(|(key, (bytes, us))| {
            let (blocks, threads, clusters, slots, chunk, store) = parse_key(&key)?;
            let warps = blocks * (threads / 64.0).floor();
            let cpw = bytes / (warps * chunk);
            let t_us = us.iter().sum::<f64>() / us.len() as f64 - launch_us;
            let pair_ns = t_us / cpw * 1e3;
            Some((
                key,
                Shape { blocks, threads, clusters, slots, chunk, bytes, store, t_us, pair_ns },
            ))
        })
        .collect()
}

/// The reducer's line over its sources: `reduce + k × per_source` ns.
#[derive(Debug, Clone, PartialEq)]
pub struct ReduceFit {
    pub reduce: f64,
    pub per_source: f64,
    /// (sources, mean ns) of every shape fitted.
    pub points: Vec<(f64, f64)>,
}

/// The reducer's line over the block-per-SM reducer shapes (`{blocks}blk.k{sources}`, the most
/// blocks measured).
pub fn reduce_fit(p: &Probes) -> Option<ReduceFit> {
    let mut acc: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for run in p.runs.get("probe.cluster_reduce_ns_per_token").into_iter().flatten() {
        let Some(m) = run.as_object() else { continue };
        let parsed: Vec<(u64, u64, f64)> = m
            .iter()
            .filter_map(|(key, v)| {
                let (blocks, k) = key.split_once("blk.k")?;
                Some((blocks.parse().ok()?, k.parse().ok()?, v.as_f64()?))
            })
            .collect();
        let most = parsed.iter().map(|x| x.0).max().unwrap_or(0);
        for (blocks, k, ns) in parsed {
            if blocks == most && most > 1 {
                acc.entry(k).or_default().push(ns);
            }
        }
    }
    if acc.len() < 2 {
        return None;
    }
    let pts: Vec<(f64, f64)> =
        acc.iter().map(|(k, v)| (*k as f64, v.iter().sum::<f64>() / v.len() as f64)).collect();
    let n = pts.len() as f64;
    let (mk, mv) =
        (pts.iter().map(|p| p.0).sum::<f64>() / n, pts.iter().map(|p| p.1).sum::<f64>() / n);
    let per = pts.iter().map(|(k, v)| (k - mk) * (v - mv)).sum::<f64>()
        / pts.iter().map(|(k, _)| (k - mk).powi(2)).sum::<f64>();
    Some(ReduceFit { reduce: mv - per * mk, per_source: per, points: pts })
}

/// The cluster kernels' frame beyond their launch, ns (mean over the launch probe's runs).
pub fn frame_ns(p: &Probes) -> Option<(f64, usize)> {
    let mut deltas = Vec::new();
    for run in p.runs.get("probe.cluster_launch_us").into_iter().flatten() {
        let Some(m) = run.as_object() else { continue };
        let frame = m.iter().find(|(k, _)| k.starts_with("combine_cluster_frame_"));
        let empty = m.iter().find(|(k, _)| {
            k.starts_with("combine_cluster_") && !k.starts_with("combine_cluster_frame_")
        });
        if let (Some((_, f)), Some((_, e))) = (frame, empty)
            && let (Some(f), Some(e)) = (f.as_f64(), e.as_f64())
        {
            deltas.push((f - e) * 1e3);
        }
    }
    (!deltas.is_empty()).then(|| (deltas.iter().sum::<f64>() / deltas.len() as f64, deltas.len()))
}

/// The `cluster_*` keys, or none when a shape they are solved from was not measured.
pub fn keys(p: &Probes, mem: &MemRates) -> Vec<Measured> {
    let Some(launch_us) = p.first("empty_kernel_event_us").and_then(Value::as_f64) else {
        return Vec::new();
    };
    let shapes = shapes(p, launch_us);
    let active =
        p.first("cluster_handoff_max_active_clusters").and_then(Value::as_f64).unwrap_or(15.0);
    let wave = format!("tma_{}x512_{}cl", 8.0 * active, active);
    let need = [
        "tma_8x512_1cl_4x7168B".to_string(),
        "tma_8x512_1cl_2x14368B".to_string(),
        "tma_8x512_1cl_1x7168B_nostore".to_string(),
        format!("{wave}_1x7168B_nostore"),
        "tma_8x512_1cl_4x7168B_nostore".to_string(),
        "tma_8x512_1cl_2x14368B_nostore".to_string(),
    ];
    let Some(s) = need.iter().map(|k| shapes.get(k)).collect::<Option<Vec<_>>>() else {
        return Vec::new();
    };
    let Some(ReduceFit { reduce, per_source: reduce_source, points: pts }) = reduce_fit(p) else {
        return Vec::new();
    };
    let (p4, p2, f1, fw) = (s[0].pair_ns, s[1].pair_ns, s[2].pair_ns, s[3].pair_ns);
    let bulk = (14368.0 - 7168.0) / (p2 - p4);
    let store = p4 - 7168.0 / bulk;
    let fill = f1 - 7168.0 / bulk;
    let fill_wave = fw - 7168.0 / bulk;
    let per_block = |s: &Shape| s.pair_ns / (s.threads / 64.0).floor();
    let (i4, i2) = (per_block(s[4]), per_block(s[5]));
    let ingest = (14368.0 - 7168.0) / (i2 - i4);
    let ingest_chunk = i4 - 7168.0 / ingest;
    let waves: Vec<&Shape> = shapes
        .values()
        .filter(|s| (s.clusters / active).fract() == 0.0 && s.clusters >= active && s.slots > 1.0)
        .collect();
    let l2_hbm_us = |s: &Shape| {
        let moved = if s.store { 2.0 * s.bytes } else { s.bytes };
        let l2 = moved / mem.l2 / 1e3 + (moved + mem.flush_dirty) / mem.l2_hbm / 1e3;
        (l2, (moved + mem.flush_dirty) / mem.dram / 1e3)
    };
    let transfers = |s: &Shape| s.bytes / s.chunk * if s.store { 2.0 } else { 1.0 };
    let err = |c_ns: f64| {
        waves
            .iter()
            .map(|s| {
                let (l2, hbm) = l2_hbm_us(s);
                ((l2 + transfers(s) * c_ns / 1e3).max(hbm) - s.t_us).powi(2)
            })
            .sum::<f64>()
    };
    let transfer_l2 = (0..=3000)
        .map(|i| i as f64 / 1000.0)
        .min_by(|a, b| err(*a).total_cmp(&err(*b)))
        .unwrap_or(0.0);
    let handoff =
        waves.iter().filter(|s| !s.store).map(|s| s.bytes / (s.t_us * 1e3)).fold(0.0f64, f64::max);
    let (_, smem) = cluster_constants();
    let m = |key: &str, value: toml::Value, source: String| {
        Measured::new("gpu.memory", key, value, source)
    };
    let f = |v: f64, d: i32| {
        let q = 10f64.powi(d);
        toml::Value::Float((v * q).round() / q)
    };
    let mut out = vec![
        m(
            "cluster_fill_ns",
            f(fill, 0),
            format!("{}: {:.3} us per chunk - 7,168 B / {bulk:.2} GB/s", need[2], f1 / 1e3),
        ),
        m(
            "cluster_fill_wave_ns",
            f(fill_wave, 0),
            format!("{}: {:.3} us per chunk - 7,168 B / {bulk:.2} GB/s", need[3], fw / 1e3),
        ),
        m(
            "cluster_bulk_copy_gbps",
            f(bulk, 2),
            format!(
                "(14,368 - 7,168) B / ({:.3} - {:.3}) us, {} and {}",
                p2 / 1e3,
                p4 / 1e3,
                need[1],
                need[0]
            ),
        ),
        m(
            "cluster_store_ns",
            f(store, 0),
            format!("{:.3} us - 7,168 B / {bulk:.2} GB/s", p4 / 1e3),
        ),
        m(
            "cluster_handoff_bw_gbps",
            f(handoff, 0),
            "the fastest whole wave without stores, bytes / time (a lower bound)".into(),
        ),
        m(
            "cluster_transfer_l2_ns",
            f(transfer_l2, 3),
            format!(
                "least squares over the {} whole-wave shapes (L2 work + transfers x this against the kernel time)",
                waves.len()
            ),
        ),
        m(
            "cluster_sm_ingest_gbps",
            f(ingest, 0),
            format!(
                "(14,368 - 7,168) B / ({i2:.1} - {i4:.1}) ns per chunk into a block, {} and {}",
                need[5], need[4]
            ),
        ),
        m(
            "cluster_ingest_chunk_ns",
            f(ingest_chunk, 1),
            format!("{i4:.1} ns - 7,168 B / {ingest:.0} GB/s"),
        ),
        m(
            "cluster_max_active_clusters",
            toml::Value::Integer(active as i64),
            "probe.cluster_handoff_max_active_clusters (cuOccupancyMaxActiveClusters)".into(),
        ),
        m(
            "cluster_smem_bytes",
            toml::Value::Integer(smem),
            "sm_90 opt-in dynamic shared memory per block (CUDA limit)".into(),
        ),
        m(
            "cluster_reduce_ns",
            f(reduce, 0),
            format!(
                "probe.cluster_reduce_ns_per_token {}, least squares over k",
                pts.iter().map(|(k, v)| format!("k{k} {v:.0}")).collect::<Vec<_>>().join(", ")
            ),
        ),
        m("cluster_reduce_source_ns", f(reduce_source, 1), "the same fit, per source".into()),
    ];
    if let Some((ns, n)) = frame_ns(p) {
        out.push(m(
            "cluster_frame_ns",
            f(ns, 0),
            format!("probe.cluster_launch_us combine_cluster_frame - combine_cluster, mean of {n}"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_keys_parse() {
        assert_eq!(parse_key("tma_8x512_1cl_4x7168B"), Some((8.0, 512.0, 1.0, 4.0, 7168.0, true)));
        assert_eq!(
            parse_key("tma_120x512_15cl_1x7168B_nostore"),
            Some((120.0, 512.0, 15.0, 1.0, 7168.0, false))
        );
        assert_eq!(parse_key("tma_mc_128x1024_16cl_2slots"), None);
        assert_eq!(parse_key("warp_8x512"), None);
    }

    #[test]
    fn the_reducer_is_a_line_over_the_sources() {
        let mut p = Probes::default();
        let run = serde_json::json!({"132blk.k1": 1174.0, "132blk.k2": 1290.0, "132blk.k4": 1475.0,
            "132blk.k8": 1937.0, "1blk.k1": 900.0});
        p.add(&BTreeMap::from([("probe.cluster_reduce_ns_per_token".to_string(), run)]));
        let ReduceFit { reduce: base, per_source: per, points } = reduce_fit(&p).unwrap();
        assert_eq!(points.len(), 4);
        // docs/calibration.md: 1,063 + 108.4 per source (these four points).
        assert!((base - 1062.7).abs() < 0.05 && (per - 108.35).abs() < 0.01, "{base} {per}");
    }
}
