//! The low-latency combine's receiving side: the weights a reducing thread applies, the end of a
//! rank's sends, the receive kernel's start and the reduction of the top-k partials.

use super::*;

impl LowLatencyProgram {
    pub(super) fn weight_of(&self, d: u32, t: u32, e: u32) -> f64 {
        let ex = self.routing.experts(d, t);
        let w = self.routing.weights(d, t);
        ex.iter().position(|&x| x == e as i32).map_or(0.0, |k| w[k] as f64)
    }

    pub(super) fn combine_send_done(&mut self, core: &mut Core, h: u32) {
        let done = self.send_done[h as usize].max(core.now);
        self.ranks.touch(h, done);
        self.ranks.phase("send", h, self.ranks.since_start(h, done), self.n);
        // The receive phase follows in the same blocks: each group waits for its expert's flag,
        // then the kernel's one grid sync (`combine_reduce`); DeepEP's combine has no sync
        // between its send and receive phases (internode_ll.cu), unlike its dispatch.
        core.wake_at(done, self.me, self.a_recv_start(h));
    }

    pub(super) fn combine_recv_start(&mut self, core: &mut Core, r: u32) {
        if self.faulty {
            self.wait_flags_per_source(core, r);
        } else if core.wait(self.flag_ctr + r, self.experts as u64, self.me, self.a_flags(r)) {
            self.combine_reduce(core, r);
        }
    }

    /// All flags in: grid sync, then every block reduces its tokens' top-k partials.
    pub(super) fn combine_reduce(&mut self, core: &mut Core, r: u32) {
        self.discount_masked_holders(r);
        let delivered = core.value(self.cdata_ctr + r);
        if delivered != self.expected_msgs[r as usize] && !self.masks_any(r) {
            self.ranks.fail(format!(
                "rank {r}: all flags arrived but {delivered} of {} combine messages (per-QP order broken)",
                self.expected_msgs[r as usize]
            ));
        }
        let start = core.now
            + if self.hook { self.costs.ll_combine_recv_fixed } else { self.costs.grid_sync };
        let mut end = start;
        // DeepEP launches the combine with a block per token up to the GPU's SMs when that is
        // more than its send groups need (128 blocks at 128 tokens on an H100,
        // results/h100/deepep-one-rank/kernels-t128.json); a block reduces its tokens in turn.
        let reducers = self.blocks.max(self.tokens.min(core.params.sm_count.max(1)));
        let mut block_end = vec![start; reducers as usize];
        let mut bytes_total = 0;
        for t in 0..self.tokens {
            let ti = (r * self.tokens + t) as usize;
            let live = |e: &i32| *e >= 0 && !self.is_masked(r, *e as u32 / self.local);
            let valid = self.routing.experts(r, t).iter().filter(|e| live(e)).count() as u32;
            let wsum: f64 = self
                .routing
                .experts(r, t)
                .iter()
                .zip(self.routing.weights(r, t))
                .filter(|(e, _)| live(e))
                .map(|(_, &w)| w as f64)
                .sum();
            let want = wsum * (r + 1) as f64;
            if self.acc_n[ti] != valid || (self.acc[ti] - want).abs() > 1e-9 * want.abs().max(1.0) {
                self.ranks.fail(format!(
                    "rank {r} token {t}: combined {} expert outputs (weighted sum {}), expected {valid} ({want})",
                    self.acc_n[ti], self.acc[ti]
                ));
            }
            // Read the partials, write the combined BF16 row.
            let bytes = self.msg_bytes * (valid as u64 + 1);
            bytes_total += bytes;
            // Each thread adds the token's partials one load after another.
            let b = (t % reducers) as usize;
            block_end[b] += self.costs.ll_reduce_load * valid as u64;
            end = end.max(block_end[b]);
        }
        let (_, hbm_end) =
            core.gpus.gpus[self.gpu[r as usize] as usize].hbm.reserve(start, bytes_total / 2);
        let end = end.max(hbm_end);
        if self.hook {
            // The receive kernel: its fixed part, then the reduction.
            self.ranks.phase("recv", r, end - core.now, self.n);
        }
        self.ranks.touch(r, end);
        core.wake_at(end, self.me, self.a_final(r));
    }
}
