//! The normal kernels as a [`KernelFamily`]: DeepEP's normal dispatch and combine with the
//! checks of `test_intranode.py` (rows arrive where the layout says, per-expert counts, combine
//! = reference reduction within bf16 rounding). On one node `intranode.cu` runs over rings in
//! the receiver's NVL buffer, or `intranode_cluster.cu` over rings in thread-block cluster
//! shared memory; a job whose ranks span nodes runs `internode.cu` over the wire instead
//! (`across_nodes`), with the same checks.
//!
//! `fit` compiles and sizes the kernels, `prepare` sets a job up (buffers, argument arrays),
//! `launch` runs and times the ops, `check` holds the host checks; `args` mirrors the kernels'
//! structs, `layout` the NVL buffer, `expect` derives what each rank must receive, `rings`
//! chooses where the rings live.

mod across_nodes;
mod args;
mod check;
mod expect;
mod fit;
mod launch;
mod layout;
mod prepare;
mod rings;
mod warp_times;

use std::collections::BTreeMap;

use eptwin_engine::api::{Config, Dtype, RoutingTable, logical_row_bytes};

pub use expect::{RecvExpectation, expectations};
pub use layout::NvlLayout;
pub use rings::{ClusterRings, ClusterShape, MAX_DYNAMIC_SMEM_BYTES, RingInputs, cluster_shape};

use crate::cuda::DeviceBuffer;
use crate::data::RankTokens;
use crate::error::HwError;
use crate::family::{self, BaselineTraffic, FamilyContext, KernelFamily};
use crate::measurements::KernelReport;
use crate::processes::SharedBuffers;

/// Device buffers of one rank.
struct RankBuffers {
    x: DeviceBuffer,
    x_scales: DeviceBuffer,
    topk_idx: DeviceBuffer,
    topk_weights: DeviceBuffer,
    is_token_in_rank: DeviceBuffer,
    num_tokens_per_rank: DeviceBuffer,
    num_tokens_per_expert: DeviceBuffer,
    channel_prefix_matrix: DeviceBuffer,
    send_head: DeviceBuffer,
    rank_prefix: DeviceBuffer,
    num_recv_tokens_per_expert: DeviceBuffer,
    num_recv_tokens: DeviceBuffer,
    recv_x: DeviceBuffer,
    recv_x_scales: DeviceBuffer,
    recv_src_idx: DeviceBuffer,
    recv_topk_idx: DeviceBuffer,
    recv_topk_weights: DeviceBuffer,
    recv_channel_offset: DeviceBuffer,
    combine_x: DeviceBuffer,
    combined_x: DeviceBuffer,
    combined_topk_weights: DeviceBuffer,
    buffer: DeviceBuffer,
}

/// Grid and kernel resources, recorded in the result's measurements.
#[derive(Debug, Clone)]
pub struct NormalLaunch {
    pub threads: u32,
    pub min_blocks: u32,
    pub blocks_per_rank: u32,
    pub blocks_per_gpu: u32,
    pub resident_blocks_per_sm: u32,
    pub registers: i32,
    pub local_bytes: i32,
    /// Where the rings live (`ClusterRings::choose`).
    pub rings: ClusterRings,
}

pub struct NormalJob {
    n: u32,
    hidden: u32,
    topk: u32,
    experts: u32,
    channels: u32,
    dispatch_config: Config,
    combine_config: Config,
    fp8: bool,
    layout: NvlLayout,
    tokens: Vec<RankTokens>,
    routing: RoutingTable,
    expect: Vec<RecvExpectation>,
    /// This process's ranks (every rank in a single-process run), by job rank.
    bufs: BTreeMap<u32, RankBuffers>,
    /// Per GPU: device array of every rank's args (peer pointers included); set by `connect`.
    args: Vec<DeviceBuffer>,
    layout_args: Vec<DeviceBuffer>,
    /// Other processes' NVL buffers mapped here (kept alive while the kernels use them).
    peers: Option<SharedBuffers>,
    epoch: i32,
    /// Drop consumed ring lines from L2 in combine (`HwOptions::l2_discard`) and in dispatch
    /// (`HwOptions::discard_in_dispatch`).
    use_discard: bool,
    discard_in_dispatch: bool,
    dispatched: bool,
    reference_digest: [Option<u64>; 2],
    /// Each local rank's output digest of the host-checked iteration of the last op.
    rank_digests: Option<BTreeMap<u32, u64>>,
    pub launch: NormalLaunch,
    /// `EPTWIN_CLUSTER_TIMES=1`: per block of the cluster kernels, its start and every warp's
    /// finish (globaltimer ns), reported after the host-checked iteration.
    warp_times: Option<DeviceBuffer>,
    /// Ranks on several nodes: internode.cu over the wire instead of the intranode kernels.
    across: Option<Box<across_nodes::AcrossNodes>>,
}

fn payload_bytes(hidden: u32, fp8: bool) -> u64 {
    if fp8 { hidden as u64 } else { 2 * hidden as u64 }
}

impl NormalJob {
    /// Rows from every source rank to every destination rank in dispatch (combine sends them
    /// back): the NCCL baseline's volumes.
    fn pair_rows(&self) -> Vec<Vec<u64>> {
        let n = self.n as usize;
        let mut rows = vec![vec![0u64; n]; n];
        for (d, e) in self.expect.iter().enumerate() {
            for &(s, _) in &e.rows {
                rows[s as usize][d] += 1;
            }
        }
        rows
    }

    /// Rows this process's ranks receive in dispatch (and send back in combine).
    fn local_received_rows(&self) -> u64 {
        self.bufs.keys().map(|&r| self.expect[r as usize].rows.len() as u64).sum()
    }

    /// The NCCL baseline moves the rows of dispatch (FP8 or BF16 as DeepEP's tests count
    /// them) and of combine (BF16).
    fn baseline_traffic(&self) -> BaselineTraffic {
        let dtype = if self.fp8 { Dtype::Fp8 } else { Dtype::Bf16 };
        BaselineTraffic {
            pair_rows: self.pair_rows(),
            dispatch_row_bytes: logical_row_bytes(self.hidden, dtype),
            combine_row_bytes: 2 * self.hidden as u64,
        }
    }
}

/// The normal kernels: fitted to the placement, then a prepared job.
pub struct Normal {
    launch: NormalLaunch,
    report: KernelReport,
    job: Option<NormalJob>,
}

impl KernelFamily for Normal {
    fn fit(ctx: &mut FamilyContext<'_>) -> Result<Normal, HwError> {
        // An internode job always crosses nodes here (`prepare::prepare_local` waives one
        // whose ranks share a node).
        let (launch, report) = match ctx.crossing {
            Some(crossing) => (fit::fit_across_nodes(ctx, crossing)?, KernelReport::default()),
            None => fit::fit_one_node(ctx)?,
        };
        Ok(Normal { launch, report, job: None })
    }

    fn prepare(&mut self, ctx: &mut FamilyContext<'_>) -> Result<(), HwError> {
        let launch = self.launch.clone();
        let job = match ctx.crossing {
            Some(crossing) => NormalJob::prepare_across_nodes(ctx, launch, crossing)?,
            None => NormalJob::prepare(ctx, launch)?,
        };
        if let Some(kernels) = job.across_nodes_kernels(ctx.effective_sms_per_rank()) {
            self.report.internode = Some(kernels);
        }
        self.job = Some(job);
        Ok(())
    }

    family::steps_of_the_prepared_job!();

    fn report(&self) -> KernelReport {
        self.report.clone()
    }
}
