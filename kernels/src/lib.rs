//! eptwin's CUDA kernels: the `.cu`/`.cuh` sources under `kernels/cuda/`, embedded with
//! `include_str!` and compiled at run time by NVRTC (in `eptwin-hw`) for the device's own
//! architecture. No build script, no nvcc.
//!
//! Architecture Invariant: [`MODULES`] lists every `.cu` file and every `extern "C" __global__`
//! entry point in it, and nothing else; a test reads the sources and checks both directions.
//!
//! API Boundary: [`KernelModule`] (id, file, entry points) and [`KernelModule::expanded_source`]
//! (the source with the shared headers inlined), which is what the compiler and its on-disk
//! cache key see.

/// Identifies one compiled module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ModuleId {
    /// `get_dispatch_layout`.
    Layout,
    /// Normal intranode notify, dispatch and combine (needs `NUM_RANKS`, `NUM_THREADS`,
    /// `MIN_BLOCKS`).
    Intranode,
    /// Low-latency dispatch and combine (needs `HIDDEN`, `LL_THREADS`).
    LowLatency,
    /// Copy, latency and launch probes.
    Probes,
    /// Stand-in experts and output digests used by the correctness checks.
    TestData,
    /// Normal intranode dispatch with the rings in cluster shared memory (sm_90+, all ranks on
    /// one GPU; needs `NUM_RANKS` ≤ 8).
    IntranodeCluster,
    /// The ring handoff through thread-block-cluster shared memory (sm_90+ only; optional
    /// `CLUSTER_SIZE`, `CL_THREADS`, `CL_UNROLL`).
    Cluster,
    /// Normal internode dispatch and combine over the CPU-proxy wire (needs `RANKS_PER_NODE`).
    Internode,
    /// The barrier between the processes of one run before each timed launch.
    Sync,
}

/// One `.cu` file: its id, name, embedded source and the entry points it defines.
#[derive(Debug)]
pub struct KernelModule {
    pub id: ModuleId,
    pub file: &'static str,
    pub source: &'static str,
    pub entry_points: &'static [&'static str],
    /// `-D` macros the module requires (compilation fails without them).
    pub required_defines: &'static [&'static str],
}

/// Shared headers, by the name the sources `#include "..."` them with.
pub static HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../cuda/common.cuh")),
    ("normal.cuh", include_str!("../cuda/normal.cuh")),
    ("cluster.cuh", include_str!("../cuda/cluster.cuh")),
    ("wire.cuh", include_str!("../cuda/wire.cuh")),
];

/// Every kernel module.
pub static MODULES: &[KernelModule] = &[
    KernelModule {
        id: ModuleId::Layout,
        file: "layout.cu",
        source: include_str!("../cuda/layout.cu"),
        entry_points: &["get_dispatch_layout"],
        required_defines: &[],
    },
    KernelModule {
        id: ModuleId::Intranode,
        file: "intranode.cu",
        source: include_str!("../cuda/intranode.cu"),
        entry_points: &[
            "intranode_notify_dispatch",
            "intranode_dispatch",
            "intranode_notify_combine",
            "intranode_combine",
        ],
        required_defines: &["NUM_RANKS"],
    },
    KernelModule {
        id: ModuleId::LowLatency,
        file: "low_latency.cu",
        source: include_str!("../cuda/low_latency.cu"),
        entry_points: &["ll_dispatch", "ll_combine"],
        required_defines: &["HIDDEN"],
    },
    KernelModule {
        id: ModuleId::Probes,
        file: "probes.cu",
        source: include_str!("../cuda/probes.cu"),
        entry_points: &[
            "probe_copy",
            "probe_read",
            "probe_empty",
            "probe_pingpong",
            "probe_warp_copy",
            "probe_chase",
            "probe_op_latency",
            "probe_pingpong_gpu",
            "probe_ring_handoff",
            "probe_ll_send",
            "probe_ll_recv",
        ],
        required_defines: &[],
    },
    KernelModule {
        id: ModuleId::TestData,
        file: "testdata.cu",
        source: include_str!("../cuda/testdata.cu"),
        entry_points: &["make_expert_output_normal", "make_expert_output_ll", "digest_rows"],
        required_defines: &[],
    },
    KernelModule {
        id: ModuleId::IntranodeCluster,
        file: "intranode_cluster.cu",
        source: include_str!("../cuda/intranode_cluster.cu"),
        entry_points: &[
            "intranode_dispatch_cluster",
            "intranode_combine_cluster",
            "probe_cluster_reduce",
            "probe_launch_plain",
            "probe_launch_dispatch_cluster",
            "probe_launch_combine_cluster",
            "probe_launch_combine_cluster_frame",
        ],
        required_defines: &["NUM_RANKS"],
    },
    KernelModule {
        id: ModuleId::Cluster,
        file: "cluster.cu",
        source: include_str!("../cuda/cluster.cu"),
        entry_points: &["probe_cluster_handoff", "probe_cluster_tma_handoff"],
        required_defines: &[],
    },
    KernelModule {
        id: ModuleId::Internode,
        file: "internode.cu",
        source: include_str!("../cuda/internode.cu"),
        entry_points: &["internode_dispatch", "internode_combine"],
        required_defines: &["RANKS_PER_NODE"],
    },
    KernelModule {
        id: ModuleId::Sync,
        file: "sync.cu",
        source: include_str!("../cuda/sync.cu"),
        entry_points: &["process_barrier", "fault_delay"],
        required_defines: &[],
    },
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("{file}:{line}: #include \"{header}\" names no header in kernels::HEADERS")]
    UnknownHeader { file: String, line: usize, header: String },
}

/// The module with this id.
pub fn module(id: ModuleId) -> &'static KernelModule {
    MODULES.iter().find(|m| m.id == id).expect("every ModuleId has a row in MODULES")
}

impl KernelModule {
    /// The source with every `#include "header"` replaced by the header's text (each header
    /// once; `#pragma once` lines dropped), so NVRTC needs no include path and the cache key
    /// covers the headers too.
    pub fn expanded_source(&self) -> Result<String, KernelError> {
        let mut out = String::with_capacity(self.source.len() * 2);
        let mut included = Vec::new();
        expand(self.file, self.source, &mut out, &mut included)?;
        Ok(out)
    }
}

fn expand(
    file: &str,
    source: &str,
    out: &mut String,
    included: &mut Vec<&'static str>,
) -> Result<(), KernelError> {
    for (i, line) in source.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#pragma once") {
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix("#include") {
            let name = rest.trim().trim_matches(|c| c == '"' || c == '<' || c == '>');
            let Some(&(hname, htext)) = HEADERS.iter().find(|(h, _)| *h == name) else {
                return Err(KernelError::UnknownHeader {
                    file: file.to_string(),
                    line: i + 1,
                    header: name.to_string(),
                });
            };
            if !included.contains(&hname) {
                included.push(hname);
                out.push_str(&format!("// ---- begin {hname}\n"));
                expand(hname, htext, out, included)?;
                out.push_str(&format!("// ---- end {hname}\n"));
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(())
}

/// The `extern "C" __global__` entry points a source defines, in order of appearance.
pub fn entry_points_in(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = source;
    while let Some(pos) = rest.find("__global__") {
        let after = &rest[pos + "__global__".len()..];
        // Declarations look like `__global__ void [__launch_bounds__(...)] name(`.
        let Some(paren) = find_name_paren(after) else { break };
        let head = after[..paren].trim_end();
        let name: String = head
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if !name.is_empty() {
            names.push(name);
        }
        rest = &after[paren..];
    }
    names
}

/// Index of the `(` that opens the parameter list, skipping `__launch_bounds__(...)` and
/// `__cluster_dims__(...)`.
fn find_name_paren(s: &str) -> Option<usize> {
    let mut i = 0;
    let bytes = s.as_bytes();
    while i < bytes.len() {
        if s[i..].starts_with("__launch_bounds__") || s[i..].starts_with("__cluster_dims__") {
            let open = s[i..].find('(')? + i;
            let close = s[open..].find(')')? + open;
            i = close + 1;
            continue;
        }
        if bytes[i] == b'(' {
            return Some(i);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_sources_agree() {
        for m in MODULES {
            let found = entry_points_in(m.source);
            assert_eq!(
                found, m.entry_points,
                "{}: entry points in the source vs the table",
                m.file
            );
            for line in m.source.lines().filter(|l| l.contains("__global__")) {
                assert!(line.contains("extern \"C\""), "{}: {line:?} must be extern \"C\"", m.file);
            }
        }
    }

    #[test]
    fn every_cu_file_is_in_the_table() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("kernels/cuda exists")
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        on_disk.sort();
        let cu: Vec<&String> = on_disk.iter().filter(|f| f.ends_with(".cu")).collect();
        let mut table: Vec<&str> = MODULES.iter().map(|m| m.file).collect();
        table.sort();
        assert_eq!(cu, table, "every .cu file has a row in MODULES and vice versa");
        for h in on_disk.iter().filter(|f| f.ends_with(".cuh")) {
            assert!(HEADERS.iter().any(|(n, _)| n == h), "{h} is missing from HEADERS");
        }
        for m in MODULES {
            let on_disk = std::fs::read_to_string(dir.join(m.file)).unwrap();
            assert_eq!(on_disk, m.source, "{} is embedded as it is on disk", m.file);
        }
    }

    #[test]
    fn includes_expand_once() {
        for m in MODULES {
            let src = m.expanded_source().unwrap();
            assert!(!src.contains("#include"), "{}", m.file);
            assert_eq!(src.matches("// ---- begin common.cuh").count(), 1, "{}", m.file);
            for name in m.entry_points {
                assert!(src.contains(name));
            }
        }
    }

    #[test]
    fn entry_point_parser() {
        let src = "extern \"C\" __global__ void __launch_bounds__(NUM_THREADS, 2)\n  foo(int a) {}\n\
                   extern \"C\" __global__ void bar() {}";
        assert_eq!(entry_points_in(src), vec!["foo", "bar"]);
        let clustered = "extern \"C\" __global__ void __cluster_dims__(8, 1, 1)\n    \
                         __launch_bounds__(512, 1) baz(int x) {}";
        assert_eq!(entry_points_in(clustered), vec!["baz"]);
    }

    #[test]
    fn unknown_header_is_an_error() {
        let mut out = String::new();
        let err = expand("x.cu", "#include \"nope.cuh\"\n", &mut out, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, KernelError::UnknownHeader { line: 1, .. }));
    }

    #[test]
    fn every_module_id_has_a_row() {
        for id in [
            ModuleId::Layout,
            ModuleId::Intranode,
            ModuleId::LowLatency,
            ModuleId::Probes,
            ModuleId::TestData,
            ModuleId::IntranodeCluster,
            ModuleId::Cluster,
            ModuleId::Sync,
        ] {
            assert_eq!(module(id).id, id);
        }
    }
}
