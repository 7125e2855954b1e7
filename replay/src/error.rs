//! The replay crate's one error type.

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// DeepEP's test scripts cannot replay the scenario as written (`eptwin deepep`): one
    /// line per reason, each naming the key and both values (docs/deepep-replay.md).
    #[error("{file}: DeepEP's test scripts cannot replay this scenario:\n{}", indent(.reasons))]
    Refused { file: String, reasons: Vec<String> },
    /// A DeepEP log that belongs to another configuration, or that cannot be read as one run
    /// (`location` is `file:line`).
    #[error("{location}: {message}")]
    Log { location: String, message: String },
}

fn indent(lines: &[String]) -> String {
    lines.iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}
