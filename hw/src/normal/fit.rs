//! Fitting the normal kernels to the placement: where the rings live, the global-ring kernels'
//! block size (every block resident at once, since they wait on each other), the cluster
//! kernels' launch, and across nodes the internode kernels' grid; each compiled for the GPUs.

use eptwin_engine::api::{Config, Dtype};
use eptwin_kernels::ModuleId;

use super::NormalLaunch;
use super::rings::{ClusterRings, RingInputs, cluster_shape};
use crate::crossing::Crossing;
use crate::error::HwError;
use crate::family::FamilyContext;
use crate::kernel_defines;
use crate::measurements::{ClusterKernel, ClusterKernels, KernelReport, NormalKernels, Rings};

/// The launch of the normal kernels on one node and what the result reports of them.
pub(super) fn fit_one_node(
    ctx: &mut FamilyContext<'_>,
) -> Result<(NormalLaunch, KernelReport), HwError> {
    let d = ctx.deepep;
    let (n, w) = (ctx.job.num_ranks(), &d.workload);
    let recv_tokens = |c: &Option<Config>| c.map_or(1, |c| c.num_max_nvl_chunked_recv_tokens);
    let ring_inputs = RingInputs {
        ranks: n,
        one_launch: ctx.one_launch(),
        compute_major: ctx.devs.list[0].gpu.compute_capability.0,
        hidden: w.hidden,
        fp8: w.dispatch_dtype == Dtype::Fp8,
        topk: w.topk,
        dispatch_recv_tokens: recv_tokens(&d.dispatch_config),
        combine_recv_tokens: recv_tokens(&d.combine_config),
    };
    let rings = ClusterRings::choose(&ring_inputs, ctx.options)
        .map_err(|e| HwError::Unsupported(format!("job {:?}: {e}", ctx.job.name)))?;
    let Some(cfg) = d.dispatch_config else {
        return Err(ctx.setup_error("normal mode without a dispatch config".into()));
    };
    let shape = global_ring_shape(ctx, cfg.num_sms, &rings)?;
    let cluster = match rings.any() {
        true => Some(cluster_kernels(ctx, &rings, &ring_inputs, cfg.num_sms)?),
        false => None,
    };
    let (threads, min_blocks, resident) = shape?;
    let (registers, local_bytes) =
        ctx.devs.list[0].resources("intranode", &["intranode_dispatch", "intranode_combine"])?;
    let max_local = ctx.max_ranks_per_gpu();
    let launch = NormalLaunch {
        threads,
        min_blocks,
        blocks_per_rank: cfg.num_sms,
        blocks_per_gpu: max_local * cfg.num_sms,
        resident_blocks_per_sm: resident,
        registers,
        local_bytes,
        rings,
    };
    let combine_slots = d.combine_config.map_or(0, |c| c.num_max_nvl_chunked_recv_tokens);
    let normal = NormalKernels {
        // With both ops on cluster rings (hw.cluster_kernels) only this module's notify
        // kernels run; the shape is the global-ring kernels'.
        global_ring_kernels_run: rings.dispatch_slots.is_none() || rings.combine_slots.is_none(),
        threads_per_block: threads,
        combine_reducer_warps_per_token: kernel_defines::combine_group_warps(
            threads,
            ctx.options.combine_group_warps,
        ),
        l2_eviction_hints: ctx.options.l2_hints,
        blocks_per_rank: launch.blocks_per_rank,
        channels_per_rank: launch.blocks_per_rank / 2,
        blocks_per_gpu: launch.blocks_per_gpu,
        blocks_per_launch: Some(
            ctx.devs.list.iter().map(|dev| dev.ranks.len() as u32 * cfg.num_sms).max().unwrap_or(0),
        ),
        resident_blocks_per_sm: resident,
        effective_sms_per_rank: ctx.effective_sms_per_rank(),
        registers_per_thread: registers,
        local_memory_bytes_per_thread: local_bytes,
        dispatch_rings: Rings::of(rings.dispatch_slots, cfg.num_max_nvl_chunked_recv_tokens),
        combine_rings: Rings::of(rings.combine_slots, combine_slots),
    };
    Ok((launch, KernelReport { normal: Some(normal), cluster, ..KernelReport::default() }))
}

/// The global-ring kernels' (threads, min blocks per SM, resident blocks per SM): the first
/// block size whose grid is resident at once, each candidate compiled and loaded. These
/// kernels wait on each other across blocks, so all their blocks must be resident; with both
/// ops on cluster rings only their notify kernels run, and the cluster kernels' channels never
/// wait on each other, so their clusters may run in waves. The outer error is the compiler's;
/// the inner one says that no block size fits (it is reported after the cluster kernels are
/// fitted, which the result records either way).
fn global_ring_shape(
    ctx: &mut FamilyContext<'_>,
    num_sms: u32,
    rings: &ClusterRings,
) -> Result<Result<(u32, u32, u32), HwError>, HwError> {
    let n = ctx.job.num_ranks();
    let sm_count = ctx.sm_count();
    let per_gpu = ctx.max_ranks_per_gpu() * num_sms;
    let need_resident = !(rings.dispatch_slots.is_some() && rings.combine_slots.is_some());
    let min_blocks = if need_resident { per_gpu.div_ceil(sm_count).max(1) } else { 1 };
    let mut refused = Vec::new();
    for threads in kernel_defines::normal_thread_candidates(n, min_blocks) {
        let defines = kernel_defines::intranode(n, threads, min_blocks, ctx.scope, ctx.options);
        ctx.compiler.load(ctx.devs, ModuleId::Intranode, "intranode", &defines)?;
        let resident = ctx.devs.list[0].occupancy(
            "intranode",
            &["intranode_dispatch", "intranode_combine"],
            threads,
        )?;
        if !need_resident || resident * sm_count >= per_gpu {
            return Ok(Ok((threads, min_blocks, resident)));
        }
        refused.push(format!("{threads} threads: {resident} blocks per SM"));
    }
    Ok(Err(ctx.setup_error(format!(
        "{per_gpu} sender/receiver blocks per GPU cannot all be resident on {sm_count} SMs \
         (they would deadlock): {}",
        refused.join("; ")
    ))))
}

/// Compile the cluster kernels and say how each op on cluster rings launches, and how many of
/// its clusters the GPU holds at once (more channels than that run in waves).
fn cluster_kernels(
    ctx: &mut FamilyContext<'_>,
    rings: &ClusterRings,
    ring: &RingInputs,
    num_sms: u32,
) -> Result<ClusterKernels, HwError> {
    let n = ring.ranks;
    let defines = vec![("NUM_RANKS", n.to_string())];
    ctx.compiler.load(ctx.devs, ModuleId::IntranodeCluster, "intranode_cluster", &defines)?;
    let dev0 = &ctx.devs.list[0];
    let module = dev0.module("intranode_cluster")?;
    let mut kernels = ClusterKernels::default();
    for (dispatch, slots) in [(true, rings.dispatch_slots), (false, rings.combine_slots)] {
        let Some(slots) = slots else { continue };
        let shape = cluster_shape(dispatch, n, ring.hidden, ring.fp8, ring.topk, slots);
        let f = module.function(shape.kernel);
        dev0.gpu.set_max_dynamic_smem(f, shape.smem_bytes)?;
        let resident = dev0.gpu.max_active_clusters(f, n, shape.threads, shape.smem_bytes)?;
        let kernel = ClusterKernel {
            clusters: num_sms / 2,
            blocks_per_cluster: n,
            threads_per_block: shape.threads,
            slots_per_source: slots,
            slot_bytes: shape.slot_bytes,
            dynamic_smem_bytes: shape.smem_bytes,
            resident_clusters: resident,
        };
        match dispatch {
            true => kernels.dispatch = Some(kernel),
            false => kernels.combine = Some(kernel),
        }
    }
    Ok(kernels)
}

/// The launch of the internode kernels (internode.cu) over the wire: every process's blocks on
/// a GPU wait on each other, so all must be resident.
pub(super) fn fit_across_nodes(
    ctx: &mut FamilyContext<'_>,
    crossing: &Crossing,
) -> Result<NormalLaunch, HwError> {
    let geometry = &crossing.geometry;
    let defines = kernel_defines::internode(geometry.ranks_per_node, ctx.scope);
    ctx.compiler.load(ctx.devs, ModuleId::Internode, "internode", &defines)?;
    let threads = kernel_defines::INTERNODE_THREADS;
    let blocks_per_rank = 2 * geometry.num_channels;
    let (sm_count, max_local) = (ctx.sm_count(), ctx.max_ranks_per_gpu());
    let per_gpu = max_local * blocks_per_rank;
    let kernels = ["internode_dispatch", "internode_combine"];
    let resident = ctx.devs.list[0].occupancy("internode", &kernels, threads)?;
    if resident * sm_count < per_gpu {
        return Err(ctx.setup_error(format!(
            "{per_gpu} internode blocks per GPU ({max_local} ranks x {blocks_per_rank}) cannot \
             all be resident on {sm_count} SMs at {resident} per SM (they wait on each other)"
        )));
    }
    let (registers, local_bytes) = ctx.devs.list[0].resources("internode", &kernels)?;
    Ok(NormalLaunch {
        threads,
        min_blocks: 1,
        blocks_per_rank,
        blocks_per_gpu: per_gpu,
        resident_blocks_per_sm: resident,
        registers,
        local_bytes,
        rings: ClusterRings::default(),
    })
}
