//! `probe.*`: the ceilings and design probes measured in the same run as the scenario
//! (`crate::probes`), each figure the median of CUDA-event-timed repetitions (three decimals).
//! Maps are keyed as the probes name their shapes: bytes (`"4096"`), blocks (`"132"`),
//! `"<blocks>x<threads>"`, GPU pairs (`"0->1"`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Every probe's figures; a probe that did not run is absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Probes {
    /// Device-to-device `cuMemcpy` of 1 GiB: bytes copied per ns (GB/s).
    #[serde(
        rename = "probe.memcpy_dtod_bw_gbps",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub memcpy_dtod_bw_gbps: Option<f64>,
    /// The same counting the read and the write (2 × the copy).
    #[serde(
        rename = "probe.memcpy_dtod_read_write_bw_gbps",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub memcpy_dtod_read_write_bw_gbps: Option<f64>,
    /// µs of a `cuMemcpy` by its size in bytes (4 KiB to 1 GiB).
    #[serde(
        rename = "probe.memcpy_dtod_us_by_bytes",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub memcpy_dtod_us_by_bytes: Option<BTreeMap<String, f64>>,
    #[serde(
        rename = "probe.memcpy_small_4KiB_latency_us",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub memcpy_small_4kib_latency_us: Option<f64>,
    /// The 16-byte-vector copy kernel on the full grid (every SM at its occupancy), 256 MiB.
    #[serde(
        rename = "probe.copy_kernel_bw_gbps",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub copy_kernel_bw_gbps: Option<f64>,
    /// The copy kernel by its number of 1,024-thread blocks.
    #[serde(
        rename = "probe.copy_kernel_bw_gbps_by_blocks",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub copy_kernel_bw_gbps_by_blocks: Option<BTreeMap<String, f64>>,
    /// One block: one SM's copy rate.
    #[serde(
        rename = "probe.copy_kernel_one_block_bw_gbps",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub copy_kernel_one_block_bw_gbps: Option<f64>,
    /// One empty kernel between two CUDA events.
    #[serde(
        rename = "probe.empty_kernel_event_us",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub empty_kernel_event_us: Option<f64>,
    /// µs per launch of 1,000 empty kernels back to back.
    #[serde(rename = "probe.launch_interval_us", skip_serializing_if = "Option::is_none", default)]
    pub launch_interval_us: Option<f64>,
    /// Flag ping-pong between two blocks of one GPU (system scope): round trip and one way.
    #[serde(
        rename = "probe.flag_roundtrip_same_gpu_ns",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub flag_roundtrip_same_gpu_ns: Option<f64>,
    #[serde(
        rename = "probe.flag_latency_same_gpu_ns",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub flag_latency_same_gpu_ns: Option<f64>,
    /// What the L2 flush's dirty lines cost a short op: per `"copy_<N>MiB"` / `"read_<N>MiB"`.
    #[serde(rename = "probe.flush_writeback", skip_serializing_if = "Option::is_none", default)]
    pub flush_writeback: Option<BTreeMap<String, FlushStates>>,
    /// The kernels' warp copy of 7,168-byte chunks, L2-resident or through HBM.
    #[serde(rename = "probe.warp_copy_bw_gbps", skip_serializing_if = "Option::is_none", default)]
    pub warp_copy_bw_gbps: Option<WarpCopies>,
    /// The normal kernels' ring handoff alone, by `"<blocks>x<threads>[_discard]"`.
    #[serde(
        rename = "probe.ring_handoff_bw_gbps",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub ring_handoff_bw_gbps: Option<BTreeMap<String, f64>>,
    /// Dependent loads from L2 and HBM, idle and with every SM loading.
    #[serde(rename = "probe.dependent_load", skip_serializing_if = "Option::is_none", default)]
    pub dependent_load: Option<BTreeMap<String, DependentLoad>>,
    /// Single operations of one warp.
    #[serde(rename = "probe.op_latency", skip_serializing_if = "Option::is_none", default)]
    pub op_latency: Option<OpLatency>,
    /// Flag ping-pong at `.gpu` scope (the transport kernels' scope on one GPU), one way.
    #[serde(
        rename = "probe.flag_latency_same_gpu_gpu_scope_ns",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub flag_latency_same_gpu_gpu_scope_ns: Option<f64>,
    /// The low-latency dispatch's send loop, and the receive after it, by shape.
    #[serde(rename = "probe.ll_send_chain", skip_serializing_if = "Option::is_none", default)]
    pub ll_send_chain: Option<BTreeMap<String, LlChainShape>>,
    /// Peer copies between the GPUs in use, by `"<from>-><to>"` ordinal.
    #[serde(rename = "probe.peer_copy_bw_gbps", skip_serializing_if = "Option::is_none", default)]
    pub peer_copy_bw_gbps: Option<BTreeMap<String, f64>>,
    #[serde(
        rename = "probe.flag_latency_peer_ns",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub flag_latency_peer_ns: Option<BTreeMap<String, f64>>,
    /// `EPTWIN_CLUSTER_PROBE=1`: clusters of the bulk-copy kernel resident at once.
    #[serde(
        rename = "probe.cluster_handoff_max_active_clusters",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub cluster_handoff_max_active_clusters: Option<u32>,
    /// The cluster handoff by shape: bytes handed over per ns.
    #[serde(
        rename = "probe.cluster_handoff_bw_gbps",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub cluster_handoff_bw_gbps: Option<BTreeMap<String, f64>>,
    #[serde(
        rename = "probe.cluster_handoff_checks",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub cluster_handoff_checks: Option<BTreeMap<String, HandoffCheck>>,
    /// The cluster combine's reducer by `"<blocks>blk.k<top-k>"`: ns per token.
    #[serde(
        rename = "probe.cluster_reduce_ns_per_token",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub cluster_reduce_ns_per_token: Option<BTreeMap<String, f64>>,
    #[serde(
        rename = "probe.cluster_reduce_checks",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub cluster_reduce_checks: Option<BTreeMap<String, ReduceCheck>>,
    /// Launches of the cluster kernels and plain ones by shape, between two events.
    #[serde(rename = "probe.cluster_launch_us", skip_serializing_if = "Option::is_none", default)]
    pub cluster_launch_us: Option<BTreeMap<String, f64>>,
}

/// One op of the flush probe in the three states an op can start in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlushStates {
    /// Right after the L2 flush, as every op is timed.
    pub after_flush_us: f64,
    /// After the flush and an untimed read elsewhere (L2 full of clean lines).
    pub after_clean_us: f64,
    /// After the flush and 2 ms idle.
    pub after_idle_us: f64,
}

/// Warp copies by `"<blocks>x<threads>"`, per placement of source and destination.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WarpCopies {
    pub l2_to_l2: BTreeMap<String, f64>,
    pub hbm_to_hbm: BTreeMap<String, f64>,
    pub l2_to_hbm: BTreeMap<String, f64>,
    pub hbm_to_l2: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DependentLoad {
    /// Thread 0's time per load.
    pub ns_per_load_thread0: f64,
    pub launch_us: f64,
    /// Loads of the whole launch per µs.
    pub loads_per_us: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpLatency {
    pub atomic_add_ns: f64,
    pub acquire_load_gpu_ns: f64,
    #[serde(rename = "warp_copy_7168B_ns")]
    pub warp_copy_7168b_ns: f64,
    #[serde(rename = "warp_copy_7168B_release_ns")]
    pub warp_copy_7168b_release_ns: f64,
}

/// One shape of the low-latency send chain probe: the send loop alone, or a receive launched
/// right after it (`"<shape>_then_recv[_variant]"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LlChainShape {
    Send(LlSendShape),
    Recv(LlRecvShape),
}

/// The send loop: the launch, the loop's and the count tail's spans, and one sending warp's
/// time per round split into its steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlSendShape {
    pub launch_us: f64,
    pub loop_us: f64,
    pub tail_us: f64,
    pub ns_per_round: f64,
    pub cast_barrier_ns: f64,
    pub index_atomic_ns: f64,
    pub copy_ns: f64,
    pub release_loop_ns: f64,
}

/// The receive after a send: both launches, the receive's part of them and its own span, and
/// one receive group's poll and message time per item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlRecvShape {
    pub launch_us: f64,
    pub recv_us: f64,
    pub recv_loop_us: f64,
    pub poll_ns_per_item: f64,
    pub messages_ns_per_item: f64,
    pub messages_per_item: f64,
}

/// What the cluster handoff moved and whether every word arrived.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandoffCheck {
    pub bytes: u64,
    /// Words that differ from the source (`null`: not checked).
    pub wrong_words: Option<u64>,
    pub kernel_us: f64,
    pub smem_bytes: u32,
    pub max_active_clusters: u32,
}

/// The cluster reducer's check: tokens, the launch, the fastest and slowest block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReduceCheck {
    pub tokens_per_block: u32,
    pub kernel_us: f64,
    pub block_ns_min: u64,
    pub block_ns_max: u64,
    pub wrong_values: u64,
}
