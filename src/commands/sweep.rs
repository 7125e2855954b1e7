//! `eptwin sweep`: one scenario, a grid of edited copies (`--set KEY=V1,V2,...`), run in
//! parallel with a progress bar (indicatif) on stderr, shardable over machines. The plan, the
//! grid runner and the index are library code (`eptwin_engine::sweep`,
//! `eptwin_reports::sweep`); this is the glue: arguments, threads, progress, output.
//!
//! The index (`index.json`, or `index.shard-K-of-N.json`) lists every point of the shard with
//! its values, files, verdict and key numbers.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use eptwin_engine::api::{Outputs, write_atomic};
use eptwin_engine::sweep::{PointOutcome, Shard, SweepKey, SweepPlan, run_grid, run_point};
use eptwin_reports::{SweepIndex, SweepPoint};

use super::{provenance, transport};
use crate::cli::BackendArg;
use crate::{ExitCode, interrupt, out, outln};

/// The most worker threads a sweep starts: far above any machine's cores, and quick to start.
const MAX_THREADS: usize = 1024;

fn thread_count(requested: Option<usize>, backend: BackendArg, points: usize) -> Result<usize> {
    if backend == BackendArg::Hw {
        if requested.is_some_and(|t| t > 1) {
            tracing::warn!("hardware points run one at a time: they share the GPUs");
        }
        return Ok(1);
    }
    if let Some(t) = requested
        && !(1..=MAX_THREADS).contains(&t)
    {
        bail!("--threads {t}: from 1 to {MAX_THREADS}");
    }
    let threads = requested
        .or_else(|| std::env::var("SLURM_CPUS_PER_TASK").ok()?.parse().ok())
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .clamp(1, MAX_THREADS);
    // No more threads than points.
    Ok(threads.min(points.max(1)))
}

pub fn sweep(
    scenario: &Path,
    sets: &[String],
    shard: Option<&str>,
    out: Option<&Path>,
    backend: BackendArg,
    threads: Option<usize>,
    json: bool,
) -> Result<ExitCode> {
    if backend == BackendArg::Hw {
        super::warn_hw_env(None);
    }
    let keys: Vec<SweepKey> = sets.iter().map(|s| SweepKey::parse(s)).collect::<Result<_, _>>()?;
    let loaded = match eptwin_engine::load(scenario) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::BadInput);
        }
    };
    let file = scenario.display().to_string();
    let shard = match shard {
        Some(s) => Shard::parse(s)?,
        None => Shard::from_slurm(|k| std::env::var(k).ok())?.unwrap_or(Shard::ALL),
    };
    let plan = SweepPlan::new(&file, loaded.source.text(), &loaded, &keys, shard)?;
    for key in &plan.absent_keys {
        // Environment tables take any name, so a misspelt variable would sweep nothing.
        eprintln!("eptwin: note: {key} is not set in {file}; every point adds it");
    }
    let dir: PathBuf = match out {
        Some(d) => d.to_path_buf(),
        None => Path::new("out").join(format!("sweep-{}", plan.base_name)),
    };
    let threads = thread_count(threads, backend, plan.points.len())?;
    let index_path = dir.join(SweepIndex::file_name(shard));
    check_outputs(scenario, &dir, &plan, &index_path)?;
    eprintln!(
        "eptwin sweep: {} point(s) of {} (shard {}/{}) on {threads} thread(s) -> {}",
        plan.points.len(),
        plan.total_points,
        shard.index,
        shard.count,
        dir.display()
    );
    let bar = indicatif::ProgressBar::new(plan.points.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} points {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let new_backend = || transport(backend, false, None);
    let new_provenance = || provenance(backend);
    interrupt::catch();
    #[allow(clippy::disallowed_methods)] // real time of the sweep itself, never in a result
    let started = std::time::Instant::now();
    let runs = run_grid(&plan.points, threads, |p| {
        if interrupt::interrupted() {
            let outcome = PointOutcome::NotRun("the sweep was interrupted (Ctrl-C) first".into());
            return (SweepPoint::new(p, &plan.keys, &outcome), outcome, 0.0);
        }
        #[allow(clippy::disallowed_methods)] // as above
        let point_started = std::time::Instant::now();
        let outcome = run_point(p, &dir, &new_backend, &new_provenance);
        let wall_s = point_started.elapsed().as_secs_f64();
        let entry = SweepPoint::new(p, &plan.keys, &outcome);
        tracing::info!("point {} ({}): {} in {wall_s:.2} s", p.index, p.name, entry.verdict);
        bar.set_message(format!("last: point {} {}", p.index, entry.verdict));
        bar.inc(1);
        (entry, outcome, wall_s)
    })?;
    bar.finish_and_clear();
    let wall_s = started.elapsed().as_secs_f64();
    let summed_s: f64 = runs.iter().map(|r| r.2).sum();
    let code = runs.iter().fold(ExitCode::Ok, |c, (_, outcome, _)| {
        c.worst(match outcome {
            PointOutcome::Ran(result) => ExitCode::from_verdict(result.verdict),
            PointOutcome::Invalid(_) => ExitCode::BadInput,
            PointOutcome::Failed(_) | PointOutcome::NotRun(_) => ExitCode::Failed,
        })
    });
    let backend_name = match backend {
        BackendArg::Sim => "sim",
        BackendArg::Hw => "hw",
    };
    let index = SweepIndex::new(&plan, backend_name, runs.into_iter().map(|r| r.0).collect());
    write_atomic(&index_path, &index.to_json())?;
    eprintln!(
        "eptwin sweep: {} point(s) in {wall_s:.2} s wall on {threads} thread(s); {summed_s:.2} s summed over points ({:.2}x)",
        index.points.len(),
        if wall_s > 0.0 { summed_s / wall_s } else { 0.0 }
    );
    if json {
        outln!("{}", serde_json::to_string(&index)?);
    } else {
        out!("{}", index.render_table(&plan.labels));
        outln!("# index: {}", index_path.display());
    }
    if interrupt::interrupted() {
        eprintln!("eptwin sweep: interrupted; the index lists the points not run");
        interrupt::exit_by_sigint();
    }
    Ok(code)
}

/// Claim every file the sweep writes before any point runs (engine/src/files.rs): each
/// point's scenario and result, and the index; none may be the base scenario.
fn check_outputs(scenario: &Path, dir: &Path, plan: &SweepPlan, index: &Path) -> Result<()> {
    let mut outputs = Outputs::new();
    outputs.input(scenario, &format!("the scenario {}", scenario.display()));
    outputs.directory(dir, "--out")?;
    for p in &plan.points {
        let toml = dir.join(format!("{}.toml", p.name));
        outputs.claim(&toml, &format!("sweep point {}'s scenario", p.index))?;
        let json = dir.join(format!("{}.json", p.name));
        outputs.claim(&json, &format!("sweep point {}'s result", p.index))?;
    }
    outputs.claim(index, "the sweep index")?;
    Ok(())
}
