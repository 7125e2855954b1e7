//! Sweeps: throughput and latency against the swept value, one line per (job, op).

use std::collections::BTreeMap;

use plotters::style::RGBColor;

use super::{ChartSpec, Planned, op_rank, slug, unique};
use crate::charts::figure::{Figure, Panel, SeriesStyle, Ticks, XySeries};
use crate::charts::{self, LegendEntry, Mark, Shape};
use crate::sweep::SweepIndex;

/// How the swept values sit on the x axis.
pub(super) fn sweep_axis(values: &[serde_json::Value]) -> (Vec<f64>, Ticks, bool) {
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

pub(super) fn sweep_chart(index: &SweepIndex) -> Result<Planned, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
