//! The numeric limits on hostile scenarios: each is reported at its key before anything it
//! bounds is allocated or computed.

use crate::deepep::validate::validate;
use crate::scenario::parse;

const BASE: &str = r#"
schema = 1
name = "limits"
[cluster]
profile = "h800-cx7"
nodes = 1
[[job]]
name = "train"
[job.buffer]
num_nvl_bytes = "1GiB"
num_qps_per_rank = 1
[job.workload]
tokens_per_rank = 128
hidden = 7168
topk = 8
experts = 256
warmup = 1
iterations = 2
"#;

const TRAFFIC: &str = r#"
schema = 1
name = "traffic"
[cluster]
profile = "h800-cx7"
nodes = 2
[[job]]
name = "bulk"
ranks = "0,8"
[job.traffic]
pattern = "all-to-all"
bytes_per_rank = "1MiB"
message_bytes = "64KiB"
warmup = 0
iterations = 2
"#;

/// Validate `base` with `old` replaced by `new`: the error lines.
fn errors(base: &str, old: &str, new: &str) -> Vec<String> {
    assert!(base.contains(old), "{old}");
    let loaded = parse("l.toml", &base.replacen(old, new, 1)).expect("parses");
    let (diagnostics, _) = validate(&loaded.scenario, &loaded.source);
    diagnostics.iter().filter(|d| d.is_error()).map(|d| d.to_string()).collect()
}

fn has(found: &[String], expected: &str) {
    assert!(found.iter().any(|f| f.contains(expected)), "{expected:?} not in {found:#?}");
}

#[test]
fn the_bases_are_valid() {
    assert_eq!(errors(BASE, "name", "name"), Vec::<String>::new());
    assert_eq!(errors(TRAFFIC, "name", "name"), Vec::<String>::new());
}

#[test]
fn iteration_and_warmup_limits() {
    for (old, new, expected) in [
        (
            "iterations = 2",
            "iterations = 4294967295",
            "job[0].workload.iterations: iterations = 4294967295: at most 100000",
        ),
        ("iterations = 2", "iterations = 100001", "iterations = 100001: at most 100000"),
        (
            "warmup = 1",
            "warmup = 4294967295",
            "job[0].workload.warmup: warmup = 4294967295: at most 10000",
        ),
        ("warmup = 1", "warmup = 1000000000", "warmup = 1000000000: at most 10000"),
    ] {
        has(&errors(BASE, old, new), expected);
    }
    has(
        &errors(TRAFFIC, "iterations = 2", "iterations = 4294967295"),
        "job[0].traffic.iterations: iterations = 4294967295",
    );
    has(
        &errors(TRAFFIC, "warmup = 0", "warmup = 4294967295"),
        "job[0].traffic.warmup: warmup = 4294967295",
    );
    assert_eq!(errors(BASE, "iterations = 2", "iterations = 100000"), Vec::<String>::new());
    let ops = format!("ops = [{}]\niterations = 2", vec!["\"dispatch\""; 65].join(", "));
    has(&errors(BASE, "iterations = 2", &ops), "65 ops per round: at most 64");
    // Two jobs of 100,000 iterations × 2 ops: 400,000 samples.
    let two = format!(
        "{}\n[[job]]\nname = \"second\"\n[job.buffer]\nnum_nvl_bytes = \"1GiB\"\n[job.workload]\ntokens_per_rank = 1\nhidden = 7168\ntopk = 1\nexperts = 8\niterations = 100000\n",
        BASE.replace("iterations = 2", "iterations = 100000")
    );
    has(
        &errors(&two, "name", "name"),
        "job[0].workload.iterations: the jobs record 400000 samples",
    );
}

#[test]
fn size_limits_are_checked_before_anything_is_allocated() {
    has(
        &errors(BASE, "tokens_per_rank = 128", "tokens_per_rank = 4294967295"),
        "job[0].workload.tokens_per_rank: tokens_per_rank = 4294967295: at most 1048576",
    );
    has(
        &errors(BASE, "tokens_per_rank = 128", "tokens_per_rank = 1048576"),
        "8 ranks × 1048576 tokens × top-8 = 67108864 routing selections: at most 16777216",
    );
    has(
        &errors(BASE, "hidden = 7168", "hidden = 4294967295"),
        "hidden = 4294967295: at most 65536",
    );
    has(
        &errors(BASE, "experts = 256", "experts = 4294967288"),
        "8 ranks × 4294967288 experts = 34359738304: at most 8388608",
    );
    has(
        &errors(BASE, "num_qps_per_rank = 1", "num_qps_per_rank = 4294967295"),
        "num_qps_per_rank = 4294967295: at most 1024",
    );
    has(
        &errors(BASE, "num_qps_per_rank = 1", "num_sms = 4294967294"),
        "num_sms = 4294967294: at most 1024",
    );
    has(
        &errors(
            BASE,
            "num_qps_per_rank = 1",
            "dispatch_config = { num_max_rdma_chunked_recv_tokens = 4294967295 }",
        ),
        "job[0].buffer.dispatch_config.num_max_rdma_chunked_recv_tokens: num_max_rdma_chunked_recv_tokens = 4294967295: at most 1048576",
    );
}

#[test]
fn cluster_limits_come_before_rank_arithmetic() {
    has(
        &errors(BASE, "nodes = 1", "nodes = 4294967295"),
        "cluster.nodes: nodes = 4294967295: at most 4096",
    );
    has(
        &errors(BASE, "nodes = 1", "nodes = 4096\ngpus_per_node = 72"),
        "4096 nodes × 72 GPUs = 294912 GPUs: at most 16384",
    );
    has(
        &errors(BASE, "nodes = 1", "nodes = 2048\nranks_per_gpu = 64"),
        "16384 GPUs × 64 ranks per GPU = 1048576 ranks: at most 65536",
    );
    // A range far past the cluster is a rank error, found without building the range.
    has(
        &errors(BASE, "name = \"train\"", "name = \"train\"\nranks = \"0-4000000000\""),
        "job[0].ranks: rank 4000000000 does not exist: the cluster has 8 ranks (0-7)",
    );
}

#[test]
fn traffic_limits() {
    has(
        &errors(
            TRAFFIC,
            "bytes_per_rank = \"1MiB\"\nmessage_bytes = \"64KiB\"",
            "bytes_per_rank = \"1GiB\"\nmessage_bytes = 1",
        ),
        "job[0].traffic.message_bytes: 2 (source, destination) pairs × ceil(1073741824 / 1) bytes = 2147483648 messages per round: at most 4194304",
    );
    has(
        &errors(TRAFFIC, "message_bytes = \"64KiB\"", "message_bytes = \"4GiB\""),
        "an InfiniBand RDMA message carries at most 2^31 = 2147483648 bytes",
    );
    has(
        &errors(TRAFFIC, "bytes_per_rank = \"1MiB\"", "bytes_per_rank = \"2TiB\""),
        "2199023255552 bytes per rank: at most 1099511627776 (1 TiB)",
    );
    has(
        &errors(TRAFFIC, "pattern", "qps_per_peer = 100000\npattern"),
        "qps_per_peer = 100000: at most 1024",
    );
}

#[test]
fn names_longer_than_a_file_name_allows() {
    let long = "n".repeat(5000);
    has(
        &errors(BASE, "name = \"limits\"", &format!("name = \"{long}\"")),
        "name: 5000 bytes: a scenario name becomes result file names",
    );
    assert_eq!(
        errors(BASE, "name = \"limits\"", &format!("name = \"{}\"", "n".repeat(200))),
        Vec::<String>::new()
    );
    // `..` would write the hidden `out/...json`.
    for hidden in ["..", ".", ".x"] {
        has(
            &errors(BASE, "name = \"limits\"", &format!("name = \"{hidden}\"")),
            &format!("{hidden:?} starts with '.': a scenario name becomes result file names"),
        );
    }
}

#[test]
fn reference_values_are_finite() {
    let reference = "[job.reference]\nsource = \"x\"\n";
    for (extra, expected) in [
        (
            "tolerance_pct = nan\n",
            "job[0].reference.tolerance_pct: tolerance_pct = NaN: a finite percentage ≥ 0",
        ),
        ("tolerance_pct = -5.0\n", "tolerance_pct = -5: a finite percentage ≥ 0"),
        ("tolerance_pct = inf\n", "tolerance_pct = inf: a finite percentage ≥ 0"),
        (
            "ops.dispatch = { latency_us = nan }\n",
            "job[0].reference.ops.dispatch.latency_us: latency_us = NaN: a published value is finite and > 0",
        ),
        (
            "ops.dispatch = { logical_bw_gbps = 0.0 }\n",
            "logical_bw_gbps = 0: a published value is finite and > 0",
        ),
    ] {
        let text = format!("{BASE}{reference}{extra}");
        has(&errors(&text, "name", "name"), expected);
    }
}

#[test]
fn profile_overrides_are_ranged_at_their_keys() {
    let ov = |section: &str, kv: &str| {
        errors(BASE, "[[job]]", &format!("[cluster.overrides.{section}]\n{kv}\n[[job]]"))
    };
    for (section, kv, expected) in [
        (
            "nvlink",
            "bw_per_direction_gbps = nan",
            "l.toml:8:1: error[profile-range]: cluster.overrides.nvlink.bw_per_direction_gbps: NaN: expected a bandwidth from 1 to 10^7 GB/s",
        ),
        (
            "nvlink",
            "efficiency = nan",
            "cluster.overrides.nvlink.efficiency: NaN: expected a fraction from 0.01 to 1",
        ),
        ("nic", "link_gbps = nan", "cluster.overrides.nic.link_gbps: NaN"),
        ("nic", "efficiency = 0.0", "cluster.overrides.nic.efficiency: 0: expected a fraction"),
        ("pcie", "bw_gbps = inf", "cluster.overrides.pcie.bw_gbps: inf"),
        ("gpu", "memcpy_bw_gbps = 0", "cluster.overrides.gpu.memcpy_bw_gbps: 0"),
        ("nic", "efficiency = 2.0", "cluster.overrides.nic.efficiency: 2"),
        (
            "gpu",
            "clock_ghz = nan",
            "cluster.overrides.gpu.clock_ghz: NaN: expected a number from 0.1 to 10",
        ),
        ("nic", "per_gpu = 0", "cluster.overrides.nic.per_gpu: 0: expected an integer from 1 to 8"),
        ("nvlink", "packet_payload_bytes = 0", "cluster.overrides.nvlink.packet_payload_bytes: 0"),
        ("nic", "max_qp_depth = 0", "cluster.overrides.nic.max_qp_depth: 0"),
        (
            "fabric",
            "switch_radix = 1",
            "cluster.overrides.fabric.switch_radix: 1: expected an integer from 2 to 1024",
        ),
        (
            "fabric",
            "vl_buffer_bytes = 0",
            "cluster.overrides.fabric.vl_buffer_bytes: 0: a VL's receive buffer holds at least one packet",
        ),
        (
            "nvlink",
            "bw_per_direction_gbps = 1e-300",
            "cluster.overrides.nvlink.bw_per_direction_gbps: 1e-300: expected a bandwidth from 1 to 10^7 GB/s",
        ),
        (
            "nic",
            "wqe_post_ns = 9223372036854775807",
            "cluster.overrides.nic.wqe_post_ns: 9223372036854775807: expected a time from 0 to 10^9 ns (1 s)",
        ),
        (
            "nic",
            "link_gbps = \"fast\"",
            "cluster.overrides.nic.link_gbps: expected a number, found the string \"fast\"",
        ),
    ] {
        has(&ov(section, kv), expected);
    }
}

#[test]
fn jobs_sharing_the_fabric_run_a_bounded_session() {
    let shared = format!(
        "{}\n[[job]]\nname = \"bulk\"\nranks = \"0-1\"\n[job.traffic]\npattern = \"ring\"\nbytes_per_rank = \"64KiB\"\nwarmup = 0\niterations = 1\n",
        BASE.replace("warmup = 1", "warmup = 0")
    );
    // 8,000 rounds × 2 ops + 1 = 16,001 ops: within 16,384.
    assert!(
        !errors(&shared, "iterations = 2", "iterations = 8000")
            .iter()
            .any(|e| e.contains("limit-session")),
    );
    // 10,000 rounds: 20,001 ops (a session the simulator numbers with 16 bits kept growing).
    has(
        &errors(&shared, "iterations = 2", "iterations = 10000"),
        "job[0].workload.iterations: the jobs run 20001 ops together ((warmup + iterations) × ops, summed over jobs): at most 16384",
    );
    // One job alone is not a session: its ops are run one by one.
    assert_eq!(errors(BASE, "iterations = 2", "iterations = 100000"), Vec::<String>::new());
}

/// Within the op limit, a session of large jobs is refused by the state its ops keep: 200 ops
/// of an EP2896 job would keep 1.7 · 10^9 receive counters (issue 45: two jobs at
/// the op limit took 2.1 GB and were unfinished after 900 s).
#[test]
fn a_session_of_large_jobs_is_bounded_by_the_counters_it_keeps() {
    let large = |nodes: u32, experts: u32, iterations: u32| {
        format!(
            "{}\n[[job]]\nname = \"bulk\"\nranks = \"0-1\"\n[job.traffic]\npattern = \"ring\"\nbytes_per_rank = \"64KiB\"\nwarmup = 0\niterations = 1\n",
            BASE.replace("warmup = 1", "warmup = 0")
                .replace("nodes = 1", &format!("nodes = {nodes}"))
                .replace("experts = 256", &format!("experts = {experts}"))
                .replace("tokens_per_rank = 128", "tokens_per_rank = 8")
                .replace("iterations = 2", &format!("iterations = {iterations}"))
        )
    };
    let session = |e: &[String]| {
        e.iter().filter(|e| e.contains("limit-session")).cloned().collect::<Vec<_>>()
    };
    has(
        &session(&errors(&large(362, 2896, 100), "name", "name")),
        "job[0].workload.iterations: the jobs keep 1677363202 receive-counter cells together",
    );
    // 4,000 rounds of EP64 × 64 experts: 32,768,002 cells, within 2^25.
    assert_eq!(session(&errors(&large(8, 64, 4000), "name", "name")), Vec::<String>::new());
    has(&session(&errors(&large(8, 64, 4100), "name", "name")), "at most 33554432 (2^25)");
}
