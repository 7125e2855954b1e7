//! Property tests (proptest, 1,000 cases each): every model invariant holds on random small
//! topologies and traffic — byte conservation, no credit overdraft, QP in-flight ≤ depth,
//! per-QP order, no link above capacity, monotone time (the simulator checks them on every run
//! and fails the run with coordinates) — and DeepEP's algorithms deliver every (token,
//! expert) exactly once and combine every token with the weighted sum of its experts (the
//! one-GPU cluster kernels too).

use eptwin_engine::api::{Provenance, Verdict};
use eptwin_sim::{SimOptions, Simulator};
use proptest::prelude::*;

use eptwin_engine::testing::ScenarioDraft;

use crate::util::run;

fn config() -> ProptestConfig {
    eptwin_engine::testing::proptest_config(1000)
}

#[derive(Debug, Clone)]
pub(crate) struct TrafficJob {
    pattern: &'static str,
    bytes: u32,
    message: u32,
    qps: u32,
    sl: u8,
    depth: u32,
    rdma_only: bool,
    target: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct Fabric {
    pub(crate) nodes: u32,
    pub(crate) gpus: u32,
    single: bool,
    pub(crate) adaptive: bool,
    roce: bool,
    mtu: u32,
    buffer: u32,
    store_and_forward: bool,
    high_limit: u8,
    weights: [u8; 4],
    high: [bool; 4],
}

pub(crate) fn fabric() -> impl Strategy<Value = Fabric> {
    (
        1u32..=4,
        1u32..=4,
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.25),
        prop::sample::select(vec![1024u32, 2048, 4096]),
        prop::sample::select(vec![8192u32, 16384, 65536]),
        any::<bool>(),
        prop::sample::select(vec![0u8, 1, 6, 16, 255]),
        prop::array::uniform4(1u8..=255),
        prop::array::uniform4(any::<bool>()),
    )
        .prop_map(
            |(nodes, gpus, single, adaptive, roce, mtu, buffer, sf, high_limit, weights, high)| {
                Fabric {
                    // Traffic needs two ranks.
                    nodes: if nodes * gpus < 2 { 2 } else { nodes },
                    gpus,
                    single,
                    adaptive,
                    roce,
                    mtu,
                    buffer,
                    store_and_forward: sf,
                    high_limit,
                    weights,
                    high,
                }
            },
        )
}

pub(crate) fn traffic_job() -> impl Strategy<Value = TrafficJob> {
    (
        prop::sample::select(vec!["all-to-all", "ring", "incast"]),
        1u32..=96,
        prop::sample::select(vec![256u32, 1000, 4096, 9000, 65536]),
        1u32..=3,
        0u8..4,
        prop::sample::select(vec![128u32, 256, 1024]),
        any::<bool>(),
        0u32..2,
    )
        .prop_map(|(pattern, kib, message, qps, sl, depth, rdma_only, target)| TrafficJob {
            pattern,
            bytes: kib * 1024,
            message,
            qps,
            sl,
            depth,
            rdma_only,
            target,
        })
}

pub(crate) fn fabric_toml(f: &Fabric) -> String {
    let mut low = Vec::new();
    let mut high = Vec::new();
    for vl in 0..4 {
        let e = format!("{vl}:{}", f.weights[vl]);
        if f.high[vl] { high.push(e) } else { low.push(e) }
    }
    let kind = if f.roce {
        "kind = \"roce\"\nets_tc_bw = [25, 25, 25, 25, 0, 0, 0, 0]\npfc = [1, 1, 0, 1, 0, 0, 0, 0]\nstrict_tcs = [3]\n".to_string()
    } else {
        format!(
            "vlarb_high = \"{}\"\nvlarb_low = \"{}\"\nhigh_limit = {}\n",
            high.join(","),
            low.join(","),
            f.high_limit
        )
    };
    format!(
        r#"[cluster]
profile = "h800-cx7"
nodes = {}
gpus_per_node = {}
[cluster.fabric]
mtu = {}
topology = "{}"
routing = "{}"
{kind}[cluster.overrides.fabric]
vl_buffer_bytes = {}
switch_mode = "{}"
"#,
        f.nodes,
        f.gpus,
        f.mtu,
        if f.single { "single-switch" } else { "rail-leaf-spine" },
        if f.adaptive { "adaptive" } else { "static" },
        f.buffer,
        if f.store_and_forward { "store-and-forward" } else { "cut-through" },
    )
}

pub(crate) fn traffic_toml(i: usize, j: &TrafficJob) -> String {
    format!(
        r#"
[[job]]
name = "t{i}"
[job.env]
NVSHMEM_IB_SL = "{}"
NVSHMEM_QP_DEPTH = "{}"
[job.traffic]
pattern = "{}"
bytes_per_rank = {}
message_bytes = {}
qps_per_peer = {}
rdma_only = {}
incast_target = {}
warmup = 0
iterations = 2
"#,
        j.sl, j.depth, j.pattern, j.bytes, j.message, j.qps, j.rdma_only, j.target
    )
}

proptest! {
    #![proptest_config(config())]

    /// Random fabrics and 1–3 concurrent traffic jobs on random SLs: the run completes with
    /// every invariant intact, and reports every op.
    #[test]
    fn fabric_invariants_hold(f in fabric(), jobs in prop::collection::vec(traffic_job(), 1..=3)) {
        let mut text = format!("schema = 1\nname = \"prop\"\n{}", fabric_toml(&f));
        for (i, j) in jobs.iter().enumerate() {
            text.push_str(&traffic_toml(i, j));
        }
        let plan = ScenarioDraft::from_text("prop", &text).plan();
        let r = run(&plan);
        prop_assert_eq!(r.verdict, Verdict::Ok, "{:?}\n{}", r.failures, text);
        for job in &r.jobs {
            prop_assert!(!job.ops.is_empty());
            for op in &job.ops {
                prop_assert_eq!(op.samples.len(), 2);
                prop_assert!(op.summary.latency_us.mean > 0.0);
            }
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Ll {
    pub(crate) ranks: u32,
    local: u32,
    tokens: u32,
    topk: u32,
    masked: u32,
    nvlink: bool,
    hook: bool,
    seed: u64,
}

pub(crate) fn ll() -> impl Strategy<Value = Ll> {
    (
        prop::sample::select(vec![2u32, 4, 8, 16]),
        1u32..=3,
        1u32..=4,
        1u32..=8,
        0u32..=3,
        any::<bool>(),
        prop::bool::weighted(0.2),
        any::<u64>(),
    )
        .prop_map(|(ranks, local, t4, topk, masked, nvlink, hook, seed)| {
            let experts = ranks * local;
            Ll { ranks, local, tokens: t4 * 4, topk: topk.min(experts), masked, nvlink, hook, seed }
        })
}

pub(crate) fn ll_toml(c: &Ll) -> String {
    let (nodes, gpus) = if c.ranks <= 8 { (1, c.ranks) } else { (c.ranks / 8, 8) };
    format!(
        r#"schema = 1
name = "prop-ll"
[cluster]
profile = "h800-cx7"
nodes = {nodes}
gpus_per_node = {gpus}
[[job]]
name = "ll"
[job.buffer]
low_latency_mode = true
num_rdma_bytes = "1GiB"
num_qps_per_rank = {}
allow_nvlink_for_low_latency_mode = {}
[job.workload]
tokens_per_rank = {}
hidden = 2048
topk = {}
experts = {}
masked_selections = {}
hook = {}
seed = {}
warmup = 0
iterations = 1
"#,
        c.local,
        c.nvlink,
        c.tokens,
        c.topk,
        c.ranks * c.local,
        c.masked,
        c.hook,
        c.seed % 1_000_000,
    )
}

#[derive(Debug, Clone)]
pub(crate) struct Normal {
    pub(crate) nodes: u32,
    pub(crate) ranks: u32,
    local: u32,
    tokens: u32,
    topk: u32,
    sms: u32,
    node_limited: bool,
    seed: u64,
}

pub(crate) fn normal() -> impl Strategy<Value = Normal> {
    (
        prop::sample::select(vec![(1u32, 2u32), (1, 4), (1, 8), (2, 16), (3, 24), (4, 32)]),
        1u32..=4,
        1u32..=48,
        1u32..=8,
        prop::sample::select(vec![2u32, 4, 8, 24]),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|((nodes, ranks), local, tokens, topk, sms, node_limited, seed)| Normal {
            nodes,
            ranks,
            local,
            tokens,
            topk: topk.min(ranks * local),
            sms,
            node_limited,
            seed,
        })
}

pub(crate) fn normal_toml(c: &Normal) -> String {
    let internode = c.nodes > 1;
    let routing = if internode && c.node_limited {
        format!("routing = \"node-limited\"\ntopk_groups = {}", c.nodes.min(4))
    } else {
        "routing = \"uniform\"".to_string()
    };
    format!(
        r#"schema = 1
name = "prop-normal"
[cluster]
profile = "h800-cx7"
nodes = {}
gpus_per_node = {}
[[job]]
name = "normal"
[job.buffer]
num_nvl_bytes = "1GiB"
{}num_qps_per_rank = {}
num_sms = {}
[job.workload]
tokens_per_rank = {}
hidden = 2048
topk = {}
experts = {}
{routing}
seed = {}
warmup = 0
iterations = 1
"#,
        c.nodes,
        if internode { 8 } else { c.ranks },
        if internode { "num_rdma_bytes = \"1GiB\"\n" } else { "" },
        c.sms.max(24),
        c.sms,
        c.tokens,
        c.topk,
        c.ranks * c.local,
        c.seed % 1_000_000,
    )
}

/// EP on one H200 (`h200-single`, whose profile has the cluster keys): the cluster kernels for
/// 2, 4 or 8 ranks, channels from one to more than a wave of resident clusters.
#[derive(Debug, Clone)]
struct OneGpu {
    ranks: u32,
    local: u32,
    tokens: u32,
    topk: u32,
    sms: u32,
    recv: u32,
    seed: u64,
}

fn one_gpu() -> impl Strategy<Value = OneGpu> {
    (
        prop::sample::select(vec![2u32, 4, 8]),
        prop::sample::select(vec![4u32, 8]),
        1u32..=64,
        prop::sample::select(vec![4u32, 8]),
        prop::sample::select(vec![2u32, 4, 8, 30, 40]),
        2u32..=12,
        any::<u64>(),
    )
        .prop_map(|(ranks, local, tokens, topk, sms, recv, seed)| OneGpu {
            ranks,
            local,
            tokens,
            topk,
            sms,
            recv,
            seed,
        })
}

fn one_gpu_toml(c: &OneGpu) -> String {
    format!(
        r#"schema = 1
name = "prop-one-gpu"
[cluster]
profile = "h200-single"
ranks_per_gpu = {}
[[job]]
name = "normal"
[job.buffer]
num_nvl_bytes = "1GiB"
num_qps_per_rank = 1
num_sms = {}
[job.buffer.dispatch_config]
num_max_nvl_chunked_send_tokens = 1
num_max_nvl_chunked_recv_tokens = {}
[job.buffer.combine_config]
num_max_nvl_chunked_send_tokens = 1
num_max_nvl_chunked_recv_tokens = {}
[job.workload]
tokens_per_rank = {}
hidden = 2048
topk = {}
experts = {}
seed = {}
warmup = 0
iterations = 1
"#,
        c.ranks,
        c.sms,
        c.recv,
        c.recv,
        c.tokens,
        c.topk,
        c.ranks * c.local,
        c.seed % 1_000_000,
    )
}

/// `text` (a scenario) with the low-latency kernels' fixed parts set: the fused kernel's (hook
/// mode's send kernel's) and hook mode's receive kernel's, of dispatch and of combine.
fn with_ll_fixed(text: &str, dispatch_ns: [u64; 2], combine_ns: [u64; 2]) -> String {
    format!(
        "{text}[cluster.overrides.deepep]\nll_dispatch_fixed_ns = {}\nll_dispatch_recv_fixed_ns = {}\nll_combine_fixed_ns = {}\nll_combine_recv_fixed_ns = {}\n",
        dispatch_ns[0], dispatch_ns[1], combine_ns[0], combine_ns[1]
    )
}

fn assert_correct(text: &str) -> Result<(), TestCaseError> {
    let plan = ScenarioDraft::from_text("prop", text).plan();
    let r = run(&plan);
    prop_assert_eq!(r.verdict, Verdict::Ok, "{:?}\n{}", r.failures, text);
    for op in &r.jobs[0].ops {
        prop_assert!(!op.summary.checks.is_empty(), "{} ran no checks", op.op);
        prop_assert_eq!(op.summary.wrong, 0);
    }
    // Same seed, same result, byte for byte.
    prop_assert_eq!(r.to_json(), run(&plan).to_json());
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// LL dispatch delivers every (token, expert) message exactly once before its count;
    /// combine returns each token's top-k outputs once with its weights (pure RDMA or NVLink).
    #[test]
    fn low_latency_is_exact(c in ll()) {
        assert_correct(&ll_toml(&c))?;
    }

    /// Each low-latency kernel launch pays its fixed GPU time once, on any topology: an op's
    /// time grows by exactly that time, a hook-mode op (a send and a receive kernel) by both
    /// kernels' times.
    #[test]
    fn low_latency_fixed_part_is_paid_once_per_kernel(
        c in ll(), dispatch_ns in [0u64..20_000, 0u64..20_000],
        combine_ns in [0u64..20_000, 0u64..20_000],
    ) {
        let text = ll_toml(&c);
        let base = run(&ScenarioDraft::from_text("prop", &with_ll_fixed(&text, [0, 0], [0, 0])).plan());
        let fixed = run(
            &ScenarioDraft::from_text("prop", &with_ll_fixed(&text, dispatch_ns, combine_ns)).plan(),
        );
        prop_assert_eq!(fixed.verdict, Verdict::Ok, "{:?}", fixed.failures);
        for (a, b) in base.jobs[0].ops.iter().zip(&fixed.jobs[0].ops) {
            let ns = if a.op == "dispatch" { dispatch_ns } else { combine_ns };
            let paid = if c.hook { ns[0] + ns[1] } else { ns[0] };
            let grew_us = b.summary.latency_us.mean - a.summary.latency_us.mean;
            prop_assert!(
                (grew_us - paid as f64 / 1e3).abs() < 1e-6,
                "{}: {} -> {} us with {:?} ns per kernel", a.op, a.summary.latency_us.mean,
                b.summary.latency_us.mean, ns
            );
        }
    }

    /// Normal intranode and internode (forwarding) kernels deliver every (token, rank) once and
    /// combine each token from every GPU and node it visited.
    #[test]
    fn normal_kernels_are_exact(c in normal()) {
        assert_correct(&normal_toml(&c))?;
    }

    /// The cluster kernels (ranks sharing one GPU, rings in shared memory) deliver every
    /// (token, rank) once, in ring order, and combine each token from every rank it visited,
    /// whatever the slots, channels and waves of clusters.
    #[test]
    fn one_gpu_cluster_kernels_are_exact(c in one_gpu()) {
        let text = one_gpu_toml(&c);
        assert_correct(&text)?;
        let r = run(&ScenarioDraft::from_text("prop", &text).plan());
        for op in &r.jobs[0].ops {
            prop_assert!(
                op.summary.checks.iter().any(|k| k.starts_with("one-GPU cluster")),
                "{} did not run the cluster model: {:?}", op.op, op.summary.checks
            );
        }
    }
}

/// DeepEP's IBGDA layer does not check for free WQE slots: a normal internode dispatch that
/// keeps more than `NVSHMEM_QP_DEPTH` work requests in flight on one QP is reported with its
/// coordinates (rdma_send = 1: one put + one tail atomic per token, a 128-slot ring, and
/// senders that outpace the NIC).
#[test]
fn qp_overrun_is_reported() {
    let text = r#"schema = 1
name = "overrun"
[cluster]
profile = "h800-cx7"
nodes = 2
# Senders far faster than the NIC, so posted work requests pile up on the QP.
[cluster.overrides.gpu]
sm_copy_bw_gbps = 4000
warp_copy_bw_gbps = 1000
[[job]]
name = "normal"
[job.buffer]
num_nvl_bytes = "1GiB"
num_rdma_bytes = "1GiB"
num_qps_per_rank = 24
num_sms = 2
dispatch_config = { num_max_nvl_chunked_send_tokens = 4, num_max_nvl_chunked_recv_tokens = 256, num_max_rdma_chunked_send_tokens = 1, num_max_rdma_chunked_recv_tokens = 128 }
[job.env]
NVSHMEM_QP_DEPTH = "128"
[job.workload]
tokens_per_rank = 2048
hidden = 2048
topk = 8
experts = 64
routing = "uniform"
warmup = 0
iterations = 1
ops = ["dispatch"]
"#;
    let plan = ScenarioDraft::from_text("overrun", text).plan();
    let r = run(&plan);
    assert_eq!(r.verdict, Verdict::Failed);
    assert!(r.failures.iter().any(|f| f.contains("QP overrun")), "{:?}", r.failures);
    // A QP past its depth sees when its completions happen: the op runs again with ACK
    // events, and the result is theirs.
    let mut acks = Simulator::new(SimOptions::default()).without_early_acks();
    let want = eptwin_engine::api::run(&plan, &mut acks, Provenance::default()).expect("run");
    assert_eq!(want.to_json(), r.to_json());
}

/// A DeepEP V2 job on a random small cluster: hybrid or direct, FP8 or BF16, any SM count.
#[derive(Debug, Clone)]
struct V2 {
    nodes: u32,
    gpus: u32,
    tokens: u32,
    topk: u32,
    experts_per_rank: u32,
    sms: u32,
    hybrid: bool,
    bf16: bool,
    seed: u64,
}

fn v2() -> impl Strategy<Value = V2> {
    (
        1u32..=3,
        1u32..=4,
        1u32..=96,
        1u32..=8,
        1u32..=4,
        2u32..=6,
        any::<bool>(),
        any::<bool>(),
        // A TOML integer is an i64.
        any::<u32>(),
    )
        .prop_map(|(nodes, gpus, tokens, topk, experts_per_rank, sms, hybrid, bf16, seed)| {
            V2 {
                nodes,
                gpus,
                tokens,
                topk,
                experts_per_rank,
                sms: sms * 2,
                hybrid,
                bf16,
                seed: seed.into(),
            }
        })
}

fn v2_toml(c: &V2) -> String {
    let ranks = c.nodes * c.gpus;
    let experts = ranks * c.experts_per_rank;
    format!(
        "schema = 1\nname = \"prop-v2\"\n[cluster]\nprofile = \"h100-cx7\"\nnodes = {}\ngpus_per_node = {}\n\
         [[job]]\nname = \"v2\"\n[job.buffer]\napi = \"elastic\"\nnum_max_tokens_per_rank = {}\n\
         allow_hybrid_mode = {}\nnum_sms = {}\n[job.workload]\ntokens_per_rank = {}\nhidden = 1024\n\
         topk = {}\nexperts = {experts}\ndispatch_dtype = \"{}\"\nseed = {}\nwarmup = 0\niterations = 1\n",
        c.nodes,
        c.gpus,
        c.tokens,
        c.hybrid,
        c.sms,
        c.tokens,
        c.topk.min(experts),
        if c.bf16 { "bf16" } else { "fp8" },
        c.seed
    )
}

proptest! {
    #![proptest_config(eptwin_engine::testing::proptest_config(64))]

    /// V2 dispatch delivers every (token, rank) pair once and combine brings every token back
    /// once per domain (hybrid) or rank (direct); every fabric invariant holds (QP in-flight
    /// within the GIN depth included).
    #[test]
    fn v2_kernels_are_exact(c in v2()) {
        assert_correct(&v2_toml(&c))?;
    }
}
