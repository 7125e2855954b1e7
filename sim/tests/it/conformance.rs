//! The simulator's arm of the conformance suite: every body of
//! `eptwin_engine::testing::conformance` (the list `for_each_conformance_body!` holds) over a
//! fresh `Simulator` (the hardware's arm is `hw/tests/it/conformance.rs`).

use eptwin_engine::testing::conformance::{self, for_each_conformance_body};
use eptwin_sim::{SimOptions, Simulator};

fn sim_arm(body: fn(&mut dyn eptwin_engine::api::Transport)) {
    body(&mut Simulator::new(SimOptions::default()));
}

macro_rules! sim_arm_tests {
    ($($body:ident),* $(,)?) => {$(
        #[test]
        fn $body() {
            sim_arm(conformance::$body);
        }
    )*};
}

for_each_conformance_body!(sim_arm_tests);
