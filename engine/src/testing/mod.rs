//! Test support for the workspace's tests: the bundled scenarios by name, scenarios derived
//! from them along key paths ([`crate::scenario::edit`], never by replacing text), their plans,
//! small builders for the plans tests use most, and the proptest configuration every property
//! test shares.
//!
//! Built with the cargo feature `testing`, which the other crates' dev-dependencies (and this
//! crate's own, for its integration tests) turn on; the engine's unit tests always have it.
//!
//! ```
//! use eptwin_engine::testing::ScenarioDraft;
//! let plan = ScenarioDraft::bundled("ep16-ll")
//!     .set("job[0].env.NVSHMEM_QP_DEPTH", "1024")
//!     .set("job[0].workload.iterations", 2)
//!     .plan();
//! assert_eq!(plan.jobs[0].iterations, 2);
//! assert_eq!(plan.jobs[0].nvshmem.qp_depth, 1024);
//! ```

pub mod conformance;

use std::path::{Path, PathBuf};

use crate::deepep::validate::validate;
use crate::diag::Diagnostic;
use crate::error::EngineError;
use crate::plan::Plan;
use crate::scenario::{LoadedScenario, edit};

/// The repository root. Test executables carried to another machine (the GPU machine runs
/// them from a copy of the repository, scripts/h200-measure.sh) do not find the directory they
/// were built in: there it is the current directory or the nearest parent holding
/// `scenarios/`.
pub fn repo_root() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the engine is a member");
    if built.join("scenarios").is_dir() {
        return built.to_path_buf();
    }
    let cwd = std::env::current_dir().expect("a current directory");
    cwd.ancestors()
        .find(|d| d.join("scenarios").is_dir() && d.join("Cargo.toml").is_file())
        .unwrap_or_else(|| {
            panic!(
                "no repository here: neither {} nor {} holds scenarios/",
                built.display(),
                cwd.display()
            )
        })
        .to_path_buf()
}

/// Every `*.toml` in `dir` (not recursive), sorted.
pub fn tomls(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
}

/// The scenario library: every `*.toml` under `scenarios/` and its folders (`validation/`,
/// `ll-ep-sweep/`), as paths relative to the repository root (`scenarios/ep16-ll.toml`, the way
/// `eptwin run` names them from there), sorted.
pub fn bundled_scenarios() -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for path in tomls(dir) {
            out.push(path.strip_prefix(root).expect("under the root").to_path_buf());
        }
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .filter(|p| p.is_dir())
            .collect();
        dirs.sort();
        for d in dirs {
            walk(root, &d, out);
        }
    }
    let root = repo_root();
    let mut files = Vec::new();
    walk(&root, &root.join("scenarios"), &mut files);
    files.sort();
    files
}

/// A scenario as a TOML table being edited along key paths. Until the first edit it keeps the
/// text it was read from, so an unedited bundled scenario plans (and hashes) exactly as
/// `eptwin run` reads it.
#[derive(Debug, Clone)]
pub struct ScenarioDraft {
    /// The label positions and results carry (`scenarios/ep16-ll.toml`).
    file: String,
    /// The text as read, dropped at the first edit.
    original: Option<String>,
    table: toml::Table,
}

impl ScenarioDraft {
    /// A bundled scenario by name: `ep16-ll`, `validation/deepep-ll-ep8` (`.toml` optional).
    pub fn bundled(name: &str) -> ScenarioDraft {
        let name = name.strip_suffix(".toml").unwrap_or(name);
        ScenarioDraft::read(Path::new(&format!("scenarios/{name}.toml")))
    }

    /// A scenario file given relative to the repository root (`scenarios/x.toml`,
    /// `hw/tests/fixtures/y.toml`), labelled with that path.
    pub fn read(relative: &Path) -> ScenarioDraft {
        let path = repo_root().join(relative);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        ScenarioDraft::from_text(&relative.display().to_string(), &text)
    }

    /// Scenario text written in a test; `file` labels its positions.
    pub fn from_text(file: &str, text: &str) -> ScenarioDraft {
        let table = toml::from_str(text).unwrap_or_else(|e| panic!("{file}: not TOML: {e}"));
        ScenarioDraft { file: file.to_string(), original: Some(text.to_string()), table }
    }

    /// The smallest scenario: `name` on the bundled hardware profile `profile`, with one job
    /// `ep` whose buffer and workload the caller sets.
    pub fn on_profile(name: &str, profile: &str) -> ScenarioDraft {
        let mut table = toml::Table::new();
        table.insert("schema".into(), 1.into());
        table.insert("name".into(), name.into());
        let mut job = toml::Table::new();
        job.insert("name".into(), "ep".into());
        table.insert("job".into(), toml::Value::Array(vec![toml::Value::Table(job)]));
        let draft = ScenarioDraft { file: format!("{name}.toml"), original: None, table };
        draft.set("cluster.profile", profile)
    }

    /// Put `value` at `key` (`job[0].workload.topk`, `job[decode].env.NVSHMEM_IB_SL`,
    /// `cluster.fabric.vlarb_low`); missing tables on the way are created.
    pub fn set(mut self, key: &str, value: impl Into<toml::Value>) -> ScenarioDraft {
        edit::set(&mut self.table, key, value).unwrap_or_else(|e| panic!("{}: {e}", self.file));
        self.original = None;
        self
    }

    /// The scenario without its job named `name` (the others keep their order).
    pub fn without_job(mut self, name: &str) -> ScenarioDraft {
        let jobs = self.table.get_mut("job").and_then(toml::Value::as_array_mut);
        let jobs = jobs.unwrap_or_else(|| panic!("{}: no [[job]] list", self.file));
        let before = jobs.len();
        jobs.retain(|j| j.get("name").and_then(toml::Value::as_str) != Some(name));
        assert_eq!(jobs.len() + 1, before, "{}: one job is named {name:?}", self.file);
        self.original = None;
        self
    }

    /// The value at `key`, if the scenario has one.
    pub fn get(&self, key: &str) -> Option<&toml::Value> {
        edit::get(&self.table, key).unwrap_or_else(|e| panic!("{}: {e}", self.file))
    }

    /// Label the scenario's positions (and results) with `file`.
    pub fn named_file(mut self, file: &str) -> ScenarioDraft {
        self.file = file.to_string();
        self
    }

    pub fn file(&self) -> &str {
        &self.file
    }

    /// The scenario's text: as read when unedited, else the edited table.
    pub fn text(&self) -> String {
        match &self.original {
            Some(text) => text.clone(),
            None => toml::to_string(&self.table).expect("a TOML table serialises"),
        }
    }

    /// The 1-based line of the text where `key = ` is written (positions in diagnostics).
    pub fn line_of_key(&self, key: &str) -> u32 {
        let text = self.text();
        let at = text
            .lines()
            .position(|l| l.trim_start().starts_with(&format!("{key} =")))
            .unwrap_or_else(|| panic!("{}: no line sets {key}:\n{text}", self.file));
        at as u32 + 1
    }

    /// Parse the text, or `Err` with the parser's file:line:col message.
    pub fn try_load(&self) -> Result<LoadedScenario, EngineError> {
        // Bundled scenarios are named relative to the repository root (`scenarios/x.toml`),
        // which is not a test's working directory: their routing files resolve from there.
        let mut loaded = crate::parse(&self.file, &self.text())?;
        loaded.source.set_root(repo_root());
        Ok(loaded)
    }

    pub fn load(&self) -> LoadedScenario {
        self.try_load().unwrap_or_else(|e| panic!("{e}\n{}", self.text()))
    }

    /// Every diagnostic of the validator, errors and advisories.
    pub fn diagnostics(&self) -> Vec<Diagnostic> {
        let loaded = self.load();
        validate(&loaded.scenario, &loaded.source).0
    }

    /// The validator's errors only.
    pub fn errors(&self) -> Vec<Diagnostic> {
        self.diagnostics().into_iter().filter(Diagnostic::is_error).collect()
    }

    pub fn try_plan(&self) -> Result<Plan, EngineError> {
        Plan::build(&self.try_load()?)
    }

    /// The plan; a scenario that does not plan fails the test with its diagnostics and text.
    pub fn plan(&self) -> Plan {
        self.try_plan().unwrap_or_else(|e| panic!("{e}\n{}", self.text()))
    }
}

/// Normal intranode kernels with every rank on one H200 (profile `h200-single`: 8 ranks share
/// the GPU, so the simulator runs its one-GPU models and the hardware backend runs on the one
/// GPU of the device machine): 200 tokens per rank, hidden 2048, top-8 of 64 experts, 1 warmup
/// and 3 timed iterations.
pub fn one_gpu_normal(name: &str) -> ScenarioDraft {
    ScenarioDraft::on_profile(name, "h200-single")
        .set("job[0].buffer.num_nvl_bytes", "1GiB")
        .set("job[0].buffer.num_sms", 24)
        .set("job[0].workload.tokens_per_rank", 200)
        .set("job[0].workload.hidden", 2048)
        .set("job[0].workload.topk", 8)
        .set("job[0].workload.experts", 64)
        .set("job[0].workload.warmup", 1)
        .set("job[0].workload.iterations", 3)
}

/// Low-latency kernels with every rank on one H200 (as [`one_gpu_normal`]): 64 tokens per
/// rank, hidden 2048, top-8 of 64 experts, 10 masked selections, 1 warmup and 3 timed
/// iterations.
pub fn one_gpu_low_latency(name: &str) -> ScenarioDraft {
    ScenarioDraft::on_profile(name, "h200-single")
        .set("job[0].buffer.low_latency_mode", true)
        .set("job[0].buffer.num_rdma_bytes", "1GiB")
        .set("job[0].buffer.num_qps_per_rank", 8)
        .set("job[0].workload.tokens_per_rank", 64)
        .set("job[0].workload.hidden", 2048)
        .set("job[0].workload.topk", 8)
        .set("job[0].workload.experts", 64)
        .set("job[0].workload.masked_selections", 10)
        .set("job[0].workload.warmup", 1)
        .set("job[0].workload.iterations", 3)
}

/// The configuration of every property test: `cases` cases, and failures persisted as
/// regression cases in the committed file beside the test's source (`foo.rs` →
/// `foo.regressions`), which later runs replay first. A file travels with its source when the
/// source moves.
pub fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    use proptest::test_runner::{Config, FileFailurePersistence};
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..Config::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unedited_bundled_scenario_keeps_its_text() {
        let draft = ScenarioDraft::bundled("ep16-ll");
        let path = repo_root().join("scenarios/ep16-ll.toml");
        assert_eq!(draft.text(), std::fs::read_to_string(path).unwrap());
        assert_eq!(draft.file(), "scenarios/ep16-ll.toml");
        let edited = draft.set("job[0].workload.seed", 7);
        assert!(!edited.text().starts_with('#'), "an edited scenario is the table's text");
        assert_eq!(edited.plan().jobs[0].name, "decode");
    }

    #[test]
    fn builders_plan() {
        let normal = one_gpu_normal("n").plan();
        assert_eq!(normal.jobs[0].num_ranks(), 8);
        let ll = one_gpu_low_latency("l").set("job[0].workload.iterations", 5).plan();
        assert_eq!(ll.jobs[0].iterations, 5);
        assert!(ll.jobs[0].deepep().unwrap().dispatch_config.is_none());
    }

    #[test]
    fn the_library_is_listed_relative_to_the_root() {
        let all = bundled_scenarios();
        assert!(all.contains(&PathBuf::from("scenarios/ep16-ll.toml")));
        assert!(all.contains(&PathBuf::from("scenarios/validation/deepep-ll-ep8.toml")));
        assert!(all.contains(&PathBuf::from("scenarios/ll-ep-sweep/ll-ep8.toml")));
    }

    #[test]
    fn edits_name_their_key_path_when_they_fail() {
        let caught = std::panic::catch_unwind(|| {
            ScenarioDraft::bundled("ep16-ll").set("job[prefill].env.X", "1")
        });
        let message = *caught.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("job[prefill].env.X"), "{message}");
    }
}
