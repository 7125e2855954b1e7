//! The crate's one error type: what stops the doctor from diagnosing at all (a recorded node
//! that cannot be read). A probe that cannot answer is not an error: its check says why.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum DoctorError {
    /// A recorded node's file is missing or malformed; `path` carries `:line` where known.
    #[error("recorded node {path}: {message}")]
    Snapshot { path: String, message: String },
}
