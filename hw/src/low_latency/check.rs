//! The host checks of one low-latency dispatch and combine (DeepEP `test_low_latency.py`'s).

use rayon::prelude::*;

use super::LlJob;
use crate::data::{self, bytes_of_u16};
use crate::error::HwError;
use crate::exec::{Devices, Failures, bf16_close, dev_of_ref};

impl LlJob {
    pub(super) fn check_dispatch(
        &self,
        devs: &Devices,
        gpu_of_rank: &[u32],
    ) -> Result<(Vec<String>, Vec<String>), HwError> {
        let (n, h) = (self.n as usize, self.hidden as usize);
        let l = (self.experts / self.n) as usize;
        let cap = self.capacity as usize;
        let pay = if self.fp8 { h } else { 2 * h };
        let ns = h / 128;
        struct Got {
            count: Vec<i32>,
            range: Vec<i64>,
            src: Vec<i32>,
            slot: Vec<i32>,
            x: Vec<u8>,
            scales: Vec<f32>,
        }
        let local: Vec<usize> = self.bufs.keys().map(|&r| r as usize).collect();
        let mut got = Vec::with_capacity(local.len());
        for &r in &local {
            let g = &dev_of_ref(devs, gpu_of_rank[r]).gpu;
            let b = &self.bufs[&(r as u32)];
            let mut count = vec![0i32; l];
            g.download(b.packed_recv_count.ptr, &mut count)?;
            let mut range = vec![0i64; l * n];
            g.download(b.packed_recv_layout_range.ptr, &mut range)?;
            let mut src = vec![0i32; l * cap];
            g.download(b.packed_recv_src_info.ptr, &mut src)?;
            let mut slot = vec![0i32; l * cap];
            g.download(b.packed_recv_slot.ptr, &mut slot)?;
            let mut x = vec![0u8; l * cap * pay];
            g.download(b.packed_recv_x.ptr, &mut x)?;
            let mut scales = vec![0f32; if self.fp8 { l * cap * ns } else { 0 }];
            g.download(b.packed_recv_scales.ptr, &mut scales)?;
            got.push(Got { count, range, src, slot, x, scales });
        }
        let rpn = self.ranks_per_node();
        let results: Vec<_> = (0..local.len()).into_par_iter().map(|i| {
            let r = local[i];
            let gr = &got[i];
            let (mut counts, mut data) = (Failures::default(), Failures::default());
            for le in 0..l {
                let ex = &self.expect[r][le];
                let e = r * l + le;
                if gr.count[le] as usize != ex.count() {
                    counts.push(|| {
                        format!(
                            "rank {r} expert {e}: {} tokens, expected {}",
                            gr.count[le],
                            ex.count()
                        )
                    });
                    continue;
                }
                let mut begin = 0usize;
                for (s, want) in ex.from.iter().enumerate() {
                    // A message from another node carries no top-k slot (its staged copy
                    // serves every destination): the receiver records -1.
                    let remote = rpn.is_some_and(|rpn| s as u32 / rpn != r as u32 / rpn);
                    let want_remote: Vec<(u32, u32)>;
                    let want = if remote {
                        want_remote = want.iter().map(|&(t, _)| (t, u32::MAX)).collect();
                        &want_remote
                    } else {
                        want
                    };
                    let range = gr.range[le * n + s];
                    let (rb, rn) = ((range & 0xffff_ffff) as usize, (range >> 32) as usize);
                    if rb != begin || rn != want.len() {
                        counts.push(|| format!(
                            "rank {r} expert {e} source {s}: layout range (begin {rb}, count {rn}), expected ({begin}, {})",
                            want.len()
                        ));
                        begin += want.len();
                        continue;
                    }
                    let mut seen: Vec<(u32, u32)> = (begin..begin + rn)
                        .map(|row| (gr.src[le * cap + row] as u32, gr.slot[le * cap + row] as u32))
                        .collect();
                    let rows_of: Vec<usize> = {
                        let mut idx: Vec<usize> = (0..rn).collect();
                        idx.sort_by_key(|&i| seen[i]);
                        idx
                    };
                    seen.sort_unstable();
                    if seen != *want {
                        counts.push(|| format!(
                            "rank {r} expert {e} source {s}: received (token, slot) set differs from the routing"
                        ));
                        begin += rn;
                        continue;
                    }
                    let tok = &self.tokens[s];
                    for (i, &(t, _)) in want.iter().enumerate() {
                        let row = begin + rows_of[i];
                        let have = &gr.x[(le * cap + row) * pay..(le * cap + row + 1) * pay];
                        let want_bytes: &[u8] = if self.fp8 {
                            tok.fp8_row(t as usize)
                        } else {
                            bytes_of_u16(tok.bf16_row(t as usize))
                        };
                        if have != want_bytes {
                            data.push(|| format!(
                                "rank {r} expert {e} row {row}: payload differs from the cast of source rank {s} token {t}"
                            ));
                        }
                        if self.fp8
                            && gr.scales[(le * cap + row) * ns..(le * cap + row + 1) * ns]
                                != *tok.scales_row(t as usize)
                        {
                            data.push(|| format!("rank {r} expert {e} row {row}: FP8 scales differ (source rank {s} token {t})"));
                        }
                    }
                    begin += rn;
                }
            }
            (counts, data)
        }).collect();
        let (mut counts, mut data) = (Failures::default(), Failures::default());
        for (a, b) in results {
            counts.extend(a);
            data.extend(b);
        }
        let checks = vec![
            "low-latency dispatch: per-expert counts and per-source layout ranges match the routing".to_string(),
            "low-latency dispatch: each expert received exactly its (token, top-k slot) pairs (slot -1 from another node)".to_string(),
            "low-latency dispatch: every message equals the FP8 cast (payload and per-128 scales) of its source token".to_string(),
        ];
        let mut failures = counts.into_lines("low-latency dispatch layout");
        failures.extend(data.into_lines("low-latency dispatch data"));
        Ok((checks, failures))
    }

    pub(super) fn check_combine(
        &self,
        devs: &Devices,
        gpu_of_rank: &[u32],
    ) -> Result<(Vec<String>, Vec<String>), HwError> {
        let (h, k) = (self.hidden as usize, self.topk as usize);
        let tt = self.routing.tokens_per_rank as usize;
        let local: Vec<usize> = self.bufs.keys().map(|&r| r as usize).collect();
        let mut got = Vec::with_capacity(local.len());
        for &r in &local {
            let g = &dev_of_ref(devs, gpu_of_rank[r]).gpu;
            let mut x = vec![0u16; tt * h];
            g.download(self.bufs[&(r as u32)].combined_x.ptr, &mut x)?;
            got.push(x);
        }
        let results: Vec<_> = (0..local.len())
            .into_par_iter()
            .map(|i| {
                let s = local[i];
                let tok = &self.tokens[s];
                let mut f = Failures::default();
                let mut worst = 0f64;
                let (mut gv, mut wv) = (Vec::with_capacity(h), Vec::with_capacity(h));
                for t in 0..tt {
                    let experts = self.routing.experts(s as u32, t as u32);
                    let weights = self.routing.weights(s as u32, t as u32);
                    gv.clear();
                    wv.clear();
                    for hi in 0..h {
                        let v = tok.value(t, hi);
                        let mut acc = 0f32;
                        let mut mag = 0f32;
                        for j in 0..k {
                            if experts[j] < 0 {
                                continue;
                            }
                            let out = data::bf16_to_f32(data::expert_output(
                                v,
                                data::expert_factor(experts[j] as u32),
                            ));
                            acc = weights[j].mul_add(out, acc);
                            mag += (weights[j] * out).abs();
                        }
                        let want = data::bf16_to_f32(data::f32_to_bf16(acc));
                        let have = data::bf16_to_f32(got[i][t * h + hi]);
                        gv.push(have);
                        wv.push(want);
                        if !bf16_close(have, want, mag) {
                            f.push(|| {
                                format!("rank {s} token {t} element {hi}: {have}, expected {want}")
                            });
                        }
                    }
                    worst = worst.max(data::calc_diff(&gv, &wv));
                }
                (f, worst)
            })
            .collect();
        let (mut f, mut worst) = (Failures::default(), 0f64);
        for (a, w) in results {
            f.extend(a);
            worst = worst.max(w);
        }
        let checks = vec![
            "low-latency combine: every element equals the top-k weighted sum of the expert outputs within bf16 rounding"
                .to_string(),
            format!("low-latency combine: worst per-token calc_diff {worst:.3e} (DeepEP's bound 1e-5)"),
        ];
        let mut failures = f.into_lines("low-latency combine data");
        if worst > 1e-5 {
            failures.push(format!(
                "low-latency combine: calc_diff {worst:.3e} above DeepEP's bound 1e-5"
            ));
        }
        Ok((checks, failures))
    }
}
