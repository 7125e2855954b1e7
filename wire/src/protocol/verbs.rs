//! A process's QP table over verbs: create every RC QP with the job's `QpSettings`, hand each
//! peer the endpoints of the QPs towards it (a [`PeerInfo`], bytes for any out-of-band
//! channel), and connect each QP to its mirror at the peer once their infos arrived.

use std::sync::Arc;

use super::geometry::QpTable;
use crate::error::WireError;
use crate::rdma::{HostRegion, LocalMemory, Nic, PeerInfo, PreparedQp, QpSettings, VerbsWire};

/// This process's QPs for `table`, created but not connected, and its registered receive
/// region.
pub struct PreparedTable {
    table: QpTable,
    qps: Vec<PreparedQp>,
    recv: Arc<HostRegion>,
}

impl PreparedTable {
    /// One RC QP per table entry, each with `settings` (SL, traffic class, depth, MTU).
    pub fn create(
        nic: &Nic,
        settings: &QpSettings,
        table: QpTable,
        recv: Arc<HostRegion>,
    ) -> Result<PreparedTable, WireError> {
        if settings.qps_per_peer != table.qps_per_peer {
            return Err(WireError::Geometry(format!(
                "the QP settings ask for {} QPs per peer, the table has {}",
                settings.qps_per_peer, table.qps_per_peer
            )));
        }
        let qps = (0..table.len()).map(|_| nic.create_qp(settings)).collect::<Result<_, _>>()?;
        Ok(PreparedTable { table, qps, recv })
    }

    pub fn table(&self) -> &QpTable {
        &self.table
    }

    /// What `peer_node` needs from this process: the endpoints of the QPs towards it, in
    /// table order, and the receive region.
    pub fn info_for(&self, peer_node: u32) -> PeerInfo {
        let per = self.table.per_process() as usize;
        let first = self.table.index(peer_node, 0, 0, 0) as usize;
        PeerInfo {
            qps: self.qps[first..first + per].iter().map(PreparedQp::endpoint).collect(),
            regions: vec![self.recv.remote()],
        }
    }

    /// Connect every QP to its mirror at its peer. `infos[i]` is what peer node `nodes[i]`
    /// sent this process ([`PreparedTable::info_for`] at its end).
    pub fn connect<M: LocalMemory + 'static>(
        self,
        infos: &[(u32, PeerInfo)],
        send: Arc<M>,
    ) -> Result<VerbsWire<M>, WireError> {
        let per = self.table.per_process();
        let peers = self.table.peers();
        let mut remote = Vec::with_capacity(self.qps.len());
        let mut connected = Vec::with_capacity(self.qps.len());
        for (i, qp) in self.qps.into_iter().enumerate() {
            let node = peers[i];
            let info =
                infos.iter().find(|(n, _)| *n == node).map(|(_, info)| info).ok_or_else(|| {
                    WireError::Endpoint(format!("no QP endpoints from node {node}"))
                })?;
            if info.qps.len() != per as usize || info.regions.is_empty() {
                return Err(WireError::Endpoint(format!(
                    "node {node} sent {} QP endpoints and {} regions; the table needs {per} and 1",
                    info.qps.len(),
                    info.regions.len()
                )));
            }
            let within = i as u32 % per;
            connected.push(qp.connect(&info.qps[self.table.mirror(within) as usize])?);
            remote.push(info.regions[0]);
        }
        VerbsWire::new(connected, remote, peers, send)
    }
}
