//! DeepEP V1 `Config`, its tuned tables, and the buffer size-hint formulas (`csrc/config.hpp`,
//! `deep_ep/buffer.py:232-290`). References: docs/design.md, DeepEP §2, §6.

use serde::{Deserialize, Serialize};

use crate::scenario::schema::ChunkConfig;
use crate::topology::NUM_MAX_NVL_PEERS;

/// `NUM_BUFFER_ALIGNMENT_BYTES` (configs.cuh).
pub const NUM_BUFFER_ALIGNMENT_BYTES: u64 = 128;
/// `kNumMaxTopK` = `kNumMaxScales` in the size hints (config.hpp).
const K_MAX: u64 = 128;
/// Python's INT_MAX bound on buffer sizes (deep_ep.cpp:152-155).
pub const INT_MAX: u64 = i32::MAX as u64;

/// Which DeepEP kernels a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EpMode {
    /// Normal kernels, ≤ 8 ranks: NVLink only, NVSHMEM never initialised.
    Intranode,
    /// Normal kernels, > 8 ranks: RDMA to the same local index, then NVLink forwarding.
    Internode,
    /// Low-latency kernels (`low_latency_mode = true`): one global NVSHMEM world.
    LowLatency,
}

impl EpMode {
    pub fn new(low_latency_mode: bool, num_ranks: u32) -> Self {
        if low_latency_mode {
            EpMode::LowLatency
        } else if num_rdma_ranks(num_ranks) > 1 {
            EpMode::Internode
        } else {
            EpMode::Intranode
        }
    }

    /// Whether `Buffer.__init__` initialises NVSHMEM (and writes its variables): buffer.py:105.
    pub fn uses_nvshmem(self) -> bool {
        !matches!(self, EpMode::Intranode)
    }
}

/// `num_rdma_ranks = max(num_ranks / 8, 1)`.
pub fn num_rdma_ranks(num_ranks: u32) -> u32 {
    (num_ranks / NUM_MAX_NVL_PEERS).max(1)
}

/// DeepEP's `Config`: SMs and the four chunk sizes (tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub num_sms: u32,
    pub num_max_nvl_chunked_send_tokens: u32,
    pub num_max_nvl_chunked_recv_tokens: u32,
    pub num_max_rdma_chunked_send_tokens: u32,
    /// As given; [`Config::rdma_recv_rounded`] is what the kernels use.
    pub num_max_rdma_chunked_recv_tokens: u32,
}

/// Tuned tables (buffer.py:232-290): `(nvl_send, nvl_recv, rdma_send, rdma_recv)`.
const TUNED_DISPATCH: &[(u32, [u32; 4])] = &[
    (2, [24, 256, 6, 128]),
    (4, [6, 256, 6, 128]),
    (8, [6, 256, 6, 128]),
    (16, [36, 288, 20, 128]),
    (24, [32, 288, 8, 128]),
    (32, [32, 288, 8, 128]),
    (48, [32, 288, 8, 128]),
    (64, [32, 288, 8, 128]),
    (96, [20, 480, 12, 128]),
    (128, [20, 560, 12, 128]),
    (144, [32, 720, 12, 128]),
    (160, [28, 720, 12, 128]),
];
const TUNED_COMBINE: &[(u32, [u32; 4])] = &[
    (2, [10, 256, 6, 128]),
    (4, [9, 256, 6, 128]),
    (8, [4, 256, 6, 128]),
    (16, [4, 288, 12, 128]),
    (24, [1, 288, 8, 128]),
    (32, [1, 288, 8, 128]),
    (48, [1, 288, 8, 128]),
    (64, [1, 288, 8, 128]),
    (96, [1, 480, 8, 128]),
    (128, [1, 560, 8, 128]),
    (144, [2, 720, 8, 128]),
    (160, [2, 720, 8, 128]),
];

/// `Config()` pybind defaults.
const PLAIN_DEFAULT: [u32; 4] = [6, 256, 6, 256];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Dispatch,
    Combine,
}

/// The tuned `Config` DeepEP's `get_dispatch_config` / `get_combine_config` returns, or `None`
/// when `num_ranks` is not a key of the table (DeepEP raises there).
pub fn tuned(direction: Direction, num_ranks: u32) -> Option<[u32; 4]> {
    let table = match direction {
        Direction::Dispatch => TUNED_DISPATCH,
        Direction::Combine => TUNED_COMBINE,
    };
    table.iter().find(|(n, _)| *n == num_ranks).map(|(_, c)| *c)
}

pub fn tuned_rank_counts() -> impl Iterator<Item = u32> {
    TUNED_DISPATCH.iter().map(|(n, _)| *n)
}

impl Config {
    /// The config a job uses: explicit chunk sizes where given, the tuned table otherwise.
    /// `None` when a size is missing and there is no tuned entry for `num_ranks`.
    pub fn resolve(
        direction: Direction,
        num_ranks: u32,
        num_sms: u32,
        explicit: &ChunkConfig,
    ) -> Option<Config> {
        let complete = explicit.num_max_nvl_chunked_send_tokens.is_some()
            && explicit.num_max_nvl_chunked_recv_tokens.is_some()
            && explicit.num_max_rdma_chunked_send_tokens.is_some()
            && explicit.num_max_rdma_chunked_recv_tokens.is_some();
        let base = match tuned(direction, num_ranks) {
            Some(t) => t,
            None if complete => PLAIN_DEFAULT,
            None => return None,
        };
        Some(Config {
            num_sms,
            num_max_nvl_chunked_send_tokens: explicit
                .num_max_nvl_chunked_send_tokens
                .unwrap_or(base[0]),
            num_max_nvl_chunked_recv_tokens: explicit
                .num_max_nvl_chunked_recv_tokens
                .unwrap_or(base[1]),
            num_max_rdma_chunked_send_tokens: explicit
                .num_max_rdma_chunked_send_tokens
                .unwrap_or(base[2]),
            num_max_rdma_chunked_recv_tokens: explicit
                .num_max_rdma_chunked_recv_tokens
                .unwrap_or(base[3]),
        })
    }

    pub fn num_channels(&self) -> u32 {
        self.num_sms / 2
    }

    /// `rdma_recv` rounded up to a multiple of `rdma_send` (config.hpp).
    pub fn rdma_recv_rounded(&self) -> u32 {
        let send = self.num_max_rdma_chunked_send_tokens.max(1);
        self.num_max_rdma_chunked_recv_tokens.div_ceil(send) * send
    }

    /// `get_nvl_buffer_size_hint(hidden_bytes, num_ranks)`.
    pub fn nvl_buffer_size_hint(&self, hidden_bytes: u64, num_ranks: u32) -> u64 {
        let r = num_rdma_ranks(num_ranks) as u64;
        let n = num_ranks.min(NUM_MAX_NVL_PEERS) as u64;
        let c = self.num_channels() as u64;
        let t = self.num_max_nvl_chunked_recv_tokens as u64;
        let slot = hidden_bytes + 8 + K_MAX * 8 + K_MAX * 4 + K_MAX * 4;
        align_up(c * n * (2 * r + 3) * 4 + c * n * t * slot, NUM_BUFFER_ALIGNMENT_BYTES)
    }

    /// `get_rdma_buffer_size_hint(hidden_bytes, num_ranks)`: 0 for ≤ 8 ranks.
    pub fn rdma_buffer_size_hint(&self, hidden_bytes: u64, num_ranks: u32) -> u64 {
        if num_ranks <= NUM_MAX_NVL_PEERS {
            return 0;
        }
        let r = num_rdma_ranks(num_ranks) as u64;
        let c = self.num_channels() as u64;
        let t = self.rdma_recv_rounded() as u64;
        let slot = hidden_bytes + 8 + K_MAX * 8 + K_MAX * 4 + K_MAX * 4 + 16;
        let meta = (NUM_MAX_NVL_PEERS as u64 * 2 + 2) * 2 * 4;
        align_up(c * r * meta + 2 * c * r * t * slot, NUM_BUFFER_ALIGNMENT_BYTES)
    }
}

/// Hidden bytes in DeepEP's hints: `hidden * max(elem_size, 2)` = the BF16 size.
pub fn hint_hidden_bytes(hidden: u32) -> u64 {
    hidden as u64 * 2
}

/// `Buffer.get_low_latency_rdma_size_hint(T, hidden, num_ranks, num_experts)`
/// (`LowLatencyLayout`, config.hpp): independent of `num_ranks`, linear in E·T.
pub fn low_latency_rdma_size_hint(max_tokens: u32, hidden: u32, num_experts: u32) -> u64 {
    let (t, h, e) = (max_tokens as u64, hidden as u64, num_experts as u64);
    let dispatch_msg = 16 + (2 * h).max(h + h / 128 * 4);
    let combine_msg = h / 128 * 4 + 2 * h;
    let send = (t * dispatch_msg).max(e * t * combine_msg);
    let recv = (e * t * dispatch_msg).max(e * t * combine_msg);
    let signal = align_up(e * 4, NUM_BUFFER_ALIGNMENT_BYTES);
    let total = 2 * send + 2 * recv + 2 * signal;
    (total + NUM_BUFFER_ALIGNMENT_BYTES) / NUM_BUFFER_ALIGNMENT_BYTES * NUM_BUFFER_ALIGNMENT_BYTES
}

pub fn align_up(value: u64, alignment: u64) -> u64 {
    value.div_ceil(alignment) * alignment
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1024.0 * 1024.0;

    fn hints(num_ranks: u32, num_sms: u32) -> (f64, f64) {
        let d = Config::resolve(Direction::Dispatch, num_ranks, num_sms, &ChunkConfig::default())
            .unwrap();
        let c = Config::resolve(Direction::Combine, num_ranks, num_sms, &ChunkConfig::default())
            .unwrap();
        let hb = hint_hidden_bytes(7168);
        let nvl = d.nvl_buffer_size_hint(hb, num_ranks).max(c.nvl_buffer_size_hint(hb, num_ranks));
        let rdma =
            d.rdma_buffer_size_hint(hb, num_ranks).max(c.rdma_buffer_size_hint(hb, num_ranks));
        (nvl as f64 / MIB, rdma as f64 / MIB)
    }

    #[test]
    fn normal_hints_match_deepep_md_table() {
        // docs/design.md, DeepEP §6.3, hidden 7168, tuned configs, 20 SMs.
        let rows = [
            (8, 320.2, 0.0),
            (16, 360.2, 87.6),
            (24, 360.2, 120.2),
            (32, 360.2, 160.2),
            (48, 360.2, 240.4),
            (64, 360.2, 320.5),
            (96, 600.3, 495.7),
            (128, 700.4, 661.0),
            (144, 900.5, 743.6),
            (160, 900.5, 826.2),
        ];
        for (n, nvl, rdma) in rows {
            let (got_nvl, got_rdma) = hints(n, 20);
            assert!((got_nvl - nvl).abs() < 0.06, "EP{n} NVL {got_nvl:.2} vs {nvl}");
            assert!((got_rdma - rdma).abs() < 0.06, "EP{n} RDMA {got_rdma:.2} vs {rdma}");
        }
        let (nvl, rdma) = hints(16, 24);
        assert!((nvl - 432.2).abs() < 0.06 && (rdma - 105.2).abs() < 0.06, "{nvl} {rdma}");
    }

    #[test]
    fn rdma_recv_rounding() {
        let d16 = Config::resolve(Direction::Dispatch, 16, 20, &ChunkConfig::default()).unwrap();
        assert_eq!(d16.rdma_recv_rounded(), 140);
        let d96 = Config::resolve(Direction::Dispatch, 96, 20, &ChunkConfig::default()).unwrap();
        assert_eq!(d96.rdma_recv_rounded(), 132);
        let c32 = Config::resolve(Direction::Combine, 32, 20, &ChunkConfig::default()).unwrap();
        assert_eq!(c32.rdma_recv_rounded(), 128);
    }

    #[test]
    fn low_latency_hints_match_worked_sizes() {
        assert_eq!(low_latency_rdma_size_hint(128, 7168, 256), 1_908_410_496);
        assert_eq!(low_latency_rdma_size_hint(128, 7168, 288), 2_146_961_792);
        assert_eq!(low_latency_rdma_size_hint(256, 7168, 256), 3_816_818_816);
        assert_eq!(low_latency_rdma_size_hint(512, 7168, 256), 7_633_635_456);
        assert_eq!(low_latency_rdma_size_hint(128, 2048, 256), 545_261_696);
        assert_eq!(low_latency_rdma_size_hint(128, 4096, 256), 1_090_521_216);
        assert_eq!(low_latency_rdma_size_hint(128, 8192, 256), 2_181_040_256);
    }

    #[test]
    fn untuned_rank_counts_need_explicit_chunks() {
        assert!(Config::resolve(Direction::Dispatch, 40, 20, &ChunkConfig::default()).is_none());
        let all = ChunkConfig {
            num_max_nvl_chunked_send_tokens: Some(8),
            num_max_nvl_chunked_recv_tokens: Some(256),
            num_max_rdma_chunked_send_tokens: Some(8),
            num_max_rdma_chunked_recv_tokens: Some(128),
        };
        assert!(Config::resolve(Direction::Dispatch, 40, 20, &all).is_some());
        assert_eq!(EpMode::new(false, 8), EpMode::Intranode);
        assert_eq!(EpMode::new(false, 16), EpMode::Internode);
        assert_eq!(EpMode::new(true, 8), EpMode::LowLatency);
    }
}
