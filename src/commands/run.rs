//! `eptwin run`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use eptwin_engine::result::{RunResult, result_path, write_atomic};

use super::{load_plan, provenance};
use crate::ExitCode;
use crate::cli::{BackendArg, WireArg};

pub fn run(
    scenarios: &[PathBuf],
    backend: BackendArg,
    out: &Path,
    json: bool,
    trace: Option<&Path>,
    wire: Option<WireArg>,
) -> Result<ExitCode> {
    if trace.is_some() && (scenarios.len() != 1 || backend != BackendArg::Sim) {
        bail!("--trace takes one scenario on the simulator backend");
    }
    let mut code = ExitCode::Ok;
    for path in scenarios {
        let Some(plan) = load_plan(path) else {
            code = code.worst(ExitCode::BadInput);
            continue;
        };
        let (result, trace_json) = execute(&plan, backend, trace.is_some(), wire)
            .with_context(|| format!("running {}", path.display()))?;
        let file = result_path(out, &plan.scenario.name, None);
        write_atomic(&file, &result.to_json())?;
        tracing::info!("wrote {}", file.display());
        if let (Some(trace_path), Some(trace_json)) = (trace, trace_json) {
            write_atomic(trace_path, &trace_json)?;
            eprintln!(
                "eptwin: trace written to {} (open in https://ui.perfetto.dev)",
                trace_path.display()
            );
        }
        if json {
            println!("{}", serde_json::to_string(&result)?);
        } else {
            print!("{}", eptwin_reports::table::render(&result));
            println!("# result: {}", file.display());
        }
        code = code.worst(ExitCode::from_verdict(result.verdict));
    }
    Ok(code)
}

/// Run one plan on one backend; the simulator also hands back its trace when asked.
pub fn execute(
    plan: &eptwin_engine::Plan,
    backend: BackendArg,
    trace: bool,
    wire: Option<WireArg>,
) -> Result<(RunResult, Option<String>)> {
    match backend {
        BackendArg::Sim => {
            let mut sim = eptwin_sim::Simulator::new(eptwin_sim::SimOptions { trace });
            let result = eptwin_engine::run::run(plan, &mut sim, provenance(backend))?;
            Ok((result, sim.trace_json()))
        }
        BackendArg::Hw => {
            let mut hw = super::transport(backend, false, wire);
            Ok((eptwin_engine::run::run(plan, hw.as_mut(), provenance(backend))?, None))
        }
    }
}
