//! Data-driven: every scenario of the library (`scenarios/`, `validation/`, `ll-ep-sweep/`)
//! runs on the simulator with verdict ok and sane summaries, and its result document equals its
//! committed insta snapshot in `sim/tests/snapshots/` (the whole document but the provenance
//! that changes per commit, `eptwin.git_commit` and `eptwin.command`), as do the Chrome traces
//! of an InfiniBand and a RoCE packet-level scenario (their sha256 in `traces.snap`). Each
//! scenario runs once; a mismatch names the first differing field. A change meant to move
//! results is accepted with
//! `INSTA_UPDATE=always cargo test --release -p eptwin-sim --test it every_scenario`, which
//! rewrites the snapshots for review in the diff. Without it a mismatch fails: in CI
//! (`CI=true`, or `INSTA_UPDATE=no`) nothing is written; elsewhere insta leaves the new
//! result beside the snapshot as `<name>.snap.new`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use eptwin_engine::api::{Provenance, RunResult, Verdict};
use eptwin_engine::scenario::sha256_hex;
use eptwin_engine::testing::{ScenarioDraft, bundled_scenarios};
use eptwin_sim::{SimOptions, Simulator};
use serde_json::Value;

use crate::util::run;

/// Scenarios whose packet traces are part of the snapshot.
const TRACED: [&str; 2] = ["scenarios/ep16-ll.toml", "scenarios/roce-ep16-ll.toml"];
/// Scenarios that show a fault failing the run, with what their one failure line must say
/// (docs/design.md, "Faults"): everything else must be `ok`.
const FAIL_AS_DEEPEP_DOES: [(&str, &str); 2] = [
    (
        "scenarios/faults/ep16-ll-rank-down.toml",
        "timeout: Warning: DeepEP timeout for dispatch receive, rank ",
    ),
    ("scenarios/faults/ep16-ll-nic-down.toml", "QP(s) failed with IBV_WC_RETRY_EXC_ERR"),
];

fn snapshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots")
}

/// `scenarios/validation/x.toml` → `validation/x` under the snapshot directory (the file is
/// insta's `validation/x.snap`).
fn snapshot_name(scenario: &Path) -> PathBuf {
    scenario.strip_prefix("scenarios").unwrap_or(scenario).with_extension("")
}

/// One scenario's run, as `eptwin run` makes it (and `--trace` for the traced ones).
struct Outcome {
    scenario: PathBuf,
    result: RunResult,
    trace_sha256: Option<String>,
}

fn run_scenario(scenario: &Path) -> Outcome {
    let plan = ScenarioDraft::read(scenario).plan();
    let trace = TRACED.iter().any(|t| Path::new(t) == scenario);
    let mut sim = Simulator::new(SimOptions { trace });
    let provenance =
        Provenance { version: eptwin_engine::VERSION.to_string(), ..Provenance::default() };
    let result = eptwin_engine::api::run(&plan, &mut sim, provenance)
        .unwrap_or_else(|e| panic!("{}: {e}", scenario.display()));
    let trace_sha256 = sim.trace_json().filter(|_| trace).map(|t| sha256_hex(t.as_bytes()));
    Outcome { scenario: scenario.to_path_buf(), result, trace_sha256 }
}

/// Every scenario on a pool of threads (results do not depend on it: each run has its own
/// simulator), in the order given.
fn run_all(scenarios: &[PathBuf]) -> Vec<Outcome> {
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(scenarios.len());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(scenario) = scenarios.get(i) else { break };
                    let outcome = run_scenario(scenario);
                    done.lock().unwrap().push((i, outcome));
                }
            });
        }
    });
    let mut done = done.into_inner().unwrap();
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, o)| o).collect()
}

/// What a result must say for any scenario of the library: ok, every op timed, bytes moved,
/// checks run.
fn sanity(o: &Outcome) -> Vec<String> {
    let (f, r) = (o.scenario.display(), &o.result);
    let mut bad = Vec::new();
    if let Some((_, says)) = FAIL_AS_DEEPEP_DOES.iter().find(|(s, _)| Path::new(s) == o.scenario) {
        if r.verdict != Verdict::Failed || r.failures.len() != 1 || !r.failures[0].contains(says) {
            bad.push(format!("{f}: expected one failure saying {says:?}: {:?}", r.failures));
        }
        return bad;
    }
    if r.verdict != Verdict::Ok {
        bad.push(format!("{f}: verdict {:?}: {:?} {:?}", r.verdict, r.failures, r.waived_reason));
        return bad;
    }
    for job in &r.jobs {
        if job.ops.is_empty() {
            bad.push(format!("{f}: job {} has no ops", job.name));
        }
        for op in &job.ops {
            let s = &op.summary;
            let lat = s.latency_us.mean;
            let at = format!("{f}: {} {}", job.name, op.op);
            if !(lat > 0.0 && lat.is_finite() && lat < 1e6) {
                bad.push(format!("{at}: latency {lat} us"));
            }
            if !(s.latency_us.min <= s.latency_us.p50 && s.latency_us.p50 <= s.latency_us.max) {
                bad.push(format!("{at}: min ≤ p50 ≤ max broken: {:?}", s.latency_us));
            }
            if s.nvlink_bytes + s.rdma_bytes == 0 {
                bad.push(format!("{at}: moved no bytes"));
            }
            // Headers only add bytes on the wire.
            if s.wire_bytes < s.rdma_bytes {
                bad.push(format!("{at}: wire {} < rdma {}", s.wire_bytes, s.rdma_bytes));
            }
            if s.checks.is_empty() {
                bad.push(format!("{at}: ran no checks"));
            }
        }
    }
    bad
}

/// The snapshot of a result: the document with sorted keys, without the provenance that
/// changes per commit.
fn snapshot_of(result: &RunResult) -> String {
    let mut doc = serde_json::to_value(result).expect("results serialise");
    if let Some(provenance) = doc.get_mut("eptwin").and_then(Value::as_object_mut) {
        provenance.remove("git_commit");
        provenance.remove("command");
    }
    let mut text = serde_json::to_string_pretty(&doc).expect("JSON serialises");
    text.push('\n');
    text
}

/// The first leaf where `want` and `got` differ (`jobs[0].ops[1].summary.latency_us.mean`),
/// with both values, and how many leaves differ in all.
fn first_difference(want: &Value, got: &Value) -> Option<(String, String, String, usize)> {
    fn walk(path: &str, want: &Value, got: &Value, out: &mut Vec<(String, String, String)>) {
        match (want, got) {
            (Value::Object(a), Value::Object(b)) => {
                let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
                keys.sort();
                keys.dedup();
                for k in keys {
                    let sub = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    match (a.get(k), b.get(k)) {
                        (Some(x), Some(y)) => walk(&sub, x, y, out),
                        (x, y) => out.push((sub, show(x), show(y))),
                    }
                }
            }
            (Value::Array(a), Value::Array(b)) => {
                for i in 0..a.len().max(b.len()) {
                    let sub = format!("{path}[{i}]");
                    match (a.get(i), b.get(i)) {
                        (Some(x), Some(y)) => walk(&sub, x, y, out),
                        (x, y) => out.push((sub, show(x), show(y))),
                    }
                }
            }
            _ if want != got => out.push((path.to_string(), want.to_string(), got.to_string())),
            _ => {}
        }
    }
    fn show(v: Option<&Value>) -> String {
        v.map_or_else(|| "(absent)".to_string(), Value::to_string)
    }
    let mut diffs = Vec::new();
    walk("", want, got, &mut diffs);
    let count = diffs.len();
    diffs.into_iter().next().map(|(path, a, b)| (path, a, b, count))
}

/// Whether insta rewrites snapshots in place (`INSTA_UPDATE=always`, the bless of a change meant
/// to move results): then stale snapshots are removed too.
fn updating_in_place() -> bool {
    std::env::var("INSTA_UPDATE").is_ok_and(|v| matches!(v.as_str(), "always" | "1" | "force"))
}

/// The contents of an insta snapshot file (what follows its `---` header), if it exists.
fn snapshot_contents(file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    let body = text.strip_prefix("---\n")?;
    let end = body.find("\n---\n")?;
    Some(body[end + 5..].to_string())
}

/// `text` against the insta snapshot `file` (`<name>.snap`): insta compares, and rewrites it
/// under `INSTA_UPDATE=always`; `false` when they differ and insta did not accept the change.
fn insta_matches(file: &Path, text: &str) -> bool {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(file.parent().expect("a snapshot directory"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    let name = file.file_stem().and_then(|s| s.to_str()).expect("a UTF-8 snapshot name");
    let check = || settings.bind(|| insta::assert_snapshot!(name, text));
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)).is_ok()
}

/// Compare each outcome with its snapshot; the problems, each naming the first differing field.
fn check_snapshots(outcomes: &[Outcome]) -> Vec<String> {
    let dir = snapshot_dir();
    let mut bad = Vec::new();
    let mut wanted_files = Vec::new();
    for o in outcomes {
        let path = dir.join(snapshot_name(&o.scenario)).with_extension("snap");
        wanted_files.push(path.clone());
        let now = snapshot_of(&o.result);
        let before = snapshot_contents(&path);
        if insta_matches(&path, &now) {
            continue;
        }
        let Some(before) = before else {
            bad.push(format!("{}: no snapshot {}", o.scenario.display(), path.display()));
            continue;
        };
        let want: Value = serde_json::from_str(&before)
            .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
        let got: Value = serde_json::from_str(&now).unwrap();
        bad.push(match first_difference(&want, &got) {
            Some((at, a, b, n)) => format!(
                "{}: result differs from {} at {at}: snapshot {a}, now {b} ({n} field(s) differ)",
                o.scenario.display(),
                path.display()
            ),
            None => format!("{}: {} differs in layout only", o.scenario.display(), path.display()),
        });
    }
    let traces: String = outcomes
        .iter()
        .filter_map(|o| o.trace_sha256.as_ref().map(|h| format!("{h}  {}\n", o.scenario.display())))
        .collect();
    let traces_path = dir.join("traces.snap");
    wanted_files.push(traces_path.clone());
    let traces_before = snapshot_contents(&traces_path).unwrap_or_default();
    if !insta_matches(&traces_path, &traces) {
        bad.push(format!(
            "packet traces differ from {}:\nsnapshot:\n{traces_before}\nnow:\n{traces}",
            traces_path.display()
        ));
    }
    // A snapshot without its scenario (renamed, removed) is stale; insta's pending
    // `.snap.new` files (written for review outside CI) are not snapshots.
    let is_pending = |f: &PathBuf| f.extension().is_some_and(|e| e == "new" || e == "pending-snap");
    let stale =
        files_under(&dir).into_iter().filter(|f| !wanted_files.contains(f) && !is_pending(f));
    for stale in stale {
        if updating_in_place() {
            std::fs::remove_file(&stale).unwrap();
            println!("INSTA_UPDATE: removed the stale snapshot {}", stale.display());
        } else {
            bad.push(format!("{}: a snapshot of no scenario", stale.display()));
        }
    }
    bad
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn every_scenario_runs_sane_and_matches_its_snapshot() {
    let scenarios = bundled_scenarios();
    assert!(scenarios.len() >= 40, "found {} scenarios", scenarios.len());
    for t in TRACED.into_iter().chain(FAIL_AS_DEEPEP_DOES.map(|(s, _)| s)) {
        assert!(scenarios.contains(&PathBuf::from(t)), "{t} is in the library");
    }
    let outcomes = run_all(&scenarios);
    let mut bad: Vec<String> = outcomes.iter().flat_map(sanity).collect();
    bad.extend(check_snapshots(&outcomes));
    for o in &outcomes {
        for job in &o.result.jobs {
            for op in &job.ops {
                println!(
                    "{:<28} {:<8} {:<9} {:>10.2} us {:>9.2} GB/s",
                    o.result.scenario.name,
                    job.name,
                    op.op,
                    op.summary.latency_us.mean,
                    op.summary.logical_bw_gbps
                );
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{}\n\nIf the change is meant to move results, rewrite the snapshots with\n  \
         INSTA_UPDATE=always cargo test --release -p eptwin-sim --test it every_scenario\nand \
         review them in the diff (sim/scripts/result-diff.py sizes the change).",
        bad.join("\n")
    );
}

#[test]
fn the_first_difference_names_the_field() {
    let want: Value = serde_json::from_str(r#"{"a": [1, {"b": 2.5}], "c": "x"}"#).unwrap();
    let got: Value = serde_json::from_str(r#"{"a": [1, {"b": 2.75}], "d": "x"}"#).unwrap();
    let (at, a, b, n) = first_difference(&want, &got).unwrap();
    assert_eq!((at.as_str(), a.as_str(), b.as_str(), n), ("a[1].b", "2.5", "2.75", 3));
    assert!(first_difference(&want, &want).is_none());
}

#[test]
fn same_scenario_gives_byte_identical_results() {
    // h200-ep8-ll-128: the one-GPU model, whose low-latency phases run the f64 sharing solver.
    for name in ["ep16-ll", "vl-isolation-separate", "ep16-normal-internode", "h200-ep8-ll-128"] {
        let plan = ScenarioDraft::bundled(name).plan();
        let a = run(&plan).to_json();
        let b = run(&plan).to_json();
        assert_eq!(a, b, "{name}: two runs differ");
    }
}

/// Reusing an op's first run for its later iterations gives the per-iteration numbers that
/// running every iteration gives, the low-latency back-to-back lag included (its first
/// dispatch follows nothing, every later op follows the previous one).
#[test]
fn reusing_the_first_run_gives_every_iteration_s_numbers() {
    for name in ["ep16-ll", "ep16-normal-internode", "h200-ep8-ll-128"] {
        let plan = ScenarioDraft::bundled(name)
            .set("job[0].workload.warmup", 1)
            .set("job[0].workload.iterations", 3)
            .plan();
        let mut every = Simulator::new(SimOptions::default()).without_cache();
        let all = eptwin_engine::api::run(&plan, &mut every, Provenance::default()).expect("run");
        let mut once = Simulator::new(SimOptions::default());
        let mut reused =
            eptwin_engine::api::run(&plan, &mut once, Provenance::default()).expect("run");
        // The result says which runs were reused: three of each op's four.
        let tally = reused.measurements.remove(eptwin_sim::REUSED_KEY).expect("a tally");
        let job = &plan.jobs[0].name;
        let want: serde_json::Map<String, Value> =
            plan.jobs[0].ops.iter().map(|op| (format!("{job}.{op}"), Value::from(3))).collect();
        assert_eq!(tally, Value::Object(want), "{name}");
        assert!(!all.measurements.contains_key(eptwin_sim::REUSED_KEY), "{name}");
        assert_eq!(all.to_json(), reused.to_json(), "{name}");
        // Four rounds of each op ran, against one.
        assert_eq!(every.events, 4 * once.events, "{name}");
    }
}

/// IBGDA messages completing when they execute, without their ACK events, give the results
/// of completing them at the ACK's arrival: no QP of these runs gets more posts than its
/// depth, so no depth check can tell (DeepEP V1 low-latency and normal, V2).
#[test]
fn early_ibgda_completions_give_the_ack_events_results() {
    for name in
        ["ep16-ll", "ep16-ll-hook", "roce-ep16-ll", "ep16-normal-internode", "v2-ep16-decode"]
    {
        let plan = ScenarioDraft::bundled(name).plan();
        let mut acks = Simulator::new(SimOptions::default()).without_early_acks();
        let want = eptwin_engine::api::run(&plan, &mut acks, Provenance::default()).expect("run");
        let mut early = Simulator::new(SimOptions::default());
        let got = eptwin_engine::api::run(&plan, &mut early, Provenance::default()).expect("run");
        assert_eq!(want.to_json(), got.to_json(), "{name}");
        assert!(
            early.events < acks.events,
            "{name}: {} events, {} with ACKs",
            early.events,
            acks.events
        );
    }
}

#[test]
fn the_seed_changes_the_workload() {
    let a = run(&ScenarioDraft::bundled("ep16-ll").plan());
    let b = run(&ScenarioDraft::bundled("ep16-ll").set("job[0].workload.seed", 7).plan());
    assert_ne!(
        a.jobs[0].ops[0].summary.latency_us.mean, b.jobs[0].ops[0].summary.latency_us.mean,
        "a different seed routes differently"
    );
}
