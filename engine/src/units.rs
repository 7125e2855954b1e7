//! Units that appear in scenario files: byte sizes written as integers or `"2GiB"` strings.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes. Deserializes from an integer or from a string with a unit
/// (`"2GiB"`, `"64MiB"`, `"1.5KB"`, `"1e9"`); serializes back to the same form it can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

const UNITS: &[(&str, u64)] = &[
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("B", 1),
];

/// Why a size string was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeParseError(pub String);

impl fmt::Display for SizeParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid size {:?}: expected an integer number of bytes or a number with a unit \
             (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. \"2GiB\"",
            self.0
        )
    }
}

impl std::error::Error for SizeParseError {}

impl FromStr for ByteSize {
    type Err = SizeParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || SizeParseError(text.to_string());
        let trimmed = text.trim();
        let (number, multiplier) = UNITS
            .iter()
            .find_map(|(suffix, mult)| trimmed.strip_suffix(suffix).map(|n| (n.trim(), *mult)))
            .unwrap_or((trimmed, 1));
        if number.is_empty() {
            return Err(err());
        }
        if let Ok(whole) = number.replace('_', "").parse::<u64>() {
            return whole.checked_mul(multiplier).map(ByteSize).ok_or_else(err);
        }
        // Fractions ("1.5GiB") and scientific notation ("1e9", as DeepEP's tests write int(1e9)).
        let value: f64 = number.parse().map_err(|_| err())?;
        let total = value * multiplier as f64;
        if !(0.0..=u64::MAX as f64).contains(&total) || total.fract() != 0.0 {
            return Err(err());
        }
        Ok(ByteSize(total as u64))
    }
}

impl fmt::Display for ByteSize {
    /// Exact binary units where they divide evenly, plain bytes otherwise; always re-parseable.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        for (suffix, mult) in
            [("TiB", 1u64 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        {
            if bytes >= mult && bytes.is_multiple_of(mult) {
                return write!(f, "{}{}", bytes / mult, suffix);
            }
        }
        write!(f, "{bytes}")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let text = self.to_string();
        match text.parse::<u64>() {
            // TOML integers are i64: keep huge values as strings.
            Ok(plain) if plain <= i64::MAX as u64 => serializer.serialize_u64(plain),
            _ => serializer.serialize_str(&text),
        }
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: an integer number of bytes or a string like \"2GiB\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("a size cannot be negative, found {v}")))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<ByteSize, E> {
                if v >= 0.0 && v.fract() == 0.0 && v <= u64::MAX as f64 {
                    Ok(ByteSize(v as u64))
                } else {
                    Err(E::custom(format!("a size must be a whole number of bytes, found {v}")))
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Integer nanoseconds of simulated or measured time.
pub type Nanos = u64;

/// Bytes per nanosecond equals GB/s (10^9 bytes per second): the unit every bandwidth here uses.
pub fn gbps_from(bytes: f64, latency_ns: f64) -> f64 {
    if latency_ns > 0.0 { bytes / latency_ns } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_units() {
        assert_eq!("2GiB".parse::<ByteSize>().unwrap().0, 2 << 30);
        assert_eq!("64 MiB".parse::<ByteSize>().unwrap().0, 64 << 20);
        assert_eq!("1e9".parse::<ByteSize>().unwrap().0, 1_000_000_000);
        assert_eq!("1.5KiB".parse::<ByteSize>().unwrap().0, 1536);
        assert_eq!("4096".parse::<ByteSize>().unwrap().0, 4096);
        assert_eq!("12B".parse::<ByteSize>().unwrap().0, 12);
        assert!("".parse::<ByteSize>().is_err());
        assert!("-1".parse::<ByteSize>().is_err());
        assert!("1.3B".parse::<ByteSize>().is_err());
        assert!("2 parsecs".parse::<ByteSize>().is_err());
    }

    #[test]
    fn display_is_exact() {
        assert_eq!(ByteSize(2 << 30).to_string(), "2GiB");
        assert_eq!(ByteSize(1_000_000_000).to_string(), "1000000000");
        assert_eq!(ByteSize(0).to_string(), "0");
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(256))]
        #[test]
        fn display_round_trips(bytes in any::<u64>()) {
            let size = ByteSize(bytes);
            prop_assert_eq!(size.to_string().parse::<ByteSize>().unwrap(), size);
        }
    }
}
