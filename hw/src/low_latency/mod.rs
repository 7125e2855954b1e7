//! Low-latency dispatch and combine on the hardware: buffers, launches and the checks of
//! DeepEP's `test_low_latency.py` (per-expert counts, layout ranges, every received message
//! equals its source token's FP8 cast, combine = top-k weighted sum within bf16 rounding).
//!
//! The family ([`LowLatency`]): `fit` compiles and sizes the kernels, `prepare` sets a job up
//! (buffers, argument arrays), `launch` runs and times the ops, `check` holds the host checks;
//! `args` mirrors the kernels' structs, `expect` derives what each local expert must receive;
//! `across_nodes` holds the wire to the ranks the plan's path rule puts on RDMA (other nodes,
//! or every peer with `allow_nvlink_for_low_latency_mode = false`).

mod across_nodes;
mod args;
mod check;
mod expect;
mod fit;
mod launch;
mod prepare;
mod times;

use std::collections::BTreeMap;

use eptwin_engine::api::{Dtype, RoutingTable, ll_combine_msg_bytes, ll_dispatch_msg_bytes};

pub use expect::{ExpertExpectation, expectations};

use crate::cuda::DeviceBuffer;
use crate::data::RankTokens;
use crate::error::HwError;
use crate::family::{self, BaselineTraffic, FamilyContext, KernelFamily};
use crate::measurements::{KernelReport, LowLatencyKernels};
use crate::processes::SharedBuffers;

const PHASE_SEND: i32 = 1;
const PHASE_RECV: i32 = 2;
/// Warps per receiving group: 8 groups of 4 warps in a 32-warp block (named barriers 2..9).
pub const WARPS_PER_GROUP: i32 = 4;
pub const LL_THREADS: u32 = 1024;
/// `LL_MAX_ITEMS_PER_BLOCK` in low_latency.cu.
const MAX_ITEMS_PER_BLOCK: u32 = 128;

struct RankBuffers {
    x: DeviceBuffer,
    topk_idx: DeviceBuffer,
    topk_weights: DeviceBuffer,
    send_buf: DeviceBuffer,
    atomic_counter: DeviceBuffer,
    finish_counter: DeviceBuffer,
    recv_buf: DeviceBuffer,
    recv_count: DeviceBuffer,
    packed_recv_x: DeviceBuffer,
    packed_recv_scales: DeviceBuffer,
    packed_recv_src_info: DeviceBuffer,
    packed_recv_slot: DeviceBuffer,
    packed_recv_layout_range: DeviceBuffer,
    packed_recv_count: DeviceBuffer,
    combine_x: DeviceBuffer,
    combine_recv_buf: DeviceBuffer,
    combine_recv_flag: DeviceBuffer,
    combined_x: DeviceBuffer,
}

#[derive(Debug, Clone)]
pub struct LlLaunch {
    pub dispatch_blocks: Vec<u32>,
    pub combine_blocks: Vec<u32>,
    pub threads: u32,
    pub registers: (i32, i32),
    pub local_bytes: (i32, i32),
}

pub struct LlJob {
    n: u32,
    hidden: u32,
    topk: u32,
    experts: u32,
    max_tokens: u32,
    capacity: u32,
    fp8: bool,
    hook: bool,
    msg_bytes: u64,
    combine_slot_bytes: u64,
    tokens: Vec<RankTokens>,
    routing: RoutingTable,
    expect: Vec<Vec<ExpertExpectation>>,
    /// This process's ranks (every rank in a single-process run), by job rank.
    bufs: BTreeMap<u32, RankBuffers>,
    /// Per GPU: device array of every rank's args; set by `connect`.
    args: Vec<DeviceBuffer>,
    /// Other processes' receive buffers mapped here (kept alive while the kernels use them).
    peers: Option<SharedBuffers>,
    /// Drop consumed ring lines from L2 in combine (`HwOptions::l2_discard`) and in dispatch
    /// (`HwOptions::discard_in_dispatch`).
    use_discard: bool,
    discard_in_dispatch: bool,
    dispatched: bool,
    reference_digest: [Option<u64>; 2],
    /// Each local rank's output digest of the host-checked iteration of the last op.
    rank_digests: Option<BTreeMap<u32, u64>>,
    pub launch: LlLaunch,
    /// Ranks on several nodes: remote destinations through the wire.
    across: Option<Box<across_nodes::LlAcross>>,
    /// `EPTWIN_LL_TIMES=1`: per GPU, the combine's per-block stamps (`LL_TIME_WORDS` each).
    block_times: Vec<DeviceBuffer>,
}

impl LlJob {
    /// The wire's report when this job crosses nodes (`backend.wire`).
    pub fn wire_report(&self) -> Option<&eptwin_wire::WireReport> {
        self.across.as_ref()?.links.as_ref().map(|l| l.report())
    }

    /// Ranks per node when this job crosses nodes.
    fn ranks_per_node(&self) -> Option<u32> {
        self.across.as_ref().map(|a| a.geometry.ranks_per_node)
    }

    /// Valid (token, expert) selections over all ranks: DeepEP's LL byte counts use these.
    pub fn selections(&self) -> u64 {
        self.routing.topk_idx.iter().filter(|&&e| e >= 0).count() as u64
    }

    /// Messages this process's ranks send in dispatch (their valid selections).
    fn local_dispatch_messages(&self) -> u64 {
        let per_rank = self.routing.tokens_per_rank as usize * self.topk as usize;
        self.bufs
            .keys()
            .map(|&r| {
                let from = r as usize * per_rank;
                self.routing.topk_idx[from..from + per_rank].iter().filter(|&&e| e >= 0).count()
                    as u64
            })
            .sum()
    }

    /// Messages this process's ranks send in combine: one per token their experts received.
    fn local_combine_messages(&self) -> u64 {
        self.bufs.keys().flat_map(|&r| &self.expect[r as usize]).map(|e| e.count() as u64).sum()
    }

    /// The NCCL baseline moves a dispatch message (FP8, or the BF16 row) and a BF16 combine
    /// row per selection.
    fn baseline_traffic(&self) -> BaselineTraffic {
        BaselineTraffic {
            pair_rows: self.pair_rows(),
            dispatch_row_bytes: match self.fp8 {
                true => ll_dispatch_msg_bytes(self.hidden, Dtype::Fp8),
                false => 2 * self.hidden as u64,
            },
            combine_row_bytes: ll_combine_msg_bytes(self.hidden, Dtype::Bf16),
        }
    }

    /// Selections from each source rank to each destination rank (NCCL baseline volumes).
    fn pair_rows(&self) -> Vec<Vec<u64>> {
        let n = self.n as usize;
        let mut rows = vec![vec![0u64; n]; n];
        for (d, experts) in self.expect.iter().enumerate() {
            for ex in experts {
                for (s, v) in ex.from.iter().enumerate() {
                    rows[s][d] += v.len() as u64;
                }
            }
        }
        rows
    }
}

/// The low-latency kernels: fitted to the placement, then a prepared job.
pub struct LowLatency {
    launch: LlLaunch,
    report: LowLatencyKernels,
    job: Option<LlJob>,
}

impl KernelFamily for LowLatency {
    fn fit(ctx: &mut FamilyContext<'_>) -> Result<LowLatency, HwError> {
        let (launch, report) = fit::fit(ctx)?;
        Ok(LowLatency { launch, report, job: None })
    }

    fn prepare(&mut self, ctx: &mut FamilyContext<'_>) -> Result<(), HwError> {
        self.job = Some(LlJob::prepare(ctx, self.launch.clone())?);
        Ok(())
    }

    family::steps_of_the_prepared_job!();

    fn report(&self) -> KernelReport {
        KernelReport { low_latency: Some(self.report.clone()), ..KernelReport::default() }
    }
}

/// Dispatch message stride: 16-byte header + payload (+ scales for FP8), rounded up to a
/// 128-byte line so that consumed messages can be dropped from L2 line by line.
pub fn msg_stride(hidden: u32, fp8: bool) -> u64 {
    let bytes =
        if fp8 { 16 + hidden as u64 + hidden as u64 / 128 * 4 } else { 16 + 2 * hidden as u64 };
    bytes.div_ceil(128) * 128
}

pub fn combine_slot(hidden: u32) -> u64 {
    (2 * hidden as u64).div_ceil(128) * 128
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_strides() {
        // 16 + 7168 + 224 = 7408 bytes (DeepEP's message), padded to 58 lines.
        assert_eq!(msg_stride(7168, true), 7424);
        assert_eq!(msg_stride(7168, false), 14464);
        assert_eq!(combine_slot(7168), 14336);
    }
}
