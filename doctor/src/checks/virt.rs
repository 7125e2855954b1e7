//! Virtualisation: SR-IOV virtual functions, the IOMMU's mode, and ACS isolation on the PCIe
//! switch between a GPU and its NIC (seen in the IOMMU groups, without root).

use super::affinity::used_nics;
use super::{Ctx, skip};
use crate::facts::{Affinity, Nic};
use crate::report::{Finding, Status};

fn in_vm(ctx: &Ctx<'_>) -> bool {
    ctx.node.attr("/proc/cpuinfo").is_some_and(|c| {
        c.lines().any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "hypervisor"))
    })
}

const SRIOV: &str = "SR-IOV virtual functions";

pub fn sriov(ctx: &Ctx<'_>) -> Finding {
    if !ctx.rdma_matters() || ctx.facts.nics.is_empty() {
        return skip("sriov", SRIOV, "no RDMA device in use");
    }
    let vfs: Vec<String> = used_nics(ctx)
        .iter()
        .filter_map(|n| Some(format!("{} is a VF of {}", n.name, n.physfn.as_ref()?)))
        .collect();
    let vm = if in_vm(ctx) { "; running in a VM (cpuinfo: hypervisor)" } else { "" };
    if vfs.is_empty() {
        return Finding::new("sriov", SRIOV, Status::Ok, format!("physical functions{vm}"));
    }
    Finding::new("sriov", SRIOV, Status::Warn, format!("{}{vm}", vfs.join("; ")))
        .why("on a virtual function the NIC's peer traffic to GPU memory and its doorbells pass the hypervisor's IOMMU/ATS set-up: DeepEP jobs on VFs have hung into \"DeepEP timeout\" and virtualised pools ran about 3× slower across nodes", &["DeepEP #658", "virtualised pools ~3× slower"])
        .fix("run DeepEP on the physical functions (bare metal), or have the platform enable ATS and peer-to-peer for the VFs and pass GPU and VF through under one PCIe switch")
}

const IOMMU: &str = "IOMMU mode and ACS between GPU and NIC";

fn group(ctx: &Ctx<'_>, bdf: &str) -> Option<(String, String)> {
    let g = ctx.node.link_name(&format!("/sys/bus/pci/devices/{bdf}/iommu_group"))?;
    let kind =
        ctx.node.attr(&format!("/sys/kernel/iommu_groups/{g}/type")).unwrap_or_else(|| "?".into());
    Some((g, kind))
}

pub fn iommu(ctx: &Ctx<'_>) -> Finding {
    if !ctx.rdma_matters() || ctx.facts.nics.is_empty() {
        return skip("iommu", IOMMU, "no RDMA device in use");
    }
    let groups = ctx.node.entries("/sys/kernel/iommu_groups");
    let cmdline = ctx.node.attr("/proc/cmdline").unwrap_or_default();
    if groups.is_empty() {
        return Finding::new("iommu", IOMMU, Status::Ok, "IOMMU off (no IOMMU groups)");
    }
    let nics: Vec<&Nic> = used_nics(ctx);
    let mut details =
        vec![format!("{} IOMMU groups; kernel command line: {cmdline}", groups.len())];
    let (mut translated, mut acs) = (Vec::new(), Vec::new());
    let gpus = ctx.facts.gpus.as_ref().map(|g| g.as_slice()).unwrap_or(&[]);
    for n in &nics {
        let Some(bdf) = &n.bdf else { continue };
        let Some((ng, nk)) = group(ctx, bdf) else { continue };
        details.push(format!("{} ({bdf}): group {ng}, {nk}", n.name));
        if nk.starts_with("DMA") {
            translated.push(format!("{} ({nk})", n.name));
        }
        for g in gpus {
            let near = ctx.facts.distance(g, n).is_some_and(|d| d <= Affinity::Pxb);
            let Some((gg, gk)) = group(ctx, &g.info.bus_id) else { continue };
            if near {
                details.push(format!("GPU{} ({}): group {gg}, {gk}", g.info.index, g.info.bus_id));
                if gg != ng {
                    acs.push(format!(
                        "GPU{} and {} share a PCIe switch but not an IOMMU group",
                        g.info.index, n.name
                    ));
                }
                if gk.starts_with("DMA") {
                    translated.push(format!("GPU{} ({gk})", g.info.index));
                }
            }
        }
    }
    translated.sort();
    translated.dedup();
    let vm = in_vm(ctx);
    if !translated.is_empty() {
        return Finding::new("iommu", IOMMU, Status::Warn, format!("IOMMU translates DMA for {}", translated.join(", ")))
            .details(details)
            .why("GPUDirect RDMA sends the NIC's reads and writes of GPU memory through the IOMMU: translated (not pass-through) they are slowed or faulted, and DeepEP jobs hang into \"DeepEP timeout\"", &["DeepEP #49"])
            .fix("boot with the IOMMU in pass-through (intel_iommu=on iommu=pt, or amd_iommu=on iommu=pt) or off (root, reboot)");
    }
    if !acs.is_empty() {
        let prevents: &[&'static str] =
            if vm { &["DeepEP #49", "virtualised pools ~3× slower"] } else { &["DeepEP #49"] };
        return Finding::new("iommu", IOMMU, Status::Warn, acs.join("; "))
            .details(details)
            .why("separate IOMMU groups under one switch mean ACS redirects their peer-to-peer traffic up to the root complex: NIC↔GPU RDMA crosses the CPU instead of the switch (slower, and blocked where the root complex does not forward peer traffic)", prevents)
            .fix("disable ACS on the switch's downstream ports (BIOS, or as root `setpci -s <bridge> ECAP_ACS+0x6.w=0000` at every boot); in a VM ask for the GPU and NIC to be passed through together with ATS");
    }
    Finding::new(
        "iommu",
        IOMMU,
        Status::Ok,
        "IOMMU in pass-through; GPUs share IOMMU groups with their NICs",
    )
    .details(details)
}
