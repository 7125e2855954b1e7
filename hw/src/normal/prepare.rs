//! Setting up a normal job: the configs and shapes it needs, the test tokens, this process's
//! ranks' device buffers, and the argument arrays the kernels read (peer pointers included,
//! mapped from other processes in a multi-process run).

use std::collections::BTreeMap;

use eptwin_engine::api::Dtype;
use eptwin_engine::api::{RoutingTable, Workload};

use super::args::{LayoutRankArgs, NormalRankArgs};
use super::warp_times::{CLUSTER_RING_STAMPS, CLUSTER_TOKEN_STAMPS};
use super::{
    NormalJob, NormalLaunch, NvlLayout, RankBuffers, RecvExpectation, expectations, payload_bytes,
};
use crate::cuda::DeviceBuffer;
use crate::data::{self, RankTokens};
use crate::error::HwError;
use crate::exec::{Devices, dev_of};
use crate::family::FamilyContext;
use crate::processes::share_buffers;

impl NormalJob {
    /// Everything this process does alone: tokens, its ranks' buffers (`devs` holds exactly
    /// its ranks), the layout kernel's arguments. [`NormalJob::connect`] then builds the
    /// arguments that reach the peers.
    pub fn prepare(
        ctx: &mut FamilyContext<'_>,
        launch: NormalLaunch,
    ) -> Result<NormalJob, HwError> {
        let (job, d, options) = (ctx.job, ctx.deepep, ctx.options);
        let (devs, gpu_of_rank) = (&mut *ctx.devs, ctx.placement.gpu_of_rank.as_slice());
        let n = job.num_ranks();
        let w = &d.workload;
        let setup =
            |m: String| HwError::Setup { context: format!("job {:?}", job.name), message: m };
        let (Some(dc), Some(cc)) = (d.dispatch_config, d.combine_config) else {
            return Err(setup("normal mode without dispatch/combine configs".into()));
        };
        if !(w.hidden.is_multiple_of(128) && w.topk <= 32 && w.experts.is_multiple_of(n)) {
            return Err(setup(format!(
                "hidden {} (multiple of 128), topk {} (≤ 32), experts {} (multiple of ranks)",
                w.hidden, w.topk, w.experts
            )));
        }
        let fp8 = match w.dispatch_dtype {
            Dtype::Fp8 => true,
            Dtype::Bf16 => false,
            Dtype::Logfmt => {
                return Err(HwError::Unsupported("LogFMT is a combine encoding".into()));
            }
        };
        if w.combine_dtype != Dtype::Bf16 {
            return Err(HwError::Unsupported(format!(
                "normal combine in {:?}: the hardware backend implements BF16 combine",
                w.combine_dtype
            )));
        }
        let channels = dc.num_sms / 2;
        let l = w.experts / n;
        let slot_bytes = payload_bytes(w.hidden, fp8).max(2 * w.hidden as u64).div_ceil(128) * 128;
        let ring = dc.num_max_nvl_chunked_recv_tokens.max(cc.num_max_nvl_chunked_recv_tokens);
        let scales = if fp8 { w.hidden / 128 } else { 0 };
        let layout = NvlLayout::new(
            n as u64,
            l as u64,
            channels as u64,
            ring as u64,
            slot_bytes,
            w.topk as u64,
            scales as u64,
        );
        // The combine reducer addresses ring slots with 31-bit int4 offsets.
        if (layout.src_idx - layout.x) / 16 >= 1 << 31 {
            return Err(setup(format!(
                "ring area of {} bytes per rank exceeds the kernels' 31-bit int4 offsets",
                layout.src_idx - layout.x
            )));
        }
        let routing = d.routing().clone();
        let expect = expectations(&routing, channels);
        let tokens: Vec<RankTokens> = data::generate_ranks(w, n);

        let t = w.tokens_per_rank as usize;
        let bufs = alloc_rank_buffers(
            devs,
            gpu_of_rank,
            w,
            &routing,
            &tokens,
            &expect,
            fp8,
            channels,
            layout.total as usize,
        )?;
        let layout_args = layout_kernel_args(devs, &bufs, t)?;
        devs.sync("normal setup")?;
        Ok(NormalJob {
            n,
            hidden: w.hidden,
            topk: w.topk,
            experts: w.experts,
            channels,
            dispatch_config: dc,
            combine_config: cc,
            fp8,
            layout,
            tokens,
            routing,
            expect,
            bufs,
            args: Vec::new(),
            layout_args,
            peers: None,
            epoch: 0,
            use_discard: options.l2_discard,
            discard_in_dispatch: options.discard_in_dispatch(),
            dispatched: false,
            reference_digest: [None, None],
            rank_digests: None,
            warp_times: if options.cluster_times && launch.rings.any() {
                // Up to 4 warps per rank per block (the combine) plus the start, and the
                // combine's per-token and per-ring stamps, per block.
                let words = (channels
                    * n
                    * (1 + 4 * n + 2 * CLUSTER_TOKEN_STAMPS + n * CLUSTER_RING_STAMPS))
                    as usize;
                let buf = devs.list[0].gpu.alloc(words * 8)?;
                // Zero: a block whose channel has fewer tokens than stamps leaves the rest.
                devs.list[0].gpu.memset_u32(buf.ptr, 0, words * 2)?;
                Some(buf)
            } else {
                None
            },
            launch,
            across: None,
        })
    }

    /// The per-GPU argument arrays the kernels read: this process's ranks' buffers, and the
    /// peers' NVL buffers (the only field the kernels read of another rank) mapped from other
    /// processes. Collective in a multi-process run.
    pub fn connect(
        &mut self,
        devs: &Devices,
        mut procs: Option<&mut crate::processes::Processes>,
    ) -> Result<(), HwError> {
        if self.across.is_some() {
            return self.connect_across(devs, procs.as_deref_mut());
        }
        let exported: BTreeMap<u32, Vec<&DeviceBuffer>> =
            self.bufs.iter().map(|(&r, b)| (r, vec![&b.buffer])).collect();
        let peers = share_buffers(procs, devs, self.n, &exported, "NVL buffers")?;
        let (fp8, t) = (self.fp8, self.routing.tokens_per_rank as i32);
        let mut args = Vec::with_capacity(devs.list.len());
        for (i, dev) in devs.list.iter().enumerate() {
            let all: Vec<NormalRankArgs> = (0..self.n)
                .map(|r| match self.bufs.get(&r) {
                    Some(b) => NormalRankArgs {
                        x: b.x.ptr,
                        x_scales: if fp8 { b.x_scales.ptr } else { 0 },
                        topk_idx: b.topk_idx.ptr,
                        topk_weights: b.topk_weights.ptr,
                        is_token_in_rank: b.is_token_in_rank.ptr,
                        num_tokens_per_rank: b.num_tokens_per_rank.ptr,
                        num_tokens_per_expert: b.num_tokens_per_expert.ptr,
                        channel_prefix_matrix: b.channel_prefix_matrix.ptr,
                        send_head: b.send_head.ptr,
                        rank_prefix: b.rank_prefix.ptr,
                        num_recv_tokens_per_expert: b.num_recv_tokens_per_expert.ptr,
                        num_recv_tokens: b.num_recv_tokens.ptr,
                        recv_x: b.recv_x.ptr,
                        recv_x_scales: b.recv_x_scales.ptr,
                        recv_src_idx: b.recv_src_idx.ptr,
                        recv_topk_idx: b.recv_topk_idx.ptr,
                        recv_topk_weights: b.recv_topk_weights.ptr,
                        recv_channel_offset: b.recv_channel_offset.ptr,
                        combine_x: b.combine_x.ptr,
                        combine_topk_weights: b.recv_topk_weights.ptr,
                        combined_x: b.combined_x.ptr,
                        combined_topk_weights: b.combined_topk_weights.ptr,
                        buffer: b.buffer.ptr,
                        num_tokens: t,
                        reserved: 0,
                    },
                    None => NormalRankArgs {
                        buffer: peers.ptr(i, r, 0),
                        num_tokens: t,
                        ..NormalRankArgs::default()
                    },
                })
                .collect();
            args.push(dev.gpu.alloc_from(&all)?);
        }
        devs.sync("normal arguments")?;
        self.args = args;
        self.peers = Some(peers);
        Ok(())
    }
}

/// This process's ranks' device buffers (the ranks `devs` holds), inputs uploaded (tokens,
/// top-k), the NVL buffer (`nvl_bytes`) zeroed once: its counters only grow.
#[allow(clippy::too_many_arguments)]
pub(super) fn alloc_rank_buffers(
    devs: &mut Devices,
    gpu_of_rank: &[u32],
    w: &Workload,
    routing: &RoutingTable,
    tokens: &[RankTokens],
    expect: &[RecvExpectation],
    fp8: bool,
    channels: u32,
    nvl_bytes: usize,
) -> Result<BTreeMap<u32, RankBuffers>, HwError> {
    let n = routing.num_ranks;
    let l = w.experts / n;
    let t = w.tokens_per_rank as usize;
    let (h, k, nn, e) = (w.hidden as usize, w.topk as usize, n as usize, w.experts as usize);
    let pay = payload_bytes(w.hidden, fp8) as usize;
    let local: Vec<u32> = devs.list.iter().flat_map(|d| d.ranks.iter().copied()).collect();
    let mut bufs = BTreeMap::new();
    for &rank in &local {
        let r = rank as usize;
        let dev = dev_of(devs, gpu_of_rank[r]);
        let g = &dev.gpu;
        let recv = expect[r].rows.len().max(1);
        let b = RankBuffers {
            x: g.alloc(t * pay)?,
            x_scales: g.alloc(t * h / 128 * 4)?,
            topk_idx: g.alloc(t * k * 4)?,
            topk_weights: g.alloc(t * k * 4)?,
            is_token_in_rank: g.alloc(t * nn)?,
            num_tokens_per_rank: g.alloc(nn * 4)?,
            num_tokens_per_expert: g.alloc(e * 4)?,
            channel_prefix_matrix: g.alloc(nn * channels as usize * 4)?,
            send_head: g.alloc(t * nn * 4)?,
            rank_prefix: g.alloc(nn * 4)?,
            num_recv_tokens_per_expert: g.alloc(l as usize * 4)?,
            num_recv_tokens: g.alloc(4)?,
            recv_x: g.alloc(recv * pay)?,
            recv_x_scales: g.alloc(recv * h / 128 * 4)?,
            recv_src_idx: g.alloc(recv * 4)?,
            recv_topk_idx: g.alloc(recv * k * 4)?,
            recv_topk_weights: g.alloc(recv * k * 4)?,
            recv_channel_offset: g.alloc(nn * channels as usize * 4)?,
            combine_x: g.alloc(recv * h * 2)?,
            combined_x: g.alloc(t * h * 2)?,
            combined_topk_weights: g.alloc(t * k * 4)?,
            buffer: g.alloc(nvl_bytes)?,
        };
        let tok = &tokens[r];
        if fp8 {
            g.upload(&b.x, &tok.fp8)?;
            g.upload(&b.x_scales, &tok.scales)?;
        } else {
            g.upload(&b.x, &tok.bf16)?;
        }
        let base = r * t * k;
        g.upload(&b.topk_idx, &routing.topk_idx[base..base + t * k])?;
        g.upload(&b.topk_weights, &routing.topk_weights[base..base + t * k])?;
        // Its counters (the barrier, the internode rings') only grow: zero it once.
        g.memset_u8(b.buffer.ptr, 0, nvl_bytes)?;
        bufs.insert(rank, b);
    }
    Ok(bufs)
}

/// Per GPU, the layout kernel's arguments of the ranks placed there (it indexes them by local
/// rank).
pub(super) fn layout_kernel_args(
    devs: &Devices,
    bufs: &BTreeMap<u32, RankBuffers>,
    t: usize,
) -> Result<Vec<DeviceBuffer>, HwError> {
    devs.list
        .iter()
        .map(|dev| {
            let local: Vec<LayoutRankArgs> = dev
                .ranks
                .iter()
                .map(|r| {
                    let b = &bufs[r];
                    LayoutRankArgs {
                        topk_idx: b.topk_idx.ptr,
                        num_tokens_per_rank: b.num_tokens_per_rank.ptr,
                        num_tokens_per_expert: b.num_tokens_per_expert.ptr,
                        is_token_in_rank: b.is_token_in_rank.ptr,
                        num_tokens: t as i32,
                        reserved: 0,
                    }
                })
                .collect();
            dev.gpu.alloc_from(&local)
        })
        .collect()
}
