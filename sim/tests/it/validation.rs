//! The validation suite: DeepEP V1's published rows (docs/design.md, DeepEP §18) against the
//! simulator with the bundled `h800-cx7` profile. Prints the table; fails if any row drifts beyond
//! its tolerance.

use eptwin_engine::testing::{ScenarioDraft, repo_root, tomls};

use crate::util::{latency_us, run};

#[test]
fn published_deepep_rows_within_tolerance() {
    let files: Vec<_> = tomls(&repo_root().join("scenarios/validation"))
        .into_iter()
        .filter(|f| !is_v2(f))
        .collect();
    assert_eq!(files.len(), 7, "one scenario per published row");
    let mut lines = vec![format!(
        "{:<22} {:<9} {:>8} {:>10} {:>10} {:>8} {:>6}",
        "scenario", "op", "metric", "published", "simulated", "error%", "tol%"
    )];
    let mut errors = Vec::new();
    let mut bad = Vec::new();
    for f in &files {
        let plan = ScenarioDraft::read(f).plan();
        assert_eq!(plan.profile.name, "h800-cx7", "{}: the suite uses one profile", f.display());
        let r = run(&plan);
        assert!(r.failures.is_empty(), "{}: {:?}", f.display(), r.failures);
        for job in &r.jobs {
            for op in &job.ops {
                let c = op
                    .reference
                    .as_ref()
                    .unwrap_or_else(|| panic!("{}: {} has no reference", f.display(), op.op));
                let (metric, published, simulated) = match (c.latency_us, c.logical_bw_gbps) {
                    (Some(l), _) => ("us", l, op.summary.latency_us.mean),
                    (None, Some(b)) => ("GB/s", b, op.summary.logical_bw_gbps),
                    _ => panic!("empty reference"),
                };
                lines.push(format!(
                    "{:<22} {:<9} {:>8} {:>10.1} {:>10.1} {:>+8.1} {:>6.0}",
                    r.scenario.name,
                    op.op,
                    metric,
                    published,
                    simulated,
                    c.error_pct,
                    c.tolerance_pct
                ));
                errors.push(c.error_pct.abs());
                if !c.within_tolerance {
                    bad.push(format!("{} {}: {:+.1}%", r.scenario.name, op.op, c.error_pct));
                }
            }
        }
    }
    errors.sort_by(f64::total_cmp);
    let mid = errors.len() / 2;
    let median = if errors.len().is_multiple_of(2) {
        (errors[mid - 1] + errors[mid]) / 2.0
    } else {
        errors[mid]
    };
    lines.push(format!("median |error| {median:.1}%, max {:.1}%", errors[errors.len() - 1]));
    println!("{}", lines.join("\n"));
    assert!(bad.is_empty(), "rows beyond tolerance: {bad:?}");
    assert_eq!(errors.len(), 14, "7 rows x (dispatch, combine)");
}

/// DeepEP V2's rows (`deepep-v2-*.toml`), checked on their "(SO)" bandwidth.
fn is_v2(f: &std::path::Path) -> bool {
    f.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("deepep-v2"))
}

/// DeepEP V2's published row (README @dd758ca: SM90 + CX7, EP 8 x 2, 12 SMs, dispatch 90 /
/// combine 81 GB/s) against the simulator on its "(SO)" bandwidth, as test_ep.py prints it.
#[test]
fn published_deepep_v2_row_within_tolerance() {
    let files: Vec<_> =
        tomls(&repo_root().join("scenarios/validation")).into_iter().filter(|f| is_v2(f)).collect();
    assert_eq!(files.len(), 1, "V2's README has one row");
    let mut bad = Vec::new();
    for f in &files {
        let r = run(&ScenarioDraft::read(f).plan());
        assert!(r.failures.is_empty(), "{}: {:?}", f.display(), r.failures);
        for op in &r.jobs[0].ops {
            let c = op.reference.as_ref().expect("a reference per op");
            let published = c.so_bw_gbps.expect("an SO reference");
            let simulated = op.summary.so_bw_gbps.expect("a V2 op reports so_bw_gbps");
            println!(
                "{:<18} {:<9} SO published {published:>6.1} simulated {simulated:>6.1} GB/s ({:+.1}%), SU {:.1} GB/s",
                r.scenario.name,
                op.op,
                c.error_pct,
                op.summary.su_bw_gbps.unwrap_or(0.0)
            );
            assert!((simulated - published) / published * 100.0 - c.error_pct < 1e-9);
            if !c.within_tolerance {
                bad.push(format!("{} {}: {:+.1}%", r.scenario.name, op.op, c.error_pct));
            }
        }
    }
    assert!(bad.is_empty(), "V2 rows beyond tolerance: {bad:?}");
}

/// The shape must come out of the model: internode bandwidth falls from EP32 to EP64,
/// low-latency latency grows with EP, combine costs more than dispatch.
#[test]
fn shape_of_the_published_tables() {
    let bw = |name: &str, op: &str| {
        let r = run(&ScenarioDraft::bundled(&format!("validation/{name}")).plan());
        r.jobs[0].ops.iter().find(|o| o.op == op).expect("op").summary.clone()
    };
    let ep32 = bw("deepep-normal-ep32", "dispatch");
    let ep64 = bw("deepep-normal-ep64", "dispatch");
    assert!(
        ep64.logical_bw_gbps < ep32.logical_bw_gbps,
        "EP64 {} >= EP32 {}",
        ep64.logical_bw_gbps,
        ep32.logical_bw_gbps
    );
    let mut last = 0.0;
    for ep in [8, 16, 32] {
        let d = bw(&format!("deepep-ll-ep{ep}"), "dispatch").latency_us.mean;
        let c = bw(&format!("deepep-ll-ep{ep}"), "combine").latency_us.mean;
        assert!(d > last, "LL dispatch latency grows with EP");
        assert!(c > d, "LL EP{ep}: combine {c} costs more than dispatch {d}");
        last = d;
    }
}

/// Beyond the published rows (EP8–32), low-latency latency keeps growing with EP and
/// flattens: from EP64 on a doubling adds under 15 % and under half the relative growth of
/// EP16 → EP32. The check is on the slope: combine's step from EP128 to EP256 is not smaller
/// than the one before it. Pure RDMA (NVLink disallowed) is never faster, and the two curves
/// meet at large EP, where the share of a rank's messages that stays on its node (8/EP of the
/// experts) vanishes.
#[test]
fn low_latency_latency_flattens_at_large_ep() {
    let eps = [8u32, 16, 32, 64, 128, 256];
    let curve = |prefix: &str| -> Vec<[f64; 2]> {
        eps.iter()
            .map(|ep| {
                let r = run(&ScenarioDraft::bundled(&format!("ll-ep-sweep/{prefix}{ep}")).plan());
                [latency_us(&r, "ll", "dispatch"), latency_us(&r, "ll", "combine")]
            })
            .collect()
    };
    let nvl = curve("ll-ep");
    let rdma = curve("ll-rdma-ep");
    println!("EP    NVLink dispatch/combine (us)   pure RDMA dispatch/combine (us)");
    for (i, ep) in eps.iter().enumerate() {
        println!(
            "{ep:<5} {:>10.1} {:>10.1}             {:>10.1} {:>10.1}",
            nvl[i][0], nvl[i][1], rdma[i][0], rdma[i][1]
        );
    }
    for (op, name) in ["dispatch", "combine"].iter().enumerate() {
        for c in [&nvl, &rdma] {
            for w in c.windows(2) {
                assert!(w[1][op] > w[0][op], "{name}: latency must grow with EP: {c:?}");
            }
        }
        // growth[k]: relative growth from EP 8·2^k to EP 8·2^(k+1).
        let growth: Vec<f64> = nvl.windows(2).map(|w| w[1][op] / w[0][op] - 1.0).collect();
        for &g in &growth[3..] {
            assert!(
                g < 0.15 && g < 0.5 * growth[1],
                "{name}: no flattening at large EP: growth per doubling {growth:?}"
            );
        }
        for i in 0..eps.len() {
            assert!(rdma[i][op] >= nvl[i][op], "{name} EP{}: pure RDMA faster", eps[i]);
        }
        let gap = rdma[5][op] / nvl[5][op] - 1.0;
        assert!(gap < 0.10, "{name} EP256: pure RDMA {:.1}% slower", 100.0 * gap);
    }
    for c in [&nvl, &rdma] {
        assert!(c.iter().all(|p| p[1] > p[0]), "combine costs more than dispatch: {c:?}");
    }
}
