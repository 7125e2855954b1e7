//! Engine integration tests: the scenario library, round trips, and a parser fuzz.

mod fuzz;
mod hostile;
mod library;
mod round_trip;

use std::path::{Path, PathBuf};

/// Every `*.toml` under `scenarios/` (recursively), sorted.
pub fn scenario_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "toml") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    files
}
