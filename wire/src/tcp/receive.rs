//! The receiving side of the TCP wire: a thread per peer connection applies its frames to
//! the receive region, in stream order.

use std::io::{self, Read};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::*;
use crate::doorbell::DoorbellKind;
use crate::error::{LinkFault, WireError};
use crate::region::Region;

/// Shared by the receiver threads of one process.
#[derive(Default)]
pub(super) struct LinkState {
    pub(super) failed: AtomicBool,
    pub(super) faults: Mutex<Vec<LinkFault>>,
    pub(super) immediates: Mutex<Vec<Immediate>>,
    pub(super) frames: Mutex<ReceiverStats>,
}

impl LinkState {
    fn fail(&self, fault: LinkFault) {
        self.faults.lock().expect("fault list").push(fault);
        self.failed.store(true, Ordering::Release);
    }
}

/// An immediate delivered by a `WriteWithImm` frame (verbs delivers it through a receive
/// completion).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Immediate {
    pub peer: u32,
    pub qp: u32,
    pub imm: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    pub writes: u64,
    pub write_bytes: u64,
    pub flags: u64,
}

/// The receiver threads of one process's TCP wire (one per peer).
pub struct TcpReceivers {
    pub(super) local: u32,
    pub(super) peers: Vec<TcpEndpoint>,
    pub(super) handles: Vec<JoinHandle<()>>,
    pub(super) shutdowns: Vec<TcpStream>,
    pub(super) state: Arc<LinkState>,
    pub(super) close_timeout: Duration,
}

impl TcpReceivers {
    /// `Err` with the first fault once any link broke: whatever waits for data from a peer
    /// calls this while it waits, so a vanished peer ends the wait with its name.
    pub fn health(&self) -> Result<(), WireError> {
        if !self.state.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let faults = self.state.faults.lock().expect("fault list");
        Err(WireError::Link(faults.first().cloned().expect("failed implies a fault")))
    }

    /// Immediates received so far (taken).
    pub fn take_immediates(&self) -> Vec<Immediate> {
        std::mem::take(&mut *self.state.immediates.lock().expect("immediates"))
    }

    /// Wait (at most the close timeout) until every peer has sent its closing frame; the first
    /// fault, or the peers that did not close, as an error.
    pub fn finish(mut self) -> Result<ReceiverStats, WireError> {
        #[allow(clippy::disallowed_methods)] // real time: the close deadline
        let start = std::time::Instant::now();
        let mut round = 0u32;
        while self.handles.iter().any(|h| !h.is_finished()) {
            if start.elapsed() > self.close_timeout {
                let open: Vec<&TcpEndpoint> = self
                    .handles
                    .iter()
                    .zip(&self.peers)
                    .filter(|(h, _)| !h.is_finished())
                    .map(|(_, p)| p)
                    .collect();
                let names: Vec<String> = open.iter().map(|p| p.process.to_string()).collect();
                let e = link_fault(
                    self.local,
                    open[0],
                    format!(
                        "did not close its connection within {} ms (open: processes {})",
                        self.close_timeout.as_millis(),
                        names.join(", ")
                    ),
                );
                return Err(e); // Drop shuts the sockets down and joins the threads.
            }
            crate::doorbell::backoff(&mut round);
            if round > 64 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
        self.health()?;
        Ok(self.state.frames.lock().expect("stats").clone())
    }
}

impl Drop for TcpReceivers {
    fn drop(&mut self) {
        for s in &self.shutdowns {
            let _ = s.shutdown(Shutdown::Both);
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Read exactly `buf.len()` bytes; `Ok(false)` on EOF before the first byte.
fn read_full(stream: &mut TcpStream, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match stream.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the connection ended {got} bytes into a {}-byte read", buf.len()),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn receive_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::UnexpectedEof => {
            format!("the peer vanished (its process exited or was killed): {e}")
        }
        _ => format!("receiving failed: {e}"),
    }
}

/// One receiver thread: apply the peer's frames to `recv` until its closing frame.
pub(super) fn receive_loop(
    local: u32,
    peer: &TcpEndpoint,
    mut stream: TcpStream,
    recv: &Region,
    state: &LinkState,
) {
    let fault = |reason: String, rec: Option<(u32, u64, u64)>| LinkFault {
        local,
        peer: peer.process,
        peer_addr: peer.addr.to_string(),
        qp: rec.map(|r| r.0),
        tag: rec.map(|r| r.1),
        offset: rec.map(|r| r.2),
        reason,
    };
    let mut header = [0u8; FRAME_HEADER_BYTES];
    let mut payload = Vec::new();
    let mut stats = ReceiverStats::default();
    let result = loop {
        match read_full(&mut stream, &mut header) {
            Ok(true) => {}
            Ok(false) => {
                break Err(fault(
                    "the connection ended without the closing frame (the peer process exited, \
                     was killed, or failed)"
                        .into(),
                    None,
                ));
            }
            Err(e) => break Err(fault(receive_reason(&e), None)),
        }
        let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4"));
        let long = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8"));
        if word(0) != FRAME_MAGIC {
            break Err(fault(format!("stream corrupt: frame magic {:#x}", word(0)), None));
        }
        let (kind, qp, len, imm) = (word(4), word(8), word(12) as u64, word(16));
        let (offset, add, tag) = (long(24), long(32), long(40));
        let at = Some((qp, tag, offset));
        if kind == KIND_CLOSE {
            break Ok(());
        }
        match DoorbellKind::from_raw(kind) {
            Some(DoorbellKind::Write | DoorbellKind::WriteWithImm) => {
                if !recv.contains(offset, len) {
                    break Err(fault(
                        format!(
                            "write frame {offset}+{len} outside the {}-byte receive region \
                             (refused)",
                            recv.len()
                        ),
                        at,
                    ));
                }
                payload.resize(len as usize, 0);
                match read_full(&mut stream, &mut payload) {
                    Ok(true) => {}
                    Ok(false) if len == 0 => {}
                    Ok(false) => {
                        break Err(fault("the connection ended inside a write frame".into(), at));
                    }
                    Err(e) => break Err(fault(receive_reason(&e), at)),
                }
                recv.write(offset, &payload);
                stats.writes += 1;
                stats.write_bytes += len;
                if kind == DoorbellKind::WriteWithImm as u32 {
                    state.immediates.lock().expect("immediates").push(Immediate {
                        peer: peer.process,
                        qp,
                        imm,
                    });
                }
            }
            Some(DoorbellKind::Flag) => {
                if !offset.is_multiple_of(8) || !recv.contains(offset, 8) {
                    break Err(fault(
                        format!(
                            "flag counter {offset}+8 misaligned or outside the {}-byte receive \
                             region (refused)",
                            recv.len()
                        ),
                        at,
                    ));
                }
                // Release: the payloads copied before this point are visible to whoever
                // observes the new counter value with an Acquire load.
                recv.fetch_add_u64(offset, add);
                stats.flags += 1;
            }
            None => break Err(fault(format!("unknown frame kind {kind}"), at)),
        }
    };
    {
        let mut total = state.frames.lock().expect("stats");
        total.writes += stats.writes;
        total.write_bytes += stats.write_bytes;
        total.flags += stats.flags;
    }
    if let Err(f) = result {
        state.fail(f);
    }
}
