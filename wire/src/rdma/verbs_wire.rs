//! The verbs wire: the proxy's records as work requests on RC QPs. A `Write` becomes an RDMA
//! WRITE from the send registration, a `Flag` a fetch-and-add on the same QP (RC executes a
//! QP's requests in order, so the counter moves only after the writes before it have landed).
//! At most `NVSHMEM_QP_DEPTH` requests are in flight per QP: a full QP is polled until a slot
//! frees (`ProxyStats::depth_stalls`), bounded by the proxy's stall timeout.

use std::sync::Arc;
use std::time::Duration;

use super::endpoint::RemoteRegion;
use super::verbs::{HostRegion, LocalMemory, Qp};
use crate::doorbell::{Doorbell, DoorbellKind};
use crate::error::{Site, WireError};
use crate::link::{ProxyStats, Wire, WireKind, WireReport};

/// RC QPs to the peers, the peers' receive regions, and the local send registration (host
/// staging, or GPU memory for GPUDirect RDMA).
pub struct VerbsWire<M: LocalMemory + 'static = HostRegion> {
    qps: Vec<Qp>,
    remote: Vec<RemoteRegion>,
    peers: Vec<u32>,
    send: Arc<M>,
    /// Fetch-and-add returns the old value into local memory: one 8-byte word per QP.
    scratch: Arc<HostRegion>,
}

impl<M: LocalMemory + 'static> VerbsWire<M> {
    /// QP `i` writes into `remote[i]` at peer process `peers[i]`, reading from `send`.
    pub fn new(
        qps: Vec<Qp>,
        remote: Vec<RemoteRegion>,
        peers: Vec<u32>,
        send: Arc<M>,
    ) -> Result<Self, WireError> {
        if qps.len() != remote.len() || qps.len() != peers.len() || qps.is_empty() {
            return Err(WireError::Invalid {
                site: qps.first().map_or(Site::port("?", 0), |q| q.site().clone()),
                what: "verbs wire",
                reason: format!(
                    "{} QPs, {} remote regions and {} peer numbers (one each, at least one)",
                    qps.len(),
                    remote.len(),
                    peers.len()
                ),
            });
        }
        let scratch = qps[0].nic().register_host(8 * qps.len())?;
        Ok(VerbsWire { qps, remote, peers, send, scratch })
    }

    pub fn qps(&self) -> &[Qp] {
        &self.qps
    }

    pub fn into_qps(self) -> Vec<Qp> {
        self.qps
    }

    /// What ran, read back from the device (`ibv_query_qp` on QP 0: SL, traffic class, path
    /// MTU; the depth is the one enforced) for the result document.
    pub fn report(&self, reason: &str, qps_per_peer: u32) -> Result<WireReport, WireError> {
        let qp = &self.qps[0];
        let attr = qp.query()?;
        let nic = qp.nic();
        let mut peers = self.peers.clone();
        peers.sort_unstable();
        peers.dedup();
        Ok(WireReport {
            wire: WireKind::Verbs,
            data_path: self.send.data_path(),
            reason: reason.to_string(),
            peers: peers.len() as u32,
            qps_per_peer,
            qps_total: self.qps.len() as u32,
            sl: Some(attr.sl),
            traffic_class: Some(attr.traffic_class),
            qp_depth: Some(qp.depth()),
            mtu_bytes: Some(attr.path_mtu_bytes),
            device: Some(format!("{} port {}", nic.device().name, nic.port().port)),
            link_layer: Some(nic.port().link_layer.to_string()),
        })
    }
}

impl<M: LocalMemory + 'static> Wire for VerbsWire<M> {
    fn kind(&self) -> WireKind {
        WireKind::Verbs
    }

    fn qp_count(&self) -> usize {
        self.qps.len()
    }

    fn peer_of(&self, qp: usize) -> u32 {
        self.peers[qp]
    }

    fn send_len(&self) -> u64 {
        self.send.len_bytes()
    }

    fn remote_len(&self, qp: usize) -> u64 {
        self.remote[qp].len_bytes
    }

    fn reserve(
        &mut self,
        qp: usize,
        timeout: Duration,
        stats: &mut ProxyStats,
    ) -> Result<(), WireError> {
        let qp = &mut self.qps[qp];
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
                    return Err(WireError::Timeout {
                        site: qp.site().clone(),
                        what: format!(
                            "a free slot ({} of depth {} in flight)",
                            qp.outstanding(),
                            qp.depth()
                        ),
                        waited_ms: start.elapsed().as_millis() as u64,
                    });
                }
                crate::doorbell::backoff(&mut round);
            }
        }
        Ok(())
    }

    fn post(&mut self, q: usize, kind: DoorbellKind, rec: &Doorbell) -> Result<(), WireError> {
        let qp = &mut self.qps[q];
        let dst = &self.remote[q];
        match kind {
            DoorbellKind::Write => qp.post_write(
                rec.tag,
                &self.send,
                rec.src_offset,
                rec.len_bytes,
                dst,
                rec.dst_offset,
                false,
            ),
            DoorbellKind::WriteWithImm => qp.post_write_imm(
                rec.tag,
                &self.send,
                rec.src_offset,
                rec.len_bytes,
                dst,
                rec.dst_offset,
                rec.imm,
                false,
            ),
            DoorbellKind::Flag => qp.post_fetch_add(
                rec.tag,
                &self.scratch,
                8 * q as u64,
                dst,
                rec.dst_offset,
                rec.add,
                true,
            ),
        }
    }

    fn progress(&mut self) -> Result<bool, WireError> {
        let mut worked = false;
        for qp in self.qps.iter_mut().filter(|qp| qp.outstanding() > 0) {
            if qp.poll()? > 0 {
                worked = true;
            }
        }
        Ok(worked)
    }

    fn outstanding(&self, qp: usize) -> u32 {
        self.qps[qp].outstanding()
    }

    fn drain(&mut self, timeout: Duration) -> Result<(), WireError> {
        for qp in &mut self.qps {
            qp.wait_idle(timeout)?;
        }
        Ok(())
    }
}
