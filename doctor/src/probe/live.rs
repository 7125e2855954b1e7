//! The node this process runs on: sysfs, /proc and /dev read directly; NVML (nvml-wrapper)
//! and the CUDA driver (cudarc) loaded at run time; `ibv_devinfo -v` run with a time limit;
//! the RDMA provider library found where the loader looks and read from disk.
//!
//! Architecture Invariant: nothing here needs root, waits without a bound, or panics: a
//! missing library, tool or device is a `ProbeError` the check reports as its reason.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{
    DeviceNode, GpuInfo, GpuProbe, HostProbe, LibraryInfo, Node, NodeFiles, PeerAccess, ProbeError,
    Probed, VerbsProbe,
};

/// Longest a helper tool may run (`ibv_devinfo -v` answers in well under a second).
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest library read when looking for its symbol versions.
const MAX_LIBRARY_BYTES: u64 = 64 << 20;

/// The live node.
pub fn node() -> Node {
    Node {
        origin: "live".into(),
        files: Box::new(LiveFiles),
        gpus: Box::new(LiveGpus::open()),
        verbs: Box::new(LiveVerbs),
        host: Box::new(LiveHost),
    }
}

fn io_error(path: &str, e: &std::io::Error) -> ProbeError {
    match e.kind() {
        ErrorKind::NotFound => ProbeError::Absent(path.to_string()),
        ErrorKind::PermissionDenied => ProbeError::Denied(path.to_string()),
        _ => ProbeError::Failed(format!("{path}: {e}")),
    }
}

pub struct LiveFiles;

impl NodeFiles for LiveFiles {
    fn read(&self, path: &str) -> Probed<String> {
        self.read_bytes(path).map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    fn read_bytes(&self, path: &str) -> Probed<Vec<u8>> {
        // sysfs and /proc files report a size of 4096 or 0 whatever they hold: read to the end
        // with a cap so that a wrong path (a device) cannot stream forever.
        let file = std::fs::File::open(path).map_err(|e| io_error(path, &e))?;
        let mut out = Vec::new();
        file.take(MAX_LIBRARY_BYTES).read_to_end(&mut out).map_err(|e| io_error(path, &e))?;
        Ok(out)
    }

    fn list(&self, dir: &str) -> Probed<Vec<String>> {
        let entries = std::fs::read_dir(dir).map_err(|e| io_error(dir, &e))?;
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        Ok(names)
    }

    fn canonical(&self, path: &str) -> Probed<String> {
        std::fs::canonicalize(path)
            .map(|p| p.to_string_lossy().into_owned())
            .map_err(|e| io_error(path, &e))
    }

    fn device_node(&self, path: &str) -> Probed<DeviceNode> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).map_err(|e| io_error(path, &e))?;
        // What libibverbs does: open the node read-write (and close it again).
        let read_write = std::fs::OpenOptions::new().read(true).write(true).open(path).is_ok();
        Ok(DeviceNode { mode: meta.mode() & 0o7777, uid: meta.uid(), gid: meta.gid(), read_write })
    }
}

/// Run `f`, turning a panic from a loader (cudarc panics on a missing library or symbol) into
/// an error; the panic hook is silenced meanwhile so the user sees one line.
fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let out = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(previous);
    out.map_err(|payload| {
        let detail = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        format!("{what}: {}", detail.lines().next().unwrap_or(""))
    })
}

/// NVML for names, UUIDs and NVLink; the CUDA driver for the ordinal order, peer access and
/// dma-buf support. Either may be missing; what it would have answered is then `None`.
pub struct LiveGpus {
    nvml: Result<nvml_wrapper::Nvml, String>,
    cuda: Result<Vec<CudaDevice>, String>,
}

struct CudaDevice {
    device: cudarc::driver::sys::CUdevice,
    bus_id: String,
    dma_buf: Option<bool>,
}

impl LiveGpus {
    pub fn open() -> LiveGpus {
        let nvml = guarded("loading NVML", nvml_wrapper::Nvml::init)
            .and_then(|r| r.map_err(|e| format!("NVML is not available here: {e}")));
        let cuda = guarded("loading the CUDA driver", cuda_devices).and_then(|r| r);
        LiveGpus { nvml, cuda }
    }

    fn nvml_device(&self, bus_id: &str) -> Result<nvml_wrapper::Device<'_>, String> {
        let nvml = self.nvml.as_ref().map_err(Clone::clone)?;
        nvml.device_by_pci_bus_id(bus_id).map_err(|e| format!("NVML device {bus_id}: {e}"))
    }
}

fn cuda_devices() -> Result<Vec<CudaDevice>, String> {
    use cudarc::driver::{result, sys};
    // SAFETY: only tries to dlopen the library.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver here (libcuda.so could not be loaded)".into());
    }
    result::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
    let count = result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
    let mut out = Vec::new();
    for ordinal in 0..count {
        let device = result::device::get(ordinal).map_err(|e| format!("cuDeviceGet: {e:?}"))?;
        let mut bus = [0 as std::ffi::c_char; 64];
        // SAFETY: a buffer of the stated length; the driver was initialised above.
        unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), 64, device) }
            .result()
            .map_err(|e| format!("cuDeviceGetPCIBusId: {e:?}"))?;
        // SAFETY: NUL-terminated by the driver.
        let bus_id =
            unsafe { std::ffi::CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned();
        let mut dma_buf = 0;
        // SAFETY: an int out-parameter and a valid device.
        let asked = unsafe {
            sys::cuDeviceGetAttribute(
                &mut dma_buf,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                device,
            )
        };
        out.push(CudaDevice { device, bus_id, dma_buf: asked.result().ok().map(|_| dma_buf != 0) });
    }
    Ok(out)
}

impl GpuProbe for LiveGpus {
    fn source(&self) -> String {
        let nvml = match &self.nvml {
            Ok(n) => {
                format!("NVML, driver {}", n.sys_driver_version().unwrap_or_else(|e| e.to_string()))
            }
            Err(e) => format!("no NVML ({e})"),
        };
        let cuda = match &self.cuda {
            Ok(d) => format!("CUDA driver, {} devices", d.len()),
            Err(e) => format!("no CUDA ({e})"),
        };
        format!("{nvml}; {cuda}")
    }

    fn gpus(&self) -> Probed<Vec<GpuInfo>> {
        let nvml = self.nvml.as_ref().map_err(|e| ProbeError::Unavailable(e.clone()))?;
        // CUDA ordinals when the driver answers (the ranks' device numbers), else NVML's order.
        let bus_ids: Vec<(String, Option<bool>)> = match &self.cuda {
            Ok(devs) => devs.iter().map(|d| (d.bus_id.clone(), d.dma_buf)).collect(),
            Err(_) => {
                let count = nvml.device_count().map_err(|e| ProbeError::Failed(e.to_string()))?;
                let mut ids = Vec::new();
                for i in 0..count {
                    let d =
                        nvml.device_by_index(i).map_err(|e| ProbeError::Failed(e.to_string()))?;
                    let pci = d.pci_info().map_err(|e| ProbeError::Failed(e.to_string()))?;
                    ids.push((pci.bus_id, None));
                }
                ids
            }
        };
        let mut out = Vec::new();
        for (index, (bus_id, dma_buf)) in bus_ids.into_iter().enumerate() {
            let d = self.nvml_device(&bus_id).map_err(ProbeError::Failed)?;
            out.push(GpuInfo {
                index: index as u32,
                name: d.name().unwrap_or_else(|e| format!("? ({e})")),
                uuid: d.uuid().unwrap_or_else(|e| format!("? ({e})")),
                bus_id: normalise_bus_id(&bus_id),
                dma_buf,
                fabric: None,
            });
        }
        Ok(out)
    }

    fn peer(&self, from: u32, to: u32) -> Probed<PeerAccess> {
        use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus};
        let gpus = self.gpus()?;
        let bus = |i: u32| gpus.get(i as usize).map(|g| g.bus_id.clone());
        let (Some(a), Some(b)) = (bus(from), bus(to)) else {
            return Err(ProbeError::Failed(format!("no GPU {from} or {to}")));
        };
        let nvlink = match (self.nvml_device(&a), self.nvml_device(&b)) {
            (Ok(da), Ok(db)) => {
                da.p2p_status(&db, P2pCapabilitiesIndex::NvLink).ok().map(|s| s == P2pStatus::Ok)
            }
            _ => None,
        };
        let cuda = self.cuda.as_ref().ok().and_then(|devs| {
            let (da, db) = (devs.get(from as usize)?, devs.get(to as usize)?);
            let mut can = 0;
            // SAFETY: an int out-parameter and two valid devices.
            let r = unsafe {
                cudarc::driver::sys::cuDeviceCanAccessPeer(&mut can, da.device, db.device)
            };
            r.result().ok().map(|_| can != 0)
        });
        Ok(PeerAccess { cuda, nvlink })
    }
}

/// `00000000:17:00.0` (NVML) and `0000:17:00.0` (CUDA) as sysfs names it: `0000:17:00.0`.
pub fn normalise_bus_id(id: &str) -> String {
    let id = id.trim().trim_end_matches('\0').to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => id,
    }
}

pub struct LiveVerbs;

impl VerbsProbe for LiveVerbs {
    fn devinfo(&self) -> Probed<String> {
        run_tool("ibv_devinfo", &["-v"], "ibverbs-utils")
    }
}

/// Run a tool found on PATH with a time limit; its stdout.
pub fn run_tool(tool: &str, args: &[&str], package: &str) -> Probed<String> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(tool)).find(|c| c.is_file()))
        .unwrap_or_default();
    let Some(path) = found else {
        return Err(ProbeError::Unavailable(format!(
            "{tool} is not installed (Debian/Ubuntu package {package})"
        )));
    };
    let mut child = Command::new(&path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ProbeError::Failed(format!("{tool}: {e}")))?;
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.take(MAX_LIBRARY_BYTES).read_to_end(&mut out);
        }
        out
    });
    let step = Duration::from_millis(20);
    let mut waited = Duration::ZERO;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if waited < TOOL_TIMEOUT => {
                std::thread::sleep(step);
                waited += step;
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ProbeError::Failed(format!(
                    "{tool} {} did not finish within {} s",
                    args.join(" "),
                    TOOL_TIMEOUT.as_secs()
                )));
            }
            Err(e) => return Err(ProbeError::Failed(format!("{tool}: {e}"))),
        }
    };
    let out = reader.join().unwrap_or_default();
    let text = String::from_utf8_lossy(&out).into_owned();
    if !status.success() && text.trim().is_empty() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        return Err(ProbeError::Failed(format!(
            "{tool} {} failed ({status}): {}",
            args.join(" "),
            err.lines().next().unwrap_or("")
        )));
    }
    Ok(text)
}

pub struct LiveHost;

impl LiveHost {
    /// The directories the loader searches: LD_LIBRARY_PATH, /etc/ld.so.conf(.d), defaults.
    fn library_dirs() -> Vec<String> {
        let mut dirs: Vec<String> = std::env::var("LD_LIBRARY_PATH")
            .unwrap_or_default()
            .split(':')
            .filter(|d| !d.is_empty())
            .map(String::from)
            .collect();
        let mut confs = vec!["/etc/ld.so.conf".to_string()];
        if let Ok(entries) = std::fs::read_dir("/etc/ld.so.conf.d") {
            let mut more: Vec<String> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.path().to_string_lossy().into_owned())
                .collect();
            more.sort();
            confs.extend(more);
        }
        for conf in confs {
            let text = std::fs::read_to_string(&conf).unwrap_or_default();
            dirs.extend(
                text.lines().map(str::trim).filter(|l| l.starts_with('/')).map(String::from),
            );
        }
        for d in [
            "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu",
            "/lib/aarch64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/lib64",
            "/usr/lib64",
            "/lib",
            "/usr/lib",
        ] {
            dirs.push(d.to_string());
        }
        dirs
    }
}

impl HostProbe for LiveHost {
    fn library(&self, soname: &str) -> Probed<LibraryInfo> {
        for dir in Self::library_dirs() {
            let path = Path::new(&dir).join(soname);
            if !path.is_file() {
                continue;
            }
            let file =
                std::fs::File::open(&path).map_err(|e| io_error(&path.to_string_lossy(), &e))?;
            let mut bytes = Vec::new();
            file.take(MAX_LIBRARY_BYTES)
                .read_to_end(&mut bytes)
                .map_err(|e| io_error(&path.to_string_lossy(), &e))?;
            let resolved = std::fs::canonicalize(&path).unwrap_or(path);
            return Ok(LibraryInfo {
                path: resolved.to_string_lossy().into_owned(),
                versions: version_names(&bytes),
            });
        }
        Err(ProbeError::Unavailable(format!("{soname} was not found where the loader looks")))
    }

    fn environment(&self) -> BTreeMap<String, String> {
        std::env::vars().collect()
    }

    fn hostname(&self) -> String {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "unknown-host".into())
    }

    fn is_root(&self) -> bool {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        crate::parse::status_field(&status, "Uid")
            .is_some_and(|v| v.split_whitespace().nth(1) == Some("0"))
    }
}

/// The symbol-version names a shared library defines, as they appear in its string table:
/// NUL-terminated words shaped like `MLX5_1.25` or `IBVERBS_1.1` (upper-case name, `_`,
/// dotted number). Sorted, without duplicates.
pub fn version_names(bytes: &[u8]) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    for word in bytes.split(|&b| b == 0) {
        let Ok(text) = std::str::from_utf8(word) else { continue };
        if text.len() < 4 || text.len() > 40 {
            continue;
        }
        let Some((name, number)) = text.rsplit_once('_') else { continue };
        let name_ok = !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            && name.as_bytes()[0].is_ascii_uppercase();
        let number_ok = !number.is_empty()
            && number.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if name_ok && number_ok {
            names.insert(text.to_string());
        }
    }
    names.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_take_the_sysfs_form() {
        assert_eq!(normalise_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
        assert_eq!(normalise_bus_id("0000:1b:00.0"), "0000:1b:00.0");
    }

    #[test]
    fn version_names_come_from_the_string_table() {
        let bytes = b"\x7fELF\0mlx5dv_devx_alloc_uar\0MLX5_1.0\0MLX5_1.24\0MLX5_PRIVATE_x\0IBVERBS_PRIVATE_34\0GLIBC_2.2.5\0";
        let v = version_names(bytes);
        assert!(v.contains(&"MLX5_1.24".to_string()));
        assert!(v.contains(&"IBVERBS_PRIVATE_34".to_string()));
        assert!(!v.iter().any(|s| s.starts_with("mlx5dv")));
        assert!(!v.contains(&"MLX5_PRIVATE_x".to_string()));
    }

    #[test]
    fn a_missing_tool_says_which_package() {
        let err = run_tool("eptwin-no-such-tool", &[], "no-such-package").unwrap_err();
        assert!(err.to_string().contains("no-such-package"), "{err}");
    }

    #[test]
    fn a_tool_that_hangs_is_stopped() {
        let err = run_tool("sleep", &["30"], "coreutils").unwrap_err();
        assert!(err.to_string().contains("did not finish"), "{err}");
    }

    #[test]
    fn live_files_map_errors() {
        assert!(LiveFiles.read("/proc/eptwin-none").unwrap_err().is_absent());
        assert!(LiveFiles.read("/proc/self/status").unwrap().contains("Uid"));
    }
}
