//! The backend's low-latency kernels on one GPU (`kernels/cuda/low_latency.cu`): one
//! 1,024-thread block per SM, the items of every rank interleaved over them (the model:
//! `hwkernels`). In hook mode the backend launches the send phase and the receive phase as two
//! kernels, back to back on the stream, each timed with its own events
//! (`hw/src/low_latency/launch.rs`): the receive kernel starts, with its own launch, once every
//! block of the send kernel is through.

use eptwin_engine::api::OpSample;
use eptwin_engine::api::mix;
use eptwin_engine::api::{OpKind, Plan, RoutingTable, ll_combine_msg_bytes, ll_dispatch_msg_bytes};

use super::{FlushedL2, MemSnap, memory_servers, sharing, warp_copy};
use crate::core::time::Time;
use crate::core::world::Program;
use crate::core::{Action, Core, ProgId};
use crate::params::OneGpu;
use crate::programs::{Meta, Ranks, deepep_job};

/// Low-latency kernels: 1,024 threads (`LL_THREADS`), receive groups of 4 warps
/// (`WARPS_PER_GROUP`, hw/src/low_latency.rs): 8 groups per block.
const LL_GROUPS: u32 = 8;
const LL_WARPS_PER_GROUP: u32 = 4;
/// Low-latency dispatch: threads that cast a token to FP8 (all warps but the counting warp).
const LL_CAST_THREADS: u64 = 31 * 32;
/// Where a low-latency block is in its kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LlStage {
    Send,
    Signal,
    Recv,
    Done,
}

/// The hardware backend's low-latency dispatch or combine on one GPU as a program.
pub struct OneGpuLlProgram {
    meta: Meta,
    me: ProgId,
    dispatch: bool,
    /// Hook mode: send and receive phases are two launches.
    hook: bool,
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
    /// Dispatch: per (block, group), when its receive loop starts; per (receiver, source, local
    /// expert), when the count becomes visible; blocks through their signals.
    recv_start: Vec<Time>,
    count_at: Vec<Time>,
    signalled: u32,
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
    /// Dispatch: when the last block's count signalling is through (the send kernel's end in
    /// hook mode).
    signal_end: Time,
    t0: Time,
    started: u32,
    end: Time,
    mem0: MemSnap,
    flushed: FlushedL2,
}

impl OneGpuLlProgram {
    pub fn new(plan: &Plan, core: &mut Core, meta: Meta) -> OneGpuLlProgram {
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
        let mut p = OneGpuLlProgram {
            meta,
            me: 0,
            dispatch,
            hook: w.hook,
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
            recv_start: vec![0; (blocks * LL_GROUPS) as usize],
            count_at: Vec::new(),
            signalled: 0,
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
            signal_end: 0,
            t0: 0,
            started: 0,
            end: 0,
            mem0: MemSnap::of(core, gpu),
            flushed: FlushedL2 { dirty: m.flush_dirty },
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
        p.count_at = vec![0; cells];
        p
    }

    /// Counter cell of (receiver, source, local expert).
    #[inline]
    fn rsl(&self, recv: u32, src: u32, le: u32) -> u32 {
        (recv * self.n + src) * self.local + le
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
            // Hook mode: the two launches' times (their sum is the op's); fused: when the
            // send loops were through.
            let send_kernel_end = if self.dispatch { self.signal_end } else { self.send_end };
            for r in 0..self.n {
                self.ranks.touch(r, core.now);
                if self.hook {
                    let send = self.ranks.since_start(r, send_kernel_end);
                    self.ranks.phase("send", r, send, self.n);
                    self.ranks.phase("recv", r, core.now - send_kernel_end, self.n);
                } else {
                    self.ranks.phase("send", r, self.send_end.saturating_sub(self.t0), self.n);
                }
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
            LlStage::Recv => return self.dispatch_recv_end(core, b),
            LlStage::Done => return,
        }
        let it = b + self.item[b as usize] * self.blocks;
        if it >= self.token_items() {
            self.send_end = self.send_end.max(core.now);
            self.stage[b as usize] = LlStage::Signal;
            // Groups 1.. have no count to signal: they start receiving at once.
            for g in 1..LL_GROUPS {
                self.recv_start[(b * LL_GROUPS + g) as usize] = core.now;
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
            self.count_at[cell as usize] = at;
        }
        self.stage[b as usize] = LlStage::Recv;
        self.recv_start[(b * LL_GROUPS) as usize] = core.now + self.m.load_l2;
        self.signal_end = self.signal_end.max(core.now + self.m.load_l2);
        self.signalled += 1;
        if self.signalled == self.blocks {
            if self.hook {
                // Every group starts in the receive kernel, after the send kernel and a launch.
                let at = self.signal_end + self.launch;
                self.recv_start.iter_mut().for_each(|t| *t = at);
            }
            self.dispatch_recv(core);
        }
    }

    /// The receive phase, solved once every block has signalled (every count's time is known
    /// then): each group of 4 warps takes its (rank, source, local expert) items in turn; its
    /// first warp polls the counts of sources 0..=source (the packed position is the prefix of
    /// lower sources' counts), the group meets at its barrier, each warp copies every fourth
    /// message (header, payload, scales: HBM) into the packed output and discards it, and the
    /// group meets again. The warps share the memory bandwidth (`sharing`), as in the combine's
    /// send; the servers are charged the bytes now.
    fn dispatch_recv(&mut self, core: &mut Core) {
        let groups = (self.blocks * LL_GROUPS) as usize;
        let items = self.peer_items();
        let base = self.recv_start.iter().copied().min().unwrap_or(core.now);
        let msg = self.msg_bytes;
        let payload = if msg - 16 >= 2 * self.hidden { 2 * self.hidden } else { self.hidden };
        // A message's work: loaded (message) and stored (payload) through L2, both crossing
        // HBM, and its discard.
        let discard = self.m.l2_extra(0, msg);
        let work =
            |extra: u64| core.sm_work(self.gpu, msg + payload, msg + payload + extra, discard);
        let plain = work(0) as f64;
        // The payload's rounds cap a warp's copy; the header before it and the scales after it
        // are dependent loads of their own (every SM loading).
        let load = self.m.load_hbm_busy;
        let rates = sharing::Rates {
            warp: plain / warp_copy(payload / 16, self.m.row_hbm) as f64,
            sm: plain / self.m.sm_port.time(msg + payload) as f64,
        };
        let count_of = |p: &OneGpuLlProgram, item: u32| {
            let (lr, src, le) = p.peer_item(item);
            p.want[(src * p.experts + lr * p.local + le) as usize] as u64
        };
        let mut extra = vec![0u64; items as usize];
        for item in 0..items {
            let count = count_of(self, item);
            extra[item as usize] = self.flushed.take(count * (msg + payload));
        }
        let poll = self.m.ll_recv_poll.unwrap_or(self.m.load_l2);
        let mut warps = Vec::with_capacity(groups * LL_WARPS_PER_GROUP as usize);
        for gi in 0..groups as u32 {
            let sm = (gi / LL_GROUPS) % self.sm_count;
            for w in 0..LL_WARPS_PER_GROUP as u64 {
                let mut steps = vec![sharing::Step::Until(self.recv_start[gi as usize] - base)];
                for item in (gi..items).step_by(groups) {
                    let (lr, src, le) = self.peer_item(item);
                    if w == 0 {
                        for s in 0..=src {
                            let seen = self.count_at[self.rsl(lr, s, le) as usize];
                            steps.push(sharing::Step::Until(seen.max(base) - base));
                            steps.push(sharing::Step::Wait(poll));
                        }
                    }
                    steps.push(sharing::Step::Barrier);
                    let count = count_of(self, item);
                    let per_msg_extra = extra[item as usize] / count.max(1);
                    for _ in (w..count).step_by(LL_WARPS_PER_GROUP as usize) {
                        steps.push(sharing::Step::Wait(load));
                        steps.push(sharing::Step::Copy(work(per_msg_extra)));
                        steps.push(sharing::Step::Wait(load));
                    }
                    steps.push(sharing::Step::Barrier);
                }
                warps.push(sharing::Warp { sm, group: gi, steps });
            }
        }
        let opened = sharing::run(&warps, groups, self.sm_count as usize, rates);
        // The servers take the receive's bytes from when it starts (hook mode: the receive
        // kernel's launch, after now).
        let charged_from = core.now.max(base);
        let mut block_end = vec![charged_from; self.blocks as usize];
        for (gi, times) in opened.iter().enumerate() {
            let b = gi / LL_GROUPS as usize;
            if let Some(&last) = times.last() {
                block_end[b] = block_end[b].max(base + last);
            }
            for item in (gi as u32..items).step_by(groups) {
                let count = count_of(self, item);
                let bytes = count * (msg + payload);
                core.sm_traffic(
                    charged_from,
                    self.gpu,
                    (gi as u32 / LL_GROUPS) % self.sm_count,
                    bytes,
                    bytes + extra[item as usize],
                    self.m.l2_extra(0, count * msg),
                    0,
                    Action::None,
                    self.me,
                    0,
                );
            }
        }
        for (b, &end) in block_end.iter().enumerate() {
            core.wake_at(end, self.me, b as u32);
        }
    }

    /// Block `b`'s receive is through: check what its groups read against what arrived
    /// (every count after its messages, each the routing's tokens), and end it.
    fn dispatch_recv_end(&mut self, core: &mut Core, b: u32) {
        let groups = self.blocks * LL_GROUPS;
        for gi in b * LL_GROUPS..(b + 1) * LL_GROUPS {
            for item in (gi..self.peer_items()).step_by(groups as usize) {
                let (lr, src, le) = self.peer_item(item);
                let cell = self.rsl(lr, src, le);
                let count = core.value(self.cnt_ctr + cell).saturating_sub(1);
                let delivered = core.value(self.data_ctr + cell);
                let i = (src * self.experts + lr * self.local + le) as usize;
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
            }
        }
        self.block_done(core, b);
    }

    // ---- combine ----------------------------------------------------------------------------

    /// The send phase, all of it at `t0`: each group of 4 warps takes its (rank, destination,
    /// local expert) items in turn (`layout_range`: a dependent HBM load), each warp copies its
    /// rows (source index and slot: a dependent HBM load; the BF16 row from HBM into the
    /// destination's receive slot), the group meets at its barrier and its first warp adds the
    /// destination's flag with a release. The warps share the memory bandwidth
    /// (`sharing`), which decides when each item ends; the servers are charged the bytes from
    /// `t0` on, so the receive steps queue behind them and the op reports them.
    fn combine_send(&mut self, core: &mut Core, t0: Time) {
        let groups = (self.blocks * LL_GROUPS) as usize;
        let row = self.msg_bytes;
        // A row's work on the GPU's memory: its 2 × bytes (loaded and stored; read from HBM
        // and written back) and its share of the flush's dirty lines.
        let work = |extra: u64| core.sm_work(self.gpu, 2 * row, 2 * row + extra, 0);
        let plain = work(0) as f64;
        let rates = sharing::Rates {
            warp: plain / warp_copy(row / 16, self.m.row_hbm) as f64,
            sm: plain / self.m.sm_port.time(2 * row) as f64,
        };
        let rows_of = |p: &OneGpuLlProgram, item: u32| {
            let (lr, dst, le) = p.peer_item(item);
            p.want[(dst * p.experts + lr * p.local + le) as usize] as u64
        };
        // The flush's dirty lines go to the first rows copied: the groups' first items first.
        let items = self.peer_items();
        let mut extra = vec![0u64; items as usize];
        for item in 0..items {
            let rows = rows_of(self, item);
            extra[item as usize] = self.flushed.take(2 * row * rows);
        }
        let load = self.m.load_hbm_busy;
        let mut warps = Vec::with_capacity(groups * LL_WARPS_PER_GROUP as usize);
        for gi in 0..groups as u32 {
            let sm = (gi / LL_GROUPS) % self.sm_count;
            for w in 0..LL_WARPS_PER_GROUP as u64 {
                let mut steps = Vec::new();
                for item in (gi..items).step_by(groups) {
                    let rows = rows_of(self, item);
                    let per_row_extra = extra[item as usize] / rows.max(1);
                    steps.push(sharing::Step::Wait(load));
                    for _ in (w..rows).step_by(LL_WARPS_PER_GROUP as usize) {
                        steps.push(sharing::Step::Wait(load));
                        steps.push(sharing::Step::Copy(work(per_row_extra)));
                    }
                    steps.push(sharing::Step::Barrier);
                    steps.push(sharing::Step::Wait(self.m.release));
                }
                warps.push(sharing::Warp { sm, group: gi, steps });
            }
        }
        let opened = sharing::run(&warps, groups, self.sm_count as usize, rates);
        let mut block_end = vec![t0; self.blocks as usize];
        for (gi, times) in opened.iter().enumerate() {
            let items_of = (gi as u32..items).step_by(groups);
            for (item, &at) in items_of.zip(times) {
                let (_, dst, _) = self.peer_item(item);
                let rows = rows_of(self, item);
                let bytes = rows * row;
                core.sm_traffic(
                    t0,
                    self.gpu,
                    (gi as u32 / LL_GROUPS) % self.sm_count,
                    2 * bytes,
                    2 * bytes + extra[item as usize],
                    0,
                    0,
                    Action::None,
                    self.me,
                    bytes,
                );
                // The flag is a release after the group's stores.
                let end = t0 + at + self.m.release;
                core.act_at(
                    end,
                    Action::Add { counter: self.flag_ctr + self.n + dst, delta: rows as u32 },
                );
                core.act_at(
                    end + self.flag,
                    Action::Add { counter: self.flag_ctr + dst, delta: 1 },
                );
                let b = gi / LL_GROUPS as usize;
                block_end[b] = block_end[b].max(end);
            }
        }
        // Each block's receive loop starts once all its groups are through (hook mode: every
        // block in the receive kernel, after the send kernel and a launch).
        self.send_end = block_end.iter().copied().fold(self.send_end, Time::max);
        for (b, &end) in block_end.iter().enumerate() {
            self.stage[b] = LlStage::Recv;
            let at = if self.hook { self.send_end + self.launch } else { end };
            core.wake_at(at, self.me, b as u32);
        }
    }

    /// Block `b`'s receive loop: its next (token, rank): wait (once per rank) for every
    /// expert's flag, then each thread sums the top-k partials of its 16 bytes, one dependent
    /// HBM load per selected expert (every SM loading), and stores the row. (The token's first
    /// `topk_idx` load comes before them but is not charged: prefetching it saves 46 ns a
    /// token, results/h100/ll-combine-prefetch/README.md.)
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

impl Program for OneGpuLlProgram {
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
        if self.dispatch {
            for b in 0..self.blocks {
                core.wake_at(t0, me, b);
            }
        } else {
            self.combine_send(core, t0);
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
        if self.dispatch {
            self.dispatch_block(core, actor);
        } else {
            self.combine_block(core, actor);
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
        format!("one-GPU LL {op} block {actor} ({:?})", self.stage[actor as usize])
    }
}
