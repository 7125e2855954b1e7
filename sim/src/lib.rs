//! eptwin simulator: a deterministic discrete-event model behind the engine's `Transport`.
//!
//! Placeholder: the event core, fabric models and DeepEP algorithms land in later commits.

use std::collections::BTreeMap;

use eptwin_engine::Plan;
use eptwin_engine::deepep::config::EpMode;
use eptwin_engine::transport::{
    BackendKind, Capabilities, OpOutcome, OpSpec, Transport, TransportError,
};

/// Options of a simulation run.
#[derive(Debug, Clone, Default)]
pub struct SimOptions {
    /// Record a Chrome trace-event / Perfetto trace of the run.
    pub trace: bool,
}

/// The simulator as a [`Transport`].
pub struct Simulator {
    #[allow(dead_code)]
    options: SimOptions,
}

impl Simulator {
    pub fn new(options: SimOptions) -> Self {
        Simulator { options }
    }

    /// The trace of the last run (Chrome trace-event JSON), when `SimOptions::trace` was set.
    pub fn trace_json(&self) -> Option<String> {
        None
    }
}

impl Transport for Simulator {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: BackendKind::Sim,
            identity: BTreeMap::from([(
                "version".into(),
                serde_json::json!(eptwin_engine::VERSION),
            )]),
            unavailable: Some("the simulator is not implemented yet".into()),
            modes: vec![EpMode::Intranode, EpMode::Internode, EpMode::LowLatency],
            traffic: true,
            concurrent_jobs: true,
            max_ranks: None,
            rdma: true,
        }
    }

    fn prepare(&mut self, _plan: &Plan) -> Result<(), TransportError> {
        Err(TransportError::Unsupported("the simulator is not implemented yet".into()))
    }

    fn execute(&mut self, _op: &OpSpec) -> Result<OpOutcome, TransportError> {
        Err(TransportError::Unsupported("the simulator is not implemented yet".into()))
    }
}
