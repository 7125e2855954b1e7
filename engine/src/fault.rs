//! Faults a scenario injects (`[[fault]]`, docs/scenario.md, "Faults"), typed and resolved for
//! the backends, and the DeepEP timeouts that turn a fault into an error (docs/design.md,
//! DeepEP §13).
//!
//! Everything here is a pure function of the plan: a straggler's delay for one rank and one
//! op is drawn from the scenario's seed with the frozen PRNG, so the simulator and the
//! hardware delay the same launches by the same amounts.

use crate::ids::Rank;
use crate::rng::Rng;

/// `NUM_TIMEOUT_CYCLES` (configs.cuh): DeepEP's device spin-waits give up after this many
/// `clock64()` cycles (DeepEP §2, §13).
pub const NUM_TIMEOUT_CYCLES: u64 = 200_000_000_000;
/// `NUM_CPU_TIMEOUT_SECS` (configs.cuh): the host's wait for the notify kernel's receive counts
/// (normal mode) gives up after this many seconds (DeepEP §2, §13).
pub const NUM_CPU_TIMEOUT_SECS: u64 = 100;

/// The longest straggler delay a scenario may give (1 s): DeepEP's kernels wait ≈ 100 s before
/// they time out, and a rank that never comes is a `rank_down`.
pub const MAX_STRAGGLER_DELAY_US: f64 = 1e6;
/// The latest `at_us` (and longest `duration_us`) of a fault: 1,000 s of simulated time.
pub const MAX_FAULT_TIME_US: f64 = 1e9;

/// One fault of the run.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// These ranks launch every op late (a slow host, a late CUDA launch): their peers wait
    /// for their messages.
    Straggler { ranks: Vec<Rank>, delay: Delay },
    /// These ranks stop: from the first op they would launch at or after `at_ns` (simulated
    /// time from the run's start) they launch nothing more.
    RankDown { ranks: Vec<Rank>, at_ns: u64 },
    /// NIC `nic` of node `node` (global NIC `node × NICs per node + nic`) drops every packet
    /// from `at_ns` on, for `duration_ns` (`None`: for good).
    NicDown { node: u32, nic: u32, at_ns: u64, duration_ns: Option<u64> },
    /// Every RDMA data packet is lost with probability `rate`, drawn from the seed.
    PacketLoss { rate: f64 },
    /// A node's NVLink runs at `fraction` of its bandwidth (lanes down).
    NvlinkDegraded { node: u32, fraction: f64 },
}

impl Fault {
    /// The `kind` the scenario names it by.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Straggler { .. } => "straggler",
            Fault::RankDown { .. } => "rank_down",
            Fault::NicDown { .. } => "nic_down",
            Fault::PacketLoss { .. } => "packet_loss",
            Fault::NvlinkDegraded { .. } => "nvlink_degraded",
        }
    }
}

/// A straggler's delay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Delay {
    Fixed {
        ns: u64,
    },
    /// Drawn per (rank, op) from the seed: approximately normal (the Irwin–Hall sum of 12
    /// uniforms, ±6 sd at most, basic IEEE operations only so every machine draws the same
    /// value), clipped at 0.
    Normal {
        mean_ns: f64,
        sd_ns: f64,
    },
}

/// Which launch a delay is drawn for: the job, the round (warmup rounds first, then the timed
/// ones: `round = warmup + iteration` for a timed op) and the op's position in the round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchKey {
    pub job: u32,
    pub round: u64,
    pub op_index: u32,
}

/// The faults of a plan, with the seed they draw from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    pub items: Vec<Fault>,
    /// The first DeepEP job's workload seed (1 when there is none): straggler delays and packet
    /// drops are drawn from it.
    pub seed: u64,
}

impl Faults {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// How late global rank `rank` launches the op `key` names, in ns (0 for a rank no
    /// straggler names; the delays of several stragglers naming it add).
    pub fn start_delay_ns(&self, rank: Rank, key: LaunchKey) -> u64 {
        let mut total = 0u64;
        for (i, f) in self.items.iter().enumerate() {
            let Fault::Straggler { ranks, delay } = f else { continue };
            if ranks.binary_search(&rank).is_err() {
                continue;
            }
            total = total.saturating_add(match *delay {
                Delay::Fixed { ns } => ns,
                Delay::Normal { mean_ns, sd_ns } => {
                    let stream = (i as u64) << 48 ^ (key.job as u64) << 32 ^ rank.0 as u64;
                    let draw_key = key.round.wrapping_mul(1 << 16) ^ key.op_index as u64;
                    let mut rng = Rng::new(self.seed ^ draw_key.wrapping_mul(0x9E37_79B9), stream);
                    let z = (0..12).map(|_| rng.next_f64()).sum::<f64>() - 6.0;
                    let ns = mean_ns + sd_ns * z;
                    if ns > 0.0 { ns.round() as u64 } else { 0 }
                }
            });
        }
        total
    }

    /// When global rank `rank` stops (the earliest `at_ns` of the `rank_down` faults naming
    /// it), `None` when it never does.
    pub fn rank_down_at_ns(&self, rank: Rank) -> Option<u64> {
        self.items
            .iter()
            .filter_map(|f| match f {
                Fault::RankDown { ranks, at_ns } if ranks.binary_search(&rank).is_ok() => {
                    Some(*at_ns)
                }
                _ => None,
            })
            .min()
    }

    /// The packet loss rate on the RDMA fabric (0 without a `packet_loss` fault).
    pub fn loss_rate(&self) -> f64 {
        self.items
            .iter()
            .find_map(|f| match f {
                Fault::PacketLoss { rate } => Some(*rate),
                _ => None,
            })
            .unwrap_or(0.0)
    }

    /// The share of its NVLink bandwidth node `node` keeps (1 when no fault degrades it).
    pub fn nvlink_fraction(&self, node: u32) -> f64 {
        self.items
            .iter()
            .filter_map(|f| match f {
                Fault::NvlinkDegraded { node: n, fraction } if *n == node => Some(*fraction),
                _ => None,
            })
            .fold(1.0, f64::min)
    }

    /// The `nic_down` faults: (node, nic, at, until), `until = None` for good.
    pub fn nics_down(&self) -> impl Iterator<Item = (u32, u32, u64, Option<u64>)> + '_ {
        self.items.iter().filter_map(|f| match f {
            Fault::NicDown { node, nic, at_ns, duration_ns } => {
                Some((*node, *nic, *at_ns, duration_ns.map(|d| at_ns.saturating_add(d))))
            }
            _ => None,
        })
    }
}

/// DeepEP's device spin-wait timeout in ns on a GPU clocked at `clock_ghz`:
/// `NUM_TIMEOUT_CYCLES` cycles of `clock64()` (≈ 101 s at 1.98 GHz).
pub fn gpu_timeout_ns(clock_ghz: f64) -> u64 {
    (NUM_TIMEOUT_CYCLES as f64 / clock_ghz.max(1e-3)).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn straggler(delay: Delay) -> Faults {
        Faults { items: vec![Fault::Straggler { ranks: vec![Rank(3)], delay }], seed: 7 }
    }

    fn key(round: u64) -> LaunchKey {
        LaunchKey { job: 0, round, op_index: 0 }
    }

    #[test]
    fn a_fixed_delay_applies_to_its_ranks_only() {
        let f = straggler(Delay::Fixed { ns: 50_000 });
        assert_eq!(f.start_delay_ns(Rank(3), key(0)), 50_000);
        assert_eq!(f.start_delay_ns(Rank(2), key(0)), 0);
    }

    #[test]
    fn normal_delays_are_deterministic_vary_per_op_and_have_the_mean() {
        let f = straggler(Delay::Normal { mean_ns: 5_000.0, sd_ns: 3_000.0 });
        let draws: Vec<u64> = (0..4000).map(|r| f.start_delay_ns(Rank(3), key(r))).collect();
        assert_eq!(draws, (0..4000).map(|r| f.start_delay_ns(Rank(3), key(r))).collect::<Vec<_>>());
        assert!(draws.windows(2).any(|w| w[0] != w[1]));
        let mean = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
        // Clipping at 0 lifts the mean a little (≈ 0.2 sd below the mean is cut).
        assert!((mean - 5_000.0).abs() < 300.0, "mean {mean}");
        // Frozen: the simulator's results and the hardware's launches depend on these values.
        assert_eq!(&draws[..4], &[4149, 4599, 2737, 8253]);
    }

    #[test]
    fn timeouts_follow_the_clock() {
        assert_eq!(gpu_timeout_ns(2.0), 100_000_000_000);
        assert_eq!(gpu_timeout_ns(1.98), 101_010_101_010);
    }
}
