//! Replaying a scenario with DeepEP's own test scripts (docs/deepep-replay.md): which script,
//! flags and environment reproduce the scenario ([`launch`]), and the numbers the scripts
//! print brought back as a result document with `backend.kind = "deepep"` ([`import`]).
//!
//! The scripts come in families ([`script::ScriptFamily`]): today DeepEP V1's
//! `tests/test_intranode.py`, `test_internode.py` and `test_low_latency.py`. What a replay
//! reads of a scenario is a [`subject::Subject`], built from the engine's plan and the parsed
//! file. Everything here is pure: the binary reads the logs and passes their text.

pub mod error;
pub mod import;
pub mod launch;
pub mod script;
pub mod subject;

pub use error::ReplayError;
