//! DeepEP V2 (NCCL GIN) on this node: libmlx5's version, the NIC `EP_NIC_NAME` names, and
//! PCIe AtomicOps between each NIC and its GPU.

use super::affinity::used_nics;
use super::qp::FAST_ATOMICS_HCA;
use super::{Ctx, skip};
use crate::facts::Nic;
use crate::parse::{self, PcieCap};
use crate::report::{Finding, Status};

const NO_V2: &str = "no DeepEP V2 job crosses nodes";

/// Fail for a V2 job, warn when no scenario says which DeepEP runs.
fn severity(ctx: &Ctx<'_>) -> Status {
    if ctx.subject.is_some() { Status::Fail } else { Status::Warn }
}

const LIBMLX5: &str = "V2: libmlx5 version for NCCL GIN";
/// The first libmlx5 symbol version NCCL's GIN needs (DeepEP #628).
const GIN_MIN_MLX5: u32 = 25;

pub fn gin_libmlx5(ctx: &Ctx<'_>) -> Finding {
    if !ctx.v2_matters() {
        return skip("gin-libmlx5", LIBMLX5, NO_V2);
    }
    let why = "NCCL's GPU-initiated networking needs mlx5 direct-verbs entry points that libmlx5 exports from symbol version MLX5_1.25: with an older library (MLNX_OFED 24.10) NCCL falls back to NCCL_GIN_TYPE_NONE and DeepEP V2 cannot run across nodes";
    let fix = "install an rdma-core / DOCA-OFED whose libmlx5.so.1 exports MLX5_1.25 (`strings libmlx5.so.1 | grep MLX5_1.2`); reported workaround on the old stack: NCCL_IB_MERGE_NICS=0";
    let lib = match ctx.node.host.library("libmlx5.so.1") {
        Ok(l) => l,
        Err(e) => {
            return Finding::new("gin-libmlx5", LIBMLX5, severity(ctx), e.to_string())
                .why(why, &["DeepEP #628"])
                .fix("install the mlx5 provider (rdma-core's ibverbs-providers, or DOCA-OFED)");
        }
    };
    let newest =
        lib.versions.iter().filter_map(|v| v.strip_prefix("MLX5_1.")?.parse::<u32>().ok()).max();
    let Some(newest) = newest else {
        return Finding::new(
            "gin-libmlx5",
            LIBMLX5,
            Status::Skip,
            format!("{}: no MLX5_1.* symbol versions found", lib.path),
        );
    };
    let saw = format!("{} exports up to MLX5_1.{newest}", lib.path);
    if newest < GIN_MIN_MLX5 {
        return Finding::new(
            "gin-libmlx5",
            LIBMLX5,
            severity(ctx),
            format!("{saw} (< MLX5_1.{GIN_MIN_MLX5})"),
        )
        .why(why, &["DeepEP #628"])
        .fix(fix);
    }
    Finding::new("gin-libmlx5", LIBMLX5, Status::Ok, saw)
}

const NIC_NAME: &str = "V2: EP_NIC_NAME";

pub fn nic_name(ctx: &Ctx<'_>) -> Finding {
    if !ctx.v2_matters() {
        return skip("ep-nic-name", NIC_NAME, NO_V2);
    }
    let env = ctx.node.host.environment();
    let job_value = ctx.subject.and_then(|s| {
        s.jobs.iter().filter(|j| j.is_v2()).find_map(|j| j.env.get("EP_NIC_NAME").cloned())
    });
    let name =
        job_value.or_else(|| env.get("EP_NIC_NAME").cloned()).unwrap_or_else(|| "mlx5_0".into());
    let Some(nic) = ctx.facts.nic(&name) else {
        let known: Vec<&str> = ctx.facts.nics.iter().map(|n| n.name.as_str()).collect();
        return Finding::new("ep-nic-name", NIC_NAME, severity(ctx), format!("EP_NIC_NAME={name}: no such RDMA device (have {})", known.join(", ")))
            .why("V2 reads EP_NIC_NAME (default mlx5_0) to learn the NIC model, which sets its automatic QP count (65 with ConnectX-8's fast RDMA atomics, else 129)", &["DeepEP #649"])
            .fix(format!("export EP_NIC_NAME={}", known.first().copied().unwrap_or("<device>")));
    };
    let hca = nic.hca_type.as_deref().unwrap_or("?");
    let fast = hca == FAST_ATOMICS_HCA;
    Finding::new(
        "ep-nic-name",
        NIC_NAME,
        Status::Ok,
        format!(
            "EP_NIC_NAME={name}: {hca}, fast RDMA atomics {fast} ⇒ hybrid mode allocates {} QPs per peer",
            if fast { 65 } else { 129 }
        ),
    )
}

const ATOMICS: &str = "V2: PCIe AtomicOps between NIC and GPU";

/// The config space's PCIe capability of a device, or why it cannot be read.
fn cap(ctx: &Ctx<'_>, bdf: &str) -> Result<PcieCap, String> {
    let bytes = ctx
        .node
        .files
        .read_bytes(&format!("/sys/bus/pci/devices/{bdf}/config"))
        .map_err(|e| e.to_string())?;
    parse::pcie_cap(&bytes).map_err(|e| format!("{bdf}: {e}"))
}

/// What stops AtomicOps from `nic` to its nearest GPU: requester, routing, completer.
fn atomics_path(ctx: &Ctx<'_>, nic: &Nic) -> Result<Vec<String>, String> {
    let gpus = ctx.facts.gpus.as_ref().map_err(|e| e.to_string())?;
    let gpu = gpus
        .iter()
        .filter_map(|g| Some((ctx.facts.distance(g, nic)?, g)))
        .min_by_key(|(d, g)| (*d, g.info.index))
        .map(|(_, g)| g)
        .ok_or("no GPU with a PCI path")?;
    let (np, gp) = (nic.pci.as_ref().ok_or("no PCI path")?, gpu.pci.as_ref().ok_or("no PCI path")?);
    let common = np.chain.iter().zip(&gp.chain).take_while(|(a, b)| a == b).count();
    let mut problems = Vec::new();
    let nic_bdf = np.chain.last().ok_or("empty path")?;
    if cap(ctx, nic_bdf)?.devctl2 & parse::DEVCTL2_ATOMIC_REQUESTER == 0 {
        problems.push(format!("{} ({nic_bdf}): AtomicOp requester not enabled", nic.name));
    }
    // Bridges the AtomicOps cross: each side's below the common one, and the common one.
    let start = common.saturating_sub(1);
    let side = |c: &'_ [String], from: usize| {
        c.get(from..c.len().saturating_sub(1)).unwrap_or(&[]).to_vec()
    };
    let bridges: Vec<String> =
        side(&np.chain, start).into_iter().chain(side(&gp.chain, common)).collect();
    for b in &bridges {
        let c = cap(ctx, b)?;
        if c.devcap2 & parse::DEVCAP2_ATOMIC_ROUTING == 0 {
            problems.push(format!("bridge {b}: no AtomicOp routing"));
        }
        if c.devctl2 & parse::DEVCTL2_ATOMIC_EGRESS_BLOCK != 0 {
            problems.push(format!("bridge {b}: AtomicOp egress blocking on"));
        }
    }
    let gpu_bdf = gp.chain.last().ok_or("empty path")?;
    if cap(ctx, gpu_bdf)?.devcap2 & parse::DEVCAP2_ATOMIC_COMP64 == 0 {
        problems.push(format!("GPU{} ({gpu_bdf}): no 64-bit AtomicOp completer", gpu.info.index));
    }
    Ok(problems)
}

pub fn pci_atomics(ctx: &Ctx<'_>) -> Finding {
    if !ctx.v2_matters() {
        return skip("pci-atomics", ATOMICS, NO_V2);
    }
    let nics: Vec<&Nic> = used_nics(ctx).into_iter().filter(|n| n.is_mlx5()).collect();
    if nics.is_empty() {
        return skip("pci-atomics", ATOMICS, "no mlx5 NIC in use");
    }
    let query =
        "`mlxconfig -d <device> query PCI_ATOMIC_MODE` (root) shows the firmware setting itself";
    let mut problems = Vec::new();
    for n in &nics {
        match atomics_path(ctx, n) {
            Ok(p) => problems.extend(p),
            Err(e) if e.contains("root") => {
                return Finding::new(
                    "pci-atomics",
                    ATOMICS,
                    Status::Skip,
                    format!("needs root: {e}"),
                )
                .fix(format!("run `sudo eptwin doctor` for this check; {query}"));
            }
            Err(e) => {
                let saw = format!("cannot read the PCIe capabilities: {e}");
                return Finding::new("pci-atomics", ATOMICS, Status::Skip, saw);
            }
        }
    }
    if !problems.is_empty() {
        return Finding::new("pci-atomics", ATOMICS, severity(ctx), format!("{} problem(s) on the NIC→GPU path", problems.len()))
            .details(problems)
            .why("V2's GIN signals with RDMA atomics on GPU memory; DeepEP's V2 README asks for PCI_ATOMIC_MODE=4 so that the NIC issues them as PCIe AtomicOps, which the NIC must be allowed to request, every bridge on the way must route and the GPU must complete", &["DeepEP V2 README: PCI_ATOMIC_MODE=4"])
            .fix("`mlxconfig -d <device> set PCI_ATOMIC_MODE=4` and a cold reboot; enable AtomicOp routing in the BIOS / PCIe switch configuration");
    }
    Finding::new(
        "pci-atomics",
        ATOMICS,
        Status::Ok,
        format!(
            "AtomicOps requested, routed and completed on {} NIC→GPU path(s); {query}",
            nics.len()
        ),
    )
}
