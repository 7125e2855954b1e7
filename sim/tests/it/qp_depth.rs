//! QP depth and Little's law (issue 3): RDMA throughput rises with NVSHMEM_QP_DEPTH and
//! saturates where depth × message size covers bandwidth × RTT, within 10% of
//! `min(depth × size / RTT, saturated bandwidth)`.

use eptwin_engine::testing::ScenarioDraft;
use toml::Value;

use crate::util::run;

/// The bundled QP-depth scenario at `depth` moving `bytes_per_rank`.
fn scenario(depth: u32, bytes_per_rank: Value) -> ScenarioDraft {
    ScenarioDraft::bundled("qp-depth")
        .set("job[stream].env.NVSHMEM_QP_DEPTH", depth.to_string())
        .set("job[stream].traffic.bytes_per_rank", bytes_per_rank)
}

#[test]
fn throughput_follows_littles_law() {
    let msg = ScenarioDraft::bundled("qp-depth")
        .get("job[stream].traffic.message_bytes")
        .and_then(Value::as_integer)
        .expect("message_bytes") as f64;
    let bytes_per_rank = 16.0 * 1024.0 * 1024.0;
    // Unloaded round trip: one message, post to completion.
    let one = run(&scenario(128, Value::Integer(msg as i64)).plan());
    let rtt_us = one.jobs[0].ops[0].summary.latency_us.mean;
    let depths = [128u32, 256, 512, 1024, 2048, 4096];
    let mut gbps = Vec::new();
    for &d in &depths {
        let r = run(&scenario(d, "16MiB".into()).plan());
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
