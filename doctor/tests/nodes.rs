//! Every recorded node under `tests/nodes/` diagnosed: each problem node (one per problem of
//! issue 47, written from DeepEP's and its users' issues) must produce its expected finding —
//! check, status, what was seen, the issue it prevents and the fix — and that finding must
//! not appear on the healthy node it changes, checked against the same scenario. The healthy
//! nodes must give no warning and no failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use eptwin_doctor::probe::snapshot::Snapshot;
use eptwin_doctor::subject::Api;
use eptwin_doctor::{Report, Status, Subject, diagnose};

fn nodes_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nodes")
}

fn subject(
    dir: &Path,
    scenario: &str,
    env: &BTreeMap<String, String>,
    v2: Option<&toml::Value>,
) -> Subject {
    let path = dir.join(scenario);
    let loaded = eptwin_engine::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let plan =
        eptwin_engine::Plan::build(&loaded).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut s = Subject::from_plan(&plan, env);
    // DeepEP V2 jobs: the scenario's jobs with V2's ElasticBuffer arguments.
    if let Some(v2) = v2 {
        let get = |k: &str| v2.get(k).unwrap_or_else(|| panic!("v2.{k} missing"));
        for j in &mut s.jobs {
            j.api = Api::V2 {
                allow_hybrid_mode: get("allow_hybrid_mode").as_bool().unwrap(),
                num_allocated_qps: get("num_allocated_qps").as_integer().unwrap() as u32,
                sl_idx: get("sl_idx").as_integer().unwrap() as u8,
            };
        }
    }
    s
}

fn diagnose_dir(dir: &Path, scenario: Option<&str>, v2: Option<&toml::Value>) -> Report {
    let node = Snapshot::load(dir).unwrap_or_else(|e| panic!("{e}")).into_node();
    let subject = scenario.map(|s| subject(dir, s, &node.host.environment(), v2));
    diagnose(&node, subject.as_ref())
}

fn status_of(text: &str) -> Status {
    match text {
        "ok" => Status::Ok,
        "warn" => Status::Warn,
        "fail" => Status::Fail,
        "skip" => Status::Skip,
        other => panic!("unknown status {other:?}"),
    }
}

/// The problems in one node's report against its `[expect]`; empty when all hold.
fn check_expectations(name: &str, dir: &Path, expect: &toml::Value) -> Vec<String> {
    let text = |k: &str| expect.get(k).and_then(|v| v.as_str());
    let scenario = text("scenario");
    let v2 = expect.get("v2");
    let report = diagnose_dir(dir, scenario, v2);
    let check = text("check").unwrap_or_else(|| panic!("{name}: expect.check missing"));
    let Some(f) = report.finding(check) else { return vec![format!("{name}: no finding {check}")] };
    let mut problems = Vec::new();
    let want = status_of(text("status").unwrap_or("fail"));
    if f.status != want {
        problems.push(format!("{name}: {check} is {:?}, expected {want:?}: {}", f.status, f.saw));
    }
    if let Some(saw) = text("saw")
        && !f.saw.contains(saw)
    {
        problems.push(format!("{name}: {check} saw {:?}, expected it to contain {saw:?}", f.saw));
    }
    if let Some(detail) = text("detail")
        && !f.details.iter().any(|d| d.contains(detail))
    {
        problems.push(format!("{name}: no detail of {check} contains {detail:?}: {:?}", f.details));
    }
    if let Some(prevents) = text("prevents")
        && !f.prevents.contains(&prevents)
    {
        problems.push(format!("{name}: {check} prevents {:?}, expected {prevents:?}", f.prevents));
    }
    if let Some(fix) = text("fix")
        && !f.fix.as_deref().unwrap_or("").contains(fix)
    {
        problems.push(format!("{name}: {check} fix {:?} lacks {fix:?}", f.fix));
    }
    // The healthy node this one changes, against the same scenario, must not show it.
    let compare = match text("compare_scenario") {
        Some("none") => None,
        Some(s) => Some(s),
        None => scenario,
    };
    if let Some(base) = base_of(dir) {
        let healthy = diagnose_dir(&base, compare.map(|s| rebase(dir, &base, s)).as_deref(), v2);
        if let Some(h) = healthy.finding(check)
            && matches!(h.status, Status::Warn | Status::Fail)
        {
            problems.push(format!(
                "{name}: the healthy base already says {:?} for {check}: {}",
                h.status, h.saw
            ));
        }
    }
    problems
}

/// The `base` a node names.
fn base_of(dir: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(dir.join("node.toml")).ok()?;
    let table: toml::Table = toml::from_str(&text).ok()?;
    Some(dir.join(table.get("base")?.as_str()?))
}

/// A scenario path relative to `dir`, made relative to `base`.
fn rebase(dir: &Path, base: &Path, scenario: &str) -> String {
    let abs = std::fs::canonicalize(dir.join(scenario)).unwrap();
    let base = std::fs::canonicalize(base).unwrap();
    let ups = base.components().count();
    let mut rel = PathBuf::new();
    for _ in 0..ups {
        rel.push("..");
    }
    rel.push(abs.strip_prefix("/").unwrap());
    rel.to_string_lossy().into_owned()
}

fn problem_nodes() -> Vec<(String, PathBuf)> {
    let mut nodes: Vec<(String, PathBuf)> = std::fs::read_dir(nodes_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .filter(|(n, p)| p.join("node.toml").exists() && !n.starts_with("healthy-"))
        .collect();
    nodes.sort();
    nodes
}

#[test]
fn every_problem_node_gets_its_finding_and_fix() {
    let nodes = problem_nodes();
    assert!(nodes.len() >= 15, "only {} problem nodes", nodes.len());
    let mut problems = Vec::new();
    for (name, dir) in &nodes {
        let snapshot = Snapshot::load(dir).unwrap_or_else(|e| panic!("{e}"));
        let expect =
            snapshot.expect.clone().unwrap_or_else(|| panic!("{name}: no [expect] in node.toml"));
        problems.extend(check_expectations(name, dir, &expect));
    }
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn healthy_nodes_give_no_warning() {
    let runs = [
        ("healthy-h100-ib", None),
        ("healthy-h100-ib", Some("../scenarios/ib-ep16-ll.toml")),
        ("healthy-h100-ib", Some("../scenarios/ib-ep16-normal.toml")),
        ("healthy-h100-roce", None),
        ("healthy-h100-roce", Some("../scenarios/roce-ep16-ll.toml")),
    ];
    for (node, scenario) in runs {
        let report = diagnose_dir(&nodes_dir().join(node), scenario, None);
        let bad: Vec<String> = report
            .findings
            .iter()
            .filter(|f| matches!(f.status, Status::Warn | Status::Fail))
            .map(|f| format!("{}: {:?} {}", f.check, f.status, f.saw))
            .collect();
        assert!(bad.is_empty(), "{node} with {scenario:?}: {bad:?}");
        assert!(
            report.counts.ok >= 12,
            "{node} with {scenario:?}: only {} checks ran: {}",
            report.counts.ok,
            report.to_text()
        );
    }
    // The same healthy node as a V2 job: GIN's prerequisites hold too.
    let v2: toml::Value =
        toml::from_str("allow_hybrid_mode = true\nnum_allocated_qps = 0\nsl_idx = 3").unwrap();
    let report = diagnose_dir(
        &nodes_dir().join("healthy-h100-ib"),
        Some("../scenarios/ib-ep16-ll.toml"),
        Some(&v2),
    );
    assert_eq!(report.worst(), Status::Ok, "{}", report.to_text());
    assert_eq!(report.finding("gin-libmlx5").unwrap().status, Status::Ok);
}

/// A node with nothing on it (no NVML, no NIC, no /proc extracts) gives reasons, not panics,
/// and says what the GPU machine shows: no RDMA port, internode will waive.
#[test]
fn an_empty_node_says_why_each_check_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("node.toml"), "description = \"nothing\"\n").unwrap();
    let report = diagnose_dir(dir.path(), None, None);
    let devices = report.finding("rdma-devices").unwrap();
    assert!(devices.saw.contains("no RDMA port, internode will waive"), "{}", devices.saw);
    assert_eq!(devices.status, Status::Warn);
    let gpus = report.finding("gpus").unwrap();
    assert_eq!(gpus.status, Status::Skip);
    assert!(gpus.saw.contains("NVML"), "{}", gpus.saw);
    for f in &report.findings {
        assert!(!f.saw.is_empty(), "{} says nothing", f.check);
    }
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["kind"], "eptwin-doctor");
    assert_eq!(json["findings"].as_array().unwrap().len(), report.findings.len());
}

/// A single-node scenario on a node without NICs: ok, with the same words.
#[test]
fn a_single_node_scenario_needs_no_nic() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("node.toml"), "description = \"GPU machine without NICs\"\n")
        .unwrap();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/h200-ep8-ll-128.toml");
    let report = diagnose_dir(dir.path(), Some(scenario.to_str().unwrap()), None);
    let devices = report.finding("rdma-devices").unwrap();
    assert_eq!(devices.status, Status::Ok, "{}", devices.saw);
    assert!(devices.saw.contains("no RDMA port, internode will waive"));
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/ep16-ll.toml");
    let report = diagnose_dir(dir.path(), Some(scenario.to_str().unwrap()), None);
    assert_eq!(report.finding("rdma-devices").unwrap().status, Status::Fail);
}
