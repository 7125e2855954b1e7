//! This side of the TCP wire: frames written to each peer's connection by the proxy.

use std::io::{self, BufWriter, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::doorbell::{Doorbell, DoorbellKind};
use crate::error::{LinkFault, WireError};
use crate::link::{DataPath, ProxyStats, Wire, WireKind, WireReport};
use crate::region::Region;

pub(super) fn frame_header(kind: u32, rec: &Doorbell) -> [u8; FRAME_HEADER_BYTES] {
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

pub(super) struct SendLink {
    pub(super) peer: u32,
    pub(super) addr: String,
    pub(super) remote_len: u64,
    pub(super) stream: BufWriter<TcpStream>,
}

/// The sending side of the TCP wire, driven by a [`super::Proxy`]. QP `q` reaches peer slot
/// `q / qps_per_process`.
pub struct TcpWire {
    pub(super) local: u32,
    pub(super) links: Vec<SendLink>,
    pub(super) qps_per_process: u32,
    pub(super) send: Arc<Region>,
    pub(super) scratch: Vec<u8>,
    pub(super) write_timeout: Duration,
    pub(super) closed: bool,
}

impl TcpWire {
    fn slot(&self, qp: usize) -> usize {
        qp / self.qps_per_process as usize
    }

    fn write_fault(&self, slot: usize, rec: Option<&Doorbell>, e: &io::Error) -> WireError {
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
        WireError::Link(LinkFault {
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
    pub fn close(mut self) -> Result<(), WireError> {
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

    fn reserve(&mut self, _: usize, _: Duration, _: &mut ProxyStats) -> Result<(), WireError> {
        // Back-pressure is the socket's: a full send buffer blocks the write (bounded by the
        // write timeout).
        Ok(())
    }

    fn post(&mut self, qp: usize, kind: DoorbellKind, rec: &Doorbell) -> Result<(), WireError> {
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

    fn progress(&mut self) -> Result<bool, WireError> {
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

    fn drain(&mut self, _: Duration) -> Result<(), WireError> {
        self.progress().map(|_| ())
    }
}
