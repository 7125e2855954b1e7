//! What this machine has that decides which probes `eptwin calibrate` runs: how many NVIDIA
//! GPUs (NVLink peer probes need two) and which ibverbs ports are ACTIVE (the NIC keys need
//! one). Read from the kernel's files under a root directory (`/` here, a fake tree in tests),
//! so nothing is loaded and a machine without a driver reads as none.

use std::path::{Path, PathBuf};

/// An ibverbs port whose state is ACTIVE.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivePort {
    /// `mlx5_0:1`.
    pub name: String,
    /// The negotiated rate, Gb/s per direction (`/sys/class/infiniband/<dev>/ports/<p>/rate`:
    /// "400 Gb/sec (4X NDR)"); `None` when the file does not say.
    pub rate_gbit: Option<f64>,
    /// `InfiniBand` or `Ethernet` (`link_layer`).
    pub link_layer: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    pub gpus: usize,
    pub active_ports: Vec<ActivePort>,
}

/// Sorted entries of a directory (none when it cannot be read).
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn read_trimmed(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// The GPUs the NVIDIA driver lists (`/proc/driver/nvidia/gpus/<bus id>`), else its device nodes
/// (`/dev/nvidia<N>`: a container may see those without the proc entries).
fn gpu_count(root: &Path) -> usize {
    let proc = entries(&root.join("proc/driver/nvidia/gpus")).len();
    let dev = entries(&root.join("dev"))
        .iter()
        .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
        .filter(|n| {
            n.strip_prefix("nvidia")
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    proc.max(dev)
}

/// "400 Gb/sec (4X NDR)" -> 400.
fn parse_rate(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

fn active_ports(root: &Path) -> Vec<ActivePort> {
    let mut out = Vec::new();
    for dev in entries(&root.join("sys/class/infiniband")) {
        let dev_name = dev.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        for port in entries(&dev.join("ports")) {
            // "4: ACTIVE"
            let active = read_trimmed(&port.join("state")).is_some_and(|s| s.ends_with("ACTIVE"));
            if !active {
                continue;
            }
            let port_name = port.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            out.push(ActivePort {
                name: format!("{dev_name}:{port_name}"),
                rate_gbit: read_trimmed(&port.join("rate")).as_deref().and_then(parse_rate),
                link_layer: read_trimmed(&port.join("link_layer")).unwrap_or_default(),
            });
        }
    }
    out
}

/// This machine's GPUs and ACTIVE ports, read under `root`.
pub fn survey(root: &Path) -> Inventory {
    Inventory { gpus: gpu_count(root), active_ports: active_ports(root) }
}

/// The probe run's scenario: eight ranks on one GPU, or four on each of two when there are two
/// GPUs (the hardware backend's NVLink peer probes run between the GPUs it opens).
pub fn probe_scenario(gpus: usize) -> String {
    let text = include_str!("probe-scenario.toml");
    if gpus < 2 {
        return text.to_string();
    }
    text.replace(
        "profile = \"h200-single\"\n",
        "profile = \"h200-single\"\ngpus_per_node = 2\nranks_per_gpu = 4\n",
    )
}

/// The NIC keys an ACTIVE port gives: its negotiated rate (GB/s per direction) as
/// `nic.link_gbps`. Latency, bandwidth and message rate through ibverbs are not probed: they
/// stay the base's (docs/calibration.md, "Calibrating a profile for your machine").
pub fn nic(inv: &Inventory) -> Vec<super::writer::Measured> {
    let Some(port) = inv.active_ports.iter().find(|p| p.rate_gbit.is_some()) else {
        return Vec::new();
    };
    let gbit = port.rate_gbit.unwrap_or_default();
    vec![super::writer::Measured::new(
        "nic",
        "link_gbps",
        toml::Value::Float(gbit / 8.0),
        format!(
            "the ACTIVE port {} ({}): {gbit} Gb/s negotiated (sysfs rate) / 8",
            port.name, port.link_layer
        ),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn an_empty_machine_has_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(survey(dir.path()), Inventory::default());
        assert!(nic(&survey(dir.path())).is_empty());
    }

    #[test]
    fn gpus_and_only_active_ports_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, "proc/driver/nvidia/gpus/0000:18:00.0/information", "Model: H100");
        write(r, "proc/driver/nvidia/gpus/0000:2a:00.0/information", "Model: H100");
        write(r, "dev/nvidia0", "");
        write(r, "dev/nvidiactl", "");
        write(r, "dev/nvidia-uvm", "");
        write(r, "sys/class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n");
        write(r, "sys/class/infiniband/mlx5_0/ports/1/rate", "400 Gb/sec (4X NDR)\n");
        write(r, "sys/class/infiniband/mlx5_0/ports/1/link_layer", "InfiniBand\n");
        write(r, "sys/class/infiniband/mlx5_1/ports/1/state", "1: DOWN\n");
        write(r, "sys/class/infiniband/mlx5_1/ports/1/rate", "400 Gb/sec (4X NDR)\n");
        let inv = survey(r);
        assert_eq!(inv.gpus, 2);
        assert_eq!(inv.active_ports.len(), 1);
        assert_eq!(inv.active_ports[0].name, "mlx5_0:1");
        assert_eq!(inv.active_ports[0].rate_gbit, Some(400.0));
        let keys = nic(&inv);
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].value, toml::Value::Float(50.0));
        assert!(keys[0].source.contains("mlx5_0:1 (InfiniBand)"), "{}", keys[0].source);
    }

    #[test]
    fn device_nodes_count_where_the_proc_entries_are_missing() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-modeset"] {
            write(dir.path(), &format!("dev/{n}"), "");
        }
        assert_eq!(survey(dir.path()).gpus, 3);
    }

    #[test]
    fn the_probe_scenario_spans_two_gpus_where_there_are_two() {
        for (gpus, want) in [(0, 1), (1, 1), (2, 2), (8, 2)] {
            let text = probe_scenario(gpus);
            let loaded = eptwin_engine::parse("probe.toml", &text).unwrap();
            let plan = eptwin_engine::Plan::build(&loaded).unwrap();
            assert_eq!(plan.topology.num_gpus(), want, "{gpus} GPUs");
            assert_eq!(plan.topology.num_ranks(), 8);
        }
    }
}
