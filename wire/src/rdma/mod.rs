//! RDMA through ibverbs (cargo feature `rdma`, off by default): device and port discovery,
//! protection domain and memory registration, RC queue pairs created with a scenario's
//! settings (`NVSHMEM_IB_SL`, `NVSHMEM_QP_DEPTH`, path MTU, `num_qps_per_rank`), connection
//! setup by exchanging QP endpoints out of band, RDMA WRITE, WRITE_WITH_IMM, fetch-and-add,
//! completion polling with errors that name the QP and work request, and the verbs wire the
//! CPU proxy (`crate::wire`) drives.
//!
//! Architecture Invariant: the module compiles with and without the feature. Without it no
//! libibverbs is linked and [`rdma_devices`] returns [`WireError::NotBuilt`]; with it, a
//! machine without an RDMA device gets [`WireError::NoDevice`]. Either way the internode wire
//! is TCP under `--wire auto` (`crate::choose` says why), and `--wire verbs` is waived with the
//! reason, never a panic.
//!
//! Layers: `sys` (the only `unsafe` FFI, over `ibverbs-sys`) ← `verbs` (safe API) ←
//! `verbs_wire` (the [`crate::Wire`] over RC QPs). `types`, `settings` and `endpoint` are plain
//! Rust and always built; the doorbell queue and the proxy loop are the crate's, shared with
//! the TCP wire.
//!
//! Tests against a real verbs stack run in a QEMU VM with Soft-RoCE: `scripts/rdma-vm-test`.

mod endpoint;
mod settings;
mod types;

#[cfg(feature = "rdma")]
mod sys;
#[cfg(feature = "rdma")]
mod verbs;
#[cfg(feature = "rdma")]
mod verbs_wire;

pub use endpoint::{PeerInfo, QpEndpoint, RemoteRegion};

use crate::error::WireError;
pub use settings::QpSettings;
pub use types::{
    DeviceSummary, GidKind, GidSummary, LinkLayer, PortState, PortSummary, QpState, guid_text,
    lane_gbps, mtu_bytes, mtu_code, width_lanes,
};

#[cfg(feature = "rdma")]
pub use verbs::{
    ForeignRegion, GpuMemoryPath, HostRegion, LocalMemory, MARKER_WR_ID, Nic, PreparedQp, Qp,
    QpAttributes, RecvCompletion, connect_pairs, default_device, is_flush,
};
#[cfg(feature = "rdma")]
pub use verbs_wire::VerbsWire;

/// What the NIC probe measured on one port (`probe_nic`; docs/calibration.md, "The NIC").
#[derive(Debug, Clone, PartialEq)]
pub struct NicProbe {
    pub device: String,
    pub port: u8,
    pub link_layer: String,
    /// Half of an 8-byte RDMA WRITE ping-pong's round between two QPs of the port, mean over
    /// `latency_rounds`.
    pub write_latency_ns: f64,
    pub latency_rounds: u32,
    /// Payload of `bw_message_bytes` writes kept `bw_window` deep, completed per second, in
    /// GB/s.
    pub write_bw_gbps: f64,
    pub bw_message_bytes: u32,
    pub bw_window: u32,
    /// `rate_message_bytes` writes kept up to `rate_window` deep, completed per second, in
    /// millions.
    pub message_rate_mps: f64,
    pub rate_message_bytes: u32,
    pub rate_window: u32,
}

/// RDMA WRITE latency, bandwidth and message rate between two QPs of `wanted`
/// (`device[:port]`, or the first ACTIVE port). Without the `rdma` feature
/// `Err(WireError::NotBuilt)`; without a device `Err(WireError::NoDevice)`.
pub fn probe_nic(wanted: Option<&str>) -> Result<NicProbe, WireError> {
    #[cfg(feature = "rdma")]
    {
        verbs::probe_nic(wanted)
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = wanted;
        Err(WireError::NotBuilt)
    }
}

/// Whether this build has the RDMA path compiled in.
pub const BUILT: bool = cfg!(feature = "rdma");

/// The RDMA devices of this machine with their ports, or why there are none. Never panics:
/// without the `rdma` feature it is `Err(WireError::NotBuilt)`, without a device
/// `Err(WireError::NoDevice)`.
pub fn rdma_devices() -> Result<Vec<DeviceSummary>, WireError> {
    #[cfg(feature = "rdma")]
    {
        verbs::discover()
    }
    #[cfg(not(feature = "rdma"))]
    {
        Err(WireError::NotBuilt)
    }
}

/// `None` when the verbs wire can run here: some device has an ACTIVE port. Otherwise the
/// one-line reason (`wire::choose` gives the same when verbs is asked for).
pub fn internode_waiver() -> Option<String> {
    match rdma_devices() {
        Ok(devices) if devices.iter().any(|d| d.active_port().is_some()) => None,
        Ok(devices) => Some(format!(
            "internode scenarios need an RDMA port in the ACTIVE state; found {}",
            devices.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("; ")
        )),
        Err(e) => Some(format!("internode scenarios need RDMA: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_device_the_answer_is_an_error_not_a_panic() {
        // On this machine (no RDMA device, or no rdma feature) discovery must return a clear
        // error; inside the Soft-RoCE VM it returns rxe0.
        match rdma_devices() {
            Ok(devices) => assert!(!devices.is_empty()),
            Err(e) => {
                let text = e.to_string();
                assert!(
                    matches!(e, WireError::NotBuilt | WireError::NoDevice { .. }),
                    "unexpected error kind: {text}"
                );
                assert!(!text.is_empty());
                let waiver = internode_waiver().expect("no device means a waiver");
                assert!(waiver.contains(&text), "{waiver}");
            }
        }
    }

    #[cfg(not(feature = "rdma"))]
    #[test]
    fn not_built_is_reported() {
        assert!(matches!(rdma_devices(), Err(WireError::NotBuilt)));
        assert!(internode_waiver().unwrap().contains("built without the rdma feature"));
    }
}
