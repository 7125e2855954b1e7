//! Numeric limits on a scenario, checked before any rule computes with its values: what
//! DeepEP and the hardware allow bounds some keys, the memory and result size of a run bounds
//! the rest. Within them, validation takes bounded memory and time and no arithmetic on the
//! values overflows; a run's memory is bounded by the formulas below (docs/scenario.md,
//! "Limits", lists every limit with its reason).
//!
//! The DeepEP rules (`deepep/validate.rs`) keep the lower bounds they always had (`≥ 1`,
//! divisibility, instantiation lists); these are the upper bounds and the non-finite values.

use crate::diag::Diagnostics;
use crate::profile::HardwareProfile;
use crate::scenario::schema::{JobSpec, ReferenceSpec, Scenario, TrafficPattern, TrafficSpec};

/// A scenario's name becomes file names, `<name>.compare.json` the longest (13 bytes more;
/// temporary files have names of their own, engine/src/files.rs). 200 bytes leaves room under
/// the 255-byte file name limit; sweep points keep to it too (`sweep::point_name`).
pub const MAX_NAME_BYTES: usize = 200;
/// Jobs in one scenario (the simulator numbers jobs with 16 bits; validation is linear in it).
pub const MAX_JOBS: usize = 4096;
/// Cluster shape: nodes, GPUs per node, ranks per GPU, and their products.
pub const MAX_NODES: u32 = 4096;
pub const MAX_GPUS_PER_NODE: u32 = 72;
pub const MAX_RANKS_PER_GPU: u32 = 64;
pub const MAX_GPUS: u64 = 16_384;
pub const MAX_RANKS: u64 = 65_536;
/// `tokens_per_rank`, `num_max_dispatch_tokens_per_rank` and the four chunk sizes of a
/// `Config`: 2^20 tokens, far above DeepEP's tuned chunks (≤ 720) and the low-latency
/// ceiling of 16,383 tokens the largest QP depth allows.
pub const MAX_TOKENS: u32 = 1 << 20;
/// `hidden`: 64 Ki channels (DeepSeek-V3: 7,168; the low-latency kernels stop at 8,192).
pub const MAX_HIDDEN: u32 = 65_536;
/// `num_sms`, bounded like a GPU's SM count (`gpu.sm_count ≤ 1024`).
pub const MAX_NUM_SMS: u32 = 1024;
/// `num_qps_per_rank`: `NUM_MAX_LOCAL_EXPERTS` (low-latency needs one QP per local expert,
/// normal internode at most `num_sms`).
pub const MAX_QPS_PER_RANK: u32 = 1024;
/// Routing selections of a DeepEP job, ranks × tokens_per_rank × topk: the routing table takes
/// 8 bytes each (128 MiB), the simulator about 40 (normal) to 60 (low-latency) bytes each
/// (≈ 1 GiB at the limit); EP64 × 4,096 tokens × top-8 is 2 Mi.
pub const MAX_SELECTIONS: u64 = 1 << 24;
/// A routing file (`routing = "file"`): 256 MiB, 16 bytes per selection of a table of
/// `MAX_SELECTIONS` — an expert index and an f32 weight printed shortest (≈ 10 characters) with
/// their separators. The file is read whole before it is parsed; the parse keeps only the job's
/// table, so a run takes this plus the table's 8 bytes per selection.
pub const MAX_ROUTING_FILE_BYTES: u64 = 16 * MAX_SELECTIONS;
/// Ranks × experts of a DeepEP job: the low-latency receivers keep a counter per (local
/// expert, source rank) on every rank, about 70 bytes each in the simulator (≈ 600 MiB at the
/// limit); EP256 × 256 experts is 64 Ki.
pub const MAX_RANK_EXPERTS: u64 = 1 << 23;
/// Untimed rounds of a job.
pub const MAX_WARMUP: u32 = 10_000;
/// Timed rounds of a job.
pub const MAX_ITERATIONS: u32 = 100_000;
/// Ops per round of a job.
pub const MAX_OPS: usize = 64;
/// Samples in a result, Σ over jobs of iterations × ops: each is one record of ~100 to 200
/// bytes in the result JSON, so a result stays under ~40 MB.
pub const MAX_RESULT_SAMPLES: u64 = 200_000;
/// Ops of a scenario with several jobs, Σ over jobs of (warmup + iterations) × ops: the jobs
/// share one simulated session (the simulator numbers its ops with 16 bits); what the ops keep
/// is bounded by [`MAX_SESSION_CELLS`].
pub const MAX_SESSION_OPS: u64 = 1 << 14;
/// The state a shared session keeps, Σ over jobs of (warmup + iterations) × ops × cells per
/// op, where an op's cells are ranks × max(experts, ranks) for a DeepEP job and its ranks for
/// traffic: every op of a session keeps its receive counters (one per local expert and source
/// rank on every rank) until the session ends: 8–20 bytes per cell measured (low-latency EP16
/// and EP64; 247 MiB at the limit, docs/scenario.md). 16,384 ops of EP2896 would keep 2^37.
pub const MAX_SESSION_CELLS: u64 = 1 << 25;
/// Background traffic: bytes each rank sends per round.
pub const MAX_TRAFFIC_BYTES_PER_RANK: u64 = 1 << 40;
/// The largest RDMA message InfiniBand carries (2^31 bytes).
pub const MAX_MESSAGE_BYTES: u64 = 1 << 31;
/// Messages of one traffic round over the whole job, Σ over (source, destination) of
/// ceil(bytes / message_bytes): the simulator issues every NVLink copy of a round at once
/// (~85 bytes each, ≈ 350 MiB at the limit) and spends ~1 µs per RDMA message.
pub const MAX_TRAFFIC_MESSAGES: u64 = 1 << 22;
/// QPs per peer of a traffic job.
pub const MAX_QPS_PER_PEER: u32 = 1024;
/// `[[fault]]` entries: the simulator asks every straggler fault for every rank's start of
/// every op, so a run's cost grows with their number.
pub const MAX_FAULTS: usize = 256;

/// Check every limit; `false` when any is exceeded (each is reported). The other rules then
/// are not evaluated: they compute with these values.
pub fn check(scn: &Scenario, profile: &HardwareProfile, d: &mut Diagnostics<'_>) -> bool {
    let before = d.items.len();
    if scn.name.len() > MAX_NAME_BYTES {
        d.error(
            "limit-name",
            "name",
            None,
            format!(
                "{} bytes: a scenario name becomes result file names (<name>.compare.json), at \
                 most {MAX_NAME_BYTES} bytes",
                scn.name.len()
            ),
        );
    }
    if scn.name.starts_with('.') {
        d.error(
            "limit-name",
            "name",
            None,
            format!(
                "{:?} starts with '.': a scenario name becomes result file names, and {}.json \
                 would be hidden; start it with a letter or digit",
                scn.name, scn.name
            ),
        );
    }
    if scn.jobs.len() > MAX_JOBS {
        d.error(
            "limit-jobs",
            &format!("job[{MAX_JOBS}]"),
            None,
            format!("{} jobs: a scenario has at most {MAX_JOBS}", scn.jobs.len()),
        );
        return false;
    }
    if scn.faults.len() > MAX_FAULTS {
        d.error(
            "limit-faults",
            &format!("fault[{MAX_FAULTS}]"),
            None,
            format!("{} faults: a scenario has at most {MAX_FAULTS}", scn.faults.len()),
        );
        return false;
    }
    let num_ranks = check_cluster(profile, d);
    let mut samples = 0u64;
    let mut session_ops = 0u64;
    let mut session_cells = 0u128;
    // The job recording the most samples, where an excess is reported.
    let mut largest: Option<(u64, String)> = None;
    let rounds_before = d.items.len();
    for (i, job) in scn.jobs.iter().enumerate() {
        let prefix = format!("job[{i}]");
        let ranks = num_ranks.and_then(|n| job.ranks.resolve(n).ok()).map(|r| r.len() as u64);
        let mut job_samples = 0;
        if let Some(w) = &job.workload {
            let key = |k: &str| format!("{prefix}.workload.{k}");
            job_samples += check_rounds(job, &key, w.warmup, w.iterations, w.ops.len(), d);
            let ops = (w.warmup as u64 + w.iterations as u64) * w.ops.len() as u64;
            session_ops += ops;
            if let Some(n) = ranks {
                session_cells += ops as u128 * n as u128 * (w.experts as u64).max(n) as u128;
            }
            check_deepep(job, &prefix, ranks, d);
        }
        if let Some(t) = &job.traffic {
            let key = |k: &str| format!("{prefix}.traffic.{k}");
            job_samples += check_rounds(job, &key, t.warmup, t.iterations, t.ops.len(), d);
            let ops = (t.warmup as u64 + t.iterations as u64) * t.ops.len() as u64;
            session_ops += ops;
            session_cells += ops as u128 * ranks.unwrap_or(0) as u128;
            check_traffic(job, &prefix, t, ranks, d);
        }
        if let Some(r) = &job.reference {
            check_reference(job, &prefix, r, d);
        }
        samples += job_samples;
        if largest.as_ref().is_none_or(|(most, _)| job_samples > *most) {
            let table = if job.traffic.is_some() { "traffic" } else { "workload" };
            largest = Some((job_samples, format!("{prefix}.{table}.iterations")));
        }
    }
    // Per-job limits keep one job under the total; report the total only for several jobs.
    let rounds_ok = !d.items[rounds_before..]
        .iter()
        .any(|i| i.rule == "limit-iterations" || i.rule == "limit-ops");
    let several = scn.jobs.len() > 1;
    if let Some((_, key)) =
        largest.as_ref().filter(|_| rounds_ok && several && session_ops > MAX_SESSION_OPS)
    {
        d.error(
            "limit-session",
            key,
            None,
            format!(
                "the jobs run {session_ops} ops together ((warmup + iterations) × ops, summed over \
                 jobs): at most {MAX_SESSION_OPS} when several jobs share the fabric (one \
                 simulated session keeps every op)"
            ),
        );
    }
    let session_ops_ok = session_ops <= MAX_SESSION_OPS;
    if let Some((_, key)) = largest.as_ref().filter(|_| {
        rounds_ok && several && session_ops_ok && session_cells > MAX_SESSION_CELLS as u128
    }) {
        d.error(
            "limit-session",
            key,
            None,
            format!(
                "the jobs keep {session_cells} receive-counter cells together ((warmup + \
                 iterations) × ops × ranks × max(experts, ranks), ranks for traffic, summed over \
                 jobs): at most {MAX_SESSION_CELLS} (2^25) when several jobs share the fabric \
                 (one simulated session keeps every op's counters); run fewer rounds or a \
                 smaller job"
            ),
        );
    }
    if let Some((_, key)) = largest.filter(|_| rounds_ok && samples > MAX_RESULT_SAMPLES) {
        d.error(
            "limit-samples",
            &key,
            None,
            format!(
                "the jobs record {samples} samples (iterations × ops, summed over jobs): at most \
                 {MAX_RESULT_SAMPLES}, which keeps a result file under ~40 MB"
            ),
        );
    }
    d.items[before..].iter().all(|item| !item.is_error())
}

/// The cluster's shape; its rank count when the shape is within the limits.
fn check_cluster(profile: &HardwareProfile, d: &mut Diagnostics<'_>) -> Option<u32> {
    let c = &profile.cluster;
    let mut errors: Vec<(&str, String)> = Vec::new();
    for (name, value, max) in [
        ("nodes", c.nodes, MAX_NODES),
        ("gpus_per_node", c.gpus_per_node, MAX_GPUS_PER_NODE),
        ("ranks_per_gpu", c.ranks_per_gpu, MAX_RANKS_PER_GPU),
    ] {
        if value > max {
            errors.push((name, format!("{name} = {value}: at most {max}")));
        }
    }
    let gpus = c.nodes as u64 * c.gpus_per_node as u64;
    let ranks = gpus * c.ranks_per_gpu as u64;
    if errors.is_empty() && gpus > MAX_GPUS {
        errors.push((
            "nodes",
            format!(
                "{} nodes × {} GPUs = {gpus} GPUs: at most {MAX_GPUS}",
                c.nodes, c.gpus_per_node
            ),
        ));
    }
    if errors.is_empty() && ranks > MAX_RANKS {
        errors.push((
            "ranks_per_gpu",
            format!(
                "{gpus} GPUs × {} ranks per GPU = {ranks} ranks: at most {MAX_RANKS}",
                c.ranks_per_gpu
            ),
        ));
    }
    if c.nvlink_domain_gpus as u64 > MAX_GPUS {
        errors.push((
            "nvlink_domain_gpus",
            format!("nvlink_domain_gpus = {}: at most {MAX_GPUS}", c.nvlink_domain_gpus),
        ));
    }
    let ok = errors.is_empty();
    for (name, message) in errors {
        // The scenario's own key when it sets it, else the profile that did.
        let written = format!("cluster.{name}");
        let key = if d.source().has(&written) { written } else { "cluster.profile".into() };
        d.error("limit-cluster", &key, None, message);
    }
    ok.then_some(ranks as u32)
}

/// Warmup, iterations and ops of one job; its result samples.
fn check_rounds(
    job: &JobSpec,
    key: &dyn Fn(&str) -> String,
    warmup: u32,
    iterations: u32,
    ops: usize,
    d: &mut Diagnostics<'_>,
) -> u64 {
    let name = Some(job.name.as_str());
    if warmup > MAX_WARMUP {
        d.error(
            "limit-warmup",
            &key("warmup"),
            name,
            format!("warmup = {warmup}: at most {MAX_WARMUP}"),
        );
    }
    if iterations > MAX_ITERATIONS {
        d.error(
            "limit-iterations",
            &key("iterations"),
            name,
            format!("iterations = {iterations}: at most {MAX_ITERATIONS}"),
        );
    }
    if ops > MAX_OPS {
        d.error("limit-ops", &key("ops"), name, format!("{ops} ops per round: at most {MAX_OPS}"));
    }
    iterations as u64 * ops as u64
}

fn check_deepep(job: &JobSpec, prefix: &str, ranks: Option<u64>, d: &mut Diagnostics<'_>) {
    let name = Some(job.name.as_str());
    let w = job.workload.as_ref().expect("a DeepEP job has a workload");
    let wkey = |k: &str| format!("{prefix}.workload.{k}");
    let mut over = |key: String, what: &str, value: u64, max: u64| {
        if value > max {
            d.error("limit-workload", &key, name, format!("{what} = {value}: at most {max}"));
        }
    };
    over(wkey("tokens_per_rank"), "tokens_per_rank", w.tokens_per_rank as u64, MAX_TOKENS as u64);
    if let Some(t) = w.num_max_dispatch_tokens_per_rank {
        over(
            wkey("num_max_dispatch_tokens_per_rank"),
            "num_max_dispatch_tokens_per_rank",
            t as u64,
            MAX_TOKENS as u64,
        );
    }
    over(wkey("hidden"), "hidden", w.hidden as u64, MAX_HIDDEN as u64);
    if let Some(b) = &job.buffer {
        let bkey = |k: &str| format!("{prefix}.buffer.{k}");
        over(bkey("num_sms"), "num_sms", b.num_sms as u64, MAX_NUM_SMS as u64);
        over(
            bkey("num_qps_per_rank"),
            "num_qps_per_rank",
            b.num_qps_per_rank as u64,
            MAX_QPS_PER_RANK as u64,
        );
        for (table, chunks) in
            [("dispatch_config", &b.dispatch_config), ("combine_config", &b.combine_config)]
        {
            for (k, v) in [
                ("num_max_nvl_chunked_send_tokens", chunks.num_max_nvl_chunked_send_tokens),
                ("num_max_nvl_chunked_recv_tokens", chunks.num_max_nvl_chunked_recv_tokens),
                ("num_max_rdma_chunked_send_tokens", chunks.num_max_rdma_chunked_send_tokens),
                ("num_max_rdma_chunked_recv_tokens", chunks.num_max_rdma_chunked_recv_tokens),
            ] {
                if let Some(v) = v {
                    over(bkey(&format!("{table}.{k}")), k, v as u64, MAX_TOKENS as u64);
                }
            }
        }
    }
    let Some(n) = ranks else { return };
    let selections = n as u128 * w.tokens_per_rank as u128 * w.topk as u128;
    if selections > MAX_SELECTIONS as u128 {
        d.error(
            "limit-selections",
            &wkey("tokens_per_rank"),
            name,
            format!(
                "{n} ranks × {} tokens × top-{} = {selections} routing selections: at most \
                 {MAX_SELECTIONS} (2^24; the routing table and the simulator's records grow with \
                 them, ≈ 1 GiB at the limit)",
                w.tokens_per_rank, w.topk
            ),
        );
    }
    let pairs = n * w.experts as u64;
    if pairs > MAX_RANK_EXPERTS {
        d.error(
            "limit-experts",
            &wkey("experts"),
            name,
            format!(
                "{n} ranks × {} experts = {pairs}: at most {MAX_RANK_EXPERTS} (2^23; every rank \
                 keeps a receive counter per expert and source rank)",
                w.experts
            ),
        );
    }
}

fn check_traffic(
    job: &JobSpec,
    prefix: &str,
    t: &TrafficSpec,
    ranks: Option<u64>,
    d: &mut Diagnostics<'_>,
) {
    let name = Some(job.name.as_str());
    let key = |k: &str| format!("{prefix}.traffic.{k}");
    let bytes = t.bytes_per_rank.bytes();
    if bytes > MAX_TRAFFIC_BYTES_PER_RANK {
        d.error(
            "limit-traffic",
            &key("bytes_per_rank"),
            name,
            format!("{bytes} bytes per rank: at most {MAX_TRAFFIC_BYTES_PER_RANK} (1 TiB)"),
        );
        return;
    }
    if let Some(m) = t.message_bytes
        && m.bytes() > MAX_MESSAGE_BYTES
    {
        d.error(
            "limit-traffic",
            &key("message_bytes"),
            name,
            format!(
                "{} bytes: an InfiniBand RDMA message carries at most 2^31 = {MAX_MESSAGE_BYTES} bytes",
                m.bytes()
            ),
        );
        return;
    }
    if t.qps_per_peer > MAX_QPS_PER_PEER {
        d.error(
            "limit-traffic",
            &key("qps_per_peer"),
            name,
            format!("qps_per_peer = {}: at most {MAX_QPS_PER_PEER}", t.qps_per_peer),
        );
    }
    let Some(n) = ranks else { return };
    if n < 2 {
        return;
    }
    let message = t.message_bytes.map_or(DEFAULT_TRAFFIC_MESSAGE_BYTES, |m| m.bytes()).max(1);
    let (pairs, per_pair) = match t.pattern {
        TrafficPattern::AllToAll => (n * (n - 1), bytes / (n - 1)),
        TrafficPattern::Ring => (n, bytes),
        TrafficPattern::Incast => (n - 1, bytes),
    };
    let messages = pairs as u128 * per_pair.div_ceil(message).max(1) as u128;
    if messages > MAX_TRAFFIC_MESSAGES as u128 {
        d.error(
            "limit-traffic-messages",
            &key("message_bytes"),
            name,
            format!(
                "{pairs} (source, destination) pairs × ceil({per_pair} / {message}) bytes = \
                 {messages} messages per round: at most {MAX_TRAFFIC_MESSAGES} (2^22); use larger \
                 message_bytes"
            ),
        );
    }
}

/// The message size of a traffic job without `message_bytes` (the simulator's default).
pub const DEFAULT_TRAFFIC_MESSAGE_BYTES: u64 = 1 << 20;

fn check_reference(job: &JobSpec, prefix: &str, r: &ReferenceSpec, d: &mut Diagnostics<'_>) {
    let name = Some(job.name.as_str());
    let key = |k: &str| format!("{prefix}.reference.{k}");
    if !(r.tolerance_pct.is_finite() && r.tolerance_pct >= 0.0) {
        d.error(
            "reference",
            &key("tolerance_pct"),
            name,
            format!("tolerance_pct = {}: a finite percentage ≥ 0", r.tolerance_pct),
        );
    }
    for (op, published) in &r.ops {
        for (what, value) in
            [("latency_us", published.latency_us), ("logical_bw_gbps", published.logical_bw_gbps)]
        {
            if let Some(v) = value
                && !(v.is_finite() && v > 0.0)
            {
                d.error(
                    "reference",
                    &key(&format!("ops.{op}.{what}")),
                    name,
                    format!("{what} = {v}: a published value is finite and > 0"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
