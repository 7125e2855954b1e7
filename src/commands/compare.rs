//! `eptwin compare`: the simulator and the hardware (run here, or measured earlier and read
//! back with `--measured`) on the same scenario, side by side.
//!
//! Exit code: the worst of the two sides' verdicts (no measurement ⇒ waived, 77), and 1 when
//! `--tolerance` is given and a simulated mean latency misses the measured one by more.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use eptwin_engine::api::{RunResult, Verdict, result_path, write_atomic};
use eptwin_reports::{Comparison, Inputs};

use super::plan_loaded;
use super::run::{execute, load_distinct, writable_dir};
use crate::cli::BackendArg;
use crate::{ExitCode, out, outln};

pub fn compare(
    scenarios: &[PathBuf],
    out: &Path,
    measured: &[PathBuf],
    tolerance: Option<f64>,
    json: bool,
) -> Result<ExitCode> {
    let measured_results = if measured.is_empty() {
        None
    } else {
        let inputs = Inputs::load(measured).context("reading --measured")?;
        // Measured: by eptwin's hardware backend, or imported from DeepEP's own tests.
        let measured: Vec<_> = inputs.results.into_iter().filter(|r| r.doc.is_measured()).collect();
        tracing::info!("{} measured result(s) read", measured.len());
        Some(measured)
    };
    writable_dir(out, "--out")?;
    let (loaded, mut code) = load_distinct(scenarios);
    let Some(loaded) = loaded else { return Ok(ExitCode::BadInput) };
    let mut comparisons = Vec::new();
    for (path, scenario) in &loaded {
        let Some(plan) = plan_loaded(scenario) else {
            code = code.worst(ExitCode::BadInput);
            continue;
        };
        let name = plan.name.clone();
        let (sim, _) = execute(&plan, BackendArg::Sim, false)
            .with_context(|| format!("simulating {}", path.display()))?;
        let sim_path = result_path(out, &name, Some("sim"));
        write_atomic(&sim_path, &sim.to_json())?;
        let mut unused_measured = Vec::new();
        let (meas, meas_path): (Option<RunResult>, Option<PathBuf>) = match &measured_results {
            Some(list) => {
                let (found, unused) = eptwin_reports::compare::pick_measured(
                    list,
                    &name,
                    Some(plan.scenario_sha256.as_str()),
                );
                unused_measured = unused;
                if found.is_none() {
                    eprintln!(
                        "eptwin: no measured result of {name:?} among {}",
                        measured
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                (found.map(|r| r.doc.clone()), found.map(|r| r.path.clone()))
            }
            None => {
                let (hw, _) = execute(&plan, BackendArg::Hw, false)
                    .with_context(|| format!("running {} on the hardware", path.display()))?;
                let p = result_path(out, &name, Some("hw"));
                write_atomic(&p, &hw.to_json())?;
                (Some(hw), Some(p))
            }
        };
        if let Some(m) = &meas
            && m.scenario.sha256 != plan.scenario_sha256
        {
            tracing::warn!(
                "{name}: the measured result ran a different scenario text (sha256 {} vs {})",
                m.scenario.sha256,
                plan.scenario_sha256
            );
        }
        let mut comparison = Comparison::new(
            Some((sim_path.as_path(), &sim)),
            meas.as_ref().zip(meas_path.as_deref()).map(|(r, p)| (p, r)),
        );
        comparison.unused_measured = unused_measured;
        let cmp_path = eptwin_reports::compare::comparison_path(out, &name);
        write_atomic(&cmp_path, &comparison.to_json())?;
        tracing::info!("wrote {}", cmp_path.display());
        code = code.worst(ExitCode::from_verdict(sim.verdict));
        code = code
            .worst(ExitCode::from_verdict(meas.as_ref().map_or(Verdict::Waived, |m| m.verdict)));
        if let (Some(tol), Some(worst)) = (tolerance, comparison.max_abs_latency_error_pct())
            && worst > tol
        {
            eprintln!("eptwin: {name}: simulated latency off by {worst:.1} % (> {tol} %)");
            code = code.worst(ExitCode::Failed);
        }
        if json {
            outln!("{}", serde_json::json!({ "type": "comparison", "data": comparison }));
        }
        comparisons.push(comparison);
    }
    if !json {
        out!("{}", eptwin_reports::render_table(&comparisons));
        outln!("# results and comparisons in {}", out.display());
    }
    Ok(code)
}
