//! DeepEP V1 semantics: `Config` and size hints, the environment `Buffer.__init__` leaves,
//! the validator, and the byte conventions of DeepEP's tests.

pub mod buffer;
pub mod bytes;
pub mod config;
pub mod env;
pub mod validate;
