//! A DeepEP V2 job (`[job.buffer] api = "elastic"`): `ElasticBuffer`'s arguments and every
//! host-side assert and derived rule of the `tokenspeed-deepep` 2.1.0.post20260810 build of
//! v2.1.0 (docs/design.md, "DeepEP V2"), the variables V2 and NCCL GIN read, the SL its GIN
//! QPs carry and the lane it selects; the job's plan when nothing failed.

use std::collections::BTreeMap;

use super::{Job, deepep::check_nvlink, workload};
use crate::deepep::buffer::BufferSettings;
use crate::deepep::config::EpMode;
use crate::deepep::elastic::{self as v2, ElasticSettings, GinConnection, SmModelInputs, defaults};
use crate::deepep::env::{EnvOrigin, EnvVar, NvshmemSettings, parse_env_u64};
use crate::diag::Diagnostics;
use crate::fabric::{FabricQos, Lane};
use crate::ids::{JobId, Rank, Sl, Vl};
use crate::plan::{DeepEpJob, JobKind, JobPlan};
use crate::scenario::schema::{BufferSpec, Dtype, FabricKind, LEGACY_BUFFER_KEYS, WorkloadSpec};
use crate::workload::Workload;

/// V2's keys in a V1 buffer: each an error naming the API it belongs to.
pub(super) fn check_legacy_has_no_elastic_keys(
    job: &Job<'_>,
    b: &BufferSpec,
    d: &mut Diagnostics<'_>,
) {
    for k in b.elastic_keys_set() {
        d.error(
            "buffer-api",
            &format!("{}.buffer.{k}", job.prefix),
            job.name(),
            format!("{k} is an argument of DeepEP V2's ElasticBuffer (elastic.py:228-246); this buffer is V1's Buffer (api = \"legacy\", the default): set api = \"elastic\" or remove {k}"),
        );
    }
}

/// The user's variables as V2 reads them.
struct V2Env {
    sl_override: Option<u8>,
    gin_disabled: bool,
}

/// The job's rules and plan: (the VL it travels on, the plan when nothing failed).
pub(super) fn resolve_job(
    id: JobId,
    job: &Job<'_>,
    b: &BufferSpec,
    qos: Option<&FabricQos>,
    d: &mut Diagnostics<'_>,
) -> (Option<Vl>, Option<JobPlan>) {
    let spec = job.spec;
    check_no_legacy_keys(job, d);
    let user = check_env(job, d);
    let (sl, sl_from_env) = match user.sl_override {
        Some(sl) => (sl, true),
        None => (check_sl_idx(job, b, d), false),
    };
    let lane = qos.and_then(|q| check_lane(job, Sl(sl), sl_from_env, q, d));
    let vl = lane.and_then(Lane::vl);
    let Some(w) = &spec.workload else {
        d.error(
            "job-kind",
            &job.prefix,
            job.name(),
            "missing [job.workload]: a DeepEP V2 job needs [job.buffer] and [job.workload]".into(),
        );
        return (vl, None);
    };
    if spec.traffic.is_some() {
        d.error("job-kind", &format!("{}.traffic", job.prefix), job.name(), "a job has either [job.buffer] + [job.workload] (DeepEP) or [job.traffic] (background), not both".into());
        return (vl, None);
    }
    let settings = check_buffer(job, b, w, &user, (sl, sl_from_env), d);
    check_nvlink(job, spec.env.get("DISABLE_NVLINK_CHECK").is_some_and(|v| v == "1"), d);
    let routing_file = workload::routing_file(job, w, d);
    let (Some(lane), Some(settings)) = (lane, settings) else { return (vl, None) };
    let n = job.ranks.len() as u32;
    let mode = if settings.num_rdma_ranks > 1 { EpMode::Internode } else { EpMode::Intranode };
    let dj =
        DeepEpJob::new(mode, BufferSettings::from(b), Workload::from_spec(w, n), (None, None), n)
            .with_elastic(settings);
    let dj = match routing_file {
        Some(loaded) => dj.with_routing_file(loaded),
        None => dj,
    };
    let nvshmem = NvshmemSettings {
        ib_sl: sl,
        traffic_class: None,
        qp_depth: v2::GIN_QP_DEPTH,
        disable_p2p: false,
        disable_mnnvl: false,
        num_rc_per_pe: settings.num_allocated_qps,
        gid_index: None,
    };
    let plan = JobPlan {
        id,
        name: spec.name.clone(),
        ranks: job.ranks.iter().map(|&r| Rank(r)).collect(),
        env: effective_env(&spec.env),
        nvshmem,
        sl: Sl(sl),
        lane,
        warmup: w.warmup,
        iterations: w.iterations,
        ops: w.ops.clone(),
        reference: spec.reference.clone(),
        kind: JobKind::DeepEp(Box::new(dj)),
    };
    (vl, Some(plan))
}

/// V1's keys written in a V2 buffer (found in the source: they have serde defaults).
fn check_no_legacy_keys(job: &Job<'_>, d: &mut Diagnostics<'_>) {
    for k in LEGACY_BUFFER_KEYS {
        let key = format!("{}.buffer.{k}", job.prefix);
        if d.source().has(&key) {
            d.error("buffer-api", &key, job.name(), format!("{k} is an argument of DeepEP V1's Buffer (api = \"legacy\"); this buffer is V2's ElasticBuffer (api = \"elastic\"), which has no {k} (elastic.py:228-246)"));
        }
    }
}

/// The environment `ElasticBuffer.__init__` leaves: the user's variables, and
/// `NCCL_SYM_REUSE_SYSMEM_HANDLES=1` by `setdefault` when `NCCL_GIN_CROSS_NIC=0`
/// (elastic.py:279-282).
pub fn effective_env(user: &BTreeMap<String, String>) -> BTreeMap<String, EnvVar> {
    let mut env: BTreeMap<String, EnvVar> = user
        .iter()
        .map(|(k, v)| {
            let var = EnvVar {
                value: v.clone(),
                origin: EnvOrigin::User,
                source: None,
                overwritten: None,
            };
            (k.clone(), var)
        })
        .collect();
    if user.get("NCCL_GIN_CROSS_NIC").map(String::as_str) == Some("0") {
        let name = "NCCL_SYM_REUSE_SYSMEM_HANDLES";
        let source = Some("deep_ep/buffers/elastic.py:279-282".to_string());
        match env.get_mut(name) {
            Some(v) => {
                v.origin = EnvOrigin::UserKeptByDeepEp;
                v.source = source;
            }
            None => {
                let var = EnvVar {
                    value: "1".into(),
                    origin: EnvOrigin::DeepEp,
                    source,
                    overwritten: None,
                };
                env.insert(name.into(), var);
            }
        }
    }
    env
}

fn check_env(job: &Job<'_>, d: &mut Diagnostics<'_>) -> V2Env {
    let (prefix, name) = (job.prefix.as_str(), job.name());
    let mut out = V2Env { sl_override: None, gin_disabled: false };
    for (var, value) in &job.spec.env {
        let key = format!("{prefix}.env.{var}");
        match var.as_str() {
            // Python's int(): a malformed value raises ValueError in the constructor.
            "EP_OVERRIDE_RDMA_SL" => match value.trim().parse::<i64>() {
                Ok(v) if (0..=15).contains(&v) => out.sl_override = Some(v as u8),
                Ok(v) => d.error("sl-idx", &key, name, format!("EP_OVERRIDE_RDMA_SL = {v}: the SL of the GIN QPs is 0..=15 (a 4-bit IB service level); it overrides sl_idx (elastic.py:323-324)")),
                Err(_) => d.error("sl-idx", &key, name, format!("EP_OVERRIDE_RDMA_SL = {value:?}: int() raises ValueError in ElasticBuffer.__init__ (elastic.py:324)")),
            },
            "EP_DISABLE_GIN" => out.gin_disabled = parse_env_u64(value).is_some_and(|v| v != 0),
            "EP_NUM_TOPK_IDX_BITS" if !matches!(value.trim(), "8" | "16" | "32" | "64") => {
                d.error("topk-idx-bits", &key, name, format!("EP_NUM_TOPK_IDX_BITS = {value:?}: int_with_bits has 8, 16, 32 and 64 (common/compiled.cuh:66-72)"));
            }
            v if v.starts_with("NVSHMEM_") => d.advisory("v2-no-nvshmem", &key, name, format!("{v}: DeepEP V2 (ElasticBuffer) runs on NCCL GIN and does not read NVSHMEM variables")),
            v if (v.starts_with("EP_") || v.starts_with("NCCL_")) && v2::v2_var(v).is_none() => {
                d.advisory("env-not-modelled", &key, name, format!("{v} is passed through to the environment but not modelled by the simulator"));
            }
            _ => {}
        }
    }
    out
}

fn check_sl_idx(job: &Job<'_>, b: &BufferSpec, d: &mut Diagnostics<'_>) -> u8 {
    let sl = b.sl_idx.unwrap_or(defaults::SL_IDX);
    if sl > 15 {
        d.error("sl-idx", &format!("{}.buffer.sl_idx", job.prefix), job.name(), format!("sl_idx = {sl}: the GIN traffic class is an IB service level 0..=15 (4-bit LRH field; elastic.py:243 passes it to NCCL's ginTrafficClass)"));
        return 0;
    }
    sl as u8
}

/// The lane the SL selects (RoCE: priority ≤ 7; IB: SL2VL must reach a scheduled VL).
fn check_lane(
    job: &Job<'_>,
    sl: Sl,
    from_env: bool,
    qos: &FabricQos,
    d: &mut Diagnostics<'_>,
) -> Option<Lane> {
    let key = if from_env {
        format!("{}.env.EP_OVERRIDE_RDMA_SL", job.prefix)
    } else {
        format!("{}.buffer.sl_idx", job.prefix)
    };
    if qos.kind == FabricKind::Roce {
        if sl.0 > 7 {
            d.error(
                "roce-priority",
                &key,
                job.name(),
                format!("SL {} is the Ethernet priority on RoCE: must be 0..=7", sl.0),
            );
            return None;
        }
        return qos.lane_of(sl);
    }
    match qos.vl_of(sl) {
        None => {
            d.error(
                "sl-dropped",
                &key,
                job.name(),
                format!("SL{} maps to VL15 in sl2vl: its packets are dropped", sl.0),
            );
            None
        }
        Some(vl) => {
            if !qos.vl_is_scheduled(vl) {
                d.error("vl-never-scheduled", &key, job.name(), format!("SL{} → VL{}, which has no entry with weight > 0 in vlarb_high or vlarb_low: the arbiter never sends it", sl.0, vl.0));
            }
            qos.lane_of(sl)
        }
    }
}

/// The physical domains: NVLink ranks = NCCL's LSA team (the job's ranks in one NVLink
/// domain), which must tile the ranks in order (nccl.cu host assert `num_ranks % num_nvl_ranks
/// == 0 and nvl_rank_idx == rank_idx % num_nvl_ranks`).
fn domains(job: &Job<'_>, d: &mut Diagnostics<'_>) -> Option<(u32, u32)> {
    let topo = job.topo;
    let n = job.ranks.len() as u32;
    let domain = |r: u32| -> (u32, u32) {
        let g = topo.gpu_of(Rank(r));
        (topo.nvlink_domain(g).map_or(g.0 * 1_000_000, |x| x), g.0)
    };
    if topo.ranks_per_gpu > 1 {
        d.error("v2-ranks-per-gpu", "cluster.ranks_per_gpu", job.name(), format!("ranks_per_gpu = {}: V2 runs on one NCCL communicator, and NCCL refuses two ranks on one GPU (ncclCommInitRank: duplicate GPU) [verify]", topo.ranks_per_gpu));
        return None;
    }
    let first = domain(job.ranks[0]).0;
    let lsa = job.ranks.iter().take_while(|&&r| domain(r).0 == first).count() as u32;
    let tiled = n.is_multiple_of(lsa)
        && job.ranks.chunks(lsa as usize).all(|c| c.iter().all(|&r| domain(r).0 == domain(c[0]).0))
        && job
            .ranks
            .chunks(lsa as usize)
            .collect::<Vec<_>>()
            .windows(2)
            .all(|w| domain(w[0][0]).0 != domain(w[1][0]).0);
    if !tiled {
        d.error("v2-nvl-domain", &format!("{}.ranks", job.prefix), job.name(), format!("the job's ranks do not tile equal NVLink domains in order ({lsa} in the first): NCCL's LSA team must hold rank_idx % num_nvl_ranks (nccl.cu host assert `num_ranks % num_nvl_ranks == 0 and nvl_rank_idx == rank_idx % num_nvl_ranks`)"));
        return None;
    }
    Some((n / lsa, lsa))
}

/// Every argument of `ElasticBuffer(...)` and of the dispatch/combine call; the settings.
fn check_buffer(
    job: &Job<'_>,
    b: &BufferSpec,
    w: &WorkloadSpec,
    user: &V2Env,
    (sl, sl_from_env): (u8, bool),
    d: &mut Diagnostics<'_>,
) -> Option<ElasticSettings> {
    let (prefix, name, profile) = (job.prefix.as_str(), job.name(), job.profile);
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    let n = job.ranks.len() as u32;
    if profile.deepep.elastic_tma_fill_ns.is_none() || profile.deepep.elastic_sm_tma_gbps.is_none()
    {
        d.error("v2-profile", "cluster.profile", name, format!("profile {:?} has no DeepEP V2 costs (deepep.elastic_tma_fill_ns, deepep.elastic_sm_tma_gbps): the simulator cannot time V2's TMA copies on it; the CX7 profiles have them", profile.name));
    }
    let shape_ok = check_workload(job, b, w, d);
    let (rdma_ranks, nvl_ranks) = domains(job, d)?;
    let hybrid_allowed = b.allow_hybrid_mode.unwrap_or(defaults::ALLOW_HYBRID_MODE);
    let hybrid = hybrid_allowed && rdma_ranks > 1;
    let (so, su) = if hybrid { (rdma_ranks, nvl_ranks) } else { (1, n) };
    if n > v2::NUM_MAX_RANKS {
        d.error(
            "v2-ranks",
            &format!("{prefix}.ranks"),
            name,
            format!("{n} ranks > kNumMaxRanks = 1024 (common/layout.cuh:106, 125)"),
        );
    }
    if hybrid && so > v2::MAX_SCALEOUT_RANKS {
        d.error("v2-scaleout", &bkey("allow_hybrid_mode"), name, format!("{so} scale-out ranks (NVLink domains) > 32: the hybrid kernels keep one lane per scale-out rank (hybrid_dispatch.cuh:336, 485); use allow_hybrid_mode = false"));
    }
    if hybrid && su > v2::MAX_SCALEUP_RANKS {
        d.error(
            "v2-scaleup",
            &bkey("allow_hybrid_mode"),
            name,
            format!("{su} scale-up ranks > 64 (hybrid_dispatch.cuh:603, hybrid_combine.cuh:178)"),
        );
    }
    if user.gin_disabled && rdma_ranks > 1 {
        d.error(
            "v2-gin-disabled",
            &format!("{prefix}.env.EP_DISABLE_GIN"),
            name,
            format!(
                "EP_DISABLE_GIN=1 leaves NVLink only, but the job spans {rdma_ranks} NVLink domains"
            ),
        );
    }
    // QPs: allocated at construction, used per call.
    let fast = v2::nic_has_fast_rdma_atomics(&profile.nic.name);
    let allocated = match b.num_allocated_qps {
        None | Some(0) => v2::auto_allocated_qps(hybrid_allowed, fast),
        Some(q) => q,
    };
    // SMs: the analytic count, or the call's.
    let device_sms = profile.gpu.sm_count;
    let auto = b.num_sms == 0 || !d.source().has(&bkey("num_sms"));
    let num_sms = if auto {
        let x = SmModelInputs {
            num_ranks: n,
            num_scaleout_ranks: so,
            num_scaleup_ranks: su,
            num_rdma_ranks: rdma_ranks,
            num_nvlink_ranks: nvl_ranks,
            rdma_gbs: profile.nic.link_gbps,
            nvlink_gbs: profile.nvlink.bw_per_direction_gbps * defaults::NVLINK_FACTOR,
            device_sms,
            prefer_overlap_with_compute: b
                .prefer_overlap_with_compute
                .unwrap_or(defaults::PREFER_OVERLAP_WITH_COMPUTE),
        };
        if shape_ok { v2::theoretical_num_sms(w.experts, w.topk, &x) } else { device_sms }
    } else {
        b.num_sms
    };
    if num_sms > device_sms {
        d.error("num-sms-device", &bkey("num_sms"), name, format!("num_sms = {num_sms} exceeds the {device_sms} SMs of a {} (host assert `num_sms <= jit::device_runtime->get_num_sms()`)", profile.gpu.name));
    }
    if hybrid && su > 1 && num_sms < 2 {
        d.error("v2-num-sms", &bkey("num_sms"), name, format!("num_sms = {num_sms}: a hybrid barrier needs at least 2 SMs (comm.cuh:236 device assert)"));
    }
    let num_qps = match b.num_qps {
        None | Some(0) => v2::theoretical_num_qps(num_sms, hybrid_allowed, allocated),
        Some(q) => q,
    };
    if num_qps > allocated {
        d.error("v2-qps", &bkey("num_qps"), name, format!("num_qps = {num_qps} > num_allocated_qps = {allocated}: \"Allocated QPs are not enough\" (elastic.py:930, 1088)"));
    }
    let connection = if hybrid { GinConnection::Rail } else { GinConnection::Full };
    let peers = if hybrid { so - 1 } else { n - nvl_ranks };
    if let Some(max) = profile.nic.max_qps
        && !user.gin_disabled
        && (allocated as u64) * (peers as u64) > max as u64
    {
        let key = if b.num_allocated_qps.is_some() {
            bkey("num_allocated_qps")
        } else {
            bkey("allow_hybrid_mode")
        };
        d.error("v2-qp-budget", &key, name, format!("{allocated} QPs × {peers} {} peers = {} QPs per GPU > the {}'s {max} (nic.max_qps): the NIC runs out of QPs (DeepEP #649: \"most of them are unnecessary\"); set num_allocated_qps lower", if hybrid { "rail" } else { "remote" }, allocated as u64 * peers as u64, profile.nic.name));
    }
    // Channels and the buffer.
    let dispatch_tok = v2::dispatch_token_bytes(w.hidden, w.topk, w.dispatch_dtype);
    let combine_tok = v2::combine_token_bytes(w.hidden, w.topk);
    let per_sm = v2::channels_per_sm(dispatch_tok, combine_tok, hybrid);
    let channels = per_sm * num_sms.max(1);
    if channels > v2::NUM_MAX_CHANNELS {
        d.error("v2-channels", &bkey("num_sms"), name, format!("{num_sms} SMs × {per_sm} channels = {channels} > kNumMaxChannels = 1024 (common/compiled.cuh:83)"));
    }
    let (t, num_bytes) = check_buffer_bytes(job, b, w, (so, su, channels), d);
    let (cpu_timeout, gpu_timeout) = check_call_flags(job, b, w, d);
    let multiple = b.allow_multiple_reduction.unwrap_or(defaults::ALLOW_MULTIPLE_REDUCTION);
    let use_fp8 = b.use_fp8_dispatch.unwrap_or(false);
    if !shape_ok {
        return None;
    }
    Some(ElasticSettings {
        hybrid,
        num_scaleout_ranks: so,
        num_scaleup_ranks: su,
        num_rdma_ranks: rdma_ranks,
        num_nvlink_ranks: nvl_ranks,
        num_sms,
        num_sms_auto: auto,
        channels_per_sm: per_sm,
        num_channels: channels,
        num_qps,
        num_allocated_qps: allocated,
        num_allocated_qps_auto: matches!(b.num_allocated_qps, None | Some(0)),
        connection,
        sl,
        sl_from_env,
        gin_disabled: user.gin_disabled,
        use_fp8_dispatch: use_fp8,
        deterministic: b.deterministic.unwrap_or(false),
        allow_multiple_reduction: multiple,
        prefer_overlap_with_compute: b
            .prefer_overlap_with_compute
            .unwrap_or(defaults::PREFER_OVERLAP_WITH_COMPUTE),
        num_max_tokens_per_rank: t,
        num_bytes,
        num_cpu_timeout_secs: cpu_timeout,
        num_gpu_timeout_secs: gpu_timeout,
    })
}

/// The buffer against what dispatch and combine lay out in it (`(so, su, channels)` the
/// logical domains and channels): `(num_max_tokens_per_rank, num_bytes)`.
fn check_buffer_bytes(
    job: &Job<'_>,
    b: &BufferSpec,
    w: &WorkloadSpec,
    (so, su, channels): (u32, u32, u32),
    d: &mut Diagnostics<'_>,
) -> (u32, u64) {
    let (prefix, name) = (job.prefix.as_str(), job.name());
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    let combine_tok = v2::combine_token_bytes(w.hidden, w.topk);
    let t = b.num_max_tokens_per_rank.unwrap_or(0);
    if w.tokens_per_rank > t {
        d.error("v2-max-tokens", &bkey("num_max_tokens_per_rank"), name, format!("tokens_per_rank = {} > num_max_tokens_per_rank = {t}: host assert `num_tokens <= num_max_tokens_per_rank` (set it in [job.buffer]; DeepEP's default is 0)", w.tokens_per_rank));
    }
    let multiple = b.allow_multiple_reduction.unwrap_or(defaults::ALLOW_MULTIPLE_REDUCTION);
    let use_fp8 = b.use_fp8_dispatch.unwrap_or(false);
    let need = |dtype: Dtype| {
        let tok = v2::dispatch_token_bytes(w.hidden, w.topk, dtype);
        let dis = v2::dispatch_buffer_bytes(tok, t as u64, so as u64, su as u64, channels as u64);
        let com = v2::combine_buffer_bytes(
            combine_tok,
            t as u64,
            (so as u64, su as u64),
            w.topk as u64,
            channels as u64,
            multiple,
        );
        (dis, com)
    };
    let sized_for = if use_fp8 { Dtype::Fp8 } else { Dtype::Bf16 };
    let (dis, com) = need(w.dispatch_dtype);
    let num_bytes = match b.num_bytes.map(|s| s.bytes()) {
        Some(bytes) => {
            if bytes == 0 || !bytes.is_multiple_of(v2::BUFFER_ALIGNMENT_BYTES) {
                d.error("v2-buffer-align", &bkey("num_bytes"), name, format!("num_bytes = {bytes}: must be > 0 and a multiple of 2 MiB (elastic.py:253; symmetric.hpp `num_bytes > 0 and num_bytes % kNumAlignmentBytes == 0`)"));
            }
            bytes
        }
        None => {
            let (sd, sc) = need(sized_for);
            sd.max(sc).next_multiple_of(v2::BUFFER_ALIGNMENT_BYTES)
        }
    };
    if dis > num_bytes && w.ops.contains(&crate::scenario::schema::OpKind::Dispatch) {
        let why = if b.num_bytes.is_none() {
            format!(
                " (the buffer was sized for {} dispatch: use_fp8_dispatch = {use_fp8})",
                if use_fp8 { "FP8" } else { "BF16" }
            )
        } else {
            String::new()
        };
        d.error("v2-buffer-size", &bkey(if b.num_bytes.is_some() { "num_bytes" } else { "use_fp8_dispatch" }), name, format!("dispatch lays out {dis} B > the buffer's {num_bytes} B{why}: host assert `get_dispatch_buffer_size(...) <= num_buffer_bytes`"));
    }
    if com > num_bytes && w.ops.contains(&crate::scenario::schema::OpKind::Combine) {
        d.error("v2-buffer-size", &bkey("num_bytes"), name, format!("combine lays out {com} B > the buffer's {num_bytes} B: host assert `get_combine_buffer_size(...) <= num_buffer_bytes`"));
    }
    (t, num_bytes)
}

/// The timeouts, `deterministic` and the combine type: `(cpu, gpu)` timeouts in seconds.
fn check_call_flags(
    job: &Job<'_>,
    b: &BufferSpec,
    w: &WorkloadSpec,
    d: &mut Diagnostics<'_>,
) -> (u32, u32) {
    let (prefix, name) = (job.prefix.as_str(), job.name());
    let bkey = |k: &str| format!("{prefix}.buffer.{k}");
    let wkey = |k: &str| format!("{prefix}.workload.{k}");
    let cpu_timeout = b.num_cpu_timeout_secs.unwrap_or(defaults::NUM_CPU_TIMEOUT_SECS);
    let gpu_timeout = b.num_gpu_timeout_secs.unwrap_or(defaults::NUM_GPU_TIMEOUT_SECS);
    for (k, v) in [("num_cpu_timeout_secs", cpu_timeout), ("num_gpu_timeout_secs", gpu_timeout)] {
        if v == 0 {
            d.error("v2-timeout", &bkey(k), name, format!("{k} = 0: every wait times out at once (device waits give up after secs × 2e9 cycles, comm.cuh:13, 30-49)"));
        }
    }
    if b.deterministic == Some(true) {
        d.advisory("v2-deterministic", &bkey("deterministic"), name, "deterministic = true sorts the received tokens on the host side after the kernels (elastic.py:1021-1027): the kernels' time, which eptwin reports, does not include it".into());
    }
    if w.combine_dtype != Dtype::Bf16 {
        d.error(
            "v2-dtype",
            &wkey("combine_dtype"),
            name,
            "V2's combine takes BF16 (host assert `x.scalar_type() == torch::kBFloat16`)".into(),
        );
    }
    (cpu_timeout, gpu_timeout)
}

/// The workload against V2's kernels: `false` when its shape is unusable.
fn check_workload(
    job: &Job<'_>,
    b: &BufferSpec,
    w: &WorkloadSpec,
    d: &mut Diagnostics<'_>,
) -> bool {
    let (name, n) = (job.name(), job.ranks.len() as u32);
    let wkey = |k: &str| format!("{}.workload.{k}", job.prefix);
    if w.tokens_per_rank == 0 {
        d.error("tokens", &wkey("tokens_per_rank"), name, "tokens_per_rank must be ≥ 1".into());
    }
    if w.hidden == 0 || w.experts == 0 || w.topk == 0 {
        d.error(
            "workload-shape",
            &format!("{}.workload", job.prefix),
            name,
            "hidden, experts and topk must all be ≥ 1".into(),
        );
        return false;
    }
    let mut ok = true;
    if !w.experts.is_multiple_of(n) {
        d.error("experts-divisible", &wkey("experts"), name, format!("{} experts over {n} ranks: host assert `num_experts % nccl_context->num_ranks == 0` (layout.cuh:124)", w.experts));
        ok = false;
    }
    if w.experts > v2::NUM_MAX_EXPERTS {
        d.error(
            "v2-experts",
            &wkey("experts"),
            name,
            format!("{} experts > kNumMaxExperts = 2048 (common/layout.cuh:107, 126)", w.experts),
        );
        ok = false;
    }
    if w.experts / n > v2::NUM_MAX_EXPERTS_PER_RANK {
        d.error(
            "v2-local-experts",
            &wkey("experts"),
            name,
            format!(
                "{} experts per rank > kNumMaxExpertsPerRank = 256 (common/layout.cuh:108, 127)",
                w.experts / n
            ),
        );
        ok = false;
    }
    if w.topk > v2::MAX_TOPK || w.topk > w.experts {
        d.error("topk", &wkey("topk"), name, format!("topk = {}: V2's kernels keep one lane per selection, at most 32 (dispatch.cuh:93, hybrid_dispatch.cuh:121)", w.topk));
        ok = false;
    }
    // BF16 combine rows move in 32 lanes of 16-B vectors (combine.cuh:109).
    if !w.hidden.is_multiple_of(256) {
        d.error("v2-hidden", &wkey("hidden"), name, format!("hidden = {}: V2's combine needs hidden % 256 == 0 (combine.cuh:109, hybrid_combine.cuh:219 static assert)", w.hidden));
        ok = false;
    }
    if w.dispatch_dtype == Dtype::Logfmt {
        d.error(
            "dispatch-dtype",
            &wkey("dispatch_dtype"),
            name,
            "V2 dispatches FP8 or BF16".into(),
        );
    }
    workload::check_routing(job, w, d);
    workload::check_ops(job, b, w, d);
    ok
}
