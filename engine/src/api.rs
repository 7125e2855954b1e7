//! The engine's backend API: what a backend (`sim`, `hw`), the result readers (`reports`,
//! `replay`) and the binary name for plans, transports, ids, the frozen PRNG and results.
//!
//! API Boundary: a backend sees a scenario only through this module. The plan types hold
//! typed, resolved values (sizes in bytes, `Dtype`, `Routing`, `Lane`), never the scenario
//! file's structs; the few scenario enums a backend reads (`Dtype`, `OpKind`, the fabric's
//! kinds) are re-exported here by name. Every item is named: a new one is added here when a
//! backend needs it, not reached for in the module that defines it.

// The plan: a validated scenario made concrete.
pub use crate::cluster_ring::{CLUSTER_INDEX_BYTES, ClusterSlot, cluster_ring_slots};
pub use crate::deepep::buffer::BufferSettings;
pub use crate::deepep::bytes::{
    LogicalBytes, fp8_scale_bytes, ll_combine_msg_bytes, ll_dispatch_msg_bytes, logical_row_bytes,
    normal_combine_token_bytes, normal_dispatch_token_bytes,
};
pub use crate::deepep::config::{Config, EpMode, align_up};
pub use crate::deepep::elastic::{
    ElasticBytes, ElasticSettings, GinConnection, SCALEOUT_UPDATE_INTERVAL,
    SCALEUP_UPDATE_INTERVAL, SLOTS_PER_FORWARD_CHUNK,
    combine_token_bytes as elastic_combine_token_bytes,
    dispatch_token_bytes as elastic_dispatch_token_bytes,
};
pub use crate::deepep::env::{DEFAULT_QP_DEPTH, NvshmemSettings};
pub use crate::fabric::{FabricQos, HIGH_LIMIT_UNBOUNDED, Lane, VlArbEntry, parse_vlarb};
pub use crate::plan::{
    DeepEpJob, JobKind, JobPlan, Plan, RoutingFileRef, TrafficJob, channel_range,
};
pub use crate::profile::{HardwareProfile, SwitchMode};
pub use crate::routing::{RoutingTable, generate as generate_routing};
pub use crate::scenario::schema::{
    Dtype, FabricKind, FabricRouting, FabricTopology, NvlinkKind, OpKind, TrafficPattern,
};
pub use crate::topology::{
    NUM_MAX_NVL_PEERS, NvlinkCheckMode, PeerPath, Topology, TopologyProbe, check_nvlink_connections,
};
pub use crate::workload::{Routing, Workload};

// The faults a scenario injects (`[[fault]]`), and DeepEP's timeouts they run into.
pub use crate::fault::{
    Delay, Fault, Faults, LaunchKey, NUM_CPU_TIMEOUT_SECS, NUM_TIMEOUT_CYCLES, gpu_timeout_ns,
};

// The backend boundary and the run loop that drives it.
pub use crate::run::{Progress, run, run_observed};
pub use crate::transport::{
    BackendKind, Capabilities, OpOutcome, OpSample, OpSpec, PhaseTime, StreamSpec, Transport,
    TransportError,
};

// Typed ids.
pub use crate::ids::{ExpertId, GpuId, JobId, Node, PortId, QpId, Rank, Sl, Vl};

// The frozen PRNG (routing, test data) and its key mixer.
pub use crate::rng::{Rng, mix, splitmix64};

// Files: every output through one writer that replaces regular files only, every input a
// regular file read to a bound (engine/src/files.rs).
pub use crate::files::{
    DOCUMENT, InputKind, LOG, Outputs, SNAPSHOT, kind_of, output_refusal, read_input, write_output,
};

// Result documents, and the pieces of one the run loop fills from the plan (for documents of
// measurements taken elsewhere, such as DeepEP's own scripts).
pub use crate::result::{
    JobResult, OpResult, Provenance, RESULT_SCHEMA, ReferenceComparison, RoutingFileRecord,
    RunResult, SampleRecord, ScenarioRef, Stats, Summary, Verdict, is_measured_kind, result_path,
    write_atomic, write_file_atomic,
};
pub use crate::run::{job_facts, job_kind_name, reference_comparison, scenario_ref};
