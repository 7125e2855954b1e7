//! Meeting at `MASTER_ADDR:port`: process 0 listens and checks every hello (same eptwin
//! version, same scenario, the expected process count, no rank twice); the others connect,
//! retrying until the deadline because processes start in any order.

use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::error::{Failure, GroupError, PeerId};
use super::frames::{Hello, MAGIC, Msg, read_msg, write_msg};
use super::launch::MasterAddr;
use super::now;

/// How long process 0 waits for an accepted connection's hello before dropping it (a port
/// scanner or a stray client must not hold the rendezvous).
const HELLO_WAIT: Duration = Duration::from_secs(5);
/// Pause between connection attempts while process 0 is not listening yet.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// A process waits this much beyond process 0's announced deadline for its verdict.
const VERDICT_MARGIN: Duration = Duration::from_secs(2);
/// After a failed rendezvous, process 0 keeps answering connections with the failure this
/// long: closing the listener would reset the connections still in its backlog, and their
/// processes would report a reset instead of the reason.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// What one process brings to the rendezvous.
pub struct Arrival<'a> {
    pub me: PeerId,
    pub count: usize,
    pub master: &'a MasterAddr,
    pub eptwin_version: &'a str,
    pub scenario_sha256: &'a str,
    pub timeout: Duration,
}

impl Arrival<'_> {
    fn when(&self) -> String {
        format!("during the rendezvous at {}", self.master)
    }

    fn failure(&self, peer: PeerId, what: String) -> GroupError {
        GroupError::Peer(Failure { peer, what, when: self.when() })
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Process 0: returns one stream per other process, by rank (index 0 is `None`).
pub fn host(arrival: &Arrival<'_>) -> Result<Vec<Option<(PeerId, TcpStream)>>, GroupError> {
    let master = arrival.master;
    let wildcard = match (master.host.as_str(), master.port).to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<SocketAddr> = addrs.collect();
            if !addrs.is_empty() && addrs.iter().all(SocketAddr::is_ipv6) {
                "[::]"
            } else {
                "0.0.0.0"
            }
        }
        Err(_) => "0.0.0.0",
    };
    let listener = TcpListener::bind((wildcard, master.port))
        .or_else(|_| TcpListener::bind(format!("{wildcard}:{}", master.port)))
        .map_err(|e| {
            GroupError::io(
                format!(
                    "process 0 cannot listen on port {} ({}); choose another port with \
                     EPTWIN_MASTER_PORT",
                    master.port, master.origin
                ),
                &e,
            )
        })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| GroupError::io("making the listener non-blocking", &e))?;
    let deadline = now() + arrival.timeout;
    let mut peers: Vec<Option<(PeerId, TcpStream)>> = (0..arrival.count).map(|_| None).collect();
    let mut arrived = 1;
    while arrived < arrival.count {
        let (mut stream, from) = match listener.accept() {
            Ok(pair) => pair,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                if now() >= deadline {
                    let err = missing_failure(arrival, &peers);
                    refuse_all(&mut peers, &err);
                    linger(&listener, &err);
                    return Err(err);
                }
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(e) => return Err(GroupError::io(format!("accepting at {master}"), &e)),
        };
        let hello = stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_read_timeout(Some(HELLO_WAIT)))
            .and_then(|()| read_msg(&mut stream));
        let hello = match hello {
            Ok(Msg::Hello(h)) if h.magic == MAGIC => h,
            other => {
                let what = match other {
                    Ok(_) => "a frame that is not a hello".to_string(),
                    Err(e) => e.to_string(),
                };
                eprintln!(
                    "eptwin: process 0 ignores a connection from {from}: not an eptwin hello ({what})"
                );
                continue;
            }
        };
        let them = PeerId::known(hello.rank, &hello.host, hello.pid);
        if let Some(what) = refusal(arrival, &hello, &peers) {
            let err = arrival.failure(them, what);
            let _ = write_msg(&mut stream, &abort_msg(&err));
            refuse_all(&mut peers, &err);
            linger(&listener, &err);
            return Err(err);
        }
        let left_ms = deadline.saturating_duration_since(now()).as_millis() as u64;
        if let Err(e) = write_msg(&mut stream, &Msg::Ack { deadline_ms: left_ms }) {
            let err = arrival.failure(them, format!("closed its connection after its hello ({e})"));
            refuse_all(&mut peers, &err);
            linger(&listener, &err);
            return Err(err);
        }
        peers[hello.rank] = Some((them, stream));
        arrived += 1;
    }
    let members: Vec<PeerId> = (0..arrival.count)
        .map(|r| peers[r].as_ref().map_or_else(|| arrival.me.clone(), |(p, _)| p.clone()))
        .collect();
    let welcome = Msg::Welcome(members);
    let gone = peers.iter_mut().flatten().find_map(|(peer, stream)| {
        write_msg(stream, &welcome).err().map(|e| {
            arrival.failure(
                peer.clone(),
                format!("closed its connection before the rendezvous completed ({e})"),
            )
        })
    });
    if let Some(err) = gone {
        refuse_all(&mut peers, &err);
        return Err(err);
    }
    Ok(peers)
}

/// Why process 0 refuses a hello, if it does.
fn refusal(
    arrival: &Arrival<'_>,
    hello: &Hello,
    peers: &[Option<(PeerId, TcpStream)>],
) -> Option<String> {
    let me = &arrival.me;
    if hello.count != arrival.count {
        return Some(format!(
            "expects {} processes but {me} expects {}: every process must be started with the \
             same process count",
            hello.count, arrival.count
        ));
    }
    if hello.eptwin_version != arrival.eptwin_version {
        return Some(format!(
            "runs eptwin {} but {me} runs eptwin {}: install the same eptwin on every node",
            hello.eptwin_version, arrival.eptwin_version
        ));
    }
    if hello.scenario_sha256 != arrival.scenario_sha256 {
        return Some(format!(
            "read a scenario with sha256 {} but {me} read one with sha256 {}: every process must \
             run the same scenario text and routing files",
            short(&hello.scenario_sha256),
            short(arrival.scenario_sha256)
        ));
    }
    if hello.rank == 0 {
        return Some(format!("claims rank 0, which is {me}'s"));
    }
    if hello.rank >= arrival.count {
        return Some(format!(
            "claims rank {} in a group of {} processes",
            hello.rank, arrival.count
        ));
    }
    if let Some((first, _)) = &peers[hello.rank] {
        return Some(format!("claims rank {}, which {first} already has", hello.rank));
    }
    None
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

fn abort_msg(err: &GroupError) -> Msg {
    match err {
        GroupError::Peer(f) => Msg::Abort(f.clone()),
        other => Msg::Abort(Failure {
            peer: PeerId::rank_only(0),
            what: format!("ended the rendezvous: {other}"),
            when: String::new(),
        }),
    }
}

/// Answers every connection arriving within [`REFUSAL_LINGER`] with the failure.
fn linger(listener: &TcpListener, err: &GroupError) {
    let until = now() + REFUSAL_LINGER;
    let msg = abort_msg(err);
    while now() < until {
        match listener.accept() {
            Ok((mut stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(REFUSAL_LINGER));
                let _ = read_msg(&mut stream);
                let _ = write_msg(&mut stream, &msg);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn refuse_all(peers: &mut [Option<(PeerId, TcpStream)>], err: &GroupError) {
    let msg = abort_msg(err);
    for (_, stream) in peers.iter_mut().flatten() {
        let _ = write_msg(stream, &msg);
    }
}

fn missing_failure(arrival: &Arrival<'_>, peers: &[Option<(PeerId, TcpStream)>]) -> GroupError {
    let missing: Vec<usize> = (1..arrival.count).filter(|&r| peers[r].is_none()).collect();
    let arrived: Vec<String> = std::iter::once(arrival.me.to_string())
        .chain(peers.iter().flatten().map(|(p, _)| p.to_string()))
        .collect();
    let list = |ranks: &[usize]| ranks.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
    let others = if missing.len() > 1 {
        format!(" (missing: processes {})", list(&missing))
    } else {
        String::new()
    };
    arrival.failure(
        PeerId::rank_only(missing[0]),
        format!(
            "did not arrive within {}{others}; {} of {} processes arrived: {}",
            seconds(arrival.timeout),
            arrived.len(),
            arrival.count,
            arrived.join(", ")
        ),
    )
}

/// Any process but 0: connects, says hello, waits for process 0's verdict. Returns the stream
/// to process 0 and the members of the group.
pub fn join(arrival: &Arrival<'_>) -> Result<(TcpStream, Vec<PeerId>), GroupError> {
    let master = arrival.master;
    let zero = PeerId { rank: 0, host: Some(master.host.clone()), pid: None };
    let deadline = now() + arrival.timeout;
    let mut stream = connect(arrival, &zero, deadline)?;
    let hello = Hello {
        magic: MAGIC.into(),
        rank: arrival.me.rank,
        count: arrival.count,
        host: arrival.me.host.clone().unwrap_or_default(),
        pid: arrival.me.pid.unwrap_or(0),
        eptwin_version: arrival.eptwin_version.into(),
        scenario_sha256: arrival.scenario_sha256.into(),
    };
    write_msg(&mut stream, &Msg::Hello(hello)).map_err(|e| {
        arrival.failure(zero.clone(), format!("closed the connection before the hello ({e})"))
    })?;
    // Process 0 may have started later than this process: its deadline, not ours, decides.
    let verdict_wait = |wait: Duration| -> Result<Msg, GroupError> {
        stream
            .try_clone()
            .and_then(|mut s| {
                s.set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
                read_msg(&mut s)
            })
            .map_err(|e| {
                let what = match e.kind() {
                    ErrorKind::WouldBlock | ErrorKind::TimedOut => format!(
                        "did not complete the rendezvous within {} (is {master} eptwin's \
                         process 0? {})",
                        seconds(wait),
                        master.origin
                    ),
                    ErrorKind::InvalidData => format!(
                        "answered at {master} with something that is not eptwin's ({e}); {}",
                        master.origin
                    ),
                    _ => format!("closed the connection during the rendezvous ({e})"),
                };
                arrival.failure(zero.clone(), what)
            })
    };
    let left = deadline.saturating_duration_since(now()) + VERDICT_MARGIN;
    let wait = match verdict_wait(left)? {
        Msg::Ack { deadline_ms } => Duration::from_millis(deadline_ms) + VERDICT_MARGIN,
        Msg::Abort(f) => return Err(GroupError::Peer(f)),
        other => return Err(unexpected(arrival, &zero, &other)),
    };
    match verdict_wait(wait)? {
        Msg::Welcome(members) if members.len() == arrival.count => Ok((stream, members)),
        Msg::Abort(f) => Err(GroupError::Peer(f)),
        other => Err(unexpected(arrival, &zero, &other)),
    }
}

fn unexpected(arrival: &Arrival<'_>, zero: &PeerId, msg: &Msg) -> GroupError {
    arrival.failure(zero.clone(), format!("answered the hello with an unexpected {msg:?}"))
}

fn connect(
    arrival: &Arrival<'_>,
    zero: &PeerId,
    deadline: Instant,
) -> Result<TcpStream, GroupError> {
    let master = arrival.master;
    let mut last: io::Error;
    loop {
        let left = deadline.saturating_duration_since(now());
        last = match (master.host.as_str(), master.port).to_socket_addrs() {
            Ok(addrs) => {
                let mut last = io::Error::new(ErrorKind::NotFound, "the name has no address");
                for addr in addrs {
                    let attempt = left.clamp(Duration::from_millis(10), Duration::from_secs(1));
                    match TcpStream::connect_timeout(&addr, attempt) {
                        Ok(stream) => return Ok(stream),
                        Err(e) => last = e,
                    }
                }
                last
            }
            Err(e) => e,
        };
        if now() >= deadline {
            return Err(arrival.failure(
                zero.clone(),
                format!(
                    "did not accept a connection at {master} within {} (last attempt: {last}); \
                     the address comes from {}: it must be process 0's host",
                    seconds(arrival.timeout),
                    master.origin
                ),
            ));
        }
        std::thread::sleep(RETRY_PAUSE.min(deadline.saturating_duration_since(now())));
    }
}
