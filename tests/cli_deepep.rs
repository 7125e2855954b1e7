//! `eptwin deepep launch|import` through the binary: every bundled scenario launches or says
//! why not; the launch text runs (under stand-ins for python, srun and scontrol) and what it
//! prints imports back; an imported LL EP16 log goes through `compare` and `report`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{eptwin, root, run};

fn fixture(name: &str) -> PathBuf {
    root().join("replay/tests/fixtures").join(name)
}

fn scenarios(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            scenarios(&path, out);
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
}

#[test]
fn launch_every_bundled_scenario_or_say_why_not() {
    let mut all = Vec::new();
    scenarios(&root().join("scenarios"), &mut all);
    all.sort();
    assert!(all.len() > 30, "{all:?}");
    let mut refused = Vec::new();
    for path in &all {
        let rel = path.strip_prefix(root()).unwrap().display().to_string();
        let o = run(eptwin().args(["deepep", "launch", &rel]));
        let stdout = String::from_utf8(o.stdout).unwrap();
        let stderr = String::from_utf8(o.stderr).unwrap();
        for line in
            stderr.lines().filter(|l| l.contains(": warning: ") || l.contains(": refused: "))
        {
            // Every reason names the key and both values.
            assert!(line.starts_with(&format!("{rel}: ")), "{line}");
            assert!(line.contains(": the scenario has "), "{line}");
        }
        match o.status.code() {
            Some(0) => {
                let header = stdout.lines().next().unwrap();
                let nodes: u32 = header
                    .split(", ")
                    .last()
                    .and_then(|t| t.split(" node(s)").next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("{rel}: {header}"));
                for node in 0..nodes {
                    assert!(
                        stdout.contains(&format!("WORLD_SIZE={nodes} RANK={node} ")),
                        "{rel}: node {node}\n{stdout}"
                    );
                }
                // V1's scripts, or V2's test_ep.py for an ElasticBuffer job.
                let v2 = std::fs::read_to_string(path).unwrap().contains("api = \"elastic\"");
                let script =
                    if v2 { "DeepEP/tests/elastic/test_ep.py " } else { "DeepEP/tests/test_" };
                assert!(stdout.contains(script), "{rel}: {script}");
                assert!(!stderr.contains(": refused: "), "{rel}");
            }
            Some(2) => {
                assert!(stdout.is_empty(), "{rel}: {stdout}");
                assert!(
                    stderr.contains("DeepEP's test scripts cannot replay this scenario"),
                    "{rel}"
                );
                assert!(stderr.contains(": refused: "), "{rel}: {stderr}");
                refused.push((rel, stderr));
            }
            other => panic!("{rel}: exit {other:?}"),
        }
    }
    let reasons = |name: &str| {
        refused
            .iter()
            .find(|(rel, _)| rel.ends_with(name))
            .map(|(_, e)| e.clone())
            .unwrap_or_else(|| panic!("{name} was not refused"))
    };
    assert!(
        reasons("h200-ep8-ll-128.toml")
            .contains("refused: cluster.ranks_per_gpu: the scenario has 8")
    );
    let shared = reasons("vl-isolation-shared.toml");
    assert!(
        shared.contains("refused: [[job]]: the scenario has 2 jobs (decode, bulk)"),
        "{shared}"
    );
    assert!(shared.contains("refused: job \"bulk\": job.traffic"), "{shared}");
    for launches in [
        "scenarios/validation/deepep-ll-ep16.toml",
        "scenarios/validation/deepep-normal-ep16.toml",
        "scenarios/ep8-normal-intranode.toml",
        "scenarios/nvl72-ll-mnnvl.toml",
        "scenarios/v2-ep16-normal.toml",
        "scenarios/v2-ep16-decode.toml",
        "scenarios/validation/deepep-v2-ep8x2.toml",
    ] {
        assert!(!refused.iter().any(|(rel, _)| rel == launches), "{launches}");
    }
}

/// A stand-in for `python DeepEP/tests/test_low_latency.py ...`: prints the environment it got
/// and one kernel line per local rank (rank r: dispatch 110 + r us, combine 190 + r us; 1,016
/// selections of 7,408 and 14,336 B, as the script's GB/s count them).
const FAKE_PYTHON: &str = r#"#!/bin/bash
script=$1; shift
np=8
args="$*"
while [ $# -gt 0 ]; do
  case $1 in --num-processes) np=$2; shift;; esac
  shift
done
echo "[env] WORLD_SIZE=$WORLD_SIZE RANK=$RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT NVSHMEM_IB_SL=$NVSHMEM_IB_SL script=$script args=$args"
for ((l = 0; l < np; l++)); do
  r=$((RANK * np + l))
  awk -v r=$r 'BEGIN { d = 110 + r; c = 190 + r;
    printf "[rank %d] Dispatch bandwidth: %.2f GB/s, avg_t=%.2f us | Combine bandwidth: %.2f GB/s, avg_t=%.2f us\n",
      r, 1016 * 7408 / 1e3 / d, d, 1016 * 14336 / 1e3 / c, c }'
done
"#;

/// `srun --nodes=N ... CMD...`: CMD once per node with SLURM_NODEID set.
const FAKE_SRUN: &str = r#"#!/bin/bash
n=1
while [[ $1 == --* ]]; do
  case $1 in --nodes=*) n=${1#--nodes=};; esac
  shift
done
for ((i = 0; i < n; i++)); do SLURM_NODEID=$i "$@"; done
"#;

const FAKE_SCONTROL: &str = "#!/bin/bash\necho gpu-node-a\necho gpu-node-b\n";

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

const LL16: &str = "scenarios/validation/deepep-ll-ep16.toml";

fn import_ok(logs: &[PathBuf], out: &Path) -> serde_json::Value {
    let o = run(eptwin()
        .args(["deepep", "import"])
        .args(logs)
        .args(["--scenario", LL16, "--gpu", "NVIDIA H800", "--out"])
        .arg(out));
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("deepep-ll-ep16.deepep.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(doc["backend"]["kind"], "deepep");
    assert_eq!(doc["verdict"], "ok");
    let dispatch = &doc["jobs"][0]["ops"][0];
    assert_eq!(dispatch["op"], "dispatch");
    assert_eq!(dispatch["samples"].as_array().unwrap().len(), 16);
    // Ranks 0..16 printed 110 + r us.
    assert_eq!(dispatch["summary"]["latency_us"]["mean"], 117.5);
    assert_eq!(dispatch["samples"][15]["rank"], 15);
    doc
}

#[test]
fn launch_text_runs_and_its_logs_import_back() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let python = bin.join("fake-python");
    executable(&python, FAKE_PYTHON);
    executable(&bin.join("srun"), FAKE_SRUN);
    executable(&bin.join("scontrol"), FAKE_SCONTROL);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let bash = |script: &str, work: &Path, envs: &[(&str, &str)]| -> Output {
        std::fs::create_dir_all(work).unwrap();
        let file = work.join("launch.sh");
        std::fs::write(&file, script).unwrap();
        let mut c = Command::new("bash");
        c.arg(&file).current_dir(work).env("PATH", &path).env("PYTHON", &python);
        for var in ["MASTER_ADDR", "MASTER_PORT", "SLURM_NODEID", "SLURM_JOB_NUM_NODES"] {
            c.env_remove(var);
        }
        c.envs(envs.iter().copied());
        let o = run(&mut c);
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
        o
    };
    let launch = |extra: &[&str]| -> String {
        let o = run(eptwin().args(["deepep", "launch", LL16]).args(extra));
        assert_eq!(o.status.code(), Some(0));
        String::from_utf8(o.stdout).unwrap()
    };

    // Shell lines, one block per node: both blocks run here, each writes its node's log.
    let work = dir.path().join("shell");
    bash(&launch(&[]), &work, &[("MASTER_ADDR", "10.1.2.3")]);
    let node0 = std::fs::read_to_string(work.join("deepep-ll-ep16.node0.log")).unwrap();
    let node1 = std::fs::read_to_string(work.join("deepep-ll-ep16.node1.log")).unwrap();
    assert!(node0.starts_with("[eptwin] launch scenario=deepep-ll-ep16 "), "{node0}");
    assert!(
        node0.contains("[env] WORLD_SIZE=2 RANK=0 MASTER_ADDR=10.1.2.3 MASTER_PORT=8361 NVSHMEM_IB_SL=0 script=DeepEP/tests/test_low_latency.py args=--num-processes 8 --num-tokens 128 --hidden 7168 --num-topk 8 --num-experts 288"),
        "{node0}"
    );
    assert!(node1.contains("[env] WORLD_SIZE=2 RANK=1 MASTER_ADDR=10.1.2.3 "), "{node1}");
    import_ok(
        &[work.join("deepep-ll-ep16.node1.log"), work.join("deepep-ll-ep16.node0.log")],
        &work.join("out"),
    );

    // --nodes-from-slurm: the same text on every node; rank and master from Slurm.
    let work = dir.path().join("from-slurm");
    let text = launch(&["--nodes-from-slurm"]);
    for node in ["0", "1"] {
        bash(
            &text,
            &work,
            &[
                ("SLURM_NODEID", node),
                ("SLURM_JOB_NUM_NODES", "2"),
                ("SLURM_JOB_NODELIST", "gpu-node-[a-b]"),
            ],
        );
    }
    let node1 = std::fs::read_to_string(work.join("deepep-ll-ep16.node1.log")).unwrap();
    assert!(node1.contains("[env] WORLD_SIZE=2 RANK=1 MASTER_ADDR=gpu-node-a "), "{node1}");
    let doc = import_ok(
        &[work.join("deepep-ll-ep16.node0.log"), work.join("deepep-ll-ep16.node1.log")],
        &work.join("out"),
    );
    assert_eq!(doc["backend"]["launcher"], "slurm");

    // The sbatch script: srun starts one task per node; their output is one log.
    let work = dir.path().join("sbatch");
    let o =
        bash(&launch(&["--format", "slurm"]), &work, &[("SLURM_JOB_NODELIST", "gpu-node-[a-b]")]);
    let log = work.join("job.log");
    std::fs::write(&log, &o.stdout).unwrap();
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("[env] WORLD_SIZE=2 RANK=1 MASTER_ADDR=gpu-node-a "), "{text}");
    import_ok(&[log], &work.join("out"));
}

#[test]
fn import_compare_and_report_an_ll_ep16_log() {
    let dir = tempfile::tempdir().unwrap();
    let measured = dir.path().join("measured");
    let o = run(eptwin()
        .args(["deepep", "import"])
        .arg(fixture("ll-ep16.node0.log"))
        .arg(fixture("ll-ep16.node1.log"))
        .args(["--scenario", LL16, "--gpu", "NVIDIA H800", "--out"])
        .arg(&measured));
    assert_eq!(o.status.code(), Some(0));
    let stdout = String::from_utf8(o.stdout).unwrap();
    assert!(stdout.contains("# eptwin: deepep-ll-ep16 on deepep"), "{stdout}");

    let compared = dir.path().join("compare");
    let o = run(eptwin()
        .args(["compare", LL16, "--out"])
        .arg(&compared)
        .arg("--measured")
        .arg(&measured));
    let stdout = String::from_utf8(o.stdout).unwrap();
    assert!(stdout.contains("measured:  DeepEP test_low_latency.py"), "{stdout}");
    let sim: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(compared.join("deepep-ll-ep16.sim.json")).unwrap(),
    )
    .unwrap();
    let cmp: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(compared.join("deepep-ll-ep16.compare.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cmp["measured"]["backend"], "deepep");
    assert!(cmp["same_scenario_text"].as_bool().unwrap());
    let expected = match sim["verdict"].as_str().unwrap() {
        "ok" => 0,
        "waived" => 77,
        _ => 1,
    };
    assert_eq!(o.status.code(), Some(expected));
    assert_eq!(sim["verdict"], "ok", "the simulator runs LL EP16");
    assert!(cmp["rows"][0]["latency_error_pct"].is_number(), "{cmp}");

    let report = dir.path().join("report");
    let o = run(eptwin().arg("report").arg(&compared).arg(&measured).arg("--out").arg(&report));
    assert_eq!(o.status.code(), Some(0));
    for chart in ["latency-sim-vs-measured", "latency-vs-published"] {
        for ext in ["png", "svg"] {
            let file = report.join(format!("{chart}.{ext}"));
            assert!(std::fs::metadata(&file).is_ok_and(|m| m.len() > 1000), "{}", file.display());
        }
    }
    let svg = std::fs::read_to_string(report.join("latency-sim-vs-measured.svg")).unwrap();
    assert!(svg.contains("DeepEP test_low_latency.py"));
}

#[test]
fn import_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    // A cut-short log: a result with verdict failed, exit 1.
    let o = run(eptwin()
        .args(["deepep", "import"])
        .arg(fixture("ll-ep16-truncated.node0.log"))
        .arg(fixture("ll-ep16.node1.log"))
        .args(["--scenario", LL16, "--gpu", "NVIDIA H800", "--out"])
        .arg(dir.path()));
    assert_eq!(o.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("deepep-ll-ep16.deepep.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(doc["verdict"], "failed");
    // Another configuration: no result, exit 2, both values named.
    let o = run(eptwin()
        .args(["deepep", "import"])
        .arg(fixture("ll-ep16-256-experts.node1.log"))
        .args(["--scenario", LL16, "--gpu", "NVIDIA H800", "--out"])
        .arg(dir.path().join("other")));
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("--num-experts 256 in the log, 288 in the scenario"), "{stderr}");
    assert!(!dir.path().join("other").exists());
}

#[test]
fn import_checks_out_and_logs_before_reading_them_whole() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let o = run(eptwin()
        .args(["deepep", "import"])
        .arg(fixture("ll-ep16.node0.log"))
        .arg(fixture("ll-ep16.node1.log"))
        .args(["--scenario", LL16, "--gpu", "NVIDIA H800", "--out"])
        .arg(&file));
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("--out") && stderr.contains("not a directory"), "{stderr}");
    // A device is refused without being read.
    let o = run(eptwin()
        .args([
            "deepep",
            "import",
            "/dev/zero",
            "--scenario",
            LL16,
            "--gpu",
            "NVIDIA H800",
            "--out",
        ])
        .arg(dir.path().join("out")));
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("/dev/zero: not a regular file (a character device); a DeepEP log is text"),
        "{stderr}"
    );
}
