//! eptwin engine: the scenario language and its validation, DeepEP configuration semantics,
//! hardware profiles, topology, routing and layout, the `Transport` trait, the run loop and
//! the result documents, and parameter sweeps over them.
//!
//! Architecture Invariant: this crate is pure. It reads scenario files (and the routing files
//! they name) and writes result files (atomically; a sweep writes each point's scenario beside
//! its result) and nothing else: no clock, no OS randomness, no GPU, no network.

// Backends and the binary name plans, transports, ids, the PRNG and results through `api`
// (ARCHITECTURE.md, "API Boundary"): the modules that define them are the crate's own.
pub mod api;
pub(crate) mod cluster_ring;
pub mod deepep;
pub mod diag;
pub mod error;
pub(crate) mod fabric;
pub(crate) mod fault;
pub mod files;
pub(crate) mod ids;
pub mod layout;
pub(crate) mod plan;
pub mod profile;
pub mod result;
pub(crate) mod rng;
pub(crate) mod routing;
pub mod routing_file;
pub mod run;
pub mod scenario;
pub mod sweep;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod topology;
pub(crate) mod transport;
pub mod units;
pub(crate) mod workload;

pub use error::EngineError;
pub use plan::{JobKind, JobPlan, Plan};
pub use scenario::{LoadedScenario, load, parse};
pub use transport::{
    BackendKind, Capabilities, OpOutcome, OpSample, OpSpec, Transport, TransportError,
};

/// eptwin's version (results record it).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
