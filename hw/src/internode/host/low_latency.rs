//! The low-latency kernels' host reference: one message per (token, selected expert) into the
//! expert owner's `[local expert][source rank][slot]` slot, then a count per (source rank,
//! expert) — for every expert, zero-token ones included; combine writes each expert's row
//! back into the source's `[expert][token]` slot, then a flag per (expert, source rank); the
//! source waits for all flags and forms the weighted sum over its top-k.

use eptwin_engine::routing::RoutingTable;

use super::normal::check_inputs;
use super::{HostLinks, HostStats, RankPort, TagRole, run_ranks, tag};
use crate::internode::data::{bf16_row, ll_expert_value, row_values, token_bytes};
use crate::internode::geometry::{Geometry, QpTable, Traffic};
use crate::internode::low_latency::{LL_HEADER_BYTES, LlLayout};
use crate::rdma::RdmaError;
use crate::wire::Doorbell;

/// Run `calls` low-latency dispatch + combine rounds on this process's ranks. Every process of
/// the job runs it with the same geometry and routing; regions start zeroed.
pub fn run_low_latency(
    links: &HostLinks<'_>,
    g: &Geometry,
    routing: &RoutingTable,
    calls: u32,
) -> Result<HostStats, RdmaError> {
    let layout = LlLayout::new(g);
    check_inputs(links, g, routing, layout.recv_area_bytes, layout.send_area_bytes)?;
    let table = QpTable::new(Traffic::LowLatency, g, links.node);
    let mut stats = run_ranks(links, g.ranks_per_node, |port| {
        let mut rank = LlRank::new(port, g, &layout, &table, routing);
        for call in 0..calls {
            let received = rank.dispatch(call)?;
            rank.combine(call, &received)?;
        }
        Ok(())
    })?;
    stats.calls = calls;
    Ok(stats)
}

struct LlRank<'r, 'l, 'g> {
    port: &'r mut RankPort<'l>,
    g: &'g Geometry,
    lay: &'g LlLayout,
    table: &'g QpTable,
    routing: &'g RoutingTable,
    node: u32,
    local: u32,
    rank: u32,
    /// Cumulative dispatch count seen per `[local expert · ranks + source]`.
    count_seen: Vec<u64>,
}

impl<'r, 'l, 'g> LlRank<'r, 'l, 'g> {
    fn new(
        port: &'r mut RankPort<'l>,
        g: &'g Geometry,
        lay: &'g LlLayout,
        table: &'g QpTable,
        routing: &'g RoutingTable,
    ) -> Self {
        let (rank, local) = (port.rank, port.local);
        LlRank {
            node: g.node_of(rank),
            local,
            rank,
            port,
            g,
            lay,
            table,
            routing,
            count_seen: vec![0; (g.num_local_experts() * g.num_ranks) as usize],
        }
    }

    fn recv_base(&self, rank: u32) -> u64 {
        self.g.local_of(rank) as u64 * self.lay.recv_area_bytes
    }

    fn send_base(&self) -> u64 {
        self.local as u64 * self.lay.send_area_bytes
    }

    fn message(&self, call: u32, src: u32, token: u32) -> Vec<u8> {
        let mut m = vec![0u8; self.lay.dispatch_msg_bytes as usize];
        m[..4].copy_from_slice(&(token as i32).to_le_bytes());
        let body = token_bytes(call, src, token, self.g.dispatch_dtype, self.g.hidden);
        m[LL_HEADER_BYTES as usize..].copy_from_slice(&body);
        m
    }

    fn row(&self, call: u32, src: u32, token: u32, expert: u32) -> Vec<u8> {
        bf16_row(self.g.hidden, |i| ll_expert_value(call, src, token, expert, i))
    }

    /// Move `len` bytes from this rank's send area to `dst_rank`'s receive area: a direct copy
    /// inside the process (the NVLink path's stand-in), a write on QP `qp` across the wire.
    fn put(
        &mut self,
        dst_rank: u32,
        qp: u32,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
        tag: u64,
    ) -> Result<(), RdmaError> {
        let links = self.port.links;
        let dst = self.recv_base(dst_rank) + dst_offset;
        let src = self.send_base() + src_offset;
        if self.g.node_of(dst_rank) == self.node {
            links.recv.copy_from(dst, links.send, src, len as usize);
            self.port.stats.local_copies += 1;
            Ok(())
        } else {
            let index = self.table.index(
                self.g.node_of(dst_rank),
                self.local,
                self.g.local_of(dst_rank),
                qp,
            );
            self.port.push(Doorbell::write(index, src, dst, len as u32, tag))
        }
    }

    /// Add `add` to the counter at `offset` of `dst_rank`'s receive area, after the puts
    /// before it on the same QP.
    fn signal(
        &mut self,
        dst_rank: u32,
        qp: u32,
        offset: u64,
        add: u64,
        tag: u64,
    ) -> Result<(), RdmaError> {
        let at = self.recv_base(dst_rank) + offset;
        if self.g.node_of(dst_rank) == self.node {
            self.port.links.recv.fetch_add_u64(at, add);
            self.port.stats.local_copies += 1;
            Ok(())
        } else {
            let index = self.table.index(
                self.g.node_of(dst_rank),
                self.local,
                self.g.local_of(dst_rank),
                qp,
            );
            self.port.push(Doorbell::flag(index, at, add, tag))
        }
    }

    fn mismatch(&self, role: &str, what: String) -> RdmaError {
        RdmaError::Mismatch { rank: self.rank, role: role.into(), what }
    }

    /// Send every token to every selected expert, signal every expert's count, then receive
    /// this rank's experts' tokens. Returns, per `[local expert · ranks + source]`, the tokens
    /// received in slot order.
    fn dispatch(&mut self, call: u32) -> Result<Vec<Vec<u32>>, RdmaError> {
        let g = self.g;
        let lay = *self.lay;
        let experts_per_rank = g.num_local_experts();
        let mut next_slot = vec![0u32; g.num_experts as usize];
        for t in 0..g.tokens_per_rank {
            let staged = lay.dispatch_staging(t);
            let msg = self.message(call, self.rank, t);
            self.port.links.send.write(self.send_base() + staged, &msg);
            for &e in self.routing.experts(self.rank, t) {
                if e < 0 {
                    continue;
                }
                let e = e as u32;
                let (dst, le) = (e / experts_per_rank, e % experts_per_rank);
                let slot = next_slot[e as usize];
                next_slot[e as usize] += 1;
                let at = lay.dispatch_recv(le, self.rank, slot);
                let tg = tag(TagRole::LlDispatchData, self.rank, le, t);
                self.put(dst, le, staged, at, lay.dispatch_msg_bytes, tg)?;
            }
        }
        // Counts for every expert, on the QP its messages took.
        for e in 0..g.num_experts {
            let (dst, le) = (e / experts_per_rank, e % experts_per_rank);
            let n = next_slot[e as usize];
            let tg = tag(TagRole::LlDispatchCount, self.rank, le, n);
            self.signal(dst, le, lay.dispatch_count(le, self.rank), n as u64 + 1, tg)?;
        }

        // Receive: per (local expert, source) its count, then its slots.
        let sources = g.num_ranks;
        let mut received: Vec<Option<Vec<u32>>> = vec![None; (experts_per_rank * sources) as usize];
        let recv = self.port.links.recv;
        let base = self.recv_base(self.rank);
        loop {
            let mut worked = false;
            for le in 0..experts_per_rank {
                for s in 0..sources {
                    let i = (le * sources + s) as usize;
                    if received[i].is_some() {
                        continue;
                    }
                    let v = recv.load_u64(base + lay.dispatch_count(le, s));
                    if v == self.count_seen[i] {
                        continue;
                    }
                    let n = (v - self.count_seen[i] - 1) as u32;
                    self.count_seen[i] = v;
                    received[i] = Some(self.check_expert_tokens(call, le, s, n)?);
                    worked = true;
                }
            }
            if received.iter().all(Option::is_some) {
                break;
            }
            if worked {
                self.port.progressed();
            } else {
                let pending = || {
                    let missing: Vec<String> = received
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| r.is_none())
                        .take(8)
                        .map(|(i, _)| {
                            let (le, s) = (i as u32 / sources, i as u32 % sources);
                            format!("expert {} from rank {s}", self.rank * experts_per_rank + le)
                        })
                        .collect();
                    format!(
                        "dispatch counts ({} missing: {}…)",
                        received.iter().filter(|r| r.is_none()).count(),
                        missing.join(", ")
                    )
                };
                self.port.idle("LL dispatch receiver", pending)?;
            }
        }
        Ok(received.into_iter().map(|r| r.expect("all received")).collect())
    }

    /// Check the `n` messages from `src` for local expert `le` against the routing.
    fn check_expert_tokens(
        &mut self,
        call: u32,
        le: u32,
        src: u32,
        n: u32,
    ) -> Result<Vec<u32>, RdmaError> {
        let expert = self.rank * self.g.num_local_experts() + le;
        let want: Vec<u32> = (0..self.g.tokens_per_rank)
            .filter(|&t| self.routing.experts(src, t).contains(&(expert as i32)))
            .collect();
        let role = "LL dispatch receiver";
        if n as usize != want.len() {
            return Err(self.mismatch(
                role,
                format!(
                    "call {call}: rank {src} counted {n} tokens for expert {expert}; the routing \
                     selects it for {}",
                    want.len()
                ),
            ));
        }
        let lay = *self.lay;
        let base = self.recv_base(self.rank);
        let mut got = Vec::with_capacity(n as usize);
        for slot in 0..n {
            let m = self
                .port
                .links
                .recv
                .to_vec(base + lay.dispatch_recv(le, src, slot), lay.dispatch_msg_bytes as usize);
            let token = i32::from_le_bytes(m[..4].try_into().expect("4 bytes"));
            if token < 0 || token as u32 >= self.g.tokens_per_rank {
                return Err(self.mismatch(
                    role,
                    format!("call {call}: expert {expert} slot {slot} from rank {src} names token {token}"),
                ));
            }
            let want_msg = self.message(call, src, token as u32);
            if m != want_msg {
                let first = (0..m.len()).find(|&i| m[i] != want_msg[i]).expect("they differ");
                return Err(self.mismatch(
                    role,
                    format!(
                        "call {call}: expert {expert} slot {slot} from rank {src} (token {token}): \
                         byte {first} is {:#04x}, expected {:#04x}",
                        m[first], want_msg[first]
                    ),
                ));
            }
            got.push(token as u32);
            self.port.stats.tokens_checked += 1;
        }
        let mut sorted = got.clone();
        sorted.sort_unstable();
        if sorted != want {
            return Err(self.mismatch(
                role,
                format!("call {call}: expert {expert} from rank {src} got tokens {sorted:?}, the routing sends {want:?}"),
            ));
        }
        Ok(got)
    }

    /// Send each received token's row back to its source's `[expert][token]` slot and flag
    /// every (expert, source); then wait for this rank's flags and reduce.
    fn combine(&mut self, call: u32, received: &[Vec<u32>]) -> Result<(), RdmaError> {
        let g = self.g;
        let lay = *self.lay;
        let experts_per_rank = g.num_local_experts();
        let sources = g.num_ranks;
        for le in 0..experts_per_rank {
            let expert = self.rank * experts_per_rank + le;
            for s in 0..sources {
                for (slot, &t) in received[(le * sources + s) as usize].iter().enumerate() {
                    let staged = lay.combine_staging(le, s, slot as u32);
                    let row = self.row(call, s, t, expert);
                    self.port.links.send.write(self.send_base() + staged, &row);
                    let tg = tag(TagRole::LlCombineData, self.rank, le, t);
                    self.put(
                        s,
                        le,
                        staged,
                        lay.combine_recv(expert, t),
                        lay.combine_msg_bytes,
                        tg,
                    )?;
                }
                let tg = tag(TagRole::LlCombineFlag, self.rank, le, s);
                self.signal(s, le, lay.combine_flag(expert), 1, tg)?;
            }
        }

        let recv = self.port.links.recv;
        let base = self.recv_base(self.rank);
        let want_flag = call as u64 + 1;
        loop {
            let missing = (0..g.num_experts)
                .filter(|&e| recv.load_u64(base + lay.combine_flag(e)) < want_flag)
                .count();
            if missing == 0 {
                break;
            }
            self.port.idle("LL combine receiver", || {
                format!("combine flags of {missing} of {} experts (call {call})", g.num_experts)
            })?;
        }
        self.port.progressed();
        let hidden = g.hidden as usize;
        for t in 0..g.tokens_per_rank {
            let mut out = vec![0f32; hidden];
            let mut want = vec![0f32; hidden];
            let weights = self.routing.weights(self.rank, t);
            for (k, &e) in self.routing.experts(self.rank, t).iter().enumerate() {
                if e < 0 {
                    continue;
                }
                let e = e as u32;
                let got =
                    recv.to_vec(base + lay.combine_recv(e, t), lay.combine_msg_bytes as usize);
                let expect = self.row(call, self.rank, t, e);
                if got != expect {
                    let first = (0..got.len()).find(|&i| got[i] != expect[i]).expect("they differ");
                    return Err(self.mismatch(
                        "LL combine receiver",
                        format!(
                            "call {call}: row of expert {e} for token {t}: byte {first} is {:#04x}, expected {:#04x}",
                            got[first], expect[first]
                        ),
                    ));
                }
                self.port.stats.rows_checked += 1;
                for (i, v) in row_values(&got).into_iter().enumerate() {
                    out[i] += weights[k] * v;
                    want[i] += weights[k] * ll_expert_value(call, self.rank, t, e, i as u32);
                }
            }
            if let Some(i) = (0..hidden).find(|&i| out[i].to_bits() != want[i].to_bits()) {
                return Err(self.mismatch(
                    "LL combine",
                    format!(
                        "call {call}: token {t} element {i} is {}, expected {}",
                        out[i], want[i]
                    ),
                ));
            }
            self.port.stats.combined_checked += 1;
        }
        Ok(())
    }
}
