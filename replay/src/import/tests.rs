//! The import against log fixtures written from the print formats
//! (replay/tests/fixtures/make_fixtures.py; every number invented there).

use std::path::Path;

use eptwin_engine::api::Plan;
use eptwin_engine::scenario::schema::{Dtype, Scenario};

use super::build::ranges;
use super::parse::{Line, RankLine, Tuning, TuningOf, parse_line};
use super::*;

/// A scenario of the repository with its plan (the import reads both).
fn plan(rel: &str) -> (Plan, Scenario) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    let loaded = eptwin_engine::scenario::load(&path).unwrap();
    (Plan::build(&loaded).unwrap(), loaded.scenario)
}

fn fixture(name: &str) -> (String, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    (name.to_string(), std::fs::read_to_string(path).unwrap())
}

fn import_files(
    (plan, scenario): &(Plan, Scenario),
    names: &[&str],
) -> Result<RunResult, ReplayError> {
    let texts: Vec<(String, String)> = names.iter().map(|n| fixture(n)).collect();
    let logs: Vec<LogText<'_>> = texts.iter().map(|(n, t)| LogText { name: n, text: t }).collect();
    import(plan, scenario, &logs, Provenance::default())
}

const LL16: &str = "scenarios/validation/deepep-ll-ep16.toml";

#[test]
fn rank_lines_parse() {
    let cases = [
        (
            "[rank 3] Dispatch + combine bandwidth: 66.65 GB/s, avg_t=331.48 us, min_t=322.70 us, max_t=338.82 us",
            Line::Rank(
                3,
                RankLine::Both { bw_gbps: 66.65, avg_us: 331.48, min_us: 322.70, max_us: 338.82 },
            ),
        ),
        (
            "[rank 12] Dispatch bandwidth: 63.17 GB/s, avg_t=118.23 us | Combine bandwidth: 74.10 GB/s, avg_t=195.40 us",
            Line::Rank(
                12,
                RankLine::Kernels {
                    dispatch_gbps: 63.17,
                    dispatch_us: 118.23,
                    combine_gbps: 74.10,
                    combine_us: 195.40,
                },
            ),
        ),
        (
            "[rank 0] Dispatch send/recv time: 24.78 + 71.92 us | Combine send/recv time: 32.67 + 142.21 us",
            Line::Rank(
                0,
                RankLine::Hook {
                    dispatch_send_us: 24.78,
                    dispatch_recv_us: 71.92,
                    combine_send_us: 32.67,
                    combine_recv_us: 142.21,
                },
            ),
        ),
    ];
    for (text, want) in cases {
        assert_eq!(parse_line(text), Ok(want), "{text}");
    }
}

#[test]
fn every_other_line_kind_parses() {
    let cases = [
        (
            "[tuning] SMs 24, NVL chunk 6: 153.00 GB/s (NVL), 1048.83 us",
            Line::Tuning(Tuning {
                best: None,
                sms: 24,
                nvl_chunk: Some(6),
                rdma_chunk: None,
                notify_us: None,
                t_us: 1048.83,
                rdma_gbps: None,
                nvl_gbps: 153.0,
            }),
        ),
        (
            "[tuning] SMs 24, NVL chunk default: 150.10 GB/s (NVL), 1060.00 us",
            Line::Tuning(Tuning {
                best: None,
                sms: 24,
                nvl_chunk: None,
                rdma_chunk: None,
                notify_us: None,
                t_us: 1060.0,
                rdma_gbps: None,
                nvl_gbps: 150.1,
            }),
        ),
        (
            "[tuning] Best dispatch (BF16): SMs 24, NVL chunk 8, 155.50 GB/s (NVL), t: 2001.40 us",
            Line::Tuning(Tuning {
                best: Some(TuningOf::Dispatch(Dtype::Bf16)),
                sms: 24,
                nvl_chunk: Some(8),
                rdma_chunk: None,
                notify_us: None,
                t_us: 2001.4,
                rdma_gbps: None,
                nvl_gbps: 155.5,
            }),
        ),
        (
            "[tuning] Best combine: SMs 24, NVL chunk 4: 158.00 GB/s (NVL), t: 1969.73 us",
            Line::Tuning(Tuning {
                best: Some(TuningOf::Combine),
                sms: 24,
                nvl_chunk: Some(4),
                rdma_chunk: None,
                notify_us: None,
                t_us: 1969.73,
                rdma_gbps: None,
                nvl_gbps: 158.0,
            }),
        ),
        (
            "[tuning] SMs 24, NVL chunk 36, RDMA chunk 20: 35 + 1402 us, 43.01 GB/s (RDMA), 114.50 GB/s (NVL) ",
            Line::Tuning(Tuning {
                best: None,
                sms: 24,
                nvl_chunk: Some(36),
                rdma_chunk: Some(20),
                notify_us: Some(35.0),
                t_us: 1402.0,
                rdma_gbps: Some(43.01),
                nvl_gbps: 114.5,
            }),
        ),
        (
            "[tuning] Best dispatch (FP8): SMs 24, NVL chunk 36, RDMA chunk 20: 28.22 + 1408.04 us, 42.79 GB/s (RDMA), 113.97 GB/s (NVL)",
            Line::Tuning(Tuning {
                best: Some(TuningOf::Dispatch(Dtype::Fp8)),
                sms: 24,
                nvl_chunk: Some(36),
                rdma_chunk: Some(20),
                notify_us: Some(28.22),
                t_us: 1408.04,
                rdma_gbps: Some(42.79),
                nvl_gbps: 113.97,
            }),
        ),
        (
            "[tuning] Best combine: SMs 24, NVL chunk 4, RDMA chunk 16, 30.05 + 2731.42 us, 42.78 GB/s (RDMA), 113.94 GB/s (NVL)",
            Line::Tuning(Tuning {
                best: Some(TuningOf::Combine),
                sms: 24,
                nvl_chunk: Some(4),
                rdma_chunk: Some(16),
                notify_us: Some(30.05),
                t_us: 2731.42,
                rdma_gbps: Some(42.78),
                nvl_gbps: 113.94,
            }),
        ),
        (
            "[testing] Running with FP8, with top-k (async=True, previous=False) ... passed",
            Line::Testing {
                text: "Running with FP8, with top-k (async=True, previous=False) ...".into(),
                passed: true,
            },
        ),
        ("passed", Line::Passed),
        (
            "[config] num_tokens=4096, hidden=7168, num_topk=8",
            Line::Config(vec![
                ("num_tokens".into(), "4096".into()),
                ("hidden".into(), "7168".into()),
                ("num_topk".into(), "8".into()),
            ]),
        ),
        ("[layout] Kernel performance: 0.052 ms", Line::LayoutMs(0.052)),
        ("Traceback (most recent call last):", Line::Traceback),
        (
            "3: [rank 3] Dispatch send/recv time: 1 + 2 us | Combine send/recv time: 3 + 4 us",
            Line::Rank(
                3,
                RankLine::Hook {
                    dispatch_send_us: 1.0,
                    dispatch_recv_us: 2.0,
                    combine_send_us: 3.0,
                    combine_recv_us: 4.0,
                },
            ),
        ),
        ("[rank 0] Allocating buffer of 2 GB", Line::Other),
        ("NCCL INFO Channel 00/32", Line::Other),
    ];
    for (text, want) in cases {
        assert_eq!(parse_line(text), Ok(want), "{text}");
    }
}

#[test]
fn lines_cut_short_are_errors() {
    for cut in [
        "[rank 5] Dispatch bandwidth: 63.02 GB/s,",
        "[rank 5] Dispatch + combine bandwidth: 66.65 GB/s, avg_t=331.48 us, min_t=322.",
        "[tuning] SMs 24, NVL chunk 36, RDMA chunk 20: 35 + 14",
        "[tuning] Best dispatch (FP8): SMs 24, NVL chunk 6, 153.00 GB/s (NVL), t: 10",
        "[tuning] Best dispatch (INT4): SMs 24, NVL chunk 6, 153.00 GB/s (NVL), t: 10.0 us",
        "[layout] Kernel performance: ",
        "[rank x] Dispatch bandwidth: 1 GB/s",
    ] {
        assert!(parse_line(cut).is_err(), "{cut}");
    }
}

#[test]
fn ll_ep16_two_node_logs() {
    let plan = plan(LL16);
    let r = import_files(&plan, &["ll-ep16.node1.log", "ll-ep16.node0.log"]).unwrap();
    assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
    assert_eq!(r.backend_kind(), "deepep");
    assert!(r.is_measured());
    assert_eq!(r.backend["processes"], 16);
    assert_eq!(r.backend["wire"], "verbs");
    assert_eq!(r.backend["launcher"], "shell");
    assert_eq!(r.backend["logs"].as_array().unwrap().len(), 2);
    assert_eq!(r.backend["logs"][1]["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(r.scenario.name, "deepep-ll-ep16");
    assert_eq!(r.scenario.sha256, plan.0.scenario_sha256);
    // The scenario's 2 GiB buffer is larger than the script's size hint: a warning, kept.
    assert!(
        r.advisories.iter().any(|a| a.contains("num_rdma_bytes") && a.contains("2146961792")),
        "{:?}",
        r.advisories
    );
    let job = &r.jobs[0];
    assert_eq!((job.kind.as_str(), job.ranks), ("low-latency", 16));
    let dispatch = job.op("dispatch").unwrap();
    assert_eq!(dispatch.samples.len(), 16);
    let ranks: Vec<u32> = dispatch.samples.iter().map(|s| s.rank.unwrap()).collect();
    assert_eq!(ranks, (0..16).collect::<Vec<_>>());
    // Rank 3's kernel line, from the fixture.
    let node0 = fixture("ll-ep16.node0.log").1;
    let line = node0.lines().find(|l| l.starts_with("[rank 3] Dispatch bandwidth")).unwrap();
    let Ok(Line::Rank(3, RankLine::Kernels { dispatch_us, dispatch_gbps, .. })) = parse_line(line)
    else {
        panic!("{line}")
    };
    assert_eq!(dispatch.samples[3].latency_us, dispatch_us);
    let s = &dispatch.summary;
    assert!((114.0..124.0).contains(&s.latency_us.mean), "{:?}", s.latency_us);
    assert!(s.latency_us.min <= dispatch_us && dispatch_us <= s.latency_us.max);
    // Logical bytes per rank recovered from GB/s × time: ~1,016 selections × 7,408 B.
    assert!((7.4e6..7.6e6).contains(&s.logical_bytes_per_rank), "{}", s.logical_bytes_per_rank);
    assert!((dispatch_gbps - s.logical_bw_gbps).abs() < 5.0);
    assert_eq!(s.logical_bw_label, "RDMA");
    let reference = dispatch.reference.as_ref().unwrap();
    assert_eq!(reference.latency_us, Some(118.0));
    assert!(r.measurements.contains_key("deepep.dispatch_combine"));
    assert!(r.measurements.contains_key("deepep.hook_us_mean"));
    assert_eq!(r.measurements["deepep.printed_bw_gbps_mean"]["ranks"], 16);
}

#[test]
fn interleaved_nodes_in_one_labelled_file() {
    let plan = plan(LL16);
    let r = import_files(&plan, &["ll-ep16.slurm.log"]).unwrap();
    assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
    assert_eq!(r.backend["launcher"], "slurm");
    assert_eq!(r.jobs[0].op("combine").unwrap().samples.len(), 16);
}

#[test]
fn truncated_log_fails_naming_file_line_and_ranks() {
    let plan = plan(LL16);
    let r = import_files(&plan, &["ll-ep16-truncated.node0.log", "ll-ep16.node1.log"]).unwrap();
    assert_eq!(r.verdict, Verdict::Failed);
    // The ranks of node 0 whose kernel line is complete in the cut log.
    let log = fixture("ll-ep16-truncated.node0.log").1;
    let last = log.lines().count();
    let printed: Vec<u32> = log
        .lines()
        .filter_map(|l| match parse_line(l) {
            Ok(Line::Rank(r, RankLine::Kernels { .. })) => Some(r),
            _ => None,
        })
        .collect();
    let missing: Vec<u32> = (0..8).filter(|r| !printed.contains(r)).collect();
    assert!(missing.contains(&5) && missing.contains(&6) && missing.contains(&7), "{missing:?}");
    let text = r.failures.join("\n");
    assert!(
        text.contains(&format!("ll-ep16-truncated.node0.log:{last}: a per-rank benchmark line")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "dispatch: no \"Dispatch bandwidth | Combine bandwidth\" line from rank(s) {} of 16",
            ranges(&missing)
        )),
        "{text}"
    );
    // The ranks that did print are still there.
    assert_eq!(r.jobs[0].op("dispatch").unwrap().samples.len(), 16 - missing.len());
    // A node's log missing altogether.
    let r = import_files(&plan, &["ll-ep16.node0.log"]).unwrap();
    assert!(r.failures.iter().any(|f| f.contains("rank(s) 8-15 of 16")), "{:?}", r.failures);
}

#[test]
fn another_configuration_is_an_error_naming_both_values() {
    let ll = plan(LL16);
    let err = import_files(&ll, &["ll-ep16.node0.log", "ll-ep16-256-experts.node1.log"])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("ll-ep16-256-experts.node1.log:1: another configuration"), "{err}");
    assert!(err.contains("--num-experts 256 in the log, 288 in the scenario"), "{err}");
    let err = import_files(&ll, &["ll-ep24-ranks.log"]).unwrap_err().to_string();
    assert!(err.contains("ll-ep24-ranks.log:2: another configuration: rank 23 in the log, 16 ranks in the scenario"), "{err}");
    let intranode = plan("scenarios/ep8-normal-intranode.toml");
    let err = import_files(&intranode, &["intranode-ep8-2048-tokens.log"]).unwrap_err().to_string();
    assert!(err.contains("intranode-ep8-2048-tokens.log:1: another configuration: num_tokens=2048 in the log, 4096 in the scenario"), "{err}");
    // A low-latency log for a normal-mode scenario.
    let err = import_files(&intranode, &["ll-ep16.node0.log"]).unwrap_err().to_string();
    assert!(
        err.contains(
            "the log ran test_low_latency.py; the scenario replays with test_intranode.py"
        ),
        "{err}"
    );
    // A hand-launched LL log (no launch line) of hidden 4096: its printed bytes say so.
    let text = "[rank 0] Dispatch bandwidth: 40.00 GB/s, avg_t=100.00 us | Combine bandwidth: 74.00 GB/s, avg_t=195.00 us\n";
    let err = import(&ll.0, &ll.1, &[LogText { name: "hand.log", text }], Provenance::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("hand.log:1: another configuration: rank 0's dispatch line counts 540 messages of 7408 B (40 GB/s x 100 us) in the log, 1014-1024 (128 tokens x top-8, up to 10 masked) in the scenario"),
        "{err}"
    );
    // The same node's log twice.
    let err =
        import_files(&ll, &["ll-ep16.node0.log", "ll-ep16.node0.log"]).unwrap_err().to_string();
    assert!(err.contains("a second time (first at ll-ep16.node0.log:"), "{err}");
}

#[test]
fn intranode_takes_the_tuning_line_of_the_scenarios_config() {
    let plan = plan("scenarios/ep8-normal-intranode.toml");
    let r = import_files(&plan, &["intranode-ep8.log"]).unwrap();
    assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
    assert_eq!(r.backend["wire"], "none");
    let job = &r.jobs[0];
    assert_eq!(job.kind, "intranode");
    let dispatch = job.op("dispatch").unwrap();
    // Tuned EP8 dispatch: NVL chunk 6 at 24 SMs, FP8 (the scenario's dispatch dtype).
    assert_eq!(r.measurements["deepep.dispatch.line"]["nvl_chunk"], 6);
    assert_eq!(r.measurements["deepep.dispatch.line"]["source"], "tuning");
    let log = fixture("intranode-ep8.log").1;
    let fp8_block_end =
        log.lines().position(|l| l.starts_with("[tuning] Best dispatch (FP8)")).unwrap();
    let line = log
        .lines()
        .take(fp8_block_end)
        .find(|l| l.starts_with("[tuning] SMs 24, NVL chunk 6:"))
        .unwrap();
    let Ok(Line::Tuning(t)) = parse_line(line) else { panic!() };
    assert_eq!(dispatch.samples.len(), 1);
    assert_eq!(dispatch.samples[0].latency_us, t.t_us);
    assert!((dispatch.summary.logical_bw_gbps - t.nvl_gbps).abs() < 1e-6);
    assert_eq!(dispatch.summary.logical_bw_label, "NVL");
    assert!(job.op("combine").unwrap().samples[0].latency_us > 0.0);
    assert_eq!(r.measurements["deepep.combine.line"]["nvl_chunk"], 4);
    assert_eq!(dispatch.summary.checks.len(), 16, "{:?}", dispatch.summary.checks);
    assert!(r.measurements.contains_key("deepep.best.dispatch_bf16"));
    assert!(r.measurements.contains_key("deepep.layout_ms_mean"));
}

#[test]
fn failed_assertion_makes_the_verdict_failed() {
    let plan = plan("scenarios/ep8-normal-intranode.toml");
    let r = import_files(&plan, &["intranode-ep8-failed.log"]).unwrap();
    assert_eq!(r.verdict, Verdict::Failed);
    let text = r.failures.join("\n");
    assert!(
        text.contains("intranode-ep8-failed.log:10: Python traceback: AssertionError"),
        "{text}"
    );
    assert!(text.contains("intranode-ep8-failed.log:10: check did not pass"), "{text}");
    assert!(text.contains("dispatch: neither a tuning line"), "{text}");
    assert!(r.jobs[0].op("dispatch").unwrap().summary.wrong >= 1);
}

#[test]
fn internode_two_nodes_with_notify_phase() {
    let plan = plan("scenarios/validation/deepep-normal-ep16.toml");
    let r = import_files(&plan, &["internode-ep16.node0.log", "internode-ep16.node1.log"]).unwrap();
    assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
    let job = &r.jobs[0];
    assert_eq!(job.kind, "internode");
    let combine = job.op("combine").unwrap();
    // Tuned EP16 combine: NVL chunk 4, RDMA chunk 12 (the Best line says RDMA chunk 16).
    assert_eq!(r.measurements["deepep.combine.line"]["rdma_chunk"], 12);
    assert_eq!(r.measurements["deepep.best.combine"]["rdma_chunk"], 16);
    assert!(combine.summary.phases_us.contains_key("notify"));
    assert_eq!(combine.summary.logical_bw_label, "RDMA");
    assert!(
        (40.0..44.0).contains(&combine.summary.logical_bw_gbps),
        "{}",
        combine.summary.logical_bw_gbps
    );
    let reference = combine.reference.as_ref().unwrap();
    assert_eq!(reference.logical_bw_gbps, Some(43.0));
}

#[test]
fn scenarios_the_scripts_cannot_replay_are_refused_on_import() {
    let plan = plan("scenarios/vl-isolation-shared.toml");
    let err = import_files(&plan, &["ll-ep16.node0.log"]).unwrap_err().to_string();
    assert!(err.contains("cannot replay this scenario"), "{err}");
    assert!(err.contains("refused: job \"bulk\": job.traffic"), "{err}");
}

#[test]
fn ranges_compress() {
    assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2, 5, 7-8");
    assert_eq!(ranges(&[3]), "3");
}

#[test]
fn hook_mode_takes_send_plus_recv() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(LL16);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("iterations = 3", "iterations = 3\nhook = true");
    let loaded = eptwin_engine::scenario::parse(LL16, &text).unwrap();
    let plan = (Plan::build(&loaded).unwrap(), loaded.scenario);
    let r = import_files(&plan, &["ll-ep16.node0.log", "ll-ep16.node1.log"]).unwrap();
    assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.failures);
    let log = fixture("ll-ep16.node0.log").1;
    let line = log.lines().find(|l| l.starts_with("[rank 2] Dispatch send/recv")).unwrap();
    let Ok(Line::Rank(2, RankLine::Hook { combine_send_us, combine_recv_us, .. })) =
        parse_line(line)
    else {
        panic!("{line}")
    };
    let combine = r.jobs[0].op("combine").unwrap();
    assert_eq!(combine.samples[2].latency_us, combine_send_us + combine_recv_us);
    assert_eq!(combine.samples[2].phases_us["recv"], combine_recv_us);
    assert!(combine.summary.phases_us.contains_key("send"));
    // The bytes still come from the kernel lines.
    assert!(combine.summary.logical_bytes_per_rank > 1.4e7);
}

proptest::proptest! {
    #![proptest_config(eptwin_engine::testing::proptest_config(256))]
    #[test]
    fn no_line_panics(line in "\\PC{0,120}") {
        let _ = parse_line(&line);
    }

    #[test]
    fn printed_ll_numbers_read_back(
        rank in 0u32..1024,
        values in proptest::array::uniform4(0.0f64..1e6),
    ) {
        let [a, b, c, d] = values.map(|v| (v * 100.0).round() / 100.0);
        let line = format!(
            "[rank {rank}] Dispatch bandwidth: {a:.2} GB/s, avg_t={b:.2} us | Combine bandwidth: {c:.2} GB/s, avg_t={d:.2} us"
        );
        let want = Line::Rank(rank, RankLine::Kernels { dispatch_gbps: a, dispatch_us: b, combine_gbps: c, combine_us: d });
        proptest::prop_assert_eq!(parse_line(&line), Ok(want));
        // Any cut of the line either reads as the same line or is an error, never another value.
        for cut in 1..line.len() {
            if let Ok(Line::Rank(_, l)) = parse_line(&line[..cut]) {
                proptest::prop_assert!(false, "{:?} read as {:?}", &line[..cut], l);
            }
        }
    }
}
