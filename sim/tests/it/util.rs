//! Helpers: run plans on the simulator and read results. Scenarios and plans come from
//! `eptwin_engine::testing`.

use eptwin_engine::Plan;
use eptwin_engine::api::{Provenance, RunResult};
use eptwin_sim::{SimOptions, Simulator};

pub fn run(plan: &Plan) -> RunResult {
    let mut sim = Simulator::new(SimOptions::default());
    eptwin_engine::api::run(plan, &mut sim, Provenance::default()).expect("run")
}

/// Mean latency (µs) of `op` of job `job` in a result.
pub fn latency_us(r: &RunResult, job: &str, op: &str) -> f64 {
    let j = r.jobs.iter().find(|j| j.name == job).unwrap_or_else(|| panic!("job {job}"));
    let o = j.ops.iter().find(|o| o.op == op).unwrap_or_else(|| panic!("op {op}"));
    o.summary.latency_us.mean
}
