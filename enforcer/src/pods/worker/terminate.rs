//! kubelet's `killContainer` and `killPod`, and the worker's terminating state: kill with the
//! grace period, publish the final container states, remove everything.

use std::{sync::Arc, time::Duration};

use k8s_cri::v1 as cri;
use tokio::{sync::mpsc, task::JoinSet, time::Instant};

use super::{
    PodWorker, PreStop, RUNNING, SANDBOX_READY, WorkUpdate, kind_of, label_filter, name_of,
};
use crate::{
    cri::{
        ContainerRuntime, CriError,
        spec::{self, ContainerKind},
    },
    pods::{
        lifecycle::{self, Hook},
        volumes,
    },
    policy::pod_actions::PodPhase,
    recorder::EventType,
    sources::is_valid_uid,
    status_manager::{ContainerState, PodRecord},
};

/// kubelet's `killContainer`: runs the container's preStop hook (bounded by the grace period;
/// a failure is reported and the stop goes on), then stops it with what is left of the grace
/// period, never less than the runtime floor. Under an override ([`PreStop::hook_grace`])
/// the hook has the pod's grace period and the stop the override.
pub(super) async fn stop_container<R: ContainerRuntime>(
    runtime: &R,
    id: &str,
    name: &str,
    grace: i64,
    pre_stop: Option<(Hook, PreStop)>,
) -> Result<(), CriError> {
    let mut timeout = grace.max(spec::MIN_GRACE_SECONDS);
    let hook_grace = pre_stop
        .as_ref()
        .and_then(|(_, ps)| ps.hook_grace)
        .unwrap_or(grace);
    if let Some((hook, ps)) = pre_stop
        && hook_grace > 0
    {
        let started = Instant::now();
        let bound = Duration::from_secs(u64::try_from(hook_grace).unwrap_or(0));
        let run = lifecycle::run_hook(runtime, id, name, &ps.pod, &hook, &ps.pod_host, bound);
        match tokio::time::timeout(bound, run).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let message = e.to_string();
                tracing::warn!(container = %name, id = %id, %message, "preStop hook failed");
                (ps.failed)(name, message);
            }
            Err(_) => {
                tracing::info!(container = %name, id = %id, grace = hook_grace, "preStop hook not completed in grace period");
            }
        }
        if ps.hook_grace.is_none() {
            timeout = lifecycle::remaining_grace(grace, started.elapsed());
        }
    }
    runtime.stop_container(id, timeout).await
}

/// Stops the pod's containers (regular ones first, then init containers and sidecars, each
/// after its preStop hook, with what is left of the grace period, never less than the
/// runtime floor), then its sandboxes; with `remove`, removes them all too.
pub async fn kill_pod<R: ContainerRuntime>(
    runtime: &Arc<R>,
    uid: &str,
    grace: i64,
    remove: bool,
    pre_stop: Option<&PreStop>,
) -> Result<(), CriError> {
    let started = Instant::now();
    let containers = runtime
        .list_containers(cri::ContainerFilter {
            label_selector: label_filter(uid),
            ..Default::default()
        })
        .await?;
    let (regular, others): (Vec<&cri::Container>, Vec<&cri::Container>) = containers
        .iter()
        .filter(|c| c.state == RUNNING)
        .partition(|c| kind_of(c) == ContainerKind::Regular);
    for group in [regular, others] {
        let elapsed = i64::try_from(started.elapsed().as_secs()).unwrap_or(i64::MAX);
        let timeout = grace.saturating_sub(elapsed);
        let mut set = JoinSet::new();
        for c in group {
            let rt = runtime.clone();
            let id = c.id.clone();
            let name = name_of(c).to_owned();
            let hook = pre_stop.and_then(|p| p.for_container(&name));
            set.spawn(async move { stop_container(&*rt, &id, &name, timeout, hook).await });
        }
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Err(e)) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        }
    }
    let sandboxes = runtime
        .list_pod_sandboxes(cri::PodSandboxFilter {
            label_selector: label_filter(uid),
            ..Default::default()
        })
        .await?;
    for s in &sandboxes {
        if s.state == SANDBOX_READY {
            ignore_not_found(runtime.stop_pod_sandbox(&s.id).await)?;
        }
    }
    if remove {
        for c in &containers {
            ignore_not_found(runtime.remove_container(&c.id).await)?;
        }
        for s in &sandboxes {
            ignore_not_found(runtime.remove_pod_sandbox(&s.id).await)?;
        }
    }
    Ok(())
}

pub(super) fn ignore_not_found(r: Result<(), CriError>) -> Result<(), CriError> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

impl<R: ContainerRuntime> PodWorker<R> {
    /// Grace period of a pod known only from the runtime (its containers' annotation).
    async fn orphan_grace(&self) -> i64 {
        let containers = self.pod_containers().await.unwrap_or_default();
        containers
            .iter()
            .filter_map(|c| c.annotations.get(spec::GRACE_PERIOD_ANNOTATION))
            .filter_map(|g| g.parse::<i64>().ok())
            .max()
            .unwrap_or(spec::DEFAULT_GRACE_SECONDS)
    }

    /// terminating -> terminated: kill with the grace period (a shorter one arriving meanwhile
    /// takes over), read the containers' final states, then remove containers and sandboxes,
    /// the pod cgroup and the log directory. Returns the pod's last status (kubelet keeps the
    /// terminated container states in the status of a pod it stopped).
    pub(super) async fn terminate(
        &mut self,
        grace: Option<i64>,
        rx: &mut mpsc::UnboundedReceiver<WorkUpdate>,
    ) -> Option<PodRecord> {
        let mut grace = match grace {
            Some(g) => g,
            None => self.orphan_grace().await,
        };
        tracing::info!(uid = %self.uid, grace, "killing pod");
        // kubelet stops probing a pod being deleted (liveness and startup never kill it now).
        self.probes.clear();
        if self.pod.is_some()
            && let Some(mut rec) = self.ctx.status.get(&self.uid)
        {
            for c in rec
                .container_statuses
                .iter()
                .chain(&rec.init_container_statuses)
                .filter(|c| matches!(c.state, ContainerState::Running { .. }))
            {
                self.event(
                    Some(&c.name),
                    EventType::Normal,
                    "Killing",
                    format!("Stopping container {}", c.name),
                );
            }
            rec.phase = PodPhase::Terminating;
            rec.reason = String::new();
            self.ctx.status.set(rec);
        }
        let pre_stop = match self.pod.clone() {
            Some(pod) => Some(self.pre_stop(&pod).await),
            None => None,
        };
        // Stop everything (kept, so its final state can be read), then remove it.
        for remove in [false, true] {
            let mut failures = 0u32;
            loop {
                let runtime = self.ctx.runtime.clone();
                let uid = self.uid.clone();
                let hooks = pre_stop.clone();
                let kill =
                    async move { kill_pod(&runtime, &uid, grace, remove, hooks.as_ref()).await };
                tokio::pin!(kill);
                let result = loop {
                    tokio::select! {
                        r = &mut kill => break Some(r),
                        u = rx.recv() => match u {
                            Some(WorkUpdate::Kill { grace: Some(g) }) if g.max(1) < grace => {
                                grace = g.max(1);
                                tracing::info!(uid = %self.uid, grace, "shorter grace period; killing again");
                                break None;
                            }
                            Some(_) => {}
                            None => {
                                // Shutdown while killing: finish the kill anyway.
                                break Some(kill.await);
                            }
                        },
                    }
                };
                match result {
                    None => continue,
                    Some(Ok(())) => break,
                    Some(Err(e)) => {
                        failures = failures.saturating_add(1);
                        tracing::warn!(uid = %self.uid, error = %e, "killing pod failed; retrying");
                        tokio::time::sleep(
                            Duration::from_millis(500)
                                .saturating_mul(1 << failures.min(5))
                                .min(Duration::from_secs(10)),
                        )
                        .await;
                    }
                }
            }
            if !remove {
                self.publish_final().await;
            }
        }
        if let Err(e) = self.ctx.cgroups.remove(&self.uid).await {
            tracing::warn!(uid = %self.uid, error = %e, "removing pod cgroup");
        }
        if is_valid_uid(&self.uid) {
            let dir = self.ctx.log_root.join(&self.uid);
            if let Err(e) = volumes::remove_pod_dir(&dir) {
                // Never walks into a volume still mounted: the directory stays for the next
                // start's cleanup.
                tracing::warn!(uid = %self.uid, error = %e, "removing the pod directory");
            }
        }
        let last = self
            .pod
            .as_ref()
            .and_then(|_| self.ctx.status.get(&self.uid));
        self.ctx.status.remove(&self.uid);
        tracing::info!(uid = %self.uid, "pod terminated");
        last
    }

    /// The stopped pod's status with its containers' final states (best effort: a runtime
    /// that does not answer leaves the last published status).
    async fn publish_final(&mut self) {
        let Some(pod) = self.pod.clone() else {
            return;
        };
        let Some(rec) = self.ctx.status.get(&self.uid) else {
            return;
        };
        let all = match self.pod_containers().await {
            Ok(all) => all,
            Err(e) => {
                tracing::debug!(uid = %self.uid, error = %e, "final container states");
                return;
            }
        };
        let qos = spec::pod_qos(&pod);
        let sandbox = if rec.sandbox_id.is_empty() {
            all.first()
                .map(|c| c.pod_sandbox_id.clone())
                .unwrap_or_default()
        } else {
            rec.sandbox_id.clone()
        };
        match self
            .publish(&pod, qos, &rec.cgroup, &sandbox, &all, false)
            .await
        {
            Ok(_) => {
                // Still terminating until the runtime loop publishes the terminal status.
                if let Some(mut r) = self.ctx.status.get(&self.uid) {
                    r.phase = PodPhase::Terminating;
                    self.ctx.status.set(r);
                }
            }
            Err(e) => tracing::debug!(uid = %self.uid, error = %e, "final container states"),
        }
    }
}
