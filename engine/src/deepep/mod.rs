//! DeepEP V1 semantics: `Config` and size hints, the environment `Buffer.__init__` leaves,
//! the validator and the byte conventions of DeepEP's tests. The rules both backends follow
//! (low-latency paths, channel ranges, QPs per peer) are the plan's (`plan/rules.rs`).

pub mod buffer;
pub mod bytes;
pub mod config;
pub mod env;
pub mod validate;
