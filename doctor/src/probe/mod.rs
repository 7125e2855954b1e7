//! What the checks may ask of a node, behind four traits, each with a recorded-snapshot
//! implementation (`snapshot.rs`: a directory of fixture files) and a live one (`live.rs`:
//! sysfs and /proc reads, NVML and the CUDA driver loaded at run time, `ibv_devinfo -v` with a
//! time limit, the RDMA provider library read from disk).
//!
//! API Boundary: the checks see a node only through [`Node`]. A probe that cannot answer
//! returns a [`ProbeError`] saying why (absent, denied, not installed, timed out); it never
//! panics, and the check reports "skip" with that reason.

pub mod live;
pub mod snapshot;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a probe gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeError {
    /// The file, directory or device does not exist on this node.
    Absent(String),
    /// It exists but this process may not read it (permissions, capabilities).
    Denied(String),
    /// The library, tool or driver the probe needs is not here.
    Unavailable(String),
    /// It ran and failed (bad output, an error code, a time-out).
    Failed(String),
}

impl ProbeError {
    pub fn is_absent(&self) -> bool {
        matches!(self, ProbeError::Absent(_))
    }
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::Absent(p) => write!(f, "{p} does not exist"),
            ProbeError::Denied(p) => write!(f, "{p}: permission denied"),
            ProbeError::Unavailable(why) | ProbeError::Failed(why) => f.write_str(why),
        }
    }
}

pub type Probed<T> = Result<T, ProbeError>;

/// Files of the node: sysfs, /proc, /dev and /etc, by their absolute paths.
pub trait NodeFiles {
    /// A text file (sysfs attribute, /proc extract), as read.
    fn read(&self, path: &str) -> Probed<String>;
    /// A binary file (a PCI device's `config`): an unprivileged read of sysfs `config` returns
    /// the first 64 bytes only.
    fn read_bytes(&self, path: &str) -> Probed<Vec<u8>>;
    /// The names in a directory, sorted.
    fn list(&self, dir: &str) -> Probed<Vec<String>>;
    /// The path with every symbolic link resolved (sysfs device links).
    fn canonical(&self, path: &str) -> Probed<String>;
    /// A device node's permissions and whether this process may open it read-write.
    fn device_node(&self, path: &str) -> Probed<DeviceNode>;
    /// Whether the path exists (file, directory or link).
    fn exists(&self, path: &str) -> bool {
        self.canonical(path).is_ok()
    }
}

/// A character device as `ls -l` and `access(2)` see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    /// Permission bits, e.g. 0o666.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// `access(path, R_OK | W_OK)` for this process.
    pub read_write: bool,
}

/// One GPU as NVML and the CUDA driver describe it, in CUDA ordinal order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuInfo {
    /// CUDA ordinal (the order the ranks' `torch.cuda.set_device` uses).
    pub index: u32,
    pub name: String,
    /// `GPU-…` as `nvidia-smi -L` prints it.
    pub uuid: String,
    /// PCI bus id, `0000:17:00.0`.
    pub bus_id: String,
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (None: not asked, e.g. no CUDA driver).
    #[serde(default)]
    pub dma_buf: Option<bool>,
    /// NVML's GPU fabric state (MNNVL systems), e.g. `completed`, `not-supported`.
    #[serde(default)]
    pub fabric: Option<String>,
}

/// Peer access from one GPU to another (directed: CUDA's answer may differ by direction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerAccess {
    /// `cuDeviceCanAccessPeer(from, to)`; None when CUDA could not be asked.
    pub cuda: Option<bool>,
    /// `nvmlDeviceGetP2PStatus(from, to, NVLINK) == OK`; None when NVML could not be asked.
    pub nvlink: Option<bool>,
}

/// The node's GPUs.
pub trait GpuProbe {
    /// Where the answers come from ("NVML 580.159.04, CUDA 13.0", "snapshot …").
    fn source(&self) -> String;
    fn gpus(&self) -> Probed<Vec<GpuInfo>>;
    /// Directed peer access between CUDA ordinals `from` ≠ `to`.
    fn peer(&self, from: u32, to: u32) -> Probed<PeerAccess>;
}

/// Device limits of the RDMA devices (`ibv_query_device`).
pub trait VerbsProbe {
    /// `ibv_devinfo -v` output (every device), or why it could not be had.
    fn devinfo(&self) -> Probed<String>;
}

/// A shared library as the dynamic loader would find it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LibraryInfo {
    pub path: String,
    /// Symbol-version names it defines (`MLX5_1.24`), from its version-definition strings.
    pub versions: Vec<String>,
}

/// Libraries and the process environment.
pub trait HostProbe {
    /// Find a library by soname (`libmlx5.so.1`) where the loader looks.
    fn library(&self, soname: &str) -> Probed<LibraryInfo>;
    /// The process environment (NVSHMEM_*, NCCL_*, CUDA_VISIBLE_DEVICES, launcher variables).
    fn environment(&self) -> BTreeMap<String, String>;
    /// The node's host name.
    fn hostname(&self) -> String;
    /// This process runs as root (uid 0).
    fn is_root(&self) -> bool;
}

/// Everything a check may ask, and where it came from.
pub struct Node {
    /// "live" or "snapshot <dir>".
    pub origin: String,
    pub files: Box<dyn NodeFiles>,
    pub gpus: Box<dyn GpuProbe>,
    pub verbs: Box<dyn VerbsProbe>,
    pub host: Box<dyn HostProbe>,
}

impl Node {
    /// A file's trimmed text, `None` when it cannot be read.
    pub fn attr(&self, path: &str) -> Option<String> {
        self.files.read(path).ok().map(|s| s.trim().to_string())
    }

    /// The last component of a link's target (a device's `driver`), `None` when absent.
    pub fn link_name(&self, path: &str) -> Option<String> {
        let target = self.files.canonical(path).ok()?;
        target.rsplit('/').next().map(str::to_string)
    }

    /// A directory's entries, empty when it cannot be listed.
    pub fn entries(&self, dir: &str) -> Vec<String> {
        self.files.list(dir).unwrap_or_default()
    }
}
