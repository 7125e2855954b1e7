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

/// Why a size was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeParseError {
    /// Neither a number nor a number with a known unit.
    Invalid(String),
    /// A number, but larger than the largest size (2^64 − 1 bytes).
    TooLarge(String),
    /// A number, but not a whole number of bytes (`"1.3B"`, `"1e-3"`).
    NotWhole(String),
    /// A number below zero.
    Negative(String),
}

/// Sizes that parse go up to this many bytes (the largest `u64`).
pub const MAX_SIZE_BYTES: u64 = u64::MAX;

impl fmt::Display for SizeParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeParseError::Invalid(text) => write!(
                f,
                "invalid size {text:?}: expected an integer number of bytes or a number with a \
                 unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. \"2GiB\", \"64 MiB\" or \"2e9\""
            ),
            SizeParseError::TooLarge(text) => write!(
                f,
                "size {text} is too large: sizes go up to {MAX_SIZE_BYTES} bytes (2^64 - 1)"
            ),
            SizeParseError::NotWhole(text) => {
                write!(f, "size {text} is not a whole number of bytes")
            }
            SizeParseError::Negative(text) => write!(f, "size {text} is negative"),
        }
    }
}

impl std::error::Error for SizeParseError {}

impl FromStr for ByteSize {
    type Err = SizeParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let quoted = || format!("{text:?}");
        let trimmed = text.trim();
        let (number, multiplier) = UNITS
            .iter()
            .find_map(|(suffix, mult)| trimmed.strip_suffix(suffix).map(|n| (n.trim(), *mult)))
            .unwrap_or((trimmed, 1));
        match exact_bytes(number, multiplier) {
            Ok(bytes) => Ok(ByteSize(bytes)),
            Err(NumberProblem::Syntax) => Err(SizeParseError::Invalid(text.to_string())),
            Err(NumberProblem::TooLarge) => Err(SizeParseError::TooLarge(quoted())),
            Err(NumberProblem::NotWhole) => Err(SizeParseError::NotWhole(quoted())),
            Err(NumberProblem::Negative) => Err(SizeParseError::Negative(quoted())),
        }
    }
}

enum NumberProblem {
    Syntax,
    TooLarge,
    NotWhole,
    Negative,
}

/// `number × multiplier` computed exactly from the decimal text (integer, fraction
/// `"1.5"`, exponent `"2e9"`, `_` separators): no floating point, so `"1e30"` is an overflow
/// and `"18446744073709551616"` is not rounded to the largest `u64`.
fn exact_bytes(number: &str, multiplier: u64) -> Result<u64, NumberProblem> {
    let number = number.replace('_', "");
    let (negative, unsigned) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(&number)),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (unsigned, None),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty() || !digits_ok(whole) || !digits_ok(fraction) {
        return Err(NumberProblem::Syntax);
    }
    let exponent: i64 = match exponent {
        None => 0,
        Some(e) => {
            let (sign, digits) = match e.strip_prefix('-') {
                Some(d) => (-1, d),
                None => (1, e.strip_prefix('+').unwrap_or(e)),
            };
            if digits.is_empty() || !digits_ok(digits) {
                return Err(NumberProblem::Syntax);
            }
            // Beyond 4 digits the result is 0-with-a-fraction or far past 2^64 either way.
            let digits = digits.trim_start_matches('0');
            if digits.len() > 4 {
                let zero = whole.bytes().chain(fraction.bytes()).all(|b| b == b'0');
                return match (zero, sign) {
                    (true, _) => Ok(0),
                    (false, 1) if negative => Err(NumberProblem::Negative),
                    (false, 1) => Err(NumberProblem::TooLarge),
                    _ => Err(NumberProblem::NotWhole),
                };
            }
            sign * digits.parse::<i64>().unwrap_or(0)
        }
    };
    let all_digits = format!("{whole}{fraction}");
    let significant = all_digits.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    if trimmed.is_empty() {
        return Ok(0);
    }
    if negative {
        return Err(NumberProblem::Negative);
    }
    // value = trimmed × 10^scale × multiplier
    let scale = exponent - fraction.len() as i64 + (significant.len() - trimmed.len()) as i64;
    if trimmed.len() > 38 {
        // More significant digits than u128 holds: over 2^64 whatever the scale, or a fraction.
        return Err(if scale >= 0 { NumberProblem::TooLarge } else { NumberProblem::NotWhole });
    }
    let mantissa: u128 = trimmed.parse().map_err(|_| NumberProblem::Syntax)?;
    let value = mantissa.checked_mul(multiplier as u128).ok_or(NumberProblem::TooLarge)?;
    let value = if scale >= 0 {
        let power = 10u128.checked_pow(scale as u32).ok_or(NumberProblem::TooLarge)?;
        value.checked_mul(power).ok_or(NumberProblem::TooLarge)?
    } else {
        let power = 10u128.checked_pow((-scale) as u32).ok_or(NumberProblem::NotWhole)?;
        if value % power != 0 {
            return Err(NumberProblem::NotWhole);
        }
        value / power
    };
    u64::try_from(value).map_err(|_| NumberProblem::TooLarge)
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
                // 2^64 is exactly representable; `u64::MAX as f64` rounds up to it.
                const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
                if !v.is_finite() {
                    Err(E::custom(format!("a size must be a finite number of bytes, found {v}")))
                } else if v < 0.0 {
                    Err(E::custom(format!("a size cannot be negative, found {v}")))
                } else if v.fract() != 0.0 {
                    Err(E::custom(format!("a size must be a whole number of bytes, found {v}")))
                } else if v >= TWO_POW_64 {
                    Err(E::custom(format!(
                        "size {v:e} is too large: sizes go up to {MAX_SIZE_BYTES} bytes (2^64 - 1)"
                    )))
                } else {
                    Ok(ByteSize(v as u64))
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
    fn exact_decimal_and_e_notation() {
        let parse = |t: &str| t.parse::<ByteSize>().map(|b| b.0);
        assert_eq!(parse("2e9"), Ok(2_000_000_000));
        assert_eq!(parse("2E+9"), Ok(2_000_000_000));
        assert_eq!(parse("1.5e3"), Ok(1500));
        assert_eq!(parse("0.5KiB"), Ok(512));
        assert_eq!(parse("1_000"), Ok(1000));
        assert!(parse("16EB").is_err(), "no exabyte unit");
        assert_eq!(parse("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse("1.8446744073709551615e19"), Ok(u64::MAX));
        assert_eq!(parse("0e99999"), Ok(0));
        assert_eq!(parse("1e-3"), Err(SizeParseError::NotWhole("\"1e-3\"".into())));
        assert_eq!(parse("1.3B"), Err(SizeParseError::NotWhole("\"1.3B\"".into())));
        assert_eq!(parse("-1"), Err(SizeParseError::Negative("\"-1\"".into())));
        assert!(matches!(parse("2 GiBB"), Err(SizeParseError::Invalid(_))));
        assert!(matches!(parse("e9"), Err(SizeParseError::Invalid(_))));
        assert!(matches!(parse("1e"), Err(SizeParseError::Invalid(_))));
        assert!(matches!(parse("nan"), Err(SizeParseError::Invalid(_))));
        assert!(matches!(parse("inf"), Err(SizeParseError::Invalid(_))));
    }

    #[test]
    fn overflow_is_an_error_not_saturation() {
        let parse = |t: &str| t.parse::<ByteSize>().map(|b| b.0);
        for text in ["18446744073709551616", "1e30", "16384PiB", "17179869184GiB", "1e99999"] {
            let err = parse(text).unwrap_err();
            assert!(
                matches!(err, SizeParseError::TooLarge(_))
                    || matches!(err, SizeParseError::Invalid(_)),
                "{text}: {err}"
            );
        }
        assert_eq!(
            parse("18446744073709551616").unwrap_err().to_string(),
            "size \"18446744073709551616\" is too large: sizes go up to 18446744073709551615 \
             bytes (2^64 - 1)"
        );
        assert!(matches!(parse("1e30"), Err(SizeParseError::TooLarge(_))));
        assert!(matches!(parse("17179869184GiB"), Err(SizeParseError::TooLarge(_))));
        // TOML floats take the same rules.
        let from_toml = |v: &str| {
            toml::from_str::<std::collections::BTreeMap<String, ByteSize>>(&format!("s = {v}"))
        };
        assert_eq!(from_toml("2e9").unwrap()["s"].0, 2_000_000_000);
        for bad in ["1e30", "18446744073709551616.0", "nan", "inf", "-1.0", "1.5"] {
            assert!(from_toml(bad).is_err(), "{bad}");
        }
        assert!(from_toml("1e30").unwrap_err().message().contains("too large"));
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
