//! The pod loop's handlers, one per case, as kubelet's `syncLoopIteration`: the sources'
//! pod updates, the relist (kubelet's PLEG), a poke, the housekeeping tick, a worker's end,
//! the eviction manager's evictions.

use std::{collections::HashMap, path::Path};

use super::{EvictAs, Pods};
use crate::{
    container_manager,
    cri::{ContainerRuntime, relist::relist_runtime},
    pods::{
        FAST_RELIST, FAST_RELIST_WINDOW, PodWorker, Terminated, WorkUpdate, as_workload,
        evicted_status, remove_stale_pod_dirs,
    },
    sources::{PodOp, SourceEvent},
    status_manager::StatusManager,
};

/// The relist's state between iterations: its timer, the containers' fingerprints of the
/// last relist, whether the orphans are still to be looked for, and the fast relist after a
/// poke.
pub(crate) struct Relist {
    pub(crate) timer: tokio::time::Interval,
    fingerprints: HashMap<String, String>,
    orphans_pending: bool,
    /// After a poke (kernel OOM kill) the runtime is relisted every FAST_RELIST for a moment,
    /// so the container's exit shows in its status as soon as the runtime reports it.
    fast_until: Option<tokio::time::Instant>,
}

impl Relist {
    pub(crate) fn new(period: std::time::Duration) -> Self {
        let mut timer = tokio::time::interval(period);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            timer,
            fingerprints: HashMap::new(),
            orphans_pending: true,
            fast_until: None,
        }
    }
}

impl<R: ContainerRuntime> Pods<R> {
    /// kubelet's `HandlePodAdditions`, `HandlePodUpdates` and `HandlePodRemoves`: a batch of
    /// the sources' events, each pod's update sent to its worker (admitted and started for a
    /// new pod).
    pub(crate) fn handle_pod_events(
        &mut self,
        events: Vec<SourceEvent>,
        status: &StatusManager,
        static_pods: bool,
        cpu_reconcile: &tokio::sync::Notify,
    ) {
        for ev in events {
            match ev {
                SourceEvent::Rejected { file, message } => status.set_rejection(&file, message),
                SourceEvent::Synced => {}
                SourceEvent::Pod(u) => {
                    let u = if static_pods { u } else { as_workload(u) };
                    let uid = u.pod.metadata.uid.clone().unwrap_or_default();
                    if u.op != PodOp::Delete && self.evicted.contains_key(&uid) {
                        continue;
                    }
                    tracing::info!(uid = %uid, op = ?u.op, source = %u.source, "pod update");
                    match (u.op, self.workers.get_mut(&uid)) {
                        (PodOp::Delete, Some(h)) => {
                            h.working.deleted();
                            self.admissions.terminating.insert(uid.clone());
                            self.pending.remove(&uid);
                            let _ = h.tx.send(WorkUpdate::Kill { grace: None });
                        }
                        (PodOp::Delete, None) => {
                            self.pending.remove(&uid);
                            self.evicted.remove(&uid);
                            status.remove(&uid);
                        }
                        (_, Some(h)) => {
                            h.working.updated();
                            // A terminating worker ignores it; it is re-added when done.
                            self.pending.insert(uid.clone(), u.clone());
                            // A change of resources is an in-place resize: the worker runs
                            // what is allocated.
                            let pod = self.allocate(&uid, u.pod);
                            if let Some(h) = self.workers.get(&uid) {
                                let _ = h.tx.send(WorkUpdate::Sync {
                                    pod,
                                    source: u.source,
                                });
                            }
                        }
                        (_, None) => match self.admit_and_spawn(uid.clone(), u) {
                            Ok(()) => cpu_reconcile.notify_one(),
                            Err(r) => {
                                tracing::warn!(uid = %uid, reason = %r.reason, message = %r.message, "pod rejected by admission");
                            }
                        },
                    }
                }
            }
        }
    }

    /// kubelet's PLEG relist: the runtime's health reported, the orphans removed once every
    /// source has listed (`sources_synced`), and each pod whose containers changed resynced.
    pub(crate) async fn handle_relist(
        &mut self,
        relist: &mut Relist,
        runtime: &R,
        health: &crate::health::Health,
        cri_socket: &Path,
        sources_synced: bool,
    ) {
        let relisted = relist_runtime(runtime).await;
        if health.set_runtime(relisted.is_ok()) {
            match &relisted {
                Ok(_) => {
                    tracing::info!(socket = %cri_socket.display(), "the container runtime answers");
                }
                Err(e) => {
                    tracing::warn!(socket = %cri_socket.display(), error = %e, "lost the container runtime; pods keep running, retrying");
                }
            }
        }
        match relisted {
            Ok(now) => {
                // Pods of a source that has not listed yet are not orphans: both timers fire
                // at once on start, and the relist may win the race.
                if relist.orphans_pending && sources_synced {
                    relist.orphans_pending = false;
                    self.remove_orphans(&now);
                }
                for (uid, fp) in &now {
                    if relist.fingerprints.get(uid) != Some(fp)
                        && let Some(h) = self.workers.get(uid)
                    {
                        let _ = h.tx.send(WorkUpdate::Relist);
                    }
                }
                relist.fingerprints = now;
            }
            Err(e) => tracing::debug!(error = %e, "relist failed"),
        }
        match relist.fast_until {
            Some(until) if tokio::time::Instant::now() < until => {
                relist.timer.reset_after(FAST_RELIST);
            }
            Some(_) => relist.fast_until = None,
            None => {}
        }
    }

    /// The runtime's pods no source knows get a worker that removes them; the pod
    /// directories (volumes, logs) of pods no source and no runtime knows, left by a pod
    /// removed while the enforcer was down, are removed.
    fn remove_orphans(&mut self, now: &HashMap<String, String>) {
        for uid in now.keys() {
            if !self.workers.contains_key(uid) {
                tracing::info!(uid = %uid, "removing pod unknown to every source");
                let w = PodWorker::orphan(self.ctx.clone(), uid.clone());
                self.spawn(
                    uid.clone(),
                    w,
                    crate::metrics::WorkingPod::runtime_only(),
                    String::new(),
                );
            }
        }
        remove_stale_pod_dirs(&self.ctx.log_root, |uid| {
            self.workers.contains_key(uid) || now.contains_key(uid)
        });
    }

    /// The poked pods (a kernel OOM kill) resynced, and the runtime relisted at once, then
    /// fast for a moment.
    pub(crate) fn handle_pokes(&self, relist: &mut Relist) {
        for uid in self.link.take_pokes() {
            if let Some(h) = self.workers.get(&uid) {
                tracing::debug!(uid = %uid, "pod poked; resyncing its worker");
                let _ = h.tx.send(WorkUpdate::Relist);
            }
        }
        relist.fast_until = Some(tokio::time::Instant::now() + FAST_RELIST_WINDOW);
        relist.timer.reset_immediately();
    }

    /// kubelet's `HandlePodCleanups` for a worker that terminated: its resources released,
    /// the node's cgroups and CPU sets brought in step, an evicted pod's status made final,
    /// or an update that waited on the worker taken up.
    pub(crate) fn handle_terminated(
        &mut self,
        Terminated {
            uid,
            last,
            stopped_ns,
        }: Terminated,
        status: &StatusManager,
        enforce: &container_manager::Enforcer,
        cpu_reconcile: &tokio::sync::Notify,
    ) {
        self.workers.remove(&uid);
        self.link.forget_oom_kills(&uid);
        self.admissions.release(&uid);
        self.allocations.remove(&uid);
        enforce.release_resources(&uid);
        self.sync_node();
        cpu_reconcile.notify_one();
        self.link.remove_active(&uid);
        if let Some((rec, disruption_target)) = self.evicted.get_mut(&uid) {
            *rec = evicted_status(rec.clone(), last, *disruption_target);
            status.set(rec.clone());
            self.pending.remove(&uid);
            self.kill_completed(&uid, stopped_ns);
        } else if let Some(u) = self.pending.remove(&uid)
            && u.op != PodOp::Delete
        {
            // A rejection here is only recorded in the pod's status.
            let _ = self.admit_and_spawn(uid, u);
        }
    }

    /// The eviction manager's evictions: each admitted pod killed as evicted.
    pub(crate) fn handle_evictions(&mut self) {
        for mut e in self.link.take_evictions() {
            let Some(pod) = self.admissions.admitted.get(&e.uid).cloned() else {
                self.link.remove_active(&e.uid);
                continue;
            };
            tracing::warn!(uid = %e.uid, grace = e.grace_seconds, message = %e.message, "evicting pod");
            self.evict(
                &e.uid,
                &pod,
                EvictAs {
                    reason: crate::policy::eviction::manager::REASON,
                    message: &e.message,
                    grace: e.grace_seconds,
                    disruption_target: e.disruption_target,
                    completed: e.completed.take(),
                },
            );
        }
    }
}
