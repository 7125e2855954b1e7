//! The low-latency kernels under faults (docs/design.md, "Faults"; DeepEP §13): their
//! receive waits time out after `NUM_TIMEOUT_CYCLES`; without shrink mode the kernel traps
//! with DeepEP's warning, with it (`enable_shrink`) the waiting rank masks the silent source
//! in its mask buffer, skips it from then on (no sends to it, no waits for it, its experts'
//! outputs left out of the combine) and goes on.

use super::LowLatencyProgram;
use crate::core::world::{Program, Stuck, Trap};
use crate::core::{Core, ProgId};

impl LowLatencyProgram {
    /// Whether rank `r` skips rank `s` (shrink mode's mask; never without one).
    #[inline]
    pub(super) fn is_masked(&self, r: u32, s: u32) -> bool {
        !self.masked.is_empty() && self.masked[(r * self.n + s) as usize]
    }

    /// Rank `r` masks `s`, here and in the run's masks (they outlast the op).
    fn mask(&mut self, core: &mut Core, r: u32, s: u32) {
        if self.masked.is_empty() {
            self.masked = vec![false; (self.n * self.n) as usize];
        }
        self.masked[(r * self.n + s) as usize] = true;
        core.faults.mask(self.job, self.n, r, s);
    }

    /// Rank `r` did not launch this op (it is down): with shrink mode the others go on
    /// without it once they masked it; without, the op never completes.
    pub(super) fn rank_absent(&mut self, r: u32) {
        self.absent[r as usize] = true;
        if self.shrink {
            self.ranks.left -= 1;
        }
    }

    /// Dispatch: rank `r`'s receive group `g` skips a masked source (no tokens: DeepEP's
    /// count of -1).
    pub(super) fn skip_group(&mut self, core: &mut Core, r: u32, g: u32) {
        if !self.group_done.is_empty() {
            let done = &mut self.group_done[(r * self.experts + g) as usize];
            if std::mem::replace(done, true) {
                return;
            }
        }
        self.group_finished(core, r);
    }

    /// Combine with per-source flags: rank `r` waits for each unmasked source's flags in turn
    /// (one per local expert of the source), then reduces.
    pub(super) fn wait_flags_per_source(&mut self, core: &mut Core, r: u32) {
        if self.flag_next[r as usize] == u32::MAX {
            return; // reduced already: a masked source's flags came after all
        }
        while self.flag_next[r as usize] < self.n {
            let h = self.flag_next[r as usize];
            let counter = self.flag_ctr + r * self.n + h;
            if !self.is_masked(r, h)
                && !core.wait(counter, self.local as u64, self.me, self.a_flags(r))
            {
                return;
            }
            self.flag_next[r as usize] += 1;
        }
        // Past the last source: reduce once.
        self.flag_next[r as usize] = u32::MAX;
        self.combine_reduce(core, r);
    }

    /// Combine: what holders rank `r` masked after they sent to it carried is left out of
    /// its check (their outputs are not reduced).
    pub(super) fn discount_masked_holders(&mut self, r: u32) {
        if self.masked.is_empty() || self.sent_to.is_empty() {
            return;
        }
        let n = self.n;
        let holders: Vec<u32> = (0..n)
            .filter(|&h| self.is_masked(r, h) && self.sent_to[(h * n + r) as usize])
            .collect();
        for h in holders {
            for t in 0..self.tokens {
                let ti = (r * self.tokens + t) as usize;
                for (k, &e) in self.routing.experts(r, t).iter().enumerate() {
                    if e >= 0 && e as u32 / self.local == h {
                        let w = self.routing.weights(r, t)[k] as f64;
                        self.acc[ti] -= w * (r + 1) as f64;
                        self.acc_n[ti] -= 1;
                    }
                }
            }
        }
    }

    /// Whether rank `r` masked any source (its combine then reduces without them, and the
    /// count of what arrived is not checked: a masked source may have delivered part).
    pub(super) fn masks_any(&self, r: u32) -> bool {
        !self.masked.is_empty() && (0..self.n).any(|s| self.is_masked(r, s))
    }

    /// The source rank and local expert a stuck wait of rank `r` is for.
    fn stuck_source(&self, w: &Stuck) -> Option<(u32, u32, u32)> {
        let nb = self.n * self.blocks;
        let ng = self.n * self.experts;
        let a = w.actor;
        if self.dispatch && a >= nb && a < nb + ng {
            let (r, g) = ((a - nb) / self.experts, (a - nb) % self.experts);
            return Some((r, g / self.local, g % self.local));
        }
        if !self.dispatch && a >= nb + ng + 2 * self.n && a < nb + ng + 3 * self.n {
            let r = a - nb - ng - 2 * self.n;
            let h = *self.flag_next.get(r as usize)?;
            return (h < self.n).then_some((r, h, 0));
        }
        None
    }

    /// The machine went quiet with this op waiting (docs/design.md, "Faults"): every stuck
    /// receive wait times out. Shrink mode masks each silent source and finishes the waits;
    /// otherwise the earliest wait traps with DeepEP's warning.
    pub(super) fn time_out(
        &mut self,
        core: &mut Core,
        me: ProgId,
        stuck: &[Stuck],
        down: &[u32],
    ) -> Result<(), Trap> {
        let op = if self.dispatch { "dispatch" } else { "combine" };
        let waits: Vec<(Stuck, (u32, u32, u32))> =
            stuck.iter().filter_map(|w| Some((*w, self.stuck_source(w)?))).collect();
        // Shrink mode goes on only past waits it can mask (none: every rank is down).
        if !self.shrink || waits.len() != stuck.len() || !self.faulty || waits.is_empty() {
            let Some(&(w, (r, s, le))) = waits.iter().min_by_key(|(w, _)| (w.since, w.actor))
            else {
                let describe = |a| self.describe(a);
                return Err(crate::core::world::device_trap(core, stuck, down, &describe));
            };
            let global = |x: u32| self.global[x as usize];
            let mode = if self.shrink { "" } else { " (no shrink mode: the kernel traps)" };
            return Err(Trap {
                at: w.since + core.faults.gpu_timeout,
                message: format!(
                    "Warning: DeepEP timeout for {op} receive, rank {}, local_expert_idx {le}, \
                     src_rank {}{mode} ({})",
                    global(r),
                    global(s),
                    core.faults.gpu_timeout_words()
                ),
            });
        }
        for (_, (r, s, _)) in waits {
            if !self.is_masked(r, s) {
                self.mask(core, r, s);
            }
            if self.dispatch {
                for le in 0..self.local {
                    self.skip_group(core, r, s * self.local + le);
                }
            } else {
                core.wake_at(core.now, me, self.a_flags(r));
            }
        }
        Ok(())
    }
}
