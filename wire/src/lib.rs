//! eptwin's internode wire: how bytes a producer staged in its send region reach a peer
//! process's receive region, behind one CPU-proxy interface (docs/internode-wire.md), and the
//! protocol DeepEP's internode and low-latency kernels speak over it. No GPU is needed: the
//! producers are GPU kernels through mapped pinned memory in the hardware backend, threads in
//! tests and in the protocol's host reference.
//!
//! Layers, bottom up (each uses only those before it):
//!
//! * [`error`] — [`WireError`], the crate's one error, with the coordinates a user needs
//!   (device, port, QP, work request; proxy, peer process, doorbell tag, offset; rank, role).
//! * [`region`] — the memory: owned, or external (`cuMemHostAlloc` pointers) used in place.
//! * [`doorbell`] — the MPSC ring producers publish `Write` / `Flag` records into.
//! * [`link`] — the [`Wire`] trait: what carries the proxy's records to the peers, and the
//!   report a wire gives of itself.
//! * [`proxy`] — the thread that consumes doorbell queues, checks each record against the
//!   regions and hands it to a [`Wire`]. One loop for every wire.
//! * [`tcp`] — the TCP wire (always built): one connection per peer process, length-prefixed
//!   frames, a receiver thread per connection.
//! * [`rdma`] — ibverbs (feature `rdma`): discovery, registration, RC QPs created with a job's
//!   NVSHMEM settings, and the verbs [`Wire`]; without the feature, discovery says why not.
//! * [`faults`] — a scenario's `packet_loss` and `nic_down` as RC transport meets them:
//!   [`faults::FaultyWire`] wraps any [`Wire`] (go-back-N, local ACK timeouts, retries
//!   exhausted).
//! * [`choice`] — which wire runs here (`--wire auto|verbs|tcp`).
//! * [`protocol`] — the internode protocol: geometry and QP table, the `#[repr(C)]` layouts
//!   the kernels take, and its host reference, every token checked.
//! * [`links`] — one process's nodes on the wire: regions and doorbell rings in mapped memory,
//!   the wire to every other node, a proxy per node; endpoints swapped through the caller's
//!   [`links::EndpointExchange`].
//!
//! Ordering guarantee, both wires: the records of one QP are applied at the peer in the order
//! they were published, and a `Flag` is applied (its counter incremented) only after every
//! earlier `Write` of that QP is in the receive region. Verbs gets this from RC execution
//! order (a fetch-and-add executes after the writes before it on the QP); TCP from one
//! in-order byte stream per peer process carrying every QP to that peer, and a receiver that
//! copies a write's payload before it applies any later flag with `fetch_add(Release)`.
//! Consumers read counters with Acquire loads ([`Region::load_u64`]). Records of different
//! QPs are not ordered with each other on verbs; on TCP those to one peer happen to be, which
//! the protocol must not rely on.

pub mod choice;
pub mod doorbell;
pub mod error;
pub mod faults;
pub mod link;
pub mod links;
pub mod protocol;
pub mod proxy;
pub mod rdma;
pub mod region;
pub mod tcp;

pub use choice::{WireChoice, WireRequest, choose, choose_from};
pub use doorbell::{
    Doorbell, DoorbellConsumer, DoorbellKind, DoorbellProducer, QueueClosed, doorbell_queue,
};
pub use error::{LinkFault, Opcode, Site, WireError};
pub use link::{DataPath, ProxyStats, Wire, WireKind, WireReport};
pub use proxy::{Proxy, ProxySpec};
pub use region::Region;
pub use tcp::{TcpEndpoint, TcpReceivers, TcpSetup, TcpTimeouts, TcpWire};
