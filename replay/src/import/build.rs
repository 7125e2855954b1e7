//! The parsed lines made into the result document's parts: per op the samples and logical
//! bytes (the low-latency script's per-rank lines, or the normal scripts' tuning line for the
//! scenario's Config, else their Best line), the op's summary, and the measurements every line
//! kind adds.

use std::collections::BTreeMap;

use eptwin_engine::api::Config;
use eptwin_engine::api::JobPlan;
use eptwin_engine::api::reference_comparison;
use eptwin_engine::api::{OpResult, SampleRecord, Stats, Summary};
use eptwin_engine::scenario::schema::{Dtype, OpKind};
use serde_json::{Value, json};

use super::parse::{HOOK_LINE, KERNELS_LINE, Loc, Parsed, RankLine, TuningOf};

/// One sample per rank line of `op`, and each rank's logical bytes (printed GB/s × time).
pub(super) fn ll_samples(
    parsed: &Parsed,
    op: OpKind,
    num_ranks: u32,
    hook: bool,
    ends: &[String],
    failures: &mut Vec<String>,
) -> (Vec<SampleRecord>, Vec<f64>) {
    let needed = if hook { HOOK_LINE } else { KERNELS_LINE };
    let mut samples = Vec::new();
    let mut bytes = Vec::new();
    let mut missing = Vec::new();
    for rank in 0..num_ranks {
        let kernel = parsed.ranks.get(&(rank, KERNELS_LINE)).map(|(_, l)| *l);
        let hook_line = parsed.ranks.get(&(rank, HOOK_LINE)).map(|(_, l)| *l);
        let (gbps, kernel_us) = match (kernel, op) {
            (Some(RankLine::Kernels { dispatch_gbps, dispatch_us, .. }), OpKind::Dispatch) => {
                (Some(dispatch_gbps), Some(dispatch_us))
            }
            (Some(RankLine::Kernels { combine_gbps, combine_us, .. }), OpKind::Combine) => {
                (Some(combine_gbps), Some(combine_us))
            }
            _ => (None, None),
        };
        let (latency_us, phases) = if hook {
            match (hook_line, op) {
                (
                    Some(RankLine::Hook { dispatch_send_us: s, dispatch_recv_us: r, .. }),
                    OpKind::Dispatch,
                )
                | (
                    Some(RankLine::Hook { combine_send_us: s, combine_recv_us: r, .. }),
                    OpKind::Combine,
                ) => (
                    Some(s + r),
                    BTreeMap::from([("send".to_string(), s), ("recv".to_string(), r)]),
                ),
                _ => (None, BTreeMap::new()),
            }
        } else {
            (kernel_us, BTreeMap::new())
        };
        let Some(latency_us) = latency_us else {
            missing.push(rank);
            continue;
        };
        if let (Some(g), Some(t)) = (gbps, kernel_us) {
            bytes.push(g * t * 1e3);
        }
        samples.push(SampleRecord {
            iteration: 0,
            rank: Some(rank),
            latency_us,
            phases_us: phases,
        });
    }
    if !missing.is_empty() {
        failures.push(format!(
            "{op}: no {needed:?} line from rank(s) {} of {num_ranks} (logs end at {}: cut short, \
             or a node's log is missing)",
            ranges(&missing),
            ends.join(", ")
        ));
    }
    (samples, bytes)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn normal_samples(
    parsed: &Parsed,
    op: OpKind,
    dispatch_dtype: Dtype,
    config: Option<Config>,
    where_: &dyn Fn(Loc) -> String,
    ends: &[String],
    failures: &mut Vec<String>,
    advisories: &mut Vec<String>,
    measurements: &mut BTreeMap<String, Value>,
) -> (Vec<SampleRecord>, Vec<f64>) {
    let of = match op {
        OpKind::Combine => TuningOf::Combine,
        _ => TuningOf::Dispatch(dispatch_dtype),
    };
    let matching = config.and_then(|c| {
        parsed.tuning.iter().find(|(_, t, block)| {
            *block == Some(of)
                && t.sms == c.num_sms
                && t.nvl_chunk == Some(c.num_max_nvl_chunked_send_tokens)
                && t.rdma_chunk.is_none_or(|r| r == c.num_max_rdma_chunked_send_tokens)
        })
    });
    let best = parsed.best.iter().rev().find(|(_, t)| t.best == Some(of));
    let chosen = match (matching, best) {
        (Some((loc, t, _)), _) => Some((*loc, *t, "tuning")),
        (None, Some((loc, t))) => {
            let wanted = config.map_or("none resolved".to_string(), |c| {
                let mut t = *t;
                t.sms = c.num_sms;
                t.nvl_chunk = Some(c.num_max_nvl_chunked_send_tokens);
                t.rdma_chunk = t.rdma_chunk.map(|_| c.num_max_rdma_chunked_send_tokens);
                t.describe()
            });
            advisories.push(format!(
                "deepep replay: {op}: no tuning line for the scenario's Config ({wanted}); the \
                 number is the script's Best line ({}) at {}",
                t.describe(),
                where_(*loc)
            ));
            Some((*loc, *t, "best"))
        }
        (None, None) => None,
    };
    let Some((loc, t, source)) = chosen else {
        let what = match of {
            TuningOf::Dispatch(Dtype::Bf16) => "Best dispatch (BF16)",
            TuningOf::Dispatch(_) => "Best dispatch (FP8)",
            TuningOf::Combine => "Best combine",
        };
        failures.push(format!(
            "{op}: neither a tuning line for the scenario's Config nor a \"[tuning] {what}\" \
             line (logs end at {}: cut short?)",
            ends.join(", ")
        ));
        return (Vec::new(), Vec::new());
    };
    measurements.insert(format!("deepep.{op}.line"), t.to_json(source, where_(loc)));
    let gbps = t.rdma_gbps.unwrap_or(t.nvl_gbps);
    let phases =
        t.notify_us.map(|n| BTreeMap::from([("notify".to_string(), n)])).unwrap_or_default();
    (
        vec![SampleRecord { iteration: 0, rank: Some(0), latency_us: t.t_us, phases_us: phases }],
        vec![gbps * t.t_us * 1e3],
    )
}

pub(super) fn op_result(
    job: &JobPlan,
    op: OpKind,
    samples: Vec<SampleRecord>,
    bytes: &[f64],
    checks: Vec<String>,
    wrong: u32,
) -> OpResult {
    let latencies: Vec<f64> = samples.iter().map(|s| s.latency_us).collect();
    let latency_us = Stats::of(&latencies);
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    let logical_bytes_per_rank = mean(bytes);
    let mut phases: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for s in &samples {
        for (k, v) in &s.phases_us {
            phases.entry(k.clone()).or_default().push(*v);
        }
    }
    let summary = Summary {
        latency_us,
        logical_bw_gbps: if latency_us.mean > 0.0 {
            logical_bytes_per_rank / (latency_us.mean * 1e3)
        } else {
            0.0
        },
        logical_bw_label: job.logical_bw_label().to_string(),
        logical_bytes_per_rank,
        rdma_bytes: 0,
        nvlink_bytes: 0,
        wire_bytes: 0,
        phases_us: phases.into_iter().map(|(k, v)| (k, mean(&v))).collect(),
        checks,
        wrong,
    };
    OpResult {
        op: op.to_string(),
        reference: reference_comparison(job, op, &summary),
        summary,
        samples,
    }
}

pub(super) fn record_measurements(
    parsed: &Parsed,
    where_: &dyn Fn(Loc) -> String,
    measurements: &mut BTreeMap<String, Value>,
) {
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let mut both = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut printed = (Vec::new(), Vec::new());
    let mut hook = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (_, line) in parsed.ranks.values() {
        match *line {
            RankLine::Both { bw_gbps, avg_us, min_us, max_us } => {
                both.0.push(bw_gbps);
                both.1.push(avg_us);
                both.2.push(min_us);
                both.3.push(max_us);
            }
            RankLine::Kernels { dispatch_gbps, combine_gbps, .. } => {
                printed.0.push(dispatch_gbps);
                printed.1.push(combine_gbps);
            }
            RankLine::Hook {
                dispatch_send_us,
                dispatch_recv_us,
                combine_send_us,
                combine_recv_us,
            } => {
                hook.0.push(dispatch_send_us);
                hook.1.push(dispatch_recv_us);
                hook.2.push(combine_send_us);
                hook.3.push(combine_recv_us);
            }
        }
    }
    if !both.0.is_empty() {
        measurements.insert(
            "deepep.dispatch_combine".into(),
            json!({
                "ranks": both.0.len(),
                "bw_gbps_mean": mean(&both.0),
                "avg_us_mean": mean(&both.1),
                "min_us": both.2.iter().copied().fold(f64::INFINITY, f64::min),
                "max_us": both.3.iter().copied().fold(0.0, f64::max),
            }),
        );
    }
    if !printed.0.is_empty() {
        measurements.insert(
            "deepep.printed_bw_gbps_mean".into(),
            json!({ "ranks": printed.0.len(), "dispatch": mean(&printed.0), "combine": mean(&printed.1) }),
        );
    }
    if !hook.0.is_empty() {
        measurements.insert(
            "deepep.hook_us_mean".into(),
            json!({
                "ranks": hook.0.len(),
                "dispatch_send": mean(&hook.0), "dispatch_recv": mean(&hook.1),
                "combine_send": mean(&hook.2), "combine_recv": mean(&hook.3),
            }),
        );
    }
    for (loc, t) in &parsed.best {
        let key = match t.best {
            Some(TuningOf::Dispatch(Dtype::Bf16)) => "deepep.best.dispatch_bf16",
            Some(TuningOf::Dispatch(_)) => "deepep.best.dispatch_fp8",
            _ => "deepep.best.combine",
        };
        measurements.insert(key.into(), t.to_json("best", where_(*loc)));
    }
    if !parsed.layout_ms.is_empty() {
        measurements.insert("deepep.layout_ms_mean".into(), json!(mean(&parsed.layout_ms)));
    }
}

/// `[0, 1, 2, 5, 7, 8]` → `"0-2, 5, 7-8"`.
pub(super) fn ranges(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if i == j { ranks[i].to_string() } else { format!("{}-{}", ranks[i], ranks[j]) });
        i = j + 1;
    }
    out.join(", ")
}
