//! Go `time.Duration` syntax (`1m30s`, `5m`, `300ms`, `1.5h`, `-2s`), parsed and printed as Go
//! does (`time.ParseDuration`, `Duration.String`).

use std::time::Duration;

/// What is wrong with a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not Go duration syntax.
    #[error("time: invalid duration {0:?}")]
    Invalid(String),
    /// Too large (Go's limit is about 290 years).
    #[error("time: invalid duration {0:?} (out of range)")]
    Overflow(String),
    /// A negative duration where none is allowed.
    #[error("duration {0:?} must not be negative")]
    Negative(String),
}

fn unit(u: &str) -> Option<u128> {
    Some(match u {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// `time.ParseDuration`: signed nanoseconds.
pub fn parse_signed(s: &str) -> Result<i64, DurationError> {
    let invalid = || DurationError::Invalid(s.to_owned());
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let int = &rest[..int_end];
        rest = &rest[int_end..];
        let mut frac = "";
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            frac = &r[..end];
            rest = &r[end..];
        }
        if int.is_empty() && frac.is_empty() {
            return Err(invalid());
        }
        let unit_end = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        let u = unit(&rest[..unit_end]).ok_or_else(invalid)?;
        rest = &rest[unit_end..];
        let overflow = || DurationError::Overflow(s.to_owned());
        let mut v: u128 = 0;
        for b in int.bytes() {
            v = v
                .checked_mul(10)
                .and_then(|v| v.checked_add(u128::from(b - b'0')))
                .ok_or_else(overflow)?;
            if v > u128::from(u64::MAX) {
                return Err(overflow());
            }
        }
        let mut nanos = v.checked_mul(u).ok_or_else(overflow)?;
        // Fraction: truncated to nanoseconds, as Go does.
        let mut scale = u;
        for b in frac.bytes() {
            scale /= 10;
            if scale == 0 {
                break;
            }
            nanos += u128::from(b - b'0') * scale;
        }
        total = total.checked_add(nanos).ok_or_else(overflow)?;
        if total > i64::MAX as u128 {
            return Err(overflow());
        }
    }
    let total = i64::try_from(total).map_err(|_| DurationError::Overflow(s.to_owned()))?;
    Ok(if neg { -total } else { total })
}

/// Parses a non-negative duration.
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let n = parse_signed(s)?;
    if n < 0 {
        return Err(DurationError::Negative(s.to_owned()));
    }
    Ok(Duration::from_nanos(n.unsigned_abs()))
}

/// `Duration.String()`: `1m30s`, `5m0s`, `0s`, `1.5s`, `300ms`.
#[must_use]
pub fn format(d: Duration) -> String {
    let n = d.as_nanos();
    if n == 0 {
        return "0s".to_owned();
    }
    if n < 1_000_000_000 {
        let (v, unit, div) = if n < 1_000 {
            return format!("{n}ns");
        } else if n < 1_000_000 {
            (n, "µs", 1_000)
        } else {
            (n, "ms", 1_000_000)
        };
        return format!("{}{unit}", frac(v, div));
    }
    let h = n / 3_600_000_000_000;
    let m = (n / 60_000_000_000) % 60;
    let s = n % 60_000_000_000;
    let secs = format!("{}s", frac(s, 1_000_000_000));
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

fn frac(v: u128, div: u128) -> String {
    let whole = v / div;
    let rem = v % div;
    if rem == 0 {
        return whole.to_string();
    }
    let width = div.to_string().len() - 1;
    let digits = format!("{rem:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_cases() {
        // After Go's time/time_test.go parseDurationTests.
        for (s, n) in [
            ("0", 0),
            ("5s", 5_000_000_000),
            ("30s", 30_000_000_000),
            ("1478s", 1_478_000_000_000),
            ("-5s", -5_000_000_000),
            ("+5s", 5_000_000_000),
            ("-0", 0),
            ("5.0s", 5_000_000_000),
            ("5.6s", 5_600_000_000),
            ("5.s", 5_000_000_000),
            (".5s", 500_000_000),
            ("1.0s", 1_000_000_000),
            ("10ns", 10),
            ("11us", 11_000),
            ("12µs", 12_000),
            ("13ms", 13_000_000),
            ("14s", 14_000_000_000),
            ("15m", 900_000_000_000),
            ("16h", 57_600_000_000_000),
            ("3h30m", 12_600_000_000_000),
            ("10.5s4m", 250_500_000_000),
            ("1m30s", 90_000_000_000),
            ("1h1m1s", 3_661_000_000_000),
        ] {
            assert_eq!(parse_signed(s), Ok(n), "{s}");
        }
        for bad in [
            "",
            "3",
            "-",
            "s",
            ".",
            "-.",
            ".s",
            "+.s",
            "1d",
            "1.1.1s",
            "9223372036854775808ns",
            "100000000000000h",
            "5m ",
            "NaN",
        ] {
            assert!(parse_signed(bad).is_err(), "{bad}");
        }
        assert!(parse("-1s").is_err());
    }

    #[test]
    fn formats() {
        for (n, s) in [
            (0, "0s"),
            (1, "1ns"),
            (1_100, "1.1µs"),
            (2_200_000, "2.2ms"),
            (3_300_000_000, "3.3s"),
            (240_000_000_000, "4m0s"),
            (90_000_000_000, "1m30s"),
            (300_000_000_000, "5m0s"),
            (18_000_000_000_000, "5h0m0s"),
            (3_661_000_000_000, "1h1m1s"),
        ] {
            assert_eq!(format(Duration::from_nanos(n)), s);
        }
    }
}
