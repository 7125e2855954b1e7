//! RC transport under packet loss and NICs that go down (docs/design.md, faults §3–§4): every
//! data or atomic request packet carries a PSN; the responder takes a QP's packets in PSN order
//! only, answers the first out-of-sequence packet after a gap with one NAK (sequence error) and
//! drops everything until the missing PSN comes; the requester goes back to the NAK'd PSN and
//! sends everything from there again (go-back-N). A lost tail has no later packet to reveal
//! it: the requester's local ACK timeout (4.096 µs × 2^`timeout`) fires and it resends from the
//! oldest unacknowledged PSN. Each NAK or timeout without progress in between uses a retry;
//! after `retry_cnt` of them the QP fails (`IBV_WC_RETRY_EXC_ERR`) and what it carries never
//! arrives. Drops are drawn from the scenario's seed per transmission, so runs are repeatable.
//!
//! The model keeps its state apart from the hot QP records, allocated only when the run has a
//! `packet_loss` or `nic_down` fault: a healthy run never reads it.
//!
//! A timeout fires when the machine has nothing else to do (the world asks for the earliest
//! due one then, and the clock jumps there): NVSHMEM's timeout is seconds, far longer than an
//! op is busy, so no timer is due while events remain.

use eptwin_engine::api::splitmix64;

use crate::core::slab::NONE;
use crate::core::time::Time;
use crate::core::{Core, Ev};
use crate::net::{Pkt, PktKind};

/// NVSHMEM's IBGDA RC QPs: `timeout` (local ACK timeout exponent) 20 and `retry_cnt` 7
/// [verify: NVSHMEM v3.4.5 `ibgda.cpp` sets them when moving a QP to RTS; the same values are
/// libibverbs examples' and NCCL's defaults (`NCCL_IB_TIMEOUT` 20, `NCCL_IB_RETRY_CNT` 7)].
pub const QP_TIMEOUT_EXPONENT: u32 = 20;
pub const QP_RETRY_CNT: u8 = 7;

/// The local ACK timeout of a QP: 4.096 µs × 2^`timeout` (IBTA Vol. 1 §9.7.6.1.3 [spec]):
/// 4.29 s at 20.
pub const fn local_ack_timeout(exponent: u32) -> Time {
    4_096_000 << exponent
}

/// Per-QP recovery state (indexed by QP id), per-message first PSN, per-packet PSN.
#[derive(Debug, Clone, Default)]
pub struct Loss {
    /// Requester: the PSN its next packet gets; the highest PSN sent so far + 1.
    next_psn: Vec<u32>,
    high_psn: Vec<u32>,
    /// Transmissions so far (each gets its own drop draw).
    sent: Vec<u32>,
    /// A go-back to this PSN, applied when the QP is next between packets (NONE: none).
    rewind: Vec<u32>,
    /// Retries used since the last progress.
    retries: Vec<u8>,
    /// The QP failed (retry counter exceeded) at this time (`Time::MAX`: it did not).
    failed_at: Vec<Time>,
    /// Responder: the PSN it expects; whether it has NAK'd the gap at it already.
    expected: Vec<u32>,
    nak_sent: Vec<bool>,
    /// The requester's ACK timer: due at this time for this expected PSN (`Time::MAX`: off).
    timer_at: Vec<Time>,
    timer_psn: Vec<u32>,
    /// First PSN of each message (by message id) and PSN of each packet in flight (by id).
    first_psn: Vec<u32>,
    pkt_psn: Vec<u32>,
    /// What the draws mix in: the scenario's seed and the machine's start in the run.
    salt: u64,
}

/// What the responder does with an arriving data or atomic packet.
enum Verdict {
    Take,
    Discard,
}

fn grow<T: Clone>(v: &mut Vec<T>, i: usize, fill: T) {
    if v.len() <= i {
        v.resize(i + 1, fill);
    }
}

impl Loss {
    pub fn new(seed: u64, origin: Time) -> Loss {
        let mut s = seed ^ origin.rotate_left(17);
        Loss { salt: splitmix64(&mut s), ..Loss::default() }
    }

    fn ensure_qp(&mut self, qp: usize) {
        grow(&mut self.next_psn, qp, 0);
        grow(&mut self.high_psn, qp, 0);
        grow(&mut self.sent, qp, 0);
        grow(&mut self.rewind, qp, NONE);
        grow(&mut self.retries, qp, 0);
        grow(&mut self.failed_at, qp, Time::MAX);
        grow(&mut self.expected, qp, 0);
        grow(&mut self.nak_sent, qp, false);
        grow(&mut self.timer_at, qp, Time::MAX);
        grow(&mut self.timer_psn, qp, 0);
    }

    /// A 64-bit draw for transmission `tx` on `qp`.
    fn draw(&self, qp: u32, tx: u32) -> u64 {
        let mut s = self.salt ^ ((qp as u64) << 32 | tx as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        splitmix64(&mut s)
    }

    /// QPs that failed, with when.
    pub fn failed(&self) -> impl Iterator<Item = (u32, Time)> + '_ {
        self.failed_at
            .iter()
            .enumerate()
            .filter(|(_, t)| **t != Time::MAX)
            .map(|(q, t)| (q as u32, *t))
    }
}

impl Core {
    /// A packet `pkt` of message `m` left QP `qp` (`first`: the message's first packet):
    /// its PSN; a retransmitted one moves its payload from `rdma_payload` to `rdma_resent`.
    /// `left`: the message's payload bytes not yet sent before this packet.
    pub(crate) fn loss_sent(&mut self, qp: u32, pkt: u32, m: u32, left: u32, payload: u32) {
        if self.net.loss.is_none() {
            return;
        }
        let msg = self.net.msgs.send(m);
        let first = msg.atomic() || left == msg.bytes();
        let Some(loss) = self.net.loss.as_mut() else { return };
        let q = qp as usize;
        loss.ensure_qp(q);
        let psn = loss.next_psn[q];
        loss.next_psn[q] += 1;
        grow(&mut loss.pkt_psn, pkt as usize, 0);
        loss.pkt_psn[pkt as usize] = psn;
        if first {
            grow(&mut loss.first_psn, m as usize, 0);
            loss.first_psn[m as usize] = psn;
        }
        if psn < loss.high_psn[q] {
            let prog = self.net.pkts[pkt].prog as usize;
            let ob = &mut self.op_bytes[prog];
            ob.rdma_payload -= payload as u64;
            ob.rdma_resent += payload as u64;
        } else {
            loss.high_psn[q] = psn + 1;
        }
    }

    /// Between two packets of QP `qp`: a pending go-back takes effect.
    pub(crate) fn loss_between_packets(&mut self, qp: u32) {
        let Some(loss) = self.net.loss.as_mut() else { return };
        let psn = std::mem::replace(&mut loss.rewind[qp as usize], NONE);
        if psn != NONE {
            self.go_back(qp, psn);
        }
    }

    /// A data or atomic packet reaches its responder NIC `n`: `true` when it is dropped (lost
    /// on the way, a NIC down, out of sequence, a duplicate, its QP failed), after the
    /// bookkeeping; the caller has returned its credits and frees nothing else.
    pub(crate) fn loss_receive(&mut self, n: u32, pkt: u32) -> bool {
        let now = self.now;
        let k = self.net.pkts[pkt];
        let src = self.net.qps[k.qp as usize].nic;
        let down = self.faults.nic_down_at(src, now).is_some()
            || self.faults.nic_down_at(n, now).is_some();
        let threshold = self.faults.loss_threshold;
        let Some(loss) = self.net.loss.as_mut() else { return false };
        let q = k.qp as usize;
        loss.ensure_qp(q);
        let psn = loss.pkt_psn[pkt as usize];
        let tx = loss.sent[q];
        loss.sent[q] += 1;
        let lost = down || (threshold != 0 && loss.draw(k.qp, tx) < threshold);
        let verdict = if loss.failed_at[q] != Time::MAX || lost {
            if lost && loss.timer_at[q] == Time::MAX {
                // The requester's ACK timer runs from now: if nothing gets through, it fires.
                loss.timer_at[q] = now + local_ack_timeout(QP_TIMEOUT_EXPONENT);
                loss.timer_psn[q] = loss.expected[q];
            }
            Verdict::Discard
        } else if psn == loss.expected[q] {
            loss.expected[q] += 1;
            loss.nak_sent[q] = false;
            loss.retries[q] = 0;
            loss.timer_at[q] = Time::MAX;
            Verdict::Take
        } else if psn > loss.expected[q] && !loss.nak_sent[q] {
            loss.nak_sent[q] = true;
            let expected = loss.expected[q];
            self.send_nak(k.qp, n, src, expected, k.prog);
            Verdict::Discard
        } else {
            Verdict::Discard
        };
        match verdict {
            Verdict::Take => false,
            Verdict::Discard => {
                self.op_bytes[k.prog as usize].rdma_discarded += k.payload as u64;
                self.net.pkts.remove(pkt);
                true
            }
        }
    }

    /// The responder (NIC `from`) NAKs QP `qp`'s sequence error at `psn` to the requester
    /// (NIC `to`). Like an IBGDA QP's ACK it is not queued as a packet: it arrives after the
    /// unloaded path (`unloaded_ack_time`).
    fn send_nak(&mut self, qp: u32, from: u32, to: u32, psn: u32, prog: u16) {
        let wire = self.params.hdr.ack;
        self.op_bytes[prog as usize].wire += wire as u64;
        let t = self.unloaded_ack_time(from, to, wire);
        let nak =
            self.net.pkts.insert(Pkt { msg: NONE, qp, payload: psn, prog, kind: PktKind::Nak });
        self.push(t, Ev::NicDeliver { pkt: nak, qp, msg: NONE });
    }

    /// The requester gets a NAK for `psn` on `qp`: a retry, going back to `psn`.
    pub(crate) fn loss_nak(&mut self, qp: u32, psn: u32) {
        self.retry(qp, psn);
    }

    /// One retry of `qp` from `psn`, or the QP fails when its retries are used up.
    fn retry(&mut self, qp: u32, psn: u32) {
        let now = self.now;
        let Some(loss) = self.net.loss.as_mut() else { return };
        let q = qp as usize;
        if loss.failed_at[q] != Time::MAX || psn < loss.expected[q] {
            return; // failed already, or recovered meanwhile
        }
        if loss.retries[q] >= QP_RETRY_CNT {
            loss.failed_at[q] = now;
            loss.timer_at[q] = Time::MAX;
            return;
        }
        loss.retries[q] += 1;
        if self.net.qp_tx[q].active {
            // Queued at its port with the wire bytes of its next packet: go back after it.
            self.net.loss.as_mut().expect("loss state").rewind[q] = psn;
        } else {
            self.go_back(qp, psn);
        }
    }

    /// Make the message holding `psn` (and the offset of that packet in it) the QP's send
    /// cursor and schedule it: go-back-N.
    fn go_back(&mut self, qp: u32, psn: u32) {
        let loss = self.net.loss.as_ref().expect("loss state");
        let mut m = self.net.qps[qp as usize].head;
        while m != NONE {
            let first = loss.first_psn.get(m as usize).copied().unwrap_or(u32::MAX);
            let bytes = self.net.msgs.send(m).bytes();
            if first <= psn && psn < first + self.params.packets(bytes) {
                break;
            }
            m = self.net.msgs.done(m).next;
        }
        if m == NONE {
            self.violation(format!("go-back-N on QP {qp}: no outstanding message holds PSN {psn}"));
            return;
        }
        let first = loss.first_psn[m as usize];
        let skip = (psn - first) * self.params.mtu;
        self.net.loss.as_mut().expect("loss state").next_psn[qp as usize] = psn;
        self.load_send(qp, m);
        if skip > 0 {
            let q = &mut self.net.qp_tx[qp as usize];
            q.send_left -= skip;
            q.next_wire = (q.send_left.min(self.params.mtu) + self.params.hdr.data) as u16;
        }
        // Already rung once: it may go as soon as the NIC gets to it.
        let q = &mut self.net.qp_tx[qp as usize];
        q.send_ready = q.send_ready.min(self.now);
        self.kick_qp(qp);
    }

    /// The earliest ACK timer due (the world asks when the machine is quiet).
    pub fn rc_timer_due(&self) -> Option<Time> {
        let loss = self.net.loss.as_ref()?;
        loss.timer_at.iter().copied().filter(|&t| t != Time::MAX).min()
    }

    /// Fire every ACK timer due by now: the requester resends from the oldest unacknowledged
    /// PSN (a retry), unless the QP made progress since the timer started.
    pub fn fire_rc_timers(&mut self) {
        let now = self.now;
        let Some(loss) = self.net.loss.as_mut() else { return };
        let due: Vec<(u32, u32)> = (0..loss.timer_at.len())
            .filter(|&q| loss.timer_at[q] <= now)
            .map(|q| (q as u32, loss.timer_psn[q]))
            .collect();
        for (qp, psn) in due {
            let loss = self.net.loss.as_mut().expect("loss state");
            let q = qp as usize;
            loss.timer_at[q] = Time::MAX;
            if loss.expected[q] != psn {
                continue; // progress since the timer started
            }
            // The responder NAKs a gap only once: after a timeout it may NAK again.
            loss.nak_sent[q] = false;
            self.retry(qp, psn);
        }
    }

    /// The QPs that failed, in words, for a timeout's message: how many, the first one.
    pub fn failed_qps(&self) -> Vec<String> {
        let Some(loss) = self.net.loss.as_ref() else { return Vec::new() };
        let Some((qp, at)) = loss.failed().min_by_key(|&(qp, at)| (at, qp)) else {
            return Vec::new();
        };
        let l = self.net.qp_labels[qp as usize];
        vec![format!(
            "{} QP(s) failed with IBV_WC_RETRY_EXC_ERR (transport retry counter exceeded: \
             retry_cnt {QP_RETRY_CNT} retries of the {:.2} s local ACK timeout), the first at {}: \
             QP {} of job {} rank {} -> rank {}; DeepEP's IBGDA layer does not check error \
             completions, so its kernels wait",
            loss.failed().count(),
            local_ack_timeout(QP_TIMEOUT_EXPONENT) as f64 / 1e12,
            self.faults.run_time_words(at),
            l.index,
            l.job,
            l.src_rank,
            l.dst_rank
        )]
    }

    /// Messages still posted on failed QPs: they never complete (flushed with an error on
    /// hardware), so the end-of-run count of messages leaves them out.
    pub fn messages_on_failed_qps(&self) -> usize {
        let Some(loss) = self.net.loss.as_ref() else { return 0 };
        let mut count = 0;
        for (qp, _) in loss.failed() {
            let mut m = self.net.qps[qp as usize].head;
            while m != NONE {
                count += 1;
                m = self.net.msgs.done(m).next;
            }
        }
        count
    }
}
