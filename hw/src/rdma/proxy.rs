//! The CPU-proxy transfer engine (how UCCL-EP and pplx move data when GPU-initiated RDMA is not
//! available): producers stage tokens in a registered send region and push doorbell records;
//! a proxy thread turns each record into a verbs work request on the QP the record names, in
//! the order the records were published. A flag record becomes a fetch-and-add on the same QP
//! as the data it follows, so RC ordering makes the flag visible only after the data.
//!
//! The proxy never exceeds a QP's depth: when a QP is full it polls that QP's completions
//! until a slot frees (counted in `ProxyStats::depth_stalls`), bounded by `stall_timeout`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::doorbell::{DoorbellConsumer, DoorbellKind, backoff};
use super::endpoint::RemoteRegion;
use super::error::{RdmaError, Site};
use super::verbs::{HostRegion, Qp};

/// What one proxy thread drives.
pub struct ProxySpec {
    /// The proxy's QPs (peers × `num_qps_per_rank`); a doorbell's `qp` indexes this table.
    pub qps: Vec<Qp>,
    /// For each QP, the peer region its writes and flags land in.
    pub remote: Vec<RemoteRegion>,
    /// The registered region producers stage outgoing tokens in (`src_offset` is into it).
    pub src: Arc<HostRegion>,
    /// The doorbell queues this proxy serves, round-robin.
    pub queues: Vec<DoorbellConsumer>,
    /// Longest wait for a QP slot or for the final drain before giving up with an error.
    pub stall_timeout: Duration,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyStats {
    pub writes: u64,
    pub write_bytes: u64,
    pub flags: u64,
    /// Times a record had to wait because its QP had `depth` requests in flight.
    pub depth_stalls: u64,
    /// Most requests in flight on any one QP (never above its depth).
    pub max_outstanding: u32,
}

/// A running proxy thread.
pub struct Proxy {
    id: usize,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<(ProxyStats, Vec<Qp>), RdmaError>>,
}

/// Records taken from one queue before moving to the next (fairness between producers).
const BATCH: usize = 32;

impl Proxy {
    pub fn spawn(id: usize, spec: ProxySpec) -> Result<Proxy, RdmaError> {
        if spec.qps.len() != spec.remote.len() || spec.qps.is_empty() {
            return Err(RdmaError::Proxy {
                proxy: id,
                reason: format!("{} QPs but {} remote regions", spec.qps.len(), spec.remote.len()),
            });
        }
        // Fetch-and-add returns the old value into local memory; one 8-byte slot per QP.
        let scratch = spec.qps[0].nic().register_host(8 * spec.qps.len())?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_seen = stop.clone();
        let handle = std::thread::Builder::new()
            .name(format!("eptwin-rdma-proxy-{id}"))
            .spawn(move || run(id, spec, scratch, &stop_seen))
            .map_err(|e| RdmaError::Proxy {
                proxy: id,
                reason: format!("cannot start thread: {e}"),
            })?;
        Ok(Proxy { id, stop, handle })
    }

    /// Let the proxy drain every published record and every in-flight request, then stop;
    /// returns its statistics and QPs, or the first error it met.
    pub fn finish(self) -> Result<(ProxyStats, Vec<Qp>), RdmaError> {
        self.stop.store(true, Ordering::Release);
        self.handle.join().map_err(|_| RdmaError::Proxy {
            proxy: self.id,
            reason: "proxy thread panicked".into(),
        })?
    }
}

fn run(
    id: usize,
    mut spec: ProxySpec,
    scratch: Arc<HostRegion>,
    stop: &AtomicBool,
) -> Result<(ProxyStats, Vec<Qp>), RdmaError> {
    let mut stats = ProxyStats::default();
    let result = serve(id, &mut spec, &scratch, stop, &mut stats);
    // Closing the queues releases producers waiting for a slot, on success and on failure.
    for q in &spec.queues {
        q.close();
    }
    result.map(|()| (stats, spec.qps))
}

fn serve(
    id: usize,
    spec: &mut ProxySpec,
    scratch: &Arc<HostRegion>,
    stop: &AtomicBool,
    stats: &mut ProxyStats,
) -> Result<(), RdmaError> {
    let mut idle = 0;
    loop {
        let mut worked = false;
        for qi in 0..spec.queues.len() {
            for _ in 0..BATCH {
                let Some(rec) = spec.queues[qi].try_pop() else { break };
                worked = true;
                let q = rec.qp as usize;
                if q >= spec.qps.len() {
                    return Err(RdmaError::Proxy {
                        proxy: id,
                        reason: format!(
                            "doorbell {} names QP index {q}; the proxy has {}",
                            rec.tag,
                            spec.qps.len()
                        ),
                    });
                }
                let kind = DoorbellKind::from_raw(rec.kind).ok_or_else(|| RdmaError::Proxy {
                    proxy: id,
                    reason: format!("doorbell {} has unknown kind {}", rec.tag, rec.kind),
                })?;
                wait_for_slot(&mut spec.qps[q], spec.stall_timeout, stats)?;
                let qp = &mut spec.qps[q];
                let dst = &spec.remote[q];
                match kind {
                    DoorbellKind::Write => {
                        qp.post_write(
                            rec.tag,
                            &spec.src,
                            rec.src_offset,
                            rec.len_bytes,
                            dst,
                            rec.dst_offset,
                            false,
                        )?;
                        stats.writes += 1;
                        stats.write_bytes += rec.len_bytes as u64;
                    }
                    DoorbellKind::WriteWithImm => {
                        qp.post_write_imm(
                            rec.tag,
                            &spec.src,
                            rec.src_offset,
                            rec.len_bytes,
                            dst,
                            rec.dst_offset,
                            rec.imm,
                            false,
                        )?;
                        stats.writes += 1;
                        stats.write_bytes += rec.len_bytes as u64;
                    }
                    DoorbellKind::Flag => {
                        qp.post_fetch_add(
                            rec.tag,
                            scratch,
                            8 * q as u64,
                            dst,
                            rec.dst_offset,
                            rec.add,
                            true,
                        )?;
                        stats.flags += 1;
                    }
                }
                stats.max_outstanding = stats.max_outstanding.max(qp.outstanding());
            }
        }
        for qp in spec.qps.iter_mut().filter(|qp| qp.outstanding() > 0) {
            if qp.poll()? > 0 {
                worked = true;
            }
        }
        if !worked {
            if stop.load(Ordering::Acquire) && spec.queues.iter().all(|q| q.pending() == 0) {
                for qp in &mut spec.qps {
                    qp.wait_idle(spec.stall_timeout)?;
                }
                return Ok(());
            }
            backoff(&mut idle);
        } else {
            idle = 0;
        }
    }
}

/// Poll `qp` until it has room for one more request.
fn wait_for_slot(qp: &mut Qp, timeout: Duration, stats: &mut ProxyStats) -> Result<(), RdmaError> {
    if qp.outstanding() < qp.depth() {
        return Ok(());
    }
    stats.depth_stalls += 1;
    #[allow(clippy::disallowed_methods)] // real time: a hardware wait bound
    let start = std::time::Instant::now();
    let mut round = 0;
    while qp.outstanding() >= qp.depth() {
        if qp.poll()? == 0 {
            if start.elapsed() > timeout {
                let site: Site = qp.site().clone();
                return Err(RdmaError::Timeout {
                    site,
                    what: format!(
                        "a free slot ({} of depth {} in flight)",
                        qp.outstanding(),
                        qp.depth()
                    ),
                    waited_ms: start.elapsed().as_millis() as u64,
                });
            }
            backoff(&mut round);
        }
    }
    Ok(())
}
