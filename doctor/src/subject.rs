//! What a scenario asks of one node, read from the engine's `Plan`: per job, its DeepEP
//! version and mode, its ranks on this node and their GPUs, its QPs, and the environment
//! NVSHMEM (V1) or NCCL GIN (V2) will read — `eptwin env`'s environment with the process's
//! own variables under it.

use std::collections::BTreeMap;

use eptwin_engine::Plan;
use eptwin_engine::api::{EpMode, FabricKind, NvlinkKind, NvshmemSettings};
use eptwin_engine::diag::Diagnostic;

/// Which DeepEP a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// V1 `Buffer` over NVSHMEM IBGDA.
    V1,
    /// V2 `ElasticBuffer` over NCCL GIN (DeepEP §16).
    V2 {
        allow_hybrid_mode: bool,
        /// 0 = V2's automatic count.
        num_allocated_qps: u32,
        sl_idx: u8,
    },
}

/// `ElasticBuffer`'s automatic QP count (`elastic.py:326-334`, DeepEP §16): 65 in hybrid mode
/// on NICs with fast RDMA atomics (CX8, "MT4131"), else 129; 17 in direct mode.
pub fn v2_auto_qps(hybrid: bool, fast_rdma_atomics: bool) -> u32 {
    match (hybrid, fast_rdma_atomics) {
        (true, true) => 65,
        (true, false) => 129,
        (false, _) => 17,
    }
}

/// NCCL GIN's queue depth in V2 (`kGinQPDepth`, common/compiled.cuh:84).
pub const V2_GIN_QP_DEPTH: u32 = 1024;

/// One job as a node sees it.
#[derive(Debug, Clone)]
pub struct JobSubject {
    pub name: String,
    pub api: Api,
    /// `None` for a background traffic job.
    pub mode: Option<EpMode>,
    pub num_ranks: u32,
    /// Physical nodes the job's ranks span.
    pub nodes: u32,
    /// The local GPU index (0-based on this node) of each of the job's ranks on this node.
    pub local_gpus: Vec<u32>,
    /// RC QPs between two ranks that exchange over RDMA (the engine's
    /// `JobPlan::qps_per_peer`: `NVSHMEM_IBGDA_NUM_RC_PER_PE`, i.e. V1's `num_qps_per_rank`).
    pub qps_per_peer: u32,
    /// Low-latency buffer capacity T.
    pub max_dispatch_tokens: Option<u32>,
    /// The variables the communication library reads: the job's environment as DeepEP leaves
    /// it (`eptwin env`), over the process's own.
    pub env: BTreeMap<String, String>,
    pub nvshmem: NvshmemSettings,
    pub allow_mnnvl: bool,
    pub use_fabric: bool,
}

impl JobSubject {
    pub fn is_v2(&self) -> bool {
        matches!(self.api, Api::V2 { .. })
    }

    /// Whether the job's ranks talk over the NICs at all.
    pub fn crosses_nodes(&self) -> bool {
        self.nodes > 1
    }

    pub fn env_bool(&self, name: &str) -> bool {
        self.env.get(name).is_some_and(|v| eptwin_engine::deepep::env::parse_env_bool(v))
    }
}

/// A scenario as a node sees it.
#[derive(Debug, Clone)]
pub struct Subject {
    pub file: String,
    pub name: String,
    pub fabric: FabricKind,
    pub mtu: u32,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub ranks_per_gpu: u32,
    pub nvlink: NvlinkKind,
    pub jobs: Vec<JobSubject>,
    /// The validator's advisories (errors never reach a Plan).
    pub advisories: Vec<Diagnostic>,
}

impl Subject {
    /// The scenario's jobs on the first node each touches (every node of a scenario has the
    /// same shape), with `process_env` under each job's environment.
    pub fn from_plan(plan: &Plan, process_env: &BTreeMap<String, String>) -> Subject {
        let topo = &plan.topology;
        let jobs = plan
            .jobs
            .iter()
            .map(|job| {
                let mut nodes: Vec<u32> = job.ranks.iter().map(|&r| topo.node_of_rank(r)).collect();
                nodes.dedup();
                let first = nodes.first().copied().unwrap_or(0);
                let local_gpus = job
                    .ranks
                    .iter()
                    .filter(|&&r| topo.node_of_rank(r) == first)
                    .map(|&r| topo.local_gpu_index(topo.gpu_of(r)))
                    .collect();
                let mut env = process_env.clone();
                env.extend(job.env.iter().map(|(k, v)| (k.clone(), v.value.clone())));
                let deepep = job.deepep();
                JobSubject {
                    name: job.name.clone(),
                    api: Api::V1,
                    mode: deepep.map(|d| d.mode),
                    num_ranks: job.num_ranks(),
                    nodes: nodes.len() as u32,
                    local_gpus,
                    qps_per_peer: job.qps_per_peer(),
                    max_dispatch_tokens: deepep
                        .filter(|d| d.mode == EpMode::LowLatency)
                        .map(|d| d.workload.max_dispatch_tokens_per_rank),
                    env,
                    nvshmem: job.nvshmem,
                    allow_mnnvl: deepep.is_some_and(|d| d.buffer.allow_mnnvl),
                    use_fabric: deepep.is_some_and(|d| d.buffer.use_fabric),
                }
            })
            .collect();
        Subject {
            file: plan.scenario_file.clone(),
            name: plan.name.clone(),
            fabric: plan.profile.fabric.kind,
            mtu: plan.profile.fabric.mtu,
            nodes: topo.nodes,
            gpus_per_node: topo.gpus_per_node,
            ranks_per_gpu: topo.ranks_per_gpu,
            nvlink: topo.nvlink,
            jobs,
            advisories: plan.advisories.clone(),
        }
    }

    /// Jobs that are DeepEP jobs (not background traffic).
    pub fn deepep_jobs(&self) -> impl Iterator<Item = &JobSubject> {
        self.jobs.iter().filter(|j| j.mode.is_some())
    }

    /// Whether any job's ranks talk over the NICs.
    pub fn needs_rdma(&self) -> bool {
        self.jobs.iter().any(JobSubject::crosses_nodes)
    }

    pub fn any_v2(&self) -> bool {
        self.jobs.iter().any(JobSubject::is_v2)
    }

    pub fn any_v1_nvshmem(&self) -> bool {
        self.deepep_jobs().any(|j| !j.is_v2() && j.mode.is_some_and(EpMode::uses_nvshmem))
    }
}
