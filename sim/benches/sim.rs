//! Benchmarks (criterion). Performance claims are ratios against a baseline measured in the
//! same run: the simulator's calendar queue (and the radix heap it replaced) against
//! `std::collections::BinaryHeap`, for the bare core (hold model) and for full packet-level
//! fabric runs; plus the speed targets of issue 4
//! (EP256 low-latency and EP64 normal dispatch+combine), and the `scale/` group: whole scenarios
//! (`sim/benches/scale/*.toml`, warmup and iterations as `eptwin run` runs them) from
//! low-latency EP256 to EP2048 and normal EP64 to EP160. Throughput is reported in events/s.
//!
//! `cargo bench -p eptwin-sim` (all), or e.g. `cargo bench -p eptwin-sim -- scale/`.
//! CI runs every benchmark once, without timing (`cargo bench -p eptwin-sim -- --test`).

use std::hint::black_box;
use std::path::Path;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use eptwin_engine::Plan;
use eptwin_engine::api::JobId;
use eptwin_engine::api::OpKind;
use eptwin_engine::api::Provenance;
use eptwin_engine::api::Rng;
use eptwin_engine::api::{OpSpec, Transport};
use eptwin_engine::testing::ScenarioDraft;
use eptwin_sim::core::queue::{CalendarQueue, EventQueue, HeapQueue, RadixQueue};
use eptwin_sim::core::{Action, Ev};
use eptwin_sim::{QueueChoice, SimOptions, Simulator};

/// Simulate the given ops of job 0 once on a fresh simulator; returns events handled.
fn simulate(plan: &Plan, ops: &[OpKind], queue: QueueChoice) -> u64 {
    let mut sim = Simulator::new(SimOptions::default()).with_queue(queue);
    sim.prepare(plan).expect("prepare");
    for &op in ops {
        let out = sim
            .execute(&OpSpec::Op { job: JobId(0), op, iteration: 0, warmup: false })
            .expect("execute");
        black_box(out);
    }
    sim.events
}

/// Hold model: N pending events; pop one, push one a random 1–2000 ns later.
fn hold<Q: EventQueue<Ev>>(q: &mut Q, rng: &mut Rng, steps: u64) {
    for _ in 0..steps {
        let (t, ev) = q.pop().expect("pending");
        q.push(t + 1_000 + rng.below(2_000_000) as u64, black_box(ev));
    }
}

fn core_queue(c: &mut Criterion) {
    let mut g = c.benchmark_group("core-hold");
    const STEPS: u64 = 200_000;
    g.throughput(Throughput::Elements(STEPS));
    g.sample_size(20);
    for pending in [1_000u32, 100_000, 1_000_000] {
        let ev = Ev::Act(Action::Wake { prog: 0, actor: 0 });
        let mut rng = Rng::new(1, 0);
        let mut calendar = CalendarQueue::new();
        let mut radix = RadixQueue::new();
        let mut heap = HeapQueue::default();
        for _ in 0..pending {
            let t = rng.below(2_000_000) as u64;
            calendar.push(t, ev);
            radix.push(t, ev);
            heap.push(t, ev);
        }
        g.bench_with_input(BenchmarkId::new("calendar", pending), &pending, |b, _| {
            b.iter(|| hold(&mut calendar, &mut rng, STEPS))
        });
        g.bench_with_input(BenchmarkId::new("radix", pending), &pending, |b, _| {
            b.iter(|| hold(&mut radix, &mut rng, STEPS))
        });
        g.bench_with_input(BenchmarkId::new("binary-heap", pending), &pending, |b, _| {
            b.iter(|| hold(&mut heap, &mut rng, STEPS))
        });
    }
    g.finish();
}

fn fabric_runs(c: &mut Criterion) {
    let mut g = c.benchmark_group("fabric");
    g.sample_size(10);
    let cases: Vec<(&str, Plan, Vec<OpKind>)> = vec![
        ("ep16-ll-dispatch", ScenarioDraft::bundled("ep16-ll").plan(), vec![OpKind::Dispatch]),
        (
            "ep16-alltoall-16MiB",
            // The bulk job alone: a saturating RDMA all-to-all through the fat tree.
            ScenarioDraft::bundled("vl-isolation-separate")
                .without_job("decode")
                .set("job[bulk].traffic.bytes_per_rank", "16MiB")
                .plan(),
            vec![OpKind::Transfer],
        ),
        (
            "ep32-normal-512tok",
            ScenarioDraft::bundled("ep32-normal-internode")
                .set("job[0].workload.tokens_per_rank", 512)
                .plan(),
            vec![OpKind::Dispatch, OpKind::Combine],
        ),
    ];
    for (name, p, ops) in &cases {
        let events = simulate(p, ops, QueueChoice::Calendar);
        assert_eq!(events, simulate(p, ops, QueueChoice::BinaryHeap), "same events either way");
        g.throughput(Throughput::Elements(events));
        g.bench_function(BenchmarkId::new("calendar", name), |b| {
            b.iter(|| simulate(p, ops, QueueChoice::Calendar))
        });
        g.bench_function(BenchmarkId::new("binary-heap", name), |b| {
            b.iter(|| simulate(p, ops, QueueChoice::BinaryHeap))
        });
    }
    g.finish();
}

fn speed(c: &mut Criterion) {
    let mut g = c.benchmark_group("speed");
    g.sample_size(10);
    let both = [OpKind::Dispatch, OpKind::Combine];
    let ep256 = ScenarioDraft::bundled("ep256-ll-decode").plan();
    g.throughput(Throughput::Elements(simulate(&ep256, &both, QueueChoice::Calendar)));
    g.bench_function("ep256-ll-dispatch+combine", |b| {
        b.iter(|| simulate(&ep256, &both, QueueChoice::Calendar))
    });
    let ep64 = ScenarioDraft::bundled("ep64-normal-internode").plan();
    g.throughput(Throughput::Elements(simulate(&ep64, &both, QueueChoice::Calendar)));
    g.bench_function("ep64-normal-4096tok-dispatch+combine", |b| {
        b.iter(|| simulate(&ep64, &both, QueueChoice::Calendar))
    });
    g.finish();
}

/// The scenarios of the `scale/` group, by growing size (`sim/benches/scale/`).
const SCALE: [&str; 7] = [
    "ll-ep256",
    "ll-ep512",
    "ll-ep1024",
    "ll-ep2048",
    "normal-ep64",
    "normal-ep128",
    "normal-ep160",
];

/// Run a whole scenario as `eptwin run` does (warmup, iterations, every op); returns events
/// handled.
fn run_scenario(plan: &Plan) -> u64 {
    let mut sim = Simulator::new(SimOptions::default());
    let result = eptwin_engine::api::run(plan, &mut sim, Provenance::default()).expect("run");
    assert!(result.failures.is_empty(), "{}: {:?}", result.scenario.name, result.failures);
    black_box(result);
    sim.events
}

fn scale(c: &mut Criterion) {
    let mut g = c.benchmark_group("scale");
    g.sample_size(10);
    // The smoke run (`-- --test`) runs each benchmark once: no run ahead for the throughput.
    let smoke = std::env::args().any(|a| a == "--test");
    for name in SCALE {
        let plan =
            ScenarioDraft::read(&Path::new("sim/benches/scale").join(format!("{name}.toml")))
                .plan();
        if !smoke {
            g.throughput(Throughput::Elements(run_scenario(&plan)));
        }
        g.bench_function(name, |b| b.iter(|| run_scenario(&plan)));
    }
    g.finish();
}

criterion_group!(benches, core_queue, fabric_runs, speed, scale);
criterion_main!(benches);
