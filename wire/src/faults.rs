//! `packet_loss` and `nic_down` in the internode wire: [`FaultyWire`] wraps any [`Wire`] (TCP
//! or verbs) and does to the proxy's records what RC transport does to lost packets
//! (docs/design.md, faults §3; the simulator's `sim/src/net/nic/loss.rs` at packet level):
//!
//! * a lost record is held, with every later record of its QP behind it; the next record the
//!   QP posts reveals the gap (the responder's out-of-sequence NAK) and the requester sends
//!   them all again in order (go-back-N); a lost tail waits for the QP's local ACK timeout;
//! * while a NIC is down every record from or to its node is held; each local ACK timeout
//!   retries, and after `retry_count` retries with the NIC still down the QP fails
//!   (`IBV_WC_RETRY_EXC_ERR`): the proxy stops with the fault named, and the kernels that
//!   wait for the lost records time out with that cause.
//!
//! The hardware has one port per node (one TCP listener, or one verbs device), so a
//! `nic_down` of any NIC of a node takes that port down. Draws come from the scenario's seed
//! per (node, QP, record of that QP), so the same records are lost in every run; a record
//! sent again is not lost again.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use eptwin_engine::api::{Fault, Plan, mix};

use crate::doorbell::{Doorbell, DoorbellKind};
use crate::error::WireError;
use crate::link::{ProxyStats, Wire, WireKind};
use crate::rdma::QpSettings;

/// One `nic_down` fault as the wire sees it.
#[derive(Debug, Clone, PartialEq)]
struct NicDown {
    fault: usize,
    node: u32,
    nic: u32,
    at: Duration,
    until: Option<Duration>,
}

/// The wire's faults of a plan, with the QPs' recovery settings.
#[derive(Debug, Clone, PartialEq)]
pub struct WireFaults {
    loss_rate: f64,
    seed: u64,
    nics_down: Vec<NicDown>,
    /// The QPs' local ACK timeout (4.096 µs × 2^`ack_timeout`) and retries.
    ack_timeout: Duration,
    retry_count: u8,
}

impl WireFaults {
    /// `None` when the plan has no fault the wire injects.
    pub fn new(plan: &Plan, qp: &QpSettings) -> Option<WireFaults> {
        let ns = Duration::from_nanos;
        let nics_down: Vec<NicDown> = plan
            .faults
            .items
            .iter()
            .enumerate()
            .filter_map(|(fault, f)| match *f {
                Fault::NicDown { node, nic, at_ns, duration_ns } => Some(NicDown {
                    fault,
                    node,
                    nic,
                    at: ns(at_ns),
                    until: duration_ns.map(|d| ns(at_ns.saturating_add(d))),
                }),
                _ => None,
            })
            .collect();
        let loss_rate = plan.faults.loss_rate();
        if loss_rate == 0.0 && nics_down.is_empty() {
            return None;
        }
        Some(WireFaults {
            loss_rate,
            seed: plan.faults.seed,
            nics_down,
            ack_timeout: ns(4_096 << qp.ack_timeout.min(31)),
            retry_count: qp.retry_count,
        })
    }

    /// Whether record `seq` of QP `qp` of `node`'s proxy is lost.
    fn lost(&self, node: u32, qp: usize, seq: u32) -> bool {
        if self.loss_rate == 0.0 {
            return false;
        }
        let salt = self.seed ^ self.seed >> 32;
        let h = mix(node ^ salt as u32, qp as u32 ^ (salt >> 32) as u32, seq);
        ((h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)) < self.loss_rate
    }

    /// The `nic_down` that cuts `a` or `b` off at `t`.
    fn down(&self, a: u32, b: u32, t: Duration) -> Option<&NicDown> {
        self.nics_down
            .iter()
            .find(|d| (d.node == a || d.node == b) && t >= d.at && d.until.is_none_or(|u| t < u))
    }
}

/// What the faults did to one proxy's records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub lost: u64,
    pub resent: u64,
    pub timeouts: u64,
}

/// A wire whose records meet the plan's `packet_loss` and `nic_down` (see the module).
pub struct FaultyWire<W> {
    inner: W,
    faults: Option<WireFaults>,
    /// The node whose proxy this is.
    node: u32,
    started: Instant,
    /// Per QP: records posted so far, records held (oldest first), since when the oldest is
    /// held, and the local ACK timeouts it has seen.
    seq: Vec<u32>,
    held: Vec<VecDeque<(DoorbellKind, Doorbell)>>,
    since: Vec<Duration>,
    retries: Vec<u8>,
    pub stats: FaultStats,
}

// Real time: fault windows, ACK timeouts and the drain's bound are wall-clock on the hardware.
#[allow(clippy::disallowed_methods)]
impl<W: Wire> FaultyWire<W> {
    /// `inner` as is when `faults` is `None`.
    pub fn new(inner: W, faults: Option<WireFaults>, node: u32) -> Self {
        let n = inner.qp_count();
        FaultyWire {
            inner,
            faults,
            node,
            started: Instant::now(),
            seq: vec![0; n],
            held: vec![VecDeque::new(); n],
            since: vec![Duration::ZERO; n],
            retries: vec![0; n],
            stats: FaultStats::default(),
        }
    }

    pub fn into_inner(self) -> W {
        self.inner
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Send every held record of `qp` again, in order.
    fn resend(&mut self, qp: usize) -> Result<(), WireError> {
        while let Some((kind, rec)) = self.held[qp].pop_front() {
            self.inner.post(qp, kind, &rec)?;
            self.stats.resent += 1;
        }
        self.retries[qp] = 0;
        Ok(())
    }

    /// `qp`'s oldest held record met a local ACK timeout at `t`: retry, or fail the QP.
    fn ack_timeout(
        &mut self,
        faults: &WireFaults,
        qp: usize,
        t: Duration,
    ) -> Result<(), WireError> {
        self.stats.timeouts += 1;
        let peer = self.inner.peer_of(qp);
        let Some(d) = faults.down(self.node, peer, t) else {
            return self.resend(qp);
        };
        if self.retries[qp] < faults.retry_count {
            self.retries[qp] += 1;
            self.since[qp] = t;
            return Ok(());
        }
        let forever = d
            .until
            .map_or("for good".to_string(), |u| format!("until t = {:.6} s", u.as_secs_f64()));
        Err(WireError::Proxy {
            proxy: self.node as usize,
            reason: format!(
                "fault[{}] nic_down: NIC {} of node {} down from t = {:.6} s {forever}: QP {qp} \
                 to node {peer} failed with IBV_WC_RETRY_EXC_ERR (transport retry counter \
                 exceeded: retry_cnt {} retries of the {:.1} ms local ACK timeout) at t = \
                 {:.6} s; {} record(s) of it never arrive",
                d.fault,
                d.nic,
                d.node,
                d.at.as_secs_f64(),
                faults.retry_count,
                faults.ack_timeout.as_secs_f64() * 1e3,
                t.as_secs_f64(),
                self.held[qp].len()
            ),
        })
    }
}

#[allow(clippy::disallowed_methods)] // real time: the drain's bound
impl<W: Wire> Wire for FaultyWire<W> {
    fn kind(&self) -> WireKind {
        self.inner.kind()
    }
    fn qp_count(&self) -> usize {
        self.inner.qp_count()
    }
    fn peer_of(&self, qp: usize) -> u32 {
        self.inner.peer_of(qp)
    }
    fn send_len(&self) -> u64 {
        self.inner.send_len()
    }
    fn remote_len(&self, qp: usize) -> u64 {
        self.inner.remote_len(qp)
    }
    fn reserve(
        &mut self,
        qp: usize,
        timeout: Duration,
        stats: &mut ProxyStats,
    ) -> Result<(), WireError> {
        self.inner.reserve(qp, timeout, stats)
    }

    fn post(&mut self, qp: usize, kind: DoorbellKind, rec: &Doorbell) -> Result<(), WireError> {
        let Some(faults) = &self.faults else { return self.inner.post(qp, kind, rec) };
        let t = self.now();
        let seq = self.seq[qp];
        self.seq[qp] = seq.wrapping_add(1);
        let cut = faults.down(self.node, self.inner.peer_of(qp), t).is_some();
        let lost = !cut && faults.lost(self.node, qp, seq);
        if self.held[qp].is_empty() && !cut && !lost {
            return self.inner.post(qp, kind, rec);
        }
        self.stats.lost += lost as u64;
        if self.held[qp].is_empty() {
            self.since[qp] = t;
        }
        self.held[qp].push_back((kind, *rec));
        // A record behind a lost one reaches the responder: its out-of-sequence NAK makes the
        // requester go back to the lost record (go-back-N).
        if !cut && !lost {
            self.resend(qp)?;
        }
        Ok(())
    }

    fn progress(&mut self) -> Result<bool, WireError> {
        let mut worked = false;
        if let Some(faults) = self.faults.take() {
            let t = self.now();
            let mut result = Ok(());
            for qp in 0..self.held.len() {
                if !self.held[qp].is_empty() && t >= self.since[qp] + faults.ack_timeout {
                    worked = true;
                    result = self.ack_timeout(&faults, qp, t);
                    if result.is_err() {
                        break;
                    }
                }
            }
            self.faults = Some(faults);
            result?;
        }
        Ok(self.inner.progress()? || worked)
    }

    fn outstanding(&self, qp: usize) -> u32 {
        self.inner.outstanding(qp) + self.held[qp].len() as u32
    }

    fn drain(&mut self, timeout: Duration) -> Result<(), WireError> {
        // What is still held goes out once its link is up again, within the drain's bound.
        let end = Instant::now() + timeout;
        while self.held.iter().any(|h| !h.is_empty()) && Instant::now() < end {
            self.progress()?;
            std::thread::sleep(Duration::from_millis(1));
        }
        self.inner.drain(end.saturating_duration_since(Instant::now()))
    }
}

#[cfg(test)]
mod tests;
