//! From inputs to charts: each chart is built as data first (pure, unit-tested), then drawn.
//! A chart whose inputs are absent is *skipped* with the reason, never drawn empty.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use eptwin_engine::result::{JobResult, RunResult, is_measured_kind};
use plotters::style::RGBColor;

use crate::charts::bars::{BarRow, BarSeries, GroupedBars};
use crate::charts::figure::{Figure, Panel, SeriesStyle, Ticks, XySeries};
use crate::charts::gantt::{Gantt, GanttRow};
use crate::charts::{self, LegendEntry, Mark, Shape, fmt_num, fmt_pct};
use crate::compare::{Comparison, pair_all};
use crate::describe;
use crate::error::ReportError;
use crate::inputs::{Inputs, Loaded};
use crate::sweep::SweepIndex;
use crate::trace::Trace;

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

/// A chart the report did not draw, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    pub chart: String,
    pub reason: String,
}

/// A drawn chart.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Written {
    pub id: String,
    pub title: String,
    pub caption: String,
    pub png: PathBuf,
    pub svg: PathBuf,
    pub width: u32,
    pub height: u32,
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

/// Plan, draw and write index.html into `out`.
pub fn build(inputs: &Inputs, out: &Path) -> Result<ReportOutput, ReportError> {
    std::fs::create_dir_all(out).map_err(|source| ReportError::Io { path: out.into(), source })?;
    let (planned, skipped) = plan(inputs);
    let mut charts = Vec::new();
    for p in &planned {
        let (png, svg, (width, height)) = match &p.spec {
            ChartSpec::Bars(c) => draw(c, out, &p.id)?,
            ChartSpec::Figure(c) => draw(c, out, &p.id)?,
            ChartSpec::Gantt(c) => draw(c, out, &p.id)?,
        };
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
    let index_html = out.join("index.html");
    eptwin_engine::result::write_atomic(&index_html, &html).map_err(|e| ReportError::Io {
        path: index_html.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(ReportOutput { index_html, charts, skipped, ignored: inputs.ignored.clone() })
}

fn draw(
    chart: &impl charts::Chart,
    out: &Path,
    id: &str,
) -> Result<(PathBuf, PathBuf, (u32, u32)), ReportError> {
    let (png, svg) = charts::render(chart, out, id)?;
    Ok((png, svg, chart.size()))
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

/// Sort key that orders `ep8` before `ep16` (digit runs compare as numbers).
pub fn natural_key(text: &str) -> Vec<(u64, String)> {
    let mut key = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        let digit = c.is_ascii_digit();
        let mut run = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_digit() != digit {
                break;
            }
            run.push(c);
            chars.next();
        }
        key.push(if digit { (run.parse().unwrap_or(u64::MAX), String::new()) } else { (0, run) });
    }
    key
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

// ---------------------------------------------------------------------------------------------
// Simulated vs measured

fn sim_vs_measured(comparisons: &[Comparison]) -> Result<Planned, String> {
    let mut rows = Vec::new();
    let mut scenarios = Vec::new();
    let mut sims = Vec::new();
    let mut hws = Vec::new();
    let mut any_dagger = false;
    let mut ordered: Vec<&Comparison> = comparisons.iter().collect();
    ordered.sort_by_key(|c| natural_key(&c.scenario));
    for c in ordered {
        let multi_job = c.rows.iter().map(|r| &r.job).collect::<BTreeSet<_>>().len() > 1;
        for r in &c.rows {
            let (Some(s), Some(m)) = (&r.simulated, &r.measured) else { continue };
            scenarios.push(c.scenario.clone());
            sims.extend(c.simulated.as_ref().map(|s| s.hardware.clone()));
            hws.extend(c.measured.as_ref().map(|s| s.hardware.clone()));
            let label = if multi_job {
                format!("{} · {} · {}", c.scenario, r.job, r.op)
            } else {
                format!("{} · {}", c.scenario, r.op)
            };
            let mark = if c.same_scenario_text { "" } else { " †" };
            any_dagger |= !c.same_scenario_text;
            rows.push(BarRow {
                label: format!("{label}{mark}"),
                values: vec![Some(s.latency_us_mean), Some(m.latency_us_mean)],
                whiskers: vec![
                    Some((s.latency_us_min, s.latency_us_p99)),
                    Some((m.latency_us_min, m.latency_us_p99)),
                ],
                note: r.latency_error_pct.map(fmt_pct),
                alert: false,
            });
        }
    }
    if rows.is_empty() {
        return Err(
            "needs a simulator result and a measured (hw or deepep) result of the same scenario"
                .into(),
        );
    }
    let scenarios = unique(scenarios);
    let sims = unique(sims);
    let hws = unique(hws);
    let bars = GroupedBars {
        title: format!("Simulated vs measured latency: {}", name_list(&scenarios)),
        subtitle: format!(
            "Bars: mean latency per op; whiskers: min to p99 of the timed iterations; label: \
             (simulated − measured) / measured.{}",
            if any_dagger { " † the two results ran different scenario texts." } else { "" }
        ),
        x_desc: "latency (µs)".into(),
        series: vec![
            BarSeries { label: format!("simulator ({})", sims.join("; ")), color: charts::SIM },
            BarSeries { label: format!("measured ({})", hws.join("; ")), color: charts::MEASURED },
        ],
        rows,
    };
    Ok(Planned {
        id: "latency-sim-vs-measured".into(),
        caption: "Simulated against measured mean latency for every scenario and op that has \
                  both a simulator and a hardware result; the label is the simulator's error."
            .into(),
        spec: ChartSpec::Bars(bars),
    })
}

// ---------------------------------------------------------------------------------------------
// Against published numbers

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    Latency,
    Bandwidth,
}

fn vs_published(results: &[Loaded<RunResult>], metric: Metric) -> Result<Planned, String> {
    // (scenario, job, op) -> (sim value, measured value, published, sim error, meas error, tol, source)
    struct Row {
        key: (String, String, String),
        multi_job: bool,
        sim: Option<(f64, Option<f64>, bool)>,
        meas: Option<(f64, Option<f64>, bool)>,
        published: f64,
        tolerance_pct: f64,
        source: String,
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut hw_names = Vec::new();
    let mut sim_names = Vec::new();
    for r in results {
        let doc = &r.doc;
        let kind = doc.backend_kind();
        for job in &doc.jobs {
            for op in &job.ops {
                let Some(reference) = &op.reference else { continue };
                // The bandwidth chart holds the references that publish no latency.
                let (published, value) = match metric {
                    Metric::Latency => match reference.latency_us {
                        Some(l) => (l, op.summary.latency_us.mean),
                        None => continue,
                    },
                    Metric::Bandwidth => match (reference.latency_us, reference.logical_bw_gbps) {
                        (None, Some(b)) => (b, op.summary.logical_bw_gbps),
                        _ => continue,
                    },
                };
                let error = (published > 0.0).then(|| (value - published) / published * 100.0);
                let within = error.is_some_and(|e| e.abs() <= reference.tolerance_pct);
                let key = (doc.scenario.name.clone(), job.name.clone(), op.op.clone());
                let idx = match rows.iter().position(|row| row.key == key) {
                    Some(i) => i,
                    None => {
                        rows.push(Row {
                            key,
                            multi_job: doc.jobs.len() > 1,
                            sim: None,
                            meas: None,
                            published,
                            tolerance_pct: reference.tolerance_pct,
                            source: reference.source.clone(),
                        });
                        rows.len() - 1
                    }
                };
                let row = &mut rows[idx];
                match kind {
                    "sim" if row.sim.is_none() => {
                        row.sim = Some((value, error, within));
                        sim_names.push(describe::hardware(doc));
                    }
                    k if is_measured_kind(k) && row.meas.is_none() => {
                        row.meas = Some((value, error, within));
                        hw_names.push(describe::hardware(doc));
                    }
                    _ => {}
                }
            }
        }
    }
    let (id, what, unit) = match metric {
        Metric::Latency => ("latency-vs-published", "latency", "latency (µs)"),
        Metric::Bandwidth => {
            ("bandwidth-vs-published", "logical bandwidth", "logical bandwidth (GB/s)")
        }
    };
    if rows.is_empty() {
        return Err(match metric {
            Metric::Latency => {
                "no result carries a published latency ([job.reference] in the scenario)".into()
            }
            Metric::Bandwidth => "no result carries a published bandwidth without a latency".into(),
        });
    }
    rows.sort_by_key(|r| natural_key(&r.key.0));
    let has_sim = rows.iter().any(|r| r.sim.is_some());
    let has_meas = rows.iter().any(|r| r.meas.is_some());
    let sources = unique(rows.iter().map(|r| r.source.clone()));
    let mut series = Vec::new();
    if has_sim {
        series.push(BarSeries {
            label: format!("simulator ({})", unique(sim_names).join("; ")),
            color: charts::SIM,
        });
    }
    if has_meas {
        series.push(BarSeries {
            label: format!("measured ({})", unique(hw_names).join("; ")),
            color: charts::MEASURED,
        });
    }
    series.push(BarSeries {
        label: if sources.len() == 1 {
            format!("published ({})", sources[0])
        } else {
            "published (sources in the table)".into()
        },
        color: charts::PUBLISHED,
    });
    let bar_rows: Vec<BarRow> = rows
        .iter()
        .map(|r| {
            let mut values = Vec::new();
            let mut notes = Vec::new();
            let mut alert = false;
            if has_sim {
                values.push(r.sim.map(|s| s.0));
                if let Some((_, Some(e), within)) = r.sim {
                    notes.push(format!("sim {}", fmt_pct(e)));
                    alert |= !within;
                }
            }
            if has_meas {
                values.push(r.meas.map(|s| s.0));
                if let Some((_, Some(e), within)) = r.meas {
                    notes.push(format!("meas {}", fmt_pct(e)));
                    alert |= !within;
                }
            }
            values.push(Some(r.published));
            let (scenario, job, op) = &r.key;
            let label = if r.multi_job {
                format!("{scenario} · {job} · {op}")
            } else {
                format!("{scenario} · {op}")
            };
            BarRow {
                label,
                whiskers: vec![None; values.len()],
                values,
                note: Some(format!("{} (±{:.0} %)", notes.join(", "), r.tolerance_pct)),
                alert,
            }
        })
        .collect();
    let scenarios = unique(rows.iter().map(|r| r.key.0.clone()));
    Ok(Planned {
        id: id.into(),
        caption: format!(
            "Mean {what} against the published number each scenario carries \
             ([job.reference]); labels give the error and the scenario's tolerance, red when \
             outside it. Sources: {}.",
            sources.join("; ")
        ),
        spec: ChartSpec::Bars(GroupedBars {
            title: format!("{} vs published: {}", capitalise(what), name_list(&scenarios)),
            subtitle: format!(
                "Bars: mean {what}; label: (value − published) / published, tolerance in \
                 parentheses."
            ),
            x_desc: unit.into(),
            series,
            rows: bar_rows,
        }),
    })
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// EP scaling

/// The scenario family of a name: its `ep<N>` token replaced by `ep*`, and `-intranode` /
/// `-internode` dropped so that normal kernels at EP8 (NVLink only) and EP16+ (RDMA) form one
/// line, as in DeepEP's own table. `None` when the name has no `ep<N>` token.
pub fn ep_family(name: &str) -> Option<String> {
    let mut found = false;
    let parts: Vec<String> = name
        .split('-')
        .filter(|p| *p != "intranode" && *p != "internode")
        .map(|p| {
            let is_ep =
                p.len() > 2 && p.starts_with("ep") && p[2..].chars().all(|c| c.is_ascii_digit());
            if is_ep && !found {
                found = true;
                "ep*".to_string()
            } else {
                p.to_string()
            }
        })
        .collect();
    found.then(|| parts.join("-"))
}

fn log2_ticks(values: &BTreeSet<u32>) -> Ticks {
    Some(values.iter().map(|&v| ((v as f64).log2(), v.to_string())).collect())
}

fn single_deepep_job(r: &RunResult) -> Option<&JobResult> {
    match r.jobs.as_slice() {
        [job] if job.kind != "traffic" => Some(job),
        _ => None,
    }
}

fn ep_scaling(results: &[Loaded<RunResult>]) -> Result<Planned, String> {
    #[derive(Default)]
    struct Group {
        sim: BTreeMap<u32, (f64, f64)>,
        meas: BTreeMap<u32, (f64, f64)>,
        published_latency: BTreeMap<u32, f64>,
        published_bw: BTreeMap<u32, f64>,
        scenarios: Vec<String>,
        sim_hw: Vec<String>,
        meas_hw: Vec<String>,
        sources: Vec<String>,
    }
    let mut groups: BTreeMap<(String, String), Group> = BTreeMap::new();
    for r in results {
        let doc = &r.doc;
        let (Some(family), Some(job)) = (ep_family(&doc.scenario.name), single_deepep_job(doc))
        else {
            continue;
        };
        for op in &job.ops {
            let g = groups.entry((family.clone(), op.op.clone())).or_default();
            let point = (op.summary.latency_us.mean, op.summary.logical_bw_gbps);
            let slot = match doc.backend_kind() {
                "sim" => {
                    g.sim_hw.push(describe::hardware(doc));
                    &mut g.sim
                }
                k if is_measured_kind(k) => {
                    g.meas_hw.push(describe::hardware(doc));
                    &mut g.meas
                }
                _ => continue,
            };
            slot.entry(job.ranks).or_insert(point);
            if let Some(reference) = &op.reference {
                g.sources.push(reference.source.clone());
                if let Some(l) = reference.latency_us {
                    g.published_latency.entry(job.ranks).or_insert(l);
                }
                if let Some(b) = reference.logical_bw_gbps {
                    g.published_bw.entry(job.ranks).or_insert(b);
                }
            }
            g.scenarios.push(doc.scenario.name.clone());
        }
    }
    groups.retain(|_, g| {
        let sizes: BTreeSet<u32> = g
            .sim
            .keys()
            .chain(g.meas.keys())
            .chain(g.published_latency.keys())
            .chain(g.published_bw.keys())
            .copied()
            .collect();
        sizes.len() >= 2
    });
    if groups.is_empty() {
        return Err("needs results of one scenario family (names ep<N>-…, one DeepEP job) at two \
                    or more EP sizes"
            .into());
    }
    // Colour = op (the same in every family), shape = source; one row of panels per family.
    let mut ops = unique(groups.keys().map(|k| k.1.clone()));
    ops.sort_by_key(|op| op_rank(op));
    let families = unique(groups.keys().map(|k| k.0.clone()));
    let op_color = |op: &str| charts::palette(ops.iter().position(|o| o == op).unwrap_or(0) * 2);
    let mut legend: Vec<LegendEntry> =
        ops.iter().map(|op| LegendEntry::new(op.clone(), Mark::Line(op_color(op)))).collect();
    let (mut any_meas, mut any_published) = (false, false);
    let (mut sim_hw, mut meas_hw, mut sources, mut scenarios) = (vec![], vec![], vec![], vec![]);
    let mut panels = Vec::new();
    for family in &families {
        let mut sizes = BTreeSet::new();
        let mut latency = Vec::new();
        let mut bandwidth = Vec::new();
        for ((_, op), g) in groups.iter().filter(|(k, _)| &k.0 == family) {
            let color = op_color(op);
            sim_hw.extend(g.sim_hw.iter().cloned());
            meas_hw.extend(g.meas_hw.iter().cloned());
            sources.extend(g.sources.iter().cloned());
            scenarios.extend(g.scenarios.iter().cloned());
            sizes.extend(
                g.sim
                    .keys()
                    .chain(g.meas.keys())
                    .chain(g.published_latency.keys())
                    .chain(g.published_bw.keys()),
            );
            let x = |ep: u32| (ep as f64).log2();
            let pts = |m: &BTreeMap<u32, (f64, f64)>, lat: bool| -> Vec<(f64, f64)> {
                m.iter().map(|(&ep, &(l, b))| (x(ep), if lat { l } else { b })).collect()
            };
            for (panel, lat) in [(&mut latency, true), (&mut bandwidth, false)] {
                if !g.sim.is_empty() {
                    panel.push(XySeries {
                        color,
                        style: SeriesStyle::LineMarkers(Shape::Circle),
                        points: pts(&g.sim, lat),
                    });
                }
                if !g.meas.is_empty() {
                    any_meas = true;
                    panel.push(XySeries {
                        color,
                        style: SeriesStyle::Markers(Shape::Triangle),
                        points: pts(&g.meas, lat),
                    });
                }
                let published = if lat { &g.published_latency } else { &g.published_bw };
                if !published.is_empty() {
                    any_published = true;
                    panel.push(XySeries {
                        color,
                        style: SeriesStyle::Markers(Shape::Cross),
                        points: published.iter().map(|(&ep, &v)| (x(ep), v)).collect(),
                    });
                }
            }
        }
        let ticks = log2_ticks(&sizes);
        panels.push(Panel {
            x_desc: "EP size (ranks)".into(),
            y_desc: "mean latency (µs)".into(),
            x_ticks: ticks.clone(),
            y_range: None,
            caption: format!("{family}: latency"),
            series: latency,
        });
        panels.push(Panel {
            x_desc: "EP size (ranks)".into(),
            y_desc: "logical bandwidth (GB/s)".into(),
            x_ticks: ticks,
            y_range: None,
            caption: format!("{family}: bandwidth"),
            series: bandwidth,
        });
    }
    let grey = charts::PUBLISHED;
    let sim_hw = unique(sim_hw);
    if !sim_hw.is_empty() {
        legend.push(LegendEntry::new(
            format!("line + ●: simulator ({})", sim_hw.join("; ")),
            Mark::LineMarker(grey, Shape::Circle),
        ));
    }
    if any_meas {
        legend.push(LegendEntry::new(
            format!("▲: measured ({})", unique(meas_hw).join("; ")),
            Mark::Marker(grey, Shape::Triangle),
        ));
    }
    let sources = unique(sources);
    if any_published {
        legend.push(LegendEntry::new(
            format!("✕: published ({})", sources.join("; ")),
            Mark::Marker(grey, Shape::Cross),
        ));
    }
    let scenarios = unique(scenarios);
    Ok(Planned {
        id: "ep-scaling".into(),
        caption: format!(
            "Mean latency and DeepEP's logical bandwidth against the EP size (ranks), one row \
             per scenario family (the scenario name with its EP size taken out); lines are the \
             simulator, triangles measurements, crosses published numbers. Scenarios: {}.",
            scenarios.join(", ")
        ),
        spec: ChartSpec::Figure(Figure {
            title: format!("Latency and bandwidth vs EP size: {}", families.join(", ")),
            subtitle: "EP size on a log2 axis. Bandwidth is DeepEP's logical bandwidth (the \
                       bytes its tests count ÷ mean latency), not a link rate."
                .into(),
            legend,
            panels,
            columns: 2,
            panel_height: 420,
        }),
    })
}

// ---------------------------------------------------------------------------------------------
// VL isolation

/// How a job shares the fabric in a result: alone, on the same VL as background traffic, or on
/// its own VL. Sort order = chart order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Sharing {
    Alone,
    Shared,
    Own,
}

fn lane(job: &JobResult) -> String {
    match job.vl {
        Some(vl) => format!("SL{} → VL{vl}", job.sl),
        None => format!("SL{} (no VL)", job.sl),
    }
}

fn sharing(r: &RunResult, victim: &JobResult) -> (Sharing, String) {
    let others: Vec<&JobResult> = r.jobs.iter().filter(|j| j.name != victim.name).collect();
    if others.is_empty() {
        return (Sharing::Alone, format!("alone ({})", lane(victim)));
    }
    let names = others.iter().map(|j| j.name.as_str()).collect::<Vec<_>>().join(", ");
    // Same VL where VLs exist (InfiniBand); same SL (= Ethernet priority) on RoCE.
    let same = others.iter().any(|j| match (j.vl, victim.vl) {
        (Some(a), Some(b)) => a == b,
        _ => j.sl == victim.sl,
    });
    if same {
        (Sharing::Shared, format!("shared with {names} ({})", lane(victim)))
    } else {
        let theirs = others.iter().map(|j| lane(j)).collect::<Vec<_>>().join(", ");
        (Sharing::Own, format!("own lane ({}; {names} on {theirs})", lane(victim)))
    }
}

/// The study a scenario name belongs to: the name without its last `-part`.
fn study_of(name: &str) -> Option<&str> {
    name.rsplit_once('-').map(|(prefix, _)| prefix)
}

fn empirical_cdf(samples: &[f64]) -> Vec<(f64, f64)> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len() as f64;
    let mut points = Vec::with_capacity(sorted.len() * 2);
    for (i, &v) in sorted.iter().enumerate() {
        points.push((v, i as f64 / n));
        points.push((v, (i + 1) as f64 / n));
    }
    points
}

fn isolation_studies(results: &[Loaded<RunResult>]) -> Vec<Planned> {
    let mut studies: BTreeMap<String, Vec<&RunResult>> = BTreeMap::new();
    for r in results {
        if r.doc.jobs.is_empty() {
            continue;
        }
        if let Some(study) = study_of(&r.doc.scenario.name) {
            studies.entry(study.to_string()).or_default().push(&r.doc);
        }
    }
    let mut out = Vec::new();
    for (study, members) in studies {
        let contended = members.iter().any(|r| {
            r.jobs.iter().any(|j| j.kind == "traffic") && r.jobs.iter().any(|j| j.kind != "traffic")
        });
        if members.len() < 2 || !contended {
            continue;
        }
        // The job being protected: the first DeepEP job, by name, present in every member.
        let Some(victim_name) =
            members[0].jobs.iter().find(|j| j.kind != "traffic").map(|j| j.name.clone())
        else {
            continue;
        };
        let mut lines: Vec<(Sharing, String, &RunResult, &JobResult)> = members
            .iter()
            .filter_map(|r| {
                let victim = r.job(&victim_name)?;
                let (kind, label) = sharing(r, victim);
                Some((kind, label, *r, victim))
            })
            .collect();
        lines.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.2.scenario.name.cmp(&b.2.scenario.name)));
        let backends: BTreeSet<&str> = lines.iter().map(|l| l.2.backend_kind()).collect();
        let ops = unique(lines.iter().flat_map(|l| l.3.ops.iter().map(|o| o.op.clone())));
        let mut legend = Vec::new();
        let mut panels: Vec<Panel> = ops
            .iter()
            .map(|op| Panel {
                x_desc: format!("{op} latency (µs)"),
                y_desc: "fraction of iterations".into(),
                x_ticks: None,
                y_range: Some((0.0, 1.02)),
                caption: op.clone(),
                series: Vec::new(),
            })
            .collect();
        let mut used: Vec<RGBColor> = Vec::new();
        for (i, (kind, label, r, victim)) in lines.iter().enumerate() {
            // Grey = the baseline, vermillion = contended, blue = protected; a second line of
            // the same kind (another backend) takes the next palette colour.
            let preferred = match kind {
                Sharing::Alone => charts::PUBLISHED,
                Sharing::Shared => charts::MEASURED,
                Sharing::Own => charts::SIM,
            };
            let color = if used.contains(&preferred) { charts::palette(i + 2) } else { preferred };
            used.push(color);
            let p99s: Vec<String> = victim
                .ops
                .iter()
                .map(|o| format!("{} p99 {} µs", o.op, fmt_num(o.summary.latency_us.p99)))
                .collect();
            let who = if backends.len() > 1 {
                format!("{}: ", describe::backend_word(r))
            } else {
                String::new()
            };
            legend.push(LegendEntry::new(
                format!("{who}{label} [{}]", p99s.join(", ")),
                Mark::Line(color),
            ));
            for (panel, op) in panels.iter_mut().zip(&ops) {
                if let Some(o) = victim.op(op) {
                    let samples: Vec<f64> = o.samples.iter().map(|s| s.latency_us).collect();
                    if !samples.is_empty() {
                        panel.series.push(XySeries {
                            color,
                            style: SeriesStyle::Line,
                            points: empirical_cdf(&samples),
                        });
                    }
                }
            }
        }
        let names: Vec<String> = lines.iter().map(|l| l.2.scenario.name.clone()).collect();
        let hw = unique(lines.iter().map(|l| describe::source_label(l.2)));
        let iterations =
            lines.iter().flat_map(|l| l.3.ops.first()).map(|o| o.samples.len()).max().unwrap_or(0);
        out.push(Planned {
            id: format!("{}-cdf", slug(&study)),
            caption: format!(
                "Latency distribution of job {victim_name:?} across the scenarios of study \
                 {study:?} ({}): alone, sharing a virtual lane with background traffic, and on \
                 its own lane. A curve further right is slower; the gap between the shared and \
                 own-lane curves is what VL arbitration buys.",
                names.join(", ")
            ),
            spec: ChartSpec::Figure(Figure {
                title: format!(
                    "VL isolation: latency CDF of job {victim_name:?}: {}",
                    names.join(", ")
                ),
                subtitle: format!(
                    "Empirical CDF over up to {iterations} timed iterations per scenario; {}.",
                    hw.join("; ")
                ),
                legend,
                columns: panels.len(),
                panels,
                panel_height: 480,
            }),
        });
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Sweeps

/// How the swept values sit on the x axis.
fn sweep_axis(values: &[serde_json::Value]) -> (Vec<f64>, Ticks, bool) {
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let numeric: Option<Vec<f64>> = values
        .iter()
        .map(|v| match v {
            serde_json::Value::Number(n) => n.as_f64(),
            serde_json::Value::String(s) => s
                .parse::<f64>()
                .ok()
                .or_else(|| s.parse::<eptwin_engine::units::ByteSize>().ok().map(|b| b.0 as f64)),
            _ => None,
        })
        .collect();
    match numeric {
        Some(xs)
            if xs.iter().all(|&x| x > 0.0) && {
                let (lo, hi) = (
                    xs.iter().copied().fold(f64::MAX, f64::min),
                    xs.iter().copied().fold(0.0, f64::max),
                );
                hi / lo >= 8.0
            } =>
        {
            let pos: Vec<f64> = xs.iter().map(|x| x.log2()).collect();
            let ticks = pos.iter().zip(values).map(|(&p, v)| (p, text(v))).collect();
            (pos, Some(ticks), true)
        }
        Some(xs) => {
            let ticks = xs.iter().zip(values).map(|(&p, v)| (p, text(v))).collect();
            (xs, Some(ticks), false)
        }
        None => {
            let pos: Vec<f64> = (0..values.len()).map(|i| i as f64).collect();
            let ticks = pos.iter().zip(values).map(|(&p, v)| (p, text(v))).collect();
            (pos, Some(ticks), false)
        }
    }
}

/// The last segment of a key path, for labels (`job.env.NVSHMEM_QP_DEPTH` → `NVSHMEM_QP_DEPTH`).
pub fn short_key(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}

fn sweep_chart(index: &SweepIndex) -> Result<Planned, String> {
    let Some(x_key) = index.keys.first() else {
        return Err(format!("sweep of {} has no keys", index.scenario.name));
    };
    let x_values = index.values.get(x_key).cloned().unwrap_or_default();
    let (positions, ticks, log) = sweep_axis(&x_values);
    let pos_of = |v: &serde_json::Value| x_values.iter().position(|x| x == v).map(|i| positions[i]);
    // One line per (job, op) and combination of the other keys' values, in the order a reader
    // expects: jobs as the scenario lists them, dispatch before combine, values as swept.
    // (job position, op rank, other values' positions) -> (job, op, label, (x, bw, latency)s)
    type LineKey = (usize, (usize, String), Vec<usize>);
    type Line = (String, String, String, Vec<(f64, f64, f64)>);
    let mut lines: BTreeMap<LineKey, Line> = BTreeMap::new();
    let mut jobs: Vec<String> = Vec::new();
    let mut no_result = Vec::new();
    let mut labels = Vec::new();
    for p in &index.points {
        let Some(x) = p.values.get(x_key).and_then(pos_of) else { continue };
        let other_pos: Vec<usize> = index.keys[1..]
            .iter()
            .map(|k| {
                let listed = index.values.get(k).map(Vec::as_slice).unwrap_or_default();
                p.values.get(k).and_then(|v| listed.iter().position(|x| x == v)).unwrap_or(0)
            })
            .collect();
        let others: Vec<String> = index.keys[1..]
            .iter()
            .map(|k| {
                let v = p.values.get(k).map(|v| match v {
                    serde_json::Value::String(s) => s.clone(),
                    o => o.to_string(),
                });
                format!("{}={}", short_key(k), v.unwrap_or_default())
            })
            .collect();
        if p.verdict != "ok" || p.ops.is_empty() {
            no_result.push((
                x,
                format!(
                    "{}={} ({})",
                    short_key(x_key),
                    p.values.get(x_key).map(|v| v.to_string()).unwrap_or_default(),
                    p.verdict
                ),
            ));
            continue;
        }
        for o in &p.ops {
            labels.push(o.logical_bw_label.clone());
            if !jobs.contains(&o.job) {
                jobs.push(o.job.clone());
            }
            let job_pos = jobs.iter().position(|j| j == &o.job).unwrap_or(0);
            lines
                .entry((job_pos, op_rank(&o.op), other_pos.clone()))
                .or_insert_with(|| (o.job.clone(), o.op.clone(), others.join(", "), Vec::new()))
                .3
                .push((x, o.logical_bw_gbps, o.latency_us_mean));
        }
    }
    if lines.is_empty() {
        return Err(format!(
            "sweep of {}: no point has a result ({} points, verdicts: {})",
            index.scenario.name,
            index.points.len(),
            unique(index.points.iter().map(|p| p.verdict.clone())).join(", ")
        ));
    }
    let multi_job = jobs.len() > 1;
    let mut legend = Vec::new();
    let mut bw = Vec::new();
    let mut lat = Vec::new();
    for (i, (job, op, others, pts)) in lines.values_mut().enumerate() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = charts::palette(i);
        let name = if multi_job { format!("{job}/{op}") } else { op.clone() };
        let label = if others.is_empty() { name } else { format!("{name}, {others}") };
        legend.push(LegendEntry::new(label, Mark::LineMarker(color, Shape::Circle)));
        bw.push(XySeries {
            color,
            style: SeriesStyle::LineMarkers(Shape::Circle),
            points: pts.iter().map(|p| (p.0, p.1)).collect(),
        });
        lat.push(XySeries {
            color,
            style: SeriesStyle::LineMarkers(Shape::Circle),
            points: pts.iter().map(|p| (p.0, p.2)).collect(),
        });
    }
    if !no_result.is_empty() {
        let alert = RGBColor(190, 30, 30);
        legend.push(LegendEntry::new(
            "no result at this value (invalid, failed or waived)",
            Mark::Marker(alert, Shape::Cross),
        ));
        for panel in [&mut bw, &mut lat] {
            panel.push(XySeries {
                color: alert,
                style: SeriesStyle::Markers(Shape::Cross),
                points: no_result.iter().map(|n| (n.0, 0.0)).collect(),
            });
        }
    }
    let bw_label = unique(labels.into_iter().filter(|l| !l.is_empty()));
    let bw_desc = if bw_label.is_empty() {
        "throughput: logical bandwidth (GB/s)".to_string()
    } else {
        format!("throughput: logical bandwidth, {} (GB/s)", bw_label.join("/"))
    };
    let x_desc = format!("{}{}", short_key(x_key), if log { " (log2 axis)" } else { "" });
    let present = index.points.len();
    let coverage = if index.missing_points() > 0 {
        format!("{present} of {} grid points present (other shards not given)", index.total_points)
    } else {
        format!("{present} points")
    };
    Ok(Planned {
        id: format!("sweep-{}", slug(&index.scenario.name)),
        caption: format!(
            "Throughput (DeepEP's logical bandwidth) and mean latency of {} against {x_key}, one \
             result per point from the sweep index; {}.",
            index.scenario.name,
            if index.keys.len() > 1 {
                format!("one line per value of {}", index.keys[1..].join(", "))
            } else {
                "one line per op".into()
            }
        ),
        spec: ChartSpec::Figure(Figure {
            title: format!("Sweep of {}: throughput vs {}", index.scenario.name, short_key(x_key)),
            subtitle: format!(
                "{coverage}; backend {}; base scenario {} (sha256 {}…)",
                index.backend,
                index.scenario.file,
                &index.scenario.sha256.get(..12).unwrap_or(&index.scenario.sha256)
            ),
            legend,
            panels: vec![
                Panel {
                    x_desc: x_desc.clone(),
                    y_desc: bw_desc,
                    x_ticks: ticks.clone(),
                    y_range: None,
                    caption: "throughput".into(),
                    series: bw,
                },
                Panel {
                    x_desc,
                    y_desc: "mean latency (µs)".into(),
                    x_ticks: ticks,
                    y_range: None,
                    caption: "latency".into(),
                    series: lat,
                },
            ],
            columns: 2,
            panel_height: 500,
        }),
    })
}

// ---------------------------------------------------------------------------------------------
// Timeline

fn trace_name(t: &Loaded<Trace>, i: usize) -> String {
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

fn timeline(t: &Loaded<Trace>, i: usize) -> Result<Planned, String> {
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
    use super::*;

    #[test]
    fn families_take_the_ep_size_out() {
        assert_eq!(ep_family("ep16-ll").as_deref(), Some("ep*-ll"));
        assert_eq!(ep_family("ep8-normal-intranode").as_deref(), Some("ep*-normal"));
        assert_eq!(ep_family("ep64-normal-internode").as_deref(), Some("ep*-normal"));
        assert_eq!(ep_family("h200-ep8-ll-128").as_deref(), Some("h200-ep*-ll-128"));
        assert_eq!(ep_family("vl-isolation-alone"), None);
        assert_eq!(ep_family("epic-ep"), None);
    }

    #[test]
    fn natural_order() {
        let mut names = vec!["ep64-ll", "ep8-ll", "ep16-ll", "ep16-ll-pure-rdma"];
        names.sort_by_key(|n| natural_key(n));
        assert_eq!(names, ["ep8-ll", "ep16-ll", "ep16-ll-pure-rdma", "ep64-ll"]);
    }

    proptest::proptest! {
        /// The CDF is a staircase over the sorted samples: monotone in both coordinates,
        /// from (min, 0) to (max, 1), with one rise of 1/n per sample.
        #[test]
        fn cdf_is_a_monotone_staircase(samples in proptest::collection::vec(0.0f64..1e6, 1..200)) {
            let cdf = empirical_cdf(&samples);
            let min = samples.iter().copied().fold(f64::MAX, f64::min);
            let max = samples.iter().copied().fold(f64::MIN, f64::max);
            proptest::prop_assert_eq!(cdf.len(), 2 * samples.len());
            proptest::prop_assert_eq!(cdf[0], (min, 0.0));
            proptest::prop_assert_eq!(*cdf.last().unwrap(), (max, 1.0));
            proptest::prop_assert!(cdf.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        }

        /// Digit runs compare as numbers: `eN` sorts by N whatever the widths.
        #[test]
        fn natural_key_orders_numbers(a in 0u32..100_000, b in 0u32..100_000) {
            let (ka, kb) = (natural_key(&format!("ep{a}-ll")), natural_key(&format!("ep{b}-ll")));
            proptest::prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
        }
    }

    #[test]
    fn cdf_steps_reach_one() {
        let cdf = empirical_cdf(&[3.0, 1.0, 2.0]);
        assert_eq!(cdf.first(), Some(&(1.0, 0.0)));
        assert_eq!(cdf.last(), Some(&(3.0, 1.0)));
        assert!(cdf.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1), "monotone");
    }

    #[test]
    fn sweep_axes() {
        let v = |xs: &[&str]| xs.iter().map(|x| serde_json::json!(x)).collect::<Vec<_>>();
        let (pos, ticks, log) = sweep_axis(&v(&["128", "256", "1024"]));
        assert!(log);
        assert_eq!(pos, [7.0, 8.0, 10.0]);
        assert_eq!(ticks.unwrap()[2], (10.0, "1024".to_string()));
        let (pos, _, log) = sweep_axis(&v(&["1", "2", "3"]));
        assert_eq!((pos, log), (vec![1.0, 2.0, 3.0], false));
        let (pos, _, log) = sweep_axis(&v(&["1MiB", "64MiB"]));
        assert!(log && pos == [20.0, 26.0]);
        let (pos, ticks, _) = sweep_axis(&v(&["static", "adaptive"]));
        assert_eq!(pos, [0.0, 1.0]);
        assert_eq!(ticks.unwrap()[1].1, "adaptive");
    }

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

    #[test]
    fn sharing_is_read_from_lanes() {
        let r: RunResult = serde_json::from_value(serde_json::json!({
            "schema": 1, "scenario": {"name": "x-shared", "sha256": ""},
            "backend": {"kind": "sim"}, "eptwin": {"version": "", "git_commit": ""},
            "verdict": "ok",
            "jobs": [
                {"name": "decode", "kind": "low-latency", "ranks": 16, "sl": 1, "vl": 1, "ops": []},
                {"name": "bulk", "kind": "traffic", "ranks": 16, "sl": 0, "vl": 1, "ops": []}
            ]
        }))
        .unwrap();
        assert_eq!(sharing(&r, &r.jobs[0]).0, Sharing::Shared);
        let mut own = r.clone();
        own.jobs[1].vl = Some(0);
        let (kind, label) = sharing(&own, &own.jobs[0]);
        assert_eq!(kind, Sharing::Own);
        assert_eq!(label, "own lane (SL1 → VL1; bulk on SL0 → VL0)");
        let mut roce = r.clone();
        roce.jobs[0].vl = None;
        roce.jobs[1].vl = None;
        assert_eq!(sharing(&roce, &roce.jobs[0]).0, Sharing::Own, "different priorities");
    }
}
