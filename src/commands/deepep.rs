//! `eptwin deepep launch|import`: replay a scenario with DeepEP's own test scripts
//! (docs/deepep-replay.md). The logic is in `eptwin_replay`; this reads the files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use eptwin_engine::api::{Provenance, result_path, write_atomic};
use eptwin_replay::import::{LogText, import};
use eptwin_replay::launch::{LaunchFormat, launch};
use eptwin_replay::subject::{Severity, Subject};

use super::load_with_plan;
use super::run::writable_dir;
use crate::cli::{DeepepCommand, LaunchFormatArg};
use crate::{ExitCode, out, outln};

/// The largest log `deepep import` reads (64 MiB): DeepEP's test scripts print a few KiB per
/// configuration, and a bound keeps a device or an endless pipe from being read without end.
const MAX_LOG_BYTES: u64 = 64 << 20;

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

fn import_logs(logs: &[PathBuf], scenario: &Path, out: &Path, json: bool) -> Result<ExitCode> {
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
    let result = import(&plan, &loaded.scenario, &log_texts, provenance)?;
    // After the import: logs of another configuration leave no directory behind.
    writable_dir(out, "--out")?;
    let file = result_path(out, &plan.name, Some("deepep"));
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

/// One log as text, at most [`MAX_LOG_BYTES`] read (pipes are fine: `<(ssh node cat log)`).
fn read_log(path: &Path) -> Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    if file.metadata().is_ok_and(|m| m.is_dir()) {
        anyhow::bail!("{}: a directory; give DeepEP's log files", path.display());
    }
    let mut bytes = Vec::new();
    file.take(MAX_LOG_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > MAX_LOG_BYTES {
        anyhow::bail!(
            "{}: more than {MAX_LOG_BYTES} bytes (64 MiB); a DeepEP test log is a few KiB per \
             configuration",
            path.display()
        );
    }
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: invalid UTF-8 at byte {}: DeepEP's logs are text",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}
