//! Validation of hostile and extreme scenarios: advice that can be followed, and costs that
//! stay linear in the number of jobs.

use eptwin_engine::deepep::validate::validate;
use eptwin_engine::parse;

fn diagnostics(text: &str) -> Vec<String> {
    let loaded = parse("h.toml", text).expect("parses");
    validate(&loaded.scenario, &loaded.source).0.iter().map(|d| d.to_string()).collect()
}

const LL: &str = r#"
schema = 1
name = "ll"
[cluster]
profile = "h800-cx7"
nodes = 1
[[job]]
name = "decode"
[job.buffer]
low_latency_mode = true
num_rdma_bytes = "1TiB"
num_qps_per_rank = 36
[job.env]
NVSHMEM_QP_DEPTH = "@DEPTH@"
[job.workload]
tokens_per_rank = @TOKENS@
hidden = 7168
topk = 8
experts = 288
"#;

fn ll(tokens: u32, depth: u32) -> String {
    LL.replace("@TOKENS@", &tokens.to_string()).replace("@DEPTH@", &depth.to_string())
}

/// LL with 20,000 tokens needs a depth of 40,002, above NVSHMEM's 32,768: the advice says
/// what does work instead of a depth the next rule rejects.
#[test]
fn ll_qp_depth_advice_can_be_followed() {
    let found = diagnostics(&ll(20_000, 32_768));
    let line = found.iter().find(|l| l.contains("error[ll-qp-depth]")).expect("ll-qp-depth");
    assert!(
        line.ends_with(
            "QP depth 32768 < 2·(T+1) = 40002 for T = 20000: DeepEP refuses every LL \
             dispatch/combine (buffer.py:602, 656; PR #430); no depth fits: NVSHMEM's largest, \
             32768, allows T ≤ 16383; dispatch at most 16383 tokens per call (tokens_per_rank ≤ \
             16383), or this cannot run in low-latency mode"
        ),
        "{line}"
    );
    assert!(!line.contains("65536"), "{line}");
    // Within NVSHMEM's range the advice is a depth it accepts.
    let found = diagnostics(&ll(1000, 1024));
    let line = found.iter().find(|l| l.contains("error[ll-qp-depth]")).expect("ll-qp-depth");
    assert!(line.ends_with("set NVSHMEM_QP_DEPTH ≥ 2048"), "{line}");
    // And the largest T it names does validate at the largest depth.
    let ok = diagnostics(&ll(16_383, 32_768));
    assert!(!ok.iter().any(|l| l.contains("ll-qp-depth")), "{ok:#?}");
}

fn many_jobs(n: usize) -> String {
    let mut text = format!(
        "schema = 1\nname = \"many\"\n[cluster]\nprofile = \"h800-cx7\"\nnodes = {}\n",
        n.div_ceil(8)
    );
    for i in 0..n {
        text.push_str(&format!(
            "[[job]]\nname = \"j{i}\"\nranks = [{i}]\n[job.buffer]\nnum_nvl_bytes = \"1GiB\"\n\
             [job.workload]\ntokens_per_rank = 1\nhidden = 7168\ntopk = 1\nexperts = 1\n\
             warmup = 0\niterations = 1\nops = [\"dispatch\"]\n"
        ));
    }
    text
}

/// Jobs sharing a VL get one advisory each, naming the first job there (one per pair made
/// 1,000 jobs half a million advisories and 27 s of validation).
#[test]
fn shared_vl_advice_is_linear_in_jobs() {
    let found = diagnostics(&many_jobs(1000));
    let shared: Vec<&String> = found.iter().filter(|l| l.contains("shared-vl")).collect();
    assert_eq!(shared.len(), 999);
    assert!(
        shared[0].contains("job \"j1\": job[1].env: shares VL0 with job \"j0\":"),
        "{}",
        shared[0]
    );
    assert!(
        shared[998].contains("shares VL0 with job \"j0\" and 998 other job(s)"),
        "{}",
        shared[998]
    );
}
