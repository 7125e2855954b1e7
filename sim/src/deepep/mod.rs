//! DeepEP V1's algorithms as programs on the simulated machine (docs/design.md, DeepEP §8–§12): the
//! normal intranode and internode (RDMA once per node, NVLink forwarding) kernels and the
//! low-latency kernels, with DeepEP's flow control expressed as actors waiting on counters.

pub mod internode;
pub mod intranode;
pub mod ll;
pub mod ring;

use eptwin_engine::ids::JobId;
use eptwin_engine::plan::{DeepEpJob, EpMode, OpKind, PeerPath, Plan};
use eptwin_engine::transport::{OpSample, PhaseTime};

use crate::core::Core;
use crate::core::time::{Rate, Time};
use crate::core::world::Program;
use crate::gpu::PathKind;
use crate::hwkernels;

pub fn program(
    plan: &Plan,
    core: &mut Core,
    job: JobId,
    op: OpKind,
    iteration: u32,
    warmup: bool,
) -> Box<dyn Program> {
    let d = plan.job(job).deepep().expect("a DeepEP job");
    let meta = Meta { job, op, iteration, warmup };
    // Ranks sharing one GPU run the hardware backend's one-GPU kernels (DeepEP has none).
    if hwkernels::applies(core, &meta) {
        match d.mode {
            EpMode::LowLatency => return Box::new(hwkernels::LlProgram::new(plan, core, meta)),
            // At most 8 ranks on a GPU with thread-block clusters: the rings in shared memory.
            EpMode::Intranode if hwkernels::cluster::applies(plan, core, &meta) => {
                return Box::new(hwkernels::cluster::ClusterProgram::new(plan, core, meta));
            }
            EpMode::Intranode => return Box::new(hwkernels::NormalProgram::new(plan, core, meta)),
            EpMode::Internode => {}
        }
    }
    match d.mode {
        EpMode::LowLatency => Box::new(ll::LlProgram::new(plan, core, meta)),
        EpMode::Intranode => Box::new(intranode::IntranodeProgram::new(plan, core, meta)),
        EpMode::Internode => Box::new(internode::InternodeProgram::new(plan, core, meta)),
    }
}

/// Which op instance a program is.
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    pub job: JobId,
    pub op: OpKind,
    pub iteration: u32,
    pub warmup: bool,
}

/// How a rank reaches another in a DeepEP kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A copy: device-local, NVLink or PCIe peer-to-peer.
    Copy(PathKind),
    /// RDMA through the NICs.
    Rdma,
}

/// The path NVSHMEM gives a low-latency kernel between two job ranks (docs/design.md, DeepEP §11,
/// §15): itself always by pointer; a mapped peer (P2P allowed; across nodes only with MNNVL) by
/// stores; everyone else through the NIC.
pub fn ll_route(plan: &Plan, job: JobId, a: u32, b: u32) -> Route {
    let j = plan.job(job);
    if a == b {
        return Route::Copy(PathKind::Local);
    }
    let (ra, rb) = (j.ranks[a as usize], j.ranks[b as usize]);
    let topo = &plan.topology;
    let p2p = !j.nvshmem.disable_p2p;
    match topo.rank_path(ra, rb) {
        PeerPath::SameGpu if p2p => Route::Copy(PathKind::Local),
        PeerPath::Nvlink => {
            let cross_node = topo.node_of_rank(ra) != topo.node_of_rank(rb);
            if p2p && !(cross_node && j.nvshmem.disable_mnnvl) {
                Route::Copy(PathKind::Nvlink)
            } else {
                Route::Rdma
            }
        }
        PeerPath::Pcie if p2p => Route::Copy(PathKind::Pcie),
        _ => Route::Rdma,
    }
}

/// The path a normal kernel's CUDA-IPC copy takes between two ranks of one DeepEP node.
pub fn ipc_path(plan: &Plan, job: JobId, a: u32, b: u32) -> PathKind {
    let j = plan.job(job);
    if a == b {
        return PathKind::Local;
    }
    match plan.topology.rank_path(j.ranks[a as usize], j.ranks[b as usize]) {
        PeerPath::SameGpu => PathKind::Local,
        PeerPath::Nvlink => PathKind::Nvlink,
        // CUDA IPC needs peer access; without NVLink it goes over PCIe.
        PeerPath::Pcie | PeerPath::Rdma => PathKind::Pcie,
    }
}

/// GPU-side rates and costs every DeepEP program uses (from the profile).
#[derive(Debug, Clone, Copy)]
pub struct GpuCosts {
    /// One SM's copy throughput, shared by the warps that copy on it.
    pub sm: Rate,
    /// One warp's copy throughput on its own (its memory-level parallelism).
    pub warp: Rate,
    pub launch: Time,
    pub flag: Time,
    pub grid_sync: Time,
    pub per_token: Time,
    pub ll_signal: Time,
    pub ll_recv_per_msg: Time,
    /// Fixed GPU time of each low-latency dispatch kernel launch.
    pub ll_dispatch_fixed: Time,
    /// Fixed GPU time of each low-latency combine kernel launch.
    pub ll_combine_fixed: Time,
    pub wqe_post: Time,
    pub notify: Time,
    /// Fraction of an SM each of the kernel's blocks gets: co-located ranks (ranks_per_gpu)
    /// whose blocks together exceed the GPU's SMs share them.
    pub sm_share: f64,
    ranks_per_gpu: u32,
    sm_count: u32,
}

impl GpuCosts {
    pub fn new(plan: &Plan, core: &Core) -> GpuCosts {
        let p = &core.params;
        let prof = &p.profile;
        let ranks_per_gpu = plan.topology.ranks_per_gpu.max(1) as f64;
        GpuCosts {
            sm: p.sm_copy_rate,
            warp: Rate::from_gbps(prof.gpu.warp_copy_bw_gbps),
            launch: p.kernel_launch,
            flag: p.flag_latency,
            grid_sync: crate::core::time::ns(prof.gpu.grid_sync_ns),
            per_token: crate::core::time::ns(prof.deepep.per_token_issue_ns),
            ll_signal: crate::core::time::ns(prof.deepep.ll_signal_ns),
            ll_recv_per_msg: crate::core::time::ns(prof.deepep.ll_recv_per_msg_ns),
            ll_dispatch_fixed: crate::core::time::ns(prof.deepep.ll_dispatch_fixed_ns),
            ll_combine_fixed: crate::core::time::ns(prof.deepep.ll_combine_fixed_ns),
            wqe_post: p.wqe_post,
            notify: crate::core::time::ns(prof.deepep.notify_host_roundtrip_ns),
            sm_share: 1.0,
            ranks_per_gpu: ranks_per_gpu as u32,
            sm_count: p.sm_count.max(1),
        }
    }

    /// The costs for a kernel of `blocks` blocks per rank: when the co-located ranks' blocks
    /// exceed the GPU's SMs, every SM (and warp) rate scales down by the oversubscription.
    pub fn for_blocks(mut self, blocks: u32) -> GpuCosts {
        let wanted = self.ranks_per_gpu.max(1) as f64 * blocks.max(1) as f64;
        self.sm_share = (self.sm_count as f64 / wanted).min(1.0);
        if self.sm_share < 1.0 {
            let scale = |r: Rate| Rate::from_gbps(r.gbps() * self.sm_share);
            self.sm = scale(self.sm);
            self.warp = scale(self.warp);
        }
        self
    }

    /// Copy rate of one of `warps` warps sharing an SM.
    pub fn warp_rate(&self, warps: u32) -> Rate {
        self.warp.slower(self.sm.shared(warps))
    }

    /// Copy rate of a group of `warps` warps on an SM where `active` warps copy at once.
    pub fn group_rate(&self, warps: u32, active: u32) -> Rate {
        let per = self.warp.slower(self.sm.shared(active.max(warps)));
        Rate::from_gbps(per.gbps() * warps.max(1) as f64)
    }
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

    /// The sample: latency = per-rank kernel time averaged over the ranks that ran it
    /// (docs/design.md, DeepEP §17; a rank down or masked runs nothing).
    pub fn sample(&self, meta: &Meta, extra_ns: f64) -> OpSample {
        let n = self.end.iter().filter(|e| e.is_some()).count().max(1) as f64;
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

/// Tokens `[start, end)` of channel `c` when `tokens` are split into `channels` contiguous
/// ranges, as DeepEP's normal kernels split them (`get_channel_task_range`).
#[inline]
pub fn channel_range(tokens: u32, channels: u32, c: u32) -> (u32, u32) {
    let per = tokens.div_ceil(channels);
    let start = (c * per).min(tokens);
    (start, (start + per).min(tokens))
}

/// What every rank must end up holding against what it did: per rank a count and a wrapping
/// sum of `eptwin_engine::rng::mix` keys, so "each (token, rank) pair arrives exactly once" is checked without
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
    use eptwin_engine::rng::mix;

    use super::*;

    #[test]
    fn channel_ranges_cover_the_tokens_once() {
        for (tokens, channels) in [(0, 4), (7, 3), (4096, 12), (5, 8)] {
            let mut next = 0;
            for c in 0..channels {
                let (lo, hi) = channel_range(tokens, channels, c);
                assert_eq!(lo, next.min(tokens));
                assert!(hi >= lo);
                next = hi;
            }
            assert_eq!(next, tokens);
        }
    }

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
