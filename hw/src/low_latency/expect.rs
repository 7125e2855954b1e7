//! What every receiving rank's local experts must hold after dispatch, from the engine's routing
//! table alone.

use eptwin_engine::api::RoutingTable;

/// What a receiving rank's local expert must hold after dispatch: per source rank, the
/// (token, top-k slot) pairs in token order.
#[derive(Debug, Clone, Default)]
pub struct ExpertExpectation {
    pub from: Vec<Vec<(u32, u32)>>,
}

impl ExpertExpectation {
    pub fn count(&self) -> usize {
        self.from.iter().map(|v| v.len()).sum()
    }
}

/// `[rank][local expert]` expectations from the routing.
pub fn expectations(routing: &RoutingTable) -> Vec<Vec<ExpertExpectation>> {
    let n = routing.num_ranks as usize;
    let l = routing.experts_per_rank() as usize;
    let mut out = vec![vec![ExpertExpectation { from: vec![Vec::new(); n] }; l]; n];
    for s in 0..routing.num_ranks {
        for t in 0..routing.tokens_per_rank {
            for (k, &e) in routing.experts(s, t).iter().enumerate() {
                if e >= 0 {
                    let (d, le) = (e as usize / l, e as usize % l);
                    out[d][le].from[s as usize].push((t, k as u32));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::low_latency::LlJob;
    use eptwin_engine::api::Workload;

    #[test]
    fn expectations_cover_every_selection() {
        let spec = Workload { masked_selections: 10, ..Workload::new(64, 256, 8, 64) };
        let rt = eptwin_engine::api::generate_routing(&spec, 8);
        let ex = expectations(&rt);
        let total: usize = ex.iter().flatten().map(|e| e.count()).sum();
        assert_eq!(total as u64, rt.topk_idx.iter().filter(|&&e| e >= 0).count() as u64);
        for per_rank in &ex {
            for e in per_rank {
                for v in &e.from {
                    assert!(
                        v.windows(2).all(|w| w[0].0 < w[1].0),
                        "a token selects an expert once"
                    );
                }
            }
        }
        let cap = LlJob::capacity(&ex);
        assert_eq!(cap % 16, 0);
        assert!(cap as usize >= ex.iter().flatten().map(|e| e.count()).max().unwrap());
    }
}
