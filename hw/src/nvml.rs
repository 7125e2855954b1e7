//! NVML implementation of the engine's `TopologyProbe` (`eptwin topo` on a GPU machine).
//!
//! GPUs are numbered like CUDA numbers them (the ordinals the kernels run on); NVML enumerates
//! in its own order, so each CUDA ordinal is matched to an NVML handle by PCI bus id. The two
//! libraries print bus ids differently (`00000000:00:06.0` vs `0000:00:06.0`), so both are
//! normalised first. All NVML calls go through [`NvmlApi`] so the probe is tested with mockall.

use eptwin_engine::api::TopologyProbe;

/// The NVML calls the probe makes, by NVML device index.
#[cfg_attr(test, mockall::automock)]
pub trait NvmlApi {
    fn driver_version(&self) -> Result<String, String>;
    fn device_count(&self) -> Result<u32, String>;
    fn name(&self, index: u32) -> Result<String, String>;
    fn pci_bus_id(&self, index: u32) -> Result<String, String>;
    /// `nvmlDeviceGetP2PStatus(a, b, NVML_P2P_CAPS_INDEX_NVLINK) == NVML_P2P_STATUS_OK`.
    fn nvlink_p2p_ok(&self, a: u32, b: u32) -> Result<bool, String>;
}

/// A PCI address, comparable whatever library printed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

/// Parse `DOMAIN:BUS:DEVICE.FUNCTION` in hex with any domain width (NVML pads it to 8 digits,
/// CUDA to 4), case-insensitive.
pub fn parse_bus_id(id: &str) -> Option<PciAddress> {
    let id = id.trim().trim_end_matches('\0');
    let mut parts = id.split(':');
    let (a, b, c) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (dev, func) = c.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some(PciAddress { domain: hex(a)?, bus: hex(b)?, device: hex(dev)?, function: hex(func)? })
}

pub struct NvmlProbe<A: NvmlApi> {
    api: A,
    /// NVML index of each GPU in CUDA order.
    nvml_index: Vec<u32>,
    mapped_by: &'static str,
}

impl<A: NvmlApi> NvmlProbe<A> {
    /// Build the probe; `cuda_bus_ids` are the PCI bus ids of the CUDA ordinals in order, or
    /// `None` when CUDA is not usable here (NVML's own order is used then).
    pub fn new(api: A, cuda_bus_ids: Option<Vec<String>>) -> Result<Self, String> {
        let count = api.device_count()?;
        let Some(cuda_ids) = cuda_bus_ids else {
            return Ok(NvmlProbe {
                api,
                nvml_index: (0..count).collect(),
                mapped_by: "NVML order",
            });
        };
        let mut nvml_addrs = Vec::with_capacity(count as usize);
        for i in 0..count {
            let raw = api.pci_bus_id(i)?;
            let addr = parse_bus_id(&raw)
                .ok_or_else(|| format!("NVML device {i}: unreadable PCI bus id {raw:?}"))?;
            nvml_addrs.push(addr);
        }
        let mut nvml_index = Vec::with_capacity(cuda_ids.len());
        for (ordinal, raw) in cuda_ids.iter().enumerate() {
            let addr = parse_bus_id(raw)
                .ok_or_else(|| format!("CUDA device {ordinal}: unreadable PCI bus id {raw:?}"))?;
            let idx = nvml_addrs.iter().position(|a| *a == addr).ok_or_else(|| {
                format!("CUDA device {ordinal} ({raw}) has no NVML device with that PCI bus id")
            })?;
            nvml_index.push(idx as u32);
        }
        Ok(NvmlProbe { api, nvml_index, mapped_by: "PCI bus id" })
    }

    fn index(&self, gpu: u32) -> Result<u32, String> {
        self.nvml_index
            .get(gpu as usize)
            .copied()
            .ok_or_else(|| format!("GPU {gpu} does not exist ({} GPUs)", self.nvml_index.len()))
    }
}

impl<A: NvmlApi> TopologyProbe for NvmlProbe<A> {
    fn source(&self) -> String {
        let driver = self.api.driver_version().unwrap_or_else(|e| format!("? ({e})"));
        format!("NVML, driver {driver}, CUDA ordinals matched by {}", self.mapped_by)
    }
    fn gpu_count(&self) -> Result<u32, String> {
        Ok(self.nvml_index.len() as u32)
    }
    fn gpu_name(&self, gpu: u32) -> Result<String, String> {
        self.api.name(self.index(gpu)?)
    }
    fn nvlink_p2p_ok(&self, a: u32, b: u32) -> Result<bool, String> {
        self.api.nvlink_p2p_ok(self.index(a)?, self.index(b)?)
    }
}

/// [`NvmlApi`] over nvml-wrapper (dlopens libnvidia-ml at init).
pub struct RealNvml {
    nvml: nvml_wrapper::Nvml,
}

impl RealNvml {
    pub fn init() -> Result<RealNvml, String> {
        let nvml = crate::cuda::guarded("loading NVML", nvml_wrapper::Nvml::init)?
            .map_err(|e| format!("NVML is not available here: {e}"))?;
        Ok(RealNvml { nvml })
    }
}

impl NvmlApi for RealNvml {
    fn driver_version(&self) -> Result<String, String> {
        self.nvml.sys_driver_version().map_err(|e| e.to_string())
    }
    fn device_count(&self) -> Result<u32, String> {
        self.nvml.device_count().map_err(|e| e.to_string())
    }
    fn name(&self, index: u32) -> Result<String, String> {
        let d = self.nvml.device_by_index(index).map_err(|e| e.to_string())?;
        d.name().map_err(|e| e.to_string())
    }
    fn pci_bus_id(&self, index: u32) -> Result<String, String> {
        let d = self.nvml.device_by_index(index).map_err(|e| e.to_string())?;
        d.pci_info().map(|p| p.bus_id).map_err(|e| e.to_string())
    }
    fn nvlink_p2p_ok(&self, a: u32, b: u32) -> Result<bool, String> {
        use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus};
        let da = self.nvml.device_by_index(a).map_err(|e| e.to_string())?;
        let db = self.nvml.device_by_index(b).map_err(|e| e.to_string())?;
        let status = da.p2p_status(&db, P2pCapabilitiesIndex::NvLink).map_err(|e| e.to_string())?;
        Ok(status == P2pStatus::Ok)
    }
}

/// The PCI bus ids of the CUDA devices in ordinal order, when the driver is usable.
pub fn cuda_bus_ids() -> Option<Vec<String>> {
    let count = crate::cuda::init_driver().ok()?;
    let mut ids = Vec::with_capacity(count);
    for ordinal in 0..count {
        let dev = cudarc::driver::result::device::get(ordinal as i32).ok()?;
        let mut bus = [0 as std::ffi::c_char; 64];
        // SAFETY: buffer of the stated length; the driver was initialised above.
        let r = unsafe { cudarc::driver::sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), 64, dev) };
        r.result().ok()?;
        // SAFETY: NUL-terminated by the driver.
        ids.push(unsafe { std::ffi::CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned());
    }
    Some(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mockall::predicate::eq;

    #[test]
    fn bus_ids_normalise() {
        let nvml = parse_bus_id("00000000:1B:00.0").unwrap();
        let cuda = parse_bus_id("0000:1b:00.0").unwrap();
        assert_eq!(nvml, cuda);
        assert_eq!(nvml, PciAddress { domain: 0, bus: 0x1b, device: 0, function: 0 });
        assert!(parse_bus_id("garbage").is_none());
        assert!(parse_bus_id("0000:1b:00").is_none());
    }

    fn api_with_two_gpus_in_reverse_order() -> MockNvmlApi {
        let mut api = MockNvmlApi::new();
        api.expect_device_count().return_const(Ok(2u32));
        // NVML lists bus 0x2a first, CUDA (fastest first) lists bus 0x1b first.
        api.expect_pci_bus_id().with(eq(0)).returning(|_| Ok("00000000:2A:00.0".into()));
        api.expect_pci_bus_id().with(eq(1)).returning(|_| Ok("00000000:1B:00.0".into()));
        api.expect_name().returning(|i| Ok(format!("NVIDIA H200 (nvml {i})")));
        api.expect_driver_version().returning(|| Ok("580.159.04".into()));
        api
    }

    #[test]
    fn cuda_ordinals_map_to_nvml_by_bus_id() {
        let mut api = api_with_two_gpus_in_reverse_order();
        // The P2P query must use NVML indices: CUDA (0, 1) is NVML (1, 0).
        api.expect_nvlink_p2p_ok().with(eq(1), eq(0)).times(1).returning(|_, _| Ok(true));
        let ids = vec!["0000:1b:00.0".to_string(), "0000:2a:00.0".to_string()];
        let probe = NvmlProbe::new(api, Some(ids)).unwrap();
        assert_eq!(probe.gpu_count().unwrap(), 2);
        assert_eq!(probe.gpu_name(0).unwrap(), "NVIDIA H200 (nvml 1)");
        assert!(probe.nvlink_p2p_ok(0, 1).unwrap());
        assert!(probe.source().contains("580.159.04"));
        assert!(probe.source().contains("PCI bus id"));
        assert!(probe.gpu_name(2).is_err());
    }

    #[test]
    fn without_cuda_nvml_order_is_used() {
        let mut api = MockNvmlApi::new();
        api.expect_device_count().return_const(Ok(3u32));
        api.expect_pci_bus_id().never();
        api.expect_nvlink_p2p_ok().with(eq(0), eq(2)).returning(|_, _| Ok(false));
        let probe = NvmlProbe::new(api, None).unwrap();
        assert_eq!(probe.gpu_count().unwrap(), 3);
        assert!(!probe.nvlink_p2p_ok(0, 2).unwrap());
    }

    #[test]
    fn unmatched_cuda_device_is_an_error() {
        let api = api_with_two_gpus_in_reverse_order();
        let ids = vec!["0000:99:00.0".to_string()];
        let err = NvmlProbe::new(api, Some(ids)).err().unwrap();
        assert!(err.contains("0000:99:00.0"), "{err}");
    }

    #[test]
    fn nvml_errors_propagate() {
        let mut api = MockNvmlApi::new();
        api.expect_device_count().return_const(Err("NVML_ERROR_UNINITIALIZED".to_string()));
        assert!(NvmlProbe::new(api, None).is_err());
    }

    #[test]
    fn the_engine_check_runs_on_the_probe() {
        use eptwin_engine::api::{NvlinkCheckMode, check_nvlink_connections};
        let mut api = api_with_two_gpus_in_reverse_order();
        api.expect_nvlink_p2p_ok().returning(|_, _| Ok(false));
        let probe = NvmlProbe::new(api, None).unwrap();
        let r = check_nvlink_connections(
            &probe,
            &[0, 1],
            &[Some(0), Some(0)],
            NvlinkCheckMode::Strict,
            false,
        )
        .unwrap();
        assert!(!r.passed());
        assert_eq!(r.failures.len(), 1);
    }
}
