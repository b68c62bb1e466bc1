//! The pod worker's decisions, pure: kubelet's `computePodActions` (`kuberuntime_manager.go`)
//! from the pod spec and what the runtime holds of the pod (the sidecar startup gate
//! included, so the plan is final), the kill of a container that failed its liveness or
//! startup probe ([`probe_kill`]), and `getPhase` (`kubelet_pods.go`) from its containers'
//! states. The pod worker (`crate::pods::worker`) observes the runtime, asks
//! [`compute_pod_actions`] for the plan and executes it; nothing here talks to the runtime or
//! reads a clock.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::backoff::Backoff;

/// What a container is in the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerKind {
    Init,
    /// An init container with `restartPolicy: Always`.
    Sidecar,
    Regular,
}

impl ContainerKind {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Init => "init",
            Self::Sidecar => "sidecar",
            Self::Regular => "regular",
        }
    }

    #[must_use]
    pub fn parse(s: &str) -> Self {
        match s {
            "init" => Self::Init,
            "sidecar" => Self::Sidecar,
            _ => Self::Regular,
        }
    }

    /// The kind of an init container of the spec.
    #[must_use]
    pub fn of_init(c: &Container) -> Self {
        if c.restart_policy.as_deref() == Some("Always") {
            Self::Sidecar
        } else {
            Self::Init
        }
    }
}

/// The pod's `restartPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The pod's policy; `Always` when unset (the API server's default).
    #[must_use]
    pub fn of(pod: &Pod) -> Self {
        match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
            Some("OnFailure") => Self::OnFailure,
            Some("Never") => Self::Never,
            _ => Self::Always,
        }
    }

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::OnFailure => "OnFailure",
            Self::Never => "Never",
        }
    }

    /// Whether a container that exited with `code` is started again.
    #[must_use]
    pub fn restarts(self, code: i32) -> bool {
        match self {
            Self::Always => true,
            Self::OnFailure => code != 0,
            Self::Never => false,
        }
    }
}

/// A container's `imagePullPolicy`, defaulted as the API server does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The container's policy: as set, else `Always` for an untagged or `:latest` image and
    /// `IfNotPresent` for any other tag or a digest.
    #[must_use]
    pub fn of(c: &Container) -> Self {
        match c.image_pull_policy.as_deref() {
            Some("Always") => return Self::Always,
            Some("IfNotPresent") => return Self::IfNotPresent,
            Some("Never") => return Self::Never,
            _ => {}
        }
        let image = c.image.as_deref().unwrap_or("");
        let last = image.rsplit('/').next().unwrap_or(image);
        if image.contains('@') {
            Self::IfNotPresent
        } else {
            match last.split_once(':') {
                Some((_, "latest")) | None => Self::Always,
                Some(_) => Self::IfNotPresent,
            }
        }
    }

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// The pod phase (kubelet's `v1.PodPhase`), plus `Terminating` for a pod being killed, as the
/// status file shows it (kubectl's column).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PodPhase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
    Terminating,
}

impl PodPhase {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::Terminating => "Terminating",
        }
    }

    /// Succeeded or Failed: kubelet never runs such a pod again.
    #[must_use]
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// The status file's string, for readers at the edge (black-box tests, tools).
impl PartialEq<&str> for PodPhase {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Display for PodPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A container's state in the runtime (CRI's `ContainerState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeState {
    Created,
    Running,
    Exited { code: i32 },
    Unknown,
}

/// A sandbox as the runtime holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxView {
    pub id: String,
    pub ready: bool,
    /// Made from the pod's current sandbox definition (its hash annotation matches).
    pub current: bool,
    pub attempt: u32,
    pub created_at: i64,
}

/// A container instance as the runtime holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerView {
    pub id: String,
    pub name: String,
    pub sandbox_id: String,
    pub state: RuntimeState,
    /// Made from the container's current definition (its hash annotation matches).
    pub current: bool,
    pub restart_count: u32,
    pub created_at: i64,
    /// Past its startup probe, or without one (the prober's `started`; counts only while
    /// running).
    pub started: bool,
}

/// What the runtime holds of one pod (kubelet's `kubecontainer.PodStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRuntime {
    pub sandboxes: Vec<SandboxView>,
    pub containers: Vec<ContainerView>,
}

impl PodRuntime {
    /// The newest sandbox.
    #[must_use]
    pub fn latest_sandbox(&self) -> Option<&SandboxView> {
        self.sandboxes.iter().max_by_key(|s| s.created_at)
    }

    /// The instances of container `name` in `sandbox`, newest first.
    #[must_use]
    pub fn instances<'a>(&'a self, sandbox: &str, name: &str) -> Vec<&'a ContainerView> {
        let mut v: Vec<&ContainerView> = self
            .containers
            .iter()
            .filter(|c| c.sandbox_id == sandbox && c.name == name)
            .collect();
        v.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        v
    }
}

/// What to do with an earlier instance when a container is started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replace {
    /// No earlier instance.
    Nothing,
    /// A created, never started instance of the current definition: start it instead of
    /// creating another (if the runtime no longer has it, remove it and create).
    StartCreated(String),
    /// An instance that cannot be started (unknown state, or an old definition): remove it.
    Remove(String),
    /// A running instance of an old definition: stop it (kept as the last state).
    Stop(String),
    /// An exited instance, restarted after its crash backoff: the backoff under `backoff_key`
    /// advances, the exited instance stays as the last state and `remove_older` (older exited
    /// instances of the container) are removed after the start.
    Restart {
        exited: String,
        backoff_key: String,
        remove_older: Vec<String>,
    },
}

/// One container to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerStart {
    pub name: String,
    pub kind: ContainerKind,
    pub restart_count: u32,
    pub replace: Replace,
}

/// A container waiting in crash backoff.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashBackoff {
    pub name: String,
    /// When it may start again.
    pub until: Instant,
    /// kubelet's `CrashLoopBackOff` message.
    pub message: String,
}

/// The sandbox part of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SandboxPlan {
    /// The current sandbox is ready: keep it.
    Keep(String),
    /// Create a sandbox with this attempt number; with `kill_first`, the pod's old sandbox and
    /// containers are killed and removed before (definition changed, or not ready).
    Create { attempt: u32, kill_first: bool },
    /// The pod ran to its end in this sandbox (restartPolicy Never with an attempt made, or
    /// OnFailure with every container succeeded): start nothing, publish the final status.
    Finished(String),
}

/// The plan of one sync (kubelet's `podActions`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodActions {
    pub sandbox: SandboxPlan,
    /// Containers to start, in order.
    pub start: Vec<ContainerStart>,
    /// Containers in crash backoff.
    pub backoff: Vec<CrashBackoff>,
    /// A non-restartable init container failed (`restartPolicy: Never`): the pod fails.
    pub init_failed: bool,
    /// When the worker wants to be woken (the first backoff expiry).
    pub wake: Option<Instant>,
}

/// The crash-backoff key of a container (kubelet's `uid_name_hash`-like key).
#[must_use]
pub fn backoff_key(uid: &str, name: &str, hash: &str) -> String {
    format!("{uid}/{name}/{hash}")
}

/// kubelet's `computePodActions`: what one sync does, from the pod spec, what the runtime
/// holds (`rt`), the crash backoff and when each exited container was first seen exited
/// (`exit_seen`; one not in it counts from `now`). `hash` is the container definition's hash
/// (the backoff key changes with the definition, as kubelet's does). The plan is final: the
/// containers a sidecar's startup probe holds are already left out
/// (`gate_on_sidecar_startup`).
#[must_use]
pub fn compute_pod_actions(
    pod: &Pod,
    rt: &PodRuntime,
    hash: &dyn Fn(&Container) -> String,
    backoff: &Backoff,
    exit_seen: &HashMap<String, Instant>,
    now: Instant,
) -> PodActions {
    let mut actions = plan_containers(pod, rt, hash, backoff, exit_seen, now);
    gate_on_sidecar_startup(pod, rt, &mut actions);
    actions
}

/// The plan before the sidecar startup gate: sandbox, init sequence, restarts and backoff.
fn plan_containers(
    pod: &Pod,
    rt: &PodRuntime,
    hash: &dyn Fn(&Container) -> String,
    backoff: &Backoff,
    exit_seen: &HashMap<String, Instant>,
    now: Instant,
) -> PodActions {
    let policy = RestartPolicy::of(pod);
    let spec = pod.spec.clone().unwrap_or_default();
    let mut actions = PodActions {
        sandbox: SandboxPlan::Create {
            attempt: 0,
            kill_first: false,
        },
        start: Vec::new(),
        backoff: Vec::new(),
        init_failed: false,
        wake: None,
    };
    let latest = rt.latest_sandbox();
    // The containers counted for restart counts, and the sandbox the plan works in.
    let (all, sandbox_id): (Vec<&ContainerView>, String) = match latest {
        Some(s) if s.ready && s.current => {
            actions.sandbox = SandboxPlan::Keep(s.id.clone());
            (rt.containers.iter().collect(), s.id.clone())
        }
        Some(old) => {
            let in_old: Vec<&ContainerView> = rt
                .containers
                .iter()
                .filter(|c| c.sandbox_id == old.id)
                .collect();
            let succeeded = |c: &Container| {
                rt.instances(&old.id, &c.name)
                    .first()
                    .is_some_and(|x| x.state == RuntimeState::Exited { code: 0 })
            };
            let finished = !in_old.is_empty()
                && old.current
                && (policy == RestartPolicy::Never
                    || (policy == RestartPolicy::OnFailure
                        && spec.containers.iter().all(succeeded)));
            if finished {
                actions.sandbox = SandboxPlan::Finished(old.id.clone());
                return actions;
            }
            actions.sandbox = SandboxPlan::Create {
                attempt: old.attempt.saturating_add(1),
                kill_first: true,
            };
            (Vec::new(), String::new())
        }
        None => (rt.containers.iter().collect(), String::new()),
    };
    let planner = ContainerPlanner {
        rt,
        sandbox_id: &sandbox_id,
        all: &all,
        policy,
        uid: pod.metadata.uid.as_deref().unwrap_or(""),
        pod_name: pod.metadata.name.as_deref().unwrap_or(""),
        namespace: pod.metadata.namespace.as_deref().unwrap_or("default"),
        hash,
        backoff,
        exit_seen,
        now,
    };
    // Init containers one at a time in order; sidecars keep running beside the next ones.
    for c in spec.init_containers.iter().flatten() {
        let kind = ContainerKind::of_init(c);
        match (planner.plan(c, kind, &mut actions), kind) {
            (Step::Done, _) | (Step::Running | Step::Started, ContainerKind::Sidecar) => {}
            (Step::Failed, _) => {
                actions.init_failed = true;
                return actions;
            }
            _ => return actions,
        }
    }
    for c in &spec.containers {
        let _ = planner.plan(c, ContainerKind::Regular, &mut actions);
    }
    actions
}

/// What planning one container needs: the runtime's view, the sandbox the plan works in,
/// the containers counted for restart counts, the restart policy, the crash backoff.
struct ContainerPlanner<'a> {
    rt: &'a PodRuntime,
    sandbox_id: &'a str,
    all: &'a [&'a ContainerView],
    policy: RestartPolicy,
    uid: &'a str,
    pod_name: &'a str,
    namespace: &'a str,
    hash: &'a dyn Fn(&Container) -> String,
    backoff: &'a Backoff,
    exit_seen: &'a HashMap<String, Instant>,
    now: Instant,
}

impl ContainerPlanner<'_> {
    /// The restart count of a container's next instance.
    fn next_count(&self, name: &str) -> u32 {
        self.all
            .iter()
            .filter(|x| x.name == name)
            .map(|x| x.restart_count.saturating_add(1))
            .max()
            .unwrap_or(0)
    }

    /// One container's step: start it, restart it after backoff, or leave it.
    fn plan(&self, c: &Container, kind: ContainerKind, actions: &mut PodActions) -> Step {
        let latest = self.rt.instances(self.sandbox_id, &c.name).first().copied();
        let start = |replace: Replace| ContainerStart {
            name: c.name.clone(),
            kind,
            restart_count: self.next_count(&c.name),
            replace,
        };
        match latest.map(|x| (x, x.state)) {
            Some((x, RuntimeState::Running)) => {
                if x.current || kind != ContainerKind::Regular {
                    Step::Running
                } else {
                    actions.start.push(start(Replace::Stop(x.id.clone())));
                    Step::Running
                }
            }
            Some((x, RuntimeState::Exited { code })) => {
                if kind == ContainerKind::Init && code == 0 {
                    return Step::Done;
                }
                let restart = match kind {
                    ContainerKind::Sidecar => true,
                    _ => self.policy.restarts(code),
                };
                if !restart {
                    return if kind == ContainerKind::Init {
                        Step::Failed
                    } else {
                        Step::Done
                    };
                }
                let key = backoff_key(self.uid, &c.name, &(self.hash)(c));
                let seen = self.exit_seen.get(&x.id).copied().unwrap_or(self.now);
                if let Some(at) = self.backoff.retry_at(&key, seen, self.now) {
                    let delay = self.backoff.current(&key).unwrap_or_default();
                    actions.backoff.push(CrashBackoff {
                        name: c.name.clone(),
                        until: at,
                        message: crash_message(
                            delay,
                            &c.name,
                            self.pod_name,
                            self.namespace,
                            self.uid,
                        ),
                    });
                    actions.wake = Some(actions.wake.map_or(at, |w| w.min(at)));
                } else {
                    let remove_older = self
                        .all
                        .iter()
                        .filter(|o| {
                            o.name == c.name
                                && o.id != x.id
                                && matches!(o.state, RuntimeState::Exited { .. })
                        })
                        .map(|o| o.id.clone())
                        .collect();
                    actions.start.push(start(Replace::Restart {
                        exited: x.id.clone(),
                        backoff_key: key,
                        remove_older,
                    }));
                }
                Step::Restarting
            }
            Some((x, RuntimeState::Created)) if x.current => {
                actions
                    .start
                    .push(start(Replace::StartCreated(x.id.clone())));
                Step::Started
            }
            Some((x, _)) => {
                actions.start.push(start(Replace::Remove(x.id.clone())));
                Step::Started
            }
            None => {
                actions.start.push(start(Replace::Nothing));
                Step::Started
            }
        }
    }
}

/// kubelet's computeInitContainerActions: the containers after a sidecar with a startup
/// probe are not started for the first time until that probe succeeded (a sidecar
/// starting now has not). Restarts of containers that already ran are not held.
fn gate_on_sidecar_startup(pod: &Pod, rt: &PodRuntime, actions: &mut PodActions) {
    let Some(spec) = pod.spec.as_ref() else {
        return;
    };
    let sandbox = match &actions.sandbox {
        SandboxPlan::Keep(id) => Some(id.as_str()),
        _ => None,
    };
    let inits: Vec<&Container> = spec.init_containers.iter().flatten().collect();
    let gate = inits.iter().position(|c| {
        ContainerKind::of_init(c) == ContainerKind::Sidecar
            && c.startup_probe.is_some()
            && (actions.start.iter().any(|s| s.name == c.name)
                || rt.containers.iter().any(|x| {
                    Some(x.sandbox_id.as_str()) == sandbox
                        && x.state == RuntimeState::Running
                        && x.name == c.name
                        && !x.started
                }))
    });
    let Some(i) = gate else {
        return;
    };
    let later: HashSet<&str> = inits[i + 1..]
        .iter()
        .map(|c| c.name.as_str())
        .chain(spec.containers.iter().map(|c| c.name.as_str()))
        .collect();
    actions.start.retain(|s| {
        !later.contains(s.name.as_str())
            || matches!(s.replace, Replace::Restart { .. } | Replace::Stop(_))
    });
}

/// The exit code the plan and the phase see: a probe kill the container answered with
/// exit 0 (it handled SIGTERM) is still a failure, restarted under OnFailure and never
/// a success of the pod (the status shows the real code).
#[must_use]
pub fn effective_exit_code(code: i32, probe_killed: bool) -> i32 {
    if code == 0 && probe_killed { 1 } else { code }
}

/// The probe whose failure kills a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailedProbe {
    Liveness,
    Startup,
}

impl FailedProbe {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Liveness => "liveness",
            Self::Startup => "startup",
        }
    }
}

/// How a container that failed its liveness or startup probe is killed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeKill {
    /// kubelet's `Killing` message (computePodActions / computeInitContainerActions).
    pub message: String,
    /// The stop's grace period in seconds.
    pub grace: i64,
}

/// kubelet's kill of a container past its liveness or startup failure threshold: the
/// `Killing` message (a sidecar's, or whether the restart policy restarts it) and
/// `setTerminationGracePeriod`: the deletion's grace period, else the probe's
/// (`probe_grace`), else the pod's (`pod_grace`); never below the runtime floor
/// (`min_grace`).
#[must_use]
pub fn probe_kill(
    pod: &Pod,
    name: &str,
    probe: FailedProbe,
    probe_grace: Option<i64>,
    pod_grace: i64,
    min_grace: i64,
) -> ProbeKill {
    let sidecar = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .any(|c| c.name == name);
    let restart = sidecar || RestartPolicy::of(pod) != RestartPolicy::Never;
    let what = probe.as_str();
    let message = if sidecar {
        format!("Init container {name} failed {what} probe")
    } else if restart {
        format!("Container {name} failed {what} probe, will be restarted")
    } else {
        format!("Container {name} failed {what} probe")
    };
    let grace = pod
        .metadata
        .deletion_grace_period_seconds
        .or(probe_grace)
        .unwrap_or(pod_grace)
        .max(min_grace);
    ProbeKill { message, grace }
}

/// Where one container stands after planning it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Running (or, for a sidecar, being kept running).
    Running,
    /// Started now (new, or created earlier): the init sequence waits for an init container,
    /// not for a sidecar.
    Started,
    /// Exited and restarted, or waiting in crash backoff: the init sequence waits for it.
    Restarting,
    /// Ran to its end: an init container that succeeded, or one not restarted.
    Done,
    /// A non-restartable init container failed.
    Failed,
}

/// kubelet's CrashLoopBackOff message.
#[must_use]
pub fn crash_message(delay: Duration, name: &str, pod: &str, namespace: &str, uid: &str) -> String {
    format!(
        "back-off {}s restarting failed container={name} pod={pod}_{namespace}({uid})",
        delay.as_secs()
    )
}

/// What a container is doing, for [`pod_phase`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppState {
    /// Never started yet.
    Waiting,
    Running,
    /// Exited, possibly waiting to restart.
    Exited {
        code: i32,
    },
}

/// kubelet's `getPhase`.
#[must_use]
pub fn pod_phase(
    policy: RestartPolicy,
    init_failed: bool,
    init_pending: bool,
    apps: &[AppState],
) -> PodPhase {
    if init_failed {
        return PodPhase::Failed;
    }
    if init_pending {
        return PodPhase::Pending;
    }
    let waiting = apps.iter().filter(|a| **a == AppState::Waiting).count();
    let running = apps.iter().filter(|a| **a == AppState::Running).count();
    let stopped = apps
        .iter()
        .filter(|a| matches!(a, AppState::Exited { .. }))
        .count();
    let succeeded = apps
        .iter()
        .filter(|a| matches!(a, AppState::Exited { code: 0 }))
        .count();
    if waiting > 0 {
        PodPhase::Pending
    } else if running > 0 {
        PodPhase::Running
    } else if stopped > 0 {
        match policy {
            RestartPolicy::Always => PodPhase::Running,
            _ if stopped == succeeded => PodPhase::Succeeded,
            RestartPolicy::Never => PodPhase::Failed,
            RestartPolicy::OnFailure => PodPhase::Running,
        }
    } else {
        PodPhase::Pending
    }
}

#[cfg(test)]
mod tests;
