//! The NIC keys of `eptwin calibrate` (docs/calibration.md, "The NIC"): with an ACTIVE ibverbs
//! port, its negotiated rate, and RDMA WRITE latency, bandwidth and message rate between two
//! QPs of the port (`eptwin_wire::rdma::probe_nic`, a build with `--features rdma`). Without an
//! ACTIVE port, or without the feature, the NIC keys stay the base's and progress says why.

use eptwin_wire::rdma::NicProbe;

use super::inventory::{self, Inventory};
use super::writer::Measured;

/// The link rates a profile accepts (`eptwin_engine::profile`, `Range::Gbps`).
const LINK_GBPS_MIN: f64 = 1.0;
const LINK_GBPS_MAX: f64 = 1e7;

/// The base profile's NIC latencies a host write's one-way time is split against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BaseNic {
    pub doorbell_ns: u64,
    pub rx_latency_ns: u64,
}

impl BaseNic {
    pub fn of(base: &super::writer::Base) -> BaseNic {
        let key = |k: &str| base.number("nic", k).unwrap_or(0.0) as u64;
        BaseNic { doorbell_ns: key("doorbell_ns"), rx_latency_ns: key("rx_latency_ns") }
    }
}

/// The NIC keys this machine gives, saying on stderr what stays the base's.
pub fn keys(inv: &Inventory, base: BaseNic) -> Vec<Measured> {
    if inv.active_ports.is_empty() {
        super::progress("no ACTIVE ibverbs port: the NIC and fabric keys stay the base's");
        return Vec::new();
    }
    let names: Vec<&str> = inv.active_ports.iter().map(|p| p.name.as_str()).collect();
    let mut out = inventory::nic(inv);
    let wanted = inv.active_ports.first().map(|p| p.name.clone());
    super::progress(&format!(
        "ACTIVE ibverbs port(s) {}: nic.link_gbps from the negotiated rate; probing RDMA WRITE latency, bandwidth and message rate on {}",
        names.join(", "),
        wanted.as_deref().unwrap_or("the first")
    ));
    // A software NIC's nominal rate (Soft-RoCE says 2.5 Gb/s) is below what a profile's link
    // may be: the base's stays, and nothing is measured against it.
    if let Some(gbps) = out.first().and_then(|m| m.value.as_float())
        && !(LINK_GBPS_MIN..=LINK_GBPS_MAX).contains(&gbps)
    {
        super::progress(&format!(
            "nic.link_gbps stays the base's: the port's negotiated {gbps} GB/s is outside a profile's range"
        ));
        out.clear();
    }
    match eptwin_wire::rdma::probe_nic(wanted.as_deref()) {
        Ok(probe) => {
            super::progress(&format!(
                "NIC probe on {}:{} ({}): one-way {:.0} ns ({} rounds), {:.2} GB/s of {} B writes, {:.3} M writes/s of {} B",
                probe.device,
                probe.port,
                probe.link_layer,
                probe.write_latency_ns,
                probe.latency_rounds,
                probe.write_bw_gbps,
                probe.bw_message_bytes,
                probe.message_rate_mps,
                probe.rate_message_bytes
            ));
            let link_gbps = out.first().and_then(|m| m.value.as_float());
            let (keys, notes) = from_probe(&probe, link_gbps, base);
            for note in notes {
                super::progress(&note);
            }
            out.extend(keys);
        }
        Err(e) => super::progress(&format!(
            "NIC probe not run ({e}): the NIC's latency, bandwidth and message rate stay the base's"
        )),
    }
    out
}

/// The profile keys a probe gives, and a note for each it cannot: `nic.efficiency` (write
/// bandwidth over the negotiated rate), `nic.wqe_process_ns` (the time per write at the message
/// rate), `nic.tx_latency_ns` (the one-way write time less the base's doorbell and receive
/// latencies: the model's doorbell + tx + rx is that path).
pub fn from_probe(
    p: &NicProbe,
    link_gbps: Option<f64>,
    base: BaseNic,
) -> (Vec<Measured>, Vec<String>) {
    let (mut keys, mut notes) = (Vec::new(), Vec::new());
    let at = format!("{}:{} ({})", p.device, p.port, p.link_layer);
    match link_gbps {
        Some(link) if p.write_bw_gbps > 0.0 && p.write_bw_gbps <= link => {
            let e = (p.write_bw_gbps / link * 1000.0).round() / 1000.0;
            keys.push(Measured::new(
                "nic",
                "efficiency",
                toml::Value::Float(e),
                format!(
                    "probe_nic on {at}: {:.2} GB/s of {} B RDMA WRITEs, {} deep / {link} GB/s negotiated",
                    p.write_bw_gbps, p.bw_message_bytes, p.bw_window
                ),
            ));
        }
        _ => notes.push(format!(
            "nic.efficiency stays the base's: {:.2} GB/s measured against a negotiated rate of {}",
            p.write_bw_gbps,
            link_gbps.map_or("unknown".into(), |l| format!("{l} GB/s"))
        )),
    }
    if p.message_rate_mps > 0.0 {
        let ns = (1000.0 / p.message_rate_mps).round().max(1.0) as i64;
        keys.push(Measured::new(
            "nic",
            "wqe_process_ns",
            toml::Value::Integer(ns),
            format!(
                "probe_nic on {at}: 1 / {:.3} M writes/s of {} B, up to {} deep on one QP",
                p.message_rate_mps, p.rate_message_bytes, p.rate_window
            ),
        ));
    }
    let rest = base.doorbell_ns + base.rx_latency_ns;
    if p.write_latency_ns > rest as f64 {
        let tx = (p.write_latency_ns - rest as f64).round() as i64;
        keys.push(Measured::new(
            "nic",
            "tx_latency_ns",
            toml::Value::Integer(tx),
            format!(
                "probe_nic on {at}: one-way 8 B RDMA WRITE {:.0} ns (half a ping-pong, {} rounds) - the base's doorbell_ns {} - rx_latency_ns {} [verify]: the probe's WQE and payload are in host memory, IBGDA's in GPU memory",
                p.write_latency_ns, p.latency_rounds, base.doorbell_ns, base.rx_latency_ns
            ),
        ));
    } else {
        notes.push(format!(
            "nic.tx_latency_ns stays the base's: one-way {:.0} ns is not above the base's doorbell + rx latency ({rest} ns)",
            p.write_latency_ns
        ));
    }
    (keys, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(latency_ns: f64, bw_gbps: f64, rate_mps: f64) -> NicProbe {
        NicProbe {
            device: "mlx5_0".into(),
            port: 1,
            link_layer: "InfiniBand".into(),
            write_latency_ns: latency_ns,
            latency_rounds: 2000,
            write_bw_gbps: bw_gbps,
            bw_message_bytes: 1 << 20,
            bw_window: 16,
            message_rate_mps: rate_mps,
            rate_message_bytes: 64,
            rate_window: 256,
        }
    }

    const BASE: BaseNic = BaseNic { doorbell_ns: 800, rx_latency_ns: 800 };

    #[test]
    fn a_probe_gives_efficiency_per_write_time_and_tx_latency() {
        let (keys, notes) = from_probe(&probe(2600.0, 47.0, 20.0), Some(50.0), BASE);
        assert!(notes.is_empty(), "{notes:?}");
        let get = |k: &str| keys.iter().find(|m| m.key == k).map(|m| m.value.clone());
        assert_eq!(get("efficiency"), Some(toml::Value::Float(0.94)));
        assert_eq!(get("wqe_process_ns"), Some(toml::Value::Integer(50)));
        assert_eq!(get("tx_latency_ns"), Some(toml::Value::Integer(1000)));
        assert!(keys.iter().all(|m| m.source.contains("mlx5_0:1")));
    }

    #[test]
    fn what_the_probe_cannot_support_stays_the_bases_with_a_note() {
        // Faster than the negotiated rate (a software NIC), and a one-way time below the
        // base's doorbell + rx: neither key is written.
        let (keys, notes) = from_probe(&probe(1000.0, 60.0, 1.0), Some(50.0), BASE);
        assert_eq!(keys.iter().map(|m| m.key.as_str()).collect::<Vec<_>>(), ["wqe_process_ns"]);
        assert_eq!(notes.len(), 2, "{notes:?}");
        let (keys, _) = from_probe(&probe(5000.0, 10.0, 0.0), None, BASE);
        assert_eq!(keys.iter().map(|m| m.key.as_str()).collect::<Vec<_>>(), ["tx_latency_ns"]);
    }

    #[test]
    fn without_an_active_port_nothing_is_probed() {
        assert!(keys(&Inventory::default(), BASE).is_empty());
    }
}
