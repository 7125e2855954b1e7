//! Reading what a report is made of: result documents, sweep indexes and simulator traces.
//! Files are told apart by their content, not their names, so `eptwin report results/` works
//! on a directory holding all three.

use std::path::{Path, PathBuf};

use eptwin_engine::api::{RESULT_SCHEMA, RunResult};

use crate::error::ReportError;
use crate::sweep::{SWEEP_INDEX_KIND, SweepIndex};
use crate::trace::Trace;

/// A document and the file it came from.
#[derive(Debug, Clone)]
pub struct Loaded<T> {
    pub path: PathBuf,
    pub doc: T,
}

/// Everything the report reads.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub results: Vec<Loaded<RunResult>>,
    pub sweeps: Vec<Loaded<SweepIndex>>,
    pub traces: Vec<Loaded<Trace>>,
    /// Files found in a directory that are none of the above, with the reason.
    pub ignored: Vec<(PathBuf, String)>,
    /// Result files that are points of a loaded sweep: the sweep's chart shows them, so they
    /// stay out of the summary table and the other charts.
    pub sweep_points: Vec<PathBuf>,
}

impl Inputs {
    /// Read files and directories (recursively, `*.json` only, in name order). A file named
    /// explicitly must be one of the documents; one found in a directory may be skipped.
    pub fn load(paths: &[PathBuf]) -> Result<Inputs, ReportError> {
        let mut inputs = Inputs::default();
        for path in paths {
            if path.is_dir() {
                let mut files = Vec::new();
                collect_json(path, &mut files)?;
                for file in files {
                    if let Err(Skip::NotPlotted(reason) | Skip::Unreadable(reason)) =
                        inputs.add(&file)
                    {
                        inputs.ignored.push((file, reason));
                    }
                }
            } else {
                match inputs.add(path) {
                    Ok(()) => {}
                    // Another eptwin document (a comparison next to its results, as
                    // `eptwin report out/*.json` after `eptwin compare` names it): read past it,
                    // as a directory's listing is.
                    Err(Skip::NotPlotted(reason)) => inputs.ignored.push((path.clone(), reason)),
                    Err(Skip::Unreadable(message)) => {
                        return Err(ReportError::Input { path: path.clone(), message });
                    }
                }
            }
        }
        inputs.set_aside_sweep_points();
        Ok(inputs)
    }

    fn set_aside_sweep_points(&mut self) {
        let mut points = Vec::new();
        for s in &self.sweeps {
            let dir = s.path.parent().unwrap_or(Path::new("."));
            points.extend(s.doc.points.iter().filter_map(|p| p.file.as_ref()).map(|f| dir.join(f)));
        }
        let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let points: Vec<PathBuf> = points.iter().map(|p| canonical(p)).collect();
        let (aside, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.results)
            .into_iter()
            .partition(|r| points.contains(&canonical(&r.path)));
        self.results = keep;
        self.sweep_points = aside.into_iter().map(|r| r.path).collect();
    }

    fn add(&mut self, path: &Path) -> Result<(), Skip> {
        let text = std::fs::read_to_string(path).map_err(|e| Skip::Unreadable(e.to_string()))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Skip::Unreadable(format!("not JSON: {e}")))?;
        match classify(&value) {
            Kind::Result => {
                let doc: RunResult = serde_json::from_value(value)
                    .map_err(|e| Skip::Unreadable(format!("not an eptwin result document: {e}")))?;
                if doc.schema != RESULT_SCHEMA {
                    return Err(Skip::Unreadable(format!(
                        "result schema {} is not supported (this eptwin reads {RESULT_SCHEMA})",
                        doc.schema
                    )));
                }
                self.results.push(Loaded { path: path.to_path_buf(), doc });
            }
            Kind::Sweep => {
                let doc: SweepIndex = serde_json::from_value(value)
                    .map_err(|e| Skip::Unreadable(format!("not an eptwin sweep index: {e}")))?;
                self.sweeps.push(Loaded { path: path.to_path_buf(), doc });
            }
            Kind::Trace => {
                let doc = Trace::from_value(&value).map_err(Skip::Unreadable)?;
                self.traces.push(Loaded { path: path.to_path_buf(), doc });
            }
            Kind::NotPlotted(what) => return Err(Skip::NotPlotted(what)),
            Kind::Other(what) => return Err(Skip::Unreadable(what)),
        }
        Ok(())
    }
}

/// Why a file was not read.
enum Skip {
    /// An eptwin document reports do not plot (a comparison, ...).
    NotPlotted(String),
    /// Not JSON, not readable, or not any eptwin document.
    Unreadable(String),
}

enum Kind {
    Result,
    Sweep,
    Trace,
    /// Another eptwin document (it has a `kind`): a comparison, ...
    NotPlotted(String),
    Other(String),
}

fn classify(value: &serde_json::Value) -> Kind {
    if value.get("traceEvents").is_some() {
        return Kind::Trace;
    }
    match value.get("kind").and_then(|k| k.as_str()) {
        Some(SWEEP_INDEX_KIND) => return Kind::Sweep,
        Some(other) if value.get("backend").is_none() => {
            return Kind::NotPlotted(format!("a {other:?} document, not read by reports"));
        }
        _ => {}
    }
    if value.get("scenario").is_some() && value.get("backend").is_some() {
        Kind::Result
    } else {
        Kind::Other(
            "neither an eptwin result, a sweep index nor a Chrome trace (\"traceEvents\")".into(),
        )
    }
}

fn collect_json(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), ReportError> {
    let io = |source| ReportError::Io { path: dir.to_path_buf(), source };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io)?;
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            collect_json(&entry, out)?;
        } else if entry.extension().is_some_and(|e| e == "json") {
            out.push(entry);
        }
    }
    Ok(())
}
