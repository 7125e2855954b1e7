//! Normal internode kernels with asymmetric forwarding (`internode.cu`, docs/design.md, DeepEP §9,
//! §10).
//!
//! Dispatch, per rank (node m, local index i) and channel c: the RDMA sender copies each token
//! once per destination node into that node's send slots (credits: `rdma_recv` slots per
//! (channel, source node) on the receiver, returned lazily) and its coordinator puts chunks of
//! ≤ `rdma_send` tokens on QP c to the GPU with the same local index there, each followed by a
//! tail atomic on the same QP; the own node is written directly. On the receiving GPU one
//! forwarder warp per local destination round-robins over source nodes, TMA-copies the tokens
//! that destination needs into its NVLink ring (`nvl_recv` slots, ≤ `nvl_send` per turn), and a
//! coordinator returns RDMA credits on QP c + C once every forwarder freed ≥ `rdma_send`
//! slots. NVLink receivers drain the rings into `recv_x`.
//!
//! Combine mirrors it: NVLink senders push each token's expert output back to the local GPU
//! that forwarded it, forwarders (one warp group per source node) reduce the ≤ 8 partials and
//! put the reduced tokens once per (token, node), `rdma_send` per put (credits for the whole
//! chunk first; a put only once the chunk is reduced) with tail atomics, and the RDMA receivers
//! reduce across nodes. A combine NVL ring is split per source node (`nvl_recv / R` slots
//! each, `num_max_nvl_chunked_recv_tokens_per_rdma`, with its own head and tail: "separate NVL
//! buffers for different RDMA sources" to avoid deadlocks; hence the host asserts
//! `nvl_recv % R == 0` and `nvl_recv / R > max(rdma_send, nvl_send)`, DeepEP §5): each NVL
//! sender walks the source node's tokens in `recv_x` order (token order per source rank and
//! channel) and sends `nvl_send` of them to the next node whose part has room, round robin from
//! `channel % R`, so every forwarder group is fed from the start.
//!
//! Timing follows `test_internode.py` (`bench_kineto`): the kernel's time, notify excluded
//! (reported as a phase).

mod combine;
mod dispatch;

use eptwin_engine::api::OpSample;
use eptwin_engine::api::{
    Config, NUM_MAX_NVL_PEERS, OpKind, Plan, RoutingTable, channel_range,
    normal_combine_token_bytes, normal_dispatch_token_bytes,
};

use super::{GpuCosts, ipc_path};
use crate::core::time::{Rate, Time, ns};
use crate::core::world::Program;
use crate::core::{Action, Core, ProgId};
use crate::gpu::PathKind;
use crate::programs::channel_ring::ChannelRing;
use crate::programs::{Ledger, Meta, Ranks, deepep_job};
use eptwin_engine::api::mix;

const P: u32 = NUM_MAX_NVL_PEERS;
/// Channel meta message: (NUM_MAX_NVL_PEERS · 2 + 2) ints.
const META_BYTES: u32 = 72;
/// The forwarder coordinator polls with `__nanosleep(NUM_WAIT_NANOSECONDS)` (500 ns).
const COORD_POLL_NS: u64 = 500;
/// Warps of the internode kernels' blocks (512 threads).
const WARPS_PER_BLOCK: u32 = 16;

/// Token id in rings: (source node, token).
#[inline]
fn tid(node: u32, t: u32) -> u32 {
    (node << 20) | t
}

pub struct InternodeProgram {
    meta: Meta,
    me: ProgId,
    job: usize,
    dispatch: bool,
    n: u32,
    nodes: u32,
    ch: u32,
    tokens: u32,
    tok_bytes: u64,
    out_bytes: u64,
    cfg: Config,
    gpu: Vec<u32>,
    /// Global rank of each job rank (trace tracks).
    global: Vec<u32>,
    paths: Vec<PathKind>,
    costs: GpuCosts,
    ranks: Ranks,
    routing: RoutingTable,
    /// Local-GPU mask per (rank, token, node): which GPUs of `node` need the token.
    masks: Vec<u8>,
    /// RDMA rings per (receiving rank, channel, source node).
    rdma: Vec<ChannelRing>,
    /// NVLink rings per (receiving rank, channel, source local index).
    nvl: Vec<ChannelRing>,
    /// Meta counters per (rank, channel).
    meta_ctr: u32,
    // Dispatch RDMA sender per (rank, channel).
    snd_next: Vec<u32>,
    /// Per (rank, channel, node): slots allocated, processed (copied), issued (put).
    alloc: Vec<u32>,
    processed: Vec<u32>,
    issued: Vec<u32>,
    total: Vec<u32>,
    snd_batch: Vec<Vec<(u32, u32)>>,
    coord_free: Vec<Time>,
    snd_done: Vec<bool>,
    // Forwarders per (rank, channel, local dst j).
    fwd_head: Vec<u32>,
    fwd_rr: Vec<u32>,
    fwd_pending: Vec<Option<(u32, u32)>>,
    fwd_armed: Vec<bool>,
    fwd_done: Vec<bool>,
    /// RDMA ring length per (rank, channel, source node): tokens that will arrive.
    rdma_expected: Vec<u32>,
    /// Coordinator per (rank, channel, source node): credits returned so far.
    credit_last: Vec<u32>,
    // NVLink receivers per (rank, channel, source local index).
    nvl_expected: Vec<u32>,
    nvl_batch: Vec<u32>,
    nvl_done: Vec<bool>,
    // Combine. NVL rings per (forwarder rank, channel, source local j, source node m):
    // `self.nvl` at `rcj(..) * nodes + m`.
    /// Tokens each combine NVL ring carries (the sender's `recv_x` rows of source (m, i) and
    /// the channel that reached it). They are the group's RDMA stream filtered by the routing
    /// mask's bit j, in the same order, so the ring keeps counts rather than token ids.
    csub_len: Vec<u32>,
    /// Per combine NVL ring: the sender's next position, the forwarder group's.
    cs_next: Vec<u32>,
    cg_pos: Vec<u32>,
    /// Per combine NVL ring: the head the forwarder published.
    cg_pub: Vec<u32>,
    /// Combine NVL sender per (sending rank, channel, dst local i): the node it last sent for
    /// (round robin), a copy in flight, retired; per (sender, node): waiting for that head.
    cs_rr: Vec<u32>,
    cs_busy: Vec<bool>,
    cs_done: Vec<bool>,
    cs_armed: Vec<bool>,
    /// Combine forwarder group per (rank, channel, node): position in its RDMA stream,
    /// its stream, and the batch in flight.
    cf_stream: Vec<Vec<u32>>,
    cf_pos: Vec<u32>,
    cf_batch: Vec<u32>,
    /// Per combine forwarder group: the end of the chunk it is reducing.
    cf_end: Vec<u32>,
    /// Combine RDMA receiver per (rank, channel): next token, per node consumed count.
    cr_next: Vec<u32>,
    cr_pos: Vec<u32>,
    cr_credit_last: Vec<u32>,
    cr_touched: Vec<bool>,
    workers_left: Vec<u32>,
    ledger: Ledger,
    // Rates.
    sender_rate: Rate,
    fwd_rate: Rate,
    recv_rate: Rate,
    group_rate: Rate,
    combine_recv_rate: Rate,
    notify: Time,
    fwd_waiting_head: Vec<bool>,
}

impl InternodeProgram {
    pub fn new(plan: &Plan, core: &mut Core, meta: Meta) -> InternodeProgram {
        let d = deepep_job(plan, meta.job);
        let w = &d.workload;
        let n = plan.job(meta.job).num_ranks();
        let nodes = (n / P).max(1);
        let dispatch = meta.op == OpKind::Dispatch;
        let cfg: Config = if dispatch { d.dispatch_config } else { d.combine_config }
            .expect("normal mode has a resolved Config");
        let ch = cfg.num_channels().max(1);
        let (tok_bytes, out_bytes) = if dispatch {
            let b = normal_dispatch_token_bytes(w.hidden, w.topk, w.dispatch_dtype);
            (b, b)
        } else {
            (normal_combine_token_bytes(w.hidden, w.topk), 2 * w.hidden as u64)
        };
        let mut paths = Vec::with_capacity((n * n) as usize);
        for a in 0..n {
            for b in 0..n {
                paths.push(ipc_path(plan, meta.job, a, b));
            }
        }
        let costs = GpuCosts::new(plan, core).for_blocks(cfg.num_sms);
        let warps = |k: u32| {
            let per = costs.warp.slower(costs.sm.shared(WARPS_PER_BLOCK));
            Rate::from_gbps(per.gbps() * k as f64)
        };
        let nodes_u = nodes as usize;
        let mut p = InternodeProgram {
            meta,
            me: 0,
            job: meta.job.index(),
            dispatch,
            n,
            nodes,
            ch,
            tokens: w.tokens_per_rank,
            tok_bytes,
            out_bytes,
            cfg,
            gpu: core.jobs[meta.job.index()].gpu.clone(),
            global: core.jobs[meta.job.index()].ranks.iter().map(|r| r.0).collect(),
            paths,
            sender_rate: warps(7),
            fwd_rate: warps(1),
            recv_rate: warps(1),
            // Combine forwarders: R × max(24 / R, 1) warps on the forwarder SM.
            group_rate: warps((24 / nodes).max(1)).slower(costs.sm.shared(nodes)),
            combine_recv_rate: warps(8),
            costs,
            ranks: Ranks::new(n),
            routing: d.routing().clone(),
            masks: Vec::new(),
            rdma: Vec::new(),
            nvl: Vec::new(),
            meta_ctr: 0,
            snd_next: Vec::new(),
            alloc: vec![0; (n * ch) as usize * nodes_u],
            processed: vec![0; (n * ch) as usize * nodes_u],
            issued: vec![0; (n * ch) as usize * nodes_u],
            total: vec![0; (n * ch) as usize * nodes_u],
            snd_batch: vec![Vec::new(); (n * ch) as usize],
            coord_free: vec![0; (n * ch) as usize],
            snd_done: vec![false; (n * ch) as usize],
            fwd_head: vec![0; (n * ch * P) as usize * nodes_u],
            fwd_rr: vec![0; (n * ch * P) as usize],
            fwd_pending: vec![None; (n * ch * P) as usize],
            fwd_armed: vec![false; (n * ch * P) as usize * nodes_u],
            fwd_done: vec![false; (n * ch * P) as usize],
            rdma_expected: vec![0; (n * ch) as usize * nodes_u],
            credit_last: vec![0; (n * ch) as usize * nodes_u],
            nvl_expected: vec![0; (n * ch * P) as usize],
            nvl_batch: vec![0; (n * ch * P) as usize],
            nvl_done: vec![false; (n * ch * P) as usize],
            csub_len: Vec::new(),
            cs_next: Vec::new(),
            cg_pos: Vec::new(),
            cg_pub: Vec::new(),
            cs_rr: Vec::new(),
            cs_busy: Vec::new(),
            cs_done: Vec::new(),
            cs_armed: Vec::new(),
            cf_stream: Vec::new(),
            cf_pos: Vec::new(),
            cf_batch: Vec::new(),
            cf_end: Vec::new(),
            cr_next: Vec::new(),
            cr_pos: Vec::new(),
            cr_credit_last: Vec::new(),
            cr_touched: Vec::new(),
            workers_left: vec![0; n as usize],
            ledger: Ledger::new(n),
            notify: ns(plan.profile.deepep.notify_host_roundtrip_ns),
            fwd_waiting_head: vec![false; (n * ch * P) as usize],
        };
        p.build(core);
        p
    }

    fn range(&self, c: u32) -> (u32, u32) {
        channel_range(self.tokens, self.ch, c)
    }

    #[inline]
    fn rc(&self, r: u32, c: u32) -> usize {
        (r * self.ch + c) as usize
    }
    #[inline]
    fn rcn(&self, r: u32, c: u32, m: u32) -> usize {
        self.rc(r, c) * self.nodes as usize + m as usize
    }
    #[inline]
    fn rcj(&self, r: u32, c: u32, j: u32) -> usize {
        self.rc(r, c) * P as usize + j as usize
    }
    #[inline]
    fn mask(&self, r: u32, t: u32, m: u32) -> u8 {
        self.masks[((r * self.tokens + t) * self.nodes + m) as usize]
    }
    #[inline]
    fn rank(&self, node: u32, local: u32) -> u32 {
        node * P + local
    }
    /// QP index for head credits: `channel + C`, wrapping onto the data QP when there are
    /// fewer QPs (docs/design.md, DeepEP §12).
    fn credit_qp(&self, c: u32) -> u32 {
        c + self.ch
    }

    fn build(&mut self, core: &mut Core) {
        let (n, ch, nodes) = (self.n, self.ch, self.nodes);
        let mut ranks = Vec::new();
        self.masks = vec![0; (n * self.tokens * nodes) as usize];
        for r in 0..n {
            for t in 0..self.tokens {
                self.routing.token_ranks(r, t, &mut ranks);
                for &d in &ranks {
                    let i = ((r * self.tokens + t) * nodes + d / P) as usize;
                    self.masks[i] |= 1 << (d % P);
                    // What each rank ends up holding: dispatch receives (r, t) at d; combine
                    // returns (d's partial of t) to r.
                    if self.dispatch {
                        self.ledger.expect(d, mix(r, t, 0));
                    }
                }
                if !self.dispatch {
                    self.ledger.expect(r, mix(r, t, 1));
                }
            }
        }
        // Ring lengths: tokens of (m, i) channel c for node m'.
        for r in 0..n {
            let (m, i) = (r / P, r % P);
            for c in 0..ch {
                let (lo, hi) = self.range(c);
                for t in lo..hi {
                    for m2 in 0..nodes {
                        let mk = self.mask(r, t, m2);
                        if mk == 0 {
                            continue;
                        }
                        let recv = self.rank(m2, i);
                        let x = self.rcn(r, c, m2);
                        self.total[x] += 1;
                        let y = self.rcn(recv, c, m);
                        self.rdma_expected[y] += 1;
                        for j in 0..P {
                            if mk & (1 << j) != 0 {
                                let z = self.rcj(self.rank(m2, j), c, i);
                                self.nvl_expected[z] += 1;
                            }
                        }
                    }
                }
            }
        }
        let rdma_cap = self.cfg.rdma_recv_rounded();
        let nvl_cap = self.cfg.num_max_nvl_chunked_recv_tokens;
        self.rdma = (0..n * ch * nodes).map(|_| ChannelRing::new(core, rdma_cap)).collect();
        self.nvl = if self.dispatch {
            (0..n * ch * P).map(|_| ChannelRing::new(core, nvl_cap)).collect()
        } else {
            // Combine: one part of `nvl_recv / R` slots per source node.
            let part = (nvl_cap / nodes).max(1);
            (0..n * ch * P * nodes).map(|_| ChannelRing::new(core, part)).collect()
        };
        self.meta_ctr = core.counters((n * ch) as usize);
        self.snd_next = (0..n * ch).map(|i| self.range(i % ch).0).collect();
        if !self.dispatch {
            self.build_combine();
        }
    }

    /// The dispatch RDMA stream rank (m, i) sends to node m2 on channel c: token indices.
    fn rdma_stream(&self, src: u32, c: u32, m2: u32) -> Vec<u32> {
        let (lo, hi) = self.range(c);
        (lo..hi).filter(|&t| self.mask(src, t, m2) != 0).collect()
    }

    /// Combine layout: per forwarder group (rank (m2, i), channel c, node m) the dispatch RDMA
    /// stream from (m, i), and per NVL ring (that forwarder, c, source local j, node m) the
    /// tokens of that stream that reached j, in the same order.
    fn build_combine(&mut self) {
        let (n, ch, nodes) = (self.n, self.ch, self.nodes);
        let nn = nodes as usize;
        self.cf_stream = vec![Vec::new(); (n * ch * nodes) as usize];
        self.csub_len = vec![0; (n * ch * P * nodes) as usize];
        for r2 in 0..n {
            let (m2, i) = (r2 / P, r2 % P);
            for c in 0..ch {
                for m in 0..nodes {
                    let src = self.rank(m, i);
                    let s = self.rdma_stream(src, c, m2);
                    for &t in &s {
                        let mk = self.mask(src, t, m2);
                        for j in 0..P {
                            if mk & (1 << j) != 0 {
                                let z = self.rcj(r2, c, j) * nn + m as usize;
                                self.csub_len[z] += 1;
                            }
                        }
                    }
                    let x = self.rcn(r2, c, m);
                    self.cf_stream[x] = s;
                }
            }
        }
        let subs = (n * ch * P * nodes) as usize;
        self.cs_next = vec![0; subs];
        self.cg_pos = vec![0; subs];
        self.cg_pub = vec![0; subs];
        self.cs_rr = (0..n * ch * P).map(|x| ((x / P) % ch) % nodes).collect();
        self.cs_busy = vec![false; (n * ch * P) as usize];
        self.cs_done = vec![false; (n * ch * P) as usize];
        self.cs_armed = vec![false; subs];
        self.cf_pos = vec![0; (n * ch * nodes) as usize];
        self.cf_batch = vec![0; (n * ch * nodes) as usize];
        self.cf_end = vec![0; (n * ch * nodes) as usize];
        self.cr_next = (0..n * ch).map(|i| self.range(i % ch).0).collect();
        self.cr_pos = vec![0; (n * ch * nodes) as usize];
        self.cr_credit_last = vec![0; (n * ch * nodes) as usize];
        self.cr_touched = vec![false; (n * ch) as usize];
    }
}

// Actor ids.
impl InternodeProgram {
    fn nrc(&self) -> u32 {
        self.n * self.ch
    }
    // Dispatch.
    fn a_send(&self, r: u32, c: u32) -> u32 {
        self.rc(r, c) as u32
    }
    fn a_fwd_done(&self, x: usize) -> u32 {
        self.nrc() * (1 + P) + x as u32
    }
    fn a_fwd_head(&self, x: usize) -> u32 {
        self.nrc() * (1 + 2 * P) + x as u32
    }
    fn a_fwd_node(&self, x: usize, m: u32) -> u32 {
        self.nrc() * (1 + 3 * P) + (x as u32) * self.nodes + m
    }
    fn a_nvl_recv(&self, x: usize) -> u32 {
        self.nrc() * (1 + 3 * P + P * self.nodes) + x as u32
    }
    // Combine.
    fn a_csend(&self, x: usize) -> u32 {
        x as u32
    }
    fn a_group(&self, x: usize) -> u32 {
        self.nrc() * P + x as u32
    }
    fn a_crecv(&self, x: usize) -> u32 {
        self.nrc() * (P + self.nodes) + x as u32
    }
    /// Combine NVL sender `x` waiting for the head of its part for node `m`.
    fn a_csend_head(&self, x: usize, m: u32) -> u32 {
        self.nrc() * (P + self.nodes + 1) + x as u32 * self.nodes + m
    }
    /// Above every other actor id of either op.
    fn a_rank_start(&self, r: u32) -> u32 {
        self.nrc() * (1 + 4 * P + P * self.nodes) + r
    }

    fn worker_done(&mut self, core: &mut Core, r: u32) {
        self.workers_left[r as usize] -= 1;
        self.ranks.touch(r, core.now);
        if self.workers_left[r as usize] == 0 {
            self.ranks.finish(r, core.now);
        }
    }

    /// Post an RDMA write of `bytes` followed by an atomic `tail += k` on the same QP.
    #[allow(clippy::too_many_arguments)]
    fn put_with_tail(
        &mut self,
        core: &mut Core,
        at: Time,
        src: u32,
        dst: u32,
        qp_idx: u32,
        bytes: u64,
        tail: Action,
    ) -> Time {
        let qp = core.job_qp(self.job, src, dst, qp_idx, self.me);
        core.post(qp, bytes as u32, false, Action::None, Action::None, self.me);
        core.post(qp, 0, true, tail, Action::None, self.me);
        let t = at + 2 * self.costs.wqe_post;
        core.ring(qp, t);
        t
    }

    /// Return credits: an atomic on the credit QP (or a local store on the same node).
    fn credit(&mut self, core: &mut Core, src: u32, dst: u32, c: u32, head: u32, delta: u32) {
        let act = Action::Add { counter: head, delta };
        let at = core.now + ns(COORD_POLL_NS) / 2;
        if src / P == dst / P {
            core.act_at(at + self.costs.flag, act);
        } else {
            let qp = core.job_qp(self.job, src, dst, self.credit_qp(c), self.me);
            core.post(qp, 0, true, act, Action::None, self.me);
            core.ring(qp, at + self.costs.wqe_post);
        }
    }
}

impl Program for InternodeProgram {
    fn num_ranks(&self) -> u32 {
        self.n
    }

    fn start_rank(&mut self, core: &mut Core, me: ProgId, r: u32, t: Time) {
        self.ranks.begin(r, t);
        core.wake_at(t, me, self.a_rank_start(r));
    }

    fn start(&mut self, _core: &mut Core, me: ProgId) {
        self.me = me;
        if self.dispatch {
            self.ranks.checks.push("internode dispatch: every (token, destination rank) arrives exactly once, via one RDMA write per node and NVLink forwarding".into());
            for r in 0..self.n {
                self.ranks.phase("notify", r, self.notify, self.n);
            }
        } else {
            self.ranks.checks.push("internode combine: every token reduced over its GPUs and nodes, in dispatch's layout".into());
        }
    }

    fn wake(&mut self, core: &mut Core, _me: ProgId, actor: u32) {
        let nrc = self.nrc();
        if actor >= self.a_rank_start(0) {
            let r = actor - self.a_rank_start(0);
            if self.dispatch {
                self.dispatch_rank(core, r);
            } else {
                self.combine_rank(core, r);
            }
            return;
        }
        if self.dispatch {
            if actor < nrc {
                self.sender(core, actor / self.ch, actor % self.ch);
            } else if actor < nrc * (1 + P) {
                self.forwarder(core, (actor - nrc) as usize);
            } else if actor < nrc * (1 + 2 * P) {
                self.forwarder_batch_done(core, (actor - nrc * (1 + P)) as usize);
            } else if actor < nrc * (1 + 3 * P) {
                let x = (actor - nrc * (1 + 2 * P)) as usize;
                self.fwd_waiting_head[x] = false;
                self.forwarder(core, x);
            } else if actor < nrc * (1 + 3 * P + P * self.nodes) {
                let k = (actor - nrc * (1 + 3 * P)) as usize;
                let (x, m) = (k / self.nodes as usize, k % self.nodes as usize);
                self.fwd_armed[x * self.nodes as usize + m] = false;
                self.forwarder(core, x);
            } else {
                self.nvl_receiver(core, (actor - nrc * (1 + 3 * P + P * self.nodes)) as usize);
            }
        } else if actor < nrc * P {
            self.cs_busy[actor as usize] = false;
            self.combine_sender(core, actor as usize);
        } else if actor < nrc * (P + self.nodes) {
            self.combine_group(core, (actor - nrc * P) as usize);
        } else if actor < nrc * (P + self.nodes + 1) {
            self.combine_receiver(core, (actor - nrc * (P + self.nodes)) as usize);
        } else {
            let k = (actor - nrc * (P + self.nodes + 1)) as usize;
            let x = k / self.nodes as usize;
            self.cs_armed[k] = false;
            self.combine_sender(core, x);
        }
    }

    fn is_done(&self) -> bool {
        self.ranks.left == 0
    }

    fn finish(&mut self, _core: &Core) -> OpSample {
        self.ledger.check(&mut self.ranks, "tokens");
        self.ranks.sample(&self.meta, 0.0)
    }

    fn spans(&self) -> Vec<(u32, u32, Time, Time)> {
        self.ranks.spans(&self.gpu, &self.global)
    }

    fn describe(&self, actor: u32) -> String {
        let nrc = self.nrc();
        let who = |x: usize, per: usize| {
            (x / per / self.ch as usize, (x / per) % self.ch as usize, x % per)
        };
        if self.dispatch {
            if actor < nrc {
                format!(
                    "internode dispatch rank {} channel {} RDMA sender",
                    actor / self.ch,
                    actor % self.ch
                )
            } else if actor < nrc * (1 + 3 * P) {
                let x = ((actor - nrc) % (nrc * P)) as usize;
                let (r, c, j) = who(x, P as usize);
                format!("internode dispatch rank {r} channel {c} forwarder to local GPU {j}")
            } else if actor < nrc * (1 + 3 * P + P * self.nodes) {
                let k = (actor - nrc * (1 + 3 * P)) as usize;
                let (r, c, j) = who(k / self.nodes as usize, P as usize);
                format!(
                    "internode dispatch rank {r} channel {c} forwarder to local GPU {j} (waiting for node {})",
                    k % self.nodes as usize
                )
            } else {
                let x = (actor - nrc * (1 + 3 * P + P * self.nodes)) as usize;
                let (r, c, i) = who(x, P as usize);
                format!("internode dispatch rank {r} channel {c} NVL receiver from local GPU {i}")
            }
        } else if actor < nrc * P {
            let (r, c, i) = who(actor as usize, P as usize);
            format!("internode combine rank {r} channel {c} NVL sender to local GPU {i}")
        } else if actor < nrc * (P + self.nodes) {
            let (r, c, m) = who((actor - nrc * P) as usize, self.nodes as usize);
            format!("internode combine rank {r} channel {c} forwarder group for node {m}")
        } else if actor < nrc * (P + self.nodes + 1) {
            let x = actor - nrc * (P + self.nodes);
            format!("internode combine rank {} channel {} RDMA receiver", x / self.ch, x % self.ch)
        } else {
            let k = (actor - nrc * (P + self.nodes + 1)) as usize;
            let (r, c, i) = who(k / self.nodes as usize, P as usize);
            format!(
                "internode combine rank {r} channel {c} NVL sender to local GPU {i} (waiting for the head of node {}'s part)",
                k % self.nodes as usize
            )
        }
    }
}
