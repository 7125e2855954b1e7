//! Normal-mode intranode dispatch and combine on the hardware: buffers, launches, and the
//! checks DeepEP's `test_intranode.py` makes (rows arrive where the layout says, per-expert
//! counts, combine = reference reduction within bf16 rounding).

use eptwin_engine::deepep::bytes::{normal_combine_token_bytes, normal_dispatch_token_bytes};
use eptwin_engine::deepep::config::Config;
use eptwin_engine::plan::{ClusterSlot, Dtype, OpKind, cluster_ring_slots};
use eptwin_engine::plan::{DeepEpJob, JobPlan};
use eptwin_engine::routing::RoutingTable;
use eptwin_engine::transport::{OpSample, PhaseTime};

use crate::cuda::DeviceBuffer;
use crate::data::{self, RankTokens};
use crate::error::HwError;
use crate::exec::{
    Devices, DigestRegion, Failures, Timer, bf16_close, digest, parallel_map, record_digest,
};
use crate::kernel_args;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct LayoutRankArgs {
    topk_idx: u64,
    num_tokens_per_rank: u64,
    num_tokens_per_expert: u64,
    is_token_in_rank: u64,
    num_tokens: i32,
    reserved: i32,
}

/// Same fields, same order as `NormalRankArgs` in intranode.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct NormalRankArgs {
    x: u64,
    x_scales: u64,
    topk_idx: u64,
    topk_weights: u64,
    is_token_in_rank: u64,
    num_tokens_per_rank: u64,
    num_tokens_per_expert: u64,
    channel_prefix_matrix: u64,
    send_head: u64,
    rank_prefix: u64,
    num_recv_tokens_per_expert: u64,
    num_recv_tokens: u64,
    recv_x: u64,
    recv_x_scales: u64,
    recv_src_idx: u64,
    recv_topk_idx: u64,
    recv_topk_weights: u64,
    recv_channel_offset: u64,
    combine_x: u64,
    combine_topk_weights: u64,
    combined_x: u64,
    combined_topk_weights: u64,
    buffer: u64,
    num_tokens: i32,
    reserved: i32,
}

/// Same fields, same order as `NormalParams` in intranode.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct NormalParams {
    timeout_ns: u64,
    off_recv_counts: u64,
    off_recv_expert_counts: u64,
    off_barrier: u64,
    off_d_start: u64,
    off_d_end: u64,
    off_d_head: u64,
    off_d_tail: u64,
    off_c_head: u64,
    off_c_tail: u64,
    off_x: u64,
    off_src_idx: u64,
    off_topk_idx: u64,
    off_topk_weights: u64,
    off_scales: u64,
    slot_bytes: u64,
    num_channels: i32,
    num_experts: i32,
    num_topk: i32,
    hidden_int4: i32,
    combine_hidden_int4: i32,
    num_scales: i32,
    nvl_send: i32,
    nvl_recv: i32,
    rank_base: i32,
    num_local_ranks: i32,
    blocks_per_rank: i32,
    use_discard: i32,
    epoch: i32,
    reserved: i32,
}

/// Byte offsets of one rank's NVL buffer (the receiver's ring buffers and notify area).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvlLayout {
    pub recv_counts: u64,
    pub recv_expert_counts: u64,
    pub barrier: u64,
    pub d_start: u64,
    pub d_end: u64,
    pub d_head: u64,
    pub d_tail: u64,
    pub c_head: u64,
    pub c_tail: u64,
    pub x: u64,
    pub src_idx: u64,
    pub topk_idx: u64,
    pub topk_weights: u64,
    pub scales: u64,
    pub slot_bytes: u64,
    pub total: u64,
}

impl NvlLayout {
    /// `n` ranks, `l` local experts, `c` channels, `r` ring slots, `slot_bytes` payload stride,
    /// `k` top-k, `s` scales per token. Every array starts on a 128-byte line.
    pub fn new(n: u64, l: u64, c: u64, r: u64, slot_bytes: u64, k: u64, s: u64) -> NvlLayout {
        let mut off = 0u64;
        let mut take = |bytes: u64| {
            let at = off;
            off = (off + bytes).div_ceil(128) * 128;
            at
        };
        let meta = c * n * 4;
        let recv_counts = take(n * 4);
        let recv_expert_counts = take(n * l * 4);
        let barrier = take(4);
        let (d_start, d_end, d_head, d_tail) = (take(meta), take(meta), take(meta), take(meta));
        let (c_head, c_tail) = (take(meta), take(meta));
        let slots = c * n * r;
        let x = take(slots * slot_bytes);
        let src_idx = take(slots * 4);
        let topk_idx = take(slots * k * 4);
        let topk_weights = take(slots * k * 4);
        let scales = take(slots * s * 4);
        NvlLayout {
            recv_counts,
            recv_expert_counts,
            barrier,
            d_start,
            d_end,
            d_head,
            d_tail,
            c_head,
            c_tail,
            x,
            src_idx,
            topk_idx,
            topk_weights,
            scales,
            slot_bytes,
            total: off,
        }
    }
}

/// What one receiving rank must end up with after dispatch.
#[derive(Debug, Clone, Default)]
pub struct RecvExpectation {
    /// (source rank, source token) of each received row, in row order.
    pub rows: Vec<(u32, u32)>,
    /// Inclusive prefix over source ranks of the rows received.
    pub rank_prefix: Vec<i32>,
    /// [source][channel] offset of the channel's first row within the source's block.
    pub channel_offset: Vec<i32>,
    pub per_expert: Vec<i32>,
}

/// The token range of a channel (DeepEP `get_channel_task_range`).
pub fn channel_range(num_tokens: u32, channels: u32, c: u32) -> (u32, u32) {
    let per = num_tokens.div_ceil(channels);
    let start = (per * c).min(num_tokens);
    (start, (start + per).min(num_tokens))
}

/// Where every token lands: for each receiver, rows ordered by source rank, then channel, then
/// token (DeepEP's intranode layout).
pub fn expectations(routing: &RoutingTable, channels: u32) -> Vec<RecvExpectation> {
    let n = routing.num_ranks;
    let l = routing.experts_per_rank();
    let mut out: Vec<RecvExpectation> = (0..n)
        .map(|_| RecvExpectation {
            rows: Vec::new(),
            rank_prefix: vec![0; n as usize],
            channel_offset: vec![0; (n * channels) as usize],
            per_expert: vec![0; l as usize],
        })
        .collect();
    let mut ranks = Vec::new();
    for s in 0..n {
        let mut before = vec![0i32; n as usize];
        for c in 0..channels {
            for d in 0..n as usize {
                out[d].channel_offset[s as usize * channels as usize + c as usize] = before[d];
            }
            let (ts, te) = channel_range(routing.tokens_per_rank, channels, c);
            for t in ts..te {
                routing.token_ranks(s, t, &mut ranks);
                for &d in &ranks {
                    out[d as usize].rows.push((s, t));
                    before[d as usize] += 1;
                }
                for &e in routing.experts(s, t) {
                    if e >= 0 {
                        let d = routing.rank_of_expert(e as u32);
                        out[d as usize].per_expert[(e as u32 - d * l) as usize] += 1;
                    }
                }
            }
        }
        for d in 0..n as usize {
            let prev = if s > 0 { out[d].rank_prefix[s as usize - 1] } else { 0 };
            out[d].rank_prefix[s as usize] = prev + before[d];
        }
    }
    out
}

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
    bufs: Vec<RankBuffers>,
    /// Per GPU: device array of every rank's args (peer pointers included).
    args: Vec<DeviceBuffer>,
    layout_args: Vec<DeviceBuffer>,
    epoch: i32,
    use_discard: bool,
    dispatched: bool,
    reference_digest: [Option<u64>; 2],
    pub launch: NormalLaunch,
    /// `EPTWIN_CLUSTER_TIMES=1`: per block of the cluster kernels, its start and every warp's
    /// finish (globaltimer ns), reported after the host-checked iteration.
    warp_times: Option<DeviceBuffer>,
}

fn payload_bytes(hidden: u32, fp8: bool) -> u64 {
    if fp8 { hidden as u64 } else { 2 * hidden as u64 }
}

impl NormalJob {
    pub fn prepare(
        devs: &mut Devices,
        job: &JobPlan,
        d: &DeepEpJob,
        gpu_of_rank: &[u32],
        use_discard: bool,
        launch: NormalLaunch,
    ) -> Result<NormalJob, HwError> {
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
        let tokens: Vec<RankTokens> = parallel_map(n as usize, |r| {
            data::generate(w.seed, r as u32, w.tokens_per_rank as usize, w.hidden as usize)
        });

        let t = w.tokens_per_rank as usize;
        let (h, k, nn, e) = (w.hidden as usize, w.topk as usize, n as usize, w.experts as usize);
        let pay = payload_bytes(w.hidden, fp8) as usize;
        let mut bufs = Vec::with_capacity(nn);
        for r in 0..nn {
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
                buffer: g.alloc(layout.total as usize)?,
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
            // The barrier counter is monotonic across ops: zero it once.
            g.memset_u8(b.buffer.ptr, 0, layout.total as usize)?;
            bufs.push(b);
        }
        let all_args: Vec<NormalRankArgs> = bufs
            .iter()
            .map(|b| NormalRankArgs {
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
                num_tokens: t as i32,
                reserved: 0,
            })
            .collect();
        let layout_rank_args: Vec<LayoutRankArgs> = bufs
            .iter()
            .map(|b| LayoutRankArgs {
                topk_idx: b.topk_idx.ptr,
                num_tokens_per_rank: b.num_tokens_per_rank.ptr,
                num_tokens_per_expert: b.num_tokens_per_expert.ptr,
                is_token_in_rank: b.is_token_in_rank.ptr,
                num_tokens: t as i32,
                reserved: 0,
            })
            .collect();
        let mut args = Vec::new();
        let mut layout_args = Vec::new();
        for dev in &devs.list {
            let a = dev.gpu.alloc(std::mem::size_of_val(all_args.as_slice()))?;
            dev.gpu.upload(&a, &all_args)?;
            args.push(a);
            // The layout kernel indexes its args by local rank.
            let local: Vec<LayoutRankArgs> =
                dev.ranks.iter().map(|&r| layout_rank_args[r as usize]).collect();
            let la = dev.gpu.alloc(std::mem::size_of_val(local.as_slice()))?;
            dev.gpu.upload(&la, &local)?;
            layout_args.push(la);
        }
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
            args,
            layout_args,
            epoch: 0,
            use_discard,
            dispatched: false,
            reference_digest: [None, None],
            warp_times: if std::env::var("EPTWIN_CLUSTER_TIMES").as_deref() == Ok("1")
                && launch.rings.any()
            {
                // Up to 4 warps per rank per block (the combine) plus the start, and the
                // combine's per-token stamps, per block.
                let words = (channels * n * (1 + 4 * n + 2 * CLUSTER_TOKEN_STAMPS)) as usize;
                let buf = devs.list[0].gpu.alloc(words * 8)?;
                // Zero: a block whose channel has fewer tokens than stamps leaves the rest.
                devs.list[0].gpu.memset_u32(buf.ptr, 0, words * 2)?;
                Some(buf)
            } else {
                None
            },
            launch,
        })
    }

    fn params(
        &self,
        devs: &Devices,
        dev_index: usize,
        cfg: &Config,
        dispatch: bool,
    ) -> NormalParams {
        let dev = &devs.list[dev_index];
        let l = &self.layout;
        NormalParams {
            timeout_ns: devs.timeout_ns(),
            off_recv_counts: l.recv_counts,
            off_recv_expert_counts: l.recv_expert_counts,
            off_barrier: l.barrier,
            off_d_start: l.d_start,
            off_d_end: l.d_end,
            off_d_head: l.d_head,
            off_d_tail: l.d_tail,
            off_c_head: l.c_head,
            off_c_tail: l.c_tail,
            off_x: l.x,
            off_src_idx: l.src_idx,
            off_topk_idx: l.topk_idx,
            off_topk_weights: l.topk_weights,
            off_scales: l.scales,
            slot_bytes: l.slot_bytes,
            num_channels: self.channels as i32,
            num_experts: self.experts as i32,
            num_topk: self.topk as i32,
            hidden_int4: (payload_bytes(self.hidden, self.fp8) / 16) as i32,
            combine_hidden_int4: (self.hidden * 2 / 16) as i32,
            num_scales: if self.fp8 { (self.hidden / 128) as i32 } else { 0 },
            nvl_send: cfg.num_max_nvl_chunked_send_tokens as i32,
            nvl_recv: cfg.num_max_nvl_chunked_recv_tokens as i32,
            rank_base: dev.rank_base() as i32,
            num_local_ranks: dev.ranks.len() as i32,
            blocks_per_rank: cfg.num_sms as i32,
            // Dropping consumed slots from L2 saves their write-back to HBM
            // (`EPTWIN_L2_DISCARD_DISPATCH=0` keeps them in dispatch; results/h200/README.md).
            use_discard: (self.use_discard && (!dispatch || discard_in_dispatch())) as i32,
            epoch: self.epoch,
            reserved: 0,
        }
    }

    /// Before the host-checked iteration, poison the ring slots too: earlier iterations left
    /// the same (correct) tokens there, which would hide a slot that is read but never written.
    fn poison_rings(&self, devs: &Devices, gpu_of_rank: &[u32]) -> Result<(), HwError> {
        for (r, b) in self.bufs.iter().enumerate() {
            let g = &dev_of_ref(devs, gpu_of_rank[r]).gpu;
            let from = self.layout.x as usize;
            g.memset_u8(b.buffer.at(from), 0xff, self.layout.total as usize - from)?;
        }
        Ok(())
    }

    /// Poison every dispatch output so that an unwritten element cannot pass a check.
    fn poison_dispatch(&self, devs: &Devices, gpu_of_rank: &[u32]) -> Result<(), HwError> {
        for (r, b) in self.bufs.iter().enumerate() {
            let g = &dev_of_ref(devs, gpu_of_rank[r]).gpu;
            for buf in [
                &b.recv_x,
                &b.recv_x_scales,
                &b.recv_src_idx,
                &b.recv_topk_idx,
                &b.recv_topk_weights,
                &b.rank_prefix,
                &b.num_recv_tokens,
                &b.num_recv_tokens_per_expert,
                &b.recv_channel_offset,
                &b.channel_prefix_matrix,
            ] {
                g.memset_u8(buf.ptr, 0xff, buf.bytes)?;
            }
            g.memset_u8(b.send_head.ptr, 0x7f, b.send_head.bytes)?;
        }
        Ok(())
    }

    pub fn dispatch(
        &mut self,
        devs: &mut Devices,
        gpu_of_rank: &[u32],
        iteration: u32,
        warmup: bool,
        job_id: eptwin_engine::ids::JobId,
    ) -> Result<OpSample, HwError> {
        self.poison_dispatch(devs, gpu_of_rank)?;
        if !warmup && iteration == 0 {
            self.poison_rings(devs, gpu_of_rank)?;
        }
        self.epoch += 1;
        devs.clear_errors()?;
        devs.flush_l2()?;
        let mut timer = Timer::start(devs)?;
        for (i, dev) in devs.list.iter().enumerate() {
            let la = self.layout_args[i].ptr;
            let (nr, ne, nk) = (self.n as i32, self.experts as i32, self.topk as i32);
            let mut a = kernel_args![la, nr, ne, nk];
            let f = dev.module("layout")?.function("get_dispatch_layout");
            // SAFETY: args match get_dispatch_layout; buffers are live.
            unsafe { dev.gpu.launch(f, dev.ranks.len() as u32, 1024, &mut a)? };
        }
        timer.mark(devs, "layout")?;
        self.launch_pair(
            devs,
            "intranode_notify_dispatch",
            "intranode_dispatch",
            &mut timer,
            true,
        )?;
        devs.finish("dispatch")?;
        let latency_ns = timer.between_ns("notify", "end")?;
        let mut sample = OpSample::new(job_id, OpKind::Dispatch, iteration, warmup, latency_ns);
        sample.phases = vec![
            PhaseTime { name: "layout".into(), latency_ns: timer.between_ns("start", "layout")? },
            PhaseTime { name: "notify".into(), latency_ns: timer.between_ns("layout", "notify")? },
        ];
        let rows: u64 = self.expect.iter().map(|e| e.rows.len() as u64).sum();
        let wire = if self.fp8 { Dtype::Fp8 } else { Dtype::Bf16 };
        sample.nvlink_bytes = rows * normal_dispatch_token_bytes(self.hidden, self.topk, wire);
        self.dispatched = true;

        let dg = self.digest_dispatch(devs, gpu_of_rank)?;
        if !warmup && iteration == 0 && self.launch.rings.dispatch_slots.is_some() {
            self.report_warp_times(devs, "dispatch", 2 * self.n)?;
        }
        let host_check = if !warmup && iteration == 0 {
            Some(self.check_dispatch(devs, gpu_of_rank)?)
        } else {
            None
        };
        record_digest(&mut sample, &mut self.reference_digest[0], dg, "dispatch", host_check);
        Ok(sample)
    }

    /// Launch notify (one block per local rank) then the main kernel on every GPU, with marks
    /// "notify" after the first and "end" after the second.
    fn launch_pair(
        &self,
        devs: &Devices,
        notify: &str,
        main: &str,
        timer: &mut Timer,
        dispatch: bool,
    ) -> Result<(), HwError> {
        let cfg = if dispatch { &self.dispatch_config } else { &self.combine_config };
        for (i, dev) in devs.list.iter().enumerate() {
            let p = self.params(devs, i, cfg, dispatch);
            let (args, err) = (self.args[i].ptr, dev.err.ptr);
            let mut a = kernel_args![args, p, err];
            let f = dev.module("intranode")?.function(notify);
            // SAFETY: args match the kernel's (args, params, err) signature.
            unsafe { dev.gpu.launch(f, dev.ranks.len() as u32, 1024, &mut a)? };
        }
        timer.mark(devs, "notify")?;
        let rings = self.launch.rings;
        let slots = if dispatch { rings.dispatch_slots } else { rings.combine_slots };
        if let Some(slots) = slots {
            let p = self.params(devs, 0, cfg, dispatch);
            let shape = cluster_shape(dispatch, self.n, self.hidden, self.fp8, self.topk, slots);
            self.launch_cluster(&devs.list[0], p, &shape)?;
            return timer.mark(devs, "end");
        }
        for (i, dev) in devs.list.iter().enumerate() {
            let p = self.params(devs, i, cfg, dispatch);
            let (args, err) = (self.args[i].ptr, dev.err.ptr);
            let mut a = kernel_args![args, p, err];
            let f = dev.module("intranode")?.function(main);
            let grid = dev.ranks.len() as u32 * cfg.num_sms;
            // SAFETY: as above; the grid fits co-resident (checked at prepare).
            unsafe { dev.gpu.launch(f, grid, self.launch.threads, &mut a)? };
        }
        timer.mark(devs, "end")
    }

    /// Launch a kernel of `intranode_cluster.cu` (args, params, err, sm_slots, slot_bytes,
    /// warp_ns): one cluster of n blocks per channel.
    fn launch_cluster(
        &self,
        dev: &crate::exec::Device,
        p: NormalParams,
        shape: &ClusterShape,
    ) -> Result<(), HwError> {
        let f = dev.module("intranode_cluster")?.function(shape.kernel);
        dev.gpu.set_max_dynamic_smem(f, shape.smem_bytes)?;
        let (args, err) = (self.args[0].ptr, dev.err.ptr);
        let (sl, sb) = (shape.slots as i32, shape.slot_bytes as i32);
        let times = self.warp_times.as_ref().map(|b| b.ptr).unwrap_or(0);
        let mut a = kernel_args![args, p, err, sl, sb, times];
        let grid = self.channels * self.n;
        let (threads, smem) = (shape.threads, shape.smem_bytes);
        // SAFETY: args match the cluster kernels' (args, params, err, sm_slots, slot_bytes,
        // warp_ns); warp_ns is null or holds (1 + warps) words per block (the
        // combine: 1 + warps + 2 × CLUSTER_TOKEN_STAMPS); the dynamic shared
        // memory is what their layout needs for `slots` of `slot_bytes`; the grid is whole
        // clusters of n blocks (one per channel), which need not be co-resident (channels never
        // wait on each other); `threads` is the kernel's compiled block size.
        unsafe { dev.gpu.launch_with_smem(f, grid, threads, smem, &mut a) }
    }

    /// `EPTWIN_CLUSTER_TIMES=1`: when the cluster kernel's warps finished (µs after the first
    /// block started): senders (the first n warps of a block) and receivers, as percentiles, and
    /// the clusters' finish times, to tell a uniform rate from a tail.
    fn report_warp_times(&self, devs: &Devices, op: &str, warps: u32) -> Result<(), HwError> {
        let Some(buf) = &self.warp_times else { return Ok(()) };
        let combine = op == "combine";
        let stamps = if combine { 2 * CLUSTER_TOKEN_STAMPS as usize } else { 0 };
        let per_block = (1 + warps) as usize + stamps;
        let blocks = (self.channels * self.n) as usize;
        let mut t = vec![0u64; blocks * per_block];
        devs.list[0].gpu.download(buf.ptr, &mut t)?;
        let start = (0..blocks).map(|b| t[b * per_block]).min().unwrap_or(0);
        let us = |v: u64| v.saturating_sub(start) as f64 / 1e3;
        let (mut senders, mut receivers, mut starts, mut clusters) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for b in 0..blocks {
            starts.push(us(t[b * per_block]));
            for w in 0..warps as usize {
                let end = us(t[b * per_block + 1 + w]);
                if w < self.n as usize { senders.push(end) } else { receivers.push(end) }
            }
        }
        for c in 0..self.channels as usize {
            let n = self.n as usize;
            let ends = (c * n..(c + 1) * n).flat_map(|b| (0..warps as usize).map(move |w| (b, w)));
            clusters.push(ends.map(|(b, w)| us(t[b * per_block + 1 + w])).fold(0.0, f64::max));
        }
        let pct = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
            format!(
                "min {:.1} p10 {:.1} p50 {:.1} p90 {:.1} max {:.1}",
                at(0.0),
                at(0.1),
                at(0.5),
                at(0.9),
                at(1.0)
            )
        };
        eprintln!(
            "eptwin hw: cluster {op} warp finish times (us after the first block's start): \
             block starts {}; senders {}; receivers {}; clusters {}",
            pct(&mut starts),
            pct(&mut senders),
            pct(&mut receivers),
            pct(&mut clusters)
        );
        if combine {
            // Per token k of a block's channel: when every partial was in shared memory
            // (ready) and when the reduction was done, after the block's own start; the wait
            // is ready(k) - done(k - 1).
            let tokens = self.routing.tokens_per_rank;
            let max_k =
                (CLUSTER_TOKEN_STAMPS as usize).min(tokens.div_ceil(self.channels) as usize);
            let mut line = String::new();
            for k in 0..max_k {
                let (mut ready, mut work, mut wait) = (Vec::new(), Vec::new(), Vec::new());
                for b in 0..blocks {
                    let base = b * per_block + 1 + warps as usize;
                    let (r, d) = (t[base + 2 * k], t[base + 2 * k + 1]);
                    if r == 0 || d == 0 {
                        continue; // this block's channel has fewer tokens
                    }
                    let prev = if k == 0 { t[b * per_block] } else { t[base + 2 * k - 1] };
                    ready.push(r.saturating_sub(t[b * per_block]) as f64 / 1e3);
                    work.push(d.saturating_sub(r) as f64 / 1e3);
                    wait.push(r.saturating_sub(prev) as f64 / 1e3);
                }
                if ready.is_empty() {
                    break;
                }
                let med = |v: &mut Vec<f64>| {
                    v.sort_by(|a, b| a.total_cmp(b));
                    v[v.len() / 2]
                };
                line.push_str(&format!(
                    " t{k} ready {:.2} wait {:.2} reduce {:.2} ({} blocks);",
                    med(&mut ready),
                    med(&mut wait),
                    med(&mut work),
                    ready.len()
                ));
            }
            eprintln!(
                "eptwin hw: cluster combine reducers per token (p50 over blocks, us after the \
                 block's start):{line}"
            );
        }
        Ok(())
    }

    pub fn combine(
        &mut self,
        devs: &mut Devices,
        gpu_of_rank: &[u32],
        iteration: u32,
        warmup: bool,
        job_id: eptwin_engine::ids::JobId,
    ) -> Result<OpSample, HwError> {
        if !self.dispatched {
            self.dispatch(devs, gpu_of_rank, 0, true, job_id)?;
        }
        // Stand-in experts: combine input = dequantised token × a per-rank factor (untimed).
        for (r, b) in self.bufs.iter().enumerate() {
            let dev = dev_of_ref(devs, gpu_of_rank[r]);
            let rows = self.expect[r].rows.len() as i32;
            let (src, scales, out) = (b.recv_x.ptr, b.recv_x_scales.ptr, b.combine_x.ptr);
            let (hidden, fp8, factor) =
                (self.hidden as i32, self.fp8 as i32, data::expert_factor(r as u32));
            let mut a = kernel_args![src, scales, rows, hidden, fp8, factor, out];
            let f = dev.module("testdata")?.function("make_expert_output_normal");
            // SAFETY: recv_x holds `rows` rows; combine_x has room for them.
            unsafe { dev.gpu.launch(f, dev.gpu.sm_count * 4, 256, &mut a)? };
            dev.gpu.memset_u8(b.combined_x.ptr, 0xff, b.combined_x.bytes)?;
            dev.gpu.memset_u8(b.combined_topk_weights.ptr, 0xff, b.combined_topk_weights.bytes)?;
        }
        if !warmup && iteration == 0 {
            self.poison_rings(devs, gpu_of_rank)?;
        }
        self.epoch += 1;
        devs.clear_errors()?;
        devs.flush_l2()?;
        let mut timer = Timer::start(devs)?;
        self.launch_pair(devs, "intranode_notify_combine", "intranode_combine", &mut timer, false)?;
        devs.finish("combine")?;
        let latency_ns = timer.between_ns("notify", "end")?;
        let mut sample = OpSample::new(job_id, OpKind::Combine, iteration, warmup, latency_ns);
        sample.phases = vec![PhaseTime {
            name: "notify".into(),
            latency_ns: timer.between_ns("start", "notify")?,
        }];
        let rows: u64 = self.expect.iter().map(|e| e.rows.len() as u64).sum();
        sample.nvlink_bytes = rows * normal_combine_token_bytes(self.hidden, self.topk);

        let mut dg = 0u64;
        for dev in &devs.list {
            let mut regions = Vec::new();
            for &r in &dev.ranks {
                let b = &self.bufs[r as usize];
                regions.push(rows_region(
                    b.combined_x.ptr,
                    self.routing.tokens_per_rank as u64,
                    self.hidden as u64 * 2,
                ));
                regions.push(rows_region(
                    b.combined_topk_weights.ptr,
                    self.routing.tokens_per_rank as u64,
                    self.topk as u64 * 4,
                ));
            }
            dg = dg.wrapping_add(digest(dev, &regions)?);
        }
        if !warmup && iteration == 0 && self.launch.rings.combine_slots.is_some() {
            self.report_warp_times(devs, "combine", 4 * self.n)?;
        }
        let host_check = if !warmup && iteration == 0 {
            Some(self.check_combine(devs, gpu_of_rank)?)
        } else {
            None
        };
        record_digest(&mut sample, &mut self.reference_digest[1], dg, "combine", host_check);
        Ok(sample)
    }

    fn digest_dispatch(&self, devs: &Devices, _gpu_of_rank: &[u32]) -> Result<u64, HwError> {
        let mut total = 0u64;
        let pay = payload_bytes(self.hidden, self.fp8);
        for dev in &devs.list {
            let mut regions = Vec::new();
            for &r in &dev.ranks {
                let b = &self.bufs[r as usize];
                let rows = self.expect[r as usize].rows.len() as u64;
                regions.push(rows_region(b.recv_x.ptr, rows, pay));
                if self.fp8 {
                    regions.push(rows_region(
                        b.recv_x_scales.ptr,
                        rows,
                        self.hidden as u64 / 128 * 4,
                    ));
                }
                regions.push(rows_region(b.recv_src_idx.ptr, rows, 4));
                regions.push(rows_region(b.recv_topk_idx.ptr, rows, self.topk as u64 * 4));
                regions.push(rows_region(b.recv_topk_weights.ptr, rows, self.topk as u64 * 4));
            }
            total = total.wrapping_add(digest(dev, &regions)?);
        }
        Ok(total)
    }

    /// The full host check of one dispatch (DeepEP test_intranode.py's checks).
    fn check_dispatch(
        &self,
        devs: &Devices,
        gpu_of_rank: &[u32],
    ) -> Result<(Vec<String>, Vec<String>), HwError> {
        let (n, k, h) = (self.n as usize, self.topk as usize, self.hidden as usize);
        let l = (self.experts / self.n) as usize;
        let s_per = if self.fp8 { h / 128 } else { 0 };
        let pay = payload_bytes(self.hidden, self.fp8) as usize;
        let c = self.channels as usize;
        struct Got {
            x: Vec<u8>,
            scales: Vec<f32>,
            src: Vec<i32>,
            topk: Vec<i32>,
            w: Vec<f32>,
            prefix: Vec<i32>,
            num: Vec<i32>,
            per_expert: Vec<i32>,
            chan: Vec<i32>,
        }
        let mut got = Vec::with_capacity(n);
        for (r, &gpu) in gpu_of_rank.iter().enumerate().take(n) {
            let g = &dev_of_ref(devs, gpu).gpu;
            let b = &self.bufs[r];
            let rows = self.expect[r].rows.len();
            let mut x = vec![0u8; rows * pay];
            g.download(b.recv_x.ptr, &mut x)?;
            let mut scales = vec![0f32; rows * s_per];
            g.download(b.recv_x_scales.ptr, &mut scales)?;
            let mut src = vec![0i32; rows];
            g.download(b.recv_src_idx.ptr, &mut src)?;
            let mut topk = vec![0i32; rows * k];
            g.download(b.recv_topk_idx.ptr, &mut topk)?;
            let mut w = vec![0f32; rows * k];
            g.download(b.recv_topk_weights.ptr, &mut w)?;
            let mut prefix = vec![0i32; n];
            g.download(b.rank_prefix.ptr, &mut prefix)?;
            let mut num = vec![0i32; 1];
            g.download(b.num_recv_tokens.ptr, &mut num)?;
            let mut per_expert = vec![0i32; l];
            g.download(b.num_recv_tokens_per_expert.ptr, &mut per_expert)?;
            let mut chan = vec![0i32; n * c];
            g.download(b.recv_channel_offset.ptr, &mut chan)?;
            got.push(Got { x, scales, src, topk, w, prefix, num, per_expert, chan });
        }
        let results = parallel_map(n, |r| {
            let e = &self.expect[r];
            let gr = &got[r];
            let mut layout = Failures::default();
            let mut data = Failures::default();
            let mut meta = Failures::default();
            if gr.num[0] as usize != e.rows.len() {
                layout.push(|| {
                    format!("rank {r}: {} tokens received, expected {}", gr.num[0], e.rows.len())
                });
            }
            if gr.prefix != e.rank_prefix {
                layout.push(|| {
                    format!("rank {r}: rank prefix {:?}, expected {:?}", gr.prefix, e.rank_prefix)
                });
            }
            if gr.per_expert != e.per_expert {
                layout.push(|| {
                    format!(
                        "rank {r}: per-expert counts {:?}, expected {:?}",
                        gr.per_expert, e.per_expert
                    )
                });
            }
            if gr.chan != e.channel_offset {
                layout.push(|| format!("rank {r}: channel offsets differ from the layout"));
            }
            for (row, &(s, t)) in e.rows.iter().enumerate() {
                let tok = &self.tokens[s as usize];
                let want: &[u8] = if self.fp8 {
                    tok.fp8_row(t as usize)
                } else {
                    bytes_of_u16(tok.bf16_row(t as usize))
                };
                let have = &gr.x[row * pay..(row + 1) * pay];
                if have != want {
                    let col = have.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                    data.push(|| format!(
                        "rank {r} row {row}: payload differs from source rank {s} token {t} (first at byte {col})"
                    ));
                }
                if self.fp8
                    && gr.scales[row * s_per..(row + 1) * s_per] != *tok.scales_row(t as usize)
                {
                    data.push(|| {
                        format!("rank {r} row {row}: scales differ from source rank {s} token {t}")
                    });
                }
                if gr.src[row] != t as i32 {
                    meta.push(|| {
                        format!(
                            "rank {r} row {row}: source index {}, expected {t} (from rank {s})",
                            gr.src[row]
                        )
                    });
                }
                let experts = self.routing.experts(s, t);
                let weights = self.routing.weights(s, t);
                for j in 0..k {
                    let ex = experts[j];
                    let local =
                        if ex >= 0 && ex as usize / l == r { ex - (r * l) as i32 } else { -1 };
                    let want_w = if local >= 0 { weights[j] } else { 0.0 };
                    if gr.topk[row * k + j] != local
                        || gr.w[row * k + j].to_bits() != want_w.to_bits()
                    {
                        meta.push(|| format!(
                            "rank {r} row {row} slot {j}: topk ({}, {}), expected ({local}, {want_w})",
                            gr.topk[row * k + j], gr.w[row * k + j]
                        ));
                    }
                }
            }
            (layout, data, meta)
        });
        let (mut layout, mut data, mut meta) =
            (Failures::default(), Failures::default(), Failures::default());
        for (a, b, c) in results {
            layout.extend(a);
            data.extend(b);
            meta.extend(c);
        }
        let checks = vec![
            "dispatch: token counts, rank prefix, per-expert counts and channel offsets match the layout".to_string(),
            "dispatch: every received row equals its source token byte for byte (payload and scales)".to_string(),
            "dispatch: source indices, local top-k indices and weights match".to_string(),
        ];
        let mut failures = layout.into_lines("dispatch layout");
        failures.extend(data.into_lines("dispatch data"));
        failures.extend(meta.into_lines("dispatch metadata"));
        Ok((checks, failures))
    }

    fn check_combine(
        &self,
        devs: &Devices,
        gpu_of_rank: &[u32],
    ) -> Result<(Vec<String>, Vec<String>), HwError> {
        let (n, k, h) = (self.n as usize, self.topk as usize, self.hidden as usize);
        let t = self.routing.tokens_per_rank as usize;
        let mut got = Vec::with_capacity(n);
        for (r, &gpu) in gpu_of_rank.iter().enumerate().take(n) {
            let g = &dev_of_ref(devs, gpu).gpu;
            let b = &self.bufs[r];
            let mut x = vec![0u16; t * h];
            g.download(b.combined_x.ptr, &mut x)?;
            let mut w = vec![0f32; t * k];
            g.download(b.combined_topk_weights.ptr, &mut w)?;
            got.push((x, w));
        }
        let results = parallel_map(n, |s| {
            let (gx, gw) = &got[s];
            let tok = &self.tokens[s];
            let mut data = Failures::default();
            let mut weights = Failures::default();
            let mut ranks = Vec::new();
            let (mut got_f, mut want_f) = (Vec::with_capacity(h), Vec::with_capacity(h));
            let mut diff_max = 0f64;
            for ti in 0..t {
                self.routing.token_ranks(s as u32, ti as u32, &mut ranks);
                got_f.clear();
                want_f.clear();
                for hi in 0..h {
                    let v = tok.value(ti, hi);
                    // The kernel sums the partials in rank order in f32.
                    let mut acc = 0f32;
                    for &d in &ranks {
                        acc += data::bf16_to_f32(data::expert_output(v, data::expert_factor(d)));
                    }
                    let want = data::bf16_to_f32(data::f32_to_bf16(acc));
                    let have = data::bf16_to_f32(gx[ti * h + hi]);
                    got_f.push(have);
                    want_f.push(want);
                    if !bf16_close(have, want, v.abs() * 8.0) {
                        data.push(|| {
                            format!("rank {s} token {ti} element {hi}: {have}, expected {want}")
                        });
                    }
                }
                diff_max = diff_max.max(data::calc_diff(&got_f, &want_f));
                let experts = self.routing.experts(s as u32, ti as u32);
                let w = self.routing.weights(s as u32, ti as u32);
                for j in 0..k {
                    let want = if experts[j] >= 0 { w[j] } else { 0.0 };
                    let have = gw[ti * k + j];
                    if have.to_bits() != want.to_bits() && !(have == 0.0 && want == 0.0) {
                        weights.push(|| {
                            format!("rank {s} token {ti} slot {j}: weight {have}, expected {want}")
                        });
                    }
                }
            }
            (data, weights, diff_max)
        });
        let (mut data, mut weights, mut diff) = (Failures::default(), Failures::default(), 0f64);
        for (a, b, d) in results {
            data.extend(a);
            weights.extend(b);
            diff = diff.max(d);
        }
        let mut checks = vec![
            "combine: every element equals the sum of the visited ranks' expert outputs within bf16 rounding".to_string(),
            "combine: top-k weights come back intact".to_string(),
            format!("combine: worst per-token calc_diff {diff:.3e} (DeepEP's bound 5e-6)"),
        ];
        let mut failures = data.into_lines("combine data");
        failures.extend(weights.into_lines("combine weights"));
        if diff > 5e-6 {
            failures.push(format!("combine: calc_diff {diff:.3e} above DeepEP's bound 5e-6"));
        }
        checks.dedup();
        Ok((checks, failures))
    }

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
}

/// Whether dispatch drops consumed ring lines from L2 (`EPTWIN_L2_DISCARD_DISPATCH=0`: no).
/// Where the normal kernels' rings live: `Some(slots)` per (channel, source) in the receiving
/// block's shared memory (`intranode_cluster.cu`, thread-block clusters), `None` in global
/// memory (`intranode.cu`, DeepEP's layout). Cluster rings cut the L2/HBM traffic to the input
/// read and the output write (results/h200/README.md, "Rings in shared memory"), so they are
/// the default wherever they can run: every rank of the job on one GPU, at most 8 ranks (one
/// portable cluster per channel), sm_90 or newer, rows in 16-byte pieces, and at least one slot
/// per source in the shared memory a block may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClusterRings {
    pub dispatch_slots: Option<u32>,
    pub combine_slots: Option<u32>,
}

/// What the choice depends on, from the job and the GPU it runs on.
#[derive(Debug, Clone, Copy)]
pub struct RingInputs {
    pub ranks: u32,
    /// Every rank of the job on the one GPU in use.
    pub one_gpu: bool,
    pub compute_major: i32,
    pub hidden: u32,
    pub fp8: bool,
    pub topk: u32,
    /// `num_max_nvl_chunked_recv_tokens` of the dispatch and combine Configs.
    pub dispatch_recv_tokens: u32,
    pub combine_recv_tokens: u32,
}

/// Per-token stamps of the cluster combine's reducers (`kTokenStamps` in intranode_cluster.cu).
const CLUSTER_TOKEN_STAMPS: u32 = 32;

/// `EPTWIN_NORMAL_DISPATCH` / `EPTWIN_NORMAL_COMBINE` = `cluster` or `global` forces where that
/// kernel's rings live (a measurement knob); unset, the default applies.
fn rings_forced(var: &str) -> Result<Option<bool>, HwError> {
    match std::env::var(var).as_deref() {
        Ok("cluster") => Ok(Some(true)),
        Ok("global") => Ok(Some(false)),
        Ok("") | Err(_) => Ok(None),
        Ok(other) => {
            Err(HwError::Unsupported(format!("{var}={other}: expected cluster or global")))
        }
    }
}

impl ClusterRings {
    /// The rings of both kernels: cluster shared memory where possible unless forced to global
    /// memory; an error where cluster rings are forced but cannot run.
    pub fn choose(i: &RingInputs) -> Result<ClusterRings, HwError> {
        let cap = std::env::var("EPTWIN_CLUSTER_SLOTS").ok().and_then(|v| v.parse::<u32>().ok());
        let d =
            Self::pick("EPTWIN_NORMAL_DISPATCH", rings_forced("EPTWIN_NORMAL_DISPATCH")?, || {
                dispatch_slots(i, cap)
            })?;
        let c =
            Self::pick("EPTWIN_NORMAL_COMBINE", rings_forced("EPTWIN_NORMAL_COMBINE")?, || {
                combine_slots(i)
            })?;
        Ok(ClusterRings { dispatch_slots: d, combine_slots: c })
    }

    fn pick(
        var: &str,
        forced: Option<bool>,
        slots: impl Fn() -> Result<u32, String>,
    ) -> Result<Option<u32>, HwError> {
        match (forced, slots()) {
            (Some(false), _) => Ok(None),
            (_, Ok(s)) => Ok(Some(s)),
            (None, Err(_)) => Ok(None),
            (Some(true), Err(why)) => Err(HwError::Unsupported(format!("{var}=cluster: {why}"))),
        }
    }

    pub fn any(&self) -> bool {
        self.dispatch_slots.is_some() || self.combine_slots.is_some()
    }
}

/// Why cluster rings cannot run for this job (common to both kernels).
fn cluster_precondition(i: &RingInputs) -> Result<(), String> {
    if !i.one_gpu {
        return Err("needs every rank on one GPU".into());
    }
    if i.ranks > 8 {
        return Err(format!("{} ranks > 8 (one portable cluster per channel)", i.ranks));
    }
    if i.compute_major < 9 {
        return Err("needs thread-block clusters (sm_90 or newer)".into());
    }
    Ok(())
}

/// The cluster kernel's ring slot (engine `cluster_ring`, which the simulator models too), or
/// why bulk copies cannot move it.
fn cluster_slot(dispatch: bool, hidden: u32, fp8: bool, topk: u32) -> Result<ClusterSlot, String> {
    if dispatch {
        ClusterSlot::dispatch(hidden, topk, if fp8 { Dtype::Fp8 } else { Dtype::Bf16 })
    } else {
        ClusterSlot::combine(hidden, topk)
    }
}

/// Dispatch slots per source: the Config's ring size, capped by `cap` and by shared memory.
fn dispatch_slots(i: &RingInputs, cap: Option<u32>) -> Result<u32, String> {
    cluster_precondition(i)?;
    let slot = cluster_slot(true, i.hidden, i.fp8, i.topk)?;
    let want = i.dispatch_recv_tokens.min(cap.unwrap_or(u32::MAX)).max(1);
    most_slots(&slot, want, i.ranks)
}

/// Combine slots per source (BF16 rows and their top-k weights).
fn combine_slots(i: &RingInputs) -> Result<u32, String> {
    cluster_precondition(i)?;
    let slot = cluster_slot(false, i.hidden, i.fp8, i.topk)?;
    most_slots(&slot, i.combine_recv_tokens.max(1), i.ranks)
}

/// The most slots up to `want` whose layout fits a block's shared memory (at least one).
fn most_slots(slot: &ClusterSlot, want: u32, ranks: u32) -> Result<u32, String> {
    match cluster_ring_slots(slot, want, ranks, MAX_DYNAMIC_SMEM_BYTES) {
        0 => Err(format!(
            "one slot per source takes {} bytes of shared memory, more than the {} a block \
                 may have",
            slot.smem_bytes(ranks, 1),
            MAX_DYNAMIC_SMEM_BYTES
        )),
        slots => Ok(slots),
    }
}

/// How a cluster kernel is launched: its name, ring slots per source and their bytes, dynamic
/// shared memory, threads per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterShape {
    pub kernel: &'static str,
    pub slots: u32,
    pub slot_bytes: u64,
    pub smem_bytes: u32,
    pub threads: u32,
}

/// The launch shape of the cluster dispatch (`dispatch`) or combine for `ranks` ranks.
pub fn cluster_shape(
    dispatch: bool,
    ranks: u32,
    hidden: u32,
    fp8: bool,
    topk: u32,
    slots: u32,
) -> ClusterShape {
    let slot = cluster_slot(dispatch, hidden, fp8, topk).expect("ClusterRings::choose checked it");
    ClusterShape {
        kernel: if dispatch { "intranode_dispatch_cluster" } else { "intranode_combine_cluster" },
        slots,
        slot_bytes: slot.slot_bytes,
        smem_bytes: slot.smem_bytes(ranks, slots) as u32,
        // A sender and a receiver warp per rank (kClusterThreads); combine: a sender warp and
        // three reducer warps per rank (kCombineClusterThreads).
        threads: if dispatch { 64 } else { 128 } * ranks,
    }
}

/// What a block may have on sm_90 (227 KiB).
pub const MAX_DYNAMIC_SMEM_BYTES: u64 = 232_448;

pub fn discard_in_dispatch() -> bool {
    std::env::var("EPTWIN_L2_DISCARD_DISPATCH").as_deref() != Ok("0")
}

fn rows_region(ptr: u64, rows: u64, row_bytes: u64) -> DigestRegion {
    DigestRegion {
        ptr,
        num_rows: rows,
        row_words: (row_bytes / 4) as i32,
        row_stride_words: row_bytes / 4,
        row_counts: 0,
        rows_per_group: 1,
    }
}

fn bytes_of_u16(v: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding; the byte view covers the same memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

pub(crate) fn dev_of(devs: &mut Devices, gpu: u32) -> &mut crate::exec::Device {
    devs.list
        .iter_mut()
        .find(|d| d.gpu.ordinal == gpu as usize)
        .expect("every rank's GPU is in the placement")
}

pub(crate) fn dev_of_ref(devs: &Devices, gpu: u32) -> &crate::exec::Device {
    devs.list
        .iter()
        .find(|d| d.gpu.ordinal == gpu as usize)
        .expect("every rank's GPU is in the placement")
}

#[cfg(test)]
mod tests {
    use super::*;
    use eptwin_engine::plan::Workload;

    fn routing(n: u32, tokens: u32) -> RoutingTable {
        eptwin_engine::routing::generate(&Workload::new(tokens, 256, 4, n * 4), n)
    }

    #[test]
    fn layout_is_aligned_and_disjoint() {
        let l = NvlLayout::new(8, 32, 12, 256, 14336, 8, 56);
        let mut offs = [
            l.recv_counts,
            l.recv_expert_counts,
            l.barrier,
            l.d_start,
            l.d_end,
            l.d_head,
            l.d_tail,
            l.c_head,
            l.c_tail,
            l.x,
            l.src_idx,
            l.topk_idx,
            l.topk_weights,
            l.scales,
        ];
        for o in offs {
            assert_eq!(o % 128, 0);
        }
        offs.sort();
        for w in offs.windows(2) {
            assert!(w[0] < w[1]);
        }
        assert_eq!(l.src_idx - l.x, 12 * 8 * 256 * 14336);
        assert!(l.total >= l.scales + 12 * 8 * 256 * 56 * 4);
    }

    #[test]
    fn cluster_rings_fit_shared_memory_at_deepseek_shapes() {
        // FP8 dispatch of 7,168 channels with 56 scales and top-8; BF16 combine of the same.
        let d = cluster_slot(true, 7168, true, 8).unwrap();
        assert_eq!(d.slot_bytes, 7472);
        assert_eq!(d.slot_bytes % 16, 0, "bulk copies move 16-byte multiples");
        let i = deepseek_inputs();
        assert_eq!(dispatch_slots(&i, None), Ok(3), "three 7,472-byte slots per source fit");
        assert!(d.smem_bytes(8, 4) > MAX_DYNAMIC_SMEM_BYTES);
        assert_eq!(combine_slots(&i), Ok(2), "two 14,368-byte slots per source fit");
        let c = cluster_slot(false, 7168, true, 8).unwrap();
        assert!(c.smem_bytes(8, 3) > MAX_DYNAMIC_SMEM_BYTES);
        // The launch shape: dynamic shared memory of the slots, heads and mbarriers.
        let shape = cluster_shape(true, 8, 7168, true, 8, 3);
        assert_eq!((shape.slot_bytes, shape.smem_bytes, shape.threads), (7472, 179_936, 512));
        // The Config's ring size and the measurement cap bound the slots too.
        assert_eq!(dispatch_slots(&RingInputs { dispatch_recv_tokens: 2, ..i }, None), Ok(2));
        assert_eq!(dispatch_slots(&i, Some(1)), Ok(1));
        // BF16 dispatch rows: 14,416-byte slots, two fit.
        assert_eq!(dispatch_slots(&RingInputs { fp8: false, ..i }, None), Ok(2));
    }

    fn deepseek_inputs() -> RingInputs {
        RingInputs {
            ranks: 8,
            one_gpu: true,
            compute_major: 9,
            hidden: 7168,
            fp8: true,
            topk: 8,
            dispatch_recv_tokens: 12,
            combine_recv_tokens: 8,
        }
    }

    #[test]
    fn cluster_rings_only_where_they_can_run() {
        let i = deepseek_inputs();
        for bad in [
            RingInputs { one_gpu: false, ..i },
            RingInputs { ranks: 16, ..i },
            RingInputs { compute_major: 8, ..i },
            // 16,384 BF16 channels: one 32 KB slot per source is more than a block may have.
            RingInputs { hidden: 16384, fp8: false, ..i },
        ] {
            assert!(dispatch_slots(&bad, None).is_err() || combine_slots(&bad).is_err(), "{bad:?}");
        }
        assert!(combine_slots(&RingInputs { topk: 6, ..i }).is_err(), "24-byte weight rows");
        let fits = || Ok(3);
        let no = || Err("no".to_string());
        assert_eq!(ClusterRings::pick("V", None, fits), Ok(Some(3)), "default: cluster");
        assert_eq!(ClusterRings::pick("V", None, no), Ok(None), "default falls back to global");
        assert_eq!(ClusterRings::pick("V", Some(false), fits), Ok(None), "forced global");
        assert!(ClusterRings::pick("V", Some(true), no).is_err(), "forced cluster cannot run");
    }

    #[test]
    fn channel_ranges_cover_all_tokens() {
        for (t, c) in [(128, 12), (4096, 12), (7, 10), (0, 4)] {
            let mut next = 0;
            for ch in 0..c {
                let (s, e) = channel_range(t, c, ch);
                assert_eq!(s, next.min(t));
                next = e;
            }
            assert_eq!(next, t);
        }
    }

    #[test]
    fn expectations_conserve_tokens() {
        let rt = routing(8, 100);
        let ex = expectations(&rt, 12);
        let mut ranks = Vec::new();
        let mut total = 0;
        for s in 0..8 {
            for t in 0..100 {
                rt.token_ranks(s, t, &mut ranks);
                total += ranks.len();
            }
        }
        assert_eq!(ex.iter().map(|e| e.rows.len()).sum::<usize>(), total);
        for (d, e) in ex.iter().enumerate() {
            assert_eq!(*e.rank_prefix.last().unwrap() as usize, e.rows.len());
            // Rows are grouped by source rank, ascending.
            assert!(e.rows.windows(2).all(|w| w[0].0 <= w[1].0), "rank {d}");
            // Within a source, channel offsets point at the first row of each channel.
            for s in 0..8u32 {
                let begin = if s > 0 { e.rank_prefix[s as usize - 1] } else { 0 } as usize;
                for c in 0..12u32 {
                    let off = e.channel_offset[(s * 12 + c) as usize] as usize;
                    let (ts, _) = channel_range(100, 12, c);
                    if let Some(&(rs, rt_)) = e.rows.get(begin + off)
                        && rs == s
                    {
                        assert!(rt_ >= ts);
                    }
                }
            }
            let per_expert: i32 = e.per_expert.iter().sum();
            assert!(per_expert as usize >= e.rows.len());
        }
    }
}
