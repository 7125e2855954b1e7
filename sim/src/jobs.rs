//! Per-job runtime facts the models need: where each of the job's ranks lives (GPU, NIC), its
//! lane (the VL its SL maps to, or the RoCE priority), QP depth, and its queue pairs, created
//! on first use and kept for the whole run (as NVSHMEM creates them once at initialisation).

use std::collections::BTreeMap;

use eptwin_engine::api::Rank;
use eptwin_engine::api::{JobKind, PeerPath, Plan};

use crate::core::slab::NONE;
use crate::core::{Core, ProgId};
use crate::gpu::PathKind;
use crate::net::nic::QpLabel;

/// Dense QP tables up to this many entries (n × n × qps); a sorted map beyond.
const DENSE_QP_TABLE: usize = 1 << 26;

#[derive(Debug, Clone)]
pub struct JobRt {
    pub id: u16,
    /// Global rank of each job rank.
    pub ranks: Vec<Rank>,
    pub gpu: Vec<u32>,
    /// Node index of each job rank (physical node / compute tray).
    pub node: Vec<u32>,
    pub lane: u8,
    pub depth: u32,
    /// DeepEP QPs (IBGDA: nothing waits on their completions), not background traffic.
    pub ibgda: bool,
    pub num_qps: u32,
    dense: Vec<u32>,
    sparse: BTreeMap<(u32, u32, u32), u32>,
}

impl JobRt {
    pub fn new(plan: &Plan, job: usize) -> JobRt {
        let j = &plan.jobs[job];
        let topo = &plan.topology;
        let n = j.ranks.len();
        // DeepEP QPs are IBGDA's (nothing waits on their completions); traffic QPs are not.
        let (ibgda, num_qps) = (matches!(j.kind, JobKind::DeepEp(_)), j.qps_per_peer());
        let entries = n * n * num_qps as usize;
        JobRt {
            id: job as u16,
            gpu: j.ranks.iter().map(|&r| topo.gpu_of(r).0).collect(),
            node: j.ranks.iter().map(|&r| topo.node_of_rank(r)).collect(),
            ranks: j.ranks.clone(),
            lane: j.lane.index(),
            depth: j.nvshmem.qp_depth,
            ibgda,
            num_qps,
            dense: if entries <= DENSE_QP_TABLE { vec![NONE; entries] } else { Vec::new() },
            sparse: BTreeMap::new(),
        }
    }

    /// The most QPs the job can create (every rank pair, every QP index).
    pub fn max_qps(&self) -> usize {
        self.ranks.len() * self.ranks.len() * self.num_qps as usize
    }

    pub fn n(&self) -> u32 {
        self.ranks.len() as u32
    }
}

impl Core {
    /// The QP `index` (wrapped modulo the job's QPs per peer, as NVSHMEM's lookup does) from job
    /// rank `src` to job rank `dst`, created on first use.
    pub fn job_qp(&mut self, job: usize, src: u32, dst: u32, index: u32, prog: ProgId) -> u32 {
        let jr = &self.jobs[job];
        let q = index % jr.num_qps;
        let n = jr.n();
        let found = if jr.dense.is_empty() {
            jr.sparse.get(&(src, dst, q)).copied().unwrap_or(NONE)
        } else {
            jr.dense[((src * n + dst) * jr.num_qps + q) as usize]
        };
        if found != NONE {
            return found;
        }
        let (nic, peer, lane, depth, check) =
            (jr.gpu[src as usize], jr.gpu[dst as usize], jr.lane, jr.depth, jr.ibgda);
        let label = QpLabel {
            job: job as u16,
            src_rank: jr.ranks[src as usize].0,
            dst_rank: jr.ranks[dst as usize].0,
            index: q as u16,
        };
        let id = self.create_qp(nic, peer, lane, depth, check, prog, label);
        let jr = &mut self.jobs[job];
        if jr.dense.is_empty() {
            jr.sparse.insert((src, dst, q), id);
        } else {
            jr.dense[((src * n + dst) * jr.num_qps + q) as usize] = id;
        }
        id
    }
}

/// The copy path between two GPUs for a hardware path.
pub fn path_kind(p: PeerPath) -> PathKind {
    match p {
        PeerPath::SameGpu => PathKind::Local,
        PeerPath::Nvlink => PathKind::Nvlink,
        PeerPath::Pcie | PeerPath::Rdma => PathKind::Pcie,
    }
}
