//! Simulated against measured (and published): the comparison `eptwin compare` writes and
//! prints, and the summary table of `index.html`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use eptwin_engine::api::{OpResult, RunResult, Verdict};
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
    /// Other measured results of the same scenario name that were read and not used, each
    /// with why (another scenario text, another GPU, no ops, another measurement of the same
    /// text taken instead): shown so that the pairing is never a silent choice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unused_measured: Vec<Unused>,
    pub rows: Vec<ComparisonRow>,
}

/// A measured result read and not used, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unused {
    pub file: String,
    pub reason: String,
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

/// The measured results of one scenario name: those that may be compared with its simulator
/// result, and the others with why not.
#[derive(Debug, Clone)]
pub struct Measured<'a> {
    /// Measurements of the simulated scenario text on the GPU the simulator modelled (or one
    /// of the GPUs allowed), with ops; shallowest path first, then in path order.
    pub candidates: Vec<&'a Loaded<RunResult>>,
    /// Measured results of the name without ops (waived, or failed before measuring): shown
    /// when there is no candidate, for the reason they give.
    pub without_ops: Vec<&'a Loaded<RunResult>>,
    /// Every other measured result of the name, with why it is not a candidate.
    pub skipped: Vec<Unused>,
}

/// What a measurement must have run to be compared with a simulation: the same scenario text
/// and the GPU the scenario's profile models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected<'s> {
    pub sha256: &'s str,
    pub gpu: &'s str,
    /// Compare a measurement of another scenario text of the same name too (`compare
    /// --allow-other-text`: the simulation names a calibrated profile the run did not); the
    /// comparison says the texts differ.
    pub allow_other_text: bool,
}

impl<'s> Expected<'s> {
    /// What a simulator result ran and modelled.
    pub fn of_simulation(sim: &'s RunResult) -> Expected<'s> {
        Expected {
            sha256: &sim.scenario.sha256,
            gpu: describe::modelled_gpu(sim).unwrap_or(""),
            allow_other_text: false,
        }
    }
}

impl<'a> Measured<'a> {
    /// The measured results named `name` among `results`, matched against `expected`: the
    /// same scenario text (sha256) and the GPU the profile models ([`describe::same_gpu`]), or
    /// one of `allow_gpus`. Without an expectation (no simulator result) every measured
    /// result with ops is a candidate.
    pub fn of(
        results: &'a [Loaded<RunResult>],
        name: &str,
        expected: Option<Expected<'_>>,
        allow_gpus: &[String],
    ) -> Measured<'a> {
        let mut candidates = Vec::new();
        let mut without_ops = Vec::new();
        let mut skipped = Vec::new();
        for r in results.iter().filter(|r| r.doc.scenario.name == name && r.doc.is_measured()) {
            if r.doc.jobs.iter().all(|j| j.ops.is_empty()) {
                without_ops.push(r);
                continue;
            }
            match why_not(&r.doc, expected, allow_gpus) {
                Some(reason) => skipped.push(Unused { file: r.path.display().to_string(), reason }),
                None => candidates.push(r),
            }
        }
        let depth_then_path =
            |r: &&Loaded<RunResult>| (r.path.components().count(), r.path.clone());
        candidates.sort_by_key(depth_then_path);
        without_ops.sort_by_key(depth_then_path);
        Measured { candidates, without_ops, skipped }
    }

    /// The candidate a report shows (the first; else the first result without ops, which
    /// says why nothing was measured), and every other result read with why it is not shown.
    pub fn take(self) -> (Option<&'a Loaded<RunResult>>, Vec<Unused>) {
        let fallback = self.without_ops.first().copied();
        let mut candidates = self.candidates.into_iter();
        let taken = candidates.next().or(fallback);
        let skipped_without_ops =
            self.without_ops.iter().filter(|r| !taken.is_some_and(|t| std::ptr::eq(**r, t)));
        let no_ops: Vec<Unused> = skipped_without_ops
            .map(|r| Unused { file: r.path.display().to_string(), reason: no_ops_reason(&r.doc) })
            .collect();
        let mut unused: Vec<Unused> = candidates
            .map(|r| Unused {
                file: r.path.display().to_string(),
                reason: format!(
                    "another measurement of the same scenario text on the same GPU; {} is shown",
                    taken.map(|t| t.path.display().to_string()).unwrap_or_default()
                ),
            })
            .collect();
        unused.extend(no_ops);
        unused.extend(self.skipped);
        (taken, unused)
    }
}

/// Why a measured result without ops measured nothing.
pub fn no_ops_reason(m: &RunResult) -> String {
    match (&m.verdict, &m.waived_reason) {
        (Verdict::Waived, Some(why)) => format!("waived: {why}"),
        (v, _) => format!("verdict {} and no op measured", v.as_str()),
    }
}

/// Why measured result `m` may not be compared with simulator result `sim`, if it may not.
fn why_not(m: &RunResult, expected: Option<Expected<'_>>, allow_gpus: &[String]) -> Option<String> {
    let expected = expected?;
    if m.scenario.sha256 != expected.sha256 && !expected.allow_other_text {
        return Some(format!(
            "it ran another scenario text (sha256 {:.12}…, the simulated one is {:.12}…)",
            m.scenario.sha256, expected.sha256
        ));
    }
    let model = expected.gpu;
    let gpus = describe::measured_gpu_names(m);
    if gpus.is_empty() {
        return Some(format!(
            "it records no GPU, so it cannot be told to be the {model} the profile models \
             (`eptwin deepep import --gpu NAME` records one)"
        ));
    }
    let allowed = |g: &String| {
        describe::same_gpu(g, model) || allow_gpus.iter().any(|a| describe::same_gpu(g, a))
    };
    if let Some(other) = gpus.iter().find(|g| !allowed(g)) {
        return Some(format!(
            "measured on {other}, not the {model} the scenario's profile models \
             (--allow-other-gpu \"{other}\" compares it anyway)"
        ));
    }
    None
}

/// Pair results by scenario name: the first simulator result (one with ops first) with the
/// measured one [`Measured::take`] shows (eptwin's hardware backend or DeepEP's tests
/// imported): the same scenario text, on the GPU the simulator modelled; the measured results
/// not taken are listed in the comparison with why.
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
            let expected = simulated.map(|r| Expected::of_simulation(&r.doc));
            let (measured, unused) = Measured::of(results, name, expected, &[]).take();
            let mut comparison = Comparison::new(
                simulated.map(|r| (r.path.as_path(), &r.doc)),
                measured.map(|r| (r.path.as_path(), &r.doc)),
            );
            comparison.unused_measured = unused;
            comparison
        })
        .collect()
}

/// The (job, op) rows of a comparison that only one side has, or whose rank counts differ:
/// "job ep16, op dispatch: measured only" — two results that do not describe the same runs.
pub fn unpaired_rows(sim: &RunResult, measured: &RunResult) -> Vec<String> {
    let rows = |r: &RunResult| -> Vec<(String, String, u32)> {
        r.jobs
            .iter()
            .flat_map(|j| j.ops.iter().map(move |o| (j.name.clone(), o.op.clone(), j.ranks)))
            .collect()
    };
    let (s, m) = (rows(sim), rows(measured));
    let mut out = Vec::new();
    for (job, op, ranks) in &s {
        match m.iter().find(|(j, o, _)| j == job && o == op) {
            None => out.push(format!("job {job}, op {op}: simulated only")),
            Some((_, _, r)) if r != ranks => {
                out.push(format!("job {job}, op {op}: {ranks} ranks simulated, {r} measured"))
            }
            Some(_) => {}
        }
    }
    for (job, op, _) in &m {
        if !s.iter().any(|(j, o, _)| j == job && o == op) {
            out.push(format!("job {job}, op {op}: measured only"));
        }
    }
    out
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
            let _ = writeln!(out, "#   NOTE: measured result taken: {taken}; also read, not used:");
            for u in &c.unused_measured {
                let _ = writeln!(out, "#     {}: {}", u.file, u.reason);
            }
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
        let gpus = if kind == "sim" {
            serde_json::json!(null)
        } else {
            serde_json::json!(["NVIDIA H200"])
        };
        let doc = serde_json::from_value(serde_json::json!({
            "schema": 1,
            "scenario": {"name": name, "sha256": "x", "facts": {"gpu": "NVIDIA H200"}},
            "backend": {"kind": kind, "gpu_names": gpus},
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

    fn on_gpu(mut d: Loaded<RunResult>, gpu: Option<&str>) -> Loaded<RunResult> {
        match gpu {
            Some(g) => d.doc.backend.insert("gpu_names".into(), serde_json::json!([g])),
            None => d.doc.backend.remove("gpu_names"),
        };
        d
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

    /// Several measured results of one scenario: only one that ran the simulated scenario
    /// text on the modelled GPU is taken, the shallowest first, and every other is named with
    /// why.
    #[test]
    fn the_measurement_of_the_simulated_text_and_gpu_is_taken_and_the_others_named() {
        let mut hook = doc("a", "hw", 130.0);
        hook.doc.scenario.sha256 = "variant".into();
        hook.path = "a/diag/a.json".into();
        let mut other_gpu = on_gpu(doc("a", "hw", 150.0), Some("NVIDIA H100 80GB HBM3"));
        other_gpu.path = "a/h100/a.json".into();
        let mut repeat = doc("a", "hw", 105.0);
        repeat.path = "a/repeat/a.json".into();
        let mut no_gpu = on_gpu(doc("a", "deepep", 90.0), None);
        no_gpu.path = "a/deepep.json".into();
        let mut main = doc("a", "hw", 100.0);
        main.path = "a/a.json".into();
        let all = [doc("a", "sim", 110.0), hook, other_gpu, repeat, no_gpu, main];
        let pairs = pair_all(&all);
        assert_eq!(pairs[0].measured.as_ref().unwrap().file, "a/a.json");
        assert_eq!(pairs[0].rows[0].latency_error_pct, Some(10.0));
        let unused: Vec<(&str, &str)> =
            pairs[0].unused_measured.iter().map(|u| (u.file.as_str(), u.reason.as_str())).collect();
        assert_eq!(unused.len(), 4, "{unused:?}");
        assert!(unused[0].0 == "a/repeat/a.json" && unused[0].1.starts_with("another measurement"));
        let reason = |file: &str| unused.iter().find(|u| u.0 == file).unwrap().1;
        assert!(reason("a/diag/a.json").contains("another scenario text"));
        assert!(
            reason("a/h100/a.json")
                .contains("measured on NVIDIA H100 80GB HBM3, not the NVIDIA H200")
        );
        assert!(reason("a/deepep.json").contains("records no GPU"));
        let table = render_table(&pairs);
        assert!(
            table.contains("NOTE: measured result taken: a/a.json; also read, not used:"),
            "{table}"
        );
        assert!(table.contains("#     a/h100/a.json: measured on NVIDIA H100"), "{table}");
        // One measured result: nothing to name.
        let pairs = pair_all(&[doc("b", "sim", 1.0), doc("b", "hw", 1.0)]);
        assert!(pairs[0].unused_measured.is_empty());
        assert!(!render_table(&pairs).contains("not used"));
        // A GPU allowed by name is a candidate.
        let results = [on_gpu(doc("c", "hw", 1.0), Some("NVIDIA H100 80GB HBM3"))];
        let sim = doc("c", "sim", 1.0).doc;
        let expected = Some(Expected::of_simulation(&sim));
        assert!(Measured::of(&results, "c", expected, &[]).candidates.is_empty());
        let allowed = ["NVIDIA H100".to_string()];
        assert_eq!(Measured::of(&results, "c", expected, &allowed).candidates.len(), 1);
        // Another scenario text is a candidate only when allowed.
        let mut other = doc("c", "hw", 1.0);
        other.doc.scenario.sha256 = "another text".into();
        let results = [other];
        assert!(Measured::of(&results, "c", expected, &[]).candidates.is_empty());
        let any_text = expected.map(|e| Expected { allow_other_text: true, ..e });
        assert_eq!(Measured::of(&results, "c", any_text, &[]).candidates.len(), 1);
    }

    #[test]
    fn rows_that_do_not_pair_are_named() {
        let sim = doc("a", "sim", 1.0).doc;
        assert!(unpaired_rows(&sim, &doc("a", "hw", 1.0).doc).is_empty());
        let mut other = doc("a", "hw", 1.0).doc;
        other.jobs[0].name = "ep16".into();
        assert_eq!(
            unpaired_rows(&sim, &other),
            ["job ll, op dispatch: simulated only", "job ep16, op dispatch: measured only"]
        );
        other.jobs[0].name = "ll".into();
        other.jobs[0].ranks = 8;
        assert_eq!(
            unpaired_rows(&sim, &other),
            ["job ll, op dispatch: 16 ranks simulated, 8 measured"]
        );
    }
}
