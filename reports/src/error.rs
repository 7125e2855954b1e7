//! The crate's one error type. Every variant names the file or chart a user has to look at.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is JSON but none of the documents a report reads (result, sweep index, trace).
    #[error("{}: {message}", path.display())]
    Input { path: PathBuf, message: String },
    /// A document holding a value no run can produce (values.rs): `message` names the job,
    /// op and value.
    #[error("{}: {message}", path.display())]
    Impossible { path: PathBuf, message: String },
    /// plotters failed to draw or encode a chart.
    #[error("chart {chart} ({}): {message}", path.display())]
    Draw { chart: String, path: PathBuf, message: String },
    /// An output that may not be written, or a file the engine refused (engine/src/files.rs).
    #[error(transparent)]
    Engine(#[from] eptwin_engine::EngineError),
    /// The embedded font could not be registered with plotters.
    #[error("the embedded DejaVu Sans font could not be loaded")]
    Font,
}
