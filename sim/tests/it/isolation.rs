//! VL isolation (issue 3): an LL decode job on its own high-priority VL next to a saturating
//! all-to-all keeps its latency within 15% of running alone; on one shared VL it inflates by
//! 1.5x or more.

use eptwin_engine::testing::ScenarioDraft;

use crate::util::{latency_us, run};

#[test]
fn separate_vl_isolates_decode_shared_vl_does_not() {
    let alone = run(&ScenarioDraft::bundled("vl-isolation-alone").plan());
    let shared = run(&ScenarioDraft::bundled("vl-isolation-shared").plan());
    let separate = run(&ScenarioDraft::bundled("vl-isolation-separate").plan());
    for r in [&alone, &shared, &separate] {
        assert!(r.failures.is_empty(), "{}: {:?}", r.scenario.name, r.failures);
    }
    for op in ["dispatch", "combine"] {
        let a = latency_us(&alone, "decode", op);
        let sh = latency_us(&shared, "decode", op);
        let se = latency_us(&separate, "decode", op);
        println!(
            "decode {op}: alone {a:.1} us, separate VL {se:.1} us ({:.2}x), shared VL {sh:.1} us ({:.2}x)",
            se / a,
            sh / a
        );
        assert!(se <= 1.15 * a, "{op}: separate VL {se} > 1.15 x alone {a}");
        assert!(sh >= 1.5 * a, "{op}: shared VL {sh} < 1.5 x alone {a}");
    }
    // The bulk job still moves its data on the low-priority VL.
    let bulk = separate.jobs.iter().find(|j| j.name == "bulk").expect("bulk job");
    assert!(bulk.ops[0].summary.logical_bw_gbps > 10.0);
}
