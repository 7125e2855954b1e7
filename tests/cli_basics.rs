//! The binary's contract: exit codes, positions in errors, the environment lines.

use std::path::Path;
use std::process::{Command, Output};

fn eptwin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_eptwin"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("run eptwin")
}

fn library() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<String> = std::fs::read_dir(root.join("scenarios"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| p.strip_prefix(root).unwrap().display().to_string())
        .collect();
    files.sort();
    files
}

#[test]
fn validate_accepts_the_library() {
    let files = library();
    let mut args = vec!["validate"];
    args.extend(files.iter().map(String::as_str));
    let out = eptwin(&args);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn validate_reports_every_error_with_positions_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.toml");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/ep16-ll.toml"),
    )
    .unwrap()
    .replace("num_qps_per_rank = 18", "num_qps_per_rank = 4")
    .replace("NVSHMEM_IB_SL = \"1\"", "NVSHMEM_IB_SL = \"42\"");
    std::fs::write(&broken, text).unwrap();
    let out = eptwin(&["validate", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = broken.display().to_string();
    assert!(stdout.contains(&format!("{path}:")), "{stdout}");
    assert!(stdout.contains("error[ll-qps-ge-local-experts]"), "{stdout}");
    assert!(stdout.contains("error[ib-sl]"), "{stdout}");
    // A schema error (unknown key) also carries file:line:col.
    std::fs::write(
        &broken,
        "schema = 1\nname = \"x\"\n[cluster]\nprofile = \"h800-cx7\"\nnodez = 2\n",
    )
    .unwrap();
    let out = eptwin(&["validate", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("{path}:5:1: error[parse]")), "{stdout}");
}

#[test]
fn env_prints_deepeps_variables() {
    let out = eptwin(&["env", "scenarios/ep16-ll.toml"]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "export NVSHMEM_CUMEM_GRANULARITY=536870912",
            "export NVSHMEM_DISABLE_MNNVL=1",
            "export NVSHMEM_DISABLE_NVLS=1",
            "export NVSHMEM_DISABLE_P2P=0",
            "export NVSHMEM_IBGDA_NUM_RC_PER_PE=18",
            "export NVSHMEM_IB_ENABLE_IBGDA=1",
            "export NVSHMEM_IB_SL=1",
            "export NVSHMEM_MAX_TEAMS=7",
            "export NVSHMEM_QP_DEPTH=1024",
        ]
    );
    let intranode = eptwin(&["env", "scenarios/ep8-normal-intranode.toml"]);
    assert_eq!(intranode.status.code(), Some(0));
    assert!(intranode.stdout.is_empty(), "intranode normal mode writes none of DeepEP's variables");
}

#[test]
fn hardware_backend_waives_without_a_gpu() {
    if std::env::var_os("EPTWIN_REQUIRE_HW").is_some() {
        return; // on the GPU machine this scenario really runs
    }
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let out =
        eptwin(&["run", "scenarios/h200-ep8-ll-128.toml", "--backend", "hw", "--out", out_dir]);
    assert_eq!(out.status.code(), Some(77), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Waived"), "{stdout}");
    let result = std::fs::read_to_string(dir.path().join("h200-ep8-ll-128.json")).unwrap();
    assert!(result.contains("\"verdict\": \"waived\""));
}

/// A dead rank without shrink mode fails the run as DeepEP does (exit 1, DeepEP's timeout and
/// the rank in the failure); with shrink mode the run is ok and the masked rank is recorded.
#[test]
fn a_dead_rank_exits_1_with_deepeps_timeout_or_is_masked_in_shrink_mode() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let out = eptwin(&["run", "scenarios/faults/ep16-ll-rank-down.toml", "--out", out_dir]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let result = std::fs::read_to_string(dir.path().join("ep16-ll-rank-down.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&result).unwrap();
    assert_eq!(doc["verdict"], "failed");
    let failure = doc["failures"][0].as_str().unwrap();
    for says in ["DeepEP timeout", "NUM_TIMEOUT_CYCLES", "rank 5 down", "t = 101.0"] {
        assert!(failure.contains(says), "{says:?} not in {failure}");
    }
    let out = eptwin(&["run", "scenarios/faults/ep16-ll-rank-down-shrink.toml", "--out", out_dir]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let result = std::fs::read_to_string(dir.path().join("ep16-ll-rank-down-shrink.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&result).unwrap();
    assert_eq!(doc["verdict"], "ok");
    assert_eq!(doc["jobs"][0]["masked_ranks"], serde_json::json!([5]));
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(eptwin(&["run"]).status.code(), Some(2));
    assert_eq!(eptwin(&["run", "does/not/exist.toml"]).status.code(), Some(2));
    let several = eptwin(&["env", "scenarios/vl-isolation-shared.toml"]);
    assert_eq!(several.status.code(), Some(2), "several jobs need --job");
}
