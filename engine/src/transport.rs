//! The backend boundary (docs/design.md, "The design contract"): one trait, implemented by the
//! simulator (`eptwin-sim`) and the hardware (`eptwin-hw`), driven by one run loop.
//!
//! API Boundary: everything a backend needs comes in the [`Plan`]; everything it reports goes
//! out in [`OpOutcome`]. Backends never read scenario files or write results.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::deepep::config::EpMode;
use crate::ids::JobId;
use crate::plan::{JobKind, Plan};
use crate::scenario::schema::OpKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Sim,
    Hw,
    /// Numbers imported from DeepEP's own test scripts (`eptwin deepep import`): measured by
    /// DeepEP, not by a transport of eptwin.
    DeepEp,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Sim => "sim",
            BackendKind::Hw => "hw",
            BackendKind::DeepEp => "deepep",
        }
    }
}

/// What a backend can run here. Anything outside it is *waived*, never a panic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capabilities {
    pub backend: BackendKind,
    /// Identity and versions recorded in results (simulator version, GPU names, driver, CUDA,
    /// NCCL, ...). `kind` is added by the run loop.
    pub identity: BTreeMap<String, serde_json::Value>,
    /// Set when the backend can run nothing on this machine (no GPU, no driver): one line.
    pub unavailable: Option<String>,
    pub modes: Vec<EpMode>,
    /// Runs DeepEP V2 (`ElasticBuffer`) jobs.
    #[serde(default)]
    pub elastic: bool,
    pub traffic: bool,
    /// Several jobs sharing the fabric at once (`OpSpec::Concurrent`).
    pub concurrent_jobs: bool,
    /// Upper bound on ranks (e.g. GPUs × ranks per GPU on a hardware machine).
    pub max_ranks: Option<u32>,
    /// Whether peers outside one NVLink domain can be reached (an RDMA device is present).
    pub rdma: bool,
    /// Why not, when `rdma` is false (the RDMA probe's one line).
    pub rdma_reason: Option<String>,
}

impl Capabilities {
    /// Why `plan` cannot run on this backend, or `None` when it can.
    pub fn waiver(&self, plan: &Plan) -> Option<String> {
        if let Some(reason) = &self.unavailable {
            return Some(reason.clone());
        }
        if plan.jobs.len() > 1 && !self.concurrent_jobs {
            return Some(format!(
                "{} jobs share the fabric; this backend runs one job at a time",
                plan.jobs.len()
            ));
        }
        for job in &plan.jobs {
            match &job.kind {
                JobKind::DeepEp(d) if d.elastic.is_some() && !self.elastic => {
                    return Some(format!(
                        "job {:?}: DeepEP V2 (ElasticBuffer) kernels are not supported by this backend; `eptwin deepep launch` runs them with DeepEP itself",
                        job.name
                    ));
                }
                JobKind::DeepEp(d) if d.elastic.is_none() && !self.modes.contains(&d.mode) => {
                    return Some(format!(
                        "job {:?}: {:?} kernels are not supported by this backend",
                        job.name, d.mode
                    ));
                }
                JobKind::Traffic(_) if !self.traffic => {
                    return Some(format!(
                        "job {:?}: background traffic is not supported by this backend",
                        job.name
                    ));
                }
                _ => {}
            }
            if let Some(max) = self.max_ranks
                && job.num_ranks() > max
            {
                return Some(format!(
                    "job {:?} needs {} ranks; this machine places at most {max}",
                    job.name,
                    job.num_ranks()
                ));
            }
        }
        let needs_rdma = plan.topology.nodes > 1
            && plan.jobs.iter().any(|j| {
                let nodes: std::collections::BTreeSet<u32> =
                    j.ranks.iter().map(|&r| plan.topology.node_of_rank(r)).collect();
                nodes.len() > 1
            });
        if needs_rdma && !self.rdma {
            return Some(match &self.rdma_reason {
                Some(reason) => format!("the scenario spans several nodes: {reason}"),
                None => "the scenario spans several nodes and this backend cannot reach them here"
                    .into(),
            });
        }
        None
    }
}

/// One unit of work for a backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum OpSpec {
    /// One timed op of one job: a DeepEP dispatch or combine (one kernel launch on hardware),
    /// a background transfer round, or a barrier.
    Op { job: JobId, op: OpKind, iteration: u32, warmup: bool },
    /// Every job at once on the shared fabric: each runs `warmup + iterations` rounds of its
    /// ops back to back, all starting together (docs/design.md: "Jobs start together").
    Concurrent { streams: Vec<StreamSpec> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamSpec {
    pub job: JobId,
    pub ops: Vec<OpKind>,
    pub warmup: u32,
    pub iterations: u32,
}

/// A time measured inside an op (hook mode's send and receive phases, notify, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseTime {
    pub name: String,
    pub latency_ns: f64,
}

/// One executed op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpSample {
    pub job: JobId,
    pub op: OpKind,
    pub iteration: u32,
    pub warmup: bool,
    /// The op's time: per-rank kernel time averaged over ranks (the simulator), or the
    /// CUDA-event time of the launch (hardware).
    pub latency_ns: f64,
    /// Bytes that crossed NVLink (or device-local copies between co-located ranks), all ranks.
    pub nvlink_bytes: u64,
    /// Payload bytes RDMA-written through NICs, all ranks.
    pub rdma_bytes: u64,
    /// Bytes on the InfiniBand/Ethernet wire including headers, all ranks.
    pub wire_bytes: u64,
    pub phases: Vec<PhaseTime>,
    /// Correctness checks this op failed (empty = all passed). Each names its coordinates.
    pub failures: Vec<String>,
    /// Checks that ran (names), so a result shows what was verified.
    pub checks: Vec<String>,
    /// Global ranks some rank of the job had masked by the op's end (DeepEP's shrink mode,
    /// `enable_shrink`: a rank whose messages timed out is skipped from then on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked_ranks: Vec<u32>,
}

impl OpSample {
    pub fn new(job: JobId, op: OpKind, iteration: u32, warmup: bool, latency_ns: f64) -> Self {
        OpSample {
            job,
            op,
            iteration,
            warmup,
            latency_ns,
            nvlink_bytes: 0,
            rdma_bytes: 0,
            wire_bytes: 0,
            phases: Vec::new(),
            failures: Vec::new(),
            checks: Vec::new(),
            masked_ranks: Vec::new(),
        }
    }
}

/// What executing an [`OpSpec`] produced: one sample per op run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpOutcome {
    pub samples: Vec<OpSample>,
    /// Extra measurements of the run (memcpy ceiling, NCCL baseline, ...), name → value.
    pub measurements: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TransportError {
    /// The backend cannot run this here: the run is *waived* (exit 77).
    #[error("waived: {0}")]
    Unsupported(String),
    /// A backend failure, with the coordinates (job, rank, QP, SL, VL, channel...) it concerns.
    #[error("{context}: {message}")]
    Backend { context: String, message: String },
    /// The simulator found one of its invariants broken (a bug in a model): coordinates + time.
    #[error("invariant violated: {0}")]
    Invariant(String),
    /// Something waited too long (a spin-wait on hardware, a deadlock in the simulator).
    #[error("timeout: {0}")]
    Timeout(String),
}

/// A communication backend.
pub trait Transport {
    /// What this backend can do here; unsupported plans are waived, never a panic.
    fn capabilities(&self) -> Capabilities;
    /// Allocate buffers, create QPs, compile kernels, build models.
    fn prepare(&mut self, plan: &Plan) -> Result<(), TransportError>;
    /// Run and time one op (or one concurrent session).
    fn execute(&mut self, op: &OpSpec) -> Result<OpOutcome, TransportError>;
}
