//! `featureGates` / `--feature-gates` and the Memory QoS settings that depend on them, as
//! kubelet 1.37 validates them: a gate kubelet 1.37 has and the enforcer decides by, with its
//! default and its lock; anything else refused at start with kubelet's messages
//! (`unrecognized feature gate: X`, `cannot set feature gate X to false, feature is locked to
//! true`), and a gate set to a state the enforcer cannot run refused naming it.

use std::collections::BTreeMap;

use super::{Namer, flags, key};
use crate::config::{ConfigArgs, ConfigError, KubeletConfiguration, MemoryReservationPolicy};

/// What the enforcer does with a gate set to a value.
#[derive(Clone, Copy)]
enum Support {
    /// Both values implemented.
    Both,
    /// Only on: off is refused (the enforcer cannot leave the feature out), with why.
    OnOnly(&'static str),
}

/// kubelet 1.37's gates the enforcer's decisions depend on: (name, kubelet's default, locked
/// to it (GA), what the enforcer supports). docs/kubelet-features.md has the table.
const GATES: &[(&str, bool, bool, Support)] = &[
    ("InPlacePodVerticalScaling", true, true, Support::Both),
    (
        "InPlacePodLevelResourcesVerticalScaling",
        true,
        false,
        Support::Both,
    ),
    ("KubeletCgroupDriverFromCRI", true, true, Support::Both),
    ("KubeletPSI", true, true, Support::Both),
    ("MemoryQoS", true, false, Support::Both),
    ("NodeSwap", true, true, Support::Both),
    (
        "PodLevelResources",
        true,
        false,
        Support::OnOnly("the enforcer always honours pod-level resources"),
    ),
];

/// The gates as the enforcer runs them: each known gate's value (kubelet's default unless
/// set, the unimplemented ones off).
pub(super) fn feature_gates(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
    warnings: &mut Vec<String>,
) -> Result<BTreeMap<String, bool>, ConfigError> {
    let kubelets_file = args.kubelet_config.is_some();
    // The file's, then the flag's entries over them (kubelet merges the two the same way).
    let mut given: Vec<(String, bool, bool)> = doc
        .feature_gates
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), *v, false))
        .collect();
    if !args.feature_gates.is_empty() {
        let joined = args.feature_gates.join(",");
        let m = flags::parse_map(&args.feature_gates, '=')
            .map_err(|e| n.invalid(key::FEATURE_GATES, true, joined.clone(), e))?;
        for (k, v) in m {
            let b = v.parse::<bool>().map_err(|_| {
                n.invalid(
                    key::FEATURE_GATES,
                    true,
                    joined.clone(),
                    format!(
                        "invalid value of {k}={v}, err: strconv.ParseBool: parsing {v:?}: invalid syntax"
                    ),
                )
            })?;
            given.retain(|(g, _, _)| *g != k);
            given.push((k, b, true));
        }
    }
    let mut out: BTreeMap<String, bool> = GATES
        .iter()
        .map(|(name, default, _, _)| ((*name).to_owned(), *default))
        .collect();
    for (name, value, from_flag) in given {
        match refusal(&name, value) {
            None => {
                out.insert(name, value);
            }
            // Beside kubelet, its own file's gates are kubelet's, validated by kubelet: the
            // enforcer leaves out those it does not decide by, and says so.
            Some(why) if kubelets_file && !from_flag => warnings.push(format!(
                "{}: featureGates {name}={value}: {why}; the enforcer goes on without it",
                n.file
            )),
            Some(why) => {
                return Err(n.invalid(
                    key::FEATURE_GATES,
                    from_flag,
                    format!("{name}={value}"),
                    why,
                ));
            }
        }
    }
    Ok(out)
}

/// Why the enforcer refuses `name` set to `value` (kubelet's message where kubelet has one),
/// `None` when it takes it.
fn refusal(name: &str, value: bool) -> Option<String> {
    let Some((_, default, locked, support)) = GATES.iter().find(|(g, ..)| *g == name) else {
        return Some(format!("unrecognized feature gate: {name}"));
    };
    if *locked && value != *default {
        return Some(format!(
            "cannot set feature gate {name} to {value}, feature is locked to {default}"
        ));
    }
    match (support, value) {
        (Support::OnOnly(why), false) => {
            Some(format!("feature gate {name} cannot be turned off: {why}"))
        }
        _ => None,
    }
}

/// Memory QoS as kubelet 1.37 has it: (the `MemoryQoS` gate, `memoryThrottlingFactor`,
/// `memoryReservationPolicy`). `enforcer.memoryQoS` / `--memory-qos`, the enforcer's switch
/// from before the gate was read, is the gate's other name (refused when the two disagree).
/// The factor is unset by default (no `memory.high`); in (0, 1] when set; with the gate
/// off, kubelet refuses a factor other than 0.9 and `TieredReservation`.
pub(super) fn memory_qos(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
    gates: &mut BTreeMap<String, bool>,
) -> Result<(bool, Option<f64>, MemoryReservationPolicy), ConfigError> {
    let switch = args
        .memory_qos
        .map(|v| (v, true))
        .or_else(|| doc.enforcer.as_ref()?.memory_qos.map(|v| (v, false)));
    // The flag's syntax was checked by `feature_gates`.
    let gate_given = flags::parse_map(&args.feature_gates, '=')
        .is_ok_and(|m| m.contains_key("MemoryQoS"))
        || doc
            .feature_gates
            .as_ref()
            .is_some_and(|g| g.contains_key("MemoryQoS"));
    let mut enabled = gates.get("MemoryQoS").copied().unwrap_or(true);
    if let Some((v, from_flag)) = switch {
        if gate_given && v != enabled {
            return Err(n.invalid(
                key::MEMORY_QOS,
                from_flag,
                v.to_string(),
                format!("contradicts featureGates MemoryQoS={enabled} (it is the same switch)"),
            ));
        }
        enabled = v;
        gates.insert("MemoryQoS".to_owned(), v);
    }
    let factor = doc.memory_throttling_factor;
    if let Some(f) = factor {
        if !(f > 0.0 && f <= 1.0) {
            return Err(n.invalid(
                key::MEMORY_THROTTLING_FACTOR,
                false,
                f.to_string(),
                "must be greater than 0 and less than or equal to 1.0",
            ));
        }
        #[expect(clippy::float_cmp, reason = "kubelet compares with the literal 0.9")]
        if !enabled && f != 0.9 {
            return Err(n.invalid(
                key::MEMORY_THROTTLING_FACTOR,
                false,
                f.to_string(),
                "memoryThrottlingFactor requires the MemoryQoS feature gate",
            ));
        }
    }
    let policy = match doc.memory_reservation_policy.as_deref() {
        None | Some("None") => MemoryReservationPolicy::None,
        Some("TieredReservation") => MemoryReservationPolicy::TieredReservation,
        Some(other) => {
            return Err(n.invalid(
                key::MEMORY_RESERVATION_POLICY,
                false,
                other,
                "must be None or TieredReservation",
            ));
        }
    };
    if !enabled && policy == MemoryReservationPolicy::TieredReservation {
        return Err(n.invalid(
            key::MEMORY_RESERVATION_POLICY,
            false,
            "TieredReservation",
            "memoryReservationPolicy TieredReservation requires the MemoryQoS feature gate",
        ));
    }
    Ok((enabled, factor.filter(|_| enabled), policy))
}
