//! DeepEP V1's algorithms as programs on the simulated machine (docs/design.md, DeepEP §8–§12): the
//! normal intranode and internode (RDMA once per node, NVLink forwarding) kernels and the
//! low-latency kernels, with DeepEP's flow control expressed as actors waiting on counters.

pub mod internode;
pub mod intranode;
pub mod ll;

use eptwin_engine::api::JobId;
use eptwin_engine::api::{PeerPath, Plan};

use crate::core::Core;
use crate::core::time::{Rate, Time};
use crate::gpu::PathKind;

/// How a rank reaches another in a DeepEP kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A copy: device-local, NVLink or PCIe peer-to-peer.
    Copy(PathKind),
    /// RDMA through the NICs.
    Rdma,
}

/// The path a low-latency kernel's message takes between two job ranks: the plan's rule
/// (`Plan::low_latency_path`: itself by pointer, a mapped peer by stores, everyone else through
/// the NIC) as the models' copy kinds.
pub fn ll_route(plan: &Plan, job: JobId, a: u32, b: u32) -> Route {
    match plan.low_latency_path(job, a, b) {
        PeerPath::SameGpu => Route::Copy(PathKind::Local),
        PeerPath::Nvlink => Route::Copy(PathKind::Nvlink),
        PeerPath::Pcie => Route::Copy(PathKind::Pcie),
        PeerPath::Rdma => Route::Rdma,
    }
}

/// Whether some pair of job ranks reaches each other only through RDMA under the plan's
/// low-latency rule (`ll_route`): with P2P off (`allow_nvlink_for_low_latency_mode = false`)
/// every peer, even one on the same GPU.
pub fn ll_uses_rdma(plan: &Plan, job: JobId) -> bool {
    let n = plan.job(job).num_ranks();
    (0..n).any(|a| (0..n).any(|b| ll_route(plan, job, a, b) == Route::Rdma))
}

/// The path a normal kernel's CUDA-IPC copy takes between two ranks of one DeepEP node.
pub fn ipc_path(plan: &Plan, job: JobId, a: u32, b: u32) -> PathKind {
    let j = plan.job(job);
    if a == b {
        return PathKind::Local;
    }
    match plan.topology.rank_path(j.ranks[a as usize], j.ranks[b as usize]) {
        PeerPath::SameGpu => PathKind::Local,
        PeerPath::Nvlink => PathKind::Nvlink,
        // CUDA IPC needs peer access; without NVLink it goes over PCIe.
        PeerPath::Pcie | PeerPath::Rdma => PathKind::Pcie,
    }
}

/// GPU-side rates and costs every DeepEP program uses (from the profile).
#[derive(Debug, Clone, Copy)]
pub struct GpuCosts {
    /// One SM's copy throughput, shared by the warps that copy on it.
    pub sm: Rate,
    /// One warp's copy throughput on its own (its memory-level parallelism).
    pub warp: Rate,
    pub launch: Time,
    pub flag: Time,
    pub grid_sync: Time,
    pub per_token: Time,
    pub ll_signal: Time,
    pub ll_recv_per_msg: Time,
    /// Fixed GPU time of each low-latency dispatch kernel launch.
    pub ll_dispatch_fixed: Time,
    /// Fixed GPU time of each low-latency combine kernel launch.
    pub ll_combine_fixed: Time,
    /// The same for the receive kernels of hook mode.
    pub ll_dispatch_recv_fixed: Time,
    pub ll_combine_recv_fixed: Time,
    /// Dependent steps per token of a low-latency dispatch send block and of a combine send
    /// warp (beyond their bytes), and per partial a combine's reducing thread adds.
    pub ll_send_round: Time,
    pub ll_combine_round: Time,
    pub ll_reduce_load: Time,
    /// What a release after stores to an NVLink peer waits for: the stores' acknowledgement,
    /// one hop there and one back (docs/design.md, fabric §7).
    pub nvl_ack: Time,
    pub wqe_post: Time,
    pub notify: Time,
    /// Fraction of an SM each of the kernel's blocks gets: co-located ranks (ranks_per_gpu)
    /// whose blocks together exceed the GPU's SMs share them.
    pub sm_share: f64,
    ranks_per_gpu: u32,
    sm_count: u32,
}

impl GpuCosts {
    pub fn new(plan: &Plan, core: &Core) -> GpuCosts {
        let p = &core.params;
        let prof = &p.profile;
        let ranks_per_gpu = plan.topology.ranks_per_gpu.max(1) as f64;
        GpuCosts {
            sm: p.sm_copy_rate,
            warp: Rate::from_gbps(prof.gpu.warp_copy_bw_gbps),
            launch: p.kernel_launch,
            flag: p.flag_latency,
            grid_sync: crate::core::time::ns(prof.gpu.grid_sync_ns),
            per_token: crate::core::time::ns(prof.deepep.per_token_issue_ns),
            ll_signal: crate::core::time::ns(prof.deepep.ll_signal_ns),
            ll_recv_per_msg: crate::core::time::ns(prof.deepep.ll_recv_per_msg_ns),
            ll_dispatch_fixed: crate::core::time::ns(prof.deepep.ll_dispatch_fixed_ns),
            ll_combine_fixed: crate::core::time::ns(prof.deepep.ll_combine_fixed_ns),
            ll_dispatch_recv_fixed: crate::core::time::ns(
                prof.deepep.ll_dispatch_recv_fixed_ns.unwrap_or(prof.deepep.ll_dispatch_fixed_ns),
            ),
            ll_combine_recv_fixed: crate::core::time::ns(
                prof.deepep.ll_combine_recv_fixed_ns.unwrap_or(prof.deepep.ll_combine_fixed_ns),
            ),
            ll_send_round: crate::core::time::ns(prof.deepep.ll_send_round_ns),
            ll_combine_round: crate::core::time::ns(prof.deepep.ll_combine_round_ns),
            ll_reduce_load: crate::core::time::ns(prof.deepep.ll_reduce_load_ns),
            nvl_ack: 2 * p.nvl_latency,
            wqe_post: p.wqe_post,
            notify: crate::core::time::ns(prof.deepep.notify_host_roundtrip_ns),
            sm_share: 1.0,
            ranks_per_gpu: ranks_per_gpu as u32,
            sm_count: p.sm_count.max(1),
        }
    }

    /// The costs for a kernel of `blocks` blocks per rank: when the co-located ranks' blocks
    /// exceed the GPU's SMs, every SM (and warp) rate scales down by the oversubscription.
    pub fn for_blocks(mut self, blocks: u32) -> GpuCosts {
        let wanted = self.ranks_per_gpu.max(1) as f64 * blocks.max(1) as f64;
        self.sm_share = (self.sm_count as f64 / wanted).min(1.0);
        if self.sm_share < 1.0 {
            let scale = |r: Rate| Rate::from_gbps(r.gbps() * self.sm_share);
            self.sm = scale(self.sm);
            self.warp = scale(self.warp);
        }
        self
    }

    /// Copy rate of one of `warps` warps sharing an SM.
    pub fn warp_rate(&self, warps: u32) -> Rate {
        self.warp.slower(self.sm.shared(warps))
    }

    /// Copy rate of a group of `warps` warps on an SM where `active` warps copy at once.
    pub fn group_rate(&self, warps: u32, active: u32) -> Rate {
        let per = self.warp.slower(self.sm.shared(active.max(warps)));
        Rate::from_gbps(per.gbps() * warps.max(1) as f64)
    }
}
