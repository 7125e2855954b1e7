//! `EPTWIN_LL_TIMES=1`: when the low-latency combine's blocks ended their send groups, started
//! their receive loop (first rank's flags seen) and ended it, logged after the host-checked iteration (a measurement aid: it tells a send
//! phase whose groups all end together, bound by a rate, from one whose last groups end late).

use super::LlJob;
use crate::error::HwError;
use crate::exec::Devices;
use crate::probes::percentiles;

/// Stamps per block (low_latency.cu `LL_TIME_WORDS`): start, one per send group slot
/// (`LL_MAX_GROUPS`), receive loop end, receive loop start.
pub(super) const LL_TIME_WORDS: usize = 3 + LL_MAX_GROUPS;
const LL_MAX_GROUPS: usize = 32;

/// The stamps of one GPU's blocks as µs after its first block started: block starts, each
/// send group's end, each block's send end (its last group), each receive loop's start and end,
/// and each block's receive span (end − start).
pub(super) struct CombineTimes {
    pub starts: Vec<f64>,
    pub group_ends: Vec<f64>,
    pub send_ends: Vec<f64>,
    pub recv_starts: Vec<f64>,
    pub recv_ends: Vec<f64>,
    pub recv_spans: Vec<f64>,
}

impl CombineTimes {
    /// From the downloaded words: `groups` send groups per block; a zero stamp (a group slot
    /// the kernel does not use) is skipped.
    pub fn from_words(words: &[u64], groups: usize) -> CombineTimes {
        let blocks: Vec<&[u64]> = words.chunks_exact(LL_TIME_WORDS).collect();
        let first = blocks.iter().map(|b| b[0]).filter(|&t| t > 0).min().unwrap_or(0);
        let us = |t: u64| t.saturating_sub(first) as f64 / 1e3;
        let mut t = CombineTimes {
            starts: Vec::new(),
            group_ends: Vec::new(),
            send_ends: Vec::new(),
            recv_starts: Vec::new(),
            recv_ends: Vec::new(),
            recv_spans: Vec::new(),
        };
        for b in blocks {
            if b[0] == 0 {
                continue;
            }
            t.starts.push(us(b[0]));
            let ends: Vec<f64> = b[1..1 + groups.min(LL_MAX_GROUPS)]
                .iter()
                .filter(|&&g| g > 0)
                .map(|&g| us(g))
                .collect();
            if let Some(last) = ends.iter().copied().reduce(f64::max) {
                t.send_ends.push(last);
            }
            t.group_ends.extend(ends);
            let (start, end) = (b[2 + LL_MAX_GROUPS], b[1 + LL_MAX_GROUPS]);
            if start > 0 {
                t.recv_starts.push(us(start));
            }
            if end > 0 {
                t.recv_ends.push(us(end));
            }
            if start > 0 && end >= start {
                t.recv_spans.push((end - start) as f64 / 1e3);
            }
        }
        t
    }

    pub fn line(&mut self) -> String {
        format!(
            "block starts {}; send groups' last items {}; blocks' send ends {}; receive starts {}; \
             receive ends {}; receive spans {}",
            percentiles(&mut self.starts),
            percentiles(&mut self.group_ends),
            percentiles(&mut self.send_ends),
            percentiles(&mut self.recv_starts),
            percentiles(&mut self.recv_ends),
            percentiles(&mut self.recv_spans)
        )
    }
}

impl LlJob {
    /// `EPTWIN_LL_TIMES=1`: the last combine launch's stamps, per GPU.
    pub(super) fn report_combine_times(&self, devs: &Devices) -> Result<(), HwError> {
        for (i, buf) in self.block_times.iter().enumerate() {
            let mut words = vec![0u64; buf.bytes / 8];
            devs.list[i].gpu.download(buf.ptr, &mut words)?;
            let groups = (self.launch.threads / 32 / super::WARPS_PER_GROUP as u32) as usize;
            let mut t = CombineTimes::from_words(&words, groups);
            tracing::info!(
                "GPU {}: low-latency combine times (us after the first block's start): {}",
                devs.list[i].gpu.ordinal,
                t.line()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_become_us_after_the_first_start_and_unused_slots_are_skipped() {
        let mut words = vec![0u64; 2 * LL_TIME_WORDS];
        // Block 0 starts at 1,000 ns; groups end at 11,000 and 21,000; receive 25,000–41,000.
        words[0] = 1_000;
        words[1] = 11_000;
        words[2] = 21_000;
        words[1 + LL_MAX_GROUPS] = 41_000;
        words[2 + LL_MAX_GROUPS] = 25_000;
        // Block 1 starts at 2,000 ns; one group at 6,000; receive end at 31,000, no start stamp.
        let b1 = LL_TIME_WORDS;
        words[b1] = 2_000;
        words[b1 + 1] = 6_000;
        words[b1 + 1 + LL_MAX_GROUPS] = 31_000;
        let t = CombineTimes::from_words(&words, 8);
        assert_eq!(t.starts, vec![0.0, 1.0]);
        assert_eq!(t.group_ends, vec![10.0, 20.0, 5.0]);
        assert_eq!(t.send_ends, vec![20.0, 5.0]);
        assert_eq!(t.recv_ends, vec![40.0, 30.0]);
        assert_eq!(t.recv_starts, vec![24.0]);
        assert_eq!(t.recv_spans, vec![16.0]);
    }
}
