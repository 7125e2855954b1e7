//! The host checks of one dispatch and one combine (DeepEP `test_intranode.py`'s), and the
//! output digests every iteration is compared with.

use std::collections::BTreeMap;

use rayon::prelude::*;

use super::{NormalJob, payload_bytes};
use crate::data::{self, bytes_of_u16};
use crate::error::HwError;
use crate::exec::{Devices, DigestRegion, Failures, bf16_close, dev_of_ref, digest_ranks};

impl NormalJob {
    /// Each local rank's dispatch outputs, digested (the per-iteration race check sums them).
    pub(super) fn digest_dispatch(&self, devs: &Devices) -> Result<BTreeMap<u32, u64>, HwError> {
        let pay = payload_bytes(self.hidden, self.fp8);
        digest_ranks(devs, |r| {
            let b = &self.bufs[&r];
            let rows = self.expect[r as usize].rows.len() as u64;
            let mut regions = vec![rows_region(b.recv_x.ptr, rows, pay)];
            if self.fp8 {
                regions.push(rows_region(b.recv_x_scales.ptr, rows, self.hidden as u64 / 128 * 4));
            }
            regions.push(rows_region(b.recv_src_idx.ptr, rows, 4));
            regions.push(rows_region(b.recv_topk_idx.ptr, rows, self.topk as u64 * 4));
            regions.push(rows_region(b.recv_topk_weights.ptr, rows, self.topk as u64 * 4));
            regions
        })
    }

    /// The full host check of one dispatch (DeepEP test_intranode.py's checks).
    pub(super) fn check_dispatch(
        &self,
        devs: &Devices,
        gpu_of_rank: &[u32],
    ) -> Result<(Vec<String>, Vec<String>), HwError> {
        let (n, k, h) = (self.n as usize, self.topk as usize, self.hidden as usize);
        let l = (self.experts / self.n) as usize;
        let s_per = if self.fp8 { h / 128 } else { 0 };
        let pay = payload_bytes(self.hidden, self.fp8) as usize;
        let c = self.channels as usize;
        struct Got {
            x: Vec<u8>,
            scales: Vec<f32>,
            src: Vec<i32>,
            topk: Vec<i32>,
            w: Vec<f32>,
            prefix: Vec<i32>,
            num: Vec<i32>,
            per_expert: Vec<i32>,
            chan: Vec<i32>,
        }
        let local: Vec<usize> = self.bufs.keys().map(|&r| r as usize).collect();
        let mut got = Vec::with_capacity(local.len());
        for &r in &local {
            let g = &dev_of_ref(devs, gpu_of_rank[r]).gpu;
            let b = &self.bufs[&(r as u32)];
            let rows = self.expect[r].rows.len();
            let mut x = vec![0u8; rows * pay];
            g.download(b.recv_x.ptr, &mut x)?;
            let mut scales = vec![0f32; rows * s_per];
            g.download(b.recv_x_scales.ptr, &mut scales)?;
            let mut src = vec![0i32; rows];
            g.download(b.recv_src_idx.ptr, &mut src)?;
            let mut topk = vec![0i32; rows * k];
            g.download(b.recv_topk_idx.ptr, &mut topk)?;
            let mut w = vec![0f32; rows * k];
            g.download(b.recv_topk_weights.ptr, &mut w)?;
            let mut prefix = vec![0i32; n];
            g.download(b.rank_prefix.ptr, &mut prefix)?;
            let mut num = vec![0i32; 1];
            g.download(b.num_recv_tokens.ptr, &mut num)?;
            let mut per_expert = vec![0i32; l];
            g.download(b.num_recv_tokens_per_expert.ptr, &mut per_expert)?;
            let mut chan = vec![0i32; n * c];
            g.download(b.recv_channel_offset.ptr, &mut chan)?;
            got.push(Got { x, scales, src, topk, w, prefix, num, per_expert, chan });
        }
        let results: Vec<_> = (0..local.len()).into_par_iter().map(|i| {
            let r = local[i];
            let e = &self.expect[r];
            let gr = &got[i];
            let mut layout = Failures::default();
            let mut data = Failures::default();
            let mut meta = Failures::default();
            if gr.num[0] as usize != e.rows.len() {
                layout.push(|| {
                    format!("rank {r}: {} tokens received, expected {}", gr.num[0], e.rows.len())
                });
            }
            // Across nodes the receive layout is an input (the cached handle), not a result.
            let layout_is_output = self.across.is_none();
            if layout_is_output && gr.prefix != e.rank_prefix {
                layout.push(|| {
                    format!("rank {r}: rank prefix {:?}, expected {:?}", gr.prefix, e.rank_prefix)
                });
            }
            if gr.per_expert != e.per_expert {
                layout.push(|| {
                    format!(
                        "rank {r}: per-expert counts {:?}, expected {:?}",
                        gr.per_expert, e.per_expert
                    )
                });
            }
            if layout_is_output && gr.chan != e.channel_offset {
                layout.push(|| format!("rank {r}: channel offsets differ from the layout"));
            }
            for (row, &(s, t)) in e.rows.iter().enumerate() {
                let tok = &self.tokens[s as usize];
                let want: &[u8] = if self.fp8 {
                    tok.fp8_row(t as usize)
                } else {
                    bytes_of_u16(tok.bf16_row(t as usize))
                };
                let have = &gr.x[row * pay..(row + 1) * pay];
                if have != want {
                    let col = have.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                    data.push(|| format!(
                        "rank {r} row {row}: payload differs from source rank {s} token {t} (first at byte {col})"
                    ));
                }
                if self.fp8
                    && gr.scales[row * s_per..(row + 1) * s_per] != *tok.scales_row(t as usize)
                {
                    data.push(|| {
                        format!("rank {r} row {row}: scales differ from source rank {s} token {t}")
                    });
                }
                if gr.src[row] != t as i32 {
                    meta.push(|| {
                        format!(
                            "rank {r} row {row}: source index {}, expected {t} (from rank {s})",
                            gr.src[row]
                        )
                    });
                }
                let experts = self.routing.experts(s, t);
                let weights = self.routing.weights(s, t);
                for j in 0..k {
                    let ex = experts[j];
                    let local =
                        if ex >= 0 && ex as usize / l == r { ex - (r * l) as i32 } else { -1 };
                    let want_w = if local >= 0 { weights[j] } else { 0.0 };
                    if gr.topk[row * k + j] != local
                        || gr.w[row * k + j].to_bits() != want_w.to_bits()
                    {
                        meta.push(|| format!(
                            "rank {r} row {row} slot {j}: topk ({}, {}), expected ({local}, {want_w})",
                            gr.topk[row * k + j], gr.w[row * k + j]
                        ));
                    }
                }
            }
            (layout, data, meta)
        }).collect();
        let (mut layout, mut data, mut meta) =
            (Failures::default(), Failures::default(), Failures::default());
        for (a, b, c) in results {
            layout.extend(a);
            data.extend(b);
            meta.extend(c);
        }
        let layout_check = if self.across.is_none() {
            "dispatch: token counts, rank prefix, per-expert counts and channel offsets match the layout"
        } else {
            "dispatch: tokens and tokens per local expert counted by the receivers match the routing (the receive layout is DeepEP's cached handle, from the routing)"
        };
        let checks = vec![
            layout_check.to_string(),
            "dispatch: every received row equals its source token byte for byte (payload and scales)".to_string(),
            "dispatch: source indices, local top-k indices and weights match".to_string(),
        ];
        let mut failures = layout.into_lines("dispatch layout");
        failures.extend(data.into_lines("dispatch data"));
        failures.extend(meta.into_lines("dispatch metadata"));
        Ok((checks, failures))
    }

    pub(super) fn check_combine(
        &self,
        devs: &Devices,
        gpu_of_rank: &[u32],
    ) -> Result<(Vec<String>, Vec<String>), HwError> {
        let (k, h) = (self.topk as usize, self.hidden as usize);
        let t = self.routing.tokens_per_rank as usize;
        let ranks_per_node = self.across.as_ref().map(|a| a.geometry.ranks_per_node);
        let local: Vec<usize> = self.bufs.keys().map(|&r| r as usize).collect();
        let mut got = Vec::with_capacity(local.len());
        for &r in &local {
            let g = &dev_of_ref(devs, gpu_of_rank[r]).gpu;
            let b = &self.bufs[&(r as u32)];
            let mut x = vec![0u16; t * h];
            g.download(b.combined_x.ptr, &mut x)?;
            let mut w = vec![0f32; t * k];
            g.download(b.combined_topk_weights.ptr, &mut w)?;
            got.push((x, w));
        }
        let results: Vec<_> = (0..local.len())
            .into_par_iter()
            .map(|i| {
                let s = local[i];
                let (gx, gw) = &got[i];
                let tok = &self.tokens[s];
                let mut data = Failures::default();
                let mut weights = Failures::default();
                let mut ranks = Vec::new();
                let (mut got_f, mut want_f) = (Vec::with_capacity(h), Vec::with_capacity(h));
                let mut diff_max = 0f64;
                for ti in 0..t {
                    self.routing.token_ranks(s as u32, ti as u32, &mut ranks);
                    got_f.clear();
                    want_f.clear();
                    for hi in 0..h {
                        let v = tok.value(ti, hi);
                        let want = combined_value(v, &ranks, ranks_per_node);
                        let have = data::bf16_to_f32(gx[ti * h + hi]);
                        got_f.push(have);
                        want_f.push(want);
                        if !bf16_close(have, want, v.abs() * 8.0) {
                            data.push(|| {
                                format!("rank {s} token {ti} element {hi}: {have}, expected {want}")
                            });
                        }
                    }
                    diff_max = diff_max.max(data::calc_diff(&got_f, &want_f));
                    let experts = self.routing.experts(s as u32, ti as u32);
                    let w = self.routing.weights(s as u32, ti as u32);
                    for j in 0..k {
                        let want = if experts[j] >= 0 { w[j] } else { 0.0 };
                        let have = gw[ti * k + j];
                        if have.to_bits() != want.to_bits() && !(have == 0.0 && want == 0.0) {
                            weights.push(|| {
                                format!(
                                    "rank {s} token {ti} slot {j}: weight {have}, expected {want}"
                                )
                            });
                        }
                    }
                }
                (data, weights, diff_max)
            })
            .collect();
        let (mut data, mut weights, mut diff) = (Failures::default(), Failures::default(), 0f64);
        for (a, b, d) in results {
            data.extend(a);
            weights.extend(b);
            diff = diff.max(d);
        }
        let sum_check = match ranks_per_node {
            None => {
                "combine: every element equals the sum of the visited ranks' expert outputs within bf16 rounding"
            }
            Some(_) => {
                "combine: every element equals the sum over nodes of each node's BF16 partial (its visited ranks' expert outputs summed, as DeepEP's internode combine sends it) within bf16 rounding"
            }
        };
        let mut checks = vec![
            sum_check.to_string(),
            "combine: top-k weights come back intact".to_string(),
            format!("combine: worst per-token calc_diff {diff:.3e} (DeepEP's bound 5e-6)"),
        ];
        let mut failures = data.into_lines("combine data");
        failures.extend(weights.into_lines("combine weights"));
        if diff > 5e-6 {
            failures.push(format!("combine: calc_diff {diff:.3e} above DeepEP's bound 5e-6"));
        }
        checks.dedup();
        Ok((checks, failures))
    }
}

/// What the combine must produce for an element whose token value is `v` and which visited
/// `ranks` (ascending): the kernels sum in f32 in rank order and round to BF16 once; across
/// nodes (`ranks_per_node`) each node's forwarder sums its ranks first and sends a BF16
/// partial, and the source sums the nodes' partials in node order.
pub(super) fn combined_value(v: f32, ranks: &[u32], ranks_per_node: Option<u32>) -> f32 {
    let out = |d: u32| data::bf16_to_f32(data::expert_output(v, data::expert_factor(d)));
    let mut acc = 0f32;
    match ranks_per_node {
        None => {
            for &d in ranks {
                acc += out(d);
            }
        }
        Some(rpn) => {
            for node_ranks in ranks.chunk_by(|a, b| a / rpn == b / rpn) {
                let mut partial = 0f32;
                for &d in node_ranks {
                    partial += out(d);
                }
                acc += data::bf16_to_f32(data::f32_to_bf16(partial));
            }
        }
    }
    data::bf16_to_f32(data::f32_to_bf16(acc))
}

pub(super) fn rows_region(ptr: u64, rows: u64, row_bytes: u64) -> DigestRegion {
    DigestRegion {
        ptr,
        num_rows: rows,
        row_words: (row_bytes / 4) as i32,
        row_stride_words: row_bytes / 4,
        row_counts: 0,
        rows_per_group: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn across_nodes_the_partials_are_rounded_per_node() {
        let v = 1.0 + 2f32.powi(-7);
        // One node: the same as the plain sum.
        assert_eq!(combined_value(v, &[0, 1, 2], Some(8)), combined_value(v, &[0, 1, 2], None));
        // Two nodes: each node's partial is rounded to BF16 before the sum.
        let ranks = [1, 2, 9, 10];
        let out = |d: u32| data::bf16_to_f32(data::expert_output(v, data::expert_factor(d)));
        let round = |x: f32| data::bf16_to_f32(data::f32_to_bf16(x));
        let want = round(round(out(1) + out(2)) + round(out(9) + out(10)));
        assert_eq!(combined_value(v, &ranks, Some(8)), want);
        assert_eq!(combined_value(v, &ranks, None), round(out(1) + out(2) + out(9) + out(10)));
        assert_eq!(combined_value(v, &[], Some(8)), 0.0);
    }
}
