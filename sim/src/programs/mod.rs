//! What every op program on the simulated machine shares, DeepEP's (`deepep/`) and the hardware
//! backend's one-GPU kernels' (`hwkernels/`): which op instance a program is ([`Meta`]), the
//! per-rank bookkeeping that becomes its sample ([`Ranks`]), the check that every (token, rank)
//! arrives exactly once ([`Ledger`]) and the channel ring both kinds of kernels flow-control
//! ([`channel_ring::ChannelRing`]); DeepEP's split of tokens into channels is the engine's
//! (`eptwin_engine::api::channel_range`).

pub mod channel_ring;

use eptwin_engine::api::JobId;
use eptwin_engine::api::{DeepEpJob, OpKind, Plan};
use eptwin_engine::api::{OpSample, PhaseTime};

use crate::core::time::Time;

/// Which op instance a program is.
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    pub job: JobId,
    pub op: OpKind,
    pub iteration: u32,
    pub warmup: bool,
}

/// Per-rank kernel bookkeeping shared by the programs: start, end, the sample.
#[derive(Debug, Clone)]
pub struct Ranks {
    /// When each rank's kernel started.
    pub start: Vec<Time>,
    pub end: Vec<Option<Time>>,
    /// The latest time any work of the rank finishes (the kernel ends there).
    pub last: Vec<Time>,
    pub left: u32,
    pub phases: Vec<(String, Vec<Time>)>,
    pub checks: Vec<String>,
    pub failures: Vec<String>,
}

impl Ranks {
    pub fn new(n: u32) -> Ranks {
        Ranks {
            start: vec![0; n as usize],
            end: vec![None; n as usize],
            last: vec![0; n as usize],
            left: n,
            phases: Vec::new(),
            checks: Vec::new(),
            failures: Vec::new(),
        }
    }

    pub fn touch(&mut self, r: u32, t: Time) {
        let l = &mut self.last[r as usize];
        *l = (*l).max(t);
    }

    pub fn begin(&mut self, r: u32, t: Time) {
        self.start[r as usize] = t;
        self.last[r as usize] = t;
    }

    pub fn finish(&mut self, r: u32, t: Time) {
        if self.end[r as usize].is_none() {
            let end = t.max(self.last[r as usize]);
            self.end[r as usize] = Some(end);
            self.left -= 1;
        }
    }

    /// (GPU, global rank, start, end) of every finished rank, for the trace.
    pub fn spans(&self, gpu: &[u32], ranks: &[u32]) -> Vec<(u32, u32, Time, Time)> {
        self.end
            .iter()
            .enumerate()
            .filter_map(|(r, e)| e.map(|e| (gpu[r], ranks[r], self.start[r], e)))
            .collect()
    }

    /// Kernel time of rank `r` so far (for phases).
    pub fn since_start(&self, r: u32, t: Time) -> Time {
        t.saturating_sub(self.start[r as usize])
    }

    pub fn fail(&mut self, what: String) {
        if self.failures.len() < 16 {
            self.failures.push(what);
        }
    }

    pub fn phase(&mut self, name: &str, r: u32, t: Time, n: u32) {
        let i = match self.phases.iter().position(|(p, _)| p == name) {
            Some(i) => i,
            None => {
                self.phases.push((name.to_string(), vec![0; n as usize]));
                self.phases.len() - 1
            }
        };
        self.phases[i].1[r as usize] = t;
    }

    /// The sample: latency = per-rank kernel time averaged over ranks (docs/design.md, DeepEP §17).
    pub fn sample(&self, meta: &Meta, extra_ns: f64) -> OpSample {
        let n = self.end.len().max(1) as f64;
        let mean = self
            .end
            .iter()
            .zip(&self.start)
            .map(|(e, &s)| e.map_or(0, |e| e - s) as f64)
            .sum::<f64>()
            / n;
        let mut s =
            OpSample::new(meta.job, meta.op, meta.iteration, meta.warmup, mean / 1e3 + extra_ns);
        for (name, per_rank) in &self.phases {
            let avg = per_rank.iter().map(|&t| t as f64).sum::<f64>() / n / 1e3;
            s.phases.push(PhaseTime { name: name.clone(), latency_ns: avg });
        }
        s.checks = self.checks.clone();
        s.failures = self.failures.clone();
        s
    }
}

/// The DeepEP job of a plan.
pub fn deepep_job(plan: &Plan, job: JobId) -> &DeepEpJob {
    plan.job(job).deepep().expect("a DeepEP job")
}

/// What every rank must end up holding against what it did: per rank a count and a wrapping
/// sum of `eptwin_engine::api::mix` keys, so "each (token, rank) pair arrives exactly once" is checked without
/// storing the pairs, whatever the arrival order.
#[derive(Clone, Debug)]
pub struct Ledger {
    want_hash: Vec<u64>,
    want_count: Vec<u64>,
    got_hash: Vec<u64>,
    got_count: Vec<u64>,
}

impl Ledger {
    pub fn new(ranks: u32) -> Ledger {
        let n = ranks as usize;
        Ledger {
            want_hash: vec![0; n],
            want_count: vec![0; n],
            got_hash: vec![0; n],
            got_count: vec![0; n],
        }
    }

    /// The routing says rank `at` receives `key`.
    #[inline]
    pub fn expect(&mut self, at: u32, key: u64) {
        let r = at as usize;
        self.want_hash[r] = self.want_hash[r].wrapping_add(key);
        self.want_count[r] += 1;
    }

    /// Rank `at` received `key`.
    #[inline]
    pub fn arrive(&mut self, at: u32, key: u64) {
        let r = at as usize;
        self.got_hash[r] = self.got_hash[r].wrapping_add(key);
        self.got_count[r] += 1;
    }

    /// Fails the op for every rank whose arrivals differ from what was expected; `what` names
    /// the unit counted (e.g. "(token, rank) pairs").
    pub fn check(&self, ranks: &mut Ranks, what: &str) {
        for r in 0..self.want_count.len() {
            if self.got_count[r] != self.want_count[r] || self.got_hash[r] != self.want_hash[r] {
                ranks.fail(format!(
                    "rank {r}: received {} {what}, routing expects {} (or a different set)",
                    self.got_count[r], self.want_count[r]
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use eptwin_engine::api::mix;

    use super::*;

    #[test]
    fn ledger_is_order_independent_and_catches_a_swap() {
        let keys = [mix(0, 1, 0), mix(1, 2, 0), mix(2, 3, 0)];
        let mut ledger = Ledger::new(2);
        for &k in &keys {
            ledger.expect(1, k);
        }
        for &k in keys.iter().rev() {
            ledger.arrive(1, k);
        }
        let mut ranks = Ranks::new(2);
        ledger.check(&mut ranks, "pairs");
        assert!(ranks.failures.is_empty(), "{:?}", ranks.failures);

        // Same count, one token replaced by another: the sum differs.
        let mut wrong = Ledger::new(2);
        wrong.expect(0, keys[0]);
        wrong.arrive(0, keys[1]);
        let mut ranks = Ranks::new(2);
        wrong.check(&mut ranks, "pairs");
        assert_eq!(ranks.failures.len(), 1);
        assert!(ranks.failures[0].contains("rank 0: received 1 pairs, routing expects 1"));
    }
}
