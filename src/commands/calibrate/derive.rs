//! Profile values from the hardware backend's probe measurements (`probe.*`, hw/src/probes.rs
//! and hw/src/cluster_probe.rs): each is a probe value or a fixed arithmetic combination of probe
//! values (docs/calibration.md, "h200-single"); nothing is fitted to dispatch or combine times.
//! The L2 rates, the ring handoff and the cluster keys are solved as the docs describe.

use std::collections::BTreeMap;

use serde_json::Value;

use super::writer::Measured;

/// The warp-copy probes' row (hw/src/probes.rs `CHUNK_BYTES`).
const ROW_BYTES: f64 = 7168.0;
/// Bytes the 132 × 1,024 warp-copy probe copies: 4,224 warps × 32 rows.
const COPY_BYTES_132X1024: f64 = 4224.0 * 32.0 * ROW_BYTES;
/// Bytes the ring handoff probe hands over at 192 × 512: 1,536 pairs × 64 rows.
const HANDOFF_BYTES_192X512: f64 = 1536.0 * 64.0 * ROW_BYTES;
/// Blocks per cluster of the cluster probe (hw/src/cluster_probe.rs `CLUSTER_SIZE`).
const CLUSTER_BLOCKS: f64 = 8.0;
/// sm_90's opt-in dynamic shared memory per block (hw/src/intranode.rs).
const SMEM_BYTES: i64 = 232_448;

/// Every probe measurement read: the first source's for the single-run probes, every
/// occurrence of the probes that are averaged over runs.
#[derive(Debug, Clone, Default)]
pub struct Probes {
    /// `backend.*` of the first result (GPU name, SM count, L2 bytes, driver).
    pub backend: BTreeMap<String, Value>,
    /// Every occurrence of each `probe.*` key, in the order read.
    pub runs: BTreeMap<String, Vec<Value>>,
}

impl Probes {
    /// Add one source's measurements (a result's `measurements`, or a log's `# measured` lines).
    pub fn add(&mut self, measurements: &BTreeMap<String, Value>) {
        for (k, v) in measurements.iter().filter(|(k, _)| k.starts_with("probe.")) {
            self.runs.entry(k.clone()).or_default().push(v.clone());
        }
    }

    /// The first occurrence of `probe.<key>`.
    pub fn first(&self, key: &str) -> Option<&Value> {
        self.runs.get(&format!("probe.{key}")).and_then(|v| v.first())
    }

    fn num(&self, key: &str) -> Option<f64> {
        self.first(key).and_then(Value::as_f64)
    }

    fn all(&self, key: &str) -> &[Value] {
        self.runs.get(&format!("probe.{key}")).map_or(&[], Vec::as_slice)
    }

    fn backend_num(&self, key: &str) -> Option<f64> {
        self.backend.get(key).and_then(Value::as_f64)
    }
}

/// A JSON number at a path of object keys.
fn at(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_f64()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.is_empty() {
        0.0
    } else if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn float(v: f64, decimals: i32) -> toml::Value {
    let p = 10f64.powi(decimals);
    toml::Value::Float((v * p).round() / p)
}

fn int(v: f64) -> toml::Value {
    toml::Value::Integer(v.round() as i64)
}

/// NVLink's efficiency from the peer copy probe (copy engines, GPU pairs; only with two or
/// more GPUs): the median pair's rate over the base's `bw_per_direction_gbps`, times the
/// SM-store to copy-engine ratio the bundled H100/H200 profiles use (0.70 / 0.80, the H800 fit's,
/// `[fitted]`: docs/calibration.md); DeepEP's kernels store with SMs.
pub fn nvlink(p: &Probes, base_bw_per_direction_gbps: f64) -> Vec<Measured> {
    const SM_STORE_OVER_COPY_ENGINE: f64 = 0.70 / 0.80;
    let rates: Vec<f64> = p
        .first("peer_copy_bw_gbps")
        .and_then(Value::as_object)
        .map(|m| m.values().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    if rates.is_empty() || base_bw_per_direction_gbps <= 0.0 {
        return Vec::new();
    }
    let n = rates.len();
    let bw = median(rates);
    let efficiency = (bw / base_bw_per_direction_gbps * SM_STORE_OVER_COPY_ENGINE).clamp(0.01, 1.0);
    vec![Measured::new(
        "nvlink",
        "efficiency",
        float(efficiency, 3),
        format!(
            "probe.peer_copy_bw_gbps, median of {n} GPU pairs {bw:.1} GB/s / {base_bw_per_direction_gbps} x 0.70/0.80 (SM stores against copy engines, [fitted] on the H800 rows)"
        ),
    )]
}

/// The `[gpu]` keys the probes measure. `flags_cross_gpus`: the base profile's flags between
/// ranks cross NVLink (`cluster.nvlink_domain_gpus` > 1), so a flag probed on one GPU does not
/// measure its `flag_latency_ns`.
pub fn gpu(p: &Probes, flags_cross_gpus: bool) -> Vec<Measured> {
    let mut out = Vec::new();
    if let Some(name) = p.backend.get("gpu_names").and_then(|n| n.get(0)).and_then(Value::as_str) {
        out.push(Measured::new("gpu", "name", name, "backend.gpu_names (CUDA)".into()));
    }
    if let Some(sms) = p.backend_num("sm_count") {
        out.push(Measured::new(
            "gpu",
            "sm_count",
            int(sms),
            "backend.sm_count (CUDA device attribute)".into(),
        ));
    }
    if let Some(mhz) = p.backend_num("max_sm_clock_mhz") {
        out.push(Measured::new(
            "gpu",
            "clock_ghz",
            float(mhz / 1e3, 3),
            "backend.max_sm_clock_mhz (NVML)".into(),
        ));
    }
    let simple = [
        ("memcpy_bw_gbps", "memcpy_dtod_bw_gbps", 1.0, 1, "1 GiB device-to-device cuMemcpy"),
        (
            "sm_copy_bw_gbps",
            "copy_kernel_one_block_bw_gbps",
            1.0,
            1,
            "copy kernel, one block of 1,024 threads",
        ),
        (
            "kernel_launch_ns",
            "empty_kernel_event_us",
            1e3,
            -1,
            "an empty kernel between two CUDA events",
        ),
    ];
    for (key, probe, scale, decimals, what) in simple {
        if let Some(v) = p.num(probe) {
            let value = if decimals < 0 { int(v * scale) } else { float(v * scale, decimals) };
            out.push(Measured::new("gpu", key, value, format!("probe.{probe} = {v}: {what}")));
        }
    }
    if let Some(v) = p.first("warp_copy_bw_gbps").and_then(|c| at(c, &["l2_to_l2", "1x32"])) {
        let source = format!(
            "probe.warp_copy_bw_gbps.l2_to_l2.1x32 = {v}: one warp alone, L2-resident rows"
        );
        out.push(Measured::new("gpu", "warp_copy_bw_gbps", float(v, 1), source));
    }
    // Across NVLink when there are peers, else on the GPU itself (the one-GPU kernels' scope);
    // a base whose flags cross NVLink keeps its value when no peer was probed.
    let peer = p.first("flag_latency_peer_ns").and_then(|v| v.as_object()).and_then(|m| {
        let v: Vec<f64> = m.values().filter_map(Value::as_f64).collect();
        (!v.is_empty()).then(|| median(v))
    });
    match (peer, p.num("flag_latency_same_gpu_gpu_scope_ns")) {
        (Some(v), _) => out.push(Measured::new(
            "gpu",
            "flag_latency_ns",
            int(v),
            format!("probe.flag_latency_peer_ns, median over the GPU pairs {v:.1}: release -> acquire across NVLink, one way"),
        )),
        (None, Some(v)) if !flags_cross_gpus => out.push(Measured::new(
            "gpu",
            "flag_latency_ns",
            int(v),
            format!("probe.flag_latency_same_gpu_gpu_scope_ns = {v}: .gpu release -> acquire, one way"),
        )),
        _ => {}
    }
    out
}

/// The memory probes' L2 rates: (l2_bw_gbps, l2_hbm_bw_gbps), solved from the hbm_to_l2 and
/// hbm_to_hbm warp-copy probes at 132 × 1,024 after a flush that leaves `dirty` bytes of dirty
/// lines: 2X/l2 + (X + F)/l2_hbm = T1 and 2X/l2 + 2X/l2_hbm = T2.
pub fn l2_rates(copy: &Value, launch_us: f64, dirty: f64) -> Option<(f64, f64)> {
    let x = COPY_BYTES_132X1024;
    let t1 = x / at(copy, &["hbm_to_l2", "132x1024"])? / 1e3 - launch_us;
    let t2 = x / at(copy, &["hbm_to_hbm", "132x1024"])? / 1e3 - launch_us;
    let l2_hbm = (x - dirty) / (t2 - t1) / 1e3;
    let l2 = 2.0 * x / (t1 - (x + dirty) / l2_hbm / 1e3) / 1e3;
    (l2.is_finite() && l2_hbm.is_finite() && l2 > 0.0 && l2_hbm > 0.0).then_some((l2, l2_hbm))
}

/// The flush's dirty bytes: median over the 16-128 MiB reads of every flush probe of
/// `after_flush_us - after_clean_us`, at `dram_gbps`. (bytes, reads counted).
pub fn flush_dirty(p: &Probes, dram_gbps: f64) -> Option<(f64, usize)> {
    let mut deltas = Vec::new();
    for run in p.all("flush_writeback") {
        for mib in [16, 32, 64, 128] {
            let read = run.get(format!("read_{mib}MiB"))?;
            deltas.push(at(read, &["after_flush_us"])? - at(read, &["after_clean_us"])?);
        }
    }
    (!deltas.is_empty()).then(|| (median(deltas.clone()) * dram_gbps * 1e3, deltas.len()))
}

/// The `[gpu.memory]` keys: the one-GPU model of the backend's kernels (sim/src/hwkernels/).
/// Empty when the memory probes did not run; with the rates the cluster keys are checked
/// against (`cluster::keys`).
pub fn memory(p: &Probes) -> (Vec<Measured>, Option<MemRates>) {
    let (Some(copy), Some(_), Some(ops), Some(launch), Some(l2_bytes)) = (
        p.first("warp_copy_bw_gbps"),
        p.first("dependent_load"),
        p.first("op_latency"),
        p.num("empty_kernel_event_us"),
        p.backend_num("l2_bytes"),
    ) else {
        return (Vec::new(), None);
    };
    let best = |variant: &str| {
        ["132x1024", "192x512", "264x512"]
            .iter()
            .filter_map(|s| at(copy, &[variant, s]))
            .fold(0.0f64, f64::max)
    };
    let copy_kernel = p.num("copy_kernel_bw_gbps").unwrap_or(0.0);
    let dram = 2.0 * best("hbm_to_hbm").max(copy_kernel);
    let m = |key: &str, value: toml::Value, source: String| {
        Measured::new("gpu.memory", key, value, source)
    };
    let mut out =
        vec![m("l2_bytes", int(l2_bytes), "backend.l2_bytes (CUDA device attribute)".into())];
    let dirty = match flush_dirty(p, dram) {
        Some((bytes, reads)) => {
            out.push(m(
                "flush_dirty_bytes",
                int(bytes),
                format!("probe.flush_writeback: median over {reads} reads of 16-128 MiB of after_flush_us - after_clean_us, x dram_bw_gbps"),
            ));
            bytes
        }
        None => l2_bytes,
    };
    let Some((l2, l2_hbm)) = l2_rates(copy, launch, dirty) else { return (out, None) };
    out.extend([
        m("l2_bw_gbps", int(l2), "solved with l2_hbm_bw_gbps from probe.warp_copy_bw_gbps.hbm_to_l2 and hbm_to_hbm at 132x1024 (docs/calibration.md)".into()),
        m("dram_bw_gbps", int(dram), "2 x max(probe.warp_copy_bw_gbps.hbm_to_hbm full grid, probe.copy_kernel_bw_gbps)".into()),
        m("l2_hbm_bw_gbps", int(l2_hbm), "solved with l2_bw_gbps".into()),
    ]);
    let row = |variant: &str| at(copy, &[variant, "1x32"]).map(|bw| ROW_BYTES / bw);
    let sm = |variant: &str| at(copy, &[variant, "1x1024"]);
    let pairs = [
        ("warp_row_l2_ns", row("l2_to_l2"), 1, "7168 B / probe.warp_copy_bw_gbps.l2_to_l2.1x32"),
        (
            "warp_row_hbm_ns",
            row("hbm_to_hbm"),
            1,
            "7168 B / probe.warp_copy_bw_gbps.hbm_to_hbm.1x32",
        ),
        ("sm_copy_l2_gbps", sm("l2_to_l2"), 1, "probe.warp_copy_bw_gbps.l2_to_l2.1x1024"),
        ("sm_copy_hbm_gbps", sm("hbm_to_hbm"), 1, "probe.warp_copy_bw_gbps.hbm_to_hbm.1x1024"),
    ];
    for (key, v, decimals, source) in pairs {
        if let Some(v) = v {
            out.push(m(key, float(v, decimals), source.into()));
        }
    }
    // Single latencies swing by 10-30 % between runs of the probe on one GPU (load_hbm_busy_ns
    // 726 against 806, atomic_ns 191 against 281 on two H200s): the median of every run given.
    let loads = [
        (
            "load_l2_ns",
            "dependent_load",
            ["l2_1x32", "ns_per_load_thread0"],
            "probe.dependent_load.l2_1x32",
        ),
        (
            "load_hbm_ns",
            "dependent_load",
            ["hbm_1x32", "ns_per_load_thread0"],
            "probe.dependent_load.hbm_1x32",
        ),
        (
            "load_hbm_busy_ns",
            "dependent_load",
            ["hbm_132x1024", "ns_per_load_thread0"],
            "probe.dependent_load.hbm_132x1024 (every SM loading)",
        ),
        ("atomic_ns", "op_latency", ["atomic_add_ns", ""], "probe.op_latency.atomic_add_ns"),
    ];
    for (key, probe, path, source) in loads {
        let path: Vec<&str> = path.into_iter().filter(|k| !k.is_empty()).collect();
        let runs: Vec<f64> = p.all(probe).iter().filter_map(|r| at(r, &path)).collect();
        if !runs.is_empty() {
            let n = runs.len();
            out.push(m(key, int(median(runs)), format!("{source} (median of {n})")));
        }
    }
    if let (Some(a), Some(b)) =
        (at(ops, &["warp_copy_7168B_release_ns"]), at(ops, &["warp_copy_7168B_ns"]))
    {
        out.push(m(
            "release_ns",
            int((a - b).max(0.0)),
            "probe.op_latency: warp_copy_7168B_release_ns - warp_copy_7168B_ns".into(),
        ));
    }
    out.extend(handoff(p, l2, l2_hbm, launch));
    out.extend(send_chain(p));
    (out, Some(MemRates { flush_dirty: dirty, l2, l2_hbm, dram }))
}

/// The L2 and HBM rates the cluster shapes are checked against.
#[derive(Debug, Clone, Copy)]
pub struct MemRates {
    pub flush_dirty: f64,
    pub l2: f64,
    pub l2_hbm: f64,
    pub dram: f64,
}

/// `l2_ring_bw_gbps` and `l2_discard_bw_gbps` from every ring handoff probe (means): source
/// load and output store at l2_bw, slot store and load at the ring rate, 2X of HBM at l2_hbm;
/// the discards' extra time over X bytes.
fn handoff(p: &Probes, l2: f64, l2_hbm: f64, launch_us: f64) -> Vec<Measured> {
    let runs = p.all("ring_handoff_bw_gbps");
    let plain: Vec<f64> = runs.iter().filter_map(|r| at(r, &["192x512"])).collect();
    let discard: Vec<f64> = runs.iter().filter_map(|r| at(r, &["192x512_discard"])).collect();
    if plain.is_empty() || discard.is_empty() {
        return Vec::new();
    }
    let x = HANDOFF_BYTES_192X512;
    let (plain, discard) = (mean(&plain), mean(&discard));
    let t = x / plain / 1e3 - launch_us;
    let ring = 2.0 * x / (t - 2.0 * x / l2 / 1e3 - 2.0 * x / l2_hbm / 1e3) / 1e3;
    let dt = x / discard / 1e3 - x / plain / 1e3;
    let mut out = Vec::new();
    if ring.is_finite() && ring > 0.0 {
        out.push(Measured::new(
            "gpu.memory",
            "l2_ring_bw_gbps",
            int(ring),
            format!(
                "solved from probe.ring_handoff_bw_gbps.192x512 (mean of {}: {plain:.1})",
                runs.len()
            ),
        ));
    }
    if dt > 0.0 {
        out.push(Measured::new(
            "gpu.memory",
            "l2_discard_bw_gbps",
            int(x / dt / 1e3),
            format!(
                "X / (T(192x512_discard) - T(192x512)), means of {}: {discard:.1}, {plain:.1}",
                runs.len()
            ),
        ));
    }
    out
}

/// The low-latency send loop's four steps and the receive's count poll (probe.ll_send_chain at
/// `<sm_count>x1024`, means over the runs).
fn send_chain(p: &Probes) -> Vec<Measured> {
    let Some(sms) = p.backend_num("sm_count") else { return Vec::new() };
    let shape = format!("{sms}x1024");
    let runs = p.all("ll_send_chain");
    let mut out = Vec::new();
    for (key, step) in [
        ("ll_send_cast_ns", "cast_barrier_ns"),
        ("ll_send_slot_ns", "index_atomic_ns"),
        ("ll_send_copy_ns", "copy_ns"),
        ("ll_send_release_ns", "release_loop_ns"),
    ] {
        let v: Vec<f64> = runs.iter().filter_map(|r| at(r, &[&shape, step])).collect();
        if !v.is_empty() {
            out.push(Measured::new(
                "gpu.memory",
                key,
                int(mean(&v)),
                format!("probe.ll_send_chain.{shape}.{step} (mean of {})", v.len()),
            ));
        }
    }
    // Sources 0..s of 8 polled in turn: 4.5 polls per item on average.
    let recv = format!("{shape}_1024items_then_recv");
    let v: Vec<f64> = runs.iter().filter_map(|r| at(r, &[&recv, "poll_ns_per_item"])).collect();
    if !v.is_empty() && v.len() == runs.len() {
        out.push(Measured::new(
            "gpu.memory",
            "ll_recv_poll_ns",
            int(mean(&v) / 4.5),
            format!(
                "probe.ll_send_chain.{recv}.poll_ns_per_item / 4.5 polls per item (mean of {})",
                v.len()
            ),
        ));
    }
    out
}

/// The cluster constants every derivation shares.
pub(super) fn cluster_constants() -> (f64, i64) {
    (CLUSTER_BLOCKS, SMEM_BYTES)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The probe values of one H100 run (results/h100/ll-combine-times/h200-ep8-ll-4096.json).
    fn h100() -> Probes {
        let mut p = Probes::default();
        p.backend.insert("gpu_names".into(), json!(["NVIDIA H100 80GB HBM3"]));
        p.backend.insert("sm_count".into(), json!(132));
        p.backend.insert("l2_bytes".into(), json!(52_428_800));
        let m: BTreeMap<String, Value> = serde_json::from_value(json!({
            "probe.memcpy_dtod_bw_gbps": 1502.224,
            "probe.copy_kernel_bw_gbps": 1370.464,
            "probe.copy_kernel_one_block_bw_gbps": 48.725,
            "probe.empty_kernel_event_us": 3.008,
            "probe.flag_latency_same_gpu_gpu_scope_ns": 590.949,
            "probe.warp_copy_bw_gbps": {
                "hbm_to_hbm": {"132x1024": 1430.011, "192x512": 1380.917, "1x1024": 48.06, "1x32": 5.443, "264x512": 1430.417},
                "hbm_to_l2": {"132x1024": 2085.667, "192x512": 1939.413, "1x1024": 47.849, "1x32": 5.423},
                "l2_to_l2": {"132x1024": 3573.215, "1x1024": 48.148, "1x32": 9.38}
            },
            "probe.dependent_load": {
                "hbm_132x1024": {"ns_per_load_thread0": 942.0},
                "hbm_1x32": {"ns_per_load_thread0": 477.352},
                "l2_1x32": {"ns_per_load_thread0": 249.264}
            },
            "probe.op_latency": {"atomic_add_ns": 286.896, "warp_copy_7168B_ns": 600.96, "warp_copy_7168B_release_ns": 973.008}
        }))
        .unwrap();
        p.add(&m);
        p
    }

    fn value(out: &[Measured], path: &str) -> toml::Value {
        out.iter().find(|m| m.path() == path).unwrap_or_else(|| panic!("no {path}")).value.clone()
    }

    #[test]
    fn nvlink_efficiency_needs_the_peer_probe() {
        let mut p = Probes::default();
        assert!(nvlink(&p, 450.0).is_empty());
        p.add(&BTreeMap::from([(
            "probe.peer_copy_bw_gbps".to_string(),
            serde_json::json!({"0->1": 380.0, "1->0": 376.0, "0->2": 390.0}),
        )]));
        let m = nvlink(&p, 450.0);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].path(), "nvlink.efficiency");
        // 380 / 450 x 0.875 = 0.7389
        assert_eq!(m[0].value, toml::Value::Float(0.739));
        assert!(m[0].source.contains("median of 3 GPU pairs 380.0 GB/s"), "{}", m[0].source);
    }

    #[test]
    fn the_gpu_keys_are_the_probes() {
        let out = gpu(&h100(), false);
        assert_eq!(value(&out, "gpu.memcpy_bw_gbps"), toml::Value::Float(1502.2));
        assert_eq!(value(&out, "gpu.sm_copy_bw_gbps"), toml::Value::Float(48.7));
        assert_eq!(value(&out, "gpu.warp_copy_bw_gbps"), toml::Value::Float(9.4));
        assert_eq!(value(&out, "gpu.kernel_launch_ns"), toml::Value::Integer(3008));
        assert_eq!(value(&out, "gpu.flag_latency_ns"), toml::Value::Integer(591));
        assert_eq!(value(&out, "gpu.name"), toml::Value::from("NVIDIA H100 80GB HBM3"));
    }

    /// One GPU's flag is not the NVLink flag of a base whose ranks sit on several GPUs.
    #[test]
    fn a_same_gpu_flag_leaves_a_cross_gpu_base_its_flag_latency() {
        let out = gpu(&h100(), true);
        assert!(out.iter().all(|m| m.path() != "gpu.flag_latency_ns"), "{:?}", out.len());
        assert_eq!(value(&out, "gpu.kernel_launch_ns"), toml::Value::Integer(3008));
    }

    #[test]
    fn the_latency_probes_take_the_median_of_every_run() {
        let mut p = h100();
        let mut other = BTreeMap::new();
        let mut chase = p.first("dependent_load").unwrap().clone();
        chase["hbm_132x1024"]["ns_per_load_thread0"] = serde_json::json!(1000.0);
        other.insert("probe.dependent_load".to_string(), chase.clone());
        p.add(&other);
        chase["hbm_132x1024"]["ns_per_load_thread0"] = serde_json::json!(1100.0);
        other.insert("probe.dependent_load".to_string(), chase);
        p.add(&other);
        let out = memory(&p).0;
        // 942 (the run's), 1000, 1100: the median, not the first.
        assert_eq!(value(&out, "gpu.memory.load_hbm_busy_ns").as_integer(), Some(1000));
        let source = &out.iter().find(|m| m.key == "load_hbm_busy_ns").unwrap().source;
        assert!(source.ends_with("(median of 3)"), "{source}");
    }

    /// The same numbers results/h100/ll-sharing-check/*.toml carry for this run, printed by
    /// scripts/h200-profile-from-probes.py (without --flush: every line of L2 dirty).
    #[test]
    fn the_memory_keys_match_the_script_they_replace() {
        let out = memory(&h100()).0;
        let i = |path: &str| value(&out, path).as_integer().unwrap();
        assert_eq!(i("gpu.memory.dram_bw_gbps"), 2861);
        assert_eq!(i("gpu.memory.load_hbm_busy_ns"), 942);
        assert_eq!(i("gpu.memory.atomic_ns"), 287);
        assert_eq!(i("gpu.memory.release_ns"), 372);
        assert_eq!(value(&out, "gpu.memory.warp_row_l2_ns").as_float(), Some(764.2));
        assert_eq!(value(&out, "gpu.memory.warp_row_hbm_ns").as_float(), Some(1316.9));
        // Solved with F = l2_bytes (no flush probe here): the script prints the same pair.
        let (l2, l2_hbm) =
            l2_rates(h100().first("warp_copy_bw_gbps").unwrap(), 3.008, 52_428_800.0).unwrap();
        assert_eq!(i("gpu.memory.l2_bw_gbps"), l2.round() as i64);
        assert_eq!(i("gpu.memory.l2_hbm_bw_gbps"), l2_hbm.round() as i64);
    }

    #[test]
    fn without_the_memory_probes_there_is_no_memory_table() {
        let mut p = h100();
        p.runs.remove("probe.dependent_load");
        assert!(memory(&p).0.is_empty());
    }

    #[test]
    fn the_flush_is_the_median_read_at_the_hbm_rate() {
        let mut p = Probes::default();
        let read = |d: f64| json!({"after_flush_us": 10.0 + d, "after_clean_us": 10.0});
        for ds in [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]] {
            let run = json!({"read_16MiB": read(ds[0]), "read_32MiB": read(ds[1]), "read_64MiB": read(ds[2]), "read_128MiB": read(ds[3])});
            p.add(&BTreeMap::from([("probe.flush_writeback".to_string(), run)]));
        }
        let (bytes, n) = flush_dirty(&p, 4000.0).unwrap();
        assert_eq!(n, 8);
        assert!((bytes - 4.5 * 4000.0 * 1e3).abs() < 1e-6, "{bytes}");
    }
}
