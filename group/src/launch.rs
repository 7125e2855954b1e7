//! Which launcher started this process, and where the group meets: [`LaunchInfo::detect`]
//! reads the launcher's variables through an injectable lookup (tests pass a map). The module
//! docs of [`crate::group`] list the variables, the precedence and the ports.

use std::fmt;

use super::error::GroupError;
use super::hostlist::{expand_hostlist, expand_tasks_per_node};

/// An environment lookup: `std::env::var` in a real process, a map in tests.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What started the processes (`backend.launcher` in a result: docs/results.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Launcher {
    /// No launcher: one process runs every rank.
    Single,
    Slurm,
    Torchrun,
    /// Open MPI's `mpirun` or MPICH's Hydra `mpiexec`.
    Mpi,
    /// eptwin's own local spawner ([`crate::spawn()`]).
    Spawn,
}

impl Launcher {
    pub fn as_str(self) -> &'static str {
        match self {
            Launcher::Single => "single",
            Launcher::Slurm => "slurm",
            Launcher::Torchrun => "torchrun",
            Launcher::Mpi => "mpi",
            Launcher::Spawn => "spawn",
        }
    }

    fn parse(value: &str) -> Option<Launcher> {
        [Launcher::Single, Launcher::Slurm, Launcher::Torchrun, Launcher::Mpi, Launcher::Spawn]
            .into_iter()
            .find(|l| l.as_str() == value)
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where process 0 listens and every other process connects, and why there (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterAddr {
    pub host: String,
    pub port: u16,
    /// How host and port were chosen, e.g. "MASTER_ADDR, MASTER_PORT 29500 + 1 (torchrun's
    /// agent store listens on MASTER_PORT)".
    pub origin: String,
}

impl fmt::Display for MasterAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// This process's place in the launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    pub launcher: Launcher,
    pub process_rank: usize,
    pub process_count: usize,
    /// Index among the processes on this node, and how many there are.
    pub local_rank: usize,
    pub local_count: usize,
    /// The node's index when the launcher says it (Slurm, torchrun); Open MPI and MPICH do not.
    pub node_rank: Option<usize>,
    /// This process's host name as the launcher knows it (for messages).
    pub host: String,
    /// `None` for a group of one process (no rendezvous).
    pub master: Option<MasterAddr>,
}

/// First port of the range derived from a job id when the launcher names no port; the range
/// (20000..30000) lies below Linux's ephemeral ports (32768 up).
pub const DERIVED_PORT_BASE: u16 = 20_000;
pub const DERIVED_PORT_SPAN: u16 = 10_000;

impl LaunchInfo {
    /// One process, no launcher.
    pub fn single(host: &str) -> Self {
        LaunchInfo {
            launcher: Launcher::Single,
            process_rank: 0,
            process_count: 1,
            local_rank: 0,
            local_count: 1,
            node_rank: Some(0),
            host: host.to_string(),
            master: None,
        }
    }

    /// Reads this process's own environment; the host falls back to the kernel's host name.
    pub fn from_process_env() -> Result<Self, GroupError> {
        LaunchInfo::detect(&|name| std::env::var(name).ok(), &system_hostname())
    }

    /// Detects the launcher from `env`; `system_host` is this machine's name, used when the
    /// launcher does not name the host.
    pub fn detect(env: EnvLookup<'_>, system_host: &str) -> Result<Self, GroupError> {
        let set = |name: &str| env(name).is_some_and(|v| !v.trim().is_empty());
        let launcher = match env("EPTWIN_LAUNCHER").map(|v| v.trim().to_string()) {
            Some(forced) if !forced.is_empty() => Launcher::parse(&forced).ok_or_else(|| {
                GroupError::Launch(format!(
                    "EPTWIN_LAUNCHER={forced}: expected one of single, slurm, torchrun, mpi, spawn"
                ))
            })?,
            _ if set("RANK") || set("WORLD_SIZE") => {
                // Variables a Slurm job script exported from Slurm's own (RANK=$SLURM_PROCID):
                // the launch is Slurm's, the variables only name the rendezvous.
                if set("SLURM_PROCID")
                    && !set("TORCHELASTIC_RUN_ID")
                    && env("RANK") == env("SLURM_PROCID")
                    && env("WORLD_SIZE") == env("SLURM_NTASKS")
                {
                    Launcher::Slurm
                } else {
                    Launcher::Torchrun
                }
            }
            _ if set("OMPI_COMM_WORLD_RANK") || set("PMI_RANK") => {
                // srun's own PMI plug-ins set PMI_RANK too; an mpirun inside an allocation
                // gives its processes the Slurm variables of its per-node daemons instead.
                let mpi_rank = env("OMPI_COMM_WORLD_RANK").or_else(|| env("PMI_RANK"));
                if set("SLURM_PROCID") && mpi_rank == env("SLURM_PROCID") {
                    Launcher::Slurm
                } else {
                    Launcher::Mpi
                }
            }
            _ if set("SLURM_PROCID") => Launcher::Slurm,
            _ => Launcher::Single,
        };
        let mut info = match launcher {
            Launcher::Single => LaunchInfo::single(system_host),
            Launcher::Torchrun | Launcher::Spawn => torch_style(env, launcher, system_host)?,
            Launcher::Slurm => slurm(env, system_host)?,
            Launcher::Mpi => mpi(env, system_host)?,
        };
        if info.process_count == 1 {
            info.master = None;
        } else if let Some(master) = &mut info.master {
            apply_overrides(env, master)?;
        }
        Ok(info)
    }
}

/// The kernel's host name (`/proc/sys/kernel/hostname`), then `$HOSTNAME`, then "localhost".
pub fn system_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

fn number(env: EnvLookup<'_>, name: &str) -> Result<Option<usize>, GroupError> {
    match env(name) {
        None => Ok(None),
        Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
            GroupError::Launch(format!("{name}={v:?} is not a non-negative whole number"))
        }),
    }
}

fn required(
    env: EnvLookup<'_>,
    name: &str,
    missing: impl FnOnce() -> String,
) -> Result<usize, GroupError> {
    number(env, name)?.ok_or_else(|| GroupError::Launch(missing()))
}

fn port(env: EnvLookup<'_>, name: &str) -> Result<Option<u16>, GroupError> {
    match env(name) {
        None => Ok(None),
        Some(v) => match v.trim().parse::<u16>() {
            Ok(p) if p > 0 => Ok(Some(p)),
            _ => Err(GroupError::Launch(format!("{name}={v:?} is not a TCP port (1 to 65535)"))),
        },
    }
}

/// Checks the numbers every launcher gives against each other.
fn check_counts(
    info: &LaunchInfo,
    names: [&str; 4], // rank, count, local rank, local count
) -> Result<(), GroupError> {
    let [rank, count, local_rank, local_count] = names;
    let bad = |m: String| Err(GroupError::Launch(m));
    if info.process_count == 0 {
        return bad(format!("{count}=0: a group has at least one process"));
    }
    if info.process_rank >= info.process_count {
        return bad(format!(
            "{rank}={} but {count}={}: a process's rank must be below the process count",
            info.process_rank, info.process_count
        ));
    }
    if info.local_count == 0 || info.local_count > info.process_count {
        return bad(format!(
            "{local_count}={} but {count}={}: a node runs between 1 and all of the processes",
            info.local_count, info.process_count
        ));
    }
    if info.local_rank >= info.local_count {
        return bad(format!(
            "{local_rank}={} but {local_count}={}: the local rank must be below the number of \
             processes on the node",
            info.local_rank, info.local_count
        ));
    }
    Ok(())
}

/// torchrun and eptwin's spawner: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
/// MASTER_ADDR, MASTER_PORT.
fn torch_style(
    env: EnvLookup<'_>,
    launcher: Launcher,
    system_host: &str,
) -> Result<LaunchInfo, GroupError> {
    let by = if launcher == Launcher::Spawn {
        "eptwin's spawner (EPTWIN_LAUNCHER=spawn)"
    } else {
        "torchrun"
    };
    let needs = |present: &str, missing: &str, what: &str| {
        format!("{present} is set but {missing} is not: {by} sets both; set {missing} to {what}")
    };
    let rank = required(env, "RANK", || {
        needs("WORLD_SIZE", "RANK", "this process's index (0 to WORLD_SIZE-1)")
    })?;
    let count =
        required(env, "WORLD_SIZE", || needs("RANK", "WORLD_SIZE", "the number of processes"))?;
    let local_rank = required(env, "LOCAL_RANK", || {
        needs("RANK", "LOCAL_RANK", "this process's index on its node")
    })?;
    let local_count = required(env, "LOCAL_WORLD_SIZE", || {
        needs("RANK", "LOCAL_WORLD_SIZE", "the number of processes on this node")
    })?;
    let node_rank = number(env, "GROUP_RANK")?;
    let mut info = LaunchInfo {
        launcher,
        process_rank: rank,
        process_count: count,
        local_rank,
        local_count,
        node_rank,
        host: system_host.to_string(),
        master: None,
    };
    check_counts(&info, ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"])?;
    if count > 1 {
        let host = env("MASTER_ADDR").filter(|h| !h.trim().is_empty()).ok_or_else(|| {
            GroupError::Launch(needs("WORLD_SIZE", "MASTER_ADDR", "the host of process 0"))
        })?;
        let master_port = port(env, "MASTER_PORT")?.ok_or_else(|| {
            GroupError::Launch(needs(
                "WORLD_SIZE",
                "MASTER_PORT",
                "a free TCP port on process 0's host",
            ))
        })?;
        let agent_store = launcher == Launcher::Torchrun
            && env("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let master = if agent_store {
            let shifted = master_port.checked_add(1).ok_or_else(|| {
                GroupError::Launch(
                    "MASTER_PORT=65535 and torchrun's agent store listens on it: eptwin needs \
                     MASTER_PORT + 1; choose a lower --master-port or set EPTWIN_MASTER_PORT"
                        .into(),
                )
            })?;
            MasterAddr {
                host: host.trim().to_string(),
                port: shifted,
                origin: format!(
                    "MASTER_ADDR, MASTER_PORT {master_port} + 1 (torchrun's agent store listens \
                     on MASTER_PORT: TORCHELASTIC_USE_AGENT_STORE=True)"
                ),
            }
        } else {
            MasterAddr {
                host: host.trim().to_string(),
                port: master_port,
                origin: "MASTER_ADDR, MASTER_PORT".into(),
            }
        };
        info.master = Some(master);
    }
    Ok(info)
}

/// srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE;
/// the rendezvous at MASTER_ADDR/MASTER_PORT, else the step's first node and a port derived
/// from SLURM_JOB_ID and SLURM_STEP_ID.
fn slurm(env: EnvLookup<'_>, system_host: &str) -> Result<LaunchInfo, GroupError> {
    fn missing(name: &'static str, what: &'static str) -> impl FnOnce() -> String {
        move || format!("SLURM_PROCID is set but {name} is not: srun sets it ({what})")
    }
    let rank = required(env, "SLURM_PROCID", || "SLURM_PROCID is not set".into())?;
    let count = match number(env, "SLURM_NTASKS")? {
        Some(n) => n,
        None => required(env, "SLURM_NPROCS", missing("SLURM_NTASKS", "the number of tasks"))?,
    };
    let local_rank =
        required(env, "SLURM_LOCALID", missing("SLURM_LOCALID", "the task's index on its node"))?;
    let node_rank =
        required(env, "SLURM_NODEID", missing("SLURM_NODEID", "the node's index in the step"))?;
    let (per_node_name, per_node) = match env("SLURM_STEP_TASKS_PER_NODE") {
        Some(v) => ("SLURM_STEP_TASKS_PER_NODE", Some(v)),
        None => ("SLURM_TASKS_PER_NODE", env("SLURM_TASKS_PER_NODE")),
    };
    let local_count = match per_node {
        Some(list) => {
            let counts = expand_tasks_per_node(&list)
                .map_err(|e| GroupError::Launch(format!("{per_node_name}: {e}")))?;
            *counts.get(node_rank).ok_or_else(|| {
                GroupError::Launch(format!(
                    "SLURM_NODEID={node_rank} but {per_node_name}={list} names {} nodes",
                    counts.len()
                ))
            })?
        }
        None if count == 1 => 1,
        None => {
            return Err(GroupError::Launch(
                "SLURM_PROCID is set but neither SLURM_STEP_TASKS_PER_NODE nor \
                 SLURM_TASKS_PER_NODE is: srun sets them (tasks on each node)"
                    .into(),
            ));
        }
    };
    let host = env("SLURMD_NODENAME").unwrap_or_else(|| system_host.to_string());
    let mut info = LaunchInfo {
        launcher: Launcher::Slurm,
        process_rank: rank,
        process_count: count,
        local_rank,
        local_count,
        node_rank: Some(node_rank),
        host,
        master: None,
    };
    check_counts(&info, ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", per_node_name])?;
    if count > 1 {
        let (addr, addr_origin) = match env("MASTER_ADDR").filter(|h| !h.trim().is_empty()) {
            Some(h) => (h.trim().to_string(), "MASTER_ADDR".to_string()),
            None => {
                let (name, list) = ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"]
                    .into_iter()
                    .find_map(|n| env(n).map(|v| (n, v)))
                    .ok_or_else(|| {
                        GroupError::Launch(
                            "under Slurm without MASTER_ADDR, eptwin meets on the step's first \
                             node, but none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, \
                             SLURM_NODELIST is set: set MASTER_ADDR to the host of task 0"
                                .into(),
                        )
                    })?;
                let hosts = expand_hostlist(&list)
                    .map_err(|e| GroupError::Launch(format!("{name}: {e}")))?;
                (hosts[0].clone(), format!("the first host of {name}"))
            }
        };
        let (master_port, port_origin) = match port(env, "MASTER_PORT")? {
            Some(p) => (p, "MASTER_PORT".to_string()),
            None => {
                let job = required(env, "SLURM_JOB_ID", || {
                    "under Slurm without MASTER_PORT, eptwin derives the port from SLURM_JOB_ID, \
                     which is not set: set MASTER_PORT"
                        .into()
                })?;
                let step = number(env, "SLURM_STEP_ID")?.unwrap_or(0);
                (slurm_port(job, step), "a port derived from SLURM_JOB_ID and SLURM_STEP_ID".into())
            }
        };
        info.master = Some(MasterAddr {
            host: addr,
            port: master_port,
            origin: format!("{addr_origin}, {port_origin}"),
        });
    }
    Ok(info)
}

/// `20000 + (10 × SLURM_JOB_ID + SLURM_STEP_ID mod 10) mod 10000`: steps 0-9 of one job get
/// distinct ports, and a job's ports recur only 1000 jobs later.
pub fn slurm_port(job_id: usize, step_id: usize) -> u16 {
    let offset = (job_id % 1000) * 10 + step_id % 10;
    DERIVED_PORT_BASE + offset as u16
}

/// `20000 + FNV-1a(job key) mod 10000`, for launchers whose job id is a string.
pub fn derived_port(job_key: &str) -> u16 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in job_key.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    DERIVED_PORT_BASE + (hash % u32::from(DERIVED_PORT_SPAN)) as u16
}

/// Open MPI (OMPI_COMM_WORLD_*) or MPICH's Hydra (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
/// MPI_LOCALNRANKS).
fn mpi(env: EnvLookup<'_>, system_host: &str) -> Result<LaunchInfo, GroupError> {
    let open_mpi = env("OMPI_COMM_WORLD_RANK").is_some();
    let (names, flag, job_key) = if open_mpi {
        (
            [
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            ],
            "mpirun -x NAME=value",
            env("OMPI_MCA_ess_base_jobid")
                .map(|v| ("OMPI_MCA_ess_base_jobid", v))
                .or_else(|| env("PMIX_NAMESPACE").map(|v| ("PMIX_NAMESPACE", v))),
        )
    } else {
        (
            ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"],
            "mpiexec -genv NAME value",
            env("PMI_JOBID").map(|v| ("PMI_JOBID", v)),
        )
    };
    let launcher_name = if open_mpi { "Open MPI's mpirun" } else { "MPICH's mpiexec (Hydra)" };
    let mut values = [0usize; 4];
    for (value, name) in values.iter_mut().zip(names) {
        *value = required(env, name, || {
            format!("{} is set but {name} is not: {launcher_name} sets both", names[0])
        })?;
    }
    let host = env("PMIX_HOSTNAME")
        .or_else(|| env("MPIR_CVAR_CH3_INTERFACE_HOSTNAME"))
        .unwrap_or_else(|| system_host.to_string());
    let mut info = LaunchInfo {
        launcher: Launcher::Mpi,
        process_rank: values[0],
        process_count: values[1],
        local_rank: values[2],
        local_count: values[3],
        node_rank: None,
        host,
        master: None,
    };
    check_counts(&info, names)?;
    if info.process_count > 1 {
        let one_node = info.local_count == info.process_count;
        let addr = match env("MASTER_ADDR").filter(|h| !h.trim().is_empty()) {
            Some(h) => (h.trim().to_string(), "MASTER_ADDR"),
            None if one_node => ("127.0.0.1".to_string(), "one node: 127.0.0.1"),
            None => {
                return Err(GroupError::Launch(format!(
                    "{launcher_name} does not say where process 0 runs and the processes span \
                     several nodes: pass MASTER_ADDR (the host of process 0) and MASTER_PORT \
                     ({flag})"
                )));
            }
        };
        let master_port = match (port(env, "MASTER_PORT")?, &job_key) {
            (Some(p), _) => (p, "MASTER_PORT".to_string()),
            (None, Some((name, key))) => (derived_port(key), format!("a port derived from {name}")),
            (None, None) => {
                return Err(GroupError::Launch(format!(
                    "{launcher_name} gives no job id to derive a rendezvous port from: pass \
                     MASTER_PORT, a free TCP port on process 0's host ({flag})"
                )));
            }
        };
        info.master = Some(MasterAddr {
            host: addr.0,
            port: master_port.0,
            origin: format!("{}, {}", addr.1, master_port.1),
        });
    }
    Ok(info)
}

/// EPTWIN_MASTER_ADDR and EPTWIN_MASTER_PORT replace what the launcher gave.
fn apply_overrides(env: EnvLookup<'_>, master: &mut MasterAddr) -> Result<(), GroupError> {
    if let Some(host) = env("EPTWIN_MASTER_ADDR").filter(|h| !h.trim().is_empty()) {
        master.host = host.trim().to_string();
        master.origin = format!("EPTWIN_MASTER_ADDR (instead of {})", master.origin);
    }
    if let Some(p) = port(env, "EPTWIN_MASTER_PORT")? {
        master.port = p;
        master.origin = format!("{}; EPTWIN_MASTER_PORT", master.origin);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn detect(vars: &[(&str, &str)]) -> Result<LaunchInfo, GroupError> {
        let map: BTreeMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LaunchInfo::detect(&|k| map.get(k).cloned(), "thishost")
    }

    fn err(vars: &[(&str, &str)]) -> String {
        detect(vars).expect_err("detection must fail").to_string()
    }

    const TORCHRUN: [(&str, &str); 9] = [
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "3"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("GROUP_RANK", "0"),
        ("MASTER_ADDR", "node0"),
        ("MASTER_PORT", "29500"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("TORCHELASTIC_RUN_ID", "none"),
    ];

    #[test]
    fn no_launcher_is_a_single_process() {
        let info = detect(&[("PATH", "/bin")]).unwrap();
        assert_eq!(info, LaunchInfo::single("thishost"));
        assert_eq!(info.launcher.as_str(), "single");
    }

    #[test]
    fn torchrun_meets_next_to_its_agent_store() {
        let info = detect(&TORCHRUN).unwrap();
        assert_eq!(info.launcher, Launcher::Torchrun);
        assert_eq!(
            (info.process_rank, info.process_count, info.local_rank, info.local_count),
            (3, 8, 3, 4)
        );
        assert_eq!(info.node_rank, Some(0));
        assert_eq!(info.host, "thishost");
        let master = info.master.unwrap();
        assert_eq!((master.host.as_str(), master.port), ("node0", 29501));
        assert!(master.origin.contains("agent store"), "{}", master.origin);
        // Without the agent store (a c10d backend with its own endpoint, or variables set by
        // hand) the port is MASTER_PORT itself.
        let mut own = TORCHRUN.to_vec();
        own.retain(|(k, _)| *k != "TORCHELASTIC_USE_AGENT_STORE");
        assert_eq!(detect(&own).unwrap().master.unwrap().port, 29500);
        let mut top = TORCHRUN.to_vec();
        top[6] = ("MASTER_PORT", "65535");
        assert!(err(&top).contains("MASTER_PORT + 1"), "{}", err(&top));
    }

    #[test]
    fn torchrun_errors_are_precise() {
        let with = |k: &'static str, v: &'static str| {
            let mut vars = TORCHRUN.to_vec();
            vars.retain(|(name, _)| *name != k);
            if !v.is_empty() {
                vars.push((k, v));
            }
            err(&vars)
        };
        assert_eq!(
            with("RANK", "9"),
            "RANK=9 but WORLD_SIZE=8: a process's rank must be below the process count"
        );
        assert_eq!(
            with("MASTER_ADDR", ""),
            "WORLD_SIZE is set but MASTER_ADDR is not: torchrun sets both; set MASTER_ADDR to \
             the host of process 0"
        );
        assert!(with("MASTER_PORT", "").contains("MASTER_PORT is not"));
        assert!(with("MASTER_PORT", "http").contains("MASTER_PORT=\"http\" is not a TCP port"));
        assert!(with("MASTER_PORT", "0").contains("is not a TCP port"));
        assert!(with("RANK", "-1").contains("RANK=\"-1\" is not a non-negative whole number"));
        assert!(with("RANK", "").contains("WORLD_SIZE is set but RANK is not"));
        assert!(with("LOCAL_RANK", "").contains("LOCAL_RANK is not"));
        assert!(with("LOCAL_RANK", "4").contains("LOCAL_RANK=4 but LOCAL_WORLD_SIZE=4"));
        assert!(with("LOCAL_WORLD_SIZE", "9").contains("LOCAL_WORLD_SIZE=9 but WORLD_SIZE=8"));
        assert!(with("WORLD_SIZE", "0").contains("WORLD_SIZE=0"));
        // A single process needs no rendezvous address.
        let one =
            [("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")];
        assert_eq!(detect(&one).unwrap().master, None);
    }

    #[test]
    fn eptwin_spawn_marker_wins_and_does_not_shift_the_port() {
        let mut vars = TORCHRUN.to_vec();
        vars.push(("EPTWIN_LAUNCHER", "spawn"));
        vars.push(("SLURM_PROCID", "0"));
        let info = detect(&vars).unwrap();
        assert_eq!(info.launcher, Launcher::Spawn);
        assert_eq!(info.master.unwrap().port, 29500);
        let e = err(&[("EPTWIN_LAUNCHER", "spawn"), ("WORLD_SIZE", "2")]);
        assert!(e.contains("eptwin's spawner (EPTWIN_LAUNCHER=spawn) sets both"), "{e}");
        assert!(
            err(&[("EPTWIN_LAUNCHER", "pbs")]).contains("EPTWIN_LAUNCHER=pbs: expected one of")
        );
    }

    const SLURM: [(&str, &str); 9] = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "1"),
        ("SLURM_STEP_TASKS_PER_NODE", "4(x2)"),
        ("SLURM_JOB_NODELIST", "gpu[01-04,07],login1"),
        ("SLURM_STEP_NODELIST", "gpu[03-04]"),
        ("SLURM_JOB_ID", "123456"),
        ("SLURMD_NODENAME", "gpu04"),
    ];

    #[test]
    fn slurm_meets_on_the_steps_first_node() {
        let info = detect(&SLURM).unwrap();
        assert_eq!(info.launcher, Launcher::Slurm);
        assert_eq!(
            (info.process_rank, info.process_count, info.local_rank, info.local_count),
            (5, 8, 1, 4)
        );
        assert_eq!((info.node_rank, info.host.as_str()), (Some(1), "gpu04"));
        let master = info.master.unwrap();
        assert_eq!(master.host, "gpu03");
        assert_eq!(master.port, 20_000 + 4560);
        assert_eq!(slurm_port(123_456, 3), 24_563);
        // The job's list when the step's is absent; MASTER_ADDR / MASTER_PORT when set.
        let mut vars = SLURM.to_vec();
        vars.retain(|(k, _)| *k != "SLURM_STEP_NODELIST");
        assert_eq!(detect(&vars).unwrap().master.unwrap().host, "gpu01");
        vars.push(("MASTER_ADDR", "head"));
        vars.push(("MASTER_PORT", "4000"));
        let m = detect(&vars).unwrap().master.unwrap();
        assert_eq!((m.host.as_str(), m.port), ("head", 4000));
    }

    #[test]
    fn slurm_errors_are_precise() {
        let without = |k: &str| {
            let mut vars = SLURM.to_vec();
            vars.retain(|(name, _)| *name != k);
            err(&vars)
        };
        assert!(without("SLURM_LOCALID").contains("SLURM_PROCID is set but SLURM_LOCALID is not"));
        assert!(without("SLURM_NTASKS").contains("SLURM_NTASKS is not"));
        let mut vars = SLURM.to_vec();
        vars.retain(|(k, _)| !k.ends_with("NODELIST"));
        assert!(err(&vars).contains("none of SLURM_STEP_NODELIST"), "{}", err(&vars));
        let mut vars = SLURM.to_vec();
        vars[6] = ("SLURM_STEP_NODELIST", "gpu[03-");
        assert!(err(&vars).contains("SLURM_STEP_NODELIST: host list `gpu[03-`"), "{}", err(&vars));
        let mut vars = SLURM.to_vec();
        vars[4] = ("SLURM_STEP_TASKS_PER_NODE", "4");
        assert!(
            err(&vars).contains("SLURM_NODEID=1 but SLURM_STEP_TASKS_PER_NODE=4 names 1 nodes")
        );
        let mut vars = SLURM.to_vec();
        vars[0] = ("SLURM_PROCID", "8");
        assert!(err(&vars).contains("SLURM_PROCID=8 but SLURM_NTASKS=8"));
        assert!(without("SLURM_JOB_ID").contains("set MASTER_PORT"));
    }

    #[test]
    fn innermost_launcher_wins() {
        // torchrun inside srun: SLURM_PROCID is the agent's (the node's), RANK the worker's.
        let mut vars = SLURM.to_vec();
        vars.extend(TORCHRUN);
        assert_eq!(detect(&vars).unwrap().launcher, Launcher::Torchrun);
        // A job script exporting RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS is a Slurm launch.
        let mut vars = SLURM.to_vec();
        vars.extend([
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "9"),
        ]);
        let info = detect(&vars).unwrap();
        assert_eq!(info.launcher, Launcher::Slurm);
        assert_eq!(info.master.unwrap().port, 9);
        // mpirun inside an allocation: the processes inherit the daemons' Slurm variables.
        let mut vars = SLURM.to_vec();
        vars.extend(OPEN_MPI);
        assert_eq!(detect(&vars).unwrap().launcher, Launcher::Mpi);
        // srun's PMI plug-in sets PMI_RANK equal to SLURM_PROCID: still Slurm.
        let mut vars = SLURM.to_vec();
        vars.extend([("PMI_RANK", "5"), ("PMI_SIZE", "8")]);
        assert_eq!(detect(&vars).unwrap().launcher, Launcher::Slurm);
        // EPTWIN_LAUNCHER forces a launcher over the precedence.
        let mut vars = SLURM.to_vec();
        vars.extend(TORCHRUN);
        vars.push(("EPTWIN_LAUNCHER", "slurm"));
        assert_eq!(detect(&vars).unwrap().launcher, Launcher::Slurm);
    }

    const OPEN_MPI: [(&str, &str); 6] = [
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("OMPI_MCA_ess_base_jobid", "1140719617"),
        ("PMIX_HOSTNAME", "vm"),
    ];

    #[test]
    fn open_mpi_on_one_node_meets_on_loopback() {
        let info = detect(&OPEN_MPI).unwrap();
        assert_eq!(info.launcher, Launcher::Mpi);
        assert_eq!((info.process_rank, info.process_count, info.local_count), (1, 2, 2));
        assert_eq!((info.node_rank, info.host.as_str()), (None, "vm"));
        let m = info.master.unwrap();
        assert_eq!((m.host.as_str(), m.port), ("127.0.0.1", derived_port("1140719617")));
        assert!((20_000..30_000).contains(&m.port));
        // Several nodes: the address must be given.
        let mut vars = OPEN_MPI.to_vec();
        vars[3] = ("OMPI_COMM_WORLD_LOCAL_SIZE", "1");
        vars[2] = ("OMPI_COMM_WORLD_LOCAL_RANK", "0");
        let e = err(&vars);
        assert!(e.contains("pass MASTER_ADDR") && e.contains("mpirun -x NAME=value"), "{e}");
        vars.push(("MASTER_ADDR", "n0"));
        vars.push(("MASTER_PORT", "5000"));
        let m = detect(&vars).unwrap().master.unwrap();
        assert_eq!((m.host.as_str(), m.port), ("n0", 5000));
    }

    #[test]
    fn mpich_needs_a_port() {
        let hydra = [
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "0"),
            ("MPI_LOCALNRANKS", "2"),
        ];
        let e = err(&hydra);
        assert!(
            e.contains("MPICH's mpiexec (Hydra) gives no job id") && e.contains("-genv"),
            "{e}"
        );
        let mut vars = hydra.to_vec();
        vars.push(("MASTER_PORT", "6000"));
        let info = detect(&vars).unwrap();
        assert_eq!(info.launcher, Launcher::Mpi);
        assert_eq!(info.host, "thishost");
        assert_eq!(info.master.unwrap().port, 6000);
        let e = err(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]);
        assert!(e.contains("PMI_RANK is set but MPI_LOCALRANKID is not"), "{e}");
    }

    #[test]
    fn eptwin_master_overrides_apply_last() {
        let mut vars = TORCHRUN.to_vec();
        vars.push(("EPTWIN_MASTER_PORT", "7000"));
        vars.push(("EPTWIN_MASTER_ADDR", "10.0.0.9"));
        let m = detect(&vars).unwrap().master.unwrap();
        assert_eq!((m.host.as_str(), m.port), ("10.0.0.9", 7000));
        assert!(m.origin.contains("EPTWIN_MASTER_PORT"));
    }
}
