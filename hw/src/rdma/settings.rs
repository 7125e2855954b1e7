//! The QP settings a scenario asks for, taken from its `Plan` exactly as NVSHMEM would take
//! them from the job's environment (docs/design.md, fabric §6): `NVSHMEM_IB_SL`,
//! `NVSHMEM_IB_TRAFFIC_CLASS`, `NVSHMEM_QP_DEPTH`, `NVSHMEM_IB_GID_INDEX`, the fabric MTU and
//! `num_qps_per_rank`.

use eptwin_engine::{JobPlan, Plan};

use super::types::{LinkLayer, mtu_code};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpSettings {
    /// `NVSHMEM_IB_SL`: the address-vector SL on InfiniBand; on RoCE the Ethernet priority.
    pub sl: u8,
    /// `NVSHMEM_IB_TRAFFIC_CLASS` when the job sets it. Unset on RoCE, the SL is carried as
    /// the DSCP class selector (see [`QpSettings::traffic_class_for`]).
    pub traffic_class: Option<u8>,
    /// `NVSHMEM_QP_DEPTH` as NVSHMEM applies it: the most send work requests in flight per QP
    /// (`max_send_wr`); the layer above refuses to post beyond it.
    pub depth: u32,
    /// Receive work requests per QP (consumed by WRITE_WITH_IMM).
    pub recv_depth: u32,
    /// Path MTU in bytes (the scenario's `cluster.fabric.mtu`).
    pub path_mtu_bytes: u32,
    /// `num_qps_per_rank`: RC QPs per peer.
    pub qps_per_peer: u32,
    /// `NVSHMEM_IB_GID_INDEX` (RoCE); `None` picks a RoCE v2 IPv4-mapped GID like NVSHMEM's
    /// auto-selection.
    pub gid_index: Option<u32>,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout (verbs `ibv_modify_qp`). 14 ≈ 67 ms,
    /// generous enough for Soft-RoCE under software emulation.
    pub ack_timeout: u8,
    /// Transport retries before `RETRY_EXC_ERR` (3-bit field, 7 = the maximum).
    pub retry_count: u8,
    /// RNR retries; 7 = retry forever (a WRITE_WITH_IMM waits for its receive to be posted).
    pub rnr_retry: u8,
    /// Outstanding RDMA reads/atomics per QP, capped by the device's `max_qp_init_rd_atom`.
    pub max_rd_atomic: u8,
}

impl Default for QpSettings {
    /// NVSHMEM's defaults (docs/design.md, fabric §6): SL 0, depth 1024, one QP per peer; MTU 4096.
    fn default() -> Self {
        QpSettings {
            sl: 0,
            traffic_class: None,
            depth: eptwin_engine::deepep::env::DEFAULT_QP_DEPTH,
            recv_depth: 128,
            path_mtu_bytes: 4096,
            qps_per_peer: 1,
            gid_index: None,
            ack_timeout: 14,
            retry_count: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
        }
    }
}

impl QpSettings {
    /// The settings one job's QPs are created with.
    pub fn for_job(plan: &Plan, job: &JobPlan) -> Self {
        QpSettings {
            sl: job.nvshmem.ib_sl,
            traffic_class: job.nvshmem.traffic_class,
            depth: job.nvshmem.qp_depth,
            path_mtu_bytes: plan.qos.mtu,
            qps_per_peer: job.qps_per_peer(),
            gid_index: job.nvshmem.gid_index,
            ..QpSettings::default()
        }
    }

    /// The GRH traffic class a QP on `link` is created with. InfiniBand: the explicit value or
    /// 0 (LID-routed QPs carry no GRH; the SL selects the VL). RoCE: the explicit value, or the
    /// SL as DSCP class selector CS<sl> (DSCP = 8·sl, TC = DSCP << 2), which switches trusting
    /// DSCP map to priority `sl` — RFC 4594 class selectors; mlx5's default dscp2prio maps DSCP
    /// 8n..8n+7 to priority n (`mlnx_qos --trust dscp`).
    pub fn traffic_class_for(&self, link: LinkLayer) -> u8 {
        match (self.traffic_class, link.is_roce()) {
            (Some(tc), _) => tc,
            (None, true) => (self.sl & 0x7) << 5,
            (None, false) => 0,
        }
    }

    /// Reject settings no device can honour, naming the offending value. The SL is the plan's,
    /// whose range validation checked (0..=15; 0..=7 on RoCE).
    pub fn check(&self) -> Result<(), String> {
        if self.depth == 0 {
            return Err("QP depth 0: a QP needs at least one send work request".into());
        }
        if mtu_code(self.path_mtu_bytes).is_none() {
            return Err(format!(
                "path MTU {} bytes: RDMA MTUs are 256, 512, 1024, 2048 or 4096",
                self.path_mtu_bytes
            ));
        }
        if self.qps_per_peer == 0 {
            return Err("0 QPs per peer".into());
        }
        if self.retry_count > 7 || self.rnr_retry > 7 {
            return Err("retry counts are 3-bit fields (0..=7)".into());
        }
        if self.ack_timeout > 31 {
            return Err("the ACK timeout exponent is a 5-bit field (0..=31)".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(text: &str) -> Plan {
        let loaded = eptwin_engine::parse("test.toml", text).unwrap();
        Plan::build(&loaded).unwrap()
    }

    #[test]
    fn roce_scenario_maps_sl_to_priority_class_selector() {
        let p = plan(include_str!("../../../scenarios/roce-ep16-ll.toml"));
        let s = QpSettings::for_job(&p, &p.jobs[0]);
        assert_eq!(s.sl, 3);
        assert_eq!(s.traffic_class, None);
        assert_eq!(s.qps_per_peer, 18);
        assert_eq!(s.depth, 1024);
        assert_eq!(s.path_mtu_bytes, p.qos.mtu);
        // DSCP 24 (CS3) = TC 96; the SL never leaks into the ECN bits.
        assert_eq!(s.traffic_class_for(LinkLayer::Ethernet), 96);
        assert_eq!(s.traffic_class_for(LinkLayer::Ethernet) & 0x3, 0);
        assert_eq!(s.traffic_class_for(LinkLayer::Infiniband), 0);
        s.check().unwrap();
    }

    #[test]
    fn explicit_traffic_class_and_depth_win() {
        let text = include_str!("../../../scenarios/roce-ep16-ll.toml").replace(
            "NVSHMEM_IB_SL = \"3\"",
            "NVSHMEM_IB_SL = \"3\"\nNVSHMEM_IB_TRAFFIC_CLASS = \"106\"\nNVSHMEM_QP_DEPTH = \"3000\"\nNVSHMEM_IB_GID_INDEX = \"3\"",
        );
        let p = plan(&text);
        let s = QpSettings::for_job(&p, &p.jobs[0]);
        assert_eq!(s.traffic_class, Some(106));
        assert_eq!(s.traffic_class_for(LinkLayer::Ethernet), 106);
        // NVSHMEM rounds the depth up to a power of two.
        assert_eq!(s.depth, 4096);
        assert_eq!(s.gid_index, Some(3));
    }

    #[test]
    fn check_names_the_bad_value() {
        let bad = QpSettings { path_mtu_bytes: 1500, ..QpSettings::default() };
        assert!(bad.check().unwrap_err().contains("1500"));
        let bad = QpSettings { depth: 0, ..QpSettings::default() };
        assert!(bad.check().is_err());
    }

    proptest::proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        #[test]
        fn roce_traffic_class_encodes_the_priority(sl in 0u8..=7) {
            let s = QpSettings { sl, ..QpSettings::default() };
            let tc = s.traffic_class_for(LinkLayer::Ethernet);
            // DSCP = TC >> 2; the default dscp2prio gives priority DSCP >> 3.
            proptest::prop_assert_eq!((tc >> 2) >> 3, sl);
        }
    }
}
