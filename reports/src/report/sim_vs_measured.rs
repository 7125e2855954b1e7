//! Simulated against measured latency: one bar group per (scenario, op).

use std::collections::BTreeSet;

use super::{ChartSpec, Planned, name_list, natural_key, unique};
use crate::charts::bars::{BarRow, BarSeries, GroupedBars};
use crate::charts::{self, fmt_pct};
use crate::compare::Comparison;

pub(super) fn sim_vs_measured(comparisons: &[Comparison]) -> Result<Planned, String> {
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

#[cfg(test)]
mod tests {
    use eptwin_engine::api::RunResult;

    use super::*;
    use crate::compare::pair_all;
    use crate::inputs::Loaded;

    fn fixture(path: &str, text: &str) -> Loaded<RunResult> {
        Loaded { path: path.into(), doc: RunResult::from_json(text).unwrap() }
    }

    #[test]
    fn one_bar_pair_per_op_with_both_sides() {
        let sim = fixture(
            "sim/h200-ep8-ll-128.json",
            include_str!("../../tests/fixtures/results/sim/h200-ep8-ll-128.json"),
        );
        let hw = fixture(
            "hw/h200-ep8-ll-128.json",
            include_str!("../../tests/fixtures/results/hw/h200-ep8-ll-128.json"),
        );
        let planned = sim_vs_measured(&pair_all(&[sim.clone(), hw])).unwrap();
        let ChartSpec::Bars(bars) = planned.spec else { panic!("bars expected") };
        let labels: Vec<&str> = bars.rows.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, ["h200-ep8-ll-128 · dispatch", "h200-ep8-ll-128 · combine"]);
        for row in &bars.rows {
            assert!(row.values.iter().all(Option::is_some), "{row:?}");
            assert!(row.note.is_some(), "the simulator's error is the label: {row:?}");
        }
        let alone = sim_vs_measured(&pair_all(&[sim])).unwrap_err();
        assert!(
            alone.contains("needs a simulator result and a measured (hw or deepep) result"),
            "{alone}"
        );
    }
}
