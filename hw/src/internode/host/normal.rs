//! The normal internode kernels' host reference: per channel a sender and a receiver per node
//! on the rank's rail (its own node included, reached by direct writes as DeepEP's own node
//! is), then the combine the reverse way (module docs of `internode`).

use eptwin_engine::routing::RoutingTable;

use super::{HostLinks, HostStats, RankPort, TagRole, run_ranks, tag};
use crate::internode::data::{bf16_bits, normal_expert_value, row_values, token_bytes};
use crate::internode::geometry::{Geometry, QpTable, Traffic};
use crate::internode::normal::{NormalCounter, NormalLayout};
use crate::rdma::RdmaError;
use crate::wire::Doorbell;

/// Run `calls` dispatch + combine rounds of the normal internode protocol on this process's
/// ranks. Every process of the job runs it with the same geometry and routing; regions start
/// zeroed. Returns what was moved and checked, or the first failure.
pub fn run_normal(
    links: &HostLinks<'_>,
    g: &Geometry,
    routing: &RoutingTable,
    calls: u32,
) -> Result<HostStats, RdmaError> {
    let layout = NormalLayout::new(g);
    check_inputs(links, g, routing, layout.recv_area_bytes, layout.send_area_bytes)?;
    let table = QpTable::new(Traffic::Normal, g, links.node);
    let mut stats = run_ranks(links, g.ranks_per_node, |port| {
        let mut rank = NormalRank::new(port, g, &layout, &table, routing);
        for call in 0..calls {
            rank.dispatch(call)?;
            rank.combine(call)?;
        }
        Ok(())
    })?;
    stats.calls = calls;
    Ok(stats)
}

pub(super) fn check_inputs(
    links: &HostLinks<'_>,
    g: &Geometry,
    routing: &RoutingTable,
    recv_area: u64,
    send_area: u64,
) -> Result<(), RdmaError> {
    let bad = |why: String| Err(RdmaError::Geometry(why));
    if (routing.num_ranks, routing.tokens_per_rank, routing.topk, routing.num_experts)
        != (g.num_ranks, g.tokens_per_rank, g.topk, g.num_experts)
    {
        return bad(format!(
            "routing for {} ranks × {} tokens, top-{} of {} experts; geometry says {} × {}, \
             top-{} of {}",
            routing.num_ranks,
            routing.tokens_per_rank,
            routing.topk,
            routing.num_experts,
            g.num_ranks,
            g.tokens_per_rank,
            g.topk,
            g.num_experts
        ));
    }
    if links.node >= g.num_nodes() {
        return bad(format!("node {} of {}", links.node, g.num_nodes()));
    }
    if links.producers.len() != g.ranks_per_node as usize {
        return bad(format!(
            "{} doorbell producers for {} local ranks",
            links.producers.len(),
            g.ranks_per_node
        ));
    }
    let rpn = g.ranks_per_node as u64;
    if links.recv.len() < rpn * recv_area || links.send.len() < rpn * send_area {
        return bad(format!(
            "regions of {} / {} bytes; {} ranks need {} / {} (receive / send)",
            links.recv.len(),
            links.send.len(),
            rpn,
            rpn * recv_area,
            rpn * send_area
        ));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Dispatch,
    Combine,
}

/// Cumulative state of one ring end (counts never reset: a call continues where the last
/// ended, as the counters in the regions do).
#[derive(Debug, Clone, Copy, Default)]
struct RingOut {
    sent: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct RingIn {
    count_seen: u64,
    consumed: u64,
    returned: u64,
}

/// One call's progress on one outgoing ring.
#[derive(Debug, Clone, Copy, Default)]
struct SendProgress {
    announced: bool,
    next: usize,
}

/// One call's progress on one incoming ring.
#[derive(Debug, Clone, Copy, Default)]
struct RecvProgress {
    count: Option<u64>,
    got: usize,
}

struct NormalRank<'r, 'l, 'g> {
    port: &'r mut RankPort<'l>,
    g: &'g Geometry,
    lay: &'g NormalLayout,
    table: &'g QpTable,
    routing: &'g RoutingTable,
    node: u32,
    local: u32,
    rank: u32,
    /// This rank's area in the process's regions; the rail peer's area in its process's
    /// regions is at the same offsets (same local index).
    recv_base: u64,
    send_base: u64,
    /// `[node · channels + channel]`.
    out: [Vec<RingOut>; 2],
    inn: [Vec<RingIn>; 2],
    /// Tokens sent to / received from each (node, channel) in the current call, in ring order.
    sent_lists: Vec<Vec<u32>>,
    recv_lists: Vec<Vec<u32>>,
}

impl<'r, 'l, 'g> NormalRank<'r, 'l, 'g> {
    fn new(
        port: &'r mut RankPort<'l>,
        g: &'g Geometry,
        lay: &'g NormalLayout,
        table: &'g QpTable,
        routing: &'g RoutingTable,
    ) -> Self {
        let rings = (g.num_nodes() * g.num_channels) as usize;
        let (rank, local) = (port.rank, port.local);
        NormalRank {
            node: g.node_of(rank),
            local,
            rank,
            recv_base: local as u64 * lay.recv_area_bytes,
            send_base: local as u64 * lay.send_area_bytes,
            port,
            g,
            lay,
            table,
            routing,
            out: [vec![RingOut::default(); rings], vec![RingOut::default(); rings]],
            inn: [vec![RingIn::default(); rings], vec![RingIn::default(); rings]],
            sent_lists: vec![Vec::new(); rings],
            recv_lists: vec![Vec::new(); rings],
        }
    }

    fn ring(&self, node: u32, channel: u32) -> usize {
        (node * self.g.num_channels + channel) as usize
    }

    /// Local-rank bits of `node` that `token` of `src` goes to (DeepEP's `SourceMeta` mask).
    fn node_mask(&self, src: u32, token: u32, node: u32) -> u32 {
        let mut mask = 0;
        for &e in self.routing.experts(src, token) {
            if e >= 0 {
                let r = self.routing.rank_of_expert(e as u32);
                if self.g.node_of(r) == node {
                    mask |= 1 << self.g.local_of(r);
                }
            }
        }
        mask
    }

    /// Tokens of `src` in `channel` that go to `node`, in token order.
    fn tokens_to(&self, src: u32, channel: u32, node: u32) -> Vec<u32> {
        let (start, end) = self.g.channel_tokens(channel);
        (start..end).filter(|&t| self.node_mask(src, t, node) != 0).collect()
    }

    fn slot_bytes(&self, dir: Dir) -> u64 {
        match dir {
            Dir::Dispatch => self.lay.dispatch_token_bytes,
            Dir::Combine => self.lay.combine_token_bytes,
        }
    }

    /// The slot `dir` carries for `token` of `src`, on the ring whose far end is `node` (the
    /// destination node for dispatch, the sending node for combine).
    fn build(&self, dir: Dir, call: u32, src: u32, token: u32, node: u32) -> Vec<u8> {
        let g = self.g;
        let lay = self.lay;
        let mut slot = vec![0u8; self.slot_bytes(dir) as usize];
        let mask = self.node_mask(src, token, node);
        let weights = self.routing.weights(src, token);
        match dir {
            Dir::Dispatch => {
                let bytes = token_bytes(call, src, token, g.dispatch_dtype, g.hidden);
                let payload = g.dispatch_dtype.payload_bytes(g.hidden) as usize;
                slot[..payload].copy_from_slice(&bytes[..payload]);
                let meta = lay.dispatch_meta_offset as usize;
                slot[meta..meta + 4].copy_from_slice(&token.to_le_bytes());
                slot[meta + 4..meta + 8].copy_from_slice(&mask.to_le_bytes());
                let scales = lay.dispatch_scales_offset as usize;
                slot[scales..scales + bytes.len() - payload].copy_from_slice(&bytes[payload..]);
                let idx = lay.dispatch_topk_idx_offset as usize;
                for (k, &e) in self.routing.experts(src, token).iter().enumerate() {
                    slot[idx + 4 * k..idx + 4 * k + 4].copy_from_slice(&e.to_le_bytes());
                }
                let w = lay.dispatch_topk_weights_offset as usize;
                for (k, &x) in weights.iter().enumerate() {
                    slot[w + 4 * k..w + 4 * k + 4].copy_from_slice(&x.to_bits().to_le_bytes());
                }
            }
            Dir::Combine => {
                for i in 0..g.hidden {
                    let v: f32 = (0..g.ranks_per_node)
                        .filter(|l| mask & (1 << l) != 0)
                        .map(|l| normal_expert_value(call, src, token, g.rank_of(node, l), i))
                        .sum();
                    let at = 2 * i as usize;
                    slot[at..at + 2].copy_from_slice(&bf16_bits(v).to_le_bytes());
                }
                let meta = lay.combine_meta_offset as usize;
                slot[meta..meta + 4].copy_from_slice(&token.to_le_bytes());
                let w = lay.combine_topk_weights_offset as usize;
                for (k, &x) in weights.iter().enumerate() {
                    slot[w + 4 * k..w + 4 * k + 4].copy_from_slice(&x.to_bits().to_le_bytes());
                }
            }
        }
        slot
    }

    fn ring_slot(&self, dir: Dir, far_node: u32, channel: u32, seq: u64) -> u64 {
        match dir {
            Dir::Dispatch => self.lay.dispatch_slot(far_node, channel, seq),
            Dir::Combine => self.lay.combine_slot(far_node, channel, seq),
        }
    }

    fn staging(&self, dir: Dir, to_node: u32, channel: u32, seq: u64) -> u64 {
        match dir {
            Dir::Dispatch => self.lay.dispatch_staging(to_node, channel, seq),
            Dir::Combine => self.lay.combine_staging(to_node, channel, seq),
        }
    }

    /// Slots of a ring and tokens per put / credit unit.
    fn ring_shape(&self, dir: Dir) -> (u64, u64) {
        match dir {
            Dir::Dispatch => (self.lay.dispatch_ring_slots, self.lay.dispatch_send_tokens),
            Dir::Combine => (self.lay.combine_ring_slots, self.lay.combine_send_tokens),
        }
    }

    fn tail(dir: Dir) -> NormalCounter {
        match dir {
            Dir::Dispatch => NormalCounter::DispatchTail,
            Dir::Combine => NormalCounter::CombineTail,
        }
    }

    fn head(dir: Dir) -> NormalCounter {
        match dir {
            Dir::Dispatch => NormalCounter::DispatchHead,
            Dir::Combine => NormalCounter::CombineHead,
        }
    }

    fn roles(dir: Dir) -> (TagRole, TagRole, TagRole) {
        match dir {
            Dir::Dispatch => {
                (TagRole::DispatchData, TagRole::DispatchTail, TagRole::DispatchCredit)
            }
            Dir::Combine => (TagRole::CombineData, TagRole::CombineTail, TagRole::CombineCredit),
        }
    }

    /// Add `add` to `counter` in the rail peer's area on `node`: a flag on `qp` across the
    /// wire, an atomic add when the peer is this rank itself (the own node).
    fn flag(
        &mut self,
        node: u32,
        qp: u32,
        counter: u64,
        add: u64,
        tag: u64,
    ) -> Result<(), RdmaError> {
        if node == self.node {
            self.port.links.recv.fetch_add_u64(self.recv_base + counter, add);
            self.port.stats.local_copies += 1;
            Ok(())
        } else {
            let index = self.table.index(node, self.local, self.local, qp);
            self.port.push(Doorbell::flag(index, self.recv_base + counter, add, tag))
        }
    }

    /// One step of the sender of ring `dir` towards `node`, channel `c`.
    fn send_step(
        &mut self,
        dir: Dir,
        call: u32,
        node: u32,
        c: u32,
        list: &[u32],
        p: &mut SendProgress,
    ) -> Result<bool, RdmaError> {
        let lay = *self.lay;
        if !p.announced {
            // The count goes first, on the data QP, so it precedes every token of the call.
            let counter = lay.counter(NormalCounter::DispatchCount, self.node, c);
            let t = tag(TagRole::DispatchCount, self.rank, c, list.len() as u32);
            self.flag(node, c, counter, list.len() as u64 + 1, t)?;
            p.announced = true;
            return Ok(true);
        }
        if p.next == list.len() {
            return Ok(false);
        }
        let ring = self.ring(node, c);
        let sent = self.out[dir as usize][ring].sent;
        let head_at = self.recv_base + lay.counter(Self::head(dir), node, c);
        let head = self.port.links.recv.load_u64(head_at);
        let (slots, send_tokens) = self.ring_shape(dir);
        let free = slots - (sent - head);
        if free == 0 {
            return Ok(false);
        }
        let batch = send_tokens.min((list.len() - p.next) as u64).min(free);
        let src_rank = match dir {
            Dir::Dispatch => self.rank,
            Dir::Combine => self.g.rank_of(node, self.local),
        };
        let far = match dir {
            Dir::Dispatch => node,
            Dir::Combine => self.node,
        };
        let bytes = self.slot_bytes(dir);
        let (data_role, tail_role, _) = Self::roles(dir);
        let links = self.port.links;
        for i in 0..batch {
            let token = list[p.next + i as usize];
            let slot = self.build(dir, call, src_rank, token, far);
            if node == self.node {
                let at = self.recv_base + self.ring_slot(dir, self.node, c, sent + i);
                links.recv.write(at, &slot);
            } else {
                links.send.write(self.send_base + self.staging(dir, node, c, sent + i), &slot);
            }
        }
        if node != self.node {
            // One write per contiguous run of slots (a batch that wraps the ring is two).
            let index = self.table.index(node, self.local, self.local, c);
            let mut seq = sent;
            while seq < sent + batch {
                let run = (slots - seq % slots).min(sent + batch - seq);
                let src = self.send_base + self.staging(dir, node, c, seq);
                let dst = self.recv_base + self.ring_slot(dir, self.node, c, seq);
                let t = tag(data_role, self.rank, c, seq as u32);
                self.port.push(Doorbell::write(index, src, dst, (run * bytes) as u32, t))?;
                seq += run;
            }
        } else {
            self.port.stats.local_copies += batch;
        }
        let tail = lay.counter(Self::tail(dir), self.node, c);
        self.flag(node, c, tail, batch, tag(tail_role, self.rank, c, (sent + batch) as u32))?;
        self.out[dir as usize][ring].sent = sent + batch;
        p.next += batch as usize;
        Ok(true)
    }

    /// One step of the receiver of ring `dir` from `node`, channel `c`.
    fn recv_step(
        &mut self,
        dir: Dir,
        call: u32,
        (node, c): (u32, u32),
        expected: &[u32],
        p: &mut RecvProgress,
        combined: &mut [Vec<f32>],
    ) -> Result<bool, RdmaError> {
        let lay = *self.lay;
        let ring = self.ring(node, c);
        let recv = self.port.links.recv;
        let mut worked = false;
        if p.count.is_none() {
            match dir {
                Dir::Dispatch => {
                    let at = self.recv_base + lay.counter(NormalCounter::DispatchCount, node, c);
                    let v = recv.load_u64(at);
                    let seen = self.inn[0][ring].count_seen;
                    if v == seen {
                        return Ok(false);
                    }
                    let n = v - seen - 1;
                    if n != expected.len() as u64 {
                        return Err(self.mismatch(
                            dir,
                            format!(
                                "node {node} channel {c} announced {n} tokens; the routing \
                                 sends {}",
                                expected.len()
                            ),
                        ));
                    }
                    self.inn[0][ring].count_seen = v;
                    p.count = Some(n);
                    worked = true;
                }
                // The combine's count is what this rank sent in the dispatch.
                Dir::Combine => p.count = Some(expected.len() as u64),
            }
        }
        let count = p.count.expect("set above") as usize;
        let tail = recv.load_u64(self.recv_base + lay.counter(Self::tail(dir), node, c));
        let (slots, _) = self.ring_shape(dir);
        let unread = tail.saturating_sub(self.inn[dir as usize][ring].consumed);
        if unread > slots {
            // A sender that ignores credits overwrites slots not read yet.
            return Err(self.mismatch(
                dir,
                format!(
                    "call {call}: the ring from node {node} channel {c} holds {unread} unread                      tokens in {slots} slots (the sender overran its credits)"
                ),
            ));
        }
        let (src_rank, far) = match dir {
            Dir::Dispatch => (self.g.rank_of(node, self.local), self.node),
            Dir::Combine => (self.rank, node),
        };
        let bytes = self.slot_bytes(dir) as usize;
        while p.got < count && self.inn[dir as usize][ring].consumed < tail {
            let seq = self.inn[dir as usize][ring].consumed;
            let token = expected[p.got];
            let got = recv.to_vec(self.recv_base + self.ring_slot(dir, node, c, seq), bytes);
            let want = self.build(dir, call, src_rank, token, far);
            if got != want {
                let first = (0..bytes).find(|&i| got[i] != want[i]).expect("they differ");
                return Err(self.mismatch(
                    dir,
                    format!(
                        "call {call}: slot {} of the ring from node {node} channel {c} should \
                         hold token {token} of rank {src_rank}; byte {first} is {:#04x}, \
                         expected {:#04x}",
                        seq % self.ring_shape(dir).0,
                        got[first],
                        want[first]
                    ),
                ));
            }
            if dir == Dir::Combine {
                let row = row_values(&got[..2 * self.g.hidden as usize]);
                for (acc, v) in combined[token as usize].iter_mut().zip(row) {
                    *acc += v;
                }
                self.port.stats.rows_checked += 1;
            } else {
                self.port.stats.tokens_checked += 1;
                self.recv_lists[ring].push(token);
            }
            self.inn[dir as usize][ring].consumed += 1;
            p.got += 1;
            worked = true;
        }
        // Credits: lazily, in units of `rdma_send`, and whatever is left at the end of a call.
        let st = self.inn[dir as usize][ring];
        let owed = st.consumed - st.returned;
        if owed > 0 && (owed >= self.ring_shape(dir).1 || p.got == count) {
            let (_, _, credit_role) = Self::roles(dir);
            let head = lay.counter(Self::head(dir), self.node, c);
            let qp = c + self.g.num_channels;
            self.flag(node, qp, head, owed, tag(credit_role, self.rank, c, st.consumed as u32))?;
            self.inn[dir as usize][ring].returned = st.consumed;
            worked = true;
        }
        Ok(worked)
    }

    fn mismatch(&self, dir: Dir, what: String) -> RdmaError {
        let role = match dir {
            Dir::Dispatch => "dispatch receiver",
            Dir::Combine => "combine receiver",
        };
        RdmaError::Mismatch { rank: self.rank, role: role.into(), what }
    }

    /// Drive every sender and receiver of `dir` until the call is complete.
    fn phase(&mut self, dir: Dir, call: u32, combined: &mut [Vec<f32>]) -> Result<(), RdmaError> {
        let nodes = self.g.num_nodes();
        let channels = self.g.num_channels;
        let rings = (nodes * channels) as usize;
        // What goes out on each ring, and what comes in.
        let (out_lists, in_lists): (Vec<Vec<u32>>, Vec<Vec<u32>>) = match dir {
            Dir::Dispatch => {
                let mut out = vec![Vec::new(); rings];
                let mut inn = vec![Vec::new(); rings];
                for n in 0..nodes {
                    for c in 0..channels {
                        let ring = self.ring(n, c);
                        out[ring] = self.tokens_to(self.rank, c, n);
                        inn[ring] = self.tokens_to(self.g.rank_of(n, self.local), c, self.node);
                    }
                }
                (out, inn)
            }
            Dir::Combine => (self.recv_lists.clone(), self.sent_lists.clone()),
        };
        if dir == Dir::Dispatch {
            self.sent_lists = out_lists.clone();
            for l in &mut self.recv_lists {
                l.clear();
            }
        }
        let mut sends = vec![SendProgress { announced: dir == Dir::Combine, next: 0 }; rings];
        let mut recvs = vec![RecvProgress::default(); rings];
        loop {
            let mut worked = false;
            for c in 0..channels {
                // Start with a different node per channel and rank (DeepEP rotates the first
                // destination "to mitigate incast").
                for i in 0..nodes {
                    let n = (i + c + self.node) % nodes;
                    let ring = self.ring(n, c);
                    worked |=
                        self.send_step(dir, call, n, c, &out_lists[ring], &mut sends[ring])?;
                }
            }
            for n in 0..nodes {
                for c in 0..channels {
                    let ring = self.ring(n, c);
                    worked |= self.recv_step(
                        dir,
                        call,
                        (n, c),
                        &in_lists[ring],
                        &mut recvs[ring],
                        combined,
                    )?;
                }
            }
            let sends_done =
                sends.iter().zip(&out_lists).all(|(p, l)| p.announced && p.next == l.len());
            let recvs_done = recvs.iter().enumerate().all(|(ring, p)| {
                let st = self.inn[dir as usize][ring];
                p.count.is_some_and(|n| p.got as u64 == n) && st.returned == st.consumed
            });
            if sends_done && recvs_done {
                return Ok(());
            }
            if worked {
                self.port.progressed();
            } else {
                let role = match dir {
                    Dir::Dispatch => "dispatch",
                    Dir::Combine => "combine",
                };
                let pending = || {
                    let mut what = Vec::new();
                    for (ring, (p, l)) in sends.iter().zip(&out_lists).enumerate() {
                        if p.next < l.len() {
                            let (n, c) = (ring as u32 / channels, ring as u32 % channels);
                            what.push(format!(
                                "credits from node {n} channel {c} ({} of {} tokens sent)",
                                p.next,
                                l.len()
                            ));
                        }
                    }
                    for (ring, p) in recvs.iter().enumerate() {
                        let (n, c) = (ring as u32 / channels, ring as u32 % channels);
                        match p.count {
                            None => what.push(format!("the token count from node {n} channel {c}")),
                            Some(k) if p.got < k as usize => what.push(format!(
                                "tokens from node {n} channel {c} ({} of {k})",
                                p.got
                            )),
                            _ => {}
                        }
                    }
                    what.join("; ")
                };
                self.port.idle(role, pending)?;
            }
        }
    }

    fn dispatch(&mut self, call: u32) -> Result<(), RdmaError> {
        self.phase(Dir::Dispatch, call, &mut [])
    }

    fn combine(&mut self, call: u32) -> Result<(), RdmaError> {
        let hidden = self.g.hidden as usize;
        let mut combined = vec![vec![0f32; hidden]; self.g.tokens_per_rank as usize];
        self.phase(Dir::Combine, call, &mut combined)?;
        // Every token's sum over the nodes it went to, predicted from the routing alone.
        for (t, row) in combined.iter().enumerate() {
            let t = t as u32;
            for i in 0..self.g.hidden {
                let mut want = 0f32;
                for n in 0..self.g.num_nodes() {
                    let mask = self.node_mask(self.rank, t, n);
                    for l in (0..self.g.ranks_per_node).filter(|l| mask & (1 << l) != 0) {
                        want += normal_expert_value(call, self.rank, t, self.g.rank_of(n, l), i);
                    }
                }
                if row[i as usize].to_bits() != want.to_bits() {
                    return Err(RdmaError::Mismatch {
                        rank: self.rank,
                        role: "combine".into(),
                        what: format!(
                            "call {call}: combined token {t} element {i} is {}, expected {want}",
                            row[i as usize]
                        ),
                    });
                }
            }
            self.port.stats.combined_checked += 1;
        }
        Ok(())
    }
}
