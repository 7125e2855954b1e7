//! Setting up a low-latency job: what it needs per GPU, the packed-row capacity, the test
//! tokens, this process's ranks' device buffers and the argument arrays the kernels read
//! (other processes' buffers mapped through CUDA IPC in a multi-process run).

use std::collections::BTreeMap;

use eptwin_engine::api::{DeepEpJob, Dtype, RoutingTable, Workload};

use super::across_nodes::LlAcross;
use super::args::LlRankArgs;
use super::{
    ExpertExpectation, LlJob, LlLaunch, MAX_ITEMS_PER_BLOCK, RankBuffers, combine_slot,
    expectations, msg_stride,
};
use crate::cuda::DeviceBuffer;
use crate::data::{self, RankTokens};
use crate::error::HwError;
use crate::exec::{Devices, dev_of};
use crate::family::FamilyContext;
use crate::processes::{Processes, share_buffers};
use eptwin_wire::links::{EndpointExchange, SingleProcess};

impl LlJob {
    /// Bytes this job needs on each GPU (to refuse plans that do not fit before allocating).
    pub fn bytes_needed(d: &DeepEpJob, ranks_on_gpu: u64, capacity: u64) -> u64 {
        let w = &d.workload;
        let (t, h, k) = (w.max_dispatch_tokens_per_rank as u64, w.hidden as u64, w.topk as u64);
        let l = d.num_local_experts as u64;
        let n = d.routing().num_ranks as u64;
        let msg = msg_stride(w.hidden, w.dispatch_dtype == Dtype::Fp8);
        let per_rank = t * h * 2          // x
            + t * msg                      // send_buf
            + l * n * t * msg              // recv_buf
            + l * capacity * (h * 2 + h / 128 * 4 + 8) // packed x (<= bf16), scales, src info, slot
            + l * capacity * h * 2         // combine_x
            + t * k * combine_slot(w.hidden) // combine_recv_buf
            + t * h * 2; // combined_x
        per_rank * ranks_on_gpu
    }

    /// Packed rows per local expert: the most any (rank, local expert) receives, rounded up.
    /// DeepEP sizes this `num_ranks · T`; with eight ranks on one GPU at T = 4096 that would be
    /// 60 GB of outputs, so the backend sizes it from the routing, which it knows in advance.
    pub fn capacity(expect: &[Vec<ExpertExpectation>]) -> u32 {
        let most = expect.iter().flatten().map(|e| e.count()).max().unwrap_or(0);
        (most.max(1).div_ceil(16) * 16) as u32
    }

    pub fn prepare(ctx: &mut FamilyContext<'_>, launch: LlLaunch) -> Result<LlJob, HwError> {
        let (job, d, options) = (ctx.job, ctx.deepep, ctx.options);
        let (devs, gpu_of_rank) = (&mut *ctx.devs, ctx.placement.gpu_of_rank.as_slice());
        let n = job.num_ranks();
        let w = &d.workload;
        let setup =
            |m: String| HwError::Setup { context: format!("job {:?}", job.name), message: m };
        let fp8 = match w.dispatch_dtype {
            Dtype::Fp8 => true,
            Dtype::Bf16 => false,
            Dtype::Logfmt => {
                return Err(HwError::Unsupported("LogFMT is a combine encoding".into()));
            }
        };
        if w.combine_dtype != Dtype::Bf16 {
            return Err(HwError::Unsupported(format!(
                "low-latency combine in {:?}: the hardware backend implements BF16 combine (no LogFMT)",
                w.combine_dtype
            )));
        }
        if !w.hidden.is_multiple_of(256) || w.topk > 31 || !w.experts.is_multiple_of(n) {
            return Err(setup(format!(
                "hidden {} (multiple of 256), topk {} (≤ 31), experts {} (multiple of ranks)",
                w.hidden, w.topk, w.experts
            )));
        }
        if n > 32 {
            return Err(HwError::Unsupported(format!(
                "{n} low-latency ranks: the co-located kernels track at most 32 ranks per GPU"
            )));
        }
        let max_tokens = w.max_dispatch_tokens_per_rank;
        let routing = d.routing().clone();
        let expect = expectations(&routing);
        let capacity = Self::capacity(&expect);
        for (i, dev) in devs.list.iter().enumerate() {
            let g = launch.dispatch_blocks[i];
            let items = dev.ranks.len() as u32 * w.experts;
            if items.div_ceil(g) > MAX_ITEMS_PER_BLOCK {
                return Err(setup(format!(
                    "{items} (rank, expert) signals over {g} blocks exceed {MAX_ITEMS_PER_BLOCK} per block"
                )));
            }
            let need = Self::bytes_needed(d, dev.ranks.len() as u64, capacity as u64);
            let free = dev.gpu.mem_free_bytes()?;
            if need > free * 9 / 10 {
                return Err(HwError::Unsupported(format!(
                    "low-latency buffers need {:.1} GB on GPU {} ({} ranks, T = {max_tokens}); {:.1} GB free",
                    need as f64 / 1e9,
                    dev.gpu.ordinal,
                    dev.ranks.len(),
                    free as f64 / 1e9
                )));
            }
        }
        let tokens: Vec<RankTokens> = data::generate_ranks(w, n);
        let local: Vec<u32> = devs.list.iter().flat_map(|d| d.ranks.iter().copied()).collect();
        let shape = BufferShape::new(w, n, max_tokens, capacity, fp8);
        let bufs = alloc_rank_buffers(devs, gpu_of_rank, &shape, &routing, &tokens)?;
        let across = match ctx.crossing {
            Some(c) => Some(Box::new(LlAcross::prepare(
                devs,
                gpu_of_rank,
                &routing,
                &local,
                c.geometry.clone(),
                c.config.clone(),
            )?)),
            None => None,
        };
        devs.sync("low-latency setup")?;
        let mut block_times = Vec::new();
        if options.ll_times {
            for (i, dev) in devs.list.iter().enumerate() {
                let words = launch.combine_blocks[i] as usize * super::times::LL_TIME_WORDS;
                let buf = dev.gpu.alloc(words * 8)?;
                dev.gpu.memset_u8(buf.ptr, 0, buf.bytes)?;
                block_times.push(buf);
            }
        }
        Ok(LlJob {
            n,
            hidden: w.hidden,
            topk: w.topk,
            experts: w.experts,
            max_tokens,
            capacity,
            fp8,
            hook: w.hook,
            msg_bytes: shape.msg_bytes,
            combine_slot_bytes: shape.combine_slot_bytes,
            tokens,
            routing,
            expect,
            bufs,
            args: Vec::new(),
            peers: None,
            use_discard: options.l2_discard,
            discard_in_dispatch: options.discard_in_dispatch(),
            dispatched: false,
            reference_digest: [None, None],
            rank_digests: None,
            launch,
            across,
            block_times,
        })
    }

    /// The per-GPU argument arrays the kernels read: this process's ranks' buffers, and of the
    /// other ranks the four the kernels write into (receive slots and counts, combine slots
    /// and flags), mapped from other processes. Collective in a multi-process run.
    pub fn connect(
        &mut self,
        devs: &Devices,
        mut procs: Option<&mut Processes>,
    ) -> Result<(), HwError> {
        // The wire first: its endpoints travel through the same process group.
        if let Some(a) = self.across.as_mut() {
            let exchange: &mut dyn EndpointExchange = match procs.as_deref_mut() {
                Some(p) => p,
                None => &mut SingleProcess,
            };
            a.connect_wire(devs, exchange)?;
        }
        let exported: BTreeMap<u32, Vec<&DeviceBuffer>> = self
            .bufs
            .iter()
            .map(|(&r, b)| {
                (r, vec![&b.recv_buf, &b.recv_count, &b.combine_recv_buf, &b.combine_recv_flag])
            })
            .collect();
        let peers = share_buffers(procs, devs, self.n, &exported, "low-latency receive buffers")?;
        let t = self.routing.tokens_per_rank as i32;
        let mut args = Vec::with_capacity(devs.list.len());
        for (i, dev) in devs.list.iter().enumerate() {
            let all: Vec<LlRankArgs> = (0..self.n)
                .map(|r| match self.bufs.get(&r) {
                    Some(b) => LlRankArgs {
                        x: b.x.ptr,
                        topk_idx: b.topk_idx.ptr,
                        topk_weights: b.topk_weights.ptr,
                        send_buf: b.send_buf.ptr,
                        atomic_counter: b.atomic_counter.ptr,
                        finish_counter: b.finish_counter.ptr,
                        recv_buf: b.recv_buf.ptr,
                        recv_count: b.recv_count.ptr,
                        packed_recv_x: b.packed_recv_x.ptr,
                        packed_recv_scales: b.packed_recv_scales.ptr,
                        packed_recv_src_info: b.packed_recv_src_info.ptr,
                        packed_recv_slot: b.packed_recv_slot.ptr,
                        packed_recv_layout_range: b.packed_recv_layout_range.ptr,
                        packed_recv_count: b.packed_recv_count.ptr,
                        combine_x: b.combine_x.ptr,
                        combine_recv_buf: b.combine_recv_buf.ptr,
                        combine_recv_flag: b.combine_recv_flag.ptr,
                        combined_x: b.combined_x.ptr,
                        num_tokens: t,
                        reserved: 0,
                        ..wire_args(self.across.as_deref(), r)
                    },
                    None => LlRankArgs {
                        recv_buf: peers.ptr(i, r, 0),
                        recv_count: peers.ptr(i, r, 1),
                        combine_recv_buf: peers.ptr(i, r, 2),
                        combine_recv_flag: peers.ptr(i, r, 3),
                        num_tokens: t,
                        ..LlRankArgs::default()
                    },
                })
                .collect();
            args.push(dev.gpu.alloc_from(&all)?);
        }
        devs.sync("low-latency arguments")?;
        self.args = args;
        self.peers = Some(peers);
        Ok(())
    }
}

/// The sizes a rank's low-latency buffers are allocated from.
struct BufferShape {
    /// `num_max_dispatch_tokens_per_rank`, tokens per rank, hidden, top-k.
    max_tokens: usize,
    tokens: usize,
    hidden: usize,
    topk: usize,
    experts: usize,
    local_experts: usize,
    ranks: usize,
    /// Packed rows per local expert.
    capacity: usize,
    /// Payload bytes of a received row (FP8: one per element).
    payload_bytes: usize,
    msg_bytes: u64,
    combine_slot_bytes: u64,
}

impl BufferShape {
    fn new(w: &Workload, n: u32, max_tokens: u32, capacity: u32, fp8: bool) -> BufferShape {
        let h = w.hidden as usize;
        BufferShape {
            max_tokens: max_tokens as usize,
            tokens: w.tokens_per_rank as usize,
            hidden: h,
            topk: w.topk as usize,
            experts: w.experts as usize,
            local_experts: (w.experts / n) as usize,
            ranks: n as usize,
            capacity: capacity as usize,
            payload_bytes: if fp8 { h } else { 2 * h },
            msg_bytes: msg_stride(w.hidden, fp8),
            combine_slot_bytes: combine_slot(w.hidden),
        }
    }
}

/// This process's ranks' buffers (the ranks `devs` holds), inputs uploaded and the receive
/// slots poisoned once: a message that never arrives cannot look valid.
fn alloc_rank_buffers(
    devs: &mut Devices,
    gpu_of_rank: &[u32],
    s: &BufferShape,
    routing: &RoutingTable,
    tokens: &[RankTokens],
) -> Result<BTreeMap<u32, RankBuffers>, HwError> {
    let (t, tt, h, k) = (s.max_tokens, s.tokens, s.hidden, s.topk);
    let (e, l, nn, cap, pay) = (s.experts, s.local_experts, s.ranks, s.capacity, s.payload_bytes);
    let (msg, cslot) = (s.msg_bytes as usize, s.combine_slot_bytes as usize);
    let local: Vec<u32> = devs.list.iter().flat_map(|d| d.ranks.iter().copied()).collect();
    let mut bufs = BTreeMap::new();
    for &rank in &local {
        let r = rank as usize;
        let g = &dev_of(devs, gpu_of_rank[r]).gpu;
        let b = RankBuffers {
            x: g.alloc(tt * h * 2)?,
            topk_idx: g.alloc(tt * k * 4)?,
            topk_weights: g.alloc(tt * k * 4)?,
            send_buf: g.alloc(t * msg)?,
            atomic_counter: g.alloc(e * 4)?,
            finish_counter: g.alloc(e * 4)?,
            recv_buf: g.alloc(l * nn * t * msg)?,
            recv_count: g.alloc(l * nn * 4)?,
            packed_recv_x: g.alloc(l * cap * pay)?,
            packed_recv_scales: g.alloc(l * cap * (h / 128) * 4)?,
            packed_recv_src_info: g.alloc(l * cap * 4)?,
            packed_recv_slot: g.alloc(l * cap * 4)?,
            packed_recv_layout_range: g.alloc(l * nn * 8)?,
            packed_recv_count: g.alloc(l * 4)?,
            combine_x: g.alloc(l * cap * h * 2)?,
            combine_recv_buf: g.alloc(t * k * cslot)?,
            combine_recv_flag: g.alloc(e * 4)?,
            combined_x: g.alloc(tt * h * 2)?,
        };
        g.upload(&b.x, &tokens[r].bf16)?;
        let base = r * tt * k;
        g.upload(&b.topk_idx, &routing.topk_idx[base..base + tt * k])?;
        g.upload(&b.topk_weights, &routing.topk_weights[base..base + tt * k])?;
        g.memset_u8(b.recv_buf.ptr, 0xff, b.recv_buf.bytes)?;
        g.memset_u8(b.combine_recv_buf.ptr, 0xff, b.combine_recv_buf.bytes)?;
        bufs.insert(rank, b);
    }
    Ok(bufs)
}

/// A local rank's wire fields of `LlRankArgs` (zero when the job stays on one node).
fn wire_args(across: Option<&LlAcross>, rank: u32) -> LlRankArgs {
    let Some(a) = across else { return LlRankArgs::default() };
    let w = a.links().rank(rank);
    LlRankArgs {
        wire_recv_area: w.recv_area,
        wire_send_area: w.send_area,
        ring_slots: w.ring_slots,
        ring_ticket: a.tickets[&rank].ptr,
        count_seen: a.count_seen[&rank].ptr,
        ring_mask: w.ring_mask,
        recv_area_offset: w.recv_area_offset,
        send_area_offset: w.send_area_offset,
        ..LlRankArgs::default()
    }
}
