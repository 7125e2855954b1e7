//! DeepEP V1's test scripts against a scenario: the flags that reproduce its DeepEP job and
//! every way the scripts differ from it (docs/deepep-replay.md lists each rule).

use eptwin_engine::deepep::config::{
    Direction, EpMode, low_latency_rdma_size_hint, tuned, tuned_rank_counts,
};
use eptwin_engine::scenario::schema::{Dtype, NvlinkKind, OpKind, RoutingKind};

use crate::script::{Script, ScriptArgs};
use crate::subject::{Note, Severity, Subject, SubjectDeepEp, SubjectJob};

use Severity::{Refused, Warning};

/// SMs the normal scripts tune at.
pub const SCRIPT_NORMAL_SMS: u32 = 24;
/// `Buffer.num_sms` default (what LL-only scenarios leave untouched).
const DEFAULT_NUM_SMS: u32 = 20;
/// The normal scripts' buffers: `int(2e9)` NVL bytes, `int(1e9)` RDMA bytes (internode).
pub const SCRIPT_NVL_BYTES: u64 = 2_000_000_000;
pub const SCRIPT_RDMA_BYTES: u64 = 1_000_000_000;
/// `num_qps_per_rank` of test_internode.py (without `--test-ll-compatibility`) and
/// test_intranode.py.
const INTERNODE_QPS: u32 = 24;
const INTRANODE_QPS: u32 = 1;
/// (token, slot) entries test_low_latency.py masks to -1.
pub const SCRIPT_LL_MASKED: u32 = 10;

/// The chunk sizes the normal scripts' tuning loops try (docs/deepep-replay.md, "The scripts"): a scenario
/// Config outside them has no per-config line, and the import falls back to the Best line.
fn in_tuning_sweep(script: Script, dispatch: bool, nvl_chunk: u32, rdma_chunk: u32) -> bool {
    match (script, dispatch) {
        (Script::Intranode, true) => (4..=32).contains(&nvl_chunk) && nvl_chunk.is_multiple_of(2),
        (Script::Intranode, false) => (1..=16).contains(&nvl_chunk),
        (Script::Internode, true) => {
            (4..=44).contains(&nvl_chunk)
                && nvl_chunk.is_multiple_of(4)
                && (4..=32).contains(&rdma_chunk)
                && rdma_chunk.is_multiple_of(4)
        }
        (Script::Internode, false) => {
            (1..=7).contains(&nvl_chunk)
                && (8..=32).contains(&rdma_chunk)
                && rdma_chunk.is_multiple_of(4)
        }
        (Script::LowLatency, _) => true,
    }
}

/// The scripts' flags for `job`'s DeepEP part `d`.
pub(crate) fn script_args(subject: &Subject, d: &SubjectDeepEp, script: Script) -> ScriptArgs {
    let w = &d.workload;
    ScriptArgs {
        script,
        num_processes: subject.gpus_per_node,
        num_tokens: w.tokens_per_rank,
        hidden: w.hidden,
        num_topk: w.topk,
        num_experts: w.experts,
        num_topk_groups: (script == Script::Internode).then(|| match w.routing {
            RoutingKind::NodeLimited => w.topk_groups.unwrap_or(subject.nodes.min(4)),
            // Keeping every node is plain top-k over all experts.
            RoutingKind::Uniform | RoutingKind::Zipf | RoutingKind::File => subject.nodes,
        }),
        allow_mnnvl: d.buffer.allow_mnnvl && script != Script::Internode,
        use_fabric: d.buffer.use_fabric && script == Script::Intranode,
        disable_nvlink: !d.buffer.allow_nvlink_for_low_latency_mode && script == Script::LowLatency,
        use_logfmt: w.combine_dtype == Dtype::Logfmt,
        other: Vec::new(),
    }
}

/// The notes of one job: its name and script, and where they go.
struct JobNotes<'a> {
    job: &'a SubjectJob,
    script: Script,
    notes: &'a mut Vec<Note>,
}

impl JobNotes<'_> {
    fn note(
        &mut self,
        severity: Severity,
        key: &str,
        scenario: String,
        script_value: String,
        why: &str,
    ) {
        self.notes.push(Note {
            severity,
            job: Some(self.job.name.clone()),
            key: key.into(),
            scenario_value: scenario,
            script_value,
            why: why.into(),
        })
    }
}

/// Every way `script` differs from the DeepEP job `job` (`d` its DeepEP part).
pub(crate) fn job_notes(
    subject: &Subject,
    job: &SubjectJob,
    d: &SubjectDeepEp,
    script: Script,
    notes: &mut Vec<Note>,
) {
    let n = &mut JobNotes { job, script, notes };
    shape_notes(subject, d, n);
    workload_notes(d, n);
    if script == Script::LowLatency {
        low_latency_notes(d, n);
    } else {
        normal_notes(d, n);
        config_notes(d, n);
    }
    buffer_flag_notes(subject, d, n);
}

/// The cluster and the job's ranks and ops against what the script runs.
fn shape_notes(subject: &Subject, d: &SubjectDeepEp, n: &mut JobNotes<'_>) {
    let (job, script) = (n.job, n.script);
    let s = script.file_name();
    let ranks = job.num_ranks;
    if !job.all_ranks {
        let total = subject.nodes * subject.gpus_per_node * subject.ranks_per_gpu;
        n.note(
            Refused,
            "job.ranks",
            format!("{ranks} of the cluster's {total} ranks"),
            format!("{s} uses every GPU of every node"),
            "the scripts take all local GPUs of each node",
        );
    }
    for op in &job.ops {
        if !matches!(op, OpKind::Dispatch | OpKind::Combine) {
            n.note(
                Refused,
                "job.workload.ops",
                format!("{op:?}").to_lowercase(),
                format!("{s} times dispatch and combine"),
                "the scripts time nothing else",
            );
        }
    }
    match d.mode {
        EpMode::Intranode if subject.nodes > 1 => n.note(
            Refused,
            "cluster.nodes",
            subject.nodes.to_string(),
            format!("{s} runs on 1"),
            "the intranode script runs the ranks of one node",
        ),
        EpMode::Internode if subject.gpus_per_node != 8 => n.note(
            Refused,
            "cluster.gpus_per_node",
            subject.gpus_per_node.to_string(),
            format!("{s} asserts 8 (local ranks)"),
            "the normal internode kernels need 8 GPUs per node",
        ),
        _ => {}
    }
}

/// Routing, masking and data types against what the script draws and times.
fn workload_notes(d: &SubjectDeepEp, n: &mut JobNotes<'_>) {
    let script = n.script;
    let s = script.file_name();
    let w = &d.workload;
    // Routing: the scripts draw |N(0,1)| + 1 scores and take the top-k (test_internode.py
    // first keeps the top --num-topk-groups nodes). They take no routing from outside, so a
    // recorded routing (`routing = "file"`) cannot be replayed either, even one recorded from
    // the same script: the draw depends on torch's version and the GPU's SM count.
    let routing_ok = match (w.routing, script) {
        (RoutingKind::Uniform, _) => true,
        (RoutingKind::NodeLimited, Script::Internode) => true,
        (RoutingKind::NodeLimited | RoutingKind::Zipf | RoutingKind::File, _) => false,
    };
    if !routing_ok {
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
        let theirs = if script == Script::Internode {
            "random scores, top --num-topk-groups nodes, then top-k"
        } else {
            "random scores, top-k over all experts (uniform)"
        };
        n.note(
            Refused,
            "job.workload.routing",
            scenario,
            format!("{s} uses {theirs}"),
            "the replay would route tokens differently",
        );
    }
    let script_masked = if script == Script::LowLatency { SCRIPT_LL_MASKED } else { 0 };
    // A file routing carries its own masked entries (the refusal above already covers it).
    if w.masked_selections != script_masked && w.routing != RoutingKind::File {
        n.note(
            Warning,
            "job.workload.masked_selections",
            w.masked_selections.to_string(),
            format!("{s} uses {script_masked}"),
            "a few (token, slot) entries more or fewer: under 1 % of the selections",
        );
    }
    // Data types: the LL benchmark dispatches FP8 and combines BF16 (LogFMT with
    // --use-logfmt); the normal scripts time FP8 and BF16 dispatch and BF16 combine.
    if script == Script::LowLatency && w.dispatch_dtype != Dtype::Fp8 {
        n.note(
            Refused,
            "job.workload.dispatch_dtype",
            dtype_name(w.dispatch_dtype).into(),
            format!("{s} uses fp8 (the benchmark dispatches with use_fp8=True)"),
            "the replay would time another data type",
        );
    }
    let combine_ok = match script {
        Script::LowLatency => matches!(w.combine_dtype, Dtype::Bf16 | Dtype::Logfmt),
        Script::Intranode | Script::Internode => w.combine_dtype == Dtype::Bf16,
    };
    if !combine_ok {
        n.note(
            Refused,
            "job.workload.combine_dtype",
            dtype_name(w.combine_dtype).into(),
            format!("{s} uses bf16"),
            "the replay would time another data type",
        );
    }
}

/// The low-latency script's buffer and sizes.
fn low_latency_notes(d: &SubjectDeepEp, n: &mut JobNotes<'_>) {
    let s = n.script.file_name();
    let (b, w) = (&d.buffer, &d.workload);
    let ranks = n.job.num_ranks;
    let max_tokens = w.max_dispatch_tokens_per_rank();
    if max_tokens != w.tokens_per_rank {
        n.note(
            Warning,
            "job.workload.num_max_dispatch_tokens_per_rank",
            max_tokens.to_string(),
            format!("{s} uses --num-tokens = {}", w.tokens_per_rank),
            "the script sizes its buffer for the tokens it sends; the kernels move the same messages",
        );
    }
    let hint = low_latency_rdma_size_hint(w.tokens_per_rank, w.hidden, w.experts);
    if b.num_rdma_bytes.bytes() != hint {
        n.note(
            Warning,
            "job.buffer.num_rdma_bytes",
            b.num_rdma_bytes.bytes().to_string(),
            format!("{s} uses {hint} (get_low_latency_rdma_size_hint)"),
            "the low-latency layout depends on tokens, hidden and experts only; the rest of a buffer is unused",
        );
    }
    if b.num_nvl_bytes.bytes() != 0 {
        n.note(
            Warning,
            "job.buffer.num_nvl_bytes",
            b.num_nvl_bytes.bytes().to_string(),
            format!("{s} uses 0"),
            "the low-latency kernels do not use the NVL buffer",
        );
    }
    let qps = w.experts / ranks.max(1);
    if b.num_qps_per_rank != qps {
        n.note(
            Refused,
            "job.buffer.num_qps_per_rank",
            b.num_qps_per_rank.to_string(),
            format!("{s} uses {qps} (experts / ranks = {} / {ranks})", w.experts),
            "the low-latency kernels spread messages over the QPs; another count is another measurement",
        );
    }
    if b.num_sms != DEFAULT_NUM_SMS {
        n.note(
            Warning,
            "job.buffer.num_sms",
            b.num_sms.to_string(),
            format!("{s} uses {DEFAULT_NUM_SMS}"),
            "the low-latency kernels size their own grids; num_sms has no effect on them",
        );
    }
}

/// The normal scripts' SMs, rank counts, buffers and QPs.
fn normal_notes(d: &SubjectDeepEp, n: &mut JobNotes<'_>) {
    let script = n.script;
    let s = script.file_name();
    let b = &d.buffer;
    let ranks = n.job.num_ranks;
    if b.num_sms != SCRIPT_NORMAL_SMS {
        n.note(
            Refused,
            "job.buffer.num_sms",
            b.num_sms.to_string(),
            format!("{s} uses {SCRIPT_NORMAL_SMS}"),
            "the scripts tune and print at 24 SMs only",
        );
    }
    if tuned(Direction::Dispatch, ranks).is_none() {
        n.note(
            Refused,
            "job.ranks",
            format!("{ranks} ranks"),
            format!(
                "{s} needs a rank count of DeepEP's tuned table ({})",
                tuned_rank_counts().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
            ),
            "Buffer.get_dispatch_config / get_combine_config raise for other counts",
        );
    }
    if b.num_nvl_bytes.bytes() != SCRIPT_NVL_BYTES {
        n.note(
            Warning,
            "job.buffer.num_nvl_bytes",
            b.num_nvl_bytes.bytes().to_string(),
            format!("{s} uses {SCRIPT_NVL_BYTES} (int(2e9))"),
            "the normal kernels' rings are sized by the Config, not by the buffer",
        );
    }
    let script_rdma = if script == Script::Internode { SCRIPT_RDMA_BYTES } else { 0 };
    if b.num_rdma_bytes.bytes() != script_rdma {
        n.note(
            Warning,
            "job.buffer.num_rdma_bytes",
            b.num_rdma_bytes.bytes().to_string(),
            format!("{s} uses {script_rdma}"),
            "the normal kernels' rings are sized by the Config, not by the buffer",
        );
    }
    let script_qps = if script == Script::Internode { INTERNODE_QPS } else { INTRANODE_QPS };
    if b.num_qps_per_rank != script_qps {
        let (severity, why) = match script {
            Script::Intranode => {
                (Warning, "NVSHMEM is not initialised intranode: no QPs are created")
            }
            _ if b.num_qps_per_rank > script_qps => (
                Warning,
                "at 24 SMs the kernels use QPs 0-23 (channel and channel + 12) either way",
            ),
            _ => (Refused, "fewer QPs than 2 x channels change which QP each channel uses"),
        };
        n.note(
            severity,
            "job.buffer.num_qps_per_rank",
            b.num_qps_per_rank.to_string(),
            format!("{s} uses {script_qps}"),
            why,
        );
    }
    if !b.allow_nvlink_for_low_latency_mode {
        n.note(
            Warning,
            "job.buffer.allow_nvlink_for_low_latency_mode",
            "false".into(),
            format!("{s} uses true (no flag)"),
            "NVSHMEM_DISABLE_P2P does not change the normal kernels' paths",
        );
    }
}

/// The normal scripts' tuning sweeps against the scenario's Configs.
fn config_notes(d: &SubjectDeepEp, n: &mut JobNotes<'_>) {
    let script = n.script;
    let s = script.file_name();
    let b = &d.buffer;
    for (direction, config, explicit) in [
        ("dispatch", d.dispatch_config, &b.dispatch_config),
        ("combine", d.combine_config, &b.combine_config),
    ] {
        if explicit.num_max_nvl_chunked_recv_tokens.is_some()
            || explicit.num_max_rdma_chunked_recv_tokens.is_some()
        {
            n.note(
                Warning,
                &format!("job.buffer.{direction}_config"),
                "explicit ring sizes (*_recv_tokens)".into(),
                format!("{s} uses its own ring sizes"),
                "the tuning lines vary the send chunks only",
            );
        }
        let Some(c) = config else { continue };
        let (nvl, rdma) = (c.num_max_nvl_chunked_send_tokens, c.num_max_rdma_chunked_send_tokens);
        if !in_tuning_sweep(script, direction == "dispatch", nvl, rdma) {
            let chunks = if script == Script::Internode {
                format!("NVL chunk {nvl}, RDMA chunk {rdma}")
            } else {
                format!("NVL chunk {nvl}")
            };
            n.note(
                Warning,
                &format!("job.buffer.{direction}_config"),
                chunks,
                format!("{s} tunes other chunk sizes (no line for it)"),
                "the import takes the script's Best line for this op instead",
            );
        }
    }
}

/// `Buffer` flags the script sets otherwise.
fn buffer_flag_notes(subject: &Subject, d: &SubjectDeepEp, n: &mut JobNotes<'_>) {
    let script = n.script;
    let s = script.file_name();
    let b = &d.buffer;
    if b.allow_mnnvl && script == Script::Internode {
        let severity = if subject.nvlink == NvlinkKind::Mnnvl { Refused } else { Warning };
        n.note(
            severity,
            "job.buffer.allow_mnnvl",
            "true".into(),
            format!("{s} uses false (no flag)"),
            if severity == Refused {
                "across an MNNVL domain NVSHMEM would take other paths"
            } else {
                "without multi-node NVLink NVSHMEM_DISABLE_MNNVL changes nothing"
            },
        );
    }
    if b.use_fabric && script != Script::Intranode {
        n.note(
            Warning,
            "job.buffer.use_fabric",
            "true".into(),
            format!("{s} uses false (no flag)"),
            "fabric handles only change how the NVL buffer is shared",
        );
    }
    if b.enable_shrink {
        n.note(
            Warning,
            "job.buffer.enable_shrink",
            "true".into(),
            format!("{s} uses false (--shrink-test would also fail ranks on purpose)"),
            "the shrink buffers are not on the timed path",
        );
    }
}

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::Fp8 => "fp8",
        Dtype::Bf16 => "bf16",
        Dtype::Logfmt => "logfmt",
    }
}
