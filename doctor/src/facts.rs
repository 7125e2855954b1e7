//! The node's facts, read once from the probes: GPUs with their place in the PCI tree, RDMA
//! devices with their ports and GID tables (sysfs), device limits (`ibv_devinfo -v`), loaded
//! modules, and the process's status.

use serde::Serialize;

use crate::parse::{self, DevInfo, PciPath};
use crate::probe::{GpuInfo, Node, Probed};

const IB: &str = "/sys/class/infiniband";

#[derive(Debug, Clone)]
pub struct Gpu {
    pub info: GpuInfo,
    pub pci: Option<PciPath>,
    pub numa: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct Gid {
    pub index: u32,
    pub gid: String,
    /// `IB/RoCE v1` or `RoCE v2` (sysfs `gid_attrs/types`).
    pub kind: Option<String>,
    pub netdev: Option<String>,
}

impl Gid {
    pub fn is_roce_v2(&self) -> bool {
        self.kind.as_deref().is_some_and(|k| k.contains("v2"))
    }
}

#[derive(Debug, Clone)]
pub struct Port {
    pub num: u32,
    /// `ACTIVE`, `DOWN`, `INIT`, … (sysfs `state` without its number).
    pub state: String,
    pub phys_state: String,
    /// `InfiniBand` or `Ethernet`.
    pub link_layer: String,
    pub rate: String,
    pub gids: Vec<Gid>,
}

impl Port {
    pub fn active(&self) -> bool {
        self.state == "ACTIVE"
    }
    pub fn is_ethernet(&self) -> bool {
        self.link_layer.eq_ignore_ascii_case("ethernet")
    }
}

#[derive(Debug, Clone)]
pub struct Nic {
    pub name: String,
    /// Kernel driver of the PCI function (`mlx5_core`).
    pub driver: Option<String>,
    /// `MT4129` (ConnectX-7), `MT4131` (ConnectX-8), … (sysfs `hca_type`).
    pub hca_type: Option<String>,
    pub bdf: Option<String>,
    pub pci: Option<PciPath>,
    pub numa: Option<i64>,
    /// The physical function's address when this device is an SR-IOV virtual function.
    pub physfn: Option<String>,
    pub ports: Vec<Port>,
    /// `uverbsN` of this device (sysfs `infiniband_verbs/*/ibdev`).
    pub uverbs: Option<String>,
}

impl Nic {
    /// IBGDA drives mlx5 hardware directly (DEVX): only mlx5 devices qualify (DeepEP #759).
    pub fn is_mlx5(&self) -> bool {
        self.driver.as_deref() == Some("mlx5_core") || self.name.starts_with("mlx5_")
    }
    pub fn active_port(&self) -> Option<&Port> {
        self.ports.iter().find(|p| p.active())
    }
    pub fn is_ethernet(&self) -> bool {
        self.ports.first().is_some_and(Port::is_ethernet)
    }
}

/// PCIe distance between two devices, nvidia-smi topo's classes (nearest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize)]
pub enum Affinity {
    /// Through at most one PCIe switch.
    Pix,
    /// Through several PCIe bridges, without the host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU).
    Phb,
    /// Between host bridges of one NUMA node.
    Node,
    /// Across the SMP interconnect between NUMA nodes (the farthest; the default).
    #[default]
    Sys,
}

impl Affinity {
    pub fn label(self) -> &'static str {
        match self {
            Affinity::Pix => "PIX",
            Affinity::Pxb => "PXB",
            Affinity::Phb => "PHB",
            Affinity::Node => "NODE",
            Affinity::Sys => "SYS",
        }
    }
}

/// The distance class between two devices from their sysfs paths and NUMA nodes.
pub fn affinity(a: &PciPath, numa_a: Option<i64>, b: &PciPath, numa_b: Option<i64>) -> Affinity {
    if a.host_bridge != b.host_bridge {
        // -1: the platform reports no NUMA node; one socket.
        let same = matches!((numa_a, numa_b), (Some(x), Some(y)) if x == y);
        return if same { Affinity::Node } else { Affinity::Sys };
    }
    let common = a.chain.iter().zip(&b.chain).take_while(|(x, y)| x == y).count();
    if common == 0 {
        return Affinity::Phb;
    }
    // Bridges on the way: each side's below the common one, plus the common one.
    let below = |c: &Vec<String>| c.len().saturating_sub(1 + common);
    if below(&a.chain) + below(&b.chain) < 3 { Affinity::Pix } else { Affinity::Pxb }
}

pub struct Facts {
    pub gpus: Probed<Vec<Gpu>>,
    pub nics: Vec<Nic>,
    pub devinfo: Probed<Vec<DevInfo>>,
    pub modules: Probed<Vec<String>>,
    /// /proc/self/status.
    pub status: Option<String>,
}

impl Facts {
    pub fn gather(node: &Node) -> Facts {
        let gpus = node.gpus.gpus().map(|list| {
            list.into_iter()
                .map(|info| {
                    let dev = format!("/sys/bus/pci/devices/{}", info.bus_id);
                    let pci = node.files.canonical(&dev).ok().and_then(|c| parse::pci_path(&c));
                    let numa = node.attr(&format!("{dev}/numa_node")).and_then(|n| n.parse().ok());
                    Gpu { info, pci, numa }
                })
                .collect()
        });
        let nics = node.entries(IB).into_iter().map(|name| read_nic(node, &name)).collect();
        let devinfo = node.verbs.devinfo().map(|t| parse::parse_devinfo(&t));
        let modules = node.files.read("/proc/modules").map(|t| parse::modules(&t));
        Facts { gpus, nics, devinfo, modules, status: node.files.read("/proc/self/status").ok() }
    }

    pub fn nic(&self, name: &str) -> Option<&Nic> {
        self.nics.iter().find(|n| n.name == name)
    }

    pub fn devinfo_of(&self, name: &str) -> Option<&DevInfo> {
        self.devinfo.as_ref().ok()?.iter().find(|d| d.name == name)
    }

    /// The GPU with CUDA ordinal `index`.
    pub fn gpu(&self, index: u32) -> Option<&Gpu> {
        self.gpus.as_ref().ok()?.iter().find(|g| g.info.index == index)
    }

    /// Distance from a GPU to a NIC, when both have a place in the PCI tree.
    pub fn distance(&self, gpu: &Gpu, nic: &Nic) -> Option<Affinity> {
        Some(affinity(gpu.pci.as_ref()?, gpu.numa, nic.pci.as_ref()?, nic.numa))
    }
}

/// `4: ACTIVE` → `ACTIVE`.
fn strip_number(value: &str) -> String {
    value.split_once(':').map_or(value, |(_, v)| v).trim().to_string()
}

fn read_nic(node: &Node, name: &str) -> Nic {
    let dev = format!("{IB}/{name}");
    let canonical = node.files.canonical(&format!("{dev}/device")).ok();
    let pci = canonical.as_deref().and_then(parse::pci_path);
    let bdf = pci.as_ref().and_then(|p| p.chain.last().cloned());
    let physfn = node.link_name(&format!("{dev}/device/physfn"));
    let ports = node
        .entries(&format!("{dev}/ports"))
        .into_iter()
        .filter_map(|p| p.parse::<u32>().ok())
        .map(|num| read_port(node, &format!("{dev}/ports/{num}"), num))
        .collect();
    let uverbs = node.entries("/sys/class/infiniband_verbs").into_iter().find(|u| {
        node.attr(&format!("/sys/class/infiniband_verbs/{u}/ibdev")).as_deref() == Some(name)
    });
    Nic {
        name: name.to_string(),
        driver: node.link_name(&format!("{dev}/device/driver")),
        hca_type: node.attr(&format!("{dev}/hca_type")),
        bdf,
        pci,
        numa: node.attr(&format!("{dev}/device/numa_node")).and_then(|n| n.parse().ok()),
        physfn,
        ports,
        uverbs,
    }
}

fn read_port(node: &Node, dir: &str, num: u32) -> Port {
    let attr = |a: &str| node.attr(&format!("{dir}/{a}")).unwrap_or_default();
    let mut gids: Vec<Gid> = node
        .entries(&format!("{dir}/gids"))
        .into_iter()
        .filter_map(|i| i.parse::<u32>().ok())
        .filter_map(|index| {
            let gid = node.attr(&format!("{dir}/gids/{index}"))?;
            if parse::gid_is_empty(&gid) {
                return None;
            }
            Some(Gid {
                index,
                gid,
                kind: node.attr(&format!("{dir}/gid_attrs/types/{index}")),
                netdev: node.attr(&format!("{dir}/gid_attrs/ndevs/{index}")),
            })
        })
        .collect();
    gids.sort_by_key(|g| g.index);
    Port {
        num,
        state: strip_number(&attr("state")),
        phys_state: strip_number(&attr("phys_state")),
        link_layer: attr("link_layer"),
        rate: attr("rate"),
        gids,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(s: &str) -> PciPath {
        parse::pci_path(s).unwrap()
    }

    #[test]
    fn affinity_classes() {
        let gpu =
            path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0");
        let nic_same_switch =
            path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0");
        let nic_nested = path(
            "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0",
        );
        let nic_other_root = path("/sys/devices/pci0000:00/0000:00:02.0/0000:08:00.0");
        let nic_other_host = path("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0");
        assert_eq!(affinity(&gpu, Some(0), &nic_same_switch, Some(0)), Affinity::Pix);
        assert_eq!(affinity(&gpu, Some(0), &nic_nested, Some(0)), Affinity::Pxb);
        assert_eq!(affinity(&gpu, Some(0), &nic_other_root, Some(0)), Affinity::Phb);
        assert_eq!(affinity(&gpu, Some(0), &nic_other_host, Some(0)), Affinity::Node);
        assert_eq!(affinity(&gpu, Some(0), &nic_other_host, Some(1)), Affinity::Sys);
        assert!(Affinity::Pix < Affinity::Sys);
    }
}
