//! NCCL through cudarc's dynamic loading: presence and version, one communicator rank per GPU
//! in use (`ncclCommInitAll`), and grouped send/receive for the all-to-all baseline.

use cudarc::nccl::sys;

use crate::cuda::guarded;
use crate::error::HwError;
use crate::exec::Devices;

/// NCCL is loadable; its version code (e.g. 22803 for 2.28.3).
pub fn nccl_version() -> Result<i32, String> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "NCCL is not installed here (libnccl.so could not be loaded; with only the pip \
                    wheel, put a libnccl.so symlink on LD_LIBRARY_PATH)"
                .into(),
        );
    }
    let mut v = 0;
    // SAFETY: writes one int.
    let r = guarded("loading NCCL", || unsafe { sys::ncclGetVersion(&mut v) })?;
    if r != sys::ncclResult_t::ncclSuccess {
        return Err(format!("ncclGetVersion failed: {r:?}"));
    }
    Ok(v)
}

/// "2.28.3" from 22803 (NCCL ≥ 2.9 encodes major·10000 + minor·100 + patch).
pub fn version_string(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
}

fn check(call: &'static str, r: sys::ncclResult_t) -> Result<(), HwError> {
    if r == sys::ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: returns a static string.
    let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(r)) };
    Err(HwError::Nccl { call, message: format!("{r:?}: {}", text.to_string_lossy()) })
}

/// One chunk of an all-to-all: `bytes` from `send_ptr` on communicator `src_comm`'s GPU to
/// `recv_ptr` on `dst_comm`'s GPU.
pub struct Transfer {
    pub src_comm: usize,
    pub dst_comm: usize,
    pub send_ptr: u64,
    pub recv_ptr: u64,
    pub bytes: u64,
}

/// Communicators, index i on `devs.list[i]`.
pub struct Comms {
    comms: Vec<sys::ncclComm_t>,
}

impl Comms {
    pub fn init(devs: &Devices) -> Result<Comms, HwError> {
        // NVLink SHARP (multicast) can take a shared host's GPUs out of service: keep it off
        // unless the user decided otherwise.
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            // SAFETY: set before NCCL reads its environment, from the only thread running.
            unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
        }
        let ordinals: Vec<i32> = devs.list.iter().map(|d| d.gpu.ordinal as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); ordinals.len()];
        devs.list[0].gpu.bind()?;
        // SAFETY: arrays of the stated length.
        let r = guarded("ncclCommInitAll", || unsafe {
            sys::ncclCommInitAll(comms.as_mut_ptr(), ordinals.len() as i32, ordinals.as_ptr())
        })
        .map_err(|m| HwError::Nccl { call: "ncclCommInitAll", message: m })?;
        check("ncclCommInitAll", r)?;
        Ok(Comms { comms })
    }

    /// Issue every transfer in one NCCL group on the GPUs' streams (asynchronous).
    pub fn alltoallv(&self, devs: &Devices, transfers: &[Transfer]) -> Result<(), HwError> {
        // SAFETY: group calls bracket the sends/receives below.
        check("ncclGroupStart", unsafe { sys::ncclGroupStart() })?;
        let mut result = Ok(());
        for t in transfers {
            let (src, dst) = (&devs.list[t.src_comm], &devs.list[t.dst_comm]);
            // SAFETY: pointers are inside live allocations of the GPUs these comms drive.
            let r = unsafe {
                sys::ncclSend(
                    t.send_ptr as *const std::ffi::c_void,
                    t.bytes as usize,
                    sys::ncclDataType_t::ncclInt8,
                    t.dst_comm as i32,
                    self.comms[t.src_comm],
                    src.gpu.stream as sys::cudaStream_t,
                )
            };
            if let Err(e) = check("ncclSend", r) {
                result = Err(e);
                break;
            }
            // SAFETY: as above.
            let r = unsafe {
                sys::ncclRecv(
                    t.recv_ptr as *mut std::ffi::c_void,
                    t.bytes as usize,
                    sys::ncclDataType_t::ncclInt8,
                    t.src_comm as i32,
                    self.comms[t.dst_comm],
                    dst.gpu.stream as sys::cudaStream_t,
                )
            };
            if let Err(e) = check("ncclRecv", r) {
                result = Err(e);
                break;
            }
        }
        // SAFETY: closes the group opened above.
        let end = check("ncclGroupEnd", unsafe { sys::ncclGroupEnd() });
        result.and(end)
    }
}

impl Drop for Comms {
    fn drop(&mut self) {
        for &c in &self.comms {
            // SAFETY: created by ncclCommInitAll; errors at teardown are ignored.
            unsafe {
                let _ = sys::ncclCommDestroy(c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_strings() {
        assert_eq!(super::version_string(22803), "2.28.3");
        assert_eq!(super::version_string(21805), "2.18.5");
    }
}
