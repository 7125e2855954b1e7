//! One function per subcommand; each returns the exit code.

mod compare;
mod env;
mod report;
mod run;
mod sweep;
mod topo;
mod validate;

use anyhow::Result;
use eptwin_engine::result::Provenance;
use eptwin_engine::transport::Transport;

use crate::ExitCode;
use crate::cli::{BackendArg, Command};

pub fn dispatch(command: Command) -> Result<ExitCode> {
    match command {
        Command::Run { scenarios, backend, out, json, trace } => {
            run::run(&scenarios, backend, &out, json, trace.as_deref())
        }
        Command::Validate { scenarios } => validate::validate(&scenarios),
        Command::Env { scenario, job, explain } => env::env(&scenario, job.as_deref(), explain),
        Command::Topo { scenario, disable_nvlink, hw } => {
            topo::topo(scenario.as_deref(), disable_nvlink, hw)
        }
        Command::Compare { scenarios, out, measured, tolerance, json } => {
            compare::compare(&scenarios, &out, &measured, tolerance, json)
        }
        Command::Report { results, out, json } => report::report(&results, &out, json),
        Command::Sweep { scenario, sets, shard, out, backend, threads, json } => {
            sweep::sweep(&scenario, &sets, shard.as_deref(), out.as_deref(), backend, threads, json)
        }
    }
}

/// A backend for `run`, `compare` and `sweep`.
pub fn transport(backend: BackendArg, trace: bool) -> Box<dyn Transport> {
    match backend {
        BackendArg::Sim => Box::new(eptwin_sim::Simulator::new(eptwin_sim::SimOptions { trace })),
        BackendArg::Hw => Box::new(eptwin_hw::HwTransport::new(eptwin_hw::HwOptions::default())),
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

#[allow(clippy::disallowed_methods)] // provenance of hardware results only
fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day) — Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Load and plan a scenario, printing diagnostics to stderr. `None` ⇒ bad input (exit 2).
pub fn load_plan(path: &std::path::Path) -> Option<eptwin_engine::Plan> {
    let loaded = match eptwin_engine::load(path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return None;
        }
    };
    plan_loaded(&loaded)
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
    fn civil_dates() {
        assert_eq!(super::civil_from_days(0), (1970, 1, 1));
        assert_eq!(super::civil_from_days(20_789), (2026, 12, 2));
    }
}
