//! GPUs: the inventory and UUIDs (ranks sharing a GPU), the directed peer-access / NVLink
//! matrix, and MNNVL's IMEX channel.

use std::collections::BTreeMap;

use eptwin_engine::api::{EpMode, NvlinkKind};
use eptwin_engine::topology::{NvlinkCheckMode, TopologyProbe, check_nvlink_connections};

use super::{Ctx, skip};
use crate::facts::Gpu;
use crate::report::{Finding, Status};

const GPUS: &str = "GPUs and their UUIDs";

pub fn gpus(ctx: &Ctx<'_>) -> Finding {
    let gpus = match &ctx.facts.gpus {
        Ok(g) => g,
        Err(e) => return skip("gpus", GPUS, format!("cannot list GPUs: {e}")),
    };
    let mut details: Vec<String> = gpus
        .iter()
        .map(|g| {
            let numa = g.numa.map(|n| format!(", NUMA {n}")).unwrap_or_default();
            format!(
                "GPU{}: {} {} at {}{numa}",
                g.info.index, g.info.name, g.info.uuid, g.info.bus_id
            )
        })
        .collect();
    let env = ctx.node.host.environment();
    if let Some(v) = env.get("CUDA_VISIBLE_DEVICES") {
        details.push(format!("CUDA_VISIBLE_DEVICES={v}"));
    }
    let saw = format!("{} GPU(s) visible", gpus.len());
    let mut by_uuid: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for g in gpus {
        by_uuid.entry(g.info.uuid.as_str()).or_default().push(g.info.index);
    }
    let shared: Vec<String> = by_uuid
        .iter()
        .filter(|(_, ordinals)| ordinals.len() > 1)
        .map(|(uuid, o)| format!("CUDA ordinals {o:?} are one GPU ({uuid})"))
        .collect();
    const WHY_582: &str = "DeepEP needs one GPU per rank: ranks sharing a GPU fail DeepEP's NVLink check with \"No NVLink connection between GPU 0 and GPU 0\" and cannot open CUDA IPC handles to themselves";
    if !shared.is_empty() {
        details.extend(shared.iter().cloned());
        return Finding::new("gpus", GPUS, Status::Fail, format!("{saw}; {}", shared.join("; ")))
            .details(details)
            .why(WHY_582, &["DeepEP #582"])
            .fix("give every rank its own GPU: list each GPU once in CUDA_VISIBLE_DEVICES (or unset it) and map LOCAL_RANK to a distinct device");
    }
    let Some(s) = ctx.subject else {
        return Finding::new("gpus", GPUS, Status::Ok, saw).details(details);
    };
    let visible = gpus.len() as u32;
    if s.gpus_per_node > visible {
        return Finding::new(
            "gpus",
            GPUS,
            Status::Fail,
            format!("{saw}; the scenario places {} GPUs per node", s.gpus_per_node),
        )
        .details(details)
        .why(format!("{WHY_582}; launched as {} ranks per node on {visible} GPUs, torch.cuda.set_device(local_rank % {visible}) puts two ranks on one GPU", s.gpus_per_node * s.ranks_per_gpu), &["DeepEP #582"])
        .fix(format!("launch {visible} ranks per node (--nproc-per-node {visible}), or run on a node with {} GPUs", s.gpus_per_node));
    }
    let sharing: Vec<&str> = s
        .deepep_jobs()
        .filter(|j| {
            let mut g = j.local_gpus.clone();
            g.dedup();
            g.len() < j.local_gpus.len()
        })
        .map(|j| j.name.as_str())
        .collect();
    if !sharing.is_empty() {
        return Finding::new(
            "gpus",
            GPUS,
            Status::Warn,
            format!(
                "{saw}; ranks_per_gpu = {}: job(s) {} put several ranks on one GPU",
                s.ranks_per_gpu,
                sharing.join(", ")
            ),
        )
        .details(details)
        .why(
            format!(
                "{WHY_582}; eptwin's hardware backend runs such ranks on one GPU, DeepEP does not"
            ),
            &["DeepEP #582"],
        )
        .fix("for DeepEP itself: ranks_per_gpu = 1 and one process per GPU");
    }
    Finding::new(
        "gpus",
        GPUS,
        Status::Ok,
        format!("{saw}; the scenario needs {} per node", s.gpus_per_node),
    )
    .details(details)
}

/// The engine's NVLink check over the node's answers.
struct NodeTopology<'a> {
    ctx: &'a Ctx<'a>,
    gpus: &'a [Gpu],
}

impl TopologyProbe for NodeTopology<'_> {
    fn source(&self) -> String {
        self.ctx.node.gpus.source()
    }
    fn gpu_count(&self) -> Result<u32, String> {
        Ok(self.gpus.len() as u32)
    }
    fn gpu_name(&self, gpu: u32) -> Result<String, String> {
        self.gpus
            .get(gpu as usize)
            .map(|g| g.info.name.clone())
            .ok_or_else(|| format!("no GPU {gpu}"))
    }
    fn nvlink_p2p_ok(&self, a: u32, b: u32) -> Result<bool, String> {
        let p = self.ctx.node.gpus.peer(a, b).map_err(|e| e.to_string())?;
        Ok(p.nvlink.unwrap_or(false))
    }
}

const P2P: &str = "GPU peer access and NVLink (directed)";

pub fn p2p(ctx: &Ctx<'_>) -> Finding {
    let gpus = match &ctx.facts.gpus {
        Ok(g) => g,
        Err(e) => return skip("p2p", P2P, format!("cannot list GPUs: {e}")),
    };
    let n = gpus.len() as u32;
    if n < 2 {
        return Finding::new("p2p", P2P, Status::Ok, format!("{n} GPU: no peer pairs"));
    }
    let (mut denied, mut no_nvlink, mut unknown, mut rows) =
        (Vec::new(), Vec::new(), 0, Vec::new());
    for a in 0..n {
        let mut row = format!("GPU{a} →");
        for b in (0..n).filter(|&b| b != a) {
            let cell = match ctx.node.gpus.peer(a, b) {
                Ok(p) => {
                    if p.cuda == Some(false) {
                        denied.push(format!("GPU{a} → GPU{b}"));
                    }
                    if p.nvlink == Some(false) {
                        no_nvlink.push((a, b));
                    }
                    match (p.cuda, p.nvlink) {
                        (Some(false), _) => "--",
                        (_, Some(true)) => "NV",
                        (Some(true), _) => "P2P",
                        _ => "?",
                    }
                }
                Err(_) => {
                    unknown += 1;
                    "?"
                }
            };
            row.push_str(&format!(" {b}:{cell}"));
        }
        rows.push(row);
    }
    let pairs = n * (n - 1);
    let nvlinked = pairs as usize - no_nvlink.len();
    let saw =
        format!("{pairs} directed pairs: {nvlinked} NVLink, {} without peer access", denied.len());
    if !denied.is_empty() {
        let mut details =
            vec![format!("every pair without CUDA peer access: {}", denied.join(", "))];
        details.extend(rows);
        return Finding::new("p2p", P2P, Status::Fail, saw)
            .details(details)
            .why("DeepEP maps every peer's buffer with CUDA IPC and P2P at Buffer creation; on a host with partial P2P it dies on the first pair that fails, naming only that one", &["DeepEP #584"])
            .fix("give the job only GPUs that all reach each other (CUDA_VISIBLE_DEVICES), or fix the PCIe topology/BIOS (ACS, IOMMU) that blocks P2P on these pairs");
    }
    if let Some(f) = deepep_nvlink_check(ctx, gpus, &saw, &rows) {
        return f;
    }
    let partial = nvlinked > 0 && !no_nvlink.is_empty();
    if partial {
        let list: Vec<String> = no_nvlink.iter().map(|(a, b)| format!("GPU{a} → GPU{b}")).collect();
        let mut details =
            vec![format!("pairs without NVLink (PCIe P2P instead): {}", list.join(", "))];
        details.extend(rows);
        return Finding::new("p2p", P2P, Status::Warn, saw)
            .details(details)
            .why("normal kernels and LL's NVLink path assume every GPU of a node on NVLink; pairs over PCIe run an order of magnitude slower and may break LL's memory ordering (buffer.py docstring)", &["DeepEP #584"])
            .fix("check `nvidia-smi nvlink --status` and `nvidia-smi topo -m`; reseat or replace the GPU/NVSwitch with inactive links");
    }
    let status = if unknown > 0 { Status::Warn } else { Status::Ok };
    let saw =
        if unknown > 0 { format!("{saw}; {unknown} pair(s) could not be asked") } else { saw };
    Finding::new("p2p", P2P, status, saw).details(rows)
}

/// DeepEP's own `check_nvlink_connections` (engine) over each job's GPUs on this node.
fn deepep_nvlink_check(ctx: &Ctx<'_>, gpus: &[Gpu], saw: &str, rows: &[String]) -> Option<Finding> {
    let s = ctx.subject?;
    let probe = NodeTopology { ctx, gpus };
    for job in s.deepep_jobs() {
        let mut group = job.local_gpus.clone();
        group.dedup();
        group.retain(|&g| (g as usize) < gpus.len());
        let Ok(report) =
            check_nvlink_connections(&probe, &group, &[], NvlinkCheckMode::DeepEp, false)
        else {
            continue;
        };
        if !report.passed() {
            let mut details = report.failures.clone();
            details.extend(rows.iter().cloned());
            return Some(
                Finding::new("p2p", P2P, Status::Fail, format!("{saw}; DeepEP's NVLink check fails for job {:?}", job.name))
                    .details(details)
                    .why("check_nvlink_connections (utils.py:64-101) asserts at most 2 PCIe GPUs per group, each pair on NVLink", &["DeepEP #584"])
                    .fix("PCIe GPUs: at most 2 ranks per node, on an NVLink-bridged pair"),
            );
        }
    }
    None
}

const MNNVL: &str = "MNNVL: IMEX channel and GPU fabric";
const IMEX_DIR: &str = "/dev/nvidia-caps-imex-channels";

pub fn mnnvl(ctx: &Ctx<'_>) -> Finding {
    let wanted = ctx.subject.is_some_and(|s| {
        s.nvlink == NvlinkKind::Mnnvl
            || s.jobs.iter().any(|j| j.allow_mnnvl && j.mode != Some(EpMode::Intranode))
    });
    let fabric: Vec<(u32, String)> = ctx
        .facts
        .gpus
        .as_ref()
        .map(|g| g.iter().filter_map(|g| Some((g.info.index, g.info.fabric.clone()?))).collect())
        .unwrap_or_default();
    let fabric_gpus = fabric.iter().any(|(_, state)| state != "not-supported");
    if !wanted && !fabric_gpus {
        return skip("mnnvl", MNNVL, "no multi-node NVLink here and none asked for");
    }
    let mut details: Vec<String> =
        fabric.iter().map(|(i, s)| format!("GPU{i}: fabric state {s}")).collect();
    let channels = ctx.node.entries(IMEX_DIR);
    let channel0 = ctx.node.files.device_node(&format!("{IMEX_DIR}/channel0"));
    details.push(match &channel0 {
        Ok(d) => format!("{IMEX_DIR}/channel0: mode {:o}, read-write {}", d.mode, d.read_write),
        Err(e) => format!("IMEX channel: {e}"),
    });
    let why = "cross-tray NVLink buffers are CUDA fabric handles inside an IMEX domain (V1 use_fabric / allow_mnnvl, V2 allow_mnnvl); without an IMEX channel the import fails with \"CUDA error 400: invalid resource handle\"";
    let prevents = &["MNNVL \"CUDA error 400: invalid resource handle\""];
    let usable = channel0.as_ref().is_ok_and(|d| d.read_write);
    if !usable {
        return Finding::new("mnnvl", MNNVL, Status::Fail, format!("no usable IMEX channel ({} in {IMEX_DIR})", channels.len()))
            .details(details)
            .why(why, prevents)
            .fix("run the nvidia-imex service on every tray of the NVLink domain and create channel 0 (driver option NVreg_CreateImexChannel0=1, or mknod /dev/nvidia-caps-imex-channels/channel0 c <major of nvidia-caps-imex-channels in /proc/devices> 0); pass it into containers");
    }
    let incomplete: Vec<String> = fabric
        .iter()
        .filter(|(_, s)| s != "completed")
        .map(|(i, s)| format!("GPU{i} ({s})"))
        .collect();
    if !incomplete.is_empty() {
        return Finding::new("mnnvl", MNNVL, Status::Fail, format!("GPU fabric registration not complete: {}", incomplete.join(", ")))
            .details(details)
            .why(why, prevents)
            .fix("start nvidia-fabricmanager / nvidia-imex and wait for `nvidia-smi -q | grep -A2 Fabric` to say Completed");
    }
    Finding::new("mnnvl", MNNVL, Status::Ok, "IMEX channel 0 usable").details(details)
}
