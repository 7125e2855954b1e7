//! The range of every numeric key of a hardware profile, checked on the resolved profile (the
//! bundled file with the scenario's `[cluster.overrides.<section>]` on top). The simulator turns
//! these numbers into integer rates and times: a value outside its range would panic there
//! (`Rate::from_gbps` of NaN or 0), deadlock (a 1e-300 GB/s link), or be silently ignored, so
//! each is an error naming the override key (docs/scenario.md, "Limits", has the table).

use crate::diag::Diagnostics;
use crate::profile::HardwareProfile;

/// Bandwidths in GB/s: from 1 GB/s (below any NVLink, PCIe or NIC a DeepEP cluster uses) to
/// 10^7 GB/s (10 PB/s: "free" in experiments; the simulator's fixed-point rate is still exact
/// to 0.1 % there).
pub const MIN_GBPS: f64 = 1.0;
pub const MAX_GBPS: f64 = 1e7;
/// Efficiencies: fractions of a nominal rate, 1 % to 100 %.
pub const MIN_EFFICIENCY: f64 = 0.01;
/// Latencies and fixed costs in ns: 0 to 1 s.
pub const MAX_LATENCY_NS: f64 = 1e9;

/// What a key may hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Range {
    /// GB/s in [`MIN_GBPS`, `MAX_GBPS`].
    Gbps,
    /// A fraction in [`MIN_EFFICIENCY`, 1].
    Efficiency,
    /// ns in [0, `MAX_LATENCY_NS`].
    LatencyNs,
    /// A count or size in [min, max].
    Integer { min: u64, max: u64 },
    /// A real number in [min, max].
    Real { min: f64, max: f64 },
}

impl Range {
    fn holds(self, value: f64) -> bool {
        let (lo, hi) = self.bounds();
        value.is_finite() && value >= lo && value <= hi
    }

    fn bounds(self) -> (f64, f64) {
        match self {
            Range::Gbps => (MIN_GBPS, MAX_GBPS),
            Range::Efficiency => (MIN_EFFICIENCY, 1.0),
            Range::LatencyNs => (0.0, MAX_LATENCY_NS),
            Range::Integer { min, max } => (min as f64, max as f64),
            Range::Real { min, max } => (min, max),
        }
    }

    /// The range in words, as docs/scenario.md states it.
    pub fn describe(self) -> String {
        match self {
            Range::Gbps => "a bandwidth from 1 to 10^7 GB/s".into(),
            Range::Efficiency => "a fraction from 0.01 to 1".into(),
            Range::LatencyNs => "a time from 0 to 10^9 ns (1 s)".into(),
            Range::Integer { min, max } => format!("an integer from {min} to {max}"),
            Range::Real { min, max } => format!("a number from {min} to {max}"),
        }
    }
}

/// One numeric key of a resolved profile: `section.key` (as in `[cluster.overrides.section]`),
/// its value, its range.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: &'static str,
    pub value: f64,
    /// The value as written (integers exactly).
    pub text: String,
    pub range: Range,
}

const SM_COUNT: Range = Range::Integer { min: 1, max: 1024 };
const CLOCK_GHZ: Range = Range::Real { min: 0.1, max: 10.0 };
/// NVLink packets carry 16 to 256 bytes of payload (flits of 16 bytes).
const NVLINK_PAYLOAD: Range = Range::Integer { min: 16, max: 256 };
/// NICs per GPU: the simulator models one per GPU (rail-optimised); up to 8 are accepted.
const NICS_PER_GPU: Range = Range::Integer { min: 1, max: 8 };
/// A NIC's largest QP depth: at least NVSHMEM's smallest (128), at most 2^20.
const MAX_QP_DEPTH: Range = Range::Integer { min: 128, max: 1 << 20 };
/// A switch forwards between at least 2 ports; the largest switches have a few hundred.
const SWITCH_RADIX: Range = Range::Integer { min: 2, max: 1024 };
const L2_BYTES: Range = Range::Integer { min: 1 << 20, max: 1 << 40 };
const FLUSH_DIRTY_BYTES: Range = Range::Integer { min: 0, max: 1 << 40 };
const CLUSTERS: Range = Range::Integer { min: 1, max: 1024 };
const SMEM_BYTES: Range = Range::Integer { min: 1, max: 1 << 24 };

/// Every numeric key of `p` that has a range (the fabric's QoS keys, `mtu` and `data_vls`
/// have their own rules in `fabric.rs`; `vl_buffer_bytes` depends on the MTU, see
/// [`violations`]).
pub fn entries(p: &HardwareProfile) -> Vec<Entry> {
    let e = |key, value: Number, range| Entry { key, value: value.0, text: value.1, range };
    let n = |v: u64| Number(v as f64, v.to_string());
    let x = |v: f64| Number(v, show(v));
    let (g, nv, pc, nic, f, dp) = (&p.gpu, &p.nvlink, &p.pcie, &p.nic, &p.fabric, &p.deepep);
    let mut out = vec![
        e("gpu.sm_count", n(g.sm_count as u64), SM_COUNT),
        e("gpu.clock_ghz", x(g.clock_ghz), CLOCK_GHZ),
        e("gpu.hbm_bw_gbps", x(g.hbm_bw_gbps), Range::Gbps),
        e("gpu.memcpy_bw_gbps", x(g.memcpy_bw_gbps), Range::Gbps),
        e("gpu.sm_copy_bw_gbps", x(g.sm_copy_bw_gbps), Range::Gbps),
        e("gpu.warp_copy_bw_gbps", x(g.warp_copy_bw_gbps), Range::Gbps),
        e("gpu.kernel_launch_ns", n(g.kernel_launch_ns), Range::LatencyNs),
        e("gpu.flag_latency_ns", n(g.flag_latency_ns), Range::LatencyNs),
        e("gpu.grid_sync_ns", n(g.grid_sync_ns), Range::LatencyNs),
        e("nvlink.bw_per_direction_gbps", x(nv.bw_per_direction_gbps), Range::Gbps),
        e("nvlink.efficiency", x(nv.efficiency), Range::Efficiency),
        e("nvlink.latency_ns", n(nv.latency_ns), Range::LatencyNs),
        e("nvlink.packet_payload_bytes", n(nv.packet_payload_bytes as u64), NVLINK_PAYLOAD),
        e("pcie.bw_gbps", x(pc.bw_gbps), Range::Gbps),
        e("pcie.efficiency", x(pc.efficiency), Range::Efficiency),
        e("pcie.latency_ns", n(pc.latency_ns), Range::LatencyNs),
        e("nic.per_gpu", n(nic.per_gpu as u64), NICS_PER_GPU),
        e("nic.link_gbps", x(nic.link_gbps), Range::Gbps),
        e("nic.efficiency", x(nic.efficiency), Range::Efficiency),
        e("nic.wqe_post_ns", n(nic.wqe_post_ns), Range::LatencyNs),
        e("nic.doorbell_ns", n(nic.doorbell_ns), Range::LatencyNs),
        e("nic.wqe_process_ns", n(nic.wqe_process_ns), Range::LatencyNs),
        e("nic.tx_latency_ns", n(nic.tx_latency_ns), Range::LatencyNs),
        e("nic.rx_latency_ns", n(nic.rx_latency_ns), Range::LatencyNs),
        e("nic.max_qp_depth", n(nic.max_qp_depth as u64), MAX_QP_DEPTH),
        e("fabric.switch_radix", n(f.switch_radix as u64), SWITCH_RADIX),
        e("fabric.switch_latency_ns", n(f.switch_latency_ns), Range::LatencyNs),
        e("fabric.link_latency_ns", n(f.link_latency_ns), Range::LatencyNs),
        e("fabric.credit_update_ns", n(f.credit_update_ns), Range::LatencyNs),
        e("fabric.adaptive_routing_latency_ns", n(f.adaptive_routing_latency_ns), Range::LatencyNs),
        e("deepep.notify_host_roundtrip_ns", n(dp.notify_host_roundtrip_ns), Range::LatencyNs),
        e("deepep.per_token_issue_ns", n(dp.per_token_issue_ns), Range::LatencyNs),
        e("deepep.ll_signal_ns", n(dp.ll_signal_ns), Range::LatencyNs),
        e("deepep.ll_recv_per_msg_ns", n(dp.ll_recv_per_msg_ns), Range::LatencyNs),
        e("deepep.ll_dispatch_fixed_ns", n(dp.ll_dispatch_fixed_ns), Range::LatencyNs),
        e("deepep.ll_combine_fixed_ns", n(dp.ll_combine_fixed_ns), Range::LatencyNs),
        e("deepep.ll_send_round_ns", n(dp.ll_send_round_ns), Range::LatencyNs),
        e("deepep.ll_combine_round_ns", n(dp.ll_combine_round_ns), Range::LatencyNs),
        e("deepep.ll_reduce_load_ns", n(dp.ll_reduce_load_ns), Range::LatencyNs),
    ];
    for (key, value) in [
        ("deepep.ll_dispatch_recv_fixed_ns", dp.ll_dispatch_recv_fixed_ns),
        ("deepep.ll_combine_recv_fixed_ns", dp.ll_combine_recv_fixed_ns),
    ] {
        if let Some(v) = value {
            out.push(e(key, n(v), Range::LatencyNs));
        }
    }
    if let Some(m) = &g.memory {
        let opt = |key, value: Option<f64>, range| {
            value.map(|v| Entry { key, value: v, text: show(v), range })
        };
        out.extend([
            e("gpu.memory.l2_bytes", n(m.l2_bytes), L2_BYTES),
            e("gpu.memory.l2_bw_gbps", x(m.l2_bw_gbps), Range::Gbps),
            e("gpu.memory.dram_bw_gbps", x(m.dram_bw_gbps), Range::Gbps),
            e("gpu.memory.warp_row_l2_ns", x(m.warp_row_l2_ns), Range::LatencyNs),
            e("gpu.memory.warp_row_hbm_ns", x(m.warp_row_hbm_ns), Range::LatencyNs),
            e("gpu.memory.sm_copy_l2_gbps", x(m.sm_copy_l2_gbps), Range::Gbps),
            e("gpu.memory.sm_copy_hbm_gbps", x(m.sm_copy_hbm_gbps), Range::Gbps),
            e("gpu.memory.load_l2_ns", n(m.load_l2_ns), Range::LatencyNs),
            e("gpu.memory.load_hbm_ns", n(m.load_hbm_ns), Range::LatencyNs),
            e("gpu.memory.load_hbm_busy_ns", n(m.load_hbm_busy_ns), Range::LatencyNs),
            e("gpu.memory.atomic_ns", n(m.atomic_ns), Range::LatencyNs),
            e("gpu.memory.release_ns", n(m.release_ns), Range::LatencyNs),
        ]);
        out.extend(
            [
                opt(
                    "gpu.memory.flush_dirty_bytes",
                    m.flush_dirty_bytes.map(|b| b as f64),
                    FLUSH_DIRTY_BYTES,
                ),
                opt("gpu.memory.l2_hbm_bw_gbps", m.l2_hbm_bw_gbps, Range::Gbps),
                opt("gpu.memory.l2_ring_bw_gbps", m.l2_ring_bw_gbps, Range::Gbps),
                opt("gpu.memory.l2_discard_bw_gbps", m.l2_discard_bw_gbps, Range::Gbps),
                opt("gpu.memory.ll_send_cast_ns", m.ll_send_cast_ns, Range::LatencyNs),
                opt("gpu.memory.ll_send_slot_ns", m.ll_send_slot_ns, Range::LatencyNs),
                opt("gpu.memory.ll_send_copy_ns", m.ll_send_copy_ns, Range::LatencyNs),
                opt("gpu.memory.ll_send_release_ns", m.ll_send_release_ns, Range::LatencyNs),
                opt("gpu.memory.ll_recv_poll_ns", m.ll_recv_poll_ns, Range::LatencyNs),
                opt("gpu.memory.cluster_fill_ns", m.cluster_fill_ns, Range::LatencyNs),
                opt("gpu.memory.cluster_fill_wave_ns", m.cluster_fill_wave_ns, Range::LatencyNs),
                opt("gpu.memory.cluster_bulk_copy_gbps", m.cluster_bulk_copy_gbps, Range::Gbps),
                opt("gpu.memory.cluster_store_ns", m.cluster_store_ns, Range::LatencyNs),
                opt("gpu.memory.cluster_handoff_bw_gbps", m.cluster_handoff_bw_gbps, Range::Gbps),
                opt(
                    "gpu.memory.cluster_transfer_l2_ns",
                    m.cluster_transfer_l2_ns,
                    Range::LatencyNs,
                ),
                opt("gpu.memory.cluster_sm_ingest_gbps", m.cluster_sm_ingest_gbps, Range::Gbps),
                opt(
                    "gpu.memory.cluster_ingest_chunk_ns",
                    m.cluster_ingest_chunk_ns,
                    Range::LatencyNs,
                ),
                opt(
                    "gpu.memory.cluster_max_active_clusters",
                    m.cluster_max_active_clusters.map(|v| v as f64),
                    CLUSTERS,
                ),
                opt(
                    "gpu.memory.cluster_smem_bytes",
                    m.cluster_smem_bytes.map(|v| v as f64),
                    SMEM_BYTES,
                ),
                opt("gpu.memory.cluster_reduce_ns", m.cluster_reduce_ns, Range::LatencyNs),
                opt(
                    "gpu.memory.cluster_reduce_source_ns",
                    m.cluster_reduce_source_ns,
                    Range::LatencyNs,
                ),
            ]
            .into_iter()
            .flatten(),
        );
    }
    out
}

/// A value and its text.
struct Number(f64, String);

/// A real number as people write it: `0.7`, `1e-300`, `NaN`.
fn show(v: f64) -> String {
    if v == 0.0 || !v.is_finite() || (1e-4..1e15).contains(&v.abs()) {
        v.to_string()
    } else {
        format!("{v:e}")
    }
}

/// Headers of one packet rounded up to 64-byte credits, the most any fabric kind adds
/// (RoCE: 82 bytes of headers plus a 16-byte RETH).
const PACKET_OVERHEAD_BYTES: u64 = 128;

/// Every key of `p` outside its range: (`section.key`, what was found and what is needed).
pub fn violations(p: &HardwareProfile) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = entries(p)
        .into_iter()
        .filter(|e| !e.range.holds(e.value))
        .map(|e| (e.key.to_string(), format!("{}: expected {}", e.text, e.range.describe())))
        .collect();
    // A VL's receive buffer must hold one whole packet, or the sender never gets the credits
    // to send it (the run deadlocks at its first packet).
    let need = p.fabric.mtu as u64 + PACKET_OVERHEAD_BYTES;
    let have = p.fabric.vl_buffer_bytes as u64;
    if !(need..=1 << 30).contains(&have) {
        out.push((
            "fabric.vl_buffer_bytes".into(),
            format!(
                "{have}: a VL's receive buffer holds at least one packet, mtu {} + {PACKET_OVERHEAD_BYTES} \
                 bytes of headers = {need} bytes, and at most 2^30 bytes",
                p.fabric.mtu
            ),
        ));
    }
    out
}

/// Report every profile key outside its range, at the override that set it (or at
/// `cluster.profile` for a bundled value). `false` when there was any.
pub fn check(p: &HardwareProfile, d: &mut Diagnostics<'_>) -> bool {
    let found = violations(p);
    for (key, message) in &found {
        let written = format!("cluster.overrides.{key}");
        let (path, message) = if d.source().has(&written) {
            (written, message.clone())
        } else {
            ("cluster.profile".to_string(), format!("{key} = {message}"))
        };
        d.error("profile-range", &path, None, message);
    }
    found.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{BUNDLED, HardwareProfile};

    #[test]
    fn every_bundled_profile_is_within_range() {
        for (name, text) in BUNDLED {
            let profile: HardwareProfile = toml::from_str(text).unwrap();
            assert_eq!(violations(&profile), Vec::<(String, String)>::new(), "{name}");
        }
    }

    #[test]
    fn out_of_range_values_are_named() {
        let mut p: HardwareProfile = toml::from_str(BUNDLED[0].1).unwrap();
        p.nvlink.bw_per_direction_gbps = f64::NAN;
        p.nic.efficiency = 2.0;
        p.pcie.bw_gbps = f64::INFINITY;
        p.gpu.memcpy_bw_gbps = 0.0;
        p.nic.per_gpu = 0;
        p.fabric.switch_radix = 1;
        p.fabric.vl_buffer_bytes = 0;
        p.nvlink.packet_payload_bytes = 0;
        p.nic.max_qp_depth = 0;
        p.gpu.clock_ghz = f64::NAN;
        let found: Vec<String> =
            violations(&p).into_iter().map(|(k, m)| format!("{k} = {m}")).collect();
        for expected in [
            "nvlink.bw_per_direction_gbps = NaN: expected a bandwidth from 1 to 10^7 GB/s",
            "nic.efficiency = 2: expected a fraction from 0.01 to 1",
            "pcie.bw_gbps = inf: expected a bandwidth from 1 to 10^7 GB/s",
            "gpu.memcpy_bw_gbps = 0: expected a bandwidth from 1 to 10^7 GB/s",
            "nic.per_gpu = 0: expected an integer from 1 to 8",
            "fabric.switch_radix = 1: expected an integer from 2 to 1024",
            "nvlink.packet_payload_bytes = 0: expected an integer from 16 to 256",
            "nic.max_qp_depth = 0: expected an integer from 128 to 1048576",
            "gpu.clock_ghz = NaN: expected a number from 0.1 to 10",
        ] {
            assert!(found.iter().any(|f| f == expected), "{expected} not in {found:#?}");
        }
        assert!(found.iter().any(|f| f.starts_with("fabric.vl_buffer_bytes = 0: a VL's receive buffer holds at least one packet, mtu 4096 + 128")), "{found:#?}");
        assert_eq!(found.len(), 10, "{found:#?}");
    }

    #[test]
    fn bounds_are_inclusive() {
        assert!(Range::Gbps.holds(1.0) && Range::Gbps.holds(1e7));
        assert!(!Range::Gbps.holds(0.999) && !Range::Gbps.holds(1.1e7));
        assert!(Range::Efficiency.holds(1.0) && !Range::Efficiency.holds(0.0));
        assert!(Range::LatencyNs.holds(0.0) && !Range::LatencyNs.holds(-1.0));
        assert!(!Range::LatencyNs.holds(f64::NEG_INFINITY));
    }
}
