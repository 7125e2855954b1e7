//! Fitting the low-latency kernels to the placement: compiled for the job's hidden size, and
//! their grids the blocks resident at once (every block waits on the others), shared by the
//! ranks of every process on a GPU.

use eptwin_kernels::ModuleId;

use super::{LL_THREADS, LlLaunch, WARPS_PER_GROUP};
use crate::error::HwError;
use crate::family::FamilyContext;
use crate::kernel_defines;
use crate::measurements::LowLatencyKernels;

pub(super) fn fit(ctx: &mut FamilyContext<'_>) -> Result<(LlLaunch, LowLatencyKernels), HwError> {
    let hidden = ctx.deepep.workload.hidden;
    let defines = kernel_defines::low_latency(hidden, LL_THREADS, ctx.scope, ctx.options);
    ctx.compiler.load(ctx.devs, ModuleId::LowLatency, "low_latency", &defines)?;
    let mut dispatch_blocks = Vec::new();
    let mut combine_blocks = Vec::new();
    let (mut registers, mut local_bytes) = ((0, 0), (0, 0));
    for dev in &ctx.devs.list {
        let od = dev.occupancy("low_latency", &["ll_dispatch"], LL_THREADS)?;
        let oc = dev.occupancy("low_latency", &["ll_combine"], LL_THREADS)?;
        if od == 0 || oc == 0 {
            return Err(HwError::Unsupported(
                "the low-latency kernels do not fit one block per SM".into(),
            ));
        }
        // Processes sharing a GPU share its resident blocks by their ranks: every process's
        // blocks must be resident at once (they wait on each other).
        let all = ctx.placement.ranks_on(dev.gpu.ordinal as u32).len() as u32;
        let share = |resident: u32| (resident * dev.ranks.len() as u32 / all).max(1);
        dispatch_blocks.push(share(dev.gpu.sm_count * od));
        combine_blocks.push(share(dev.gpu.sm_count * oc));
        let (rd, ld) = dev.resources("low_latency", &["ll_dispatch"])?;
        let (rc, lc) = dev.resources("low_latency", &["ll_combine"])?;
        registers = (rd, rc);
        local_bytes = (ld, lc);
    }
    let report = LowLatencyKernels {
        threads_per_block: LL_THREADS,
        dispatch_blocks_per_gpu: dispatch_blocks.clone(),
        combine_blocks_per_gpu: combine_blocks.clone(),
        effective_sms_per_rank: ctx.effective_sms_per_rank(),
        registers_per_thread: [registers.0, registers.1],
        local_memory_bytes_per_thread: [local_bytes.0, local_bytes.1],
        warps_per_receive_group: WARPS_PER_GROUP,
    };
    let launch =
        LlLaunch { dispatch_blocks, combine_blocks, threads: LL_THREADS, registers, local_bytes };
    Ok((launch, report))
}
