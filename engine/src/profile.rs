//! Hardware profiles: bundled TOML files (`engine/profiles/*.toml`) describing GPUs, NVLink,
//! PCIe, NICs and the fabric. A scenario names one and overrides keys of it; every number in
//! a profile file carries its source in a comment.

pub mod ranges;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::scenario::schema::{ClusterSpec, FabricKind, FabricRouting, FabricTopology, NvlinkKind};

/// Bundled profiles: (name, TOML text). The file name is the profile name.
pub const BUNDLED: &[(&str, &str)] = &[
    ("h800-cx7", include_str!("../profiles/h800-cx7.toml")),
    ("h100-cx7", include_str!("../profiles/h100-cx7.toml")),
    ("h200-cx7", include_str!("../profiles/h200-cx7.toml")),
    ("gb200-nvl72", include_str!("../profiles/gb200-nvl72.toml")),
    ("h200-single", include_str!("../profiles/h200-single.toml")),
];

pub fn bundled_names() -> impl Iterator<Item = &'static str> {
    BUNDLED.iter().map(|(name, _)| *name)
}

/// A fully resolved hardware profile (bundled file + scenario overrides).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub cluster: ProfileCluster,
    pub gpu: GpuParams,
    pub nvlink: NvlinkParams,
    pub pcie: PcieParams,
    pub nic: NicParams,
    pub fabric: FabricParams,
    pub deepep: DeepEpCosts,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileCluster {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub nvlink: NvlinkKind,
    /// GPUs per NVLink domain (used with `nvlink = "mnnvl"`; equals gpus_per_node otherwise).
    pub nvlink_domain_gpus: u32,
    pub ranks_per_gpu: u32,
}

/// The GPU: compute resources that drive copies, and launch costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuParams {
    /// Device name as CUDA reports it (NVML/`cudaGetDeviceProperties`).
    pub name: String,
    pub sm_count: u32,
    pub clock_ghz: f64,
    /// HBM bandwidth, GB/s, counting bytes read plus written.
    pub hbm_bw_gbps: f64,
    /// Device-to-device memcpy rate, GB/s of bytes copied (read + write = 2x this in HBM).
    pub memcpy_bw_gbps: f64,
    /// Copy rate one SM sustains with warp-wide 16-byte loads/stores, GB/s.
    pub sm_copy_bw_gbps: f64,
    /// Copy rate a single warp sustains on its own (bounded by its outstanding memory
    /// requests), GB/s; warps sharing an SM also share `sm_copy_bw_gbps`.
    pub warp_copy_bw_gbps: f64,
    /// Host launch to first instruction, ns.
    pub kernel_launch_ns: u64,
    /// Fixed cost of a grid-wide or cross-GPU barrier/flag round inside a kernel, ns.
    pub flag_latency_ns: u64,
    /// A cooperative-groups grid sync inside a kernel, ns.
    pub grid_sync_ns: u64,
    /// The memory system as the SMs see it (`[gpu.memory]`), for ranks sharing one GPU: the
    /// simulator models the hardware backend's one-GPU kernels with it when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<GpuMemory>,
}

/// One GPU's memory system as its SMs see it: L2 and HBM throughput for SM-driven copies and
/// the latencies the kernels' dependency chains are made of (measured by the hardware
/// backend's probes, `results/h200/README.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuMemory {
    /// L2 capacity, bytes.
    pub l2_bytes: u64,
    /// What the timing's L2 flush (a 256 MB memset before every timed op) leaves for an op to
    /// write back, as bytes of dirty lines: the op's first new lines each write one back.
    /// Absent: all of `l2_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_dirty_bytes: Option<u64>,
    /// SM-side L2 throughput, GB/s of bytes loaded plus stored (what the L2 serves the SMs
    /// besides the HBM traffic `l2_hbm_bw_gbps` accounts for).
    pub l2_bw_gbps: f64,
    /// HBM throughput of SM-driven copies, GB/s of bytes read plus written.
    pub dram_bw_gbps: f64,
    /// What HBM traffic costs the L2 besides the SMs' own accesses (fills of missed reads,
    /// write-backs), as the rate at which HBM bytes alone would use it up: GB/s of bytes read
    /// from or written back to HBM. Absent: HBM traffic costs the L2 nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_hbm_bw_gbps: Option<f64>,
    /// SM-side L2 throughput for a ring slot handed from one SM to another through L2 (stored
    /// by a producer warp, loaded by a consumer warp on another SM while still resident), GB/s
    /// of those bytes stored plus loaded; they cost this instead of `l2_bw_gbps`. Absent: as
    /// any other SM-side byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_ring_bw_gbps: Option<f64>,
    /// What dropping consumed lines from L2 (`discard.global.L2`) costs the L2, as the rate
    /// at which discarded bytes alone would use it up, GB/s. Absent: discards are free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_discard_bw_gbps: Option<f64>,
    /// One warp copying 7,168-byte rows back to back (7 16-byte loads in flight per lane),
    /// ns per row: source in L2, source in HBM.
    pub warp_row_l2_ns: f64,
    pub warp_row_hbm_ns: f64,
    /// One SM's copy rate with every warp of a 1,024-thread block copying, GB/s: source in
    /// L2, source in HBM.
    pub sm_copy_l2_gbps: f64,
    pub sm_copy_hbm_gbps: f64,
    /// A dependent 16-byte load, ns: L2 hit; HBM with the GPU idle; HBM while every SM's
    /// threads load at once (one load in flight each).
    pub load_l2_ns: u64,
    pub load_hbm_ns: u64,
    pub load_hbm_busy_ns: u64,
    /// A returning atomic add in L2, ns.
    pub atomic_ns: u64,
    /// What a `red.release.gpu` after a warp's row copy adds to the copy, ns.
    pub release_ns: u64,
    /// The low-latency dispatch's send loop as one block runs it while every SM does the same
    /// (the backend's `probe.ll_send_chain`), per (token, rank) item, ns: the FP8 cast (one
    /// 16-byte HBM load per thread, the staged stores) and the named barrier; the expert index
    /// load and the slot's returning atomic; one warp's copy of the message into its slot;
    /// the release add and back to the loop. Each absent one is built from the single
    /// operations above (`load_hbm_busy_ns`, `atomic_ns`, `warp_row_l2_ns`, `release_ns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ll_send_cast_ns: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ll_send_slot_ns: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ll_send_copy_ns: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ll_send_release_ns: Option<f64>,
    /// One count poll of the low-latency dispatch's receive groups (an acquire load of a flag
    /// already set) while every SM receives, ns (the backend's
    /// `probe.ll_send_chain.*_then_recv`). Absent: `load_l2_ns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ll_recv_poll_ns: Option<f64>,
    /// The normal kernels with their rings in thread-block-cluster shared memory
    /// (`kernels/cuda/intranode_cluster.cu`, sm_90+, at most 8 ranks: one cluster of one block
    /// per rank per channel), measured by the backend's cluster handoff probe
    /// (`probe.cluster_handoff_*`). All present: the simulator models those kernels for a
    /// job of at most 8 ranks on this GPU; all absent: the global-memory rings.
    ///
    /// A slot's refill with one cluster on the GPU, ns, besides the chunk's bytes at
    /// `cluster_bulk_copy_gbps`: from the consumer releasing the slot (head) to the consumer
    /// seeing the next chunk in it (the producer sees the head, issues the bulk copy global →
    /// peer shared memory, the copy lands on the slot's mbarrier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_fill_ns: Option<f64>,
    /// The same with a whole wave of clusters resident (`cluster_max_active_clusters`), ns;
    /// in between, in proportion to the SMs the kernel's resident clusters take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_fill_wave_ns: Option<f64>,
    /// One bulk copy's bytes, GB/s per copy: a fill's, a consumer's store's (with every
    /// consumer of the block storing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_bulk_copy_gbps: Option<f64>,
    /// A consumer's fixed time per bulk store, ns: issue, the wait for the store to have read
    /// the slots, the head release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_store_ns: Option<f64>,
    /// The whole GPU's rate of bulk copies into a peer block's shared memory, GB/s of bytes
    /// handed over (every cluster's fills share it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_handoff_bw_gbps: Option<f64>,
    /// The L2's time per bulk transfer of a ring chunk besides its bytes, ns: each fill of a
    /// slot, each slot a consumer bulk-stores out (whole waves of the handoff probe: more,
    /// smaller chunks of the same bytes take longer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_transfer_l2_ns: Option<f64>,
    /// One SM's intake of bulk copies into its shared memory from its cluster's blocks, GB/s
    /// (every fill of its rings crosses it) ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_sm_ingest_gbps: Option<f64>,
    /// ... plus this much per chunk, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_ingest_chunk_ns: Option<f64>,
    /// Clusters of 8 one-block-per-SM blocks resident at once (`cuOccupancyMaxActiveClusters`);
    /// a grid of more runs in waves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_max_active_clusters: Option<u32>,
    /// Dynamic shared memory a block may have, bytes: how many ring slots fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_smem_bytes: Option<u64>,
    /// A combine block's reduction of one token whose partials are in its shared memory, ns:
    /// `cluster_reduce_ns` plus `cluster_reduce_source_ns` per source rank it sums (the
    /// backend's reducer probe, `probe.cluster_reduce_ns_per_token`, fitted over 1–8 sources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_reduce_ns: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_reduce_source_ns: Option<f64>,
    /// The cluster kernels' frame, ns: every block initialising and fencing its mbarriers, the
    /// cluster barrier before the first token and the one at exit, beyond the launch (the
    /// backend's `probe.cluster_launch_us`: `combine_cluster_frame_*` less `combine_cluster_*`).
    /// Optional on top of the cluster keys; absent: not charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_frame_ns: Option<f64>,
}

impl GpuMemory {
    /// Whether the cluster keys are all present (`Ok(true)`), all absent (`Ok(false)`), or
    /// only some (`Err` naming the missing ones).
    pub fn cluster_keys(&self) -> Result<bool, String> {
        let keys = [
            ("cluster_fill_ns", self.cluster_fill_ns.is_some()),
            ("cluster_fill_wave_ns", self.cluster_fill_wave_ns.is_some()),
            ("cluster_bulk_copy_gbps", self.cluster_bulk_copy_gbps.is_some()),
            ("cluster_store_ns", self.cluster_store_ns.is_some()),
            ("cluster_handoff_bw_gbps", self.cluster_handoff_bw_gbps.is_some()),
            ("cluster_transfer_l2_ns", self.cluster_transfer_l2_ns.is_some()),
            ("cluster_sm_ingest_gbps", self.cluster_sm_ingest_gbps.is_some()),
            ("cluster_ingest_chunk_ns", self.cluster_ingest_chunk_ns.is_some()),
            ("cluster_max_active_clusters", self.cluster_max_active_clusters.is_some()),
            ("cluster_smem_bytes", self.cluster_smem_bytes.is_some()),
            ("cluster_reduce_ns", self.cluster_reduce_ns.is_some()),
            ("cluster_reduce_source_ns", self.cluster_reduce_source_ns.is_some()),
        ];
        let missing: Vec<&str> = keys.iter().filter(|k| !k.1).map(|k| k.0).collect();
        match missing.len() {
            0 => Ok(true),
            n if n == keys.len() => Ok(false),
            _ => Err(format!("the cluster keys go together; missing {}", missing.join(", "))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvlinkParams {
    /// Nominal per-GPU bandwidth per direction, GB/s.
    pub bw_per_direction_gbps: f64,
    /// Fraction of nominal that SM-driven stores achieve (packet headers, 128-B payloads).
    pub efficiency: f64,
    /// One-way latency of a store through the NVSwitch, ns.
    pub latency_ns: u64,
    /// Payload per NVLink packet for SM stores, bytes.
    pub packet_payload_bytes: u32,
}

impl NvlinkParams {
    pub fn achievable_gbps(&self) -> f64 {
        self.bw_per_direction_gbps * self.efficiency
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcieParams {
    /// Per direction, GB/s, after encoding.
    pub bw_gbps: f64,
    pub efficiency: f64,
    pub latency_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicParams {
    pub name: String,
    /// NICs per GPU (one per GPU on rail-optimized HGX).
    pub per_gpu: u32,
    /// Line rate per direction, GB/s (400 Gb/s NDR = 50).
    pub link_gbps: f64,
    /// Fraction of the line rate achievable for payload, beyond header overhead the model
    /// counts itself (PCIe/DMA limits).
    pub efficiency: f64,
    /// Cost for a GPU thread to build and post one WQE (IBGDA), ns.
    pub wqe_post_ns: u64,
    /// Cost of ringing a doorbell (MMIO write through PCIe), ns.
    pub doorbell_ns: u64,
    /// NIC processing time per work request (message-rate limit), ns.
    pub wqe_process_ns: u64,
    /// NIC processing latency from doorbell to the first byte on the wire, ns.
    pub tx_latency_ns: u64,
    /// Receive side: from the last byte on the wire to data visible in GPU memory, ns.
    pub rx_latency_ns: u64,
    /// Largest QP depth the NIC supports (NVSHMEM caps at 32768).
    pub max_qp_depth: u32,
    /// QPs the NIC can hold (`ibv_devinfo -v` `max_qp`): DeepEP V2's QPs per GPU (allocated
    /// QPs × connected peers) must fit (DeepEP #649). Absent: not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_qps: Option<u32>,
}

/// Fabric defaults; `[cluster.fabric]` overrides any of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricParams {
    pub kind: FabricKind,
    pub mtu: u32,
    pub data_vls: u8,
    pub sl2vl: Vec<u8>,
    pub vlarb_high: String,
    pub vlarb_low: String,
    pub high_limit: u8,
    pub routing: FabricRouting,
    pub topology: FabricTopology,
    /// Switch ports (radix); bounds nodes per leaf in a leaf/spine topology.
    pub switch_radix: u32,
    /// Port-to-port latency of one switch hop (cut-through), ns.
    pub switch_latency_ns: u64,
    /// Whether switches forward a packet as soon as its head is in or only once it is whole.
    pub switch_mode: SwitchMode,
    /// Cable propagation per link, ns.
    pub link_latency_ns: u64,
    /// Receive buffer per VL per port, bytes (credits = this / 64).
    pub vl_buffer_bytes: u32,
    /// Interval between flow-control (credit) packets, ns.
    pub credit_update_ns: u64,
    /// Adaptive routing: extra per-hop latency, ns.
    pub adaptive_routing_latency_ns: u64,
    /// RoCE only: ETS shares (percent per traffic class), strict-priority classes, PFC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ets_tc_bw: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict_tcs: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pfc: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SwitchMode {
    CutThrough,
    StoreAndForward,
}

/// Software costs of DeepEP's kernels on this hardware: calibrated physical parameters, the
/// same for every configuration (never a per-row factor).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeepEpCosts {
    /// Notify phase of normal kernels: count exchange plus the host busy-wait round trip, ns.
    pub notify_host_roundtrip_ns: u64,
    /// Per token and destination: SM work to build and issue a send (meta, top-k, scales), ns.
    pub per_token_issue_ns: u64,
    /// Low-latency: per-expert count/flag signalling cost on the sender, ns.
    pub ll_signal_ns: u64,
    /// Low-latency dispatch receive: the dependent steps of one round of a receive group's
    /// warps (one message each: source info, the copy's rounds of loads, the scales), beyond its
    /// bytes, ns.
    pub ll_recv_per_msg_ns: u64,
    /// Low-latency dispatch: GPU time of each kernel launch that does not scale with tokens
    /// and no other cost covers (start-up, the counting warp's loads, the next buffer's clean,
    /// the finish-counter waits), ns: the fused kernel's, and hook mode's send kernel's.
    /// Absent = 0.
    #[serde(default)]
    pub ll_dispatch_fixed_ns: u64,
    /// Low-latency combine: the same for the combine kernel (start-up, TMA and barrier setup),
    /// ns: the fused kernel's, and hook mode's send kernel's. Absent = 0.
    #[serde(default)]
    pub ll_combine_fixed_ns: u64,
    /// Low-latency dispatch, hook mode: the fixed part of the receive kernel the hook launches,
    /// ns. Absent: `ll_dispatch_fixed_ns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ll_dispatch_recv_fixed_ns: Option<u64>,
    /// Low-latency combine, hook mode: the fixed part of its receive kernel, ns. Absent:
    /// `ll_combine_fixed_ns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ll_combine_recv_fixed_ns: Option<u64>,
    /// Low-latency dispatch: the dependent steps of one token a send block handles, beyond the
    /// bytes its copies move (the cast's loads, the slot atomic, the release), ns. Absent = 0.
    #[serde(default)]
    pub ll_send_round_ns: u64,
    /// Low-latency combine: the dependent steps of one token a send warp stages and stores,
    /// beyond its bytes (source index, TMA load and store waits), ns. Absent = 0.
    #[serde(default)]
    pub ll_combine_round_ns: u64,
    /// Low-latency combine: one top-k partial a reducing thread loads and adds (its loads
    /// follow one another), ns. Absent = 0.
    #[serde(default)]
    pub ll_reduce_load_ns: u64,
    /// DeepEP V2: a warp's TMA bulk load from HBM into shared memory, fixed part (issue to
    /// landed), ns. Absent: the profile cannot run V2 jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic_tma_fill_ns: Option<u64>,
    /// DeepEP V2: one SM's TMA bulk-copy throughput, shared by its warps, GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic_sm_tma_gbps: Option<f64>,
}

/// Why a profile could not be resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileError {
    /// Key path in the scenario the problem belongs to (`cluster.profile`, `cluster.overrides.nic.x`).
    pub key: String,
    pub message: String,
}

/// Parse a bundled profile by name.
pub fn bundled_table(name: &str) -> Option<toml::Table> {
    BUNDLED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| toml::from_str(text).expect("bundled profiles are tested to parse"))
}

/// Whether `cluster.profile` names a profile file rather than a bundled profile: a path (it
/// has a `/`) or a `.toml` file name.
pub fn names_file(profile: &str) -> bool {
    profile.ends_with(".toml") || profile.contains('/')
}

/// Where a profile file a scenario names is: a relative path is relative to the scenario
/// file's directory, so a scenario and its profile move together.
pub fn file_path(scenario_file: &str, profile: &str) -> PathBuf {
    // As a routing file's path is resolved (routing_file.rs), without depending on it.
    let path = std::path::Path::new(profile);
    if path.is_absolute() {
        return path.to_path_buf();
    }
    std::path::Path::new(scenario_file).parent().unwrap_or(std::path::Path::new("")).join(path)
}

/// The largest profile file read (1 MiB; a profile is a few KiB).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// A profile file, for [`crate::files::read_input`]'s bound and messages: read as a regular
/// file without blocking, so a FIFO swapped in after the check cannot hang validation.
pub const PROFILE_FILE: crate::files::InputKind = crate::files::InputKind {
    noun: "a profile",
    format: "a TOML file",
    max_bytes: MAX_FILE_BYTES,
    max_text: "1 MiB",
};

/// Read the profile file at `on_disk` (named `shown` in messages) and check it as a complete
/// profile: every key present with its type, every number in range. Its TOML table and the hex
/// sha256 of its bytes, or every fault found as `file:line:col: what`.
pub fn read_file(on_disk: &Path, shown: &str) -> Result<(toml::Table, String), Vec<String>> {
    let bytes = crate::files::read_input(on_disk, &PROFILE_FILE)
        .map_err(|e| vec![format!("{shown}: {e}")])?;
    let sha256 = crate::scenario::sha256_hex(&bytes);
    let text = String::from_utf8(bytes).map_err(|e| {
        vec![format!("{shown}: invalid UTF-8 at byte {}", e.utf8_error().valid_up_to())]
    })?;
    check_text(shown, &text).map(|table| (table, sha256))
}

/// [`read_file`] on a profile's text.
pub fn check_text(shown: &str, text: &str) -> Result<toml::Table, Vec<String>> {
    let src = crate::scenario::source::SourceMap::new(shown, text);
    let at = |e: &toml::de::Error| match e.span() {
        Some(span) => src.location_of(span.start).to_string(),
        None => shown.to_string(),
    };
    let table: toml::Table =
        toml::from_str(text).map_err(|e| vec![format!("{}: {}", at(&e), e.message().trim())])?;
    let profile: HardwareProfile = toml::from_str(text).map_err(|e| {
        vec![format!("{}: {}", at(&e), crate::scenario::plain::describe(e.message().trim(), ""))]
    })?;
    let mut faults: Vec<String> = ranges::violations(&profile)
        .into_iter()
        .map(|(key, message)| format!("{}: {key} = {message}", src.locate(&key)))
        .collect();
    if let Some(Err(message)) = profile.gpu.memory.as_ref().map(GpuMemory::cluster_keys) {
        faults.push(format!("{}: {message}", src.locate("gpu.memory")));
    }
    if faults.is_empty() { Ok(table) } else { Err(faults) }
}

/// Resolve `[cluster]` with a bundled profile: the named profile, with the scenario's cluster
/// keys, fabric keys and `[cluster.overrides]` tables layered on top.
pub fn resolve(cluster: &ClusterSpec) -> Result<HardwareProfile, ProfileError> {
    let table = bundled_table(&cluster.profile).ok_or_else(|| ProfileError {
        key: "cluster.profile".into(),
        message: format!(
            "unknown profile {:?}; bundled profiles: {} (or a profile file: a path with a '/' \
             or ending in .toml, relative to the scenario)",
            cluster.profile,
            bundled_names().collect::<Vec<_>>().join(", ")
        ),
    })?;
    resolve_with(cluster, table)
}

/// [`resolve`] on `base`, a profile's table (bundled, or read with [`read_file`]).
pub fn resolve_with(
    cluster: &ClusterSpec,
    base: toml::Table,
) -> Result<HardwareProfile, ProfileError> {
    let mut table = base.clone();

    // `[cluster.overrides.<section>]` keys replace profile keys one by one.
    for (section, value) in &cluster.overrides {
        let key = format!("cluster.overrides.{section}");
        let Some(toml::Value::Table(target)) = table.get_mut(section) else {
            return Err(ProfileError {
                key,
                message: format!(
                    "unknown profile section {section:?}; expected one of gpu, nvlink, pcie, nic, fabric, deepep"
                ),
            });
        };
        if matches!(section.as_str(), "cluster") {
            return Err(ProfileError {
                key,
                message: "set cluster shape with the [cluster] keys themselves".into(),
            });
        }
        let toml::Value::Table(entries) = value else {
            return Err(ProfileError { key, message: "expected a table of profile keys".into() });
        };
        for (k, v) in entries {
            if !target.contains_key(k) && !is_optional_profile_key(section, k) {
                return Err(ProfileError {
                    key: format!("{key}.{k}"),
                    message: format!("profile section [{section}] has no key {k:?}"),
                });
            }
            target.insert(k.clone(), v.clone());
        }
    }

    let mut profile: HardwareProfile = match table.try_into() {
        Ok(profile) => profile,
        Err(e) => return Err(override_error(cluster, &base, &e)),
    };

    if let Some(m) = &profile.gpu.memory
        && let Err(message) = m.cluster_keys()
    {
        return Err(ProfileError { key: "gpu.memory".into(), message });
    }

    let c = &mut profile.cluster;
    if let Some(v) = cluster.nodes {
        c.nodes = v;
    }
    if let Some(v) = cluster.gpus_per_node {
        c.gpus_per_node = v;
    }
    if let Some(v) = cluster.nvlink {
        c.nvlink = v;
    }
    if let Some(v) = cluster.ranks_per_gpu {
        c.ranks_per_gpu = v;
    }
    match cluster.nvlink_domain_gpus {
        Some(v) => c.nvlink_domain_gpus = v,
        // A domain never spans more than a node unless the scenario says MNNVL.
        None if c.nvlink != NvlinkKind::Mnnvl => c.nvlink_domain_gpus = c.gpus_per_node,
        None => {}
    }

    if let Some(fabric) = &cluster.fabric {
        let f = &mut profile.fabric;
        macro_rules! take {
            ($($field:ident),*) => { $( if let Some(v) = &fabric.$field { f.$field = v.clone(); } )* };
        }
        take!(kind, mtu, data_vls, sl2vl, vlarb_high, vlarb_low, high_limit, routing, topology);
        if fabric.ets_tc_bw.is_some() {
            f.ets_tc_bw = fabric.ets_tc_bw.clone();
        }
        if fabric.strict_tcs.is_some() {
            f.strict_tcs = fabric.strict_tcs.clone();
        }
        if fabric.pfc.is_some() {
            f.pfc = fabric.pfc.clone();
        }
    }
    Ok(profile)
}

/// The override a profile failed to deserialize with: each override alone on the bundled
/// profile, the first that fails names its key (`cluster.overrides.nic.link_gbps: expected a
/// number, found the string "fast"`).
fn override_error(
    cluster: &ClusterSpec,
    base: &toml::Table,
    whole: &toml::de::Error,
) -> ProfileError {
    for (section, value) in &cluster.overrides {
        let toml::Value::Table(entries) = value else { continue };
        for (k, v) in entries {
            let mut one = base.clone();
            if let Some(toml::Value::Table(target)) = one.get_mut(section) {
                target.insert(k.clone(), v.clone());
            }
            if let Err(e) = one.try_into::<HardwareProfile>() {
                let written = v.to_string();
                return ProfileError {
                    key: format!("cluster.overrides.{section}.{k}"),
                    message: crate::scenario::plain::describe(e.message().trim(), &written),
                };
            }
        }
    }
    ProfileError {
        key: "cluster.overrides".into(),
        message: format!(
            "profile {:?} with overrides is invalid: {}",
            cluster.profile,
            crate::scenario::plain::describe(whole.message().trim(), "")
        ),
    }
}

fn is_optional_profile_key(section: &str, key: &str) -> bool {
    (section == "fabric" && matches!(key, "ets_tc_bw" | "strict_tcs" | "pfc"))
        || (section == "gpu" && key == "memory")
        || (section == "deepep"
            && matches!(
                key,
                "ll_dispatch_recv_fixed_ns"
                    | "ll_combine_recv_fixed_ns"
                    | "ll_send_round_ns"
                    | "ll_combine_round_ns"
                    | "ll_reduce_load_ns"
            ))
        || (section == "nic" && key == "max_qps")
        || (section == "deepep" && key.starts_with("elastic_"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bundled_profile_parses() {
        for (name, text) in BUNDLED {
            let profile: HardwareProfile =
                toml::from_str(text).unwrap_or_else(|e| panic!("profile {name}: {e}"));
            assert_eq!(&profile.name, name, "file name and profile name agree");
        }
    }

    #[test]
    fn every_profile_number_has_a_source_comment() {
        // House rule: every hardware number carries its source. A numeric key line must have a
        // trailing comment or sit under a comment line.
        for (name, text) in BUNDLED {
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let code = line.split('#').next().unwrap_or("").trim();
                let Some((_, value)) = code.split_once('=') else { continue };
                let value = value.trim();
                let numeric = value.starts_with(|c: char| c.is_ascii_digit() || c == '[');
                if !numeric {
                    continue;
                }
                let commented =
                    line.contains('#') || (i > 0 && lines[i - 1].trim_start().starts_with('#'));
                assert!(commented, "{name}.toml line {}: `{}` has no source comment", i + 1, line);
            }
        }
    }

    #[test]
    fn cluster_keys_come_all_or_none() {
        let mut cluster: ClusterSpec = toml::from_str("profile = \"h200-single\"").unwrap();
        let p = resolve(&cluster).unwrap();
        let full = p.gpu.memory.as_ref().unwrap();
        // Its memory table without the cluster keys, then with one of them only: refused,
        // naming the missing ones.
        let mut memory: Vec<String> = toml::to_string(full)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with("cluster_"))
            .map(str::to_string)
            .collect();
        cluster.overrides =
            toml::from_str(&format!("[gpu.memory]\n{}", memory.join("\n"))).unwrap();
        assert_eq!(resolve(&cluster).unwrap().gpu.memory.unwrap().cluster_keys(), Ok(false));
        memory.push("cluster_fill_ns = 1000.0".into());
        cluster.overrides =
            toml::from_str(&format!("[gpu.memory]\n{}", memory.join("\n"))).unwrap();
        let err = resolve(&cluster).unwrap_err();
        assert_eq!(err.key, "gpu.memory");
        assert!(err.message.contains("missing cluster_fill_wave_ns"), "{}", err.message);
        assert!(err.message.contains("cluster_bulk_copy_gbps"), "{}", err.message);
        assert!(err.message.contains("cluster_ingest_chunk_ns"), "{}", err.message);
    }

    #[test]
    fn a_profile_file_is_checked_whole_with_positions() {
        let good = BUNDLED.iter().find(|(n, _)| *n == "h100-cx7").unwrap().1;
        assert!(check_text("p.toml", good).is_ok());
        // Out of range: the line and column of the value, the key and the range.
        let zero = good.replacen("sm_count = 132", "sm_count = 0", 1);
        let line = zero.lines().position(|l| l.starts_with("sm_count = 0")).unwrap() + 1;
        let faults = check_text("p.toml", &zero).unwrap_err();
        assert_eq!(faults.len(), 1, "{faults:?}");
        assert!(faults[0].starts_with(&format!("p.toml:{line}:")), "{faults:?}");
        assert!(faults[0].contains("gpu.sm_count = 0: expected"), "{faults:?}");
        // A wrong type: where it is, in plain words.
        let typed = good.replacen("sm_count = 132", "sm_count = \"many\"", 1);
        let faults = check_text("p.toml", &typed).unwrap_err();
        assert!(faults[0].starts_with(&format!("p.toml:{line}:")), "{faults:?}");
        assert!(faults[0].contains("found the string \"many\""), "{faults:?}");
        // A key missing: the file, and which.
        let missing: String =
            good.lines().filter(|l| !l.starts_with("sm_count")).map(|l| format!("{l}\n")).collect();
        let faults = check_text("p.toml", &missing).unwrap_err();
        assert!(faults[0].contains("sm_count"), "{faults:?}");
        // Not TOML at all.
        let faults = check_text("p.toml", "name = ").unwrap_err();
        assert!(faults[0].starts_with("p.toml:1:"), "{faults:?}");
    }

    #[test]
    fn a_profile_file_is_read_with_its_digest() {
        let dir = tempfile::tempdir().unwrap();
        let text = BUNDLED.iter().find(|(n, _)| *n == "h100-cx7").unwrap().1;
        let path = dir.path().join("mine.toml");
        std::fs::write(&path, text).unwrap();
        let (table, sha) = read_file(&path, "mine.toml").unwrap();
        assert_eq!(sha, crate::scenario::sha256_hex(text.as_bytes()));
        assert_eq!(table, bundled_table("h100-cx7").unwrap());
        let err = read_file(&dir.path().join("none.toml"), "none.toml").unwrap_err();
        assert!(err[0].starts_with("none.toml: "), "{err:?}");
        let err = read_file(dir.path(), "d").unwrap_err();
        assert_eq!(
            err,
            vec!["d: not a regular file (a directory); a profile is a TOML file".to_string()]
        );
        assert!(names_file("profiles/my.toml") && names_file("my.toml") && names_file("./x"));
        assert!(!names_file("h100-cx7"));
        assert_eq!(file_path("scenarios/s.toml", "p/my.toml"), Path::new("scenarios/p/my.toml"));
    }

    #[test]
    fn overrides_apply_and_unknown_keys_fail() {
        let mut cluster: ClusterSpec = toml::from_str("profile = \"h800-cx7\"\nnodes = 4").unwrap();
        cluster.overrides = toml::from_str("[nic]\nwqe_post_ns = 7").unwrap();
        let p = resolve(&cluster).unwrap();
        assert_eq!(p.cluster.nodes, 4);
        assert_eq!(p.nic.wqe_post_ns, 7);

        cluster.overrides = toml::from_str("[nic]\nwarp_drive = 1").unwrap();
        let err = resolve(&cluster).unwrap_err();
        assert_eq!(err.key, "cluster.overrides.nic.warp_drive");

        cluster.overrides = toml::from_str("[nic]\nwqe_post_ns = \"fast\"").unwrap();
        let err = resolve(&cluster).unwrap_err();
        assert_eq!(err.key, "cluster.overrides.nic.wqe_post_ns");
        assert_eq!(err.message, "expected an integer, found the string \"fast\"");

        cluster.overrides = toml::from_str("[nic]\nper_gpu = -1").unwrap();
        let err = resolve(&cluster).unwrap_err();
        assert_eq!(err.key, "cluster.overrides.nic.per_gpu");
        assert_eq!(err.message, "expected an integer from 0 to 4294967295, found the integer -1");
    }
}
