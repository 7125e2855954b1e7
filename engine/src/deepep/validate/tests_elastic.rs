//! DeepEP V2 (`api = "elastic"`): a valid job plans as V2, and each invalid configuration is
//! refused with its key named.

use super::tests::{check, errors};
use super::*;

const V2_EP16: &str = r#"
schema = 1
name = "v2-ep16"
[cluster]
profile = "h100-cx7"
nodes = 2
[[job]]
name = "v2"
[job.buffer]
api = "elastic"
num_max_tokens_per_rank = 8192
use_fp8_dispatch = true
num_sms = 12
[job.env]
[job.workload]
tokens_per_rank = 8192
hidden = 7168
topk = 8
experts = 256
"#;

/// `old` → `new` in the valid job: exactly one error, at `key`, by `rule`.
fn refused(old: &str, new: &str, key: &str, rule: &str) {
    assert!(V2_EP16.contains(old), "{old:?} not in the base scenario");
    let e = errors(&V2_EP16.replacen(old, new, 1));
    assert!(
        e.iter().any(|d| d.key == key && d.rule == rule),
        "{new:?}: expected {rule} at {key}, got {:#?}",
        e.iter().map(|d| d.to_string()).collect::<Vec<_>>()
    );
    let text = e.iter().find(|d| d.key == key).unwrap().to_string();
    assert!(text.starts_with("t.toml:"), "{text}");
}

fn plan(text: &str) -> Plan {
    let loaded = crate::parse("t.toml", text).unwrap();
    let (d, plan) = validate(&loaded.scenario, &loaded.source);
    plan.unwrap_or_else(|| panic!("{d:#?}"))
}

#[test]
fn a_valid_v2_job_plans_as_elastic() {
    let p = plan(V2_EP16);
    let d = p.jobs[0].deepep().unwrap();
    let e = d.elastic.expect("elastic settings");
    assert!(e.hybrid);
    assert_eq!((e.num_scaleout_ranks, e.num_scaleup_ranks), (2, 8));
    assert_eq!((e.num_sms, e.channels_per_sm, e.num_channels), (12, 8, 96));
    assert_eq!((e.num_allocated_qps, e.num_qps), (129, 129));
    assert_eq!((e.sl, p.jobs[0].sl.0, p.jobs[0].vl().map(|v| v.0)), (3, 3, Some(3)));
    assert_eq!(p.jobs[0].nvshmem.qp_depth, 1024);
    // num_sms = 0: V2's analytic choice, 12 for this shape on an H100-class NVLink.
    let auto = plan(&V2_EP16.replace("num_sms = 12", "num_sms = 0"));
    let e = auto.jobs[0].deepep().unwrap().elastic.unwrap();
    assert_eq!((e.num_sms, e.num_sms_auto), (12, true));
    // EP_OVERRIDE_RDMA_SL wins over sl_idx.
    let o = plan(&V2_EP16.replace("[job.env]", "[job.env]\nEP_OVERRIDE_RDMA_SL = \"5\""));
    assert_eq!(o.jobs[0].sl.0, 5);
    // Direct mode: FULL connections, 17 QPs, at most 9 per call.
    let direct = plan(&V2_EP16.replace("num_sms = 12", "num_sms = 12\nallow_hybrid_mode = false"));
    let e = direct.jobs[0].deepep().unwrap().elastic.unwrap();
    assert_eq!((e.hybrid, e.num_allocated_qps, e.num_qps), (false, 17, 9));
}

#[test]
fn twenty_plus_invalid_v2_configurations_name_their_key() {
    let b = "job[0].buffer";
    let w = "job[0].workload";
    let cases: &[(&str, &str, String, &str)] = &[
        ("num_sms = 12", "num_sms = 12\nsl_idx = 16", format!("{b}.sl_idx"), "sl-idx"),
        (
            "[job.env]",
            "[job.env]\nEP_OVERRIDE_RDMA_SL = \"16\"",
            "job[0].env.EP_OVERRIDE_RDMA_SL".into(),
            "sl-idx",
        ),
        (
            "[job.env]",
            "[job.env]\nEP_OVERRIDE_RDMA_SL = \"three\"",
            "job[0].env.EP_OVERRIDE_RDMA_SL".into(),
            "sl-idx",
        ),
        ("num_sms = 12", "num_sms = 12\nnum_qps = 200", format!("{b}.num_qps"), "v2-qps"),
        (
            "num_sms = 12",
            "num_sms = 12\nnum_allocated_qps = 8\nnum_qps = 9",
            format!("{b}.num_qps"),
            "v2-qps",
        ),
        ("num_sms = 12", "num_sms = 200", format!("{b}.num_sms"), "num-sms-device"),
        ("num_sms = 12", "num_sms = 1", format!("{b}.num_sms"), "v2-num-sms"),
        (
            "num_max_tokens_per_rank = 8192\n",
            "",
            format!("{b}.num_max_tokens_per_rank"),
            "v2-max-tokens",
        ),
        (
            "num_max_tokens_per_rank = 8192",
            "num_max_tokens_per_rank = 4096",
            format!("{b}.num_max_tokens_per_rank"),
            "v2-max-tokens",
        ),
        (
            "num_sms = 12",
            "num_sms = 12\nnum_bytes = \"3MiB\"",
            format!("{b}.num_bytes"),
            "v2-buffer-align",
        ),
        (
            "num_sms = 12",
            "num_sms = 12\nnum_bytes = \"64MiB\"",
            format!("{b}.num_bytes"),
            "v2-buffer-size",
        ),
        (
            "use_fp8_dispatch = true",
            "use_fp8_dispatch = true\nnum_gpu_timeout_secs = 0",
            format!("{b}.num_gpu_timeout_secs"),
            "v2-timeout",
        ),
        (
            "use_fp8_dispatch = true",
            "use_fp8_dispatch = true\nnum_cpu_timeout_secs = 0",
            format!("{b}.num_cpu_timeout_secs"),
            "v2-timeout",
        ),
        (
            "num_sms = 12",
            "num_sms = 12\nnum_qps_per_rank = 24",
            format!("{b}.num_qps_per_rank"),
            "buffer-api",
        ),
        (
            "num_sms = 12",
            "num_sms = 12\nlow_latency_mode = true",
            format!("{b}.low_latency_mode"),
            "buffer-api",
        ),
        (
            "num_sms = 12",
            "num_sms = 12\nnum_rdma_bytes = \"1GiB\"",
            format!("{b}.num_rdma_bytes"),
            "buffer-api",
        ),
        ("api = \"elastic\"\n", "", format!("{b}.num_max_tokens_per_rank"), "buffer-api"),
        ("experts = 256", "experts = 4096", format!("{w}.experts"), "v2-experts"),
        ("experts = 256", "experts = 255", format!("{w}.experts"), "experts-divisible"),
        ("topk = 8", "topk = 33", format!("{w}.topk"), "topk"),
        ("hidden = 7168", "hidden = 7200", format!("{w}.hidden"), "v2-hidden"),
        (
            "experts = 256",
            "experts = 256\ncombine_dtype = \"logfmt\"",
            format!("{w}.combine_dtype"),
            "v2-dtype",
        ),
        ("experts = 256", "experts = 256\nhook = true", format!("{w}.hook"), "hook"),
        (
            "[job.env]",
            "[job.env]\nEP_DISABLE_GIN = \"1\"",
            "job[0].env.EP_DISABLE_GIN".into(),
            "v2-gin-disabled",
        ),
        (
            "[job.env]",
            "[job.env]\nEP_NUM_TOPK_IDX_BITS = \"12\"",
            "job[0].env.EP_NUM_TOPK_IDX_BITS".into(),
            "topk-idx-bits",
        ),
        (
            "num_sms = 12",
            "num_sms = 12\nnum_allocated_qps = 300000",
            format!("{b}.num_allocated_qps"),
            "v2-qp-budget",
        ),
        (
            "nodes = 2",
            "nodes = 2\nranks_per_gpu = 2",
            "cluster.ranks_per_gpu".into(),
            "v2-ranks-per-gpu",
        ),
        (
            "num_sms = 12",
            "num_sms = 0\nnum_bytes = \"2MiB\"",
            format!("{b}.num_bytes"),
            "v2-buffer-size",
        ),
    ];
    let cases: Vec<_> = cases
        .iter()
        .cloned()
        .chain([
            (
                "profile = \"h100-cx7\"",
                "profile = \"h200-single\"",
                "cluster.profile".to_string(),
                "v2-profile",
            ),
            (
                "num_max_tokens_per_rank = 8192",
                "num_max_tokens_per_rank = 4294967295\nnum_bytes = \"2GiB\"",
                format!("{b}.num_bytes"),
                "v2-buffer-size",
            ),
        ])
        .collect();
    assert!(cases.len() >= 20);
    for (old, new, key, rule) in &cases {
        refused(old, new, key, rule);
    }
}

#[test]
fn v2_limits_on_ranks_and_domains() {
    // 40 NVLink domains of 8: more than the hybrid kernels' 32 scale-out lanes.
    let small = V2_EP16.replace("tokens_per_rank = 8192", "tokens_per_rank = 128");
    let big = small.replace("nodes = 2", "nodes = 40").replace("experts = 256", "experts = 320");
    let e = errors(&big);
    assert!(
        e.iter().any(|d| d.rule == "v2-scaleout" && d.key == "job[0].buffer.allow_hybrid_mode"),
        "{e:#?}"
    );
    // 1032 ranks: over kNumMaxRanks.
    let huge = small.replace("nodes = 2", "nodes = 129").replace("experts = 256", "experts = 1032");
    let e = errors(&huge);
    assert!(e.iter().any(|d| d.rule == "v2-ranks"), "{e:#?}");
}

#[test]
fn nvshmem_variables_are_advice_for_a_v2_job() {
    let d = check(&V2_EP16.replace("[job.env]", "[job.env]\nNVSHMEM_IB_SL = \"1\""));
    assert!(d.iter().all(|d| !d.is_error()), "{d:#?}");
    assert!(d.iter().any(|d| d.rule == "v2-no-nvshmem"));
    let p = plan(&V2_EP16.replace("[job.env]", "[job.env]\nNCCL_GIN_CROSS_NIC = \"0\""));
    let env = &p.jobs[0].env;
    assert_eq!(env["NCCL_SYM_REUSE_SYSMEM_HANDLES"].value, "1");
    assert_eq!(p.jobs[0].sl.0, 3, "NVSHMEM_IB_SL does not move a V2 job");
}
