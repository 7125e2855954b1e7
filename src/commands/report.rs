//! `eptwin report` (placeholder until reports land).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::ExitCode;

pub fn report(_results: &[PathBuf], _out: &Path) -> Result<ExitCode> {
    bail!("eptwin report is not implemented yet")
}
