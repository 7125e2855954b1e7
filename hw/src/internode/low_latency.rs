//! The low-latency kernels' layout (DeepEP `internode_ll.cu`): dispatch writes one message per
//! (token, selected expert) into the expert owner's `[local expert][source rank][slot]`
//! receive slot and then, per (source rank, expert), a count; combine writes each expert's
//! output row back into the source's `[expert][token]` slot and then, per expert, a flag.
//!
//! Every offset is a closed formula of [`LlLayout`]'s fields (`#[repr(C)]`, `u64`s) so a CUDA
//! kernel can take it as an argument.

use eptwin_engine::deepep::bytes::{ll_combine_msg_bytes, ll_dispatch_msg_bytes};
use eptwin_engine::deepep::config::align_up;
use eptwin_engine::plan::Dtype;

use super::geometry::Geometry;
use super::normal::AREA_ALIGN_BYTES;

/// Bytes of a dispatch message's header: the source token index (i32) and three reserved
/// i32s, as DeepEP's.
pub const LL_HEADER_BYTES: u64 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct LlLayout {
    pub num_ranks: u64,
    pub num_experts: u64,
    pub num_local_experts: u64,
    /// Receive slots per (local expert, source rank): `num_max_dispatch_tokens_per_rank`.
    pub slots_per_source: u64,
    /// Header + payload (+ FP8 scales): `deepep::bytes::ll_dispatch_msg_bytes`.
    pub dispatch_msg_bytes: u64,
    /// One BF16 row: `deepep::bytes::ll_combine_msg_bytes`.
    pub combine_msg_bytes: u64,
    /// Receive area: dispatch counts `[local expert][source rank]` (u64, `+ (n + 1)` per
    /// call), combine flags `[global expert]` (u64, `+ 1` per call), dispatch slots
    /// `[local expert][source rank][slot]`, combine slots `[global expert][token]`.
    pub dispatch_counts_offset: u64,
    pub combine_flags_offset: u64,
    pub dispatch_recv_offset: u64,
    pub combine_recv_offset: u64,
    pub recv_area_bytes: u64,
    /// Send area: dispatch staging `[token]` (each token staged once, written to every
    /// destination from there), combine staging `[local expert][source rank][slot]`.
    pub dispatch_staging_offset: u64,
    pub combine_staging_offset: u64,
    pub send_area_bytes: u64,
}

impl LlLayout {
    pub fn new(g: &Geometry) -> LlLayout {
        let ranks = g.num_ranks as u64;
        let experts = g.num_experts as u64;
        let local = g.num_local_experts() as u64;
        let slots = g.max_tokens_per_rank as u64;
        let dispatch_msg_bytes = ll_dispatch_msg_bytes(g.hidden, g.dispatch_dtype.engine());
        let combine_msg_bytes = ll_combine_msg_bytes(g.hidden, Dtype::Bf16);
        let dispatch_counts_offset = 0;
        let combine_flags_offset = dispatch_counts_offset + 8 * local * ranks;
        let dispatch_recv_offset = align_up(combine_flags_offset + 8 * experts, AREA_ALIGN_BYTES);
        let combine_recv_offset = align_up(
            dispatch_recv_offset + local * ranks * slots * dispatch_msg_bytes,
            AREA_ALIGN_BYTES,
        );
        let recv_area_bytes =
            align_up(combine_recv_offset + experts * slots * combine_msg_bytes, AREA_ALIGN_BYTES);
        let dispatch_staging_offset = 0;
        let combine_staging_offset = align_up(slots * dispatch_msg_bytes, AREA_ALIGN_BYTES);
        let send_area_bytes = align_up(
            combine_staging_offset + local * ranks * slots * combine_msg_bytes,
            AREA_ALIGN_BYTES,
        );
        LlLayout {
            num_ranks: ranks,
            num_experts: experts,
            num_local_experts: local,
            slots_per_source: slots,
            dispatch_msg_bytes,
            combine_msg_bytes,
            dispatch_counts_offset,
            combine_flags_offset,
            dispatch_recv_offset,
            combine_recv_offset,
            recv_area_bytes,
            dispatch_staging_offset,
            combine_staging_offset,
            send_area_bytes,
        }
    }

    /// Receive-area offset of the dispatch count from `src_rank` for `local_expert`.
    pub fn dispatch_count(&self, local_expert: u32, src_rank: u32) -> u64 {
        self.dispatch_counts_offset + 8 * (local_expert as u64 * self.num_ranks + src_rank as u64)
    }

    /// Receive-area offset of the combine flag of global `expert`.
    pub fn combine_flag(&self, expert: u32) -> u64 {
        self.combine_flags_offset + 8 * expert as u64
    }

    fn per_source(&self, local_expert: u32, src_rank: u32, slot: u32) -> u64 {
        (local_expert as u64 * self.num_ranks + src_rank as u64) * self.slots_per_source
            + slot as u64
    }

    /// Receive-area offset of dispatch slot `[local_expert][src_rank][slot]`.
    pub fn dispatch_recv(&self, local_expert: u32, src_rank: u32, slot: u32) -> u64 {
        self.dispatch_recv_offset
            + self.per_source(local_expert, src_rank, slot) * self.dispatch_msg_bytes
    }

    /// Receive-area offset of combine slot `[expert][token]` (at the token's source).
    pub fn combine_recv(&self, expert: u32, token: u32) -> u64 {
        self.combine_recv_offset
            + (expert as u64 * self.slots_per_source + token as u64) * self.combine_msg_bytes
    }

    /// Send-area offset where `token`'s dispatch message is staged.
    pub fn dispatch_staging(&self, token: u32) -> u64 {
        self.dispatch_staging_offset + token as u64 * self.dispatch_msg_bytes
    }

    /// Send-area offset where the row for `[local_expert][src_rank][slot]` is staged.
    pub fn combine_staging(&self, local_expert: u32, src_rank: u32, slot: u32) -> u64 {
        self.combine_staging_offset
            + self.per_source(local_expert, src_rank, slot) * self.combine_msg_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::internode::geometry::TokenDtype;

    fn ep16_ll() -> Geometry {
        Geometry {
            num_ranks: 16,
            ranks_per_node: 8,
            hidden: 7168,
            topk: 8,
            num_experts: 288,
            tokens_per_rank: 128,
            max_tokens_per_rank: 128,
            dispatch_dtype: TokenDtype::Fp8,
            num_channels: 0,
            rdma_send_tokens: 0,
            rdma_recv_tokens: 0,
            combine_rdma_send_tokens: 0,
            combine_rdma_recv_tokens: 0,
            qps_per_peer: 18,
        }
    }

    #[test]
    fn messages_are_deepeps_and_areas_do_not_overlap() {
        let l = LlLayout::new(&ep16_ll());
        assert_eq!((l.dispatch_msg_bytes, l.combine_msg_bytes), (7408, 14336));
        assert_eq!(l.num_local_experts, 18);
        assert!(l.dispatch_count(17, 15) + 8 <= l.combine_flags_offset);
        assert!(l.combine_flag(287) + 8 <= l.dispatch_recv_offset);
        assert!(l.dispatch_recv(17, 15, 127) + l.dispatch_msg_bytes <= l.combine_recv_offset);
        assert!(l.combine_recv(287, 127) + l.combine_msg_bytes <= l.recv_area_bytes);
        assert!(l.dispatch_staging(127) + l.dispatch_msg_bytes <= l.combine_staging_offset);
        assert!(l.combine_staging(17, 15, 127) + l.combine_msg_bytes <= l.send_area_bytes);
        let bf16 = LlLayout::new(&Geometry { dispatch_dtype: TokenDtype::Bf16, ..ep16_ll() });
        assert_eq!(bf16.dispatch_msg_bytes, 14352);
    }

    #[test]
    fn layout_is_a_plain_c_struct() {
        assert_eq!(std::mem::size_of::<LlLayout>(), 14 * 8);
    }

    /// kernels/cuda/wire.cuh declares the same `u64`s in the same order (low_latency.cu takes
    /// the struct inside its parameters).
    #[test]
    fn layout_matches_the_cuda_declaration() {
        use std::mem::offset_of;
        let fields = crate::internode::cuda_u64_fields("wire.cuh", "LlLayout");
        let rust = [
            ("num_ranks", offset_of!(LlLayout, num_ranks)),
            ("num_experts", offset_of!(LlLayout, num_experts)),
            ("num_local_experts", offset_of!(LlLayout, num_local_experts)),
            ("slots_per_source", offset_of!(LlLayout, slots_per_source)),
            ("dispatch_msg_bytes", offset_of!(LlLayout, dispatch_msg_bytes)),
            ("combine_msg_bytes", offset_of!(LlLayout, combine_msg_bytes)),
            ("dispatch_counts_offset", offset_of!(LlLayout, dispatch_counts_offset)),
            ("combine_flags_offset", offset_of!(LlLayout, combine_flags_offset)),
            ("dispatch_recv_offset", offset_of!(LlLayout, dispatch_recv_offset)),
            ("combine_recv_offset", offset_of!(LlLayout, combine_recv_offset)),
            ("recv_area_bytes", offset_of!(LlLayout, recv_area_bytes)),
            ("dispatch_staging_offset", offset_of!(LlLayout, dispatch_staging_offset)),
            ("combine_staging_offset", offset_of!(LlLayout, combine_staging_offset)),
            ("send_area_bytes", offset_of!(LlLayout, send_area_bytes)),
        ];
        let names: Vec<&str> = rust.iter().map(|(n, _)| *n).collect();
        assert_eq!(fields, names);
        for (i, (name, offset)) in rust.iter().enumerate() {
            assert_eq!(*offset, 8 * i, "{name}");
        }
    }
}
