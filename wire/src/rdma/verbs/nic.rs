//! A NIC port with its protection domain: QP creation with a job's `QpSettings`, and the
//! memory registered with it (host regions, GPU memory through dma-buf or peer memory).

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::Arc;

use super::super::endpoint::RemoteRegion;
use super::super::sys::{self, RawContext, RawMr, RawPd};
use super::super::types::{DeviceSummary, PortSummary};
use super::discovery::{default_device, open_context, summarize};
use crate::error::{Site, WireError};
use crate::link::DataPath;
use crate::region::Region;

/// One port of one device, with the protection domain everything on it is created in.
#[derive(Clone)]
pub struct Nic {
    pub(super) inner: Arc<NicInner>,
}

pub(super) struct NicInner {
    pub(super) ctx: Arc<RawContext>,
    pub(super) pd: Arc<RawPd>,
    pub(super) device: DeviceSummary,
    pub(super) port: PortSummary,
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
    pub fn open(device: &str, port: u8) -> Result<Nic, WireError> {
        let ctx = open_context(device)?;
        let summary = summarize(&ctx)?;
        let port_summary =
            summary.ports.iter().find(|p| p.port == port).cloned().ok_or_else(|| {
                WireError::Invalid {
                    site: Site::port(device, port),
                    what: "port",
                    reason: format!("{device} has ports 1..={}", summary.ports.len()),
                }
            })?;
        let pd = RawPd::alloc(&ctx).map_err(|source| WireError::Verbs {
            site: Site::port(device, port),
            call: "ibv_alloc_pd",
            source,
        })?;
        Ok(Nic { inner: Arc::new(NicInner { ctx, pd, device: summary, port: port_summary }) })
    }

    /// `default_device(wanted)`, opened.
    pub fn open_default(wanted: Option<&str>) -> Result<Nic, WireError> {
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
    pub fn register_host(&self, len_bytes: usize) -> Result<Arc<HostRegion>, WireError> {
        self.register_region(Arc::new(Region::alloc(len_bytes)?))
    }

    /// Register `region` where it is: an owned one, or external memory such as the
    /// `cuMemHostAlloc` staging the GPU writes through a mapping (`ibv_reg_mr` at the region's
    /// own address, so the GPU, the CPU and the NIC share the bytes).
    pub fn register_region(&self, region: Arc<Region>) -> Result<Arc<HostRegion>, WireError> {
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
        .map_err(|source| WireError::Verbs {
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
    pub fn gpu_memory_path(&self) -> Result<GpuMemoryPath, WireError> {
        let dmabuf = sys_probe_dmabuf(&self.inner.pd);
        if dmabuf.is_ok() {
            return Ok(GpuMemoryPath::DmaBuf);
        }
        if Path::new("/sys/module/nvidia_peermem").exists()
            || Path::new("/sys/kernel/mm/memory_peers/nv_mem/version").exists()
        {
            return Ok(GpuMemoryPath::PeerMemory);
        }
        Err(WireError::Unsupported {
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
    ) -> Result<Arc<ForeignRegion>, WireError> {
        let site = self.site();
        let mr =
            RawMr::register_dmabuf(&self.inner.pd, fd, offset, len_bytes, iova, sys::full_access())
                .map_err(|source| match source.raw_os_error() {
                    Some(code) if is_unsupported_errno(code) => WireError::Unsupported {
                        site: site.clone(),
                        what: "dma-buf memory registration",
                        reason: source.to_string(),
                    },
                    _ => WireError::Verbs { site: site.clone(), call: "ibv_reg_dmabuf_mr", source },
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
    ) -> Result<Arc<ForeignRegion>, WireError> {
        let site = self.site();
        // SAFETY: forwarded to the caller.
        let mr = unsafe {
            RawMr::register(&self.inner.pd, addr as usize as *mut u8, len_bytes, sys::full_access())
        }
        .map_err(|source| WireError::Verbs {
            site: site.clone(),
            call: "ibv_reg_mr (device memory)",
            source,
        })?;
        Ok(Arc::new(ForeignRegion { mr, addr, len_bytes: len_bytes as u64, site }))
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
