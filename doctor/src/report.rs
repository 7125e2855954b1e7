//! What the doctor says: one [`Finding`] per check, and the report's text and JSON forms
//! (docs/doctor.md, "Output").

use std::fmt::Write as _;

use serde::Serialize;

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Ok,
    /// Will run, but slower than it should, or only under conditions the doctor cannot see.
    Warn,
    /// DeepEP will fail, hang or crawl here as configured.
    Fail,
    /// The check could not run, or does not apply; `saw` says why.
    Skip,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// Stable check id (`p2p`, `nic-selection`, …; docs/doctor.md lists them).
    pub check: &'static str,
    pub title: &'static str,
    pub status: Status,
    /// What the check saw, in one line.
    pub saw: String,
    /// Everything behind that line: every failing pair, every port, every rank's NIC.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    /// Why it matters for DeepEP (V1 and V2); empty for ok/skip.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub why: String,
    /// The issues it prevents (`DeepEP #582`, `nvshmem #45`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prevents: Vec<&'static str>,
    /// The command or setting that fixes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    pub fn new(
        check: &'static str,
        title: &'static str,
        status: Status,
        saw: impl Into<String>,
    ) -> Finding {
        Finding {
            check,
            title,
            status,
            saw: saw.into(),
            details: Vec::new(),
            why: String::new(),
            prevents: Vec::new(),
            fix: None,
        }
    }

    pub fn details(mut self, details: Vec<String>) -> Finding {
        self.details = details;
        self
    }

    pub fn why(mut self, why: impl Into<String>, prevents: &[&'static str]) -> Finding {
        self.why = why.into();
        self.prevents = prevents.to_vec();
        self
    }

    pub fn fix(mut self, fix: impl Into<String>) -> Finding {
        self.fix = Some(fix.into());
        self
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub ok: u32,
    pub warn: u32,
    pub fail: u32,
    pub skip: u32,
}

/// The doctor's report for one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// `"eptwin-doctor"`: other eptwin documents carry a `schema` of their own kind.
    pub kind: &'static str,
    pub schema: u32,
    pub host: String,
    /// `live` or `snapshot <dir>`.
    pub origin: String,
    /// The scenario file the node was checked against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    pub counts: Counts,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn new(
        host: String,
        origin: String,
        scenario: Option<String>,
        findings: Vec<Finding>,
    ) -> Report {
        let mut counts = Counts::default();
        for f in &findings {
            match f.status {
                Status::Ok => counts.ok += 1,
                Status::Warn => counts.warn += 1,
                Status::Fail => counts.fail += 1,
                Status::Skip => counts.skip += 1,
            }
        }
        Report { kind: "eptwin-doctor", schema: 1, host, origin, scenario, counts, findings }
    }

    /// The worst verdict: fail > warn > ok (skips do not count).
    pub fn worst(&self) -> Status {
        self.findings
            .iter()
            .map(|f| f.status)
            .filter(|s| *s != Status::Skip)
            .max()
            .unwrap_or(Status::Ok)
    }

    pub fn finding(&self, check: &str) -> Option<&Finding> {
        self.findings.iter().find(|f| f.check == check)
    }

    /// The human form: one block per check, fixes last.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let scenario =
            self.scenario.as_deref().map(|s| format!(", scenario {s}")).unwrap_or_default();
        let _ = writeln!(out, "# eptwin doctor: {} ({}{scenario})", self.host, self.origin);
        for f in &self.findings {
            let _ = writeln!(out, "[{:>4}] {} ({}): {}", f.status.label(), f.title, f.check, f.saw);
            for d in &f.details {
                let _ = writeln!(out, "         {d}");
            }
            if !f.why.is_empty() {
                let prevents = if f.prevents.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", f.prevents.join(", "))
                };
                let _ = writeln!(out, "         why: {}{prevents}", f.why);
            }
            if let Some(fix) = &f.fix {
                let _ = writeln!(out, "         fix: {fix}");
            }
        }
        let c = &self.counts;
        let _ =
            writeln!(out, "# {} ok, {} warn, {} fail, {} skipped", c.ok, c.warn, c.fail, c.skip);
        out
    }
}
