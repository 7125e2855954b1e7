//! The human table `eptwin run` prints, in the shape nccl-tests users already read.

use std::fmt::Write;

use eptwin_engine::api::{RunResult, Verdict};

/// Render one result as a table (stdout); one line per (job, op).
pub fn render(result: &RunResult) -> String {
    let mut out = String::new();
    let backend = result.backend_kind();
    let detail = match backend {
        "sim" => {
            // A job replaying a routing file is named by its file: its seed moves nothing.
            let replayed = |job: &str| result.scenario.routing_files.iter().any(|f| f.job == job);
            let seeds: Vec<String> = result
                .jobs
                .iter()
                .filter(|j| !replayed(&j.name))
                .filter_map(|j| j.facts.get("seed").map(|s| s.to_string()))
                .collect();
            let files: String = result
                .scenario
                .routing_files
                .iter()
                .map(|f| format!(", routing file {} (sha256 {:.12})", f.file, f.sha256))
                .collect();
            format!(
                "simulator {}{}",
                result.backend.get("version").and_then(|v| v.as_str()).unwrap_or("?"),
                if seeds.is_empty() {
                    String::new()
                } else {
                    format!(", routing seed {}", seeds.join("/"))
                },
            ) + &files
        }
        _ => {
            result.backend.get("gpus").map(|g| g.to_string()).unwrap_or_else(|| backend.to_string())
        }
    };
    let _ = writeln!(out, "# eptwin: {} on {backend} ({detail})", result.scenario.name);
    wire_line(result, backend, &mut out);
    if result.verdict == Verdict::Waived {
        let _ = writeln!(
            out,
            "#  Waived: {}",
            result.waived_reason.as_deref().unwrap_or("not available here")
        );
        return out;
    }
    let _ = writeln!(
        out,
        "#  bw: DeepEP's logical bytes per rank / mean time; link: the link DeepEP's test names \
         that bandwidth for (logical_bw_label), NVL where it says RDMA but no byte crossed RDMA; \
         nvlink(MB), rdma(MB): bytes of one op summed over all ranks; masked: ranks DeepEP's \
         shrink mode masked (enable_shrink)"
    );
    if result.jobs.iter().flat_map(|j| &j.ops).any(|o| !o.summary.phases_us.is_empty()) {
        let _ = writeln!(
            out,
            "#  phase rows: a part of the op above, mean over ranks (send: from the op's start \
             until the rank's sends and signals were out; recv: the receive kernel of hook mode; \
             notify: the normal kernels' count exchange); parts may overlap, so they need not \
             add up to the op"
        );
    }
    // min = max: every sample took the same time (the mean may differ in its last bit).
    let all_equal = result
        .jobs
        .iter()
        .flat_map(|j| &j.ops)
        .all(|o| o.summary.latency_us.min == o.summary.latency_us.max);
    if backend == "sim" && all_equal {
        let _ = writeln!(
            out,
            "#  simulator: every iteration runs on an idle machine and takes the same time, so \
             mean = p50 = p99 = min = max"
        );
    }
    let _ = writeln!(
        out,
        "# {:<12} {:<9} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>5} {:>11} {:>11} {:>7} masked",
        "job",
        "op",
        "ranks",
        "mean(us)",
        "p50(us)",
        "p99(us)",
        "min(us)",
        "max(us)",
        "bw(GB/s)",
        "link",
        "nvlink(MB)",
        "rdma(MB)",
        "#wrong"
    );
    for job in &result.jobs {
        let masked = rank_ranges(&job.masked_ranks);
        for op in &job.ops {
            let s = &op.summary;
            let _ = writeln!(
                out,
                "  {:<12} {:<9} {:>5} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>9.2} {:>5} {:>11.2} {:>11.2} {:>7} {masked}",
                truncate(&job.name, 12),
                op.op,
                job.ranks,
                s.latency_us.mean,
                s.latency_us.p50,
                s.latency_us.p99,
                s.latency_us.min,
                s.latency_us.max,
                s.logical_bw_gbps,
                link_column(s),
                s.nvlink_bytes as f64 / 1e6,
                s.rdma_bytes as f64 / 1e6,
                s.wrong
            );
            for (phase, us) in &s.phases_us {
                let _ = writeln!(out, "  {:<12} {:<9} phase {phase}: {us:.2} us", "", "");
            }
            if let Some(r) = &op.reference {
                let what = match (r.latency_us, r.logical_bw_gbps) {
                    (Some(l), _) => format!("{l:.1} us"),
                    (None, Some(b)) => format!("{b:.1} GB/s"),
                    _ => String::new(),
                };
                let _ = writeln!(
                    out,
                    "  {:<12} {:<9} reference {what} ({}): error {:+.1}% (tolerance ±{:.0}%) {}",
                    "",
                    "",
                    r.source,
                    r.error_pct,
                    r.tolerance_pct,
                    if r.within_tolerance { "ok" } else { "OUT OF TOLERANCE" }
                );
            }
        }
    }
    for (name, value) in &result.measurements {
        let _ = writeln!(out, "# measured {name}: {value}");
    }
    for f in &result.failures {
        let _ = writeln!(out, "# FAILED: {f}");
    }
    let _ = writeln!(out, "# verdict: {}", result.verdict.as_str());
    out
}

/// Ranks as ranges (`0-7,9`), `-` for none.
fn rank_ranges(ranks: &[u32]) -> String {
    if ranks.is_empty() {
        return "-".into();
    }
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// The `# wire:` line of a hardware or imported result: which wire, and its data path.
fn wire_line(result: &RunResult, backend: &str, out: &mut String) {
    match crate::describe::wire(result) {
        Some("tcp") => {
            let _ = writeln!(
                out,
                "# wire: tcp (sockets between the nodes' processes: TCP and PCIe times, not a \
                 fabric measurement)"
            );
        }
        Some(w) if w != "none" => {
            // The hardware backend reports its wire's data path; DeepEP's own kernels
            // (imported) move bytes with NVSHMEM and say nothing of one.
            let path = result
                .backend
                .get("wire_report")
                .and_then(|r| r.get("data_path"))
                .and_then(|p| p.as_str());
            match path {
                Some(path) => writeln!(out, "# wire: {w} (data path {path})"),
                None if backend == "deepep" => {
                    writeln!(out, "# wire: {w} (DeepEP's own kernels through NVSHMEM)")
                }
                None => writeln!(out, "# wire: {w}"),
            }
            .ok();
        }
        _ => {}
    }
}

/// The link column: DeepEP's bandwidth label (`logical_bw_label`), unless no byte took that
/// link: low-latency results count "RDMA" bandwidth even when every peer is reached over
/// NVLink.
fn link_column(s: &eptwin_engine::api::Summary) -> &str {
    match s.logical_bw_label.as_str() {
        "RDMA" if s.rdma_bytes == 0 && s.nvlink_bytes > 0 => "NVL",
        "RDMA" if s.rdma_bytes == 0 => "-",
        label => label,
    }
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        text.chars().take(width - 1).chain(['~']).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> RunResult {
        RunResult::from_json(include_str!("../tests/fixtures/results/sim/ep16-ll.json")).unwrap()
    }

    #[test]
    fn one_line_per_op_with_the_reference_verdict() {
        let mut result = fixture();
        let table = render(&result);
        assert!(table.starts_with("# eptwin: "), "{table}");
        assert!(table.contains("  decode") && table.contains("dispatch"), "{table}");
        assert!(table.contains("(tolerance ±") && !table.contains("OUT OF TOLERANCE"), "{table}");
        assert!(table.ends_with("# verdict: ok\n"), "{table}");
        let reference = result.jobs[0].ops[0].reference.as_mut().unwrap();
        reference.within_tolerance = false;
        assert!(render(&result).contains("OUT OF TOLERANCE"));
    }

    #[test]
    fn waived_results_say_why_and_nothing_else() {
        let mut result = fixture();
        result.verdict = Verdict::Waived;
        result.waived_reason = Some("no GPU".into());
        let table = render(&result);
        assert!(table.contains("#  Waived: no GPU"), "{table}");
        assert!(!table.contains("mean(us)"), "{table}");
    }

    #[test]
    fn the_wire_is_named() {
        let mut result = fixture();
        assert!(!render(&result).contains("# wire:"), "no wire, no line");
        result.backend.insert("wire".into(), serde_json::json!("tcp"));
        assert!(
            render(&result).contains("# wire: tcp (") && render(&result).contains("not a fabric")
        );
        result.backend.insert("wire".into(), serde_json::json!("verbs"));
        result.backend.insert("wire_report".into(), serde_json::json!({"data_path": "staged"}));
        assert!(render(&result).contains("# wire: verbs (data path staged)"));
        result.backend.remove("wire_report");
        assert!(render(&result).contains("# wire: verbs\n"), "no data path, no question mark");
        result.backend.insert("kind".into(), serde_json::json!("deepep"));
        assert!(render(&result).contains("# wire: verbs (DeepEP's own kernels through NVSHMEM)"));
        result.backend.insert("wire".into(), serde_json::json!("none"));
        assert!(!render(&result).contains("# wire:"));
    }

    #[test]
    fn masked_ranks_show_as_ranges() {
        let mut result = fixture();
        assert!(render(&result).lines().any(|l| l.starts_with("  decode") && l.ends_with(" -")));
        result.jobs[0].masked_ranks = vec![0, 1, 2, 5, 7, 8];
        let table = render(&result);
        assert!(
            table.lines().any(|l| l.starts_with("  decode") && l.ends_with(" 0-2,5,7-8")),
            "{table}"
        );
        assert!(table.contains("masked: ranks DeepEP's shrink mode masked"), "{table}");
    }

    #[test]
    fn long_job_names_are_cut_with_a_tilde() {
        assert_eq!(truncate("decode", 12), "decode");
        assert_eq!(truncate("a-very-long-job-name", 12), "a-very-long~");
    }

    /// The fixture with one op whose bytes crossed `rdma_bytes` of RDMA, whose samples are
    /// `spread` or all equal, from backend `kind`.
    fn shaped(kind: &str, rdma_bytes: u64, spread: bool) -> RunResult {
        let mut result = fixture();
        result.backend.insert("kind".into(), serde_json::json!(kind));
        result.jobs.truncate(1);
        result.jobs[0].ops.truncate(1);
        let s = &mut result.jobs[0].ops[0].summary;
        s.logical_bw_label = "RDMA".into();
        s.rdma_bytes = rdma_bytes;
        s.nvlink_bytes = 5_000_000;
        let l = &mut s.latency_us;
        (l.mean, l.p50, l.min) = (10.0, 10.0, 10.0);
        (l.p99, l.max) = if spread { (12.0, 12.0) } else { (10.0, 10.0) };
        result
    }

    #[test]
    fn the_link_column_names_a_link_bytes_crossed() {
        let nvlink_only = render(&shaped("sim", 0, false));
        assert!(nvlink_only.contains("  NVL "), "{nvlink_only}");
        let rdma = render(&shaped("sim", 1, false));
        assert!(rdma.contains(" RDMA "), "{rdma}");
    }

    #[test]
    fn the_header_says_what_the_columns_are() {
        let sim = render(&shaped("sim", 0, false));
        assert!(sim.contains("summed over all ranks"), "{sim}");
        assert!(sim.contains("mean = p50 = p99 = min = max"), "{sim}");
        // Spread samples (hardware, or a shared fabric) get no such note.
        assert!(!render(&shaped("sim", 0, true)).contains("mean = p50"));
        assert!(!render(&shaped("hw", 0, false)).contains("idle machine"));
        assert!(sim.contains("; link: the link DeepEP's test names"), "{sim}");
        assert!(!sim.contains("phase rows"), "no phases, no legend");
        let mut phased = shaped("sim", 0, false);
        phased.jobs[0].ops[0].summary.phases_us.insert("send".into(), 4.0);
        let t = render(&phased);
        assert!(
            t.contains("#  phase rows: a part of the op above")
                && t.contains("phase send: 4.00 us")
        );
    }
}
