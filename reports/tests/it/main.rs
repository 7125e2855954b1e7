//! Renders every chart from the committed FIXTURE documents (`tests/fixtures/`, made by
//! `make_fixtures.py`) and checks the files: PNG signature and dimensions, SVG size and the
//! axis labels and titles it must carry, and the index.html that links them.
//!
//! Set `EPTWIN_REPORT_KEEP=DIR` to keep the rendered report for a look.

use std::path::{Path, PathBuf};

use eptwin_reports::{Inputs, build, plan};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn all_inputs() -> Inputs {
    let f = fixtures();
    Inputs::load(&[
        f.join("results"),
        f.join("sweep/index.json"),
        f.join("traces/ep16-ll.trace.json"),
    ])
    .unwrap()
}

fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is not a PNG", path.display());
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

fn out_dir() -> (Option<tempfile::TempDir>, PathBuf) {
    match std::env::var_os("EPTWIN_REPORT_KEEP") {
        Some(dir) => (None, PathBuf::from(dir)),
        None => {
            let t = tempfile::tempdir().unwrap();
            let p = t.path().to_path_buf();
            (Some(t), p)
        }
    }
}

/// Chart id -> strings its SVG must contain (axis descriptions with units, legend words).
const EXPECTED: &[(&str, &[&str])] = &[
    (
        "latency-sim-vs-measured",
        &["latency (µs)", "simulator (", "measured (1× NVIDIA H200)", "h200-ep8-ll-128 · dispatch"],
    ),
    ("latency-vs-published", &["latency (µs)", "published (DeepEP V1 README", "ep32-ll · combine"]),
    ("bandwidth-vs-published", &["logical bandwidth (GB/s)", "ep64-normal-internode · dispatch"]),
    (
        "ep-scaling",
        &[
            "EP size (ranks)",
            "mean latency (µs)",
            "logical bandwidth (GB/s)",
            "ep*-ll: latency",
            "ep*-normal: bandwidth",
            "✕: published",
        ],
    ),
    (
        "vl-isolation-cdf",
        &[
            "dispatch latency (µs)",
            "fraction of iterations",
            "alone (SL1 → VL1)",
            "shared with bulk",
            "own lane",
        ],
    ),
    (
        "sweep-qp-depth",
        &[
            "NVSHMEM_QP_DEPTH (log2 axis)",
            "throughput: logical bandwidth, algbw (GB/s)",
            "mean latency (µs)",
            "qps_per_peer=2",
            "no result",
        ],
    ),
    (
        "timeline-ep16-ll",
        &[
            "time since the dispatch started (µs)",
            "GPU 0 · send warps",
            "IB link node0→node1 · VL1 data",
            "rdma",
            "nvlink",
        ],
    ),
];

#[test]
fn renders_every_chart_from_fixtures() {
    let (_keep, out) = out_dir();
    let inputs = all_inputs();
    assert_eq!(inputs.results.len(), 17);
    assert!(inputs.ignored.is_empty(), "{:?}", inputs.ignored);
    let report = build(&inputs, &out).unwrap();
    let ids: Vec<&str> = report.charts.iter().map(|c| c.id.as_str()).collect();
    for (id, _) in EXPECTED {
        assert!(
            ids.contains(id),
            "chart {id} missing; drawn: {ids:?}; skipped: {:?}",
            report.skipped
        );
    }
    assert_eq!(report.charts.len(), EXPECTED.len(), "{ids:?}");
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    for chart in &report.charts {
        let (w, h) = png_size(&chart.png);
        assert_eq!((w, h), (chart.width, chart.height), "{}", chart.id);
        assert!(w >= 1000 && h >= 360, "{}: {w}x{h}", chart.id);
        let png_bytes = std::fs::metadata(&chart.png).unwrap().len();
        // A blank or nearly blank image compresses to a few kB.
        assert!(png_bytes > 20_000, "{}: PNG only {png_bytes} bytes", chart.id);
        let svg = std::fs::read_to_string(&chart.svg).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains(&format!("width=\"{w}\"")), "{}", chart.id);
        assert!(svg.len() > 5_000, "{}: SVG only {} bytes", chart.id, svg.len());
        let expected = EXPECTED.iter().find(|e| e.0 == chart.id).unwrap().1;
        for text in expected {
            assert!(svg.contains(text), "{}: SVG lacks {text:?}", chart.id);
        }
        assert!(
            svg.contains(&chart.title.replace('"', "&quot;").replace('\'', "&apos;"))
                || svg.contains(chart.title.split(':').next().unwrap()),
            "{}: title",
            chart.id
        );
    }
    let html = std::fs::read_to_string(&report.index_html).unwrap();
    for chart in &report.charts {
        assert!(html.contains(&format!("src=\"{}.png\"", chart.id)), "index lacks {}", chart.id);
        assert!(
            html.contains(&format!("href=\"{}.svg\"", chart.id)),
            "index lacks {} svg",
            chart.id
        );
    }
    // The summary table: the simulator's error against the measurement, and the waived run.
    assert!(html.contains("<td class=\"l n\">h200-ep8-ll-128</td>"), "summary row");
    assert!(html.contains("hw waived: 2 jobs share the fabric"), "waived reason");
    // ep32-ll combine is the fixture's one number outside its tolerance (+11.x %).
    assert_eq!(html.matches("<span class=alert>+11.").count(), 1, "out-of-tolerance error in red");
}

#[test]
fn charts_appear_only_when_their_inputs_do() {
    let f = fixtures();
    // Simulator results of the H800 suite only: no measurement, no sweep, no trace.
    let inputs =
        Inputs::load(&[f.join("results/sim/ep8-ll.json"), f.join("results/sim/ep16-ll.json")])
            .unwrap();
    let (planned, skipped) = plan(&inputs);
    let drawn: Vec<&str> = planned.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(drawn, ["latency-vs-published", "ep-scaling"]);
    let skipped: Vec<&str> = skipped.iter().map(|s| s.chart.as_str()).collect();
    assert_eq!(
        skipped,
        [
            "latency-sim-vs-measured",
            "bandwidth-vs-published",
            "vl-isolation-cdf",
            "sweep",
            "timeline"
        ]
    );
    // One EP size is not a scaling line.
    let inputs = Inputs::load(&[f.join("results/sim/ep8-ll.json")]).unwrap();
    let (_, skipped) = plan(&inputs);
    let scaling = skipped.iter().find(|s| s.chart == "ep-scaling").unwrap();
    assert!(scaling.reason.contains("two or more EP sizes"), "{}", scaling.reason);
}

#[test]
fn explicit_files_must_be_documents_but_directories_may_hold_others() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("notes.json");
    std::fs::write(&other, "{\"hello\": 1}").unwrap();
    let err = Inputs::load(std::slice::from_ref(&other)).unwrap_err().to_string();
    assert!(err.contains("notes.json") && err.contains("neither an eptwin result"), "{err}");
    let inputs = Inputs::load(&[dir.path().to_path_buf()]).unwrap();
    assert_eq!(inputs.ignored.len(), 1);
}

#[test]
fn report_output_is_deterministic() {
    let inputs = all_inputs();
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    build(&inputs, a.path()).unwrap();
    build(&inputs, b.path()).unwrap();
    for name in ["index.html", "ep-scaling.svg", "sweep-qp-depth.png"] {
        let x = std::fs::read(a.path().join(name)).unwrap();
        let y = std::fs::read(b.path().join(name)).unwrap();
        assert!(x == y, "{name} differs between two renders");
    }
}

#[test]
fn sweep_point_results_stay_out_of_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixtures();
    std::fs::copy(f.join("sweep/index.json"), dir.path().join("index.json")).unwrap();
    // A point result of the sweep (p002.json per the index) and an unrelated result.
    std::fs::copy(f.join("results/sim/ep8-ll.json"), dir.path().join("p002.json")).unwrap();
    std::fs::copy(f.join("results/sim/ep16-ll.json"), dir.path().join("ep16-ll.json")).unwrap();
    std::fs::create_dir(dir.path().join("qp-depth")).unwrap();
    std::fs::rename(dir.path().join("p002.json"), dir.path().join("qp-depth/p002.json")).unwrap();
    let inputs = Inputs::load(&[dir.path().to_path_buf()]).unwrap();
    assert_eq!(inputs.results.len(), 1);
    assert_eq!(inputs.results[0].doc.scenario.name, "ep16-ll");
    assert_eq!(inputs.sweep_points.len(), 1);
}
