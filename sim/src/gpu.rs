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

use crate::core::{Action, Core, Ev, ProgId};
use crate::slab::Slab;
use crate::time::{Rate, Time, fmt_us};

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
        let start = ready.max(self.free);
        let d = self.rate.time(bytes);
        self.free = start + d;
        self.busy_ps += d;
        self.bytes += bytes;
        (start, start + d)
    }
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
                let (start, end) = server.reserve(at, bytes);
                let near_end = end.max(issue_end);
                let x = Xfer { dst_gpu: dst, kind, bytes, near_end, done, prog };
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
    /// `at` (≥ now) by warps that need `issue` on their own (their latency chain). Done when the
    /// slowest of the four is: each server is FIFO, so concurrent traffic queues for its
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
        if l2_bytes > 0 {
            end = end.max(g.l2.reserve(at, l2_bytes).1);
            if let Some(port) = g.sms.get_mut(sm as usize) {
                end = end.max(port.reserve(at, l2_bytes).1);
            }
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
        tr.span(pid, tid, &format!("copy to GPU {dst}"), at, end, &format!("\"bytes\":{bytes}"));
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
        let (_, end) = server.reserve(near_start + lat, x.bytes);
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
