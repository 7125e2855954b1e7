//! The Gantt timeline of one simulated op from a Chrome trace: a few processes of each kind
//! and their busiest lanes.

use std::collections::BTreeMap;

use plotters::style::RGBColor;

use super::{ChartSpec, Planned, slug};
use crate::charts::gantt::{Gantt, GanttRow};
use crate::charts::{self, fmt_num};
use crate::inputs::Loaded;
use crate::trace::Trace;

pub(super) fn trace_name(t: &Loaded<Trace>, i: usize) -> String {
    t.doc.scenario.clone().unwrap_or_else(|| {
        t.path
            .file_name()
            .and_then(|n| n.to_str())
            .map(|n| n.trim_end_matches(".json").trim_end_matches(".trace").to_string())
            .unwrap_or_else(|| format!("trace{i}"))
    })
}

const MAX_CATEGORIES: usize = 8;
/// Processes shown per kind (GPU, NIC, leaf, spine, ...): a simulated cluster has thousands of
/// busy lanes, and the first few of each kind already show what every one does.
const PROCESSES_PER_KIND: usize = 2;
/// Lanes shown per process, the busiest in the window (a NIC has one per QP).
const LANES_PER_PROCESS: usize = 4;

/// The kind of a trace process: its name without numbers and parentheses
/// ("GPU 3" → "GPU", "leaf2 (rail 2)" → "leaf").
fn process_kind(name: &str) -> String {
    let head = name.split('(').next().unwrap_or(name);
    head.chars().filter(|c| !c.is_ascii_digit()).collect::<String>().trim().to_string()
}

/// The colour class of a span: its `cat`, else the first word of its name ("copy to GPU 3"
/// → "copy", "dispatch (job 0, iteration 0)" → "dispatch").
fn span_category(s: &crate::trace::Span) -> String {
    if !s.cat.is_empty() {
        return s.cat.clone();
    }
    s.name.split_whitespace().next().unwrap_or("").to_string()
}

pub(super) fn timeline(t: &Loaded<Trace>, i: usize) -> Result<Planned, String> {
    let name = trace_name(t, i);
    let trace = &t.doc;
    let (window, what, since) = match trace.first_dispatch_window() {
        Some(w) => (w, "one simulated dispatch", "the dispatch started"),
        None => match trace.extent() {
            Some(w) => (w, "the whole trace (no dispatch span found)", "the trace started"),
            None => {
                return Err(format!(
                    "{}: the trace has no complete (\"X\") events",
                    t.path.display()
                ));
            }
        },
    };
    let (w0, w1) = window;
    let visible = |s: &crate::trace::Span| {
        s.end_us() > w0 && s.start_us < w1
            || (s.dur_us == 0.0 && s.start_us >= w0 && s.start_us <= w1)
    };
    let busy_in = |spans: &[crate::trace::Span]| -> f64 {
        spans.iter().filter(|s| visible(s)).map(|s| s.end_us().min(w1) - s.start_us.max(w0)).sum()
    };
    // Lanes: the first processes of each kind, each with its busiest lanes, in trace order.
    let busy_lanes: Vec<&crate::trace::Lane> =
        trace.lanes.iter().filter(|l| l.spans.iter().any(&visible)).collect();
    let total = busy_lanes.len();
    let mut processes: Vec<(&str, Vec<&crate::trace::Lane>)> = Vec::new();
    for lane in &busy_lanes {
        match processes.iter_mut().find(|p| p.0 == lane.process) {
            Some(p) => p.1.push(lane),
            None => processes.push((&lane.process, vec![lane])),
        }
    }
    let mut kinds: Vec<(String, usize, usize)> = Vec::new(); // (kind, shown, present)
    let mut lanes: Vec<&crate::trace::Lane> = Vec::new();
    for (process, mut list) in processes {
        let kind = process_kind(process);
        let entry = match kinds.iter().position(|k| k.0 == kind) {
            Some(i) => &mut kinds[i],
            None => {
                kinds.push((kind, 0, 0));
                kinds.last_mut().expect("just pushed")
            }
        };
        entry.2 += 1;
        if entry.1 >= PROCESSES_PER_KIND {
            continue;
        }
        entry.1 += 1;
        if list.len() > LANES_PER_PROCESS {
            let mut by_busy = list.clone();
            by_busy.sort_by(|a, b| busy_in(&b.spans).total_cmp(&busy_in(&a.spans)));
            by_busy.truncate(LANES_PER_PROCESS);
            list.retain(|l| by_busy.iter().any(|b| std::ptr::eq(*b, *l)));
        }
        lanes.extend(list);
    }
    // Categories by busy time inside the shown lanes; the rest become "other".
    let mut busy: BTreeMap<String, f64> = BTreeMap::new();
    for s in lanes.iter().flat_map(|l| &l.spans).filter(|s| visible(s)) {
        *busy.entry(span_category(s)).or_default() += s.end_us().min(w1) - s.start_us.max(w0);
    }
    let mut cats: Vec<(String, f64)> = busy.into_iter().collect();
    cats.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut categories: Vec<(String, RGBColor)> = cats
        .iter()
        .take(MAX_CATEGORIES)
        .enumerate()
        .map(|(i, (c, _))| (c.clone(), charts::palette(i)))
        .collect();
    let other = (cats.len() > MAX_CATEGORIES).then(|| {
        categories.push(("other".into(), RGBColor(170, 170, 170)));
        categories.len() - 1
    });
    let rows: Vec<GanttRow> = lanes
        .iter()
        .map(|l| GanttRow {
            label: l.label(),
            boxes: l
                .spans
                .iter()
                .filter(|s| visible(s))
                .map(|s| {
                    let cat = span_category(s);
                    let idx = categories.iter().position(|c| c.0 == cat).or(other).unwrap_or(0);
                    (s.start_us.max(w0) - w0, s.end_us().min(w1) - w0, idx)
                })
                .collect(),
        })
        .collect();
    let shown = if rows.len() < total {
        let per_kind: Vec<String> = kinds
            .iter()
            .map(|(k, shown, present)| {
                if shown == present {
                    format!("{present} {k}")
                } else {
                    format!("{shown} of {present} {k}")
                }
            })
            .collect();
        format!(
            "{} of {total} busy lanes ({}; at most {LANES_PER_PROCESS} busiest lanes each)",
            rows.len(),
            per_kind.join(", ")
        )
    } else {
        format!("{total} busy lanes")
    };
    let first = trace
        .lanes
        .iter()
        .flat_map(|l| &l.spans)
        .filter(|s| s.start_us == w0 && s.name.to_ascii_lowercase().contains("dispatch"))
        .map(|s| format!("{:?}, ", s.name))
        .next()
        .unwrap_or_default();
    Ok(Planned {
        id: format!("timeline-{}", slug(&name)),
        caption: format!(
            "Gantt timeline of {what} of {name} from the simulator's trace ({}): one row per \
             GPU, NIC and link lane, one box per busy interval, coloured by category.",
            t.path.display()
        ),
        spec: ChartSpec::Gantt(Gantt {
            title: format!("Timeline of {what}: {name}"),
            subtitle: format!(
                "{first}{shown}; from {} µs of the trace; boxes are busy intervals by category.",
                fmt_num(w0)
            ),
            x_desc: format!("time since {since} (µs)"),
            x_range: (0.0, w1 - w0),
            categories,
            rows,
        }),
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn trace(events: serde_json::Value) -> Loaded<Trace> {
        let doc = Trace::from_value(&serde_json::json!({ "traceEvents": events })).unwrap();
        Loaded { path: PathBuf::from("x/run.trace.json"), doc }
    }

    #[test]
    fn timeline_without_a_dispatch_shows_the_whole_trace() {
        let t = trace(serde_json::json!([
            {"ph": "X", "name": "packet", "cat": "rdma", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0},
            {"ph": "X", "name": "packet", "cat": "rdma", "pid": 2, "tid": 1, "ts": 30.0, "dur": 5.0}
        ]));
        let planned = timeline(&t, 0).unwrap();
        assert_eq!(planned.id, "timeline-run");
        let ChartSpec::Gantt(g) = planned.spec else { panic!("a Gantt chart") };
        assert!(g.title.contains("the whole trace"), "{}", g.title);
        assert_eq!(g.x_desc, "time since the trace started (µs)");
        assert_eq!(g.x_range, (0.0, 25.0));
        assert_eq!(g.rows.len(), 2);
        let empty = trace(serde_json::json!([{"ph": "C", "name": "c", "pid": 1, "ts": 0}]));
        assert!(timeline(&empty, 0).unwrap_err().contains("no complete"));
    }

    #[test]
    fn process_kinds_and_span_categories() {
        assert_eq!(process_kind("GPU 13"), "GPU");
        assert_eq!(process_kind("leaf2 (rail 2)"), "leaf");
        assert_eq!(process_kind("spine0"), "spine");
        let span = |name: &str, cat: &str| crate::trace::Span {
            name: name.into(),
            cat: cat.into(),
            start_us: 0.0,
            dur_us: 1.0,
        };
        assert_eq!(span_category(&span("copy to GPU 3", "")), "copy");
        assert_eq!(span_category(&span("dispatch (job 0, iteration 0)", "")), "dispatch");
        assert_eq!(span_category(&span("copy to GPU 3", "nvlink")), "nvlink");
    }

    #[test]
    fn timeline_shows_a_few_processes_of_each_kind_and_their_busiest_lanes() {
        let mut events = vec![serde_json::json!(
            {"ph": "X", "name": "dispatch", "pid": 1, "tid": 0, "ts": 0.0, "dur": 100.0})];
        for gpu in 1..=5 {
            events.push(serde_json::json!(
                {"ph": "M", "name": "process_name", "pid": gpu, "args": {"name": format!("GPU {gpu}")}}));
            events.push(serde_json::json!(
                {"ph": "X", "name": "copy", "pid": gpu, "tid": 1, "ts": 1.0, "dur": 5.0}));
        }
        events.push(serde_json::json!(
            {"ph": "M", "name": "process_name", "pid": 100, "args": {"name": "NIC 0"}}));
        for qp in 0..10 {
            events.push(serde_json::json!(
                {"ph": "X", "name": "write", "pid": 100, "tid": qp, "ts": 1.0, "dur": qp as f64}));
        }
        let ChartSpec::Gantt(g) =
            timeline(&trace(serde_json::Value::Array(events)), 0).unwrap().spec
        else {
            panic!()
        };
        let labels: Vec<&str> = g.rows.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "GPU 1",
                "GPU 1 · tid 1",
                "GPU 2 · tid 1",
                "NIC 0 · tid 6",
                "NIC 0 · tid 7",
                "NIC 0 · tid 8",
                "NIC 0 · tid 9"
            ]
        );
        assert!(g.subtitle.contains("7 of 16 busy lanes (2 of 5 GPU, 1 NIC"), "{}", g.subtitle);
    }

    #[test]
    fn timeline_clips_to_the_first_dispatch() {
        let t = trace(serde_json::json!([
            {"ph": "X", "name": "dispatch", "cat": "kernel", "pid": 1, "tid": 1, "ts": 100.0, "dur": 50.0},
            {"ph": "X", "name": "write", "cat": "rdma", "pid": 2, "tid": 1, "ts": 140.0, "dur": 20.0},
            {"ph": "X", "name": "combine", "cat": "kernel", "pid": 1, "tid": 1, "ts": 200.0, "dur": 50.0}
        ]));
        let ChartSpec::Gantt(g) = timeline(&t, 0).unwrap().spec else { panic!() };
        assert_eq!(g.x_range, (0.0, 50.0));
        // The write is cut at the window's end; the combine is outside it.
        assert_eq!(g.rows[1].boxes, [(40.0, 50.0, 1)]);
        assert_eq!(g.rows[0].boxes.len(), 1);
    }
}
