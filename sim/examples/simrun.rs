//! Run scenarios on the simulator and print the table (a development shortcut that needs only
//! the engine and the simulator; `eptwin run` is the real command).
//!
//! `cargo run --release -p eptwin-sim --example simrun -- scenarios/ep16-ll.toml [--set KEY=V]...`

use std::path::Path;

use eptwin_engine::api::Provenance;
use eptwin_sim::{SimOptions, Simulator};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let verbose = args.iter().any(|a| a == "-v");
    args.retain(|a| a != "-v");
    let mut code = 0;
    for path in &args {
        let loaded = match eptwin_engine::load(Path::new(path)) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{e}");
                code = 2;
                continue;
            }
        };
        let plan = match eptwin_engine::Plan::build(&loaded) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("{e}");
                code = 2;
                continue;
            }
        };
        let mut sim = Simulator::new(SimOptions::default());
        let result = eptwin_engine::api::run(&plan, &mut sim, Provenance::default()).expect("run");
        print!("{}", eptwin_reports::table::render(&result));
        for f in &result.failures {
            println!("  failure: {f}");
        }
        if verbose {
            for job in &result.jobs {
                for op in &job.ops {
                    let v: Vec<String> =
                        op.samples.iter().map(|s| format!("{:.1}", s.latency_us)).collect();
                    println!("  {} {}: {}", job.name, op.op, v.join(" "));
                }
            }
        }
        println!("  events: {} by kind {:?}", sim.events, sim.events_by_kind);
    }
    std::process::exit(code);
}
