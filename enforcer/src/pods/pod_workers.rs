//! The pods of the runtime loop as kubelet's `podWorkers` keeps them: one worker each, their
//! admission, the updates queued behind a terminating worker, and the evicted pods' Failed
//! statuses.

use std::{collections::HashMap, sync::Arc};

use k8s_openapi::api::core::v1::Pod;
use tokio::{sync::mpsc, task::JoinSet};

use crate::{
    container_manager::allocation::Allocations,
    cri::{ContainerRuntime, spec},
    pods::{
        ActiveEntry, NodeLink, PodWorker, Terminated, WorkUpdate, WorkerContext,
        admissions::Admissions,
        link::{KillCompletion, KillDone},
        records::failed_record,
    },
    policy::{admission, eviction::manager::AdmitResult, preemption},
    sources::{PodUpdate, apiserver},
    status_manager::{PodPhase, PodRecord, StatusManager},
};

mod sync_loop;

pub(super) use sync_loop::Relist;

pub(super) struct Handle {
    pub(super) tx: mpsc::UnboundedSender<WorkUpdate>,
    /// The worker as `kubelet_working_pods` counts it.
    pub(super) working: crate::metrics::WorkingPod,
    /// The source that gave the pod (`api`, `file`...; empty for a pod only the runtime
    /// has): an eviction's status goes where the pod came from, also before the worker
    /// published any status.
    pub(super) source: String,
}

/// The pods of the runtime loop: one worker each, their admission, the updates queued behind a
/// terminating worker, and the evicted pods' Failed statuses.
pub(super) struct Pods<R: ContainerRuntime> {
    ctx: Arc<WorkerContext<R>>,
    /// Active pods out to the eviction manager.
    link: NodeLink,
    workers: HashMap<String, Handle>,
    tasks: JoinSet<()>,
    /// Where workers report that they terminated.
    done: mpsc::UnboundedSender<Terminated>,
    /// Updates of pods whose worker is running; taken up again when it terminates.
    pending: HashMap<String, PodUpdate>,
    admissions: Admissions,
    /// Pods the eviction manager evicted: their Failed status stays until their source
    /// deletes them; updates are ignored meanwhile (phase Failed is terminal).
    evicted: HashMap<String, (PodRecord, bool)>,
    /// The evictions' answers, sent when the evicted pod's worker has finished.
    completions: HashMap<String, KillCompletion>,
    /// The resources allocated to the admitted pods, and their pending resizes.
    allocations: Allocations,
}

/// How [`Pods::evict`] kills a pod: the status reason and message, the grace period, and
/// whether the pod gets the `DisruptionTarget` condition.
pub(super) struct EvictAs<'a> {
    pub(super) reason: &'a str,
    pub(super) message: &'a str,
    pub(super) grace: i64,
    pub(super) disruption_target: bool,
    /// The eviction's answer (kubelet's `CompletedCh`), sent when the worker has finished.
    pub(super) completed: Option<KillCompletion>,
}

/// A pod admission rejected: its reason and the message its status carries.
pub(super) struct Rejected {
    pub(super) reason: String,
    pub(super) message: String,
}

impl<R: ContainerRuntime> Pods<R> {
    /// No worker yet; `admitter` on the node's allocatable (`None`: every pod fits), the
    /// allocations as their checkpoint had them.
    pub(super) fn new(
        ctx: Arc<WorkerContext<R>>,
        link: NodeLink,
        done: mpsc::UnboundedSender<Terminated>,
        admitter: Option<admission::Admitter>,
        allocations: Allocations,
    ) -> Self {
        Self {
            ctx,
            link,
            workers: HashMap::new(),
            tasks: JoinSet::new(),
            done,
            pending: HashMap::new(),
            admissions: Admissions {
                admitter,
                admitted: HashMap::new(),
                terminating: std::collections::HashSet::new(),
            },
            evicted: HashMap::new(),
            completions: HashMap::new(),
            allocations,
        }
    }

    /// How many pods have a worker.
    pub(super) fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// After an iteration: the updates queued for a worker that ended were taken up by its
    /// end; those of a worker still syncing are dropped (it has the newer pod).
    pub(super) fn settle_pending(&mut self) {
        let workers = &self.workers;
        self.pending.retain(|uid, _| workers.contains_key(uid));
    }

    /// At shutdown: the workers' channels closed (each pod keeps running for the next start
    /// to adopt), their tasks to wait for.
    pub(super) fn into_tasks(self) -> JoinSet<()> {
        self.tasks
    }

    /// Starts `worker` as the pod `uid`'s worker.
    pub(super) fn spawn(
        &mut self,
        uid: String,
        worker: PodWorker<R>,
        working: crate::metrics::WorkingPod,
        source: String,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        self.workers.insert(
            uid,
            Handle {
                tx,
                working,
                source,
            },
        );
        self.tasks.spawn(worker.run(rx, self.done.clone()));
    }

    /// Kills the pod `uid` as an eviction: out of the active set, its Failed status
    /// (`reason`, `message`, and `DisruptionTarget` with `disruption_target`) set when its
    /// worker ends, its worker killed with `grace` seconds. False without a worker.
    pub(super) fn evict(&mut self, uid: &str, pod: &Pod, e: EvictAs<'_>) -> bool {
        self.link.remove_active(uid);
        let Some(h) = self.workers.get_mut(uid) else {
            return false;
        };
        h.working.killed();
        let status = &self.ctx.status;
        let rec = failed_record(pod, &h.source, e.reason, e.message.to_owned());
        status.evicting(crate::pods::evicted_status(
            rec.clone(),
            status.get(uid),
            e.disruption_target,
        ));
        self.evicted
            .insert(uid.to_owned(), (rec, e.disruption_target));
        if let Some(c) = e.completed {
            self.completions.insert(uid.to_owned(), c);
        }
        self.pending.remove(uid);
        let _ = h.tx.send(WorkUpdate::Kill {
            grace: Some(e.grace),
        });
        true
    }

    /// A pod a previous run evicted (its final status `rec`, from the status outbox): its
    /// status set, and the pod never admitted again (its source's updates ignored until it
    /// deletes it; anything of it the runtime still has is an orphan, removed).
    pub(super) fn keep_evicted(&mut self, rec: PodRecord, status: &StatusManager) {
        status.set(rec.clone());
        self.evicted.insert(rec.uid.clone(), (rec, true));
    }

    /// The evicted pod `uid`'s worker has finished (at `stopped_ns`): its eviction is
    /// answered.
    pub(super) fn kill_completed(&mut self, uid: &str, stopped_ns: u64) {
        if let Some(c) = self.completions.remove(uid) {
            c.complete(KillDone {
                stopped_ns: Some(stopped_ns),
            });
        }
    }

    /// Preempts `pod` to admit a critical pod (kubelet's `evictPodsToFreeRequests`): kubelet's
    /// event and status (`Preempting`), killed with its own grace period as an eviction is,
    /// counted in `kubelet_preemptions{preemption_signal}`.
    fn preempt(&mut self, uid: &str, pod: Arc<Pod>, signal: &str) {
        let id = spec::PodIdent::of(&pod);
        tracing::warn!(uid = %uid, pod = %id.name, signal, message = preemption::MESSAGE, "preempting pod");
        self.ctx.events.event(
            crate::recorder::Involved::pod(&id.namespace, &id.name, uid, None),
            crate::recorder::EventType::Warning,
            preemption::REASON,
            preemption::MESSAGE.to_owned(),
        );
        let killed = self.evict(
            uid,
            &pod,
            EvictAs {
                reason: preemption::REASON,
                message: preemption::MESSAGE,
                grace: spec::grace_seconds(&pod),
                disruption_target: true,
                completed: None,
            },
        );
        if killed {
            crate::metrics::global().preemption(signal);
        }
    }

    /// The workers by lifecycle, config and static (`kubelet_working_pods`): a syncing
    /// worker whose pod ran to its end is terminated, and so is an evicted pod kept until its
    /// source deletes it.
    pub(super) fn working_pods(&self, status: &StatusManager) -> crate::metrics::WorkingPods {
        let finished: std::collections::HashSet<String> = [PodPhase::Succeeded, PodPhase::Failed]
            .into_iter()
            .flat_map(|p| status.uids_in_phase(p))
            .collect();
        let mut counts = crate::metrics::WorkingPods::default();
        for (uid, h) in &self.workers {
            counts.add(h.working.now(finished.contains(uid)));
        }
        for (uid, (rec, _)) in &self.evicted {
            if !self.workers.contains_key(uid) {
                let mut w = crate::metrics::WorkingPod::desired(&rec.source);
                w.lifecycle = crate::metrics::WorkingLifecycle::Terminated;
                counts.add(w);
            }
        }
        counts
    }

    /// kubepods and the QoS tiers in step with the admitted pods.
    pub(super) fn sync_node(&self) {
        self.ctx
            .enforce
            .sync_node_logged(self.admissions.admitted.values().map(|p| &**p));
    }

    /// Admits a pod that has no worker and starts one: counted by admission, its exclusive
    /// CPUs allocated, kubepods in step, active for the eviction manager. A rejected pod gets
    /// its Failed status instead.
    pub(super) fn admit_and_spawn(&mut self, uid: String, u: PodUpdate) -> Result<(), Rejected> {
        // kubelet's admit handlers, in the order kubelet adds them (`NewMainKubelet`): the
        // eviction manager's and the sysctls'; the container manager's resource allocation
        // (the CPU and memory managers along the topology manager's hints); the predicates
        // (resource fit, with critical-pod preemption), AppArmor and the pod security rules.
        let first = self.admissions.admit_before_resources(&u.pod, &self.link);
        if !first.admitted {
            return Err(self.reject(&u, first));
        }
        let allocated = self.ctx.enforce.admit_resources(&u.pod);
        if !allocated.admitted {
            self.ctx.enforce.release_resources(&uid);
            return Err(self.reject(&u, allocated));
        }
        match self.admissions.try_admit(
            &uid,
            &u.pod,
            &self.link,
            self.ctx.objects.is_some() && u.source == apiserver::API_SOURCE,
        ) {
            Ok(preempted) => {
                for (victim, pod) in preempted.victims {
                    self.preempt(&victim, pod, &preempted.signal);
                }
                self.sync_node();
                if let Ok(cgroup) = self.ctx.cgroups.pod_path(&uid, spec::pod_qos(&u.pod)) {
                    self.link
                        .set_active(&uid, ActiveEntry::new(u.pod.clone(), cgroup));
                }
                self.allocations.admitted(&uid, &u.pod);
                let working = crate::metrics::WorkingPod::desired(&u.source);
                let w = PodWorker::new(self.ctx.clone(), u.pod, u.source.clone());
                self.spawn(uid, w, working, u.source);
                Ok(())
            }
            Err(r) => {
                self.ctx.enforce.release_resources(&uid);
                Err(self.reject(&u, r))
            }
        }
    }

    /// An admitted pod's update `desired` through the allocation (kubelet's
    /// `handlePodResourcesResize`): the pod its worker is to run. An allocated resize moves the
    /// admission totals, kubepods and the eviction manager's view of the pod with it.
    pub(super) fn allocate(&mut self, uid: &str, desired: Arc<Pod>) -> Arc<Pod> {
        let a = &self.admissions;
        let others: Vec<Arc<Pod>> = a
            .admitted
            .iter()
            .filter(|(u, _)| u.as_str() != uid && !a.terminating.contains(*u))
            .map(|(_, p)| p.clone())
            .collect();
        let (run, changed) = self
            .allocations
            .update(uid, desired, others.iter().map(|p| &**p));
        if changed {
            self.admissions.resize(uid, run.clone());
            self.sync_node();
            // Only a pod still active (not one being evicted or killed) is put back in view.
            if self.link.active().contains_key(uid)
                && let Ok(cgroup) = self.ctx.cgroups.pod_path(uid, spec::pod_qos(&run))
            {
                self.link
                    .set_active(uid, ActiveEntry::new(run.clone(), cgroup));
            }
        }
        run
    }

    /// The pending resizes due for another decision: an allocated one goes to its worker.
    pub(super) fn retry_resizes(&mut self) {
        for (uid, desired) in self.allocations.due(tokio::time::Instant::now()) {
            if !self.workers.contains_key(&uid) {
                continue;
            }
            let pod = self.allocate(&uid, desired);
            if let Some(h) = self.workers.get(&uid) {
                let source = self
                    .ctx
                    .status
                    .get(&uid)
                    .map(|r| r.source)
                    .unwrap_or_default();
                let _ = h.tx.send(WorkUpdate::Sync { pod, source });
            }
        }
    }

    /// A rejected pod's Failed status, and the rejection.
    fn reject(&self, u: &PodUpdate, r: AdmitResult) -> Rejected {
        let message = admission::rejected_status_message(&r);
        self.ctx
            .status
            .set(failed_record(&u.pod, &u.source, &r.reason, message.clone()));
        Rejected {
            reason: r.reason,
            message,
        }
    }
}
