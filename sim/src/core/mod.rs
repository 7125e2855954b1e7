//! The simulation core: simulated clock, event queue, counters and the actions that complete
//! work. Every model (fabric, NICs, GPUs) is an `impl Core` block in its own module over the
//! flat state here; programs (DeepEP algorithms, traffic) drive it through a small API.
//!
//! Events are a 16-byte enum (with the 16-byte key a queue entry is 32 bytes, the size
//! docs/design.md, fabric §10 measured as fast); all state lives in `Vec`s indexed by `u32` ids.

pub mod counters;
pub mod faults;
pub mod queue;
pub mod ring;
pub mod slab;
pub mod time;
pub mod world;

use std::fmt::Write as _;

use crate::core::counters::{Counters, Waiter};
use crate::core::queue::{CalendarQueue, EventQueue, HeapQueue, Queue, RadixQueue};
use crate::core::time::{Time, fmt_us};
use crate::gpu::Gpus;
use crate::net::Net;
use crate::params::Params;
use crate::trace::Trace;

/// Program (op instance) index.
pub type ProgId = u16;

/// What happens when a piece of work completes: bump a counter (and wake its waiters) or wake
/// one actor of a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Action {
    #[default]
    None,
    Add {
        counter: u32,
        delta: u32,
    },
    Wake {
        prog: ProgId,
        actor: u32,
    },
}

#[derive(Debug, Clone, Copy)]
pub enum Ev {
    // 16 bytes (checked by a test): a calendar entry is 24 bytes with its time.
    /// An output port finished serializing its packet.
    PortDone(u32),
    /// A port blocked on credits re-checks them (the earliest pending credit return is due).
    PortWake(u32),
    /// A packet sent by port `from` reached the switch at its far end (head, plus the
    /// switching latency); it carries what forwarding needs, so a hop never reads the packet.
    SwitchArrive {
        from: u32,
        pkt: u32,
        dst: u32,
        wire: u16,
        /// The lane, with [`crate::net::LAST_HOP`] set when the switch delivers to the NIC.
        lane: u8,
    },
    /// A packet that completes something at a NIC (last packet of a message, ACK) is in.
    NicDeliver {
        pkt: u32,
        /// The packet's QP and message (an ACK's first acknowledged one): the loop fetches
        /// their records ahead without reading the packet first.
        qp: u32,
        msg: u32,
    },
    /// A doorbell reached the NIC: the QP's WQEs up to `upto` may be fetched.
    Doorbell {
        qp: u32,
        upto: u32,
    },
    /// The QP's next WQE finished NIC processing: it may send.
    QpReady(u32),
    /// An NVLink/PCIe transfer's data starts leaving its source: reserve the far side.
    Stage2(u32),
    Act(Action),
}

/// Per-op (program) byte accounting.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpBytes {
    pub nvlink: u64,
    pub rdma_payload: u64,
    pub wire: u64,
    pub rdma_delivered: u64,
    pub copies_issued: u64,
    pub copies_done: u64,
    /// Under packet loss: payload sent again (go-back-N, timeouts), and payload the responder
    /// dropped (lost, out of sequence, duplicate); `rdma_payload` counts each byte once.
    pub rdma_resent: u64,
    pub rdma_discarded: u64,
}

pub struct Core {
    pub now: Time,
    pub queue: Queue<Ev>,
    pub params: Params,
    pub net: Net,
    pub gpus: Gpus,
    pub counters: Counters,
    pub op_bytes: Vec<OpBytes>,
    /// Model bugs found by the invariant checks (coordinates + time). Any entry fails the run.
    pub violations: Vec<String>,
    /// Correctness failures of the simulated software per program (e.g. a QP overrun).
    pub failures: Vec<(ProgId, String)>,
    /// Wakes produced while handling an event, run by the world loop right after it.
    pub pending_wakes: Vec<(ProgId, u32)>,
    pub events: u64,
    /// Events handled per kind (PortDone, PortWake, SwitchArrive, NicDeliver, Doorbell,
    /// QpReady, Stage2, Act), for benchmarks and profiling.
    pub events_by_kind: [u64; 8],
    pub trace: Option<Trace>,
    pub jobs: Vec<crate::jobs::JobRt>,
    /// Lanes found starved by the arbitration monitor (fail every op of the run).
    pub starvations: Vec<String>,
    /// The run's faults on this machine (none on a healthy cluster).
    pub faults: crate::core::faults::FaultRt,
    /// An IBGDA message completes when it executes (no ACK event; [`Core::early_completion`]).
    /// Set only for a single op on its own machine, untraced, without faults.
    pub early_acks: bool,
    /// With `early_acks`: an IBGDA QP got more posts than its depth, where the time of its
    /// completions matters to the depth check: the machine must run again without them.
    pub early_acks_overrun: bool,
}

const MAX_VIOLATIONS: usize = 64;

/// Hint the CPU to bring the cache line holding `x` closer (no effect on any result).
#[inline(always)]
pub fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and has no architectural effect; the
    // address comes from a live reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (x as *const T).cast(),
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// Hint the CPU to bring element `i` of `v` closer, without a bounds check: the address is
/// computed with wrapping arithmetic and never dereferenced, and a prefetch of any address is
/// harmless (no effect on any result).
#[inline(always)]
pub fn prefetch_at<T>(v: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and has no architectural effect, so
    // the address (possibly outside `v`) is never accessed.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            v.as_ptr().wrapping_add(i).cast(),
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (v, i);
}

impl Core {
    pub fn new(params: Params, net: Net, gpus: Gpus, trace: bool) -> Core {
        Core {
            now: 0,
            queue: Queue::Calendar(CalendarQueue::new()),
            params,
            net,
            gpus,
            counters: Counters::default(),
            op_bytes: Vec::new(),
            violations: Vec::new(),
            failures: Vec::new(),
            pending_wakes: Vec::new(),
            events: 0,
            events_by_kind: [0; 8],
            trace: trace.then(Trace::default),
            jobs: Vec::new(),
            starvations: Vec::new(),
            faults: crate::core::faults::FaultRt::default(),
            early_acks: false,
            early_acks_overrun: false,
        }
    }

    /// Use the binary-heap baseline queue (benchmarks compare the two in the same run).
    pub fn use_binary_heap(&mut self) {
        assert!(self.queue.is_empty(), "switch queues before the run");
        self.queue = Queue::Heap(HeapQueue::default());
    }

    /// Use the radix heap instead of the calendar queue (benchmarks).
    pub fn use_radix_heap(&mut self) {
        assert!(self.queue.is_empty(), "switch queues before the run");
        self.queue = Queue::Radix(RadixQueue::new());
    }

    #[inline(always)]
    pub fn push(&mut self, t: Time, ev: Ev) {
        if t < self.now {
            self.past_event(t, ev);
        }
        self.queue.push(t.max(self.now), ev);
    }

    #[cold]
    #[inline(never)]
    fn past_event(&mut self, t: Time, ev: Ev) {
        self.violation(format!(
            "monotone time: event {ev:?} scheduled at {} before now {}",
            fmt_us(t),
            fmt_us(self.now)
        ));
    }

    /// Record a broken invariant (a model bug) with its coordinates.
    pub fn violation(&mut self, what: String) {
        if self.violations.len() < MAX_VIOLATIONS {
            let mut s = String::new();
            let _ = write!(s, "t={}: {what}", fmt_us(self.now));
            self.violations.push(s);
        }
    }

    /// Record a correctness failure of the simulated software (reported in the op's sample).
    pub fn fail(&mut self, prog: ProgId, what: String) {
        let n = self.failures.iter().filter(|(p, _)| *p == prog).count();
        if n < 16 {
            self.failures.push((prog, format!("t={}: {what}", fmt_us(self.now))));
        }
    }

    /// Record a starved lane (docs/design.md, fabric §1.1: under `high_limit = 255` low lanes can
    /// starve).
    pub fn starvation(&mut self, what: String) {
        let msg = format!("t={}: {what}", fmt_us(self.now));
        self.starvations.push(msg);
    }

    pub fn ensure_op(&mut self, prog: ProgId) {
        if self.op_bytes.len() <= prog as usize {
            self.op_bytes.resize(prog as usize + 1, OpBytes::default());
        }
    }

    // ---- counters -------------------------------------------------------------------------

    /// Allocate `n` counters (zero); returns the first id.
    pub fn counters(&mut self, n: usize) -> u32 {
        self.counters.alloc(n)
    }

    #[inline]
    pub fn value(&self, c: u32) -> u64 {
        self.counters.values[c as usize]
    }

    /// Add to a counter now and wake the waiters it satisfies.
    #[inline]
    pub fn add(&mut self, c: u32, delta: u32) {
        let ctrs = &mut self.counters;
        let v = &mut ctrs.values[c as usize];
        *v += delta as u64;
        let v = *v;
        if ctrs.is_waited(c as usize) {
            let wakes = &mut self.pending_wakes;
            ctrs.satisfy(c as usize, v, |w| wakes.push((w.prog, w.actor)));
        }
    }

    /// Wait until counter `c` reaches `threshold`: `true` if it already has (no wake will come),
    /// otherwise the actor is woken when it does.
    pub fn wait(&mut self, c: u32, threshold: u64, prog: ProgId, actor: u32) -> bool {
        if self.counters.values[c as usize] >= threshold {
            return true;
        }
        self.counters.push(c as usize, Waiter { threshold, actor, prog });
        false
    }

    /// Run an action now.
    #[inline]
    pub fn act(&mut self, a: Action) {
        match a {
            Action::None => {}
            Action::Add { counter, delta } => self.add(counter, delta),
            Action::Wake { prog, actor } => self.pending_wakes.push((prog, actor)),
        }
    }

    /// Run an action at `t` (now if `t <= now`, without an event).
    #[inline]
    pub fn act_at(&mut self, t: Time, a: Action) {
        if a == Action::None {
            return;
        }
        if t <= self.now {
            self.act(a);
        } else {
            self.push(t, Ev::Act(a));
        }
    }

    pub fn wake_at(&mut self, t: Time, prog: ProgId, actor: u32) {
        self.act_at(t, Action::Wake { prog, actor });
    }

    /// Handle one event (the world loop pops it); wakes land in `pending_wakes`.
    #[inline(always)]
    pub fn handle(&mut self, ev: Ev) {
        self.events += 1;
        // Switch hops (over half the events) are tested first, by a conditional branch,
        // before the jump table takes the rest.
        if let Ev::SwitchArrive { from, pkt, dst, wire, lane } = ev {
            self.switch_arrive(from, pkt, dst, wire as u32, lane & !crate::net::LAST_HOP);
            self.events_by_kind[2] += 1;
            return;
        }
        let kind = match ev {
            Ev::PortDone(p) => {
                self.port_done(p);
                0
            }
            Ev::PortWake(p) => {
                self.port_wake(p);
                1
            }
            Ev::SwitchArrive { .. } => unreachable!("switch hops are handled above"),
            Ev::NicDeliver { pkt, .. } => {
                self.nic_deliver(pkt);
                3
            }
            Ev::Doorbell { qp, upto } => {
                self.doorbell_arrive(qp, upto);
                4
            }
            Ev::QpReady(qp) => {
                self.qp_ready(qp);
                5
            }
            Ev::Stage2(x) => {
                self.stage2(x);
                6
            }
            Ev::Act(a) => {
                self.act(a);
                7
            }
        };
        self.events_by_kind[kind] += 1;
    }

    /// Waiters still registered (for the deadlock report).
    pub fn stuck_waiters(&self) -> Vec<(ProgId, u32, u32, u64, u64)> {
        let mut out = Vec::new();
        let ctrs = &self.counters;
        for i in 0..ctrs.values.len() {
            for w in ctrs.waiters_of(i) {
                out.push((w.prog, w.actor, i as u32, ctrs.values[i], w.threshold));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hot records keep the sizes the layout relies on.
    #[test]
    fn hot_record_sizes() {
        assert_eq!(std::mem::size_of::<Ev>(), 16);
        assert_eq!(std::mem::size_of::<crate::net::Port>(), 64);
        assert_eq!(std::mem::size_of::<crate::net::QEntry>(), 16);
        assert_eq!(std::mem::size_of::<crate::net::Lane>(), 40);
        assert_eq!(std::mem::size_of::<crate::net::CreditReturn>(), 8);
        assert_eq!(std::mem::size_of::<crate::net::nic::QpTx>(), 32);
        assert_eq!(std::mem::size_of::<crate::net::nic::Qp>(), 64);
        assert_eq!(std::mem::size_of::<crate::net::Pkt>(), 16);
        assert_eq!(std::mem::size_of::<crate::net::nic::MsgSend>(), 16);
        assert_eq!(std::mem::size_of::<crate::net::nic::MsgDone>(), 16);
    }
}
