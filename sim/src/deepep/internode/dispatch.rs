//! The internode dispatch's actors: each rank's start (channel meta to every node), the RDMA
//! senders and their coordinators, the forwarders with their coordinators, and the NVLink
//! receivers (the protocol: `super`'s module doc).

use super::*;

impl InternodeProgram {
    /// Rank r's dispatch kernel starts: channel meta, then every worker.
    pub(super) fn dispatch_rank(&mut self, core: &mut Core, r: u32) {
        let (ch, nodes) = (self.ch, self.nodes);
        {
            self.workers_left[r as usize] = ch * (1 + 2 * P);
            let (m, i) = (r / P, r % P);
            for c in 0..ch {
                // Channel meta to every node (the own node by a local store).
                for m2 in 0..nodes {
                    let dst = self.rank(m2, i);
                    let act =
                        Action::Add { counter: self.meta_ctr + self.rc(dst, c) as u32, delta: 1 };
                    if m2 == m {
                        core.act_at(core.now + self.costs.flag, act);
                    } else {
                        let qp = core.job_qp(self.job, r, dst, c, self.me);
                        core.post(qp, META_BYTES, false, act, Action::None, self.me);
                        core.ring(qp, core.now + self.costs.wqe_post);
                    }
                }
                self.sender(core, r, c);
                for j in 0..P {
                    let x = self.rcj(r, c, j);
                    self.forwarder(core, x);
                    self.nvl_receiver(core, x);
                }
            }
        }
    }

    /// RDMA sender + coordinator of (rank r, channel c).
    pub(super) fn sender(&mut self, core: &mut Core, r: u32, c: u32) {
        let x = self.rc(r, c);
        let (m, i) = (r / P, r % P);
        let batch = std::mem::take(&mut self.snd_batch[x]);
        if !batch.is_empty() {
            for &(m2, k) in &batch {
                let y = self.rcn(r, c, m2);
                self.processed[y] += k;
            }
            self.coordinator(core, r, c);
        }
        let (_, hi) = self.range(c);
        let mut t = self.snd_next[x];
        if t >= hi {
            let all = (0..self.nodes).all(|m2| {
                let y = self.rcn(r, c, m2);
                self.issued[y] == self.total[y]
            });
            if all && !self.snd_done[x] {
                self.snd_done[x] = true;
                self.worker_done(core, r);
            }
            return;
        }
        let chunk = self.cfg.num_max_rdma_chunked_send_tokens.max(1);
        let cap = self.cfg.rdma_recv_rounded() as u64;
        let mut counts: Vec<(u32, u32)> = Vec::new();
        let mut tokens = 0u32;
        let mut bytes = 0u64;
        'tokens: while t < hi && tokens < chunk {
            // Every destination node of the token needs a free slot (credits).
            for m2 in 0..self.nodes {
                if self.mask(r, t, m2) == 0 {
                    continue;
                }
                let ring = self.rcn(self.rank(m2, i), c, m);
                let alloc = self.alloc[self.rcn(r, c, m2)] as u64;
                let head = core.value(self.rdma[ring].head);
                if alloc - head >= cap {
                    if tokens == 0 {
                        let need = alloc - cap + 1;
                        core.wait(self.rdma[ring].head, need, self.me, self.a_send(r, c));
                        return;
                    }
                    break 'tokens;
                }
            }
            for m2 in 0..self.nodes {
                if self.mask(r, t, m2) == 0 {
                    continue;
                }
                let y = self.rcn(r, c, m2);
                self.alloc[y] += 1;
                let ring = self.rcn(self.rank(m2, i), c, m);
                self.rdma[ring].data.push_back(tid(m, t));
                match counts.iter_mut().find(|(n2, _)| *n2 == m2) {
                    Some(e) => e.1 += 1,
                    None => counts.push((m2, 1)),
                }
                bytes += self.tok_bytes;
            }
            t += 1;
            tokens += 1;
        }
        self.snd_next[x] = t;
        self.snd_batch[x] = counts;
        let g = self.gpu[r as usize];
        let at = core.now + self.costs.per_token * tokens as u64;
        let end = core.copy(
            at,
            g,
            g,
            PathKind::Local,
            bytes,
            self.sender_rate,
            Action::None,
            self.me,
            false,
        );
        core.wake_at(end.max(core.now + 1), self.me, self.a_send(r, c));
    }

    /// Issue every full chunk (or the last partial one) per destination node, starting from a
    /// rotated node "to mitigate incast".
    pub(super) fn coordinator(&mut self, core: &mut Core, r: u32, c: u32) {
        let (m, i) = (r / P, r % P);
        let x = self.rc(r, c);
        let chunk = self.cfg.num_max_rdma_chunked_send_tokens.max(1);
        let mut t = self.coord_free[x].max(core.now);
        for k in 0..self.nodes {
            let m2 = (k + c + m) % self.nodes;
            let y = self.rcn(r, c, m2);
            loop {
                let avail = self.processed[y] - self.issued[y];
                let rem = self.total[y] - self.issued[y];
                if avail == 0 || (avail < chunk && avail < rem) {
                    break;
                }
                let k2 = avail.min(chunk);
                let dst = self.rank(m2, i);
                let ring = self.rcn(dst, c, m);
                let tail = Action::Add { counter: self.rdma[ring].tail, delta: k2 };
                if m2 == m {
                    // Own node: the data is already in the receive buffer; fence + tail.
                    core.act_at(t + self.costs.flag, tail);
                } else {
                    t = self.put_with_tail(core, t, r, dst, c, k2 as u64 * self.tok_bytes, tail);
                }
                self.issued[y] += k2;
            }
        }
        self.coord_free[x] = t;
        self.ranks.touch(r, t);
    }

    /// Forwarder (rank r2 = (m2, i), channel c, local destination j), poked.
    pub(super) fn forwarder(&mut self, core: &mut Core, x: usize) {
        if self.fwd_done[x] || self.fwd_pending[x].is_some() {
            return;
        }
        let nx = P as usize * self.ch as usize;
        let r2 = (x / nx) as u32;
        let c = ((x % nx) / P as usize) as u32;
        let j = (x % P as usize) as u32;
        let (m2, i) = (r2 / P, r2 % P);
        let meta = self.meta_ctr + self.rc(r2, c) as u32;
        if !core.wait(meta, self.nodes as u64, self.me, self.a_fwd_head(x)) {
            self.fwd_waiting_head[x] = true;
            return;
        }
        // Done when every source node's stream is consumed.
        let finished = (0..self.nodes).all(|m| {
            self.fwd_head[x * self.nodes as usize + m as usize]
                == self.rdma_expected[self.rcn(r2, c, m)]
        });
        if finished {
            self.fwd_done[x] = true;
            for m in 0..self.nodes {
                self.forward_coordinator(core, r2, c, m);
            }
            self.worker_done(core, r2);
            return;
        }
        // Room for a full chunk in the destination's NVL ring.
        let dst = self.rank(m2, j);
        let ring = self.rcj(dst, c, i);
        let nvl_send = self.cfg.num_max_nvl_chunked_send_tokens.max(1);
        let need = self.nvl[ring].head_needed(nvl_send);
        if core.value(self.nvl[ring].head) < need {
            if !self.fwd_waiting_head[x] {
                self.fwd_waiting_head[x] = true;
                core.wait(self.nvl[ring].head, need, self.me, self.a_fwd_head(x));
            }
            return;
        }
        // Next source node (round robin) with unread tokens.
        let mut pick = None;
        for k in 1..=self.nodes {
            let m = (self.fwd_rr[x] + k) % self.nodes;
            let h = self.fwd_head[x * self.nodes as usize + m as usize] as u64;
            if core.value(self.rdma[self.rcn(r2, c, m)].tail) > h {
                pick = Some(m);
                break;
            }
        }
        let Some(m) = pick else {
            for m in 0..self.nodes {
                let hi = x * self.nodes as usize + m as usize;
                let h = self.fwd_head[hi];
                let y = self.rcn(r2, c, m);
                if h < self.rdma_expected[y] && !self.fwd_armed[hi] {
                    self.fwd_armed[hi] = true;
                    core.wait(self.rdma[y].tail, h as u64 + 1, self.me, self.a_fwd_node(x, m));
                }
            }
            return;
        };
        self.fwd_rr[x] = m;
        let y = self.rcn(r2, c, m);
        let tail = core.value(self.rdma[y].tail) as u32;
        let mut pos = self.fwd_head[x * self.nodes as usize + m as usize];
        let mut picks = 0u32;
        let src = self.rank(m, i);
        while pos < tail {
            let id = self.rdma[y].data[pos as usize];
            pos += 1;
            let t = id & ((1 << 20) - 1);
            if self.mask(src, t, m2) & (1 << j) != 0 {
                self.nvl[ring].data.push_back(id);
                picks += 1;
                if picks == nvl_send {
                    break;
                }
            }
        }
        self.fwd_pending[x] = Some((m, pos));
        if picks == 0 {
            core.wake_at(core.now + 1, self.me, self.a_fwd_done(x));
            return;
        }
        self.nvl[ring].pushed += picks as u64;
        let tail_act = Action::Add { counter: self.nvl[ring].tail, delta: picks };
        let path = self.paths[(r2 * self.n + dst) as usize];
        let free = core.copy(
            core.now,
            self.gpu[r2 as usize],
            self.gpu[dst as usize],
            path,
            picks as u64 * self.tok_bytes,
            self.fwd_rate,
            tail_act,
            self.me,
            r2 != dst,
        );
        core.wake_at(free, self.me, self.a_fwd_done(x));
    }

    pub(super) fn forwarder_batch_done(&mut self, core: &mut Core, x: usize) {
        let nx = P as usize * self.ch as usize;
        let r2 = (x / nx) as u32;
        let c = ((x % nx) / P as usize) as u32;
        if let Some((m, head)) = self.fwd_pending[x].take() {
            self.fwd_head[x * self.nodes as usize + m as usize] = head;
            self.forward_coordinator(core, r2, c, m);
        }
        self.forwarder(core, x);
    }

    /// Return RDMA credits to source node `m` once every forwarder moved past `rdma_send`
    /// more slots (retired forwarders do not hold credits back).
    pub(super) fn forward_coordinator(&mut self, core: &mut Core, r2: u32, c: u32, m: u32) {
        let mut min = u32::MAX;
        for j in 0..P {
            let x = self.rcj(r2, c, j);
            if !self.fwd_done[x] {
                min = min.min(self.fwd_head[x * self.nodes as usize + m as usize]);
            }
        }
        if min == u32::MAX {
            return;
        }
        let y = self.rcn(r2, c, m);
        let last = self.credit_last[y];
        let chunk = self.cfg.num_max_rdma_chunked_send_tokens.max(1);
        if min >= last + chunk {
            self.credit_last[y] = min;
            let src = self.rank(m, r2 % P);
            let head = self.rdma[y].head;
            self.credit(core, r2, src, c, head, min - last);
        }
    }

    /// NVLink receiver (rank r3, channel c, source local i): copy into `recv_x`.
    pub(super) fn nvl_receiver(&mut self, core: &mut Core, x: usize) {
        if self.nvl_done[x] {
            return;
        }
        let nx = P as usize * self.ch as usize;
        let r3 = (x / nx) as u32;
        let i = (x % P as usize) as u32;
        let batch = self.nvl_batch[x];
        if batch > 0 {
            self.nvl_batch[x] = 0;
            let head = Action::Add { counter: self.nvl[x].head, delta: batch };
            core.act_at(core.now + self.costs.flag, head);
        }
        let popped = self.nvl[x].popped;
        if popped >= self.nvl_expected[x] as u64 {
            self.nvl_done[x] = true;
            self.worker_done(core, r3);
            return;
        }
        if !core.wait(self.nvl[x].tail, popped + 1, self.me, self.a_nvl_recv(x)) {
            return;
        }
        let avail = (core.value(self.nvl[x].tail) - popped) as u32;
        for _ in 0..avail {
            let id = self.nvl[x].data.pop_front().expect("tail never passes the data");
            let (m, t) = (id >> 20, id & ((1 << 20) - 1));
            let src = self.rank(m, i);
            self.ledger.arrive(r3, mix(src, t, 0));
        }
        self.nvl[x].popped += avail as u64;
        self.nvl_batch[x] = avail;
        let g = self.gpu[r3 as usize];
        let end = core.copy(
            core.now,
            g,
            g,
            PathKind::Local,
            avail as u64 * self.out_bytes,
            self.recv_rate,
            Action::None,
            self.me,
            false,
        );
        core.wake_at(end.max(core.now + 1), self.me, self.a_nvl_recv(x));
    }
}
