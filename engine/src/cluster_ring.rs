//! The ring slots of eptwin's own cluster kernels (`kernels/cuda/intranode_cluster.cu`: the
//! normal dispatch and combine with their rings in thread-block-cluster shared memory, one
//! block per rank per channel). The hardware backend sizes their launch with this and the
//! simulator models them with it, so both agree on when they run and with how many slots.

use crate::scenario::schema::Dtype;

/// The 16-byte source token index at the end of a dispatch slot (bulk-copied from the
/// sender's shared memory).
pub const CLUSTER_INDEX_BYTES: u64 = 16;

/// One ring slot of the cluster dispatch or combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterSlot {
    /// Bytes bulk-copied into the slot. Dispatch: row, FP8 scales, top-k experts and weights,
    /// the source index; combine: the BF16 row and its top-k weights.
    pub slot_bytes: u64,
    /// Of them, the row and its scales (dispatch: what the receiver bulk-stores to its output);
    /// combine: the BF16 row.
    pub row_bytes: u64,
    /// Shared memory per slot besides its bytes: its mbarrier (8 B), and in dispatch the
    /// sender's 16-byte token-index staging.
    pub extra_bytes: u64,
}

impl ClusterSlot {
    /// The dispatch slot of a token (7,472 B for FP8 hidden 7,168 top-8), or why bulk copies
    /// cannot move it: every part must be a 16-byte multiple.
    pub fn dispatch(hidden: u32, topk: u32, dtype: Dtype) -> Result<ClusterSlot, String> {
        let (row, scales) = match dtype {
            Dtype::Fp8 => (hidden as u64, (hidden as u64).div_ceil(128) * 4),
            _ => (2 * hidden as u64, 0),
        };
        if !scales.is_multiple_of(16) || !(4 * topk as u64).is_multiple_of(16) {
            return Err(format!(
                "{} scales or top-{topk} per row are not 16-byte multiples (bulk copies)",
                scales / 4
            ));
        }
        rows_in_16_byte_pieces(hidden)?;
        Ok(ClusterSlot {
            slot_bytes: row + scales + 8 * topk as u64 + CLUSTER_INDEX_BYTES,
            row_bytes: row + scales,
            extra_bytes: 8 + 16,
        })
    }

    /// The combine slot of a token (14,368 B at hidden 7,168 top-8), or why bulk copies cannot
    /// move it.
    pub fn combine(hidden: u32, topk: u32) -> Result<ClusterSlot, String> {
        if !(4 * topk as u64).is_multiple_of(16) {
            return Err(format!("top-{topk} weights per row are not a 16-byte multiple"));
        }
        rows_in_16_byte_pieces(hidden)?;
        Ok(ClusterSlot {
            slot_bytes: 2 * hidden as u64 + 4 * topk as u64,
            row_bytes: 2 * hidden as u64,
            extra_bytes: 8,
        })
    }

    /// Dynamic shared memory of a block with `slots` slots per source for `ranks` sources:
    /// the rings, their mbarriers (and staging), the 4-byte heads.
    pub fn smem_bytes(&self, ranks: u32, slots: u32) -> u64 {
        let n = ranks as u64;
        n * slots as u64 * (self.slot_bytes + self.extra_bytes) + n * 4
    }
}

/// An FP8 row is `hidden` bytes, bulk-copied in 16-byte pieces.
fn rows_in_16_byte_pieces(hidden: u32) -> Result<(), String> {
    if hidden.is_multiple_of(16) {
        Ok(())
    } else {
        Err(format!("hidden = {hidden} is not a multiple of 16 (rows move in 16-byte pieces)"))
    }
}

/// Ring slots per (channel, source): `want` (the Config's `num_max_nvl_chunked_recv_tokens`,
/// or less) or the most whose layout fits `smem_bytes` of shared memory per block, whichever
/// is less; 0 when not even one fits.
pub fn cluster_ring_slots(slot: &ClusterSlot, want: u32, ranks: u32, smem_bytes: u64) -> u32 {
    let n = ranks.max(1) as u64;
    let fit = smem_bytes.saturating_sub(4 * n) / (n * (slot.slot_bytes + slot.extra_bytes));
    want.min(fit.min(u32::MAX as u64) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `sm_90`'s 227 KiB of opt-in shared memory holds per block.
    const SMEM: u64 = 232_448;

    #[test]
    fn slot_sizes_match_the_kernels() {
        let d = ClusterSlot::dispatch(7168, 8, Dtype::Fp8).unwrap();
        assert_eq!((d.slot_bytes, d.row_bytes, d.extra_bytes), (7472, 7392, 24));
        let b = ClusterSlot::dispatch(7168, 8, Dtype::Bf16).unwrap();
        assert_eq!(b.slot_bytes, 14336 + 64 + 16);
        let c = ClusterSlot::combine(7168, 8).unwrap();
        assert_eq!((c.slot_bytes, c.extra_bytes), (14368, 8));
        assert!(ClusterSlot::dispatch(7168, 6, Dtype::Fp8).is_err(), "top-6 is 24 bytes");
        assert!(ClusterSlot::dispatch(2176, 8, Dtype::Fp8).is_err(), "17 scales");
        assert!(ClusterSlot::combine(2176, 8).is_ok(), "the combine moves no scales");
        assert!(ClusterSlot::combine(7168, 6).is_err());
    }

    /// The count is the largest that fits: one more slot would not.
    #[test]
    fn ring_slots_are_the_most_that_fit() {
        for (hidden, ranks) in [(7168, 8), (7168, 2), (4096, 4), (2048, 8)] {
            for slot in [
                ClusterSlot::dispatch(hidden, 8, Dtype::Fp8).unwrap(),
                ClusterSlot::combine(hidden, 8).unwrap(),
            ] {
                let s = cluster_ring_slots(&slot, u32::MAX, ranks, SMEM);
                assert!(s >= 1 && slot.smem_bytes(ranks, s) <= SMEM, "{slot:?} {ranks}");
                assert!(slot.smem_bytes(ranks, s + 1) > SMEM);
                assert_eq!(cluster_ring_slots(&slot, 1, ranks, SMEM), 1, "capped by want");
            }
        }
        // EP8 at hidden 7,168: three FP8 dispatch slots and two combine slots per source.
        let d = ClusterSlot::dispatch(7168, 8, Dtype::Fp8).unwrap();
        assert_eq!(cluster_ring_slots(&d, 256, 8, SMEM), 3);
        let c = ClusterSlot::combine(7168, 8).unwrap();
        assert_eq!(cluster_ring_slots(&c, 256, 8, SMEM), 2);
        // Fewer ranks leave room for more; a ring smaller than what fits is the limit.
        assert_eq!(cluster_ring_slots(&d, 12, 4, SMEM), 7);
        assert_eq!(cluster_ring_slots(&d, 2, 8, SMEM), 2);
        assert_eq!(cluster_ring_slots(&d, 12, 8, 1000), 0);
    }
}
