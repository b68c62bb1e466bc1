//! The cgroup v2 crossing tripwire: where to put `memory.high` on the kubepods cgroup so that
//! the kernel itself signals the moment a memory eviction threshold is crossed.
//!
//! cgroup v2 has no usage-threshold eventfd (kubelet's memcg notifier works on v1 only). But
//! usage above `memory.high` starts reclaim in the cgroup at once, which the eBPF reclaim
//! tracepoint and `memory.events` (`high`) report: a kernel-driven signal, no polling. Both
//! memory signals are linear in the pods' usage: `memory.available` = capacity - node working
//! set, `allocatableMemory.available` = kubepods limit - kubepods working set. A threshold `T`
//! of either is therefore crossed when the kubepods cgroup grows by `available - T` from now;
//! the tripwire goes at kubepods' current usage (`memory.current`, cache included) plus the
//! smallest such distance over the memory thresholds, hard and soft. It is placed again at
//! every step (the node's other usage and the pods' cache move it), and removed (`max`) while
//! a memory threshold is met or an evicted pod is being cleaned up: past the crossing the
//! eviction manager acts, and nothing is throttled beyond the moment the victim is killed.

use super::{Observations, Signal, manager::EvictionConfig};

/// Where `memory.high` of kubepods goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tripwire {
    /// At this usage of kubepods, in bytes.
    At(i64),
    /// Not armed (`max`): a threshold is met, or there is no memory threshold or observation.
    Off,
}

/// The tripwire for the kubepods usage `kubepods_usage` (its `memory.current`) and the step's
/// observations. `floor` keeps it from being placed so close above the usage that ordinary
/// noise trips it (a few MiB).
#[must_use]
pub fn place(
    config: &EvictionConfig,
    observations: &Observations,
    kubepods_usage: i64,
    floor: i64,
) -> Tripwire {
    let distance = config
        .thresholds
        .iter()
        .filter(|t| {
            matches!(
                t.signal,
                Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
            )
        })
        .filter_map(|t| {
            let o = observations.get(&t.signal)?;
            let threshold = t.value.resolve(o.capacity).value();
            Some(o.available.saturating_sub(threshold))
        })
        .min();
    // Met is `available < threshold` (kubelet's): at `d == 0` nothing is met yet and the next
    // byte meets it, so the tripwire goes right there (`memory.high`: usage above it; the
    // crossing level: the first page past it). Off at `d == 0` left the node unwatched until
    // the kubepods limit: the crossing check reports the charge that reaches its level, and a
    // step that read the usage exactly there found nothing met and nothing to arm.
    match distance {
        Some(d) if d >= 0 => Tripwire::At(kubepods_usage.saturating_add(d.max(floor))),
        _ => Tripwire::Off,
    }
}

/// Whether a new placement is worth a write: moving an armed tripwire by less than `slack`
/// bytes is not (the next step places it again).
#[must_use]
pub fn worth_writing(current: Option<Tripwire>, next: Tripwire, slack: i64) -> bool {
    match (current, next) {
        (Some(Tripwire::At(a)), Tripwire::At(b)) => a.abs_diff(b) > slack.unsigned_abs(),
        (Some(a), b) => a != b,
        (None, _) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::policy::eviction::{Observation, threshold::parse_threshold_config};

    const MI: i64 = 1 << 20;

    /// `allocatable`: `enforceNodeAllocatable: [pods]`, which copies the hard
    /// `memory.available` threshold as `allocatableMemory.available` (kubelet's way).
    fn config_with(hard: &[&str], soft: &[&str], allocatable: bool) -> EvictionConfig {
        let map = |v: &[&str]| -> BTreeMap<String, String> {
            v.iter()
                .filter_map(|s| s.split_once('<'))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        let grace: BTreeMap<String, String> = map(soft)
            .into_keys()
            .map(|k| (k, "30s".to_owned()))
            .collect();
        EvictionConfig {
            thresholds: parse_threshold_config(
                &(if allocatable {
                    vec!["pods".to_owned()]
                } else {
                    Vec::new()
                }),
                &map(hard),
                &map(soft),
                &grace,
                &BTreeMap::new(),
            )
            .expect("thresholds"),
            max_pod_grace_period_seconds: 0,
            pressure_transition_period: std::time::Duration::from_secs(300),
            throttle_before_evict: Vec::new(),
        }
    }

    fn config(hard: &[&str], soft: &[&str]) -> EvictionConfig {
        config_with(hard, soft, false)
    }

    fn obs(memory: i64, allocatable: i64) -> Observations {
        let mut o = Observations::new();
        o.insert(
            Signal::MemoryAvailable,
            Observation {
                available: memory,
                capacity: 4096 * MI,
                time: None,
            },
        );
        o.insert(
            Signal::AllocatableMemoryAvailable,
            Observation {
                available: allocatable,
                capacity: 3072 * MI,
                time: None,
            },
        );
        o
    }

    #[test]
    fn the_tripwire_sits_where_the_nearest_memory_threshold_is_crossed() {
        let c = config(&["memory.available<100Mi"], &["memory.available<300Mi"]);
        // 1000 Mi available: the soft threshold is 700 Mi of growth away.
        assert_eq!(
            place(&c, &obs(1000 * MI, 2000 * MI), 2000 * MI, 4 * MI),
            Tripwire::At(2700 * MI)
        );
        // allocatable is nearer: 50 Mi above its 100 Mi threshold.
        let c = config_with(&["memory.available<100Mi"], &[], true);
        assert_eq!(
            place(&c, &obs(1000 * MI, 150 * MI), 2000 * MI, 4 * MI),
            Tripwire::At(2050 * MI)
        );
        // Percentages resolve against the signal's capacity (10 % of 4096 Mi, as kubelet's
        // float32 arithmetic gives it).
        let c = config(&["memory.available<10%"], &[]);
        let ten_percent = crate::policy::eviction::threshold::ThresholdValue::Percentage(0.1)
            .resolve(4096 * MI)
            .value();
        assert!((ten_percent - 4096 * MI / 10).abs() < 64, "{ten_percent}");
        assert_eq!(
            place(&c, &obs(1000 * MI, 0), 0, 0),
            Tripwire::At(1000 * MI - ten_percent)
        );
    }

    #[test]
    fn off_while_met_or_without_memory_thresholds() {
        let c = config(&["memory.available<100Mi"], &[]);
        assert_eq!(place(&c, &obs(100 * MI - 1, 0), 0, 0), Tripwire::Off);
        assert_eq!(place(&c, &obs(50 * MI, 0), 0, 0), Tripwire::Off);
        assert_eq!(place(&c, &Observations::new(), 0, 0), Tripwire::Off);
        let disk = config(&["nodefs.available<10%"], &[]);
        assert_eq!(place(&disk, &obs(10 * MI, 0), 0, 0), Tripwire::Off);
        // Exactly at the threshold nothing is met yet (`available < threshold` is): armed at
        // the usage itself, the next byte crossing it (with no floor), else the floor above.
        assert_eq!(
            place(&c, &obs(100 * MI, 0), 300 * MI, 0),
            Tripwire::At(300 * MI)
        );
        assert_eq!(
            place(&c, &obs(100 * MI, 0), 300 * MI, 4 * MI),
            Tripwire::At(304 * MI)
        );
        // Just above the threshold: never closer than the floor.
        assert_eq!(
            place(&c, &obs(101 * MI, 0), 500 * MI, 4 * MI),
            Tripwire::At(504 * MI)
        );
    }

    #[test]
    fn small_moves_are_not_written() {
        let at = |m: i64| Tripwire::At(m * MI);
        assert!(worth_writing(None, Tripwire::Off, MI));
        assert!(!worth_writing(Some(at(100)), at(100), MI));
        assert!(!worth_writing(
            Some(at(100)),
            Tripwire::At(100 * MI + 1000),
            MI
        ));
        assert!(worth_writing(Some(at(100)), at(102), MI));
        assert!(worth_writing(Some(at(100)), Tripwire::Off, MI));
        assert!(!worth_writing(Some(Tripwire::Off), Tripwire::Off, MI));
    }
}
