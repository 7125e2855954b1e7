//! Hostile and extreme input through the binary (issue 22): each case is refused with exit 2
//! and a message naming file:line:col and the key, or runs; none panics (exit 101) or aborts,
//! none reports `ok` without samples, and a closed stdout loses no result file.
//!
//! Costs are bounded by counts, not by the clock: a counting global allocator measures
//! what validating a case allocates in this process (`eptwin_engine::load` and `validate`, the
//! two calls `eptwin validate` makes), per thread, so the harness's parallel tests do not mix.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Per-thread allocation counters (const-initialised, no destructor: usable in the allocator).
struct Counting;

thread_local! {
    static LIVE_BYTES: Cell<usize> = const { Cell::new(0) };
    static PEAK_BYTES: Cell<usize> = const { Cell::new(0) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    /// Live bytes past which this thread's allocations fail (set while measuring): a size that
    /// is expanded before its check aborts the test instead of taking the machine's memory.
    static CAP_BYTES: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Counts an allocation of `size` bytes; `false` when it would pass this thread's cap.
fn grow(size: usize) -> bool {
    let Ok(live) = LIVE_BYTES.try_with(|l| l.get().saturating_add(size)) else {
        return true; // the thread is exiting: not measured
    };
    if live > CAP_BYTES.with(Cell::get) {
        let _ = std::io::stderr()
            .write_all(b"cli_hostile: an allocation passed the thread's cap while measuring\n");
        return false;
    }
    LIVE_BYTES.with(|l| l.set(live));
    PEAK_BYTES.with(|p| p.set(p.get().max(live)));
    ALLOCATIONS.with(|n| n.set(n.get() + 1));
    true
}

fn shrink(size: usize) {
    let _ = LIVE_BYTES.try_with(|l| l.set(l.get().saturating_sub(size)));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !grow(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrink(layout.size());
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !grow(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged to the system allocator.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        shrink(if new.is_null() { new_size } else { layout.size() });
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What validating one scenario file costs, counted on this thread.
#[derive(Debug)]
struct Cost {
    /// Allocations and reallocations made: work that grows with what validation builds.
    allocations: u64,
    /// Most bytes live at once beyond what was live before.
    peak_bytes: usize,
}

/// Validating a one-job case may not hold more than this at once (it holds under 100 KiB; a
/// range or size expanded before its check takes hundreds of MiB or more).
const VALIDATE_PEAK_BYTES: usize = 16 << 20;
/// While measuring, an allocation that takes the thread past this fails and aborts the test
/// binary (Rust's allocation-failure handler) rather than the machine's memory being taken.
const CAP_BYTES_MEASURED: usize = 1 << 30;

/// Load and validate `path` in this process as `eptwin validate` does, counting.
fn validation_cost(path: &Path) -> Cost {
    let base = LIVE_BYTES.with(Cell::get);
    let before = ALLOCATIONS.with(Cell::get);
    PEAK_BYTES.with(|p| p.set(base));
    CAP_BYTES.with(|c| c.set(base.saturating_add(CAP_BYTES_MEASURED)));
    let loaded = eptwin_engine::load(path).expect("the case loads");
    let diagnostics = eptwin_engine::deepep::validate::validate(&loaded.scenario, &loaded.source);
    drop((diagnostics, loaded));
    CAP_BYTES.with(|c| c.set(usize::MAX));
    Cost {
        allocations: ALLOCATIONS.with(Cell::get) - before,
        peak_bytes: PEAK_BYTES.with(Cell::get).saturating_sub(base),
    }
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn eptwin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_eptwin"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run eptwin")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A small normal-mode EP8 job (fast on the simulator).
const NORMAL: &str = r#"schema = 1
name = "normal"
[cluster]
profile = "h800-cx7"
nodes = 1
[[job]]
name = "train"
[job.buffer]
num_nvl_bytes = "1GiB"
num_qps_per_rank = 1
[job.workload]
tokens_per_rank = 128
hidden = 7168
topk = 8
experts = 256
warmup = 1
iterations = 2
"#;

/// A two-rank RDMA all-to-all.
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

struct Case {
    dir: tempfile::TempDir,
    file: PathBuf,
}

impl Case {
    /// `base` with `old` replaced by `new`, in a file of its own.
    fn new(base: &str, old: &str, new: &str) -> Case {
        assert!(base.contains(old), "{old}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("case.toml");
        std::fs::write(&file, base.replacen(old, new, 1)).unwrap();
        Case { dir, file }
    }

    fn path(&self) -> &str {
        self.file.to_str().unwrap()
    }

    fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    /// `validate` and `run` both refuse the case with exit 2, print `expected`, and write no
    /// result.
    fn refused(&self, expected: &str) {
        let v = eptwin(&["validate", self.path()]);
        assert_eq!(v.status.code(), Some(2), "validate: {}", text(&v));
        assert!(text(&v).contains(expected), "validate: {expected:?} not in\n{}", text(&v));
        let out = self.out();
        let r = eptwin(&["run", self.path(), "--out", out.to_str().unwrap()]);
        assert_eq!(r.status.code(), Some(2), "run: {}", text(&r));
        assert!(text(&r).contains(expected), "run: {expected:?} not in\n{}", text(&r));
        let written = std::fs::read_dir(&out).map(|d| d.count()).unwrap_or(0);
        assert_eq!(written, 0, "a refused scenario writes no result");
    }
}

fn with_override(base: &str, section: &str, kv: &str) -> Case {
    Case::new(base, "[[job]]", &format!("[cluster.overrides.{section}]\n{kv}\n[[job]]"))
}

#[test]
fn profile_overrides_outside_their_range_are_refused_at_their_key() {
    let line = "case.toml:7:1: error[profile-range]: cluster.overrides.";
    for (base, section, kv, message) in [
        (
            NORMAL,
            "nvlink",
            "bw_per_direction_gbps = nan",
            "nvlink.bw_per_direction_gbps: NaN: expected a bandwidth from 1 to 10^7 GB/s",
        ),
        (
            NORMAL,
            "nvlink",
            "efficiency = nan",
            "nvlink.efficiency: NaN: expected a fraction from 0.01 to 1",
        ),
        (
            TRAFFIC,
            "nic",
            "link_gbps = nan",
            "nic.link_gbps: NaN: expected a bandwidth from 1 to 10^7 GB/s",
        ),
        (
            TRAFFIC,
            "nic",
            "efficiency = 0.0",
            "nic.efficiency: 0: expected a fraction from 0.01 to 1",
        ),
        (
            TRAFFIC,
            "pcie",
            "bw_gbps = inf",
            "pcie.bw_gbps: inf: expected a bandwidth from 1 to 10^7 GB/s",
        ),
        (
            NORMAL,
            "gpu",
            "memcpy_bw_gbps = 0",
            "gpu.memcpy_bw_gbps: 0: expected a bandwidth from 1 to 10^7 GB/s",
        ),
        (
            TRAFFIC,
            "nic",
            "efficiency = 2.0",
            "nic.efficiency: 2: expected a fraction from 0.01 to 1",
        ),
        (TRAFFIC, "gpu", "clock_ghz = nan", "gpu.clock_ghz: NaN: expected a number from 0.1 to 10"),
        (TRAFFIC, "nic", "per_gpu = 0", "nic.per_gpu: 0: expected an integer from 1 to 8"),
        (
            NORMAL,
            "nvlink",
            "packet_payload_bytes = 0",
            "nvlink.packet_payload_bytes: 0: expected an integer from 16 to 256",
        ),
        (
            TRAFFIC,
            "nic",
            "max_qp_depth = 0",
            "nic.max_qp_depth: 0: expected an integer from 128 to 1048576",
        ),
        (
            TRAFFIC,
            "fabric",
            "switch_radix = 1",
            "fabric.switch_radix: 1: expected an integer from 2 to 1024",
        ),
        (
            TRAFFIC,
            "fabric",
            "vl_buffer_bytes = 0",
            "fabric.vl_buffer_bytes: 0: a VL's receive buffer holds at least one packet",
        ),
        (
            NORMAL,
            "nvlink",
            "bw_per_direction_gbps = 1e-300",
            "nvlink.bw_per_direction_gbps: 1e-300: expected a bandwidth from 1 to 10^7 GB/s",
        ),
    ] {
        with_override(base, section, kv).refused(&format!("{line}{message}"));
    }
}

#[test]
fn iterations_and_warmup_beyond_their_limits_are_refused() {
    for (base, old, new, expected) in [
        (
            NORMAL,
            "iterations = 2",
            "iterations = 4294967295",
            "case.toml:17:1: error[limit-iterations]: job \"train\": job[0].workload.iterations: iterations = 4294967295: at most 100000",
        ),
        (
            NORMAL,
            "iterations = 2",
            "iterations = 4294967291",
            "iterations = 4294967291: at most 100000",
        ),
        (
            NORMAL,
            "iterations = 2",
            "iterations = 2147483648",
            "iterations = 2147483648: at most 100000",
        ),
        (NORMAL, "iterations = 2", "iterations = 1000000", "iterations = 1000000: at most 100000"),
        (
            NORMAL,
            "warmup = 1",
            "warmup = 4294967295",
            "job[0].workload.warmup: warmup = 4294967295: at most 10000",
        ),
        (NORMAL, "warmup = 1", "warmup = 1000000000", "warmup = 1000000000: at most 10000"),
        (
            TRAFFIC,
            "iterations = 2",
            "iterations = 4294967295",
            "job[0].traffic.iterations: iterations = 4294967295: at most 100000",
        ),
        (
            TRAFFIC,
            "warmup = 0",
            "warmup = 4294967295",
            "job[0].traffic.warmup: warmup = 4294967295: at most 10000",
        ),
    ] {
        Case::new(base, old, new).refused(expected);
    }
}

#[test]
fn sizes_that_would_exhaust_memory_are_refused_before_allocating() {
    for (base, old, new, expected) in [
        (
            NORMAL,
            "name = \"train\"",
            "name = \"train\"\nranks = \"0-4000000000\"",
            "case.toml:8:1: error[job-ranks]: job \"train\": job[0].ranks: rank 4000000000 does not exist: the cluster has 8 ranks (0-7)",
        ),
        (
            NORMAL,
            "name = \"train\"",
            "name = \"train\"\nranks = \"0-100000000\"",
            "rank 100000000 does not exist: the cluster has 8 ranks (0-7)",
        ),
        (
            NORMAL,
            "tokens_per_rank = 128",
            "tokens_per_rank = 4294967295",
            "job[0].workload.tokens_per_rank: tokens_per_rank = 4294967295: at most 1048576",
        ),
    ] {
        let case = Case::new(base, old, new);
        // Counted in this process first, under the cap: expanding the range before its check
        // held 16 GB (0-4000000000) or 400 MB (0-100000000).
        let cost = validation_cost(&case.file);
        assert!(cost.peak_bytes < VALIDATE_PEAK_BYTES, "{new}: {cost:?}");
        case.refused(expected);
    }
    let msg = Case::new(
        TRAFFIC,
        "bytes_per_rank = \"1MiB\"\nmessage_bytes = \"64KiB\"",
        "bytes_per_rank = \"1GiB\"\nmessage_bytes = 1",
    );
    msg.refused("2 (source, destination) pairs × ceil(1073741824 / 1) bytes = 2147483648 messages per round: at most 4194304");
}

#[test]
fn files_that_are_not_scenarios_are_refused_without_reading_them() {
    let o = eptwin(&["validate", "/dev/zero"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(
            "/dev/zero: not a regular file (a character device); a scenario is a TOML file"
        ),
        "{}",
        text(&o)
    );
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.toml");
    std::fs::File::create(&big).unwrap().set_len(1 << 30).unwrap();
    let o = eptwin(&["validate", big.to_str().unwrap(), dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains(
            "big.toml: 1073741824 bytes is more than a scenario may have (16777216 bytes, 16 MiB)"
        ),
        "{t}"
    );
    assert!(t.contains("not a regular file (a directory)"), "{t}");
}

/// `jobs` single-rank jobs sharing VL0 on one 250-node cluster.
fn many_jobs(jobs: usize) -> String {
    let mut scenario = String::from(
        "schema = 1\nname = \"many\"\n[cluster]\nprofile = \"h800-cx7\"\nnodes = 250\n",
    );
    for i in 0..jobs {
        scenario.push_str(&format!(
            "[[job]]\nname = \"j{i}\"\nranks = [{i}]\n[job.buffer]\nnum_nvl_bytes = \"1GiB\"\n\
             [job.workload]\ntokens_per_rank = 1\nhidden = 7168\ntopk = 1\nexperts = 1\n\
             warmup = 0\niterations = 1\nops = [\"dispatch\"]\n"
        ));
    }
    scenario
}

#[test]
fn validating_many_jobs_is_linear() {
    let case = Case::new(&many_jobs(2000), "many", "many");
    let o = eptwin(&["validate", case.path()]);
    // One shared-VL advisory per job: one per pair made 1,000 jobs half a million advisories
    // and 27 s of validation (2,000 jobs more than 120 s).
    assert!(text(&o).contains("case.toml: 6000 error(s), 1999 advisory(ies)"), "{}", text(&o));
    // Twice the jobs, about twice the work: anything built per pair of jobs gives four times.
    let half = Case::new(&many_jobs(1000), "many", "many");
    let (n, n2) = (validation_cost(&half.file), validation_cost(&case.file));
    assert!(n2.allocations * 2 < n.allocations * 5, "1,000 jobs: {n:?}; 2,000 jobs: {n2:?}");
}

/// Read one line of stdout, close the pipe, and let the process finish.
fn first_line_then_close(args: &[&str]) -> (String, std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_eptwin"))
        .args(args)
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    // The reader is dropped here: later writes hit a closed pipe (EPIPE).
    let output = child.wait_with_output().unwrap();
    (line, output.status, String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn a_closed_stdout_neither_panics_nor_loses_results() {
    let (line, status, stderr) = first_line_then_close(&[
        "validate",
        "scenarios/ep8-ll.toml",
        "scenarios/ep16-ll.toml",
        "scenarios/ep8-normal-intranode.toml",
    ]);
    assert!(line.ends_with("ok (0 advisory(ies))\n"), "{line}");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let out = tempfile::tempdir().unwrap();
    let (line, status, stderr) = first_line_then_close(&[
        "run",
        "scenarios/ep8-ll.toml",
        "scenarios/ep8-normal-intranode.toml",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(line.starts_with("# eptwin: ep8-ll on sim"), "{line}");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for name in ["ep8-ll.json", "ep8-normal-intranode.json"] {
        assert!(out.path().join(name).exists(), "{name} was not written");
    }
}

#[test]
fn output_paths_are_checked_before_simulating() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("regular");
    std::fs::write(&file, "").unwrap();
    let o =
        eptwin(&["run", "scenarios/ep64-normal-internode.toml", "--out", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("--out ")
            && text(&o).contains("regular: a regular file, not a directory; give a directory"),
        "{}",
        text(&o)
    );
    assert!(o.stdout.is_empty(), "nothing ran");
    let under_file = file.join("sub");
    let o = eptwin(&["run", "scenarios/ep8-ll.toml", "--out", under_file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("cannot create the directory"), "{}", text(&o));

    // A read-only directory (unless permissions do not apply, as for root).
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mut perms = std::fs::metadata(&ro).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&ro, perms).unwrap();
    if std::fs::File::create(ro.join("probe")).is_err() {
        let o = eptwin(&["run", "scenarios/ep8-ll.toml", "--out", ro.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2));
        assert!(text(&o).contains("cannot write there"), "{}", text(&o));
    }

    let trace_dir = dir.path().join("traces");
    std::fs::create_dir(&trace_dir).unwrap();
    let out = dir.path().join("out");
    let o = eptwin(&[
        "run",
        "scenarios/ep8-ll.toml",
        "--out",
        out.to_str().unwrap(),
        "--trace",
        trace_dir.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains(&format!(
            "--trace {}: a directory: eptwin writes regular files only; give a file name such as",
            trace_dir.display()
        )),
        "{t}"
    );
    assert!(!t.contains("writing results"), "{t}");
}

#[test]
fn scenarios_sharing_a_name_are_refused_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.toml");
    std::fs::copy(root().join("scenarios/ep8-ll.toml"), &copy).unwrap();
    let out = dir.path().join("out");
    let o = eptwin(&[
        "run",
        "scenarios/ep8-ll.toml",
        copy.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains(&format!(
            "scenarios/ep8-ll.toml and {} both have name = \"ep8-ll\"",
            copy.display()
        )),
        "{t}"
    );
    assert!(!out.exists(), "nothing ran");
}

#[test]
fn a_waived_run_does_not_replace_a_result_of_another_backend() {
    if std::env::var_os("EPTWIN_REQUIRE_HW").is_some() {
        return; // on the GPU machine the hardware run is not waived
    }
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    let sim = eptwin(&["run", "scenarios/h200-ep8-ll-128.toml", "--out", dir]);
    assert_eq!(sim.status.code(), Some(0), "{}", text(&sim));
    let before = std::fs::read_to_string(out.path().join("h200-ep8-ll-128.json")).unwrap();
    let hw = eptwin(&["run", "scenarios/h200-ep8-ll-128.toml", "--backend", "hw", "--out", dir]);
    assert_eq!(hw.status.code(), Some(77), "{}", text(&hw));
    assert_eq!(std::fs::read_to_string(out.path().join("h200-ep8-ll-128.json")).unwrap(), before);
    let waived = std::fs::read_to_string(out.path().join("h200-ep8-ll-128.hw.json")).unwrap();
    assert!(waived.contains("\"verdict\": \"waived\""));
    assert!(
        text(&hw).contains("holds a sim result (verdict ok); this hw result goes to"),
        "{}",
        text(&hw)
    );
    // The README's report step reads past the comparison documents `compare` leaves in out/.
    let cmp = eptwin(&[
        "compare",
        "scenarios/h200-ep8-ll-128.toml",
        "--measured",
        "results/h200/h200-ep8-ll-128.json",
        "--out",
        dir,
    ]);
    assert_ne!(cmp.status.code(), Some(2), "{}", text(&cmp));
    let mut args = vec!["report".to_string()];
    for entry in std::fs::read_dir(out.path()).unwrap() {
        args.push(entry.unwrap().path().display().to_string());
    }
    assert!(args.iter().any(|a| a.ends_with(".compare.json")));
    let report_dir = out.path().join("report");
    args.extend(["--out".to_string(), report_dir.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let report = eptwin(&args);
    assert_eq!(report.status.code(), Some(0), "{}", text(&report));
    assert!(report_dir.join("index.html").exists());
    assert!(
        text(&report).contains("# ignored 1 file(s) that are not results"),
        "{}",
        text(&report)
    );
}

#[test]
fn charts_are_written_whole() {
    let out = tempfile::tempdir().unwrap();
    let o = eptwin(&["report", "reports/tests/fixtures", "--out", out.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Each chart is drawn into a temporary file and renamed: none is left behind.
    let names: Vec<String> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n.ends_with(".png")), "{names:?}");
    assert!(names.iter().any(|n| n.ends_with(".svg")), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with('.')), "{names:?}");
}

#[test]
fn names_longer_than_a_file_name_are_refused() {
    let long = "n".repeat(5000);
    Case::new(NORMAL, "name = \"normal\"", &format!("name = \"{long}\"")).refused(
        "case.toml:2:1: error[limit-name]: name: 5000 bytes: a scenario name becomes result file names",
    );
}

#[test]
fn parse_errors_name_the_key_and_say_what_was_expected() {
    for (old, new, expected) in [
        (
            "tokens_per_rank = 128",
            "tokens_per_rank = \"many\"",
            "case.toml:12:19: error[parse]: job[0].workload.tokens_per_rank: expected an integer, found the string \"many\"",
        ),
        (
            "num_nvl_bytes = \"1GiB\"",
            "num_nvl_bytes = \"2 GiBB\"",
            "case.toml:9:17: error[parse]: job[0].buffer.num_nvl_bytes: invalid size \"2 GiBB\"",
        ),
        (
            "name = \"train\"",
            "name = \"train\"\nranks = 3.5",
            "case.toml:8:9: error[parse]: job[0].ranks: expected \"all\", ranges such as \"0-7,16-23\", or a list of ranks such as [0, 1, 2], found the number 3.5",
        ),
        (
            "num_nvl_bytes = \"1GiB\"",
            "num_nvl_bytes = \"18446744073709551616\"",
            "job[0].buffer.num_nvl_bytes: size \"18446744073709551616\" is too large: sizes go up to 18446744073709551615 bytes (2^64 - 1)",
        ),
        (
            "num_nvl_bytes = \"1GiB\"",
            "num_nvl_bytes = \"1e30\"",
            "job[0].buffer.num_nvl_bytes: size \"1e30\" is too large",
        ),
    ] {
        Case::new(NORMAL, old, new).refused(expected);
    }
    // e-notation that is an exact number of bytes is a size.
    let exact = Case::new(NORMAL, "num_nvl_bytes = \"1GiB\"", "num_nvl_bytes = \"2e9\"");
    assert_eq!(eptwin(&["validate", exact.path()]).status.code(), Some(0));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("utf8.toml");
    let mut bytes = NORMAL.as_bytes().to_vec();
    bytes.insert(NORMAL.find("\"train\"").unwrap() + 3, 0xff);
    std::fs::write(&bad, bytes).unwrap();
    let o = eptwin(&["validate", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("utf8.toml:7:11: error[parse]: invalid UTF-8 at byte"),
        "{}",
        text(&o)
    );
}

#[test]
fn low_latency_advice_can_be_followed() {
    let ll = std::fs::read_to_string(root().join("scenarios/ep8-ll.toml")).unwrap();
    let case = Case::new(
        &ll.replace("tokens_per_rank = 128", "tokens_per_rank = 20000"),
        "NVSHMEM_IB_SL = \"1\"",
        "NVSHMEM_IB_SL = \"1\"\nNVSHMEM_QP_DEPTH = \"65536\"",
    );
    let o = eptwin(&["validate", case.path()]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(t.contains("NVSHMEM_QP_DEPTH = 65536: NVSHMEM accepts 128..=32768"), "{t}");
    assert!(t.contains("no depth fits: NVSHMEM's largest, 32768, allows T ≤ 16383; dispatch at most 16383 tokens per call"), "{t}");
    assert!(!t.contains("≥ 65536"), "{t}");
}

#[test]
fn reference_values_must_be_finite() {
    for (extra, expected) in [
        (
            "tolerance_pct = nan\n",
            "job[0].reference.tolerance_pct: tolerance_pct = NaN: a finite percentage ≥ 0",
        ),
        ("tolerance_pct = -5.0\n", "tolerance_pct = -5: a finite percentage ≥ 0"),
        ("tolerance_pct = inf\n", "tolerance_pct = inf: a finite percentage ≥ 0"),
        (
            "ops.dispatch = { latency_us = nan }\n",
            "job[0].reference.ops.dispatch.latency_us: latency_us = NaN: a published value is finite and > 0",
        ),
    ] {
        let base = format!("{NORMAL}[job.reference]\nsource = \"x\"\n{extra}");
        Case::new(&base, "normal", "normal").refused(expected);
    }
}

#[test]
fn the_table_says_what_its_columns_are() {
    let out = tempfile::tempdir().unwrap();
    let o = eptwin(&["run", "scenarios/ep8-ll.toml", "--out", out.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("nvlink(MB), rdma(MB): bytes of one op summed over all ranks"), "{t}");
    assert!(t.contains("mean = p50 = p99 = min = max"), "{t}");
    // One node: every byte crossed NVLink, none RDMA.
    let dispatch = t.lines().find(|l| l.contains(" dispatch ")).unwrap();
    assert!(dispatch.contains(" NVL ") && !dispatch.contains("RDMA"), "{dispatch}");
}
