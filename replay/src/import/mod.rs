//! DeepEP's printed numbers back into a result document (`backend.kind = "deepep"`): the logs
//! of every node are read into one record (`parse`), checked against the scenario's
//! configuration (`check`) and made into samples, summaries and measurements (`build`).
//!
//! A log of another configuration than the scenario is an error naming both values; a failed
//! check, a traceback, a cut-short log or a missing number makes the verdict `failed`.

mod build;
mod check;
mod parse;

use std::collections::{BTreeMap, BTreeSet};

use eptwin_engine::api::BackendKind;
use eptwin_engine::api::Plan;
use eptwin_engine::api::{JobResult, Provenance, RESULT_SCHEMA, RunResult, Verdict};
use eptwin_engine::api::{job_facts, job_kind_name, scenario_ref};
use eptwin_engine::scenario::schema::{OpKind, Scenario};
use eptwin_engine::scenario::sha256_hex;
use serde_json::{Value, json};

use crate::error::ReplayError;
use crate::launch::launch;
use crate::script::Script;
use crate::subject::Subject;
use build::{ll_samples, normal_samples, op_result, record_measurements};
use check::check_configuration;
use parse::{Loc, parse_logs};

/// One log as the binary read it: the name it was given (a path) and its text.
#[derive(Debug, Clone, Copy)]
pub struct LogText<'a> {
    pub name: &'a str,
    pub text: &'a str,
}

/// Read the logs into a result document for `plan`'s one DeepEP job.
pub fn import(
    plan: &Plan,
    scenario: &Scenario,
    logs: &[LogText<'_>],
    provenance: Provenance,
) -> Result<RunResult, ReplayError> {
    let subject = Subject::from_plan(plan, scenario);
    let launch = launch(&subject, "DeepEP").map_err(|notes| ReplayError::Refused {
        file: subject.file.clone(),
        reasons: notes.iter().map(|n| n.to_string()).collect(),
    })?;
    let where_ = |loc: Loc| format!("{}:{}", logs[loc.log].name, loc.line);
    let parsed = parse_logs(logs, &where_)?;
    let job = &plan.jobs[0];
    let deepep = job.deepep().expect("launch() accepts only a DeepEP job");
    check_configuration(&subject, &launch, job, &parsed, &where_)?;

    let mut failures = parsed.failures.clone();
    let mut advisories: Vec<String> = plan.advisories.iter().map(|d| d.to_string()).collect();
    advisories.extend(launch.warnings.iter().map(|n| format!("deepep replay {n}")));
    let mut measurements = BTreeMap::new();
    let ends: Vec<String> =
        logs.iter().map(|l| format!("{}:{}", l.name, l.text.lines().count())).collect();
    let checks: Vec<String> = match launch.script {
        Script::LowLatency => vec![format!(
            "{}: the script's dispatch and combine assertions, run on every rank before timing",
            launch.script
        )],
        _ => parsed
            .passed
            .iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(|t| format!("{}: {t} passed", launch.script))
            .collect(),
    };
    let mut ops = Vec::new();
    let mut seen = BTreeSet::new();
    for &op in &job.ops {
        if !seen.insert(op) {
            continue;
        }
        let (samples, bytes) = match launch.script {
            Script::LowLatency => {
                ll_samples(&parsed, op, job.num_ranks(), deepep.workload.hook, &ends, &mut failures)
            }
            _ => normal_samples(
                &parsed,
                op,
                deepep.workload.dispatch_dtype,
                match op {
                    OpKind::Combine => deepep.combine_config,
                    _ => deepep.dispatch_config,
                },
                &where_,
                &ends,
                &mut failures,
                &mut advisories,
                &mut measurements,
            ),
        };
        ops.push(op_result(job, op, samples, &bytes, checks.clone(), parsed.wrong));
    }
    record_measurements(&parsed, &where_, &mut measurements);

    let mut backend = BTreeMap::from([
        ("kind".to_string(), json!(BackendKind::DeepEp.as_str())),
        ("script".to_string(), json!(launch.script.file_name())),
        ("args".to_string(), json!(launch.args.to_args().join(" "))),
        ("processes".to_string(), json!(job.num_ranks())),
        ("wire".to_string(), json!(if subject.nodes > 1 { "verbs" } else { "none" })),
        (
            "logs".to_string(),
            Value::Array(
                logs.iter()
                    .map(|l| {
                        json!({
                            "file": l.name,
                            "sha256": sha256_hex(l.text.as_bytes()),
                            "lines": l.text.lines().count(),
                        })
                    })
                    .collect(),
            ),
        ),
    ]);
    let launchers: BTreeSet<&str> =
        parsed.markers.iter().map(|(_, m)| m.launcher.as_str()).collect();
    if launchers.len() == 1 {
        backend.insert("launcher".into(), json!(launchers.into_iter().next()));
    }
    let verdict = if failures.is_empty() { Verdict::Ok } else { Verdict::Failed };
    Ok(RunResult {
        schema: RESULT_SCHEMA,
        scenario: scenario_ref(plan),
        backend,
        eptwin: provenance,
        verdict,
        waived_reason: None,
        failures,
        advisories,
        jobs: vec![JobResult {
            name: job.name.clone(),
            kind: job_kind_name(job).to_string(),
            ranks: job.num_ranks(),
            sl: job.sl.0,
            vl: job.vl().map(|v| v.0),
            facts: job_facts(job),
            ops,
        }],
        measurements,
    })
}

#[cfg(test)]
mod tests;
