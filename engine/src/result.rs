//! The result document (docs/design.md, "The design contract"; docs/results.md): one JSON per run,
//! versioned, written atomically (`files`). `eptwin-reports` reads only these.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::files;

pub const RESULT_SCHEMA: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Ok,
    Failed,
    Waived,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Failed => "failed",
            Verdict::Waived => "waived",
        }
    }

    /// The process exit code this verdict maps to (docs/design.md, "The design contract").
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Ok => 0,
            Verdict::Failed => 1,
            Verdict::Waived => 77,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub schema: u32,
    pub scenario: ScenarioRef,
    /// `kind` ("sim" | "hw" | "deepep") plus the backend's identity and versions.
    pub backend: BTreeMap<String, serde_json::Value>,
    pub eptwin: Provenance,
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waived_reason: Option<String>,
    /// Why the verdict is `failed`, one line each with coordinates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
    /// Validator advisories for the scenario (not errors).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub advisories: Vec<String>,
    pub jobs: Vec<JobResult>,
    /// Run-level measurements (hardware ceilings: memcpy, peer copy, NCCL all-to-all).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub measurements: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioRef {
    pub name: String,
    pub sha256: String,
    #[serde(default)]
    pub file: String,
    #[serde(default)]
    pub description: String,
    /// The workload/cluster knobs reports put on axes (ranks, tokens, hidden, ...).
    #[serde(default)]
    pub facts: BTreeMap<String, serde_json::Value>,
    /// The routing files the scenario's jobs replayed (`routing = "file"`), so a result names
    /// the exact routing it ran as `sha256` names the exact text; absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routing_files: Vec<RoutingFileRecord>,
    /// The profile file the scenario names (`cluster.profile = "path.toml"`); absent for a
    /// bundled profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_file: Option<ProfileFileRecord>,
}

/// The profile file a scenario ran with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileFileRecord {
    /// The path it was read from (relative ones joined to the scenario's directory).
    pub file: String,
    /// Hex sha256 of its bytes.
    pub sha256: String,
}

/// One job's routing file in a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingFileRecord {
    pub job: String,
    /// The path it was read from.
    pub file: String,
    /// Hex sha256 of its bytes.
    pub sha256: String,
}

/// Who made the result: eptwin version, git commit, and (hardware runs) when.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Provenance {
    pub version: String,
    pub git_commit: String,
    /// Wall-clock time of a hardware run (RFC 3339). Absent for simulator runs, whose results
    /// must be byte-identical across machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    pub name: String,
    /// "intranode" | "internode" | "low-latency" | "traffic".
    pub kind: String,
    pub ranks: u32,
    pub sl: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vl: Option<u8>,
    /// Workload knobs (tokens_per_rank, hidden, topk, experts, bytes_per_rank, ...).
    #[serde(default)]
    pub facts: BTreeMap<String, serde_json::Value>,
    pub ops: Vec<OpResult>,
    /// Global ranks that DeepEP's shrink mode (`enable_shrink`) masked during the run: some
    /// rank's wait for them timed out and it skipped them from then on. Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked_ranks: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpResult {
    pub op: String,
    pub summary: Summary,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<ReferenceComparison>,
    pub samples: Vec<SampleRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Stats {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    /// Nearest-rank percentiles over the samples (empty ⇒ zeros).
    pub fn of(values: &[f64]) -> Stats {
        if values.is_empty() {
            return Stats::default();
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
            sorted[rank.clamp(1, sorted.len()) - 1]
        };
        Stats {
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
            p50: pct(50.0),
            p99: pct(99.0),
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub latency_us: Stats,
    /// Logical bandwidth exactly as DeepEP's tests compute it (bytes they count per rank ÷ mean
    /// latency): the "bottleneck" column; `logical_bw_label` says which.
    pub logical_bw_gbps: f64,
    #[serde(default)]
    pub logical_bw_label: String,
    /// Logical bytes per rank behind `logical_bw_gbps`.
    #[serde(default)]
    pub logical_bytes_per_rank: f64,
    /// Mean per op over all ranks: payload bytes through NICs, bytes over NVLink, wire bytes.
    pub rdma_bytes: u64,
    pub nvlink_bytes: u64,
    #[serde(default)]
    pub wire_bytes: u64,
    /// Mean time of named phases (hook mode send/recv, notify), microseconds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub phases_us: BTreeMap<String, f64>,
    #[serde(default)]
    pub checks: Vec<String>,
    /// Number of samples whose correctness checks failed (nccl-tests' `#wrong`).
    #[serde(default)]
    pub wrong: u32,
    /// DeepEP V2 ops: scale-out bytes sent over RDMA ÷ mean latency and scale-up bytes received
    /// over NVLink ÷ mean latency, as `tests/elastic/test_ep.py` prints them ("(SO)", "(SU)").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub so_bw_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub su_bw_gbps: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceComparison {
    pub source: String,
    pub tolerance_pct: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical_bw_gbps: Option<f64>,
    /// DeepEP V2's published "(SO)" bandwidth, when the reference gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub so_bw_gbps: Option<f64>,
    /// (this backend − reference) / reference, percent, on latency (bandwidth when no latency;
    /// `so_bw_gbps` when that is the only figure).
    pub error_pct: f64,
    pub within_tolerance: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    pub iteration: u32,
    /// The global rank whose printed line this sample is (documents imported from DeepEP's
    /// tests, where one sample is one rank's line); absent for eptwin's own runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub latency_us: f64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub phases_us: BTreeMap<String, f64>,
}

impl RunResult {
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("results serialise");
        text.push('\n');
        text
    }

    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    pub fn job(&self, name: &str) -> Option<&JobResult> {
        self.jobs.iter().find(|j| j.name == name)
    }

    /// The backend kind string ("sim", "hw", "deepep").
    pub fn backend_kind(&self) -> &str {
        self.backend.get("kind").and_then(|v| v.as_str()).unwrap_or("?")
    }

    /// Whether the numbers were measured on GPUs: by eptwin's hardware backend (`"hw"`) or by
    /// DeepEP's own test scripts (`"deepep"`, imported).
    pub fn is_measured(&self) -> bool {
        is_measured_kind(self.backend_kind())
    }
}

impl JobResult {
    pub fn op(&self, op: &str) -> Option<&OpResult> {
        self.ops.iter().find(|o| o.op == op)
    }
}

/// Whether a `backend.kind` names measured numbers (see [`RunResult::is_measured`]).
pub fn is_measured_kind(kind: &str) -> bool {
    matches!(kind, "hw" | "deepep")
}

/// The file a result goes to: `DIR/<scenario name>.json` (with a backend suffix when asked,
/// for `compare`, which keeps both).
pub fn result_path(dir: &Path, scenario_name: &str, suffix: Option<&str>) -> PathBuf {
    match suffix {
        Some(s) => dir.join(format!("{scenario_name}.{s}.json")),
        None => dir.join(format!("{scenario_name}.json")),
    }
}

/// Write `text` to `path` as an output ([`files::write_output`]: atomic, durable, and only
/// over a regular file).
pub fn write_atomic(path: &Path, text: &str) -> Result<(), EngineError> {
    files::write_output(path, text.as_bytes())
}

/// [`write_atomic`] for bytes, with an I/O error (the hardware kernel cache).
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    files::write_output(path, bytes).map_err(|e| std::io::Error::other(e.to_string()))
}

/// Read a result file (a regular file of at most [`files::DOCUMENT`]'s bound).
pub fn read(path: &Path) -> Result<RunResult, EngineError> {
    let bytes = files::read_input(path, &files::DOCUMENT)
        .map_err(|source| EngineError::Io { path: path.to_path_buf(), source })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| EngineError::Usage(format!("{}: not an eptwin result: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_nearest_rank() {
        let s = Stats::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.min, s.p50, s.max, s.mean), (1.0, 3.0, 5.0, 3.0));
        assert_eq!(s.p99, 5.0);
        assert_eq!(Stats::of(&[]).mean, 0.0);
    }

    #[test]
    fn atomic_write_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/r.json");
        write_atomic(&path, "one").unwrap();
        write_atomic(&path, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        assert_eq!(
            std::fs::read_dir(dir.path().join("sub")).unwrap().count(),
            1,
            "no temp files left"
        );
    }

    #[test]
    fn atomic_write_gives_the_permissions_of_a_created_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::File::create(&plain).unwrap();
        let atomic = dir.path().join("atomic");
        write_file_atomic(&atomic, b"x").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&atomic), mode(&plain));
    }
}
