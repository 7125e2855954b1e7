//! Chrome trace-event JSON of a run (loads in Perfetto and chrome://tracing), in simulated
//! time: one process per GPU (a track per rank's kernel, NVLink egress, HBM copies), per NIC
//! (the transmit port, one track per queue pair with its messages) and per switch (one track
//! per output port with its packets, virtual lane in the name); counters for credits and queue
//! depth; flow arrows from each RDMA message's post to its delivery at the far NIC.
//!
//! Standard events only ("M" names, "X" complete events, "C" counters, "s"/"f" flows), so
//! any trace tool — and the reports' Gantt charts — can read it. Packet-level runs are large:
//! recording stops after [`MAX_EVENTS`] and the trace says so.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::core::time::Time;

/// Events kept per trace (a few hundred MB of JSON at most).
pub const MAX_EVENTS: usize = 2_000_000;
/// Counters per (port, lane) are sampled at most this often.
const COUNTER_PERIOD_PS: Time = 1_000_000;

pub const PID_GPU: u32 = 1;
pub const PID_NIC: u32 = 100_000;
pub const PID_SWITCH: u32 = 200_000;
/// Thread ids inside a GPU process.
pub const TID_NVLINK: u32 = 100_000;
pub const TID_HBM: u32 = 100_001;
/// Thread ids inside a NIC process: the port, then QPs.
pub const TID_NIC_PORT: u32 = 0;
pub const TID_QP: u32 = 1;

#[derive(Debug, Default)]
pub struct Trace {
    /// Serialized events (each one JSON object).
    pub events: Vec<String>,
    pub names: BTreeMap<(u32, u32), String>,
    pub processes: BTreeMap<u32, String>,
    /// Added to every timestamp (ops simulated separately are laid out one after another).
    pub offset: Time,
    pub truncated: bool,
    last_counter: BTreeMap<(u32, u8), Time>,
    next_flow: u64,
}

/// Simulated picoseconds as trace microseconds.
fn us(t: Time) -> String {
    format!("{}.{:06}", t / 1_000_000, t % 1_000_000)
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

impl Trace {
    fn full(&mut self) -> bool {
        if self.events.len() >= MAX_EVENTS {
            self.truncated = true;
            return true;
        }
        false
    }

    pub fn name_process(&mut self, pid: u32, name: &str) {
        self.processes.entry(pid).or_insert_with(|| name.to_string());
    }

    pub fn name_thread(&mut self, pid: u32, tid: u32, name: &str) {
        self.names.entry((pid, tid)).or_insert_with(|| name.to_string());
    }

    /// A complete event ("X").
    pub fn span(&mut self, pid: u32, tid: u32, name: &str, start: Time, end: Time, args: &str) {
        if self.full() {
            return;
        }
        let (s, d) = (start + self.offset, end.saturating_sub(start));
        let mut e = format!(
            "{{\"ph\":\"X\",\"pid\":{pid},\"tid\":{tid},\"name\":\"{}\",\"ts\":{},\"dur\":{}",
            escape(name),
            us(s),
            us(d)
        );
        if !args.is_empty() {
            let _ = write!(e, ",\"args\":{{{args}}}");
        }
        e.push('}');
        self.events.push(e);
    }

    /// A counter sample ("C"), rate-limited per key.
    pub fn counter(
        &mut self,
        pid: u32,
        key: (u32, u8),
        name: &str,
        t: Time,
        series: &str,
        value: i64,
    ) {
        let last = self.last_counter.get(&key).copied();
        if last.is_some_and(|l| t < l + COUNTER_PERIOD_PS) || self.full() {
            return;
        }
        self.last_counter.insert(key, t);
        self.events.push(format!(
            "{{\"ph\":\"C\",\"pid\":{pid},\"name\":\"{}\",\"ts\":{},\"args\":{{\"{}\":{value}}}}}",
            escape(name),
            us(t + self.offset),
            escape(series)
        ));
    }

    /// A flow arrow from (pid, tid, t0) to (pid2, tid2, t1).
    #[allow(clippy::too_many_arguments)]
    pub fn flow(
        &mut self,
        name: &str,
        pid: u32,
        tid: u32,
        t0: Time,
        pid2: u32,
        tid2: u32,
        t1: Time,
    ) {
        if self.full() {
            return;
        }
        self.next_flow += 1;
        let id = self.next_flow;
        let n = escape(name);
        self.events.push(format!(
            "{{\"ph\":\"s\",\"id\":{id},\"pid\":{pid},\"tid\":{tid},\"name\":\"{n}\",\"cat\":\"flow\",\"ts\":{}}}",
            us(t0 + self.offset)
        ));
        self.events.push(format!(
            "{{\"ph\":\"f\",\"bp\":\"e\",\"id\":{id},\"pid\":{pid2},\"tid\":{tid2},\"name\":\"{n}\",\"cat\":\"flow\",\"ts\":{}}}",
            us(t1 + self.offset)
        ));
    }

    /// Append another trace (a later op simulated on its own machine) after this one.
    pub fn append(&mut self, other: Trace) {
        for (k, v) in other.names {
            self.names.entry(k).or_insert(v);
        }
        for (k, v) in other.processes {
            self.processes.entry(k).or_insert(v);
        }
        let room = MAX_EVENTS.saturating_sub(self.events.len());
        if other.events.len() > room {
            self.truncated = true;
        }
        self.truncated |= other.truncated;
        self.events.extend(other.events.into_iter().take(room));
    }

    /// The whole trace as JSON.
    pub fn to_json(&self) -> String {
        let mut out =
            String::from("{\"displayTimeUnit\":\"ns\",\"otherData\":{\"simulator\":\"eptwin-sim\"");
        if self.truncated {
            let _ = write!(out, ",\"truncated\":\"recording stopped after {MAX_EVENTS} events\"");
        }
        out.push_str("},\"traceEvents\":[\n");
        let mut first = true;
        let mut push = |out: &mut String, e: &str| {
            if !first {
                out.push_str(",\n");
            }
            first = false;
            out.push_str(e);
        };
        for (pid, name) in &self.processes {
            push(
                &mut out,
                &format!(
                    "{{\"ph\":\"M\",\"pid\":{pid},\"name\":\"process_name\",\"args\":{{\"name\":\"{}\"}}}}",
                    escape(name)
                ),
            );
            push(
                &mut out,
                &format!(
                    "{{\"ph\":\"M\",\"pid\":{pid},\"name\":\"process_sort_index\",\"args\":{{\"sort_index\":{pid}}}}}"
                ),
            );
        }
        for ((pid, tid), name) in &self.names {
            push(
                &mut out,
                &format!(
                    "{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"name\":\"thread_name\",\"args\":{{\"name\":\"{}\"}}}}",
                    escape(name)
                ),
            );
        }
        for e in &self.events {
            push(&mut out, e);
        }
        out.push_str("\n]}\n");
        out
    }
}
