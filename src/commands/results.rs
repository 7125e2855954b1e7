//! Result files: where a result goes and writing it, shared by `run` in one process and by
//! process 0 of a launch of several. A result never replaces a result of another backend, and
//! a waived result never replaces a measured one; it goes to `<name>.<backend>.json` instead
//! (the name `compare` uses), and the run says so.

use std::path::{Path, PathBuf};

use anyhow::Result;
use eptwin_engine::api::{RunResult, Verdict, result_path, write_atomic};

use crate::{out, outln};

/// Writes the result (see [`place_result`]) and prints the table, or the document with
/// `--json`; a closed stdout stops the printing, not the writing.
pub fn write_result(result: &RunResult, out: &Path, json: bool) -> Result<Option<PathBuf>> {
    let file = place_result(out, &result.scenario.name, result)?;
    if json {
        outln!("{}", serde_json::to_string(result)?);
    } else {
        out!("{}", eptwin_reports::table::render(result));
        match &file {
            Some(file) => outln!("# result: {}", file.display()),
            None => outln!("# result: not written (see above)"),
        }
    }
    Ok(file)
}

/// Where a result goes: `<name>.json`, unless that holds a result this one must not replace
/// (another backend's; a measured one when this is waived), then `<name>.<backend>.json`
/// under the same rule; `None` (nothing written) when neither may be replaced.
pub fn place_result(dir: &Path, name: &str, result: &RunResult) -> Result<Option<PathBuf>> {
    let kind = result.backend_kind().to_string();
    let candidates = [result_path(dir, name, None), result_path(dir, name, Some(&kind))];
    let mut kept = Vec::new();
    for path in &candidates {
        match existing(path) {
            Some((other, verdict))
                if other != kind
                    || (result.verdict == Verdict::Waived && verdict != Verdict::Waived) =>
            {
                kept.push(format!(
                    "{} holds a {other} result (verdict {})",
                    path.display(),
                    verdict.as_str()
                ));
            }
            _ => {
                if !kept.is_empty() {
                    eprintln!(
                        "eptwin: {}; this {kind} result goes to {}",
                        kept.join("; "),
                        path.display()
                    );
                }
                write_atomic(path, &result.to_json())?;
                tracing::info!("wrote {}", path.display());
                return Ok(Some(path.clone()));
            }
        }
    }
    eprintln!(
        "eptwin: the {} {kind} result was not written: {}",
        result.verdict.as_str(),
        kept.join("; ")
    );
    Ok(None)
}

/// The backend kind and verdict of the result file at `path`, if it is one.
fn existing(path: &Path) -> Option<(String, Verdict)> {
    let bytes = eptwin_engine::api::read_input(path, &eptwin_engine::api::DOCUMENT).ok()?;
    let doc: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let kind = doc.get("backend")?.get("kind")?.as_str()?.to_string();
    let verdict = serde_json::from_value(doc.get("verdict")?.clone()).ok()?;
    Some((kind, verdict))
}
