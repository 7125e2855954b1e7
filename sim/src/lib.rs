//! eptwin simulator: a deterministic, packet-level discrete-event model of NVLink/NVSwitch,
//! PCIe, NICs with queue pairs, InfiniBand (VLs, credits, arbitration) or RoCE fabrics, and
//! DeepEP's dispatch/combine algorithms on top, behind the engine's `Transport` trait.
//!
//! Architecture Invariant: no wall clock, no OS randomness, no hash-map iteration; time is
//! integer picoseconds and events pop in (time, sequence) order, so the same plan gives
//! byte-identical samples on every machine.

pub mod core;
pub mod deepep;
pub mod elastic;
pub mod gpu;
pub mod hwkernels;
pub mod jobs;
pub mod net;
pub mod params;
pub mod programs;
pub mod trace;
pub mod traffic;

use std::collections::BTreeMap;

use eptwin_engine::api::{
    BackendKind, Capabilities, OpOutcome, OpSample, OpSpec, Transport, TransportError,
};
use eptwin_engine::api::{EpMode, JobKind, LaunchKey, OpKind, Plan};
use eptwin_engine::api::{GpuId, JobId};

use crate::core::Core;
use crate::core::time::Rate;
use crate::core::world::{Program, RunError, World};
use crate::gpu::Gpus;
use crate::jobs::JobRt;
use crate::net::Net;
use crate::params::Params;
use crate::programs::Meta;

/// The result's measurement that counts, per `<job>.<op>`, the runs that reused the op's first
/// run instead of simulating it again (docs/results.md).
pub const REUSED_KEY: &str = "sim.reused_runs";

/// The model's version: bump when a change alters simulated results.
pub const MODEL_VERSION: &str = "1";

/// Options of a simulation run.
#[derive(Debug, Clone, Default)]
pub struct SimOptions {
    /// Record a Chrome trace-event / Perfetto trace of the run.
    pub trace: bool,
}

/// Which event queue a simulation uses (results are identical; benchmarks compare speed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueChoice {
    #[default]
    Calendar,
    Radix,
    BinaryHeap,
}

/// The simulator as a [`Transport`].
pub struct Simulator {
    options: SimOptions,
    /// Shared with each op's run: an op reads the plan without copying it (its routing
    /// tables are tens of MB at EP2048).
    plan: Option<std::sync::Arc<Plan>>,
    /// The first run of each (job, op) where [`Simulator::reuses_first_run`] allows it.
    cache: BTreeMap<(u32, OpKind), OpSample>,
    /// Per `<job name>.<op>`: the runs (warmup included) that took the first run's sample
    /// (the result's `measurements["sim.reused_runs"]`).
    reused: BTreeMap<String, u64>,
    use_cache: bool,
    /// IBGDA messages may complete when they execute (`Core::early_acks`).
    early_acks: bool,
    /// Per (job, op): `Program::rank_ends` of its last run; per job: the op executed last.
    /// An op launched back to back after the previous one adds the ranks' lag
    /// (`core::world::follow_lag_ns`).
    rank_ends: BTreeMap<(u32, OpKind), Vec<crate::core::time::Time>>,
    prev_op: BTreeMap<u32, OpKind>,
    trace: Option<trace::Trace>,
    /// Where the next traced op starts in the trace.
    trace_end: crate::core::time::Time,
    queue: QueueChoice,
    /// The large record arrays of the last op's machine, emptied, for the next one: its
    /// pages are already backed (a fresh machine's first writes to them would have the
    /// kernel zero them again). Contents never carry over, so results cannot depend on it.
    spare: Option<Spare>,
    /// Events handled over all runs (benchmarks report events/s), and per kind.
    pub events: u64,
    pub events_by_kind: [u64; 8],
    /// With faults: the run's simulated time so far (each op's machine starts its clock at 0;
    /// a fault's time is from the run's start) and shrink mode's masks, which live in the
    /// ranks' buffers from one op to the next.
    clock: crate::core::time::Time,
    masks: Vec<Vec<bool>>,
}

/// See [`Simulator::spare`].
struct Spare {
    pkts: crate::core::slab::Slab<crate::net::Pkt>,
    msgs: crate::net::nic::Msgs,
    qps: Vec<crate::net::nic::Qp>,
    qp_tx: Vec<crate::net::nic::QpTx>,
    qp_labels: Vec<crate::net::nic::QpLabel>,
}

impl Simulator {
    pub fn new(options: SimOptions) -> Self {
        Simulator {
            options,
            plan: None,
            cache: BTreeMap::new(),
            reused: BTreeMap::new(),
            use_cache: true,
            early_acks: true,
            rank_ends: BTreeMap::new(),
            prev_op: BTreeMap::new(),
            trace: None,
            trace_end: 0,
            queue: QueueChoice::Calendar,
            spare: None,
            events: 0,
            events_by_kind: [0; 8],
            clock: 0,
            masks: Vec::new(),
        }
    }

    /// The back-to-back lag `op` of `job` adds after `prev`, the job's op before it.
    fn follow_lag_ns(&self, job: u32, prev: Option<OpKind>, op: OpKind) -> f64 {
        match (prev.and_then(|p| self.rank_ends.get(&(job, p))), self.rank_ends.get(&(job, op))) {
            (Some(prev_ends), Some(ends)) => crate::core::world::follow_lag_ns(prev_ends, ends),
            _ => 0.0,
        }
    }

    /// Run on the binary-heap baseline queue (for benchmarks).
    pub fn with_queue(mut self, queue: QueueChoice) -> Self {
        self.queue = queue;
        self
    }

    /// Whether the iterations of `op` of `job` may take its first run's sample instead of
    /// running again: the one place that decides it. A single op runs on a fresh, idle machine
    /// ([`Simulator::world`]), so its run is a pure function of the plan, the job and the op
    /// as long as nothing in the plan differs between iterations: the routing is the job's
    /// own for every iteration, and background traffic only runs in a concurrent session
    /// (never cached). What differs per iteration — injected faults, per-launch stragglers —
    /// must make this false, so that every iteration runs. The back-to-back lag of a
    /// low-latency op (`follow_lag_ns`) is added per iteration from the previous op's rank
    /// ends, which are the same in every iteration, so reusing the first run gives the same
    /// per-iteration numbers as running each (`tests/it/scenarios.rs` checks it).
    fn reuses_first_run(&self, plan: &Plan, _job: JobId, _op: OpKind) -> bool {
        self.use_cache && plan.faults.is_empty()
    }

    /// Simulate every iteration instead of reusing the (identical) first run of an op.
    pub fn without_cache(mut self) -> Self {
        self.use_cache = false;
        self
    }

    /// Complete every IBGDA message when its ACK would arrive, as an event (the reference
    /// the early completions of `Core::early_acks` are tested against).
    pub fn without_early_acks(mut self) -> Self {
        self.early_acks = false;
        self
    }

    /// The trace of the last run (Chrome trace-event JSON), when `SimOptions::trace` was set.
    pub fn trace_json(&self) -> Option<String> {
        self.trace.as_ref().map(|t| t.to_json())
    }

    /// A machine for `plan`, traced when asked and nothing has been traced for this op yet:
    /// each traced op is laid out after the previous one in the trace.
    fn world(&mut self, plan: &Plan, trace: bool) -> World {
        let mut world = build_world(plan, trace);
        if let Some(sp) = self.spare.take() {
            let net = &mut world.core.net;
            // Only as large as the fresh machine's reservations (the same plan's).
            if sp.msgs.reserved() >= net.msgs.reserved()
                && sp.pkts.reserved() >= net.pkts.reserved()
                && sp.qps.capacity() >= net.qps.capacity()
            {
                net.pkts = sp.pkts;
                net.msgs = sp.msgs;
                net.qps = sp.qps;
                net.qp_tx = sp.qp_tx;
                net.qp_labels = sp.qp_labels;
            }
        }
        match self.queue {
            QueueChoice::Calendar => {}
            QueueChoice::Radix => world.core.use_radix_heap(),
            QueueChoice::BinaryHeap => world.core.use_binary_heap(),
        }
        if let Some(tr) = world.core.trace.as_mut() {
            tr.offset = self.trace_end;
        }
        if !plan.faults.is_empty() {
            let masks = std::mem::take(&mut self.masks);
            let faults = crate::core::faults::FaultRt::new(plan, self.clock, masks);
            if faults.loss_threshold != 0 || !faults.nics_down.is_empty() {
                let loss = crate::net::nic::Loss::new(plan.faults.seed, self.clock);
                world.core.net.loss = Some(Box::new(loss));
            }
            world.core.faults = faults;
        }
        world
    }

    /// Run one op (`OpSpec::Op`) on a fresh machine; `early_acks`: IBGDA messages complete
    /// when they execute where that cannot change a result (`Core::early_acks`).
    fn run_single(
        &mut self,
        plan: &Plan,
        spec: &OpSpec,
        prev: Option<OpKind>,
        early_acks: bool,
    ) -> (World, Result<(), RunError>) {
        let OpSpec::Op { job, op, iteration, warmup } = *spec else { unreachable!("a single op") };
        // Trace the first run of each op (later iterations reuse it).
        let mut world = self.world(plan, self.options.trace);
        world.next_launch = Some(launch_key(plan, job, op, iteration, warmup));
        let faults = !plan.faults.is_empty();
        if faults && let Some(ends) = prev.and_then(|p| self.rank_ends.get(&(job.0, p))) {
            // The world charges the back-to-back lag to the ranks that launch on time.
            world.prev_ends = ends.clone();
        }
        world.core.early_acks =
            early_acks && self.early_acks && !faults && world.core.trace.is_none();
        let mut factory = |core: &mut Core, j: JobId, o: OpKind, it: u32, w: bool| {
            make_program(plan, core, j, o, it, w)
        };
        let r = world.run_one(&mut factory, job, op, iteration, warmup);
        (world, r)
    }

    /// After a run with faults: the run's clock moves on by the machine's time, and the masks
    /// stay for the next op.
    fn advance(&mut self, world: &mut World) {
        if world.core.faults.faults.is_empty() {
            return;
        }
        self.clock += world.core.now;
        self.masks = std::mem::take(&mut world.core.faults.masks);
    }

    /// Keep the finished machine's record arrays, emptied, for the next one.
    fn recycle(&mut self, world: &mut World) {
        let net = &mut world.core.net;
        let mut sp = Spare {
            pkts: std::mem::take(&mut net.pkts),
            msgs: std::mem::take(&mut net.msgs),
            qps: std::mem::take(&mut net.qps),
            qp_tx: std::mem::take(&mut net.qp_tx),
            qp_labels: std::mem::take(&mut net.qp_labels),
        };
        sp.pkts.clear();
        sp.msgs.clear();
        sp.qps.clear();
        sp.qp_tx.clear();
        sp.qp_labels.clear();
        self.spare = Some(sp);
    }

    /// Keep a traced world's events.
    fn keep_trace(&mut self, world: &mut World) {
        let Some(tr) = world.core.trace.take() else { return };
        self.trace_end = tr.offset + world.core.now + 10 * crate::core::time::PS_PER_US;
        match self.trace.as_mut() {
            None => self.trace = Some(tr),
            Some(all) => all.append(tr),
        }
    }

    fn count(&mut self, world: &World) {
        self.events += world.core.events;
        for (a, b) in self.events_by_kind.iter_mut().zip(world.core.events_by_kind) {
            *a += b;
        }
    }

    fn plan(&self) -> Result<&std::sync::Arc<Plan>, TransportError> {
        self.plan.as_ref().ok_or_else(|| TransportError::Backend {
            context: "simulator".into(),
            message: "execute before prepare".into(),
        })
    }
}

/// A fresh machine (idle fabric, empty queues) for `plan`.
pub fn build_world(plan: &Plan, trace: bool) -> World {
    let params = Params::new(plan);
    let net = Net::new(plan, &params);
    let gpus = Gpus::new(
        plan.topology.num_gpus(),
        params.nvl_rate,
        params.pcie_rate,
        params.hbm_copy_rate,
    );
    let mut core = Core::new(params, net, gpus, trace);
    // A degraded node's NVLink ports run at the share of their rate it keeps.
    for (g, gpu) in core.gpus.gpus.iter_mut().enumerate() {
        let fraction = plan.faults.nvlink_fraction(plan.topology.node_of_gpu(GpuId(g as u32)));
        if fraction < 1.0 {
            let rate = Rate::from_gbps(gpu.nvl_tx.rate.gbps() * fraction);
            gpu.nvl_tx.rate = rate;
            gpu.nvl_rx.rate = rate;
        }
    }
    core.jobs = (0..plan.jobs.len()).map(|j| JobRt::new(plan, j)).collect();
    // Every QP the jobs can create (rank pairs × QPs per pair), reserved up front.
    let qps = core.jobs.iter().map(|j| j.max_qps()).sum::<usize>().min(1 << 20);
    core.net.qps = crate::core::slab::with_capacity_huge(qps);
    core.net.qp_tx = crate::core::slab::with_capacity_huge(qps);
    core.net.qp_labels.reserve_exact(qps);
    let lanes = core.jobs.iter().fold(0, |m, j| m | 1 << j.lane);
    core.net.set_job_lanes(lanes);
    World::new(core)
}

/// The program for one op of one job.
pub fn make_program(
    plan: &Plan,
    core: &mut Core,
    job: JobId,
    op: OpKind,
    iteration: u32,
    warmup: bool,
) -> Box<dyn Program> {
    match &plan.job(job).kind {
        JobKind::Traffic(_) => Box::new(traffic::TrafficProgram::new(plan, job, iteration, warmup)),
        JobKind::DeepEp(_) => deepep_program(plan, core, Meta { job, op, iteration, warmup }),
    }
}

/// The program for one op of a DeepEP job: DeepEP's kernels, or, where the job's ranks share
/// one GPU, the hardware backend's one-GPU kernels (DeepEP has none).
fn deepep_program(plan: &Plan, core: &mut Core, meta: Meta) -> Box<dyn Program> {
    let d = programs::deepep_job(plan, meta.job);
    if d.elastic.is_some() {
        return Box::new(elastic::ElasticProgram::new(plan, core, meta));
    }
    let mode = d.mode;
    if hwkernels::applies(core, &meta) {
        match mode {
            // The one-GPU kernels store every message on the GPU. Where the plan's rule sends
            // messages through RDMA instead (P2P off), DeepEP's low-latency model carries them
            // through the NIC, as it does for ranks stacked on one GPU as several nodes
            // (docs/simulator.md, "One GPU").
            EpMode::LowLatency if deepep::ll_uses_rdma(plan, meta.job) => {}
            EpMode::LowLatency => {
                return Box::new(hwkernels::OneGpuLlProgram::new(plan, core, meta));
            }
            // At most 8 ranks on a GPU with thread-block clusters: the rings in shared memory.
            EpMode::Intranode if hwkernels::cluster::applies(plan, core, &meta) => {
                return Box::new(hwkernels::cluster::ClusterProgram::new(plan, core, meta));
            }
            EpMode::Intranode => return Box::new(hwkernels::NormalProgram::new(plan, core, meta)),
            EpMode::Internode => {}
        }
    }
    match mode {
        EpMode::LowLatency => Box::new(deepep::ll::LowLatencyProgram::new(plan, core, meta)),
        EpMode::Intranode => Box::new(deepep::intranode::IntranodeProgram::new(plan, core, meta)),
        EpMode::Internode => Box::new(deepep::internode::InternodeProgram::new(plan, core, meta)),
    }
}

/// Which launch of its job an op is: rounds count from the run's start, warmup rounds first.
fn launch_key(plan: &Plan, job: JobId, op: OpKind, iteration: u32, warmup: bool) -> LaunchKey {
    let j = plan.job(job);
    let round = if warmup { iteration as u64 } else { j.warmup as u64 + iteration as u64 };
    let op_index = j.ops.iter().position(|&o| o == op).unwrap_or(0) as u32;
    LaunchKey { job: job.0, round, op_index }
}

fn to_transport_error(e: RunError) -> TransportError {
    match e {
        RunError::Deadlock(s) | RunError::Timeout(s) => TransportError::Timeout(s),
        RunError::Invariant(s) => TransportError::Invariant(s),
    }
}

/// Finish a run: starvation reports fail every op of the run.
fn collect(world: &mut World) -> Vec<OpSample> {
    let mut samples = std::mem::take(&mut world.samples);
    if !world.core.starvations.is_empty() {
        for s in &mut samples {
            s.failures.extend(world.core.starvations.iter().cloned());
        }
    }
    samples
}

impl Transport for Simulator {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: BackendKind::Sim,
            identity: BTreeMap::from([
                ("version".into(), serde_json::json!(eptwin_engine::VERSION)),
                ("model".into(), serde_json::json!(MODEL_VERSION)),
            ]),
            unavailable: None,
            modes: vec![EpMode::Intranode, EpMode::Internode, EpMode::LowLatency],
            elastic: true,
            traffic: true,
            concurrent_jobs: true,
            max_ranks: None,
            rdma: true,
            rdma_reason: None,
        }
    }

    fn prepare(&mut self, plan: &Plan) -> Result<(), TransportError> {
        self.plan = Some(std::sync::Arc::new(plan.clone()));
        self.cache.clear();
        self.reused.clear();
        self.rank_ends.clear();
        self.prev_op.clear();
        self.spare = None;
        self.trace = None;
        self.trace_end = 0;
        self.clock = 0;
        self.masks = Vec::new();
        Ok(())
    }

    fn execute(&mut self, op: &OpSpec) -> Result<OpOutcome, TransportError> {
        let plan = self.plan()?.clone();
        let jobs = match op {
            OpSpec::Op { job, .. } => vec![*job],
            OpSpec::Concurrent { streams } => streams.iter().map(|s| s.job).collect(),
        };
        if let Some(job) = jobs.iter().find(|j| j.index() >= plan.jobs.len()) {
            return Err(TransportError::Backend {
                context: format!("job {}", job.0),
                message: format!("the plan has {} job(s)", plan.jobs.len()),
            });
        }
        let spec = op;
        match op {
            OpSpec::Op { job, op, iteration, warmup } => {
                let prev = self.prev_op.insert(job.0, *op);
                if self.reuses_first_run(&plan, *job, *op)
                    && let Some(s) = self.cache.get(&(job.0, *op))
                {
                    let mut s = s.clone();
                    s.iteration = *iteration;
                    s.warmup = *warmup;
                    s.latency_ns += self.follow_lag_ns(job.0, prev, *op);
                    let name = format!("{}.{op}", plan.job(*job).name);
                    *self.reused.entry(name).or_insert(0) += 1;
                    // The whole tally each time: the run loop keeps the last one.
                    let measurements =
                        BTreeMap::from([(REUSED_KEY.to_string(), serde_json::json!(self.reused))]);
                    return Ok(OpOutcome { samples: vec![s], measurements });
                }
                let faults = !plan.faults.is_empty();
                let (mut world, r) = self.run_single(&plan, spec, prev, true);
                let (mut world, r) = if world.core.early_acks_overrun {
                    // Early completions could have moved the depth check: run it again.
                    self.recycle(&mut world);
                    self.run_single(&plan, spec, prev, false)
                } else {
                    (world, r)
                };
                self.count(&world);
                self.keep_trace(&mut world);
                r.map_err(to_transport_error)?;
                self.advance(&mut world);
                let ends = std::mem::take(&mut world.rank_ends);
                let measured = collect(&mut world);
                self.recycle(&mut world);
                for (s, e) in measured.iter().zip(ends) {
                    self.cache.insert((job.0, s.op), s.clone());
                    self.rank_ends.insert((job.0, s.op), e);
                }
                let mut s = measured.iter().find(|s| s.op == *op).cloned().ok_or_else(|| {
                    TransportError::Backend {
                        context: format!("job {}", job.0),
                        message: format!("the simulation produced no {op} sample"),
                    }
                })?;
                s.iteration = *iteration;
                s.warmup = *warmup;
                if !faults {
                    s.latency_ns += self.follow_lag_ns(job.0, prev, *op);
                }
                Ok(OpOutcome { samples: vec![s], measurements: BTreeMap::new() })
            }
            OpSpec::Concurrent { streams } => {
                let mut world = self.world(&plan, self.options.trace);
                let mut factory = |core: &mut Core, j: JobId, o: OpKind, it: u32, w: bool| {
                    make_program(&plan, core, j, o, it, w)
                };
                let streams: Vec<_> = streams
                    .iter()
                    .map(|s| (s.job, s.ops.clone(), s.warmup, s.iterations))
                    .collect();
                let r = world.run_streams(&mut factory, &streams);
                self.count(&world);
                self.keep_trace(&mut world);
                r.map_err(to_transport_error)?;
                self.advance(&mut world);
                let samples = collect(&mut world);
                self.recycle(&mut world);
                Ok(OpOutcome { samples, measurements: BTreeMap::new() })
            }
        }
    }
}
