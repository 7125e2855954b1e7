//! Which wire runs here: TCP, or verbs when this build has `rdma` and a port is ACTIVE
//! (`--wire auto|verbs|tcp`), never a silent fallback when verbs is asked for.

use crate::error::WireError;
use crate::link::WireKind;
use crate::rdma::DeviceSummary;

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
pub fn choose(requested: WireRequest) -> Result<WireChoice, WireError> {
    choose_from(requested, crate::rdma::rdma_devices())
}

/// The choice given what device discovery returned. Auto takes verbs when some device has an
/// ACTIVE port, else TCP (saying why); Verbs requested without one is an error with the
/// reason, never a silent fallback.
pub fn choose_from(
    requested: WireRequest,
    devices: Result<Vec<DeviceSummary>, WireError>,
) -> Result<WireChoice, WireError> {
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
            Err(WireError::WireUnavailable { requested: "verbs", reason: why })
        }
        (WireRequest::Auto, Err(why)) => {
            Ok(WireChoice { kind: WireKind::Tcp, reason: format!("auto: {why}") })
        }
    }
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
        let c = choose_from(WireRequest::Auto, Err(WireError::NotBuilt)).unwrap();
        assert_eq!(c.kind, WireKind::Tcp);
        assert!(c.reason.contains("built without the rdma feature"), "{}", c.reason);
    }

    #[test]
    fn verbs_requested_but_unavailable_is_an_error_with_the_reason() {
        let e = choose_from(WireRequest::Verbs, Ok(vec![device(PortState::Init)])).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("verbs wire was requested") && text.contains("INIT"), "{text}");
        let e = choose_from(WireRequest::Verbs, Err(WireError::NotBuilt)).unwrap_err();
        assert!(e.to_string().contains("--features rdma"), "{e}");
        let e = choose_from(
            WireRequest::Verbs,
            Err(WireError::NoDevice { reason: "libibverbs found no RDMA device".into() }),
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
}
