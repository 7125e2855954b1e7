//! The internode combine's actors: each rank's start, the NVLink senders pushing expert outputs
//! back to their forwarders, the forwarder groups reducing and putting once per node, and the
//! RDMA receivers reducing across nodes (the protocol: `super`'s module doc).

use super::*;

impl InternodeProgram {
    pub(super) fn combine_rank(&mut self, core: &mut Core, r: u32) {
        let (ch, nodes) = (self.ch, self.nodes);
        {
            self.workers_left[r as usize] = ch * (P + nodes + 1);
            for c in 0..ch {
                for i in 0..P {
                    let x = self.rcj(r, c, i);
                    self.combine_sender(core, x);
                }
                for m in 0..nodes {
                    let x = self.rcn(r, c, m);
                    self.combine_group(core, x);
                }
                let x = self.rc(r, c);
                self.combine_receiver(core, x);
            }
        }
    }

    /// NVL sender on rank r3 = (m2, j), channel c, to local index i: push expert outputs back
    /// to the GPU that forwarded them, `nvl_send` tokens at a time to the next source node
    /// (round robin) whose part of the forwarder's ring has room.
    pub(super) fn combine_sender(&mut self, core: &mut Core, x: usize) {
        if self.cs_done[x] || self.cs_busy[x] {
            return;
        }
        let nn = self.nodes as usize;
        let nx = P as usize * self.ch as usize;
        let r3 = (x / nx) as u32;
        let c = ((x % nx) / P as usize) as u32;
        let i = (x % P as usize) as u32;
        let (m2, j) = (r3 / P, r3 % P);
        let fwd = self.rank(m2, i);
        let base = self.rcj(fwd, c, j) * nn;
        let chunk = self.cfg.num_max_nvl_chunked_send_tokens.max(1);
        let mut left = false;
        let mut pick = None;
        for k in 1..=self.nodes {
            let m = (self.cs_rr[x] + k) % self.nodes;
            let z = base + m as usize;
            if self.cs_next[z] >= self.csub_len[z] {
                continue;
            }
            left = true;
            let need = self.nvl[z].head_needed(chunk);
            if core.value(self.nvl[z].head) >= need {
                pick = Some(m);
                break;
            }
        }
        if !left {
            self.cs_done[x] = true;
            self.worker_done(core, r3);
            return;
        }
        let Some(m) = pick else {
            for m in 0..self.nodes {
                let z = base + m as usize;
                let ai = x * nn + m as usize;
                if self.cs_next[z] < self.csub_len[z] && !self.cs_armed[ai] {
                    self.cs_armed[ai] = true;
                    let need = self.nvl[z].head_needed(chunk);
                    core.wait(self.nvl[z].head, need, self.me, self.a_csend_head(x, m));
                }
            }
            return;
        };
        self.cs_rr[x] = m;
        let z = base + m as usize;
        let pos = self.cs_next[z];
        let k = chunk.min(self.csub_len[z] - pos);
        self.nvl[z].pushed += k as u64;
        self.cs_next[z] = pos + k;
        let tail = Action::Add { counter: self.nvl[z].tail, delta: k };
        let path = self.paths[(r3 * self.n + fwd) as usize];
        self.cs_busy[x] = true;
        let free = core.copy(
            core.now + self.costs.per_token * k as u64,
            self.gpu[r3 as usize],
            self.gpu[fwd as usize],
            path,
            k as u64 * self.tok_bytes,
            self.fwd_rate,
            tail,
            self.me,
            r3 != fwd,
        );
        core.wake_at(free, self.me, self.a_csend(x));
    }

    /// Forwarder warp group on r2 = (m2, i), channel c, for node m: reduce the local partials
    /// of each token in dispatch's RDMA order and put chunks back to (m, i).
    pub(super) fn combine_group(&mut self, core: &mut Core, x: usize) {
        let nn = self.nodes as usize;
        let r2 = (x / (self.ch as usize * nn)) as u32;
        let c = ((x / nn) % self.ch as usize) as u32;
        let m = (x % nn) as u32;
        let (m2, i) = (r2 / P, r2 % P);
        let dst = self.rank(m, i);
        let ring = self.rcn(dst, c, m2);
        // A reduction copy finished: free the NVL slots it read; once the whole chunk is
        // reduced, put it (or write it locally) with its tail. DeepEP's forwarder puts
        // `num_max_rdma_chunked_send_tokens` at a time (fewer only for the last chunk), not
        // whatever has arrived.
        self.publish_nvl_heads(core, r2, c, m);
        let pos = self.cf_pos[x];
        if pos == u32::MAX {
            return;
        }
        let batch = self.cf_batch[x];
        if batch > 0 && pos == self.cf_end[x] {
            self.cf_batch[x] = 0;
            let tail = Action::Add { counter: self.rdma[ring].tail, delta: batch };
            if m == m2 {
                core.act_at(core.now + self.costs.flag, tail);
            } else {
                let t = self.put_with_tail(
                    core,
                    core.now,
                    r2,
                    dst,
                    c,
                    batch as u64 * self.tok_bytes,
                    tail,
                );
                self.ranks.touch(r2, t);
            }
        }
        let len = self.cf_stream[x].len() as u32;
        if pos >= len {
            self.cf_pos[x] = u32::MAX;
            self.worker_done(core, r2);
            return;
        }
        if self.cf_end[x] <= pos {
            // A new chunk: the receiver must have room for all of it (RDMA credits at (m, i)).
            let end = (pos + self.cfg.num_max_rdma_chunked_send_tokens.max(1)).min(len);
            let pushed = self.rdma[ring].pushed;
            let cap = self.rdma[ring].cap as u64;
            let room = (pushed + (end - pos) as u64).saturating_sub(cap);
            if core.value(self.rdma[ring].head) < room {
                core.wait(self.rdma[ring].head, room, self.me, self.a_group(x));
                return;
            }
            self.cf_end[x] = end;
        }
        let end = self.cf_end[x];
        let mut p = pos;
        let mut bytes = 0u64;
        let src = self.rank(m, i);
        while p < end {
            let t = self.cf_stream[x][p as usize];
            let mk = self.mask(src, t, m2);
            // Every local partial must be in: the next slot of each part (j, m).
            let mut blocked = None;
            for j in 0..P {
                if mk & (1 << j) == 0 {
                    continue;
                }
                let z = self.rcj(r2, c, j) * nn + m as usize;
                let slot = self.cg_pos[z];
                if core.value(self.nvl[z].tail) <= slot as u64 {
                    blocked = Some((z, slot));
                    break;
                }
            }
            if let Some((z, slot)) = blocked {
                if p == pos {
                    core.wait(self.nvl[z].tail, slot as u64 + 1, self.me, self.a_group(x));
                    return;
                }
                break;
            }
            let mut parts = 0u64;
            for j in 0..P {
                if mk & (1 << j) == 0 {
                    continue;
                }
                let z = self.rcj(r2, c, j) * nn + m as usize;
                self.cg_pos[z] += 1;
                parts += 1;
            }
            self.rdma[ring].data.push_back(t);
            self.rdma[ring].pushed += 1;
            bytes += parts * self.tok_bytes + self.tok_bytes;
            p += 1;
        }
        self.cf_pos[x] = p;
        self.cf_batch[x] += p - pos;
        let g = self.gpu[r2 as usize];
        let end = core.copy(
            core.now,
            g,
            g,
            PathKind::Local,
            bytes,
            self.group_rate,
            Action::None,
            self.me,
            false,
        );
        core.wake_at(end.max(core.now + 1), self.me, self.a_group(x));
    }

    /// Free the combine NVL slots group (r2, c, m) consumed (the heads the senders wait on).
    pub(super) fn publish_nvl_heads(&mut self, core: &mut Core, r2: u32, c: u32, m: u32) {
        for j in 0..P {
            let z = self.rcj(r2, c, j) * self.nodes as usize + m as usize;
            let (h, start) = (self.cg_pos[z], self.cg_pub[z]);
            if h > start {
                self.cg_pub[z] = h;
                let act = Action::Add { counter: self.nvl[z].head, delta: h - start };
                core.act_at(core.now + self.costs.flag, act);
            }
        }
    }

    /// RDMA receiver of (rank r = (m, i), channel c): reduce each token across the nodes it
    /// visited, in order; return credits lazily.
    pub(super) fn combine_receiver(&mut self, core: &mut Core, x: usize) {
        let r = (x / self.ch as usize) as u32;
        let c = (x % self.ch as usize) as u32;
        let i = r % P;
        if self.cr_touched[x] {
            self.cr_touched[x] = false;
            let chunk = self.cfg.num_max_rdma_chunked_send_tokens.max(1);
            for m2 in 0..self.nodes {
                let y = self.rcn(r, c, m2);
                let done = self.cr_pos[y];
                let last = self.cr_credit_last[y];
                if done >= last + chunk {
                    self.cr_credit_last[y] = done;
                    let fwd = self.rank(m2, i);
                    let head = self.rdma[y].head;
                    self.credit(core, r, fwd, c, head, done - last);
                }
            }
        }
        let (_, hi) = self.range(c);
        let mut t = self.cr_next[x];
        if t == u32::MAX {
            return;
        }
        if t >= hi {
            self.cr_next[x] = u32::MAX;
            self.worker_done(core, r);
            return;
        }
        let mut bytes = 0u64;
        let mut any = false;
        while t < hi {
            let mut blocked = None;
            for m2 in 0..self.nodes {
                if self.mask(r, t, m2) == 0 {
                    continue;
                }
                let y = self.rcn(r, c, m2);
                if core.value(self.rdma[y].tail) <= self.cr_pos[y] as u64 {
                    blocked = Some(y);
                    break;
                }
            }
            if let Some(y) = blocked {
                if !any {
                    let need = self.cr_pos[y] as u64 + 1;
                    core.wait(self.rdma[y].tail, need, self.me, self.a_crecv(x));
                    self.cr_next[x] = t;
                    return;
                }
                break;
            }
            let mut parts = 0u64;
            for m2 in 0..self.nodes {
                if self.mask(r, t, m2) == 0 {
                    continue;
                }
                let y = self.rcn(r, c, m2);
                let p = self.cr_pos[y] as usize;
                if self.rdma[y].data.get(p) != Some(&t) {
                    self.ranks.fail(format!(
                        "rank {r} channel {c}: combine from node {m2} slot {p} is not token {t}"
                    ));
                }
                self.cr_pos[y] += 1;
                parts += 1;
            }
            self.ledger.arrive(r, mix(r, t, 1));
            bytes += parts * self.tok_bytes + self.out_bytes;
            any = true;
            t += 1;
        }
        self.cr_next[x] = t;
        self.cr_touched[x] = true;
        let g = self.gpu[r as usize];
        let end = core.copy(
            core.now,
            g,
            g,
            PathKind::Local,
            bytes,
            self.combine_recv_rate,
            Action::None,
            self.me,
            false,
        );
        core.wake_at(end.max(core.now + 1), self.me, self.a_crecv(x));
    }
}
