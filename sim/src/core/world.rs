//! The world: the core plus the programs (op instances) running on it, the event loop, job
//! streams for concurrent sessions, and the end-of-run checks (byte conservation, deadlock).

use eptwin_engine::api::OpSample;
use eptwin_engine::api::{JobId, Rank};
use eptwin_engine::api::{LaunchKey, OpKind};

use crate::core::queue::EventQueue;
use crate::core::time::{Time, fmt_us};
use crate::core::{Core, ProgId};

/// An op instance running on the simulated machine: a DeepEP kernel (with its notify phase) or
/// a round of background traffic.
pub trait Program {
    /// Set up shared state (counters, rings); no rank runs yet.
    fn start(&mut self, core: &mut Core, me: ProgId);
    /// Start rank `r`'s kernel at `t` (≥ now).
    fn start_rank(&mut self, core: &mut Core, me: ProgId, r: u32, t: Time);
    fn num_ranks(&self) -> u32;
    /// An actor's wait is over (a counter reached its threshold, a delay elapsed).
    fn wake(&mut self, core: &mut Core, me: ProgId, actor: u32);
    fn is_done(&self) -> bool;
    /// The sample: latency, phases and checks (bytes and failures are added by the world).
    fn finish(&mut self, core: &Core) -> OpSample;
    /// What an actor is (for the deadlock report): "rank 3 channel 2 NVL receiver".
    fn describe(&self, actor: u32) -> String;
    /// Program-level state for the deadlock report (optional).
    fn stuck(&self) -> Vec<String> {
        Vec::new()
    }
    /// Per-rank kernel spans for the trace: (GPU, rank, start, end).
    fn spans(&self) -> Vec<(u32, u32, Time, Time)> {
        Vec::new()
    }
    /// Rank `r` does not launch this op (it is down): it never gets `start_rank`.
    fn skip_rank(&mut self, _core: &mut Core, _me: ProgId, _r: u32) {}
    /// When each rank's kernel ended, by job rank, for a program whose ranks launch it right
    /// after their previous kernel on the same stream, with no barrier between (DeepEP's
    /// low-latency test); empty for every other program. `Time::MAX` for a rank that did not
    /// run it (down, masked). See [`follow_lag_ns`].
    fn rank_ends(&self) -> Vec<Time> {
        Vec::new()
    }
    /// The machine went quiet with this program unfinished because of a fault (a rank down, a
    /// NIC down, a failed QP): what it waits for never comes. What DeepEP's kernels do once
    /// their spin-waits time out (docs/design.md, DeepEP §13): `Err` with DeepEP's message and
    /// the time the kernel traps, or `Ok` when shrink mode masked the silent ranks and the
    /// program goes on (its waiters woken by now). `stuck`: its waits; `down`: its ranks that
    /// were not started (down at the op's launch).
    fn stalled(
        &mut self,
        core: &mut Core,
        _me: ProgId,
        stuck: &[Stuck],
        down: &[u32],
    ) -> Result<(), Trap> {
        Err(device_trap(core, stuck, down, &|a| self.describe(a)))
    }
}

/// A wait still registered: `actor` of `prog` waits for `counter` (now at `value`) to reach
/// `threshold`, since about `since` (its op's start: a kernel's waits begin within
/// microseconds of it, against timeouts of seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stuck {
    pub prog: ProgId,
    pub actor: u32,
    pub counter: u32,
    pub value: u64,
    pub threshold: u64,
    pub since: Time,
}

/// A DeepEP timeout that ends the run: its message and when the kernel (or host) gives up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trap {
    pub at: Time,
    pub message: String,
}

/// The trap of a device spin-wait (`NUM_TIMEOUT_CYCLES`): the earliest of the stuck waits times
/// out first; `describe` names its actor.
pub fn device_trap(
    core: &Core,
    stuck: &[Stuck],
    down: &[u32],
    describe: &dyn Fn(u32) -> String,
) -> Trap {
    let faults = &core.faults;
    match stuck.iter().min_by_key(|w| (w.since, w.actor)) {
        Some(w) => Trap {
            at: w.since + faults.gpu_timeout,
            message: format!(
                "DeepEP timeout in {} (waits for counter {} to reach {}, at {}; {})",
                describe(w.actor),
                w.counter,
                w.threshold,
                w.value,
                faults.gpu_timeout_words()
            ),
        },
        None => Trap {
            at: core.now + faults.gpu_timeout,
            message: format!(
                "DeepEP timeout: the op cannot complete without job rank(s) {down:?}, which \
                 never launched it ({})",
                faults.gpu_timeout_words()
            ),
        },
    }
}

/// What a rank's back-to-back launch adds to an op's time, averaged over ranks: the op's ranks
/// start together in the model, but a rank that ended the previous op `max - end` before the
/// last one launched this kernel that much earlier and waits in it for the last rank's
/// messages. One step: the previous op's own ranks started together, so lags do not compound
/// over rounds. 0 unless both ops report `rank_ends` for the same ranks.
pub fn follow_lag_ns(prev_ends: &[Time], ends: &[Time]) -> f64 {
    if prev_ends.is_empty() || prev_ends.len() != ends.len() {
        return 0.0;
    }
    // A rank that did not run the previous op (down, masked) launches nothing after it.
    let ran = || prev_ends.iter().copied().filter(|&e| e != Time::MAX);
    let (Some(last), count) = (ran().max(), ran().count()) else { return 0.0 };
    let lag: Time = ran().map(|e| last - e).sum();
    lag as f64 / count as f64 / crate::core::time::PS_PER_NS as f64
}

/// Builds the program for one op of one job.
pub type Factory<'a> = dyn FnMut(&mut Core, JobId, OpKind, u32, bool) -> Box<dyn Program> + 'a;

struct Stream {
    job: JobId,
    ops: Vec<OpKind>,
    warmup: u32,
    /// Op instances to run in all (rounds × ops), and created so far.
    total: u32,
    created: u32,
    /// The previous op's `Program::rank_ends`.
    prev_ends: Vec<Time>,
}

/// How many events after the next one the loop fetches the records an event names itself
/// (a delivery's packet, QP and message; a counter; a doorbell's QP): one event ahead is
/// too late to cover a miss to memory.
const DEEP_PREFETCH: usize = 3;

/// Limits that turn a runaway simulation into an error instead of a hang.
pub const MAX_SIM_TIME: Time = 120 * 1_000_000_000_000; // 120 s simulated
/// The limit with faults, which wait out DeepEP's ≈ 100 s timeouts and seconds-long ACK
/// timeouts: below 2^48 ps (281 s), where packed times end (`MsgSend`, `CreditReturn`).
pub const MAX_FAULT_SIM_TIME: Time = 250 * 1_000_000_000_000;

pub struct World {
    pub core: Core,
    progs: Vec<Option<Box<dyn Program>>>,
    stream_of: Vec<Option<usize>>,
    streams: Vec<Stream>,
    pub samples: Vec<OpSample>,
    /// `Program::rank_ends` of each sample's program, in the same order.
    pub rank_ends: Vec<Vec<Time>>,
    finished: Vec<bool>,
    /// Per program: its job and which launch it is (stragglers' delays are drawn for it).
    launch: Vec<Option<(JobId, LaunchKey)>>,
    /// Per program: its ranks that were down at its launch and never started it.
    down: Vec<Vec<u32>>,
    /// Per program: when its ranks were started.
    started_at: Vec<Time>,
    /// The launch `run_one` starts (set by the caller; none: no straggler delays).
    pub next_launch: Option<LaunchKey>,
    /// With faults: the `Program::rank_ends` of the op before the one `run_one` starts.
    pub prev_ends: Vec<Time>,
    /// With faults, per program: what its ranks waited in the kernel for the last one's
    /// previous op, averaged (ns), when the previous op reported its ends.
    waited_ns: Vec<Option<f64>>,
    /// Programs woken in the current drain (reused: no allocation per event).
    touched: Vec<ProgId>,
}

#[derive(Debug)]
pub enum RunError {
    Deadlock(String),
    Timeout(String),
    Invariant(String),
}

impl World {
    pub fn new(core: Core) -> World {
        World {
            core,
            progs: Vec::new(),
            stream_of: Vec::new(),
            streams: Vec::new(),
            samples: Vec::new(),
            rank_ends: Vec::new(),
            finished: Vec::new(),
            launch: Vec::new(),
            down: Vec::new(),
            started_at: Vec::new(),
            next_launch: None,
            prev_ends: Vec::new(),
            waited_ns: Vec::new(),
            touched: Vec::new(),
        }
    }

    /// Register and set up a program (no rank started yet), the launch `launch` of `job`.
    fn spawn(
        &mut self,
        mut prog: Box<dyn Program>,
        stream: Option<usize>,
        launch: Option<(JobId, LaunchKey)>,
    ) -> ProgId {
        let id = self.progs.len() as ProgId;
        self.core.ensure_op(id);
        prog.start(&mut self.core, id);
        self.progs.push(Some(prog));
        self.stream_of.push(stream);
        self.finished.push(false);
        self.launch.push(launch);
        self.down.push(Vec::new());
        self.started_at.push(self.core.now);
        self.waited_ns.push(None);
        id
    }

    /// Start every rank of program `p` at `t`. With faults, a rank that is down does not
    /// start, and a straggler starts `delay` after `t`, the op's common start (docs/design.md,
    /// "Faults"). The back-to-back lag of [`follow_lag_ns`] (a rank that ended its previous
    /// op early launched early and waits in the kernel) applies to the ranks that launch on
    /// time: a straggler is not in the kernel before `t`.
    fn start_all(&mut self, p: ProgId, t: Time) {
        self.started_at[p as usize] = t;
        let prog = self.progs[p as usize].as_mut().expect("live program");
        let launch = self.launch[p as usize].filter(|_| !self.core.faults.faults.is_empty());
        let Some((job, key)) = launch else {
            for r in 0..prog.num_ranks() {
                prog.start_rank(&mut self.core, p, r, t);
            }
            return;
        };
        let prev = match self.stream_of[p as usize] {
            Some(s) => &self.streams[s].prev_ends,
            None => &self.prev_ends,
        };
        let ran = |e: &&Time| **e != Time::MAX;
        let last = prev.iter().filter(ran).max().copied();
        let (mut waited, count) = (0, prev.iter().filter(ran).count());
        for r in 0..prog.num_ranks() {
            let rank: Rank = self.core.jobs[job.index()].ranks[r as usize];
            let delay = self.core.faults.start_delay(rank, key);
            let lag = match (last, prev.get(r as usize)) {
                (Some(last), Some(&end)) if end != Time::MAX => last - end,
                _ => 0,
            };
            if self.core.faults.rank_down(rank, t + delay) {
                self.down[p as usize].push(r);
                prog.skip_rank(&mut self.core, p, r);
            } else {
                waited += if delay == 0 { lag } else { 0 };
                prog.start_rank(&mut self.core, p, r, t + delay);
            }
        }
        let per_rank_ns = waited as f64 / count.max(1) as f64 / crate::core::time::PS_PER_NS as f64;
        self.waited_ns[p as usize] = (count > 0).then_some(per_rank_ns);
    }

    /// Run one op to completion, all ranks starting now.
    pub fn run_one(
        &mut self,
        factory: &mut Factory,
        job: JobId,
        op: OpKind,
        iteration: u32,
        warmup: bool,
    ) -> Result<(), RunError> {
        let prog = factory(&mut self.core, job, op, iteration, warmup);
        let launch = self.next_launch.map(|key| (job, key));
        let p = self.spawn(prog, None, launch);
        self.start_all(p, self.core.now);
        self.run(factory)
    }

    /// Run every stream (job) back to back, all starting now: (job, ops, warmup rounds,
    /// measured rounds). Each op of a stream starts on all its ranks when the previous one
    /// ended on all of them (docs/design.md: "Jobs start together").
    pub fn run_streams(
        &mut self,
        factory: &mut Factory,
        streams: &[(JobId, Vec<OpKind>, u32, u32)],
    ) -> Result<(), RunError> {
        for (job, ops, warmup, iterations) in streams {
            if ops.is_empty() || warmup + iterations == 0 {
                continue;
            }
            self.streams.push(Stream {
                job: *job,
                ops: ops.clone(),
                warmup: *warmup,
                total: (warmup + iterations) * ops.len() as u32,
                created: 0,
                prev_ends: Vec::new(),
            });
        }
        for s in 0..self.streams.len() {
            if let Some(p) = self.create_stream_op(factory, s) {
                self.start_all(p, self.core.now);
            }
        }
        self.run(factory)
    }

    /// Create the stream's next op instance, if it has one left.
    fn create_stream_op(&mut self, factory: &mut Factory, s: usize) -> Option<ProgId> {
        let st = &mut self.streams[s];
        if st.created >= st.total {
            return None;
        }
        let k = st.created;
        st.created += 1;
        let n_ops = st.ops.len() as u32;
        let (round, op) = (k / n_ops, st.ops[(k % n_ops) as usize]);
        let warmup = round < st.warmup;
        let iteration = if warmup { round } else { round - st.warmup };
        let job = st.job;
        // Rounds count from the stream's start, warmup rounds first.
        let key = LaunchKey { job: job.0, round: round as u64, op_index: k % n_ops };
        let prog = factory(&mut self.core, job, op, iteration, warmup);
        Some(self.spawn(prog, Some(s), Some((job, key))))
    }

    fn run(&mut self, factory: &mut Factory) -> Result<(), RunError> {
        loop {
            self.drain_all(factory);
            self.run_events(factory)?;
            // Nothing else to do but a QP's ACK timer (packets lost): the clock jumps to it.
            // Also after the ops ended: what they sent still gets through (or its QP fails).
            if let Some(due) = self.core.rc_timer_due() {
                self.check_time(due)?;
                self.core.now = self.core.now.max(due);
                self.core.fire_rc_timers();
                continue;
            }
            if self.finished.iter().all(|f| *f) {
                break;
            }
            if !self.core.faults.can_stall() {
                return Err(RunError::Deadlock(self.stuck_report()));
            }
            // Quiet, with ops waiting for what a fault keeps from coming: DeepEP's timeouts.
            self.time_out()?;
            if self.core.pending_wakes.is_empty() && self.core.queue.is_empty() {
                return Err(RunError::Deadlock(self.stuck_report()));
            }
        }
        self.end_checks()?;
        Ok(())
    }

    /// Every event until the queue is empty.
    fn run_events(&mut self, factory: &mut Factory) -> Result<(), RunError> {
        // Faults are fixed for the machine's life: the limit is read once, not per event.
        let limit = self.time_limit();
        while let Some((t, ev)) = self.core.queue.pop() {
            if t < self.core.now {
                self.core.violation(format!(
                    "monotone time: popped {} after {}",
                    fmt_us(t),
                    fmt_us(self.core.now)
                ));
            }
            self.core.now = t;
            if t > limit {
                return Err(self.timeout(limit));
            }
            // No effect on any result: the next events' cold records are fetched now, in two
            // steps (a port's queue head two events ahead, what it names one event ahead).
            if let Some(&next) = self.core.queue.peek_current() {
                self.core.prefetch_near(next);
            }
            if let Some(&after) = self.core.queue.peek_current2() {
                self.core.prefetch_far(after);
            }
            if let Some(&deep) = self.core.queue.peek_current_at(DEEP_PREFETCH) {
                self.core.prefetch_deep(deep);
            }
            self.core.handle(ev);
            if !self.core.pending_wakes.is_empty() {
                self.drain_all(factory);
            }
        }
        Ok(())
    }

    /// A runaway simulation is an error, not a hang: the clock may not pass the limit.
    fn check_time(&self, t: Time) -> Result<(), RunError> {
        let limit = self.time_limit();
        if t <= limit {
            return Ok(());
        }
        Err(self.timeout(limit))
    }

    /// The simulated time a run may not pass.
    fn time_limit(&self) -> Time {
        if self.core.faults.faults.is_empty() { MAX_SIM_TIME } else { MAX_FAULT_SIM_TIME }
    }

    /// The error of a run whose clock passed `limit`.
    #[cold]
    #[inline(never)]
    fn timeout(&self, limit: Time) -> RunError {
        RunError::Timeout(format!(
            "simulated time passed {} with work outstanding at {}: {}",
            fmt_us(limit),
            fmt_us(self.core.now),
            self.waiting()
        ))
    }

    /// The machine is quiet with ops unfinished because of a fault: every stuck wait times out
    /// (the clock jumps there: nothing is simulated in between). Each op traps with DeepEP's
    /// message, or masks the silent ranks (shrink mode) and goes on.
    #[cold]
    fn time_out(&mut self) -> Result<(), RunError> {
        let stuck = self.stuck();
        let timeout = self.core.faults.gpu_timeout;
        let latest = stuck.iter().map(|w| w.since).max().unwrap_or(self.core.now);
        let fire = self.core.now.max(latest + timeout);
        // Shrink mode would go on waiting past the model's clock: stop with what waits.
        self.check_time(fire)?;
        self.core.now = fire;
        let mut traps = Vec::new();
        for p in 0..self.progs.len() {
            if self.finished[p] {
                continue;
            }
            let Some(prog) = self.progs[p].as_mut() else { continue };
            let mine: Vec<Stuck> = stuck.iter().filter(|w| w.prog as usize == p).copied().collect();
            let down = self.down[p].clone();
            if let Err(trap) = prog.stalled(&mut self.core, p as ProgId, &mine, &down) {
                let down_global: Vec<Rank> = match self.launch[p] {
                    Some((job, _)) => down
                        .iter()
                        .map(|&r| self.core.jobs[job.index()].ranks[r as usize])
                        .collect(),
                    None => Vec::new(),
                };
                traps.push((trap, down_global));
            }
        }
        let Some((trap, down)) = traps.into_iter().min_by_key(|(t, _)| t.at) else {
            return Ok(());
        };
        let faults = &self.core.faults;
        let mut causes = faults.causes(&down);
        causes.extend(self.core.failed_qps());
        Err(RunError::Timeout(format!(
            "{}; it gives up at {} (simulated; no time was simulated while it waited); cause: {}",
            trap.message,
            faults.run_time_words(trap.at),
            if causes.is_empty() { "none found".to_string() } else { causes.join("; ") }
        )))
    }

    /// Run pending wakes (in the order they were raised) and finish programs that completed.
    fn drain_all(&mut self, factory: &mut Factory) {
        let mut touched = std::mem::take(&mut self.touched);
        loop {
            let mut i = 0;
            while i < self.core.pending_wakes.len() {
                let (p, actor) = self.core.pending_wakes[i];
                i += 1;
                if let Some(prog) = self.progs[p as usize].as_mut() {
                    prog.wake(&mut self.core, p, actor);
                    if !touched.contains(&p) {
                        touched.push(p);
                    }
                }
            }
            self.core.pending_wakes.clear();
            for &p in &touched {
                self.check_finished(factory, p);
            }
            touched.clear();
            if self.core.pending_wakes.is_empty() {
                break;
            }
        }
        self.touched = touched;
    }

    fn check_finished(&mut self, factory: &mut Factory, p: ProgId) {
        let done = self.progs[p as usize].as_ref().is_some_and(|x| x.is_done());
        if !done || self.finished[p as usize] {
            return;
        }
        self.finish_program(factory, p);
    }

    /// Once per op: kept out of line so that the per-event loop above stays small.
    #[cold]
    #[inline(never)]
    fn finish_program(&mut self, factory: &mut Factory, p: ProgId) {
        self.finished[p as usize] = true;
        let mut prog = self.progs[p as usize].take().expect("live program");
        let mut sample = prog.finish(&self.core);
        if let Some(tr) = self.core.trace.as_mut() {
            use crate::trace::PID_GPU;
            let name =
                format!("{} (job {}, iteration {})", sample.op, sample.job.0, sample.iteration);
            for (gpu, rank, start, end) in prog.spans() {
                tr.name_process(PID_GPU + gpu, &format!("GPU {gpu}"));
                tr.name_thread(PID_GPU + gpu, rank, &format!("rank {rank} kernels"));
                tr.span(PID_GPU + gpu, rank, &name, start, end, crate::trace::SpanArgs::None);
            }
        }
        let ob = self.core.op_bytes[p as usize];
        sample.nvlink_bytes = ob.nvlink;
        sample.rdma_bytes = ob.rdma_payload;
        sample.wire_bytes = ob.wire;
        for (q, f) in &self.core.failures {
            if *q == p {
                sample.failures.push(f.clone());
            }
        }
        if let Some((job, _)) = self.launch[p as usize] {
            let n = self.core.jobs[job.index()].n();
            let ranks = &self.core.jobs[job.index()].ranks;
            sample.masked_ranks = self
                .core
                .faults
                .masked_ranks(job.index(), n)
                .into_iter()
                .map(|r| ranks[r as usize].0)
                .collect();
        }
        let ends = prog.rank_ends();
        let waited = self.waited_ns[p as usize].filter(|_| !ends.is_empty());
        if let Some(s) = self.stream_of[p as usize] {
            let st = &mut self.streams[s];
            sample.latency_ns += match waited {
                Some(ns) => ns,
                None if self.core.faults.faults.is_empty() => follow_lag_ns(&st.prev_ends, &ends),
                None => 0.0,
            };
            st.prev_ends = ends.clone();
        } else if let Some(ns) = waited {
            sample.latency_ns += ns;
        }
        self.samples.push(sample);
        self.rank_ends.push(ends);
        if let Some(s) = self.stream_of[p as usize]
            && let Some(q) = self.create_stream_op(factory, s)
        {
            self.start_all(q, self.core.now);
        }
    }

    /// What waits for what, when the run cannot finish.
    pub fn stuck_report(&self) -> String {
        format!("deadlock at {}: {}", fmt_us(self.core.now), self.waiting())
    }

    /// The waits still registered.
    fn stuck(&self) -> Vec<Stuck> {
        let waits = self.core.stuck_waiters().into_iter();
        waits
            .map(|(prog, actor, counter, value, threshold)| {
                let since = self.started_at.get(prog as usize).copied().unwrap_or(0);
                Stuck { prog, actor, counter, value, threshold, since }
            })
            .collect()
    }

    /// What waits for what, and the ports with traffic they cannot send.
    fn waiting(&self) -> String {
        let mut lines = Vec::new();
        for w in self.stuck().into_iter().take(12) {
            let (p, a) = (w.prog, w.actor);
            let who = self.progs[p as usize]
                .as_ref()
                .map_or_else(|| format!("program {p} actor {a}"), |x| x.describe(a));
            lines.push(format!(
                "{who} waits for counter {} to reach {} (at {})",
                w.counter, w.threshold, w.value
            ));
        }
        for prog in self.progs.iter().flatten() {
            lines.extend(prog.stuck().into_iter().take(6));
        }
        let net = &self.core.net;
        let mut stalled = 0;
        for (i, port) in net.ports.iter().enumerate() {
            if port.nonempty != 0 && stalled < 6 {
                stalled += 1;
                let lanes: Vec<String> = (0..15)
                    .filter(|l| port.nonempty & (1 << l) != 0)
                    .map(|l| {
                        let why = if net.unschedulable & (1 << l) != 0 {
                            "not in any VL arbitration table"
                        } else {
                            "waiting for credits"
                        };
                        let credits = net.lanes[net.li(i, l)].credits;
                        format!("VL{l} ({why}, {credits} credits)")
                    })
                    .collect();
                lines.push(format!(
                    "{} has queued traffic on {}",
                    net.port_names[i],
                    lanes.join(", ")
                ));
            }
        }
        if lines.is_empty() {
            lines.push("no waiter registered (a program never finished)".into());
        }
        lines.join("; ")
    }

    fn end_checks(&mut self) -> Result<(), RunError> {
        // Byte conservation: every RDMA payload byte sent was delivered, every copy completed,
        // every message completed, no packet left anywhere.
        for (p, ob) in self.core.op_bytes.iter().enumerate() {
            // Under loss a byte may be sent several times and dropped on the way (counted apart).
            if ob.rdma_payload + ob.rdma_resent != ob.rdma_delivered + ob.rdma_discarded {
                self.core.violations.push(format!(
                    "byte conservation: op {p} sent {} RDMA payload bytes (+{} again), {} \
                     delivered (+{} dropped)",
                    ob.rdma_payload, ob.rdma_resent, ob.rdma_delivered, ob.rdma_discarded
                ));
            }
            if ob.copies_issued != ob.copies_done {
                self.core.violations.push(format!(
                    "byte conservation: op {p} issued {} copy bytes, {} completed",
                    ob.copies_issued, ob.copies_done
                ));
            }
        }
        // A failed QP's messages never complete (hardware flushes them with an error).
        let flushed = self.core.messages_on_failed_qps();
        if self.core.net.pkts.live() != 0 || self.core.net.msgs.live() != flushed {
            self.core.violations.push(format!(
                "conservation: {} packets and {} messages still in the fabric at the end",
                self.core.net.pkts.live(),
                self.core.net.msgs.live()
            ));
        }
        if !self.core.violations.is_empty() {
            return Err(RunError::Invariant(self.core.violations.join("; ")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use eptwin_engine::api::JobId;

    use super::*;
    use crate::core::time::PS_PER_US;

    /// Rank `r` waits for counter `base + r`; only even ranks' counters are ever bumped.
    struct Waiter {
        base: u32,
        n: u32,
        done: u32,
    }

    impl Program for Waiter {
        fn start(&mut self, core: &mut Core, _me: ProgId) {
            self.base = core.counters(self.n as usize);
        }
        fn start_rank(&mut self, core: &mut Core, me: ProgId, r: u32, t: Time) {
            if !core.wait(self.base + r, 1, me, r) {
                if r.is_multiple_of(2) {
                    core.act_at(
                        t + PS_PER_US,
                        crate::core::Action::Add { counter: self.base + r, delta: 1 },
                    );
                }
            } else {
                self.done += 1;
            }
        }
        fn num_ranks(&self) -> u32 {
            self.n
        }
        fn wake(&mut self, _core: &mut Core, _me: ProgId, _actor: u32) {
            self.done += 1;
        }
        fn is_done(&self) -> bool {
            self.done == self.n
        }
        fn finish(&mut self, _core: &Core) -> OpSample {
            OpSample::new(JobId(0), OpKind::Barrier, 0, false, 0.0)
        }
        fn describe(&self, actor: u32) -> String {
            format!("waiter rank {actor}")
        }
    }

    fn world() -> World {
        let text = "schema = 1\nname = \"w\"\n[cluster]\nprofile = \"h800-cx7\"\nnodes = 1\n[[job]]\nname = \"t\"\n[job.traffic]\npattern = \"ring\"\nbytes_per_rank = 1024\n";
        let loaded = eptwin_engine::parse("w", text).expect("parse");
        let plan = eptwin_engine::Plan::build(&loaded).expect("plan");
        crate::build_world(&plan, false)
    }

    #[test]
    fn deadlock_is_an_error_naming_the_waiters() {
        let mut w = world();
        let mut factory =
            |_: &mut Core, _: JobId, _: OpKind, _: u32, _: bool| -> Box<dyn Program> {
                Box::new(Waiter { base: 0, n: 4, done: 0 })
            };
        match w.run_one(&mut factory, JobId(0), OpKind::Barrier, 0, false) {
            Err(RunError::Deadlock(msg)) => {
                assert!(msg.contains("waiter rank 1 waits for counter"), "{msg}");
                assert!(msg.contains("waiter rank 3"), "{msg}");
                assert!(!msg.contains("waiter rank 0"), "{msg}");
            }
            other => panic!("expected a deadlock, got {other:?}"),
        }
    }

    #[test]
    fn stream_ops_start_when_the_previous_ended_on_every_rank() {
        // Rank r takes (r + 1) us: the slow rank paces the stream, the fast one waits for it.
        type Starts = std::rc::Rc<std::cell::RefCell<Vec<(u32, Time)>>>;
        struct Quick(u32, Starts);
        impl Program for Quick {
            fn start(&mut self, _core: &mut Core, _me: ProgId) {}
            fn start_rank(&mut self, core: &mut Core, me: ProgId, r: u32, t: Time) {
                self.1.borrow_mut().push((r, t));
                core.wake_at(t + (r as Time + 1) * PS_PER_US, me, r);
            }
            fn num_ranks(&self) -> u32 {
                2
            }
            fn wake(&mut self, _core: &mut Core, _me: ProgId, _r: u32) {
                self.0 += 1;
            }
            fn is_done(&self) -> bool {
                self.0 == 2
            }
            fn finish(&mut self, core: &Core) -> OpSample {
                OpSample::new(JobId(0), OpKind::Barrier, 0, false, core.now as f64 / 1e3)
            }
            fn describe(&self, _actor: u32) -> String {
                String::new()
            }
        }
        let starts = Starts::default();
        let mut w = world();
        let mut factory =
            |_: &mut Core, _: JobId, _: OpKind, _: u32, _: bool| -> Box<dyn Program> {
                Box::new(Quick(0, starts.clone()))
            };
        w.run_streams(&mut factory, &[(JobId(0), vec![OpKind::Barrier], 0, 3)]).expect("run");
        let ends: Vec<f64> = w.samples.iter().map(|s| s.latency_ns / 1e3).collect();
        assert_eq!(ends, vec![2.0, 4.0, 6.0]);
        let us = PS_PER_US;
        assert_eq!(
            *starts.borrow(),
            vec![(0, 0), (1, 0), (0, 2 * us), (1, 2 * us), (0, 4 * us), (1, 4 * us)]
        );
    }
}
