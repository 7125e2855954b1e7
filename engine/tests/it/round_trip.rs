//! Any scenario the validator accepts round-trips through TOML unchanged.

use eptwin_engine::deepep::validate::validate;
use eptwin_engine::scenario::schema::{Dtype, RoutingKind, Scenario};
use eptwin_engine::scenario::source::SourceMap;
use eptwin_engine::scenario::to_toml;
use eptwin_engine::units::ByteSize;
use eptwin_engine::{load, parse};
use proptest::prelude::*;

use crate::scenario_files;

fn assert_round_trip(scenario: &Scenario) {
    let text = to_toml(scenario);
    let again = parse("round-trip.toml", &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(&again.scenario, scenario, "changed through TOML:\n{text}");
}

#[test]
fn library_round_trips() {
    for path in scenario_files() {
        assert_round_trip(&load(&path).unwrap().scenario);
    }
}

fn library() -> Vec<Scenario> {
    scenario_files().iter().map(|p| load(p).unwrap().scenario).collect()
}

/// Random edits of library scenarios over the knobs users turn.
fn mutated() -> impl Strategy<Value = Scenario> {
    let scenarios = library();
    (
        0..scenarios.len(),
        prop::option::of(1u32..40),
        prop::option::of(prop::sample::select(vec![2u32, 4, 6, 8, 16, 20, 24, 32, 48])),
        prop::option::of(1u32..64),
        prop::option::of(prop::sample::select(vec![1u32, 32, 64, 128, 256, 511, 1024])),
        prop::option::of(prop::sample::select(vec![128u64, 256, 1000, 1024, 4096, 100_000])),
        prop::option::of(0u8..16),
        prop::option::of(prop::sample::select(vec![
            64u64 << 20,
            1 << 30,
            2 << 30,
            2_000_000_000,
            8 << 30,
        ])),
        prop::option::of(prop_oneof![
            Just(RoutingKind::Uniform),
            Just(RoutingKind::NodeLimited),
            Just(RoutingKind::Zipf)
        ]),
        prop::option::of(prop_oneof![Just(Dtype::Fp8), Just(Dtype::Bf16)]),
        any::<u64>(),
    )
        .prop_map(
            move |(i, nodes, sms, qps, tokens, depth, sl, rdma, routing, dtype, seed)| {
                let mut s = scenarios[i].clone();
                if let Some(n) = nodes {
                    s.cluster.nodes = Some(n);
                }
                for job in &mut s.jobs {
                    if let Some(b) = job.buffer.as_mut() {
                        if let Some(v) = sms {
                            b.num_sms = v;
                        }
                        if let Some(v) = qps {
                            b.num_qps_per_rank = v;
                        }
                        if let Some(v) = rdma {
                            b.num_rdma_bytes = ByteSize(v);
                        }
                    }
                    if let Some(w) = job.workload.as_mut() {
                        if let Some(v) = tokens {
                            w.tokens_per_rank = v;
                        }
                        if let Some(v) = routing {
                            w.routing = v;
                            if v == RoutingKind::Zipf {
                                w.skew = Some(1.1);
                            }
                        }
                        if let Some(v) = dtype {
                            w.dispatch_dtype = v;
                        }
                        w.seed = seed;
                    }
                    if let Some(v) = depth {
                        job.env.insert("NVSHMEM_QP_DEPTH".into(), v.to_string());
                    }
                    if let Some(v) = sl {
                        job.env.insert("NVSHMEM_IB_SL".into(), v.to_string());
                    }
                }
                s
            },
        )
}

proptest! {
    #![proptest_config(eptwin_engine::testing::proptest_config(1000))]

    #[test]
    fn accepted_scenarios_round_trip(scenario in mutated()) {
        let text = to_toml(&scenario);
        let source = SourceMap::new("mutated.toml", text.clone());
        let (diagnostics, validated) = validate(&scenario, &source);
        if validated.is_some() {
            prop_assert!(diagnostics.iter().all(|d| !d.is_error()));
            let again = parse("mutated.toml", &text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(again.scenario, scenario);
        }
    }
}

/// Guard against a vacuous property: a good share of the mutations must be valid scenarios.
#[test]
fn mutations_are_often_valid() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let strategy = mutated();
    let mut accepted = 0;
    for _ in 0..300 {
        let scenario = strategy.new_tree(&mut runner).unwrap().current();
        let source = SourceMap::new("m.toml", to_toml(&scenario));
        if validate(&scenario, &source).1.is_some() {
            accepted += 1;
        }
    }
    assert!(accepted >= 30, "only {accepted} of 300 mutations validate");
}
