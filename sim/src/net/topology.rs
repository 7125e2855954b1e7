//! Building the network from the plan: NIC and switch ports of a single switch or a
//! rail-optimized leaf/spine fat tree, and the static routes (d-mod-k), tabulated per
//! (switch, destination NIC) where the table is small enough.

use eptwin_engine::api::{FabricKind, FabricTopology, Plan};

use super::{Endpoint, Lane, Net, Port, Switch, TO_NIC};
use crate::core::ring::Ring;
use crate::core::slab::{NONE, Slab};
use crate::core::time::{Rate, Time};
use crate::net::arb::{ArbConfig, ArbState, DrrState, LaneMask, MAX_LANES};
use crate::net::nic::{Msgs, Nic};

/// A destination NIC as the switches see it: its leaf, its position at the leaf (the down
/// port toward it, and the d-mod-k key), and its static up port (`pos % spines`).
#[derive(Debug, Clone, Copy)]
pub(super) struct NicRoute {
    pub(super) leaf: u32,
    pub(super) pos: u32,
    pub(super) up: u32,
}

/// The fat tree's size: leaf and spine switches, nodes.
#[derive(Debug, Clone, Copy)]
struct FatTree {
    leaves: u32,
    spines: u32,
    nodes: u32,
}

/// Largest route table kept ([`Net`]'s `route_tab`): 16 MiB of ports, a fat tree of ≈ 10 k
/// NICs; larger fabrics compute each hop's port.
const ROUTE_TABLE_MAX: usize = 1 << 22;

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
        // NIC transmit ports first: port id = NIC id.
        for n in 0..num_nics {
            let sw = if single { 0 } else { net.leaf_of(n) };
            let p = net.add_port(
                credits,
                params.nic_rate,
                Endpoint::Nic(n),
                Endpoint::Switch(sw),
                format!("nic{n}.tx"),
            );
            net.nics.push(Nic::new(p));
        }
        if single {
            net.add_single_switch(num_nics, params.link_rate, credits);
        } else {
            net.add_fat_tree(FatTree { leaves, spines, nodes }, params.link_rate, credits);
        }
        net.finish(spines);
        net
    }

    /// One port with its `MAX_LANES` lanes (`credits` each on lossless lanes) and credit-return
    /// rings; its id.
    fn add_port(
        &mut self,
        credits: i32,
        rate: Rate,
        from: Endpoint,
        to: Endpoint,
        name: String,
    ) -> u32 {
        for lane in 0..MAX_LANES {
            let credits = if self.lossless & (1 << lane) != 0 { credits } else { i32::MAX / 2 };
            self.lanes.push(Lane { q: Ring::default(), head_wire: 0, credits, popped: 0 });
            self.bypassed_since.push(Time::MAX);
        }
        let to = match to {
            Endpoint::Switch(sw) => sw,
            Endpoint::Nic(n) => TO_NIC | n,
        };
        self.ports.push(Port {
            busy_until: 0,
            done_at: Time::MAX,
            wake_at: Time::MAX,
            rate,
            queued_bytes: 0,
            to,
            nonempty: 0,
            bypassed: 0,
            arb: ArbState::new(&self.arb),
        });
        self.port_from.push(from);
        self.drr.push(DrrState::new());
        self.port_names.push(name);
        for _ in 0..MAX_LANES {
            self.returns.push(Ring::default());
        }
        (self.ports.len() - 1) as u32
    }

    /// The single switch: one down port per NIC.
    fn add_single_switch(&mut self, num_nics: u32, link_rate: Rate, credits: i32) {
        let down = self.sw_ports.len() as u32;
        for n in 0..num_nics {
            let p = self.add_port(
                credits,
                link_rate,
                Endpoint::Switch(0),
                Endpoint::Nic(n),
                format!("switch.p{n}"),
            );
            self.sw_ports.push(p);
        }
        self.switches.push(Switch {
            name: "switch".into(),
            down,
            n_down: num_nics,
            up: 0,
            n_up: 0,
            spine: false,
        });
    }

    /// The rail-optimized fat tree: every leaf's down and up ports, then every spine's.
    fn add_fat_tree(&mut self, shape: FatTree, link_rate: Rate, credits: i32) {
        let FatTree { leaves, spines, nodes } = shape;
        let (rails, nodes_per_leaf, leaves_per_rail) =
            (self.rails, self.nodes_per_leaf, self.leaves_per_rail);
        for l in 0..leaves {
            let rail = l / leaves_per_rail;
            let group = l % leaves_per_rail;
            let down = self.sw_ports.len() as u32;
            for i in 0..nodes_per_leaf {
                let node = group * nodes_per_leaf + i;
                let nic = node * rails + rail;
                let to = if node < nodes { Endpoint::Nic(nic) } else { Endpoint::Nic(NONE) };
                let p = self.add_port(
                    credits,
                    link_rate,
                    Endpoint::Switch(l),
                    to,
                    format!("leaf{l}.down{i}"),
                );
                self.sw_ports.push(p);
            }
            let up = self.sw_ports.len() as u32;
            for s in 0..spines {
                let p = self.add_port(
                    credits,
                    link_rate,
                    Endpoint::Switch(l),
                    Endpoint::Switch(leaves + s),
                    format!("leaf{l}.up{s}"),
                );
                self.sw_ports.push(p);
            }
            self.switches.push(Switch {
                name: format!("leaf{l} (rail {rail})"),
                down,
                n_down: nodes_per_leaf,
                up,
                n_up: spines,
                spine: false,
            });
        }
        for s in 0..spines {
            let down = self.sw_ports.len() as u32;
            for l in 0..leaves {
                let p = self.add_port(
                    credits,
                    link_rate,
                    Endpoint::Switch(leaves + s),
                    Endpoint::Switch(l),
                    format!("spine{s}.down{l}"),
                );
                self.sw_ports.push(p);
            }
            self.switches.push(Switch {
                name: format!("spine{s}"),
                down,
                n_down: leaves,
                up: 0,
                n_up: 0,
                spine: true,
            });
        }
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
    pub(super) fn static_route(&self, sw: u32, dst: u32) -> u32 {
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
