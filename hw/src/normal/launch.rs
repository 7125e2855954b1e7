//! The timed ops: parameters, poisoning, the notify + main launches (global-memory or cluster
//! rings), CUDA-event timing, digests and the host-checked iteration.

use eptwin_engine::api::{
    Config, Dtype, OpKind, normal_combine_token_bytes, normal_dispatch_token_bytes,
};
use eptwin_engine::api::{OpSample, PhaseTime};

use super::args::NormalParams;
use super::check::rows_region;
use super::rings::{ClusterShape, cluster_shape};
use super::{NormalJob, payload_bytes};
use crate::data;
use crate::error::HwError;
use crate::exec::{Devices, Timer, dev_of_ref, digest_ranks, record_digest};
use crate::family::OpRun;
use crate::kernel_args;

impl NormalJob {
    /// A dispatch's start, intranode or across nodes: errors cleared, L2 flushed, every rank at
    /// the launch barrier, the timer started and DeepEP's layout kernel (`get_dispatch_layout`)
    /// launched and marked `layout`.
    pub(super) fn start_with_layout(&self, devs: &mut Devices) -> Result<Timer, HwError> {
        devs.clear_errors()?;
        devs.flush_l2()?;
        devs.barrier_before_launch()?;
        let mut timer = Timer::start(devs)?;
        for (i, dev) in devs.list.iter().enumerate() {
            let la = self.layout_args[i].ptr;
            let (nr, ne, nk) = (self.n as i32, self.experts as i32, self.topk as i32);
            let mut a = kernel_args![la, nr, ne, nk];
            let f = dev.module("layout")?.function("get_dispatch_layout");
            // SAFETY: args match get_dispatch_layout; buffers are live.
            unsafe { dev.gpu.launch(f, dev.ranks.len() as u32, 1024, &mut a)? };
        }
        timer.mark(devs, "layout")?;
        Ok(timer)
    }

    fn params(
        &self,
        devs: &Devices,
        dev_index: usize,
        cfg: &Config,
        dispatch: bool,
    ) -> NormalParams {
        let dev = &devs.list[dev_index];
        let l = &self.layout;
        NormalParams {
            timeout_ns: devs.timeout_ns(),
            off_recv_counts: l.recv_counts,
            off_recv_expert_counts: l.recv_expert_counts,
            off_barrier: l.barrier,
            off_d_start: l.d_start,
            off_d_end: l.d_end,
            off_d_head: l.d_head,
            off_d_tail: l.d_tail,
            off_c_head: l.c_head,
            off_c_tail: l.c_tail,
            off_x: l.x,
            off_src_idx: l.src_idx,
            off_topk_idx: l.topk_idx,
            off_topk_weights: l.topk_weights,
            off_scales: l.scales,
            slot_bytes: l.slot_bytes,
            num_channels: self.channels as i32,
            num_experts: self.experts as i32,
            num_topk: self.topk as i32,
            hidden_int4: (payload_bytes(self.hidden, self.fp8) / 16) as i32,
            combine_hidden_int4: (self.hidden * 2 / 16) as i32,
            num_scales: if self.fp8 { (self.hidden / 128) as i32 } else { 0 },
            nvl_send: cfg.num_max_nvl_chunked_send_tokens as i32,
            nvl_recv: cfg.num_max_nvl_chunked_recv_tokens as i32,
            rank_base: dev.rank_base() as i32,
            num_local_ranks: dev.ranks.len() as i32,
            blocks_per_rank: cfg.num_sms as i32,
            // Dropping consumed slots from L2 saves their write-back to HBM
            // (`EPTWIN_L2_DISCARD_DISPATCH=0` keeps them in dispatch; results/h200/README.md).
            use_discard: if dispatch { self.discard_in_dispatch } else { self.use_discard } as i32,
            epoch: self.epoch,
            reserved: 0,
        }
    }

    /// Before the host-checked iteration, poison the ring slots too: earlier iterations left
    /// the same (correct) tokens there, which would hide a slot that is read but never written.
    fn poison_rings(&self, devs: &Devices, gpu_of_rank: &[u32]) -> Result<(), HwError> {
        for (&r, b) in &self.bufs {
            let g = &dev_of_ref(devs, gpu_of_rank[r as usize]).gpu;
            let from = self.layout.x as usize;
            g.memset_u8(b.buffer.at(from), 0xff, self.layout.total as usize - from)?;
        }
        Ok(())
    }

    /// Poison every dispatch output so that an unwritten element cannot pass a check.
    fn poison_dispatch(&self, devs: &Devices, gpu_of_rank: &[u32]) -> Result<(), HwError> {
        for (&r, b) in &self.bufs {
            let g = &dev_of_ref(devs, gpu_of_rank[r as usize]).gpu;
            for buf in [
                &b.recv_x,
                &b.recv_x_scales,
                &b.recv_src_idx,
                &b.recv_topk_idx,
                &b.recv_topk_weights,
                &b.rank_prefix,
                &b.num_recv_tokens,
                &b.num_recv_tokens_per_expert,
                &b.recv_channel_offset,
                &b.channel_prefix_matrix,
            ] {
                g.memset_u8(buf.ptr, 0xff, buf.bytes)?;
            }
            g.memset_u8(b.send_head.ptr, 0x7f, b.send_head.bytes)?;
        }
        Ok(())
    }

    pub fn dispatch(&mut self, devs: &mut Devices, op: &OpRun<'_>) -> Result<OpSample, HwError> {
        if self.across.is_some() {
            return self.dispatch_across(devs, op);
        }
        let (gpu_of_rank, iteration, warmup) = (op.gpu_of_rank, op.iteration, op.warmup);
        self.poison_dispatch(devs, gpu_of_rank)?;
        if op.checked() {
            self.poison_rings(devs, gpu_of_rank)?;
        }
        self.epoch += 1;
        let mut timer = self.start_with_layout(devs)?;
        self.launch_pair(
            devs,
            "intranode_notify_dispatch",
            "intranode_dispatch",
            &mut timer,
            true,
        )?;
        devs.finish("dispatch")?;
        let latency_ns = timer.between_ns("notify", "end")?;
        let mut sample = OpSample::new(op.job, OpKind::Dispatch, iteration, warmup, latency_ns);
        sample.phases = vec![
            PhaseTime { name: "layout".into(), latency_ns: timer.between_ns("start", "layout")? },
            PhaseTime { name: "notify".into(), latency_ns: timer.between_ns("layout", "notify")? },
        ];
        let wire = if self.fp8 { Dtype::Fp8 } else { Dtype::Bf16 };
        sample.nvlink_bytes =
            self.local_received_rows() * normal_dispatch_token_bytes(self.hidden, self.topk, wire);
        self.dispatched = true;

        let per_rank = self.digest_dispatch(devs)?;
        let dg = per_rank.values().fold(0u64, |a, &b| a.wrapping_add(b));
        if !warmup && iteration == 0 && self.launch.rings.dispatch_slots.is_some() {
            self.report_warp_times(devs, "dispatch", 2 * self.n)?;
        }
        let host_check = if !warmup && iteration == 0 {
            self.rank_digests = Some(per_rank);
            Some(self.check_dispatch(devs, gpu_of_rank)?)
        } else {
            None
        };
        record_digest(&mut sample, &mut self.reference_digest[0], dg, "dispatch", host_check);
        Ok(sample)
    }

    /// Launch notify (one block per local rank) then the main kernel on every GPU, with marks
    /// "notify" after the first and "end" after the second.
    fn launch_pair(
        &self,
        devs: &Devices,
        notify: &str,
        main: &str,
        timer: &mut Timer,
        dispatch: bool,
    ) -> Result<(), HwError> {
        let cfg = if dispatch { &self.dispatch_config } else { &self.combine_config };
        for (i, dev) in devs.list.iter().enumerate() {
            let p = self.params(devs, i, cfg, dispatch);
            let (args, err) = (self.args[i].ptr, dev.err.ptr);
            let mut a = kernel_args![args, p, err];
            let f = dev.module("intranode")?.function(notify);
            // SAFETY: args match the kernel's (args, params, err) signature.
            unsafe { dev.gpu.launch(f, dev.ranks.len() as u32, 1024, &mut a)? };
        }
        timer.mark(devs, "notify")?;
        let rings = self.launch.rings;
        let slots = if dispatch { rings.dispatch_slots } else { rings.combine_slots };
        if let Some(slots) = slots {
            let p = self.params(devs, 0, cfg, dispatch);
            let shape = cluster_shape(dispatch, self.n, self.hidden, self.fp8, self.topk, slots);
            self.launch_cluster(&devs.list[0], p, &shape)?;
            return timer.mark(devs, "end");
        }
        for (i, dev) in devs.list.iter().enumerate() {
            let p = self.params(devs, i, cfg, dispatch);
            let (args, err) = (self.args[i].ptr, dev.err.ptr);
            let mut a = kernel_args![args, p, err];
            let f = dev.module("intranode")?.function(main);
            let grid = dev.ranks.len() as u32 * cfg.num_sms;
            // SAFETY: as above; the grid fits co-resident (checked at prepare).
            unsafe { dev.gpu.launch(f, grid, self.launch.threads, &mut a)? };
        }
        timer.mark(devs, "end")
    }

    /// Launch a kernel of `intranode_cluster.cu` (args, params, err, sm_slots, slot_bytes,
    /// warp_ns): one cluster of n blocks per channel.
    fn launch_cluster(
        &self,
        dev: &crate::exec::Device,
        p: NormalParams,
        shape: &ClusterShape,
    ) -> Result<(), HwError> {
        let f = dev.module("intranode_cluster")?.function(shape.kernel);
        dev.gpu.set_max_dynamic_smem(f, shape.smem_bytes)?;
        let (args, err) = (self.args[0].ptr, dev.err.ptr);
        let (sl, sb) = (shape.slots as i32, shape.slot_bytes as i32);
        let times = self.warp_times.as_ref().map(|b| b.ptr).unwrap_or(0);
        let mut a = kernel_args![args, p, err, sl, sb, times];
        let grid = self.channels * self.n;
        let (threads, smem) = (shape.threads, shape.smem_bytes);
        // SAFETY: args match the cluster kernels' (args, params, err, sm_slots, slot_bytes,
        // warp_ns); warp_ns is null or holds (1 + warps) words per block (the
        // combine: 1 + warps + 2 × CLUSTER_TOKEN_STAMPS + n × CLUSTER_RING_STAMPS); the dynamic shared
        // memory is what their layout needs for `slots` of `slot_bytes`; the grid is whole
        // clusters of n blocks (one per channel), which need not be co-resident (channels never
        // wait on each other); `threads` is the kernel's compiled block size.
        unsafe { dev.gpu.launch_with_smem(f, grid, threads, smem, &mut a) }
    }

    pub fn combine(&mut self, devs: &mut Devices, op: &OpRun<'_>) -> Result<OpSample, HwError> {
        let (gpu_of_rank, iteration, warmup) = (op.gpu_of_rank, op.iteration, op.warmup);
        if !self.dispatched {
            let untimed = OpRun { op: OpKind::Dispatch, iteration: 0, warmup: true, ..*op };
            self.dispatch(devs, &untimed)?;
        }
        // Stand-in experts: combine input = dequantised token × a per-rank factor (untimed).
        for (&r, b) in &self.bufs {
            let dev = dev_of_ref(devs, gpu_of_rank[r as usize]);
            let rows = self.expect[r as usize].rows.len() as i32;
            let (src, scales, out) = (b.recv_x.ptr, b.recv_x_scales.ptr, b.combine_x.ptr);
            let (hidden, fp8, factor) =
                (self.hidden as i32, self.fp8 as i32, data::expert_factor(r));
            let mut a = kernel_args![src, scales, rows, hidden, fp8, factor, out];
            let f = dev.module("testdata")?.function("make_expert_output_normal");
            // SAFETY: recv_x holds `rows` rows; combine_x has room for them.
            unsafe { dev.gpu.launch(f, dev.gpu.sm_count * 4, 256, &mut a)? };
            dev.gpu.memset_u8(b.combined_x.ptr, 0xff, b.combined_x.bytes)?;
            dev.gpu.memset_u8(b.combined_topk_weights.ptr, 0xff, b.combined_topk_weights.bytes)?;
        }
        if !warmup && iteration == 0 && self.across.is_none() {
            self.poison_rings(devs, gpu_of_rank)?;
        }
        self.epoch += 1;
        devs.clear_errors()?;
        devs.flush_l2()?;
        devs.barrier_before_launch()?;
        let (latency_ns, phases, rdma_bytes) = if self.across.is_some() {
            self.combine_across_launch(devs)?
        } else {
            let mut timer = Timer::start(devs)?;
            self.launch_pair(
                devs,
                "intranode_notify_combine",
                "intranode_combine",
                &mut timer,
                false,
            )?;
            devs.finish("combine")?;
            let notify = PhaseTime {
                name: "notify".into(),
                latency_ns: timer.between_ns("start", "notify")?,
            };
            (timer.between_ns("notify", "end")?, vec![notify], 0)
        };
        let mut sample = OpSample::new(op.job, OpKind::Combine, iteration, warmup, latency_ns);
        sample.phases = phases;
        sample.rdma_bytes = rdma_bytes;
        sample.nvlink_bytes =
            self.local_received_rows() * normal_combine_token_bytes(self.hidden, self.topk);

        let tokens = self.routing.tokens_per_rank as u64;
        let per_rank = digest_ranks(devs, |r| {
            let b = &self.bufs[&r];
            vec![
                rows_region(b.combined_x.ptr, tokens, self.hidden as u64 * 2),
                rows_region(b.combined_topk_weights.ptr, tokens, self.topk as u64 * 4),
            ]
        })?;
        let dg = per_rank.values().fold(0u64, |a, &b| a.wrapping_add(b));
        if !warmup && iteration == 0 && self.launch.rings.combine_slots.is_some() {
            self.report_warp_times(devs, "combine", 4 * self.n)?;
        }
        let host_check = if !warmup && iteration == 0 {
            self.rank_digests = Some(per_rank);
            Some(self.check_combine(devs, gpu_of_rank)?)
        } else {
            None
        };
        record_digest(&mut sample, &mut self.reference_digest[1], dg, "combine", host_check);
        Ok(sample)
    }
}
