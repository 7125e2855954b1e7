//! `eptwin report`, `compare` and `sweep` through the binary: exit codes, files, stdout.
//!
//! The sweep tests hold with any backend outcome: they compare runs with each other (1 vs 2
//! threads, sharded vs whole), so they check the simulator's results once it runs points and
//! the mechanics while it waives them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod common;
use common::{eptwin, run};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("reports/tests/fixtures")
}

/// Every file of a directory with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap())
        })
        .collect()
}

fn worst_code(index: &serde_json::Value) -> i32 {
    let rank = |v: &str| match v {
        "ok" => (0, 0),
        "waived" => (1, 77),
        "failed" => (2, 1),
        _ => (3, 2),
    };
    index["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| rank(p["verdict"].as_str().unwrap()))
        .max()
        .map_or(0, |r| r.1)
}

#[test]
fn report_of_the_fixtures() {
    let out = tempfile::tempdir().unwrap();
    let o = run(eptwin().arg("report").arg(fixtures()).arg("--out").arg(out.path()));
    assert_eq!(o.status.code(), Some(0));
    let stdout = String::from_utf8(o.stdout).unwrap();
    assert!(
        stdout.contains("17 result(s), 1 sweep index(es) (0 point results), 1 trace(s)"),
        "{stdout}"
    );
    for chart in [
        "latency-sim-vs-measured",
        "ep-scaling",
        "vl-isolation-cdf",
        "sweep-qp-depth",
        "timeline-ep16-ll",
    ] {
        assert!(out.path().join(format!("{chart}.png")).is_file(), "{chart}");
        assert!(out.path().join(format!("{chart}.svg")).is_file(), "{chart}");
    }
    assert!(out.path().join("index.html").is_file());

    let o = run(eptwin()
        .args(["report", "--json", "--out"])
        .arg(out.path())
        .arg(fixtures().join("results/sim/ep8-ll.json")));
    assert_eq!(o.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["type"], "report");
    let skipped: Vec<&str> = doc["data"]["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["chart"].as_str().unwrap())
        .collect();
    assert!(skipped.contains(&"ep-scaling") && skipped.contains(&"timeline"), "{skipped:?}");
}

#[test]
fn report_rejects_what_is_not_a_result() {
    let out = tempfile::tempdir().unwrap();
    let o = run(eptwin().arg("report").arg("scenarios/ep16-ll.toml").arg("--out").arg(out.path()));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("scenarios/ep16-ll.toml"));
}

#[test]
fn compare_against_measured_results() {
    let out = tempfile::tempdir().unwrap();
    let o = run(eptwin()
        .args(["compare", "scenarios/h200-ep8-ll-128.toml", "--out"])
        .arg(out.path())
        .arg("--measured")
        .arg("results/h200/h200-ep8-ll-128.json"));
    let stdout = String::from_utf8(o.stdout).unwrap();
    assert!(
        stdout.contains("# h200-ep8-ll-128") && stdout.contains("measured:  1× NVIDIA H200"),
        "{stdout}"
    );
    let sim: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("h200-ep8-ll-128.sim.json")).unwrap(),
    )
    .unwrap();
    let cmp: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("h200-ep8-ll-128.compare.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cmp["kind"], "eptwin-comparison");
    assert_eq!(cmp["measured"]["verdict"], "ok");
    // The measured side is ok, so the exit code is the simulator's verdict.
    let expected = match sim["verdict"].as_str().unwrap() {
        "ok" => 0,
        "waived" => 77,
        _ => 1,
    };
    assert_eq!(o.status.code(), Some(expected));
    if sim["verdict"] == "ok" {
        assert!(cmp["rows"][0]["latency_error_pct"].is_number(), "{cmp}");
    }
}

const SWEEP: &[&str] = &[
    "sweep",
    "scenarios/qp-depth.toml",
    "--set",
    "job.env.NVSHMEM_QP_DEPTH=128,256,512,1024",
    "--set",
    "job.traffic.qps_per_peer=1,2",
];

#[test]
fn sweep_gives_the_same_points_with_one_or_two_threads() {
    let one = tempfile::tempdir().unwrap();
    let two = tempfile::tempdir().unwrap();
    let a = run(eptwin().args(SWEEP).args(["--threads", "1", "--out"]).arg(one.path()));
    let b = run(eptwin().args(SWEEP).args(["--threads", "2", "--out"]).arg(two.path()));
    assert_eq!(a.status.code(), b.status.code());
    assert!(String::from_utf8_lossy(&b.stderr).contains("on 2 thread(s)"));
    let (fa, fb) = (files(one.path()), files(two.path()));
    assert_eq!(fa.len(), 8 * 2 + 1, "8 results, 8 scenario texts, the index: {:?}", fa.keys());
    // Point files name the sweep directory inside them (result `scenario.file`), so compare
    // with that path taken out.
    for (name, bytes) in &fa {
        let x = String::from_utf8_lossy(bytes).replace(&one.path().display().to_string(), "DIR");
        let y =
            String::from_utf8_lossy(&fb[name]).replace(&two.path().display().to_string(), "DIR");
        assert_eq!(x, y, "{name} differs between 1 and 2 threads");
    }
    let index: serde_json::Value = serde_json::from_slice(&fa["index.json"]).unwrap();
    assert_eq!(index["total_points"], 8);
    assert_eq!(index["points"][5]["values"]["job.env.NVSHMEM_QP_DEPTH"], "512");
    assert_eq!(index["points"][5]["values"]["job.traffic.qps_per_peer"], 2);
    assert_eq!(a.status.code(), Some(worst_code(&index)));
    let text = String::from_utf8_lossy(&fa["qp-depth.NVSHMEM_QP_DEPTH-512.qps_per_peer-2.toml"])
        .into_owned();
    assert!(
        text.contains("NVSHMEM_QP_DEPTH = \"512\"") && text.contains("qps_per_peer = 2"),
        "{text}"
    );
}

#[test]
fn sweep_shards_partition_the_grid_and_read_slurm() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(eptwin().args(SWEEP).args(["--shard", "0/3", "--out"]).arg(dir.path()));
    assert!(o.status.code().is_some());
    let o = run(eptwin()
        .args(SWEEP)
        .arg("--out")
        .arg(dir.path())
        .env("SLURM_ARRAY_TASK_ID", "2")
        .env("SLURM_ARRAY_TASK_COUNT", "3")
        .env("SLURM_ARRAY_TASK_MIN", "1"));
    assert!(o.status.code().is_some());
    let o = run(eptwin().args(SWEEP).args(["--shard", "2/3", "--out"]).arg(dir.path()));
    assert!(o.status.code().is_some());
    let mut seen = Vec::new();
    for k in 0..3 {
        let path = dir.path().join(format!("index.shard-{k}-of-3.json"));
        let index: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(index["shard"]["index"], k);
        for p in index["points"].as_array().unwrap() {
            let i = p["index"].as_u64().unwrap();
            assert_eq!(i % 3, k, "point {i} in shard {k}");
            seen.push(i);
        }
    }
    seen.sort();
    assert_eq!(seen, (0..8).collect::<Vec<_>>());
    // The report merges the shards back into one sweep.
    let out = tempfile::tempdir().unwrap();
    let o = run(eptwin().args(["report", "--json", "--out"]).arg(out.path()).arg(dir.path()));
    assert_eq!(o.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mentions_sweep = |list: &serde_json::Value, key: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .filter(|c| c[key].as_str().unwrap().starts_with("sweep-qp-depth"))
            .count()
    };
    let drawn = mentions_sweep(&doc["data"]["charts"], "id");
    let skipped = mentions_sweep(&doc["data"]["skipped"], "chart");
    assert_eq!(drawn + skipped, 1, "one merged sweep: {doc}");
}

#[test]
fn sweep_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let bad = |args: &[&str]| {
        let o = run(eptwin().args(args).arg("--out").arg(dir.path()));
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let e = bad(&["sweep", "scenarios/qp-depth.toml", "--set", "job.traffic.qps_per_pear=1,2"]);
    assert!(e.contains("qps_per_pear"), "{e}");
    let e =
        bad(&["sweep", "scenarios/qp-depth.toml", "--set", "cluster.nodes=2", "--shard", "3/3"]);
    assert!(e.contains("0 <= K < N"), "{e}");
    let e =
        bad(&["sweep", "scenarios/vl-isolation-shared.toml", "--set", "job.env.NVSHMEM_IB_SL=1,2"]);
    assert!(e.contains("job[0] or job[<name>]"), "{e}");
}
