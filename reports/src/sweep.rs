//! The sweep index: what `eptwin sweep` writes next to its per-point results and what
//! `eptwin report` plots (throughput against the swept value). One index per shard; shards of
//! one sweep merge into one.

use std::collections::BTreeMap;

use eptwin_engine::api::{RunResult, Verdict};
pub use eptwin_engine::sweep::Shard;
use eptwin_engine::sweep::{PointOutcome, PointPlan, SweepPlan, json_of};
use serde::{Deserialize, Serialize};

/// The `kind` field that tells a sweep index from the other JSON documents.
pub const SWEEP_INDEX_KIND: &str = "eptwin-sweep-index";
pub const SWEEP_INDEX_SCHEMA: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepIndex {
    pub schema: u32,
    /// Always [`SWEEP_INDEX_KIND`].
    pub kind: String,
    pub scenario: SweepScenario,
    /// "sim" | "hw".
    pub backend: String,
    /// The swept key paths in `--set` order (`job.env.NVSHMEM_QP_DEPTH`, ...).
    pub keys: Vec<String>,
    /// Every value of every key, in `--set` order: the full grid is their product.
    pub values: BTreeMap<String, Vec<serde_json::Value>>,
    pub shard: Shard,
    /// Points in the full grid (all shards together).
    pub total_points: usize,
    /// This shard's points, ascending by `index`.
    pub points: Vec<SweepPoint>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepScenario {
    pub name: String,
    pub file: String,
    /// sha256 of the base scenario's text (each point's own text has its own hash in its result).
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// Position in the full grid (row-major over `keys`: the first key varies slowest).
    pub index: usize,
    /// The value of each swept key at this point.
    pub values: BTreeMap<String, serde_json::Value>,
    /// The point's result file, relative to the index file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The point's scenario text (re-runnable with `eptwin run`), relative like `file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario_file: Option<String>,
    /// "ok" | "failed" | "waived" | "invalid" (the edited scenario broke a rule; no run) |
    /// "not-run" (the sweep was interrupted before the point started; no file).
    pub verdict: String,
    /// Why the point is waived, failed or invalid (first line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Key summary numbers per (job, op).
    #[serde(default)]
    pub ops: Vec<PointOp>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointOp {
    pub job: String,
    pub op: String,
    pub latency_us_mean: f64,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    pub logical_bw_gbps: f64,
    #[serde(default)]
    pub logical_bw_label: String,
    pub rdma_bytes: u64,
    pub nvlink_bytes: u64,
}

impl PointOp {
    /// The key numbers of every (job, op) of a result.
    pub fn from_result(result: &RunResult) -> Vec<PointOp> {
        result
            .jobs
            .iter()
            .flat_map(|job| {
                job.ops.iter().map(move |op| PointOp {
                    job: job.name.clone(),
                    op: op.op.clone(),
                    latency_us_mean: op.summary.latency_us.mean,
                    latency_us_p50: op.summary.latency_us.p50,
                    latency_us_p99: op.summary.latency_us.p99,
                    logical_bw_gbps: op.summary.logical_bw_gbps,
                    logical_bw_label: op.summary.logical_bw_label.clone(),
                    rdma_bytes: op.summary.rdma_bytes,
                    nvlink_bytes: op.summary.nvlink_bytes,
                })
            })
            .collect()
    }
}

impl SweepPoint {
    /// The index entry of a point that ran (or could not), with the value of each of `keys`.
    pub fn new(point: &PointPlan, keys: &[String], outcome: &PointOutcome) -> SweepPoint {
        let values = keys.iter().cloned().zip(point.values.iter().map(json_of)).collect();
        let mut entry = SweepPoint {
            index: point.index,
            values,
            file: None,
            scenario_file: Some(format!("{}.toml", point.name)),
            verdict: "invalid".into(),
            reason: None,
            ops: Vec::new(),
        };
        match outcome {
            PointOutcome::Ran(result) => {
                entry.file = Some(format!("{}.json", point.name));
                entry.verdict = result.verdict.as_str().to_string();
                entry.reason =
                    result.waived_reason.clone().or_else(|| result.failures.first().cloned());
                entry.ops = PointOp::from_result(result);
            }
            PointOutcome::Invalid(reason) => entry.reason = Some(reason.clone()),
            PointOutcome::Failed(reason) => {
                entry.verdict = Verdict::Failed.as_str().into();
                entry.reason = Some(reason.clone());
            }
            PointOutcome::NotRun(reason) => {
                entry.verdict = "not-run".into();
                entry.scenario_file = None;
                entry.reason = Some(reason.clone());
            }
        }
        entry
    }
}

impl SweepIndex {
    /// The index of a sweep's shard on `backend` ("sim" | "hw"), with its points' entries.
    pub fn new(plan: &SweepPlan, backend: &str, points: Vec<SweepPoint>) -> SweepIndex {
        SweepIndex {
            schema: SWEEP_INDEX_SCHEMA,
            kind: SWEEP_INDEX_KIND.into(),
            scenario: SweepScenario {
                name: plan.base_name.clone(),
                file: plan.file.clone(),
                sha256: plan.sha256.clone(),
            },
            backend: backend.into(),
            keys: plan.keys.clone(),
            values: plan
                .keys
                .iter()
                .cloned()
                .zip(plan.values.iter().map(|v| v.iter().map(json_of).collect()))
                .collect(),
            shard: plan.shard,
            total_points: plan.total_points,
            points,
        }
    }

    /// The table `eptwin sweep` prints: one line per (point, job, op), a column per key
    /// (headed by `labels`).
    pub fn render_table(&self, labels: &[String]) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# eptwin sweep: {} ({}) on {}, shard {}/{}: {} of {} points",
            self.scenario.name,
            self.scenario.file,
            self.backend,
            self.shard.index,
            self.shard.count,
            self.points.len(),
            self.total_points
        );
        let mut head = format!("# {:>4}", "pt");
        for l in labels {
            let _ = write!(head, " {l:>16}");
        }
        let _ = writeln!(
            out,
            "{head} {:>8} {:<18} {:>10} {:>10} {:>10}",
            "verdict", "job/op", "mean(us)", "p99(us)", "bw(GB/s)"
        );
        for p in &self.points {
            let mut line = format!("  {:>4}", p.index);
            for k in &self.keys {
                let v = p.values.get(k).map(|v| match v {
                    serde_json::Value::String(s) => s.clone(),
                    o => o.to_string(),
                });
                let _ = write!(line, " {:>16}", v.unwrap_or_default());
            }
            if p.ops.is_empty() {
                let _ =
                    writeln!(out, "{line} {:>8} {}", p.verdict, p.reason.as_deref().unwrap_or(""));
            }
            for o in &p.ops {
                let _ = writeln!(
                    out,
                    "{line} {:>8} {:<18} {:>10.2} {:>10.2} {:>10.2}",
                    p.verdict,
                    format!("{}/{}", o.job, o.op),
                    o.latency_us_mean,
                    o.latency_us_p99,
                    o.logical_bw_gbps
                );
            }
        }
        out
    }

    /// The file name of a shard's index: `index.json`, or `index.shard-K-of-N.json` when the
    /// sweep is split, so that shards written into one directory do not overwrite each other.
    pub fn file_name(shard: Shard) -> String {
        if shard.count == 1 {
            "index.json".to_string()
        } else {
            format!("index.shard-{}-of-{}.json", shard.index, shard.count)
        }
    }

    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("sweep index serialises");
        text.push('\n');
        text
    }

    /// Whether `other` is another shard of the same sweep.
    pub fn same_sweep(&self, other: &SweepIndex) -> bool {
        self.scenario.sha256 == other.scenario.sha256
            && self.scenario.name == other.scenario.name
            && self.backend == other.backend
            && self.keys == other.keys
            && self.values == other.values
    }

    /// Merge shards of one sweep (see [`same_sweep`](Self::same_sweep)) into one index;
    /// a point present in several shards is kept once.
    pub fn merge(mut shards: Vec<SweepIndex>) -> Vec<SweepIndex> {
        let mut merged: Vec<SweepIndex> = Vec::new();
        for shard in shards.drain(..) {
            match merged.iter_mut().find(|m| m.same_sweep(&shard)) {
                Some(m) => {
                    for p in shard.points {
                        if !m.points.iter().any(|q| q.index == p.index) {
                            m.points.push(p);
                        }
                    }
                    m.points.sort_by_key(|p| p.index);
                    m.shard = Shard::ALL;
                }
                None => merged.push(shard),
            }
        }
        merged
    }

    /// Points of the full grid that no merged shard provided.
    pub fn missing_points(&self) -> usize {
        self.total_points.saturating_sub(self.points.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(shard: Shard, points: &[usize]) -> SweepIndex {
        SweepIndex {
            schema: SWEEP_INDEX_SCHEMA,
            kind: SWEEP_INDEX_KIND.into(),
            scenario: SweepScenario {
                name: "s".into(),
                file: "s.toml".into(),
                sha256: "ab".into(),
            },
            backend: "sim".into(),
            keys: vec!["k".into()],
            values: BTreeMap::from([("k".into(), (0..4).map(|v| serde_json::json!(v)).collect())]),
            shard,
            total_points: 4,
            points: points
                .iter()
                .map(|&i| SweepPoint {
                    index: i,
                    values: BTreeMap::from([("k".into(), serde_json::json!(i))]),
                    file: None,
                    scenario_file: None,
                    verdict: "ok".into(),
                    reason: None,
                    ops: vec![],
                })
                .collect(),
        }
    }

    proptest::proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        /// Whatever the shard count, merging every shard of a grid gives back the grid once.
        #[test]
        fn shards_merge_back_to_the_grid(count in 1u32..12, total in 0usize..60) {
            let shards: Vec<SweepIndex> = (0..count)
                .map(|k| {
                    let shard = Shard { index: k, count };
                    let mine: Vec<usize> = (0..total).filter(|&i| shard.contains(i)).collect();
                    let mut ix = index(shard, &mine);
                    ix.total_points = total;
                    ix
                })
                .collect();
            let merged = SweepIndex::merge(shards);
            proptest::prop_assert_eq!(merged.len(), 1);
            let order: Vec<usize> = merged[0].points.iter().map(|p| p.index).collect();
            proptest::prop_assert_eq!(order, (0..total).collect::<Vec<_>>());
            proptest::prop_assert_eq!(merged[0].missing_points(), 0);
        }
    }

    #[test]
    fn merges_shards_in_grid_order() {
        let a = index(Shard { index: 0, count: 2 }, &[0, 2]);
        let b = index(Shard { index: 1, count: 2 }, &[1, 3]);
        let merged = SweepIndex::merge(vec![b, a]);
        assert_eq!(merged.len(), 1);
        let order: Vec<usize> = merged[0].points.iter().map(|p| p.index).collect();
        assert_eq!(order, [0, 1, 2, 3]);
        assert_eq!(merged[0].missing_points(), 0);
        let mut other = index(Shard::ALL, &[0]);
        other.scenario.sha256 = "cd".into();
        assert_eq!(SweepIndex::merge(vec![merged[0].clone(), other]).len(), 2);
    }

    #[test]
    fn points_record_how_they_ended_and_the_table_shows_them() {
        let point = PointPlan {
            index: 2,
            name: "s.k-2".into(),
            values: vec![toml::Value::Integer(2)],
            text: String::new(),
        };
        let keys = ["k".to_string()];
        let invalid = SweepPoint::new(&point, &keys, &PointOutcome::Invalid("nodes: 0".into()));
        assert_eq!((invalid.verdict.as_str(), invalid.file.as_deref()), ("invalid", None));
        assert_eq!(invalid.scenario_file.as_deref(), Some("s.k-2.toml"));
        assert_eq!(invalid.values["k"], serde_json::json!(2));
        let not_run = SweepPoint::new(&point, &keys, &PointOutcome::NotRun("interrupted".into()));
        assert_eq!(
            (not_run.verdict.as_str(), not_run.file.as_deref(), not_run.scenario_file.as_deref()),
            ("not-run", None, None)
        );
        let failed = SweepPoint::new(&point, &keys, &PointOutcome::Failed("panicked".into()));
        assert_eq!(
            (failed.verdict.as_str(), failed.reason.as_deref()),
            ("failed", Some("panicked"))
        );
        let mut ix = index(Shard::ALL, &[]);
        ix.points = vec![invalid];
        let table = ix.render_table(&["k".into()]);
        assert!(table.starts_with("# eptwin sweep: s (s.toml) on sim, shard 0/1: 1 of 4 points\n"));
        assert!(table.contains("     2                2  invalid nodes: 0"), "{table}");
    }

    #[test]
    fn shard_file_names() {
        assert_eq!(SweepIndex::file_name(Shard::ALL), "index.json");
        assert_eq!(SweepIndex::file_name(Shard { index: 2, count: 8 }), "index.shard-2-of-8.json");
    }
}
