//! [`ProcessGroup`]: collectives through process 0 (a star), heartbeats, failure propagation
//! and the exit watchdog. One reader thread per connection turns frames into events for the
//! calling thread and notices a peer that closes, stops answering or aborts; one keeper thread
//! sends heartbeats and ends the process when a failure is left unattended.

use std::collections::VecDeque;
use std::io::{ErrorKind, Write as _};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

mod collectives;

use crate::error::{Failure, GroupError, PeerId};
use crate::frames::{Data, Msg, Op, decode_list, encode_list, read_msg, write_msg};
use crate::launch::{EnvLookup, LaunchInfo};
use crate::now;
use crate::rendezvous::{self, Arrival};

/// The group's time bounds. `Default`: rendezvous 120 s, heartbeats every 1 s, a peer silent
/// for 10 s is dead, an unattended failure ends the process after 5 s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeouts {
    /// How long process 0 waits for everyone, and the others for process 0.
    pub rendezvous: Duration,
    pub heartbeat_interval: Duration,
    /// A peer that sent nothing (not even a heartbeat) for this long is declared dead.
    pub peer_silent: Duration,
    /// When a failure arrives and the calling thread has not come back to the group within
    /// this grace (it may be blocked in a GPU wait), the keeper thread prints the failure and
    /// exits the process with [`EXIT_CODE_ABANDONED`]. `None`: never exit.
    pub exit_grace: Option<Duration>,
}

/// How long a process other than 0 waits past a collective's timeout for process 0's verdict.
const LEAF_VERDICT_MARGIN: Duration = Duration::from_secs(1);

/// The exit code of a process the keeper thread ends: 1, "a check or expectation failed",
/// as the binary's own failures (the exit codes of docs/design.md).
pub const EXIT_CODE_ABANDONED: i32 = 1;

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            rendezvous: Duration::from_secs(120),
            heartbeat_interval: Duration::from_secs(1),
            peer_silent: Duration::from_secs(10),
            exit_grace: Some(Duration::from_secs(5)),
        }
    }
}

impl Timeouts {
    /// Defaults, replaced by `EPTWIN_RENDEZVOUS_TIMEOUT_S`, `EPTWIN_PEER_TIMEOUT_S` and
    /// `EPTWIN_ABORT_GRACE_S` (0: never exit) where set; seconds may be fractional.
    pub fn from_env(env: EnvLookup<'_>) -> Result<Self, GroupError> {
        let seconds = |name: &str| -> Result<Option<Duration>, GroupError> {
            env(name)
                .map(|v| {
                    v.trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|s| s.is_finite() && *s >= 0.0)
                        .map(Duration::from_secs_f64)
                        .ok_or_else(|| {
                            GroupError::Launch(format!("{name}={v:?} is not a number of seconds"))
                        })
                })
                .transpose()
        };
        let mut t = Timeouts::default();
        if let Some(d) = seconds("EPTWIN_RENDEZVOUS_TIMEOUT_S")? {
            t.rendezvous = d;
        }
        if let Some(d) = seconds("EPTWIN_PEER_TIMEOUT_S")? {
            t.peer_silent = d;
            t.heartbeat_interval = t.heartbeat_interval.min(d / 4);
        }
        if let Some(d) = seconds("EPTWIN_ABORT_GRACE_S")? {
            t.exit_grace = (!d.is_zero()).then_some(d);
        }
        t.check()?;
        Ok(t)
    }

    fn check(&self) -> Result<(), GroupError> {
        if self.heartbeat_interval.is_zero() || self.peer_silent < self.heartbeat_interval * 2 {
            return Err(GroupError::Usage(format!(
                "a peer is declared dead after {:?} of silence, which must be at least twice the \
                 heartbeat interval ({:?})",
                self.peer_silent, self.heartbeat_interval
            )));
        }
        Ok(())
    }
}

/// Everything a process brings to [`ProcessGroup::join`].
#[derive(Debug, Clone)]
pub struct GroupConfig {
    pub launch: LaunchInfo,
    /// sha256 of the scenario text, and of its routing files when it replays any
    /// (`Plan::inputs_sha256`): every process must run the same ones.
    pub scenario_sha256: String,
    /// Every process must run the same eptwin; [`eptwin_engine::VERSION`] in the binary.
    pub eptwin_version: String,
    pub timeouts: Timeouts,
}

enum Event {
    Data {
        from: usize,
        data: Data,
    },
    Bye {
        from: usize,
    },
    /// A failure was recorded in `Shared`.
    Failed,
}

struct Conn {
    peer: PeerId,
    writer: Mutex<TcpStream>,
}

impl Conn {
    fn send(&self, msg: &Msg) -> std::io::Result<()> {
        write_msg(&mut *lock(&self.writer), msg)
    }

    fn shutdown(&self, how: Shutdown) {
        let _ = lock(&self.writer).shutdown(how);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A thread that panicked while holding a lock leaves plain data behind: keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Default)]
struct FailureState {
    failure: Option<Failure>,
    since: Option<Instant>,
    /// The calling thread has seen the failure (a group call returned it): it decides when
    /// the process ends, not the keeper.
    taken: bool,
}

struct Shared {
    me: PeerId,
    /// By rank; process 0 holds every other process, the others only process 0.
    conns: Vec<Option<Arc<Conn>>>,
    failure: Mutex<FailureState>,
    /// "during `<label>`" / "after `<label>`", for failures noticed in the background.
    phase: Mutex<String>,
    events: Mutex<Sender<Event>>,
    /// The group finished normally: connections ending now are no failure.
    closing: AtomicBool,
    stop: AtomicBool,
    timeouts: Timeouts,
}

impl Shared {
    fn when(&self) -> String {
        lock(&self.phase).clone()
    }

    /// Records the first failure and passes it on: to every connection but the one it came
    /// from (`origin`), so process 0 relays a failure to everyone.
    fn fail(&self, failure: Failure, origin: Option<usize>) {
        {
            let mut state = lock(&self.failure);
            if self.closing.load(Ordering::SeqCst) || state.failure.is_some() {
                return;
            }
            state.failure = Some(failure.clone());
            state.since = Some(now());
        }
        let msg = Msg::Abort(failure);
        for (rank, conn) in self.conns.iter().enumerate() {
            if let Some(conn) = conn
                && Some(rank) != origin
            {
                let _ = conn.send(&msg);
            }
        }
        let _ = lock(&self.events).send(Event::Failed);
    }

    fn recorded(&self) -> Option<Failure> {
        lock(&self.failure).failure.clone()
    }
}

/// A group of processes running one scenario together. Every process makes the same
/// collective calls in the same order; each call names itself (`label`, used in messages) and
/// is bounded by a timeout. The first failure anywhere ends the group for everyone: every
/// later call returns it.
pub struct ProcessGroup {
    shared: Arc<Shared>,
    members: Vec<PeerId>,
    events: Option<Receiver<Event>>,
    /// Frames that arrived ahead of the collective that consumes them, per sending rank.
    pending: Vec<VecDeque<Data>>,
    byes: Vec<bool>,
    seq: u64,
    finished: bool,
}

impl ProcessGroup {
    /// Meets the other processes at the launcher's address (no rendezvous for one process).
    pub fn join(config: &GroupConfig) -> Result<ProcessGroup, GroupError> {
        config.timeouts.check()?;
        let launch = &config.launch;
        let me = PeerId::known(launch.process_rank, &launch.host, std::process::id());
        let count = launch.process_count;
        let (tx, rx) = mpsc::channel();
        let mut conns: Vec<Option<Arc<Conn>>> = (0..count).map(|_| None).collect();
        let mut members = vec![me.clone()];
        let mut streams = Vec::new();
        if count > 1 {
            let master = launch.master.as_ref().ok_or_else(|| {
                GroupError::Usage(format!(
                    "a group of {count} processes needs a rendezvous address (launcher {})",
                    launch.launcher
                ))
            })?;
            let arrival = Arrival {
                me: me.clone(),
                count,
                master,
                eptwin_version: &config.eptwin_version,
                scenario_sha256: &config.scenario_sha256,
                timeout: config.timeouts.rendezvous,
            };
            if launch.process_rank == 0 {
                let peers = rendezvous::host(&arrival)?;
                members = (0..count)
                    .map(|r| peers[r].as_ref().map_or_else(|| me.clone(), |(p, _)| p.clone()))
                    .collect();
                for (rank, slot) in peers.into_iter().enumerate() {
                    if let Some((peer, stream)) = slot {
                        streams.push((rank, peer, stream));
                    }
                }
            } else {
                let (stream, all) = rendezvous::join(&arrival)?;
                streams.push((0, all[0].clone(), stream));
                members = all;
            }
        }
        let mut readers = Vec::new();
        for (rank, peer, stream) in streams {
            let io =
                |e: std::io::Error| GroupError::io(format!("configuring the socket to {peer}"), &e);
            stream.set_nodelay(true).map_err(io)?;
            stream.set_read_timeout(Some(config.timeouts.peer_silent)).map_err(io)?;
            stream.set_write_timeout(Some(config.timeouts.peer_silent)).map_err(io)?;
            let reader = stream.try_clone().map_err(io)?;
            conns[rank] = Some(Arc::new(Conn { peer: peer.clone(), writer: Mutex::new(stream) }));
            readers.push((rank, peer, reader));
        }
        let shared = Arc::new(Shared {
            me: me.clone(),
            conns,
            failure: Mutex::new(FailureState::default()),
            phase: Mutex::new("after the rendezvous".into()),
            events: Mutex::new(tx.clone()),
            closing: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            timeouts: config.timeouts.clone(),
        });
        for (rank, peer, reader) in readers {
            let shared = Arc::clone(&shared);
            let tx = tx.clone();
            std::thread::Builder::new()
                .name(format!("eptwin-group-read-{rank}"))
                .spawn(move || read_loop(&shared, rank, &peer, reader, &tx))
                .map_err(|e| GroupError::io("starting a reader thread", &e))?;
        }
        if count > 1 {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("eptwin-group-keeper".into())
                .spawn(move || keeper_loop(&shared))
                .map_err(|e| GroupError::io("starting the keeper thread", &e))?;
        }
        Ok(ProcessGroup {
            shared,
            members,
            events: Some(rx),
            pending: (0..count).map(|_| VecDeque::new()).collect(),
            byes: vec![false; count],
            seq: 0,
            finished: false,
        })
    }

    pub fn rank(&self) -> usize {
        self.shared.me.rank
    }

    pub fn count(&self) -> usize {
        self.members.len()
    }

    /// Every member by rank, with host and pid.
    pub fn members(&self) -> &[PeerId] {
        &self.members
    }

    /// The failure that ended the group, if one did.
    pub fn failure(&self) -> Option<Failure> {
        self.shared.recorded()
    }

    /// A handle that tells, from anywhere in this process, whether the group has failed: a
    /// wait outside the group (a GPU stream) polls it to end early instead of running into
    /// its own bound.
    pub fn watch(&self) -> GroupWatch {
        GroupWatch { shared: Arc::clone(&self.shared) }
    }

    /// Ends the run for every process with `reason` (they fail with "process N on H (pid P)
    /// aborted the run: reason"). Returns the failure this process now reports.
    pub fn abort(&self, reason: &str) -> GroupError {
        self.fail_here(Failure {
            peer: self.shared.me.clone(),
            what: format!("aborted the run: {reason}"),
            when: self.shared.when(),
        })
    }

    /// Records a failure noticed by this process's calling thread, tells everyone, and
    /// returns the group's failure (the first one, which may be another's).
    fn fail_here(&self, failure: Failure) -> GroupError {
        self.shared.fail(failure, None);
        self.taken()
    }

    /// The recorded failure, marked as seen by the calling thread.
    fn taken(&self) -> GroupError {
        let mut state = lock(&self.shared.failure);
        state.taken = true;
        let failure = state.failure.clone().expect("a failure was recorded");
        GroupError::Peer(failure)
    }

    fn check_failed(&self) -> Result<(), GroupError> {
        if self.shared.recorded().is_some() { Err(self.taken()) } else { Ok(()) }
    }

    /// Leaves the group after a last barrier, so no process mistakes another's normal exit
    /// for a failure. Dropping a group without finishing aborts the run for the others.
    pub fn finish(mut self, timeout: Duration) -> Result<(), GroupError> {
        let deadline = now() + timeout;
        self.collective(Op::Barrier, 0, "finish", &[], timeout)?;
        self.shared.closing.store(true, Ordering::SeqCst);
        self.finished = true;
        for conn in self.shared.conns.iter().flatten() {
            let _ = conn.send(&Msg::Bye);
        }
        // Process 0 leaves last: its exit must not cut off a reply still on its way.
        if self.rank() == 0 {
            while self.byes.iter().skip(1).any(|b| !b) && now() < deadline {
                let left = deadline.saturating_duration_since(now());
                match self.events.as_ref().expect("events").recv_timeout(left) {
                    Ok(Event::Bye { from }) => self.byes[from] = true,
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
        Ok(())
    }
}

/// See [`ProcessGroup::watch`]. Reading it does not count as the calling thread having seen
/// the failure: the next group call still returns it.
#[derive(Clone)]
pub struct GroupWatch {
    shared: Arc<Shared>,
}

impl GroupWatch {
    pub fn failure(&self) -> Option<Failure> {
        self.shared.recorded()
    }
}

impl std::fmt::Debug for GroupWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupWatch({})", self.shared.me)
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if !self.finished && self.count() > 1 && self.shared.recorded().is_none() {
            let reason = if std::thread::panicking() {
                "left the group without finishing: its thread panicked"
            } else {
                "left the group without finishing (its run ended early)"
            };
            self.shared.fail(
                Failure {
                    peer: self.shared.me.clone(),
                    what: reason.into(),
                    when: self.shared.when(),
                },
                None,
            );
        }
        self.shared.closing.store(true, Ordering::SeqCst);
        self.shared.stop.store(true, Ordering::SeqCst);
        for conn in self.shared.conns.iter().flatten() {
            conn.shutdown(Shutdown::Both);
        }
        self.events.take();
    }
}

fn read_loop(
    shared: &Shared,
    rank: usize,
    peer: &PeerId,
    mut stream: TcpStream,
    tx: &Sender<Event>,
) {
    let mut bye = false;
    loop {
        let msg = read_msg(&mut stream);
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        match msg {
            Ok(Msg::Heartbeat) => {}
            Ok(Msg::Data(data)) => {
                let _ = tx.send(Event::Data { from: rank, data });
            }
            Ok(Msg::Abort(failure)) => shared.fail(failure, Some(rank)),
            Ok(Msg::Bye) => {
                bye = true;
                let _ = tx.send(Event::Bye { from: rank });
            }
            Ok(other) => {
                shared.fail(
                    Failure {
                        peer: peer.clone(),
                        what: format!("sent an unexpected {other:?} after the rendezvous"),
                        when: shared.when(),
                    },
                    Some(rank),
                );
                return;
            }
            Err(e) => {
                if bye || shared.closing.load(Ordering::SeqCst) {
                    let _ = tx.send(Event::Bye { from: rank });
                    return;
                }
                let silent = shared.timeouts.peer_silent.as_secs_f64();
                let what = match e.kind() {
                    ErrorKind::UnexpectedEof
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe => "closed its connection".to_string(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut => format!(
                        "sent nothing for {silent:.1} s (heartbeats every {:.1} s): it is \
                         stopped, hung or unreachable",
                        shared.timeouts.heartbeat_interval.as_secs_f64()
                    ),
                    ErrorKind::InvalidData => format!("sent a malformed frame ({e})"),
                    _ => format!("could not be read from ({e})"),
                };
                shared.fail(Failure { peer: peer.clone(), what, when: shared.when() }, Some(rank));
                return;
            }
        }
    }
}

/// Heartbeats, and the exit of a process whose calling thread left a failure unattended.
fn keeper_loop(shared: &Shared) {
    let tick = shared.timeouts.heartbeat_interval.min(Duration::from_millis(50));
    let mut next_beat = now();
    while !shared.stop.load(Ordering::SeqCst) {
        let t = now();
        if t >= next_beat {
            for conn in shared.conns.iter().flatten() {
                let _ = conn.send(&Msg::Heartbeat);
            }
            next_beat = t + shared.timeouts.heartbeat_interval;
        }
        if let Some(grace) = shared.timeouts.exit_grace {
            let state = lock(&shared.failure);
            if let (Some(failure), Some(since)) = (&state.failure, state.since)
                && !state.taken
                && !shared.closing.load(Ordering::SeqCst)
                && t.saturating_duration_since(since) >= grace
            {
                let mut err = std::io::stderr().lock();
                let _ = writeln!(
                    err,
                    "eptwin: {failure}; {} did not come back to the process group within {:.1} s \
                     (its thread may be blocked in a GPU wait): exiting with code \
                     {EXIT_CODE_ABANDONED}",
                    shared.me,
                    grace.as_secs_f64()
                );
                let _ = err.flush();
                std::process::exit(EXIT_CODE_ABANDONED);
            }
        }
        std::thread::sleep(tick);
    }
}

#[cfg(test)]
mod tests {
    //! Processes as threads of this test process (the keeper never exits here); the real
    //! multi-process behaviour is tested in tests/group.rs.
    use super::*;
    use crate::launch::{Launcher, MasterAddr};
    use crate::spawn::free_loopback_port;

    const T: Duration = Duration::from_secs(5);

    fn config(rank: usize, count: usize, port: u16) -> GroupConfig {
        GroupConfig {
            launch: LaunchInfo {
                launcher: Launcher::Spawn,
                process_rank: rank,
                process_count: count,
                local_rank: rank,
                local_count: count,
                node_rank: Some(0),
                host: format!("host{rank}"),
                master: Some(MasterAddr { host: "127.0.0.1".into(), port, origin: "test".into() }),
            },
            scenario_sha256: "feed".into(),
            eptwin_version: "1.0".into(),
            timeouts: Timeouts {
                rendezvous: Duration::from_secs(5),
                heartbeat_interval: Duration::from_millis(100),
                peer_silent: Duration::from_secs(2),
                exit_grace: None,
            },
        }
    }

    /// Runs `body` as `count` group members on threads; results by rank.
    fn with_group<R: Send + 'static>(
        count: usize,
        adjust: impl Fn(&mut GroupConfig) + Sync,
        body: impl Fn(&mut ProcessGroup) -> Result<R, GroupError> + Sync,
    ) -> Vec<Result<R, GroupError>> {
        let port = free_loopback_port().unwrap();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..count)
                .map(|rank| {
                    let (adjust, body) = (&adjust, &body);
                    s.spawn(move || {
                        let mut cfg = config(rank, count, port);
                        adjust(&mut cfg);
                        let mut group = ProcessGroup::join(&cfg)?;
                        let out = body(&mut group)?;
                        group.finish(T)?;
                        Ok(out)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn collectives_give_every_process_the_right_bytes() {
        let results = with_group(
            3,
            |_| {},
            |g| {
                let me = g.rank() as u8;
                let all = g.all_gather("all", &[me, me * 10], T)?;
                assert_eq!(all, vec![vec![0, 0], vec![1, 10], vec![2, 20]]);
                let b = g.broadcast("from 2", 2, &[me; 3], T)?;
                assert_eq!(b, vec![2, 2, 2]);
                let b = g.broadcast("from 0", 0, &[me + 7], T)?;
                assert_eq!(b, vec![7]);
                let gathered = g.gather_to("to 1", 1, &[me], T)?;
                assert_eq!(gathered, (me == 1).then(|| vec![vec![0], vec![1], vec![2]]));
                let gathered = g.gather_to("to 0", 0, &[me, me], T)?;
                assert_eq!(gathered.is_some(), me == 0);
                g.barrier("barrier", T)?;
                let names = g.all_gather_json("names", &format!("p{me}"), T)?;
                assert_eq!(names, ["p0", "p1", "p2"]);
                let value = (me == 1).then_some(vec![1u32, 2, 3]);
                let v: Vec<u32> = g.broadcast_json("json", 1, value.as_ref(), T)?;
                assert_eq!(v, [1, 2, 3]);
                let at0 = g.gather_json("json gather", 0, &u64::from(me), T)?;
                assert_eq!(at0, (me == 0).then(|| vec![0u64, 1, 2]));
                assert_eq!(g.members()[2].host.as_deref(), Some("host2"));
                Ok(g.count())
            },
        );
        for r in results {
            assert_eq!(r.unwrap(), 3);
        }
    }

    #[test]
    fn a_single_process_group_needs_no_network() {
        let mut cfg = config(0, 1, 1);
        cfg.launch.master = None;
        let mut g = ProcessGroup::join(&cfg).unwrap();
        assert_eq!(g.all_gather("a", b"x", T).unwrap(), vec![b"x".to_vec()]);
        assert_eq!(g.broadcast("b", 0, b"y", T).unwrap(), b"y");
        assert_eq!(g.gather_to("c", 0, b"z", T).unwrap(), Some(vec![b"z".to_vec()]));
        let e = g.broadcast("d", 1, b"", T).unwrap_err().to_string();
        assert!(e.contains("root 1 is outside the group of 1"), "{e}");
        g.finish(T).unwrap();
    }

    #[test]
    fn different_collectives_end_the_group_for_everyone() {
        let results = with_group(
            3,
            |_| {},
            |g| {
                if g.rank() == 1 {
                    g.barrier("b", T)
                } else {
                    g.all_gather("a", &[], T).map(|_| ())
                }
            },
        );
        for r in results {
            let e = r.unwrap_err().to_string();
            assert!(e.starts_with("process 1 on host1 (pid "), "{e}");
            assert!(e.contains("is in barrier `b`"), "{e}");
            assert!(e.contains("every process must make the same collective calls"), "{e}");
        }
    }

    #[test]
    fn abort_reaches_every_process() {
        let results = with_group(
            4,
            |_| {},
            |g| {
                g.barrier("first", T)?;
                if g.rank() == 2 {
                    return Err(g.abort("rank 2's check failed"));
                }
                g.barrier("second", T)
            },
        );
        for r in results {
            let e = r.unwrap_err().to_string();
            assert!(e.starts_with("process 2 on host2 (pid "), "{e}");
            assert!(e.contains("aborted the run: rank 2's check failed after `first`"), "{e}");
        }
    }

    #[test]
    fn a_watch_sees_a_failure_that_the_next_call_still_returns() {
        let results = with_group(
            2,
            |_| {},
            |g| {
                let watch = g.watch();
                assert_eq!(watch.failure(), None);
                g.barrier("first", T)?;
                if g.rank() == 1 {
                    return Err::<(), _>(g.abort("stop"));
                }
                // Process 0 is elsewhere (a GPU wait): the watch sees process 1's abort.
                let deadline = now() + T;
                while watch.failure().is_none() {
                    assert!(now() < deadline, "the abort never arrived");
                    std::thread::sleep(Duration::from_millis(5));
                }
                let seen = watch.failure().unwrap();
                let e = g.barrier("second", T).unwrap_err();
                assert_eq!(e, GroupError::Peer(seen));
                Err(e)
            },
        );
        for r in results {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("aborted the run: stop after `first`"), "{e}");
        }
    }

    #[test]
    fn a_late_process_fails_the_collective_within_its_timeout() {
        let started = now();
        let results = with_group(
            3,
            |_| {},
            |g| {
                if g.rank() == 2 {
                    std::thread::sleep(Duration::from_millis(1500));
                }
                g.barrier("quick", Duration::from_millis(300))
            },
        );
        assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
        for r in &results {
            let e = r.as_ref().unwrap_err().to_string();
            assert!(e.starts_with("process 2 on host2"), "{e}");
            assert!(e.contains("did not reach `quick` within 300 ms during `quick`"), "{e}");
        }
    }

    #[test]
    fn refused_hellos_name_the_process() {
        let results = with_group(
            3,
            |c| {
                if c.launch.process_rank == 1 {
                    c.eptwin_version = "2.0".into();
                }
            },
            |_| Ok(()),
        );
        for r in results {
            let e = r.unwrap_err().to_string();
            assert!(e.starts_with("process 1 on host1 (pid "), "{e}");
            assert!(e.contains("runs eptwin 2.0 but process 0 on host0"), "{e}");
        }
        let results = with_group(
            2,
            |c| {
                if c.launch.process_rank == 1 {
                    c.scenario_sha256 = "beef".into();
                }
            },
            |_| Ok(()),
        );
        for r in results {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("read a scenario with sha256 beef but process 0"), "{e}");
        }
    }

    #[test]
    fn timeouts_from_the_environment() {
        let env = |k: &str| match k {
            "EPTWIN_RENDEZVOUS_TIMEOUT_S" => Some("2.5".to_string()),
            "EPTWIN_PEER_TIMEOUT_S" => Some("2".to_string()),
            "EPTWIN_ABORT_GRACE_S" => Some("0".to_string()),
            _ => None,
        };
        let t = Timeouts::from_env(&env).unwrap();
        assert_eq!(t.rendezvous, Duration::from_millis(2500));
        assert_eq!(
            (t.peer_silent, t.heartbeat_interval),
            (Duration::from_secs(2), Duration::from_millis(500))
        );
        assert_eq!(t.exit_grace, None);
        let bad = |k: &str| (k == "EPTWIN_PEER_TIMEOUT_S").then(|| "soon".to_string());
        assert!(
            Timeouts::from_env(&bad)
                .unwrap_err()
                .to_string()
                .contains("EPTWIN_PEER_TIMEOUT_S=\"soon\"")
        );
    }
}
