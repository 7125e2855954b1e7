//! V2 dispatch: the scale-out (hybrid) or dispatch (direct) warps, and the hybrid forward warps.

use eptwin_engine::api::{SCALEOUT_UPDATE_INTERVAL, mix};

use super::ElasticProgram;
use crate::core::{Action, Core};

impl ElasticProgram {
    /// Sender warp `x` = (rank, channel): one token per visit. Phase 0 stores the loaded token
    /// (send buffer, local bypass / NVLink peers) and waits for them to land; phase 1 issues
    /// the puts and tail signals, then preloads the next token.
    pub(super) fn send(&mut self, core: &mut Core, x: u32) {
        let xi = x as usize;
        let ch = self.e.num_channels;
        let (r, c) = (x / ch, x % ch);
        let t = self.next[xi];
        if self.phase[xi] == 1 {
            if core.value(self.landed + x) < self.issued_land[xi] {
                return;
            }
            self.phase[xi] = 0;
            let issued = self.issue_puts(core, r, c, t);
            self.next[xi] += ch;
            let fill = self.rates.fill + self.rates.tma.time(self.tok_bytes);
            self.load_at[xi] = issued + fill;
            core.wake_at(issued, self.me, x);
            return;
        }
        if t >= self.tokens {
            if self.e.hybrid {
                self.flush_tails(core, r, c);
                self.worker_done(core, r);
            } else {
                self.close(core, x);
            }
            return;
        }
        // Copies are issued at the simulated now: the GPU's servers are FIFO in call order.
        if self.load_at[xi] > core.now {
            core.wake_at(self.load_at[xi], self.me, x);
            return;
        }
        let at = core.now;
        let mut ranks = Vec::new();
        self.routing.token_ranks(r, t, &mut ranks);
        let done = Action::Add { counter: self.landed + x, delta: 1 };
        let mut stores = 0u64;
        if self.e.hybrid {
            let m = self.domain(r);
            let remote = ranks.iter().any(|&d| self.domain(d) != m);
            let local = ranks.iter().any(|&d| self.domain(d) == m);
            for _ in 0..u32::from(remote) + u32::from(local) {
                self.copy(core, at, r, r, self.tok_bytes, done);
                stores += 1;
            }
        } else {
            if ranks.iter().any(|&d| !self.same_nvl(d, r)) {
                self.copy(core, at, r, r, self.tok_bytes, done);
                stores += 1;
            }
            let near: Vec<u32> = ranks.iter().copied().filter(|&d| self.same_nvl(d, r)).collect();
            for d in near {
                self.copy(core, at, r, d, self.tok_bytes, done);
                self.ledger.arrive(d, mix(r, t, 0));
                stores += 1;
            }
        }
        self.issued_land[xi] += stores;
        self.phase[xi] = 1;
        if core.wait(self.landed + x, self.issued_land[xi], self.me, x) {
            core.wake_at(at, self.me, x);
        }
    }

    /// The puts of token `t` of (rank r, channel c) and the tails they complete; when the warp
    /// is free again.
    fn issue_puts(&mut self, core: &mut Core, r: u32, c: u32, t: u32) -> crate::core::time::Time {
        let mut ranks = Vec::new();
        self.routing.token_ranks(r, t, &mut ranks);
        let mut at = core.now;
        if !self.e.hybrid {
            let far: Vec<u32> = ranks.iter().copied().filter(|&d| !self.same_nvl(d, r)).collect();
            for d in far {
                at += self.rates.wqe_post;
                self.put(core, at, r, d, c, self.tok_bytes, false, Action::None);
                self.ledger.arrive(d, mix(r, t, 0));
            }
            return at;
        }
        let (so, su) = (self.e.num_scaleout_ranks, self.e.num_scaleup_ranks);
        let (m, i) = (self.domain(r), r % su);
        let x = self.rc(r, c);
        let mut domains: Vec<u32> = ranks.iter().map(|&d| self.domain(d)).collect();
        domains.dedup();
        for m2 in domains {
            let y = x * so as usize + m2 as usize;
            self.sent[y] += 1;
            if m2 != m {
                at += self.rates.wqe_post;
                let dst = self.rank(m2, i);
                self.put(core, at, r, dst, c, self.tok_bytes, false, Action::None);
            }
            if self.sent[y] - self.signalled[y] >= SCALEOUT_UPDATE_INTERVAL {
                at = self.signal_tail(core, at, r, c, m2);
            }
        }
        at
    }

    /// Signal domain `m2`'s forward warp of channel c how many more tokens arrived: an atomic
    /// after the puts on the same QP, or a local release for the own domain.
    fn signal_tail(
        &mut self,
        core: &mut Core,
        at: crate::core::time::Time,
        r: u32,
        c: u32,
        m2: u32,
    ) -> crate::core::time::Time {
        let so = self.e.num_scaleout_ranks;
        let (m, i) = (self.domain(r), r % self.e.num_scaleup_ranks);
        let y = self.rc(r, c) * so as usize + m2 as usize;
        let delta = self.sent[y] - self.signalled[y];
        if delta == 0 {
            return at;
        }
        self.signalled[y] = self.sent[y];
        let dst = self.rank(m2, i);
        let tail = self.tails + (self.rc(dst, c) * so as usize + m as usize) as u32;
        let act = Action::Add { counter: tail, delta };
        if m2 == m {
            core.act_at(at + self.rates.flag, act);
            at
        } else {
            let at = at + self.rates.wqe_post;
            self.put(core, at, r, dst, c, 0, true, act);
            at
        }
    }

    /// The last tail update of every domain (the finish flag).
    fn flush_tails(&mut self, core: &mut Core, r: u32, c: u32) {
        let mut at = core.now;
        for m2 in 0..self.e.num_scaleout_ranks {
            at = self.signal_tail(core, at, r, c, m2);
        }
        self.ranks.touch(r, at);
    }

    /// Forward warp `y` = (rank, channel), hybrid dispatch: phase 0 picks the next arrived
    /// token (≤ 6 per source turn, round robin) and loads it; phase 1 stores it to every GPU of
    /// the domain that selected it; the next token waits for those stores.
    pub(super) fn forward(&mut self, core: &mut Core, y: u32) {
        let yi = y as usize;
        let so = self.e.num_scaleout_ranks;
        let rc = self.n * self.e.num_channels;
        let actor = rc + y;
        match self.fphase[yi] {
            1 => {
                if core.value(self.landed + rc + y) < self.fland[yi] {
                    return;
                }
                self.fphase[yi] = 0;
            }
            5 => {
                // The token's TMA load landed: store it to its GPUs.
                if core.now < self.fload_at[yi] {
                    return;
                }
                self.store_forwarded(core, y);
                return;
            }
            4 => return,
            _ => {}
        }
        // The next source: continue a chunk, else the next one round robin with data.
        let base = yi * so as usize;
        let streams = &self.order.streams;
        let remaining =
            |m: u32| self.consumed[base + m as usize] < streams[base + m as usize].len() as u32;
        if (0..so).all(|m| !remaining(m)) {
            self.fphase[yi] = 4;
            let r = y / self.e.num_channels;
            self.worker_done(core, r);
            return;
        }
        let arrived = |m: u32| {
            core.value(self.tails + (base + m as usize) as u32)
                > self.consumed[base + m as usize] as u64
        };
        let cur = self.rr[yi];
        let pick = if self.chunk_left[yi] > 0 && remaining(cur) && arrived(cur) {
            Some(cur)
        } else {
            (1..=so).map(|k| (cur + k) % so).find(|&m| remaining(m) && arrived(m))
        };
        let Some(m) = pick else {
            for m in (0..so).filter(|&m| remaining(m)) {
                let need = self.consumed[base + m as usize] as u64 + 1;
                core.wait(self.tails + (base + m as usize) as u32, need, self.me, actor);
            }
            return;
        };
        if m != cur || self.chunk_left[yi] == 0 {
            let tail = core.value(self.tails + (base + m as usize) as u32) as u32;
            self.chunk_left[yi] = (tail - self.consumed[base + m as usize])
                .min(eptwin_engine::api::SLOTS_PER_FORWARD_CHUNK);
            self.rr[yi] = m;
        }
        self.fcur[yi] = (m, self.consumed[base + m as usize]);
        self.consumed[base + m as usize] += 1;
        self.chunk_left[yi] -= 1;
        let landed = core.now + self.rates.fill + self.rates.tma.time(self.tok_bytes);
        self.fload_at[yi] = landed;
        self.fphase[yi] = 5;
        core.wake_at(landed, self.me, actor);
    }

    /// Forward warp `y`'s loaded token to every GPU of its domain that selected it.
    fn store_forwarded(&mut self, core: &mut Core, y: u32) {
        let yi = y as usize;
        let so = self.e.num_scaleout_ranks;
        let actor = self.n * self.e.num_channels + y;
        let (m, k) = self.fcur[yi];
        let f = self.order.streams[yi * so as usize + m as usize][k as usize].clone();
        let r2 = y / self.e.num_channels;
        let md = self.domain(r2);
        let done =
            Action::Add { counter: self.landed + self.n * self.e.num_channels + y, delta: 1 };
        for &d in &f.dsts {
            let dst = self.rank(md, d);
            self.copy(core, core.now, r2, dst, self.tok_bytes, done);
            self.ledger.arrive(dst, mix(f.src, f.token, 0));
            self.fland[yi] += 1;
        }
        self.fphase[yi] = 1;
        let counter = self.landed + self.n * self.e.num_channels + y;
        if core.wait(counter, self.fland[yi], self.me, actor) {
            core.wake_at(core.now, self.me, actor);
        }
    }
}
