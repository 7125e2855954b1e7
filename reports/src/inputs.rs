//! Reading what a report is made of: result documents, sweep indexes and simulator traces.
//! Files are told apart by their content, not their names, so `eptwin report results/` works
//! on a directory holding all three.

use std::path::{Path, PathBuf};

use eptwin_engine::api::{DOCUMENT, RESULT_SCHEMA, RunResult, read_input};

use crate::error::ReportError;
use crate::sweep::{SWEEP_INDEX_KIND, SweepIndex};
use crate::trace::Trace;
use crate::values;

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
    /// Files found in a directory that are other documents (eptwin's comparisons, JSON of
    /// other tools), with the reason: listed with `-v`.
    pub ignored: Vec<(PathBuf, String)>,
    /// Files found in a directory that could not be read as a document — not a regular file,
    /// too large, not JSON (truncated, garbage) — with the reason: always reported.
    pub unreadable: Vec<(PathBuf, String)>,
    /// Result files that are points of a loaded sweep: the sweep's chart shows them, so they
    /// stay out of the summary table and the other charts.
    pub sweep_points: Vec<PathBuf>,
}

impl Inputs {
    /// Read files and directories (recursively, `*.json` only, in name order; a directory
    /// reached twice, through links, is read once). A file named explicitly must be one of
    /// the documents; one found in a directory may be skipped. A document holding a value no
    /// run can produce (`values.rs`) is an error wherever it was found.
    pub fn load(paths: &[PathBuf]) -> Result<Inputs, ReportError> {
        let mut inputs = Inputs::default();
        for path in paths {
            if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
                let mut files = Vec::new();
                let mut seen = std::collections::BTreeSet::new();
                collect_json(path, &mut files, &mut seen)?;
                for file in files {
                    match inputs.add(&file) {
                        Ok(()) => {}
                        Err(Skip::NotPlotted(reason) | Skip::Foreign(reason)) => {
                            inputs.ignored.push((file, reason));
                        }
                        Err(Skip::Unreadable(reason)) => inputs.unreadable.push((file, reason)),
                        Err(Skip::Impossible(message)) => {
                            return Err(ReportError::Impossible { path: file, message });
                        }
                    }
                }
            } else {
                match inputs.add(path) {
                    Ok(()) => {}
                    // Another eptwin document (a comparison next to its results, as
                    // `eptwin report out/*.json` after `eptwin compare` names it): read past it,
                    // as a directory's listing is.
                    Err(Skip::NotPlotted(reason)) => inputs.ignored.push((path.clone(), reason)),
                    Err(Skip::Unreadable(message) | Skip::Foreign(message)) => {
                        return Err(ReportError::Input { path: path.clone(), message });
                    }
                    Err(Skip::Impossible(message)) => {
                        return Err(ReportError::Impossible { path: path.clone(), message });
                    }
                }
            }
        }
        inputs.set_aside_sweep_points();
        Ok(inputs)
    }

    /// Every file a document was read from.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        let results = self.results.iter().map(|r| r.path.as_path());
        let sweeps = self.sweeps.iter().map(|s| s.path.as_path());
        results.chain(sweeps).chain(self.traces.iter().map(|t| t.path.as_path()))
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
        let bytes = read_input(path, &DOCUMENT).map_err(|e| Skip::Unreadable(e.to_string()))?;
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| Skip::Unreadable(format!("not JSON: {e}")))?;
        drop(bytes);
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
                if let Some(why) = values::result_problem(&doc) {
                    return Err(Skip::Impossible(why));
                }
                self.results.push(Loaded { path: path.to_path_buf(), doc });
            }
            Kind::Sweep => {
                let doc: SweepIndex = serde_json::from_value(value)
                    .map_err(|e| Skip::Unreadable(format!("not an eptwin sweep index: {e}")))?;
                if let Some(why) = values::sweep_problem(&doc) {
                    return Err(Skip::Impossible(why));
                }
                self.sweeps.push(Loaded { path: path.to_path_buf(), doc });
            }
            Kind::Trace => {
                let doc = Trace::from_value(&value).map_err(Skip::Unreadable)?;
                self.traces.push(Loaded { path: path.to_path_buf(), doc });
            }
            Kind::NotPlotted(what) => return Err(Skip::NotPlotted(what)),
            Kind::Other(what) => return Err(Skip::Foreign(what)),
        }
        Ok(())
    }
}

/// Why a file was not read.
enum Skip {
    /// An eptwin document reports do not plot (a comparison, ...).
    NotPlotted(String),
    /// JSON that is no eptwin document.
    Foreign(String),
    /// Not a regular file, too large, not JSON, or JSON a document's fields do not parse.
    Unreadable(String),
    /// A document holding a value no run can produce.
    Impossible(String),
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

/// `*.json` files under `dir`, in name order. Directories are told by the entry's own type,
/// links followed only to reach a directory not seen before (by device and inode), so links
/// to `.` or to each other cannot make the walk endless; what a `*.json` name is — file,
/// link, FIFO, device — is left to [`read_input`], which reads regular files only.
fn collect_json(
    dir: &Path,
    out: &mut Vec<PathBuf>,
    seen: &mut std::collections::BTreeSet<(u64, u64)>,
) -> Result<(), ReportError> {
    use std::os::unix::fs::MetadataExt;
    let io = |source| ReportError::Io { path: dir.to_path_buf(), source };
    let meta = std::fs::metadata(dir).map_err(io)?;
    if !seen.insert((meta.dev(), meta.ino())) {
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io)?;
    entries.sort();
    for entry in entries {
        let Ok(own) = std::fs::symlink_metadata(&entry) else { continue };
        let is_dir = own.is_dir()
            || (own.file_type().is_symlink()
                && std::fs::metadata(&entry).is_ok_and(|m| m.is_dir()));
        if is_dir {
            collect_json(&entry, out, seen)?;
        } else if entry.extension().is_some_and(|e| e == "json") {
            out.push(entry);
        }
    }
    Ok(())
}
