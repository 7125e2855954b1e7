//! Running one scenario as several OS processes: which launcher started this process
//! ([`LaunchInfo`]), the TCP rendezvous and the collectives the hardware backend exchanges
//! handles, endpoints and samples with ([`ProcessGroup`]), eptwin's own local launcher
//! ([`spawn()`]) and the mapping of the scenario's ranks to processes ([`rank_blocks`]).
//! No ssh, no cluster manager: the launcher starts the processes, they meet over TCP at the
//! address every PyTorch cluster already has (`MASTER_ADDR:MASTER_PORT`).
//!
//! # Launchers and the variables read
//!
//! | launcher | rank, count | local rank, count | node | host | rendezvous |
//! |---|---|---|---|---|---|
//! | `spawn` (eptwin's, `EPTWIN_LAUNCHER=spawn`) | `RANK`, `WORLD_SIZE` | `LOCAL_RANK`, `LOCAL_WORLD_SIZE` | `GROUP_RANK` | kernel host name | `MASTER_ADDR`, `MASTER_PORT` (127.0.0.1, a free port) |
//! | torchrun | `RANK`, `WORLD_SIZE` | `LOCAL_RANK`, `LOCAL_WORLD_SIZE` | `GROUP_RANK` | kernel host name | `MASTER_ADDR`, `MASTER_PORT` + 1 when `TORCHELASTIC_USE_AGENT_STORE=True` |
//! | Open MPI | `OMPI_COMM_WORLD_RANK`, `_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK`, `_LOCAL_SIZE` | — | `PMIX_HOSTNAME` | `MASTER_ADDR`/`MASTER_PORT`, else on one node 127.0.0.1 and a port from `OMPI_MCA_ess_base_jobid` (or `PMIX_NAMESPACE`) |
//! | MPICH (Hydra) | `PMI_RANK`, `PMI_SIZE` | `MPI_LOCALRANKID`, `MPI_LOCALNRANKS` | — | `MPIR_CVAR_CH3_INTERFACE_HOSTNAME` | `MASTER_ADDR`/`MASTER_PORT`, else on one node 127.0.0.1 and a port from `PMI_JOBID`; Hydra sets none, so `-genv MASTER_PORT` is needed |
//! | Slurm (srun) | `SLURM_PROCID`, `SLURM_NTASKS` | `SLURM_LOCALID`, `SLURM_STEP_TASKS_PER_NODE` at `SLURM_NODEID` | `SLURM_NODEID` | `SLURMD_NODENAME` | `MASTER_ADDR`, else the first host of `SLURM_STEP_NODELIST` (or `SLURM_JOB_NODELIST`); `MASTER_PORT`, else [`slurm_port`] |
//! | single | 0, 1 | 0, 1 | 0 | kernel host name | none |
//!
//! Open MPI's `OMPI_COMM_WORLD_NODE_RANK` is not the node's index (it counts processes on the
//! node across jobs), so MPI launches report no node rank. `EPTWIN_MASTER_ADDR` and
//! `EPTWIN_MASTER_PORT` replace the address any launcher gives.
//!
//! # Precedence
//!
//! The innermost launcher wins, because an outer launcher's variables are inherited by the
//! inner one's processes and describe the inner launcher, not them: `EPTWIN_LAUNCHER` (set by
//! [`spawn()`], or by a user to force one of `single|slurm|torchrun|mpi|spawn`), then torchrun
//! (`RANK` or `WORLD_SIZE` set; `srun torchrun` gives workers the agent's `SLURM_PROCID`),
//! then MPI (`mpirun` inside an allocation gives its processes the Slurm variables of its
//! per-node daemons), then Slurm, then a single process. Two exceptions keep plain `srun`
//! launches Slurm's: a job script's `RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS` (equal to
//! Slurm's, no `TORCHELASTIC_RUN_ID`), and srun's PMI plug-in's `PMI_RANK` equal to
//! `SLURM_PROCID`.
//!
//! # Ports
//!
//! torchrun's agent already listens on `MASTER_PORT` with its own TCPStore whenever it sets
//! `TORCHELASTIC_USE_AGENT_STORE=True` (the default static rendezvous, `--standalone` and the
//! c10d backend alike, as checked with torchrun 2.x), so eptwin's process 0 listens on
//! `MASTER_PORT + 1` then. Without a port from the launcher: Slurm uses
//! `20000 + (10 × (SLURM_JOB_ID mod 1000) + SLURM_STEP_ID mod 10)`, MPI
//! `20000 + FNV-1a(job id) mod 10000` ([`derived_port`]): below Linux's ephemeral ports, the
//! same in every process of the job. Process 0 listens on every interface; the others
//! connect to `MASTER_ADDR`.
//!
//! # Protocol and timeouts
//!
//! Process 0 accepts connections until every process said hello (magic, rank, count, host,
//! pid, eptwin version, scenario sha256) or [`Timeouts::rendezvous`] passes (120 s by
//! default, `EPTWIN_RENDEZVOUS_TIMEOUT_S`); the others retry connecting until then. A hello
//! with another version, scenario, process count, or a rank already taken ends the
//! rendezvous for everyone with a line naming that process's rank, host and pid.
//! Collectives are a star through process 0 with length-prefixed frames bounded by
//! [`frames::MAX_FRAME_BYTES`]; every call has a label and a timeout, and process 0 checks that
//! every process is in the same collective. Heartbeats go every
//! [`Timeouts::heartbeat_interval`] (1 s); a peer silent for [`Timeouts::peer_silent`]
//! (10 s, `EPTWIN_PEER_TIMEOUT_S`) is dead. A closed connection, a silent peer, a late peer,
//! a refused hello or [`ProcessGroup::abort`] anywhere reaches every process through process
//! 0 at once; every later call returns the same failure ("process 3 on gpu07 (pid 1234)
//! closed its connection during `barrier before dispatch iteration 5`").
//!
//! # Exit codes
//!
//! When a failure arrives while the calling thread is elsewhere (blocked in a GPU wait) and
//! it does not call into the group within [`Timeouts::exit_grace`] (5 s,
//! `EPTWIN_ABORT_GRACE_S`, 0 = never), the group's keeper thread prints the failure and ends
//! the process with [`EXIT_CODE_ABANDONED`] (1). A process therefore ends at most
//! `peer_silent + exit_grace` (15 s by default) after another process stopped, and
//! `exit_grace` after one closed its connection or aborted. [`SpawnReport::exit_code`] is the
//! first failed process's code.

pub mod error;
pub mod frames;
pub mod hostlist;
pub mod launch;
pub mod process_group;
pub mod ranks;
pub mod rendezvous;
pub mod spawn;

pub use error::{Failure, GroupError, PeerId};
pub use launch::{LaunchInfo, Launcher, MasterAddr, derived_port, slurm_port, system_hostname};
pub use process_group::{EXIT_CODE_ABANDONED, GroupConfig, GroupWatch, ProcessGroup, Timeouts};
pub use ranks::{check_blocks_on_one_node, rank_blocks};
pub use spawn::{ProcessExit, SpawnOptions, SpawnReport, spawn, spawn_with};

/// Real time: the group bounds waits on other processes.
#[allow(clippy::disallowed_methods)] // real time: rendezvous, heartbeat and collective bounds
pub(crate) fn now() -> std::time::Instant {
    std::time::Instant::now()
}
