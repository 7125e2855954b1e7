//! What every receiving rank must end up with, from the engine's routing table alone: the host
//! side of DeepEP's intranode layout (rows ordered by source rank, then channel, then token).

use eptwin_engine::plan::{RoutingTable, channel_range};

/// What one receiving rank must end up with after dispatch.
#[derive(Debug, Clone, Default)]
pub struct RecvExpectation {
    /// (source rank, source token) of each received row, in row order.
    pub rows: Vec<(u32, u32)>,
    /// Inclusive prefix over source ranks of the rows received.
    pub rank_prefix: Vec<i32>,
    /// [source][channel] offset of the channel's first row within the source's block.
    pub channel_offset: Vec<i32>,
    pub per_expert: Vec<i32>,
}

/// Where every token lands: for each receiver, rows ordered by source rank, then channel, then
/// token (DeepEP's intranode layout).
pub fn expectations(routing: &RoutingTable, channels: u32) -> Vec<RecvExpectation> {
    let n = routing.num_ranks;
    let l = routing.experts_per_rank();
    let mut out: Vec<RecvExpectation> = (0..n)
        .map(|_| RecvExpectation {
            rows: Vec::new(),
            rank_prefix: vec![0; n as usize],
            channel_offset: vec![0; (n * channels) as usize],
            per_expert: vec![0; l as usize],
        })
        .collect();
    let mut ranks = Vec::new();
    for s in 0..n {
        let mut before = vec![0i32; n as usize];
        for c in 0..channels {
            for d in 0..n as usize {
                out[d].channel_offset[s as usize * channels as usize + c as usize] = before[d];
            }
            let (ts, te) = channel_range(routing.tokens_per_rank, channels, c);
            for t in ts..te {
                routing.token_ranks(s, t, &mut ranks);
                for &d in &ranks {
                    out[d as usize].rows.push((s, t));
                    before[d as usize] += 1;
                }
                for &e in routing.experts(s, t) {
                    if e >= 0 {
                        let d = routing.rank_of_expert(e as u32);
                        out[d as usize].per_expert[(e as u32 - d * l) as usize] += 1;
                    }
                }
            }
        }
        for d in 0..n as usize {
            let prev = if s > 0 { out[d].rank_prefix[s as usize - 1] } else { 0 };
            out[d].rank_prefix[s as usize] = prev + before[d];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use eptwin_engine::plan::Workload;

    fn routing(n: u32, tokens: u32) -> RoutingTable {
        eptwin_engine::routing::generate(&Workload::new(tokens, 256, 4, n * 4), n)
    }

    #[test]
    fn expectations_conserve_tokens() {
        let rt = routing(8, 100);
        let ex = expectations(&rt, 12);
        let mut ranks = Vec::new();
        let mut total = 0;
        for s in 0..8 {
            for t in 0..100 {
                rt.token_ranks(s, t, &mut ranks);
                total += ranks.len();
            }
        }
        assert_eq!(ex.iter().map(|e| e.rows.len()).sum::<usize>(), total);
        for (d, e) in ex.iter().enumerate() {
            assert_eq!(*e.rank_prefix.last().unwrap() as usize, e.rows.len());
            // Rows are grouped by source rank, ascending.
            assert!(e.rows.windows(2).all(|w| w[0].0 <= w[1].0), "rank {d}");
            // Within a source, channel offsets point at the first row of each channel.
            for s in 0..8u32 {
                let begin = if s > 0 { e.rank_prefix[s as usize - 1] } else { 0 } as usize;
                for c in 0..12u32 {
                    let off = e.channel_offset[(s * 12 + c) as usize] as usize;
                    let (ts, _) = channel_range(100, 12, c);
                    if let Some(&(rs, rt_)) = e.rows.get(begin + off)
                        && rs == s
                    {
                        assert!(rt_ >= ts);
                    }
                }
            }
            let per_expert: i32 = e.per_expert.iter().sum();
            assert!(per_expert as usize >= e.rows.len());
        }
    }
}
