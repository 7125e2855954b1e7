//! Which NIC each rank would use under the scenario's environment, how far it is from the
//! rank's GPU, and whether the PCIe links run at their full width and speed.

use eptwin_engine::api::EpMode;

use super::{Ctx, skip};
use crate::facts::{Affinity, Nic};
use crate::report::{Finding, Status};
use crate::subject::JobSubject;

/// One rank's NIC.
#[derive(Debug, Clone)]
pub struct RankNic {
    /// The rank's index among the job's ranks on this node.
    pub local_rank: u32,
    pub gpu: u32,
    pub nic: Option<String>,
    pub distance: Option<Affinity>,
}

/// A job's ranks on this node and their NICs.
#[derive(Debug, Clone)]
pub struct Assignment {
    pub job: String,
    pub ranks: Vec<RankNic>,
    /// How the NICs were chosen (the variables that decided).
    pub how: String,
    /// Why no NIC could be chosen.
    pub problem: Option<String>,
}

/// An `NVSHMEM_HCA_LIST` / `NCCL_IB_HCA` filter: `[^][=]name[:port],…` (prefix match unless
/// `=`; `^` excludes).
fn hca_filter(list: &str, name: &str) -> bool {
    let list = list.trim();
    let (exclude, list) = match list.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, list),
    };
    let (exact, list) = match list.strip_prefix('=') {
        Some(rest) => (true, rest),
        None => (false, list),
    };
    let hit = list
        .split(',')
        .map(|e| e.trim().split(':').next().unwrap_or(""))
        .filter(|e| !e.is_empty())
        .any(|e| if exact { e == name } else { name.starts_with(e) });
    hit != exclude
}

/// `NVSHMEM_HCA_PE_MAPPING`: `dev:port:count,…` expanded to one device per PE slot.
fn pe_mapping(value: &str) -> Vec<String> {
    value
        .split(',')
        .filter_map(|e| {
            let mut parts = e.trim().split(':');
            let dev = parts.next()?.to_string();
            let _port = parts.next();
            let count: usize = parts.next().and_then(|c| c.parse().ok()).unwrap_or(1);
            (!dev.is_empty()).then(|| vec![dev; count])
        })
        .flatten()
        .collect()
}

/// The NICs of each job's ranks on this node, as NVSHMEM (V1) or NCCL (V2) would choose them
/// (docs/doctor.md, "nic-selection", states the rules and what is derived).
pub fn assignments(ctx: &Ctx<'_>) -> Vec<Assignment> {
    let Some(s) = ctx.subject else { return Vec::new() };
    s.jobs
        .iter()
        .filter(|j| j.crosses_nodes() && j.mode.is_some())
        .map(|j| assign(ctx, j))
        .collect()
}

fn assign(ctx: &Ctx<'_>, job: &JobSubject) -> Assignment {
    let facts = ctx.facts;
    let list_var = if job.is_v2() { "NCCL_IB_HCA" } else { "NVSHMEM_HCA_LIST" };
    let mut how = Vec::new();
    let mut candidates: Vec<&Nic> =
        facts.nics.iter().filter(|n| n.active_port().is_some()).collect();
    if let Some(list) = job.env.get(list_var) {
        how.push(format!("{list_var}={list}"));
        candidates.retain(|n| hca_filter(list, &n.name));
    }
    let mut ranks: Vec<RankNic> = job
        .local_gpus
        .iter()
        .enumerate()
        .map(|(i, &gpu)| RankNic { local_rank: i as u32, gpu, nic: None, distance: None })
        .collect();
    if candidates.is_empty() {
        let problem = match job.env.get(list_var) {
            Some(list) => format!("{list_var}={list} leaves no RDMA device with an ACTIVE port"),
            None => "no RDMA device with an ACTIVE port".to_string(),
        };
        return Assignment {
            job: job.name.clone(),
            ranks,
            how: how.join(", "),
            problem: Some(problem),
        };
    }
    let pe_mapped = !job.is_v2() && job.env_bool("NVSHMEM_ENABLE_NIC_PE_MAPPING");
    if pe_mapped {
        how.push("NVSHMEM_ENABLE_NIC_PE_MAPPING=1".into());
        let slots: Vec<String> = match job.env.get("NVSHMEM_HCA_PE_MAPPING") {
            Some(m) => {
                how.push(format!("NVSHMEM_HCA_PE_MAPPING={m}"));
                pe_mapping(m)
            }
            None => candidates.iter().map(|n| n.name.clone()).collect(),
        };
        for r in &mut ranks {
            // The PE's index on its node in its NVSHMEM world: normal internode mode runs one
            // world per rail with one PE per node, so it is 0 for every rank (derived, DeepEP
            // §2); low-latency mode has one world, the local rank.
            let pe_local =
                if job.mode == Some(EpMode::Internode) { 0 } else { r.local_rank as usize };
            r.nic = slots.get(pe_local % slots.len().max(1)).cloned();
        }
    } else {
        how.push(
            if job.is_v2() {
                "NCCL: the nearest NIC per GPU"
            } else {
                "NVSHMEM: the nearest NIC per GPU"
            }
            .into(),
        );
        let mut load = vec![0u32; candidates.len()];
        for r in &mut ranks {
            // A GPU or NIC without a place in the PCI tree (no NVML here, a software RDMA
            // device) is equally far from every NIC: the least-loaded one is taken.
            let gpu = facts.gpu(r.gpu);
            let dist: Vec<Affinity> = candidates
                .iter()
                .map(|n| gpu.and_then(|g| facts.distance(g, n)).unwrap_or(Affinity::Sys))
                .collect();
            let best = dist.iter().min().copied().unwrap_or(Affinity::Sys);
            // Ties go to the least-loaded NIC, in name order.
            let pick =
                (0..candidates.len()).filter(|&i| dist[i] == best).min_by_key(|&i| (load[i], i));
            if let Some(i) = pick {
                load[i] += 1;
                r.nic = Some(candidates[i].name.clone());
            }
        }
    }
    for r in &mut ranks {
        let (Some(gpu), Some(nic)) =
            (facts.gpu(r.gpu), r.nic.as_deref().and_then(|n| facts.nic(n)))
        else {
            continue;
        };
        r.distance = facts.distance(gpu, nic);
    }
    Assignment { job: job.name.clone(), ranks, how: how.join(", "), problem: None }
}

/// The NICs the scenario's ranks use (every RDMA device without a scenario).
pub fn used_nics<'a>(ctx: &'a Ctx<'a>) -> Vec<&'a Nic> {
    if ctx.subject.is_none() {
        return ctx.facts.nics.iter().collect();
    }
    let names: std::collections::BTreeSet<String> = assignments(ctx)
        .into_iter()
        .flat_map(|a| a.ranks.into_iter().filter_map(|r| r.nic))
        .collect();
    ctx.facts.nics.iter().filter(|n| names.contains(&n.name)).collect()
}

const SELECTION: &str = "NIC per rank and GPU↔NIC affinity";

pub fn nic_selection(ctx: &Ctx<'_>) -> Finding {
    if ctx.facts.nics.is_empty() {
        return skip("nic-selection", SELECTION, "no RDMA device");
    }
    let Some(_) = ctx.subject else { return nearest_per_gpu(ctx) };
    let all = assignments(ctx);
    if all.is_empty() {
        return skip("nic-selection", SELECTION, "no job crosses nodes: no rank uses a NIC");
    }
    let mut details = Vec::new();
    let mut worst: Option<Finding> = None;
    for a in &all {
        details.push(format!("job {:?}: {}", a.job, a.how));
        for r in &a.ranks {
            let d = r.distance.map(|d| d.label()).unwrap_or("?");
            details.push(format!(
                "  local rank {} (GPU{}) → {} ({d})",
                r.local_rank,
                r.gpu,
                r.nic.as_deref().unwrap_or("none")
            ));
        }
        let f = judge(ctx, a);
        if worst.as_ref().is_none_or(|w| f.status > w.status) {
            worst = Some(f);
        }
    }
    let f = worst.unwrap_or_else(|| {
        Finding::new("nic-selection", SELECTION, Status::Ok, "every rank on its own nearby NIC")
    });
    let mut all_details = f.details.clone();
    all_details.extend(details);
    f.details(all_details)
}

fn judge(ctx: &Ctx<'_>, a: &Assignment) -> Finding {
    if let Some(p) = &a.problem {
        return Finding::new("nic-selection", SELECTION, Status::Fail, format!("job {:?}: {p}", a.job))
            .why("NVSHMEM/NCCL find no device to build the job's QPs on: Buffer creation fails", &[])
            .fix("list devices that exist and are ACTIVE (ibv_devinfo) in NVSHMEM_HCA_LIST / NCCL_IB_HCA, or unset it");
    }
    let nics: std::collections::BTreeSet<&str> =
        a.ranks.iter().filter_map(|r| r.nic.as_deref()).collect();
    let mut gpus: Vec<u32> = a.ranks.iter().map(|r| r.gpu).collect();
    gpus.dedup();
    let active = ctx.facts.nics.iter().filter(|n| n.active_port().is_some()).count();
    if gpus.len() > 1 && nics.len() == 1 && active > 1 {
        let nic = nics.iter().next().copied().unwrap_or("?");
        return Finding::new("nic-selection", SELECTION, Status::Fail, format!("job {:?}: all {} local ranks on {nic} ({active} NICs up)", a.job, a.ranks.len()))
            .why(format!("every rank's RDMA traffic shares one NIC's bandwidth ({}); in normal mode each rail's NVSHMEM world has one PE per node, so a PE-index mapping puts every rank on the first NIC", a.how), &["DeepEP #336"])
            .fix("unset NVSHMEM_ENABLE_NIC_PE_MAPPING (NVSHMEM then takes the nearest NIC per GPU), or give each local rank its NIC with NVSHMEM_HCA_PE_MAPPING / a per-rank NVSHMEM_HCA_LIST");
    }
    let far: Vec<String> = a
        .ranks
        .iter()
        .filter(|r| r.distance.is_some_and(|d| d >= Affinity::Phb))
        .filter(|r| nearest(ctx, r.gpu).is_some_and(|(_, d)| d < Affinity::Phb))
        .map(|r| {
            let (near, d) = nearest(ctx, r.gpu).unwrap_or_default();
            format!(
                "GPU{} uses {} ({}) but {near} is {}",
                r.gpu,
                r.nic.as_deref().unwrap_or("?"),
                r.distance.map(|d| d.label()).unwrap_or("?"),
                d.label()
            )
        })
        .collect();
    if !far.is_empty() {
        return Finding::new("nic-selection", SELECTION, Status::Warn, format!("job {:?}: {} rank(s) use a NIC across the host bridge", a.job, far.len()))
            .details(far)
            .why("GPU memory reached through the CPU root complex or across sockets caps RDMA far below the NIC's rate (25 vs 47 GB/s reported)", &["DeepEP #155"])
            .fix("let each GPU use its PIX/PXB NIC: fix NVSHMEM_HCA_LIST / NVSHMEM_HCA_PE_MAPPING (V1) or NCCL_IB_HCA (V2)");
    }
    Finding::new(
        "nic-selection",
        SELECTION,
        Status::Ok,
        format!(
            "job {:?}: {} rank(s) on {} NIC(s), each near its GPU",
            a.job,
            a.ranks.len(),
            nics.len()
        ),
    )
}

/// The nearest RDMA device to a GPU.
pub fn nearest(ctx: &Ctx<'_>, gpu: u32) -> Option<(String, Affinity)> {
    let g = ctx.facts.gpu(gpu)?;
    ctx.facts
        .nics
        .iter()
        .filter_map(|n| Some((n.name.clone(), ctx.facts.distance(g, n)?)))
        .min_by_key(|(name, d)| (*d, name.clone()))
}

/// Without a scenario: each GPU's nearest NIC.
fn nearest_per_gpu(ctx: &Ctx<'_>) -> Finding {
    let Ok(gpus) = &ctx.facts.gpus else {
        return skip("nic-selection", SELECTION, "cannot list GPUs: no GPU↔NIC distances");
    };
    let mut details = Vec::new();
    let mut far = 0;
    for g in gpus {
        match nearest(ctx, g.info.index) {
            Some((nic, d)) => {
                if d >= Affinity::Phb {
                    far += 1;
                }
                details.push(format!("GPU{} → {nic} ({})", g.info.index, d.label()));
            }
            None => details.push(format!("GPU{}: no PCI path to compare", g.info.index)),
        }
    }
    if far > 0 && gpus.len() > 1 {
        return Finding::new("nic-selection", SELECTION, Status::Warn, format!("{far} GPU(s) have no NIC below their host bridge"))
            .details(details)
            .why("a GPU whose nearest NIC is across the CPU reaches RDMA at a fraction of the NIC's rate", &["DeepEP #155"])
            .fix("check `nvidia-smi topo -m`; move NICs or GPUs so that each GPU has a NIC on its PCIe switch");
    }
    Finding::new(
        "nic-selection",
        SELECTION,
        Status::Ok,
        format!("{} GPU(s), each with a nearby NIC", gpus.len()),
    )
    .details(details)
}

const LINKS: &str = "PCIe link width and speed";

pub fn pcie_links(ctx: &Ctx<'_>) -> Finding {
    let mut devices: Vec<(String, String, bool)> = Vec::new();
    if let Ok(gpus) = &ctx.facts.gpus {
        devices.extend(
            gpus.iter().map(|g| (format!("GPU{}", g.info.index), g.info.bus_id.clone(), true)),
        );
    }
    devices.extend(
        used_nics(ctx).iter().filter_map(|n| Some((n.name.clone(), n.bdf.clone()?, false))),
    );
    if devices.is_empty() {
        return skip("pcie-link", LINKS, "no GPU or RDMA device to check");
    }
    let (mut details, mut degraded) = (Vec::new(), Vec::new());
    for (label, bdf, is_gpu) in &devices {
        let attr = |a: &str| ctx.node.attr(&format!("/sys/bus/pci/devices/{bdf}/{a}"));
        let (Some(cw), Some(mw)) = (attr("current_link_width"), attr("max_link_width")) else {
            details.push(format!("{label} ({bdf}): link attributes not readable"));
            continue;
        };
        let (cs, ms) = (
            attr("current_link_speed").unwrap_or_default(),
            attr("max_link_speed").unwrap_or_default(),
        );
        details.push(format!("{label} ({bdf}): x{cw} at {cs} (max x{mw} at {ms})"));
        let narrow = cw.parse::<u32>().ok() < mw.parse::<u32>().ok();
        // GPUs lower their link speed when idle; only a NIC's speed is judged.
        let slow = !is_gpu
            && crate::parse::link_speed_gts(&cs)
                .zip(crate::parse::link_speed_gts(&ms))
                .is_some_and(|(c, m)| c < m);
        if narrow || slow {
            degraded.push(format!("{label} x{cw} at {cs} of x{mw} at {ms}"));
        }
    }
    if !degraded.is_empty() {
        return Finding::new("pcie-link", LINKS, Status::Warn, format!("degraded: {}", degraded.join("; ")))
            .details(details)
            .why("a NIC or GPU trained at half its width or speed halves what RDMA can move (25 vs 47 GB/s reported)", &["DeepEP #155"])
            .fix("reseat the card or its riser, check the slot's BIOS bifurcation and generation settings, then `lspci -vv -s <bdf> | grep LnkSta`");
    }
    Finding::new(
        "pcie-link",
        LINKS,
        Status::Ok,
        format!("{} device(s) at full width", devices.len()),
    )
    .details(details)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hca_lists_filter_like_nccl() {
        assert!(hca_filter("mlx5_0:1,mlx5_1:1", "mlx5_1"));
        assert!(!hca_filter("mlx5_0:1", "mlx5_1"));
        assert!(hca_filter("mlx5", "mlx5_7"));
        assert!(!hca_filter("=mlx5", "mlx5_7"));
        assert!(!hca_filter("^mlx5_2", "mlx5_2"));
        assert!(hca_filter("^mlx5_2", "mlx5_3"));
        assert_eq!(pe_mapping("mlx5_0:1:2,mlx5_1:1:1"), ["mlx5_0", "mlx5_0", "mlx5_1"]);
    }
}
