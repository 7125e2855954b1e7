//! Chrome trace-event JSON of a run (loads in Perfetto and chrome://tracing), in simulated
//! time: one process per GPU (a track per rank's kernel, NVLink egress, HBM copies), per NIC
//! (the transmit port, one track per queue pair with its messages) and per switch (one track
//! per output port with its packets, virtual lane in the name); counters for credits and queue
//! depth; flow arrows from each RDMA message's post to its delivery at the far NIC.
//!
//! Standard events only ("M" names, "X" complete events, "C" counters, "s"/"f" flows), so
//! any trace tool — and the reports' Gantt charts — can read it. Packet-level runs are large:
//! recording stops after [`MAX_EVENTS`] and the trace says so.
//!
//! Events are typed ([`Event`]) and serialised by serde_json, one object per line; timestamps
//! are microseconds with exactly six decimals (integer picoseconds, no float rounding).

use std::collections::BTreeMap;

use serde::ser::{SerializeMap, Serializer};
use serde::{Serialize, ser};
use serde_json::value::RawValue;

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

/// The `args` of a complete event: what a span carries besides its name and times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum SpanArgs {
    /// No `args` object.
    None,
    /// A queue pair's work request: its sequence number on the QP.
    Seq { seq: u32 },
    /// A copy: bytes moved.
    Bytes { bytes: u64 },
    /// A packet on a port: wire bytes, payload bytes, source and destination NIC.
    Packet { bytes: u32, payload: u32, src_nic: u32, dst_nic: u32 },
}

impl SpanArgs {
    fn is_none(&self) -> bool {
        *self == SpanArgs::None
    }
}

/// One trace event, in the Chrome trace-event format's field names and order.
#[derive(Debug, Serialize)]
#[serde(tag = "ph")]
pub enum Event<'a> {
    #[serde(rename = "M")]
    Metadata {
        pid: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        tid: Option<u32>,
        name: &'static str,
        args: MetadataArgs<'a>,
    },
    #[serde(rename = "X")]
    Complete {
        pid: u32,
        tid: u32,
        name: &'a str,
        #[serde(serialize_with = "micros")]
        ts: Time,
        #[serde(serialize_with = "micros")]
        dur: Time,
        #[serde(skip_serializing_if = "SpanArgs::is_none")]
        args: SpanArgs,
    },
    #[serde(rename = "C")]
    Counter {
        pid: u32,
        name: &'a str,
        #[serde(serialize_with = "micros")]
        ts: Time,
        args: CounterSample<'a>,
    },
    #[serde(rename = "s")]
    FlowStart {
        id: u64,
        pid: u32,
        tid: u32,
        name: &'a str,
        cat: &'static str,
        #[serde(serialize_with = "micros")]
        ts: Time,
    },
    #[serde(rename = "f")]
    FlowEnd {
        bp: &'static str,
        id: u64,
        pid: u32,
        tid: u32,
        name: &'a str,
        cat: &'static str,
        #[serde(serialize_with = "micros")]
        ts: Time,
    },
}

/// The `args` of a metadata event.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum MetadataArgs<'a> {
    Name { name: &'a str },
    SortIndex { sort_index: u32 },
}

/// A counter's one series and its value: `{"<series>": value}`.
#[derive(Debug)]
pub struct CounterSample<'a> {
    pub series: &'a str,
    pub value: i64,
}

impl Serialize for CounterSample<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(self.series, &self.value)?;
        map.end()
    }
}

/// Simulated picoseconds as trace microseconds, six decimals.
fn us(t: Time) -> String {
    format!("{}.{:06}", t / 1_000_000, t % 1_000_000)
}

fn micros<S: Serializer>(t: &Time, serializer: S) -> Result<S::Ok, S::Error> {
    RawValue::from_string(us(*t)).map_err(ser::Error::custom)?.serialize(serializer)
}

impl Event<'_> {
    fn to_json(&self) -> String {
        serde_json::to_string(self).expect("trace events serialise")
    }
}

/// The trace's `otherData` object.
#[derive(Serialize)]
struct OtherData {
    simulator: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    truncated: Option<String>,
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
    pub fn span(&mut self, pid: u32, tid: u32, name: &str, start: Time, end: Time, args: SpanArgs) {
        if self.full() {
            return;
        }
        let (ts, dur) = (start + self.offset, end.saturating_sub(start));
        self.events.push(Event::Complete { pid, tid, name, ts, dur, args }.to_json());
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
        let args = CounterSample { series, value };
        self.events.push(Event::Counter { pid, name, ts: t + self.offset, args }.to_json());
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
        let (cat, offset) = ("flow", self.offset);
        self.events.push(Event::FlowStart { id, pid, tid, name, cat, ts: t0 + offset }.to_json());
        let end = Event::FlowEnd { bp: "e", id, pid: pid2, tid: tid2, name, cat, ts: t1 + offset };
        self.events.push(end.to_json());
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

    /// The whole trace as JSON: a header, then one event per line.
    pub fn to_json(&self) -> String {
        let other = OtherData {
            simulator: "eptwin-sim",
            truncated: self
                .truncated
                .then(|| format!("recording stopped after {MAX_EVENTS} events")),
        };
        let mut out = String::from("{\"displayTimeUnit\":\"ns\",\"otherData\":");
        out.push_str(&serde_json::to_string(&other).expect("trace header serialises"));
        out.push_str(",\"traceEvents\":[\n");
        let mut first = true;
        let mut push = |out: &mut String, e: &str| {
            if !first {
                out.push_str(",\n");
            }
            first = false;
            out.push_str(e);
        };
        for (&pid, name) in &self.processes {
            let name = Event::Metadata {
                pid,
                tid: None,
                name: "process_name",
                args: MetadataArgs::Name { name },
            };
            push(&mut out, &name.to_json());
            let sort = Event::Metadata {
                pid,
                tid: None,
                name: "process_sort_index",
                args: MetadataArgs::SortIndex { sort_index: pid },
            };
            push(&mut out, &sort.to_json());
        }
        for (&(pid, tid), name) in &self.names {
            let name = Event::Metadata {
                pid,
                tid: Some(tid),
                name: "thread_name",
                args: MetadataArgs::Name { name },
            };
            push(&mut out, &name.to_json());
        }
        for e in &self.events {
            push(&mut out, e);
        }
        out.push_str("\n]}\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_of_each() -> Trace {
        let mut t = Trace { offset: 1_000_000, ..Trace::default() };
        t.name_process(1, "GPU 0");
        t.name_thread(1, 0, "rank 0 kernels");
        t.span(1, 0, "dispatch", 0, 2_500_123, SpanArgs::None);
        t.span(100_000, 1, "write 7168 B", 5, 9, SpanArgs::Seq { seq: 3 });
        let packet = SpanArgs::Packet { bytes: 4160, payload: 4096, src_nic: 0, dst_nic: 9 };
        t.span(200_000, 4, "VL1 data", 10, 20, packet);
        t.counter(200_000, (4, 1), "leaf0.up0 VL1 credits", 30, "credits", -2);
        t.flow("rdma", 100_000, 1, 40, 100_009, 0, 50);
        t
    }

    /// The layout the committed golden traces have (sim/scripts/golden.sh compares whole
    /// traces byte for byte).
    #[test]
    fn events_keep_the_chrome_layout() {
        let json = one_of_each().to_json();
        let expected = [
            r#"{"displayTimeUnit":"ns","otherData":{"simulator":"eptwin-sim"},"traceEvents":["#,
            r#"{"ph":"M","pid":1,"name":"process_name","args":{"name":"GPU 0"}},"#,
            r#"{"ph":"M","pid":1,"name":"process_sort_index","args":{"sort_index":1}},"#,
            r#"{"ph":"M","pid":1,"tid":0,"name":"thread_name","args":{"name":"rank 0 kernels"}},"#,
            r#"{"ph":"X","pid":1,"tid":0,"name":"dispatch","ts":1.000000,"dur":2.500123},"#,
            r#"{"ph":"X","pid":100000,"tid":1,"name":"write 7168 B","ts":1.000005,"dur":0.000004,"args":{"seq":3}},"#,
            r#"{"ph":"X","pid":200000,"tid":4,"name":"VL1 data","ts":1.000010,"dur":0.000010,"args":{"bytes":4160,"payload":4096,"src_nic":0,"dst_nic":9}},"#,
            r#"{"ph":"C","pid":200000,"name":"leaf0.up0 VL1 credits","ts":1.000030,"args":{"credits":-2}},"#,
            r#"{"ph":"s","id":1,"pid":100000,"tid":1,"name":"rdma","cat":"flow","ts":1.000040},"#,
            r#"{"ph":"f","bp":"e","id":1,"pid":100009,"tid":0,"name":"rdma","cat":"flow","ts":1.000050}"#,
            "]}",
            "",
        ];
        assert_eq!(json, expected.join("\n"));
    }

    #[test]
    fn names_with_quotes_and_control_characters_stay_valid_json() {
        let mut t = Trace::default();
        let name = "job \"a\\b\"\n\tnext\u{1}";
        t.name_process(1, name);
        t.span(1, 0, name, 0, 1, SpanArgs::None);
        let doc: serde_json::Value = serde_json::from_str(&t.to_json()).expect("valid JSON");
        let events = doc["traceEvents"].as_array().unwrap();
        assert_eq!(events[0]["args"]["name"], name);
        assert_eq!(events[2]["name"], name);
    }

    #[test]
    fn a_full_trace_says_it_was_cut() {
        let mut t = Trace { events: vec![String::from("{}"); MAX_EVENTS], ..Trace::default() };
        t.span(1, 0, "late", 0, 1, SpanArgs::None);
        assert_eq!(t.events.len(), MAX_EVENTS);
        let head = t.to_json().lines().next().unwrap().to_string();
        assert!(head.contains(r#""truncated":"recording stopped after 2000000 events""#), "{head}");
    }
}
