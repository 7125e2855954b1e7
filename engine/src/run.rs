//! The one run loop: drives any [`Transport`] through warmup and iterations, checks, and
//! builds the result document.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::deepep::config::EpMode;
use crate::error::EngineError;
use crate::plan::{JobKind, JobPlan, Plan};
use crate::result::{
    JobResult, OpResult, Provenance, RESULT_SCHEMA, ReferenceComparison, RunResult, SampleRecord,
    ScenarioRef, Stats, Summary, Verdict,
};
use crate::scenario::schema::OpKind;
use crate::transport::{OpOutcome, OpSample, OpSpec, StreamSpec, Transport, TransportError};

/// How far a run is: `done` of `total` backend calls (ops of a single-job plan, one session
/// for several jobs sharing the fabric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
}

/// Run `plan` on `transport`. Transport failures become a `failed` result (with the error's
/// coordinates) and unsupported plans a `waived` one; `Err` is reserved for the caller's I/O.
pub fn run(
    plan: &Plan,
    transport: &mut dyn Transport,
    provenance: Provenance,
) -> Result<RunResult, EngineError> {
    run_observed(plan, transport, provenance, &mut |_| {})
}

/// [`run`], telling `progress` after every backend call (a progress bar; the engine itself
/// prints nothing).
pub fn run_observed(
    plan: &Plan,
    transport: &mut dyn Transport,
    provenance: Provenance,
    progress: &mut dyn FnMut(Progress),
) -> Result<RunResult, EngineError> {
    let caps = transport.capabilities();
    let mut backend = caps.identity.clone();
    backend.insert("kind".into(), json!(caps.backend.as_str()));
    let mut result = RunResult {
        schema: RESULT_SCHEMA,
        scenario: scenario_ref(plan),
        backend,
        eptwin: provenance,
        verdict: Verdict::Ok,
        waived_reason: None,
        failures: Vec::new(),
        advisories: plan.advisories.iter().map(|d| d.to_string()).collect(),
        jobs: Vec::new(),
        measurements: BTreeMap::new(),
    };
    if let Some(reason) = caps.waiver(plan) {
        result.verdict = Verdict::Waived;
        result.waived_reason = Some(reason);
        return Ok(result);
    }
    let outcome = transport.prepare(plan).and_then(|()| execute_all(plan, transport, progress));
    // A backend learns some of its identity only from the plan (the wire that carried a
    // job's internode bytes, `backend.wire`): read it again once the plan ran.
    for (key, value) in transport.capabilities().identity {
        if key != "kind" {
            result.backend.insert(key, value);
        }
    }
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(TransportError::Unsupported(reason)) => {
            result.verdict = Verdict::Waived;
            result.waived_reason = Some(reason);
            return Ok(result);
        }
        Err(e) => {
            result.verdict = Verdict::Failed;
            result.failures.push(e.to_string());
            return Ok(result);
        }
    };
    result.measurements = outcome.measurements.clone();
    for job in &plan.jobs {
        result.jobs.push(job_result(job, &outcome.samples));
    }
    // A result without a timed sample measured nothing: never `ok`.
    for job in &result.jobs {
        for op in job.ops.iter().filter(|o| o.samples.is_empty()) {
            result
                .failures
                .push(format!("job {:?} {}: no timed sample was recorded", job.name, op.op));
        }
    }
    for sample in outcome.samples.iter().filter(|s| !s.warmup) {
        for f in &sample.failures {
            result.failures.push(format!(
                "job {:?} {} iteration {}: {f}",
                plan.job(sample.job).name,
                sample.op,
                sample.iteration
            ));
        }
    }
    if !result.failures.is_empty() {
        result.verdict = Verdict::Failed;
    }
    Ok(result)
}

fn execute_all(
    plan: &Plan,
    transport: &mut dyn Transport,
    progress: &mut dyn FnMut(Progress),
) -> Result<OpOutcome, TransportError> {
    if plan.jobs.len() > 1 {
        let streams = plan
            .jobs
            .iter()
            .map(|j| StreamSpec {
                job: j.id,
                ops: j.ops.clone(),
                warmup: j.warmup,
                iterations: j.iterations,
            })
            .collect();
        progress(Progress { done: 0, total: 1 });
        let outcome = transport.execute(&OpSpec::Concurrent { streams });
        progress(Progress { done: 1, total: 1 });
        return outcome;
    }
    let job = &plan.jobs[0];
    let mut all = OpOutcome::default();
    // Rounds count in u64: warmup + iterations overflows u32 for the largest values.
    let rounds = job.warmup as u64 + job.iterations as u64;
    let total = rounds * job.ops.len() as u64;
    let mut done = 0;
    progress(Progress { done, total });
    for round in 0..rounds {
        let warmup = round < job.warmup as u64;
        let iteration = if warmup { round } else { round - job.warmup as u64 } as u32;
        for &op in &job.ops {
            let outcome = transport.execute(&OpSpec::Op { job: job.id, op, iteration, warmup })?;
            // Warmup samples are never reported: keeping them would only grow memory.
            all.samples.extend(outcome.samples.into_iter().filter(|s| !s.warmup));
            all.measurements.extend(outcome.measurements);
            done += 1;
            progress(Progress { done, total });
        }
    }
    Ok(all)
}

/// The result's `scenario` block: name, sha256 of the text, file, description, cluster facts.
pub fn scenario_ref(plan: &Plan) -> ScenarioRef {
    let t = &plan.topology;
    let facts = BTreeMap::from([
        ("profile".to_string(), json!(plan.profile.name)),
        ("gpu".to_string(), json!(plan.profile.gpu.name)),
        ("nodes".to_string(), json!(t.nodes)),
        ("gpus_per_node".to_string(), json!(t.gpus_per_node)),
        ("ranks_per_gpu".to_string(), json!(t.ranks_per_gpu)),
        ("nvlink".to_string(), json!(t.nvlink.to_string())),
        ("fabric".to_string(), json!(format!("{:?}", plan.qos.kind).to_lowercase())),
    ]);
    ScenarioRef {
        name: plan.name.clone(),
        sha256: plan.scenario_sha256.clone(),
        file: plan.scenario_file.clone(),
        description: plan.description.clone(),
        facts,
        routing_files: plan.routing_files(),
        profile_file: plan.profile_file.clone(),
    }
}

pub fn job_kind_name(job: &JobPlan) -> &'static str {
    match &job.kind {
        JobKind::DeepEp(d) if d.elastic.is_some_and(|e| e.hybrid) => "elastic-hybrid",
        JobKind::DeepEp(d) if d.elastic.is_some() => "elastic-direct",
        JobKind::DeepEp(d) => match d.mode {
            EpMode::Intranode => "intranode",
            EpMode::Internode => "internode",
            EpMode::LowLatency => "low-latency",
        },
        JobKind::Traffic(_) => "traffic",
    }
}

fn job_result(job: &JobPlan, samples: &[OpSample]) -> JobResult {
    let mut ops = Vec::new();
    let mut seen = BTreeSet::new();
    for &op in &job.ops {
        if !seen.insert(op) {
            continue;
        }
        let mine: Vec<&OpSample> =
            samples.iter().filter(|s| s.job == job.id && s.op == op && !s.warmup).collect();
        ops.push(op_result(job, op, &mine));
    }
    let masked_ranks: BTreeSet<u32> = samples
        .iter()
        .filter(|s| s.job == job.id)
        .flat_map(|s| s.masked_ranks.iter().copied())
        .collect();
    JobResult {
        name: job.name.clone(),
        kind: job_kind_name(job).to_string(),
        ranks: job.num_ranks(),
        sl: job.sl.0,
        vl: job.vl().map(|v| v.0),
        facts: job_facts(job),
        ops,
        masked_ranks: masked_ranks.into_iter().collect(),
    }
}

fn op_result(job: &JobPlan, op: OpKind, samples: &[&OpSample]) -> OpResult {
    let latencies_us: Vec<f64> = samples.iter().map(|s| s.latency_ns / 1e3).collect();
    let latency_us = Stats::of(&latencies_us);
    let count = samples.len().max(1) as f64;
    let mean_u64 = |f: fn(&OpSample) -> u64| {
        (samples.iter().map(|s| f(s) as f64).sum::<f64>() / count).round() as u64
    };
    let mut phase_sums: BTreeMap<String, (f64, u32)> = BTreeMap::new();
    for s in samples {
        for p in &s.phases {
            let e = phase_sums.entry(p.name.clone()).or_default();
            e.0 += p.latency_ns / 1e3;
            e.1 += 1;
        }
    }
    let checks: BTreeSet<String> = samples.iter().flat_map(|s| s.checks.iter().cloned()).collect();
    let logical_bytes = job.logical_bytes_per_rank(op);
    let logical_bw_gbps =
        if latency_us.mean > 0.0 { logical_bytes / (latency_us.mean * 1e3) } else { 0.0 };
    let summary = Summary {
        latency_us,
        logical_bw_gbps,
        logical_bw_label: job.logical_bw_label().to_string(),
        logical_bytes_per_rank: logical_bytes,
        rdma_bytes: mean_u64(|s| s.rdma_bytes),
        nvlink_bytes: mean_u64(|s| s.nvlink_bytes),
        wire_bytes: mean_u64(|s| s.wire_bytes),
        phases_us: phase_sums.into_iter().map(|(k, (sum, n))| (k, sum / n as f64)).collect(),
        checks: checks.into_iter().collect(),
        wrong: samples.iter().filter(|s| !s.failures.is_empty()).count() as u32,
        so_bw_gbps: None,
        su_bw_gbps: None,
    };
    let summary = with_elastic_bandwidth(job, op, summary);
    let reference = reference_comparison(job, op, &summary);
    OpResult {
        op: op.to_string(),
        summary,
        reference,
        samples: samples
            .iter()
            .map(|s| SampleRecord {
                iteration: s.iteration,
                rank: None,
                latency_us: s.latency_ns / 1e3,
                phases_us: s.phases.iter().map(|p| (p.name.clone(), p.latency_ns / 1e3)).collect(),
            })
            .collect(),
    }
}

/// A DeepEP V2 op's "(SO)" and "(SU)" bandwidths: its scale-out and scale-up bytes per rank
/// over the mean latency (`tests/elastic/test_ep.py`).
pub fn with_elastic_bandwidth(job: &JobPlan, op: OpKind, mut summary: Summary) -> Summary {
    if let Some((so, su)) = job.elastic_bytes_per_rank(op)
        && summary.latency_us.mean > 0.0
    {
        let per_ns = summary.latency_us.mean * 1e3;
        summary.so_bw_gbps = Some(so / per_ns);
        summary.su_bw_gbps = Some(su / per_ns);
    }
    summary
}

/// The job's published number for `op` (`[job.reference]`) and `summary`'s error against
/// it: on latency when the reference gives one, else on bandwidth.
pub fn reference_comparison(
    job: &JobPlan,
    op: OpKind,
    summary: &Summary,
) -> Option<ReferenceComparison> {
    let r = job.reference.as_ref()?;
    let published = r.ops.get(&op)?;
    let error_pct = match (published.latency_us, published.logical_bw_gbps, published.so_bw_gbps) {
        (Some(lat), ..) => (summary.latency_us.mean - lat) / lat * 100.0,
        (None, Some(bw), _) => (summary.logical_bw_gbps - bw) / bw * 100.0,
        (None, None, Some(bw)) => (summary.so_bw_gbps.unwrap_or(0.0) - bw) / bw * 100.0,
        (None, None, None) => return None,
    };
    Some(ReferenceComparison {
        source: r.source.clone(),
        tolerance_pct: r.tolerance_pct,
        latency_us: published.latency_us,
        logical_bw_gbps: published.logical_bw_gbps,
        so_bw_gbps: published.so_bw_gbps,
        error_pct,
        within_tolerance: error_pct.abs() <= r.tolerance_pct,
    })
}

/// Facts about a job for tables and reports (tokens, hidden, ...), from the plan.
pub fn job_facts(job: &JobPlan) -> BTreeMap<String, Value> {
    match &job.kind {
        JobKind::DeepEp(d) => BTreeMap::from([
            ("tokens_per_rank".into(), json!(d.workload.tokens_per_rank)),
            ("hidden".into(), json!(d.workload.hidden)),
            ("topk".into(), json!(d.workload.topk)),
            ("experts".into(), json!(d.workload.experts)),
            ("seed".into(), json!(d.workload.seed)),
        ]),
        JobKind::Traffic(t) => BTreeMap::from([("bytes_per_rank".into(), json!(t.bytes_per_rank))]),
    }
}

#[cfg(test)]
mod tests;
