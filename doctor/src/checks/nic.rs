//! RDMA devices and ports: what is there, port state and MTU, the RoCE GID table and index,
//! SL/traffic class against the link layer, and whether RoCE rails reach each other.

use eptwin_engine::api::{EpMode, FabricKind};

use super::affinity::used_nics;
use super::{Ctx, skip};
use crate::facts::{Gid, Nic};
use crate::parse;
use crate::report::{Finding, Status};

const DEVICES: &str = "RDMA devices";
pub const NO_PORT: &str = "no RDMA port, internode will waive";

pub fn devices(ctx: &Ctx<'_>) -> Finding {
    let nics = &ctx.facts.nics;
    if nics.is_empty() {
        let (status, more) = match ctx.subject {
            Some(s) if s.needs_rdma() => {
                (Status::Fail, format!("; scenario {} spans {} nodes", s.name, s.nodes))
            }
            Some(_) => (Status::Ok, "; the scenario's jobs stay within the node".to_string()),
            None => (Status::Warn, String::new()),
        };
        let f = Finding::new(
            "rdma-devices",
            DEVICES,
            status,
            format!("{NO_PORT} (/sys/class/infiniband is empty){more}"),
        );
        return if status == Status::Ok {
            f
        } else {
            f.why("internode DeepEP (V1 normal internode and LL across nodes, V2 scale-out) moves data over RDMA NICs; eptwin's hardware backend reports such runs as waived (77)", &[])
                .fix("run internode jobs on nodes with RDMA NICs (`ibv_devinfo` lists them); load the NIC driver (mlx5_ib) if the NIC is there")
        };
    }
    let details: Vec<String> = nics
        .iter()
        .map(|n| {
            let vf = n.physfn.as_ref().map(|p| format!(", SR-IOV VF of {p}")).unwrap_or_default();
            format!(
                "{}: driver {}, {} at {}, NUMA {}, {}{vf}",
                n.name,
                n.driver.as_deref().unwrap_or("?"),
                n.hca_type.as_deref().unwrap_or("?"),
                n.bdf.as_deref().unwrap_or("no PCI device"),
                n.numa.map(|x| x.to_string()).unwrap_or("?".into()),
                n.uverbs.as_deref().unwrap_or("no uverbs device")
            )
        })
        .collect();
    let mlx5 = nics.iter().filter(|n| n.is_mlx5()).count();
    let saw = format!("{} RDMA device(s), {mlx5} mlx5", nics.len());
    if mlx5 == 0 && ctx.gpu_rdma_matters() {
        return Finding::new("rdma-devices", DEVICES, Status::Fail, saw)
            .details(details)
            .why("DeepEP's GPU-initiated RDMA (NVSHMEM IBGDA in V1, NCCL GIN in V2) builds mlx5 work queues itself (DEVX): any other NIC fails with \"init failed for transport: IBGDA\"", &["DeepEP #759"])
            .fix("use NVIDIA ConnectX (mlx5) NICs for DeepEP's internode traffic");
    }
    Finding::new("rdma-devices", DEVICES, Status::Ok, saw).details(details)
}

const PORTS: &str = "NIC ports: state, link layer, rate, MTU";

pub fn ports(ctx: &Ctx<'_>) -> Finding {
    if ctx.facts.nics.is_empty() {
        return skip("ports", PORTS, NO_PORT);
    }
    let used: Vec<&Nic> = used_nics(ctx);
    let mut used_names: Vec<String> = used.iter().map(|n| n.name.clone()).collect();
    // A rank's nearest NIC counts too: with its port down the rank falls back to a farther one.
    for a in super::affinity::assignments(ctx) {
        used_names
            .extend(a.ranks.iter().filter_map(|r| Some(super::affinity::nearest(ctx, r.gpu)?.0)));
    }
    let (mut details, mut down, mut small_mtu, mut wrong_layer) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for n in &ctx.facts.nics {
        let in_use = used_names.contains(&n.name);
        for p in &n.ports {
            let mtu = ctx.facts.devinfo_of(&n.name).and_then(|d| d.active_mtu(p.num));
            let mtu_text = mtu.map(|m| format!(", active MTU {m}")).unwrap_or_default();
            details.push(format!(
                "{}/{}: {} ({}), {}, {}{mtu_text}{}",
                n.name,
                p.num,
                p.state,
                p.phys_state,
                p.link_layer,
                p.rate,
                if in_use { "" } else { " (not used)" }
            ));
            if !in_use {
                continue;
            }
            if !p.active() {
                down.push(format!("{}/{} {}", n.name, p.num, p.state));
            }
            if let (Some(s), Some(m)) = (ctx.subject, mtu)
                && m < s.mtu as u64
            {
                small_mtu.push(format!("{}/{} MTU {m} < the scenario's {}", n.name, p.num, s.mtu));
            }
            if let Some(s) = ctx.subject {
                let eth = p.is_ethernet();
                if eth != (s.fabric == FabricKind::Roce) {
                    wrong_layer.push(format!(
                        "{}/{} is {} but the scenario says {:?}",
                        n.name, p.num, p.link_layer, s.fabric
                    ));
                }
            }
        }
    }
    let saw = format!(
        "{} port(s) on {} device(s), {} used",
        details.len(),
        ctx.facts.nics.len(),
        used.len()
    );
    if !down.is_empty() {
        return Finding::new("ports", PORTS, Status::Fail, format!("{saw}; not ACTIVE: {}", down.join(", ")))
            .details(details)
            .why("a rank whose NIC port is down cannot connect its QPs: Buffer creation fails or the first internode dispatch hangs into \"DeepEP timeout\"", &[])
            .fix("bring the port up (cable, switch port, `ibstat`; on InfiniBand a subnet manager must run) or exclude it with NVSHMEM_HCA_LIST / NCCL_IB_HCA");
    }
    if !wrong_layer.is_empty() || !small_mtu.is_empty() {
        let mut problems = wrong_layer;
        problems.extend(small_mtu);
        return Finding::new("ports", PORTS, Status::Warn, format!("{saw}; {}", problems.join("; ")))
            .details(details)
            .why("the scenario's fabric (kind, MTU) is what eptwin predicts with; a smaller active MTU means more packets per message and less bandwidth (RoCE's MTU follows the netdev MTU)", &[])
            .fix("set the scenario's [cluster.fabric] kind/mtu to this node's, or raise the MTU (RoCE: `ip link set <netdev> mtu 9000` for an RDMA MTU of 4096)");
    }
    Finding::new("ports", PORTS, Status::Ok, saw).details(details)
}

const GID: &str = "RoCE GID table and GID index";

/// The GID RoCE should use: the first RoCE v2 entry with an IPv4 address, else the first
/// RoCE v2 entry.
pub fn recommended_gid(gids: &[Gid]) -> Option<&Gid> {
    gids.iter()
        .find(|g| g.is_roce_v2() && parse::gid_ipv4(&g.gid).is_some())
        .or_else(|| gids.iter().find(|g| g.is_roce_v2()))
}

pub fn roce_gid(ctx: &Ctx<'_>) -> Finding {
    let used: Vec<&Nic> = used_nics(ctx).into_iter().filter(|n| n.is_ethernet()).collect();
    if used.is_empty() {
        return skip("roce-gid", GID, "no RoCE port in use");
    }
    let (mut details, mut bad, mut missing) = (Vec::new(), Vec::new(), Vec::new());
    let jobs: Vec<_> = ctx
        .subject
        .map(|s| s.jobs.iter().filter(|j| j.crosses_nodes()).collect())
        .unwrap_or_default();
    for n in &used {
        let Some(p) = n.active_port().or(n.ports.first()) else { continue };
        for g in &p.gids {
            details.push(format!(
                "{}/{} GID[{}] {} {} {}",
                n.name,
                p.num,
                g.index,
                g.gid,
                g.kind.as_deref().unwrap_or("?"),
                g.netdev.as_deref().unwrap_or("")
            ));
        }
        let rec = recommended_gid(&p.gids);
        match rec {
            Some(g) => details.push(format!(
                "{}: use GID index {} (RoCE v2{})",
                n.name,
                g.index,
                parse::gid_ipv4(&g.gid).map(|ip| format!(", {ip}")).unwrap_or_default()
            )),
            None => {
                bad.push(format!("{} has no RoCE v2 GID (no IP address on its netdev?)", n.name))
            }
        }
        for j in &jobs {
            let var = if j.is_v2() { "NCCL_IB_GID_INDEX" } else { "NVSHMEM_IB_GID_INDEX" };
            match j.env.get(var).and_then(|v| v.trim().parse::<i64>().ok()).filter(|&v| v >= 0) {
                Some(idx) => match p.gids.iter().find(|g| g.index as i64 == idx) {
                    None => bad.push(format!(
                        "job {:?}: {var}={idx} is an empty entry on {}",
                        j.name, n.name
                    )),
                    Some(g) if !g.is_roce_v2() => bad.push(format!(
                        "job {:?}: {var}={idx} on {} is {} ({})",
                        j.name,
                        n.name,
                        g.kind.as_deref().unwrap_or("?"),
                        g.gid
                    )),
                    Some(_) => {}
                },
                None => {
                    let first_ok =
                        p.gids.first().is_some_and(|g| Some(g.index) == rec.map(|r| r.index));
                    if !first_ok {
                        missing.push(format!(
                            "job {:?}: {var} unset; GID[0] on {} is not the RoCE v2 IPv4 entry",
                            j.name, n.name
                        ));
                    }
                }
            }
        }
    }
    let fix = used
        .iter()
        .filter_map(|n| {
            Some(format!("{}: {}", n.name, recommended_gid(&n.active_port()?.gids)?.index))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let why = "RoCE QPs address peers by GID: a RoCE v1 or link-local entry cannot reach other nodes' subnets, so ibv_modify_qp to RTR fails or connections time out (status 110) — in LL mode first, which connects every pair";
    if !bad.is_empty() {
        return Finding::new("roce-gid", GID, Status::Fail, bad.join("; "))
            .details(details)
            .why(why, &["DeepEP #38", "DeepEP #321"])
            .fix(format!("NVSHMEM_IB_GID_INDEX (V1) / NCCL_IB_GID_INDEX (V2) = the RoCE v2 IPv4 entry ({fix}); give the netdev an IP address if there is none"));
    }
    if !missing.is_empty() {
        return Finding::new("roce-gid", GID, Status::Warn, missing.join("; "))
            .details(details)
            .why(
                format!(
                    "{why}; without the variable the library chooses (older NVSHMEM takes index 0)"
                ),
                &["DeepEP #38"],
            )
            .fix(format!("pin it: NVSHMEM_IB_GID_INDEX (V1) / NCCL_IB_GID_INDEX (V2) = {fix}"));
    }
    Finding::new("roce-gid", GID, Status::Ok, format!("RoCE v2 GIDs present ({fix})"))
        .details(details)
}

const SLTC: &str = "Service level and traffic class vs link layer";

pub fn sl_tc(ctx: &Ctx<'_>) -> Finding {
    let Some(s) = ctx.subject else { return skip("sl-tc", SLTC, "no scenario: no SL/TC to check") };
    let used = used_nics(ctx);
    let Some(nic) = used.first() else { return skip("sl-tc", SLTC, "no job uses a NIC here") };
    let ethernet = nic.is_ethernet();
    let mut details = vec![format!(
        "link layer of {}: {}",
        nic.name,
        if ethernet { "Ethernet (RoCE)" } else { "InfiniBand" }
    )];
    for j in s.jobs.iter().filter(|j| j.crosses_nodes()) {
        let tc = j.env.get("NVSHMEM_IB_TRAFFIC_CLASS");
        match j.api {
            crate::subject::Api::V2 { sl_idx, .. } => {
                let sl = j.env.get("EP_OVERRIDE_RDMA_SL").cloned().unwrap_or(sl_idx.to_string());
                details
                    .push(format!("job {:?} (V2): sl_idx {sl} → NCCL GIN traffic class", j.name));
            }
            crate::subject::Api::V1 => details.push(format!(
                "job {:?}: NVSHMEM_IB_SL={}, NVSHMEM_IB_TRAFFIC_CLASS={}",
                j.name,
                j.nvshmem.ib_sl,
                tc.map(String::as_str).unwrap_or("unset")
            )),
        }
        if j.is_v2() {
            continue;
        }
        if !ethernet && tc.is_some() {
            return Finding::new("sl-tc", SLTC, Status::Fail, format!("job {:?} sets NVSHMEM_IB_TRAFFIC_CLASS={} on native InfiniBand", j.name, tc.map(String::as_str).unwrap_or("")))
                .details(details)
                .why("on InfiniBand the traffic class goes into a global route header that native IB QPs do not carry: QP setup fails (ibv_modify_qp)", &["nvshmem #45"])
                .fix("unset NVSHMEM_IB_TRAFFIC_CLASS on InfiniBand; choose the lane with NVSHMEM_IB_SL (the subnet manager's SL2VL maps it to a VL)");
        }
        if ethernet && tc.is_none() && j.mode != Some(EpMode::Intranode) {
            return Finding::new("sl-tc", SLTC, Status::Warn, format!("job {:?}: RoCE with NVSHMEM_IB_TRAFFIC_CLASS unset: packets carry DSCP 0", j.name))
                .details(details)
                .why(format!("with `trust dscp` (the usual lossless RoCE set-up) the NIC and switches classify by DSCP = traffic class >> 2, so DSCP 0 lands on priority 0, not on the PFC-protected priority {} the job's NVSHMEM_IB_SL names: drops, retransmissions, collapse under load", j.nvshmem.ib_sl), &["DeepEP #82", "DeepEP #493"])
                .fix("set NVSHMEM_IB_TRAFFIC_CLASS = DSCP × 4 for the lossless class (DSCP 26 → 104) and check the mapping with `mlnx_qos -i <netdev>`");
        }
    }
    Finding::new("sl-tc", SLTC, Status::Ok, "SL and traffic class fit the link layer")
        .details(details)
}

const RAILS: &str = "RoCE rails reach each other (LL connects every pair)";

pub fn rail_routes(ctx: &Ctx<'_>) -> Finding {
    let Some(s) = ctx.subject else {
        return skip("rail-routes", RAILS, "no scenario: which ranks connect is unknown");
    };
    let all_pairs = s.jobs.iter().filter(|j| j.crosses_nodes()).any(|j| match j.api {
        crate::subject::Api::V1 => j.mode == Some(EpMode::LowLatency),
        crate::subject::Api::V2 { allow_hybrid_mode, .. } => !allow_hybrid_mode,
    });
    if !all_pairs {
        return skip(
            "rail-routes",
            RAILS,
            "no job connects across rails (normal mode and V2 hybrid mode stay on their rail)",
        );
    }
    let used: Vec<&Nic> = used_nics(ctx).into_iter().filter(|n| n.is_ethernet()).collect();
    if used.len() < 2 {
        return skip("rail-routes", RAILS, "fewer than two RoCE NICs in use: one rail");
    }
    let Ok(text) = ctx.node.files.read("/proc/net/route") else {
        return skip("rail-routes", RAILS, "/proc/net/route not readable");
    };
    let routes = parse::routes(&text);
    let rails: Vec<(&str, String, std::net::Ipv4Addr)> = used
        .iter()
        .filter_map(|n| {
            let g = recommended_gid(&n.active_port()?.gids)?;
            Some((n.name.as_str(), g.netdev.clone()?, parse::gid_ipv4(&g.gid)?))
        })
        .collect();
    let mut details: Vec<String> =
        rails.iter().map(|(n, dev, ip)| format!("{n}: {dev} {ip}")).collect();
    let mut unreachable = Vec::new();
    for (a, dev_a, _) in &rails {
        for (b, _, ip_b) in &rails {
            if a != b && !routes.iter().any(|r| &r.iface == dev_a && r.covers(*ip_b)) {
                unreachable.push(format!("{a} ({dev_a}) has no route to {b}'s subnet ({ip_b})"));
            }
        }
    }
    if !unreachable.is_empty() {
        details.extend(unreachable.iter().cloned());
        // /proc/net/route shows the main table only: policy routing may still route these,
        // hence a warning.
        details.push("routes of the main table (/proc/net/route); confirm policy routing with `ip route get <peer ip> from <local ip>`".into());
        return Finding::new("rail-routes", RAILS, Status::Warn, format!("{} rail pair(s) without a route", unreachable.len()))
            .details(details)
            .why("low-latency mode (and V2 direct mode) connects every rank to every other, across rails; normal mode only connects the same rail. A RoCE QP whose source netdev has no route to the peer's subnet fails in ibv_modify_qp (status 101 ENETUNREACH, or 110 / 22) while normal mode passes", &["DeepEP #38", "DeepEP #321", "DeepEP #268"])
            .fix("route every rail subnet through every rail's own netdev (e.g. `ip route add <other rail subnet> dev <netdev>` with a gateway the fabric provides, or a routed spine), or keep the job in normal mode");
    }
    Finding::new(
        "rail-routes",
        RAILS,
        Status::Ok,
        format!("{} rails, each reaches the others", rails.len()),
    )
    .details(details)
}
