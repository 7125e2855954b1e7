//! What a replay reads from a plan and the scenario it was built from ([`Subject`]), and the
//! ways the scripts differ from it ([`Note`]).

use std::fmt;

use eptwin_engine::api::{Config, EpMode};
use eptwin_engine::api::{JobKind, Plan};
use eptwin_engine::deepep::env::EnvOrigin;
use eptwin_engine::scenario::schema::{BufferSpec, NvlinkKind, OpKind, Scenario, WorkloadSpec};

/// What a replay reads from a [`Plan`]: the one place that knows the plan's types.
#[derive(Debug, Clone)]
pub struct Subject {
    pub file: String,
    pub name: String,
    pub sha256: String,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub ranks_per_gpu: u32,
    pub nvlink: NvlinkKind,
    pub jobs: Vec<SubjectJob>,
}

#[derive(Debug, Clone)]
pub struct SubjectJob {
    pub name: String,
    pub num_ranks: u32,
    /// Whether the job holds every rank of the cluster (the scripts run on all GPUs).
    pub all_ranks: bool,
    /// Variables the user sets and DeepEP does not write (DeepEP's own writes are left to it).
    pub user_env: Vec<(String, String)>,
    pub ops: Vec<OpKind>,
    /// `None` for a background traffic job.
    pub deepep: Option<SubjectDeepEp>,
}

#[derive(Debug, Clone)]
pub struct SubjectDeepEp {
    pub mode: EpMode,
    pub buffer: BufferSpec,
    pub workload: WorkloadSpec,
    pub dispatch_config: Option<Config>,
    pub combine_config: Option<Config>,
}

impl Subject {
    /// `scenario` is the parsed file `plan` was built from: the replay compares keys as written
    /// (explicit ring sizes, `enable_shrink`, `topk_groups`), which the plan resolves away.
    pub fn from_plan(plan: &Plan, scenario: &Scenario) -> Subject {
        let t = &plan.topology;
        let cluster_ranks = t.nodes * t.gpus_per_node * t.ranks_per_gpu;
        let jobs = plan
            .jobs
            .iter()
            .zip(&scenario.jobs)
            .map(|(job, spec)| SubjectJob {
                name: job.name.clone(),
                num_ranks: job.num_ranks(),
                all_ranks: job.num_ranks() == cluster_ranks,
                user_env: job
                    .env
                    .iter()
                    .filter(|(_, v)| v.origin != EnvOrigin::DeepEp)
                    .map(|(k, v)| (k.clone(), v.value.clone()))
                    .collect(),
                ops: job.ops.clone(),
                deepep: match (&job.kind, &spec.buffer, &spec.workload) {
                    (JobKind::DeepEp(d), Some(buffer), Some(workload)) => Some(SubjectDeepEp {
                        mode: d.mode,
                        buffer: buffer.clone(),
                        workload: workload.clone(),
                        dispatch_config: d.dispatch_config,
                        combine_config: d.combine_config,
                    }),
                    _ => None,
                },
            })
            .collect();
        Subject {
            file: plan.scenario_file.clone(),
            name: plan.name.clone(),
            sha256: plan.scenario_sha256.clone(),
            nodes: t.nodes,
            gpus_per_node: t.gpus_per_node,
            ranks_per_gpu: t.ranks_per_gpu,
            nvlink: t.nvlink,
            jobs,
        }
    }
}

/// How much a difference between the scenario and the script matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The replay would run as the scenario says, or the difference does not change what is
    /// timed: a note on stderr (and an advisory in imported results).
    Warning,
    /// The replay would measure something else: no commands, exit 2.
    Refused,
}

/// One way the scripts differ from the scenario: the key, both values and why it matters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub severity: Severity,
    /// The job it concerns (`None` for the cluster and the job list).
    pub job: Option<String>,
    /// The scenario key (`job.buffer.num_qps_per_rank`, `cluster.ranks_per_gpu`, ...).
    pub key: String,
    pub scenario_value: String,
    /// What the script does, naming it ("test_low_latency.py uses 18 (experts / ranks)").
    pub script_value: String,
    pub why: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Warning => "warning",
            Severity::Refused => "refused",
        };
        write!(f, "{level}: ")?;
        if let Some(job) = &self.job {
            write!(f, "job {job:?}: ")?;
        }
        write!(
            f,
            "{}: the scenario has {}, {}: {}",
            self.key, self.scenario_value, self.script_value, self.why
        )
    }
}
