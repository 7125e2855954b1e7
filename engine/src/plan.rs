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
use crate::deepep::elastic::{ElasticBytes, ElasticSettings};
use crate::deepep::env::EnvVar;
use crate::ids::{JobId, Rank, Sl, Vl};
use crate::result::RoutingFileRecord;
use crate::routing::generate;
use crate::scenario::schema::{ReferenceSpec, TrafficSpec};

mod rules;

pub use rules::channel_range;

use crate::deepep::buffer::BufferSettings;
use crate::deepep::config::{Config, EpMode};
use crate::deepep::env::NvshmemSettings;
use crate::fabric::{FabricQos, Lane};
use crate::fault::Faults;
use crate::profile::HardwareProfile;
use crate::routing::RoutingTable;
use crate::scenario::schema::{OpKind, TrafficPattern};
use crate::topology::Topology;
use crate::workload::{Routing, Workload};

#[derive(Debug, Clone)]
pub struct Plan {
    /// The scenario's `name` and `description`.
    pub name: String,
    pub description: String,
    /// The path the scenario was read from (for messages).
    pub scenario_file: String,
    pub scenario_sha256: String,
    pub profile: HardwareProfile,
    /// The profile file the scenario names, when it names one (results record it).
    pub profile_file: Option<crate::result::ProfileFileRecord>,
    pub topology: Topology,
    pub qos: FabricQos,
    pub jobs: Vec<JobPlan>,
    /// The faults the run injects (`[[fault]]`; empty for a healthy cluster).
    pub faults: Faults,
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
    /// DeepEP V2 (`api = "elastic"`): `ElasticBuffer`'s resolved settings; `None` for V1.
    /// `mode` then only says whether the job spans several NVLink domains.
    pub elastic: Option<ElasticSettings>,
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
            elastic: None,
            num_ranks,
            generated: OnceLock::new(),
        }
    }

    /// The job replaying a routing read from a file (the validator read and checked it for
    /// this job's shape): the table is held from now on instead of generated.
    pub fn with_routing_file(mut self, loaded: crate::routing_file::LoadedRouting) -> DeepEpJob {
        let logical = self.count_logical(&loaded.table);
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
            let logical = self.count_logical(&routing);
            Generated { routing, logical }
        })
    }

    /// The bytes the job's own test counts: V1's (`logical_bytes`), or V2's scale-out bytes
    /// as the bottleneck column with the scale-up bytes in the "(NVL)" one.
    fn count_logical(&self, routing: &RoutingTable) -> LogicalBytes {
        let w = &self.workload;
        let Some(e) = &self.elastic else {
            return logical_bytes(self.mode, routing, w.hidden, w.dispatch_dtype, w.combine_dtype);
        };
        let domain = if e.hybrid { e.num_scaleup_ranks } else { e.num_nvlink_ranks };
        let counted = ElasticBytes::count(routing, domain, e.hybrid);
        let scale = |counts: &[u64], per: u64| counts.iter().map(|&c| c * per).collect::<Vec<_>>();
        let dispatch_row = crate::deepep::elastic::logical_token_bytes(w.hidden, w.dispatch_dtype);
        let combine_row = 2 * w.hidden as u64;
        LogicalBytes {
            label: "SO".into(),
            dispatch_per_rank: scale(&counted.scaleout_tokens_sent, dispatch_row),
            combine_per_rank: scale(&counted.scaleout_tokens_sent, combine_row),
            nvl_dispatch_per_rank: scale(&counted.scaleup_tokens_recv, dispatch_row),
            nvl_combine_per_rank: scale(&counted.scaleup_tokens_recv, combine_row),
        }
    }

    /// The job as DeepEP V2's `ElasticBuffer` (`with` its settings).
    pub fn with_elastic(mut self, settings: ElasticSettings) -> DeepEpJob {
        self.elastic = Some(settings);
        self
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

    /// DeepEP V2's scale-out and scale-up bytes per rank (mean) for `op`; `None` for a V1 job.
    pub fn elastic_bytes_per_rank(&self, op: OpKind) -> Option<(f64, f64)> {
        let JobKind::DeepEp(j) = &self.kind else { return None };
        j.elastic?;
        let l = j.logical();
        match op {
            OpKind::Dispatch => Some((
                LogicalBytes::mean(&l.dispatch_per_rank),
                LogicalBytes::mean(&l.nvl_dispatch_per_rank),
            )),
            OpKind::Combine => Some((
                LogicalBytes::mean(&l.combine_per_rank),
                LogicalBytes::mean(&l.nvl_combine_per_rank),
            )),
            _ => None,
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

    /// The sha256 of everything the plan was read from: the scenario's text alone when it
    /// reads no other file (then it is `scenario_sha256`), else the scenario's, its profile
    /// file's and every routing file's digest together. Processes of one run compare it, so
    /// each must have read the same profile and routing as well as the same scenario.
    pub fn inputs_sha256(&self) -> String {
        let files = self.routing_files();
        if files.is_empty() && self.profile_file.is_none() {
            return self.scenario_sha256.clone();
        }
        let mut text = self.scenario_sha256.clone();
        for sha in
            self.profile_file.iter().map(|p| &p.sha256).chain(files.iter().map(|f| &f.sha256))
        {
            text.push('\n');
            text.push_str(sha);
        }
        crate::scenario::sha256_hex(text.as_bytes())
    }
}
