//! What carries the proxy's records to the peers ([`Wire`], implemented by the TCP wire and,
//! with the `rdma` feature, the verbs wire), and what a wire reports of itself for the result
//! document ([`WireReport`]).

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::doorbell::{Doorbell, DoorbellKind};
use crate::error::WireError;

/// What the proxy counted while it served its queues.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyStats {
    pub writes: u64,
    pub write_bytes: u64,
    pub flags: u64,
    /// Times a record had to wait because its QP had `depth` requests in flight (verbs).
    pub depth_stalls: u64,
    /// Most requests in flight on any one QP (never above its depth).
    pub max_outstanding: u32,
}

/// What carries a proxy's records to its peers. Implemented by [`TcpWire`] and, with the
/// `rdma` feature, `rdma::VerbsWire`. The proxy checks every record before calling `post`, so
/// implementations may rely on in-range offsets and 8-aligned flags.
pub trait Wire: Send + 'static {
    fn kind(&self) -> WireKind;
    /// Entries of the QP table doorbells index.
    fn qp_count(&self) -> usize;
    /// The peer process QP `qp` reaches.
    fn peer_of(&self, qp: usize) -> u32;
    /// Bytes of the local send region (`src_offset` indexes it).
    fn send_len(&self) -> u64;
    /// Bytes of the receive region QP `qp` writes into at its peer (`dst_offset` indexes it).
    fn remote_len(&self, qp: usize) -> u64;
    /// Wait, at most `timeout`, until `qp` can take one more record (verbs: fewer than the QP
    /// depth in flight; TCP: always).
    fn reserve(
        &mut self,
        qp: usize,
        timeout: Duration,
        stats: &mut ProxyStats,
    ) -> Result<(), WireError>;
    /// Start moving one checked record.
    fn post(&mut self, qp: usize, kind: DoorbellKind, record: &Doorbell) -> Result<(), WireError>;
    /// Move things along (poll completions, flush buffered frames); whether anything happened.
    fn progress(&mut self) -> Result<bool, WireError>;
    /// Records in flight on `qp` (for statistics).
    fn outstanding(&self, qp: usize) -> u32;
    /// Wait, at most `timeout`, until everything posted has left this process for good
    /// (verbs: every request completed; TCP: every frame written to its socket).
    fn drain(&mut self, timeout: Duration) -> Result<(), WireError>;
}

/// Which wire moved internode bytes (`backend.wire` in the result document, docs/results.md):
/// `"verbs"`, `"tcp"`; `"none"` is the backend's word for a run without internode traffic,
/// which has no wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WireKind {
    /// RDMA through ibverbs: RC QPs with the scenario's SL, depth, MTU and QP count.
    Verbs,
    /// TCP sockets between the processes: works on any machine; its timings are not a
    /// measurement of any fabric.
    Tcp,
}

impl WireKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WireKind::Verbs => "verbs",
            WireKind::Tcp => "tcp",
        }
    }
}

impl fmt::Display for WireKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the NIC reads the tokens it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DataPath {
    /// GPU memory registered with the NIC (dma-buf or nvidia-peermem): GPUDirect RDMA.
    Gpudirect,
    /// Host-pinned staging the GPU writes through a mapping: one more PCIe crossing, and
    /// always the path of the TCP wire.
    Staged,
}

/// What ran, for the result document (`backend.wire` and its details): the QP settings as the
/// device reports them back (verbs), so no one compares numbers of different paths.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WireReport {
    pub wire: WireKind,
    pub data_path: DataPath,
    /// Why this wire ([`WireChoice::reason`]).
    pub reason: String,
    /// Peer processes this process exchanges with.
    pub peers: u32,
    /// `num_qps_per_rank`: QPs per pair of ranks (verbs: RC QPs; TCP: multiplexed on the
    /// peer's connection).
    pub qps_per_peer: u32,
    /// Entries of this process's QP table.
    pub qps_total: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sl: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_class: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qp_depth: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu_bytes: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_layer: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_serializes_with_the_result_document_words() {
        let r = WireReport {
            wire: WireKind::Tcp,
            data_path: DataPath::Staged,
            reason: "tcp requested".into(),
            peers: 1,
            qps_per_peer: 4,
            qps_total: 32,
            sl: None,
            traffic_class: None,
            qp_depth: None,
            mtu_bytes: None,
            device: None,
            link_layer: None,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["wire"], "tcp");
        assert_eq!(v["data_path"], "staged");
        assert!(v.get("sl").is_none(), "verbs-only fields are absent on tcp: {v}");
        let v = serde_json::to_value(WireReport {
            wire: WireKind::Verbs,
            data_path: DataPath::Gpudirect,
            sl: Some(3),
            qp_depth: Some(1024),
            ..r
        })
        .unwrap();
        assert_eq!(
            (v["wire"].as_str(), v["data_path"].as_str()),
            (Some("verbs"), Some("gpudirect"))
        );
        assert_eq!((v["sl"].as_u64(), v["qp_depth"].as_u64()), (Some(3), Some(1024)));
    }
}
