//! `eptwin report`: charts and index.html from result files, sweep indexes and traces.

use std::path::{Path, PathBuf};

use anyhow::Result;
use eptwin_reports::Inputs;

use crate::{ExitCode, outln};

pub fn report(inputs: &[PathBuf], out: &Path, json: bool) -> Result<ExitCode> {
    let loaded = match Inputs::load(inputs) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("eptwin: {e}");
            return Ok(ExitCode::BadInput);
        }
    };
    if loaded.results.is_empty() && loaded.sweeps.is_empty() && loaded.traces.is_empty() {
        eprintln!("eptwin: no result, sweep index or trace among the inputs");
        return Ok(ExitCode::BadInput);
    }
    for (path, why) in &loaded.ignored {
        tracing::info!("ignored {}: {why}", path.display());
    }
    // A file that should have been a document and is not (truncated, garbage, a FIFO): always.
    for (path, why) in &loaded.unreadable {
        eprintln!("eptwin: skipped {}: {why}", path.display());
    }
    let output = match eptwin_reports::build(&loaded, out) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("eptwin: error: {e}");
            return Ok(ExitCode::BadInput);
        }
    };
    if json {
        outln!("{}", serde_json::json!({ "type": "report", "data": output }));
        return Ok(ExitCode::Ok);
    }
    outln!(
        "# eptwin report: {} result(s), {} sweep index(es) ({} point results), {} trace(s)",
        loaded.results.len(),
        loaded.sweeps.len(),
        loaded.sweep_points.len(),
        loaded.traces.len()
    );
    for c in &output.charts {
        outln!("  {:<28} {} (+ .svg, {}x{})", c.id, c.png.display(), c.width, c.height);
    }
    for s in &output.skipped {
        outln!("  {:<28} skipped: {}", s.chart, s.reason);
    }
    if !output.ignored.is_empty() {
        outln!("# ignored {} file(s) that are not results (-v lists them)", output.ignored.len());
    }
    if !loaded.unreadable.is_empty() {
        outln!("# skipped {} file(s) that could not be read (see above)", loaded.unreadable.len());
    }
    outln!("# index: {}", output.index_html.display());
    Ok(ExitCode::Ok)
}
