//! The internode protocol over the verbs wire between two OS processes, with host memory
//! standing in for the GPU buffers. Like `rdma.rs`: `#[ignore]`d in a `--features rdma` build
//! (it needs an RDMA device); `scripts/rdma-vm-test` runs it with `--include-ignored` inside a
//! QEMU VM with Soft-RoCE (`rxe0`), and the node processes it starts (`support::spawn_nodes`)
//! pass `--include-ignored` on. Where no device opens it fails naming why.
//!
//! The QPs are created from the fixture scenario's jobs (`QpSettings::for_job`: SL, depth,
//! `num_qps_per_rank`, MTU, all set to non-default values there) and read back with
//! `ibv_query_qp`: every node checks that what the device holds is what the scenario says,
//! then runs the host reference, checking every token and row; the parent checks both nodes'
//! totals against the routing.

mod support;

#[cfg(not(feature = "rdma"))]
#[test]
fn without_the_feature_no_verbs_wire_is_chosen() {
    let err = eptwin_wire::choose(eptwin_wire::WireRequest::Verbs).expect_err("no verbs here");
    assert!(err.to_string().contains("--features rdma"), "{err}");
    let auto = eptwin_wire::choose(eptwin_wire::WireRequest::Auto).expect("TCP always runs");
    assert_eq!(auto.kind, eptwin_wire::WireKind::Tcp, "{}", auto.reason);
}

#[cfg(feature = "rdma")]
mod with_rdma {
    use std::time::Duration;

    use eptwin_engine::api::NvshmemSettings;

    use eptwin_wire::protocol::{QpTable, Traffic};
    use eptwin_wire::rdma::{Nic, QpSettings, QpState};

    use std::io::Write as _;

    use super::support::{
        Exchange, NodeOutcome, WireSetup, child_role, geometry, plan, routing, run_node,
    };

    const CALLS: u32 = 2;
    /// Soft-RoCE under TCG emulation is slow: generous bounds.
    const NODE_TIMEOUT: Duration = Duration::from_secs(300);
    const PROCESS_LIMIT: Duration = Duration::from_secs(900);

    /// The test fails naming why no RDMA device opens here.
    fn require_nic(test: &str) {
        if let Err(e) = Nic::open_default(std::env::var("EPTWIN_RDMA_DEVICE").ok().as_deref()) {
            panic!("{test} needs an RDMA device: {e}");
        }
    }

    /// The job's QP settings, with the path MTU capped by the port (Soft-RoCE derives its
    /// active MTU from the netdev's).
    fn settings(nic: &Nic, job: usize) -> QpSettings {
        let plan = plan();
        let mut s = QpSettings::for_job(&plan, &plan.jobs[job]);
        s.path_mtu_bytes = s.path_mtu_bytes.min(nic.port().active_mtu_bytes);
        s
    }

    /// What the device read back must say: the scenario's SL (as the traffic class's DSCP
    /// class selector on RoCE, where Soft-RoCE does not keep the address-vector SL), depth,
    /// QPs per peer, MTU.
    fn check_qps(nic: &Nic, job: usize, out: &NodeOutcome, node: u32) -> String {
        let plan = plan();
        let j = &plan.jobs[job];
        let (g, traffic) = geometry(&plan, j);
        let s = settings(nic, job);
        let d = j.deepep().unwrap();
        // The fixture's values are not NVSHMEM's defaults, so reaching the QPs is visible.
        assert_eq!(s.sl, j.nvshmem.ib_sl);
        assert_ne!(s.sl, 0, "fixture SL must not be the default");
        assert_eq!(s.depth, j.nvshmem.qp_depth);
        assert_ne!(
            s.depth,
            NvshmemSettings::default().qp_depth,
            "fixture depth must not be the default"
        );
        assert_eq!(s.qps_per_peer, d.buffer.num_qps_per_rank);
        assert_ne!(s.qps_per_peer, 24, "fixture QP count must not be DeepEP's default");
        let table = QpTable::new(traffic, &g, node);
        assert_eq!(out.qps.len() as u32, table.len(), "one QP per table entry");
        let pairs = match traffic {
            Traffic::Normal => g.ranks_per_node,
            Traffic::LowLatency => g.ranks_per_node * g.ranks_per_node,
        };
        assert_eq!(table.per_process(), pairs * s.qps_per_peer, "num_qps_per_rank per pair");
        let link = nic.port().link_layer;
        for a in &out.qps {
            assert_eq!(a.state, QpState::ReadyToSend, "{a:?}");
            assert_eq!(a.path_mtu_bytes, s.path_mtu_bytes, "{a:?}");
            assert!(
                a.max_send_wr >= s.depth,
                "device granted {} < depth {}",
                a.max_send_wr,
                s.depth
            );
            assert_ne!(a.dest_qp_num, 0, "{a:?}");
            if link.is_roce() {
                assert_eq!(a.traffic_class, s.traffic_class_for(link), "{a:?}");
                assert_eq!((a.traffic_class >> 2) >> 3, s.sl, "DSCP class selector = SL");
                if !nic.device().name.starts_with("rxe") {
                    assert_eq!(a.sl, s.sl, "{a:?}");
                }
            } else {
                assert_eq!(a.sl, s.sl, "{a:?}");
            }
        }
        let r = &out.report;
        assert_eq!(r.qp_depth, Some(s.depth));
        assert_eq!(r.qps_per_peer, s.qps_per_peer);
        assert_eq!(r.mtu_bytes, Some(s.path_mtu_bytes));
        let a = &out.qps[0];
        format!(
            "EPTWIN_QP_CHECK node={node} job={} qps={} per_pair={} sl={} tc={} depth={} \
             max_send_wr={} mtu={} device={:?}",
            j.name,
            out.qps.len(),
            s.qps_per_peer,
            s.sl,
            a.traffic_class,
            s.depth,
            a.max_send_wr,
            a.path_mtu_bytes,
            r.device
        )
    }

    fn node_main(job: usize) -> bool {
        let Some((node, dir)) = child_role() else { return false };
        let plan = plan();
        let j = &plan.jobs[job];
        let (g, traffic) = geometry(&plan, j);
        let nic = Nic::open_default(std::env::var("EPTWIN_RDMA_DEVICE").ok().as_deref())
            .expect("the parent found a device");
        let settings = settings(&nic, job);
        let ex = Exchange { dir, node, nodes: g.num_nodes(), timeout: NODE_TIMEOUT };
        let wire = WireSetup::Verbs { nic: nic.clone(), settings };
        match run_node(&ex, traffic, &g, routing(j), wire, CALLS, NODE_TIMEOUT, || {}) {
            Ok(out) => {
                let check = check_qps(&nic, job, &out, node);
                let _ = writeln!(std::io::stderr(), "{check}\n{}", out.line(node));
            }
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "EPTWIN_NODE_FAILED node={node}\n{e}");
                std::process::exit(3);
            }
        }
        true
    }

    fn two_processes(test: &str, job: usize) {
        require_nic(test);
        let run = super::support::two_processes(test, job, "verbs", CALLS, PROCESS_LIMIT);
        for log in &run.logs {
            assert!(log.contains("EPTWIN_QP_CHECK"), "{log}");
            // libtest may have printed "test name ... " on the same line first.
            for line in log.lines().filter_map(|l| l.find("EPTWIN_QP_CHECK").map(|at| &l[at..])) {
                let _ = writeln!(std::io::stderr(), "    {line}");
            }
        }
        let line = run.summary(test, CALLS, "RDMA writes", "atomics");
        let _ = writeln!(std::io::stderr(), "    {line}");
    }

    #[test]
    #[ignore = "needs an RDMA device: scripts/rdma-vm-test runs it with --include-ignored"]
    fn normal_internode_over_verbs_between_two_processes() {
        if node_main(0) {
            return;
        }
        two_processes("with_rdma::normal_internode_over_verbs_between_two_processes", 0);
    }

    #[test]
    #[ignore = "needs an RDMA device: scripts/rdma-vm-test runs it with --include-ignored"]
    fn low_latency_over_verbs_between_two_processes() {
        if node_main(1) {
            return;
        }
        two_processes("with_rdma::low_latency_over_verbs_between_two_processes", 1);
    }
}
