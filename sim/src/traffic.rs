//! Background traffic jobs (`[job.traffic]`): all-to-all, ring or incast RDMA writes (or NVLink
//! copies to peers in the NVLink domain unless `rdma_only`), spread over `qps_per_peer` QPs per
//! peer, posted like a verbs application: never more than `NVSHMEM_QP_DEPTH` work requests
//! outstanding per QP, refilled as completions arrive. One round is one `transfer` op; a rank's
//! time is until its writes completed and everything addressed to it arrived.

use eptwin_engine::api::OpSample;
use eptwin_engine::api::{JobId, Rank};
use eptwin_engine::api::{OpKind, PeerPath, Plan, TrafficJob, TrafficPattern};

use crate::core::time::{Rate, Time};
use crate::core::world::Program;
use crate::core::{Action, Core, ProgId};
use crate::jobs::path_kind;

/// Default message size when `message_bytes` is not given.
pub const DEFAULT_MESSAGE_BYTES: u64 = 1 << 20;
/// WQEs a posting warp builds in parallel (one per lane).
const POST_LANES: u64 = 32;

struct Flow {
    src: u32,
    dst: u32,
    qp: u32,
    /// Messages still to post, and their size (the last may be shorter).
    remaining: u64,
    msg_bytes: u64,
    last_bytes: u64,
    outstanding: u32,
    queued: bool,
}

pub struct TrafficProgram {
    job: JobId,
    iteration: u32,
    warmup: u32,
    is_warmup: bool,
    spec: TrafficJob,
    n: u32,
    flows: Vec<Flow>,
    /// Per rank: flows it owns (indices), flows left, messages it expects, end time.
    rank_flows: Vec<Vec<u32>>,
    flows_left: Vec<u32>,
    expect_recv: Vec<u64>,
    recv_ctr: u32,
    poster_free: Vec<Time>,
    /// Flows with room for more posts, per rank, and whether the poster is scheduled.
    refill: Vec<Vec<u32>>,
    poster_scheduled: Vec<bool>,
    rank_end: Vec<Option<Time>>,
    ranks_left: u32,
    start: Time,
    depth: u32,
    /// (source, destination, bytes, path) of every pair that sends: n·(n−1) for all-to-all,
    /// n for a ring, n−1 for incast — paths are looked up for these pairs only.
    demands: Vec<(u32, u32, u64, PeerPath)>,
    plan_ranks: Vec<Rank>,
}

impl TrafficProgram {
    pub fn new(plan: &Plan, job: JobId, iteration: u32, warmup: bool) -> TrafficProgram {
        let j = plan.job(job);
        let spec = j.traffic().expect("a traffic job").clone();
        let n = j.num_ranks();
        let demands = demands(&spec, &j.ranks)
            .into_iter()
            .map(|(a, b, bytes)| {
                let path = plan.topology.rank_path(j.ranks[a as usize], j.ranks[b as usize]);
                (a, b, bytes, path)
            })
            .collect();
        TrafficProgram {
            job,
            iteration,
            warmup: iteration,
            is_warmup: warmup,
            spec,
            n,
            flows: Vec::new(),
            rank_flows: vec![Vec::new(); n as usize],
            flows_left: vec![0; n as usize],
            expect_recv: vec![0; n as usize],
            recv_ctr: 0,
            poster_free: vec![0; n as usize],
            refill: vec![Vec::new(); n as usize],
            poster_scheduled: vec![false; n as usize],
            rank_end: vec![None; n as usize],
            ranks_left: n,
            start: 0,
            depth: j.nvshmem.qp_depth,
            demands,
            plan_ranks: j.ranks.clone(),
        }
    }

    fn rank_done(&mut self, r: u32, core: &Core) {
        if self.flows_left[r as usize] == 0
            && core.value(self.recv_ctr + r) >= self.expect_recv[r as usize]
            && self.rank_end[r as usize].is_none()
        {
            self.rank_end[r as usize] = Some(core.now);
            self.ranks_left -= 1;
        }
    }

    /// Post as many messages as the QP depth allows on the given flows of rank `r`: one warp
    /// builds up to 32 WQEs in parallel, then rings each QP's doorbell.
    fn post_rank(&mut self, core: &mut Core, me: ProgId, r: u32, flows: &[u32]) {
        let now = core.now;
        let mut t = self.poster_free[r as usize].max(now);
        let mut posts = 0u64;
        let mut qps = Vec::new();
        for &f in flows {
            let flow = &mut self.flows[f as usize];
            flow.queued = false;
            let room = self.depth.saturating_sub(flow.outstanding) as u64;
            let k = room.min(flow.remaining);
            if k == 0 {
                continue;
            }
            posts += k;
            qps.push(flow.qp);
            for _ in 0..k {
                let bytes = if flow.remaining == 1 { flow.last_bytes } else { flow.msg_bytes };
                flow.remaining -= 1;
                flow.outstanding += 1;
                let remote = Action::Add { counter: self.recv_ctr + flow.dst, delta: 1 };
                let local = Action::Wake { prog: me, actor: f };
                core.post(flow.qp, bytes as u32, false, remote, local, me);
            }
        }
        t += core.params.wqe_post * posts.div_ceil(POST_LANES);
        for qp in qps {
            core.ring(qp, t);
        }
        self.poster_free[r as usize] = t;
    }
}

/// (source, destination, bytes) of every pair of a job's ranks (indices into `ranks`) that
/// sends in a round.
fn demands(spec: &TrafficJob, ranks: &[Rank]) -> Vec<(u32, u32, u64)> {
    let n = ranks.len() as u32;
    let total = spec.bytes_per_rank;
    let mut out = Vec::new();
    match spec.pattern {
        TrafficPattern::AllToAll => {
            if n > 1 {
                for a in 0..n {
                    for b in 0..n {
                        if a != b {
                            out.push((a, b, total / (n as u64 - 1)));
                        }
                    }
                }
            }
        }
        TrafficPattern::Ring => {
            if n > 1 {
                for a in 0..n {
                    out.push((a, (a + 1) % n, total));
                }
            }
        }
        TrafficPattern::Incast => {
            // `incast_target` is a global rank of the job (the validator checks it).
            let global = spec.incast_target.unwrap_or(ranks[0]).0;
            let target = ranks.iter().position(|r| r.0 == global).unwrap_or(0) as u32;
            for a in 0..n {
                if a != target {
                    out.push((a, target, total));
                }
            }
        }
    }
    out
}

impl Program for TrafficProgram {
    fn start(&mut self, core: &mut Core, me: ProgId) {
        self.start = core.now;
        self.recv_ctr = core.counters(self.n as usize);
        let msg_cap = self.spec.message_bytes.unwrap_or(DEFAULT_MESSAGE_BYTES).max(1);
        let qps = self.spec.qps_per_peer.max(1) as u64;
        let job = self.job.index();
        let nvl_rate = core.params.nvl_rate;
        let _ = nvl_rate;
        let demands = std::mem::take(&mut self.demands);
        let mut nvl_copies = Vec::new();
        for &(a, b, bytes, path) in &demands {
            let rdma = self.spec.rdma_only || path == PeerPath::Rdma;
            let msgs = bytes.div_ceil(msg_cap).max(1);
            self.expect_recv[b as usize] += msgs;
            if !rdma {
                nvl_copies.push((a, b, bytes, msgs, path));
                continue;
            }
            // Spread the messages over the QPs to this peer.
            for q in 0..qps.min(msgs) {
                let count = msgs / qps + u64::from(q < msgs % qps);
                let first = q * (msgs / qps) + q.min(msgs % qps);
                let last_is_mine = first + count == msgs;
                let last_bytes = if last_is_mine { bytes - (msgs - 1) * msg_cap } else { msg_cap };
                let qp = core.job_qp(job, a, b, q as u32, me);
                let f = self.flows.len() as u32;
                self.flows.push(Flow {
                    src: a,
                    dst: b,
                    qp,
                    remaining: count,
                    msg_bytes: msg_cap,
                    last_bytes,
                    outstanding: 0,
                    queued: false,
                });
                self.rank_flows[a as usize].push(f);
                self.flows_left[a as usize] += 1;
            }
        }
        self.demands = demands;
        // NVLink (or local) peers: chunked copies, issued back to back.
        for (a, b, bytes, msgs, path) in nvl_copies {
            let (ga, gb) = (core.jobs[job].gpu[a as usize], core.jobs[job].gpu[b as usize]);
            let mut left = bytes;
            for _ in 0..msgs {
                let chunk = left.min(msg_cap);
                left -= chunk;
                let done = Action::Add { counter: self.recv_ctr + b, delta: 1 };
                core.copy(
                    core.now,
                    ga,
                    gb,
                    path_kind(path),
                    chunk,
                    Rate::from_gbps(1e6),
                    done,
                    me,
                    true,
                );
            }
        }
        for r in 0..self.n {
            let ctr = self.recv_ctr + r;
            let need = self.expect_recv[r as usize];
            // Actor ids past the flows: rank r's receive side.
            if !core.wait(ctr, need, me, self.flows.len() as u32 + r) {
                continue;
            }
            self.rank_done(r, core);
        }
    }

    fn num_ranks(&self) -> u32 {
        self.n
    }

    fn start_rank(&mut self, core: &mut Core, me: ProgId, r: u32, t: Time) {
        // The rank's poster posts every flow's first window.
        let flows = self.rank_flows[r as usize].clone();
        for &f in &flows {
            self.flows[f as usize].queued = true;
        }
        self.refill[r as usize] = flows;
        self.poster_scheduled[r as usize] = true;
        self.poster_free[r as usize] = t;
        let nflows = self.flows.len() as u32;
        core.wake_at(t, me, nflows + self.n + r);
    }

    fn wake(&mut self, core: &mut Core, me: ProgId, actor: u32) {
        let nflows = self.flows.len() as u32;
        if actor >= nflows + self.n {
            // The poster: refill every flow that completed work since it last ran.
            let r = actor - nflows - self.n;
            self.poster_scheduled[r as usize] = false;
            let flows = std::mem::take(&mut self.refill[r as usize]);
            self.post_rank(core, me, r, &flows);
            return;
        }
        if actor >= nflows {
            self.rank_done(actor - nflows, core);
            return;
        }
        let f = &mut self.flows[actor as usize];
        f.outstanding -= 1;
        let src = f.src;
        if f.remaining == 0 && f.outstanding == 0 {
            self.flows_left[src as usize] -= 1;
            self.rank_done(src, core);
        } else if f.remaining > 0 && !f.queued {
            // Room on this QP: queue the flow for the poster, which batches every refill that
            // arrives while it is busy.
            f.queued = true;
            let src = src as usize;
            self.refill[src].push(actor);
            if !self.poster_scheduled[src] {
                self.poster_scheduled[src] = true;
                let t = self.poster_free[src].max(core.now);
                core.wake_at(t, me, nflows + self.n + src as u32);
            }
        }
    }

    fn is_done(&self) -> bool {
        self.ranks_left == 0
    }

    fn finish(&mut self, _core: &Core) -> OpSample {
        let n = self.n.max(1) as f64;
        let mean = self
            .rank_end
            .iter()
            .map(|e| (e.unwrap_or(self.start) - self.start) as f64)
            .sum::<f64>()
            / n;
        let mut s =
            OpSample::new(self.job, OpKind::Transfer, self.iteration, self.is_warmup, mean / 1e3);
        s.checks.push("traffic: every message delivered and completed".into());
        let _ = self.warmup;
        s
    }

    /// A background job is a verbs application: a failed QP's error completion ends it at
    /// once (no DeepEP timeout applies).
    fn stalled(
        &mut self,
        core: &mut Core,
        _me: ProgId,
        stuck: &[crate::core::world::Stuck],
        _down: &[u32],
    ) -> Result<(), crate::core::world::Trap> {
        let who = stuck.first().map_or_else(|| "a flow".to_string(), |w| self.describe(w.actor));
        Err(crate::core::world::Trap {
            at: stuck.iter().map(|w| w.since).max().unwrap_or(core.now),
            message: format!("background traffic cannot complete: {who} never gets its data"),
        })
    }

    fn describe(&self, actor: u32) -> String {
        let nflows = self.flows.len() as u32;
        if actor >= nflows {
            let r = actor - nflows;
            return format!(
                "traffic job {} rank {} (receive side)",
                self.job.0, self.plan_ranks[r as usize]
            );
        }
        let f = &self.flows[actor as usize];
        format!(
            "traffic job {} flow rank {} -> {} ({} messages left, {} outstanding)",
            self.job.0,
            self.plan_ranks[f.src as usize],
            self.plan_ranks[f.dst as usize],
            f.remaining,
            f.outstanding
        )
    }
}
