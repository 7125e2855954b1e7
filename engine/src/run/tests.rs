//! The run loop against a fake transport (the in-memory "pair" of quinn's tests).

use std::collections::BTreeMap;

use super::*;
use crate::transport::{BackendKind, Capabilities, PhaseTime};

const SCENARIO: &str = r#"
schema = 1
name = "fake-ll"
[cluster]
profile = "h800-cx7"
nodes = 1
[[job]]
name = "decode"
[job.buffer]
low_latency_mode = true
num_rdma_bytes = "2GiB"
num_qps_per_rank = 32
[job.workload]
tokens_per_rank = 128
hidden = 7168
topk = 8
experts = 256
warmup = 2
iterations = 4
[job.reference]
source = "made up"
tolerance_pct = 10
ops.dispatch = { latency_us = 100.0 }
"#;

/// Latency = 100 us + 10 us × iteration for dispatch, 200 us for combine; can fail or refuse.
struct Fake {
    prepared: bool,
    executed: Vec<OpSpec>,
    fail_iteration: Option<u32>,
    unavailable: Option<String>,
    error: Option<TransportError>,
}

impl Fake {
    fn new() -> Self {
        Fake {
            prepared: false,
            executed: Vec::new(),
            fail_iteration: None,
            unavailable: None,
            error: None,
        }
    }
}

impl Transport for Fake {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // The double stands in for the simulator.
            backend: BackendKind::Sim,
            identity: if self.prepared {
                BTreeMap::from([("version".into(), json!("0")), ("wire".into(), json!("tcp"))])
            } else {
                BTreeMap::from([("version".into(), json!("0"))])
            },
            unavailable: self.unavailable.clone(),
            modes: vec![EpMode::LowLatency, EpMode::Intranode],
            elastic: false,
            traffic: true,
            concurrent_jobs: true,
            max_ranks: None,
            rdma: true,
            rdma_reason: None,
        }
    }
    fn prepare(&mut self, _plan: &Plan) -> Result<(), TransportError> {
        self.prepared = true;
        Ok(())
    }
    fn execute(&mut self, op: &OpSpec) -> Result<OpOutcome, TransportError> {
        assert!(self.prepared, "execute before prepare");
        if let Some(e) = self.error.clone() {
            return Err(e);
        }
        self.executed.push(op.clone());
        let OpSpec::Op { job, op, iteration, warmup } = *op else { panic!("single job") };
        let latency_ns = match op {
            OpKind::Dispatch => 100_000.0 + 10_000.0 * iteration as f64,
            _ => 200_000.0,
        };
        let mut s = OpSample::new(job, op, iteration, warmup, latency_ns);
        s.nvlink_bytes = 1000;
        s.checks.push("fake-check".into());
        s.phases.push(PhaseTime { name: "send".into(), latency_ns: latency_ns / 2.0 });
        if Some(iteration) == self.fail_iteration && !warmup {
            s.failures.push("rank 3 received row 7 from rank 2, expected rank 1".into());
        }
        Ok(OpOutcome { samples: vec![s], measurements: BTreeMap::new() })
    }
}

fn plan() -> Plan {
    Plan::build(&crate::parse("fake.toml", SCENARIO).unwrap()).unwrap()
}

#[test]
fn warmup_is_discarded_and_summaries_follow_samples() {
    let plan = plan();
    let mut fake = Fake::new();
    let result = run(&plan, &mut fake, Provenance::default()).unwrap();
    // 2 warmup + 4 iterations, 2 ops each.
    assert_eq!(fake.executed.len(), 12);
    assert_eq!(result.verdict, crate::result::Verdict::Ok);
    let dispatch = result.jobs[0].op("dispatch").unwrap();
    assert_eq!(dispatch.samples.len(), 4);
    assert_eq!(dispatch.summary.latency_us.min, 100.0);
    assert_eq!(dispatch.summary.latency_us.max, 130.0);
    assert_eq!(dispatch.summary.latency_us.mean, 115.0);
    assert_eq!(dispatch.summary.phases_us["send"], 57.5);
    assert_eq!(dispatch.summary.logical_bw_label, "RDMA");
    // LL dispatch counts valid selections × 7,408 B per rank: 128 × 8 × 7408 / 115 us.
    let expected_bw = 128.0 * 8.0 * 7408.0 / 115_000.0;
    assert!((dispatch.summary.logical_bw_gbps - expected_bw).abs() < 1e-9);
    let reference = dispatch.reference.as_ref().unwrap();
    assert!((reference.error_pct - 15.0).abs() < 1e-9);
    assert!(!reference.within_tolerance);
    assert_eq!(result.backend["kind"], "sim");
    // What the backend knows only once the plan is prepared reaches the document.
    assert_eq!(result.backend["wire"], "tcp");
    // The document round-trips through JSON.
    assert_eq!(crate::result::RunResult::from_json(&result.to_json()).unwrap(), result);
}

#[test]
fn failed_checks_fail_the_verdict_with_coordinates() {
    let plan = plan();
    let mut fake = Fake::new();
    fake.fail_iteration = Some(2);
    let result = run(&plan, &mut fake, Provenance::default()).unwrap();
    assert_eq!(result.verdict, crate::result::Verdict::Failed);
    assert_eq!(result.verdict.exit_code(), 1);
    assert!(result.failures[0].contains("iteration 2") && result.failures[0].contains("rank 3"));
    assert_eq!(result.jobs[0].op("dispatch").unwrap().summary.wrong, 1);
}

#[test]
fn unavailable_backends_waive_and_errors_fail() {
    let plan = plan();
    let mut fake = Fake::new();
    fake.unavailable = Some("no GPU: libcuda.so not found".into());
    let result = run(&plan, &mut fake, Provenance::default()).unwrap();
    assert_eq!(result.verdict.exit_code(), 77);
    assert_eq!(result.waived_reason.as_deref(), Some("no GPU: libcuda.so not found"));
    assert!(fake.executed.is_empty());

    let mut fake = Fake::new();
    fake.error = Some(TransportError::Unsupported("kernel needs sm_90".into()));
    assert_eq!(run(&plan, &mut fake, Provenance::default()).unwrap().verdict.exit_code(), 77);

    let mut fake = Fake::new();
    fake.error = Some(TransportError::Timeout("rank 5 waited for expert 17 count".into()));
    let result = run(&plan, &mut fake, Provenance::default()).unwrap();
    assert_eq!(result.verdict.exit_code(), 1);
    assert!(result.failures[0].contains("expert 17"));
}

/// A plan whose rounds overflow u32 (built directly: validation refuses such values). The fake
/// refuses to run more than a few ops, so the test is quick: the loop must not wrap to zero
/// rounds (the old `warmup + iterations` in u32 did, and reported `ok` with no samples).
#[test]
fn round_counts_do_not_wrap() {
    let mut plan = plan();
    plan.jobs[0].warmup = 1;
    plan.jobs[0].iterations = u32::MAX;
    let mut fake = Fake::new();
    let mut calls = 0u64;
    let mut totals = Vec::new();
    let mut progress = |p: Progress| {
        totals.push(p.total);
        calls += 1;
    };
    // The first execution after 8 ops fails the run: enough to see the loop started.
    struct Stop<'a>(&'a mut Fake, u32);
    impl Transport for Stop<'_> {
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        fn prepare(&mut self, plan: &Plan) -> Result<(), TransportError> {
            self.0.prepare(plan)
        }
        fn execute(&mut self, op: &OpSpec) -> Result<OpOutcome, TransportError> {
            self.1 += 1;
            if self.1 > 8 {
                return Err(TransportError::Timeout("stopped by the test".into()));
            }
            self.0.execute(op)
        }
    }
    let result =
        run_observed(&plan, &mut Stop(&mut fake, 0), Provenance::default(), &mut progress).unwrap();
    assert_eq!(fake.executed.len(), 8);
    assert_eq!(result.verdict, crate::result::Verdict::Failed);
    assert_eq!(totals[0], (1 + u32::MAX as u64) * 2);
    assert_eq!(calls, 9, "once before the first op, once after each");
}

/// A backend that reports no samples never yields `ok`.
#[test]
fn zero_samples_are_never_ok() {
    struct Silent(Fake);
    impl Transport for Silent {
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        fn prepare(&mut self, plan: &Plan) -> Result<(), TransportError> {
            self.0.prepare(plan)
        }
        fn execute(&mut self, _op: &OpSpec) -> Result<OpOutcome, TransportError> {
            Ok(OpOutcome::default())
        }
    }
    let plan = plan();
    let result = run(&plan, &mut Silent(Fake::new()), Provenance::default()).unwrap();
    assert_eq!(result.verdict, crate::result::Verdict::Failed);
    assert_eq!(
        result.failures,
        [
            "job \"decode\" dispatch: no timed sample was recorded",
            "job \"decode\" combine: no timed sample was recorded"
        ]
    );
    // So does a plan with no timed rounds at all.
    let mut plan = plan;
    plan.jobs[0].iterations = 0;
    let result = run(&plan, &mut Fake::new(), Provenance::default()).unwrap();
    assert_eq!(result.verdict, crate::result::Verdict::Failed);
}

#[test]
fn progress_counts_every_op_and_warmup_samples_are_dropped() {
    let plan = plan();
    let mut fake = Fake::new();
    let mut seen = Vec::new();
    let result = run_observed(&plan, &mut fake, Provenance::default(), &mut |p| {
        seen.push((p.done, p.total))
    })
    .unwrap();
    assert_eq!(seen.first(), Some(&(0, 12)));
    assert_eq!(seen.last(), Some(&(12, 12)));
    assert_eq!(seen.len(), 13);
    assert!(result.jobs[0].ops.iter().all(|o| o.samples.iter().all(|s| s.iteration < 4)));
}
