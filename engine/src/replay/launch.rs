//! From a scenario to the command lines that run DeepEP's matching test script on every node
//! (DeepEP's rendezvous: `WORLD_SIZE` = nodes, `RANK` = node rank), or the reasons the
//! scripts cannot replay it. docs/deepep-replay.md lists every rule below.

use std::fmt::Write;

use super::{Note, Script, ScriptArgs, Severity, Subject, SubjectDeepEp, SubjectJob};
use crate::deepep::config::{
    Direction, EpMode, low_latency_rdma_size_hint, tuned, tuned_rank_counts,
};
use crate::deepep::env::shell_quote;
use crate::scenario::schema::{Dtype, NvlinkKind, OpKind, RoutingKind};

/// DeepEP's default rendezvous port (`utils.init_dist`).
pub const DEFAULT_MASTER_PORT: u16 = 8361;
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

/// How the launch text is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchFormat {
    /// Shell lines, one block per node (or one block for every node with `nodes_from_slurm`).
    Shell { nodes_from_slurm: bool },
    /// A ready `sbatch` script: one task per node, `srun` starts the script on each.
    Slurm,
}

/// A scenario made into a DeepEP script run: script, flags, environment, node count, and the
/// differences that do not change what is measured.
#[derive(Debug, Clone)]
pub struct Launch {
    pub scenario_name: String,
    pub scenario_sha256: String,
    pub job: String,
    pub script: Script,
    /// `<deepep_dir>/tests/<script>`.
    pub script_path: String,
    pub args: ScriptArgs,
    pub nodes: u32,
    /// Variables the user must set (the job's own; DeepEP writes the rest itself).
    pub env: Vec<(String, String)>,
    pub warnings: Vec<Note>,
}

/// The launch of `subject`, or every note (refusals and warnings) when the scripts cannot
/// replay it as written.
pub fn launch(subject: &Subject, deepep_dir: &str) -> Result<Launch, Vec<Note>> {
    let mut notes = Vec::new();
    let refuse = |notes: &mut Vec<Note>, key: &str, scenario: String, script: &str, why: &str| {
        notes.push(Note {
            severity: Severity::Refused,
            job: None,
            key: key.into(),
            scenario_value: scenario,
            script_value: script.into(),
            why: why.into(),
        })
    };
    if subject.jobs.len() > 1 {
        let names: Vec<&str> = subject.jobs.iter().map(|j| j.name.as_str()).collect();
        refuse(
            &mut notes,
            "[[job]]",
            format!("{} jobs ({})", names.len(), names.join(", ")),
            "the scripts run one DeepEP job",
            "the jobs share the fabric in the scenario; one script alone measures no contention",
        );
    }
    if !subject.faults.is_empty() {
        refuse(
            &mut notes,
            "[[fault]]",
            format!("{} fault(s) ({})", subject.faults.len(), subject.faults.join(", ")),
            "the scripts run a healthy cluster",
            "the faults are what the scenario measures",
        );
    }
    if subject.ranks_per_gpu > 1 {
        refuse(
            &mut notes,
            "cluster.ranks_per_gpu",
            subject.ranks_per_gpu.to_string(),
            "the scripts use 1 (one process per GPU, torch.cuda.set_device(local_rank))",
            "ranks that share a GPU cannot be started by the scripts",
        );
    }
    let mut replayed: Option<(&SubjectJob, &SubjectDeepEp)> = None;
    for job in &subject.jobs {
        match &job.deepep {
            None => notes.push(Note {
                severity: Severity::Refused,
                job: Some(job.name.clone()),
                key: "job.traffic".into(),
                scenario_value: "background traffic".into(),
                script_value: "the scripts run DeepEP kernels only".into(),
                why: "the traffic is part of what the scenario measures".into(),
            }),
            Some(d) => {
                job_notes(subject, job, d, &mut notes);
                replayed.get_or_insert((job, d));
            }
        }
    }
    let Some((job, d)) = replayed else { return Err(notes) };
    if notes.iter().any(|n| n.severity == Severity::Refused) {
        return Err(notes);
    }
    let script = Script::for_mode(d.mode);
    let w = &d.workload;
    let args = ScriptArgs {
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
    };
    let dir = deepep_dir.trim_end_matches('/');
    Ok(Launch {
        scenario_name: subject.name.clone(),
        scenario_sha256: subject.sha256.clone(),
        job: job.name.clone(),
        script,
        script_path: format!("{}/tests/{}", if dir.is_empty() { "." } else { dir }, script),
        args,
        nodes: subject.nodes,
        env: job.user_env.clone(),
        warnings: notes,
    })
}

fn job_notes(subject: &Subject, job: &SubjectJob, d: &SubjectDeepEp, notes: &mut Vec<Note>) {
    let script = Script::for_mode(d.mode);
    let s = script.file_name();
    let mut note = |severity: Severity, key: &str, scenario: String, script_value: String, why| {
        notes.push(Note {
            severity,
            job: Some(job.name.clone()),
            key: key.into(),
            scenario_value: scenario,
            script_value,
            why: String::from(why),
        })
    };
    use Severity::{Refused, Warning};
    let b = &d.buffer;
    let w = &d.workload;
    let n = job.num_ranks;
    if !job.all_ranks {
        let total = subject.nodes * subject.gpus_per_node * subject.ranks_per_gpu;
        note(
            Refused,
            "job.ranks",
            format!("{n} of the cluster's {total} ranks"),
            format!("{s} uses every GPU of every node"),
            "the scripts take all local GPUs of each node",
        );
    }
    for op in &job.ops {
        if !matches!(op, OpKind::Dispatch | OpKind::Combine) {
            note(
                Refused,
                "job.workload.ops",
                format!("{op:?}").to_lowercase(),
                format!("{s} times dispatch and combine"),
                "the scripts time nothing else",
            );
        }
    }
    match d.mode {
        EpMode::Intranode if subject.nodes > 1 => note(
            Refused,
            "cluster.nodes",
            subject.nodes.to_string(),
            format!("{s} runs on 1"),
            "the intranode script runs the ranks of one node",
        ),
        EpMode::Internode if subject.gpus_per_node != 8 => note(
            Refused,
            "cluster.gpus_per_node",
            subject.gpus_per_node.to_string(),
            format!("{s} asserts 8 (local ranks)"),
            "the normal internode kernels need 8 GPUs per node",
        ),
        _ => {}
    }
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
        note(
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
        note(
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
        note(
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
        note(
            Refused,
            "job.workload.combine_dtype",
            dtype_name(w.combine_dtype).into(),
            format!("{s} uses bf16"),
            "the replay would time another data type",
        );
    }
    if script == Script::LowLatency {
        let max_tokens = w.max_dispatch_tokens_per_rank();
        if max_tokens != w.tokens_per_rank {
            note(
                Warning,
                "job.workload.num_max_dispatch_tokens_per_rank",
                max_tokens.to_string(),
                format!("{s} uses --num-tokens = {}", w.tokens_per_rank),
                "the script sizes its buffer for the tokens it sends; the kernels move the same messages",
            );
        }
        let hint = low_latency_rdma_size_hint(w.tokens_per_rank, w.hidden, w.experts);
        if b.num_rdma_bytes.bytes() != hint {
            note(
                Warning,
                "job.buffer.num_rdma_bytes",
                b.num_rdma_bytes.bytes().to_string(),
                format!("{s} uses {hint} (get_low_latency_rdma_size_hint)"),
                "the low-latency layout depends on tokens, hidden and experts only; the rest of a buffer is unused",
            );
        }
        if b.num_nvl_bytes.bytes() != 0 {
            note(
                Warning,
                "job.buffer.num_nvl_bytes",
                b.num_nvl_bytes.bytes().to_string(),
                format!("{s} uses 0"),
                "the low-latency kernels do not use the NVL buffer",
            );
        }
        let qps = w.experts / n.max(1);
        if b.num_qps_per_rank != qps {
            note(
                Refused,
                "job.buffer.num_qps_per_rank",
                b.num_qps_per_rank.to_string(),
                format!("{s} uses {qps} (experts / ranks = {} / {n})", w.experts),
                "the low-latency kernels spread messages over the QPs; another count is another measurement",
            );
        }
        if b.num_sms != DEFAULT_NUM_SMS {
            note(
                Warning,
                "job.buffer.num_sms",
                b.num_sms.to_string(),
                format!("{s} uses {DEFAULT_NUM_SMS}"),
                "the low-latency kernels size their own grids; num_sms has no effect on them",
            );
        }
    } else {
        if b.num_sms != SCRIPT_NORMAL_SMS {
            note(
                Refused,
                "job.buffer.num_sms",
                b.num_sms.to_string(),
                format!("{s} uses {SCRIPT_NORMAL_SMS}"),
                "the scripts tune and print at 24 SMs only",
            );
        }
        if tuned(Direction::Dispatch, n).is_none() {
            note(
                Refused,
                "job.ranks",
                format!("{n} ranks"),
                format!(
                    "{s} needs a rank count of DeepEP's tuned table ({})",
                    tuned_rank_counts().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
                ),
                "Buffer.get_dispatch_config / get_combine_config raise for other counts",
            );
        }
        if b.num_nvl_bytes.bytes() != SCRIPT_NVL_BYTES {
            note(
                Warning,
                "job.buffer.num_nvl_bytes",
                b.num_nvl_bytes.bytes().to_string(),
                format!("{s} uses {SCRIPT_NVL_BYTES} (int(2e9))"),
                "the normal kernels' rings are sized by the Config, not by the buffer",
            );
        }
        let script_rdma = if script == Script::Internode { SCRIPT_RDMA_BYTES } else { 0 };
        if b.num_rdma_bytes.bytes() != script_rdma {
            note(
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
            note(
                severity,
                "job.buffer.num_qps_per_rank",
                b.num_qps_per_rank.to_string(),
                format!("{s} uses {script_qps}"),
                why,
            );
        }
        if !b.allow_nvlink_for_low_latency_mode {
            note(
                Warning,
                "job.buffer.allow_nvlink_for_low_latency_mode",
                "false".into(),
                format!("{s} uses true (no flag)"),
                "NVSHMEM_DISABLE_P2P does not change the normal kernels' paths",
            );
        }
        for (direction, config, explicit) in [
            ("dispatch", d.dispatch_config, &b.dispatch_config),
            ("combine", d.combine_config, &b.combine_config),
        ] {
            if explicit.num_max_nvl_chunked_recv_tokens.is_some()
                || explicit.num_max_rdma_chunked_recv_tokens.is_some()
            {
                note(
                    Warning,
                    &format!("job.buffer.{direction}_config"),
                    "explicit ring sizes (*_recv_tokens)".into(),
                    format!("{s} uses its own ring sizes"),
                    "the tuning lines vary the send chunks only",
                );
            }
            let Some(c) = config else { continue };
            let (nvl, rdma) =
                (c.num_max_nvl_chunked_send_tokens, c.num_max_rdma_chunked_send_tokens);
            if !in_tuning_sweep(script, direction == "dispatch", nvl, rdma) {
                let chunks = if script == Script::Internode {
                    format!("NVL chunk {nvl}, RDMA chunk {rdma}")
                } else {
                    format!("NVL chunk {nvl}")
                };
                note(
                    Warning,
                    &format!("job.buffer.{direction}_config"),
                    chunks,
                    format!("{s} tunes other chunk sizes (no line for it)"),
                    "the import takes the script's Best line for this op instead",
                );
            }
        }
    }
    if b.allow_mnnvl && script == Script::Internode {
        let severity = if subject.nvlink == NvlinkKind::Mnnvl { Refused } else { Warning };
        note(
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
        note(
            Warning,
            "job.buffer.use_fabric",
            "true".into(),
            format!("{s} uses false (no flag)"),
            "fabric handles only change how the NVL buffer is shared",
        );
    }
    if b.enable_shrink {
        note(
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

/// The line each node prints before the script's own output, so that `eptwin deepep import`
/// can tell which scenario and flags a log belongs to. `node_rank` is shell text.
pub const MARKER_PREFIX: &str = "[eptwin] launch";

impl Launch {
    fn marker_head(&self, launcher: &str) -> String {
        format!(
            "{MARKER_PREFIX} scenario={} sha256={} script={} nodes={} launcher={launcher}",
            self.scenario_name, self.scenario_sha256, self.script, self.nodes
        )
    }

    fn args_text(&self) -> String {
        self.args.to_args().join(" ")
    }

    fn env_assignments(&self) -> String {
        self.env.iter().map(|(k, v)| format!("{k}={} ", shell_quote(v))).collect()
    }

    fn log_name(&self, node: &str) -> String {
        format!("{}.node{node}.log", self.scenario_name)
    }

    /// The launch text in `format`.
    pub fn render(&self, format: LaunchFormat) -> String {
        match format {
            LaunchFormat::Shell { nodes_from_slurm: false } => self.render_nodes(),
            LaunchFormat::Shell { nodes_from_slurm: true } => self.render_from_slurm(),
            LaunchFormat::Slurm => self.render_sbatch(),
        }
    }

    fn header(&self, out: &mut String, logs: &str) {
        let _ = writeln!(
            out,
            "# eptwin deepep launch: scenario {} (sha256 {}), job {:?}: {}, {} node(s) x {} rank(s)",
            self.scenario_name,
            self.scenario_sha256,
            self.job,
            self.script,
            self.nodes,
            self.args.num_processes
        );
        let _ = writeln!(
            out,
            "# Then: eptwin deepep import {logs} --scenario <this scenario> --out <dir>"
        );
    }

    fn render_nodes(&self) -> String {
        let mut out = String::new();
        self.header(&mut out, &self.log_name("*"));
        let master = if self.nodes > 1 {
            "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}".to_string()
        } else {
            "127.0.0.1".to_string()
        };
        for node in 0..self.nodes {
            let _ = writeln!(out, "\n# node {node} of {}", self.nodes);
            let _ = writeln!(
                out,
                "( echo '{} node_rank={node} args: {}' && \\\n  MASTER_ADDR={master} MASTER_PORT=${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}} WORLD_SIZE={} RANK={node} {}${{PYTHON:-python}} {} {} ) 2>&1 | tee {}",
                self.marker_head("shell"),
                self.args_text(),
                self.nodes,
                self.env_assignments(),
                shell_quote(&self.script_path),
                self.args_text(),
                self.log_name(&node.to_string()),
            );
        }
        out
    }

    fn render_from_slurm(&self) -> String {
        let mut out = String::new();
        self.header(&mut out, &self.log_name("*"));
        let _ = writeln!(
            out,
            "# The same lines on every node, one task per node inside a Slurm allocation of {} \
             node(s) (e.g. srun --nodes={} --ntasks-per-node=1 bash this-file.sh).",
            self.nodes, self.nodes
        );
        let _ = writeln!(out, "set -eu");
        let _ = writeln!(
            out,
            "if [ \"${{SLURM_JOB_NUM_NODES:-}}\" != {n} ]; then echo \"eptwin: the scenario needs {n} node(s); this Slurm job has ${{SLURM_JOB_NUM_NODES:-none}}\" >&2; exit 2; fi",
            n = self.nodes
        );
        let _ = writeln!(out, "RANK=${{SLURM_NODEID:?run this inside a Slurm job step}}");
        let _ = writeln!(
            out,
            "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"
        );
        let _ = writeln!(
            out,
            "( echo \"{} node_rank=$RANK args: {}\" && \\\n  MASTER_ADDR=$MASTER_ADDR MASTER_PORT=${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}} WORLD_SIZE={} RANK=$RANK {}${{PYTHON:-python}} {} {} ) 2>&1 | tee {}",
            self.marker_head("slurm"),
            self.args_text(),
            self.nodes,
            self.env_assignments(),
            shell_quote(&self.script_path),
            self.args_text(),
            self.log_name("$RANK"),
        );
        out
    }

    fn render_sbatch(&self) -> String {
        let mut out = String::from("#!/bin/bash\n");
        let _ = writeln!(out, "#SBATCH --job-name=deepep-{}", self.scenario_name);
        let _ = writeln!(out, "#SBATCH --nodes={}", self.nodes);
        let _ = writeln!(out, "#SBATCH --ntasks-per-node=1");
        let _ = writeln!(out, "#SBATCH --gres=gpu:{}", self.args.num_processes);
        let _ = writeln!(out, "#SBATCH --output={}.%j.log", self.scenario_name);
        self.header(&mut out, &format!("{}.<job id>.log", self.scenario_name));
        let _ = writeln!(out, "set -eu");
        let _ = writeln!(
            out,
            "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"
        );
        let _ = writeln!(out, "export MASTER_PORT=${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}");
        let _ = writeln!(out, "export WORLD_SIZE={}", self.nodes);
        for (k, v) in &self.env {
            let _ = writeln!(out, "export {k}={}", shell_quote(v));
        }
        let _ = writeln!(out, "export EPTWIN_DEEPEP_SCRIPT={}", shell_quote(&self.script_path));
        let _ = writeln!(out, "export EPTWIN_DEEPEP_ARGS={}", shell_quote(&self.args_text()));
        let _ = writeln!(
            out,
            "export EPTWIN_DEEPEP_MARKER={}",
            shell_quote(&self.marker_head("slurm"))
        );
        let _ = writeln!(
            out,
            "srun --nodes={} --ntasks-per-node=1 bash -c 'echo \"$EPTWIN_DEEPEP_MARKER node_rank=$SLURM_NODEID args: $EPTWIN_DEEPEP_ARGS\"; RANK=$SLURM_NODEID exec \"${{PYTHON:-python}}\" \"$EPTWIN_DEEPEP_SCRIPT\" $EPTWIN_DEEPEP_ARGS'",
            self.nodes
        );
        out
    }
}

/// A `[eptwin] launch ...` line read back: the scenario it was made for, the node, the flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub scenario: String,
    pub sha256: String,
    pub script: Option<Script>,
    pub nodes: Option<u32>,
    pub node_rank: Option<u32>,
    pub launcher: String,
    pub args: Vec<String>,
}

impl Marker {
    /// `None` when `line` is not a marker; `Err` when it is one but cannot be read.
    pub fn parse(line: &str) -> Option<Result<Marker, String>> {
        let rest = line.trim().strip_prefix(MARKER_PREFIX)?;
        let Some((head, args)) = rest.split_once(" args:") else {
            return Some(Err("launch line without \"args:\" (cut short?)".into()));
        };
        let mut m = Marker {
            scenario: String::new(),
            sha256: String::new(),
            script: None,
            nodes: None,
            node_rank: None,
            launcher: String::new(),
            args: args.split_whitespace().map(str::to_string).collect(),
        };
        for pair in head.split_whitespace() {
            let Some((k, v)) = pair.split_once('=') else { continue };
            match k {
                "scenario" => m.scenario = v.into(),
                "sha256" => m.sha256 = v.into(),
                "script" => m.script = Script::from_path(v),
                "nodes" => m.nodes = v.parse().ok(),
                "node_rank" => m.node_rank = v.parse().ok(),
                "launcher" => m.launcher = v.into(),
                _ => {}
            }
        }
        Some(Ok(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::parse;

    pub(crate) fn subject(text: &str) -> Subject {
        let loaded = parse("test.toml", text).unwrap();
        let plan = crate::plan::Plan::build(&loaded).unwrap();
        Subject::from_plan(&plan, &loaded.scenario)
    }

    const LL16: &str = r#"
schema = 1
name = "ll16"
[cluster]
profile = "h800-cx7"
nodes = 2
[[job]]
name = "decode"
[job.buffer]
low_latency_mode = true
num_rdma_bytes = 2146961792
num_qps_per_rank = 18
[job.env]
NVSHMEM_IB_SL = "1"
NVSHMEM_QP_DEPTH = "2048"
[job.workload]
tokens_per_rank = 128
hidden = 7168
topk = 8
experts = 288
masked_selections = 10
"#;

    #[test]
    fn ll_flags_and_env_come_from_the_scenario() {
        let l = launch(&subject(LL16), "/opt/DeepEP/").unwrap();
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
        assert_eq!(l.script, Script::LowLatency);
        assert_eq!(l.script_path, "/opt/DeepEP/tests/test_low_latency.py");
        assert_eq!(
            l.args.to_args().join(" "),
            "--num-processes 8 --num-tokens 128 --hidden 7168 --num-topk 8 --num-experts 288"
        );
        // The user's variables only: DeepEP writes NVSHMEM_IBGDA_NUM_RC_PER_PE and the rest.
        assert_eq!(
            l.env,
            [
                ("NVSHMEM_IB_SL".to_string(), "1".to_string()),
                ("NVSHMEM_QP_DEPTH".to_string(), "2048".to_string())
            ]
        );
        let text = l.render(LaunchFormat::Shell { nodes_from_slurm: false });
        assert!(text.contains("WORLD_SIZE=2 RANK=0 NVSHMEM_IB_SL=1 NVSHMEM_QP_DEPTH=2048 ${PYTHON:-python} /opt/DeepEP/tests/test_low_latency.py --num-processes 8"), "{text}");
        assert!(text.contains("WORLD_SIZE=2 RANK=1 "), "{text}");
        assert!(text.contains("tee ll16.node1.log"), "{text}");
        assert!(!text.contains("IBGDA"), "{text}");
        let slurm = l.render(LaunchFormat::Slurm);
        assert!(
            slurm.contains("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:8")
        );
        assert!(slurm.contains("scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1"));
        assert!(slurm.contains("RANK=$SLURM_NODEID exec"), "{slurm}");
        let from_slurm = l.render(LaunchFormat::Shell { nodes_from_slurm: true });
        assert!(from_slurm.contains("RANK=${SLURM_NODEID:?"), "{from_slurm}");
    }

    #[test]
    fn round_trip_marker_flags_equal_the_scenario() {
        let l = launch(&subject(LL16), "DeepEP").unwrap();
        let text = l.render(LaunchFormat::Shell { nodes_from_slurm: false });
        let marker_line = text
            .lines()
            .find_map(|line| line.strip_prefix("( echo '"))
            .and_then(|l| l.split_once("' &&"))
            .map(|(m, _)| m.to_string())
            .unwrap();
        let m = Marker::parse(&marker_line).unwrap().unwrap();
        assert_eq!((m.scenario.as_str(), m.node_rank, m.nodes), ("ll16", Some(0), Some(2)));
        let parsed = ScriptArgs::parse(m.script.unwrap(), &m.args).unwrap();
        assert_eq!(parsed, l.args);
        // And the flags say the scenario's workload.
        let s = subject(LL16);
        let w = &s.jobs[0].deepep.as_ref().unwrap().workload;
        assert_eq!(
            (parsed.num_tokens, parsed.hidden, parsed.num_topk, parsed.num_experts),
            (w.tokens_per_rank, w.hidden, w.topk, w.experts)
        );
        assert_eq!(parsed.num_processes * s.nodes, s.jobs[0].num_ranks);
    }

    #[test]
    fn refusals_name_key_and_both_values() {
        let text = LL16.replace("num_qps_per_rank = 18", "num_qps_per_rank = 20").replace(
            "masked_selections = 10",
            "masked_selections = 0\nrouting = \"zipf\"\nskew = 1.2",
        );
        let notes = launch(&subject(&text), "DeepEP").unwrap_err();
        let lines: Vec<String> = notes.iter().map(|n| n.to_string()).collect();
        let find = |key: &str| lines.iter().find(|l| l.contains(key)).cloned().unwrap_or_default();
        assert!(
            find("num_qps_per_rank").starts_with("refused: job \"decode\": job.buffer.num_qps_per_rank: the scenario has 20, test_low_latency.py uses 18 (experts / ranks = 288 / 16)"),
            "{lines:?}"
        );
        assert!(find("routing").contains("the scenario has zipf (skew 1.2)"), "{lines:?}");
        assert!(find("masked_selections").starts_with("warning:"), "{lines:?}");
    }

    /// DeepEP's scripts draw their own routing: a recorded one is refused, naming the file.
    #[test]
    fn a_file_routing_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let plan = crate::plan::Plan::build(&parse("test.toml", LL16).unwrap()).unwrap();
        let table = plan.jobs[0].deepep().unwrap().routing().clone();
        std::fs::write(dir.path().join("r.json"), crate::routing_file::to_json(&table, "test"))
            .unwrap();
        let text = LL16.replace(
            "masked_selections = 10",
            &format!("routing = \"file\"\nrouting_file = {:?}", dir.path().join("r.json")),
        );
        let notes = launch(&subject(&text), "DeepEP").unwrap_err();
        let lines: Vec<String> = notes.iter().map(|n| n.to_string()).collect();
        let routing = lines.iter().find(|l| l.contains("job.workload.routing")).unwrap();
        assert!(routing.starts_with("refused:"), "{lines:?}");
        assert!(routing.contains("r.json)"), "{routing}");
        assert!(!lines.iter().any(|l| l.contains("masked_selections")), "{lines:?}");
    }

    #[test]
    fn normal_internode_flags() {
        let text = r#"
schema = 1
name = "n16"
[cluster]
profile = "h800-cx7"
nodes = 2
[[job]]
name = "train"
[job.buffer]
num_nvl_bytes = "2e9"
num_rdma_bytes = "1e9"
num_qps_per_rank = 24
num_sms = 24
[job.workload]
tokens_per_rank = 4096
hidden = 7168
topk = 8
experts = 256
routing = "node-limited"
topk_groups = 2
"#;
        let l = launch(&subject(text), "DeepEP").unwrap();
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
        assert_eq!(l.args.num_topk_groups, Some(2));
        assert!(l.args.to_args().join(" ").contains("--num-topk-groups 2"));
        let notes =
            launch(&subject(&text.replace("num_sms = 24", "num_sms = 20")), "DeepEP").unwrap_err();
        assert!(notes.iter().any(|n| n.key == "job.buffer.num_sms"
            && n.severity == Severity::Refused
            && n.to_string().contains("the scenario has 20, test_internode.py uses 24")));
    }

    #[test]
    fn faults_are_refused() {
        let text = format!("{LL16}\n[[fault]]\nkind = \"packet_loss\"\nrate = 0.001\n");
        let notes = launch(&subject(&text), "DeepEP").unwrap_err();
        let line = notes.iter().map(|n| n.to_string()).find(|l| l.contains("[[fault]]"));
        assert_eq!(
            line.as_deref(),
            Some(
                "refused: [[fault]]: the scenario has 1 fault(s) (packet_loss), the scripts run \
                 a healthy cluster: the faults are what the scenario measures"
            )
        );
    }

    #[test]
    fn traffic_and_several_jobs_are_refused() {
        let text = format!(
            "{LL16}\n[[job]]\nname = \"bulk\"\n[job.traffic]\npattern = \"all-to-all\"\nbytes_per_rank = \"64MiB\"\n"
        );
        let notes = launch(&subject(&text), "DeepEP").unwrap_err();
        let keys: Vec<&str> = notes.iter().map(|n| n.key.as_str()).collect();
        assert!(keys.contains(&"[[job]]") && keys.contains(&"job.traffic"), "{keys:?}");
    }

    #[test]
    fn marker_parse() {
        let m = Marker::parse("[eptwin] launch scenario=a sha256=ff script=test_internode.py nodes=4 launcher=slurm node_rank=3 args: --num-tokens 64").unwrap().unwrap();
        assert_eq!(m.script, Some(Script::Internode));
        assert_eq!((m.nodes, m.node_rank, m.launcher.as_str()), (Some(4), Some(3), "slurm"));
        assert_eq!(m.args, ["--num-tokens", "64"]);
        assert!(Marker::parse("[eptwin] launch scenario=a sha256=").unwrap().is_err());
        assert!(Marker::parse("[rank 0] x").is_none());
    }
}
