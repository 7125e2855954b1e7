//! The model's parameters in simulator units, derived once from the resolved hardware profile
//! (`engine/profiles/*.toml`, docs/calibration.md). Nothing else reads the profile.

use eptwin_engine::api::{FabricKind, FabricRouting, HardwareProfile, Plan, SwitchMode};

use crate::core::time::{Rate, Time, ns};

/// Per-packet header bytes on the wire (docs/design.md, fabric §3 for IB, §5 for RoCEv2).
#[derive(Debug, Clone, Copy)]
pub struct Headers {
    /// Every data packet: IB LRH 8 + BTH 12 + ICRC 4 + VCRC 2; RoCE Eth 14 + IPv4 20 + UDP 8 +
    /// BTH 12 + ICRC 4 + FCS 4 + preamble/SFD/IFG 20.
    pub data: u32,
    /// RETH on the first packet of an RDMA WRITE.
    pub reth: u32,
    /// RC ACK (AETH).
    pub ack: u32,
    /// Atomic request (AtomicETH) and response (AETH + AtomicAckETH).
    pub atomic_req: u32,
    pub atomic_resp: u32,
}

impl Headers {
    pub fn for_kind(kind: FabricKind) -> Headers {
        match kind {
            FabricKind::Infiniband => {
                Headers { data: 26, reth: 16, ack: 30, atomic_req: 54, atomic_resp: 38 }
            }
            FabricKind::Roce => {
                let base = 14 + 20 + 8 + 12 + 4 + 4 + 20;
                Headers {
                    data: base,
                    reth: 16,
                    ack: base + 4,
                    atomic_req: base + 28,
                    atomic_resp: base + 12,
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct Params {
    pub kind: FabricKind,
    pub mtu: u32,
    pub hdr: Headers,
    /// Switch-to-switch and switch-to-NIC port rate (line rate).
    pub link_rate: Rate,
    /// NIC injection rate: line rate × NIC efficiency (DMA/PCIe limits), wire bytes.
    pub nic_rate: Rate,
    /// GPUDirect writes from the NIC into GPU memory (PCIe × efficiency).
    pub pcie_rate: Rate,
    pub pcie_latency: Time,
    pub link_latency: Time,
    pub switch_latency: Time,
    pub cut_through: bool,
    pub adaptive: bool,
    pub adaptive_latency: Time,
    /// Credits (64-B blocks) per lane per receive buffer.
    pub credits_per_lane: i32,
    /// Delay from freeing a receive buffer to the credit reaching the sender, beyond the wire
    /// latency: flow-control packets go out periodically, on average half a period late.
    pub credit_delay: Time,
    pub wqe_post: Time,
    pub doorbell: Time,
    pub wqe_process: Time,
    pub tx_latency: Time,
    pub rx_latency: Time,
    pub nvl_rate: Rate,
    pub nvl_latency: Time,
    pub hbm_copy_rate: Rate,
    pub sm_copy_rate: Rate,
    pub sm_count: u32,
    pub kernel_launch: Time,
    pub flag_latency: Time,
    /// The SM-side memory system (profile `[gpu.memory]`): present, ranks that share one GPU
    /// run the hardware backend's one-GPU kernels (`hwkernels`).
    pub one_gpu: Option<OneGpu>,
    pub profile: HardwareProfile,
}

/// One GPU's memory system as its SMs see it (`[gpu.memory]`, docs/calibration.md).
#[derive(Debug, Clone, Copy)]
pub struct OneGpu {
    pub l2_bytes: u64,
    /// Dirty bytes the timing's flush leaves in L2 (`flush_dirty_bytes`, else `l2_bytes`).
    pub flush_dirty: u64,
    /// SM-side L2 throughput (bytes loaded + stored).
    pub l2_rate: Rate,
    /// HBM throughput of SM-driven traffic (bytes read + written).
    pub dram_rate: Rate,
    /// L2 time per byte read from or written back to HBM, on top of the SM-side access.
    pub l2_hbm_rate: Option<Rate>,
    /// SM-side L2 throughput for ring-slot bytes handed from one SM to another through L2
    /// (absent: `l2_rate`).
    pub l2_ring_rate: Option<Rate>,
    /// L2 time per byte dropped with `discard.global.L2` (absent: free).
    pub l2_discard_rate: Option<Rate>,
    /// One warp's copy of a 7,168-byte row (two rounds of 7 × 16-B loads per lane).
    pub row_l2: Time,
    pub row_hbm: Time,
    /// One SM's load/store port: bytes loaded plus stored per second, the most a block of the
    /// copy probes moved through one SM (L2-resident or HBM source, whichever is higher).
    pub sm_port: Rate,
    pub load_l2: Time,
    pub load_hbm: Time,
    pub load_hbm_busy: Time,
    pub atomic: Time,
    pub release: Time,
    /// The low-latency dispatch's send loop per (token, rank) item with every SM sending
    /// (`ll_send_*_ns`; absent: built from the single operations).
    pub ll_send: LlSendSteps,
    /// One count poll of a low-latency receive group with every SM receiving
    /// (`ll_recv_poll_ns`; absent: `load_l2`).
    pub ll_recv_poll: Option<Time>,
    /// The normal kernels' rings in cluster shared memory (`cluster_*`; absent: global rings).
    pub cluster: Option<ClusterRings>,
}

/// The cluster kernels' handoff through a peer block's shared memory (`[gpu.memory]`
/// `cluster_*`, docs/calibration.md "h200-single").
#[derive(Debug, Clone, Copy)]
pub struct ClusterRings {
    /// A slot's refill besides its bytes at `bulk`: head release → producer issues the bulk
    /// copy → the chunk lands and the consumer sees it; with one cluster on the GPU, and with a
    /// whole wave of `max_active_clusters`.
    pub fill: Time,
    pub fill_wave: Time,
    /// One bulk copy's bytes: a fill's, a consumer's store's.
    pub bulk: Rate,
    /// A consumer's fixed time per bulk store (issue, read completion, head release).
    pub store: Time,
    /// Every bulk copy into a peer's shared memory on the GPU, together: bytes at `handoff`.
    pub handoff: Rate,
    /// The L2's time per bulk transfer of a chunk (a fill, a slot stored out) besides its bytes.
    pub transfer_l2: Time,
    /// Each SM's intake of the bulk copies into its shared memory: `ingest_chunk` per chunk
    /// plus its bytes at `sm_ingest`.
    pub sm_ingest: Rate,
    pub ingest_chunk: Time,
    /// Clusters of 8 one-block-per-SM blocks resident at once.
    pub max_active_clusters: u32,
    /// Dynamic shared memory per block, bytes.
    pub smem_bytes: u64,
    /// A combine block's reduction of one token: `reduce` plus `reduce_source` per partial.
    pub reduce: Time,
    pub reduce_source: Time,
    /// Each cluster's frame (mbarrier init and fence, the cluster barriers at start and exit)
    /// beyond the launch; 0 where the profile has no `cluster_frame_ns`.
    pub frame: Time,
}

/// Steps of one item of the low-latency dispatch's send loop, each measured with every SM
/// sending, or `None` where the profile leaves it to the single-operation latencies.
#[derive(Debug, Clone, Copy, Default)]
pub struct LlSendSteps {
    /// The FP8 cast by 31 warps and the named barrier.
    pub cast: Option<Time>,
    /// The expert index load and the slot's returning atomic.
    pub slot: Option<Time>,
    /// One warp's copy of the message from the staging buffer into its slot.
    pub copy: Option<Time>,
    /// The release add after the copy and back to the loop.
    pub release: Option<Time>,
}

impl OneGpu {
    /// L2 work beyond what `ring` SM-side bytes cost at `l2_rate`, when they are ring-slot
    /// stores or loads handed from one SM to another through L2, plus what dropping `discard`
    /// bytes of consumed lines costs. A ring rate above `l2_rate` is not modelled (the probe
    /// measures it lower): those bytes then cost `l2_rate`.
    pub fn l2_extra(&self, ring: u64, discard: u64) -> Time {
        let handoff =
            self.l2_ring_rate.map_or(0, |r| r.time(ring).saturating_sub(self.l2_rate.time(ring)));
        handoff + self.l2_discard_rate.map_or(0, |r| r.time(discard))
    }
}

/// Fractional nanoseconds to simulated time.
fn ns_f(v: f64) -> Time {
    (v * 1000.0).round().max(0.0) as Time
}

impl Params {
    pub fn new(plan: &Plan) -> Params {
        Params::from_profile(&plan.profile)
    }

    pub fn from_profile(p: &HardwareProfile) -> Params {
        let f = &p.fabric;
        Params {
            kind: f.kind,
            mtu: f.mtu,
            hdr: Headers::for_kind(f.kind),
            link_rate: Rate::from_gbps(p.nic.link_gbps),
            nic_rate: Rate::from_gbps(p.nic.link_gbps * p.nic.efficiency),
            pcie_rate: Rate::from_gbps(p.pcie.bw_gbps * p.pcie.efficiency),
            pcie_latency: ns(p.pcie.latency_ns),
            link_latency: ns(f.link_latency_ns),
            switch_latency: ns(f.switch_latency_ns),
            cut_through: f.switch_mode == SwitchMode::CutThrough,
            adaptive: f.routing == FabricRouting::Adaptive,
            adaptive_latency: ns(f.adaptive_routing_latency_ns),
            credits_per_lane: (f.vl_buffer_bytes / 64) as i32,
            credit_delay: ns(f.credit_update_ns) / 2,
            wqe_post: ns(p.nic.wqe_post_ns),
            doorbell: ns(p.nic.doorbell_ns),
            wqe_process: ns(p.nic.wqe_process_ns),
            tx_latency: ns(p.nic.tx_latency_ns),
            rx_latency: ns(p.nic.rx_latency_ns),
            nvl_rate: Rate::from_gbps(p.nvlink.achievable_gbps()),
            nvl_latency: ns(p.nvlink.latency_ns),
            hbm_copy_rate: Rate::from_gbps(p.gpu.memcpy_bw_gbps),
            sm_copy_rate: Rate::from_gbps(p.gpu.sm_copy_bw_gbps),
            sm_count: p.gpu.sm_count,
            kernel_launch: ns(p.gpu.kernel_launch_ns),
            flag_latency: ns(p.gpu.flag_latency_ns),
            one_gpu: p.gpu.memory.as_ref().map(|m| OneGpu {
                l2_bytes: m.l2_bytes,
                flush_dirty: m.flush_dirty_bytes.unwrap_or(m.l2_bytes).min(m.l2_bytes),
                l2_rate: Rate::from_gbps(m.l2_bw_gbps),
                dram_rate: Rate::from_gbps(m.dram_bw_gbps),
                l2_hbm_rate: m.l2_hbm_bw_gbps.map(Rate::from_gbps),
                l2_ring_rate: m.l2_ring_bw_gbps.map(Rate::from_gbps),
                l2_discard_rate: m.l2_discard_bw_gbps.map(Rate::from_gbps),
                row_l2: ns_f(m.warp_row_l2_ns),
                row_hbm: ns_f(m.warp_row_hbm_ns),
                sm_port: Rate::from_gbps(2.0 * m.sm_copy_l2_gbps.max(m.sm_copy_hbm_gbps)),
                load_l2: ns(m.load_l2_ns),
                load_hbm: ns(m.load_hbm_ns),
                load_hbm_busy: ns(m.load_hbm_busy_ns),
                atomic: ns(m.atomic_ns),
                release: ns(m.release_ns),
                ll_send: LlSendSteps {
                    cast: m.ll_send_cast_ns.map(ns_f),
                    slot: m.ll_send_slot_ns.map(ns_f),
                    copy: m.ll_send_copy_ns.map(ns_f),
                    release: m.ll_send_release_ns.map(ns_f),
                },
                ll_recv_poll: m.ll_recv_poll_ns.map(ns_f),
                cluster: match (
                    (
                        m.cluster_fill_ns,
                        m.cluster_fill_wave_ns,
                        m.cluster_bulk_copy_gbps,
                        m.cluster_store_ns,
                    ),
                    (
                        m.cluster_handoff_bw_gbps,
                        m.cluster_transfer_l2_ns,
                        m.cluster_sm_ingest_gbps,
                        m.cluster_ingest_chunk_ns,
                    ),
                    m.cluster_max_active_clusters,
                    m.cluster_smem_bytes,
                    (m.cluster_reduce_ns, m.cluster_reduce_source_ns),
                ) {
                    (
                        (Some(fill), Some(fill_wave), Some(bulk), Some(store)),
                        (Some(handoff), Some(chunk), Some(ingest), Some(ingest_chunk)),
                        Some(act),
                        Some(smem),
                        (Some(reduce), Some(reduce_source)),
                    ) => Some(ClusterRings {
                        fill: ns_f(fill),
                        fill_wave: ns_f(fill_wave),
                        bulk: Rate::from_gbps(bulk),
                        store: ns_f(store),
                        handoff: Rate::from_gbps(handoff),
                        transfer_l2: ns_f(chunk),
                        sm_ingest: Rate::from_gbps(ingest),
                        ingest_chunk: ns_f(ingest_chunk),
                        max_active_clusters: act.max(1),
                        smem_bytes: smem,
                        reduce: ns_f(reduce),
                        reduce_source: ns_f(reduce_source),
                        frame: m.cluster_frame_ns.map_or(0, ns_f),
                    }),
                    _ => None,
                },
            }),
            profile: p.clone(),
        }
    }

    /// Wire bytes of a data packet carrying `payload` bytes.
    #[inline]
    pub fn data_wire(&self, payload: u32, first: bool) -> u32 {
        payload + self.hdr.data + if first { self.hdr.reth } else { 0 }
    }

    /// Packets of a message of `bytes` payload (at least one).
    #[inline]
    pub fn packets(&self, bytes: u32) -> u32 {
        bytes.div_ceil(self.mtu).max(1)
    }

    /// Total wire bytes of an RDMA write of `bytes` (docs/design.md, fabric §3: m + 26·ceil(m/P) +
    /// 16).
    pub fn write_wire_bytes(&self, bytes: u32) -> u64 {
        bytes as u64 + self.packets(bytes) as u64 * self.hdr.data as u64 + self.hdr.reth as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_sizes_match_fabric_md() {
        let p: HardwareProfile =
            toml::from_str(eptwin_engine::profile::BUNDLED[0].1).expect("h800 profile");
        let params = Params::from_profile(&p);
        assert_eq!(params.write_wire_bytes(7408), 7476);
        assert_eq!(params.write_wire_bytes(14336), 14456);
        assert_eq!(params.write_wire_bytes(59_776), 60_182);
    }

    fn one_gpu(ring: Option<f64>, discard: Option<f64>) -> OneGpu {
        OneGpu {
            l2_bytes: 1 << 26,
            flush_dirty: 1 << 26,
            l2_rate: Rate::from_gbps(6000.0),
            dram_rate: Rate::from_gbps(4000.0),
            l2_hbm_rate: None,
            l2_ring_rate: ring.map(Rate::from_gbps),
            l2_discard_rate: discard.map(Rate::from_gbps),
            row_l2: 1,
            row_hbm: 1,
            sm_port: Rate::from_gbps(100.0),
            load_l2: 1,
            load_hbm: 1,
            load_hbm_busy: 1,
            atomic: 1,
            release: 1,
            ll_send: LlSendSteps::default(),
            ll_recv_poll: None,
            cluster: None,
        }
    }

    #[test]
    fn handoff_extra_is_the_rate_difference() {
        // 1 MB at 3,000 instead of 6,000 GB/s: 333.3 - 166.7 us; 1 MB discarded at 5,000: 200 us.
        let m = one_gpu(Some(3000.0), Some(5000.0));
        let us = m.l2_extra(1_000_000, 1_000_000) as f64 / 1e6;
        assert!((us - (1e6 / 3000e3 - 1e6 / 6000e3 + 1e6 / 5000e3)).abs() < 1e-3, "{us}");
        assert_eq!(one_gpu(None, None).l2_extra(1 << 30, 1 << 30), 0);
        // A ring rate above the L2's is not modelled: no negative work.
        assert_eq!(one_gpu(Some(9000.0), None).l2_extra(1 << 30, 0), 0);
    }

    proptest::proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        /// The extra L2 work grows with the bytes handed over and discarded, and with slower
        /// ring and discard rates.
        #[test]
        fn handoff_extra_is_monotone(
            ring in 0u64..1 << 32, discard in 0u64..1 << 32, more in 0u64..1 << 32,
            r in 100.0f64..20_000.0, d in 100.0f64..20_000.0,
        ) {
            let m = one_gpu(Some(r), Some(d));
            let e = m.l2_extra(ring, discard);
            proptest::prop_assert!(m.l2_extra(ring + more, discard) >= e);
            proptest::prop_assert!(m.l2_extra(ring, discard + more) >= e);
            proptest::prop_assert!(one_gpu(Some(r / 2.0), Some(d / 2.0)).l2_extra(ring, discard) >= e);
        }
    }
}
