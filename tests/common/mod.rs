//! Shared by the binary's integration tests: the repository root and the `eptwin` binary as a
//! command run from it.

#![allow(dead_code)] // each test target uses its part

use std::path::Path;
use std::process::{Command, Output};

/// The repository root: the tests' scenarios and results are named relative to it.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `eptwin` binary as a command run from [`root`], without the Slurm array variables a
/// shell under Slurm may carry (they change what `sweep` runs).
pub fn eptwin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_eptwin"));
    c.current_dir(root());
    for var in [
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_COUNT",
        "SLURM_ARRAY_TASK_MIN",
        "SLURM_CPUS_PER_TASK",
    ] {
        c.env_remove(var);
    }
    c
}

/// Run `c` to its end; its stderr is printed for a failing test's log.
pub fn run(c: &mut Command) -> Output {
    let out = c.output().expect("eptwin runs");
    eprintln!("stderr: {}", String::from_utf8_lossy(&out.stderr));
    out
}
