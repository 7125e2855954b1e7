//! The GPU side of the DeepEP low-latency model (`[deepep]` `ll_*`) from DeepEP's own kernels
//! at one rank: every (token, expert) message stays on the GPU, so a kernel's time is its GPU
//! work alone (docs/calibration.md, "The low-latency kernels on one GPU"). Each shape of the
//! sweep is a one-node, one-GPU scenario launched with `eptwin deepep launch` and read back with
//! `eptwin deepep import`, fused and in hook mode; the fit is the least-squares solution, with
//! no cost below zero, of the model's relative errors on the four op times (dispatch and
//! combine, fused and hook) and, at a third of the weight, on the six kernels.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eptwin_engine::api::{DOCUMENT, LOG, output_refusal, read_input, write_output};
use eptwin_engine::result::{Provenance, RunResult};
use eptwin_replay::import::{LogText, import};
use eptwin_replay::launch::{LaunchFormat, launch};
use eptwin_replay::subject::Subject;

use crate::cli::BackendArg;

/// One shape of the sweep (288 experts, as DeepEP's test).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub tokens: u32,
    pub topk: u32,
    pub hidden: u32,
    pub experts: u32,
}

const fn shape(tokens: u32, topk: u32, hidden: u32) -> Shape {
    Shape { tokens, topk, hidden, experts: 288 }
}

/// Tokens 8-256 at top-8 and hidden 7,168; top-1, 2, 4 and hidden 2,048, 4,096 at 128 tokens
/// (the committed H100 sweep, results/h100/deepep-one-rank/sweep; DeepEP needs the token
/// count to be a multiple of 4, and the default NVSHMEM_QP_DEPTH caps it at 511). In the order
/// they run: where a time budget cuts the sweep short, the first ones already span the tokens,
/// the top-k and the hidden size, each cost's lever.
pub const SWEEP: [Shape; 10] = [
    shape(128, 8, 7168),
    shape(8, 8, 7168),
    shape(256, 8, 7168),
    shape(128, 1, 7168),
    shape(128, 8, 2048),
    shape(32, 8, 7168),
    shape(64, 8, 7168),
    shape(128, 2, 7168),
    shape(128, 4, 7168),
    shape(128, 8, 4096),
];

impl Shape {
    /// `t128-k8-h7168` (`-e32` with other than 288 experts).
    pub fn tag(&self) -> String {
        let e = if self.experts == 288 { String::new() } else { format!("-e{}", self.experts) };
        format!("t{}-k{}-h{}{e}", self.tokens, self.topk, self.hidden)
    }

    /// Read a tag back.
    pub fn parse(tag: &str) -> Option<Shape> {
        let mut s = Shape { tokens: 0, topk: 0, hidden: 0, experts: 288 };
        for part in tag.split('-') {
            let (k, v) = part.split_at(1);
            let v: u32 = v.parse().ok()?;
            match k {
                "t" => s.tokens = v,
                "k" => s.topk = v,
                "h" => s.hidden = v,
                "e" => s.experts = v,
                _ => return None,
            }
        }
        (s.tokens > 0 && s.topk > 0 && s.hidden > 0).then_some(s)
    }
}

/// The scenario of one shape on one GPU: DeepEP test's buffer (one QP per expert, the LL size
/// hint), fused or hook, with eptwin's routing or the one the kernels ran (`routing`).
pub fn scenario_text(s: &Shape, profile: &str, hook: bool, routing: Option<&Path>) -> String {
    let name = scenario_name(s, hook);
    let hint =
        eptwin_engine::deepep::config::low_latency_rdma_size_hint(s.tokens, s.hidden, s.experts);
    let routing = match routing {
        Some(path) => format!(
            "routing = \"file\"\nrouting_file = {}\n",
            toml::Value::from(path.display().to_string())
        ),
        None => "masked_selections = 10\n".into(),
    };
    format!(
        "schema = 1\nname = \"{name}\"\ndescription = \"DeepEP's low-latency kernels, one rank on one GPU\"\n\n\
         [cluster]\nprofile = {}\nnodes = 1\ngpus_per_node = 1\nranks_per_gpu = 1\n\n\
         [[job]]\nname = \"ll\"\n[job.buffer]\nlow_latency_mode = true\nnum_rdma_bytes = {hint}\n\
         num_qps_per_rank = {}\nallow_nvlink_for_low_latency_mode = true\n[job.workload]\n\
         tokens_per_rank = {}\nhidden = {}\ntopk = {}\nexperts = {}\nhook = {hook}\n{routing}\
         warmup = 0\niterations = 1\n",
        toml::Value::from(profile),
        s.experts,
        s.tokens,
        s.hidden,
        s.topk,
        s.experts,
    )
}

/// The six kernel times of one shape, µs: dispatch and combine fused, and their hook-mode send
/// and receive kernels.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Times {
    pub d_fused: f64,
    pub c_fused: f64,
    pub d_send: f64,
    pub d_recv: f64,
    pub c_send: f64,
    pub c_recv: f64,
}

impl Times {
    /// Quantity `i` of [`Times::NAMES`]: the four op times first, then the kernels.
    pub fn get(&self, i: usize) -> f64 {
        [
            self.d_fused,
            self.c_fused,
            self.d_send + self.d_recv,
            self.c_send + self.c_recv,
            self.d_send,
            self.d_recv,
            self.c_send,
            self.c_recv,
        ][i]
    }

    pub const NAMES: [&'static str; 8] = [
        "dispatch fused",
        "combine fused",
        "dispatch hook",
        "combine hook",
        "dispatch send",
        "dispatch recv",
        "combine send",
        "combine recv",
    ];

    /// The times of a fused and a hook-mode result (imported or simulated).
    pub fn from_results(fused: &RunResult, hook: &RunResult) -> Option<Times> {
        let op = |r: &RunResult, name: &str| {
            r.jobs.first()?.ops.iter().find(|o| o.op == name).map(|o| o.summary.clone())
        };
        let (d, c) = (op(fused, "dispatch")?, op(fused, "combine")?);
        let (dh, ch) = (op(hook, "dispatch")?, op(hook, "combine")?);
        let phase = |s: &eptwin_engine::result::Summary, p: &str| s.phases_us.get(p).copied();
        Some(Times {
            d_fused: d.latency_us.mean,
            c_fused: c.latency_us.mean,
            d_send: phase(&dh, "send")?,
            d_recv: phase(&dh, "recv")?,
            c_send: phase(&ch, "send")?,
            c_recv: phase(&ch, "recv")?,
        })
    }
}

/// The `[deepep]` keys the fit sets, in its order.
pub const COSTS: [&str; 8] = [
    "ll_dispatch_fixed_ns",
    "ll_dispatch_recv_fixed_ns",
    "ll_send_round_ns",
    "ll_recv_per_msg_ns",
    "ll_combine_fixed_ns",
    "ll_combine_recv_fixed_ns",
    "ll_combine_round_ns",
    "ll_reduce_load_ns",
];

/// One measured shape: DeepEP's times and the routing its kernels ran (when recorded).
#[derive(Debug, Clone)]
pub struct Run {
    pub shape: Shape,
    pub routing: Option<PathBuf>,
    pub deepep: Times,
}

/// The model's times for `run` on the profile file `profile` with the `[deepep]` costs
/// `costs` (ns, [`COSTS`] order).
pub fn model(run: &Run, profile: &Path, costs: &[f64; 8]) -> Result<Times> {
    let mut results = Vec::new();
    for hook in [false, true] {
        let mut text =
            scenario_text(&run.shape, &profile.display().to_string(), hook, run.routing.as_deref());
        text = text.replacen("[[job]]", &format!("{}\n[[job]]", overrides(costs)), 1);
        let loaded = eptwin_engine::parse(&format!("{}.toml", run.shape.tag()), &text)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let plan = eptwin_engine::Plan::build(&loaded).map_err(|e| anyhow::anyhow!("{e}"))?;
        let (result, _) = super::super::run::execute(&plan, BackendArg::Sim, false)?;
        results.push(result);
    }
    Times::from_results(&results[0], &results[1])
        .with_context(|| format!("{}: the simulation has no hook-mode phases", run.shape.tag()))
}

fn overrides(costs: &[f64; 8]) -> String {
    let mut s = String::from("[cluster.overrides.deepep]\n");
    for (k, v) in COSTS.iter().zip(costs) {
        s.push_str(&format!("{k} = {}\n", v.max(0.0).round() as u64));
    }
    s
}

/// The fitted costs, ns, and each run's DeepEP and model times with them.
#[derive(Debug, Clone)]
pub struct Fit {
    pub costs: [f64; 8],
    pub rows: Vec<(Shape, Times, Times)>,
}

/// Weight of each quantity of [`Times::get`] in the fit: the op times whole, the kernels a third.
const WEIGHTS: [f64; 8] = [1.0, 1.0, 1.0, 1.0, 0.3, 0.3, 0.3, 0.3];

/// Fit [`COSTS`] to the 288-expert `runs` on the profile file `profile` (every run is reported
/// with the solution). The model is nearly linear in each cost (each adds its time to a chain
/// or to a kernel's start), so around the current costs one run per cost 1 µs higher gives its
/// coefficients, and the costs follow from non-negative least squares on the weighted relative
/// errors; three rounds of that, from zero, settle what the linearisation misses.
pub fn fit(runs: &[Run], profile: &Path, progress: &mut dyn FnMut(&str)) -> Result<Fit> {
    if runs.is_empty() {
        bail!("no DeepEP one-rank runs to fit");
    }
    let mut costs = [0.0; 8];
    for round in 1..=3 {
        progress(&format!("fitting the low-latency costs, round {round} of 3"));
        let mut base = Vec::new();
        let mut unit = vec![Vec::new(); 8];
        for run in runs {
            base.push(model(run, profile, &costs)?);
            for (i, u) in unit.iter_mut().enumerate() {
                let mut c = costs;
                c[i] += 1000.0;
                u.push(model(run, profile, &c)?);
            }
        }
        let x = solve_weighted(runs, &base, &unit, &costs);
        for (c, v) in costs.iter_mut().zip(x) {
            *c = v.round();
        }
    }
    let mut rows = Vec::new();
    for run in runs {
        rows.push((run.shape, run.deepep, model(run, profile, &costs)?));
    }
    Ok(Fit { costs, rows })
}

/// The costs that bring the linearised model (`base` at `at`, `unit` with each cost 1 µs more)
/// closest to DeepEP on DeepEP's test shape (288 experts; other expert counts are reported, not
/// fitted): rows weight × (coefficient · costs − (DeepEP − base + coefficient · at)) / DeepEP,
/// reweighted by the square root of each quantity's error (the kernels' at half) and solved
/// again, 30 times, so that the largest errors shrink at the cost of the smallest.
fn solve_weighted(runs: &[Run], base: &[Times], unit: &[Vec<Times>], at: &[f64; 8]) -> Vec<f64> {
    let fitted: Vec<usize> = (0..runs.len()).filter(|&r| runs[r].shape.experts == 288).collect();
    let coef = |r: usize, q: usize, i: usize| (unit[i][r].get(q) - base[r].get(q)) / 1000.0;
    let offset = |r: usize, q: usize| (0..8).map(|i| coef(r, q, i) * at[i]).sum::<f64>();
    let mut scale = vec![[1.0f64; 8]; runs.len()];
    let mut x = at.to_vec();
    for _ in 0..30 {
        let mut a = Vec::new();
        let mut b = Vec::new();
        for &r in &fitted {
            for (q, w) in WEIGHTS.iter().enumerate() {
                let d = runs[r].deepep.get(q);
                if d <= 0.0 {
                    continue;
                }
                let w = w * scale[r][q];
                a.push((0..8).map(|i| w * coef(r, q, i) / d).collect::<Vec<_>>());
                b.push(w * (d - base[r].get(q) + offset(r, q)) / d);
            }
        }
        x = nnls(&a, &b);
        for &r in &fitted {
            for (q, weight) in scale[r].iter_mut().enumerate() {
                let d = runs[r].deepep.get(q);
                let m = base[r].get(q) - offset(r, q)
                    + (0..8).map(|i| coef(r, q, i) * x[i]).sum::<f64>();
                let kernel = if q < 4 { 1.0 } else { 0.5 };
                *weight = kernel * ((m / d - 1.0).abs().max(0.01)).sqrt();
            }
        }
    }
    x
}

/// Least squares with every unknown ≥ 0 (active set: solve, drop the negatives, solve again).
pub fn nnls(a: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    let n = a.first().map_or(0, Vec::len);
    let mut active: Vec<usize> = (0..n).collect();
    loop {
        let x = lstsq(a, b, &active);
        let negative: Vec<usize> =
            active.iter().zip(&x).filter(|(_, v)| **v < 0.0).map(|(i, _)| *i).collect();
        if negative.is_empty() {
            let mut out = vec![0.0; n];
            for (i, v) in active.iter().zip(x) {
                out[*i] = v;
            }
            return out;
        }
        active.retain(|i| !negative.contains(i));
    }
}

/// Least squares on the columns `cols` (normal equations, Gauss-Jordan with pivoting; a column
/// that adds nothing gets 0).
fn lstsq(a: &[Vec<f64>], b: &[f64], cols: &[usize]) -> Vec<f64> {
    let n = cols.len();
    let mut m: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            let mut row: Vec<f64> =
                (0..n).map(|j| a.iter().map(|r| r[cols[i]] * r[cols[j]]).sum()).collect();
            row.push(a.iter().zip(b).map(|(r, y)| r[cols[i]] * y).sum());
            row
        })
        .collect();
    for i in 0..n {
        let p = (i..n).max_by(|&x, &y| m[x][i].abs().total_cmp(&m[y][i].abs())).unwrap_or(i);
        m.swap(i, p);
        if m[i][i].abs() < 1e-12 {
            continue;
        }
        for r in 0..n {
            if r != i {
                let f = m[r][i] / m[i][i];
                let pivot = m[i].clone();
                for (x, y) in m[r].iter_mut().zip(&pivot) {
                    *x -= f * y;
                }
            }
        }
    }
    (0..n).map(|i| if m[i][i].abs() < 1e-12 { 0.0 } else { m[i][n] / m[i][i] }).collect()
}

/// Where one shape's run lives: `<dir>/<tag>/` with the launch log, the routing the stand-in
/// script recorded (`routing.json`) and the imported results.
pub fn run_dir(dir: &Path, s: &Shape) -> PathBuf {
    dir.join(s.tag())
}

/// The name of a shape's scenario, fused or in hook mode (its imported result's stem).
fn scenario_name(s: &Shape, hook: bool) -> String {
    format!("deepep-one-rank-{}{}", s.tag(), if hook { "-hook" } else { "" })
}

/// The files eptwin itself writes in a shape's folder under `dir` (launch script, stderr,
/// the two imported results and, with `comparisons`, the two comparison scenarios), each with
/// what it is, for the command's output check.
pub fn outputs(dir: &Path, s: &Shape, comparisons: bool) -> Vec<(PathBuf, String)> {
    let out = run_dir(dir, s);
    let tag = s.tag();
    let mut files = vec![
        (out.join("launch.sh"), format!("the launch script of {tag}")),
        (out.join("stderr.txt"), format!("the stderr of {tag}")),
    ];
    for hook in [false, true] {
        let name = scenario_name(s, hook);
        let path = eptwin_engine::result::result_path(&out, &name, Some("deepep"));
        files.push((path, format!("the imported result of {name}")));
    }
    if comparisons {
        for hook in [false, true] {
            let name = format!("compare-{tag}{}.toml", if hook { "-hook" } else { "" });
            files.push((out.join(&name), format!("the comparison scenario {name}")));
        }
    }
    files
}

/// The files [`read_runs`] may read under `dir` (those that exist), so that no output of the
/// command replaces one.
pub fn run_inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files = vec![dir.join("gpu.txt")];
    for e in entries.filter_map(|e| e.ok()) {
        let Some(shape) = e.file_name().to_str().and_then(Shape::parse) else { continue };
        let out = e.path();
        for hook in [false, true] {
            let name = scenario_name(&shape, hook);
            files.push(eptwin_engine::result::result_path(&out, &name, Some("deepep")));
        }
        files.push(out.join("result.json"));
        files.push(out.join("routing.json"));
    }
    files.retain(|f| std::fs::symlink_metadata(f).is_ok());
    files
}

/// Run DeepEP's LL test for every shape of `shapes` with `eptwin deepep launch`'s lines (the
/// script under `deepep_dir/tests/`), each run within the per-run timeout and the sweep within
/// its budget, import each log (recording `gpu`, the probed GPU), and return the runs. A shape whose
/// script fails is reported and left out.
#[allow(clippy::disallowed_methods)] // wall time: progress and the runs' time limit
pub fn sweep(
    shapes: &[Shape],
    dir: &Path,
    deepep_dir: &str,
    python: &str,
    (timeout, budget): (Duration, Option<Duration>),
    gpu: Option<&str>,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Run>> {
    // The launch script runs in each shape's folder: the checkout by its absolute path.
    let deepep_dir = std::path::absolute(deepep_dir)?.display().to_string();
    let deepep_dir = deepep_dir.as_str();
    let mut runs = Vec::new();
    let sweep_started = Instant::now();
    for (i, s) in shapes.iter().enumerate() {
        let Some(limit) = run_limit(timeout, budget, sweep_started.elapsed()) else {
            progress(&format!(
                "DeepEP one rank: the time budget is spent; {} of {} shapes left out ({})",
                shapes.len() - i,
                shapes.len(),
                shapes[i..].iter().map(Shape::tag).collect::<Vec<_>>().join(", ")
            ));
            break;
        };
        let out = run_dir(dir, s);
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let (fused, hook) = (plan_of(s, false)?, plan_of(s, true)?);
        let l = launch(&Subject::from_plan(&fused.1, &fused.0.scenario), deepep_dir).map_err(
            |notes| {
                anyhow::anyhow!(
                    "{}: {}",
                    s.tag(),
                    notes.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
                )
            },
        )?;
        let script = l.render(LaunchFormat::Shell { nodes_from_slurm: false });
        write_output(&out.join("launch.sh"), script.as_bytes())?;
        progress(&format!("DeepEP one rank: {} (launch.sh in {})", s.tag(), out.display()));
        let started = Instant::now();
        let status = run_script(&out, python, limit)?;
        let log_path = out.join(format!("{}.node0.log", fused.0.scenario.name));
        // The script's own log (its `tee`), read as any DeepEP log is: a regular file, bounded.
        let log = read_input(&log_path, &LOG)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default();
        progress(&format!("  {} after {:.0} s", status, started.elapsed().as_secs_f64()));
        let logs = [LogText { name: &log_path.display().to_string(), text: &log }];
        let provenance = Provenance {
            version: eptwin_engine::VERSION.to_string(),
            git_commit: env!("EPTWIN_GIT_COMMIT").to_string(),
            ..Provenance::default()
        };
        let imported = (
            import(&fused.1, &fused.0.scenario, &logs, provenance.clone()),
            import(&hook.1, &hook.0.scenario, &logs, provenance),
        );
        let (Ok(mut f), Ok(mut h)) = imported else {
            progress(&format!(
                "  {}: no DeepEP times in {} (left out)",
                s.tag(),
                log_path.display()
            ));
            continue;
        };
        // As `eptwin deepep import --gpu` records it: `eptwin compare` pairs by GPU.
        for r in [&mut f, &mut h] {
            if let Some(gpu) = gpu {
                r.backend.insert("gpus".into(), serde_json::json!(format!("1 x {gpu}")));
            }
        }
        for r in [&f, &h] {
            let path = eptwin_engine::result::result_path(&out, &r.scenario.name, Some("deepep"));
            eptwin_engine::result::write_atomic(&path, &r.to_json())?;
        }
        let Some(deepep) = Times::from_results(&f, &h) else {
            progress(&format!("  {}: the log lacks the hook-mode line (left out)", s.tag()));
            continue;
        };
        let routing = Some(out.join("routing.json")).filter(|p| p.is_file());
        runs.push(Run { shape: *s, routing, deepep });
    }
    Ok(runs)
}

/// The time limit of the next run: the per-run `timeout`, cut to what is left of the sweep's
/// `budget` after `spent`; none when less than ten seconds are left (DeepEP's start-up alone
/// takes about that long).
fn run_limit(timeout: Duration, budget: Option<Duration>, spent: Duration) -> Option<Duration> {
    let left = budget.map_or(timeout, |b| b.saturating_sub(spent)).min(timeout);
    (left >= Duration::from_secs(10)).then_some(left)
}

/// The one-GPU scenario of a shape, parsed and planned (the profile does not enter a launch).
fn plan_of(s: &Shape, hook: bool) -> Result<(eptwin_engine::LoadedScenario, eptwin_engine::Plan)> {
    let text = scenario_text(s, "h100-cx7", hook, None);
    let loaded = eptwin_engine::parse(&format!("{}.toml", s.tag()), &text)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let plan = eptwin_engine::Plan::build(&loaded).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((loaded, plan))
}

/// Run `launch.sh` in `dir` with `python` (its own `tee` writes the log there; the stand-in
/// script records its routing with `EPTWIN_DEEPEP_OUT`; stderr goes to `stderr.txt`), killed
/// after `timeout`. Coreutils' `timeout` runs it in a process group of its own and signals the
/// whole group, so a Python process the script started does not outlive it holding the GPU.
/// Stderr goes to a new file of a random name, renamed over `stderr.txt` once the run ends (as
/// every output: only over a regular file, engine/src/files.rs).
fn run_script(dir: &Path, python: &str, timeout: Duration) -> Result<String> {
    let path = dir.join("stderr.txt");
    let stderr = tempfile::Builder::new()
        .prefix(".eptwin-stderr-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("creating a file for stderr in {}", dir.display()))?;
    let status = wait_script(dir, python, timeout, stderr.reopen()?);
    if let Some(why) = output_refusal(&path) {
        bail!("{}: {why}", path.display());
    }
    stderr.persist(&path).with_context(|| format!("writing {}", path.display()))?;
    status
}

#[allow(clippy::disallowed_methods)] // wall time: the run's time limit
fn wait_script(
    dir: &Path,
    python: &str,
    timeout: Duration,
    stderr: std::fs::File,
) -> Result<String> {
    let secs = timeout.as_secs().max(1);
    let mut child = Command::new("timeout")
        .args(["--kill-after=5", &secs.to_string(), "bash", "launch.sh"])
        .current_dir(dir)
        .env("EPTWIN_DEEPEP_OUT", std::path::absolute(dir)?)
        .env("PYTHON", python)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .context("starting timeout bash launch.sh")?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(match status.code() {
                Some(124) | Some(137) => format!("killed after {secs} s"),
                Some(c) => format!("exit {c}"),
                None => "exit by signal".into(),
            });
        }
        // `timeout` itself stuck: the last resort.
        if started.elapsed() > timeout + Duration::from_secs(15) {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(format!("killed after {} s", started.elapsed().as_secs()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether `python` imports `deep_ep` here (its message when not).
pub fn deepep_importable(python: &str) -> Result<(), String> {
    match Command::new(python)
        .args(["-c", "import deep_ep"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .unwrap_or("import failed")
            .to_string()),
        Err(e) => Err(format!("{python}: {e}")),
    }
}

/// Runs already on disk (`<dir>/<tag>/`, as [`sweep`] leaves them): every folder whose
/// name is a shape and that holds both imported results.
pub fn read_runs(dir: &Path) -> Result<Vec<Run>> {
    let mut runs = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let Some(shape) = e.file_name().to_str().and_then(Shape::parse) else { continue };
        let out = e.path();
        let read = |hook: bool| -> Option<RunResult> {
            let name = scenario_name(&shape, hook);
            eptwin_engine::result::read(&eptwin_engine::result::result_path(
                &out,
                &name,
                Some("deepep"),
            ))
            .ok()
        };
        let imported = match (read(false), read(true)) {
            (Some(f), Some(h)) => Times::from_results(&f, &h),
            _ => None,
        };
        // Else the raw timings scripts/deepep-one-rank.py writes (result.json).
        let times = imported.or_else(|| raw_times(&out.join("result.json")));
        if let Some(deepep) = times {
            let routing = Some(out.join("routing.json")).filter(|p| p.is_file());
            runs.push(Run { shape, routing, deepep });
        }
    }
    Ok(runs)
}

/// The six times of scripts/deepep-one-rank.py's `result.json` (`modes.fused.*.kernel_us`,
/// `modes.hook.*.send_us|recv_us`).
fn raw_times(path: &Path) -> Option<Times> {
    let doc: serde_json::Value = serde_json::from_slice(&read_input(path, &DOCUMENT).ok()?).ok()?;
    let at = |mode: &str, op: &str, key: &str| doc["modes"][mode][op][key].as_f64();
    Some(Times {
        d_fused: at("fused", "dispatch", "kernel_us")?,
        c_fused: at("fused", "combine", "kernel_us")?,
        d_send: at("hook", "dispatch", "send_us")?,
        d_recv: at("hook", "dispatch", "recv_us")?,
        c_send: at("hook", "combine", "send_us")?,
        c_recv: at("hook", "combine", "recv_us")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_read_back() {
        for s in SWEEP {
            assert_eq!(Shape::parse(&s.tag()), Some(s));
        }
        let e32 = Shape { experts: 32, ..SWEEP[0] };
        assert_eq!(e32.tag(), "t128-k8-h7168-e32");
        assert_eq!(Shape::parse("t128-k8-h7168-e32"), Some(e32));
        assert_eq!(Shape::parse("summary.txt"), None);
        assert_eq!(Shape::parse("t-k8"), None);
    }

    #[test]
    fn every_shape_is_a_scenario_deepep_launch_replays() {
        for s in SWEEP {
            for hook in [false, true] {
                let (loaded, plan) = plan_of(&s, hook).unwrap();
                let l =
                    launch(&Subject::from_plan(&plan, &loaded.scenario), "/opt/DeepEP").unwrap();
                assert!(l.warnings.is_empty(), "{}: {:?}", s.tag(), l.warnings);
                let text = l.render(LaunchFormat::Shell { nodes_from_slurm: false });
                assert!(text.contains("--num-processes 1"), "{text}");
                assert!(text.contains(&format!("--num-tokens {}", s.tokens)), "{text}");
            }
        }
    }

    #[test]
    fn the_budget_cuts_each_run_and_stops_the_sweep() {
        let s = Duration::from_secs;
        assert_eq!(run_limit(s(90), None, s(1000)), Some(s(90)));
        assert_eq!(run_limit(s(90), Some(s(200)), s(0)), Some(s(90)));
        assert_eq!(run_limit(s(90), Some(s(200)), s(150)), Some(s(50)));
        assert_eq!(run_limit(s(90), Some(s(200)), s(195)), None);
        assert_eq!(run_limit(s(90), Some(s(200)), s(300)), None);
    }

    #[test]
    fn the_sweep_spans_every_lever_in_its_first_five() {
        let first = &SWEEP[..5];
        let tokens: std::collections::BTreeSet<u32> = first.iter().map(|s| s.tokens).collect();
        assert!(tokens.len() >= 3, "{tokens:?}");
        assert!(first.iter().any(|s| s.topk < 8));
        assert!(first.iter().any(|s| s.hidden < 7168));
    }

    #[test]
    fn nnls_keeps_every_unknown_non_negative() {
        // y = 2 a − 1 b on exact data: unconstrained b would be −1.
        let a: Vec<Vec<f64>> = (0..6).map(|i| vec![1.0 + i as f64, 1.0]).collect();
        let b: Vec<f64> = a.iter().map(|r| 2.0 * r[0] - r[1]).collect();
        let x = nnls(&a, &b);
        assert!(x[1] == 0.0 && x[0] > 0.0, "{x:?}");
        let exact: Vec<f64> = a.iter().map(|r| 2.0 * r[0] + 3.0 * r[1]).collect();
        let x = nnls(&a, &exact);
        assert!((x[0] - 2.0).abs() < 1e-9 && (x[1] - 3.0).abs() < 1e-9, "{x:?}");
    }
}
