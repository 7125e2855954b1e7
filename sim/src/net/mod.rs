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

pub mod arb;
pub mod nic;

use eptwin_engine::plan::{FabricKind, FabricTopology, Plan};

use crate::core::queue::EventQueue;
use crate::core::ring::Ring;
use crate::core::slab::{NONE, Slab};
use crate::core::time::{Rate, Time, fmt_us};
use crate::core::{Core, Ev, prefetch, prefetch_at};
use crate::net::arb::{ArbConfig, ArbState, DrrState, LaneMask, MAX_LANES};
use crate::net::nic::{Msgs, Nic, Qp, QpTx};

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

/// A destination NIC as the switches see it: its leaf, its position at the leaf (the down
/// port toward it, and the d-mod-k key), and its static up port (`pos % spines`).
#[derive(Debug, Clone, Copy)]
struct NicRoute {
    leaf: u32,
    pos: u32,
    up: u32,
}

/// Largest route table kept ([`Net`]'s `route_tab`): 16 MiB of ports, a fat tree of ≈ 10 k
/// NICs; larger fabrics compute each hop's port.
const ROUTE_TABLE_MAX: usize = 1 << 22;

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
    /// [`ROUTE_TABLE_MAX`] entries, where the hop computes it.
    route_tab: Vec<u32>,
    /// Starvation reports (port, lane, since) already made.
    pub starved: Vec<(u32, u8)>,
}

impl Net {
    pub fn new(plan: &Plan, params: &crate::params::Params) -> Net {
        let topo = &plan.topology;
        let fabric = &plan.profile.fabric;
        let num_nics = topo.num_gpus();
        let rails = topo.gpus_per_node.max(1);
        let nodes = topo.nodes.max(1);
        let single = fabric.topology == FabricTopology::SingleSwitch;
        let half_radix = (fabric.switch_radix / 2).max(1);
        let nodes_per_leaf = nodes.min(half_radix);
        let leaves_per_rail = nodes.div_ceil(nodes_per_leaf);
        let leaves = rails * leaves_per_rail;
        let spines = if single || leaves <= 1 { 0 } else { nodes_per_leaf };
        let arb = ArbConfig::new(&plan.qos);
        let lossless: LaneMask = match params.kind {
            FabricKind::Infiniband => 0x7FFF,
            FabricKind::Roce => plan
                .qos
                .pfc
                .iter()
                .enumerate()
                .fold(0, |m, (i, &on)| if on { m | 1 << i } else { m }),
        };
        let mut net = Net {
            ports: Vec::new(),
            lanes: Vec::new(),
            nports: 0,
            port_from: Vec::new(),
            port_names: Vec::new(),
            drr: Vec::new(),
            bypassed_since: Vec::new(),
            returns: Vec::new(),
            switches: Vec::new(),
            sw_ports: Vec::new(),
            nics: Vec::new(),
            // Room for the records a large run keeps in flight (EP256 low latency: ≈ 315 k
            // messages, 56 k packets), reserved up front so the slabs never copy themselves.
            pkts: Slab::with_capacity(1 << 17),
            msgs: Msgs::with_capacity(1 << 19),
            qps: Vec::new(),
            qp_labels: Vec::new(),
            msg_posted_at: Vec::new(),
            qp_tx: Vec::new(),
            unschedulable: !arb.schedulable(),
            arb,
            lossless,
            single_lane: None,
            job_lanes: 0,
            reserving: false,
            static_routing: !params.adaptive,
            rails,
            nodes_per_leaf,
            leaves_per_rail,
            single,
            nic_route: Vec::new(),
            route_tab: Vec::new(),
            starved: Vec::new(),
        };
        let credits = params.credits_per_lane;
        let port = |net: &mut Net, rate: Rate, from: Endpoint, to: Endpoint, name: String| -> u32 {
            for lane in 0..MAX_LANES {
                let credits = if net.lossless & (1 << lane) != 0 { credits } else { i32::MAX / 2 };
                net.lanes.push(Lane { q: Ring::default(), head_wire: 0, credits, popped: 0 });
                net.bypassed_since.push(Time::MAX);
            }
            let to = match to {
                Endpoint::Switch(sw) => sw,
                Endpoint::Nic(n) => TO_NIC | n,
            };
            net.ports.push(Port {
                busy_until: 0,
                done_at: Time::MAX,
                wake_at: Time::MAX,
                rate,
                queued_bytes: 0,
                to,
                nonempty: 0,
                bypassed: 0,
                arb: ArbState::new(&net.arb),
            });
            net.port_from.push(from);
            net.drr.push(DrrState::new());
            net.port_names.push(name);
            for _ in 0..MAX_LANES {
                net.returns.push(Ring::default());
            }
            (net.ports.len() - 1) as u32
        };
        // NIC transmit ports first: port id = NIC id.
        for n in 0..num_nics {
            let sw = if single { 0 } else { net.leaf_of(n) };
            let p = port(
                &mut net,
                params.nic_rate,
                Endpoint::Nic(n),
                Endpoint::Switch(sw),
                format!("nic{n}.tx"),
            );
            net.nics.push(Nic::new(p));
        }
        if single {
            let down = net.sw_ports.len() as u32;
            for n in 0..num_nics {
                let p = port(
                    &mut net,
                    params.link_rate,
                    Endpoint::Switch(0),
                    Endpoint::Nic(n),
                    format!("switch.p{n}"),
                );
                net.sw_ports.push(p);
            }
            net.switches.push(Switch {
                name: "switch".into(),
                down,
                n_down: num_nics,
                up: 0,
                n_up: 0,
                spine: false,
            });
            net.finish(spines);
            return net;
        }
        for l in 0..leaves {
            let rail = l / leaves_per_rail;
            let group = l % leaves_per_rail;
            let down = net.sw_ports.len() as u32;
            for i in 0..nodes_per_leaf {
                let node = group * nodes_per_leaf + i;
                let nic = node * rails + rail;
                let to = if node < nodes { Endpoint::Nic(nic) } else { Endpoint::Nic(NONE) };
                let p = port(
                    &mut net,
                    params.link_rate,
                    Endpoint::Switch(l),
                    to,
                    format!("leaf{l}.down{i}"),
                );
                net.sw_ports.push(p);
            }
            let up = net.sw_ports.len() as u32;
            for s in 0..spines {
                let p = port(
                    &mut net,
                    params.link_rate,
                    Endpoint::Switch(l),
                    Endpoint::Switch(leaves + s),
                    format!("leaf{l}.up{s}"),
                );
                net.sw_ports.push(p);
            }
            net.switches.push(Switch {
                name: format!("leaf{l} (rail {rail})"),
                down,
                n_down: nodes_per_leaf,
                up,
                n_up: spines,
                spine: false,
            });
        }
        for s in 0..spines {
            let down = net.sw_ports.len() as u32;
            for l in 0..leaves {
                let p = port(
                    &mut net,
                    params.link_rate,
                    Endpoint::Switch(leaves + s),
                    Endpoint::Switch(l),
                    format!("spine{s}.down{l}"),
                );
                net.sw_ports.push(p);
            }
            net.switches.push(Switch {
                name: format!("spine{s}"),
                down,
                n_down: leaves,
                up: 0,
                n_up: 0,
                spine: true,
            });
        }
        net.finish(spines);
        net
    }

    /// When the earliest pending credit return of (port, lane) `li` is due.
    pub fn earliest_return(&self, li: usize) -> Option<Time> {
        self.returns[li].iter().map(|r| r.due()).min()
    }

    /// Index of (port, lane) in the per-(port, lane) arrays.
    #[inline(always)]
    pub fn li(&self, p: usize, lane: usize) -> usize {
        lane * self.nports + p
    }

    /// The port-major per-(port, lane) arrays built port by port become lane-major, and the
    /// route table is filled.
    fn finish(&mut self, spines: u32) {
        let n = self.ports.len();
        self.nports = n;
        fn transpose<T>(v: &mut Vec<T>, n: usize) {
            let mut cells: Vec<Option<T>> = std::mem::take(v).into_iter().map(Some).collect();
            for lane in 0..MAX_LANES {
                for p in 0..n {
                    v.push(cells[p * MAX_LANES + lane].take().expect("each cell once"));
                }
            }
        }
        transpose(&mut self.lanes, n);
        transpose(&mut self.returns, n);
        transpose(&mut self.bypassed_since, n);
        self.fill_routes(spines);
    }

    /// The output port at switch `sw` toward NIC `dst` where it does not depend on the
    /// fabric's state (NONE: an adaptive choice among up ports).
    #[inline]
    fn static_route(&self, sw: u32, dst: u32) -> u32 {
        if !self.route_tab.is_empty() {
            return self.route_tab[sw as usize * self.nics.len() + dst as usize];
        }
        self.static_route_formula(sw, dst)
    }

    fn static_route_formula(&self, sw: u32, dst: u32) -> u32 {
        let s = &self.switches[sw as usize];
        if self.single {
            return self.sw_ports[(s.down + dst) as usize];
        }
        let r = self.nic_route[dst as usize];
        if s.spine {
            return self.sw_ports[(s.down + r.leaf) as usize];
        }
        if r.leaf == sw {
            return self.sw_ports[(s.down + r.pos) as usize];
        }
        if !self.static_routing {
            return NONE;
        }
        // d-mod-k on the destination's position at its leaf (OpenSM fat-tree routing): the
        // spine-to-leaf link toward each NIC carries that NIC's traffic only.
        debug_assert_eq!(r.up, r.pos % s.n_up);
        self.sw_ports[(s.up + r.up) as usize]
    }

    fn fill_routes(&mut self, spines: u32) {
        self.nic_route = (0..self.nics.len() as u32)
            .map(|dst| {
                let pos = (dst / self.rails) % self.nodes_per_leaf;
                NicRoute { leaf: self.leaf_of(dst), pos, up: pos % spines.max(1) }
            })
            .collect();
        let (switches, nics) = (self.switches.len() as u32, self.nics.len() as u32);
        self.route_tab = if switches as usize * nics as usize <= ROUTE_TABLE_MAX {
            (0..switches)
                .flat_map(|sw| (0..nics).map(move |dst| (sw, dst)))
                .map(|(sw, dst)| self.static_route_formula(sw, dst))
                .collect()
        } else {
            Vec::new()
        };
    }

    /// The leaf switch a NIC hangs off (rail = its index in the node).
    #[inline]
    pub fn leaf_of(&self, nic: u32) -> u32 {
        let node = nic / self.rails;
        let rail = nic % self.rails;
        rail * self.leaves_per_rail + node / self.nodes_per_leaf
    }

    /// Switch hops between two NICs (for latency estimates and tests).
    pub fn switch_hops(&self, a: u32, b: u32) -> u32 {
        if self.single || self.leaf_of(a) == self.leaf_of(b) { 1 } else { 3 }
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
        // A lane no arbitration table lists never leaves (fabric.md §1.1 step 6): the deadlock
        // report names it if the run cannot finish.
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
                prefetch_at(&self.counters.values, counter as usize)
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
            PktKind::Ack | PktKind::AtomicResp => self.net.qps[pkt.qp as usize].peer_nic,
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
        };
        let lossless = self.net.lossless & (1 << lane) != 0;
        let src_nic = self.src_nic(pkt);
        let tr = self.trace.as_mut().expect("tracing");
        tr.name_process(pid, &pname);
        tr.name_thread(pid, tid, &tname);
        let args = format!(
            "\"bytes\":{},\"payload\":{},\"src_nic\":{},\"dst_nic\":{}",
            wire, pkt.payload, src_nic, dst
        );
        tr.span(pid, tid, &format!("VL{} {kind}", lane), now, now + ser, &args);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn net(nodes: u32, radix: u32) -> Net {
        let text = format!(
            "schema = 1\nname = \"n\"\n[cluster]\nprofile = \"h800-cx7\"\nnodes = {nodes}\n[cluster.overrides.fabric]\nswitch_radix = {radix}\n[[job]]\nname = \"t\"\n[job.traffic]\npattern = \"ring\"\nbytes_per_rank = 1024\n"
        );
        let loaded = eptwin_engine::parse("n", &text).expect("parse");
        let plan = Plan::build(&loaded).expect("plan");
        Net::new(&plan, &crate::params::Params::new(&plan))
    }

    /// The route table gives every leaf the port the d-mod-k formula names, for fat trees with
    /// one and with several leaves per rail.
    #[test]
    fn route_table_matches_the_formula() {
        for (nodes, radix) in [(4, 64), (12, 8), (5, 4)] {
            let net = net(nodes, radix);
            assert!(!net.single && net.switches.iter().any(|s| s.spine), "{nodes} nodes");
            for dst in 0..net.nics.len() as u32 {
                let r = net.nic_route[dst as usize];
                let node = dst / net.rails;
                assert_eq!(
                    r.leaf,
                    (dst % net.rails) * net.leaves_per_rail + node / net.nodes_per_leaf
                );
                assert_eq!(r.pos, node % net.nodes_per_leaf);
                for s in net.switches.iter().filter(|s| !s.spine) {
                    assert_eq!(r.up, r.pos % s.n_up);
                }
            }
            // The per-(switch, NIC) port table is the formula, entry for entry.
            assert_eq!(net.route_tab.len(), net.switches.len() * net.nics.len());
            for sw in 0..net.switches.len() as u32 {
                for dst in 0..net.nics.len() as u32 {
                    let port = net.route_tab[sw as usize * net.nics.len() + dst as usize];
                    assert_eq!(port, net.static_route_formula(sw, dst), "switch {sw}, nic {dst}");
                    assert_ne!(port, NONE, "static routing has a port everywhere");
                }
            }
        }
    }

    /// The lane-major arrays hold one cell per (port, lane), each port's lanes with the
    /// credits its lane's flow control gives them.
    #[test]
    fn lane_arrays_are_lane_major() {
        let net = net(4, 64);
        assert_eq!(net.nports, net.ports.len());
        for a in [net.lanes.len(), net.returns.len(), net.bypassed_since.len()] {
            assert_eq!(a, net.nports * MAX_LANES);
        }
        for p in 0..net.nports {
            for lane in 0..MAX_LANES {
                let l = &net.lanes[net.li(p, lane)];
                assert_eq!(l.credits == i32::MAX / 2, net.lossless & (1 << lane) == 0);
            }
        }
        assert_eq!(net.li(3, 2), 2 * net.nports + 3);
    }
}
