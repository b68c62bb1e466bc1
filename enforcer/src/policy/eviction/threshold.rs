//! Eviction thresholds (`pkg/kubelet/eviction/helpers.go`: `ParseThresholdConfig`,
//! `parseThresholdStatement`, `parseGracePeriods`, `parseMinimumReclaims`,
//! `addAllocatableThresholds`, `thresholdsMet`; `api/types.go`: `GetThresholdQuantity`).

use std::{collections::BTreeMap, fmt, time::Duration};

use super::{Observations, Signal};
use crate::{
    duration,
    quantity::{Format, Quantity, QuantityError},
};

/// What is wrong with a threshold setting. The messages are kubelet's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ThresholdError {
    /// Not a known signal.
    #[error("unsupported eviction signal {0}")]
    UnsupportedSignal(String),
    /// A percentage below 0 %.
    #[error("eviction percentage threshold {0} must be >= 0%: {1}")]
    PercentBelowZero(Signal, String),
    /// A percentage above 100 %.
    #[error("eviction percentage threshold {0} must be <= 100%: {1}")]
    PercentAboveHundred(Signal, String),
    /// A percentage that does not parse (or is NaN / infinite).
    #[error("invalid percentage {1:?} for {0}")]
    Percent(Signal, String),
    /// A quantity threshold <= 0.
    #[error("eviction threshold {0} must be positive: {1}")]
    NotPositive(Signal, String),
    /// A quantity that does not parse.
    #[error("invalid quantity {1:?} for {0}: {2}")]
    Quantity(Signal, String, QuantityError),
    /// A soft threshold without grace period.
    #[error("grace period must be specified for the soft eviction threshold {0}")]
    MissingGracePeriod(Signal),
    /// A grace period that does not parse.
    #[error("invalid eviction grace period {1:?} for {0}: {2}")]
    GracePeriod(Signal, String, String),
    /// A negative grace period.
    #[error("invalid eviction grace period specified: {0}, must be a positive value")]
    NegativeGracePeriod(String),
    /// A minimum reclaim percentage <= 0.
    #[error("eviction percentage minimum reclaim {0} must be positive: {1}")]
    MinReclaimPercent(Signal, String),
    /// A negative minimum reclaim.
    #[error("negative minimum reclaim specified for {0}")]
    NegativeMinReclaim(Signal),
}

/// A threshold value: a quantity, or a fraction of capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    /// An absolute quantity.
    Quantity(Quantity),
    /// A fraction of capacity (`10%` -> 0.1), kept as `float32` as kubelet does.
    Percentage(f32),
}

impl ThresholdValue {
    /// `GetThresholdQuantity`: the quantity, or `int64(float64(capacity) * float64(pct))` as a
    /// binary-SI quantity.
    #[must_use]
    pub fn resolve(&self, capacity: i64) -> Quantity {
        match *self {
            Self::Quantity(q) => q,
            Self::Percentage(p) => {
                #[expect(
                    clippy::cast_precision_loss,
                    clippy::cast_possible_truncation,
                    reason = "kubelet's float arithmetic, reproduced"
                )]
                let v = (capacity as f64 * f64::from(p)) as i64;
                Quantity::from_int(v, Format::BinarySI)
            }
        }
    }
}

impl fmt::Display for ThresholdValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Quantity(q) => write!(f, "{q}"),
            Self::Percentage(p) => write!(f, "{}%", f64::from(*p) * 100.0),
        }
    }
}

/// An eviction threshold: `signal < value`, with a grace period (0 = hard) and an optional
/// minimum reclaim.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// The signal.
    pub signal: Signal,
    /// The value (the operator is always `LessThan`).
    pub value: ThresholdValue,
    /// 0 for a hard threshold.
    pub grace_period: Duration,
    /// Reclaim this much past the threshold before it counts as resolved.
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    /// `isHardEvictionThreshold`: grace period 0.
    #[must_use]
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }

    /// `thresholdsMet` for one threshold: available < quantity (+ min reclaim when enforced).
    /// A signal without observation is not met.
    #[must_use]
    pub fn is_met(&self, observations: &Observations, enforce_min_reclaim: bool) -> bool {
        let Some(obs) = observations.get(&self.signal) else {
            return false;
        };
        let mut quantity = self.value.resolve(obs.capacity).nanos();
        if enforce_min_reclaim && let Some(min) = self.min_reclaim {
            quantity = quantity.saturating_add(min.resolve(obs.capacity).nanos());
        }
        quantity > i128::from(obs.available) * 1_000_000_000
    }
}

fn parse_percentage(signal: Signal, val: &str) -> Result<f32, ThresholdError> {
    // strconv.ParseFloat(strings.TrimRight(input, "%"), 32), then float32(value) / 100.
    let number = val.trim_end_matches('%');
    let v: f32 = number
        .parse()
        .map_err(|_| ThresholdError::Percent(signal, val.to_owned()))?;
    if !v.is_finite()
        || number
            .chars()
            .any(|c| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
    {
        return Err(ThresholdError::Percent(signal, val.to_owned()));
    }
    Ok(v / 100.0)
}

fn signal(name: &str) -> Result<Signal, ThresholdError> {
    Signal::parse(name).ok_or_else(|| ThresholdError::UnsupportedSignal(name.to_owned()))
}

/// `parseThresholdStatement`: `None` for the silently ignored `0%` and `100%`.
pub fn parse_threshold_statement(
    name: &str,
    val: &str,
) -> Result<Option<Threshold>, ThresholdError> {
    let signal = signal(name)?;
    let value = if val.ends_with('%') {
        if val == "0%" || val == "100%" {
            return Ok(None);
        }
        let p = parse_percentage(signal, val)?;
        if p < 0.0 {
            return Err(ThresholdError::PercentBelowZero(signal, val.to_owned()));
        }
        if p > 1.0 {
            return Err(ThresholdError::PercentAboveHundred(signal, val.to_owned()));
        }
        ThresholdValue::Percentage(p)
    } else {
        let q = Quantity::parse(val)
            .map_err(|e| ThresholdError::Quantity(signal, val.to_owned(), e))?;
        if q.signum() <= 0 {
            return Err(ThresholdError::NotPositive(signal, q.to_string()));
        }
        ThresholdValue::Quantity(q)
    };
    Ok(Some(Threshold {
        signal,
        value,
        grace_period: Duration::ZERO,
        min_reclaim: None,
    }))
}

fn parse_min_reclaim(name: &str, val: &str) -> Result<(Signal, ThresholdValue), ThresholdError> {
    let signal = signal(name)?;
    if val.ends_with('%') {
        let p = parse_percentage(signal, val)?;
        if p <= 0.0 {
            return Err(ThresholdError::MinReclaimPercent(signal, val.to_owned()));
        }
        return Ok((signal, ThresholdValue::Percentage(p)));
    }
    let q =
        Quantity::parse(val).map_err(|e| ThresholdError::Quantity(signal, val.to_owned(), e))?;
    if q.signum() < 0 {
        return Err(ThresholdError::NegativeMinReclaim(signal));
    }
    Ok((signal, ThresholdValue::Quantity(q)))
}

fn parse_grace_period(name: &str, val: &str) -> Result<(Signal, Duration), ThresholdError> {
    let signal = signal(name)?;
    let d = duration::parse_signed(val)
        .map_err(|e| ThresholdError::GracePeriod(signal, val.to_owned(), e.to_string()))?;
    if d < 0 {
        return Err(ThresholdError::NegativeGracePeriod(val.to_owned()));
    }
    Ok((
        signal,
        Duration::from_nanos(u64::try_from(d).unwrap_or(u64::MAX)),
    ))
}

/// `ParseThresholdConfig`: hard thresholds, then soft ones (each needs a grace period), minimum
/// reclaims attached by signal, and, when `enforce_node_allocatable` contains `pods`, every
/// hard `memory.available` threshold copied as `allocatableMemory.available`. Maps are read in
/// key order, so the result is deterministic.
pub fn parse_threshold_config(
    enforce_node_allocatable: &[String],
    hard: &BTreeMap<String, String>,
    soft: &BTreeMap<String, String>,
    soft_grace_period: &BTreeMap<String, String>,
    minimum_reclaim: &BTreeMap<String, String>,
) -> Result<Vec<Threshold>, ThresholdError> {
    let mut results = Vec::new();
    for (k, v) in hard {
        results.extend(parse_threshold_statement(k, v)?);
    }
    let mut softs = Vec::new();
    for (k, v) in soft {
        softs.extend(parse_threshold_statement(k, v)?);
    }
    let mut grace = BTreeMap::new();
    for (k, v) in soft_grace_period {
        let (s, d) = parse_grace_period(k, v)?;
        grace.insert(s, d);
    }
    let mut reclaims = BTreeMap::new();
    for (k, v) in minimum_reclaim {
        let (s, r) = parse_min_reclaim(k, v)?;
        reclaims.insert(s, r);
    }
    for t in &mut softs {
        t.grace_period = *grace
            .get(&t.signal)
            .ok_or(ThresholdError::MissingGracePeriod(t.signal))?;
    }
    results.extend(softs);
    for t in &mut results {
        t.min_reclaim = reclaims.get(&t.signal).copied();
    }
    if enforce_node_allocatable.iter().any(|k| k == "pods") {
        let copies: Vec<_> = results
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                ..t.clone()
            })
            .collect();
        results.extend(copies);
    }
    Ok(results)
}

/// Kubelet's default `evictionHard` (Linux).
#[must_use]
pub fn default_eviction_hard() -> BTreeMap<String, String> {
    [
        ("memory.available", "100Mi"),
        ("nodefs.available", "10%"),
        ("nodefs.inodesFree", "5%"),
        ("imagefs.available", "15%"),
        ("imagefs.inodesFree", "5%"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::eviction::Observation;

    fn m(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }
    fn q(s: &str) -> ThresholdValue {
        ThresholdValue::Quantity(Quantity::parse(s).unwrap())
    }

    #[test]
    fn parse_config_cases() {
        // After helpers_test.go TestParseThresholdConfig.
        let pods = vec!["pods".to_owned()];
        // no values
        assert!(
            parse_threshold_config(&[], &m(&[]), &m(&[]), &m(&[]), &m(&[]))
                .unwrap()
                .is_empty()
        );
        // all memory flag values
        let t = parse_threshold_config(
            &[],
            &m(&[("memory.available", "150Mi")]),
            &m(&[("memory.available", "300Mi")]),
            &m(&[("memory.available", "30s")]),
            &m(&[("memory.available", "0")]),
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].value, q("150Mi"));
        assert!(t[0].is_hard());
        assert_eq!(t[0].min_reclaim, Some(q("0")));
        assert_eq!(t[1].grace_period, Duration::from_secs(30));
        // allocatable copy
        let t = parse_threshold_config(
            &pods,
            &m(&[("memory.available", "150Mi")]),
            &m(&[]),
            &m(&[]),
            &m(&[]),
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].signal, Signal::AllocatableMemoryAvailable);
        assert_eq!(t[1].value, q("150Mi"));
        // percentages
        let t = parse_threshold_config(
            &[],
            &m(&[("memory.available", "10%")]),
            &m(&[("memory.available", "30%")]),
            &m(&[("memory.available", "30s")]),
            &m(&[("memory.available", "5%")]),
        )
        .unwrap();
        assert_eq!(t[0].value, ThresholdValue::Percentage(0.1));
        assert_eq!(t[0].min_reclaim, Some(ThresholdValue::Percentage(0.05)));
        // 0% and 100% are ignored
        let t = parse_threshold_config(
            &[],
            &m(&[("memory.available", "0%"), ("nodefs.available", "100%")]),
            &m(&[]),
            &m(&[]),
            &m(&[]),
        )
        .unwrap();
        assert!(t.is_empty());
        // errors
        let err =
            |h: &[(&str, &str)], s: &[(&str, &str)], g: &[(&str, &str)], r: &[(&str, &str)]| {
                parse_threshold_config(&[], &m(h), &m(s), &m(g), &m(r)).unwrap_err()
            };
        assert_eq!(
            err(&[("mem.available", "150Mi")], &[], &[], &[]),
            ThresholdError::UnsupportedSignal("mem.available".into())
        );
        assert!(matches!(
            err(&[("memory.available", "-150Mi")], &[], &[], &[]),
            ThresholdError::NotPositive(..)
        ));
        assert!(matches!(
            err(&[("memory.available", "0")], &[], &[], &[]),
            ThresholdError::NotPositive(..)
        ));
        assert!(matches!(
            err(&[("memory.available", "-15%")], &[], &[], &[]),
            ThresholdError::PercentBelowZero(..)
        ));
        assert!(matches!(
            err(&[("memory.available", "115%")], &[], &[], &[]),
            ThresholdError::PercentAboveHundred(..)
        ));
        assert!(matches!(
            err(&[("memory.available", "NaN%")], &[], &[], &[]),
            ThresholdError::Percent(..)
        ));
        assert!(matches!(
            err(&[("memory.available", "1e30")], &[], &[], &[]),
            ThresholdError::Quantity(..)
        ));
        assert_eq!(
            err(&[], &[("memory.available", "150Mi")], &[], &[]),
            ThresholdError::MissingGracePeriod(Signal::MemoryAvailable)
        );
        assert!(matches!(
            err(
                &[],
                &[("memory.available", "150Mi")],
                &[("memory.available", "-30s")],
                &[]
            ),
            ThresholdError::NegativeGracePeriod(..)
        ));
        assert!(matches!(
            err(&[], &[], &[], &[("memory.available", "-300Mi")]),
            ThresholdError::NegativeMinReclaim(..)
        ));
        assert!(matches!(
            err(&[], &[], &[], &[("memory.available", "-15%")]),
            ThresholdError::MinReclaimPercent(..)
        ));
        assert!(matches!(
            err(&[], &[], &[("memory.available", "abc")], &[]),
            ThresholdError::GracePeriod(..)
        ));
        assert_eq!(
            err(&[("memory.available", "-150Mi")], &[], &[], &[]).to_string(),
            "eviction threshold memory.available must be positive: -150Mi"
        );
    }

    #[test]
    fn met_with_min_reclaim() {
        // After helpers_test.go TestThresholdsMet.
        let t = Threshold {
            signal: Signal::MemoryAvailable,
            value: q("1Gi"),
            grace_period: Duration::ZERO,
            min_reclaim: Some(q("500Mi")),
        };
        let obs = |avail: &str| -> Observations {
            [(
                Signal::MemoryAvailable,
                Observation {
                    available: Quantity::parse(avail).unwrap().value(),
                    capacity: 3 << 30,
                    time: None,
                },
            )]
            .into()
        };
        assert!(!t.is_met(&obs("2Gi"), false));
        assert!(t.is_met(&obs("500Mi"), false));
        assert!(!t.is_met(&obs("1Gi"), false));
        assert!(t.is_met(&obs("1Gi"), true)); // needs 1.5Gi to be resolved
        assert!(!t.is_met(&obs("3Gi"), true));
        assert!(!t.is_met(&Observations::new(), false));
    }

    #[test]
    fn percent_resolution() {
        // After helpers_test.go TestGetThresholdQuantity: float32 arithmetic, truncation.
        let p = |s: &str| parse_percentage(Signal::MemoryAvailable, s).unwrap();
        assert_eq!(
            ThresholdValue::Percentage(p("50%")).resolve(1000).value(),
            500
        );
        assert_eq!(
            ThresholdValue::Percentage(p("10%"))
                .resolve(1 << 30)
                .value(),
            107_374_184
        ); // float32(0.1) * 2^30, truncated
        assert_eq!(
            ThresholdValue::Percentage(p("10.5%")).resolve(100).value(),
            10
        );
        assert_eq!(
            ThresholdValue::Percentage(p("100%"))
                .resolve(1 << 30)
                .to_string(),
            "1Gi"
        );
    }
}
