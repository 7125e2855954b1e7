//! The safe verbs API over `sys.rs`: device discovery, a NIC port with its protection domain,
//! registered memory, RC queue pairs created and connected with a scenario's `QpSettings`,
//! RDMA WRITE, WRITE_WITH_IMM, fetch-and-add, and completion polling that turns error
//! completions into `RdmaError`s naming the QP and the work request.
//!
//! Soundness: a posted work request keeps an `Arc` of its local memory until its completion
//! is polled (or the QP is destroyed), so the NIC never touches freed memory; memory the NIC
//! writes is only ever read through raw copies and atomics, never through Rust references.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::endpoint::{QpEndpoint, RemoteRegion};
use super::error::{Opcode, RdmaError, Site};
use super::settings::QpSettings;
use super::sys::{
    self, OpenError, QpAttr, QpMask, RawContext, RawCq, RawMr, RawPd, RawQp, SendRequest,
};
use super::types::{
    DeviceSummary, GidKind, GidSummary, LinkLayer, PortState, PortSummary, QpState, guid_text,
    lane_gbps, mtu_bytes, mtu_code, width_lanes,
};
use crate::wire::{DataPath, Region};

/// Every RDMA device libibverbs sees, with its ports; an error when there is none.
pub fn discover() -> Result<Vec<DeviceSummary>, RdmaError> {
    let list = ibverbs::devices().map_err(|e| RdmaError::NoDevice {
        reason: format!("libibverbs cannot list devices ({e}); is the kernel's ib_uverbs loaded?"),
    })?;
    let names: Vec<String> =
        list.iter().filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned())).collect();
    drop(list);
    if names.is_empty() {
        return Err(RdmaError::NoDevice {
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
        return Err(RdmaError::NoDevice {
            reason: format!("no RDMA device could be opened: {}", failures.join("; ")),
        });
    }
    Ok(devices)
}

fn open_context(name: &str) -> Result<Arc<RawContext>, RdmaError> {
    RawContext::open(name).map_err(|e| match e {
        OpenError::NotFound { present } => RdmaError::DeviceNotFound {
            device: name.to_string(),
            present: if present.is_empty() { "none".into() } else { present.join(", ") },
        },
        OpenError::Io(source) => {
            RdmaError::Verbs { site: Site::port(name, 0), call: "ibv_open_device", source }
        }
    })
}

fn summarize(ctx: &RawContext) -> Result<DeviceSummary, RdmaError> {
    let name = ctx.name();
    let attr = ctx.query_device().map_err(|source| RdmaError::Verbs {
        site: Site::port(name, 0),
        call: "ibv_query_device",
        source,
    })?;
    let mut ports = Vec::new();
    let mut gid_capacity = 0usize;
    let mut port_attrs = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        let pa = ctx.query_port(port).map_err(|source| RdmaError::Verbs {
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
pub fn default_device(wanted: Option<&str>) -> Result<(DeviceSummary, u8), RdmaError> {
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
            .ok_or(RdmaError::DeviceNotFound { device: name.clone(), present })?;
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
        .ok_or(RdmaError::NoDevice { reason: format!("no device has an ACTIVE port ({summary})") })
}

/// One port of one device, with the protection domain everything on it is created in.
#[derive(Clone)]
pub struct Nic {
    inner: Arc<NicInner>,
}

struct NicInner {
    ctx: Arc<RawContext>,
    pd: Arc<RawPd>,
    device: DeviceSummary,
    port: PortSummary,
}

/// How GPU memory can be registered with this NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMemoryPath {
    /// `ibv_reg_dmabuf_mr` on a dma-buf exported by the CUDA driver
    /// (`cuMemGetHandleForAddressRange`), Linux ≥ 5.12 with a driver that implements it.
    DmaBuf,
    /// `ibv_reg_mr` on a device pointer, pinned by the nvidia-peermem kernel module.
    PeerMemory,
}

impl Nic {
    /// Open `device` and use `port` (1-based).
    pub fn open(device: &str, port: u8) -> Result<Nic, RdmaError> {
        let ctx = open_context(device)?;
        let summary = summarize(&ctx)?;
        let port_summary =
            summary.ports.iter().find(|p| p.port == port).cloned().ok_or_else(|| {
                RdmaError::Invalid {
                    site: Site::port(device, port),
                    what: "port",
                    reason: format!("{device} has ports 1..={}", summary.ports.len()),
                }
            })?;
        let pd = RawPd::alloc(&ctx).map_err(|source| RdmaError::Verbs {
            site: Site::port(device, port),
            call: "ibv_alloc_pd",
            source,
        })?;
        Ok(Nic { inner: Arc::new(NicInner { ctx, pd, device: summary, port: port_summary }) })
    }

    /// `default_device(wanted)`, opened.
    pub fn open_default(wanted: Option<&str>) -> Result<Nic, RdmaError> {
        let (dev, port) = default_device(wanted)?;
        Nic::open(&dev.name, port)
    }

    pub fn device(&self) -> &DeviceSummary {
        &self.inner.device
    }

    pub fn port(&self) -> &PortSummary {
        &self.inner.port
    }

    pub fn site(&self) -> Site {
        Site::port(self.inner.ctx.name(), self.inner.port.port)
    }

    /// Register `len_bytes` of zeroed, page-aligned host memory.
    pub fn register_host(&self, len_bytes: usize) -> Result<Arc<HostRegion>, RdmaError> {
        self.register_region(Arc::new(Region::alloc(len_bytes)?))
    }

    /// Register `region` where it is: an owned one, or external memory such as the
    /// `cuMemHostAlloc` staging the GPU writes through a mapping (`ibv_reg_mr` at the region's
    /// own address, so the GPU, the CPU and the NIC share the bytes).
    pub fn register_region(&self, region: Arc<Region>) -> Result<Arc<HostRegion>, RdmaError> {
        let site = self.site();
        // SAFETY: the `HostRegion` holds an `Arc` of `region` and drops the MR first, so the
        // memory stays valid (a `Region`'s own invariant) for the registration's lifetime.
        let mr = unsafe {
            RawMr::register(
                &self.inner.pd,
                region.addr(),
                region.len().max(1) as usize,
                sys::full_access(),
            )
        }
        .map_err(|source| RdmaError::Verbs {
            site: site.clone(),
            call: "ibv_reg_mr",
            source,
        })?;
        let len_bytes = region.len();
        Ok(Arc::new(HostRegion { mr, mem: region, len_bytes, site }))
    }

    /// How GPU memory could be registered here, or why it cannot. dma-buf support is probed by
    /// asking the driver to import an invalid fd: a driver without dma-buf support answers
    /// EOPNOTSUPP before looking at the fd. Peer memory is there when nvidia-peermem is loaded.
    pub fn gpu_memory_path(&self) -> Result<GpuMemoryPath, RdmaError> {
        let dmabuf = sys_probe_dmabuf(&self.inner.pd);
        if dmabuf.is_ok() {
            return Ok(GpuMemoryPath::DmaBuf);
        }
        if Path::new("/sys/module/nvidia_peermem").exists()
            || Path::new("/sys/kernel/mm/memory_peers/nv_mem/version").exists()
        {
            return Ok(GpuMemoryPath::PeerMemory);
        }
        Err(RdmaError::Unsupported {
            site: self.site(),
            what: "GPU memory registration",
            reason: format!(
                "dma-buf registration unavailable ({}) and no peer-memory client (nvidia-peermem not loaded)",
                dmabuf.unwrap_err()
            ),
        })
    }

    /// Register `len_bytes` at `offset` of a dma-buf (GPU memory exported by the CUDA driver);
    /// the NIC addresses it as `iova`.
    pub fn register_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len_bytes: usize,
        iova: u64,
    ) -> Result<Arc<ForeignRegion>, RdmaError> {
        let site = self.site();
        let mr =
            RawMr::register_dmabuf(&self.inner.pd, fd, offset, len_bytes, iova, sys::full_access())
                .map_err(|source| match source.raw_os_error() {
                    Some(code) if is_unsupported_errno(code) => RdmaError::Unsupported {
                        site: site.clone(),
                        what: "dma-buf memory registration",
                        reason: source.to_string(),
                    },
                    _ => RdmaError::Verbs { site: site.clone(), call: "ibv_reg_dmabuf_mr", source },
                })?;
        Ok(Arc::new(ForeignRegion { mr, addr: iova, len_bytes: len_bytes as u64, site }))
    }

    /// Register device memory through a peer-memory client (nvidia-peermem).
    ///
    /// # Safety
    /// `addr..addr+len_bytes` must be a device allocation that stays allocated until the
    /// returned region is dropped.
    pub unsafe fn register_device_memory(
        &self,
        addr: u64,
        len_bytes: usize,
    ) -> Result<Arc<ForeignRegion>, RdmaError> {
        let site = self.site();
        // SAFETY: forwarded to the caller.
        let mr = unsafe {
            RawMr::register(&self.inner.pd, addr as usize as *mut u8, len_bytes, sys::full_access())
        }
        .map_err(|source| RdmaError::Verbs {
            site: site.clone(),
            call: "ibv_reg_mr (device memory)",
            source,
        })?;
        Ok(Arc::new(ForeignRegion { mr, addr, len_bytes: len_bytes as u64, site }))
    }

    /// Create an RC QP with `settings`; connect it with [`PreparedQp::connect`] once the
    /// peer's [`QpEndpoint`] has arrived out of band.
    pub fn create_qp(&self, settings: &QpSettings) -> Result<PreparedQp, RdmaError> {
        let site = self.site();
        let invalid =
            |what, reason: String| RdmaError::Invalid { site: site.clone(), what, reason };
        settings.check().map_err(|r| invalid("QP settings", r))?;
        let dev = &self.inner.device;
        if settings.depth > dev.max_qp_wr {
            return Err(invalid(
                "QP depth",
                format!(
                    "NVSHMEM_QP_DEPTH {} exceeds the device's max_qp_wr {}",
                    settings.depth, dev.max_qp_wr
                ),
            ));
        }
        let port = &self.inner.port;
        // Validation cannot know the port's link layer: on RoCE the SL is an Ethernet priority,
        // and only this port can say the scenario's 0..=15 range does not fit.
        if port.link_layer.is_roce() && settings.sl > 7 {
            return Err(invalid(
                "service level",
                format!("NVSHMEM_IB_SL {} on RoCE is an Ethernet priority: 0..=7", settings.sl),
            ));
        }
        if settings.path_mtu_bytes > port.active_mtu_bytes {
            return Err(invalid(
                "path MTU",
                format!(
                    "{} bytes exceeds the port's active MTU {} (on RoCE raise the netdev MTU)",
                    settings.path_mtu_bytes, port.active_mtu_bytes
                ),
            ));
        }
        let sgid = self.source_gid(settings)?;
        let cqe = |n: u32| n.min(dev.max_cqe).max(1) as i32;
        let verbs = |call, source| RdmaError::Verbs { site: site.clone(), call, source };
        let send_cq = RawCq::create(&self.inner.ctx, cqe(settings.depth))
            .map_err(|e| verbs("ibv_create_cq", e))?;
        let recv_cq = RawCq::create(&self.inner.ctx, cqe(settings.recv_depth))
            .map_err(|e| verbs("ibv_create_cq", e))?;
        let raw = RawQp::create_rc(
            &self.inner.pd,
            &send_cq,
            &recv_cq,
            settings.depth,
            settings.recv_depth,
        )
        .map_err(|e| verbs("ibv_create_qp", e))?;
        let qp_num = raw.qp_num();
        // Any 24-bit value works; one derived from the QP number makes a PSN mix-up between
        // QPs visible as a connection failure instead of passing by luck with both at 0.
        let psn = qp_num.wrapping_mul(0x9E37_79B1) & 0xff_ffff;
        Ok(PreparedQp {
            raw,
            send_cq,
            recv_cq,
            nic: self.clone(),
            site: Site::qp(self.inner.ctx.name(), port.port, qp_num),
            settings: settings.clone(),
            psn,
            sgid,
        })
    }

    /// `settings.qps_per_peer` QPs for one peer (`num_qps_per_rank`).
    pub fn create_peer_qps(&self, settings: &QpSettings) -> Result<Vec<PreparedQp>, RdmaError> {
        (0..settings.qps_per_peer).map(|_| self.create_qp(settings)).collect()
    }

    /// The GID QPs send from: `NVSHMEM_IB_GID_INDEX` if set, else on RoCE the first RoCE v2
    /// IPv4-mapped entry, then any RoCE v2 entry, then the first entry (what NVSHMEM's
    /// auto-selection prefers).
    fn source_gid(&self, settings: &QpSettings) -> Result<Option<GidSummary>, RdmaError> {
        let gids = &self.inner.port.gids;
        if let Some(index) = settings.gid_index {
            return gids.iter().find(|g| g.index == index).cloned().map(Some).ok_or_else(|| {
                RdmaError::Invalid {
                    site: self.site(),
                    what: "GID index",
                    reason: format!(
                        "NVSHMEM_IB_GID_INDEX {index} is not a valid GID of this port (valid: {})",
                        gids.iter().map(|g| g.index.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                }
            });
        }
        let pick = gids
            .iter()
            .find(|g| g.kind == GidKind::RoceV2 && g.is_ipv4_mapped())
            .or_else(|| gids.iter().find(|g| g.kind == GidKind::RoceV2))
            .or_else(|| gids.first())
            .cloned();
        if pick.is_none() && self.inner.port.link_layer.is_roce() {
            return Err(RdmaError::Invalid {
                site: self.site(),
                what: "GID",
                reason: "RoCE port without a GID: give its netdev an IP address".into(),
            });
        }
        Ok(pick)
    }
}

fn is_unsupported_errno(code: i32) -> bool {
    const EOPNOTSUPP: i32 = 95;
    const ENOSYS: i32 = 38;
    const EPROTONOSUPPORT: i32 = 93;
    matches!(code, EOPNOTSUPP | ENOSYS | EPROTONOSUPPORT)
}

fn sys_probe_dmabuf(pd: &Arc<RawPd>) -> Result<(), String> {
    match sys::probe_dmabuf(pd) {
        Some(code) if is_unsupported_errno(code) => {
            Err(format!("ibv_reg_dmabuf_mr: {}", std::io::Error::from_raw_os_error(code)))
        }
        _ => Ok(()),
    }
}

/// Memory a work request can read from (its local side): registered host or GPU memory.
pub trait LocalMemory: Send + Sync {
    fn lkey(&self) -> u32;
    /// The address the NIC uses for offset 0.
    fn base_addr(&self) -> u64;
    fn len_bytes(&self) -> u64;
    /// Whether the NIC reads host staging or GPU memory through this registration.
    fn data_path(&self) -> DataPath;
}

/// Registered host memory. The NIC reads and writes it concurrently with the CPU, so it is
/// accessed by copies and atomics ([`Region`]'s), never through references.
pub struct HostRegion {
    // Field order is drop order: deregister before the memory can go.
    mr: RawMr,
    mem: Arc<Region>,
    len_bytes: u64,
    site: Site,
}

impl HostRegion {
    /// What a peer needs to write into this region.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion { addr: self.base_addr(), len_bytes: self.len_bytes, rkey: self.mr.rkey() }
    }

    /// The memory itself (what the CPU side of the protocol reads and writes).
    pub fn region(&self) -> &Arc<Region> {
        &self.mem
    }

    pub fn len(&self) -> u64 {
        self.len_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    fn check(&self, offset: u64, len: usize) -> u64 {
        assert!(
            self.mem.contains(offset, len as u64),
            "{}: host range {offset}+{len} outside the {}-byte region",
            self.site,
            self.len_bytes
        );
        offset
    }

    /// Copy `data` in at `offset`. Panics when out of bounds (a caller bug).
    pub fn write(&self, offset: u64, data: &[u8]) {
        self.mem.write(self.check(offset, data.len()), data);
    }

    /// Copy `out.len()` bytes out from `offset`.
    pub fn read(&self, offset: u64, out: &mut [u8]) {
        self.mem.read(self.check(offset, out.len()), out);
    }

    pub fn to_vec(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.read(offset, &mut v);
        v
    }

    /// Read a counter the NIC updates (flag atomics), with Acquire ordering: data written
    /// before the counter on the same QP is visible once the new value is.
    pub fn load_u64(&self, offset: u64) -> u64 {
        self.mem.load_u64(self.check(offset, 8))
    }

    pub fn store_u64(&self, offset: u64, value: u64) {
        self.mem.store_u64(self.check(offset, 8), value)
    }
}

impl LocalMemory for HostRegion {
    fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    fn base_addr(&self) -> u64 {
        self.mem.addr() as u64
    }
    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
    fn data_path(&self) -> DataPath {
        DataPath::Staged
    }
}

/// Registered memory the CPU cannot access (GPU memory through dma-buf or peer memory).
pub struct ForeignRegion {
    mr: RawMr,
    addr: u64,
    len_bytes: u64,
    #[allow(dead_code)]
    site: Site,
}

impl ForeignRegion {
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion { addr: self.addr, len_bytes: self.len_bytes, rkey: self.mr.rkey() }
    }
}

impl LocalMemory for ForeignRegion {
    fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    fn base_addr(&self) -> u64 {
        self.addr
    }
    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
    fn data_path(&self) -> DataPath {
        DataPath::Gpudirect
    }
}

/// A created, not yet connected RC QP.
pub struct PreparedQp {
    raw: RawQp,
    send_cq: Arc<RawCq>,
    recv_cq: Arc<RawCq>,
    nic: Nic,
    site: Site,
    settings: QpSettings,
    psn: u32,
    sgid: Option<GidSummary>,
}

impl PreparedQp {
    pub fn qp_num(&self) -> u32 {
        self.raw.qp_num()
    }

    /// What the peer needs (send it out of band).
    pub fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            qp_num: self.raw.qp_num(),
            lid: self.nic.inner.port.lid,
            gid: self.sgid.as_ref().map_or([0; 16], |g| g.gid),
            psn: self.psn,
        }
    }

    /// RESET → INIT → RTR → RTS towards `remote`, with the SL, traffic class, MTU, timeouts
    /// and atomic depth of the settings.
    pub fn connect(self, remote: &QpEndpoint) -> Result<Qp, RdmaError> {
        let port = &self.nic.inner.port;
        let dev = &self.nic.inner.device;
        let s = &self.settings;
        let modify = |attr: &mut QpAttr, mask: QpMask, call: &'static str| {
            self.raw.modify(attr, mask).map_err(|source| RdmaError::Verbs {
                site: self.site.clone(),
                call,
                source,
            })
        };

        let mut a = QpAttr {
            qp_state: sys::state::INIT,
            pkey_index: 0,
            port_num: port.port,
            qp_access_flags: sys::full_access() as u32,
            ..QpAttr::default()
        };
        modify(
            &mut a,
            QpMask::IBV_QP_STATE
                | QpMask::IBV_QP_PKEY_INDEX
                | QpMask::IBV_QP_PORT
                | QpMask::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(INIT)",
        )?;

        let mut a = QpAttr {
            qp_state: sys::state::RTR,
            path_mtu: mtu_code(s.path_mtu_bytes).expect("checked in create_qp"),
            dest_qp_num: remote.qp_num,
            rq_psn: remote.psn,
            max_dest_rd_atomic: (s.max_rd_atomic as u32).min(dev.max_qp_rd_atom).max(1) as u8,
            // 12 = 0.64 ms (ibv_modify_qp(3)): an RNR NAK retry interval short enough for tests.
            min_rnr_timer: 12,
            ..QpAttr::default()
        };
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.sl = s.sl;
        a.ah_attr.port_num = port.port;
        if port.link_layer.is_roce() {
            // RoCE routes by GID: every packet carries a GRH, whose traffic class is the
            // DSCP/ECN byte of the IP header.
            let sgid = self.sgid.as_ref().expect("checked in create_qp");
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = remote.gid;
            a.ah_attr.grh.sgid_index = sgid.index as u8;
            a.ah_attr.grh.hop_limit = 64;
            a.ah_attr.grh.traffic_class = s.traffic_class_for(port.link_layer);
        } else if let Some(tc) = s.traffic_class {
            // InfiniBand inside a subnet routes by LID; a GRH is added only when a traffic class
            // is asked for (NVSHMEM_IB_TRAFFIC_CLASS), as NVSHMEM does.
            let sgid = self.sgid.as_ref().map_or(0, |g| g.index);
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = remote.gid;
            a.ah_attr.grh.sgid_index = sgid as u8;
            a.ah_attr.grh.hop_limit = 64;
            a.ah_attr.grh.traffic_class = tc;
        }
        modify(
            &mut a,
            QpMask::IBV_QP_STATE
                | QpMask::IBV_QP_AV
                | QpMask::IBV_QP_PATH_MTU
                | QpMask::IBV_QP_DEST_QPN
                | QpMask::IBV_QP_RQ_PSN
                | QpMask::IBV_QP_MAX_DEST_RD_ATOMIC
                | QpMask::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp(RTR)",
        )?;

        let mut a = QpAttr {
            qp_state: sys::state::RTS,
            sq_psn: self.psn,
            timeout: s.ack_timeout,
            retry_cnt: s.retry_count,
            rnr_retry: s.rnr_retry,
            max_rd_atomic: (s.max_rd_atomic as u32).min(dev.max_qp_init_rd_atom).max(1) as u8,
            ..QpAttr::default()
        };
        modify(
            &mut a,
            QpMask::IBV_QP_STATE
                | QpMask::IBV_QP_SQ_PSN
                | QpMask::IBV_QP_TIMEOUT
                | QpMask::IBV_QP_RETRY_CNT
                | QpMask::IBV_QP_RNR_RETRY
                | QpMask::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp(RTS)",
        )?;

        Ok(Qp {
            raw: self.raw,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            site: self.site,
            depth: self.settings.depth,
            recv_depth: self.settings.recv_depth,
            outstanding: VecDeque::new(),
            recv_posted: VecDeque::new(),
            unsignaled_run: 0,
            atomics: dev.atomics,
            nic: self.nic,
        })
    }
}

/// Connect two equally long lists of prepared QPs pairwise on one device (loopback: the
/// "peer" is another set of QPs of the same NIC). Returns (a-side, b-side).
pub fn connect_pairs(
    a: Vec<PreparedQp>,
    b: Vec<PreparedQp>,
) -> Result<(Vec<Qp>, Vec<Qp>), RdmaError> {
    assert_eq!(a.len(), b.len(), "connect_pairs needs equally many QPs on both sides");
    let ea: Vec<QpEndpoint> = a.iter().map(PreparedQp::endpoint).collect();
    let eb: Vec<QpEndpoint> = b.iter().map(PreparedQp::endpoint).collect();
    let qa = a.into_iter().zip(&eb).map(|(q, e)| q.connect(e)).collect::<Result<Vec<_>, _>>()?;
    let qb = b.into_iter().zip(&ea).map(|(q, e)| q.connect(e)).collect::<Result<Vec<_>, _>>()?;
    Ok((qa, qb))
}

/// A work request in flight: what it was (for error messages) and the memory it uses.
struct Posted {
    wr_id: u64,
    opcode: Opcode,
    signaled: bool,
    /// Remote address and rkey (a completion marker may reuse them).
    remote: (u64, u32),
    _local: Option<Arc<dyn LocalMemory>>,
}

/// The work-request id of the zero-length signalled write `wait_idle` posts when every request
/// in flight is unsignalled (an unsignalled request never produces a completion of its own).
pub const MARKER_WR_ID: u64 = u64::MAX;

/// A receive completion (the immediate of a WRITE_WITH_IMM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvCompletion {
    pub wr_id: u64,
    pub imm: Option<u32>,
    pub byte_len: u32,
}

/// QP attributes as `ibv_query_qp` reads them back from the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpAttributes {
    pub qp_num: u32,
    pub state: QpState,
    pub path_mtu_bytes: u32,
    pub sl: u8,
    pub traffic_class: u8,
    pub is_global: bool,
    pub dest_qp_num: u32,
    /// The send-queue capacity the device granted (≥ the depth asked for; providers round up).
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub sq_psn: u32,
    pub rq_psn: u32,
    pub ack_timeout: u8,
    pub retry_count: u8,
    pub rnr_retry: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub port: u8,
}

/// A connected RC queue pair. Not `Sync`: one thread posts and polls it (the proxy that owns
/// it); move it between threads as a whole.
pub struct Qp {
    // Field order is drop order: destroy the QP before its CQs and before releasing the
    // memory that in-flight requests reference.
    raw: RawQp,
    send_cq: Arc<RawCq>,
    recv_cq: Arc<RawCq>,
    outstanding: VecDeque<Posted>,
    recv_posted: VecDeque<u64>,
    site: Site,
    depth: u32,
    recv_depth: u32,
    unsignaled_run: u32,
    atomics: bool,
    nic: Nic,
}

/// Above this many unsignalled requests in a row one is signalled, so completions keep freeing
/// slots (and the CQ never holds more than a depth's worth).
const MAX_UNSIGNALED_RUN: u32 = 64;

impl Qp {
    pub fn qp_num(&self) -> u32 {
        self.raw.qp_num()
    }

    pub fn site(&self) -> &Site {
        &self.site
    }

    pub fn nic(&self) -> &Nic {
        &self.nic
    }

    /// The depth asked for (`NVSHMEM_QP_DEPTH`): the most send requests in flight.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Send requests posted whose completion has not been polled yet.
    pub fn outstanding(&self) -> u32 {
        self.outstanding.len() as u32
    }

    /// RDMA WRITE `len` bytes from `src[src_offset..]` to `dst[dst_offset..]`.
    #[allow(clippy::too_many_arguments)]
    pub fn post_write<M: LocalMemory + 'static>(
        &mut self,
        wr_id: u64,
        src: &Arc<M>,
        src_offset: u64,
        len_bytes: u32,
        dst: &RemoteRegion,
        dst_offset: u64,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        let local: Arc<dyn LocalMemory> = src.clone();
        self.post(
            wr_id,
            Opcode::RdmaWrite,
            Some((local, src_offset, len_bytes)),
            dst,
            dst_offset,
            0,
            0,
            signaled,
        )
    }

    /// RDMA WRITE with immediate: the peer gets `imm` in a receive completion once the data
    /// is in place (it must have a receive posted).
    #[allow(clippy::too_many_arguments)]
    pub fn post_write_imm<M: LocalMemory + 'static>(
        &mut self,
        wr_id: u64,
        src: &Arc<M>,
        src_offset: u64,
        len_bytes: u32,
        dst: &RemoteRegion,
        dst_offset: u64,
        imm: u32,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        let local: Arc<dyn LocalMemory> = src.clone();
        self.post(
            wr_id,
            Opcode::RdmaWriteWithImm,
            Some((local, src_offset, len_bytes)),
            dst,
            dst_offset,
            imm,
            0,
            signaled,
        )
    }

    /// Atomic fetch-and-add of `add` on the 8-byte word at `dst[dst_offset]`; the old value
    /// lands in `result[result_offset..+8]`. Executed after every earlier request of this QP.
    #[allow(clippy::too_many_arguments)]
    pub fn post_fetch_add<M: LocalMemory + 'static>(
        &mut self,
        wr_id: u64,
        result: &Arc<M>,
        result_offset: u64,
        dst: &RemoteRegion,
        dst_offset: u64,
        add: u64,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        if !self.atomics {
            return Err(RdmaError::Unsupported {
                site: self.site.clone(),
                what: "atomic fetch-and-add",
                reason: "the device reports atomic_cap = ATOMIC_NONE".into(),
            });
        }
        if !(dst.addr + dst_offset).is_multiple_of(8) {
            return Err(RdmaError::Invalid {
                site: self.site.clone(),
                what: "atomic target",
                reason: format!(
                    "WR {wr_id}: remote address {:#x} is not 8-byte aligned",
                    dst.addr + dst_offset
                ),
            });
        }
        let local: Arc<dyn LocalMemory> = result.clone();
        self.post(
            wr_id,
            Opcode::FetchAndAdd,
            Some((local, result_offset, 8)),
            dst,
            dst_offset,
            0,
            add,
            signaled,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn post(
        &mut self,
        wr_id: u64,
        opcode: Opcode,
        local: Option<(Arc<dyn LocalMemory>, u64, u32)>,
        dst: &RemoteRegion,
        dst_offset: u64,
        imm: u32,
        add: u64,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        let outstanding = self.outstanding.len() as u32;
        if outstanding >= self.depth {
            return Err(RdmaError::QueueFull {
                site: self.site.clone(),
                wr_id,
                opcode,
                depth: self.depth,
                outstanding,
            });
        }
        let len = local.as_ref().map_or(0, |l| l.2 as u64);
        let remote_addr =
            dst.check(dst_offset, len).map_err(|(offset, len_bytes, region_bytes)| {
                RdmaError::OutOfBounds {
                    site: self.site.clone(),
                    wr_id,
                    opcode,
                    side: "remote",
                    offset,
                    len_bytes,
                    region_bytes,
                }
            })?;
        let sge = match &local {
            Some((mem, offset, len)) => {
                let end = offset.checked_add(*len as u64);
                if end.is_none_or(|end| end > mem.len_bytes()) {
                    return Err(RdmaError::OutOfBounds {
                        site: self.site.clone(),
                        wr_id,
                        opcode,
                        side: "local",
                        offset: *offset,
                        len_bytes: *len as u64,
                        region_bytes: mem.len_bytes(),
                    });
                }
                (*len > 0).then(|| (mem.base_addr() + offset, *len, mem.lkey()))
            }
            None => None,
        };
        // The request that fills the queue, and one in every MAX_UNSIGNALED_RUN, is signalled
        // so that the queue can always drain.
        let signaled = signaled
            || outstanding + 1 == self.depth
            || self.unsignaled_run + 1 >= MAX_UNSIGNALED_RUN;
        let req = SendRequest {
            wr_id,
            opcode: match opcode {
                Opcode::RdmaWrite => sys::opcode::WRITE,
                Opcode::RdmaWriteWithImm => sys::opcode::WRITE_WITH_IMM,
                Opcode::FetchAndAdd => sys::opcode::FETCH_AND_ADD,
                Opcode::Recv => unreachable!("receives are posted with post_recv"),
            },
            signaled,
            local: sge,
            remote_addr,
            rkey: dst.rkey,
            imm,
            add,
        };
        // SAFETY: the local range was bounds-checked against a registration whose lkey it
        // carries, and `Posted` keeps that registration alive until the completion is polled
        // or the QP is destroyed (the QP is dropped before `outstanding`).
        unsafe { self.raw.post_send(&req) }.map_err(|source| RdmaError::Post {
            site: self.site.clone(),
            wr_id,
            opcode,
            source,
        })?;
        self.unsignaled_run = if signaled { 0 } else { self.unsignaled_run + 1 };
        self.outstanding.push_back(Posted {
            wr_id,
            opcode,
            signaled,
            remote: (remote_addr, dst.rkey),
            _local: local.map(|l| l.0),
        });
        Ok(())
    }

    /// Post a receive for an incoming WRITE_WITH_IMM.
    pub fn post_recv(&mut self, wr_id: u64) -> Result<(), RdmaError> {
        if self.recv_posted.len() as u32 >= self.recv_depth {
            return Err(RdmaError::QueueFull {
                site: self.site.clone(),
                wr_id,
                opcode: Opcode::Recv,
                depth: self.recv_depth,
                outstanding: self.recv_posted.len() as u32,
            });
        }
        self.raw.post_recv_empty(wr_id).map_err(|source| RdmaError::Post {
            site: self.site.clone(),
            wr_id,
            opcode: Opcode::Recv,
            source,
        })?;
        self.recv_posted.push_back(wr_id);
        Ok(())
    }

    /// Reap send completions; returns how many requests retired. An error completion is
    /// returned as `RdmaError::Completion` naming the QP, the WR id and its opcode (after the
    /// whole batch has been retired, so the error is never reported twice).
    pub fn poll(&mut self) -> Result<u32, RdmaError> {
        let mut wcs = [sys::WorkCompletion::default(); 32];
        let n = self.send_cq.poll(&mut wcs).map_err(|source| RdmaError::Verbs {
            site: self.site.clone(),
            call: "ibv_poll_cq",
            source,
        })?;
        let mut retired = 0;
        let mut first_error = None;
        for wc in &wcs[..n] {
            let c = sys::decode(wc);
            // A completion retires its request and every unsignalled one posted before it.
            let mut opcode = None;
            while let Some(p) = self.outstanding.pop_front() {
                retired += 1;
                if p.wr_id == c.wr_id {
                    opcode = Some(p.opcode);
                    break;
                }
            }
            if let Some((status, vendor_err)) = c.error
                && first_error.is_none()
            {
                first_error = Some(RdmaError::Completion {
                    site: Site::qp(&self.site.device, self.site.port, c.qp_num),
                    wr_id: c.wr_id,
                    opcode: opcode.unwrap_or(Opcode::RdmaWrite),
                    status,
                    status_name: sys::wc_status_name(status),
                    vendor_err,
                });
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(retired),
        }
    }

    /// Reap receive completions into `out`.
    pub fn poll_recv(&mut self, out: &mut Vec<RecvCompletion>) -> Result<usize, RdmaError> {
        let mut wcs = [sys::WorkCompletion::default(); 32];
        let n = self.recv_cq.poll(&mut wcs).map_err(|source| RdmaError::Verbs {
            site: self.site.clone(),
            call: "ibv_poll_cq",
            source,
        })?;
        for wc in &wcs[..n] {
            let c = sys::decode(wc);
            if let Some(pos) = self.recv_posted.iter().position(|&id| id == c.wr_id) {
                self.recv_posted.remove(pos);
            }
            if let Some((status, vendor_err)) = c.error {
                return Err(RdmaError::Completion {
                    site: Site::qp(&self.site.device, self.site.port, c.qp_num),
                    wr_id: c.wr_id,
                    opcode: Opcode::Recv,
                    status,
                    status_name: sys::wc_status_name(status),
                    vendor_err,
                });
            }
            out.push(RecvCompletion { wr_id: c.wr_id, imm: c.imm, byte_len: c.byte_len });
        }
        Ok(n)
    }

    /// Poll until every posted send request has completed, or `timeout` passes. When the
    /// newest request is unsignalled, a zero-length signalled RDMA WRITE to the same remote
    /// address (wr_id [`MARKER_WR_ID`]) is posted first: its completion retires everything
    /// before it.
    pub fn wait_idle(&mut self, timeout: Duration) -> Result<(), RdmaError> {
        #[allow(clippy::disallowed_methods)] // real time: a hardware wait bound
        let start = std::time::Instant::now();
        if let Some(last) = self.outstanding.back()
            && !last.signaled
        {
            let (remote_addr, rkey) = last.remote;
            self.raw.post_marker(MARKER_WR_ID, remote_addr, rkey).map_err(|source| {
                RdmaError::Post {
                    site: self.site.clone(),
                    wr_id: MARKER_WR_ID,
                    opcode: Opcode::RdmaWrite,
                    source,
                }
            })?;
            self.unsignaled_run = 0;
            self.outstanding.push_back(Posted {
                wr_id: MARKER_WR_ID,
                opcode: Opcode::RdmaWrite,
                signaled: true,
                remote: (remote_addr, rkey),
                _local: None,
            });
        }
        let mut round = 0;
        while !self.outstanding.is_empty() {
            if self.poll()? == 0 {
                if start.elapsed() > timeout {
                    return Err(RdmaError::Timeout {
                        site: self.site.clone(),
                        what: format!(
                            "{} outstanding work requests (oldest WR {})",
                            self.outstanding.len(),
                            self.outstanding.front().map_or(0, |p| p.wr_id)
                        ),
                        waited_ms: start.elapsed().as_millis() as u64,
                    });
                }
                crate::wire::doorbell::backoff(&mut round);
            }
        }
        Ok(())
    }

    /// Read the QP's attributes back from the device.
    pub fn query(&self) -> Result<QpAttributes, RdmaError> {
        let mask = QpMask::IBV_QP_STATE
            | QpMask::IBV_QP_PATH_MTU
            | QpMask::IBV_QP_AV
            | QpMask::IBV_QP_CAP
            | QpMask::IBV_QP_DEST_QPN
            | QpMask::IBV_QP_SQ_PSN
            | QpMask::IBV_QP_RQ_PSN
            | QpMask::IBV_QP_TIMEOUT
            | QpMask::IBV_QP_RETRY_CNT
            | QpMask::IBV_QP_RNR_RETRY
            | QpMask::IBV_QP_MAX_QP_RD_ATOMIC
            | QpMask::IBV_QP_MAX_DEST_RD_ATOMIC
            | QpMask::IBV_QP_PORT;
        let (a, init) = self.raw.query(mask).map_err(|source| RdmaError::Verbs {
            site: self.site.clone(),
            call: "ibv_query_qp",
            source,
        })?;
        Ok(QpAttributes {
            qp_num: self.qp_num(),
            state: QpState::from_verbs(a.qp_state),
            path_mtu_bytes: mtu_bytes(a.path_mtu).unwrap_or(0),
            sl: a.ah_attr.sl,
            traffic_class: a.ah_attr.grh.traffic_class,
            is_global: a.ah_attr.is_global != 0,
            dest_qp_num: a.dest_qp_num,
            max_send_wr: a.cap.max_send_wr.max(init.cap.max_send_wr),
            max_recv_wr: a.cap.max_recv_wr.max(init.cap.max_recv_wr),
            sq_psn: a.sq_psn,
            rq_psn: a.rq_psn,
            ack_timeout: a.timeout,
            retry_count: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            port: a.port_num,
        })
    }

    /// Move the QP to the error state (teardown, or to test error handling): every request in
    /// flight completes with a flush error.
    pub fn set_error_state(&mut self) -> Result<(), RdmaError> {
        let mut a = QpAttr { qp_state: sys::state::ERR, ..QpAttr::default() };
        self.raw.modify(&mut a, QpMask::IBV_QP_STATE).map_err(|source| RdmaError::Verbs {
            site: self.site.clone(),
            call: "ibv_modify_qp(ERR)",
            source,
        })
    }
}

/// Whether an error is the flush that follows an earlier failure (not the root cause).
pub fn is_flush(e: &RdmaError) -> bool {
    matches!(e, RdmaError::Completion { status, .. } if *status == sys::WC_FLUSH_ERR)
}
