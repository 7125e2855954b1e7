//! FaultyWire over a recording wire: pass-through, go-back-N, ACK timeouts, NICs down.

use eptwin_engine::testing::ScenarioDraft;

use super::*;

/// A wire that records what reaches it: (QP, tag) in order.
struct Recorder {
    posted: Vec<(usize, u64)>,
    peers: Vec<u32>,
}

impl Wire for Recorder {
    fn kind(&self) -> WireKind {
        WireKind::Tcp
    }
    fn qp_count(&self) -> usize {
        self.peers.len()
    }
    fn peer_of(&self, qp: usize) -> u32 {
        self.peers[qp]
    }
    fn send_len(&self) -> u64 {
        1 << 20
    }
    fn remote_len(&self, _: usize) -> u64 {
        1 << 20
    }
    fn reserve(&mut self, _: usize, _: Duration, _: &mut ProxyStats) -> Result<(), WireError> {
        Ok(())
    }
    fn post(&mut self, qp: usize, _: DoorbellKind, rec: &Doorbell) -> Result<(), WireError> {
        self.posted.push((qp, rec.tag));
        Ok(())
    }
    fn progress(&mut self) -> Result<bool, WireError> {
        Ok(false)
    }
    fn outstanding(&self, _: usize) -> u32 {
        0
    }
    fn drain(&mut self, _: Duration) -> Result<(), WireError> {
        Ok(())
    }
}

/// `scenarios/roce-ep16-ll.toml` with `fault` (a `[[fault]]` table's body) and QPs whose local
/// ACK timeout exponent is `ack_timeout`, with 2 retries.
fn wire_faults(fault: &str, ack_timeout: u8) -> WireFaults {
    let base = std::fs::read_to_string(
        eptwin_engine::testing::repo_root().join("scenarios/roce-ep16-ll.toml"),
    )
    .unwrap();
    let plan = ScenarioDraft::from_text("t.toml", &format!("{base}\n[[fault]]\n{fault}\n")).plan();
    let qp = QpSettings { ack_timeout, retry_count: 2, ..QpSettings::default() };
    WireFaults::new(&plan, &qp).expect("wire faults")
}

fn recorder() -> Recorder {
    Recorder { posted: Vec::new(), peers: vec![1, 1] }
}

fn post(w: &mut FaultyWire<Recorder>, qp: usize, tag: u64) {
    w.post(qp, DoorbellKind::Write, &Doorbell::write(qp as u32, 0, 0, 64, tag)).unwrap();
}

#[test]
fn without_wire_faults_records_pass_through() {
    let plan = ScenarioDraft::bundled("roce-ep16-ll").plan();
    assert_eq!(WireFaults::new(&plan, &QpSettings::default()), None);
    let mut w = FaultyWire::new(recorder(), None, 0);
    (0..100).for_each(|t| post(&mut w, 0, t));
    assert_eq!(w.into_inner().posted.len(), 100);
}

#[test]
fn a_lost_record_comes_back_with_the_next_one_in_order() {
    let f = wire_faults("kind = \"packet_loss\"\nrate = 0.05", 14);
    let mut w = FaultyWire::new(recorder(), Some(f), 0);
    (0..1000).for_each(|t| post(&mut w, 0, t));
    assert!(w.stats.lost > 20, "{:?}", w.stats);
    // Everything up to the last lost record's successor is there, in QP order.
    let posted: Vec<u64> = w.inner.posted.iter().map(|&(_, t)| t).collect();
    assert!(posted.windows(2).all(|p| p[0] < p[1]), "go-back-N keeps the order");
    w.drain(Duration::from_secs(5)).unwrap();
    let posted: Vec<u64> = w.into_inner().posted.iter().map(|&(_, t)| t).collect();
    assert_eq!(posted, (0..1000).collect::<Vec<_>>(), "no record is lost for good");
}

#[test]
fn losses_are_drawn_from_the_seed() {
    let lost = |seed: u64| {
        let mut f = wire_faults("kind = \"packet_loss\"\nrate = 0.05", 14);
        f.seed = seed;
        (0..2000).filter(|&s| f.lost(0, 3, s)).collect::<Vec<_>>()
    };
    assert_eq!(lost(1), lost(1));
    assert_ne!(lost(1), lost(2));
}

#[test]
fn a_lost_tail_waits_for_the_local_ack_timeout() {
    // Exponent 8: 4.096 µs × 256 ≈ 1 ms.
    let f = wire_faults("kind = \"packet_loss\"\nrate = 0.5", 8);
    let mut w = FaultyWire::new(recorder(), Some(f), 0);
    let mut tag = 0;
    while w.stats.lost == 0 {
        post(&mut w, 1, tag);
        tag += 1;
    }
    assert_eq!(w.outstanding(1), 1);
    std::thread::sleep(Duration::from_millis(3));
    w.progress().unwrap();
    assert_eq!(w.outstanding(1), 0);
    assert_eq!(w.stats.timeouts, 1);
}

#[test]
#[allow(clippy::disallowed_methods)] // real time: a bound on the retries
fn a_nic_down_for_good_fails_the_qp_after_its_retries() {
    let f = wire_faults("kind = \"nic_down\"\nnode = 1\nnic = 0\nat_us = 0", 8);
    let mut w = FaultyWire::new(recorder(), Some(f), 0);
    post(&mut w, 0, 7);
    assert!(w.inner.posted.is_empty(), "node 1 is cut off");
    let end = Instant::now() + Duration::from_secs(5);
    let err = loop {
        std::thread::sleep(Duration::from_millis(1));
        if let Err(e) = w.progress() {
            break e;
        }
        assert!(Instant::now() < end, "retries must run out");
    };
    let msg = err.to_string();
    assert!(msg.contains("fault[0] nic_down: NIC 0 of node 1"), "{msg}");
    assert!(msg.contains("IBV_WC_RETRY_EXC_ERR") && msg.contains("retry_cnt 2"), "{msg}");
}

#[test]
fn a_nic_back_up_before_the_retries_run_out_delivers_everything() {
    let f = wire_faults("kind = \"nic_down\"\nnode = 0\nnic = 0\nat_us = 0\nduration_us = 1500", 8);
    let mut w = FaultyWire::new(recorder(), Some(f), 0);
    (0..3).for_each(|t| post(&mut w, 0, t));
    assert!(w.inner.posted.is_empty());
    w.drain(Duration::from_secs(5)).unwrap();
    assert_eq!(w.into_inner().posted, vec![(0, 0), (0, 1), (0, 2)]);
}
