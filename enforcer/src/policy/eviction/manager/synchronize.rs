//! The thresholds' part of kubelet's `synchronize`: which thresholds are met, for how long,
//! the node conditions they raise, and the pod to evict for the one to reclaim.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use super::{
    ActivePod, EvictionConfig, IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS, State, eviction_message,
};
use crate::policy::{
    eviction::{
        Eviction, NodeCondition, Observations, Resource, Signal, Threshold, rank::first_eligible,
    },
    resources,
};

/// What the thresholds say at a step (before the cleanup wait, local storage and node-level
/// reclaim have their say in [`super::step`]).
#[must_use]
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Synchronized {
    /// Node conditions to report, sorted by name.
    pub conditions: Vec<NodeCondition>,
    /// The starved resource and the threshold to reclaim, when one is actionable.
    pub reclaim: Option<(Signal, Resource)>,
    /// The node event `EvictionThresholdMet` text, when reclaiming (`Attempting to reclaim
    /// memory`).
    pub node_event: Option<String>,
    /// For disk signals kubelet first reclaims node-level resources (dead containers, unused
    /// images), re-observes, and evicts only if that did not resolve the pressure.
    pub node_level_reclaim_first: bool,
    /// The pod ranked first to evict (at most one per step).
    pub eviction: Option<Eviction>,
    /// Critical pods ranked before the evicted one and skipped.
    pub skipped_critical: Vec<String>,
}

pub(super) fn met(
    config: &EvictionConfig,
    indices: impl Iterator<Item = usize>,
    obs: &Observations,
    enforce: bool,
) -> Vec<usize> {
    indices
        .filter(|&i| {
            config
                .thresholds
                .get(i)
                .is_some_and(|t| t.is_met(obs, enforce))
        })
        .collect()
}

/// The thresholds met ignoring grace periods, then last round's not yet reclaimed (met
/// with their min-reclaim added).
fn thresholds_met(
    config: &EvictionConfig,
    state: &State,
    observations: &Observations,
) -> Vec<usize> {
    let mut thresholds = met(config, 0..config.thresholds.len(), observations, false);
    for i in met(
        config,
        state.thresholds_met.iter().copied(),
        observations,
        true,
    ) {
        if !thresholds.contains(&i) {
            thresholds.push(i);
        }
    }
    thresholds
}

/// Of the thresholds whose grace period is met, those whose signal was observed anew since
/// the last round (kubelet's `thresholdsUpdatedStats`; an observation without a time counts
/// as new).
fn updated_since_last(
    config: &EvictionConfig,
    state: &State,
    observations: &Observations,
    grace_met: &[usize],
) -> Vec<usize> {
    grace_met
        .iter()
        .copied()
        .filter(|&i| {
            let Some(t) = config.thresholds.get(i) else {
                return false;
            };
            let Some(obs) = observations.get(&t.signal) else {
                return false;
            };
            match (obs.time, state.last_observations.get(&t.signal)) {
                (None, _) | (_, None) => true,
                (Some(at), Some(last)) => last.time.is_none_or(|l| at > l),
            }
        })
        .collect()
}

/// The evicted pod's grace period: immediate for a hard threshold, else its own capped at
/// `maxPodGracePeriodSeconds` (at least 1 s).
fn eviction_grace_period(
    config: &EvictionConfig,
    to_reclaim: &Threshold,
    pod: &k8s_openapi::api::core::v1::Pod,
) -> i64 {
    if to_reclaim.is_hard() {
        IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS
    } else {
        let max = config.max_pod_grace_period_seconds;
        let g = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .map_or(max, |t| max.min(t));
        g.max(1)
    }
}

/// The thresholds' part of one round of the eviction manager (`synchronize`), at time `now`:
/// thresholds met, grace periods, node conditions, the threshold to reclaim and the pod
/// ranked first for it. `pods` are the active pods with their stats. Returns the new state
/// (its threshold fields; the rest default) and what the thresholds say.
pub(super) fn synchronize(
    config: &EvictionConfig,
    state: &State,
    observations: &Observations,
    pods: &[ActivePod<'_>],
    now: Duration,
) -> (State, Synchronized) {
    // 1. thresholds met ignoring grace periods, plus last round's not yet reclaimed.
    let thresholds = thresholds_met(config, state, observations);
    // 2. first observed.
    let first_observed: BTreeMap<usize, Duration> = thresholds
        .iter()
        .map(|&i| (i, state.first_observed.get(&i).copied().unwrap_or(now)))
        .collect();
    // 3. node conditions, last observed, and the transition period.
    let mut last_observed = state.conditions_last_observed.clone();
    for &i in &thresholds {
        if let Some(t) = config.thresholds.get(i) {
            last_observed.insert(t.signal.node_condition(), now);
        }
    }
    let conditions: Vec<NodeCondition> = last_observed
        .iter()
        .filter(|(_, at)| now.saturating_sub(**at) < config.pressure_transition_period)
        .map(|(c, _)| *c)
        .collect();
    // Forget conditions past the period: they can no longer be reported.
    last_observed.retain(|_, at| now.saturating_sub(*at) < config.pressure_transition_period);
    // 4. grace periods.
    let grace_met: Vec<usize> = first_observed
        .iter()
        .filter(|(i, at)| {
            config
                .thresholds
                .get(**i)
                .is_some_and(|t| now.saturating_sub(**at) >= t.grace_period)
        })
        .map(|(i, _)| *i)
        .collect();
    // 5. observation freshness.
    let updated = updated_since_last(config, state, observations, &grace_met);
    let mut episode = grace_met.clone();
    episode.sort_unstable();
    let mut new_state = State {
        thresholds_met: grace_met,
        first_observed,
        conditions_last_observed: last_observed,
        conditions: conditions.clone(),
        last_observations: observations.clone(),
        announced: if thresholds.is_empty() {
            Vec::new()
        } else {
            state.announced.clone()
        },
        ..State::default()
    };
    let mut decision = Synchronized {
        conditions,
        ..Synchronized::default()
    };
    if updated.is_empty() {
        return (new_state, decision);
    }
    // 6. eviction priority: memory signals first; hard before soft; then signal order.
    let mut ordered: Vec<(usize, &Threshold)> = updated
        .iter()
        .filter_map(|&i| config.thresholds.get(i).map(|t| (i, t)))
        .collect();
    ordered.sort_by_key(|(i, t)| (!t.signal.is_memory(), !t.is_hard(), t.signal, *i));
    let Some(&(_, to_reclaim)) = ordered.first() else {
        return (new_state, decision);
    };
    let signal = to_reclaim.signal;
    let resource = signal.resource();
    decision.reclaim = Some((signal, resource));
    if new_state.announced != episode {
        decision.node_event = Some(format!("Attempting to reclaim {resource}"));
        new_state.announced = episode;
    }
    decision.node_level_reclaim_first = signal.reclaims_node_level_first();
    if pods.is_empty() {
        return (new_state, decision);
    }
    // 7. rank and evict one non-critical pod.
    let sorted_thresholds: Vec<&Threshold> = ordered.iter().map(|(_, t)| *t).collect();
    let (first, critical) = first_eligible(signal, pods, |a| !a.is_critical());
    decision.skipped_critical = critical
        .into_iter()
        .filter_map(|i| pods.get(i))
        .map(|a| resources::pod_name(a.pod).to_owned())
        .collect();
    if let Some((index, active)) = first.and_then(|i| pods.get(i).map(|a| (i, a))) {
        let pod = active.pod;
        let grace_period_seconds = eviction_grace_period(config, to_reclaim, pod);
        let (message, annotations) =
            eviction_message(resource, active, &sorted_thresholds, observations);
        decision.eviction = Some(Eviction {
            index,
            namespace: resources::pod_namespace(pod).to_owned(),
            name: resources::pod_name(pod).to_owned(),
            uid: Arc::from(resources::pod_uid(pod)),
            signal,
            threshold: to_reclaim.clone(),
            grace_period_seconds,
            message,
            annotations,
        });
    }
    (new_state, decision)
}
