//! The wire option of a job: which of its bytes cross the wire, as the plan's rules say (the
//! one place the internode runtime reads the plan). Normal kernels cross between the plan's
//! nodes; low-latency kernels cross wherever `Plan::low_latency_path` gives RDMA, which with
//! `allow_nvlink_for_low_latency_mode = false` (`NVSHMEM_DISABLE_P2P`) is every peer, ranks on
//! one GPU included: the hardware then never makes an NVLink store the simulator would not.
//! Also what the wire (`eptwin_wire::links`) takes from this backend: pinned memory mapped
//! into the GPU, and the process group as the exchange of the wire's endpoints.

use std::sync::Arc;
use std::time::Duration;

use eptwin_engine::api::{DeepEpJob, EpMode, JobPlan, PeerPath, Plan};

use eptwin_wire::WireError;
use eptwin_wire::faults::WireFaults;
use eptwin_wire::links::{EndpointExchange, MappedMemory};

use crate::cuda::{Gpu, PinnedHost};
use crate::error::HwError;
use crate::options::HwOptions;
use crate::processes::Processes;
use eptwin_wire::links::WireConfig;
use eptwin_wire::protocol::{Geometry, Traffic};
use eptwin_wire::rdma::QpSettings;

/// How a job's ranks meet the wire: the nodes of the plan it spans (placement stacks them onto
/// this machine's GPUs) and the protocol geometry of the bytes that cross the wire, `None` when
/// every byte moves by stores.
#[derive(Debug, Clone)]
pub struct JobWire {
    pub plan_nodes: u32,
    pub crossing: Option<(Geometry, Traffic)>,
}

/// The bytes of a job that cross the wire: their protocol geometry and traffic, and how to
/// build the wire (the QP settings the job's NVSHMEM environment gives).
#[derive(Debug, Clone)]
pub struct Crossing {
    pub geometry: Geometry,
    pub traffic: Traffic,
    pub config: WireConfig,
}

impl Crossing {
    /// The wire of `geometry` as `options` ask for it (`EPTWIN_WIRE`, `EPTWIN_RDMA_DEVICE`),
    /// with the job's QP settings; an invalid `EPTWIN_WIRE` waives the job naming it.
    pub fn new(
        plan: &Plan,
        job: &JobPlan,
        (geometry, traffic): (Geometry, Traffic),
        options: &HwOptions,
    ) -> Result<Crossing, HwError> {
        let request = options.wire.clone().map_err(HwError::Unsupported)?;
        // The proxy outlasts the kernels' bounded waits (the host's bound: 4x + 30 s).
        let timeout = Duration::from_millis(options.kernel_timeout_ms * 4 + 30_000);
        let mut config = WireConfig::new(request, QpSettings::for_job(plan, job), timeout);
        config.rdma_device = options.rdma_device.clone();
        config.faults = WireFaults::new(plan, &config.qp_settings);
        Ok(Crossing { geometry, traffic, config })
    }
}

/// The nodes of the plan `job` spans and, when some of its bytes cross the wire, their
/// geometry. Normal kernels cross between the plan's nodes (whose ranks must fill them in
/// order). Low-latency kernels cross wherever the plan's path rule
/// (`Plan::low_latency_path`) says RDMA: the wire's "nodes" are the blocks of consecutive ranks
/// that reach each other by stores, one rank each with `NVSHMEM_DISABLE_P2P` (every message
/// but a rank's own over the wire). `d` is the job's DeepEP part as the backend runs it (its
/// `num_sms` may be overridden).
pub fn job_geometry(plan: &Plan, job: &JobPlan, d: &DeepEpJob) -> Result<JobWire, HwError> {
    let n = job.num_ranks();
    let node_of: Vec<u32> = job.ranks.iter().map(|&r| plan.topology.node_of_rank(r)).collect();
    let first = node_of.first().copied().unwrap_or(0);
    let plan_nodes = node_of.iter().map(|&x| x - first).max().map_or(1, |m| m + 1);
    let (traffic, ranks_per_block) = match d.mode {
        EpMode::LowLatency => (Traffic::LowLatency, store_block_ranks(plan, job)?),
        _ => (Traffic::Normal, n / plan_nodes),
    };
    if d.mode != EpMode::LowLatency && plan_nodes > 1 {
        let rpn = ranks_per_block;
        let in_order = rpn * plan_nodes == n
            && node_of.iter().enumerate().all(|(i, &x)| x - first == i as u32 / rpn);
        if !in_order {
            return Err(HwError::Unsupported(format!(
                "job {:?}: its {n} ranks do not fill {plan_nodes} nodes in order, {rpn} each",
                job.name
            )));
        }
    }
    if ranks_per_block >= n {
        return Ok(JobWire { plan_nodes, crossing: None });
    }
    let g = Geometry::for_job(job, d, ranks_per_block).map_err(HwError::Unsupported)?;
    Ok(JobWire { plan_nodes, crossing: Some((g, traffic)) })
}

/// Ranks per block of a low-latency job: the blocks of consecutive job ranks within which the
/// plan's path rule gives every pair a store (device-local, NVLink or PCIe) and between which
/// it gives RDMA; the whole job when every pair stores. The kernels reach a destination by a
/// store or through the wire by the same test (`ll_remote`: different blocks), so a rule that
/// does not form such blocks cannot run here and is waived with the pair that breaks them.
pub fn store_block_ranks(plan: &Plan, job: &JobPlan) -> Result<u32, HwError> {
    let stores = |a: u32, b: u32| plan.low_latency_path(job.id, a, b) != PeerPath::Rdma;
    store_blocks(job.num_ranks(), stores).map_err(|(a, b, block)| {
        HwError::Unsupported(format!(
            "job {:?}: the low-latency path rule (NVSHMEM_DISABLE_P2P={}, \
             NVSHMEM_DISABLE_MNNVL={}) gives ranks {a} and {b} {} but the kernels split the job \
             into blocks of {block} consecutive ranks that store to each other",
            job.name,
            job.nvshmem.disable_p2p as u8,
            job.nvshmem.disable_mnnvl as u8,
            if stores(a, b) { "stores" } else { "RDMA" },
        ))
    })
}

/// The block size `b` with `stores(x, y) == (x / b == y / b)` for every pair of `n` ranks, or
/// the first pair `(x, y, b)` that breaks the blocks rank 0's stores start.
fn store_blocks(n: u32, stores: impl Fn(u32, u32) -> bool) -> Result<u32, (u32, u32, u32)> {
    let block = (1..n).find(|&b| !stores(0, b)).unwrap_or(n.max(1));
    for a in 0..n {
        for b in 0..n {
            if stores(a, b) != (a / block == b / block) {
                return Err((a, b, block));
            }
        }
    }
    Ok(block)
}

impl MappedMemory for PinnedHost {
    fn host_ptr(&self) -> *mut u8 {
        self.host()
    }
    fn device_addr(&self) -> u64 {
        self.device()
    }
}

/// [`Gpu::alloc_mapped_host`] as the wire's allocator (`eptwin_wire::links::MappedAlloc`).
pub fn pinned(gpu: &Gpu) -> impl Fn(usize) -> Result<Arc<dyn MappedMemory>, WireError> + '_ {
    move |bytes| match gpu.alloc_mapped_host(bytes) {
        Ok(m) => Ok(Arc::new(m) as Arc<dyn MappedMemory>),
        Err(e) => Err(WireError::External(Box::new(e))),
    }
}

/// How long a process waits for the others' endpoints (they may still be compiling kernels
/// or allocating buffers).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(300);

impl EndpointExchange for Processes {
    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, WireError> {
        self.all_gather_bytes("internode wire endpoints", bytes, EXCHANGE_TIMEOUT)
            .map_err(|e| WireError::External(Box::new(e)))
    }
}

/// How a launch that talked over the wire ended: a kernel that gave up waiting is explained by
/// the wire's failure (`health`) when the wire failed.
pub fn launch_outcome(
    done: Result<(), HwError>,
    health: Result<(), WireError>,
) -> Result<(), HwError> {
    match (done, health.map_err(HwError::from)) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(HwError::KernelTimeout { op, what }), Err(wire)) => {
            Err(HwError::KernelTimeout { op, what: format!("{what}; {wire}") })
        }
        (Err(e), _) | (Ok(()), Err(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan's low-latency path rule decides which bytes cross the wire: none on one GPU
    /// or one NVLink node by default, other nodes' with the plan's nodes as the wire's, and with
    /// `allow_nvlink_for_low_latency_mode = false` every other rank's (one rank per block).
    #[test]
    fn the_path_rule_decides_what_crosses_the_wire() {
        use eptwin_engine::testing::ScenarioDraft;
        let wire_of = |draft: &ScenarioDraft| {
            let plan = draft.plan();
            let job = &plan.jobs[0];
            job_geometry(&plan, job, job.deepep().unwrap()).unwrap()
        };
        let one_gpu = ScenarioDraft::bundled("h200-ep8-ll-128");
        let w = wire_of(&one_gpu);
        assert_eq!(w.plan_nodes, 1);
        assert!(w.crossing.is_none(), "8 ranks on one GPU store to each other");

        let no_p2p = one_gpu.set("job[0].buffer.allow_nvlink_for_low_latency_mode", false);
        let (g, traffic) = wire_of(&no_p2p).crossing.expect("every peer over the wire");
        assert_eq!((traffic, g.ranks_per_node, g.num_nodes()), (Traffic::LowLatency, 1, 8));
        assert_eq!(g.qps_per_peer, 32, "NVSHMEM's QPs per peer: num_qps_per_rank");

        let two_nodes = ScenarioDraft::bundled("ep16-ll");
        let w = wire_of(&two_nodes);
        let (g, _) = w.crossing.expect("the other node over the wire");
        assert_eq!((w.plan_nodes, g.ranks_per_node), (2, 8));
        let w = wire_of(&two_nodes.set("job[0].buffer.allow_nvlink_for_low_latency_mode", false));
        assert_eq!((w.plan_nodes, w.crossing.unwrap().0.ranks_per_node), (2, 1));

        let mnnvl = ScenarioDraft::bundled("nvl72-ll-mnnvl");
        assert!(wire_of(&mnnvl).crossing.is_none(), "MNNVL maps every peer");
        let w = wire_of(&mnnvl.set("job[0].buffer.allow_mnnvl", false));
        let (g, _) = w.crossing.expect("other trays through the NICs");
        assert_eq!(g.ranks_per_node * g.num_nodes(), 72);
        assert_eq!(g.ranks_per_node, 4, "a GB200 tray's four GPUs");

        let normal = ScenarioDraft::bundled("ep16-normal-internode");
        let w = wire_of(&normal.set("job[0].buffer.allow_nvlink_for_low_latency_mode", false));
        let (g, traffic) = w.crossing.expect("normal kernels cross between the plan's nodes");
        assert_eq!((traffic, g.ranks_per_node), (Traffic::Normal, 8), "P2P is a low-latency rule");
    }

    #[test]
    fn store_blocks_are_found_or_the_breaking_pair_named() {
        assert_eq!(store_blocks(8, |a, b| a / 4 == b / 4), Ok(4));
        assert_eq!(store_blocks(8, |a, b| a == b), Ok(1));
        assert_eq!(store_blocks(8, |_, _| true), Ok(8));
        assert_eq!(store_blocks(1, |_, _| true), Ok(1));
        // Rank 0 stores to 1 and 2, but 2 stores to 3 as well: no blocks of consecutive ranks.
        let chain = |a: u32, b: u32| {
            a.abs_diff(b) <= 2 && a / 3 == b / 3 || (a, b) == (2, 3) || (a, b) == (3, 2)
        };
        assert_eq!(store_blocks(6, chain), Err((2, 3, 3)));
    }
}
