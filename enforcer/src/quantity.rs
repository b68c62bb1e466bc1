//! Kubernetes resource quantities (`k8s.io/apimachinery/pkg/api/resource`), exactly.
//!
//! A [`Quantity`] is kept as a signed number of nano-units (`i128`) plus the format it was
//! written in (binary SI, decimal SI or decimal exponent), so that it prints back in
//! Kubernetes' canonical form (`1.5` -> `1500m`, `1.5Gi` -> `1536Mi`, `1000M` -> `1G`).
//!
//! Parsing follows apimachinery's grammar and rounding: values more precise than one nano-unit
//! round up (away from zero). One deliberate difference: apimachinery keeps decimal values
//! larger than 2^63-1 in arbitrary precision (and caps binary ones); here any value whose
//! magnitude exceeds 2^63-1 base units is an error ([`QuantityError::TooLarge`]), so no
//! arithmetic downstream can overflow.

use std::{cmp::Ordering, fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// One base unit in nano-units.
const NANO: i128 = 1_000_000_000;
/// The largest magnitude accepted, in nano-units (2^63-1 base units).
const MAX_NANOS: i128 = (i64::MAX as i128) * NANO;

/// What can be wrong with a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Empty input.
    #[error("quantity is empty")]
    Empty,
    /// Not of the form `<signedNumber><suffix>`.
    #[error(
        "quantity {0:?} must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Format(String),
    /// The suffix is not one Kubernetes knows.
    #[error("quantity {0:?} has an unknown suffix")]
    Suffix(String),
    /// The magnitude exceeds 2^63-1 base units.
    #[error("quantity {0:?} is too large (the limit is 2^63-1)")]
    TooLarge(String),
    /// An arithmetic result left the representable range.
    #[error("quantity arithmetic overflow")]
    Overflow,
}

/// How a quantity is printed, remembered from how it was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Format {
    /// `Ki`, `Mi`, ... (powers of 1024).
    BinarySI,
    /// `m`, `k`, `M`, ... or no suffix (powers of 1000).
    #[default]
    DecimalSI,
    /// `1e3`, `5E-2`.
    DecimalExponent,
}

/// A Kubernetes resource quantity. Equality and ordering compare the value only.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}
impl Eq for Quantity {}
impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}
impl std::hash::Hash for Quantity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
}

fn pow10(exp: u32) -> Option<i128> {
    10i128.checked_pow(exp)
}

impl Quantity {
    /// Zero, in the given format.
    #[must_use]
    pub const fn zero(format: Format) -> Self {
        Self { nanos: 0, format }
    }

    /// An integer number of base units (`resource.NewQuantity`).
    #[must_use]
    pub const fn from_int(value: i64, format: Format) -> Self {
        Self {
            nanos: value as i128 * NANO,
            format,
        }
    }

    /// A number of milli-units (`resource.NewMilliQuantity`).
    #[must_use]
    pub const fn from_milli(milli: i64, format: Format) -> Self {
        Self {
            nanos: milli as i128 * 1_000_000,
            format,
        }
    }

    /// From nano-units; errors when out of range.
    pub fn from_nanos(nanos: i128, format: Format) -> Result<Self, QuantityError> {
        if nanos.abs() > MAX_NANOS {
            return Err(QuantityError::Overflow);
        }
        Ok(Self { nanos, format })
    }

    /// The exact value in nano-units.
    #[must_use]
    pub const fn nanos(&self) -> i128 {
        self.nanos
    }

    /// The format this quantity prints in.
    #[must_use]
    pub const fn format(&self) -> Format {
        self.format
    }

    /// The same value printed in another format.
    #[must_use]
    pub const fn with_format(self, format: Format) -> Self {
        Self {
            nanos: self.nanos,
            format,
        }
    }

    /// `Value()`: the value in base units, rounded up (away from zero).
    #[must_use]
    pub fn value(&self) -> i64 {
        scaled_up(self.nanos, NANO)
    }

    /// `MilliValue()`: the value in milli-units, rounded up (away from zero).
    #[must_use]
    pub fn milli_value(&self) -> i64 {
        scaled_up(self.nanos, 1_000_000)
    }

    /// True for zero.
    #[must_use]
    pub const fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// -1, 0 or 1.
    #[must_use]
    pub const fn signum(&self) -> i32 {
        if self.nanos > 0 {
            1
        } else if self.nanos < 0 {
            -1
        } else {
            0
        }
    }

    /// `self + other`, keeping `self`'s format (as `Quantity.Add` does).
    pub fn checked_add(self, other: Self) -> Result<Self, QuantityError> {
        let nanos = self
            .nanos
            .checked_add(other.nanos)
            .ok_or(QuantityError::Overflow)?;
        Self::from_nanos(nanos, self.format)
    }

    /// `self - other`, keeping `self`'s format.
    pub fn checked_sub(self, other: Self) -> Result<Self, QuantityError> {
        let nanos = self
            .nanos
            .checked_sub(other.nanos)
            .ok_or(QuantityError::Overflow)?;
        Self::from_nanos(nanos, self.format)
    }

    /// `self + other`, saturating at the limits (for sums of many pods).
    #[must_use]
    pub fn saturating_add(self, other: Self) -> Self {
        let nanos = self
            .nanos
            .saturating_add(other.nanos)
            .clamp(-MAX_NANOS, MAX_NANOS);
        Self {
            nanos,
            format: self.format,
        }
    }

    /// Parses a quantity (`500m`, `1.5`, `100Mi`, `1G`, `1e3`, `-2Ki`, `.5`, `5.`).
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        parse(input)
    }

    /// Reads a `k8s_openapi` quantity.
    pub fn from_k8s(
        q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    ) -> Result<Self, QuantityError> {
        parse(q.0.trim())
    }

    /// The canonical string (`String()` in apimachinery).
    #[must_use]
    pub fn canonical(&self) -> String {
        self.to_string()
    }
}

/// `ceil(nanos / unit)` away from zero, saturating into i64.
fn scaled_up(nanos: i128, unit: i128) -> i64 {
    let q = nanos / unit;
    let r = nanos % unit;
    let v = if r > 0 {
        q + 1
    } else if r < 0 {
        q - 1
    } else {
        q
    };
    i64::try_from(v).unwrap_or(if v > 0 { i64::MAX } else { i64::MIN })
}

enum Multiplier {
    /// 10^exp.
    Decimal(i64),
    /// 1024^exp.
    Binary(u32),
}

fn suffix(input: &str, suffix: &str) -> Result<(Multiplier, Format), QuantityError> {
    let dec = |e| Ok((Multiplier::Decimal(e), Format::DecimalSI));
    let bin = |e| Ok((Multiplier::Binary(e), Format::BinarySI));
    match suffix {
        "" => dec(0),
        "n" => dec(-9),
        "u" => dec(-6),
        "m" => dec(-3),
        "k" => dec(3),
        "M" => dec(6),
        "G" => dec(9),
        "T" => dec(12),
        "P" => dec(15),
        "E" => dec(18),
        "Ki" => bin(1),
        "Mi" => bin(2),
        "Gi" => bin(3),
        "Ti" => bin(4),
        "Pi" => bin(5),
        "Ei" => bin(6),
        s if s.len() > 1 && (s.starts_with('e') || s.starts_with('E')) => {
            let digits = &s[1..];
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError::Suffix(input.to_owned()));
            }
            let exp: i64 = digits
                .parse()
                .map_err(|_| QuantityError::TooLarge(input.to_owned()))?;
            Ok((Multiplier::Decimal(exp), Format::DecimalExponent))
        }
        _ => Err(QuantityError::Suffix(input.to_owned())),
    }
}

fn parse(input: &str) -> Result<Quantity, QuantityError> {
    if input.is_empty() {
        return Err(QuantityError::Empty);
    }
    let bytes = input.as_bytes();
    let mut pos = 0;
    let mut negative = false;
    if let Some(&c) = bytes.first()
        && (c == b'+' || c == b'-')
    {
        negative = c == b'-';
        pos = 1;
    }
    let int_start = pos;
    while pos < bytes.len() && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    let int_part = &input[int_start..pos];
    let mut frac_part = "";
    if pos < bytes.len() && bytes[pos] == b'.' {
        pos += 1;
        let frac_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        frac_part = &input[frac_start..pos];
    }
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(QuantityError::Format(input.to_owned()));
    }
    let (multiplier, format) = suffix(input, &input[pos..])?;

    // Significant digits and the power of ten of the last one.
    let int_trim = int_part.trim_start_matches('0');
    let frac_trim = frac_part.trim_end_matches('0');
    let digits = Digits {
        int: int_trim.as_bytes(),
        frac: frac_trim.as_bytes(),
    };
    // value = D * 10^(-frac_len), D = the digits as an integer.
    let frac_len =
        i64::try_from(frac_trim.len()).map_err(|_| QuantityError::Format(input.to_owned()))?;
    let too_large = || QuantityError::TooLarge(input.to_owned());

    let nanos = match multiplier {
        Multiplier::Decimal(exp) => {
            // nanos = D * 10^(exp + 9 - frac_len)
            let shift = exp
                .checked_add(9)
                .and_then(|e| e.checked_sub(frac_len))
                .ok_or_else(too_large)?;
            decimal_nanos(&digits, shift).ok_or_else(too_large)?
        }
        Multiplier::Binary(exp) => {
            binary_nanos(int_trim, frac_trim, 1024i128.pow(exp) * NANO).ok_or_else(too_large)?
        }
    };
    if nanos > MAX_NANOS {
        return Err(too_large());
    }
    let nanos = if negative { -nanos } else { nanos };
    // A binary quantity between 0 and 1 prints as decimal (apimachinery does the same).
    let format = if format == Format::BinarySI && nanos.abs() < NANO && nanos != 0 {
        Format::DecimalSI
    } else {
        format
    };
    Ok(Quantity { nanos, format })
}

/// The significant digits of a number: integer part then fraction, without copying.
struct Digits<'a> {
    int: &'a [u8],
    frac: &'a [u8],
}

impl Digits<'_> {
    fn len(&self) -> usize {
        self.int.len() + self.frac.len()
    }
    fn get(&self, i: usize) -> u8 {
        let b = if i < self.int.len() {
            self.int[i]
        } else {
            self.frac[i - self.int.len()]
        };
        b - b'0'
    }
}

/// `D * 10^shift` in nano-units, rounding up what falls below one nano-unit. None on overflow.
fn decimal_nanos(digits: &Digits<'_>, shift: i64) -> Option<i128> {
    let n = digits.len();
    if n == 0 {
        return Some(0);
    }
    let len = i64::try_from(n).ok()?;
    // Digit i has the power (len - 1 - i) + shift: keep those with a power >= 0.
    let keep = usize::try_from((len.checked_add(shift)?).clamp(0, len)).ok()?;
    let mut value: i128 = 0;
    for i in 0..keep {
        value = value
            .checked_mul(10)?
            .checked_add(i128::from(digits.get(i)))?;
    }
    let sticky = (keep..n).any(|i| digits.get(i) != 0);
    let remaining = len - i64::try_from(keep).ok()? + shift;
    let value = if remaining > 0 {
        apply_shift(value, remaining)?
    } else {
        value
    };
    Some(value + i128::from(sticky))
}

/// `(int.frac) * unit` where `unit` is the multiplier in nano-units, rounding up. None on
/// overflow.
fn binary_nanos(int: &str, frac: &str, unit: i128) -> Option<i128> {
    let mut whole: i128 = 0;
    for b in int.bytes() {
        whole = whole.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
    }
    let whole = whole.checked_mul(unit)?;
    // floor(unit * 0.frac) by nested division from the last digit; any remainder rounds up.
    let mut acc: i128 = 0;
    let mut sticky = false;
    for b in frac.bytes().rev() {
        let t = unit.checked_mul(i128::from(b - b'0'))?.checked_add(acc)?;
        sticky |= t % 10 != 0;
        acc = t / 10;
    }
    whole.checked_add(acc)?.checked_add(i128::from(sticky))
}

/// `value * 10^shift` for `shift >= 0`. None on overflow.
fn apply_shift(value: i128, shift: i64) -> Option<i128> {
    if value == 0 {
        return Some(0);
    }
    let exp = u32::try_from(shift).ok()?;
    value.checked_mul(pow10(exp)?)
}

const DECIMAL_SUFFIXES: [(i32, &str); 10] = [
    (-9, "n"),
    (-6, "u"),
    (-3, "m"),
    (0, ""),
    (3, "k"),
    (6, "M"),
    (9, "G"),
    (12, "T"),
    (15, "P"),
    (18, "E"),
];
const BINARY_SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let sign = if self.nanos < 0 { "-" } else { "" };
        let abs = self.nanos.unsigned_abs();
        let mut format = self.format;
        if format == Format::BinarySI
            && (abs < 1024 * NANO.unsigned_abs() || !abs.is_multiple_of(NANO.unsigned_abs()))
        {
            format = Format::DecimalSI;
        }
        if format == Format::BinarySI {
            let mut value = abs / NANO.unsigned_abs();
            let mut exp = 0;
            while exp < 6 && value.is_multiple_of(1024) {
                value /= 1024;
                exp += 1;
            }
            return write!(f, "{sign}{value}{}", BINARY_SUFFIXES[exp]);
        }
        // Decimal: mantissa * 10^exp with exp a multiple of 3 and as large as possible.
        let mut mantissa = abs;
        let mut exp: i32 = -9;
        while mantissa.is_multiple_of(10) {
            mantissa /= 10;
            exp += 1;
        }
        let rem = exp.rem_euclid(3);
        mantissa *= 10u128.pow(rem.unsigned_abs());
        exp -= rem;
        match format {
            Format::DecimalExponent => {
                if exp == 0 {
                    write!(f, "{sign}{mantissa}")
                } else {
                    write!(f, "{sign}{mantissa}e{exp}")
                }
            }
            _ => {
                let suffix = DECIMAL_SUFFIXES
                    .iter()
                    .find(|(e, _)| *e == exp)
                    .map_or("", |(_, s)| *s);
                if DECIMAL_SUFFIXES.iter().any(|(e, _)| *e == exp) {
                    write!(f, "{sign}{mantissa}{suffix}")
                } else {
                    write!(f, "{sign}{mantissa}e{exp}")
                }
            }
        }
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity such as 500m, 2, 1.5Gi or 100Mi")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
                parse(v.trim()).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity::from_int(v, Format::DecimalSI))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
                let v = i64::try_from(v)
                    .map_err(|_| E::custom(QuantityError::TooLarge(v.to_string())))?;
                Ok(Quantity::from_int(v, Format::DecimalSI))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
                if !v.is_finite() {
                    return Err(E::custom(QuantityError::Format(v.to_string())));
                }
                parse(&v.to_string()).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms() {
        // Cases from apimachinery's quantity_test.go (TestQuantityParse / TestQuantityString).
        let cases = [
            ("0", "0"),
            ("0n", "0"),
            ("0Ki", "0"),
            ("1", "1"),
            ("500m", "500m"),
            ("0.5", "500m"),
            ("1.5", "1500m"),
            ("100Mi", "100Mi"),
            ("1.5Gi", "1536Mi"),
            ("1024Mi", "1Gi"),
            ("1G", "1G"),
            ("1000M", "1G"),
            ("1e3", "1e3"),
            ("1E3", "1e3"),
            ("1e4", "10e3"),
            ("10Ki", "10Ki"),
            ("1Ki", "1Ki"),
            ("512Ki", "512Ki"),
            ("0.5Ki", "512"),
            ("1.5Ki", "1536"),
            ("100m", "100m"),
            ("1000m", "1"),
            ("0.1m", "100u"),
            ("1n", "1n"),
            ("0.0000000001", "1n"),
            ("1.0000000001", "1000000001n"),
            ("-1", "-1"),
            ("-500m", "-500m"),
            ("+2", "2"),
            (".5", "500m"),
            ("5.", "5"),
            ("001", "1"),
            ("1.000", "1"),
            ("2Gi", "2Gi"),
            ("1500Mi", "1500Mi"),
            ("8Ei", "TOO"),
            ("7Ei", "7Ei"),
            ("1e-3", "1e-3"),
            ("123456789", "123456789"),
            ("1234567k", "1234567k"),
            ("1.5e3", "1500"),
        ];
        for (input, want) in cases {
            match Quantity::parse(input) {
                Ok(q) => assert_eq!(q.to_string(), want, "{input}"),
                Err(e) => assert_eq!(want, "TOO", "{input}: {e}"),
            }
        }
    }

    #[test]
    fn values() {
        let q = |s: &str| Quantity::parse(s).unwrap();
        assert_eq!(q("500m").milli_value(), 500);
        assert_eq!(q("0.5").value(), 1);
        assert_eq!(q("100Mi").value(), 104_857_600);
        assert_eq!(q("1G").value(), 1_000_000_000);
        assert_eq!(q("1e3").value(), 1000);
        assert_eq!(q("0.1m").milli_value(), 1);
        assert_eq!(q("2").milli_value(), 2000);
        assert_eq!(q("1.5Gi").value(), 1_610_612_736);
        assert_eq!(
            Quantity::from_int(1_572_864_000, Format::BinarySI).to_string(),
            "1500Mi"
        );
        assert_eq!(Quantity::from_int(100, Format::BinarySI).to_string(), "100");
    }

    #[test]
    fn errors_not_panics() {
        for bad in [
            "",
            " ",
            "abc",
            "1K",
            "1.2.3",
            "--1",
            "+",
            "-",
            ".",
            "1ee3",
            "1e",
            "1e+",
            "1ki",
            "1 Mi",
            "Mi",
            "1Mi2",
            "1e99999999999999999999",
            "1e30",
            "1e19",
            "10000000000000000000",
            "9223372036854775808",
            "NaN",
            "inf",
            "1e-99999999999999",
            "1Eiq",
        ] {
            let r = Quantity::parse(bad);
            if bad == "1e-99999999999999" {
                // Rounds up to one nano-unit, as apimachinery does.
                assert_eq!(r.unwrap().nanos(), 1, "{bad}");
                continue;
            }
            assert!(r.is_err(), "{bad:?} parsed as {r:?}");
        }
        assert!(Quantity::parse("9223372036854775807").is_ok());
        assert!(Quantity::parse("-9223372036854775807").is_ok());
        assert_eq!(
            Quantity::parse("0.000000000000000000000000000000000000000000001")
                .unwrap()
                .nanos(),
            1
        );
        assert_eq!(Quantity::parse("0e999999").unwrap().nanos(), 0);
    }

    #[test]
    fn serde_forms() {
        let q: Quantity = serde_yaml_ng::from_str("2").unwrap();
        assert_eq!(q.to_string(), "2");
        let q: Quantity = serde_yaml_ng::from_str("\"1.5Gi\"").unwrap();
        assert_eq!(q.to_string(), "1536Mi");
        let q: Quantity = serde_yaml_ng::from_str("0.5").unwrap();
        assert_eq!(q.to_string(), "500m");
        assert!(serde_yaml_ng::from_str::<Quantity>(".nan").is_err());
        assert!(serde_yaml_ng::from_str::<Quantity>("[1]").is_err());
    }

    mod props {
        use proptest::prelude::*;

        use super::super::*;

        proptest! {
            #[test]
            fn round_trip(nanos in -MAX_NANOS..=MAX_NANOS, fmt in 0..3u8) {
                let format = match fmt { 0 => Format::BinarySI, 1 => Format::DecimalSI, _ => Format::DecimalExponent };
                let q = Quantity::from_nanos(nanos, format).unwrap();
                let printed = q.to_string();
                let back = Quantity::parse(&printed).unwrap();
                prop_assert_eq!(back.nanos(), nanos);
                prop_assert_eq!(back.to_string(), printed);
            }

            #[test]
            fn int_round_trip(v in any::<i64>(), bin in any::<bool>()) {
                let v = v.max(-i64::MAX);
                let q = Quantity::from_int(v, if bin { Format::BinarySI } else { Format::DecimalSI });
                let back: Quantity = q.to_string().parse().unwrap();
                prop_assert_eq!(back.value(), v);
            }

            #[test]
            fn never_panics(s in "[-+0-9.eEinumkKMGTP]{0,30}") {
                let _ = Quantity::parse(&s);
            }
        }
    }
}
