//! `index.html`: the summary table, the charts (PNG, linked to their SVG), what was skipped
//! and why, and where every number came from. No script, no external resource, and no
//! timestamp, so the same inputs give the same page.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use crate::compare::Comparison;
use crate::describe;
use crate::inputs::Inputs;

/// A chart the report did not draw, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    pub chart: String,
    pub reason: String,
}

/// A drawn chart.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Written {
    pub id: String,
    pub title: String,
    pub caption: String,
    pub png: PathBuf,
    pub svg: PathBuf,
    pub width: u32,
    pub height: u32,
}

pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn num(v: Option<f64>, prec: usize) -> String {
    v.map(|v| format!("{v:.prec$}")).unwrap_or_else(|| "–".into())
}

fn pct(v: Option<f64>, alert: bool) -> String {
    match v {
        Some(v) if alert => format!("<span class=alert>{v:+.1}</span>"),
        Some(v) => format!("{v:+.1}"),
        None => "–".into(),
    }
}

/// A path relative to the report directory when it lies inside it (charts), else as given.
fn rel(path: &Path, out: &Path) -> String {
    path.strip_prefix(out).unwrap_or(path).display().to_string()
}

const STYLE: &str = "body{font-family:'DejaVu Sans',sans-serif;margin:2em auto;max-width:1250px;\
color:#222;padding:0 1em}table{border-collapse:collapse;font-size:13px;margin:1em 0}\
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f2f2f2}\
td.l,th.l{text-align:left}td.n{white-space:nowrap}td.s{font-size:11px;color:#555}.alert{color:#b01e1e;font-weight:bold}figure{margin:2em 0}\
figure img{max-width:100%;border:1px solid #ddd}figcaption{font-size:14px;color:#444;\
max-width:1150px}code{font-size:13px}.muted{color:#777}";

pub fn index(
    inputs: &Inputs,
    comparisons: &[Comparison],
    charts: &[Written],
    skipped: &[Skipped],
    out: &Path,
) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>eptwin report</title>\
         <style>{STYLE}</style></head><body>\n<h1>eptwin report</h1>\n<p>{} result file(s), {} \
         sweep index(es), {} trace(s). Latency in µs (mean and p99 over the timed iterations); \
         bandwidth is DeepEP's logical bandwidth in GB/s (the bytes its tests count ÷ mean \
         latency). Error = (simulated − reference) / reference.</p>\n",
        inputs.results.len(),
        inputs.sweeps.len(),
        inputs.traces.len()
    );
    summary_table(&mut h, comparisons);
    let _ = writeln!(h, "<h2>Charts</h2>");
    if charts.is_empty() {
        let _ = writeln!(h, "<p>No chart could be drawn from these inputs (see below).</p>");
    }
    for c in charts {
        let _ = writeln!(
            h,
            "<figure id=\"{id}\"><a href=\"{svg}\"><img src=\"{png}\" width={w} height={hgt} \
             alt=\"{title}\"></a><figcaption><b>{title}.</b> {caption} \
             <a href=\"{svg}\">SVG</a></figcaption></figure>",
            id = escape(&c.id),
            svg = escape(&rel(&c.svg, out)),
            png = escape(&rel(&c.png, out)),
            w = c.width,
            hgt = c.height,
            title = escape(&c.title),
            caption = escape(&c.caption),
        );
    }
    if !skipped.is_empty() {
        let _ = writeln!(h, "<h2>Charts not drawn</h2><ul>");
        for s in skipped {
            let _ = writeln!(h, "<li><b>{}</b>: {}</li>", escape(&s.chart), escape(&s.reason));
        }
        let _ = writeln!(h, "</ul>");
    }
    sources(&mut h, inputs);
    let _ = writeln!(h, "</body></html>");
    h
}

fn summary_table(h: &mut String, comparisons: &[Comparison]) {
    let _ = writeln!(h, "<h2>Summary</h2>");
    if comparisons.is_empty() {
        let _ = writeln!(h, "<p>No result files.</p>");
        return;
    }
    let _ = writeln!(
        h,
        "<table><tr><th class=l rowspan=2>scenario</th><th class=l rowspan=2>job</th>\
         <th class=l rowspan=2>op</th><th rowspan=2>ranks</th><th colspan=2>simulated (µs)</th>\
         <th colspan=2>measured (µs)</th><th rowspan=2>error %</th><th colspan=2>bandwidth \
         (GB/s)</th><th rowspan=2>error %</th><th colspan=3>published</th></tr>\
         <tr><th>mean</th><th>p99</th><th>mean</th><th>p99</th><th>sim</th><th>meas</th>\
         <th>value</th><th>error %</th><th class=l>source</th></tr>"
    );
    // Pairs first (the point of running both backends), then one-sided results.
    let group = |c: &Comparison| {
        let sim = c.rows.iter().any(|r| r.simulated.is_some());
        let meas = c.rows.iter().any(|r| r.measured.is_some());
        match (sim, meas) {
            (true, true) => 0,
            (true, false) => 1,
            (false, true) => 2,
            (false, false) => 3,
        }
    };
    let mut ordered: Vec<&Comparison> = comparisons.iter().collect();
    ordered.sort_by_key(|c| (group(c), describe::natural_key(&c.scenario)));
    let mut current = None;
    for c in ordered {
        if current != Some(group(c)) {
            current = Some(group(c));
            let title = ["simulated and measured", "simulator only", "measured only", "no numbers"]
                [group(c)];
            let _ = writeln!(h, "<tr><th class=l colspan=15>{title}</th></tr>");
        }
        let verdicts = [&c.simulated, &c.measured]
            .iter()
            .filter_map(|s| s.as_ref())
            .filter(|s| s.verdict != "ok")
            .map(|s| {
                format!(
                    "{} {}{}",
                    s.backend,
                    s.verdict,
                    s.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>();
        if c.rows.is_empty() {
            let _ = writeln!(
                h,
                "<tr><td class=\"l n\">{}</td><td class=\"l muted\" colspan=14>{}</td></tr>",
                escape(&c.scenario),
                escape(&verdicts.join("; "))
            );
            continue;
        }
        for r in &c.rows {
            let s = r.simulated.as_ref();
            let m = r.measured.as_ref();
            let p = r.published.as_ref();
            let published = p.map(|p| match (p.latency_us, p.logical_bw_gbps) {
                (Some(l), _) => format!("{l:.1} µs"),
                (None, Some(b)) => format!("{b:.1} GB/s"),
                _ => "–".into(),
            });
            let _ = writeln!(
                h,
                "<tr><td class=\"l n\">{scn}{mark}</td><td class=l>{job}</td><td class=l>{op}</td>\
                 <td>{ranks}</td><td>{sm}</td><td>{sp}</td><td>{mm}</td><td>{mp}</td><td>{le}</td>\
                 <td>{sb}</td><td>{mb}</td><td>{be}</td><td>{pv}</td><td>{pe}</td>\
                 <td class=\"l s\">{ps}</td></tr>",
                scn = escape(&c.scenario),
                mark = if c.same_scenario_text { "" } else { " †" },
                job = escape(&r.job),
                op = escape(&r.op),
                ranks = r.ranks,
                sm = num(s.map(|n| n.latency_us_mean), 2),
                sp = num(s.map(|n| n.latency_us_p99), 2),
                mm = num(m.map(|n| n.latency_us_mean), 2),
                mp = num(m.map(|n| n.latency_us_p99), 2),
                le = pct(r.latency_error_pct, false),
                sb = num(s.map(|n| n.logical_bw_gbps), 1),
                mb = num(m.map(|n| n.logical_bw_gbps), 1),
                be = pct(r.bw_error_pct, false),
                pv = escape(&published.unwrap_or_else(|| "–".into())),
                pe = pct(p.map(|p| p.error_pct), p.is_some_and(|p| !p.within_tolerance)),
                ps = escape(
                    &p.map(|p| format!("{} (±{:.0} %)", p.source, p.tolerance_pct))
                        .unwrap_or_default()
                ),
            );
            // The op's phases both sides timed (hook mode), under it: mean times and error.
            for phase in &r.phases {
                let _ = writeln!(
                    h,
                    "<tr><td class=\"l n\"></td><td class=l></td><td class=l>&ensp;{name}</td>\
                     <td>{ranks}</td><td>{sm}</td><td>–</td><td>{mm}</td><td>–</td><td>{le}</td>\
                     <td colspan=6></td></tr>",
                    name = escape(&phase.phase),
                    ranks = r.ranks,
                    sm = num(Some(phase.simulated_us), 2),
                    mm = num(Some(phase.measured_us), 2),
                    le = pct(phase.error_pct, false),
                );
            }
        }
        if !verdicts.is_empty() {
            let _ = writeln!(
                h,
                "<tr><td></td><td class=l colspan=14><span class=muted>{}</span></td></tr>",
                escape(&verdicts.join("; "))
            );
        }
        if let Some(why) = &c.not_compared {
            let _ = writeln!(
                h,
                "<tr><td></td><td class=l colspan=14><span class=alert>{}</span></td></tr>",
                escape(why)
            );
        }
    }
    let dagger = if comparisons.iter().any(|c| !c.same_scenario_text) {
        "† the simulated and measured results ran different scenario texts (sha256 differ). "
    } else {
        ""
    };
    let _ = writeln!(
        h,
        "</table><p class=muted>{dagger}Red: outside the tolerance the scenario states.</p>"
    );
}

fn sources(h: &mut String, inputs: &Inputs) {
    let _ = writeln!(
        h,
        "<h2>Inputs</h2><table><tr><th class=l>file</th><th class=l>scenario</th>\
         <th class=l>backend</th><th class=l>hardware</th><th class=l>verdict</th>\
         <th class=l>version</th><th class=l>commit</th><th class=l>measured at</th></tr>"
    );
    for r in &inputs.results {
        let d = &r.doc;
        let _ = writeln!(
            h,
            "<tr><td class=l><code>{}</code></td><td class=l>{}</td><td class=l>{}</td>\
             <td class=l>{}</td><td class=l>{}</td><td class=l>{}</td><td class=l>{}</td>\
             <td class=l>{}</td></tr>",
            escape(&r.path.display().to_string()),
            escape(&d.scenario.name),
            escape(describe::backend_word(d)),
            escape(&describe::hardware(d)),
            escape(d.verdict.as_str()),
            escape(&describe::backend_detail(d)),
            escape(&d.eptwin.git_commit),
            escape(&d.eptwin.created_at.clone().unwrap_or_default()),
        );
    }
    for s in &inputs.sweeps {
        let _ = writeln!(
            h,
            "<tr><td class=l><code>{}</code></td><td class=l>{}</td><td class=l>sweep ({})</td>\
             <td class=l colspan=5>{} points over {}</td></tr>",
            escape(&s.path.display().to_string()),
            escape(&s.doc.scenario.name),
            escape(&s.doc.backend),
            s.doc.points.len(),
            escape(&s.doc.keys.join(", ")),
        );
    }
    for t in &inputs.traces {
        let _ = writeln!(
            h,
            "<tr><td class=l><code>{}</code></td><td class=l>{}</td><td class=l>trace</td>\
             <td class=l colspan=5>{} lanes</td></tr>",
            escape(&t.path.display().to_string()),
            escape(t.doc.scenario.as_deref().unwrap_or("")),
            t.doc.lanes.len(),
        );
    }
    let _ = writeln!(h, "</table>");
    if !inputs.sweep_points.is_empty() {
        let _ = writeln!(
            h,
            "<p>{} result file(s) are points of a sweep above: its chart and index show them.</p>",
            inputs.sweep_points.len()
        );
    }
    if !inputs.ignored.is_empty() {
        let _ = writeln!(h, "<p>Ignored files:</p><ul>");
        for (path, why) in &inputs.ignored {
            let _ = writeln!(
                h,
                "<li><code>{}</code>: {}</li>",
                escape(&path.display().to_string()),
                escape(why)
            );
        }
        let _ = writeln!(h, "</ul>");
    }
}

#[cfg(test)]
mod tests {
    use crate::compare::Comparison;

    #[test]
    fn escapes_markup() {
        assert_eq!(super::escape("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }

    /// A hook-mode comparison's phases get a row each under their op.
    #[test]
    fn the_summary_shows_the_phases_under_their_op() {
        let c: Comparison = serde_json::from_value(serde_json::json!({
            "schema": 1, "kind": "eptwin-comparison", "scenario": "s", "same_scenario_text": true,
            "rows": [{
                "job": "ll", "op": "combine", "ranks": 8,
                "phases": [
                    {"phase": "send", "simulated_us": 66.0, "measured_us": 60.0, "error_pct": 10.0},
                    {"phase": "recv", "simulated_us": 40.0, "measured_us": 50.0, "error_pct": -20.0}
                ]
            }]
        }))
        .unwrap();
        let mut h = String::new();
        super::summary_table(&mut h, &[c]);
        let send = h.find("&ensp;send").expect(&h);
        let recv = h.find("&ensp;recv").expect(&h);
        assert!(h.find(">combine<").expect(&h) < send && send < recv, "{h}");
        assert!(
            h[send..recv].contains("<td>66.00</td>") && h[send..recv].contains("<td>+10.0</td>")
        );
        assert!(h[recv..].contains("<td>-20.0</td>"), "{h}");
    }
}
