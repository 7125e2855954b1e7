//! `eptwin compare` (placeholder until reports land).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::ExitCode;

pub fn compare(_scenarios: &[PathBuf], _out: &Path, _json: bool) -> Result<ExitCode> {
    bail!("eptwin compare is not implemented yet")
}
