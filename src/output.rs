//! Standard output that a closed reader does not crash. `eptwin run ... | head -1` closes the
//! pipe after one line; `println!` would then panic (exit 101) and the scenarios still to run
//! would never write their result files. Here the first failed write stops all further output
//! and the command carries on: results are still written and the exit code is unchanged.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Write to stdout unless an earlier write failed.
pub fn write(args: fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args) {
        CLOSED.store(true, Ordering::Relaxed);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            let _ =
                writeln!(std::io::stderr(), "eptwin: standard output failed ({e}); output stopped");
        }
    }
}

/// `print!` that survives a closed stdout.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write(format_args!($($arg)*)) };
}

/// `println!` that survives a closed stdout.
#[macro_export]
macro_rules! outln {
    () => { $crate::output::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::write(format_args!("{}\n", format_args!($($arg)*))) };
}
