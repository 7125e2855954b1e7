//! Recorded routings (`routing = "file"`, docs/scenario.md, "Routing files"): a JSON file
//! holding `topk_idx` (and optionally `topk_weights`) for every rank, read once when the plan
//! is built and held by it, so both backends still move one table.
//!
//! The file is hostile input: its size is bounded before it is read
//! ([`MAX_ROUTING_FILE_BYTES`]), and it is parsed in one streaming pass against the shape the
//! workload expects, so what is kept never exceeds the job's table (whose size the scenario
//! limits already bound) whatever the file holds. Every fault names the file, its line and
//! column, and for content the rank, token and slot.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::error::EngineError;
use crate::routing::RoutingTable;
use crate::scenario::limits::MAX_ROUTING_FILE_BYTES;
use crate::scenario::sha256_hex;
use crate::scenario::source::SourceMap;

/// The shape a routing file must have for one job: the workload's tokens, top-k and experts;
/// the job's rank count (the file may hold more ranks: the job takes the first `num_ranks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub num_ranks: u32,
    pub tokens_per_rank: u32,
    pub topk: u32,
    pub num_experts: u32,
}

/// A routing file read for one job: its table and what names it in results.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedRouting {
    pub table: RoutingTable,
    /// The path it was read from, as resolved (the scenario's directory joined with a
    /// relative `routing_file`).
    pub file: String,
    /// Hex sha256 of the file's bytes.
    pub sha256: String,
}

/// Where a scenario's `routing_file` points: relative paths are relative to the scenario
/// file's directory, so a scenario and its routing move together.
pub fn resolve(scenario_file: &str, routing_file: &str) -> PathBuf {
    let path = Path::new(routing_file);
    if path.is_absolute() {
        return path.to_path_buf();
    }
    Path::new(scenario_file).parent().unwrap_or(Path::new("")).join(path)
}

/// A routing file, for [`crate::files::read_input`].
const ROUTING_FILE: crate::files::InputKind = crate::files::InputKind {
    noun: "a routing file",
    format: "a JSON file",
    max_bytes: MAX_ROUTING_FILE_BYTES,
    max_text: "256 MiB",
};

/// Read and check the routing file at `path` against `expect`.
pub fn load(path: &Path, expect: Expected) -> Result<LoadedRouting, EngineError> {
    let fail =
        |message: String| EngineError::RoutingFile { path: path.to_path_buf(), at: None, message };
    let bytes = crate::files::read_input(path, &ROUTING_FILE).map_err(|e| fail(e.to_string()))?;
    let table = parse_bytes(path, &bytes, expect)?;
    Ok(LoadedRouting { table, file: path.display().to_string(), sha256: sha256_hex(&bytes) })
}

/// Check the file's bytes (UTF-8, then [`parse`]); `path` labels errors.
pub fn parse_bytes(
    path: &Path,
    bytes: &[u8],
    expect: Expected,
) -> Result<RoutingTable, EngineError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let valid = e.valid_up_to();
        let prefix = std::str::from_utf8(&bytes[..valid]).unwrap_or_default();
        let at = SourceMap::new("", prefix).location_of(valid);
        EngineError::RoutingFile {
            path: path.to_path_buf(),
            at: Some((at.line, at.col)),
            message: format!(
                "invalid UTF-8 at byte {valid} (0x{:02x}): a routing file is JSON text",
                bytes[valid]
            ),
        }
    })?;
    parse(path, text, expect)
}

/// Check a routing file's text against `expect` and build the job's table (weights 1.0 when
/// the file has none).
pub fn parse(path: &Path, text: &str, expect: Expected) -> Result<RoutingTable, EngineError> {
    let fault = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = FileSeed { expect, fault: &fault }.deserialize(&mut de).and_then(|f| {
        de.end()?;
        Ok(f)
    });
    let file = match parsed {
        Ok(file) => file,
        Err(e) => {
            // A fault of ours carries its own words; serde_json's position says where.
            let message = fault.borrow_mut().take().unwrap_or_else(|| {
                let text = e.to_string();
                let suffix = format!(" at line {} column {}", e.line(), e.column());
                text.strip_suffix(&suffix).unwrap_or(&text).to_string()
            });
            // serde_json counts the column of an error at a line's first character as 0.
            let at = (e.line() > 0).then(|| (e.line(), e.column().max(1)));
            return Err(EngineError::RoutingFile { path: path.to_path_buf(), at, message });
        }
    };
    let fail =
        |message: String| EngineError::RoutingFile { path: path.to_path_buf(), at: None, message };
    for (key, found) in [
        ("num_experts", file.num_experts),
        ("topk", file.topk),
        ("tokens_per_rank", file.tokens_per_rank),
    ] {
        if found.is_none() {
            return Err(fail(format!("missing key \"{key}\"")));
        }
    }
    let Some(idx) = file.topk_idx else { return Err(fail("missing key \"topk_idx\"".into())) };
    if idx.ranks < expect.num_ranks as u64 {
        return Err(fail(format!(
            "topk_idx has {} rank(s), the job has {}: a file routing needs at least as many \
             ranks as the job (the job takes the first {})",
            idx.ranks, expect.num_ranks, expect.num_ranks
        )));
    }
    let topk_weights = match file.topk_weights {
        Some(w) if w.ranks != idx.ranks => {
            return Err(fail(format!(
                "topk_weights has {} rank(s), topk_idx has {}: they must have the same shape",
                w.ranks, idx.ranks
            )));
        }
        Some(w) => w.weights,
        None => vec![1.0; idx.experts.len()],
    };
    Ok(RoutingTable {
        num_ranks: expect.num_ranks,
        tokens_per_rank: expect.tokens_per_rank,
        topk: expect.topk,
        num_experts: expect.num_experts,
        topk_idx: idx.experts,
        topk_weights,
    })
}

/// The file format of `table` (one token per line; weights written as the f64 of each f32, so
/// reading gives back the same bits), with `source` as its provenance text.
pub fn to_json(table: &RoutingTable, source: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{{\"source\":{},", serde_json::Value::from(source));
    let _ = writeln!(
        out,
        "\"num_experts\":{},\"topk\":{},\"tokens_per_rank\":{},",
        table.num_experts, table.topk, table.tokens_per_rank
    );
    let rows = |out: &mut String, key: &str, row: &dyn Fn(u32, u32) -> String| {
        let _ = write!(out, "\"{key}\":[");
        for r in 0..table.num_ranks {
            out.push_str(if r == 0 { "\n[" } else { ",\n[" });
            for t in 0..table.tokens_per_rank {
                if t > 0 {
                    out.push_str(",\n");
                }
                let _ = write!(out, "[{}]", row(r, t));
            }
            out.push(']');
        }
        out.push(']');
    };
    rows(&mut out, "topk_idx", &|r, t| join(table.experts(r, t).iter().map(i32::to_string)));
    out.push_str(",\n");
    rows(&mut out, "topk_weights", &|r, t| {
        join(table.weights(r, t).iter().map(|&w| serde_json::Value::from(w as f64).to_string()))
    });
    out.push_str("}\n");
    out
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(",")
}

/// What the streaming pass keeps of a file.
#[derive(Default)]
struct RoutingFile {
    num_experts: Option<u64>,
    topk: Option<u64>,
    tokens_per_rank: Option<u64>,
    topk_idx: Option<Ranks>,
    topk_weights: Option<Ranks>,
}

/// One `[rank][token][slot]` array: the first `num_ranks` ranks flattened (into `experts` or
/// `weights`, whichever it holds), and how many ranks the file has.
#[derive(Default)]
struct Ranks {
    experts: Vec<i32>,
    weights: Vec<f32>,
    ranks: u64,
}

const KEYS: &str = "source, num_experts, topk, tokens_per_rank, topk_idx, topk_weights";

struct FileSeed<'a> {
    expect: Expected,
    /// Our own fault, in words; serde_json adds where it was.
    fault: &'a RefCell<Option<String>>,
}

impl FileSeed<'_> {
    fn fail<E: de::Error>(&self, message: String) -> E {
        let error = E::custom(&message);
        *self.fault.borrow_mut() = Some(message);
        error
    }
}

impl<'de> DeserializeSeed<'de> for FileSeed<'_> {
    type Value = RoutingFile;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<RoutingFile, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FileSeed<'_> {
    type Value = RoutingFile;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a routing file: a JSON object with the keys {KEYS}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RoutingFile, A::Error> {
        let e = self.expect;
        let mut file = RoutingFile::default();
        let mut seen: Vec<String> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                return Err(self.fail(format!("the key \"{key}\" is given twice")));
            }
            match key.as_str() {
                "source" => {
                    map.next_value::<IgnoredAny>()?;
                }
                "num_experts" | "topk" | "tokens_per_rank" => {
                    let found: u64 = map.next_value()?;
                    let (ours, want, slot) = match key.as_str() {
                        "num_experts" => ("experts", e.num_experts, &mut file.num_experts),
                        "topk" => ("topk", e.topk, &mut file.topk),
                        _ => ("tokens_per_rank", e.tokens_per_rank, &mut file.tokens_per_rank),
                    };
                    if found != want as u64 {
                        return Err(self.fail(format!(
                            "{key} = {found}, but the workload has {ours} = {want}: they must be \
                             equal"
                        )));
                    }
                    *slot = Some(found);
                }
                "topk_idx" => {
                    let seed = RanksSeed { file: &self, weights: false };
                    file.topk_idx = Some(map.next_value_seed(seed)?);
                }
                "topk_weights" => {
                    let seed = RanksSeed { file: &self, weights: true };
                    file.topk_weights = Some(map.next_value_seed(seed)?);
                }
                _ => {
                    return Err(
                        self.fail(format!("unknown key \"{key}\"; a routing file has {KEYS}"))
                    );
                }
            }
            seen.push(key);
        }
        Ok(file)
    }
}

/// `topk_idx` or `topk_weights`: one array per rank.
struct RanksSeed<'s, 'a> {
    file: &'s FileSeed<'a>,
    weights: bool,
}

impl<'de> DeserializeSeed<'de> for RanksSeed<'_, '_> {
    type Value = Ranks;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Ranks, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RanksSeed<'_, '_> {
    type Value = Ranks;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array with one array of token rows per rank")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ranks, A::Error> {
        let e = self.file.expect;
        // The job's table: at most MAX_SELECTIONS entries, the scenario limits hold first.
        let total = e.num_ranks as usize * e.tokens_per_rank as usize * e.topk as usize;
        let mut out = Ranks::default();
        if self.weights {
            out.weights.reserve_exact(total);
        } else {
            out.experts.reserve_exact(total);
        }
        loop {
            let keep = out.ranks < e.num_ranks as u64;
            let kept = match (keep, self.weights) {
                (false, _) => Kept::Nothing { weights: self.weights },
                (true, false) => Kept::Experts(&mut out.experts),
                (true, true) => Kept::Weights(&mut out.weights),
            };
            let seed = TokensSeed { file: self.file, rank: out.ranks, kept };
            if seq.next_element_seed(seed)?.is_none() {
                return Ok(out);
            }
            out.ranks += 1;
        }
    }
}

/// Where one rank's values go.
enum Kept<'v> {
    Experts(&'v mut Vec<i32>),
    Weights(&'v mut Vec<f32>),
    /// A rank beyond the job's: checked, not kept.
    Nothing {
        weights: bool,
    },
}

/// One rank's rows.
struct TokensSeed<'s, 'a, 'v> {
    file: &'s FileSeed<'a>,
    rank: u64,
    kept: Kept<'v>,
}

impl<'de> DeserializeSeed<'de> for TokensSeed<'_, '_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for TokensSeed<'_, '_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}: an array of token rows", self.rank)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let e = self.file.expect;
        let mut token: u64 = 0;
        loop {
            if token == e.tokens_per_rank as u64 {
                // One more row is an error; `IgnoredAny` reads it without keeping it.
                if seq.next_element::<IgnoredAny>()?.is_some() {
                    return Err(self.file.fail(format!(
                        "rank {}: more than tokens_per_rank = {} rows",
                        self.rank, e.tokens_per_rank
                    )));
                }
                return Ok(());
            }
            let seed = SlotsSeed { file: self.file, rank: self.rank, token, kept: &mut self.kept };
            if seq.next_element_seed(seed)?.is_none() {
                return Err(self.file.fail(format!(
                    "rank {}: {token} rows, tokens_per_rank = {}: every rank needs one row per \
                     token",
                    self.rank, e.tokens_per_rank
                )));
            }
            token += 1;
        }
    }
}

/// One token's slots.
struct SlotsSeed<'s, 'a, 'v, 'k> {
    file: &'s FileSeed<'a>,
    rank: u64,
    token: u64,
    kept: &'k mut Kept<'v>,
}

impl SlotsSeed<'_, '_, '_, '_> {
    /// An entry that is not a number (or not an integer in `topk_idx`), with its coordinates.
    fn wrap<E: de::Error>(&self, slot: u64, err: E) -> E {
        let text = err.to_string();
        // serde_json may already have put its position on it; the outer error carries it.
        let words = text.split(" at line ").next().unwrap_or(&text);
        self.file.fail(format!("rank {} token {} slot {slot}: {words}", self.rank, self.token))
    }
}

impl<'de> DeserializeSeed<'de> for SlotsSeed<'_, '_, '_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for SlotsSeed<'_, '_, '_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} token {}: an array of top-k entries", self.rank, self.token)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let e = self.file.expect;
        let (rank, token) = (self.rank, self.token);
        let at = |slot: u64| format!("rank {rank} token {token} slot {slot}");
        let weights = matches!(self.kept, Kept::Weights(_) | Kept::Nothing { weights: true });
        // This token's experts so far, for the duplicate check (top-k ≤ 32: a scan is cheap).
        let mut mine: Vec<i64> = Vec::new();
        let mut slot: u64 = 0;
        loop {
            if slot == e.topk as u64 {
                if seq.next_element::<IgnoredAny>()?.is_some() {
                    return Err(self.file.fail(format!(
                        "rank {rank} token {token}: more than topk = {} entries",
                        e.topk
                    )));
                }
                return Ok(());
            }
            if weights {
                let Some(w) = seq.next_element::<f64>().map_err(|err| self.wrap(slot, err))? else {
                    break;
                };
                let w32 = w as f32;
                if !(w32.is_finite() && w32 >= 0.0) {
                    return Err(self
                        .file
                        .fail(format!("{}: weight {w:?} is not a finite number ≥ 0", at(slot))));
                }
                if let Kept::Weights(out) = self.kept {
                    out.push(w32);
                }
            } else {
                let Some(x) = seq.next_element::<i64>().map_err(|err| self.wrap(slot, err))? else {
                    break;
                };
                if x != -1 && !(0..e.num_experts as i64).contains(&x) {
                    return Err(self.file.fail(format!(
                        "{}: expert {x} is not -1 (masked) or in [0, {})",
                        at(slot),
                        e.num_experts
                    )));
                }
                if x >= 0 && mine.contains(&x) {
                    return Err(self
                        .file
                        .fail(format!("{}: expert {x} is selected twice by one token", at(slot))));
                }
                mine.push(x);
                if let Kept::Experts(out) = self.kept {
                    out.push(x as i32);
                }
            }
            slot += 1;
        }
        Err(self.file.fail(format!(
            "rank {rank} token {token}: {slot} entries, topk = {}: every row needs exactly topk \
             entries (-1 for a masked one)",
            e.topk
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::schema::{RoutingKind, WorkloadSpec};
    use crate::testing::{ScenarioDraft, one_gpu_low_latency};
    use crate::workload::Workload;
    use proptest::prelude::*;

    /// 2 ranks × 3 tokens, top-2 of 8 experts.
    const SHAPE: Expected = Expected { num_ranks: 2, tokens_per_rank: 3, topk: 2, num_experts: 8 };
    /// A valid file of `SHAPE` with one more rank than the job has, one masked entry, weights.
    const GOOD: &str = r#"{"source": "hand-written",
"num_experts": 8, "topk": 2, "tokens_per_rank": 3,
"topk_idx": [
[[0,1],
[2,-1],
[7,6]],
[[3,4],
[5,6],
[1,0]],
[[0,1],
[0,1],
[0,1]]],
"topk_weights": [
[[0.5,1],[2,0],[0.25,0.75]],
[[1,1],[1,1],[1,1]],
[[1,1],[1,1],[1,1]]]}
"#;

    fn parse_err(text: &str) -> String {
        parse(Path::new("r.json"), text, SHAPE).unwrap_err().to_string()
    }

    #[test]
    fn a_valid_file_gives_the_first_ranks() {
        let t = parse(Path::new("r.json"), GOOD, SHAPE).unwrap();
        assert_eq!((t.num_ranks, t.tokens_per_rank, t.topk, t.num_experts), (2, 3, 2, 8));
        assert_eq!(t.topk_idx, [0, 1, 2, -1, 7, 6, 3, 4, 5, 6, 1, 0]);
        assert_eq!(t.weights(0, 0), [0.5, 1.0]);
        assert_eq!(t.weights(0, 2), [0.25, 0.75]);
        // Without weights every weight is 1.
        let text = GOOD.split(",\n\"topk_weights\"").next().unwrap().to_string() + "}";
        let t = parse(Path::new("r.json"), &text, SHAPE).unwrap();
        assert!(t.topk_weights.iter().all(|&w| w == 1.0) && t.topk_weights.len() == 12);
    }

    /// Every fault names the file, the line and column, and for content the rank, token and
    /// slot; none panics.
    #[test]
    fn faults_name_file_position_and_coordinates() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "[7,6]],",
                "[7,8]],",
                "r.json:6:5: rank 0 token 2 slot 1: expert 8 is not -1 (masked) or in [0, 8)",
            ),
            ("[7,6]],", "[7,-2]],", "r.json:6:6: rank 0 token 2 slot 1: expert -2 is not -1"),
            (
                "[7,6]],",
                "[6,6]],",
                "r.json:6:5: rank 0 token 2 slot 1: expert 6 is selected twice by one token",
            ),
            (
                "[7,6]],",
                "[7]],",
                "r.json:6:3: rank 0 token 2: 1 entries, topk = 2: every row needs exactly topk entries (-1 for a masked one)",
            ),
            ("[7,6]],", "[7,6,5]],", "r.json:6:7: rank 0 token 2: more than topk = 2 entries"),
            (
                "[7,6]],",
                "[7,\"x\"]],",
                "r.json:6:7: rank 0 token 2 slot 1: invalid type: string \"x\", expected i64",
            ),
            (
                "[7,6]],",
                "[7,1.5]],",
                "r.json:6:7: rank 0 token 2 slot 1: invalid type: floating point `1.5`, expected i64",
            ),
            ("[2,-1],\n[7,6]],", "[7,6]],", "r.json:5:6: rank 0: 2 rows, tokens_per_rank = 3"),
            ("[7,6]],", "[7,6],[1,2]],", "r.json:6:12: rank 0: more than tokens_per_rank = 3 rows"),
            (
                "\"num_experts\": 8",
                "\"num_experts\": 9",
                "r.json:2:16: num_experts = 9, but the workload has experts = 8",
            ),
            ("\"topk\": 2", "\"topk\": 3", "r.json:2:27: topk = 3, but the workload has topk = 2"),
            (
                "\"tokens_per_rank\": 3",
                "\"tokens_per_rank\": 4",
                "r.json:2:49: tokens_per_rank = 4, but the workload has tokens_per_rank = 3: they must be equal",
            ),
            (
                "\"tokens_per_rank\": 3",
                "\"tokens_per_rank\": -3",
                "r.json:2:50: invalid value: integer `-3`, expected u64",
            ),
            (
                "\"source\": \"hand-written\",",
                "\"source\": 1, \"sauce\": 2,",
                "r.json:1:21: unknown key \"sauce\"; a routing file has source",
            ),
            (
                "\"source\": \"hand-written\",",
                "\"topk\": 2,",
                "r.json:2:24: the key \"topk\" is given twice",
            ),
            (
                "[0.25,0.75]]",
                "[0.25,-0.75]]",
                "r.json:14:27: rank 0 token 2 slot 1: weight -0.75 is not a finite number ≥ 0",
            ),
            (
                "[0.25,0.75]]",
                "[0.25,1e39]]",
                "r.json:14:26: rank 0 token 2 slot 1: weight 1e39 is not a finite number ≥ 0",
            ),
            (
                "[0.25,0.75]]",
                "[0.25,1e999]]",
                "r.json:14:27: rank 0 token 2 slot 1: number out of range",
            ),
            (
                "[[1,1],[1,1],[1,1]]]}",
                "[[1,1],[1,1],[1]]]}",
                "r.json:16:16: rank 2 token 2: 1 entries, topk = 2",
            ),
            (
                "[[0,1],\n[0,1],\n[0,1]]]",
                "[[0,1],\n[0,1],\n[0,9]]]",
                "r.json:12:5: rank 2 token 2 slot 1: expert 9 is not -1",
            ),
            (
                ",\n[[1,1],[1,1],[1,1]]]}",
                "]}",
                "r.json: topk_weights has 2 rank(s), topk_idx has 3: they must have the same shape",
            ),
            ("\"tokens_per_rank\": 3,", "", "r.json: missing key \"tokens_per_rank\""),
            ("}\n", "", "r.json:16:20: EOF while parsing an object"),
            ("}\n", "} x", "r.json:16:23: trailing characters"),
            (
                "{\"source\"",
                "[\"source\"",
                "r.json:1:1: invalid type: sequence, expected a routing file: a JSON object",
            ),
        ];
        let mut wrong = Vec::new();
        for (old, new, want) in cases {
            assert!(GOOD.contains(old), "{old}");
            let got = parse_err(&GOOD.replacen(old, new, 1));
            if !got.starts_with(want) {
                wrong.push(format!("{old:?} → {new:?}:\n got  {got}\n want {want}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        // Fewer ranks than the job.
        let one = Expected { num_ranks: 4, ..SHAPE };
        let got = parse(Path::new("r.json"), GOOD, one).unwrap_err().to_string();
        assert!(got.starts_with("r.json: topk_idx has 3 rank(s), the job has 4"), "{got}");
        // Invalid UTF-8, with its line and column.
        let mut bytes = GOOD.as_bytes().to_vec();
        bytes.insert(GOOD.find("hand").unwrap(), 0xff);
        let got = parse_bytes(Path::new("r.json"), &bytes, SHAPE).unwrap_err().to_string();
        assert_eq!(
            got,
            "r.json:1:13: invalid UTF-8 at byte 12 (0xff): a routing file is JSON text"
        );
    }

    #[test]
    fn what_is_not_a_readable_file_is_an_error_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.json");
        let got = load(&missing, SHAPE).unwrap_err().to_string();
        assert!(got.starts_with(&format!("{}: ", missing.display())), "{got}");
        let got = load(dir.path(), SHAPE).unwrap_err().to_string();
        assert!(
            got.ends_with("not a regular file (a directory); a routing file is a JSON file"),
            "{got}"
        );
        let big = dir.path().join("big.json");
        std::fs::File::create(&big).unwrap().set_len(MAX_ROUTING_FILE_BYTES + 1).unwrap();
        let got = load(&big, SHAPE).unwrap_err().to_string();
        assert!(
            got.ends_with(
                "268435457 bytes is more than a routing file may have (268435456 bytes, 256 MiB)"
            ),
            "{got}"
        );
        let good = dir.path().join("good.json");
        std::fs::write(&good, GOOD).unwrap();
        let loaded = load(&good, SHAPE).unwrap();
        assert_eq!(loaded.sha256, sha256_hex(GOOD.as_bytes()));
        assert_eq!(loaded.file, good.display().to_string());
    }

    #[test]
    fn relative_paths_are_relative_to_the_scenario() {
        assert_eq!(resolve("scenarios/x.toml", "r/a.json"), Path::new("scenarios/r/a.json"));
        assert_eq!(resolve("x.toml", "a.json"), Path::new("a.json"));
        assert_eq!(resolve("scenarios/x.toml", "/abs/a.json"), Path::new("/abs/a.json"));
    }

    /// A scenario on one GPU replaying `routing.json` from a temporary directory.
    fn draft(dir: &Path) -> ScenarioDraft {
        one_gpu_low_latency("t")
            .named_file(&dir.join("t.toml").display().to_string())
            .set("job[0].workload.masked_selections", 0)
            .set("job[0].workload.routing", "file")
            .set("job[0].workload.routing_file", "routing.json")
    }

    #[test]
    fn the_plan_holds_the_file_and_the_rules_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let generated = one_gpu_low_latency("t").set("job[0].workload.masked_selections", 0);
        let table = generated.plan().jobs[0].deepep().unwrap().routing().clone();
        let text = to_json(&table, "generated");
        std::fs::write(dir.path().join("routing.json"), &text).unwrap();
        let plan = draft(dir.path()).plan();
        let job = plan.jobs[0].deepep().unwrap();
        assert_eq!(job.routing(), &table);
        let record = &plan.routing_files()[0];
        assert_eq!(record.sha256, sha256_hex(text.as_bytes()));
        assert_eq!(record.file, dir.path().join("routing.json").display().to_string());
        assert_ne!(plan.inputs_sha256(), plan.scenario_sha256);
        assert_eq!(generated.plan().inputs_sha256(), generated.plan().scenario_sha256);

        // A content fault: the scenario's file:line of routing_file, then the file's position.
        std::fs::write(dir.path().join("routing.json"), text.replacen("[", "[[", 1)).unwrap();
        let d = draft(dir.path());
        let errors = d.errors();
        let want = format!(
            "{}:{}:1: error[routing-file]: job \"ep\": job[0].workload.routing_file: {}:",
            d.file(),
            d.line_of_key("routing_file"),
            dir.path().join("routing.json").display()
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].to_string().starts_with(&want), "{}\n{want}", errors[0]);

        let message = |d: ScenarioDraft| {
            d.diagnostics().iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
        };
        let no_file = message(draft(dir.path()).set("job[0].workload.routing", "uniform"));
        assert!(no_file.contains("error[routing-file]: job \"ep\": job[0].workload.routing_file: routing_file is read only with routing = \"file\""), "{no_file}");
        let d = one_gpu_low_latency("t").set("job[0].workload.routing", "file");
        let needs = message(d);
        assert!(
            needs.contains("job[0].workload.routing: routing = \"file\" needs routing_file"),
            "{needs}"
        );
        assert!(
            needs.contains(
                "job[0].workload.masked_selections: a file routing is replayed as recorded"
            ),
            "{needs}"
        );
        let skew = message(draft(dir.path()).set("job[0].workload.skew", 1.5));
        assert!(skew.contains("advisory[zipf-skew]"), "{skew}");
    }

    fn workload(kind: RoutingKind, tokens: u32, topk: u32, experts: u32) -> WorkloadSpec {
        let mut w: WorkloadSpec = toml::from_str(&format!(
            "tokens_per_rank = {tokens}\nhidden = 2048\ntopk = {topk}\nexperts = {experts}"
        ))
        .unwrap();
        w.routing = kind;
        w
    }

    /// JSON values of any shape, numbers of every kind among them.
    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            (-3i64..12).prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            "[a-z_]{0,16}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                prop::collection::vec(
                    (
                        prop::sample::select(vec![
                            "source",
                            "num_experts",
                            "topk",
                            "tokens_per_rank",
                            "topk_idx",
                            "topk_weights",
                            "other",
                        ]),
                        inner
                    ),
                    0..7
                )
                .prop_map(|kv| serde_json::Value::Object(
                    kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
                )),
            ]
        })
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(256))]

        /// What `generate` draws, written in the file format and read back, is the same table.
        #[test]
        fn generated_routings_round_trip(
            kind in prop::sample::select(vec![RoutingKind::Uniform, RoutingKind::NodeLimited, RoutingKind::Zipf]),
            ranks in prop::sample::select(vec![1u32, 2, 4, 8, 16]),
            tokens in 1u32..40,
            topk in 1u32..9,
            masked in 0u32..12,
            seed in any::<u64>(),
        ) {
            let mut w = workload(kind, tokens, topk, 8 * 16);
            w.skew = Some(1.3);
            w.masked_selections = masked.min(tokens * topk);
            w.seed = seed;
            let table = crate::routing::generate(&Workload::from_spec(&w, ranks), ranks);
            let expect = Expected { num_ranks: ranks, tokens_per_rank: tokens, topk, num_experts: 128 };
            let back = parse(Path::new("r.json"), &to_json(&table, "round trip"), expect).unwrap();
            prop_assert_eq!(back, table);
        }

        /// Arbitrary bytes never panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_bytes(Path::new("r.json"), &bytes, SHAPE);
        }

        /// Arbitrary JSON values, and valid files cut anywhere, never panic.
        #[test]
        fn arbitrary_json_never_panics(value in json_value(), cut in 0usize..GOOD.len()) {
            let _ = parse(Path::new("r.json"), &value.to_string(), SHAPE);
            let _ = parse(Path::new("r.json"), &GOOD[..cut], SHAPE);
        }
    }
}
