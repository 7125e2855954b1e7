//! `eptwin`: the command line. Glue only: parse arguments, call the library crates, map
//! outcomes to exit codes in one place (`ExitCode` below).

mod cli;
mod commands;
mod interrupt;
mod output;

use clap::Parser;

/// Exit codes (docs/design.md, "The design contract"): 0 ok · 1 a correctness check or expectation
/// failed · 2 bad input or usage · 77 waived (the hardware the scenario needs is not here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ExitCode {
    Ok = 0,
    Waived = 77,
    Failed = 1,
    BadInput = 2,
}

impl ExitCode {
    /// Combine outcomes of several scenarios: bad input > failed > waived > ok.
    pub fn worst(self, other: ExitCode) -> ExitCode {
        let rank = |c: ExitCode| match c {
            ExitCode::Ok => 0,
            ExitCode::Waived => 1,
            ExitCode::Failed => 2,
            ExitCode::BadInput => 3,
        };
        if rank(other) > rank(self) { other } else { self }
    }

    pub fn from_verdict(verdict: eptwin_engine::api::Verdict) -> ExitCode {
        match verdict {
            eptwin_engine::api::Verdict::Ok => ExitCode::Ok,
            eptwin_engine::api::Verdict::Failed => ExitCode::Failed,
            eptwin_engine::api::Verdict::Waived => ExitCode::Waived,
        }
    }
}

fn main() {
    let cli = cli::Cli::parse();
    init_logging(cli.verbose);
    let code = match commands::dispatch(cli.command) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("eptwin: error: {err:#}");
            ExitCode::BadInput
        }
    };
    std::process::exit(code as i32);
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    // The hardware backend's info lines (the memcpy ceiling, measurement knobs' reports) are
    // part of a hardware run's normal output.
    let default = match verbose {
        0 => "warn,eptwin_hw=info,eptwin_wire=info,eptwin_group=info",
        1 => "info",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}
