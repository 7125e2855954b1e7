//! From a scenario to the command lines that run DeepEP's matching test script on every node
//! (DeepEP's rendezvous: `WORLD_SIZE` = nodes, `RANK` = node rank), or the reasons the
//! scripts cannot replay it: the rules every family shares here (one DeepEP job, one rank per
//! GPU, no background traffic), each family's own in its module (`v1`). docs/deepep-replay.md
//! lists every rule.

pub mod v1;

use std::fmt::Write;

use eptwin_engine::deepep::env::shell_quote;

use crate::script::{Script, ScriptArgs, ScriptFamily};
use crate::subject::{Note, Severity, Subject, SubjectDeepEp, SubjectJob};

/// DeepEP's default rendezvous port (`utils.init_dist`).
pub const DEFAULT_MASTER_PORT: u16 = 8361;

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
    if subject.ranks_per_gpu > 1 {
        refuse(
            &mut notes,
            "cluster.ranks_per_gpu",
            subject.ranks_per_gpu.to_string(),
            "the scripts use 1 (one process per GPU, torch.cuda.set_device(local_rank))",
            "ranks that share a GPU cannot be started by the scripts",
        );
    }
    let family = ScriptFamily::of(subject);
    let mut replayed: Option<(&SubjectJob, &SubjectDeepEp, Script)> = None;
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
                let script = family.script_for(d.mode);
                match family {
                    ScriptFamily::V1 => v1::job_notes(subject, job, d, script, &mut notes),
                }
                replayed.get_or_insert((job, d, script));
            }
        }
    }
    let Some((job, d, script)) = replayed else { return Err(notes) };
    if notes.iter().any(|n| n.severity == Severity::Refused) {
        return Err(notes);
    }
    let args = match family {
        ScriptFamily::V1 => v1::script_args(subject, d, script),
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
    use eptwin_engine::api::Plan;
    use eptwin_engine::scenario::parse;

    use super::*;

    pub(crate) fn subject(text: &str) -> Subject {
        let loaded = parse("test.toml", text).unwrap();
        let plan = Plan::build(&loaded).unwrap();
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
        let plan = Plan::build(&parse("test.toml", LL16).unwrap()).unwrap();
        let table = plan.jobs[0].deepep().unwrap().routing().clone();
        std::fs::write(
            dir.path().join("r.json"),
            eptwin_engine::routing_file::to_json(&table, "test"),
        )
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
