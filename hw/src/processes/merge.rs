//! Pure parts of a multi-process run: how one outcome per process becomes the run's (the
//! first failure everywhere, or one merged sample), tested without processes.

use std::collections::BTreeMap;
use std::ops::Range;

use eptwin_engine::api::{OpSample, PhaseTime};
use serde::{Deserialize, Serialize};

use crate::error::HwError;

/// One process's op: its sample over its own ranks, and on the host-checked iteration the
/// output digest of each of its ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessOp {
    pub sample: OpSample,
    pub rank_digests: BTreeMap<u32, u64>,
}

/// A process's failure as the others learn it: whether the run is waived (the hardware is not
/// there) or failed, and the line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedError {
    pub waived: bool,
    pub message: String,
}

impl SharedError {
    pub fn of(e: &HwError) -> Self {
        SharedError {
            waived: matches!(e, HwError::Unsupported(_) | HwError::Unavailable(_)),
            message: e.to_string(),
        }
    }
}

/// Who a process is in messages: "process 3 on gpu07 (ranks 6..7)".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessLabel {
    pub process: usize,
    pub host: String,
    pub ranks: Range<usize>,
}

impl std::fmt::Display for ProcessLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "process {} on {} ({})", self.process, self.host, ranks_text(&self.ranks))
    }
}

/// A process's block of ranks: "rank 3", or "ranks 4..7" (the last one included).
pub fn ranks_text(ranks: &Range<usize>) -> String {
    match ranks.len() {
        1 => format!("rank {}", ranks.start),
        _ => format!("ranks {}..{}", ranks.start, ranks.end.saturating_sub(1)),
    }
}

/// The outcome every process takes from everyone's: the lowest-numbered failing process's
/// error (its line alone when every failing process reported the same line, else prefixed with
/// who it is), waived when that process's was; or every value when none failed.
pub fn resolve<T>(
    outcomes: Vec<Result<T, SharedError>>,
    labels: &[ProcessLabel],
) -> Result<Vec<T>, HwError> {
    let failures: Vec<(usize, &SharedError)> =
        outcomes.iter().enumerate().filter_map(|(p, o)| o.as_ref().err().map(|e| (p, e))).collect();
    if let Some(&(first, e)) = failures.first() {
        let same = failures.iter().all(|(_, f)| f.message == e.message);
        let message =
            if same { e.message.clone() } else { format!("{}: {}", labels[first], e.message) };
        return Err(if e.waived {
            HwError::Unsupported(message)
        } else {
            HwError::Processes(message)
        });
    }
    Ok(outcomes.into_iter().map(|o| o.expect("no failures")).collect())
}

/// One sample from every process's: the CUDA-event time and each phase are the slowest
/// process's (an op ends when its last rank's kernel does), bytes are summed (each process
/// counts its own ranks), checks are the union in first-seen order, and failures are kept with
/// the process (and its ranks) that saw them. Rank digests are joined.
pub fn merge_ops(parts: Vec<(ProcessLabel, ProcessOp)>) -> ProcessOp {
    let mut iter = parts.into_iter();
    let (first_label, first) = iter.next().expect("a run has at least one process");
    let single = iter.len() == 0;
    let mut merged = first.sample.clone();
    merged.failures.clear();
    let mut rank_digests = BTreeMap::new();
    let mut phases: Vec<PhaseTime> = Vec::new();
    let all = std::iter::once((first_label, first)).chain(iter);
    for (i, (label, op)) in all.enumerate() {
        let s = op.sample;
        if i > 0 {
            merged.latency_ns = merged.latency_ns.max(s.latency_ns);
            merged.nvlink_bytes += s.nvlink_bytes;
            merged.rdma_bytes += s.rdma_bytes;
            merged.wire_bytes += s.wire_bytes;
            for c in s.checks {
                if !merged.checks.contains(&c) {
                    merged.checks.push(c);
                }
            }
        }
        for p in s.phases {
            match phases.iter_mut().find(|q| q.name == p.name) {
                Some(q) => q.latency_ns = q.latency_ns.max(p.latency_ns),
                None => phases.push(p),
            }
        }
        for f in s.failures {
            merged.failures.push(if single { f } else { format!("{label}: {f}") });
        }
        rank_digests.extend(op.rank_digests);
    }
    merged.phases = phases;
    ProcessOp { sample: merged, rank_digests }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eptwin_engine::api::JobId;
    use eptwin_engine::api::OpKind;

    fn label(p: usize, ranks: Range<usize>) -> ProcessLabel {
        ProcessLabel { process: p, host: format!("h{p}"), ranks }
    }

    fn op(
        latency_ns: f64,
        bytes: u64,
        checks: &[&str],
        failures: &[&str],
        ranks: &[u32],
    ) -> ProcessOp {
        let mut s = OpSample::new(JobId(0), OpKind::Dispatch, 3, false, latency_ns);
        s.nvlink_bytes = bytes;
        s.checks = checks.iter().map(|c| c.to_string()).collect();
        s.failures = failures.iter().map(|c| c.to_string()).collect();
        s.phases = vec![PhaseTime { name: "notify".into(), latency_ns: latency_ns / 10.0 }];
        ProcessOp { sample: s, rank_digests: ranks.iter().map(|&r| (r, 100 + r as u64)).collect() }
    }

    #[test]
    fn samples_merge_as_the_slowest_process_with_summed_bytes() {
        let merged = merge_ops(vec![
            (label(0, 0..4), op(90.0, 1000, &["a", "b"], &[], &[0, 1, 2, 3])),
            (
                label(1, 4..8),
                op(120.0, 500, &["b", "c"], &["rank 5 row 2: payload differs"], &[4, 5, 6, 7]),
            ),
        ]);
        let s = &merged.sample;
        assert_eq!(s.latency_ns, 120.0);
        assert_eq!(s.nvlink_bytes, 1500);
        assert_eq!(s.checks, ["a", "b", "c"]);
        assert_eq!(s.phases, vec![PhaseTime { name: "notify".into(), latency_ns: 12.0 }]);
        assert_eq!(s.failures, ["process 1 on h1 (ranks 4..7): rank 5 row 2: payload differs"]);
        assert_eq!((s.iteration, s.warmup, s.op), (3, false, OpKind::Dispatch));
        assert_eq!(merged.rank_digests.len(), 8);
        assert_eq!(merged.rank_digests[&7], 107);
    }

    #[test]
    fn one_process_is_its_own_sample() {
        let one = op(5.0, 9, &["a"], &["rank 0: wrong"], &[0]);
        let merged = merge_ops(vec![(label(0, 0..1), one.clone())]);
        assert_eq!(merged, one);
    }

    #[test]
    fn the_first_failing_process_decides_for_everyone() {
        let labels = [label(0, 0..2), label(1, 2..4), label(2, 4..6)];
        let ok: Vec<Result<u32, SharedError>> = vec![Ok(1), Ok(2), Ok(3)];
        assert_eq!(resolve(ok, &labels).unwrap(), vec![1, 2, 3]);
        let waived = |m: &str| Err(SharedError { waived: true, message: m.into() });
        let failed = |m: &str| Err(SharedError { waived: false, message: m.into() });
        // The same waiver everywhere is that waiver, word for word.
        let same = vec![waived("no GPU"), waived("no GPU"), waived("no GPU")];
        assert_eq!(
            resolve::<u32>(same, &labels).unwrap_err(),
            HwError::Unsupported("no GPU".into())
        );
        // Different lines: the first failing process's, naming it.
        let mixed = vec![Ok(1), failed("GPU 0: cuMemAlloc failed"), waived("no MPS")];
        let e = resolve::<u32>(mixed, &labels).unwrap_err();
        assert_eq!(
            e,
            HwError::Processes("process 1 on h1 (ranks 2..3): GPU 0: cuMemAlloc failed".into())
        );
        let one = vec![Ok(1), Ok(2), waived("no MPS")];
        assert_eq!(
            resolve::<u32>(one, &labels).unwrap_err(),
            HwError::Unsupported("no MPS".into())
        );
        assert_eq!(label(4, 4..5).to_string(), "process 4 on h4 (rank 4)");
    }
}
