//! What GPU-initiated RDMA (NVSHMEM IBGDA in V1, NCCL GIN in V2) needs from the host: GPU
//! memory registered with the NIC (nvidia-peermem or dma-buf), the NIC's doorbell (UAR)
//! mapped into the GPU (`PeerMappingOverride`), the verbs device nodes, the container's
//! privileges and the locked-memory limit.

use super::affinity::used_nics;
use super::{Ctx, skip};
use crate::parse;
use crate::report::{Finding, Status};

const NO_NEED: &str = "no job uses GPU-initiated RDMA here";
const NO_DRIVER: &str = "no NVIDIA driver loaded (/proc/driver/nvidia absent)";

const PEERMEM: &str = "GPU memory registration: nvidia-peermem or dma-buf";

pub fn peer_memory(ctx: &Ctx<'_>) -> Finding {
    if !ctx.gpu_rdma_matters() {
        return skip("peer-memory", PEERMEM, NO_NEED);
    }
    let Some(version) = ctx.node.attr("/proc/driver/nvidia/version") else {
        return skip("peer-memory", PEERMEM, NO_DRIVER);
    };
    let modules = match &ctx.facts.modules {
        Ok(m) => m,
        Err(e) => {
            return skip("peer-memory", PEERMEM, format!("cannot read the loaded modules: {e}"));
        }
    };
    if let Some(m) = modules.iter().find(|m| *m == "nvidia_peermem" || *m == "nv_peer_mem") {
        return Finding::new("peer-memory", PEERMEM, Status::Ok, format!("{m} loaded"));
    }
    let kernel = ctx.node.attr("/proc/sys/kernel/osrelease").unwrap_or_default();
    let open = version.contains("Open Kernel Module");
    let new_kernel = parse::kernel_version(&kernel).is_some_and(|v| v >= (5, 12));
    let gpus_dma_buf = ctx
        .facts
        .gpus
        .as_ref()
        .map(|g| !g.is_empty() && g.iter().all(|g| g.info.dma_buf == Some(true)))
        .unwrap_or(false);
    let details = vec![
        format!("driver: {}", version.lines().next().unwrap_or("")),
        format!(
            "kernel {kernel}; dma-buf: open kernel module {open}, Linux ≥ 5.12 {new_kernel}, CUDA says supported {gpus_dma_buf}"
        ),
    ];
    if open && new_kernel && gpus_dma_buf {
        return Finding::new(
            "peer-memory",
            PEERMEM,
            Status::Ok,
            "dma-buf (nvidia-peermem not loaded, not needed)",
        )
        .details(details);
    }
    Finding::new("peer-memory", PEERMEM, Status::Fail, "neither nvidia_peermem/nv_peer_mem loaded nor dma-buf usable")
        .details(details)
        .why("the NIC must reach GPU memory: NVSHMEM registers its symmetric heap through nvidia-peermem or dma-buf; with neither, IBGDA refuses to start (\"init failed for transport: IBGDA\", \"device mlx5_N cannot allocate buffer on the specified memory type\")", &["DeepEP #128"])
        .fix("`modprobe nvidia_peermem` (and list it in /etc/modules-load.d/), or use the open NVIDIA kernel module on Linux ≥ 5.12 for dma-buf")
}

const MAPPING: &str = "Driver PeerMappingOverride (NIC doorbells mapped into the GPU)";

pub fn peer_mapping(ctx: &Ctx<'_>) -> Finding {
    if !ctx.gpu_rdma_matters() {
        return skip("peer-mapping", MAPPING, NO_NEED);
    }
    let Ok(params) = ctx.node.files.read("/proc/driver/nvidia/params") else {
        return skip("peer-mapping", MAPPING, NO_DRIVER);
    };
    let loaded = parse::registry_dwords(&params);
    if loaded.get("PeerMappingOverride").map(String::as_str) == Some("1") {
        return Finding::new(
            "peer-mapping",
            MAPPING,
            Status::Ok,
            "RegistryDwords has PeerMappingOverride=1",
        );
    }
    let configured: Vec<String> = ctx
        .node
        .entries("/etc/modprobe.d")
        .into_iter()
        .filter(|f| f.ends_with(".conf"))
        .filter(|f| {
            let text = ctx.node.attr(&format!("/etc/modprobe.d/{f}")).unwrap_or_default();
            parse::modprobe_registry_dwords(&text).get("PeerMappingOverride").map(String::as_str)
                == Some("1")
        })
        .map(|f| format!("/etc/modprobe.d/{f}"))
        .collect();
    let why = "IBGDA lets GPU threads ring the NIC's doorbell: the driver must map the NIC's UAR into the GPU, which it refuses without PeerMappingOverride=1 (\"GPU cannot map UAR of device mlx5_N\", \"cudaHostRegister with IoMemory failed\")";
    let loaded_text = format!("loaded driver's RegistryDwords: {:?}", loaded);
    if !configured.is_empty() {
        return Finding::new("peer-mapping", MAPPING, Status::Fail, format!("set in {} but not in the loaded driver", configured.join(", ")))
            .details(vec![loaded_text])
            .why(why, &["DeepEP #163"])
            .fix("the driver was loaded before the option was written: rebuild the initramfs (update-initramfs -u) and reboot, or unload and reload the nvidia modules");
    }
    Finding::new("peer-mapping", MAPPING, Status::Fail, "PeerMappingOverride is not set")
        .details(vec![loaded_text])
        .why(why, &["DeepEP #163", "GPU cannot map UAR"])
        .fix("echo 'options nvidia NVreg_RegistryDwords=\"PeerMappingOverride=1;\"' > /etc/modprobe.d/nvidia-peermapping.conf, update-initramfs -u, reboot")
}

const UVERBS: &str = "Verbs device nodes (/dev/infiniband)";

pub fn uverbs(ctx: &Ctx<'_>) -> Finding {
    if !ctx.rdma_matters() || ctx.facts.nics.is_empty() {
        return skip("uverbs", UVERBS, "no RDMA device in use");
    }
    let (mut details, mut bad) = (Vec::new(), Vec::new());
    for n in used_nics(ctx) {
        let Some(u) = &n.uverbs else {
            bad.push(format!("{} has no uverbs device (ib_uverbs not loaded?)", n.name));
            continue;
        };
        let path = format!("/dev/infiniband/{u}");
        match ctx.node.files.device_node(&path) {
            Ok(d) if d.read_write => details.push(format!(
                "{path} ({}): mode {:o}, uid {}, gid {}, read-write ok",
                n.name, d.mode, d.uid, d.gid
            )),
            Ok(d) => bad.push(format!(
                "{path} ({}): mode {:o}, uid {}, gid {}: this process cannot open it read-write",
                n.name, d.mode, d.uid, d.gid
            )),
            Err(e) => bad.push(format!("{path} ({}): {e}", n.name)),
        }
    }
    if !bad.is_empty() {
        details.extend(bad.iter().cloned());
        return Finding::new("uverbs", UVERBS, Status::Fail, bad.join("; "))
            .details(details)
            .why("every verbs call goes through /dev/infiniband/uverbsN: without it ibv_open_device fails and NVSHMEM/NCCL see no NIC", &["SGLang #12533"])
            .fix("load ib_uverbs; in a container pass the devices (--device=/dev/infiniband); make the nodes mode 0666 (udev rule) or add the user to their group");
    }
    Finding::new("uverbs", UVERBS, Status::Ok, format!("{} device node(s) usable", details.len()))
        .details(details)
}

const CONTAINER: &str = "Container privileges (DEVX, UAR)";

/// Where the process runs in a container: the marker that says so.
fn container_marker(ctx: &Ctx<'_>) -> Option<String> {
    for marker in ["/.dockerenv", "/run/.containerenv"] {
        if ctx.node.files.exists(marker) {
            return Some(marker.to_string());
        }
    }
    let cgroup = ctx.node.attr("/proc/1/cgroup").unwrap_or_default();
    for word in ["kubepods", "docker", "containerd", "libpod", "lxc"] {
        if cgroup.contains(word) {
            return Some(format!("/proc/1/cgroup mentions {word}"));
        }
    }
    ctx.node.host.environment().get("container").map(|c| format!("container={c}"))
}

pub fn container(ctx: &Ctx<'_>) -> Finding {
    let Some(marker) = container_marker(ctx) else {
        return Finding::new("container", CONTAINER, Status::Ok, "not in a container");
    };
    let Some(status) = &ctx.facts.status else {
        return skip("container", CONTAINER, "/proc/self/status not readable");
    };
    let caps = parse::effective_caps(status).unwrap_or_default();
    if parse::all_caps(status) {
        return Finding::new(
            "container",
            CONTAINER,
            Status::Ok,
            format!("privileged container ({marker})"),
        );
    }
    let missing: Vec<&str> = ["CAP_IPC_LOCK", "CAP_SYS_RAWIO", "CAP_SYS_ADMIN", "CAP_NET_RAW"]
        .into_iter()
        .filter(|c| !caps.contains(c))
        .collect();
    let details = vec![format!("CapEff: {}", caps.join(" "))];
    if missing.is_empty() || !ctx.gpu_rdma_matters() {
        return Finding::new(
            "container",
            CONTAINER,
            Status::Ok,
            format!("container ({marker}), capabilities suffice"),
        )
        .details(details);
    }
    Finding::new("container", CONTAINER, Status::Warn, format!("unprivileged container ({marker}) without {}", missing.join(", ")))
        .details(details)
        .why("IBGDA and GIN create mlx5 objects through DEVX and map NIC doorbells (mlx5dv_devx_alloc_uar); in unprivileged containers these calls have failed (\"mlx5dv_devx_uar\" errors) where the same image ran privileged", &["SGLang #12533"])
        .fix("run the container with --privileged (the reported fix), or at least --cap-add=IPC_LOCK --cap-add=SYS_RAWIO --cap-add=NET_RAW with --device=/dev/infiniband and --ulimit memlock=-1")
}

const MEMLOCK: &str = "Locked-memory limit";

pub fn memlock(ctx: &Ctx<'_>) -> Finding {
    if !ctx.rdma_matters() {
        return skip("memlock", MEMLOCK, "no RDMA in use");
    }
    let Ok(limits) = ctx.node.files.read("/proc/self/limits") else {
        return skip("memlock", MEMLOCK, "/proc/self/limits not readable");
    };
    let Some(soft) = parse::memlock_soft_bytes(&limits) else {
        return skip("memlock", MEMLOCK, "no \"Max locked memory\" line in /proc/self/limits");
    };
    let Some(bytes) = soft else {
        return Finding::new("memlock", MEMLOCK, Status::Ok, "unlimited");
    };
    let ipc_lock = ctx
        .facts
        .status
        .as_deref()
        .and_then(parse::effective_caps)
        .is_some_and(|c| c.contains(&"CAP_IPC_LOCK"));
    if ipc_lock {
        return Finding::new(
            "memlock",
            MEMLOCK,
            Status::Ok,
            format!("{bytes} bytes, but CAP_IPC_LOCK lifts it"),
        );
    }
    let status = if bytes <= 64 << 10 { Status::Fail } else { Status::Warn };
    Finding::new("memlock", MEMLOCK, status, format!("soft limit {bytes} bytes ({} KiB)", bytes >> 10))
        .why("verbs pin every registered host buffer (NVSHMEM's and NCCL's host-side queues and bounce buffers) against this limit: at 64 KiB registration fails during Buffer creation; NVSHMEM and NCCL ask for unlimited", &[])
        .fix("`ulimit -l unlimited` in the job's shell (limits.conf: `* - memlock unlimited`; Slurm PropagateResourceLimits; docker --ulimit memlock=-1)")
}
