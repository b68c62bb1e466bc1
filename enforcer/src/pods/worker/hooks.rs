//! postStart and preStop hooks as the worker runs them (kubelet's `startContainer` and
//! `killContainer` steps).

use std::{collections::HashMap, sync::Arc};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    PodWorker, SANDBOX_READY, WorkerError, label_filter,
    terminate::{ignore_not_found, stop_container},
};
use crate::{
    cri::{
        ContainerRuntime,
        spec::{self, ContainerKind},
    },
    pods::{
        lifecycle::{self, Hook},
        probe,
    },
    policy::{pod_actions::RestartPolicy, security},
    recorder::{EventType, Involved},
};

/// Reports a failed preStop hook: the container's name and kubelet's message.
pub type HookFailed = Arc<dyn Fn(&str, String) + Send + Sync>;

/// The preStop hooks of a pod's containers, as the stop paths run them.
#[derive(Clone)]
pub struct PreStop {
    /// By container name.
    pub hooks: HashMap<String, Hook>,
    /// kubelet's `format.Pod`, for the hook's messages.
    pub pod: String,
    /// Where an httpGet hook without `host` goes.
    pub pod_host: String,
    pub failed: HookFailed,
    /// The pod's own grace period when the kill carries an override (an eviction): kubelet's
    /// `killContainer` runs the hook within the pod's grace period, then stops the container
    /// with the override. `None`: the hook and the stop share the kill's grace period.
    pub hook_grace: Option<i64>,
}

impl PreStop {
    pub(super) fn for_container(&self, name: &str) -> Option<(Hook, Self)> {
        self.hooks.get(name).map(|h| (h.clone(), self.clone()))
    }
}

/// Whether an httpGet hook goes to the pod's address (no `host` of its own).
fn needs_pod_host(h: &Hook) -> bool {
    matches!(h, Hook::Probe(probe::Handler::Http { host: None, .. }))
}

impl<R: ContainerRuntime> PodWorker<R> {
    /// kubelet's postStart step of `startContainer`: runs the hook; when it fails, records
    /// `FailedPostStartHook`, kills the container (its preStop first) and leaves it waiting
    /// with `PostStartHookError`; the restart follows the restart policy.
    pub(super) async fn post_start(
        &mut self,
        pod: &Pod,
        c: &Container,
        id: &str,
        sandbox_id: &str,
    ) -> Result<(), WorkerError> {
        let Some(handler) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else {
            return Ok(());
        };
        let pod_name = security::format_pod(pod);
        let result = match Hook::parse(handler, c) {
            Ok(hook) => {
                let host = if needs_pod_host(&hook) {
                    self.probe_host(pod, sandbox_id).await
                } else {
                    String::new()
                };
                lifecycle::run_hook(
                    &*self.ctx.runtime,
                    id,
                    &c.name,
                    &pod_name,
                    &hook,
                    &host,
                    lifecycle::POST_START_EXEC_TIMEOUT,
                )
                .await
                .map_err(|e| e.to_string())
            }
            Err(e) => Err(format!("Cannot run handler: {e}")),
        };
        let Err(message) = result else {
            return Ok(());
        };
        tracing::warn!(uid = %self.uid, container = %c.name, id = %id, %message, "postStart hook failed; killing the container");
        self.event(
            Some(&c.name),
            EventType::Warning,
            "FailedPostStartHook",
            message.clone(),
        );
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Killing",
            "FailedPostStartHook".to_owned(),
        );
        let hooks = self.pre_stop(pod).await;
        ignore_not_found(
            stop_container(
                &*self.ctx.runtime,
                id,
                &c.name,
                spec::grace_seconds(pod),
                hooks.for_container(&c.name),
            )
            .await,
        )
        .map_err(self.cri())?;
        // Waiting with kubelet's reason only when it will be restarted (kubelet's
        // convertToAPIContainerStatuses); otherwise it stays terminated.
        let sidecar = ContainerKind::of_init(c) == ContainerKind::Sidecar
            && pod
                .spec
                .iter()
                .flat_map(|s| s.init_containers.iter().flatten())
                .any(|i| i.name == c.name);
        if sidecar || RestartPolicy::of(pod) != RestartPolicy::Never {
            self.waiting
                .insert(c.name.clone(), ("PostStartHookError".to_owned(), message));
        }
        Ok(())
    }

    /// The pod's preStop hooks (a hook that cannot be parsed is reported when it would run).
    pub(super) async fn pre_stop(&mut self, pod: &Pod) -> PreStop {
        let mut hooks = HashMap::new();
        let mut bad = Vec::new();
        for c in pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        {
            if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
                match Hook::parse(h, c) {
                    Ok(hook) => {
                        hooks.insert(c.name.clone(), hook);
                    }
                    Err(e) => bad.push((c.name.clone(), e)),
                }
            }
        }
        for (name, e) in bad {
            self.event(
                Some(&name),
                EventType::Warning,
                "FailedPreStopHook",
                format!("Cannot run handler: {e}"),
            );
        }
        let pod_host = if hooks.values().any(needs_pod_host) {
            let sandbox = self
                .ctx
                .runtime
                .list_pod_sandboxes(cri::PodSandboxFilter {
                    label_selector: label_filter(&self.uid),
                    ..Default::default()
                })
                .await
                .ok()
                .and_then(|all| {
                    all.into_iter()
                        .filter(|s| s.state == SANDBOX_READY)
                        .max_by_key(|s| s.created_at)
                })
                .map(|s| s.id)
                .unwrap_or_default();
            self.probe_host(pod, &sandbox).await
        } else {
            String::new()
        };
        let events = self.ctx.events.clone();
        let owner = Arc::new(pod.clone());
        let uid = self.uid.clone();
        PreStop {
            hooks,
            pod: security::format_pod(pod),
            pod_host,
            hook_grace: self.grace_override.then(|| spec::grace_seconds(pod)),
            failed: Arc::new(move |container: &str, message: String| {
                events.event(
                    Involved::container(&owner, &uid, container),
                    EventType::Warning,
                    "FailedPreStopHook",
                    message,
                );
            }),
        }
    }
}
