//! `eptwin doctor`: a node's preflight for DeepEP (V1 and V2) — why a job will hang, fail or
//! crawl on this node, before the job is spent (docs/doctor.md).
//!
//! Each check reads the node through the probes (`probe`: a recorded node, or the live one),
//! optionally against what a scenario asks of the node (`subject`, from the engine's `Plan`),
//! and says ok / warn / fail / skip, what it saw, why it matters, the issue it prevents and
//! the fix.
//!
//! Architecture Invariant: diagnosing never needs root, never waits without a bound (tools
//! run with a time limit) and never panics: a probe that cannot answer makes its check say
//! why. DeepEP's configuration rules stay in `eptwin_engine::deepep` (the doctor reports the
//! validator's findings and adds only what depends on the node).

pub mod checks;
pub mod error;
pub mod facts;
pub mod parse;
pub mod probe;
pub mod report;
pub mod subject;

pub use error::DoctorError;
pub use probe::Node;
pub use report::{Finding, Report, Status};
pub use subject::Subject;

/// Diagnose a node, against a scenario's subject when one is given.
pub fn diagnose(node: &Node, subject: Option<&Subject>) -> Report {
    let facts = facts::Facts::gather(node);
    let ctx = checks::Ctx { node, subject, facts: &facts };
    let findings = checks::run_all(&ctx);
    Report::new(
        node.host.hostname(),
        node.origin.clone(),
        subject.map(|s| s.file.clone()),
        findings,
    )
}
