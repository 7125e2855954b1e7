//! eptwin hardware backend: real CUDA kernels (NVRTC through cudarc), NVML topology, ibverbs.
//!
//! Architecture Invariant: every GPU library is loaded at run time; a missing GPU, driver or
//! library makes capabilities() report the plan as waived, never a panic.
//!
//! Placeholder: the CUDA path lands in later commits.

use std::collections::BTreeMap;

use eptwin_engine::Plan;
use eptwin_engine::transport::{
    BackendKind, Capabilities, OpOutcome, OpSpec, Transport, TransportError,
};

#[derive(Debug, Clone, Default)]
pub struct HwOptions {}

pub struct HwTransport {
    #[allow(dead_code)]
    options: HwOptions,
}

impl HwTransport {
    pub fn new(options: HwOptions) -> Self {
        HwTransport { options }
    }
}

impl Transport for HwTransport {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: BackendKind::Hw,
            identity: BTreeMap::new(),
            unavailable: Some("the hardware backend is not built yet".into()),
            modes: Vec::new(),
            traffic: false,
            concurrent_jobs: false,
            max_ranks: None,
            rdma: false,
        }
    }

    fn prepare(&mut self, _plan: &Plan) -> Result<(), TransportError> {
        Err(TransportError::Unsupported("the hardware backend is not built yet".into()))
    }

    fn execute(&mut self, _op: &OpSpec) -> Result<OpOutcome, TransportError> {
        Err(TransportError::Unsupported("the hardware backend is not built yet".into()))
    }
}

/// The NVML implementation of the engine's `TopologyProbe`, or why there is none here.
pub fn nvml_probe() -> Result<Box<dyn eptwin_engine::topology::TopologyProbe>, String> {
    Err("NVML is not available: the hardware backend is not built yet".into())
}
