//! eptwin reports: charts (PNG + SVG), an `index.html` and comparison tables from result
//! files, sweep indexes and simulator traces.
//!
//! Architecture Invariant: this crate reads documents only. It depends on `eptwin-engine`'s
//! result types and never on `eptwin-sim` or `eptwin-hw`, so results measured on a GPU machine
//! plot on any laptop. The font is embedded (DejaVu Sans, `assets/`): no system font packages.
//!
//! Charts (see `docs/reports.md`): simulated vs measured latency, latency/bandwidth vs
//! published numbers, latency and bandwidth against EP size, VL isolation latency CDFs, sweeps
//! (throughput against the swept value) and a Gantt timeline of one simulated dispatch.

pub mod charts;
pub mod compare;
pub mod describe;
pub mod error;
pub mod html;
pub mod inputs;
pub mod report;
pub mod sweep;
pub mod table;
pub mod trace;
pub mod values;

pub use compare::{Comparison, pair_all, render_table};
pub use error::ReportError;
pub use inputs::{Inputs, Loaded};
pub use report::{ReportOutput, Skipped, Written, build, plan};
pub use sweep::{PointOp, Shard, SweepIndex, SweepPoint, SweepScenario};
