//! The packet-level network: NIC and switch output ports with per-lane queues, 64-byte credit
//! flow control per lane, VL arbitration at every output port, cut-through or
//! store-and-forward switches, static (d-mod-k) or adaptive routing over a single switch or a
//! rail-optimized leaf/spine fat tree.
//!
//! Port queues hold packet ids linked through the packet records (no allocation per packet),
//! and at a NIC also queue pairs: a QP in the queue stands for "its next packet", produced when
//! the arbiter serves it, so a 1 MiB message never exists as 256 queued packets. Credit
//! returns are lazy: each port keeps a time-ordered list of returns and absorbs those that are
//! due when it arbitrates; only a port actually blocked on credits schedules a wake-up.

use std::collections::VecDeque;

use eptwin_engine::Plan;
use eptwin_engine::scenario::schema::FabricTopology;

use crate::arb::{ArbConfig, ArbState, LaneMask, MAX_LANES};
use crate::core::{Core, Ev};
use crate::nic::{Msg, Nic, Qp};
use crate::slab::{NONE, Slab};
use crate::time::{Rate, Time, fmt_us};

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

#[derive(Debug, Clone, Copy)]
pub struct Pkt {
    pub msg: u32,
    pub wire: u32,
    pub payload: u32,
    pub src_nic: u32,
    pub dst_nic: u32,
    /// The port whose credits this packet occupies (the link it arrived on), NONE at a NIC.
    pub from_port: u32,
    pub next: u32,
    /// Wire bytes of the item queued after this one (so a dequeue needs no further lookup).
    pub next_wire: u32,
    pub lane: u8,
    pub kind: PktKind,
    /// The op (program) the packet is charged to.
    pub prog: u16,
}

impl Pkt {
    #[inline]
    pub fn blocks(&self) -> i32 {
        self.wire.div_ceil(64) as i32
    }
}

#[derive(Debug, Clone)]
pub struct Port {
    pub rate: Rate,
    pub latency: Time,
    pub to: Endpoint,
    /// Where the port is (its transmitter side).
    pub from: Endpoint,
    /// Where the port sits, for messages ("nic 3", "leaf 2 up 1").
    /// When the scheduled `PortDone` fires (Time::MAX: none). Only a busy port with more queued
    /// has one: an idle path costs no event per packet.
    pub done_at: Time,
    pub busy_until: Time,
    /// Per lane: queue head and tail, the head's wire bytes (so arbitration touches no
    /// packet) and the credits in hand — one 16-byte record per lane for locality.
    pub lanes: [Lane; MAX_LANES],
    pub nonempty: LaneMask,
    pub arb: ArbState,
    /// Pending `PortWake` (Time::MAX: none).
    pub wake_at: Time,
    /// Bytes queued (adaptive routing looks at it).
    pub queued_bytes: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub busy_ps: Time,
    /// Since when a lane has been eligible but passed over by the high table (starvation).
    pub bypassed_since: [Time; MAX_LANES],
}

#[derive(Debug, Clone, Copy)]
pub struct Lane {
    pub head: u32,
    pub tail: u32,
    pub head_wire: u32,
    pub credits: i32,
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
    pub port_names: Vec<String>,
    /// Pending credit returns per (port, lane): (due time, blocks), time-ordered.
    pub returns: Vec<VecDeque<(Time, u32)>>,
    pub switches: Vec<Switch>,
    pub sw_ports: Vec<u32>,
    pub nics: Vec<Nic>,
    pub pkts: Slab<Pkt>,
    pub msgs: Slab<Msg>,
    pub qps: Vec<Qp>,
    pub arb: ArbConfig,
    /// Lanes whose traffic the arbiter never schedules (not in any table).
    pub unschedulable: LaneMask,
    pub lossless: LaneMask,
    // Geometry of the rail-optimized fat tree.
    rails: u32,
    nodes_per_leaf: u32,
    leaves_per_rail: u32,
    single: bool,
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
            eptwin_engine::scenario::schema::FabricKind::Infiniband => 0x7FFF,
            eptwin_engine::scenario::schema::FabricKind::Roce => plan
                .qos
                .pfc
                .iter()
                .enumerate()
                .fold(0, |m, (i, &on)| if on { m | 1 << i } else { m }),
        };
        let mut net = Net {
            ports: Vec::new(),
            port_names: Vec::new(),
            returns: Vec::new(),
            switches: Vec::new(),
            sw_ports: Vec::new(),
            nics: Vec::new(),
            pkts: Slab::default(),
            msgs: Slab::default(),
            qps: Vec::new(),
            unschedulable: !arb.schedulable(),
            arb,
            lossless,
            rails,
            nodes_per_leaf,
            leaves_per_rail,
            single,
            starved: Vec::new(),
        };
        let credits = params.credits_per_lane;
        let port = |net: &mut Net, rate: Rate, from: Endpoint, to: Endpoint, name: String| -> u32 {
            let mut lanes = [Lane { head: NONE, tail: NONE, head_wire: 0, credits: 0 }; MAX_LANES];
            for (lane, v) in lanes.iter_mut().enumerate() {
                v.credits = if net.lossless & (1 << lane) != 0 { credits } else { i32::MAX / 2 };
            }
            net.ports.push(Port {
                rate,
                latency: params.link_latency,
                to,
                from,
                done_at: Time::MAX,
                busy_until: 0,
                lanes,
                nonempty: 0,
                arb: ArbState::new(&net.arb),
                wake_at: Time::MAX,
                queued_bytes: 0,
                tx_bytes: 0,
                tx_packets: 0,
                busy_ps: 0,
                bypassed_since: [Time::MAX; MAX_LANES],
            });
            net.port_names.push(name);
            for _ in 0..MAX_LANES {
                net.returns.push(VecDeque::new());
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
        net
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

    pub fn lanes_in_use(&self) -> LaneMask {
        self.ports.iter().fold(0, |m, p| m | p.nonempty)
    }
}

impl Core {
    /// Output port at switch `sw` toward NIC `dst`.
    fn route(&mut self, sw: u32, dst: u32) -> u32 {
        let net = &self.net;
        let s = &net.switches[sw as usize];
        if net.single {
            return net.sw_ports[(s.down + dst) as usize];
        }
        if s.spine {
            return net.sw_ports[(s.down + net.leaf_of(dst)) as usize];
        }
        if net.leaf_of(dst) == sw {
            let node = dst / net.rails;
            return net.sw_ports[(s.down + node % net.nodes_per_leaf) as usize];
        }
        let n_up = s.n_up;
        let dst_pos = (dst / net.rails) % net.nodes_per_leaf;
        if !self.params.adaptive {
            // d-mod-k on the destination's position at its leaf (OpenSM fat-tree routing): the
            // spine-to-leaf link toward each NIC carries that NIC's traffic only.
            return net.sw_ports[(s.up + dst_pos % n_up) as usize];
        }
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

    /// Append an item (packet, or `QP_ITEM | qp`) to a port lane and try to send.
    pub fn enqueue(&mut self, p: u32, lane: u8, item: u32, bytes: u32) {
        let l = lane as usize;
        {
            let port = &mut self.net.ports[p as usize];
            let tail = port.lanes[l].tail;
            if tail == NONE {
                port.lanes[l].head = item;
                port.lanes[l].head_wire = bytes;
            } else {
                self.set_next(tail, item, bytes);
            }
            let port = &mut self.net.ports[p as usize];
            port.lanes[l].tail = item;
            port.nonempty |= 1 << lane;
            port.queued_bytes += bytes as u64;
        }
        self.set_next(item, NONE, 0);
        // A lane no arbitration table lists never leaves (fabric.md §1.1 step 6): the deadlock
        // report names it if the run cannot finish.
        self.try_start(p);
    }

    #[inline]
    pub(crate) fn set_next(&mut self, item: u32, next: u32, next_wire: u32) {
        if item & QP_ITEM != 0 {
            let q = &mut self.net.qps[(item & !QP_ITEM) as usize];
            q.port_next = next;
            q.port_next_wire = next_wire;
        } else {
            let k = &mut self.net.pkts[item];
            k.next = next;
            k.next_wire = next_wire;
        }
    }

    /// Absorb the credit returns of (port, lane) that are due.
    #[inline]
    fn absorb_credits(&mut self, p: u32, lane: usize) -> i32 {
        let now = self.now;
        let q = &mut self.net.returns[p as usize * MAX_LANES + lane];
        let mut got = 0i32;
        while let Some(&(t, b)) = q.front() {
            if t > now {
                break;
            }
            got += b as i32;
            q.pop_front();
        }
        let port = &mut self.net.ports[p as usize];
        port.lanes[lane].credits += got;
        port.lanes[lane].credits
    }

    /// Return `blocks` credits of `lane` to port `p` at time `t` (kept time-ordered).
    #[inline]
    pub fn return_credits(&mut self, p: u32, lane: u8, blocks: i32, t: Time) {
        if self.net.lossless & (1 << lane) == 0 {
            return;
        }
        let q = &mut self.net.returns[p as usize * MAX_LANES + lane as usize];
        let t = q.back().map_or(t, |&(last, _)| t.max(last));
        q.push_back((t, blocks as u32));
        // A port idle for lack of credits must learn about them.
        let port = &self.net.ports[p as usize];
        if port.done_at == Time::MAX && port.nonempty & (1 << lane) != 0 && port.wake_at > t {
            self.net.ports[p as usize].wake_at = t;
            self.push(t, Ev::PortWake(p));
        }
    }

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
    pub(crate) fn try_start(&mut self, p: u32) {
        let pi = p as usize;
        let now = self.now;
        if self.net.ports[pi].nonempty == 0 {
            return;
        }
        if now < self.net.ports[pi].busy_until {
            // Busy: make sure it looks at its queue again when the packet is out.
            let port = &mut self.net.ports[pi];
            if port.done_at != port.busy_until {
                let t = port.busy_until;
                port.done_at = t;
                self.push(t, Ev::PortDone(p));
            }
            return;
        }
        let mut eligible: LaneMask = 0;
        let mut sizes = [0u32; MAX_LANES];
        let mut next_return = Time::MAX;
        let mut lanes = self.net.ports[pi].nonempty;
        while lanes != 0 {
            let lane = lanes.trailing_zeros() as usize;
            lanes &= lanes - 1;
            let wire = self.net.ports[pi].lanes[lane].head_wire;
            sizes[lane] = wire;
            let need = wire.div_ceil(64) as i32;
            // Returned credits are absorbed only when the ones in hand do not suffice: they
            // only ever add, and most of the time the buffer is far from full.
            let mut credits = self.net.ports[pi].lanes[lane].credits;
            if credits < need {
                credits = self.absorb_credits(p, lane);
            }
            if credits >= need {
                eligible |= 1 << lane;
            } else if let Some(&(t, _)) = self.net.returns[pi * MAX_LANES + lane].front() {
                next_return = next_return.min(t);
            }
        }
        if eligible == 0 {
            if next_return != Time::MAX && self.net.ports[pi].wake_at > next_return {
                self.net.ports[pi].wake_at = next_return;
                self.push(next_return, Ev::PortWake(p));
            }
            return;
        }
        let arb_cfg = &self.net.arb;
        let Some(pick) = self.net.ports[pi].arb.pick(arb_cfg, eligible, |l| sizes[l as usize])
        else {
            return; // only unschedulable lanes are eligible: they stall
        };
        if pick.bypassed != 0 {
            self.watch_starvation(p, pick.bypassed);
        }
        let lane = pick.lane as usize;
        self.net.ports[pi].bypassed_since[lane] = Time::MAX;
        let head = self.net.ports[pi].lanes[lane].head;
        let pkt_id = if head & QP_ITEM != 0 {
            self.take_qp_packet(p, lane as u8, head & !QP_ITEM)
        } else {
            let (next, next_wire) = {
                let k = &self.net.pkts[head];
                (k.next, k.next_wire)
            };
            let port = &mut self.net.ports[pi];
            port.lanes[lane].head = next;
            port.lanes[lane].head_wire = next_wire;
            if next == NONE {
                port.lanes[lane].tail = NONE;
                port.nonempty &= !(1 << lane);
            }
            head
        };
        let pkt = self.net.pkts[pkt_id];
        if pkt.kind == PktKind::Ack {
            // Once on the wire an ACK can no longer absorb later completions.
            let q = &mut self.net.qps[pkt.msg as usize];
            if q.ack_pkt == pkt_id {
                q.ack_pkt = NONE;
            }
        }
        let blocks = pkt.blocks();
        let ser = {
            let arb_cfg = &self.net.arb;
            let port = &mut self.net.ports[pi];
            port.arb.sent(arb_cfg, lane as u8, pkt.wire);
            if port.lanes[lane].credits < blocks && self.net.lossless & (1 << lane) != 0 {
                let msg = format!(
                    "credit overdraft on {} lane {lane}: {} credits, packet needs {blocks}",
                    self.net.port_names[pi], port.lanes[lane].credits
                );
                self.violations.push(msg);
            }
            let port = &mut self.net.ports[pi];
            port.lanes[lane].credits -= blocks;
            if now < port.busy_until {
                let msg = format!(
                    "link above capacity: {} starts a packet at {} while busy until {}",
                    self.net.port_names[pi],
                    fmt_us(now),
                    fmt_us(port.busy_until)
                );
                self.violations.push(msg);
            }
            let port = &mut self.net.ports[pi];
            let ser = port.rate.time(pkt.wire as u64);
            port.busy_until = now + ser;
            port.busy_ps += ser;
            port.tx_bytes += pkt.wire as u64;
            port.tx_packets += 1;
            port.queued_bytes = port.queued_bytes.saturating_sub(pkt.wire as u64);
            ser
        };
        if self.net.ports[pi].nonempty != 0 {
            self.net.ports[pi].done_at = now + ser;
            self.push(now + ser, Ev::PortDone(p));
        } else {
            self.net.ports[pi].done_at = Time::MAX;
        }
        // The packet leaves the input buffer it sat in: credits flow back upstream.
        if pkt.from_port != NONE {
            let up = &self.net.ports[pkt.from_port as usize];
            let t = now + up.latency + self.params.credit_delay;
            self.return_credits(pkt.from_port, lane as u8, blocks, t);
        }
        if self.trace.is_some() {
            self.trace_packet(p, now, ser, &pkt);
        }
        let latency = self.net.ports[pi].latency;
        match self.net.ports[pi].to {
            Endpoint::Switch(sw) => {
                let ser_next = self.params.link_rate.time(pkt.wire as u64);
                let mut t = now + latency + self.params.switch_latency;
                if self.params.cut_through {
                    // The next hop cannot finish before the tail is in.
                    t += ser.saturating_sub(ser_next);
                } else {
                    t += ser;
                }
                if self.params.adaptive {
                    t += self.params.adaptive_latency;
                }
                self.net.pkts[pkt_id].from_port = p;
                self.push(t, Ev::SwitchArrive { sw, pkt: pkt_id });
            }
            Endpoint::Nic(n) => self.nic_receive(n, p, pkt_id, now + latency, now + ser + latency),
        }
    }

    /// Trace one packet on its port's track, with credit and queue counters.
    fn trace_packet(&mut self, p: u32, now: Time, ser: Time, pkt: &Pkt) {
        use crate::trace::{PID_NIC, PID_SWITCH, TID_NIC_PORT};
        let port = &self.net.ports[p as usize];
        let (pid, tid, pname) = match port.from {
            Endpoint::Nic(n) => (PID_NIC + n, TID_NIC_PORT, format!("NIC {n}")),
            Endpoint::Switch(s) => (PID_SWITCH + s, p, self.net.switches[s as usize].name.clone()),
        };
        let tname = self.net.port_names[p as usize].clone();
        let credits = port.lanes[pkt.lane as usize].credits;
        let queued = port.queued_bytes;
        let kind = match pkt.kind {
            PktKind::Data | PktKind::DataLast => "data",
            PktKind::Ack => "ack",
            PktKind::AtomicReq => "atomic",
            PktKind::AtomicResp => "atomic-resp",
        };
        let lossless = self.net.lossless & (1 << pkt.lane) != 0;
        let tr = self.trace.as_mut().expect("tracing");
        tr.name_process(pid, &pname);
        tr.name_thread(pid, tid, &tname);
        let args = format!(
            "\"bytes\":{},\"payload\":{},\"src_nic\":{},\"dst_nic\":{}",
            pkt.wire, pkt.payload, pkt.src_nic, pkt.dst_nic
        );
        tr.span(pid, tid, &format!("VL{} {kind}", pkt.lane), now, now + ser, &args);
        if lossless {
            let name = format!("{tname} VL{} credits", pkt.lane);
            tr.counter(pid, (p, pkt.lane), &name, now, "credits", credits as i64);
        }
        tr.counter(pid, (p, 255), &format!("{tname} queue"), now, "bytes", queued as i64);
    }

    fn watch_starvation(&mut self, p: u32, bypassed: LaneMask) {
        let now = self.now;
        let mut lanes = bypassed;
        while lanes != 0 {
            let lane = lanes.trailing_zeros() as usize;
            lanes &= lanes - 1;
            let since = &mut self.net.ports[p as usize].bypassed_since[lane];
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

    pub(crate) fn switch_arrive(&mut self, sw: u32, pkt: u32) {
        let (dst, lane, wire) = {
            let k = &self.net.pkts[pkt];
            (k.dst_nic, k.lane, k.wire)
        };
        let out = self.route(sw, dst);
        self.enqueue(out, lane, pkt, wire);
    }
}
