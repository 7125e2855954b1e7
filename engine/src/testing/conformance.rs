//! The [`Transport`] contract as test bodies, run over `dyn Transport` by every backend's
//! tests: the simulator's in `sim/tests/it/conformance.rs` (always), the hardware's in
//! `hw/tests/it/conformance.rs` (ignored without a GPU, run with `--ignored` on the GPU machine
//! by scripts/h200-measure.sh). A body takes a fresh backend and panics with the coordinates of
//! the first broken promise. The bodies are registered once, in [`for_each_conformance_body!`]:
//! each backend's file hands it a macro that makes one `#[test]` per body (the pattern of
//! turmoil's `sim_arm` / `real_arm`), so a new body runs in every arm.
//!
//! The plans are the one-GPU builders of [`super`]: every backend can run them on one H200
//! (the hardware machine) or simulate them. Byte counts are checked against the routing the
//! plan generates (docs/results.md: what `nvlink_bytes` counts).

use crate::deepep::bytes::{
    ll_combine_msg_bytes, ll_dispatch_msg_bytes, normal_combine_token_bytes,
    normal_dispatch_token_bytes,
};
use crate::deepep::config::EpMode;
use crate::ids::JobId;
use crate::plan::{JobPlan, Plan};
use crate::result::{Provenance, Verdict};
use crate::scenario::schema::Dtype;
use crate::scenario::schema::OpKind;
use crate::transport::{Capabilities, OpOutcome, OpSpec, Transport, TransportError};

use super::{ScenarioDraft, one_gpu_low_latency, one_gpu_normal};

/// Calls `$arm!` with the name of every conformance body of this module: the one list both
/// backends' arms run (`sim/tests/it/conformance.rs`, `hw/tests/it/conformance.rs`). An arm's
/// macro makes one `#[test]` per name, calling `eptwin_engine::testing::conformance::<name>` on
/// a fresh backend.
#[macro_export]
macro_rules! for_each_conformance_body {
    ($arm:ident) => {
        $arm!(
            normal_dispatch_then_combine_samples_every_iteration,
            normal_bf16_on_two_ranks_counts_bf16_rows,
            low_latency_dispatch_then_combine_samples_every_iteration,
            the_run_loop_reports_every_timed_iteration,
            an_op_of_an_unknown_job_is_an_error,
            execute_before_prepare_is_an_error,
            a_plan_beyond_max_ranks_is_waived,
            what_capabilities_waive_is_a_one_line_waived_result,
        );
    };
}
pub use crate::for_each_conformance_body;

/// Bytes all ranks move in one `op` of `job`, as the kernels' protocol defines them: a normal
/// token row per (token, destination rank) each way; a low-latency message per valid expert
/// selection each way.
fn protocol_bytes(job: &JobPlan, op: OpKind) -> u64 {
    let d = job.deepep().expect("a DeepEP job");
    let routing = d.routing();
    let w = &d.workload;
    let mut ranks = Vec::new();
    let (mut rows, mut selections) = (0u64, 0u64);
    for src in 0..routing.num_ranks {
        for t in 0..routing.tokens_per_rank {
            routing.token_ranks(src, t, &mut ranks);
            rows += ranks.len() as u64;
            selections += routing.experts(src, t).iter().filter(|&&e| e >= 0).count() as u64;
        }
    }
    match (d.mode, op) {
        (EpMode::LowLatency, OpKind::Dispatch) => {
            selections * ll_dispatch_msg_bytes(w.hidden, w.dispatch_dtype)
        }
        (EpMode::LowLatency, OpKind::Combine) => {
            selections * ll_combine_msg_bytes(w.hidden, Dtype::Bf16)
        }
        (_, OpKind::Dispatch) => {
            rows * normal_dispatch_token_bytes(w.hidden, w.topk, w.dispatch_dtype)
        }
        (_, OpKind::Combine) => rows * normal_combine_token_bytes(w.hidden, w.topk),
        (_, other) => panic!("{other} is not a DeepEP op"),
    }
}

/// Prepare `plan` and execute every op of its one job, warmup rounds first, the way the run
/// loop does; each outcome holds exactly the sample its spec asked for, timed, with the
/// protocol's byte counts and passed checks.
fn every_op_and_iteration(backend: &mut dyn Transport, plan: &Plan) {
    let job = &plan.jobs[0];
    assert_eq!(job.ops, [OpKind::Dispatch, OpKind::Combine], "{}: the plans here", plan.name);
    backend.prepare(plan).unwrap_or_else(|e| panic!("{}: prepare: {e}", plan.name));
    for round in 0..job.warmup + job.iterations {
        let warmup = round < job.warmup;
        let iteration = if warmup { round } else { round - job.warmup };
        for &op in &job.ops {
            let at = format!("{} {op} iteration {iteration} (warmup {warmup})", plan.name);
            let spec = OpSpec::Op { job: job.id, op, iteration, warmup };
            let outcome: OpOutcome = backend.execute(&spec).unwrap_or_else(|e| panic!("{at}: {e}"));
            let [sample] = outcome.samples.as_slice() else {
                panic!("{at}: one sample per op, got {}", outcome.samples.len());
            };
            assert_eq!(
                (sample.job, sample.op, sample.iteration, sample.warmup),
                (job.id, op, iteration, warmup),
                "{at}: the sample names the op it measured"
            );
            assert!(
                sample.latency_ns > 0.0 && sample.latency_ns.is_finite(),
                "{at}: latency {} ns",
                sample.latency_ns
            );
            assert_eq!(sample.nvlink_bytes, protocol_bytes(job, op), "{at}: NVLink bytes");
            assert_eq!((sample.rdma_bytes, sample.wire_bytes), (0, 0), "{at}: one GPU, no NIC");
            assert!(sample.failures.is_empty(), "{at}: failed checks {:?}", sample.failures);
            if !warmup {
                assert!(!sample.checks.is_empty(), "{at}: a timed op says what it checked");
            }
        }
    }
}

/// Normal intranode kernels: dispatch then combine, every warmup and timed iteration.
pub fn normal_dispatch_then_combine_samples_every_iteration(backend: &mut dyn Transport) {
    every_op_and_iteration(backend, &one_gpu_normal("conformance-normal").plan());
}

/// The same with BF16 dispatch on two ranks: the byte counts follow the dtype.
pub fn normal_bf16_on_two_ranks_counts_bf16_rows(backend: &mut dyn Transport) {
    let plan = one_gpu_normal("conformance-normal-bf16")
        .set("cluster.ranks_per_gpu", 2)
        .set("job[0].buffer.num_sms", 8)
        .set("job[0].workload.tokens_per_rank", 300)
        .set("job[0].workload.topk", 4)
        .set("job[0].workload.experts", 16)
        .set("job[0].workload.dispatch_dtype", "bf16")
        .set("job[0].workload.iterations", 2)
        .plan();
    assert_eq!(plan.jobs[0].num_ranks(), 2, "the builder's edits reach the plan");
    every_op_and_iteration(backend, &plan);
}

/// Low-latency kernels with masked selections: one message per valid selection each way.
pub fn low_latency_dispatch_then_combine_samples_every_iteration(backend: &mut dyn Transport) {
    every_op_and_iteration(backend, &one_gpu_low_latency("conformance-ll").plan());
}

/// The run loop over the backend: verdict ok, one result per job naming it, one sample per
/// timed iteration of each op in order, the backend's kind recorded.
pub fn the_run_loop_reports_every_timed_iteration(backend: &mut dyn Transport) {
    let plan = one_gpu_low_latency("conformance-run").set("job[0].name", "decode").plan();
    let kind = backend.capabilities().backend;
    let result = crate::run::run(&plan, backend, Provenance::default()).expect("the run ends");
    assert_eq!(result.verdict, Verdict::Ok, "{:?} {:?}", result.failures, result.waived_reason);
    assert_eq!(result.backend.get("kind").and_then(|k| k.as_str()), Some(kind.as_str()));
    let [job] = result.jobs.as_slice() else { panic!("one job: {:?}", result.jobs.len()) };
    assert_eq!(job.name, "decode");
    let ops: Vec<&str> = job.ops.iter().map(|o| o.op.as_str()).collect();
    assert_eq!(ops, ["dispatch", "combine"]);
    for op in &job.ops {
        let iterations: Vec<u32> = op.samples.iter().map(|s| s.iteration).collect();
        assert_eq!(iterations, [0, 1, 2], "{}: timed samples only, in order", op.op);
        assert!(op.summary.latency_us.mean > 0.0, "{}: timed", op.op);
        assert_eq!(op.summary.wrong, 0, "{}", op.op);
        assert!(op.summary.logical_bw_gbps > 0.0, "{}: a bandwidth", op.op);
    }
}

/// An op of a job the plan does not have is an error naming it, never a panic.
pub fn an_op_of_an_unknown_job_is_an_error(backend: &mut dyn Transport) {
    let plan = one_gpu_low_latency("conformance-unknown-job").plan();
    backend.prepare(&plan).expect("prepare");
    let spec = OpSpec::Op { job: JobId(7), op: OpKind::Dispatch, iteration: 0, warmup: false };
    match backend.execute(&spec) {
        Err(TransportError::Backend { context, message }) => {
            let line = format!("{context}: {message}");
            assert!(line.contains('7'), "the error names the job: {line}");
        }
        other => panic!("job 7 of a one-job plan: {other:?}"),
    }
}

/// An op before any plan was prepared is an error, never a panic.
pub fn execute_before_prepare_is_an_error(backend: &mut dyn Transport) {
    let spec = OpSpec::Op { job: JobId(0), op: OpKind::Dispatch, iteration: 0, warmup: false };
    let outcome = backend.execute(&spec);
    assert!(matches!(outcome, Err(TransportError::Backend { .. })), "{outcome:?}");
}

/// A backend that places fewer ranks than the plan needs: the run loop waives the plan with
/// the capabilities' one line and never prepares it.
struct Capped<'a> {
    inner: &'a mut dyn Transport,
    max_ranks: u32,
    prepared: bool,
}

impl Transport for Capped<'_> {
    fn capabilities(&self) -> Capabilities {
        Capabilities { max_ranks: Some(self.max_ranks), ..self.inner.capabilities() }
    }
    fn prepare(&mut self, plan: &Plan) -> Result<(), TransportError> {
        self.prepared = true;
        self.inner.prepare(plan)
    }
    fn execute(&mut self, op: &OpSpec) -> Result<OpOutcome, TransportError> {
        self.inner.execute(op)
    }
}

/// A plan beyond `max_ranks` is waived in one line naming the job and both counts.
pub fn a_plan_beyond_max_ranks_is_waived(backend: &mut dyn Transport) {
    let plan = one_gpu_normal("conformance-max-ranks").plan();
    let mut capped = Capped { inner: backend, max_ranks: 4, prepared: false };
    let result = crate::run::run(&plan, &mut capped, Provenance::default()).expect("a result");
    assert_eq!(result.verdict, Verdict::Waived);
    let reason = result.waived_reason.expect("a reason");
    assert!(
        !reason.contains('\n') && reason.contains("8 ranks") && reason.contains('4'),
        "{reason}"
    );
    assert!(!capped.prepared, "a waived plan is never prepared");
    assert!(result.jobs.is_empty());
}

/// Whatever the backend cannot run here (several nodes, several jobs at once, a mode it lacks)
/// ends as a waived result with one line (the capabilities' own where they know it before
/// `prepare`); what it can run runs ok.
pub fn what_capabilities_waive_is_a_one_line_waived_result(backend: &mut dyn Transport) {
    let plans = [
        // Two nodes of 8 ranks: RDMA between nodes.
        ScenarioDraft::bundled("ep16-ll")
            .set("job[0].workload.warmup", 0)
            .set("job[0].workload.iterations", 1)
            .plan(),
        // Two jobs on one fabric at once: low-latency decode beside a bulk all-to-all.
        ScenarioDraft::bundled("vl-isolation-separate")
            .set("job[decode].workload.warmup", 0)
            .set("job[decode].workload.iterations", 1)
            .set("job[bulk].traffic.bytes_per_rank", "15MiB")
            .set("job[bulk].traffic.iterations", 1)
            .plan(),
    ];
    let caps = backend.capabilities();
    for plan in &plans {
        let waiver = caps.waiver(plan);
        let result = crate::run::run(plan, backend, Provenance::default()).expect("a result");
        match waiver {
            Some(reason) => {
                assert!(!reason.contains('\n'), "{}: one line: {reason:?}", plan.name);
                assert_eq!(result.verdict, Verdict::Waived, "{}", plan.name);
                assert_eq!(result.waived_reason.as_deref(), Some(reason.as_str()));
            }
            // Some limits are known only once the backend sees the machine (the hardware
            // backend finds the GPUs a plan needs in `prepare`): waived then too, in one line.
            None => match (&result.verdict, result.waived_reason.as_deref()) {
                (Verdict::Ok, _) => {}
                (Verdict::Waived, Some(reason)) => {
                    assert!(!reason.contains('\n'), "{}: one line: {reason:?}", plan.name)
                }
                _ => panic!("{}: {:?} {:?}", plan.name, result.failures, result.waived_reason),
            },
        }
    }
}
