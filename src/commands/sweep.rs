//! `eptwin sweep`: one scenario, a grid of edited copies (`--set KEY=V1,V2,...`), run in
//! parallel with a progress bar (indicatif) on stderr, shardable over machines. The plan, the
//! grid runner and the index are library code (`eptwin_engine::sweep`,
//! `eptwin_reports::sweep`); this is the glue: arguments, threads, progress, output.
//!
//! The index (`index.json`, or `index.shard-K-of-N.json`) lists every point of the shard with
//! its values, files, verdict and key numbers.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use eptwin_engine::api::write_atomic;
use eptwin_engine::sweep::{Shard, SweepKey, SweepPlan, run_grid, run_point};
use eptwin_reports::{SweepIndex, SweepPoint};

use super::{provenance, transport};
use crate::cli::BackendArg;
use crate::{ExitCode, out, outln};

fn thread_count(requested: Option<usize>, backend: BackendArg) -> usize {
    if backend == BackendArg::Hw {
        if requested.is_some_and(|t| t > 1) {
            tracing::warn!("hardware points run one at a time: they share the GPUs");
        }
        return 1;
    }
    requested
        .or_else(|| std::env::var("SLURM_CPUS_PER_TASK").ok()?.parse().ok())
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .max(1)
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
    let keys: Vec<SweepKey> = sets.iter().map(|s| SweepKey::parse(s)).collect::<Result<_, _>>()?;
    let loaded = match eptwin_engine::load(scenario) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::BadInput);
        }
    };
    let text = std::fs::read_to_string(scenario)?;
    let file = scenario.display().to_string();
    let shard = match shard {
        Some(s) => Shard::parse(s)?,
        None => Shard::from_slurm(|k| std::env::var(k).ok())?.unwrap_or(Shard::ALL),
    };
    let plan = SweepPlan::new(&file, &text, &loaded, &keys, shard)?;
    for key in &plan.absent_keys {
        // Environment tables take any name, so a misspelt variable would sweep nothing.
        eprintln!("eptwin: note: {key} is not set in {file}; every point adds it");
    }
    let dir: PathBuf = match out {
        Some(d) => d.to_path_buf(),
        None => Path::new("out").join(format!("sweep-{}", plan.base_name)),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let threads = thread_count(threads, backend);
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
    #[allow(clippy::disallowed_methods)] // real time of the sweep itself, never in a result
    let started = std::time::Instant::now();
    let runs = run_grid(&plan.points, threads, |p| {
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
            eptwin_engine::sweep::PointOutcome::Ran(result) => {
                ExitCode::from_verdict(result.verdict)
            }
            eptwin_engine::sweep::PointOutcome::Invalid(_) => ExitCode::BadInput,
            eptwin_engine::sweep::PointOutcome::Failed(_) => ExitCode::Failed,
        })
    });
    let backend_name = match backend {
        BackendArg::Sim => "sim",
        BackendArg::Hw => "hw",
    };
    let index = SweepIndex::new(&plan, backend_name, runs.into_iter().map(|r| r.0).collect());
    let index_path = dir.join(SweepIndex::file_name(shard));
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
    Ok(code)
}
