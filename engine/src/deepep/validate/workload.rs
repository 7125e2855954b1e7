//! The workload's shape: tokens, experts, top-k, dtypes, routing, ops, hook mode.

use super::Job;
use crate::deepep::config::{EpMode, num_rdma_ranks};
use crate::diag::Diagnostics;
use crate::routing_file::{self, Expected, LoadedRouting};
use crate::scenario::schema::{BufferSpec, Dtype, OpKind, RoutingKind, WorkloadSpec};

/// `NUM_MAX_LOCAL_EXPERTS` (configs.cuh).
const NUM_MAX_LOCAL_EXPERTS: u32 = 1024;
/// Normal kernels: `num_topk ≤ 32` (intranode.cu:237, internode.cu:514); LL: ≤ 11.
const NORMAL_MAX_TOPK: u32 = 32;
const LL_MAX_TOPK: u32 = 11;

/// What the mode's rules need of a usable workload.
pub(super) struct Shape {
    pub experts_divisible: bool,
    pub local_experts: u32,
}
/// The workload's rules in order; `None` when hidden, experts or top-k is zero (reported):
/// nothing else can be checked.
pub(super) fn check(
    job: &Job<'_>,
    b: &BufferSpec,
    w: &WorkloadSpec,
    mode: EpMode,
    d: &mut Diagnostics<'_>,
) -> Option<Shape> {
    let shape = check_shape(job, b, w, mode, d)?;
    check_dtypes(job, b, w, d);
    check_routing(job, w, d);
    check_ops(job, b, w, d);
    Some(shape)
}

fn wkey(job: &Job<'_>, k: &str) -> String {
    format!("{}.workload.{k}", job.prefix)
}

/// Tokens, hidden, experts and top-k against the rank count and the kernels' limits.
fn check_shape(
    job: &Job<'_>,
    b: &BufferSpec,
    w: &WorkloadSpec,
    mode: EpMode,
    d: &mut Diagnostics<'_>,
) -> Option<Shape> {
    let (prefix, name) = (job.prefix.as_str(), job.name());
    let wkey = |k: &str| wkey(job, k);
    let n = job.ranks.len() as u32;
    let mode_word = match mode {
        EpMode::Intranode => "normal intranode",
        EpMode::Internode => "normal internode",
        EpMode::LowLatency => "low-latency",
    };
    if w.tokens_per_rank == 0 {
        d.error("tokens", &wkey("tokens_per_rank"), name, "tokens_per_rank must be ≥ 1".into());
    }
    if w.hidden == 0 || w.experts == 0 || w.topk == 0 {
        d.error(
            "workload-shape",
            &format!("{prefix}.workload"),
            name,
            "hidden, experts and topk must all be ≥ 1".into(),
        );
        return None;
    }
    let divisible = w.experts.is_multiple_of(n);
    if !divisible {
        d.error("experts-divisible", &wkey("experts"), name, format!("{} experts over {n} ranks: num_experts % num_ranks must be 0 (deep_ep.cpp:1555; layout)", w.experts));
    }
    let local_experts = w.experts / n;
    if local_experts > NUM_MAX_LOCAL_EXPERTS {
        d.error(
            "local-experts",
            &wkey("experts"),
            name,
            format!(
                "{local_experts} experts per rank > NUM_MAX_LOCAL_EXPERTS = 1024 (deep_ep.cpp:522)"
            ),
        );
    }
    if w.topk > w.experts {
        d.error("topk", &wkey("topk"), name, format!("top-{} of {} experts", w.topk, w.experts));
    }
    let max_topk = if b.low_latency_mode { LL_MAX_TOPK } else { NORMAL_MAX_TOPK };
    if w.topk > max_topk {
        d.error(
            "topk",
            &wkey("topk"),
            name,
            format!(
                "topk = {}: {mode_word} kernels support at most {max_topk} ({})",
                w.topk,
                if b.low_latency_mode {
                    "internode_ll.cu:494-502"
                } else {
                    "intranode.cu:237, internode.cu:514 device trap"
                }
            ),
        );
    }
    Some(Shape { experts_divisible: divisible, local_experts })
}

/// Dispatch in FP8 or BF16; combine in BF16, or LogFMT in low-latency mode.
fn check_dtypes(job: &Job<'_>, b: &BufferSpec, w: &WorkloadSpec, d: &mut Diagnostics<'_>) {
    let (name, wkey) = (job.name(), |k: &str| wkey(job, k));
    if w.dispatch_dtype == Dtype::Logfmt {
        d.error(
            "dtype",
            &wkey("dispatch_dtype"),
            name,
            "LogFMT is a combine encoding; dispatch is \"fp8\" or \"bf16\"".into(),
        );
    }
    match w.combine_dtype {
        Dtype::Fp8 => d.error(
            "dtype",
            &wkey("combine_dtype"),
            name,
            "DeepEP combines in \"bf16\" (or \"logfmt\" in low-latency mode)".into(),
        ),
        Dtype::Logfmt if !b.low_latency_mode => d.error(
            "dtype",
            &wkey("combine_dtype"),
            name,
            "LogFMT combine exists only in low-latency mode (use_logfmt)".into(),
        ),
        _ => {}
    }
}

/// The routing's parameters and the masked selections.
pub(super) fn check_routing(job: &Job<'_>, w: &WorkloadSpec, d: &mut Diagnostics<'_>) {
    let (name, wkey) = (job.name(), |k: &str| wkey(job, k));
    let nodes = num_rdma_ranks(job.ranks.len() as u32);
    match w.routing {
        RoutingKind::NodeLimited => match w.topk_groups {
            Some(0) => {
                d.error("topk-groups", &wkey("topk_groups"), name, "topk_groups must be ≥ 1".into())
            }
            Some(g) if g > nodes => d.error(
                "topk-groups",
                &wkey("topk_groups"),
                name,
                format!("topk_groups = {g} but the job spans only {nodes} DeepEP node(s)"),
            ),
            Some(g) if g * (w.experts / nodes) < w.topk => d.error(
                "topk-groups",
                &wkey("topk_groups"),
                name,
                format!(
                    "{g} node(s) x {} experts per node cannot supply top-{}",
                    w.experts / nodes,
                    w.topk
                ),
            ),
            _ => {}
        },
        RoutingKind::Zipf => {
            if !w.skew.is_some_and(|s| s > 0.0 && s.is_finite()) {
                d.error(
                    "zipf-skew",
                    &wkey("skew"),
                    name,
                    "routing = \"zipf\" needs skew > 0 (the Zipf exponent)".into(),
                );
            }
        }
        RoutingKind::File => {
            if w.routing_file.is_none() {
                d.error(
                    "routing-file",
                    &wkey("routing"),
                    name,
                    "routing = \"file\" needs routing_file (the JSON file of the recorded routing)"
                        .into(),
                );
            }
            if w.masked_selections > 0 {
                d.error(
                    "routing-file",
                    &wkey("masked_selections"),
                    name,
                    "a file routing is replayed as recorded: mask selections in the file (-1)"
                        .into(),
                );
            }
            if w.skew.is_some() {
                d.advisory(
                    "zipf-skew",
                    &wkey("skew"),
                    name,
                    "skew is used only with routing = \"zipf\"".into(),
                );
            }
        }
        RoutingKind::Uniform => {}
    }
    if w.routing_file.is_some() && w.routing != RoutingKind::File {
        d.error(
            "routing-file",
            &wkey("routing_file"),
            name,
            "routing_file is read only with routing = \"file\"".into(),
        );
    }
    if w.topk_groups.is_some() && w.routing != RoutingKind::NodeLimited {
        d.advisory(
            "topk-groups",
            &wkey("topk_groups"),
            name,
            "topk_groups is used only with routing = \"node-limited\"".into(),
        );
    }
    if w.masked_selections as u64 > w.tokens_per_rank as u64 * w.topk as u64 {
        d.error(
            "masked",
            &wkey("masked_selections"),
            name,
            "more masked selections than (token, slot) entries".into(),
        );
    }
}

/// What runs: iterations, the ops and their order, hook mode.
pub(super) fn check_ops(job: &Job<'_>, b: &BufferSpec, w: &WorkloadSpec, d: &mut Diagnostics<'_>) {
    let (name, wkey) = (job.name(), |k: &str| wkey(job, k));
    if w.iterations == 0 {
        d.error("iterations", &wkey("iterations"), name, "iterations must be ≥ 1".into());
    }
    if w.ops.is_empty() {
        d.error("ops", &wkey("ops"), name, "ops is empty: nothing to run".into());
    }
    for (i, op) in w.ops.iter().enumerate() {
        match op {
            OpKind::Transfer => d.error("ops", &wkey("ops"), name, "\"transfer\" belongs to [job.traffic] jobs; DeepEP jobs run dispatch, combine, barrier".into()),
            OpKind::Combine if !w.ops[..i].contains(&OpKind::Dispatch) => {
                d.error("ops", &wkey("ops"), name, "combine needs the handle of an earlier dispatch: put \"dispatch\" before \"combine\"".into())
            }
            _ => {}
        }
    }
    if w.hook && !b.low_latency_mode {
        d.error(
            "hook",
            &wkey("hook"),
            name,
            "hook mode (return_recv_hook) exists only for low-latency kernels".into(),
        );
    }
    if w.num_max_dispatch_tokens_per_rank.is_some() && !b.low_latency_mode {
        d.advisory(
            "ll-only",
            &wkey("num_max_dispatch_tokens_per_rank"),
            name,
            "num_max_dispatch_tokens_per_rank sizes low-latency buffers only".into(),
        );
    }
}

/// A file routing's table, read and checked against the job's shape; `None` (with the
/// error at `routing_file`, naming the file and where in it) when it cannot be used, or when
/// the routing is not a file's. A relative path is relative to the scenario file's directory.
pub(super) fn routing_file(
    job: &Job<'_>,
    w: &WorkloadSpec,
    d: &mut Diagnostics<'_>,
) -> Option<LoadedRouting> {
    let file = w.routing_file.as_deref().filter(|_| w.routing == RoutingKind::File)?;
    let path = routing_file::resolve(d.source().file(), file);
    let expect = Expected {
        num_ranks: job.ranks.len() as u32,
        tokens_per_rank: w.tokens_per_rank,
        topk: w.topk,
        num_experts: w.experts,
    };
    // Read where it is on disk, named as the scenario's file names it (results record that).
    match routing_file::load(&d.source().on_disk(&path), expect) {
        Ok(loaded) => Some(LoadedRouting { file: path.display().to_string(), ..loaded }),
        Err(e) => {
            d.error("routing-file", &wkey(job, "routing_file"), job.name(), e.to_string());
            None
        }
    }
}
