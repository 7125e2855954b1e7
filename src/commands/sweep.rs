//! `eptwin sweep` (placeholder until reports land).

use std::path::Path;

use anyhow::{Result, bail};

use crate::ExitCode;
use crate::cli::BackendArg;

pub fn sweep(
    _scenario: &Path,
    _sets: &[String],
    _shard: Option<&str>,
    _out: &Path,
    _backend: BackendArg,
    _threads: Option<usize>,
    _json: bool,
) -> Result<ExitCode> {
    bail!("eptwin sweep is not implemented yet")
}
