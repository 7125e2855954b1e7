//! Low-latency dispatch and combine on the hardware: buffers, launches and the checks of
//! DeepEP's `test_low_latency.py` (per-expert counts, layout ranges, every received message
//! equals its source token's FP8 cast, combine = top-k weighted sum within bf16 rounding).

use eptwin_engine::deepep::bytes::{ll_combine_msg_bytes, ll_dispatch_msg_bytes};
use eptwin_engine::plan::{DeepEpJob, JobPlan};
use eptwin_engine::plan::{Dtype, OpKind};
use eptwin_engine::routing::RoutingTable;
use eptwin_engine::transport::{OpSample, PhaseTime};

use crate::cuda::DeviceBuffer;
use crate::data::{self, RankTokens};
use crate::error::HwError;
use crate::exec::{
    Devices, DigestRegion, Failures, Timer, bf16_close, digest, parallel_map, record_digest,
};
use crate::intranode::{dev_of, dev_of_ref};
use crate::kernel_args;

/// Same fields, same order as `LlRankArgs` in low_latency.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct LlRankArgs {
    x: u64,
    topk_idx: u64,
    topk_weights: u64,
    send_buf: u64,
    atomic_counter: u64,
    finish_counter: u64,
    recv_buf: u64,
    recv_count: u64,
    packed_recv_x: u64,
    packed_recv_scales: u64,
    packed_recv_src_info: u64,
    packed_recv_slot: u64,
    packed_recv_layout_range: u64,
    packed_recv_count: u64,
    combine_x: u64,
    combine_recv_buf: u64,
    combine_recv_flag: u64,
    combined_x: u64,
    num_tokens: i32,
    reserved: i32,
}

/// Same fields, same order as `LlParams` in low_latency.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct LlParams {
    timeout_ns: u64,
    msg_bytes: u64,
    combine_slot_bytes: u64,
    num_ranks: i32,
    num_experts: i32,
    num_topk: i32,
    max_tokens: i32,
    capacity: i32,
    rank_base: i32,
    num_local_ranks: i32,
    phases: i32,
    use_discard: i32,
    warps_per_group: i32,
    dispatch_fp8: i32,
    reserved: i32,
}

const PHASE_SEND: i32 = 1;
const PHASE_RECV: i32 = 2;
/// Warps per receiving group: 8 groups of 4 warps in a 32-warp block (named barriers 2..9).
pub const WARPS_PER_GROUP: i32 = 4;
pub const LL_THREADS: u32 = 1024;
/// `LL_MAX_ITEMS_PER_BLOCK` in low_latency.cu.
const MAX_ITEMS_PER_BLOCK: u32 = 128;

/// What a receiving rank's local expert must hold after dispatch: per source rank, the
/// (token, top-k slot) pairs in token order.
#[derive(Debug, Clone, Default)]
pub struct ExpertExpectation {
    pub from: Vec<Vec<(u32, u32)>>,
}

impl ExpertExpectation {
    pub fn count(&self) -> usize {
        self.from.iter().map(|v| v.len()).sum()
    }
}

/// `[rank][local expert]` expectations from the routing.
pub fn expectations(routing: &RoutingTable) -> Vec<Vec<ExpertExpectation>> {
    let n = routing.num_ranks as usize;
    let l = routing.experts_per_rank() as usize;
    let mut out = vec![vec![ExpertExpectation { from: vec![Vec::new(); n] }; l]; n];
    for s in 0..routing.num_ranks {
        for t in 0..routing.tokens_per_rank {
            for (k, &e) in routing.experts(s, t).iter().enumerate() {
                if e >= 0 {
                    let (d, le) = (e as usize / l, e as usize % l);
                    out[d][le].from[s as usize].push((t, k as u32));
                }
            }
        }
    }
    out
}

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
    bufs: Vec<RankBuffers>,
    args: Vec<DeviceBuffer>,
    use_discard: bool,
    dispatched: bool,
    reference_digest: [Option<u64>; 2],
    pub launch: LlLaunch,
}

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

    pub fn prepare(
        devs: &mut Devices,
        job: &JobPlan,
        d: &DeepEpJob,
        gpu_of_rank: &[u32],
        use_discard: bool,
        launch: LlLaunch,
    ) -> Result<LlJob, HwError> {
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
        let tokens: Vec<RankTokens> = parallel_map(n as usize, |r| {
            data::generate(w.seed, r as u32, w.tokens_per_rank as usize, w.hidden as usize)
        });
        let (t, tt, h, k) =
            (max_tokens as usize, w.tokens_per_rank as usize, w.hidden as usize, w.topk as usize);
        let (e, l, nn, cap) =
            (w.experts as usize, (w.experts / n) as usize, n as usize, capacity as usize);
        let msg = msg_stride(w.hidden, fp8) as usize;
        let cslot = combine_slot(w.hidden) as usize;
        let pay = if fp8 { h } else { 2 * h };
        let mut bufs = Vec::with_capacity(nn);
        for r in 0..nn {
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
            // Poison the receive slots once: a message that never arrives cannot look valid.
            g.memset_u8(b.recv_buf.ptr, 0xff, b.recv_buf.bytes)?;
            g.memset_u8(b.combine_recv_buf.ptr, 0xff, b.combine_recv_buf.bytes)?;
            bufs.push(b);
        }
        let all: Vec<LlRankArgs> = bufs
            .iter()
            .map(|b| LlRankArgs {
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
                num_tokens: tt as i32,
                reserved: 0,
            })
            .collect();
        let mut args = Vec::new();
        for dev in &devs.list {
            let a = dev.gpu.alloc(std::mem::size_of_val(all.as_slice()))?;
            dev.gpu.upload(&a, &all)?;
            args.push(a);
        }
        devs.sync("low-latency setup")?;
        Ok(LlJob {
            n,
            hidden: w.hidden,
            topk: w.topk,
            experts: w.experts,
            max_tokens,
            capacity,
            fp8,
            hook: w.hook,
            msg_bytes: msg as u64,
            combine_slot_bytes: cslot as u64,
            tokens,
            routing,
            expect,
            bufs,
            args,
            use_discard,
            dispatched: false,
            reference_digest: [None, None],
            launch,
        })
    }

    fn params(&self, devs: &Devices, i: usize, phases: i32, dispatch: bool) -> LlParams {
        let dev = &devs.list[i];
        LlParams {
            timeout_ns: devs.timeout_ns(),
            msg_bytes: self.msg_bytes,
            combine_slot_bytes: self.combine_slot_bytes,
            num_ranks: self.n as i32,
            num_experts: self.experts as i32,
            num_topk: self.topk as i32,
            max_tokens: self.max_tokens as i32,
            capacity: self.capacity as i32,
            rank_base: dev.rank_base() as i32,
            num_local_ranks: dev.ranks.len() as i32,
            phases,
            use_discard: (self.use_discard
                && (!dispatch || crate::intranode::discard_in_dispatch()))
                as i32,
            warps_per_group: WARPS_PER_GROUP,
            dispatch_fp8: self.fp8 as i32,
            reserved: 0,
        }
    }

    /// Launch `kernel` on every GPU; with hook mode the send and receive phases are separate
    /// launches with a mark between them.
    /// One timed launch of `kernel` as DeepEP's tests time it: setup synchronised, device error
    /// records cleared, L2 flushed, CUDA events around the launch; in hook mode the send and
    /// receive phases are timed apart.
    fn timed_launch(
        &self,
        devs: &mut Devices,
        kernel: &str,
        op: OpKind,
        job_id: eptwin_engine::ids::JobId,
        iteration: u32,
        warmup: bool,
    ) -> Result<OpSample, HwError> {
        let what = match op {
            OpKind::Dispatch => "low-latency dispatch",
            _ => "low-latency combine",
        };
        devs.sync(&format!("{what} setup"))?;
        devs.clear_errors()?;
        devs.flush_l2()?;
        let mut timer = Timer::start(devs)?;
        self.launch(devs, kernel, &mut timer)?;
        devs.finish(what)?;
        let mut sample =
            OpSample::new(job_id, op, iteration, warmup, timer.between_ns("start", "end")?);
        if self.hook {
            sample.phases = vec![
                PhaseTime { name: "send".into(), latency_ns: timer.between_ns("start", "send")? },
                PhaseTime { name: "recv".into(), latency_ns: timer.between_ns("send", "end")? },
            ];
        }
        Ok(sample)
    }

    fn launch(&self, devs: &Devices, kernel: &str, timer: &mut Timer) -> Result<(), HwError> {
        let phase_sets: &[(i32, &str)] = if self.hook {
            &[(PHASE_SEND, "send"), (PHASE_RECV, "end")]
        } else {
            &[(PHASE_SEND | PHASE_RECV, "end")]
        };
        for &(phases, mark) in phase_sets {
            for (i, dev) in devs.list.iter().enumerate() {
                let p = self.params(devs, i, phases, kernel == "ll_dispatch");
                let (args, err) = (self.args[i].ptr, dev.err.ptr);
                let mut a = kernel_args![args, p, err];
                let f = dev.module("low_latency")?.function(kernel);
                let grid = if kernel == "ll_dispatch" {
                    self.launch.dispatch_blocks[i]
                } else {
                    self.launch.combine_blocks[i]
                };
                // SAFETY: args match (args, params, err); the grid is at most what is resident.
                unsafe { dev.gpu.launch(f, grid, self.launch.threads, &mut a)? };
            }
            timer.mark(devs, mark)?;
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
        // Counters start at zero (DeepEP's kernels clean them for the next call; here the host
        // does it before the timed region) and outputs are poisoned.
        for (r, b) in self.bufs.iter().enumerate() {
            let g = &dev_of_ref(devs, gpu_of_rank[r]).gpu;
            for buf in [&b.atomic_counter, &b.finish_counter, &b.recv_count] {
                g.memset_u8(buf.ptr, 0, buf.bytes)?;
            }
            for buf in [
                &b.packed_recv_x,
                &b.packed_recv_scales,
                &b.packed_recv_src_info,
                &b.packed_recv_slot,
                &b.packed_recv_layout_range,
                &b.packed_recv_count,
            ] {
                g.memset_u8(buf.ptr, 0xff, buf.bytes)?;
            }
            // Earlier iterations left the same messages in the receive slots: poison them before
            // the host-checked iteration so that a message never written cannot pass.
            if !warmup && iteration == 0 {
                g.memset_u8(b.recv_buf.ptr, 0xff, b.recv_buf.bytes)?;
            }
        }
        let mut sample =
            self.timed_launch(devs, "ll_dispatch", OpKind::Dispatch, job_id, iteration, warmup)?;
        let msgs = self.selections();
        let dtype = if self.fp8 { Dtype::Fp8 } else { Dtype::Bf16 };
        sample.nvlink_bytes = msgs * ll_dispatch_msg_bytes(self.hidden, dtype);
        self.dispatched = true;

        let pay = if self.fp8 { self.hidden as u64 } else { 2 * self.hidden as u64 };
        let l = (self.experts / self.n) as u64;
        let mut dg = 0u64;
        for dev in &devs.list {
            let mut regions = Vec::new();
            for &r in &dev.ranks {
                let b = &self.bufs[r as usize];
                let counts = b.packed_recv_count.ptr;
                let packed = |ptr: u64, row_bytes: u64| DigestRegion {
                    ptr,
                    num_rows: l * self.capacity as u64,
                    row_words: (row_bytes / 4) as i32,
                    row_stride_words: row_bytes / 4,
                    row_counts: counts,
                    rows_per_group: self.capacity as i32,
                };
                regions.push(packed(b.packed_recv_x.ptr, pay));
                if self.fp8 {
                    regions.push(packed(b.packed_recv_scales.ptr, self.hidden as u64 / 128 * 4));
                }
                regions.push(DigestRegion {
                    ptr: b.packed_recv_layout_range.ptr,
                    num_rows: l * self.n as u64,
                    row_words: 2,
                    row_stride_words: 2,
                    row_counts: 0,
                    rows_per_group: 1,
                });
            }
            dg = dg.wrapping_add(digest(dev, &regions)?);
        }
        let host_check = if !warmup && iteration == 0 {
            Some(self.check_dispatch(devs, gpu_of_rank)?)
        } else {
            None
        };
        record_digest(
            &mut sample,
            &mut self.reference_digest[0],
            dg,
            "low-latency dispatch",
            host_check,
        );
        Ok(sample)
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
        let l = (self.experts / self.n) as i32;
        for (r, b) in self.bufs.iter().enumerate() {
            let dev = dev_of_ref(devs, gpu_of_rank[r]);
            let (px, ps, pc, out) = (
                b.packed_recv_x.ptr,
                b.packed_recv_scales.ptr,
                b.packed_recv_count.ptr,
                b.combine_x.ptr,
            );
            let (cap, base, hidden, fp8) =
                (self.capacity as i32, r as i32 * l, self.hidden as i32, self.fp8 as i32);
            let mut a = kernel_args![px, ps, pc, cap, l, base, hidden, fp8, out];
            let f = dev.module("testdata")?.function("make_expert_output_ll");
            // SAFETY: packed buffers hold l·capacity rows; combine_x has the same shape in bf16.
            unsafe { dev.gpu.launch(f, dev.gpu.sm_count * 4, 256, &mut a)? };
            dev.gpu.memset_u8(b.combine_recv_flag.ptr, 0, b.combine_recv_flag.bytes)?;
            dev.gpu.memset_u8(b.combined_x.ptr, 0xff, b.combined_x.bytes)?;
            if !warmup && iteration == 0 {
                dev.gpu.memset_u8(b.combine_recv_buf.ptr, 0xff, b.combine_recv_buf.bytes)?;
            }
        }
        let mut sample =
            self.timed_launch(devs, "ll_combine", OpKind::Combine, job_id, iteration, warmup)?;
        sample.nvlink_bytes = self.selections() * ll_combine_msg_bytes(self.hidden, Dtype::Bf16);

        let mut dg = 0u64;
        let tt = self.routing.tokens_per_rank as u64;
        for dev in &devs.list {
            let regions: Vec<DigestRegion> = dev
                .ranks
                .iter()
                .map(|&r| DigestRegion {
                    ptr: self.bufs[r as usize].combined_x.ptr,
                    num_rows: tt,
                    row_words: (self.hidden / 2) as i32,
                    row_stride_words: self.hidden as u64 / 2,
                    row_counts: 0,
                    rows_per_group: 1,
                })
                .collect();
            dg = dg.wrapping_add(digest(dev, &regions)?);
        }
        let host_check = if !warmup && iteration == 0 {
            Some(self.check_combine(devs, gpu_of_rank)?)
        } else {
            None
        };
        record_digest(
            &mut sample,
            &mut self.reference_digest[1],
            dg,
            "low-latency combine",
            host_check,
        );
        Ok(sample)
    }

    /// Valid (token, expert) selections over all ranks: DeepEP's LL byte counts use these.
    pub fn selections(&self) -> u64 {
        self.routing.topk_idx.iter().filter(|&&e| e >= 0).count() as u64
    }

    /// Selections from each source rank to each destination rank (NCCL baseline volumes).
    pub fn pair_rows(&self) -> Vec<Vec<u64>> {
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

    fn check_dispatch(
        &self,
        devs: &Devices,
        gpu_of_rank: &[u32],
    ) -> Result<(Vec<String>, Vec<String>), HwError> {
        let (n, h) = (self.n as usize, self.hidden as usize);
        let l = (self.experts / self.n) as usize;
        let cap = self.capacity as usize;
        let pay = if self.fp8 { h } else { 2 * h };
        let ns = h / 128;
        struct Got {
            count: Vec<i32>,
            range: Vec<i64>,
            src: Vec<i32>,
            slot: Vec<i32>,
            x: Vec<u8>,
            scales: Vec<f32>,
        }
        let mut got = Vec::with_capacity(n);
        for (r, &gpu) in gpu_of_rank.iter().enumerate().take(n) {
            let g = &dev_of_ref(devs, gpu).gpu;
            let b = &self.bufs[r];
            let mut count = vec![0i32; l];
            g.download(b.packed_recv_count.ptr, &mut count)?;
            let mut range = vec![0i64; l * n];
            g.download(b.packed_recv_layout_range.ptr, &mut range)?;
            let mut src = vec![0i32; l * cap];
            g.download(b.packed_recv_src_info.ptr, &mut src)?;
            let mut slot = vec![0i32; l * cap];
            g.download(b.packed_recv_slot.ptr, &mut slot)?;
            let mut x = vec![0u8; l * cap * pay];
            g.download(b.packed_recv_x.ptr, &mut x)?;
            let mut scales = vec![0f32; if self.fp8 { l * cap * ns } else { 0 }];
            g.download(b.packed_recv_scales.ptr, &mut scales)?;
            got.push(Got { count, range, src, slot, x, scales });
        }
        let results = parallel_map(n, |r| {
            let gr = &got[r];
            let (mut counts, mut data) = (Failures::default(), Failures::default());
            for le in 0..l {
                let ex = &self.expect[r][le];
                let e = r * l + le;
                if gr.count[le] as usize != ex.count() {
                    counts.push(|| {
                        format!(
                            "rank {r} expert {e}: {} tokens, expected {}",
                            gr.count[le],
                            ex.count()
                        )
                    });
                    continue;
                }
                let mut begin = 0usize;
                for (s, want) in ex.from.iter().enumerate() {
                    let range = gr.range[le * n + s];
                    let (rb, rn) = ((range & 0xffff_ffff) as usize, (range >> 32) as usize);
                    if rb != begin || rn != want.len() {
                        counts.push(|| format!(
                            "rank {r} expert {e} source {s}: layout range (begin {rb}, count {rn}), expected ({begin}, {})",
                            want.len()
                        ));
                        begin += want.len();
                        continue;
                    }
                    let mut seen: Vec<(u32, u32)> = (begin..begin + rn)
                        .map(|row| (gr.src[le * cap + row] as u32, gr.slot[le * cap + row] as u32))
                        .collect();
                    let rows_of: Vec<usize> = {
                        let mut idx: Vec<usize> = (0..rn).collect();
                        idx.sort_by_key(|&i| seen[i]);
                        idx
                    };
                    seen.sort_unstable();
                    if seen != *want {
                        counts.push(|| format!(
                            "rank {r} expert {e} source {s}: received (token, slot) set differs from the routing"
                        ));
                        begin += rn;
                        continue;
                    }
                    let tok = &self.tokens[s];
                    for (i, &(t, _)) in want.iter().enumerate() {
                        let row = begin + rows_of[i];
                        let have = &gr.x[(le * cap + row) * pay..(le * cap + row + 1) * pay];
                        let want_bytes: &[u8] = if self.fp8 {
                            tok.fp8_row(t as usize)
                        } else {
                            bytes_of_u16(tok.bf16_row(t as usize))
                        };
                        if have != want_bytes {
                            data.push(|| format!(
                                "rank {r} expert {e} row {row}: payload differs from the cast of source rank {s} token {t}"
                            ));
                        }
                        if self.fp8
                            && gr.scales[(le * cap + row) * ns..(le * cap + row + 1) * ns]
                                != *tok.scales_row(t as usize)
                        {
                            data.push(|| format!("rank {r} expert {e} row {row}: FP8 scales differ (source rank {s} token {t})"));
                        }
                    }
                    begin += rn;
                }
            }
            (counts, data)
        });
        let (mut counts, mut data) = (Failures::default(), Failures::default());
        for (a, b) in results {
            counts.extend(a);
            data.extend(b);
        }
        let checks = vec![
            "low-latency dispatch: per-expert counts and per-source layout ranges match the routing".to_string(),
            "low-latency dispatch: each expert received exactly its (token, top-k slot) pairs".to_string(),
            "low-latency dispatch: every message equals the FP8 cast (payload and per-128 scales) of its source token".to_string(),
        ];
        let mut failures = counts.into_lines("low-latency dispatch layout");
        failures.extend(data.into_lines("low-latency dispatch data"));
        Ok((checks, failures))
    }

    fn check_combine(
        &self,
        devs: &Devices,
        gpu_of_rank: &[u32],
    ) -> Result<(Vec<String>, Vec<String>), HwError> {
        let (n, h, k) = (self.n as usize, self.hidden as usize, self.topk as usize);
        let tt = self.routing.tokens_per_rank as usize;
        let mut got = Vec::with_capacity(n);
        for (r, &gpu) in gpu_of_rank.iter().enumerate().take(n) {
            let g = &dev_of_ref(devs, gpu).gpu;
            let mut x = vec![0u16; tt * h];
            g.download(self.bufs[r].combined_x.ptr, &mut x)?;
            got.push(x);
        }
        let results = parallel_map(n, |s| {
            let tok = &self.tokens[s];
            let mut f = Failures::default();
            let mut worst = 0f64;
            let (mut gv, mut wv) = (Vec::with_capacity(h), Vec::with_capacity(h));
            for t in 0..tt {
                let experts = self.routing.experts(s as u32, t as u32);
                let weights = self.routing.weights(s as u32, t as u32);
                gv.clear();
                wv.clear();
                for hi in 0..h {
                    let v = tok.value(t, hi);
                    let mut acc = 0f32;
                    let mut mag = 0f32;
                    for j in 0..k {
                        if experts[j] < 0 {
                            continue;
                        }
                        let out = data::bf16_to_f32(data::expert_output(
                            v,
                            data::expert_factor(experts[j] as u32),
                        ));
                        acc = weights[j].mul_add(out, acc);
                        mag += (weights[j] * out).abs();
                    }
                    let want = data::bf16_to_f32(data::f32_to_bf16(acc));
                    let have = data::bf16_to_f32(got[s][t * h + hi]);
                    gv.push(have);
                    wv.push(want);
                    if !bf16_close(have, want, mag) {
                        f.push(|| {
                            format!("rank {s} token {t} element {hi}: {have}, expected {want}")
                        });
                    }
                }
                worst = worst.max(data::calc_diff(&gv, &wv));
            }
            (f, worst)
        });
        let (mut f, mut worst) = (Failures::default(), 0f64);
        for (a, w) in results {
            f.extend(a);
            worst = worst.max(w);
        }
        let checks = vec![
            "low-latency combine: every element equals the top-k weighted sum of the expert outputs within bf16 rounding"
                .to_string(),
            format!("low-latency combine: worst per-token calc_diff {worst:.3e} (DeepEP's bound 1e-5)"),
        ];
        let mut failures = f.into_lines("low-latency combine data");
        if worst > 1e-5 {
            failures.push(format!(
                "low-latency combine: calc_diff {worst:.3e} above DeepEP's bound 1e-5"
            ));
        }
        Ok((checks, failures))
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

fn bytes_of_u16(v: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding; the byte view covers the same memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eptwin_engine::plan::Workload;

    #[test]
    fn message_strides() {
        // 16 + 7168 + 224 = 7408 bytes (DeepEP's message), padded to 58 lines.
        assert_eq!(msg_stride(7168, true), 7424);
        assert_eq!(msg_stride(7168, false), 14464);
        assert_eq!(combine_slot(7168), 14336);
    }

    #[test]
    fn expectations_cover_every_selection() {
        let spec = Workload { masked_selections: 10, ..Workload::new(64, 256, 8, 64) };
        let rt = eptwin_engine::routing::generate(&spec, 8);
        let ex = expectations(&rt);
        let total: usize = ex.iter().flatten().map(|e| e.count()).sum();
        assert_eq!(total as u64, rt.topk_idx.iter().filter(|&&e| e >= 0).count() as u64);
        for per_rank in &ex {
            for e in per_rank {
                for v in &e.from {
                    assert!(
                        v.windows(2).all(|w| w[0].0 < w[1].0),
                        "a token selects an expert once"
                    );
                }
            }
        }
        let cap = LlJob::capacity(&ex);
        assert_eq!(cap % 16, 0);
        assert!(cap as usize >= ex.iter().flatten().map(|e| e.count()).max().unwrap());
    }
}
