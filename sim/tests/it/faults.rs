//! Faults (docs/design.md, "Faults"; docs/scenario.md, "Faults"): what a straggler, a dead
//! rank, a dead NIC, a lossy fabric and degraded NVLink do to DeepEP's dispatch and combine,
//! with the acceptance figures of issue 43.

use eptwin_engine::result::{RunResult, Verdict};
use eptwin_engine::testing::ScenarioDraft;
use proptest::prelude::*;

use crate::properties::{
    fabric, fabric_toml, ll, ll_toml, normal, normal_toml, traffic_job, traffic_toml,
};
use crate::util::{latency_us, run};

/// `ep16-ll` (16 ranks, 2 nodes) with a short run and `faults` appended.
fn ep16_ll(faults: &str) -> ScenarioDraft {
    let base = ScenarioDraft::bundled("ep16-ll")
        .set("job[0].workload.warmup", 1)
        .set("job[0].workload.iterations", 3);
    ScenarioDraft::from_text("scenarios/ep16-ll.toml", &format!("{}\n{faults}", base.text()))
}

fn failures(r: &RunResult) -> String {
    r.failures.join("\n")
}

/// Rank 3 of `scenario` (16 ranks) starting every op `delay_us` late.
fn straggler(scenario: &str, delay_us: u32) -> RunResult {
    let base = ScenarioDraft::bundled(scenario)
        .set("job[0].workload.warmup", 1)
        .set("job[0].workload.iterations", 3);
    let fault = format!("[[fault]]\nkind = \"straggler\"\nranks = \"3\"\ndelay_us = {delay_us}\n");
    let text = format!("{}\n{fault}", base.text());
    let r = run(&ScenarioDraft::from_text(&format!("scenarios/{scenario}.toml"), &text).plan());
    assert_eq!(r.verdict, Verdict::Ok, "{}", failures(&r));
    r
}

/// Issue 43's estimate: the 15 peers wait ≈ 50 µs for the straggler's messages and it waits
/// for nobody, so the mean over 16 ranks rises by ≈ 50 × 15/16 µs. The model gives less: the
/// straggler's own kernel shortens (its peers' messages are waiting when it starts), and its
/// same-node peers receive its NVLink messages while they still wait for the RDMA ones.
#[test]
fn a_straggler_raises_the_mean_by_about_its_delay_times_15_of_16() {
    let healthy = straggler("ep16-ll", 0);
    let slow = straggler("ep16-ll", 50);
    let want = 50.0 * 15.0 / 16.0;
    for op in ["dispatch", "combine"] {
        let grew = latency_us(&slow, "decode", op) - latency_us(&healthy, "decode", op);
        assert!((0.7 * want..=want).contains(&grew), "{op}: +{grew:.2} us, estimate {want} us");
    }
}

/// Beyond the slack it finds, each µs of delay costs the 15 peers a µs: with every peer over
/// RDMA (no NVLink slack) the mean's slope between 50 and 100 µs is ≈ 15/16.
#[test]
fn past_the_slack_a_straggler_costs_15_of_16_of_its_delay() {
    let (d50, d100) = (straggler("ep16-ll-pure-rdma", 50), straggler("ep16-ll-pure-rdma", 100));
    for op in ["dispatch", "combine"] {
        let slope = (latency_us(&d100, "decode", op) - latency_us(&d50, "decode", op)) / 50.0;
        assert!((0.8..=1.0).contains(&slope), "{op}: {slope:.3} us per us of delay");
    }
}

#[test]
fn a_dead_rank_without_shrink_is_deepeps_timeout() {
    let r = run(&ep16_ll("[[fault]]\nkind = \"rank_down\"\nranks = \"5\"\nat_us = 0\n").plan());
    assert_eq!(r.verdict, Verdict::Failed);
    let f = failures(&r);
    assert!(f.contains("Warning: DeepEP timeout for dispatch receive, rank "), "{f}");
    assert!(f.contains("src_rank 5 (no shrink mode: the kernel traps)"), "{f}");
    assert!(f.contains("NUM_TIMEOUT_CYCLES = 200000000000 cycles ≈ 101.0 s at 1.98 GHz"), "{f}");
    assert!(f.contains("it gives up at t = 101.0"), "{f}");
    assert!(f.contains("rank 5 down from t = 0.000000 s (fault[0] rank_down)"), "{f}");
}

#[test]
fn a_dead_rank_with_shrink_is_masked_and_the_run_goes_on() {
    let faults = "[[fault]]\nkind = \"rank_down\"\nranks = \"5\"\nat_us = 0\n";
    let r = run(&ep16_ll(faults).set("job[0].buffer.enable_shrink", true).plan());
    assert_eq!(r.verdict, Verdict::Ok, "{}", failures(&r));
    assert_eq!(r.jobs[0].masked_ranks, vec![5]);
    // The first op (a warmup) waited out the timeout; the timed ones skip rank 5 and take
    // about as long as a healthy run.
    let healthy = run(&ep16_ll("").plan());
    for op in ["dispatch", "combine"] {
        let (now, before) = (latency_us(&r, "decode", op), latency_us(&healthy, "decode", op));
        assert!(now < 1.2 * before, "{op}: {now} us after masking, {before} us healthy");
    }
}

#[test]
fn faults_keep_results_deterministic() {
    let faults = "[[fault]]\nkind = \"straggler\"\nranks = \"0-3\"\n\
                  delay = { dist = \"normal\", mean_us = 5, sd_us = 3 }\n";
    let plan = ep16_ll(faults).plan();
    let (a, b) = (run(&plan), run(&plan));
    assert_eq!(a.to_json(), b.to_json());
    // Per-op draws: the timed iterations differ.
    let samples = &a.jobs[0].ops[0].samples;
    assert!(samples.windows(2).any(|w| w[0].latency_us != w[1].latency_us), "{samples:?}");
}

#[test]
fn degraded_nvlink_slows_intranode_traffic() {
    let base = ScenarioDraft::bundled("ep8-normal-intranode")
        .set("job[0].workload.warmup", 0)
        .set("job[0].workload.iterations", 1);
    let healthy = run(&base.plan());
    let text = format!(
        "{}\n[[fault]]\nkind = \"nvlink_degraded\"\nnode = 0\nfraction = 0.5\n",
        base.text()
    );
    let slow = run(&ScenarioDraft::from_text("scenarios/ep8-normal-intranode.toml", &text).plan());
    assert_eq!(slow.verdict, Verdict::Ok, "{}", failures(&slow));
    let (h, s) =
        (latency_us(&healthy, "train", "dispatch"), latency_us(&slow, "train", "dispatch"));
    assert!(s > 1.3 * h, "half the NVLink bandwidth: {s} us vs {h} us");
}

/// `scenario` with `iterations` timed rounds and `faults` appended.
fn with_faults(scenario: &str, iterations: u32, faults: &str) -> ScenarioDraft {
    let base = ScenarioDraft::bundled(scenario)
        .set("job[0].workload.warmup", 1)
        .set("job[0].workload.iterations", iterations);
    ScenarioDraft::from_text(
        &format!("scenarios/{scenario}.toml"),
        &format!("{}\n{faults}", base.text()),
    )
}

/// RC recovers every lost packet (go-back-N, ACK timeouts): the run is correct, with a
/// latency tail, and repeatable.
#[test]
fn packet_loss_on_roce_is_a_latency_tail_not_lost_tokens() {
    let plan =
        with_faults("roce-ep16-ll", 20, "[[fault]]\nkind = \"packet_loss\"\nrate = 1e-4\n").plan();
    let r = run(&plan);
    assert_eq!(r.verdict, Verdict::Ok, "{}", failures(&r));
    for op in &r.jobs[0].ops {
        let s = &op.summary;
        assert_eq!(s.wrong, 0);
        assert!(!s.checks.is_empty());
        assert!(s.latency_us.p99 > s.latency_us.p50, "{}: {:?}", op.op, s.latency_us);
    }
    assert_eq!(r.to_json(), run(&plan).to_json(), "same seed, same result");
}

#[test]
fn a_nic_down_for_good_fails_its_qps_then_deepep_times_out() {
    let faults = "[[fault]]\nkind = \"nic_down\"\nnode = 1\nnic = 0\nat_us = 0\n";
    let r = run(&with_faults("ep16-ll", 1, faults).plan());
    assert_eq!(r.verdict, Verdict::Failed);
    let f = failures(&r);
    assert!(f.contains("Warning: DeepEP timeout for dispatch receive"), "{f}");
    assert!(
        f.contains("NIC 0 of node 1 down from t = 0.000000 s for good (fault[0] nic_down)"),
        "{f}"
    );
    // Eight transmissions (the first and 7 retries), 4.29 s apart, then the QPs fail.
    assert!(f.contains("QP(s) failed with IBV_WC_RETRY_EXC_ERR (transport retry counter exceeded: retry_cnt 7 retries of the 4.29 s local ACK timeout), the first at t = 34.3"), "{f}");
}

#[test]
fn a_nic_back_up_before_the_retries_run_out_costs_seconds_not_the_run() {
    let faults =
        "[[fault]]\nkind = \"nic_down\"\nnode = 1\nnic = 0\nat_us = 0\nduration_us = 5000000\n";
    let r = run(&with_faults("ep16-ll", 1, faults).plan());
    assert_eq!(r.verdict, Verdict::Ok, "{}", failures(&r));
    // The first op waits out ACK timeouts of 4.29 s until the port is back.
    assert!(r.jobs[0].ops.iter().all(|o| o.summary.wrong == 0));
}

/// One `[[fault]]` drawn as numbers, made concrete for a cluster of `nodes` × `gpus`.
#[derive(Debug, Clone)]
struct RawFault {
    kind: u8,
    a: u32,
    b: u32,
    c: u32,
}

fn raw_fault() -> impl Strategy<Value = RawFault> {
    (0u8..5, any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(kind, a, b, c)| RawFault {
        kind,
        a,
        b,
        c,
    })
}

fn fault_toml(f: &RawFault, nodes: u32, gpus: u32) -> String {
    let ranks = nodes * gpus;
    let pick = |x: u32, xs: &[&str]| xs[x as usize % xs.len()].to_string();
    let body = match f.kind {
        0 => {
            let delay = if f.b.is_multiple_of(2) {
                format!("delay_us = {}", f.c % 200)
            } else {
                format!(
                    "delay = {{ dist = \"normal\", mean_us = {}, sd_us = {} }}",
                    f.c % 50,
                    f.b % 20
                )
            };
            format!("kind = \"straggler\"\nranks = \"{}\"\n{delay}", f.a % ranks)
        }
        1 => format!(
            "kind = \"rank_down\"\nranks = \"{}\"\nat_us = {}",
            f.a % ranks,
            pick(f.b, &["0", "50", "1000"])
        ),
        2 => format!(
            "kind = \"nic_down\"\nnode = {}\nnic = {}\nat_us = {}\n{}",
            f.a % nodes,
            f.b % gpus,
            pick(f.c, &["0", "20", "100"]),
            pick(f.c / 3, &["", "duration_us = 10", "duration_us = 5000000"])
        ),
        3 => format!("kind = \"packet_loss\"\nrate = {}", pick(f.a, &["0.001", "0.05", "0.5"])),
        _ => format!(
            "kind = \"nvlink_degraded\"\nnode = {}\nfraction = {}",
            f.a % nodes,
            pick(f.b, &["0.1", "0.5", "1.0"])
        ),
    };
    format!("\n[[fault]]\n{body}\n")
}

/// The entries of `faults`, leaving out what the scenario format refuses twice (a second
/// packet loss, a node's NVLink degraded twice).
fn faults_toml(faults: &[RawFault], nodes: u32, gpus: u32) -> String {
    let mut seen = Vec::new();
    let mut text = String::new();
    for f in faults {
        let once = match f.kind {
            3 => Some(u32::MAX),
            4 => Some(f.a % nodes),
            _ => None,
        };
        if let Some(key) = once {
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
        }
        text.push_str(&fault_toml(f, nodes, gpus));
    }
    text
}

/// What any run with faults must show: it ends (the test returning is the bound), `ok` only
/// when every check passed (no token lost silently: a masked rank only in shrink mode), or
/// `failed` with a timeout that names DeepEP's (or a traffic job's) error — never a broken
/// model invariant or a deadlock; and the same result twice.
fn assert_faulty_run_is_sound(text: &str, shrink: bool) -> Result<(), TestCaseError> {
    let plan = ScenarioDraft::from_text("prop", text).plan();
    let r = run(&plan);
    match r.verdict {
        Verdict::Ok => {
            for job in &r.jobs {
                prop_assert!(shrink || job.masked_ranks.is_empty(), "{}", text);
                for op in &job.ops {
                    prop_assert!(!op.summary.checks.is_empty(), "{} ran no checks", op.op);
                    prop_assert_eq!(op.summary.wrong, 0, "{}", text);
                }
            }
        }
        Verdict::Failed => {
            let f = failures(&r);
            // DeepEP's trap, or (shrink mode waiting on) past the model's clock limit.
            let bounded = f.contains("gives up at t = ") || f.contains("simulated time passed");
            prop_assert!(f.starts_with("timeout: ") && bounded, "{f}\n{text}");
            prop_assert!(!f.contains("invariant") && !f.contains("deadlock"), "{f}\n{text}");
        }
        Verdict::Waived => prop_assert!(false, "waived: {:?}", r.waived_reason),
    }
    prop_assert_eq!(r.to_json(), run(&plan).to_json());
    Ok(())
}

proptest! {
    #![proptest_config(eptwin_engine::testing::proptest_config(300))]

    /// Random fault sets on random low-latency jobs (with and without shrink mode).
    #[test]
    fn low_latency_survives_any_fault(
        c in ll(), faults in prop::collection::vec(raw_fault(), 1..=3), shrink in any::<bool>(),
    ) {
        let (nodes, gpus) = if c.ranks <= 8 { (1, c.ranks) } else { (c.ranks / 8, 8) };
        let mut text = ll_toml(&c)
            .replace("iterations = 1", "iterations = 2")
            .replace("\nlow_latency_mode = true", &format!("\nlow_latency_mode = true\nenable_shrink = {shrink}"));
        text.push_str(&faults_toml(&faults, nodes, gpus));
        assert_faulty_run_is_sound(&text, shrink)?;
    }

    /// Random fault sets on random normal-mode jobs (intranode and internode).
    #[test]
    fn normal_kernels_survive_any_fault(
        c in normal(), faults in prop::collection::vec(raw_fault(), 1..=3),
    ) {
        let gpus = c.ranks / c.nodes;
        let mut text = normal_toml(&c);
        text.push_str(&faults_toml(&faults, c.nodes, gpus));
        assert_faulty_run_is_sound(&text, false)?;
    }

    /// Random fault sets (no dead rank: background jobs are not DeepEP's) on random fabrics
    /// with 1–3 traffic jobs. Lost packets are modelled under static routing only.
    #[test]
    fn traffic_survives_any_fault(
        f in fabric(),
        jobs in prop::collection::vec(traffic_job(), 1..=3),
        faults in prop::collection::vec(raw_fault(), 1..=3),
    ) {
        let mut text = format!("schema = 1\nname = \"prop\"\n{}", fabric_toml(&f));
        for (i, j) in jobs.iter().enumerate() {
            text.push_str(&traffic_toml(i, j));
        }
        let keep: Vec<RawFault> = faults
            .into_iter()
            .filter(|x| x.kind != 1 && !(f.adaptive && (x.kind == 2 || x.kind == 3)))
            .collect();
        text.push_str(&faults_toml(&keep, f.nodes, f.gpus));
        assert_faulty_run_is_sound(&text, false)?;
    }
}
