//! Fault sweeps (`eptwin sweep --set fault[0].delay_us=0,10,20,50`, docs/scenario.md,
//! "Faults"): median and p99 latency against the swept fault value, one line per (job, op).
//! A fault shows in the tail (a lost packet's ACK timeout) as much as in the median, and a
//! point whose run failed (DeepEP's timeout) is marked where it was swept.

use std::collections::BTreeMap;

use plotters::style::RGBColor;

use super::sweep::{short_key, sweep_axis};
use super::{ChartSpec, Planned, op_rank, slug};
use crate::charts::figure::{Figure, Panel, SeriesStyle, XySeries};
use crate::charts::{self, LegendEntry, Mark, Shape};
use crate::sweep::SweepIndex;

/// Whether a sweep's first key is a fault's (`fault[0].rate`).
pub(super) fn is_fault_sweep(index: &SweepIndex) -> bool {
    index.keys.first().is_some_and(|k| k.starts_with("fault["))
}

/// The chart of a fault sweep (see the module docs), or why there is none.
pub(super) fn fault_sweep_chart(index: &SweepIndex) -> Result<Planned, String> {
    let x_key = index.keys.first().ok_or("a sweep without keys")?;
    let x_values = index.values.get(x_key).cloned().unwrap_or_default();
    let (positions, ticks, log) = sweep_axis(&x_values);
    let pos_of = |v: &serde_json::Value| x_values.iter().position(|x| x == v).map(|i| positions[i]);
    // (op rank, job) -> (x, p50, p99)s, ops in the order a reader expects.
    type Line = Vec<(f64, f64, f64)>;
    let mut lines: BTreeMap<((usize, String), String), Line> = BTreeMap::new();
    let mut failed = Vec::new();
    for p in &index.points {
        let Some(x) = p.values.get(x_key).and_then(pos_of) else { continue };
        if p.verdict != "ok" {
            failed.push(x);
            continue;
        }
        for o in &p.ops {
            let key = (op_rank(&o.op), o.job.clone());
            lines.entry(key).or_default().push((x, o.latency_us_p50, o.latency_us_p99));
        }
    }
    if lines.is_empty() {
        return Err(format!("fault sweep of {}: no point ran to the end", index.scenario.name));
    }
    let multi_job =
        lines.keys().map(|(_, j)| j).collect::<std::collections::BTreeSet<_>>().len() > 1;
    let (mut legend, mut p50, mut p99) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (((_, op), job), pts)) in lines.iter_mut().enumerate() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = charts::palette(i);
        let label = if multi_job { format!("{job}/{op}") } else { op.clone() };
        legend.push(LegendEntry::new(label, Mark::LineMarker(color, Shape::Circle)));
        let style = SeriesStyle::LineMarkers(Shape::Circle);
        p50.push(XySeries {
            color,
            style: style.clone(),
            points: pts.iter().map(|p| (p.0, p.1)).collect(),
        });
        p99.push(XySeries { color, style, points: pts.iter().map(|p| (p.0, p.2)).collect() });
    }
    if !failed.is_empty() {
        let alert = RGBColor(190, 30, 30);
        legend.push(LegendEntry::new(
            "run failed at this value (DeepEP timeout)",
            Mark::Marker(alert, Shape::Cross),
        ));
        for panel in [&mut p50, &mut p99] {
            let points = failed.iter().map(|&x| (x, 0.0)).collect();
            panel.push(XySeries {
                color: alert,
                style: SeriesStyle::Markers(Shape::Cross),
                points,
            });
        }
    }
    let x_desc = format!("{}{}", short_key(x_key), if log { " (log2 axis)" } else { "" });
    let panel = |y_desc: &str, caption: &str, series| Panel {
        x_desc: x_desc.clone(),
        y_desc: y_desc.into(),
        x_ticks: ticks.clone(),
        y_range: None,
        caption: caption.into(),
        series,
    };
    Ok(Planned {
        id: format!("fault-sweep-{}", slug(&index.scenario.name)),
        caption: format!(
            "Median and p99 latency of {} against {x_key} (a fault's value), one line per op; \
             crosses mark values whose run failed.",
            index.scenario.name
        ),
        spec: ChartSpec::Figure(Figure {
            title: format!("{}: latency vs {}", index.scenario.name, short_key(x_key)),
            subtitle: format!(
                "{} points; backend {}; base scenario {}",
                index.points.len(),
                index.backend,
                index.scenario.file
            ),
            legend,
            panels: vec![
                panel("median latency (µs)", "p50", p50),
                panel("p99 latency (µs)", "p99", p99),
            ],
            columns: 2,
            panel_height: 500,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::{PointOp, SweepPoint, SweepScenario};

    fn point(index: usize, delay: u64, verdict: &str, p50: f64, p99: f64) -> SweepPoint {
        let op = |name: &str| PointOp {
            job: "decode".into(),
            op: name.into(),
            latency_us_mean: p50,
            latency_us_p50: p50,
            latency_us_p99: p99,
            logical_bw_gbps: 1.0,
            logical_bw_label: "RDMA".into(),
            rdma_bytes: 1,
            nvlink_bytes: 1,
        };
        SweepPoint {
            index,
            values: BTreeMap::from([("fault[0].delay_us".into(), serde_json::json!(delay))]),
            file: None,
            scenario_file: None,
            verdict: verdict.into(),
            reason: None,
            ops: if verdict == "ok" { vec![op("combine"), op("dispatch")] } else { Vec::new() },
        }
    }

    fn index(points: Vec<SweepPoint>) -> SweepIndex {
        SweepIndex {
            schema: 1,
            kind: crate::sweep::SWEEP_INDEX_KIND.into(),
            scenario: SweepScenario { name: "s".into(), file: "s.toml".into(), sha256: "0".into() },
            backend: "sim".into(),
            keys: vec!["fault[0].delay_us".into()],
            values: BTreeMap::from([(
                "fault[0].delay_us".into(),
                points.iter().map(|p| p.values["fault[0].delay_us"].clone()).collect(),
            )]),
            shard: crate::sweep::Shard::ALL,
            total_points: points.len(),
            points,
        }
    }

    #[test]
    fn p50_and_p99_per_op_with_failed_points_marked() {
        let idx = index(vec![
            point(0, 0, "ok", 100.0, 110.0),
            point(1, 50, "ok", 140.0, 4e6),
            point(2, 100, "failed", 0.0, 0.0),
        ]);
        assert!(is_fault_sweep(&idx));
        let planned = fault_sweep_chart(&idx).unwrap();
        let ChartSpec::Figure(f) = planned.spec else { panic!("a figure") };
        assert_eq!(f.legend[0].label, "dispatch");
        assert_eq!(f.legend.last().unwrap().label, "run failed at this value (DeepEP timeout)");
        assert_eq!(f.panels[0].series[0].points, vec![(0.0, 100.0), (50.0, 140.0)]);
        assert_eq!(f.panels[1].series[0].points, vec![(0.0, 110.0), (50.0, 4e6)]);
        assert_eq!(f.panels[1].series[2].points, vec![(100.0, 0.0)]);
    }

    #[test]
    fn no_chart_when_no_point_ran_and_none_for_other_sweeps() {
        let idx = index(vec![point(0, 0, "failed", 0.0, 0.0)]);
        assert!(fault_sweep_chart(&idx).unwrap_err().contains("no point ran to the end"));
        let mut other = index(vec![point(0, 0, "ok", 1.0, 1.0)]);
        other.keys = vec!["job[0].workload.tokens_per_rank".into()];
        assert!(!is_fault_sweep(&other));
    }
}
