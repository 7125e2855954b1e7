//! DeepEP's printed numbers back into a result document (`backend.kind = "deepep"`): the
//! low-latency script's per-rank lines, the normal scripts' tuning and Best lines, their
//! `[testing] ... passed` checks, `[config]` lines and Python tracebacks, from the logs of
//! every node (ranks interleaved in any order). docs/deepep-replay.md lists the line kinds.
//!
//! A log of another configuration than the scenario is an error naming both values; a failed
//! check, a traceback, a cut-short log or a missing number makes the verdict `failed`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::launch::{Launch, Marker, SCRIPT_LL_MASKED, launch};
use super::{Script, ScriptArgs, Subject};
use crate::deepep::bytes::{ll_combine_msg_bytes, ll_dispatch_msg_bytes};
use crate::deepep::config::Config;
use crate::error::EngineError;
use crate::plan::{JobPlan, Plan};
use crate::result::{
    JobResult, OpResult, Provenance, RESULT_SCHEMA, RunResult, SampleRecord, Stats, Summary,
    Verdict,
};
use crate::run::{job_facts, job_kind_name, reference_comparison, scenario_ref};
use crate::scenario::schema::{Dtype, OpKind, Scenario};
use crate::scenario::sha256_hex;
use crate::transport::BackendKind;

/// One log as the binary read it: the name it was given (a path) and its text.
#[derive(Debug, Clone, Copy)]
pub struct LogText<'a> {
    pub name: &'a str,
    pub text: &'a str,
}

/// Where a line is: index into the logs and 1-based line number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Loc {
    log: usize,
    line: usize,
}

/// A low-latency per-rank line (`[rank R] ...`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum RankLine {
    /// `Dispatch + combine bandwidth: B GB/s, avg_t=A us, min_t=M us, max_t=X us` (bench).
    Both { bw_gbps: f64, avg_us: f64, min_us: f64, max_us: f64 },
    /// `Dispatch bandwidth: B GB/s, avg_t=T us | Combine bandwidth: B GB/s, avg_t=T us`
    /// (kernel time from the profiler).
    Kernels { dispatch_gbps: f64, dispatch_us: f64, combine_gbps: f64, combine_us: f64 },
    /// `Dispatch send/recv time: S + R us | Combine send/recv time: S + R us` (hook mode).
    Hook {
        dispatch_send_us: f64,
        dispatch_recv_us: f64,
        combine_send_us: f64,
        combine_recv_us: f64,
    },
}

const BOTH_LINE: &str = "Dispatch + combine bandwidth";
const KERNELS_LINE: &str = "Dispatch bandwidth | Combine bandwidth";
const HOOK_LINE: &str = "send/recv time";

impl RankLine {
    fn kind(&self) -> &'static str {
        match self {
            RankLine::Both { .. } => BOTH_LINE,
            RankLine::Kernels { .. } => KERNELS_LINE,
            RankLine::Hook { .. } => HOOK_LINE,
        }
    }
}

/// Which op and data type a Best line (and the tuning lines before it) belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TuningOf {
    Dispatch(Dtype),
    Combine,
}

/// A normal script's `[tuning]` line: one configuration's time, or the Best of a sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tuning {
    best: Option<TuningOf>,
    sms: u32,
    /// `None` for "default".
    nvl_chunk: Option<u32>,
    /// test_internode.py only.
    rdma_chunk: Option<u32>,
    notify_us: Option<f64>,
    t_us: f64,
    rdma_gbps: Option<f64>,
    nvl_gbps: f64,
}

impl Tuning {
    fn script(&self) -> Script {
        if self.rdma_chunk.is_some() { Script::Internode } else { Script::Intranode }
    }

    fn describe(&self) -> String {
        let nvl = self.nvl_chunk.map_or("default".to_string(), |c| c.to_string());
        match self.rdma_chunk {
            Some(r) => format!("SMs {}, NVL chunk {nvl}, RDMA chunk {r}", self.sms),
            None => format!("SMs {}, NVL chunk {nvl}", self.sms),
        }
    }

    fn to_json(self, source: &str, at: String) -> Value {
        json!({
            "source": source, "at": at, "sms": self.sms, "nvl_chunk": self.nvl_chunk,
            "rdma_chunk": self.rdma_chunk, "notify_us": self.notify_us, "t_us": self.t_us,
            "rdma_gbps": self.rdma_gbps, "nvl_gbps": self.nvl_gbps,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Line {
    Marker(Marker),
    Rank(u32, RankLine),
    Tuning(Tuning),
    /// `[testing] Running with ...`; `passed` when the line ends in "passed".
    Testing {
        text: String,
        passed: bool,
    },
    /// A line that is only `passed` (the end of a `[testing]` line another print split).
    Passed,
    Config(Vec<(String, String)>),
    LayoutMs(f64),
    Traceback,
    Other,
}

/// A tiny cursor over one line for the fixed print formats.
struct Cursor<'a> {
    rest: &'a str,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a str) -> Self {
        Cursor { rest: text }
    }

    fn lit(&mut self, literal: &str) -> Option<()> {
        self.rest = self.rest.trim_start().strip_prefix(literal.trim_start())?;
        Some(())
    }

    /// `,` or `:` (the scripts use either between fields), then spaces.
    fn sep(&mut self) -> Option<()> {
        let t = self.rest.trim_start();
        self.rest = t.strip_prefix(',').or_else(|| t.strip_prefix(':'))?;
        Some(())
    }

    fn token(&mut self) -> &'a str {
        let t = self.rest.trim_start();
        let end = t
            .find(|c: char| c.is_whitespace() || c == ',' || c == ':' || c == '|' || c == ')')
            .unwrap_or(t.len());
        self.rest = &t[end..];
        &t[..end]
    }

    fn num(&mut self) -> Option<f64> {
        self.token().parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
    }

    fn int(&mut self) -> Option<u32> {
        self.token().parse().ok()
    }

    fn end(&self) -> Option<()> {
        self.rest.trim().is_empty().then_some(())
    }
}

const TRACEBACK: &str = "Traceback (most recent call last)";

/// Strip what launchers put in front of a line: `srun --label`'s `12: `.
fn strip_label(line: &str) -> &str {
    let line = line.trim_end_matches('\r');
    let digits = line.len() - line.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits > 0
        && let Some(rest) = line[digits..].strip_prefix(": ")
    {
        return rest;
    }
    line
}

/// Parse one line. `Err` for a line of a known kind that does not read completely (a log
/// cut in the middle of a line, or two processes' output mixed in one line).
fn parse_line(raw: &str) -> Result<Line, String> {
    let line = strip_label(raw);
    let trimmed = line.trim();
    if let Some(marker) = Marker::parse(trimmed) {
        return marker.map(Line::Marker);
    }
    if let Some(rest) = trimmed.strip_prefix("[rank ") {
        let Some((rank, body)) = rest.split_once(']') else {
            return Err("a [rank R] line without its closing bracket".into());
        };
        let rank: u32 =
            rank.trim().parse().map_err(|_| format!("rank {rank:?} is not a number"))?;
        return Ok(match parse_rank_body(body.trim()) {
            Some(Some(l)) => Line::Rank(rank, l),
            Some(None) => {
                return Err("a per-rank benchmark line that does not read completely".into());
            }
            None => Line::Other,
        });
    }
    if let Some(body) = trimmed.strip_prefix("[tuning]") {
        return parse_tuning(body)
            .map(Line::Tuning)
            .ok_or_else(|| "a [tuning] line that does not read completely".into());
    }
    if let Some(body) = trimmed.strip_prefix("[testing]") {
        let passed = body.trim_end().ends_with("passed");
        return Ok(Line::Testing {
            text: body.trim().trim_end_matches("passed").trim().into(),
            passed,
        });
    }
    if trimmed == "passed" {
        return Ok(Line::Passed);
    }
    if let Some(body) = trimmed.strip_prefix("[config]") {
        let pairs: Option<Vec<(String, String)>> = body
            .split(',')
            .map(|p| p.trim().split_once('=').map(|(k, v)| (k.trim().into(), v.trim().into())))
            .collect();
        return pairs
            .map(Line::Config)
            .ok_or_else(|| "a [config] line that is not key=value pairs".into());
    }
    if let Some(body) = trimmed.strip_prefix("[layout]") {
        let mut c = Cursor::new(body);
        let ms = (|| {
            c.lit("Kernel performance:")?;
            let ms = c.num()?;
            c.lit("ms")?;
            c.end()?;
            Some(ms)
        })();
        return ms
            .map(Line::LayoutMs)
            .ok_or_else(|| "a [layout] line that does not read completely".into());
    }
    if trimmed.starts_with(TRACEBACK) {
        return Ok(Line::Traceback);
    }
    Ok(Line::Other)
}

/// `None`: not a benchmark line (the script's other prints); `Some(None)`: one cut short.
fn parse_rank_body(body: &str) -> Option<Option<RankLine>> {
    let mut c = Cursor::new(body);
    if c.lit("Dispatch + combine bandwidth:").is_some() {
        return Some((|| {
            let bw_gbps = c.num()?;
            c.lit("GB/s")?;
            c.sep()?;
            c.lit("avg_t=")?;
            let avg_us = c.num()?;
            c.lit("us")?;
            c.sep()?;
            c.lit("min_t=")?;
            let min_us = c.num()?;
            c.lit("us")?;
            c.sep()?;
            c.lit("max_t=")?;
            let max_us = c.num()?;
            c.lit("us")?;
            c.end()?;
            Some(RankLine::Both { bw_gbps, avg_us, min_us, max_us })
        })());
    }
    if c.lit("Dispatch bandwidth:").is_some() {
        return Some((|| {
            let dispatch_gbps = c.num()?;
            c.lit("GB/s")?;
            c.sep()?;
            c.lit("avg_t=")?;
            let dispatch_us = c.num()?;
            c.lit("us")?;
            c.lit("|")?;
            c.lit("Combine bandwidth:")?;
            let combine_gbps = c.num()?;
            c.lit("GB/s")?;
            c.sep()?;
            c.lit("avg_t=")?;
            let combine_us = c.num()?;
            c.lit("us")?;
            c.end()?;
            Some(RankLine::Kernels { dispatch_gbps, dispatch_us, combine_gbps, combine_us })
        })());
    }
    if c.lit("Dispatch send/recv time:").is_some() {
        return Some((|| {
            let dispatch_send_us = c.num()?;
            c.lit("+")?;
            let dispatch_recv_us = c.num()?;
            c.lit("us")?;
            c.lit("|")?;
            c.lit("Combine send/recv time:")?;
            let combine_send_us = c.num()?;
            c.lit("+")?;
            let combine_recv_us = c.num()?;
            c.lit("us")?;
            c.end()?;
            Some(RankLine::Hook {
                dispatch_send_us,
                dispatch_recv_us,
                combine_send_us,
                combine_recv_us,
            })
        })());
    }
    None
}

fn parse_tuning(body: &str) -> Option<Tuning> {
    let mut c = Cursor::new(body);
    let best = if c.lit("Best dispatch (").is_some() {
        let dtype = match c.token() {
            "FP8" => Dtype::Fp8,
            "BF16" => Dtype::Bf16,
            _ => return None,
        };
        c.lit(")")?;
        c.sep()?;
        Some(TuningOf::Dispatch(dtype))
    } else if c.lit("Best combine").is_some() {
        c.sep()?;
        Some(TuningOf::Combine)
    } else {
        None
    };
    c.lit("SMs")?;
    let sms = c.int()?;
    c.sep()?;
    c.lit("NVL chunk")?;
    let nvl_chunk = match c.token() {
        "default" => None,
        k => Some(k.parse().ok()?),
    };
    let mut rdma_chunk = None;
    let mut probe = Cursor::new(c.rest);
    if probe.sep().is_some() && probe.lit("RDMA chunk").is_some() {
        rdma_chunk = Some(probe.int()?);
        c = probe;
    }
    c.sep()?;
    let first = c.num()?;
    let t = if rdma_chunk.is_some() {
        // `<notify> + <kernel> us, <GB/s> GB/s (RDMA), <GB/s> GB/s (NVL)`
        c.lit("+")?;
        let t_us = c.num()?;
        c.lit("us")?;
        c.sep()?;
        let rdma = c.num()?;
        c.lit("GB/s (RDMA)")?;
        c.sep()?;
        let nvl = c.num()?;
        c.lit("GB/s (NVL)")?;
        Tuning {
            best,
            sms,
            nvl_chunk,
            rdma_chunk,
            notify_us: Some(first),
            t_us,
            rdma_gbps: Some(rdma),
            nvl_gbps: nvl,
        }
    } else {
        // `<GB/s> GB/s (NVL), [t: ]<us> us`
        c.lit("GB/s (NVL)")?;
        c.sep()?;
        // The Best lines label the time `t:`; the per-configuration lines do not.
        let _ = c.lit("t:");
        let t_us = c.num()?;
        c.lit("us")?;
        Tuning {
            best,
            sms,
            nvl_chunk,
            rdma_chunk,
            notify_us: None,
            t_us,
            rdma_gbps: None,
            nvl_gbps: first,
        }
    };
    c.end()?;
    Some(t)
}

/// Everything read from the logs, in order.
#[derive(Default)]
struct Parsed {
    markers: Vec<(Loc, Marker)>,
    ranks: BTreeMap<(u32, &'static str), (Loc, RankLine)>,
    /// Tuning lines with the Best line that closed their block (`None`: cut short).
    tuning: Vec<(Loc, Tuning, Option<TuningOf>)>,
    best: Vec<(Loc, Tuning)>,
    passed: Vec<String>,
    configs: Vec<(Loc, Vec<(String, String)>)>,
    layout_ms: Vec<f64>,
    failures: Vec<String>,
    /// Failed checks and tracebacks (the documents' `wrong`).
    wrong: u32,
}

/// Read the logs into a result document for `plan`'s one DeepEP job.
pub fn import(
    plan: &Plan,
    scenario: &Scenario,
    logs: &[LogText<'_>],
    provenance: Provenance,
) -> Result<RunResult, EngineError> {
    let subject = Subject::from_plan(plan, scenario);
    let launch = launch(&subject, "DeepEP").map_err(|notes| EngineError::ReplayRefused {
        file: subject.file.clone(),
        reasons: notes.iter().map(|n| n.to_string()).collect(),
    })?;
    let where_ = |loc: Loc| format!("{}:{}", logs[loc.log].name, loc.line);
    let parsed = parse_logs(logs, &where_)?;
    let job = &plan.jobs[0];
    let deepep = job.deepep().expect("launch() accepts only a DeepEP job");
    check_configuration(&subject, &launch, job, &parsed, &where_)?;

    let mut failures = parsed.failures.clone();
    let mut advisories: Vec<String> = plan.advisories.iter().map(|d| d.to_string()).collect();
    advisories.extend(launch.warnings.iter().map(|n| format!("deepep replay {n}")));
    let mut measurements = BTreeMap::new();
    let ends: Vec<String> =
        logs.iter().map(|l| format!("{}:{}", l.name, l.text.lines().count())).collect();
    let checks: Vec<String> = match launch.script {
        Script::LowLatency => vec![format!(
            "{}: the script's dispatch and combine assertions, run on every rank before timing",
            launch.script
        )],
        _ => parsed
            .passed
            .iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(|t| format!("{}: {t} passed", launch.script))
            .collect(),
    };
    let mut ops = Vec::new();
    let mut seen = BTreeSet::new();
    for &op in &job.ops {
        if !seen.insert(op) {
            continue;
        }
        let (samples, bytes) = match launch.script {
            Script::LowLatency => {
                ll_samples(&parsed, op, job.num_ranks(), deepep.workload.hook, &ends, &mut failures)
            }
            _ => normal_samples(
                &parsed,
                op,
                deepep.workload.dispatch_dtype,
                match op {
                    OpKind::Combine => deepep.combine_config,
                    _ => deepep.dispatch_config,
                },
                &where_,
                &ends,
                &mut failures,
                &mut advisories,
                &mut measurements,
            ),
        };
        ops.push(op_result(job, op, samples, &bytes, checks.clone(), parsed.wrong));
    }
    record_measurements(&parsed, &where_, &mut measurements);

    let mut backend = BTreeMap::from([
        ("kind".to_string(), json!(BackendKind::DeepEp.as_str())),
        ("script".to_string(), json!(launch.script.file_name())),
        ("args".to_string(), json!(launch.args.to_args().join(" "))),
        ("processes".to_string(), json!(job.num_ranks())),
        ("wire".to_string(), json!(if subject.nodes > 1 { "verbs" } else { "none" })),
        (
            "logs".to_string(),
            Value::Array(
                logs.iter()
                    .map(|l| {
                        json!({
                            "file": l.name,
                            "sha256": sha256_hex(l.text.as_bytes()),
                            "lines": l.text.lines().count(),
                        })
                    })
                    .collect(),
            ),
        ),
    ]);
    let launchers: BTreeSet<&str> =
        parsed.markers.iter().map(|(_, m)| m.launcher.as_str()).collect();
    if launchers.len() == 1 {
        backend.insert("launcher".into(), json!(launchers.into_iter().next()));
    }
    let verdict = if failures.is_empty() { Verdict::Ok } else { Verdict::Failed };
    Ok(RunResult {
        schema: RESULT_SCHEMA,
        scenario: scenario_ref(plan),
        backend,
        eptwin: provenance,
        verdict,
        waived_reason: None,
        failures,
        advisories,
        jobs: vec![JobResult {
            name: job.name.clone(),
            kind: job_kind_name(job).to_string(),
            ranks: job.num_ranks(),
            sl: job.sl.0,
            vl: job.vl().map(|v| v.0),
            facts: job_facts(job),
            ops,
            masked_ranks: Vec::new(),
        }],
        measurements,
    })
}

fn parse_logs(logs: &[LogText<'_>], where_: &dyn Fn(Loc) -> String) -> Result<Parsed, EngineError> {
    let mut p = Parsed::default();
    for (log, text) in logs.iter().enumerate() {
        if text.text.trim().is_empty() {
            p.failures.push(format!("{}: the log is empty", text.name));
            continue;
        }
        let mut pending_tuning: Vec<(Loc, Tuning)> = Vec::new();
        let mut open_check: Option<(Loc, String)> = None;
        let mut in_traceback = false;
        let mut traceback_at = Loc { log, line: 0 };
        for (i, raw) in text.text.lines().enumerate() {
            let loc = Loc { log, line: i + 1 };
            let parsed = match parse_line(raw) {
                Ok(l) => l,
                Err(why) => {
                    p.failures.push(format!(
                        "{}: {why} (log cut short?): {:?}",
                        where_(loc),
                        raw.trim()
                    ));
                    continue;
                }
            };
            if in_traceback && parsed == Line::Other {
                // The exception is the first line after the frames that is not indented (other
                // ranks' lines of known kinds may come in between and count as usual).
                let line = strip_label(raw);
                if !line.trim().is_empty() && !line.starts_with(char::is_whitespace) {
                    p.failures.push(format!(
                        "{}: Python traceback: {}",
                        where_(traceback_at),
                        line.trim()
                    ));
                    in_traceback = false;
                }
                continue;
            }
            // A traceback can start inside another line when stderr follows a print that did
            // not end its line (`[testing] ... ` before " passed").
            if parsed != Line::Traceback && raw.contains(TRACEBACK) {
                in_traceback = true;
                traceback_at = loc;
                p.wrong += 1;
            }
            match parsed {
                Line::Marker(m) => p.markers.push((loc, m)),
                Line::Rank(rank, line) => {
                    if let Some((first, _)) = p.ranks.insert((rank, line.kind()), (loc, line)) {
                        return Err(EngineError::ReplayLog {
                            location: where_(loc),
                            message: format!(
                                "rank {rank} printed its {:?} line a second time (first at {}): \
                                 pass each node's log once, one run per log",
                                line.kind(),
                                where_(first)
                            ),
                        });
                    }
                }
                Line::Tuning(t) => match t.best {
                    Some(of) => {
                        for (l, pending) in pending_tuning.drain(..) {
                            p.tuning.push((l, pending, Some(of)));
                        }
                        p.best.push((loc, t));
                    }
                    None => pending_tuning.push((loc, t)),
                },
                Line::Testing { text, passed: true } => p.passed.push(text),
                Line::Testing { text, passed: false } => {
                    if let Some((at, check)) = open_check.replace((loc, text)) {
                        p.failures.push(format!("{}: check did not pass: {check}", where_(at)));
                        p.wrong += 1;
                    }
                }
                Line::Passed => {
                    if let Some((_, check)) = open_check.take() {
                        p.passed.push(check);
                    }
                }
                Line::Config(pairs) => p.configs.push((loc, pairs)),
                Line::LayoutMs(ms) => p.layout_ms.push(ms),
                Line::Traceback => {
                    in_traceback = true;
                    traceback_at = loc;
                    p.wrong += 1;
                }
                Line::Other => {}
            }
        }
        if in_traceback {
            p.failures.push(format!(
                "{}: Python traceback (the log ends inside it)",
                where_(traceback_at)
            ));
        }
        if let Some((at, check)) = open_check {
            p.failures.push(format!(
                "{}: check did not pass (no \"passed\" before the log ends): {check}",
                where_(at)
            ));
            p.wrong += 1;
        }
        if let Some((first, _)) = pending_tuning.first() {
            p.failures.push(format!(
                "{}: {} tuning line(s) without the Best line that ends their sweep: the log is \
                 cut short",
                where_(*first),
                pending_tuning.len()
            ));
            for (l, t) in pending_tuning {
                p.tuning.push((l, t, None));
            }
        }
    }
    Ok(p)
}

/// A log of another configuration than the scenario is an error naming both values.
fn check_configuration(
    subject: &Subject,
    launch: &Launch,
    job: &JobPlan,
    parsed: &Parsed,
    where_: &dyn Fn(Loc) -> String,
) -> Result<(), EngineError> {
    let mismatch = |loc: Loc, message: String| EngineError::ReplayLog {
        location: where_(loc),
        message: format!("{message} (scenario {}, {})", subject.name, subject.file),
    };
    for (loc, m) in &parsed.markers {
        let script = m.script.unwrap_or(launch.script);
        if script != launch.script {
            return Err(mismatch(
                *loc,
                format!("the log ran {script}; the scenario replays with {}", launch.script),
            ));
        }
        let args = ScriptArgs::parse(script, &m.args)
            .map_err(|e| mismatch(*loc, format!("cannot read the launch line's arguments: {e}")))?;
        let nodes = m.nodes.unwrap_or(subject.nodes);
        if nodes != subject.nodes {
            return Err(mismatch(
                *loc,
                format!(
                    "the log ran on {nodes} node(s) (WORLD_SIZE); the scenario has {}",
                    subject.nodes
                ),
            ));
        }
        let diffs = args.differences(&launch.args, subject.nodes);
        if !diffs.is_empty() {
            let text: Vec<String> = diffs
                .iter()
                .map(|(flag, log, want)| format!("{flag} {log} in the log, {want} in the scenario"))
                .collect();
            return Err(mismatch(*loc, format!("another configuration: {}", text.join("; "))));
        }
    }
    let want = &launch.args;
    for (loc, pairs) in &parsed.configs {
        for (key, value) in pairs {
            let expected = match key.as_str() {
                "num_tokens" => Some(want.num_tokens),
                "hidden" => Some(want.hidden),
                "num_topk" => Some(want.num_topk),
                "num_experts" => Some(want.num_experts),
                "num_topk_groups" => want.topk_groups_on(subject.nodes),
                "num_ranks" => Some(job.num_ranks()),
                "num_nodes" => Some(subject.nodes),
                _ => None,
            };
            if let Some(expected) = expected
                && value.parse::<u32>().ok() != Some(expected)
            {
                return Err(mismatch(
                    *loc,
                    format!(
                        "another configuration: {key}={value} in the log, {expected} in the scenario"
                    ),
                ));
            }
        }
    }
    let n = job.num_ranks();
    for ((rank, _), (loc, _)) in &parsed.ranks {
        if launch.script != Script::LowLatency {
            return Err(mismatch(
                *loc,
                format!(
                    "a test_low_latency.py per-rank line; the scenario replays with {}",
                    launch.script
                ),
            ));
        }
        if *rank >= n {
            return Err(mismatch(
                *loc,
                format!("another configuration: rank {rank} in the log, {n} ranks in the scenario"),
            ));
        }
    }
    if launch.script == Script::LowLatency {
        // The LL script prints no configuration; its bandwidth × time counts the messages, so a
        // run with other tokens, top-k or hidden shows there. It masks up to 10 selections.
        let selections = f64::from(want.num_tokens * want.num_topk);
        let fewest = selections - f64::from(SCRIPT_LL_MASKED);
        let slack = selections * 0.005;
        let combine_dtype = if want.use_logfmt { Dtype::Logfmt } else { Dtype::Bf16 };
        for ((rank, _), (loc, line)) in &parsed.ranks {
            let RankLine::Kernels { dispatch_gbps, dispatch_us, combine_gbps, combine_us } = *line
            else {
                continue;
            };
            for (op, gbps, us, message_bytes) in [
                (
                    "dispatch",
                    dispatch_gbps,
                    dispatch_us,
                    ll_dispatch_msg_bytes(want.hidden, Dtype::Fp8),
                ),
                (
                    "combine",
                    combine_gbps,
                    combine_us,
                    ll_combine_msg_bytes(want.hidden, combine_dtype),
                ),
            ] {
                let counted = gbps * us * 1e3 / message_bytes as f64;
                if counted < fewest - slack || counted > selections + slack {
                    return Err(mismatch(
                        *loc,
                        format!(
                            "another configuration: rank {rank}'s {op} line counts {counted:.0} \
                             messages of {message_bytes} B ({gbps} GB/s x {us} us) in the log, \
                             {fewest}-{selections} ({} tokens x top-{}, up to {SCRIPT_LL_MASKED} \
                             masked) in the scenario",
                            want.num_tokens, want.num_topk
                        ),
                    ));
                }
            }
        }
    }
    let best = parsed.best.iter().map(|(l, t)| (l, t));
    for (loc, t) in best.chain(parsed.tuning.iter().map(|(l, t, _)| (l, t))) {
        if t.script() != launch.script {
            return Err(mismatch(
                *loc,
                format!(
                    "a {} tuning line; the scenario replays with {}",
                    t.script(),
                    launch.script
                ),
            ));
        }
    }
    Ok(())
}

/// One sample per rank line of `op`, and each rank's logical bytes (printed GB/s × time).
fn ll_samples(
    parsed: &Parsed,
    op: OpKind,
    num_ranks: u32,
    hook: bool,
    ends: &[String],
    failures: &mut Vec<String>,
) -> (Vec<SampleRecord>, Vec<f64>) {
    let needed = if hook { HOOK_LINE } else { KERNELS_LINE };
    let mut samples = Vec::new();
    let mut bytes = Vec::new();
    let mut missing = Vec::new();
    for rank in 0..num_ranks {
        let kernel = parsed.ranks.get(&(rank, KERNELS_LINE)).map(|(_, l)| *l);
        let hook_line = parsed.ranks.get(&(rank, HOOK_LINE)).map(|(_, l)| *l);
        let (gbps, kernel_us) = match (kernel, op) {
            (Some(RankLine::Kernels { dispatch_gbps, dispatch_us, .. }), OpKind::Dispatch) => {
                (Some(dispatch_gbps), Some(dispatch_us))
            }
            (Some(RankLine::Kernels { combine_gbps, combine_us, .. }), OpKind::Combine) => {
                (Some(combine_gbps), Some(combine_us))
            }
            _ => (None, None),
        };
        let (latency_us, phases) = if hook {
            match (hook_line, op) {
                (
                    Some(RankLine::Hook { dispatch_send_us: s, dispatch_recv_us: r, .. }),
                    OpKind::Dispatch,
                )
                | (
                    Some(RankLine::Hook { combine_send_us: s, combine_recv_us: r, .. }),
                    OpKind::Combine,
                ) => (
                    Some(s + r),
                    BTreeMap::from([("send".to_string(), s), ("recv".to_string(), r)]),
                ),
                _ => (None, BTreeMap::new()),
            }
        } else {
            (kernel_us, BTreeMap::new())
        };
        let Some(latency_us) = latency_us else {
            missing.push(rank);
            continue;
        };
        if let (Some(g), Some(t)) = (gbps, kernel_us) {
            bytes.push(g * t * 1e3);
        }
        samples.push(SampleRecord {
            iteration: 0,
            rank: Some(rank),
            latency_us,
            phases_us: phases,
        });
    }
    if !missing.is_empty() {
        failures.push(format!(
            "{op}: no {needed:?} line from rank(s) {} of {num_ranks} (logs end at {}: cut short, \
             or a node's log is missing)",
            ranges(&missing),
            ends.join(", ")
        ));
    }
    (samples, bytes)
}

#[allow(clippy::too_many_arguments)]
fn normal_samples(
    parsed: &Parsed,
    op: OpKind,
    dispatch_dtype: Dtype,
    config: Option<Config>,
    where_: &dyn Fn(Loc) -> String,
    ends: &[String],
    failures: &mut Vec<String>,
    advisories: &mut Vec<String>,
    measurements: &mut BTreeMap<String, Value>,
) -> (Vec<SampleRecord>, Vec<f64>) {
    let of = match op {
        OpKind::Combine => TuningOf::Combine,
        _ => TuningOf::Dispatch(dispatch_dtype),
    };
    let matching = config.and_then(|c| {
        parsed.tuning.iter().find(|(_, t, block)| {
            *block == Some(of)
                && t.sms == c.num_sms
                && t.nvl_chunk == Some(c.num_max_nvl_chunked_send_tokens)
                && t.rdma_chunk.is_none_or(|r| r == c.num_max_rdma_chunked_send_tokens)
        })
    });
    let best = parsed.best.iter().rev().find(|(_, t)| t.best == Some(of));
    let chosen = match (matching, best) {
        (Some((loc, t, _)), _) => Some((*loc, *t, "tuning")),
        (None, Some((loc, t))) => {
            let wanted = config.map_or("none resolved".to_string(), |c| {
                let mut t = *t;
                t.sms = c.num_sms;
                t.nvl_chunk = Some(c.num_max_nvl_chunked_send_tokens);
                t.rdma_chunk = t.rdma_chunk.map(|_| c.num_max_rdma_chunked_send_tokens);
                t.describe()
            });
            advisories.push(format!(
                "deepep replay: {op}: no tuning line for the scenario's Config ({wanted}); the \
                 number is the script's Best line ({}) at {}",
                t.describe(),
                where_(*loc)
            ));
            Some((*loc, *t, "best"))
        }
        (None, None) => None,
    };
    let Some((loc, t, source)) = chosen else {
        let what = match of {
            TuningOf::Dispatch(Dtype::Bf16) => "Best dispatch (BF16)",
            TuningOf::Dispatch(_) => "Best dispatch (FP8)",
            TuningOf::Combine => "Best combine",
        };
        failures.push(format!(
            "{op}: neither a tuning line for the scenario's Config nor a \"[tuning] {what}\" \
             line (logs end at {}: cut short?)",
            ends.join(", ")
        ));
        return (Vec::new(), Vec::new());
    };
    measurements.insert(format!("deepep.{op}.line"), t.to_json(source, where_(loc)));
    let gbps = t.rdma_gbps.unwrap_or(t.nvl_gbps);
    let phases =
        t.notify_us.map(|n| BTreeMap::from([("notify".to_string(), n)])).unwrap_or_default();
    (
        vec![SampleRecord { iteration: 0, rank: Some(0), latency_us: t.t_us, phases_us: phases }],
        vec![gbps * t.t_us * 1e3],
    )
}

fn op_result(
    job: &JobPlan,
    op: OpKind,
    samples: Vec<SampleRecord>,
    bytes: &[f64],
    checks: Vec<String>,
    wrong: u32,
) -> OpResult {
    let latencies: Vec<f64> = samples.iter().map(|s| s.latency_us).collect();
    let latency_us = Stats::of(&latencies);
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    let logical_bytes_per_rank = mean(bytes);
    let mut phases: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for s in &samples {
        for (k, v) in &s.phases_us {
            phases.entry(k.clone()).or_default().push(*v);
        }
    }
    let summary = Summary {
        latency_us,
        logical_bw_gbps: if latency_us.mean > 0.0 {
            logical_bytes_per_rank / (latency_us.mean * 1e3)
        } else {
            0.0
        },
        logical_bw_label: job.logical_bw_label().to_string(),
        logical_bytes_per_rank,
        rdma_bytes: 0,
        nvlink_bytes: 0,
        wire_bytes: 0,
        phases_us: phases.into_iter().map(|(k, v)| (k, mean(&v))).collect(),
        checks,
        wrong,
    };
    OpResult {
        op: op.to_string(),
        reference: reference_comparison(job, op, &summary),
        summary,
        samples,
    }
}

fn record_measurements(
    parsed: &Parsed,
    where_: &dyn Fn(Loc) -> String,
    measurements: &mut BTreeMap<String, Value>,
) {
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let mut both = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut printed = (Vec::new(), Vec::new());
    let mut hook = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (_, line) in parsed.ranks.values() {
        match *line {
            RankLine::Both { bw_gbps, avg_us, min_us, max_us } => {
                both.0.push(bw_gbps);
                both.1.push(avg_us);
                both.2.push(min_us);
                both.3.push(max_us);
            }
            RankLine::Kernels { dispatch_gbps, combine_gbps, .. } => {
                printed.0.push(dispatch_gbps);
                printed.1.push(combine_gbps);
            }
            RankLine::Hook {
                dispatch_send_us,
                dispatch_recv_us,
                combine_send_us,
                combine_recv_us,
            } => {
                hook.0.push(dispatch_send_us);
                hook.1.push(dispatch_recv_us);
                hook.2.push(combine_send_us);
                hook.3.push(combine_recv_us);
            }
        }
    }
    if !both.0.is_empty() {
        measurements.insert(
            "deepep.dispatch_combine".into(),
            json!({
                "ranks": both.0.len(),
                "bw_gbps_mean": mean(&both.0),
                "avg_us_mean": mean(&both.1),
                "min_us": both.2.iter().copied().fold(f64::INFINITY, f64::min),
                "max_us": both.3.iter().copied().fold(0.0, f64::max),
            }),
        );
    }
    if !printed.0.is_empty() {
        measurements.insert(
            "deepep.printed_bw_gbps_mean".into(),
            json!({ "ranks": printed.0.len(), "dispatch": mean(&printed.0), "combine": mean(&printed.1) }),
        );
    }
    if !hook.0.is_empty() {
        measurements.insert(
            "deepep.hook_us_mean".into(),
            json!({
                "ranks": hook.0.len(),
                "dispatch_send": mean(&hook.0), "dispatch_recv": mean(&hook.1),
                "combine_send": mean(&hook.2), "combine_recv": mean(&hook.3),
            }),
        );
    }
    for (loc, t) in &parsed.best {
        let key = match t.best {
            Some(TuningOf::Dispatch(Dtype::Bf16)) => "deepep.best.dispatch_bf16",
            Some(TuningOf::Dispatch(_)) => "deepep.best.dispatch_fp8",
            _ => "deepep.best.combine",
        };
        measurements.insert(key.into(), t.to_json("best", where_(*loc)));
    }
    if !parsed.layout_ms.is_empty() {
        measurements.insert("deepep.layout_ms_mean".into(), json!(mean(&parsed.layout_ms)));
    }
}

/// `[0, 1, 2, 5, 7, 8]` → `"0-2, 5, 7-8"`.
fn ranges(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if i == j { ranks[i].to_string() } else { format!("{}-{}", ranks[i], ranks[j]) });
        i = j + 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests;
