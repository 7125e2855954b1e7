//! A `Plan` is a validated scenario made concrete: resolved hardware, topology, fabric QoS,
//! and per job the DeepEP mode, Configs, environment, routing and logical byte counts. Both
//! backends execute the same Plan.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::deepep::bytes::{LogicalBytes, logical_bytes};
use crate::deepep::config::{Config, Direction, EpMode};
use crate::deepep::env::{EnvVar, NvshmemSettings, effective_env};
use crate::deepep::validate::validate;
use crate::diag::Diagnostic;
use crate::error::EngineError;
use crate::fabric::FabricQos;
use crate::ids::{JobId, Rank, Sl, Vl};
use crate::profile::HardwareProfile;
use crate::routing::{RoutingTable, generate};
use crate::scenario::LoadedScenario;
use crate::scenario::schema::{
    BufferSpec, OpKind, ReferenceSpec, Scenario, TrafficSpec, WorkloadSpec,
};
use crate::topology::Topology;

#[derive(Debug, Clone)]
pub struct Plan {
    pub scenario: Scenario,
    /// The path the scenario was read from (for messages).
    pub scenario_file: String,
    pub scenario_sha256: String,
    pub profile: HardwareProfile,
    pub topology: Topology,
    pub qos: FabricQos,
    pub jobs: Vec<JobPlan>,
    /// Advisories the validator raised (errors never reach a Plan).
    pub advisories: Vec<Diagnostic>,
}

#[derive(Debug, Clone)]
pub struct JobPlan {
    pub id: JobId,
    pub name: String,
    /// Global ranks, ascending; the job's rank `i` (DeepEP's rank in its group) is `ranks[i]`.
    pub ranks: Vec<Rank>,
    pub env: BTreeMap<String, EnvVar>,
    pub nvshmem: NvshmemSettings,
    pub sl: Sl,
    /// `None` on RoCE (priorities, not VLs) or when the SL is dropped.
    pub vl: Option<Vl>,
    pub warmup: u32,
    pub iterations: u32,
    pub ops: Vec<OpKind>,
    pub reference: Option<ReferenceSpec>,
    pub kind: JobKind,
}

#[derive(Debug, Clone)]
pub enum JobKind {
    DeepEp(Box<DeepEpJob>),
    Traffic(TrafficSpec),
}

#[derive(Debug, Clone, Serialize)]
pub struct DeepEpJob {
    pub mode: EpMode,
    pub buffer: BufferSpec,
    pub workload: WorkloadSpec,
    /// Normal modes: the resolved dispatch/combine `Config`; `None` in low-latency mode.
    pub dispatch_config: Option<Config>,
    pub combine_config: Option<Config>,
    pub num_local_experts: u32,
    /// Routing in job-rank space.
    pub routing: RoutingTable,
    pub logical: LogicalBytes,
}

impl JobPlan {
    pub fn num_ranks(&self) -> u32 {
        self.ranks.len() as u32
    }

    pub fn deepep(&self) -> Option<&DeepEpJob> {
        match &self.kind {
            JobKind::DeepEp(job) => Some(job),
            JobKind::Traffic(_) => None,
        }
    }

    pub fn traffic(&self) -> Option<&TrafficSpec> {
        match &self.kind {
            JobKind::Traffic(t) => Some(t),
            JobKind::DeepEp(_) => None,
        }
    }

    /// The logical bytes per rank (mean) DeepEP's tests count for `op`.
    pub fn logical_bytes_per_rank(&self, op: OpKind) -> f64 {
        match (&self.kind, op) {
            (JobKind::DeepEp(j), OpKind::Dispatch) => {
                LogicalBytes::mean(&j.logical.dispatch_per_rank)
            }
            (JobKind::DeepEp(j), OpKind::Combine) => {
                LogicalBytes::mean(&j.logical.combine_per_rank)
            }
            (JobKind::Traffic(t), OpKind::Transfer) => t.bytes_per_rank.bytes() as f64,
            _ => 0.0,
        }
    }

    pub fn logical_bw_label(&self) -> &str {
        match &self.kind {
            JobKind::DeepEp(j) => &j.logical.label,
            JobKind::Traffic(_) => "algbw",
        }
    }
}

impl Plan {
    /// Validate and plan. Errors (with every diagnostic) when the scenario breaks any rule.
    pub fn build(loaded: &LoadedScenario) -> Result<Plan, EngineError> {
        let (diagnostics, validated) = validate(&loaded.scenario, &loaded.source);
        let Some(v) = validated else {
            return Err(EngineError::Invalid { file: loaded.file().to_string(), diagnostics });
        };
        let advisories = diagnostics;
        let scn = &loaded.scenario;
        let mut jobs = Vec::with_capacity(scn.jobs.len());
        for (i, (spec, ranks)) in scn.jobs.iter().zip(&v.job_ranks).enumerate() {
            let n = ranks.len() as u32;
            let (kind, mode, warmup, iterations, ops) =
                match (&spec.buffer, &spec.workload, &spec.traffic) {
                    (Some(buffer), Some(workload), _) => {
                        let mode = EpMode::new(buffer.low_latency_mode, n);
                        let normal = mode != EpMode::LowLatency;
                        let routing = generate(workload, n);
                        let logical = logical_bytes(
                            mode,
                            &routing,
                            workload.hidden,
                            workload.dispatch_dtype,
                            workload.combine_dtype,
                        );
                        let job = DeepEpJob {
                            mode,
                            buffer: buffer.clone(),
                            workload: workload.clone(),
                            dispatch_config: normal
                                .then(|| {
                                    Config::resolve(
                                        Direction::Dispatch,
                                        n,
                                        buffer.num_sms,
                                        &buffer.dispatch_config,
                                    )
                                })
                                .flatten(),
                            combine_config: normal
                                .then(|| {
                                    Config::resolve(
                                        Direction::Combine,
                                        n,
                                        buffer.num_sms,
                                        &buffer.combine_config,
                                    )
                                })
                                .flatten(),
                            num_local_experts: workload.experts / n,
                            routing,
                            logical,
                        };
                        (
                            JobKind::DeepEp(Box::new(job)),
                            Some(mode),
                            workload.warmup,
                            workload.iterations,
                            workload.ops.clone(),
                        )
                    }
                    (_, _, Some(traffic)) => (
                        JobKind::Traffic(traffic.clone()),
                        None,
                        traffic.warmup,
                        traffic.iterations,
                        traffic.ops.clone(),
                    ),
                    _ => unreachable!("the validator guarantees each job has a kind"),
                };
            let env = effective_env(&spec.env, spec.buffer.as_ref(), mode);
            let nvshmem = NvshmemSettings::from_env(&env);
            let sl = Sl(nvshmem.ib_sl);
            jobs.push(JobPlan {
                id: JobId(i as u32),
                name: spec.name.clone(),
                ranks: ranks.iter().map(|&r| Rank(r)).collect(),
                vl: v
                    .qos
                    .vl_of(sl)
                    .filter(|_| v.qos.kind == crate::scenario::schema::FabricKind::Infiniband),
                env,
                nvshmem,
                sl,
                warmup,
                iterations,
                ops,
                reference: spec.reference.clone(),
                kind,
            });
        }
        Ok(Plan {
            scenario: scn.clone(),
            scenario_file: loaded.file().to_string(),
            scenario_sha256: loaded.sha256.clone(),
            profile: v.profile,
            topology: v.topology,
            qos: v.qos,
            jobs,
            advisories,
        })
    }

    pub fn job(&self, id: JobId) -> &JobPlan {
        &self.jobs[id.index()]
    }
}
