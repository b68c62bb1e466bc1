//! Eviction: node allocatable enforcement, the thresholds with their grace periods and
//! minimum reclaims, the maximum pod grace period and the pressure transition period.

use std::{collections::BTreeMap, time::Duration};

use super::{Key, Maps, Namer, Sourced, StringMap, duration_setting, key, non_negative};
use crate::{
    config::{ConfigArgs, ConfigError, KubeletConfiguration, flags},
    policy::eviction::{Threshold, ThresholdValue, threshold},
};

/// The values `enforceNodeAllocatable` accepts.
const ENFORCE_NODE_ALLOCATABLE: &[&str] = &[
    "pods",
    "system-reserved",
    "kube-reserved",
    "system-reserved-compressible",
    "kube-reserved-compressible",
    "none",
];

/// `enforceNodeAllocatable` (default `pods`).
pub(super) fn enforce_node_allocatable(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<Vec<String>, ConfigError> {
    let key = key::ENFORCE_NODE_ALLOCATABLE;
    let enforce = Sourced::pick(
        args.enforce_node_allocatable
            .as_deref()
            .map(flags::parse_list),
        doc.enforce_node_allocatable.clone(),
    );
    let from_flag = enforce.from_flag;
    let enforce = enforce.value.unwrap_or_else(|| vec!["pods".to_owned()]);
    for k in &enforce {
        if !ENFORCE_NODE_ALLOCATABLE.contains(&k.as_str()) {
            return Err(n.invalid(
                key,
                from_flag,
                k.clone(),
                "must be one of pods, system-reserved, kube-reserved, none",
            ));
        }
    }
    if enforce.len() > 1 && enforce.iter().any(|k| k == "none") {
        return Err(n.invalid(
            key,
            from_flag,
            enforce.join(","),
            "\"none\" cannot be combined with other values",
        ));
    }
    Ok(enforce)
}

/// The validated eviction settings.
pub(super) struct Eviction {
    /// All thresholds, with the allocatable copies `enforceNodeAllocatable` asks for.
    pub thresholds: Vec<Threshold>,
    /// The hard thresholds as written.
    pub hard_thresholds: Vec<Threshold>,
    pub hard: StringMap,
    pub soft: StringMap,
    pub grace: StringMap,
    pub reclaim: StringMap,
    pub max_pod_grace_period: i32,
    pub pressure_transition_period: Duration,
}

/// The eviction settings; a threshold at 0 % is a warning.
pub(super) fn eviction(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
    maps: &Maps,
    enforce: &[String],
    warnings: &mut Vec<String>,
) -> Result<Eviction, ConfigError> {
    let hard = maps
        .hard
        .value
        .clone()
        .unwrap_or_else(threshold::default_eviction_hard);
    let soft = maps.soft.value.clone().unwrap_or_default();
    let grace = maps.grace.value.clone().unwrap_or_default();
    let reclaim = maps.reclaim.value.clone().unwrap_or_default();
    let thresholds = thresholds(n, maps, enforce, &hard, &soft, &grace, &reclaim)?;
    let empty = BTreeMap::new();
    let hard_thresholds =
        threshold::parse_threshold_config(&[], &hard, &empty, &empty, &empty).unwrap_or_default();
    for t in &thresholds {
        if let ThresholdValue::Percentage(p) = t.value
            && p == 0.0
        {
            warnings.push(format!(
                "{}: threshold {} at 0% can never be met",
                n.file, t.signal
            ));
        }
    }
    let max_pod_grace_period = max_pod_grace_period(n, doc, args)?;
    let pressure_transition_period = duration_setting(
        n,
        key::EVICTION_PRESSURE_TRANSITION_PERIOD,
        args.eviction_pressure_transition_period.as_ref(),
        doc.eviction_pressure_transition_period.as_ref(),
        Duration::from_secs(300),
    )?;
    Ok(Eviction {
        thresholds,
        hard_thresholds,
        hard,
        soft,
        grace,
        reclaim,
        max_pod_grace_period,
        pressure_transition_period,
    })
}

/// The thresholds. Each map is checked on its own first, so that an error names the right
/// field.
fn thresholds(
    n: &Namer<'_>,
    maps: &Maps,
    enforce: &[String],
    hard: &StringMap,
    soft: &StringMap,
    grace: &StringMap,
    reclaim: &StringMap,
) -> Result<Vec<Threshold>, ConfigError> {
    let check = |key: Key,
                 from_flag: bool,
                 r: Result<Vec<Threshold>, threshold::ThresholdError>,
                 m: &StringMap| {
        r.map_err(|e| {
            let value = m
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            n.invalid(key, from_flag, value, e)
        })
    };
    let empty = BTreeMap::new();
    check(
        key::EVICTION_HARD,
        maps.hard.from_flag,
        threshold::parse_threshold_config(&[], hard, &empty, &empty, &empty),
        hard,
    )?;
    if let Err(e) = threshold::parse_threshold_config(&[], &empty, soft, grace, &empty) {
        let grace_error = matches!(
            e,
            threshold::ThresholdError::NegativeGracePeriod(_)
                | threshold::ThresholdError::GracePeriod(..)
        ) || (soft.is_empty()
            && matches!(e, threshold::ThresholdError::UnsupportedSignal(_)));
        let (key, from_flag, m) = if grace_error {
            (key::EVICTION_SOFT_GRACE_PERIOD, maps.grace.from_flag, grace)
        } else {
            (key::EVICTION_SOFT, maps.soft.from_flag, soft)
        };
        check(key, from_flag, Err(e), m)?;
    }
    check(
        key::EVICTION_MINIMUM_RECLAIM,
        maps.reclaim.from_flag,
        threshold::parse_threshold_config(&[], &empty, &empty, &empty, reclaim),
        reclaim,
    )?;
    check(
        key::EVICTION_HARD,
        maps.hard.from_flag,
        threshold::parse_threshold_config(enforce, hard, soft, grace, reclaim),
        hard,
    )
}

/// `evictionMaxPodGracePeriod` (default 0): not negative.
fn max_pod_grace_period(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<i32, ConfigError> {
    let v = Sourced::pick(
        args.eviction_max_pod_grace_period,
        doc.eviction_max_pod_grace_period,
    );
    let max_grace = v.value.unwrap_or(0);
    non_negative(
        n,
        key::EVICTION_MAX_POD_GRACE_PERIOD,
        v.from_flag,
        max_grace,
    )?;
    Ok(max_grace)
}
