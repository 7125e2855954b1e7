//! One function per subcommand; each returns the exit code.

mod calibrate;
mod compare;
mod deepep;
mod doctor;
mod env;
mod processes;
mod report;
mod results;
mod run;
mod sweep;
mod topo;
mod validate;

use std::path::PathBuf;

use anyhow::Result;
use eptwin_engine::api::Provenance;
use eptwin_engine::api::Transport;

use crate::ExitCode;
use crate::cli::{BackendArg, Command, WireArg};

pub fn dispatch(command: Command) -> Result<ExitCode> {
    match command {
        Command::Run { scenarios, backend, out, json, trace, wire, spawn, ranks_per_process } => {
            let options = RunOptions { backend, out, json, trace, spawn, ranks_per_process, wire };
            run::run(&scenarios, &options)
        }
        Command::Validate { scenarios } => validate::validate(&scenarios),
        Command::Env { scenario, job, explain } => env::env(&scenario, job.as_deref(), explain),
        Command::Topo { scenario, disable_nvlink, hw } => {
            topo::topo(scenario.as_deref(), disable_nvlink, hw)
        }
        Command::Compare {
            scenarios,
            out,
            measured,
            tolerance,
            allow_other_gpu,
            allow_other_text,
            json,
        } => {
            let options = compare::CompareOptions {
                out,
                measured,
                tolerance,
                allow_other_gpu,
                allow_other_text,
                json,
            };
            compare::compare(&scenarios, &options)
        }
        Command::Report { results, out, json } => report::report(&results, &out, json),
        Command::Sweep { scenario, sets, shard, out, backend, threads, json } => {
            sweep::sweep(&scenario, &sets, shard.as_deref(), out.as_deref(), backend, threads, json)
        }
        Command::Deepep { command } => deepep::dispatch(command),
        Command::Calibrate {
            backend,
            base,
            out,
            name,
            from,
            deepep_dir,
            deepep_runs,
            python,
            deepep_timeout_s,
            deepep_budget_s,
            deepep_only,
            nic_only,
        } => {
            if backend == BackendArg::Sim && from.is_empty() && !deepep_only && !nic_only {
                eprintln!(
                    "eptwin: calibrate --backend sim has nothing to probe: give --from RESULT.json"
                );
                return Ok(ExitCode::BadInput);
            }
            let options = calibrate::Options {
                base,
                out,
                name,
                from,
                deepep_dir,
                deepep_runs,
                python,
                deepep_timeout: std::time::Duration::from_secs(deepep_timeout_s),
                deepep_budget: deepep_budget_s.map(std::time::Duration::from_secs),
                deepep_only,
                nic_only,
            };
            calibrate::calibrate(&options)
        }
        Command::Doctor { scenario, json, node, spawn } => {
            doctor::doctor(scenario.as_deref(), json, node.as_deref(), spawn)
        }
    }
}

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

/// A backend for `run`, `compare` and `sweep`; `wire` overrides `EPTWIN_WIRE`.
pub fn transport(backend: BackendArg, trace: bool, wire: Option<WireArg>) -> Box<dyn Transport> {
    match backend {
        BackendArg::Sim => Box::new(eptwin_sim::Simulator::new(eptwin_sim::SimOptions { trace })),
        BackendArg::Hw => Box::new(eptwin_hw::HwTransport::new(hw_options(wire))),
    }
}

/// The hardware backend's options: `EPTWIN_*`, with `wire` (`--wire`) over `EPTWIN_WIRE`.
pub fn hw_options(wire: Option<WireArg>) -> eptwin_hw::HwOptions {
    let mut options = eptwin_hw::HwOptions::from_env();
    if let Some(w) = wire {
        options.wire = Ok(w.request());
    }
    options
}

/// Say on stderr what is wrong with the hardware backend's environment before anything runs
/// (an invalid `EPTWIN_WIRE` otherwise shows only in the waiver of a scenario that crosses
/// nodes, and not at all when the run is waived for another reason first).
pub fn warn_hw_env(wire: Option<WireArg>) {
    if let Err(e) = &hw_options(wire).wire {
        eprintln!(
            "eptwin: warning: {e}; a scenario whose ranks cross nodes is waived for it \
             (--wire overrides it)"
        );
    }
}

/// Who made a result. Simulator results carry no timestamp or host so that they are
/// byte-identical on every machine; hardware results say when and where they were measured.
pub fn provenance(backend: BackendArg) -> Provenance {
    let mut p = Provenance {
        version: eptwin_engine::VERSION.to_string(),
        git_commit: env!("EPTWIN_GIT_COMMIT").to_string(),
        ..Provenance::default()
    };
    if backend == BackendArg::Hw {
        p.created_at = Some(now_rfc3339());
        p.host = std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string());
        p.command = Some(std::env::args().collect::<Vec<_>>().join(" "));
    }
    p
}

/// The current time, RFC 3339 in UTC to the second (`2026-12-02T10:11:12Z`): provenance of
/// hardware results only.
pub(crate) fn now_rfc3339() -> String {
    rfc3339(jiff::Timestamp::now())
}

fn rfc3339(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Load and plan a scenario, printing diagnostics to stderr. `None` ⇒ bad input (exit 2).
pub fn load_plan(path: &std::path::Path) -> Option<eptwin_engine::Plan> {
    load_with_plan(path).map(|(_, plan)| plan)
}

/// The parsed scenario and its plan, or `None` after printing why (as [`load_plan`]).
pub fn load_with_plan(
    path: &std::path::Path,
) -> Option<(eptwin_engine::LoadedScenario, eptwin_engine::Plan)> {
    let loaded = match eptwin_engine::load(path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return None;
        }
    };
    let plan = plan_loaded(&loaded)?;
    Some((loaded, plan))
}

/// Plan a loaded scenario, printing diagnostics to stderr. `None` ⇒ bad input (exit 2).
pub fn plan_loaded(loaded: &eptwin_engine::LoadedScenario) -> Option<eptwin_engine::Plan> {
    match eptwin_engine::Plan::build(loaded) {
        Ok(plan) => Some(plan),
        Err(eptwin_engine::EngineError::Invalid { diagnostics, .. }) => {
            for d in diagnostics.iter().filter(|d| d.is_error()) {
                eprintln!("{d}");
            }
            None
        }
        Err(e) => {
            eprintln!("{e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_dates_in_utc_to_the_second() {
        let at = |secs: i64, nanos: i32| jiff::Timestamp::new(secs, nanos).unwrap();
        assert_eq!(super::rfc3339(at(0, 0)), "1970-01-01T00:00:00Z");
        assert_eq!(
            super::rfc3339(at(20_789 * 86_400 + 3_723, 999_999_999)),
            "2026-12-02T01:02:03Z"
        );
        let now = super::now_rfc3339();
        assert_eq!(now.len(), "1970-01-01T00:00:00Z".len(), "{now}");
    }
}
