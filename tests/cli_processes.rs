//! `eptwin run --backend hw` as several processes, on any machine: the process-count check,
//! a run without a GPU waived alike in every process with one result file, and a killed
//! process ending the run for the others within the bound. The runs on a GPU are in
//! `hw/tests/processes.rs` and scripts/h200-cluster.sh.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use eptwin_group::{
    GroupConfig, LaunchInfo, ProcessGroup, SpawnOptions, Timeouts, spawn_with, system_hostname,
};

mod common;
use common::{eptwin, root};

const SCENARIO: &str = "scenarios/h200-ep8-ll-128.toml";
const ROLE: &str = "EPTWIN_CLI_TEST_ROLE";

#[allow(clippy::disallowed_methods)] // real time: the tests bound how long failures take
fn now() -> std::time::Instant {
    std::time::Instant::now()
}

/// Whether the hardware backend can run here: these tests are about machines without a GPU
/// (on the GPU machine the same commands run for real, in scripts/h200-cluster.sh).
fn gpu_here() -> Option<String> {
    use eptwin_engine::api::Transport;
    let hw = eptwin_hw::HwTransport::new(eptwin_hw::HwOptions::default());
    match hw.capabilities().unavailable {
        Some(_) => None,
        None => Some("a GPU is present: the no-GPU expectations do not apply".into()),
    }
}

fn skip(test: &str, reason: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED ({test}): {reason}");
}

#[test]
fn spawned_processes_check_their_count_against_the_scenario() {
    let out = tempfile::tempdir().unwrap();
    let o = eptwin()
        .args(["run", SCENARIO, "--backend", "hw", "--spawn", "2", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    // Checked before any process starts: one line, from the launching process.
    let line = format!(
        "eptwin: error: {SCENARIO}: --spawn 2: the scenario has 8 ranks; 2 processes × 1 rank \
         per process = 2: start 8 processes, or 2 with --ranks-per-process 4"
    );
    assert!(stderr.contains(&line), "{stderr}");
    assert!(!stderr.contains("[p0]") && !stderr.contains("[p1]"), "no process started: {stderr}");
    assert!(o.stdout.is_empty());
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0, "no result for bad input");
    // The simulator runs in one process.
    let o = eptwin().args(["run", SCENARIO, "--spawn", "2"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("add --backend hw"));
}

#[test]
fn without_a_gpu_every_process_is_waived_and_process_zero_writes_the_result() {
    if let Some(reason) = gpu_here() {
        return skip("without_a_gpu_every_process_is_waived...", &reason);
    }
    // Through --spawn: one exit code, process 0's table on stdout as it is, one file.
    let out = tempfile::tempdir().unwrap();
    let o = eptwin()
        .args(["run", SCENARIO, "--backend", "hw", "--spawn", "2", "--ranks-per-process", "4"])
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(77), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(stdout.matches("# eptwin: h200-ep8-ll-128 on hw").count(), 1, "{stdout}");
    assert!(!stdout.contains("[p"), "only process 0 prints, unprefixed: {stdout}");
    let files: Vec<PathBuf> =
        std::fs::read_dir(out.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    assert_eq!(doc["verdict"], "waived");
    assert_eq!(doc["backend"]["processes"], 2);
    assert_eq!(doc["backend"]["launcher"], "spawn");
    assert_eq!(doc["backend"]["wire"], "none");
    assert_eq!(doc["backend"]["hosts"].as_array().unwrap().len(), 2);
    let reason = doc["waived_reason"].as_str().unwrap().to_string();

    // The same processes started by the library's spawner, to see each one's exit and output:
    // every process is waived with the same line, and only process 0 prints or writes.
    let out2 = tempfile::tempdir().unwrap();
    let mut args: Vec<OsString> =
        ["run", SCENARIO, "--backend", "hw", "--ranks-per-process", "4", "--json", "--out"]
            .map(OsString::from)
            .to_vec();
    args.push(out2.path().into());
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_eptwin"));
    let options = SpawnOptions { forward_output: false, ..SpawnOptions::default() };
    let report = spawn_with(2, &exe, &args, &[], &options).unwrap();
    for exit in &report.exits {
        assert_eq!(exit.code, Some(77), "{}: {:?}", exit.describe(), exit.stderr_tail);
    }
    assert_eq!(report.exit_code(), 77);
    let files: Vec<PathBuf> =
        std::fs::read_dir(out2.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    assert_eq!(doc["waived_reason"].as_str(), Some(reason.as_str()));
}

/// Runs only as the stand-in process of `a_killed_process_...` (the role variable set): joins
/// the group as the last process, says so in a file, and waits to be killed.
#[test]
fn stand_in_process() {
    let Ok(ready) = std::env::var(ROLE) else { return };
    let launch = LaunchInfo::from_process_env().unwrap();
    let sha = eptwin_engine::load(&root().join(SCENARIO)).unwrap().sha256;
    let config = GroupConfig {
        launch,
        scenario_sha256: sha,
        eptwin_version: eptwin_engine::VERSION.into(),
        timeouts: Timeouts::from_env(&|k| std::env::var(k).ok()).unwrap(),
    };
    let _group = ProcessGroup::join(&config).unwrap();
    std::fs::write(ready, std::process::id().to_string()).unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

fn launch_env(cmd: &mut Command, rank: usize, count: usize, port: u16) {
    cmd.env("EPTWIN_LAUNCHER", "spawn")
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", count.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", count.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("EPTWIN_RENDEZVOUS_TIMEOUT_S", "20")
        .env("EPTWIN_PEER_TIMEOUT_S", "2")
        .env("EPTWIN_ABORT_GRACE_S", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
}

#[test]
fn a_killed_process_ends_the_run_for_the_others_within_the_bound() {
    if let Some(reason) = gpu_here() {
        return skip("a_killed_process_ends_the_run...", &reason);
    }
    let port = eptwin_group::spawn::free_loopback_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("stand-in-joined");
    // Processes 0-2 are eptwin; process 3 is this test binary standing in, killed once it has
    // joined (the others then wait for it in their first collective).
    let mut eptwins: Vec<Child> = (0..3)
        .map(|rank| {
            let mut cmd = eptwin();
            cmd.args(["run", SCENARIO, "--backend", "hw", "--ranks-per-process", "2", "--out"])
                .arg(dir.path());
            launch_env(&mut cmd, rank, 4, port);
            cmd.spawn().unwrap()
        })
        .collect();
    let mut stand_in = Command::new(std::env::current_exe().unwrap());
    stand_in.args(["--exact", "stand_in_process", "--nocapture", "-q"]).env(ROLE, &ready);
    launch_env(&mut stand_in, 3, 4, port);
    let mut stand_in = stand_in.spawn().unwrap();
    let deadline = now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(now() < deadline, "the stand-in did not join within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Let processes 0-2 reach their first collective (a few milliseconds without a GPU).
    std::thread::sleep(Duration::from_millis(300));
    let pid = stand_in.id();
    stand_in.kill().unwrap();
    let killed_at = now();
    stand_in.wait().unwrap();
    let host = system_hostname();
    for (rank, child) in eptwins.iter_mut().enumerate() {
        while child.try_wait().unwrap().is_none() {
            assert!(killed_at.elapsed() < Duration::from_secs(10), "process {rank} still runs");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // EOF is seen at once: well within the 2 s peer timeout + 1 s grace.
    assert!(killed_at.elapsed() < Duration::from_secs(4), "{:?}", killed_at.elapsed());
    for (rank, child) in eptwins.into_iter().enumerate() {
        let o = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "process {rank}: {stderr}");
        assert!(stderr.starts_with(&format!("eptwin: process {rank} of 4: ")), "{stderr}");
        let cause = format!(
            "process 3 on {host} (pid {pid}) closed its connection during `GPU detection` (it ran ranks 6..7)"
        );
        assert!(stderr.contains(&cause), "process {rank}: {stderr}");
        assert!(o.stdout.is_empty(), "nothing ran, nothing printed");
    }
}

/// `eptwin doctor` under srun on two nodes (three processes; the node names are the launcher's
/// SLURMD_NODENAME, both on this machine): the first process of each node runs the checks and
/// process 0 prints both nodes' reports, each naming the processes it speaks for.
#[test]
fn doctor_under_a_launcher_gathers_one_report_per_node_at_process_zero() {
    let port = eptwin_group::spawn::free_loopback_port().unwrap();
    let nodes = ["node-a", "node-a", "node-b"];
    let children: Vec<Child> = nodes
        .iter()
        .enumerate()
        .map(|(rank, node)| {
            let node_id = usize::from(*node == "node-b");
            let local_id = if rank == 1 { 1 } else { 0 };
            let mut cmd = eptwin();
            cmd.args(["doctor", "--json"])
                .env_remove("RANK")
                .env_remove("WORLD_SIZE")
                .env("SLURM_PROCID", rank.to_string())
                .env("SLURM_NTASKS", "3")
                .env("SLURM_LOCALID", local_id.to_string())
                .env("SLURM_NODEID", node_id.to_string())
                .env("SLURM_STEP_TASKS_PER_NODE", "2,1")
                .env("SLURMD_NODENAME", node)
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("EPTWIN_RENDEZVOUS_TIMEOUT_S", "30")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    let outputs: Vec<_> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    for (rank, o) in outputs.iter().enumerate() {
        assert!(
            matches!(o.status.code(), Some(0 | 1)),
            "process {rank}: {:?}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert!(outputs[1].stdout.is_empty() && outputs[2].stdout.is_empty(), "only process 0 prints");
    let doc: serde_json::Value = serde_json::from_slice(&outputs[0].stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&outputs[0].stdout)));
    assert_eq!(doc["kind"], "eptwin-doctor-nodes");
    let nodes = doc["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{doc}");
    assert_eq!(nodes[0]["host"], "node-a");
    assert_eq!(nodes[0]["processes"], serde_json::json!([0, 1]));
    assert_eq!(nodes[1]["host"], "node-b");
    assert_eq!(nodes[1]["processes"], serde_json::json!([2]));
    for n in nodes {
        assert_eq!(n["report"]["kind"], "eptwin-doctor", "{n}");
        assert!(!n["report"]["findings"].as_array().unwrap().is_empty());
    }
    // The worst node decides process 0's exit.
    let any_failed = nodes
        .iter()
        .any(|n| n["report"]["findings"].as_array().unwrap().iter().any(|f| f["status"] == "fail"));
    assert_eq!(outputs[0].status.code(), Some(i32::from(any_failed)));
}
