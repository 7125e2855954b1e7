//! `eptwin run`.
//!
//! Everything that can be known before simulating is checked first: the output directory is
//! a writable directory, the trace path is a file, and no two scenarios share a `name` (their
//! results would overwrite each other). Result files follow one rule: a result never replaces
//! a result of another backend, and a waived result never replaces a measured one; it goes
//! to `<name>.<backend>.json` instead (the name `compare` uses), and the run says so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use eptwin_engine::LoadedScenario;
use eptwin_engine::api::Progress;
use eptwin_engine::api::{RunResult, write_atomic};
use eptwin_hw::group::{LaunchInfo, Launcher, rank_blocks};

use super::results::write_result;
use super::{RunOptions, plan_loaded, processes, provenance};
use crate::ExitCode;
use crate::cli::{BackendArg, WireArg};

pub fn run(scenarios: &[PathBuf], o: &RunOptions) -> Result<ExitCode> {
    let (backend, trace) = (o.backend, o.trace.as_deref());
    if trace.is_some() && (scenarios.len() != 1 || backend != BackendArg::Sim) {
        bail!("--trace takes one scenario on the simulator backend");
    }
    if backend != BackendArg::Hw && (o.spawn.is_some() || o.ranks_per_process.is_some()) {
        bail!(
            "--spawn and --ranks-per-process run the hardware backend's processes: add --backend hw"
        );
    }
    // Every process of a launch checks --out too: each runs this same command.
    writable_dir(&o.out, "--out")?;
    if let Some(trace_path) = trace {
        writable_file(trace_path, "--trace")?;
    }
    if let Some(n) = o.spawn {
        return processes::spawn_local(n);
    }
    let mut launcher = Launcher::Single;
    if backend == BackendArg::Hw {
        let launch = match LaunchInfo::from_process_env() {
            Ok(l) => l,
            Err(e) => {
                eprintln!("eptwin: error: {e}");
                return Ok(ExitCode::BadInput);
            }
        };
        if launch.process_count > 1 {
            return processes::run_in_group(&launch, scenarios, o);
        }
        launcher = launch.launcher;
    }
    let (loaded, mut code) = load_distinct(scenarios);
    let Some(loaded) = loaded else { return Ok(ExitCode::BadInput) };
    for (path, scenario) in &loaded {
        let Some(plan) = plan_loaded(scenario) else {
            code = code.worst(ExitCode::BadInput);
            continue;
        };
        if o.ranks_per_process.is_some() {
            // One process: it must hold every rank.
            let ranks = plan.topology.num_ranks() as usize;
            if let Err(e) = rank_blocks(ranks, 1, o.ranks_per_process) {
                eprintln!("eptwin: error: {}: {e}", path.display());
                code = code.worst(ExitCode::BadInput);
                continue;
            }
        }
        let mut bar = ProgressBar::new(&plan.name);
        let (result, trace_json) =
            execute_as(&plan, backend, trace.is_some(), launcher, o.wire, &mut |p| bar.show(p))
                .with_context(|| format!("running {}", path.display()))?;
        drop(bar);
        write_result(&result, &o.out, o.json)?;
        if let (Some(trace_path), Some(trace_json)) = (trace, trace_json) {
            write_atomic(trace_path, &trace_json).map_err(|e| match e {
                eptwin_engine::EngineError::ResultWrite { message, .. } => {
                    anyhow::anyhow!("writing the trace to {}: {message}", trace_path.display())
                }
                other => other.into(),
            })?;
            eprintln!(
                "eptwin: trace written to {} (open in https://ui.perfetto.dev)",
                trace_path.display()
            );
        }
        code = code.worst(ExitCode::from_verdict(result.verdict));
    }
    Ok(code)
}

/// Scenario files as parsed, with their paths.
pub type Scenarios = Vec<(PathBuf, LoadedScenario)>;

/// Parse every scenario before running any, and refuse two with the same `name`. The
/// scenarios that parsed (`None` when names collide), and the exit code so far.
pub fn load_distinct(scenarios: &[PathBuf]) -> (Option<Scenarios>, ExitCode) {
    let mut code = ExitCode::Ok;
    let mut loaded = Vec::new();
    for path in scenarios {
        match eptwin_engine::load(path) {
            Ok(l) => loaded.push((path.clone(), l)),
            Err(e) => {
                eprintln!("{e}");
                code = ExitCode::BadInput;
            }
        }
    }
    let mut first: BTreeMap<&str, &Path> = BTreeMap::new();
    let mut clash = false;
    for (path, l) in &loaded {
        if let Some(other) = first.insert(&l.scenario.name, path) {
            eprintln!(
                "eptwin: {} and {} both have name = {:?}: their results would overwrite each other; \
                 give each scenario its own name",
                other.display(),
                path.display(),
                l.scenario.name
            );
            clash = true;
        }
    }
    (if clash { None } else { Some(loaded) }, code)
}

/// `dir` is a directory results can be written to (created if missing), checked before any
/// simulation: a file there or a read-only directory would otherwise fail only at the end.
pub fn writable_dir(dir: &Path, flag: &str) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        bail!(
            "{flag} {}: not a directory (it is a file); give a directory for the results",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("{flag} {}: cannot create the directory", dir.display()))?;
    probe_write(dir).with_context(|| format!("{flag} {}: cannot write there", dir.display()))
}

/// `file` can be written: not a directory, and its directory is (or can be made) writable.
pub fn writable_file(file: &Path, flag: &str) -> Result<()> {
    if file.is_dir() {
        bail!(
            "{flag} {}: a directory; give a file name such as {}",
            file.display(),
            file.join("trace.json").display()
        );
    }
    let dir = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let at = || format!("{flag} {}", file.display());
    if dir.exists() && !dir.is_dir() {
        bail!("{}: {} is a file, not a directory", at(), dir.display());
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("{}: cannot create its directory {}", at(), dir.display()))?;
    probe_write(dir).with_context(|| format!("{}: cannot write in {}", at(), dir.display()))
}

/// Create and remove a file in `dir` (permissions alone do not tell: read-only mounts, ACLs).
fn probe_write(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".eptwin-write-test.{}", std::process::id()));
    std::fs::File::create(&probe)?;
    std::fs::remove_file(&probe)
}

/// Run one plan on one backend; the simulator also hands back its trace when asked.
pub fn execute(
    plan: &eptwin_engine::Plan,
    backend: BackendArg,
    trace: bool,
) -> Result<(RunResult, Option<String>)> {
    execute_as(plan, backend, trace, Launcher::Single, None, &mut |_| {})
}

/// [`execute`] in a process that `launcher` started (recorded in a hardware result), over the
/// `wire` between nodes, reporting progress after every op.
fn execute_as(
    plan: &eptwin_engine::Plan,
    backend: BackendArg,
    trace: bool,
    launcher: Launcher,
    wire: Option<WireArg>,
    progress: &mut dyn FnMut(Progress),
) -> Result<(RunResult, Option<String>)> {
    match backend {
        BackendArg::Sim => {
            let mut sim = eptwin_sim::Simulator::new(eptwin_sim::SimOptions { trace });
            let result =
                eptwin_engine::api::run_observed(plan, &mut sim, provenance(backend), progress)?;
            Ok((result, sim.trace_json()))
        }
        BackendArg::Hw => {
            let mut hw = eptwin_hw::HwTransport::single(super::hw_options(wire), launcher);
            let result =
                eptwin_engine::api::run_observed(plan, &mut hw, provenance(backend), progress)?;
            Ok((result, None))
        }
    }
}

/// A progress bar on stderr while a scenario runs, only when stderr is a terminal (logs and
/// redirected output stay clean); cleared before the table is printed. A spinner while the
/// backend prepares, then ops done of all.
pub struct ProgressBar(Option<indicatif::ProgressBar>, bool);

impl ProgressBar {
    pub fn new(name: &str) -> ProgressBar {
        use std::io::IsTerminal;
        if !std::io::stderr().is_terminal() {
            return ProgressBar(None, false);
        }
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{msg} {spinner} preparing, {elapsed}")
        {
            bar.set_style(style);
        }
        bar.set_message(name.to_string());
        bar.enable_steady_tick(std::time::Duration::from_millis(250));
        ProgressBar(Some(bar), false)
    }

    pub fn show(&mut self, p: Progress) {
        let Some(bar) = &self.0 else { return };
        if !self.1 {
            self.1 = true;
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {pos}/{len} ops, {elapsed}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
        }
        bar.set_length(p.total);
        bar.set_position(p.done);
    }
}

impl Drop for ProgressBar {
    fn drop(&mut self) {
        if let Some(bar) = self.0.take() {
            bar.finish_and_clear();
        }
    }
}
