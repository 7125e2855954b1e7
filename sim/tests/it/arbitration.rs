//! VL arbitration through the fabric (docs/design.md, fabric §1.1): incast flows on two lanes meet
//! at the switch port toward the target; their byte shares follow the arbitration tables. Lane a
//! has two senders and lane b one, so both lanes keep the port's queues backlogged (one NIC alone
//! injects a little below the port's line rate). Each lane gets bytes proportional to its
//! expected share, so with correct arbitration both finish together.

use eptwin_engine::api::{RunResult, Verdict};

use eptwin_engine::testing::ScenarioDraft;

use crate::util::{latency_us, run};

fn incast(
    vlarb_high: &str,
    vlarb_low: &str,
    high_limit: u8,
    a: (u8, &str),
    b: (u8, &str),
) -> RunResult {
    let text = format!(
        r#"
schema = 1
name = "arb"
[cluster]
profile = "h800-cx7"
nodes = 4
gpus_per_node = 1
[cluster.fabric]
topology = "single-switch"
vlarb_high = "{vlarb_high}"
vlarb_low = "{vlarb_low}"
high_limit = {high_limit}

[[job]]
name = "a"
ranks = [0, 1, 2]
[job.env]
NVSHMEM_IB_SL = "{}"
[job.traffic]
pattern = "incast"
incast_target = 0
bytes_per_rank = "{}"
message_bytes = "256KiB"
qps_per_peer = 2
rdma_only = true
warmup = 0
iterations = 1

[[job]]
name = "b"
ranks = [0, 3]
[job.env]
NVSHMEM_IB_SL = "{}"
[job.traffic]
pattern = "incast"
incast_target = 0
bytes_per_rank = "{}"
message_bytes = "256KiB"
qps_per_peer = 2
rdma_only = true
warmup = 0
iterations = 1
"#,
        a.0, a.1, b.0, b.1
    );
    run(&ScenarioDraft::from_text("arb", &text).plan())
}

fn finish_ratio(r: &RunResult) -> f64 {
    latency_us(r, "a", "transfer") / latency_us(r, "b", "transfer")
}

#[test]
fn low_table_byte_shares_follow_weights() {
    // SL n -> VL n (default sl2vl). Weights 64:192 => shares 1:3; bytes 2 x 32 : 192 MiB.
    let r = incast("0:4", "1:64,2:192", 0, (1, "32MiB"), (2, "192MiB"));
    assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
    let ratio = finish_ratio(&r);
    println!("weights 64:192, bytes 1:3: finish-time ratio {ratio:.4}");
    assert!((ratio - 1.0).abs() <= 0.02, "{ratio}");
    // Equal weights, bytes 1:1.
    let r = incast("0:4", "1:128,2:128", 0, (1, "48MiB"), (2, "96MiB"));
    assert!((finish_ratio(&r) - 1.0).abs() <= 0.02, "{}", finish_ratio(&r));
}

#[test]
fn high_limit_zero_six_and_unbounded() {
    // VL1 high, VL2 low. limit 0: one high packet, then one low => 1:1.
    let r = incast("1:255", "2:64", 0, (1, "48MiB"), (2, "96MiB"));
    assert!((finish_ratio(&r) - 1.0).abs() <= 0.02, "limit 0: {}", finish_ratio(&r));
    // limit 6: 24 KiB of high (6 MTU packets) per low packet => 6:1.
    let r = incast("1:255", "2:64", 6, (1, "96MiB"), (2, "32MiB"));
    println!("limit 6, bytes 6:1: finish-time ratio {:.4}", finish_ratio(&r));
    assert!((finish_ratio(&r) - 1.0).abs() <= 0.02, "limit 6: {}", finish_ratio(&r));
    // 255: the low lane only gets the port once the high lane is done.
    let r = incast("1:255", "2:64", 255, (1, "16MiB"), (2, "4MiB"));
    let (a, b) = (latency_us(&r, "a", "transfer"), latency_us(&r, "b", "transfer"));
    println!("limit 255: high done at {a:.0} us, low at {b:.0} us");
    assert!(b > a, "low lane finished before the high lane under limit 255");
}

#[test]
fn starved_lane_is_detected() {
    // 255 with the high lane backlogged for several ms: the low lane starves, which fails the run.
    let r = incast("1:255", "2:64", 255, (1, "128MiB"), (2, "4MiB"));
    assert_eq!(r.verdict, Verdict::Failed);
    assert!(
        r.failures.iter().any(|f| f.contains("VL2 starved")),
        "no starvation reported: {:?}",
        r.failures
    );
}
