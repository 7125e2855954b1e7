//! The normal internode kernels' layout: per (source rank, destination rank on the same rail,
//! channel) an RDMA ring of `rdma_recv` token slots in the destination's receive area, with
//! its count, tail and head counters (module docs of `internode` describe the record order).
//!
//! Every offset is a closed formula of [`NormalLayout`]'s fields, which is `#[repr(C)]` of
//! `u64`s so a CUDA kernel can take it as an argument and compute the same addresses.

use eptwin_engine::deepep::bytes::{normal_combine_token_bytes, normal_dispatch_token_bytes};
use eptwin_engine::deepep::config::align_up;

use super::geometry::Geometry;

/// Alignment of every rank area (DeepEP's `NUM_BUFFER_ALIGNMENT_BYTES`).
pub const AREA_ALIGN_BYTES: u64 = 128;

/// The 8-byte counters of one rank area, `[kind][peer node][channel]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum NormalCounter {
    /// At the receiver, from the sender on `node`: `+ (tokens + 1)` once per dispatch, before
    /// any token (0 means "not announced yet"; cumulative over calls).
    DispatchCount = 0,
    /// At the receiver: tokens written into the dispatch ring from `node` (cumulative).
    DispatchTail = 1,
    /// At the sender: dispatch slots the receiver on `node` has freed (cumulative credits).
    DispatchHead = 2,
    /// At the token's source: combined rows written into the combine ring from `node`.
    CombineTail = 3,
    /// At the combine sender: combine slots the source on `node` has freed.
    CombineHead = 4,
}

const COUNTER_KINDS: u64 = 5;

/// Where everything of the normal protocol lives, per rank. A process's receive (send) region
/// is its ranks' receive (send) areas back to back: local rank `l` at `l · recv_area_bytes`
/// (`l · send_area_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct NormalLayout {
    pub num_nodes: u64,
    pub num_channels: u64,
    /// Slots per dispatch ring (`rdma_recv`) and tokens per put / credit unit (`rdma_send`).
    pub dispatch_ring_slots: u64,
    pub dispatch_send_tokens: u64,
    /// The same for the combine rings (the combine config's).
    pub combine_ring_slots: u64,
    pub combine_send_tokens: u64,
    /// Dispatch slot: `payload | meta (8 B) | scales | top-k indices (i32) | top-k weights
    /// (f32)`, 16-B aligned (`deepep::bytes::normal_dispatch_token_bytes`).
    pub dispatch_token_bytes: u64,
    pub dispatch_meta_offset: u64,
    pub dispatch_scales_offset: u64,
    pub dispatch_topk_idx_offset: u64,
    pub dispatch_topk_weights_offset: u64,
    /// Combine slot: `BF16 payload | meta (8 B) | top-k weights (f32)`, 16-B aligned
    /// (`deepep::bytes::normal_combine_token_bytes`).
    pub combine_token_bytes: u64,
    pub combine_meta_offset: u64,
    pub combine_topk_weights_offset: u64,
    /// Receive area: counters, then dispatch rings `[source node][channel][slot]`, then
    /// combine rings `[sending node][channel][slot]`.
    pub counters_offset: u64,
    pub dispatch_rings_offset: u64,
    pub combine_rings_offset: u64,
    pub recv_area_bytes: u64,
    /// Send area: dispatch staging `[destination node][channel][slot]`, then combine staging
    /// `[destination node][channel][slot]`; slot `i` of a staging ring goes to slot `i` of the
    /// destination's ring.
    pub dispatch_staging_offset: u64,
    pub combine_staging_offset: u64,
    pub send_area_bytes: u64,
}

impl NormalLayout {
    pub fn new(g: &Geometry) -> NormalLayout {
        let dtype = g.dispatch_dtype;
        let payload = dtype.payload_bytes(g.hidden);
        let scales = dtype.scale_bytes(g.hidden);
        let dispatch_meta_offset = payload;
        let dispatch_scales_offset = dispatch_meta_offset + 8;
        let dispatch_topk_idx_offset = dispatch_scales_offset + scales;
        let dispatch_topk_weights_offset = dispatch_topk_idx_offset + 4 * g.topk as u64;
        let dispatch_token_bytes = align_up(dispatch_topk_weights_offset + 4 * g.topk as u64, 16);
        debug_assert_eq!(
            dispatch_token_bytes,
            normal_dispatch_token_bytes(g.hidden, g.topk, dtype.engine()),
            "the slot follows DeepEP's get_num_bytes_per_token"
        );
        let combine_meta_offset = 2 * g.hidden as u64;
        let combine_topk_weights_offset = combine_meta_offset + 8;
        let combine_token_bytes = align_up(combine_topk_weights_offset + 4 * g.topk as u64, 16);
        debug_assert_eq!(combine_token_bytes, normal_combine_token_bytes(g.hidden, g.topk));

        let nodes = g.num_nodes() as u64;
        let channels = g.num_channels as u64;
        let rings = nodes * channels;
        let dispatch_slots = rings * g.rdma_recv_tokens as u64;
        let combine_slots = rings * g.combine_rdma_recv_tokens as u64;
        let counters_offset = 0;
        let dispatch_rings_offset =
            align_up(counters_offset + 8 * COUNTER_KINDS * nodes * channels, AREA_ALIGN_BYTES);
        let combine_rings_offset = align_up(
            dispatch_rings_offset + dispatch_slots * dispatch_token_bytes,
            AREA_ALIGN_BYTES,
        );
        let recv_area_bytes =
            align_up(combine_rings_offset + combine_slots * combine_token_bytes, AREA_ALIGN_BYTES);
        let dispatch_staging_offset = 0;
        let combine_staging_offset =
            align_up(dispatch_slots * dispatch_token_bytes, AREA_ALIGN_BYTES);
        let send_area_bytes = align_up(
            combine_staging_offset + combine_slots * combine_token_bytes,
            AREA_ALIGN_BYTES,
        );
        NormalLayout {
            num_nodes: nodes,
            num_channels: channels,
            dispatch_ring_slots: g.rdma_recv_tokens as u64,
            dispatch_send_tokens: g.rdma_send_tokens as u64,
            combine_ring_slots: g.combine_rdma_recv_tokens as u64,
            combine_send_tokens: g.combine_rdma_send_tokens as u64,
            dispatch_token_bytes,
            dispatch_meta_offset,
            dispatch_scales_offset,
            dispatch_topk_idx_offset,
            dispatch_topk_weights_offset,
            combine_token_bytes,
            combine_meta_offset,
            combine_topk_weights_offset,
            counters_offset,
            dispatch_rings_offset,
            combine_rings_offset,
            recv_area_bytes,
            dispatch_staging_offset,
            combine_staging_offset,
            send_area_bytes,
        }
    }

    /// Offset, in a rank's receive area, of counter `kind` for `peer_node` and `channel`.
    pub fn counter(&self, kind: NormalCounter, peer_node: u32, channel: u32) -> u64 {
        self.counters_offset
            + 8 * ((kind as u64 * self.num_nodes + peer_node as u64) * self.num_channels
                + channel as u64)
    }

    fn ring(&self, node: u32, channel: u32, slots: u64, seq: u64) -> u64 {
        (node as u64 * self.num_channels + channel as u64) * slots + seq % slots
    }

    fn dispatch_ring(&self, node: u32, channel: u32, seq: u64) -> u64 {
        self.ring(node, channel, self.dispatch_ring_slots, seq) * self.dispatch_token_bytes
    }

    fn combine_ring(&self, node: u32, channel: u32, seq: u64) -> u64 {
        self.ring(node, channel, self.combine_ring_slots, seq) * self.combine_token_bytes
    }

    /// Receive-area offset of dispatch slot `seq % dispatch_ring_slots` of the ring from
    /// `src_node`.
    pub fn dispatch_slot(&self, src_node: u32, channel: u32, seq: u64) -> u64 {
        self.dispatch_rings_offset + self.dispatch_ring(src_node, channel, seq)
    }

    /// Receive-area offset of combine slot `seq % combine_ring_slots` of the ring from
    /// `sender_node`.
    pub fn combine_slot(&self, sender_node: u32, channel: u32, seq: u64) -> u64 {
        self.combine_rings_offset + self.combine_ring(sender_node, channel, seq)
    }

    /// Send-area offset of the dispatch staging slot for ring slot `seq` towards `dst_node`.
    pub fn dispatch_staging(&self, dst_node: u32, channel: u32, seq: u64) -> u64 {
        self.dispatch_staging_offset + self.dispatch_ring(dst_node, channel, seq)
    }

    /// Send-area offset of the combine staging slot for ring slot `seq` towards `dst_node`.
    pub fn combine_staging(&self, dst_node: u32, channel: u32, seq: u64) -> u64 {
        self.combine_staging_offset + self.combine_ring(dst_node, channel, seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::internode::geometry::{Geometry, TokenDtype};

    fn ep16() -> Geometry {
        Geometry {
            num_ranks: 16,
            ranks_per_node: 8,
            hidden: 7168,
            topk: 8,
            num_experts: 256,
            tokens_per_rank: 4096,
            max_tokens_per_rank: 4096,
            dispatch_dtype: TokenDtype::Fp8,
            num_channels: 12,
            rdma_send_tokens: 20,
            rdma_recv_tokens: 140,
            combine_rdma_send_tokens: 12,
            combine_rdma_recv_tokens: 132,
            qps_per_peer: 24,
        }
    }

    #[test]
    fn slots_are_deepeps_wire_units() {
        let l = NormalLayout::new(&ep16());
        assert_eq!(l.dispatch_token_bytes, 7472);
        assert_eq!(l.combine_token_bytes, 14384);
        assert_eq!(
            (l.dispatch_meta_offset, l.dispatch_scales_offset, l.dispatch_topk_idx_offset),
            (7168, 7176, 7176 + 224)
        );
        let bf16 = NormalLayout::new(&Geometry { dispatch_dtype: TokenDtype::Bf16, ..ep16() });
        assert_eq!(bf16.dispatch_token_bytes, 14416);
    }

    #[test]
    fn regions_do_not_overlap_and_stay_aligned() {
        let g = ep16();
        let l = NormalLayout::new(&g);
        let last_counter = l.counter(NormalCounter::CombineHead, 1, 11);
        assert!(last_counter + 8 <= l.dispatch_rings_offset);
        let last_dispatch = l.dispatch_slot(1, 11, 139);
        assert_eq!(
            last_dispatch + l.dispatch_token_bytes,
            l.dispatch_rings_offset + 2 * 12 * 140 * 7472
        );
        assert!(last_dispatch + l.dispatch_token_bytes <= l.combine_rings_offset);
        assert!(l.combine_slot(1, 11, 139) + l.combine_token_bytes <= l.recv_area_bytes);
        assert!(
            l.dispatch_staging(1, 11, 139) + l.dispatch_token_bytes <= l.combine_staging_offset
        );
        assert!(l.combine_staging(1, 11, 139) + l.combine_token_bytes <= l.send_area_bytes);
        assert_eq!(l.dispatch_slot(0, 0, 140), l.dispatch_slot(0, 0, 0), "slots wrap");
        for off in [l.dispatch_rings_offset, l.combine_rings_offset, l.recv_area_bytes] {
            assert_eq!(off % AREA_ALIGN_BYTES, 0);
        }
    }

    #[test]
    fn layout_is_a_plain_c_struct() {
        assert_eq!(std::mem::size_of::<NormalLayout>(), 21 * 8);
        assert_eq!(std::mem::align_of::<NormalLayout>(), 8);
    }

    /// kernels/cuda/wire.cuh declares the same `u64`s in the same order (kernels take the
    /// struct by value).
    #[test]
    fn layout_matches_the_cuda_declaration() {
        use std::mem::offset_of;
        let fields = crate::internode::cuda_u64_fields("wire.cuh", "NormalLayout");
        let rust = [
            ("num_nodes", offset_of!(NormalLayout, num_nodes)),
            ("num_channels", offset_of!(NormalLayout, num_channels)),
            ("dispatch_ring_slots", offset_of!(NormalLayout, dispatch_ring_slots)),
            ("dispatch_send_tokens", offset_of!(NormalLayout, dispatch_send_tokens)),
            ("combine_ring_slots", offset_of!(NormalLayout, combine_ring_slots)),
            ("combine_send_tokens", offset_of!(NormalLayout, combine_send_tokens)),
            ("dispatch_token_bytes", offset_of!(NormalLayout, dispatch_token_bytes)),
            ("dispatch_meta_offset", offset_of!(NormalLayout, dispatch_meta_offset)),
            ("dispatch_scales_offset", offset_of!(NormalLayout, dispatch_scales_offset)),
            ("dispatch_topk_idx_offset", offset_of!(NormalLayout, dispatch_topk_idx_offset)),
            (
                "dispatch_topk_weights_offset",
                offset_of!(NormalLayout, dispatch_topk_weights_offset),
            ),
            ("combine_token_bytes", offset_of!(NormalLayout, combine_token_bytes)),
            ("combine_meta_offset", offset_of!(NormalLayout, combine_meta_offset)),
            ("combine_topk_weights_offset", offset_of!(NormalLayout, combine_topk_weights_offset)),
            ("counters_offset", offset_of!(NormalLayout, counters_offset)),
            ("dispatch_rings_offset", offset_of!(NormalLayout, dispatch_rings_offset)),
            ("combine_rings_offset", offset_of!(NormalLayout, combine_rings_offset)),
            ("recv_area_bytes", offset_of!(NormalLayout, recv_area_bytes)),
            ("dispatch_staging_offset", offset_of!(NormalLayout, dispatch_staging_offset)),
            ("combine_staging_offset", offset_of!(NormalLayout, combine_staging_offset)),
            ("send_area_bytes", offset_of!(NormalLayout, send_area_bytes)),
        ];
        let names: Vec<&str> = rust.iter().map(|(n, _)| *n).collect();
        assert_eq!(fields, names);
        for (i, (name, offset)) in rust.iter().enumerate() {
            assert_eq!(*offset, 8 * i, "{name}");
        }
    }
}
