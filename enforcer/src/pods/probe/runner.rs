//! The prober (kubelet's probe manager and probe workers): one task per container instance
//! and probe type on kubelet's timing, the runs of equal results counted against the
//! thresholds, and the results kept as kubelet's results managers keep them.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::Container;
use tokio::{
    sync::{Notify, watch},
    task::JoinSet,
    time::Instant,
};

use super::{Outcome, ProbeResult, ProbeSpec, ProbeType, run_handler};
use crate::{
    cri::ContainerRuntime,
    recorder::{EventType, Involved, Recorder},
};

/// kubelet's `maxProbeRetries`: a probe that errors is retried this many times at once.
const MAX_PROBE_RETRIES: usize = 3;

/// A run of equal results (kubelet's worker `lastResult` / `resultRun`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Run {
    last: Option<ProbeResult>,
    count: u32,
}

impl Run {
    /// Counts one result; returns the result to record once its threshold is reached.
    #[must_use]
    pub fn step(
        &mut self,
        r: ProbeResult,
        success_threshold: u32,
        failure_threshold: u32,
    ) -> Option<ProbeResult> {
        if self.last == Some(r) {
            self.count = self.count.saturating_add(1);
        } else {
            self.last = Some(r);
            self.count = 1;
        }
        let below = match r {
            ProbeResult::Failure => self.count < failure_threshold,
            ProbeResult::Success => self.count < success_threshold,
            ProbeResult::Unknown => false,
        };
        (!below).then_some(r)
    }
}

/// A liveness or startup failure: the pod worker kills the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kill {
    pub container_id: String,
    pub name: String,
    pub probe: ProbeType,
    /// The probe's `terminationGracePeriodSeconds`, when set.
    pub grace: Option<i64>,
}

#[derive(Debug, Default)]
struct SharedState {
    results: HashMap<(String, ProbeType), ProbeResult>,
    kills: Vec<Kill>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<SharedState>,
    changed: Arc<Notify>,
}

impl Shared {
    fn with<T>(&self, f: impl FnOnce(&mut SharedState) -> T) -> T {
        let mut g = crate::locks::lock(&self.state);
        f(&mut g)
    }

    /// Sets a result; wakes the pod worker when it changed.
    fn set(&self, id: &str, kind: ProbeType, r: ProbeResult) {
        let changed = self.with(|s| s.results.insert((id.to_owned(), kind), r) != Some(r));
        if changed {
            self.changed.notify_one();
        }
    }

    /// Sets a new container's initial result (kubelet's `initialValue`) without waking the
    /// pod worker: it is the value its status already assumes.
    fn init(&self, id: &str, kind: ProbeType) {
        self.with(|s| s.results.insert((id.to_owned(), kind), kind.initial()));
    }

    fn get(&self, id: &str, kind: ProbeType) -> Option<ProbeResult> {
        self.with(|s| s.results.get(&(id.to_owned(), kind)).copied())
    }
}

/// A running container the pod worker wants probed.
#[derive(Clone, Debug)]
pub struct Target {
    pub container_id: String,
    pub container: Container,
    /// When the container started (nanoseconds since the epoch, from the runtime).
    pub started_at: i64,
    /// Where network probes go without a `host`: the pod IP (the node's for host-network
    /// pods, 127.0.0.1 without either).
    pub pod_host: String,
}

/// Whether a container has any probe.
#[must_use]
pub fn has_probes(c: &Container) -> bool {
    c.startup_probe.is_some() || c.liveness_probe.is_some() || c.readiness_probe.is_some()
}

#[derive(Debug)]
struct Probing {
    _tasks: JoinSet<()>,
}

/// One pod's probes (kubelet's probe manager, per pod): a task per probed container instance
/// and probe type, and their results. Dropping it stops every probe.
#[derive(Debug, Default)]
pub struct Prober {
    shared: Arc<Shared>,
    running: HashMap<String, Probing>,
    /// The `/metrics/probes` series of this pod's probes, kept across container restarts
    /// (kubelet's worker lives as long as the pod's container) and removed with the probes.
    series: Vec<crate::metrics::probes::ProbeOf>,
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.forget_series();
    }
}

/// What the probe tasks of one pod share with their pod worker.
#[derive(Clone, Debug)]
pub struct ProbeContext<R> {
    pub runtime: Arc<R>,
    pub events: Recorder,
    /// The pod's namespace, name and uid (the events' involved object).
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Prober {
    /// Woken whenever a result changed or a container is to be killed.
    #[must_use]
    pub fn notifier(&self) -> Arc<Notify> {
        self.shared.changed.clone()
    }

    /// Probes exactly these containers: starts the probes of new container instances,
    /// stops (and forgets the results of) those no longer running.
    pub fn sync<R: ContainerRuntime>(&mut self, ctx: &ProbeContext<R>, targets: &[Target]) {
        let keep: Vec<&str> = targets.iter().map(|t| t.container_id.as_str()).collect();
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|id| !keep.contains(&id.as_str()))
            .cloned()
            .collect();
        for id in gone {
            self.running.remove(&id);
            self.shared.with(|s| {
                s.results.retain(|(cid, _), _| *cid != id);
                s.kills.retain(|k| k.container_id != id);
            });
        }
        for t in targets {
            if self.running.contains_key(&t.container_id) || !has_probes(&t.container) {
                continue;
            }
            let probing = self.start(ctx, t);
            self.running.insert(t.container_id.clone(), probing);
        }
    }

    /// Stops every probe (the pod is being killed or has finished).
    pub fn clear(&mut self) {
        self.running.clear();
        self.forget_series();
        self.shared.with(|s| {
            s.results.clear();
            s.kills.clear();
        });
    }

    fn forget_series(&mut self) {
        for s in self.series.drain(..) {
            crate::metrics::probes::global().forget(&s);
        }
    }

    fn start<R: ContainerRuntime>(&mut self, ctx: &ProbeContext<R>, t: &Target) -> Probing {
        let has_startup = t.container.startup_probe.is_some();
        let (started_tx, _) = watch::channel(!has_startup);
        let started_tx = Arc::new(started_tx);
        // How much of the initial delays already passed (a container adopted after an
        // enforcer restart, or seen late): measured on the wall clock, waited on tokio's.
        let since_start = u64::try_from(
            crate::status_manager::now_nanos()
                .saturating_sub(t.started_at)
                .max(0),
        )
        .map(Duration::from_nanos)
        .unwrap_or_default();
        let now = Instant::now();
        let mut tasks = JoinSet::new();
        for kind in [
            ProbeType::Startup,
            ProbeType::Liveness,
            ProbeType::Readiness,
        ] {
            let Some(p) = kind.of(&t.container) else {
                continue;
            };
            let spec = ProbeSpec::parse(kind, p, &t.container);
            self.shared.init(&t.container_id, kind);
            let first = now + spec.initial_delay.saturating_sub(since_start);
            let task = ProbeTask {
                kind,
                spec,
                runtime: ctx.runtime.clone(),
                shared: self.shared.clone(),
                events: ctx.events.clone(),
                involved: {
                    let mut i =
                        Involved::pod(&ctx.namespace, &ctx.name, &ctx.uid, Some(&t.container.name));
                    // A sidecar (the only init container with probes) is an init container.
                    if t.container.restart_policy.as_deref() == Some("Always") {
                        i.field_path = format!("spec.initContainers{{{}}}", t.container.name);
                    }
                    i
                },
                container_id: t.container_id.clone(),
                name: t.container.name.clone(),
                pod_host: t.pod_host.clone(),
                started: started_tx.clone(),
            };
            let series = task.series();
            if !self.series.contains(&series) {
                self.series.push(series);
            }
            tasks.spawn(task.run(first));
        }
        Probing { _tasks: tasks }
    }

    /// Gives back a kill that could not be done (tried again at the next sync), unless its
    /// container is no longer probed.
    pub fn requeue(&self, k: Kill) {
        if self.running.contains_key(&k.container_id) {
            self.shared.with(|s| s.kills.push(k));
        }
    }

    /// The kills asked since the last call.
    #[must_use]
    pub fn take_kills(&self) -> Vec<Kill> {
        self.shared.with(|s| std::mem::take(&mut s.kills))
    }

    /// kubelet's `started`: a running container without a startup probe has started; with
    /// one, once it succeeded.
    #[must_use]
    pub fn started(&self, container_id: &str, c: &Container) -> bool {
        c.startup_probe.is_none()
            || self.shared.get(container_id, ProbeType::Startup) == Some(ProbeResult::Success)
    }

    /// kubelet's `ready` of a running, started container: without a readiness probe, ready;
    /// with one, once it succeeded.
    #[must_use]
    pub fn ready(&self, container_id: &str, c: &Container) -> bool {
        c.readiness_probe.is_none()
            || self.shared.get(container_id, ProbeType::Readiness) == Some(ProbeResult::Success)
    }
}

/// One probe of one container instance (kubelet's probe worker).
struct ProbeTask<R> {
    kind: ProbeType,
    spec: ProbeSpec,
    runtime: Arc<R>,
    shared: Arc<Shared>,
    events: Recorder,
    involved: Involved,
    container_id: String,
    name: String,
    pod_host: String,
    started: Arc<watch::Sender<bool>>,
}

impl<R: ContainerRuntime> ProbeTask<R> {
    fn event(&self, type_: EventType, reason: &str, message: String) {
        self.events
            .event(self.involved.clone(), type_, reason, message);
    }

    /// One probe with kubelet's retries of prober errors; the result to count, `None` for
    /// an error (thrown away).
    async fn probe(&self) -> Option<ProbeResult> {
        let began = std::time::Instant::now();
        let result = self.probe_once().await;
        // kubelet's `prober_probe_total` (a prober error is not counted).
        let label = match result {
            Some(ProbeResult::Success) => Some("successful"),
            Some(ProbeResult::Failure) => Some("failed"),
            Some(ProbeResult::Unknown) => Some("unknown"),
            None => None,
        };
        if let Some(label) = label {
            crate::metrics::probes::global().probed(&self.series(), label, began.elapsed());
        }
        result
    }

    /// This probe's series (`/metrics/probes`).
    fn series(&self) -> crate::metrics::probes::ProbeOf {
        crate::metrics::probes::ProbeOf {
            probe_type: self.kind.as_str(),
            container: self.name.clone(),
            pod: self.involved.name.clone(),
            namespace: self.involved.namespace.clone(),
            pod_uid: self.involved.uid.clone(),
        }
    }

    /// [`Self::probe`] without the count.
    async fn probe_once(&self) -> Option<ProbeResult> {
        let kind = self.kind.as_str();
        let mut outcome = Outcome::Error(String::new());
        for _ in 0..MAX_PROBE_RETRIES {
            outcome = match &self.spec.handler {
                Ok(h) => {
                    run_handler(
                        &*self.runtime,
                        &self.container_id,
                        h,
                        self.spec.timeout,
                        &self.pod_host,
                    )
                    .await
                }
                Err(e) => Outcome::Error(e.to_string()),
            };
            if !matches!(outcome, Outcome::Error(_)) || self.spec.handler.is_err() {
                break;
            }
        }
        match outcome {
            Outcome::Success(_) => Some(ProbeResult::Success),
            Outcome::Warning(out) => {
                self.event(
                    EventType::Warning,
                    "ProbeWarning",
                    format!("{kind} probe warning: {out}"),
                );
                Some(ProbeResult::Success)
            }
            Outcome::Failure(out) => {
                tracing::debug!(uid = %self.involved.uid, container = %self.name, probe = kind, output = %out, "probe failed");
                self.event(
                    EventType::Warning,
                    "Unhealthy",
                    format!("{kind} probe failed: {out}"),
                );
                Some(ProbeResult::Failure)
            }
            Outcome::Error(e) => {
                tracing::warn!(uid = %self.involved.uid, container = %self.name, probe = kind, error = %e, "probe errored");
                self.event(
                    EventType::Warning,
                    "Unhealthy",
                    format!("{kind} probe errored and resulted in unknown state: {e}"),
                );
                None
            }
        }
    }

    /// Probes every period from `first` until a liveness or startup failure (the container
    /// is killed; a new instance gets new tasks) or a startup success.
    async fn run(self, first: Instant) {
        let mut started_rx = self.started.subscribe();
        let mut run = Run::default();
        tokio::time::sleep_until(first).await;
        let mut next = first;
        loop {
            let started = *started_rx.borrow_and_update();
            let gated = match self.kind {
                ProbeType::Startup => {
                    if started {
                        return;
                    }
                    false
                }
                _ => !started,
            };
            if !gated
                && let Some(r) = self.probe().await
                && let Some(set) =
                    run.step(r, self.spec.success_threshold, self.spec.failure_threshold)
            {
                self.shared.set(&self.container_id, self.kind, set);
                match (self.kind, set) {
                    (ProbeType::Startup, ProbeResult::Success) => {
                        self.started.send_replace(true);
                        return;
                    }
                    (ProbeType::Startup | ProbeType::Liveness, ProbeResult::Failure) => {
                        self.shared.with(|s| {
                            s.kills.push(Kill {
                                container_id: self.container_id.clone(),
                                name: self.name.clone(),
                                probe: self.kind,
                                grace: self.spec.termination_grace,
                            });
                        });
                        self.shared.changed.notify_one();
                        // On hold until a new container instance (new tasks).
                        return;
                    }
                    _ => {}
                }
            }
            next += self.spec.period;
            let now = Instant::now();
            if next < now {
                next = now;
            }
            if self.kind == ProbeType::Readiness && gated {
                // kubelet probes readiness as soon as the container has started.
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {}
                    ok = async { started_rx.wait_for(|s| *s).await.is_ok() } => {
                        if !ok {
                            tokio::time::sleep_until(next).await;
                        }
                    }
                }
            } else {
                tokio::time::sleep_until(next).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_count_runs_of_equal_results() {
        let mut run = Run::default();
        let f = ProbeResult::Failure;
        let s = ProbeResult::Success;
        assert_eq!(run.step(f, 1, 3), None);
        assert_eq!(run.step(f, 1, 3), None);
        assert_eq!(run.step(s, 1, 3), Some(s));
        assert_eq!(run.step(f, 1, 3), None);
        assert_eq!(run.step(f, 1, 3), None);
        assert_eq!(run.step(f, 1, 3), Some(f));
        assert_eq!(run.step(f, 1, 3), Some(f));
        let mut run = Run::default();
        assert_eq!(run.step(s, 2, 1), None);
        assert_eq!(run.step(s, 2, 1), Some(s));
        assert_eq!(run.step(f, 2, 1), Some(f));
    }
}
