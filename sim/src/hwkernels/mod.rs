//! The hardware backend's kernels for a job whose ranks all share one GPU
//! (`kernels/cuda/intranode.cu`, `kernels/cuda/low_latency.cu`; results/h200/README.md, "Kernel
//! shape" and "Deviations"). DeepEP cannot place several ranks on one GPU, so these are the
//! kernels that ran wherever a job looks like this; the DeepEP models (`intranode`, `ll`) stay
//! for ranks on separate GPUs.
//!
//! The GPU is modelled as its SMs see it (profile `[gpu.memory]`, every number measured by the
//! backend's probes, docs/calibration.md):
//!
//! * **Bandwidth.** Every load and store of the kernels goes through L2: one FIFO server at the
//!   L2 rate carries all of them. Bytes that come from HBM or are written back to it also cross
//!   the HBM server (the rate SM-driven copies reach, not the copy engines' memcpy rate). What
//!   crosses HBM follows the kernels' cache hints and sizes: inputs come from HBM (the timing
//!   flushes L2 before every op); ring slots are stored evict-last and dropped from L2 once
//!   consumed, so they stay in L2 while the slots in flight fit in it and spill (written back,
//!   read again from HBM) beyond that; outputs and the low-latency receive buffers, far larger
//!   than L2, are written back. A slot stored by one SM and loaded by another while in L2
//!   costs the L2 more than a streaming copy's bytes (`l2_ring_bw_gbps`), and every
//!   `discard.global.L2` of a consumed slot or message costs it too (`l2_discard_bw_gbps`):
//!   both measured by the ring-handoff probe, which no plain copy probe is like.
//! * **Latency.** A warp copying a row with 7 loads in flight per lane is latency-bound: it
//!   needs the measured time per round of loads (source in L2 or in HBM) however many rows it
//!   copies. Dependent loads, atomics, releases and flags add their measured latencies where
//!   the kernels' code makes them wait. A copy completes when the slowest of its warps' chain,
//!   the L2 server and the HBM server is done.
//! * **Grid.** One launch covers every rank on the GPU (CUDA events around it, so the launch
//!   cost as the events see it is added once); every rank's op ends when the launch does.
//!   Normal kernels: `num_sms` blocks per rank (sender and receiver per channel) with the
//!   backend's block size; low-latency kernels: one 1,024-thread block per SM, items of all
//!   ranks interleaved over them, each block working through its items one after another.

pub mod cluster;

use std::collections::VecDeque;

use eptwin_engine::plan::{
    Config, DeepEpJob, Dtype, OpKind, Plan, RoutingTable, ll_combine_msg_bytes,
    ll_dispatch_msg_bytes, normal_combine_token_bytes, normal_dispatch_token_bytes,
};
use eptwin_engine::transport::OpSample;

use crate::core::time::Time;
use crate::core::world::Program;
use crate::core::{Action, Core, ProgId};
use crate::deepep::ring::Ring;
use crate::deepep::{Ledger, Meta, Ranks, channel_range, deepep_job};
use crate::params::OneGpu;
use eptwin_engine::rng::mix;

/// int4 (16 B) per lane per round of `UNROLLED_WARP_COPY(7, …)`: 7 loads of 16 B in flight per
/// lane, 32 lanes.
const INT4_PER_ROUND: u64 = 7 * 32;
/// The probes' row: 7,168 bytes = 448 int4 = two rounds.
const PROBE_ROW_ROUNDS: u64 = 2;
/// Low-latency kernels: 1,024 threads (`LL_THREADS`), receive groups of 4 warps
/// (`WARPS_PER_GROUP`, hw/src/low_latency.rs): 8 groups per block.
const LL_GROUPS: u32 = 8;
const LL_WARPS_PER_GROUP: u32 = 4;
/// Low-latency dispatch: threads that cast a token to FP8 (all warps but the counting warp).
const LL_CAST_THREADS: u64 = 31 * 32;
/// Normal combine: warps that reduce one token together (`COMBINE_GROUP_WARPS`).
const COMBINE_GROUP_WARPS: u32 = 5;

/// Whether job `job` runs the one-GPU kernels: the profile describes the GPU's memory system
/// and every rank of the job is on the same GPU (and there are at least two).
pub fn applies(plan: &Plan, core: &Core, meta: &Meta) -> bool {
    let gpus = &core.jobs[meta.job.index()].gpu;
    core.params.one_gpu.is_some()
        && gpus.len() > 1
        && gpus.iter().all(|&g| g == gpus[0])
        && !deepep_job(plan, meta.job).workload.hook
}

/// Time of the latency chain of one warp copying `int4` 16-byte words with 7 loads in flight
/// per lane: whole rounds, each `row / 2` (the probes' 7,168-byte row is two rounds).
fn warp_copy(int4: u64, row: Time) -> Time {
    int4.div_ceil(INT4_PER_ROUND) * row / PROBE_ROW_ROUNDS
}

/// Set the GPU's L2 and HBM servers to the profile's rates and give it one port server per SM
/// (the world builds the GPUs before the program knows it models one GPU; their state carries
/// over between ops).
pub(super) fn memory_servers(core: &mut Core, gpu: u32, m: &OneGpu) {
    let sms = core.params.sm_count.max(1) as usize;
    let g = &mut core.gpus.gpus[gpu as usize];
    g.l2.rate = m.l2_rate;
    g.dram.rate = m.dram_rate;
    g.l2_hbm = m.l2_hbm_rate;
    if g.sms.len() != sms {
        g.sms = vec![crate::gpu::Server::new(m.sm_port); sms];
    }
}

/// The GPU's L2 and HBM servers' counters, to report what one op moved through them.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MemSnap {
    l2_bytes: u64,
    l2_busy: Time,
    dram_bytes: u64,
    dram_busy: Time,
}

impl MemSnap {
    pub(super) fn of(core: &Core, gpu: u32) -> MemSnap {
        let g = &core.gpus.gpus[gpu as usize];
        MemSnap {
            l2_bytes: g.l2.bytes,
            l2_busy: g.l2.busy_ps,
            dram_bytes: g.dram.bytes,
            dram_busy: g.dram.busy_ps,
        }
    }

    /// What moved since `self` over a kernel of `span`: the figures Nsight Compute reports
    /// for the same kernel (SM-side L2 bytes, HBM bytes, how busy each was).
    pub(super) fn report(self, core: &Core, gpu: u32, span: Time) -> String {
        let now = MemSnap::of(core, gpu);
        let pct = |busy: Time| 100.0 * busy as f64 / span.max(1) as f64;
        format!(
            "one-GPU model: {:.2} GB SM-side L2 traffic (L2 busy {:.0} %), {:.2} GB HBM traffic (HBM busy {:.0} %)",
            (now.l2_bytes - self.l2_bytes) as f64 / 1e9,
            pct(now.l2_busy - self.l2_busy),
            (now.dram_bytes - self.dram_bytes) as f64 / 1e9,
            pct(now.dram_busy - self.dram_busy),
        )
    }
}

/// The backend times every op after a 256 MB memset that flushes L2 (hw/src/exec.rs
/// `flush_l2`), which leaves the L2 full of the memset's dirty lines: the op's first `l2_bytes`
/// of new lines each evict one, written back to HBM. `take` returns the write-back a step's new
/// lines cause.
#[derive(Debug, Clone, Copy)]
pub(super) struct FlushedL2 {
    pub(super) dirty: u64,
}

impl FlushedL2 {
    pub(super) fn take(&mut self, new_lines: u64) -> u64 {
        let w = self.dirty.min(new_lines);
        self.dirty -= w;
        w
    }
}

/// L2 bytes that ring slots in flight can occupy. The L2 is two partitions, each caching the
/// lines its own SMs access (H100/H200: the SMs of the GPCs attached to it), so a slot stored by
/// a block on one side and loaded by a block on the other is held twice. Senders and receivers
/// land on either side alike (blocks fill the SMs in launch order), so half the slots cross:
/// each slot takes 1.5 slots of L2 on average.
fn ring_capacity(l2_bytes: u64) -> u64 {
    l2_bytes * 2 / 3
}

/// Threads per block of the normal kernels (hw/src/kernel_defines.rs
/// `normal_thread_candidates`): DeepEP's 768 when one block per SM fits, fewer when several
/// must share an SM; whole warps per rank.
fn normal_threads(num_ranks: u32, blocks_per_gpu: u32, sm_count: u32) -> u32 {
    let min_blocks = blocks_per_gpu.div_ceil(sm_count.max(1));
    let candidates: &[u32] = match min_blocks {
        0 | 1 => &[768, 512, 256],
        2 => &[512, 256],
        _ => &[256],
    };
    candidates.iter().copied().find(|t| t % (32 * num_ranks) == 0).unwrap_or(32 * num_ranks)
}

/// Ring slots in flight on the GPU and which of them spill: a store made while the slots in
/// flight (stored, not yet consumed, all rings of the GPU) exceed the L2 is written back to HBM
/// beyond that capacity, and its consumer reads those bytes from HBM. Per ring, the stores are
/// consumed oldest first, token by token.
#[derive(Debug, Clone, Default)]
struct SpillBook {
    cap_bytes: u64,
    tok_bytes: u64,
    in_flight: u64,
    /// Per ring: (tokens not yet consumed, bytes of them spilled) per store, oldest first.
    rings: Vec<VecDeque<(u32, u64)>>,
    /// Bytes that spilled (for the op's report).
    spilled: u64,
}

impl SpillBook {
    fn new(rings: usize, cap_bytes: u64, tok_bytes: u64) -> SpillBook {
        SpillBook {
            cap_bytes,
            tok_bytes,
            rings: vec![VecDeque::new(); rings],
            ..Default::default()
        }
    }

    /// Store `k` tokens into ring `ri`: the bytes that spill.
    fn store(&mut self, ri: usize, k: u32) -> u64 {
        let bytes = k as u64 * self.tok_bytes;
        let before = self.in_flight;
        self.in_flight += bytes;
        let spill = self.in_flight.saturating_sub(self.cap_bytes.max(before)).min(bytes);
        self.spilled += spill;
        if k > 0 {
            self.rings[ri].push_back((k, spill));
        }
        spill
    }

    /// Consume `k` tokens from ring `ri`, oldest first: the spilled bytes among them.
    fn consume(&mut self, ri: usize, k: u32) -> u64 {
        let mut left = k;
        let mut spilled = 0;
        while left > 0 {
            let Some(front) = self.rings[ri].front_mut() else { break };
            let take = front.0.min(left);
            let share = front.1 * take as u64 / front.0 as u64;
            spilled += share;
            front.0 -= take;
            front.1 -= share;
            left -= take;
            if front.0 == 0 {
                self.rings[ri].pop_front();
            }
        }
        self.in_flight = self.in_flight.saturating_sub((k - left) as u64 * self.tok_bytes);
        spilled
    }
}

// =============================================================================================
// Normal intranode dispatch and combine
// =============================================================================================

pub struct NormalProgram {
    meta: Meta,
    me: ProgId,
    dispatch: bool,
    n: u32,
    channels: u32,
    tokens: u32,
    gpu: u32,
    global: Vec<u32>,
    /// Bytes of one token in a ring slot; read from the source per token; written per output.
    tok_bytes: u64,
    in_bytes: u64,
    out_bytes: u64,
    /// int4 of the copied payload per token (the warps' copy loop).
    payload_int4: u64,
    /// Bytes a receiver drops from L2 per consumed slot: the payload's 128-byte lines.
    discard_bytes: u64,
    chunk: u32,
    warps_per_block: u32,
    blocks_per_rank: u32,
    sm_count: u32,
    m: OneGpu,
    launch: Time,
    flag: Time,
    ranks: Ranks,
    routing: RoutingTable,
    rings: Vec<Ring>,
    spill: SpillBook,
    /// Dispatch: next token per sender (src, channel); combine: per-(holder, channel, dst)
    /// streams of tokens and positions.
    next: Vec<u32>,
    streams: Vec<Vec<u32>>,
    pos: Vec<u32>,
    /// Dispatch receivers (dst, channel, src): tokens expected; batch being copied.
    expected: Vec<u32>,
    batch: Vec<(u32, u64)>,
    /// Combine receivers (rank, channel): ring pops to publish after the batch.
    touched: Vec<Vec<(u32, u32)>>,
    workers_left: u32,
    ledger: Ledger,
    mem0: MemSnap,
    flushed: FlushedL2,
}

/// What both normal-mode programs (global rings here, cluster rings in `cluster`) read
/// first: the job, its rank count, the op's `Config` and channels, the one-GPU parameters and the
/// GPU, whose memory servers this sets up.
pub(super) struct NormalSetup<'a> {
    pub d: &'a DeepEpJob,
    pub n: u32,
    pub dispatch: bool,
    pub cfg: Config,
    pub channels: u32,
    pub m: OneGpu,
    pub gpu: u32,
}

pub(super) fn normal_setup<'a>(plan: &'a Plan, core: &mut Core, meta: Meta) -> NormalSetup<'a> {
    let d = deepep_job(plan, meta.job);
    let dispatch = meta.op == OpKind::Dispatch;
    let cfg: Config = if dispatch { d.dispatch_config } else { d.combine_config }
        .expect("normal mode has a resolved Config");
    let m = core.params.one_gpu.expect("one-GPU model");
    let gpu = core.jobs[meta.job.index()].gpu[0];
    memory_servers(core, gpu, &m);
    NormalSetup {
        d,
        n: plan.job(meta.job).num_ranks(),
        dispatch,
        cfg,
        channels: cfg.num_channels().max(1),
        m,
        gpu,
    }
}

impl NormalProgram {
    pub fn new(plan: &Plan, core: &mut Core, meta: Meta) -> NormalProgram {
        let NormalSetup { d, n, dispatch, cfg, channels, m, gpu } = normal_setup(plan, core, meta);
        let w = &d.workload;
        let (tok_bytes, in_bytes, out_bytes, payload_int4) = if dispatch {
            let b = normal_dispatch_token_bytes(w.hidden, w.topk, w.dispatch_dtype);
            // The warps copy the payload (FP8 or BF16); scales and metadata go lane by lane.
            let payload = match w.dispatch_dtype {
                Dtype::Fp8 => w.hidden as u64,
                _ => 2 * w.hidden as u64,
            };
            (b, b, b, payload / 16)
        } else {
            let b = normal_combine_token_bytes(w.hidden, w.topk);
            (b, 2 * w.hidden as u64, 2 * w.hidden as u64, 2 * w.hidden as u64 / 16)
        };
        let blocks_per_gpu = n * cfg.num_sms;
        let threads = normal_threads(n, blocks_per_gpu, core.params.sm_count);
        let mut p = NormalProgram {
            meta,
            me: 0,
            dispatch,
            n,
            channels,
            tokens: w.tokens_per_rank,
            gpu,
            global: core.jobs[meta.job.index()].ranks.iter().map(|r| r.0).collect(),
            tok_bytes,
            in_bytes,
            out_bytes,
            payload_int4,
            discard_bytes: (payload_int4 * 16).div_ceil(128) * 128,
            chunk: cfg.num_max_nvl_chunked_send_tokens.max(1),
            warps_per_block: threads / 32,
            blocks_per_rank: cfg.num_sms,
            sm_count: core.params.sm_count.max(1),
            m,
            launch: core.params.kernel_launch,
            flag: core.params.flag_latency,
            ranks: Ranks::new(n),
            routing: d.routing().clone(),
            rings: Vec::new(),
            spill: SpillBook::new(
                (channels * n * n) as usize,
                ring_capacity(m.l2_bytes),
                tok_bytes,
            ),
            next: Vec::new(),
            streams: Vec::new(),
            pos: Vec::new(),
            expected: Vec::new(),
            batch: Vec::new(),
            touched: Vec::new(),
            workers_left: 0,
            ledger: Ledger::new(n),
            mem0: MemSnap::of(core, gpu),
            flushed: FlushedL2 { dirty: m.l2_bytes },
        };
        for _ in 0..channels * n * n {
            p.rings.push(Ring::new(core, cfg.num_max_nvl_chunked_recv_tokens));
        }
        p.build();
        p
    }

    /// The SM of block `k` of rank `r`: the launch's blocks fill the SMs in order, the ones
    /// beyond the SM count as second residents.
    /// A sender block's L2/HBM traffic: `read` bytes of input, `stored` bytes into ring slots
    /// (`spilled` of them written back to HBM; the ones that stay in L2 are handed to a
    /// receiver on another SM), issued over `issue`. Returns when the stores are done.
    fn ring_push(
        &mut self,
        core: &mut Core,
        sm: u32,
        read: u64,
        stored: u64,
        spilled: u64,
        issue: Time,
    ) -> Time {
        let dram = read + spilled + self.flushed.take(read + stored);
        let extra = self.m.l2_extra(stored - spilled, 0);
        core.sm_traffic(
            core.now,
            self.gpu,
            sm,
            read + stored,
            dram,
            extra,
            issue,
            Action::None,
            self.me,
            stored,
        )
    }

    /// A receiver block's traffic: `l2_bytes` through L2, `from_slots` bytes loaded from ring
    /// slots (`spilled` of them from HBM; the rest are the L2 handoff's other half, and every
    /// consumed slot's payload lines are discarded), `out` bytes written to the output.
    #[allow(clippy::too_many_arguments)]
    fn ring_drain(
        &mut self,
        core: &mut Core,
        sm: u32,
        l2_bytes: u64,
        from_slots: u64,
        spilled: u64,
        out: u64,
        issue: Time,
    ) -> Time {
        let dram = spilled + out + self.flushed.take(spilled + out);
        let discarded = from_slots / self.tok_bytes * self.discard_bytes;
        let extra = self.m.l2_extra(from_slots - spilled, discarded);
        core.sm_traffic(
            core.now,
            self.gpu,
            sm,
            l2_bytes,
            dram,
            extra,
            issue,
            Action::None,
            self.me,
            0,
        )
    }

    fn sm_of(&self, r: u32, k: u32) -> u32 {
        (r * self.blocks_per_rank + k) % self.sm_count
    }

    fn range(&self, c: u32) -> (u32, u32) {
        channel_range(self.tokens, self.channels, c)
    }

    /// Ring (channel, producer, consumer).
    #[inline]
    fn ring(&self, c: u32, src: u32, dst: u32) -> usize {
        ((c * self.n + src) * self.n + dst) as usize
    }

    /// Combine stream (holder, channel, destination).
    #[inline]
    fn stream(&self, h: u32, c: u32, dst: u32) -> usize {
        ((h * self.channels + c) * self.n + dst) as usize
    }

    fn build(&mut self) {
        let (n, ch) = (self.n, self.channels);
        let mut ranks = Vec::new();
        if self.dispatch {
            self.next = (0..n * ch).map(|i| self.range(i % ch).0).collect();
            self.expected = vec![0; (n * ch * n) as usize];
            self.batch = vec![(0, 0); (n * ch * n) as usize];
        } else {
            self.streams = vec![Vec::new(); (n * ch * n) as usize];
            self.next = (0..n * ch).map(|i| self.range(i % ch).0).collect();
            self.touched = vec![Vec::new(); (n * ch) as usize];
        }
        for r in 0..n {
            for c in 0..ch {
                let (lo, hi) = self.range(c);
                for t in lo..hi {
                    self.routing.token_ranks(r, t, &mut ranks);
                    for &d in &ranks {
                        if self.dispatch {
                            self.expected[((d * ch + c) * n + r) as usize] += 1;
                            self.ledger.expect(d, mix(r, t, 0));
                        } else {
                            let s = self.stream(d, c, r);
                            self.streams[s].push(t);
                            self.ledger.expect(r, mix(d, t, 0));
                        }
                    }
                }
            }
        }
        self.pos = vec![0; self.streams.len()];
    }

    fn a_recv(&self, i: u32) -> u32 {
        if self.dispatch { self.n * self.channels + i } else { self.n * self.channels * self.n + i }
    }

    fn worker_done(&mut self, core: &mut Core) {
        self.workers_left -= 1;
        if self.workers_left == 0 {
            // One launch for every rank: all of them end when its last block does.
            for r in 0..self.n {
                self.ranks.touch(r, core.now);
                self.ranks.finish(r, core.now);
            }
        }
    }

    /// Dispatch sender (src, channel): the next window of `nvl_send` tokens, read once and
    /// stored into the ring of every rank each goes to, once each ring has room for its part.
    fn send_window(&mut self, core: &mut Core, src: u32, c: u32) {
        let s = (src * self.channels + c) as usize;
        let actor = s as u32;
        let (_, hi) = self.range(c);
        let w0 = self.next[s];
        if w0 >= hi {
            if w0 != u32::MAX {
                self.next[s] = u32::MAX;
                self.worker_done(core);
            }
            return;
        }
        let window = self.chunk.min(32);
        let nw = window.min(hi - w0);
        let mut per_dst = vec![0u32; self.n as usize];
        let mut ranks = Vec::new();
        for t in w0..w0 + nw {
            self.routing.token_ranks(src, t, &mut ranks);
            for &d in &ranks {
                per_dst[d as usize] += 1;
            }
        }
        for d in 0..self.n {
            let k = per_dst[d as usize];
            if k == 0 {
                continue;
            }
            let ri = self.ring(c, src, d);
            let need = self.rings[ri].head_needed(k);
            if !core.wait(self.rings[ri].head, need, self.me, actor) {
                return;
            }
        }
        for t in w0..w0 + nw {
            self.routing.token_ranks(src, t, &mut ranks);
            for &d in &ranks {
                let ri = self.ring(c, src, d);
                self.rings[ri].data.push_back(t);
                self.rings[ri].pushed += 1;
            }
        }
        let mut stored = 0u64;
        let mut spilled = 0u64;
        for d in 0..self.n {
            let k = per_dst[d as usize];
            if k > 0 {
                let ri = self.ring(c, src, d);
                spilled += self.spill.store(ri, k);
                stored += k as u64 * self.tok_bytes;
            }
        }
        self.next[s] = w0 + nw;
        // The block: warp 0 reads the window's routing row (HBM) and checks ring room; P warps
        // per token split its hidden dimension (4 loads in flight per lane per round, source
        // in HBM); then the metadata (top-k, weights, scales: HBM); a release before the tails.
        let p = (self.warps_per_block / window).max(1);
        let items = nw * p;
        let passes = items.div_ceil(self.warps_per_block) as u64;
        let per_warp = self.payload_int4.div_ceil(p as u64);
        let rounds = per_warp.div_ceil(4 * 32);
        // No payload moves before the routing row is in, and the tails wait for the release:
        // latencies that add to the copy's time rather than overlap with it.
        let lead = self.m.load_hbm;
        let body = self.m.load_hbm + passes * rounds * self.m.row_hbm / PROBE_ROW_ROUNDS;
        let read = nw as u64 * self.in_bytes;
        let sm = self.sm_of(src, 2 * c);
        let end = lead + self.m.release + self.ring_push(core, sm, read, stored, spilled, body);
        for d in 0..self.n {
            let k = per_dst[d as usize];
            if k > 0 {
                let ri = self.ring(c, src, d);
                let tail = Action::Add { counter: self.rings[ri].tail, delta: k };
                core.act_at(end + self.flag, tail);
            }
        }
        core.wake_at(end, self.me, actor);
    }

    /// Dispatch receiver (dst, channel, src): two warps copy what the tail shows from the ring
    /// (L2) into the output, then publish the head.
    fn recv(&mut self, core: &mut Core, dst: u32, c: u32, src: u32) {
        let i = ((dst * self.channels + c) * self.n + src) as usize;
        let actor = self.a_recv(i as u32);
        let ri = self.ring(c, src, dst);
        let (batch, _) = self.batch[i];
        if batch > 0 {
            self.batch[i] = (0, 0);
            let head = Action::Add { counter: self.rings[ri].head, delta: batch };
            core.act_at(core.now + self.flag, head);
        }
        if self.rings[ri].popped >= self.expected[i] as u64 {
            if self.expected[i] != u32::MAX {
                self.expected[i] = u32::MAX;
                self.worker_done(core);
            }
            return;
        }
        let popped = self.rings[ri].popped;
        if !core.wait(self.rings[ri].tail, popped + 1, self.me, actor) {
            return;
        }
        let avail = (core.value(self.rings[ri].tail) - popped) as u32;
        for _ in 0..avail {
            let t = self.rings[ri].data.pop_front().expect("tail never passes the data");
            self.ledger.arrive(dst, mix(src, t, 0));
        }
        self.rings[ri].popped += avail as u64;
        let spilled = self.spill.consume(ri, avail);
        let warps = (self.warps_per_block / self.n).max(1);
        let per_warp = avail.div_ceil(warps) as u64;
        let issue = per_warp * warp_copy(self.payload_int4, self.m.row_l2);
        let bytes = avail as u64 * self.tok_bytes;
        let out = avail as u64 * self.out_bytes;
        // The head is a release store after the batch's stores: it waits for them.
        let sm = self.sm_of(dst, 2 * c + 1);
        let end = self.m.release + self.ring_drain(core, sm, 2 * bytes, bytes, spilled, out, issue);
        self.batch[i] = (avail, bytes);
        core.wake_at(end, self.me, actor);
    }

    /// Combine sender (holder h, channel, dst): two warps push chunks of `nvl_send` expert
    /// outputs (HBM) into dst's ring once `nvl_send` slots are free, then the tail.
    fn combine_send(&mut self, core: &mut Core, h: u32, c: u32, dst: u32) {
        let s = self.stream(h, c, dst);
        let actor = s as u32;
        let len = self.streams[s].len() as u32;
        let pos = self.pos[s];
        if pos >= len {
            if pos != u32::MAX {
                self.pos[s] = u32::MAX;
                self.worker_done(core);
            }
            return;
        }
        let ri = self.ring(c, h, dst);
        let need = self.rings[ri].head_needed(self.chunk);
        if !core.wait(self.rings[ri].head, need, self.me, actor) {
            return;
        }
        let k = self.chunk.min(len - pos);
        for i in pos..pos + k {
            let t = self.streams[s][i as usize];
            self.rings[ri].data.push_back(t);
        }
        self.rings[ri].pushed += k as u64;
        self.pos[s] = pos + k;
        let spilled = self.spill.store(ri, k);
        let warps = (self.warps_per_block / self.n).max(1);
        let per_warp = k.div_ceil(warps) as u64;
        let issue = per_warp * warp_copy(self.payload_int4, self.m.row_hbm);
        let bytes = k as u64 * self.tok_bytes;
        let read = k as u64 * self.in_bytes;
        // The tail is a release store after the chunk's stores.
        let sm = self.sm_of(h, 2 * c);
        let end = self.m.release + self.ring_push(core, sm, read, bytes, spilled, issue);
        let tail = Action::Add { counter: self.rings[ri].tail, delta: k };
        core.act_at(end + self.flag, tail);
        core.wake_at(end, self.me, actor);
    }

    /// Combine receiver (rank r, channel): groups of 5 warps reduce one token each, in order,
    /// once every rank the token visited has delivered it; heads follow the consumed slots.
    fn combine_recv(&mut self, core: &mut Core, r: u32, c: u32) {
        let i = (r * self.channels + c) as usize;
        let actor = self.a_recv(i as u32);
        for (src, k) in std::mem::take(&mut self.touched[i]) {
            let ri = self.ring(c, src, r);
            let head = Action::Add { counter: self.rings[ri].head, delta: k };
            core.act_at(core.now + self.flag, head);
        }
        let (_, hi) = self.range(c);
        let mut t = self.next[i];
        if t >= hi {
            if t != u32::MAX {
                self.next[i] = u32::MAX;
                self.worker_done(core);
            }
            return;
        }
        let mut srcs = Vec::new();
        let mut touched: Vec<(u32, u32)> = Vec::new();
        let mut reduced = 0u32;
        let mut read = 0u64;
        let mut spilled = 0u64;
        while t < hi {
            self.routing.token_ranks(r, t, &mut srcs);
            let mut blocked = None;
            for &d in &srcs {
                let ri = self.ring(c, d, r);
                if core.value(self.rings[ri].tail) < self.rings[ri].popped + 1 {
                    blocked = Some(ri);
                    break;
                }
            }
            if let Some(ri) = blocked {
                if reduced == 0 {
                    let need = self.rings[ri].popped + 1;
                    let ok = core.wait(self.rings[ri].tail, need, self.me, actor);
                    debug_assert!(!ok);
                    self.next[i] = t;
                    return;
                }
                break;
            }
            for &d in &srcs {
                let ri = self.ring(c, d, r);
                let got = self.rings[ri].data.pop_front().expect("tail never passes the data");
                if got != t {
                    self.ranks.fail(format!(
                        "rank {r} channel {c}: combine ring from rank {d} delivered token {got} where token {t} was due"
                    ));
                }
                self.rings[ri].popped += 1;
                spilled += self.spill.consume(ri, 1);
                self.ledger.arrive(r, mix(d, t, 0));
                match touched.iter_mut().find(|(s, _)| *s == d) {
                    Some(e) => e.1 += 1,
                    None => touched.push((d, 1)),
                }
            }
            read += srcs.len() as u64 * self.tok_bytes;
            reduced += 1;
            t += 1;
        }
        self.next[i] = t;
        self.touched[i] = touched;
        // Groups of 5 warps (160 threads) each reduce a token: the leader polls the tails (an
        // L2 load), then rounds of one load per source rank in flight per thread (L2).
        let groups = ((self.warps_per_block - 1) / COMBINE_GROUP_WARPS).max(1);
        let threads = COMBINE_GROUP_WARPS as u64 * 32;
        let rounds = self.payload_int4.div_ceil(threads);
        let per_token = self.m.load_l2 + rounds * self.m.row_l2 / PROBE_ROW_ROUNDS;
        let issue = reduced.div_ceil(groups) as u64 * per_token;
        let out = reduced as u64 * self.out_bytes;
        let sm = self.sm_of(r, 2 * c + 1);
        let end = self.ring_drain(core, sm, read + out, read, spilled, out, issue);
        core.wake_at(end.max(core.now + 1), self.me, actor);
    }
}

impl Program for NormalProgram {
    fn num_ranks(&self) -> u32 {
        self.n
    }

    fn start_rank(&mut self, core: &mut Core, me: ProgId, r: u32, t: Time) {
        self.ranks.begin(r, t);
        // CUDA events around one launch: its cost as the events see it, then the blocks.
        let t0 = t + self.launch;
        let (n, ch) = (self.n, self.channels);
        for c in 0..ch {
            if self.dispatch {
                self.workers_left += 1 + n;
                core.wake_at(t0, me, r * ch + c);
                for s in 0..n {
                    core.wake_at(t0, me, self.a_recv((r * ch + c) * n + s));
                }
            } else {
                self.workers_left += n + 1;
                for d in 0..n {
                    core.wake_at(t0, me, self.stream(r, c, d) as u32);
                }
                core.wake_at(t0, me, self.a_recv(r * ch + c));
            }
        }
    }

    fn start(&mut self, _core: &mut Core, me: ProgId) {
        self.me = me;
        self.ranks.checks.push(if self.dispatch {
            "one-GPU intranode dispatch: every (token, destination rank) arrives exactly once"
                .into()
        } else {
            "one-GPU intranode combine: every token reduced from each rank it visited, in order"
                .into()
        });
    }

    fn wake(&mut self, core: &mut Core, _me: ProgId, actor: u32) {
        let (n, ch) = (self.n, self.channels);
        if self.dispatch {
            if actor < n * ch {
                self.send_window(core, actor / ch, actor % ch);
            } else {
                let i = actor - n * ch;
                let (dst, rest) = (i / (ch * n), i % (ch * n));
                self.recv(core, dst, rest / n, rest % n);
            }
        } else if actor < n * ch * n {
            let (h, rest) = (actor / (ch * n), actor % (ch * n));
            self.combine_send(core, h, rest / n, rest % n);
        } else {
            let i = actor - n * ch * n;
            self.combine_recv(core, i / ch, i % ch);
        }
    }

    fn is_done(&self) -> bool {
        self.ranks.left == 0
    }

    fn finish(&mut self, core: &Core) -> OpSample {
        self.ledger.check(&mut self.ranks, "(token, rank) pairs");
        let mut s = self.ranks.sample(&self.meta, 0.0);
        s.checks.push(format!(
            "one-GPU model: {:.1} MB of ring slots spilled beyond L2",
            self.spill.spilled as f64 / 1e6
        ));
        let span = self.ranks.last.iter().max().copied().unwrap_or(0)
            - self.ranks.start.iter().min().copied().unwrap_or(0);
        s.checks.push(self.mem0.report(core, self.gpu, span));
        s
    }

    fn spans(&self) -> Vec<(u32, u32, Time, Time)> {
        let gpus = vec![self.gpu; self.n as usize];
        self.ranks.spans(&gpus, &self.global)
    }

    fn describe(&self, actor: u32) -> String {
        let (n, ch) = (self.n, self.channels);
        if self.dispatch {
            if actor < n * ch {
                format!("one-GPU dispatch rank {} channel {} sender", actor / ch, actor % ch)
            } else {
                let i = actor - n * ch;
                let (dst, rest) = (i / (ch * n), i % (ch * n));
                format!(
                    "one-GPU dispatch rank {dst} channel {} receiver from rank {}",
                    rest / n,
                    rest % n
                )
            }
        } else if actor < n * ch * n {
            let (h, rest) = (actor / (ch * n), actor % (ch * n));
            format!("one-GPU combine rank {h} channel {} sender to rank {}", rest / n, rest % n)
        } else {
            let i = actor - n * ch * n;
            format!("one-GPU combine rank {} channel {} receiver", i / ch, i % ch)
        }
    }
}

// =============================================================================================
// Low-latency dispatch and combine
// =============================================================================================

/// Where a low-latency block is in its kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LlStage {
    Send,
    Signal,
    Recv,
    Done,
}

pub struct LlProgram {
    meta: Meta,
    me: ProgId,
    dispatch: bool,
    n: u32,
    tokens: u32,
    topk: u32,
    experts: u32,
    local: u32,
    hidden: u64,
    msg_bytes: u64,
    blocks: u32,
    sm_count: u32,
    gpu: u32,
    global: Vec<u32>,
    m: OneGpu,
    launch: Time,
    flag: Time,
    ranks: Ranks,
    routing: RoutingTable,
    /// Per block: stage, next item (send loop or receive loop).
    stage: Vec<LlStage>,
    item: Vec<u32>,
    /// Per (block, group): next receive item (dispatch) or send item (combine).
    group_item: Vec<u32>,
    groups_left: Vec<u32>,
    /// (source rank, expert): messages routing selects, and their identity hash.
    want: Vec<u32>,
    want_hash: Vec<u64>,
    sent_hash: Vec<u64>,
    /// Counters: puts done per (source rank, expert); messages delivered and the count signal
    /// per (receiver, source, local expert) (dispatch); flags per rank and messages delivered
    /// per rank (combine).
    fin_ctr: u32,
    data_ctr: u32,
    cnt_ctr: u32,
    flag_ctr: u32,
    /// Combine: per block, the ranks whose flags it has seen.
    verified: Vec<u64>,
    expected_msgs: Vec<u64>,
    blocks_left: u32,
    send_end: Time,
    t0: Time,
    started: u32,
    end: Time,
    mem0: MemSnap,
    flushed: FlushedL2,
}

impl LlProgram {
    pub fn new(plan: &Plan, core: &mut Core, meta: Meta) -> LlProgram {
        let d = deepep_job(plan, meta.job);
        let w = &d.workload;
        let n = plan.job(meta.job).num_ranks();
        let dispatch = meta.op == OpKind::Dispatch;
        let m = core.params.one_gpu.expect("one-GPU model");
        let gpu = core.jobs[meta.job.index()].gpu[0];
        memory_servers(core, gpu, &m);
        let experts = w.experts;
        let msg_bytes = if dispatch {
            ll_dispatch_msg_bytes(w.hidden, w.dispatch_dtype)
        } else {
            ll_combine_msg_bytes(w.hidden, w.combine_dtype)
        };
        // One 1,024-thread block per SM (`__launch_bounds__(LL_THREADS, 1)`, sized by the
        // occupancy API on the hardware).
        let blocks = core.params.sm_count.max(1);
        let ne = (n * experts) as usize;
        let mut p = LlProgram {
            meta,
            me: 0,
            dispatch,
            n,
            tokens: w.tokens_per_rank,
            topk: w.topk,
            experts,
            local: (experts / n).max(1),
            hidden: w.hidden as u64,
            msg_bytes,
            blocks,
            sm_count: core.params.sm_count.max(1),
            gpu,
            global: core.jobs[meta.job.index()].ranks.iter().map(|r| r.0).collect(),
            m,
            launch: core.params.kernel_launch,
            flag: core.params.flag_latency,
            ranks: Ranks::new(n),
            routing: d.routing().clone(),
            stage: vec![LlStage::Send; blocks as usize],
            item: vec![0; blocks as usize],
            group_item: vec![0; (blocks * LL_GROUPS) as usize],
            groups_left: vec![LL_GROUPS; blocks as usize],
            want: vec![0; ne],
            want_hash: vec![0; ne],
            sent_hash: vec![0; ne],
            fin_ctr: 0,
            data_ctr: 0,
            cnt_ctr: 0,
            flag_ctr: 0,
            verified: vec![0; blocks as usize],
            expected_msgs: vec![0; n as usize],
            blocks_left: blocks,
            send_end: 0,
            t0: 0,
            started: 0,
            end: 0,
            mem0: MemSnap::of(core, gpu),
            flushed: FlushedL2 { dirty: m.l2_bytes },
        };
        for r in 0..n {
            for t in 0..p.tokens {
                for &e in p.routing.experts(r, t) {
                    if e >= 0 {
                        let i = (r * experts + e as u32) as usize;
                        p.want[i] += 1;
                        p.want_hash[i] = p.want_hash[i].wrapping_add(mix(r, t, e as u32));
                        p.expected_msgs[r as usize] += 1;
                    }
                }
            }
        }
        let cells = (n * n * p.local) as usize;
        p.fin_ctr = core.counters(ne);
        p.data_ctr = core.counters(cells);
        p.cnt_ctr = core.counters(cells);
        p.flag_ctr = core.counters(2 * n as usize);
        p
    }

    /// Counter cell of (receiver, source, local expert).
    #[inline]
    fn rsl(&self, recv: u32, src: u32, le: u32) -> u32 {
        (recv * self.n + src) * self.local + le
    }

    fn a_group(&self, b: u32, g: u32) -> u32 {
        self.blocks + b * LL_GROUPS + g
    }

    /// Receive items (dispatch) / send items (combine): (local rank, peer, local expert).
    fn peer_items(&self) -> u32 {
        self.n * self.local * self.n
    }

    fn peer_item(&self, item: u32) -> (u32, u32, u32) {
        let (lr, rest) = (item % self.n, item / self.n);
        (lr, rest % self.n, rest / self.n)
    }

    /// Send/receive items over (token, rank), ranks interleaved.
    fn token_items(&self) -> u32 {
        self.n * self.tokens
    }

    fn block_done(&mut self, core: &mut Core, b: u32) {
        if self.stage[b as usize] == LlStage::Done {
            return;
        }
        self.stage[b as usize] = LlStage::Done;
        self.blocks_left -= 1;
        if self.blocks_left == 0 {
            self.end = core.now;
            for r in 0..self.n {
                self.ranks.touch(r, core.now);
                self.ranks.phase("send", r, self.send_end.saturating_sub(self.t0), self.n);
                self.ranks.finish(r, core.now);
            }
        }
    }

    // ---- dispatch ---------------------------------------------------------------------------

    /// Block `b` of the dispatch: the next (token, rank) of its send loop — the FP8 cast of the
    /// token by 31 warps (one 16-byte load each from HBM, every SM loading), then one warp per
    /// selected expert: slot atomic, copy of the message from the staging buffer (L2) into the
    /// expert's receive slot, release add to the expert's finish counter.
    fn dispatch_block(&mut self, core: &mut Core, b: u32) {
        match self.stage[b as usize] {
            LlStage::Send => {}
            LlStage::Signal => return self.dispatch_signal(core, b),
            _ => return,
        }
        let it = b + self.item[b as usize] * self.blocks;
        if it >= self.token_items() {
            self.send_end = self.send_end.max(core.now);
            self.stage[b as usize] = LlStage::Signal;
            // Groups 1.. have no count to signal: they start receiving at once.
            for g in 1..LL_GROUPS {
                core.wake_at(core.now, self.me, self.a_group(b, g));
            }
            return self.dispatch_signal(core, b);
        }
        self.item[b as usize] += 1;
        let (lr, t) = (it % self.n, it / self.n);
        let bf16_int4 = self.hidden * 2 / 16;
        let steps = self.m.ll_send;
        let cast = steps
            .cast
            .unwrap_or_else(|| bf16_int4.div_ceil(LL_CAST_THREADS) * self.m.load_hbm_busy);
        let experts: Vec<i32> = self.routing.experts(lr, t).to_vec();
        let valid = experts.iter().filter(|&&e| e >= 0).count() as u64;
        let x = 2 * self.hidden;
        let sm = b % self.sm_count;
        // The cast (the BF16 row from HBM, the staged message stored), then each send warp's
        // copy of it: data flows, which overlap with the wait for bandwidth. The slot atomic
        // before the copy and the release after it add to them.
        let (copy, sync) = if valid > 0 {
            (
                steps.copy.unwrap_or_else(|| warp_copy(self.msg_bytes / 16 - 1, self.m.row_l2)),
                steps.slot.unwrap_or(self.m.atomic) + steps.release.unwrap_or(self.m.release),
            )
        } else {
            (0, 0)
        };
        let end = sync
            + core.sm_traffic(
                core.now,
                self.gpu,
                sm,
                x + self.msg_bytes + valid * 2 * self.msg_bytes,
                x + valid * self.msg_bytes + self.flushed.take(x + (valid + 1) * self.msg_bytes),
                0,
                cast + copy,
                Action::None,
                self.me,
                valid * self.msg_bytes,
            );
        for &e in &experts {
            if e < 0 {
                continue;
            }
            let e = e as u32;
            let (d, le) = (e / self.local, e % self.local);
            let i = (lr * self.experts + e) as usize;
            self.sent_hash[i] = self.sent_hash[i].wrapping_add(mix(lr, t, e));
            let cell = self.rsl(d, lr, le);
            core.act_at(end, Action::Add { counter: self.data_ctr + cell, delta: 1 });
            core.act_at(end, Action::Add { counter: self.fin_ctr + i as u32, delta: 1 });
        }
        core.wake_at(end, self.me, b);
    }

    /// After its send loop, block `b`'s first warp signals the counts of the (rank, expert)
    /// pairs it owns, each once every put to it is done (release, then a flag to the owner).
    fn dispatch_signal(&mut self, core: &mut Core, b: u32) {
        let pairs = self.n * self.experts;
        let per = pairs.div_ceil(self.blocks);
        let (lo, hi) = ((b * per).min(pairs), ((b + 1) * per).min(pairs));
        for j in lo..hi {
            let want = self.want[j as usize] as u64;
            if !core.wait(self.fin_ctr + j, want, self.me, b) {
                return;
            }
        }
        // Every pair's puts are in: the poller sees the finish counters, the owners the counts.
        for j in lo..hi {
            let (lr, e) = (j / self.experts, j % self.experts);
            let (d, le) = (e / self.local, e % self.local);
            let cell = self.rsl(d, lr, le);
            let count = self.want[j as usize];
            let at = core.now + self.m.load_l2 + self.flag;
            core.act_at(at, Action::Add { counter: self.cnt_ctr + cell, delta: count + 1 });
        }
        self.stage[b as usize] = LlStage::Recv;
        core.wake_at(core.now + self.m.load_l2, self.me, self.a_group(b, 0));
    }

    /// Receive group (b, g): its next (rank, source, local expert): poll the counts of sources
    /// 0..=source (the packed position is the prefix of lower sources' counts), then 4 warps
    /// copy the messages (header, payload, scales: HBM) into the packed output.
    fn dispatch_group(&mut self, core: &mut Core, b: u32, g: u32) {
        let gi = (b * LL_GROUPS + g) as usize;
        let actor = self.a_group(b, g);
        let item = b * LL_GROUPS + g + self.group_item[gi] * self.blocks * LL_GROUPS;
        if item >= self.peer_items() {
            if self.group_item[gi] != u32::MAX {
                self.group_item[gi] = u32::MAX;
                self.groups_left[b as usize] -= 1;
                if self.groups_left[b as usize] == 0 {
                    self.block_done(core, b);
                }
            }
            return;
        }
        let (lr, src, le) = self.peer_item(item);
        for s in 0..=src {
            let c = self.cnt_ctr + self.rsl(lr, s, le);
            if !core.wait(c, 1, self.me, actor) {
                return;
            }
        }
        self.group_item[gi] += 1;
        let cell = self.rsl(lr, src, le);
        let count = core.value(self.cnt_ctr + cell).saturating_sub(1);
        let delivered = core.value(self.data_ctr + cell);
        let e = lr * self.local + le;
        let i = (src * self.experts + e) as usize;
        if delivered != count {
            self.ranks.fail(format!(
                "rank {lr} local expert {le}: count from rank {src} says {count} tokens but {delivered} arrived before it"
            ));
        }
        if count != self.want[i] as u64 || self.sent_hash[i] != self.want_hash[i] {
            self.ranks.fail(format!(
                "rank {lr} local expert {le}: received {count} tokens from rank {src}, routing selects {} (or a different set)",
                self.want[i]
            ));
        }
        // One acquire load per source, each waiting for the last (measured with every SM
        // receiving where the profile has it).
        let polls = (src + 1) as u64 * self.m.ll_recv_poll.unwrap_or(self.m.load_l2);
        // Header, payload (the warps' copy loop), scales: the header load comes first (its
        // source index is stored before the copy) and the scales after it.
        let payload =
            if self.msg_bytes - 16 >= 2 * self.hidden { 2 * self.hidden } else { self.hidden };
        let per_msg = 2 * self.m.load_hbm + warp_copy(payload / 16, self.m.row_hbm);
        let issue = count.div_ceil(LL_WARPS_PER_GROUP as u64) * per_msg;
        let bytes = count * self.msg_bytes;
        // The copies start once the counts are read.
        let end = polls
            + core.sm_traffic(
                core.now,
                self.gpu,
                b % self.sm_count,
                bytes + count * payload,
                bytes + count * payload + self.flushed.take(bytes + count * payload),
                // Each consumed message is discarded (the same instruction the handoff probe
                // measured on L2-resident lines).
                self.m.l2_extra(0, bytes),
                issue,
                Action::None,
                self.me,
                0,
            );
        core.wake_at(end, self.me, actor);
    }

    // ---- combine ----------------------------------------------------------------------------

    /// Send group (b, g): its next (rank, destination, local expert): 4 warps send each row
    /// back (its source index and slot: a dependent HBM load; the BF16 row from HBM into the
    /// destination's receive slot), then a release add on the destination's flag.
    fn combine_group(&mut self, core: &mut Core, b: u32, g: u32) {
        let gi = (b * LL_GROUPS + g) as usize;
        let actor = self.a_group(b, g);
        let item = b * LL_GROUPS + g + self.group_item[gi] * self.blocks * LL_GROUPS;
        if item >= self.peer_items() {
            if self.group_item[gi] != u32::MAX {
                self.group_item[gi] = u32::MAX;
                self.groups_left[b as usize] -= 1;
                if self.groups_left[b as usize] == 0 {
                    // The block's receive loop starts once all its groups are through.
                    self.send_end = self.send_end.max(core.now);
                    self.stage[b as usize] = LlStage::Recv;
                    core.wake_at(core.now, self.me, b);
                }
            }
            return;
        }
        self.group_item[gi] += 1;
        let (lr, dst, le) = self.peer_item(item);
        let e = lr * self.local + le;
        let rows = self.want[(dst * self.experts + e) as usize] as u64;
        let per_row = self.m.load_hbm + warp_copy(self.msg_bytes / 16, self.m.row_hbm);
        let issue = rows.div_ceil(LL_WARPS_PER_GROUP as u64) * per_row;
        let bytes = rows * self.msg_bytes;
        // The flag is a release after the group's stores.
        let end = self.m.release
            + core.sm_traffic(
                core.now,
                self.gpu,
                b % self.sm_count,
                2 * bytes,
                2 * bytes + self.flushed.take(2 * bytes),
                0,
                issue,
                Action::None,
                self.me,
                bytes,
            );
        core.act_at(end, Action::Add { counter: self.flag_ctr + self.n + dst, delta: rows as u32 });
        core.act_at(end + self.flag, Action::Add { counter: self.flag_ctr + dst, delta: 1 });
        core.wake_at(end, self.me, actor);
    }

    /// Block `b`'s receive loop: its next (token, rank): wait (once per rank) for every
    /// expert's flag, then each thread sums the top-k partials of its 16 bytes, one dependent
    /// HBM load per selected expert (every SM loading), and stores the row.
    fn combine_block(&mut self, core: &mut Core, b: u32) {
        if self.stage[b as usize] != LlStage::Recv {
            return;
        }
        let it = b + self.item[b as usize] * self.blocks;
        if it >= self.token_items() {
            return self.block_done(core, b);
        }
        let (lr, t) = (it % self.n, it / self.n);
        let mut start = core.now;
        if (self.verified[b as usize] >> lr) & 1 == 0 {
            if !core.wait(self.flag_ctr + lr, self.experts as u64, self.me, b) {
                return;
            }
            let delivered = core.value(self.flag_ctr + self.n + lr);
            if delivered != self.expected_msgs[lr as usize] {
                self.ranks.fail(format!(
                    "rank {lr}: all flags arrived but {delivered} of {} combine messages",
                    self.expected_msgs[lr as usize]
                ));
            }
            self.verified[b as usize] |= 1 << lr;
            start += self.m.load_l2;
        }
        self.item[b as usize] += 1;
        let valid = self.routing.experts(lr, t).iter().filter(|&&e| e >= 0).count() as u64;
        let issue = valid * self.m.load_hbm_busy;
        let row = self.msg_bytes;
        let end = core.sm_traffic(
            start,
            self.gpu,
            b % self.sm_count,
            (valid + 1) * row,
            (valid + 1) * row + self.flushed.take((valid + 1) * row),
            // Each consumed slot is discarded.
            self.m.l2_extra(0, valid * row),
            issue,
            Action::None,
            self.me,
            0,
        );
        core.wake_at(end, self.me, b);
    }
}

impl Program for LlProgram {
    fn num_ranks(&self) -> u32 {
        self.n
    }

    fn start_rank(&mut self, core: &mut Core, me: ProgId, r: u32, t: Time) {
        self.ranks.begin(r, t);
        self.started += 1;
        self.t0 = self.t0.max(t);
        if self.started < self.n {
            return;
        }
        // One launch for all ranks once all have started: the launch cost as CUDA events see
        // it, then every block.
        let t0 = self.t0 + self.launch;
        for b in 0..self.blocks {
            if self.dispatch {
                core.wake_at(t0, me, b);
            } else {
                for g in 0..LL_GROUPS {
                    core.wake_at(t0, me, self.a_group(b, g));
                }
            }
        }
    }

    fn start(&mut self, _core: &mut Core, me: ProgId) {
        self.me = me;
        self.ranks.checks.push(if self.dispatch {
            "one-GPU low-latency dispatch: every (token, expert) message arrives exactly once, before its count".into()
        } else {
            "one-GPU low-latency combine: every expert output arrives back once, before the flags"
                .into()
        });
    }

    fn wake(&mut self, core: &mut Core, _me: ProgId, actor: u32) {
        if actor < self.blocks {
            if self.dispatch {
                self.dispatch_block(core, actor);
            } else {
                self.combine_block(core, actor);
            }
        } else {
            let i = actor - self.blocks;
            let (b, g) = (i / LL_GROUPS, i % LL_GROUPS);
            if self.dispatch {
                if self.stage[b as usize] == LlStage::Send {
                    return;
                }
                if g == 0 && self.stage[b as usize] == LlStage::Signal {
                    return;
                }
                self.dispatch_group(core, b, g);
            } else {
                self.combine_group(core, b, g);
            }
        }
    }

    fn is_done(&self) -> bool {
        self.ranks.left == 0
    }

    fn finish(&mut self, core: &Core) -> OpSample {
        let _ = self.topk;
        let mut s = self.ranks.sample(&self.meta, 0.0);
        s.checks.push(self.mem0.report(core, self.gpu, self.end - self.t0));
        s
    }

    fn spans(&self) -> Vec<(u32, u32, Time, Time)> {
        let gpus = vec![self.gpu; self.n as usize];
        self.ranks.spans(&gpus, &self.global)
    }

    fn describe(&self, actor: u32) -> String {
        let op = if self.dispatch { "dispatch" } else { "combine" };
        if actor < self.blocks {
            format!("one-GPU LL {op} block {actor} ({:?})", self.stage[actor as usize])
        } else {
            let i = actor - self.blocks;
            format!("one-GPU LL {op} block {} group {}", i / LL_GROUPS, i % LL_GROUPS)
        }
    }
}

#[cfg(test)]
mod tests {
    use eptwin_engine::Plan;
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn warp_copy_counts_whole_rounds() {
        // 448 int4 = the probes' row: exactly its time; 462 (an FP8 message) needs a third
        // round; 896 (a BF16 row) four.
        assert_eq!(warp_copy(448, 1000), 1000);
        assert_eq!(warp_copy(462, 1000), 1500);
        assert_eq!(warp_copy(896, 1000), 2000);
    }

    #[test]
    fn normal_threads_follow_the_backend() {
        // EP8 on one H200: 8 × 24 blocks need 2 per SM: 512 threads (results/h200 README).
        assert_eq!(normal_threads(8, 192, 132), 512);
        assert_eq!(normal_threads(8, 96, 132), 768);
        assert_eq!(normal_threads(8, 400, 132), 256);
    }

    #[test]
    fn flushed_lines_are_written_back_once() {
        let mut f = FlushedL2 { dirty: 100 };
        assert_eq!(f.take(30), 30);
        assert_eq!(f.take(0), 0);
        assert_eq!(f.take(100), 70);
        assert_eq!(f.take(50), 0);
    }

    #[test]
    fn ring_slots_get_two_thirds_of_l2() {
        // H200: 60 MiB of L2, 40 MiB for ring slots in flight.
        assert_eq!(ring_capacity(62_914_560), 41_943_040);
    }

    #[test]
    fn spill_starts_beyond_capacity_and_drains() {
        let mut s = SpillBook::new(2, 100, 10);
        assert_eq!(s.store(0, 6), 0);
        assert_eq!(s.store(1, 6), 20);
        assert_eq!(s.consume(0, 6), 0);
        assert_eq!(s.store(0, 3), 0);
        assert_eq!(s.consume(1, 6), 20);
        assert_eq!(s.spilled, 20);
        assert_eq!(s.in_flight, 30);
    }

    proptest! {
        /// Whatever the order of stores and consumes: the bytes consumers read from HBM are
        /// exactly the bytes that spilled, never more than they consume; slots in flight are
        /// what was stored and not consumed; nothing spills while the slots fit.
        #[test]
        fn spill_bytes_are_conserved(
            cap in 0u64..4000,
            ops in proptest::collection::vec((0usize..4, 1u32..20, any::<bool>()), 1..200),
        ) {
            let tok = 16u64;
            let mut s = SpillBook::new(4, cap, tok);
            let mut queued = [0u32; 4];
            let mut read_back = 0u64;
            let mut stored = 0u64;
            for (ri, k, is_store) in ops {
                if is_store {
                    let fits = (s.in_flight + k as u64 * tok) <= cap;
                    let spill = s.store(ri, k);
                    prop_assert!(spill <= k as u64 * tok);
                    if fits { prop_assert_eq!(spill, 0); }
                    queued[ri] += k;
                    stored += k as u64 * tok;
                } else {
                    let k = k.min(queued[ri]);
                    let got = s.consume(ri, k);
                    prop_assert!(got <= k as u64 * tok);
                    queued[ri] -= k;
                    read_back += got;
                }
                let left: u64 = queued.iter().map(|&q| q as u64 * tok).sum();
                prop_assert_eq!(s.in_flight, left);
                prop_assert!(s.spilled <= stored);
            }
            for (ri, q) in queued.iter().enumerate() {
                read_back += s.consume(ri, *q);
            }
            prop_assert_eq!(read_back, s.spilled);
            prop_assert_eq!(s.in_flight, 0);
        }

        /// A warp's copy time grows with the bytes, by whole rounds of 7 loads per lane.
        #[test]
        fn warp_copy_is_whole_rounds(int4 in 0u64..100_000, row in 1u64..10_000_000) {
            let t = warp_copy(int4, row);
            prop_assert!(warp_copy(int4 + 1, row) >= t);
            prop_assert_eq!(t, int4.div_ceil(224) * row / 2);
        }
    }

    /// A one-GPU EP8 scenario on the `h200-single` profile with a memory section given here
    /// (test values, not the profile's), `extra` appended to it.
    fn run_one_gpu(
        mode: &str,
        tokens: u32,
        l2_gbps: f64,
        extra: &str,
    ) -> eptwin_engine::result::RunResult {
        let ll = mode == "ll";
        let text = format!(
            r#"
schema = 1
name = "one-gpu-{mode}"
[cluster]
profile = "h200-single"
[cluster.overrides.gpu]
memory = {{ l2_bytes = 62914560, l2_bw_gbps = {l2_gbps}, dram_bw_gbps = 3600.0, warp_row_l2_ns = 800.0, warp_row_hbm_ns = 2000.0, sm_copy_l2_gbps = 60.0, sm_copy_hbm_gbps = 48.0, load_l2_ns = 300, load_hbm_ns = 800, load_hbm_busy_ns = 1200, atomic_ns = 500, release_ns = 500{extra} }}
[[job]]
name = "ep8"
[job.buffer]
{buffer}
[job.workload]
tokens_per_rank = {tokens}
hidden = 7168
topk = 8
experts = 256
warmup = 0
iterations = 1
"#,
            buffer = if ll {
                "low_latency_mode = true\nnum_rdma_bytes = \"2GiB\"\nnum_qps_per_rank = 32"
            } else {
                "num_nvl_bytes = \"2e9\"\nnum_qps_per_rank = 1\nnum_sms = 24"
            },
        );
        let loaded = eptwin_engine::parse("one-gpu.toml", &text).expect("scenario parses");
        let plan = Plan::build(&loaded).expect("plan");
        let mut sim = crate::Simulator::new(crate::SimOptions::default());
        eptwin_engine::run::run(&plan, &mut sim, eptwin_engine::result::Provenance::default())
            .expect("run")
    }

    fn mean_us(r: &eptwin_engine::result::RunResult, op: &str) -> f64 {
        let o = r.jobs[0].ops.iter().find(|o| o.op == op).expect("op");
        o.summary.latency_us.mean
    }

    #[test]
    fn one_gpu_kernels_run_and_check_out() {
        for mode in ["ll", "normal"] {
            let r = run_one_gpu(mode, 64, 5000.0, "");
            assert_eq!(r.verdict, eptwin_engine::result::Verdict::Ok, "{mode}: {:?}", r.failures);
            for o in &r.jobs[0].ops {
                assert!(
                    o.summary.checks.iter().any(|c| c.starts_with("one-GPU")),
                    "{mode} {}: the one-GPU kernels ran ({:?})",
                    o.op,
                    o.summary.checks
                );
                // One launch as CUDA events see it (h200-single's kernel_launch_ns) at least.
                assert!(o.summary.latency_us.mean > 2.0, "{mode} {}", o.op);
            }
        }
    }

    #[test]
    fn a_slower_l2_never_makes_the_normal_kernels_faster() {
        let fast = run_one_gpu("normal", 256, 6000.0, "");
        let slow = run_one_gpu("normal", 256, 3000.0, "");
        for op in ["dispatch", "combine"] {
            assert!(mean_us(&slow, op) >= mean_us(&fast, op), "{op}");
        }
        // At 256 tokens the rings' traffic through L2 dominates: half the rate costs time.
        assert!(mean_us(&slow, "dispatch") > 1.3 * mean_us(&fast, "dispatch"));
    }

    #[test]
    fn ring_handoffs_and_discards_cost_l2_time() {
        let extra = ", l2_ring_bw_gbps = 3000.0, l2_discard_bw_gbps = 6000.0";
        // (64 low-latency tokens: the test scenario's 2 GiB buffer holds no more.)
        for (mode, tokens) in [("normal", 256), ("ll", 64)] {
            let plain = run_one_gpu(mode, tokens, 6000.0, "");
            let costly = run_one_gpu(mode, tokens, 6000.0, extra);
            assert_eq!(costly.verdict, eptwin_engine::result::Verdict::Ok, "{mode}");
            for op in ["dispatch", "combine"] {
                assert!(mean_us(&costly, op) >= mean_us(&plain, op), "{mode} {op}");
            }
        }
        // The normal dispatch hands every slot over through L2 (none spill at 256 tokens): its
        // rings' stores and loads at half the L2 rate, plus the discards, cost time.
        let plain = run_one_gpu("normal", 256, 6000.0, "");
        let costly = run_one_gpu("normal", 256, 6000.0, extra);
        assert!(mean_us(&costly, "dispatch") > 1.1 * mean_us(&plain, "dispatch"));
    }

    /// The send loop's steps measured under load replace the single-operation chain of the
    /// low-latency dispatch only: a longer round lengthens the dispatch (64 tokens: 512 items,
    /// about 4 rounds per block), the combine does not move.
    #[test]
    fn measured_send_steps_set_the_low_latency_send_round() {
        let plain = run_one_gpu("ll", 64, 6000.0, "");
        let slow = ", ll_send_cast_ns = 2000.0, ll_send_slot_ns = 1000.0, \
                    ll_send_copy_ns = 3000.0, ll_send_release_ns = 2000.0";
        let slow = run_one_gpu("ll", 64, 6000.0, slow);
        assert_eq!(slow.verdict, eptwin_engine::result::Verdict::Ok, "{:?}", slow.failures);
        // Single operations: 1,200 + 3 × 400 (copy) + 500 + 500 = 3,400 ns a round at most;
        // measured: 8,000 ns. Four rounds of 4.6 us more, less what the L2 bound already took.
        let more = mean_us(&slow, "dispatch") - mean_us(&plain, "dispatch");
        assert!(more > 10.0, "{more}");
        assert_eq!(mean_us(&slow, "combine"), mean_us(&plain, "combine"));
        // Slower count polls (4.5 a receive item on average) lengthen the receive only.
        let polls = run_one_gpu("ll", 64, 6000.0, ", ll_recv_poll_ns = 3000.0");
        assert!(mean_us(&polls, "dispatch") > mean_us(&plain, "dispatch") + 5.0);
        assert_eq!(mean_us(&polls, "combine"), mean_us(&plain, "combine"));
    }
}
