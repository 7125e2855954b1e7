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

mod connect;
mod receive;
mod send;

pub use connect::TcpSetup;
pub use receive::{Immediate, ReceiverStats, TcpReceivers};
pub use send::TcpWire;

use std::net::SocketAddr;
use std::time::Duration;

use crate::error::{LinkFault, WireError};
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

    pub fn from_bytes(bytes: &[u8]) -> Result<TcpEndpoint, WireError> {
        let bad = |why: String| WireError::Endpoint(format!("TCP endpoint: {why}"));
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

fn link_fault(local: u32, peer: &TcpEndpoint, reason: String) -> WireError {
    WireError::Link(LinkFault {
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;

    use super::send::frame_header;
    use super::*;
    use crate::doorbell::{Doorbell, DoorbellKind, doorbell_queue};
    use crate::link::Wire;
    use crate::proxy::{Proxy, ProxySpec};
    use crate::region::Region;

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
            let e = crate::proxy::check(0, &wa, &rec).unwrap_err().to_string();
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
