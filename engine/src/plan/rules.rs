//! The DeepEP rules both backends follow, written once: which path a low-latency message takes
//! between two ranks (NVSHMEM's P2P reachability under `NVSHMEM_DISABLE_P2P` and
//! `NVSHMEM_DISABLE_MNNVL`), how the normal kernels split a rank's tokens into channels, and
//! how many QPs join two ranks. The simulator models these and the hardware backend runs them;
//! both read them here, through `crate::plan`, whose child this module is.

use crate::ids::JobId;
use crate::plan::{JobKind, JobPlan, Plan};
use crate::topology::PeerPath;

/// Tokens `[start, end)` of channel `c` when `tokens` are split into `channels` contiguous
/// ranges of `ceil(tokens / channels)`, as DeepEP's normal kernels split them
/// (`get_channel_task_range`). Channels past the last token get empty ranges.
#[inline]
pub fn channel_range(tokens: u32, channels: u32, c: u32) -> (u32, u32) {
    let per = tokens.div_ceil(channels);
    let start = (c * per).min(tokens);
    (start, (start + per).min(tokens))
}

impl Plan {
    /// The path NVSHMEM gives a low-latency kernel from job rank `src` to job rank `dst` of
    /// `job` (docs/design.md, DeepEP §11, §12, §15): a rank reaches itself by pointer; a peer
    /// NVSHMEM maps (P2P allowed; on another node only with MNNVL allowed) by stores over the
    /// hardware path between their GPUs; every other peer through RDMA (`get_p2p_ptr` returns
    /// 0). `PeerPath::SameGpu` is a device-local copy (the rank itself, or a peer on its GPU).
    pub fn low_latency_path(&self, job: JobId, src: u32, dst: u32) -> PeerPath {
        let j = self.job(job);
        if src == dst {
            return PeerPath::SameGpu;
        }
        let (a, b) = (j.ranks[src as usize], j.ranks[dst as usize]);
        let topo = &self.topology;
        let p2p = !j.nvshmem.disable_p2p;
        match topo.rank_path(a, b) {
            PeerPath::SameGpu if p2p => PeerPath::SameGpu,
            PeerPath::Nvlink => {
                let cross_node = topo.node_of_rank(a) != topo.node_of_rank(b);
                if p2p && !(cross_node && j.nvshmem.disable_mnnvl) {
                    PeerPath::Nvlink
                } else {
                    PeerPath::Rdma
                }
            }
            PeerPath::Pcie if p2p => PeerPath::Pcie,
            _ => PeerPath::Rdma,
        }
    }
}

impl JobPlan {
    /// QPs between two ranks that exchange over RDMA: a DeepEP job's
    /// `NVSHMEM_IBGDA_NUM_RC_PER_PE` (DeepEP writes `num_qps_per_rank` there whenever it
    /// initialises NVSHMEM; NVSHMEM's own default otherwise), a traffic job's `qps_per_peer`;
    /// at least 1. QP indices wrap modulo this count, as NVSHMEM's lookup does.
    pub fn qps_per_peer(&self) -> u32 {
        match &self.kind {
            JobKind::DeepEp(_) => self.nvshmem.num_rc_per_pe.max(1),
            JobKind::Traffic(t) => t.qps_per_peer.max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ScenarioDraft;

    #[test]
    fn channel_ranges_cover_the_tokens_once() {
        for (tokens, channels) in [(0, 4), (7, 3), (4096, 12), (5, 8), (10, 3), (2, 4)] {
            let mut next = 0;
            for c in 0..channels {
                let (lo, hi) = channel_range(tokens, channels, c);
                assert_eq!(lo, next.min(tokens));
                assert!(hi >= lo);
                next = hi;
            }
            assert_eq!(next, tokens);
        }
        assert_eq!(channel_range(10, 3, 2), (8, 10));
        assert_eq!(channel_range(2, 4, 3), (2, 2));
    }

    /// Two nodes of eight H800s (NVLink within a node): the path of every pair of job ranks
    /// under DeepEP's defaults, with P2P off, and with MNNVL allowed.
    #[test]
    fn low_latency_paths_follow_p2p_and_mnnvl() {
        let draft = ScenarioDraft::bundled("ep16-ll");
        let plan = draft.plan();
        let job = plan.jobs[0].id;
        assert_eq!(plan.low_latency_path(job, 3, 3), PeerPath::SameGpu);
        assert_eq!(plan.low_latency_path(job, 0, 7), PeerPath::Nvlink);
        assert_eq!(plan.low_latency_path(job, 0, 8), PeerPath::Rdma);

        let off = draft.clone().set("job[0].buffer.allow_nvlink_for_low_latency_mode", false);
        let plan = off.plan();
        assert_eq!(plan.low_latency_path(job, 3, 3), PeerPath::SameGpu, "a rank reaches itself");
        for (a, b) in [(0, 1), (0, 7), (0, 8), (15, 14)] {
            assert_eq!(plan.low_latency_path(job, a, b), PeerPath::Rdma, "{a} -> {b}");
        }
    }

    #[test]
    fn ranks_sharing_a_gpu_store_unless_p2p_is_off() {
        let draft = ScenarioDraft::bundled("h200-ep8-ll-128");
        let plan = draft.plan();
        let job = plan.jobs[0].id;
        assert_eq!(plan.topology.ranks_per_gpu, 8, "the bundled one-GPU scenario");
        assert_eq!(plan.low_latency_path(job, 0, 5), PeerPath::SameGpu);
        let plan = draft.set("job[0].buffer.allow_nvlink_for_low_latency_mode", false).plan();
        assert_eq!(plan.low_latency_path(job, 0, 5), PeerPath::Rdma);
        assert_eq!(plan.low_latency_path(job, 5, 5), PeerPath::SameGpu);
    }

    #[test]
    fn qps_per_peer_is_what_nvshmem_creates() {
        let plan = ScenarioDraft::bundled("ep16-ll").plan();
        let job = &plan.jobs[0];
        let d = job.deepep().unwrap();
        assert_eq!(job.qps_per_peer(), d.buffer.num_qps_per_rank);
        assert_eq!(job.qps_per_peer(), job.nvshmem.num_rc_per_pe);
    }
}
