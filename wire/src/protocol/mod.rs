//! The internode protocol: what DeepEP's internode and low-latency kernels put on the wire,
//! defined once here (layouts as `#[repr(C)]` structs of offsets a CUDA kernel takes as an
//! argument) and implemented on the host ([`host`]) so it can be tested end to end over both
//! wires without a GPU. docs/internode-wire.md is the overview.
//!
//! # Processes, regions, QPs
//!
//! One process per node runs `ranks_per_node` ranks. It owns a send region (staging the GPU
//! writes, host-pinned) and a receive region (where the wire lands bytes), each its ranks'
//! areas back to back (local rank `l` at `l ·` area size), zeroed at start. Counters are
//! 8-byte words that only ever grow (a call continues where the last left off). A process's
//! QP table ([`QpTable`]) lists, per peer node, the QPs between its ranks and the peer's
//! ranks; every record names an entry. Ranks of the same process reach each other by direct
//! writes and atomic adds (the stand-in for NVLink), never through the wire.
//!
//! # Normal kernels ([`NormalLayout`])
//!
//! Traffic stays on a rail: rank `(node, l)` exchanges only with `(n, l)` of every other node
//! `n` (DeepEP's per-rail NVSHMEM worlds), and reaches its own node's ring by direct writes.
//! Per (source, destination, channel) there is a ring of `rdma_recv` slots in the
//! destination's receive area and its staging mirror in the source's send area (slot `i`
//! goes to slot `i`). A dispatch slot is the token's payload, an 8-byte meta `{source token
//! u32, mask of the destination node's local ranks u32}`, FP8 scales, top-k indices (i32) and
//! weights (f32), 16-B aligned — `deepep::bytes::normal_dispatch_token_bytes`.
//!
//! Records of one call, sender `(node a, l)` → receiver `(node b, l)`, channel `c`:
//! 1. `Flag DispatchCount[a][c] += n + 1` on QP `c` (announces `n` tokens, 0 stays "not yet");
//! 2. per batch of up to `rdma_send` tokens, once the receiver's credits allow
//!    (`sent − DispatchHead[b][c] ≤ rdma_recv − batch`, read locally): the tokens are staged,
//!    then `Write` (one per contiguous run of slots, two when the batch wraps) and `Flag
//!    DispatchTail[a][c] += batch`, all on QP `c`;
//! 3. the receiver reads `DispatchTail` (Acquire), consumes slots in order and returns credits
//!    with `Flag DispatchHead[b][c] += consumed` on QP `c + channels` (the credit QP, as
//!    DeepEP's `channel_id + C`) once `rdma_send` are owed, and the rest at the end of the call.
//!
//! The sender never overruns: `tail − head ≤ rdma_recv` at every moment. The combine runs
//! rings of the same structure the other way, sized by the combine config's `rdma_send` /
//! `rdma_recv` (`CombineTail` / `CombineHead`, no count: the source knows what it sent): the
//! destination sends, per token it received, in the order it received them, the
//! partial row of its node (BF16) with meta `{source token, 0}` and the top-k weights —
//! `deepep::bytes::normal_combine_token_bytes` — and the source sums the partials of every
//! node its token went to. QP indices wrap modulo `num_qps_per_rank` as NVSHMEM's do.
//!
//! # Low-latency kernels ([`LlLayout`])
//!
//! Dispatch: a source stages each token once (16-B header `{source token i32, 3 × 0}` +
//! payload (+ scales)), and for every (token, selected expert) writes it to the expert
//! owner's slot `[local expert][source rank][slot]`, the slot being the running count of that
//! (source, expert) — one message per selection, no deduplication — on QP `local expert`;
//! then for every expert (zero-token ones too) `Flag count[local expert][source] += n + 1` on
//! the same QP. Combine: the owner writes each received token's output row (BF16) into the
//! source's `[expert][token]` slot, then `Flag flag[expert] += 1` on the same QP, for every
//! (expert, source); the source waits until every expert's flag counts the call and forms
//! `Σ_k weight_k · row_k` over its top-k.
//!
//! # Ordering each wire guarantees (`crate::wire`)
//!
//! The records of one QP are applied in publication order and a flag only after the writes
//! before it are in the receive region: RC execution order on verbs, one in-order stream per
//! peer process on TCP. Every "flag after data" above is on one QP; nothing relies on order
//! between QPs (credits only say that reading has finished).

pub mod data;
pub mod geometry;
pub mod host;
pub mod low_latency;
pub mod normal;
#[cfg(feature = "rdma")]
pub mod verbs;

pub use geometry::{Geometry, QpTable, TokenDtype, Traffic};
pub use host::{HostLinks, HostStats, describe_tag, run_low_latency, run_normal};
pub use low_latency::LlLayout;
pub use normal::{NormalCounter, NormalLayout};

/// The `u64` field names of `struct name { ... };` in a kernels header, in order (layout tests
/// of the `#[repr(C)]` structs kernels take as arguments).
#[cfg(test)]
pub(crate) fn cuda_u64_fields(header: &str, name: &str) -> Vec<String> {
    let source = eptwin_kernels::HEADERS
        .iter()
        .find(|(h, _)| *h == header)
        .map(|(_, text)| *text)
        .expect("a kernels header");
    let start = source.find(&format!("struct {name} {{")).expect("the struct is declared");
    let body = &source[start..source[start..].find("};").expect("closed") + start];
    body.lines()
        .skip(1)
        .filter_map(|l| l.trim().strip_prefix("u64 "))
        .map(|l| l.trim_end_matches(';').trim().to_string())
        .collect()
}
