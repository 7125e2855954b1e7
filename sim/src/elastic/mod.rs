//! DeepEP V2's dispatch and combine (`ElasticBuffer` on NCCL GIN; docs/design.md, "DeepEP V2")
//! as a program on the simulated machine: one warp per channel, tokens strided over channels
//! (`token = channel + k · channels`), TMA bulk copies through shared memory, GIN puts and
//! signals on the channel's QP through the NIC model.
//!
//! Hybrid dispatch (hybrid_dispatch.cuh): the scale-out warp of channel c loads a token, stores
//! it once into the send buffer (if any other NVLink domain needs it) and into its own
//! domain's receive buffer (local bypass), then puts it once per other domain to the GPU with
//! the same scale-up index there (RAIL), signalling that domain's tail every 6 tokens on the
//! same QP. The forward warp of channel c on the receiving GPU takes ≤ 6 arrived tokens of
//! one source domain per turn (round robin), loads each and stores it over NVLink into every
//! GPU of its domain the token selected (one copy per GPU); a scale-up barrier ends the kernel.
//! Direct dispatch (dispatch.cuh): each warp stores a token over NVLink to the ranks of its
//! domain and puts it once per rank elsewhere (FULL), then a barrier over GIN signals.
//!
//! Hybrid combine (hybrid_combine.cuh): scale-up warps send each token's expert output back
//! over NVLink to the GPU that forwarded it, publishing tails every 3 rounds; that GPU's
//! forward warp replays its dispatch order, waits for every partial, reduces them (SM loads),
//! and puts the reduced token to the source domain's GPU; it then flushes its QP and signals
//! every scale-out rank, and waits for theirs. Direct combine: every rank sends each received
//! token back to its source (NVLink or a put), then a barrier.
//!
//! Timing is the kernel's (test_ep.py times the `dispatch_impl` / `combine_impl` kernels with
//! kineto; the copy and reduce epilogues are separate kernels, not timed here). The combine's
//! forward order is the dispatch's in full-arrival form (round robin over source domains, 6
//! slots a turn, every source's tokens present), since each op runs on a fresh machine.

mod order;

use eptwin_engine::api::{ElasticSettings, OpKind, OpSample, Plan, RoutingTable, mix};

use crate::core::time::{Rate, Time, ns};
use crate::core::world::Program;
use crate::core::{Action, Core, ProgId};
use crate::deepep::GpuCosts;
use crate::gpu::PathKind;
use crate::programs::{Ledger, Meta, Ranks, deepep_job};

use order::Order;

/// Per-token GPU work rates and latencies of V2's warps.
#[derive(Debug, Clone, Copy)]
struct Rates {
    /// A warp's TMA bulk-copy rate (its share of the SM's).
    tma: Rate,
    /// Issue to landed of a TMA load from HBM.
    fill: Time,
    /// A forward warp's loads while reducing (SM load/store path, shared by the SM's warps).
    reduce: Rate,
    flag: Time,
    grid_sync: Time,
    wqe_post: Time,
}

pub struct ElasticProgram {
    meta: Meta,
    me: ProgId,
    job: usize,
    dispatch: bool,
    n: u32,
    e: ElasticSettings,
    tokens: u32,
    tok_bytes: u64,
    gpu: Vec<u32>,
    global: Vec<u32>,
    rates: Rates,
    ranks: Ranks,
    routing: RoutingTable,
    ledger: Ledger,
    order: Order,
    /// Counters: per (rank, channel) a landing count; per rank the start signals; per
    /// (rank, channel, source domain) arrival tails (dispatch) or per (forwarder rank,
    /// channel, scale-up source) partial tails (combine); per (rank, channel) put completions
    /// and end signals.
    landed: u32,
    start_sig: u32,
    tails: u32,
    put_done: u32,
    end_sig: u32,
    // Sender / scale-up warp state per (rank, channel).
    next: Vec<u32>,
    issued_land: Vec<u64>,
    phase: Vec<u8>,
    /// Tokens signalled and sent per (rank, channel, destination domain) (dispatch tails).
    sent: Vec<u32>,
    signalled: Vec<u32>,
    puts: Vec<u64>,
    // Forward warp state per (rank, channel).
    fpos: Vec<u32>,
    fland: Vec<u64>,
    fphase: Vec<u8>,
    /// Forward warps: per (rank, channel, source domain) tokens consumed, and the round robin.
    consumed: Vec<u32>,
    rr: Vec<u32>,
    chunk_left: Vec<u32>,
    /// Scale-up warps: the rank the loaded partial goes to; forward warps: the token being
    /// forwarded (source domain, index in its stream) or reduced (source rank).
    cur: Vec<(u32, u32)>,
    fcur: Vec<(u32, u32)>,
    workers_left: Vec<u32>,
    launched: Vec<bool>,
    /// Per (rank, channel): when the next token's preloaded TMA load lands (sender or
    /// scale-up warp), and the forward warp's load or reduction ends.
    load_at: Vec<Time>,
    fload_at: Vec<Time>,
    /// Combine: per (rank, channel, scale-up index) list positions sent / partials consumed,
    /// and tails published.
    lpos: Vec<u32>,
    fcnt: Vec<u32>,
    published: Vec<u32>,
    rounds: Vec<u32>,
    last_j: Vec<Option<u32>>,
    /// Per rank: its workers are done; per domain: ranks at the end barrier.
    at_barrier: Vec<Option<Time>>,
}

impl ElasticProgram {
    pub fn new(plan: &Plan, core: &mut Core, meta: Meta) -> ElasticProgram {
        let d = deepep_job(plan, meta.job);
        let e = d.elastic.expect("a DeepEP V2 job");
        let w = &d.workload;
        let n = plan.job(meta.job).num_ranks();
        let dispatch = meta.op == OpKind::Dispatch;
        let tok_bytes = if dispatch {
            eptwin_engine::api::elastic_dispatch_token_bytes(w.hidden, w.topk, w.dispatch_dtype)
        } else {
            eptwin_engine::api::elastic_combine_token_bytes(w.hidden, w.topk)
        };
        let costs = GpuCosts::new(plan, core).for_blocks(e.num_sms);
        let dp = &plan.profile.deepep;
        let warps = 2 * e.channels_per_sm;
        let sm_tma = dp.elastic_sm_tma_gbps.unwrap_or(0.0) * costs.sm_share;
        let rates = Rates {
            tma: Rate::from_gbps((sm_tma / warps as f64).max(1e-3)),
            fill: ns(dp.elastic_tma_fill_ns.unwrap_or(0)),
            reduce: costs.warp_rate(e.channels_per_sm),
            flag: costs.flag,
            grid_sync: costs.grid_sync,
            wqe_post: costs.wqe_post,
        };
        let routing = d.routing().clone();
        let order = Order::new(&routing, &e, w.tokens_per_rank);
        let (ch, so) = (e.num_channels, e.num_scaleout_ranks);
        let rc = (n * ch) as usize;
        let mut p = ElasticProgram {
            meta,
            me: 0,
            job: meta.job.index(),
            dispatch,
            n,
            e,
            tokens: w.tokens_per_rank,
            tok_bytes,
            gpu: core.jobs[meta.job.index()].gpu.clone(),
            global: core.jobs[meta.job.index()].ranks.iter().map(|r| r.0).collect(),
            rates,
            ranks: Ranks::new(n),
            routing,
            ledger: Ledger::new(n),
            order,
            landed: 0,
            start_sig: 0,
            tails: 0,
            put_done: 0,
            end_sig: 0,
            next: vec![0; rc],
            issued_land: vec![0; rc],
            phase: vec![0; rc],
            sent: vec![0; rc * so as usize],
            signalled: vec![0; rc * so as usize],
            puts: vec![0; rc],
            fpos: vec![0; rc],
            fland: vec![0; rc],
            fphase: vec![0; rc],
            consumed: vec![0; rc * so as usize],
            rr: vec![0; rc],
            chunk_left: vec![0; rc],
            cur: vec![(0, 0); rc],
            fcur: vec![(0, 0); rc],
            workers_left: vec![0; n as usize],
            launched: vec![false; n as usize],
            load_at: vec![0; rc],
            fload_at: vec![0; rc],
            lpos: vec![0; rc * e.num_scaleup_ranks as usize],
            fcnt: vec![0; rc * e.num_scaleup_ranks as usize],
            published: vec![0; rc * e.num_scaleup_ranks as usize],
            rounds: vec![0; rc],
            last_j: vec![None; rc],
            at_barrier: vec![None; n as usize],
        };
        p.expect();
        p
    }

    /// What each rank must end up with: dispatch (source, token) at every selected rank;
    /// combine one reduced token back at its source per scale-out domain (hybrid) or rank
    /// (direct) it visited.
    fn expect(&mut self) {
        let mut ranks = Vec::new();
        for src in 0..self.n {
            for t in 0..self.tokens {
                self.routing.token_ranks(src, t, &mut ranks);
                if self.dispatch {
                    for &d in &ranks {
                        self.ledger.expect(d, mix(src, t, 0));
                    }
                } else {
                    for unit in self.combine_units(&ranks) {
                        self.ledger.expect(src, mix(src, t, 1 + unit));
                    }
                }
            }
        }
    }

    /// The units a token's combine returns in: its scale-out domains (hybrid) or its ranks.
    fn combine_units(&self, ranks: &[u32]) -> Vec<u32> {
        let su = self.e.num_scaleup_ranks;
        let mut u: Vec<u32> =
            ranks.iter().map(|&r| if self.e.hybrid { r / su } else { r }).collect();
        u.dedup();
        u
    }

    #[inline]
    fn rc(&self, r: u32, c: u32) -> usize {
        (r * self.e.num_channels + c) as usize
    }
    #[inline]
    fn domain(&self, r: u32) -> u32 {
        r / self.e.num_scaleup_ranks
    }
    /// The job rank of scale-up index `i` in domain `m`.
    #[inline]
    fn rank(&self, m: u32, i: u32) -> u32 {
        m * self.e.num_scaleup_ranks + i
    }

    /// `get_qp_mode` (common/comm.cuh:56-86): QP 0 is the notify warps'; data channels take
    /// their own QPs while there are enough, else share them round robin.
    fn qp(&self, c: u32) -> u32 {
        let (sms, per_sm) = (self.e.num_sms.max(1), self.e.channels_per_sm.max(1));
        let qps = self.e.num_qps.max(1);
        if qps == 1 {
            return 0;
        }
        let avail = qps - 1;
        let (sm, local) = (c / per_sm, c % per_sm);
        if sms <= avail {
            let in_sm = avail / sms + u32::from(sm < avail % sms);
            1 + sm + (local % in_sm.max(1)) * sms
        } else {
            1 + c % avail
        }
    }

    fn path(&self, a: u32, b: u32) -> PathKind {
        if self.gpu[a as usize] == self.gpu[b as usize] {
            PathKind::Local
        } else if self.domain(a) == self.domain(b) || !self.e.hybrid && self.same_nvl(a, b) {
            PathKind::Nvlink
        } else {
            PathKind::Pcie
        }
    }

    fn same_nvl(&self, a: u32, b: u32) -> bool {
        a / self.e.num_nvlink_ranks == b / self.e.num_nvlink_ranks
    }

    /// A copy of `bytes` from rank `a`'s GPU to rank `b`'s, landing adds 1 to `done`.
    fn copy(&self, core: &mut Core, at: Time, a: u32, b: u32, bytes: u64, done: Action) -> Time {
        let (ga, gb) = (self.gpu[a as usize], self.gpu[b as usize]);
        let kind = self.path(a, b);
        core.copy(at, ga, gb, kind, bytes, self.rates.tma, done, self.me, a != b)
    }

    /// A GIN put of `bytes` from `src` to `dst` on channel `c`'s QP; `remote` runs at the
    /// target, the completion bumps `src`'s put counter.
    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        core: &mut Core,
        at: Time,
        src: u32,
        dst: u32,
        c: u32,
        bytes: u64,
        atomic: bool,
        remote: Action,
    ) {
        let qp = core.job_qp(self.job, src, dst, self.qp(c), self.me);
        let x = self.rc(src, c);
        let local = Action::Add { counter: self.put_done + x as u32, delta: 1 };
        self.puts[x] += 1;
        core.post(qp, bytes as u32, atomic, remote, local, self.me);
        core.ring(qp, at + self.rates.wqe_post);
    }

    fn worker_done(&mut self, core: &mut Core, r: u32) {
        self.ranks.touch(r, core.now);
        self.workers_left[r as usize] -= 1;
        if self.workers_left[r as usize] == 0 {
            self.end_barrier(core, r);
        }
    }

    /// The kernel's end: the scale-up barrier (hybrid dispatch; the NVLink ranks), a barrier
    /// over GIN signals (direct with RDMA), or none (hybrid combine, whose forward warps
    /// already waited for every scale-out rank).
    fn end_barrier(&mut self, core: &mut Core, r: u32) {
        let now = core.now + self.rates.grid_sync;
        if self.e.hybrid && !self.dispatch {
            self.ranks.finish(r, now);
            return;
        }
        self.at_barrier[r as usize] = Some(now);
        let group: Vec<u32> = if self.e.hybrid || self.e.num_rdma_ranks == 1 {
            let m = self.domain(r);
            (0..self.e.num_scaleup_ranks).map(|i| self.rank(m, i)).collect()
        } else {
            (0..self.n).collect()
        };
        if group.iter().all(|&g| self.at_barrier[g as usize].is_some()) {
            let last =
                group.iter().filter_map(|&g| self.at_barrier[g as usize]).max().unwrap_or(now);
            let cross = group.iter().any(|&g| !self.same_nvl(g, r));
            // A GIN barrier is a signal round trip through the NICs; NVLink's a flag.
            let lat = if cross {
                self.rates.flag
                    + ns(core.params.profile.nic.tx_latency_ns
                        + core.params.profile.nic.rx_latency_ns)
            } else {
                self.rates.flag
            };
            for &g in &group {
                self.ranks.finish(g, last + lat);
            }
        }
    }
}

mod combine;
mod dispatch;

impl Program for ElasticProgram {
    fn num_ranks(&self) -> u32 {
        self.n
    }

    fn start(&mut self, core: &mut Core, me: ProgId) {
        self.me = me;
        let rc = (self.n * self.e.num_channels) as usize;
        let so = self.e.num_scaleout_ranks as usize;
        self.landed = core.counters(2 * rc);
        self.start_sig = core.counters(self.n as usize);
        self.tails = core.counters(rc * so.max(self.e.num_scaleup_ranks as usize));
        self.put_done = core.counters(rc);
        self.end_sig = core.counters(rc);
        self.ranks.checks.push(if self.dispatch {
            "V2 dispatch: every (token, destination rank) arrives exactly once".into()
        } else {
            "V2 combine: every token comes back once per scale-out domain (hybrid) or rank (direct) it visited".into()
        });
    }

    /// The kernel's opening barrier: a GIN signal to every scale-out peer on QP 0 (hybrid)
    /// or every rank (direct across domains), and the NVLink barrier, then a grid sync.
    fn start_rank(&mut self, core: &mut Core, me: ProgId, r: u32, t: Time) {
        self.ranks.begin(r, t);
        let peers: Vec<u32> = if self.e.hybrid {
            let i = r % self.e.num_scaleup_ranks;
            (0..self.e.num_scaleout_ranks).map(|m| self.rank(m, i)).filter(|&p| p != r).collect()
        } else if self.e.num_rdma_ranks > 1 {
            (0..self.n).filter(|&p| !self.same_nvl(p, r)).collect()
        } else {
            Vec::new()
        };
        for &p in &peers {
            let qp = core.job_qp(self.job, r, p, 0, me);
            core.post(
                qp,
                0,
                true,
                Action::Add { counter: self.start_sig + p, delta: 1 },
                Action::None,
                me,
            );
            core.ring(qp, t + self.rates.wqe_post);
        }
        let go = self.actor_go(r);
        if peers.is_empty() {
            core.wake_at(t + self.rates.flag + self.rates.grid_sync, me, go);
        } else if core.wait(self.start_sig + r, peers.len() as u64, me, go) {
            core.wake_at(t + self.rates.grid_sync, me, go);
        }
    }

    fn wake(&mut self, core: &mut Core, _me: ProgId, actor: u32) {
        let rc = self.n * self.e.num_channels;
        if actor < rc {
            if self.dispatch { self.send(core, actor) } else { self.scaleup_send(core, actor) }
        } else if actor < 2 * rc {
            if self.dispatch {
                self.forward(core, actor - rc)
            } else {
                self.forward_reduce(core, actor - rc)
            }
        } else if actor < 3 * rc {
            self.end_wait(core, actor - 2 * rc);
        } else {
            let r = actor - 3 * rc;
            if !self.launched[r as usize] {
                self.launched[r as usize] = true;
                self.launch_workers(core, r);
            }
        }
    }

    fn is_done(&self) -> bool {
        self.ranks.left == 0
    }

    fn finish(&mut self, _core: &Core) -> OpSample {
        let what = if self.dispatch { "(token, rank) pairs" } else { "reduced tokens" };
        self.ledger.check(&mut self.ranks, what);
        self.ranks.sample(&self.meta, 0.0)
    }

    fn spans(&self) -> Vec<(u32, u32, Time, Time)> {
        self.ranks.spans(&self.gpu, &self.global)
    }

    fn stuck(&self) -> Vec<String> {
        let ch = self.e.num_channels;
        let mut out = Vec::new();
        for r in 0..self.n {
            if self.ranks.end[r as usize].is_some() {
                continue;
            }
            let busy: Vec<String> = (0..ch)
                .filter(|&c| self.phase[self.rc(r, c)] != 0 || self.fphase[self.rc(r, c)] != 4)
                .take(4)
                .map(|c| {
                    let x = self.rc(r, c);
                    format!(
                        "ch {c}: next {} phase {} fphase {} fpos {}",
                        self.next[x], self.phase[x], self.fphase[x], self.fpos[x]
                    )
                })
                .collect();
            out.push(format!(
                "V2 rank {r}: {} workers left, barrier {:?}; {}",
                self.workers_left[r as usize],
                self.at_barrier[r as usize],
                busy.join(", ")
            ));
        }
        out
    }

    fn describe(&self, actor: u32) -> String {
        let rc = self.n * self.e.num_channels;
        let ch = self.e.num_channels;
        let op = if self.dispatch { "dispatch" } else { "combine" };
        let (role, x) = match actor {
            a if a < rc => (if self.dispatch { "scale-out sender" } else { "scale-up sender" }, a),
            a if a < 2 * rc => ("forward warp", a - rc),
            a if a < 3 * rc => ("end wait", a - 2 * rc),
            a => return format!("V2 {op} rank {} start barrier", a - 3 * rc),
        };
        format!("V2 {op} rank {} channel {} {role}", x / ch, x % ch)
    }
}

impl ElasticProgram {
    fn actor_go(&self, r: u32) -> u32 {
        3 * self.n * self.e.num_channels + r
    }

    /// Every warp of rank `r` starts once the opening barrier is through.
    fn launch_workers(&mut self, core: &mut Core, r: u32) {
        let ch = self.e.num_channels;
        let rc = self.n * ch;
        let forwarders = self.e.hybrid;
        self.workers_left[r as usize] = ch * if forwarders { 2 } else { 1 };
        for c in 0..ch {
            let x = self.rc(r, c) as u32;
            self.next[x as usize] = c;
            core.wake_at(core.now, self.me, x);
            if forwarders {
                self.rr[x as usize] = c % self.e.num_scaleout_ranks;
                core.wake_at(core.now, self.me, rc + x);
            }
        }
    }

    /// A warp's closing waits: its puts completed (GIN flush), then, for a hybrid combine
    /// forward warp, every scale-out rank's end signal.
    fn end_wait(&mut self, core: &mut Core, x: u32) {
        let xi = x as usize;
        let r = x / self.e.num_channels;
        let me = self.me;
        let actor = 2 * self.n * self.e.num_channels + x;
        if self.fphase[xi] == 2 {
            if !core.wait(self.put_done + x, self.puts[xi], me, actor) {
                return;
            }
            if self.e.hybrid && !self.dispatch {
                self.fphase[xi] = 3;
                self.signal_end(core, x);
                if !core.wait(self.end_sig + x, self.e.num_scaleout_ranks as u64, me, actor) {
                    return;
                }
            }
        } else if self.fphase[xi] == 3
            && !core.wait(self.end_sig + x, self.e.num_scaleout_ranks as u64, me, actor)
        {
            return;
        }
        if self.fphase[xi] != 4 {
            self.fphase[xi] = 4;
            self.worker_done(core, r);
        }
    }

    /// Start warp `x`'s closing waits (`fphase` 2).
    fn close(&mut self, core: &mut Core, x: u32) {
        self.fphase[x as usize] = 2;
        self.end_wait(core, x);
    }
}
