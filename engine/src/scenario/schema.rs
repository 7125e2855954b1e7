//! Scenario format v1: the serde structs of a scenario file. Every table denies unknown keys.
//! `docs/scenario.md` documents each key; keep the two in step.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::units::ByteSize;

/// The only schema version this build reads.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub schema: u32,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub cluster: ClusterSpec,
    #[serde(rename = "job")]
    pub jobs: Vec<JobSpec>,
    /// `[[fault]]`: what goes wrong during the run (docs/scenario.md, "Faults").
    #[serde(default, rename = "fault", skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<FaultSpec>,
}

/// `[cluster]`: a bundled hardware profile plus overrides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// Name of a bundled hardware profile (`eptwin validate --list-profiles` lists them).
    pub profile: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<NvlinkKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain_gpus: Option<u32>,
    /// Several ranks share one physical GPU; their NVLink traffic becomes device-local copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks_per_gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<FabricSpec>,
    /// Overrides of the hardware profile's parameter tables (`[cluster.overrides.nic]`, ...),
    /// same keys as the profile files in `engine/profiles/`.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub overrides: toml::Table,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NvlinkKind {
    /// All GPUs of a node share one NVSwitch domain (HGX/DGX).
    Node,
    /// Multi-node NVLink: `nvlink_domain_gpus` consecutive GPUs form one domain (GB200 NVL72).
    Mnnvl,
    /// PCIe cards bridged in pairs (GPU 2k with 2k+1).
    PciePairs,
    /// No NVLink at all: GPU-to-GPU traffic inside a node crosses PCIe.
    None,
}

impl fmt::Display for NvlinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NvlinkKind::Node => "node",
            NvlinkKind::Mnnvl => "mnnvl",
            NvlinkKind::PciePairs => "pcie-pairs",
            NvlinkKind::None => "none",
        })
    }
}

/// `[cluster.fabric]`: every key overrides the profile's fabric defaults.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<FabricKind>,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Operational data VLs: 1, 2, 4, 8 or 15.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_vls: Option<u8>,
    /// 16 entries, index = SL, value = VL (OpenSM `qos_sl2vl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sl2vl: Option<Vec<u8>>,
    /// OpenSM `qos_vlarb_high` syntax: `"vl:weight,vl:weight"`, weights in 64-byte units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlarb_high: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlarb_low: Option<String>,
    /// OpenSM `qos_high_limit`, 4 KiB units; 255 = unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_limit: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<FabricRouting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<FabricTopology>,
    /// RoCE: percent of bandwidth per traffic class (ETS), 8 entries summing to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ets_tc_bw: Option<Vec<u8>>,
    /// RoCE: traffic classes served with strict priority before the ETS classes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict_tcs: Option<Vec<u8>>,
    /// RoCE: priorities with PFC enabled (lossless), 8 entries of 0/1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pfc: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FabricKind {
    Infiniband,
    Roce,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FabricRouting {
    Static,
    Adaptive,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FabricTopology {
    /// Every NIC on one switch.
    SingleSwitch,
    /// Rail-optimized two-level fat tree: NIC i of every node on leaf (rail) i, leaves to spines.
    RailLeafSpine,
}

/// `[[job]]`: one process group = one NVSHMEM instance = one SL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    #[serde(default)]
    pub ranks: RankSet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer: Option<BufferSpec>,
    /// The environment the job is launched with (user variables; DeepEP's writes come on top).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<TrafficSpec>,
    /// Published numbers this job is compared against (reports and the validation suite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<ReferenceSpec>,
}

/// `ranks = "all"`, a range string `"0-15"`, or a list of global ranks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum RankSet {
    Text(String),
    List(Vec<u32>),
}

/// What a rank set may be, for messages.
const RANK_SET_FORMS: &str =
    "\"all\", ranges such as \"0-7,16-23\", or a list of ranks such as [0, 1, 2]";

impl<'de> Deserialize<'de> for RankSet {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RankSet;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(RANK_SET_FORMS)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RankSet, E> {
                Ok(RankSet::Text(v.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<RankSet, A::Error> {
                let mut ranks = Vec::new();
                while let Some(rank) = seq.next_element::<u32>()? {
                    ranks.push(rank);
                }
                Ok(RankSet::List(ranks))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl Default for RankSet {
    fn default() -> Self {
        RankSet::Text("all".to_string())
    }
}

impl RankSet {
    /// The ranks selected out of `0..num_ranks`, ascending, or why the set is not one. Every
    /// bound is checked against `num_ranks` before a range is expanded, and no more than
    /// `num_ranks` ranks are ever collected: `"0-4000000000"` costs nothing.
    pub fn resolve(&self, num_ranks: u32) -> Result<Vec<u32>, String> {
        let missing = |rank: u64| {
            format!(
                "rank {rank} does not exist: the cluster has {num_ranks} ranks ({})",
                match num_ranks {
                    0 => "none".to_string(),
                    1 => "rank 0".to_string(),
                    n => format!("0-{}", n - 1),
                }
            )
        };
        let limit = num_ranks as usize;
        let mut ranks: Vec<u32> = match self {
            RankSet::List(list) => {
                if let Some(&bad) = list.iter().find(|&&r| r >= num_ranks) {
                    return Err(missing(bad as u64));
                }
                list.clone()
            }
            RankSet::Text(text) if text.trim() == "all" => (0..num_ranks).collect(),
            RankSet::Text(text) => {
                let mut out = Vec::new();
                for part in text.split(',').map(str::trim) {
                    let parse = |s: &str| {
                        s.trim()
                            .parse::<u64>()
                            .map_err(|_| format!("expected {RANK_SET_FORMS}; found {text:?}"))
                    };
                    let (lo, hi) = match part.split_once('-') {
                        Some((lo, hi)) => (parse(lo)?, parse(hi)?),
                        None => {
                            let r = parse(part)?;
                            (r, r)
                        }
                    };
                    if lo > hi {
                        return Err(format!("empty rank range {part:?}"));
                    }
                    if hi >= num_ranks as u64 {
                        return Err(missing(hi));
                    }
                    if out.len() + (hi - lo) as usize + 1 > limit {
                        // More ranks than the cluster has: some rank is named twice.
                        return Err("a rank is listed twice".into());
                    }
                    out.extend(lo as u32..=hi as u32);
                }
                out
            }
        };
        if ranks.is_empty() {
            return Err("the job has no ranks".into());
        }
        ranks.sort_unstable();
        if ranks.windows(2).any(|w| w[0] == w[1]) {
            return Err("a rank is listed twice".into());
        }
        Ok(ranks)
    }
}

/// Which DeepEP buffer a job constructs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BufferApi {
    /// DeepEP V1 `Buffer` (NVSHMEM/IBGDA), `deep_ep/buffers/legacy.py` at v2.1.0.
    #[default]
    Legacy,
    /// DeepEP V2 `ElasticBuffer` (NCCL GIN), `deep_ep/buffers/elastic.py`.
    Elastic,
}

impl BufferApi {
    pub fn is_legacy(&self) -> bool {
        *self == BufferApi::Legacy
    }
}

/// `[job.buffer]`: DeepEP `Buffer(...)` arguments with DeepEP's defaults, plus `num_sms`
/// (`Buffer.set_num_sms`) and the chunk sizes of `Config`. With `api = "elastic"` the buffer
/// is V2's `ElasticBuffer(...)` instead: its keys are the `Option`s below (absent = DeepEP's
/// default, `docs/scenario.md`), and a V1 key written there is an error (the validator finds
/// written keys in the source, since V1 keys have serde defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BufferSpec {
    #[serde(default, skip_serializing_if = "BufferApi::is_legacy")]
    pub api: BufferApi,
    #[serde(default)]
    pub num_nvl_bytes: ByteSize,
    #[serde(default)]
    pub num_rdma_bytes: ByteSize,
    #[serde(default)]
    pub low_latency_mode: bool,
    #[serde(default = "defaults::num_qps_per_rank")]
    pub num_qps_per_rank: u32,
    #[serde(default = "defaults::yes")]
    pub allow_nvlink_for_low_latency_mode: bool,
    #[serde(default)]
    pub allow_mnnvl: bool,
    #[serde(default)]
    pub use_fabric: bool,
    #[serde(default)]
    pub explicitly_destroy: bool,
    #[serde(default)]
    pub enable_shrink: bool,
    /// SMs for normal kernels (`Buffer.num_sms`, default 20): `num_sms / 2` channels.
    #[serde(default = "defaults::num_sms")]
    pub num_sms: u32,
    /// Chunk sizes for dispatch; unset fields take DeepEP's tuned table for the rank count.
    #[serde(default, skip_serializing_if = "ChunkConfig::is_empty")]
    pub dispatch_config: ChunkConfig,
    #[serde(default, skip_serializing_if = "ChunkConfig::is_empty")]
    pub combine_config: ChunkConfig,
    /// V2 (`api = "elastic"`): `ElasticBuffer.__init__`'s arguments (elastic.py:228-246).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_bytes: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_max_tokens_per_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_fp8_dispatch: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deterministic: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_hybrid_mode: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_multiple_reduction: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer_overlap_with_compute: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sl_idx: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_allocated_qps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_cpu_timeout_secs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_gpu_timeout_secs: Option<u32>,
    /// V2, per `dispatch`/`combine` call: RDMA QPs (0 = `get_theoretical_num_qps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_qps: Option<u32>,
}

/// The V1-only keys of `[job.buffer]` (a V2 buffer refuses them).
pub const LEGACY_BUFFER_KEYS: [&str; 10] = [
    "num_nvl_bytes",
    "num_rdma_bytes",
    "low_latency_mode",
    "num_qps_per_rank",
    "allow_nvlink_for_low_latency_mode",
    "allow_mnnvl",
    "use_fabric",
    "enable_shrink",
    "dispatch_config",
    "combine_config",
];

impl BufferSpec {
    /// The V2-only keys this buffer sets (a V1 buffer refuses them).
    pub fn elastic_keys_set(&self) -> Vec<&'static str> {
        let set = [
            ("num_bytes", self.num_bytes.is_some()),
            ("num_max_tokens_per_rank", self.num_max_tokens_per_rank.is_some()),
            ("use_fp8_dispatch", self.use_fp8_dispatch.is_some()),
            ("deterministic", self.deterministic.is_some()),
            ("allow_hybrid_mode", self.allow_hybrid_mode.is_some()),
            ("allow_multiple_reduction", self.allow_multiple_reduction.is_some()),
            ("prefer_overlap_with_compute", self.prefer_overlap_with_compute.is_some()),
            ("sl_idx", self.sl_idx.is_some()),
            ("num_allocated_qps", self.num_allocated_qps.is_some()),
            ("num_cpu_timeout_secs", self.num_cpu_timeout_secs.is_some()),
            ("num_gpu_timeout_secs", self.num_gpu_timeout_secs.is_some()),
            ("num_qps", self.num_qps.is_some()),
        ];
        set.iter().filter(|(_, on)| *on).map(|(k, _)| *k).collect()
    }

    pub fn is_elastic(&self) -> bool {
        self.api == BufferApi::Elastic
    }
}

impl Default for BufferSpec {
    fn default() -> Self {
        toml::from_str("").expect("every buffer key has a default")
    }
}

/// The four chunk sizes of DeepEP's `Config` (tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_max_nvl_chunked_send_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_max_nvl_chunked_recv_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_max_rdma_chunked_send_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_max_rdma_chunked_recv_tokens: Option<u32>,
}

impl ChunkConfig {
    pub fn is_empty(&self) -> bool {
        *self == ChunkConfig::default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dtype {
    Fp8,
    Bf16,
    /// DeepEP's LogFMT combine encoding (~10 bits per element + per-128-channel metadata).
    Logfmt,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RoutingKind {
    /// i.i.d. scores, top-k over all experts.
    Uniform,
    /// DeepSeek-V3 / DeepEP test style: keep the `topk_groups` nodes with the highest max score.
    NodeLimited,
    /// Expert popularity ∝ 1/(i+1)^skew: hot experts.
    Zipf,
    /// A recorded routing read from `routing_file` (docs/scenario.md, "Routing files").
    File,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    Dispatch,
    Combine,
    /// A background traffic round (`[job.traffic]`).
    Transfer,
    Barrier,
}

impl OpKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Dispatch => "dispatch",
            OpKind::Combine => "combine",
            OpKind::Transfer => "transfer",
            OpKind::Barrier => "barrier",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[job.workload]`: the MoE layer the job dispatches and combines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    pub tokens_per_rank: u32,
    /// Low-latency buffer capacity T (`num_max_dispatch_tokens_per_rank`); defaults to
    /// `tokens_per_rank`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_max_dispatch_tokens_per_rank: Option<u32>,
    pub hidden: u32,
    pub topk: u32,
    pub experts: u32,
    #[serde(default = "defaults::fp8")]
    pub dispatch_dtype: Dtype,
    #[serde(default = "defaults::bf16")]
    pub combine_dtype: Dtype,
    #[serde(default = "defaults::uniform")]
    pub routing: RoutingKind,
    /// Nodes a token may reach under `routing = "node-limited"` (DeepEP test: min(nodes, 4)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topk_groups: Option<u32>,
    /// Zipf exponent under `routing = "zipf"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skew: Option<f64>,
    /// The recorded routing under `routing = "file"`: a JSON file, relative to the scenario
    /// file's directory unless absolute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_file: Option<String>,
    /// (token, slot) entries masked to -1 per rank, as DeepEP's low-latency test does (~10).
    #[serde(default)]
    pub masked_selections: u32,
    #[serde(default = "defaults::seed")]
    pub seed: u64,
    #[serde(default = "defaults::warmup")]
    pub warmup: u32,
    #[serde(default = "defaults::iterations")]
    pub iterations: u32,
    #[serde(default = "defaults::ops")]
    pub ops: Vec<OpKind>,
    /// Low-latency hook mode (`return_recv_hook=True`): send and receive phases timed apart.
    #[serde(default)]
    pub hook: bool,
}

impl WorkloadSpec {
    pub fn max_dispatch_tokens_per_rank(&self) -> u32 {
        self.num_max_dispatch_tokens_per_rank.unwrap_or(self.tokens_per_rank)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrafficPattern {
    /// Every rank sends `bytes_per_rank / (n - 1)` to every other rank.
    AllToAll,
    /// Rank i sends `bytes_per_rank` to rank i+1.
    Ring,
    /// Every rank but the target sends `bytes_per_rank` to `incast_target`.
    Incast,
}

/// `[job.traffic]`: a background job that loads the fabric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficSpec {
    pub pattern: TrafficPattern,
    pub bytes_per_rank: ByteSize,
    /// Largest RDMA write per work request; bigger messages are split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_bytes: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incast_target: Option<u32>,
    /// Queue pairs per peer the traffic is spread over.
    #[serde(default = "defaults::one")]
    pub qps_per_peer: u32,
    #[serde(default = "defaults::transfer_ops")]
    pub ops: Vec<OpKind>,
    #[serde(default = "defaults::traffic_warmup")]
    pub warmup: u32,
    #[serde(default = "defaults::iterations")]
    pub iterations: u32,
    /// Skip NVLink for peers in the same domain (true: everything crosses the NIC).
    #[serde(default)]
    pub rdma_only: bool,
}

/// `[job.reference]`: a published measurement for this configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceSpec {
    /// Where the numbers come from (document, commit, table).
    pub source: String,
    /// Allowed relative deviation of the simulator, percent.
    #[serde(default = "defaults::tolerance_pct")]
    pub tolerance_pct: f64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ops: BTreeMap<OpKind, ReferenceOp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceOp {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical_bw_gbps: Option<f64>,
    /// DeepEP V2's scale-out bandwidth (`tests/elastic/test_ep.py`'s "(SO)" figure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub so_bw_gbps: Option<f64>,
}

/// `[[fault]]`: one fault. Which keys apply depends on `kind`; the validator says which key
/// a kind lacks or does not take (docs/scenario.md, "Faults").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    pub kind: FaultKind,
    /// `straggler`, `rank_down`: global ranks, as jobs name them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks: Option<RankSet>,
    /// `straggler`: every op starts this late on the ranks (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_us: Option<f64>,
    /// `straggler`: a delay drawn per rank and op from the seed instead of `delay_us`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<DelaySpec>,
    /// `rank_down`, `nic_down`: simulated time from the run's start (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_us: Option<f64>,
    /// `nic_down`, `nvlink_degraded`: the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u32>,
    /// `nic_down`: the NIC's index in its node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic: Option<u32>,
    /// `nic_down`: back up after this long (µs); absent: down for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_us: Option<f64>,
    /// `packet_loss`: per-packet drop probability on the RDMA fabric, in [0, 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// `nvlink_degraded`: the share of the node's NVLink bandwidth left, in (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    Straggler,
    RankDown,
    NicDown,
    PacketLoss,
    NvlinkDegraded,
}

impl FaultKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Straggler => "straggler",
            FaultKind::RankDown => "rank_down",
            FaultKind::NicDown => "nic_down",
            FaultKind::PacketLoss => "packet_loss",
            FaultKind::NvlinkDegraded => "nvlink_degraded",
        }
    }
}

/// `delay = { dist = "normal", mean_us = 5, sd_us = 3 }`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelaySpec {
    pub dist: DelayDist,
    pub mean_us: f64,
    pub sd_us: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DelayDist {
    Normal,
}

mod defaults {
    use super::*;
    pub fn num_qps_per_rank() -> u32 {
        24 // buffer.py default since PR #263
    }
    pub fn num_sms() -> u32 {
        20 // Buffer.num_sms class attribute
    }
    pub fn yes() -> bool {
        true
    }
    pub fn one() -> u32 {
        1
    }
    pub fn fp8() -> Dtype {
        Dtype::Fp8
    }
    pub fn bf16() -> Dtype {
        Dtype::Bf16
    }
    pub fn uniform() -> RoutingKind {
        RoutingKind::Uniform
    }
    pub fn seed() -> u64 {
        1
    }
    pub fn warmup() -> u32 {
        5
    }
    pub fn traffic_warmup() -> u32 {
        1
    }
    pub fn iterations() -> u32 {
        20
    }
    pub fn ops() -> Vec<OpKind> {
        vec![OpKind::Dispatch, OpKind::Combine]
    }
    pub fn transfer_ops() -> Vec<OpKind> {
        vec![OpKind::Transfer]
    }
    pub fn tolerance_pct() -> f64 {
        10.0
    }
}

#[cfg(test)]
mod tests {
    use super::RankSet;

    fn text(t: &str) -> RankSet {
        RankSet::Text(t.into())
    }

    #[test]
    fn rank_sets_resolve() {
        assert_eq!(text("all").resolve(4), Ok(vec![0, 1, 2, 3]));
        assert_eq!(text("0-1, 3").resolve(4), Ok(vec![0, 1, 3]));
        assert_eq!(RankSet::List(vec![3, 0]).resolve(4), Ok(vec![0, 3]));
        assert_eq!(text("2-1").resolve(4).unwrap_err(), "empty rank range \"2-1\"");
        assert_eq!(text("0-1,1").resolve(4).unwrap_err(), "a rank is listed twice");
        assert_eq!(RankSet::List(vec![]).resolve(4).unwrap_err(), "the job has no ranks");
        assert!(text("x").resolve(4).unwrap_err().contains("ranges such as"));
    }

    #[test]
    fn huge_ranges_are_refused_before_expansion() {
        // Before the bound was checked first, these built vectors of 4e9 and 1e8 ranks.
        let err = text("0-4000000000").resolve(8).unwrap_err();
        assert_eq!(err, "rank 4000000000 does not exist: the cluster has 8 ranks (0-7)");
        let err = text("0-99999999999999").resolve(8).unwrap_err();
        assert!(err.starts_with("rank 99999999999999 does not exist"), "{err}");
        assert!(RankSet::List(vec![u32::MAX]).resolve(8).unwrap_err().contains("rank 4294967295"));
        // Repeating a valid range stops as soon as it names more ranks than exist.
        let repeated = vec!["0-7"; 100_000].join(",");
        assert_eq!(text(&repeated).resolve(8).unwrap_err(), "a rank is listed twice");
    }

    #[test]
    fn rank_set_type_errors_say_what_is_accepted() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Holder {
            ranks: RankSet,
        }
        let err = toml::from_str::<Holder>("ranks = 3.5").unwrap_err();
        assert!(err.message().contains("ranges such as \"0-7,16-23\""), "{}", err.message());
        let err = toml::from_str::<Holder>("ranks = [1, \"a\"]").unwrap_err();
        assert!(err.message().contains("expected u32"), "{}", err.message());
        let ok = toml::from_str::<Holder>("ranks = [1, 2]").unwrap();
        assert_eq!(ok.ranks, RankSet::List(vec![1, 2]));
    }
}
