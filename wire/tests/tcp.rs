//! The internode protocol over the TCP wire between OS processes, on any machine (no RDMA): the
//! test re-executes its own executable once per node (`EPTWIN_WIRE_NODE`), the nodes exchange
//! their endpoints through files and run the host reference of the normal and low-latency
//! kernels on the fixture's jobs, checking every received token and combined row; the parent
//! checks that both nodes succeeded and together checked exactly what the routing predicts.
//! A node killed mid-transfer must make the other fail, naming it, within seconds.

mod support;

use std::time::Duration;

use support::{
    Exchange, WireSetup, child_role, geometry, log_of, plan, routing, run_node, scratch_dir,
    spawn_nodes, wait_for,
};

const CALLS: u32 = 3;
/// Bound on every wait of a node (connection, stall, close).
const NODE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on a whole node process.
const PROCESS_LIMIT: Duration = Duration::from_secs(240);

/// In a child: run node `n` of `job` for `calls` calls and report; `false` in the parent.
fn node_main(job: usize, calls: u32) -> bool {
    let Some((node, dir)) = child_role() else { return false };
    let plan = plan();
    let job = &plan.jobs[job];
    let (g, traffic) = geometry(&plan, job);
    let ex = Exchange { dir, node, nodes: g.num_nodes(), timeout: NODE_TIMEOUT };
    let connected = || ex.publish(&format!("connected-{node}"), b"");
    match run_node(&ex, traffic, &g, routing(job), WireSetup::Tcp, calls, NODE_TIMEOUT, connected) {
        Ok(outcome) => eprintln!("{}", outcome.line(node)),
        Err(e) => {
            eprintln!("EPTWIN_NODE_FAILED node={node}\n{e}");
            std::process::exit(3);
        }
    }
    true
}

/// Both nodes of `job` as processes over TCP; every check of both must pass.
fn two_processes(test: &str, job_index: usize) {
    let run = support::two_processes(test, job_index, "tcp", CALLS, PROCESS_LIMIT);
    assert!(run.sum("local") > 0, "the own node was reached directly");
    eprintln!("{}", run.summary(test, CALLS, "writes", "flags over TCP"));
}

#[test]
fn normal_internode_over_tcp_between_two_processes() {
    if node_main(0, CALLS) {
        return;
    }
    two_processes("normal_internode_over_tcp_between_two_processes", 0);
}

#[test]
fn low_latency_over_tcp_between_two_processes() {
    if node_main(1, CALLS) {
        return;
    }
    two_processes("low_latency_over_tcp_between_two_processes", 1);
}

#[test]
fn a_peer_killed_mid_transfer_is_named_by_the_survivor() {
    const TEST: &str = "a_peer_killed_mid_transfer_is_named_by_the_survivor";
    // Enough calls that the nodes are still exchanging when one is killed.
    if node_main(0, 1_000_000) {
        return;
    }
    let dir = scratch_dir(TEST);
    let mut children = spawn_nodes(TEST, &dir, 2, &[]);
    let ex = Exchange { dir: dir.clone(), node: u32::MAX, nodes: 2, timeout: NODE_TIMEOUT };
    ex.fetch("connected-1");
    ex.fetch("connected-0");
    std::thread::sleep(Duration::from_millis(500));
    assert!(children[0].try_wait().unwrap().is_none(), "node 0 ended early:\n{}", log_of(&dir, 0));
    children[1].kill().unwrap();
    children[1].wait().unwrap();
    #[allow(clippy::disallowed_methods)] // real time: how long the survivor takes
    let killed = std::time::Instant::now();
    let limit = Duration::from_secs(30);
    let status = wait_for(&mut children[0], limit);
    let log = log_of(&dir, 0);
    let status = status
        .unwrap_or_else(|| panic!("node 0 still ran {limit:?} after node 1 was killed:\n{log}"));
    assert!(!status.success(), "node 0 must fail when its peer dies:\n{log}");
    assert!(log.contains("EPTWIN_NODE_FAILED node=0"), "{log}");
    assert!(log.contains("peer process 1"), "the survivor names the dead peer:\n{log}");
    eprintln!(
        "node 0 failed {:.0} ms after node 1 was killed:\n{}",
        killed.elapsed().as_secs_f64() * 1e3,
        log.lines()
            .skip_while(|l| !l.contains("EPTWIN_NODE_FAILED"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The checks are not vacuous: when one node's routing differs from the other's in a single
/// top-k weight, the node receiving that token refuses it, naming the token and the byte.
#[test]
fn a_token_that_differs_from_the_routing_is_refused() {
    let plan = plan();
    let job = &plan.jobs[0];
    let (g, traffic) = geometry(&plan, job);
    let honest = routing(job).clone();
    // A token of a node-1 rank that goes to node 0, and its first weight changed at node 1.
    let (src, token) = (g.rank_of(1, 0)..g.num_ranks)
        .flat_map(|s| (0..g.tokens_per_rank).map(move |t| (s, t)))
        .find(|&(s, t)| {
            honest
                .experts(s, t)
                .iter()
                .any(|&e| e >= 0 && g.node_of(honest.rank_of_expert(e as u32)) == 0)
        })
        .expect("some token crosses from node 1 to node 0");
    let mut skewed = honest.clone();
    let at = ((src * g.tokens_per_rank + token) * g.topk) as usize;
    skewed.topk_weights[at] += 1.0;
    let dir = scratch_dir("a_token_that_differs_from_the_routing_is_refused");
    let timeout = Duration::from_secs(20);
    let results: Vec<Result<_, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = [&honest, &skewed]
            .into_iter()
            .enumerate()
            .map(|(node, routing)| {
                let (g, dir) = (&g, dir.clone());
                s.spawn(move || {
                    let ex = Exchange { dir, node: node as u32, nodes: 2, timeout };
                    run_node(&ex, traffic, g, routing, WireSetup::Tcp, 1, timeout, || {})
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let e = results[0].as_ref().expect_err("node 0 must refuse the token");
    let want = format!("token {token} of rank {src}");
    assert!(e.contains("dispatch receiver") && e.contains(&want), "{want:?} missing in {e}");
    assert!(results[1].is_err(), "node 1 fails too (its peer stopped)");
    eprintln!("node 0 refused the token:\n{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A peer that connects and then says nothing (alive, but hung) is not a wire error; the
/// protocol's wait bound ends the run, naming what it waited for.
#[test]
fn a_silent_peer_ends_the_wait_with_what_was_awaited() {
    use std::sync::Arc;

    use eptwin_wire::protocol::QpTable;
    use eptwin_wire::{Region, TcpEndpoint, TcpSetup, TcpTimeouts};

    let plan = plan();
    let job = &plan.jobs[0];
    let (g, traffic) = geometry(&plan, job);
    let dir = scratch_dir("a_silent_peer_ends_the_wait_with_what_was_awaited");
    let bound = Duration::from_millis(1500);
    let ex1 = Exchange { dir: dir.clone(), node: 1, nodes: 2, timeout: NODE_TIMEOUT };
    let silent = std::thread::spawn(move || {
        let region = Arc::new(Region::alloc(1 << 20).unwrap());
        let setup = TcpSetup::bind(1, "127.0.0.1:0".parse().unwrap(), region.clone()).unwrap();
        ex1.publish("tcp-1", &setup.endpoint().to_bytes());
        let peer = TcpEndpoint::from_bytes(&ex1.fetch("tcp-0")).unwrap();
        let per = QpTable::new(traffic, &g, 1).per_process();
        let link = setup.connect(&[peer], region, per, TcpTimeouts::default()).unwrap();
        ex1.fetch("node-0-done");
        link
    });
    let ex0 = Exchange { dir: dir.clone(), node: 0, nodes: 2, timeout: NODE_TIMEOUT };
    #[allow(clippy::disallowed_methods)] // real time: how long the wait took
    let start = std::time::Instant::now();
    let (g0, _) = geometry(&plan, job);
    let r = run_node(&ex0, traffic, &g0, routing(job), WireSetup::Tcp, 1, bound, || {});
    let took = start.elapsed();
    ex0.publish("node-0-done", b"");
    drop(silent.join().unwrap());
    let e = r.expect_err("nothing arrives from node 1");
    assert!(e.contains("waited") && e.contains("from node 1"), "{e}");
    assert!(took < bound + Duration::from_secs(10), "took {took:?}");
    eprintln!("node 0 gave up after {:.0} ms:\n{e}", took.as_secs_f64() * 1e3);
    let _ = std::fs::remove_dir_all(&dir);
}
