//! `--trace`: the Chrome trace-event JSON parses and has tracks per GPU, NIC, QP and switch
//! port, X events, counters and flows, in simulated time.

use eptwin_engine::api::Provenance;
use eptwin_sim::{SimOptions, Simulator};

use eptwin_engine::testing::ScenarioDraft;

#[test]
fn trace_is_standard_chrome_trace_json() {
    let plan = ScenarioDraft::bundled("ep16-ll").plan();
    let mut sim = Simulator::new(SimOptions { trace: true });
    let r = eptwin_engine::api::run(&plan, &mut sim, Provenance::default()).expect("run");
    assert!(r.failures.is_empty());
    let json = sim.trace_json().expect("a trace");
    let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let count = |ph: &str| events.iter().filter(|e| e["ph"] == ph).count();
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "M")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert!(count("X") > 1000, "complete events");
    assert!(count("C") > 10, "counters");
    assert!(count("s") > 10 && count("s") == count("f"), "flows");
    for want in ["GPU 0", "NIC 0", "NVLink egress", "rank 0 kernels", "leaf0 (rail 0)"] {
        assert!(names.iter().any(|n| n.starts_with(want)), "no track named {want:?}");
    }
    assert!(names.iter().any(|n| n.starts_with("QP ")), "QP tracks");
    // Dispatch and combine were simulated separately: both appear, one after the other.
    let kernels: Vec<(f64, &str)> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"].as_u64() == Some(0) && e["pid"] == 1)
        .map(|e| (e["ts"].as_f64().unwrap(), e["name"].as_str().unwrap()))
        .collect();
    assert!(kernels.iter().any(|k| k.1.starts_with("dispatch")));
    let d = kernels.iter().find(|k| k.1.starts_with("dispatch")).unwrap().0;
    let c = kernels.iter().find(|k| k.1.starts_with("combine")).expect("combine kernel").0;
    assert!(c > d, "combine laid out after dispatch");
}
