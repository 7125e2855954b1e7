//! Chrome trace-event JSON (what `eptwin run --trace FILE` writes; Perfetto opens it too), read
//! into lanes for the timeline chart.
//!
//! Read: `"M"` metadata events `process_name`, `thread_name`, `process_sort_index`,
//! `thread_sort_index`; `"X"` complete events with `ts` and `dur` in microseconds. Counters
//! (`"C"`) and instant events are counted but not drawn.

use std::collections::BTreeMap;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// `otherData.scenario` (or `metadata.scenario`) when the writer recorded it.
    pub scenario: Option<String>,
    /// In display order: by process sort index, process id, thread sort index, thread id.
    pub lanes: Vec<Lane>,
    /// Events of kinds the timeline does not draw (counters, instants, ...).
    pub undrawn_events: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Lane {
    /// Process name (a GPU, a NIC, a link, a switch), or `pid N`.
    pub process: String,
    /// Thread name inside the process (an SM group, a QP, a direction), or `tid N`.
    pub thread: String,
    pub spans: Vec<Span>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub name: String,
    pub cat: String,
    pub start_us: f64,
    pub dur_us: f64,
}

impl Span {
    pub fn end_us(&self) -> f64 {
        self.start_us + self.dur_us
    }
}

impl Lane {
    pub fn label(&self) -> String {
        if self.thread.is_empty() {
            self.process.clone()
        } else {
            format!("{} · {}", self.process, self.thread)
        }
    }
}

/// A key that orders ids written as numbers or strings (both are legal in the format).
fn id_key(v: Option<&Value>) -> (i64, String) {
    match v {
        Some(Value::Number(n)) => (n.as_i64().unwrap_or(0), String::new()),
        Some(Value::String(s)) => (s.parse().unwrap_or(i64::MAX), s.clone()),
        _ => (0, String::new()),
    }
}

fn id_text(key: &(i64, String)) -> String {
    if key.1.is_empty() { key.0.to_string() } else { key.1.clone() }
}

type LaneKey = ((i64, String), (i64, String));
/// Display order of a lane: process sort index, pid, thread sort index, tid, then the text ids.
type LaneOrder = (i64, i64, i64, i64, String, String);

impl Trace {
    pub fn from_value(value: &Value) -> Result<Trace, String> {
        let events = value
            .get("traceEvents")
            .and_then(Value::as_array)
            .ok_or("a Chrome trace needs a \"traceEvents\" array")?;
        let scenario = ["otherData", "metadata"]
            .iter()
            .find_map(|k| value.get(*k)?.get("scenario")?.as_str())
            .map(str::to_string);
        let mut process_names: BTreeMap<(i64, String), String> = BTreeMap::new();
        let mut process_sort: BTreeMap<(i64, String), i64> = BTreeMap::new();
        let mut thread_names: BTreeMap<LaneKey, String> = BTreeMap::new();
        let mut thread_sort: BTreeMap<LaneKey, i64> = BTreeMap::new();
        let mut spans: BTreeMap<LaneKey, Vec<Span>> = BTreeMap::new();
        let mut undrawn_events = 0;
        for (i, e) in events.iter().enumerate() {
            let ph = e.get("ph").and_then(Value::as_str).unwrap_or("");
            let pid = id_key(e.get("pid"));
            let tid = id_key(e.get("tid"));
            let arg = |name: &str| e.get("args").and_then(|a| a.get(name)).cloned();
            match ph {
                "M" => {
                    let name = e.get("name").and_then(Value::as_str).unwrap_or("");
                    match name {
                        "process_name" => {
                            if let Some(Value::String(s)) = arg("name") {
                                process_names.insert(pid, s);
                            }
                        }
                        "thread_name" => {
                            if let Some(Value::String(s)) = arg("name") {
                                thread_names.insert((pid, tid), s);
                            }
                        }
                        "process_sort_index" => {
                            if let Some(n) = arg("sort_index").and_then(|v| v.as_i64()) {
                                process_sort.insert(pid, n);
                            }
                        }
                        "thread_sort_index" => {
                            if let Some(n) = arg("sort_index").and_then(|v| v.as_i64()) {
                                thread_sort.insert((pid, tid), n);
                            }
                        }
                        _ => {}
                    }
                }
                "X" => {
                    let num = |k: &str| e.get(k).and_then(Value::as_f64);
                    let (Some(ts), Some(dur)) = (num("ts"), num("dur")) else {
                        return Err(format!("traceEvents[{i}]: an \"X\" event needs ts and dur"));
                    };
                    let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                    spans.entry((pid, tid)).or_default().push(Span {
                        name: text("name"),
                        cat: text("cat"),
                        start_us: ts,
                        dur_us: dur.max(0.0),
                    });
                }
                _ => undrawn_events += 1,
            }
        }
        let mut keyed: Vec<(LaneOrder, Lane)> = spans
            .into_iter()
            .map(|((pid, tid), mut list)| {
                list.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
                let order = (
                    process_sort.get(&pid).copied().unwrap_or(pid.0),
                    pid.0,
                    thread_sort.get(&(pid.clone(), tid.clone())).copied().unwrap_or(tid.0),
                    tid.0,
                    pid.1.clone(),
                    tid.1.clone(),
                );
                let lane = Lane {
                    process: process_names
                        .get(&pid)
                        .cloned()
                        .unwrap_or_else(|| format!("pid {}", id_text(&pid))),
                    thread: thread_names.get(&(pid.clone(), tid.clone())).cloned().unwrap_or_else(
                        || {
                            if tid.0 == 0 && tid.1.is_empty() {
                                String::new()
                            } else {
                                format!("tid {}", id_text(&tid))
                            }
                        },
                    ),
                    spans: list,
                };
                (order, lane)
            })
            .collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Trace { scenario, lanes: keyed.into_iter().map(|(_, l)| l).collect(), undrawn_events })
    }

    /// The time span of the first simulated dispatch: the earliest span whose name contains
    /// "dispatch", widened by every dispatch span that overlaps it (the same op on the other
    /// GPUs). `None` when the trace has no dispatch spans.
    pub fn first_dispatch_window(&self) -> Option<(f64, f64)> {
        let mut dispatch: Vec<&Span> = self
            .lanes
            .iter()
            .flat_map(|l| &l.spans)
            .filter(|s| s.name.to_ascii_lowercase().contains("dispatch"))
            .collect();
        dispatch.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
        let first = dispatch.first()?;
        let (start, mut end) = (first.start_us, first.end_us());
        for s in &dispatch[1..] {
            if s.start_us > end {
                break;
            }
            end = end.max(s.end_us());
        }
        Some((start, end))
    }

    /// The whole trace's time span.
    pub fn extent(&self) -> Option<(f64, f64)> {
        let spans = self.lanes.iter().flat_map(|l| &l.spans);
        let start = spans.clone().map(|s| s.start_us).min_by(f64::total_cmp)?;
        let end = spans.map(Span::end_us).max_by(f64::total_cmp)?;
        Some((start, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_lanes_in_sort_order_and_the_first_dispatch() {
        let v = json!({
            "otherData": {"scenario": "ep16-ll"},
            "traceEvents": [
                {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "NIC 0"}},
                {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "GPU 0"}},
                {"ph": "M", "name": "thread_name", "pid": 1, "tid": 3, "args": {"name": "send"}},
                {"ph": "X", "name": "rdma write", "cat": "rdma", "pid": 2, "tid": 0, "ts": 5.0, "dur": 2.0},
                {"ph": "X", "name": "dispatch", "cat": "kernel", "pid": 1, "tid": 3, "ts": 1.0, "dur": 10.0},
                {"ph": "X", "name": "dispatch", "cat": "kernel", "pid": 1, "tid": 4, "ts": 9.0, "dur": 4.0},
                {"ph": "X", "name": "dispatch", "cat": "kernel", "pid": 1, "tid": 4, "ts": 30.0, "dur": 4.0},
                {"ph": "C", "name": "credits", "pid": 2, "ts": 1.0, "args": {"vl0": 3}}
            ]
        });
        let t = Trace::from_value(&v).unwrap();
        assert_eq!(t.scenario.as_deref(), Some("ep16-ll"));
        let labels: Vec<String> = t.lanes.iter().map(Lane::label).collect();
        assert_eq!(labels, ["GPU 0 · send", "GPU 0 · tid 4", "NIC 0"]);
        assert_eq!(t.first_dispatch_window(), Some((1.0, 13.0)));
        assert_eq!(t.extent(), Some((1.0, 34.0)));
        assert_eq!(t.undrawn_events, 1);
    }

    #[test]
    fn rejects_complete_events_without_times() {
        let v = json!({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1}]});
        assert!(Trace::from_value(&v).unwrap_err().contains("traceEvents[0]"));
    }
}
