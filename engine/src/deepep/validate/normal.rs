//! Normal kernels: the resolved `Config`s (tuned tables or explicit chunk sizes), their
//! constraints, the NVL/RDMA buffer size hints and the internode QP rule.

use super::Job;
use crate::deepep::config::{self, Config, Direction, EpMode, hint_hidden_bytes, num_rdma_ranks};
use crate::diag::Diagnostics;
use crate::scenario::schema::{BufferSpec, WorkloadSpec};

/// Normal internode combine: `num_rdma_ranks ≤ 24` (internode.cu:2358).
const COMBINE_MAX_RDMA_RANKS: u32 = 24;

/// The dispatch and combine `Config`s (`None` where no Config resolves: reported).
pub(super) fn check(
    job: &Job<'_>,
    b: &BufferSpec,
    w: &WorkloadSpec,
    mode: EpMode,
    d: &mut Diagnostics<'_>,
) -> (Option<Config>, Option<Config>) {
    let (prefix, name) = (job.prefix.as_str(), job.name());
    let n = job.ranks.len() as u32;
    let mut resolved = [None, None];
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    let hb = hint_hidden_bytes(w.hidden);
    let mut nvl_hint = 0u64;
    let mut rdma_hint = 0u64;
    for (i, (direction, explicit, key)) in [
        (Direction::Dispatch, &b.dispatch_config, "dispatch_config"),
        (Direction::Combine, &b.combine_config, "combine_config"),
    ]
    .into_iter()
    .enumerate()
    {
        let Some(cfg) = Config::resolve(direction, n, b.num_sms, explicit) else {
            d.error(
                "tuned-config",
                &bkey(key),
                name,
                format!(
                    "no tuned Config for EP{n} (get_{}_config asserts num_ranks in {{{}}}, buffer.py:259/289): set all four chunk sizes in [job.buffer.{key}]",
                    if direction == Direction::Dispatch { "dispatch" } else { "combine" },
                    config::tuned_rank_counts().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
                ),
            );
            continue;
        };
        resolved[i] = Some(cfg);
        if !check_config(job, direction, &cfg, key, mode, d) {
            continue;
        }
        nvl_hint = nvl_hint.max(cfg.nvl_buffer_size_hint(hb, n));
        rdma_hint = rdma_hint.max(cfg.rdma_buffer_size_hint(hb, n));
    }
    check_buffer_sizes(job, b, mode, nvl_hint, rdma_hint, d);
    (resolved[0], resolved[1])
}

/// One Config's chunk sizes (the Config constructor, config.hpp; the internode combine,
/// internode.cu:2358-2368); `false` when a chunk size is zero: no size hint follows from it.
fn check_config(
    job: &Job<'_>,
    direction: Direction,
    cfg: &Config,
    key: &str,
    mode: EpMode,
    d: &mut Diagnostics<'_>,
) -> bool {
    let (prefix, name) = (job.prefix.as_str(), job.name());
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    let nodes = num_rdma_ranks(job.ranks.len() as u32);
    let ck = |k: &str| format!("{prefix}.buffer.{key}.{k}");
    if cfg.num_max_nvl_chunked_send_tokens == 0 || cfg.num_max_rdma_chunked_send_tokens == 0 {
        d.error("config-chunks", &bkey(key), name, "chunk sizes must be ≥ 1".into());
        return false;
    }
    if cfg.num_max_nvl_chunked_send_tokens >= cfg.num_max_nvl_chunked_recv_tokens {
        d.error(
            "config-nvl-chunks",
            &ck("num_max_nvl_chunked_send_tokens"),
            name,
            format!(
                "nvl send {} must be < nvl recv {} (Config ctor, config.hpp)",
                cfg.num_max_nvl_chunked_send_tokens, cfg.num_max_nvl_chunked_recv_tokens
            ),
        );
    }
    if cfg.num_max_rdma_chunked_send_tokens > cfg.rdma_recv_rounded() / 2 {
        d.error(
            "config-rdma-lazy-head",
            &ck("num_max_rdma_chunked_send_tokens"),
            name,
            format!("rdma send {} > rdma recv (rounded up to {}) / 2: RDMA lazy head update needs send ≤ recv/2 (config.hpp:46-49)", cfg.num_max_rdma_chunked_send_tokens, cfg.rdma_recv_rounded()),
        );
    }
    if mode == EpMode::Internode && direction == Direction::Combine {
        let recv = cfg.num_max_nvl_chunked_recv_tokens;
        if nodes > COMBINE_MAX_RDMA_RANKS {
            d.error(
                "combine-rdma-ranks",
                &format!("{prefix}.ranks"),
                name,
                format!("{nodes} nodes > 24 for internode combine (internode.cu:2358)"),
            );
        }
        if !recv.is_multiple_of(nodes) {
            d.error(
                "combine-nvl-recv",
                &ck("num_max_nvl_chunked_recv_tokens"),
                name,
                format!("nvl recv {recv} % {nodes} nodes != 0 (internode.cu:2358-2368)"),
            );
        } else if recv / nodes
            <= cfg.num_max_rdma_chunked_send_tokens.max(cfg.num_max_nvl_chunked_send_tokens)
        {
            d.error(
                "combine-nvl-recv",
                &ck("num_max_nvl_chunked_recv_tokens"),
                name,
                format!("nvl recv {recv} / {nodes} nodes = {} must exceed max(rdma send, nvl send) = {} (internode.cu:2358-2368)", recv / nodes, cfg.num_max_rdma_chunked_send_tokens.max(cfg.num_max_nvl_chunked_send_tokens)),
            );
        }
    }
    true
}

/// The buffers against the Configs' size hints, and the internode kernels' QP rule.
fn check_buffer_sizes(
    job: &Job<'_>,
    b: &BufferSpec,
    mode: EpMode,
    nvl_hint: u64,
    rdma_hint: u64,
    d: &mut Diagnostics<'_>,
) {
    let (prefix, name) = (job.prefix.as_str(), job.name());
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    if b.num_nvl_bytes.bytes() < nvl_hint {
        d.error(
            "nvl-buffer-size",
            &bkey("num_nvl_bytes"),
            name,
            format!("{} bytes < NVL size hint {nvl_hint} ({}) for these Configs; DeepEP asserts the hint fits (get_nvl_buffer_size_hint)", b.num_nvl_bytes.bytes(), crate::units::ByteSize(nvl_hint)),
        );
    }
    if mode == EpMode::Internode {
        if b.num_rdma_bytes.bytes() < rdma_hint {
            d.error(
                "rdma-buffer-size",
                &bkey("num_rdma_bytes"),
                name,
                format!("{} bytes < RDMA size hint {rdma_hint} ({}); DeepEP asserts the hint fits (get_rdma_buffer_size_hint)", b.num_rdma_bytes.bytes(), crate::units::ByteSize(rdma_hint)),
            );
        }
        let channels = b.num_sms / 2;
        if !(b.num_qps_per_rank == channels || b.num_qps_per_rank >= b.num_sms) {
            d.error(
                "normal-qps",
                &bkey("num_qps_per_rank"),
                name,
                format!(
                    "{} QPs with {} SMs: normal internode needs num_qps_per_rank == channels ({channels}) or ≥ num_sms ({}) — data on QP channel, credits on channel + {channels}; the kernel traps otherwise (internode.cu:492)",
                    b.num_qps_per_rank, b.num_sms, b.num_sms
                ),
            );
        } else if b.num_qps_per_rank == channels {
            d.advisory("normal-qps-shared", &bkey("num_qps_per_rank"), name, "num_qps_per_rank == channels: head-credit atomics wrap onto the data QP (concurrent submission on one QP caused timeouts before PR #181)".into());
        }
    }
}
