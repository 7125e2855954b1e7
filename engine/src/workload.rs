//! The MoE layer a DeepEP job dispatches and combines, with its sizes, data types and routing
//! kind resolved from the scenario's `[job.workload]` table.

use crate::scenario::schema::{Dtype, RoutingKind, WorkloadSpec};

/// The MoE layer a DeepEP job dispatches and combines.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub tokens_per_rank: u32,
    /// Low-latency buffer capacity T (`num_max_dispatch_tokens_per_rank`, default
    /// `tokens_per_rank`).
    pub max_dispatch_tokens_per_rank: u32,
    pub hidden: u32,
    pub topk: u32,
    pub experts: u32,
    pub dispatch_dtype: Dtype,
    pub combine_dtype: Dtype,
    pub routing: Routing,
    /// (token, slot) entries masked to -1 per rank, as DeepEP's low-latency test does.
    pub masked_selections: u32,
    pub seed: u64,
    /// Low-latency hook mode (`return_recv_hook=True`).
    pub hook: bool,
}

/// How tokens pick their experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// i.i.d. scores, top-k over all experts.
    Uniform,
    /// Top-k among the experts of the `topk_groups` DeepEP nodes (groups of 8 ranks) with the
    /// highest max score (DeepEP's tests; default `min(nodes, 4)`).
    NodeLimited { topk_groups: u32 },
    /// Expert popularity ∝ 1/(i+1)^skew.
    Zipf { skew: f64 },
    /// A recorded routing (`routing_file`): the validator reads the file and the job holds its
    /// table (`DeepEpJob::routing_file`); the seed does not move it.
    File,
}

impl Workload {
    /// `tokens_per_rank` tokens of `hidden` channels to `topk` of `experts` experts with the
    /// scenario format's defaults for everything else (FP8 dispatch, BF16 combine, uniform
    /// routing, seed 1).
    pub fn new(tokens_per_rank: u32, hidden: u32, topk: u32, experts: u32) -> Workload {
        Workload {
            tokens_per_rank,
            max_dispatch_tokens_per_rank: tokens_per_rank,
            hidden,
            topk,
            experts,
            dispatch_dtype: Dtype::Fp8,
            combine_dtype: Dtype::Bf16,
            routing: Routing::Uniform,
            masked_selections: 0,
            seed: 1,
            hook: false,
        }
    }

    /// The workload of a `[job.workload]` table for a job of `num_ranks` ranks.
    pub fn from_spec(w: &WorkloadSpec, num_ranks: u32) -> Workload {
        let groups = crate::deepep::config::num_rdma_ranks(num_ranks);
        Workload {
            tokens_per_rank: w.tokens_per_rank,
            max_dispatch_tokens_per_rank: w.max_dispatch_tokens_per_rank(),
            hidden: w.hidden,
            topk: w.topk,
            experts: w.experts,
            dispatch_dtype: w.dispatch_dtype,
            combine_dtype: w.combine_dtype,
            routing: match w.routing {
                RoutingKind::Uniform => Routing::Uniform,
                RoutingKind::NodeLimited => {
                    Routing::NodeLimited { topk_groups: w.topk_groups.unwrap_or(groups.min(4)) }
                }
                RoutingKind::Zipf => Routing::Zipf { skew: w.skew.unwrap_or(1.0) },
                RoutingKind::File => Routing::File,
            },
            masked_selections: w.masked_selections,
            seed: w.seed,
            hook: w.hook,
        }
    }
}
