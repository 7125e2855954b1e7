//! The hardware backend's kernels for a job whose ranks all share one GPU
//! (`kernels/cuda/intranode.cu`, `kernels/cuda/low_latency.cu`; results/h200/README.md, "Kernel
//! shape" and "Deviations"). DeepEP cannot place several ranks on one GPU, so these are the
//! kernels that ran wherever a job looks like this; the DeepEP models (`intranode`, `ll`) stay
//! for ranks on separate GPUs.
//!
//! The GPU is modelled as its SMs see it (profile `[gpu.memory]`, every number measured by the
//! backend's probes, docs/calibration.md):
//!
//! * **Bandwidth.** Every load and store of the kernels goes through L2: one FIFO server at the
//!   L2 rate carries all of them. Bytes that come from HBM or are written back to it also cross
//!   the HBM server (the rate SM-driven copies reach, not the copy engines' memcpy rate). What
//!   crosses HBM follows the kernels' cache hints and sizes: inputs come from HBM (the timing
//!   flushes L2 before every op, leaving `flush_dirty_bytes` of dirty lines for the op to
//!   write back); ring slots are stored evict-last and dropped from L2 once
//!   consumed, so they stay in L2 while the slots in flight fit in it and spill (written back,
//!   read again from HBM) beyond that; outputs and the low-latency receive buffers, far larger
//!   than L2, are written back. A slot stored by one SM and loaded by another while in L2
//!   costs the L2 more than a streaming copy's bytes (`l2_ring_bw_gbps`), and every
//!   `discard.global.L2` of a consumed slot or message costs it too (`l2_discard_bw_gbps`):
//!   both measured by the ring-handoff probe, which no plain copy probe is like. The
//!   low-latency combine's send phase and dispatch's receive share the bandwidth among their
//!   warps instead of queueing (`sharing`): their short runs end when the warps with the most
//!   rows do.
//! * **Latency.** A warp copying a row with 7 loads in flight per lane is latency-bound: it
//!   needs the measured time per round of loads (source in L2 or in HBM) however many rows it
//!   copies. Dependent loads, atomics, releases and flags add their measured latencies where
//!   the kernels' code makes them wait. A copy completes when the slowest of its warps' chain,
//!   the L2 server and the HBM server is done.
//! * **Grid.** One launch covers every rank on the GPU (CUDA events around it, so the launch
//!   cost as the events see it is added once); every rank's op ends when the launch does.
//!   Normal kernels: `num_sms` blocks per rank (sender and receiver per channel) with the
//!   backend's block size; low-latency kernels: one 1,024-thread block per SM, items of all
//!   ranks interleaved over them, each block working through its items one after another.
//!
//! Here the memory model and the setup the programs share; the programs: `normal` (rings in
//! global memory), `cluster` (rings in thread-block-cluster shared memory), `ll`.

pub mod cluster;
mod ll;
mod normal;
mod sharing;

pub use ll::OneGpuLlProgram;
pub use normal::NormalProgram;

use eptwin_engine::api::{Config, DeepEpJob, OpKind, Plan};

use crate::core::Core;
use crate::core::time::Time;
use crate::params::OneGpu;
use crate::programs::{Meta, deepep_job};

/// int4 (16 B) per lane per round of `UNROLLED_WARP_COPY(7, …)`: 7 loads of 16 B in flight per
/// lane, 32 lanes.
const INT4_PER_ROUND: u64 = 7 * 32;
/// The probes' row: 7,168 bytes = 448 int4 = two rounds.
const PROBE_ROW_ROUNDS: u64 = 2;

/// Whether job `job` runs the one-GPU kernels: the profile describes the GPU's memory system
/// and every rank of the job is on the same GPU (and there are at least two).
pub fn applies(core: &Core, meta: &Meta) -> bool {
    let gpus = &core.jobs[meta.job.index()].gpu;
    core.params.one_gpu.is_some() && gpus.len() > 1 && gpus.iter().all(|&g| g == gpus[0])
}

/// Time of the latency chain of one warp copying `int4` 16-byte words with 7 loads in flight
/// per lane: whole rounds, each `row / 2` (the probes' 7,168-byte row is two rounds).
fn warp_copy(int4: u64, row: Time) -> Time {
    int4.div_ceil(INT4_PER_ROUND) * row / PROBE_ROW_ROUNDS
}

/// Set the GPU's L2 and HBM servers to the profile's rates and give it one port server per SM
/// (the world builds the GPUs before the program knows it models one GPU; their state carries
/// over between ops).
pub(super) fn memory_servers(core: &mut Core, gpu: u32, m: &OneGpu) {
    let sms = core.params.sm_count.max(1) as usize;
    let g = &mut core.gpus.gpus[gpu as usize];
    g.l2.rate = m.l2_rate;
    g.dram.rate = m.dram_rate;
    g.l2_hbm = m.l2_hbm_rate;
    if g.sms.len() != sms {
        g.sms = vec![crate::gpu::Server::new(m.sm_port); sms];
    }
}

/// The GPU's L2 and HBM servers' counters, to report what one op moved through them.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MemSnap {
    l2_bytes: u64,
    l2_busy: Time,
    dram_bytes: u64,
    dram_busy: Time,
}

impl MemSnap {
    pub(super) fn of(core: &Core, gpu: u32) -> MemSnap {
        let g = &core.gpus.gpus[gpu as usize];
        MemSnap {
            l2_bytes: g.l2.bytes,
            l2_busy: g.l2.busy_ps,
            dram_bytes: g.dram.bytes,
            dram_busy: g.dram.busy_ps,
        }
    }

    /// What moved since `self` over a kernel of `span`: the figures Nsight Compute reports
    /// for the same kernel (SM-side L2 bytes, HBM bytes, how busy each was).
    pub(super) fn report(self, core: &Core, gpu: u32, span: Time) -> String {
        let now = MemSnap::of(core, gpu);
        let pct = |busy: Time| 100.0 * busy as f64 / span.max(1) as f64;
        format!(
            "one-GPU model: {:.2} GB SM-side L2 traffic (L2 busy {:.0} %), {:.2} GB HBM traffic (HBM busy {:.0} %)",
            (now.l2_bytes - self.l2_bytes) as f64 / 1e9,
            pct(now.l2_busy - self.l2_busy),
            (now.dram_bytes - self.dram_bytes) as f64 / 1e9,
            pct(now.dram_busy - self.dram_busy),
        )
    }
}

/// The backend times every op after a 256 MB memset that flushes L2 (hw/src/exec.rs
/// `flush_l2`). Of the memset's lines, an op meets `flush_dirty_bytes` still dirty (the flush
/// probe's measure, far below `l2_bytes`: docs/calibration.md, "What the flush leaves dirty"):
/// its first new lines each evict one, written back to HBM. `take` returns the write-back a
/// step's new lines cause.
#[derive(Debug, Clone, Copy)]
pub(super) struct FlushedL2 {
    pub(super) dirty: u64,
}

impl FlushedL2 {
    pub(super) fn take(&mut self, new_lines: u64) -> u64 {
        let w = self.dirty.min(new_lines);
        self.dirty -= w;
        w
    }
}
/// What both normal-mode programs (global rings here, cluster rings in `cluster`) read
/// first: the job, its rank count, the op's `Config` and channels, the one-GPU parameters and the
/// GPU, whose memory servers this sets up.
pub(super) struct NormalSetup<'a> {
    pub d: &'a DeepEpJob,
    pub n: u32,
    pub dispatch: bool,
    pub cfg: Config,
    pub channels: u32,
    pub m: OneGpu,
    pub gpu: u32,
}

pub(super) fn normal_setup<'a>(plan: &'a Plan, core: &mut Core, meta: Meta) -> NormalSetup<'a> {
    let d = deepep_job(plan, meta.job);
    let dispatch = meta.op == OpKind::Dispatch;
    let cfg: Config = if dispatch { d.dispatch_config } else { d.combine_config }
        .expect("normal mode has a resolved Config");
    let m = core.params.one_gpu.expect("one-GPU model");
    let gpu = core.jobs[meta.job.index()].gpu[0];
    memory_servers(core, gpu, &m);
    NormalSetup {
        d,
        n: plan.job(meta.job).num_ranks(),
        dispatch,
        cfg,
        channels: cfg.num_channels().max(1),
        m,
        gpu,
    }
}

#[cfg(test)]
mod tests {
    use eptwin_engine::Plan;
    use eptwin_engine::testing::ScenarioDraft;
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn warp_copy_counts_whole_rounds() {
        // 448 int4 = the probes' row: exactly its time; 462 (an FP8 message) needs a third
        // round; 896 (a BF16 row) four.
        assert_eq!(warp_copy(448, 1000), 1000);
        assert_eq!(warp_copy(462, 1000), 1500);
        assert_eq!(warp_copy(896, 1000), 2000);
    }

    #[test]
    fn flushed_lines_are_written_back_once() {
        let mut f = FlushedL2 { dirty: 100 };
        assert_eq!(f.take(30), 30);
        assert_eq!(f.take(0), 0);
        assert_eq!(f.take(100), 70);
        assert_eq!(f.take(50), 0);
    }

    proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        /// A warp's copy time grows with the bytes, by whole rounds of 7 loads per lane.
        #[test]
        fn warp_copy_is_whole_rounds(int4 in 0u64..100_000, row in 1u64..10_000_000) {
            let t = warp_copy(int4, row);
            prop_assert!(warp_copy(int4 + 1, row) >= t);
            prop_assert_eq!(t, int4.div_ceil(224) * row / 2);
        }
    }

    /// A one-GPU EP8 scenario on the `h200-single` profile with a memory section given here
    /// (test values, not the profile's), `extra` appended to it.
    fn run_one_gpu(
        mode: &str,
        tokens: u32,
        l2_gbps: f64,
        extra: &str,
    ) -> eptwin_engine::api::RunResult {
        run_one_gpu_with(mode, tokens, l2_gbps, extra, "")
    }

    /// [`run_one_gpu`] with `workload` (TOML lines) added to `[job.workload]`.
    fn run_one_gpu_with(
        mode: &str,
        tokens: u32,
        l2_gbps: f64,
        extra: &str,
        workload: &str,
    ) -> eptwin_engine::api::RunResult {
        let ll = mode == "ll";
        let text = format!(
            r#"
schema = 1
name = "one-gpu-{mode}"
[cluster]
profile = "h200-single"
[cluster.overrides.gpu]
memory = {{ l2_bytes = 62914560, l2_bw_gbps = {l2_gbps}, dram_bw_gbps = 3600.0, warp_row_l2_ns = 800.0, warp_row_hbm_ns = 2000.0, sm_copy_l2_gbps = 60.0, sm_copy_hbm_gbps = 48.0, load_l2_ns = 300, load_hbm_ns = 800, load_hbm_busy_ns = 1200, atomic_ns = 500, release_ns = 500{extra} }}
[[job]]
name = "ep8"
[job.buffer]
{buffer}
[job.workload]
tokens_per_rank = {tokens}
hidden = 7168
topk = 8
experts = 256
warmup = 0
iterations = 1
{workload}"#,
            buffer = if ll {
                "low_latency_mode = true\nnum_rdma_bytes = \"2GiB\"\nnum_qps_per_rank = 32"
            } else {
                "num_nvl_bytes = \"2e9\"\nnum_qps_per_rank = 1\nnum_sms = 24"
            },
        );
        let loaded = eptwin_engine::parse("one-gpu.toml", &text).expect("scenario parses");
        let plan = Plan::build(&loaded).expect("plan");
        let mut sim = crate::Simulator::new(crate::SimOptions::default());
        eptwin_engine::api::run(&plan, &mut sim, eptwin_engine::api::Provenance::default())
            .expect("run")
    }

    fn mean_us(r: &eptwin_engine::api::RunResult, op: &str) -> f64 {
        let o = r.jobs[0].ops.iter().find(|o| o.op == op).expect("op");
        o.summary.latency_us.mean
    }

    fn phase_us(r: &eptwin_engine::api::RunResult, op: &str, phase: &str) -> f64 {
        let o = r.jobs[0].ops.iter().find(|o| o.op == op).expect("op");
        *o.summary.phases_us.get(phase).unwrap_or_else(|| panic!("{op}: no {phase} phase"))
    }

    /// Hook mode runs the same kernels as two launches: the combine's send kernel is the fused
    /// kernel's send phase, each receive kernel starts a launch after the last send block, and
    /// the two phases add up to the op.
    #[test]
    fn hook_mode_times_the_one_gpu_kernels_apart() {
        let fused = run_one_gpu("ll", 64, 6000.0, "");
        let hook = run_one_gpu_with("ll", 64, 6000.0, "", "hook = true\n");
        assert_eq!(hook.verdict, eptwin_engine::api::Verdict::Ok, "{:?}", hook.failures);
        let launch_us = 2.0; // h200-single's kernel_launch_ns is above it
        for op in ["dispatch", "combine"] {
            let o = hook.jobs[0].ops.iter().find(|o| o.op == op).expect("op");
            assert!(o.summary.checks.iter().any(|c| c.starts_with("one-GPU")), "{op}");
            let (send, recv) = (phase_us(&hook, op, "send"), phase_us(&hook, op, "recv"));
            assert!((send + recv - mean_us(&hook, op)).abs() < 1e-6, "{op}: {send} + {recv}");
            assert!(send > launch_us && recv > launch_us, "{op}: {send}, {recv}");
            assert!(mean_us(&hook, op) > mean_us(&fused, op), "{op}");
        }
        assert_eq!(phase_us(&hook, "combine", "send"), phase_us(&fused, "combine", "send"));
        // The dispatch's send kernel also signals the counts, after its send loops.
        assert!(phase_us(&hook, "dispatch", "send") > phase_us(&fused, "dispatch", "send"));
    }

    /// Bytes of a low-latency op's messages, (all, to peers): every (token, expert) selection,
    /// and those whose expert lives on another rank, times the op's message bytes.
    fn ll_message_bytes(plan: &Plan, dispatch: bool) -> (u64, u64) {
        let d = plan.jobs[0].deepep().expect("a DeepEP job");
        let w = &d.workload;
        let n = plan.jobs[0].num_ranks();
        let local = w.experts / n;
        let (mut all, mut peer) = (0u64, 0u64);
        for r in 0..n {
            for t in 0..w.tokens_per_rank {
                for &e in d.routing().experts(r, t).iter().filter(|&&e| e >= 0) {
                    all += 1;
                    peer += u64::from(e as u32 / local != r);
                }
            }
        }
        let msg_bytes = if dispatch {
            eptwin_engine::api::ll_dispatch_msg_bytes(w.hidden, w.dispatch_dtype)
        } else {
            eptwin_engine::api::ll_combine_msg_bytes(w.hidden, w.combine_dtype)
        };
        (all * msg_bytes, peer * msg_bytes)
    }

    /// Ranks sharing one GPU store their messages to each other while P2P is allowed (the
    /// one-GPU kernels count every message they store, a rank's own included); with
    /// `allow_nvlink_for_low_latency_mode = false` the plan's rule (`Plan::low_latency_path`)
    /// sends every message but a rank's own through RDMA, and the simulator counts exactly
    /// those there, none as stored.
    #[test]
    fn one_gpu_low_latency_honours_the_p2p_rule() {
        let draft = ScenarioDraft::bundled("h200-ep8-ll-128")
            .set("job[0].workload.warmup", 0)
            .set("job[0].workload.iterations", 1);
        for p2p in [true, false] {
            let draft = draft.clone().set("job[0].buffer.allow_nvlink_for_low_latency_mode", p2p);
            let plan = draft.plan();
            let mut sim = crate::Simulator::new(crate::SimOptions::default());
            let r = eptwin_engine::api::run(&plan, &mut sim, Default::default()).expect("run");
            assert_eq!(r.verdict, eptwin_engine::api::Verdict::Ok, "p2p {p2p}: {:?}", r.failures);
            for o in &r.jobs[0].ops {
                let (all, peer) = ll_message_bytes(&plan, o.op == "dispatch");
                assert!(peer > 0 && peer < all, "{}: {peer} of {all}", o.op);
                let (stored, rdma) = if p2p { (all, 0) } else { (0, peer) };
                assert_eq!(o.summary.nvlink_bytes, stored, "p2p {p2p} {}: stored bytes", o.op);
                assert_eq!(o.summary.rdma_bytes, rdma, "p2p {p2p} {}: RDMA bytes", o.op);
            }
        }
    }

    #[test]
    fn one_gpu_kernels_run_and_check_out() {
        for mode in ["ll", "normal"] {
            let r = run_one_gpu(mode, 64, 5000.0, "");
            assert_eq!(r.verdict, eptwin_engine::api::Verdict::Ok, "{mode}: {:?}", r.failures);
            for o in &r.jobs[0].ops {
                assert!(
                    o.summary.checks.iter().any(|c| c.starts_with("one-GPU")),
                    "{mode} {}: the one-GPU kernels ran ({:?})",
                    o.op,
                    o.summary.checks
                );
                // One launch as CUDA events see it (h200-single's kernel_launch_ns) at least.
                assert!(o.summary.latency_us.mean > 2.0, "{mode} {}", o.op);
            }
        }
    }

    #[test]
    fn a_slower_l2_never_makes_the_normal_kernels_faster() {
        let fast = run_one_gpu("normal", 256, 6000.0, "");
        let slow = run_one_gpu("normal", 256, 3000.0, "");
        for op in ["dispatch", "combine"] {
            assert!(mean_us(&slow, op) >= mean_us(&fast, op), "{op}");
        }
        // At 256 tokens the rings' traffic through L2 dominates: half the rate costs time.
        assert!(mean_us(&slow, "dispatch") > 1.3 * mean_us(&fast, "dispatch"));
    }

    #[test]
    fn ring_handoffs_and_discards_cost_l2_time() {
        let extra = ", l2_ring_bw_gbps = 3000.0, l2_discard_bw_gbps = 6000.0";
        // (64 low-latency tokens: the test scenario's 2 GiB buffer holds no more.)
        for (mode, tokens) in [("normal", 256), ("ll", 64)] {
            let plain = run_one_gpu(mode, tokens, 6000.0, "");
            let costly = run_one_gpu(mode, tokens, 6000.0, extra);
            assert_eq!(costly.verdict, eptwin_engine::api::Verdict::Ok, "{mode}");
            for op in ["dispatch", "combine"] {
                assert!(mean_us(&costly, op) >= mean_us(&plain, op), "{mode} {op}");
            }
        }
        // The normal dispatch hands every slot over through L2 (none spill at 256 tokens): its
        // rings' stores and loads at half the L2 rate, plus the discards, cost time.
        let plain = run_one_gpu("normal", 256, 6000.0, "");
        let costly = run_one_gpu("normal", 256, 6000.0, extra);
        assert!(mean_us(&costly, "dispatch") > 1.1 * mean_us(&plain, "dispatch"));
    }

    /// The send loop's steps measured under load replace the single-operation chain of the
    /// low-latency dispatch only: a longer round lengthens the dispatch (64 tokens: 512 items,
    /// about 4 rounds per block), the combine does not move.
    #[test]
    fn measured_send_steps_set_the_low_latency_send_round() {
        let plain = run_one_gpu("ll", 64, 6000.0, "");
        let slow = ", ll_send_cast_ns = 2000.0, ll_send_slot_ns = 1000.0, \
                    ll_send_copy_ns = 3000.0, ll_send_release_ns = 2000.0";
        let slow = run_one_gpu("ll", 64, 6000.0, slow);
        assert_eq!(slow.verdict, eptwin_engine::api::Verdict::Ok, "{:?}", slow.failures);
        // Single operations: 1,200 + 3 × 400 (copy) + 500 + 500 = 3,400 ns a round at most;
        // measured: 8,000 ns. Four rounds of 4.6 us more, less what the L2 bound already took.
        let more = mean_us(&slow, "dispatch") - mean_us(&plain, "dispatch");
        assert!(more > 8.0, "{more}");
        assert_eq!(mean_us(&slow, "combine"), mean_us(&plain, "combine"));
        // Slower count polls (4.5 a receive item on average) lengthen the receive only.
        let polls = run_one_gpu("ll", 64, 6000.0, ", ll_recv_poll_ns = 3000.0");
        assert!(mean_us(&polls, "dispatch") > mean_us(&plain, "dispatch") + 5.0);
        assert_eq!(mean_us(&polls, "combine"), mean_us(&plain, "combine"));
    }
}
