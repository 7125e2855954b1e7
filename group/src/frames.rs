//! The group's frames on TCP: `[u32 length, big-endian][u8 kind][body]`, the length counting
//! kind and body and bounded by [`MAX_FRAME_BYTES`]. Control messages carry JSON; data frames a
//! small binary header and the caller's bytes.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use super::error::{Failure, PeerId};

/// Largest frame accepted (kind and body): the group carries handles, endpoints and samples,
/// never bulk data; a peer announcing more is broken or not eptwin.
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// First field of a hello: a connection that does not start with it is not eptwin's.
pub const MAGIC: &str = "eptwin-process-group/1";

/// What a process says when it connects to process 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: String,
    pub rank: usize,
    pub count: usize,
    pub host: String,
    pub pid: u32,
    pub eptwin_version: String,
    pub scenario_sha256: String,
}

/// The collective a data frame belongs to; process 0 checks every process is in the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Barrier = 1,
    AllGather = 2,
    Broadcast = 3,
    Gather = 4,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Barrier => "barrier",
            Op::AllGather => "all_gather",
            Op::Broadcast => "broadcast",
            Op::Gather => "gather",
        }
    }

    fn from_code(code: u8) -> Option<Op> {
        [Op::Barrier, Op::AllGather, Op::Broadcast, Op::Gather]
            .into_iter()
            .find(|o| *o as u8 == code)
    }
}

/// One collective's contribution or result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data {
    /// The collective's index in this group, counted alike by every process.
    pub seq: u64,
    pub op: Op,
    pub root: u32,
    pub label: String,
    pub payload: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    Hello(Hello),
    /// Process 0 accepted a hello; the rendezvous ends for it within `deadline_ms`.
    Ack {
        deadline_ms: u64,
    },
    /// Everyone arrived: the group's members by rank.
    Welcome(Vec<PeerId>),
    Data(Data),
    Heartbeat,
    Abort(Failure),
    /// The sender finished the group normally; its connection closing next is no failure.
    Bye,
}

const HELLO: u8 = 1;
const ACK: u8 = 2;
const WELCOME: u8 = 3;
const DATA: u8 = 4;
const HEARTBEAT: u8 = 5;
const ABORT: u8 = 6;
const BYE: u8 = 7;

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

impl Msg {
    pub fn encode(&self) -> Vec<u8> {
        let json = |v: &dyn erased::Json| v.to_json();
        let (kind, body) = match self {
            Msg::Hello(h) => (HELLO, json(h)),
            Msg::Ack { deadline_ms } => (ACK, deadline_ms.to_be_bytes().to_vec()),
            Msg::Welcome(peers) => (WELCOME, json(peers)),
            Msg::Data(d) => {
                let mut body = Vec::with_capacity(15 + d.label.len() + d.payload.len());
                body.extend_from_slice(&d.seq.to_be_bytes());
                body.push(d.op as u8);
                body.extend_from_slice(&d.root.to_be_bytes());
                let label = &d.label.as_bytes()[..d.label.len().min(u16::MAX as usize)];
                body.extend_from_slice(&(label.len() as u16).to_be_bytes());
                body.extend_from_slice(label);
                body.extend_from_slice(&d.payload);
                (DATA, body)
            }
            Msg::Heartbeat => (HEARTBEAT, Vec::new()),
            Msg::Abort(f) => (ABORT, json(f)),
            Msg::Bye => (BYE, Vec::new()),
        };
        let mut frame = Vec::with_capacity(5 + body.len());
        frame.extend_from_slice(&((body.len() + 1) as u32).to_be_bytes());
        frame.push(kind);
        frame.extend_from_slice(&body);
        frame
    }

    fn decode(kind: u8, body: Vec<u8>) -> io::Result<Msg> {
        let json_err = |what: &str, e: serde_json::Error| invalid(format!("a {what} frame: {e}"));
        Ok(match kind {
            HELLO => Msg::Hello(serde_json::from_slice(&body).map_err(|e| json_err("hello", e))?),
            ACK => {
                let bytes: [u8; 8] = body
                    .try_into()
                    .map_err(|_| invalid("an ack frame of the wrong size".into()))?;
                Msg::Ack { deadline_ms: u64::from_be_bytes(bytes) }
            }
            WELCOME => {
                Msg::Welcome(serde_json::from_slice(&body).map_err(|e| json_err("welcome", e))?)
            }
            DATA => {
                if body.len() < 15 {
                    return Err(invalid(format!("a data frame of {} bytes", body.len())));
                }
                let seq = u64::from_be_bytes(body[0..8].try_into().expect("8 bytes"));
                let op = Op::from_code(body[8])
                    .ok_or_else(|| invalid(format!("unknown collective code {}", body[8])))?;
                let root = u32::from_be_bytes(body[9..13].try_into().expect("4 bytes"));
                let label_len = u16::from_be_bytes([body[13], body[14]]) as usize;
                if body.len() < 15 + label_len {
                    return Err(invalid("a data frame shorter than its label".into()));
                }
                let label = String::from_utf8_lossy(&body[15..15 + label_len]).into_owned();
                let payload = body[15 + label_len..].to_vec();
                Msg::Data(Data { seq, op, root, label, payload })
            }
            HEARTBEAT => Msg::Heartbeat,
            ABORT => Msg::Abort(serde_json::from_slice(&body).map_err(|e| json_err("abort", e))?),
            BYE => Msg::Bye,
            other => return Err(invalid(format!("unknown frame kind {other}"))),
        })
    }
}

/// Object-safe JSON encoding for the match above.
mod erased {
    pub trait Json {
        fn to_json(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Json for T {
        fn to_json(&self) -> Vec<u8> {
            serde_json::to_vec(self).expect("group messages serialise")
        }
    }
}

pub fn write_msg(w: &mut impl Write, msg: &Msg) -> io::Result<()> {
    let frame = msg.encode();
    if frame.len() - 4 > MAX_FRAME_BYTES {
        return Err(invalid(format!(
            "a frame of {} bytes exceeds the group's bound of {MAX_FRAME_BYTES} bytes",
            frame.len() - 4
        )));
    }
    w.write_all(&frame)?;
    w.flush()
}

pub fn read_msg(r: &mut impl Read) -> io::Result<Msg> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > MAX_FRAME_BYTES {
        return Err(invalid(format!(
            "a frame announcing {len} bytes (the bound is {MAX_FRAME_BYTES}): not an eptwin peer"
        )));
    }
    let mut kind = [0u8; 1];
    r.read_exact(&mut kind)?;
    let mut body = vec![0u8; len - 1];
    r.read_exact(&mut body)?;
    Msg::decode(kind[0], body)
}

/// `[u32 count]([u32 length][bytes])*`: the result of a gather.
pub fn encode_list(items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + items.iter().map(|i| 4 + i.len()).sum::<usize>());
    out.extend_from_slice(&(items.len() as u32).to_be_bytes());
    for item in items {
        out.extend_from_slice(&(item.len() as u32).to_be_bytes());
        out.extend_from_slice(item);
    }
    out
}

pub fn decode_list(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let take = |at: usize| -> Result<u32, String> {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
            .ok_or_else(|| "a gathered list cut short".to_string())
    };
    let count = take(0)? as usize;
    let mut at = 4;
    let mut items = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let len = take(at)? as usize;
        at += 4;
        let item = bytes.get(at..at + len).ok_or("a gathered list cut short")?;
        items.push(item.to_vec());
        at += len;
    }
    if at != bytes.len() {
        return Err(format!("{} bytes after a gathered list", bytes.len() - at));
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(msg: Msg) {
        let bytes = msg.encode();
        let back = read_msg(&mut bytes.as_slice()).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn every_message_round_trips() {
        round_trip(Msg::Hello(Hello {
            magic: MAGIC.into(),
            rank: 3,
            count: 4,
            host: "gpu07".into(),
            pid: 1234,
            eptwin_version: "0.1.0".into(),
            scenario_sha256: "ab".repeat(32),
        }));
        round_trip(Msg::Ack { deadline_ms: 120_000 });
        round_trip(Msg::Welcome(vec![PeerId::known(0, "a", 1), PeerId::known(1, "b", 2)]));
        round_trip(Msg::Data(Data {
            seq: 7,
            op: Op::Broadcast,
            root: 2,
            label: "handles".into(),
            payload: vec![1, 2, 3],
        }));
        round_trip(Msg::Heartbeat);
        round_trip(Msg::Bye);
        round_trip(Msg::Abort(Failure {
            peer: PeerId::rank_only(1),
            what: "aborted the run: x".into(),
            when: "during `barrier`".into(),
        }));
    }

    #[test]
    fn oversized_and_foreign_frames_are_refused() {
        let mut huge = ((MAX_FRAME_BYTES + 1) as u32).to_be_bytes().to_vec();
        huge.push(HEARTBEAT);
        let e = read_msg(&mut huge.as_slice()).unwrap_err();
        assert!(e.to_string().contains("the bound is"), "{e}");
        // An HTTP request is not a frame.
        let e = read_msg(&mut &b"GET / HTTP/1.1\r\n\r\n"[..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        let mut sink = Vec::new();
        let big = Msg::Data(Data {
            seq: 0,
            op: Op::Gather,
            root: 0,
            label: String::new(),
            payload: vec![0; MAX_FRAME_BYTES],
        });
        assert!(write_msg(&mut sink, &big).unwrap_err().to_string().contains("exceeds"));
        assert!(sink.is_empty());
        assert!(
            read_msg(&mut &[0u8, 0, 0, 2, 99, 0][..]).unwrap_err().to_string().contains("kind 99")
        );
    }

    proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        #[test]
        fn lists_round_trip(items in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..10)) {
            let bytes = encode_list(&items);
            prop_assert_eq!(decode_list(&bytes).unwrap(), items);
            if !bytes.is_empty() {
                prop_assert!(decode_list(&bytes[..bytes.len() - 1]).is_err());
            }
        }
    }
}
