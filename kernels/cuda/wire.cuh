// The internode wire as kernels see it (docs/internode-wire.md; host side hw/src/wire/ and
// hw/src/internode/): the doorbell ring the CPU proxy consumes, the u64 counters and slots of
// the send and receive regions (pinned host memory mapped into the GPU), and the protocol's
// layout structs, field for field as hw/src/internode/{normal,low_latency}.rs declare them.
//
// Memory shared with the CPU is accessed at system scope: counters with acquire loads and
// release stores, data after an acquire with relaxed .sys loads (no L1 line from an earlier
// lap of a ring can be returned). A kernel never issues an atomic to host memory (no PCIe
// atomics): a counter written by the wire is only ever incremented by the CPU, and a counter
// of the kernel's own node has exactly one writer, which stores the new total.
#pragma once
#include "common.cuh"

// Doorbell records (hw/src/wire/doorbell.rs `Doorbell`, `DoorbellKind`).
#define DOORBELL_SLOT_BYTES 64
#define DOORBELL_WRITE 1
#define DOORBELL_FLAG 3

DEVICE u64 ld_acquire_sys_u64(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

DEVICE u64 ld_relaxed_sys_u64(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

DEVICE void st_release_sys_u64(u64* p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

DEVICE void st_relaxed_sys_u64(u64* p, u64 v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// 16 bytes of host memory another agent wrote (the TCP receiver thread, a NIC, another rank).
DEVICE int4 ld_sys_v4(const int4* p) {
    int4 v;
    asm volatile("ld.relaxed.sys.global.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

DEVICE int ld_sys_s32(const int* p) {
    int v;
    asm volatile("ld.relaxed.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

DEVICE float ld_sys_f32(const float* p) {
    float v;
    asm volatile("ld.relaxed.sys.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}

// A rank's doorbell ring: `capacity` 64-byte slots `{seq, kind | qp << 32, src_offset,
// dst_offset, len_bytes | imm << 32, add, tag, pad}` in mapped pinned memory, consumed in
// ticket order by its node's proxy thread. Producers (any thread of any block of the rank)
// claim a ticket with an atomic on a device-memory counter, wait until the slot's sequence
// equals the ticket (the proxy freed it), write the record and release `ticket + 1`. A
// producer's records reach the wire in the order it pushed them; a flag pushed after another
// producer's write has returned also follows that write (it got a later ticket).
struct DoorbellRing {
    u8* slots;
    u64* ticket;
    u64 mask;  // capacity - 1
};

// One record; false (after recording the wait) when the slot never came free.
DEVICE bool doorbell_push(const DoorbellRing& r, u32 kind, u32 qp, u64 src_offset,
                          u64 dst_offset, u32 len_bytes, u64 add, u64 tag, u64 timeout_ns,
                          ErrorRecord* err, int rank, int wait_kind) {
    const u64 t = atomicAdd((unsigned long long*)r.ticket, 1ull);
    u64* slot = (u64*)(r.slots + (t & r.mask) * DOORBELL_SLOT_BYTES);
    const u64 t0 = globaltimer_ns();
    u64 seen;
    while ((seen = ld_acquire_sys_u64(slot)) != t) {
        if (globaltimer_ns() - t0 > timeout_ns || error_raised(err)) {
            record_timeout(err, wait_kind, rank, -1, -1, -1, (int)t, (int)seen);
            return false;
        }
    }
    st_relaxed_sys_u64(slot + 1, (u64)kind | ((u64)qp << 32));
    st_relaxed_sys_u64(slot + 2, src_offset);
    st_relaxed_sys_u64(slot + 3, dst_offset);
    st_relaxed_sys_u64(slot + 4, (u64)len_bytes);
    st_relaxed_sys_u64(slot + 5, add);
    st_relaxed_sys_u64(slot + 6, tag);
    st_release_sys_u64(slot, t + 1);
    return true;
}

// Tags name what a record carried (hw/src/internode/host/mod.rs `tag`, `TagRole`).
#define TAG_DISPATCH_COUNT 1
#define TAG_DISPATCH_DATA 2
#define TAG_DISPATCH_TAIL 3
#define TAG_DISPATCH_CREDIT 4
#define TAG_COMBINE_DATA 5
#define TAG_COMBINE_TAIL 6
#define TAG_COMBINE_CREDIT 7
#define TAG_LL_DISPATCH_DATA 8
#define TAG_LL_DISPATCH_COUNT 9
#define TAG_LL_COMBINE_DATA 10
#define TAG_LL_COMBINE_FLAG 11

DEVICE u64 wire_tag(u64 role, u64 rank, u64 a, u64 b) {
    return role << 60 | (rank & 0xffff) << 44 | (a & 0xfff) << 32 | (b & 0xffffffffull);
}

// The QP-table entry for QP `q` from local rank `local_src` to local rank `local_dst` of
// `peer_node` (hw/src/internode/geometry.rs `QpTable::index`). `per_src_dsts` is 1 for the
// normal kernels (one rail) and ranks_per_node for the low-latency ones.
DEVICE u32 qp_index(int node, int peer_node, int ranks_per_node, int per_src_dsts,
                    int local_src, int local_dst, int qps_per_peer, int q) {
    const int slot = peer_node < node ? peer_node : peer_node - 1;
    const int within = (local_src * per_src_dsts + local_dst) * qps_per_peer + q % qps_per_peer;
    return (u32)((slot * ranks_per_node * per_src_dsts) * qps_per_peer + within);
}

// ---------------------------------------------------------------------------------------------
// The normal kernels' layout (hw/src/internode/normal.rs `NormalLayout`, same field order).
// ---------------------------------------------------------------------------------------------

#define COUNTER_DISPATCH_COUNT 0
#define COUNTER_DISPATCH_TAIL 1
#define COUNTER_DISPATCH_HEAD 2
#define COUNTER_COMBINE_TAIL 3
#define COUNTER_COMBINE_HEAD 4

struct NormalLayout {
    u64 num_nodes;
    u64 num_channels;
    u64 dispatch_ring_slots;
    u64 dispatch_send_tokens;
    u64 combine_ring_slots;
    u64 combine_send_tokens;
    u64 dispatch_token_bytes;
    u64 dispatch_meta_offset;
    u64 dispatch_scales_offset;
    u64 dispatch_topk_idx_offset;
    u64 dispatch_topk_weights_offset;
    u64 combine_token_bytes;
    u64 combine_meta_offset;
    u64 combine_topk_weights_offset;
    u64 counters_offset;
    u64 dispatch_rings_offset;
    u64 combine_rings_offset;
    u64 recv_area_bytes;
    u64 dispatch_staging_offset;
    u64 combine_staging_offset;
    u64 send_area_bytes;
};

DEVICE u64 nl_counter(const NormalLayout& l, int kind, int node, int channel) {
    return l.counters_offset + 8 * (((u64)kind * l.num_nodes + node) * l.num_channels + channel);
}

DEVICE u64 nl_ring(const NormalLayout& l, int node, int channel, u64 slots, u64 seq) {
    return ((u64)node * l.num_channels + channel) * slots + seq % slots;
}

DEVICE u64 nl_dispatch_slot(const NormalLayout& l, int src_node, int channel, u64 seq) {
    return l.dispatch_rings_offset +
           nl_ring(l, src_node, channel, l.dispatch_ring_slots, seq) * l.dispatch_token_bytes;
}

DEVICE u64 nl_combine_slot(const NormalLayout& l, int sender_node, int channel, u64 seq) {
    return l.combine_rings_offset +
           nl_ring(l, sender_node, channel, l.combine_ring_slots, seq) * l.combine_token_bytes;
}

DEVICE u64 nl_dispatch_staging(const NormalLayout& l, int dst_node, int channel, u64 seq) {
    return l.dispatch_staging_offset +
           nl_ring(l, dst_node, channel, l.dispatch_ring_slots, seq) * l.dispatch_token_bytes;
}

DEVICE u64 nl_combine_staging(const NormalLayout& l, int dst_node, int channel, u64 seq) {
    return l.combine_staging_offset +
           nl_ring(l, dst_node, channel, l.combine_ring_slots, seq) * l.combine_token_bytes;
}

// ---------------------------------------------------------------------------------------------
// The low-latency kernels' layout (hw/src/internode/low_latency.rs `LlLayout`).
// ---------------------------------------------------------------------------------------------

struct LlLayout {
    u64 num_ranks;
    u64 num_experts;
    u64 num_local_experts;
    u64 slots_per_source;
    u64 dispatch_msg_bytes;
    u64 combine_msg_bytes;
    u64 dispatch_counts_offset;
    u64 combine_flags_offset;
    u64 dispatch_recv_offset;
    u64 combine_recv_offset;
    u64 recv_area_bytes;
    u64 dispatch_staging_offset;
    u64 combine_staging_offset;
    u64 send_area_bytes;
};

DEVICE u64 ll_dispatch_count(const LlLayout& l, int local_expert, int src_rank) {
    return l.dispatch_counts_offset + 8 * ((u64)local_expert * l.num_ranks + src_rank);
}

DEVICE u64 ll_combine_flag(const LlLayout& l, int expert) {
    return l.combine_flags_offset + 8 * (u64)expert;
}

DEVICE u64 ll_dispatch_recv(const LlLayout& l, int local_expert, int src_rank, int slot) {
    return l.dispatch_recv_offset +
           (((u64)local_expert * l.num_ranks + src_rank) * l.slots_per_source + slot) *
               l.dispatch_msg_bytes;
}

DEVICE u64 ll_combine_recv(const LlLayout& l, int expert, int token) {
    return l.combine_recv_offset +
           ((u64)expert * l.slots_per_source + token) * l.combine_msg_bytes;
}

DEVICE u64 ll_dispatch_staging(const LlLayout& l, int token) {
    return l.dispatch_staging_offset + (u64)token * l.dispatch_msg_bytes;
}

DEVICE u64 ll_combine_staging(const LlLayout& l, int local_expert, int src_rank, int slot) {
    return l.combine_staging_offset +
           (((u64)local_expert * l.num_ranks + src_rank) * l.slots_per_source + slot) *
               l.combine_msg_bytes;
}
