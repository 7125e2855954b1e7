//! `eptwin doctor`: the node's preflight for DeepEP (eptwin-doctor), on this node or a recorded
//! one, against a scenario or not.

use std::path::Path;

use anyhow::Result;
use eptwin_doctor::probe::{live, snapshot::Snapshot};
use eptwin_doctor::{Status, Subject, diagnose};

use super::load_plan;
use crate::{ExitCode, out, outln};

pub fn doctor(scenario: Option<&Path>, json: bool, node_dir: Option<&Path>) -> Result<ExitCode> {
    let node = match node_dir {
        Some(dir) => match Snapshot::load(dir) {
            Ok(s) => s.into_node(),
            Err(e) => {
                eprintln!("eptwin doctor: {e}");
                return Ok(ExitCode::BadInput);
            }
        },
        None => live::node(),
    };
    let subject = match scenario {
        Some(path) => match load_plan(path) {
            Some(plan) => Some(Subject::from_plan(&plan, &node.host.environment())),
            None => return Ok(ExitCode::BadInput),
        },
        None => None,
    };
    let report = diagnose(&node, subject.as_ref());
    if json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("{}", report.to_text());
    }
    Ok(if report.worst() == Status::Fail { ExitCode::Failed } else { ExitCode::Ok })
}
