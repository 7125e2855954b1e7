//! `eptwin run`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use eptwin_engine::result::{RunResult, result_path, write_atomic};
use eptwin_hw::group::{LaunchInfo, Launcher, rank_blocks};

use super::{load_plan, processes, provenance};
use crate::ExitCode;
use crate::cli::{BackendArg, WireArg};

/// `eptwin run`'s options besides the scenarios.
pub struct RunOptions {
    pub backend: BackendArg,
    pub out: PathBuf,
    pub json: bool,
    pub trace: Option<PathBuf>,
    pub spawn: Option<usize>,
    pub ranks_per_process: Option<usize>,
    /// Hardware: the wire between nodes (`--wire`, over `EPTWIN_WIRE`).
    pub wire: Option<WireArg>,
}

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
    let mut code = ExitCode::Ok;
    for path in scenarios {
        let Some(plan) = load_plan(path) else {
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
        let (result, trace_json) = execute_as(&plan, backend, trace.is_some(), launcher, o.wire)
            .with_context(|| format!("running {}", path.display()))?;
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

/// Writes `DIR/<scenario name>.json` and prints the table (or the document with `--json`).
pub fn write_result(result: &RunResult, out: &Path, json: bool) -> Result<PathBuf> {
    let file = result_path(out, &result.scenario.name, None);
    write_atomic(&file, &result.to_json())?;
    tracing::info!("wrote {}", file.display());
    if json {
        println!("{}", serde_json::to_string(result)?);
    } else {
        print!("{}", eptwin_reports::table::render(result));
        println!("# result: {}", file.display());
    }
    Ok(file)
}

/// Run one plan on one backend; the simulator also hands back its trace when asked.
pub fn execute(
    plan: &eptwin_engine::Plan,
    backend: BackendArg,
    trace: bool,
) -> Result<(RunResult, Option<String>)> {
    execute_as(plan, backend, trace, Launcher::Single, None)
}

/// [`execute`] in a process that `launcher` started (recorded in a hardware result), over the
/// `wire` between nodes.
fn execute_as(
    plan: &eptwin_engine::Plan,
    backend: BackendArg,
    trace: bool,
    launcher: Launcher,
    wire: Option<WireArg>,
) -> Result<(RunResult, Option<String>)> {
    match backend {
        BackendArg::Sim => {
            let mut sim = eptwin_sim::Simulator::new(eptwin_sim::SimOptions { trace });
            let result = eptwin_engine::run::run(plan, &mut sim, provenance(backend))?;
            Ok((result, sim.trace_json()))
        }
        BackendArg::Hw => {
            let mut hw = eptwin_hw::HwTransport::single(super::hw_options(wire), launcher);
            Ok((eptwin_engine::run::run(plan, &mut hw, provenance(backend))?, None))
        }
    }
}
