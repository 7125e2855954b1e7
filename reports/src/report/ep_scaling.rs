//! Latency and bandwidth against EP size, one line per scenario family (`ep*-ll`).

use std::collections::{BTreeMap, BTreeSet};

use eptwin_engine::api::{JobResult, RunResult, is_measured_kind};

use super::{ChartSpec, Planned, op_rank, unique};
use crate::charts::figure::{Figure, Panel, SeriesStyle, Ticks, XySeries};
use crate::charts::{self, LegendEntry, Mark, Shape};
use crate::describe;
use crate::inputs::Loaded;

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

pub(super) fn ep_scaling(results: &[Loaded<RunResult>]) -> Result<Planned, String> {
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
}
