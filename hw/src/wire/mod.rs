//! The internode wire: how bytes a producer staged in its send region reach a peer process's
//! receive region, behind one CPU-proxy interface (docs/internode-wire.md).
//!
//! * [`doorbell`] — the MPSC ring producers (GPU kernels through mapped pinned memory; threads
//!   in tests) publish `Write` / `Flag` records into.
//! * [`proxy`] — the thread that consumes doorbell queues, checks each record against the
//!   regions and hands it to a [`Wire`]. One loop for every wire.
//! * [`region`] — the memory: owned, or external (`cuMemHostAlloc` pointers) used in place.
//! * [`tcp`] — the TCP wire (always built): one connection per peer process, length-prefixed
//!   frames, a receiver thread per connection.
//! * The verbs wire is `rdma::VerbsWire` (feature `rdma`): RC QPs, RDMA WRITE, fetch-and-add
//!   flags, depth-bounded, completions polled.
//!
//! Ordering guarantee, both wires: the records of one QP are applied at the peer in the order
//! they were published, and a `Flag` is applied (its counter incremented) only after every
//! earlier `Write` of that QP is in the receive region. Verbs gets this from RC execution
//! order (a fetch-and-add executes after the writes before it on the QP); TCP from one
//! in-order byte stream per peer process carrying every QP to that peer, and a receiver that
//! copies a write's payload before it applies any later flag with `fetch_add(Release)`.
//! Consumers read counters with Acquire loads ([`Region::load_u64`]). Records of different
//! QPs are not ordered with each other on verbs; on TCP those to one peer happen to be, which
//! the protocol must not rely on.

pub mod doorbell;
pub mod proxy;
pub mod region;
pub mod tcp;

use std::fmt;
use std::time::Duration;

use serde::Serialize;

pub use doorbell::{
    Doorbell, DoorbellConsumer, DoorbellKind, DoorbellProducer, QueueClosed, doorbell_queue,
};
pub use proxy::{Proxy, ProxySpec, ProxyStats};
pub use region::Region;
pub use tcp::{TcpEndpoint, TcpReceivers, TcpSetup, TcpTimeouts, TcpWire};

use crate::rdma::{DeviceSummary, RdmaError};

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
    ) -> Result<(), RdmaError>;
    /// Start moving one checked record.
    fn post(&mut self, qp: usize, kind: DoorbellKind, record: &Doorbell) -> Result<(), RdmaError>;
    /// Move things along (poll completions, flush buffered frames); whether anything happened.
    fn progress(&mut self) -> Result<bool, RdmaError>;
    /// Records in flight on `qp` (for statistics).
    fn outstanding(&self, qp: usize) -> u32;
    /// Wait, at most `timeout`, until everything posted has left this process for good
    /// (verbs: every request completed; TCP: every frame written to its socket).
    fn drain(&mut self, timeout: Duration) -> Result<(), RdmaError>;
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

/// What the user asked for (`--wire auto|verbs|tcp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireRequest {
    /// Verbs when this build has `rdma` and a port is ACTIVE, else TCP.
    #[default]
    Auto,
    /// Verbs or an error saying why not.
    Verbs,
    Tcp,
}

impl std::str::FromStr for WireRequest {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(WireRequest::Auto),
            "verbs" => Ok(WireRequest::Verbs),
            "tcp" => Ok(WireRequest::Tcp),
            other => Err(format!("wire {other:?}: expected auto, verbs or tcp")),
        }
    }
}

/// The wire that will run, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireChoice {
    pub kind: WireKind,
    /// One line for the log and the result document.
    pub reason: String,
}

/// Choose the wire on this machine: [`choose_from`] over [`crate::rdma::rdma_devices`].
pub fn choose(requested: WireRequest) -> Result<WireChoice, RdmaError> {
    choose_from(requested, crate::rdma::rdma_devices())
}

/// The choice given what device discovery returned. Auto takes verbs when some device has an
/// ACTIVE port, else TCP (saying why); Verbs requested without one is an error with the
/// reason, never a silent fallback.
pub fn choose_from(
    requested: WireRequest,
    devices: Result<Vec<DeviceSummary>, RdmaError>,
) -> Result<WireChoice, RdmaError> {
    let verbs = match devices {
        Ok(devices) => {
            let active = devices.iter().find_map(|d| {
                d.active_port().map(|p| format!("{} port {} is ACTIVE ({p})", d.name, p.port))
            });
            match active {
                Some(active) => Ok(active),
                None if devices.is_empty() => Err("no RDMA device".to_string()),
                None => Err(format!(
                    "no RDMA port is ACTIVE: {}",
                    devices.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("; ")
                )),
            }
        }
        Err(e) => Err(e.to_string()),
    };
    match (requested, verbs) {
        (WireRequest::Tcp, _) => {
            Ok(WireChoice { kind: WireKind::Tcp, reason: "tcp requested".into() })
        }
        (_, Ok(active)) => Ok(WireChoice {
            kind: WireKind::Verbs,
            reason: format!(
                "{}: {active}",
                if requested == WireRequest::Verbs { "verbs requested" } else { "auto" }
            ),
        }),
        (WireRequest::Verbs, Err(why)) => {
            Err(RdmaError::WireUnavailable { requested: "verbs", reason: why })
        }
        (WireRequest::Auto, Err(why)) => {
            Ok(WireChoice { kind: WireKind::Tcp, reason: format!("auto: {why}") })
        }
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
    use crate::rdma::{LinkLayer, PortState, PortSummary};

    fn device(state: PortState) -> DeviceSummary {
        DeviceSummary {
            name: "mlx5_0".into(),
            node_guid: "0000:0000:0000:0001".into(),
            fw_ver: "28.0".into(),
            vendor_id: 0x2c9,
            vendor_part_id: 4129,
            max_qp_wr: 32768,
            max_qp: 1 << 17,
            max_cqe: 1 << 22,
            max_mr_size_bytes: u64::MAX,
            max_qp_init_rd_atom: 16,
            max_qp_rd_atom: 16,
            atomics: true,
            ports: vec![PortSummary {
                port: 1,
                state,
                link_layer: LinkLayer::Infiniband,
                max_mtu_bytes: 4096,
                active_mtu_bytes: 4096,
                lid: 7,
                width_lanes: 4,
                lane_gbps: 100.0,
                rate_gbps: 400.0,
                max_vl_num: 4,
                gids: vec![],
            }],
        }
    }

    #[test]
    fn auto_takes_verbs_only_with_an_active_port() {
        let c = choose_from(WireRequest::Auto, Ok(vec![device(PortState::Active)])).unwrap();
        assert_eq!(c.kind, WireKind::Verbs);
        assert!(c.reason.contains("mlx5_0 port 1 is ACTIVE"), "{}", c.reason);
        let c = choose_from(WireRequest::Auto, Ok(vec![device(PortState::Down)])).unwrap();
        assert_eq!(c.kind, WireKind::Tcp);
        assert!(c.reason.contains("no RDMA port is ACTIVE") && c.reason.contains("DOWN"));
        let c = choose_from(WireRequest::Auto, Err(RdmaError::NotBuilt)).unwrap();
        assert_eq!(c.kind, WireKind::Tcp);
        assert!(c.reason.contains("built without the rdma feature"), "{}", c.reason);
    }

    #[test]
    fn verbs_requested_but_unavailable_is_an_error_with_the_reason() {
        let e = choose_from(WireRequest::Verbs, Ok(vec![device(PortState::Init)])).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("verbs wire was requested") && text.contains("INIT"), "{text}");
        let e = choose_from(WireRequest::Verbs, Err(RdmaError::NotBuilt)).unwrap_err();
        assert!(e.to_string().contains("--features rdma"), "{e}");
        let e = choose_from(
            WireRequest::Verbs,
            Err(RdmaError::NoDevice { reason: "libibverbs found no RDMA device".into() }),
        )
        .unwrap_err();
        assert!(e.to_string().contains("found no RDMA device"), "{e}");
        let c = choose_from(WireRequest::Verbs, Ok(vec![device(PortState::Active)])).unwrap();
        assert_eq!(c.kind, WireKind::Verbs);
    }

    #[test]
    fn tcp_requested_is_tcp_even_with_a_port() {
        let c = choose_from(WireRequest::Tcp, Ok(vec![device(PortState::Active)])).unwrap();
        assert_eq!(c.kind, WireKind::Tcp);
    }

    #[test]
    fn requests_parse_and_choice_here_never_panics() {
        assert_eq!("auto".parse::<WireRequest>(), Ok(WireRequest::Auto));
        assert_eq!("verbs".parse::<WireRequest>(), Ok(WireRequest::Verbs));
        assert_eq!("tcp".parse::<WireRequest>(), Ok(WireRequest::Tcp));
        assert!("ib".parse::<WireRequest>().unwrap_err().contains("auto, verbs or tcp"));
        // On this machine: whatever discovery says, Auto yields a wire and Tcp is Tcp.
        let auto = choose(WireRequest::Auto).unwrap();
        assert!(!auto.reason.is_empty());
        assert_eq!(choose(WireRequest::Tcp).unwrap().kind, WireKind::Tcp);
    }

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
