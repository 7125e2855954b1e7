//! Device discovery: every device libibverbs sees with its ports, and the device a run uses.

use std::sync::Arc;

use super::super::sys::{self, OpenError, RawContext};
use super::super::types::{
    DeviceSummary, GidKind, GidSummary, LinkLayer, PortState, PortSummary, guid_text, lane_gbps,
    mtu_bytes, width_lanes,
};
use crate::error::{Site, WireError};

/// Every RDMA device libibverbs sees, with its ports; an error when there is none.
pub fn discover() -> Result<Vec<DeviceSummary>, WireError> {
    let list = ibverbs::devices().map_err(|e| WireError::NoDevice {
        reason: format!("libibverbs cannot list devices ({e}); is the kernel's ib_uverbs loaded?"),
    })?;
    let names: Vec<String> =
        list.iter().filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned())).collect();
    drop(list);
    if names.is_empty() {
        return Err(WireError::NoDevice {
            reason: "libibverbs found no RDMA device (no RDMA NIC here, or its driver and \
                     ib_uverbs are not loaded)"
                .into(),
        });
    }
    let mut devices = Vec::new();
    let mut failures = Vec::new();
    for name in &names {
        match open_context(name).and_then(|ctx| summarize(&ctx)) {
            Ok(summary) => devices.push(summary),
            Err(e) => failures.push(e.to_string()),
        }
    }
    if devices.is_empty() {
        return Err(WireError::NoDevice {
            reason: format!("no RDMA device could be opened: {}", failures.join("; ")),
        });
    }
    Ok(devices)
}

pub(super) fn open_context(name: &str) -> Result<Arc<RawContext>, WireError> {
    RawContext::open(name).map_err(|e| match e {
        OpenError::NotFound { present } => WireError::DeviceNotFound {
            device: name.to_string(),
            present: if present.is_empty() { "none".into() } else { present.join(", ") },
        },
        OpenError::Io(source) => {
            WireError::Verbs { site: Site::port(name, 0), call: "ibv_open_device", source }
        }
    })
}

pub(super) fn summarize(ctx: &RawContext) -> Result<DeviceSummary, WireError> {
    let name = ctx.name();
    let attr = ctx.query_device().map_err(|source| WireError::Verbs {
        site: Site::port(name, 0),
        call: "ibv_query_device",
        source,
    })?;
    let mut ports = Vec::new();
    let mut gid_capacity = 0usize;
    let mut port_attrs = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        let pa = ctx.query_port(port).map_err(|source| WireError::Verbs {
            site: Site::port(name, port),
            call: "ibv_query_port",
            source,
        })?;
        gid_capacity += pa.gid_tbl_len.max(0) as usize;
        port_attrs.push((port, pa));
    }
    // The GID table is only meaningful for ARMED/ACTIVE ports (ibv_query_gid(3)); a failure
    // here leaves the GID lists empty rather than hiding the device.
    let gids = ctx.gid_table(gid_capacity).unwrap_or_default();
    for (port, pa) in port_attrs {
        let width = width_lanes(pa.active_width);
        let lane = lane_gbps(pa.active_speed);
        ports.push(PortSummary {
            port,
            state: PortState::from_verbs(pa.state),
            link_layer: LinkLayer::from_verbs(pa.link_layer),
            max_mtu_bytes: mtu_bytes(pa.max_mtu).unwrap_or(0),
            active_mtu_bytes: mtu_bytes(pa.active_mtu).unwrap_or(0),
            lid: pa.lid,
            width_lanes: width,
            lane_gbps: lane,
            rate_gbps: width as f64 * lane,
            max_vl_num: pa.max_vl_num,
            gids: gids
                .iter()
                .filter(|g| g.port == port as u32)
                .map(|g| GidSummary {
                    index: g.index,
                    gid: g.gid,
                    kind: GidKind::from_verbs(g.gid_type),
                    netdev_ifindex: g.ndev_ifindex,
                })
                .filter(|g| g.gid != [0; 16])
                .collect(),
        });
    }
    let fw = attr.fw_ver.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect();
    Ok(DeviceSummary {
        name: name.to_string(),
        node_guid: guid_text(ctx.node_guid_be()),
        fw_ver: fw,
        vendor_id: attr.vendor_id,
        vendor_part_id: attr.vendor_part_id,
        max_qp_wr: attr.max_qp_wr.max(0) as u32,
        max_qp: attr.max_qp.max(0) as u32,
        max_cqe: attr.max_cqe.max(0) as u32,
        max_mr_size_bytes: attr.max_mr_size,
        max_qp_init_rd_atom: attr.max_qp_init_rd_atom.max(0) as u32,
        max_qp_rd_atom: attr.max_qp_rd_atom.max(0) as u32,
        atomics: attr.atomic_cap != sys::ATOMIC_NONE,
        ports,
    })
}

/// The device a test or the hardware backend uses: `wanted` (`HwOptions::rdma_device`,
/// `EPTWIN_RDMA_DEVICE`: `name` or `name:port`), else the first device with an ACTIVE port.
pub fn default_device(wanted: Option<&str>) -> Result<(DeviceSummary, u8), WireError> {
    let devices = discover()?;
    if let Some(wanted) = wanted {
        let (name, port) = match wanted.split_once(':') {
            Some((n, p)) => (n.to_string(), p.parse::<u8>().ok()),
            None => (wanted.to_string(), None),
        };
        let present = devices.iter().map(|d| d.name.clone()).collect::<Vec<_>>().join(", ");
        let dev = devices
            .into_iter()
            .find(|d| d.name == name)
            .ok_or(WireError::DeviceNotFound { device: name.clone(), present })?;
        let port = match port {
            Some(p) => p,
            None => dev.active_port().map_or(1, |p| p.port),
        };
        return Ok((dev, port));
    }
    let summary = devices.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("; ");
    devices
        .into_iter()
        .find_map(|d| d.active_port().map(|p| p.port).map(|port| (d, port)))
        .ok_or(WireError::NoDevice { reason: format!("no device has an ACTIVE port ({summary})") })
}
