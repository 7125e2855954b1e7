//! The CPU-proxy transfer engine (how UCCL-EP and pplx move data when GPU-initiated RDMA is not
//! available), generic over the [`Wire`] that carries the bytes: producers stage tokens in the
//! send region and push doorbell records; a proxy thread checks each record against the send
//! region and the peer's receive region, then hands it to the wire on the QP it names, in the
//! order the records were published. A flag record goes on the same QP as the data it
//! follows, and every wire applies a QP's records in order, so a flag is visible only after
//! the data.
//!
//! A record that names no QP, an unknown kind, a range outside either region, or a misaligned
//! flag stops the proxy with [`WireError::Doorbell`] naming the proxy, the peer, the QP, the
//! tag and the offset; nothing of it reaches the wire. Closing the doorbell queues on the way
//! out releases producers waiting for a slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::doorbell::{Doorbell, DoorbellConsumer, DoorbellKind, backoff};
use crate::error::WireError;
use crate::link::{ProxyStats, Wire};

/// What one proxy thread drives.
pub struct ProxySpec<W> {
    /// The wire; a doorbell's `qp` indexes its QP table.
    pub wire: W,
    /// The doorbell queues this proxy serves, round-robin.
    pub queues: Vec<DoorbellConsumer>,
    /// Longest wait for a QP slot, or for the final drain, before giving up with an error.
    pub stall_timeout: Duration,
}

/// A running proxy thread.
pub struct Proxy<W> {
    id: usize,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<(ProxyStats, W), WireError>>,
}

/// Records taken from one queue before moving to the next (fairness between producers).
const BATCH: usize = 32;

impl<W: Wire> Proxy<W> {
    pub fn spawn(id: usize, spec: ProxySpec<W>) -> Result<Proxy<W>, WireError> {
        if spec.wire.qp_count() == 0 {
            return Err(WireError::Proxy { proxy: id, reason: "the wire has no QPs".into() });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stop_seen = stop.clone();
        let handle = std::thread::Builder::new()
            .name(format!("eptwin-proxy-{id}"))
            .spawn(move || run(id, spec, &stop_seen))
            .map_err(|e| WireError::Proxy {
                proxy: id,
                reason: format!("cannot start thread: {e}"),
            })?;
        Ok(Proxy { id, stop, handle })
    }

    pub fn id(&self) -> usize {
        self.id
    }

    /// Whether the thread has ended (finished its drain, or failed).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Let the proxy hand every published record to the wire and drain it, then stop; returns
    /// its statistics and the wire, or the first error it met.
    pub fn finish(self) -> Result<(ProxyStats, W), WireError> {
        self.stop.store(true, Ordering::Release);
        self.handle.join().map_err(|_| WireError::Proxy {
            proxy: self.id,
            reason: "proxy thread panicked".into(),
        })?
    }
}

fn run<W: Wire>(
    id: usize,
    mut spec: ProxySpec<W>,
    stop: &AtomicBool,
) -> Result<(ProxyStats, W), WireError> {
    let mut stats = ProxyStats::default();
    let result = serve(id, &mut spec, stop, &mut stats);
    // Closing the queues releases producers waiting for a slot, on success and on failure.
    for q in &spec.queues {
        q.close();
    }
    result.map(|()| (stats, spec.wire))
}

/// The record's kind, or why it cannot go on the wire, with its coordinates.
pub(crate) fn check<W: Wire>(
    id: usize,
    wire: &W,
    rec: &Doorbell,
) -> Result<DoorbellKind, WireError> {
    let qp = rec.qp as usize;
    let refuse = |peer: Option<u32>, offset: u64, reason: String| WireError::Doorbell {
        proxy: id,
        qp: rec.qp,
        peer,
        tag: rec.tag,
        kind: rec.kind,
        offset,
        reason,
    };
    if qp >= wire.qp_count() {
        return Err(refuse(
            None,
            rec.dst_offset,
            format!("QP index {qp} does not exist; the proxy has {} QPs", wire.qp_count()),
        ));
    }
    let peer = Some(wire.peer_of(qp));
    let kind = DoorbellKind::from_raw(rec.kind)
        .ok_or_else(|| refuse(peer, rec.dst_offset, format!("unknown kind {}", rec.kind)))?;
    let remote_bytes = wire.remote_len(qp);
    match kind {
        DoorbellKind::Write | DoorbellKind::WriteWithImm => {
            let len = rec.len_bytes as u64;
            let send_bytes = wire.send_len();
            if rec.src_offset.checked_add(len).is_none_or(|end| end > send_bytes) {
                return Err(refuse(
                    peer,
                    rec.src_offset,
                    format!(
                        "source range {}+{len} outside the {send_bytes}-byte send region",
                        rec.src_offset
                    ),
                ));
            }
            if rec.dst_offset.checked_add(len).is_none_or(|end| end > remote_bytes) {
                return Err(refuse(
                    peer,
                    rec.dst_offset,
                    format!(
                        "destination range {}+{len} outside the peer's {remote_bytes}-byte \
                         receive region",
                        rec.dst_offset
                    ),
                ));
            }
        }
        DoorbellKind::Flag => {
            if !rec.dst_offset.is_multiple_of(8) {
                return Err(refuse(
                    peer,
                    rec.dst_offset,
                    format!("flag counter at offset {} is not 8-byte aligned", rec.dst_offset),
                ));
            }
            if rec.dst_offset.checked_add(8).is_none_or(|end| end > remote_bytes) {
                return Err(refuse(
                    peer,
                    rec.dst_offset,
                    format!(
                        "flag counter {}+8 outside the peer's {remote_bytes}-byte receive region",
                        rec.dst_offset
                    ),
                ));
            }
        }
    }
    Ok(kind)
}

fn serve<W: Wire>(
    id: usize,
    spec: &mut ProxySpec<W>,
    stop: &AtomicBool,
    stats: &mut ProxyStats,
) -> Result<(), WireError> {
    let mut idle = 0;
    loop {
        let mut worked = false;
        for qi in 0..spec.queues.len() {
            for _ in 0..BATCH {
                let Some(rec) = spec.queues[qi].try_pop() else { break };
                worked = true;
                let kind = check(id, &spec.wire, &rec)?;
                let qp = rec.qp as usize;
                spec.wire.reserve(qp, spec.stall_timeout, stats)?;
                spec.wire.post(qp, kind, &rec)?;
                match kind {
                    DoorbellKind::Write | DoorbellKind::WriteWithImm => {
                        stats.writes += 1;
                        stats.write_bytes += rec.len_bytes as u64;
                    }
                    DoorbellKind::Flag => stats.flags += 1,
                }
                stats.max_outstanding = stats.max_outstanding.max(spec.wire.outstanding(qp));
            }
        }
        if spec.wire.progress()? {
            worked = true;
        }
        if !worked {
            if stop.load(Ordering::Acquire) && spec.queues.iter().all(|q| q.pending() == 0) {
                return spec.wire.drain(spec.stall_timeout);
            }
            backoff(&mut idle);
        } else {
            idle = 0;
        }
    }
}
