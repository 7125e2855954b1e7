//! The safe verbs API over `sys.rs`: device discovery, a NIC port with its protection domain,
//! registered memory, RC queue pairs created and connected with a scenario's `QpSettings`,
//! RDMA WRITE, WRITE_WITH_IMM, fetch-and-add, and completion polling that turns error
//! completions into `WireError`s naming the QP and the work request.
//!
//! Soundness: a posted work request keeps an `Arc` of its local memory until its completion
//! is polled (or the QP is destroyed), so the NIC never touches freed memory; memory the NIC
//! writes is only ever read through raw copies and atomics, never through Rust references.

//! `discovery` finds devices, `nic` opens a port and registers memory, `qp` runs the queue
//! pairs.

mod discovery;
mod nic;
mod probe;
mod qp;

pub use discovery::{default_device, discover};
pub use nic::{ForeignRegion, GpuMemoryPath, HostRegion, LocalMemory, Nic};
pub use probe::probe_nic;
pub use qp::{MARKER_WR_ID, PreparedQp, Qp, QpAttributes, RecvCompletion, connect_pairs, is_flush};
