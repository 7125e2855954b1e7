//! Parsers for what the probes return: `ibv_devinfo -v`, /proc extracts, sysfs values, PCI
//! config space, the routing table. Shared by the live and the recorded node, so every
//! fixture exercises the same code a real node does.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// One RDMA device as `ibv_devinfo -v` prints it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevInfo {
    pub name: String,
    /// Device attributes (`max_qp`, `max_qp_wr`, `max_cqe`, `fw_ver`, …) as printed.
    pub attrs: BTreeMap<String, String>,
    /// Ports by number: their attributes (`state`, `active_mtu`, `link_layer`, …).
    pub ports: BTreeMap<u32, BTreeMap<String, String>>,
}

impl DevInfo {
    /// A numeric attribute (decimal or 0x-hex, the first word).
    pub fn number(&self, key: &str) -> Option<u64> {
        self.attrs.get(key).and_then(|v| parse_number(v))
    }

    /// A port's active MTU in bytes (`4096 (5)`).
    pub fn active_mtu(&self, port: u32) -> Option<u64> {
        self.ports.get(&port)?.get("active_mtu").and_then(|v| parse_number(v))
    }
}

/// The first word of a value as a number: decimal, or hex with `0x`.
pub fn parse_number(value: &str) -> Option<u64> {
    let word = value.split_whitespace().next()?;
    match word.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => word.parse().ok(),
    }
}

/// `ibv_devinfo -v`: one block per `hca_id:`, port blocks after `port:`.
pub fn parse_devinfo(text: &str) -> Vec<DevInfo> {
    let mut devices: Vec<DevInfo> = Vec::new();
    let mut port: Option<u32> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        let Some((key, value)) = trimmed.split_once(':') else { continue };
        let (key, value) = (key.trim(), value.trim());
        if key == "hca_id" {
            devices.push(DevInfo { name: value.to_string(), ..DevInfo::default() });
            port = None;
            continue;
        }
        let Some(dev) = devices.last_mut() else { continue };
        if key == "port" {
            port = value.parse().ok();
            if let Some(p) = port {
                dev.ports.entry(p).or_default();
            }
            continue;
        }
        match port {
            Some(p) => {
                dev.ports.entry(p).or_default().insert(key.to_string(), value.to_string());
            }
            None => {
                dev.attrs.insert(key.to_string(), value.to_string());
            }
        }
    }
    devices
}

/// A `Key:\tvalue` field of /proc/self/status.
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then_some(v.trim())
    })
}

/// Linux capability names by bit (capability.h).
const CAPS: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// The effective capabilities (`CapEff` of /proc/self/status) by name.
pub fn effective_caps(status: &str) -> Option<Vec<&'static str>> {
    let bits = u64::from_str_radix(status_field(status, "CapEff")?, 16).ok()?;
    Some(CAPS.iter().enumerate().filter(|(i, _)| bits >> i & 1 == 1).map(|(_, n)| *n).collect())
}

/// Whether every capability this kernel knows is effective (`--privileged`, root on the host).
pub fn all_caps(status: &str) -> bool {
    effective_caps(status).is_some_and(|c| c.len() >= 38)
}

/// `Max locked memory` soft limit of /proc/self/limits: `None` = unlimited.
pub fn memlock_soft_bytes(limits: &str) -> Option<Option<u64>> {
    let line = limits.lines().find(|l| l.starts_with("Max locked memory"))?;
    let soft = line["Max locked memory".len()..].split_whitespace().next()?;
    if soft == "unlimited" { Some(None) } else { soft.parse().ok().map(Some) }
}

/// Loaded module names of /proc/modules.
pub fn modules(text: &str) -> Vec<String> {
    text.lines().filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
}

/// `RegistryDwords` entries of /proc/driver/nvidia/params (`"PeerMappingOverride=1;"`).
pub fn registry_dwords(params: &str) -> BTreeMap<String, String> {
    let value = params
        .lines()
        .find_map(|l| l.trim().strip_prefix("RegistryDwords:"))
        .unwrap_or("")
        .trim()
        .trim_matches('"');
    dwords(value)
}

fn dwords(value: &str) -> BTreeMap<String, String> {
    value
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

/// `NVreg_RegistryDwords` set by `options nvidia …` lines of a modprobe configuration.
pub fn modprobe_registry_dwords(conf: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in conf.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        let mut words = line.split_whitespace();
        if words.next() != Some("options") || words.next() != Some("nvidia") {
            continue;
        }
        for w in words {
            if let Some(v) = w.strip_prefix("NVreg_RegistryDwords=") {
                out.extend(dwords(v.trim_matches('"').trim_matches('\'')));
            }
        }
    }
    out
}

/// `5.15.0-105-generic` → (5, 15).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// A PCI address as sysfs names it (`0000:17:00.0`).
pub fn is_bdf(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && name.chars().enumerate().all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// A device's place in the PCI tree, from its canonical sysfs path
/// (`/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciPath {
    /// The host bridge (`pci0000:15`).
    pub host_bridge: String,
    /// Bridges from the root port down, then the device itself (last).
    pub chain: Vec<String>,
}

pub fn pci_path(canonical: &str) -> Option<PciPath> {
    let rest = canonical.strip_prefix("/sys/devices/")?;
    let mut parts = rest.split('/');
    let host_bridge = parts.next().filter(|h| h.starts_with("pci"))?.to_string();
    let chain: Vec<String> = parts.take_while(|p| is_bdf(p)).map(String::from).collect();
    (!chain.is_empty()).then_some(PciPath { host_bridge, chain })
}

/// The PCIe capability of a device's config space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcieCap {
    /// Device/port type (PCIe Capabilities register bits 7:4): 0 endpoint, 4 root port,
    /// 5 switch upstream port, 6 switch downstream port.
    pub port_type: u8,
    /// Device Capabilities 2.
    pub devcap2: u32,
    /// Device Control 2.
    pub devctl2: u16,
}

/// DevCap2 bit 6: AtomicOp Routing Supported (switch and root ports).
pub const DEVCAP2_ATOMIC_ROUTING: u32 = 1 << 6;
/// DevCap2 bit 8: 64-bit AtomicOp Completer Supported.
pub const DEVCAP2_ATOMIC_COMP64: u32 = 1 << 8;
/// DevCtl2 bit 6: AtomicOp Requester Enable.
pub const DEVCTL2_ATOMIC_REQUESTER: u16 = 1 << 6;
/// DevCtl2 bit 7: AtomicOp Egress Blocking.
pub const DEVCTL2_ATOMIC_EGRESS_BLOCK: u16 = 1 << 7;

/// Find the PCIe capability (id 0x10) by walking the capability list from 0x34. `Err` says
/// why it could not be read (a short read is what an unprivileged process gets).
pub fn pcie_cap(config: &[u8]) -> Result<PcieCap, String> {
    if config.len() <= 64 {
        return Err(format!(
            "only {} bytes of config space readable: the PCIe capability lies beyond the first 64, which only root (CAP_SYS_ADMIN) may read",
            config.len()
        ));
    }
    let mut ptr = config[0x34] as usize & 0xfc;
    for _ in 0..48 {
        if ptr < 0x40 || ptr + 0x2a > config.len() {
            break;
        }
        if config[ptr] == 0x10 {
            let u32_at = |o: usize| {
                u32::from_le_bytes([config[o], config[o + 1], config[o + 2], config[o + 3]])
            };
            return Ok(PcieCap {
                port_type: (config[ptr + 2] >> 4) & 0xf,
                devcap2: u32_at(ptr + 0x24),
                devctl2: u16::from_le_bytes([config[ptr + 0x28], config[ptr + 0x29]]),
            });
        }
        ptr = config[ptr + 1] as usize & 0xfc;
    }
    Err("no PCIe capability in the config space".into())
}

/// `32.0 GT/s PCIe` → 32.0.
pub fn link_speed_gts(value: &str) -> Option<f64> {
    value.split_whitespace().next()?.parse().ok()
}

/// One row of /proc/net/route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub iface: String,
    pub destination: Ipv4Addr,
    pub mask: Ipv4Addr,
    pub gateway: Ipv4Addr,
}

impl Route {
    pub fn covers(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & u32::from(self.mask) == u32::from(self.destination) & u32::from(self.mask)
    }
}

pub fn routes(text: &str) -> Vec<Route> {
    let hex = |s: &str| u32::from_str_radix(s, 16).ok().map(|v| Ipv4Addr::from(v.to_le_bytes()));
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Route {
                iface: f.first()?.to_string(),
                destination: hex(f.get(1)?)?,
                gateway: hex(f.get(2)?)?,
                mask: hex(f.get(7)?)?,
            })
        })
        .collect()
}

/// The IPv4 address of an IPv4-mapped GID (`0000:…:ffff:0a00:0105` → 10.0.1.5).
pub fn gid_ipv4(gid: &str) -> Option<Ipv4Addr> {
    let rest = gid.trim().strip_prefix("0000:0000:0000:0000:0000:ffff:")?;
    let (hi, lo) = rest.split_once(':')?;
    let (hi, lo) = (u16::from_str_radix(hi, 16).ok()?, u16::from_str_radix(lo, 16).ok()?);
    Some(Ipv4Addr::from(((hi as u32) << 16) | lo as u32))
}

/// An all-zero GID: an unused entry of the table.
pub fn gid_is_empty(gid: &str) -> bool {
    gid.trim().chars().all(|c| c == '0' || c == ':')
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEVINFO: &str = "hca_id:\tmlx5_0\n\ttransport:\t\t\tInfiniBand (0)\n\tfw_ver:\t\t\t\t28.39.1002\n\tmax_qp:\t\t\t\t131072\n\tmax_qp_wr:\t\t\t32768\n\tmax_cqe:\t\t\t4194303\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\t\t\tactive_mtu:\t\t4096 (5)\n\t\t\tlink_layer:\t\tInfiniBand\n\nhca_id:\tmlx5_1\n\tmax_qp:\t\t\t\t0x100\n";

    #[test]
    fn devinfo_blocks_and_ports() {
        let d = parse_devinfo(DEVINFO);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].number("max_qp"), Some(131072));
        assert_eq!(d[0].number("max_cqe"), Some(4194303));
        assert_eq!(d[0].active_mtu(1), Some(4096));
        assert_eq!(d[0].ports[&1]["link_layer"], "InfiniBand");
        assert_eq!(d[1].number("max_qp"), Some(256));
    }

    #[test]
    fn proc_extracts() {
        let status = "Name:\tx\nUid:\t1000\t1000\t1000\t1000\nCapEff:\t00000000a80425fb\n";
        let caps = effective_caps(status).unwrap();
        assert!(caps.contains(&"CAP_NET_RAW") && !caps.contains(&"CAP_IPC_LOCK"));
        assert!(!all_caps(status));
        assert!(all_caps("CapEff:\t000001ffffffffff\n"));
        let limits = "Limit Soft Limit Hard Limit Units\nMax locked memory         65536                65536                bytes\n";
        assert_eq!(memlock_soft_bytes(limits), Some(Some(65536)));
        assert_eq!(memlock_soft_bytes("Max locked memory unlimited unlimited bytes"), Some(None));
        assert_eq!(
            modules("nvidia_peermem 16384 0 - Live 0x0\nmlx5_ib 1 0\n"),
            ["nvidia_peermem", "mlx5_ib"]
        );
        let params = "EnableMSI: 1\nRegistryDwords: \"PeerMappingOverride=1;RmFoo=2\"\n";
        assert_eq!(registry_dwords(params)["PeerMappingOverride"], "1");
        assert!(registry_dwords("RegistryDwords: \"\"\n").is_empty());
        let conf = "# c\noptions nvidia NVreg_RegistryDwords=\"PeerMappingOverride=1;\"\n";
        assert_eq!(modprobe_registry_dwords(conf)["PeerMappingOverride"], "1");
        assert_eq!(kernel_version("5.15.0-105-generic"), Some((5, 15)));
    }

    #[test]
    fn pci_paths_and_capabilities() {
        let p = pci_path("/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0").unwrap();
        assert_eq!(p.host_bridge, "pci0000:15");
        assert_eq!(p.chain, ["0000:15:01.0", "0000:16:00.0", "0000:17:00.0"]);
        assert!(pci_path("/sys/devices/virtual/net/lo").is_none());
        let mut cfg = vec![0u8; 256];
        cfg[0x34] = 0x60;
        cfg[0x60] = 0x01; // power management
        cfg[0x61] = 0x70;
        cfg[0x70] = 0x10;
        cfg[0x72] = 0x62; // version 2, type 6 (downstream port)
        cfg[0x70 + 0x24] = 0x40; // atomic routing
        let cap = pcie_cap(&cfg).unwrap();
        assert_eq!(cap.port_type, 6);
        assert_ne!(cap.devcap2 & DEVCAP2_ATOMIC_ROUTING, 0);
        assert!(pcie_cap(&cfg[..64]).unwrap_err().contains("root"));
        assert_eq!(link_speed_gts("32.0 GT/s PCIe"), Some(32.0));
    }

    #[test]
    fn routes_and_gids() {
        let text = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\neth2\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let r = routes(text);
        assert_eq!(r[0].destination, Ipv4Addr::new(10, 0, 0, 0));
        assert_eq!(r[0].mask, Ipv4Addr::new(255, 255, 255, 0));
        assert!(r[0].covers(Ipv4Addr::new(10, 0, 0, 7)));
        assert!(!r[0].covers(Ipv4Addr::new(10, 0, 1, 7)));
        assert_eq!(
            gid_ipv4("0000:0000:0000:0000:0000:ffff:0a00:0105"),
            Some(Ipv4Addr::new(10, 0, 1, 5))
        );
        assert!(gid_is_empty("0000:0000:0000:0000:0000:0000:0000:0000"));
        assert!(is_bdf("0000:17:00.0") && !is_bdf("pci0000:15"));
    }
}
