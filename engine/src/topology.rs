//! The cluster as DeepEP and the models see it: ranks on GPUs, GPUs in nodes and NVLink
//! domains, and the NVLink connectivity check (`check_nvlink_connections`) behind a probe.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::{GpuId, Rank};
use crate::profile::ProfileCluster;
use crate::scenario::schema::NvlinkKind;

/// DeepEP's NVLink domain size (`NUM_MAX_NVL_PEERS`, configs.cuh): ranks `[8k, 8k+8)` form one
/// "node" in DeepEP's geometry whatever the hardware is.
pub const NUM_MAX_NVL_PEERS: u32 = 8;
/// `NUM_MAX_RDMA_PEERS` (configs.cuh): nodes in normal internode mode.
pub const NUM_MAX_RDMA_PEERS: u32 = 20;

/// Physical layout of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub ranks_per_gpu: u32,
    pub nvlink: NvlinkKind,
    pub nvlink_domain_gpus: u32,
}

/// How bytes get from one rank's GPU to another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PeerPath {
    /// Both ranks live on the same GPU: a device-local copy through HBM.
    SameGpu,
    /// Same NVLink domain (NVSwitch, MNNVL, or a PCIe card's NVLink bridge).
    Nvlink,
    /// Same node, no NVLink: GPU peer-to-peer over PCIe.
    Pcie,
    /// Different nodes outside one NVLink domain: RDMA through the NICs.
    Rdma,
}

impl Topology {
    pub fn from_profile(cluster: &ProfileCluster) -> Self {
        Topology {
            nodes: cluster.nodes,
            gpus_per_node: cluster.gpus_per_node,
            ranks_per_gpu: cluster.ranks_per_gpu,
            nvlink: cluster.nvlink,
            nvlink_domain_gpus: cluster.nvlink_domain_gpus,
        }
    }

    pub fn num_gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }

    pub fn num_ranks(&self) -> u32 {
        self.num_gpus() * self.ranks_per_gpu
    }

    pub fn gpu_of(&self, rank: Rank) -> GpuId {
        GpuId(rank.0 / self.ranks_per_gpu)
    }

    /// Physical node (server / compute tray) of a GPU.
    pub fn node_of_gpu(&self, gpu: GpuId) -> u32 {
        gpu.0 / self.gpus_per_node
    }

    pub fn node_of_rank(&self, rank: Rank) -> u32 {
        self.node_of_gpu(self.gpu_of(rank))
    }

    /// Index of the GPU inside its node (its rail: the NIC it uses in a rail-optimized fabric).
    pub fn local_gpu_index(&self, gpu: GpuId) -> u32 {
        gpu.0 % self.gpus_per_node
    }

    /// The NVLink domain a GPU belongs to, `None` without NVLink.
    pub fn nvlink_domain(&self, gpu: GpuId) -> Option<u32> {
        match self.nvlink {
            NvlinkKind::Node => Some(self.node_of_gpu(gpu)),
            NvlinkKind::Mnnvl => Some(gpu.0 / self.nvlink_domain_gpus.max(1)),
            NvlinkKind::PciePairs => Some(gpu.0 / 2),
            NvlinkKind::None => None,
        }
    }

    pub fn nvlink_connected(&self, a: GpuId, b: GpuId) -> bool {
        a == b
            || matches!((self.nvlink_domain(a), self.nvlink_domain(b)), (Some(x), Some(y)) if x == y)
    }

    /// The path between two GPUs in hardware terms (before any DeepEP/NVSHMEM policy such as
    /// `NVSHMEM_DISABLE_P2P` or `NVSHMEM_DISABLE_MNNVL` is applied).
    pub fn gpu_path(&self, a: GpuId, b: GpuId) -> PeerPath {
        if a == b {
            PeerPath::SameGpu
        } else if self.nvlink_connected(a, b) {
            PeerPath::Nvlink
        } else if self.node_of_gpu(a) == self.node_of_gpu(b) {
            PeerPath::Pcie
        } else {
            PeerPath::Rdma
        }
    }

    pub fn rank_path(&self, a: Rank, b: Rank) -> PeerPath {
        self.gpu_path(self.gpu_of(a), self.gpu_of(b))
    }
}

/// Where GPU facts come from: the scenario's declared topology, or NVML on a GPU machine.
#[cfg_attr(test, mockall::automock)]
pub trait TopologyProbe {
    /// A human-readable name of the source ("declared topology of x.toml", "NVML 12.580").
    fn source(&self) -> String;
    fn gpu_count(&self) -> Result<u32, String>;
    /// The device name as CUDA/NVML prints it (DeepEP looks for the substring `PCIE` in it).
    fn gpu_name(&self, gpu: u32) -> Result<String, String>;
    /// `nvmlDeviceGetP2PStatus(a, b, NVML_P2P_CAPS_INDEX_NVLINK) == OK`.
    fn nvlink_p2p_ok(&self, a: u32, b: u32) -> Result<bool, String>;
    /// The NVLink domain of each of `gpus` (`None`: no NVLink), when the probe knows its
    /// connectivity as domains — every pair in one domain connected, no pair across — so the
    /// check need not ask pair by pair (a declared topology of 16,384 GPUs has 134 million
    /// pairs). `None`: ask [`Self::nvlink_p2p_ok`] (NVML, one machine's GPUs).
    fn nvlink_domains(&self, _gpus: &[u32]) -> Option<Vec<Option<u32>>> {
        None
    }
}

/// The probe over a scenario's declared topology.
pub struct DeclaredProbe {
    pub topology: Topology,
    pub gpu_name: String,
    pub label: String,
}

impl TopologyProbe for DeclaredProbe {
    fn source(&self) -> String {
        self.label.clone()
    }
    fn gpu_count(&self) -> Result<u32, String> {
        Ok(self.topology.num_gpus())
    }
    fn gpu_name(&self, _gpu: u32) -> Result<String, String> {
        Ok(self.gpu_name.clone())
    }
    fn nvlink_p2p_ok(&self, a: u32, b: u32) -> Result<bool, String> {
        Ok(a != b && self.topology.nvlink_connected(GpuId(a), GpuId(b)))
    }
    fn nvlink_domains(&self, gpus: &[u32]) -> Option<Vec<Option<u32>>> {
        Some(gpus.iter().map(|&g| self.topology.nvlink_domain(GpuId(g))).collect())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NvlinkCheckMode {
    /// Exactly DeepEP's `check_nvlink_connections`: only device names containing `PCIE`
    /// (case-sensitive) are checked; then at most 2 GPUs, every pair NVLink-connected.
    DeepEp,
    /// Every pair of GPUs expected to share an NVLink domain must be connected.
    Strict,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairStatus {
    pub a: u32,
    pub b: u32,
    pub nvlink: bool,
}

/// GPUs up to which the report lists every pair (a matrix a terminal can show); beyond, it
/// counts them and names failures per domain.
pub const PAIR_LIST_GPUS: usize = 32;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvlinkReport {
    pub source: String,
    pub mode: NvlinkCheckMode,
    pub gpus: Vec<u32>,
    pub names: Vec<String>,
    /// Every pair, up to [`PAIR_LIST_GPUS`] GPUs; empty beyond.
    pub pairs: Vec<PairStatus>,
    /// Pairs NVLink-connected, of all pairs of `gpus`.
    pub connected_pairs: u64,
    pub total_pairs: u64,
    /// Why the check did nothing or passed/failed, one line each.
    pub notes: Vec<String>,
    /// Failures; empty means the check passed.
    pub failures: Vec<String>,
    pub bypassed: bool,
}

impl NvlinkReport {
    pub fn passed(&self) -> bool {
        self.bypassed || self.failures.is_empty()
    }
}

/// How the GPUs of a check are connected: by the probe's domains, or pair by pair.
struct Connectivity<'p> {
    probe: &'p dyn TopologyProbe,
    gpus: &'p [u32],
    domains: Option<Vec<Option<u32>>>,
}

impl Connectivity<'_> {
    fn connected(&self, i: usize, j: usize) -> Result<bool, String> {
        match &self.domains {
            Some(d) => Ok(i != j && d[i].is_some() && d[i] == d[j]),
            None => self.probe.nvlink_p2p_ok(self.gpus[i], self.gpus[j]),
        }
    }

    /// Connected pairs among all the GPUs: counted from the domains in linear time, else
    /// probed pair by pair.
    fn count(&self) -> Result<u64, String> {
        if let Some(d) = &self.domains {
            let mut sizes: BTreeMap<u32, u64> = BTreeMap::new();
            for domain in d.iter().flatten() {
                *sizes.entry(*domain).or_default() += 1;
            }
            return Ok(sizes.values().map(|n| n * (n - 1) / 2).sum());
        }
        let mut connected = 0;
        for i in 0..self.gpus.len() {
            for j in i + 1..self.gpus.len() {
                connected += u64::from(self.connected(i, j)?);
            }
        }
        Ok(connected)
    }
}

/// GPUs as ranges: "0-3, 8, 10-11".
fn gpu_ranges(gpus: &[u32]) -> String {
    let mut sorted = gpus.to_vec();
    sorted.sort_unstable();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            sorted[i].to_string()
        } else {
            format!("{}-{}", sorted[i], sorted[j])
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// Run the NVLink check over `gpus`. `expected_domains[i]` is the domain GPU `gpus[i]` should
/// share with the others (strict mode checks pairs with equal domains); `bypass` is
/// `DISABLE_NVLINK_CHECK=1` / `--disable-nvlink` (an eptwin switch: DeepEP has none). Linear in
/// GPUs when the probe knows its domains (a declared topology); pair by pair otherwise.
pub fn check_nvlink_connections(
    probe: &dyn TopologyProbe,
    gpus: &[u32],
    expected_domains: &[Option<u32>],
    mode: NvlinkCheckMode,
    bypass: bool,
) -> Result<NvlinkReport, String> {
    let names = gpus.iter().map(|&g| probe.gpu_name(g)).collect::<Result<Vec<_>, _>>()?;
    let link = Connectivity { probe, gpus, domains: probe.nvlink_domains(gpus) };
    let n = gpus.len();
    let mut pairs = Vec::new();
    if n <= PAIR_LIST_GPUS {
        for i in 0..n {
            for j in i + 1..n {
                pairs.push(PairStatus { a: gpus[i], b: gpus[j], nvlink: link.connected(i, j)? });
            }
        }
    }
    let connected_pairs = if n <= PAIR_LIST_GPUS {
        pairs.iter().filter(|p| p.nvlink).count() as u64
    } else {
        link.count()?
    };
    let mut report = NvlinkReport {
        source: probe.source(),
        mode,
        gpus: gpus.to_vec(),
        names: names.clone(),
        pairs,
        connected_pairs,
        total_pairs: n as u64 * n.saturating_sub(1) as u64 / 2,
        notes: Vec::new(),
        failures: Vec::new(),
        bypassed: bypass,
    };
    if bypass {
        report.notes.push("check bypassed (DISABLE_NVLINK_CHECK=1 or --disable-nvlink; eptwin's switch, DeepEP has none)".into());
        return Ok(report);
    }
    match mode {
        NvlinkCheckMode::DeepEp => {
            // utils.py:64-101: `if 'PCIE' in torch.cuda.get_device_name()` (case-sensitive).
            let pcie = names.iter().any(|n| n.contains("PCIE"));
            if !pcie {
                if names.iter().any(|n| n.to_uppercase().contains("PCIE")) {
                    report.notes.push(
                        "device name spells \"PCIe\" but DeepEP looks for uppercase \"PCIE\": DeepEP checks nothing here".into(),
                    );
                } else {
                    report.notes.push(
                        "not a PCIE SKU: DeepEP's check does nothing (SXM parts are never checked)"
                            .into(),
                    );
                }
                return Ok(report);
            }
            if n > 2 {
                report.failures.push(format!(
                    "PCIe GPUs only have pairwise NVLink connections: group size {n} > 2 (utils.py:75)"
                ));
            }
            if n <= PAIR_LIST_GPUS {
                for p in &report.pairs {
                    if !p.nvlink {
                        report.failures.push(format!(
                            "GPU {} and GPU {} are not connected by NVLink",
                            p.a, p.b
                        ));
                    }
                }
            } else if report.connected_pairs < report.total_pairs {
                report.failures.push(format!(
                    "{} of {} GPU pairs are not connected by NVLink",
                    report.total_pairs - report.connected_pairs,
                    report.total_pairs
                ));
            }
        }
        NvlinkCheckMode::Strict => strict(&link, expected_domains, &mut report)?,
    }
    Ok(report)
}

/// Strict mode: every pair of GPUs expected in one NVLink domain is connected.
fn strict(
    link: &Connectivity<'_>,
    expected: &[Option<u32>],
    report: &mut NvlinkReport,
) -> Result<(), String> {
    let mut members: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, d) in expected.iter().enumerate().take(link.gpus.len()) {
        if let Some(d) = d {
            members.entry(*d).or_default().push(i);
        }
    }
    for (domain, m) in &members {
        if let Some(probed) = &link.domains {
            // Connected exactly when they all lie in one probed domain.
            let mut groups: BTreeMap<Option<u32>, Vec<u32>> = BTreeMap::new();
            for &i in m {
                groups.entry(probed[i]).or_default().push(link.gpus[i]);
            }
            let whole = groups.len() == 1 && !groups.contains_key(&None);
            if !whole && m.len() > 1 {
                let parts: Vec<String> = groups
                    .iter()
                    .map(|(d, g)| match d {
                        Some(_) => format!("{{{}}}", gpu_ranges(g)),
                        None => format!("{{{}}} without NVLink", gpu_ranges(g)),
                    })
                    .collect();
                report.failures.push(format!(
                    "GPUs {} should share NVLink domain {domain} but form {} NVLink groups: {}",
                    gpu_ranges(&m.iter().map(|&i| link.gpus[i]).collect::<Vec<_>>()),
                    groups.len(),
                    parts.join(", ")
                ));
            }
            continue;
        }
        for (x, &i) in m.iter().enumerate() {
            for &j in &m[x + 1..] {
                if !link.connected(i, j)? {
                    report.failures.push(format!(
                        "GPU {} and GPU {} should share NVLink domain {domain} but are not NVLink-connected",
                        link.gpus[i], link.gpus[j]
                    ));
                }
            }
        }
    }
    if report.failures.is_empty() {
        report.notes.push("every GPU pair within an NVLink domain is connected".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(nvlink: NvlinkKind, nodes: u32, gpn: u32, rpg: u32, domain: u32) -> Topology {
        Topology {
            nodes,
            gpus_per_node: gpn,
            ranks_per_gpu: rpg,
            nvlink,
            nvlink_domain_gpus: domain,
        }
    }

    #[test]
    fn paths() {
        let t = topo(NvlinkKind::Node, 2, 8, 1, 8);
        assert_eq!(t.rank_path(Rank(0), Rank(7)), PeerPath::Nvlink);
        assert_eq!(t.rank_path(Rank(0), Rank(8)), PeerPath::Rdma);
        let single = topo(NvlinkKind::Node, 1, 1, 8, 1);
        assert_eq!(single.num_ranks(), 8);
        assert_eq!(single.rank_path(Rank(0), Rank(7)), PeerPath::SameGpu);
        let nvl72 = topo(NvlinkKind::Mnnvl, 18, 4, 1, 72);
        assert_eq!(nvl72.rank_path(Rank(0), Rank(71)), PeerPath::Nvlink);
        let pairs = topo(NvlinkKind::PciePairs, 1, 4, 1, 2);
        assert_eq!(pairs.rank_path(Rank(0), Rank(1)), PeerPath::Nvlink);
        assert_eq!(pairs.rank_path(Rank(1), Rank(2)), PeerPath::Pcie);
    }

    #[test]
    fn deepep_mode_checks_only_uppercase_pcie_names() {
        let mut probe = MockTopologyProbe::new();
        probe.expect_source().return_const("mock".to_string());
        probe.expect_gpu_name().returning(|_| Ok("NVIDIA H800".into()));
        probe.expect_nvlink_p2p_ok().returning(|_, _| Ok(false));
        probe.expect_nvlink_domains().returning(|_| None);
        let r =
            check_nvlink_connections(&probe, &[0, 1, 2, 3], &[], NvlinkCheckMode::DeepEp, false)
                .unwrap();
        assert!(r.passed(), "SXM parts are never checked");

        let mut probe = MockTopologyProbe::new();
        probe.expect_source().return_const("mock".to_string());
        probe.expect_gpu_name().returning(|_| Ok("NVIDIA H100 PCIE".into()));
        probe.expect_nvlink_p2p_ok().returning(|a, b| Ok(a / 2 == b / 2));
        probe.expect_nvlink_domains().returning(|_| None);
        let r =
            check_nvlink_connections(&probe, &[0, 1], &[], NvlinkCheckMode::DeepEp, false).unwrap();
        assert!(r.passed());
        let r = check_nvlink_connections(&probe, &[0, 1, 2], &[], NvlinkCheckMode::DeepEp, false)
            .unwrap();
        assert!(!r.passed());
        assert!(r.failures.iter().any(|f| f.contains("group size 3")));
        assert!(r.failures.iter().any(|f| f.contains("GPU 1 and GPU 2")));
        let r = check_nvlink_connections(&probe, &[0, 1, 2], &[], NvlinkCheckMode::DeepEp, true)
            .unwrap();
        assert!(r.passed() && r.bypassed);
    }

    #[test]
    fn strict_mode_checks_pairs_within_domains() {
        let mut probe = MockTopologyProbe::new();
        probe.expect_source().return_const("mock".to_string());
        probe.expect_gpu_name().returning(|_| Ok("NVIDIA H200".into()));
        // GPU 3 lost its NVLink.
        probe.expect_nvlink_p2p_ok().returning(|a, b| Ok(a != 3 && b != 3));
        probe.expect_nvlink_domains().returning(|_| None);
        let domains = [Some(0), Some(0), Some(0), Some(0)];
        let r = check_nvlink_connections(
            &probe,
            &[0, 1, 2, 3],
            &domains,
            NvlinkCheckMode::Strict,
            false,
        )
        .unwrap();
        assert_eq!(r.failures.len(), 3);
        let domains = [Some(0), Some(0), Some(0), Some(1)];
        let r = check_nvlink_connections(
            &probe,
            &[0, 1, 2, 3],
            &domains,
            NvlinkCheckMode::Strict,
            false,
        )
        .unwrap();
        assert!(r.passed());
    }

    /// A declared topology is checked by its domains: 16,384 GPUs without asking 134 million
    /// pairs (a probe that counts its pair questions), and a split domain named by its
    /// groups.
    #[test]
    fn declared_domains_are_checked_in_linear_time() {
        struct Counting(DeclaredProbe, std::cell::Cell<u64>);
        impl TopologyProbe for Counting {
            fn source(&self) -> String {
                self.0.source()
            }
            fn gpu_count(&self) -> Result<u32, String> {
                self.0.gpu_count()
            }
            fn gpu_name(&self, gpu: u32) -> Result<String, String> {
                self.0.gpu_name(gpu)
            }
            fn nvlink_p2p_ok(&self, a: u32, b: u32) -> Result<bool, String> {
                self.1.set(self.1.get() + 1);
                self.0.nvlink_p2p_ok(a, b)
            }
            fn nvlink_domains(&self, gpus: &[u32]) -> Option<Vec<Option<u32>>> {
                self.0.nvlink_domains(gpus)
            }
        }
        let topology = topo(NvlinkKind::Mnnvl, 2048, 8, 1, 16_384);
        let probe = Counting(
            DeclaredProbe { topology, gpu_name: "NVIDIA GB200 PCIE".into(), label: "t".into() },
            std::cell::Cell::new(0),
        );
        let gpus: Vec<u32> = (0..16_384).collect();
        let domains = vec![Some(0); gpus.len()];
        let r = check_nvlink_connections(&probe, &gpus, &domains, NvlinkCheckMode::Strict, false)
            .unwrap();
        assert!(r.passed(), "{:?}", r.failures);
        assert_eq!((r.connected_pairs, r.total_pairs), (134_209_536, 134_209_536));
        assert!(r.pairs.is_empty());
        let r =
            check_nvlink_connections(&probe, &gpus, &[], NvlinkCheckMode::DeepEp, false).unwrap();
        assert_eq!(r.failures.len(), 1, "group size only: {:?}", r.failures);
        assert_eq!(probe.1.get(), 0, "no pair asked");
        // Expected as one domain, declared as two.
        let split = topo(NvlinkKind::Mnnvl, 2, 4, 1, 4);
        let probe = DeclaredProbe { topology: split, gpu_name: "G".into(), label: "t".into() };
        let r = check_nvlink_connections(
            &probe,
            &(0..8).collect::<Vec<_>>(),
            &[Some(0); 8],
            NvlinkCheckMode::Strict,
            false,
        )
        .unwrap();
        assert_eq!(
            r.failures,
            ["GPUs 0-7 should share NVLink domain 0 but form 2 NVLink groups: {0-3}, {4-7}"]
        );
    }
}
