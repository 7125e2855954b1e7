//! Normal-mode intranode dispatch and combine on the hardware: buffers, launches, and the
//! checks DeepEP's `test_intranode.py` makes (rows arrive where the layout says, per-expert
//! counts, combine = reference reduction within bf16 rounding).
//!
//! `prepare` sets a job up (buffers, argument arrays), `launch` runs and times the ops, `check`
//! holds the host checks; `args` mirrors the kernels' structs, `layout` the NVL buffer, `expect`
//! derives what each rank must receive, `rings` chooses where the rings live. A job whose ranks
//! span nodes runs internode.cu over the wire instead (`across_nodes`), with the same checks.

mod across_nodes;
mod args;
mod check;
mod expect;
mod launch;
mod layout;
mod prepare;
mod rings;
mod warp_times;

use std::collections::BTreeMap;

use eptwin_engine::deepep::config::Config;
use eptwin_engine::routing::RoutingTable;

pub use expect::{RecvExpectation, expectations};
pub use layout::NvlLayout;
pub use rings::{ClusterRings, ClusterShape, MAX_DYNAMIC_SMEM_BYTES, RingInputs, cluster_shape};

use crate::cuda::DeviceBuffer;
use crate::data::RankTokens;
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
    /// (rows moved, payload bytes per row) between every (source, destination) rank pair, for the
    /// NCCL baseline: dispatch sends `logical_row_bytes` rows, combine sends them back as BF16.
    pub fn pair_rows(&self) -> Vec<Vec<u64>> {
        let n = self.n as usize;
        let mut rows = vec![vec![0u64; n]; n];
        for (d, e) in self.expect.iter().enumerate() {
            for &(s, _) in &e.rows {
                rows[s as usize][d] += 1;
            }
        }
        rows
    }

    pub fn received_rows(&self) -> u64 {
        self.expect.iter().map(|e| e.rows.len() as u64).sum()
    }

    /// Rows this process's ranks receive in dispatch (and send back in combine).
    fn local_received_rows(&self) -> u64 {
        self.bufs.keys().map(|&r| self.expect[r as usize].rows.len() as u64).sum()
    }

    /// The output digest of each local rank on the last op's host-checked iteration, once.
    pub fn take_rank_digests(&mut self) -> Option<BTreeMap<u32, u64>> {
        self.rank_digests.take()
    }
}
