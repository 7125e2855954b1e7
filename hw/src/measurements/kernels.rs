//! `hw.*_kernels`: what a kernel family ran, its launch shape and resources
//! (`KernelFamily::report`).

use serde::{Deserialize, Serialize};

/// What a kernel family ran: its launch shape and resources (`hw.*_kernels`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelReport {
    /// Normal kernels on one node.
    #[serde(rename = "hw.normal_kernels", skip_serializing_if = "Option::is_none", default)]
    pub normal: Option<NormalKernels>,
    /// The cluster kernels of the normal ops whose rings are in cluster shared memory.
    #[serde(rename = "hw.cluster_kernels", skip_serializing_if = "Option::is_none", default)]
    pub cluster: Option<ClusterKernels>,
    /// Normal kernels across nodes (internode.cu).
    #[serde(rename = "hw.internode_kernels", skip_serializing_if = "Option::is_none", default)]
    pub internode: Option<InternodeKernels>,
    #[serde(rename = "hw.low_latency_kernels", skip_serializing_if = "Option::is_none", default)]
    pub low_latency: Option<LowLatencyKernels>,
}

/// `hw.normal_kernels`: the normal kernels' grid (intranode.cu) and where each op's rings live.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NormalKernels {
    /// Whether an op runs on the global-memory rings whose shape this is (with both ops on
    /// cluster rings only the module's notify kernels run).
    pub global_ring_kernels_run: bool,
    pub threads_per_block: u32,
    pub combine_reducer_warps_per_token: u32,
    pub l2_eviction_hints: bool,
    pub blocks_per_rank: u32,
    pub channels_per_rank: u32,
    pub blocks_per_gpu: u32,
    /// The largest launch's grid (this process's ranks on one GPU × blocks per rank); some
    /// committed results do not record it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub blocks_per_launch: Option<u32>,
    pub resident_blocks_per_sm: u32,
    pub effective_sms_per_rank: f64,
    pub registers_per_thread: i32,
    pub local_memory_bytes_per_thread: i32,
    pub dispatch_rings: Rings,
    pub combine_rings: Rings,
}

/// Where a normal kernel's rings live and how many slots per (channel, source) they have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rings {
    #[serde(rename = "in")]
    pub memory: RingMemory,
    pub slots: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RingMemory {
    #[serde(rename = "cluster shared memory")]
    ClusterShared,
    #[serde(rename = "global memory")]
    Global,
}

impl Rings {
    /// Cluster rings of `cluster_slots` when the op has them, else the Config's global ring.
    pub fn of(cluster_slots: Option<u32>, global_slots: u32) -> Rings {
        match cluster_slots {
            Some(slots) => Rings { memory: RingMemory::ClusterShared, slots },
            None => Rings { memory: RingMemory::Global, slots: global_slots },
        }
    }
}

/// `hw.cluster_kernels`: per op on cluster rings, how its cluster kernel launches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterKernels {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub dispatch: Option<ClusterKernel>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub combine: Option<ClusterKernel>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterKernel {
    /// One cluster per channel.
    pub clusters: u32,
    /// One block per rank.
    pub blocks_per_cluster: u32,
    pub threads_per_block: u32,
    pub slots_per_source: u32,
    pub slot_bytes: u64,
    pub dynamic_smem_bytes: u32,
    /// Clusters the GPU holds at once (more channels than that run in waves).
    pub resident_clusters: u32,
}

/// `hw.internode_kernels`: the normal kernels across nodes (internode.cu).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InternodeKernels {
    pub threads_per_block: u32,
    pub blocks_per_rank: u32,
    pub channels_per_rank: u32,
    pub ranks_per_node: u32,
    pub nodes: u32,
    pub nvl_ring_slots: u64,
    pub rdma_ring_slots: PerOp,
    pub rdma_send_tokens: PerOp,
    pub recv_area_bytes: u64,
    pub send_area_bytes: u64,
    pub receive_layout: String,
    pub registers_per_thread: i32,
    pub local_memory_bytes_per_thread: i32,
    pub resident_blocks_per_sm: u32,
    pub effective_sms_per_rank: f64,
}

/// A count of each op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerOp {
    pub dispatch: u64,
    pub combine: u64,
}

/// `hw.low_latency_kernels`: the low-latency kernels' grids (this process's launches, its
/// share of the GPU when processes share one) and resources, `[dispatch, combine]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LowLatencyKernels {
    pub threads_per_block: u32,
    pub dispatch_blocks_per_gpu: Vec<u32>,
    pub combine_blocks_per_gpu: Vec<u32>,
    pub effective_sms_per_rank: f64,
    pub registers_per_thread: [i32; 2],
    pub local_memory_bytes_per_thread: [i32; 2],
    pub warps_per_receive_group: i32,
}
