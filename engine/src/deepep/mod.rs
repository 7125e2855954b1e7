//! DeepEP V1 semantics: `Config` and size hints, the environment `Buffer.__init__` leaves,
//! the validator, the byte conventions of DeepEP's tests, and the rules both backends follow
//! (`rules`: low-latency paths, channel ranges, QPs per peer).

pub mod buffer;
pub mod bytes;
pub mod config;
pub mod env;
pub mod rules;
pub mod validate;
