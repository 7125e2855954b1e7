//! The simulation core: simulated clock, event queue, counters and the actions that complete
//! work. Every model (fabric, NICs, GPUs) is an `impl Core` block in its own module over the
//! flat state here; programs (DeepEP algorithms, traffic) drive it through a small API.
//!
//! Events are a 16-byte enum (with the 16-byte key a queue entry is 32 bytes, the size
//! docs/design.md, fabric §10 measured as fast); all state lives in `Vec`s indexed by `u32` ids.

pub mod queue;
pub mod ring;
pub mod slab;
pub mod time;
pub mod world;

use std::fmt::Write as _;

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

/// The counters other work waits on (ring-buffer tails, credit heads, flags): values apart
/// from the waiter lists, which few counters have at a time, so bumping a counter touches 8
/// bytes and a bit. A counter takes 12 bytes and a bit; each registered waiter a 24-byte node.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub values: Vec<u64>,
    /// Per counter whose `waited` bit is set: its newest waiter's node in `nodes`.
    newest: Vec<u32>,
    /// Waiter nodes, each linked to the one registered before it on the same counter.
    nodes: crate::core::slab::Slab<Waiter>,
    /// Bit per counter: its waiter list is non-empty.
    waited: Vec<u64>,
    /// A counter's waiters in registration order while a bump looks at them (reused).
    scratch: Vec<(ProgId, u32, u64)>,
}

/// A registered waiter: the actor woken when the counter reaches `threshold`.
#[derive(Debug, Clone, Copy)]
struct Waiter {
    threshold: u64,
    actor: u32,
    /// The waiter registered before it on the same counter (NONE: the oldest).
    older: u32,
    prog: ProgId,
}

impl Counters {
    /// Counter `c`'s waiters, oldest first, into `out` (the nodes are freed).
    fn take_waiters(&mut self, c: usize, out: &mut Vec<(ProgId, u32, u64)>) {
        out.clear();
        let mut n = self.newest[c];
        while n != crate::core::slab::NONE {
            let w = self.nodes[n];
            out.push((w.prog, w.actor, w.threshold));
            self.nodes.remove(n);
            n = w.older;
        }
        out.reverse();
    }

    /// Register `list` (oldest first) as counter `c`'s waiters; an empty list clears its bit.
    fn put_waiters(&mut self, c: usize, list: &[(ProgId, u32, u64)]) {
        let mut newest = crate::core::slab::NONE;
        for &(prog, actor, threshold) in list {
            newest = self.nodes.insert(Waiter { threshold, actor, older: newest, prog });
        }
        self.newest[c] = newest;
        if list.is_empty() {
            self.waited[c / 64] &= !(1 << (c % 64));
        }
    }

    /// Counter `c`'s waiters, oldest first (for the deadlock report).
    fn waiters_of(&self, c: usize) -> Vec<(ProgId, u32, u64)> {
        let mut out = Vec::new();
        if self.waited[c / 64] & (1 << (c % 64)) == 0 {
            return out;
        }
        let mut n = self.newest[c];
        while n != crate::core::slab::NONE {
            let w = self.nodes[n];
            out.push((w.prog, w.actor, w.threshold));
            n = w.older;
        }
        out.reverse();
        out
    }
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
        let ctrs = &mut self.counters;
        let first = ctrs.values.len() as u32;
        ctrs.values.resize(ctrs.values.len() + n, 0);
        ctrs.newest.resize(ctrs.values.len(), crate::core::slab::NONE);
        ctrs.waited.resize(ctrs.values.len().div_ceil(64), 0);
        first
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
        let (w, bit) = (c as usize / 64, 1u64 << (c % 64));
        if ctrs.waited[w] & bit != 0 {
            self.wake_waiters(c as usize, v);
        }
    }

    /// Wake the waiters of counter `c` (now at `v`) it satisfies, in the order a list scanned
    /// with swap-removal gives: a satisfied waiter is replaced by the last one, which is looked
    /// at next.
    fn wake_waiters(&mut self, c: usize, v: u64) {
        let ctrs = &mut self.counters;
        let n = ctrs.newest[c];
        let w = ctrs.nodes[n];
        if w.older == crate::core::slab::NONE {
            // One waiter (the common case): no list to rebuild.
            if v >= w.threshold {
                ctrs.nodes.remove(n);
                ctrs.newest[c] = crate::core::slab::NONE;
                ctrs.waited[c / 64] &= !(1 << (c % 64));
                self.pending_wakes.push((w.prog, w.actor));
            }
            return;
        }
        // None satisfied (a tail bumped towards a far threshold): the list stays as it is.
        let mut k = n;
        while k != crate::core::slab::NONE && v < ctrs.nodes[k].threshold {
            k = ctrs.nodes[k].older;
        }
        if k == crate::core::slab::NONE {
            return;
        }
        let mut list = std::mem::take(&mut ctrs.scratch);
        ctrs.take_waiters(c, &mut list);
        let mut i = 0;
        while i < list.len() {
            let (p, a, th) = list[i];
            if v >= th {
                list.swap_remove(i);
                self.pending_wakes.push((p, a));
            } else {
                i += 1;
            }
        }
        let ctrs = &mut self.counters;
        ctrs.put_waiters(c, &list);
        ctrs.scratch = list;
    }

    /// Wait until counter `c` reaches `threshold`: `true` if it already has (no wake will come),
    /// otherwise the actor is woken when it does.
    pub fn wait(&mut self, c: u32, threshold: u64, prog: ProgId, actor: u32) -> bool {
        let ctrs = &mut self.counters;
        let ci = c as usize;
        if ctrs.values[ci] >= threshold {
            return true;
        }
        let (w, bit) = (ci / 64, 1u64 << (c % 64));
        let older =
            if ctrs.waited[w] & bit != 0 { ctrs.newest[ci] } else { crate::core::slab::NONE };
        ctrs.newest[ci] = ctrs.nodes.insert(Waiter { threshold, actor, older, prog });
        ctrs.waited[w] |= bit;
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
            for (p, a, th) in ctrs.waiters_of(i) {
                out.push((p, a, i as u32, ctrs.values[i], th));
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
