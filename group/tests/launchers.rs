//! The process group across real OS processes: this test binary re-runs itself as the group's
//! processes (`child_process`, selected by `EPTWIN_GROUP_TEST_ROLE`), started by eptwin's
//! spawner, and by torchrun, Open MPI's mpirun and MPICH's mpiexec. The launchers' tests need
//! the launcher: they are `#[ignore]`d and fail naming what is missing when run without it
//! (`.ci/run` installs both MPIs and runs theirs with `--ignored`; torchrun needs PyTorch).
//! Each child writes its outcome to a file the parent reads.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use eptwin_group::{
    GroupConfig, LaunchInfo, ProcessGroup, SpawnOptions, SpawnReport, Timeouts, spawn_with,
    system_hostname,
};

const ROLE: &str = "EPTWIN_GROUP_TEST_ROLE";
const OUT: &str = "EPTWIN_GROUP_TEST_OUT";
const T: Duration = Duration::from_secs(8);

#[allow(clippy::disallowed_methods)] // real time: the tests bound how long failures take
fn now() -> std::time::Instant {
    std::time::Instant::now()
}

// ---------------------------------------------------------------------------------------------
// The child side.

/// Runs only as a child (the role variable set); a no-op in the parent's test run.
#[test]
fn child_process() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let out = PathBuf::from(std::env::var(OUT).expect("the parent names the output folder"));
    let launch = match LaunchInfo::from_process_env() {
        Ok(l) => l,
        Err(e) => {
            std::fs::write(out.join("detect-error"), e.to_string()).unwrap();
            std::process::exit(2);
        }
    };
    let rank = launch.process_rank;
    let (outcome, code) = match child(&role, launch) {
        Ok(line) => (format!("ok {line}"), 0),
        Err(e) => (format!("err {e}"), 1),
    };
    std::fs::write(out.join(format!("p{rank}")), outcome).unwrap();
    std::process::exit(code);
}

/// `role` is `<scenario>` or `<scenario>:<rank>` (the rank that misbehaves).
fn child(role: &str, launch: LaunchInfo) -> Result<String, String> {
    let (scenario, odd) = match role.split_once(':') {
        Some((s, r)) => (s, r.parse::<usize>().ok()),
        None => (role, None),
    };
    let rank = launch.process_rank;
    let odd_one = odd == Some(rank);
    if scenario == "never-arrives" && odd_one {
        std::process::exit(0);
    }
    let mut config = GroupConfig {
        scenario_sha256: "c0ffee".into(),
        eptwin_version: eptwin_engine::VERSION.into(),
        timeouts: Timeouts::from_env(&|k| std::env::var(k).ok()).map_err(|e| e.to_string())?,
        launch: launch.clone(),
    };
    if scenario == "version" && odd_one {
        config.eptwin_version = "0.0.0-other".into();
    }
    let e = |e: eptwin_group::GroupError| e.to_string();
    let mut g = ProcessGroup::join(&config).map_err(e)?;
    let me = rank as u8;
    let n = g.count();
    let master = launch.master.as_ref().map_or(0, |m| m.port);
    let line = format!("launcher={} count={n} master_port={master}", launch.launcher);
    match scenario {
        "collectives" => {
            let all = g.all_gather("all_gather ids", &[me, me ^ 0x5a], T).map_err(e)?;
            let want: Vec<Vec<u8>> = (0..n as u8).map(|r| vec![r, r ^ 0x5a]).collect();
            check(all == want, "all_gather")?;
            let b = g.broadcast("broadcast from 0", 0, &[9, 8, 7, me], T).map_err(e)?;
            check(b == [9, 8, 7, 0], "broadcast from 0")?;
            let last = n - 1;
            let b = g.broadcast("broadcast from last", last, &[me; 5], T).map_err(e)?;
            check(b == [last as u8; 5], "broadcast from the last process")?;
            let gathered = g.gather_to("gather to 1", 1 % n, &[me * 3], T).map_err(e)?;
            let want = (rank == 1 % n).then(|| (0..n as u8).map(|r| vec![r * 3]).collect());
            check(gathered == want, "gather_to 1")?;
            g.barrier("barrier", T).map_err(e)?;
            let hosts = g.all_gather_json("hosts", &launch.host, T).map_err(e)?;
            check(hosts.len() == n, "all_gather_json")?;
            g.finish(T).map_err(e)?;
            Ok(line)
        }
        "exit-mid-run" | "stopped" | "abandoned" => {
            g.barrier("first", T).map_err(e)?;
            if odd_one {
                match scenario {
                    "exit-mid-run" => {
                        // Leaving `first` is not simultaneous: exit once the others are in
                        // the next barrier, as a process dying mid-run would find them.
                        std::thread::sleep(Duration::from_millis(300));
                        std::process::exit(3)
                    }
                    "stopped" => {
                        let pid = std::process::id().to_string();
                        let _ = Command::new("kill").args(["-STOP", &pid]).status();
                        std::thread::sleep(Duration::from_secs(60));
                    }
                    _ => {
                        // Everyone has left `first` by then.
                        std::thread::sleep(Duration::from_millis(300));
                        return Err(g.abort("the test's check failed").to_string());
                    }
                }
            }
            if scenario == "abandoned" && rank == 2 {
                // A calling thread stuck elsewhere (as in a GPU wait): only the keeper can end
                // this process.
                std::thread::sleep(Duration::from_secs(60));
            }
            g.barrier("barrier before dispatch iteration 5", T).map_err(e)?;
            g.finish(T).map_err(e)?;
            Ok(line)
        }
        _ => {
            g.finish(T).map_err(e)?;
            Ok(line)
        }
    }
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok { Ok(()) } else { Err(format!("{what} gave the wrong bytes")) }
}

// ---------------------------------------------------------------------------------------------
// The parent side.

struct Run {
    report: SpawnReport,
    /// Each process's outcome file, by rank.
    outcomes: Vec<Option<String>>,
    elapsed: Duration,
    host: String,
}

impl Run {
    fn outcome(&self, rank: usize) -> &str {
        self.outcomes[rank].as_deref().unwrap_or("(no outcome written)")
    }

    fn pid(&self, rank: usize) -> u32 {
        self.report.exits[rank].pid
    }
}

fn out_dir() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "eptwin-group-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn read_outcomes(dir: &Path, n: usize) -> Vec<Option<String>> {
    let outcomes =
        (0..n).map(|r| std::fs::read_to_string(dir.join(format!("p{r}"))).ok()).collect();
    if let Ok(e) = std::fs::read_to_string(dir.join("detect-error")) {
        panic!("a child could not detect its launcher: {e}");
    }
    let _ = std::fs::remove_dir_all(dir);
    outcomes
}

fn child_args() -> Vec<OsString> {
    ["--exact", "child_process", "--nocapture", "--test-threads=1", "-q"]
        .map(OsString::from)
        .to_vec()
}

fn short_timeouts() -> Vec<(OsString, OsString)> {
    [
        ("EPTWIN_RENDEZVOUS_TIMEOUT_S", "3"),
        ("EPTWIN_PEER_TIMEOUT_S", "1.5"),
        ("EPTWIN_ABORT_GRACE_S", "1"),
    ]
    .map(|(k, v)| (k.into(), v.into()))
    .to_vec()
}

fn spawn_role(role: &str, n: usize) -> Run {
    let dir = out_dir();
    let mut env = short_timeouts();
    env.push((ROLE.into(), role.into()));
    env.push((OUT.into(), dir.clone().into()));
    let started = now();
    let exe = std::env::current_exe().unwrap();
    let options = SpawnOptions {
        kill_grace: Duration::from_secs(5),
        forward_output: false,
        unprefixed_stdout: None,
    };
    let report = spawn_with(n, &exe, &child_args(), &env, &options).expect("spawning works");
    let elapsed = started.elapsed();
    Run { report, outcomes: read_outcomes(&dir, n), elapsed, host: system_hostname() }
}

#[test]
fn four_processes_exchange_the_right_bytes() {
    let run = spawn_role("collectives", 4);
    for r in 0..4 {
        assert!(
            run.report.exits[r].success(),
            "{} ({})",
            run.report.exits[r].describe(),
            run.outcome(r)
        );
        let want = format!("ok launcher=spawn count=4 master_port={}", run.report.master_port);
        assert_eq!(run.outcome(r), want);
    }
    assert_eq!((run.report.first_failure, run.report.exit_code()), (None, 0));
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
}

#[test]
fn a_process_that_exits_mid_run_ends_the_run_for_all() {
    let run = spawn_role("exit-mid-run:2", 4);
    let culprit = format!("process 2 on {} (pid {})", run.host, run.pid(2));
    assert_eq!(run.report.exits[2].code, Some(3));
    // The others fail within a millisecond of process 2: the spawner may see any of them first.
    let first = run.report.first_failure.expect("a failure is reported");
    assert_eq!(run.report.exit_code(), run.report.exits[first].code.unwrap());
    for r in [0, 1, 3] {
        assert_eq!(run.report.exits[r].code, Some(1), "{}", run.outcome(r));
        assert_eq!(
            run.outcome(r),
            format!(
                "err {culprit} closed its connection during `barrier before dispatch iteration 5`"
            )
        );
    }
    // EOF is seen at once: well within the peer timeout.
    assert!(run.elapsed < Duration::from_secs(4), "{:?}", run.elapsed);
}

#[test]
fn a_process_that_never_starts_fails_the_rendezvous_for_all() {
    let run = spawn_role("never-arrives:3", 4);
    for r in [0, 1, 2] {
        let o = run.outcome(r);
        assert_eq!(run.report.exits[r].code, Some(1), "{o}");
        assert!(
            o.starts_with("err process 3 did not arrive within 3.0 s; 3 of 4 processes"),
            "{o}"
        );
        assert!(o.contains(&format!("process 1 on {} (pid {})", run.host, run.pid(1))), "{o}");
        assert!(o.contains("during the rendezvous at 127.0.0.1:"), "{o}");
    }
    assert!(run.elapsed < Duration::from_secs(7), "{:?}", run.elapsed);
}

#[test]
fn process_zero_that_never_starts_fails_the_others() {
    let run = spawn_role("never-arrives:0", 3);
    for r in [1, 2] {
        let o = run.outcome(r);
        assert_eq!(run.report.exits[r].code, Some(1), "{o}");
        assert!(o.starts_with("err process 0 on 127.0.0.1 did not accept a connection"), "{o}");
        assert!(o.contains("within 3.0 s"), "{o}");
    }
    assert!(run.elapsed < Duration::from_secs(7), "{:?}", run.elapsed);
}

#[test]
fn a_different_version_is_refused() {
    let run = spawn_role("version:1", 3);
    let culprit = format!("process 1 on {} (pid {})", run.host, run.pid(1));
    for r in 0..3 {
        let o = run.outcome(r);
        assert_eq!(run.report.exits[r].code, Some(1), "{o}");
        assert!(
            o.starts_with(&format!("err {culprit} runs eptwin 0.0.0-other but process 0")),
            "{o}"
        );
    }
    assert!(run.elapsed < Duration::from_secs(6), "{:?}", run.elapsed);
}

#[test]
fn a_stopped_process_is_declared_dead() {
    let run = spawn_role("stopped:1", 3);
    let culprit = format!("process 1 on {} (pid {})", run.host, run.pid(1));
    for r in [0, 2] {
        let o = run.outcome(r);
        assert_eq!(run.report.exits[r].code, Some(1), "{o}");
        assert!(o.starts_with(&format!("err {culprit} sent nothing for 1.5 s")), "{o}");
    }
    // The stopped process cannot end itself: the spawner kills it after its grace.
    assert!(run.report.exits[1].killed, "{}", run.report.exits[1].describe());
    assert_eq!(run.report.exits[1].signal, Some(9));
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
}

#[test]
fn a_blocked_process_is_ended_by_the_group_after_an_abort() {
    let run = spawn_role("abandoned:1", 4);
    let culprit = format!("process 1 on {} (pid {})", run.host, run.pid(1));
    let line = format!("{culprit} aborted the run: the test's check failed after `first`");
    assert_eq!(run.outcome(1), format!("err {line}"));
    for r in [0, 3] {
        assert_eq!(run.outcome(r), format!("err {line}"));
    }
    // Process 2's calling thread sleeps: the keeper thread ends it with the documented code.
    let blocked = &run.report.exits[2];
    assert_eq!(blocked.code, Some(eptwin_group::EXIT_CODE_ABANDONED), "{}", blocked.describe());
    assert!(!blocked.killed);
    assert_eq!(run.outcomes[2], None);
    let said = blocked.stderr_tail.join("\n");
    assert!(said.contains(&line), "{said}");
    assert!(said.contains("did not come back to the process group within 1.0 s"), "{said}");
    assert!(run.elapsed < Duration::from_secs(5), "{:?}", run.elapsed);
}

// ---------------------------------------------------------------------------------------------
// Real launchers.

fn find_on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names
        .iter()
        .find_map(|name| std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()))
}

/// The launcher a test needs, or the test fails saying what is missing and how to get it.
fn needed(launcher: Option<PathBuf>, what: &str) -> PathBuf {
    launcher.unwrap_or_else(|| panic!("this test needs {what}"))
}

/// Runs a launcher command line for `n` children in the collectives role, bounded in time.
fn launch(mut cmd: Command, n: usize) -> (Vec<Option<String>>, String) {
    let dir = out_dir();
    cmd.env(ROLE, "collectives").env(OUT, &dir).envs(short_timeouts());
    cmd.arg(std::env::current_exe().unwrap()).args(child_args());
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("the launcher starts");
    let deadline = now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the launcher did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{}: {said}", output.status);
    (read_outcomes(&dir, n), said)
}

#[test]
#[ignore = "needs torchrun (PyTorch) on PATH or at EPTWIN_TEST_TORCHRUN"]
fn torchrun_launches_two_processes() {
    let torchrun = std::env::var_os("EPTWIN_TEST_TORCHRUN")
        .map(PathBuf::from)
        .or_else(|| find_on_path(&["torchrun"]));
    let torchrun =
        needed(torchrun, "torchrun on PATH (PyTorch), or EPTWIN_TEST_TORCHRUN set to its path");
    let port = eptwin_group::spawn::free_loopback_port().unwrap();
    let mut cmd = Command::new(torchrun);
    cmd.args(["--no-python", "--nproc-per-node", "2", "--master-port", &port.to_string()]);
    let (outcomes, said) = launch(cmd, 2);
    for o in outcomes {
        // torchrun's agent holds MASTER_PORT itself; the group meets one port up.
        let want = format!("ok launcher=torchrun count=2 master_port={}", port + 1);
        assert_eq!(o.as_deref(), Some(want.as_str()), "{said}");
    }
}

#[test]
#[ignore = "needs Open MPI's mpirun (apt-get install openmpi-bin): .ci/run runs it"]
fn open_mpi_launches_two_processes() {
    let mpirun = needed(
        find_on_path(&["mpirun.openmpi", "orterun", "prterun"]),
        "Open MPI's mpirun (apt-get install openmpi-bin)",
    );
    let mut cmd = Command::new(mpirun);
    cmd.args(["--oversubscribe", "-np", "2"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let (outcomes, said) = launch(cmd, 2);
    for o in outcomes {
        let o = o.unwrap_or_default();
        assert!(o.starts_with("ok launcher=mpi count=2 master_port="), "{o}: {said}");
    }
}

#[test]
#[ignore = "needs MPICH's mpiexec (apt-get install mpich): .ci/run runs it"]
fn mpich_launches_two_processes() {
    let mpiexec = needed(
        find_on_path(&["mpiexec.hydra", "mpirun.mpich", "mpiexec.mpich"]),
        "MPICH's mpiexec, Hydra (apt-get install mpich)",
    );
    let port = eptwin_group::spawn::free_loopback_port().unwrap();
    let mut cmd = Command::new(mpiexec);
    // Hydra gives no job id to derive a port from: the port is passed as users would.
    cmd.args(["-np", "2", "-genv", "MASTER_PORT", &port.to_string()]);
    let (outcomes, said) = launch(cmd, 2);
    for o in outcomes {
        let want = format!("ok launcher=mpi count=2 master_port={port}");
        assert_eq!(o.as_deref(), Some(want.as_str()), "{said}");
    }
}
