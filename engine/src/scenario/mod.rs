//! Scenario files: schema, loading with positions, and serialisation back to TOML.

pub mod edit;
pub mod schema;
pub mod source;

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::EngineError;
use schema::{SCHEMA_VERSION, Scenario};
use source::SourceMap;

/// A parsed scenario with the text it came from.
#[derive(Debug, Clone)]
pub struct LoadedScenario {
    pub scenario: Scenario,
    pub source: SourceMap,
    /// Hex sha256 of the file's bytes (results name the exact text they ran).
    pub sha256: String,
}

impl LoadedScenario {
    pub fn file(&self) -> &str {
        self.source.file()
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Read and parse a scenario file. Schema errors (unknown keys, wrong types) carry file:line:col.
pub fn load(path: &Path) -> Result<LoadedScenario, EngineError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| EngineError::Io { path: path.to_path_buf(), source })?;
    parse(&path.display().to_string(), &text)
}

/// Parse scenario text; `file` labels positions.
pub fn parse(file: &str, text: &str) -> Result<LoadedScenario, EngineError> {
    let source = SourceMap::new(file, text);
    let scenario: Scenario = toml::from_str(text).map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        EngineError::Parse {
            location: source.location_of(offset),
            message: e.message().trim().to_string(),
        }
    })?;
    if scenario.schema != SCHEMA_VERSION {
        return Err(EngineError::Parse {
            location: source.locate("schema"),
            message: format!(
                "schema = {} is not supported: this eptwin reads schema = {SCHEMA_VERSION}",
                scenario.schema
            ),
        });
    }
    Ok(LoadedScenario { scenario, sha256: sha256_hex(text.as_bytes()), source })
}

/// Serialise a scenario back to TOML (what `eptwin sweep` writes for each point).
pub fn to_toml(scenario: &Scenario) -> String {
    toml::to_string(scenario).expect("scenario types serialise")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
schema = 1
name = "t"
[cluster]
profile = "h800-cx7"
[[job]]
name = "a"
[job.buffer]
num_nvl_bytes = "1GiB"
[job.workload]
tokens_per_rank = 128
hidden = 7168
topk = 8
experts = 256
"#;

    #[test]
    fn parses_minimal_and_defaults() {
        let s = parse("m.toml", MINIMAL).unwrap().scenario;
        let buffer = s.jobs[0].buffer.as_ref().unwrap();
        assert_eq!(buffer.num_qps_per_rank, 24);
        assert_eq!(buffer.num_sms, 20);
        assert!(buffer.allow_nvlink_for_low_latency_mode);
        assert_eq!(buffer.num_nvl_bytes.bytes(), 1 << 30);
    }

    #[test]
    fn unknown_keys_are_errors_with_positions() {
        let text = MINIMAL.replace("num_nvl_bytes", "num_nvlink_bytes");
        let err = parse("m.toml", &text).unwrap_err().to_string();
        assert!(err.starts_with("m.toml:9:1: error[parse]"), "{err}");
        assert!(err.contains("num_nvlink_bytes"), "{err}");
        let err = parse(
            "m.toml",
            "schema = 2\nname='x'\n[cluster]\nprofile='h800-cx7'\n[[job]]\nname='a'",
        )
        .unwrap_err();
        assert!(err.to_string().contains("m.toml:1:1"), "{err}");
    }

    #[test]
    fn round_trips() {
        let s = parse("m.toml", MINIMAL).unwrap().scenario;
        let again = parse("again.toml", &to_toml(&s)).unwrap().scenario;
        assert_eq!(s, again);
    }
}
