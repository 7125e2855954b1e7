//! DeepEP `Buffer(...)` arguments: buffer sizes (deep_ep.cpp:152-161), QPs, SMs, MNNVL.

use super::Job;
use crate::deepep::config::{EpMode, INT_MAX};
use crate::diag::Diagnostics;
use crate::scenario::schema::{BufferSpec, NvlinkKind};
use crate::topology::NUM_MAX_NVL_PEERS;

pub(super) fn check(job: &Job<'_>, b: &BufferSpec, mode: EpMode, d: &mut Diagnostics<'_>) {
    check_sizes(job, b, d);
    check_qps_sms_mnnvl(job, b, mode, d);
}

/// Buffer sizes: alignment, Python's INT_MAX, an RDMA buffer only where it is used.
fn check_sizes(job: &Job<'_>, b: &BufferSpec, d: &mut Diagnostics<'_>) {
    let (prefix, name) = (job.prefix.as_str(), job.name());
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    let n = job.ranks.len() as u32;
    let nvl_bytes = b.num_nvl_bytes.bytes();
    let rdma_bytes = b.num_rdma_bytes.bytes();
    if !nvl_bytes.is_multiple_of(128) {
        d.error(
            "buffer-align",
            &bkey("num_nvl_bytes"),
            name,
            format!(
                "{nvl_bytes} is not a multiple of 128 (NUM_BUFFER_ALIGNMENT_BYTES; deep_ep.cpp:152)"
            ),
        );
    }
    if !rdma_bytes.is_multiple_of(128) {
        d.error(
            "buffer-align",
            &bkey("num_rdma_bytes"),
            name,
            format!("{rdma_bytes} is not a multiple of 128 (deep_ep.cpp:154)"),
        );
    }
    if nvl_bytes > INT_MAX && rdma_bytes != 0 {
        d.error(
            "buffer-int-max",
            &bkey("num_nvl_bytes"),
            name,
            format!("{nvl_bytes} > INT_MAX while num_rdma_bytes > 0 (deep_ep.cpp:153)"),
        );
    }
    if !b.low_latency_mode && rdma_bytes > INT_MAX {
        d.error(
            "buffer-int-max",
            &bkey("num_rdma_bytes"),
            name,
            format!(
                "{rdma_bytes} > INT_MAX is allowed only with low_latency_mode (deep_ep.cpp:155)"
            ),
        );
    }
    if rdma_bytes > 0 && !(n > NUM_MAX_NVL_PEERS || b.low_latency_mode) {
        d.error("rdma-bytes-intranode", &bkey("num_rdma_bytes"), name, format!("num_rdma_bytes = {rdma_bytes} with {n} ranks in normal mode: an RDMA buffer needs > 8 ranks or low_latency_mode (deep_ep.cpp:160-161)"));
    }
}

/// QPs, SMs and MNNVL against the mode and the machine.
fn check_qps_sms_mnnvl(job: &Job<'_>, b: &BufferSpec, mode: EpMode, d: &mut Diagnostics<'_>) {
    let (prefix, name, topo, profile) = (job.prefix.as_str(), job.name(), job.topo, job.profile);
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    if mode.uses_nvshmem() && b.num_qps_per_rank == 0 {
        d.error(
            "qps-positive",
            &bkey("num_qps_per_rank"),
            name,
            "num_qps_per_rank must be > 0 when NVSHMEM is initialised (buffer.py:107)".into(),
        );
    }
    if !b.num_sms.is_multiple_of(2) || b.num_sms == 0 {
        d.error("num-sms-even", &bkey("num_sms"), name, format!("num_sms = {}: must be even and > 0 (Buffer.set_num_sms, buffer.py:162); channels = num_sms / 2", b.num_sms));
    }
    if b.num_sms > profile.gpu.sm_count {
        d.error(
            "num-sms-device",
            &bkey("num_sms"),
            name,
            format!(
                "num_sms = {} exceeds the {} SMs of a {}",
                b.num_sms, profile.gpu.sm_count, profile.gpu.name
            ),
        );
    }
    if b.allow_mnnvl && topo.nvlink != NvlinkKind::Mnnvl {
        d.advisory("mnnvl-unused", &bkey("allow_mnnvl"), name, format!("allow_mnnvl has no effect without a multi-node NVLink domain (cluster nvlink = \"{}\")", topo.nvlink));
    }
    if topo.nvlink == NvlinkKind::Mnnvl && !b.allow_mnnvl && mode == EpMode::LowLatency {
        d.advisory("mnnvl-disabled", &bkey("allow_mnnvl"), name, "allow_mnnvl = false writes NVSHMEM_DISABLE_MNNVL=1: peers on other trays of the NVLink domain are reached over RDMA".into());
    }
}
