//! `eptwin calibrate`: a hardware profile of this machine (docs/calibration.md, "Calibrating
//! a profile for your machine"). The hardware backend's probes give the GPU's keys
//! (`derive.rs`, `cluster.rs`), DeepEP's own low-latency kernels at one rank give the DeepEP
//! model's GPU costs (`deepep.rs`), and every key neither measures comes from a base profile;
//! the profile is written with the source of every value (`writer.rs`). Progress goes to
//! stderr, the summary table to stdout. Without a GPU the command is waived (exit 77).

mod cluster;
mod deepep;
mod derive;
mod inventory;
mod nic;
mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use eptwin_engine::api::{DOCUMENT, InputKind, LOG, Outputs, read_input};
use serde_json::Value;

use self::derive::Probes;
use self::writer::{Machine, Measured};
use crate::{ExitCode, outln};

/// What `eptwin calibrate` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The profile the keys not measured come from: a bundled name or a profile file; absent,
    /// the bundled profile of this GPU's kind (`h100-cx7`, `h200-cx7`).
    pub base: Option<String>,
    pub out: PathBuf,
    /// The profile's `name`; absent, the output file's stem.
    pub name: Option<String>,
    /// Read the probes from these hardware results or logs instead of probing here.
    pub from: Vec<PathBuf>,
    /// A DeepEP checkout (`<dir>/tests/test_low_latency.py`) to run the one-rank sweep with.
    pub deepep_dir: Option<String>,
    /// One-rank runs already made (as the sweep leaves them) to fit instead of running.
    pub deepep_runs: Option<PathBuf>,
    /// The Python that imports `deep_ep`.
    pub python: String,
    /// Each one-rank run's time limit.
    pub deepep_timeout: Duration,
    /// The whole sweep's time: shapes not started within it are left out.
    pub deepep_budget: Option<Duration>,
    /// Probe nothing: fit the DeepEP costs on the base profile as it is (its GPU keys stay).
    pub deepep_only: bool,
    /// Probe only the NIC (no GPU needed): the base profile with the NIC keys an ACTIVE
    /// ibverbs port gives.
    pub nic_only: bool,
}

/// The one-rank fit's table: each run's shape, DeepEP's times and the model's.
type FitRows = Vec<(deepep::Shape, deepep::Times, deepep::Times)>;

/// `--deepep-only`: the base profile with the `[deepep]` low-latency costs fitted to the
/// one-rank runs (for a profile of a machine not here whose GPU ran them: h800-cx7 takes the
/// H100's, the same SMs, clocks and HBM3).
fn deepep_only(o: &Options, name: &str) -> Result<ExitCode> {
    let base = read_base(o.base.as_deref().unwrap_or("h100-cx7"))?;
    // The GPU these runs ran on is not known here (no probe): the imported results name none.
    let runs = one_rank_runs(o, sweeps_here(o), None)?;
    if runs.is_empty() {
        bail!(
            "--deepep-only needs one-rank runs: --deepep-runs DIR, or --deepep-dir with deep_ep importable"
        );
    }
    let machine = runs_machine(o);
    let from = o.deepep_runs.as_ref().map_or("run here".into(), |d| d.display().to_string());
    let head = writer::Head {
        name: name.to_string(),
        description: base
            .table
            .get("description")
            .and_then(toml::Value::as_str)
            .unwrap_or_default()
            .to_string(),
        header: vec![
            format!(
                "{name}: {} with the DeepEP low-latency costs fitted by eptwin calibrate {} ({})",
                base.label,
                eptwin_engine::VERSION,
                env!("EPTWIN_GIT_COMMIT")
            ),
            format!("to DeepEP's kernels at one rank ({from})."),
        ],
    };
    let draft = writer::render(&head, &base, &[], &machine)?;
    let (measured, rows) = fit_deepep(o, &runs, &draft)?;
    finish(o, &writer::render(&head, &base, &measured, &machine)?, &measured, &base, &rows)
}

/// `--nic-only`: the base profile with the NIC keys of this machine's ACTIVE ibverbs port
/// (nic.rs); waived without one. No GPU is needed.
fn nic_only(o: &Options, name: &str) -> Result<ExitCode> {
    let base = read_base(o.base.as_deref().unwrap_or("h100-cx7"))?;
    let inv = inventory::survey(Path::new("/"));
    if inv.active_ports.is_empty() {
        eprintln!("eptwin: calibrate waived: no ACTIVE ibverbs port (/sys/class/infiniband)");
        return Ok(ExitCode::Waived);
    }
    let measured = nic::keys(&inv, nic::BaseNic::of(&base));
    if measured.is_empty() {
        bail!("the ACTIVE port gave no NIC key (no negotiated rate, no probe)");
    }
    let date: String = crate::commands::now_rfc3339().chars().take(10).collect();
    let machine =
        Machine { gpu: "NIC only, no GPU probed".into(), driver: "n/a".into(), date: date.clone() };
    let head = writer::Head {
        name: name.to_string(),
        description: format!("{} with this machine's NIC probed ({date})", base.label),
        header: vec![
            format!(
                "{name}: {} with the NIC keys of this machine's ACTIVE ibverbs port, written by",
                base.label
            ),
            format!(
                "eptwin calibrate --nic-only {} ({}), {date}. docs/calibration.md, \"The NIC\".",
                eptwin_engine::VERSION,
                env!("EPTWIN_GIT_COMMIT")
            ),
        ],
    };
    let text = writer::render(&head, &base, &measured, &machine)?;
    finish(o, &text, &measured, &base, &Vec::new())
}

/// Check and write the profile, print the summary.
fn finish(
    o: &Options,
    text: &str,
    measured: &[Measured],
    base: &writer::Base,
    rows: &FitRows,
) -> Result<ExitCode> {
    check(&o.out, text)?;
    eptwin_engine::result::write_file_atomic(&o.out, text.as_bytes())
        .with_context(|| format!("writing {}", o.out.display()))?;
    progress(&format!("wrote {}", o.out.display()));
    print_summary(measured, &base.table, &base.label, rows);
    outln!("# profile: {}", o.out.display());
    Ok(ExitCode::Ok)
}

/// The GPU the one-rank runs name (scripts/deepep-one-rank.py's `result.json`: `gpu`; its
/// `routing.json` `source`, which says when).
fn runs_machine(o: &Options) -> Machine {
    let unknown = || Machine {
        gpu: "the GPU of the one-rank runs".into(),
        driver: "unknown".into(),
        date: "date unknown".into(),
    };
    let Some(dir) = o.deepep_runs.as_ref() else { return unknown() };
    let Ok(entries) = std::fs::read_dir(dir) else { return unknown() };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    paths.sort();
    let read = |p: &Path| -> Option<Value> {
        serde_json::from_slice(&read_input(p, &DOCUMENT).ok()?).ok()
    };
    for p in paths {
        let (Some(result), routing) = (read(&p.join("result.json")), read(&p.join("routing.json")))
        else {
            continue;
        };
        let gpu = result.get("gpu").and_then(Value::as_str).unwrap_or("unknown GPU").to_string();
        // "... on <gpu>, torch <v>, 2026-12-07 03:59 UTC"
        let date = routing
            .and_then(|r| r.get("source").and_then(Value::as_str).map(str::to_string))
            .and_then(|s| s.rsplit(", ").next().map(|d| d.chars().take(10).collect()))
            .unwrap_or_else(|| "date unknown".into());
        let driver = read_input(&dir.join("gpu.txt"), &LOG)
            .ok()
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .and_then(|t| t.lines().nth(1).and_then(|l| l.split(", ").nth(1).map(str::to_string)))
            .unwrap_or_else(|| "unknown".into());
        return Machine { gpu, driver, date };
    }
    unknown()
}

/// Next to each one-rank run made here, the scenarios that set it against the model with the
/// written profile (`eptwin compare <dir>/*/compare-*.toml --measured <dir> --allow-other-text`,
/// the runs having named the base profile): named as the
/// imported results, with the routing the kernels ran.
fn write_comparisons(o: &Options, runs: &[deepep::Run]) -> Result<()> {
    if o.deepep_runs.is_some() || runs.is_empty() {
        return Ok(());
    }
    let dir = o.out.with_extension("deepep");
    let profile = std::path::absolute(&o.out)?.display().to_string();
    for run in runs {
        for hook in [false, true] {
            let text = deepep::scenario_text(&run.shape, &profile, hook, run.routing.as_deref());
            let name =
                format!("compare-{}{}.toml", run.shape.tag(), if hook { "-hook" } else { "" });
            eptwin_engine::api::write_output(
                &deepep::run_dir(&dir, &run.shape).join(name),
                text.as_bytes(),
            )?;
        }
    }
    progress(&format!("comparison scenarios: {}/*/compare-*.toml", dir.display()));
    Ok(())
}

/// Fit the low-latency costs on the profile `text` (written next to the output, in a new file
/// of a random name removed after, while the fit runs): the `[deepep]` values and the table of
/// every run.
fn fit_deepep(o: &Options, runs: &[deepep::Run], text: &str) -> Result<(Vec<Measured>, FitRows)> {
    let dir = eptwin_engine::files::parent_dir(&o.out);
    let mut draft = tempfile::Builder::new()
        .prefix(".eptwin-draft-")
        .suffix(".toml")
        .tempfile_in(dir)
        .with_context(|| format!("creating a draft profile in {}", dir.display()))?;
    std::io::Write::write_all(&mut draft, text.as_bytes())
        .with_context(|| format!("writing {}", draft.path().display()))?;
    let path = std::path::absolute(draft.path())?;
    let fit = deepep::fit(runs, &path, &mut |m| progress(m));
    drop(draft);
    let fit = fit?;
    let fitted = runs.iter().filter(|r| r.shape.experts == 288).count();
    let measured = deepep::COSTS
        .iter()
        .zip(fit.costs)
        .map(|(key, ns)| {
            Measured::new(
                "deepep",
                key,
                toml::Value::Integer(ns as i64),
                format!("DeepEP's low-latency kernels at one rank, {fitted} shapes fused and in hook mode: least squares of the model's relative errors (docs/calibration.md)"),
            )
        })
        .collect();
    Ok((measured, fit.rows))
}

/// What [`calibrate`] reads and writes, decided before it probes, runs or fits anything.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// Probe this machine (no `--from`, not `--deepep-only`): its result goes to
    /// `<out>.probes.json`.
    probe_here: bool,
    /// Run the one-rank sweep here (`--deepep-dir` and `deep_ep` importable).
    sweep_here: bool,
}

/// The files this command writes itself, checked before it does any work (engine/src/files.rs,
/// as every command's): the profile, the probe result, and, for a sweep run here, each shape's
/// launch script, stderr, imported results and comparison scenarios. None may be anything but a
/// regular file or missing, one of the others, or a file it reads (`--from`, a `--base` file,
/// the `--deepep-runs` files). The files DeepEP's scripts write in a shape's folder (their log,
/// `routing.json`) are theirs.
fn check_outputs(o: &Options, plan: Plan) -> Result<()> {
    let mut outputs = Outputs::new();
    for f in &o.from {
        outputs.input(f, &format!("--from {}", f.display()));
    }
    if let Some(base) = o.base.as_deref().filter(|b| eptwin_engine::profile::names_file(b)) {
        outputs.input(Path::new(base), &format!("--base {base}"));
    }
    if let Some(dir) = &o.deepep_runs {
        for f in deepep::run_inputs(dir) {
            outputs.input(&f, &format!("the one-rank run file {}", f.display()));
        }
    }
    outputs.claim(&o.out, "--out")?;
    if plan.probe_here {
        outputs.claim(&o.out.with_extension("probes.json"), "the probe result")?;
    }
    if plan.sweep_here {
        let dir = o.out.with_extension("deepep");
        for shape in &deepep::SWEEP {
            for (path, what) in deepep::outputs(&dir, shape, !o.deepep_only) {
                outputs.claim(&path, &what)?;
            }
        }
    }
    Ok(())
}

pub fn calibrate(o: &Options) -> Result<ExitCode> {
    let plan = Plan {
        probe_here: o.from.is_empty() && !o.deepep_only && !o.nic_only,
        sweep_here: !o.nic_only && sweeps_here(o),
    };
    check_outputs(o, plan)?;
    let name = match &o.name {
        Some(n) => n.clone(),
        None => o.out.file_stem().and_then(|s| s.to_str()).unwrap_or("calibrated").to_string(),
    };
    if o.deepep_only {
        return deepep_only(o, &name);
    }
    if o.nic_only {
        return nic_only(o, &name);
    }
    let (probes, machine, inv) = if plan.probe_here {
        let inv = inventory::survey(Path::new("/"));
        match probe_here(&o.out.with_extension("probes.json"), &inv)? {
            Ok((probes, machine)) => (probes, machine, Some(inv)),
            Err(reason) => {
                eprintln!("eptwin: calibrate waived: {reason}");
                return Ok(ExitCode::Waived);
            }
        }
    } else {
        let (probes, machine) = read_probes(&o.from)?;
        (probes, machine, None)
    };
    let base = read_base(o.base.as_deref().unwrap_or(default_base(&machine.gpu)))?;
    progress(&format!("base profile {}; GPU {}", base.label, machine.gpu));
    let flags_cross_gpus = base.number("cluster", "nvlink_domain_gpus").is_some_and(|g| g > 1.0);
    let mut measured = derive::gpu(&probes, flags_cross_gpus);
    // The cluster keys are checked against the memory rates (cluster.rs).
    let (memory, rates) = derive::memory(&probes);
    measured.extend(memory);
    if let Some(rates) = rates {
        measured.extend(cluster::keys(&probes, &rates));
    }
    let base_nvlink_bw = base.number("nvlink", "bw_per_direction_gbps").unwrap_or(0.0);
    measured.extend(derive::nvlink(&probes, base_nvlink_bw));
    if let Some(inv) = &inv {
        measured.extend(nic::keys(inv, nic::BaseNic::of(&base)));
    }
    if measured.is_empty() {
        bail!("the probes measured nothing this command derives a profile key from");
    }
    let head = writer::Head {
        name: name.clone(),
        description: description(&base, flags_cross_gpus, &machine),
        header: header_lines(&name, &base.label, &machine, o),
    };
    let mut text = writer::render(&head, &base, &measured, &machine)?;
    check(&o.out, &text)?;
    // The DeepEP one-rank sweep, fitted on the profile as measured so far.
    let runs = one_rank_runs(o, plan.sweep_here, Some(&machine.gpu))?;
    let mut rows = Vec::new();
    if !runs.is_empty() {
        let (fitted, fit_rows) = fit_deepep(o, &runs, &text)?;
        measured.extend(fitted);
        rows = fit_rows;
        text = writer::render(&head, &base, &measured, &machine)?;
    }
    let code = finish(o, &text, &measured, &base, &rows)?;
    write_comparisons(o, &runs)?;
    Ok(code)
}

/// The written profile's description. A base whose NVLink domain spans several GPUs describes a
/// cluster (nodes, NVSwitch, NICs) that a probe run on one GPU does not change, so its
/// description stays, with what was calibrated after it.
fn description(base: &writer::Base, cluster_base: bool, machine: &Machine) -> String {
    const CALIBRATED: &str = "calibrated by eptwin calibrate";
    let calibrated = format!("{CALIBRATED} ({})", machine.date);
    match base.table.get("description").and_then(|d| d.as_str()) {
        Some(d) if cluster_base => {
            // A base calibrated before (a bundled profile re-generated from itself) keeps its
            // own description, not the earlier calibration's.
            let own = match d.rsplit_once("; ") {
                Some((own, last)) if last.contains(CALIBRATED) => own,
                _ => d,
            };
            format!("{own}; {} {calibrated}", machine.gpu)
        }
        _ => format!("{} {calibrated}", machine.gpu),
    }
}

fn progress(message: &str) {
    eprintln!("eptwin calibrate: {message}");
}

/// The written text is a profile (every key, type and range), or the command fails saying why.
fn check(out: &Path, text: &str) -> Result<()> {
    eptwin_engine::profile::check_text(&out.display().to_string(), text).map(|_| ()).map_err(
        |faults| anyhow::anyhow!("the calibrated profile is not valid:\n  {}", faults.join("\n  ")),
    )
}

/// The bundled profile of a GPU's kind.
fn default_base(gpu: &str) -> &'static str {
    if gpu.contains("H200") { "h200-cx7" } else { "h100-cx7" }
}

/// A `--base` profile file, read as the engine reads a profile a scenario names.
const BASE_FILE: InputKind = eptwin_engine::profile::PROFILE_FILE;

/// A `--from` file: a hardware result or an `eptwin run` log.
const FROM_FILE: InputKind = InputKind {
    noun: "a --from file",
    format: "an eptwin result (JSON) or an eptwin run log",
    max_bytes: DOCUMENT.max_bytes,
    max_text: DOCUMENT.max_text,
};

/// The text of an input file, bounded by `kind` (engine/src/files.rs).
fn read_text(path: &Path, kind: &InputKind, what: &str) -> Result<String> {
    let bytes = read_input(path, kind).with_context(|| format!("reading {what}"))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!("{what}: invalid UTF-8 at byte {}", e.utf8_error().valid_up_to())
    })
}

/// The base profile: a bundled name or a profile file.
fn read_base(name: &str) -> Result<writer::Base> {
    if eptwin_engine::profile::names_file(name) {
        let text = read_text(Path::new(name), &BASE_FILE, &format!("--base {name}"))?;
        let table = eptwin_engine::profile::check_text(name, &text).map_err(|f| {
            anyhow::anyhow!("--base {name} is not a profile:\n  {}", f.join("\n  "))
        })?;
        return Ok(writer::Base { label: name.to_string(), text, table });
    }
    let Some((_, text)) = eptwin_engine::profile::BUNDLED.iter().find(|(n, _)| *n == name) else {
        bail!(
            "--base {name}: no bundled profile of that name ({}), and not a profile file (a path with a '/' or ending in .toml)",
            eptwin_engine::profile::bundled_names().collect::<Vec<_>>().join(", ")
        );
    };
    let table = toml::from_str(text).context("a bundled profile")?;
    Ok(writer::Base { label: name.to_string(), text: text.to_string(), table })
}

fn header_lines(name: &str, base: &str, machine: &Machine, o: &Options) -> Vec<String> {
    let from = if o.from.is_empty() {
        "the hardware backend's probes, run here".to_string()
    } else {
        format!(
            "the probes of {}",
            o.from.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    };
    vec![
        format!(
            "{name}: written by eptwin calibrate {} ({}) from {from}",
            eptwin_engine::VERSION,
            env!("EPTWIN_GIT_COMMIT")
        ),
        format!("on {} (driver {}), {}.", machine.gpu, machine.driver, machine.date),
        format!(
            "\"measured\" values say which probe or fit each is; \"from {base}\" ones are the base"
        ),
        "profile's, with its comment. docs/calibration.md says how each key is derived.".into(),
    ]
}

/// The probes of hardware results (`measurements`, `backend`) and `eptwin run` logs (`# measured
/// probe.<key>: <json>` lines): the first result names the machine.
fn read_probes(files: &[PathBuf]) -> Result<(Probes, Machine)> {
    let mut probes = Probes::default();
    let mut machine = None;
    for f in files {
        let text = read_text(f, &FROM_FILE, &format!("--from {}", f.display()))?;
        if let Ok(doc) = serde_json::from_str::<eptwin_engine::result::RunResult>(&text) {
            if machine.is_none() {
                probes.backend = doc.backend.clone();
                machine = Some(machine_of(&doc.backend, doc.eptwin.created_at.as_deref()));
            }
            probes.add(&doc.measurements);
            continue;
        }
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# measured probe.") else { continue };
            let Some((key, json)) = rest.split_once(": ") else { continue };
            if let Ok(v) = serde_json::from_str::<Value>(json) {
                // Several runs in one log: each occurrence counts.
                probes.add(&BTreeMap::from([(format!("probe.{key}"), v)]));
            }
        }
    }
    let Some(machine) = machine else {
        bail!(
            "--from needs at least one hardware result (JSON) for the GPU's identity; logs alone carry only probes"
        );
    };
    Ok((probes, machine))
}

fn machine_of(backend: &BTreeMap<String, Value>, created_at: Option<&str>) -> Machine {
    let s = |k: &str| backend.get(k).and_then(Value::as_str).map(str::to_string);
    let gpu = backend
        .get("gpu_names")
        .and_then(|n| n.get(0))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| "unknown GPU".into());
    Machine {
        gpu,
        driver: s("driver_version").unwrap_or_else(|| "unknown".into()),
        date: created_at.map_or("date unknown".into(), |t| t.chars().take(10).collect()),
    }
}

/// Probe this machine: a short one-GPU run on the hardware backend with every probe on (the
/// probes run when it prepares), its result kept at `keep` (`--from` reads it back).
/// `Err(reason)` when there is no GPU to probe (waived).
fn probe_here(
    keep: &Path,
    inv: &inventory::Inventory,
) -> Result<Result<(Probes, Machine), String>> {
    progress(&format!(
        "probing this GPU (the hardware backend's probes, cluster probes and the NCCL baseline included); {} GPU(s) listed by the driver: {}",
        inv.gpus,
        if inv.gpus >= 2 {
            "NVLink peer probes between two of them"
        } else {
            "no NVLink peer probes (they need two GPUs; the NVLink keys stay the base's)"
        }
    ));
    let text = inventory::probe_scenario(inv.gpus);
    let text = text.as_str();
    let loaded =
        eptwin_engine::parse("calibrate-probes.toml", text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let plan = eptwin_engine::Plan::build(&loaded).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut options = eptwin_hw::HwOptions::from_env();
    options.probes = true;
    options.nccl_baseline = true;
    options.cluster_probe = true;
    let mut hw = eptwin_hw::HwTransport::single(options, eptwin_group::Launcher::Single);
    let provenance = super::provenance(crate::cli::BackendArg::Hw);
    let result = eptwin_engine::run::run_observed(&plan, &mut hw, provenance, &mut |_| {})?;
    if result.verdict == eptwin_engine::result::Verdict::Waived {
        return Ok(Err(result.waived_reason.unwrap_or_else(|| "no GPU".into())));
    }
    eptwin_engine::result::write_atomic(keep, &result.to_json())?;
    progress(&format!("probe result: {}", keep.display()));
    let mut probes = Probes { backend: result.backend.clone(), ..Probes::default() };
    probes.add(&result.measurements);
    let machine = machine_of(&result.backend, result.eptwin.created_at.as_deref());
    Ok(Ok((probes, machine)))
}

/// Whether the one-rank sweep runs here: `--deepep-dir` without `--deepep-runs`, and Python
/// imports `deep_ep` (when not, saying why: the base's costs stay).
fn sweeps_here(o: &Options) -> bool {
    if o.deepep_runs.is_some() {
        return false;
    }
    if o.deepep_dir.is_none() {
        progress("no --deepep-dir: the DeepEP low-latency costs stay the base's");
        return false;
    }
    if let Err(why) = deepep::deepep_importable(&o.python) {
        progress(&format!(
            "{} cannot import deep_ep ({why}): the DeepEP low-latency costs stay the base's",
            o.python
        ));
        return false;
    }
    true
}

/// The one-rank runs to fit: read from `--deepep-runs`, or run here (`sweep_here`, from
/// [`sweeps_here`]); none otherwise.
fn one_rank_runs(o: &Options, sweep_here: bool, gpu: Option<&str>) -> Result<Vec<deepep::Run>> {
    if let Some(dir) = &o.deepep_runs {
        let runs = deepep::read_runs(dir)?;
        progress(&format!("{} DeepEP one-rank runs read from {}", runs.len(), dir.display()));
        return Ok(runs);
    }
    let (Some(deepep_dir), true) = (&o.deepep_dir, sweep_here) else {
        return Ok(Vec::new());
    };
    let dir = o.out.with_extension("deepep");
    deepep::sweep(
        &deepep::SWEEP,
        &dir,
        deepep_dir,
        &o.python,
        (o.deepep_timeout, o.deepep_budget),
        gpu,
        &mut |m| progress(m),
    )
}

/// The summary on stdout: every measured key against the base's, then the one-rank fit.
fn print_summary(measured: &[Measured], base: &toml::Table, base_label: &str, fit: &FitRows) {
    let base_value = |m: &Measured| {
        let mut t = base;
        for part in m.section.split('.') {
            match t.get(part).and_then(toml::Value::as_table) {
                Some(next) => t = next,
                None => return "-".to_string(),
            }
        }
        t.get(&m.key).map_or("-".into(), ToString::to_string)
    };
    outln!("{:<38} {:>14} {:>14}  source", "key", "measured", base_label);
    for m in measured {
        let source: String = m.source.chars().take(90).collect();
        outln!("{:<38} {:>14} {:>14}  {source}", m.path(), m.value.to_string(), base_value(m));
    }
    if fit.is_empty() {
        return;
    }
    outln!("\nDeepEP at one rank against the model with these costs (us, DeepEP / model, error):");
    outln!(
        "{:<16} {}",
        "shape",
        deepep::Times::NAMES.iter().map(|n| format!("{n:>24}")).collect::<String>()
    );
    for (shape, d, m) in fit {
        let cells: String = (0..8)
            .map(|q| {
                format!(
                    "{:>24}",
                    format!(
                        "{:.2}/{:.2} {:+.1}%",
                        d.get(q),
                        m.get(q),
                        100.0 * (m.get(q) / d.get(q) - 1.0)
                    )
                )
            })
            .collect();
        outln!("{:<16} {cells}", shape.tag());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(text: &str) -> writer::Base {
        writer::Base { label: "b".into(), text: text.into(), table: text.parse().unwrap() }
    }

    #[test]
    fn a_cluster_base_keeps_its_description_and_a_one_gpu_base_gets_the_gpus() {
        let machine = Machine { gpu: "NVIDIA H100".into(), driver: "580".into(), date: "d".into() };
        let b = base("description = \"8 GPUs per node, CX7 per GPU\"\n");
        assert_eq!(
            description(&b, true, &machine),
            "8 GPUs per node, CX7 per GPU; NVIDIA H100 calibrated by eptwin calibrate (d)"
        );
        assert_eq!(
            description(&b, false, &machine),
            "NVIDIA H100 calibrated by eptwin calibrate (d)"
        );
        assert_eq!(
            description(&base(""), true, &machine),
            "NVIDIA H100 calibrated by eptwin calibrate (d)"
        );
        // Re-generated from itself, a bundled profile keeps one description.
        let again = base(&format!("description = \"{}\"\n", description(&b, true, &machine)));
        assert_eq!(description(&again, true, &machine), description(&b, true, &machine));
    }
}
