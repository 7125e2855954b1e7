//! The hardware backend's normal kernels with their rings in thread-block-cluster shared memory
//! (`kernels/cuda/intranode_cluster.cu`: `intranode_dispatch_cluster`,
//! `intranode_combine_cluster`), which run when every rank of a job (at most 8) shares one
//! sm_90+ GPU. Same protocol as the global-ring kernels (`hwkernels::NormalProgram`): per
//! (channel, source, destination) a ring in the receiver's memory, filled in order, drained in
//! order, slots handed back with a head counter; but each channel is one cluster of one block
//! per rank, a ring lives in the receiving block's shared memory, and every slot is filled by a
//! TMA bulk copy from global memory straight into it. Only the input reads and the output
//! writes touch L2 and HBM (results/h200/README.md, "Rings in shared memory").
//!
//! What the model takes from the backend's cluster handoff probe (`probe.cluster_handoff_*`,
//! profile `[gpu.memory]` `cluster_*`, docs/calibration.md "h200-single"):
//!
//! * **A pair's chain.** A slot's refill takes `cluster_fill_ns` (the consumer's head release
//!   seen by the producer, the bulk copy issued, global memory read, the chunk landing on the
//!   slot's mbarrier and the consumer seeing it) plus the chunk's bytes at
//!   `cluster_bulk_copy_gbps`, measured with one slot and no stores, where a pair's period is
//!   the refill alone; with the whole GPU's clusters refilling at once it takes
//!   `cluster_fill_wave_ns` instead (the same probe shape with a whole wave), in between in
//!   proportion to the SMs the kernel's resident clusters take ([`fill_at`]). A bulk store reads
//!   a slot out at the same rate. The one-cluster probe shapes with stores see
//!   [`pair_period`].
//! * **Each SM's intake.** Every chunk into a block's shared memory crosses its SM's FIFO
//!   server: `cluster_ingest_chunk_ns` plus the bytes at `cluster_sm_ingest_gbps`.
//! * **The GPU's handoff rate.** Every bulk copy into a peer block's shared memory crosses one
//!   FIFO server at `cluster_handoff_bw_gbps` (a lower bound from the whole-wave probe shapes).
//! * **L2 and HBM** as in the global-ring model (`hwkernels`): the fills' global reads (from HBM
//!   the first time a token is read, from L2 after), the outputs' stores (written back), the
//!   timing's flushed L2; the L2 also spends `cluster_transfer_l2_ns` per bulk transfer of a
//!   chunk (each fill, each slot stored out): the whole-wave probe shapes move the same bytes
//!   in more time the more, smaller chunks they take.
//! * **Senders take turns.** Senders due at the same time issue one fill each, in turn (a
//!   picosecond apart), as the SMs issue in parallel; one sender filling all its free slots
//!   before the next issues at all would hand the first channels all the memory at the start.
//! * **The start burst lands together.** The fills into slots never used before (every ring's
//!   free slots, issued at a cluster's start) land no earlier than when HBM has done the whole
//!   burst's reads: with every copy in flight at once, HBM serves their requests interleaved,
//!   not in issue order. The combine's first token then waits for its 27.6 MB of expert outputs
//!   at EP8, as the backend's stamps show on the H100 and the H200
//!   (results/h100/combine-burst/README.md).
//! * **Grid.** `num_sms / 2` channels, one cluster of n blocks each, at most
//!   `cluster_max_active_clusters` × 8 / n clusters resident at once (the rest run in later
//!   waves, a cluster starting when one ends), one block per SM.

use std::collections::VecDeque;

use eptwin_engine::api::OpSample;
use eptwin_engine::api::{
    CLUSTER_INDEX_BYTES, ClusterSlot, OpKind, Plan, RoutingTable, Workload, channel_range,
    cluster_ring_slots, normal_combine_token_bytes, normal_dispatch_token_bytes,
};

use super::{FlushedL2, MemSnap, NormalSetup, normal_setup};
use crate::core::time::Time;
use crate::core::world::Program;
use crate::core::{Action, Core, ProgId};
use crate::gpu::Server;
use crate::params::{ClusterRings, OneGpu};
use crate::programs::channel_ring::ChannelRing;
use crate::programs::{Ledger, Meta, Ranks, deepep_job};
use eptwin_engine::api::mix;

/// Ranks of a portable cluster: one block per rank per channel.
const MAX_CLUSTER_RANKS: u32 = 8;
/// The probe's cluster size, which `cluster_max_active_clusters` counts.
const PROBE_CLUSTER_BLOCKS: u32 = 8;
/// Tokens whose routing row a dispatch sender warp loads at once (one per lane).
const WINDOW_TOKENS: u32 = 32;
/// Fills issued within this long of the burst's first belong to it (senders take turns 1 ps
/// apart).
const BURST_WINDOW: Time = 1_000;
/// The op's ring slot (engine `cluster_ring`, as the backend sizes it), or `None` where bulk
/// copies cannot move it.
fn slot_of(w: &Workload, dispatch: bool) -> Option<ClusterSlot> {
    if dispatch {
        ClusterSlot::dispatch(w.hidden, w.topk, w.dispatch_dtype).ok()
    } else {
        ClusterSlot::combine(w.hidden, w.topk).ok()
    }
}

/// Steady-state time per chunk of one producer/consumer pair handing `bytes` chunks over
/// `slots` ring slots, one chunk per bulk store (the probe's consumer), nothing else limiting.
/// The consumer hands a slot back as soon as its store has read it, so every slot cycles
/// through a refill (`fill`) and a store (`store` + its bytes at `bulk`), and the consumer's
/// stores follow one another. The calibration script solves the one-cluster probe shapes with
/// this (scripts/h200-profile-from-probes.py `pair_period`).
pub fn pair_period(c: &ClusterRings, slots: u32, bytes: u64) -> Time {
    let store = c.store + c.bulk.time(bytes);
    store.max((c.fill + c.bulk.time(bytes) + store) / slots.max(1) as u64)
}

/// A slot's refill besides its bytes with `resident` clusters of `blocks` blocks on the GPU:
/// the one-cluster chain, and the whole wave's (every SM the probe's clusters can take) in
/// proportion to the SMs taken.
fn fill_at(c: &ClusterRings, resident: u32, blocks: u32) -> Time {
    let one = PROBE_CLUSTER_BLOCKS as u64;
    let wave = c.max_active_clusters as u64 * one;
    if wave <= one {
        return c.fill;
    }
    let above = ((resident * blocks) as u64).clamp(one, wave) - one;
    let span = wave - one;
    if c.fill_wave >= c.fill {
        c.fill + (c.fill_wave - c.fill) * above / span
    } else {
        c.fill - (c.fill - c.fill_wave) * above / span
    }
}

/// Whether job `meta` runs the cluster kernels: the one-GPU model applies (`hwkernels::applies`,
/// checked by the caller), the profile has the cluster keys, at most 8 ranks, every part of a
/// slot is a 16-byte multiple (bulk copies: the backend refuses other shapes), and the op's
/// ring gets at least two slots in shared memory (with one the protocol cannot proceed).
/// Otherwise the global-ring model runs.
pub fn applies(plan: &Plan, core: &Core, meta: &Meta) -> bool {
    let Some(c) = core.params.one_gpu.and_then(|m| m.cluster) else { return false };
    let n = plan.job(meta.job).num_ranks();
    if n > MAX_CLUSTER_RANKS {
        return false;
    }
    let d = deepep_job(plan, meta.job);
    let dispatch = meta.op == OpKind::Dispatch;
    let Some(slot) = slot_of(&d.workload, dispatch) else { return false };
    let cfg = if dispatch { d.dispatch_config } else { d.combine_config };
    let Some(cfg) = cfg else { return false };
    cluster_ring_slots(&slot, cfg.num_max_nvl_chunked_recv_tokens, n, c.smem_bytes) >= 2
}

pub struct ClusterProgram {
    meta: Meta,
    me: ProgId,
    dispatch: bool,
    n: u32,
    channels: u32,
    tokens: u32,
    gpu: u32,
    global: Vec<u32>,
    m: OneGpu,
    c: ClusterRings,
    launch: Time,
    ranks: Ranks,
    routing: RoutingTable,
    ledger: Ledger,
    /// Bytes bulk-copied into a slot; of them read from global memory (L2); bulk-stored out
    /// of a slot (dispatch); written to the output per consumed row (dispatch) or reduced
    /// token (combine); charged as transport bytes per row (the backend's count).
    slot_bytes: u64,
    read_bytes: u64,
    store_bytes: u64,
    out_bytes: u64,
    wire_bytes: u64,
    /// Per ring (channel, producer, consumer): its slots, its tokens in order, how many the
    /// producer has filled.
    rings: Vec<ChannelRing>,
    lists: Vec<Vec<u32>>,
    sent: Vec<u32>,
    /// Dispatch senders: routing windows loaded. Dispatch: whether (source, token) has been
    /// read from HBM by one of its fills (the others find it in L2).
    windows: Vec<u32>,
    read_once: Vec<bool>,
    /// Dispatch receivers: when the last store is done.
    store_end: Vec<Time>,
    /// Combine reducers (channel, rank): next token; whether its `send_head` entry has been
    /// waited for; when the entry after it is loaded (the leaders load it while this token's
    /// partials land).
    next: Vec<u32>,
    loaded: Vec<bool>,
    head_at: Vec<Time>,
    /// Workers (warps) still running; started once (senders' and receivers' first wake).
    done: Vec<bool>,
    started: Vec<bool>,
    channel_left: Vec<u32>,
    /// Clusters: the SM of each channel's block 0, the free residency slots, the channels
    /// waiting for one.
    sm_base: Vec<u32>,
    free_slots: Vec<u32>,
    waiting: VecDeque<u32>,
    channels_left: u32,
    slots: u32,
    /// A slot's refill: the chain at this kernel's occupancy (`fill_at`) and the slot's bytes
    /// at one copy's rate; of it, the consumer SM's intake of the slot.
    chain: Time,
    intake: Time,
    /// Every bulk copy into a peer's shared memory; each SM's intake of them.
    handoff: Server,
    ingest: Vec<Server>,
    /// The start burst: fills into slots never used before (every ring's free slots at once),
    /// each with when it would land in issue order; when HBM is done with the burst's reads.
    burst: Vec<(usize, Time)>,
    burst_hbm_end: Time,
    /// When each channel's cluster started its workers; per combine block, when its first
    /// token's partials were all in (after its cluster's start).
    cluster_start: Vec<Time>,
    first_ready: Vec<Time>,
    ranks_started: u32,
    t0: Time,
    mem0: MemSnap,
    flushed: FlushedL2,
}

impl ClusterProgram {
    pub fn new(plan: &Plan, core: &mut Core, meta: Meta) -> ClusterProgram {
        let NormalSetup { d, n, dispatch, cfg, channels, m, gpu } = normal_setup(plan, core, meta);
        let w = &d.workload;
        let c = m.cluster.expect("cluster keys");
        let slot = slot_of(w, dispatch).expect("applies() checked the slot");
        let (read_bytes, store_bytes, out_bytes, wire_bytes) = if dispatch {
            // The receiver bulk-stores row and scales, and stores the source index (4 B) and
            // the top-k experts and weights (8 B each) itself.
            let out = slot.row_bytes + 4 + 8 * w.topk as u64;
            let wire = normal_dispatch_token_bytes(w.hidden, w.topk, w.dispatch_dtype);
            (slot.slot_bytes - CLUSTER_INDEX_BYTES, slot.row_bytes, out, wire)
        } else {
            let wire = normal_combine_token_bytes(w.hidden, w.topk);
            (slot.slot_bytes, 0, slot.slot_bytes, wire)
        };
        let slot_bytes = slot.slot_bytes;
        let slots =
            cluster_ring_slots(&slot, cfg.num_max_nvl_chunked_recv_tokens, n, c.smem_bytes).max(2);
        let resident = (c.max_active_clusters * PROBE_CLUSTER_BLOCKS / n.max(1)).clamp(1, channels);
        let rings = (channels * n * n) as usize;
        let mut p = ClusterProgram {
            meta,
            me: 0,
            dispatch,
            n,
            channels,
            tokens: w.tokens_per_rank,
            gpu,
            global: core.jobs[meta.job.index()].ranks.iter().map(|r| r.0).collect(),
            m,
            c,
            launch: core.params.kernel_launch,
            ranks: Ranks::new(n),
            routing: d.routing().clone(),
            ledger: Ledger::new(n),
            slot_bytes,
            read_bytes,
            store_bytes,
            out_bytes,
            wire_bytes,
            rings: Vec::with_capacity(rings),
            lists: vec![Vec::new(); rings],
            sent: vec![0; rings],
            windows: vec![0; rings],
            read_once: if dispatch {
                vec![false; (n * w.tokens_per_rank) as usize]
            } else {
                Vec::new()
            },
            store_end: vec![0; rings],
            next: (0..channels * n)
                .map(|i| channel_range(w.tokens_per_rank, channels, i / n).0)
                .collect(),
            loaded: vec![false; (channels * n) as usize],
            head_at: vec![0; (channels * n) as usize],
            done: Vec::new(),
            started: Vec::new(),
            channel_left: vec![0; channels as usize],
            sm_base: vec![0; channels as usize],
            free_slots: (0..resident).rev().collect(),
            waiting: (0..channels).collect(),
            channels_left: channels,
            slots,
            chain: fill_at(&c, resident, n) + c.bulk.time(slot_bytes),
            intake: c.ingest_chunk + c.sm_ingest.time(slot_bytes),
            handoff: Server::new(c.handoff),
            ingest: (0..resident * n).map(|_| Server::new(c.sm_ingest)).collect(),
            burst: Vec::new(),
            burst_hbm_end: 0,
            cluster_start: vec![0; channels as usize],
            first_ready: Vec::new(),
            ranks_started: 0,
            t0: 0,
            mem0: MemSnap::of(core, gpu),
            flushed: FlushedL2 { dirty: m.flush_dirty },
        };
        for _ in 0..rings {
            p.rings.push(ChannelRing::new(core, slots));
        }
        p.build();
        p
    }

    /// Ring (channel, producer's rank, consumer's rank).
    #[inline]
    fn ring(&self, c: u32, src: u32, dst: u32) -> usize {
        ((c * self.n + src) * self.n + dst) as usize
    }

    fn num_rings(&self) -> u32 {
        self.channels * self.n * self.n
    }

    /// Workers: a sender warp per ring, then a receiver warp per ring (dispatch) or a reducer
    /// per (channel, rank) (combine).
    fn num_workers(&self) -> u32 {
        self.num_rings() + if self.dispatch { self.num_rings() } else { self.channels * self.n }
    }

    fn channel_of(&self, worker: u32) -> u32 {
        let r = self.num_rings();
        if worker < r {
            worker / (self.n * self.n)
        } else if self.dispatch {
            (worker - r) / (self.n * self.n)
        } else {
            (worker - r) / self.n
        }
    }

    /// The SM of rank `r`'s block of channel `c`.
    fn sm(&self, c: u32, r: u32) -> u32 {
        self.sm_base[c as usize] + r
    }

    fn build(&mut self) {
        let (n, ch) = (self.n, self.channels);
        let mut ranks = Vec::new();
        for src in 0..n {
            for c in 0..ch {
                let (lo, hi) = channel_range(self.tokens, ch, c);
                for t in lo..hi {
                    self.routing.token_ranks(src, t, &mut ranks);
                    for &d in &ranks {
                        if self.dispatch {
                            // Source src's tokens of the channel that go to d, in order.
                            let ri = self.ring(c, src, d);
                            self.lists[ri].push(t);
                            self.ledger.expect(d, mix(src, t, 0));
                        } else {
                            // Rank d sends back, in arrival order, the rows it got from src.
                            let ri = self.ring(c, d, src);
                            self.lists[ri].push(t);
                            self.ledger.expect(src, mix(d, t, 0));
                        }
                    }
                }
            }
        }
        let workers = self.num_workers();
        self.done = vec![false; workers as usize];
        self.started = vec![false; workers as usize];
        for wk in 0..workers {
            let c = self.channel_of(wk);
            self.channel_left[c as usize] += 1;
        }
    }

    /// Start the next waiting channel's cluster on a free residency slot at `at`.
    fn start_channels(&mut self, core: &mut Core, at: Time) {
        while let Some(&slot) = self.free_slots.last() {
            let Some(c) = self.waiting.pop_front() else { return };
            self.free_slots.pop();
            self.sm_base[c as usize] = slot * self.n;
            self.cluster_start[c as usize] = at + self.c.frame;
            // The cluster's frame (its mbarriers set up, the barriers at start and exit) is
            // charged before its workers start.
            for wk in 0..self.num_workers() {
                if self.channel_of(wk) == c {
                    core.wake_at(at + self.c.frame, self.me, wk);
                }
            }
        }
    }

    /// Worker `wk` is done: its channel's cluster leaves once every block of it is (they end on
    /// a cluster barrier), and the next waiting cluster takes its SMs; the launch ends with the
    /// last one.
    fn worker_done(&mut self, core: &mut Core, wk: u32) {
        if self.done[wk as usize] {
            return;
        }
        self.done[wk as usize] = true;
        let c = self.channel_of(wk) as usize;
        self.channel_left[c] -= 1;
        if self.channel_left[c] > 0 {
            return;
        }
        self.channels_left -= 1;
        self.free_slots.push(self.sm_base[c] / self.n);
        self.start_channels(core, core.now);
        if self.channels_left == 0 {
            for r in 0..self.n {
                self.ranks.touch(r, core.now);
                self.ranks.finish(r, core.now);
            }
        }
    }

    /// Fill the next slot of ring `ri` with token `t` from producer block `(c, src)`: the bulk
    /// copy reads `read` bytes of global memory (`hbm` of them from HBM) and lands in the
    /// consumer's slot after the refill chain, the GPU's handoff server and the L2/HBM servers
    /// (the L2 with its time per transfer) allow; the tail (the slot's mbarrier) counts it then.
    fn fill(&mut self, core: &mut Core, ri: usize, c: u32, src: u32, t: u32, hbm: u64) {
        let now = core.now;
        let (_, handed) = self.handoff.reserve(now, self.slot_bytes);
        let chain = self.chain;
        // The consumer's SM takes the chunk in at the end of the chain (the chain's own
        // intake, which the probe's lone pair included): concurrent fills into one block
        // queue there.
        let dst = ri as u32 % self.n;
        let into = self.sm(c, dst) as usize;
        let own = self.intake.min(chain);
        let (_, taken) = self.ingest[into].reserve_for(now + chain - own, self.slot_bytes, own);
        let handed = handed.max(taken);
        let dram = hbm + self.flushed.take(hbm);
        let sm = self.sm(c, src);
        let read_end = core.sm_traffic(
            now,
            self.gpu,
            sm,
            self.read_bytes,
            dram,
            self.c.transfer_l2,
            0,
            Action::None,
            self.me,
            self.wire_bytes,
        );
        let landed = read_end.max(now + chain).max(handed);
        let ring = &mut self.rings[ri];
        ring.data.push_back(t);
        ring.pushed += 1;
        if ring.pushed <= self.slots as u64 {
            // A slot never used before: the start burst (`close_burst`).
            if self.burst.is_empty() {
                core.wake_at(now + BURST_WINDOW, self.me, self.num_workers());
            }
            self.burst.push((ri, landed));
            if dram > 0 {
                self.burst_hbm_end = self.burst_hbm_end.max(core.hbm_free_at(self.gpu));
            }
        } else {
            core.act_at(landed, Action::Add { counter: ring.tail, delta: 1 });
        }
        self.sent[ri] += 1;
    }

    /// The start burst lands together. Every sender issues its ring's free slots at once, so
    /// all of them are in flight together, and HBM serves the requests of concurrent bulk copies
    /// interleaved, not in the order the warps issued them: no fill of the burst lands before
    /// HBM has done the whole burst's reads (the combine's 1,920 expert-output rows, 27.6 MB at
    /// EP8: its first token waits for them, as the cluster stamps show, docs/calibration.md
    /// "The start burst lands together"). Fills whose bytes come from L2 only (the
    /// dispatch's later copies of a row) are not held back by more than the burst's HBM reads.
    fn close_burst(&mut self, core: &mut Core) {
        let end = self.burst_hbm_end;
        for (ri, landed) in std::mem::take(&mut self.burst) {
            core.act_at(landed.max(end), Action::Add { counter: self.rings[ri].tail, delta: 1 });
        }
        self.burst_hbm_end = 0;
    }

    // ---- dispatch ---------------------------------------------------------------------------

    /// Sender warp of ring `ri` (channel c, source s, destination d): walks the channel's tokens
    /// in windows of 32 (one routing-row load each), and for each token that goes to d waits
    /// for a free slot (head) and fills it.
    fn send(&mut self, core: &mut Core, ri: usize) {
        let wk = ri as u32;
        let (c, s) = (wk / (self.n * self.n), wk / self.n % self.n);
        let (lo, hi) = channel_range(self.tokens, self.channels, c);
        let windows = (hi - lo).div_ceil(WINDOW_TOKENS);
        let j = self.sent[ri] as usize;
        let next = self.lists[ri].get(j).copied();
        // The window of the next token, or the channel's last: the warp's loop walks every
        // window either way.
        let w = next.map_or(windows, |t| (t - lo) / WINDOW_TOKENS + 1);
        if self.windows[ri] < w {
            let k = (w - self.windows[ri]) as u64;
            self.windows[ri] = w;
            core.wake_at(core.now + k * self.m.load_l2, self.me, wk);
            return;
        }
        let Some(t) = next else {
            return self.worker_done(core, wk);
        };
        let need = self.rings[ri].head_needed(1);
        if !core.wait(self.rings[ri].head, need, self.me, wk) {
            return;
        }
        let i = (s * self.tokens + t) as usize;
        let hbm = if self.read_once[i] { 0 } else { self.read_bytes };
        self.read_once[i] = true;
        self.fill(core, ri, c, s, t, hbm);
        // One fill per turn: every SM's sender issues at once on the GPU; here senders
        // due at the same time take turns (1 ps apart), or the first would take every
        // free slot's memory bandwidth before the others issue at all.
        core.wake_at(core.now + 1, self.me, wk);
    }

    /// Receiver warp of ring `ri` (channel c, source s, destination d): waits for slot j's
    /// chunk, bulk-stores row and scales to its output (and the metadata itself), and once the
    /// previous chunk's store has read its slot hands that slot back.
    fn recv(&mut self, core: &mut Core, ri: usize) {
        let wk = self.num_rings() + ri as u32;
        if !self.started[wk as usize] {
            // The channel's counts and output offsets: one dependent load (L2: the notify
            // kernel just wrote them).
            self.started[wk as usize] = true;
            core.wake_at(core.now + self.m.load_l2, self.me, wk);
            return;
        }
        let n = self.n;
        let (c, d) = (ri as u32 / (n * n), ri as u32 % n);
        let s = ri as u32 / n % n;
        let j = self.rings[ri].popped;
        if j >= self.lists[ri].len() as u64 {
            // The kernel waits for its bulk stores to complete before the cluster barrier.
            if core.now < self.store_end[ri] {
                core.wake_at(self.store_end[ri], self.me, wk);
                return;
            }
            return self.worker_done(core, wk);
        }
        if !core.wait(self.rings[ri].tail, j + 1, self.me, wk) {
            return;
        }
        // Every slot that has landed, from the one waited for up to the ring's end, goes in
        // one bulk store (their rows are consecutive in shared memory and in the output).
        let slots = self.slots as u64;
        let landed = core.value(self.rings[ri].tail) - j;
        let k = landed.min(slots - j % slots).max(1);
        for i in 0..k {
            let t = self.rings[ri].data.pop_front().expect("tail never passes the data");
            let due = self.lists[ri][(j + i) as usize];
            if t != due {
                self.ranks.fail(format!(
                    "rank {d} channel {c}: ring from rank {s} delivered token {t} where token {due} was due"
                ));
            }
            self.ledger.arrive(d, mix(s, t, 0));
        }
        self.rings[ri].popped += k;
        let now = core.now;
        let out = k * self.out_bytes;
        let dram = out + self.flushed.take(out);
        let store = self.c.store + self.c.bulk.time(k * self.store_bytes);
        let end = core.sm_traffic(
            now,
            self.gpu,
            self.sm(c, d),
            out,
            dram,
            // One transfer per slot stored: its row and scales, one chunk as a fill is.
            k * self.c.transfer_l2,
            store,
            Action::None,
            self.me,
            0,
        );
        // The slots go back once the store has read them; the next store follows.
        let read = now + store;
        core.act_at(read, Action::Add { counter: self.rings[ri].head, delta: k as u32 });
        self.store_end[ri] = end;
        core.wake_at(read, self.me, wk);
    }

    // ---- combine ----------------------------------------------------------------------------

    /// Sender warp of ring `ri` (channel c, holder h, destination = the tokens' source): one
    /// lane fills the destination's ring with the rows h received from it, in arrival order.
    fn combine_send(&mut self, core: &mut Core, ri: usize) {
        let wk = ri as u32;
        if !self.started[wk as usize] {
            // Its rows' offsets (rank prefix, channel offsets): one dependent load (L2).
            self.started[wk as usize] = true;
            core.wake_at(core.now + self.m.load_l2, self.me, wk);
            return;
        }
        let (c, h) = (wk / (self.n * self.n), wk / self.n % self.n);
        let j = self.sent[ri] as usize;
        let Some(&t) = self.lists[ri].get(j) else {
            return self.worker_done(core, wk);
        };
        let need = self.rings[ri].head_needed(1);
        if !core.wait(self.rings[ri].head, need, self.me, wk) {
            return;
        }
        // Expert outputs come from HBM, each read once.
        self.fill(core, ri, c, h, t, self.read_bytes);
        // One fill per turn, as the dispatch's senders.
        core.wake_at(core.now + 1, self.me, wk);
    }

    /// The reducers of block (channel c, rank r): the channel's tokens in order. The ring
    /// leaders load a token's `send_head` entries (the channel's first from HBM: the dispatch
    /// wrote them before the timing flushed L2; each next one while the current token's
    /// partials land), wait for the slot of every rank the token visited, then the block sums
    /// the partials out of shared memory (the reducer probe's time for that many sources),
    /// stores the row and hands the slots back with a release, which waits for the row's
    /// stores to reach L2 (their write-back to HBM is posted: it takes HBM time from the
    /// fills, nothing waits for it).
    fn reduce(&mut self, core: &mut Core, c: u32, r: u32) {
        let i = (c * self.n + r) as usize;
        let wk = self.num_rings() + i as u32;
        let (lo, hi) = channel_range(self.tokens, self.channels, c);
        let t = self.next[i];
        if t >= hi {
            return self.worker_done(core, wk);
        }
        if !self.loaded[i] {
            self.loaded[i] = true;
            let now = core.now;
            let ready = if t == lo { now + self.m.load_hbm } else { self.head_at[i].max(now) };
            self.head_at[i] = ready + self.m.load_hbm;
            if ready > now {
                core.wake_at(ready, self.me, wk);
                return;
            }
        }
        let mut srcs = Vec::new();
        self.routing.token_ranks(r, t, &mut srcs);
        for &d in &srcs {
            let ri = self.ring(c, d, r);
            let need = self.rings[ri].popped + 1;
            if !core.wait(self.rings[ri].tail, need, self.me, wk) {
                return;
            }
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
            self.ledger.arrive(r, mix(d, t, 0));
        }
        let now = core.now;
        if t == lo {
            self.first_ready.push(now - self.cluster_start[c as usize]);
        }
        let reduced = now + self.c.reduce + srcs.len() as u64 * self.c.reduce_source;
        let (gpu, sm) = (self.gpu, self.sm(c, r));
        let stored =
            core.sm_traffic(now, gpu, sm, self.out_bytes, 0, 0, 0, Action::None, self.me, 0);
        let dram = self.out_bytes + self.flushed.take(self.out_bytes);
        core.sm_traffic(now, gpu, sm, 0, dram, 0, 0, Action::None, self.me, 0);
        let released = reduced.max(stored) + self.m.release;
        for &d in &srcs {
            let ri = self.ring(c, d, r);
            core.act_at(released, Action::Add { counter: self.rings[ri].head, delta: 1 });
        }
        self.next[i] = t + 1;
        self.loaded[i] = false;
        core.wake_at(released, self.me, wk);
    }
}

impl Program for ClusterProgram {
    fn num_ranks(&self) -> u32 {
        self.n
    }

    fn start_rank(&mut self, core: &mut Core, me: ProgId, r: u32, t: Time) {
        self.me = me;
        self.ranks.begin(r, t);
        self.ranks_started += 1;
        self.t0 = self.t0.max(t);
        if self.ranks_started == self.n {
            // One launch for every rank: its cost as CUDA events see it, then the clusters.
            self.start_channels(core, self.t0 + self.launch);
        }
    }

    fn start(&mut self, _core: &mut Core, me: ProgId) {
        self.me = me;
        self.ranks.checks.push(if self.dispatch {
            "one-GPU cluster dispatch: every (token, destination rank) arrives exactly once, in order"
                .into()
        } else {
            "one-GPU cluster combine: every token reduced from each rank it visited, in order".into()
        });
    }

    fn wake(&mut self, core: &mut Core, _me: ProgId, actor: u32) {
        let rings = self.num_rings();
        if actor == self.num_workers() {
            return self.close_burst(core);
        }
        if self.done[actor as usize] {
            return;
        }
        if self.dispatch {
            if actor < rings {
                self.send(core, actor as usize);
            } else {
                self.recv(core, (actor - rings) as usize);
            }
        } else if actor < rings {
            self.combine_send(core, actor as usize);
        } else {
            let i = actor - rings;
            self.reduce(core, i / self.n, i % self.n);
        }
    }

    fn is_done(&self) -> bool {
        self.ranks.left == 0
    }

    fn finish(&mut self, core: &Core) -> OpSample {
        self.ledger.check(&mut self.ranks, "(token, rank) pairs");
        let mut s = self.ranks.sample(&self.meta, 0.0);
        let span = self.ranks.last.iter().max().copied().unwrap_or(0)
            - self.ranks.start.iter().min().copied().unwrap_or(0);
        s.checks.push(format!(
            "one-GPU cluster model: {} channels, {} ring slots of {} B, {:.2} GB bulk-copied into peer shared memory (handoff busy {:.0} %)",
            self.channels,
            self.slots,
            self.slot_bytes,
            self.handoff.bytes as f64 / 1e9,
            100.0 * self.handoff.busy_ps as f64 / span.max(1) as f64,
        ));
        if !self.first_ready.is_empty() {
            // The backend's cluster stamps (EPTWIN_CLUSTER_TIMES=1) report the same: "t0 ready".
            let v = &mut self.first_ready;
            v.sort_unstable();
            let us = |t: Time| t as f64 / 1e6;
            s.checks.push(format!(
                "one-GPU cluster combine: a block's first token has every partial {:.2} us after its cluster's start (median over blocks; {:.2} to {:.2})",
                us(v[v.len() / 2]),
                us(v[0]),
                us(v[v.len() - 1])
            ));
        }
        s.checks.push(self.mem0.report(core, self.gpu, span));
        s
    }

    fn spans(&self) -> Vec<(u32, u32, Time, Time)> {
        let gpus = vec![self.gpu; self.n as usize];
        self.ranks.spans(&gpus, &self.global)
    }

    fn describe(&self, actor: u32) -> String {
        let (n, rings) = (self.n, self.num_rings());
        let op = if self.dispatch { "dispatch" } else { "combine" };
        let ring = |ri: u32| (ri / (n * n), ri / n % n, ri % n);
        if actor < rings {
            let (c, s, d) = ring(actor);
            format!("one-GPU cluster {op} channel {c} rank {s} sender to rank {d}")
        } else if self.dispatch {
            let (c, s, d) = ring(actor - rings);
            format!("one-GPU cluster dispatch channel {c} rank {d} receiver from rank {s}")
        } else {
            let i = actor - rings;
            format!("one-GPU cluster combine channel {} rank {} reducers", i / n, i % n)
        }
    }
}

#[cfg(test)]
mod tests {
    use eptwin_engine::Plan;
    use eptwin_engine::api::{RunResult, Verdict};

    use super::*;
    use crate::core::time::{PS_PER_US, Rate, ns};

    fn rings(fill_ns: u64, bulk_gbps: f64) -> ClusterRings {
        ClusterRings {
            fill: ns(fill_ns),
            fill_wave: ns(fill_ns),
            bulk: Rate::from_gbps(bulk_gbps),
            store: 0,
            handoff: Rate::from_gbps(1000.0),
            transfer_l2: 0,
            sm_ingest: Rate::from_gbps(1e6),
            ingest_chunk: 0,
            max_active_clusters: 15,
            smem_bytes: 232_448,
            reduce: ns(1000),
            reduce_source: ns(100),
            frame: 0,
        }
    }

    #[test]
    fn the_refill_goes_from_one_cluster_to_the_whole_wave_with_the_sms_taken() {
        let mut c = rings(2000, 6.25);
        c.fill_wave = ns(2900);
        // One cluster of 8 blocks, a whole wave (15 x 8 SMs), half way, and beyond the wave.
        assert_eq!(fill_at(&c, 1, 8), ns(2000));
        assert_eq!(fill_at(&c, 15, 8), ns(2900));
        assert_eq!(fill_at(&c, 30, 4), ns(2900));
        assert_eq!(fill_at(&c, 8, 8), ns(2000) + ns(900) * 56 / 112);
        assert_eq!(fill_at(&c, 40, 8), ns(2900));
        // Fewer SMs than one probe cluster count as one; a GPU of one cluster never loads.
        assert_eq!(fill_at(&c, 1, 2), ns(2000));
        c.max_active_clusters = 1;
        assert_eq!(fill_at(&c, 15, 8), ns(2000));
        // More clusters never make a refill faster.
        let mut c = rings(2000, 6.25);
        c.fill_wave = ns(2900);
        for k in 1..20 {
            assert!(fill_at(&c, k + 1, 8) >= fill_at(&c, k, 8));
        }
    }

    #[test]
    fn pair_period_is_the_slower_cycle() {
        // 1,000 B at 1 GB/s: a 1,000 ns store, a 4,000 + 1,000 ns refill. Two slots: every
        // slot cycles through a refill and a store, two of them at once: 3,000 ns per chunk.
        let c = rings(4000, 1.0);
        assert_eq!(pair_period(&c, 2, 1000), ns(3000));
        assert_eq!(pair_period(&c, 3, 1000), ns(2000));
        assert_eq!(pair_period(&c, 4, 1000), ns(1500));
        // Slow stores: the consumer's stores one after another bind.
        let slow = rings(500, 0.25);
        assert_eq!(pair_period(&slow, 3, 1000), ns(4000));
        // One slot: nothing overlaps.
        assert_eq!(pair_period(&c, 1, 1000), ns(6000));
        // More slots never slow a pair down.
        for s in 2..10 {
            assert!(pair_period(&c, s + 1, 7472) <= pair_period(&c, s, 7472));
        }
    }

    /// An EP scenario on `h200-single` with its own memory table (test values), `ranks` ranks
    /// on the GPU, `extra` appended to the memory table, `buffer` extra buffer lines.
    fn run_cluster(
        ranks: u32,
        tokens: u32,
        (topk, experts): (u32, u32),
        buffer: &str,
        memory: &str,
    ) -> RunResult {
        let text = format!(
            r#"
schema = 1
name = "one-gpu-cluster"
[cluster]
profile = "h200-single"
ranks_per_gpu = {ranks}
[cluster.overrides.gpu]
memory = {{ {memory} }}
[[job]]
name = "ep"
[job.buffer]
num_nvl_bytes = "2e9"
num_qps_per_rank = 1
{buffer}
[job.workload]
tokens_per_rank = {tokens}
hidden = 7168
topk = {topk}
experts = {experts}
warmup = 0
iterations = 1
"#
        );
        let loaded = eptwin_engine::parse("one-gpu-cluster.toml", &text).expect("scenario parses");
        let plan = Plan::build(&loaded).expect("plan");
        let mut sim = crate::Simulator::new(crate::SimOptions::default());
        eptwin_engine::api::run(&plan, &mut sim, eptwin_engine::api::Provenance::default())
            .expect("run")
    }

    /// A memory table: the global-ring keys, then the cluster keys unless `cluster` is empty.
    fn memory(base: &str, cluster: &str) -> String {
        let sep = if cluster.is_empty() { "" } else { ", " };
        format!("{base}{sep}{cluster}")
    }

    const REAL: &str = "l2_bytes = 62914560, l2_bw_gbps = 6707.0, dram_bw_gbps = 3999.0, \
        l2_hbm_bw_gbps = 9979.0, warp_row_l2_ns = 770.1, warp_row_hbm_ns = 1306.4, \
        sm_copy_l2_gbps = 47.9, sm_copy_hbm_gbps = 47.9, load_l2_ns = 252, load_hbm_ns = 461, \
        load_hbm_busy_ns = 806, atomic_ns = 281, release_ns = 346";
    /// Memory so fast and latencies so short that only the pairs' chains are left.
    const FREE: &str = "l2_bytes = 62914560, l2_bw_gbps = 1e7, dram_bw_gbps = 1e7, \
        warp_row_l2_ns = 1.0, warp_row_hbm_ns = 1.0, sm_copy_l2_gbps = 1e7, \
        sm_copy_hbm_gbps = 1e7, load_l2_ns = 0, load_hbm_ns = 0, load_hbm_busy_ns = 0, \
        atomic_ns = 0, release_ns = 0";

    fn keys(fill: f64, bulk: f64, handoff: f64, active: u32, smem: u64) -> String {
        format!(
            "cluster_fill_ns = {fill:?}, cluster_fill_wave_ns = {fill:?}, \
             cluster_bulk_copy_gbps = {bulk:?}, \
             cluster_store_ns = 0.0, cluster_transfer_l2_ns = 0.0, \
             cluster_handoff_bw_gbps = {handoff:?}, cluster_max_active_clusters = {active}, \
             cluster_sm_ingest_gbps = 1e6, cluster_ingest_chunk_ns = 0.0, \
             cluster_smem_bytes = {smem}, cluster_reduce_ns = 1066.0, \
             cluster_reduce_source_ns = 110.0"
        )
    }

    fn prov() -> String {
        keys(4515.0, 47.9, 1793.0, 15, 232_448)
    }

    fn mean_us(r: &RunResult, op: &str) -> f64 {
        r.jobs[0].ops.iter().find(|o| o.op == op).expect("op").summary.latency_us.mean
    }

    fn ran(r: &RunResult, op: &str, what: &str) -> bool {
        let o = r.jobs[0].ops.iter().find(|o| o.op == op).expect("op");
        o.summary.checks.iter().any(|c| c.starts_with(what))
    }

    const EP8: &str = "num_sms = 30";

    #[test]
    fn the_frame_adds_to_both_kernels_once_per_cluster() {
        // One wave (15 resident clusters for num_sms = 30): each op is the frame longer.
        let plain = run_cluster(8, 64, (8, 256), EP8, &memory(REAL, &prov()));
        let framed = format!("{}, cluster_frame_ns = 2000.0", prov());
        let framed = run_cluster(8, 64, (8, 256), EP8, &memory(REAL, &framed));
        assert_eq!(framed.verdict, Verdict::Ok, "{:?}", framed.failures);
        for op in ["dispatch", "combine"] {
            let more = mean_us(&framed, op) - mean_us(&plain, op);
            assert!((more - 2.0).abs() < 1e-6, "{op}: {more}");
        }
    }

    #[test]
    fn cluster_kernels_run_where_the_backend_runs_them() {
        let r = run_cluster(8, 64, (8, 256), EP8, &memory(REAL, &prov()));
        assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
        for op in ["dispatch", "combine"] {
            assert!(ran(&r, op, "one-GPU cluster"), "{op}");
        }
        // Without the cluster keys, with top-k weights that are not a 16-byte multiple, or
        // with room for one slot only: the global rings. (More than 8 ranks are not intranode.)
        let cases = [
            (8, (8, 256), memory(REAL, "")),
            (8, (6, 256), memory(REAL, &prov())),
            (8, (8, 256), memory(REAL, &keys(4515.0, 47.9, 1793.0, 15, 100_000))),
        ];
        for (ranks, routing, mem) in cases {
            let r = run_cluster(ranks, 64, routing, EP8, &mem);
            assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
            for op in ["dispatch", "combine"] {
                assert!(!ran(&r, op, "one-GPU cluster"), "{ranks} {routing:?} {op}");
                assert!(ran(&r, op, "one-GPU intranode"), "{ranks} {routing:?} {op}");
            }
        }
        // 130,000 B hold 2 dispatch slots per source but 1 combine slot: the dispatch keeps
        // the cluster kernel.
        let r = run_cluster(
            8,
            64,
            (8, 256),
            EP8,
            &memory(REAL, &keys(4515.0, 47.9, 1793.0, 15, 130_000)),
        );
        assert!(ran(&r, "dispatch", "one-GPU cluster"));
        assert!(ran(&r, "combine", "one-GPU intranode"));
    }

    /// Two ranks, every token to both (top-4 of 3 experts per rank), one channel, memory free:
    /// where the refills bind, each pair hands its 512 tokens over at `pair_period` (one slot
    /// per store, the probe's steady state the calibration solves); where the stores bind, the
    /// receiver takes every landed slot in one store and is never slower.
    #[test]
    fn a_pair_runs_at_its_period() {
        for (recv, fill, bulk) in [(3u32, 4000.0, 10.0), (2, 4000.0, 10.0), (3, 500.0, 2.0)] {
            let buffer = format!(
                "num_sms = 2\n[job.buffer.dispatch_config]\nnum_max_nvl_chunked_send_tokens = 1\n\
                 num_max_nvl_chunked_recv_tokens = {recv}"
            );
            let mem = memory(FREE, &keys(fill, bulk, 1e7, 15, 232_448));
            let r = run_cluster(2, 512, (4, 6), &buffer, &mem);
            assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
            let c = rings(fill as u64, bulk);
            let want = pair_period(&c, recv, 7392) as f64 / PS_PER_US as f64;
            // Less the launch (h200-single: 2.8 us), per token.
            let got = (mean_us(&r, "dispatch") - 2.8) / 512.0;
            let store = c.bulk.time(7392) as f64 / PS_PER_US as f64;
            if store >= want * 0.999 {
                // (Batches amortise a store's fixed time, zero here: no faster, never slower
                // but for the first refill, which nothing overlaps.)
                let first = (c.fill + c.bulk.time(7472)) as f64 / PS_PER_US as f64 / 512.0;
                assert!(
                    got <= want * 1.001 + first,
                    "{recv} slots, stores bind: {got} us per token, {want}"
                );
                continue;
            }
            assert!((got / want - 1.0).abs() < 0.01, "{recv} slots: {got} us per token, {want}");
        }
    }

    #[test]
    fn slower_handoff_parameters_never_make_the_kernels_faster() {
        let base = run_cluster(8, 256, (8, 256), EP8, &memory(REAL, &prov()));
        let slower = [
            keys(9000.0, 47.9, 1793.0, 15, 232_448),
            keys(4515.0, 10.0, 1793.0, 15, 232_448),
            keys(4515.0, 47.9, 900.0, 15, 232_448),
            "cluster_fill_ns = 4515.0, cluster_fill_wave_ns = 4515.0, \
             cluster_bulk_copy_gbps = 47.9, cluster_store_ns = 0.0, \
             cluster_transfer_l2_ns = 0.0, \
             cluster_handoff_bw_gbps = 1793.0, cluster_max_active_clusters = 15, \
             cluster_sm_ingest_gbps = 1e6, cluster_ingest_chunk_ns = 0.0, \
             cluster_smem_bytes = 232448, cluster_reduce_ns = 1066.0, \
             cluster_reduce_source_ns = 1100.0"
                .to_string(),
            // A slower refill at the kernels' occupancy, a slower intake, more L2 time per
            // transfer.
            prov().replace("cluster_fill_wave_ns = 4515.0", "cluster_fill_wave_ns = 9000.0"),
            prov().replace("cluster_ingest_chunk_ns = 0.0", "cluster_ingest_chunk_ns = 2000.0"),
            prov().replace("cluster_transfer_l2_ns = 0.0", "cluster_transfer_l2_ns = 50.0"),
        ];
        for k in &slower {
            let r = run_cluster(8, 256, (8, 256), EP8, &memory(REAL, k));
            assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
            for op in ["dispatch", "combine"] {
                assert!(mean_us(&r, op) >= mean_us(&base, op), "{k} {op}");
            }
        }
        // At 256 tokens the GPU's handoff rate binds: half of it costs time.
        let half = run_cluster(8, 256, (8, 256), EP8, &memory(REAL, &slower[2]));
        for op in ["dispatch", "combine"] {
            assert!(mean_us(&half, op) > 1.3 * mean_us(&base, op), "{op}");
        }
    }

    /// The first-token line of the combine's checks: (median, min, max) in µs.
    fn first_token_us(r: &RunResult) -> (f64, f64, f64) {
        let line = r.jobs[0].ops[1]
            .summary
            .checks
            .iter()
            .find(|c| c.contains("first token has every partial"))
            .expect("the combine reports its first token");
        let nums: Vec<f64> = line
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter_map(|w| w.parse().ok())
            .collect();
        let k = nums.len();
        (nums[k - 3], nums[k - 2], nums[k - 1])
    }

    #[test]
    fn the_start_burst_lands_together_when_hbm_binds() {
        // HBM at 100 GB/s: the burst's expert-output reads (every ring's two slots, 64 tokens
        // per rank) take far longer than a refill's chain, so every fill of the burst lands
        // when HBM has done all of them, and every block's first token is ready then; in
        // issue order the first slots would land in the first half of the burst.
        let slow = REAL.replace("dram_bw_gbps = 3999.0", "dram_bw_gbps = 100.0");
        let r = run_cluster(8, 64, (8, 256), EP8, &memory(&slow, &prov()));
        assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
        let (_, lo, hi) = first_token_us(&r);
        assert!(hi - lo < 0.02, "first tokens ready {lo} to {hi} us");
        // The burst: ≈ 64 · 5.25 (token, rank) rows per rank, two slots of each ring, 14,368 B.
        assert!(lo > 100.0, "the burst's reads at 100 GB/s take over 100 us, got {lo}");
        // With the real HBM the chain and the load ahead of it bind some blocks first.
        let fast = run_cluster(8, 64, (8, 256), EP8, &memory(REAL, &prov()));
        let (med, lo, _) = first_token_us(&fast);
        assert!(lo > 0.0 && med < 20.0, "{lo} {med}");
    }

    #[test]
    fn clusters_beyond_what_is_resident_run_in_waves() {
        // 15 channels: all resident, or one at a time (each cluster's pairs chain-bound).
        let mem = |active| memory(FREE, &keys(4000.0, 47.9, 1e7, active, 232_448));
        let wide = run_cluster(8, 480, (8, 256), EP8, &mem(15));
        let one = run_cluster(8, 480, (8, 256), EP8, &mem(1));
        for op in ["dispatch", "combine"] {
            assert!(mean_us(&one, op) > 10.0 * mean_us(&wide, op), "{op}");
        }
    }

    #[test]
    fn same_seed_same_result() {
        let a = run_cluster(8, 128, (8, 256), EP8, &memory(REAL, &prov()));
        let b = run_cluster(8, 128, (8, 256), EP8, &memory(REAL, &prov()));
        assert_eq!(a.to_json(), b.to_json());
    }
}
