//! The numbers the protocol is laid out from, as plain integers (a job plan's ranks, ranks per
//! node, channels = `num_sms / 2`, `rdma_send` / `rdma_recv`, hidden, dtype, top-k, experts,
//! tokens, QPs per peer), and the QP table every process of a job builds the same way. A
//! geometry is read from a validated plan (`gpu::job_geometry`): the engine's rules hold for it
//! (experts divide over ranks, rings of a multiple of the send chunk and at least twice it, FP8
//! rows of whole 128-element blocks, at least one QP), so nothing here checks them again.

use eptwin_engine::plan::{Dtype, channel_range};

/// How a dispatched token's payload is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenDtype {
    /// One byte per element plus one f32 scale per 128 elements.
    Fp8,
    /// Two bytes per element.
    Bf16,
}

impl TokenDtype {
    pub(crate) fn engine(self) -> Dtype {
        match self {
            TokenDtype::Fp8 => Dtype::Fp8,
            TokenDtype::Bf16 => Dtype::Bf16,
        }
    }

    /// Payload bytes of one token (without scales).
    pub fn payload_bytes(self, hidden: u32) -> u64 {
        match self {
            TokenDtype::Fp8 => hidden as u64,
            TokenDtype::Bf16 => 2 * hidden as u64,
        }
    }

    /// Scale bytes of one token (FP8: an f32 per 128 elements).
    pub fn scale_bytes(self, hidden: u32) -> u64 {
        match self {
            TokenDtype::Fp8 => eptwin_engine::deepep::bytes::fp8_scale_bytes(hidden),
            TokenDtype::Bf16 => 0,
        }
    }
}

/// One job's protocol geometry. Rank `r` lives on node `r / ranks_per_node` with local index
/// `r % ranks_per_node`; one process per node runs its `ranks_per_node` ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub num_ranks: u32,
    pub ranks_per_node: u32,
    pub hidden: u32,
    pub topk: u32,
    pub num_experts: u32,
    /// Tokens each rank dispatches.
    pub tokens_per_rank: u32,
    /// Low-latency receive slots per (local expert, source rank):
    /// `num_max_dispatch_tokens_per_rank` (≥ `tokens_per_rank`).
    pub max_tokens_per_rank: u32,
    pub dispatch_dtype: TokenDtype,
    /// Normal kernels: `num_sms / 2`.
    pub num_channels: u32,
    /// Normal dispatch: tokens per RDMA put and credit-return granularity (the dispatch
    /// config's `rdma_send`).
    pub rdma_send_tokens: u32,
    /// Normal dispatch: ring slots per (source node, channel) (`rdma_recv`, rounded up to a
    /// multiple of `rdma_send`).
    pub rdma_recv_tokens: u32,
    /// Normal combine: the combine config's `rdma_send` and rounded `rdma_recv`.
    pub combine_rdma_send_tokens: u32,
    pub combine_rdma_recv_tokens: u32,
    /// `num_qps_per_rank`: QPs between two ranks that exchange over the wire.
    pub qps_per_peer: u32,
}

impl Geometry {
    pub fn num_nodes(&self) -> u32 {
        self.num_ranks / self.ranks_per_node.max(1)
    }

    pub fn node_of(&self, rank: u32) -> u32 {
        rank / self.ranks_per_node
    }

    pub fn local_of(&self, rank: u32) -> u32 {
        rank % self.ranks_per_node
    }

    pub fn rank_of(&self, node: u32, local: u32) -> u32 {
        node * self.ranks_per_node + local
    }

    pub fn num_local_experts(&self) -> u32 {
        self.num_experts / self.num_ranks.max(1)
    }

    /// Channel `c`'s token range `[start, end)`: the plan's `channel_range` (DeepEP
    /// `get_channel_task_range`).
    pub fn channel_tokens(&self, channel: u32) -> (u32, u32) {
        channel_range(self.tokens_per_rank, self.num_channels.max(1), channel)
    }
}

/// Which kernels' traffic a QP table carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// Normal internode kernels: QPs only between ranks of one rail (the same local index on
    /// each node; DeepEP's per-rail NVSHMEM worlds).
    Normal,
    /// Low-latency kernels: QPs between every pair of ranks on different nodes.
    LowLatency,
}

/// One process's QP table: the index a doorbell's `qp` field carries. Entries are grouped by
/// peer process (peer nodes ascending, this node skipped), then by local source rank, then
/// (low-latency) by the remote rank's local index, then by the QP number `0..qps_per_peer`:
///
/// * normal: `index = (peer_slot · ranks_per_node + local) · qps_per_peer + q`
/// * low-latency: `index = ((peer_slot · ranks_per_node + local_src) · ranks_per_node +
///   local_dst) · qps_per_peer + q`
///
/// where `peer_slot` is the peer node's position among the other nodes. The entry at one end
/// and the entry it is connected to at the other end are [`QpTable::mirror`]s of each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpTable {
    pub traffic: Traffic,
    pub node: u32,
    pub num_nodes: u32,
    pub ranks_per_node: u32,
    pub qps_per_peer: u32,
}

impl QpTable {
    pub fn new(traffic: Traffic, geometry: &Geometry, node: u32) -> Self {
        QpTable {
            traffic,
            node,
            num_nodes: geometry.num_nodes(),
            ranks_per_node: geometry.ranks_per_node,
            qps_per_peer: geometry.qps_per_peer,
        }
    }

    /// Entries per peer process.
    pub fn per_process(&self) -> u32 {
        match self.traffic {
            Traffic::Normal => self.ranks_per_node * self.qps_per_peer,
            Traffic::LowLatency => self.ranks_per_node * self.ranks_per_node * self.qps_per_peer,
        }
    }

    pub fn len(&self) -> u32 {
        (self.num_nodes - 1) * self.per_process()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The other nodes, ascending (the peer-slot order).
    pub fn peer_nodes(&self) -> Vec<u32> {
        (0..self.num_nodes).filter(|&n| n != self.node).collect()
    }

    fn slot_of(&self, peer_node: u32) -> u32 {
        debug_assert_ne!(peer_node, self.node, "no QPs to the own node");
        if peer_node < self.node { peer_node } else { peer_node - 1 }
    }

    /// The entry for QP `q` (taken modulo `qps_per_peer`, as NVSHMEM wraps QP ids) from local
    /// rank `local_src` to the rank with local index `local_dst` on `peer_node`. Normal traffic
    /// has `local_dst == local_src` (one rail).
    pub fn index(&self, peer_node: u32, local_src: u32, local_dst: u32, q: u32) -> u32 {
        let q = q % self.qps_per_peer;
        let within = match self.traffic {
            Traffic::Normal => {
                debug_assert_eq!(local_src, local_dst, "normal traffic stays on its rail");
                local_src * self.qps_per_peer + q
            }
            Traffic::LowLatency => {
                (local_src * self.ranks_per_node + local_dst) * self.qps_per_peer + q
            }
        };
        self.slot_of(peer_node) * self.per_process() + within
    }

    /// The peer node entry `index` reaches.
    pub fn peer_of(&self, index: u32) -> u32 {
        let slot = index / self.per_process();
        if slot < self.node { slot } else { slot + 1 }
    }

    /// The node numbers of every entry, in table order (what a wire's peer list is).
    pub fn peers(&self) -> Vec<u32> {
        (0..self.len()).map(|i| self.peer_of(i)).collect()
    }

    /// For the entry at `within` (its position among one peer's entries) at this end, the
    /// position of the entry it connects to among the peer's entries for this node.
    pub fn mirror(&self, within: u32) -> u32 {
        match self.traffic {
            Traffic::Normal => within,
            Traffic::LowLatency => {
                let q = within % self.qps_per_peer;
                let pair = within / self.qps_per_peer;
                let (src, dst) = (pair / self.ranks_per_node, pair % self.ranks_per_node);
                (dst * self.ranks_per_node + src) * self.qps_per_peer + q
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn small() -> Geometry {
        Geometry {
            num_ranks: 8,
            ranks_per_node: 4,
            hidden: 256,
            topk: 3,
            num_experts: 16,
            tokens_per_rank: 10,
            max_tokens_per_rank: 12,
            dispatch_dtype: TokenDtype::Fp8,
            num_channels: 3,
            rdma_send_tokens: 2,
            rdma_recv_tokens: 4,
            combine_rdma_send_tokens: 1,
            combine_rdma_recv_tokens: 3,
            qps_per_peer: 5,
        }
    }

    #[test]
    fn channel_ranges_cover_the_tokens_once() {
        let g = small();
        let ranges: Vec<_> = (0..3).map(|c| g.channel_tokens(c)).collect();
        assert_eq!(ranges, vec![(0, 4), (4, 8), (8, 10)]);
        let g = Geometry { tokens_per_rank: 2, num_channels: 4, ..small() };
        assert_eq!(
            (0..4).map(|c| g.channel_tokens(c)).collect::<Vec<_>>(),
            vec![(0, 1), (1, 2), (2, 2), (2, 2)]
        );
    }

    proptest::proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        /// Every entry is reached from exactly one (peer, src, dst, q), maps back to its peer,
        /// and the two ends of every connection name each other.
        #[test]
        fn qp_tables_are_bijective_and_mirrored(nodes in 2u32..5, rpn in 1u32..5, qps in 1u32..4,
                                               ll: bool) {
            let traffic = if ll { Traffic::LowLatency } else { Traffic::Normal };
            let g = Geometry { num_ranks: nodes * rpn, ranks_per_node: rpn, qps_per_peer: qps,
                               ..small() };
            for node in 0..nodes {
                let t = QpTable::new(traffic, &g, node);
                let mut seen = vec![false; t.len() as usize];
                for peer in t.peer_nodes() {
                    let back = QpTable::new(traffic, &g, peer);
                    for src in 0..rpn {
                        for dst in 0..rpn {
                            if traffic == Traffic::Normal && dst != src {
                                continue;
                            }
                            for q in 0..qps {
                                let i = t.index(peer, src, dst, q);
                                proptest::prop_assert!(!seen[i as usize]);
                                seen[i as usize] = true;
                                proptest::prop_assert_eq!(t.peer_of(i), peer);
                                let within = i % t.per_process();
                                let other = back.index(node, dst, src, q) % back.per_process();
                                proptest::prop_assert_eq!(t.mirror(within), other);
                            }
                        }
                    }
                }
                proptest::prop_assert!(seen.iter().all(|&s| s));
                proptest::prop_assert_eq!(t.peers().len() as u32, t.len());
            }
        }
    }
}
