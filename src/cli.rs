//! Command-line definitions (docs/design.md, "The design contract"; subcommands and exit codes are
//! fixed).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "eptwin",
    version,
    about = "Simulation-backed test harness for DeepEP-style MoE expert-parallel communication"
)]
#[command(
    after_help = "Exit codes: 0 ok, 1 a correctness check or expectation failed, 2 bad input or usage, 77 waived (the hardware the scenario needs is not here).\nLogs go to stderr (RUST_LOG=info|debug); results to stdout."
)]
pub struct Cli {
    /// More logging on stderr (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The deterministic discrete-event simulator (any machine).
    Sim,
    /// Real GPUs (CUDA through NVRTC, NVML, ibverbs); waived (77) where absent.
    Hw,
}

/// How the hardware backend moves internode bytes (`EPTWIN_WIRE` otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WireArg {
    /// Verbs where an RDMA port is ACTIVE, else TCP.
    Auto,
    /// TCP sockets between the nodes' processes: runs anywhere; not a fabric measurement.
    Tcp,
    /// RDMA through ibverbs (build with `--features rdma`), or waived saying why not.
    Verbs,
}

impl WireArg {
    pub fn request(self) -> eptwin_wire::WireRequest {
        match self {
            WireArg::Auto => eptwin_wire::WireRequest::Auto,
            WireArg::Tcp => eptwin_wire::WireRequest::Tcp,
            WireArg::Verbs => eptwin_wire::WireRequest::Verbs,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run scenarios, print an nccl-tests-style table, write one result JSON per scenario.
    Run {
        /// Scenario files (TOML, docs/scenario.md); each runs in turn, and no two may share a
        /// `name`.
        #[arg(required = true, value_name = "SCENARIO")]
        scenarios: Vec<PathBuf>,
        /// Where the scenarios run.
        #[arg(long, value_enum, default_value = "sim")]
        backend: BackendArg,
        /// Directory for result files (`DIR/<scenario name>.json`), created if missing and
        /// checked before anything runs. A result never replaces one of another backend, and a
        /// waived result never replaces a measured one: it goes to `<name>.<backend>.json`.
        #[arg(long, default_value = "out", value_name = "DIR")]
        out: PathBuf,
        /// Print the result documents on stdout (JSON Lines) instead of the table.
        #[arg(long)]
        json: bool,
        /// Simulator: write a Chrome trace-event / Perfetto trace of the run to this file
        /// (one scenario only).
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// Hardware: how bytes between nodes move (default: `EPTWIN_WIRE`, else auto).
        #[arg(long, value_enum)]
        wire: Option<WireArg>,
        /// Hardware: start N processes of this command on this machine (eptwin's own launcher,
        /// like `torchrun --nproc-per-node N`) and exit with their verdict's code.
        #[arg(long, value_name = "N")]
        spawn: Option<usize>,
        /// Hardware: scenario ranks per process when a launcher (srun, torchrun, mpirun,
        /// --spawn) starts several; process p runs ranks p·K to p·K+K−1 (default 1).
        #[arg(long, value_name = "K")]
        ranks_per_process: Option<usize>,
    },
    /// Parse and check every DeepEP/NVSHMEM/fabric rule; errors name file:line:col.
    Validate {
        /// Scenario files (TOML, at most 16 MiB each); every error of every file is printed.
        #[arg(required = true, value_name = "SCENARIO")]
        scenarios: Vec<PathBuf>,
    },
    /// Print the `export VAR=value` lines DeepEP's `Buffer` would leave in the environment.
    Env {
        /// A scenario file.
        scenario: PathBuf,
        /// The job whose environment to print (needed when the scenario has several).
        #[arg(long, value_name = "NAME")]
        job: Option<String>,
        /// Annotate each line with who set it (user, DeepEP source line, overwritten values).
        #[arg(long)]
        explain: bool,
    },
    /// NVLink connectivity check: NVML on a GPU machine, the declared topology with a scenario.
    Topo {
        /// A scenario file: check its declared topology (without one: the GPUs here, NVML).
        scenario: Option<PathBuf>,
        /// Bypass the check (eptwin's switch; DeepEP itself has none).
        #[arg(long)]
        disable_nvlink: bool,
        /// Probe the real GPUs through NVML even when a scenario is given.
        #[arg(long)]
        hw: bool,
    },
    /// Run on the simulator and the hardware (or read measured results), write both results
    /// and the comparison, and print a table of the differences.
    Compare {
        /// Scenario files; no two may share a `name`.
        #[arg(required = true, value_name = "SCENARIO")]
        scenarios: Vec<PathBuf>,
        /// Directory for `<scenario>.sim.json`, `<scenario>.hw.json`, `<scenario>.compare.json`
        /// (created if missing, checked before anything runs).
        #[arg(long, default_value = "out", value_name = "DIR")]
        out: PathBuf,
        /// Compare against previously measured result files or directories (e.g.
        /// `results/h200/`) instead of running the hardware here.
        #[arg(long, num_args = 1.., value_name = "RESULT|DIR")]
        measured: Vec<PathBuf>,
        /// Fail (exit 1) when |simulated − measured| / measured exceeds PCT on any op's mean
        /// latency (a finite percentage ≥ 0).
        #[arg(long, value_name = "PCT", value_parser = parse_tolerance)]
        tolerance: Option<f64>,
        /// Compare with measurements on this GPU too (e.g. "NVIDIA H100"), besides the one the
        /// scenario's profile models; may be given several times.
        #[arg(long, value_name = "GPU")]
        allow_other_gpu: Vec<String>,
        /// Compare with measurements of another scenario text of the same name too (e.g. the
        /// scenario now names the profile `eptwin calibrate` wrote; the runs named the base
        /// profile). The table notes each such pair.
        #[arg(long)]
        allow_other_text: bool,
        /// Print the comparison documents (JSON Lines) instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Charts (PNG + SVG) and an index.html from result files, sweep indexes and simulator
    /// traces (files or directories).
    Report {
        /// Result files, sweep indexes, simulator traces, or directories holding them
        /// (searched recursively); other eptwin documents among them, such as comparisons,
        /// are skipped.
        #[arg(required = true, value_name = "RESULT|DIR")]
        results: Vec<PathBuf>,
        /// Directory for the charts (PNG + SVG) and index.html.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Print what was written and skipped as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Parameter sweep on all cores, shardable for batch schedulers: one result per point
    /// plus an index that `eptwin report` plots.
    Sweep {
        /// The scenario file whose keys are varied.
        scenario: PathBuf,
        /// KEY=V1,V2,... (several make a grid). KEY is a scenario key path such as
        /// `job.env.NVSHMEM_QP_DEPTH`, `job[0].buffer.num_qps_per_rank`,
        /// `job[decode].workload.tokens_per_rank` or `cluster.nodes`.
        #[arg(long = "set", required = true, value_name = "KEY=V1,V2,...")]
        sets: Vec<String>,
        /// Run only shard K of N (0-based: the points whose index ≡ K mod N). Defaults from
        /// SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT (minus SLURM_ARRAY_TASK_MIN).
        #[arg(long, value_name = "K/N")]
        shard: Option<String>,
        /// Directory for the points and the index (default: out/sweep-<scenario name>).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Where the points run.
        #[arg(long, value_enum, default_value = "sim")]
        backend: BackendArg,
        /// Worker threads (default: SLURM_CPUS_PER_TASK, else all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Print the sweep index on stdout instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// A node's preflight for DeepEP (V1 and V2): each check says ok / warn / fail / skip, what
    /// it saw, why it matters, the issue it prevents and the fix (docs/doctor.md). Exit 1 when
    /// a check fails.
    Doctor {
        /// Check the node against this scenario: its jobs' ranks, NICs, QPs and environment.
        scenario: Option<PathBuf>,
        /// Print the report as JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Diagnose a recorded node (a directory of fixture files, docs/doctor.md) instead of
        /// this one.
        #[arg(long, value_name = "DIR")]
        node: Option<PathBuf>,
        /// Start N processes of this command on this machine, as a launcher would: the first
        /// process on each host runs the checks and process 0 prints every node's report.
        #[arg(long, value_name = "N", conflicts_with = "node")]
        spawn: Option<usize>,
    },
    /// Replay a scenario with DeepEP's own test scripts: their launch lines out, their
    /// printed numbers back in as a result document (docs/deepep-replay.md).
    Deepep {
        #[command(subcommand)]
        command: DeepepCommand,
    },
    /// Probe this GPU machine and write a hardware profile with the source of every value;
    /// what is not measured here comes from a base profile (docs/calibration.md). Waived (77)
    /// without a GPU.
    Calibrate {
        /// Where the probes run (the hardware; `--from` reads earlier results instead).
        #[arg(long, value_enum, default_value = "hw")]
        backend: BackendArg,
        /// The profile the keys not measured come from: a bundled name or a profile file
        /// (default: the bundled profile of this GPU's kind, h100-cx7 or h200-cx7).
        #[arg(long, value_name = "PROFILE")]
        base: Option<String>,
        /// The profile file to write.
        #[arg(long, default_value = "calibrated.toml", value_name = "FILE")]
        out: PathBuf,
        /// The profile's `name` (default: the file name without .toml).
        #[arg(long)]
        name: Option<String>,
        /// Take the probes from these hardware results (JSON) or `eptwin run` logs instead of
        /// probing here (re-generating a profile from committed measurements).
        #[arg(long, value_name = "FILE")]
        from: Vec<PathBuf>,
        /// Run DeepEP's low-latency test at one rank over a sweep of shapes with this DeepEP
        /// checkout (`<dir>/tests/test_low_latency.py`, or scripts/deepep-one-rank.py put
        /// there) and fit the DeepEP model's GPU costs to it.
        #[arg(long, value_name = "DIR")]
        deepep_dir: Option<String>,
        /// Fit the DeepEP model's GPU costs to one-rank runs already made (the folders the
        /// sweep leaves: `<shape>/deepep-one-rank-<shape>{,-hook}.deepep.json`, routing.json).
        #[arg(long, value_name = "DIR")]
        deepep_runs: Option<PathBuf>,
        /// The Python that imports `deep_ep`.
        #[arg(long, default_value = "python3")]
        python: String,
        /// Time limit of each one-rank DeepEP run, seconds.
        #[arg(long, default_value_t = 300)]
        deepep_timeout_s: u64,
        /// Time for the whole one-rank sweep, seconds: the shapes not started within it are
        /// left out (the sweep runs the most telling first).
        #[arg(long, value_name = "S")]
        deepep_budget_s: Option<u64>,
        /// Probe nothing: only fit the DeepEP costs to the one-rank runs on the base profile as
        /// it is (a profile of a machine whose GPU ran them elsewhere).
        #[arg(long)]
        deepep_only: bool,
        /// Probe only the NIC (no GPU needed): RDMA WRITE latency, bandwidth and message rate on
        /// this machine's ACTIVE ibverbs port (a build with --features rdma), into the base
        /// profile's NIC keys. Waived (77) without an ACTIVE port.
        #[arg(long, conflicts_with_all = ["deepep_only", "from"])]
        nic_only: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum DeepepCommand {
    /// Print, for every node, the command line and environment that run DeepEP's matching
    /// test script with the scenario's workload. Where the scripts cannot do what the scenario
    /// asks, print one line per reason and exit 2.
    Launch {
        /// The scenario to replay.
        scenario: PathBuf,
        /// The DeepEP checkout whose tests/ holds the scripts (as seen from the nodes).
        #[arg(long, default_value = "DeepEP", value_name = "PATH")]
        deepep_dir: String,
        /// Take the node rank from $SLURM_NODEID and the master from the first host of
        /// $SLURM_JOB_NODELIST (one block for every node, run inside an allocation).
        #[arg(long)]
        nodes_from_slurm: bool,
        /// `shell`: command lines; `slurm`: a ready sbatch script (nodes from Slurm).
        #[arg(long, value_enum, default_value = "shell")]
        format: LaunchFormatArg,
    },
    /// Read the scripts' logs (every node's; ranks may interleave) into a result document
    /// (`backend.kind = "deepep"`) for `eptwin compare --measured` and `eptwin report`.
    Import {
        /// DeepEP's test logs, one per node (or one with every node's lines).
        #[arg(required = true, value_name = "LOG")]
        logs: Vec<PathBuf>,
        /// The scenario the logs replay.
        #[arg(long)]
        scenario: PathBuf,
        /// The GPU the scripts ran on, as NVML names it (e.g. "NVIDIA H800"): their logs name
        /// none, and `compare` pairs a measurement only with a scenario whose profile models
        /// its GPU. Recorded as `backend.gpus` ("16 x NVIDIA H800").
        #[arg(long, value_name = "GPU")]
        gpu: String,
        /// Directory for `<scenario name>.deepep.json`.
        #[arg(long)]
        out: PathBuf,
        /// Print the result document on stdout instead of the table.
        #[arg(long)]
        json: bool,
    },
}

/// `--tolerance`: a finite percentage ≥ 0 (NaN or ∞ would pass everything, a negative one
/// nothing).
fn parse_tolerance(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Ok(v) => Err(format!("{v} is not a finite percentage ≥ 0")),
        Err(_) => Err(format!("{text:?} is not a number")),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LaunchFormatArg {
    Shell,
    Slurm,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `--help` describes every positional argument and option of every subcommand, nested
    /// ones (`deepep launch`) included.
    #[test]
    fn tolerances_are_finite_percentages() {
        assert_eq!(super::parse_tolerance("5"), Ok(5.0));
        assert_eq!(super::parse_tolerance("0"), Ok(0.0));
        for bad in ["nan", "inf", "-inf", "-1", "five", ""] {
            assert!(super::parse_tolerance(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for sub in cmd.get_subcommands() {
                let name = format!("{path}{}", sub.get_name());
                for arg in sub.get_arguments() {
                    let id = arg.get_id().as_str();
                    if id != "help" && id != "version" && arg.get_help().is_none() {
                        missing.push(format!("{name} {id}"));
                    }
                }
                if sub.get_about().is_none() {
                    missing.push(format!("{name} (about)"));
                }
                walk(sub, &format!("{name} "), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:?}");
    }
}
