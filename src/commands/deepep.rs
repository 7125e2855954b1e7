//! `eptwin deepep launch|import`: replay a scenario with DeepEP's own test scripts
//! (docs/deepep-replay.md). The logic is in `eptwin_replay`; this reads the files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use eptwin_engine::api::{LOG, Outputs, Provenance, read_input, result_path, write_atomic};
use eptwin_replay::import::{LogText, import};
use eptwin_replay::launch::{LaunchFormat, launch};
use eptwin_replay::subject::{Severity, Subject};

use super::load_with_plan;
use crate::cli::{DeepepCommand, LaunchFormatArg};
use crate::{ExitCode, out, outln};

pub fn dispatch(command: DeepepCommand) -> Result<ExitCode> {
    match command {
        DeepepCommand::Launch { scenario, deepep_dir, nodes_from_slurm, format } => {
            launch_lines(&scenario, &deepep_dir, nodes_from_slurm, format)
        }
        DeepepCommand::Import { logs, scenario, gpu, out, json } => {
            import_logs(&logs, &scenario, &gpu, &out, json)
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
            out!("{}", l.render(format));
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

fn import_logs(
    logs: &[PathBuf],
    scenario: &Path,
    gpu: &str,
    out: &Path,
    json: bool,
) -> Result<ExitCode> {
    if gpu.trim().is_empty() {
        anyhow::bail!("--gpu: name the GPU the scripts ran on, e.g. \"NVIDIA H800\"");
    }
    let Some((loaded, plan)) = load_with_plan(scenario) else { return Ok(ExitCode::BadInput) };
    let texts: Vec<(String, String)> = logs
        .iter()
        .map(|p| read_log(p).map(|t| (p.display().to_string(), t)))
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
    let mut result = import(&plan, &loaded.scenario, &log_texts, provenance)?;
    // As the hardware backend summarises its GPUs: "16 x NVIDIA H800".
    let gpus = format!("{} x {}", plan.topology.num_gpus(), gpu.trim());
    result.backend.insert("gpus".into(), serde_json::json!(gpus));
    // Checked once the logs are read and match the scenario: logs of another configuration
    // leave no directory behind.
    let file = result_path(out, &plan.name, Some("deepep"));
    let mut outputs = Outputs::new();
    outputs.input(scenario, &format!("the scenario {}", scenario.display()));
    for log in logs {
        outputs.input(log, &format!("the log {}", log.display()));
    }
    outputs.directory(out, "--out")?;
    outputs.claim(&file, &format!("the deepep result of {}", plan.name))?;
    write_atomic(&file, &result.to_json())?;
    tracing::info!("wrote {}", file.display());
    if json {
        outln!("{}", serde_json::to_string(&result)?);
    } else {
        out!("{}", eptwin_reports::table::render(&result));
        outln!("# result: {}", file.display());
    }
    Ok(ExitCode::from_verdict(result.verdict))
}

/// One log as text: a regular file of at most 64 MiB (engine/src/files.rs, `LOG`).
fn read_log(path: &Path) -> Result<String> {
    let bytes = read_input(path, &LOG).with_context(|| format!("reading {}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: invalid UTF-8 at byte {}: DeepEP's logs are text",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}
