//! Token → expert routing, generated from the scenario seed so that the simulator and the
//! hardware move byte-identical workloads (a recorded routing is read by `routing_file.rs`
//! instead, and held by the plan the same way). Conventions follow DeepEP's tests (docs/design.md,
//! DeepEP §17).

use serde::{Deserialize, Serialize};

use crate::rng::Rng;
use crate::topology::NUM_MAX_NVL_PEERS;
use crate::workload::{Routing, Workload};

/// `topk_idx` and `topk_weights` for every rank, `[rank][token][slot]` flattened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingTable {
    pub num_ranks: u32,
    pub tokens_per_rank: u32,
    pub topk: u32,
    pub num_experts: u32,
    /// Expert per (rank, token, slot); -1 = masked (DeepEP's LL test masks a few entries).
    pub topk_idx: Vec<i32>,
    /// |N(0,1)| like DeepEP's tests (`torch.randn(...).abs()`).
    pub topk_weights: Vec<f32>,
}

impl RoutingTable {
    #[inline]
    fn offset(&self, rank: u32, token: u32) -> usize {
        ((rank as usize * self.tokens_per_rank as usize) + token as usize) * self.topk as usize
    }

    /// The selected experts of one token (with -1 for masked slots).
    #[inline]
    pub fn experts(&self, rank: u32, token: u32) -> &[i32] {
        let o = self.offset(rank, token);
        &self.topk_idx[o..o + self.topk as usize]
    }

    #[inline]
    pub fn weights(&self, rank: u32, token: u32) -> &[f32] {
        let o = self.offset(rank, token);
        &self.topk_weights[o..o + self.topk as usize]
    }

    pub fn experts_per_rank(&self) -> u32 {
        self.num_experts / self.num_ranks
    }

    /// Rank owning an expert (experts are spread evenly and contiguously, as in DeepEP).
    #[inline]
    pub fn rank_of_expert(&self, expert: u32) -> u32 {
        expert / self.experts_per_rank()
    }

    /// Distinct destination ranks of a token, ascending (DeepEP `is_token_in_rank`).
    pub fn token_ranks(&self, rank: u32, token: u32, out: &mut Vec<u32>) {
        out.clear();
        for &e in self.experts(rank, token) {
            if e >= 0 {
                out.push(self.rank_of_expert(e as u32));
            }
        }
        out.sort_unstable();
        out.dedup();
    }
}

/// Generate the routing of a workload for `num_ranks` ranks. Each rank draws from its own
/// stream of the seed, so tables for different rank counts share no accidental structure.
/// A `Routing::File` workload is not generated (its job holds the file's table); here every
/// one of its selections is masked.
pub fn generate(workload: &Workload, num_ranks: u32) -> RoutingTable {
    let topk = workload.topk as usize;
    let experts = workload.experts as usize;
    let tokens = workload.tokens_per_rank as usize;
    let total = num_ranks as usize * tokens * topk;
    let mut topk_idx = vec![-1i32; total];
    let mut topk_weights = vec![0f32; total];

    // Groups for node-limited routing are DeepEP nodes (8 ranks), as test_internode.py does.
    let num_groups = (num_ranks / NUM_MAX_NVL_PEERS).max(1) as usize;
    let group_width = experts / num_groups;
    let topk_groups = match workload.routing {
        Routing::NodeLimited { topk_groups } => topk_groups as usize,
        _ => 0,
    };

    // Zipf popularity, spread over the expert ids by a seeded permutation so that hot experts
    // do not all live on rank 0.
    let zipf_inv_weight: Vec<f64> = if let Routing::Zipf { skew } = workload.routing {
        let mut perm: Vec<usize> = (0..experts).collect();
        let mut rng = Rng::new(workload.seed, u64::MAX);
        for i in (1..experts).rev() {
            perm.swap(i, rng.below(i as u32 + 1) as usize);
        }
        let mut inv = vec![0.0; experts];
        for (popularity_rank, &e) in perm.iter().enumerate() {
            inv[e] = ((popularity_rank + 1) as f64).powf(skew); // 1 / weight
        }
        inv
    } else {
        Vec::new()
    };

    let mut scores = vec![0f64; experts];
    let mut draws = vec![0i64; experts];
    let mut order: Vec<u32> = (0..experts as u32).collect();
    let mut group_draws = vec![0i64; num_groups];
    let mut group_order: Vec<u32> = (0..num_groups as u32).collect();
    let mut swaps: Vec<usize> = Vec::with_capacity(topk);
    let mut kept: Vec<u32> = Vec::with_capacity(num_groups);

    for rank in 0..num_ranks as usize {
        let mut rng = Rng::new(workload.seed, rank as u64);
        for token in 0..tokens {
            let base = (rank * tokens + token) * topk;
            let slots = &mut topk_idx[base..base + topk];
            match workload.routing {
                Routing::Uniform => {
                    // Top-k of i.i.d. scores = a uniformly random ordered k-subset: partial
                    // Fisher-Yates, undone afterwards so `order` stays the identity.
                    swaps.clear();
                    for (k, slot) in slots.iter_mut().enumerate() {
                        let j = k + rng.below((experts - k) as u32) as usize;
                        order.swap(k, j);
                        swaps.push(j);
                        *slot = order[k] as i32;
                    }
                    for (k, &j) in swaps.iter().enumerate().rev() {
                        order.swap(k, j);
                    }
                }
                Routing::NodeLimited { .. } => {
                    // A score is the 53-bit integer `next_f64` scales to [0, 1): the same
                    // draws in the same order, compared as integers (exact) instead of floats.
                    // Drawn in expert order, each group's best kept on the way.
                    for (g, gs) in group_draws.iter_mut().enumerate() {
                        let mut best = i64::MIN;
                        for s in &mut draws[g * group_width..(g + 1) * group_width] {
                            *s = rng.next_u53();
                            best = best.max(*s);
                        }
                        *gs = best;
                    }
                    for s in &mut draws[num_groups * group_width..] {
                        *s = rng.next_u53();
                    }
                    top_indices(&group_draws, &mut group_order, topk_groups);
                    // The experts of the groups not kept score -1, below every kept one
                    // (scores are non-negative): with at least k kept, the top k are the kept
                    // experts' (and the ungrouped remainder's), found without the rest.
                    let kept_groups = topk_groups.min(num_groups);
                    let remainder = experts - num_groups * group_width;
                    if kept_groups * group_width + remainder >= topk {
                        kept.clear();
                        kept.extend_from_slice(&group_order[..kept_groups]);
                        kept.sort_unstable();
                        let mut top = TopK::new(&draws, &mut order, topk);
                        for &g in &kept {
                            let g = g as usize * group_width;
                            top.offer_range(g as u32..(g + group_width) as u32);
                        }
                        top.offer_range((num_groups * group_width) as u32..experts as u32);
                    } else {
                        for g in 0..num_groups {
                            if !group_order[..topk_groups].contains(&(g as u32)) {
                                draws[g * group_width..(g + 1) * group_width].fill(-1);
                            }
                        }
                        top_indices(&draws, &mut order, topk);
                    }
                    for (k, slot) in slots.iter_mut().enumerate() {
                        *slot = order[k] as i32;
                    }
                }
                // A file routing is read, not drawn (`routing_file.rs`; the job holds the
                // file's table): nothing to select here, the slots stay masked.
                Routing::File => {}
                Routing::Zipf { .. } => {
                    // Efraimidis-Spirakis: top-k of ln(U) / w is weighted sampling without
                    // replacement.
                    for (e, s) in scores.iter_mut().enumerate() {
                        *s = rng.next_f64_open0().ln() * zipf_inv_weight[e];
                    }
                    top_indices(&scores, &mut order, topk);
                    for (k, slot) in slots.iter_mut().enumerate() {
                        *slot = order[k] as i32;
                    }
                }
            }
            for w in &mut topk_weights[base..base + topk] {
                *w = rng.normal().abs() as f32;
            }
        }
        // DeepEP's LL test: `topk_idx[randint(T), randint(k)] = -1`, repeated (with replacement).
        for _ in 0..workload.masked_selections {
            let t = rng.below(tokens as u32) as usize;
            let k = rng.below(topk as u32) as usize;
            topk_idx[(rank * tokens + t) * topk + k] = -1;
        }
    }

    RoutingTable {
        num_ranks,
        tokens_per_rank: workload.tokens_per_rank,
        topk: workload.topk,
        num_experts: workload.experts,
        topk_idx,
        topk_weights,
    }
}

/// A score [`top_indices`] ranks by: a total order, larger first.
trait Score: Copy {
    /// `self` ranks strictly before `other`.
    fn beats(self, other: Self) -> bool;
}

impl Score for f64 {
    #[inline(always)]
    fn beats(self, other: f64) -> bool {
        self.total_cmp(&other).is_gt()
    }
}

impl Score for i64 {
    #[inline(always)]
    fn beats(self, other: i64) -> bool {
        self > other
    }
}

/// Put the indices of the `k` largest values first in `order` (descending; ties by index;
/// what follows them is unspecified).
///
/// One pass keeping the best `k` so far in order: a value enters only when it beats the
/// `k`-th best, which for random scores happens ≈ k·ln(n/k) times (a selection plus a sort
/// of the whole index array took ≈ 8 % of an EP64 normal run's time). The order is total
/// (value, then index), so the result is the one any exact top-k gives.
fn top_indices<V: Score>(values: &[V], order: &mut [u32], k: usize) {
    TopK::new(values, order, k).offer_range(0..values.len() as u32);
}

/// [`top_indices`] built up over candidates offered in increasing index order (the others
/// are not looked at): the best `k` so far in `order[..n]`, descending.
struct TopK<'a, V> {
    values: &'a [V],
    order: &'a mut [u32],
    k: usize,
    n: usize,
}

impl<'a, V: Score> TopK<'a, V> {
    fn new(values: &'a [V], order: &'a mut [u32], k: usize) -> Self {
        let k = k.min(values.len()).min(order.len());
        TopK { values, order, k, n: 0 }
    }

    /// Offer every index of `range` (increasing, above those offered before).
    #[inline(always)]
    fn offer_range(&mut self, range: std::ops::Range<u32>) {
        let (values, order, k) = (self.values, &mut *self.order, self.k);
        if k == 0 {
            return;
        }
        let mut n = self.n;
        // The k-th best value while k are kept: most candidates are turned away by it alone.
        let mut kth = (n == k).then(|| values[order[k - 1] as usize]);
        for i in range {
            let v = values[i as usize];
            // `i` (a later index) ranks before `order[j]` only with a strictly larger value:
            // an equal value keeps the smaller index first.
            let mut pos = match kth {
                None => {
                    n += 1;
                    n - 1
                }
                Some(kth) if v.beats(kth) => k - 1,
                Some(_) => continue,
            };
            while pos > 0 && v.beats(values[order[pos - 1] as usize]) {
                order[pos] = order[pos - 1];
                pos -= 1;
            }
            order[pos] = i;
            if n == k {
                kth = Some(values[order[k - 1] as usize]);
            }
        }
        self.n = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::schema::{RoutingKind, WorkloadSpec};

    /// The one-pass top-k gives what a selection and a sort under the same total order give,
    /// with many ties and for every k.
    #[test]
    fn top_indices_matches_select_and_sort() {
        let mut rng = Rng::new(9, 0);
        for case in 0..2_000 {
            let n = 1 + rng.below(300) as usize;
            let distinct = 1 + rng.below(if case % 2 == 0 { 4 } else { 1_000 });
            let values: Vec<f64> = (0..n).map(|_| rng.below(distinct) as f64 - 1.0).collect();
            let k = rng.below(n as u32 + 2) as usize;
            let mut want: Vec<u32> = (0..n as u32).collect();
            want.sort_unstable_by(|a, b| {
                values[*b as usize].total_cmp(&values[*a as usize]).then(a.cmp(b))
            });
            let mut got = vec![u32::MAX; n];
            top_indices(&values, &mut got, k);
            let k = k.min(n);
            assert_eq!(got[..k], want[..k], "n {n} k {k} values {values:?}");
        }
    }

    /// Node-limited routing looks only at the kept groups' experts, and selects what masking
    /// the others to -1 and taking the top k of all gives (ties, an ungrouped remainder, and
    /// fewer kept experts than k included).
    #[test]
    fn node_limited_selection_matches_masking_the_other_groups() {
        for (ranks, experts, topk, groups) in [
            (32, 256, 8, 4),
            (160, 320, 8, 4),
            (24, 250, 8, 2),
            (16, 16, 8, 1),
            (24, 24, 9, 1),
            (64, 256, 9, 3),
        ] {
            let mut w = workload(RoutingKind::NodeLimited, 16, experts);
            w.topk = topk;
            w.topk_groups = Some(groups);
            let got = generate(&w, ranks);
            let workload = Workload::from_spec(&w, ranks);
            let num_groups = (ranks / NUM_MAX_NVL_PEERS).max(1) as usize;
            let width = experts as usize / num_groups;
            let mut scores = vec![0f64; experts as usize];
            let mut order: Vec<u32> = (0..experts).collect();
            let mut group_order: Vec<u32> = (0..num_groups as u32).collect();
            for rank in 0..ranks {
                let mut rng = Rng::new(workload.seed, rank as u64);
                for token in 0..16 {
                    for s in scores.iter_mut() {
                        *s = rng.next_f64();
                    }
                    let group_scores: Vec<f64> = (0..num_groups)
                        .map(|g| {
                            scores[g * width..(g + 1) * width]
                                .iter()
                                .fold(f64::MIN, |a, &b| a.max(b))
                        })
                        .collect();
                    top_indices(&group_scores, &mut group_order, groups as usize);
                    for g in 0..num_groups {
                        if !group_order[..groups as usize].contains(&(g as u32)) {
                            scores[g * width..(g + 1) * width].fill(-1.0);
                        }
                    }
                    top_indices(&scores, &mut order, topk as usize);
                    let want: Vec<i32> = order[..topk as usize].iter().map(|&e| e as i32).collect();
                    assert_eq!(
                        got.experts(rank, token),
                        &want[..],
                        "EP{ranks} E{experts} rank {rank} token {token}"
                    );
                    for _ in 0..topk {
                        rng.normal();
                    }
                }
            }
        }
    }

    /// Routing of a `[job.workload]` table for `ranks` ranks, as a plan generates it.
    fn generate(w: &WorkloadSpec, ranks: u32) -> RoutingTable {
        super::generate(&Workload::from_spec(w, ranks), ranks)
    }

    fn workload(routing: RoutingKind, tokens: u32, experts: u32) -> WorkloadSpec {
        let mut w: WorkloadSpec = toml::from_str(&format!(
            "tokens_per_rank = {tokens}\nhidden = 7168\ntopk = 8\nexperts = {experts}"
        ))
        .unwrap();
        w.routing = routing;
        w
    }

    fn mean_distinct(table: &RoutingTable, group: u32) -> f64 {
        let mut total = 0usize;
        let mut seen = Vec::new();
        for r in 0..table.num_ranks {
            for t in 0..table.tokens_per_rank {
                seen.clear();
                seen.extend(
                    table
                        .experts(r, t)
                        .iter()
                        .filter(|&&e| e >= 0)
                        .map(|&e| table.rank_of_expert(e as u32) / group),
                );
                seen.sort_unstable();
                seen.dedup();
                total += seen.len();
            }
        }
        total as f64 / (table.num_ranks * table.tokens_per_rank) as f64
    }

    #[test]
    fn selections_are_distinct_and_in_range() {
        for kind in [RoutingKind::Uniform, RoutingKind::NodeLimited, RoutingKind::Zipf] {
            let mut w = workload(kind, 64, 256);
            w.skew = Some(1.2);
            let table = generate(&w, 32);
            for r in 0..32 {
                for t in 0..64 {
                    let mut e: Vec<i32> = table.experts(r, t).to_vec();
                    assert!(e.iter().all(|&x| (0..256).contains(&x)));
                    e.sort_unstable();
                    e.dedup();
                    assert_eq!(e.len(), 8, "{kind:?}: duplicate expert");
                }
            }
        }
    }

    #[test]
    fn statistics_match_the_reference_tables() {
        // docs/design.md, fabric §9: E=256, k=8 — D_G (distinct GPUs) 5.30 at EP8; test routing at
        // EP32: distinct nodes 3.61, distinct GPUs 7.27; EP64: nodes 3.98.
        let ep8 = generate(&workload(RoutingKind::Uniform, 4096, 256), 8);
        assert!((mean_distinct(&ep8, 1) - 5.30).abs() < 0.03, "{}", mean_distinct(&ep8, 1));
        let ep32 = generate(&workload(RoutingKind::NodeLimited, 512, 256), 32);
        assert!((mean_distinct(&ep32, 8) - 3.61).abs() < 0.03, "{}", mean_distinct(&ep32, 8));
        assert!((mean_distinct(&ep32, 1) - 7.27).abs() < 0.03, "{}", mean_distinct(&ep32, 1));
        let ep64 = generate(&workload(RoutingKind::NodeLimited, 256, 256), 64);
        assert!((mean_distinct(&ep64, 8) - 3.98).abs() < 0.02, "{}", mean_distinct(&ep64, 8));
        assert!((mean_distinct(&ep64, 1) - 7.48).abs() < 0.04, "{}", mean_distinct(&ep64, 1));
    }

    #[test]
    fn masking_and_determinism() {
        let mut w = workload(RoutingKind::Uniform, 128, 288);
        w.masked_selections = 10;
        let a = generate(&w, 8);
        let b = generate(&w, 8);
        assert_eq!(a, b);
        let masked = a.topk_idx[..128 * 8].iter().filter(|&&e| e < 0).count();
        assert!((1..=10).contains(&masked));
        w.seed = 2;
        assert_ne!(generate(&w, 8).topk_idx, a.topk_idx);
    }

    #[test]
    fn zipf_is_skewed() {
        let mut w = workload(RoutingKind::Zipf, 2048, 64);
        w.skew = Some(1.5);
        let t = generate(&w, 8);
        let mut counts = vec![0u32; 64];
        for &e in &t.topk_idx {
            counts[e as usize] += 1;
        }
        counts.sort_unstable();
        assert!(counts[63] > 4 * counts[32], "hottest expert far above the median: {counts:?}");
    }
}
