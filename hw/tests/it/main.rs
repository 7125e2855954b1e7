//! GPU tests of the hardware backend: the conformance suite's hardware arm (`conformance.rs`)
//! and small normal and low-latency jobs run end to end through `HwTransport` and the engine's
//! run loop, every check passing. They need a GPU: ignored elsewhere, run with `--ignored` on
//! the GPU machine (scripts/gpu-hw-redesign.sh), where a missing GPU fails them.

mod conformance;

use eptwin_engine::api::Transport;
use eptwin_engine::api::{Provenance, Verdict};
use eptwin_hw::{HwOptions, HwTransport};

fn scenario(name: &str, ranks_note: &str, buffer: &str, workload: &str) -> String {
    format!(
        "schema = 1\nname = \"{name}\"\ndescription = \"hw conformance: {ranks_note}\"\n\
         [cluster]\nprofile = \"h200-single\"\n\
         [[job]]\nname = \"ep\"\n[job.buffer]\n{buffer}\n[job.workload]\n{workload}\n"
    )
}

/// Run a scenario on the GPU (a missing GPU fails the test: it runs only with `--ignored`).
fn run(text: &str) -> eptwin_engine::api::RunResult {
    let loaded = eptwin_engine::parse("conformance.toml", text).expect("scenario parses");
    let plan = eptwin_engine::Plan::build(&loaded).expect("scenario is valid");
    let mut hw = HwTransport::new(HwOptions { kernel_timeout_ms: 5_000, ..HwOptions::from_env() });
    if let Some(reason) = hw.capabilities().unavailable {
        panic!("the hardware backend is unavailable: {reason}");
    }
    eptwin_engine::api::run(&plan, &mut hw, Provenance::default()).expect("run completes")
}

fn assert_ok(result: &eptwin_engine::api::RunResult) {
    assert_eq!(
        result.verdict,
        Verdict::Ok,
        "failures: {:#?}\nwaived: {:?}",
        result.failures,
        result.waived_reason
    );
    for job in &result.jobs {
        for op in &job.ops {
            assert!(op.summary.latency_us.mean > 0.0, "{} has a time", op.op);
            assert!(!op.summary.checks.is_empty(), "{} ran checks", op.op);
        }
    }
    assert!(result.measurements.contains_key("probe.memcpy_dtod_bw_gbps"));
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine (scripts/gpu-hw-redesign.sh)"]
fn normal_ep8_on_one_gpu() {
    let text = scenario(
        "conf-normal-ep8",
        "8 ranks, normal",
        "num_nvl_bytes = \"1GiB\"\nnum_sms = 24",
        "tokens_per_rank = 200\nhidden = 2048\ntopk = 8\nexperts = 64\nwarmup = 1\niterations = 3",
    );
    let r = run(&text);
    assert_ok(&r);
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine (scripts/gpu-hw-redesign.sh)"]
fn normal_ep2_bf16() {
    let text = scenario(
        "conf-normal-ep2",
        "2 ranks, normal, BF16 dispatch",
        "num_nvl_bytes = \"1GiB\"\nnum_sms = 8",
        "tokens_per_rank = 300\nhidden = 2048\ntopk = 4\nexperts = 16\ndispatch_dtype = \"bf16\"\n\
         warmup = 1\niterations = 2",
    );
    let r = run(&text);
    assert_ok(&r);
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine (scripts/gpu-hw-redesign.sh)"]
fn low_latency_ep8_with_masked_selections() {
    let text = scenario(
        "conf-ll-ep8",
        "8 ranks, low-latency",
        "low_latency_mode = true\nnum_rdma_bytes = \"1GiB\"\nnum_qps_per_rank = 8",
        "tokens_per_rank = 64\nhidden = 2048\ntopk = 8\nexperts = 64\nmasked_selections = 10\n\
         warmup = 1\niterations = 3",
    );
    let r = run(&text);
    assert_ok(&r);
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine (scripts/gpu-hw-redesign.sh)"]
fn low_latency_ep8_hook_mode() {
    let text = scenario(
        "conf-ll-ep8-hook",
        "8 ranks (h200-single's ranks_per_gpu), low-latency, hook mode",
        "low_latency_mode = true\nnum_rdma_bytes = \"1GiB\"\nnum_qps_per_rank = 8",
        "tokens_per_rank = 48\nhidden = 2048\ntopk = 6\nexperts = 32\nhook = true\nwarmup = 1\niterations = 2",
    );
    let r = run(&text);
    assert_ok(&r);
    let phases = &r.jobs[0].ops[0].summary.phases_us;
    assert!(phases.contains_key("send") && phases.contains_key("recv"), "{phases:?}");
}

/// A scenario of two "nodes" on the one GPU (`ranks_per_node` ranks each).
fn two_nodes(name: &str, ranks_per_node: u32, buffer: &str, workload: &str) -> String {
    format!(
        "schema = 1\nname = \"{name}\"\ndescription = \"hw conformance: two nodes over the wire\"\n\
         [cluster]\nprofile = \"h200-single\"\nnodes = 2\ngpus_per_node = 1\n\
         ranks_per_gpu = {ranks_per_node}\n\
         [[job]]\nname = \"ep\"\n[job.buffer]\n{buffer}\n[job.workload]\n{workload}\n"
    )
}

/// Run `text` with the TCP wire (a missing GPU fails the test: it runs only with `--ignored`).
fn run_over_tcp(text: &str) -> eptwin_engine::api::RunResult {
    let loaded = eptwin_engine::parse("conformance.toml", text).expect("scenario parses");
    let plan = eptwin_engine::Plan::build(&loaded).expect("scenario is valid");
    let options = HwOptions {
        kernel_timeout_ms: 5_000,
        wire: Ok(eptwin_wire::WireRequest::Tcp),
        ..HwOptions::from_env()
    };
    let mut hw = HwTransport::new(options);
    if let Some(reason) = hw.capabilities().unavailable {
        panic!("the hardware backend is unavailable: {reason}");
    }
    eptwin_engine::api::run(&plan, &mut hw, Provenance::default()).expect("run completes")
}

/// The verdict and what every op ran (the copy probes are not asked for: `EPTWIN_PROBES=0`
/// keeps these runs short).
fn assert_over_tcp(r: &eptwin_engine::api::RunResult) {
    assert_eq!(
        r.verdict,
        Verdict::Ok,
        "failures: {:#?}\nwaived: {:?}",
        r.failures,
        r.waived_reason
    );
    for op in &r.jobs[0].ops {
        assert!(op.summary.latency_us.mean > 0.0, "{} has a time", op.op);
        assert!(!op.summary.checks.is_empty(), "{} ran checks", op.op);
    }
    assert_eq!(r.backend["wire"], "tcp", "{:?}", r.backend);
    assert_eq!(r.backend["wire_report"]["data_path"], "staged");
    for op in &r.jobs[0].ops {
        assert!(op.summary.rdma_bytes > 0, "{} crossed the wire", op.op);
    }
}

/// internode.cu over the CPU proxy and TCP on loopback: 16 ranks as 2 nodes x 8.
#[test]
#[ignore = "needs a GPU and minutes of it: scripts/gpu-hw-redesign.sh runs it with --ignored"]
fn internode_normal_two_nodes_over_tcp() {
    let text = two_nodes(
        "conf-internode-ep16",
        8,
        "num_nvl_bytes = \"1GiB\"\nnum_rdma_bytes = \"1GiB\"\nnum_qps_per_rank = 4\nnum_sms = 4\n\
         [job.buffer.dispatch_config]\nnum_max_nvl_chunked_send_tokens = 4\n\
         num_max_nvl_chunked_recv_tokens = 32\nnum_max_rdma_chunked_send_tokens = 4\n\
         num_max_rdma_chunked_recv_tokens = 16\n[job.buffer.combine_config]\n\
         num_max_nvl_chunked_send_tokens = 4\nnum_max_nvl_chunked_recv_tokens = 32\n\
         num_max_rdma_chunked_send_tokens = 4\nnum_max_rdma_chunked_recv_tokens = 16",
        "tokens_per_rank = 64\nhidden = 2048\ntopk = 8\nexperts = 64\nrouting = \"node-limited\"\n\
         topk_groups = 2\nwarmup = 1\niterations = 2",
    );
    let r = run_over_tcp(&text);
    assert_over_tcp(&r);
}

/// low_latency.cu with the other node's ranks behind the wire: 8 ranks as 2 nodes x 4, hook
/// mode (send and receive launched apart).
#[test]
#[ignore = "needs a GPU and minutes of it: scripts/gpu-hw-redesign.sh runs it with --ignored"]
fn internode_low_latency_two_nodes_over_tcp() {
    let text = two_nodes(
        "conf-internode-ll-ep8",
        4,
        "low_latency_mode = true\nnum_rdma_bytes = \"1GiB\"\nnum_qps_per_rank = 8",
        "tokens_per_rank = 48\nhidden = 2048\ntopk = 8\nexperts = 64\nmasked_selections = 4\n\
         hook = true\nwarmup = 1\niterations = 2",
    );
    let r = run_over_tcp(&text);
    assert_over_tcp(&r);
}

/// `allow_nvlink_for_low_latency_mode = false` (DeepEP writes `NVSHMEM_DISABLE_P2P=1`) on one
/// GPU: every message between two ranks crosses the wire (TCP here), one rank per block of the
/// wire, and none is an NVLink or device-local store; only a rank's messages to its own experts
/// stay local, as NVSHMEM's pointer to itself. The byte counts are the routing's, split that way.
#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine (scripts/gpu-hw-redesign.sh)"]
fn low_latency_without_nvlink_sends_every_peer_message_over_the_wire() {
    use eptwin_engine::api::{Dtype, ll_combine_msg_bytes, ll_dispatch_msg_bytes};
    let text = scenario(
        "conf-ll-ep8-no-p2p",
        "8 ranks (h200-single's ranks_per_gpu), low-latency, NVLink off",
        "low_latency_mode = true\nnum_rdma_bytes = \"1GiB\"\nnum_qps_per_rank = 8\n\
         allow_nvlink_for_low_latency_mode = false",
        "tokens_per_rank = 48\nhidden = 2048\ntopk = 6\nexperts = 32\nmasked_selections = 4\n\
         warmup = 1\niterations = 2",
    );
    let plan = eptwin_engine::Plan::build(&eptwin_engine::parse("no-p2p.toml", &text).unwrap())
        .expect("scenario is valid");
    let routing = plan.jobs[0].deepep().unwrap().routing();
    let (mut own, mut other) = (0u64, 0u64);
    for src in 0..routing.num_ranks {
        for t in 0..routing.tokens_per_rank {
            for &e in routing.experts(src, t).iter().filter(|&&e| e >= 0) {
                match routing.rank_of_expert(e as u32) == src {
                    true => own += 1,
                    false => other += 1,
                }
            }
        }
    }
    assert!(other > 0 && own > 0, "the routing has both kinds of messages");
    let r = run_over_tcp(&text);
    assert_over_tcp(&r);
    let peers = u64::from(routing.num_ranks - 1);
    assert_eq!(r.backend["wire_report"]["peers"], peers, "each rank is its own block of the wire");
    let ops = &r.jobs[0].ops;
    let msg = [ll_dispatch_msg_bytes(2048, Dtype::Fp8), ll_combine_msg_bytes(2048, Dtype::Bf16)];
    for (op, msg) in ops.iter().zip(msg) {
        assert_eq!(op.summary.rdma_bytes, other * msg, "{}: every peer message on the wire", op.op);
        assert_eq!(op.summary.nvlink_bytes, own * msg, "{}: only own messages local", op.op);
    }
}
