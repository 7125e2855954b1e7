//! QP depth and Little's law (issue 3): RDMA throughput rises with NVSHMEM_QP_DEPTH and
//! saturates where depth × message size covers bandwidth × RTT, within 10% of
//! `min(depth × size / RTT, saturated bandwidth)`.

use crate::util::{plan_of_text, repo, run};

fn scenario(depth: u32, bytes: &str) -> String {
    let text =
        std::fs::read_to_string(repo().join("scenarios/qp-depth.toml")).expect("qp-depth.toml");
    text.replace("NVSHMEM_QP_DEPTH = \"128\"", &format!("NVSHMEM_QP_DEPTH = \"{depth}\""))
        .replace("bytes_per_rank = \"16MiB\"", &format!("bytes_per_rank = {bytes}"))
}

#[test]
fn throughput_follows_littles_law() {
    let text = std::fs::read_to_string(repo().join("scenarios/qp-depth.toml")).expect("read");
    let msg: f64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("message_bytes = "))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("message_bytes");
    let bytes_per_rank = 16.0 * 1024.0 * 1024.0;
    // Unloaded round trip: one message, post to completion.
    let one = run(&plan_of_text("rtt", &scenario(128, &format!("{}", msg as u64))));
    let rtt_us = one.jobs[0].ops[0].summary.latency_us.mean;
    let depths = [128u32, 256, 512, 1024, 2048, 4096];
    let mut gbps = Vec::new();
    for &d in &depths {
        let r = run(&plan_of_text(&format!("d{d}"), &scenario(d, "\"16MiB\"")));
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        let lat = r.jobs[0].ops[0].summary.latency_us.mean;
        gbps.push(bytes_per_rank / (lat * 1e3));
    }
    let saturated = gbps[gbps.len() - 1];
    println!(
        "unloaded RTT {rtt_us:.3} us; bandwidth-delay product {:.0} B = {:.0} messages",
        saturated * 1e3 * rtt_us,
        saturated * 1e3 * rtt_us / msg
    );
    for (i, &d) in depths.iter().enumerate() {
        let little = (d as f64 * msg / (rtt_us * 1e3)).min(saturated);
        let err = (gbps[i] - little) / little;
        println!(
            "depth {d:>5}: {:.2} GB/s, Little's law {little:.2} GB/s ({:+.1}%)",
            gbps[i],
            err * 100.0
        );
        assert!(err.abs() <= 0.10, "depth {d}: {:.2} GB/s vs {little:.2}", gbps[i]);
        if i > 0 {
            assert!(gbps[i] >= gbps[i - 1] * 0.99, "throughput never falls with depth");
        }
    }
    assert!(gbps[0] < 0.8 * saturated, "the smallest depth is window-limited");
    assert!((gbps[depths.len() - 2] - saturated).abs() / saturated < 0.02, "large depths saturate");
}
