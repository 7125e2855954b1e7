//! Data-driven: every scenario in `scenarios/` (and the validation suite) runs on the
//! simulator with verdict ok and sane summaries; results are deterministic.

use eptwin_engine::result::Verdict;

use crate::util::{plan_of_file, repo, run, tomls};

#[test]
fn every_scenario_runs_with_sane_summaries() {
    let root = repo().join("scenarios");
    let mut files = tomls(&root);
    files.extend(tomls(&root.join("validation")));
    assert!(files.len() >= 20, "found {} scenarios", files.len());
    let mut report = Vec::new();
    for f in &files {
        let plan = plan_of_file(f);
        let r = run(&plan);
        assert_eq!(
            r.verdict,
            Verdict::Ok,
            "{}: {:?} {:?}",
            f.display(),
            r.failures,
            r.waived_reason
        );
        for job in &r.jobs {
            assert!(!job.ops.is_empty(), "{}: job {} has no ops", f.display(), job.name);
            for op in &job.ops {
                let s = &op.summary;
                let lat = s.latency_us.mean;
                assert!(
                    lat > 0.0 && lat.is_finite() && lat < 1e6,
                    "{}: {} {} latency {lat}",
                    f.display(),
                    job.name,
                    op.op
                );
                assert!(
                    s.latency_us.min <= s.latency_us.p50 && s.latency_us.p50 <= s.latency_us.max
                );
                assert!(
                    s.nvlink_bytes + s.rdma_bytes > 0,
                    "{}: {} {} moved no bytes",
                    f.display(),
                    job.name,
                    op.op
                );
                // Headers only add bytes on the wire.
                assert!(
                    s.wire_bytes >= s.rdma_bytes,
                    "{}: wire {} < rdma {}",
                    f.display(),
                    s.wire_bytes,
                    s.rdma_bytes
                );
                assert!(
                    !s.checks.is_empty(),
                    "{}: {} {} ran no checks",
                    f.display(),
                    job.name,
                    op.op
                );
                report.push(format!(
                    "{:<28} {:<8} {:<9} {:>10.2} us {:>9.2} GB/s",
                    r.scenario.name, job.name, op.op, lat, s.logical_bw_gbps
                ));
            }
        }
    }
    println!("{}", report.join("\n"));
}

#[test]
fn same_scenario_gives_byte_identical_results() {
    for name in ["ep16-ll.toml", "vl-isolation-separate.toml", "ep16-normal-internode.toml"] {
        let plan = plan_of_file(&repo().join("scenarios").join(name));
        let a = run(&plan).to_json();
        let b = run(&plan).to_json();
        assert_eq!(a, b, "{name}: two runs differ");
    }
}

#[test]
fn the_seed_changes_the_workload() {
    let path = repo().join("scenarios/ep16-ll.toml");
    let text = std::fs::read_to_string(&path).expect("read");
    let other = text.replace("masked_selections = 10", "masked_selections = 10\nseed = 7");
    let a = run(&crate::util::plan_of_text("a", &text));
    let b = run(&crate::util::plan_of_text("b", &other));
    assert_ne!(
        a.jobs[0].ops[0].summary.latency_us.mean, b.jobs[0].ops[0].summary.latency_us.mean,
        "a different seed routes differently"
    );
}
