//! The host reference implementation of both ends of the internode protocol: each rank is a
//! CPU thread that stages tokens, publishes doorbell records and reads its receive area
//! exactly as the GPU kernels will (same layouts, same record order, same credits), moving a
//! real routing and checking every received token and every combined row bit for bit.
//!
//! A rank's roles (DeepEP's warp roles) are non-blocking state machines polled round-robin by
//! the rank's thread, so no role waits on another of the same rank. A rank that makes no
//! progress for [`HostLinks::timeout`] fails with [`WireError::Stalled`] naming what it waits
//! for; while it waits it asks [`HostLinks::health`] whether the wire broke (a vanished peer
//! is then named at once) and watches its doorbell queue (closed = the proxy stopped). The
//! first rank that fails stops the others.

mod low_latency;
mod normal;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub use low_latency::run_low_latency;
pub use normal::run_normal;

use crate::doorbell::{Doorbell, DoorbellProducer};
use crate::error::WireError;
use crate::region::Region;

/// What one process's ranks run on: its node, its regions (all local ranks' areas back to
/// back), one doorbell producer per local rank (all served by the process's proxy), and the
/// wire's health.
pub struct HostLinks<'a> {
    /// This process's node (= process index).
    pub node: u32,
    pub send: &'a Region,
    pub recv: &'a Region,
    /// `producers[l]` carries local rank `l`'s doorbells.
    pub producers: &'a [DoorbellProducer],
    /// `Err` once the wire broke (e.g. `TcpReceivers::health`); verbs has no receive side
    /// to watch: pass `&|| Ok(())`.
    pub health: &'a (dyn Fn() -> Result<(), WireError> + Sync),
    /// Longest time a rank may go without progress.
    pub timeout: Duration,
}

/// What a run moved and checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostStats {
    pub calls: u32,
    /// Dispatched tokens received and checked (payload, metadata, scales, top-k).
    pub tokens_checked: u64,
    /// Combine rows received and checked, and combined rows checked.
    pub rows_checked: u64,
    pub combined_checked: u64,
    /// Records published to the proxy.
    pub doorbells: u64,
    /// Transfers to ranks of the same process (the NVLink path's stand-in: direct copies).
    pub local_copies: u64,
}

impl HostStats {
    fn add(&mut self, o: &HostStats) {
        self.tokens_checked += o.tokens_checked;
        self.rows_checked += o.rows_checked;
        self.combined_checked += o.combined_checked;
        self.doorbells += o.doorbells;
        self.local_copies += o.local_copies;
    }
}

/// What a doorbell's tag says: `role << 60 | rank << 44 | a << 32 | b` with `a` a channel or
/// local expert and `b` a token, slot or sequence number ([`describe_tag`] reads it back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum TagRole {
    DispatchCount = 1,
    DispatchData = 2,
    DispatchTail = 3,
    DispatchCredit = 4,
    CombineData = 5,
    CombineTail = 6,
    CombineCredit = 7,
    LlDispatchData = 8,
    LlDispatchCount = 9,
    LlCombineData = 10,
    LlCombineFlag = 11,
}

const ROLE_NAMES: [&str; 12] = [
    "?",
    "dispatch count",
    "dispatch data",
    "dispatch tail",
    "dispatch credit",
    "combine data",
    "combine tail",
    "combine credit",
    "LL dispatch data",
    "LL dispatch count",
    "LL combine data",
    "LL combine flag",
];

pub fn tag(role: TagRole, rank: u32, a: u32, b: u32) -> u64 {
    (role as u64) << 60 | ((rank as u64) & 0xffff) << 44 | ((a as u64) & 0xfff) << 32 | b as u64
}

/// A tag in words: "dispatch data rank 3 a=1 b=17".
pub fn describe_tag(tag: u64) -> String {
    let role = ROLE_NAMES.get((tag >> 60) as usize).copied().unwrap_or("?");
    format!(
        "{role} rank {} a={} b={}",
        (tag >> 44) & 0xffff,
        (tag >> 32) & 0xfff,
        tag & 0xffff_ffff
    )
}

/// One rank's connection to its process's links.
pub(crate) struct RankPort<'a> {
    pub links: &'a HostLinks<'a>,
    pub rank: u32,
    pub local: u32,
    pub abort: &'a AtomicBool,
    pub stats: HostStats,
    idle_rounds: u32,
    #[allow(clippy::disallowed_methods)] // real time: the stall bound
    last_progress: std::time::Instant,
}

impl<'a> RankPort<'a> {
    pub fn new(links: &'a HostLinks<'a>, rank: u32, local: u32, abort: &'a AtomicBool) -> Self {
        #[allow(clippy::disallowed_methods)] // real time: the stall bound
        let now = std::time::Instant::now();
        RankPort {
            links,
            rank,
            local,
            abort,
            stats: HostStats::default(),
            idle_rounds: 0,
            last_progress: now,
        }
    }

    pub fn push(&mut self, record: Doorbell) -> Result<(), WireError> {
        self.links.producers[self.local as usize].push(record).map_err(|_| WireError::Proxy {
            proxy: self.links.node as usize,
            reason: format!(
                "rank {} could not publish {}: the proxy stopped (its own error says why)",
                self.rank,
                describe_tag(record.tag)
            ),
        })?;
        self.stats.doorbells += 1;
        Ok(())
    }

    pub fn progressed(&mut self) {
        self.idle_rounds = 0;
        #[allow(clippy::disallowed_methods)] // real time: the stall bound
        let now = std::time::Instant::now();
        self.last_progress = now;
    }

    /// Nothing moved this round: check the wire, the proxy, the other ranks and the clock.
    pub fn idle(
        &mut self,
        role: &str,
        waiting_for: impl FnOnce() -> String,
    ) -> Result<(), WireError> {
        (self.links.health)()?;
        if self.abort.load(Ordering::Acquire) {
            return Err(WireError::Stalled {
                rank: self.rank,
                role: role.into(),
                what: "nothing: another rank of this process failed".into(),
                waited_ms: 0,
            });
        }
        if self.links.producers[self.local as usize].is_closed() {
            return Err(WireError::Proxy {
                proxy: self.links.node as usize,
                reason: format!("stopped while rank {} {role} waited", self.rank),
            });
        }
        let waited = self.last_progress.elapsed();
        if waited > self.links.timeout {
            return Err(WireError::Stalled {
                rank: self.rank,
                role: role.into(),
                what: waiting_for(),
                waited_ms: waited.as_millis() as u64,
            });
        }
        crate::doorbell::backoff(&mut self.idle_rounds);
        if self.idle_rounds > 1024 {
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }
}

/// Run `body` for every local rank on its own thread; the first failure stops the others and
/// is returned (a rank that stopped only because another failed does not hide the cause).
pub(crate) fn run_ranks<F>(
    links: &HostLinks<'_>,
    ranks_per_node: u32,
    body: F,
) -> Result<HostStats, WireError>
where
    F: Fn(&mut RankPort<'_>) -> Result<(), WireError> + Sync,
{
    let abort = AtomicBool::new(false);
    let results: Vec<Result<HostStats, WireError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..ranks_per_node)
            .map(|local| {
                let abort = &abort;
                let body = &body;
                std::thread::Builder::new()
                    .name(format!("eptwin-host-rank-{local}"))
                    .spawn_scoped(scope, move || {
                        let rank = links.node * ranks_per_node + local;
                        let mut port = RankPort::new(links, rank, local, abort);
                        let r = body(&mut port);
                        if r.is_err() {
                            abort.store(true, Ordering::Release);
                        }
                        r.map(|()| port.stats)
                    })
                    .expect("spawning a rank thread")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(WireError::Proxy {
                        proxy: links.node as usize,
                        reason: "a rank thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    let mut total = HostStats::default();
    let mut first_error = None;
    for r in results {
        match r {
            Ok(s) => total.add(&s),
            Err(e) => {
                let secondary = matches!(&e, WireError::Stalled { what, .. } if what.starts_with("nothing: another rank"));
                if first_error.is_none() || (!secondary && matches!(first_error, Some((true, _)))) {
                    first_error = Some((secondary, e));
                }
            }
        }
    }
    match first_error {
        Some((_, e)) => Err(e),
        None => Ok(total),
    }
}
