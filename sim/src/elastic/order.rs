//! Who handles which token in V2's kernels: channel c of a rank owns tokens c, c + C, ...
//! (hybrid_dispatch.cuh:389, dispatch.cuh:278-280); a forward warp takes ≤ 6 tokens of one
//! source domain per turn, round robin from `channel % scale-out ranks` + 1
//! (hybrid_dispatch.cuh:491-533); the combine replays that order (token_metadata_at_forward)
//! and its scale-up warps follow per-destination linked lists (hybrid_combine.cuh:150-198).

use eptwin_engine::api::{ElasticSettings, RoutingTable, SLOTS_PER_FORWARD_CHUNK};

/// A token a forward warp handles: its source rank and index, and the ranks of the forward
/// warp's domain it goes to (scale-up indices, one copy each).
#[derive(Debug, Clone)]
pub struct Fwd {
    pub src: u32,
    pub token: u32,
    pub dsts: Vec<u32>,
}

#[derive(Debug, Clone, Default)]
pub struct Order {
    /// Hybrid: per (rank, channel) the forward order in full-arrival form.
    pub fwd: Vec<Vec<Fwd>>,
    /// Hybrid: per (rank, channel, source domain) the tokens that arrive from it, in order.
    pub streams: Vec<Vec<Fwd>>,
    /// Hybrid combine: per (rank, channel, destination scale-up index) the positions in that
    /// forwarder's `fwd` list this rank sends a partial for, in order.
    pub lists: Vec<Vec<u32>>,
    /// Direct combine: per rank the (source, token) pairs it holds, in receive order.
    pub held: Vec<Vec<(u32, u32)>>,
}

impl Order {
    pub fn new(routing: &RoutingTable, e: &ElasticSettings, tokens: u32) -> Order {
        let n = routing.num_ranks;
        let ch = e.num_channels.max(1);
        let (so, su) = (e.num_scaleout_ranks, e.num_scaleup_ranks);
        let mut o = Order::default();
        let mut ranks = Vec::new();
        if !e.hybrid {
            o.held = vec![Vec::new(); n as usize];
            for src in 0..n {
                for t in 0..tokens {
                    routing.token_ranks(src, t, &mut ranks);
                    for &d in &ranks {
                        o.held[d as usize].push((src, t));
                    }
                }
            }
            return o;
        }
        // Per (receiving rank, channel, source domain): the source's tokens, in order.
        let rc = (n * ch) as usize;
        let mut streams: Vec<Vec<Fwd>> = vec![Vec::new(); rc * so as usize];
        for src in 0..n {
            let (m, i) = (src / su, src % su);
            for t in 0..tokens {
                routing.token_ranks(src, t, &mut ranks);
                let c = t % ch;
                for m2 in 0..so {
                    let dsts: Vec<u32> =
                        ranks.iter().filter(|&&r| r / su == m2).map(|&r| r % su).collect();
                    if dsts.is_empty() {
                        continue;
                    }
                    let recv = m2 * su + i;
                    let x = (recv * ch + c) as usize * so as usize + m as usize;
                    streams[x].push(Fwd { src, token: t, dsts });
                }
            }
        }
        o.fwd = vec![Vec::new(); rc];
        for r in 0..n {
            for c in 0..ch {
                let x = (r * ch + c) as usize;
                let mut pos = vec![0usize; so as usize];
                let mut cur = c % so;
                let mut out = Vec::new();
                loop {
                    let left: Vec<u32> = (0..so)
                        .filter(|&m| pos[m as usize] < streams[x * so as usize + m as usize].len())
                        .collect();
                    if left.is_empty() {
                        break;
                    }
                    let start = (cur + 1) % so;
                    cur = *left.iter().find(|&&m| m >= start).unwrap_or(&left[0]);
                    let s = &streams[x * so as usize + cur as usize];
                    let p = &mut pos[cur as usize];
                    let end = (*p + SLOTS_PER_FORWARD_CHUNK as usize).min(s.len());
                    out.extend(s[*p..end].iter().cloned());
                    *p = end;
                }
                o.fwd[x] = out;
            }
        }
        o.streams = streams;
        o.lists = vec![Vec::new(); rc * su as usize];
        for f in 0..n {
            let (m, j) = (f / su, f % su);
            for c in 0..ch {
                for (k, t) in o.fwd[(f * ch + c) as usize].iter().enumerate() {
                    for &d in &t.dsts {
                        let r = m * su + d;
                        o.lists[(r * ch + c) as usize * su as usize + j as usize].push(k as u32);
                    }
                }
            }
        }
        o
    }
}
