//! Warps sharing the GPU's memory bandwidth (the low-latency combine's send phase, the
//! low-latency dispatch's receive): every warp
//! that is copying gets an equal share of the L2/HBM rate, no more than its own latency chain
//! allows (`warp_row_hbm_ns`) and no more than its SM's port shared by the SM's copying warps;
//! between copies a warp waits out its dependent loads, and a group's warps meet at a barrier
//! after each item.
//!
//! Why not the FIFO servers the other steps use: a FIFO server gives the bandwidth to whichever
//! step was issued first, so a group with little work ends early and the phase ends when the
//! server's bytes are done, a warp's chain after the last issue. On the GPU the warps share it:
//! the warps with the most rows are still copying when the rest are done, each then held to its
//! own chain's rate with the memory system partly idle. At 128 tokens (about two rows per warp,
//! up to five) that tail is what the send phase spends beyond its bytes at the full rate; at
//! 4096 (about 62 rows per warp) the work evens out and the phase ends near the rate bound
//! (docs/calibration.md, "The low-latency combine's send phase and dispatch's receive").
//!
//! The solver is a fluid model, exact between events: each SM's copying warps progress at one
//! rate, so each SM keeps a virtual clock of the work one of its copies has received, and a
//! copy ends when that clock passes its start plus its work. Rates are f64 (IEEE-754 basic
//! operations, the same on every machine); what leaves the solver is integer picoseconds.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::core::time::Time;

/// One step of a warp's program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// A dependent load, an atomic, a release: the warp waits, moving no bytes.
    Wait(Time),
    /// The warp waits until this time after the start (a flag another phase sets then).
    Until(Time),
    /// A copy needing `work` picoseconds of the whole GPU's memory rate.
    Copy(Time),
    /// The group's named barrier: the warp waits until every warp of its group is here.
    Barrier,
}

/// The shared rates, in picoseconds of the whole GPU's memory work per picosecond.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rates {
    /// One warp alone: `work` of a plain copy per its latency chain.
    pub warp: f64,
    /// One SM's port, shared by its copying warps.
    pub sm: f64,
}

/// Warps: SM, group, program. Groups are numbered 0..groups; every warp of a group has the same
/// number of barriers.
pub(super) struct Warp {
    pub sm: u32,
    pub group: u32,
    pub steps: Vec<Step>,
}

/// When each group's barriers opened, in order, relative to the start (all warps start at 0).
pub(super) fn run(warps: &[Warp], groups: usize, sms: usize, rates: Rates) -> Vec<Vec<Time>> {
    let n = warps.len();
    let mut pc = vec![0usize; n];
    let mut at_barrier = vec![0usize; groups];
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); groups];
    for (i, w) in warps.iter().enumerate() {
        members[w.group as usize].push(i as u32);
    }
    let mut opened: Vec<Vec<Time>> = vec![Vec::new(); groups];
    // Per SM: copying warps, virtual clock, its copies' ends on that clock.
    let mut copying = vec![0u32; sms];
    let mut clock = vec![0f64; sms];
    let mut ends: Vec<BinaryHeap<Reverse<(u64, u32)>>> = vec![BinaryHeap::new(); sms];
    // Waits: (end time in ps as f64 bits, warp). Non-negative f64s order as their bits.
    let mut waits: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::new();
    let mut now = 0f64;
    let mut ready: Vec<u32> = (0..n as u32).collect();
    let mut rate = vec![0f64; sms];
    loop {
        // Start the next step of every warp that finished one.
        while let Some(w) = ready.pop() {
            let wu = w as usize;
            let Some(&step) = warps[wu].steps.get(pc[wu]) else { continue };
            match step {
                Step::Wait(d) => waits.push(Reverse(((now + d as f64).to_bits(), w))),
                Step::Until(t) => waits.push(Reverse(((now.max(t as f64)).to_bits(), w))),
                Step::Copy(work) => {
                    let s = warps[wu].sm as usize;
                    copying[s] += 1;
                    ends[s].push(Reverse(((clock[s] + work as f64).to_bits(), w)));
                }
                Step::Barrier => {
                    let g = warps[wu].group as usize;
                    at_barrier[g] += 1;
                    if at_barrier[g] == members[g].len() {
                        at_barrier[g] = 0;
                        opened[g].push((now - 1e-6).ceil().max(0.0) as Time);
                        for &m in &members[g] {
                            pc[m as usize] += 1;
                            ready.push(m);
                        }
                    }
                }
            }
        }
        share(&copying, rates, &mut rate);
        // The next event: a wait ending or a copy ending.
        let mut next = waits.peek().map_or(f64::INFINITY, |Reverse((t, _))| f64::from_bits(*t));
        for s in 0..sms {
            if let Some(Reverse((end, _))) = ends[s].peek() {
                let left = (f64::from_bits(*end) - clock[s]).max(0.0);
                next = next.min(now + left / rate[s]);
            }
        }
        if !next.is_finite() {
            break;
        }
        let dt = next - now;
        now = next;
        for s in 0..sms {
            if copying[s] > 0 {
                clock[s] += rate[s] * dt;
            }
        }
        // Everything due by now (within rounding of the clocks' sums).
        while let Some(&Reverse((t, w))) = waits.peek() {
            if f64::from_bits(t) > now {
                break;
            }
            waits.pop();
            pc[w as usize] += 1;
            ready.push(w);
        }
        for s in 0..sms {
            let tol = 1e-9 * clock[s].max(1.0);
            while let Some(&Reverse((end, w))) = ends[s].peek() {
                if f64::from_bits(end) > clock[s] + tol {
                    break;
                }
                ends[s].pop();
                copying[s] -= 1;
                pc[w as usize] += 1;
                ready.push(w);
            }
        }
        // Deterministic order for the warps that finish together.
        ready.sort_unstable_by(|a, b| b.cmp(a));
    }
    opened
}

/// Each SM's rate per copying warp: an equal share of the GPU (1 ps of work per ps), capped
/// by the warp's own rate and the SM's port shared by its copying warps (water-filling). An
/// SM's cap depends only on how many of its warps copy, so the fill runs over those counts.
fn share(copying: &[u32], rates: Rates, rate: &mut [f64]) {
    let cap = |c: u32| rates.warp.min(rates.sm / c as f64);
    let most = copying.iter().copied().max().unwrap_or(0) as usize;
    let mut sms_with = vec![0u32; most + 1];
    for &c in copying {
        sms_with[c as usize] += 1;
    }
    let mut warps_left: f64 = copying.iter().map(|&c| c as f64).sum();
    let mut left = 1.0f64;
    let mut level = f64::INFINITY;
    // The most copying warps, the lowest cap: fill from there.
    for c in (1..=most).rev() {
        if sms_with[c] == 0 {
            continue;
        }
        let k = (sms_with[c] * c as u32) as f64;
        if cap(c as u32) * warps_left <= left {
            left -= cap(c as u32) * k;
            warps_left -= k;
        } else {
            level = left / warps_left;
            break;
        }
    }
    for (s, &c) in copying.iter().enumerate() {
        rate[s] = if c > 0 { cap(c).min(level) } else { 0.0 };
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const WIDE: Rates = Rates { warp: 1.0, sm: 1.0 };

    fn warp(sm: u32, group: u32, steps: Vec<Step>) -> Warp {
        Warp { sm, group, steps }
    }

    #[test]
    fn one_warp_alone_runs_at_its_own_rate() {
        // Work 1,000 ps at 0.25 of the GPU: 4,000 ps, after a 500 ps wait.
        let w = [warp(0, 0, vec![Step::Wait(500), Step::Copy(1000), Step::Barrier])];
        let r = run(&w, 1, 1, Rates { warp: 0.25, sm: 1.0 });
        assert_eq!(r, vec![vec![4500]]);
    }

    #[test]
    fn warps_share_the_gpu_equally_and_the_rest_speeds_up() {
        // Two warps on two SMs, work 1,000 and 3,000, the GPU's rate 1: both at 0.5 until 2,000,
        // then the second alone at 1: done at 4,000, the work's time at the full rate.
        let w = [
            warp(0, 0, vec![Step::Copy(1000), Step::Barrier]),
            warp(1, 1, vec![Step::Copy(3000), Step::Barrier]),
        ];
        assert_eq!(run(&w, 2, 2, WIDE), vec![vec![2000], vec![4000]]);
        // Held to 0.6 a warp: the second ends at 2,000 + 2,000 / 0.6.
        let r = run(&w, 2, 2, Rates { warp: 0.6, sm: 1.0 });
        assert_eq!(r, vec![vec![2000], vec![5334]]);
    }

    #[test]
    fn an_sm_port_is_shared_by_its_warps_and_a_barrier_waits_for_the_group() {
        // Three warps of one group on one SM whose port does 0.3: 0.1 each.
        let w: Vec<Warp> =
            (0..3).map(|_| warp(0, 0, vec![Step::Copy(100), Step::Barrier])).collect();
        assert_eq!(run(&w, 1, 1, Rates { warp: 1.0, sm: 0.3 }), vec![vec![1000]]);
        // A warp with a longer wait holds its group at the barrier; then both copy again.
        let w = [
            warp(0, 0, vec![Step::Wait(700), Step::Barrier, Step::Copy(100), Step::Barrier]),
            warp(1, 0, vec![Step::Wait(100), Step::Barrier, Step::Copy(100), Step::Barrier]),
        ];
        assert_eq!(run(&w, 1, 2, WIDE), vec![vec![700, 900]]);
    }

    #[test]
    fn until_waits_for_a_time_not_a_duration() {
        // 300 ps of wait, then until 1,000 (700 more); until 200 once past it costs nothing.
        let w =
            [warp(0, 0, vec![Step::Wait(300), Step::Until(1000), Step::Until(200), Step::Barrier])];
        assert_eq!(run(&w, 1, 1, WIDE), vec![vec![1000]]);
    }

    proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(64))]
        /// The phase never ends before its work at the GPU's full rate, nor before its slowest
        /// warp's chain alone; and it ends no later than every warp's work one after another
        /// (the rate of one warp at the least).
        #[test]
        fn the_phase_lies_between_its_bounds(
            progs in prop::collection::vec(
                (0u32..4, prop::collection::vec((0u64..2000, 1u64..5000), 1..5)), 1..24),
            warp_rate in 0.05f64..1.0,
        ) {
            let rates = Rates { warp: warp_rate, sm: 1.0 };
            let warps: Vec<Warp> = progs.iter().enumerate().map(|(i, (sm, steps))| {
                let mut s: Vec<Step> =
                    steps.iter().flat_map(|&(d, w)| [Step::Wait(d), Step::Copy(w)]).collect();
                s.push(Step::Barrier);
                warp(*sm, i as u32, s)
            }).collect();
            let r = run(&warps, warps.len(), 4, rates);
            let end = r.iter().map(|g| g[0]).max().unwrap() as f64;
            let work: f64 = progs.iter().flat_map(|(_, s)| s.iter().map(|&(_, w)| w as f64)).sum();
            let chains = progs.iter().map(|(_, s)| {
                s.iter().map(|&(d, w)| d as f64 + w as f64 / warp_rate).sum::<f64>()
            });
            let longest = chains.clone().fold(0.0, f64::max);
            let serial: f64 = chains.sum();
            prop_assert!(end + 1.0 >= work, "{end} < {work}");
            prop_assert!(end + 1.0 >= longest, "{end} < {longest}");
            prop_assert!(end <= serial + 1.0, "{end} > {serial}");
        }
    }
}
