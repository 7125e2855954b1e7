//! GPUs and the paths between them: NVLink through the NVSwitch (per-GPU egress and ingress
//! ports: contention happens where several senders share one GPU's port), PCIe peer-to-peer,
//! and device-local copies through HBM (the only path between ranks that share a GPU).
//!
//! A copy is chunk-level, not 128-byte packets: it reserves its bytes on a FIFO server per stage
//! (egress then ingress, cut-through: the far side starts one latency after the near side) and
//! completes when its last byte is in. The issuing warp or SM is itself a rate limit: the copy
//! cannot finish before `bytes / issuer_rate`, and the issuer stays busy until its data has left
//! the egress port (stores stall when the link pushes back). The far-side reservation is made in
//! arrival order (an event when the near side starts later than now), so a copy queued behind a
//! busy egress never holds the far side idle for others.

use crate::core::slab::Slab;
use crate::core::time::{Rate, Time, fmt_us};
use crate::core::{Action, Core, Ev, ProgId};

/// A FIFO server with a rate: a link direction, a copy engine.
#[derive(Debug, Clone, Copy)]
pub struct Server {
    pub rate: Rate,
    pub free: Time,
    pub busy_ps: Time,
    pub bytes: u64,
}

impl Server {
    pub fn new(rate: Rate) -> Server {
        Server { rate, free: 0, busy_ps: 0, bytes: 0 }
    }

    /// Reserve `bytes` from `ready` on: (start, end).
    #[inline]
    pub fn reserve(&mut self, ready: Time, bytes: u64) -> (Time, Time) {
        let d = self.rate.time(bytes);
        self.reserve_for(ready, bytes, d)
    }

    /// Reserve `d` of service for `bytes` from `ready` on (work that costs more or less than
    /// its bytes at the server's rate): (start, end).
    #[inline]
    pub fn reserve_for(&mut self, ready: Time, bytes: u64, d: Time) -> (Time, Time) {
        let start = ready.max(self.free);
        self.free = start + d;
        self.busy_ps += d;
        self.bytes += bytes;
        (start, start + d)
    }
}

/// The L2's time for SM-side `l2_bytes` (at `l2`) and `dram_bytes` of HBM traffic (at
/// `l2_hbm`: fills and write-backs pass through the L2 as well).
pub fn l2_work(l2: Rate, l2_hbm: Option<Rate>, l2_bytes: u64, dram_bytes: u64) -> Time {
    l2.time(l2_bytes) + l2_hbm.map_or(0, |r| r.time(dram_bytes))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// Same physical GPU (a rank's own buffers, or co-located ranks): HBM copy.
    Local,
    Nvlink,
    Pcie,
}

#[derive(Debug, Clone)]
pub struct Gpu {
    pub nvl_tx: Server,
    pub nvl_rx: Server,
    pub pcie_tx: Server,
    pub pcie_rx: Server,
    /// Device-local copies (bounded by the memcpy rate, shared by co-located ranks).
    pub hbm: Server,
    /// The one-GPU memory model (`sm_copy`): SM-side L2 traffic and HBM traffic of SM-driven
    /// copies, each a server of its own (rates set by the one-GPU programs from the profile).
    pub l2: Server,
    /// L2 time per byte of HBM traffic (fills, write-backs), on top of the SM-side bytes.
    pub l2_hbm: Option<Rate>,
    pub dram: Server,
    /// Per SM: its load/store port (empty until a one-GPU program sizes it).
    pub sms: Vec<Server>,
}

/// A copy waiting for its far-side reservation.
#[derive(Debug, Clone, Copy)]
pub struct Xfer {
    pub dst_gpu: u32,
    pub kind: PathKind,
    pub bytes: u64,
    /// What the bytes cost the link, in bytes at its rate (more than `bytes` where their
    /// packets carry less than a full payload).
    pub link_bytes: u64,
    /// End of the near side (and of the issuer's own rate limit).
    pub near_end: Time,
    pub done: Action,
    pub prog: ProgId,
}

pub struct Gpus {
    pub gpus: Vec<Gpu>,
    pub xfers: Slab<Xfer>,
}

impl Gpus {
    pub fn new(count: u32, nvl: Rate, pcie: Rate, hbm: Rate) -> Gpus {
        let gpu = Gpu {
            nvl_tx: Server::new(nvl),
            nvl_rx: Server::new(nvl),
            pcie_tx: Server::new(pcie),
            pcie_rx: Server::new(pcie),
            hbm: Server::new(hbm),
            l2: Server::new(hbm),
            l2_hbm: None,
            dram: Server::new(hbm),
            sms: Vec::new(),
        };
        Gpus { gpus: vec![gpu; count as usize], xfers: Slab::default() }
    }
}

impl Core {
    /// Copy `bytes` from `src` to `dst` GPU over `kind`, issued at `at` (≥ now) by an issuer
    /// sustaining `issuer`; `done` runs when the last byte is visible at the destination.
    /// Returns when the issuer is free again. `prog` is charged the bytes when `count` is set
    /// (transfers between different ranks count as NVLink bytes).
    #[allow(clippy::too_many_arguments)]
    pub fn copy(
        &mut self,
        at: Time,
        src: u32,
        dst: u32,
        kind: PathKind,
        bytes: u64,
        issuer: Rate,
        done: Action,
        prog: ProgId,
        count: bool,
    ) -> Time {
        self.copy_on_link(at, src, dst, kind, bytes, bytes, issuer, done, prog, count)
    }

    /// [`Core::copy`] of `bytes` that cost a link (NVLink, PCIe) `link_bytes` at its rate: the
    /// stores' packets carry less than a full payload.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_on_link(
        &mut self,
        at: Time,
        src: u32,
        dst: u32,
        kind: PathKind,
        bytes: u64,
        link_bytes: u64,
        issuer: Rate,
        done: Action,
        prog: ProgId,
        count: bool,
    ) -> Time {
        let at = at.max(self.now);
        self.ensure_op(prog);
        let ob = &mut self.op_bytes[prog as usize];
        ob.copies_issued += bytes;
        if count {
            ob.nvlink += bytes;
        }
        let issue_end = at + issuer.time(bytes);
        if self.trace.is_some() {
            self.trace_copy(at, src, dst, kind, bytes, issue_end);
        }
        match kind {
            PathKind::Local => {
                let (_, end) = self.gpus.gpus[src as usize].hbm.reserve(at, bytes);
                let end = end.max(issue_end);
                self.copy_done_at(end, bytes, done, prog);
                end
            }
            PathKind::Nvlink | PathKind::Pcie => {
                let g = &mut self.gpus.gpus[src as usize];
                let server = if kind == PathKind::Nvlink { &mut g.nvl_tx } else { &mut g.pcie_tx };
                let (start, end) = server.reserve_for(at, bytes, server.rate.time(link_bytes));
                let near_end = end.max(issue_end);
                let x = Xfer { dst_gpu: dst, kind, bytes, link_bytes, near_end, done, prog };
                if start <= at && at == self.now {
                    self.far_side(x, start);
                } else {
                    let id = self.gpus.xfers.insert(x);
                    self.push(start, Ev::Stage2(id));
                }
                near_end
            }
        }
    }

    /// Memory traffic of SMs on one GPU (the one-GPU model): `l2_bytes` loaded and stored
    /// through SM `sm`'s port and L2, `dram_bytes` read from or written back to HBM, issued at
    /// `at` (≥ now) by warps that need `issue` on their own (their latency chain); `l2_extra` is
    /// L2 work beyond what the bytes cost at the L2's rates (ring handoffs, discards). Done when
    /// the slowest of the four is: each server is FIFO, so concurrent traffic queues for its
    /// bandwidth. `done` runs then; `nvl_bytes` are charged to `prog` as transport bytes
    /// between ranks.
    #[allow(clippy::too_many_arguments)]
    pub fn sm_traffic(
        &mut self,
        at: Time,
        gpu: u32,
        sm: u32,
        l2_bytes: u64,
        dram_bytes: u64,
        l2_extra: Time,
        issue: Time,
        done: Action,
        prog: ProgId,
        nvl_bytes: u64,
    ) -> Time {
        let at = at.max(self.now);
        self.ensure_op(prog);
        let ob = &mut self.op_bytes[prog as usize];
        ob.copies_issued += l2_bytes;
        ob.nvlink += nvl_bytes;
        let g = &mut self.gpus.gpus[gpu as usize];
        let mut end = at + issue;
        let l2_time = l2_work(g.l2.rate, g.l2_hbm, l2_bytes, dram_bytes) + l2_extra;
        if l2_time > 0 {
            end = end.max(g.l2.reserve_for(at, l2_bytes, l2_time).1);
        }
        if l2_bytes > 0
            && let Some(port) = g.sms.get_mut(sm as usize)
        {
            end = end.max(port.reserve(at, l2_bytes).1);
        }
        if dram_bytes > 0 {
            end = end.max(g.dram.reserve(at, dram_bytes).1);
        }
        if self.trace.is_some() {
            self.trace_copy(at, gpu, gpu, PathKind::Local, l2_bytes, end);
        }
        self.copy_done_at(end, l2_bytes, done, prog);
        end
    }

    /// When GPU `gpu`'s HBM server is done with the work reserved on it so far.
    pub fn hbm_free_at(&self, gpu: u32) -> Time {
        self.gpus.gpus[gpu as usize].dram.free
    }

    /// What `sm_traffic` would charge the busier of GPU `gpu`'s L2 and HBM servers for these
    /// bytes: a step's work on the whole GPU's memory, for models that share it out
    /// themselves (hwkernels/sharing.rs).
    pub fn sm_work(&self, gpu: u32, l2_bytes: u64, dram_bytes: u64, l2_extra: Time) -> Time {
        let g = &self.gpus.gpus[gpu as usize];
        (l2_work(g.l2.rate, g.l2_hbm, l2_bytes, dram_bytes) + l2_extra)
            .max(g.dram.rate.time(dram_bytes))
    }

    /// Trace a copy on its source GPU's NVLink (or HBM) track: issue to the issuer's end.
    fn trace_copy(&mut self, at: Time, src: u32, dst: u32, kind: PathKind, bytes: u64, end: Time) {
        use crate::trace::{PID_GPU, TID_HBM, TID_NVLINK};
        let (tid, tname) = match kind {
            PathKind::Local => (TID_HBM, "HBM copies"),
            PathKind::Nvlink => (TID_NVLINK, "NVLink egress"),
            PathKind::Pcie => (TID_NVLINK, "PCIe P2P egress"),
        };
        let pid = PID_GPU + src;
        let tr = self.trace.as_mut().expect("tracing");
        tr.name_process(pid, &format!("GPU {src}"));
        tr.name_thread(pid, tid, tname);
        let args = crate::trace::SpanArgs::Bytes { bytes };
        tr.span(pid, tid, &format!("copy to GPU {dst}"), at, end, args);
    }

    fn latency_of(&self, kind: PathKind) -> Time {
        match kind {
            PathKind::Local => 0,
            PathKind::Nvlink => self.params.nvl_latency,
            // GPU → PCIe switch → GPU.
            PathKind::Pcie => 2 * self.params.pcie_latency,
        }
    }

    fn far_side(&mut self, x: Xfer, near_start: Time) {
        let lat = self.latency_of(x.kind);
        let g = &mut self.gpus.gpus[x.dst_gpu as usize];
        let server = if x.kind == PathKind::Nvlink { &mut g.nvl_rx } else { &mut g.pcie_rx };
        let (_, end) =
            server.reserve_for(near_start + lat, x.bytes, server.rate.time(x.link_bytes));
        let end = end.max(x.near_end + lat);
        self.copy_done_at(end, x.bytes, x.done, x.prog);
    }

    pub(crate) fn stage2(&mut self, id: u32) {
        let x = self.gpus.xfers[id];
        self.gpus.xfers.remove(id);
        self.far_side(x, self.now);
    }

    fn copy_done_at(&mut self, t: Time, bytes: u64, done: Action, prog: ProgId) {
        self.op_bytes[prog as usize].copies_done += bytes;
        if t < self.now {
            self.violation(format!("copy completes at {} before now", fmt_us(t)));
        }
        self.act_at(t, done);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn reserve_for_queues_like_reserve() {
        let mut a = Server::new(Rate::from_gbps(1.0));
        let mut b = a;
        assert_eq!(a.reserve(10, 100), b.reserve_for(10, 100, 100_000));
        // Work that costs more than its bytes holds the server longer; the next waits for it.
        assert_eq!(a.reserve_for(0, 10, 50_000), (100_010, 150_010));
        assert_eq!(a.reserve(0, 1), (150_010, 151_010));
        assert_eq!(a.bytes, 111);
    }

    #[test]
    fn probe_copies_reproduce_their_rates() {
        // h200-single: 6,449 GB/s SM-side, 10,612 GB/s of HBM bytes. The probes copy X =
        // 968.9 MB after a memset that leaves 5.5 MB of dirty lines in L2, timed with a 2.8 us
        // launch: from HBM into L2 (2X SM-side, X read + the dirty lines written back) at
        // hbm_to_l2's 2,452 GB/s, from HBM to HBM (2X each) at hbm_to_hbm's 1,994 GB/s
        // (results/h200, 132x1024).
        let (l2, hbm) = (Rate::from_gbps(6449.0), Some(Rate::from_gbps(10612.0)));
        let (x, f, launch) = (968_884_224u64, 5_503_207u64, 2_800_000);
        let gbps = |t: Time| x as f64 / ((t + launch) as f64 / 1000.0);
        assert!((gbps(l2_work(l2, hbm, 2 * x, x + f)) - 2452.2).abs() < 2.0);
        assert!((gbps(l2_work(l2, hbm, 2 * x, 2 * x)) - 1994.0).abs() < 2.0);
        assert_eq!(l2_work(l2, None, 2 * x, 2 * x), l2.time(2 * x));
    }

    proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        /// HBM traffic only ever adds L2 time, and the L2's time is additive over requests
        /// (within rounding of a picosecond per rate).
        #[test]
        fn l2_work_is_monotone_and_additive(
            a in 0u64..1 << 32, b in 0u64..1 << 32, d in 0u64..1 << 32, e in 0u64..1 << 32,
            l2 in 100.0f64..20_000.0, hbm in 100.0f64..20_000.0,
        ) {
            let (l2, hbm) = (Rate::from_gbps(l2), Some(Rate::from_gbps(hbm)));
            prop_assert!(l2_work(l2, hbm, a, d) >= l2_work(l2, None, a, d));
            prop_assert!(l2_work(l2, hbm, a, d + e) >= l2_work(l2, hbm, a, d));
            let whole = l2_work(l2, hbm, a + b, d + e);
            let parts = l2_work(l2, hbm, a, d) + l2_work(l2, hbm, b, e);
            prop_assert!(parts >= whole && parts - whole <= 2);
        }
    }
}
