//! Shared by the internode wire tests (`wire.rs` over TCP, `rdma_internode.rs` over verbs):
//! the fixture scenario and the geometry its jobs give, a file-based stand-in for the
//! launcher's rendezvous, test processes that re-execute the test executable as one node
//! each, and one node's whole run (regions, wire, proxy, host reference, orderly close).

#![allow(dead_code)] // each test target uses its part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use eptwin_engine::api::RoutingTable;
use eptwin_engine::api::{JobPlan, Plan};
use eptwin_wire::protocol::{
    Geometry, HostLinks, HostStats, LlLayout, NormalLayout, QpTable, Traffic, run_low_latency,
    run_normal,
};
use eptwin_wire::{
    Proxy, ProxySpec, ProxyStats, Region, TcpEndpoint, TcpSetup, TcpTimeouts, WireReport,
    doorbell_queue,
};

pub const FIXTURE: &str = include_str!("../fixtures/internode-2node.toml");

/// The fixture's plan: job 0 normal internode, job 1 low-latency, both on 2 nodes × 8.
pub fn plan() -> Plan {
    let loaded = eptwin_engine::parse("wire/tests/fixtures/internode-2node.toml", FIXTURE)
        .expect("fixture parses");
    Plan::build(&loaded).expect("fixture is valid")
}

/// The protocol geometry a job's plan gives, its plan nodes as the wire's (the mapping the
/// hardware backend makes for the fixture's jobs).
pub fn geometry(plan: &Plan, job: &JobPlan) -> (Geometry, Traffic) {
    let d = job.deepep().expect("a DeepEP job");
    let nodes = job.ranks.iter().map(|&r| plan.topology.node_of_rank(r)).max().unwrap() + 1;
    let traffic = if d.dispatch_config.is_some() { Traffic::Normal } else { Traffic::LowLatency };
    let g = Geometry::for_job(job, d, job.num_ranks() / nodes).expect("FP8 or BF16 dispatch");
    (g, traffic)
}

pub fn routing(job: &JobPlan) -> &RoutingTable {
    job.deepep().expect("a DeepEP job").routing()
}

/// Tokens and rows the host reference must check over all nodes in `calls` calls: normal,
/// one token per (token, destination node); low-latency, one per valid selection.
pub fn expected_checks(g: &Geometry, traffic: Traffic, routing: &RoutingTable, calls: u32) -> u64 {
    let mut n = 0u64;
    for s in 0..g.num_ranks {
        for t in 0..g.tokens_per_rank {
            let experts = routing.experts(s, t).iter().filter(|&&e| e >= 0);
            n += match traffic {
                Traffic::LowLatency => experts.count() as u64,
                Traffic::Normal => {
                    let mut nodes: Vec<u32> =
                        experts.map(|&e| g.node_of(routing.rank_of_expert(e as u32))).collect();
                    nodes.sort_unstable();
                    nodes.dedup();
                    nodes.len() as u64
                }
            };
        }
    }
    n * calls as u64
}

/// Per-process region sizes `(send, recv)` for the job's traffic.
pub fn region_bytes(g: &Geometry, traffic: Traffic) -> (usize, usize) {
    let rpn = g.ranks_per_node as u64;
    let (send, recv) = match traffic {
        Traffic::Normal => {
            let l = NormalLayout::new(g);
            (l.send_area_bytes, l.recv_area_bytes)
        }
        Traffic::LowLatency => {
            let l = LlLayout::new(g);
            (l.send_area_bytes, l.recv_area_bytes)
        }
    };
    ((rpn * send) as usize, (rpn * recv) as usize)
}

/// What processes exchange before their wires connect, through files in a shared directory
/// (the stand-in for the launcher's rendezvous): each value is written to a temporary name
/// and renamed, so a reader never sees half of it.
pub struct Exchange {
    pub dir: PathBuf,
    pub node: u32,
    pub nodes: u32,
    pub timeout: Duration,
}

impl Exchange {
    pub fn publish(&self, key: &str, bytes: &[u8]) {
        let tmp = self.dir.join(format!("{key}.tmp"));
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::rename(&tmp, self.dir.join(key)).unwrap();
    }

    pub fn fetch(&self, key: &str) -> Vec<u8> {
        #[allow(clippy::disallowed_methods)] // real time: bound the wait
        let start = std::time::Instant::now();
        loop {
            if let Ok(bytes) = std::fs::read(self.dir.join(key)) {
                return bytes;
            }
            assert!(
                start.elapsed() < self.timeout,
                "node {}: {key} never appeared in {}",
                self.node,
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Wait until every node has reached `name`.
    pub fn barrier(&self, name: &str) {
        self.publish(&format!("{name}-{}", self.node), b"");
        for n in 0..self.nodes {
            self.fetch(&format!("{name}-{n}"));
        }
    }
}

/// Which wire one node runs.
pub enum WireSetup {
    Tcp,
    #[cfg(feature = "rdma")]
    Verbs {
        nic: eptwin_wire::rdma::Nic,
        settings: eptwin_wire::rdma::QpSettings,
    },
}

/// What one node did.
#[derive(Debug)]
pub struct NodeOutcome {
    pub host: HostStats,
    pub proxy: ProxyStats,
    pub report: WireReport,
    /// Every QP as `ibv_query_qp` read it back (verbs).
    #[cfg(feature = "rdma")]
    pub qps: Vec<eptwin_wire::rdma::QpAttributes>,
}

impl NodeOutcome {
    /// One line the parent test parses.
    pub fn line(&self, node: u32) -> String {
        format!(
            "EPTWIN_NODE_RESULT node={node} tokens={} rows={} combined={} doorbells={} \
             writes={} flags={} local={} wire={}",
            self.host.tokens_checked,
            self.host.rows_checked,
            self.host.combined_checked,
            self.host.doorbells,
            self.proxy.writes,
            self.proxy.flags,
            self.host.local_copies,
            serde_json::to_string(&self.report).unwrap()
        )
    }
}

/// One node: regions, the wire to every other node, the proxy, `calls` dispatch + combine
/// calls of the host reference, then an orderly close. `Err` carries every error met (the
/// run's, the proxy's, the receivers'), one per line.
#[allow(clippy::too_many_arguments)]
pub fn run_node(
    exchange: &Exchange,
    traffic: Traffic,
    g: &Geometry,
    routing: &RoutingTable,
    wire: WireSetup,
    calls: u32,
    timeout: Duration,
    on_connected: impl FnOnce(),
) -> Result<NodeOutcome, String> {
    let node = exchange.node;
    let table = QpTable::new(traffic, g, node);
    let (send_bytes, recv_bytes) = region_bytes(g, traffic);
    let send = Arc::new(Region::alloc(send_bytes).map_err(|e| e.to_string())?);
    let recv = Arc::new(Region::alloc(recv_bytes).map_err(|e| e.to_string())?);
    let (producers, consumers): (Vec<_>, Vec<_>) =
        (0..g.ranks_per_node).map(|_| doorbell_queue(256)).unzip();
    let run = |links: &HostLinks<'_>| match traffic {
        Traffic::Normal => run_normal(links, g, routing, calls),
        Traffic::LowLatency => run_low_latency(links, g, routing, calls),
    };
    match wire {
        WireSetup::Tcp => {
            let setup = TcpSetup::bind(node, "127.0.0.1:0".parse().unwrap(), recv.clone())
                .map_err(|e| e.to_string())?;
            exchange.publish(&format!("tcp-{node}"), &setup.endpoint().to_bytes());
            let peers: Vec<TcpEndpoint> = table
                .peer_nodes()
                .iter()
                .map(|&n| TcpEndpoint::from_bytes(&exchange.fetch(&format!("tcp-{n}"))).unwrap())
                .collect();
            let timeouts = TcpTimeouts { connect: timeout, write: timeout, close: timeout };
            let (wire, receivers) = setup
                .connect(&peers, send.clone(), table.per_process(), timeouts)
                .map_err(|e| e.to_string())?;
            let report = wire.report("tcp requested", g.qps_per_peer);
            on_connected();
            let health = || receivers.health();
            let links = HostLinks {
                node,
                send: &send,
                recv: &recv,
                producers: &producers,
                health: &health,
                timeout,
            };
            let (host, proxy_stats, wire) =
                proxied(wire, consumers, &links, &run).map_err(|mut lines| {
                    if let Err(e) = receivers.health() {
                        lines.push(format!("receivers: {e}"));
                    }
                    lines.join("\n")
                })?;
            wire.close().map_err(|e| format!("closing: {e}"))?;
            receivers.finish().map_err(|e| format!("receivers: {e}"))?;
            Ok(NodeOutcome {
                host,
                proxy: proxy_stats,
                report,
                #[cfg(feature = "rdma")]
                qps: Vec::new(),
            })
        }
        #[cfg(feature = "rdma")]
        WireSetup::Verbs { nic, settings } => {
            use eptwin_wire::protocol::verbs::PreparedTable;
            use eptwin_wire::rdma::PeerInfo;
            let e = |e: eptwin_wire::WireError| e.to_string();
            let recv_reg = nic.register_region(recv.clone()).map_err(e)?;
            let send_reg = nic.register_region(send.clone()).map_err(e)?;
            let prepared =
                PreparedTable::create(&nic, &settings, table, recv_reg.clone()).map_err(e)?;
            for peer in table.peer_nodes() {
                exchange.publish(
                    &format!("verbs-{node}-to-{peer}"),
                    &prepared.info_for(peer).to_bytes(),
                );
            }
            let infos: Vec<(u32, PeerInfo)> = table
                .peer_nodes()
                .into_iter()
                .map(|peer| {
                    let bytes = exchange.fetch(&format!("verbs-{peer}-to-{node}"));
                    (peer, PeerInfo::from_bytes(&bytes).unwrap())
                })
                .collect();
            let wire = prepared.connect(&infos, send_reg).map_err(e)?;
            let qps =
                wire.qps().iter().map(|q| q.query()).collect::<Result<Vec<_>, _>>().map_err(e)?;
            let report = wire.report("verbs requested", g.qps_per_peer).map_err(e)?;
            // Every node's QPs are connected before anyone posts (a write to a QP still in
            // RTR at the far end would be dropped and retried).
            exchange.barrier(&format!("connected-{}", traffic_name(traffic)));
            on_connected();
            let ok = || Ok(());
            let links = HostLinks {
                node,
                send: &send,
                recv: &recv,
                producers: &producers,
                health: &ok,
                timeout,
            };
            let (host, proxy_stats, wire) =
                proxied(wire, consumers, &links, &run).map_err(|lines| lines.join("\n"))?;
            // Peers may still be writing into this node's regions until they are done too.
            exchange.barrier(&format!("done-{}", traffic_name(traffic)));
            drop(wire);
            drop(recv_reg);
            Ok(NodeOutcome { host, proxy: proxy_stats, report, qps })
        }
    }
}

/// The host reference over `links` with a proxy serving `queues` on `wire`: its result, the
/// proxy's counts and the wire back, or every error of the two, one per entry.
fn proxied<W: eptwin_wire::Wire>(
    wire: W,
    queues: Vec<eptwin_wire::DoorbellConsumer>,
    links: &HostLinks<'_>,
    run: &dyn Fn(&HostLinks<'_>) -> Result<HostStats, eptwin_wire::WireError>,
) -> Result<(HostStats, ProxyStats, W), Vec<String>> {
    let spec = ProxySpec { wire, queues, stall_timeout: links.timeout };
    let proxy = Proxy::spawn(links.node as usize, spec).map_err(|e| vec![format!("proxy: {e}")])?;
    let host = run(links);
    match (host, proxy.finish()) {
        (Ok(h), Ok((stats, wire))) => Ok((h, stats, wire)),
        (h, p) => {
            let mut lines = Vec::new();
            if let Err(e) = h {
                lines.push(format!("host reference: {e}"));
            }
            if let Err(e) = p {
                lines.push(format!("proxy: {e}"));
            }
            Err(lines)
        }
    }
}

pub fn traffic_name(t: Traffic) -> &'static str {
    match t {
        Traffic::Normal => "normal",
        Traffic::LowLatency => "ll",
    }
}

/// This process's node role when a parent test started it: `(node, exchange directory)`.
pub fn child_role() -> Option<(u32, PathBuf)> {
    let node = std::env::var("EPTWIN_WIRE_NODE").ok()?.parse().ok()?;
    Some((node, PathBuf::from(std::env::var("EPTWIN_WIRE_DIR").ok()?)))
}

/// A fresh exchange directory for one test.
pub fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("eptwin-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Start `nodes` copies of this test executable, each running only `test` as node `n`, with
/// `env` added; their output goes to `dir/node-n.log`. `--include-ignored`: the test runs in
/// the node even when it is `#[ignore]`d (the RDMA tests, which the parent ran on request).
pub fn spawn_nodes(test: &str, dir: &Path, nodes: u32, env: &[(&str, String)]) -> Vec<Child> {
    let exe = std::env::current_exe().unwrap();
    (0..nodes)
        .map(|n| {
            let log = std::fs::File::create(dir.join(format!("node-{n}.log"))).unwrap();
            let mut cmd = Command::new(&exe);
            cmd.args(["--exact", test, "--include-ignored", "--nocapture", "--test-threads=1"])
                .env("EPTWIN_WIRE_NODE", n.to_string())
                .env("EPTWIN_WIRE_DIR", dir)
                .stdin(Stdio::null())
                .stdout(Stdio::from(log.try_clone().unwrap()))
                .stderr(Stdio::from(log));
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd.spawn().unwrap()
        })
        .collect()
}

/// Wait for `child` at most `limit`; `None` (after killing it) when it ran past.
pub fn wait_for(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    #[allow(clippy::disallowed_methods)] // real time: bound the wait
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn log_of(dir: &Path, node: u32) -> String {
    std::fs::read_to_string(dir.join(format!("node-{node}.log"))).unwrap_or_default()
}

/// The numbers of a node's `EPTWIN_NODE_RESULT` line.
pub fn result_field(log: &str, field: &str) -> Option<u64> {
    // libtest may have printed "test name ... " on the same line first.
    let line = log.lines().find_map(|l| l.find("EPTWIN_NODE_RESULT").map(|at| &l[at..]))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{field}=")))
        .and_then(|v| v.parse().ok())
}

/// Both nodes of the fixture's job `job_index`, each a process re-executing the test `test`:
/// every node must end successfully, and over both the tokens and combine rows checked must be
/// the routing's, every token combined, bytes must have crossed `wire` ("tcp" or "verbs") on
/// the staged data path. What each wire adds to check, it checks on the returned run.
pub fn two_processes(
    test: &str,
    job_index: usize,
    wire: &str,
    calls: u32,
    limit: Duration,
) -> TwoNodes {
    let plan = plan();
    let job = &plan.jobs[job_index];
    let (geometry, traffic) = geometry(&plan, job);
    let dir = scratch_dir(test);
    #[allow(clippy::disallowed_methods)] // real time: report the duration
    let start = std::time::Instant::now();
    let mut children = spawn_nodes(test, &dir, geometry.num_nodes(), &[]);
    let statuses: Vec<_> = children.iter_mut().map(|c| wait_for(c, limit)).collect();
    let logs: Vec<String> = (0..geometry.num_nodes()).map(|n| log_of(&dir, n)).collect();
    for (n, status) in statuses.iter().enumerate() {
        assert!(
            status.is_some_and(|s| s.success()),
            "node {n} ended with {status:?}; its log:\n{}",
            logs[n]
        );
    }
    let checked = expected_checks(&geometry, traffic, routing(job), calls);
    let run = TwoNodes { geometry, logs, checked, dir, seconds: start.elapsed().as_secs_f64() };
    assert!(checked > 0, "the fixture moves tokens");
    assert_eq!(run.sum("tokens"), checked, "tokens checked over both nodes");
    assert_eq!(run.sum("rows"), checked, "combine rows checked over both nodes");
    let g = &run.geometry;
    assert_eq!(run.sum("combined"), (g.num_ranks * g.tokens_per_rank * calls) as u64);
    assert!(run.sum("writes") > 0 && run.sum("flags") > 0, "bytes crossed the wire");
    let wire_field = format!(r#""wire":"{wire}""#);
    for log in &run.logs {
        assert!(log.contains(&wire_field) && log.contains(r#""data_path":"staged""#), "{log}");
    }
    run
}

/// The run of [`two_processes`]: each node's log and what both checked.
pub struct TwoNodes {
    pub geometry: Geometry,
    pub logs: Vec<String>,
    /// Tokens (and combine rows) checked over both nodes.
    pub checked: u64,
    pub dir: PathBuf,
    pub seconds: f64,
}

impl TwoNodes {
    /// One line for the test's log: nodes, ranks, calls, what was checked, `writes` and
    /// `flags` named as the wire calls them, and the duration.
    pub fn summary(&self, test: &str, calls: u32, writes: &str, flags: &str) -> String {
        format!(
            "{test}: {} nodes × {} ranks, {calls} calls, {want} tokens and {want} rows checked, \
             {} {writes} and {} {flags}, {:.1} s",
            self.geometry.num_nodes(),
            self.geometry.ranks_per_node,
            self.sum("writes"),
            self.sum("flags"),
            self.seconds,
            want = self.checked,
        )
    }

    /// A result line's `field` summed over both nodes.
    pub fn sum(&self, field: &str) -> u64 {
        self.logs.iter().map(|l| result_field(l, field).expect("a result line")).sum()
    }
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
