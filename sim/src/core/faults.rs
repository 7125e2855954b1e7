//! The plan's faults at run time (docs/design.md, "Faults"): when ranks start (stragglers),
//! which ranks are down, which NICs drop packets when, the packet loss rate, the masks shrink
//! mode keeps, and what is said when DeepEP's timeouts fire.
//!
//! The simulator runs each op on a fresh machine whose clock starts at 0; a fault's time is
//! from the run's start, so the machine knows where its 0 lies in the run (`origin`).

use eptwin_engine::api::Rank;
use eptwin_engine::api::{Fault, Faults, LaunchKey, NUM_TIMEOUT_CYCLES, Plan, gpu_timeout_ns};

use crate::core::time::{PS_PER_NS, Time};

/// A stretch of time in which a NIC drops every packet it sends or receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NicDown {
    /// Global NIC (the simulator has one per GPU: the GPU's index).
    pub nic: u32,
    pub node: u32,
    pub local: u32,
    /// Machine time; `until = Time::MAX`: for good.
    pub from: Time,
    pub until: Time,
}

/// What the faults mean on one machine (one op, or one session of several jobs).
#[derive(Debug, Clone, Default)]
pub struct FaultRt {
    pub faults: Faults,
    /// Run time at this machine's time 0 (ps).
    pub origin: Time,
    /// DeepEP's device timeout on this GPU (`NUM_TIMEOUT_CYCLES` at `clock_ghz`).
    pub gpu_timeout: Time,
    pub clock_ghz: f64,
    /// Per job: shrink mode's masks, `mask[r × n + s]`: rank `r` masked source `s` (empty until
    /// a rank of the job masks another). They live in the ranks' buffers, so they outlast an op.
    pub masks: Vec<Vec<bool>>,
    pub nics_down: Vec<NicDown>,
    /// Packet loss as a threshold on a 64-bit draw (0: none).
    pub loss_threshold: u64,
}

impl FaultRt {
    /// The faults of `plan` on a machine whose time 0 is `origin` in the run, with the masks
    /// shrink mode kept so far.
    pub fn new(plan: &Plan, origin: Time, masks: Vec<Vec<bool>>) -> FaultRt {
        let faults = plan.faults.clone();
        let gpus_per_node = plan.topology.gpus_per_node;
        let local = |at_ns: u64| (at_ns * PS_PER_NS).saturating_sub(origin);
        let nics_down = faults
            .nics_down()
            // Only a GPU's first NIC carries DeepEP's traffic (the simulator models that one).
            .filter(|&(_, nic, _, _)| nic < gpus_per_node)
            .map(|(node, nic, at, until)| NicDown {
                nic: node * gpus_per_node + nic,
                node,
                local: nic,
                from: local(at),
                until: until.map_or(Time::MAX, |u| {
                    let u = u.saturating_mul(PS_PER_NS);
                    u.saturating_sub(origin)
                }),
            })
            .filter(|d| d.until > 0)
            .collect();
        let rate = faults.loss_rate();
        let loss_threshold = if rate > 0.0 { (rate * 2f64.powi(64)) as u64 } else { 0 };
        let clock_ghz = plan.profile.gpu.clock_ghz;
        FaultRt {
            faults,
            origin,
            gpu_timeout: gpu_timeout_ns(clock_ghz) * PS_PER_NS,
            clock_ghz,
            masks: if masks.len() == plan.jobs.len() {
                masks
            } else {
                vec![Vec::new(); plan.jobs.len()]
            },
            nics_down,
            loss_threshold,
        }
    }

    /// Whether the machine may stall on a fault (a rank or NIC down, packets lost): then a
    /// quiet machine with unfinished ops is DeepEP's timeout, not a model deadlock.
    pub fn can_stall(&self) -> bool {
        self.faults.items.iter().any(|f| {
            matches!(f, Fault::RankDown { .. } | Fault::NicDown { .. } | Fault::PacketLoss { .. })
        })
    }

    /// How late (ps) global rank `rank` launches the op `key` names.
    pub fn start_delay(&self, rank: Rank, key: LaunchKey) -> Time {
        self.faults.start_delay_ns(rank, key).saturating_mul(PS_PER_NS)
    }

    /// Whether global rank `rank` is down by machine time `t`.
    pub fn rank_down(&self, rank: Rank, t: Time) -> bool {
        self.faults
            .rank_down_at_ns(rank)
            .is_some_and(|at| at.saturating_mul(PS_PER_NS) <= self.origin.saturating_add(t))
    }

    /// The `nic_down` window NIC `nic` is in at `t`, if any.
    pub fn nic_down_at(&self, nic: u32, t: Time) -> Option<&NicDown> {
        self.nics_down.iter().find(|d| d.nic == nic && d.from <= t && t < d.until)
    }

    /// Whether rank `r` of `job` masked source `s` (shrink mode).
    #[inline]
    pub fn masked(&self, job: usize, n: u32, r: u32, s: u32) -> bool {
        self.masks.get(job).is_some_and(|m| !m.is_empty() && m[(r * n + s) as usize])
    }

    /// Rank `r` of `job` masks source `s`.
    pub fn mask(&mut self, job: usize, n: u32, r: u32, s: u32) {
        let m = &mut self.masks[job];
        if m.is_empty() {
            *m = vec![false; (n * n) as usize];
        }
        m[(r * n + s) as usize] = true;
    }

    /// The job's ranks some rank masked, ascending.
    pub fn masked_ranks(&self, job: usize, n: u32) -> Vec<u32> {
        let Some(m) = self.masks.get(job).filter(|m| !m.is_empty()) else { return Vec::new() };
        (0..n).filter(|&s| (0..n).any(|r| m[(r * n + s) as usize])).collect()
    }

    /// DeepEP's device timeout in words: "NUM_TIMEOUT_CYCLES = 2e11 cycles ≈ 101.0 s at 1.98 GHz".
    pub fn gpu_timeout_words(&self) -> String {
        format!(
            "NUM_TIMEOUT_CYCLES = {NUM_TIMEOUT_CYCLES} cycles ≈ {:.1} s at {} GHz",
            self.gpu_timeout as f64 / 1e12,
            self.clock_ghz
        )
    }

    /// A machine time as run time in seconds, for messages: "t = 101.010135 s".
    pub fn run_time_words(&self, t: Time) -> String {
        format!("t = {:.6} s", (self.origin.saturating_add(t)) as f64 / 1e12)
    }

    /// The faults that can leave a wait unanswered, in words, for a timeout's message.
    pub fn causes(&self, down_ranks: &[Rank]) -> Vec<String> {
        let mut out = Vec::new();
        for (i, f) in self.faults.items.iter().enumerate() {
            match f {
                Fault::RankDown { ranks, at_ns } => {
                    let hit: Vec<String> = ranks
                        .iter()
                        .filter(|r| down_ranks.contains(r))
                        .map(|r| r.0.to_string())
                        .collect();
                    if !hit.is_empty() {
                        out.push(format!(
                            "rank {} down from t = {:.6} s (fault[{i}] rank_down)",
                            hit.join(", "),
                            *at_ns as f64 / 1e9
                        ));
                    }
                }
                Fault::NicDown { node, nic, at_ns, duration_ns } => {
                    let until = match duration_ns {
                        Some(d) => format!("for {:.6} s", *d as f64 / 1e9),
                        None => "for good".into(),
                    };
                    out.push(format!(
                        "NIC {nic} of node {node} down from t = {:.6} s {until} (fault[{i}] nic_down)",
                        *at_ns as f64 / 1e9
                    ));
                }
                Fault::PacketLoss { rate } => {
                    out.push(format!("packet loss {rate} on the RDMA fabric (fault[{i}])"));
                }
                Fault::Straggler { .. } | Fault::NvlinkDegraded { .. } => {}
            }
        }
        out
    }
}
