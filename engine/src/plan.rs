//! A `Plan` is a validated scenario made concrete: resolved hardware, topology, fabric QoS,
//! and per job the DeepEP mode, Configs, environment, typed NVSHMEM settings, lane, routing
//! and logical byte counts. Both backends execute the same Plan.
//!
//! Its types hold typed, resolved values (sizes in bytes, `Dtype`, `Routing`, `Lane`), never
//! the scenario file's structs. Backends name them through `eptwin_engine::api`. The DeepEP
//! rules both backends need are here once: `channel_range`, `Plan::low_latency_path`,
//! `JobPlan::qps_per_peer` (`plan/rules.rs`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::deepep::bytes::{LogicalBytes, logical_bytes};
use crate::deepep::env::EnvVar;
use crate::ids::{JobId, Rank, Sl, Vl};
use crate::result::RoutingFileRecord;
use crate::routing::generate;
use crate::scenario::schema::{ReferenceSpec, TrafficSpec};

mod rules;

pub use rules::channel_range;

// The hardware backend's paths to the types `crate::api` names: kept, hidden, until it names
// `api` (ARCHITECTURE.md, "API Boundary"); nothing else uses them.
#[doc(hidden)]
pub use crate::cluster_ring::{CLUSTER_INDEX_BYTES, ClusterSlot, cluster_ring_slots};
#[doc(hidden)]
pub use crate::deepep::buffer::BufferSettings;
#[doc(hidden)]
pub use crate::deepep::bytes::{
    fp8_scale_bytes, ll_combine_msg_bytes, ll_dispatch_msg_bytes, logical_row_bytes,
    normal_combine_token_bytes, normal_dispatch_token_bytes,
};
#[doc(hidden)]
pub use crate::deepep::config::{Config, EpMode};
#[doc(hidden)]
pub use crate::deepep::env::NvshmemSettings;
#[doc(hidden)]
pub use crate::fabric::{FabricQos, HIGH_LIMIT_UNBOUNDED, Lane, VlArbEntry};
#[doc(hidden)]
pub use crate::profile::{HardwareProfile, SwitchMode};
#[doc(hidden)]
pub use crate::routing::RoutingTable;
#[doc(hidden)]
pub use crate::scenario::schema::{
    Dtype, FabricKind, FabricRouting, FabricTopology, NvlinkKind, OpKind, TrafficPattern,
};
#[doc(hidden)]
pub use crate::topology::{NUM_MAX_NVL_PEERS, PeerPath, Topology};
#[doc(hidden)]
pub use crate::workload::{Routing, Workload};

#[derive(Debug, Clone)]
pub struct Plan {
    /// The scenario's `name` and `description`.
    pub name: String,
    pub description: String,
    /// The path the scenario was read from (for messages).
    pub scenario_file: String,
    pub scenario_sha256: String,
    pub profile: HardwareProfile,
    pub topology: Topology,
    pub qos: FabricQos,
    pub jobs: Vec<JobPlan>,
    /// Advisories the validator raised (errors never reach a Plan).
    pub advisories: Vec<crate::diag::Diagnostic>,
}

#[derive(Debug, Clone)]
pub struct JobPlan {
    pub id: JobId,
    pub name: String,
    /// Global ranks, ascending; the job's rank `i` (DeepEP's rank in its group) is `ranks[i]`.
    pub ranks: Vec<Rank>,
    /// The final environment (`eptwin env` prints it).
    pub env: BTreeMap<String, EnvVar>,
    /// What NVSHMEM reads from that environment.
    pub nvshmem: NvshmemSettings,
    pub sl: Sl,
    /// The VL the SL maps to (InfiniBand) or the Ethernet priority (RoCE).
    pub lane: Lane,
    pub warmup: u32,
    pub iterations: u32,
    pub ops: Vec<OpKind>,
    pub reference: Option<ReferenceSpec>,
    pub kind: JobKind,
}

#[derive(Debug, Clone)]
pub enum JobKind {
    DeepEp(Box<DeepEpJob>),
    Traffic(TrafficJob),
}

/// A DeepEP job: its mode, `Buffer` arguments, workload and resolved `Config`s; the routing
/// and logical byte counts generated from them on first use (validating a scenario never
/// generates its tables; `Plan::build` does, once). A file routing is the exception: the
/// validator reads the file to check it and the job holds its table from then on.
#[derive(Debug, Clone)]
pub struct DeepEpJob {
    pub mode: EpMode,
    pub buffer: BufferSettings,
    pub workload: Workload,
    /// Normal modes: the resolved dispatch/combine `Config`; `None` in low-latency mode.
    pub dispatch_config: Option<Config>,
    pub combine_config: Option<Config>,
    pub num_local_experts: u32,
    /// The routing file a `Routing::File` job replays: where it was read and its sha256
    /// (results record both).
    pub routing_file: Option<RoutingFileRef>,
    num_ranks: u32,
    generated: OnceLock<Generated>,
}

/// The routing file a job ran, as results name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingFileRef {
    /// The path it was read from (the scenario's directory joined with a relative path).
    pub file: String,
    pub sha256: String,
}

#[derive(Debug, Clone)]
struct Generated {
    routing: RoutingTable,
    logical: LogicalBytes,
}

impl DeepEpJob {
    pub fn new(
        mode: EpMode,
        buffer: BufferSettings,
        workload: Workload,
        configs: (Option<Config>, Option<Config>),
        num_ranks: u32,
    ) -> DeepEpJob {
        DeepEpJob {
            mode,
            num_local_experts: workload.experts / num_ranks.max(1),
            buffer,
            workload,
            dispatch_config: configs.0,
            combine_config: configs.1,
            routing_file: None,
            num_ranks,
            generated: OnceLock::new(),
        }
    }

    /// The job replaying a routing read from a file (the validator read and checked it for
    /// this job's shape): the table is held from now on instead of generated.
    pub fn with_routing_file(mut self, loaded: crate::routing_file::LoadedRouting) -> DeepEpJob {
        let w = &self.workload;
        let logical =
            logical_bytes(self.mode, &loaded.table, w.hidden, w.dispatch_dtype, w.combine_dtype);
        self.generated = OnceLock::from(Generated { routing: loaded.table, logical });
        self.routing_file = Some(RoutingFileRef { file: loaded.file, sha256: loaded.sha256 });
        self
    }

    /// Generates the routing and logical bytes now (`Plan::build` does, once per job).
    pub(crate) fn generate_tables(&self) {
        self.generated();
    }

    fn generated(&self) -> &Generated {
        self.generated.get_or_init(|| {
            // A file routing's table is set when the job is built (`with_routing_file`);
            // generating one here would replay an all-masked routing.
            debug_assert!(self.workload.routing != Routing::File, "file routing without its table");
            let routing = generate(&self.workload, self.num_ranks);
            let w = &self.workload;
            let logical =
                logical_bytes(self.mode, &routing, w.hidden, w.dispatch_dtype, w.combine_dtype);
            Generated { routing, logical }
        })
    }

    /// Routing in job-rank space: generated from the workload's seed, or the table of its
    /// routing file.
    pub fn routing(&self) -> &RoutingTable {
        &self.generated().routing
    }

    /// The logical bytes DeepEP's tests count, per rank.
    pub fn logical(&self) -> &LogicalBytes {
        &self.generated().logical
    }
}

/// A background traffic job (`[job.traffic]`), sizes in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrafficJob {
    pub pattern: TrafficPattern,
    pub bytes_per_rank: u64,
    /// Largest RDMA write per work request, when the scenario caps it.
    pub message_bytes: Option<u64>,
    /// The receiving global rank of an incast.
    pub incast_target: Option<Rank>,
    pub qps_per_peer: u32,
    /// Skip NVLink for peers in the same domain.
    pub rdma_only: bool,
}

impl From<&TrafficSpec> for TrafficJob {
    fn from(t: &TrafficSpec) -> Self {
        TrafficJob {
            pattern: t.pattern,
            bytes_per_rank: t.bytes_per_rank.bytes(),
            message_bytes: t.message_bytes.map(|b| b.bytes()),
            incast_target: t.incast_target.map(Rank),
            qps_per_peer: t.qps_per_peer,
            rdma_only: t.rdma_only,
        }
    }
}

impl JobPlan {
    pub fn num_ranks(&self) -> u32 {
        self.ranks.len() as u32
    }

    /// The VL the job's packets travel on (InfiniBand).
    pub fn vl(&self) -> Option<Vl> {
        self.lane.vl()
    }

    pub fn deepep(&self) -> Option<&DeepEpJob> {
        match &self.kind {
            JobKind::DeepEp(job) => Some(job),
            JobKind::Traffic(_) => None,
        }
    }

    pub fn traffic(&self) -> Option<&TrafficJob> {
        match &self.kind {
            JobKind::Traffic(t) => Some(t),
            JobKind::DeepEp(_) => None,
        }
    }

    /// The logical bytes per rank (mean) DeepEP's tests count for `op`.
    pub fn logical_bytes_per_rank(&self, op: OpKind) -> f64 {
        match (&self.kind, op) {
            (JobKind::DeepEp(j), OpKind::Dispatch) => {
                LogicalBytes::mean(&j.logical().dispatch_per_rank)
            }
            (JobKind::DeepEp(j), OpKind::Combine) => {
                LogicalBytes::mean(&j.logical().combine_per_rank)
            }
            (JobKind::Traffic(t), OpKind::Transfer) => t.bytes_per_rank as f64,
            _ => 0.0,
        }
    }

    pub fn logical_bw_label(&self) -> &str {
        match &self.kind {
            JobKind::DeepEp(j) => &j.logical().label,
            JobKind::Traffic(_) => "algbw",
        }
    }
}

impl Plan {
    pub fn job(&self, id: JobId) -> &JobPlan {
        &self.jobs[id.index()]
    }

    /// The routing files the jobs replay, in job order (results record them).
    pub fn routing_files(&self) -> Vec<RoutingFileRecord> {
        self.jobs
            .iter()
            .filter_map(|j| {
                let f = j.deepep()?.routing_file.as_ref()?;
                Some(RoutingFileRecord {
                    job: j.name.clone(),
                    file: f.file.clone(),
                    sha256: f.sha256.clone(),
                })
            })
            .collect()
    }

    /// The sha256 of everything the plan was read from: the scenario's text alone when no job
    /// replays a routing file (then it is `scenario_sha256`), else the scenario's and every
    /// routing file's digest together. Processes of one run compare it, so each must have read
    /// the same routing as well as the same scenario.
    pub fn inputs_sha256(&self) -> String {
        let files = self.routing_files();
        if files.is_empty() {
            return self.scenario_sha256.clone();
        }
        let mut text = self.scenario_sha256.clone();
        for f in &files {
            text.push('\n');
            text.push_str(&f.sha256);
        }
        crate::scenario::sha256_hex(text.as_bytes())
    }
}
