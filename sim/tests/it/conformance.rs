//! The simulator's arm of the conformance suite: every body of
//! `eptwin_engine::testing::conformance` over a fresh `Simulator` (the hardware's arm is
//! `hw/tests/it/conformance.rs`).

use eptwin_engine::testing::conformance;
use eptwin_sim::{SimOptions, Simulator};

fn sim_arm(body: fn(&mut dyn eptwin_engine::api::Transport)) {
    body(&mut Simulator::new(SimOptions::default()));
}

#[test]
fn normal_dispatch_then_combine_samples_every_iteration() {
    sim_arm(conformance::normal_dispatch_then_combine_samples_every_iteration);
}

#[test]
fn normal_bf16_on_two_ranks_counts_bf16_rows() {
    sim_arm(conformance::normal_bf16_on_two_ranks_counts_bf16_rows);
}

#[test]
fn low_latency_dispatch_then_combine_samples_every_iteration() {
    sim_arm(conformance::low_latency_dispatch_then_combine_samples_every_iteration);
}

#[test]
fn the_run_loop_reports_every_timed_iteration() {
    sim_arm(conformance::the_run_loop_reports_every_timed_iteration);
}

#[test]
fn an_op_of_an_unknown_job_is_an_error() {
    sim_arm(conformance::an_op_of_an_unknown_job_is_an_error);
}

#[test]
fn execute_before_prepare_is_an_error() {
    sim_arm(conformance::execute_before_prepare_is_an_error);
}

#[test]
fn a_plan_beyond_max_ranks_is_waived() {
    sim_arm(conformance::a_plan_beyond_max_ranks_is_waived);
}

#[test]
fn what_capabilities_waive_is_a_one_line_waived_result() {
    sim_arm(conformance::what_capabilities_waive_is_a_one_line_waived_result);
}
