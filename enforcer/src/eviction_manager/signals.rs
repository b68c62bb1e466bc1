//! The kernel signals that wake the eviction manager: which do, which call for a step at
//! once, how a burst is gathered into one step, and what each one is noted for.

use std::time::Duration;

use tokio::sync::mpsc;

use super::{EvictionManager, Parts};
use crate::{
    kills::{KillKind, KillLog, KillRecord, TriggerSignal},
    signal::{Signal, SignalKind},
};

/// Whether a signal should wake the eviction manager.
#[must_use]
pub fn is_pressure(s: &Signal) -> bool {
    matches!(
        s.kind,
        SignalKind::MemcgReclaim
            | SignalKind::DirectReclaim
            | SignalKind::OomKill
            | SignalKind::MemoryThreshold
            | SignalKind::MemoryPressure
            | SignalKind::MemoryEvents
            | SignalKind::Fork
    )
}

/// Whether a signal calls for a step at once, without the [`MIN_STEP_INTERVAL`](super::MIN_STEP_INTERVAL) floor: a
/// usage threshold crossed (a v1 threshold eventfd; on v2 a watched cgroup's `memory.events`
/// `high` or `max` count moving, which the `memory.high` tripwire makes the crossing) or a
/// kernel OOM kill. Reclaim and fork records come in bursts and are coalesced; a crossing
/// comes once and is the moment to act.
#[must_use]
pub fn is_urgent(s: &Signal) -> bool {
    matches!(
        s.kind,
        SignalKind::MemoryThreshold | SignalKind::MemoryEvents | SignalKind::OomKill
    )
}

/// Gathers the rest of a burst into the coming step (`take`, told whether an urgent signal
/// came before): every signal already queued, then, unless one was urgent, what comes before
/// `floor` (reclaim and fork records wait for [`MIN_STEP_INTERVAL`](super::MIN_STEP_INTERVAL) since the last step; an
/// urgent signal arriving meanwhile, or the v1 tripwire firing (`wire`), ends the wait at
/// once). Whether the burst was urgent.
pub(super) async fn gather_burst(
    signals: &mut mpsc::Receiver<Signal>,
    mut urgent: bool,
    floor: tokio::time::Instant,
    wire: impl std::future::Future<Output = Signal>,
    mut take: impl FnMut(&Signal, bool),
) -> bool {
    tokio::pin!(wire);
    while let Ok(more) = signals.try_recv() {
        take(&more, urgent);
        urgent |= is_urgent(&more);
    }
    while !urgent {
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(floor) => break,
            more = signals.recv() => match more {
                Some(more) => {
                    take(&more, urgent);
                    urgent |= is_urgent(&more);
                }
                // Closed: the manager's next turn says so.
                None => break,
            },
            crossed = &mut wire => {
                take(&crossed, urgent);
                urgent = true;
            }
        }
    }
    urgent
}

impl EvictionManager {
    /// Takes one signal of a burst into the coming step: an OOM kill is noted, the delay
    /// observed; a pressure signal names its pod and, the first urgent one (else the first),
    /// becomes the step's trigger (`urgent`: whether the burst had an urgent signal before
    /// this one).
    pub(super) fn absorb(
        &self,
        s: &Signal,
        parts: &mut Parts,
        named: &mut Vec<String>,
        urgent: bool,
    ) {
        self.poke_oom_killed(s, &mut parts.kills);
        observe_signal(&mut parts.reporter.delays, s);
        if !is_pressure(s) {
            return;
        }
        if parts.trigger.is_none() || (!urgent && is_urgent(s)) {
            parts.trigger = Some(TriggerSignal::of(s));
        }
        named.extend(s.pod_uid.clone());
    }

    /// A kernel OOM kill inside a pod: its worker resyncs now, so the container's `OOMKilled`
    /// shows at once instead of on the next relist.
    pub(super) fn poke_oom_killed(&self, s: &Signal, kills: &mut KillLog) {
        if s.kind != SignalKind::OomKill {
            return;
        }
        let entry = s
            .pod_uid
            .as_ref()
            .and_then(|uid| self.link.active().get(uid).cloned());
        if let Some(uid) = &s.pod_uid {
            tracing::warn!(uid, pid = s.pid, "kernel OOM kill in a pod");
            if let Some(container) = s
                .cgroup
                .as_deref()
                .and_then(crate::cgroup::pod_of_path)
                .and_then(|p| p.container)
            {
                tracing::debug!(uid, container, "kernel OOM kill attributed to a container");
                self.link.note_oom_kill(uid, &container);
            } else {
                tracing::debug!(uid, cgroup = ?s.cgroup, "kernel OOM kill in no container's cgroup");
            }
            self.link.poke(uid);
        }
        let pod = entry.as_ref().map(|e| e.pod.as_ref());
        if let Some(p) = pod {
            crate::metrics::global().oom_kill(&format!("{:?}", crate::policy::qos::pod_qos(p)));
        }
        let who = s
            .pod_uid
            .clone()
            .unwrap_or_else(|| format!("pid{}", s.pid.unwrap_or(0)));
        let uid = s.pod_uid.as_deref().unwrap_or_default();
        kills.record(&KillRecord {
            trigger: Some(TriggerSignal::of(s)),
            message: format!(
                "The kernel's OOM killer killed pid {} ({}) in cgroup {}",
                s.pid.unwrap_or(0),
                s.comm.as_deref().unwrap_or("?"),
                s.cgroup.as_deref().unwrap_or("?")
            ),
            ..KillRecord::for_pod(KillKind::KernelOomKill, &who, uid, pod)
        });
    }
}

/// Counts a signal for `enforcer status` and its delay for `enforcer_signal_delay_seconds`.
fn observe_signal(delays: &mut crate::node_report::Delays, s: &Signal) {
    delays.observe(s);
    if let Some(k) = s.kernel_ns {
        crate::metrics::global().signal_delay(
            s.source.as_str(),
            Duration::from_nanos(s.received_ns.saturating_sub(k)),
        );
    }
}

pub(super) fn log_signal(s: &Signal) {
    let cgroup = s.cgroup.as_deref().unwrap_or("");
    let pod = s.pod_uid.as_deref().unwrap_or("");
    match s.kind {
        SignalKind::CgroupCreated
        | SignalKind::CgroupRemoved
        | SignalKind::Fork
        | SignalKind::Probe
        | SignalKind::MemcgReclaim
        | SignalKind::DirectReclaim => {
            tracing::debug!(signal = ?s.kind, cgroup, pod, count = s.count, "signal");
        }
        _ => tracing::info!(
            signal = ?s.kind,
            source = ?s.source,
            cgroup,
            pod,
            pid = s.pid,
            count = s.count,
            delay_us = s.delay_ns().map(|d| d / 1000),
            "signal"
        ),
    }
}
