//! eptwin's own one-node launcher: starts `n` copies of an executable with the variables
//! torchrun would give them (on 127.0.0.1 and a free port) plus `EPTWIN_LAUNCHER=spawn`,
//! forwards their output line by line with a `[pN] ` prefix, and ends the rest when one fails.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::GroupError;
use super::now;

/// Lines of each process's stderr kept for the report.
pub const STDERR_TAIL_LINES: usize = 20;

#[derive(Debug, Clone)]
pub struct SpawnOptions {
    /// After the first process fails, how long the others get to end by themselves (they see
    /// the failure through the group) before they are killed.
    pub kill_grace: Duration,
    /// Write the processes' output to this process's stdout / stderr with `[pN] ` prefixes.
    pub forward_output: bool,
    /// The one process whose stdout is forwarded as it is, without the prefix (the process
    /// that prints a run's table or JSON Lines while the others print nothing on stdout).
    pub unprefixed_stdout: Option<usize>,
}

impl Default for SpawnOptions {
    fn default() -> Self {
        SpawnOptions {
            kill_grace: Duration::from_secs(15),
            forward_output: true,
            unprefixed_stdout: None,
        }
    }
}

/// How one spawned process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessExit {
    pub process: usize,
    pub pid: u32,
    /// The exit code, `None` when a signal ended it.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The spawner killed it after another process failed.
    pub killed: bool,
    /// Its last [`STDERR_TAIL_LINES`] lines of stderr.
    pub stderr_tail: Vec<String>,
}

impl ProcessExit {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// "process 2 (pid 77) exited with code 3" / "... was killed by signal 9".
    pub fn describe(&self) -> String {
        let how = match (self.code, self.signal) {
            (Some(c), _) => format!("exited with code {c}"),
            (None, Some(s)) if self.killed => {
                format!("was killed (signal {s}) after another process failed")
            }
            (None, Some(s)) => format!("was killed by signal {s}"),
            (None, None) => "ended without an exit code".into(),
        };
        format!("process {} (pid {}) {how}", self.process, self.pid)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnReport {
    /// By process rank.
    pub exits: Vec<ProcessExit>,
    /// The rank of the first process seen to fail (by when its pipes closed), if any did.
    /// Processes that fail because another did follow it within milliseconds; under load the
    /// spawner may see one of them first, so this is the first seen, not necessarily the cause
    /// (the processes' own messages name the cause).
    pub first_failure: Option<usize>,
    pub master_port: u16,
}

impl SpawnReport {
    /// What the spawner should exit with: 0 when every process succeeded; else the first
    /// failure's code (77, "waived", passes through), or 1 when a signal ended it.
    pub fn exit_code(&self) -> i32 {
        match self.first_failure {
            None => 0,
            Some(p) => self.exits[p].code.unwrap_or(1),
        }
    }
}

/// [`spawn_with`] with the default options.
pub fn spawn(
    n: usize,
    exe: &Path,
    args: &[OsString],
    env: &[(OsString, OsString)],
) -> Result<SpawnReport, GroupError> {
    spawn_with(n, exe, args, env, &SpawnOptions::default())
}

/// A free port on the loopback interface, as the kernel hands one out. Another program could
/// take it before process 0 listens; the rendezvous then fails naming the port.
pub fn free_loopback_port() -> Result<u16, GroupError> {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| GroupError::io("finding a free port on 127.0.0.1", &e))
}

/// Starts `n` processes of `exe args` with `env` on top of this process's environment and
/// the launch variables, and waits for all of them.
pub fn spawn_with(
    n: usize,
    exe: &Path,
    args: &[OsString],
    env: &[(OsString, OsString)],
    options: &SpawnOptions,
) -> Result<SpawnReport, GroupError> {
    let port = free_loopback_port()?;
    let mut children: Vec<Running> = Vec::with_capacity(n);
    for rank in 0..n {
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("EPTWIN_LAUNCHER", "spawn")
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("GROUP_RANK", "0")
            .env("GROUP_WORLD_SIZE", "1")
            .env("ROLE_RANK", rank.to_string())
            .env("ROLE_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            // An enclosing torchrun's marker would describe its agent, not this spawner.
            .env_remove("TORCHELASTIC_USE_AGENT_STORE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for mut running in children {
                    let _ = running.child.kill();
                    let _ = running.child.wait();
                }
                return Err(GroupError::Spawn {
                    process: rank,
                    exe: exe.display().to_string(),
                    message: e.to_string(),
                });
            }
        };
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let plain = options.unprefixed_stdout == Some(rank);
        let out = child
            .stdout
            .take()
            .map(|s| forward(s, rank, false, plain, options.forward_output, None));
        let err = child.stderr.take().map(|s| {
            forward(s, rank, true, false, options.forward_output, Some(Arc::clone(&tail)))
        });
        children.push(Running { child, forwarders: [out, err], tail, exit: None, seen_at: None });
    }
    let mut failed = false;
    let mut kill_at = None;
    while children.iter().any(|c| c.exit.is_none()) {
        for running in children.iter_mut() {
            if running.exit.is_some() {
                continue;
            }
            if let Ok(Some(status)) = running.child.try_wait() {
                running.exit = Some((status, false));
                running.seen_at = Some(now());
                if !status.success() && !failed {
                    failed = true;
                    kill_at = Some(now() + options.kill_grace);
                }
            }
        }
        if let Some(at) = kill_at
            && now() >= at
        {
            for running in children.iter_mut().filter(|c| c.exit.is_none()) {
                let _ = running.child.kill();
                if let Ok(status) = running.child.wait() {
                    running.exit = Some((status, true));
                    running.seen_at = Some(now());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Several processes can end between two polls (the others fail promptly once one
    // fails): order the failures by when each process's pipes closed, which happens at its
    // exit and is seen by a blocked reader at once, not at the next poll.
    let mut ended_at = Vec::with_capacity(n);
    let exits: Vec<ProcessExit> = children
        .into_iter()
        .enumerate()
        .map(|(process, mut running)| {
            let mut closed = None;
            for handle in running.forwarders.iter_mut().filter_map(Option::take) {
                if let Ok(at) = handle.join() {
                    closed = closed.max(Some(at));
                }
            }
            ended_at.push(closed.or(running.seen_at));
            let (status, killed) = running.exit.expect("every process ended");
            let tail = running.tail.lock().map(|t| t.iter().cloned().collect()).unwrap_or_default();
            ProcessExit {
                process,
                pid: running.child.id(),
                code: status.code(),
                signal: signal_of(status),
                killed,
                stderr_tail: tail,
            }
        })
        .collect();
    let first_failure = exits
        .iter()
        .filter(|e| !e.success() && !e.killed)
        .min_by_key(|e| (ended_at[e.process], e.process))
        .map(|e| e.process);
    Ok(SpawnReport { exits, first_failure, master_port: port })
}

struct Running {
    child: Child,
    /// Each returns when its pipe closed.
    forwarders: [Option<JoinHandle<Instant>>; 2],
    tail: Arc<Mutex<VecDeque<String>>>,
    exit: Option<(ExitStatus, bool)>,
    seen_at: Option<Instant>,
}

fn signal_of(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt as _;
    status.signal()
}

/// Copies lines from a child's pipe to ours with the `[pN] ` prefix (none when `plain`), whole
/// lines at a time so processes do not interleave within a line. Returns when the pipe closed.
fn forward(
    pipe: impl Read + Send + 'static,
    rank: usize,
    is_stderr: bool,
    plain: bool,
    write: bool,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
) -> JoinHandle<Instant> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        let prefix = if plain { String::new() } else { format!("[p{rank}] ") };
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return now(),
                Ok(_) => {}
            }
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            if write {
                let mut out: Box<dyn Write> = if is_stderr {
                    Box::new(std::io::stderr().lock())
                } else {
                    Box::new(std::io::stdout().lock())
                };
                let _ = out.write_all(prefix.as_bytes());
                let _ = out.write_all(&line);
                let _ = out.flush();
            }
            if let Some(tail) = &tail
                && let Ok(mut tail) = tail.lock()
            {
                if tail.len() == STDERR_TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(String::from_utf8_lossy(&line).trim_end().to_string());
            }
        }
    })
}
