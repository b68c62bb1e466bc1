//! The eviction manager's `synchronize` (`pkg/kubelet/eviction/eviction_manager.go`) as a
//! step function, and its admission handler (`Admit`).

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};

use super::{
    NodeCondition, Observations, PodStats, Resource, Signal, Threshold,
    rank::{PodFacts, first_eligible},
};
use crate::{
    policy::{qos, resources},
    quantity::Quantity,
};

/// The eviction `Reason` of pod statuses and events.
pub const REASON: &str = "Evicted";
/// Kubelet's `immediateEvictionGracePeriodSeconds` for hard thresholds.
pub const IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS: i64 = 1;

/// The eviction manager's configuration (`eviction.Config`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EvictionConfig {
    /// Thresholds, from [`super::parse_threshold_config`].
    pub thresholds: Vec<Threshold>,
    /// `evictionMaxPodGracePeriod` in seconds.
    pub max_pod_grace_period_seconds: i64,
    /// `evictionPressureTransitionPeriod`.
    pub pressure_transition_period: Duration,
}

/// What the manager remembers between steps. Thresholds are named by their index in
/// [`EvictionConfig::thresholds`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    /// Thresholds whose grace period was satisfied in the last step (`m.thresholdsMet`).
    pub thresholds_met: Vec<usize>,
    /// When each currently met threshold was first observed.
    pub first_observed: BTreeMap<usize, Duration>,
    /// When each node condition was last observed.
    pub conditions_last_observed: BTreeMap<NodeCondition, Duration>,
    /// The node conditions reported now, sorted by name.
    pub conditions: Vec<NodeCondition>,
    /// The last step's observations.
    pub last_observations: Observations,
    /// The actionable thresholds the node event `EvictionThresholdMet` was last emitted for;
    /// emptied when no threshold is met (the episode ends). The event is emitted once per
    /// episode and again whenever this set changes, not at every step.
    pub announced: Vec<usize>,
}

/// A pod the manager may evict: the pod and its usage (`None`: no stats).
#[derive(Debug, Clone, Copy)]
pub struct ActivePod<'a> {
    /// The pod (API-defaulted).
    pub pod: &'a Pod,
    /// Its usage.
    pub stats: Option<&'a PodStats>,
    /// What ranking reads from the spec, when the caller keeps it per pod (computed from
    /// `pod` at every step otherwise); it must be [`PodFacts::of`] this pod.
    pub facts: Option<&'a PodFacts>,
}

impl<'a> ActivePod<'a> {
    /// A pod and its usage; its facts are read from the spec when needed.
    #[must_use]
    pub fn new(pod: &'a Pod, stats: Option<&'a PodStats>) -> Self {
        Self {
            pod,
            stats,
            facts: None,
        }
    }

    /// With the pod's facts computed ahead (when it was admitted).
    #[must_use]
    pub fn with_facts(mut self, facts: &'a PodFacts) -> Self {
        self.facts = Some(facts);
        self
    }

    /// `IsCriticalPod`.
    #[must_use]
    pub fn is_critical(&self) -> bool {
        self.facts
            .map_or_else(|| resources::is_critical(self.pod), |f| f.critical)
    }
}

/// A pod eviction decided by the step.
#[must_use]
#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    /// Index of the pod in the `pods` slice given to [`step`].
    pub index: usize,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid.
    pub uid: String,
    /// The signal acted on.
    pub signal: Signal,
    /// The threshold acted on.
    pub threshold: Threshold,
    /// Grace period to kill the pod with (hard: 1; soft: min(evictionMaxPodGracePeriod,
    /// terminationGracePeriodSeconds), never below 1 as the pod workers enforce).
    pub grace_period_seconds: i64,
    /// The pod status and event message.
    pub message: String,
    /// Event annotations (`offending_containers`, `offending_containers_usage`,
    /// `starved_resource`).
    pub annotations: BTreeMap<String, String>,
}

/// The step's decision.
#[must_use]
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepDecision {
    /// Node conditions to report, sorted by name.
    pub conditions: Vec<NodeCondition>,
    /// The starved resource and the threshold to reclaim, when one is actionable.
    pub reclaim: Option<(Signal, Resource)>,
    /// The node event `EvictionThresholdMet` text, when reclaiming (`Attempting to reclaim
    /// memory`).
    pub node_event: Option<String>,
    /// For disk signals kubelet first reclaims node-level resources (dead containers, unused
    /// images), re-observes, and evicts only if [`resolved_after_node_reclaim`] says no.
    pub node_level_reclaim_first: bool,
    /// The pod to evict (at most one per step).
    pub eviction: Option<Eviction>,
    /// Critical pods ranked before the evicted one and skipped.
    pub skipped_critical: Vec<String>,
}

fn met(
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

/// One round of the eviction manager (`synchronize`), at time `now`.
///
/// `pods` are the active pods with their stats. Returns the new state and the decision.
pub fn step(
    config: &EvictionConfig,
    state: &State,
    observations: &Observations,
    pods: &[ActivePod<'_>],
    now: Duration,
) -> (State, StepDecision) {
    // 1. thresholds met ignoring grace periods, plus last round's not yet reclaimed.
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
    let updated: Vec<usize> = grace_met
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
        .collect();
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
    };
    let mut decision = StepDecision {
        conditions,
        ..StepDecision::default()
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
        let grace_period_seconds = if to_reclaim.is_hard() {
            IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS
        } else {
            let max = config.max_pod_grace_period_seconds;
            let g = pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .map_or(max, |t| max.min(t));
            g.max(1)
        };
        let (message, annotations) =
            eviction_message(resource, active, &sorted_thresholds, observations);
        decision.eviction = Some(Eviction {
            index,
            namespace: resources::pod_namespace(pod).to_owned(),
            name: resources::pod_name(pod).to_owned(),
            uid: resources::pod_uid(pod).to_owned(),
            signal,
            threshold: to_reclaim.clone(),
            grace_period_seconds,
            message,
            annotations,
        });
    }
    (new_state, decision)
}

/// kubelet's `podCleanupTimeout`: the longest the manager waits for an evicted pod's
/// resources to be released before it may evict another.
pub const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// kubelet's `waitForPodsCleanup` as state: after an eviction no further pod is evicted until
/// the victim's resources are released (its worker finished: containers, logs and pod cgroup
/// removed) or [`POD_CLEANUP_TIMEOUT`] passed. kubelet blocks its loop in that wait; stepping
/// on kernel signals, the enforcer keeps stepping (conditions stay current) but holds back
/// evictions, and the step after the release observes anew, so what the victim freed is seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupWait {
    /// The evicted pod.
    pub uid: String,
    /// When it was evicted.
    pub since: Duration,
}

/// What a [`CleanupWait`] says at a step.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleanup {
    /// Still waiting: no eviction in this step.
    Waiting,
    /// The victim's resources were released: observe anew, then evictions may resume.
    Released,
    /// The wait timed out (kubelet logs and goes on).
    TimedOut,
}

impl CleanupWait {
    /// Whether the wait is over at `now`, given whether the victim's resources are released.
    pub fn check(&self, now: Duration, released: bool) -> Cleanup {
        if released {
            Cleanup::Released
        } else if now.saturating_sub(self.since) >= POD_CLEANUP_TIMEOUT {
            Cleanup::TimedOut
        } else {
            Cleanup::Waiting
        }
    }
}

/// Minimum time between two node-level reclaims (and so between two disk-pressure
/// evictions); kubelet's is its 10 s housekeeping period.
pub const NODE_RECLAIM_INTERVAL: Duration = Duration::from_secs(1);

/// Paces node-level reclaim: at most one per [`NODE_RECLAIM_INTERVAL`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimPacer {
    last: Option<Duration>,
}

impl ReclaimPacer {
    /// Whether a reclaim may run at `now`; when it may, it is counted as run.
    pub fn due(&mut self, now: Duration) -> bool {
        if self
            .last
            .is_some_and(|at| now.saturating_sub(at) < NODE_RECLAIM_INTERVAL)
        {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// After node-level reclaim for a disk signal: true when, with the new observations, no
/// threshold is met counting minimum reclaim, so no pod needs to be evicted
/// (`reclaimNodeLevelResources`).
#[must_use]
pub fn resolved_after_node_reclaim(config: &EvictionConfig, observations: &Observations) -> bool {
    met(config, 0..config.thresholds.len(), observations, true).is_empty()
}

/// When the manager next needs a step even if no signal arrives (kubelet would find out on its
/// next housekeeping round): a met soft threshold's grace period ending, or a reported node
/// condition's pressure-transition period ending. Only instants strictly after `now`.
#[must_use]
pub fn next_deadline(config: &EvictionConfig, state: &State, now: Duration) -> Option<Duration> {
    let grace = state.first_observed.iter().filter_map(|(i, at)| {
        let t = config.thresholds.get(*i)?;
        (!t.is_hard()).then(|| at.saturating_add(t.grace_period))
    });
    let transition = state
        .conditions_last_observed
        .values()
        .map(|at| at.saturating_add(config.pressure_transition_period));
    grace.chain(transition).filter(|d| *d > now).min()
}

/// `evictionMessage`: `The node was low on resource: memory. Threshold quantity: 2Gi,
/// available: 1500Mi. Container app was using 700Mi, request is 100Mi, has larger consumption
/// of memory. ` and the event annotations.
#[must_use]
pub fn eviction_message(
    resource: Resource,
    pod: &ActivePod<'_>,
    thresholds: &[&Threshold],
    observations: &Observations,
) -> (String, BTreeMap<String, String>) {
    let mut message = format!("The node was low on resource: {resource}. ");
    if let Some((t, obs)) = thresholds
        .iter()
        .filter(|t| t.signal.resource() == resource)
        .find_map(|t| observations.get(&t.signal).map(|o| (t, o)))
    {
        let quantity = t.value.resolve(obs.capacity);
        let available = Quantity::from_int(obs.available, t.signal.format());
        let _ = write!(
            message,
            "Threshold quantity: {quantity}, available: {available}. "
        );
    }
    let mut annotations = BTreeMap::new();
    let Some(stats) = pod.stats else {
        return (message, annotations);
    };
    let mut offending = Vec::new();
    let mut usages = Vec::new();
    for cs in &stats.containers {
        for c in resources::containers(pod.pod)
            .iter()
            .filter(|c| c.name == cs.name)
        {
            let request = resources::container_requests(c)
                .get(resource.as_str())
                .copied()
                .unwrap_or_default();
            let usage = match resource {
                Resource::Memory => cs.memory,
                Resource::EphemeralStorage => cs.ephemeral_storage,
                Resource::Inodes | Resource::Pids => None,
            };
            if let Some(u) = usage {
                let u = Quantity::from_int(u, crate::quantity::Format::BinarySI);
                if u > request {
                    let _ = write!(
                        message,
                        "Container {} was using {u}, request is {request}, has larger consumption of {resource}. ",
                        c.name
                    );
                    offending.push(c.name.clone());
                    usages.push(u.to_string());
                }
            }
        }
    }
    annotations.insert("offending_containers".to_owned(), offending.join(","));
    annotations.insert("offending_containers_usage".to_owned(), usages.join(","));
    annotations.insert("starved_resource".to_owned(), resource.as_str().to_owned());
    (message, annotations)
}

/// The result of an admission check.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitResult {
    /// Admitted or not.
    pub admitted: bool,
    /// `Evicted`, `OutOfcpu`, ... when rejected.
    pub reason: String,
    /// The message when rejected.
    pub message: String,
}

impl AdmitResult {
    /// Admitted.
    pub fn admit() -> Self {
        Self {
            admitted: true,
            reason: String::new(),
            message: String::new(),
        }
    }
    /// Rejected.
    pub fn reject(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            admitted: false,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// `TolerationsTolerateTaint` for one taint.
#[must_use]
pub fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| toleration_tolerates(t, taint))
}

/// `Toleration.ToleratesTaint`.
#[must_use]
pub fn toleration_tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect = t.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = t.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

/// The eviction manager's `Admit` under the current node conditions (sorted by name).
pub fn admit(conditions: &[NodeCondition], pod: &Pod) -> AdmitResult {
    if conditions.is_empty() || resources::is_critical(pod) {
        return AdmitResult::admit();
    }
    if conditions == [NodeCondition::MemoryPressure] {
        if qos::pod_qos(pod) != qos::QosClass::BestEffort {
            return AdmitResult::admit();
        }
        let taint = Taint {
            key: NodeCondition::MemoryPressure.taint_key().to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        };
        let tolerations = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or(&[]);
        if tolerates(tolerations, &taint) {
            return AdmitResult::admit();
        }
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
    AdmitResult::reject(
        REASON,
        format!("The node had condition: [{}]. ", names.join(" ")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{
        eviction::{Observation, ThresholdValue},
        resources::test_pods::{container, pod},
    };

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }
    fn obs(signal: Signal, avail: &str, cap: &str, at: u64) -> Observations {
        [(
            signal,
            Observation {
                available: q(avail).value(),
                capacity: q(cap).value(),
                time: Some(Duration::from_secs(at)),
            },
        )]
        .into()
    }
    fn hard(signal: Signal, v: &str) -> Threshold {
        Threshold {
            signal,
            value: ThresholdValue::Quantity(q(v)),
            grace_period: Duration::ZERO,
            min_reclaim: None,
        }
    }
    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn memory_pressure_hard_and_transition() {
        // After eviction_manager_test.go TestMemoryPressure (hard threshold part).
        let config = EvictionConfig {
            thresholds: vec![hard(Signal::MemoryAvailable, "1Gi")],
            max_pod_grace_period_seconds: 5,
            pressure_transition_period: Duration::from_secs(300),
        };
        let be = pod("best-effort-high", vec![container("a", "", "")]);
        let mut bu = pod(
            "burstable-below",
            vec![container("a", "memory=100Mi", "memory=1Gi")],
        );
        bu.spec.as_mut().unwrap().termination_grace_period_seconds = Some(30);
        let s_be = PodStats {
            memory: Some(400 << 20),
            ..Default::default()
        };
        let s_bu = PodStats {
            memory: Some(300 << 20),
            containers: vec![super::super::ContainerStats {
                name: "a".into(),
                memory: Some(300 << 20),
                ephemeral_storage: None,
            }],
            ..Default::default()
        };
        let pods = [
            ActivePod::new(&be, Some(&s_be)),
            ActivePod::new(&bu, Some(&s_bu)),
        ];
        let state = State::default();
        // No pressure.
        let (state, d) = step(
            &config,
            &state,
            &obs(Signal::MemoryAvailable, "2Gi", "8Gi", 0),
            &pods,
            secs(0),
        );
        assert!(d.conditions.is_empty() && d.eviction.is_none());
        // Pressure: evict the best-effort pod (exceeds its zero request, larger usage over request).
        let (state, d) = step(
            &config,
            &state,
            &obs(Signal::MemoryAvailable, "500Mi", "8Gi", 10),
            &pods,
            secs(10),
        );
        assert_eq!(d.conditions, [NodeCondition::MemoryPressure]);
        let e = d.eviction.unwrap();
        assert_eq!(e.name, "best-effort-high");
        assert_eq!(e.grace_period_seconds, 1);
        assert_eq!(
            e.message,
            "The node was low on resource: memory. Threshold quantity: 1Gi, available: 500Mi. "
        );
        assert_eq!(
            d.node_event.as_deref(),
            Some("Attempting to reclaim memory")
        );
        // Stale stats: no second eviction.
        let (state, d) = step(
            &config,
            &state,
            &obs(Signal::MemoryAvailable, "500Mi", "8Gi", 10),
            &pods[1..],
            secs(20),
        );
        assert!(d.eviction.is_none());
        assert_eq!(d.conditions, [NodeCondition::MemoryPressure]);
        // Fresh stats: the burstable pod goes, with a container sentence; the node event was
        // emitted once for this episode, not again.
        let (state, d) = step(
            &config,
            &state,
            &obs(Signal::MemoryAvailable, "500Mi", "8Gi", 30),
            &pods[1..],
            secs(30),
        );
        assert_eq!(d.node_event, None, "EvictionThresholdMet once per episode");
        let e = d.eviction.unwrap();
        assert_eq!(
            e.message,
            "The node was low on resource: memory. Threshold quantity: 1Gi, available: 500Mi. Container a was using 300Mi, request is 100Mi, has larger consumption of memory. "
        );
        // Pressure gone, but the condition stays for the transition period.
        let (state, d) = step(
            &config,
            &state,
            &obs(Signal::MemoryAvailable, "2Gi", "8Gi", 40),
            &pods[1..],
            secs(40),
        );
        assert_eq!(d.conditions, [NodeCondition::MemoryPressure]);
        assert!(d.eviction.is_none());
        assert!(state.announced.is_empty(), "the episode ended");
        // A new episode announces again.
        let (state, d) = step(
            &config,
            &state,
            &obs(Signal::MemoryAvailable, "500Mi", "8Gi", 50),
            &pods[1..],
            secs(50),
        );
        assert_eq!(
            d.node_event.as_deref(),
            Some("Attempting to reclaim memory")
        );
        let (_, d) = step(
            &config,
            &state,
            &obs(Signal::MemoryAvailable, "2Gi", "8Gi", 400),
            &pods[1..],
            secs(400),
        );
        assert!(d.conditions.is_empty());
    }

    #[test]
    fn node_level_reclaim_is_paced() {
        let mut p = ReclaimPacer::default();
        let ms = Duration::from_millis;
        let got: Vec<bool> = [0, 10, 999, 1000, 1500, 2100]
            .into_iter()
            .map(|t| p.due(ms(t)))
            .collect();
        assert_eq!(got, [true, false, false, true, false, true]);
    }

    #[test]
    fn cleanup_wait_holds_evictions_until_released_or_timed_out() {
        let w = CleanupWait {
            uid: "u".into(),
            since: secs(10),
        };
        for (now, released, want) in [
            (10, false, Cleanup::Waiting),
            (39, false, Cleanup::Waiting),
            (40, false, Cleanup::TimedOut),
            (11, true, Cleanup::Released),
            (100, true, Cleanup::Released),
        ] {
            assert_eq!(
                w.check(secs(now), released),
                want,
                "at {now} s, released {released}"
            );
        }
    }

    #[test]
    fn soft_grace_period_and_min_reclaim() {
        let mut soft = hard(Signal::MemoryAvailable, "2Gi");
        soft.grace_period = secs(120);
        let mut h = hard(Signal::MemoryAvailable, "1Gi");
        h.min_reclaim = Some(ThresholdValue::Quantity(q("500Mi")));
        let config = EvictionConfig {
            thresholds: vec![h, soft],
            max_pod_grace_period_seconds: 5,
            pressure_transition_period: secs(300),
        };
        let p = pod("p", vec![container("a", "", "")]);
        let s = PodStats {
            memory: Some(1),
            ..Default::default()
        };
        let pods = [ActivePod::new(&p, Some(&s))];
        // Soft met: condition at once, no eviction before the grace period.
        let (st, d) = step(
            &config,
            &State::default(),
            &obs(Signal::MemoryAvailable, "1500Mi", "8Gi", 0),
            &pods,
            secs(0),
        );
        assert_eq!(d.conditions, [NodeCondition::MemoryPressure]);
        assert!(d.eviction.is_none());
        // The next step is due when the grace period ends (before the condition's transition).
        assert_eq!(next_deadline(&config, &st, secs(0)), Some(secs(120)));
        assert_eq!(next_deadline(&config, &st, secs(120)), Some(secs(300)));
        assert_eq!(next_deadline(&config, &st, secs(300)), None);
        let (st, d) = step(
            &config,
            &st,
            &obs(Signal::MemoryAvailable, "1500Mi", "8Gi", 60),
            &pods,
            secs(60),
        );
        assert!(d.eviction.is_none());
        let (st, d) = step(
            &config,
            &st,
            &obs(Signal::MemoryAvailable, "1500Mi", "8Gi", 120),
            &pods,
            secs(120),
        );
        assert_eq!(d.eviction.as_ref().unwrap().grace_period_seconds, 5);
        // Hard met, then above the threshold but below threshold + min reclaim: still met.
        let (st, d) = step(
            &config,
            &st,
            &obs(Signal::MemoryAvailable, "900Mi", "8Gi", 130),
            &pods,
            secs(130),
        );
        assert_eq!(d.eviction.as_ref().unwrap().grace_period_seconds, 1);
        let (st, d) = step(
            &config,
            &st,
            &obs(Signal::MemoryAvailable, "1100Mi", "8Gi", 140),
            &pods,
            secs(140),
        );
        assert_eq!(
            d.eviction.as_ref().unwrap().threshold.value,
            ThresholdValue::Quantity(q("1Gi"))
        );
        // Past min reclaim (1.5Gi) the hard threshold is resolved; the soft one, met since
        // t=0, acts with its grace period.
        let (_, d) = step(
            &config,
            &st,
            &obs(Signal::MemoryAvailable, "1600Mi", "8Gi", 150),
            &pods,
            secs(150),
        );
        assert_eq!(d.eviction.as_ref().unwrap().grace_period_seconds, 5);
    }

    #[test]
    fn critical_pods_are_skipped() {
        let config = EvictionConfig {
            thresholds: vec![hard(Signal::PidAvailable, "100")],
            pressure_transition_period: secs(60),
            ..EvictionConfig::default()
        };
        let mut crit = pod("critical", vec![container("a", "", "")]);
        crit.spec.as_mut().unwrap().priority = Some(-5);
        crit.metadata.annotations =
            Some([(resources::CONFIG_SOURCE_ANNOTATION.into(), "file".into())].into());
        let other = pod("other", vec![container("a", "", "")]);
        let s = PodStats {
            processes: Some(50),
            ..Default::default()
        };
        let pods = [
            ActivePod::new(&crit, Some(&s)),
            ActivePod::new(&other, Some(&s)),
        ];
        let (_, d) = step(
            &config,
            &State::default(),
            &obs(Signal::PidAvailable, "10", "1000", 1),
            &pods,
            secs(1),
        );
        assert_eq!(d.skipped_critical, ["critical"]);
        let e = d.eviction.unwrap();
        assert_eq!(e.name, "other");
        assert_eq!(
            e.message,
            "The node was low on resource: pids. Threshold quantity: 100, available: 10. "
        );
        assert_eq!(d.conditions, [NodeCondition::PidPressure]);
        let (_, d) = step(
            &config,
            &State::default(),
            &obs(Signal::PidAvailable, "10", "1000", 1),
            &pods[..1],
            secs(1),
        );
        assert!(d.eviction.is_none());
    }

    #[test]
    fn admission_under_conditions() {
        // After eviction_manager_test.go (TestAdmit... within TestMemoryPressure / TestDiskPressure).
        let be = pod("be", vec![container("a", "", "")]);
        let bu = pod("bu", vec![container("a", "memory=1Gi", "")]);
        assert!(admit(&[], &be).admitted);
        assert!(admit(&[NodeCondition::MemoryPressure], &bu).admitted);
        let r = admit(&[NodeCondition::MemoryPressure], &be);
        assert_eq!(
            (r.admitted, r.reason.as_str(), r.message.as_str()),
            (
                false,
                "Evicted",
                "The node had condition: [MemoryPressure]. "
            )
        );
        let mut tol = be.clone();
        tol.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some("node.kubernetes.io/memory-pressure".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
        assert!(admit(&[NodeCondition::MemoryPressure], &tol).admitted);
        assert!(!admit(&[NodeCondition::DiskPressure], &bu).admitted);
        assert_eq!(
            admit(
                &[NodeCondition::DiskPressure, NodeCondition::MemoryPressure],
                &tol
            )
            .message,
            "The node had condition: [DiskPressure MemoryPressure]. "
        );
        let mut crit = be;
        crit.spec.as_mut().unwrap().priority = Some(2_000_000_000);
        assert!(admit(&[NodeCondition::DiskPressure], &crit).admitted);
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::policy::{
        eviction::{Observation, ThresholdValue},
        resources::test_pods::{container, pod},
    };

    /// (priority, critical, memory request MiB, usage MiB or no stats)
    fn pods_strategy() -> impl Strategy<Value = Vec<(i32, bool, u32, Option<u32>)>> {
        prop::collection::vec(
            (
                -5i32..5,
                any::<bool>(),
                0u32..64,
                prop::option::of(0u32..128),
            ),
            0..24,
        )
    }

    fn build(spec: &[(i32, bool, u32, Option<u32>)]) -> (Vec<Pod>, Vec<Option<PodStats>>) {
        let pods = spec
            .iter()
            .enumerate()
            .map(|(i, (prio, critical, req, _))| {
                let mut p = pod(
                    &format!("p{i}"),
                    vec![container("c", &format!("memory={req}Mi"), "")],
                );
                p.spec.as_mut().unwrap().priority =
                    Some(if *critical { 2_000_000_000 } else { *prio });
                p
            })
            .collect();
        let stats = spec
            .iter()
            .map(|(.., usage)| {
                usage.map(|u| PodStats {
                    memory: Some(i64::from(u) << 20),
                    processes: Some(i64::from(u)),
                    ..Default::default()
                })
            })
            .collect();
        (pods, stats)
    }

    proptest! {
        #[test]
        fn ranking_is_input_order_independent(spec in pods_strategy(), seed in any::<u64>(), pids in any::<bool>()) {
            let (pods, stats) = build(&spec);
            let signal = if pids { Signal::PidAvailable } else { Signal::MemoryAvailable };
            let active: Vec<ActivePod<'_>> = pods.iter().zip(&stats).map(|(p, s)| ActivePod::new(p, s.as_ref())).collect();
            let names = |a: &[ActivePod<'_>]| -> Vec<String> {
                crate::policy::eviction::rank::rank(signal, a).into_iter().map(|i| resources::pod_name(a[i].pod).to_owned()).collect()
            };
            let first = names(&active);
            // A deterministic shuffle from the seed.
            let mut shuffled = active.clone();
            let mut x = seed | 1;
            for i in (1..shuffled.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                shuffled.swap(i, usize::try_from(x % (i as u64 + 1)).unwrap());
            }
            prop_assert_eq!(&first, &names(&shuffled));
            prop_assert_eq!(first.len(), active.len());
            // Facts kept per pod rank exactly as facts read from the spec.
            let facts: Vec<PodFacts> = pods.iter().map(PodFacts::of).collect();
            let kept: Vec<ActivePod<'_>> = active.iter().zip(&facts).map(|(a, f)| a.with_facts(f)).collect();
            prop_assert_eq!(&first, &names(&kept));
        }

        #[test]
        fn first_eligible_is_the_first_of_the_ranking(spec in pods_strategy(), pids in any::<bool>()) {
            let (pods, stats) = build(&spec);
            let signal = if pids { Signal::PidAvailable } else { Signal::MemoryAvailable };
            let active: Vec<ActivePod<'_>> = pods.iter().zip(&stats).map(|(p, s)| ActivePod::new(p, s.as_ref())).collect();
            let ranked = crate::policy::eviction::rank::rank(signal, &active);
            let eligible = |a: &ActivePod<'_>| !resources::is_critical(a.pod);
            let at = ranked.iter().position(|&i| eligible(&active[i]));
            let (first, skipped) = first_eligible(signal, &active, eligible);
            prop_assert_eq!(first, at.map(|p| ranked[p]));
            prop_assert_eq!(&skipped[..], &ranked[..at.unwrap_or(ranked.len())]);
        }

        #[test]
        fn step_never_evicts_critical_nor_more_than_one(
            spec in pods_strategy(),
            avail in prop::collection::vec(0i64..4096, 1..6),
        ) {
            let (pods, stats) = build(&spec);
            let active: Vec<ActivePod<'_>> = pods.iter().zip(&stats).map(|(p, s)| ActivePod::new(p, s.as_ref())).collect();
            let config = EvictionConfig {
                thresholds: vec![
                    Threshold { signal: Signal::MemoryAvailable, value: ThresholdValue::Quantity(Quantity::from_int(1 << 30, crate::quantity::Format::BinarySI)), grace_period: Duration::ZERO, min_reclaim: None },
                    Threshold { signal: Signal::MemoryAvailable, value: ThresholdValue::Percentage(0.5), grace_period: Duration::from_secs(20), min_reclaim: None },
                ],
                max_pod_grace_period_seconds: 10,
                pressure_transition_period: Duration::from_secs(30),
            };
            let mut state = State::default();
            for (i, a) in avail.iter().enumerate() {
                let now = Duration::from_secs(10 * i as u64);
                let obs: Observations = [(Signal::MemoryAvailable, Observation { available: a << 20, capacity: 4 << 30, time: Some(now) })].into();
                let (next, d) = step(&config, &state, &obs, &active, now);
                state = next;
                if let Some(e) = &d.eviction {
                    prop_assert!(!resources::is_critical(active[e.index].pod));
                    prop_assert!(e.grace_period_seconds >= 1);
                }
                let non_critical = active.iter().filter(|a| !resources::is_critical(a.pod)).count();
                if d.reclaim.is_some() && non_critical > 0 {
                    prop_assert!(d.eviction.is_some());
                }
            }
        }
    }
}
