//! Message sizes on the wire and the "logical" bytes DeepEP's tests divide by kernel time
//! (docs/design.md, DeepEP §9, §11, §17). Both backends report bandwidth from these same counts.

use serde::{Deserialize, Serialize};

use super::config::{EpMode, align_up};
use crate::routing::RoutingTable;
use crate::scenario::schema::Dtype;
use crate::topology::NUM_MAX_NVL_PEERS;

/// FP8 scales: one f32 per 128 channels.
pub fn fp8_scale_bytes(hidden: u32) -> u64 {
    hidden as u64 / 128 * 4
}

/// Low-latency dispatch message: 16-B header + payload (FP8: 7,408 B at hidden 7168; BF16 14,352).
pub fn ll_dispatch_msg_bytes(hidden: u32, dtype: Dtype) -> u64 {
    16 + match dtype {
        Dtype::Fp8 => hidden as u64 + fp8_scale_bytes(hidden),
        _ => 2 * hidden as u64,
    }
}

/// Low-latency combine message: BF16 `2·hidden` (14,336 B); LogFMT ≈ 10 bits per element plus
/// per-128-channel metadata.
pub fn ll_combine_msg_bytes(hidden: u32, dtype: Dtype) -> u64 {
    match dtype {
        Dtype::Logfmt => hidden as u64 * 10 / 8 + fp8_scale_bytes(hidden),
        _ => 2 * hidden as u64,
    }
}

/// Normal-kernel dispatch token on the wire (`get_num_bytes_per_token`): payload + 8-B
/// `SourceMeta` + scales + top-k indices + weights, 16-B aligned (FP8 7,472 B; BF16 14,416 B).
pub fn normal_dispatch_token_bytes(hidden: u32, topk: u32, dtype: Dtype) -> u64 {
    let (payload, scales) = match dtype {
        Dtype::Fp8 => (hidden as u64, fp8_scale_bytes(hidden)),
        _ => (2 * hidden as u64, 0),
    };
    align_up(payload + 8 + scales + topk as u64 * 4 * 2, 16)
}

/// Normal-kernel combine token: BF16 payload + meta + top-k weights, 16-B aligned (14,384 B).
pub fn normal_combine_token_bytes(hidden: u32, topk: u32) -> u64 {
    align_up(2 * hidden as u64 + 8 + topk as u64 * 4, 16)
}

/// Bytes DeepEP's tests count per received row for `recv_x`: BF16 `2·hidden`; FP8 scaled by
/// (1 + 4/128)/2, i.e. `hidden + hidden/32` (7,392 B at 7168).
pub fn logical_row_bytes(hidden: u32, dtype: Dtype) -> u64 {
    match dtype {
        Dtype::Fp8 => hidden as u64 + hidden as u64 / 32,
        _ => 2 * hidden as u64,
    }
}

/// Per-rank logical byte counts of one DeepEP job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogicalBytes {
    /// Which column DeepEP reports as the bottleneck: "NVL" (intranode), "RDMA" (internode and
    /// low-latency's "RDMA bandwidth").
    pub label: String,
    pub dispatch_per_rank: Vec<u64>,
    pub combine_per_rank: Vec<u64>,
    /// Internode only: the "(NVL)" column DeepEP prints beside "(RDMA)".
    pub nvl_dispatch_per_rank: Vec<u64>,
    pub nvl_combine_per_rank: Vec<u64>,
}

impl LogicalBytes {
    pub fn mean(values: &[u64]) -> f64 {
        if values.is_empty() {
            0.0
        } else {
            values.iter().sum::<u64>() as f64 / values.len() as f64
        }
    }
}

/// Count the bytes each rank's test would count (docs/design.md, DeepEP §17).
pub fn logical_bytes(
    mode: EpMode,
    routing: &RoutingTable,
    hidden: u32,
    dispatch_dtype: Dtype,
    combine_dtype: Dtype,
) -> LogicalBytes {
    let n = routing.num_ranks as usize;
    let mut recv_rows = vec![0u64; n];
    let mut rdma_tokens_sent = vec![0u64; n];
    let mut valid_selections = vec![0u64; n];
    let mut ranks = Vec::new();
    let mut nodes = Vec::new();
    for src in 0..routing.num_ranks {
        for t in 0..routing.tokens_per_rank {
            valid_selections[src as usize] +=
                routing.experts(src, t).iter().filter(|&&e| e >= 0).count() as u64;
            routing.token_ranks(src, t, &mut ranks);
            for &r in &ranks {
                recv_rows[r as usize] += 1;
            }
            nodes.clear();
            nodes.extend(ranks.iter().map(|&r| r / NUM_MAX_NVL_PEERS));
            nodes.dedup();
            rdma_tokens_sent[src as usize] += nodes.len() as u64;
        }
    }
    let scale = |counts: &[u64], per: u64| counts.iter().map(|&c| c * per).collect::<Vec<_>>();
    let dispatch_row = logical_row_bytes(hidden, dispatch_dtype);
    let combine_row = 2 * hidden as u64;
    match mode {
        EpMode::Intranode => LogicalBytes {
            label: "NVL".into(),
            dispatch_per_rank: scale(&recv_rows, dispatch_row),
            combine_per_rank: scale(&recv_rows, combine_row),
            nvl_dispatch_per_rank: Vec::new(),
            nvl_combine_per_rank: Vec::new(),
        },
        EpMode::Internode => LogicalBytes {
            label: "RDMA".into(),
            dispatch_per_rank: scale(&rdma_tokens_sent, dispatch_row),
            combine_per_rank: scale(&rdma_tokens_sent, combine_row),
            nvl_dispatch_per_rank: scale(&recv_rows, dispatch_row),
            nvl_combine_per_rank: scale(&recv_rows, combine_row),
        },
        EpMode::LowLatency => {
            let dispatch_msg = match dispatch_dtype {
                Dtype::Fp8 => ll_dispatch_msg_bytes(hidden, Dtype::Fp8),
                _ => 2 * hidden as u64,
            };
            LogicalBytes {
                label: "RDMA".into(),
                dispatch_per_rank: scale(&valid_selections, dispatch_msg),
                combine_per_rank: scale(
                    &valid_selections,
                    ll_combine_msg_bytes(hidden, combine_dtype),
                ),
                nvl_dispatch_per_rank: Vec::new(),
                nvl_combine_per_rank: Vec::new(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_units_match_deepep_md() {
        assert_eq!(ll_dispatch_msg_bytes(7168, Dtype::Fp8), 7408);
        assert_eq!(ll_dispatch_msg_bytes(7168, Dtype::Bf16), 14352);
        assert_eq!(ll_combine_msg_bytes(7168, Dtype::Bf16), 14336);
        assert_eq!(normal_dispatch_token_bytes(7168, 8, Dtype::Fp8), 7472);
        assert_eq!(normal_dispatch_token_bytes(7168, 8, Dtype::Bf16), 14416);
        assert_eq!(normal_combine_token_bytes(7168, 8), 14384);
        assert_eq!(logical_row_bytes(7168, Dtype::Fp8), 7392);
    }
}
