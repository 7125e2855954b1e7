//! `eptwin sweep`: one scenario, a grid of edited copies (`--set KEY=V1,V2,...`), run in
//! parallel (rayon) with a progress bar (indicatif) on stderr, shardable over machines.
//!
//! Each point is the base scenario's TOML table with the keys replaced, serialised, and parsed
//! and validated again like any scenario file; it is written next to its result so that
//! `eptwin run <point>.toml` reproduces it. Points are independent and each gets its own
//! backend instance, so the per-point results do not depend on the thread count (the
//! simulator is deterministic). The index (`index.json`, or `index.shard-K-of-N.json`)
//! lists every point of the shard with its values, file, verdict and key numbers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use eptwin_engine::result::{RunResult, Verdict, write_atomic};
use eptwin_reports::{PointOp, Shard, SweepIndex, SweepPoint, SweepScenario};
use rayon::prelude::*;

use super::run::execute;
use crate::ExitCode;
use crate::cli::BackendArg;

/// One step of a key path: `job`, `job[0]` (by position), `job[decode]` (by `name`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(String, usize),
    Named(String, String),
}

fn parse_path(key: &str) -> Result<Vec<Segment>> {
    let mut out = Vec::new();
    for part in key.split('.') {
        let segment = match part.split_once('[') {
            Some((name, rest)) => {
                let inner = rest
                    .strip_suffix(']')
                    .ok_or_else(|| anyhow!("{key:?}: {part:?} opens '[' without closing it"))?;
                match inner.parse::<usize>() {
                    Ok(i) => Segment::Index(name.to_string(), i),
                    Err(_) => Segment::Named(name.to_string(), inner.to_string()),
                }
            }
            None => Segment::Key(part.to_string()),
        };
        let name = match &segment {
            Segment::Key(n) | Segment::Index(n, _) | Segment::Named(n, _) => n,
        };
        if name.is_empty() {
            bail!("{key:?}: empty key segment");
        }
        out.push(segment);
    }
    Ok(out)
}

/// A `--set KEY=V1,V2,...`.
#[derive(Debug, Clone, PartialEq)]
struct SetArg {
    key: String,
    path: Vec<Segment>,
    values: Vec<String>,
}

fn parse_set(arg: &str) -> Result<SetArg> {
    let (key, values) =
        arg.split_once('=').ok_or_else(|| anyhow!("--set {arg:?}: expected KEY=V1,V2,..."))?;
    let key = key.trim().to_string();
    let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
    if values.iter().any(String::is_empty) {
        bail!("--set {arg:?}: an empty value");
    }
    let mut seen = Vec::new();
    for v in &values {
        if seen.contains(&v) {
            bail!("--set {arg:?}: value {v:?} is listed twice");
        }
        seen.push(v);
    }
    Ok(SetArg { path: parse_path(&key)?, key, values })
}

/// The table a path segment leads to (creating missing tables on the way).
fn step<'t>(table: &'t mut toml::Table, seg: &Segment, key: &str) -> Result<&'t mut toml::Table> {
    let (name, pick) = match seg {
        Segment::Key(n) => (n, None),
        Segment::Index(n, i) => (n, Some(Ok(*i))),
        Segment::Named(n, job) => (n, Some(Err(job.clone()))),
    };
    let entry = table.entry(name.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
    match entry {
        toml::Value::Table(t) if pick.is_none() => Ok(t),
        toml::Value::Table(_) => bail!("{key:?}: {name} is a table, not a list: drop the [..]"),
        toml::Value::Array(items) => {
            let count = items.len();
            let index = match pick {
                Some(Ok(i)) => i,
                Some(Err(wanted)) => items
                    .iter()
                    .position(|t| t.get("name").and_then(|n| n.as_str()) == Some(wanted.as_str()))
                    .ok_or_else(|| anyhow!("{key:?}: no {name} is named {wanted:?}"))?,
                None if count == 1 => 0,
                None => bail!(
                    "{key:?}: the scenario has {count} [[{name}]] entries: say {name}[0] or \
                     {name}[<name>]"
                ),
            };
            match items.get_mut(index) {
                Some(toml::Value::Table(t)) => Ok(t),
                Some(_) => bail!("{key:?}: {name}[{index}] is not a table"),
                None => bail!("{key:?}: {name}[{index}] does not exist ({count} entries)"),
            }
        }
        _ => bail!("{key:?}: {name} is a value, not a table"),
    }
}

/// The TOML value a command-line string becomes: the type of the value it replaces, else a
/// TOML literal (integer, float, boolean), else a string.
fn typed_value(raw: &str, existing: Option<&toml::Value>, as_string: bool) -> Result<toml::Value> {
    if as_string {
        return Ok(toml::Value::String(raw.to_string()));
    }
    let literal = || -> Option<toml::Value> {
        if let Ok(i) = raw.parse::<i64>() {
            return Some(toml::Value::Integer(i));
        }
        if let Ok(f) = raw.parse::<f64>() {
            return Some(toml::Value::Float(f));
        }
        raw.parse::<bool>().ok().map(toml::Value::Boolean)
    };
    Ok(match existing {
        Some(toml::Value::String(_)) => toml::Value::String(raw.to_string()),
        Some(toml::Value::Integer(_)) => {
            toml::Value::Integer(raw.parse().map_err(|_| anyhow!("{raw:?} is not an integer"))?)
        }
        Some(toml::Value::Float(_)) => {
            toml::Value::Float(raw.parse().map_err(|_| anyhow!("{raw:?} is not a number"))?)
        }
        Some(toml::Value::Boolean(_)) => {
            toml::Value::Boolean(raw.parse().map_err(|_| anyhow!("{raw:?} is not true/false"))?)
        }
        Some(toml::Value::Array(_) | toml::Value::Table(_)) => {
            bail!("lists and tables cannot be swept; sweep one of their keys")
        }
        _ => literal().unwrap_or_else(|| toml::Value::String(raw.to_string())),
    })
}

fn apply(table: &mut toml::Table, set: &SetArg, value: &toml::Value) -> Result<()> {
    let (last, parents) = set.path.split_last().expect("a path has a segment");
    let mut t = table;
    for seg in parents {
        t = step(t, seg, &set.key)?;
    }
    match last {
        Segment::Key(name) => {
            t.insert(name.clone(), value.clone());
            Ok(())
        }
        _ => bail!("{:?}: the last segment names a value, not a list entry", set.key),
    }
}

/// The value a key path names in the base scenario, if any (its type is kept).
fn existing<'t>(table: &'t toml::Table, set: &SetArg) -> Option<&'t toml::Value> {
    let (last, parents) = set.path.split_last()?;
    let mut cur = table;
    for seg in parents {
        let (name, pick) = match seg {
            Segment::Key(n) => (n, None),
            Segment::Index(n, i) => (n, Some(Ok(*i))),
            Segment::Named(n, j) => (n, Some(Err(j))),
        };
        cur = match (cur.get(name)?, pick) {
            (toml::Value::Table(t), None) => t,
            (toml::Value::Array(items), pick) => {
                let index = match pick {
                    Some(Ok(i)) => i,
                    Some(Err(j)) => items
                        .iter()
                        .position(|t| t.get("name").and_then(|n| n.as_str()) == Some(j.as_str()))?,
                    None if items.len() == 1 => 0,
                    None => return None,
                };
                items.get(index)?.as_table()?
            }
            _ => return None,
        };
    }
    let Segment::Key(name) = last else { return None };
    cur.get(name)
}

/// Each value of each key as the TOML value it becomes, checked against the schema alone
/// (an unknown key or a wrong type is a usage error, reported before anything runs).
fn resolve_values(
    base: &toml::Table,
    file: &str,
    sets: &[SetArg],
) -> Result<Vec<Vec<toml::Value>>> {
    let mut out = Vec::new();
    for set in sets {
        let current = existing(base, set);
        let mut typed = Vec::new();
        for raw in &set.values {
            let mut last_err = String::new();
            let mut found = None;
            for as_string in [false, true] {
                let value = typed_value(raw, current, as_string)
                    .map_err(|e| anyhow!("--set {}={raw}: {e}", set.key))?;
                let mut table = base.clone();
                apply(&mut table, set, &value)?;
                let text = toml::to_string(&table).context("serialising the scenario")?;
                match eptwin_engine::parse(file, &text) {
                    Ok(_) => {
                        found = Some(value);
                        break;
                    }
                    Err(e) => last_err = error_message(&e),
                }
                if matches!(value, toml::Value::String(_)) {
                    break;
                }
            }
            let value = found.ok_or_else(|| anyhow!("--set {}={raw}: {last_err}", set.key))?;
            typed.push(value);
        }
        out.push(typed);
    }
    Ok(out)
}

fn error_message(e: &eptwin_engine::EngineError) -> String {
    match e {
        eptwin_engine::EngineError::Parse { message, .. } => message.clone(),
        eptwin_engine::EngineError::Invalid { diagnostics, .. } => diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("; "),
        other => other.to_string(),
    }
}

/// Every combination of value indices, row-major (the first key varies slowest).
fn grid(sizes: &[usize]) -> Vec<Vec<usize>> {
    let mut points = vec![Vec::new()];
    for &n in sizes {
        points = points
            .into_iter()
            .flat_map(|p| {
                (0..n).map(move |i| {
                    let mut q = p.clone();
                    q.push(i);
                    q
                })
            })
            .collect();
    }
    points
}

fn parse_shard(text: &str) -> Result<Shard> {
    let (k, n) = text.split_once('/').ok_or_else(|| anyhow!("--shard {text:?}: expected K/N"))?;
    let index: u32 =
        k.trim().parse().map_err(|_| anyhow!("--shard {text:?}: K is not a number"))?;
    let count: u32 =
        n.trim().parse().map_err(|_| anyhow!("--shard {text:?}: N is not a number"))?;
    if count == 0 || index >= count {
        bail!("--shard {text:?}: needs 0 <= K < N");
    }
    Ok(Shard { index, count })
}

/// The shard a SLURM array task is: `SLURM_ARRAY_TASK_ID − SLURM_ARRAY_TASK_MIN` of
/// `SLURM_ARRAY_TASK_COUNT`. `None` outside an array job.
fn shard_from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<Shard>> {
    let Some(id) = get("SLURM_ARRAY_TASK_ID") else { return Ok(None) };
    let num = |name: &str, text: &str| -> Result<u32> {
        text.trim().parse().map_err(|_| anyhow!("{name}={text:?} is not a number"))
    };
    let id = num("SLURM_ARRAY_TASK_ID", &id)?;
    let count = get("SLURM_ARRAY_TASK_COUNT").ok_or_else(|| {
        anyhow!("SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not: use --shard K/N")
    })?;
    let count = num("SLURM_ARRAY_TASK_COUNT", &count)?;
    let min = match get("SLURM_ARRAY_TASK_MIN") {
        Some(m) => num("SLURM_ARRAY_TASK_MIN", &m)?,
        None => 0,
    };
    let index = id.checked_sub(min).filter(|&k| k < count).ok_or_else(|| {
        anyhow!(
            "SLURM array task {id} (min {min}, count {count}) is not a contiguous array index: \
             use --shard K/N"
        )
    })?;
    Ok(Some(parse_shard(&format!("{index}/{count}"))?))
}

fn thread_count(requested: Option<usize>, backend: BackendArg) -> usize {
    if backend == BackendArg::Hw {
        if requested.is_some_and(|t| t > 1) {
            tracing::warn!("hardware points run one at a time: they share the GPUs");
        }
        return 1;
    }
    requested
        .or_else(|| std::env::var("SLURM_CPUS_PER_TASK").ok()?.parse().ok())
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .max(1)
}

fn json_of(v: &toml::Value) -> serde_json::Value {
    match v {
        toml::Value::String(s) => serde_json::json!(s),
        toml::Value::Integer(i) => serde_json::json!(i),
        toml::Value::Float(f) => serde_json::json!(f),
        toml::Value::Boolean(b) => serde_json::json!(b),
        other => serde_json::json!(other.to_string()),
    }
}

fn text_of(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A name fragment for file and scenario names (letters, digits, '-', '_', '.').
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' })
        .collect()
}

/// Short labels for keys (`NVSHMEM_QP_DEPTH`), the full path where two would collide.
fn labels(sets: &[SetArg]) -> Vec<String> {
    let short: Vec<&str> =
        sets.iter().map(|s| s.key.rsplit('.').next().unwrap_or(&s.key)).collect();
    sets.iter()
        .zip(&short)
        .map(|(s, l)| {
            if short.iter().filter(|x| *x == l).count() > 1 { clean(&s.key) } else { l.to_string() }
        })
        .collect()
}

struct PointPlan {
    index: usize,
    name: String,
    values: Vec<toml::Value>,
    text: String,
}

struct PointRun {
    point: SweepPoint,
    wall_s: f64,
    code: ExitCode,
}

fn run_point(p: &PointPlan, dir: &Path, keys: &[String], backend: BackendArg) -> PointRun {
    #[allow(clippy::disallowed_methods)] // real time of the sweep itself, never in a result
    let started = std::time::Instant::now();
    let toml_path = dir.join(format!("{}.toml", p.name));
    let json_path = dir.join(format!("{}.json", p.name));
    let values: BTreeMap<String, serde_json::Value> =
        keys.iter().cloned().zip(p.values.iter().map(json_of)).collect();
    let mut point = SweepPoint {
        index: p.index,
        values,
        file: None,
        scenario_file: Some(format!("{}.toml", p.name)),
        verdict: "invalid".into(),
        reason: None,
        ops: Vec::new(),
    };
    // A backend panic fails this point only: a long sweep keeps its other points.
    let attempt = || -> Result<Result<RunResult, String>> {
        write_atomic(&toml_path, &p.text)?;
        let loaded = match eptwin_engine::parse(&toml_path.display().to_string(), &p.text) {
            Ok(l) => l,
            Err(e) => return Ok(Err(error_message(&e))),
        };
        let plan = match eptwin_engine::Plan::build(&loaded) {
            Ok(plan) => plan,
            Err(e) => return Ok(Err(error_message(&e))),
        };
        let (result, _) = execute(&plan, backend, false)?;
        write_atomic(&json_path, &result.to_json())?;
        Ok(Ok(result))
    };
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(attempt)).unwrap_or_else(|payload| {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            Err(anyhow!("the backend panicked: {what}"))
        });
    let code = match outcome {
        Ok(Ok(result)) => {
            point.file = Some(format!("{}.json", p.name));
            point.verdict = result.verdict.as_str().to_string();
            point.reason =
                result.waived_reason.clone().or_else(|| result.failures.first().cloned());
            point.ops = PointOp::from_result(&result);
            ExitCode::from_verdict(result.verdict)
        }
        Ok(Err(reason)) => {
            point.reason = Some(reason);
            ExitCode::BadInput
        }
        Err(e) => {
            point.verdict = Verdict::Failed.as_str().into();
            point.reason = Some(format!("{e:#}"));
            ExitCode::Failed
        }
    };
    PointRun { point, wall_s: started.elapsed().as_secs_f64(), code }
}

pub fn sweep(
    scenario: &Path,
    sets: &[String],
    shard: Option<&str>,
    out: Option<&Path>,
    backend: BackendArg,
    threads: Option<usize>,
    json: bool,
) -> Result<ExitCode> {
    let sets: Vec<SetArg> = sets.iter().map(|s| parse_set(s)).collect::<Result<_>>()?;
    for (i, s) in sets.iter().enumerate() {
        if sets[..i].iter().any(|t| t.key == s.key) {
            bail!("--set {}: the key is given twice", s.key);
        }
    }
    let loaded = match eptwin_engine::load(scenario) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::BadInput);
        }
    };
    let text = std::fs::read_to_string(scenario)?;
    let base: toml::Table =
        toml::from_str(&text).context("reading the scenario as a TOML table")?;
    let file = scenario.display().to_string();
    let typed = resolve_values(&base, &file, &sets)?;
    for set in sets.iter().filter(|s| existing(&base, s).is_none()) {
        // Environment tables take any name, so a misspelt variable would sweep nothing.
        eprintln!("eptwin: note: {} is not set in {file}; every point adds it", set.key);
    }
    let shard = match shard {
        Some(s) => parse_shard(s)?,
        None => shard_from_env(|k| std::env::var(k).ok())?.unwrap_or(Shard::ALL),
    };
    let base_name = loaded.scenario.name.clone();
    let dir: PathBuf = match out {
        Some(d) => d.to_path_buf(),
        None => Path::new("out").join(format!("sweep-{base_name}")),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let keys: Vec<String> = sets.iter().map(|s| s.key.clone()).collect();
    let short = labels(&sets);
    let all = grid(&typed.iter().map(Vec::len).collect::<Vec<_>>());
    let total = all.len();
    let mut plans = Vec::new();
    for (index, combo) in all.iter().enumerate() {
        if !shard.contains(index) {
            continue;
        }
        let mut table = base.clone();
        let mut values = Vec::new();
        let mut suffix = Vec::new();
        for ((set, vals), (&i, label)) in sets.iter().zip(&typed).zip(combo.iter().zip(&short)) {
            apply(&mut table, set, &vals[i])?;
            values.push(vals[i].clone());
            suffix.push(clean(&format!("{label}-{}", text_of(&vals[i]))));
        }
        let name = format!("{base_name}.{}", suffix.join("."));
        table.insert("name".into(), toml::Value::String(name.clone()));
        let description = format!(
            "{} [sweep point {index}: {}]",
            loaded.scenario.description,
            keys.iter()
                .zip(&values)
                .map(|(k, v)| format!("{k}={}", text_of(v)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        table.insert("description".into(), toml::Value::String(description));
        let header = format!(
            "# eptwin sweep point {index} of {total}: {} with {}\n",
            file,
            keys.iter()
                .zip(&values)
                .map(|(k, v)| format!("{k} = {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let text = header + &toml::to_string(&table).context("serialising a sweep point")?;
        plans.push(PointPlan { index, name, values, text });
    }
    let threads = thread_count(threads, backend);
    eprintln!(
        "eptwin sweep: {} point(s) of {total} (shard {}/{}) on {threads} thread(s) -> {}",
        plans.len(),
        shard.index,
        shard.count,
        dir.display()
    );
    let bar = indicatif::ProgressBar::new(plans.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} points {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
    #[allow(clippy::disallowed_methods)] // real time of the sweep itself, never in a result
    let started = std::time::Instant::now();
    let runs: Vec<PointRun> = pool.install(|| {
        plans
            .par_iter()
            .map(|p| {
                let run = run_point(p, &dir, &keys, backend);
                tracing::info!(
                    "point {} ({}): {} in {:.2} s",
                    p.index,
                    p.name,
                    run.point.verdict,
                    run.wall_s
                );
                bar.set_message(format!("last: point {} {}", p.index, run.point.verdict));
                bar.inc(1);
                run
            })
            .collect()
    });
    bar.finish_and_clear();
    let wall_s = started.elapsed().as_secs_f64();
    let summed_s: f64 = runs.iter().map(|r| r.wall_s).sum();
    let code = runs.iter().fold(ExitCode::Ok, |c, r| c.worst(r.code));
    let index = SweepIndex {
        schema: eptwin_reports::sweep::SWEEP_INDEX_SCHEMA,
        kind: eptwin_reports::sweep::SWEEP_INDEX_KIND.into(),
        scenario: SweepScenario {
            name: base_name.clone(),
            file: file.clone(),
            sha256: loaded.sha256.clone(),
        },
        backend: match backend {
            BackendArg::Sim => "sim".into(),
            BackendArg::Hw => "hw".into(),
        },
        keys: keys.clone(),
        values: keys
            .iter()
            .cloned()
            .zip(typed.iter().map(|v| v.iter().map(json_of).collect()))
            .collect(),
        shard,
        total_points: total,
        points: runs.into_iter().map(|r| r.point).collect(),
    };
    let index_path = dir.join(SweepIndex::file_name(shard));
    write_atomic(&index_path, &index.to_json())?;
    eprintln!(
        "eptwin sweep: {} point(s) in {wall_s:.2} s wall on {threads} thread(s); {summed_s:.2} s summed over points ({:.2}x)",
        index.points.len(),
        if wall_s > 0.0 { summed_s / wall_s } else { 0.0 }
    );
    if json {
        println!("{}", serde_json::to_string(&index)?);
    } else {
        print!("{}", render(&index, &short));
        println!("# index: {}", index_path.display());
    }
    Ok(code)
}

fn render(index: &SweepIndex, labels: &[String]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# eptwin sweep: {} ({}) on {}, shard {}/{}: {} of {} points",
        index.scenario.name,
        index.scenario.file,
        index.backend,
        index.shard.index,
        index.shard.count,
        index.points.len(),
        index.total_points
    );
    let mut head = format!("# {:>4}", "pt");
    for l in labels {
        let _ = write!(head, " {l:>16}");
    }
    let _ = writeln!(
        out,
        "{head} {:>8} {:<18} {:>10} {:>10} {:>10}",
        "verdict", "job/op", "mean(us)", "p99(us)", "bw(GB/s)"
    );
    for p in &index.points {
        let mut line = format!("  {:>4}", p.index);
        for k in &index.keys {
            let v = p.values.get(k).map(|v| match v {
                serde_json::Value::String(s) => s.clone(),
                o => o.to_string(),
            });
            let _ = write!(line, " {:>16}", v.unwrap_or_default());
        }
        if p.ops.is_empty() {
            let _ = writeln!(out, "{line} {:>8} {}", p.verdict, p.reason.as_deref().unwrap_or(""));
        }
        for o in &p.ops {
            let _ = writeln!(
                out,
                "{line} {:>8} {:<18} {:>10.2} {:>10.2} {:>10.2}",
                p.verdict,
                format!("{}/{}", o.job, o.op),
                o.latency_us_mean,
                o.latency_us_p99,
                o.logical_bw_gbps
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
schema = 1
name = "t"
[cluster]
profile = "h800-cx7"
nodes = 2
[[job]]
name = "decode"
[job.buffer]
low_latency_mode = true
num_rdma_bytes = "2GiB"
num_qps_per_rank = 18
[job.env]
NVSHMEM_IB_SL = "1"
[job.workload]
tokens_per_rank = 128
hidden = 7168
topk = 8
experts = 288
[[job]]
name = "bulk"
[job.traffic]
pattern = "all-to-all"
bytes_per_rank = "16MiB"
"#;

    fn base() -> toml::Table {
        toml::from_str(BASE).unwrap()
    }

    #[test]
    fn key_paths() {
        use Segment::*;
        assert_eq!(
            parse_path("job[0].buffer.num_qps_per_rank").unwrap(),
            [Index("job".into(), 0), Key("buffer".into()), Key("num_qps_per_rank".into())]
        );
        assert_eq!(
            parse_path("job[decode].env.X").unwrap()[0],
            Named("job".into(), "decode".into())
        );
        assert!(parse_path("job[0.x").is_err());
        assert!(parse_path("cluster..nodes").is_err());
    }

    #[test]
    fn set_arguments() {
        let s = parse_set("job[0].env.NVSHMEM_QP_DEPTH=128, 256,512").unwrap();
        assert_eq!(s.values, ["128", "256", "512"]);
        assert!(parse_set("cluster.nodes").is_err());
        assert!(parse_set("cluster.nodes=2,,4").is_err());
        assert!(parse_set("cluster.nodes=2,2").is_err());
    }

    #[test]
    fn values_keep_the_type_they_replace_and_pass_the_schema() {
        let b = base();
        let sets = [
            parse_set("job[decode].env.NVSHMEM_QP_DEPTH=256,1024").unwrap(),
            parse_set("cluster.nodes=2,4").unwrap(),
            parse_set("job[0].buffer.num_rdma_bytes=1GiB").unwrap(),
            parse_set("job[bulk].traffic.qps_per_peer=2").unwrap(),
        ];
        let typed = resolve_values(&b, "t.toml", &sets).unwrap();
        // Absent env key: an integer literal fails the schema (env values are strings), so
        // it is retried and kept as a string.
        assert_eq!(typed[0][0], toml::Value::String("256".into()));
        assert_eq!(typed[1][1], toml::Value::Integer(4));
        assert_eq!(typed[2][0], toml::Value::String("1GiB".into()));
        assert_eq!(typed[3][0], toml::Value::Integer(2));
        let mut t = b.clone();
        apply(&mut t, &sets[1], &typed[1][1]).unwrap();
        apply(&mut t, &sets[0], &typed[0][1]).unwrap();
        let again = eptwin_engine::parse("p.toml", &toml::to_string(&t).unwrap()).unwrap();
        assert_eq!(again.scenario.cluster.nodes, Some(4));
        assert_eq!(again.scenario.jobs[0].env["NVSHMEM_QP_DEPTH"], "1024");
        assert_eq!(again.scenario.jobs[1].env.get("NVSHMEM_QP_DEPTH"), None, "other job untouched");
    }

    #[test]
    fn bad_keys_and_values_are_usage_errors_naming_them() {
        let b = base();
        let err = |arg: &str| {
            resolve_values(&b, "t.toml", &[parse_set(arg).unwrap()]).unwrap_err().to_string()
        };
        assert!(err("job.env.X=1").contains("2 [[job]] entries"), "{}", err("job.env.X=1"));
        assert!(err("job[7].env.X=1").contains("does not exist"));
        assert!(err("job[nope].env.X=1").contains("no job is named \"nope\""));
        let e = err("job[0].buffer.num_qp_per_rank=4");
        assert!(
            e.contains("--set job[0].buffer.num_qp_per_rank=4") && e.contains("num_qp_per_rank"),
            "{e}"
        );
        let e = err("cluster.nodes=two");
        assert!(e.contains("\"two\" is not an integer"), "{e}");
    }

    proptest::proptest! {
        /// The grid holds every combination exactly once, in row-major order.
        #[test]
        fn grid_is_the_full_product(sizes in proptest::collection::vec(1usize..5, 0..4)) {
            let points = grid(&sizes);
            proptest::prop_assert_eq!(points.len(), sizes.iter().product::<usize>());
            proptest::prop_assert!(points.windows(2).all(|w| w[0] < w[1]), "ascending, so unique");
            proptest::prop_assert!(points.iter().all(|p| p.iter().zip(&sizes).all(|(i, n)| i < n)));
        }
    }

    #[test]
    fn grid_is_row_major() {
        assert_eq!(grid(&[2, 3]), [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]);
        assert_eq!(grid(&[]).len(), 1);
    }

    #[test]
    fn shards_from_flag_and_slurm() {
        assert_eq!(parse_shard("1/4").unwrap(), Shard { index: 1, count: 4 });
        assert!(
            parse_shard("4/4").is_err() && parse_shard("0/0").is_err() && parse_shard("1").is_err()
        );
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string())
        };
        assert_eq!(shard_from_env(env(&[])).unwrap(), None);
        let s =
            shard_from_env(env(&[("SLURM_ARRAY_TASK_ID", "3"), ("SLURM_ARRAY_TASK_COUNT", "4")]));
        assert_eq!(s.unwrap(), Some(Shard { index: 3, count: 4 }));
        let s = shard_from_env(env(&[
            ("SLURM_ARRAY_TASK_ID", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
        ]));
        assert_eq!(s.unwrap(), Some(Shard { index: 0, count: 4 }));
        assert!(shard_from_env(env(&[("SLURM_ARRAY_TASK_ID", "1")])).is_err());
        let sparse =
            shard_from_env(env(&[("SLURM_ARRAY_TASK_ID", "9"), ("SLURM_ARRAY_TASK_COUNT", "4")]));
        assert!(sparse.unwrap_err().to_string().contains("--shard"));
    }

    #[test]
    fn colliding_short_labels_use_the_full_key() {
        let sets = [
            parse_set("job[0].env.NVSHMEM_QP_DEPTH=1").unwrap(),
            parse_set("job[1].env.NVSHMEM_QP_DEPTH=1").unwrap(),
            parse_set("cluster.nodes=1").unwrap(),
        ];
        assert_eq!(
            labels(&sets),
            ["job_0_.env.NVSHMEM_QP_DEPTH", "job_1_.env.NVSHMEM_QP_DEPTH", "nodes"]
        );
    }
}
