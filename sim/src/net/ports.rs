//! The network at run time: queueing at output ports, credit returns, lane arbitration,
//! starting and finishing packets, switch forwarding (static or adaptive), the starvation
//! watch, and the prefetches the event loop asks for.

use super::{
    CreditReturn, Endpoint, LAST_HOP, Pkt, PktKind, Port, QEntry, QP_ITEM, STARVATION_PS, TO_NIC,
};
use crate::core::queue::EventQueue;
use crate::core::slab::NONE;
use crate::core::time::{Time, fmt_us};
use crate::core::{Core, Ev, prefetch, prefetch_at};
use crate::net::arb::LaneMask;

/// Whether port `port`, idle with `lane` queued and no wake-up due by `t`, must be woken at `t`
/// by a credit return. One branch, rarely taken: the three parts are summed rather than
/// joined by `&&` or `&` (which the compiler splits into three branches, each unpredictable
/// on its own: cachegrind's branch model counted 2.8 M mispredictions in EP256 LL).
#[inline(always)]
fn idle_for_credits(port: &Port, lane: u8, t: Time) -> bool {
    let idle = (port.done_at == Time::MAX) as u32;
    let queued = (port.nonempty >> lane) as u32 & 1;
    let not_due = (port.wake_at > t) as u32;
    idle + queued + not_due == 3
}

/// Record a credit overdraft (a model bug), out of the hot path.
#[cold]
#[inline(never)]
fn overdraft(violations: &mut Vec<String>, port: &str, lane: usize, credits: i32, blocks: i32) {
    violations.push(format!(
        "credit overdraft on {port} lane {lane}: {credits} credits, packet needs {blocks}"
    ));
}

/// Record a port starting a packet while busy (a model bug), out of the hot path.
#[cold]
#[inline(never)]
fn over_capacity(violations: &mut Vec<String>, port: &str, now: Time, busy_until: Time) {
    violations.push(format!(
        "link above capacity: {port} starts a packet at {} while busy until {}",
        fmt_us(now),
        fmt_us(busy_until)
    ));
}

impl Core {
    /// Output port at switch `sw` toward NIC `dst`.
    #[inline]
    fn route(&mut self, sw: u32, dst: u32) -> u32 {
        let out = self.net.static_route(sw, dst);
        if out != NONE {
            return out;
        }
        let net = &self.net;
        let s = &net.switches[sw as usize];
        let n_up = s.n_up;
        let dst_pos = net.nic_route[dst as usize].pos;
        // Adaptive: the least-loaded up port (queued bytes + remaining busy time), scanning from
        // a destination-dependent start so ties spread deterministically.
        let now = self.now;
        let mut best = NONE;
        let mut best_load = u64::MAX;
        for k in 0..n_up {
            let i = (dst_pos + k) % n_up;
            let p = net.sw_ports[(s.up + i) as usize];
            let port = &net.ports[p as usize];
            let residual = port.busy_until.saturating_sub(now);
            let load = port.queued_bytes * port.rate.time(1).max(1) + residual;
            if load < best_load {
                best_load = load;
                best = p;
            }
        }
        best
    }

    /// Append an item to a port lane and try to send.
    #[inline]
    pub fn enqueue(&mut self, p: u32, lane: u8, e: QEntry) {
        let li = self.net.li(p as usize, lane as usize);
        let l = &mut self.net.lanes[li];
        if l.q.is_empty() {
            l.head_wire = e.wire;
        }
        l.q.push_back(e);
        let port = &mut self.net.ports[p as usize];
        port.nonempty |= 1 << lane;
        port.queued_bytes += e.wire as u64;
        // A lane no arbitration table lists never leaves (docs/design.md, fabric §1.1 step 6): the
        // deadlock report names it if the run cannot finish.
        self.try_start(p);
    }

    /// Absorb the credit returns of (port, lane) that are due.
    #[inline]
    fn absorb_credits(&mut self, li: usize) -> i32 {
        self.absorb_credits_upto(li, self.now)
    }

    /// Absorb the credit returns of (port, lane) due by `now` (a reserved start's time).
    #[inline]
    fn absorb_credits_upto(&mut self, li: usize, now: Time) -> i32 {
        let mut got = 0i32;
        self.net.returns[li].retain(|r| {
            let due = r.due() <= now;
            if due {
                got += r.blocks();
            }
            !due
        });
        let lane = &mut self.net.lanes[li];
        lane.credits += got;
        lane.credits
    }

    /// Return `blocks` credits of `lane` to port `p` at time `t`.
    #[inline(always)]
    pub fn return_credits(&mut self, p: u32, lane: u8, blocks: i32, t: Time) {
        let net = &mut self.net;
        if net.lossless & (1 << lane) == 0 {
            return;
        }
        let li = net.li(p as usize, lane as usize);
        net.returns[li].push_back(CreditReturn::new(t, blocks));
        // A port idle for lack of credits must learn about them.
        let port = &net.ports[p as usize];
        if idle_for_credits(port, lane, t) {
            self.wake_idle_port(p, t);
        }
    }

    /// A port idle for lack of credits gets a wake-up at `t` (out of the hot path).
    #[cold]
    #[inline(never)]
    fn wake_idle_port(&mut self, p: u32, t: Time) {
        self.net.ports[p as usize].wake_at = t;
        self.push(t, Ev::PortWake(p));
    }

    #[inline]
    pub(crate) fn port_done(&mut self, p: u32) {
        let port = &mut self.net.ports[p as usize];
        if port.done_at != self.now {
            return; // superseded: the port already moved on at an earlier event of this instant
        }
        port.done_at = Time::MAX;
        self.try_start(p);
    }

    pub(crate) fn port_wake(&mut self, p: u32) {
        let port = &mut self.net.ports[p as usize];
        if port.wake_at <= self.now {
            port.wake_at = Time::MAX;
        }
        self.try_start(p);
    }

    /// If the port is idle, pick a lane by arbitration among those whose head fits in the
    /// downstream credits, and start sending its head packet.
    ///
    /// The checks that usually end it (nothing queued, busy) are inlined into the callers; the
    /// start itself is out of line.
    #[inline(always)]
    pub(crate) fn try_start(&mut self, p: u32) {
        let now = self.now;
        let port = &mut self.net.ports[p as usize];
        if port.nonempty == 0 {
            return;
        }
        if now < port.busy_until {
            // Busy: make sure it looks at its queue again when the packet is out.
            if port.done_at != port.busy_until {
                let t = port.busy_until;
                port.done_at = t;
                self.push(t, Ev::PortDone(p));
            }
            return;
        }
        self.start_next(p);
    }

    /// A port idle for lack of credits looks again at `t` (the earliest pending return).
    #[inline]
    fn wake_port(&mut self, p: u32, t: Time) {
        let port = &mut self.net.ports[p as usize];
        if port.wake_at > t {
            port.wake_at = t;
            self.push(t, Ev::PortWake(p));
        }
    }

    /// The lane an idle port with several lanes in use sends from next: arbitration among
    /// the lanes whose head fits in the downstream credits (`None`: nothing can go now).
    #[inline(never)]
    fn pick_lane(&mut self, p: u32) -> Option<usize> {
        let pi = p as usize;
        let np = self.net.nports;
        let port = &self.net.ports[pi];
        let mut eligible: LaneMask = 0;
        let mut next_return = Time::MAX;
        let mut lanes = port.nonempty;
        while lanes != 0 {
            let lane = lanes.trailing_zeros() as usize;
            lanes &= lanes - 1;
            let l = &self.net.lanes[lane * np + pi];
            let need = l.head_wire.div_ceil(64) as i32;
            let mut credits = l.credits;
            if credits < need {
                credits = self.absorb_credits(lane * np + pi);
            }
            if credits >= need {
                eligible |= 1 << lane;
            } else if let Some(due) = self.net.earliest_return(lane * np + pi) {
                next_return = next_return.min(due);
            }
        }
        if eligible == 0 {
            if next_return != Time::MAX {
                self.wake_port(p, next_return);
            }
            return None;
        }
        let pick = {
            let net = &mut self.net;
            let lanes = &net.lanes;
            net.ports[pi].arb.pick(&net.arb, &mut net.drr[pi], eligible, |l| {
                lanes[l as usize * np + pi].head_wire
            })
        };
        let pick = pick?; // only unschedulable lanes are eligible: they stall
        if pick.bypassed != 0 {
            self.watch_starvation(p, pick.bypassed);
        }
        let lane = pick.lane as usize;
        let port = &mut self.net.ports[pi];
        if port.bypassed & (1 << lane) != 0 {
            port.bypassed &= !(1 << lane);
            self.net.bypassed_since[lane * np + pi] = Time::MAX;
        }
        Some(lane)
    }

    /// [`Core::try_start`] on an idle port with something queued.
    #[inline(never)]
    fn start_next(&mut self, p: u32) {
        let pi = p as usize;
        let np = self.net.nports;
        let now = self.now;
        let lane = if let Some(only) = self.net.single_lane {
            // Every queue holds this lane only, and it is schedulable: nothing to arbitrate.
            // Returned credits are absorbed only when the ones in hand do not suffice: they
            // only ever add, and most of the time the buffer is far from full.
            let li = only as usize * np + pi;
            let l = &self.net.lanes[li];
            let need = l.head_wire.div_ceil(64) as i32;
            if l.credits < need && self.absorb_credits(li) < need {
                if let Some(due) = self.net.earliest_return(li) {
                    self.wake_port(p, due);
                }
                return;
            }
            only as usize
        } else {
            match self.pick_lane(p) {
                Some(lane) => lane,
                None => return,
            }
        };
        let li = lane * np + pi;
        let head = *self.net.lanes[li].q.front().expect("an eligible lane has a head");
        let (pkt_id, wire, dst, from) = if head.item & QP_ITEM != 0 {
            let (pkt, wire, dst) = self.take_qp_packet(p, lane as u8, head.item & !QP_ITEM);
            (pkt, wire, dst, NONE)
        } else {
            let net = &mut self.net;
            let l = &mut net.lanes[li];
            l.q.pop_front();
            l.popped += 1;
            match l.q.front() {
                Some(next) => l.head_wire = next.wire,
                None => net.ports[pi].nonempty &= !(1 << lane),
            }
            (head.item, head.wire, head.dst, head.from)
        };
        self.send::<false>(p, lane, pkt_id, wire, dst, from, now);
    }

    /// A packet reaching switch output port `p` when nothing is queued there (on any lane)
    /// starts when the port is free, `max(now, busy_until)`, without entering the queue: the
    /// port is reserved for it now, and its next hop scheduled. Nothing else can start on the
    /// port before then (the lane is the run's only one, and any later arrival finds the port
    /// reserved), so the start time is the one the queue would give, provided the credits due
    /// by then suffice; if the returns known now do not show that, the packet queues as usual
    /// (false). Only the push order of its next events differs: they are pushed now, not at
    /// the start. Not with adaptive routing, which reads the queued bytes.
    #[inline(always)]
    fn reserve(&mut self, p: u32, lane: u8, e: QEntry) -> bool {
        let pi = p as usize;
        let li = self.net.li(pi, lane as usize);
        let start = self.now.max(self.net.ports[pi].busy_until);
        let need = e.wire.div_ceil(64) as i32;
        if self.net.lanes[li].credits < need && self.absorb_credits_upto(li, start) < need {
            return false;
        }
        self.send::<true>(p, lane as usize, e.item, e.wire, e.dst, e.from, start);
        true
    }

    /// Start packet `pkt_id` (already out of its queue) on port `p` at `start` (now, or a
    /// reserved time when the port is free): credits, serialization, the credit return to
    /// the port it came from, and its arrival at the next switch or NIC.
    ///
    /// `RESERVED`: from [`Core::reserve`], whose caller and checks establish that the port's
    /// queues are empty, its only lane's credits suffice and `start` is not before
    /// `busy_until`: the checks and updates that cannot apply are left out.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn send<const RESERVED: bool>(
        &mut self,
        p: u32,
        lane: usize,
        pkt_id: u32,
        wire: u32,
        dst: u32,
        from: u32,
        start: Time,
    ) {
        let pi = p as usize;
        let np = self.net.nports;
        let li = lane * np + pi;
        // The lanes, ports and queue borrowed apart (no reload of a vector's length and
        // address after every store through another one).
        let Core { net, queue, params, violations, .. } = self;
        let lanes = &mut net.lanes[..];
        let ports = &mut net.ports[..];
        let l = &mut lanes[li];
        let port = &mut ports[pi];
        let to = port.to;
        // The lane's next item is served a packet time from now: fetch what it will touch (a
        // QP's send state; a packet's record where the port delivers to a NIC).
        if RESERVED {
            debug_assert!(l.q.is_empty() && port.nonempty == 0 && net.single_lane.is_some());
        } else if let Some(next) = l.q.front() {
            if next.item & QP_ITEM != 0 {
                prefetch(&net.qp_tx[(next.item & !QP_ITEM) as usize]);
            } else if to & TO_NIC != 0 {
                prefetch(&net.pkts[next.item]);
            }
        }
        let blocks = wire.div_ceil(64) as i32;
        if !RESERVED && net.single_lane.is_none() {
            port.arb.sent(&net.arb, &mut net.drr[pi], lane as u8, wire);
        }
        if !RESERVED && l.credits < blocks && net.lossless & (1 << lane) != 0 {
            overdraft(violations, &net.port_names[pi], lane, l.credits, blocks);
        }
        debug_assert!(l.credits >= blocks || net.lossless & (1 << lane) == 0);
        l.credits -= blocks;
        if !RESERVED && start < port.busy_until {
            over_capacity(violations, &net.port_names[pi], start, port.busy_until);
        }
        debug_assert!(start >= port.busy_until);
        let ser = port.rate.time(wire as u64);
        port.busy_until = start + ser;
        if !RESERVED {
            // A reserved packet never entered the queue (nothing was queued: zero bytes).
            port.queued_bytes = port.queued_bytes.saturating_sub(wire as u64);
        }
        // Every time below is after now (serialization and latencies are positive): the
        // queue is used directly, without the past-event check.
        if !RESERVED && port.nonempty != 0 {
            port.done_at = start + ser;
            queue.push(start + ser, Ev::PortDone(p));
        } else {
            port.done_at = Time::MAX;
        }
        let latency = params.link_latency;
        // The packet leaves the input buffer it sat in: credits flow back upstream.
        if from != NONE && net.lossless & (1 << lane) != 0 {
            let t = start + latency + params.credit_delay;
            let lf = lane * np + from as usize;
            net.returns[lf].push_back(CreditReturn::new(t, blocks));
            // A port idle for lack of credits must learn about them.
            let up = &mut ports[from as usize];
            if idle_for_credits(up, lane as u8, t) {
                up.wake_at = t;
                queue.push(t, Ev::PortWake(from));
            }
        }
        if self.trace.is_some() {
            let pkt = self.net.pkts[pkt_id];
            self.trace_packet(p, start, ser, &pkt, lane as u8, wire, dst);
        }
        if to & TO_NIC == 0 {
            let params = &self.params;
            let ser_next = params.link_rate.time(wire as u64);
            let mut t = start + latency + params.switch_latency;
            if params.cut_through {
                // The next hop cannot finish before the tail is in.
                t += ser.saturating_sub(ser_next);
            } else {
                t += ser;
            }
            if params.adaptive {
                t += params.adaptive_latency;
            }
            // The switch it reaches delivers to the destination NIC: mark it, so the loop can
            // fetch the packet record (which the NIC reads) ahead of the arrival.
            let last = self.net.single | (self.net.nic_route[dst as usize].leaf == to);
            let lane = lane as u8 | (LAST_HOP * last as u8);
            let ev = Ev::SwitchArrive { from: p, pkt: pkt_id, dst, wire: wire as u16, lane };
            self.queue.push(t, ev);
        } else {
            let (head_t, tail_t) = (start + latency, start + ser + latency);
            self.nic_receive(to & !TO_NIC, p, lane as u8, pkt_id, wire, dst, head_t, tail_t);
        }
    }

    /// What the next event will read (a delivery's packet, QP and message; the packet a last
    /// switch hop hands to its NIC; the queue pair at the head of a NIC port's queue), where
    /// the records that name them are already at hand. No effect on any result.
    #[inline(always)]
    pub(crate) fn prefetch_near(&self, ev: Ev) {
        match ev {
            Ev::SwitchArrive { pkt, lane, .. } => {
                // Record 0 where the switch is not the last (a line that stays cached): a
                // selected address instead of a branch on the hop, which is unpredictable.
                let last = lane & LAST_HOP != 0;
                self.net.pkts.prefetch(std::hint::select_unpredictable(last, pkt, 0))
            }
            // Only NIC ports (ids below the NICs') queue QPs.
            Ev::PortDone(p) if (p as usize) < self.net.nics.len() => {
                if let Some(lane) = self.net.single_lane {
                    let l = &self.net.lanes[self.net.li(p as usize, lane as usize)];
                    if let Some(head) = l.q.front()
                        && head.item & QP_ITEM != 0
                    {
                        prefetch_at(&self.net.qp_tx, (head.item & !QP_ITEM) as usize);
                        if head.from != NONE {
                            self.net.msgs.prefetch_send(head.from);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// What the event after the next will read first: the queue entry a port's next start
    /// takes (one port's lane queue is a ring of its own, written long before it is read).
    /// No effect on any result.
    #[inline(always)]
    pub(crate) fn prefetch_far(&self, ev: Ev) {
        let Some(lane) = self.net.single_lane else { return };
        if let Ev::PortDone(p) = ev {
            self.net.lanes[self.net.li(p as usize, lane as usize)].q.prefetch_front();
        }
    }

    /// The records an event names itself (no dependent load), fetched several events ahead
    /// (`DEEP_PREFETCH` in [`crate::core::world`]): a delivery's packet, QP and message, the counter
    /// a completion bumps, the QP a doorbell or a readiness touches. No effect on any result.
    #[inline(always)]
    pub(crate) fn prefetch_deep(&self, ev: Ev) {
        match ev {
            Ev::NicDeliver { pkt, qp, msg } => self.prefetch_delivery(pkt, qp, msg),
            Ev::Act(crate::core::Action::Add { counter, .. }) => {
                self.counters.prefetch(counter as usize)
            }
            Ev::Doorbell { qp, .. } => {
                prefetch_at(&self.net.qps, qp as usize);
                prefetch_at(&self.net.qp_tx, qp as usize);
            }
            Ev::QpReady(qp) => prefetch_at(&self.net.qp_tx, qp as usize),
            _ => {}
        }
    }

    /// The NIC a packet came from (the trace shows it; packets do not carry it).
    fn src_nic(&self, pkt: &Pkt) -> u32 {
        match pkt.kind {
            PktKind::Data | PktKind::DataLast | PktKind::AtomicReq => {
                self.net.qps[pkt.qp as usize].nic
            }
            PktKind::Ack | PktKind::AtomicResp | PktKind::Nak => {
                self.net.qps[pkt.qp as usize].peer_nic
            }
        }
    }

    /// Trace one packet on its port's track, with credit and queue counters.
    #[allow(clippy::too_many_arguments)]
    fn trace_packet(
        &mut self,
        p: u32,
        now: Time,
        ser: Time,
        pkt: &Pkt,
        lane: u8,
        wire: u32,
        dst: u32,
    ) {
        use crate::trace::{PID_NIC, PID_SWITCH, TID_NIC_PORT};
        let (pid, tid, pname) = match self.net.port_from[p as usize] {
            Endpoint::Nic(n) => (PID_NIC + n, TID_NIC_PORT, format!("NIC {n}")),
            Endpoint::Switch(s) => (PID_SWITCH + s, p, self.net.switches[s as usize].name.clone()),
        };
        let tname = self.net.port_names[p as usize].clone();
        let credits = self.net.lanes[self.net.li(p as usize, lane as usize)].credits;
        let queued = self.net.ports[p as usize].queued_bytes;
        let kind = match pkt.kind {
            PktKind::Data | PktKind::DataLast => "data",
            PktKind::Ack => "ack",
            PktKind::AtomicReq => "atomic",
            PktKind::AtomicResp => "atomic-resp",
            PktKind::Nak => "nak",
        };
        let lossless = self.net.lossless & (1 << lane) != 0;
        let src_nic = self.src_nic(pkt);
        let tr = self.trace.as_mut().expect("tracing");
        tr.name_process(pid, &pname);
        tr.name_thread(pid, tid, &tname);
        let args = crate::trace::SpanArgs::Packet {
            bytes: wire,
            payload: pkt.payload,
            src_nic,
            dst_nic: dst,
        };
        tr.span(pid, tid, &format!("VL{} {kind}", lane), now, now + ser, args);
        if lossless {
            let name = format!("{tname} VL{} credits", lane);
            tr.counter(pid, (p, lane), &name, now, "credits", credits as i64);
        }
        tr.counter(pid, (p, 255), &format!("{tname} queue"), now, "bytes", queued as i64);
    }

    fn watch_starvation(&mut self, p: u32, bypassed: LaneMask) {
        let now = self.now;
        let mut lanes = bypassed;
        while lanes != 0 {
            let lane = lanes.trailing_zeros() as usize;
            lanes &= lanes - 1;
            self.net.ports[p as usize].bypassed |= 1 << lane;
            let li = self.net.li(p as usize, lane);
            let since = &mut self.net.bypassed_since[li];
            if *since == Time::MAX {
                *since = now;
            } else if now - *since > STARVATION_PS && !self.net.starved.contains(&(p, lane as u8)) {
                let since = *since;
                self.net.starved.push((p, lane as u8));
                let name = self.net.port_names[p as usize].clone();
                let msg = format!(
                    "VL{lane} starved on {name}: eligible but passed over by the high-priority table since {} (high_limit = 255 lets high-priority traffic take the port indefinitely)",
                    fmt_us(since)
                );
                self.starvation(msg);
            }
        }
    }

    /// A packet sent by port `from` reaches the switch at its far end.
    #[inline]
    pub(crate) fn switch_arrive(&mut self, from: u32, pkt: u32, dst: u32, wire: u32, lane: u8) {
        let sw = self.net.ports[from as usize].to;
        let out = self.route(sw, dst);
        let e = QEntry { item: pkt, wire, from, dst };
        if self.net.reserving
            && self.net.ports[out as usize].nonempty == 0
            && self.reserve(out, lane, e)
        {
            return;
        }
        self.enqueue(out, lane, e);
    }
}
