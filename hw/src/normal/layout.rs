//! The byte layout of one rank's NVL buffer: the receiver's ring buffers and notify area.

/// Byte offsets of one rank's NVL buffer (the receiver's ring buffers and notify area).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvlLayout {
    pub recv_counts: u64,
    pub recv_expert_counts: u64,
    pub barrier: u64,
    pub d_start: u64,
    pub d_end: u64,
    pub d_head: u64,
    pub d_tail: u64,
    pub c_head: u64,
    pub c_tail: u64,
    pub x: u64,
    pub src_idx: u64,
    pub topk_idx: u64,
    pub topk_weights: u64,
    pub scales: u64,
    pub slot_bytes: u64,
    pub total: u64,
}

impl NvlLayout {
    /// `n` ranks, `l` local experts, `c` channels, `r` ring slots, `slot_bytes` payload stride,
    /// `k` top-k, `s` scales per token. Every array starts on a 128-byte line.
    pub fn new(n: u64, l: u64, c: u64, r: u64, slot_bytes: u64, k: u64, s: u64) -> NvlLayout {
        let mut off = 0u64;
        let mut take = |bytes: u64| {
            let at = off;
            off = (off + bytes).div_ceil(128) * 128;
            at
        };
        let meta = c * n * 4;
        let recv_counts = take(n * 4);
        let recv_expert_counts = take(n * l * 4);
        let barrier = take(4);
        let (d_start, d_end, d_head, d_tail) = (take(meta), take(meta), take(meta), take(meta));
        let (c_head, c_tail) = (take(meta), take(meta));
        let slots = c * n * r;
        let x = take(slots * slot_bytes);
        let src_idx = take(slots * 4);
        let topk_idx = take(slots * k * 4);
        let topk_weights = take(slots * k * 4);
        let scales = take(slots * s * 4);
        NvlLayout {
            recv_counts,
            recv_expert_counts,
            barrier,
            d_start,
            d_end,
            d_head,
            d_tail,
            c_head,
            c_tail,
            x,
            src_idx,
            topk_idx,
            topk_weights,
            scales,
            slot_bytes,
            total: off,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_aligned_and_disjoint() {
        let l = NvlLayout::new(8, 32, 12, 256, 14336, 8, 56);
        let mut offs = [
            l.recv_counts,
            l.recv_expert_counts,
            l.barrier,
            l.d_start,
            l.d_end,
            l.d_head,
            l.d_tail,
            l.c_head,
            l.c_tail,
            l.x,
            l.src_idx,
            l.topk_idx,
            l.topk_weights,
            l.scales,
        ];
        for o in offs {
            assert_eq!(o % 128, 0);
        }
        offs.sort();
        for w in offs.windows(2) {
            assert!(w[0] < w[1]);
        }
        assert_eq!(l.src_idx - l.x, 12 * 8 * 256 * 14336);
        assert!(l.total >= l.scales + 12 * 8 * 256 * 56 * 4);
    }
}
