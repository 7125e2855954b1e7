//! `eptwin deepep launch|import`: replay a scenario with DeepEP's own test scripts
//! (docs/deepep-replay.md). The logic is in `eptwin_engine::replay`; this reads the files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use eptwin_engine::replay::import::{LogText, import};
use eptwin_engine::replay::launch::{LaunchFormat, launch};
use eptwin_engine::replay::{Severity, Subject};
use eptwin_engine::result::{Provenance, result_path, write_atomic};

use super::load_with_plan;
use crate::ExitCode;
use crate::cli::{DeepepCommand, LaunchFormatArg};

pub fn dispatch(command: DeepepCommand) -> Result<ExitCode> {
    match command {
        DeepepCommand::Launch { scenario, deepep_dir, nodes_from_slurm, format } => {
            launch_lines(&scenario, &deepep_dir, nodes_from_slurm, format)
        }
        DeepepCommand::Import { logs, scenario, out, json } => {
            import_logs(&logs, &scenario, &out, json)
        }
    }
}

fn launch_lines(
    scenario: &Path,
    deepep_dir: &str,
    nodes_from_slurm: bool,
    format: LaunchFormatArg,
) -> Result<ExitCode> {
    let Some((loaded, plan)) = load_with_plan(scenario) else { return Ok(ExitCode::BadInput) };
    match launch(&Subject::from_plan(&plan, &loaded.scenario), deepep_dir) {
        Ok(l) => {
            for note in &l.warnings {
                eprintln!("{}: {note}", scenario.display());
            }
            let format = match format {
                LaunchFormatArg::Shell => LaunchFormat::Shell { nodes_from_slurm },
                LaunchFormatArg::Slurm => LaunchFormat::Slurm,
            };
            print!("{}", l.render(format));
            Ok(ExitCode::Ok)
        }
        Err(notes) => {
            eprintln!(
                "{}: DeepEP's test scripts cannot replay this scenario ({} reason(s)):",
                scenario.display(),
                notes.iter().filter(|n| n.severity == Severity::Refused).count()
            );
            for note in &notes {
                eprintln!("{}: {note}", scenario.display());
            }
            Ok(ExitCode::BadInput)
        }
    }
}

fn import_logs(logs: &[PathBuf], scenario: &Path, out: &Path, json: bool) -> Result<ExitCode> {
    let Some((loaded, plan)) = load_with_plan(scenario) else { return Ok(ExitCode::BadInput) };
    let texts: Vec<(String, String)> = logs
        .iter()
        .map(|p| {
            std::fs::read_to_string(p)
                .with_context(|| format!("reading {}", p.display()))
                .map(|t| (p.display().to_string(), t))
        })
        .collect::<Result<_>>()?;
    let log_texts: Vec<LogText<'_>> =
        texts.iter().map(|(name, text)| LogText { name, text }).collect();
    // No timestamp or host: the same logs give the same document.
    let provenance = Provenance {
        version: eptwin_engine::VERSION.to_string(),
        git_commit: env!("EPTWIN_GIT_COMMIT").to_string(),
        command: Some(std::env::args().collect::<Vec<_>>().join(" ")),
        ..Provenance::default()
    };
    let result = import(&plan, &loaded.scenario, &log_texts, provenance)?;
    let file = result_path(out, &plan.name, Some("deepep"));
    write_atomic(&file, &result.to_json())?;
    tracing::info!("wrote {}", file.display());
    if json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        print!("{}", eptwin_reports::table::render(&result));
        println!("# result: {}", file.display());
    }
    Ok(ExitCode::from_verdict(result.verdict))
}
