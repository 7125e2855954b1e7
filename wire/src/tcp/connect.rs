//! Connecting the TCP wire: each process dials the lower-numbered peers and accepts the
//! higher-numbered ones, with a hello naming both.

use std::io::{self, BufWriter, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use super::receive::{LinkState, TcpReceivers, receive_loop};
use super::send::{SendLink, TcpWire};
use super::*;
use crate::error::WireError;
use crate::region::Region;

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
    pub fn bind(local: u32, bind: SocketAddr, recv: Arc<Region>) -> Result<TcpSetup, WireError> {
        let io = |what: &str, e: io::Error| {
            WireError::Link(LinkFault {
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
    ) -> Result<(TcpWire, TcpReceivers), WireError> {
        let local = self.local;
        if let Some(p) = peers.iter().find(|p| p.process == local) {
            return Err(WireError::Endpoint(format!(
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
                .spawn(move || receive_loop(local, &peer_for_thread, stream, &recv, &state))
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

fn remaining(start: std::time::Instant, limit: Duration) -> Option<Duration> {
    limit.checked_sub(start.elapsed()).filter(|d| !d.is_zero())
}

/// Dial `peer` (retrying while it refuses) and exchange hellos.
fn dial(
    local: u32,
    peer: &TcpEndpoint,
    start: std::time::Instant,
    limit: Duration,
) -> Result<TcpStream, WireError> {
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
) -> Result<(), WireError> {
    let listen_fault = |e: io::Error| {
        WireError::Link(LinkFault {
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
