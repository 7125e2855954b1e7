//! Data-driven: every file in `scenarios/` validates, plans, and says what it shows.

use eptwin_engine::deepep::validate::validate;
use eptwin_engine::{Plan, load};

use crate::scenario_files;

#[test]
fn library_has_the_promised_coverage() {
    let files = scenario_files();
    assert!(files.len() >= 10, "at least 10 scenarios, found {}", files.len());
}

#[test]
fn every_scenario_validates_and_plans() {
    for path in scenario_files() {
        let loaded = load(&path).unwrap_or_else(|e| panic!("{e}"));
        let (diagnostics, validated) = validate(&loaded.scenario, &loaded.source);
        let errors: Vec<String> =
            diagnostics.iter().filter(|d| d.is_error()).map(|d| d.to_string()).collect();
        assert!(errors.is_empty(), "{}:\n{}", path.display(), errors.join("\n"));
        assert!(validated.is_some());
        let plan = Plan::build(&loaded).unwrap_or_else(|e| panic!("{e}"));
        assert!(!plan.jobs.is_empty());
        for job in &plan.jobs {
            if let Some(d) = job.deepep() {
                let n = job.num_ranks() as usize;
                assert_eq!(
                    d.routing().topk_idx.len(),
                    n * d.workload.tokens_per_rank as usize * d.workload.topk as usize
                );
                assert_eq!(d.logical().dispatch_per_rank.len(), n);
            }
        }
    }
}

#[test]
fn every_scenario_starts_with_a_comment_saying_what_it_shows() {
    for path in scenario_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let first = text.lines().next().unwrap_or("");
        assert!(
            first.starts_with("# ") && first.len() > 20,
            "{}: first line must be a comment saying what the scenario shows",
            path.display()
        );
        let loaded = load(&path).unwrap();
        let stem = path.file_stem().unwrap().to_str().unwrap();
        assert_eq!(loaded.scenario.name, stem, "{}: name matches the file name", path.display());
    }
}
