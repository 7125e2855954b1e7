//! The validation pass's rules on small scenarios: each rule fires with its key and position,
//! every error is reported, and valid scenarios pass.

use super::*;
use crate::diag::{Diagnostic, Severity};

/// A valid two-node low-latency EP16 decode, the base the rule tests edit (also the `[[fault]]`
/// tests' base, `faults/tests.rs`).
pub(in crate::deepep::validate) const LL_EP16: &str = r#"
schema = 1
name = "ll-ep16"
[cluster]
profile = "h800-cx7"
nodes = 2
[[job]]
name = "decode"
[job.buffer]
low_latency_mode = true
num_rdma_bytes = "2GiB"
num_qps_per_rank = 16
[job.env]
NVSHMEM_IB_SL = "1"
[job.workload]
tokens_per_rank = 128
hidden = 7168
topk = 8
experts = 256
"#;

/// Every diagnostic of validating `text` (also the V2 rule tests', `tests_elastic.rs`).
pub(in crate::deepep::validate) fn check(text: &str) -> Vec<Diagnostic> {
    let loaded = crate::parse("t.toml", text).unwrap();
    validate(&loaded.scenario, &loaded.source).0
}

/// The errors among them.
pub(in crate::deepep::validate) fn errors(text: &str) -> Vec<Diagnostic> {
    check(text).into_iter().filter(|d| d.severity == Severity::Error).collect()
}

fn rules(diags: &[Diagnostic]) -> Vec<&str> {
    diags.iter().map(|d| d.rule.as_str()).collect()
}

#[test]
fn valid_low_latency_passes() {
    let d = check(LL_EP16);
    assert!(d.iter().all(|d| !d.is_error()), "{d:#?}");
}

#[test]
fn qps_below_local_experts_is_a_device_trap() {
    let e = errors(&LL_EP16.replace("num_qps_per_rank = 16", "num_qps_per_rank = 8"));
    assert_eq!(rules(&e), ["ll-qps-ge-local-experts"]);
    let text = e[0].to_string();
    assert!(
        text.starts_with("t.toml:12:1: error[ll-qps-ge-local-experts]: job \"decode\""),
        "{text}"
    );
    assert!(text.contains("16 local experts") && text.contains("internode_ll.cu:285"), "{text}");
    // More QPs than local experts is legal but advised against.
    let d = check(&LL_EP16.replace("num_qps_per_rank = 16", "num_qps_per_rank = 24"));
    assert!(
        d.iter().any(|d| d.rule == "ll-qps-eq-local-experts" && d.severity == Severity::Advisory)
    );
}

#[test]
fn qp_depth_must_cover_two_phases() {
    let text = LL_EP16.replace("tokens_per_rank = 128", "tokens_per_rank = 512");
    let e = errors(&text.replace("2GiB", "8GiB"));
    assert_eq!(rules(&e), ["ll-qp-depth"], "{e:#?}");
    assert!(e[0].message.contains("1026"));
    let ok = text
        .replace("2GiB", "8GiB")
        .replace("NVSHMEM_IB_SL = \"1\"", "NVSHMEM_IB_SL = \"1\"\nNVSHMEM_QP_DEPTH = \"2048\"");
    assert!(errors(&ok).is_empty());
}

#[test]
fn reports_every_error_not_just_the_first() {
    let text = LL_EP16
        .replace("num_qps_per_rank = 16", "num_qps_per_rank = 8")
        .replace("num_rdma_bytes = \"2GiB\"", "num_rdma_bytes = \"1GiB\"")
        .replace("topk = 8", "topk = 12")
        .replace("NVSHMEM_IB_SL = \"1\"", "NVSHMEM_IB_SL = \"16\"");
    let e = errors(&text);
    let r = rules(&e);
    for rule in ["ll-qps-ge-local-experts", "ll-buffer-size", "topk", "ib-sl"] {
        assert!(r.contains(&rule), "missing {rule}: {r:?}");
    }
}

#[test]
fn normal_internode_rules() {
    let normal = r#"
schema = 1
name = "n"
[cluster]
profile = "h800-cx7"
nodes = 4
[[job]]
name = "train"
[job.buffer]
num_nvl_bytes = "2e9"
num_rdma_bytes = "1e9"
num_sms = 24
[job.workload]
tokens_per_rank = 4096
hidden = 7168
topk = 8
experts = 256
routing = "node-limited"
topk_groups = 4
"#;
    assert!(errors(normal).is_empty(), "{:#?}", errors(normal));
    // 32 SMs = 16 channels: 24 QPs is neither 16 nor ≥ 32.
    assert_eq!(rules(&errors(&normal.replace("num_sms = 24", "num_sms = 32"))), ["normal-qps"]);
    assert_eq!(rules(&errors(&normal.replace("num_sms = 24", "num_sms = 23"))), ["num-sms-even"]);
    // 3 nodes with the plain Config defaults: 256 % 3 != 0 in combine.
    let three = normal
        .replace("nodes = 4", "nodes = 3")
        .replace("experts = 256", "experts = 288")
        .replace("topk_groups = 4", "topk_groups = 3")
        .replace(
            "num_sms = 24",
            "num_sms = 24\n[job.buffer.combine_config]\nnum_max_nvl_chunked_recv_tokens = 256",
        );
    assert_eq!(rules(&errors(&three)), ["combine-nvl-recv"], "{:#?}", errors(&three));
    // RDMA buffer too small for the hint.
    let small = normal.replace("num_rdma_bytes = \"1e9\"", "num_rdma_bytes = \"64MiB\"");
    assert_eq!(rules(&errors(&small)), ["rdma-buffer-size"]);
}

#[test]
fn intranode_rules() {
    let intra = r#"
schema = 1
name = "i"
[cluster]
profile = "h800-cx7"
nodes = 1
[[job]]
name = "j"
[job.buffer]
num_nvl_bytes = "1GiB"
[job.workload]
tokens_per_rank = 4096
hidden = 7168
topk = 8
experts = 256
"#;
    assert!(errors(intra).is_empty(), "{:#?}", errors(intra));
    let rdma = intra
        .replace("num_nvl_bytes = \"1GiB\"", "num_nvl_bytes = \"1GiB\"\nnum_rdma_bytes = \"1GiB\"");
    assert_eq!(rules(&errors(&rdma)), ["rdma-bytes-intranode"]);
    let six = intra.replace("name = \"j\"", "name = \"j\"\nranks = \"0-5\"");
    assert!(rules(&errors(&six)).contains(&"kernel-instantiation"));
    let tiny = intra.replace("\"1GiB\"", "\"100MiB\"");
    assert_eq!(rules(&errors(&tiny)), ["nvl-buffer-size"]);
    let unaligned = intra.replace("\"1GiB\"", "1000000001");
    assert!(rules(&errors(&unaligned)).contains(&"buffer-align"));
}

#[test]
fn fabric_rules() {
    let two_jobs = format!(
        "{LL_EP16}\n[[job]]\nname = \"bulk\"\n[job.env]\nNVSHMEM_IB_SL = \"1\"\n[job.traffic]\npattern = \"all-to-all\"\nbytes_per_rank = \"256MiB\"\n"
    );
    let d = check(&two_jobs);
    assert!(d.iter().any(|d| d.rule == "shared-vl"), "{d:#?}");
    let bad_vl = LL_EP16.replace(
        "nodes = 2",
        "nodes = 2\n[cluster.fabric]\nvlarb_low = \"0:64\"\nvlarb_high = \"2:64\"",
    );
    assert_eq!(rules(&errors(&bad_vl)), ["vl-never-scheduled"]);
    let bad_map = LL_EP16.replace(
        "nodes = 2",
        "nodes = 2\n[cluster.fabric]\nsl2vl = [0,9,2,3,4,5,6,7,0,1,2,3,4,5,6,7]",
    );
    let e = errors(&bad_map);
    assert!(rules(&e).contains(&"fabric"), "{e:#?}");
    assert_eq!(e[0].location.as_ref().unwrap().line, 8, "points at the written key");
    let bad_table =
        LL_EP16.replace("nodes = 2", "nodes = 2\n[cluster.fabric]\nvlarb_low = \"1:300\"");
    assert!(errors(&bad_table)[0].message.contains("exceeds 255"));
}

#[test]
fn pcie_sku_check_and_bypass() {
    let pcie = r#"
schema = 1
name = "p"
[cluster]
profile = "h100-cx7"
nodes = 1
gpus_per_node = 4
nvlink = "pcie-pairs"
[cluster.overrides.gpu]
name = "NVIDIA H100 PCIE"
[[job]]
name = "j"
[job.buffer]
num_nvl_bytes = "1GiB"
[job.workload]
tokens_per_rank = 256
hidden = 7168
topk = 8
experts = 256
"#;
    let e = errors(pcie);
    assert!(rules(&e).contains(&"nvlink-check"), "{e:#?}");
    let bypassed =
        pcie.replace("[job.workload]", "[job.env]\nDISABLE_NVLINK_CHECK = \"1\"\n[job.workload]");
    assert!(!rules(&errors(&bypassed)).contains(&"nvlink-check"));
    let pair = pcie.replace("name = \"j\"", "name = \"j\"\nranks = [0, 1]");
    assert!(errors(&pair).is_empty(), "{:#?}", errors(&pair));
}
