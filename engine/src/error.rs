//! The engine's one error type.

use std::path::PathBuf;

use crate::diag::Diagnostic;
use crate::scenario::source::Location;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the schema (unknown key, wrong type).
    #[error("{location}: error[parse]: {message}")]
    Parse { location: Location, message: String },
    /// The scenario parsed but breaks DeepEP/NVSHMEM/fabric rules.
    #[error("{file}: {} error(s):\n{}", count_errors(.diagnostics), render(.diagnostics))]
    Invalid { file: String, diagnostics: Vec<Diagnostic> },
    /// A routing file (`routing = "file"`) that cannot be read or breaks the format
    /// (docs/scenario.md, "Routing files"): `at` is the line and column in it; content faults
    /// name the rank, token and slot in `message`.
    #[error("{}{}: {message}", path.display(), at.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
    RoutingFile { path: PathBuf, at: Option<(usize, usize)>, message: String },
    /// An output path that may not be written, or a write that failed (`what`: the flag or
    /// the file's role, "--trace", "writing"); nothing was replaced (engine/src/files.rs).
    #[error("{what} {}: {message}", path.display())]
    Output { what: String, path: PathBuf, message: String },
    #[error("{0}")]
    Usage(String),
    /// A key path into a scenario's table that does not lead anywhere (`scenario::edit`).
    #[error("{key:?}: {message}")]
    KeyPath { key: String, message: String },
}

fn count_errors(diagnostics: &[Diagnostic]) -> usize {
    diagnostics.iter().filter(|d| d.is_error()).count()
}

fn render(diagnostics: &[Diagnostic]) -> String {
    diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| format!("  {d}"))
        .collect::<Vec<_>>()
        .join("\n")
}
