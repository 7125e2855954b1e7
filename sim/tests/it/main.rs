//! The simulator's integration tests (one binary, per house style): every scenario runs, the
//! validation table, VL isolation, QP depth and Little's law, arbitration through the fabric,
//! determinism, and property tests for every invariant and for DeepEP's correctness.

mod arbitration;
mod conformance;
mod faults;
mod isolation;
mod properties;
mod qp_depth;
mod routing_file;
mod scenarios;
mod trace;
mod util;
mod validation;
