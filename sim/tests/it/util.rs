//! Helpers: load and run scenarios on the simulator.

use std::path::{Path, PathBuf};

use eptwin_engine::Plan;
use eptwin_engine::result::{Provenance, RunResult};
use eptwin_sim::{SimOptions, Simulator};

/// The repository root (the sim crate's parent).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

pub fn plan_of_file(path: &Path) -> Plan {
    let loaded = eptwin_engine::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Plan::build(&loaded).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn plan_of_text(name: &str, text: &str) -> Plan {
    let loaded = eptwin_engine::parse(name, text).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
    Plan::build(&loaded).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"))
}

pub fn run(plan: &Plan) -> RunResult {
    let mut sim = Simulator::new(SimOptions::default());
    eptwin_engine::run::run(plan, &mut sim, Provenance::default()).expect("run")
}

/// Every `*.toml` under `dir` (not recursive), sorted.
pub fn tomls(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    v.sort();
    v
}

/// Mean latency (µs) of `op` of job `job` in a result.
pub fn latency_us(r: &RunResult, job: &str, op: &str) -> f64 {
    let j = r.jobs.iter().find(|j| j.name == job).unwrap_or_else(|| panic!("job {job}"));
    let o = j.ops.iter().find(|o| o.op == op).unwrap_or_else(|| panic!("op {op}"));
    o.summary.latency_us.mean
}
