//! eptwin hardware backend: real CUDA kernels (NVRTC through cudarc), NVML topology, ibverbs.
//!
//! `HwTransport` implements the engine's `Transport`: it places the job's ranks on the GPUs
//! (`placement`), compiles the embedded kernels for the device (`compile`), measures the copy
//! ceilings and the NCCL all-to-all baseline in the same run (`probes`, `nccl`), then times
//! each dispatch/combine with CUDA events after an L2 flush and checks the received tokens and
//! the combined sums the way DeepEP's tests do (`intranode`, `low_latency`). One job's ranks
//! may also run as several processes, each with its own block of ranks, sharing buffers through
//! CUDA IPC (`processes`, docs/cluster.md).
//!
//! Architecture Invariant: every GPU library is loaded at run time; a missing GPU, driver,
//! NVRTC or NCCL makes `capabilities()` report the plan as waived with one line, never a panic.
//!
//! Architecture Invariant: every spin-wait in a kernel is bounded; a wait that gives up records
//! who waited for what, and the op fails with that line (`error::ErrorRecord::describe`).

pub mod cluster_probe;
pub mod compile;
pub mod cuda;
pub mod data;
pub mod error;
pub mod exec;
pub mod group;
pub mod internode;
pub mod intranode;
pub mod kernel_defines;
pub mod low_latency;
pub mod nccl;
pub mod nvml;
pub mod options;
pub mod placement;
pub mod probes;
pub mod processes;
pub mod rdma;
pub mod wire;

use std::collections::BTreeMap;

use eptwin_engine::Plan;
use eptwin_engine::deepep::config::EpMode;
use eptwin_engine::ids::JobId;
use eptwin_engine::plan::{DeepEpJob, JobKind};
use eptwin_engine::plan::{Dtype, OpKind};
use eptwin_engine::transport::{
    BackendKind, Capabilities, OpOutcome, OpSpec, Transport, TransportError,
};
use eptwin_kernels::ModuleId;
use serde_json::{Value, json};

use crate::cuda::Gpu;
use crate::error::HwError;
use crate::exec::{Device, Devices};
use crate::group::Launcher;
use crate::intranode::{NormalJob, NormalLaunch};
use crate::low_latency::{LlJob, LlLaunch};
use crate::placement::{GpuInventory, Placement};
use crate::probes::round3;
use crate::processes::{PREPARE_TIMEOUT, ProcessBarrier, ProcessOp, Processes};

pub use crate::options::{HwOptions, RingsWanted};

/// What was found on this machine.
struct Environment {
    gpus: Vec<Gpu>,
    driver_api: i32,
    nvrtc: (i32, i32),
    nccl: i32,
    nvml_driver: Option<String>,
}

enum Runtime {
    Normal(NormalJob),
    LowLatency(LlJob),
}

struct State {
    /// First: dropping it stops the wire's threads and frees the buffers while the GPUs'
    /// contexts (in `devs`) are still alive.
    runtime: Runtime,
    devs: Devices,
    placement: Placement,
    job: JobId,
    /// Measured (non-warmup) latencies per op.
    latencies_ns: BTreeMap<OpKind, Vec<f64>>,
    /// Bytes DeepEP's tests count, summed over ranks, per op.
    logical_bytes: BTreeMap<OpKind, f64>,
    transported_bytes: BTreeMap<OpKind, u64>,
    nccl_us: BTreeMap<OpKind, f64>,
    memcpy_gbps: Option<f64>,
    /// (hidden, dispatch dtype): the NCCL baseline's row sizes.
    row_shape: (u32, Dtype),
    /// This process's first job rank (named in the process barrier's timeout record).
    first_rank: u32,
}

pub struct HwTransport {
    options: HwOptions,
    env: Result<Environment, String>,
    /// The machine's identity, taken when it was detected (prepare takes the GPUs it uses out
    /// of the environment).
    identity: BTreeMap<String, Value>,
    state: Option<State>,
    measurements: BTreeMap<String, Value>,
    /// The other processes of a multi-process run; `None`: this process runs every rank.
    procs: Option<Processes>,
    launcher: Launcher,
    hosts: Vec<String>,
}

/// How long processes wait for each other to find their GPUs.
const DETECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

impl HwTransport {
    /// Every rank in this process, started without a launcher.
    pub fn new(options: HwOptions) -> Self {
        HwTransport::single(options, Launcher::Single)
    }

    /// Every rank in this process, started by `launcher` (a launch of one process).
    pub fn single(options: HwOptions, launcher: Launcher) -> Self {
        let env = detect();
        HwTransport {
            options,
            identity: env.as_ref().map(identity).unwrap_or_default(),
            env,
            state: None,
            measurements: BTreeMap::new(),
            procs: None,
            launcher,
            hosts: vec![group::system_hostname()],
        }
    }

    /// This process's block of ranks in a multi-process run. Collective: every process finds
    /// its GPUs and all agree (a process without a usable GPU waives the run for all, with its
    /// reason). Fails when another process fails or leaves.
    pub fn in_processes(options: HwOptions, mut procs: Processes) -> Result<Self, HwError> {
        let env = detect();
        let local = env.as_ref().map(|_| ()).map_err(|r| HwError::Unavailable(r.clone()));
        let env = match procs.agree_on("GPU detection", local, DETECT_TIMEOUT) {
            Ok(()) => env,
            Err(HwError::Unsupported(reason)) => Err(reason),
            Err(other) => return Err(other),
        };
        Ok(HwTransport {
            options,
            identity: env.as_ref().map(identity).unwrap_or_default(),
            env,
            state: None,
            measurements: BTreeMap::new(),
            launcher: procs.launcher(),
            hosts: procs.hosts(),
            procs: Some(procs),
        })
    }

    /// Ends the run's process group after a last barrier (nothing for a single process);
    /// every process calls it once its run loop is done.
    pub fn finish(mut self, timeout: std::time::Duration) -> Result<(), group::GroupError> {
        let Some(procs) = self.procs.take() else { return Ok(()) };
        let outcome = procs.finish(timeout);
        if outcome.is_err() {
            // The run failed in another process: a kernel here may still spin on a peer that
            // is gone, and freeing the buffers would wait for it. The process is about to end
            // and the driver reclaims everything.
            std::mem::forget(self.state.take());
        }
        outcome
    }

    /// The process-group keys of `backend` (docs/results.md): processes, launcher, hosts and
    /// how internode bytes moved: `wire` is "none" until a job's bytes crossed nodes, then the
    /// wire, with what it was set up with in `wire_report`.
    fn process_identity(&self) -> Vec<(String, Value)> {
        let report = self.state.as_ref().and_then(State::wire_report);
        let mut keys = vec![
            ("processes".into(), json!(self.hosts.len())),
            ("launcher".into(), json!(self.launcher.as_str())),
            ("hosts".into(), json!(self.hosts)),
            ("wire".into(), json!(report.map_or("none", |r| r.wire.as_str()))),
        ];
        if let Some(r) = report {
            keys.push(("wire_report".into(), json!(r)));
        }
        keys
    }

    /// The job's one op on this process's ranks, and on the host-checked iteration their
    /// output digests.
    fn run_op(
        state: &mut State,
        job: JobId,
        op: OpKind,
        iteration: u32,
        warmup: bool,
    ) -> Result<ProcessOp, HwError> {
        let gpu_of_rank = state.placement.gpu_of_rank.clone();
        let devs = &mut state.devs;
        let sample = match (&mut state.runtime, op) {
            (Runtime::Normal(j), OpKind::Dispatch) => {
                j.dispatch(devs, &gpu_of_rank, iteration, warmup, job)
            }
            (Runtime::Normal(j), OpKind::Combine) => {
                j.combine(devs, &gpu_of_rank, iteration, warmup, job)
            }
            (Runtime::LowLatency(j), OpKind::Dispatch) => {
                j.dispatch(devs, &gpu_of_rank, iteration, warmup, job)
            }
            (Runtime::LowLatency(j), OpKind::Combine) => {
                j.combine(devs, &gpu_of_rank, iteration, warmup, job)
            }
            (_, other) => {
                return Err(HwError::Unsupported(format!(
                    "op {other} is not a DeepEP dispatch or combine"
                )));
            }
        }?;
        let rank_digests = match &mut state.runtime {
            Runtime::Normal(j) => j.take_rank_digests(),
            Runtime::LowLatency(j) => j.take_rank_digests(),
        };
        Ok(ProcessOp { sample, rank_digests: rank_digests.unwrap_or_default() })
    }
}

fn detect() -> Result<Environment, String> {
    let count = cuda::init_driver()?;
    let driver_api = cuda::driver_api_version()?;
    let nvrtc = compile::nvrtc_version()?;
    let nccl = nccl::nccl_version()?;
    let mut gpus = Vec::with_capacity(count);
    for ordinal in 0..count {
        let gpu = cuda::guarded("opening the GPU", || Gpu::open(ordinal))?
            .map_err(|e| format!("GPU {ordinal} cannot be used: {e}"))?;
        gpus.push(gpu);
    }
    let nvml_driver = nvml::RealNvml::init().ok().and_then(|n| {
        use nvml::NvmlApi;
        n.driver_version().ok()
    });
    Ok(Environment { gpus, driver_api, nvrtc, nccl, nvml_driver })
}

fn identity(env: &Environment) -> BTreeMap<String, Value> {
    let names: Vec<&str> = env.gpus.iter().map(|g| g.name.as_str()).collect();
    let mut summary = String::new();
    let mut i = 0;
    while i < names.len() {
        let j = names[i..].iter().take_while(|n| **n == names[i]).count();
        if !summary.is_empty() {
            summary.push_str(", ");
        }
        summary.push_str(&format!("{j} x {}", names[i]));
        i += j;
    }
    let g0 = &env.gpus[0];
    BTreeMap::from([
        ("gpus".to_string(), json!(summary)),
        ("gpu_names".to_string(), json!(names)),
        ("gpu_count".to_string(), json!(env.gpus.len())),
        ("sm_count".to_string(), json!(g0.sm_count)),
        (
            "compute_capability".to_string(),
            json!(format!("{}.{}", g0.compute_capability.0, g0.compute_capability.1)),
        ),
        ("l2_bytes".to_string(), json!(g0.l2_bytes)),
        ("memory_bytes".to_string(), json!(g0.total_mem_bytes)),
        (
            "pci_bus_ids".to_string(),
            json!(env.gpus.iter().map(|g| &g.pci_bus_id).collect::<Vec<_>>()),
        ),
        (
            "driver_version".to_string(),
            json!(env.nvml_driver.clone().unwrap_or_else(|| "unknown (NVML not available)".into())),
        ),
        (
            "cuda_version".to_string(),
            json!(format!("{}.{}", env.driver_api / 1000, env.driver_api % 1000 / 10)),
        ),
        ("nvrtc_version".to_string(), json!(format!("{}.{}", env.nvrtc.0, env.nvrtc.1))),
        ("nccl_version".to_string(), json!(nccl::version_string(env.nccl))),
    ])
}

struct Inventory<'a>(&'a [Gpu]);

impl GpuInventory for Inventory<'_> {
    fn gpu_count(&self) -> u32 {
        self.0.len() as u32
    }
    fn can_access_peer(&self, a: u32, b: u32) -> bool {
        self.0[a as usize].can_access_peer(&self.0[b as usize]).unwrap_or(false)
    }
}

/// The wire scenarios that span nodes would use here, or why there is none (an invalid
/// `EPTWIN_WIRE`, verbs asked for without an ACTIVE port). TCP is always there.
fn wire_choice(options: &HwOptions) -> Result<wire::WireChoice, String> {
    let request = options.wire.clone()?;
    wire::choose(request).map_err(|e| e.to_string())
}

impl State {
    /// The wire that carried this job's internode bytes, if any.
    fn wire_report(&self) -> Option<&wire::WireReport> {
        match &self.runtime {
            Runtime::Normal(j) => j.wire_report(),
            Runtime::LowLatency(j) => j.wire_report(),
        }
    }
}

impl Transport for HwTransport {
    fn capabilities(&self) -> Capabilities {
        match &self.env {
            Err(reason) => Capabilities {
                backend: BackendKind::Hw,
                identity: self.process_identity().into_iter().collect(),
                unavailable: Some(reason.clone()),
                modes: Vec::new(),
                traffic: false,
                concurrent_jobs: false,
                max_ranks: None,
                rdma: false,
                rdma_reason: None,
            },
            Ok(_) => {
                let wire = wire_choice(&self.options);
                Capabilities {
                    backend: BackendKind::Hw,
                    identity: self
                        .identity
                        .clone()
                        .into_iter()
                        .chain(self.process_identity())
                        .collect(),
                    unavailable: None,
                    modes: vec![EpMode::Intranode, EpMode::Internode, EpMode::LowLatency],
                    traffic: false,
                    concurrent_jobs: false,
                    max_ranks: None,
                    rdma: wire.is_ok(),
                    rdma_reason: wire.err(),
                }
            }
        }
    }

    fn prepare(&mut self, plan: &Plan) -> Result<(), TransportError> {
        let env = match &mut self.env {
            Ok(env) => env,
            Err(reason) => return Err(TransportError::Unsupported(reason.clone())),
        };
        let view =
            self.procs.as_ref().map(|p| ProcessView { block: p.my_block(), processes: p.count() });
        let local = prepare_local(&self.options, env, plan, &mut self.measurements, view.as_ref());
        // Every process has done its own part; a waiver or failure anywhere is everyone's.
        let mut state = match self.procs.as_mut() {
            Some(p) => {
                p.agree_on("prepare (placement, kernels, buffers)", local, PREPARE_TIMEOUT)?
            }
            None => local?,
        };
        if let Err(e) =
            connect(&self.options, &mut state, self.procs.as_mut(), &mut self.measurements)
        {
            return Err(match &self.procs {
                Some(p) => p.abort(e),
                None => e,
            }
            .into());
        }
        self.state = Some(state);
        Ok(())
    }

    fn execute(&mut self, op: &OpSpec) -> Result<OpOutcome, TransportError> {
        let Some(state) = self.state.as_mut() else {
            return Err(TransportError::Backend {
                context: "hw".into(),
                message: "execute before prepare".into(),
            });
        };
        let OpSpec::Op { job, op, iteration, warmup } = op else {
            return Err(TransportError::Unsupported(
                "several jobs at once: the hardware backend runs one job at a time".into(),
            ));
        };
        if *job != state.job {
            return Err(TransportError::Backend {
                context: "hw".into(),
                message: format!("op for job {job:?}, prepared {:?}", state.job),
            });
        }
        let local = HwTransport::run_op(state, *job, *op, *iteration, *warmup);
        let merged = match self.procs.as_mut() {
            None => local?,
            Some(p) => {
                let local = match local {
                    // Peers may be blocked in a GPU wait on this process: tell them at once.
                    Err(e) if !matches!(e, HwError::Unsupported(_)) => {
                        return Err(p.abort(e).into());
                    }
                    other => other,
                };
                let timeout = std::time::Duration::from_millis(state.devs.host_timeout_ms)
                    + std::time::Duration::from_secs(120);
                let label =
                    format!("{}{op} iteration {iteration}", if *warmup { "warmup " } else { "" });
                p.merge_op(&label, local, timeout)?
            }
        };
        let sample = merged.sample;
        for (rank, digest) in merged.rank_digests {
            self.measurements.insert(
                format!("hw.output_digest.{op}.rank{rank}"),
                json!(format!("{digest:#018x}")),
            );
        }
        if !*warmup {
            state.latencies_ns.entry(*op).or_default().push(sample.latency_ns);
            state.transported_bytes.insert(*op, sample.nvlink_bytes);
            derived_measurements(state, *op, &mut self.measurements);
        }
        Ok(OpOutcome { samples: vec![sample], measurements: self.measurements.clone() })
    }
}

/// Kernel bandwidth against the ceilings, from the measured samples so far.
fn derived_measurements(state: &State, op: OpKind, m: &mut BTreeMap<String, Value>) {
    let Some(lat) = state.latencies_ns.get(&op) else { return };
    let mean_ns = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
    if mean_ns <= 0.0 {
        return;
    }
    let logical = state.logical_bytes.get(&op).copied().unwrap_or(0.0);
    let transported = state.transported_bytes.get(&op).copied().unwrap_or(0) as f64;
    let bw = logical / mean_ns;
    m.insert(format!("{op}.kernel_mean_us"), json!(round3(mean_ns / 1e3)));
    m.insert(format!("{op}.logical_bytes_all_ranks"), json!(logical));
    m.insert(format!("{op}.kernel_bw_gbps"), json!(round3(bw)));
    m.insert(format!("{op}.transported_bytes_all_ranks"), json!(transported));
    m.insert(format!("{op}.kernel_transport_bw_gbps"), json!(round3(transported / mean_ns)));
    if let Some(memcpy) = state.memcpy_gbps {
        m.insert(format!("{op}.kernel_bw_vs_memcpy_pct"), json!(round3(100.0 * bw / memcpy)));
    }
    if let Some(&nccl_us) = state.nccl_us.get(&op) {
        m.insert(
            format!("{op}.kernel_speedup_vs_nccl_alltoall"),
            json!(round3(nccl_us * 1e3 / mean_ns)),
        );
    }
}

/// Compile `id` with `defines` for every device and load it under `name`.
fn load(
    compiler: &compile::Compiler,
    devs: &mut Devices,
    id: ModuleId,
    name: &'static str,
    defines: &[(&str, String)],
) -> Result<(), HwError> {
    let module = eptwin_kernels::module(id);
    for dev in &mut devs.list {
        let cubin = compiler.cubin(module, dev.gpu.compute_capability, defines)?;
        let loaded = dev.gpu.load_module(&cubin, module.entry_points)?;
        dev.modules.insert(name, loaded);
    }
    Ok(())
}

/// Where this process stands in a multi-process run, as prepare needs it.
struct ProcessView {
    /// The scenario ranks this process runs.
    block: std::ops::Range<usize>,
    processes: usize,
}

/// Everything a process prepares on its own (placement, its GPUs, kernels, its ranks'
/// buffers); [`connect`] then does what needs the other processes.
fn prepare_local(
    options: &HwOptions,
    env: &mut Environment,
    plan: &Plan,
    m: &mut BTreeMap<String, Value>,
    view: Option<&ProcessView>,
) -> Result<State, HwError> {
    let job =
        plan.jobs.first().ok_or_else(|| HwError::Unsupported("the scenario has no job".into()))?;
    let JobKind::DeepEp(d) = &job.kind else {
        return Err(HwError::Unsupported(format!(
            "job {:?}: background traffic is not implemented on the hardware backend",
            job.name
        )));
    };
    // `EPTWIN_NORMAL_SMS=N` runs the normal kernels with N SMs per rank (N / 2 channels) instead
    // of the scenario's Config, for both dispatch and combine (they share the channel layout):
    // a measurement knob, recorded in the result.
    let sms_override = options.normal_sms;
    // Copied (routing table included) only when overridden.
    let mut d = std::borrow::Cow::Borrowed(d.as_ref());
    if let Some(sms) = sms_override {
        let job = d.to_mut();
        for c in [&mut job.dispatch_config, &mut job.combine_config].into_iter().flatten() {
            c.num_sms = sms;
        }
        m.insert("hw.num_sms_override".into(), json!(sms));
    }
    let d: &DeepEpJob = &d;
    // Bytes between ranks the plan's path rules put on RDMA cross the wire (internode::gpu).
    let job_wire = internode::gpu::job_geometry(plan, job, d)?;
    let across = job_wire.crossing.clone();
    if d.mode == EpMode::Internode && across.is_none() {
        return Err(HwError::Unsupported(format!(
            "job {:?}: normal internode kernels on one node (the scenario's topology puts all \
             {} ranks on one node)",
            job.name,
            job.num_ranks()
        )));
    }
    let wire_config = match &across {
        Some(_) => {
            let request = options.wire.clone().map_err(HwError::Unsupported)?;
            let timeout = std::time::Duration::from_millis(options.kernel_timeout_ms * 4 + 30_000);
            let mut c = internode::gpu::WireConfig::new(
                request,
                rdma::QpSettings::for_job(plan, job),
                timeout,
            );
            c.rdma_device = options.rdma_device.clone();
            Some(c)
        }
        None => None,
    };
    let n = job.num_ranks();
    // The job's ranks this process runs (all of them in a single-process run).
    let mine: Vec<u32> = match view {
        None => (0..n).collect(),
        Some(v) => {
            (0..n).filter(|&r| v.block.contains(&(job.ranks[r as usize].0 as usize))).collect()
        }
    };
    if mine.is_empty() {
        return Err(HwError::Setup {
            context: format!("job {:?}", job.name),
            message: "this process runs none of the job's ranks".into(),
        });
    }
    // A node's regions, rings and proxy belong to one process: a process runs whole nodes.
    if let Some((geometry, _)) = &across {
        internode::gpu::owned_nodes(geometry, &mine)?;
    }
    // Every process places the whole job the same way and opens the GPUs of its own ranks; the
    // plan's nodes are stacked onto this machine's GPUs.
    let placement = placement::place_nodes(
        n,
        plan.topology.ranks_per_gpu,
        job_wire.plan_nodes,
        &Inventory(&env.gpus),
    )
    .map_err(|e| HwError::Unsupported(e.to_string()))?;
    // Take the GPUs in use out of the environment; the rest stay closed to this job.
    let mut taken: Vec<Option<Gpu>> = std::mem::take(&mut env.gpus).into_iter().map(Some).collect();
    let mut list = Vec::new();
    for &g in &placement.gpus {
        let ranks: Vec<u32> =
            placement.ranks_on(g).into_iter().filter(|r| mine.contains(r)).collect();
        if ranks.is_empty() {
            continue;
        }
        let gpu = taken[g as usize].take().expect("placement GPUs are distinct");
        list.push(Device::new(gpu, ranks)?);
    }
    env.gpus = taken.into_iter().flatten().collect();
    for a in &list {
        for b in &list {
            if a.gpu.ordinal != b.gpu.ordinal {
                a.gpu.enable_peer_access(&b.gpu)?;
            }
        }
    }
    // Ranks of every process on each GPU: launches share a GPU's resident blocks.
    let ranks_on_gpu = |g: usize| placement.ranks_on(g as u32).len() as u32;
    if let Some(v) = view {
        for dev in &list {
            let all = ranks_on_gpu(dev.gpu.ordinal);
            if all > dev.ranks.len() as u32 && !dev.gpu.mps_enabled()? {
                return Err(HwError::Unsupported(format!(
                    "{all} ranks of {} processes share GPU {} but this process's context does not \
                     go through MPS (without it their kernels time-slice, ~5 ms per handoff): \
                     start the MPS control daemon (`nvidia-cuda-mps-control -d`) and run again",
                    v.processes, dev.gpu.ordinal
                )));
            }
        }
    }
    let mut devs = Devices::new(list, options.kernel_timeout_ms);
    devs.l2_clean = options.l2_clean;
    let compiler = compile::Compiler::new(env.nvrtc, options.kernel_cache_dir.clone());
    let sm_count = devs.list[0].gpu.sm_count;
    let max_local = placement.gpus.iter().map(|&g| ranks_on_gpu(g as usize)).max().unwrap_or(1);
    let w = &d.workload;

    // Flags between ranks need .sys scope only when peers sit on other GPUs.
    let scope = if placement.gpus.len() > 1 || options.flag_scope_sys {
        kernel_defines::FlagScope::Sys
    } else {
        kernel_defines::FlagScope::Gpu
    };
    m.insert("hw.flag_scope".into(), json!(scope.as_str()));
    if options.l2_clean {
        m.insert("hw.l2_before_op".into(), json!("flushed, then read back: clean lines"));
    }
    if options.ll_combine_prefetch {
        m.insert("hw.ll_combine_prefetch".into(), json!(true));
    }
    if options.ll_times {
        m.insert("hw.ll_times".into(), json!(true));
    }

    // Compile and load the helper modules, then the mode's kernels.
    for (id, name) in [
        (ModuleId::Layout, "layout"),
        (ModuleId::Probes, "probes"),
        (ModuleId::TestData, "testdata"),
    ] {
        load(&compiler, &mut devs, id, name, &[])?;
    }
    if view.is_some() {
        load(&compiler, &mut devs, ModuleId::Sync, "sync", &[])?;
    }
    let mut normal_shape = None;
    let mut cluster_rings = intranode::ClusterRings::default();
    match d.mode {
        EpMode::Intranode => {
            let dev0 = &devs.list[0];
            let cfg_recv = |c: &Option<eptwin_engine::deepep::config::Config>| {
                c.as_ref().map(|c| c.num_max_nvl_chunked_recv_tokens).unwrap_or(1)
            };
            let ring_inputs = intranode::RingInputs {
                ranks: n,
                one_launch: view.is_none() && placement.gpus.len() == 1,
                compute_major: dev0.gpu.compute_capability.0,
                hidden: w.hidden,
                fp8: w.dispatch_dtype == Dtype::Fp8,
                topk: w.topk,
                dispatch_recv_tokens: cfg_recv(&d.dispatch_config),
                combine_recv_tokens: cfg_recv(&d.combine_config),
            };
            let rings = intranode::ClusterRings::choose(&ring_inputs, options)
                .map_err(|e| HwError::Unsupported(format!("job {:?}: {e}", job.name)))?;
            let num_sms = d.dispatch_config.as_ref().map(|c| c.num_sms).unwrap_or(20);
            let per_gpu = max_local * num_sms;
            // The global-ring kernels wait on each other across blocks, so all their blocks must
            // be resident at once. With both ops on cluster rings only the module's notify
            // kernels run, and the cluster kernels' channels never wait on each other: their
            // clusters may run in waves.
            let need_resident = !(rings.dispatch_slots.is_some() && rings.combine_slots.is_some());
            let min_blocks = if need_resident { per_gpu.div_ceil(sm_count).max(1) } else { 1 };
            let mut refused = Vec::new();
            for threads in kernel_defines::normal_thread_candidates(n, min_blocks) {
                let defines = kernel_defines::intranode(n, threads, min_blocks, scope, options);
                load(&compiler, &mut devs, ModuleId::Intranode, "intranode", &defines)?;
                let dev0 = &devs.list[0];
                let intr = dev0.module("intranode")?;
                let mut resident = u32::MAX;
                for k in ["intranode_dispatch", "intranode_combine"] {
                    resident = resident.min(dev0.gpu.occupancy(intr.function(k), threads)?);
                }
                if !need_resident || resident * sm_count >= per_gpu {
                    normal_shape = Some((threads, min_blocks, resident));
                    break;
                }
                refused.push(format!("{threads} threads: {resident} blocks per SM"));
            }
            if rings.any() {
                let defines = vec![("NUM_RANKS", n.to_string())];
                load(
                    &compiler,
                    &mut devs,
                    ModuleId::IntranodeCluster,
                    "intranode_cluster",
                    &defines,
                )?;
                // How the cluster kernels launch, and how many of their clusters the GPU holds
                // at once (more channels than that run in waves).
                let dev0 = &devs.list[0];
                let module = dev0.module("intranode_cluster")?;
                let mut shapes = serde_json::Map::new();
                for (op, slots) in
                    [("dispatch", rings.dispatch_slots), ("combine", rings.combine_slots)]
                {
                    let Some(slots) = slots else { continue };
                    let shape = intranode::cluster_shape(
                        op == "dispatch",
                        n,
                        ring_inputs.hidden,
                        ring_inputs.fp8,
                        w.topk,
                        slots,
                    );
                    let f = module.function(shape.kernel);
                    dev0.gpu.set_max_dynamic_smem(f, shape.smem_bytes)?;
                    let resident =
                        dev0.gpu.max_active_clusters(f, n, shape.threads, shape.smem_bytes)?;
                    shapes.insert(
                        op.into(),
                        json!({
                            "clusters": num_sms / 2,
                            "blocks_per_cluster": n,
                            "threads_per_block": shape.threads,
                            "slots_per_source": slots,
                            "slot_bytes": shape.slot_bytes,
                            "dynamic_smem_bytes": shape.smem_bytes,
                            "resident_clusters": resident,
                        }),
                    );
                }
                m.insert("hw.cluster_kernels".into(), serde_json::Value::Object(shapes));
            }
            cluster_rings = rings;
            if normal_shape.is_none() {
                return Err(HwError::Setup {
                    context: format!("job {:?}", job.name),
                    message: format!(
                        "{per_gpu} sender/receiver blocks per GPU cannot all be resident on {sm_count} SMs \
                         (they would deadlock): {}",
                        refused.join("; ")
                    ),
                });
            }
        }
        EpMode::Internode => {
            let (geometry, _) = across.as_ref().expect("checked above");
            let defines = kernel_defines::internode(geometry.ranks_per_node, scope);
            load(&compiler, &mut devs, ModuleId::Internode, "internode", &defines)?;
            let threads = kernel_defines::INTERNODE_THREADS;
            let blocks_per_rank = 2 * geometry.num_channels;
            // Every process's blocks on the GPU wait on each other: all must be resident.
            let per_gpu = max_local * blocks_per_rank;
            let dev0 = &devs.list[0];
            let module = dev0.module("internode")?;
            let mut resident = u32::MAX;
            for k in ["internode_dispatch", "internode_combine"] {
                resident = resident.min(dev0.gpu.occupancy(module.function(k), threads)?);
            }
            if resident * sm_count < per_gpu {
                return Err(HwError::Setup {
                    context: format!("job {:?}", job.name),
                    message: format!(
                        "{per_gpu} internode blocks per GPU ({max_local} ranks x {blocks_per_rank}) \
                         cannot all be resident on {sm_count} SMs at {resident} per SM (they \
                         wait on each other)"
                    ),
                });
            }
            normal_shape = Some((threads, 1, resident));
        }
        EpMode::LowLatency => {
            let defines =
                kernel_defines::low_latency(w.hidden, low_latency::LL_THREADS, scope, options);
            load(&compiler, &mut devs, ModuleId::LowLatency, "low_latency", &defines)?;
        }
    }
    let (hits, compiles) = compiler.stats.get();
    m.insert("hw.kernel_cache".into(), json!(format!("{hits} cached, {compiles} compiled")));
    m.insert("hw.placement".into(), placement.to_json());
    m.insert(
        "hw.l2_discard_consumed_lines".into(),
        json!({
            "dispatch": options.discard_in_dispatch(),
            "combine": options.l2_discard,
        }),
    );
    m.insert("hw.kernel_timeout_ms".into(), json!(options.kernel_timeout_ms));

    if options.cluster_probe && view.is_some() {
        tracing::warn!("EPTWIN_CLUSTER_PROBE ignored: the probes run in single-process runs only");
    } else if options.cluster_probe {
        // Thread-block clusters need sm_90; the probe is opt-in and never gates a run's kernels.
        if devs.list[0].gpu.compute_capability.0 >= 9 {
            for (name, threads) in cluster_probe::MODULES {
                let defines = kernel_defines::cluster(threads);
                load(&compiler, &mut devs, ModuleId::Cluster, name, &defines)?;
            }
            m.extend(cluster_probe::run(&mut devs, &options.cluster_probe_only)?);
            let defines = vec![("NUM_RANKS", cluster_probe::REDUCE_RANKS.to_string())];
            load(
                &compiler,
                &mut devs,
                ModuleId::IntranodeCluster,
                cluster_probe::REDUCE_MODULE,
                &defines,
            )?;
            m.extend(cluster_probe::run_reduce(&mut devs)?);
            m.extend(cluster_probe::run_launch(&mut devs)?);
        } else {
            tracing::warn!("EPTWIN_CLUSTER_PROBE ignored: thread-block clusters need sm_90");
        }
    }

    let gpu_of_rank = placement.gpu_of_rank.clone();
    let runtime = match d.mode {
        EpMode::Intranode => {
            let cfg = d.dispatch_config.as_ref().expect("normal mode has a dispatch config");
            let (threads, min_blocks, resident) = normal_shape.expect("set for normal mode above");
            let dev0 = &devs.list[0];
            let intr = dev0.module("intranode")?;
            let (mut regs, mut local) = (0, 0);
            for k in ["intranode_dispatch", "intranode_combine"] {
                let (r, l) = dev0.gpu.function_resources(intr.function(k))?;
                regs = regs.max(r);
                local = local.max(l);
            }
            let per_gpu = max_local * cfg.num_sms;
            let launch = NormalLaunch {
                threads,
                min_blocks,
                blocks_per_rank: cfg.num_sms,
                blocks_per_gpu: per_gpu,
                resident_blocks_per_sm: resident,
                registers: regs,
                local_bytes: local,
                rings: cluster_rings,
            };
            m.insert(
                "hw.normal_kernels".into(),
                json!({
                    // With both ops on cluster rings (hw.cluster_kernels) only this module's
                    // notify kernels run; the shape below is the global-ring kernels'.
                    "global_ring_kernels_run": cluster_rings.dispatch_slots.is_none()
                        || cluster_rings.combine_slots.is_none(),
                    "threads_per_block": launch.threads,
                    "combine_reducer_warps_per_token": kernel_defines::combine_group_warps(launch.threads, options.combine_group_warps),
                    "l2_eviction_hints": options.l2_hints,
                    "blocks_per_rank": launch.blocks_per_rank,
                    "channels_per_rank": launch.blocks_per_rank / 2,
                    "blocks_per_gpu": launch.blocks_per_gpu,
                    "blocks_per_launch": devs.list.iter().map(|d| d.ranks.len() as u32 * cfg.num_sms).max().unwrap_or(0),
                    "resident_blocks_per_sm": launch.resident_blocks_per_sm,
                    "effective_sms_per_rank": round3(sm_count as f64 / max_local as f64),
                    "registers_per_thread": launch.registers,
                    "local_memory_bytes_per_thread": launch.local_bytes,
                    "dispatch_rings": rings_json(
                        cluster_rings.dispatch_slots,
                        cfg.num_max_nvl_chunked_recv_tokens
                    ),
                    "combine_rings": rings_json(
                        cluster_rings.combine_slots,
                        d.combine_config.as_ref().map(|c| c.num_max_nvl_chunked_recv_tokens).unwrap_or(0),
                    ),
                }),
            );
            Runtime::Normal(NormalJob::prepare(&mut devs, job, d, &gpu_of_rank, options, launch)?)
        }
        EpMode::Internode => {
            let (geometry, _) = across.clone().expect("checked above");
            let (threads, _, resident) = normal_shape.expect("set for internode mode above");
            let dev0 = &devs.list[0];
            let module = dev0.module("internode")?;
            let (mut regs, mut local) = (0, 0);
            for k in ["internode_dispatch", "internode_combine"] {
                let (r, l) = dev0.gpu.function_resources(module.function(k))?;
                regs = regs.max(r);
                local = local.max(l);
            }
            let blocks_per_rank = 2 * geometry.num_channels;
            let launch = NormalLaunch {
                threads,
                min_blocks: 1,
                blocks_per_rank,
                blocks_per_gpu: max_local * blocks_per_rank,
                resident_blocks_per_sm: resident,
                registers: regs,
                local_bytes: local,
                rings: intranode::ClusterRings::default(),
            };
            let config = wire_config.clone().expect("set with the geometry");
            let job_rt = NormalJob::prepare_across_nodes(
                &mut devs,
                job,
                d,
                &gpu_of_rank,
                launch,
                geometry,
                config,
            )?;
            let mut kernels = job_rt.across_nodes_kernels().expect("a job across nodes");
            kernels["registers_per_thread"] = json!(regs);
            kernels["local_memory_bytes_per_thread"] = json!(local);
            kernels["resident_blocks_per_sm"] = json!(resident);
            kernels["effective_sms_per_rank"] = json!(round3(sm_count as f64 / max_local as f64));
            m.insert("hw.internode_kernels".into(), kernels);
            Runtime::Normal(job_rt)
        }
        EpMode::LowLatency => {
            let mut dispatch_blocks = Vec::new();
            let mut combine_blocks = Vec::new();
            let (mut regs, mut local) = ((0, 0), (0, 0));
            for dev in &devs.list {
                let ll = dev.module("low_latency")?;
                let (fd, fc) = (ll.function("ll_dispatch"), ll.function("ll_combine"));
                let od = dev.gpu.occupancy(fd, low_latency::LL_THREADS)?;
                let oc = dev.gpu.occupancy(fc, low_latency::LL_THREADS)?;
                if od == 0 || oc == 0 {
                    return Err(HwError::Unsupported(
                        "the low-latency kernels do not fit one block per SM".into(),
                    ));
                }
                // Processes sharing a GPU share its resident blocks by their ranks: every
                // process's blocks must be resident at once (they wait on each other).
                let share = |resident: u32| {
                    let all = ranks_on_gpu(dev.gpu.ordinal);
                    (resident * dev.ranks.len() as u32 / all).max(1)
                };
                dispatch_blocks.push(share(dev.gpu.sm_count * od));
                combine_blocks.push(share(dev.gpu.sm_count * oc));
                let (rd, ld) = dev.gpu.function_resources(fd)?;
                let (rc, lc) = dev.gpu.function_resources(fc)?;
                regs = (rd, rc);
                local = (ld, lc);
            }
            let launch = LlLaunch {
                dispatch_blocks: dispatch_blocks.clone(),
                combine_blocks: combine_blocks.clone(),
                threads: low_latency::LL_THREADS,
                registers: regs,
                local_bytes: local,
            };
            m.insert(
                "hw.low_latency_kernels".into(),
                json!({
                    "threads_per_block": launch.threads,
                    // This process's launches (its share of the GPU when processes share one).
                    "dispatch_blocks_per_gpu": dispatch_blocks,
                    "combine_blocks_per_gpu": combine_blocks,
                    "effective_sms_per_rank": round3(sm_count as f64 / max_local as f64),
                    "registers_per_thread": [regs.0, regs.1],
                    "local_memory_bytes_per_thread": [local.0, local.1],
                    "warps_per_receive_group": low_latency::WARPS_PER_GROUP,
                }),
            );
            let wire = across.clone().map(|(g, _)| (g, wire_config.clone().expect("with it")));
            Runtime::LowLatency(LlJob::prepare(
                &mut devs,
                job,
                d,
                &gpu_of_rank,
                options,
                launch,
                wire,
            )?)
        }
    };

    let logical_sum = |v: &[u64]| v.iter().sum::<u64>() as f64;
    let logical_bytes = BTreeMap::from([
        (OpKind::Dispatch, logical_sum(&d.logical().dispatch_per_rank)),
        (OpKind::Combine, logical_sum(&d.logical().combine_per_rank)),
    ]);
    devs.sync("prepare")?;
    Ok(State {
        devs,
        placement,
        job: job.id,
        runtime,
        latencies_ns: BTreeMap::new(),
        logical_bytes,
        transported_bytes: BTreeMap::new(),
        nccl_us: BTreeMap::new(),
        memcpy_gbps: None,
        row_shape: (w.hidden, w.dispatch_dtype),
        first_rank: mine[0],
    })
}

/// How long processes wait at the barrier while process 0 measures the copy ceilings.
const PROBES_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// The part of prepare that needs every process: the buffers peers write into, the barrier
/// before each timed launch, then the ceilings measured in the same run (process 0 only while
/// the others wait) and, in a single-process run, the NCCL baseline.
fn connect(
    options: &HwOptions,
    state: &mut State,
    mut procs: Option<&mut Processes>,
    m: &mut BTreeMap<String, Value>,
) -> Result<(), HwError> {
    if let Some(p) = procs.as_deref_mut() {
        state.devs.watch = Some(p.watch());
    }
    match &mut state.runtime {
        Runtime::Normal(j) => j.connect(&state.devs, procs.as_deref_mut())?,
        Runtime::LowLatency(j) => j.connect(&state.devs, procs.as_deref_mut())?,
    }
    if let Some(p) = procs.as_deref_mut() {
        state.devs.barrier = Some(ProcessBarrier::new(p, &state.devs, state.first_rank)?);
    }
    let process_zero = procs.as_ref().is_none_or(|p| p.rank() == 0);
    if options.probes && process_zero {
        let p = probes::run(&mut state.devs)?;
        state.memcpy_gbps = p.get("probe.memcpy_dtod_bw_gbps").and_then(|v| v.as_f64());
        if let Some(bw) = state.memcpy_gbps {
            tracing::info!(
                "memcpy ceiling (1 GiB device-to-device cuMemcpy): {bw:.1} GB/s copied, \
                 {:.1} GB/s read+write",
                2.0 * bw
            );
        }
        m.extend(p);
    }
    if let Some(p) = procs {
        if options.probes {
            p.barrier("copy probes in process 0", PROBES_TIMEOUT)?;
        }
        let across_nodes = state.wire_report().is_some();
        m.insert(
            "hw.processes".into(),
            json!({
                "processes": p.count(),
                "ranks": p.blocks().iter().map(|b| match b.len() {
                    1 => b.start.to_string(),
                    _ => format!("{}..{}", b.start, b.end - 1),
                }).collect::<Vec<_>>(),
                "hosts": p.hosts(),
                "normal_kernels": if across_nodes {
                    "internode.cu: each process runs whole nodes, the wire (backend.wire) between them"
                } else {
                    "global-memory rings (intranode.cu): the cluster kernels need every rank in one launch"
                },
                "peer_buffers": "CUDA IPC handles (cuIpcGetMemHandle / cuIpcOpenMemHandle)",
                "before_each_timed_launch": "a GPU-side barrier across processes (untimed)",
                "probes": if options.probes { "measured by process 0 while the others waited" } else { "off" },
                "latency": "the slowest process's CUDA-event time",
            }),
        );
        if options.nccl_baseline {
            m.insert(
                "hw.nccl_baseline".into(),
                json!("skipped: the baseline runs every rank's communicator in one process"),
            );
        }
    } else if options.nccl_baseline {
        // The baseline is context, not the measurement: a failure is recorded, not fatal.
        let gpu_of_rank = state.placement.gpu_of_rank.clone();
        let (hidden, dtype) = state.row_shape;
        match nccl_baseline(&mut state.devs, &state.runtime, &gpu_of_rank, hidden, dtype, m) {
            Ok(us) => state.nccl_us = us,
            Err(e) => {
                tracing::warn!("NCCL all-to-all baseline failed: {e}");
                m.insert("hw.nccl_baseline_error".into(), json!(e.to_string()));
            }
        }
    }
    state.devs.sync("prepare")
}

/// NCCL all-to-all of the same bytes per (source, destination) pair as dispatch and combine.
fn nccl_baseline(
    devs: &mut Devices,
    runtime: &Runtime,
    gpu_of_rank: &[u32],
    hidden: u32,
    dispatch_dtype: Dtype,
    m: &mut BTreeMap<String, Value>,
) -> Result<BTreeMap<OpKind, f64>, HwError> {
    let mut nccl_us = BTreeMap::new();
    {
        let comms = nccl::Comms::init(devs)?;
        let (rows, dispatch_row, combine_row) = match &runtime {
            Runtime::Normal(j) => (
                j.pair_rows(),
                eptwin_engine::deepep::bytes::logical_row_bytes(hidden, dispatch_dtype),
                2 * hidden as u64,
            ),
            Runtime::LowLatency(j) => (
                j.pair_rows(),
                match dispatch_dtype {
                    Dtype::Fp8 => {
                        eptwin_engine::deepep::bytes::ll_dispatch_msg_bytes(hidden, Dtype::Fp8)
                    }
                    _ => 2 * hidden as u64,
                },
                eptwin_engine::deepep::bytes::ll_combine_msg_bytes(hidden, Dtype::Bf16),
            ),
        };
        let transposed: Vec<Vec<u64>> =
            (0..rows.len()).map(|s| (0..rows.len()).map(|d2| rows[d2][s]).collect()).collect();
        for (op, r, row_bytes) in
            [(OpKind::Dispatch, &rows, dispatch_row), (OpKind::Combine, &transposed, combine_row)]
        {
            let (us, bytes) = probes::nccl_alltoall(devs, &comms, gpu_of_rank, r, row_bytes)?;
            nccl_us.insert(op, us);
            m.insert(format!("{op}.nccl_alltoall_us"), json!(round3(us)));
            m.insert(format!("{op}.nccl_alltoall_bytes_all_ranks"), json!(bytes));
            m.insert(
                format!("{op}.nccl_alltoall_bw_gbps"),
                json!(round3(bytes as f64 / (us * 1e3))),
            );
        }
        m.insert(
            "hw.nccl_baseline".into(),
            json!(
                "grouped ncclSend/ncclRecv of every (source, destination) rank pair's bytes; ranks \
                 sharing a GPU share its one communicator rank (NCCL allows one rank per GPU), so \
                 their chunks are sends to self"
            ),
        );
    }
    devs.sync("NCCL baseline")?;
    Ok(nccl_us)
}

/// The NVML implementation of the engine's `TopologyProbe`, or why there is none here.
pub fn nvml_probe() -> Result<Box<dyn eptwin_engine::topology::TopologyProbe>, String> {
    let api = nvml::RealNvml::init()?;
    let probe = nvml::NvmlProbe::new(api, nvml::cuda_bus_ids())?;
    Ok(Box::new(probe))
}

/// `hw.normal_kernels.{dispatch,combine}_rings`: where a kernel's rings live and how many slots
/// per (channel, source) they have.
fn rings_json(cluster_slots: Option<u32>, global_slots: u32) -> serde_json::Value {
    match cluster_slots {
        Some(slots) => json!({"in": "cluster shared memory", "slots": slots}),
        None => json!({"in": "global memory", "slots": global_slots}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without a GPU (CI, laptops) the backend says why in one line and the run
    /// is waived; `EPTWIN_REQUIRE_HW=1` makes a missing GPU a failure on the GPU machine.
    #[test]
    fn capabilities_without_a_gpu_are_a_one_line_waiver() {
        let t = HwTransport::new(HwOptions::from_env());
        let caps = t.capabilities();
        match &caps.unavailable {
            Some(reason) => {
                assert!(std::env::var("EPTWIN_REQUIRE_HW").as_deref() != Ok("1"), "{reason}");
                assert!(!reason.contains('\n'), "one line: {reason:?}");
                assert!(caps.modes.is_empty());
            }
            None => {
                assert!(caps.identity.contains_key("gpus"));
                assert!(caps.identity.contains_key("nccl_version"));
            }
        }
    }
}
