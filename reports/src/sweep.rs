//! The sweep index: what `eptwin sweep` writes next to its per-point results and what
//! `eptwin report` plots (throughput against the swept value). One index per shard; shards of
//! one sweep merge into one.

use std::collections::BTreeMap;

use eptwin_engine::result::RunResult;
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

/// Shard `index` of `count` (0-based): the points whose grid index ≡ `index` (mod `count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    pub fn contains(self, point_index: usize) -> bool {
        point_index % self.count as usize == self.index as usize
    }
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
    /// "ok" | "failed" | "waived" | "invalid" (the edited scenario broke a rule; no run).
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

impl SweepIndex {
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

    #[test]
    fn shards_partition_the_grid() {
        for count in 1..6u32 {
            for i in 0..20 {
                let owners = (0..count).filter(|&k| Shard { index: k, count }.contains(i)).count();
                assert_eq!(owners, 1, "point {i} with {count} shards");
            }
        }
    }

    proptest::proptest! {
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
    fn shard_file_names() {
        assert_eq!(SweepIndex::file_name(Shard::ALL), "index.json");
        assert_eq!(SweepIndex::file_name(Shard { index: 2, count: 8 }), "index.shard-2-of-8.json");
    }
}
