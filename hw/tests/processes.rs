//! One job's ranks in several processes on a GPU: this test binary re-runs itself as the
//! processes (`child_process`, selected by `EPTWIN_PROCESSES_TEST_SCENARIO`, started by the
//! group's spawner); each runs the engine's run loop over its block of ranks through
//! `HwTransport::in_processes`, and process 0 writes the result where the parent reads it. The
//! parent compares every rank's output digest with a single-process run of the same scenario.
//!
//! The comparisons need a GPU and, with processes sharing it, the MPS daemon: they are
//! `#[ignore]`d here and run with `--ignored` by scripts/h200-measure.sh, which starts MPS.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use eptwin_engine::api::{Provenance, RunResult, Verdict};
use eptwin_group::{
    GroupConfig, LaunchInfo, ProcessGroup, SpawnOptions, Timeouts, rank_blocks, spawn_with,
};
use eptwin_hw::processes::Processes;
use eptwin_hw::{HwOptions, HwTransport, RingsWanted};

const SCENARIO: &str = "EPTWIN_PROCESSES_TEST_SCENARIO";
const RANKS_PER_PROCESS: &str = "EPTWIN_PROCESSES_TEST_RANKS_PER_PROCESS";
const OUT: &str = "EPTWIN_PROCESSES_TEST_OUT";

/// The same knobs in every run: the global-ring normal kernels (the cluster kernels need every
/// rank in one launch), no copy probes or NCCL baseline (not what is compared).
fn options() -> HwOptions {
    HwOptions {
        kernel_timeout_ms: 5_000,
        probes: false,
        nccl_baseline: false,
        normal_dispatch_rings: RingsWanted::Global,
        normal_combine_rings: RingsWanted::Global,
        ..HwOptions::from_env()
    }
}

fn plan_of(text: &str) -> eptwin_engine::Plan {
    let loaded = eptwin_engine::parse("processes.toml", text).expect("scenario parses");
    eptwin_engine::Plan::build(&loaded).expect("scenario is valid")
}

/// Runs only as a child (the scenario variable set); a no-op in the parent's test run.
#[test]
fn child_process() {
    let Ok(path) = std::env::var(SCENARIO) else { return };
    let text = std::fs::read_to_string(&path).unwrap();
    let plan = plan_of(&text);
    let per: usize = std::env::var(RANKS_PER_PROCESS).unwrap().parse().unwrap();
    let launch = LaunchInfo::from_process_env().unwrap();
    let ranks = plan.topology.num_ranks() as usize;
    let blocks = rank_blocks(ranks, launch.process_count, Some(per)).unwrap();
    let config = GroupConfig {
        launch: launch.clone(),
        scenario_sha256: plan.scenario_sha256.clone(),
        eptwin_version: eptwin_engine::VERSION.into(),
        timeouts: Timeouts::from_env(&|k| std::env::var(k).ok()).unwrap(),
    };
    let group = ProcessGroup::join(&config).unwrap();
    let procs = Processes::new(group, &launch, blocks);
    let mut hw = HwTransport::in_processes(options(), procs).unwrap();
    let result = eptwin_engine::api::run(&plan, &mut hw, Provenance::default()).unwrap();
    if launch.process_rank == 0 {
        let out = PathBuf::from(std::env::var(OUT).unwrap());
        std::fs::write(out.join("result.json"), result.to_json()).unwrap();
    }
    hw.finish(Duration::from_secs(30)).unwrap();
    std::process::exit(match result.verdict {
        Verdict::Ok => 0,
        Verdict::Waived => 77,
        Verdict::Failed => 1,
    });
}

fn single(text: &str) -> RunResult {
    let mut hw = HwTransport::new(options());
    eptwin_engine::api::run(&plan_of(text), &mut hw, Provenance::default()).unwrap()
}

fn in_processes(text: &str, processes: usize, ranks_per_process: usize) -> RunResult {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, text).unwrap();
    let env: Vec<(OsString, OsString)> = vec![
        (SCENARIO.into(), scenario.into()),
        (RANKS_PER_PROCESS.into(), ranks_per_process.to_string().into()),
        (OUT.into(), dir.path().into()),
    ];
    let args: Vec<OsString> = ["--exact", "child_process", "--nocapture", "--test-threads=1", "-q"]
        .map(OsString::from)
        .to_vec();
    let exe = std::env::current_exe().unwrap();
    let options = SpawnOptions { forward_output: true, ..SpawnOptions::default() };
    let report = spawn_with(processes, &exe, &args, &env, &options).unwrap();
    for exit in &report.exits {
        assert!(exit.success(), "{}: {:?}", exit.describe(), exit.stderr_tail);
    }
    read_result(&dir.path().join("result.json"))
}

fn read_result(path: &Path) -> RunResult {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Both runs ok, and every rank's dispatch and combine outputs byte-identical (digests).
fn assert_same_outputs(one: &RunResult, many: &RunResult, processes: usize) {
    for r in [one, many] {
        assert_eq!(r.verdict, Verdict::Ok, "{:?} {:?}", r.failures, r.waived_reason);
    }
    assert_eq!(many.backend["processes"], processes);
    let digests = |r: &RunResult| {
        r.measurements
            .iter()
            .filter(|(k, _)| k.starts_with("hw.output_digest."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    let ranks = one.jobs[0].ranks as usize;
    assert_eq!(digests(one).len(), 2 * ranks, "{:?}", digests(one));
    assert_eq!(digests(one), digests(many));
}

fn scenario(name: &str, buffer: &str, workload: &str) -> String {
    format!(
        "schema = 1\nname = \"{name}\"\n[cluster]\nprofile = \"h200-single\"\n\
         [[job]]\nname = \"ep\"\n[job.buffer]\n{buffer}\n[job.workload]\n{workload}\n"
    )
}

#[test]
#[ignore = "needs a GPU and the MPS daemon (scripts/h200-measure.sh starts it)"]
fn low_latency_in_two_processes_of_four_ranks_matches_one_process() {
    let text = scenario(
        "processes-ll-ep8",
        "low_latency_mode = true\nnum_rdma_bytes = \"1GiB\"\nnum_qps_per_rank = 8",
        "tokens_per_rank = 64\nhidden = 2048\ntopk = 8\nexperts = 64\nmasked_selections = 10\n\
         warmup = 1\niterations = 3",
    );
    assert_same_outputs(&single(&text), &in_processes(&text, 2, 4), 2);
}

#[test]
#[ignore = "needs a GPU and the MPS daemon (scripts/h200-measure.sh starts it)"]
fn normal_in_eight_processes_matches_one_process() {
    let text = scenario(
        "processes-normal-ep8",
        "num_nvl_bytes = \"1GiB\"\nnum_sms = 24",
        "tokens_per_rank = 200\nhidden = 2048\ntopk = 8\nexperts = 64\nwarmup = 1\niterations = 3",
    );
    assert_same_outputs(&single(&text), &in_processes(&text, 8, 1), 8);
}
