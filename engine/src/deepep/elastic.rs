//! DeepEP V2's `ElasticBuffer` (NCCL GIN) as configuration semantics: its limits, the logical
//! and physical domains, the automatic QP and SM counts, the channel layout, buffer sizes, the
//! environment it reads, and the bytes `tests/elastic/test_ep.py` counts. Facts are from the
//! `tokenspeed-deepep` 2.1.0.post20260810 build of DeepEP v2.1.0 (`dd758ca`), cited by the
//! wheel's paths in docs/design.md ("DeepEP V2").

use serde::{Deserialize, Serialize};

use crate::routing::RoutingTable;
use crate::scenario::schema::Dtype;

/// `WorkspaceLayout::kNumMaxRanks` (common/layout.cuh:106).
pub const NUM_MAX_RANKS: u32 = 1024;
/// `kNumMaxExperts` (common/layout.cuh:107).
pub const NUM_MAX_EXPERTS: u32 = 2048;
/// `kNumMaxExpertsPerRank` (common/layout.cuh:108).
pub const NUM_MAX_EXPERTS_PER_RANK: u32 = 256;
/// `kNumMaxChannels` (common/compiled.cuh:83).
pub const NUM_MAX_CHANNELS: u32 = 1024;
/// `kGinQPDepth`: every GIN QP's depth (common/compiled.cuh:84).
pub const GIN_QP_DEPTH: u32 = 1024;
/// Buffer alignment: 2 MB (elastic.py:253, `get_elastic_buffer_alignment()`).
pub const BUFFER_ALIGNMENT_BYTES: u64 = 2 << 20;
/// Hybrid dispatch: scale-out tail signalled every 6 tokens (hybrid_dispatch.cuh:26).
pub const SCALEOUT_UPDATE_INTERVAL: u32 = 6;
/// Hybrid dispatch: a forwarder takes at most 6 slots of one source per turn
/// (hybrid_dispatch.cuh:27, 530-533).
pub const SLOTS_PER_FORWARD_CHUNK: u32 = 6;
/// Hybrid combine: scale-up tails published every 3 tokens (hybrid_combine.cuh:20).
pub const SCALEUP_UPDATE_INTERVAL: u32 = 3;
/// Scale-out ranks ≤ 32 (hybrid_dispatch.cuh:336, 485), scale-up ranks ≤ 64 (:603).
pub const MAX_SCALEOUT_RANKS: u32 = 32;
pub const MAX_SCALEUP_RANKS: u32 = 64;
/// Top-k ≤ 32: one lane per selection (dispatch.cuh:93, hybrid_dispatch.cuh:121).
pub const MAX_TOPK: u32 = 32;
/// Notify warps per SM: a warpgroup (`kNumNotifyWarps % 4 == 0`, dispatch.cuh:48) [verify].
pub const NOTIFY_WARPS: u32 = 4;
/// Channels per SM are bounded by `num_channels / num_sms <= 16` (host assert in `_C`).
pub const MAX_CHANNELS_PER_SM: u32 = 16;
/// sm_90's opt-in dynamic shared memory per block, 227 KiB (CUDA programming guide, compute
/// capability 9.0): the TMA buffers of a block's warps must fit in it.
pub const SMEM_PER_BLOCK_BYTES: u64 = 232_448;
/// TMA alignment of each part of a token (`ptx::kNumTMAAlignBytes`, layout.cuh:285).
pub const TMA_ALIGN_BYTES: u64 = 16;
/// Device timeouts count `clock64()` cycles at an assumed 2 GHz (comm.cuh:13).
pub const ONE_SEC_CYCLES: u64 = 2_000_000_000;

/// `ElasticBuffer.__init__` defaults (elastic.py:228-246).
pub mod defaults {
    pub const SL_IDX: u32 = 3;
    pub const NUM_CPU_TIMEOUT_SECS: u32 = 300;
    pub const NUM_GPU_TIMEOUT_SECS: u32 = 100;
    pub const ALLOW_HYBRID_MODE: bool = true;
    pub const ALLOW_MULTIPLE_REDUCTION: bool = true;
    pub const PREFER_OVERLAP_WITH_COMPUTE: bool = true;
    /// `get_theoretical_num_sms` defaults (elastic.py:733).
    pub const SM_READ_GBS: f64 = 200.0;
    pub const SM_WRITE_GBS: f64 = 50.0;
    /// `get_nvlink_gbs(factor=0.9)` (utils/envs.py:193).
    pub const NVLINK_FACTOR: f64 = 0.9;
}

/// How the NICs are connected for GIN: `RAIL` in hybrid mode (a GPU reaches the same local
/// index of every other NVLink domain), `FULL` in direct mode (every rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GinConnection {
    Rail,
    Full,
}

/// A V2 job's resolved settings (what a backend reads from the plan).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ElasticSettings {
    /// Hybrid kernels (scale-out RDMA to the same rail, NVLink fan-out) or direct ones.
    pub hybrid: bool,
    /// Logical domains: `num_scaleout_ranks × num_scaleup_ranks = num_ranks`.
    pub num_scaleout_ranks: u32,
    pub num_scaleup_ranks: u32,
    /// Physical domains: NVLink (NCCL's LSA team) and RDMA.
    pub num_rdma_ranks: u32,
    pub num_nvlink_ranks: u32,
    /// SMs per call (the analytic choice when the scenario says 0).
    pub num_sms: u32,
    /// Whether `num_sms` was V2's analytic choice.
    pub num_sms_auto: bool,
    /// Channels (warps of one role) per SM, and in all.
    pub channels_per_sm: u32,
    pub num_channels: u32,
    /// QPs per call (GIN contexts used), and allocated at construction.
    pub num_qps: u32,
    pub num_allocated_qps: u32,
    /// Whether `num_allocated_qps` was V2's automatic count (65 / 129 / 17 for the profile's
    /// NIC): a node with another NIC gets its own.
    pub num_allocated_qps_auto: bool,
    pub connection: GinConnection,
    /// The SL the GIN QPs carry: `sl_idx`, or `EP_OVERRIDE_RDMA_SL`.
    pub sl: u8,
    pub sl_from_env: bool,
    /// `EP_DISABLE_GIN=1`: no RDMA at all (one NVLink domain only).
    pub gin_disabled: bool,
    pub use_fp8_dispatch: bool,
    pub deterministic: bool,
    pub allow_multiple_reduction: bool,
    pub prefer_overlap_with_compute: bool,
    pub num_max_tokens_per_rank: u32,
    /// The buffer's bytes: `num_bytes`, or the size the kernels' layouts need.
    pub num_bytes: u64,
    pub num_cpu_timeout_secs: u32,
    pub num_gpu_timeout_secs: u32,
}

/// Automatic `num_allocated_qps` (elastic.py:328-334): hybrid 65 on a NIC with fast RDMA
/// atomics (`ibstat` CA type MT4131, ConnectX-8; utils/envs.py:223-242), else 129; direct 17.
pub fn auto_allocated_qps(hybrid: bool, fast_rdma_atomics: bool) -> u32 {
    match (hybrid, fast_rdma_atomics) {
        (true, true) => 65,
        (true, false) => 129,
        (false, _) => 17,
    }
}

/// Whether the profile's NIC is one `check_fast_rdma_atomic_support` accepts (MT4131).
pub fn nic_has_fast_rdma_atomics(nic_name: &str) -> bool {
    let n = nic_name.to_ascii_lowercase();
    n.contains("connectx-8") || n.contains("cx8") || n.contains("mt4131")
}

/// `get_theoretical_num_qps` (elastic.py:836-853): direct `min(num_sms, 9)`, hybrid
/// `num_sms·16 + 1`, capped by the allocated QPs.
pub fn theoretical_num_qps(num_sms: u32, hybrid: bool, allocated: u32) -> u32 {
    let want = if hybrid { num_sms * 16 + 1 } else { num_sms.min(9) };
    want.min(allocated)
}

/// `get_expected_topk(num_groups)` (elastic.py:770-772): expected distinct groups a token's
/// top-k touches with experts split evenly over `groups`.
pub fn expected_topk(experts: u32, topk: u32, groups: u32) -> f64 {
    let groups = groups.max(1);
    let outside = experts - experts / groups;
    // C(outside, k) / C(experts, k) as a product (no overflow).
    let mut ratio = 1.0f64;
    for i in 0..topk {
        if i >= outside {
            ratio = 0.0;
            break;
        }
        ratio *= (outside - i) as f64 / (experts - i) as f64;
    }
    groups as f64 * (1.0 - ratio)
}

/// What `get_theoretical_num_sms` reads besides its arguments.
#[derive(Debug, Clone, Copy)]
pub struct SmModelInputs {
    pub num_ranks: u32,
    pub num_scaleout_ranks: u32,
    pub num_scaleup_ranks: u32,
    pub num_rdma_ranks: u32,
    pub num_nvlink_ranks: u32,
    /// `ibstat` port rate / 8 (utils/envs.py:245-268).
    pub rdma_gbs: f64,
    /// `nvidia-smi nvlink -s` links summed × 0.9 (utils/envs.py:192-219).
    pub nvlink_gbs: f64,
    pub device_sms: u32,
    pub prefer_overlap_with_compute: bool,
}

/// `ElasticBuffer.get_theoretical_num_sms` (elastic.py:729-834), line by line.
pub fn theoretical_num_sms(experts: u32, topk: u32, x: &SmModelInputs) -> u32 {
    let (mut sm_read, mut sm_write, mut rdma_traffic, mut nvlink_traffic) = (0.0, 0.0, 0.0, 0.0);
    let scaleout_topk = if x.num_scaleout_ranks > 1 {
        expected_topk(experts, topk, x.num_scaleout_ranks)
    } else {
        0.0
    };
    let ek = expected_topk(experts, topk, x.num_ranks);
    sm_read += 1.0 / ek;
    if x.num_scaleout_ranks > 1 {
        let so = x.num_scaleout_ranks as f64;
        sm_write += 1.0 / ek;
        sm_write += (1.0 / ek) * (scaleout_topk / so);
        rdma_traffic += (1.0 / ek) * (scaleout_topk * (1.0 - 1.0 / so));
        sm_read += scaleout_topk / ek;
        sm_write += 1.0;
        nvlink_traffic += 1.0 - 1.0 / x.num_scaleup_ranks as f64;
    } else {
        let (n, nvl) = (x.num_ranks as f64, x.num_nvlink_ranks as f64);
        if x.num_rdma_ranks > 1 {
            sm_write += 1.0 / ek;
        }
        sm_write += nvl / n;
        nvlink_traffic += nvl / n * (1.0 - 1.0 / nvl);
        rdma_traffic += (n - nvl) / n;
    }
    let rdma_bound = x.num_scaleout_ranks > 1
        && x.rdma_gbs > 0.0
        && rdma_traffic / x.rdma_gbs > nvlink_traffic / x.nvlink_gbs;
    let (bounded_traffic, bounded_gbs) =
        if rdma_bound { (rdma_traffic, x.rdma_gbs) } else { (nvlink_traffic, x.nvlink_gbs) };
    let mut num_sms = x.device_sms as f64;
    if bounded_traffic > 0.0 {
        num_sms = (bounded_gbs / bounded_traffic * sm_read / defaults::SM_READ_GBS)
            .max(bounded_gbs / bounded_traffic * sm_write / defaults::SM_WRITE_GBS);
    }
    let mut sms = ((num_sms * 1.25).ceil() as u32).max(4).next_multiple_of(2);
    if !x.prefer_overlap_with_compute {
        sms = sms.max(64);
    }
    sms.min(x.device_sms)
}

/// Bytes of one token in a V2 buffer (`TokenLayout::get_num_bytes<false>`, layout.cuh:266-295):
/// hidden bytes, scale-factor packs and metadata, each 16-B aligned. Metadata is the top-k
/// indices and weights, plus the source index and `num_topk` linked-list slots when
/// `with_metadata` (dispatch).
pub fn token_bytes(hidden_bytes: u64, sf_bytes: u64, topk: u32, with_metadata: bool) -> u64 {
    let meta = topk as u64 * 8 + if with_metadata { (1 + topk as u64) * 4 } else { 0 };
    hidden_bytes.next_multiple_of(TMA_ALIGN_BYTES)
        + sf_bytes.next_multiple_of(TMA_ALIGN_BYTES)
        + meta.next_multiple_of(TMA_ALIGN_BYTES)
}

/// A dispatch token: FP8 payload + one f32 scale pack per 128 channels, or BF16.
pub fn dispatch_token_bytes(hidden: u32, topk: u32, dtype: Dtype) -> u64 {
    match dtype {
        Dtype::Fp8 => token_bytes(hidden as u64, hidden as u64 / 128 * 4, topk, true),
        _ => token_bytes(2 * hidden as u64, 0, topk, true),
    }
}

/// A combine token: BF16 payload and the top-k weights (combine.cuh:50).
pub fn combine_token_bytes(hidden: u32, topk: u32) -> u64 {
    token_bytes(2 * hidden as u64, 0, topk, false)
}

/// Channels per SM: the most warps of one role whose TMA buffers (a token and its 16-B
/// mbarrier each, two roles per SM in hybrid mode) fit the block's shared memory for both the
/// dispatch and the combine token, within the warp and channel limits. The host's own rule is
/// compiled into `_C` and prints "Elastic buffer uses %d channels per SM" [derived, verify].
pub fn channels_per_sm(dispatch_token: u64, combine_token: u64, hybrid: bool) -> u32 {
    let roles = if hybrid { 2 } else { 1 };
    let fits = |tok: u64| (SMEM_PER_BLOCK_BYTES / ((tok + TMA_ALIGN_BYTES) * roles)) as u32;
    let warps = (32 - NOTIFY_WARPS) / roles as u32;
    fits(dispatch_token).min(fits(combine_token)).min(warps).clamp(1, MAX_CHANNELS_PER_SM)
}

/// Products of sizes, saturating: a huge `num_max_tokens_per_rank` is refused by the size
/// rules, never wraps.
fn prod(factors: &[u64]) -> u64 {
    factors.iter().fold(1u64, |a, &b| a.saturating_mul(b))
}

/// The buffer bytes the dispatch kernel lays out (hybrid_dispatch.cuh:92-97; dispatch.cuh:266-267).
pub fn dispatch_buffer_bytes(tok: u64, t: u64, so: u64, su: u64, channels: u64) -> u64 {
    if so > 1 {
        let per_channel = t.div_ceil(channels.max(1));
        prod(&[tok, su, so, t]).saturating_add(prod(&[tok, t])).saturating_add(prod(&[
            tok,
            so,
            channels,
            per_channel,
        ]))
    } else {
        prod(&[tok, su, t]).saturating_add(prod(&[tok, t]))
    }
}

/// The buffer bytes the combine kernel lays out (hybrid_combine.cuh:70-78; combine.cuh:53-58;
/// the rank layout when `ranks ≤ topk` with multiple reduction, combine_utils.cuh:8-18).
pub fn combine_buffer_bytes(
    tok: u64,
    t: u64,
    (so, su): (u64, u64),
    topk: u64,
    channels: u64,
    multiple_reduction: bool,
) -> u64 {
    let layout = |ranks: u64| if multiple_reduction && ranks <= topk { ranks } else { topk };
    if so > 1 {
        let per_channel = t.div_ceil(channels.max(1));
        let copies = if multiple_reduction { 1 } else { topk };
        prod(&[tok, layout(su), so, t])
            .saturating_add(prod(&[tok, layout(so), t]))
            .saturating_add(prod(&[tok, copies, channels, so, per_channel]))
    } else {
        prod(&[tok, layout(su), t]).saturating_add(prod(&[tok, su, t]))
    }
}

/// What `tests/elastic/test_ep.py` divides by kernel time, per rank: scale-out bytes sent
/// (every distinct scale-out rank of a token, its own included: the README says the EP 8 x 2
/// figure "contains local rank traffic") and scale-up bytes received (every (token, rank)
/// pair a rank receives), each at `row` bytes per token [verify: the test is not in the wheel].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElasticBytes {
    pub scaleout_tokens_sent: Vec<u64>,
    pub scaleup_tokens_recv: Vec<u64>,
}

impl ElasticBytes {
    /// Count from the routing: rank `r`'s NVLink domain is `r / domain_ranks` (the scale-up
    /// ranks in hybrid mode, the NVLink ranks in direct mode).
    pub fn count(routing: &RoutingTable, domain_ranks: u32, hybrid: bool) -> ElasticBytes {
        let n = routing.num_ranks as usize;
        let su = domain_ranks.max(1);
        let mut sent = vec![0u64; n];
        let mut recv = vec![0u64; n];
        let mut ranks = Vec::new();
        let mut domains = Vec::new();
        for src in 0..routing.num_ranks {
            for t in 0..routing.tokens_per_rank {
                routing.token_ranks(src, t, &mut ranks);
                for &r in &ranks {
                    recv[r as usize] += 1;
                }
                if hybrid {
                    domains.clear();
                    domains.extend(ranks.iter().map(|&r| r / su));
                    domains.dedup();
                    sent[src as usize] += domains.len() as u64;
                } else {
                    // Direct: tokens put over RDMA, one per destination rank outside the
                    // NVLink domain.
                    sent[src as usize] +=
                        ranks.iter().filter(|&&r| r / su != src / su).count() as u64;
                }
            }
        }
        ElasticBytes { scaleout_tokens_sent: sent, scaleup_tokens_recv: recv }
    }
}

/// Bytes test_ep.py counts per token: the payload (FP8 with its scales, `hidden + hidden/32`;
/// BF16 `2·hidden`).
pub fn logical_token_bytes(hidden: u32, dtype: Dtype) -> u64 {
    super::bytes::logical_row_bytes(hidden, dtype)
}

/// One environment variable V2 or NCCL GIN reads, and what eptwin does with it.
pub struct V2Var {
    pub name: &'static str,
    pub meaning: &'static str,
}

/// The variables V2 reads (deep_ep/, README "Environment variables") and the NCCL ones GIN's
/// set-up depends on; `NCCL_*` values are NCCL's [verify against the NCCL release in use].
pub const V2_VARS: &[V2Var] = &[
    V2Var {
        name: "EP_OVERRIDE_RDMA_SL",
        meaning: "overrides sl_idx: the GIN traffic class of every QP (elastic.py:323-324)",
    },
    V2Var {
        name: "EP_DISABLE_GIN",
        meaning: "no GIN: NVLink only, one NVLink domain (nccl.cu reads it; issue #629: NCCL's GIN preflight still runs)",
    },
    V2Var {
        name: "EP_NIC_NAME",
        meaning: "NIC whose `ibstat` CA type and rate V2 reads (default mlx5_0; utils/envs.py:21): fast atomics (MT4131) pick 65 QPs, the rate feeds the analytic SM count",
    },
    V2Var {
        name: "EP_BUFFER_DEBUG",
        meaning: "prints the buffer size and the analytic SM inputs (elastic.py:311, 828); no effect on the kernels",
    },
    V2Var {
        name: "EP_SUPPRESS_NCCL_CHECK",
        meaning: "skips the check that the loaded libnccl is the one DeepEP was built with (deep_ep/__init__.py:51)",
    },
    V2Var {
        name: "EP_REUSE_NCCL_COMM",
        meaning: "0: create a new NCCL communicator instead of PyTorch's (utils/comm.py:62)",
    },
    V2Var {
        name: "EP_NUM_TOPK_IDX_BITS",
        meaning: "width of topk_idx_t at JIT time, default 64 (common/compiled.cuh:54)",
    },
    V2Var {
        name: "EP_AVOID_RECORD_STREAM",
        meaning: "tensor stream bookkeeping (README); no effect on timing",
    },
    V2Var {
        name: "NCCL_GIN_CROSS_NIC",
        meaning: "\"0\" (multi-plane): V2 sets NCCL_SYM_REUSE_SYSMEM_HANDLES=1 unless set (elastic.py:279-282)",
    },
    V2Var {
        name: "NCCL_SYM_REUSE_SYSMEM_HANDLES",
        meaning: "NCCL symmetric-memory option V2 defaults with NCCL_GIN_CROSS_NIC=0 (elastic.py:282)",
    },
    V2Var {
        name: "NCCL_IB_MERGE_NICS",
        meaning: "NCCL's NIC merging; \"0\" is the workaround for GIN type NONE on MLNX_OFED 24.10 (issue #628)",
    },
    V2Var { name: "NCCL_IB_HCA", meaning: "NCCL's NIC selection" },
    V2Var {
        name: "NCCL_IB_SL",
        meaning: "SL of NCCL's own (non-GIN) IB connections; GIN QPs take sl_idx",
    },
    V2Var {
        name: "NCCL_IB_TC",
        meaning: "traffic class of NCCL's own RoCE connections; GIN QPs take sl_idx",
    },
    V2Var { name: "NCCL_IB_GID_INDEX", meaning: "RoCE GID NCCL uses" },
    V2Var { name: "NCCL_GIN_TYPE", meaning: "NCCL's GIN transport choice" },
    V2Var { name: "NCCL_GIN_ENABLE", meaning: "NCCL's GIN switch" },
];

/// What V2 (or NCCL) does with `name`, when eptwin knows it.
pub fn v2_var(name: &str) -> Option<&'static V2Var> {
    V2_VARS.iter().find(|v| v.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analytic_sms_of_the_readme_row() {
        // EP 8 x 2, 256 experts, top-8, 400G NIC, NVLink4 (18 links x 26.5625 GB/s x 0.9):
        // RDMA-bound, 8.5 SMs x 1.25 -> 12, the README's SM count.
        let x = SmModelInputs {
            num_ranks: 16,
            num_scaleout_ranks: 2,
            num_scaleup_ranks: 8,
            num_rdma_ranks: 2,
            num_nvlink_ranks: 8,
            rdma_gbs: 50.0,
            nvlink_gbs: 18.0 * 26.5625 * 0.9,
            device_sms: 132,
            prefer_overlap_with_compute: true,
        };
        assert_eq!(theoretical_num_sms(256, 8, &x), 12);
        assert_eq!(
            theoretical_num_sms(256, 8, &SmModelInputs { prefer_overlap_with_compute: false, ..x }),
            64
        );
        // One rank: no traffic, every SM.
        let one = SmModelInputs {
            num_ranks: 1,
            num_scaleout_ranks: 1,
            num_scaleup_ranks: 1,
            num_rdma_ranks: 1,
            num_nvlink_ranks: 1,
            ..x
        };
        assert_eq!(theoretical_num_sms(256, 8, &one), 132);
    }

    #[test]
    fn qps_and_sizes() {
        assert_eq!(auto_allocated_qps(true, false), 129);
        assert_eq!(auto_allocated_qps(true, true), 65);
        assert_eq!(auto_allocated_qps(false, false), 17);
        assert_eq!(theoretical_num_qps(12, true, 129), 129);
        assert_eq!(theoretical_num_qps(4, true, 129), 65);
        assert_eq!(theoretical_num_qps(12, false, 17), 9);
        assert_eq!(dispatch_token_bytes(7168, 8, Dtype::Fp8), 7168 + 224 + 112);
        assert_eq!(combine_token_bytes(7168, 8), 14336 + 64);
        assert_eq!(channels_per_sm(7504, 14400, true), 8);
        assert!((expected_topk(256, 8, 2) - 1.9929).abs() < 1e-3);
        assert!((expected_topk(256, 8, 16) - 6.5233).abs() < 1e-3);
        assert_eq!(expected_topk(256, 8, 1), 1.0);
    }
}
