//! `eptwin env`: the environment DeepEP's `Buffer.__init__` leaves, as `export` lines.

use std::path::Path;

use anyhow::{Result, bail};
use eptwin_engine::deepep::env::{EnvOrigin, shell_quote};

use super::load_plan;
use crate::{ExitCode, outln};

pub fn env(scenario: &Path, job: Option<&str>, explain: bool) -> Result<ExitCode> {
    let Some(plan) = load_plan(scenario) else { return Ok(ExitCode::BadInput) };
    let chosen = match job {
        Some(name) => match plan.jobs.iter().find(|j| j.name == name) {
            Some(j) => j,
            None => bail!(
                "no job {name:?} in {}; jobs: {}",
                scenario.display(),
                plan.jobs.iter().map(|j| j.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        },
        None if plan.jobs.len() == 1 => &plan.jobs[0],
        None => bail!(
            "{} has several jobs; pass --job NAME ({})",
            scenario.display(),
            plan.jobs.iter().map(|j| j.name.as_str()).collect::<Vec<_>>().join(", ")
        ),
    };
    for (name, var) in &chosen.env {
        let line = format!("export {name}={}", shell_quote(&var.value));
        if !explain {
            outln!("{line}");
            continue;
        }
        let note = match (var.origin, &var.source, &var.overwritten) {
            (EnvOrigin::User, ..) => "user value; DeepEP does not touch it".to_string(),
            (EnvOrigin::UserKeptByDeepEp, Some(src), _) => {
                format!("user value kept by DeepEP ({src})")
            }
            (EnvOrigin::DeepEp, Some(src), Some(old)) => {
                format!("written by DeepEP ({src}); user value {old:?} overwritten")
            }
            (EnvOrigin::DeepEp, Some(src), None) => format!("written by DeepEP ({src})"),
            _ => String::new(),
        };
        outln!("{line}  # {note}");
    }
    Ok(ExitCode::Ok)
}
