//! DeepEP V1's printed lines read back: the low-latency script's per-rank lines, the normal
//! scripts' tuning and Best lines, `[testing] ... passed` checks, `[config]` and `[layout]`
//! lines, launch markers and Python tracebacks, from every node's log (ranks interleaved in
//! any order) into one [`Parsed`] record. docs/deepep-replay.md lists the line kinds.

use std::collections::BTreeMap;

use eptwin_engine::scenario::schema::Dtype;
use serde_json::{Value, json};

use super::LogText;
use crate::error::ReplayError;
use crate::launch::Marker;
use crate::script::Script;

/// Where a line is: index into the logs and 1-based line number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Loc {
    pub(super) log: usize,
    pub(super) line: usize,
}

/// A low-latency per-rank line (`[rank R] ...`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum RankLine {
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

pub(super) const BOTH_LINE: &str = "Dispatch + combine bandwidth";
pub(super) const KERNELS_LINE: &str = "Dispatch bandwidth | Combine bandwidth";
pub(super) const HOOK_LINE: &str = "send/recv time";

impl RankLine {
    pub(super) fn kind(&self) -> &'static str {
        match self {
            RankLine::Both { .. } => BOTH_LINE,
            RankLine::Kernels { .. } => KERNELS_LINE,
            RankLine::Hook { .. } => HOOK_LINE,
        }
    }
}

/// Which op and data type a Best line (and the tuning lines before it) belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TuningOf {
    Dispatch(Dtype),
    Combine,
}

/// A normal script's `[tuning]` line: one configuration's time, or the Best of a sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Tuning {
    pub(super) best: Option<TuningOf>,
    pub(super) sms: u32,
    /// `None` for "default".
    pub(super) nvl_chunk: Option<u32>,
    /// test_internode.py only.
    pub(super) rdma_chunk: Option<u32>,
    pub(super) notify_us: Option<f64>,
    pub(super) t_us: f64,
    pub(super) rdma_gbps: Option<f64>,
    pub(super) nvl_gbps: f64,
}

impl Tuning {
    pub(super) fn script(&self) -> Script {
        if self.rdma_chunk.is_some() { Script::Internode } else { Script::Intranode }
    }

    pub(super) fn describe(&self) -> String {
        let nvl = self.nvl_chunk.map_or("default".to_string(), |c| c.to_string());
        match self.rdma_chunk {
            Some(r) => format!("SMs {}, NVL chunk {nvl}, RDMA chunk {r}", self.sms),
            None => format!("SMs {}, NVL chunk {nvl}", self.sms),
        }
    }

    pub(super) fn to_json(self, source: &str, at: String) -> Value {
        json!({
            "source": source, "at": at, "sms": self.sms, "nvl_chunk": self.nvl_chunk,
            "rdma_chunk": self.rdma_chunk, "notify_us": self.notify_us, "t_us": self.t_us,
            "rdma_gbps": self.rdma_gbps, "nvl_gbps": self.nvl_gbps,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Line {
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
pub(super) struct Cursor<'a> {
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

pub(super) const TRACEBACK: &str = "Traceback (most recent call last)";

/// Strip what launchers put in front of a line: `srun --label`'s `12: `.
pub(super) fn strip_label(line: &str) -> &str {
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
pub(super) fn parse_line(raw: &str) -> Result<Line, String> {
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
pub(super) fn parse_rank_body(body: &str) -> Option<Option<RankLine>> {
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

pub(super) fn parse_tuning(body: &str) -> Option<Tuning> {
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
pub(super) struct Parsed {
    pub(super) markers: Vec<(Loc, Marker)>,
    pub(super) ranks: BTreeMap<(u32, &'static str), (Loc, RankLine)>,
    /// Tuning lines with the Best line that closed their block (`None`: cut short).
    pub(super) tuning: Vec<(Loc, Tuning, Option<TuningOf>)>,
    pub(super) best: Vec<(Loc, Tuning)>,
    pub(super) passed: Vec<String>,
    pub(super) configs: Vec<(Loc, Vec<(String, String)>)>,
    pub(super) layout_ms: Vec<f64>,
    pub(super) failures: Vec<String>,
    /// Failed checks and tracebacks (the documents' `wrong`).
    pub(super) wrong: u32,
}

pub(super) fn parse_logs(
    logs: &[LogText<'_>],
    where_: &dyn Fn(Loc) -> String,
) -> Result<Parsed, ReplayError> {
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
                        return Err(ReplayError::Log {
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
