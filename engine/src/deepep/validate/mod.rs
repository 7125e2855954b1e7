//! Every rule DeepEP V1 (and NVSHMEM, and the fabric) enforces on a configuration, plus
//! advisories that are not errors, in one pass that also settles the plan's typed values:
//! each rule family parses what it checks once and hands the typed result on. Sources are
//! cited per rule (docs/design.md, DeepEP §5 and friends). The validator reports everything it
//! finds, never just the first problem.
//!
//! Rule families, in the order they run: `cluster` (name, profile, limits and ranges,
//! cluster shape, fabric QoS); per job `env` (NVSHMEM and eptwin variables, the SL's lane),
//! then `traffic` or `deepep` (rank geometry, `buffer`, `workload`, `normal` or
//! `low_latency`, the NVLink check); last, `env`'s advice on jobs sharing a VL.

mod buffer;
mod cluster;
mod deepep;
mod env;
mod low_latency;
mod normal;
mod traffic;
mod workload;

use std::collections::BTreeMap;

use crate::deepep::config::EpMode;
use crate::deepep::env::effective_env;
use crate::diag::{Diagnostic, Diagnostics};
use crate::error::EngineError;
use crate::fabric::{FabricQos, Lane};
use crate::ids::{JobId, Rank, Sl, Vl};
use crate::plan::{BufferSettings, JobKind, JobPlan, Plan, TrafficJob};
use crate::profile::HardwareProfile;
use crate::scenario::LoadedScenario;
use crate::scenario::schema::{JobSpec, Scenario};
use crate::scenario::sha256_hex;
use crate::scenario::source::SourceMap;
use crate::topology::Topology;

/// ibgda_device.cuh static assert: minimum QP depth.
const IBGDA_MIN_QP_DEPTH: u32 = 64;

/// Validate a parsed scenario and resolve it: every diagnostic (errors and advisories) and,
/// when there are no errors, the plan. `Plan::build` wraps this; routing is generated only
/// when first asked for, so validating never builds workload tables (a routing file is read
/// here: checking it is validating it, and the plan holds its table).
pub fn validate(scn: &Scenario, src: &SourceMap) -> (Vec<Diagnostic>, Option<Plan>) {
    let mut d = Diagnostics::new(src);
    let plan = resolve(scn, &mut d);
    let ok = !d.has_errors();
    let diagnostics = d.items;
    let plan = plan.filter(|_| ok).map(|plan| Plan { advisories: diagnostics.clone(), ..plan });
    (diagnostics, plan)
}

/// One job as its rules see it: where its keys live, its ranks, the cluster.
struct Job<'a> {
    spec: &'a JobSpec,
    /// `job[i]`, the prefix of the job's keys.
    prefix: String,
    /// Sorted global ranks.
    ranks: &'a [u32],
    profile: &'a HardwareProfile,
    topo: &'a Topology,
}

impl Job<'_> {
    fn name(&self) -> Option<&str> {
        Some(self.spec.name.as_str())
    }
}

fn resolve(scn: &Scenario, d: &mut Diagnostics<'_>) -> Option<Plan> {
    cluster::check_name(scn, d);
    let profile = cluster::profile(scn, d)?;
    if !cluster::check_limits(scn, &profile, d) {
        return None;
    }
    let topology = Topology::from_profile(&profile.cluster);
    cluster::check_shape(&topology, d);
    let qos = cluster::fabric_qos(scn, &profile, d);

    if scn.jobs.is_empty() {
        d.error("jobs", "job", None, "a scenario needs at least one [[job]]".into());
    }
    let mut names = BTreeMap::new();
    let mut jobs = Vec::new();
    let mut job_vls = Vec::new();
    for (i, spec) in scn.jobs.iter().enumerate() {
        let prefix = format!("job[{i}]");
        if let Some(first) = names.insert(spec.name.clone(), i) {
            d.error(
                "job-name",
                &format!("{prefix}.name"),
                Some(&spec.name),
                format!("the name is already used by job[{first}]; job names must be unique"),
            );
        }
        let ranks = match spec.ranks.resolve(topology.num_ranks()) {
            Ok(r) => r,
            Err(message) => {
                d.error("job-ranks", &format!("{prefix}.ranks"), Some(&spec.name), message);
                job_vls.push(None);
                jobs.push(None);
                continue;
            }
        };
        let job = Job { spec, prefix, ranks: &ranks, profile: &profile, topo: &topology };
        let (vl, plan) = resolve_job(JobId(i as u32), &job, qos.as_ref(), d);
        job_vls.push(vl);
        jobs.push(plan);
    }
    env::check_shared_vls(scn, &job_vls, d);

    let qos = qos?;
    let jobs = jobs.into_iter().collect::<Option<Vec<JobPlan>>>()?;
    Some(Plan {
        name: scn.name.clone(),
        description: scn.description.clone(),
        scenario_file: d.source().file().to_string(),
        scenario_sha256: sha256_hex(d.source().text().as_bytes()),
        profile,
        topology,
        qos,
        jobs,
        advisories: Vec::new(),
    })
}

/// One job's rules and, when none failed, its plan; also the VL it travels on (for the
/// shared-VL advice).
fn resolve_job(
    id: JobId,
    job: &Job<'_>,
    qos: Option<&FabricQos>,
    d: &mut Diagnostics<'_>,
) -> (Option<Vl>, Option<JobPlan>) {
    let spec = job.spec;
    let mode =
        spec.buffer.as_ref().map(|b| EpMode::new(b.low_latency_mode, job.ranks.len() as u32));
    let user = env::check_job_env(job, mode.is_some_and(EpMode::uses_nvshmem), d);
    let lane = qos.and_then(|q| env::check_job_sl(job, Sl(user.nvshmem.ib_sl), q, d));
    let vl = lane.and_then(Lane::vl);
    let deepep = match (&spec.buffer, mode, &spec.workload) {
        (Some(b), Some(mode), Some(_)) => Some((BufferSettings::from(b), mode)),
        _ => None,
    };
    let (env, nvshmem) =
        effective_env(&spec.env, user.nvshmem, deepep.as_ref().map(|(b, m)| (b, *m)));
    let kind = match (&spec.buffer, &spec.workload, &spec.traffic) {
        (Some(buffer), Some(workload), None) => {
            deepep::check(job, buffer, workload, &nvshmem, user.disable_nvlink_check, d).map(|j| {
                (
                    JobKind::DeepEp(Box::new(j)),
                    workload.warmup,
                    workload.iterations,
                    workload.ops.clone(),
                )
            })
        }
        (None, None, Some(traffic)) => {
            traffic::check(job, traffic, d);
            Some((
                JobKind::Traffic(TrafficJob::from(traffic)),
                traffic.warmup,
                traffic.iterations,
                traffic.ops.clone(),
            ))
        }
        (_, _, Some(_)) => {
            d.error(
                "job-kind",
                &format!("{}.traffic", job.prefix),
                Some(&spec.name),
                "a job has either [job.buffer] + [job.workload] (DeepEP) or [job.traffic] (background), not both".into(),
            );
            None
        }
        (buffer, _, None) => {
            let missing = if buffer.is_none() { "buffer" } else { "workload" };
            d.error(
                "job-kind",
                &job.prefix,
                Some(&spec.name),
                format!("missing [job.{missing}]: a DeepEP job needs [job.buffer] and [job.workload]; a background job needs [job.traffic]"),
            );
            None
        }
    };
    let (Some(lane), Some((kind, warmup, iterations, ops))) = (lane, kind) else {
        return (vl, None);
    };
    let plan = JobPlan {
        id,
        name: spec.name.clone(),
        ranks: job.ranks.iter().map(|&r| Rank(r)).collect(),
        env,
        nvshmem,
        sl: Sl(nvshmem.ib_sl),
        lane,
        warmup,
        iterations,
        ops,
        reference: spec.reference.clone(),
        kind,
    };
    (vl, Some(plan))
}

impl Plan {
    /// Validate and plan (the validator's one pass, [`validate`]), then
    /// generate every DeepEP job's routing. Errors (with every diagnostic) when the scenario
    /// breaks any rule.
    pub fn build(loaded: &LoadedScenario) -> Result<Plan, EngineError> {
        let (diagnostics, plan) = validate(&loaded.scenario, &loaded.source);
        let plan = plan
            .ok_or_else(|| EngineError::Invalid { file: loaded.file().to_string(), diagnostics })?;
        for job in plan.jobs.iter().filter_map(JobPlan::deepep) {
            job.generate_tables();
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests;
