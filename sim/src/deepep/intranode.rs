//! Normal intranode kernels (`intranode.cu`, docs/design.md, DeepEP §8): `C = num_sms / 2`
//! channels, each a sender block and a receiver block; tokens split into C contiguous ranges.
//! Dispatch: per (channel, destination) the sender's warps push chunks of ≤ `nvl_send` tokens into
//! the ring buffer on the destination (`nvl_recv` slots), waiting until `nvl_send` slots are free,
//! and publish the tail after the data; the receiver copies what the tail shows into `recv_x` and
//! publishes the head back. Each token goes once per destination rank. Combine mirrors it: each
//! rank pushes the tokens it received back to their source, whose receiver waits for every
//! rank a token visited and reduces.
//!
//! Timing follows `test_intranode.py` (`bench`, CUDA events with a cached layout): launch +
//! the cached-notify barrier + the kernel, per rank, averaged.

use eptwin_engine::api::OpSample;
use eptwin_engine::api::{
    Config, OpKind, Plan, RoutingTable, channel_range, normal_combine_token_bytes,
    normal_dispatch_token_bytes,
};

use super::{GpuCosts, ipc_path};
use crate::core::time::{Rate, Time};
use crate::core::world::Program;
use crate::core::{Action, Core, ProgId};
use crate::gpu::PathKind;
use crate::programs::channel_ring::ChannelRing;
use crate::programs::{Ledger, Meta, Ranks, deepep_job};
use eptwin_engine::api::mix;

/// Threads per block of the intranode kernels (768 = 24 warps).
const WARPS_PER_BLOCK: u32 = 24;

pub struct IntranodeProgram {
    meta: Meta,
    me: ProgId,
    dispatch: bool,
    n: u32,
    channels: u32,
    tokens: u32,
    /// Bytes per token in the ring, and bytes the receiver writes per token.
    tok_bytes: u64,
    out_bytes: u64,
    chunk: u32,
    paths: Vec<PathKind>,
    gpu: Vec<u32>,
    /// Global rank of each job rank (trace tracks).
    global: Vec<u32>,
    costs: GpuCosts,
    ranks: Ranks,
    routing: RoutingTable,
    /// Rings per (channel, producer, consumer).
    rings: Vec<ChannelRing>,
    /// Sender streams per (producer, channel, consumer): token ids in order, position.
    streams: Vec<Vec<u32>>,
    pos: Vec<u32>,
    /// Dispatch receivers per (consumer, channel, producer): expected tokens, batch in copy.
    expected: Vec<u32>,
    batch: Vec<u32>,
    /// Combine receivers per (rank, channel): next token index in the channel range.
    next: Vec<u32>,
    touched: Vec<Vec<(u32, u32)>>,
    /// Per rank: workers still running; identity hash and count of what arrived.
    workers_left: Vec<u32>,
    ledger: Ledger,
    send_rate: Rate,
    recv_rate: Rate,
}

impl IntranodeProgram {
    pub fn new(plan: &Plan, core: &mut Core, meta: Meta) -> IntranodeProgram {
        let d = deepep_job(plan, meta.job);
        let w = &d.workload;
        let n = plan.job(meta.job).num_ranks();
        let dispatch = meta.op == OpKind::Dispatch;
        let cfg: Config = if dispatch { d.dispatch_config } else { d.combine_config }
            .expect("normal mode has a resolved Config");
        let channels = cfg.num_channels().max(1);
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
        // Sender warps split evenly over the peers; the receiver's likewise (dispatch) or
        // all on the reduction (combine).
        let wpr = (WARPS_PER_BLOCK / n).max(1);
        let group = |warps: u32| {
            let per_warp = costs.warp.slower(costs.sm.shared(WARPS_PER_BLOCK));
            Rate::from_gbps(per_warp.gbps() * warps as f64)
        };
        let mut p = IntranodeProgram {
            meta,
            me: 0,
            dispatch,
            n,
            channels,
            tokens: w.tokens_per_rank,
            tok_bytes,
            out_bytes,
            chunk: cfg.num_max_nvl_chunked_send_tokens.max(1),
            paths,
            gpu: core.jobs[meta.job.index()].gpu.clone(),
            global: core.jobs[meta.job.index()].ranks.iter().map(|r| r.0).collect(),
            costs,
            ranks: Ranks::new(n),
            routing: d.routing().clone(),
            rings: Vec::new(),
            streams: Vec::new(),
            pos: Vec::new(),
            expected: Vec::new(),
            batch: Vec::new(),
            next: Vec::new(),
            touched: Vec::new(),
            workers_left: vec![0; n as usize],
            ledger: Ledger::new(n),
            send_rate: group(wpr),
            recv_rate: if dispatch { group(wpr) } else { group(WARPS_PER_BLOCK) },
        };
        for _ in 0..channels * n * n {
            p.rings.push(ChannelRing::new(core, cfg.num_max_nvl_chunked_recv_tokens));
        }
        p.build_streams();
        p
    }

    fn range(&self, c: u32) -> (u32, u32) {
        channel_range(self.tokens, self.channels, c)
    }

    #[inline]
    fn ring(&self, c: u32, src: u32, dst: u32) -> usize {
        ((c * self.n + src) * self.n + dst) as usize
    }

    #[inline]
    fn stream(&self, src: u32, c: u32, dst: u32) -> usize {
        ((src * self.channels + c) * self.n + dst) as usize
    }

    fn build_streams(&mut self) {
        let (n, ch) = (self.n, self.channels);
        self.streams = vec![Vec::new(); (n * ch * n) as usize];
        let mut ranks = Vec::new();
        for r in 0..n {
            for c in 0..ch {
                let (lo, hi) = self.range(c);
                for t in lo..hi {
                    self.routing.token_ranks(r, t, &mut ranks);
                    for &d in &ranks {
                        // Dispatch: r sends t to d. Combine: d sends t back to r.
                        let s =
                            if self.dispatch { self.stream(r, c, d) } else { self.stream(d, c, r) };
                        self.streams[s].push(t);
                        if self.dispatch {
                            self.ledger.expect(d, mix(r, t, 0));
                        } else {
                            self.ledger.expect(r, mix(d, t, 0));
                        }
                    }
                }
            }
        }
        self.pos = vec![0; self.streams.len()];
        if self.dispatch {
            // Receiver (consumer d, channel c, producer r) expects r's stream to d.
            self.expected = vec![0; (n * ch * n) as usize];
            for r in 0..n {
                for c in 0..ch {
                    for d in 0..n {
                        let len = self.streams[self.stream(r, c, d)].len() as u32;
                        self.expected[((d * ch + c) * n + r) as usize] = len;
                    }
                }
            }
            self.batch = vec![0; (n * ch * n) as usize];
        } else {
            self.next = (0..n * ch).map(|i| self.range(i % ch).0).collect();
            self.touched = vec![Vec::new(); (n * ch) as usize];
        }
    }

    // Actor ids: senders (src, c, dst), then receivers.
    fn a_recv(&self, i: u32) -> u32 {
        self.n * self.channels * self.n + i
    }

    fn worker_done(&mut self, core: &mut Core, r: u32) {
        self.workers_left[r as usize] -= 1;
        self.ranks.touch(r, core.now);
        if self.workers_left[r as usize] == 0 {
            self.ranks.finish(r, core.now);
        }
    }

    /// Sender (src, c, dst): next chunk once `chunk` slots are free on the destination.
    fn send(&mut self, core: &mut Core, src: u32, c: u32, dst: u32) {
        let s = self.stream(src, c, dst);
        let actor = s as u32;
        let len = self.streams[s].len() as u32;
        let pos = self.pos[s];
        if pos >= len {
            self.pos[s] = u32::MAX; // done once
            if pos != u32::MAX {
                self.worker_done(core, src);
            }
            return;
        }
        let ri = self.ring(c, src, dst);
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
        let at = core.now + self.costs.per_token * k as u64;
        let tail = Action::Add { counter: self.rings[ri].tail, delta: k };
        let path = self.paths[(src * self.n + dst) as usize];
        let free = core.copy(
            at,
            self.gpu[src as usize],
            self.gpu[dst as usize],
            path,
            k as u64 * self.tok_bytes,
            self.send_rate,
            tail,
            self.me,
            src != dst,
        );
        core.wake_at(free, self.me, actor);
    }

    /// Dispatch receiver (dst, c, src): copy out what the tail shows, then publish the head.
    fn recv(&mut self, core: &mut Core, dst: u32, c: u32, src: u32) {
        let i = ((dst * self.channels + c) * self.n + src) as usize;
        let actor = self.a_recv(i as u32);
        let ri = self.ring(c, src, dst);
        let batch = self.batch[i];
        if batch > 0 {
            // The copy finished: free the slots (the head store reaches the sender over NVLink).
            self.batch[i] = 0;
            let head = Action::Add { counter: self.rings[ri].head, delta: batch };
            core.act_at(core.now + self.costs.flag, head);
        }
        let expected = self.expected[i] as u64;
        if self.rings[ri].popped >= expected {
            if self.expected[i] != u32::MAX {
                self.expected[i] = u32::MAX;
                self.worker_done(core, dst);
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
        self.batch[i] = avail;
        let g = self.gpu[dst as usize];
        let bytes = avail as u64 * self.out_bytes;
        let end = core.copy(
            core.now,
            g,
            g,
            PathKind::Local,
            bytes,
            self.recv_rate,
            Action::None,
            self.me,
            false,
        );
        core.wake_at(end, self.me, actor);
    }

    /// Combine receiver (r, c): reduce tokens in order while every rank each visited has
    /// delivered it; publish the heads after each batch.
    fn combine_recv(&mut self, core: &mut Core, r: u32, c: u32) {
        let i = (r * self.channels + c) as usize;
        let actor = self.a_recv(i as u32);
        for (src, k) in std::mem::take(&mut self.touched[i]) {
            let ri = self.ring(c, src, r);
            let head = Action::Add { counter: self.rings[ri].head, delta: k };
            core.act_at(core.now + self.costs.flag, head);
        }
        let (_, hi) = self.range(c);
        let mut t = self.next[i];
        if t >= hi {
            if t != u32::MAX {
                self.next[i] = u32::MAX;
                self.worker_done(core, r);
            }
            return;
        }
        let mut srcs = Vec::new();
        let mut bytes = 0u64;
        let mut touched: Vec<(u32, u32)> = Vec::new();
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
                if touched.is_empty() {
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
                self.ledger.arrive(r, mix(d, t, 0));
                match touched.iter_mut().find(|(s, _)| *s == d) {
                    Some(e) => e.1 += 1,
                    None => touched.push((d, 1)),
                }
            }
            // Read every partial, write the reduced BF16 row.
            bytes += srcs.len() as u64 * self.tok_bytes + self.out_bytes;
            t += 1;
        }
        self.next[i] = t;
        self.touched[i] = touched;
        let g = self.gpu[r as usize];
        let end = core.copy(
            core.now,
            g,
            g,
            PathKind::Local,
            bytes,
            self.recv_rate,
            Action::None,
            self.me,
            false,
        );
        core.wake_at(end.max(core.now + 1), self.me, actor);
    }
}

impl Program for IntranodeProgram {
    fn num_ranks(&self) -> u32 {
        self.n
    }

    fn start_rank(&mut self, core: &mut Core, me: ProgId, r: u32, t: Time) {
        self.ranks.begin(r, t);
        // CUDA-event timing includes the launch and the cached-notify barrier.
        let t0 = t + self.costs.launch + self.costs.flag;
        let (n, ch) = (self.n, self.channels);
        self.workers_left[r as usize] = ch * n + if self.dispatch { ch * n } else { ch };
        for c in 0..ch {
            for d in 0..n {
                core.wake_at(t0, me, self.stream(r, c, d) as u32);
                if self.dispatch {
                    core.wake_at(t0, me, self.a_recv((r * ch + c) * n + d));
                }
            }
            if !self.dispatch {
                core.wake_at(t0, me, self.a_recv(r * ch + c));
            }
        }
    }

    fn start(&mut self, _core: &mut Core, me: ProgId) {
        self.me = me;
        self.ranks.checks.push(if self.dispatch {
            "intranode dispatch: every (token, destination rank) arrives exactly once".into()
        } else {
            "intranode combine: every token reduced from each rank it visited, in order".into()
        });
    }

    fn wake(&mut self, core: &mut Core, _me: ProgId, actor: u32) {
        let (n, ch) = (self.n, self.channels);
        let senders = n * ch * n;
        if actor < senders {
            let (src, rest) = (actor / (ch * n), actor % (ch * n));
            self.send(core, src, rest / n, rest % n);
            return;
        }
        let i = actor - senders;
        if self.dispatch {
            let (dst, rest) = (i / (ch * n), i % (ch * n));
            self.recv(core, dst, rest / n, rest % n);
        } else {
            self.combine_recv(core, i / ch, i % ch);
        }
    }

    fn is_done(&self) -> bool {
        self.ranks.left == 0
    }

    fn finish(&mut self, _core: &Core) -> OpSample {
        self.ledger.check(&mut self.ranks, "(token, rank) pairs");
        self.ranks.sample(&self.meta, 0.0)
    }

    fn spans(&self) -> Vec<(u32, u32, Time, Time)> {
        self.ranks.spans(&self.gpu, &self.global)
    }

    fn describe(&self, actor: u32) -> String {
        let (n, ch) = (self.n, self.channels);
        let senders = n * ch * n;
        let op = if self.dispatch { "dispatch" } else { "combine" };
        if actor < senders {
            let (src, rest) = (actor / (ch * n), actor % (ch * n));
            format!("intranode {op} rank {src} channel {} sender to rank {}", rest / n, rest % n)
        } else if self.dispatch {
            let i = actor - senders;
            let (dst, rest) = (i / (ch * n), i % (ch * n));
            format!(
                "intranode dispatch rank {dst} channel {} receiver from rank {}",
                rest / n,
                rest % n
            )
        } else {
            let i = actor - senders;
            format!("intranode combine rank {} channel {} receiver", i / ch, i % ch)
        }
    }
}
