//! From inputs to charts: each chart is built as data first (pure, unit-tested), then drawn.
//! A chart whose inputs are absent is *skipped* with the reason, never drawn empty.
//!
//! One module per chart family: `sim_vs_measured`, `published` (latency and bandwidth against
//! published numbers), `ep_scaling`, `isolation` (VL isolation CDFs), `sweep`, `faults`
//! (latency percentiles against a swept fault value), `timeline`.

mod ep_scaling;
mod faults;
mod isolation;
mod published;
mod sim_vs_measured;
mod sweep;
mod timeline;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::charts::bars::GroupedBars;
use crate::charts::figure::Figure;
use crate::charts::gantt::Gantt;
use crate::charts::{self};
use eptwin_engine::api::{Outputs, write_output};

use crate::compare::pair_all;
pub use crate::describe::natural_key;
use crate::error::ReportError;
pub use crate::html::{Skipped, Written};
use crate::inputs::Inputs;
use crate::sweep::SweepIndex;

pub use ep_scaling::ep_family;
use ep_scaling::ep_scaling;
use isolation::isolation_studies;
use published::{Metric, vs_published};
use sim_vs_measured::sim_vs_measured;
pub use sweep::short_key;
use sweep::sweep_chart;
use timeline::{timeline, trace_name};

/// A chart ready to draw.
#[derive(Debug, Clone, PartialEq)]
pub enum ChartSpec {
    Bars(GroupedBars),
    Figure(Figure),
    Gantt(Gantt),
}

impl ChartSpec {
    fn title(&self) -> &str {
        match self {
            ChartSpec::Bars(c) => &c.title,
            ChartSpec::Figure(c) => &c.title,
            ChartSpec::Gantt(c) => &c.title,
        }
    }
}

/// A chart and what it is for.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// File stem (`latency-sim-vs-measured`): the chart's id.
    pub id: String,
    /// What the chart shows, for index.html.
    pub caption: String,
    pub spec: ChartSpec,
}

/// What `build` produced.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReportOutput {
    pub index_html: PathBuf,
    pub charts: Vec<Written>,
    pub skipped: Vec<Skipped>,
    pub ignored: Vec<(PathBuf, String)>,
}

/// Plan every chart the inputs allow.
pub fn plan(inputs: &Inputs) -> (Vec<Planned>, Vec<Skipped>) {
    let mut planned = Vec::new();
    let mut skipped = Vec::new();
    let comparisons = pair_all(&inputs.results);
    let mut take = |id: &str, r: Result<Planned, String>| match r {
        Ok(p) => planned.push(p),
        Err(reason) => skipped.push(Skipped { chart: id.to_string(), reason }),
    };
    take("latency-sim-vs-measured", sim_vs_measured(&comparisons));
    take("latency-vs-published", vs_published(&inputs.results, Metric::Latency));
    take("bandwidth-vs-published", vs_published(&inputs.results, Metric::Bandwidth));
    take("ep-scaling", ep_scaling(&inputs.results));
    let isolation = isolation_studies(&inputs.results);
    if isolation.is_empty() {
        take(
            "vl-isolation-cdf",
            Err("needs results of one study with a job alone and sharing the fabric with \
                 background traffic (scenarios/vl-isolation-*.toml)"
                .into()),
        );
    }
    for p in isolation {
        take(&p.id.clone(), Ok(p));
    }
    let sweeps = SweepIndex::merge(inputs.sweeps.iter().map(|s| s.doc.clone()).collect());
    if sweeps.is_empty() {
        take("sweep", Err("no sweep index given (eptwin sweep writes DIR/index.json)".into()));
    }
    for s in &sweeps {
        let id = format!("sweep-{}", slug(&s.scenario.name));
        take(&id, sweep_chart(s));
        if faults::is_fault_sweep(s) {
            take(&format!("fault-sweep-{}", slug(&s.scenario.name)), faults::fault_sweep_chart(s));
        }
    }
    if inputs.traces.is_empty() {
        take(
            "timeline",
            Err("no simulator trace given (eptwin run SCENARIO --trace FILE writes one)".into()),
        );
    }
    for (i, t) in inputs.traces.iter().enumerate() {
        let id = format!("timeline-{}", slug(&trace_name(t, i)));
        take(&id, timeline(t, i));
    }
    dedup_ids(&mut planned);
    (planned, skipped)
}

/// Plan, draw and write index.html into `out`. Every file it will write is claimed first
/// (engine/src/files.rs: regular files only, none an input), so a path that may not be
/// written fails the report before anything is drawn.
pub fn build(inputs: &Inputs, out: &Path) -> Result<ReportOutput, ReportError> {
    let (planned, skipped) = plan(inputs);
    let index_html = out.join("index.html");
    let mut outputs = Outputs::new();
    for path in inputs.paths() {
        outputs.input(path, &format!("the input {}", path.display()));
    }
    outputs.directory(out, "--out")?;
    outputs.claim(&index_html, "the report's index.html")?;
    let files: Vec<(PathBuf, PathBuf)> = planned
        .iter()
        .map(|p| (out.join(format!("{}.png", p.id)), out.join(format!("{}.svg", p.id))))
        .collect();
    for (p, (png, svg)) in planned.iter().zip(&files) {
        outputs.claim(png, &format!("chart {}", p.id))?;
        outputs.claim(svg, &format!("chart {}", p.id))?;
    }
    let mut charts = Vec::new();
    for (p, (png, svg)) in planned.iter().zip(files) {
        let (drawn, (width, height)) = match &p.spec {
            ChartSpec::Bars(c) => draw(c, &p.id, &png, &svg)?,
            ChartSpec::Figure(c) => draw(c, &p.id, &png, &svg)?,
            ChartSpec::Gantt(c) => draw(c, &p.id, &png, &svg)?,
        };
        write_output(&png, &drawn.png)?;
        write_output(&svg, &drawn.svg)?;
        charts.push(Written {
            id: p.id.clone(),
            title: p.spec.title().to_string(),
            caption: p.caption.clone(),
            png,
            svg,
            width,
            height,
        });
    }
    let comparisons = pair_all(&inputs.results);
    let html = crate::html::index(inputs, &comparisons, &charts, &skipped, out);
    write_output(&index_html, html.as_bytes())?;
    Ok(ReportOutput { index_html, charts, skipped, ignored: inputs.ignored.clone() })
}

fn draw(
    chart: &impl charts::Chart,
    id: &str,
    png: &Path,
    svg: &Path,
) -> Result<(charts::Drawn, (u32, u32)), ReportError> {
    Ok((charts::render(chart, id, png, svg)?, chart.size()))
}

fn dedup_ids(planned: &mut [Planned]) {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for p in planned.iter_mut() {
        let n = seen.entry(p.id.clone()).or_default();
        *n += 1;
        if *n > 1 {
            p.id = format!("{}-{}", p.id, n);
        }
    }
}

/// A file-name-safe version of a name.
pub fn slug(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' })
        .collect()
}

/// "a, b and c", or "N scenarios" when the list is long (titles must stay readable).
fn name_list(names: &[String]) -> String {
    match names.len() {
        0 => String::new(),
        1..=4 => names.join(", "),
        n => format!("{n} scenarios"),
    }
}

/// Ops in the order a MoE layer runs them.
fn op_rank(op: &str) -> (usize, String) {
    let known = ["dispatch", "combine", "transfer", "barrier"];
    (known.iter().position(|k| *k == op).unwrap_or(known.len()), op.to_string())
}

fn unique(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order() {
        let mut names = vec!["ep64-ll", "ep8-ll", "ep16-ll", "ep16-ll-pure-rdma"];
        names.sort_by_key(|n| natural_key(n));
        assert_eq!(names, ["ep8-ll", "ep16-ll", "ep16-ll-pure-rdma", "ep64-ll"]);
    }
}
