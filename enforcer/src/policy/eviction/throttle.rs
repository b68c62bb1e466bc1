//! Throttle, then evict (beyond kubelet, which has no such step; opt-in per threshold with
//! `enforcer.throttleBeforeEvict`). At a hard memory threshold's crossing the chosen victim
//! is capped at once at its current usage (cgroup v2 `memory.high`: its allocations are
//! throttled by the kernel from then on; v1 `memory.limit_in_bytes`: it reclaims, and past
//! that the kernel's OOM killer acts inside the victim's own pod). The node is then safe
//! from the victim's growth within the kernel's reaction time, and the victim gets kubelet's
//! graceful stop (preStop, SIGTERM, its grace period) instead of SIGKILL, as long as the
//! node keeps at least half the threshold's amount available ([`floor`]); below that, or on
//! a later step that finds the node there while the victim is still stopping, SIGKILL.

use super::{Observations, Signal, Threshold};

/// How a hard memory eviction's victim is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL now (kubelet's hard eviction).
    Kill,
    /// Capped at its usage, then stopped gracefully with this grace period.
    Graceful { grace_seconds: i64 },
}

/// The amount of the signal below which a throttled victim is killed instead: half the
/// threshold's quantity at the observation's capacity. `None`: the signal is not observed.
#[must_use]
pub fn floor(threshold: &Threshold, observations: &Observations) -> Option<i64> {
    let obs = observations.get(&threshold.signal)?;
    Some(threshold.value.resolve(obs.capacity).value() / 2)
}

/// Whether a threshold on `signal` may throttle (memory signals only).
#[must_use]
pub fn applies_to(signal: Signal) -> bool {
    matches!(
        signal,
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
    )
}

/// The stop of a victim evicted for `threshold`: graceful when it opted in (`throttled`), is hard,
/// and the node has at least [`floor`] available; the grace period is the pod's
/// `terminationGracePeriodSeconds` (`pod_grace`), capped by `evictionMaxPodGracePeriod` when
/// that is set, at least 1 s.
#[must_use]
pub fn decide(
    threshold: &Threshold,
    throttled: &[Signal],
    observations: &Observations,
    pod_grace: i64,
    max_pod_grace: i64,
) -> Stop {
    let signal = threshold.signal;
    if !threshold.is_hard() || !applies_to(signal) || !throttled.contains(&signal) {
        return Stop::Kill;
    }
    let (Some(floor), Some(obs)) = (floor(threshold, observations), observations.get(&signal))
    else {
        return Stop::Kill;
    };
    if obs.available < floor {
        return Stop::Kill;
    }
    let grace = if max_pod_grace > 0 {
        pod_grace.min(max_pod_grace)
    } else {
        pod_grace
    };
    Stop::Graceful {
        grace_seconds: grace.max(1),
    }
}

/// Whether a victim stopping gracefully must be killed now: the node fell below [`floor`].
#[must_use]
pub fn must_kill(ev_floor: i64, signal: Signal, observations: &Observations) -> bool {
    observations
        .get(&signal)
        .is_some_and(|o| o.available < ev_floor)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        policy::eviction::{Observation, ThresholdValue},
        quantity::Quantity,
    };

    fn eviction(signal: Signal, grace: Duration) -> Threshold {
        Threshold {
            signal,
            value: ThresholdValue::Quantity(Quantity::parse("100Mi").expect("quantity")),
            grace_period: grace,
            min_reclaim: None,
        }
    }

    fn observed(signal: Signal, available_mi: i64) -> Observations {
        [(
            signal,
            Observation {
                available: available_mi << 20,
                capacity: 1 << 30,
                time: None,
            },
        )]
        .into()
    }

    #[test]
    fn graceful_only_for_an_opted_in_hard_memory_threshold_with_headroom() {
        let m = Signal::MemoryAvailable;
        let hard = eviction(m, Duration::ZERO);
        // 80Mi available of a 100Mi threshold: above the 50Mi floor.
        let obs = observed(m, 80);
        assert_eq!(
            decide(&hard, &[m], &obs, 30, 0),
            Stop::Graceful { grace_seconds: 30 }
        );
        // evictionMaxPodGracePeriod caps it; never below 1 s.
        assert_eq!(
            decide(&hard, &[m], &obs, 30, 10),
            Stop::Graceful { grace_seconds: 10 }
        );
        assert_eq!(
            decide(&hard, &[m], &obs, 0, 0),
            Stop::Graceful { grace_seconds: 1 }
        );
        // Not opted in, a soft threshold, another signal: kubelet's way.
        assert_eq!(decide(&hard, &[], &obs, 30, 0), Stop::Kill);
        let soft = eviction(m, Duration::from_secs(30));
        assert_eq!(decide(&soft, &[m], &obs, 30, 0), Stop::Kill);
        let disk = eviction(Signal::NodeFsAvailable, Duration::ZERO);
        assert_eq!(
            decide(
                &disk,
                &[Signal::NodeFsAvailable],
                &observed(Signal::NodeFsAvailable, 80),
                30,
                0
            ),
            Stop::Kill
        );
        // Below the floor (half the threshold): SIGKILL at once.
        assert_eq!(decide(&hard, &[m], &observed(m, 49), 30, 0), Stop::Kill);
        assert_eq!(
            decide(&hard, &[m], &observed(m, 50), 30, 0),
            Stop::Graceful { grace_seconds: 30 }
        );
        // Not observed: SIGKILL.
        assert_eq!(decide(&hard, &[m], &Observations::new(), 30, 0), Stop::Kill);
    }

    #[test]
    fn a_stopping_victim_is_killed_once_the_node_falls_below_the_floor() {
        let m = Signal::MemoryAvailable;
        let hard = eviction(m, Duration::ZERO);
        let f = floor(&hard, &observed(m, 80)).expect("floor");
        assert_eq!(f, 50 << 20);
        assert!(!must_kill(f, m, &observed(m, 60)));
        assert!(must_kill(f, m, &observed(m, 40)));
        assert!(
            !must_kill(f, m, &Observations::new()),
            "no observation, no kill"
        );
    }
}
