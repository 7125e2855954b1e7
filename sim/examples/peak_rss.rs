//! Peak memory of a 1,024-GPU packet-level run: low-latency dispatch + combine at EP1024
//! (128 nodes × 8 H800, 128 tokens, 1,024 experts) on the rail-optimized fat tree. Prints the
//! events handled and the process's peak resident set (VmHWM from /proc/self/status).
//!
//! `cargo run --release -p eptwin-sim --example peak_rss`

use eptwin_engine::Plan;
use eptwin_engine::api::JobId;
use eptwin_engine::api::OpKind;
use eptwin_engine::api::{OpSpec, Transport};
use eptwin_sim::{SimOptions, Simulator};

const SCENARIO: &str = r#"schema = 1
name = "ep1024-ll"
[cluster]
profile = "h800-cx7"
nodes = 128
[[job]]
name = "decode"
[job.buffer]
low_latency_mode = true
num_rdma_bytes = "8GiB"
num_qps_per_rank = 1
[job.workload]
tokens_per_rank = 128
hidden = 7168
topk = 8
experts = 1024
masked_selections = 10
warmup = 0
iterations = 1
"#;

fn vm(field: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).map(|l| l.trim().to_string()))
        .unwrap_or_else(|| format!("{field} unavailable"))
}

fn main() {
    let loaded = eptwin_engine::parse("ep1024-ll", SCENARIO).expect("parse");
    let plan = Plan::build(&loaded).expect("plan");
    println!("GPUs: {}, ranks: {}", plan.topology.num_gpus(), plan.topology.num_ranks());
    let mut sim = Simulator::new(SimOptions::default());
    sim.prepare(&plan).expect("prepare");
    for op in [OpKind::Dispatch, OpKind::Combine] {
        let out = sim
            .execute(&OpSpec::Op { job: JobId(0), op, iteration: 0, warmup: false })
            .expect("execute");
        let s = &out.samples[0];
        println!(
            "{op}: {:.1} us, {:.1} MB over RDMA, failures {}",
            s.latency_ns / 1e3,
            s.rdma_bytes as f64 / 1e6,
            s.failures.len()
        );
    }
    println!("events: {}", sim.events);
    println!("{}", vm("VmHWM"));
}
