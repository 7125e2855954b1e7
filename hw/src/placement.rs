//! Where each rank of a job runs: one rank per GPU when the machine has enough GPUs (with peer
//! access between every pair in use), otherwise the scenario's `ranks_per_gpu` ranks share a
//! GPU (EP8 on one H200: their "NVLink" traffic is device-local copies).
//!
//! Pure logic over a [`GpuInventory`] so that it is tested without GPUs (mockall).

use crate::measurements::PlacementReport;

/// What placement needs to know about the machine.
#[cfg_attr(test, mockall::automock)]
pub trait GpuInventory {
    fn gpu_count(&self) -> u32;
    /// `cuDeviceCanAccessPeer(a, b)`.
    fn can_access_peer(&self, a: u32, b: u32) -> bool;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementMode {
    /// Each rank owns a GPU; peers are reached through peer pointers (NVLink).
    OneRankPerGpu,
    /// `ranks_per_gpu` consecutive ranks share each GPU.
    SharedGpu,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub mode: PlacementMode,
    pub ranks_per_gpu: u32,
    /// GPU ordinal of each job rank.
    pub gpu_of_rank: Vec<u32>,
    /// GPUs in use, ascending.
    pub gpus: Vec<u32>,
}

impl Placement {
    /// Job ranks on `gpu`, ascending (consecutive by construction).
    pub fn ranks_on(&self, gpu: u32) -> Vec<u32> {
        (0..self.gpu_of_rank.len() as u32)
            .filter(|&r| self.gpu_of_rank[r as usize] == gpu)
            .collect()
    }

    pub fn describe(&self) -> String {
        let n = self.gpu_of_rank.len();
        match self.mode {
            PlacementMode::OneRankPerGpu => {
                format!("{n} ranks on {} GPUs, one per GPU", self.gpus.len())
            }
            PlacementMode::SharedGpu => format!(
                "{n} ranks on {} GPU{}, {} per GPU",
                self.gpus.len(),
                if self.gpus.len() == 1 { "" } else { "s" },
                self.ranks_per_gpu
            ),
        }
    }

    /// `hw.placement` of the result.
    pub fn report(&self) -> PlacementReport {
        PlacementReport {
            description: self.describe(),
            ranks_per_gpu: self.ranks_per_gpu,
            gpus: self.gpus.clone(),
            gpu_of_rank: self.gpu_of_rank.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error(
        "{ranks} ranks need {ranks} GPUs (one per GPU) or {needed} GPUs at the scenario's \
         ranks_per_gpu = {ranks_per_gpu}; this machine has {gpus}"
    )]
    NotEnoughGpus { ranks: u32, ranks_per_gpu: u32, needed: u32, gpus: u32 },
    #[error(
        "GPU {a} cannot access GPU {b}'s memory (no peer access): ranks on them cannot exchange tokens"
    )]
    NoPeerAccess { a: u32, b: u32 },
    #[error("a job needs at least one rank")]
    NoRanks,
}

/// Place `num_ranks` ranks given the scenario's declared `ranks_per_gpu`.
pub fn place(
    num_ranks: u32,
    declared_ranks_per_gpu: u32,
    inv: &dyn GpuInventory,
) -> Result<Placement, PlacementError> {
    if num_ranks == 0 {
        return Err(PlacementError::NoRanks);
    }
    let gpus = inv.gpu_count();
    let (mode, per_gpu) = if gpus >= num_ranks {
        (PlacementMode::OneRankPerGpu, 1)
    } else {
        let rpg = declared_ranks_per_gpu.max(1);
        let needed = num_ranks.div_ceil(rpg);
        if rpg == 1 || needed > gpus {
            return Err(PlacementError::NotEnoughGpus {
                ranks: num_ranks,
                ranks_per_gpu: rpg,
                needed,
                gpus,
            });
        }
        (PlacementMode::SharedGpu, rpg)
    };
    let gpu_of_rank: Vec<u32> = (0..num_ranks).map(|r| r / per_gpu).collect();
    let mut used: Vec<u32> = gpu_of_rank.clone();
    used.dedup();
    for (i, &a) in used.iter().enumerate() {
        for &b in &used[i + 1..] {
            if !inv.can_access_peer(a, b) {
                return Err(PlacementError::NoPeerAccess { a, b });
            }
            if !inv.can_access_peer(b, a) {
                return Err(PlacementError::NoPeerAccess { a: b, b: a });
            }
        }
    }
    Ok(Placement { mode, ranks_per_gpu: per_gpu, gpu_of_rank, gpus: used })
}

/// [`place`] for a plan whose ranks span `nodes` nodes. A machine with fewer GPUs than the
/// plan runs the nodes on its own GPUs: `ranks_per_gpu · ceil(plan GPUs / GPUs here)` ranks per
/// GPU, nodes kept whole and in order (the one-GPU internode scenarios: both "nodes" on the
/// one H200, their traffic between them on the internode wire all the same).
pub fn place_nodes(
    num_ranks: u32,
    declared_ranks_per_gpu: u32,
    nodes: u32,
    inv: &dyn GpuInventory,
) -> Result<Placement, PlacementError> {
    match place(num_ranks, declared_ranks_per_gpu, inv) {
        Err(PlacementError::NotEnoughGpus { needed, gpus, .. })
            if nodes > 1 && gpus > 0 && declared_ranks_per_gpu > 1 =>
        {
            let stacked = declared_ranks_per_gpu * needed.div_ceil(gpus);
            place(num_ranks, stacked, inv)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inventory(gpus: u32, peer: bool) -> MockGpuInventory {
        let mut inv = MockGpuInventory::new();
        inv.expect_gpu_count().return_const(gpus);
        inv.expect_can_access_peer().returning(move |_, _| peer);
        inv
    }

    #[test]
    fn ep8_shares_one_h200() {
        let mut inv = MockGpuInventory::new();
        inv.expect_gpu_count().return_const(1u32);
        // One GPU: no pair to check, so peer access must not even be asked.
        inv.expect_can_access_peer().never();
        let p = place(8, 8, &inv).unwrap();
        assert_eq!(p.mode, PlacementMode::SharedGpu);
        assert_eq!(p.gpu_of_rank, vec![0; 8]);
        assert_eq!(p.gpus, vec![0]);
        assert_eq!(p.ranks_on(0), (0..8).collect::<Vec<_>>());
        assert_eq!(p.describe(), "8 ranks on 1 GPU, 8 per GPU");
    }

    #[test]
    fn one_rank_per_gpu_when_there_are_enough() {
        let mut inv = MockGpuInventory::new();
        inv.expect_gpu_count().return_const(8u32);
        // Every unordered pair is checked in both directions: 8 * 7 calls.
        inv.expect_can_access_peer().times(56).returning(|_, _| true);
        let p = place(8, 8, &inv).unwrap();
        assert_eq!(p.mode, PlacementMode::OneRankPerGpu);
        assert_eq!(p.gpu_of_rank, (0..8).collect::<Vec<_>>());
        assert_eq!(p.ranks_per_gpu, 1);
    }

    #[test]
    fn shared_placement_across_a_few_gpus() {
        let p = place(8, 4, &inventory(2, true)).unwrap();
        assert_eq!(p.gpu_of_rank, vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(p.ranks_on(1), vec![4, 5, 6, 7]);
    }

    #[test]
    fn not_enough_gpus_is_explained() {
        let e = place(8, 1, &inventory(1, true)).unwrap_err();
        assert_eq!(
            e,
            PlacementError::NotEnoughGpus { ranks: 8, ranks_per_gpu: 1, needed: 8, gpus: 1 }
        );
        assert!(e.to_string().contains("this machine has 1"));
        let e = place(16, 8, &inventory(1, true)).unwrap_err();
        assert!(matches!(e, PlacementError::NotEnoughGpus { needed: 2, .. }));
    }

    #[test]
    fn missing_peer_access_is_refused() {
        let mut inv = MockGpuInventory::new();
        inv.expect_gpu_count().return_const(2u32);
        inv.expect_can_access_peer().returning(|a, b| !(a == 1 && b == 0));
        let e = place(2, 1, &inv).unwrap_err();
        assert_eq!(e, PlacementError::NoPeerAccess { a: 1, b: 0 });
    }

    #[test]
    fn nodes_stack_onto_the_gpus_there_are() {
        // Two nodes of 8 ranks (one GPU each in the plan) on the one H200: all 16 there.
        let p = place_nodes(16, 8, 2, &inventory(1, true)).unwrap();
        assert_eq!((p.gpu_of_rank.clone(), p.ranks_per_gpu), (vec![0; 16], 16));
        assert_eq!(p.describe(), "16 ranks on 1 GPU, 16 per GPU");
        // Two GPUs: one node each, as the plan says.
        let p = place_nodes(8, 4, 2, &inventory(2, true)).unwrap();
        assert_eq!(p.gpu_of_rank, vec![0, 0, 0, 0, 1, 1, 1, 1]);
        // Four nodes on two GPUs: two whole nodes per GPU.
        let p = place_nodes(16, 4, 4, &inventory(2, true)).unwrap();
        assert_eq!(p.ranks_on(0), (0..8).collect::<Vec<_>>());
        // One node, or one rank per GPU declared: the plan's statement stands.
        assert!(place_nodes(16, 8, 1, &inventory(1, true)).is_err());
        assert!(place_nodes(4, 1, 2, &inventory(1, true)).is_err());
    }

    #[test]
    fn zero_ranks() {
        assert_eq!(place(0, 1, &inventory(1, true)).unwrap_err(), PlacementError::NoRanks);
    }
}
