//! One job's ranks in several OS processes (docs/cluster.md): every process runs the same run
//! loop over its own block of ranks, and the backend meets the others at fixed points through
//! the process group (`crate::group`).
//!
//! * Prepare: each process places the whole job, opens its own GPUs, allocates its own ranks'
//!   buffers and compiles the kernels without talking to anyone; then all of them agree on the
//!   outcome ([`Processes::agree`]: a waiver or failure anywhere ends the run the same way
//!   everywhere). After that the buffers peers write into are exchanged as CUDA IPC handles
//!   ([`share_buffers`]) and the counter of the GPU-side barrier is set up ([`ProcessBarrier`]).
//! * Every op: host-side resets, the GPU-side barrier on each stream (untimed), the timed
//!   launch, the host checks of the process's own ranks; then every process's sample is
//!   gathered and merged ([`merge::merge_ops`]) so that every run loop sees the same one.
//! * A failure in one process is sent to all (`ProcessGroup::abort`); a GPU wait elsewhere
//!   polls the group ([`crate::group::GroupWatch`]) and ends at once.

pub mod ipc;
pub mod merge;

use std::ops::Range;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::HwError;
use eptwin_group::{GroupError, GroupWatch, LaunchInfo, Launcher, ProcessGroup};

pub use ipc::{ProcessBarrier, SharedBuffers, share_buffers};
pub use merge::{ProcessLabel, ProcessOp, SharedError, merge_ops, resolve};

/// How long the processes wait for each other at the agreement after the local part of
/// prepare (kernel compilation included).
pub const PREPARE_TIMEOUT: Duration = Duration::from_secs(600);

/// This process's place in a multi-process run and its connection to the others.
pub struct Processes {
    group: ProcessGroup,
    launcher: Launcher,
    /// The scenario's ranks each process runs, by process.
    blocks: Vec<Range<usize>>,
}

impl Processes {
    /// `blocks` from [`crate::group::rank_blocks`]; `group` joined with the same count.
    pub fn new(group: ProcessGroup, launch: &LaunchInfo, blocks: Vec<Range<usize>>) -> Self {
        Processes { group, launcher: launch.launcher, blocks }
    }

    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    pub fn count(&self) -> usize {
        self.group.count()
    }

    pub fn launcher(&self) -> Launcher {
        self.launcher
    }

    /// The scenario ranks this process runs.
    pub fn my_block(&self) -> Range<usize> {
        self.blocks[self.rank()].clone()
    }

    pub fn blocks(&self) -> &[Range<usize>] {
        &self.blocks
    }

    /// Host names by process.
    pub fn hosts(&self) -> Vec<String> {
        self.group
            .members()
            .iter()
            .map(|m| m.host.clone().unwrap_or_else(|| "unknown".into()))
            .collect()
    }

    pub fn labels(&self) -> Vec<ProcessLabel> {
        self.hosts()
            .into_iter()
            .zip(&self.blocks)
            .enumerate()
            .map(|(process, (host, ranks))| ProcessLabel { process, host, ranks: ranks.clone() })
            .collect()
    }

    /// A group error as the backend reports it: a failed peer also named by the scenario
    /// ranks its process runs (the simulator names a dead rank, the group only a process).
    fn named(&self, e: GroupError) -> HwError {
        let block = match &e {
            GroupError::Peer(f) => self.blocks.get(f.peer.rank).cloned(),
            _ => None,
        };
        let mut err = HwError::from(e);
        if let (Some(ranks), HwError::Setup { message, .. }) = (block, &mut err) {
            message.push_str(&format!(" (it ran {})", merge::ranks_text(&ranks)));
        }
        err
    }

    pub fn watch(&self) -> GroupWatch {
        self.group.watch()
    }

    /// Leaves the group after a last barrier (every process calls it at the end of a run).
    pub fn finish(self, timeout: Duration) -> Result<(), GroupError> {
        self.group.finish(timeout)
    }

    /// Every process's `local` outcome decides for all: see [`merge::resolve`].
    pub fn agree<T: Serialize + DeserializeOwned>(
        &mut self,
        label: &str,
        local: Result<T, HwError>,
        timeout: Duration,
    ) -> Result<Vec<T>, HwError> {
        let shared = local.map_err(|e| SharedError::of(&e));
        let all = self.group.all_gather_json(label, &shared, timeout).map_err(|e| self.named(e))?;
        resolve(all, &self.labels())
    }

    /// [`Processes::agree`] on a local outcome that carries no value.
    pub fn agree_on<T>(
        &mut self,
        label: &str,
        local: Result<T, HwError>,
        timeout: Duration,
    ) -> Result<T, HwError> {
        let (status, value) = match local {
            Ok(v) => (Ok(()), Some(v)),
            Err(e) => (Err(e), None),
        };
        match self.agree(label, status, timeout) {
            Ok(_) => Ok(value.expect("agreed only when this process succeeded")),
            Err(e) => Err(e),
        }
    }

    /// Tells every process that this one failed with `e` and returns the error to report
    /// here: the group's earlier failure when there was one (it is the cause), else `e`.
    pub fn abort(&self, e: HwError) -> HwError {
        if let Some(failure) = self.group.failure() {
            // A no-op but for marking the failure as seen here: the keeper thread leaves the
            // exit to this thread.
            let _ = self.group.abort("");
            return self.named(GroupError::Peer(failure));
        }
        let _ = self.group.abort(&e.to_string());
        e
    }

    pub fn all_gather_json<T: Serialize + DeserializeOwned>(
        &mut self,
        label: &str,
        value: &T,
        timeout: Duration,
    ) -> Result<Vec<T>, HwError> {
        self.group.all_gather_json(label, value, timeout).map_err(|e| self.named(e))
    }

    /// Every process's `bytes`, in process order.
    pub fn all_gather_bytes(
        &mut self,
        label: &str,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, HwError> {
        self.group.all_gather(label, bytes, timeout).map_err(|e| self.named(e))
    }

    pub fn broadcast_json<T: Serialize + DeserializeOwned>(
        &mut self,
        label: &str,
        value: Option<&T>,
        timeout: Duration,
    ) -> Result<T, HwError> {
        self.group.broadcast_json(label, 0, value, timeout).map_err(|e| self.named(e))
    }

    pub fn barrier(&mut self, label: &str, timeout: Duration) -> Result<(), HwError> {
        self.group.barrier(label, timeout).map_err(|e| self.named(e))
    }

    /// Every process's op, merged; the same on every process.
    pub fn merge_op(
        &mut self,
        label: &str,
        local: Result<ProcessOp, HwError>,
        timeout: Duration,
    ) -> Result<ProcessOp, HwError> {
        let all = self.agree(label, local, timeout)?;
        Ok(merge_ops(self.labels().into_iter().zip(all).collect()))
    }
}
