//! The import of DeepEP V2's test_ep.py lines against the fixtures of
//! replay/tests/fixtures/make_v2_fixtures.py (every number invented there).

use super::parse::{ElasticLine, Line, parse_line};
use super::tests::{fixture, import_files, plan};
use super::*;

const EP16: &str = "scenarios/v2-ep16-normal.toml";
const EP1: &str = "results/h100/deepep-v2-one-gpu/v2-ep1-one-gpu.toml";

#[test]
fn test_ep_lines_parse() {
    let line = "   * EP:   3/16 | dispatch: 99 GB/s (SO), 58 GB/s (SU), 535.386 us, 31305120 bytes | copy: 820 GB/s, 61.148 us";
    assert_eq!(
        parse_line(line),
        Ok(Line::Elastic(ElasticLine {
            case: '*',
            rank: 3,
            num_ranks: 16,
            so_gbps: 99.0,
            su_gbps: 58.0,
            t_us: 535.386,
            su_bytes: 31305120.0,
        }))
    );
    // Without the epilogue's figures, and with a launcher's label.
    let bare = "12:    @ EP:  12/16 | combine: 1 GB/s (SO), 2 GB/s (SU), 3.000 us, 4 bytes";
    assert!(matches!(parse_line(bare), Ok(Line::Elastic(l)) if l.case == '@' && l.rank == 12));
    assert_eq!(
        parse_line(" > Testing with dispatch=fp8, num_sms=0"),
        Ok(Line::Case("dispatch=fp8, num_sms=0".into()))
    );
    // Cut in the middle: a failure, not a silent skip.
    assert!(parse_line("   * EP:   3/16 | dispatch: 99 GB/s (SO), 58 GB/").is_err());
    assert!(parse_line("   # EP: 3/16 | notify: 1 GB/s (SO)").is_err());
    // Not test_ep.py lines.
    assert_eq!(parse_line("* a markdown bullet"), Ok(Line::Other));
    assert_eq!(parse_line(" > rank 0: dispatch received 4096 rows, passed"), Ok(Line::Other));
}

#[test]
fn ep16_two_nodes_import_the_first_configuration() {
    let p = plan(EP16);
    let r = import_files(&p, &["v2-ep16.node0.log", "v2-ep16.node1.log"]).unwrap();
    assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
    assert_eq!(r.backend["script"], "test_ep.py");
    let job = &r.jobs[0];
    assert_eq!(job.ops.len(), 2);
    let (log0, log1) = (fixture("v2-ep16.node0.log").1, fixture("v2-ep16.node1.log").1);
    for op in &job.ops {
        assert_eq!(op.samples.len(), 16, "{}", op.op);
        let mark = if op.op == "combine" { '@' } else { '*' };
        // Each sample is its rank's line of the first configuration (FP8), whichever node.
        for s in &op.samples {
            let rank = s.rank.unwrap();
            let text = if rank < 8 { &log0 } else { &log1 };
            let head = format!("{mark} EP: {rank:3}/16 |");
            let first = text
                .lines()
                .take_while(|l| !l.contains("dispatch=bf16"))
                .find(|l| l.trim_start().starts_with(&head))
                .unwrap();
            assert!(first.contains(&format!("{:.3} us", s.latency_us)), "{first}");
        }
        let so = op.summary.so_bw_gbps.unwrap();
        let su = op.summary.su_bw_gbps.unwrap();
        assert!(so > 0.0 && su > 0.0);
        // SO is the bottleneck figure the document reports as logical bandwidth.
        assert!((op.summary.logical_bw_gbps - so).abs() < 1e-9);
        assert_eq!(op.summary.logical_bw_label, "SO");
    }
    assert!(
        r.advisories.iter().any(|a| a.contains("times 2 configurations")),
        "{:?}",
        r.advisories
    );
    for case in ["dispatch", "cached_dispatch", "combine", "reduced_combine"] {
        let lines = r.measurements[&format!("deepep.v2.{case}")].as_array().unwrap();
        assert_eq!(lines.len(), 32, "{case}: 16 ranks x 2 configurations");
    }
}

#[test]
fn one_rank_log_imports() {
    let p = plan(EP1);
    let r = import_files(&p, &["v2-ep1-one-gpu.log"]).unwrap();
    assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
    let d = &r.jobs[0].ops[0];
    assert_eq!(d.op, "dispatch");
    assert_eq!(d.samples.len(), 1);
    // eptwin's test_ep.py equivalent prints its checks.
    assert!(
        d.summary.checks.iter().any(|c| c.contains("dispatch: 4096 received rows, each constant")),
        "{:?}",
        d.summary.checks
    );
    // The printed bytes are the scale-up bytes: SU = bytes / time.
    let text = fixture("v2-ep1-one-gpu.log").1;
    let line = text.lines().find(|l| l.trim_start().starts_with("* EP:")).unwrap();
    let bytes: f64 =
        line.split(" us, ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    let su = d.summary.su_bw_gbps.unwrap();
    assert!((su - bytes / (d.summary.latency_us.mean * 1e3)).abs() < 1e-9, "{su}");
}

#[test]
fn a_missing_rank_fails_and_another_shape_is_refused() {
    let p = plan(EP16);
    let r = import_files(&p, &["v2-ep16.node0.log", "v2-ep16-rank-missing.node1.log"]).unwrap();
    assert_eq!(r.verdict, Verdict::Failed);
    assert!(r.failures.iter().any(|f| f.contains("rank(s) [13]")), "{:?}", r.failures);
    // The one-rank log against the EP16 scenario: another configuration (its marker first).
    let err = import_files(&p, &["v2-ep1-one-gpu.log"]).unwrap_err().to_string();
    assert!(err.contains("another configuration") || err.contains("v2-ep1-one-gpu"), "{err}");
    // A V1 log against a V2 scenario names the script.
    let err = import_files(&p, &["ll-ep16.node0.log"]).unwrap_err().to_string();
    assert!(err.contains("test_ep.py"), "{err}");
    // The same log twice: a rank's line printed twice.
    let err = import_files(&p, &["v2-ep16.node0.log", "v2-ep16.node0.log"]).unwrap_err();
    assert!(err.to_string().contains("a second time"), "{err}");
}
