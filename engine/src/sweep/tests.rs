//! Sweeps: `--set` arguments, the grid and its shards, point names, and running points on a
//! fake backend (a panicking point fails alone; order is kept at any thread count).

use super::*;
use crate::transport::{Capabilities, OpOutcome, OpSpec, TransportError};

const BASE: &str = r#"
schema = 1
name = "t"
description = "base"
[cluster]
profile = "h800-cx7"
nodes = 2
[[job]]
name = "decode"
[job.buffer]
low_latency_mode = true
num_rdma_bytes = "2GiB"
num_qps_per_rank = 18
[job.env]
NVSHMEM_IB_SL = "1"
[job.workload]
tokens_per_rank = 128
hidden = 7168
topk = 8
experts = 288
[[job]]
name = "bulk"
[job.traffic]
pattern = "all-to-all"
bytes_per_rank = "16MiB"
"#;

fn base() -> toml::Table {
    toml::from_str(BASE).unwrap()
}

fn keys(args: &[&str]) -> Vec<SweepKey> {
    args.iter().map(|a| SweepKey::parse(a).unwrap()).collect()
}

fn plan(args: &[&str], shard: Shard) -> Result<SweepPlan, EngineError> {
    let loaded = crate::parse("t.toml", BASE).unwrap();
    SweepPlan::new("t.toml", BASE, &loaded, &keys(args), shard)
}

#[test]
fn set_arguments() {
    let s = SweepKey::parse("job[0].env.NVSHMEM_QP_DEPTH=128, 256,512").unwrap();
    assert_eq!(s.values, ["128", "256", "512"]);
    assert_eq!(s.key(), "job[0].env.NVSHMEM_QP_DEPTH");
    assert!(SweepKey::parse("cluster.nodes").is_err());
    assert!(SweepKey::parse("cluster.nodes=2,,4").is_err());
    let twice = SweepKey::parse("cluster.nodes=2,2").unwrap_err().to_string();
    assert_eq!(twice, r#"--set "cluster.nodes=2,2": value "2" is listed twice"#);
}

#[test]
fn values_keep_the_type_they_replace_and_pass_the_schema() {
    let b = base();
    let sets = keys(&[
        "job[decode].env.NVSHMEM_QP_DEPTH=256,1024",
        "cluster.nodes=2,4",
        "job[0].buffer.num_rdma_bytes=1GiB",
        "job[bulk].traffic.qps_per_peer=2",
    ]);
    let typed = typed_values(&b, "t.toml", &sets).unwrap();
    // Absent env key: an integer literal fails the schema (env values are strings), so it is
    // retried and kept as a string.
    assert_eq!(typed[0][0], toml::Value::String("256".into()));
    assert_eq!(typed[1][1], toml::Value::Integer(4));
    assert_eq!(typed[2][0], toml::Value::String("1GiB".into()));
    assert_eq!(typed[3][0], toml::Value::Integer(2));
    let mut t = b.clone();
    sets[1].path.set(&mut t, typed[1][1].clone()).unwrap();
    sets[0].path.set(&mut t, typed[0][1].clone()).unwrap();
    let again = crate::parse("p.toml", &toml::to_string(&t).unwrap()).unwrap();
    assert_eq!(again.scenario.cluster.nodes, Some(4));
    assert_eq!(again.scenario.jobs[0].env["NVSHMEM_QP_DEPTH"], "1024");
    assert_eq!(again.scenario.jobs[1].env.get("NVSHMEM_QP_DEPTH"), None, "other job untouched");
}

#[test]
fn bad_keys_and_values_are_usage_errors_naming_them() {
    let b = base();
    let err = |arg: &str| typed_values(&b, "t.toml", &keys(&[arg])).unwrap_err().to_string();
    assert!(err("job.env.X=1").contains("2 [[job]] entries"), "{}", err("job.env.X=1"));
    assert!(err("job[7].env.X=1").contains("does not exist"));
    assert!(err("job[nope].env.X=1").contains("no job is named \"nope\""));
    let e = err("job[0].buffer.num_qp_per_rank=4");
    assert!(
        e.contains("--set job[0].buffer.num_qp_per_rank=4") && e.contains("num_qp_per_rank"),
        "{e}"
    );
    let e = err("cluster.nodes=two");
    assert!(e.contains("\"two\" is not an integer"), "{e}");
    // A number of the wrong range is named as the number it is, not as a string.
    let e = err("cluster.nodes=-1");
    assert!(!e.contains("string"), "{e}");
    assert!(e.starts_with("--set cluster.nodes=-1: cluster.nodes: "), "{e}");
    let twice = plan(&["cluster.nodes=2", "cluster.nodes=4"], Shard::ALL).unwrap_err();
    assert_eq!(twice.to_string(), "--set cluster.nodes: the key is given twice");
}

#[test]
fn points_are_named_described_and_headed_by_their_values() {
    let p =
        plan(&["cluster.nodes=2,4", "job[decode].env.NVSHMEM_QP_DEPTH=256"], Shard::ALL).unwrap();
    assert_eq!(p.total_points, 2);
    assert_eq!(p.labels, ["nodes", "NVSHMEM_QP_DEPTH"]);
    assert_eq!(p.absent_keys, ["job[decode].env.NVSHMEM_QP_DEPTH"]);
    let point = &p.points[1];
    assert_eq!(point.name, "t.nodes-4.NVSHMEM_QP_DEPTH-256");
    assert!(point.text.starts_with(
        "# eptwin sweep point 1 of 2: t.toml with cluster.nodes = 4, \
         job[decode].env.NVSHMEM_QP_DEPTH = \"256\"\n"
    ));
    let loaded = crate::parse("p.toml", &point.text).unwrap();
    assert_eq!(loaded.scenario.name, point.name);
    assert_eq!(
        loaded.scenario.description,
        "base [sweep point 1: cluster.nodes=4, job[decode].env.NVSHMEM_QP_DEPTH=256]"
    );
    let odd = plan(&["cluster.nodes=2,4"], Shard { index: 1, count: 2 }).unwrap();
    assert_eq!(odd.points.iter().map(|p| p.index).collect::<Vec<_>>(), [1]);
    assert_eq!(odd.total_points, 2);
}

/// Every combination of value indices, row-major, built whole (what [`grid_point`] finds one
/// by one).
fn grid(sizes: &[usize]) -> Vec<Vec<usize>> {
    let mut points = vec![Vec::new()];
    for &n in sizes {
        points = points
            .into_iter()
            .flat_map(|p| {
                (0..n).map(move |i| {
                    let mut q = p.clone();
                    q.push(i);
                    q
                })
            })
            .collect();
    }
    points
}

proptest::proptest! {
    #![proptest_config(crate::testing::proptest_config(256))]
    /// Point `i` of the grid is the `i`-th combination in row-major order, and a shard holds
    /// exactly the points it contains.
    #[test]
    fn grid_points_are_the_row_major_product(
        sizes in proptest::collection::vec(1usize..5, 0..4),
        count in 1u32..7,
    ) {
        let all = grid(&sizes);
        for (i, combo) in all.iter().enumerate() {
            proptest::prop_assert_eq!(&grid_point(i, &sizes), combo);
        }
        for index in 0..count {
            let shard = Shard { index, count };
            let held = (0..all.len()).filter(|&i| shard.contains(i)).count();
            proptest::prop_assert_eq!(shard.points_of(all.len()), held);
        }
    }
}

#[test]
fn grid_is_row_major() {
    assert_eq!(grid(&[2, 3]), [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]);
    assert_eq!(grid_point(4, &[2, 3]), [1, 1]);
    assert_eq!(grid_point(0, &[]), Vec::<usize>::new());
}

/// A shard of a huge grid builds its own points only, and a shard or a key beyond the caps is
/// refused before anything is built.
#[test]
fn shards_are_cut_before_the_grid_is_expanded_and_capped() {
    let many = |n: usize| (1..=n).map(|v| v.to_string()).collect::<Vec<_>>().join(",");
    let a = format!("job[0].workload.seed={}", many(10_000));
    let b = format!("job[1].traffic.iterations={}", many(10_000));
    let one = plan(&[&a, &b], Shard { index: 5, count: 100_000_000 }).unwrap();
    assert_eq!(one.total_points, 100_000_000);
    assert_eq!(one.points.iter().map(|p| p.index).collect::<Vec<_>>(), [5]);
    assert_eq!(one.points[0].values, [toml::Value::Integer(1), toml::Value::Integer(6)]);
    let e = plan(&[&a, &b], Shard { index: 0, count: 1000 }).unwrap_err().to_string();
    assert!(
        e.contains("holds 100000 of its 100000000 points: one sweep runs at most 10000"),
        "{e}"
    );
    let e =
        SweepKey::parse(&format!("job[0].workload.seed={}", many(10_001))).unwrap_err().to_string();
    assert!(e.contains("10001 values; a key takes at most 10000"), "{e}");
}

/// Point names stay file names a scenario may have: at most 200 bytes with the longest base
/// name, and distinct when two values clean to the same text.
#[test]
fn point_names_are_valid_and_distinct() {
    let long = "n".repeat(MAX_NAME_BYTES);
    let text = BASE.replacen("name = \"t\"", &format!("name = \"{long}\""), 1);
    let loaded = crate::parse("t.toml", &text).unwrap();
    let keys = keys(&["job[decode].env.NVSHMEM_QP_DEPTH=512,1024"]);
    let p = SweepPlan::new("t.toml", &text, &loaded, &keys, Shard::ALL).unwrap();
    for point in &p.points {
        assert!(point.name.len() <= MAX_NAME_BYTES, "{}", point.name.len());
        let parsed = crate::parse("p.toml", &point.text).unwrap();
        let (_, plan) = crate::deepep::validate::validate(&parsed.scenario, &parsed.source);
        assert!(plan.is_some(), "point {} is invalid", point.index);
    }
    assert_ne!(p.points[0].name, p.points[1].name);
    assert!(p.points[1].name.ends_with(".p1"), "{}", p.points[1].name);
    let clash = plan(&["job[decode].env.X=a b,a_b"], Shard::ALL).unwrap();
    let names: Vec<&str> = clash.points.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["t.X-a_b.p0", "t.X-a_b.p1"]);
}

#[test]
fn shards_partition_the_grid() {
    for count in 1..6u32 {
        for i in 0..20 {
            let owners = (0..count).filter(|&k| Shard { index: k, count }.contains(i)).count();
            assert_eq!(owners, 1, "point {i} with {count} shards");
        }
    }
}

#[test]
fn shards_from_flag_and_slurm() {
    assert_eq!(Shard::parse("1/4").unwrap(), Shard { index: 1, count: 4 });
    assert!(Shard::parse("4/4").is_err() && Shard::parse("0/0").is_err());
    assert!(Shard::parse("1").is_err());
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |k: &str| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string())
    };
    assert_eq!(Shard::from_slurm(env(&[])).unwrap(), None);
    let s =
        Shard::from_slurm(env(&[("SLURM_ARRAY_TASK_ID", "3"), ("SLURM_ARRAY_TASK_COUNT", "4")]));
    assert_eq!(s.unwrap(), Some(Shard { index: 3, count: 4 }));
    let s = Shard::from_slurm(env(&[
        ("SLURM_ARRAY_TASK_ID", "1"),
        ("SLURM_ARRAY_TASK_COUNT", "4"),
        ("SLURM_ARRAY_TASK_MIN", "1"),
    ]));
    assert_eq!(s.unwrap(), Some(Shard { index: 0, count: 4 }));
    assert!(Shard::from_slurm(env(&[("SLURM_ARRAY_TASK_ID", "1")])).is_err());
    let sparse =
        Shard::from_slurm(env(&[("SLURM_ARRAY_TASK_ID", "9"), ("SLURM_ARRAY_TASK_COUNT", "4")]));
    assert!(sparse.unwrap_err().to_string().contains("--shard"));
}

#[test]
fn colliding_short_labels_use_the_full_key() {
    let sets = keys(&[
        "job[0].env.NVSHMEM_QP_DEPTH=1",
        "job[1].env.NVSHMEM_QP_DEPTH=1",
        "cluster.nodes=1",
    ]);
    assert_eq!(
        labels(&sets),
        ["job_0_.env.NVSHMEM_QP_DEPTH", "job_1_.env.NVSHMEM_QP_DEPTH", "nodes"]
    );
}

/// A backend whose `prepare` panics.
struct Panics;

impl Transport for Panics {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: crate::transport::BackendKind::Sim,
            identity: Default::default(),
            unavailable: None,
            modes: vec![
                crate::deepep::config::EpMode::LowLatency,
                crate::deepep::config::EpMode::Intranode,
                crate::deepep::config::EpMode::Internode,
            ],
            elastic: true,
            traffic: true,
            concurrent_jobs: true,
            max_ranks: None,
            rdma: true,
            rdma_reason: None,
        }
    }
    fn prepare(&mut self, _: &Plan) -> Result<(), TransportError> {
        panic!("model exploded")
    }
    fn execute(&mut self, _: &OpSpec) -> Result<OpOutcome, TransportError> {
        unreachable!("prepare panicked")
    }
}

#[test]
fn a_panicking_backend_fails_its_point_only_and_invalid_points_do_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(&["cluster.nodes=2,0"], Shard::ALL).unwrap();
    let backend = || -> Box<dyn Transport> { Box::new(Panics) };
    let outcomes = run_grid(&p.points, 2, |point| {
        run_point(point, dir.path(), &backend, &Provenance::default)
    })
    .unwrap();
    assert_eq!(outcomes[0], PointOutcome::Failed("the backend panicked: model exploded".into()));
    assert!(
        matches!(&outcomes[1], PointOutcome::Invalid(why) if why.contains("nodes")),
        "{outcomes:?}"
    );
    // Both points' scenarios are written for `eptwin run`, and no result.
    for point in &p.points {
        assert!(dir.path().join(format!("{}.toml", point.name)).is_file());
        assert!(!dir.path().join(format!("{}.json", point.name)).exists());
    }
}

#[test]
fn the_grid_keeps_point_order_at_any_thread_count() {
    let p = plan(&["cluster.nodes=2,4,8", "job[0].workload.topk=4,8"], Shard::ALL).unwrap();
    for threads in [1, 2, 5] {
        let order = run_grid(&p.points, threads, |point| point.index).unwrap();
        assert_eq!(order, (0..6).collect::<Vec<_>>());
    }
}

/// A swept `routing_file` is relative to the base scenario's directory, not to the output
/// directory the points are written to; each point records the sha256 of the file it read.
#[test]
fn swept_routing_files_resolve_against_the_base_scenario() {
    let root = tempfile::tempdir().unwrap();
    let (base_dir, out) = (root.path().join("base"), root.path().join("out"));
    std::fs::create_dir_all(base_dir.join("r")).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let draft =
        crate::testing::one_gpu_low_latency("t").set("job[0].workload.masked_selections", 0);
    let mut shas = Vec::new();
    for (name, seed) in [("a", 1), ("b", 2)] {
        let table = draft.clone().set("job[0].workload.seed", seed).plan().jobs[0]
            .deepep()
            .unwrap()
            .routing()
            .clone();
        let text = crate::routing_file::to_json(&table, name);
        std::fs::write(base_dir.join(format!("r/{name}.json")), &text).unwrap();
        shas.push(crate::scenario::sha256_hex(text.as_bytes()));
    }
    let file = base_dir.join("t.toml").display().to_string();
    let text = draft.text();
    let loaded = crate::parse(&file, &text).unwrap();
    let sets = keys(&["job.workload.routing=file", "job.workload.routing_file=r/a.json,r/b.json"]);
    let p = SweepPlan::new(&file, &text, &loaded, &sets, Shard::ALL).unwrap();
    for (point, (name, sha)) in p.points.iter().zip(["a", "b"].iter().zip(&shas)) {
        let want = std::path::absolute(base_dir.join(format!("r/{name}.json"))).unwrap();
        assert!(
            point.text.contains(&format!("routing_file = {:?}", want.display().to_string())),
            "{}",
            point.text
        );
        // Read as `run_point` reads it: from the output directory.
        let label = out.join(format!("{}.toml", point.name)).display().to_string();
        let plan = Plan::build(&crate::parse(&label, &point.text).unwrap()).unwrap();
        let records = crate::run::scenario_ref(&plan).routing_files;
        assert_eq!(records.len(), 1);
        assert_eq!((&records[0].sha256, records[0].job.as_str()), (sha, "ep"));
    }
}

/// A fault's value sweeps like any key (`--set fault[0].delay_us=0,10,20,50`): each point's
/// scenario carries the value and plans with it.
#[test]
fn a_fault_value_sweeps() {
    let text = format!("{BASE}\n[[fault]]\nkind = \"straggler\"\nranks = \"3\"\ndelay_us = 50\n");
    let loaded = crate::parse("t.toml", &text).unwrap();
    let sets = keys(&["fault[0].delay_us=0,10,20"]);
    let p = SweepPlan::new("t.toml", &text, &loaded, &sets, Shard::ALL).unwrap();
    assert_eq!(p.labels, ["delay_us"]);
    assert_eq!(p.values[0][1], toml::Value::Integer(10));
    let point = crate::parse("p.toml", &p.points[2].text).unwrap();
    assert_eq!(point.scenario.faults[0].delay_us, Some(20.0));
    assert_eq!(p.points[2].name, "t.delay_us-20");
    // Without a [[fault]] entry there is nothing to sweep.
    let err = plan(&["fault[0].delay_us=1"], Shard::ALL).unwrap_err().to_string();
    assert!(err.contains("fault"), "{err}");
}
