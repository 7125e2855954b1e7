//! DeepEP's dispatch layout (`get_dispatch_layout`, docs/design.md, DeepEP §17): what each source
//! rank computes from its `topk_idx` before dispatching. Both backends check their own layout
//! against this one.

use serde::{Deserialize, Serialize};

use crate::routing::RoutingTable;
use crate::topology::NUM_MAX_NVL_PEERS;

/// The layout of one source rank's tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchLayout {
    /// Tokens with at least one selected expert on each rank (`num_tokens_per_rank`).
    pub num_tokens_per_rank: Vec<u32>,
    /// Tokens reaching each DeepEP node (`num_tokens_per_rdma_rank`); empty with ≤ 8 ranks,
    /// where DeepEP returns `None`.
    pub num_tokens_per_rdma_rank: Vec<u32>,
    /// Selections per global expert (`num_tokens_per_expert`).
    pub num_tokens_per_expert: Vec<u32>,
    /// `is_token_in_rank[token * num_ranks + rank]`.
    pub is_token_in_rank: Vec<bool>,
}

impl DispatchLayout {
    /// The layout of `rank`'s tokens under `routing` (masked `-1` slots select nothing).
    pub fn of(routing: &RoutingTable, rank: u32) -> DispatchLayout {
        let n = routing.num_ranks as usize;
        let nodes =
            if routing.num_ranks > NUM_MAX_NVL_PEERS { n / NUM_MAX_NVL_PEERS as usize } else { 0 };
        let tokens = routing.tokens_per_rank as usize;
        let mut layout = DispatchLayout {
            num_tokens_per_rank: vec![0; n],
            num_tokens_per_rdma_rank: vec![0; nodes],
            num_tokens_per_expert: vec![0; routing.num_experts as usize],
            is_token_in_rank: vec![false; tokens * n],
        };
        let mut ranks = Vec::new();
        let mut last_node = u32::MAX;
        for t in 0..routing.tokens_per_rank {
            for &e in routing.experts(rank, t) {
                if e >= 0 {
                    layout.num_tokens_per_expert[e as usize] += 1;
                }
            }
            routing.token_ranks(rank, t, &mut ranks);
            for &r in &ranks {
                layout.num_tokens_per_rank[r as usize] += 1;
                layout.is_token_in_rank[t as usize * n + r as usize] = true;
                let node = r / NUM_MAX_NVL_PEERS;
                // `ranks` is ascending, so a token's nodes come in order: count each once.
                if nodes > 0 && node != last_node {
                    layout.num_tokens_per_rdma_rank[node as usize] += 1;
                    last_node = node;
                }
            }
            last_node = u32::MAX;
        }
        layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::generate;
    use crate::scenario::schema::{RoutingKind, WorkloadSpec};
    use proptest::prelude::*;

    fn routing(
        ranks: u32,
        tokens: u32,
        experts: u32,
        topk: u32,
        masked: u32,
        seed: u64,
    ) -> RoutingTable {
        let mut w: WorkloadSpec = toml::from_str(&format!(
            "tokens_per_rank = {tokens}\nhidden = 2048\ntopk = {topk}\nexperts = {experts}"
        ))
        .unwrap();
        w.routing = RoutingKind::Uniform;
        w.masked_selections = masked;
        w.seed = seed;
        generate(&crate::workload::Workload::from_spec(&w, ranks), ranks)
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(256))]
        #[test]
        fn layout_is_consistent(seed in any::<u64>(), nodes in 1u32..5, topk in 1u32..9, masked in 0u32..20) {
            let ranks = nodes * 8;
            let r = routing(ranks, 64, ranks * 4, topk, masked, seed);
            for rank in [0, ranks - 1] {
                let l = DispatchLayout::of(&r, rank);
                let valid: u32 = (0..64).map(|t| r.experts(rank, t).iter().filter(|&&e| e >= 0).count() as u32).sum();
                prop_assert_eq!(l.num_tokens_per_expert.iter().sum::<u32>(), valid);
                let in_rank = l.is_token_in_rank.iter().filter(|&&b| b).count() as u32;
                prop_assert_eq!(l.num_tokens_per_rank.iter().sum::<u32>(), in_rank);
                // A token counts once per node however many of the node's ranks it reaches.
                if nodes > 1 {
                    for node in 0..nodes as usize {
                        let expect = (0..64usize)
                            .filter(|&t| (0..8).any(|i| l.is_token_in_rank[t * ranks as usize + node * 8 + i]))
                            .count() as u32;
                        prop_assert_eq!(l.num_tokens_per_rdma_rank[node], expect);
                    }
                } else {
                    prop_assert!(l.num_tokens_per_rdma_rank.is_empty());
                }
                for (e, &count) in l.num_tokens_per_expert.iter().enumerate() {
                    let owner = r.rank_of_expert(e as u32) as usize;
                    prop_assert!(count <= l.num_tokens_per_rank[owner]);
                }
            }
        }
    }
}
