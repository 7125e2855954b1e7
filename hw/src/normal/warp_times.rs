//! `EPTWIN_CLUSTER_TIMES=1`: when the cluster kernels' warps finished, printed after the
//! host-checked iteration (a measurement aid; nothing in the result depends on it).

use super::NormalJob;
use crate::error::HwError;
use crate::exec::Devices;
use crate::probes::percentiles;

/// Per-token stamps of the cluster combine's reducers (`kTokenStamps` in intranode_cluster.cu).
pub(super) const CLUSTER_TOKEN_STAMPS: u32 = 32;
/// Per ring leader of the cluster combine, the end of its wait for each of its ring's first
/// elements (`kRingStamps` in intranode_cluster.cu).
pub(super) const CLUSTER_RING_STAMPS: u32 = 4;

impl NormalJob {
    /// `EPTWIN_CLUSTER_TIMES=1`: when the cluster kernel's warps finished (µs after the first
    /// block started): senders (the first n warps of a block) and receivers, as percentiles, and
    /// the clusters' finish times, to tell a uniform rate from a tail.
    pub(super) fn report_warp_times(
        &self,
        devs: &Devices,
        op: &str,
        warps: u32,
    ) -> Result<(), HwError> {
        let Some(buf) = &self.warp_times else { return Ok(()) };
        let combine = op == "combine";
        let stamps = if combine {
            (2 * CLUSTER_TOKEN_STAMPS + self.n * CLUSTER_RING_STAMPS) as usize
        } else {
            0
        };
        let per_block = (1 + warps) as usize + stamps;
        let blocks = (self.channels * self.n) as usize;
        let mut t = vec![0u64; blocks * per_block];
        devs.list[0].gpu.download(buf.ptr, &mut t)?;
        let start = (0..blocks).map(|b| t[b * per_block]).min().unwrap_or(0);
        let us = |v: u64| v.saturating_sub(start) as f64 / 1e3;
        let (mut senders, mut receivers, mut starts, mut clusters) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for b in 0..blocks {
            starts.push(us(t[b * per_block]));
            for w in 0..warps as usize {
                let end = us(t[b * per_block + 1 + w]);
                if w < self.n as usize { senders.push(end) } else { receivers.push(end) }
            }
        }
        for c in 0..self.channels as usize {
            let n = self.n as usize;
            let ends = (c * n..(c + 1) * n).flat_map(|b| (0..warps as usize).map(move |w| (b, w)));
            clusters.push(ends.map(|(b, w)| us(t[b * per_block + 1 + w])).fold(0.0, f64::max));
        }
        tracing::info!(
            "cluster {op} warp finish times (us after the first block's start): \
             block starts {}; senders {}; receivers {}; clusters {}",
            percentiles(&mut starts),
            percentiles(&mut senders),
            percentiles(&mut receivers),
            percentiles(&mut clusters)
        );
        if combine {
            // Per token k of a block's channel: when every partial was in shared memory
            // (ready) and when the reduction was done, after the block's own start; the wait
            // is ready(k) - done(k - 1).
            let tokens = self.routing.tokens_per_rank;
            let max_k =
                (CLUSTER_TOKEN_STAMPS as usize).min(tokens.div_ceil(self.channels) as usize);
            let mut line = String::new();
            for k in 0..max_k {
                let (mut ready, mut work, mut wait) = (Vec::new(), Vec::new(), Vec::new());
                for b in 0..blocks {
                    let base = b * per_block + 1 + warps as usize;
                    let (r, d) = (t[base + 2 * k], t[base + 2 * k + 1]);
                    if r == 0 || d == 0 {
                        continue; // this block's channel has fewer tokens
                    }
                    let prev = if k == 0 { t[b * per_block] } else { t[base + 2 * k - 1] };
                    ready.push(r.saturating_sub(t[b * per_block]) as f64 / 1e3);
                    work.push(d.saturating_sub(r) as f64 / 1e3);
                    wait.push(r.saturating_sub(prev) as f64 / 1e3);
                }
                if ready.is_empty() {
                    break;
                }
                let med = |v: &mut Vec<f64>| {
                    v.sort_by(|a, b| a.total_cmp(b));
                    v[v.len() / 2]
                };
                line.push_str(&format!(
                    " t{k} ready {:.2} wait {:.2} reduce {:.2} ({} blocks);",
                    med(&mut ready),
                    med(&mut wait),
                    med(&mut work),
                    ready.len()
                ));
            }
            tracing::info!(
                "cluster combine reducers per token (p50 over blocks, us after the \
                 block's start):{line}"
            );
            // Per ring element e: when its leader's wait ended, over every (block, ring) with
            // such an element, and per block the spread of its rings' first elements (one
            // landing order against landing together). A ring's first element belongs to the
            // first token that visited that rank: for the rings the channel's first token
            // visited (about k/n of them) the stamp is the landing; for the others it is when
            // the reducers got to that later token.
            let mut line = String::new();
            let mut spread = Vec::new();
            for e in 0..CLUSTER_RING_STAMPS as usize {
                let mut ends = Vec::new();
                for b in 0..blocks {
                    let base =
                        b * per_block + 1 + warps as usize + 2 * CLUSTER_TOKEN_STAMPS as usize;
                    let mine: Vec<f64> = (0..self.n as usize)
                        .map(|d| t[base + d * CLUSTER_RING_STAMPS as usize + e])
                        .filter(|&v| v != 0)
                        .map(|v| v.saturating_sub(t[b * per_block]) as f64 / 1e3)
                        .collect();
                    if e == 0 && mine.len() > 1 {
                        let lo = mine.iter().copied().fold(f64::MAX, f64::min);
                        let hi = mine.iter().copied().fold(0.0, f64::max);
                        spread.push(hi - lo);
                    }
                    ends.extend(mine);
                }
                if ends.is_empty() {
                    break;
                }
                line.push_str(&format!(" e{e} {};", percentiles(&mut ends)));
            }
            tracing::info!(
                "cluster combine ring elements landed (leader's wait end, us after the \
                 block's start):{line} first elements' spread within a block {}",
                percentiles(&mut spread)
            );
        }
        Ok(())
    }
}
