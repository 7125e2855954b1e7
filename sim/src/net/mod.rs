//! The packet-level network: NIC and switch output ports with per-lane queues, 64-byte credit
//! flow control per lane, VL arbitration at every output port, cut-through or
//! store-and-forward switches, static (d-mod-k) or adaptive routing over a single switch or a
//! rail-optimized leaf/spine fat tree.
//!
//! Port queues are rings of 16-byte entries (a packet id with what forwarding needs, so a
//! switch hop never reads the packet record), and at a NIC also queue pairs: a QP in the queue stands for "its next packet", produced when
//! the arbiter serves it, so a 1 MiB message never exists as 256 queued packets. Credit
//! returns are lazy: each port keeps a list of returns (in no particular order) and absorbs those that are
//! due when it arbitrates; only a port actually blocked on credits schedules a wake-up.
//!
//! Here the network's state; `topology` builds it (ports, switches, static routes), `ports`
//! is what its output ports do as packets move, `nic` the NICs and queue pairs, `arb` the
//! VL and RoCE arbiters.

pub mod arb;
pub mod nic;
mod ports;
mod topology;

use crate::core::ring::Ring;
use crate::core::slab::Slab;
use crate::core::time::{Rate, Time};
use crate::net::arb::{ArbConfig, ArbState, DrrState, LaneMask};
use crate::net::nic::{Msgs, Nic, Qp, QpTx};
use topology::NicRoute;

/// Marks a port-queue item as a queue pair (else it is a packet).
pub const QP_ITEM: u32 = 1 << 31;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Switch(u32),
    Nic(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PktKind {
    Data,
    /// The last packet of an RDMA write (in PSN order).
    DataLast,
    Ack,
    AtomicReq,
    AtomicResp,
    /// The responder's NAK (PSN sequence error) under packet loss: `payload` is the PSN it
    /// expects (`nic::loss`).
    Nak,
}

/// A packet: what its destination NIC needs beyond what its port queue entry ([`QEntry`])
/// and events carry (wire bytes, destination NIC, lane: every hop has them at hand, so they
/// are not stored twice). Switch hops never touch it. Its source NIC is not stored: the trace
/// derives it from its QP. 16 bytes, aligned: four to a cache line.
#[derive(Debug, Clone, Copy)]
#[repr(align(16))]
pub struct Pkt {
    /// The message (data, atomic request); for an ACK (atomic response) its first
    /// acknowledged message, most likely the requester's oldest outstanding one: a prefetch
    /// hint only (the record may be retired by then; an ACK acts on its QP and `payload`).
    pub msg: u32,
    /// The QP the packet belongs to (so the event loop can fetch its record ahead of a
    /// delivery without reading the message first).
    pub qp: u32,
    /// Payload bytes (data); the sequence number acknowledged (ACK, atomic response).
    pub payload: u32,
    /// The op (program) the packet is charged to.
    pub prog: u16,
    pub kind: PktKind,
}

/// An item in a port lane's queue: a packet with what forwarding it needs (its wire bytes,
/// the port whose input buffer it occupies, its destination), or `QP_ITEM | qp` (the QP's
/// next packet, produced when served).
#[derive(Debug, Clone, Copy)]
pub struct QEntry {
    pub item: u32,
    pub wire: u32,
    /// A packet: the port whose credits it holds (the link it came in on); NONE at a NIC.
    /// A QP: the message its next message boundary reads (a prefetch hint only: NONE when
    /// none was posted yet when the QP was queued).
    pub from: u32,
    pub dst: u32,
}

/// An output port's hot state: exactly one cache line. Its lanes live in [`Net::lanes`], the
/// rarely used parts (name, RoCE DRR state, starvation watch) in side arrays.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
pub struct Port {
    pub busy_until: Time,
    /// When the scheduled `PortDone` fires (Time::MAX: none). Only a busy port with more queued
    /// has one: an idle path costs no event per packet.
    pub done_at: Time,
    /// Pending `PortWake` (Time::MAX: none).
    pub wake_at: Time,
    pub rate: Rate,
    /// Bytes queued (adaptive routing looks at it).
    pub queued_bytes: u64,
    /// Where the port leads: a switch, or a NIC when [`TO_NIC`] is set.
    pub to: u32,
    pub nonempty: LaneMask,
    /// Lanes whose `bypassed_since` is set (so a send clears it without touching the array).
    pub bypassed: LaneMask,
    pub arb: ArbState,
}

/// A pending credit return, one word: its due time (below 2^48 ps ≈ 281 s, past the run
/// limit) above the blocks returned (a packet's, at most 1,024 for 64 KiB). Half the size of a
/// (time, blocks) pair, so a lane's list of returns takes half the cache lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CreditReturn(u64);

impl CreditReturn {
    #[inline(always)]
    pub fn new(due: Time, blocks: i32) -> CreditReturn {
        debug_assert!(due < 1 << 48 && (0..1 << 16).contains(&blocks));
        CreditReturn(due << 16 | blocks as u64)
    }

    #[inline(always)]
    pub fn due(self) -> Time {
        self.0 >> 16
    }

    #[inline(always)]
    pub fn blocks(self) -> i32 {
        (self.0 & 0xFFFF) as i32
    }
}

/// Set in `Ev::SwitchArrive::lane` when the switch reached delivers to the destination NIC.
pub const LAST_HOP: u8 = 0x80;

/// `Port::to` names a NIC (else a switch).
pub const TO_NIC: u32 = 1 << 31;

/// Per (port, lane): the queue (a ring of [`QEntry`]), the head's wire bytes and the credits
/// in hand.
#[derive(Debug, Clone, Default)]
pub struct Lane {
    pub q: Ring<QEntry>,
    /// Wire bytes of the head item (arbitration reads only this record).
    pub head_wire: u32,
    pub credits: i32,
    /// Items ever taken from the front of `q`: an item pushed when `popped + q.len()` was `n`
    /// is still queued while `popped <= n` (a NIC's ACK can absorb later completions until
    /// it leaves; [`crate::net::nic::Qp::ack_pos`]).
    pub popped: u64,
}

#[derive(Debug, Clone)]
pub struct Switch {
    pub name: String,
    /// `sw_ports[down..down + n_down]` reach NICs (leaf, single) or leaves (spine).
    pub down: u32,
    pub n_down: u32,
    pub up: u32,
    pub n_up: u32,
    pub spine: bool,
}

/// How long a lane may be passed over by the high-priority table before it counts as starved.
pub const STARVATION_PS: Time = 1_000_000_000; // 1 ms

pub struct Net {
    pub ports: Vec<Port>,
    /// Per (port, lane), at [`Net::li`]: lane-major, so the one lane most runs use is a dense
    /// array over the ports instead of one record per 16 (one cache line per port touched).
    pub lanes: Vec<Lane>,
    /// Ports, the stride of the lane-major per-(port, lane) arrays.
    pub nports: usize,
    /// Where each port is (its transmitter side) and its name, for messages and the trace.
    pub port_from: Vec<Endpoint>,
    pub port_names: Vec<String>,
    pub drr: Vec<DrrState>,
    /// Per (port, lane) at [`Net::li`]: since when the lane has been eligible but passed over by the high
    /// table (starvation), Time::MAX when not.
    pub bypassed_since: Vec<Time>,
    /// Pending credit returns per (port, lane) at [`Net::li`]: (due time, blocks), in the order
    /// they were made (not their due order: a port's absorption takes every one due, and the
    /// earliest is looked for only by a port blocked on credits).
    pub returns: Vec<Ring<CreditReturn>>,
    pub switches: Vec<Switch>,
    pub sw_ports: Vec<u32>,
    pub nics: Vec<Nic>,
    pub pkts: Slab<Pkt>,
    pub msgs: Msgs,
    pub qps: Vec<Qp>,
    /// Who each QP belongs to (for messages only; apart from the hot [`Qp`]).
    pub qp_labels: Vec<crate::net::nic::QpLabel>,
    /// Each message's post time, recorded only when tracing (the trace's flows and spans).
    pub msg_posted_at: Vec<Time>,
    /// The send side of each QP (what a packet touches), apart from the rest of the QP.
    pub qp_tx: Vec<QpTx>,
    pub arb: ArbConfig,
    /// Lanes whose traffic the arbiter never schedules (not in any table).
    pub unschedulable: LaneMask,
    pub lossless: LaneMask,
    /// The lane every QP of the run uses when there is only one (and it is schedulable): ports
    /// then never arbitrate between lanes, so the arbiter's state is never consulted.
    pub single_lane: Option<u8>,
    /// Lanes the run's jobs use.
    pub job_lanes: LaneMask,
    /// Switch output ports reserve arriving packets when nothing is queued ([`Core::reserve`]):
    /// a single lane and static routing.
    pub reserving: bool,
    /// Routing does not depend on the fabric's state (not adaptive).
    static_routing: bool,
    // Geometry of the rail-optimized fat tree.
    rails: u32,
    nodes_per_leaf: u32,
    leaves_per_rail: u32,
    single: bool,
    /// Per destination NIC, what every switch's forwarding decision needs (its leaf, its
    /// position there and the static up port), computed once: a hop does no division.
    nic_route: Vec<NicRoute>,
    /// Per (switch, destination NIC), at `sw * nics + dst`: the output port where it does not
    /// depend on the fabric's state (NONE: an adaptive choice). One load per hop instead of
    /// three records and two data-dependent branches (spine or leaf, local or up); empty above
    /// `topology::ROUTE_TABLE_MAX` entries, where the hop computes it.
    route_tab: Vec<u32>,
    /// Starvation reports (port, lane, since) already made.
    pub starved: Vec<(u32, u8)>,
    /// RC recovery state under packet loss or a NIC down (`nic::loss`); `None` on a healthy
    /// fabric, which never touches it.
    pub loss: Option<Box<nic::Loss>>,
}
impl Net {
    /// When the earliest pending credit return of (port, lane) `li` is due.
    pub fn earliest_return(&self, li: usize) -> Option<Time> {
        self.returns[li].iter().map(|r| r.due()).min()
    }

    /// Index of (port, lane) in the per-(port, lane) arrays.
    #[inline(always)]
    pub fn li(&self, p: usize, lane: usize) -> usize {
        lane * self.nports + p
    }

    /// The lanes the run's jobs use (every QP is on its job's lane).
    pub fn set_job_lanes(&mut self, lanes: LaneMask) {
        self.job_lanes = lanes;
        let schedulable = !self.unschedulable;
        self.single_lane = (lanes.count_ones() == 1 && lanes & schedulable != 0)
            .then(|| lanes.trailing_zeros() as u8);
        self.reserving = self.single_lane.is_some() && self.static_routing;
    }

    pub fn lanes_in_use(&self) -> LaneMask {
        self.ports.iter().fold(0, |m, p| m | p.nonempty)
    }
}
