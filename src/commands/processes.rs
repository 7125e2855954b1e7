//! `eptwin run --backend hw` as one of several processes (docs/cluster.md): started by a
//! launcher (srun, torchrun, mpirun) or by `--spawn N`, every process checks the process count
//! against the scenario, joins the others at `MASTER_ADDR:MASTER_PORT`, and runs the same run
//! loop over its own block of ranks; process 0 alone prints the table and writes the result,
//! and every process exits with the verdict's code.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use eptwin_engine::api::{Plan, Rank};
use eptwin_group::{
    GroupConfig, LaunchInfo, ProcessGroup, SpawnOptions, Timeouts, check_blocks_on_one_node,
    rank_blocks, spawn_with,
};
use eptwin_hw::HwTransport;
use eptwin_hw::processes::Processes;

use super::results::write_result;
use super::{RunOptions, provenance};
use crate::ExitCode;
use crate::cli::BackendArg;

/// How long the processes wait for each other at the end of a run (process 0 writes the
/// result first).
const FINISH_TIMEOUT: Duration = Duration::from_secs(60);

/// `--spawn N`: this command again, N times on this machine, without `--spawn`; process 0's
/// stdout is passed through as it is, everything else with a `[pN] ` prefix.
pub fn spawn_local(
    n: usize,
    plans: &[(&PathBuf, Plan)],
    ranks_per_process: Option<usize>,
) -> Result<ExitCode> {
    if n == 0 {
        bail!("--spawn needs at least one process");
    }
    // The checks each process would make, made once before any starts.
    let [(path, plan)] = plans else {
        bail!("--spawn: a run of several processes takes one scenario, {} given", plans.len());
    };
    let blocks = rank_blocks(plan.topology.num_ranks() as usize, n, ranks_per_process)
        .map_err(|e| anyhow::anyhow!("{}: --spawn {n}: {e}", path.display()))?;
    let node_of = |r: usize| plan.topology.node_of_rank(Rank(r as u32)) as usize;
    check_blocks_on_one_node(&blocks, node_of)
        .map_err(|e| anyhow::anyhow!("{}: --spawn {n}: {e}", path.display()))?;
    spawn_this_command(n)
}

/// This command again, N times on this machine, without `--spawn` (`eptwin doctor --spawn N`
/// too, which has no ranks to check first).
pub fn spawn_this_command(n: usize) -> Result<ExitCode> {
    if n == 0 {
        bail!("--spawn needs at least one process");
    }
    let exe = std::env::current_exe().context("finding this executable to spawn it")?;
    let args = without_spawn(std::env::args_os().skip(1));
    let options = SpawnOptions { unprefixed_stdout: Some(0), ..SpawnOptions::default() };
    let report = spawn_with(n, &exe, &args, &[], &options)?;
    for exit in report.exits.iter().filter(|e| !e.success() && e.code != Some(77)) {
        eprintln!("eptwin: {}", exit.describe());
    }
    Ok(exit_code(report.exit_code()))
}

/// The arguments without `--spawn N` / `--spawn=N`.
fn without_spawn(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in args {
        if skip_value {
            skip_value = false;
            continue;
        }
        match a.to_str() {
            Some("--spawn") => skip_value = true,
            Some(s) if s.starts_with("--spawn=") => {}
            _ => out.push(a),
        }
    }
    out
}

fn exit_code(code: i32) -> ExitCode {
    match code {
        0 => ExitCode::Ok,
        2 => ExitCode::BadInput,
        77 => ExitCode::Waived,
        _ => ExitCode::Failed,
    }
}

/// One process of a launch of several.
pub fn run_in_group(
    launch: &LaunchInfo,
    scenarios: &[PathBuf],
    plans: &[(&PathBuf, Plan)],
    o: &RunOptions,
) -> Result<ExitCode> {
    let me = format!("process {} of {}", launch.process_rank, launch.process_count);
    let [path] = scenarios else {
        eprintln!(
            "eptwin: error: {me} ({} launch): a run of several processes takes one scenario, \
             {} given",
            launch.launcher,
            scenarios.len()
        );
        return Ok(ExitCode::BadInput);
    };
    debug_assert_eq!(o.backend, BackendArg::Hw);
    // Its diagnostics are printed already.
    let [(_, plan)] = plans else { return Ok(ExitCode::BadInput) };
    let ranks = plan.topology.num_ranks() as usize;
    let bad = |e: &dyn std::fmt::Display| {
        eprintln!("eptwin: error: {}: {e}", path.display());
        Ok(ExitCode::BadInput)
    };
    let blocks = match rank_blocks(ranks, launch.process_count, o.ranks_per_process) {
        Ok(b) => b,
        Err(e) => return bad(&e),
    };
    let node_of = |r: usize| plan.topology.node_of_rank(Rank(r as u32)) as usize;
    if let Err(e) = check_blocks_on_one_node(&blocks, node_of) {
        return bad(&e);
    }
    let timeouts = match Timeouts::from_env(&|k| std::env::var(k).ok()) {
        Ok(t) => t,
        Err(e) => return bad(&e),
    };
    let config = GroupConfig {
        launch: launch.clone(),
        // The scenario's routing files too: each process reads them on its own machine.
        scenario_sha256: plan.inputs_sha256(),
        eptwin_version: eptwin_engine::VERSION.to_string(),
        timeouts,
    };
    let failed = |e: &dyn std::fmt::Display| {
        eprintln!("eptwin: {me}: {e}");
        Ok(ExitCode::Failed)
    };
    let group = match ProcessGroup::join(&config) {
        Ok(g) => g,
        Err(e) => return failed(&e),
    };
    let procs = Processes::new(group, launch, blocks);
    let mut hw = match HwTransport::in_processes(super::hw_options(o.wire), procs) {
        Ok(hw) => hw,
        Err(e) => return failed(&e),
    };
    let result = eptwin_engine::api::run(plan, &mut hw, provenance(BackendArg::Hw))
        .with_context(|| format!("running {}", path.display()))?;
    let mut code = ExitCode::from_verdict(result.verdict);
    if launch.process_rank == 0 {
        write_result(&result, &o.out, o.json)?;
    }
    if let Err(e) = hw.finish(FINISH_TIMEOUT) {
        eprintln!("eptwin: {me}: {e}");
        code = code.worst(ExitCode::Failed);
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawned_processes_get_the_command_without_spawn() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        let given = args(&["run", "s.toml", "--spawn", "8", "--backend", "hw", "--spawn=2"]);
        assert_eq!(without_spawn(given.into_iter()), args(&["run", "s.toml", "--backend", "hw"]));
    }

    #[test]
    fn spawner_codes_map_to_the_documented_exit_codes() {
        assert_eq!(exit_code(0), ExitCode::Ok);
        assert_eq!(exit_code(77), ExitCode::Waived);
        assert_eq!(exit_code(2), ExitCode::BadInput);
        assert_eq!(exit_code(1), ExitCode::Failed);
        assert_eq!(exit_code(137), ExitCode::Failed);
    }
}
