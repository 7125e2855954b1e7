//! NICs and RC queue pairs: WQE posting and doorbells, per-WR NIC processing, MTU
//! segmentation with header overhead, per-QP in-order execution at the responder (an atomic
//! after writes on the same QP takes effect after them, even when adaptive routing reorders
//! packets), RC ACKs and completions, and the QP-depth rule.
//!
//! DeepEP's IBGDA layer reserves WQE slots without checking for free ones (docs/design.md, DeepEP
//! §12): a DeepEP QP never blocks, and a post beyond `NVSHMEM_QP_DEPTH` outstanding work requests
//! is reported as a correctness failure with its coordinates. Background traffic behaves like a
//! verbs application and never posts beyond the depth.

mod loss;

pub use loss::{Loss, QP_RETRY_CNT, QP_TIMEOUT_EXPONENT, local_ack_timeout};

use crate::core::slab::{NONE, Slab};
use crate::core::time::Time;
use crate::core::{Action, Core, Ev, ProgId, prefetch_at};
use crate::net::{Pkt, PktKind, QEntry, QP_ITEM};

#[derive(Debug, Clone)]
pub struct Nic {
    pub tx_port: u32,
    /// The receive pipeline (PCIe writes into GPU memory) is free from this time.
    pub rx_free: Time,
    /// The WQE-processing engine is free from this time (message-rate limit).
    pub engine_free: Time,
}

impl Nic {
    pub fn new(tx_port: u32) -> Nic {
        Nic { tx_port, rx_free: 0, engine_free: 0 }
    }
}

/// Who a QP belongs to, for messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct QpLabel {
    pub job: u16,
    pub src_rank: u32,
    pub dst_rank: u32,
    pub index: u16,
}

/// A queue pair's hot state (one cache line: every message touches it at post, doorbell,
/// execution and completion, at random among tens of thousands of QPs). Who it belongs to
/// lives apart, in [`Net::qp_labels`](crate::net::Net::qp_labels): only messages read it.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
pub struct Qp {
    pub nic: u32,
    pub peer_nic: u32,
    pub depth: u32,
    // Requester: messages in post order, linked through `MsgSend::next` (and `MsgDone::next`).
    pub head: u32,
    pub tail: u32,
    /// First message not yet covered by a doorbell.
    pub db: u32,
    pub posted: u32,
    pub rung: u32,
    /// Completed messages (those in flight are `posted - completed`: [`Qp::in_flight`]).
    pub completed: u32,
    // Responder: next message to execute, in order.
    pub exec: u32,
    pub exec_seq: u32,
    /// Messages fully arrived and not yet executed: while none is, the next one to execute
    /// has not arrived, without a look at its record.
    pub arrived: u32,
    /// That ACK's position in its NIC port lane's queue (counted as [`Lane::popped`](crate::net::Lane::popped)
    /// counts): it is still queued while the lane has popped no more than this.
    pub ack_pos: u64,
    /// The responder's last ACK for this QP (NONE: none). While it still waits in its NIC
    /// port, a later message's execution bumps it instead of queueing another (ACKs are
    /// cumulative).
    pub ack_pkt: u32,
    pub prog: ProgId,
    pub lane: u8,
    /// A DeepEP (IBGDA) QP: posts never wait for free slots or completions (docs/design.md, DeepEP
    /// §12), so a post beyond the depth is a failure of `prog`, and its ACKs and atomic responses
    /// are not simulated as packets ([`Core::unloaded_ack_time`]).
    pub ibgda: bool,
}

/// The send side of a QP: the `send` message as the NIC's send engine holds it, so a packet
/// touches only these 32 bytes (wire bytes of the next packet, payload left, kind, op, ready
/// time, destination).
#[derive(Debug, Clone, Copy)]
pub struct QpTx {
    /// When `send` may start (doorbell, WQE processing, tx latency); Time::MAX: not rung.
    pub send_ready: Time,
    /// Next message to packetize (NONE: none).
    pub send: u32,
    /// The message after `send` (NONE: none posted yet): a message boundary reads the next
    /// message's record only, and it can be fetched ahead.
    pub send_next: u32,
    pub send_left: u32,
    pub peer_nic: u32,
    /// Wire bytes of the next packet (at most an MTU plus headers, well under 64 KiB).
    pub next_wire: u16,
    pub send_prog: ProgId,
    pub send_atomic: bool,
    /// In its NIC port's round robin.
    pub active: bool,
    /// A `QpReady` event is scheduled.
    pub ready_pending: bool,
}

/// A message's send side (the requester NIC's WQE processing and packetizing), 16 bytes: four
/// to a cache line. A message is touched at random among the hundreds of thousands in flight,
/// and each phase reads only its own part: the doorbell and the send engine this one, the
/// responder's execution and the requester's completion [`MsgDone`]. Its post time is kept
/// apart, and only when tracing ([`Net::msg_posted_at`](crate::net::Net::msg_posted_at)).
#[derive(Debug, Clone, Copy)]
#[repr(C, align(16))]
pub struct MsgSend {
    /// When it may start sending (doorbell, WQE processing, tx latency) above its program in
    /// the low 16 bits, one word (as [`CreditReturn`](crate::net::CreditReturn) packs its
    /// due time): times stay below 2^48 ps ≈ 281 s, past the run limit; all ones above the
    /// program: not rung yet.
    ready_prog: u64,
    /// The next message posted on its QP (NONE: none yet).
    pub next: u32,
    /// Payload bytes, or [`ATOMIC`] (an atomic carries none).
    size: u32,
}

/// [`MsgSend::size`] of an atomic.
const ATOMIC: u32 = u32::MAX;
/// [`MsgSend::ready_prog`]'s time field when not rung.
const NOT_RUNG: u64 = u64::MAX >> 16;

impl MsgSend {
    fn new(bytes: u32, atomic: bool, prog: ProgId) -> MsgSend {
        debug_assert!(atomic || bytes != ATOMIC);
        let size = if atomic { ATOMIC } else { bytes };
        MsgSend { ready_prog: NOT_RUNG << 16 | prog as u64, next: NONE, size }
    }

    /// When it may start sending (Time::MAX: not rung yet).
    #[inline]
    pub fn ready_at(&self) -> Time {
        let t = self.ready_prog >> 16;
        if t == NOT_RUNG { Time::MAX } else { t }
    }

    #[inline]
    fn set_ready_at(&mut self, t: Time) {
        assert!(t < NOT_RUNG, "ready time {t} ps beyond 2^48 ps");
        self.ready_prog = t << 16 | (self.ready_prog & 0xFFFF);
    }

    #[inline]
    pub fn prog(&self) -> ProgId {
        self.ready_prog as ProgId
    }

    #[inline]
    pub fn atomic(&self) -> bool {
        self.size == ATOMIC
    }

    /// Payload bytes (0 for an atomic).
    #[inline]
    pub fn bytes(&self) -> u32 {
        if self.atomic() { 0 } else { self.size }
    }
}

/// A message's execution and completion side (the responder executes it, the requester
/// completes it an ACK's round trip later, often while the line is still cached): 16 bytes,
/// four to a cache line. The remote action is inline when it is a counter increment (all
/// DeepEP messages: it or none); a wake, or any local action (background traffic's), lives in
/// [`Msgs::side`], read only when [`SIDE`] is set. Its sequence number on the QP is not
/// stored: the QP executes and completes its messages in post order, so it is the QP's
/// `exec_seq` at execution and `completed` at completion.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(16))]
pub struct MsgDone {
    /// The remote action `Add { counter, delta }` when [`REMOTE_ADD`] is set.
    counter: u32,
    delta: u32,
    /// The next message posted on its QP (NONE: none yet), as [`MsgSend::next`].
    pub next: u32,
    pub prog: ProgId,
    /// [`ATOMIC_MSG`], [`ARRIVED`], [`REMOTE_ADD`], [`SIDE`].
    flags: u8,
}

/// [`MsgDone::flags`]: an atomic.
const ATOMIC_MSG: u8 = 1;
/// [`MsgDone::flags`]: every packet arrived (it may execute once the earlier ones have).
const ARRIVED: u8 = 2;
/// [`MsgDone::flags`]: the remote action is `Add { counter, delta }`.
const REMOTE_ADD: u8 = 4;
/// [`MsgDone::flags`]: the actions are in [`Msgs::side`].
const SIDE: u8 = 8;

impl MsgDone {
    #[inline]
    pub fn atomic(&self) -> bool {
        self.flags & ATOMIC_MSG != 0
    }

    /// Every packet arrived.
    #[inline]
    pub fn arrived_all(&self) -> bool {
        self.flags & ARRIVED != 0
    }
}

/// The messages: a slab of [`MsgDone`] records (which hands out the ids) with the
/// [`MsgSend`] records in a parallel array, the actions that do not fit a [`MsgDone`], and,
/// under adaptive routing only, a count of packets arrived per message.
#[derive(Debug, Clone, Default)]
pub struct Msgs {
    done: Slab<MsgDone>,
    send: Vec<MsgSend>,
    /// (remote, local) actions of the messages with [`SIDE`] set (any other entry is stale).
    side: Vec<(Action, Action)>,
    /// Packets arrived per message (adaptive routing only: they may arrive out of order).
    arrived: Vec<u32>,
}

impl Msgs {
    /// Room for `n` messages before the arrays grow (see [`Slab::with_capacity`]).
    pub fn with_capacity(n: usize) -> Msgs {
        Msgs {
            done: Slab::with_capacity(n),
            send: crate::core::slab::with_capacity_huge(n),
            side: Vec::new(),
            arrived: Vec::new(),
        }
    }

    /// A new message (not yet linked to its QP's next): its id.
    #[inline]
    fn insert(&mut self, send: MsgSend, remote: Action, local: Action, adaptive: bool) -> u32 {
        let prog = send.prog();
        let mut done = MsgDone { counter: 0, delta: 0, next: NONE, prog, flags: 0 };
        if send.atomic() {
            done.flags |= ATOMIC_MSG;
        }
        match remote {
            Action::Add { counter, delta } => {
                (done.counter, done.delta) = (counter, delta);
                done.flags |= REMOTE_ADD;
            }
            Action::Wake { .. } => done.flags |= SIDE,
            Action::None => {}
        }
        if local != Action::None {
            done.flags |= SIDE;
        }
        let m = self.done.insert(done);
        // The slab hands out a fresh id exactly at the end of its array, which the parallel
        // arrays follow.
        if m as usize == self.send.len() {
            crate::core::slab::push_huge(&mut self.send, send);
        } else {
            self.send[m as usize] = send;
        }
        if done.flags & SIDE != 0 {
            if self.side.len() <= m as usize {
                self.side.resize(m as usize + 1, (Action::None, Action::None));
            }
            self.side[m as usize] = (remote, local);
        }
        if adaptive {
            if self.arrived.len() <= m as usize {
                self.arrived.resize(m as usize + 1, 0);
            }
            self.arrived[m as usize] = 0;
        }
        m
    }

    #[inline]
    fn remove(&mut self, m: u32) {
        self.done.remove(m);
    }

    #[inline]
    pub fn send(&self, m: u32) -> &MsgSend {
        &self.send[m as usize]
    }

    #[inline]
    pub fn done(&self, m: u32) -> &MsgDone {
        &self.done[m]
    }

    /// Message `m`'s remote action (run at the responder when it takes effect), from its
    /// record `d`.
    #[inline]
    fn remote(&self, m: u32, d: &MsgDone) -> Action {
        if d.flags & REMOTE_ADD != 0 {
            Action::Add { counter: d.counter, delta: d.delta }
        } else if d.flags & SIDE != 0 {
            self.side[m as usize].0
        } else {
            Action::None
        }
    }

    /// Message `m`'s local action (run at the requester on completion), from its record `d`.
    #[inline]
    fn local(&self, m: u32, d: &MsgDone) -> Action {
        if d.flags & SIDE != 0 { self.side[m as usize].1 } else { Action::None }
    }

    /// Fetch message `m`'s send record ahead of use (no bounds check, no effect on results).
    #[inline(always)]
    pub fn prefetch_send(&self, m: u32) {
        crate::core::prefetch_at(&self.send, m as usize);
    }

    /// Fetch message `m`'s execution/completion record ahead of use (likewise).
    #[inline(always)]
    pub fn prefetch_done(&self, m: u32) {
        self.done.prefetch(m);
    }

    /// Forget every message, keeping the buffers.
    pub fn clear(&mut self) {
        self.done.clear();
        self.send.clear();
        self.side.clear();
        self.arrived.clear();
    }

    /// Messages currently posted and not completed.
    pub fn live(&self) -> usize {
        self.done.live()
    }

    /// Messages the buffers hold before they have to grow.
    pub fn reserved(&self) -> usize {
        self.done.reserved().min(self.send.capacity())
    }
}

impl Qp {
    /// Work requests posted and not completed.
    #[inline]
    pub fn in_flight(&self) -> u32 {
        self.posted - self.completed
    }
}

impl Core {
    /// Create a queue pair from `nic` to `peer_nic` on `lane`.
    #[allow(clippy::too_many_arguments)]
    pub fn create_qp(
        &mut self,
        nic: u32,
        peer_nic: u32,
        lane: u8,
        depth: u32,
        ibgda: bool,
        prog: ProgId,
        label: QpLabel,
    ) -> u32 {
        if self.net.job_lanes & (1 << lane) == 0 {
            // Ports skip arbitration when the jobs use a single lane: a QP elsewhere breaks it.
            self.violation(format!("QP {nic} -> {peer_nic} on lane {lane}, not a job's lane"));
        }
        crate::core::slab::push_huge(
            &mut self.net.qps,
            Qp {
                nic,
                peer_nic,
                depth,
                head: NONE,
                tail: NONE,
                db: NONE,
                posted: 0,
                rung: 0,
                completed: 0,
                exec: NONE,
                exec_seq: 0,
                arrived: 0,
                ack_pos: 0,
                ack_pkt: NONE,
                prog,
                lane,
                ibgda,
            },
        );
        self.net.qp_labels.push(label);
        crate::core::slab::push_huge(
            &mut self.net.qp_tx,
            QpTx {
                send_ready: Time::MAX,
                send: NONE,
                send_next: NONE,
                send_left: 0,
                next_wire: 0,
                peer_nic,
                send_prog: 0,
                send_atomic: false,
                active: false,
                ready_pending: false,
            },
        );
        (self.net.qps.len() - 1) as u32
    }

    /// Post an RDMA write of `bytes` (or a 32-bit atomic) on `qp`. `remote` runs at the
    /// responder when it takes effect; `local` at the requester on completion. Visible to the
    /// NIC only after a doorbell ([`Core::ring`]).
    pub fn post(
        &mut self,
        qp: u32,
        bytes: u32,
        atomic: bool,
        remote: Action,
        local: Action,
        prog: ProgId,
    ) {
        let send = MsgSend::new(bytes, atomic, prog);
        let m = self.net.msgs.insert(send, remote, local, self.params.adaptive);
        if self.trace.is_some() {
            let at = &mut self.net.msg_posted_at;
            if at.len() <= m as usize {
                at.resize(m as usize + 1, 0);
            }
            at[m as usize] = self.now;
        }
        let q = &mut self.net.qps[qp as usize];
        if q.tail != NONE {
            let tail = q.tail;
            self.net.msgs.send[tail as usize].next = m;
            self.net.msgs.done[tail].next = m;
            let tx = &mut self.net.qp_tx[qp as usize];
            if tx.send == tail {
                tx.send_next = m;
            }
        }
        let q = &mut self.net.qps[qp as usize];
        q.tail = m;
        if q.head == NONE {
            q.head = m;
        }
        if self.net.qp_tx[qp as usize].send == NONE {
            self.load_send(qp, m);
        }
        let q = &mut self.net.qps[qp as usize];
        if q.db == NONE {
            q.db = m;
        }
        if q.exec == NONE {
            q.exec = m;
        }
        q.posted += 1;
        if self.early_acks && q.ibgda && q.posted > q.depth {
            self.early_acks_overrun = true;
        }
        if q.in_flight() > q.depth {
            let (depth, in_flight, check) = (q.depth, q.in_flight(), q.ibgda);
            let label = self.net.qp_labels[qp as usize];
            let what = format!(
                "QP overrun: job {} rank {} -> rank {} QP {}: {in_flight} work requests in flight > NVSHMEM_QP_DEPTH {depth} (IBGDA does not check for free WQE slots; the ring overwrites unconsumed WQEs)",
                label.job, label.src_rank, label.dst_rank, label.index
            );
            if check {
                self.fail(prog, what);
            } else {
                self.violation(format!("QP in-flight <= depth: {what}"));
            }
        }
    }

    /// Ring the QP's doorbell at `t` (≥ now): the NIC sees every WQE posted so far after the
    /// doorbell latency (an MMIO write through PCIe).
    pub fn ring(&mut self, qp: u32, t: Time) {
        let upto = self.net.qps[qp as usize].posted;
        self.push(t.max(self.now) + self.params.doorbell, Ev::Doorbell { qp, upto });
    }

    pub(crate) fn doorbell_arrive(&mut self, qp: u32, upto: u32) {
        let now = self.now;
        let nic = self.net.qps[qp as usize].nic as usize;
        while self.net.qps[qp as usize].rung < upto {
            let m = self.net.qps[qp as usize].db;
            if m == NONE {
                self.violation(format!("doorbell on QP {qp} beyond its posted WQEs"));
                break;
            }
            // One WR at a time through the NIC's processing engine, then WQE fetch and payload
            // DMA read before the first byte leaves (tx latency).
            let start = self.net.nics[nic].engine_free.max(now);
            let ready = start + self.params.wqe_process;
            self.net.nics[nic].engine_free = ready;
            let send = &mut self.net.msgs.send[m as usize];
            send.set_ready_at(ready + self.params.tx_latency);
            let next = send.next;
            let tx = &mut self.net.qp_tx[qp as usize];
            if tx.send == m {
                tx.send_ready = ready + self.params.tx_latency;
            }
            let q = &mut self.net.qps[qp as usize];
            q.rung += 1;
            q.db = next;
        }
        self.kick_qp(qp);
    }

    pub(crate) fn qp_ready(&mut self, qp: u32) {
        self.net.qp_tx[qp as usize].ready_pending = false;
        self.kick_qp(qp);
    }

    /// Put the QP in its NIC port's round robin if its next message may send.
    fn kick_qp(&mut self, qp: u32) {
        let tx = &mut self.net.qp_tx[qp as usize];
        if tx.active || tx.send == NONE {
            return;
        }
        let ready = tx.send_ready;
        if ready == Time::MAX {
            return; // not doorbelled yet
        }
        if ready <= self.now {
            tx.active = true;
            let (wire, next) = (tx.next_wire as u32, tx.send_next);
            let q = &self.net.qps[qp as usize];
            let (port, lane, dst) = (self.net.nics[q.nic as usize].tx_port, q.lane, q.peer_nic);
            self.enqueue(port, lane, QEntry { item: QP_ITEM | qp, wire, from: next, dst });
        } else if !tx.ready_pending {
            tx.ready_pending = true;
            self.push(ready, Ev::QpReady(qp));
        }
    }

    /// Make message `m` (or none) the QP's send cursor, caching what packetizing needs.
    fn load_send(&mut self, qp: u32, m: u32) {
        let (bytes, atomic, prog, ready, next) = if m == NONE {
            (0, false, 0, Time::MAX, NONE)
        } else {
            let msg = self.net.msgs.send(m);
            (msg.bytes(), msg.atomic(), msg.prog(), msg.ready_at(), msg.next)
        };
        let next_wire = if atomic {
            self.params.hdr.atomic_req
        } else {
            self.params.data_wire(bytes.min(self.params.mtu), true)
        };
        debug_assert!(next_wire <= u16::MAX as u32, "packet of {next_wire} wire bytes");
        let q = &mut self.net.qp_tx[qp as usize];
        q.send = m;
        q.send_next = next;
        q.send_left = bytes;
        q.send_atomic = atomic;
        q.send_prog = prog;
        q.send_ready = ready;
        q.next_wire = next_wire as u16;
    }

    /// The QP at the head of `port`'s `lane` queue sends one packet (returned with its wire
    /// bytes and destination); it goes to the back of the queue if it has more ready to send
    /// (packet-level round robin between QPs).
    #[inline(never)]
    pub(crate) fn take_qp_packet(&mut self, port: u32, lane: u8, qp: u32) -> (u32, u32, u32) {
        let now = self.now;
        let mtu = self.params.mtu;
        let q = &self.net.qp_tx[qp as usize];
        let (wire, m, prog, dst) = (q.next_wire as u32, q.send, q.send_prog, q.peer_nic);
        let left = q.send_left;
        let (payload, kind, last) = if q.send_atomic {
            (0, PktKind::AtomicReq, true)
        } else {
            let payload = q.send_left.min(mtu);
            let last = payload >= q.send_left;
            (payload, if last { PktKind::DataLast } else { PktKind::Data }, last)
        };
        let pkt = self.net.pkts.insert(Pkt { msg: m, qp, payload, prog, kind });
        let ob = &mut self.op_bytes[prog as usize];
        ob.wire += wire as u64;
        ob.rdma_payload += payload as u64;
        self.loss_sent(qp, pkt, m, left, payload);
        if last {
            // Only a message boundary touches a message record: the next one's.
            let next = self.net.qp_tx[qp as usize].send_next;
            self.load_send(qp, next);
        } else {
            let q = &mut self.net.qp_tx[qp as usize];
            q.send_left -= payload;
            q.next_wire = (q.send_left.min(mtu) + self.params.hdr.data) as u16;
        }
        self.loss_between_packets(qp);
        // The boundary after this one reads the next message: fetch it while the QP waits
        // for its next turn (slab ids stay in range: always an address).
        let next = self.net.qp_tx[qp as usize].send_next;
        if next != NONE {
            self.net.msgs.prefetch_send(next);
        }
        // Pop the QP from the lane queue; back of the round robin if it has more ready.
        let q = &mut self.net.qp_tx[qp as usize];
        let more = q.send != NONE && q.send_ready <= now;
        let qp_wire = q.next_wire as u32;
        if !more {
            q.active = false;
            if q.send != NONE && q.send_ready != Time::MAX && !q.ready_pending {
                q.ready_pending = true;
                let ready = q.send_ready;
                self.push(ready, Ev::QpReady(qp));
            }
        }
        let li = self.net.li(port as usize, lane as usize);
        let l = &mut self.net.lanes[li];
        l.q.pop_front();
        l.popped += 1;
        if more {
            // No try_start: the caller is arbitrating this port.
            l.q.push_back(QEntry { item: QP_ITEM | qp, wire: qp_wire, from: next, dst });
        }
        match l.q.front() {
            Some(next) => l.head_wire = next.wire,
            None => self.net.ports[port as usize].nonempty &= !(1 << lane),
        }
        (pkt, wire, dst)
    }

    /// A packet (of `wire` bytes on `lane`, for NIC `dst`) reaches NIC `n` through port `p`:
    /// its head at `head_t`, its tail at `tail_t`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn nic_receive(
        &mut self,
        n: u32,
        p: u32,
        lane: u8,
        pkt: u32,
        wire: u32,
        dst: u32,
        head_t: Time,
        tail_t: Time,
    ) {
        if dst != n {
            self.violation(format!(
                "misrouted packet: for nic {dst} delivered to nic {n} via {}",
                self.net.port_names[p as usize]
            ));
        }
        let k = self.net.pkts[pkt];
        let nic = &mut self.net.nics[n as usize];
        let start = head_t.max(nic.rx_free);
        let done = (start + self.params.pcie_rate.time(wire as u64)).max(tail_t);
        nic.rx_free = done;
        let lat = self.params.link_latency;
        let blocks = wire.div_ceil(64) as i32;
        self.return_credits(p, lane, blocks, done + lat + self.params.credit_delay);
        if matches!(k.kind, PktKind::Data | PktKind::DataLast | PktKind::AtomicReq)
            && self.net.loss.is_some()
            && self.loss_receive(n, pkt)
        {
            return; // lost, or dropped by go-back-N (its credits are back)
        }
        match k.kind {
            PktKind::Data | PktKind::DataLast => {
                self.op_bytes[k.prog as usize].rdma_delivered += k.payload as u64;
                // Static routing keeps a QP's packets in order: the last one completes the
                // message. Adaptive routing may reorder them, so count.
                let complete = if self.params.adaptive {
                    let msgs = &mut self.net.msgs;
                    let arrived = &mut msgs.arrived[k.msg as usize];
                    *arrived += 1;
                    *arrived == self.params.packets(msgs.send[k.msg as usize].bytes())
                } else {
                    k.kind == PktKind::DataLast
                };
                if complete {
                    self.push(done, Ev::NicDeliver { pkt, qp: k.qp, msg: k.msg });
                } else {
                    self.net.pkts.remove(pkt);
                }
            }
            PktKind::AtomicReq => self.push(done, Ev::NicDeliver { pkt, qp: k.qp, msg: k.msg }),
            // The requester sees a completion once the CQE is written (a NAK never queues).
            PktKind::Ack | PktKind::AtomicResp | PktKind::Nak => {
                let ev = Ev::NicDeliver { pkt, qp: k.qp, msg: k.msg };
                self.push(done + self.params.rx_latency, ev)
            }
        }
    }

    /// Bring in what delivering `pkt` will read (the packet, its QP, its message or an ACK's
    /// hint): records picked at random among tens of thousands, fetched while the event
    /// before it runs. Slab ids stay in range (slabs never shrink): always an address.
    #[inline(always)]
    pub(crate) fn prefetch_delivery(&self, pkt: u32, qp: u32, msg: u32) {
        self.net.pkts.prefetch(pkt);
        prefetch_at(&self.net.qps, qp as usize);
        self.net.msgs.prefetch_done(msg);
    }

    pub(crate) fn nic_deliver(&mut self, pkt: u32) {
        let k = self.net.pkts[pkt];
        self.net.pkts.remove(pkt);
        match k.kind {
            PktKind::Data | PktKind::DataLast | PktKind::AtomicReq => {
                self.net.msgs.done[k.msg].flags |= ARRIVED;
                self.net.qps[k.qp as usize].arrived += 1;
                self.execute_in_order(k.qp);
            }
            PktKind::Ack | PktKind::AtomicResp => self.complete_upto(k.qp, k.payload),
            PktKind::Nak => self.loss_nak(k.qp, k.payload),
        }
    }

    /// Execute (make visible and acknowledge) the QP's fully arrived messages, in post order.
    fn execute_in_order(&mut self, qp: u32) {
        loop {
            let q = &self.net.qps[qp as usize];
            // None arrived unexecuted: the next one (a record at random, and with in-order
            // delivery never arrived yet) is not read.
            if q.arrived == 0 {
                return;
            }
            let m = q.exec;
            if m == NONE || !self.net.msgs.done(m).arrived_all() {
                return;
            }
            let msg = *self.net.msgs.done(m);
            let q = &mut self.net.qps[qp as usize];
            // The QP's messages execute in post order: this one's sequence number.
            let seq = q.exec_seq;
            q.exec_seq += 1;
            q.exec = msg.next;
            q.arrived -= 1;
            let (src, dst, lane) = (q.nic, q.peer_nic, q.lane);
            // Data is visible in GPU memory after the PCIe write; an atomic's result after the
            // read of its target and then the write.
            let read = if msg.atomic() { self.params.atomic_read } else { 0 };
            let visible = self.now + read + self.params.rx_latency;
            let remote = self.net.msgs.remote(m, &msg);
            self.act_at(visible, remote);
            if let Some(tr) = self.trace.as_mut() {
                use crate::trace::{PID_NIC, TID_NIC_PORT, TID_QP};
                // The message's path through the fabric: post at the requester, delivery at
                // the responder's NIC.
                let (src, dst) =
                    (self.net.qps[qp as usize].nic, self.net.qps[qp as usize].peer_nic);
                tr.name_thread(PID_NIC + dst, TID_NIC_PORT, "tx port");
                tr.flow(
                    "rdma",
                    PID_NIC + src,
                    TID_QP + qp,
                    self.net.msg_posted_at[m as usize],
                    PID_NIC + dst,
                    TID_NIC_PORT,
                    visible,
                );
            }
            let (kind, wire) = if msg.atomic() {
                (PktKind::AtomicResp, self.params.hdr.atomic_resp)
            } else {
                (PktKind::Ack, self.params.hdr.ack)
            };
            let port = self.net.nics[dst as usize].tx_port;
            let li = self.net.li(port as usize, lane as usize);
            let (pending, pos) =
                (self.net.qps[qp as usize].ack_pkt, self.net.qps[qp as usize].ack_pos);
            // Still queued at this NIC: not yet taken from the lane it was pushed to (the
            // lane's count, not the packet record, which may be long evicted or recycled).
            // (Never on an IBGDA QP: none of its ACKs is queued.)
            if kind == PktKind::Ack && pending != NONE && pos >= self.net.lanes[li].popped {
                // Coalesce into the ACK still queued at the NIC.
                self.net.pkts[pending].payload = seq;
                continue;
            }
            self.ensure_op(msg.prog);
            self.op_bytes[msg.prog as usize].wire += wire as u64;
            if self.early_completion(qp, seq, m, &msg) {
                self.complete_upto(qp, seq);
                continue;
            }
            // An ACK acts on (QP, sequence), its message id only a hint: with adaptive routing
            // a later cumulative ACK may already have retired the message.
            let ack = self.net.pkts.insert(Pkt { msg: m, qp, payload: seq, prog: msg.prog, kind });
            if self.net.qps[qp as usize].ibgda {
                // Nothing waits on an IBGDA QP's completions: its ACK (or an atomic's
                // response, which DeepEP never reads) only retires WQEs for the depth check
                // (where a completion later than the NIC's fetch errs on the safe side), and
                // an ACK's 30 bytes (86 on RoCE) per 7.4 KB message load the reverse link by
                // ≈ 0.4 % (1.2 %). As packets they would be a fifth of EP256 LL's events and a
                // sixth of its time, and they change no DeepEP result by more than 0.5 % (1.1 %
                // on RoCE; results/sim/README.md): each completes after the unloaded path.
                let t = self.unloaded_ack_time(dst, src, wire);
                self.push(t, Ev::NicDeliver { pkt: ack, qp, msg: m });
                continue;
            }
            if kind == PktKind::Ack {
                let l = &self.net.lanes[li];
                let pos = l.popped + l.q.len() as u64;
                let q = &mut self.net.qps[qp as usize];
                q.ack_pkt = ack;
                q.ack_pos = pos;
            }
            self.enqueue(port, lane, QEntry { item: ack, wire, from: NONE, dst: src });
        }
    }

    /// Whether message `m` (record `msg`, sequence `seq` of `qp`), executing now, may complete now
    /// instead of when its ACK would arrive. An IBGDA QP's completion is observed only by the
    /// depth check of later posts (`post`) and by the message's local action: none here, and
    /// every earlier message of the QP is complete (an ACK is cumulative), so only the check
    /// could tell; while a QP has no more posts than its depth, its in-flight count never
    /// exceeds the depth, whenever the completions happen. A QP that gets more sets
    /// [`Core::early_acks_overrun`] and the op runs again without early completions. Saves an
    /// event per message and its visit to the QP and message records a round trip later.
    #[inline]
    fn early_completion(&self, qp: u32, seq: u32, m: u32, msg: &MsgDone) -> bool {
        let q = &self.net.qps[qp as usize];
        self.early_acks
            && q.ibgda
            && q.completed == seq
            && self.net.msgs.local(m, msg) == Action::None
            && self.trace.is_none()
            && self.net.loss.is_none()
    }

    /// When a packet of `wire` bytes sent by NIC `from` now completes at NIC `to` over an
    /// idle path: the hops of [`Core::send`] (serialization, link and switch latency,
    /// cut-through) and the receive of [`Core::nic_receive`] (PCIe write, CQE), no queueing.
    pub(crate) fn unloaded_ack_time(&self, from: u32, to: u32, wire: u32) -> Time {
        let p = &self.params;
        let port = self.net.nics[from as usize].tx_port;
        let ser_link = p.link_rate.time(wire as u64);
        let mut ser = self.net.ports[port as usize].rate.time(wire as u64);
        let mut t = self.now;
        for _ in 0..self.net.switch_hops(from, to) {
            t += p.link_latency + p.switch_latency;
            t += if p.cut_through { ser.saturating_sub(ser_link) } else { ser };
            if p.adaptive {
                t += p.adaptive_latency;
            }
            ser = ser_link;
        }
        let (head_t, tail_t) = (t + p.link_latency, t + ser + p.link_latency);
        (head_t + p.pcie_rate.time(wire as u64)).max(tail_t) + p.rx_latency
    }

    /// An ACK for message `seq` completes every earlier message of its QP too (RC ACKs are
    /// cumulative); a stale ACK (already covered) does nothing.
    fn complete_upto(&mut self, qp: u32, seq: u32) {
        while self.net.qps[qp as usize].completed <= seq {
            let head = self.net.qps[qp as usize].head;
            if head == NONE {
                self.violation(format!("ACK on QP {qp} with nothing outstanding"));
                return;
            }
            let msg = *self.net.msgs.done(head);
            let q = &mut self.net.qps[qp as usize];
            // Completions are in post order too: the message's sequence number.
            let seq = q.completed;
            q.head = msg.next;
            if q.head == NONE {
                q.tail = NONE;
            }
            q.completed += 1;
            if self.trace.is_some() {
                self.trace_message(qp, head, seq);
            }
            let local = self.net.msgs.local(head, &msg);
            self.net.msgs.remove(head);
            self.act(local);
        }
    }

    /// Trace a completed work request on its QP's track (post to completion).
    fn trace_message(&mut self, qp: u32, m: u32, seq: u32) {
        use crate::trace::{PID_NIC, TID_QP};
        let q = &self.net.qps[qp as usize];
        let label = self.net.qp_labels[qp as usize];
        let posted_at = self.net.msg_posted_at[m as usize];
        let (pid, tid) = (PID_NIC + q.nic, TID_QP + qp);
        let name = format!(
            "QP {} rank {}->{} #{} (VL{})",
            qp, label.src_rank, label.dst_rank, label.index, q.lane
        );
        let msg = self.net.msgs.send(m);
        let what =
            if msg.atomic() { "atomic".to_string() } else { format!("write {} B", msg.bytes()) };
        let nic = q.nic;
        let now = self.now;
        let tr = self.trace.as_mut().expect("tracing");
        tr.name_process(pid, &format!("NIC {nic}"));
        tr.name_thread(pid, tid, &name);
        tr.span(pid, tid, &what, posted_at, now, crate::trace::SpanArgs::Seq { seq });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::queue::EventQueue;

    /// A fresh two-node `h800-cx7` machine (8 NICs per node, one rail leaf each).
    fn world() -> crate::core::world::World {
        let text = "schema = 1\nname = \"n\"\n[cluster]\nprofile = \"h800-cx7\"\nnodes = 2\n[[job]]\nname = \"t\"\n[job.traffic]\npattern = \"ring\"\nbytes_per_rank = 1024\n";
        let loaded = eptwin_engine::parse("n", text).expect("parse");
        let plan = eptwin_engine::Plan::build(&loaded).expect("plan");
        crate::build_world(&plan, false)
    }

    /// Post one write (or an atomic) on `qp` on an idle fabric and run every event:
    /// post-to-completion time.
    fn round_trip(core: &mut Core, qp: u32, atomic: bool) -> Time {
        let posted = core.now;
        let bytes = if atomic { 0 } else { 1000 };
        core.post(qp, bytes, atomic, Action::None, Action::None, 0);
        core.ring(qp, posted);
        let mut completed = None;
        while let Some((t, ev)) = core.queue.pop() {
            core.now = t;
            core.handle(ev);
            if completed.is_none() && core.net.qps[qp as usize].completed == 1 {
                completed = Some(t);
            }
        }
        assert!(core.violations.is_empty(), "{:?}", core.violations);
        completed.expect("the write completes") - posted
    }

    /// An IBGDA QP's ACK or atomic response, not simulated as a packet, completes its work
    /// request exactly when a queued one does on an idle fabric: the unloaded path follows
    /// the packet hops, through one switch (same rail) and through three (across rails).
    #[test]
    fn unloaded_ack_matches_a_queued_ack_on_an_idle_fabric() {
        let mut w = world();
        let core = &mut w.core;
        core.ensure_op(0);
        let lane = core.jobs[0].lane;
        for peer in [8u32, 9] {
            for atomic in [false, true] {
                let label = QpLabel { job: 0, src_rank: 0, dst_rank: peer, index: 0 };
                let queued = core.create_qp(0, peer, lane, 1024, false, 0, label);
                let unloaded = core.create_qp(0, peer, lane, 1024, true, 0, label);
                let q = round_trip(core, queued, atomic);
                let u = round_trip(core, unloaded, atomic);
                assert_eq!(
                    q, u,
                    "NIC 0 -> NIC {peer}, atomic {atomic}: queued {q} ps, unloaded {u} ps"
                );
                assert!(q > 1_000_000, "a round trip takes over a microsecond: {q} ps");
            }
        }
    }
}
