//! DeepEP's `Buffer(...)` arguments as a backend uses them: the scenario's `[job.buffer]`
//! table with its sizes resolved to bytes.

use crate::scenario::schema::BufferSpec;

/// DeepEP `Buffer(...)` arguments a backend uses, sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferSettings {
    pub num_nvl_bytes: u64,
    pub num_rdma_bytes: u64,
    pub num_qps_per_rank: u32,
    /// SMs of the normal kernels (`num_sms / 2` channels); the Configs carry the same.
    pub num_sms: u32,
    pub allow_nvlink_for_low_latency_mode: bool,
    pub allow_mnnvl: bool,
    pub use_fabric: bool,
}

impl From<&BufferSpec> for BufferSettings {
    fn from(b: &BufferSpec) -> Self {
        BufferSettings {
            num_nvl_bytes: b.num_nvl_bytes.bytes(),
            num_rdma_bytes: b.num_rdma_bytes.bytes(),
            num_qps_per_rank: b.num_qps_per_rank,
            num_sms: b.num_sms,
            allow_nvlink_for_low_latency_mode: b.allow_nvlink_for_low_latency_mode,
            allow_mnnvl: b.allow_mnnvl,
            use_fabric: b.use_fabric,
        }
    }
}
