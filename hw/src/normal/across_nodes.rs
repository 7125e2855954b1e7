//! The normal kernels across nodes (kernels/cuda/internode.cu over the CPU-proxy wire): the
//! forwarding rings' NVL buffer layout, the wire (eptwin_wire::protocol::gpu), each rank's counters
//! and forwarder log, the cached receive layout, launches and timing. The host checks are the
//! intranode ones (check.rs): every received row and every combined row against the routing.

use std::collections::BTreeMap;

use eptwin_engine::api::{Dtype, OpKind, normal_combine_token_bytes, normal_dispatch_token_bytes};
use eptwin_engine::api::{OpSample, PhaseTime};

use super::args::{InternodeParams, InternodeRankArgs};
use super::prepare::{alloc_rank_buffers, layout_kernel_args};
use super::{NormalJob, NormalLaunch, NvlLayout, expectations, payload_bytes};
use crate::crossing::{Crossing, launch_outcome, pinned};
use crate::cuda::DeviceBuffer;
use crate::data::{self, RankTokens};
use crate::error::HwError;
use crate::exec::{Devices, Timer, dev_of, dev_of_ref, record_digest};
use crate::family::{FamilyContext, OpRun};
use crate::kernel_args;
use crate::measurements::{InternodeKernels, PerOp};
use eptwin_wire::links::{
    AreaSizes, EndpointExchange, SingleProcess, WireConfig, WireLinks, owned_nodes,
};
use eptwin_wire::protocol::{Geometry, NormalLayout, Traffic};

/// Kinds of per-rank counters kept across calls (`ST_*` in internode.cu).
const STATE_KINDS: u64 = 6;

/// Where the forwarding rings live in a rank's NVL buffer (`InternodeParams::nvl_*`): four
/// int counters per (channel, peer local rank), then the dispatch rings `[channel][forwarder]`
/// and the combine rings `[channel][sender]`, each slot `payload | meta {token, source node} |
/// top-k indices | weights | scales`, 16-byte aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ForwardingRings {
    pub(super) slot_bytes: u64,
    pub(super) meta: u64,
    pub(super) topk_idx: u64,
    pub(super) topk_weights: u64,
    pub(super) scales: u64,
    pub(super) counters: u64,
    pub(super) dispatch_slots: u64,
    pub(super) combine_slots: u64,
    pub(super) total: u64,
    /// Slots per ring: the larger of the dispatch and combine configs' `nvl_recv`.
    pub(super) ring_slots: u64,
}

impl ForwardingRings {
    pub(super) fn new(
        channels: u64,
        ranks_per_node: u64,
        payload_bytes: u64,
        topk: u64,
        scales: u64,
        ring_slots: u64,
    ) -> ForwardingRings {
        let align = |v: u64, a: u64| v.div_ceil(a) * a;
        let meta = align(payload_bytes, 16);
        let topk_idx = meta + 8;
        let topk_weights = topk_idx + 4 * topk;
        let scales_at = topk_weights + 4 * topk;
        let slot_bytes = align(scales_at + 4 * scales, 16);
        let counters = 0;
        let rings = channels * ranks_per_node * ring_slots;
        let dispatch_slots = align(counters + 4 * 4 * channels * ranks_per_node, 128);
        let combine_slots = align(dispatch_slots + rings * slot_bytes, 128);
        let total = align(combine_slots + rings * slot_bytes, 128);
        ForwardingRings {
            slot_bytes,
            meta,
            topk_idx,
            topk_weights,
            scales: scales_at,
            counters,
            dispatch_slots,
            combine_slots,
            total,
            ring_slots,
        }
    }
}

/// A normal job whose ranks span nodes: the wire and the device state of its ranks.
pub(super) struct AcrossNodes {
    /// Dropped first: the proxies and wire threads stop before any buffer they touch goes.
    /// Connected by [`NormalJob::connect`] (collective with the other processes).
    pub(super) links: Option<WireLinks>,
    pub(super) geometry: Geometry,
    pub(super) wire: NormalLayout,
    pub(super) rings: ForwardingRings,
    config: WireConfig,
    /// Per GPU: every rank's `InternodeRankArgs` (this process's ranks; the others' are
    /// zero: the kernels only reach ranks of their own node, which this process runs).
    args: Vec<DeviceBuffer>,
    /// Per local rank: counters kept across calls, the forwarder's log, the doorbell ticket.
    state: BTreeMap<u32, DeviceBuffer>,
    fwd_log: BTreeMap<u32, DeviceBuffer>,
    tickets: BTreeMap<u32, DeviceBuffer>,
    fwd_log_stride: u64,
    /// Wire bytes of one dispatch and one combine sent by this process's ranks (tokens that
    /// leave their node).
    rdma_bytes: [u64; 2],
}

/// Tokens of the source ranks `sources` that cross to another node, once per destination
/// node.
fn tokens_crossing(
    routing: &eptwin_engine::api::RoutingTable,
    g: &Geometry,
    sources: impl Iterator<Item = u32>,
) -> u64 {
    let mut count = 0u64;
    let mut nodes = Vec::new();
    for s in sources {
        for t in 0..routing.tokens_per_rank {
            nodes.clear();
            for &e in routing.experts(s, t) {
                if e >= 0 {
                    nodes.push(g.node_of(routing.rank_of_expert(e as u32)));
                }
            }
            nodes.sort_unstable();
            nodes.dedup();
            count += nodes.iter().filter(|&&n| n != g.node_of(s)).count() as u64;
        }
    }
    count
}

impl NormalJob {
    /// Set a job up whose ranks span nodes: this process's ranks' buffers (whole nodes), the
    /// cached receive layout and the per-rank counters. The wire between the nodes and the
    /// kernels' argument arrays come in [`NormalJob::connect`].
    pub fn prepare_across_nodes(
        ctx: &mut FamilyContext<'_>,
        launch: NormalLaunch,
        crossing: &Crossing,
    ) -> Result<NormalJob, HwError> {
        let (job, d) = (ctx.job, ctx.deepep);
        let (devs, gpu_of_rank) = (&mut *ctx.devs, ctx.placement.gpu_of_rank.as_slice());
        let (geometry, config) = (crossing.geometry.clone(), crossing.config.clone());
        let n = job.num_ranks();
        let w = &d.workload;
        let setup =
            |m: String| HwError::Setup { context: format!("job {:?}", job.name), message: m };
        let (Some(dc), Some(cc)) = (d.dispatch_config, d.combine_config) else {
            return Err(setup("normal mode without dispatch/combine configs".into()));
        };
        if w.combine_dtype != Dtype::Bf16 {
            return Err(HwError::Unsupported(format!(
                "normal combine in {:?}: the hardware backend implements BF16 combine",
                w.combine_dtype
            )));
        }
        let fp8 = geometry.dispatch_dtype == eptwin_wire::protocol::TokenDtype::Fp8;
        let rpn = geometry.ranks_per_node;
        if rpn > 8 || geometry.num_nodes() > 16 || w.topk > 32 || !w.hidden.is_multiple_of(128) {
            return Err(HwError::Unsupported(format!(
                "job {:?}: the internode kernels take ≤ 8 ranks per node, ≤ 16 nodes, top-k ≤ 32 \
                 and hidden % 128 == 0 ({rpn} ranks per node, {} nodes, top-{}, hidden {})",
                job.name,
                geometry.num_nodes(),
                w.topk,
                w.hidden
            )));
        }
        let channels = geometry.num_channels;
        let wire = NormalLayout::new(&geometry);
        let routing = d.routing().clone();
        // Rows land by source rank, then channel, then token: DeepEP's layout, the same as
        // intranode's, given to the kernels as a cached handle.
        let expect = expectations(&routing, channels);
        let tokens: Vec<RankTokens> = data::generate_ranks(w, n);
        let payload = payload_bytes(w.hidden, fp8).max(2 * w.hidden as u64);
        let scales = if fp8 { w.hidden / 128 } else { 0 };
        let ring_slots =
            dc.num_max_nvl_chunked_recv_tokens.max(cc.num_max_nvl_chunked_recv_tokens) as u64;
        let rings = ForwardingRings::new(
            channels as u64,
            rpn as u64,
            payload,
            w.topk as u64,
            scales as u64,
            ring_slots,
        );
        let bufs = alloc_rank_buffers(
            devs,
            gpu_of_rank,
            w,
            &routing,
            &tokens,
            &expect,
            fp8,
            channels,
            rings.total as usize,
        )?;
        for (&r, b) in &bufs {
            let g = &dev_of_ref(devs, gpu_of_rank[r as usize]).gpu;
            g.upload(&b.rank_prefix, &expect[r as usize].rank_prefix)?;
            g.upload(&b.recv_channel_offset, &expect[r as usize].channel_offset)?;
        }
        let fwd_log_stride = w.tokens_per_rank.div_ceil(channels.max(1)).max(1) as u64;
        let state_words = (STATE_KINDS * geometry.num_nodes() as u64 * channels as u64) as usize;
        let log_words = (geometry.num_nodes() as u64 * channels as u64 * fwd_log_stride) as usize;
        let (mut state, mut fwd_log, mut tickets) =
            (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        for &r in bufs.keys() {
            let g = &dev_of(devs, gpu_of_rank[r as usize]).gpu;
            let s = g.alloc(state_words * 8)?;
            g.memset_u8(s.ptr, 0, s.bytes)?;
            let t = g.alloc(8)?;
            g.memset_u8(t.ptr, 0, t.bytes)?;
            state.insert(r, s);
            fwd_log.insert(r, g.alloc(log_words * 8)?);
            tickets.insert(r, t);
        }
        let t = w.tokens_per_rank as usize;
        let layout_args = layout_kernel_args(devs, &bufs, t)?;
        devs.sync("internode setup")?;
        let crossing = tokens_crossing(&routing, &geometry, bufs.keys().copied());
        let rdma_bytes = [
            crossing * normal_dispatch_token_bytes(w.hidden, w.topk, w.dispatch_dtype),
            crossing * normal_combine_token_bytes(w.hidden, w.topk),
        ];
        Ok(NormalJob {
            n,
            hidden: w.hidden,
            topk: w.topk,
            experts: w.experts,
            channels,
            dispatch_config: dc,
            combine_config: cc,
            fp8,
            // The intranode NVL layout is not used across nodes (`ForwardingRings` is); kept
            // so that the job's shape is described one way.
            layout: NvlLayout::new(0, 0, 0, 0, 0, 0, 0),
            tokens,
            routing,
            expect,
            bufs,
            args: Vec::new(),
            layout_args,
            peers: None,
            epoch: 0,
            use_discard: false,
            discard_in_dispatch: false,
            dispatched: false,
            reference_digest: [None, None],
            rank_digests: None,
            warp_times: None,
            launch,
            across: Some(Box::new(AcrossNodes {
                links: None,
                geometry,
                wire,
                rings,
                config,
                args: Vec::new(),
                state,
                fwd_log,
                tickets,
                fwd_log_stride,
                rdma_bytes,
            })),
        })
    }

    /// The wire between the nodes (endpoints swapped with the other processes through
    /// `procs`, or within this process) and the kernels' argument arrays. Collective in a
    /// multi-process run.
    pub(super) fn connect_across(
        &mut self,
        devs: &Devices,
        procs: Option<&mut crate::processes::Processes>,
    ) -> Result<(), HwError> {
        let fp8 = self.fp8;
        let t = self.routing.tokens_per_rank as i32;
        let a = self.across.as_mut().expect("across nodes");
        let local: Vec<u32> = self.bufs.keys().copied().collect();
        let owned = owned_nodes(&a.geometry, &local)?;
        let sizes = AreaSizes {
            recv_area_bytes: a.wire.recv_area_bytes,
            send_area_bytes: a.wire.send_area_bytes,
        };
        let exchange: &mut dyn EndpointExchange = match procs {
            Some(p) => p,
            None => &mut SingleProcess,
        };
        let links = WireLinks::connect(
            &pinned(&devs.list[0].gpu),
            &owned,
            &a.geometry,
            Traffic::Normal,
            sizes,
            &a.config,
            exchange,
        )?;
        let all_args: Vec<InternodeRankArgs> = (0..self.n)
            .map(|r| {
                let Some(b) = self.bufs.get(&r) else {
                    return InternodeRankArgs { num_tokens: t, ..InternodeRankArgs::default() };
                };
                let rw = links.rank(r);
                InternodeRankArgs {
                    x: b.x.ptr,
                    x_scales: if fp8 { b.x_scales.ptr } else { 0 },
                    topk_idx: b.topk_idx.ptr,
                    topk_weights: b.topk_weights.ptr,
                    is_token_in_rank: b.is_token_in_rank.ptr,
                    recv_rank_prefix: b.rank_prefix.ptr,
                    recv_channel_offset: b.recv_channel_offset.ptr,
                    num_recv_tokens: b.num_recv_tokens.ptr,
                    num_recv_tokens_per_expert: b.num_recv_tokens_per_expert.ptr,
                    recv_x: b.recv_x.ptr,
                    recv_x_scales: b.recv_x_scales.ptr,
                    recv_src_idx: b.recv_src_idx.ptr,
                    recv_topk_idx: b.recv_topk_idx.ptr,
                    recv_topk_weights: b.recv_topk_weights.ptr,
                    combine_x: b.combine_x.ptr,
                    combine_topk_weights: b.recv_topk_weights.ptr,
                    combined_x: b.combined_x.ptr,
                    combined_topk_weights: b.combined_topk_weights.ptr,
                    nvl: b.buffer.ptr,
                    fwd_log: a.fwd_log[&r].ptr,
                    state: a.state[&r].ptr,
                    recv_area: rw.recv_area,
                    send_area: rw.send_area,
                    ring_slots: rw.ring_slots,
                    ring_ticket: a.tickets[&r].ptr,
                    ring_mask: rw.ring_mask,
                    recv_area_offset: rw.recv_area_offset,
                    send_area_offset: rw.send_area_offset,
                    num_tokens: t,
                    reserved: 0,
                }
            })
            .collect();
        let mut args = Vec::new();
        for dev in &devs.list {
            args.push(dev.gpu.alloc_from(&all_args)?);
        }
        devs.sync("internode arguments")?;
        a.args = args;
        a.links = Some(links);
        Ok(())
    }

    /// `hw.internode_kernels` for the result, when this job crosses nodes.
    pub fn across_nodes_kernels(&self, effective_sms_per_rank: f64) -> Option<InternodeKernels> {
        let a = self.across.as_ref()?;
        let l = &self.launch;
        Some(InternodeKernels {
            threads_per_block: l.threads,
            blocks_per_rank: l.blocks_per_rank,
            channels_per_rank: self.channels,
            ranks_per_node: a.geometry.ranks_per_node,
            nodes: a.geometry.num_nodes(),
            nvl_ring_slots: a.rings.ring_slots,
            rdma_ring_slots: PerOp {
                dispatch: a.wire.dispatch_ring_slots,
                combine: a.wire.combine_ring_slots,
            },
            rdma_send_tokens: PerOp {
                dispatch: a.wire.dispatch_send_tokens,
                combine: a.wire.combine_send_tokens,
            },
            recv_area_bytes: a.wire.recv_area_bytes,
            send_area_bytes: a.wire.send_area_bytes,
            receive_layout: "cached (DeepEP's handle path): rows by source rank, channel, token, \
                             from the routing"
                .into(),
            registers_per_thread: l.registers,
            local_memory_bytes_per_thread: l.local_bytes,
            resident_blocks_per_sm: l.resident_blocks_per_sm,
            effective_sms_per_rank,
        })
    }

    /// The wire's kind (`backend.wire`) when this job crosses nodes.
    pub fn wire_report(&self) -> Option<&eptwin_wire::WireReport> {
        self.across.as_ref()?.links.as_ref().map(|l| l.report())
    }

    fn across_params(&self, devs: &Devices, dev_index: usize, dispatch: bool) -> InternodeParams {
        let a = self.across.as_ref().expect("across nodes");
        let dev = &devs.list[dev_index];
        let cfg = if dispatch { &self.dispatch_config } else { &self.combine_config };
        InternodeParams {
            wire: a.wire,
            timeout_ns: devs.timeout_ns(),
            nvl_slot_bytes: a.rings.slot_bytes,
            nvl_meta_offset: a.rings.meta,
            nvl_topk_idx_offset: a.rings.topk_idx,
            nvl_topk_weights_offset: a.rings.topk_weights,
            nvl_scales_offset: a.rings.scales,
            nvl_counters_offset: a.rings.counters,
            nvl_dispatch_slots_offset: a.rings.dispatch_slots,
            nvl_combine_slots_offset: a.rings.combine_slots,
            fwd_log_stride: a.fwd_log_stride,
            num_ranks: self.n as i32,
            num_nodes: a.geometry.num_nodes() as i32,
            num_channels: self.channels as i32,
            num_experts: self.experts as i32,
            num_topk: self.topk as i32,
            hidden_int4: (payload_bytes(self.hidden, self.fp8) / 16) as i32,
            combine_hidden_int4: (self.hidden * 2 / 16) as i32,
            num_scales: if self.fp8 { (self.hidden / 128) as i32 } else { 0 },
            nvl_recv: cfg.num_max_nvl_chunked_recv_tokens as i32,
            rank_base: dev.rank_base() as i32,
            num_local_ranks: dev.ranks.len() as i32,
            qps_per_peer: a.geometry.qps_per_peer as i32,
        }
    }

    /// Launch `internode_dispatch` or `internode_combine` on every GPU, then mark "end".
    fn launch_across(
        &self,
        devs: &Devices,
        dispatch: bool,
        timer: &mut Timer,
    ) -> Result<(), HwError> {
        let a = self.across.as_ref().expect("across nodes");
        let kernel = if dispatch { "internode_dispatch" } else { "internode_combine" };
        for (i, dev) in devs.list.iter().enumerate() {
            let p = self.across_params(devs, i, dispatch);
            let (args, err) = (a.args[i].ptr, dev.err.ptr);
            let mut k = kernel_args![args, p, err];
            let f = dev.module("internode")?.function(kernel);
            let grid = dev.ranks.len() as u32 * self.launch.blocks_per_rank;
            // SAFETY: args match (args, params, err); every rank's pointers are live; the grid
            // is resident at once (checked at prepare).
            unsafe { dev.gpu.launch(f, grid, self.launch.threads, &mut k)? };
        }
        timer.mark(devs, "end")
    }

    /// Wait for the launch; a kernel that gave up waiting is explained by the wire's failure
    /// when the wire failed.
    fn finish_across(&mut self, devs: &Devices, op: &str) -> Result<(), HwError> {
        let done = devs.finish(op);
        let health = self
            .across
            .as_mut()
            .and_then(|a| a.links.as_mut())
            .expect("the wire is connected before any launch")
            .health();
        launch_outcome(done, health)
    }

    /// One timed dispatch across nodes: the layout kernel, then `internode_dispatch`.
    pub(super) fn dispatch_across(
        &mut self,
        devs: &mut Devices,
        op: &OpRun<'_>,
    ) -> Result<OpSample, HwError> {
        let (checked, gpu_of_rank) = (op.checked(), op.gpu_of_rank);
        for (&r, b) in &self.bufs {
            let g = &dev_of_ref(devs, gpu_of_rank[r as usize]).gpu;
            for buf in [
                &b.recv_x,
                &b.recv_x_scales,
                &b.recv_src_idx,
                &b.recv_topk_idx,
                &b.recv_topk_weights,
            ] {
                g.memset_u8(buf.ptr, 0xff, buf.bytes)?;
            }
            // Counted by the receivers.
            g.memset_u8(b.num_recv_tokens.ptr, 0, b.num_recv_tokens.bytes)?;
            g.memset_u8(b.num_recv_tokens_per_expert.ptr, 0, b.num_recv_tokens_per_expert.bytes)?;
            if checked {
                // Earlier iterations left the same tokens in the forwarding rings' slots.
                let rings = self.across.as_ref().expect("across nodes").rings;
                let from = rings.dispatch_slots as usize;
                g.memset_u8(b.buffer.at(from), 0xff, rings.total as usize - from)?;
            }
        }
        let mut timer = self.start_with_layout(devs)?;
        self.launch_across(devs, true, &mut timer)?;
        self.finish_across(devs, "internode dispatch")?;
        let latency_ns = timer.between_ns("layout", "end")?;
        let mut sample =
            OpSample::new(op.job, OpKind::Dispatch, op.iteration, op.warmup, latency_ns);
        sample.phases = vec![PhaseTime {
            name: "layout".into(),
            latency_ns: timer.between_ns("start", "layout")?,
        }];
        let wire = if self.fp8 { Dtype::Fp8 } else { Dtype::Bf16 };
        sample.nvlink_bytes =
            self.local_received_rows() * normal_dispatch_token_bytes(self.hidden, self.topk, wire);
        sample.rdma_bytes = self.across.as_ref().expect("across nodes").rdma_bytes[0];
        self.dispatched = true;
        let per_rank = self.digest_dispatch(devs)?;
        let dg = per_rank.values().fold(0u64, |a, &b| a.wrapping_add(b));
        let host_check = if checked {
            self.rank_digests = Some(per_rank);
            Some(self.check_dispatch(devs, gpu_of_rank)?)
        } else {
            None
        };
        record_digest(&mut sample, &mut self.reference_digest[0], dg, "dispatch", host_check);
        Ok(sample)
    }

    /// The timed part of a combine across nodes: `internode_combine` alone. Returns the
    /// latency, the phases and the wire bytes.
    pub(super) fn combine_across_launch(
        &mut self,
        devs: &mut Devices,
    ) -> Result<(f64, Vec<PhaseTime>, u64), HwError> {
        let mut timer = Timer::start(devs)?;
        self.launch_across(devs, false, &mut timer)?;
        self.finish_across(devs, "internode combine")?;
        let latency_ns = timer.between_ns("start", "end")?;
        let rdma = self.across.as_ref().expect("across nodes").rdma_bytes[1];
        Ok((latency_ns, Vec::new(), rdma))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarding_ring_slots_are_aligned_and_disjoint() {
        // FP8 hidden 7168 (combine payload 14336 is larger), top-8, 56 scales, 12 channels.
        let r = ForwardingRings::new(12, 8, 14336, 8, 56, 16);
        assert_eq!(r.meta, 14336);
        assert_eq!((r.topk_idx, r.topk_weights, r.scales), (14344, 14376, 14408));
        assert_eq!(r.slot_bytes, (14408u64 + 224).div_ceil(16) * 16);
        assert!(r.dispatch_slots >= 16 * 12 * 8);
        assert_eq!(r.combine_slots, r.dispatch_slots + 12 * 8 * 16 * r.slot_bytes);
        assert_eq!(r.total, r.combine_slots + 12 * 8 * 16 * r.slot_bytes);
        for off in [r.dispatch_slots, r.combine_slots, r.total] {
            assert_eq!(off % 128, 0);
        }
        for off in [r.meta, r.topk_idx, r.slot_bytes] {
            assert_eq!(off % 8, 0, "8-byte fields stay aligned");
        }
    }

    #[test]
    fn crossing_tokens_count_each_remote_node_once() {
        let spec = eptwin_engine::api::Workload {
            seed: 3,
            ..eptwin_engine::api::Workload::new(50, 256, 4, 32)
        };
        let routing = eptwin_engine::api::generate_routing(&spec, 8);
        let g = Geometry {
            num_ranks: 8,
            ranks_per_node: 4,
            hidden: 256,
            topk: 4,
            num_experts: 32,
            tokens_per_rank: 50,
            max_tokens_per_rank: 50,
            dispatch_dtype: eptwin_wire::protocol::TokenDtype::Fp8,
            num_channels: 2,
            rdma_send_tokens: 2,
            rdma_recv_tokens: 4,
            combine_rdma_send_tokens: 2,
            combine_rdma_recv_tokens: 4,
            qps_per_peer: 4,
        };
        let mut want = 0;
        for s in 0..8 {
            for t in 0..50 {
                let other = routing
                    .experts(s, t)
                    .iter()
                    .any(|&e| e >= 0 && routing.rank_of_expert(e as u32) / 4 != s / 4);
                want += other as u64;
            }
        }
        assert_eq!(tokens_crossing(&routing, &g, 0..8), want, "two nodes: at most one remote node");
    }
}
