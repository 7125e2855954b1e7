//! `eptwin run`.
//!
//! Everything that can be known before simulating is checked first: every scenario plans, no
//! two share a `name` (their results would overwrite each other), and every output — the
//! result files and the trace — may be written (engine/src/files.rs: regular files only, none
//! twice, none an input). Where results go is `results.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use eptwin_engine::LoadedScenario;
use eptwin_engine::api::{Outputs, Progress, RunResult, result_path, write_atomic};
use eptwin_group::{LaunchInfo, Launcher, rank_blocks};

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
    if backend == BackendArg::Hw {
        super::warn_hw_env(o.wire);
    }
    let (loaded, mut code) = load_distinct(scenarios);
    let Some(loaded) = loaded else { return Ok(ExitCode::BadInput) };
    let plans = plan_all(&loaded, &mut code);
    // Every process of a launch checks the outputs too: each runs this same command.
    check_outputs(&loaded, &plans, o)?;
    if let Some(n) = o.spawn {
        if code != ExitCode::Ok {
            return Ok(code);
        }
        return processes::spawn_local(n, &plans, o.ranks_per_process);
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
            return processes::run_in_group(&launch, scenarios, &plans, o);
        }
        launcher = launch.launcher;
    }
    for (path, plan) in &plans {
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
            execute_as(plan, backend, trace.is_some(), launcher, o.wire, &mut |p| bar.show(p))
                .with_context(|| format!("running {}", path.display()))?;
        drop(bar);
        write_result(&result, &o.out, o.json)?;
        if let (Some(trace_path), Some(trace_json)) = (trace, trace_json) {
            write_atomic(trace_path, &trace_json)?;
            eprintln!(
                "eptwin: trace written to {} (open in https://ui.perfetto.dev)",
                trace_path.display()
            );
        }
        code = code.worst(ExitCode::from_verdict(result.verdict));
    }
    Ok(code)
}

/// Claim every file the run will write before it runs (engine/src/files.rs): the result of
/// each planned scenario (both names [`super::results::place_result`] may choose) and the
/// trace, none of them the same file or a file the run reads.
fn check_outputs(
    loaded: &Scenarios,
    plans: &[(&PathBuf, eptwin_engine::Plan)],
    o: &RunOptions,
) -> Result<()> {
    let mut outputs = Outputs::new();
    for (path, _) in loaded {
        outputs.input(path, &format!("the scenario {}", path.display()));
    }
    for (_, plan) in plans {
        for file in plan.routing_files() {
            outputs.input(Path::new(&file.file), &format!("the routing file {}", file.file));
        }
    }
    outputs.directory(&o.out, "--out")?;
    let kind = match o.backend {
        BackendArg::Sim => "sim",
        BackendArg::Hw => "hw",
    };
    for (_, plan) in plans {
        claim_result(&mut outputs, &o.out, &plan.name, kind)?;
    }
    if let Some(trace) = &o.trace {
        outputs.claim(trace, "--trace")?;
    }
    Ok(())
}

/// Claim the two files a result of `name` on backend `kind` may go to.
pub fn claim_result(outputs: &mut Outputs, dir: &Path, name: &str, kind: &str) -> Result<()> {
    let what = format!("the result of {name}");
    outputs.claim(&result_path(dir, name, None), &what)?;
    outputs.claim(&result_path(dir, name, Some(kind)), &format!("the {kind} result of {name}"))?;
    Ok(())
}

/// Scenario files as parsed, with their paths.
pub type Scenarios = Vec<(PathBuf, LoadedScenario)>;

/// The plan of every loaded scenario, in order; one that does not plan is left out, its
/// errors printed, and `code` becomes `BadInput`.
pub fn plan_all<'a>(
    loaded: &'a Scenarios,
    code: &mut ExitCode,
) -> Vec<(&'a PathBuf, eptwin_engine::Plan)> {
    let mut plans = Vec::new();
    for (path, scenario) in loaded {
        match plan_loaded(scenario) {
            Some(plan) => plans.push((path, plan)),
            None => *code = code.worst(ExitCode::BadInput),
        }
    }
    plans
}

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
