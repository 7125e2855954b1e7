//! Values no run can produce, found before a document is compared or plotted: a chart of a
//! latency of 0 or −1e308 is no chart, and a comparison against one is no comparison.
//! `eptwin report` and `eptwin compare` refuse a document holding one (exit 2), naming the
//! file, the job, the op and the value (docs/reports.md, "What is refused").

use eptwin_engine::api::{OpResult, RunResult, Stats, Verdict};

use crate::sweep::SweepIndex;

/// Rounding room for "mean within [min, max]": the mean of equal samples may differ from them
/// in its last bits.
const REL_SLACK: f64 = 1e-9;

fn positive(what: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(format!("{what} = {v:?}: a measured value is finite and > 0"))
    }
}

fn non_negative(what: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(format!("{what} = {v:?}: finite and ≥ 0"))
    }
}

fn at_most(what: &str, low: (&str, f64), high: (&str, f64)) -> Result<(), String> {
    if low.1 <= high.1 + high.1.abs() * REL_SLACK {
        Ok(())
    } else {
        Err(format!("{what}: {} = {:?} > {} = {:?}", low.0, low.1, high.0, high.1))
    }
}

/// Latency statistics of an op that has samples: every value finite and > 0, and
/// min ≤ p50 ≤ p99 ≤ max, min ≤ mean ≤ max.
fn latency(stats: &Stats) -> Result<(), String> {
    let all = [
        ("mean", stats.mean),
        ("p50", stats.p50),
        ("p99", stats.p99),
        ("min", stats.min),
        ("max", stats.max),
    ];
    for (name, v) in all {
        positive(&format!("latency_us.{name}"), v)?;
    }
    let w = "latency_us";
    at_most(w, ("min", stats.min), ("p50", stats.p50))?;
    at_most(w, ("p50", stats.p50), ("p99", stats.p99))?;
    at_most(w, ("p99", stats.p99), ("max", stats.max))?;
    at_most(w, ("min", stats.min), ("mean", stats.mean))?;
    at_most(w, ("mean", stats.mean), ("max", stats.max))
}

fn op(op: &OpResult, verdict: Verdict) -> Result<(), String> {
    let s = &op.summary;
    // An op without samples belongs to a failed or waived run, whose statistics are zeros.
    if op.samples.is_empty() {
        if verdict == Verdict::Ok {
            return Err("no timed sample in a result whose verdict is ok".into());
        }
        for (name, v) in [
            ("mean", s.latency_us.mean),
            ("p50", s.latency_us.p50),
            ("p99", s.latency_us.p99),
            ("min", s.latency_us.min),
            ("max", s.latency_us.max),
        ] {
            non_negative(&format!("latency_us.{name}"), v)?;
        }
    } else {
        latency(&s.latency_us)?;
        for (i, sample) in op.samples.iter().enumerate() {
            positive(&format!("samples[{i}].latency_us"), sample.latency_us)?;
        }
    }
    non_negative("logical_bw_gbps", s.logical_bw_gbps)?;
    non_negative("logical_bytes_per_rank", s.logical_bytes_per_rank)?;
    for (phase, v) in &s.phases_us {
        non_negative(&format!("phases_us.{phase}"), *v)?;
    }
    if let Some(r) = &op.reference {
        non_negative("reference.tolerance_pct", r.tolerance_pct)?;
        if let Some(v) = r.latency_us {
            positive("reference.latency_us", v)?;
        }
        if let Some(v) = r.logical_bw_gbps {
            positive("reference.logical_bw_gbps", v)?;
        }
        if !r.error_pct.is_finite() {
            return Err(format!("reference.error_pct = {:?}: finite", r.error_pct));
        }
    }
    Ok(())
}

/// The first value of `result` no run can produce, as "job J, op O: what".
pub fn result_problem(result: &RunResult) -> Option<String> {
    for job in &result.jobs {
        for o in &job.ops {
            if let Err(why) = op(o, result.verdict) {
                return Some(format!("job {}, op {}: {why}", job.name, o.op));
            }
        }
    }
    None
}

/// The first number of a sweep index no run can produce, as "point N, job J, op O: what".
pub fn sweep_problem(index: &SweepIndex) -> Option<String> {
    for point in &index.points {
        for o in &point.ops {
            let checked = if point.verdict == "ok" {
                positive("latency_us_mean", o.latency_us_mean)
                    .and_then(|()| positive("latency_us_p50", o.latency_us_p50))
                    .and_then(|()| positive("latency_us_p99", o.latency_us_p99))
            } else {
                non_negative("latency_us_mean", o.latency_us_mean)
            };
            if let Err(why) =
                checked.and_then(|()| non_negative("logical_bw_gbps", o.logical_bw_gbps))
            {
                return Some(format!("point {}, job {}, op {}: {why}", point.index, o.job, o.op));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured() -> RunResult {
        RunResult::from_json(include_str!("../tests/fixtures/results/hw/h200-ep8-ll-128.json"))
            .unwrap()
    }

    #[test]
    fn a_real_result_has_no_problem() {
        assert_eq!(result_problem(&measured()), None);
    }

    #[test]
    fn impossible_latencies_are_named_with_their_op() {
        type Edit = fn(&mut Stats);
        let cases: [(Edit, &str); 5] = [
            (|s| s.mean = 0.0, "latency_us.mean = 0.0: a measured value is finite and > 0"),
            (|s| s.min = -1e308, "latency_us.min = -1e308: a measured value is finite and > 0"),
            (|s| s.p99 = f64::INFINITY, "latency_us.p99 = inf"),
            (|s| s.min = s.max * 2.0, "latency_us: min = "),
            (|s| s.mean = s.max * 1.5, "latency_us: mean = "),
        ];
        for (edit, expected) in cases {
            let mut r = measured();
            edit(&mut r.jobs[0].ops[0].summary.latency_us);
            let why = result_problem(&r).expect(expected);
            assert!(why.starts_with("job "), "{why}");
            assert!(why.contains(", op dispatch: "), "{why}");
            assert!(why.contains(expected), "{why} lacks {expected}");
        }
        let mut r = measured();
        r.jobs[0].ops[1].samples[0].latency_us = -5.0;
        assert!(result_problem(&r).unwrap().contains("samples[0].latency_us = -5.0"));
        let mut r = measured();
        r.jobs[0].ops[0].summary.logical_bw_gbps = -1.0;
        assert!(result_problem(&r).unwrap().contains("logical_bw_gbps = -1.0"));
    }

    /// A failed run's op without samples has zero statistics; an ok one may not.
    #[test]
    fn zeros_belong_to_ops_without_samples_of_runs_that_did_not_pass() {
        let mut r = measured();
        r.jobs[0].ops[0].samples.clear();
        r.jobs[0].ops[0].summary.latency_us = Stats::default();
        assert!(result_problem(&r).unwrap().contains("no timed sample"));
        r.verdict = Verdict::Failed;
        assert_eq!(result_problem(&r), None);
        r.jobs[0].ops[0].summary.latency_us.mean = -1.0;
        assert!(result_problem(&r).is_some());
    }
}
