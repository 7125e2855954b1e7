//! `eptwin calibrate` through the binary: waived without a GPU; from committed measurements (an
//! H100's probe result and DeepEP's one-rank runs) it writes a profile that a scenario names by
//! path, with the source of every value, and prints its table.

mod common;
use common::{eptwin, root, run};

/// One H100 run with every memory probe (results/h100/ll-combine-times/).
const H100_PROBES: &str = "results/h100/ll-combine-times/h200-ep8-ll-4096.json";
const H100_SWEEP: &str = "results/h100/deepep-one-rank/sweep";

#[test]
fn without_a_gpu_calibrate_is_waived() {
    // This test machine has no GPU (the GPU machine runs the ignored hardware tests instead).
    if std::path::Path::new("/dev/nvidia0").exists() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.toml");
    let o = run(eptwin().args(["calibrate", "--out", out.to_str().unwrap()]));
    assert_eq!(o.status.code(), Some(77));
    let stderr = String::from_utf8(o.stderr).unwrap();
    assert!(stderr.contains("calibrate waived: "), "{stderr}");
    assert!(!out.exists());
}

#[test]
fn from_measurements_it_writes_a_profile_a_scenario_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("profiles/my-h100.toml");
    let o = run(eptwin().args([
        "calibrate",
        "--from",
        H100_PROBES,
        "--deepep-runs",
        H100_SWEEP,
        "--base",
        "h100-cx7",
        "--out",
        out.to_str().unwrap(),
    ]));
    assert_eq!(o.status.code(), Some(0));
    let table = String::from_utf8(o.stdout).unwrap();
    assert!(table.contains("gpu.memcpy_bw_gbps"), "{table}");
    assert!(table.contains("deepep.ll_dispatch_fixed_ns"), "{table}");
    assert!(table.contains("DeepEP at one rank against the model"), "{table}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("name = \"my-h100\""), "{text}");
    // Measured values say which probe, on which GPU and driver, when.
    assert!(text.contains(
        "memcpy_bw_gbps = 1502.2 # measured (NVIDIA H100 80GB HBM3, driver 580.159.04, 2026-12-06): probe.memcpy_dtod_bw_gbps"
    ), "{text}");
    // What was not measured is the base's, with its source.
    assert!(text.contains("link_gbps = 50 # from h100-cx7: NDR 400 Gb/s"), "{text}");
    for line in text
        .lines()
        .skip_while(|l| !l.starts_with('['))
        .filter(|l| l.contains(" = ") && !l.starts_with('#'))
    {
        assert!(line.contains(" # "), "no source on {line:?}");
    }

    // A scenario next to it names it by path and runs on it.
    let scenario = dir.path().join("ep1.toml");
    std::fs::write(
        &scenario,
        std::fs::read_to_string(root().join("results/h100/deepep-one-rank/h100-ep1-ll-32.toml"))
            .unwrap()
            .replace("profile = \"h100-cx7\"", "profile = \"profiles/my-h100.toml\""),
    )
    .unwrap();
    let results = dir.path().join("results");
    let o = run(eptwin().args([
        "run",
        scenario.to_str().unwrap(),
        "--json",
        "--out",
        results.to_str().unwrap(),
    ]));
    assert_eq!(o.status.code(), Some(0));
    let doc: serde_json::Value =
        serde_json::from_str(String::from_utf8(o.stdout).unwrap().lines().last().unwrap()).unwrap();
    assert_eq!(doc["scenario"]["profile_file"]["file"], out.display().to_string());
}

#[test]
fn a_profile_that_is_not_one_is_refused_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "name = \"bad\"\n[gpu]\nsm_count = 0\n").unwrap();
    let o = run(eptwin().args([
        "calibrate",
        "--from",
        H100_PROBES,
        "--base",
        bad.to_str().unwrap(),
        "--out",
        dir.path().join("p.toml").to_str().unwrap(),
    ]));
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8(o.stderr).unwrap();
    assert!(stderr.contains(&format!("--base {} is not a profile", bad.display())), "{stderr}");
}

/// A Python that imports `deep_ep` and, for `tests/test_low_latency.py`, prints DeepEP's lines of
/// the committed H100 run of that shape (and its routing): the sweep's launch, import and fit,
/// without a GPU.
const FAKE_PYTHON: &str = r#"#!/bin/sh
[ "$1" = "-c" ] && exit 0
shift
exec python3 - "$@" <<'PY'
import json, os, shutil, sys
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
run = f"t{a['--num-tokens']}-k{a['--num-topk']}-h{a['--hidden']}"
d = os.path.join(os.environ["SWEEP"], run)
r = json.load(open(os.path.join(d, "result.json")))
shutil.copy(os.path.join(d, "routing.json"), os.environ["EPTWIN_DEEPEP_OUT"])
valid = sum(1 for t in json.load(open(os.path.join(d, "routing.json")))["topk_idx"][0] for e in t if e >= 0)
h = r["hidden"]
db, cb = valid * (h + h // 128 * 4 + 16), valid * h * 2
f, k = r["modes"]["fused"], r["modes"]["hook"]
dt, ct = f["dispatch"]["kernel_us"], f["combine"]["kernel_us"]
print(f"[rank 0] Dispatch bandwidth: {db / 1e3 / dt:.2f} GB/s, avg_t={dt:.2f} us | Combine bandwidth: {cb / 1e3 / ct:.2f} GB/s, avg_t={ct:.2f} us")
print(f"[rank 0] Dispatch send/recv time: {k['dispatch']['send_us']:.2f} + {k['dispatch']['recv_us']:.2f} us | Combine send/recv time: {k['combine']['send_us']:.2f} + {k['combine']['recv_us']:.2f} us")
PY
"#;

#[test]
fn the_one_rank_sweep_launches_imports_and_fits() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let python = dir.path().join("python");
    std::fs::write(&python, FAKE_PYTHON).unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let deepep = dir.path().join("deepep");
    std::fs::create_dir_all(deepep.join("tests")).unwrap();
    std::fs::write(deepep.join("tests/test_low_latency.py"), "").unwrap();
    let out = dir.path().join("p.toml");
    let o = run(eptwin()
        .env("SWEEP", root().join(H100_SWEEP))
        .args(["calibrate", "--from", H100_PROBES, "--base", "h100-cx7", "--out"])
        .arg(&out)
        .arg("--deepep-dir")
        .arg(&deepep)
        .arg("--python")
        .arg(&python));
    assert_eq!(o.status.code(), Some(0));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("ll_dispatch_fixed_ns = "), "{text}");
    assert!(text.contains("10 shapes fused and in hook mode"), "{text}");
    // Each shape's launch script, log, imported results and comparison scenarios.
    let t128 = dir.path().join("p.deepep/t128-k8-h7168");
    for f in [
        "launch.sh",
        "deepep-one-rank-t128-k8-h7168.node0.log",
        "deepep-one-rank-t128-k8-h7168.deepep.json",
        "deepep-one-rank-t128-k8-h7168-hook.deepep.json",
        "routing.json",
        "compare-t128-k8-h7168.toml",
        "compare-t128-k8-h7168-hook.toml",
    ] {
        assert!(t128.join(f).is_file(), "{f}");
    }
    // The comparison scenarios set DeepEP's kernels against the model on the written profile.
    let cmp = dir.path().join("cmp");
    let o = run(eptwin()
        .args(["compare"])
        .arg(t128.join("compare-t128-k8-h7168.toml"))
        .arg(t128.join("compare-t128-k8-h7168-hook.toml"))
        .arg("--measured")
        .arg(&t128)
        .arg("--allow-other-text")
        .arg("--out")
        .arg(&cmp));
    assert_eq!(o.status.code(), Some(0));
    let table = String::from_utf8(o.stdout).unwrap();
    assert!(table.contains("deepep-one-rank-t128-k8-h7168-hook"), "{table}");
}
