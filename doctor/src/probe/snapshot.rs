//! A node recorded as a directory of fixture files (docs/doctor.md, "Recorded nodes"):
//!
//! * `node.toml` — `description`, an optional `base` (another node directory this one
//!   changes), `remove` (paths taken out of the base, with everything under them), and the
//!   tables `[sysfs]` (path → text of a sysfs attribute; a PCI `config` in `lspci -x` hex
//!   form), `[links]` (path → target of a sysfs link), `[devices]` (device nodes'
//!   permissions), `[libs]` (libraries and their symbol versions), `[env]` (the process
//!   environment), `[host]` (`hostname`, `root`) and `[expect]` (what the tests expect);
//! * `root/…` — longer files at their absolute paths (`root/proc/modules`,
//!   `root/proc/driver/nvidia/params`, `root/proc/self/status`, `root/etc/modprobe.d/…`);
//! * `nvml.toml` — the GPUs and their peer access as NVML and CUDA answer;
//! * `ibv_devinfo.txt` — `ibv_devinfo -v` output (absent: the tool is not installed).
//!
//! A node with a `base` starts from the base's state; its own entries replace the base's one
//! by one, and its `nvml.toml` or `ibv_devinfo.txt` replace the base's whole.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use eptwin_engine::api::{SNAPSHOT, read_input};
use serde::Deserialize;

use super::{
    DeviceNode, GpuInfo, GpuProbe, HostProbe, LibraryInfo, Node, NodeFiles, PeerAccess, ProbeError,
    Probed, VerbsProbe,
};
use crate::error::DoctorError;

/// Deepest chain of `base` nodes followed (a cycle stops here too).
const MAX_BASE_DEPTH: usize = 8;
/// Bytes of a PCI config space an unprivileged process reads from sysfs (pci-sysfs.c).
const UNPRIVILEGED_CONFIG_BYTES: usize = 64;
/// Links resolved in one path before giving up (a link cycle).
const MAX_LINK_HOPS: usize = 32;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeToml {
    #[serde(default)]
    description: String,
    base: Option<String>,
    #[serde(default)]
    remove: Vec<String>,
    #[serde(default)]
    sysfs: BTreeMap<String, String>,
    #[serde(default)]
    links: BTreeMap<String, String>,
    #[serde(default)]
    devices: BTreeMap<String, DeviceNode>,
    #[serde(default)]
    libs: BTreeMap<String, LibraryInfo>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    host: HostToml,
    /// Read by the tests (`Expectations`), not by the probes.
    #[serde(default)]
    expect: Option<toml::Value>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostToml {
    hostname: Option<String>,
    root: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NvmlToml {
    /// Set when NVML could not be used on the recorded node: the reason.
    unavailable: Option<String>,
    #[serde(default)]
    source: String,
    #[serde(default)]
    gpu: Vec<GpuInfo>,
    #[serde(default)]
    p2p: P2pToml,
}

/// Peer access: every directed pair is allowed and NVLink-connected unless listed.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct P2pToml {
    /// No NVLink between any pair (PCIe cards).
    #[serde(default)]
    no_nvlink: bool,
    /// Directed pairs `[from, to]` without NVLink.
    #[serde(default)]
    nvlink_down: Vec<[u32; 2]>,
    /// Directed pairs `[from, to]` where `cuDeviceCanAccessPeer` says no.
    #[serde(default)]
    cuda_denied: Vec<[u32; 2]>,
    /// CUDA could not be asked on the recorded node: the reason.
    cuda_unavailable: Option<String>,
}

/// The merged state of a recorded node.
#[derive(Debug, Default, Clone)]
struct State {
    files: BTreeMap<String, String>,
    links: BTreeMap<String, String>,
    devices: BTreeMap<String, DeviceNode>,
    libs: BTreeMap<String, LibraryInfo>,
    env: BTreeMap<String, String>,
    host: HostToml,
    nvml: Option<NvmlToml>,
    devinfo: Option<String>,
}

/// A recorded node read from a directory.
pub struct Snapshot {
    pub dir: PathBuf,
    pub description: String,
    /// The `[expect]` table of the node's own `node.toml`.
    pub expect: Option<toml::Value>,
    state: State,
}

impl Snapshot {
    pub fn load(dir: &Path) -> Result<Snapshot, DoctorError> {
        let (state, top) = load_layer(dir, 0)?;
        Ok(Snapshot {
            dir: dir.to_path_buf(),
            description: top.description,
            expect: top.expect,
            state,
        })
    }

    /// The node as the checks see it.
    pub fn into_node(self) -> Node {
        let origin = format!("snapshot {}", self.dir.display());
        let state = std::rc::Rc::new(self.state);
        Node {
            origin,
            files: Box::new(Files(state.clone())),
            gpus: Box::new(Gpus(state.clone())),
            verbs: Box::new(Verbs(state.clone())),
            host: Box::new(Host(state)),
        }
    }
}

/// A snapshot's file: a regular file of at most [`SNAPSHOT`]'s bound, UTF-8. A FIFO or a link
/// to `/dev/zero` is refused without being read.
fn read_text(path: &Path) -> Result<String, DoctorError> {
    let error =
        |message: String| DoctorError::Snapshot { path: path.display().to_string(), message };
    let bytes = read_input(path, &SNAPSHOT).map_err(|e| error(e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| error(format!("not UTF-8 text: {e}")))
}

fn parse_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, DoctorError> {
    let text = read_text(path)?;
    toml::from_str(&text).map_err(|e| {
        let at = e
            .span()
            .map(|s| {
                let line = text[..s.start].lines().count().max(1);
                format!(":{line}")
            })
            .unwrap_or_default();
        DoctorError::Snapshot {
            path: format!("{}{at}", path.display()),
            message: e.message().to_string(),
        }
    })
}

/// One layer on top of its base chain; returns the merged state and this layer's own toml.
fn load_layer(dir: &Path, depth: usize) -> Result<(State, NodeToml), DoctorError> {
    if depth > MAX_BASE_DEPTH {
        return Err(DoctorError::Snapshot {
            path: dir.display().to_string(),
            message: format!("more than {MAX_BASE_DEPTH} base nodes (a cycle?)"),
        });
    }
    let toml_path = dir.join("node.toml");
    let layer: NodeToml = parse_toml(&toml_path)?;
    let mut state = match &layer.base {
        Some(base) => load_layer(&dir.join(base), depth + 1)?.0,
        None => State::default(),
    };
    for gone in &layer.remove {
        let gone = resolve(gone, &state.links);
        let under = format!("{}/", gone.trim_end_matches('/'));
        let keep = |k: &String| *k != gone && !k.starts_with(&under);
        state.files.retain(|k, _| keep(k));
        state.links.retain(|k, _| keep(k));
        state.devices.retain(|k, _| keep(k));
    }
    // This layer's entries under their canonical paths, through the base's links and its own,
    // so that an entry replaces the base's whatever alias either was written under.
    let mut raw = state.links.clone();
    raw.extend(layer.links.clone());
    let mut links = state.links.clone();
    for (k, v) in &layer.links {
        links.insert(link_key(k, &raw), v.clone());
    }
    state.links = links;
    let canonical = |m: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        m.iter().map(|(k, v)| (resolve(k, &state.links), v.clone())).collect()
    };
    let files = canonical(&layer.sysfs);
    state.files.extend(files);
    let devices: BTreeMap<String, DeviceNode> =
        layer.devices.iter().map(|(k, v)| (resolve(k, &state.links), v.clone())).collect();
    state.devices.extend(devices);
    state.libs.extend(layer.libs.clone());
    state.env.extend(layer.env.clone());
    if layer.host.hostname.is_some() {
        state.host.hostname = layer.host.hostname.clone();
    }
    if layer.host.root.is_some() {
        state.host.root = layer.host.root;
    }
    let root = dir.join("root");
    if root.is_dir() {
        let mut files = BTreeMap::new();
        collect_root(&root, &root, &mut files, &mut 0)?;
        state.files.extend(files.into_iter().map(|(k, v)| (resolve(&k, &state.links), v)));
    }
    let nvml = dir.join("nvml.toml");
    if nvml.exists() {
        state.nvml = Some(parse_toml(&nvml)?);
    }
    let devinfo = dir.join("ibv_devinfo.txt");
    if devinfo.exists() {
        state.devinfo = Some(read_text(&devinfo)?);
    }
    Ok((state, layer))
}

/// Files a snapshot's `root/` may hold, and their bytes together: a node's recorded `/proc`
/// and `/sys` entries are tens to hundreds of small files; a hostile tree costs at most this.
const MAX_ROOT_FILES: usize = 10_000;
const MAX_ROOT_BYTES: usize = 64 << 20;

fn collect_root(
    root: &Path,
    dir: &Path,
    files: &mut BTreeMap<String, String>,
    bytes: &mut usize,
) -> Result<(), DoctorError> {
    let io = |e: std::io::Error| DoctorError::Snapshot {
        path: dir.display().to_string(),
        message: e.to_string(),
    };
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).map_err(io)?.collect::<Result<_, _>>().map_err(io)?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        // A real directory only: a link to `.` or to a parent is read as a file and refused,
        // so the walk ends.
        if entry.file_type().map_err(io)?.is_dir() {
            collect_root(root, &path, files, bytes)?;
        } else {
            if files.len() >= MAX_ROOT_FILES {
                return Err(DoctorError::Snapshot {
                    path: root.display().to_string(),
                    message: format!("more than {MAX_ROOT_FILES} files under root/"),
                });
            }
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let text = read_text(&path)?;
            *bytes += text.len();
            if *bytes > MAX_ROOT_BYTES {
                return Err(DoctorError::Snapshot {
                    path: root.display().to_string(),
                    message: format!("more than {MAX_ROOT_BYTES} bytes under root/"),
                });
            }
            files.insert(format!("/{}", rel.display()), text);
        }
    }
    Ok(())
}

/// Resolve every link on a path, component by component, as the kernel would.
fn resolve(path: &str, links: &BTreeMap<String, String>) -> String {
    let mut current = String::new();
    let mut rest: Vec<String> =
        path.split('/').filter(|c| !c.is_empty()).map(String::from).collect();
    rest.reverse();
    let mut hops = 0;
    while let Some(component) = rest.pop() {
        if component == "." {
            continue;
        }
        if component == ".." {
            if let Some(cut) = current.rfind('/') {
                current.truncate(cut);
            }
            continue;
        }
        current = format!("{current}/{component}");
        if let Some(target) = links.get(&current) {
            hops += 1;
            if hops > MAX_LINK_HOPS {
                break;
            }
            let base = if target.starts_with('/') {
                String::new()
            } else {
                current.rsplit_once('/').map(|(p, _)| p.to_string()).unwrap_or_default()
            };
            let mut more: Vec<String> = format!("{base}/{target}")
                .split('/')
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect();
            more.reverse();
            current.clear();
            rest.extend(more);
        }
    }
    if current.is_empty() { "/".into() } else { current }
}

/// A link's own path with the links above it resolved (the link itself is kept).
fn link_key(path: &str, links: &BTreeMap<String, String>) -> String {
    let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
    let parent = resolve(parent, links);
    let parent = if parent == "/" { String::new() } else { parent };
    format!("{parent}/{name}")
}

struct Files(std::rc::Rc<State>);
struct Gpus(std::rc::Rc<State>);
struct Verbs(std::rc::Rc<State>);
struct Host(std::rc::Rc<State>);

impl Files {
    fn norm(&self, path: &str) -> String {
        resolve(path, &self.0.links)
    }

    fn is_dir(&self, norm: &str) -> bool {
        let under = format!("{}/", norm.trim_end_matches('/'));
        let s = &self.0;
        s.files
            .keys()
            .chain(s.links.keys())
            .chain(s.devices.keys())
            .chain(s.links.values())
            .any(|k| k.starts_with(&under) || k == norm)
            && !s.files.contains_key(norm)
    }
}

impl NodeFiles for Files {
    fn read(&self, path: &str) -> Probed<String> {
        let norm = self.norm(path);
        self.0.files.get(&norm).cloned().ok_or_else(|| {
            if self.is_dir(&norm) {
                ProbeError::Failed(format!("{path} is a directory"))
            } else {
                ProbeError::Absent(path.to_string())
            }
        })
    }

    fn read_bytes(&self, path: &str) -> Probed<Vec<u8>> {
        let text = self.read(path)?;
        let mut bytes =
            parse_hex_dump(&text).map_err(|e| ProbeError::Failed(format!("{path}: {e}")))?;
        // What the kernel gives an unprivileged reader of a PCI device's config space.
        if path.ends_with("/config") && !self.0.host.root.unwrap_or(false) {
            bytes.truncate(UNPRIVILEGED_CONFIG_BYTES);
        }
        Ok(bytes)
    }

    fn list(&self, dir: &str) -> Probed<Vec<String>> {
        let norm = self.norm(dir);
        let under = if norm == "/" { "/".to_string() } else { format!("{norm}/") };
        let s = &self.0;
        let names: BTreeSet<String> = s
            .files
            .keys()
            .chain(s.links.keys())
            .chain(s.devices.keys())
            .filter_map(|k| k.strip_prefix(&under))
            .filter_map(|rest| rest.split('/').next())
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        if names.is_empty() {
            return Err(ProbeError::Absent(dir.to_string()));
        }
        Ok(names.into_iter().collect())
    }

    fn canonical(&self, path: &str) -> Probed<String> {
        let norm = self.norm(path);
        let s = &self.0;
        if s.files.contains_key(&norm) || s.devices.contains_key(&norm) || self.is_dir(&norm) {
            Ok(norm)
        } else {
            Err(ProbeError::Absent(path.to_string()))
        }
    }

    fn device_node(&self, path: &str) -> Probed<DeviceNode> {
        let norm = self.norm(path);
        self.0.devices.get(&norm).cloned().ok_or_else(|| ProbeError::Absent(path.to_string()))
    }
}

/// `lspci -x` / `-xxx` style: lines `OFFSET: hh hh …`; bytes not listed are zero.
pub fn parse_hex_dump(text: &str) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (offset, data) = line
            .split_once(':')
            .ok_or_else(|| format!("line {}: expected `OFFSET: bytes`", n + 1))?;
        let start = usize::from_str_radix(offset.trim(), 16)
            .map_err(|_| format!("line {}: offset {offset:?} is not hex", n + 1))?;
        for (at, byte) in (start..).zip(data.split_whitespace()) {
            let b = u8::from_str_radix(byte, 16)
                .map_err(|_| format!("line {}: {byte:?} is not a hex byte", n + 1))?;
            if bytes.len() <= at {
                bytes.resize(at + 1, 0);
            }
            bytes[at] = b;
        }
    }
    Ok(bytes)
}

impl GpuProbe for Gpus {
    fn source(&self) -> String {
        match &self.0.nvml {
            Some(n) if !n.source.is_empty() => format!("{} (recorded)", n.source),
            _ => "recorded NVML answers".into(),
        }
    }

    fn gpus(&self) -> Probed<Vec<GpuInfo>> {
        match &self.0.nvml {
            None => Err(ProbeError::Unavailable(
                "NVML is not available here (libnvidia-ml.so.1 not found): no NVIDIA driver".into(),
            )),
            Some(NvmlToml { unavailable: Some(why), .. }) => {
                Err(ProbeError::Unavailable(why.clone()))
            }
            Some(n) => Ok(n.gpu.clone()),
        }
    }

    fn peer(&self, from: u32, to: u32) -> Probed<PeerAccess> {
        let n = self.gpus().map(|_| self.0.nvml.clone().unwrap_or_default())?;
        let listed = |pairs: &[[u32; 2]]| pairs.contains(&[from, to]);
        Ok(PeerAccess {
            cuda: match n.p2p.cuda_unavailable {
                Some(_) => None,
                None => Some(!listed(&n.p2p.cuda_denied)),
            },
            nvlink: Some(!n.p2p.no_nvlink && !listed(&n.p2p.nvlink_down)),
        })
    }
}

impl VerbsProbe for Verbs {
    fn devinfo(&self) -> Probed<String> {
        self.0.devinfo.clone().ok_or_else(|| {
            ProbeError::Unavailable(
                "ibv_devinfo is not installed (Debian/Ubuntu package ibverbs-utils)".into(),
            )
        })
    }
}

impl HostProbe for Host {
    fn library(&self, soname: &str) -> Probed<LibraryInfo> {
        self.0.libs.get(soname).cloned().ok_or_else(|| {
            ProbeError::Unavailable(format!("{soname} was not found where the loader looks"))
        })
    }
    fn environment(&self) -> BTreeMap<String, String> {
        self.0.env.clone()
    }
    fn hostname(&self) -> String {
        self.0.host.hostname.clone().unwrap_or_else(|| "recorded-node".into())
    }
    fn is_root(&self) -> bool {
        self.0.host.root.unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn links_resolve_component_by_component() {
        let l = links(&[
            (
                "/sys/bus/pci/devices/0000:17:00.0",
                "/sys/devices/pci0000:15/0000:15:01.0/0000:17:00.0",
            ),
            ("/sys/class/infiniband/mlx5_0/device", "../../../bus/pci/devices/0000:17:00.0"),
        ]);
        assert_eq!(
            resolve("/sys/class/infiniband/mlx5_0/device/numa_node", &l),
            "/sys/devices/pci0000:15/0000:15:01.0/0000:17:00.0/numa_node"
        );
        assert_eq!(resolve("/proc/modules", &l), "/proc/modules");
        let cycle = links(&[("/a", "/b"), ("/b", "/a")]);
        resolve("/a/x", &cycle);
    }

    #[test]
    fn hex_dumps_parse_like_lspci() {
        let b = parse_hex_dump("00: b3 15 21 10\n40: 10 00 02 00\n").unwrap();
        assert_eq!(b.len(), 0x44);
        assert_eq!(&b[0..4], &[0xb3, 0x15, 0x21, 0x10]);
        assert_eq!(b[0x40], 0x10);
        assert!(parse_hex_dump("zz: 00").is_err());
    }

    #[test]
    fn a_layer_replaces_and_removes_base_entries() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        let top = dir.path().join("top");
        std::fs::create_dir_all(base.join("root/proc")).unwrap();
        std::fs::create_dir_all(&top).unwrap();
        std::fs::write(base.join("root/proc/modules"), "nvidia_peermem 16384 0 - Live 0x0\n")
            .unwrap();
        std::fs::write(
            base.join("node.toml"),
            "[sysfs]\n\"/sys/class/infiniband/mlx5_0/ports/1/state\" = \"4: ACTIVE\"\n\"/sys/class/infiniband/mlx5_1/ports/1/state\" = \"4: ACTIVE\"\n",
        )
        .unwrap();
        std::fs::write(
            top.join("node.toml"),
            "base = \"../base\"\nremove = [\"/sys/class/infiniband/mlx5_1\"]\n[sysfs]\n\"/sys/class/infiniband/mlx5_0/ports/1/state\" = \"1: DOWN\"\n",
        )
        .unwrap();
        let node = Snapshot::load(&top).unwrap().into_node();
        assert_eq!(node.entries("/sys/class/infiniband"), vec!["mlx5_0"]);
        assert_eq!(node.attr("/sys/class/infiniband/mlx5_0/ports/1/state").unwrap(), "1: DOWN");
        assert!(node.attr("/proc/modules").unwrap().contains("nvidia_peermem"));
        assert!(node.files.read("/proc/nothing").unwrap_err().is_absent());
        assert!(node.gpus.gpus().is_err());
        assert!(node.verbs.devinfo().is_err());
    }

    /// A hostile snapshot: a FIFO, a link to `/dev/zero` and a link to `.` under `root/` are
    /// each refused by name — never read (a FIFO would block, `/dev/zero` never ends) nor walked
    /// (the link to `.` would recurse without end).
    #[test]
    fn a_snapshot_reads_regular_files_only_and_its_walk_ends() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("root/proc")).unwrap();
        std::fs::write(dir.path().join("node.toml"), "").unwrap();
        let entry = dir.path().join("root/proc/modules");
        let refused = |what: &str| {
            let e = Snapshot::load(dir.path()).err().unwrap_or_else(|| panic!("{what} accepted"));
            let text = e.to_string();
            assert!(text.contains("root/proc/modules"), "{what}: {text}");
            assert!(text.contains("not a regular file"), "{what}: {text}");
        };
        assert!(std::process::Command::new("mkfifo").arg(&entry).status().unwrap().success());
        refused("a FIFO");
        std::fs::remove_file(&entry).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &entry).unwrap();
        refused("a link to /dev/zero");
        std::fs::remove_file(&entry).unwrap();
        std::os::unix::fs::symlink(".", &entry).unwrap();
        refused("a link to .");
        std::fs::remove_file(&entry).unwrap();
        std::fs::write(&entry, "nvidia_peermem 16384 0 - Live 0x0\n").unwrap();
        assert!(Snapshot::load(dir.path()).is_ok());
    }
}
