//! Hostile files and paths through the binary (issue 45): outputs that are not regular files,
//! inputs that are FIFOs, device links or directory loops, comparisons and reports of
//! impossible or mismatched results, and sweeps and launches out of bounds.
//!
//! Every special file is made in a temporary directory: tests may run as root, where a
//! command replacing `/dev/full` or `/dev/stdout` would really replace them. A command that
//! could hang (a FIFO read, a directory loop) runs under [`bounded`], which kills it and fails
//! the test instead of hanging the suite.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use proptest::prelude::*;

mod common;
use common::{eptwin, root};

/// Run to the end, or kill it after `limit` and fail: a guard against a hang, not a timing.
/// The output is read while it runs (a full pipe would otherwise stop it).
fn bounded(c: &mut Command, limit: Duration) -> Output {
    let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("eptwin runs");
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("eptwin's output"),
        Err(_) => {
            // SAFETY: kills the child this function started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let out = rx.recv().unwrap().unwrap();
            panic!("eptwin hung; stderr:\n{}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

fn run(args: &[&str]) -> Output {
    bounded(eptwin().args(args), Duration::from_secs(120))
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
}

/// Every kind of entry an output path may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Missing,
    Regular,
    ReadOnlyFile,
    Directory,
    Fifo,
    Socket,
    LinkToFile,
    LinkToFifo,
    /// A link to a FIFO named `stdout` in a directory standing for `/dev`.
    DevStdout,
    Dangling,
}

const ENTRIES: [Entry; 10] = [
    Entry::Missing,
    Entry::Regular,
    Entry::ReadOnlyFile,
    Entry::Directory,
    Entry::Fifo,
    Entry::Socket,
    Entry::LinkToFile,
    Entry::LinkToFifo,
    Entry::DevStdout,
    Entry::Dangling,
];

fn replaceable(entry: Entry) -> bool {
    matches!(entry, Entry::Missing | Entry::Regular)
}

/// Make `entry` at `path` (its targets beside it); the listener keeps a socket alive.
fn make(entry: Entry, path: &Path) -> Option<std::os::unix::net::UnixListener> {
    let side = |suffix: &str| PathBuf::from(format!("{}.{suffix}", path.display()));
    match entry {
        Entry::Missing => {}
        Entry::Regular => std::fs::write(path, "old").unwrap(),
        Entry::ReadOnlyFile => {
            std::fs::write(path, "old").unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444)).unwrap();
        }
        Entry::Directory => std::fs::create_dir(path).unwrap(),
        Entry::Fifo => mkfifo(path),
        Entry::Socket => return Some(std::os::unix::net::UnixListener::bind(path).unwrap()),
        Entry::LinkToFile => {
            std::fs::write(side("target"), "old").unwrap();
            std::os::unix::fs::symlink(side("target"), path).unwrap();
        }
        Entry::LinkToFifo => {
            mkfifo(&side("fifo"));
            std::os::unix::fs::symlink(side("fifo"), path).unwrap();
        }
        Entry::DevStdout => {
            std::fs::create_dir(side("dev")).unwrap();
            mkfifo(&side("dev").join("stdout"));
            std::os::unix::fs::symlink(side("dev").join("stdout"), path).unwrap();
        }
        Entry::Dangling => std::os::unix::fs::symlink(side("nowhere"), path).unwrap(),
    }
    None
}

/// What is at `path`: its type, inode, and (regular files) its text.
fn snapshot(path: &Path) -> Option<(String, u64, Option<String>)> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let text = meta.file_type().is_file().then(|| std::fs::read_to_string(path).unwrap());
    Some((format!("{:?}", meta.file_type()), meta.ino(), text))
}

/// A two-rank RDMA all-to-all: runs in milliseconds.
const TRAFFIC: &str = r#"schema = 1
name = "traffic"
[cluster]
profile = "h800-cx7"
nodes = 2
[[job]]
name = "bulk"
ranks = "0,8"
[job.traffic]
pattern = "all-to-all"
bytes_per_rank = "1MiB"
message_bytes = "64KiB"
warmup = 0
iterations = 2
"#;

/// `eptwin run` with the result path (`out/traffic.json`) made as `result` and the trace path
/// as `trace` (`None`: no --trace; `Some(None)`: --trace naming the result itself). A path
/// that may not be written fails the run before it simulates (exit 2, the path named, nothing
/// written); nothing that is not a regular file is ever replaced.
fn check_run_outputs(result: Entry, trace: Option<Option<Entry>>) {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("traffic.toml");
    std::fs::write(&scenario, TRAFFIC).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let result_path = out.join("traffic.json");
    let _s1 = make(result, &result_path);
    let trace_path = match trace {
        Some(None) => Some(result_path.clone()),
        Some(Some(_)) => Some(dir.path().join("trace.json")),
        None => None,
    };
    let _s2 = match (trace, &trace_path) {
        (Some(Some(kind)), Some(p)) => make(kind, p),
        _ => None,
    };
    let before = [snapshot(&result_path), trace_path.as_deref().and_then(snapshot)];
    let mut args = vec![
        "run".to_string(),
        scenario.display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    if let Some(t) = &trace_path {
        args.extend(["--trace".into(), t.display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = run(&args);
    let trace_ok = match trace {
        None => true,
        Some(None) => false,
        Some(Some(kind)) => replaceable(kind),
    };
    let case = format!("result {result:?}, trace {trace:?}");
    if replaceable(result) && trace_ok {
        assert_eq!(o.status.code(), Some(0), "{case}: {}", text(&o));
        let written = std::fs::read_to_string(&result_path).unwrap();
        assert!(written.contains("\"backend\""), "{case}");
        if let Some(t) = &trace_path {
            assert!(std::fs::read_to_string(t).unwrap().contains("traceEvents"), "{case}");
        }
        return;
    }
    assert_eq!(o.status.code(), Some(2), "{case}: {}", text(&o));
    assert!(o.stdout.is_empty(), "{case}: nothing ran: {}", text(&o));
    let refused = if replaceable(result) { trace_path.as_deref().unwrap() } else { &result_path };
    assert!(text(&o).contains(&refused.display().to_string()), "{case}: {}", text(&o));
    let after = [snapshot(&result_path), trace_path.as_deref().and_then(snapshot)];
    assert_eq!(before, after, "{case}: a path was replaced");
    if let Some(target) = [".target", ".fifo"]
        .iter()
        .map(|s| PathBuf::from(format!("{}{s}", result_path.display())))
        .find(|p| p.exists())
    {
        let meta = std::fs::symlink_metadata(&target).unwrap();
        assert!(meta.is_file() || meta.file_type().is_fifo(), "{case}: link target kept");
    }
}

/// Issue 45, case 1: each kind of entry as the trace path and as the result path.
#[test]
fn outputs_replace_only_regular_files_and_are_checked_before_running() {
    for entry in ENTRIES {
        check_run_outputs(Entry::Missing, Some(Some(entry)));
        check_run_outputs(entry, None);
    }
    // The trace path is the run's own result.
    check_run_outputs(Entry::Missing, Some(None));
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]
    /// Any pair of entries as (result path, trace path): the run writes both or refuses with
    /// exit 2 before simulating, and replaces nothing that is not a regular file.
    #[test]
    fn any_pair_of_output_paths_is_written_or_refused_whole(
        result in 0..ENTRIES.len(),
        trace in 0..=ENTRIES.len(),
    ) {
        let trace = ENTRIES.get(trace).copied().map(Some).unwrap_or(None);
        check_run_outputs(ENTRIES[result], Some(trace));
    }
}

/// A read-only output directory: refused before running unless permissions do not apply to
/// this user (root), when the run writes there.
#[test]
fn a_read_only_output_directory_is_refused_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("traffic.toml");
    std::fs::write(&scenario, TRAFFIC).unwrap();
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let writable = std::fs::File::create(ro.join("probe")).is_ok();
    let _ = std::fs::remove_file(ro.join("probe"));
    let o = run(&["run", scenario.to_str().unwrap(), "--out", ro.to_str().unwrap()]);
    if writable {
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    } else {
        assert_eq!(o.status.code(), Some(2));
        assert!(text(&o).contains("cannot write there") && o.stdout.is_empty(), "{}", text(&o));
    }
}

/// Reports, comparisons and sweeps check their outputs the same way.
#[test]
fn every_command_refuses_outputs_that_are_not_regular_files() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("r");
    std::fs::create_dir(&r).unwrap();
    mkfifo(&r.join("index.html"));
    let o = run(&["report", "reports/tests/fixtures", "--out", r.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("index.html: a pipe"), "{}", text(&o));
    assert_eq!(std::fs::read_dir(&r).unwrap().count(), 1, "no chart drawn");

    let c = dir.path().join("c");
    std::fs::create_dir(&c).unwrap();
    std::os::unix::fs::symlink("/dev/null", c.join("h200-ep8-ll-128.compare.json")).unwrap();
    let o = run(&[
        "compare",
        "scenarios/h200-ep8-ll-128.toml",
        "--measured",
        "results/h200/h200-ep8-ll-128.json",
        "--out",
        c.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("compare.json: a symbolic link to /dev/null"), "{}", text(&o));
    assert!(!c.join("h200-ep8-ll-128.sim.json").exists(), "nothing ran");

    let s = dir.path().join("s");
    std::fs::create_dir(&s).unwrap();
    std::fs::create_dir(s.join("index.json")).unwrap();
    let o = run(&[
        "sweep",
        "scenarios/qp-depth.toml",
        "--set",
        "job.env.NVSHMEM_QP_DEPTH=128,256",
        "--out",
        s.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("the sweep index"), "{}", text(&o));
    assert_eq!(std::fs::read_dir(&s).unwrap().count(), 1, "no point ran");
}

/// Issue 45, case 1: a character device (made in the temporary directory with `/dev/null`'s
/// numbers, where this user may make one: root) and the command's own scenario as an output
/// are refused before running, and stay what they were.
#[test]
fn devices_and_the_commands_own_input_are_never_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("traffic.toml");
    std::fs::write(&scenario, TRAFFIC).unwrap();
    let out = dir.path().join("out");
    let refused = |o: &Output, path: &Path, why: &str| {
        assert_eq!(o.status.code(), Some(2), "{}", text(o));
        assert!(o.stdout.is_empty(), "nothing ran: {}", text(o));
        let t = text(o);
        assert!(t.contains(&path.display().to_string()) && t.contains(why), "{t}");
    };
    // --trace naming the scenario the run reads.
    let o = run(&[
        "run",
        scenario.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--trace",
        scenario.to_str().unwrap(),
    ]);
    refused(&o, &scenario, "which this command reads");
    assert_eq!(std::fs::read_to_string(&scenario).unwrap(), TRAFFIC);
    assert!(!out.join("traffic.json").exists());
    // A scenario file where its own result goes (`out/traffic.json`).
    let own = dir.path().join("own");
    std::fs::create_dir(&own).unwrap();
    let own_scenario = own.join("traffic.json");
    std::fs::write(&own_scenario, TRAFFIC).unwrap();
    let o = run(&["run", own_scenario.to_str().unwrap(), "--out", own.to_str().unwrap()]);
    refused(&o, &own_scenario, "which this command reads");
    assert_eq!(std::fs::read_to_string(&own_scenario).unwrap(), TRAFFIC);
    // A character device as --trace and as the result.
    let device = dir.path().join("null");
    let c = CString::new(device.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0;
    if !made {
        return;
    }
    let before = snapshot(&device);
    let o = run(&[
        "run",
        scenario.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--trace",
        device.to_str().unwrap(),
    ]);
    refused(&o, &device, "a character device");
    let devices = dir.path().join("devices");
    std::fs::create_dir(&devices).unwrap();
    std::fs::rename(&device, devices.join("traffic.json")).unwrap();
    let o = run(&["run", scenario.to_str().unwrap(), "--out", devices.to_str().unwrap()]);
    refused(&o, &devices.join("traffic.json"), "a character device");
    let meta = std::fs::symlink_metadata(devices.join("traffic.json")).unwrap();
    assert!(meta.file_type().is_char_device(), "the device was replaced");
    assert_eq!(before.map(|b| b.1), Some(meta.ino()));
}

/// Issue 45, case 5: FIFOs named `*.json`, links to `/dev/zero`, links to `.` and link cycles
/// are read past (named, never read) without blocking, reading without end or walking
/// forever.
#[test]
fn inputs_are_regular_files_and_directory_walks_end() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    std::fs::create_dir(&results).unwrap();
    std::fs::copy(root().join("results/h200/h200-ep8-ll-128.json"), results.join("hw.json"))
        .unwrap();
    std::fs::copy(root().join("results/sim/h200-ep8-ll-128.json"), results.join("sim.json"))
        .unwrap();
    mkfifo(&results.join("fifo.json"));
    std::os::unix::fs::symlink("/dev/zero", results.join("zero.json")).unwrap();
    std::os::unix::fs::symlink(".", results.join("here")).unwrap();
    std::os::unix::fs::symlink(".", results.join("again")).unwrap();
    std::os::unix::fs::symlink(results.join("b"), results.join("a")).unwrap();
    std::os::unix::fs::symlink(results.join("a"), results.join("b")).unwrap();
    std::fs::write(results.join("truncated.json"), "{\"schema\": 1, \"scen").unwrap();
    let out = dir.path().join("report");
    let o = run(&["report", results.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("fifo.json: not a regular file (a pipe)"), "{t}");
    assert!(t.contains("zero.json: not a regular file (a character device)"), "{t}");
    assert!(t.contains("truncated.json: not JSON"), "{t}");
    assert!(t.contains("# eptwin report: 2 result(s)"), "read once, not through the links: {t}");

    let cmp = dir.path().join("cmp");
    let o = run(&[
        "compare",
        "scenarios/h200-ep8-ll-128.toml",
        "--measured",
        results.to_str().unwrap(),
        "--out",
        cmp.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("--measured: skipped") && t.contains("truncated.json: not JSON"), "{t}");
    assert!(t.contains("fifo.json: not a regular file"), "{t}");

    // Named explicitly, a FIFO is an error, not a wait.
    let never = dir.path().join("never");
    let o = run(&[
        "report",
        results.join("fifo.json").to_str().unwrap(),
        "--out",
        never.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!never.exists());
    let log = results.join("fifo.log");
    mkfifo(&log);
    let o = run(&[
        "deepep",
        "import",
        log.to_str().unwrap(),
        "--scenario",
        "scenarios/validation/deepep-ll-ep16.toml",
        "--gpu",
        "NVIDIA H800",
        "--out",
        dir.path().join("imported").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not a regular file (a pipe); a DeepEP log is text"), "{}", text(&o));
    let o = run(&["validate", log.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// A copy of a committed result with `edit` applied, written to `dir/name`.
fn edited(
    from: &str,
    dir: &Path,
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join(from)).unwrap()).unwrap();
    edit(&mut doc);
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    path
}

fn compare_with(measured: &Path, extra: &[&str]) -> Output {
    let out = tempfile::tempdir().unwrap();
    let mut args = vec![
        "compare",
        "scenarios/h200-ep8-ll-128.toml",
        "--measured",
        measured.to_str().unwrap(),
        "--out",
        out.path().to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(&args)
}

/// Issue 45, case 8: nonsense measurements and tolerances are errors (exit 2), each named.
#[test]
fn compare_refuses_nonsense() {
    let dir = tempfile::tempdir().unwrap();
    let measured = "results/h200/h200-ep8-ll-128.json";
    for (name, value, expected) in [
        ("zero.json", 0.0, "latency_us.mean = 0.0: a measured value is finite and > 0"),
        ("negative.json", -5.0, "latency_us.mean = -5.0: a measured value is finite and > 0"),
    ] {
        let file = edited(measured, dir.path(), name, |d| {
            d["jobs"][0]["ops"][0]["summary"]["latency_us"]["mean"] = value.into();
        });
        let o = compare_with(&file, &["--tolerance", "5"]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            text(&o).contains(&format!("{name}: job ep8, op dispatch: {expected}")),
            "{}",
            text(&o)
        );
    }
    // An EP16 result relabelled as this scenario: no row pairs up.
    let sha = |path: &str| {
        let d: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(root().join(path)).unwrap()).unwrap();
        d["scenario"]["sha256"].clone()
    };
    let ep8_sha = sha("results/sim/h200-ep8-ll-128.json");
    let relabelled = edited(measured, dir.path(), "ep16.json", |d| {
        d["scenario"]["sha256"] = ep8_sha.clone();
        d["jobs"][0]["name"] = "ep16".into();
        d["jobs"][0]["ranks"] = 16.into();
    });
    let o = compare_with(&relabelled, &["--tolerance", "5"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("job ep8, op dispatch: simulated only"), "{}", text(&o));
    assert!(text(&o).contains("job ep16, op dispatch: measured only"), "{}", text(&o));
    let o = compare_with(&root().join(measured), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for tolerance in ["nan", "inf", "-1"] {
        let o = compare_with(&root().join(measured), &["--tolerance", tolerance]);
        assert_eq!(o.status.code(), Some(2), "--tolerance {tolerance}: {}", text(&o));
    }
    // A truncated or garbage file named explicitly is an error naming it; in a directory it
    // is named and read past.
    let bad = dir.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(bad.join("truncated.json"), "{\"schema\": 1, \"scenario\": {").unwrap();
    std::fs::write(bad.join("garbage.json"), [0xff, 0x00, 0x13]).unwrap();
    let o = compare_with(&bad.join("truncated.json"), &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("truncated.json: not JSON"), "{}", text(&o));
    let o = compare_with(&bad, &[]);
    assert_eq!(o.status.code(), Some(77), "nothing measured: {}", text(&o));
    assert!(text(&o).contains("garbage.json: not JSON"), "{}", text(&o));
    assert!(text(&o).contains("truncated.json: not JSON"), "{}", text(&o));
}

/// Issue 45, case 4: a measurement is compared only with the scenario text it ran on the GPU
/// the profile models; several candidates are an error naming them.
#[test]
fn compare_pairs_by_scenario_text_and_gpu() {
    // results/h100/ holds H100 runs of the h200 scenarios.
    let o = compare_with(&root().join("results"), &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("2 measured results ran this scenario text on the NVIDIA H200"), "{t}");
    assert!(t.contains("results/h200/h200-ep8-ll-128.json"), "{t}");
    assert!(t.contains("results/h200/repeat/h200-ep8-ll-128.json"), "{t}");
    let h100 = root().join("results/h100/ll-combine-times/h200-ep8-ll-128.json");
    let o = compare_with(&h100, &["--tolerance", "5"]);
    assert_eq!(o.status.code(), Some(77), "not compared: {}", text(&o));
    assert!(
        text(&o).contains("measured on NVIDIA H100 80GB HBM3, not the NVIDIA H200"),
        "{}",
        text(&o)
    );
    let o = compare_with(&h100, &["--allow-other-gpu", "NVIDIA H100", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("\"hardware\":\"1× NVIDIA H100 80GB HBM3\""), "{}", text(&o));
}

/// Issue 45, cases 4 and 9: the report of the committed results shows the H200 runs of the
/// h200 scenarios (the README's numbers: every op within 5 %), and refuses impossible values.
#[test]
fn report_pairs_the_h200_runs_and_refuses_impossible_values() {
    let out = tempfile::tempdir().unwrap();
    let o = run(&["report", "results/", "--out", out.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let html = std::fs::read_to_string(out.path().join("index.html")).unwrap();
    let mut errors = Vec::new();
    for row in html.split("<tr>").filter(|r| r.starts_with("<td class=\"l n\">h200-ep8-")) {
        let cells: Vec<&str> = row
            .split("<td")
            .skip(1)
            .map(|c| c.split_once('>').unwrap().1.split("</td>").next().unwrap())
            .collect();
        let scenario = cells[0];
        if ["ll-128", "ll-4096", "normal-128", "normal-4096"].iter().any(|s| scenario.ends_with(s))
        {
            let error: f64 = cells[8].trim_start_matches('+').parse().expect(row);
            errors.push((scenario.to_string(), cells[2].to_string(), error));
        }
    }
    assert_eq!(errors.len(), 8, "{errors:?}");
    assert!(errors.iter().all(|e| e.2.abs() < 5.0), "{errors:?}");

    let dir = tempfile::tempdir().unwrap();
    for (name, edit) in [
        (
            "mean0.json",
            (|d: &mut serde_json::Value| {
                d["jobs"][0]["ops"][0]["summary"]["latency_us"]["mean"] = 0.0.into();
            }) as fn(&mut serde_json::Value),
        ),
        ("min.json", |d: &mut serde_json::Value| {
            d["jobs"][0]["ops"][0]["summary"]["latency_us"]["min"] = (-1e308).into();
        }),
        ("order.json", |d: &mut serde_json::Value| {
            d["jobs"][0]["ops"][0]["summary"]["latency_us"]["min"] = 1e6.into();
        }),
    ] {
        let file = edited("results/h200/h200-ep8-ll-128.json", dir.path(), name, edit);
        let r = dir.path().join(format!("report-{name}"));
        let o = run(&["report", file.to_str().unwrap(), "--out", r.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", text(&o));
        assert!(
            text(&o).contains(&format!("{name}: job ep8, op dispatch: latency_us")),
            "{}",
            text(&o)
        );
        assert!(!r.join("index.html").exists(), "{name}: no chart of it");
    }
}

/// Issue 45, cases 3 and 10: a sharded sweep expands its own points only, the grid and the
/// threads are capped, and `--spawn` is checked before any process starts.
#[test]
fn sweeps_and_launches_out_of_bounds_are_refused_before_starting() {
    let values: String = (1..=10_000).map(|v| v.to_string()).collect::<Vec<_>>().join(",");
    let out = tempfile::tempdir().unwrap();
    let o = run(&[
        "sweep",
        "scenarios/qp-depth.toml",
        "--set",
        &format!("job.traffic.iterations={values}"),
        "--set",
        &format!(
            "job.traffic.warmup={}",
            (0..10_000).map(|v| v.to_string()).collect::<Vec<_>>().join(",")
        ),
        "--shard",
        "3/100000000",
        "--out",
        out.path().to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let index: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(index["total_points"], 100_000_000);
    assert_eq!(index["points"].as_array().unwrap().len(), 1);
    let o = run(&[
        "sweep",
        "scenarios/qp-depth.toml",
        "--set",
        &format!("job.traffic.iterations={values}"),
        "--set",
        "job.traffic.warmup=0,1",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("one sweep runs at most 10000; shard it further"), "{}", text(&o));
    let o = run(&[
        "sweep",
        "scenarios/qp-depth.toml",
        "--set",
        "job.env.NVSHMEM_QP_DEPTH=128,256",
        "--threads",
        "100000",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--threads 100000: from 1 to 1024"), "{}", text(&o));
    // 64 processes of an 8-rank scenario: refused by the launching process, none started.
    let o = run(&["run", "scenarios/h200-ep8-ll-128.toml", "--backend", "hw", "--spawn", "64"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--spawn 64: the scenario has 8 ranks"), "{}", text(&o));
    assert!(!text(&o).contains("[p0]"), "{}", text(&o));
}

/// Issue 45, low: a 200-byte name (the documented maximum) sweeps into valid points, and a
/// scenario named `..` is refused instead of writing the hidden `out/...json`.
#[test]
fn names_at_the_limit_sweep_and_hidden_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text200 = std::fs::read_to_string(root().join("scenarios/qp-depth.toml"))
        .unwrap()
        .replacen("name = \"qp-depth\"", &format!("name = \"{}\"", "n".repeat(200)), 1);
    let scenario = dir.path().join("long.toml");
    std::fs::write(&scenario, text200).unwrap();
    let out = dir.path().join("sweep");
    let o = run(&[
        "sweep",
        scenario.to_str().unwrap(),
        "--set",
        "job.env.NVSHMEM_QP_DEPTH=128,256",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let index: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for p in index["points"].as_array().unwrap() {
        assert_eq!(p["verdict"], "ok", "{p}");
    }
    let dots = dir.path().join("dots.toml");
    std::fs::write(&dots, TRAFFIC.replacen("name = \"traffic\"", "name = \"..\"", 1)).unwrap();
    let out = dir.path().join("out");
    let o = run(&["run", dots.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("\"..\" starts with '.'"), "{}", text(&o));
    assert!(!out.join("...json").exists());
}

/// Issue 45, low: Ctrl-C during a sweep lets the running points finish, starts no other and
/// writes the index (the points not run listed), then ends by SIGINT; no point file is left
/// without its result.
#[test]
fn an_interrupted_sweep_writes_its_index() {
    let out = tempfile::tempdir().unwrap();
    let depths: String = (0..400).map(|i| (128 + i).to_string()).collect::<Vec<_>>().join(",");
    let mut child = eptwin()
        .args(["sweep", "scenarios/qp-depth.toml", "--threads", "1", "--out"])
        .arg(out.path())
        .arg("--set")
        .arg(format!("job.env.NVSHMEM_QP_DEPTH={depths}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let first = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .any(|e| e.unwrap().path().extension().is_some_and(|x| x == "json"))
    };
    let mut waited = 0;
    while !first(out.path()) {
        assert!(child.try_wait().unwrap().is_none(), "the sweep ended before any point");
        std::thread::sleep(Duration::from_millis(10));
        waited += 1;
        assert!(waited < 12_000, "no point ran in 120 s");
    }
    // SAFETY: signals the child this test started.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    let status = {
        let mut waited = 0;
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            std::thread::sleep(Duration::from_millis(20));
            waited += 1;
            if waited > 6_000 {
                let _ = child.kill();
                panic!("the interrupted sweep did not end");
            }
        }
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}");
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("index.json")).expect("the index is written"),
    )
    .unwrap();
    let points = index["points"].as_array().unwrap();
    assert_eq!(points.len(), 400);
    let not_run = points.iter().filter(|p| p["verdict"] == "not-run").count();
    assert!(not_run > 0, "the sweep stopped starting points");
    for p in points.iter().filter(|p| p["verdict"] != "not-run") {
        let name = p["scenario_file"].as_str().unwrap();
        assert!(out.path().join(name).is_file(), "{name}");
        assert!(out.path().join(p["file"].as_str().unwrap()).is_file(), "{p}");
    }
    let tomls = std::fs::read_dir(out.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "toml"))
        .count();
    assert_eq!(tomls, points.len() - not_run, "a point file without its result");
}

/// A committed probe result of an H200 (`eptwin calibrate --from` reads it).
const H200_PROBES: &str = "results/h200/calibrate/run/probes-only.probes.json";

/// `eptwin calibrate --backend sim --base h200-cx7` with `args` after.
fn calibrate(args: &[&str]) -> Output {
    let mut all = vec!["calibrate", "--backend", "sim", "--base", "h200-cx7"];
    all.extend(args);
    run(&all)
}

/// Refused with exit 2 before reading a probe (the progress line that follows the probes is
/// absent), naming `path` and `why`.
fn refused_before_calibrating(o: &Output, path: &Path, why: &str, case: &str) {
    let t = text(o);
    assert_eq!(o.status.code(), Some(2), "{case}: {t}");
    assert!(o.stdout.is_empty(), "{case}: {t}");
    assert!(!t.contains("eptwin calibrate: base profile"), "{case}: it ran: {t}");
    assert!(t.contains(&path.display().to_string()) && t.contains(why), "{case}: {t}");
}

/// Issue 45 for `eptwin calibrate`: the profile, the probe result and the sweep's files are
/// checked before anything runs, as every command's outputs: nothing but a regular file is
/// replaced, nor one of its inputs.
#[test]
fn calibrate_checks_its_outputs_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    for (i, entry) in ENTRIES.into_iter().enumerate() {
        let out = dir.path().join(format!("p{i}.toml"));
        let _socket = make(entry, &out);
        let before = snapshot(&out);
        let o = calibrate(&["--from", H200_PROBES, "--out", out.to_str().unwrap()]);
        let case = format!("--out {entry:?}");
        if replaceable(entry) {
            assert_eq!(o.status.code(), Some(0), "{case}: {}", text(&o));
            let written = std::fs::read_to_string(&out).unwrap();
            assert!(written.contains(&format!("name = \"p{i}\"")), "{case}: {written}");
            continue;
        }
        refused_before_calibrating(&o, &out, "", &case);
        assert_eq!(before, snapshot(&out), "{case}: replaced");
    }
    // The machine's own null device.
    let o = calibrate(&["--from", H200_PROBES, "--out", "/dev/null"]);
    refused_before_calibrating(&o, Path::new("/dev/null"), "a character device", "/dev/null");
    assert!(std::fs::symlink_metadata("/dev/null").unwrap().file_type().is_char_device());
    // The result it reads the probes from.
    let from = dir.path().join("probes.json");
    std::fs::copy(root().join(H200_PROBES), &from).unwrap();
    let original = std::fs::read(&from).unwrap();
    let o = calibrate(&["--from", from.to_str().unwrap(), "--out", from.to_str().unwrap()]);
    refused_before_calibrating(&o, &from, "which this command reads", "--out the --from file");
    assert_eq!(std::fs::read(&from).unwrap(), original);
    // A file the one-rank sweep would write (`<out>.deepep/<shape>/launch.sh`) that is a FIFO:
    // refused before the sweep starts (`true` stands for a Python that imports deep_ep).
    let out = dir.path().join("swept.toml");
    let shape = dir.path().join("swept.deepep/t128-k8-h7168");
    std::fs::create_dir_all(&shape).unwrap();
    mkfifo(&shape.join("launch.sh"));
    let o = calibrate(&[
        "--from",
        H200_PROBES,
        "--out",
        out.to_str().unwrap(),
        "--deepep-dir",
        dir.path().to_str().unwrap(),
        "--python",
        "true",
    ]);
    refused_before_calibrating(&o, &shape.join("launch.sh"), "a pipe", "launch.sh a FIFO");
    assert!(!out.exists());
    assert!(std::fs::symlink_metadata(shape.join("launch.sh")).unwrap().file_type().is_fifo());
}

/// Issue 45 for `eptwin calibrate`: `--from`, a `--base` file and the `--deepep-runs` files
/// are regular files, read bounded; a FIFO among them is refused or passed over, never waited
/// on, and no profile is written.
#[test]
fn calibrate_reads_regular_files_only() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.toml");
    let fifo = dir.path().join("probes.json");
    mkfifo(&fifo);
    let o = calibrate(&["--from", fifo.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not a regular file (a pipe)"), "{}", text(&o));
    assert!(!out.exists());
    let base = dir.path().join("base.toml");
    mkfifo(&base);
    let o = run(&[
        "calibrate",
        "--backend",
        "sim",
        "--from",
        H200_PROBES,
        "--base",
        base.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("a profile is a TOML file"), "{}", text(&o));
    assert!(!out.exists());
    // One-rank runs whose every file is a FIFO: passed over, so none to fit.
    let runs = dir.path().join("runs");
    let shape = runs.join("t128-k8-h7168");
    std::fs::create_dir_all(&shape).unwrap();
    for f in [
        "result.json",
        "routing.json",
        "deepep-one-rank-t128-k8-h7168.deepep.json",
        "deepep-one-rank-t128-k8-h7168-hook.deepep.json",
    ] {
        mkfifo(&shape.join(f));
    }
    mkfifo(&runs.join("gpu.txt"));
    let o = calibrate(&[
        "--deepep-only",
        "--deepep-runs",
        runs.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--deepep-only needs one-rank runs"), "{}", text(&o));
    assert!(!out.exists());
}
