//! `GroupError`: the one error type of the process group (launcher detection, rendezvous,
//! collectives, local spawning, rank mapping). A failure of another process names its rank, its
//! host and its pid, and the collective the detecting process was in.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Who a process is, as far as the group knows: rank always; host and pid once it said hello.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerId {
    pub rank: usize,
    pub host: Option<String>,
    pub pid: Option<u32>,
}

impl PeerId {
    pub fn known(rank: usize, host: &str, pid: u32) -> Self {
        PeerId { rank, host: Some(host.to_string()), pid: Some(pid) }
    }

    pub fn rank_only(rank: usize) -> Self {
        PeerId { rank, host: None, pid: None }
    }
}

impl fmt::Display for PeerId {
    /// "process 3 on gpu07 (pid 1234)", or "process 3" before it said hello.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "process {}", self.rank)?;
        if let Some(host) = &self.host {
            write!(f, " on {host}")?;
        }
        if let Some(pid) = self.pid {
            write!(f, " (pid {pid})")?;
        }
        Ok(())
    }
}

/// A failure that ends the run for every process: which process is to blame, what it did (or
/// failed to do), and when the process that noticed it was. Travels between processes as JSON,
/// so every process reports the same line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub peer: PeerId,
    /// A verb phrase: "closed its connection", "aborted the run: REASON".
    pub what: String,
    /// "during `<collective label>`", "after `<label>`", "during the rendezvous at h:p".
    pub when: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.peer, self.what, self.when)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// The launcher's environment variables are missing, malformed or contradict each other.
    #[error("{0}")]
    Launch(String),
    /// A process of the group failed, left, stopped answering, was late, was refused, or
    /// aborted; or process 0 could not be reached.
    #[error("{0}")]
    Peer(Failure),
    /// A socket operation failed outside of a peer's failure (cannot listen, cannot resolve).
    #[error("{context}: {message}")]
    Io { context: String, message: String },
    /// The caller used the group wrongly (a root outside the group, a frame over the bound).
    #[error("{0}")]
    Usage(String),
    /// The processes and the scenario's ranks do not fit together.
    #[error("{0}")]
    RankMapping(String),
    /// Local spawning could not start a process.
    #[error("spawning process {process} ({exe}): {message}")]
    Spawn { process: usize, exe: String, message: String },
}

impl GroupError {
    pub(crate) fn io(context: impl Into<String>, e: &std::io::Error) -> Self {
        GroupError::Io { context: context.into(), message: e.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_name_rank_host_pid_and_the_collective() {
        let f = Failure {
            peer: PeerId::known(3, "gpu07", 1234),
            what: "closed its connection".into(),
            when: "during `barrier before dispatch iteration 5`".into(),
        };
        assert_eq!(
            GroupError::Peer(f).to_string(),
            "process 3 on gpu07 (pid 1234) closed its connection during \
             `barrier before dispatch iteration 5`"
        );
        assert_eq!(PeerId::rank_only(2).to_string(), "process 2");
    }
}
