//! Where the normal kernels' rings live (thread-block cluster shared memory or global memory)
//! and the launch shape of the cluster kernels.

use eptwin_engine::api::{ClusterSlot, Dtype, cluster_ring_slots};

use crate::error::HwError;
use crate::options::{HwOptions, RingsWanted};

/// Where the normal kernels' rings live: `Some(slots)` per (channel, source) in the receiving
/// block's shared memory (`intranode_cluster.cu`, thread-block clusters), `None` in global
/// memory (`intranode.cu`, DeepEP's layout). Cluster rings cut the L2/HBM traffic to the input
/// read and the output write (results/h200/README.md, "Rings in shared memory"), so they are
/// the default wherever they can run: every rank of the job on one GPU, at most 8 ranks (one
/// portable cluster per channel), sm_90 or newer, rows in 16-byte pieces, and at least one slot
/// per source in the shared memory a block may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClusterRings {
    pub dispatch_slots: Option<u32>,
    pub combine_slots: Option<u32>,
}

/// What the choice depends on, from the job and the GPU it runs on.
#[derive(Debug, Clone, Copy)]
pub struct RingInputs {
    pub ranks: u32,
    /// Every rank of the job in one launch: on one GPU, in one process.
    pub one_launch: bool,
    pub compute_major: i32,
    pub hidden: u32,
    pub fp8: bool,
    pub topk: u32,
    /// `num_max_nvl_chunked_recv_tokens` of the dispatch and combine Configs.
    pub dispatch_recv_tokens: u32,
    pub combine_recv_tokens: u32,
}

/// Whether `EPTWIN_NORMAL_DISPATCH` / `EPTWIN_NORMAL_COMBINE` (`var`) forces a kernel's rings
/// into cluster shared memory (`Some(true)`) or global memory (`Some(false)`); `None`: the
/// default applies.
fn rings_forced(var: &str, wanted: &RingsWanted) -> Result<Option<bool>, HwError> {
    match wanted {
        RingsWanted::Cluster => Ok(Some(true)),
        RingsWanted::Global => Ok(Some(false)),
        RingsWanted::Default => Ok(None),
        RingsWanted::Invalid(other) => {
            Err(HwError::Unsupported(format!("{var}={other}: expected cluster or global")))
        }
    }
}

impl ClusterRings {
    /// The rings of both kernels: cluster shared memory where possible unless forced to global
    /// memory; an error where cluster rings are forced but cannot run.
    pub fn choose(i: &RingInputs, options: &HwOptions) -> Result<ClusterRings, HwError> {
        let cap = options.cluster_slots;
        let (dv, cv) = ("EPTWIN_NORMAL_DISPATCH", "EPTWIN_NORMAL_COMBINE");
        let d = Self::pick(dv, rings_forced(dv, &options.normal_dispatch_rings)?, || {
            dispatch_slots(i, cap)
        })?;
        let c =
            Self::pick(cv, rings_forced(cv, &options.normal_combine_rings)?, || combine_slots(i))?;
        Ok(ClusterRings { dispatch_slots: d, combine_slots: c })
    }

    fn pick(
        var: &str,
        forced: Option<bool>,
        slots: impl Fn() -> Result<u32, String>,
    ) -> Result<Option<u32>, HwError> {
        match (forced, slots()) {
            (Some(false), _) => Ok(None),
            (_, Ok(s)) => Ok(Some(s)),
            (None, Err(_)) => Ok(None),
            (Some(true), Err(why)) => Err(HwError::Unsupported(format!("{var}=cluster: {why}"))),
        }
    }

    pub fn any(&self) -> bool {
        self.dispatch_slots.is_some() || self.combine_slots.is_some()
    }
}

/// Why cluster rings cannot run for this job (common to both kernels).
fn cluster_precondition(i: &RingInputs) -> Result<(), String> {
    if !i.one_launch {
        return Err("needs every rank of the job in one launch (one GPU, one process)".into());
    }
    if i.ranks > 8 {
        return Err(format!("{} ranks > 8 (one portable cluster per channel)", i.ranks));
    }
    if i.compute_major < 9 {
        return Err("needs thread-block clusters (sm_90 or newer)".into());
    }
    Ok(())
}

/// The cluster kernel's ring slot (engine `cluster_ring`, which the simulator models too), or
/// why bulk copies cannot move it.
fn cluster_slot(dispatch: bool, hidden: u32, fp8: bool, topk: u32) -> Result<ClusterSlot, String> {
    if dispatch {
        ClusterSlot::dispatch(hidden, topk, if fp8 { Dtype::Fp8 } else { Dtype::Bf16 })
    } else {
        ClusterSlot::combine(hidden, topk)
    }
}

/// Dispatch slots per source: the Config's ring size, capped by `cap` and by shared memory.
fn dispatch_slots(i: &RingInputs, cap: Option<u32>) -> Result<u32, String> {
    cluster_precondition(i)?;
    let slot = cluster_slot(true, i.hidden, i.fp8, i.topk)?;
    let want = i.dispatch_recv_tokens.min(cap.unwrap_or(u32::MAX)).max(1);
    most_slots(&slot, want, i.ranks)
}

/// Combine slots per source (BF16 rows and their top-k weights).
fn combine_slots(i: &RingInputs) -> Result<u32, String> {
    cluster_precondition(i)?;
    let slot = cluster_slot(false, i.hidden, i.fp8, i.topk)?;
    most_slots(&slot, i.combine_recv_tokens.max(1), i.ranks)
}

/// The most slots up to `want` whose layout fits a block's shared memory (at least one).
fn most_slots(slot: &ClusterSlot, want: u32, ranks: u32) -> Result<u32, String> {
    match cluster_ring_slots(slot, want, ranks, MAX_DYNAMIC_SMEM_BYTES) {
        0 => Err(format!(
            "one slot per source takes {} bytes of shared memory, more than the {} a block \
                 may have",
            slot.smem_bytes(ranks, 1),
            MAX_DYNAMIC_SMEM_BYTES
        )),
        slots => Ok(slots),
    }
}

/// How a cluster kernel is launched: its name, ring slots per source and their bytes, dynamic
/// shared memory, threads per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterShape {
    pub kernel: &'static str,
    pub slots: u32,
    pub slot_bytes: u64,
    pub smem_bytes: u32,
    pub threads: u32,
}

/// The launch shape of the cluster dispatch (`dispatch`) or combine for `ranks` ranks.
pub fn cluster_shape(
    dispatch: bool,
    ranks: u32,
    hidden: u32,
    fp8: bool,
    topk: u32,
    slots: u32,
) -> ClusterShape {
    let slot = cluster_slot(dispatch, hidden, fp8, topk).expect("ClusterRings::choose checked it");
    ClusterShape {
        kernel: if dispatch { "intranode_dispatch_cluster" } else { "intranode_combine_cluster" },
        slots,
        slot_bytes: slot.slot_bytes,
        smem_bytes: slot.smem_bytes(ranks, slots) as u32,
        // A sender and a receiver warp per rank (kClusterThreads); combine: a sender warp and
        // three reducer warps per rank (kCombineClusterThreads).
        threads: if dispatch { 64 } else { 128 } * ranks,
    }
}

/// What a block may have on sm_90 (227 KiB).
pub const MAX_DYNAMIC_SMEM_BYTES: u64 = 232_448;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_rings_fit_shared_memory_at_deepseek_shapes() {
        // FP8 dispatch of 7,168 channels with 56 scales and top-8; BF16 combine of the same.
        let d = cluster_slot(true, 7168, true, 8).unwrap();
        assert_eq!(d.slot_bytes, 7472);
        assert_eq!(d.slot_bytes % 16, 0, "bulk copies move 16-byte multiples");
        let i = deepseek_inputs();
        assert_eq!(dispatch_slots(&i, None), Ok(3), "three 7,472-byte slots per source fit");
        assert!(d.smem_bytes(8, 4) > MAX_DYNAMIC_SMEM_BYTES);
        assert_eq!(combine_slots(&i), Ok(2), "two 14,368-byte slots per source fit");
        let c = cluster_slot(false, 7168, true, 8).unwrap();
        assert!(c.smem_bytes(8, 3) > MAX_DYNAMIC_SMEM_BYTES);
        // The launch shape: dynamic shared memory of the slots, heads and mbarriers.
        let shape = cluster_shape(true, 8, 7168, true, 8, 3);
        assert_eq!((shape.slot_bytes, shape.smem_bytes, shape.threads), (7472, 179_936, 512));
        // The Config's ring size and the measurement cap bound the slots too.
        assert_eq!(dispatch_slots(&RingInputs { dispatch_recv_tokens: 2, ..i }, None), Ok(2));
        assert_eq!(dispatch_slots(&i, Some(1)), Ok(1));
        // BF16 dispatch rows: 14,416-byte slots, two fit.
        assert_eq!(dispatch_slots(&RingInputs { fp8: false, ..i }, None), Ok(2));
    }

    fn deepseek_inputs() -> RingInputs {
        RingInputs {
            ranks: 8,
            one_launch: true,
            compute_major: 9,
            hidden: 7168,
            fp8: true,
            topk: 8,
            dispatch_recv_tokens: 12,
            combine_recv_tokens: 8,
        }
    }

    #[test]
    fn cluster_rings_only_where_they_can_run() {
        let i = deepseek_inputs();
        for bad in [
            RingInputs { one_launch: false, ..i },
            RingInputs { ranks: 16, ..i },
            RingInputs { compute_major: 8, ..i },
            // 16,384 BF16 channels: one 32 KB slot per source is more than a block may have.
            RingInputs { hidden: 16384, fp8: false, ..i },
        ] {
            assert!(dispatch_slots(&bad, None).is_err() || combine_slots(&bad).is_err(), "{bad:?}");
        }
        assert!(combine_slots(&RingInputs { topk: 6, ..i }).is_err(), "24-byte weight rows");
        let fits = || Ok(3);
        let no = || Err("no".to_string());
        assert_eq!(ClusterRings::pick("V", None, fits), Ok(Some(3)), "default: cluster");
        assert_eq!(ClusterRings::pick("V", None, no), Ok(None), "default falls back to global");
        assert_eq!(ClusterRings::pick("V", Some(false), fits), Ok(None), "forced global");
        assert!(ClusterRings::pick("V", Some(true), no).is_err(), "forced cluster cannot run");
        let bad = HwOptions {
            normal_combine_rings: RingsWanted::Invalid("shared".into()),
            ..HwOptions::default()
        };
        let e = ClusterRings::choose(&i, &bad).unwrap_err().to_string();
        assert!(e.contains("EPTWIN_NORMAL_COMBINE=shared: expected cluster or global"), "{e}");
        let global =
            HwOptions { normal_dispatch_rings: RingsWanted::Global, ..HwOptions::default() };
        let rings = ClusterRings::choose(&i, &global).unwrap();
        assert_eq!(rings, ClusterRings { dispatch_slots: None, combine_slots: Some(2) });
    }
}
