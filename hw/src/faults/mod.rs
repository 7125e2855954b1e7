//! The scenario's `[[fault]]` entries on the hardware (docs/scenario.md, "Faults"; what each
//! does on a GPU: docs/cluster.md, "Faults on the hardware backend").
//!
//! * `straggler`: before each timed launch, after the process barrier, the straggler's
//!   stream runs `fault_delay` (kernels/cuda/sync.cu) for the delay the engine draws for that
//!   rank and launch (`Faults::start_delay_ns`, the simulator's draw). Its CUDA-event start is
//!   recorded after the delay, so its own time does not grow; its peers' kernels wait for its
//!   messages and theirs does.
//! * `rank_down`: the process that runs the rank exits at its first op at or after `at_us`
//!   (wall time from `prepare`), as a crashed rank does; its peers' bounded waits and the
//!   process group's failure relay end the run with the rank named.
//! * `packet_loss`, `nic_down`: in the internode wire (`eptwin_wire::faults`; the job's
//!   `Crossing` carries them to every node's wire).
//! * `nvlink_degraded`: not on the hardware (NVLink lanes cannot be taken down from software).
//!
//! The hooks are narrow: [`OpFaults::check`] at prepare, [`OpFaults::before_op`] before each
//! op, `Devices::launch_delay_ns` consumed by `Devices::barrier_before_launch`, and the wire's
//! `eptwin_wire::faults::FaultyWire` wrapper.

use std::time::Instant;

use eptwin_engine::api::{Fault, Faults, JobPlan, LaunchKey, OpKind, Plan, Rank};

use crate::error::HwError;
use crate::exec::Devices;

/// The faults of one job on this process's ranks.
#[derive(Debug, Clone)]
pub struct OpFaults {
    faults: Faults,
    /// Global rank of each job rank.
    global: Vec<Rank>,
    job: u32,
    warmup: u32,
    ops: Vec<OpKind>,
    /// The job ranks this process runs.
    mine: Vec<u32>,
    started: Instant,
}

#[allow(clippy::disallowed_methods)] // real time: a rank_down's at_us is wall time from prepare
impl OpFaults {
    /// What the hardware cannot inject whatever the placement, as a waiver (`Unsupported`)
    /// naming the fault. Called before placement, so that a waived run compiles and allocates
    /// nothing.
    /// `processes`: how many run the job.
    pub fn refuse_unsupported(plan: &Plan, job: &JobPlan, processes: usize) -> Result<(), HwError> {
        let shrink = job.deepep().is_some_and(|d| d.buffer.enable_shrink);
        for (i, f) in plan.faults.items.iter().enumerate() {
            let refuse =
                |why: String| Err(HwError::Unsupported(format!("fault[{i}] {}: {why}", f.kind())));
            match f {
                Fault::NvlinkDegraded { .. } => {
                    return refuse(
                        "the hardware backend cannot take NVLink lanes down from software \
                         (the simulator models it)"
                            .into(),
                    );
                }
                Fault::RankDown { .. } if shrink => {
                    return refuse(
                        "shrink mode's masks are not in the hardware backend's kernels \
                         (the simulator models enable_shrink)"
                            .into(),
                    );
                }
                Fault::RankDown { .. } if processes < 2 => {
                    return refuse(
                        "a dead rank's process exits, and this process runs every rank: run \
                         with --spawn N (or a launcher) so that the rank has a process of its own"
                            .into(),
                    );
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// [`OpFaults::refuse_unsupported`], then what the placement rules out, as a waiver; `None`
    /// for a plan without faults. `mine`: the job ranks of this process; `devices`: the job
    /// ranks of each of its launches (one per GPU); `processes`: how many run the job.
    pub fn check(
        plan: &Plan,
        job: &JobPlan,
        mine: &[u32],
        devices: &[Vec<u32>],
        processes: usize,
    ) -> Result<Option<OpFaults>, HwError> {
        if plan.faults.is_empty() {
            return Ok(None);
        }
        Self::refuse_unsupported(plan, job, processes)?;
        let global = job.ranks.clone();
        for (i, f) in plan.faults.items.iter().enumerate() {
            let Fault::Straggler { ranks, .. } = f else { continue };
            // Ranks of one launch start together: a late rank needs a launch of its own.
            let late = |r: &u32| ranks.binary_search(&global[*r as usize]).is_ok();
            if let Some(d) = devices.iter().find(|d| d.iter().any(late) && !d.iter().all(late)) {
                return Err(HwError::Unsupported(format!(
                    "fault[{i}] {}: job ranks {d:?} share one launch, and only some of them are \
                     late: run with --spawn N so that each straggler launches on its own",
                    f.kind()
                )));
            }
        }
        Ok(Some(OpFaults {
            faults: plan.faults.clone(),
            global,
            job: job.id.0,
            warmup: job.warmup,
            ops: job.ops.clone(),
            mine: mine.to_vec(),
            started: Instant::now(),
        }))
    }

    /// Whether a straggler needs the `fault_delay` kernel (module `sync`).
    pub fn needs_delay_kernel(plan: &Plan) -> bool {
        plan.faults.items.iter().any(|f| matches!(f, Fault::Straggler { .. }))
    }

    /// Which launch of the job an op is: the engine's key, as the simulator draws it.
    pub fn launch_key(&self, op: OpKind, iteration: u32, warmup: bool) -> LaunchKey {
        let round = if warmup { iteration as u64 } else { self.warmup as u64 + iteration as u64 };
        let op_index = self.ops.iter().position(|&o| o == op).unwrap_or(0) as u32;
        LaunchKey { job: self.job, round, op_index }
    }

    /// The rank of this process that is down by now, with the fault's time (ns).
    pub fn down_rank(&self, elapsed_ns: u64) -> Option<(u32, u64)> {
        self.mine.iter().find_map(|&r| {
            let at = self.faults.rank_down_at_ns(self.global[r as usize])?;
            (elapsed_ns >= at).then_some((r, at))
        })
    }

    /// Each launch's (device's) delay for this op: the most any of its ranks is late (they
    /// are all late or none, [`OpFaults::check`]).
    pub fn delays_ns(&self, devices: &[Vec<u32>], key: LaunchKey) -> Vec<u64> {
        devices
            .iter()
            .map(|ranks| {
                ranks
                    .iter()
                    .map(|&r| self.faults.start_delay_ns(self.global[r as usize], key))
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Before an op: a down rank's process exits (it launches nothing more, as a crashed
    /// rank); a straggler's launch gets its delay.
    pub fn before_op(&self, devs: &mut Devices, op: OpKind, iteration: u32, warmup: bool) {
        let elapsed_ns = self.started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        if let Some((r, at_ns)) = self.down_rank(elapsed_ns) {
            let what = if warmup { "warmup " } else { "" };
            eprintln!(
                "eptwin: rank_down: job rank {r} (global rank {}) is down from t = {:.6} s; its \
                 process exits before its {what}{op} iteration {iteration}",
                self.global[r as usize].0,
                at_ns as f64 / 1e9
            );
            // A crash, not a shutdown: no goodbye to the group, no result.
            std::process::exit(1);
        }
        let devices: Vec<Vec<u32>> = devs.list.iter().map(|d| d.ranks.clone()).collect();
        devs.launch_delay_ns = self.delays_ns(&devices, self.launch_key(op, iteration, warmup));
    }
}

#[cfg(test)]
mod tests;
