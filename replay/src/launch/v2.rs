//! DeepEP V2's `tests/elastic/test_ep.py` against a scenario with an `ElasticBuffer` job: the
//! flags that reproduce it (the buffer's arguments by their own names, the per-call SMs and
//! QPs) and every way the script differs from it (docs/deepep-replay.md lists each rule).

use eptwin_engine::api::{Dtype, ElasticSettings, OpKind};
use eptwin_engine::scenario::schema::RoutingKind;

use crate::script::{ElasticArgs, Script, ScriptArgs};
use crate::subject::{Note, Severity, Subject, SubjectDeepEp, SubjectJob};

use Severity::{Refused, Warning};

/// `ElasticBuffer.__init__`'s defaults the scenario leaves out (elastic.py:228-246): test_ep.py
/// has its own (`--sl-idx 0`, `--prefer-overlap-with-compute 0`), so the launch writes the
/// constructor's values out.
const DEFAULT_SL_IDX: u32 = 3;

/// test_ep.py's flags for the V2 job `d` (its settings `e`).
pub(crate) fn script_args(subject: &Subject, d: &SubjectDeepEp, e: &ElasticSettings) -> ScriptArgs {
    let (w, b) = (&d.workload, &d.buffer);
    let mut args = ScriptArgs::defaults(Script::Elastic);
    args.num_processes = subject.gpus_per_node;
    args.num_tokens = w.tokens_per_rank;
    args.hidden = w.hidden;
    args.num_topk = w.topk;
    args.num_experts = w.experts;
    args.elastic = Some(ElasticArgs {
        num_sms: if e.num_sms_auto { 0 } else { e.num_sms },
        num_qps: b.num_qps.unwrap_or(0),
        num_allocated_qps: b.num_allocated_qps.unwrap_or(0),
        num_gpu_timeout_secs: e.num_gpu_timeout_secs,
        num_cpu_timeout_secs: e.num_cpu_timeout_secs,
        sl_idx: b.sl_idx.unwrap_or(DEFAULT_SL_IDX),
        allow_hybrid_mode: b.allow_hybrid_mode.unwrap_or(true),
        allow_multiple_reduction: e.allow_multiple_reduction,
        prefer_overlap_with_compute: e.prefer_overlap_with_compute,
        deterministic: e.deterministic,
    });
    args
}

/// Every way test_ep.py differs from the V2 job `job` (`d` its DeepEP part).
pub(crate) fn job_notes(
    subject: &Subject,
    job: &SubjectJob,
    d: &SubjectDeepEp,
    notes: &mut Vec<Note>,
) {
    let s = Script::Elastic.file_name();
    let mut note = |severity, key: &str, scenario: String, script_value: String, why: &str| {
        notes.push(Note {
            severity,
            job: Some(job.name.clone()),
            key: key.into(),
            scenario_value: scenario,
            script_value,
            why: why.into(),
        })
    };
    if !job.all_ranks {
        let total = subject.nodes * subject.gpus_per_node * subject.ranks_per_gpu;
        note(
            Refused,
            "job.ranks",
            format!("{} of the cluster's {total} ranks", job.num_ranks),
            format!("{s} uses every GPU of every node"),
            "the script takes all local GPUs of each node",
        );
    }
    for op in &job.ops {
        if !matches!(op, OpKind::Dispatch | OpKind::Combine) {
            note(
                Refused,
                "job.workload.ops",
                format!("{op:?}").to_lowercase(),
                format!("{s} times dispatch and combine"),
                "the script times nothing else",
            );
        }
    }
    let (w, b) = (&d.workload, &d.buffer);
    // test_ep.py draws |N(0,1)| + 1 scores and takes the top-k over every expert.
    if w.routing != RoutingKind::Uniform {
        let scenario = match w.routing {
            RoutingKind::Zipf => format!("zipf (skew {})", w.skew.unwrap_or_default()),
            RoutingKind::NodeLimited => {
                format!("node-limited (topk_groups {})", w.topk_groups.unwrap_or_default())
            }
            RoutingKind::File => {
                format!("file ({})", w.routing_file.as_deref().unwrap_or_default())
            }
            RoutingKind::Uniform => "uniform".into(),
        };
        note(
            Refused,
            "job.workload.routing",
            scenario,
            format!("{s} uses random scores, top-k over all experts (uniform)"),
            "the replay would route tokens differently",
        );
    }
    if w.masked_selections != 0 && w.routing != RoutingKind::File {
        note(
            Warning,
            "job.workload.masked_selections",
            w.masked_selections.to_string(),
            format!("{s} uses 0"),
            "a few (token, slot) entries more or fewer: under 1 % of the selections",
        );
    }
    if w.combine_dtype != Dtype::Bf16 {
        note(
            Refused,
            "job.workload.combine_dtype",
            format!("{:?}", w.combine_dtype).to_lowercase(),
            format!("{s} combines bf16"),
            "the replay would time another data type",
        );
    }
    if let Some(bytes) = b.num_bytes {
        note(
            Warning,
            "job.buffer.num_bytes",
            bytes.bytes().to_string(),
            format!("{s} sizes the buffer from --num-tokens, --hidden and --num-topk"),
            "the kernels' layouts depend on the tokens, not on spare bytes",
        );
    }
    if let Some(max) = b.num_max_tokens_per_rank
        && max != w.tokens_per_rank
    {
        note(
            Warning,
            "job.buffer.num_max_tokens_per_rank",
            max.to_string(),
            format!("{s} uses --num-tokens = {}", w.tokens_per_rank),
            "the script sizes its buffer for the tokens it sends",
        );
    }
}
