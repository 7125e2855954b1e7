//! The one unsafe layer of the RDMA path: owned wrappers over the `ibverbs-sys` FFI for what
//! the `ibverbs` crate does not expose (its safe types hide their raw handles, so SL/traffic
//! class in the address vector, atomics, `ibv_query_qp`, dma-buf registration and per-port
//! queries all need the handles themselves).
//!
//! Each wrapper owns one verbs object and holds an `Arc` of the objects it was created from,
//! so a context outlives its PDs, a PD its MRs and QPs, a CQ its QPs. With that, every function
//! here is memory-safe except the two that take raw addresses (`RawMr::register`,
//! `RawQp::post_send`), which stay `unsafe` with their contract written down; `verbs.rs` keeps
//! the contract.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use ibverbs_sys as ffi;

pub(crate) use ffi::ibv_wc as WorkCompletion;

/// Map a verbs return value that is an errno (0 = success).
fn errno_result(code: i32) -> io::Result<()> {
    if code == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(code.abs())) }
}

/// A pointer result: NULL means failure with `errno` set.
fn non_null<T>(p: *mut T) -> io::Result<NonNull<T>> {
    NonNull::new(p).ok_or_else(|| {
        let e = io::Error::last_os_error();
        // Some providers return NULL without setting errno.
        if e.raw_os_error() == Some(0) { io::Error::other("verbs call returned NULL") } else { e }
    })
}

fn device_name(dev: *mut ffi::ibv_device) -> String {
    // SAFETY: `dev` comes from a live device list; the name is a NUL-terminated array in it.
    let p = unsafe { ffi::ibv_get_device_name(dev) };
    if p.is_null() {
        return String::from("?");
    }
    // SAFETY: non-null, NUL-terminated (verbs.h: name[IBV_SYSFS_NAME_MAX]).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// An open device context (`ibv_open_device` … `ibv_close_device`).
pub(crate) struct RawContext {
    ctx: NonNull<ffi::ibv_context>,
    name: String,
    node_guid_be: u64,
}

// SAFETY: libibverbs contexts may be used from any thread (rdma-core: "all verbs are thread
// safe"); we never hand out `&mut` to the C struct.
unsafe impl Send for RawContext {}
unsafe impl Sync for RawContext {}

/// Why a device could not be opened.
pub(crate) enum OpenError {
    NotFound { present: Vec<String> },
    Io(io::Error),
}

impl RawContext {
    pub(crate) fn open(name: &str) -> Result<Arc<RawContext>, OpenError> {
        let mut n = 0i32;
        // SAFETY: `ibv_get_device_list` writes the count and returns an array freed below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        let list = non_null(list).map_err(OpenError::Io)?;
        let mut present = Vec::new();
        let mut opened = None;
        for i in 0..n.max(0) as usize {
            // SAFETY: `list` holds `n` valid device pointers until freed.
            let dev = unsafe { *list.as_ptr().add(i) };
            let dev_name = device_name(dev);
            if dev_name == name && opened.is_none() {
                // SAFETY: `dev` is valid; a context stays valid after the list is freed
                // (ibv_free_device_list(3)).
                let ctx = unsafe { ffi::ibv_open_device(dev) };
                // SAFETY: `dev` is valid.
                let guid = unsafe { ffi::ibv_get_device_guid(dev) };
                opened = Some(non_null(ctx).map(|ctx| (ctx, guid)));
            }
            present.push(dev_name);
        }
        // SAFETY: freed once; only `ctx` (independent of the list) is kept.
        unsafe { ffi::ibv_free_device_list(list.as_ptr()) };
        match opened {
            Some(Ok((ctx, node_guid_be))) => {
                Ok(Arc::new(RawContext { ctx, name: name.to_string(), node_guid_be }))
            }
            Some(Err(e)) => Err(OpenError::Io(e)),
            None => Err(OpenError::NotFound { present }),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn node_guid_be(&self) -> u64 {
        self.node_guid_be
    }

    pub(crate) fn query_device(&self) -> io::Result<ffi::ibv_device_attr> {
        let mut attr = ffi::ibv_device_attr::default();
        // SAFETY: live context, writable attribute struct of the size the header declares.
        errno_result(unsafe { ffi::ibv_query_device(self.ctx.as_ptr(), &mut attr) })?;
        Ok(attr)
    }

    pub(crate) fn query_port(&self, port: u8) -> io::Result<ffi::ibv_port_attr> {
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: the exported symbol fills the compatibility prefix of `ibv_port_attr` (up to
        // `link_layer`/`flags`), which is a prefix of the zeroed full struct we pass.
        let rc = unsafe {
            ffi::ibv_query_port(
                self.ctx.as_ptr(),
                port,
                (&mut attr as *mut ffi::ibv_port_attr).cast::<ffi::_compat_ibv_port_attr>(),
            )
        };
        errno_result(rc)?;
        Ok(attr)
    }

    /// The valid GID entries of every port (`_ibv_query_gid_table`, rdma-core ≥ 32).
    pub(crate) fn gid_table(&self, max_entries: usize) -> io::Result<Vec<GidEntry>> {
        if max_entries == 0 {
            return Ok(Vec::new());
        }
        let mut entries = vec![ffi::ibv_gid_entry::default(); max_entries];
        // SAFETY: `entries` has room for `max_entries` entries of the size we pass.
        let n = unsafe {
            ffi::_ibv_query_gid_table(
                self.ctx.as_ptr(),
                entries.as_mut_ptr(),
                entries.len(),
                0,
                std::mem::size_of::<ffi::ibv_gid_entry>(),
            )
        };
        if n < 0 {
            return Err(io::Error::from_raw_os_error((-n) as i32));
        }
        entries.truncate(n as usize);
        Ok(entries
            .iter()
            .map(|e| GidEntry {
                // SAFETY: `ibv_gid` is a union of `[u8; 16]` and two u64s: every bit pattern
                // is a valid byte array.
                gid: unsafe { e.gid.raw },
                index: e.gid_index,
                port: e.port_num,
                gid_type: e.gid_type,
                ndev_ifindex: e.ndev_ifindex,
            })
            .collect())
    }
}

impl Drop for RawContext {
    fn drop(&mut self) {
        // SAFETY: every object created from this context holds an `Arc` of it, so none is
        // alive now. A failure cannot be reported from drop; the kernel reclaims the fd.
        unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// One GID table entry (`struct ibv_gid_entry`).
pub(crate) struct GidEntry {
    pub gid: [u8; 16],
    pub index: u32,
    pub port: u32,
    /// `enum ibv_gid_type`.
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// A protection domain.
pub(crate) struct RawPd {
    pd: NonNull<ffi::ibv_pd>,
    _ctx: Arc<RawContext>,
}

// SAFETY: as for `RawContext`.
unsafe impl Send for RawPd {}
unsafe impl Sync for RawPd {}

impl RawPd {
    pub(crate) fn alloc(ctx: &Arc<RawContext>) -> io::Result<Arc<RawPd>> {
        // SAFETY: live context.
        let pd = non_null(unsafe { ffi::ibv_alloc_pd(ctx.ctx.as_ptr()) })?;
        Ok(Arc::new(RawPd { pd, _ctx: ctx.clone() }))
    }
}

impl Drop for RawPd {
    fn drop(&mut self) {
        // SAFETY: MRs and QPs hold an `Arc` of their PD, so none is alive now.
        unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// The access every region gets: local write (receives and atomic results), remote write and
/// read, remote atomics.
pub(crate) fn full_access() -> i32 {
    (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC)
        .0 as i32
}

/// A memory registration.
pub(crate) struct RawMr {
    mr: NonNull<ffi::ibv_mr>,
    _pd: Arc<RawPd>,
}

// SAFETY: an MR is a key pair plus a pinned mapping; verbs allow its use from any thread.
unsafe impl Send for RawMr {}
unsafe impl Sync for RawMr {}

impl RawMr {
    /// Register `len` bytes at `addr` (host memory, or device memory a peer-memory client such
    /// as nvidia-peermem can pin).
    ///
    /// # Safety
    /// `addr..addr+len` must stay mapped until this `RawMr` is dropped: the NIC reads and
    /// writes it without the CPU.
    pub(crate) unsafe fn register(
        pd: &Arc<RawPd>,
        addr: *mut u8,
        len: usize,
        access: i32,
    ) -> io::Result<RawMr> {
        // SAFETY: live PD; the caller guarantees the range.
        let mr = unsafe { ffi::ibv_reg_mr(pd.pd.as_ptr(), addr.cast(), len, access) };
        Ok(RawMr { mr: non_null(mr)?, _pd: pd.clone() })
    }

    /// Register `len` bytes at `offset` of a dma-buf (GPU memory exported by the CUDA driver),
    /// addressed by the NIC as `iova`. Safe: the kernel takes its own reference on the dma-buf.
    pub(crate) fn register_dmabuf(
        pd: &Arc<RawPd>,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: i32,
    ) -> io::Result<RawMr> {
        // SAFETY: live PD; `fd` is open for the duration of the call.
        let mr = unsafe {
            ffi::ibv_reg_dmabuf_mr(pd.pd.as_ptr(), offset, len, iova, fd.as_raw_fd(), access)
        };
        Ok(RawMr { mr: non_null(mr)?, _pd: pd.clone() })
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the MR is live; keys are immutable after registration.
        unsafe { self.mr.as_ref() }.lkey
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.mr.as_ref() }.rkey
    }
}

impl Drop for RawMr {
    fn drop(&mut self) {
        // SAFETY: live MR, deregistered once; the memory is freed only after this (the owner
        // drops its buffer after the `RawMr`).
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

/// Ask the driver to import dma-buf fd -1 and return the errno it fails with (`None` if it
/// somehow succeeds). Drivers without dma-buf support answer EOPNOTSUPP before touching the fd
/// (libibverbs' default op; the kernel's `UVERBS_METHOD_REG_DMABUF_MR` checks
/// `ops.reg_user_mr_dmabuf` first); drivers with it fail to resolve the fd (EBADF).
pub(crate) fn probe_dmabuf(pd: &Arc<RawPd>) -> Option<i32> {
    // SAFETY: live PD; an invalid fd is rejected by the driver or the kernel, never used.
    let mr = unsafe { ffi::ibv_reg_dmabuf_mr(pd.pd.as_ptr(), 0, 4096, 0, -1, full_access()) };
    match NonNull::new(mr) {
        Some(mr) => {
            drop(RawMr { mr, _pd: pd.clone() });
            None
        }
        None => Some(io::Error::last_os_error().raw_os_error().unwrap_or(0)),
    }
}

/// A completion queue.
pub(crate) struct RawCq {
    cq: NonNull<ffi::ibv_cq>,
    _ctx: Arc<RawContext>,
}

// SAFETY: providers lock their CQs; polling from one thread at a time is what we do anyway.
unsafe impl Send for RawCq {}
unsafe impl Sync for RawCq {}

impl RawCq {
    pub(crate) fn create(ctx: &Arc<RawContext>, entries: i32) -> io::Result<Arc<RawCq>> {
        // SAFETY: live context; no completion channel; vector 0 always exists.
        let cq = unsafe {
            ffi::ibv_create_cq(ctx.ctx.as_ptr(), entries, ptr::null_mut(), ptr::null_mut(), 0)
        };
        Ok(Arc::new(RawCq { cq: non_null(cq)?, _ctx: ctx.clone() }))
    }

    /// Pop up to `out.len()` completions; returns how many.
    pub(crate) fn poll(&self, out: &mut [WorkCompletion]) -> io::Result<usize> {
        // SAFETY: live CQ; `ibv_poll_cq` is a static inline calling the provider's `poll_cq`
        // op, which every provider implements; `out` has room for `out.len()` entries.
        let n = unsafe {
            let ctx = (*self.cq.as_ptr()).context;
            let poll =
                (*ctx).ops.poll_cq.ok_or_else(|| io::Error::other("provider has no poll_cq"))?;
            poll(self.cq.as_ptr(), out.len() as i32, out.as_mut_ptr().cast())
        };
        if n < 0 {
            Err(io::Error::other(format!("ibv_poll_cq returned {n}")))
        } else {
            Ok(n as usize)
        }
    }
}

impl Drop for RawCq {
    fn drop(&mut self) {
        // SAFETY: QPs hold an `Arc` of their CQs, so none is attached now.
        unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

/// An RC queue pair.
pub(crate) struct RawQp {
    qp: NonNull<ffi::ibv_qp>,
    _pd: Arc<RawPd>,
    _send_cq: Arc<RawCq>,
    _recv_cq: Arc<RawCq>,
}

// SAFETY: verbs QPs may be posted to from any thread; `verbs::Qp` posts from one at a time.
unsafe impl Send for RawQp {}
unsafe impl Sync for RawQp {}

/// One send work request, as `verbs.rs` builds it.
pub(crate) struct SendRequest {
    pub wr_id: u64,
    pub opcode: ffi::ibv_wr_opcode::Type,
    pub signaled: bool,
    /// Local scatter entry (`addr`, `len`, `lkey`); `None` for a zero-length write.
    pub local: Option<(u64, u32, u32)>,
    pub remote_addr: u64,
    pub rkey: u32,
    /// Immediate (host order; converted to network order here).
    pub imm: u32,
    /// Fetch-and-add operand.
    pub add: u64,
}

pub(crate) mod opcode {
    use super::ffi::ibv_wr_opcode;
    pub(crate) const WRITE: ibv_wr_opcode::Type = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
    pub(crate) const WRITE_WITH_IMM: ibv_wr_opcode::Type =
        ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
    pub(crate) const FETCH_AND_ADD: ibv_wr_opcode::Type =
        ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
}

pub(crate) mod state {
    use super::ffi::ibv_qp_state;
    pub(crate) const INIT: u32 = ibv_qp_state::IBV_QPS_INIT;
    pub(crate) const RTR: u32 = ibv_qp_state::IBV_QPS_RTR;
    pub(crate) const RTS: u32 = ibv_qp_state::IBV_QPS_RTS;
    pub(crate) const ERR: u32 = ibv_qp_state::IBV_QPS_ERR;
}

pub(crate) use ffi::ibv_qp_attr as QpAttr;
pub(crate) use ffi::ibv_qp_attr_mask as QpMask;
pub(crate) use ffi::ibv_qp_init_attr as QpInitAttr;

impl RawQp {
    pub(crate) fn create_rc(
        pd: &Arc<RawPd>,
        send_cq: &Arc<RawCq>,
        recv_cq: &Arc<RawCq>,
        max_send_wr: u32,
        max_recv_wr: u32,
    ) -> io::Result<RawQp> {
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.cq.as_ptr(),
            recv_cq: recv_cq.cq.as_ptr(),
            srq: ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr,
                max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQs of the same context; `init` is fully initialised.
        let qp = unsafe { ffi::ibv_create_qp(pd.pd.as_ptr(), &mut init) };
        Ok(RawQp {
            qp: non_null(qp)?,
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
        })
    }

    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: live QP; `qp_num` is immutable after creation.
        unsafe { self.qp.as_ref() }.qp_num
    }

    pub(crate) fn modify(&self, attr: &mut QpAttr, mask: QpMask) -> io::Result<()> {
        // SAFETY: live QP; `attr` valid for the fields `mask` selects.
        errno_result(unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32) })
    }

    pub(crate) fn query(&self, mask: QpMask) -> io::Result<(QpAttr, QpInitAttr)> {
        let mut attr = QpAttr::default();
        // SAFETY: `ibv_qp_init_attr` is plain data; null pointers are valid "empty" values.
        let mut init: QpInitAttr = unsafe { std::mem::zeroed() };
        // SAFETY: live QP; both output structs are writable.
        errno_result(unsafe {
            ffi::ibv_query_qp(self.qp.as_ptr(), &mut attr, mask.0 as i32, &mut init)
        })?;
        Ok((attr, init))
    }

    /// Post one send work request.
    ///
    /// # Safety
    /// The local range in `req.local` (if any) must belong to the registration whose `lkey` it names
    /// and stay mapped until the request's completion (or a later signalled completion on
    /// this QP) has been polled, or the QP is destroyed.
    pub(crate) unsafe fn post_send(&self, req: &SendRequest) -> io::Result<()> {
        let mut sge = match req.local {
            Some((addr, length, lkey)) => ffi::ibv_sge { addr, length, lkey },
            None => ffi::ibv_sge::default(),
        };
        let mut wr = ffi::ibv_send_wr {
            wr_id: req.wr_id,
            next: ptr::null_mut(),
            sg_list: if req.local.is_some() { &mut sge } else { ptr::null_mut() },
            num_sge: req.local.is_some() as i32,
            opcode: req.opcode,
            send_flags: if req.signaled { ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 } else { 0 },
            __bindgen_anon_1: ffi::ibv_send_wr__bindgen_ty_1 { imm_data: req.imm.to_be() },
            wr: Default::default(),
            qp_type: Default::default(),
            __bindgen_anon_2: Default::default(),
        };
        if req.opcode == opcode::FETCH_AND_ADD {
            wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr: req.remote_addr,
                compare_add: req.add,
                swap: 0,
                rkey: req.rkey,
            };
        } else {
            wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: req.remote_addr,
                rkey: req.rkey,
            };
        }
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: live QP; `wr` and `sge` outlive the call (providers copy them into the WQE);
        // `ibv_post_send` is a static inline calling the provider's `post_send` op.
        let rc = unsafe {
            let ctx = (*self.qp.as_ptr()).context;
            let post = (*ctx)
                .ops
                .post_send
                .ok_or_else(|| io::Error::other("provider has no post_send"))?;
            post(self.qp.as_ptr(), &mut wr, &mut bad)
        };
        errno_result(rc)
    }

    /// Post a zero-length signalled RDMA WRITE (a completion marker): it references no local
    /// memory, so it is safe.
    pub(crate) fn post_marker(&self, wr_id: u64, remote_addr: u64, rkey: u32) -> io::Result<()> {
        let req = SendRequest {
            wr_id,
            opcode: opcode::WRITE,
            signaled: true,
            local: None,
            remote_addr,
            rkey,
            imm: 0,
            add: 0,
        };
        // SAFETY: no local range.
        unsafe { self.post_send(&req) }
    }

    /// Post a receive without buffers: a WRITE_WITH_IMM consumes it to deliver its immediate.
    pub(crate) fn post_recv_empty(&self, wr_id: u64) -> io::Result<()> {
        let mut wr =
            ffi::ibv_recv_wr { wr_id, next: ptr::null_mut(), sg_list: ptr::null_mut(), num_sge: 0 };
        let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
        // SAFETY: live QP; no memory is referenced by a zero-SGE receive.
        let rc = unsafe {
            let ctx = (*self.qp.as_ptr()).context;
            let post = (*ctx)
                .ops
                .post_recv
                .ok_or_else(|| io::Error::other("provider has no post_recv"))?;
            post(self.qp.as_ptr(), &mut wr, &mut bad)
        };
        errno_result(rc)
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        // SAFETY: live QP, destroyed once; the CQs and PD it references outlive it (Arcs).
        unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

/// `ibv_wc_status_str`: rdma-core's own wording for a completion status.
pub(crate) fn wc_status_name(status: u32) -> String {
    // SAFETY: returns a static string for any value ("unknown" for out-of-range ones).
    let p = unsafe { ffi::ibv_wc_status_str(status) };
    if p.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-null, static, NUL-terminated.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// What `ibv_wc` tells about one completion.
pub(crate) struct Completed {
    pub wr_id: u64,
    pub qp_num: u32,
    /// `None` on success; `(status, vendor_err)` otherwise.
    pub error: Option<(u32, u32)>,
    pub byte_len: u32,
    pub imm: Option<u32>,
}

pub(crate) fn decode(wc: &WorkCompletion) -> Completed {
    Completed {
        wr_id: wc.wr_id(),
        qp_num: wc.qp_num,
        error: wc.error(),
        byte_len: wc.len() as u32,
        imm: wc.imm_data().map(u32::from_be),
    }
}

/// Plain constants other modules need, without exposing `ffi`.
pub(crate) const ATOMIC_NONE: u32 = ffi::IBV_ATOMIC_NONE;
pub(crate) const WC_FLUSH_ERR: u32 = ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
