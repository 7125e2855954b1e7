//! Preparing a run, in the order `HwTransport::prepare` takes it: everything a process does on
//! its own ([`prepare_local`]: the job as it runs, the wire option, placement, this process's
//! GPUs, the helper modules, the kernel family's fit, the opt-in cluster probes, the family's
//! buffers), then what needs every process ([`connect`]: the peers and the wire, the barrier
//! before each timed launch, the ceilings measured in the same run, the NCCL baseline).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use eptwin_engine::api::JobId;
use eptwin_engine::api::{DeepEpJob, EpMode, JobKind, JobPlan, OpKind, Plan};
use eptwin_kernels::ModuleId;

use crate::compile::Compiler;
use crate::crossing::{Crossing, job_geometry};
use crate::cuda::Gpu;
use crate::environment::{Environment, Inventory};
use crate::error::HwError;
use crate::exec::{Device, Devices};
use crate::family::{FamilyContext, KernelFamily};
use crate::faults::OpFaults;
use crate::kernel_defines::FlagScope;
use crate::low_latency::LowLatency;
use crate::measurements::{L2Discard, Measurements, NcclFigures, ProcessesReport};
use crate::normal::Normal;
use crate::options::HwOptions;
use crate::placement::{self, Placement};
use crate::processes::{ProcessBarrier, Processes};
use crate::{nccl, probes};
use eptwin_wire::WireReport;
use eptwin_wire::links::owned_nodes;

/// Where this process stands in a multi-process run, as prepare needs it.
pub struct ProcessView {
    /// The scenario ranks this process runs.
    pub block: std::ops::Range<usize>,
    pub processes: usize,
}

/// A prepared job on this process: its kernel family, GPUs and placement, and what the
/// measurements of its ops are computed from.
pub struct Prepared {
    /// First: dropping it stops the wire's threads and frees the buffers while the GPUs'
    /// contexts (in `devs`) are still alive.
    pub family: Box<dyn KernelFamily>,
    pub devs: Devices,
    pub placement: Placement,
    pub job: JobId,
    /// Measured (non-warmup) latencies per op.
    pub latencies_ns: BTreeMap<OpKind, Vec<f64>>,
    /// Bytes DeepEP's tests count, summed over ranks, per op.
    pub logical_bytes: BTreeMap<OpKind, f64>,
    /// The last timed sample's `nvlink_bytes` per op.
    pub transported_bytes: BTreeMap<OpKind, u64>,
    pub nccl_us: BTreeMap<OpKind, f64>,
    pub memcpy_gbps: Option<f64>,
    /// This process's first job rank (named in the process barrier's timeout record).
    pub first_rank: u32,
    /// The job's `[[fault]]`s on this process's ranks (`None` on a healthy cluster).
    pub faults: Option<OpFaults>,
}

impl Prepared {
    /// The wire that carried this job's internode bytes, if any.
    pub fn wire_report(&self) -> Option<&WireReport> {
        self.family.wire_report()
    }
}

/// The job's DeepEP part as the backend runs it: `EPTWIN_NORMAL_SMS=N` runs the normal kernels
/// with N SMs per rank (N / 2 channels) instead of the scenario's Configs, for both dispatch
/// and combine (they share the channel layout): a measurement knob, recorded in the result.
fn job_as_run<'p>(
    plan: &'p Plan,
    options: &HwOptions,
    m: &mut Measurements,
) -> Result<(&'p JobPlan, Cow<'p, DeepEpJob>), HwError> {
    let job =
        plan.jobs.first().ok_or_else(|| HwError::Unsupported("the scenario has no job".into()))?;
    let JobKind::DeepEp(d) = &job.kind else {
        return Err(HwError::Unsupported(format!(
            "job {:?}: background traffic is not implemented on the hardware backend",
            job.name
        )));
    };
    // Copied (routing table included) only when overridden.
    let mut d = Cow::Borrowed(d.as_ref());
    if let Some(sms) = options.normal_sms {
        let job = d.to_mut();
        for c in [&mut job.dispatch_config, &mut job.combine_config].into_iter().flatten() {
            c.num_sms = sms;
        }
        m.num_sms_override = Some(sms);
    }
    Ok((job, d))
}

/// The job's ranks this process runs (all of them in a single-process run).
fn this_process_ranks(job: &JobPlan, view: Option<&ProcessView>) -> Result<Vec<u32>, HwError> {
    let n = job.num_ranks();
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
    Ok(mine)
}

/// This process's GPUs of the placement (the rest stay closed to this job), peer access
/// between them, and the MPS check of processes sharing a GPU.
fn open_devices(
    env: &mut Environment,
    placement: &Placement,
    mine: &[u32],
    view: Option<&ProcessView>,
) -> Result<Vec<Device>, HwError> {
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
    let Some(v) = view else { return Ok(list) };
    for dev in &list {
        let all = placement.ranks_on(dev.gpu.ordinal as u32).len() as u32;
        if all > dev.ranks.len() as u32 && !dev.gpu.mps_enabled()? {
            return Err(HwError::Unsupported(format!(
                "{all} ranks of {} processes share GPU {} but this process's context does not \
                 go through MPS (without it their kernels time-slice, ~5 ms per handoff): \
                 start the MPS control daemon (`nvidia-cuda-mps-control -d`) and run again",
                v.processes, dev.gpu.ordinal
            )));
        }
    }
    Ok(list)
}

/// The knobs that shape every op, recorded with the flag scope.
fn record_knobs(options: &HwOptions, scope: FlagScope, m: &mut Measurements) {
    m.flag_scope = Some(scope);
    if options.l2_clean {
        m.l2_before_op = Some("flushed, then read back: clean lines".into());
    }
    if options.ll_combine_prefetch {
        m.ll_combine_prefetch = Some(true);
    }
    if options.ll_times {
        m.ll_times = Some(true);
    }
}

/// Everything a process prepares on its own (placement, its GPUs, kernels, its ranks'
/// buffers); [`connect`] then does what needs the other processes.
pub fn prepare_local(
    options: &HwOptions,
    env: &mut Environment,
    plan: &Plan,
    m: &mut Measurements,
    view: Option<&ProcessView>,
) -> Result<Prepared, HwError> {
    let (job, d) = job_as_run(plan, options, m)?;
    let d: &DeepEpJob = &d;
    // Bytes between ranks the plan's path rules put on RDMA cross the wire (`crossing`).
    let job_wire = job_geometry(plan, job, d)?;
    if d.mode == EpMode::Internode && job_wire.crossing.is_none() {
        return Err(HwError::Unsupported(format!(
            "job {:?}: normal internode kernels on one node (the scenario's topology puts all \
             {} ranks on one node)",
            job.name,
            job.num_ranks()
        )));
    }
    let crossing = match job_wire.crossing {
        Some(c) => Some(Crossing::new(plan, job, c, options)?),
        None => None,
    };
    let mine = this_process_ranks(job, view)?;
    let processes = view.map_or(1, |v| v.processes);
    // A fault the hardware cannot inject waives the run before placement and compilation.
    OpFaults::refuse_unsupported(plan, job, processes)?;
    // A node's regions, rings and proxy belong to one process: a process runs whole nodes.
    if let Some(c) = &crossing {
        owned_nodes(&c.geometry, &mine)?;
    }
    // Every process places the whole job the same way and opens the GPUs of its own ranks; the
    // plan's nodes are stacked onto this machine's GPUs.
    let n = job.num_ranks();
    let inventory = Inventory(&env.gpus);
    let placement =
        placement::place_nodes(n, plan.topology.ranks_per_gpu, job_wire.plan_nodes, &inventory)
            .map_err(|e| HwError::Unsupported(e.to_string()))?;
    let mut devs =
        Devices::new(open_devices(env, &placement, &mine, view)?, options.kernel_timeout_ms);
    devs.l2_clean = options.l2_clean;
    let compiler = Compiler::new(env.nvrtc, options.kernel_cache_dir.clone());
    // Flags between ranks need .sys scope only when peers sit on other GPUs.
    let scope = match placement.gpus.len() > 1 || options.flag_scope_sys {
        true => FlagScope::Sys,
        false => FlagScope::Gpu,
    };
    record_knobs(options, scope, m);
    for (id, name) in [
        (ModuleId::Layout, "layout"),
        (ModuleId::Probes, "probes"),
        (ModuleId::TestData, "testdata"),
    ] {
        compiler.load(&mut devs, id, name, &[])?;
    }
    let launches: Vec<Vec<u32>> = devs.list.iter().map(|d| d.ranks.clone()).collect();
    let faults = OpFaults::check(plan, job, &mine, &launches, processes)?;
    if view.is_some() || OpFaults::needs_delay_kernel(plan) {
        compiler.load(&mut devs, ModuleId::Sync, "sync", &[])?;
    }
    let mut ctx = FamilyContext {
        options,
        job,
        deepep: d,
        devs: &mut devs,
        compiler: &compiler,
        placement: &placement,
        processes: view.map(|v| v.processes),
        crossing: crossing.as_ref(),
        scope,
    };
    let mut family: Box<dyn KernelFamily> = match d.mode {
        EpMode::LowLatency => Box::new(LowLatency::fit(&mut ctx)?),
        EpMode::Intranode | EpMode::Internode => Box::new(Normal::fit(&mut ctx)?),
    };
    m.kernel_cache = Some(compiler.describe_stats());
    m.placement = Some(placement.report());
    m.l2_discard_consumed_lines =
        Some(L2Discard { dispatch: options.discard_in_dispatch(), combine: options.l2_discard });
    m.kernel_timeout_ms = Some(options.kernel_timeout_ms);
    if options.cluster_probe && view.is_some() {
        tracing::warn!("EPTWIN_CLUSTER_PROBE ignored: the probes run in single-process runs only");
    } else if options.cluster_probe {
        let only = &options.cluster_probe_only;
        probes::cluster::run_all(&compiler, ctx.devs, only, &mut m.probes)?;
    }
    family.prepare(&mut ctx)?;
    m.kernels = family.report();
    let logical_sum = |v: &[u64]| v.iter().sum::<u64>() as f64;
    let logical_bytes = BTreeMap::from([
        (OpKind::Dispatch, logical_sum(&d.logical().dispatch_per_rank)),
        (OpKind::Combine, logical_sum(&d.logical().combine_per_rank)),
    ]);
    devs.sync("prepare")?;
    Ok(Prepared {
        family,
        devs,
        placement,
        job: job.id,
        latencies_ns: BTreeMap::new(),
        logical_bytes,
        transported_bytes: BTreeMap::new(),
        nccl_us: BTreeMap::new(),
        memcpy_gbps: None,
        first_rank: mine[0],
        faults,
    })
}

/// How long processes wait at the barrier while process 0 measures the copy ceilings.
const PROBES_TIMEOUT: Duration = Duration::from_secs(600);

/// The part of prepare that needs every process: the buffers peers write into and the wire,
/// the barrier before each timed launch, then the ceilings measured in the same run (process 0
/// only while the others wait) and, in a single-process run, the NCCL baseline.
pub fn connect(
    options: &HwOptions,
    state: &mut Prepared,
    mut procs: Option<&mut Processes>,
    m: &mut Measurements,
) -> Result<(), HwError> {
    if let Some(p) = procs.as_deref_mut() {
        state.devs.watch = Some(p.watch());
    }
    state.family.connect(&state.devs, procs.as_deref_mut())?;
    if let Some(p) = procs.as_deref_mut() {
        state.devs.barrier = Some(Box::new(ProcessBarrier::new(p, &state.devs, state.first_rank)?));
    }
    let process_zero = procs.as_ref().is_none_or(|p| p.rank() == 0);
    if options.probes && process_zero {
        probes::run(&mut state.devs, &mut m.probes)?;
        state.memcpy_gbps = m.probes.memcpy_dtod_bw_gbps;
        if let Some(bw) = state.memcpy_gbps {
            tracing::info!(
                "memcpy ceiling (1 GiB device-to-device cuMemcpy): {bw:.1} GB/s copied, \
                 {:.1} GB/s read+write",
                2.0 * bw
            );
        }
    }
    match procs {
        Some(p) => {
            if options.probes {
                p.barrier("copy probes in process 0", PROBES_TIMEOUT)?;
            }
            m.processes = Some(processes_report(options, p, state.wire_report().is_some()));
            if options.nccl_baseline {
                m.nccl_baseline = Some(
                    "skipped: the baseline runs every rank's communicator in one process".into(),
                );
            }
        }
        None if options.nccl_baseline => nccl_baseline(state, m),
        None => {}
    }
    state.devs.sync("prepare")
}

/// `hw.processes`: what a multi-process run did differently from a single process.
fn processes_report(options: &HwOptions, p: &Processes, across_nodes: bool) -> ProcessesReport {
    let text = |s: &str| s.to_string();
    ProcessesReport {
        processes: p.count(),
        ranks: p
            .blocks()
            .iter()
            .map(|b| match b.len() {
                1 => b.start.to_string(),
                _ => format!("{}..{}", b.start, b.end - 1),
            })
            .collect(),
        hosts: p.hosts(),
        normal_kernels: text(match across_nodes {
            true => {
                "internode.cu: each process runs whole nodes, the wire (backend.wire) between them"
            }
            false => {
                "global-memory rings (intranode.cu): the cluster kernels need every rank in one launch"
            }
        }),
        peer_buffers: text("CUDA IPC handles (cuIpcGetMemHandle / cuIpcOpenMemHandle)"),
        before_each_timed_launch: text("a GPU-side barrier across processes (untimed)"),
        probes: text(match options.probes {
            true => "measured by process 0 while the others waited",
            false => "off",
        }),
        latency: text("the slowest process's CUDA-event time"),
    }
}

/// The NCCL all-to-all baseline of the job's traffic. It is context, not the measurement: a
/// failure is recorded, not fatal.
fn nccl_baseline(state: &mut Prepared, m: &mut Measurements) {
    let gpu_of_rank = state.placement.gpu_of_rank.clone();
    let measured = state
        .family
        .baseline_traffic()
        .and_then(|traffic| nccl::baseline(&mut state.devs, &traffic, &gpu_of_rank));
    match measured {
        Ok(times) => {
            for (op, t) in times {
                state.nccl_us.insert(op, t.us);
                m.ops.entry(op).or_default().nccl = Some(NcclFigures::new(t.us, t.bytes_all_ranks));
            }
            m.nccl_baseline = Some(nccl::BASELINE_METHOD.into());
        }
        Err(e) => {
            tracing::warn!("NCCL all-to-all baseline failed: {e}");
            m.nccl_baseline_error = Some(e.to_string());
        }
    }
}
