//! eptwin hardware backend: real CUDA kernels (NVRTC through cudarc), NVML topology, ibverbs.
//!
//! `HwTransport` implements the engine's `Transport` and only orders the work: it finds the
//! GPUs (`environment`), then per plan prepares the job (`prepare`: the wire option the plan's
//! rules give (`crossing`), placement, the kernel family's fit and buffers, the peers and the
//! wire, the ceilings and the NCCL baseline measured in the same run (`probes`, `nccl`)), and
//! times each dispatch/combine with CUDA events after an L2 flush, checking the received tokens
//! and the combined sums the way DeepEP's tests do. The kernels are two families behind one
//! trait (`family`): `normal` and `low_latency`. One job's ranks may also run as several
//! processes, each with its own block of ranks, sharing buffers through CUDA IPC (`processes`,
//! docs/cluster.md). What a run measured is typed (`measurements`).
//!
//! Architecture Invariant: every GPU library is loaded at run time; a missing GPU, driver,
//! NVRTC or NCCL makes `capabilities()` report the plan as waived with one line, never a panic.
//!
//! Architecture Invariant: every spin-wait in a kernel is bounded; a wait that gives up records
//! who waited for what, and the op fails with that line (`error::ErrorRecord::describe`).

pub mod compile;
pub mod crossing;
pub mod cuda;
pub mod data;
pub mod environment;
pub mod error;
pub mod exec;
pub mod family;
pub mod faults;
pub mod kernel_defines;
pub mod low_latency;
pub mod measurements;
pub mod nccl;
pub mod normal;
pub mod nvml;
pub mod options;
pub mod placement;
pub mod prepare;
pub mod probes;
pub mod processes;

use std::collections::BTreeMap;
use std::time::Duration;

use eptwin_engine::api::{BackendKind, Capabilities, OpOutcome, OpSpec, Transport, TransportError};
use eptwin_engine::api::{EpMode, OpKind, Plan};
use serde_json::{Value, json};

use crate::environment::Environment;
use crate::error::HwError;
use crate::family::OpRun;
use crate::measurements::{KernelFigures, Measurements};
use crate::prepare::{Prepared, ProcessView, connect, prepare_local};
use crate::processes::{PREPARE_TIMEOUT, ProcessOp, Processes};
use eptwin_group::Launcher;

pub use crate::options::{HwOptions, RingsWanted};

pub struct HwTransport {
    options: HwOptions,
    env: Result<Environment, String>,
    /// The machine's identity, taken when it was detected (prepare takes the GPUs it uses out
    /// of the environment).
    identity: BTreeMap<String, Value>,
    state: Option<Prepared>,
    measurements: Measurements,
    /// The other processes of a multi-process run; `None`: this process runs every rank.
    procs: Option<Processes>,
    launcher: Launcher,
    hosts: Vec<String>,
}

/// How long processes wait for each other to find their GPUs.
const DETECT_TIMEOUT: Duration = Duration::from_secs(120);

impl HwTransport {
    /// Every rank in this process, started without a launcher.
    pub fn new(options: HwOptions) -> Self {
        HwTransport::single(options, Launcher::Single)
    }

    /// Every rank in this process, started by `launcher` (a launch of one process).
    pub fn single(options: HwOptions, launcher: Launcher) -> Self {
        let env = environment::detect();
        HwTransport {
            options,
            identity: env.as_ref().map(environment::identity).unwrap_or_default(),
            env,
            state: None,
            measurements: Measurements::default(),
            procs: None,
            launcher,
            hosts: vec![eptwin_group::system_hostname()],
        }
    }

    /// This process's block of ranks in a multi-process run. Collective: every process finds
    /// its GPUs and all agree (a process without a usable GPU waives the run for all, with its
    /// reason). Fails when another process fails or leaves.
    pub fn in_processes(options: HwOptions, mut procs: Processes) -> Result<Self, HwError> {
        let env = environment::detect();
        let local = env.as_ref().map(|_| ()).map_err(|r| HwError::Unavailable(r.clone()));
        let env = match procs.agree_on("GPU detection", local, DETECT_TIMEOUT) {
            Ok(()) => env,
            Err(HwError::Unsupported(reason)) => Err(reason),
            Err(other) => return Err(other),
        };
        Ok(HwTransport {
            options,
            identity: env.as_ref().map(environment::identity).unwrap_or_default(),
            env,
            state: None,
            measurements: Measurements::default(),
            launcher: procs.launcher(),
            hosts: procs.hosts(),
            procs: Some(procs),
        })
    }

    /// Ends the run's process group after a last barrier (nothing for a single process);
    /// every process calls it once its run loop is done.
    pub fn finish(mut self, timeout: Duration) -> Result<(), eptwin_group::GroupError> {
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
        let report = self.state.as_ref().and_then(Prepared::wire_report);
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
    fn run_op(state: &mut Prepared, op: &OpRun<'_>) -> Result<ProcessOp, HwError> {
        if let Some(f) = &state.faults {
            f.before_op(&mut state.devs, op.op, op.iteration, op.warmup);
        }
        let sample = state.family.run_op(&mut state.devs, op)?;
        let rank_digests = state.family.take_rank_digests().unwrap_or_default();
        Ok(ProcessOp { sample, rank_digests })
    }

    /// The op's sample, merged over the processes of a multi-process run (the same on every
    /// process); a failure here is told to the others at once, since peers may be blocked in a
    /// GPU wait on this process.
    fn run_everywhere(
        state: &mut Prepared,
        procs: Option<&mut Processes>,
        op: &OpRun<'_>,
    ) -> Result<ProcessOp, HwError> {
        let local = HwTransport::run_op(state, op);
        let Some(p) = procs else { return local };
        let local = match local {
            Err(e) if !matches!(e, HwError::Unsupported(_)) => return Err(p.abort(e)),
            other => other,
        };
        let timeout = Duration::from_millis(state.devs.host_timeout_ms) + Duration::from_secs(120);
        let warmup = if op.warmup { "warmup " } else { "" };
        let label = format!("{warmup}{} iteration {}", op.op, op.iteration);
        p.merge_op(&label, local, timeout)
    }
}

/// The wire scenarios that span nodes would use here, or why there is none (an invalid
/// `EPTWIN_WIRE`, verbs asked for without an ACTIVE port). TCP is always there.
fn wire_choice(options: &HwOptions) -> Result<eptwin_wire::WireChoice, String> {
    let request = options.wire.clone()?;
    eptwin_wire::choose(request).map_err(|e| e.to_string())
}

/// The op's kernel figures from the timed samples so far, against the ceilings measured in
/// the same run.
fn kernel_figures(state: &Prepared, op: OpKind) -> Option<KernelFigures> {
    KernelFigures::new(
        state.latencies_ns.get(&op)?,
        state.logical_bytes.get(&op).copied().unwrap_or(0.0),
        state.transported_bytes.get(&op).copied().unwrap_or(0) as f64,
        state.memcpy_gbps,
        state.nccl_us.get(&op).copied(),
    )
}

impl Transport for HwTransport {
    fn capabilities(&self) -> Capabilities {
        let unavailable = |reason: &String| Capabilities {
            backend: BackendKind::Hw,
            identity: self.process_identity().into_iter().collect(),
            unavailable: Some(reason.clone()),
            modes: Vec::new(),
            elastic: false,
            traffic: false,
            concurrent_jobs: false,
            max_ranks: None,
            rdma: false,
            rdma_reason: None,
        };
        if let Err(reason) = &self.env {
            return unavailable(reason);
        }
        let wire = wire_choice(&self.options);
        Capabilities {
            backend: BackendKind::Hw,
            identity: self.identity.clone().into_iter().chain(self.process_identity()).collect(),
            unavailable: None,
            modes: vec![EpMode::Intranode, EpMode::Internode, EpMode::LowLatency],
            elastic: false,
            traffic: false,
            concurrent_jobs: false,
            max_ranks: None,
            rdma: wire.is_ok(),
            rdma_reason: wire.err(),
        }
    }

    fn prepare(&mut self, plan: &Plan) -> Result<(), TransportError> {
        let env = match &mut self.env {
            Ok(env) => env,
            Err(reason) => return Err(TransportError::Unsupported(reason.clone())),
        };
        let view =
            self.procs.as_ref().map(|p| ProcessView { block: p.my_block(), processes: p.count() });
        let m = &mut self.measurements;
        let local = prepare_local(&self.options, env, plan, m, view.as_ref());
        // Every process has done its own part; a waiver or failure anywhere is everyone's.
        let mut state = match self.procs.as_mut() {
            Some(p) => {
                p.agree_on("prepare (placement, kernels, buffers)", local, PREPARE_TIMEOUT)?
            }
            None => local?,
        };
        if let Err(e) = connect(&self.options, &mut state, self.procs.as_mut(), m) {
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
        let gpu_of_rank = state.placement.gpu_of_rank.clone();
        let run = OpRun {
            job: *job,
            op: *op,
            iteration: *iteration,
            warmup: *warmup,
            gpu_of_rank: &gpu_of_rank,
        };
        let merged = HwTransport::run_everywhere(state, self.procs.as_mut(), &run)?;
        let sample = merged.sample;
        let m = &mut self.measurements;
        for (rank, digest) in merged.rank_digests {
            m.output_digests.insert((*op, rank), digest);
        }
        if !*warmup {
            state.latencies_ns.entry(*op).or_default().push(sample.latency_ns);
            state.transported_bytes.insert(*op, sample.nvlink_bytes);
            // Without a positive mean the figures so far stand.
            if let Some(figures) = kernel_figures(state, *op) {
                m.ops.entry(*op).or_default().kernel = Some(figures);
            }
        }
        Ok(OpOutcome { samples: vec![sample], measurements: m.to_map() })
    }
}

/// The NVML implementation of the engine's `TopologyProbe`, or why there is none here.
pub fn nvml_probe() -> Result<Box<dyn eptwin_engine::api::TopologyProbe>, String> {
    let api = nvml::RealNvml::init()?;
    let probe = nvml::NvmlProbe::new(api, nvml::cuda_bus_ids())?;
    Ok(Box::new(probe))
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
