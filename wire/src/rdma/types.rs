//! Plain data describing RDMA devices and ports, and the verbs encodings they are decoded from
//! (MTU enum, port state, link width/speed). No FFI here: compiled with and without `rdma`.

use std::fmt;

/// What `rdma_devices()` reports for one device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSummary {
    /// Kernel name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Node GUID as `ibv_devinfo` prints it (`5054:00ff:fe12:3456`).
    pub node_guid: String,
    pub fw_ver: String,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    /// Largest `max_send_wr` a QP may ask for (`NVSHMEM_QP_DEPTH` must fit).
    pub max_qp_wr: u32,
    pub max_qp: u32,
    pub max_cqe: u32,
    pub max_mr_size_bytes: u64,
    /// Outstanding RDMA reads/atomics a QP may initiate.
    pub max_qp_init_rd_atom: u32,
    /// Incoming RDMA reads/atomics a QP may have in progress as responder.
    pub max_qp_rd_atom: u32,
    /// Whether fetch-and-add is available (`atomic_cap` is not `ATOMIC_NONE`).
    pub atomics: bool,
    pub ports: Vec<PortSummary>,
}

impl DeviceSummary {
    /// The first port that is up, if any.
    pub fn active_port(&self) -> Option<&PortSummary> {
        self.ports.iter().find(|p| p.state == PortState::Active)
    }
}

impl fmt::Display for DeviceSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (guid {}, max_qp_wr {})", self.name, self.node_guid, self.max_qp_wr)?;
        for p in &self.ports {
            write!(f, "; {p}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PortSummary {
    /// 1-based, as verbs numbers ports.
    pub port: u8,
    pub state: PortState,
    pub link_layer: LinkLayer,
    pub max_mtu_bytes: u32,
    pub active_mtu_bytes: u32,
    /// 0 on RoCE (no subnet manager).
    pub lid: u16,
    /// `active_width` decoded: lanes (1, 2, 4, 8, 12); 0 when the code is unknown.
    pub width_lanes: u8,
    /// Per-lane signalling rate in Gb/s as `ibv_devinfo` names it (2.5 SDR … 100 NDR); 0 when
    /// the code is unknown.
    pub lane_gbps: f64,
    /// `width_lanes × lane_gbps`: the port rate `ibstat` prints (400 for NDR 4x).
    pub rate_gbps: f64,
    /// Operational data VLs (InfiniBand); meaningless on RoCE.
    pub max_vl_num: u8,
    pub gids: Vec<GidSummary>,
}

impl fmt::Display for PortSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "port {} {} {} mtu {}/{} rate {} Gb/s ({}x {} Gb/s), {} GIDs",
            self.port,
            self.state,
            self.link_layer,
            self.active_mtu_bytes,
            self.max_mtu_bytes,
            self.rate_gbps,
            self.width_lanes,
            self.lane_gbps,
            self.gids.len()
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidSummary {
    pub index: u32,
    /// 16 bytes, network order.
    pub gid: [u8; 16],
    pub kind: GidKind,
    /// Interface index of the netdev behind a RoCE GID (0 on InfiniBand).
    pub netdev_ifindex: u32,
}

impl GidSummary {
    /// The GID in IPv6 notation, as `ibv_devinfo -v` prints it.
    pub fn text(&self) -> String {
        std::net::Ipv6Addr::from(self.gid).to_string()
    }

    /// An IPv4-mapped GID (`::ffff:a.b.c.d`): RoCE v2 over IPv4, the entry NVSHMEM and NCCL
    /// prefer when no GID index is configured.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.gid[..10].iter().all(|&b| b == 0) && self.gid[10] == 0xff && self.gid[11] == 0xff
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidKind {
    Ib,
    RoceV1,
    RoceV2,
    Unknown(u32),
}

impl GidKind {
    /// From `enum ibv_gid_type` (verbs.h: IB 0, RoCE v1 1, RoCE v2 2).
    pub fn from_verbs(code: u32) -> Self {
        match code {
            0 => GidKind::Ib,
            1 => GidKind::RoceV1,
            2 => GidKind::RoceV2,
            other => GidKind::Unknown(other),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    Infiniband,
    Ethernet,
    Unspecified,
}

impl LinkLayer {
    /// From `port_attr.link_layer` (verbs.h: IBV_LINK_LAYER_UNSPECIFIED 0, INFINIBAND 1,
    /// ETHERNET 2). Unspecified is treated as InfiniBand by rdma-core's own tools.
    pub fn from_verbs(code: u8) -> Self {
        match code {
            1 => LinkLayer::Infiniband,
            2 => LinkLayer::Ethernet,
            _ => LinkLayer::Unspecified,
        }
    }

    /// RoCE ports route by GID (GRH on every packet); InfiniBand ports by LID.
    pub fn is_roce(self) -> bool {
        self == LinkLayer::Ethernet
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkLayer::Infiniband => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet (RoCE)",
            LinkLayer::Unspecified => "unspecified",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Unknown(u32),
}

impl PortState {
    /// From `enum ibv_port_state` (verbs.h: NOP 0, DOWN 1, INIT 2, ARMED 3, ACTIVE 4,
    /// ACTIVE_DEFER 5).
    pub fn from_verbs(code: u32) -> Self {
        match code {
            0 => PortState::Nop,
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            other => PortState::Unknown(other),
        }
    }
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortState::Nop => f.write_str("NOP"),
            PortState::Down => f.write_str("DOWN"),
            PortState::Init => f.write_str("INIT"),
            PortState::Armed => f.write_str("ARMED"),
            PortState::Active => f.write_str("ACTIVE"),
            PortState::ActiveDefer => f.write_str("ACTIVE_DEFER"),
            PortState::Unknown(c) => write!(f, "state {c}"),
        }
    }
}

/// QP state as `ibv_query_qp` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    Reset,
    Init,
    ReadyToReceive,
    ReadyToSend,
    SendQueueDrain,
    SendQueueError,
    Error,
    Unknown(u32),
}

impl QpState {
    /// From `enum ibv_qp_state` (verbs.h: RESET 0, INIT 1, RTR 2, RTS 3, SQD 4, SQE 5, ERR 6).
    pub fn from_verbs(code: u32) -> Self {
        match code {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::ReadyToReceive,
            3 => QpState::ReadyToSend,
            4 => QpState::SendQueueDrain,
            5 => QpState::SendQueueError,
            6 => QpState::Error,
            other => QpState::Unknown(other),
        }
    }
}

/// `enum ibv_mtu` (verbs.h: 1 = 256 … 5 = 4096) to bytes; `None` for other codes.
pub fn mtu_bytes(code: u32) -> Option<u32> {
    match code {
        1..=5 => Some(128 << code),
        _ => None,
    }
}

/// Bytes to `enum ibv_mtu`; `None` unless one of 256, 512, 1024, 2048, 4096 (the IB MTUs).
pub fn mtu_code(bytes: u32) -> Option<u32> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// `port_attr.active_width` to lanes. Codes from the ibv_query_port(3) man page and
/// rdma-core `libibverbs/examples/devinfo.c` (`width_str`): 1 = 1x, 2 = 4x, 4 = 8x, 8 = 12x,
/// 16 = 2x.
pub fn width_lanes(code: u8) -> u8 {
    match code {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 0,
    }
}

/// `port_attr.active_speed` to the per-lane rate in Gb/s as rdma-core's `devinfo.c`
/// (`speed_str`) prints it: 1 SDR 2.5, 2 DDR 5, 4 QDR 10 (and FDR10 on older firmware),
/// 8 FDR10 10, 16 FDR 14, 32 EDR 25, 64 HDR 50, 128 NDR 100, 256 XDR 200.
pub fn lane_gbps(code: u8) -> f64 {
    match code {
        1 => 2.5,
        2 => 5.0,
        4 | 8 => 10.0,
        16 => 14.0,
        32 => 25.0,
        64 => 50.0,
        128 => 100.0,
        _ => 0.0,
    }
}

/// Node GUID (as `ibv_get_device_guid` returns it: big-endian) in `ibv_devinfo` notation.
pub fn guid_text(guid_be: u64) -> String {
    let g = u64::from_be(guid_be);
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        g >> 48,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes_round_trip() {
        for bytes in [256, 512, 1024, 2048, 4096] {
            assert_eq!(mtu_bytes(mtu_code(bytes).unwrap()), Some(bytes));
        }
        assert_eq!(mtu_code(1500), None);
        assert_eq!(mtu_code(9000), None);
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(mtu_bytes(6), None);
    }

    #[test]
    fn ndr_4x_is_400_gbps_and_rxe_sdr_1x_is_2_5() {
        assert_eq!(width_lanes(2) as f64 * lane_gbps(128), 400.0);
        assert_eq!(width_lanes(1) as f64 * lane_gbps(1), 2.5);
        assert_eq!(width_lanes(3), 0);
    }

    #[test]
    fn guid_prints_like_ibv_devinfo() {
        // rxe0 in the test VM: node_guid 5054:00ff:fe12:3456 (ibv_devinfo).
        assert_eq!(guid_text(0x5054_00ff_fe12_3456u64.to_be()), "5054:00ff:fe12:3456");
    }

    #[test]
    fn ipv4_mapped_gid_is_recognised() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 0, 2, 15]);
        let g = GidSummary { index: 1, gid, kind: GidKind::RoceV2, netdev_ifindex: 2 };
        assert!(g.is_ipv4_mapped());
        assert_eq!(g.text(), "::ffff:10.0.2.15");
        let mut link_local = [0u8; 16];
        link_local[0] = 0xfe;
        link_local[1] = 0x80;
        assert!(!GidSummary { gid: link_local, ..g }.is_ipv4_mapped());
    }
}
