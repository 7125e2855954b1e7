//! The hardware's arm of the conformance suite: every body of
//! `eptwin_engine::testing::conformance` (the list `for_each_conformance_body!` holds) over a
//! fresh `HwTransport` on the GPU (the simulator's arm is `sim/tests/it/conformance.rs`).

use eptwin_engine::api::Transport;
use eptwin_engine::testing::conformance::{self, for_each_conformance_body};
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
        #[ignore = "needs a GPU: run with --ignored on the GPU machine (scripts/gpu-hw-redesign.sh)"]
        fn $body() {
            hw_arm(conformance::$body);
        }
    )*};
}

for_each_conformance_body!(hw_arm_tests);
