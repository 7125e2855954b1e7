//! Simulated against measured (and published): the comparison `eptwin compare` writes and
//! prints, and the summary table of `index.html`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use eptwin_engine::api::{OpResult, RunResult};
use serde::{Deserialize, Serialize};

use crate::describe;
use crate::inputs::Loaded;

pub const COMPARISON_KIND: &str = "eptwin-comparison";
pub const COMPARISON_SCHEMA: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub schema: u32,
    /// Always [`COMPARISON_KIND`].
    pub kind: String,
    pub scenario: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated: Option<Side>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<Side>,
    /// False when the two results ran different scenario texts (their sha256 differ): the
    /// numbers are then not strictly comparable.
    pub same_scenario_text: bool,
    /// Why the measured numbers are shown but not compared (no error is computed): a
    /// measurement over the TCP wire is no measurement of a fabric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_compared: Option<String>,
    /// Other measured results of the same scenario name that were read and not used (a
    /// directory of diagnostics next to the results holds several): shown so that the pairing
    /// is never a silent choice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unused_measured: Vec<String>,
    pub rows: Vec<ComparisonRow>,
}

/// One of the two results compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub file: String,
    /// "sim" | "hw" | "deepep".
    pub backend: String,
    pub hardware: String,
    pub verdict: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `backend.wire` of a hardware result ("verbs", "tcp", "none").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComparisonRow {
    pub job: String,
    pub op: String,
    pub ranks: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated: Option<OpNumbers>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<OpNumbers>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<Published>,
    /// (simulated − measured) / measured × 100 on mean latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_error_pct: Option<f64>,
    /// The same on logical bandwidth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bw_error_pct: Option<f64>,
    /// The op's named phases (hook mode's `send` and `recv`, normal mode's `notify`) that
    /// both sides timed, in the order the op runs them: where the op's error lies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PhaseRow>,
}

/// One named phase of an op, simulated against measured (mean microseconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseRow {
    pub phase: String,
    pub simulated_us: f64,
    pub measured_us: f64,
    /// (simulated − measured) / measured × 100 (none where the measurement is not compared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_pct: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpNumbers {
    pub latency_us_mean: f64,
    pub latency_us_min: f64,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    pub logical_bw_gbps: f64,
    #[serde(default)]
    pub logical_bw_label: String,
}

/// A published number the scenario carries, and the simulator's error against it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Published {
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical_bw_gbps: Option<f64>,
    pub tolerance_pct: f64,
    /// The simulator's (else the measurement's) error against it, percent.
    pub error_pct: f64,
    pub within_tolerance: bool,
}

fn numbers(op: &OpResult) -> OpNumbers {
    let s = &op.summary;
    OpNumbers {
        latency_us_mean: s.latency_us.mean,
        latency_us_min: s.latency_us.min,
        latency_us_p50: s.latency_us.p50,
        latency_us_p99: s.latency_us.p99,
        logical_bw_gbps: s.logical_bw_gbps,
        logical_bw_label: s.logical_bw_label.clone(),
    }
}

fn side(path: &Path, r: &RunResult) -> Side {
    Side {
        file: path.display().to_string(),
        backend: r.backend_kind().to_string(),
        hardware: describe::hardware(r),
        verdict: r.verdict.as_str().to_string(),
        reason: r.waived_reason.clone().or_else(|| r.failures.first().cloned()),
        wire: describe::wire(r).map(str::to_string),
    }
}

/// Phases in the order an op runs them (then by name).
fn phase_order(phase: &str) -> (usize, &str) {
    let known = ["notify", "send", "recv"];
    (known.iter().position(|&k| k == phase).unwrap_or(known.len()), phase)
}

fn error_pct(value: f64, reference: f64) -> Option<f64> {
    (reference > 0.0 && value.is_finite()).then(|| (value - reference) / reference * 100.0)
}

impl Comparison {
    /// Compare a simulator result with a measured one (either may be missing: the table
    /// then shows one side).
    pub fn new(
        simulated: Option<(&Path, &RunResult)>,
        measured: Option<(&Path, &RunResult)>,
    ) -> Self {
        let scenario =
            simulated.or(measured).map(|(_, r)| r.scenario.name.clone()).unwrap_or_default();
        let same_scenario_text = match (simulated, measured) {
            (Some((_, s)), Some((_, m))) => s.scenario.sha256 == m.scenario.sha256,
            _ => true,
        };
        let mut rows: Vec<ComparisonRow> = Vec::new();
        // Per row, the phases each side timed (simulated, measured).
        let mut timed: Vec<[Option<&BTreeMap<String, f64>>; 2]> = Vec::new();
        for (is_sim, result) in [(true, simulated), (false, measured)] {
            let Some((_, result)) = result else { continue };
            for job in &result.jobs {
                for op in &job.ops {
                    let idx = match rows.iter().position(|r| r.job == job.name && r.op == op.op) {
                        Some(i) => i,
                        None => {
                            rows.push(ComparisonRow {
                                job: job.name.clone(),
                                op: op.op.clone(),
                                ranks: job.ranks,
                                simulated: None,
                                measured: None,
                                published: None,
                                latency_error_pct: None,
                                bw_error_pct: None,
                                phases: Vec::new(),
                            });
                            timed.push([None, None]);
                            rows.len() - 1
                        }
                    };
                    let row = &mut rows[idx];
                    if is_sim {
                        row.simulated = Some(numbers(op));
                    } else {
                        row.measured = Some(numbers(op));
                    }
                    timed[idx][!is_sim as usize] = Some(&op.summary.phases_us);
                    // The simulator's error against the published number comes first; a
                    // measured-only row shows the measurement's.
                    if let (Some(r), None) = (&op.reference, &row.published) {
                        row.published = Some(Published {
                            source: r.source.clone(),
                            latency_us: r.latency_us,
                            logical_bw_gbps: r.logical_bw_gbps,
                            tolerance_pct: r.tolerance_pct,
                            error_pct: r.error_pct,
                            within_tolerance: r.within_tolerance,
                        });
                    }
                }
            }
        }
        // Only a phase both sides timed is set against the other (the simulator alone names
        // the fused op's send phase).
        for (row, [sim, meas]) in rows.iter_mut().zip(&timed) {
            let (Some(sim), Some(meas)) = (sim, meas) else { continue };
            row.phases = sim
                .iter()
                .filter_map(|(phase, &s)| {
                    let &m = meas.get(phase)?;
                    Some(PhaseRow {
                        phase: phase.clone(),
                        simulated_us: s,
                        measured_us: m,
                        error_pct: None,
                    })
                })
                .collect();
            row.phases.sort_by(|a, b| phase_order(&a.phase).cmp(&phase_order(&b.phase)));
        }
        let not_compared = measured.and_then(|(_, m)| describe::not_a_fabric_measurement(m));
        for row in rows.iter_mut().filter(|_| not_compared.is_none()) {
            if let (Some(s), Some(m)) = (&row.simulated, &row.measured) {
                row.latency_error_pct = error_pct(s.latency_us_mean, m.latency_us_mean);
                row.bw_error_pct = error_pct(s.logical_bw_gbps, m.logical_bw_gbps);
            }
            for p in &mut row.phases {
                p.error_pct = error_pct(p.simulated_us, p.measured_us);
            }
        }
        Comparison {
            schema: COMPARISON_SCHEMA,
            kind: COMPARISON_KIND.into(),
            scenario,
            simulated: simulated.map(|(p, r)| side(p, r)),
            measured: measured.map(|(p, r)| side(p, r)),
            same_scenario_text,
            not_compared,
            unused_measured: Vec::new(),
            rows,
        }
    }

    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("comparison serialises");
        text.push('\n');
        text
    }

    /// Largest |latency error| of the rows, percent.
    pub fn max_abs_latency_error_pct(&self) -> Option<f64> {
        self.rows.iter().filter_map(|r| r.latency_error_pct).map(f64::abs).max_by(f64::total_cmp)
    }
}

/// The measured result to compare with scenario `name` among `results`, and the paths of the
/// other measured results of that name (read, not used). One with ops comes before a waived or
/// empty one; among those, one that ran the scenario text `sha256` (the simulated one's) comes
/// first: a diagnostic run of a variant (hook mode, other settings) keeps its scenario's name
/// but not its text. Otherwise the first in `results`' order.
pub fn pick_measured<'a>(
    results: &'a [Loaded<RunResult>],
    name: &str,
    sha256: Option<&str>,
) -> (Option<&'a Loaded<RunResult>>, Vec<String>) {
    let candidates: Vec<&Loaded<RunResult>> =
        results.iter().filter(|r| r.doc.scenario.name == name && r.doc.is_measured()).collect();
    let with_ops = |r: &&&Loaded<RunResult>| !r.doc.jobs.is_empty();
    let taken = candidates
        .iter()
        .filter(with_ops)
        .find(|r| Some(r.doc.scenario.sha256.as_str()) == sha256)
        .or_else(|| candidates.iter().find(with_ops))
        .or_else(|| candidates.first())
        .copied();
    let unused = candidates
        .iter()
        .filter(|r| !taken.is_some_and(|t| std::ptr::eq(**r, t)))
        .map(|r| r.path.display().to_string())
        .collect();
    (taken, unused)
}

/// Pair results by scenario name: the first simulator result (one with ops first) with the
/// measured one [`pick_measured`] takes (eptwin's hardware backend or DeepEP's tests imported);
/// the measured results not taken are listed in the comparison.
pub fn pair_all(results: &[Loaded<RunResult>]) -> Vec<Comparison> {
    let mut names: Vec<&str> = Vec::new();
    for r in results {
        if !names.contains(&r.doc.scenario.name.as_str()) {
            names.push(&r.doc.scenario.name);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let sim = |r: &&Loaded<RunResult>| {
                r.doc.scenario.name == name && r.doc.backend_kind() == "sim"
            };
            let simulated = results
                .iter()
                .filter(sim)
                .find(|r| !r.doc.jobs.is_empty())
                .or_else(|| results.iter().find(sim));
            let sha256 = simulated.map(|r| r.doc.scenario.sha256.as_str());
            let (measured, unused) = pick_measured(results, name, sha256);
            let mut comparison = Comparison::new(
                simulated.map(|r| (r.path.as_path(), &r.doc)),
                measured.map(|r| (r.path.as_path(), &r.doc)),
            );
            comparison.unused_measured = unused;
            comparison
        })
        .collect()
}

fn opt(v: Option<f64>, width: usize, prec: usize) -> String {
    match v {
        Some(v) => format!("{v:>width$.prec$}"),
        None => format!("{:>width$}", "-"),
    }
}

fn opt_pct(v: Option<f64>) -> String {
    match v {
        Some(v) => format!("{v:>+8.1}"),
        None => format!("{:>8}", "-"),
    }
}

/// The table `eptwin compare` prints (stdout), one block per scenario.
pub fn render_table(comparisons: &[Comparison]) -> String {
    let mut out = String::new();
    for c in comparisons {
        let who = |s: &Option<Side>| {
            let Some(s) = s else { return "none".to_string() };
            let wire = match s.wire.as_deref() {
                Some(w) if w != "none" => format!(", wire: {w}"),
                _ => String::new(),
            };
            match s.verdict.as_str() {
                "ok" => format!("{}{wire}", s.hardware),
                v => format!(
                    "{}{wire} ({v}{})",
                    s.hardware,
                    s.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default()
                ),
            }
        };
        let _ = writeln!(out, "# {}", c.scenario);
        let _ = writeln!(out, "#   simulated: {}", who(&c.simulated));
        let _ = writeln!(out, "#   measured:  {}", who(&c.measured));
        if !c.same_scenario_text {
            let _ = writeln!(
                out,
                "#   NOTE: the measured result ran a different scenario text (sha256 differs)"
            );
        }
        if let Some(why) = &c.not_compared {
            let _ = writeln!(out, "#   NOT COMPARED: {why}");
        }
        if !c.unused_measured.is_empty() {
            let taken = c.measured.as_ref().map_or("none", |m| m.file.as_str());
            let _ = writeln!(
                out,
                "#   NOTE: measured result taken: {taken}; also read, not used: {}",
                c.unused_measured.join(", ")
            );
        }
        let _ = writeln!(
            out,
            "# {:<10} {:<9} {:>5} {:>10} {:>10} {:>8} {:>9} {:>9} {:>8} {:>10} {:>8}",
            "job",
            "op",
            "ranks",
            "sim(us)",
            "meas(us)",
            "err%",
            "sim(GB/s)",
            "meas(GB/s)",
            "err%",
            "publ(us)",
            "err%"
        );
        for r in &c.rows {
            let s = r.simulated.as_ref();
            let m = r.measured.as_ref();
            let p = r.published.as_ref();
            let _ = writeln!(
                out,
                "  {:<10} {:<9} {:>5} {} {} {} {} {} {} {} {}",
                r.job,
                r.op,
                r.ranks,
                opt(s.map(|n| n.latency_us_mean), 10, 2),
                opt(m.map(|n| n.latency_us_mean), 10, 2),
                opt_pct(r.latency_error_pct),
                opt(s.map(|n| n.logical_bw_gbps), 9, 2),
                opt(m.map(|n| n.logical_bw_gbps), 10, 2),
                opt_pct(r.bw_error_pct),
                opt(p.and_then(|p| p.latency_us), 10, 1),
                opt_pct(p.map(|p| p.error_pct)),
            );
            for phase in &r.phases {
                let _ = writeln!(
                    out,
                    "  {:<10} {:<9} {:>5} {} {} {}",
                    r.job,
                    // Indented under the op it divides.
                    format!("  {}", phase.phase),
                    r.ranks,
                    opt(Some(phase.simulated_us), 10, 2),
                    opt(Some(phase.measured_us), 10, 2),
                    opt_pct(phase.error_pct),
                );
            }
        }
    }
    out
}

/// Where `compare` writes a scenario's comparison: `DIR/<scenario>.compare.json`.
pub fn comparison_path(dir: &Path, scenario: &str) -> PathBuf {
    dir.join(format!("{scenario}.compare.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(json: &str) -> RunResult {
        RunResult::from_json(json).unwrap()
    }

    fn pair() -> (RunResult, RunResult) {
        (
            result(include_str!("../tests/fixtures/results/sim/h200-ep8-ll-128.json")),
            result(include_str!("../tests/fixtures/results/hw/h200-ep8-ll-128.json")),
        )
    }

    #[test]
    fn a_measurement_is_compared() {
        let (sim, hw) = pair();
        let c = Comparison::new(Some((Path::new("s"), &sim)), Some((Path::new("h"), &hw)));
        assert_eq!(c.not_compared, None);
        assert!(c.rows.iter().all(|r| r.latency_error_pct.is_some()));
        assert!(c.max_abs_latency_error_pct().is_some());
    }

    /// A run over the TCP wire is shown with its wire and its numbers, and never enters the
    /// simulated-vs-measured error (so no tolerance can pass or fail on it).
    #[test]
    fn a_run_over_tcp_is_shown_but_not_compared() {
        let (sim, mut hw) = pair();
        hw.backend.insert("wire".into(), serde_json::json!("tcp"));
        let c = Comparison::new(Some((Path::new("s"), &sim)), Some((Path::new("h"), &hw)));
        let why = c.not_compared.clone().expect("excluded");
        assert!(why.contains("wire: tcp") && why.contains("not a fabric measurement"), "{why}");
        assert!(c.rows.iter().all(|r| r.measured.is_some() && r.latency_error_pct.is_none()));
        assert!(c.rows.iter().all(|r| r.bw_error_pct.is_none()));
        assert_eq!(c.max_abs_latency_error_pct(), None);
        assert_eq!(c.measured.as_ref().unwrap().wire.as_deref(), Some("tcp"));
        let table = render_table(std::slice::from_ref(&c));
        assert!(
            table.contains(", wire: tcp") && table.contains("NOT COMPARED: wire: tcp"),
            "{table}"
        );
        let back: Comparison = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(back, c);
        // The verbs wire is a measurement.
        hw.backend.insert("wire".into(), serde_json::json!("verbs"));
        let c = Comparison::new(Some((Path::new("s"), &sim)), Some((Path::new("h"), &hw)));
        assert!(c.not_compared.is_none() && c.rows.iter().all(|r| r.latency_error_pct.is_some()));
    }

    /// Hook mode's phases, timed on both sides, get their own rows and errors; a phase only
    /// one side names gets none.
    #[test]
    fn phases_both_sides_timed_are_compared() {
        let (mut sim, mut hw) = pair();
        let phases = |pairs: &[(&str, f64)]| {
            pairs
                .iter()
                .map(|&(k, v)| (k.to_string(), v))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        sim.jobs[0].ops[1].summary.phases_us = phases(&[("recv", 60.0), ("send", 66.0)]);
        hw.jobs[0].ops[1].summary.phases_us = phases(&[("send", 60.0), ("recv", 50.0)]);
        sim.jobs[0].ops[0].summary.phases_us = phases(&[("send", 40.0)]);
        let c = Comparison::new(Some((Path::new("s"), &sim)), Some((Path::new("h"), &hw)));
        assert!(c.rows[0].phases.is_empty(), "{:?}", c.rows[0].phases);
        let combine = &c.rows[1];
        assert_eq!(combine.op, "combine");
        let got: Vec<(&str, f64)> =
            combine.phases.iter().map(|p| (p.phase.as_str(), p.error_pct.unwrap())).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, "send");
        assert!((got[0].1 - 10.0).abs() < 1e-9 && (got[1].1 - 20.0).abs() < 1e-9, "{got:?}");
        let table = render_table(std::slice::from_ref(&c));
        let recv = table.lines().find(|l| l.contains("   recv ")).expect(&table);
        assert!(recv.contains("+20.0"), "{table}");
        assert_eq!(table.lines().filter(|l| l.contains("   send ")).count(), 1, "{table}");
        let back: Comparison = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(back, c);
        // Over the TCP wire nothing is compared, phases included.
        hw.backend.insert("wire".into(), serde_json::json!("tcp"));
        let c = Comparison::new(Some((Path::new("s"), &sim)), Some((Path::new("h"), &hw)));
        assert!(!c.rows[1].phases.is_empty());
        assert!(c.rows[1].phases.iter().all(|p| p.measured_us > 0.0 && p.error_pct.is_none()));
    }

    fn doc(name: &str, kind: &str, latency_us: f64) -> Loaded<RunResult> {
        let doc = serde_json::from_value(serde_json::json!({
            "schema": 1,
            "scenario": {"name": name, "sha256": "x"},
            "backend": {"kind": kind},
            "eptwin": {"version": "0.1.0", "git_commit": "abc"},
            "verdict": "ok",
            "jobs": [{"name": "ll", "kind": "low-latency", "ranks": 16, "sl": 0, "ops": [{
                "op": "dispatch",
                "summary": {"latency_us": {"mean": latency_us, "p50": latency_us,
                                           "p99": latency_us, "min": latency_us,
                                           "max": latency_us},
                            "logical_bw_gbps": 1.0, "rdma_bytes": 0, "nvlink_bytes": 0},
                "samples": []}]}]
        }))
        .unwrap();
        Loaded { path: format!("{name}.{kind}.json").into(), doc }
    }

    #[test]
    fn deepep_documents_pair_as_measured() {
        let all = [doc("a", "sim", 110.0), doc("a", "deepep", 100.0), doc("b", "hw", 5.0)];
        let pairs = pair_all(&all);
        assert_eq!(pairs.len(), 2);
        assert_eq!(pairs[0].measured.as_ref().unwrap().backend, "deepep");
        assert_eq!(pairs[0].rows[0].latency_error_pct, Some(10.0));
        assert_eq!(pairs[1].measured.as_ref().unwrap().backend, "hw");
        assert!(pairs[1].simulated.is_none());
    }

    /// Several measured results of one scenario: the one that ran the simulated scenario text
    /// is taken even when a variant's file sorts first, and the others are named.
    #[test]
    fn the_measurement_of_the_simulated_text_is_taken_and_the_others_named() {
        let mut hook = doc("a", "hw", 130.0);
        hook.doc.scenario.sha256 = "variant".into();
        hook.path = "a/diag/a.json".into();
        let mut main = doc("a", "hw", 100.0);
        main.path = "a/a.json".into();
        let all = [doc("a", "sim", 110.0), hook, main];
        let pairs = pair_all(&all);
        assert_eq!(pairs[0].measured.as_ref().unwrap().file, "a/a.json");
        assert_eq!(pairs[0].rows[0].latency_error_pct, Some(10.0));
        assert_eq!(pairs[0].unused_measured, ["a/diag/a.json"]);
        let table = render_table(&pairs);
        assert!(
            table.contains(
                "NOTE: measured result taken: a/a.json; also read, not used: a/diag/a.json"
            ),
            "{table}"
        );
        // One measured result: nothing to name.
        let pairs = pair_all(&[doc("b", "sim", 1.0), doc("b", "hw", 1.0)]);
        assert!(pairs[0].unused_measured.is_empty());
        assert!(!render_table(&pairs).contains("not used"));
    }
}
