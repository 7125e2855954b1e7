//! The world: the core plus the programs (op instances) running on it, the event loop, job
//! streams for concurrent sessions, and the end-of-run checks (byte conservation, deadlock).

use eptwin_engine::api::JobId;
use eptwin_engine::api::OpKind;
use eptwin_engine::api::OpSample;

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
    /// When each rank's kernel ended, by job rank, for a program whose ranks launch it right
    /// after their previous kernel on the same stream, with no barrier between (DeepEP's
    /// low-latency test); empty for every other program. See [`follow_lag_ns`].
    fn rank_ends(&self) -> Vec<Time> {
        Vec::new()
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
    let last = prev_ends.iter().copied().max().unwrap_or(0);
    let lag: Time = prev_ends.iter().map(|&e| last - e).sum();
    lag as f64 / prev_ends.len() as f64 / crate::core::time::PS_PER_NS as f64
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

pub struct World {
    pub core: Core,
    progs: Vec<Option<Box<dyn Program>>>,
    stream_of: Vec<Option<usize>>,
    streams: Vec<Stream>,
    pub samples: Vec<OpSample>,
    /// `Program::rank_ends` of each sample's program, in the same order.
    pub rank_ends: Vec<Vec<Time>>,
    finished: Vec<bool>,
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
            touched: Vec::new(),
        }
    }

    /// Register and set up a program (no rank started yet).
    fn spawn(&mut self, mut prog: Box<dyn Program>, stream: Option<usize>) -> ProgId {
        let id = self.progs.len() as ProgId;
        self.core.ensure_op(id);
        prog.start(&mut self.core, id);
        self.progs.push(Some(prog));
        self.stream_of.push(stream);
        self.finished.push(false);
        id
    }

    fn start_all(&mut self, p: ProgId, t: Time) {
        let prog = self.progs[p as usize].as_mut().expect("live program");
        for r in 0..prog.num_ranks() {
            prog.start_rank(&mut self.core, p, r, t);
        }
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
        let p = self.spawn(prog, None);
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
        let prog = factory(&mut self.core, job, op, iteration, warmup);
        Some(self.spawn(prog, Some(s)))
    }

    fn run(&mut self, factory: &mut Factory) -> Result<(), RunError> {
        self.drain_all(factory);
        while let Some((t, ev)) = self.core.queue.pop() {
            if t < self.core.now {
                self.core.violation(format!(
                    "monotone time: popped {} after {}",
                    fmt_us(t),
                    fmt_us(self.core.now)
                ));
            }
            self.core.now = t;
            if t > MAX_SIM_TIME {
                return Err(RunError::Timeout(format!(
                    "simulated time passed {} with work outstanding; {}",
                    fmt_us(MAX_SIM_TIME),
                    self.stuck_report()
                )));
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
        if self.finished.iter().any(|f| !f) {
            return Err(RunError::Deadlock(self.stuck_report()));
        }
        self.end_checks()?;
        Ok(())
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
        let ends = prog.rank_ends();
        if let Some(s) = self.stream_of[p as usize] {
            let st = &mut self.streams[s];
            sample.latency_ns += follow_lag_ns(&st.prev_ends, &ends);
            st.prev_ends = ends.clone();
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
        let mut lines = Vec::new();
        for (p, a, c, value, th) in self.core.stuck_waiters().into_iter().take(12) {
            let who = self.progs[p as usize]
                .as_ref()
                .map_or_else(|| format!("program {p} actor {a}"), |x| x.describe(a));
            lines.push(format!("{who} waits for counter {c} to reach {th} (at {value})"));
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
        format!("deadlock at {}: {}", fmt_us(self.core.now), lines.join("; "))
    }

    fn end_checks(&mut self) -> Result<(), RunError> {
        // Byte conservation: every RDMA payload byte sent was delivered, every copy completed,
        // every message completed, no packet left anywhere.
        for (p, ob) in self.core.op_bytes.iter().enumerate() {
            if ob.rdma_payload != ob.rdma_delivered {
                self.core.violations.push(format!(
                    "byte conservation: op {p} sent {} RDMA payload bytes, {} delivered",
                    ob.rdma_payload, ob.rdma_delivered
                ));
            }
            if ob.copies_issued != ob.copies_done {
                self.core.violations.push(format!(
                    "byte conservation: op {p} issued {} copy bytes, {} completed",
                    ob.copies_issued, ob.copies_done
                ));
            }
        }
        if self.core.net.pkts.live() != 0 || self.core.net.msgs.live() != 0 {
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
