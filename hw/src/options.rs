//! The hardware backend's knobs: every `EPTWIN_*` variable it obeys, read from the environment
//! once ([`HwOptions::from_env`]) and passed down, so a run's behaviour is decided in one place.
//!
//! | variable | default | effect |
//! |---|---|---|
//! | `EPTWIN_KERNEL_TIMEOUT_MS` | 10000 | bound of every in-kernel wait (host: 4× + 30 s) |
//! | `EPTWIN_L2_DISCARD` | on | `0`: keep consumed ring lines in L2, do not drop them |
//! | `EPTWIN_L2_DISCARD_DISPATCH` | on | `0`: keep them in dispatch only |
//! | `EPTWIN_PROBES` | on | `0`: skip the copy/launch/flag probes (`probe.*`) |
//! | `EPTWIN_NCCL_BASELINE` | on | `0`: skip the NCCL all-to-all baseline |
//! | `EPTWIN_NORMAL_SMS` | Config | normal kernels on N ≥ 2 SMs per rank (N / 2 channels) |
//! | `EPTWIN_NORMAL_DISPATCH` | cluster if possible | `cluster` or `global`: dispatch rings |
//! | `EPTWIN_NORMAL_COMBINE` | cluster if possible | `cluster` or `global`: combine rings |
//! | `EPTWIN_CLUSTER_SLOTS` | Config | at most N cluster ring slots per source |
//! | `EPTWIN_CLUSTER_TIMES` | off | `1`: log when the cluster kernels' warps finished, the combine's per-token and per-ring stamps |
//! | `EPTWIN_COMBINE_GROUP_WARPS` | 5 | warps reducing one token in the normal combine |
//! | `EPTWIN_L2_HINTS` | on | `0`: no L2 eviction-priority hints in the normal kernels |
//! | `EPTWIN_FLAG_SCOPE` | placement | `sys`: system-scope flags even on one GPU |
//! | `EPTWIN_L2_CLEAN` | off | `1`: read the flush buffer back after each flush (clean L2) |
//! | `EPTWIN_LL_COMBINE_PREFETCH` | off | `1`: LL combine prefetches the next token's top-k row |
//! | `EPTWIN_LL_TIMES` | off | `1`: log when the LL combine's blocks ended their send and receive |
//! | `EPTWIN_CLUSTER_PROBE` | off | `1`: the cluster handoff and reducer probes (sm_90+) |
//! | `EPTWIN_CLUSTER_PROBE_ONLY` | all | `warp`, `tma` (comma-separated) or `load` shapes |
//! | `EPTWIN_KERNEL_CACHE` | see below | compiled-kernel cache directory |
//! | `EPTWIN_RDMA_DEVICE` | first ACTIVE | `name` or `name:port` of the RDMA device |
//! | `EPTWIN_WIRE` | `auto` | internode wire: `auto`, `tcp` or `verbs` (`eptwin run --wire`) |
//!
//! The kernel cache defaults to `$XDG_CACHE_HOME/eptwin/kernels`, else
//! `~/.cache/eptwin/kernels`.
//!
//! Every knob but the timeout, the probes and the baseline is a measurement aid: the defaults
//! are what results are committed with, and a result records the knobs that shape it
//! (`hw.num_sms_override`, `hw.l2_discard_consumed_lines`, `hw.normal_kernels`, ...).

use std::ffi::OsString;
use std::path::PathBuf;

use eptwin_wire::WireRequest;

/// Where `EPTWIN_NORMAL_DISPATCH` / `EPTWIN_NORMAL_COMBINE` put a normal kernel's rings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RingsWanted {
    /// Unset or empty: thread-block cluster shared memory wherever it can run, else global.
    #[default]
    Default,
    /// `cluster`: cluster shared memory, or an error where it cannot run.
    Cluster,
    /// `global`: global memory (DeepEP's layout).
    Global,
    /// Any other value, kept so that the job that would use it fails with the value named.
    Invalid(String),
}

impl RingsWanted {
    fn parse(value: Option<&str>) -> RingsWanted {
        match value {
            None | Some("") => RingsWanted::Default,
            Some("cluster") => RingsWanted::Cluster,
            Some("global") => RingsWanted::Global,
            Some(other) => RingsWanted::Invalid(other.to_string()),
        }
    }
}

/// Knobs of the hardware backend (the table in this module's docs). `Default` is what a run
/// with none of the variables set gets; [`HwOptions::from_env`] reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HwOptions {
    /// `EPTWIN_KERNEL_TIMEOUT_MS`: bound of every in-kernel wait, in ms (10,000).
    pub kernel_timeout_ms: u64,
    /// `EPTWIN_L2_DISCARD` (`0`: off): drop consumed ring lines from L2, saving their write-back
    /// to HBM.
    pub l2_discard: bool,
    /// `EPTWIN_L2_DISCARD_DISPATCH` (`0`: off): the same in dispatch (with `l2_discard` only).
    pub l2_discard_dispatch: bool,
    /// `EPTWIN_PROBES` (`0`: off): measure the copy ceilings (`probe.*`) in the same run.
    pub probes: bool,
    /// `EPTWIN_NCCL_BASELINE` (`0`: off): time NCCL's all-to-all of the same bytes.
    pub nccl_baseline: bool,
    /// `EPTWIN_NORMAL_SMS=N` (N ≥ 2): the normal kernels on N SMs per rank instead of the
    /// scenario's Configs (recorded as `hw.num_sms_override`).
    pub normal_sms: Option<u32>,
    /// `EPTWIN_NORMAL_DISPATCH=cluster|global`: where the normal dispatch's rings live.
    pub normal_dispatch_rings: RingsWanted,
    /// `EPTWIN_NORMAL_COMBINE=cluster|global`: where the normal combine's rings live.
    pub normal_combine_rings: RingsWanted,
    /// `EPTWIN_CLUSTER_SLOTS=N`: at most N cluster ring slots per source (dispatch).
    pub cluster_slots: Option<u32>,
    /// `EPTWIN_CLUSTER_TIMES=1`: log when the cluster kernels' warps finished, and the
    /// combine's per-token and per-ring stamps, after the host-checked iteration.
    pub cluster_times: bool,
    /// `EPTWIN_COMBINE_GROUP_WARPS=N`: warps reducing one token together in the normal combine
    /// (clamped to what the block holds; 5 when unset).
    pub combine_group_warps: Option<u32>,
    /// `EPTWIN_L2_HINTS` (`0`: off): L2 eviction-priority hints in the normal kernels.
    pub l2_hints: bool,
    /// `EPTWIN_FLAG_SCOPE=sys`: system-scope flags between ranks even on one GPU.
    pub flag_scope_sys: bool,
    /// `EPTWIN_L2_CLEAN=1`: after each timed op's L2 flush, read the flush buffer back, so the
    /// op starts with L2 full of clean lines instead of the memset's dirty ones (what the
    /// flush's write-backs cost an op is the difference).
    pub l2_clean: bool,
    /// `EPTWIN_LL_COMBINE_PREFETCH=1`: the low-latency combine's receive loop prefetches the
    /// next item's `topk_idx` row into L2 (what its dependent first load costs is the
    /// difference).
    pub ll_combine_prefetch: bool,
    /// `EPTWIN_LL_TIMES=1`: the low-latency combine stamps when each block started, when each
    /// of its send groups sent its last item and when its receive loop ended; logged after the
    /// host-checked iteration.
    pub ll_times: bool,
    /// `EPTWIN_CLUSTER_PROBE=1`: run the cluster handoff and reducer probes (sm_90 or newer).
    pub cluster_probe: bool,
    /// `EPTWIN_CLUSTER_PROBE_ONLY`: the probe kinds to run (`warp`, `tma`, comma-separated, or
    /// `load`); empty: all.
    pub cluster_probe_only: String,
    /// Compiled kernels are cached here: `EPTWIN_KERNEL_CACHE`, else
    /// `$XDG_CACHE_HOME/eptwin/kernels`, else `~/.cache/eptwin/kernels`; `None`: no cache.
    pub kernel_cache_dir: Option<PathBuf>,
    /// `EPTWIN_RDMA_DEVICE` (`name` or `name:port`): the RDMA device to use; unset, the first
    /// with an ACTIVE port.
    pub rdma_device: Option<String>,
    /// `EPTWIN_WIRE` (or `eptwin run --wire`): how internode bytes move, `auto` (verbs where a
    /// port is ACTIVE, else TCP), `tcp` or `verbs`. Another value is kept as the error, so
    /// that a scenario that would use the wire is waived naming it.
    pub wire: Result<WireRequest, String>,
}

impl Default for HwOptions {
    fn default() -> Self {
        HwOptions::from_vars(|_| None)
    }
}

impl HwOptions {
    /// The knobs as this process's environment sets them.
    pub fn from_env() -> HwOptions {
        HwOptions::from_vars(|name| std::env::var_os(name))
    }

    /// The knobs from `get` (a variable's value, `None` when unset). A value that is not
    /// Unicode counts as unset, a number that does not parse as its default.
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> HwOptions {
        let text = |name: &str| get(name).and_then(|v| v.into_string().ok());
        let on_unless_zero = |name: &str| text(name).is_none_or(|v| v != "0");
        let is = |name: &str, wanted: &str| text(name).as_deref() == Some(wanted);
        let number = |name: &str| text(name).and_then(|v| v.parse::<u32>().ok());
        let kernel_cache_dir = get("EPTWIN_KERNEL_CACHE")
            .map(PathBuf::from)
            .or_else(|| get("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("eptwin/kernels")))
            .or_else(|| get("HOME").map(|h| PathBuf::from(h).join(".cache/eptwin/kernels")));
        HwOptions {
            kernel_timeout_ms: text("EPTWIN_KERNEL_TIMEOUT_MS")
                .and_then(|v| v.parse().ok())
                .unwrap_or(10_000),
            l2_discard: on_unless_zero("EPTWIN_L2_DISCARD"),
            l2_discard_dispatch: on_unless_zero("EPTWIN_L2_DISCARD_DISPATCH"),
            probes: on_unless_zero("EPTWIN_PROBES"),
            nccl_baseline: on_unless_zero("EPTWIN_NCCL_BASELINE"),
            normal_sms: number("EPTWIN_NORMAL_SMS").filter(|&n| n >= 2),
            normal_dispatch_rings: RingsWanted::parse(text("EPTWIN_NORMAL_DISPATCH").as_deref()),
            normal_combine_rings: RingsWanted::parse(text("EPTWIN_NORMAL_COMBINE").as_deref()),
            cluster_slots: number("EPTWIN_CLUSTER_SLOTS"),
            cluster_times: is("EPTWIN_CLUSTER_TIMES", "1"),
            combine_group_warps: number("EPTWIN_COMBINE_GROUP_WARPS"),
            l2_hints: on_unless_zero("EPTWIN_L2_HINTS"),
            flag_scope_sys: is("EPTWIN_FLAG_SCOPE", "sys"),
            l2_clean: is("EPTWIN_L2_CLEAN", "1"),
            ll_combine_prefetch: is("EPTWIN_LL_COMBINE_PREFETCH", "1"),
            ll_times: is("EPTWIN_LL_TIMES", "1"),
            cluster_probe: is("EPTWIN_CLUSTER_PROBE", "1"),
            cluster_probe_only: text("EPTWIN_CLUSTER_PROBE_ONLY").unwrap_or_default(),
            kernel_cache_dir,
            rdma_device: text("EPTWIN_RDMA_DEVICE"),
            wire: text("EPTWIN_WIRE").map_or(Ok(WireRequest::Auto), |v| {
                v.parse().map_err(|e| format!("EPTWIN_WIRE: {e}"))
            }),
        }
    }

    /// Whether dispatch drops consumed ring lines from L2.
    pub fn discard_in_dispatch(&self) -> bool {
        self.l2_discard && self.l2_discard_dispatch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> HwOptions {
        let vars: Vec<(String, OsString)> =
            vars.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        HwOptions::from_vars(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn unset_variables_give_the_defaults() {
        let o = with(&[]);
        assert_eq!(o, HwOptions::default());
        assert_eq!(o.kernel_timeout_ms, 10_000);
        assert!(o.l2_discard && o.l2_discard_dispatch && o.probes && o.nccl_baseline);
        assert!(o.l2_hints && !o.cluster_times && !o.cluster_probe && !o.flag_scope_sys);
        assert!(!o.l2_clean && !o.ll_combine_prefetch && !o.ll_times);
        assert_eq!((o.normal_sms, o.cluster_slots, o.combine_group_warps), (None, None, None));
        assert_eq!(o.normal_dispatch_rings, RingsWanted::Default);
        assert_eq!((o.kernel_cache_dir, o.rdma_device), (None, None));
        assert_eq!(o.wire, Ok(WireRequest::Auto));
    }

    #[test]
    fn every_variable_is_read() {
        let o = with(&[
            ("EPTWIN_KERNEL_TIMEOUT_MS", "500"),
            ("EPTWIN_L2_DISCARD", "0"),
            ("EPTWIN_L2_DISCARD_DISPATCH", "0"),
            ("EPTWIN_PROBES", "0"),
            ("EPTWIN_NCCL_BASELINE", "0"),
            ("EPTWIN_NORMAL_SMS", "24"),
            ("EPTWIN_NORMAL_DISPATCH", "global"),
            ("EPTWIN_NORMAL_COMBINE", "cluster"),
            ("EPTWIN_CLUSTER_SLOTS", "2"),
            ("EPTWIN_CLUSTER_TIMES", "1"),
            ("EPTWIN_COMBINE_GROUP_WARPS", "3"),
            ("EPTWIN_L2_HINTS", "0"),
            ("EPTWIN_FLAG_SCOPE", "sys"),
            ("EPTWIN_L2_CLEAN", "1"),
            ("EPTWIN_LL_COMBINE_PREFETCH", "1"),
            ("EPTWIN_LL_TIMES", "1"),
            ("EPTWIN_CLUSTER_PROBE", "1"),
            ("EPTWIN_CLUSTER_PROBE_ONLY", "load"),
            ("EPTWIN_KERNEL_CACHE", "/tmp/k"),
            ("EPTWIN_RDMA_DEVICE", "mlx5_0:1"),
            ("EPTWIN_WIRE", "tcp"),
        ]);
        assert_eq!(o.kernel_timeout_ms, 500);
        assert!(!o.l2_discard && !o.l2_discard_dispatch && !o.probes && !o.nccl_baseline);
        assert_eq!(o.normal_sms, Some(24));
        assert_eq!(o.normal_dispatch_rings, RingsWanted::Global);
        assert_eq!(o.normal_combine_rings, RingsWanted::Cluster);
        assert_eq!((o.cluster_slots, o.combine_group_warps), (Some(2), Some(3)));
        assert!(o.cluster_times && !o.l2_hints && o.flag_scope_sys && o.cluster_probe);
        assert!(o.l2_clean && o.ll_combine_prefetch && o.ll_times);
        assert_eq!(o.cluster_probe_only, "load");
        assert_eq!(o.kernel_cache_dir, Some(PathBuf::from("/tmp/k")));
        assert_eq!(o.rdma_device.as_deref(), Some("mlx5_0:1"));
        assert_eq!(o.wire, Ok(WireRequest::Tcp));
    }

    #[test]
    fn values_other_than_the_documented_ones() {
        let o = with(&[
            ("EPTWIN_KERNEL_TIMEOUT_MS", "soon"),
            ("EPTWIN_L2_DISCARD", "no"),
            ("EPTWIN_NORMAL_SMS", "1"),
            ("EPTWIN_NORMAL_DISPATCH", "shared"),
            ("EPTWIN_NORMAL_COMBINE", ""),
            ("EPTWIN_CLUSTER_TIMES", "yes"),
            ("EPTWIN_WIRE", "ib"),
        ]);
        assert_eq!(o.kernel_timeout_ms, 10_000, "an unparsable number is the default");
        assert!(o.l2_discard, "only 0 turns a default-on knob off");
        assert_eq!(o.normal_sms, None, "fewer than 2 SMs is ignored");
        assert_eq!(o.normal_dispatch_rings, RingsWanted::Invalid("shared".into()));
        assert_eq!(o.normal_combine_rings, RingsWanted::Default);
        assert!(!o.cluster_times, "only 1 turns a default-off knob on");
        let wire = o.wire.unwrap_err();
        assert!(wire.contains("EPTWIN_WIRE") && wire.contains("auto, verbs or tcp"), "{wire}");
    }

    #[test]
    fn the_kernel_cache_falls_back_to_xdg_then_home() {
        let xdg = with(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]);
        assert_eq!(xdg.kernel_cache_dir, Some(PathBuf::from("/x/eptwin/kernels")));
        let home = with(&[("HOME", "/h")]);
        assert_eq!(home.kernel_cache_dir, Some(PathBuf::from("/h/.cache/eptwin/kernels")));
    }

    #[test]
    fn dispatch_discards_only_when_both_knobs_are_on() {
        let o = |a: &str, b: &str| {
            with(&[("EPTWIN_L2_DISCARD", a), ("EPTWIN_L2_DISCARD_DISPATCH", b)])
                .discard_in_dispatch()
        };
        assert!(o("1", "1") && !o("0", "1") && !o("1", "0"));
    }
}
