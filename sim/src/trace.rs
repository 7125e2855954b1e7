//! Chrome trace-event JSON (Perfetto-loadable) of a run, in simulated time.
//! Filled in by the models when `SimOptions::trace` is set.

use crate::fabric::Pkt;
use crate::time::Time;

#[derive(Debug, Default)]
pub struct Trace {
    pub events: Vec<String>,
}

impl Trace {
    pub fn port_packet(&mut self, _port: u32, _start: Time, _ser: Time, _pkt: &Pkt) {}
}
