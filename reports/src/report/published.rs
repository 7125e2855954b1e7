//! Latency and bandwidth against the numbers DeepEP publishes for the same shapes.

use eptwin_engine::api::{RunResult, is_measured_kind};

use super::{ChartSpec, Planned, name_list, natural_key, unique};
use crate::charts::bars::{BarRow, BarSeries, GroupedBars};
use crate::charts::{self, fmt_pct};
use crate::describe;
use crate::inputs::Loaded;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Metric {
    Latency,
    Bandwidth,
}

pub(super) fn vs_published(
    results: &[Loaded<RunResult>],
    metric: Metric,
) -> Result<Planned, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str, text: &str) -> Loaded<RunResult> {
        Loaded { path: name.into(), doc: RunResult::from_json(text).unwrap() }
    }

    fn results() -> Vec<Loaded<RunResult>> {
        vec![
            fixture("ep16-ll.json", include_str!("../../tests/fixtures/results/sim/ep16-ll.json")),
            fixture(
                "ep8-normal-intranode.json",
                include_str!("../../tests/fixtures/results/sim/ep8-normal-intranode.json"),
            ),
        ]
    }

    fn bars(planned: Planned) -> GroupedBars {
        match planned.spec {
            ChartSpec::Bars(b) => b,
            other => panic!("bars expected, got {other:?}"),
        }
    }

    /// Latency references go to the latency chart, bandwidth-only ones to the bandwidth chart,
    /// one row per op with the published value beside the simulated one.
    #[test]
    fn each_reference_goes_to_the_chart_of_what_it_publishes() {
        let latency = bars(vs_published(&results(), Metric::Latency).unwrap());
        let labels: Vec<&str> = latency.rows.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels.len(), 2, "{labels:?}");
        assert!(labels.iter().all(|l| l.starts_with("ep16-ll")), "{labels:?}");
        let dispatch = &latency.rows[0];
        assert!(dispatch.values.contains(&Some(118.0)), "published 118 us: {dispatch:?}");
        let bandwidth = bars(vs_published(&results(), Metric::Bandwidth).unwrap());
        assert_eq!(bandwidth.rows.len(), 2);
        assert!(bandwidth.rows.iter().all(|r| r.label.starts_with("ep8-normal-intranode")));
        assert!(bandwidth.rows[0].values.contains(&Some(153.0)), "{:?}", bandwidth.rows[0]);
    }

    #[test]
    fn results_without_references_skip_the_chart() {
        let hw = fixture(
            "vl-isolation-shared.json",
            include_str!("../../tests/fixtures/results/sim/vl-isolation-shared.json"),
        );
        assert!(vs_published(&[hw], Metric::Latency).is_err());
        assert!(vs_published(&[], Metric::Bandwidth).is_err());
    }
}
