//! Output-port arbitration between virtual lanes (InfiniBand) or priorities (RoCE).
//!
//! InfiniBand follows docs/design.md, fabric §1.1 step by step: a High and a Low table of (VL,
//! weight) entries, weights in 64-byte blocks, the current entry keeps serving its VL until its
//! weight is used up (a packet in flight may overshoot), `high_limit` bounds the high-priority
//! bytes (units of 4 KiB; 0 = one packet; 255 = unbounded) before exactly one low packet is sent.
//! RoCE: strict-priority traffic classes first (highest first), then deficit round robin over
//! the ETS shares (docs/design.md, fabric §5); a class with a 0 % share only gets otherwise idle
//! time.

use eptwin_engine::api::{FabricKind, FabricQos, HIGH_LIMIT_UNBOUNDED, VlArbEntry};

/// Lanes a port arbitrates between (IB data VLs 0..=14, RoCE priorities 0..=7).
pub const MAX_LANES: usize = 15;

/// Bit set of lanes that have an eligible packet (head fits in the downstream credits).
pub type LaneMask = u16;

/// The fabric-wide arbitration configuration (every port uses the same tables).
#[derive(Debug, Clone)]
pub struct ArbConfig {
    pub kind: FabricKind,
    pub high: Vec<VlArbEntry>,
    pub low: Vec<VlArbEntry>,
    /// The tables as position masks, so a pick is a few bit operations instead of a scan.
    high_t: TableIndex,
    low_t: TableIndex,
    /// `high_limit × 4096` bytes; `None` = unbounded (255).
    pub high_limit_bytes: Option<u64>,
    /// RoCE: strict classes (bit set) and DRR quanta (bytes per round) per class.
    pub strict: LaneMask,
    pub quantum: [u32; 8],
}

/// Bytes of DRR quantum per ETS percent: a 4 KiB packet per 1 % keeps DRR rounds short while
/// every class with a share sends at least one MTU packet per round.
const ETS_QUANTUM_PER_PERCENT: u32 = 4096;

impl ArbConfig {
    pub fn new(qos: &FabricQos) -> ArbConfig {
        let mut strict = 0;
        for &tc in &qos.strict_tcs {
            strict |= 1 << tc;
        }
        let mut quantum = [0u32; 8];
        for (q, &share) in quantum.iter_mut().zip(&qos.ets_tc_bw) {
            *q = share as u32 * ETS_QUANTUM_PER_PERCENT;
        }
        ArbConfig::build(
            qos.kind,
            qos.vlarb_high.clone(),
            qos.vlarb_low.clone(),
            (qos.high_limit != HIGH_LIMIT_UNBOUNDED).then_some(qos.high_limit as u64 * 4096),
            strict,
            quantum,
        )
    }

    pub fn build(
        kind: FabricKind,
        high: Vec<VlArbEntry>,
        low: Vec<VlArbEntry>,
        high_limit_bytes: Option<u64>,
        strict: LaneMask,
        quantum: [u32; 8],
    ) -> ArbConfig {
        ArbConfig {
            kind,
            high_t: TableIndex::new(&high),
            low_t: TableIndex::new(&low),
            high,
            low,
            high_limit_bytes,
            strict,
            quantum,
        }
    }

    /// Lanes the arbiter can ever schedule (IB: an entry with weight > 0; RoCE: all).
    pub fn schedulable(&self) -> LaneMask {
        match self.kind {
            FabricKind::Roce => 0xFF,
            FabricKind::Infiniband => self
                .high
                .iter()
                .chain(&self.low)
                .filter(|e| e.weight > 0)
                .fold(0, |m, e| m | 1 << e.vl.0),
        }
    }

    pub fn is_high(&self, lane: u8) -> bool {
        self.high.iter().any(|e| e.vl.0 == lane && e.weight > 0)
    }
}

/// An arbitration table as bit masks: per lane, the positions of its entries with weight > 0.
#[derive(Debug, Clone, Default)]
struct TableIndex {
    /// Entries (≤ 64 for the masks to apply; longer tables are scanned).
    n: usize,
    fast: bool,
    pos: [u64; MAX_LANES],
    weight: Vec<i32>,
    /// Lanes with an entry of weight > 0.
    lanes: LaneMask,
}

impl TableIndex {
    fn new(table: &[VlArbEntry]) -> TableIndex {
        let mut t = TableIndex {
            n: table.len(),
            fast: table.len() <= 64,
            weight: table.iter().map(|e| e.weight as i32).collect(),
            ..Default::default()
        };
        for (i, e) in table.iter().enumerate() {
            if e.weight == 0 {
                continue;
            }
            if (e.vl.0 as usize) < MAX_LANES {
                t.lanes |= 1 << e.vl.0;
                if t.fast {
                    t.pos[e.vl.0 as usize] |= 1 << i;
                }
            } else {
                t.fast = false;
            }
        }
        t
    }
}

/// Per-port arbiter state (InfiniBand tables; 16 bytes, it lives in the port's hot record).
#[derive(Debug, Clone, Copy, Default)]
pub struct ArbState {
    high_idx: u8,
    low_idx: u8,
    /// Which table the last pick came from (for `sent`).
    last_high: bool,
    high_rem: i32,
    low_rem: i32,
    /// High-priority bytes since the last low-priority opportunity (saturating: it is only
    /// compared with `high_limit` × 4 KiB ≤ 1 MiB).
    high_bytes: u32,
}

/// Per-port RoCE deficit round robin state (kept apart: InfiniBand ports never touch it).
#[derive(Debug, Clone, Copy, Default)]
pub struct DrrState {
    deficit: [i64; 8],
    rr: u8,
    fresh: bool,
}

impl DrrState {
    pub fn new() -> DrrState {
        DrrState { fresh: true, ..Default::default() }
    }
}

/// What the arbiter picked: the lane, and whether a low lane was passed over because the
/// high table kept the port (the starvation monitor watches these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    pub lane: u8,
    pub bypassed: LaneMask,
}

impl ArbState {
    pub fn new(cfg: &ArbConfig) -> ArbState {
        ArbState {
            high_rem: cfg.high.first().map_or(0, |e| e.weight as i32),
            low_rem: cfg.low.first().map_or(0, |e| e.weight as i32),
            ..Default::default()
        }
    }

    /// Choose the lane to send next among `eligible`; `size_of(lane)` gives the head packet's
    /// wire bytes (RoCE DRR needs it). `None` when nothing eligible is schedulable.
    pub fn pick(
        &mut self,
        cfg: &ArbConfig,
        drr: &mut DrrState,
        eligible: LaneMask,
        size_of: impl Fn(u8) -> u32,
    ) -> Option<Pick> {
        if eligible == 0 {
            return None;
        }
        match cfg.kind {
            FabricKind::Infiniband => self.pick_ib(cfg, eligible),
            FabricKind::Roce => drr.pick(cfg, eligible, size_of),
        }
    }

    fn pick_ib(&mut self, cfg: &ArbConfig, eligible: LaneMask) -> Option<Pick> {
        let low_available = eligible & cfg.low_t.lanes != 0;
        if eligible & cfg.high_t.lanes == 0 {
            // Nothing high is eligible: the high counter restarts (docs/design.md, fabric §1.1 step
            // 4).
            self.high_bytes = 0;
            let lane =
                commit(&cfg.low, &cfg.low_t, eligible, &mut self.low_idx, &mut self.low_rem)?;
            self.last_high = false;
            return Some(Pick { lane, bypassed: 0 });
        }
        let limit_reached = match cfg.high_limit_bytes {
            None => false,
            // One high packet is always allowed (limit 0 = one packet).
            Some(limit) => self.high_bytes > 0 && self.high_bytes as u64 >= limit,
        };
        if limit_reached && low_available {
            let lane =
                commit(&cfg.low, &cfg.low_t, eligible, &mut self.low_idx, &mut self.low_rem)?;
            self.high_bytes = 0;
            self.last_high = false;
            return Some(Pick { lane, bypassed: 0 });
        }
        let lane =
            commit(&cfg.high, &cfg.high_t, eligible, &mut self.high_idx, &mut self.high_rem)?;
        self.last_high = true;
        let bypassed = if low_available { eligible & cfg.low_t.lanes & !(1 << lane) } else { 0 };
        Some(Pick { lane, bypassed })
    }

    /// Account a packet of `bytes` (whole wire size) sent on the last picked lane.
    pub fn sent(&mut self, cfg: &ArbConfig, drr: &mut DrrState, lane: u8, bytes: u32) {
        match cfg.kind {
            FabricKind::Infiniband => {
                let blocks = bytes.div_ceil(64) as i32;
                if self.last_high {
                    self.high_bytes = self.high_bytes.saturating_add(bytes);
                    consume(&cfg.high_t, &mut self.high_idx, &mut self.high_rem, blocks);
                } else {
                    consume(&cfg.low_t, &mut self.low_idx, &mut self.low_rem, blocks);
                }
            }
            FabricKind::Roce => {
                if cfg.strict & (1 << lane) == 0 {
                    drr.deficit[lane as usize] -= bytes as i64;
                }
            }
        }
    }
}

impl DrrState {
    fn pick(
        &mut self,
        cfg: &ArbConfig,
        eligible: LaneMask,
        size_of: impl Fn(u8) -> u32,
    ) -> Option<Pick> {
        // Strict classes: highest class first.
        let strict = eligible & cfg.strict;
        if strict != 0 {
            let lane = 15 - strict.leading_zeros() as u8;
            return Some(Pick { lane, bypassed: 0 });
        }
        let shared = eligible & 0xFF & !cfg.strict;
        let weighted = (0..8u8)
            .filter(|&c| shared & (1 << c) != 0 && cfg.quantum[c as usize] > 0)
            .fold(0u16, |m, c| m | 1 << c);
        if weighted == 0 {
            // Only zero-share classes are waiting: they get the idle port, lowest class first.
            if shared == 0 {
                return None;
            }
            let lane = shared.trailing_zeros() as u8;
            return Some(Pick { lane, bypassed: 0 });
        }
        // Deficit round robin: the class whose turn it is gets its quantum once per turn and
        // sends while its deficit covers the head packet; then the turn moves on.
        for _ in 0..32 {
            let c = self.rr as usize;
            if weighted & (1 << c) != 0 {
                if self.fresh {
                    self.deficit[c] += cfg.quantum[c] as i64;
                    self.fresh = false;
                }
                if self.deficit[c] >= size_of(c as u8) as i64 {
                    return Some(Pick { lane: c as u8, bypassed: 0 });
                }
            } else {
                // An idle class keeps no credit (standard DRR).
                self.deficit[c] = 0;
            }
            self.rr = ((c + 1) % 8) as u8;
            self.fresh = true;
        }
        // Quanta are ≥ 4 KiB per percent, so the loop always finds a packet; be safe anyway.
        let lane = weighted.trailing_zeros() as u8;
        Some(Pick { lane, bypassed: 0 })
    }
}

/// Serve the first entry from the current one on whose lane is eligible (skipped entries
/// reload their weight; an exhausted current entry starts over with its full weight): what
/// [`find`] with `commit` does, with the table's position masks instead of a scan.
#[inline]
fn commit(
    table: &[VlArbEntry],
    t: &TableIndex,
    eligible: LaneMask,
    idx: &mut u8,
    rem: &mut i32,
) -> Option<u8> {
    if !t.fast {
        return find(table, eligible, idx, rem, true);
    }
    let mut m = 0u64;
    let mut lanes = eligible & t.lanes;
    while lanes != 0 {
        m |= t.pos[lanes.trailing_zeros() as usize];
        lanes &= lanes - 1;
    }
    if m == 0 {
        return None;
    }
    let start = *idx as usize;
    let above = m >> start;
    let i = if above != 0 {
        start + above.trailing_zeros() as usize
    } else {
        m.trailing_zeros() as usize
    };
    if i != start || *rem <= 0 {
        *rem = t.weight[i];
    }
    *idx = i as u8;
    Some(table[i].vl.0)
}

/// Find the entry to serve from the current one on. With `commit` the table position moves to
/// it (skipped entries reload their weight); without, it only answers whether one exists.
fn find(
    table: &[VlArbEntry],
    eligible: LaneMask,
    idx: &mut u8,
    rem: &mut i32,
    commit: bool,
) -> Option<u8> {
    let n = table.len();
    if n == 0 {
        return None;
    }
    let mut i = *idx as usize % n;
    let mut r = *rem;
    for _ in 0..n {
        let e = table[i];
        if e.weight > 0 && eligible & (1 << e.vl.0) != 0 {
            if r <= 0 {
                // An exhausted entry starts over with its full weight.
                r = e.weight as i32;
            }
            if commit {
                *idx = i as u8;
                *rem = r;
            }
            return Some(e.vl.0);
        }
        i = (i + 1) % n;
        r = table[i].weight as i32;
    }
    None
}

fn consume(t: &TableIndex, idx: &mut u8, rem: &mut i32, blocks: i32) {
    if t.n == 0 {
        return;
    }
    *rem -= blocks;
    if *rem <= 0 {
        let next = *idx as usize + 1;
        *idx = if next == t.n { 0 } else { next as u8 };
        *rem = t.weight[*idx as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eptwin_engine::api::Vl;
    use eptwin_engine::api::parse_vlarb;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(1000))]

        /// The position-mask pick serves the same entry, with the same remaining weight, as
        /// the scan of the table, from any position and for any eligible set.
        #[test]
        fn masked_pick_matches_the_scan(
            entries in proptest::collection::vec((0u8..10, 0u8..=255), 1..70),
            steps in proptest::collection::vec((0u16..1024, 1i32..80), 1..50),
            start in 0usize..70,
            start_rem in -5i32..300,
        ) {
            let table: Vec<VlArbEntry> =
                entries.iter().map(|&(vl, weight)| VlArbEntry { vl: Vl(vl), weight }).collect();
            let t = TableIndex::new(&table);
            let (mut idx_a, mut rem_a) = ((start % table.len()) as u8, start_rem);
            let (mut idx_b, mut rem_b) = (idx_a, rem_a);
            for (eligible, blocks) in steps {
                let a = commit(&table, &t, eligible, &mut idx_a, &mut rem_a);
                let b = find(&table, eligible, &mut idx_b, &mut rem_b, true);
                prop_assert_eq!(a, b);
                prop_assert_eq!((idx_a, rem_a), (idx_b, rem_b));
                if a.is_some() {
                    consume(&t, &mut idx_a, &mut rem_a, blocks);
                    consume(&t, &mut idx_b, &mut rem_b, blocks);
                }
            }
        }
    }

    fn cfg(high: &str, low: &str, limit: u8) -> ArbConfig {
        ArbConfig::build(
            FabricKind::Infiniband,
            parse_vlarb(high).unwrap(),
            parse_vlarb(low).unwrap(),
            (limit != 255).then_some(limit as u64 * 4096),
            0,
            [0; 8],
        )
    }

    /// Send `packets` MTU packets with every lane in `backlogged` always eligible; bytes per lane.
    fn run(cfg: &ArbConfig, backlogged: LaneMask, packets: usize, bytes: u32) -> [u64; 15] {
        let mut st = ArbState::new(cfg);
        let mut drr = DrrState::new();
        let mut out = [0u64; 15];
        for _ in 0..packets {
            let Some(p) = st.pick(cfg, &mut drr, backlogged, |_| bytes) else { break };
            st.sent(cfg, &mut drr, p.lane, bytes);
            out[p.lane as usize] += bytes as u64;
        }
        out
    }

    #[test]
    fn low_table_shares_follow_weights() {
        // docs/design.md, fabric §4 documented example, VL0 not backlogged.
        let c = cfg("0:4", "0:0,1:64,2:128,3:192,4:0,5:64,6:64,7:64", 6);
        let b = run(&c, 0b1110_1110, 10_000, 4122);
        let total: u64 = b.iter().sum();
        let weights = [0, 64, 128, 192, 0, 64, 64, 64];
        let wsum: u64 = weights.iter().sum();
        for vl in 1..8 {
            let share = b[vl] as f64 / total as f64;
            let want = weights[vl] as f64 / wsum as f64;
            assert!((share - want).abs() <= 0.02 * want.max(0.01), "VL{vl}: {share} vs {want}");
        }
    }

    #[test]
    fn high_limit_zero_six_and_unbounded() {
        // limit 0: one high packet, then one low.
        let c0 = cfg("0:255", "1:64", 0);
        let b = run(&c0, 0b11, 1000, 4122);
        assert_eq!(b[0], b[1]);
        // limit 6: 24 KiB of high (6 MTU packets ≥ 24 KiB ⇒ 6 packets of 4122 B) then one low.
        let c6 = cfg("0:255", "1:64", 6);
        let b = run(&c6, 0b11, 7000, 4122);
        assert_eq!(b[0] / 4122, 6 * (b[1] / 4122));
        // 255: low starves while high is backlogged.
        let c255 = cfg("0:255", "1:64", 255);
        let b = run(&c255, 0b11, 1000, 4122);
        assert_eq!(b[1], 0);
        // ... but gets the port when high is idle.
        let b = run(&c255, 0b10, 10, 4122);
        assert_eq!(b[1], 10 * 4122);
    }

    #[test]
    fn unlisted_lane_is_never_scheduled() {
        let c = cfg("0:4", "1:4", 0);
        assert_eq!(run(&c, 0b100, 10, 100), [0; 15]);
        assert_eq!(c.schedulable(), 0b11);
    }

    #[test]
    fn roce_strict_then_ets() {
        let mut c = cfg("", "", 255);
        c.kind = FabricKind::Roce;
        c.quantum = [40 * 4096, 0, 0, 60 * 4096, 0, 0, 0, 0];
        let b = run(&c, 0b1001, 10_000, 4096);
        let share3 = b[3] as f64 / (b[0] + b[3]) as f64;
        assert!((share3 - 0.6).abs() < 0.01, "{share3}");
        c.strict = 1 << 0;
        let b = run(&c, 0b1001, 100, 4096);
        assert_eq!(b[3], 0);
    }
}
