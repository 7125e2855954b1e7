//! The timed ops: parameters, counter resets and poisoning, the launches (send and receive
//! phases apart in hook mode), CUDA-event timing, digests and the host-checked iteration.

use eptwin_engine::api::{Dtype, OpKind, ll_combine_msg_bytes, ll_dispatch_msg_bytes};
use eptwin_engine::api::{OpSample, PhaseTime};

use super::args::LlParams;
use super::{LlJob, PHASE_RECV, PHASE_SEND, WARPS_PER_GROUP};
use crate::crossing::launch_outcome;
use crate::error::HwError;
use crate::exec::{Devices, DigestRegion, Timer, dev_of_ref, digest_ranks, record_digest};
use crate::family::OpRun;
use crate::kernel_args;

impl LlJob {
    fn params(&self, devs: &Devices, i: usize, phases: i32, dispatch: bool) -> LlParams {
        let dev = &devs.list[i];
        LlParams {
            timeout_ns: devs.timeout_ns(),
            msg_bytes: self.msg_bytes,
            combine_slot_bytes: self.combine_slot_bytes,
            num_ranks: self.n as i32,
            num_experts: self.experts as i32,
            num_topk: self.topk as i32,
            max_tokens: self.max_tokens as i32,
            capacity: self.capacity as i32,
            rank_base: dev.rank_base() as i32,
            num_local_ranks: dev.ranks.len() as i32,
            phases,
            use_discard: if dispatch { self.discard_in_dispatch } else { self.use_discard } as i32,
            warps_per_group: WARPS_PER_GROUP,
            dispatch_fp8: self.fp8 as i32,
            reserved: 0,
            wire: self.across.as_ref().map(|a| a.layout).unwrap_or_default(),
            ranks_per_node: self.ranks_per_node().unwrap_or(0) as i32,
            qps_per_peer: self.across.as_ref().map_or(0, |a| a.geometry.qps_per_peer) as i32,
            call: self.across.as_ref().map_or(0, |a| a.calls[!dispatch as usize]) as i32,
            reserved2: 0,
            block_times: self.block_times.get(i).map_or(0, |b| b.ptr),
        }
    }

    /// One timed launch of `kernel` as DeepEP's tests time it: setup synchronised, device error
    /// records cleared, L2 flushed, CUDA events around the launch; in hook mode the send and
    /// receive phases are timed apart.
    fn timed_launch(
        &mut self,
        devs: &mut Devices,
        kernel: &str,
        op: OpKind,
        job_id: eptwin_engine::api::JobId,
        iteration: u32,
        warmup: bool,
    ) -> Result<OpSample, HwError> {
        let what = match op {
            OpKind::Dispatch => "low-latency dispatch",
            _ => "low-latency combine",
        };
        devs.sync(&format!("{what} setup"))?;
        devs.clear_errors()?;
        devs.flush_l2()?;
        devs.barrier_before_launch()?;
        let mut timer = Timer::start(devs)?;
        self.launch(devs, kernel, &mut timer)?;
        let done = devs.finish(what);
        if let Some(a) = self.across.as_mut() {
            a.calls[(op != OpKind::Dispatch) as usize] += 1;
            launch_outcome(done, a.links_mut().health())?;
        } else {
            done?;
        }
        let mut sample =
            OpSample::new(job_id, op, iteration, warmup, timer.between_ns("start", "end")?);
        if self.hook {
            sample.phases = vec![
                PhaseTime { name: "send".into(), latency_ns: timer.between_ns("start", "send")? },
                PhaseTime { name: "recv".into(), latency_ns: timer.between_ns("send", "end")? },
            ];
        }
        Ok(sample)
    }

    /// Launch `kernel` on every GPU; with hook mode the send and receive phases are separate
    /// launches with a mark between them.
    fn launch(&self, devs: &Devices, kernel: &str, timer: &mut Timer) -> Result<(), HwError> {
        let phase_sets: &[(i32, &str)] = if self.hook {
            &[(PHASE_SEND, "send"), (PHASE_RECV, "end")]
        } else {
            &[(PHASE_SEND | PHASE_RECV, "end")]
        };
        for &(phases, mark) in phase_sets {
            for (i, dev) in devs.list.iter().enumerate() {
                let p = self.params(devs, i, phases, kernel == "ll_dispatch");
                let (args, err) = (self.args[i].ptr, dev.err.ptr);
                let mut a = kernel_args![args, p, err];
                let f = dev.module("low_latency")?.function(kernel);
                let grid = if kernel == "ll_dispatch" {
                    self.launch.dispatch_blocks[i]
                } else {
                    self.launch.combine_blocks[i]
                };
                // SAFETY: args match (args, params, err); the grid is at most what is resident.
                unsafe { dev.gpu.launch(f, grid, self.launch.threads, &mut a)? };
            }
            timer.mark(devs, mark)?;
        }
        Ok(())
    }

    pub fn dispatch(&mut self, devs: &mut Devices, op: &OpRun<'_>) -> Result<OpSample, HwError> {
        let (gpu_of_rank, iteration, warmup, job_id) =
            (op.gpu_of_rank, op.iteration, op.warmup, op.job);
        // Counters start at zero (DeepEP's kernels clean them for the next call; here the host
        // does it before the timed region) and outputs are poisoned.
        for (&r, b) in &self.bufs {
            let g = &dev_of_ref(devs, gpu_of_rank[r as usize]).gpu;
            for buf in [&b.atomic_counter, &b.finish_counter, &b.recv_count] {
                g.memset_u8(buf.ptr, 0, buf.bytes)?;
            }
            for buf in [
                &b.packed_recv_x,
                &b.packed_recv_scales,
                &b.packed_recv_src_info,
                &b.packed_recv_slot,
                &b.packed_recv_layout_range,
                &b.packed_recv_count,
            ] {
                g.memset_u8(buf.ptr, 0xff, buf.bytes)?;
            }
            // Earlier iterations left the same messages in the receive slots: poison them before
            // the host-checked iteration so that a message never written cannot pass.
            if !warmup && iteration == 0 {
                g.memset_u8(b.recv_buf.ptr, 0xff, b.recv_buf.bytes)?;
            }
        }
        let mut sample =
            self.timed_launch(devs, "ll_dispatch", OpKind::Dispatch, job_id, iteration, warmup)?;
        let dtype = if self.fp8 { Dtype::Fp8 } else { Dtype::Bf16 };
        // Messages to another node cross the wire, the others stay on "NVLink".
        sample.rdma_bytes = self.across.as_ref().map_or(0, |a| a.rdma_bytes[0]);
        sample.nvlink_bytes = self.local_dispatch_messages()
            * ll_dispatch_msg_bytes(self.hidden, dtype)
            - sample.rdma_bytes;
        self.dispatched = true;

        let pay = if self.fp8 { self.hidden as u64 } else { 2 * self.hidden as u64 };
        let l = (self.experts / self.n) as u64;
        let per_rank = digest_ranks(devs, |r| {
            let mut regions = Vec::new();
            {
                let b = &self.bufs[&r];
                let counts = b.packed_recv_count.ptr;
                let packed = |ptr: u64, row_bytes: u64| DigestRegion {
                    ptr,
                    num_rows: l * self.capacity as u64,
                    row_words: (row_bytes / 4) as i32,
                    row_stride_words: row_bytes / 4,
                    row_counts: counts,
                    rows_per_group: self.capacity as i32,
                };
                regions.push(packed(b.packed_recv_x.ptr, pay));
                if self.fp8 {
                    regions.push(packed(b.packed_recv_scales.ptr, self.hidden as u64 / 128 * 4));
                }
                regions.push(DigestRegion {
                    ptr: b.packed_recv_layout_range.ptr,
                    num_rows: l * self.n as u64,
                    row_words: 2,
                    row_stride_words: 2,
                    row_counts: 0,
                    rows_per_group: 1,
                });
            }
            regions
        })?;
        let dg = per_rank.values().fold(0u64, |a, &b| a.wrapping_add(b));
        let host_check = if !warmup && iteration == 0 {
            self.rank_digests = Some(per_rank);
            Some(self.check_dispatch(devs, gpu_of_rank)?)
        } else {
            None
        };
        record_digest(
            &mut sample,
            &mut self.reference_digest[0],
            dg,
            "low-latency dispatch",
            host_check,
        );
        Ok(sample)
    }

    pub fn combine(&mut self, devs: &mut Devices, op: &OpRun<'_>) -> Result<OpSample, HwError> {
        let (gpu_of_rank, iteration, warmup, job_id) =
            (op.gpu_of_rank, op.iteration, op.warmup, op.job);
        if !self.dispatched {
            let untimed = OpRun { op: OpKind::Dispatch, iteration: 0, warmup: true, ..*op };
            self.dispatch(devs, &untimed)?;
        }
        let l = (self.experts / self.n) as i32;
        for (&r, b) in &self.bufs {
            let dev = dev_of_ref(devs, gpu_of_rank[r as usize]);
            let (px, ps, pc, out) = (
                b.packed_recv_x.ptr,
                b.packed_recv_scales.ptr,
                b.packed_recv_count.ptr,
                b.combine_x.ptr,
            );
            let (cap, base, hidden, fp8) =
                (self.capacity as i32, r as i32 * l, self.hidden as i32, self.fp8 as i32);
            let mut a = kernel_args![px, ps, pc, cap, l, base, hidden, fp8, out];
            let f = dev.module("testdata")?.function("make_expert_output_ll");
            // SAFETY: packed buffers hold l·capacity rows; combine_x has the same shape in bf16.
            unsafe { dev.gpu.launch(f, dev.gpu.sm_count * 4, 256, &mut a)? };
            dev.gpu.memset_u8(b.combine_recv_flag.ptr, 0, b.combine_recv_flag.bytes)?;
            dev.gpu.memset_u8(b.combined_x.ptr, 0xff, b.combined_x.bytes)?;
            if !warmup && iteration == 0 {
                dev.gpu.memset_u8(b.combine_recv_buf.ptr, 0xff, b.combine_recv_buf.bytes)?;
            }
        }
        let mut sample =
            self.timed_launch(devs, "ll_combine", OpKind::Combine, job_id, iteration, warmup)?;
        sample.rdma_bytes = self.across.as_ref().map_or(0, |a| a.rdma_bytes[1]);
        sample.nvlink_bytes = self.local_combine_messages()
            * ll_combine_msg_bytes(self.hidden, Dtype::Bf16)
            - sample.rdma_bytes;

        let tt = self.routing.tokens_per_rank as u64;
        let per_rank = digest_ranks(devs, |r| {
            vec![DigestRegion {
                ptr: self.bufs[&r].combined_x.ptr,
                num_rows: tt,
                row_words: (self.hidden / 2) as i32,
                row_stride_words: self.hidden as u64 / 2,
                row_counts: 0,
                rows_per_group: 1,
            }]
        })?;
        let dg = per_rank.values().fold(0u64, |a, &b| a.wrapping_add(b));
        if !warmup && iteration == 0 {
            self.report_combine_times(devs)?;
        }
        let host_check = if !warmup && iteration == 0 {
            self.rank_digests = Some(per_rank);
            Some(self.check_combine(devs, gpu_of_rank)?)
        } else {
            None
        };
        record_digest(
            &mut sample,
            &mut self.reference_digest[1],
            dg,
            "low-latency combine",
            host_check,
        );
        Ok(sample)
    }
}
