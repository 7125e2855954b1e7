//! The crate's one error enum. Every variant carries the coordinates a user needs to find the
//! failure (which call, which GPU, which rank / channel / peer / expert).

use eptwin_engine::api::TransportError;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HwError {
    /// A library or the device is missing: the run is waived.
    #[error("{0}")]
    Unavailable(String),
    /// A CUDA driver call failed.
    #[error("GPU {gpu}: {call} failed: {message}")]
    Cuda { gpu: usize, call: &'static str, message: String },
    /// NVRTC could not compile a module.
    #[error("NVRTC compiling {file} with [{options}]: {log}")]
    Compile { file: String, options: String, log: String },
    /// An NCCL call failed.
    #[error("NCCL {call} failed: {message}")]
    Nccl { call: &'static str, message: String },
    /// A kernel's bounded wait gave up; see [`WaitKind`] for what it waited for.
    #[error("{op}: {what}")]
    KernelTimeout { op: String, what: String },
    /// The host gave up waiting for a launch to complete (the kernel did not exit).
    #[error("{op}: GPU {gpu} did not finish within {timeout_ms} ms")]
    HostTimeout { op: String, gpu: usize, timeout_ms: u64 },
    /// Placement or resources do not allow this plan here (waived).
    #[error("{0}")]
    Unsupported(String),
    /// Something about the plan or the device the backend cannot handle (failed).
    #[error("{context}: {message}")]
    Setup { context: String, message: String },
    #[error("writing the kernel cache {path}: {message}")]
    Cache { path: String, message: String },
    /// The internode wire failed (a proxy, a TCP link, a verbs QP), with the coordinates its
    /// error names (node, peer, QP, tag, offset).
    #[error("internode wire: {0}")]
    Wire(String),
    /// Another process of a multi-process run failed (the line names it, or is the same in
    /// every process that failed).
    #[error("{0}")]
    Processes(String),
}

impl From<eptwin_group::GroupError> for HwError {
    fn from(e: eptwin_group::GroupError) -> Self {
        HwError::Setup { context: "process group".into(), message: e.to_string() }
    }
}

impl From<eptwin_wire::WireError> for HwError {
    /// A wire that cannot run here waives the job; the backend's own failures carried through
    /// the wire (its exchange, its memory) come back as they were; the rest fail the op naming
    /// the wire's coordinates.
    fn from(e: eptwin_wire::WireError) -> Self {
        use eptwin_wire::WireError;
        match e {
            WireError::WireUnavailable { .. } | WireError::CannotRun(_) => {
                HwError::Unsupported(e.to_string())
            }
            WireError::External(inner) => match inner.downcast::<HwError>() {
                Ok(hw) => *hw,
                Err(other) => HwError::Wire(other.to_string()),
            },
            other => HwError::Wire(other.to_string()),
        }
    }
}

impl From<HwError> for TransportError {
    fn from(e: HwError) -> Self {
        match e {
            HwError::Unavailable(m) | HwError::Unsupported(m) => TransportError::Unsupported(m),
            HwError::KernelTimeout { .. } | HwError::HostTimeout { .. } => {
                TransportError::Timeout(e.to_string())
            }
            other => TransportError::Backend { context: "hw".into(), message: other.to_string() },
        }
    }
}

/// What a kernel's bounded spin-wait was waiting for (kernels/cuda/common.cuh `WAIT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitKind {
    NotifyBarrier,
    DispatchOffsets,
    DispatchRingSpace,
    DispatchTail,
    CombineRingSpace,
    CombineTail,
    LlSendDone,
    LlRecvCount,
    LlCombineFlag,
    ProbeFlag,
    DoorbellSlot,
    RdmaCredit,
    RdmaCount,
    RdmaTail,
    NvlSpace,
    NvlTail,
    ForwardStall,
    UnexpectedToken,
    WrongToken,
    ProcessBarrier,
    Unknown(i32),
}

impl WaitKind {
    pub fn from_code(code: i32) -> Self {
        match code {
            1 => WaitKind::NotifyBarrier,
            2 => WaitKind::DispatchOffsets,
            3 => WaitKind::DispatchRingSpace,
            4 => WaitKind::DispatchTail,
            5 => WaitKind::CombineRingSpace,
            6 => WaitKind::CombineTail,
            7 => WaitKind::LlSendDone,
            8 => WaitKind::LlRecvCount,
            9 => WaitKind::LlCombineFlag,
            10 => WaitKind::ProbeFlag,
            11 => WaitKind::ProcessBarrier,
            12 => WaitKind::DoorbellSlot,
            13 => WaitKind::RdmaCredit,
            14 => WaitKind::RdmaCount,
            15 => WaitKind::RdmaTail,
            16 => WaitKind::NvlSpace,
            17 => WaitKind::NvlTail,
            18 => WaitKind::ForwardStall,
            19 => WaitKind::UnexpectedToken,
            20 => WaitKind::WrongToken,
            other => WaitKind::Unknown(other),
        }
    }
}

/// The device-side record of the first timed-out wait (`ErrorRecord` in common.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ErrorRecord {
    pub flag: i32,
    pub kind: i32,
    pub rank: i32,
    pub channel: i32,
    pub peer: i32,
    pub expert: i32,
    pub expected: i32,
    pub observed: i32,
}

impl ErrorRecord {
    /// One line naming who waited for whom, e.g. "rank 3 channel 5 waited for the ring tail of
    /// source rank 2 (wanted > 17, saw 17)".
    pub fn describe(&self, timeout_ms: u64) -> String {
        let who = match self.channel {
            c if c >= 0 => format!("rank {} channel {c}", self.rank),
            _ => format!("rank {}", self.rank),
        };
        let what = match WaitKind::from_code(self.kind) {
            WaitKind::NotifyBarrier => {
                "waited at the notify barrier for all ranks to arrive".to_string()
            }
            WaitKind::DispatchOffsets => {
                format!("waited for the channel offsets of source rank {}", self.peer)
            }
            WaitKind::DispatchRingSpace => {
                format!("waited for ring space on destination rank {}", self.peer)
            }
            WaitKind::DispatchTail => {
                format!("waited for the dispatch ring tail of source rank {}", self.peer)
            }
            WaitKind::CombineRingSpace => {
                format!("waited for combine ring space on rank {}", self.peer)
            }
            WaitKind::CombineTail => {
                format!("waited for the combine ring tail of rank {}", self.peer)
            }
            WaitKind::LlSendDone => {
                format!("waited for its sends to expert {} to finish", self.expert)
            }
            WaitKind::LlRecvCount => format!(
                "waited for the token count of expert {} from source rank {}",
                self.expert, self.peer
            ),
            WaitKind::LlCombineFlag => format!(
                "waited for the combine flag of expert {} (rank {})",
                self.expert, self.peer
            ),
            WaitKind::ProbeFlag => format!("waited for the flag of probe side {}", self.peer),
            WaitKind::DoorbellSlot => {
                "waited for a free doorbell slot (the proxy stopped consuming)".to_string()
            }
            WaitKind::RdmaCredit => {
                format!("waited for RDMA ring credits from rank {}", self.peer)
            }
            WaitKind::RdmaCount => {
                format!("waited for the token count over the wire from rank {}", self.peer)
            }
            WaitKind::RdmaTail => match self.peer {
                p if p >= 0 => format!("waited for the RDMA ring tail of rank {p}"),
                _ => "waited for tokens over the wire to forward".to_string(),
            },
            WaitKind::NvlSpace => format!("waited for forwarding ring space on rank {}", self.peer),
            WaitKind::NvlTail => {
                format!("waited for the forwarding ring tail of rank {}", self.peer)
            }
            WaitKind::ForwardStall => {
                format!("waited for its forwarders to pass the tokens from rank {}", self.peer)
            }
            WaitKind::UnexpectedToken => {
                return format!(
                    "{who} received more tokens from rank {} than its layout allows ({} expected, \
                     token {} arrived)",
                    self.peer, self.expected, self.observed
                );
            }
            WaitKind::WrongToken => {
                return format!(
                    "{who} found token {} in the slot of token {} from rank {}",
                    self.observed, self.expected, self.peer
                );
            }
            WaitKind::ProcessBarrier => format!(
                "waited at the barrier before the timed launch for the other processes ({} of \
                 {} arrivals in)",
                self.observed, self.expected
            ),
            WaitKind::Unknown(k) => format!("waited (unknown wait kind {k})"),
        };
        format!(
            "{who} {what} for more than {timeout_ms} ms (wanted {}, last saw {})",
            self.expected, self.observed
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ErrorRecord` in kernels/cuda/common.cuh: eight `int`s (the host reads it back after
    /// every op).
    #[test]
    fn error_record_matches_the_cuda_declaration() {
        assert_eq!(std::mem::size_of::<ErrorRecord>(), 32);
        assert_eq!(std::mem::offset_of!(ErrorRecord, flag), 0);
        assert_eq!(std::mem::offset_of!(ErrorRecord, kind), 4);
        assert_eq!(std::mem::offset_of!(ErrorRecord, rank), 8);
        assert_eq!(std::mem::offset_of!(ErrorRecord, channel), 12);
        assert_eq!(std::mem::offset_of!(ErrorRecord, peer), 16);
        assert_eq!(std::mem::offset_of!(ErrorRecord, expert), 20);
        assert_eq!(std::mem::offset_of!(ErrorRecord, expected), 24);
        assert_eq!(std::mem::offset_of!(ErrorRecord, observed), 28);
    }

    #[test]
    fn timeout_record_names_the_coordinates() {
        let rec = ErrorRecord {
            flag: 1,
            kind: 4,
            rank: 3,
            channel: 5,
            peer: 2,
            expert: -1,
            expected: 18,
            observed: 17,
        };
        let line = rec.describe(2000);
        assert!(line.contains("rank 3 channel 5"));
        assert!(line.contains("source rank 2"));
        assert!(line.contains("2000 ms"));
        let e: TransportError = HwError::KernelTimeout { op: "dispatch".into(), what: line }.into();
        assert!(matches!(e, TransportError::Timeout(_)));
        let wrong =
            ErrorRecord { kind: 20, rank: 1, channel: 0, peer: 9, expected: 4, observed: 6, ..rec };
        assert_eq!(
            wrong.describe(10),
            "rank 1 channel 0 found token 6 in the slot of token 4 from rank 9"
        );
        let credit = ErrorRecord { kind: 13, ..rec };
        assert!(credit.describe(10).contains("RDMA ring credits from rank 2"));
        let w: TransportError = HwError::Unavailable("no GPU".into()).into();
        assert_eq!(w, TransportError::Unsupported("no GPU".into()));
    }
}
