//! VL isolation: latency CDFs of a job alone and sharing the fabric with background traffic.

use std::collections::{BTreeMap, BTreeSet};

use eptwin_engine::api::{JobResult, RunResult};
use plotters::style::RGBColor;

use super::{ChartSpec, Planned, slug, unique};
use crate::charts::figure::{Figure, Panel, SeriesStyle, XySeries};
use crate::charts::{self, LegendEntry, Mark, fmt_num};
use crate::describe;
use crate::inputs::Loaded;

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

pub(super) fn isolation_studies(results: &[Loaded<RunResult>]) -> Vec<Planned> {
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

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
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
    }

    #[test]
    fn cdf_steps_reach_one() {
        let cdf = empirical_cdf(&[3.0, 1.0, 2.0]);
        assert_eq!(cdf.first(), Some(&(1.0, 0.0)));
        assert_eq!(cdf.last(), Some(&(3.0, 1.0)));
        assert!(cdf.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1), "monotone");
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
