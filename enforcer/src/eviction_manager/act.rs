//! Carrying out the decision core's decision (`policy::eviction::manager::Action`) and
//! recording it: the SIGKILL of a hard memory threshold first, then the node conditions and
//! event, the end of the last victim's cleanup wait, the eviction through the pod worker with
//! its `Evicted` event and kill record, or the local-storage evictions.

use std::{collections::BTreeMap, time::Duration};

use super::{EvictionManager, Parts, Trigger, report::node_record};
use crate::{
    cgroup::PodCgroup,
    kills::{self, KillKind, KillRecord, Killed},
    pods::{ActiveEntry, Evict},
    policy::eviction::{
        ActivePod, Eviction,
        local_storage::LocalStorageEviction,
        manager::{
            Action, CleanupEnd, IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS, Idle, REASON,
            StepDecision, VictimStop,
        },
    },
    recorder::{EventRecord, EventType, Involved},
    stats::NodeSnapshot,
};

/// The first part of a victim's stop, done before the bookkeeping.
#[derive(Debug, Default)]
struct Stopped {
    /// SIGKILLed (and reaped): when.
    killed: Option<Killed>,
    /// Capped instead: at which usage, and the floor below which it is killed (bytes).
    capped_at: Option<(i64, i64)>,
}

/// What a step observed and when it decided: what its decision is carried out and recorded
/// with.
pub(super) struct Observed<'a> {
    /// The snapshot the decision was taken on.
    pub snapshot: &'a NodeSnapshot,
    /// The decision core's view of its pods (indices of the decision are into it).
    pub pods: &'a [ActivePod<'a>],
    /// The active pods (their cgroups and specs).
    pub active: &'a BTreeMap<String, ActiveEntry>,
    pub now: Duration,
    pub trigger: Trigger,
    /// When the read of `snapshot` began and ended (CLOCK_MONOTONIC ns).
    pub read: (u64, u64),
    /// When the decision was taken (CLOCK_MONOTONIC ns).
    pub decision_ns: u64,
}

impl EvictionManager {
    /// Carries out a step's final decision and records it. Returns false when a victim to be
    /// capped first could not be (it was killed instead: the core's watch on its floor ends).
    pub(super) fn carry_out(
        &self,
        decision: StepDecision,
        seen: &Observed<'_>,
        parts: &mut Parts,
    ) -> bool {
        // A hard memory threshold frees the victim's memory now: SIGKILL to every process of
        // the pod cgroup first (the node's bookkeeping below can wait microseconds; memory
        // cannot), then the orderly stop through the pod worker. Or capped at its usage first
        // (`throttleBeforeEvict`), then its graceful stop.
        let mut capped = true;
        let stopped = match &decision.action {
            Action::Evict { eviction, stop } => {
                self.stop_victim(eviction, *stop, seen, &mut capped, parts.reaping.as_ref())
            }
            _ => Stopped::default(),
        };
        self.report_decision(&decision, seen.trigger, parts);
        match decision.action {
            Action::Nothing(Idle::ReclaimedEnough) => {
                tracing::info!("able to reduce resource pressure without evicting pods");
            }
            // Carried out by the step itself, before its final decision.
            Action::Reobserve | Action::ReclaimNodeLevel { .. } => {}
            Action::Nothing(_) | Action::WaitForCleanup => {}
            Action::Evict { mut eviction, .. } => {
                if !capped {
                    eviction.grace_period_seconds = IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS;
                }
                self.evict(eviction, stopped, seen, parts);
            }
            Action::EvictLocalStorage(evictions) => {
                self.evict_local_storage(evictions, seen.pods, parts);
            }
        }
        capped
    }

    /// The first part of the victim's stop, before any bookkeeping: its SIGKILL, or its cap
    /// (killed when it cannot be capped: `capped` turns false).
    fn stop_victim(
        &self,
        ev: &Eviction,
        stop: VictimStop,
        seen: &Observed<'_>,
        capped: &mut bool,
        reaping: Option<&super::Reaping>,
    ) -> Stopped {
        match stop {
            VictimStop::Orderly => Stopped::default(),
            VictimStop::KillFirst => Stopped {
                killed: self.kill_pod_cgroup(ev, seen.active, reaping),
                capped_at: None,
            },
            VictimStop::CapFirst { floor } => match self.cap(ev, seen.active) {
                Some(usage) => {
                    tracing::warn!(uid = %ev.uid, usage, floor, "hard memory threshold: victim capped at its usage; graceful stop");
                    Stopped {
                        killed: None,
                        capped_at: Some((usage, floor)),
                    }
                }
                None => {
                    *capped = false;
                    Stopped {
                        killed: self.kill_pod_cgroup(ev, seen.active, reaping),
                        capped_at: None,
                    }
                }
            },
        }
    }

    /// Caps the victim's pod cgroup at its usage now (v2 `memory.high`, v1
    /// `memory.limit_in_bytes`); the usage, or `None` when it could not be capped.
    fn cap(&self, ev: &Eviction, active: &BTreeMap<String, ActiveEntry>) -> Option<i64> {
        let e = active.get(&*ev.uid)?;
        let pod = PodCgroup::resolve(&self.layout, &e.cgroup)?;
        let (usage, _) = crate::node::memory_figures(pod.dir()).ok()?;
        if let Err(err) = pod.cap(self.cgroups.as_ref(), usage) {
            tracing::warn!(uid = %ev.uid, error = %err, "capping the victim failed; killing it instead");
            return None;
        }
        Some(usage)
    }

    /// The capped victim the core found below its floor ([`StepDecision::kill_throttled`]):
    /// SIGKILL (and its memory reclaimed) now, written to its kill record.
    pub(super) fn kill_throttled(&self, uid: &str, parts: &mut Parts) {
        let Some(cgroup) = parts.victim_cgroup.clone() else {
            return;
        };
        let killed = self.kill_and_reap(uid, &cgroup, parts.reaping.as_ref());
        tracing::warn!(%uid, "the node fell below the floor while the capped victim stopped: SIGKILL");
        parts.kills.killed_later(uid, &killed);
    }

    /// SIGKILL to every process of the victim's pod cgroup, then its memory reclaimed, before
    /// any bookkeeping ([`Self::kill_and_reap`]).
    fn kill_pod_cgroup(
        &self,
        ev: &Eviction,
        active: &BTreeMap<String, ActiveEntry>,
        reaping: Option<&super::Reaping>,
    ) -> Option<Killed> {
        let e = active.get(&*ev.uid)?;
        let killed = self.kill_and_reap(&ev.uid, &e.cgroup, reaping);
        tracing::warn!(uid = %ev.uid, "hard memory threshold: SIGKILL sent to the pod's processes");
        Some(killed)
    }

    /// SIGKILL to every process of the pod cgroup `cgroup`, and (`reapMemory`) their memory
    /// reclaimed through process_mrelease(2) by the reaping threads (`reaping`), handed the
    /// processes just before the SIGKILL: this thread is free for the next crossing at once;
    /// what the reaping did comes to the kill record of `uid` when it ends. Without reaping
    /// threads, here after the SIGKILL.
    fn kill_and_reap(&self, uid: &str, cgroup: &str, reaping: Option<&super::Reaping>) -> Killed {
        let pod = PodCgroup::resolve(&self.layout, cgroup);
        let kill = || {
            let n = pod.as_ref().map_or(0, |p| p.kill(self.cgroups.as_ref()));
            (n, crate::signal::monotonic_ns())
        };
        let mut reaped = None;
        let (signalled, sigkill_ns) = match (self.config.enforcer.reap_memory, &pod, reaping) {
            (true, Some(p), Some(r)) => r.reap_around(uid, p.dir(), kill),
            (true, Some(p), None) => {
                let killed = kill();
                reaped = Some((p.reap(), crate::signal::monotonic_ns()));
                killed
            }
            _ => kill(),
        };
        tracing::debug!(cgroup, signalled, "SIGKILL sent");
        Killed { sigkill_ns, reaped }
    }

    /// The decision's report: the node conditions, the node event, the end of the cleanup
    /// wait. Done for every decision but [`Action::Reobserve`] (a step resumed after node-level
    /// reclaim reports no change and no event again).
    pub(super) fn report_decision(&self, d: &StepDecision, trigger: Trigger, parts: &mut Parts) {
        if self.link.set_conditions(d.conditions.clone()) || d.conditions_changed {
            tracing::info!(conditions = ?d.conditions, %trigger, "node conditions changed");
        }
        self.status.set_node(node_record(&d.conditions));
        if let Some(text) = &d.node_event {
            tracing::warn!(event = "EvictionThresholdMet", message = %text, %trigger, "eviction threshold met");
            self.events.event(
                Involved::node(&self.config.node_name()),
                EventType::Warning,
                "EvictionThresholdMet",
                text.clone(),
            );
        }
        if let Some(end) = &d.cleanup {
            cleanup_ended(end, parts);
        }
    }

    /// kubelet's `evictPod` for a threshold: the kill record, the `Evicted` event, the pod
    /// worker's stop.
    fn evict(&self, ev: Eviction, stopped: Stopped, seen: &Observed<'_>, parts: &mut Parts) {
        let Stopped { killed, capped_at } = stopped;
        let sigkill_ns = killed.as_ref().map(|k| k.sigkill_ns);
        tracing::warn!(
            pod = %format!("{}/{}", ev.namespace, ev.name),
            uid = %ev.uid,
            signal = %ev.signal,
            grace = ev.grace_period_seconds,
            trigger = %seen.trigger,
            message = %ev.message,
            "eviction"
        );
        // Where its release is looked for during the cleanup wait.
        parts.victim_cgroup = seen.active.get(&*ev.uid).map(|e| e.cgroup.clone());
        let m = crate::metrics::global();
        m.eviction(ev.signal.as_str());
        if let Some(at) = seen
            .snapshot
            .observations
            .get(&ev.signal)
            .and_then(|o| o.time)
        {
            m.eviction_stats_age(ev.signal.as_str(), seen.now.saturating_sub(at));
        }
        let mut record = self.kill_record(&ev, seen, parts);
        if let Some(k) = &killed {
            record.set_killed(k);
        }
        if let Some((usage, floor)) = capped_at {
            record.throttled = format!(
                "capped at {usage} bytes; graceful stop, grace {} s; SIGKILL below {floor} bytes available",
                ev.grace_period_seconds
            );
        }
        if let Some(t) = record.trigger.as_ref() {
            let from = t.kernel_ns.unwrap_or(t.received_ns);
            m.crossing_to_decision(
                ev.signal.as_str(),
                Duration::from_nanos(seen.decision_ns.saturating_sub(from)),
            );
        }
        if let Some(k) = sigkill_ns {
            m.decision_to_sigkill(Duration::from_nanos(k.saturating_sub(seen.decision_ns)));
        }
        let mut annotations = ev.annotations;
        annotations.insert(kills::ANNOTATION.to_owned(), record.id.clone());
        parts.kills.evicted(record);
        self.events.record(EventRecord {
            involved: Involved::pod(&ev.namespace, &ev.name, &ev.uid, None),
            type_: EventType::Warning,
            reason: REASON.to_owned(),
            message: ev.message.clone(),
            annotations,
        });
        let (completion, answer) = crate::pods::KillCompletion::new();
        parts.answer = Some(answer);
        parts.answered = None;
        self.link.evict(Evict {
            uid: ev.uid.to_string(),
            grace_seconds: ev.grace_period_seconds,
            message: ev.message,
            sigkill_ns,
            disruption_target: true,
            completed: Some(completion),
        });
    }

    /// The record of an eviction just decided (`kills`): what triggered the step, the
    /// observation and threshold, kubelet's ranking's first candidates.
    fn kill_record(&self, ev: &Eviction, seen: &Observed<'_>, parts: &Parts) -> KillRecord {
        let t = &ev.threshold;
        let kind = if t.is_hard() {
            "hard".to_owned()
        } else {
            format!("soft, grace {:?}", t.grace_period)
        };
        let observations = &seen.snapshot.observations;
        let pod = seen.active.get(&*ev.uid).map(|e| e.pod.as_ref());
        KillRecord {
            // The eviction's own names (the pod's, as the decision core read them).
            namespace: ev.namespace.clone(),
            name: ev.name.clone(),
            step: seen.trigger.to_string(),
            trigger: parts.trigger.clone(),
            signal: ev.signal.to_string(),
            threshold: format!("{}<{} ({kind})", t.signal, t.value),
            observed: observations.get(&ev.signal).map(|o| kills::Observed {
                available: o.available,
                capacity: o.capacity,
            }),
            observations: kills::observation_map(observations),
            candidates: kills::candidates(ev.signal, seen.pods, kills::CANDIDATES),
            message: ev.message.clone(),
            grace_period_seconds: ev.grace_period_seconds,
            observe_ns: Some(seen.read.0),
            observed_ns: Some(seen.read.1),
            decision_ns: Some(seen.decision_ns),
            kubelet: self.companion.then(|| kubelet_would(ev)),
            cgroup: seen
                .active
                .get(&*ev.uid)
                .map(|e| e.cgroup.clone())
                .unwrap_or_default(),
            ..KillRecord::for_pod(KillKind::Eviction, &ev.uid, &ev.uid, pod)
        }
    }

    /// Evicts the pods over their local storage limits (`policy::eviction::local_storage`):
    /// kubelet's `evictPod` with grace period 0, the `Evicted` event without annotations.
    fn evict_local_storage(
        &self,
        evictions: Vec<LocalStorageEviction>,
        pods: &[ActivePod<'_>],
        parts: &mut Parts,
    ) {
        for ev in evictions {
            tracing::warn!(uid = %ev.uid, message = %ev.message, "eviction for local storage");
            if let Some(p) = pods.get(ev.index) {
                let meta = &p.pod.metadata;
                parts.kills.record(&KillRecord {
                    step: "housekeeping".to_owned(),
                    threshold: "the pod's own local storage limits".to_owned(),
                    message: ev.message.clone(),
                    decision_ns: Some(crate::signal::monotonic_ns()),
                    ..KillRecord::for_pod(KillKind::Eviction, &ev.uid, &ev.uid, Some(p.pod))
                });
                self.events.record(EventRecord {
                    involved: Involved::pod(
                        meta.namespace.as_deref().unwrap_or_default(),
                        meta.name.as_deref().unwrap_or_default(),
                        &ev.uid,
                        None,
                    ),
                    type_: EventType::Warning,
                    reason: REASON.to_owned(),
                    message: ev.message.clone(),
                    annotations: BTreeMap::new(),
                });
            }
            self.link.evict(Evict {
                uid: ev.uid,
                grace_seconds: 0,
                message: ev.message,
                sigkill_ns: None,
                disruption_target: false,
                completed: None,
            });
        }
    }
}

/// Beside kubelet: what kubelet's eviction manager would have done with the same observation,
/// and by when (its `synchronize` runs every `evictionMonitoringPeriod`, 10 s).
fn kubelet_would(ev: &Eviction) -> String {
    let by = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(10))
        .map_or_else(|_| String::from("10 s later"), |t| t.to_string());
    format!(
        "kubelet evicts {}/{} (the same ranking for {}) at its next synchronize, by {by} (10 s housekeeping), on stats up to 10 s old",
        ev.namespace, ev.name, ev.signal
    )
}

/// The end of kubelet's `waitForPodsCleanup`: logged and written to the victim's kill record.
fn cleanup_ended(end: &CleanupEnd, parts: &mut Parts) {
    if end.released {
        tracing::info!(uid = %end.uid, after_ms = end.waited.as_millis(), "evicted pod's resources released");
    } else {
        tracing::warn!(uid = %end.uid, "timed out waiting for the evicted pod to be cleaned up");
    }
    let stopped_ns = parts.answered.take().and_then(|d| d.stopped_ns);
    parts.answer = None;
    parts.kills.released(&end.uid, end.released, stopped_ns);
}
