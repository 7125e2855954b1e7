//! Run the validation suite (`scenarios/validation/*.toml`) and print the comparison table:
//! `cargo run --release -p eptwin-sim --example validate [-- DIR]`.
//! Profile parameters can be overridden for calibration with `EPTWIN_OVERRIDE=section.key=value,...`.

use std::path::{Path, PathBuf};

use eptwin_engine::api::Provenance;
use eptwin_sim::{SimOptions, Simulator};

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "scenarios/validation".into());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("validation dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let overrides = std::env::var("EPTWIN_OVERRIDE").unwrap_or_default();
    let mut errors = Vec::new();
    println!(
        "{:<22} {:<9} {:>10} {:>10} {:>8}",
        "scenario", "op", "published", "simulated", "error%"
    );
    for f in &files {
        let mut loaded = eptwin_engine::load(Path::new(f)).expect("load");
        for kv in overrides.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').expect("key=value");
            let (section, key) = k.split_once('.').expect("section.key");
            let value: toml::Value = toml::from_str(&format!("x = {v}"))
                .map(|t: toml::Table| t["x"].clone())
                .expect("value");
            let table = loaded
                .scenario
                .cluster
                .overrides
                .entry(section.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            table.as_table_mut().expect("table").insert(key.to_string(), value);
        }
        let plan = eptwin_engine::Plan::build(&loaded).expect("plan");
        let mut sim = Simulator::new(SimOptions::default());
        let result = eptwin_engine::api::run(&plan, &mut sim, Provenance::default()).expect("run");
        for f in &result.failures {
            println!("  FAILURE {f}");
        }
        for job in &result.jobs {
            for op in &job.ops {
                if let Some(r) = &op.reference {
                    let (publ, simv) = match (r.latency_us, r.logical_bw_gbps) {
                        (Some(l), _) => (l, op.summary.latency_us.mean),
                        (None, Some(b)) => (b, op.summary.logical_bw_gbps),
                        _ => continue,
                    };
                    println!(
                        "{:<22} {:<9} {:>10.1} {:>10.1} {:>+8.1}",
                        result.scenario.name, op.op, publ, simv, r.error_pct
                    );
                    errors.push(r.error_pct.abs());
                }
            }
        }
    }
    errors.sort_by(f64::total_cmp);
    if !errors.is_empty() {
        let mid = errors.len() / 2;
        let median = if errors.len().is_multiple_of(2) {
            (errors[mid - 1] + errors[mid]) / 2.0
        } else {
            errors[mid]
        };
        println!("median |error| {median:.1}%  max {:.1}%", errors[errors.len() - 1]);
    }
}
