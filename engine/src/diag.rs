//! Diagnostics: what the validator found, where, and what is needed.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::scenario::source::{Location, SourceMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Severity {
    /// DeepEP/NVSHMEM/the fabric would refuse or break: `eptwin validate` exits 2.
    Error,
    /// Legal but costly or surprising (performance advice, ignored settings).
    Advisory,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Stable rule id, e.g. `ll-qps-ge-local-experts`.
    pub rule: String,
    /// Key path in the scenario (`job[0].buffer.num_qps_per_rank`).
    pub key: String,
    pub job: Option<String>,
    /// What was found and what is needed (and, for DeepEP rules, where DeepEP enforces it).
    pub message: String,
    pub location: Option<Location>,
}

impl Diagnostic {
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(loc) = &self.location {
            write!(f, "{loc}: ")?;
        }
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Advisory => "advisory",
        };
        write!(f, "{level}[{}]: ", self.rule)?;
        if let Some(job) = &self.job {
            write!(f, "job {job:?}: ")?;
        }
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Collects diagnostics and resolves their locations.
pub struct Diagnostics<'a> {
    source: &'a SourceMap,
    pub items: Vec<Diagnostic>,
}

impl<'a> Diagnostics<'a> {
    pub fn new(source: &'a SourceMap) -> Self {
        Diagnostics { source, items: Vec::new() }
    }

    pub fn push(
        &mut self,
        severity: Severity,
        rule: &str,
        key: &str,
        job: Option<&str>,
        message: String,
    ) {
        self.items.push(Diagnostic {
            severity,
            rule: rule.to_string(),
            key: key.to_string(),
            job: job.map(str::to_string),
            message,
            location: Some(self.source.locate(key)),
        });
    }

    pub fn error(&mut self, rule: &str, key: &str, job: Option<&str>, message: String) {
        self.push(Severity::Error, rule, key, job, message);
    }

    pub fn advisory(&mut self, rule: &str, key: &str, job: Option<&str>, message: String) {
        self.push(Severity::Advisory, rule, key, job, message);
    }

    pub fn has_errors(&self) -> bool {
        self.items.iter().any(Diagnostic::is_error)
    }

    pub fn source(&self) -> &SourceMap {
        self.source
    }
}
