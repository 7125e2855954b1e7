//! Scenario files: schema, loading with positions, and serialisation back to TOML.

pub mod edit;
pub mod limits;
pub(crate) mod plain;
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

/// The largest scenario file `load` reads (16 MiB): the library's largest is under 4 KiB, and
/// a bound keeps `eptwin validate /dev/zero`-style mistakes from reading without end.
pub const MAX_SCENARIO_BYTES: u64 = 16 << 20;

/// A scenario file, for [`crate::files::read_input`].
pub const SCENARIO_FILE: crate::files::InputKind = crate::files::InputKind {
    noun: "a scenario",
    format: "a TOML file",
    max_bytes: MAX_SCENARIO_BYTES,
    max_text: "16 MiB",
};

/// Read and parse a scenario file. Schema errors (unknown keys, wrong types) carry
/// file:line:col and the key path. Only regular files up to [`MAX_SCENARIO_BYTES`] are read,
/// and never more than that many bytes.
pub fn load(path: &Path) -> Result<LoadedScenario, EngineError> {
    let bytes = crate::files::read_input(path, &SCENARIO_FILE)
        .map_err(|source| EngineError::Io { path: path.to_path_buf(), source })?;
    let file = path.display().to_string();
    let text = String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let bad = e.as_bytes()[valid];
        let prefix = std::str::from_utf8(&e.as_bytes()[..valid]).unwrap_or_default();
        EngineError::Parse {
            location: SourceMap::new(file.clone(), prefix).location_of(valid),
            message: format!(
                "invalid UTF-8 at byte {valid} (0x{bad:02x}): a scenario file is UTF-8 text"
            ),
        }
    })?;
    parse(&file, &text)
}

/// Parse scenario text; `file` labels positions.
pub fn parse(file: &str, text: &str) -> Result<LoadedScenario, EngineError> {
    let source = SourceMap::new(file, text);
    let scenario: Scenario = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        let value = text.get(span.clone()).unwrap_or_default();
        let message = plain::describe(e.message().trim(), value);
        EngineError::Parse {
            location: source.location_of(span.start),
            message: match source.path_at(span.start) {
                Some(path) => format!("{path}: {message}"),
                None => message,
            },
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

    /// `MINIMAL` with `old` replaced by `new`, parsed: the error line.
    fn parse_error(old: &str, new: &str) -> String {
        assert!(MINIMAL.contains(old), "{old}");
        parse("m.toml", &MINIMAL.replacen(old, new, 1)).unwrap_err().to_string()
    }

    #[test]
    fn schema_errors_name_the_key_in_plain_words() {
        let cases = [
            (
                "tokens_per_rank = 128",
                "tokens_per_rank = \"many\"",
                "m.toml:11:19: error[parse]: job[0].workload.tokens_per_rank: expected an integer, found the string \"many\"",
            ),
            (
                "tokens_per_rank = 128",
                "tokens_per_rank = -1",
                "m.toml:11:19: error[parse]: job[0].workload.tokens_per_rank: expected an integer from 0 to 4294967295, found the integer -1",
            ),
            (
                "num_nvl_bytes = \"1GiB\"",
                "num_nvl_bytes = \"2 GiBB\"",
                "m.toml:9:17: error[parse]: job[0].buffer.num_nvl_bytes: invalid size \"2 GiBB\": expected an integer number of bytes or a number with a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. \"2GiB\", \"64 MiB\" or \"2e9\"",
            ),
            (
                "num_nvl_bytes = \"1GiB\"",
                "num_nvl_bytes = \"18446744073709551616\"",
                "m.toml:9:17: error[parse]: job[0].buffer.num_nvl_bytes: size \"18446744073709551616\" is too large: sizes go up to 18446744073709551615 bytes (2^64 - 1)",
            ),
            (
                "num_nvl_bytes = \"1GiB\"",
                "num_nvl_bytes = \"1e30\"",
                "m.toml:9:17: error[parse]: job[0].buffer.num_nvl_bytes: size \"1e30\" is too large: sizes go up to 18446744073709551615 bytes (2^64 - 1)",
            ),
            (
                "name = \"a\"",
                "name = \"a\"\nranks = 3.5",
                "m.toml:8:9: error[parse]: job[0].ranks: expected \"all\", ranges such as \"0-7,16-23\", or a list of ranks such as [0, 1, 2], found the number 3.5",
            ),
            (
                "name = \"a\"",
                "name = \"a\"\nranks = [0, \"b\"]",
                "m.toml:8:13: error[parse]: job[0].ranks[1]: expected an integer, found the string \"b\"",
            ),
            (
                "hidden = 7168",
                "hidden = 7168\nrouting = \"zipff\"",
                "m.toml:13:11: error[parse]: job[0].workload.routing: expected one of \"uniform\", \"node-limited\", \"zipf\", \"file\", found \"zipff\"",
            ),
        ];
        for (old, new, expected) in cases {
            assert_eq!(parse_error(old, new), expected);
        }
        let missing = parse_error("hidden = 7168\n", "");
        assert!(missing.contains("job[0].workload: missing required key \"hidden\""), "{missing}");
        let unknown = parse_error("hidden = 7168", "hidden = 7168\ntokens = 1");
        assert!(unknown.starts_with("m.toml:13:1: error[parse]: job[0].workload.tokens: unknown key \"tokens\"; this table takes tokens_per_rank,"), "{unknown}");
    }

    #[test]
    fn load_refuses_what_is_not_a_scenario_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(
            err.ends_with("not a regular file (a directory); a scenario is a TOML file"),
            "{err}"
        );
        #[cfg(unix)]
        {
            let err = load(Path::new("/dev/zero")).unwrap_err().to_string();
            assert_eq!(
                err,
                "/dev/zero: not a regular file (a character device); a scenario is a TOML file"
            );
        }
        let big = dir.path().join("big.toml");
        let file = std::fs::File::create(&big).unwrap();
        file.set_len(MAX_SCENARIO_BYTES + 1).unwrap();
        let err = load(&big).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "16777217 bytes is more than a scenario may have (16777216 bytes, 16 MiB)"
            ),
            "{err}"
        );
    }

    #[test]
    fn invalid_utf8_names_its_byte_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        let mut bytes = MINIMAL.as_bytes().to_vec();
        let at = MINIMAL.find("\"a\"").unwrap() + 2;
        bytes.insert(at, 0xff);
        std::fs::write(&path, bytes).unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(
            err.ends_with(&format!(":7:10: error[parse]: invalid UTF-8 at byte {at} (0xff): a scenario file is UTF-8 text")),
            "{err}"
        );
    }
}
