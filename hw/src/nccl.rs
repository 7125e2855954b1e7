//! The NCCL all-to-all baseline, in one place: NCCL through cudarc's dynamic loading (presence
//! and version, one communicator rank per GPU in use through `ncclCommInitAll`, grouped
//! send/receive), and [`baseline`], which moves the same bytes per (source, destination) rank
//! pair as a job's dispatch and combine and times it the way the kernels are timed.

use std::collections::BTreeMap;

use cudarc::nccl::sys;
use eptwin_engine::api::OpKind;

use crate::cuda::guarded;
use crate::error::HwError;
use crate::exec::Devices;
use crate::family::BaselineTraffic;
use crate::probes::median;

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

/// What the baseline measured of one op: the median time of the all-to-all and the bytes it
/// moved over all ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AlltoallTime {
    pub us: f64,
    pub bytes_all_ranks: u64,
}

/// How the baseline runs, for the result (`hw.nccl_baseline`).
pub const BASELINE_METHOD: &str = "grouped ncclSend/ncclRecv of every (source, destination) rank \
     pair's bytes; ranks sharing a GPU share its one communicator rank (NCCL allows one rank per \
     GPU), so their chunks are sends to self";

/// NCCL all-to-all of the same bytes per (source, destination) rank pair as the job's dispatch
/// and combine (combine's the transpose of dispatch's), on the GPUs of `devs`.
pub fn baseline(
    devs: &mut Devices,
    traffic: &BaselineTraffic,
    gpu_of_rank: &[u32],
) -> Result<BTreeMap<OpKind, AlltoallTime>, HwError> {
    let mut times = BTreeMap::new();
    {
        let comms = Comms::init(devs)?;
        let rows = &traffic.pair_rows;
        let transposed: Vec<Vec<u64>> =
            (0..rows.len()).map(|s| (0..rows.len()).map(|d| rows[d][s]).collect()).collect();
        for (op, r, row_bytes) in [
            (OpKind::Dispatch, rows, traffic.dispatch_row_bytes),
            (OpKind::Combine, &transposed, traffic.combine_row_bytes),
        ] {
            let (us, bytes_all_ranks) = alltoall(devs, &comms, gpu_of_rank, r, row_bytes)?;
            times.insert(op, AlltoallTime { us, bytes_all_ranks });
        }
    }
    devs.sync("NCCL baseline")?;
    Ok(times)
}

/// The NCCL all-to-all baseline on the same data: every (source, destination) rank pair sends
/// `rows[s][d] · row_bytes` bytes with grouped `ncclSend`/`ncclRecv`. NCCL refuses two ranks of
/// one communicator on one GPU, so co-located ranks' chunks travel within their GPU's single
/// communicator rank (a send to itself); across GPUs they go to the peer's rank.
fn alltoall(
    devs: &mut Devices,
    comms: &Comms,
    gpu_of_rank: &[u32],
    rows: &[Vec<u64>],
    row_bytes: u64,
) -> Result<(f64, u64), HwError> {
    let n = rows.len();
    let idx_of = |gpu: u32| {
        devs.list
            .iter()
            .position(|d| d.gpu.ordinal == gpu as usize)
            .expect("rank GPU is in the placement")
    };
    // Per rank: one send buffer (its chunks to every destination) and one receive buffer.
    let mut send = Vec::with_capacity(n);
    let mut recv = Vec::with_capacity(n);
    for r in 0..n {
        let g = &devs.list[idx_of(gpu_of_rank[r])].gpu;
        let out: u64 = rows[r].iter().sum::<u64>() * row_bytes;
        let inn: u64 = rows.iter().map(|row| row[r]).sum::<u64>() * row_bytes;
        let s = g.alloc(out as usize)?;
        g.memset_u32(s.ptr, 0x5a5a_1234, s.bytes / 4)?;
        send.push(s);
        recv.push(g.alloc(inn as usize)?);
    }
    let mut pairs = Vec::new();
    let mut recv_off = vec![0u64; n];
    for s in 0..n {
        let mut send_off = 0u64;
        for d in 0..n {
            let bytes = rows[s][d] * row_bytes;
            if bytes > 0 {
                pairs.push(Transfer {
                    src_comm: idx_of(gpu_of_rank[s]),
                    dst_comm: idx_of(gpu_of_rank[d]),
                    send_ptr: send[s].ptr + send_off,
                    recv_ptr: recv[d].ptr + recv_off[d],
                    bytes,
                });
            }
            send_off += bytes;
            recv_off[d] += bytes;
        }
    }
    let total: u64 = pairs.iter().map(|p| p.bytes).sum();
    let mut samples = Vec::new();
    for rep in 0..11 {
        devs.flush_l2()?;
        let starts: Vec<_> =
            devs.list.iter().map(|d| d.gpu.new_event()).collect::<Result<_, _>>()?;
        let ends: Vec<_> = devs.list.iter().map(|d| d.gpu.new_event()).collect::<Result<_, _>>()?;
        for (d, e) in devs.list.iter().zip(&starts) {
            d.gpu.record(e)?;
        }
        comms.alltoallv(devs, &pairs)?;
        for (d, e) in devs.list.iter().zip(&ends) {
            d.gpu.record(e)?;
        }
        for d in &devs.list {
            d.gpu.wait("NCCL all-to-all baseline", devs.host_timeout_ms, &|| None)?;
        }
        if rep > 0 {
            let mut worst = 0f64;
            for (a, b) in starts.iter().zip(&ends) {
                worst = worst.max(a.elapsed_ms(b)? as f64 * 1e3);
            }
            samples.push(worst);
        }
    }
    Ok((median(samples), total))
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_strings() {
        assert_eq!(super::version_string(22803), "2.28.3");
        assert_eq!(super::version_string(21805), "2.18.5");
    }
}
