//! Simulated time and rates. Time is an integer count of picoseconds (`Time`, u64: 2^64 ps is
//! 213 days, far beyond any run). Rates are fixed-point picoseconds per byte so that every
//! serialization time is integer arithmetic: identical on every machine, no float rounding.

/// Simulated time in picoseconds.
pub type Time = u64;

pub const PS_PER_NS: Time = 1_000;
pub const PS_PER_US: Time = 1_000_000;

/// Nanoseconds (a profile value) to simulated time.
#[inline]
pub const fn ns(value: u64) -> Time {
    value * PS_PER_NS
}

/// Fractional bits of [`Rate`].
const RATE_SHIFT: u32 = 24;

/// A transfer rate as picoseconds per byte, fixed point with 24 fractional bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Rate(u64);

impl Rate {
    /// A rate from GB/s (10^9 bytes per second). `gbps` must be positive and finite.
    pub fn from_gbps(gbps: f64) -> Rate {
        assert!(gbps.is_finite() && gbps > 0.0, "rate must be positive, got {gbps} GB/s");
        // 1 GB/s = 1 byte per ns = 1000 ps per byte.
        let ps_per_byte = 1000.0 / gbps;
        Rate((ps_per_byte * (1u64 << RATE_SHIFT) as f64).round().max(1.0) as u64)
    }

    /// Time to move `bytes` at this rate (rounded up to a whole picosecond).
    #[inline]
    pub fn time(self, bytes: u64) -> Time {
        let wide = bytes as u128 * self.0 as u128;
        (wide.div_ceil(1u128 << RATE_SHIFT)) as Time
    }

    pub fn gbps(self) -> f64 {
        1000.0 * (1u64 << RATE_SHIFT) as f64 / self.0 as f64
    }

    /// The slower of two rates.
    pub fn slower(self, other: Rate) -> Rate {
        Rate(self.0.max(other.0))
    }

    /// This rate divided among `n` equal sharers.
    pub fn shared(self, n: u32) -> Rate {
        Rate(self.0 * n.max(1) as u64)
    }
}

/// Format picoseconds as microseconds for messages.
pub fn fmt_us(t: Time) -> String {
    format!("{:.3} us", t as f64 / PS_PER_US as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_round_trip() {
        let r = Rate::from_gbps(50.0);
        assert_eq!(r.time(4096), 81_920);
        assert!((r.gbps() - 50.0).abs() < 1e-6);
        let fast = Rate::from_gbps(2135.0);
        // 1 GiB in 0.503 ms (fabric.md §7); exact 502,923,571 ps, fixed point within a ns.
        assert!(fast.time(1 << 30).abs_diff(502_923_571) < 1_000);
        assert_eq!(r.shared(2).time(100), 4_000);
        assert_eq!(r.slower(fast), r);
    }
}
