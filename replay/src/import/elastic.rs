//! DeepEP V2's `tests/elastic/test_ep.py` lines (parsed in `parse`: one line per rank and
//! timed case, `   * EP:   0/16 | dispatch: 90 GB/s (SO), 160 GB/s (SU), 550.123 us, 88080384
//! bytes | copy: ...`, and ` > Testing with ...` before each configuration; docs/deepep-replay.md,
//! "V2 lines") made into samples: an op's are its plain case's lines (`*` dispatch, `@` combine)
//! of the first configuration; every line is kept as a measurement.

use std::collections::{BTreeMap, BTreeSet};

use eptwin_engine::api::{OpKind, SampleRecord};
use serde_json::{Value, json};

use super::parse::{ElasticLine, Loc, Parsed};

/// What the V2 lines of an op give: one sample per rank, the mean scale-out and scale-up
/// bytes per rank, and the ranks without a line.
pub(super) struct ElasticOp {
    pub(super) samples: Vec<SampleRecord>,
    pub(super) so_bytes: Vec<f64>,
    pub(super) su_bytes: Vec<f64>,
    pub(super) missing: Vec<u32>,
}

/// The configuration the samples come from: the first one with a line of `op`'s plain case.
fn chosen_case(parsed: &Parsed, op: OpKind) -> Option<Option<usize>> {
    let plain = ElasticLine::plain(op);
    parsed.elastic.iter().find(|(_, _, l)| l.case == plain).map(|(_, case, _)| *case)
}

pub(super) fn elastic_samples(
    parsed: &Parsed,
    op: OpKind,
    num_ranks: u32,
    advisories: &mut Vec<String>,
    where_: &dyn Fn(Loc) -> String,
) -> ElasticOp {
    let plain = ElasticLine::plain(op);
    let case = chosen_case(parsed, op);
    let mut by_rank: BTreeMap<u32, (Loc, ElasticLine)> = BTreeMap::new();
    for (loc, c, l) in &parsed.elastic {
        if l.case == plain && Some(*c) == case {
            by_rank.entry(l.rank).or_insert((*loc, *l));
        }
    }
    let cases: BTreeSet<Option<usize>> =
        parsed.elastic.iter().filter(|(_, _, l)| l.case == plain).map(|(_, c, _)| *c).collect();
    if cases.len() > 1
        && let Some(Some(i)) = case
        && let Some((loc, text)) = parsed.cases.get(i)
    {
        advisories.push(format!(
            "deepep replay: {op}: the log times {} configurations; the numbers are the first's \
             (\"Testing with {text}\" at {})",
            cases.len(),
            where_(*loc)
        ));
    }
    let mut out = ElasticOp {
        samples: Vec::new(),
        so_bytes: Vec::new(),
        su_bytes: Vec::new(),
        missing: Vec::new(),
    };
    for rank in 0..num_ranks {
        let Some((_, l)) = by_rank.get(&rank) else {
            out.missing.push(rank);
            continue;
        };
        out.samples.push(SampleRecord {
            iteration: 0,
            rank: Some(rank),
            latency_us: l.t_us,
            phases_us: BTreeMap::new(),
        });
        out.so_bytes.push(l.so_gbps * l.t_us * 1e3);
        out.su_bytes.push(l.su_bytes);
    }
    out
}

/// Every V2 line as a measurement (`deepep.v2.<case>`: per rank, SO and SU GB/s and time).
pub(super) fn record_elastic_measurements(
    parsed: &Parsed,
    where_: &dyn Fn(Loc) -> String,
    measurements: &mut BTreeMap<String, Value>,
) {
    let mut by_case: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (loc, case, l) in &parsed.elastic {
        let testing = case.and_then(|i| parsed.cases.get(i)).map(|(_, t)| t.clone());
        by_case.entry(ElasticLine::case_name(l.case).replace(' ', "_")).or_default().push(json!({
            "at": where_(*loc), "rank": l.rank, "ranks": l.num_ranks, "testing": testing,
            "so_gbps": l.so_gbps, "su_gbps": l.su_gbps, "t_us": l.t_us, "su_bytes": l.su_bytes,
        }));
    }
    for (case, lines) in by_case {
        measurements.insert(format!("deepep.v2.{case}"), Value::Array(lines));
    }
}
