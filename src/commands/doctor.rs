//! `eptwin doctor`: the node's preflight for DeepEP (eptwin-doctor), on this node or a recorded
//! one, against a scenario or not. Under a launcher (srun, torchrun, mpirun) or `--spawn N`,
//! the first process on each host diagnoses its node and process 0 prints every node's report,
//! as `run` gathers its results (docs/doctor.md).

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use eptwin_doctor::probe::{live, snapshot::Snapshot};
use eptwin_doctor::{Status, Subject, diagnose};
use eptwin_engine::api::Plan;
use eptwin_group::{GroupConfig, LaunchInfo, ProcessGroup, Timeouts};
use serde::{Deserialize, Serialize};

use super::load_plan;
use crate::{ExitCode, out, outln};

/// Bounds each collective of a gathered doctor: the checks themselves take seconds.
const GATHER_TIMEOUT: Duration = Duration::from_secs(120);

pub fn doctor(
    scenario: Option<&Path>,
    json: bool,
    node_dir: Option<&Path>,
    spawn: Option<usize>,
) -> Result<ExitCode> {
    if let Some(n) = spawn {
        return super::processes::spawn_this_command(n);
    }
    let plan = match scenario {
        Some(path) => match load_plan(path) {
            Some(plan) => Some(plan),
            None => return Ok(ExitCode::BadInput),
        },
        None => None,
    };
    if node_dir.is_none() {
        let launch = match LaunchInfo::from_process_env() {
            Ok(l) => l,
            Err(e) => {
                eprintln!("eptwin doctor: {e}");
                return Ok(ExitCode::BadInput);
            }
        };
        if launch.process_count > 1 {
            return doctor_in_group(&launch, plan.as_ref(), json);
        }
    }
    let report = match diagnose_node(node_dir, plan.as_ref()) {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    print_nodes(std::slice::from_ref(&report), json)?;
    Ok(report.exit_code())
}

/// One node's diagnosis as it travels to process 0: the rendered text, the JSON document and
/// whether a check failed (the report itself borrows static check descriptions).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NodeReport {
    host: String,
    /// The processes of the launch on this host (the first one ran the checks).
    processes: Vec<usize>,
    text: String,
    report: serde_json::Value,
    failed: bool,
}

impl NodeReport {
    fn exit_code(&self) -> ExitCode {
        if self.failed { ExitCode::Failed } else { ExitCode::Ok }
    }
}

fn diagnose_node(node_dir: Option<&Path>, plan: Option<&Plan>) -> Result<NodeReport, ExitCode> {
    let node = match node_dir {
        Some(dir) => match Snapshot::load(dir) {
            Ok(s) => s.into_node(),
            Err(e) => {
                eprintln!("eptwin doctor: {e}");
                return Err(ExitCode::BadInput);
            }
        },
        None => live::node(),
    };
    let subject = plan.map(|plan| Subject::from_plan(plan, &node.host.environment()));
    let report = diagnose(&node, subject.as_ref());
    let value = serde_json::to_value(&report).map_err(|e| {
        eprintln!("eptwin doctor: encoding the report: {e}");
        ExitCode::Failed
    })?;
    Ok(NodeReport {
        host: eptwin_group::system_hostname(),
        processes: vec![0],
        text: report.to_text(),
        report: value,
        failed: report.worst() == Status::Fail,
    })
}

/// One report as the single-node doctor always printed it; several under a `## node` header
/// each (text) or as `{"kind": "eptwin-doctor-nodes", "nodes": [...]}` (JSON).
fn print_nodes(nodes: &[NodeReport], json: bool) -> Result<()> {
    match (nodes, json) {
        ([one], true) => outln!("{}", serde_json::to_string_pretty(&one.report)?),
        ([one], false) => out!("{}", one.text),
        (_, true) => {
            let doc = serde_json::json!({
                "kind": "eptwin-doctor-nodes",
                "schema": 1,
                "nodes": nodes.iter().map(|n| serde_json::json!({
                    "host": n.host,
                    "processes": n.processes,
                    "report": n.report,
                })).collect::<Vec<_>>(),
            });
            outln!("{}", serde_json::to_string_pretty(&doc)?);
        }
        (_, false) => {
            for n in nodes {
                outln!("## node {} (processes {})", n.host, list(&n.processes));
                out!("{}", n.text);
                outln!();
            }
        }
    }
    Ok(())
}

fn list(processes: &[usize]) -> String {
    processes.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}

/// The hosts of a launch by first process: (host, every process on it), in process order.
fn hosts_by_first_process(hosts: &[String]) -> Vec<(String, Vec<usize>)> {
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    for (process, host) in hosts.iter().enumerate() {
        match out.iter_mut().find(|(h, _)| h == host) {
            Some((_, procs)) => procs.push(process),
            None => out.push((host.clone(), vec![process])),
        }
    }
    out
}

/// One process of a launch: the first process on each host runs the checks, process 0 prints
/// every node's report; each process exits with its own node's verdict, process 0 with the
/// worst of all.
fn doctor_in_group(launch: &LaunchInfo, plan: Option<&Plan>, json: bool) -> Result<ExitCode> {
    let me = format!("process {} of {}", launch.process_rank, launch.process_count);
    let timeouts = match Timeouts::from_env(&|k| std::env::var(k).ok()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("eptwin doctor: {me}: {e}");
            return Ok(ExitCode::BadInput);
        }
    };
    let config = GroupConfig {
        launch: launch.clone(),
        scenario_sha256: plan.map(Plan::inputs_sha256).unwrap_or_default(),
        eptwin_version: eptwin_engine::VERSION.to_string(),
        timeouts,
    };
    let failed = |e: &dyn std::fmt::Display| {
        eprintln!("eptwin doctor: {me}: {e}");
        Ok(ExitCode::Failed)
    };
    let mut group = match ProcessGroup::join(&config) {
        Ok(g) => g,
        Err(e) => return failed(&e),
    };
    let hosts = match group.all_gather_json("doctor hosts", &launch.host, GATHER_TIMEOUT) {
        Ok(h) => h,
        Err(e) => return failed(&e),
    };
    let by_host = hosts_by_first_process(&hosts);
    let mine = match by_host.iter().find(|(_, procs)| procs[0] == launch.process_rank) {
        Some((host, procs)) => match diagnose_node(None, plan) {
            Ok(r) => Some(NodeReport { host: host.clone(), processes: procs.clone(), ..r }),
            Err(code) => return Ok(code),
        },
        None => None,
    };
    let gathered = match group.gather_json("doctor reports", 0, &mine, GATHER_TIMEOUT) {
        Ok(g) => g,
        Err(e) => return failed(&e),
    };
    let mut code = mine.as_ref().map_or(ExitCode::Ok, NodeReport::exit_code);
    if let Some(all) = gathered {
        let nodes: Vec<NodeReport> = all.into_iter().flatten().collect();
        code = nodes.iter().fold(code, |c, n| c.worst(n.exit_code()));
        print_nodes(&nodes, json)?;
    }
    if let Err(e) = group.finish(GATHER_TIMEOUT) {
        eprintln!("eptwin doctor: {me}: {e}");
        code = code.worst(ExitCode::Failed);
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_process_on_each_host_speaks_for_it() {
        let hosts: Vec<String> = ["b", "a", "b", "a", "c"].map(String::from).to_vec();
        assert_eq!(
            hosts_by_first_process(&hosts),
            vec![
                ("b".to_string(), vec![0, 2]),
                ("a".to_string(), vec![1, 3]),
                ("c".to_string(), vec![4])
            ]
        );
    }

    #[test]
    fn a_failed_node_fails_the_gathered_run() {
        let node = |failed| NodeReport {
            host: "h".into(),
            processes: vec![0],
            text: String::new(),
            report: serde_json::Value::Null,
            failed,
        };
        assert_eq!(node(false).exit_code(), ExitCode::Ok);
        assert_eq!(node(true).exit_code(), ExitCode::Failed);
    }
}
