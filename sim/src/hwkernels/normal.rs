//! The backend's normal intranode kernels on one GPU with their rings in global memory
//! (`kernels/cuda/intranode.cu`): per (channel, source) rings in the receiver's buffer, slots
//! held in L2 while they fit and spilled to HBM beyond (the model: `hwkernels`).

use std::collections::VecDeque;

use eptwin_engine::api::OpSample;
use eptwin_engine::api::mix;
use eptwin_engine::api::{
    Dtype, Plan, RoutingTable, channel_range, normal_combine_token_bytes,
    normal_dispatch_token_bytes,
};

use super::{FlushedL2, MemSnap, NormalSetup, PROBE_ROW_ROUNDS, normal_setup, warp_copy};
use crate::core::time::Time;
use crate::core::world::Program;
use crate::core::{Action, Core, ProgId};
use crate::params::OneGpu;
use crate::programs::channel_ring::ChannelRing;
use crate::programs::{Ledger, Meta, Ranks};

/// Normal combine: warps that reduce one token together (`COMBINE_GROUP_WARPS`).
const COMBINE_GROUP_WARPS: u32 = 5;

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
    rings: Vec<ChannelRing>,
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
            flushed: FlushedL2 { dirty: m.flush_dirty },
        };
        for _ in 0..channels * n * n {
            p.rings.push(ChannelRing::new(core, cfg.num_max_nvl_chunked_recv_tokens));
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn normal_threads_follow_the_backend() {
        // EP8 on one H200: 8 × 24 blocks need 2 per SM: 512 threads (results/h200 README).
        assert_eq!(normal_threads(8, 192, 132), 512);
        assert_eq!(normal_threads(8, 96, 132), 768);
        assert_eq!(normal_threads(8, 400, 132), 256);
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
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
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
    }
}
