// Thread-block-cluster (sm_90+) helpers: distributed shared memory addressing, cluster-scope
// flags, mbarriers and TMA bulk copies. Only modules compiled for sm_90 or newer include this.
#pragma once
#include "common.cuh"

DEVICE u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

DEVICE u32 cluster_ctarank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// The shared::cluster address of `addr` (a shared::cta address) in block `rank` of the cluster.
DEVICE u32 map_to_rank(u32 addr, u32 rank) {
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}

// Every thread of every block of the cluster; orders shared-memory accesses across it.
DEVICE void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
                 ::: "memory");
}

DEVICE void st_cluster_v4(u32 addr, int4 v) {
    asm volatile("st.shared::cluster.v4.s32 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

DEVICE int4 ld_shared_v4(u32 addr) {
    int4 v;
    asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
    return v;
}

DEVICE void st_release_cluster(u32 addr, int v) {
    asm volatile("st.release.cluster.shared::cluster.s32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

DEVICE int ld_acquire_cluster(u32 addr) {
    int v;
    asm volatile("ld.acquire.cluster.shared::cluster.s32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

DEVICE void mbar_init(u32 addr, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(addr), "r"(count) : "memory");
}

DEVICE void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// One arrival that also expects `bytes` more to land (the phase completes when both are in).
DEVICE void mbar_arrive_expect_tx(u32 addr, u32 bytes) {
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}"
                 ::"r"(addr), "r"(bytes) : "memory");
}

DEVICE bool mbar_try_wait(u32 addr, u32 parity) {
    u32 ok;
    asm volatile(
        "{\n\t.reg .pred P;\n\tmbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, P;\n\t}"
        : "=r"(ok) : "r"(addr), "r"(parity) : "memory");
    return ok != 0;
}

// Global → shared memory of a block of this cluster (dst and mbar are shared::cluster addresses).
DEVICE void tma_load_to_cluster(u32 dst, const void* src, u32 bytes, u32 mbar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(mbar) : "memory");
}

// Every bulk store of this thread has read its shared-memory source.
DEVICE void tma_store_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

DEVICE void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

DEVICE void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

DEVICE u32 ld_shared_u32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

// try_wait with acquire at cluster scope: what the producers in other blocks wrote before
// arriving is visible after it returns true.
DEVICE bool mbar_try_wait_cluster(u32 addr, u32 parity) {
    u32 ok;
    asm volatile(
        "{\n\t.reg .pred P;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, P;\n\t}"
        : "=r"(ok) : "r"(addr), "r"(parity) : "memory");
    return ok != 0;
}

// A bulk store without committing its group (commit once after several).
DEVICE void tma_store_nocommit(void* dst, u32 src, u32 bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}

DEVICE void tma_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// One bulk store in a group of its own.
DEVICE void tma_store_from_shared(void* dst, u32 src, u32 bytes) {
    tma_store_nocommit(dst, src, bytes);
    tma_commit();
}

// Shared memory of this block → shared memory of a block of the cluster (dst and mbar are
// shared::cluster addresses), counted on that block's mbarrier.
DEVICE void bulk_copy_smem_to_cluster(u32 dst, u32 src, u32 bytes, u32 mbar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(dst), "r"(src), "r"(bytes), "r"(mbar) : "memory");
}

DEVICE void st_shared_v4(u32 addr, int4 v) {
    asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w) : "memory");
}

DEVICE void st_shared_u32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
