//! A kernel family: how the hardware runs one DeepEP mode, behind one trait the backend drives
//! in order (`lib.rs`): [`KernelFamily::fit`] compiles the family's kernels for the placement
//! and sizes their launch from occupancy, `prepare` allocates this process's ranks' buffers and
//! test tokens, `connect` reaches the peers (CUDA IPC) and the wire, `run_op` times one
//! dispatch or combine and checks it, and `report` says what ran as a typed struct. Crossing
//! nodes is each family's wire option ([`FamilyContext::crossing`]), not a family of its own.
//!
//! * [`crate::normal`] — the normal kernels: `intranode.cu` (global-memory rings) or
//!   `intranode_cluster.cu` (rings in cluster shared memory) on one node, `internode.cu` over
//!   the wire when the ranks span nodes.
//! * [`crate::low_latency`] — `low_latency.cu`, with the peers the plan's path rule puts on
//!   RDMA behind the wire.

use std::collections::BTreeMap;

use eptwin_engine::api::JobId;
use eptwin_engine::api::OpSample;
use eptwin_engine::api::{DeepEpJob, JobPlan, OpKind};

use crate::compile::Compiler;
use crate::crossing::Crossing;
use crate::error::HwError;
use crate::exec::Devices;
use crate::kernel_defines::FlagScope;
use crate::measurements::KernelReport;
use crate::options::HwOptions;
use crate::placement::Placement;
use crate::processes::Processes;
use eptwin_wire::WireReport;

/// What a family's `fit` and `prepare` read: the job as the backend runs it, this process's
/// GPUs and the compiler, the placement and the job's wire option.
pub struct FamilyContext<'a> {
    pub options: &'a HwOptions,
    pub job: &'a JobPlan,
    /// The job's DeepEP part as it runs (`EPTWIN_NORMAL_SMS` may override its `num_sms`).
    pub deepep: &'a DeepEpJob,
    pub devs: &'a mut Devices,
    pub compiler: &'a Compiler,
    pub placement: &'a Placement,
    /// The processes of a multi-process run; `None`: this process runs every rank.
    pub processes: Option<usize>,
    /// The bytes that cross the wire, when some do.
    pub crossing: Option<&'a Crossing>,
    /// The scope of the flags between ranks (`.sys` when peers sit on other GPUs).
    pub scope: FlagScope,
}

impl FamilyContext<'_> {
    /// SMs of the first GPU (every GPU of a placement is the same model).
    pub fn sm_count(&self) -> u32 {
        self.devs.list[0].gpu.sm_count
    }

    /// Ranks of every process on GPU `ordinal`: launches share a GPU's resident blocks.
    pub fn ranks_on_gpu(&self, ordinal: usize) -> u32 {
        self.placement.ranks_on(ordinal as u32).len() as u32
    }

    /// The most ranks any GPU of the placement runs.
    pub fn max_ranks_per_gpu(&self) -> u32 {
        let gpus = &self.placement.gpus;
        gpus.iter().map(|&g| self.ranks_on_gpu(g as usize)).max().unwrap_or(1)
    }

    /// Every rank of the job in one launch: on one GPU, in one process.
    pub fn one_launch(&self) -> bool {
        self.processes.is_none() && self.placement.gpus.len() == 1
    }

    /// SMs each rank has on a fully shared GPU (three decimals, as results give it).
    pub fn effective_sms_per_rank(&self) -> f64 {
        crate::measurements::round3(self.sm_count() as f64 / self.max_ranks_per_gpu() as f64)
    }

    /// `Setup` failure of this job.
    pub fn setup_error(&self, message: String) -> HwError {
        HwError::Setup { context: format!("job {:?}", self.job.name), message }
    }
}

/// One op of the job as the run loop asks for it.
#[derive(Debug, Clone, Copy)]
pub struct OpRun<'a> {
    pub job: JobId,
    pub op: OpKind,
    pub iteration: u32,
    pub warmup: bool,
    /// The GPU ordinal of every job rank.
    pub gpu_of_rank: &'a [u32],
}

impl OpRun<'_> {
    /// The host-checked iteration: the first timed one.
    pub fn checked(&self) -> bool {
        !self.warmup && self.iteration == 0
    }
}

/// What the NCCL baseline moves for a family's job: rows between every (source, destination)
/// rank pair in dispatch (combine sends them back), and the bytes of one row each way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaselineTraffic {
    pub pair_rows: Vec<Vec<u64>>,
    pub dispatch_row_bytes: u64,
    pub combine_row_bytes: u64,
}

/// How the hardware runs one DeepEP mode (the module docs give the order the backend calls it
/// in). `fit` makes the family; every other step acts on it.
pub trait KernelFamily {
    /// Compile the family's kernels for this placement and size their launch from occupancy;
    /// refuses (waives) a job the kernels cannot run here.
    fn fit(ctx: &mut FamilyContext<'_>) -> Result<Self, HwError>
    where
        Self: Sized;

    /// Test tokens, this process's ranks' buffers and the wire's per-rank state.
    fn prepare(&mut self, ctx: &mut FamilyContext<'_>) -> Result<(), HwError>;

    /// The peers' buffers (mapped from other processes through CUDA IPC) and the wire between
    /// nodes; the kernels' argument arrays. Collective in a multi-process run.
    fn connect(&mut self, devs: &Devices, procs: Option<&mut Processes>) -> Result<(), HwError>;

    /// One timed dispatch or combine on this process's ranks, checked on the host on the
    /// first timed iteration.
    fn run_op(&mut self, devs: &mut Devices, op: &OpRun<'_>) -> Result<OpSample, HwError>;

    /// Each local rank's output digest of the last op's host-checked iteration, once.
    fn take_rank_digests(&mut self) -> Option<BTreeMap<u32, u64>>;

    /// The kernels' launch shape and resources, for the result's measurements.
    fn report(&self) -> KernelReport;

    /// The wire that carried this job's bytes between nodes, once connected.
    fn wire_report(&self) -> Option<&WireReport>;

    /// What the NCCL all-to-all baseline moves for this job.
    fn baseline_traffic(&self) -> Result<BaselineTraffic, HwError>;
}

/// The steps of [`KernelFamily`] a family leaves to its prepared job: for a family struct with
/// a field `job: Option<J>` set by `prepare`, where `J` has `connect`, `dispatch`, `combine`,
/// `wire_report` and `baseline_traffic` methods and a `rank_digests: Option<BTreeMap<u32, u64>>`
/// field. Used inside `impl KernelFamily for ...`.
macro_rules! steps_of_the_prepared_job {
    () => {
        fn connect(
            &mut self,
            devs: &$crate::exec::Devices,
            procs: Option<&mut $crate::processes::Processes>,
        ) -> Result<(), $crate::error::HwError> {
            $crate::family::prepared(&mut self.job)?.connect(devs, procs)
        }

        fn run_op(
            &mut self,
            devs: &mut $crate::exec::Devices,
            op: &$crate::family::OpRun<'_>,
        ) -> Result<eptwin_engine::api::OpSample, $crate::error::HwError> {
            let job = $crate::family::prepared(&mut self.job)?;
            match op.op {
                eptwin_engine::api::OpKind::Dispatch => job.dispatch(devs, op),
                eptwin_engine::api::OpKind::Combine => job.combine(devs, op),
                other => Err($crate::family::op_error(other)),
            }
        }

        fn take_rank_digests(&mut self) -> Option<std::collections::BTreeMap<u32, u64>> {
            self.job.as_mut()?.rank_digests.take()
        }

        fn wire_report(&self) -> Option<&eptwin_wire::WireReport> {
            self.job.as_ref()?.wire_report()
        }

        fn baseline_traffic(
            &self,
        ) -> Result<$crate::family::BaselineTraffic, $crate::error::HwError> {
            Ok($crate::family::prepared_ref(&self.job)?.baseline_traffic())
        }
    };
}
pub(crate) use steps_of_the_prepared_job;

/// The prepared state of a family (set by `prepare`), or the failure of a step asked for
/// before it.
pub fn prepared<T>(state: &mut Option<T>) -> Result<&mut T, HwError> {
    state.as_mut().ok_or_else(before_prepare)
}

/// [`prepared`] for a step that only reads the state.
pub fn prepared_ref<T>(state: &Option<T>) -> Result<&T, HwError> {
    state.as_ref().ok_or_else(before_prepare)
}

fn before_prepare() -> HwError {
    HwError::Setup {
        context: "hw".into(),
        message: "the kernel family was asked to run before prepare".into(),
    }
}

/// The failure of an op a DeepEP kernel family does not run.
pub fn op_error(op: OpKind) -> HwError {
    HwError::Unsupported(format!("op {op} is not a DeepEP dispatch or combine"))
}
