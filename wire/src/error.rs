//! `WireError`: the crate's one error type (the verbs layer, both wires, the proxy, the
//! protocol's host reference and a process's links), carrying the coordinates a user needs to
//! find the failing resource (device, port, QP number, work-request id, opcode, status; proxy,
//! peer process, doorbell tag, offset; rank and role).

use std::fmt;

/// The operation of a work request, named in errors and completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Opcode {
    RdmaWrite,
    RdmaWriteWithImm,
    FetchAndAdd,
    /// A receive posted for WRITE_WITH_IMM (consumes the immediate).
    Recv,
}

impl Opcode {
    /// The verbs name (as `ibv_wr_opcode` spells it), so messages match rdma-core's tools.
    pub fn verbs_name(self) -> &'static str {
        match self {
            Opcode::RdmaWrite => "RDMA_WRITE",
            Opcode::RdmaWriteWithImm => "RDMA_WRITE_WITH_IMM",
            Opcode::FetchAndAdd => "ATOMIC_FETCH_AND_ADD",
            Opcode::Recv => "RECV",
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.verbs_name())
    }
}

/// Where an error happened: device and port, and the QP when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub device: String,
    pub port: u8,
    pub qp_num: Option<u32>,
}

impl Site {
    pub fn port(device: &str, port: u8) -> Self {
        Site { device: device.to_string(), port, qp_num: None }
    }

    pub fn qp(device: &str, port: u8, qp_num: u32) -> Self {
        Site { device: device.to_string(), port, qp_num: Some(qp_num) }
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} port {}", self.device, self.port)?;
        if let Some(qp) = self.qp_num {
            write!(f, " QP {qp:#x}")?;
        }
        Ok(())
    }
}

/// A broken link to a peer process (the TCP wire): the peer vanished (EOF without the closing
/// frame, a reset, a write that failed), never arrived, or sent a frame that is refused. Plain
/// data, so every thread that waits on the link can report the same fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFault {
    /// This process.
    pub local: u32,
    /// The peer process.
    pub peer: u32,
    /// The peer's address as this side knows it.
    pub peer_addr: String,
    /// The frame's coordinates when one frame is at fault.
    pub qp: Option<u32>,
    pub tag: Option<u64>,
    pub offset: Option<u64>,
    pub reason: String,
}

impl fmt::Display for LinkFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "process {}: link to peer process {} ({}): {}",
            self.local, self.peer, self.peer_addr, self.reason
        )?;
        if let Some(qp) = self.qp {
            write!(f, " [QP {qp}")?;
            if let Some(tag) = self.tag {
                write!(f, ", tag {tag}")?;
            }
            if let Some(offset) = self.offset {
                write!(f, ", offset {offset}")?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

fn peer_text(peer: &Option<u32>) -> String {
    match peer {
        Some(p) => format!("peer process {p}"),
        None => "no peer".into(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The binary was compiled without `--features rdma`: no libibverbs is linked.
    #[error(
        "RDMA is unavailable: eptwin was built without the rdma feature (rebuild with `--features rdma`, which needs libibverbs)"
    )]
    NotBuilt,
    /// libibverbs found no usable device (no RDMA NIC, no kernel verbs support, or no port up).
    #[error("no RDMA device: {reason}")]
    NoDevice { reason: String },
    #[error("RDMA device {device:?} not found (devices present: {present})")]
    DeviceNotFound { device: String, present: String },
    /// A verbs control-path call failed (open, query, alloc, create, modify, register).
    #[error("{site}: {call} failed: {source}")]
    Verbs {
        site: Site,
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The caller asked for something the device or port cannot do.
    #[error("{site}: {what}: {reason}")]
    Invalid { site: Site, what: &'static str, reason: String },
    /// A capability the system does not have (GPU memory registration, atomics).
    #[error("{site}: {what} is not supported here: {reason}")]
    Unsupported { site: Site, what: &'static str, reason: String },
    /// Posting would exceed the QP depth (`NVSHMEM_QP_DEPTH`): refused before it reaches the
    /// device, so nothing in flight is overwritten.
    #[error(
        "{site}: WR {wr_id} ({opcode}) refused: {outstanding} work requests outstanding = QP depth {depth}; poll completions first"
    )]
    QueueFull { site: Site, wr_id: u64, opcode: Opcode, depth: u32, outstanding: u32 },
    /// `ibv_post_send`/`ibv_post_recv` rejected the work request.
    #[error("{site}: posting WR {wr_id} ({opcode}) failed: {source}")]
    Post {
        site: Site,
        wr_id: u64,
        opcode: Opcode,
        #[source]
        source: std::io::Error,
    },
    /// A work completion with an error status (the QP is in the error state afterwards).
    #[error(
        "{site}: WR {wr_id} ({opcode}) completed with {status_name} (status {status}, vendor error {vendor_err:#x})"
    )]
    Completion {
        site: Site,
        wr_id: u64,
        opcode: Opcode,
        status: u32,
        status_name: String,
        vendor_err: u32,
    },
    /// A local or remote range outside its registered region.
    #[error(
        "{site}: WR {wr_id} ({opcode}): {side} range {offset}+{len_bytes} outside the {region_bytes}-byte region"
    )]
    OutOfBounds {
        site: Site,
        wr_id: u64,
        opcode: Opcode,
        side: &'static str,
        offset: u64,
        len_bytes: u64,
        region_bytes: u64,
    },
    #[error("{site}: no completion for {what} after {waited_ms} ms")]
    Timeout { site: Site, what: String, waited_ms: u64 },
    /// Out-of-band connection data that cannot be decoded.
    #[error("QP endpoint data: {0}")]
    Endpoint(String),
    /// The CPU proxy stopped (its error, if any, is returned by `Proxy::finish`).
    #[error("proxy {proxy}: {reason}")]
    Proxy { proxy: usize, reason: String },
    /// A doorbell record the proxy refuses: unknown kind, no such QP, a range outside the send
    /// region or the peer's receive region, a misaligned flag.
    #[error(
        "proxy {proxy}: doorbell tag {tag} (kind {kind}) on QP {qp} ({}), offset {offset}: {reason}",
        peer_text(.peer)
    )]
    Doorbell {
        proxy: usize,
        qp: u32,
        peer: Option<u32>,
        tag: u64,
        kind: u32,
        offset: u64,
        reason: String,
    },
    /// The link to a peer process broke or carried a frame that is refused.
    #[error("{0}")]
    Link(LinkFault),
    /// Memory for a region could not be had, or an external pointer is unusable.
    #[error("{what}: {reason}")]
    Memory { what: &'static str, reason: String },
    /// The wire asked for cannot run here (never a silent fallback to another wire).
    #[error("the {requested} wire was requested but is unavailable: {reason}")]
    WireUnavailable { requested: &'static str, reason: String },
    /// Protocol geometry that cannot be laid out (a zero count, a ring without room).
    #[error("internode geometry: {0}")]
    Geometry(String),
    /// A protocol role waited past its bound.
    #[error("rank {rank} {role}: waited {waited_ms} ms for {what}")]
    Stalled { rank: u32, role: String, what: String, waited_ms: u64 },
    /// A received token, row or counter differs from what the routing predicts.
    #[error("rank {rank} {role}: {what}")]
    Mismatch { rank: u32, role: String, what: String },
    /// The wire of a process's nodes failed: a proxy stopped, a link broke, endpoints or a
    /// ring could not be set up (the line names which).
    #[error("{0}")]
    Failed(String),
    /// The job cannot run its wire here as asked (a process that runs part of a node).
    #[error("{0}")]
    CannotRun(String),
    /// A failure of what the caller supplied (the endpoint exchange of its process group, the
    /// mapped memory it allocates), kept as it was so the caller can take it back.
    #[error(transparent)]
    External(Box<dyn std::error::Error + Send + Sync>),
}

impl WireError {
    /// The QP number this error names, if any.
    pub fn qp_num(&self) -> Option<u32> {
        match self {
            WireError::Verbs { site, .. }
            | WireError::Invalid { site, .. }
            | WireError::Unsupported { site, .. }
            | WireError::QueueFull { site, .. }
            | WireError::Post { site, .. }
            | WireError::Completion { site, .. }
            | WireError::OutOfBounds { site, .. }
            | WireError::Timeout { site, .. } => site.qp_num,
            _ => None,
        }
    }

    /// The work-request id this error names, if any.
    pub fn wr_id(&self) -> Option<u64> {
        match self {
            WireError::QueueFull { wr_id, .. }
            | WireError::Post { wr_id, .. }
            | WireError::Completion { wr_id, .. }
            | WireError::OutOfBounds { wr_id, .. } => Some(*wr_id),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_built_says_how_to_fix_it() {
        let text = WireError::NotBuilt.to_string();
        assert!(text.contains("built without the rdma feature"), "{text}");
        assert!(text.contains("--features rdma"), "{text}");
    }

    #[test]
    fn completion_error_names_every_coordinate() {
        let e = WireError::Completion {
            site: Site::qp("mlx5_0", 1, 0x1a2),
            wr_id: 77,
            opcode: Opcode::FetchAndAdd,
            status: 10,
            status_name: "remote access error".into(),
            vendor_err: 0x88,
        };
        let text = e.to_string();
        for needle in [
            "mlx5_0",
            "port 1",
            "QP 0x1a2",
            "WR 77",
            "ATOMIC_FETCH_AND_ADD",
            "remote access error",
            "status 10",
        ] {
            assert!(text.contains(needle), "{needle:?} missing in {text}");
        }
        assert_eq!(e.qp_num(), Some(0x1a2));
        assert_eq!(e.wr_id(), Some(77));
    }

    #[test]
    fn queue_full_names_depth_and_outstanding() {
        let e = WireError::QueueFull {
            site: Site::qp("rxe0", 1, 17),
            wr_id: 5,
            opcode: Opcode::RdmaWrite,
            depth: 128,
            outstanding: 128,
        };
        let text = e.to_string();
        assert!(
            text.contains("QP depth 128") && text.contains("WR 5") && text.contains("QP 0x11"),
            "{text}"
        );
    }
}
