//! V2 combine: the scale-up warps (hybrid) or combine warps (direct), and the hybrid forward
//! warps that reduce and put.

use eptwin_engine::api::{SCALEUP_UPDATE_INTERVAL, mix};

use super::ElasticProgram;
use crate::core::{Action, Core};

impl ElasticProgram {
    /// Scale-up warp `x` = (rank, channel). Hybrid: one round sends the next partial of every
    /// destination forwarder with partials left (round robin), each loaded and stored over
    /// NVLink after the previous store landed; tails published every 3 rounds. Direct: the
    /// warp's share of the received tokens goes back to each token's source.
    pub(super) fn scaleup_send(&mut self, core: &mut Core, x: u32) {
        let xi = x as usize;
        if self.phase[xi] == 1 {
            if core.value(self.landed + x) < self.issued_land[xi] {
                return;
            }
            self.phase[xi] = 0;
        }
        if self.phase[xi] == 2 {
            // The partial's TMA load landed: store it to its forwarder (or source).
            if core.now < self.load_at[xi] {
                return;
            }
            let (r, dst) = (x / self.e.num_channels, self.cur[xi].0);
            let done = Action::Add { counter: self.landed + x, delta: 1 };
            let rdma = !self.e.hybrid && !self.same_nvl(dst, r);
            let end =
                self.copy(core, core.now, r, if rdma { r } else { dst }, self.tok_bytes, done);
            if rdma {
                let c = x % self.e.num_channels;
                self.put(core, end, r, dst, c, self.tok_bytes, false, Action::None);
            }
            self.issued_land[xi] += 1;
            self.phase[xi] = 1;
            if core.wait(self.landed + x, self.issued_land[xi], self.me, x) {
                core.wake_at(core.now, self.me, x);
            }
            return;
        }
        if !self.e.hybrid {
            self.direct_combine_token(core, x);
            return;
        }
        let (ch, su) = (self.e.num_channels, self.e.num_scaleup_ranks);
        let (r, c) = (x / ch, x % ch);
        let m = self.domain(r);
        let base = xi * su as usize;
        // Next destination with partials left, round robin; a round ends when it wraps.
        let start = self.rr[xi];
        let pick = (0..su).map(|k| (start + k) % su).find(|&j| {
            (self.lpos[base + j as usize] as usize) < self.order.lists[base + j as usize].len()
        });
        let Some(j) = pick else {
            self.publish_tails(core, r, c);
            self.worker_done(core, r);
            return;
        };
        // A round ends when the round robin passes its last destination again.
        if self.last_j[xi].is_some_and(|prev| j <= prev) {
            self.end_round(core, r, c);
        }
        self.last_j[xi] = Some(j);
        self.rr[xi] = (j + 1) % su;
        self.lpos[base + j as usize] += 1;
        self.load_partial(core, x, self.rank(m, j));
    }

    /// Scale-up warp `x` loads its next partial (for `dst`) into shared memory.
    fn load_partial(&mut self, core: &mut Core, x: u32, dst: u32) {
        let xi = x as usize;
        self.cur[xi] = (dst, 0);
        self.load_at[xi] = core.now + self.rates.fill + self.rates.tma.time(self.tok_bytes);
        self.phase[xi] = 2;
        core.wake_at(self.load_at[xi], self.me, x);
    }

    /// A round of the scale-up warp ended: every 3rd publishes the tails.
    fn end_round(&mut self, core: &mut Core, r: u32, c: u32) {
        let xi = self.rc(r, c);
        self.rounds[xi] += 1;
        if self.rounds[xi].is_multiple_of(SCALEUP_UPDATE_INTERVAL) {
            self.publish_tails(core, r, c);
        }
    }

    /// `st.release.sys` of the partials sent so far to each destination forwarder's tail.
    fn publish_tails(&mut self, core: &mut Core, r: u32, c: u32) {
        let su = self.e.num_scaleup_ranks;
        let (m, i) = (self.domain(r), r % su);
        let base = self.rc(r, c) * su as usize;
        for j in 0..su {
            let sent = self.lpos[base + j as usize];
            let delta = sent - self.published[base + j as usize];
            if delta == 0 {
                continue;
            }
            self.published[base + j as usize] = sent;
            let f = self.rank(m, j);
            let tail = self.tails + (self.rc(f, c) * su as usize + i as usize) as u32;
            core.act_at(core.now + self.rates.flag, Action::Add { counter: tail, delta });
        }
    }

    /// Forward warp `y` = (rank, channel), hybrid combine: the next entry of its dispatch
    /// order once every partial is in, reduced with SM loads, stored to the send buffer and
    /// put to the source domain's GPU (or kept, for the own domain).
    pub(super) fn forward_reduce(&mut self, core: &mut Core, y: u32) {
        let yi = y as usize;
        if self.fphase[yi] >= 2 {
            return;
        }
        let (ch, su) = (self.e.num_channels, self.e.num_scaleup_ranks);
        let rc = self.n * ch;
        let (f, c) = (y / ch, y % ch);
        if self.fphase[yi] == 1 {
            if core.now < self.fload_at[yi] {
                return;
            }
            self.send_reduced(core, y);
            self.fphase[yi] = 0;
        }
        let k = self.fpos[yi] as usize;
        if k >= self.order.fwd[yi].len() {
            self.close(core, y);
            return;
        }
        let entry = self.order.fwd[yi][k].clone();
        let base = yi * su as usize;
        for &d in &entry.dsts {
            let need = self.fcnt[base + d as usize] as u64 + 1;
            let tail = self.tails + (base + d as usize) as u32;
            if !core.wait(tail, need, self.me, rc + y) {
                return;
            }
        }
        for &d in &entry.dsts {
            self.fcnt[base + d as usize] += 1;
        }
        self.fpos[yi] += 1;
        let read = entry.dsts.len() as u64 * self.tok_bytes;
        let reduced = core.now + self.rates.reduce.time(read);
        self.ledger.arrive(entry.src, mix(entry.src, entry.token, 1 + self.domain(f)));
        self.fcur[yi] = (entry.src, 0);
        self.fphase[yi] = 1;
        self.fload_at[yi] = reduced;
        let _ = c;
        core.wake_at(reduced, self.me, rc + y);
    }

    /// Forward warp `y` reduced its token: store it to the send buffer and put it to the
    /// source domain's GPU (the own domain's is stored in place).
    fn send_reduced(&mut self, core: &mut Core, y: u32) {
        let yi = y as usize;
        let (ch, su) = (self.e.num_channels, self.e.num_scaleup_ranks);
        let (f, c) = (y / ch, y % ch);
        let g = self.gpu[f as usize];
        let src = self.fcur[yi].0;
        let ms = self.domain(src);
        let end = core.copy(
            core.now,
            g,
            g,
            crate::gpu::PathKind::Local,
            self.tok_bytes,
            self.rates.tma,
            Action::None,
            self.me,
            false,
        );
        if ms != self.domain(f) {
            let dst = self.rank(ms, f % su);
            self.put(core, end, f, dst, c, self.tok_bytes, false, Action::None);
        }
    }

    /// Forward warp `x` flushed its puts: an end signal to every scale-out rank's channel.
    pub(super) fn signal_end(&mut self, core: &mut Core, x: u32) {
        let ch = self.e.num_channels;
        let (f, c) = (x / ch, x % ch);
        let (m, i) = (self.domain(f), f % self.e.num_scaleup_ranks);
        for m2 in 0..self.e.num_scaleout_ranks {
            let dst = self.rank(m2, i);
            let act = Action::Add { counter: self.end_sig + self.rc(dst, c) as u32, delta: 1 };
            if m2 == m {
                core.act_at(core.now + self.rates.flag, act);
            } else {
                self.put(core, core.now + self.rates.wqe_post, f, dst, c, 0, true, act);
            }
        }
    }

    /// Direct combine warp `x`: its next held token back to the source, over NVLink or by a
    /// put from the send buffer.
    fn direct_combine_token(&mut self, core: &mut Core, x: u32) {
        let xi = x as usize;
        let ch = self.e.num_channels;
        let (r, c) = (x / ch, x % ch);
        let held = self.order.held[r as usize].len() as u32;
        let per = held.div_ceil(ch);
        let (lo, hi) = ((c * per).min(held), ((c + 1) * per).min(held));
        let k = lo + self.next[xi] - c;
        if k >= hi {
            self.close(core, x);
            return;
        }
        self.next[xi] += 1;
        let (src, t) = self.order.held[r as usize][k as usize];
        self.ledger.arrive(src, mix(src, t, 1 + r));
        self.load_partial(core, x, src);
    }
}
