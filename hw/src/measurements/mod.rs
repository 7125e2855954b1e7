//! The hardware's measurements as typed structs: what a hardware result document's
//! `measurements` carry (docs/results.md, "Hardware measurements"), serialised to the keys and
//! values the readers (`reports`, `compare`, calibration) know. [`Measurements::to_map`] gives
//! the result's map, [`Measurements::from_map`] reads one back.

mod kernels;
mod probes;

use std::collections::BTreeMap;

use eptwin_engine::api::OpKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use kernels::{
    ClusterKernel, ClusterKernels, InternodeKernels, KernelReport, LowLatencyKernels,
    NormalKernels, PerOp, RingMemory, Rings,
};
pub use probes::{
    DependentLoad, FlushStates, HandoffCheck, LlChainShape, LlRecvShape, LlSendShape, OpLatency,
    Probes, ReduceCheck, WarpCopies,
};

use crate::kernel_defines::FlagScope;

/// A figure rounded to three decimals, as results carry every measured time and rate.
pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Everything a hardware run measures and records: the knobs that shaped the run, where the
/// ranks ran, the kernels' launch, the ceilings and probes measured in the same run, the NCCL
/// baseline, and per op the kernels' figures and the ranks' output digests. Absent fields are
/// absent keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measurements {
    /// `EPTWIN_NORMAL_SMS`: the normal kernels' SMs per rank instead of the Configs'.
    #[serde(rename = "hw.num_sms_override", skip_serializing_if = "Option::is_none", default)]
    pub num_sms_override: Option<u32>,
    /// The scope of the flags between ranks (`sys` when peers are on other GPUs).
    #[serde(rename = "hw.flag_scope", skip_serializing_if = "Option::is_none", default)]
    pub flag_scope: Option<FlagScope>,
    /// `EPTWIN_L2_CLEAN=1`: what L2 holds when an op starts.
    #[serde(rename = "hw.l2_before_op", skip_serializing_if = "Option::is_none", default)]
    pub l2_before_op: Option<String>,
    /// `EPTWIN_LL_COMBINE_PREFETCH=1`.
    #[serde(rename = "hw.ll_combine_prefetch", skip_serializing_if = "Option::is_none", default)]
    pub ll_combine_prefetch: Option<bool>,
    /// `EPTWIN_LL_TIMES=1`.
    #[serde(rename = "hw.ll_times", skip_serializing_if = "Option::is_none", default)]
    pub ll_times: Option<bool>,
    /// Where the kernels came from: `"N cached, M compiled"`.
    #[serde(rename = "hw.kernel_cache", skip_serializing_if = "Option::is_none", default)]
    pub kernel_cache: Option<String>,
    #[serde(rename = "hw.placement", skip_serializing_if = "Option::is_none", default)]
    pub placement: Option<PlacementReport>,
    #[serde(
        rename = "hw.l2_discard_consumed_lines",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub l2_discard_consumed_lines: Option<L2Discard>,
    /// `EPTWIN_KERNEL_TIMEOUT_MS`: the bound of every in-kernel wait.
    #[serde(rename = "hw.kernel_timeout_ms", skip_serializing_if = "Option::is_none", default)]
    pub kernel_timeout_ms: Option<u64>,
    #[serde(flatten)]
    pub kernels: KernelReport,
    #[serde(rename = "hw.processes", skip_serializing_if = "Option::is_none", default)]
    pub processes: Option<ProcessesReport>,
    /// How the NCCL baseline ran, or why it did not.
    #[serde(rename = "hw.nccl_baseline", skip_serializing_if = "Option::is_none", default)]
    pub nccl_baseline: Option<String>,
    /// Why the baseline failed (the run goes on without it).
    #[serde(rename = "hw.nccl_baseline_error", skip_serializing_if = "Option::is_none", default)]
    pub nccl_baseline_error: Option<String>,
    #[serde(flatten)]
    pub probes: Probes,
    /// `<op>.*`: per op, the kernels' figures and the NCCL baseline.
    #[serde(skip)]
    pub ops: BTreeMap<OpKind, OpFigures>,
    /// `hw.output_digest.<op>.rank<r>`: each rank's output digest on the host-checked
    /// iteration.
    #[serde(skip)]
    pub output_digests: BTreeMap<(OpKind, u32), u64>,
}

/// `hw.placement`: where the ranks ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementReport {
    /// `"16 ranks on 1 GPU, 16 per GPU"`.
    pub description: String,
    pub ranks_per_gpu: u32,
    /// The GPU ordinals in use.
    pub gpus: Vec<u32>,
    pub gpu_of_rank: Vec<u32>,
}

/// `hw.l2_discard_consumed_lines`: whether each op drops the ring lines it consumed from L2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct L2Discard {
    pub dispatch: bool,
    pub combine: bool,
}

/// `hw.processes`: a multi-process run's processes and what ran differently from one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessesReport {
    pub processes: usize,
    /// Each process's job ranks, `"4"` or `"4..7"`.
    pub ranks: Vec<String>,
    pub hosts: Vec<String>,
    pub normal_kernels: String,
    pub peer_buffers: String,
    pub before_each_timed_launch: String,
    pub probes: String,
    pub latency: String,
}

/// `<op>.*`: the kernels' figures over the timed samples so far, and the NCCL all-to-all of
/// the same bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpFigures {
    #[serde(flatten)]
    pub kernel: Option<KernelFigures>,
    #[serde(flatten)]
    pub nccl: Option<NcclFigures>,
}

/// The kernels' mean time and bandwidths of one op over its timed samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelFigures {
    pub kernel_mean_us: f64,
    /// The bytes DeepEP's tests count, all ranks.
    pub logical_bytes_all_ranks: f64,
    /// Logical bytes per ns of the mean time.
    pub kernel_bw_gbps: f64,
    /// The bytes the kernels moved between ranks (the sample's `nvlink_bytes`), all ranks.
    pub transported_bytes_all_ranks: f64,
    pub kernel_transport_bw_gbps: f64,
    /// `kernel_bw_gbps` against the memcpy ceiling measured in the same run.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kernel_bw_vs_memcpy_pct: Option<f64>,
    /// The NCCL baseline's time over the kernels'.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kernel_speedup_vs_nccl_alltoall: Option<f64>,
}

/// NCCL's grouped all-to-all of the op's bytes per rank pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NcclFigures {
    #[serde(rename = "nccl_alltoall_us")]
    pub us: f64,
    #[serde(rename = "nccl_alltoall_bytes_all_ranks")]
    pub bytes_all_ranks: u64,
    #[serde(rename = "nccl_alltoall_bw_gbps")]
    pub bw_gbps: f64,
}

impl KernelFigures {
    /// The figures of `latencies_ns` moving `logical` and `transported` bytes, against the
    /// memcpy ceiling and the NCCL time when measured; `None` without a positive mean.
    pub fn new(
        latencies_ns: &[f64],
        logical: f64,
        transported: f64,
        memcpy_gbps: Option<f64>,
        nccl_us: Option<f64>,
    ) -> Option<KernelFigures> {
        let mean_ns = latencies_ns.iter().sum::<f64>() / latencies_ns.len().max(1) as f64;
        if mean_ns <= 0.0 {
            return None;
        }
        let bw = logical / mean_ns;
        Some(KernelFigures {
            kernel_mean_us: round3(mean_ns / 1e3),
            logical_bytes_all_ranks: logical,
            kernel_bw_gbps: round3(bw),
            transported_bytes_all_ranks: transported,
            kernel_transport_bw_gbps: round3(transported / mean_ns),
            kernel_bw_vs_memcpy_pct: memcpy_gbps.map(|m| round3(100.0 * bw / m)),
            kernel_speedup_vs_nccl_alltoall: nccl_us.map(|us| round3(us * 1e3 / mean_ns)),
        })
    }
}

impl NcclFigures {
    pub fn new(us: f64, bytes_all_ranks: u64) -> NcclFigures {
        NcclFigures {
            us: round3(us),
            bytes_all_ranks,
            bw_gbps: round3(bytes_all_ranks as f64 / (us * 1e3)),
        }
    }
}

const DIGEST_PREFIX: &str = "hw.output_digest.";

impl Measurements {
    /// The result document's `measurements`.
    pub fn to_map(&self) -> BTreeMap<String, Value> {
        let mut map = object(self);
        for (op, figures) in &self.ops {
            for (key, value) in object(figures) {
                map.insert(format!("{op}.{key}"), value);
            }
        }
        for ((op, rank), digest) in &self.output_digests {
            map.insert(format!("{DIGEST_PREFIX}{op}.rank{rank}"), format!("{digest:#018x}").into());
        }
        map
    }

    /// A result document's `measurements` read back: every key this backend writes, typed; a
    /// key it does not know is an error naming it.
    pub fn from_map(map: &BTreeMap<String, Value>) -> Result<Measurements, String> {
        let mut rest = serde_json::Map::new();
        let mut ops: BTreeMap<OpKind, serde_json::Map<String, Value>> = BTreeMap::new();
        let mut output_digests = BTreeMap::new();
        for (key, value) in map {
            if let Some(digest) = key.strip_prefix(DIGEST_PREFIX) {
                let parsed =
                    parse_digest(digest, value).ok_or_else(|| format!("{key}: {value}"))?;
                output_digests.insert((parsed.0, parsed.1), parsed.2);
            } else if let Some((op, field)) = op_key(key) {
                ops.entry(op).or_default().insert(field.to_string(), value.clone());
            } else {
                rest.insert(key.clone(), value.clone());
            }
        }
        let known: Vec<String> = rest.keys().cloned().collect();
        let mut m: Measurements = serde_json::from_value(Value::Object(rest))
            .map_err(|e| format!("measurements: {e}"))?;
        let written = object(&m);
        if let Some(unknown) = known.iter().find(|k| !written.contains_key(*k)) {
            return Err(format!("measurements: unknown key {unknown:?}"));
        }
        for (op, fields) in ops {
            let figures: OpFigures = serde_json::from_value(Value::Object(fields))
                .map_err(|e| format!("measurements of {op}: {e}"))?;
            m.ops.insert(op, figures);
        }
        m.output_digests = output_digests;
        Ok(m)
    }
}

/// The map a struct serialises to.
fn object(value: &impl Serialize) -> BTreeMap<String, Value> {
    match serde_json::to_value(value) {
        Ok(Value::Object(map)) => map.into_iter().collect(),
        other => unreachable!("measurements serialise to objects: {other:?}"),
    }
}

/// `dispatch.kernel_mean_us` → (dispatch, `kernel_mean_us`).
fn op_key(key: &str) -> Option<(OpKind, &str)> {
    let (op, field) = key.split_once('.')?;
    let op = match op {
        "dispatch" => OpKind::Dispatch,
        "combine" => OpKind::Combine,
        _ => return None,
    };
    Some((op, field))
}

/// `dispatch.rank3` and `"0x…"` → (dispatch, 3, the digest).
fn parse_digest(key: &str, value: &Value) -> Option<(OpKind, u32, u64)> {
    let (op, rank) = key.split_once(".rank")?;
    let (op, _) = op_key(&format!("{op}."))?;
    let digest = value.as_str()?.strip_prefix("0x")?;
    Some((op, rank.parse().ok()?, u64::from_str_radix(digest, 16).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every hardware result committed under `results/`: its path and its `measurements`.
    fn committed_measurements() -> Vec<(String, BTreeMap<String, Value>)> {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            let mut entries: Vec<_> =
                std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
            entries.sort();
            for p in entries {
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "json") {
                    out.push(p);
                }
            }
        }
        let root = eptwin_engine::testing::repo_root();
        let mut files = Vec::new();
        walk(&root.join("results"), &mut files);
        let mut out = Vec::new();
        for file in files {
            let Ok(doc) = serde_json::from_str::<Value>(&std::fs::read_to_string(&file).unwrap())
            else {
                continue;
            };
            // A failed or waived run's document may carry no measurements at all.
            if doc["backend"]["kind"] != "hw" || doc.get("measurements").is_none() {
                continue;
            }
            let m: BTreeMap<String, Value> =
                serde_json::from_value(doc["measurements"].clone()).unwrap();
            out.push((file.strip_prefix(&root).unwrap().display().to_string(), m));
        }
        out
    }

    /// The typed measurements write the same keys and values the hardware results committed
    /// in this repository carry: each reads back and writes out unchanged.
    #[test]
    fn committed_hardware_measurements_round_trip_unchanged() {
        let committed = committed_measurements();
        assert!(committed.len() >= 40, "{} hardware results", committed.len());
        let mut failures = Vec::new();
        for (file, map) in committed {
            let typed = match Measurements::from_map(&map) {
                Ok(t) => t,
                Err(e) => {
                    failures.push(format!("{file}: {e}"));
                    continue;
                }
            };
            let back = typed.to_map();
            for (key, value) in &map {
                if back.get(key) != Some(value) {
                    failures.push(format!("{file}: {key}: {value} became {:?}", back.get(key)));
                }
            }
            if back.len() != map.len() {
                failures.push(format!("{file}: keys added"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
