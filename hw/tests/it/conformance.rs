//! The hardware's arm of the conformance suite: every body of
//! `eptwin_engine::testing::conformance` over a fresh `HwTransport` on the GPU (the
//! simulator's arm is `sim/tests/it/conformance.rs`).

use eptwin_engine::testing::conformance;
use eptwin_engine::transport::Transport;
use eptwin_hw::{HwOptions, HwTransport};

fn hw_arm(body: fn(&mut dyn Transport)) {
    let mut hw = HwTransport::new(HwOptions { kernel_timeout_ms: 5_000, ..HwOptions::from_env() });
    if let Some(reason) = hw.capabilities().unavailable {
        panic!("the hardware backend is unavailable: {reason}");
    }
    body(&mut hw);
}

macro_rules! hw_arm_tests {
    ($($body:ident),* $(,)?) => {$(
        #[test]
        #[ignore = "needs a GPU: run with --ignored on the GPU machine (scripts/h200-measure.sh)"]
        fn $body() {
            hw_arm(conformance::$body);
        }
    )*};
}

hw_arm_tests!(
    normal_dispatch_then_combine_samples_every_iteration,
    normal_bf16_on_two_ranks_counts_bf16_rows,
    low_latency_dispatch_then_combine_samples_every_iteration,
    the_run_loop_reports_every_timed_iteration,
    an_op_of_an_unknown_job_is_an_error,
    execute_before_prepare_is_an_error,
    a_plan_beyond_max_ranks_is_waived,
    what_capabilities_waive_is_a_one_line_waived_result,
);
