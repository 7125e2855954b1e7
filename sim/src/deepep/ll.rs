//! Low-latency kernels (`internode_ll.cu`, docs/design.md, DeepEP §11, §12).
//!
//! Dispatch: `ceil(E / ceil(E / SMs))` blocks; tokens go round robin to blocks; per token the
//! block casts to FP8, then one warp per top-k slot sends one message per (token, selected
//! expert): an IBGDA put on QP = destination local expert (doorbell every 4 messages per QP,
//! by slot index) or, for mapped peers, a warp copy over NVLink. After its tokens, the block
//! that owns expert `e` waits until every put to `e` was issued and sends the count (an atomic
//! on the same QP, or a release store) — also for experts that got no token. After a grid
//! sync, one warp group per (source rank, local expert) waits for its count and unpacks.
//!
//! Combine: one warp group per (local expert, destination rank) stages each token (TMA) and
//! puts it back (14,336 B BF16) on QP = local expert, then a flag atomic; receivers wait for all
//! flags, then reduce the top-k partials with the weights. Hook mode times the send phase and
//! a receive-phase kernel launched after everything arrived.

use eptwin_engine::api::OpSample;
use eptwin_engine::api::{OpKind, Plan, RoutingTable, ll_combine_msg_bytes, ll_dispatch_msg_bytes};

use super::{GpuCosts, Route, ll_route};
use crate::core::slab::NONE;
use crate::core::time::Time;
use crate::core::world::Program;
use crate::core::{Action, Core, ProgId};
use crate::gpu::PathKind;
use crate::programs::{Meta, Ranks, deepep_job};
use eptwin_engine::api::mix;

mod chains;
mod combine_recv;
mod faults;
mod nvlink;

pub(crate) use nvlink::nvlink_store_bytes;

/// DeepEP's doorbell batching for LL puts (`kNumRequestInBatch`).
const DOORBELL_BATCH: u32 = 4;
/// Bytes of a count/flag release store over NVLink.
const FLAG_BYTES: u64 = 4;
/// What a count adds to its (receiver, source, local expert) counter, on top of the data
/// messages' one each: the receiving group waits for the counter to reach it, and the data
/// that arrived before the count is the rest (far below it: at most tokens × top-k).
const COUNT_ARRIVED: u32 = 1 << 31;

/// A dispatch's (source rank, expert) pair, in one record so that a put touches one cache
/// line: what routing says the source sends the expert, what it sent so far, and its QP.
#[derive(Debug, Clone, Copy)]
struct Cell {
    /// Identity hash of the tokens routing selects, less those sent (0 once they match).
    hash_left: u64,
    /// When the last put ended.
    last_put: Time,
    /// Tokens routing selects (the puts to issue), and issued so far (the next one's slot);
    /// the count the source sends is `sent`.
    want: u32,
    sent: u32,
    /// The QP from the source to the expert's rank for the expert (NONE: not looked up yet).
    qp: u32,
    signalled: bool,
}

/// DeepEP's low-latency dispatch or combine (`internode_ll.cu`) as a program.
pub struct LowLatencyProgram {
    meta: Meta,
    me: ProgId,
    job: usize,
    dispatch: bool,
    hook: bool,
    n: u32,
    tokens: u32,
    /// Receive-buffer slots per (local expert, source) (`num_max_dispatch_tokens_per_rank`).
    max_tokens: u32,
    topk: u32,
    experts: u32,
    local: u32,
    /// Warp groups per block, warps per group, blocks.
    groups: u32,
    wpg: u32,
    blocks: u32,
    msg_bytes: u64,
    /// Dispatch: how long each block's counting warp reads the whole `topk_idx` after the
    /// kernel's start-up; a block sends its experts' counts only after it
    /// ([`chains::count_chain_loads`]).
    count_chain: Time,
    /// Dispatch: the dependent loads of one row a receive warp unpacks, each at the latency of
    /// where the row is (0 where the profile has no load latencies: `gpu.memory`); see
    /// [`chains::recv_row_loads`].
    recv_row_chain: Time,
    /// Combine: the same for a row a send warp copies back ([`chains::combine_row_loads`]).
    combine_row_chain: Time,
    routing: RoutingTable,
    routes: Vec<Route>,
    gpu: Vec<u32>,
    /// Global rank of each job rank (trace tracks).
    global: Vec<u32>,
    costs: GpuCosts,
    ranks: Ranks,
    // --- dispatch -----------------------------------------------------------------------
    /// Next token per (rank, block).
    next_token: Vec<u32>,
    block_done: Vec<Option<Time>>,
    blocks_left: Vec<u32>,
    /// Per (rank, expert), dispatch only: see [`Cell`]. What routing says each pair must
    /// carry is computed independently of the senders.
    cells: Vec<Cell>,
    signals_left: Vec<u32>,
    send_done: Vec<Time>,
    /// Counters per (receiver, source, local expert): data messages delivered, plus
    /// [`COUNT_ARRIVED`] once the count is in.
    recv_ctr: u32,
    groups_left: Vec<u32>,
    /// Hook mode: the longest unpack of a rank's groups (they run in the receive kernel), and
    /// the bytes they copy.
    hook_recv: Vec<Time>,
    hook_bytes: Vec<u64>,
    // --- combine ------------------------------------------------------------------------
    /// CSR over (holder rank, group = dst × L + local expert): the tokens to send back.
    group_off: Vec<u32>,
    group_tok: Vec<u32>,
    /// Next position per (holder rank, group).
    group_pos: Vec<u32>,
    /// Combine: data messages delivered and flags received per destination rank.
    cdata_ctr: u32,
    flag_ctr: u32,
    /// Per (rank, token): weighted sum and number of expert outputs the combine carried.
    acc: Vec<f64>,
    acc_n: Vec<u32>,
    expected_msgs: Vec<u64>,
    // --- faults (docs/design.md, "Faults") ---------------------------------------------------
    /// The run has faults that can stall it: combine flags are counted per (receiver, source)
    /// so a timeout knows whose flags are missing (one counter per receiver otherwise).
    faulty: bool,
    /// Shrink mode (`enable_shrink`): a timed-out wait masks its source instead of trapping.
    shrink: bool,
    /// `masked[r × n + s]`: rank `r` skips rank `s` (its own mask buffer); empty when none.
    masked: Vec<bool>,
    /// Ranks that did not launch this op (down).
    absent: Vec<bool>,
    /// Dispatch: receive groups finished (a masked group's late count is ignored).
    group_done: Vec<bool>,
    /// Combine, `faulty`: the next source whose flags rank `r` waits for.
    flag_next: Vec<u32>,
    /// Combine: `sent_to[h × n + d]`, holder `h` sent its outputs to `d` this op.
    sent_to: Vec<bool>,
}

/// Actor id layout.
impl LowLatencyProgram {
    fn a_block(&self, r: u32, b: u32) -> u32 {
        r * self.blocks + b
    }
    fn a_group(&self, r: u32, g: u32) -> u32 {
        self.n * self.blocks + r * self.experts + g
    }
    fn a_recv_start(&self, r: u32) -> u32 {
        self.n * (self.blocks + self.experts) + r
    }
    fn a_final(&self, r: u32) -> u32 {
        self.n * (self.blocks + self.experts + 1) + r
    }
    fn a_flags(&self, r: u32) -> u32 {
        self.n * (self.blocks + self.experts + 2) + r
    }
    /// The end of rank `r`'s kernel start-up (its fixed part): its blocks or groups start.
    fn a_launch(&self, r: u32) -> u32 {
        self.n * (self.blocks + self.experts + 3) + r
    }
}

impl LowLatencyProgram {
    pub fn new(plan: &Plan, core: &mut Core, meta: Meta) -> LowLatencyProgram {
        let d = deepep_job(plan, meta.job);
        let w = &d.workload;
        let n = plan.job(meta.job).num_ranks();
        let experts = w.experts;
        let local = (experts / n).max(1);
        let sms = core.params.sm_count.max(1);
        let groups = experts.div_ceil(sms).max(1);
        let wpg = (32 / groups).max(1);
        let blocks = experts.div_ceil(groups);
        let dispatch = meta.op == OpKind::Dispatch;
        let msg_bytes = if dispatch {
            ll_dispatch_msg_bytes(w.hidden, w.dispatch_dtype)
        } else {
            ll_combine_msg_bytes(w.hidden, w.combine_dtype)
        };
        let mut routes = Vec::with_capacity((n * n) as usize);
        for a in 0..n {
            for b in 0..n {
                routes.push(ll_route(plan, meta.job, a, b));
            }
        }
        let job = meta.job.index();
        let routing = d.routing().clone();
        let costs = GpuCosts::new(plan, core).for_blocks(blocks);
        let chains = if dispatch {
            chains::Chains::dispatch(&core.params, w, msg_bytes, (blocks * groups * wpg) as u64)
        } else {
            chains::Chains::combine(&core.params, msg_bytes)
        };
        let mut p = LowLatencyProgram {
            meta,
            me: 0,
            job,
            dispatch,
            hook: w.hook,
            n,
            tokens: w.tokens_per_rank,
            max_tokens: w.max_dispatch_tokens_per_rank,
            topk: w.topk,
            experts,
            local,
            groups,
            wpg,
            blocks,
            msg_bytes,
            count_chain: chains.count,
            recv_row_chain: chains.recv_row,
            combine_row_chain: chains.combine_row,
            routes,
            gpu: core.jobs[job].gpu.clone(),
            global: core.jobs[job].ranks.iter().map(|r| r.0).collect(),
            costs,
            ranks: Ranks::new(n),
            next_token: Vec::new(),
            block_done: Vec::new(),
            blocks_left: Vec::new(),
            cells: Vec::new(),
            signals_left: vec![experts; n as usize],
            send_done: vec![0; n as usize],
            recv_ctr: 0,
            groups_left: vec![experts; n as usize],
            hook_recv: vec![0; n as usize],
            hook_bytes: vec![0; n as usize],
            group_off: Vec::new(),
            group_tok: Vec::new(),
            group_pos: Vec::new(),
            cdata_ctr: 0,
            flag_ctr: 0,
            acc: Vec::new(),
            acc_n: Vec::new(),
            expected_msgs: vec![0; n as usize],
            routing,
            faulty: core.faults.can_stall(),
            shrink: d.buffer.enable_shrink,
            masked: core.faults.masks.get(job).cloned().unwrap_or_default(),
            absent: vec![false; n as usize],
            group_done: Vec::new(),
            flag_next: Vec::new(),
            sent_to: Vec::new(),
        };
        if dispatch {
            // Per (source rank, expert): how many of the source's tokens selected it, and which.
            let cell =
                Cell { hash_left: 0, last_put: 0, want: 0, sent: 0, qp: NONE, signalled: false };
            p.cells = crate::core::slab::filled_huge((n * experts) as usize, cell);
            for r in 0..n {
                for t in 0..p.tokens {
                    for &e in p.routing.experts(r, t) {
                        // Shrink mode: nothing is sent to a rank the source masked.
                        if e >= 0 && !p.is_masked(r, e as u32 / local) {
                            let c = &mut p.cells[(r * experts + e as u32) as usize];
                            c.want += 1;
                            c.hash_left = c.hash_left.wrapping_add(mix(r, t, e as u32));
                        }
                    }
                }
            }
        }
        p
    }

    /// GPU time of each kernel launch that does not scale with the work and no other cost
    /// covers, charged before its first send; a hook-mode op is two kernels and pays it in
    /// each (docs/calibration.md).
    fn fixed(&self) -> Time {
        if self.dispatch { self.costs.ll_dispatch_fixed } else { self.costs.ll_combine_fixed }
    }

    fn route(&self, a: u32, b: u32) -> Route {
        self.routes[(a * self.n + b) as usize]
    }

    #[inline]
    fn idx(&self, r: u32, e: u32) -> usize {
        (r * self.experts + e) as usize
    }

    /// The QP of dispatch cell `i` (source `r`, expert `le` of rank `d`), created on first use.
    #[inline]
    fn cell_qp(&mut self, core: &mut Core, i: usize, r: u32, d: u32, le: u32) -> u32 {
        let qp = self.cells[i].qp;
        if qp != NONE {
            return qp;
        }
        let qp = core.job_qp(self.job, r, d, le, self.me);
        self.cells[i].qp = qp;
        qp
    }

    /// Counter of (receiver, source, local expert).
    #[inline]
    fn rsl(&self, recv: u32, src: u32, le: u32) -> u32 {
        (recv * self.n + src) * self.local + le
    }

    // ---- dispatch ------------------------------------------------------------------------

    fn dispatch_start(&mut self, core: &mut Core) {
        let n = self.n;
        self.next_token = (0..n * self.blocks).map(|i| i % self.blocks).collect();
        self.block_done = vec![None; (n * self.blocks) as usize];
        self.blocks_left = vec![self.blocks; n as usize];
        self.recv_ctr = core.counters((n * n * self.local) as usize);
    }

    /// Block `b` of rank `r` processes its next token (cast, then one put per top-k slot in
    /// parallel warps), or finishes its token loop.
    fn block_step(&mut self, core: &mut Core, r: u32, b: u32) {
        let now = core.now;
        let bi = (r * self.blocks + b) as usize;
        let t = self.next_token[bi];
        if t >= self.tokens {
            self.block_finished(core, r, b, now);
            return;
        }
        self.next_token[bi] = t + self.blocks;
        // The round's dependent steps before the puts: the FP8 cast (every thread of the
        // block's cast warps loads its 16 bytes of the row at once: one load's latency, not a
        // copy rate), the named barrier, each warp's slot atomic; the release after its put is
        // counted here too.
        let cast = self.costs.per_token + self.costs.ll_send_round;
        let t1 = now + cast;
        let mut end = t1;
        let put_warps = self.topk.max(1);
        let warp_rate = self.costs.warp_rate(put_warps);
        let experts: Vec<i32> = self.routing.experts(r, t).to_vec();
        for &e in &experts {
            if e < 0 {
                continue;
            }
            let e = e as u32;
            let (d, le) = (e / self.local, e % self.local);
            if self.is_masked(r, d) {
                continue; // shrink mode: nothing is sent to a masked rank
            }
            let i = self.idx(r, e);
            let cell = &mut self.cells[i];
            let slot = cell.sent;
            cell.sent += 1;
            cell.hash_left = cell.hash_left.wrapping_sub(mix(r, t, e));
            let remote = Action::Add { counter: self.recv_ctr + self.rsl(d, r, le), delta: 1 };
            let put_end = match self.route(r, d) {
                Route::Rdma => {
                    let qp = self.cell_qp(core, i, r, d, le);
                    core.post(qp, self.msg_bytes as u32, false, remote, Action::None, self.me);
                    let end = t1 + self.costs.wqe_post;
                    if (slot + 1).is_multiple_of(DOORBELL_BATCH) {
                        core.ring(qp, end);
                    }
                    end
                }
                Route::Copy(kind) => {
                    let link = if kind == PathKind::Nvlink {
                        let base = ((le * self.n + r) as u64 * self.max_tokens as u64
                            + slot as u64)
                            * self.msg_bytes;
                        nvlink_store_bytes(base, self.msg_bytes, &core.params)
                    } else {
                        self.msg_bytes
                    };
                    let issued = core.copy_on_link(
                        t1,
                        self.gpu[r as usize],
                        self.gpu[d as usize],
                        kind,
                        self.msg_bytes,
                        link,
                        warp_rate,
                        remote,
                        self.me,
                        r != d,
                    );
                    // The warp's release after stores to a peer waits for their
                    // acknowledgement (`internode_ll.cu`: the finish counter's release add).
                    if kind == PathKind::Nvlink { issued + self.costs.nvl_ack } else { issued }
                }
            };
            end = end.max(put_end);
            let cell = &mut self.cells[i];
            cell.last_put = cell.last_put.max(put_end);
            if cell.sent == cell.want {
                self.maybe_signal(core, r, e);
            }
        }
        self.ranks.touch(r, end);
        core.wake_at(end, self.me, self.a_block(r, b));
    }

    fn block_finished(&mut self, core: &mut Core, r: u32, b: u32, t: Time) {
        let bi = (r * self.blocks + b) as usize;
        if self.block_done[bi].is_some() {
            return;
        }
        // The counts leave after the block's counting warp too (the block's `__syncthreads`).
        let counted = self.ranks.start[r as usize] + self.fixed() + self.count_chain;
        self.block_done[bi] = Some(t.max(counted));
        self.blocks_left[r as usize] -= 1;
        for e in b * self.groups..((b + 1) * self.groups).min(self.experts) {
            self.maybe_signal(core, r, e);
        }
        self.maybe_send_done(core, r);
    }

    /// Send the count for expert `e` once its owner block finished its tokens and every put
    /// to `e` was issued.
    fn maybe_signal(&mut self, core: &mut Core, r: u32, e: u32) {
        let i = self.idx(r, e);
        let cell = self.cells[i];
        if cell.signalled || cell.sent != cell.want {
            return;
        }
        let owner = (r * self.blocks + e / self.groups) as usize;
        let Some(block_t) = self.block_done[owner] else { return };
        self.cells[i].signalled = true;
        let ts = block_t.max(cell.last_put).max(core.now) + self.costs.ll_signal;
        let (d, le) = (e / self.local, e % self.local);
        if self.is_masked(r, d) {
            self.signals_left[r as usize] -= 1;
            self.maybe_send_done(core, r);
            return;
        }
        // The count (`cell.sent`, read by the receiver from the record) rides on the counter.
        let remote =
            Action::Add { counter: self.recv_ctr + self.rsl(d, r, le), delta: COUNT_ARRIVED };
        let end = match self.route(r, d) {
            Route::Rdma => {
                let qp = self.cell_qp(core, i, r, d, le);
                core.post(qp, 0, true, remote, Action::None, self.me);
                // Atomics always ring, flushing puts still below the batch boundary.
                core.ring(qp, ts + self.costs.wqe_post);
                ts + self.costs.wqe_post
            }
            Route::Copy(kind) => core.copy(
                ts,
                self.gpu[r as usize],
                self.gpu[d as usize],
                kind,
                FLAG_BYTES,
                self.costs.warp,
                remote,
                self.me,
                r != d,
            ),
        };
        self.send_done[r as usize] = self.send_done[r as usize].max(end);
        self.signals_left[r as usize] -= 1;
        self.maybe_send_done(core, r);
    }

    fn maybe_send_done(&mut self, core: &mut Core, r: u32) {
        if self.blocks_left[r as usize] != 0 || self.signals_left[r as usize] != 0 {
            return;
        }
        // Only the first time both reach zero.
        self.blocks_left[r as usize] = u32::MAX;
        let done = self.send_done[r as usize].max(core.now);
        self.ranks.touch(r, done);
        self.ranks.phase("send", r, self.ranks.since_start(r, done), self.n);
        // Non-hook: grid sync, then the receive phase in the same kernel. Hook: the receive
        // kernel is launched later, once everything has arrived (the test overlaps a GEMM).
        let t = if self.hook { done } else { done + self.costs.grid_sync };
        core.wake_at(t, self.me, self.a_recv_start(r));
    }

    fn recv_start(&mut self, core: &mut Core, r: u32) {
        if self.faulty && self.group_done.is_empty() {
            self.group_done = vec![false; (self.n * self.experts) as usize];
        }
        for g in 0..self.experts {
            let (s, le) = (g / self.local, g % self.local);
            if self.is_masked(r, s) {
                self.skip_group(core, r, g);
                continue;
            }
            let c = self.recv_ctr + self.rsl(r, s, le);
            if core.wait(c, COUNT_ARRIVED as u64, self.me, self.a_group(r, g)) {
                self.recv_group(core, r, g);
            }
        }
    }

    /// Warp group (source `s`, local expert `le`) of rank `r` has its count: unpack.
    fn recv_group(&mut self, core: &mut Core, r: u32, g: u32) {
        if !self.group_done.is_empty() {
            let done = &mut self.group_done[(r * self.experts + g) as usize];
            if std::mem::replace(done, true) {
                return; // masked after a timeout: its count came too late
            }
        }
        let (s, le) = (g / self.local, g % self.local);
        let e = r * self.local + le;
        let cell = self.cells[self.idx(s, e)];
        let count = cell.sent as u64;
        let delivered = core.value(self.recv_ctr + self.rsl(r, s, le)) - COUNT_ARRIVED as u64;
        let expected = cell.want;
        if delivered != count {
            self.ranks.fail(format!(
                "rank {r} local expert {le}: count from rank {s} says {count} tokens but {delivered} arrived before it (per-QP order broken)"
            ));
        }
        if count != expected as u64 || cell.hash_left != 0 {
            self.ranks.fail(format!(
                "rank {r} local expert {le}: received {count} tokens from rank {s}, routing selects {expected} (or a different set)"
            ));
        }
        // The group copies its tokens out of the receive buffer (its share of the SM), its
        // warps one message each per round.
        let rate = self.costs.group_rate(self.wpg, self.wpg * self.groups);
        let bytes = count * self.msg_bytes;
        let rounds = count.div_ceil(self.wpg as u64);
        // With the rows' load chain known, it is a warp's time per row (the SM copy rate would
        // count the same latency again) and the bytes queue on the GPU's memory before it.
        let dur = if self.recv_row_chain > 0 {
            (self.costs.ll_recv_per_msg + self.recv_row_chain) * rounds
        } else {
            self.costs.ll_recv_per_msg * rounds + rate.time(bytes)
        };
        if self.hook {
            // The receive kernel runs once everything is in: unpack then, groups in parallel.
            self.hook_recv[r as usize] = self.hook_recv[r as usize].max(dur);
            self.hook_bytes[r as usize] += bytes;
        } else {
            let (_, hbm_end) =
                core.gpus.gpus[self.gpu[r as usize] as usize].hbm.reserve(core.now, bytes);
            let end = self.unpack_end(core.now, hbm_end, dur);
            self.ranks.touch(r, end);
        }
        self.group_finished(core, r);
    }

    /// When an unpack of `dur` that starts at `start` ends, its bytes through the GPU's memory
    /// by `hbm_end`: after them with the rows' load chain known (the chain is a warp's time per
    /// row once its row is in), else whichever of the two is later.
    fn unpack_end(&self, start: Time, hbm_end: Time, dur: Time) -> Time {
        if self.recv_row_chain > 0 { hbm_end + dur } else { (start + dur).max(hbm_end) }
    }

    /// One more receive group of rank `r` is done: the last one ends the receive phase.
    fn group_finished(&mut self, core: &mut Core, r: u32) {
        self.groups_left[r as usize] -= 1;
        if self.groups_left[r as usize] == 0 {
            if self.hook {
                // The receive kernel's start-up, then its groups in parallel; the GEMM the
                // test overlaps has flushed L2, so every message comes back from HBM.
                let start = core.now;
                let unpack = start + self.costs.ll_dispatch_recv_fixed;
                let (gpu, bytes) = (self.gpu[r as usize], self.hook_bytes[r as usize]);
                let chained = self.recv_row_chain > 0;
                let hbm_end = chains::hook_recv_hbm_end(core, gpu, unpack, bytes, chained);
                let end = self.unpack_end(unpack, hbm_end, self.hook_recv[r as usize]);
                self.ranks.phase("recv", r, end - start, self.n);
                self.ranks.touch(r, end);
            }
            let last = self.ranks.last[r as usize];
            core.wake_at(last, self.me, self.a_final(r));
        }
    }

    // ---- combine -------------------------------------------------------------------------

    fn combine_start(&mut self, core: &mut Core) {
        let n = self.n;
        let groups_per_rank = self.experts; // (dst rank, local expert)
        // CSR of tokens each holder sends back, per (holder, dst × L + le).
        let cells = (n * groups_per_rank) as usize;
        let mut counts = vec![0u32; cells + 1];
        for d in 0..n {
            for t in 0..self.tokens {
                for &e in self.routing.experts(d, t) {
                    if e >= 0 {
                        let e = e as u32;
                        let (h, le) = (e / self.local, e % self.local);
                        counts[(h * groups_per_rank + d * self.local + le) as usize] += 1;
                        if !self.is_masked(d, h) {
                            self.expected_msgs[d as usize] += 1;
                        }
                    }
                }
            }
        }
        let mut off = vec![0u32; cells + 1];
        for i in 0..cells {
            off[i + 1] = off[i] + counts[i];
        }
        let mut fill = off.clone();
        let mut toks = vec![0u32; off[cells] as usize];
        for d in 0..n {
            for t in 0..self.tokens {
                for &e in self.routing.experts(d, t) {
                    if e >= 0 {
                        let e = e as u32;
                        let (h, le) = (e / self.local, e % self.local);
                        let c = (h * groups_per_rank + d * self.local + le) as usize;
                        toks[fill[c] as usize] = t;
                        fill[c] += 1;
                    }
                }
            }
        }
        self.group_off = off;
        self.group_tok = toks;
        self.group_pos = vec![0; cells];
        self.cdata_ctr = core.counters(n as usize);
        if self.faulty {
            self.flag_ctr = core.counters((n * n) as usize);
            self.flag_next = vec![0; n as usize];
            self.sent_to = vec![false; (n * n) as usize];
        } else {
            self.flag_ctr = core.counters(n as usize);
        }
        self.acc = vec![0.0; (n * self.tokens) as usize];
        self.acc_n = vec![0; (n * self.tokens) as usize];
        self.signals_left = vec![self.experts; n as usize];
    }

    /// Warp group (dst `d`, local expert `le`) on holder `h` sends its next round of tokens
    /// (one per warp), or its flag when all are out.
    fn combine_round(&mut self, core: &mut Core, h: u32, g: u32) {
        let now = core.now;
        let cell = (h * self.experts + g) as usize;
        let (d, le) = (g / self.local, g % self.local);
        let e = h * self.local + le;
        let (lo, hi) = (self.group_off[cell], self.group_off[cell + 1]);
        let pos = self.group_pos[cell];
        let route = self.route(h, d);
        if self.is_masked(h, d) {
            // Shrink mode: nothing goes to a masked rank, not even the flag.
            self.signals_left[h as usize] -= 1;
            if self.signals_left[h as usize] == 0 {
                self.combine_send_done(core, h);
            }
            return;
        }
        if !self.sent_to.is_empty() {
            self.sent_to[(h * self.n + d) as usize] = true;
        }
        // The SM's copy rate is shared by the warps of its block that copy now: in each of
        // its groups, one warp per token of the group's current round (the rest idle).
        let block = g / self.groups;
        let mut copying = 0;
        for g2 in block * self.groups..((block + 1) * self.groups).min(self.experts) {
            let c = (h * self.experts + g2) as usize;
            let left = self.group_off[c + 1] - self.group_off[c] - self.group_pos[c];
            copying += left.min(self.wpg);
        }
        let warp_rate = self.costs.warp_rate(copying.max(1));
        if lo + pos >= hi {
            // Flag (after every put of this group, on the same QP).
            let ts = now + self.costs.ll_signal;
            let flag = if self.faulty { self.flag_ctr + d * self.n + h } else { self.flag_ctr + d };
            let remote = Action::Add { counter: flag, delta: 1 };
            let end = match route {
                Route::Rdma => {
                    let qp = core.job_qp(self.job, h, d, le, self.me);
                    core.post(qp, 0, true, remote, Action::None, self.me);
                    core.ring(qp, ts + self.costs.wqe_post);
                    ts + self.costs.wqe_post
                }
                Route::Copy(kind) => core.copy(
                    ts,
                    self.gpu[h as usize],
                    self.gpu[d as usize],
                    kind,
                    FLAG_BYTES,
                    self.costs.warp,
                    remote,
                    self.me,
                    h != d,
                ),
            };
            self.send_done[h as usize] = self.send_done[h as usize].max(end);
            self.signals_left[h as usize] -= 1;
            if self.signals_left[h as usize] == 0 {
                self.combine_send_done(core, h);
            }
            return;
        }
        let take = (hi - lo - pos).min(self.wpg);
        // The round's dependent steps before its puts (each warp's source index, the TMA load
        // of its row and the wait for it).
        let now = now + self.costs.ll_combine_round + self.combine_row_chain;
        // With the row's load chain known, its bytes are the GPU memory's to move (a warp's
        // copy rate would count the chain again).
        let warp_rate =
            if self.combine_row_chain > 0 { core.params.hbm_copy_rate } else { warp_rate };
        let mut end = now;
        for k in 0..take {
            let idx = pos + k;
            let t = self.group_tok[(lo + idx) as usize];
            let w = self.weight_of(d, t, e);
            let ti = (d * self.tokens + t) as usize;
            self.acc[ti] += w * (d + 1) as f64;
            self.acc_n[ti] += 1;
            let remote = Action::Add { counter: self.cdata_ctr + d, delta: 1 };
            let put_end = match route {
                Route::Rdma => {
                    // TMA-stage the token into the send buffer, then put it.
                    let staged = core.copy(
                        now,
                        self.gpu[h as usize],
                        self.gpu[h as usize],
                        PathKind::Local,
                        self.msg_bytes,
                        warp_rate,
                        Action::None,
                        self.me,
                        false,
                    );
                    let qp = core.job_qp(self.job, h, d, le, self.me);
                    core.post(qp, self.msg_bytes as u32, false, remote, Action::None, self.me);
                    let end = staged + self.costs.wqe_post;
                    if (idx + 1).is_multiple_of(DOORBELL_BATCH) {
                        core.ring(qp, end);
                    }
                    end
                }
                Route::Copy(kind) => core.copy(
                    now,
                    self.gpu[h as usize],
                    self.gpu[d as usize],
                    kind,
                    self.msg_bytes,
                    warp_rate,
                    remote,
                    self.me,
                    h != d,
                ),
            };
            end = end.max(put_end);
        }
        self.group_pos[cell] = pos + take;
        self.ranks.touch(h, end);
        core.wake_at(end, self.me, self.a_group(h, g));
    }

    /// Rank `r`'s blocks (dispatch) or warp groups (combine) start at `t`.
    fn launch(&mut self, core: &mut Core, r: u32, t: Time) {
        if self.dispatch {
            for b in 0..self.blocks {
                core.wake_at(t, self.me, self.a_block(r, b));
            }
        } else {
            // All groups start at once on different SMs, so a holder's stores interleave
            // across destinations: issue them destination-minor (the egress model is FIFO).
            for k in 0..self.experts {
                let g = (k % self.n) * self.local + k / self.n;
                core.wake_at(t, self.me, self.a_group(r, g));
            }
        }
    }
}

impl Program for LowLatencyProgram {
    fn num_ranks(&self) -> u32 {
        self.n
    }

    fn start_rank(&mut self, core: &mut Core, me: ProgId, r: u32, t: Time) {
        self.ranks.begin(r, t);
        // The kernel's fixed part comes first: nothing is sent before its start-up is done.
        // One wake per rank then starts its blocks, not one per block; without a fixed part the
        // blocks start now, with no extra event.
        let fixed = self.fixed();
        if fixed == 0 {
            self.launch(core, r, t);
        } else {
            core.wake_at(t + fixed, me, self.a_launch(r));
        }
    }

    fn start(&mut self, core: &mut Core, me: ProgId) {
        self.me = me;
        self.ranks.checks.push(if self.dispatch {
            "low-latency dispatch: every (token, expert) message arrives exactly once, before its count".into()
        } else {
            "low-latency combine: every token gets its top-k expert outputs once, weighted; data before flags".into()
        });
        if self.dispatch { self.dispatch_start(core) } else { self.combine_start(core) }
    }

    fn wake(&mut self, core: &mut Core, _me: ProgId, actor: u32) {
        let nb = self.n * self.blocks;
        let ng = self.n * self.experts;
        if self.dispatch {
            if actor < nb {
                self.block_step(core, actor / self.blocks, actor % self.blocks);
            } else if actor < nb + ng {
                let a = actor - nb;
                self.recv_group(core, a / self.experts, a % self.experts);
            } else if actor < nb + ng + self.n {
                self.recv_start(core, actor - nb - ng);
            } else if actor < nb + ng + 2 * self.n {
                let r = actor - nb - ng - self.n;
                self.ranks.finish(r, core.now);
            } else if actor >= nb + ng + 3 * self.n {
                self.launch(core, actor - nb - ng - 3 * self.n, core.now);
            }
        } else if actor >= nb && actor < nb + ng {
            let a = actor - nb;
            self.combine_round(core, a / self.experts, a % self.experts);
        } else if actor >= nb + ng && actor < nb + ng + self.n {
            self.combine_recv_start(core, actor - nb - ng);
        } else if actor >= nb + ng + self.n && actor < nb + ng + 2 * self.n {
            let r = actor - nb - ng - self.n;
            self.ranks.finish(r, core.now);
        } else if actor >= nb + ng + 2 * self.n && actor < nb + ng + 3 * self.n {
            let r = actor - nb - ng - 2 * self.n;
            if self.faulty {
                self.wait_flags_per_source(core, r)
            } else {
                self.combine_reduce(core, r)
            }
        } else if actor >= nb + ng + 3 * self.n {
            self.launch(core, actor - nb - ng - 3 * self.n, core.now);
        }
    }

    fn is_done(&self) -> bool {
        self.ranks.left == 0
    }

    fn finish(&mut self, _core: &Core) -> OpSample {
        let mut s = self.ranks.sample(&self.meta, 0.0);
        if self.hook {
            // DeepEP's hook test: send-phase kernel + receive-phase kernel (launched after
            // everything arrived), timed separately and added.
            s.latency_ns = s.phases.iter().map(|p| p.latency_ns).sum();
        }
        s
    }

    fn spans(&self) -> Vec<(u32, u32, Time, Time)> {
        self.ranks.spans(&self.gpu, &self.global)
    }

    /// DeepEP's low-latency test launches every rank's dispatch and combine back to back on
    /// its stream (docs/design.md, DeepEP §17); in hook mode the receive kernel is launched
    /// after the overlapped work instead.
    fn rank_ends(&self) -> Vec<Time> {
        if self.hook {
            Vec::new()
        } else {
            self.ranks.end.iter().map(|e| e.unwrap_or(Time::MAX)).collect()
        }
    }

    fn skip_rank(&mut self, _core: &mut Core, _me: ProgId, r: u32) {
        self.rank_absent(r);
    }

    fn stalled(
        &mut self,
        core: &mut Core,
        me: ProgId,
        stuck: &[crate::core::world::Stuck],
        down: &[u32],
    ) -> Result<(), crate::core::world::Trap> {
        self.time_out(core, me, stuck, down)
    }

    fn describe(&self, actor: u32) -> String {
        let nb = self.n * self.blocks;
        let ng = self.n * self.experts;
        let op = if self.dispatch { "dispatch" } else { "combine" };
        if actor < nb {
            format!("LL {op} rank {} sender block {}", actor / self.blocks, actor % self.blocks)
        } else if actor < nb + ng {
            let a = actor - nb;
            let (r, g) = (a / self.experts, a % self.experts);
            if self.dispatch {
                format!(
                    "LL dispatch rank {r} receive group (source {}, local expert {})",
                    g / self.local,
                    g % self.local
                )
            } else {
                format!(
                    "LL combine rank {r} send group (destination {}, local expert {})",
                    g / self.local,
                    g % self.local
                )
            }
        } else if actor >= nb + ng + 3 * self.n {
            format!("LL {op} rank {} kernel start-up", actor - nb - ng - 3 * self.n)
        } else {
            format!("LL {op} rank {} receiver", (actor - nb - ng) % self.n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> crate::params::Params {
        let p = toml::from_str(eptwin_engine::profile::BUNDLED[0].1).expect("h800 profile");
        crate::params::Params::from_profile(&p)
    }

    #[test]
    fn an_unaligned_message_costs_its_partial_packets_whole() {
        let p = params();
        // On a line boundary: its bytes. 7,408 bytes at offset 112 (the second slot of a
        // region): 15 warp stores touch 73 lines instead of 58, each partial one a whole 128.
        assert_eq!(nvlink_store_bytes(0, 7408, &p), 7408);
        assert_eq!(nvlink_store_bytes(128 * 1000, 7408, &p), 7408);
        assert_eq!(nvlink_store_bytes(7408, 7408, &p), 7408 + 15 * 128);
        // A message inside one line is one packet wherever it sits.
        assert_eq!(nvlink_store_bytes(16, 64, &p), 64);
    }

    proptest::proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        /// Never less than the bytes, never more than a whole packet per line touched; the same
        /// for any base a line apart.
        #[test]
        fn link_bytes_are_bounded_and_depend_on_the_offset_only(
            base in 0u64..1 << 40, bytes in 1u64..1 << 16,
        ) {
            let p = params();
            let cost = nvlink_store_bytes(base, bytes, &p);
            proptest::prop_assert!(cost >= bytes);
            let stores = bytes.div_ceil(nvlink::WARP_STORE_BYTES);
            proptest::prop_assert!(cost <= bytes + stores * 128);
            proptest::prop_assert_eq!(cost, nvlink_store_bytes(base % 128 + 128 * 7, bytes, &p));
        }
    }
}
