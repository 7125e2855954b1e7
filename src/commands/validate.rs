//! `eptwin validate`: every error of every file, then exit 2 if there was any.

use std::path::PathBuf;

use anyhow::Result;
use eptwin_engine::deepep::validate::validate as check;

use crate::{ExitCode, outln};

pub fn validate(scenarios: &[PathBuf]) -> Result<ExitCode> {
    let mut code = ExitCode::Ok;
    for path in scenarios {
        let loaded = match eptwin_engine::load(path) {
            Ok(l) => l,
            Err(e) => {
                outln!("{e}");
                code = ExitCode::BadInput;
                continue;
            }
        };
        let (diagnostics, _) = check(&loaded.scenario, &loaded.source);
        let errors = diagnostics.iter().filter(|d| d.is_error()).count();
        for d in &diagnostics {
            outln!("{d}");
        }
        let advisories = diagnostics.len() - errors;
        if errors > 0 {
            outln!("{}: {errors} error(s), {advisories} advisory(ies)", path.display());
            code = ExitCode::BadInput;
        } else {
            outln!("{}: ok ({advisories} advisory(ies))", path.display());
        }
    }
    Ok(code)
}
