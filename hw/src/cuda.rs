//! A thin, checked layer over the CUDA driver API (`cudarc::driver::{sys, result}`): library
//! presence, devices and their primary contexts, one stream per GPU, device buffers, events,
//! module loading and launches.
//!
//! Architecture Invariant: cudarc panics when a library or a symbol is missing, so every first
//! use goes through [`guarded`] after a presence check; nothing here panics on a machine
//! without CUDA. Every driver call's result is checked and turned into [`HwError::Cuda`] with
//! the GPU and the call's name.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::{result, sys};

use crate::error::HwError;

/// Run `f`, turning a panic from cudarc's loader (missing library or symbol) into an error.
/// The default panic hook is silenced for the duration so the user sees one line, not a trace.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let out = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(previous);
    out.map_err(|payload| {
        let detail = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        format!("{what}: {}", detail.lines().next().unwrap_or(""))
    })
}

pub fn driver_error(gpu: usize, call: &'static str, e: result::DriverError) -> HwError {
    let name = e.error_name().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
    let text = e.error_string().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
    HwError::Cuda { gpu, call, message: format!("{name} ({text})") }
}

/// The driver is loadable and initialised; returns the number of devices.
pub fn init_driver() -> Result<usize, String> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver here (libcuda.so could not be loaded): no GPU".into());
    }
    let init = guarded("loading the CUDA driver", result::init)?;
    if let Err(e) = init {
        let name = e.error_name().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
        return Err(format!("cuInit failed ({name}): no usable GPU"));
    }
    let count = guarded("loading the CUDA driver", result::device::get_count)?
        .map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))?;
    if count <= 0 {
        return Err("the CUDA driver reports no GPU".into());
    }
    Ok(count as usize)
}

/// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
pub fn driver_api_version() -> Result<i32, String> {
    let mut v = 0;
    // SAFETY: writes one int.
    let r = guarded("cuDriverGetVersion", || unsafe { sys::cuDriverGetVersion(&mut v) })?;
    r.result().map_err(|e| format!("cuDriverGetVersion failed: {e:?}"))?;
    Ok(v)
}

/// One GPU: its primary context (current on the calling thread while in use) and one stream.
pub struct Gpu {
    pub ordinal: usize,
    pub device: sys::CUdevice,
    pub ctx: sys::CUcontext,
    pub stream: sys::CUstream,
    pub name: String,
    pub sm_count: u32,
    pub compute_capability: (i32, i32),
    pub l2_bytes: u64,
    pub total_mem_bytes: u64,
    pub pci_bus_id: String,
}

// SAFETY: the raw handles are only used through the driver, which is thread-safe; the backend
// drives all GPUs from one thread.
unsafe impl Send for Gpu {}

impl Gpu {
    pub fn open(ordinal: usize) -> Result<Gpu, HwError> {
        let e = |call| move |err| driver_error(ordinal, call, err);
        let device = result::device::get(ordinal as i32).map_err(e("cuDeviceGet"))?;
        // SAFETY: `device` is valid; the primary context is released in Drop.
        let ctx = unsafe { result::primary_ctx::retain(device) }
            .map_err(e("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: ctx was just retained.
        unsafe { result::ctx::set_current(ctx) }.map_err(e("cuCtxSetCurrent"))?;
        // A blocking (default-flag) stream also orders against the synchronous copies.
        let stream = result::stream::create(result::stream::StreamKind::Default)
            .map_err(e("cuStreamCreate"))?;
        let attr = |a| {
            // SAFETY: valid device and attribute.
            unsafe { result::device::get_attribute(device, a) }.map_err(e("cuDeviceGetAttribute"))
        };
        use sys::CUdevice_attribute as A;
        let sm_count = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let l2_bytes = attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64;
        let unified = attr(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)?;
        if unified == 0 {
            return Err(HwError::Unsupported(format!(
                "GPU {ordinal} has no unified addressing; peer pointers need it"
            )));
        }
        // SAFETY: valid device.
        let total_mem_bytes =
            unsafe { result::device::total_mem(device) }.map_err(e("cuDeviceTotalMem"))? as u64;
        let name = result::device::get_name(device).map_err(e("cuDeviceGetName"))?;
        let mut bus = [0 as std::ffi::c_char; 64];
        // SAFETY: buffer of the stated length.
        unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, device) }
            .result()
            .map_err(e("cuDeviceGetPCIBusId"))?;
        // SAFETY: NUL-terminated by the driver.
        let pci_bus_id =
            unsafe { std::ffi::CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned();
        Ok(Gpu {
            ordinal,
            device,
            ctx,
            stream,
            name,
            sm_count,
            compute_capability: (major, minor),
            l2_bytes,
            total_mem_bytes,
            pci_bus_id,
        })
    }

    fn err(&self, call: &'static str) -> impl Fn(result::DriverError) -> HwError + '_ {
        move |e| driver_error(self.ordinal, call, e)
    }

    /// Make this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<(), HwError> {
        // SAFETY: ctx is retained for the lifetime of self.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(self.err("cuCtxSetCurrent"))
    }

    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, HwError> {
        self.bind()?;
        let bytes = bytes.max(16);
        // SAFETY: plain device allocation, freed in Drop.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|e| {
            let mut h = driver_error(self.ordinal, "cuMemAlloc", e);
            if let HwError::Cuda { message, .. } = &mut h {
                message.push_str(&format!(" allocating {bytes} bytes"));
            }
            h
        })?;
        Ok(DeviceBuffer { ptr, bytes, gpu: self.ordinal, ctx: self.ctx })
    }

    /// A device buffer holding a copy of `data` (argument arrays, tables).
    pub fn alloc_from<T: Copy>(&self, data: &[T]) -> Result<DeviceBuffer, HwError> {
        let buf = self.alloc(std::mem::size_of_val(data))?;
        self.upload(&buf, data)?;
        Ok(buf)
    }

    /// `bytes` of pinned host memory mapped into the GPU's address space (`cuMemHostAlloc`
    /// with `DEVICEMAP | PORTABLE`), zeroed: the internode wire's regions and doorbell rings,
    /// which kernels write and read through the mapping while CPU threads (the proxy, the
    /// TCP receivers) and NICs use the host address.
    pub fn alloc_mapped_host(&self, bytes: usize) -> Result<PinnedHost, HwError> {
        self.bind()?;
        let bytes = bytes.max(64);
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: writes one pointer; freed in PinnedHost's Drop.
        unsafe { sys::cuMemHostAlloc(&mut host, bytes, flags) }.result().map_err(|e| {
            let mut h = driver_error(self.ordinal, "cuMemHostAlloc", e);
            if let HwError::Cuda { message, .. } = &mut h {
                message.push_str(&format!(" allocating {bytes} pinned bytes"));
            }
            h
        })?;
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` was just allocated with DEVICEMAP; writes one device pointer.
        let mapped = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) }.result();
        let mem = PinnedHost { host: host.cast(), device, bytes, gpu: self.ordinal, ctx: self.ctx };
        mapped.map_err(self.err("cuMemHostGetDevicePointer"))?;
        // SAFETY: `bytes` bytes at `host` are ours; pinned memory is not zeroed by the driver.
        unsafe { std::ptr::write_bytes(mem.host, 0, bytes) };
        Ok(mem)
    }

    pub fn mem_free_bytes(&self) -> Result<u64, HwError> {
        self.bind()?;
        let (free, _) = result::mem_get_info().map_err(self.err("cuMemGetInfo"))?;
        Ok(free as u64)
    }

    pub fn memset_u32(&self, ptr: u64, value: u32, count_u32: usize) -> Result<(), HwError> {
        if count_u32 == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller passes a range inside one of its allocations.
        unsafe { sys::cuMemsetD32Async(ptr, value, count_u32, self.stream) }
            .result()
            .map_err(self.err("cuMemsetD32Async"))
    }

    pub fn memset_u8(&self, ptr: u64, value: u8, bytes: usize) -> Result<(), HwError> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: as above.
        unsafe { sys::cuMemsetD8Async(ptr, value, bytes, self.stream) }
            .result()
            .map_err(self.err("cuMemsetD8Async"))
    }

    pub fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<(), HwError> {
        self.bind()?;
        // SAFETY: both ranges are inside live allocations (caller).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream) }
            .map_err(self.err("cuMemcpyDtoDAsync"))
    }

    pub fn upload<T: Copy>(&self, dst: &DeviceBuffer, data: &[T]) -> Result<(), HwError> {
        let bytes = std::mem::size_of_val(data);
        if bytes > dst.bytes {
            return Err(HwError::Setup {
                context: format!("GPU {}", self.ordinal),
                message: format!("upload of {bytes} bytes into a {}-byte buffer", dst.bytes),
            });
        }
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        self.synchronize("upload")?;
        // SAFETY: bounds checked above; T is plain data.
        unsafe { result::memcpy_htod_sync(dst.ptr, data) }.map_err(self.err("cuMemcpyHtoD"))
    }

    pub fn download<T: Copy>(&self, src: u64, out: &mut [T]) -> Result<(), HwError> {
        if out.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.synchronize("download")?;
        // SAFETY: the caller passes a range inside one of its allocations.
        unsafe { result::memcpy_dtoh_sync(out, src) }.map_err(self.err("cuMemcpyDtoH"))
    }

    pub fn synchronize(&self, _what: &str) -> Result<(), HwError> {
        self.bind()?;
        // SAFETY: own stream.
        unsafe { result::stream::synchronize(self.stream) }.map_err(self.err("cuStreamSynchronize"))
    }

    /// Wait for the stream with a host-side bound: a kernel that never exits becomes an error
    /// naming the op instead of a hang. `interrupted` is polled while waiting: a reason it
    /// gives (another process of the run failed) ends the wait with that reason.
    #[allow(clippy::disallowed_methods)] // real time: the host watchdog
    pub fn wait(
        &self,
        op: &str,
        timeout_ms: u64,
        interrupted: &dyn Fn() -> Option<String>,
    ) -> Result<(), HwError> {
        self.bind()?;
        let start = std::time::Instant::now();
        loop {
            // SAFETY: own stream.
            match unsafe { sys::cuStreamQuery(self.stream) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                other => {
                    return Err(driver_error(
                        self.ordinal,
                        "cuStreamQuery",
                        result::DriverError(other),
                    ));
                }
            }
            if let Some(reason) = interrupted() {
                return Err(HwError::Processes(format!(
                    "{op} on GPU {} abandoned: {reason}",
                    self.ordinal
                )));
            }
            if start.elapsed().as_millis() as u64 > timeout_ms {
                return Err(HwError::HostTimeout {
                    op: op.to_string(),
                    gpu: self.ordinal,
                    timeout_ms,
                });
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    pub fn new_event(&self) -> Result<Event, HwError> {
        self.bind()?;
        let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(self.err("cuEventCreate"))?;
        Ok(Event { ev, gpu: self.ordinal, ctx: self.ctx })
    }

    pub fn record(&self, ev: &Event) -> Result<(), HwError> {
        self.bind()?;
        // SAFETY: event and stream belong to this context.
        unsafe { result::event::record(ev.ev, self.stream) }.map_err(self.err("cuEventRecord"))
    }

    /// Load a cubin and resolve the named functions.
    pub fn load_module(&self, cubin: &[u8], names: &[&str]) -> Result<Module, HwError> {
        self.bind()?;
        // SAFETY: cubin is a complete image produced by NVRTC for this architecture.
        let module = unsafe { result::module::load_data(cubin.as_ptr() as *const c_void) }
            .map_err(self.err("cuModuleLoadData"))?;
        let mut functions = Vec::new();
        for &n in names {
            let c = std::ffi::CString::new(n).expect("entry point names have no NUL");
            // SAFETY: module is loaded.
            let f = unsafe { result::module::get_function(module, c) }
                .map_err(self.err("cuModuleGetFunction"))?;
            functions.push((n.to_string(), Function { f, gpu: self.ordinal }));
        }
        Ok(Module { module, functions, ctx: self.ctx })
    }

    /// Launch on this GPU's stream. `params` are pointers to each argument's value.
    ///
    /// # Safety
    /// The parameters must match the kernel's signature and every pointer they carry must be
    /// valid for what the kernel does with it.
    pub unsafe fn launch(
        &self,
        f: &Function,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), HwError> {
        self.bind()?;
        // SAFETY: forwarded to the caller.
        unsafe { result::launch_kernel(f.f, (grid, 1, 1), (block, 1, 1), 0, self.stream, params) }
            .map_err(self.err("cuLaunchKernel"))
    }

    /// Launch with `smem_bytes` of dynamic shared memory (see [`Gpu::set_max_dynamic_smem`]).
    ///
    /// # Safety
    /// As [`Gpu::launch`]; the kernel must not use more dynamic shared memory than given.
    pub unsafe fn launch_with_smem(
        &self,
        f: &Function,
        grid: u32,
        block: u32,
        smem_bytes: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), HwError> {
        self.bind()?;
        // SAFETY: forwarded to the caller.
        unsafe {
            result::launch_kernel(f.f, (grid, 1, 1), (block, 1, 1), smem_bytes, self.stream, params)
        }
        .map_err(self.err("cuLaunchKernel"))
    }

    /// Let `f` use up to `bytes` of dynamic shared memory (above the default 48 KiB).
    pub fn set_max_dynamic_smem(&self, f: &Function, bytes: u32) -> Result<(), HwError> {
        use sys::CUfunction_attribute as FA;
        self.bind()?;
        // SAFETY: valid function handle; the driver checks the value against the device.
        unsafe {
            result::function::set_function_attribute(
                f.f,
                FA::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .map_err(self.err("cuFuncSetAttribute"))
    }

    /// Clusters of `f` (whose cluster shape is compiled in with `__cluster_dims__`) that can be
    /// resident at once with `block` threads and `smem_bytes` of dynamic shared memory.
    pub fn max_active_clusters(
        &self,
        f: &Function,
        grid: u32,
        block: u32,
        smem_bytes: u32,
    ) -> Result<u32, HwError> {
        self.bind()?;
        let config = sys::CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem_bytes,
            hStream: self.stream,
            attrs: std::ptr::null_mut(),
            numAttrs: 0,
        };
        let mut n = 0i32;
        // SAFETY: valid function handle; the config outlives the call and names no attributes.
        unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, f.f, &config) }
            .result()
            .map_err(self.err("cuOccupancyMaxActiveClusters"))?;
        Ok(n.max(0) as u32)
    }

    /// Resident blocks per SM of `f` at `block` threads (the occupancy API).
    pub fn occupancy(&self, f: &Function, block: u32) -> Result<u32, HwError> {
        self.bind()?;
        // SAFETY: valid function handle.
        let n =
            unsafe { result::occupancy::max_active_block_per_multiprocessor(f.f, block as i32, 0) }
                .map_err(self.err("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
        Ok(n.max(0) as u32)
    }

    /// (registers per thread, local-memory bytes per thread) of a compiled function.
    pub fn function_resources(&self, f: &Function) -> Result<(i32, i32), HwError> {
        use sys::CUfunction_attribute as FA;
        // SAFETY: valid function handle.
        let regs = unsafe {
            result::function::get_function_attribute(f.f, FA::CU_FUNC_ATTRIBUTE_NUM_REGS)
        }
        .map_err(self.err("cuFuncGetAttribute"))?;
        // SAFETY: as above.
        let local = unsafe {
            result::function::get_function_attribute(f.f, FA::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
        }
        .map_err(self.err("cuFuncGetAttribute"))?;
        Ok((regs, local))
    }

    /// Let this context read and write `peer`'s memory (multi-GPU placement).
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<(), HwError> {
        self.bind()?;
        // SAFETY: both contexts are alive.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx, 0) };
        match r {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(())
            }
            other => {
                Err(driver_error(self.ordinal, "cuCtxEnablePeerAccess", result::DriverError(other)))
            }
        }
    }

    /// Whether this process's context on the GPU goes through the MPS server
    /// (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED`): kernels of several processes then run at once
    /// instead of time-slicing.
    pub fn mps_enabled(&self) -> Result<bool, HwError> {
        self.bind()?;
        // SAFETY: valid device and attribute.
        let v = unsafe {
            result::device::get_attribute(
                self.device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED,
            )
        }
        .map_err(self.err("cuDeviceGetAttribute"))?;
        Ok(v != 0)
    }

    /// An IPC handle another process opens to reach `buf` (`cuIpcGetMemHandle` on the
    /// allocation holding it), and `buf`'s offset in that allocation.
    pub fn ipc_export(&self, buf: &DeviceBuffer) -> Result<IpcExport, HwError> {
        self.bind()?;
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: `buf.ptr` lies in a live allocation of this context.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, buf.ptr) }
            .result()
            .map_err(self.err("cuMemGetAddressRange"))?;
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `base` is the start of a cuMemAlloc allocation; the handle is written whole.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, base) }
            .result()
            .map_err(self.err("cuIpcGetMemHandle"))?;
        Ok(IpcExport {
            handle: handle.reserved.iter().map(|&b| b as u8).collect(),
            offset: buf.ptr - base,
        })
    }

    /// Maps another process's allocation into this context (`cuIpcOpenMemHandle`, peer access
    /// enabled lazily when the allocation is on another GPU); unmapped on drop.
    pub fn ipc_open(&self, export: &IpcExport) -> Result<IpcMapping, HwError> {
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        if export.handle.len() != handle.reserved.len() {
            return Err(HwError::Setup {
                context: format!("GPU {}", self.ordinal),
                message: format!("an IPC handle of {} bytes (64 expected)", export.handle.len()),
            });
        }
        for (d, &s) in handle.reserved.iter_mut().zip(&export.handle) {
            *d = s as std::ffi::c_char;
        }
        self.bind()?;
        let mut base = 0u64;
        // SAFETY: the handle came from cuIpcGetMemHandle in another process; the mapping is
        // closed in IpcMapping's Drop.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut base,
                handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        }
        .result()
        .map_err(self.err("cuIpcOpenMemHandle"))?;
        Ok(IpcMapping { base, ptr: base + export.offset, ctx: self.ctx })
    }

    pub fn can_access_peer(&self, peer: &Gpu) -> Result<bool, HwError> {
        let mut v = 0;
        // SAFETY: valid devices.
        unsafe { sys::cuDeviceCanAccessPeer(&mut v, self.device, peer.device) }
            .result()
            .map_err(self.err("cuDeviceCanAccessPeer"))?;
        Ok(v != 0)
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: handles created in open(); errors at teardown are ignored.
        unsafe {
            let _ = result::ctx::set_current(self.ctx);
            let _ = result::stream::synchronize(self.stream);
            let _ = result::stream::destroy(self.stream);
            let _ = result::primary_ctx::release(self.device);
        }
    }
}

/// A device allocation; freed on drop.
pub struct DeviceBuffer {
    pub ptr: u64,
    pub bytes: usize,
    pub gpu: usize,
    ctx: sys::CUcontext,
}

// SAFETY: a device pointer plus its context. Shared references only expose the address and
// size (no driver call), and only the owner frees it.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Address `offset` bytes into the buffer.
    pub fn at(&self, offset: usize) -> u64 {
        debug_assert!(offset <= self.bytes);
        self.ptr + offset as u64
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_sync in this context.
        unsafe {
            let _ = result::ctx::set_current(self.ctx);
            let _ = result::free_sync(self.ptr);
        }
    }
}

/// Pinned, GPU-mapped host memory ([`Gpu::alloc_mapped_host`]); freed on drop. Kernels use
/// [`PinnedHost::device`], CPU threads [`PinnedHost::host`]. The memory is shared with agents
/// outside Rust's view (the GPU, a NIC), so it is only handed out as raw pointers.
pub struct PinnedHost {
    host: *mut u8,
    device: u64,
    bytes: usize,
    pub gpu: usize,
    ctx: sys::CUcontext,
}

// SAFETY: two addresses of one pinned allocation; no references into it are handed out, and
// the driver frees it from any thread once its context is made current.
unsafe impl Send for PinnedHost {}
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// The address CPU threads use.
    pub fn host(&self) -> *mut u8 {
        self.host
    }

    /// The address kernels use.
    pub fn device(&self) -> u64 {
        self.device
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in this context; freed once.
        unsafe {
            let _ = result::ctx::set_current(self.ctx);
            let _ = sys::cuMemFreeHost(self.host.cast());
        }
    }
}

/// What another process needs to map a buffer: the allocation's IPC handle (64 bytes) and the
/// buffer's offset in that allocation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IpcExport {
    pub handle: Vec<u8>,
    pub offset: u64,
}

/// Another process's buffer mapped into this process (`ptr` is the buffer, `base` the mapped
/// allocation); unmapped on drop.
pub struct IpcMapping {
    base: u64,
    pub ptr: u64,
    ctx: sys::CUcontext,
}

// SAFETY: a mapped address and its context; shared references only read the address, and
// only Drop calls the driver.
unsafe impl Send for IpcMapping {}
unsafe impl Sync for IpcMapping {}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: opened by cuIpcOpenMemHandle in this context.
        unsafe {
            let _ = result::ctx::set_current(self.ctx);
            let _ = sys::cuIpcCloseMemHandle(self.base);
        }
    }
}

pub struct Event {
    ev: sys::CUevent,
    gpu: usize,
    ctx: sys::CUcontext,
}

impl Event {
    /// Milliseconds between two completed events of one GPU.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, HwError> {
        // SAFETY: both events were recorded and completed (the caller waited).
        unsafe { result::event::elapsed(self.ev, end.ev) }
            .map_err(|e| driver_error(self.gpu, "cuEventElapsedTime", e))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created in this context.
        unsafe {
            let _ = result::ctx::set_current(self.ctx);
            let _ = result::event::destroy(self.ev);
        }
    }
}

pub struct Function {
    f: sys::CUfunction,
    pub gpu: usize,
}

pub struct Module {
    module: sys::CUmodule,
    functions: Vec<(String, Function)>,
    ctx: sys::CUcontext,
}

impl Module {
    pub fn function(&self, name: &str) -> &Function {
        &self
            .functions
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("entry point {name} was resolved at load time"))
            .1
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded in this context.
        unsafe {
            let _ = result::ctx::set_current(self.ctx);
            let _ = result::module::unload(self.module);
        }
    }
}

/// Pointers to kernel arguments, in order: `kernel_args![a, b, c]` where each is a place
/// expression that outlives the launch.
#[macro_export]
macro_rules! kernel_args {
    ($($a:expr),* $(,)?) => {
        [$( (&$a) as *const _ as *mut ::std::ffi::c_void ),*]
    };
}
