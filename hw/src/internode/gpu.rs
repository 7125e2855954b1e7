//! The GPU side of the internode wire (docs/cluster.md, "Internode over the wire"): for every
//! node this process runs, its receive and send regions and one doorbell ring per local rank
//! in pinned host memory mapped into the GPU (kernels stage tokens, publish records and poll
//! counters there), the wire to every other node, and the proxy thread serving the rings.
//!
//! The data path is *staged*: the GPU writes tokens into host memory and the proxy's wire
//! reads them from there (TCP: `send`; verbs: the NIC reads the registered host region). With
//! GPUDirect RDMA (`rdma::Nic::gpu_memory_path`: dma-buf or nvidia-peermem) the send and
//! receive areas could be device memory registered with the NIC instead, saving the PCIe
//! crossing; the kernels would address them the same way, only the registration
//! (`Nic::register_gpu`) and the polling (device instead of system scope) would change. That
//! path is not built: every result says `data_path: "staged"`.
//!
//! A process runs the nodes `owned` lists (one in a launcher's process per node; all of them in
//! a single-process run, where the nodes' wires meet over loopback exactly as separate
//! processes' would). Endpoints travel through an [`EndpointExchange`]: the launcher's process
//! group, or [`SingleProcess`].

use std::net::{IpAddr, SocketAddr};
use std::panic::RefUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use eptwin_engine::plan::{DeepEpJob, Dtype, EpMode, JobPlan, PeerPath, Plan};

use super::geometry::{Geometry, QpTable, TokenDtype, Traffic};
use crate::cuda::{Gpu, PinnedHost};
use crate::error::HwError;
use crate::rdma::{QpSettings, RdmaError};
use crate::wire::doorbell::{SLOT_BYTES, external_doorbell_queue};
use crate::wire::region::Keeper;
use crate::wire::{
    DoorbellConsumer, Proxy, ProxySpec, Region, TcpEndpoint, TcpReceivers, TcpSetup, TcpTimeouts,
    TcpWire, WireChoice, WireKind, WireReport, WireRequest,
};

/// How the processes of a job swap the bytes their wires need before connecting (TCP
/// endpoints, verbs QP endpoints). The launcher's process group implements it; a run in one
/// process uses [`SingleProcess`].
pub trait EndpointExchange {
    /// Every process's `bytes`, in process order, this one's included.
    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, HwError>;
}

/// The exchange of a job that runs in one process: nothing to swap.
pub struct SingleProcess;

impl EndpointExchange for SingleProcess {
    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, HwError> {
        Ok(vec![bytes.to_vec()])
    }
}

/// How long a process waits for the others' endpoints (they may still be compiling kernels
/// or allocating buffers).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(300);

impl EndpointExchange for crate::processes::Processes {
    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, HwError> {
        self.all_gather_bytes("internode wire endpoints", bytes, EXCHANGE_TIMEOUT)
    }
}

/// The nodes whose ranks are `local` (a process's ranks): each node's ranks must all be in
/// `local` or none of them, because a node's regions, rings and proxy belong to one process
/// (the kernels reach the ranks of their own node by plain stores).
pub fn owned_nodes(geometry: &Geometry, local: &[u32]) -> Result<Vec<u32>, HwError> {
    let mut nodes: Vec<u32> = local.iter().map(|&r| geometry.node_of(r)).collect();
    nodes.sort_unstable();
    nodes.dedup();
    for &node in &nodes {
        let want = geometry.ranks_per_node as usize;
        let have = local.iter().filter(|&&r| geometry.node_of(r) == node).count();
        if have != want {
            return Err(HwError::Unsupported(format!(
                "this process runs {have} of node {node}'s {want} ranks: a job across nodes runs \
                 each node's ranks in one process (one process per node, or one for all; \
                 --ranks-per-process {want})"
            )));
        }
    }
    Ok(nodes)
}

/// How a job's ranks meet the wire: the nodes of the plan it spans (placement stacks them onto
/// this machine's GPUs) and the protocol geometry of the bytes that cross the wire, `None` when
/// every byte moves by stores. The one place the internode runtime reads the plan.
#[derive(Debug, Clone)]
pub struct JobWire {
    pub plan_nodes: u32,
    pub crossing: Option<(Geometry, Traffic)>,
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
    let w = &d.workload;
    let dispatch_dtype = match w.dispatch_dtype {
        Dtype::Fp8 => TokenDtype::Fp8,
        Dtype::Bf16 => TokenDtype::Bf16,
        Dtype::Logfmt => {
            return Err(HwError::Unsupported("LogFMT is a combine encoding".into()));
        }
    };
    let (dc, cc) = (d.dispatch_config.as_ref(), d.combine_config.as_ref());
    let g = Geometry {
        num_ranks: n,
        ranks_per_node: ranks_per_block,
        hidden: w.hidden,
        topk: w.topk,
        num_experts: w.experts,
        tokens_per_rank: w.tokens_per_rank,
        max_tokens_per_rank: w.max_dispatch_tokens_per_rank,
        dispatch_dtype,
        num_channels: dc.map_or(0, |c| c.num_channels()),
        rdma_send_tokens: dc.map_or(0, |c| c.num_max_rdma_chunked_send_tokens),
        rdma_recv_tokens: dc.map_or(0, |c| c.rdma_recv_rounded()),
        combine_rdma_send_tokens: cc.map_or(0, |c| c.num_max_rdma_chunked_send_tokens),
        combine_rdma_recv_tokens: cc.map_or(0, |c| c.rdma_recv_rounded()),
        qps_per_peer: job.qps_per_peer(),
    };
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

/// How to build the wire.
#[derive(Debug, Clone)]
pub struct WireConfig {
    pub request: WireRequest,
    /// The address peers dial this process's TCP listeners at (loopback in one process).
    pub bind_host: IpAddr,
    pub tcp_timeouts: TcpTimeouts,
    /// How long a proxy waits for a QP slot or its final drain.
    pub stall_timeout: Duration,
    /// Slots of each rank's doorbell ring (a power of two).
    pub ring_slots: usize,
    /// The job's QP settings (verbs: SL, traffic class, depth, MTU, QPs per peer).
    pub qp_settings: QpSettings,
    /// `EPTWIN_RDMA_DEVICE`.
    pub rdma_device: Option<String>,
}

impl WireConfig {
    pub fn new(request: WireRequest, qp_settings: QpSettings, timeout: Duration) -> Self {
        WireConfig {
            request,
            bind_host: IpAddr::from([127, 0, 0, 1]),
            tcp_timeouts: TcpTimeouts { connect: timeout, write: timeout, close: timeout },
            stall_timeout: timeout,
            ring_slots: 4096,
            qp_settings,
            rdma_device: None,
        }
    }
}

/// Bytes of one rank's receive and send areas (a node's regions hold `ranks_per_node` each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AreaSizes {
    pub recv_area_bytes: u64,
    pub send_area_bytes: u64,
}

/// What one rank's kernels need of its node's wire: device addresses of its areas and ring,
/// and its areas' offsets within a region (the same at every node: rank `l`'s area is at
/// `l ·` area size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankWire {
    pub recv_area: u64,
    pub send_area: u64,
    pub ring_slots: u64,
    pub ring_mask: u64,
    pub recv_area_offset: u64,
    pub send_area_offset: u64,
}

/// Host memory the GPU reaches through a mapping: [`PinnedHost`] on the GPU machine; plain
/// page-aligned host memory in tests of the host side.
pub trait MappedMemory: Send + Sync + RefUnwindSafe + 'static {
    /// The address CPU threads use.
    fn host_ptr(&self) -> *mut u8;
    /// The address kernels use.
    fn device_addr(&self) -> u64;
}

impl MappedMemory for PinnedHost {
    fn host_ptr(&self) -> *mut u8 {
        self.host()
    }
    fn device_addr(&self) -> u64 {
        self.device()
    }
}

/// Allocates `bytes` of zeroed, page-aligned mapped memory.
pub type MappedAlloc<'a> = &'a dyn Fn(usize) -> Result<Arc<dyn MappedMemory>, HwError>;

/// [`Gpu::alloc_mapped_host`] as a [`MappedAlloc`].
pub fn pinned(gpu: &Gpu) -> impl Fn(usize) -> Result<Arc<dyn MappedMemory>, HwError> + '_ {
    move |bytes| gpu.alloc_mapped_host(bytes).map(|m| Arc::new(m) as Arc<dyn MappedMemory>)
}

/// Holds a mapped allocation for a region or ring (its keeper).
struct Keep(#[allow(dead_code)] Arc<dyn MappedMemory>);

fn keeper(mem: &Arc<dyn MappedMemory>) -> Keeper {
    Arc::new(Keep(mem.clone()))
}

/// One node's memory: regions and rings, kept alive by the mapped allocations.
struct NodeMemory {
    node: u32,
    recv: Arc<Region>,
    send: Arc<Region>,
    recv_mem: Arc<dyn MappedMemory>,
    send_mem: Arc<dyn MappedMemory>,
    rings: Vec<Arc<dyn MappedMemory>>,
}

enum NodeWire {
    Tcp {
        proxy: Option<Proxy<TcpWire>>,
        receivers: Option<TcpReceivers>,
    },
    #[cfg(feature = "rdma")]
    Verbs {
        proxy: Option<Proxy<crate::rdma::VerbsWire>>,
    },
}

/// The wire of the nodes this process runs, up and serving their rings.
pub struct WireLinks {
    ranks_per_node: u32,
    sizes: AreaSizes,
    ring_slots: usize,
    /// Per owned node: its wire (dropped first: threads stop before the memory goes).
    wires: Vec<NodeWire>,
    memory: Vec<NodeMemory>,
    report: WireReport,
    /// The first failure a proxy or link reported (kept for every later question).
    failure: Option<String>,
}

fn wire_error(e: RdmaError) -> HwError {
    match e {
        RdmaError::WireUnavailable { .. } => HwError::Unsupported(e.to_string()),
        other => HwError::Wire(other.to_string()),
    }
}

/// Length-prefixed records `(node, bytes)` of one process, for the exchange.
fn pack(records: &[(u32, u32, Vec<u8>)]) -> Vec<u8> {
    let mut out = (records.len() as u32).to_le_bytes().to_vec();
    for (a, b, bytes) in records {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

fn unpack(bytes: &[u8]) -> Result<Vec<(u32, u32, Vec<u8>)>, HwError> {
    let bad =
        || HwError::Wire(format!("a peer process sent {} unreadable endpoint bytes", bytes.len()));
    let word = |at: usize| -> Result<u32, HwError> {
        let b = bytes.get(at..at + 4).ok_or_else(bad)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let n = word(0)? as usize;
    let mut at = 4;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (a, b, len) = (word(at)?, word(at + 4)?, word(at + 8)? as usize);
        let body = bytes.get(at + 12..at + 12 + len).ok_or_else(bad)?.to_vec();
        out.push((a, b, body));
        at += 12 + len;
    }
    if at != bytes.len() {
        return Err(bad());
    }
    Ok(out)
}

/// Every process's records, flattened.
fn gather(
    exchange: &mut dyn EndpointExchange,
    mine: &[(u32, u32, Vec<u8>)],
) -> Result<Vec<(u32, u32, Vec<u8>)>, HwError> {
    let mut all = Vec::new();
    for blob in exchange.all_gather(&pack(mine))? {
        all.extend(unpack(&blob)?);
    }
    Ok(all)
}

impl WireLinks {
    /// Allocate the owned nodes' regions and rings with `alloc` ([`pinned`] on a GPU), connect
    /// the wire `config` asks for to every other node of `geometry`, and start one proxy per
    /// owned node.
    pub fn connect(
        alloc: MappedAlloc<'_>,
        owned: &[u32],
        geometry: &Geometry,
        traffic: Traffic,
        sizes: AreaSizes,
        config: &WireConfig,
        exchange: &mut dyn EndpointExchange,
    ) -> Result<WireLinks, HwError> {
        let choice = crate::wire::choose(config.request).map_err(wire_error)?;
        let rpn = geometry.ranks_per_node as u64;
        if owned.is_empty() || owned.iter().any(|&n| n >= geometry.num_nodes()) {
            return Err(HwError::Wire(format!(
                "this process runs nodes {owned:?} of {}",
                geometry.num_nodes()
            )));
        }
        if !config.ring_slots.is_power_of_two() {
            return Err(HwError::Wire(format!("{} doorbell slots per ring", config.ring_slots)));
        }
        let mut memory = Vec::with_capacity(owned.len());
        for &node in owned {
            let recv_mem = alloc((rpn * sizes.recv_area_bytes) as usize)?;
            let send_mem = alloc((rpn * sizes.send_area_bytes) as usize)?;
            let region = |mem: &Arc<dyn MappedMemory>, len: u64| {
                // SAFETY: the allocation is `len` bytes or more and lives as long as the keeper
                // the region holds; only copies, atomics and the GPU touch it.
                unsafe { Region::from_raw_kept(mem.host_ptr(), len as usize, keeper(mem)) }
                    .map(Arc::new)
                    .map_err(wire_error)
            };
            let recv = region(&recv_mem, rpn * sizes.recv_area_bytes)?;
            let send = region(&send_mem, rpn * sizes.send_area_bytes)?;
            let rings = (0..rpn)
                .map(|_| alloc(config.ring_slots * SLOT_BYTES))
                .collect::<Result<Vec<_>, _>>()?;
            memory.push(NodeMemory { node, recv, send, recv_mem, send_mem, rings });
        }
        let consumers = |m: &NodeMemory| -> Result<Vec<DoorbellConsumer>, HwError> {
            m.rings
                .iter()
                .map(|ring| {
                    // SAFETY: the allocation is page-aligned, `ring_slots` slots long and kept
                    // alive by the keeper; only the rank's kernels (the protocol's producers)
                    // and this consumer use it.
                    unsafe {
                        external_doorbell_queue(ring.host_ptr(), config.ring_slots, keeper(ring))
                    }
                    .map_err(HwError::Wire)
                })
                .collect()
        };
        let qps_per_peer = geometry.qps_per_peer;
        let (wires, report) = match choice.kind {
            WireKind::Tcp => {
                Self::connect_tcp(&memory, geometry, traffic, config, exchange, &choice, consumers)?
            }
            WireKind::Verbs => Self::connect_verbs(
                &memory, geometry, traffic, config, exchange, &choice, consumers,
            )?,
        };
        debug_assert_eq!(report.qps_per_peer, qps_per_peer);
        Ok(WireLinks {
            ranks_per_node: geometry.ranks_per_node,
            sizes,
            ring_slots: config.ring_slots,
            wires,
            memory,
            report,
            failure: None,
        })
    }

    fn connect_tcp(
        memory: &[NodeMemory],
        geometry: &Geometry,
        traffic: Traffic,
        config: &WireConfig,
        exchange: &mut dyn EndpointExchange,
        choice: &WireChoice,
        consumers: impl Fn(&NodeMemory) -> Result<Vec<DoorbellConsumer>, HwError>,
    ) -> Result<(Vec<NodeWire>, WireReport), HwError> {
        let mut setups = Vec::with_capacity(memory.len());
        let mut mine = Vec::with_capacity(memory.len());
        for m in memory {
            let setup =
                TcpSetup::bind(m.node, SocketAddr::new(config.bind_host, 0), m.recv.clone())
                    .map_err(wire_error)?;
            mine.push((m.node, 0, setup.endpoint().to_bytes()));
            setups.push(setup);
        }
        let all = gather(exchange, &mine)?;
        let endpoint_of = |node: u32| -> Result<TcpEndpoint, HwError> {
            let (_, _, bytes) = all.iter().find(|(n, _, _)| *n == node).ok_or_else(|| {
                HwError::Wire(format!("no process published the TCP endpoint of node {node}"))
            })?;
            TcpEndpoint::from_bytes(bytes).map_err(wire_error)
        };
        let mut plans = Vec::with_capacity(memory.len());
        for (m, setup) in memory.iter().zip(setups) {
            let table = QpTable::new(traffic, geometry, m.node);
            let peers =
                table.peer_nodes().into_iter().map(endpoint_of).collect::<Result<Vec<_>, _>>()?;
            plans.push((setup, peers, m.send.clone(), table.per_process()));
        }
        // Each node dials the lower-numbered ones and accepts the higher: in one process the
        // nodes connect at the same time, on threads.
        let timeouts = config.tcp_timeouts;
        let connected: Vec<Result<(TcpWire, TcpReceivers), RdmaError>> = std::thread::scope(|s| {
            let handles: Vec<_> = plans
                .into_iter()
                .map(|(setup, peers, send, per)| {
                    s.spawn(move || setup.connect(&peers, send, per, timeouts))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(RdmaError::Endpoint("a TCP connect thread panicked".into()))
                    })
                })
                .collect()
        });
        let mut wires = Vec::with_capacity(memory.len());
        let mut report = None;
        for (m, c) in memory.iter().zip(connected) {
            let (wire, receivers) = c.map_err(wire_error)?;
            report.get_or_insert_with(|| wire.report(&choice.reason, geometry.qps_per_peer));
            let proxy = Proxy::spawn(
                m.node as usize,
                ProxySpec { wire, queues: consumers(m)?, stall_timeout: config.stall_timeout },
            )
            .map_err(wire_error)?;
            wires.push(NodeWire::Tcp { proxy: Some(proxy), receivers: Some(receivers) });
        }
        Ok((wires, report.expect("at least one node")))
    }

    #[cfg(feature = "rdma")]
    fn connect_verbs(
        memory: &[NodeMemory],
        geometry: &Geometry,
        traffic: Traffic,
        config: &WireConfig,
        exchange: &mut dyn EndpointExchange,
        choice: &WireChoice,
        consumers: impl Fn(&NodeMemory) -> Result<Vec<DoorbellConsumer>, HwError>,
    ) -> Result<(Vec<NodeWire>, WireReport), HwError> {
        use super::verbs::PreparedTable;
        use crate::rdma::{Nic, PeerInfo};
        let nic = Nic::open_default(config.rdma_device.as_deref()).map_err(wire_error)?;
        let mut prepared = Vec::with_capacity(memory.len());
        let mut mine = Vec::new();
        for m in memory {
            let table = QpTable::new(traffic, geometry, m.node);
            let recv_reg = nic.register_region(m.recv.clone()).map_err(wire_error)?;
            let send_reg = nic.register_region(m.send.clone()).map_err(wire_error)?;
            let table_qps = PreparedTable::create(&nic, &config.qp_settings, table, recv_reg)
                .map_err(wire_error)?;
            for peer in table.peer_nodes() {
                mine.push((m.node, peer, table_qps.info_for(peer).to_bytes()));
            }
            prepared.push((table_qps, send_reg));
        }
        let all = gather(exchange, &mine)?;
        let mut wires = Vec::with_capacity(memory.len());
        let mut report = None;
        for (m, (table_qps, send_reg)) in memory.iter().zip(prepared) {
            let infos = all
                .iter()
                .filter(|(_, to, _)| *to == m.node)
                .map(|(from, _, bytes)| {
                    PeerInfo::from_bytes(bytes).map(|info| (*from, info)).map_err(wire_error)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let wire = table_qps.connect(&infos, send_reg).map_err(wire_error)?;
            if report.is_none() {
                report =
                    Some(wire.report(&choice.reason, geometry.qps_per_peer).map_err(wire_error)?);
            }
            wires.push(wire);
        }
        // Every node's QPs are connected before any is written to (a QP still in RTR at the far
        // end would drop a write): one more exchange as a barrier.
        gather(exchange, &[])?;
        let mut out = Vec::with_capacity(wires.len());
        for (m, wire) in memory.iter().zip(wires) {
            let proxy = Proxy::spawn(
                m.node as usize,
                ProxySpec { wire, queues: consumers(m)?, stall_timeout: config.stall_timeout },
            )
            .map_err(wire_error)?;
            out.push(NodeWire::Verbs { proxy: Some(proxy) });
        }
        Ok((out, report.expect("at least one node")))
    }

    #[cfg(not(feature = "rdma"))]
    fn connect_verbs(
        _: &[NodeMemory],
        _: &Geometry,
        _: Traffic,
        _: &WireConfig,
        _: &mut dyn EndpointExchange,
        _: &WireChoice,
        _: impl Fn(&NodeMemory) -> Result<Vec<DoorbellConsumer>, HwError>,
    ) -> Result<(Vec<NodeWire>, WireReport), HwError> {
        Err(wire_error(RdmaError::NotBuilt))
    }

    /// What ran, for the result document (`backend.wire`, `backend.wire_report`).
    pub fn report(&self) -> &WireReport {
        &self.report
    }

    /// The nodes this process runs.
    pub fn owned_nodes(&self) -> Vec<u32> {
        self.memory.iter().map(|m| m.node).collect()
    }

    /// What `rank`'s kernels need (its node must be one this process runs).
    pub fn rank(&self, rank: u32) -> RankWire {
        let (node, local) = (rank / self.ranks_per_node, (rank % self.ranks_per_node) as u64);
        let m =
            self.memory.iter().find(|m| m.node == node).expect("ranks of nodes this process runs");
        let recv_area_offset = local * self.sizes.recv_area_bytes;
        let send_area_offset = local * self.sizes.send_area_bytes;
        RankWire {
            recv_area: m.recv_mem.device_addr() + recv_area_offset,
            send_area: m.send_mem.device_addr() + send_area_offset,
            ring_slots: m.rings[local as usize].device_addr(),
            ring_mask: self.ring_slots as u64 - 1,
            recv_area_offset,
            send_area_offset,
        }
    }

    /// `Err` naming the first failure once a proxy stopped early or a link broke: a kernel
    /// that timed out waiting on the wire is explained by this.
    pub fn health(&mut self) -> Result<(), HwError> {
        if let Some(f) = &self.failure {
            return Err(HwError::Wire(f.clone()));
        }
        // A proxy that stopped is the cause; the links it dropped break after it.
        let mut failure = self.wires.iter_mut().find_map(|w| match w {
            NodeWire::Tcp { proxy, .. } => finished_proxy(proxy),
            #[cfg(feature = "rdma")]
            NodeWire::Verbs { proxy } => finished_proxy(proxy),
        });
        if failure.is_none() {
            failure = self.wires.iter().find_map(|w| match w {
                NodeWire::Tcp { receivers: Some(r), .. } => r.health().err().map(|e| e.to_string()),
                _ => None,
            });
            // A failing proxy drops its wire before its thread ends: give it a moment to be
            // the one named.
            for _ in 0..20 {
                if failure.is_none() {
                    break;
                }
                if let Some(cause) = self.wires.iter_mut().find_map(|w| match w {
                    NodeWire::Tcp { proxy, .. } => finished_proxy(proxy),
                    #[cfg(feature = "rdma")]
                    NodeWire::Verbs { proxy } => finished_proxy(proxy),
                }) {
                    failure = Some(cause);
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        match failure {
            Some(f) => {
                self.failure = Some(f.clone());
                Err(HwError::Wire(f))
            }
            None => Ok(()),
        }
    }

    /// Stop the proxies once they have handed every record to the wire, close the wires in
    /// order and wait for every peer's close (bounded by the TCP close timeout). The first
    /// error met, if any.
    pub fn shutdown(&mut self) -> Result<(), HwError> {
        let mut first: Option<HwError> = None;
        let mut note = |e: HwError| {
            if first.is_none() {
                first = Some(e);
            }
        };
        for w in &mut self.wires {
            match w {
                NodeWire::Tcp { proxy, .. } => {
                    if let Some(p) = proxy.take() {
                        match p.finish() {
                            Ok((_, wire)) => {
                                if let Err(e) = wire.close() {
                                    note(wire_error(e));
                                }
                            }
                            Err(e) => note(wire_error(e)),
                        }
                    }
                }
                #[cfg(feature = "rdma")]
                NodeWire::Verbs { proxy } => {
                    if let Some(p) = proxy.take()
                        && let Err(e) = p.finish()
                    {
                        note(wire_error(e));
                    }
                }
            }
        }
        for w in &mut self.wires {
            if let NodeWire::Tcp { receivers, .. } = w
                && let Some(r) = receivers.take()
                && let Err(e) = r.finish()
            {
                note(wire_error(e));
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The error of a proxy thread that ended while it should be serving (it only ends on its own
/// when it failed).
fn finished_proxy<W: crate::wire::Wire>(proxy: &mut Option<Proxy<W>>) -> Option<String> {
    if !proxy.as_ref().is_some_and(|p| p.is_finished()) {
        return None;
    }
    match proxy.take().expect("checked").finish() {
        Ok(_) => Some("a proxy thread stopped without an error while the job ran".into()),
        Err(e) => Some(e.to_string()),
    }
}

impl Drop for WireLinks {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!("closing the internode wire: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::wire::Doorbell;

    /// Page-aligned host memory standing in for a pinned mapping (device address = host).
    struct HostMem(Region);

    impl MappedMemory for HostMem {
        fn host_ptr(&self) -> *mut u8 {
            self.0.addr()
        }
        fn device_addr(&self) -> u64 {
            self.0.addr() as u64
        }
    }

    fn host_alloc(bytes: usize) -> Result<Arc<dyn MappedMemory>, HwError> {
        Ok(Arc::new(HostMem(Region::alloc(bytes).map_err(wire_error)?)))
    }

    fn geometry() -> Geometry {
        Geometry {
            num_ranks: 4,
            ranks_per_node: 2,
            hidden: 256,
            topk: 2,
            num_experts: 8,
            tokens_per_rank: 4,
            max_tokens_per_rank: 4,
            dispatch_dtype: TokenDtype::Fp8,
            num_channels: 2,
            rdma_send_tokens: 1,
            rdma_recv_tokens: 2,
            combine_rdma_send_tokens: 1,
            combine_rdma_recv_tokens: 2,
            qps_per_peer: 3,
        }
    }

    /// What a kernel does (wire.cuh `doorbell_push`): wait for the slot, write the record's
    /// six words, release the sequence.
    fn kernel_push(w: &RankWire, ticket: &mut u64, rec: Doorbell) {
        let t = *ticket;
        *ticket += 1;
        let slot = (w.ring_slots + (t & w.ring_mask) * SLOT_BYTES as u64) as *mut u64;
        // SAFETY: inside the ring (mask); the slot's first word is its sequence, used only
        // atomically by both sides; the record words are written before the release below.
        unsafe {
            let seq = AtomicU64::from_ptr(slot);
            while seq.load(Ordering::Acquire) != t {
                std::hint::spin_loop();
            }
            let words = [
                rec.kind as u64 | (rec.qp as u64) << 32,
                rec.src_offset,
                rec.dst_offset,
                rec.len_bytes as u64,
                rec.add,
                rec.tag,
            ];
            for (i, v) in words.iter().enumerate() {
                slot.add(1 + i).write_volatile(*v);
            }
            seq.store(t + 1, Ordering::Release);
        }
    }

    fn wait_for(addr: u64, want: u64) -> u64 {
        // SAFETY: an 8-aligned counter inside a live region.
        let c = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
        for _ in 0..20_000 {
            let v = c.load(Ordering::Acquire);
            if v >= want {
                return v;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        c.load(Ordering::Acquire)
    }

    fn links(config: &WireConfig) -> WireLinks {
        let sizes = AreaSizes { recv_area_bytes: 4096, send_area_bytes: 8192 };
        WireLinks::connect(
            &host_alloc,
            &[0, 1],
            &geometry(),
            Traffic::Normal,
            sizes,
            config,
            &mut SingleProcess,
        )
        .unwrap()
    }

    /// Two nodes in one process over loopback TCP: records published the kernels' way into
    /// each rank's ring reach the rail peer's receive area, data before the flag.
    #[test]
    fn two_nodes_in_one_process_move_records_over_tcp() {
        let config = WireConfig::new(
            WireRequest::Tcp,
            QpSettings { qps_per_peer: 3, ..QpSettings::default() },
            Duration::from_secs(20),
        );
        let mut links = links(&config);
        assert_eq!(links.owned_nodes(), vec![0, 1]);
        let report = links.report().clone();
        assert_eq!((report.wire, report.peers, report.qps_per_peer), (WireKind::Tcp, 1, 3));
        assert_eq!(report.qps_total, 2 * 3, "two local ranks on one rail each, 3 QPs");
        let g = geometry();
        // Rank 1 (node 0, local 1) writes 100 bytes to rank 3 (node 1, local 1) on QP 2.
        let (w1, w3) = (links.rank(1), links.rank(3));
        assert_eq!((w1.recv_area_offset, w1.send_area_offset), (4096, 8192));
        let data: Vec<u8> = (0..100u8).collect();
        // SAFETY: inside rank 1's send area.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), w1.send_area as *mut u8, 100) };
        let qp = QpTable::new(Traffic::Normal, &g, 0).index(1, 1, 1, 2);
        let mut ticket = 0;
        kernel_push(&w1, &mut ticket, Doorbell::write(qp, w1.send_area_offset, 4096 + 256, 100, 1));
        kernel_push(&w1, &mut ticket, Doorbell::flag(qp, 4096 + 8, 5, 2));
        assert_eq!(wait_for(w3.recv_area + 8, 5), 5, "the flag arrived");
        let mut got = vec![0u8; 100];
        // SAFETY: inside rank 3's receive area, written before the flag.
        unsafe {
            std::ptr::copy_nonoverlapping((w3.recv_area + 256) as *const u8, got.as_mut_ptr(), 100)
        };
        assert_eq!(got, data);
        // And back, from rank 2 (node 1, local 0) to rank 0, many times around its ring.
        let (w0, w2) = (links.rank(0), links.rank(2));
        let back = QpTable::new(Traffic::Normal, &g, 1).index(0, 0, 0, 0);
        let mut ticket = 0;
        for i in 0..3 * config.ring_slots as u64 {
            kernel_push(&w2, &mut ticket, Doorbell::flag(back, 16, 1, i));
        }
        assert_eq!(wait_for(w0.recv_area + 16, 3 * config.ring_slots as u64), 3 * 4096);
        links.health().unwrap();
        links.shutdown().unwrap();
    }

    /// A record outside the peer's region stops the proxy; `health` names it.
    #[test]
    fn a_refused_record_is_reported_by_health() {
        let mut config =
            WireConfig::new(WireRequest::Tcp, QpSettings::default(), Duration::from_secs(20));
        config.ring_slots = 16;
        let mut links = links(&config);
        let w0 = links.rank(0);
        let mut ticket = 0;
        kernel_push(&w0, &mut ticket, Doorbell::flag(0, 3 * 4096, 1, 77));
        let mut health = Ok(());
        for _ in 0..2000 {
            health = links.health();
            if health.is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let e = health.unwrap_err().to_string();
        assert!(e.contains("outside") && e.contains("tag 77"), "{e}");
        assert!(links.health().is_err(), "the failure is kept");
        drop(links);
    }

    /// A process runs whole nodes: a block of ranks that splits a node is refused with the
    /// counts and the flag that fixes it.
    #[test]
    fn owned_nodes_are_whole_nodes() {
        let g = geometry();
        assert_eq!(owned_nodes(&g, &[0, 1, 2, 3]).unwrap(), vec![0, 1]);
        assert_eq!(owned_nodes(&g, &[2, 3]).unwrap(), vec![1]);
        let e = owned_nodes(&g, &[1, 2, 3]).unwrap_err().to_string();
        assert!(e.contains("1 of node 0's 2 ranks") && e.contains("--ranks-per-process 2"), "{e}");
    }

    /// Two processes' exchange, as threads: each publishes its bytes and reads both once both
    /// are there.
    struct Pair {
        me: usize,
        slots: Arc<std::sync::Mutex<[Option<Vec<u8>>; 2]>>,
        barrier: Arc<std::sync::Barrier>,
    }

    impl EndpointExchange for Pair {
        fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, HwError> {
            self.slots.lock().unwrap()[self.me] = Some(bytes.to_vec());
            self.barrier.wait();
            let all = self.slots.lock().unwrap().iter().map(|s| s.clone().unwrap()).collect();
            // Nobody overwrites a slot before both have read it.
            self.barrier.wait();
            Ok(all)
        }
    }

    /// One node per process (threads standing in for the processes): each connects only its
    /// own node, the endpoints travel through the exchange, and a record from node 0's rank
    /// reaches its rail peer on node 1.
    #[test]
    fn one_node_per_process_connects_through_the_exchange() {
        let config = WireConfig::new(
            WireRequest::Tcp,
            QpSettings { qps_per_peer: 3, ..QpSettings::default() },
            Duration::from_secs(20),
        );
        let sizes = AreaSizes { recv_area_bytes: 4096, send_area_bytes: 8192 };
        let slots = Arc::new(std::sync::Mutex::new([None, None]));
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let mut both: Vec<WireLinks> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2u32)
                .map(|node| {
                    let mut ex =
                        Pair { me: node as usize, slots: slots.clone(), barrier: barrier.clone() };
                    let config = &config;
                    s.spawn(move || {
                        WireLinks::connect(
                            &host_alloc,
                            &[node],
                            &geometry(),
                            Traffic::Normal,
                            sizes,
                            config,
                            &mut ex,
                        )
                        .unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!((both[0].owned_nodes(), both[1].owned_nodes()), (vec![0], vec![1]));
        let (w1, w3) = (both[0].rank(1), both[1].rank(3));
        let qp = QpTable::new(Traffic::Normal, &geometry(), 0).index(1, 1, 1, 2);
        let mut ticket = 0;
        kernel_push(&w1, &mut ticket, Doorbell::flag(qp, 4096 + 8, 7, 1));
        assert_eq!(wait_for(w3.recv_area + 8, 7), 7, "the flag crossed between the processes");
        for links in &mut both {
            links.health().unwrap();
        }
        // Processes shut down at the same time (each waits for the other to close).
        std::thread::scope(|s| {
            for mut links in both {
                s.spawn(move || links.shutdown().unwrap());
            }
        });
    }

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

    #[test]
    fn exchange_records_round_trip_and_refuse_garbage() {
        let records = vec![(0, 1, b"abc".to_vec()), (1, 0, Vec::new()), (7, 9, vec![1; 300])];
        assert_eq!(unpack(&pack(&records)).unwrap(), records);
        assert_eq!(unpack(&pack(&[])).unwrap(), Vec::new());
        let mut bytes = pack(&records);
        bytes.pop();
        assert!(unpack(&bytes).unwrap_err().to_string().contains("unreadable"));
        bytes.extend_from_slice(&[0, 0]);
        assert!(unpack(&bytes).is_err());
        struct Two;
        impl EndpointExchange for Two {
            fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, HwError> {
                Ok(vec![bytes.to_vec(), pack(&[(5, 6, b"peer".to_vec())])])
            }
        }
        let all = gather(&mut Two, &records[..1]).unwrap();
        assert_eq!(all, vec![(0, 1, b"abc".to_vec()), (5, 6, b"peer".to_vec())]);
        assert_eq!(gather(&mut SingleProcess, &records).unwrap(), records);
    }
}
