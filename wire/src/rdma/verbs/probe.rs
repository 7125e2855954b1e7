//! The NIC probe `eptwin calibrate` runs on an ACTIVE port (docs/calibration.md, "The NIC"):
//! RDMA WRITE latency, bandwidth and message rate between two RC QPs of the same port
//! (loopback through the NIC, as `ib_write_lat` / `ib_write_bw` run against themselves).
//!
//! * Latency: ping-pong of 8-byte writes, each side spinning on its memory until the other's
//!   value lands; the one-way figure is half a round (post, NIC, PCIe, the poll seeing it).
//! * Bandwidth: 1 MiB writes kept 16 deep on one QP, bytes over the time.
//! * Message rate: 64-byte writes kept up to 256 deep, one completion per 32.
//!
//! Every phase is bounded in time and count: a slow stack (Soft-RoCE in an emulated VM) gives
//! fewer samples, never a hang.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{HostRegion, Nic, Qp, connect_pairs};
use crate::error::WireError;
use crate::rdma::{NicProbe, QpSettings};

/// Limits of one probe phase.
const PHASE_TIME: Duration = Duration::from_secs(2);
const LATENCY_WARMUP: u32 = 50;
const LATENCY_ROUNDS: u32 = 2_000;
const BW_MESSAGE_BYTES: u32 = 1 << 20;
const BW_WINDOW: u32 = 16;
const BW_MESSAGES: u32 = 1_024;
const RATE_MESSAGE_BYTES: u32 = 64;
const RATE_WINDOW: u32 = 256;
const RATE_SIGNAL_EVERY: u32 = 32;
const RATE_MESSAGES: u32 = 200_000;
/// How long a single write may take to land before the probe gives up.
const LAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Run the probe on `wanted` (`device[:port]`, or the first ACTIVE port).
pub fn probe_nic(wanted: Option<&str>) -> Result<NicProbe, WireError> {
    let nic = Nic::open_default(wanted)?;
    let settings = QpSettings {
        path_mtu_bytes: nic.port().active_mtu_bytes.min(4096),
        depth: RATE_WINDOW.max(BW_WINDOW) + 1,
        ..QpSettings::default()
    };
    let (mut a, mut b) =
        connect_pairs(vec![nic.create_qp(&settings)?], vec![nic.create_qp(&settings)?])?;
    let (qa, qb) = (&mut a[0], &mut b[0]);
    let (write_latency_ns, latency_rounds) = latency(&nic, qa, qb)?;
    let write_bw_gbps = stream(&nic, qa, BW_MESSAGE_BYTES, BW_WINDOW, 1, BW_MESSAGES)?
        * BW_MESSAGE_BYTES as f64
        / 1e9;
    let rate = stream(&nic, qa, RATE_MESSAGE_BYTES, RATE_WINDOW, RATE_SIGNAL_EVERY, RATE_MESSAGES)?;
    Ok(NicProbe {
        device: nic.device().name.clone(),
        port: nic.port().port,
        link_layer: nic.port().link_layer.to_string(),
        write_latency_ns,
        latency_rounds,
        write_bw_gbps,
        bw_message_bytes: BW_MESSAGE_BYTES,
        bw_window: BW_WINDOW,
        message_rate_mps: rate / 1e6,
        rate_message_bytes: RATE_MESSAGE_BYTES,
        rate_window: RATE_WINDOW,
    })
}

#[allow(clippy::disallowed_methods)] // real time: the probe's measurement
fn now() -> Instant {
    Instant::now()
}

/// Spin until `region[0]` holds `value`.
fn wait_for(nic: &Nic, region: &HostRegion, value: u64) -> Result<(), WireError> {
    let start = now();
    while region.load_u64(0) != value {
        if start.elapsed() > LAND_TIMEOUT {
            return Err(WireError::Timeout {
                site: nic.site(),
                what: format!("probe write {value} to land"),
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// Mean one-way latency (ns) of 8-byte writes bounced between `qa` and `qb`, and the rounds.
fn latency(nic: &Nic, qa: &mut Qp, qb: &mut Qp) -> Result<(f64, u32), WireError> {
    let (src_a, src_b) = (nic.register_host(8)?, nic.register_host(8)?);
    let (dst_a, dst_b) = (nic.register_host(8)?, nic.register_host(8)?);
    let (to_a, to_b) = (dst_a.remote(), dst_b.remote());
    let round = |seq: u64, qa: &mut Qp, qb: &mut Qp| -> Result<(), WireError> {
        let signaled = seq.is_multiple_of(64);
        src_a.store_u64(0, seq);
        qa.post_write(seq, &src_a, 0, 8, &to_b, 0, signaled)?;
        wait_for(nic, &dst_b, seq)?;
        src_b.store_u64(0, seq);
        qb.post_write(seq, &src_b, 0, 8, &to_a, 0, signaled)?;
        wait_for(nic, &dst_a, seq)?;
        qa.poll()?;
        qb.poll()?;
        Ok(())
    };
    for seq in 1..=LATENCY_WARMUP as u64 {
        round(seq, qa, qb)?;
    }
    let start = now();
    let mut rounds = 0u32;
    while rounds < LATENCY_ROUNDS && (rounds == 0 || start.elapsed() < PHASE_TIME) {
        round(LATENCY_WARMUP as u64 + 1 + rounds as u64, qa, qb)?;
        rounds += 1;
    }
    let elapsed_ns = start.elapsed().as_nanos() as f64;
    qa.wait_idle(LAND_TIMEOUT)?;
    qb.wait_idle(LAND_TIMEOUT)?;
    Ok((elapsed_ns / rounds as f64 / 2.0, rounds))
}

/// Writes of `bytes` kept `window` deep on `q` (a completion every `signal_every`), up to
/// `messages` or the phase's time: writes completed per second.
fn stream(
    nic: &Nic,
    q: &mut Qp,
    bytes: u32,
    window: u32,
    signal_every: u32,
    messages: u32,
) -> Result<f64, WireError> {
    let src: Arc<HostRegion> = nic.register_host(bytes as usize)?;
    let dst = nic.register_host(bytes as usize)?;
    let remote = dst.remote();
    let start = now();
    let mut posted = 0u32;
    while posted < messages && (posted < window || start.elapsed() < PHASE_TIME) {
        if q.outstanding() >= window {
            q.poll()?;
            continue;
        }
        let signaled = (posted + 1).is_multiple_of(signal_every);
        q.post_write(posted as u64, &src, 0, bytes, &remote, 0, signaled)?;
        posted += 1;
    }
    q.wait_idle(LAND_TIMEOUT)?;
    let elapsed_s = start.elapsed().as_secs_f64();
    Ok(posted as f64 / elapsed_s)
}
