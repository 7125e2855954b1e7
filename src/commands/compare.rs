//! `eptwin compare`: the simulator and the hardware (run here, or measured earlier and read
//! back with `--measured`) on the same scenario, side by side.
//!
//! A measured result is compared only when it ran the same scenario text (sha256) on the GPU
//! the scenario's profile models (or one named with `--allow-other-gpu`); when several do, the
//! comparison would be a guess, so it is an error naming them. Every measured file read and
//! not compared is named with why (`-v`; a file that is no document at all, always).
//!
//! Exit code: 2 for a measured document holding an impossible value, several candidates, or
//! rows that do not pair (another job, op or rank count); else the worst of the two sides'
//! verdicts (no measurement ⇒ waived, 77), and 1 when `--tolerance` is given and a simulated
//! mean latency misses the measured one by more.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use eptwin_engine::api::{Outputs, Plan, RunResult, Verdict, result_path, write_atomic};
use eptwin_reports::compare::{Expected, Measured, Unused, unpaired_rows};
use eptwin_reports::{Comparison, Inputs, Loaded};

use super::run::{execute, load_distinct, plan_all};
use crate::cli::BackendArg;
use crate::{ExitCode, out, outln};

/// `eptwin compare`'s options besides the scenarios.
pub struct CompareOptions {
    pub out: PathBuf,
    pub measured: Vec<PathBuf>,
    pub tolerance: Option<f64>,
    pub allow_other_gpu: Vec<String>,
    /// `--allow-other-text`: measurements of another scenario text of the same name are
    /// candidates too.
    pub allow_other_text: bool,
    pub json: bool,
}

/// A measured result chosen for one scenario, and the others read with why not.
type Choice<'a> = (Option<&'a Loaded<RunResult>>, Vec<Unused>);

pub fn compare(scenarios: &[PathBuf], o: &CompareOptions) -> Result<ExitCode> {
    let Some(measured) = read_measured(&o.measured) else { return Ok(ExitCode::BadInput) };
    if measured.is_none() {
        super::warn_hw_env(None);
    }
    let (loaded, mut code) = load_distinct(scenarios);
    let Some(loaded) = loaded else { return Ok(ExitCode::BadInput) };
    let plans = plan_all(&loaded, &mut code);
    let mut choices: Vec<Option<Choice<'_>>> = Vec::new();
    for (_, plan) in &plans {
        match &measured {
            Some(list) => match choose(list, plan, &o.allow_other_gpu, o.allow_other_text) {
                Some(choice) => choices.push(Some(choice)),
                None => return Ok(ExitCode::BadInput),
            },
            None => choices.push(None),
        }
    }
    check_outputs(&loaded, measured.as_deref(), &plans, &o.out)?;
    let mut comparisons = Vec::new();
    for ((path, plan), choice) in plans.iter().zip(choices) {
        let name = plan.name.clone();
        let (sim, _) = execute(plan, BackendArg::Sim, false)
            .with_context(|| format!("simulating {}", path.display()))?;
        let sim_path = result_path(&o.out, &name, Some("sim"));
        write_atomic(&sim_path, &sim.to_json())?;
        let (meas, meas_path, unused) = match choice {
            Some((taken, unused)) => {
                (taken.map(|r| r.doc.clone()), taken.map(|r| r.path.clone()), unused)
            }
            None => {
                let (hw, _) = execute(plan, BackendArg::Hw, false)
                    .with_context(|| format!("running {} on the hardware", path.display()))?;
                let p = result_path(&o.out, &name, Some("hw"));
                write_atomic(&p, &hw.to_json())?;
                (Some(hw), Some(p), Vec::new())
            }
        };
        if let Some(m) = meas.as_ref().filter(|m| !m.jobs.iter().all(|j| j.ops.is_empty())) {
            let unpaired = unpaired_rows(&sim, m);
            if !unpaired.is_empty() {
                eprintln!(
                    "eptwin: error: {name}: the measured result {} does not describe the same \
                     runs as the simulation; rows that do not pair:",
                    meas_path.as_deref().unwrap_or(Path::new("?")).display()
                );
                for row in unpaired {
                    eprintln!("eptwin:   {row}");
                }
                code = code.worst(ExitCode::BadInput);
                continue;
            }
        }
        let mut comparison = Comparison::new(
            Some((sim_path.as_path(), &sim)),
            meas.as_ref().zip(meas_path.as_deref()).map(|(r, p)| (p, r)),
        );
        comparison.unused_measured = unused;
        let cmp_path = eptwin_reports::compare::comparison_path(&o.out, &name);
        write_atomic(&cmp_path, &comparison.to_json())?;
        tracing::info!("wrote {}", cmp_path.display());
        code = code.worst(ExitCode::from_verdict(sim.verdict));
        code = code
            .worst(ExitCode::from_verdict(meas.as_ref().map_or(Verdict::Waived, |m| m.verdict)));
        if let (Some(tol), Some(worst)) = (o.tolerance, comparison.max_abs_latency_error_pct())
            && worst > tol
        {
            eprintln!("eptwin: {name}: simulated latency off by {worst:.1} % (> {tol} %)");
            code = code.worst(ExitCode::Failed);
        }
        if o.json {
            outln!("{}", serde_json::json!({ "type": "comparison", "data": comparison }));
        }
        comparisons.push(comparison);
    }
    if !o.json {
        out!("{}", eptwin_reports::render_table(&comparisons));
        outln!("# results and comparisons in {}", o.out.display());
    }
    Ok(code)
}

/// The measured results among `paths` (`None` inside: no `--measured`, run the hardware);
/// `None` after printing why when one cannot be read as asked (exit 2). Every file read past
/// is named: garbage always, other documents and simulator results with `-v`.
fn read_measured(paths: &[PathBuf]) -> Option<Option<Vec<Loaded<RunResult>>>> {
    if paths.is_empty() {
        return Some(None);
    }
    let inputs = match Inputs::load(paths) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("eptwin: error: --measured: {e}");
            return None;
        }
    };
    for (path, why) in &inputs.unreadable {
        eprintln!("eptwin: --measured: skipped {}: {why}", path.display());
    }
    for (path, why) in &inputs.ignored {
        tracing::info!("--measured: skipped {}: {why}", path.display());
    }
    // Measured: by eptwin's hardware backend, or imported from DeepEP's own tests.
    let (measured, other): (Vec<_>, Vec<_>) =
        inputs.results.into_iter().partition(|r| r.doc.is_measured());
    for r in &other {
        tracing::info!(
            "--measured: skipped {}: a {} result, not a measurement",
            r.path.display(),
            r.doc.backend_kind()
        );
    }
    tracing::info!("{} measured result(s) read", measured.len());
    Some(Some(measured))
}

/// The measured result to compare `plan` with: none when none may be (every file of its name
/// is named with why), `None` after printing the candidates when several may.
fn choose<'a>(
    list: &'a [Loaded<RunResult>],
    plan: &Plan,
    allow_other_gpu: &[String],
    allow_other_text: bool,
) -> Option<Choice<'a>> {
    let name = &plan.name;
    let expected =
        Expected { sha256: &plan.scenario_sha256, gpu: &plan.profile.gpu.name, allow_other_text };
    let found = Measured::of(list, name, Some(expected), allow_other_gpu);
    if found.candidates.len() > 1 {
        eprintln!(
            "eptwin: error: {name}: {} measured results ran this scenario text on the {} its \
             profile models; which one to compare is not for eptwin to guess — give one of \
             them to --measured:",
            found.candidates.len(),
            plan.profile.gpu.name
        );
        for c in &found.candidates {
            eprintln!("eptwin:   {}", c.path.display());
        }
        return None;
    }
    let none = found.candidates.is_empty();
    for skipped in &found.skipped {
        if none {
            eprintln!("eptwin: {name}: not compared with {}: {}", skipped.file, skipped.reason);
        } else {
            tracing::info!("{name}: not compared with {}: {}", skipped.file, skipped.reason);
        }
    }
    if none && found.without_ops.is_empty() {
        eprintln!("eptwin: no measured result of {name:?} to compare with");
    }
    Some(found.take())
}

/// Claim every file the comparison writes before anything runs (engine/src/files.rs).
fn check_outputs(
    loaded: &super::run::Scenarios,
    measured: Option<&[Loaded<RunResult>]>,
    plans: &[(&PathBuf, Plan)],
    out: &Path,
) -> Result<()> {
    let mut outputs = Outputs::new();
    for (path, _) in loaded {
        outputs.input(path, &format!("the scenario {}", path.display()));
    }
    for m in measured.into_iter().flatten() {
        outputs.input(&m.path, &format!("the measured result {}", m.path.display()));
    }
    outputs.directory(out, "--out")?;
    for (_, plan) in plans {
        let name = &plan.name;
        outputs
            .claim(&result_path(out, name, Some("sim")), &format!("the sim result of {name}"))?;
        if measured.is_none() {
            outputs
                .claim(&result_path(out, name, Some("hw")), &format!("the hw result of {name}"))?;
        }
        let comparison = eptwin_reports::compare::comparison_path(out, name);
        outputs.claim(&comparison, &format!("the comparison of {name}"))?;
    }
    Ok(())
}
