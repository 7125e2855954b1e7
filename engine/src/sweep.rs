//! Parameter sweeps: one base scenario, a grid of edited copies (`KEY=V1,V2,...` per key,
//! [`scenario::edit`](crate::scenario::edit) key paths), sharded over machines and run in
//! parallel, one backend instance per point.
//!
//! [`SweepPlan::new`] is pure: it types every value against the base scenario (a value keeps
//! the type of the one it replaces, and must pass the schema), then writes each point of the
//! shard as scenario text, re-parsed and validated like any file when it runs. [`run_grid`]
//! runs points on a rayon pool; [`run_point`] runs one on a fresh backend and writes its
//! scenario and result next to each other, so `eptwin run <point>.toml` reproduces it. Points
//! are independent, so their results do not depend on the thread count.

use std::collections::BTreeSet;
use std::path::Path;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::plan::Plan;
use crate::result::{Provenance, RunResult, write_atomic};
use crate::scenario::LoadedScenario;
use crate::scenario::edit::{KeyPath, value_from_text};
use crate::scenario::limits::MAX_NAME_BYTES;
use crate::transport::Transport;

/// The most points one sweep (one shard) runs, and the most values a key takes: each point
/// writes two files and an index entry, and each value is typed by parsing the scenario once.
pub const MAX_SWEEP_POINTS: usize = 10_000;

/// One swept key: `KEY=V1,V2,...`.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepKey {
    pub path: KeyPath,
    /// The values as written, in order.
    pub values: Vec<String>,
}

impl SweepKey {
    /// Parse `KEY=V1,V2,...` (values trimmed; none empty, none twice).
    pub fn parse(arg: &str) -> Result<SweepKey, EngineError> {
        let usage = |m: String| EngineError::Usage(format!("--set {arg:?}: {m}"));
        let (key, values) =
            arg.split_once('=').ok_or_else(|| usage("expected KEY=V1,V2,...".into()))?;
        let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
        if values.len() > MAX_SWEEP_POINTS {
            return Err(usage(format!(
                "{} values; a key takes at most {MAX_SWEEP_POINTS} (a sweep runs at most \
                 {MAX_SWEEP_POINTS} points)",
                values.len()
            )));
        }
        if values.iter().any(String::is_empty) {
            return Err(usage("an empty value".into()));
        }
        let mut seen = BTreeSet::new();
        for v in &values {
            if !seen.insert(v.as_str()) {
                return Err(usage(format!("value {v:?} is listed twice")));
            }
        }
        Ok(SweepKey { path: KeyPath::parse(key.trim())?, values })
    }

    pub fn key(&self) -> &str {
        self.path.as_str()
    }
}

/// Shard `index` of `count` (0-based): the points whose grid index ≡ `index` (mod `count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    pub fn contains(self, point_index: usize) -> bool {
        point_index % self.count as usize == self.index as usize
    }

    /// How many of a grid of `total` points are this shard's.
    pub fn points_of(self, total: usize) -> usize {
        total.saturating_sub(self.index as usize).div_ceil(self.count as usize)
    }

    /// `K/N` with `0 <= K < N`.
    pub fn parse(text: &str) -> Result<Shard, EngineError> {
        let usage = |m: &str| EngineError::Usage(format!("--shard {text:?}: {m}"));
        let (k, n) = text.split_once('/').ok_or_else(|| usage("expected K/N"))?;
        let index: u32 = k.trim().parse().map_err(|_| usage("K is not a number"))?;
        let count: u32 = n.trim().parse().map_err(|_| usage("N is not a number"))?;
        if count == 0 || index >= count {
            return Err(usage("needs 0 <= K < N"));
        }
        Ok(Shard { index, count })
    }

    /// The shard a SLURM array task is: `SLURM_ARRAY_TASK_ID − SLURM_ARRAY_TASK_MIN` of
    /// `SLURM_ARRAY_TASK_COUNT`, read through `get`. `None` outside an array job.
    pub fn from_slurm(get: impl Fn(&str) -> Option<String>) -> Result<Option<Shard>, EngineError> {
        let Some(id) = get("SLURM_ARRAY_TASK_ID") else { return Ok(None) };
        let num = |name: &str, text: &str| -> Result<u32, EngineError> {
            text.trim()
                .parse()
                .map_err(|_| EngineError::Usage(format!("{name}={text:?} is not a number")))
        };
        let id = num("SLURM_ARRAY_TASK_ID", &id)?;
        let count = get("SLURM_ARRAY_TASK_COUNT").ok_or_else(|| {
            EngineError::Usage(
                "SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not: use --shard K/N"
                    .into(),
            )
        })?;
        let count = num("SLURM_ARRAY_TASK_COUNT", &count)?;
        let min = match get("SLURM_ARRAY_TASK_MIN") {
            Some(m) => num("SLURM_ARRAY_TASK_MIN", &m)?,
            None => 0,
        };
        let index = id.checked_sub(min).filter(|&k| k < count).ok_or_else(|| {
            EngineError::Usage(format!(
                "SLURM array task {id} (min {min}, count {count}) is not a contiguous array \
                 index: use --shard K/N"
            ))
        })?;
        Ok(Some(Shard::parse(&format!("{index}/{count}"))?))
    }
}

/// One point of the grid, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct PointPlan {
    /// Position in the full grid (row-major: the first key varies slowest).
    pub index: usize,
    /// The point's scenario name, also its file name (`<name>.toml`, `<name>.json`).
    pub name: String,
    /// The value of each key, in key order.
    pub values: Vec<toml::Value>,
    /// The point's scenario file.
    pub text: String,
}

/// A sweep of one base scenario, the points of one shard.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPlan {
    /// The base scenario's name, file and sha256.
    pub base_name: String,
    pub file: String,
    pub sha256: String,
    /// The key paths in order, and every value of each (typed).
    pub keys: Vec<String>,
    pub values: Vec<Vec<toml::Value>>,
    /// Short column labels for the keys (`NVSHMEM_QP_DEPTH`; the full path where two collide).
    pub labels: Vec<String>,
    /// Keys the base scenario does not set (every point adds them).
    pub absent_keys: Vec<String>,
    pub shard: Shard,
    /// Points in the full grid (all shards together).
    pub total_points: usize,
    /// This shard's points, ascending by index.
    pub points: Vec<PointPlan>,
}

impl SweepPlan {
    /// The plan of `keys` over the base scenario (`text`, parsed as `loaded`, from `file`).
    /// Unknown keys, values of the wrong type and values the schema refuses are usage errors
    /// naming the `--set` argument, found before anything runs.
    pub fn new(
        file: &str,
        text: &str,
        loaded: &LoadedScenario,
        keys: &[SweepKey],
        shard: Shard,
    ) -> Result<SweepPlan, EngineError> {
        for (i, k) in keys.iter().enumerate() {
            if keys[..i].iter().any(|o| o.key() == k.key()) {
                return Err(EngineError::Usage(format!(
                    "--set {}: the key is given twice",
                    k.key()
                )));
            }
        }
        let base: toml::Table = toml::from_str(text).map_err(|e| {
            EngineError::Usage(format!("reading {file} as a TOML table: {}", e.message().trim()))
        })?;
        let values = typed_values(&base, file, keys)?;
        let names: Vec<String> = keys.iter().map(|k| k.key().to_string()).collect();
        let labels = labels(keys);
        let base_name = loaded.scenario.name.clone();
        let sizes: Vec<usize> = values.iter().map(Vec::len).collect();
        let total_points =
            sizes.iter().try_fold(1usize, |n, &k| n.checked_mul(k)).ok_or_else(|| {
                EngineError::Usage(format!(
                    "the grid of {} points is larger than a sweep can index",
                    sizes.iter().map(usize::to_string).collect::<Vec<_>>().join(" × ")
                ))
            })?;
        let shard_points = shard.points_of(total_points);
        if shard_points > MAX_SWEEP_POINTS {
            return Err(EngineError::Usage(format!(
                "shard {}/{} of the grid holds {shard_points} of its {total_points} points: one \
                 sweep runs at most {MAX_SWEEP_POINTS}; shard it further (--shard K/N)",
                shard.index, shard.count
            )));
        }
        // A value whose text had to be cleaned for a file name may clean to another's: such a
        // key's points add their index to their names (the same in every shard).
        let ambiguous = values.iter().any(|vals| {
            let cleaned: BTreeSet<String> = vals.iter().map(|v| clean(&text_of(v))).collect();
            cleaned.len() < vals.len()
        });
        let mut points = Vec::with_capacity(shard_points);
        for index in (shard.index as usize..total_points).step_by(shard.count as usize) {
            let combo = grid_point(index, &sizes);
            let mut table = base.clone();
            let mut point_values = Vec::new();
            let mut suffix = Vec::new();
            for ((key, vals), (&i, label)) in
                keys.iter().zip(&values).zip(combo.iter().zip(&labels))
            {
                key.path.set(&mut table, vals[i].clone())?;
                point_values.push(vals[i].clone());
                suffix.push(clean(&format!("{label}-{}", text_of(&vals[i]))));
            }
            anchor_routing_files(&mut table, file);
            let name = point_name(&base_name, &suffix, index, ambiguous);
            table.insert("name".into(), toml::Value::String(name.clone()));
            let assignments = |sep: &str, show: fn(&toml::Value) -> String| {
                names
                    .iter()
                    .zip(&point_values)
                    .map(|(k, v)| format!("{k}{sep}{}", show(v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let description = format!(
                "{} [sweep point {index}: {}]",
                loaded.scenario.description,
                assignments("=", text_of)
            );
            table.insert("description".into(), toml::Value::String(description));
            let header = format!(
                "# eptwin sweep point {index} of {total_points}: {file} with {}\n",
                assignments(" = ", toml::Value::to_string)
            );
            let text = header + &toml::to_string(&table).map_err(serialise_error)?;
            points.push(PointPlan { index, name, values: point_values, text });
        }
        let absent_keys =
            keys.iter().filter(|k| k.path.get(&base).is_none()).map(|k| k.key().into()).collect();
        Ok(SweepPlan {
            base_name,
            file: file.to_string(),
            sha256: loaded.sha256.clone(),
            keys: names,
            values,
            labels,
            absent_keys,
            shard,
            total_points,
            points,
        })
    }
}

/// Point scenarios are written to the sweep's output directory, but a relative
/// `routing_file` or profile file is relative to the base scenario's: make each one absolute,
/// resolved from there (and from the working directory when the base's path is relative), so
/// the point reads the same file and `eptwin run <point>.toml` does too.
fn anchor_routing_files(table: &mut toml::Table, base_file: &str) {
    // A profile file is relative to the scenario too.
    if let Some(toml::Value::String(name)) =
        table.get_mut("cluster").and_then(|c| c.get_mut("profile"))
        && crate::profile::names_file(name)
        && let Ok(absolute) = std::path::absolute(crate::profile::file_path(base_file, name))
    {
        *name = absolute.display().to_string();
    }
    let Some(toml::Value::Array(jobs)) = table.get_mut("job") else { return };
    for job in jobs {
        let Some(toml::Value::String(file)) =
            job.get_mut("workload").and_then(|w| w.get_mut("routing_file"))
        else {
            continue;
        };
        let path = crate::routing_file::resolve(base_file, file);
        if let Ok(absolute) = std::path::absolute(&path) {
            *file = absolute.display().to_string();
        }
    }
}

fn serialise_error(e: toml::ser::Error) -> EngineError {
    EngineError::Usage(format!("serialising a sweep point: {e}"))
}

/// Each value of each key as the TOML value it becomes: the type of the value it replaces, else
/// a literal, else a string — whichever passes the schema (environment tables hold strings).
fn typed_values(
    base: &toml::Table,
    file: &str,
    keys: &[SweepKey],
) -> Result<Vec<Vec<toml::Value>>, EngineError> {
    let mut out = Vec::new();
    for key in keys {
        let current = key.path.get(base);
        let mut typed = Vec::new();
        for raw in &key.values {
            let usage = |m: String| EngineError::Usage(format!("--set {}={raw}: {m}", key.key()));
            // The error of the value as written (a literal) says what is wrong with it; the
            // retry as a string only serves string keys (environment tables).
            let mut first_err = None;
            let mut found = None;
            for as_string in [false, true] {
                let value = value_from_text(raw, current, as_string).map_err(usage)?;
                let mut table = base.clone();
                key.path.set(&mut table, value.clone())?;
                let text = toml::to_string(&table).map_err(serialise_error)?;
                match crate::parse(file, &text) {
                    Ok(_) => {
                        found = Some(value);
                        break;
                    }
                    Err(e) => {
                        first_err.get_or_insert_with(|| error_message(&e));
                    }
                }
                if matches!(value, toml::Value::String(_)) {
                    break;
                }
            }
            typed.push(found.ok_or_else(|| usage(first_err.unwrap_or_default()))?);
        }
        out.push(typed);
    }
    Ok(out)
}

/// What is wrong with a point's scenario, in one line.
pub fn error_message(e: &EngineError) -> String {
    match e {
        EngineError::Parse { message, .. } => message.clone(),
        EngineError::Invalid { diagnostics, .. } => diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("; "),
        other => other.to_string(),
    }
}

/// The value indices of grid point `index`, row-major over `sizes` (the first key varies
/// slowest): the point is found without building the grid.
pub fn grid_point(index: usize, sizes: &[usize]) -> Vec<usize> {
    let mut combo = vec![0; sizes.len()];
    let mut rest = index;
    for (slot, &n) in combo.iter_mut().zip(sizes).rev() {
        *slot = rest % n.max(1);
        rest /= n.max(1);
    }
    combo
}

/// A point's scenario name, also its file name: `<base>.<label>-<value>...`, with `.p<index>`
/// where values clean to the same text; a name longer than a scenario name may be
/// ([`MAX_NAME_BYTES`]) becomes the base name cut short and `.p<index>`.
fn point_name(base: &str, suffix: &[String], index: usize, ambiguous: bool) -> String {
    let mut name = format!("{base}.{}", suffix.join("."));
    if ambiguous {
        name = format!("{name}.p{index}");
    }
    if name.len() <= MAX_NAME_BYTES {
        return name;
    }
    let tail = format!(".p{index}");
    let mut cut = MAX_NAME_BYTES.saturating_sub(tail.len()).min(base.len());
    while !base.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{tail}", &base[..cut])
}

/// A value as JSON (the sweep index records values as JSON).
pub fn json_of(v: &toml::Value) -> serde_json::Value {
    match v {
        toml::Value::String(s) => serde_json::json!(s),
        toml::Value::Integer(i) => serde_json::json!(i),
        toml::Value::Float(f) => serde_json::json!(f),
        toml::Value::Boolean(b) => serde_json::json!(b),
        other => serde_json::json!(other.to_string()),
    }
}

/// A value as text: strings bare, everything else as TOML writes it.
pub fn text_of(v: &toml::Value) -> String {
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
fn labels(keys: &[SweepKey]) -> Vec<String> {
    let short: Vec<&str> =
        keys.iter().map(|k| k.key().rsplit('.').next().unwrap_or(k.key())).collect();
    keys.iter()
        .zip(&short)
        .map(|(k, l)| {
            if short.iter().filter(|x| *x == l).count() > 1 {
                clean(k.key())
            } else {
                l.to_string()
            }
        })
        .collect()
}

/// How one point ended.
#[derive(Debug, Clone, PartialEq)]
pub enum PointOutcome {
    /// It ran; the result is written (its verdict may still be failed or waived).
    Ran(Box<RunResult>),
    /// The edited scenario broke a rule: nothing ran.
    Invalid(String),
    /// The run could not finish (a backend error or panic, or a file not written).
    Failed(String),
    /// It was never started (the sweep was interrupted first): no file is written.
    NotRun(String),
}

/// Run one point on a fresh backend from `backend`: parse and validate its scenario, run it
/// with `provenance()`, then write `dir/<name>.toml` and (when it ran) `dir/<name>.json` —
/// both once the point has ended, so a point cut short leaves no file. A backend panic fails
/// this point only, so a long sweep keeps its other points.
pub fn run_point(
    point: &PointPlan,
    dir: &Path,
    backend: &(dyn Fn() -> Box<dyn Transport> + Sync),
    provenance: &(dyn Fn() -> Provenance + Sync),
) -> PointOutcome {
    let toml_path = dir.join(format!("{}.toml", point.name));
    let json_path = dir.join(format!("{}.json", point.name));
    let attempt = || -> Result<PointOutcome, EngineError> {
        let loaded = match crate::parse(&toml_path.display().to_string(), &point.text) {
            Ok(l) => l,
            Err(e) => return Ok(PointOutcome::Invalid(error_message(&e))),
        };
        let plan = match Plan::build(&loaded) {
            Ok(plan) => plan,
            Err(e) => return Ok(PointOutcome::Invalid(error_message(&e))),
        };
        let mut transport = backend();
        let result = crate::run::run(&plan, transport.as_mut(), provenance())?;
        Ok(PointOutcome::Ran(Box::new(result)))
    };
    let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(attempt)) {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => PointOutcome::Failed(e.to_string()),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            PointOutcome::Failed(format!("the backend panicked: {what}"))
        }
    };
    let written = write_atomic(&toml_path, &point.text).and_then(|()| match &outcome {
        PointOutcome::Ran(result) => write_atomic(&json_path, &result.to_json()),
        _ => Ok(()),
    });
    match written {
        Ok(()) => outcome,
        Err(e) => PointOutcome::Failed(e.to_string()),
    }
}

/// Run `each` over `points` on a pool of `threads` threads; results in point order.
pub fn run_grid<T: Send>(
    points: &[PointPlan],
    threads: usize,
    each: impl Fn(&PointPlan) -> T + Sync + Send,
) -> Result<Vec<T>, EngineError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|e| EngineError::Usage(format!("starting {threads} sweep threads: {e}")))?;
    Ok(pool.install(|| points.par_iter().map(each).collect()))
}

#[cfg(test)]
mod tests;
