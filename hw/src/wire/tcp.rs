//! The TCP wire: the proxy's records as length-prefixed frames over one TCP connection per
//! pair of processes, so the internode pipeline runs on any machine (its timings are not a
//! fabric measurement).
//!
//! Why one connection per peer process and not one per QP: TCP delivers one connection's bytes
//! in order, which gives every QP multiplexed on it the per-QP order the protocol needs (and
//! more: all QPs to that peer are ordered); separate sockets would add nothing but file
//! descriptors and handshakes, since one proxy thread writes them all anyway.
//!
//! Setup: every process binds a listener ([`TcpSetup::bind`]) and publishes its
//! [`TcpEndpoint`] (address, process index, receive-region size) through whatever out-of-band
//! channel the launcher gives; [`TcpSetup::connect`] then dials every lower-numbered peer and
//! accepts every higher-numbered one, with a hello exchange naming both processes. The same
//! socket carries both directions: this side's [`TcpWire`] writes frames, a receiver thread
//! ([`TcpReceivers`]) reads the peer's.
//!
//! Frame: a 48-byte little-endian header `{magic "EPWF", kind, qp, len_bytes, imm, 0,
//! dst_offset, add, tag}` followed, for writes, by `len_bytes` of payload. The receiver
//! checks every frame against its receive region (a write's range, a flag's 8-aligned counter)
//! and refuses it with the peer, QP, tag and offset; it copies a write's payload into the
//! region and applies a flag with `fetch_add(Release)` on the counter, in stream order, so a
//! flag is visible only after the writes before it.
//!
//! Failure and timeouts (never a hang):
//! * a peer that is not there: dialing retries until [`TcpTimeouts::connect`], accepting
//!   waits as long; the error names every missing process;
//! * a peer that dies: its kernel closes the socket, the receiver reads EOF (or a reset)
//!   without the closing frame and records a [`LinkFault`] naming the peer, which
//!   [`TcpReceivers::health`] reports to whatever waits on data; writes to it fail (EPIPE,
//!   reset) in the proxy, which stops with the same coordinates;
//! * a peer that stops reading: a write blocks at most [`TcpTimeouts::write`];
//! * orderly end: [`TcpWire::close`] sends the closing frame, [`TcpReceivers::finish`] waits
//!   at most [`TcpTimeouts::close`] for every peer's.
//!
//! A peer that is alive but silent is not an error here (idle links are normal); the
//! protocol's waits bound it (`internode::host`).

use std::io::{self, BufWriter, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::doorbell::{Doorbell, DoorbellKind};
use super::proxy::ProxyStats;
use super::region::Region;
use super::{DataPath, Wire, WireKind, WireReport};
use crate::rdma::{LinkFault, RdmaError};

const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"EPWF");
const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"EPTH");
const ENDPOINT_MAGIC: &[u8; 4] = b"EPTC";
const VERSION: u32 = 1;
/// Header bytes of every frame.
pub const FRAME_HEADER_BYTES: usize = 48;
/// Frame kinds beyond [`DoorbellKind`]'s values.
const KIND_CLOSE: u32 = 0x10;

/// Bounds on every wait of the TCP wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpTimeouts {
    /// Connection setup: dialing a peer (retried while refused) and waiting for the peers
    /// that dial in.
    pub connect: Duration,
    /// A frame write that cannot make progress (the peer stopped reading) gives up after this.
    pub write: Duration,
    /// How long [`TcpReceivers::finish`] waits for every peer's closing frame.
    pub close: Duration,
}

impl Default for TcpTimeouts {
    /// 60 s each: longer than any launcher's start-up skew between processes, short enough
    /// that a broken run ends on its own.
    fn default() -> Self {
        let minute = Duration::from_secs(60);
        TcpTimeouts { connect: minute, write: minute, close: minute }
    }
}

/// What a peer needs to reach this process's TCP wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpEndpoint {
    pub process: u32,
    pub addr: SocketAddr,
    /// Size of the receive region frames land in (the sender's proxy checks against it).
    pub recv_len_bytes: u64,
}

impl TcpEndpoint {
    /// Versioned little-endian bytes, for any out-of-band channel.
    pub fn to_bytes(&self) -> Vec<u8> {
        let addr = self.addr.to_string();
        let mut out = Vec::with_capacity(4 + 4 + 4 + 8 + 2 + addr.len());
        out.extend_from_slice(ENDPOINT_MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.process.to_le_bytes());
        out.extend_from_slice(&self.recv_len_bytes.to_le_bytes());
        out.extend_from_slice(&(addr.len() as u16).to_le_bytes());
        out.extend_from_slice(addr.as_bytes());
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<TcpEndpoint, RdmaError> {
        let bad = |why: String| RdmaError::Endpoint(format!("TCP endpoint: {why}"));
        if bytes.len() < 22 || &bytes[..4] != ENDPOINT_MAGIC {
            return Err(bad(format!("{} bytes without the EPTC header", bytes.len())));
        }
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        if word(4) != VERSION {
            return Err(bad(format!("version {} (this build reads {VERSION})", word(4))));
        }
        let process = word(8);
        let recv_len_bytes = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
        let n = u16::from_le_bytes([bytes[20], bytes[21]]) as usize;
        if bytes.len() != 22 + n {
            return Err(bad(format!("{} bytes for a {n}-byte address", bytes.len())));
        }
        let text = std::str::from_utf8(&bytes[22..]).map_err(|e| bad(e.to_string()))?;
        let addr = text.parse().map_err(|e| bad(format!("address {text:?}: {e}")))?;
        Ok(TcpEndpoint { process, addr, recv_len_bytes })
    }
}

/// A bound listener, before the peers are known.
pub struct TcpSetup {
    local: u32,
    listener: TcpListener,
    addr: SocketAddr,
    recv: Arc<Region>,
}

impl TcpSetup {
    /// Listen at `bind` (port 0 picks a free port) for the peers' connections; their frames
    /// will land in `recv`.
    pub fn bind(local: u32, bind: SocketAddr, recv: Arc<Region>) -> Result<TcpSetup, RdmaError> {
        let io = |what: &str, e: io::Error| {
            RdmaError::Link(LinkFault {
                local,
                peer: local,
                peer_addr: bind.to_string(),
                qp: None,
                tag: None,
                offset: None,
                reason: format!("{what}: {e}"),
            })
        };
        let listener = TcpListener::bind(bind).map_err(|e| io("cannot listen", e))?;
        let addr = listener.local_addr().map_err(|e| io("listener address", e))?;
        Ok(TcpSetup { local, listener, addr, recv })
    }

    /// This process's endpoint at the bound address.
    pub fn endpoint(&self) -> TcpEndpoint {
        TcpEndpoint { process: self.local, addr: self.addr, recv_len_bytes: self.recv.len() }
    }

    /// The endpoint with `host` instead of the bound address (binding `0.0.0.0` listens on
    /// every interface, but peers must dial a real one).
    pub fn endpoint_at(&self, host: IpAddr) -> TcpEndpoint {
        TcpEndpoint { addr: SocketAddr::new(host, self.addr.port()), ..self.endpoint() }
    }

    /// Connect to every peer (in QP-table order: peer slot `i` is `peers[i]`), each carrying
    /// `qps_per_process` QP-table entries. Returns the sending side for the proxy and the
    /// receiver threads.
    pub fn connect(
        self,
        peers: &[TcpEndpoint],
        send: Arc<Region>,
        qps_per_process: u32,
        timeouts: TcpTimeouts,
    ) -> Result<(TcpWire, TcpReceivers), RdmaError> {
        let local = self.local;
        if let Some(p) = peers.iter().find(|p| p.process == local) {
            return Err(RdmaError::Endpoint(format!(
                "process {local} is listed as its own peer ({})",
                p.addr
            )));
        }
        #[allow(clippy::disallowed_methods)] // real time: a connection deadline
        let start = std::time::Instant::now();
        let mut streams: Vec<Option<TcpStream>> = (0..peers.len()).map(|_| None).collect();
        for (slot, peer) in peers.iter().enumerate() {
            if peer.process < local {
                streams[slot] = Some(dial(local, peer, start, timeouts.connect)?);
            }
        }
        accept_all(local, &self.listener, peers, &mut streams, start, timeouts.connect)?;

        let state = Arc::new(LinkState::default());
        let mut links = Vec::with_capacity(peers.len());
        let mut readers = Vec::with_capacity(peers.len());
        for (peer, stream) in peers.iter().zip(streams) {
            let stream = stream.expect("every peer connected or an error returned");
            let fault = |what: &str, e: io::Error| link_fault(local, peer, format!("{what}: {e}"));
            stream.set_nodelay(true).map_err(|e| fault("TCP_NODELAY", e))?;
            stream.set_read_timeout(None).map_err(|e| fault("read timeout", e))?;
            let writer = stream.try_clone().map_err(|e| fault("cloning the socket", e))?;
            writer
                .set_write_timeout(Some(timeouts.write))
                .map_err(|e| fault("write timeout", e))?;
            let shutdown_handle = stream.try_clone().map_err(|e| fault("cloning the socket", e))?;
            links.push(SendLink {
                peer: peer.process,
                addr: peer.addr.to_string(),
                remote_len: peer.recv_len_bytes,
                stream: BufWriter::with_capacity(256 * 1024, writer),
            });
            readers.push((peer.clone(), stream, shutdown_handle));
        }
        let mut handles = Vec::with_capacity(readers.len());
        let mut shutdowns = Vec::with_capacity(readers.len());
        for (peer, stream, shutdown_handle) in readers {
            let recv = self.recv.clone();
            let state = state.clone();
            let name = format!("eptwin-tcp-recv-{local}-from-{}", peer.process);
            let peer_for_thread = peer.clone();
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(move || receive(local, &peer_for_thread, stream, &recv, &state))
                .map_err(|e| link_fault(local, &peer, format!("cannot start receiver: {e}")))?;
            handles.push(handle);
            shutdowns.push(shutdown_handle);
        }
        let wire = TcpWire {
            local,
            links,
            qps_per_process: qps_per_process.max(1),
            send,
            scratch: Vec::new(),
            write_timeout: timeouts.write,
            closed: false,
        };
        let receivers = TcpReceivers {
            local,
            peers: peers.to_vec(),
            handles,
            shutdowns,
            state,
            close_timeout: timeouts.close,
        };
        Ok((wire, receivers))
    }
}

fn link_fault(local: u32, peer: &TcpEndpoint, reason: String) -> RdmaError {
    RdmaError::Link(LinkFault {
        local,
        peer: peer.process,
        peer_addr: peer.addr.to_string(),
        qp: None,
        tag: None,
        offset: None,
        reason,
    })
}

fn hello(from: u32, to: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&VERSION.to_le_bytes());
    h[8..12].copy_from_slice(&from.to_le_bytes());
    h[12..16].copy_from_slice(&to.to_le_bytes());
    h
}

/// `(from, to)` of a hello, or why it is not one.
fn parse_hello(h: &[u8; 16]) -> Result<(u32, u32), String> {
    let word = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().expect("4 bytes"));
    if word(0) != HELLO_MAGIC {
        return Err("the peer is not an eptwin TCP wire (bad hello)".into());
    }
    if word(4) != VERSION {
        return Err(format!("wire version {} (this build speaks {VERSION})", word(4)));
    }
    Ok((word(8), word(12)))
}

fn remaining(start: std::time::Instant, limit: Duration) -> Option<Duration> {
    limit.checked_sub(start.elapsed()).filter(|d| !d.is_zero())
}

/// Dial `peer` (retrying while it refuses) and exchange hellos.
fn dial(
    local: u32,
    peer: &TcpEndpoint,
    start: std::time::Instant,
    limit: Duration,
) -> Result<TcpStream, RdmaError> {
    let mut last = String::from("no attempt");
    while let Some(left) = remaining(start, limit) {
        match TcpStream::connect_timeout(&peer.addr, left.min(Duration::from_secs(5))) {
            Ok(mut s) => {
                let left = remaining(start, limit).unwrap_or(Duration::from_millis(1));
                let shake = (|| -> io::Result<[u8; 16]> {
                    s.set_read_timeout(Some(left))?;
                    s.write_all(&hello(local, peer.process))?;
                    let mut h = [0u8; 16];
                    s.read_exact(&mut h)?;
                    Ok(h)
                })();
                let h = shake.map_err(|e| {
                    link_fault(local, peer, format!("hello exchange after connecting: {e}"))
                })?;
                return match parse_hello(&h) {
                    Ok((from, to)) if from == peer.process && to == local => Ok(s),
                    Ok((from, to)) => Err(link_fault(
                        local,
                        peer,
                        format!("answered as process {from} (for process {to})"),
                    )),
                    Err(why) => Err(link_fault(local, peer, why)),
                };
            }
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    Err(link_fault(
        local,
        peer,
        format!("could not connect within {} ms (last error: {last})", limit.as_millis()),
    ))
}

/// Accept one connection from every peer with a higher process index.
fn accept_all(
    local: u32,
    listener: &TcpListener,
    peers: &[TcpEndpoint],
    streams: &mut [Option<TcpStream>],
    start: std::time::Instant,
    limit: Duration,
) -> Result<(), RdmaError> {
    let listen_fault = |e: io::Error| {
        RdmaError::Link(LinkFault {
            local,
            peer: local,
            peer_addr: listener.local_addr().map_or("?".into(), |a| a.to_string()),
            qp: None,
            tag: None,
            offset: None,
            reason: format!("listener: {e}"),
        })
    };
    listener.set_nonblocking(true).map_err(listen_fault)?;
    loop {
        let missing: Vec<usize> = (0..peers.len())
            .filter(|&i| peers[i].process > local && streams[i].is_none())
            .collect();
        let Some(&first) = missing.first() else { return Ok(()) };
        let Some(left) = remaining(start, limit) else {
            let others: Vec<String> =
                missing[1..].iter().map(|&i| peers[i].process.to_string()).collect();
            return Err(link_fault(
                local,
                &peers[first],
                format!(
                    "never connected within {} ms{}",
                    limit.as_millis(),
                    if others.is_empty() {
                        String::new()
                    } else {
                        format!(" (processes {} are missing too)", others.join(", "))
                    }
                ),
            ));
        };
        match listener.accept() {
            Ok((mut s, from_addr)) => {
                s.set_nonblocking(false).map_err(listen_fault)?;
                s.set_read_timeout(Some(left)).map_err(listen_fault)?;
                let mut h = [0u8; 16];
                // A connection that does not say hello is someone else's; drop it and wait on.
                if s.read_exact(&mut h).is_err() {
                    continue;
                }
                let Ok((from, to)) = parse_hello(&h) else { continue };
                let Some(slot) = peers.iter().position(|p| p.process == from) else { continue };
                if to != local || from <= local || streams[slot].is_some() {
                    return Err(link_fault(
                        local,
                        &peers[slot],
                        format!(
                            "unexpected hello from {from_addr}: process {from} for process {to}"
                        ),
                    ));
                }
                s.write_all(&hello(local, from)).map_err(|e| {
                    link_fault(local, &peers[slot], format!("answering the hello: {e}"))
                })?;
                streams[slot] = Some(s);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(listen_fault(e)),
        }
    }
}

fn frame_header(kind: u32, rec: &Doorbell) -> [u8; FRAME_HEADER_BYTES] {
    let mut h = [0u8; FRAME_HEADER_BYTES];
    h[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&kind.to_le_bytes());
    h[8..12].copy_from_slice(&rec.qp.to_le_bytes());
    h[12..16].copy_from_slice(&rec.len_bytes.to_le_bytes());
    h[16..20].copy_from_slice(&rec.imm.to_le_bytes());
    h[24..32].copy_from_slice(&rec.dst_offset.to_le_bytes());
    h[32..40].copy_from_slice(&rec.add.to_le_bytes());
    h[40..48].copy_from_slice(&rec.tag.to_le_bytes());
    h
}

struct SendLink {
    peer: u32,
    addr: String,
    remote_len: u64,
    stream: BufWriter<TcpStream>,
}

/// The sending side of the TCP wire, driven by a [`super::Proxy`]. QP `q` reaches peer slot
/// `q / qps_per_process`.
pub struct TcpWire {
    local: u32,
    links: Vec<SendLink>,
    qps_per_process: u32,
    send: Arc<Region>,
    scratch: Vec<u8>,
    write_timeout: Duration,
    closed: bool,
}

impl TcpWire {
    fn slot(&self, qp: usize) -> usize {
        qp / self.qps_per_process as usize
    }

    fn write_fault(&self, slot: usize, rec: Option<&Doorbell>, e: &io::Error) -> RdmaError {
        let link = &self.links[slot];
        let reason = match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                "the peer stopped reading: a write made no progress for {} ms",
                self.write_timeout.as_millis()
            ),
            io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted => {
                format!("the peer vanished (its process exited or was killed): {e}")
            }
            _ => format!("writing failed: {e}"),
        };
        RdmaError::Link(LinkFault {
            local: self.local,
            peer: link.peer,
            peer_addr: link.addr.clone(),
            qp: rec.map(|r| r.qp),
            tag: rec.map(|r| r.tag),
            offset: rec.map(|r| r.dst_offset),
            reason,
        })
    }

    /// Send every peer the closing frame and stop writing; the peers' receivers then end
    /// without an error. A wire dropped without `close` ends its connections abruptly, which
    /// the peers report as this process vanishing.
    pub fn close(mut self) -> Result<(), RdmaError> {
        self.closed = true;
        let close = Doorbell { kind: KIND_CLOSE, ..Doorbell::flag(0, 0, 0, 0) };
        for slot in 0..self.links.len() {
            let header = frame_header(KIND_CLOSE, &close);
            let link = &mut self.links[slot];
            let r = link.stream.write_all(&header).and_then(|()| link.stream.flush());
            r.map_err(|e| self.write_fault(slot, None, &e))?;
            let _ = self.links[slot].stream.get_ref().shutdown(Shutdown::Write);
        }
        Ok(())
    }

    /// What ran, for the result document.
    pub fn report(&self, reason: &str, qps_per_peer: u32) -> WireReport {
        WireReport {
            wire: WireKind::Tcp,
            data_path: DataPath::Staged,
            reason: reason.to_string(),
            peers: self.links.len() as u32,
            qps_per_peer,
            qps_total: self.qp_count() as u32,
            sl: None,
            traffic_class: None,
            qp_depth: None,
            mtu_bytes: None,
            device: None,
            link_layer: None,
        }
    }
}

impl Drop for TcpWire {
    fn drop(&mut self) {
        if !self.closed {
            for link in &self.links {
                let _ = link.stream.get_ref().shutdown(Shutdown::Both);
            }
        }
    }
}

impl Wire for TcpWire {
    fn kind(&self) -> WireKind {
        WireKind::Tcp
    }

    fn qp_count(&self) -> usize {
        self.links.len() * self.qps_per_process as usize
    }

    fn peer_of(&self, qp: usize) -> u32 {
        self.links[self.slot(qp)].peer
    }

    fn send_len(&self) -> u64 {
        self.send.len()
    }

    fn remote_len(&self, qp: usize) -> u64 {
        self.links[self.slot(qp)].remote_len
    }

    fn reserve(&mut self, _: usize, _: Duration, _: &mut ProxyStats) -> Result<(), RdmaError> {
        // Back-pressure is the socket's: a full send buffer blocks the write (bounded by the
        // write timeout).
        Ok(())
    }

    fn post(&mut self, qp: usize, kind: DoorbellKind, rec: &Doorbell) -> Result<(), RdmaError> {
        let slot = self.slot(qp);
        let header = frame_header(kind as u32, rec);
        let payload = match kind {
            DoorbellKind::Write | DoorbellKind::WriteWithImm => {
                self.scratch.resize(rec.len_bytes as usize, 0);
                self.send.read(rec.src_offset, &mut self.scratch);
                true
            }
            DoorbellKind::Flag => false,
        };
        let link = &mut self.links[slot];
        let mut r = link.stream.write_all(&header);
        if payload && r.is_ok() {
            r = link.stream.write_all(&self.scratch);
        }
        r.map_err(|e| self.write_fault(slot, Some(rec), &e))
    }

    fn progress(&mut self) -> Result<bool, RdmaError> {
        // Frames wait in the buffer only while the proxy has more records at hand; flushing
        // every round keeps a flag from sitting there.
        for slot in 0..self.links.len() {
            if !self.links[slot].stream.buffer().is_empty() {
                let r = self.links[slot].stream.flush();
                r.map_err(|e| self.write_fault(slot, None, &e))?;
            }
        }
        Ok(false)
    }

    fn outstanding(&self, _: usize) -> u32 {
        0
    }

    fn drain(&mut self, _: Duration) -> Result<(), RdmaError> {
        self.progress().map(|_| ())
    }
}

/// Shared by the receiver threads of one process.
#[derive(Default)]
struct LinkState {
    failed: AtomicBool,
    faults: Mutex<Vec<LinkFault>>,
    immediates: Mutex<Vec<Immediate>>,
    frames: Mutex<ReceiverStats>,
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
    local: u32,
    peers: Vec<TcpEndpoint>,
    handles: Vec<JoinHandle<()>>,
    shutdowns: Vec<TcpStream>,
    state: Arc<LinkState>,
    close_timeout: Duration,
}

impl TcpReceivers {
    /// `Err` with the first fault once any link broke: whatever waits for data from a peer
    /// calls this while it waits, so a vanished peer ends the wait with its name.
    pub fn health(&self) -> Result<(), RdmaError> {
        if !self.state.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let faults = self.state.faults.lock().expect("fault list");
        Err(RdmaError::Link(faults.first().cloned().expect("failed implies a fault")))
    }

    /// Immediates received so far (taken).
    pub fn take_immediates(&self) -> Vec<Immediate> {
        std::mem::take(&mut *self.state.immediates.lock().expect("immediates"))
    }

    /// Wait (at most the close timeout) until every peer has sent its closing frame; the first
    /// fault, or the peers that did not close, as an error.
    pub fn finish(mut self) -> Result<ReceiverStats, RdmaError> {
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
            super::doorbell::backoff(&mut round);
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
fn receive(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Proxy, ProxySpec, doorbell_queue};

    fn quick() -> TcpTimeouts {
        TcpTimeouts {
            connect: Duration::from_secs(10),
            write: Duration::from_secs(10),
            close: Duration::from_secs(10),
        }
    }

    fn localhost() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    /// Two processes' wires inside one process: 0 and 1, each with a send and a receive region.
    #[allow(clippy::type_complexity)]
    fn pair(
        len: usize,
        qps: u32,
    ) -> (
        (TcpWire, TcpReceivers, Arc<Region>, Arc<Region>),
        (TcpWire, TcpReceivers, Arc<Region>, Arc<Region>),
    ) {
        let mk = || (Arc::new(Region::alloc(len).unwrap()), Arc::new(Region::alloc(len).unwrap()));
        let (s0, r0) = mk();
        let (s1, r1) = mk();
        let a = TcpSetup::bind(0, localhost(), r0.clone()).unwrap();
        let b = TcpSetup::bind(1, localhost(), r1.clone()).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let tb = {
            let s1 = s1.clone();
            std::thread::spawn(move || b.connect(&[ea], s1, qps, quick()).unwrap())
        };
        let (wa, ra) = a.connect(&[eb], s0.clone(), qps, quick()).unwrap();
        let (wb, rb) = tb.join().unwrap();
        ((wa, ra, s0, r0), (wb, rb, s1, r1))
    }

    #[test]
    fn endpoint_bytes_round_trip_and_reject_garbage() {
        let e = TcpEndpoint {
            process: 7,
            addr: "[::1]:4242".parse().unwrap(),
            recv_len_bytes: 1 << 33,
        };
        assert_eq!(TcpEndpoint::from_bytes(&e.to_bytes()).unwrap(), e);
        let mut bytes = e.to_bytes();
        bytes.pop();
        assert!(TcpEndpoint::from_bytes(&bytes).is_err());
        assert!(TcpEndpoint::from_bytes(b"EPQP......").unwrap_err().to_string().contains("EPTC"));
    }

    #[test]
    fn writes_then_flags_arrive_in_order_through_the_proxy() {
        let ((wa, ra, s0, _r0), (wb, rb, _s1, r1)) = pair(1 << 16, 2);
        let (p, c) = doorbell_queue(16);
        let proxy =
            Proxy::spawn(0, ProxySpec { wire: wa, queues: vec![c], stall_timeout: quick().write })
                .unwrap();
        const ROUNDS: u64 = 200;
        let watcher = {
            let r1 = r1.clone();
            std::thread::spawn(move || {
                let mut seen = 0;
                while seen < ROUNDS {
                    let flag = r1.load_u64(0);
                    while seen < flag {
                        let got = r1.to_vec(64 + (seen % 8) * 256, 256);
                        // A later round may overwrite the slot, never an earlier one.
                        assert!(got.iter().all(|&b| b as u64 >= seen % 251), "round {seen}");
                        seen += 1;
                    }
                    std::thread::yield_now();
                }
            })
        };
        for r in 0..ROUNDS {
            let slot = 64 + (r % 8) * 256;
            s0.write(slot, &[(r % 251) as u8; 256]);
            p.push(Doorbell::write((r % 2) as u32, slot, slot, 256, r)).unwrap();
            p.push(Doorbell::flag(0, 0, 1, r)).unwrap();
            // Slots are reused every 8 rounds: wait until the receiver has this round's flag
            // before overwriting the send slot 8 rounds later (the credit the protocol uses).
            if r >= 7 {
                while r1.load_u64(0) < r - 6 {
                    std::thread::yield_now();
                }
            }
        }
        let (stats, wa) = proxy.finish().unwrap();
        assert_eq!((stats.writes, stats.flags, stats.write_bytes), (ROUNDS, ROUNDS, ROUNDS * 256));
        watcher.join().unwrap();
        wa.close().unwrap();
        wb.close().unwrap();
        let got = rb.finish().unwrap();
        assert_eq!((got.writes, got.flags), (ROUNDS, ROUNDS));
        ra.finish().unwrap();
        assert_eq!(r1.load_u64(0), ROUNDS);
    }

    #[test]
    fn out_of_bounds_doorbells_are_refused_with_coordinates() {
        let ((wa, ra, _s0, _r0), (wb, rb, _s1, r1)) = pair(4096, 3);
        let (p, c) = doorbell_queue(8);
        let proxy =
            Proxy::spawn(5, ProxySpec { wire: wa, queues: vec![c], stall_timeout: quick().write })
                .unwrap();
        p.push(Doorbell::write(2, 0, 4000, 96, 41)).unwrap();
        p.push(Doorbell::write(1, 0, 4000, 97, 42)).unwrap();
        let e = proxy.finish().err().expect("4000+97 is past 4096");
        let text = e.to_string();
        for needle in ["proxy 5", "tag 42", "QP 1", "peer process 1", "offset 4000", "4096-byte"] {
            assert!(text.contains(needle), "{needle:?} missing in {text}");
        }
        assert!(p.is_closed(), "producers are released");
        drop((wb, ra, rb, r1));

        let ((wa, _ra, _s0, _r0), _other) = pair(4096, 3);
        for (rec, needle) in [
            (Doorbell::flag(0, 12, 1, 7), "not 8-byte aligned"),
            (Doorbell::flag(0, 4096, 1, 7), "outside the peer's 4096-byte"),
            (Doorbell::write(9, 0, 0, 8, 7), "QP index 9 does not exist"),
            (Doorbell::write(0, 4090, 0, 8, 7), "send region"),
            (Doorbell { kind: 99, ..Doorbell::flag(0, 0, 1, 7) }, "unknown kind 99"),
        ] {
            let e = crate::wire::proxy::check(0, &wa, &rec).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("tag 7"), "{needle:?} missing in {e}");
        }
    }

    #[test]
    fn a_frame_outside_the_receive_region_is_refused_by_the_receiver() {
        let recv = Arc::new(Region::alloc(1024).unwrap());
        let setup = TcpSetup::bind(0, localhost(), recv.clone()).unwrap();
        let ep = setup.endpoint();
        // A hand-made peer (process 1) that sends one bad frame.
        let rogue = std::thread::spawn(move || {
            let mut s = TcpStream::connect(ep.addr).unwrap();
            s.write_all(&hello(1, 0)).unwrap();
            let mut h = [0u8; 16];
            s.read_exact(&mut h).unwrap();
            let rec = Doorbell::write(3, 0, 1000, 100, 77);
            s.write_all(&frame_header(DoorbellKind::Write as u32, &rec)).unwrap();
            s.write_all(&[0u8; 100]).unwrap();
            s
        });
        let peer =
            TcpEndpoint { process: 1, addr: "127.0.0.1:9".parse().unwrap(), recv_len_bytes: 1024 };
        let send = Arc::new(Region::alloc(64).unwrap());
        let (_wire, receivers) = setup.connect(&[peer], send, 1, quick()).unwrap();
        let _keep = rogue.join().unwrap();
        #[allow(clippy::disallowed_methods)]
        let start = std::time::Instant::now();
        while receivers.health().is_ok() {
            assert!(start.elapsed() < Duration::from_secs(10), "the bad frame was not refused");
            std::thread::yield_now();
        }
        let e = receivers.health().unwrap_err().to_string();
        for needle in ["process 0", "peer process 1", "QP 3", "tag 77", "offset 1000", "refused"] {
            assert!(e.contains(needle), "{needle:?} missing in {e}");
        }
        assert!(recv.to_vec(0, 1024).iter().all(|&b| b == 0), "nothing was written");
    }

    #[test]
    fn a_peer_that_never_comes_is_named_within_the_timeout() {
        let recv = Arc::new(Region::alloc(64).unwrap());
        let t = TcpTimeouts { connect: Duration::from_millis(300), ..quick() };
        // Process 0 waits for process 2 to dial in; nobody does.
        let setup = TcpSetup::bind(0, localhost(), recv.clone()).unwrap();
        let ghost =
            TcpEndpoint { process: 2, addr: "127.0.0.1:9".parse().unwrap(), recv_len_bytes: 64 };
        #[allow(clippy::disallowed_methods)]
        let start = std::time::Instant::now();
        let e = setup
            .connect(std::slice::from_ref(&ghost), recv.clone(), 1, t)
            .err()
            .unwrap()
            .to_string();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(e.contains("peer process 2") && e.contains("never connected within 300 ms"), "{e}");
        // Process 3 dials process 2, whose port has no listener.
        let dead = TcpListener::bind(localhost()).unwrap();
        let addr = dead.local_addr().unwrap();
        drop(dead);
        let setup = TcpSetup::bind(3, localhost(), recv.clone()).unwrap();
        let e =
            setup.connect(&[TcpEndpoint { addr, ..ghost }], recv, 1, t).err().unwrap().to_string();
        assert!(
            e.contains("peer process 2") && e.contains("could not connect within 300 ms"),
            "{e}"
        );
    }

    #[test]
    fn a_peer_that_vanishes_is_reported_by_both_directions() {
        let ((mut wa, ra, s0, _r0), (wb, rb, _s1, _r1)) = pair(1 << 20, 1);
        // Process 1 dies: its wire and receivers go without the closing frame.
        drop(wb);
        drop(rb);
        #[allow(clippy::disallowed_methods)]
        let start = std::time::Instant::now();
        while ra.health().is_ok() {
            assert!(start.elapsed() < Duration::from_secs(10), "EOF not noticed");
            std::thread::yield_now();
        }
        let e = ra.health().unwrap_err().to_string();
        assert!(e.contains("peer process 1") && e.contains("without the closing frame"), "{e}");
        // Writing to it fails too (after the kernel has seen the reset), naming the peer.
        s0.fill(0, 1 << 20, 1);
        let err = (0..1000)
            .find_map(|i| {
                wa.post(0, DoorbellKind::Write, &Doorbell::write(0, 0, 0, 1 << 20, i))
                    .and_then(|()| wa.progress())
                    .err()
            })
            .expect("writes to a closed peer fail");
        let text = err.to_string();
        assert!(text.contains("peer process 1"), "{text}");
        assert!(ra.finish().is_err());
    }
}
