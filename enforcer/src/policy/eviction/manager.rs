//! The eviction manager's `synchronize` (`pkg/kubelet/eviction/eviction_manager.go`) as a
//! step function, and its admission handler (`Admit`).
//!
//! [`step`] takes what the executor observed ([`Input`]) and names the one thing to do
//! ([`Action`]): wait for the last victim's cleanup, reclaim node-level resources, evict a
//! pod (and how its processes stop: SIGKILL first, capped first, or the orderly stop alone),
//! evict pods over their local storage, observe again, or nothing; and whether a capped victim
//! still stopping must be killed now. Its parts:
//! - `synchronize`, the thresholds (met, grace periods, conditions, the pod ranked first);
//! - `cleanup`, kubelet's `waitForPodsCleanup`;
//! - `reclaim`, node-level reclaim before disk-pressure evictions;
//! - `message`, `evictionMessage`;
//! - `admit`, the eviction manager's `Admit`.

mod admit;
mod cleanup;
mod message;
mod reclaim;
mod synchronize;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

pub use admit::{AdmitResult, admit, tolerates, toleration_tolerates};
pub use cleanup::{Cleanup, CleanupEnd, CleanupWait, POD_CLEANUP_TIMEOUT};
pub use message::eviction_message;
pub use reclaim::{NODE_RECLAIM_INTERVAL, ReclaimPacer, resolved_after_node_reclaim};

pub use super::ActivePod;
use super::{
    NodeCondition, Observations, Resource, Signal, Threshold,
    local_storage::{self, LocalStorageEviction},
    throttle::{self, Stop},
};
use crate::policy::resources;

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
    /// `enforcer.throttleBeforeEvict`: the memory signals whose hard threshold caps the victim,
    /// then stops it gracefully (`super::throttle`).
    pub throttle_before_evict: Vec<Signal>,
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
    /// The cleanup wait after the last eviction (kubelet's `waitForPodsCleanup`).
    pub cleanup: Option<CleanupWait>,
    /// Paces node-level reclaim.
    pub reclaim: ReclaimPacer,
    /// A node-level reclaim decided and not yet reported back ([`Input::node_reclaim`]): the
    /// eviction that follows unless it resolved the pressure.
    pub after_reclaim: Option<AfterReclaim>,
    /// Pods evicted for their local storage (asked once; forgotten when they leave).
    pub local_storage_evicted: BTreeSet<String>,
    /// The last victim, capped and stopping gracefully ([`VictimStop::CapFirst`]), while its
    /// cleanup is awaited.
    pub throttled: Option<Throttled>,
}

/// A victim capped at its usage and stopping gracefully: SIGKILLed if the node falls below
/// `floor` of `signal` before it is gone ([`StepDecision::kill_throttled`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttled {
    pub uid: Arc<str>,
    pub signal: Signal,
    pub floor: i64,
}

/// How an evicted pod's processes stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VictimStop {
    /// The pod worker's orderly stop with the eviction's grace period (kubelet's `evictPod`).
    Orderly,
    /// A hard memory threshold: SIGKILL to every process of the pod cgroup before anything
    /// else (memory cannot wait for the bookkeeping), then the orderly stop.
    KillFirst,
    /// `enforcer.throttleBeforeEvict`: the pod cgroup capped at its usage now, then the
    /// orderly stop with the eviction's grace period; SIGKILL if the node falls below `floor`
    /// of the signal before the pod is gone. An executor that cannot cap kills first instead.
    CapFirst { floor: i64 },
}

impl State {
    /// The pod the cleanup wait is still on at `now`, given whether it released its resources
    /// ([`Input::released`]): the executor leaves it out of what it observes.
    #[must_use]
    pub fn awaited(&self, now: Duration, released: bool) -> Option<&str> {
        self.cleanup
            .as_ref()
            .filter(|w| w.check(now, released) == Cleanup::Waiting)
            .map(|w| &*w.uid)
    }
}

/// A pod eviction decided by the step (kubelet's `evictPod` arguments).
#[must_use]
#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    /// Index of the pod in the `pods` slice given to [`step`].
    pub index: usize,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid (shared with the cleanup wait the eviction starts).
    pub uid: Arc<str>,
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

/// A node-level reclaim under way (see [`State::after_reclaim`]).
#[derive(Debug, Clone, PartialEq)]
pub struct AfterReclaim {
    /// The signal reclaimed for and its resource.
    pub reclaim: (Signal, Resource),
    /// The pod to evict if the reclaim did not resolve the pressure (`None`: no pod to evict).
    pub eviction: Option<Eviction>,
}

/// What the executor found after the node-level reclaim a step asked for.
#[derive(Debug, Clone, Copy)]
pub enum NodeReclaimed<'a> {
    /// Reclaimed, and the node observed again.
    Observed(&'a Observations),
    /// The reclaim or the observation after it failed (or there is no runtime to reclaim
    /// through): as if nothing was freed.
    Failed,
}

fn always(_: &str) -> bool {
    true
}

/// What the executor observed for one step.
#[derive(Clone, Copy)]
pub struct Input<'a> {
    /// Node-level observations.
    pub observations: &'a Observations,
    /// The active pods with their stats.
    pub pods: &'a [ActivePod<'a>],
    /// The step's time.
    pub now: Duration,
    /// Every pod's figures were read for this step (else some were carried over; a victim is
    /// chosen on fresh figures only, so the step asks to [`Action::Reobserve`] first).
    pub pods_fresh: bool,
    /// The pods' local storage was walked for this step: kubelet's `localStorageEviction`
    /// runs on those figures.
    pub local_storage_walked: bool,
    /// Whether the pod of the cleanup wait ([`State::cleanup`]) released its resources: its
    /// worker finished (containers, logs, pod cgroup removed) and its memory cgroup is gone.
    pub released: bool,
    /// Whether a pod is still active (local-storage evictions are remembered until it leaves).
    pub is_active: &'a (dyn Fn(&str) -> bool + Sync),
    /// The node-level reclaim the last step asked for ([`Action::ReclaimNodeLevel`]), carried
    /// out.
    pub node_reclaim: Option<NodeReclaimed<'a>>,
}

impl<'a> Input<'a> {
    /// Observations and pods at `now`, every pod read, nothing walked, no victim released,
    /// every pod active, no node-level reclaim carried out.
    #[must_use]
    pub fn new(observations: &'a Observations, pods: &'a [ActivePod<'a>], now: Duration) -> Self {
        Self {
            observations,
            pods,
            now,
            pods_fresh: true,
            local_storage_walked: false,
            released: false,
            is_active: &always,
            node_reclaim: None,
        }
    }
}

impl std::fmt::Debug for Input<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("observations", self.observations)
            .field("pods", &self.pods.len())
            .field("now", &self.now)
            .field("pods_fresh", &self.pods_fresh)
            .field("local_storage_walked", &self.local_storage_walked)
            .field("released", &self.released)
            .field("node_reclaim", &self.node_reclaim)
            .finish_non_exhaustive()
    }
}

/// Why a step does nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// No threshold to act on (kubelet: no resources are starved).
    NotStarved,
    /// A node-level reclaim ran less than [`NODE_RECLAIM_INTERVAL`] ago: this step evicts
    /// nobody for disk.
    ReclaimPaced,
    /// The node-level reclaim resolved the pressure without evicting pods.
    ReclaimedEnough,
    /// Thresholds are met but no pod may be evicted (none active, or all critical).
    NoPodToEvict,
}

/// The one thing a step decides.
#[must_use]
#[derive(Debug, Clone, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one decision a step, moved, never copied; boxing the eviction would allocate on the crossing path"
)]
pub enum Action {
    /// Nothing to do.
    Nothing(Idle),
    /// The last victim's resources are not released yet (kubelet's `waitForPodsCleanup`):
    /// no pod is evicted for thresholds.
    WaitForCleanup,
    /// A victim would be chosen on figures some of which were carried over: read every pod
    /// and step again (the returned state is the one given).
    Reobserve,
    /// Reclaim node-level resources (dead containers, unused images) for a disk signal,
    /// observe the node again and step again with [`Input::node_reclaim`].
    ReclaimNodeLevel {
        /// The signal reclaimed for.
        signal: Signal,
        /// Its resource.
        resource: Resource,
    },
    /// Evict one pod for a threshold.
    Evict {
        /// The pod, grace period and message.
        eviction: Eviction,
        /// How its processes stop.
        stop: VictimStop,
    },
    /// Evict every pod over its local storage limits (grace period 0), before any threshold
    /// (kubelet's `localStorageEviction`).
    EvictLocalStorage(Vec<LocalStorageEviction>),
}

/// The step's decision: what to report and the one thing to do.
#[must_use]
#[derive(Debug, Clone, PartialEq)]
pub struct StepDecision {
    /// Node conditions to report, sorted by name.
    pub conditions: Vec<NodeCondition>,
    /// Whether they differ from the last step's.
    pub conditions_changed: bool,
    /// The starved resource and the threshold to reclaim, when one is actionable.
    pub reclaim: Option<(Signal, Resource)>,
    /// The node event `EvictionThresholdMet` text (`Attempting to reclaim memory`), once per
    /// episode of met thresholds and again when the set changes.
    pub node_event: Option<String>,
    /// Critical pods ranked before the evicted one and skipped.
    pub skipped_critical: Vec<String>,
    /// The cleanup wait that ended at this step.
    pub cleanup: Option<CleanupEnd>,
    /// The capped victim ([`State::throttled`]) to SIGKILL now: the node fell below its floor
    /// while it stopped. Carried out first, whatever the action.
    pub kill_throttled: Option<Arc<str>>,
    /// What to do.
    pub action: Action,
}

impl StepDecision {
    /// The threshold eviction decided, if any.
    #[must_use]
    pub fn eviction(&self) -> Option<&Eviction> {
        match &self.action {
            Action::Evict { eviction, .. } => Some(eviction),
            _ => None,
        }
    }
}

/// One round of the eviction manager (`synchronize`) on what the executor observed.
///
/// In kubelet's order: the thresholds (met, grace periods, node conditions, the pod ranked
/// first); observe again when that pod was chosen on carried-over figures; the pods over
/// their local storage; the wait for the last victim's cleanup; for disk signals node-level
/// reclaim first (paced), then the eviction unless the reclaim resolved the pressure. Returns
/// the new state and the decision; after [`Action::Reobserve`] or
/// [`Action::ReclaimNodeLevel`] the executor steps again with what it observed. First of all,
/// a capped victim still stopping is killed when the node fell below its floor.
pub fn step(config: &EvictionConfig, mut state: State, input: &Input<'_>) -> (State, StepDecision) {
    let kill_throttled = escalate(&mut state, input.observations);
    let (state, mut decision) = synchronize_and_act(config, state, input);
    decision.kill_throttled = kill_throttled;
    (state, decision)
}

/// The capped victim to kill now: the node fell below its floor while its cleanup is still
/// awaited. It is forgotten once killed or once its cleanup wait is over.
fn escalate(state: &mut State, observations: &Observations) -> Option<Arc<str>> {
    let t = state.throttled.take()?;
    if state.cleanup.as_ref().is_none_or(|w| w.uid != t.uid) {
        return None;
    }
    if throttle::must_kill(t.floor, t.signal, observations) {
        return Some(t.uid);
    }
    state.throttled = Some(t);
    None
}

/// [`step`] past the escalation.
fn synchronize_and_act(
    config: &EvictionConfig,
    mut state: State,
    input: &Input<'_>,
) -> (State, StepDecision) {
    let now = input.now;
    if let Some(after) = state.after_reclaim.take()
        && let Some(reclaimed) = input.node_reclaim
    {
        return after_node_reclaim(config, state, after, reclaimed, input);
    }
    let (mut next, sync) =
        synchronize::synchronize(config, &state, input.observations, input.pods, now);
    let waiting = state.awaited(now, input.released).is_some();
    if sync.eviction.is_some() && !input.pods_fresh && !waiting {
        let decision = StepDecision {
            conditions: sync.conditions,
            conditions_changed: false,
            reclaim: sync.reclaim,
            node_event: None,
            skipped_critical: Vec::new(),
            cleanup: None,
            kill_throttled: None,
            action: Action::Reobserve,
        };
        return (state, decision);
    }
    let (wait, ended) = cleanup::advance(state.cleanup.take(), now, input.released);
    next.cleanup = wait;
    next.reclaim = state.reclaim;
    next.local_storage_evicted = std::mem::take(&mut state.local_storage_evicted);
    next.throttled = state.throttled.take();
    let mut decision = StepDecision {
        conditions_changed: sync.conditions != state.conditions,
        conditions: sync.conditions,
        reclaim: sync.reclaim,
        node_event: sync.node_event,
        skipped_critical: sync.skipped_critical,
        cleanup: ended,
        kill_throttled: None,
        action: Action::Nothing(Idle::NotStarved),
    };
    if input.local_storage_walked {
        let evictions = local_storage_evictions(&mut next.local_storage_evicted, input);
        if !evictions.is_empty() {
            decision.action = Action::EvictLocalStorage(evictions);
            return (next, decision);
        }
    }
    if next.cleanup.is_some() {
        decision.action = Action::WaitForCleanup;
        return (next, decision);
    }
    let Some((signal, resource)) = decision.reclaim else {
        return (next, decision);
    };
    decision.action = if !sync.node_level_reclaim_first {
        evict(config, &mut next, sync.eviction, input)
    } else if next.reclaim.ready(now) {
        next.reclaim.ran(now);
        next.after_reclaim = Some(AfterReclaim {
            reclaim: (signal, resource),
            eviction: sync.eviction,
        });
        Action::ReclaimNodeLevel { signal, resource }
    } else {
        Action::Nothing(Idle::ReclaimPaced)
    };
    (next, decision)
}

/// The step resumed after node-level reclaim: evict unless the pressure is resolved
/// (`reclaimNodeLevelResources`); conditions and the node event went with the reclaim.
fn after_node_reclaim(
    config: &EvictionConfig,
    mut state: State,
    after: AfterReclaim,
    reclaimed: NodeReclaimed<'_>,
    input: &Input<'_>,
) -> (State, StepDecision) {
    let resolved = match reclaimed {
        NodeReclaimed::Observed(observations) => resolved_after_node_reclaim(config, observations),
        NodeReclaimed::Failed => false,
    };
    let action = if resolved {
        Action::Nothing(Idle::ReclaimedEnough)
    } else {
        evict(config, &mut state, after.eviction, input)
    };
    let decision = StepDecision {
        conditions: state.conditions.clone(),
        conditions_changed: false,
        reclaim: Some(after.reclaim),
        node_event: None,
        skipped_critical: Vec::new(),
        cleanup: None,
        kill_throttled: None,
        action,
    };
    (state, decision)
}

/// The eviction of the pod ranked first, if any, and how it stops; it starts the cleanup
/// wait (and, capped first, the watch on the node's floor).
fn evict(
    config: &EvictionConfig,
    state: &mut State,
    eviction: Option<Eviction>,
    input: &Input<'_>,
) -> Action {
    let Some(mut eviction) = eviction else {
        return Action::Nothing(Idle::NoPodToEvict);
    };
    state.cleanup = Some(CleanupWait {
        uid: Arc::clone(&eviction.uid),
        since: input.now,
    });
    let stop = victim_stop(config, &mut eviction, input);
    state.throttled = match stop {
        VictimStop::CapFirst { floor } => Some(Throttled {
            uid: Arc::clone(&eviction.uid),
            signal: eviction.signal,
            floor,
        }),
        VictimStop::Orderly | VictimStop::KillFirst => None,
    };
    Action::Evict { eviction, stop }
}

/// How the victim stops: the orderly stop alone but for hard memory thresholds, which kill
/// first, or cap first when `throttleBeforeEvict` names them and the node has headroom (then
/// with the graceful stop's grace period, [`throttle::decide`]).
fn victim_stop(config: &EvictionConfig, eviction: &mut Eviction, input: &Input<'_>) -> VictimStop {
    if !eviction.threshold.is_hard() || eviction.signal.resource() != Resource::Memory {
        return VictimStop::Orderly;
    }
    let pod_grace = input
        .pods
        .get(eviction.index)
        .map_or(resources::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS, |p| {
            resources::termination_grace_seconds(p.pod)
        });
    let stop = throttle::decide(
        &eviction.threshold,
        &config.throttle_before_evict,
        input.observations,
        pod_grace,
        config.max_pod_grace_period_seconds,
    );
    match (
        stop,
        throttle::floor(&eviction.threshold, input.observations),
    ) {
        (Stop::Graceful { grace_seconds }, Some(floor)) => {
            eviction.grace_period_seconds = grace_seconds;
            VictimStop::CapFirst { floor }
        }
        _ => VictimStop::KillFirst,
    }
}

/// kubelet's `localStorageEviction` over the pods not asked already; forgets the pods that
/// left. Indices are into [`Input::pods`].
fn local_storage_evictions(
    evicted: &mut BTreeSet<String>,
    input: &Input<'_>,
) -> Vec<LocalStorageEviction> {
    evicted.retain(|uid| (input.is_active)(uid));
    let (indices, pods): (Vec<usize>, Vec<ActivePod<'_>>) = input
        .pods
        .iter()
        .enumerate()
        .filter(|(_, p)| !evicted.contains(resources::pod_uid(p.pod)))
        .map(|(i, p)| (i, *p))
        .unzip();
    let mut evictions = local_storage::evictions(&pods);
    for ev in &mut evictions {
        evicted.insert(ev.uid.clone());
        if let Some(&i) = indices.get(ev.index) {
            ev.index = i;
        }
    }
    evictions
}

/// When the manager next needs a step even if no signal arrives (kubelet would find out on its
/// next housekeeping round): a met soft threshold's grace period ending, a reported node
/// condition's pressure-transition period ending, or the cleanup wait timing out (its release
/// is answered, not polled). Only instants strictly after `now`.
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
    let cleanup = state
        .cleanup
        .as_ref()
        .map(|w| w.since.saturating_add(POD_CLEANUP_TIMEOUT));
    grace
        .chain(transition)
        .chain(cleanup)
        .filter(|d| *d > now)
        .min()
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod props;
