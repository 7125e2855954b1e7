//! Tests of the `[[fault]]` rules: every kind resolves, every error names its key and position.

use crate::deepep::validate::validate;
use crate::diag::{Diagnostic, Severity};
use crate::fault::{Delay, Fault};
use crate::ids::Rank;

/// The rule tests' EP16 decode with a fixed routing seed (the faults' ranks are drawn from it).
fn ll_ep16() -> String {
    format!("{}seed = 9\n", crate::deepep::validate::tests::LL_EP16)
}

fn check(faults: &str) -> (Vec<Diagnostic>, Option<crate::plan::Plan>) {
    let text = format!("{}{faults}", ll_ep16());
    let loaded = crate::parse("t.toml", &text).unwrap();
    validate(&loaded.scenario, &loaded.source)
}

fn errors(faults: &str) -> Vec<String> {
    check(faults)
        .0
        .into_iter()
        .filter(|d| d.severity == Severity::Error)
        .map(|d| d.to_string())
        .collect()
}

#[test]
fn every_kind_resolves_to_its_typed_fault() {
    let (d, plan) = check(
        r#"
[[fault]]
kind = "straggler"
ranks = "3"
delay_us = 50
[[fault]]
kind = "straggler"
ranks = [1, 2]
delay = { dist = "normal", mean_us = 5, sd_us = 3 }
[[fault]]
kind = "rank_down"
ranks = "5"
at_us = 0
[[fault]]
kind = "nic_down"
node = 1
nic = 0
at_us = 10
duration_us = 100
[[fault]]
kind = "packet_loss"
rate = 1e-4
[[fault]]
kind = "nvlink_degraded"
node = 0
fraction = 0.5
"#,
    );
    assert!(d.iter().all(|d| !d.is_error()), "{d:#?}");
    let faults = plan.expect("a plan").faults;
    assert_eq!(faults.seed, 9);
    assert_eq!(
        faults.items,
        vec![
            Fault::Straggler { ranks: vec![Rank(3)], delay: Delay::Fixed { ns: 50_000 } },
            Fault::Straggler {
                ranks: vec![Rank(1), Rank(2)],
                delay: Delay::Normal { mean_ns: 5_000.0, sd_ns: 3_000.0 }
            },
            Fault::RankDown { ranks: vec![Rank(5)], at_ns: 0 },
            Fault::NicDown { node: 1, nic: 0, at_ns: 10_000, duration_ns: Some(100_000) },
            Fault::PacketLoss { rate: 1e-4 },
            Fault::NvlinkDegraded { node: 0, fraction: 0.5 },
        ]
    );
}

#[test]
fn missing_and_foreign_keys_are_named_with_positions() {
    let e = errors("\n[[fault]]\nkind = \"rank_down\"\nranks = \"5\"\nrate = 0.1\n");
    assert_eq!(e.len(), 2, "{e:#?}");
    assert!(
        e[0].starts_with(
            "t.toml:25:1: error[fault-key]: fault[0].rate: kind = \"rank_down\" does not take rate"
        ),
        "{e:#?}"
    );
    // A missing key points at its entry's [[fault]] header.
    assert!(
        e[1].starts_with(
            "t.toml:22:1: error[fault-key]: fault[0].at_us: kind = \"rank_down\" needs at_us"
        ),
        "{e:#?}"
    );
    let e = errors("\n[[fault]]\nkind = \"straggler\"\nranks = \"3\"\n");
    assert!(e[0].contains("needs delay_us (or delay = "), "{e:#?}");
    let e = errors(
        "\n[[fault]]\nkind = \"straggler\"\nranks = \"3\"\ndelay_us = 1\ndelay = { dist = \"normal\", mean_us = 1, sd_us = 1 }\n",
    );
    assert!(e[0].contains("give delay_us or delay, not both"), "{e:#?}");
}

#[test]
fn ranks_nodes_and_nics_must_exist() {
    let e = errors("\n[[fault]]\nkind = \"rank_down\"\nranks = \"16\"\nat_us = 0\n");
    assert!(
        e[0].contains("fault[0].ranks: rank 16 does not exist: the cluster has 16 ranks (0-15)"),
        "{e:#?}"
    );
    let e = errors("\n[[fault]]\nkind = \"nic_down\"\nnode = 2\nnic = 8\nat_us = 0\n");
    assert!(
        e[0].contains("fault[0].node: node 2 does not exist: the cluster has 2 node(s)"),
        "{e:#?}"
    );
    assert!(e[1].contains("fault[0].nic: NIC 8 does not exist: a node has 8 NIC(s)"), "{e:#?}");
    let e = errors("\n[[fault]]\nkind = \"nvlink_degraded\"\nnode = 5\nfraction = 0.5\n");
    assert!(e[0].contains("node 5 does not exist"), "{e:#?}");
}

#[test]
fn values_must_be_finite_and_in_range() {
    for (fault, key, why) in [
        ("kind = \"packet_loss\"\nrate = 1.0", "rate", "a drop probability in [0, 1)"),
        ("kind = \"packet_loss\"\nrate = -0.1", "rate", "a drop probability in [0, 1)"),
        ("kind = \"packet_loss\"\nrate = nan", "rate", "a drop probability in [0, 1)"),
        ("kind = \"nvlink_degraded\"\nnode = 0\nfraction = 0", "fraction", "in (0, 1]"),
        ("kind = \"nvlink_degraded\"\nnode = 0\nfraction = 1.5", "fraction", "in (0, 1]"),
        ("kind = \"straggler\"\nranks = \"1\"\ndelay_us = inf", "delay_us", "in [0, 1000000]"),
        ("kind = \"straggler\"\nranks = \"1\"\ndelay_us = -1", "delay_us", "in [0, 1000000]"),
        (
            "kind = \"straggler\"\nranks = \"1\"\ndelay = { dist = \"normal\", mean_us = 5, sd_us = -3 }",
            "delay.sd_us",
            "in [0, 1000000]",
        ),
        ("kind = \"rank_down\"\nranks = \"1\"\nat_us = -5", "at_us", "in [0, 1000000000]"),
        (
            "kind = \"nic_down\"\nnode = 0\nnic = 0\nat_us = 0\nduration_us = 0",
            "duration_us",
            "in (0, 1000000000]",
        ),
    ] {
        let e = errors(&format!("\n[[fault]]\n{fault}\n"));
        assert_eq!(e.len(), 1, "{fault}: {e:#?}");
        assert!(
            e[0].contains(&format!("fault[0].{key}: ")) && e[0].contains(why),
            "{fault}: {e:#?}"
        );
    }
}

#[test]
fn one_packet_loss_and_one_degradation_per_node() {
    let e = errors(
        "\n[[fault]]\nkind = \"packet_loss\"\nrate = 0.1\n[[fault]]\nkind = \"packet_loss\"\nrate = 0.2\n",
    );
    assert!(
        e[0].contains("fault[1].kind: fault[0] already sets the fabric's packet loss"),
        "{e:#?}"
    );
    let twice = "\n[[fault]]\nkind = \"nvlink_degraded\"\nnode = 1\nfraction = 0.5\n";
    let e = errors(&format!("{twice}{twice}"));
    assert!(e[0].contains("fault[1].node: an earlier nvlink_degraded fault"), "{e:#?}");
}

#[test]
fn packet_loss_under_adaptive_routing_is_refused() {
    let text =
        ll_ep16().replace("nodes = 2", "nodes = 2\n[cluster.fabric]\nrouting = \"adaptive\"");
    let text = format!("{text}\n[[fault]]\nkind = \"packet_loss\"\nrate = 0.001\n");
    let loaded = crate::parse("t.toml", &text).unwrap();
    let d = validate(&loaded.scenario, &loaded.source).0;
    assert!(d.iter().any(|d| d.rule == "fault-loss-adaptive"), "{d:#?}");
}

#[test]
fn unknown_kinds_and_keys_are_schema_errors() {
    let text = format!("{}\n[[fault]]\nkind = \"meteor\"\n", ll_ep16());
    let e = crate::parse("t.toml", &text).unwrap_err().to_string();
    assert!(e.contains("fault[0].kind"), "{e}");
    let text = format!("{}\n[[fault]]\nkind = \"packet_loss\"\nrat = 0.1\n", ll_ep16());
    let e = crate::parse("t.toml", &text).unwrap_err().to_string();
    assert!(e.contains("rat"), "{e}");
}

#[test]
fn shrink_outside_low_latency_is_advised_against() {
    let text = ll_ep16()
        .replace("low_latency_mode = true", "low_latency_mode = false\nenable_shrink = true")
        .replace(
            "num_rdma_bytes = \"2GiB\"",
            "num_rdma_bytes = \"1GiB\"\nnum_nvl_bytes = \"1GiB\"",
        );
    let loaded = crate::parse("t.toml", &text).unwrap();
    let d = validate(&loaded.scenario, &loaded.source).0;
    assert!(d.iter().any(|d| d.rule == "shrink-ll-only" && !d.is_error()), "{d:#?}");
}
