//! A recorded routing replays exactly: a scenario whose routing file holds the table its seed
//! generates gives the same simulated result as the scenario itself.

use eptwin_engine::api::{Provenance, RunResult};
use eptwin_engine::routing_file::to_json;
use eptwin_engine::testing::{ScenarioDraft, one_gpu_low_latency, one_gpu_normal};
use eptwin_sim::{SimOptions, Simulator};

fn run(draft: &ScenarioDraft) -> RunResult {
    let plan = draft.plan();
    let mut sim = Simulator::new(SimOptions::default());
    eptwin_engine::api::run(&plan, &mut sim, Provenance::default()).expect("run")
}

#[test]
fn a_file_of_the_generated_routing_gives_the_same_result() {
    let dir = tempfile::tempdir().unwrap();
    for (i, generated) in [
        one_gpu_low_latency("ll").set("job[0].workload.masked_selections", 0),
        one_gpu_normal("normal").set("job[0].workload.seed", 7),
        ScenarioDraft::bundled("ep16-ll")
            .set("job[0].workload.tokens_per_rank", 32)
            .set("job[0].workload.num_max_dispatch_tokens_per_rank", 32)
            .set("job[0].workload.masked_selections", 0),
    ]
    .into_iter()
    .enumerate()
    {
        let table = generated.plan().jobs[0].deepep().unwrap().routing().clone();
        let file = dir.path().join(format!("r{i}.json"));
        std::fs::write(&file, to_json(&table, "generated")).unwrap();
        let replayed = generated
            .clone()
            .set("job[0].workload.routing", "file")
            .set("job[0].workload.routing_file", file.display().to_string());
        let (a, b) = (run(&generated), run(&replayed));
        assert_eq!(a.verdict.as_str(), "ok", "{:?}", a.failures);
        assert_eq!(
            serde_json::to_string(&a.jobs).unwrap(),
            serde_json::to_string(&b.jobs).unwrap(),
            "{}",
            generated.file()
        );
        assert_eq!((&a.verdict, &a.failures), (&b.verdict, &b.failures));
        assert!(a.scenario.routing_files.is_empty());
        assert_eq!(b.scenario.routing_files[0].file, file.display().to_string());
    }
}
