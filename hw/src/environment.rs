//! What this machine has: the GPUs and the versions of the libraries the backend loads at run
//! time (CUDA driver, NVRTC, NCCL, NVML), found once when the backend starts, and the identity
//! a hardware result's `backend` keys carry.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::cuda::{self, Gpu};
use crate::placement::GpuInventory;
use crate::{compile, nccl, nvml};

/// What was found on this machine.
pub struct Environment {
    pub gpus: Vec<Gpu>,
    pub driver_api: i32,
    pub nvrtc: (i32, i32),
    pub nccl: i32,
    pub nvml_driver: Option<String>,
}

/// Every GPU and library the backend needs, or the one-line reason the run is waived.
pub fn detect() -> Result<Environment, String> {
    let count = cuda::init_driver()?;
    let driver_api = cuda::driver_api_version()?;
    let nvrtc = compile::nvrtc_version()?;
    let nccl = nccl::nccl_version()?;
    let mut gpus = Vec::with_capacity(count);
    for ordinal in 0..count {
        let gpu = cuda::guarded("opening the GPU", || Gpu::open(ordinal))?
            .map_err(|e| format!("GPU {ordinal} cannot be used: {e}"))?;
        gpus.push(gpu);
    }
    let nvml_driver = nvml::RealNvml::init().ok().and_then(|n| {
        use nvml::NvmlApi;
        n.driver_version().ok()
    });
    Ok(Environment { gpus, driver_api, nvrtc, nccl, nvml_driver })
}

/// The machine's identity for the result's `backend` (docs/results.md): GPU names and counts,
/// SMs, L2, memory, PCI bus ids, driver, CUDA, NVRTC and NCCL versions.
pub fn identity(env: &Environment) -> BTreeMap<String, Value> {
    let names: Vec<&str> = env.gpus.iter().map(|g| g.name.as_str()).collect();
    let g0 = &env.gpus[0];
    BTreeMap::from([
        ("gpus".to_string(), json!(gpu_summary(&names))),
        ("gpu_names".to_string(), json!(names)),
        ("gpu_count".to_string(), json!(env.gpus.len())),
        ("sm_count".to_string(), json!(g0.sm_count)),
        (
            "compute_capability".to_string(),
            json!(format!("{}.{}", g0.compute_capability.0, g0.compute_capability.1)),
        ),
        ("l2_bytes".to_string(), json!(g0.l2_bytes)),
        ("memory_bytes".to_string(), json!(g0.total_mem_bytes)),
        (
            "pci_bus_ids".to_string(),
            json!(env.gpus.iter().map(|g| &g.pci_bus_id).collect::<Vec<_>>()),
        ),
        (
            "driver_version".to_string(),
            json!(env.nvml_driver.clone().unwrap_or_else(|| "unknown (NVML not available)".into())),
        ),
        (
            "cuda_version".to_string(),
            json!(format!("{}.{}", env.driver_api / 1000, env.driver_api % 1000 / 10)),
        ),
        ("nvrtc_version".to_string(), json!(format!("{}.{}", env.nvrtc.0, env.nvrtc.1))),
        ("nccl_version".to_string(), json!(nccl::version_string(env.nccl))),
    ])
}

/// `"8 x NVIDIA H200"`, runs of equal names counted: `"2 x A, 1 x B"`.
fn gpu_summary(names: &[&str]) -> String {
    let mut summary = String::new();
    let mut i = 0;
    while i < names.len() {
        let j = names[i..].iter().take_while(|n| **n == names[i]).count();
        if !summary.is_empty() {
            summary.push_str(", ");
        }
        summary.push_str(&format!("{j} x {}", names[i]));
        i += j;
    }
    summary
}

/// The GPUs found, as placement sees them.
pub struct Inventory<'a>(pub &'a [Gpu]);

impl GpuInventory for Inventory<'_> {
    fn gpu_count(&self) -> u32 {
        self.0.len() as u32
    }
    fn can_access_peer(&self, a: u32, b: u32) -> bool {
        self.0[a as usize].can_access_peer(&self.0[b as usize]).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_gpus_are_counted_in_runs() {
        assert_eq!(gpu_summary(&["NVIDIA H200"; 8]), "8 x NVIDIA H200");
        assert_eq!(gpu_summary(&["A", "A", "B"]), "2 x A, 1 x B");
        assert_eq!(gpu_summary(&[]), "");
    }
}
