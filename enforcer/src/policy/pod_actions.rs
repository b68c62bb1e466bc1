//! The pod worker's decisions, pure: kubelet's `computePodActions` (`kuberuntime_manager.go`)
//! from the pod spec and what the runtime holds of the pod, and `getPhase`
//! (`kubelet_pods.go`) from its containers' states. The pod worker
//! ([`crate::runtime::worker`]) observes the runtime, asks [`compute_pod_actions`] for the plan
//! and executes it; nothing here talks to the runtime or reads a clock.

use std::{collections::HashMap, time::Duration};

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
/// (the backoff key changes with the definition, as kubelet's does).
#[must_use]
pub fn compute_pod_actions(
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
    let next_count = |name: &str| {
        all.iter()
            .filter(|x| x.name == name)
            .map(|x| x.restart_count.saturating_add(1))
            .max()
            .unwrap_or(0)
    };
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    let pod_name = pod.metadata.name.as_deref().unwrap_or("");
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    // One container's step: start it, restart it after backoff, or leave it.
    let plan = |c: &Container, kind: ContainerKind, actions: &mut PodActions| -> Step {
        let latest = rt.instances(&sandbox_id, &c.name).first().copied();
        let start = |replace: Replace| ContainerStart {
            name: c.name.clone(),
            kind,
            restart_count: next_count(&c.name),
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
                    _ => policy.restarts(code),
                };
                if !restart {
                    return if kind == ContainerKind::Init {
                        Step::Failed
                    } else {
                        Step::Done
                    };
                }
                let key = backoff_key(uid, &c.name, &hash(c));
                let seen = exit_seen.get(&x.id).copied().unwrap_or(now);
                if let Some(at) = backoff.retry_at(&key, seen, now) {
                    let delay = backoff.current(&key).unwrap_or_default();
                    actions.backoff.push(CrashBackoff {
                        name: c.name.clone(),
                        until: at,
                        message: crash_message(delay, &c.name, pod_name, namespace, uid),
                    });
                    actions.wake = Some(actions.wake.map_or(at, |w| w.min(at)));
                } else {
                    let remove_older = all
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
    };
    // Init containers one at a time in order; sidecars keep running beside the next ones.
    for c in spec.init_containers.iter().flatten() {
        let kind = ContainerKind::of_init(c);
        match (plan(c, kind, &mut actions), kind) {
            (Step::Done, _) | (Step::Running | Step::Started, ContainerKind::Sidecar) => {}
            (Step::Failed, _) => {
                actions.init_failed = true;
                return actions;
            }
            _ => return actions,
        }
    }
    for c in &spec.containers {
        let _ = plan(c, ContainerKind::Regular, &mut actions);
    }
    actions
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
mod tests {
    use super::*;

    fn pod(policy: &str, inits: &[(&str, bool)], apps: &[&str]) -> Pod {
        let c = |name: &str| Container {
            name: name.to_owned(),
            image: Some("busybox:local".to_owned()),
            ..Default::default()
        };
        let mut p = Pod::default();
        p.metadata.uid = Some("u".to_owned());
        p.metadata.name = Some("p".to_owned());
        p.metadata.namespace = Some("ns".to_owned());
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            restart_policy: Some(policy.to_owned()),
            init_containers: Some(
                inits
                    .iter()
                    .map(|(n, sidecar)| Container {
                        restart_policy: sidecar.then(|| "Always".to_owned()),
                        ..c(n)
                    })
                    .collect(),
            ),
            containers: apps.iter().map(|n| c(n)).collect(),
            ..Default::default()
        });
        p
    }

    fn sandbox(id: &str, ready: bool, current: bool, attempt: u32) -> SandboxView {
        SandboxView {
            id: id.to_owned(),
            ready,
            current,
            attempt,
            created_at: i64::from(attempt),
        }
    }

    /// Container `name` in sandbox `s`, state, created at `at`, restart count `n`.
    fn ctr(name: &str, s: &str, state: RuntimeState, at: i64, n: u32) -> ContainerView {
        ContainerView {
            id: format!("{name}-{at}"),
            name: name.to_owned(),
            sandbox_id: s.to_owned(),
            state,
            current: true,
            restart_count: n,
            created_at: at,
        }
    }

    const RUN: RuntimeState = RuntimeState::Running;
    const OK: RuntimeState = RuntimeState::Exited { code: 0 };
    const ERR: RuntimeState = RuntimeState::Exited { code: 1 };

    fn hash(c: &Container) -> String {
        format!("h-{}", c.name)
    }

    fn plan(p: &Pod, rt: &PodRuntime) -> PodActions {
        let now = Instant::now();
        compute_pod_actions(p, rt, &hash, &Backoff::default(), &HashMap::new(), now)
    }

    fn starts(a: &PodActions) -> Vec<(&str, u32, &Replace)> {
        a.start
            .iter()
            .map(|s| (s.name.as_str(), s.restart_count, &s.replace))
            .collect()
    }

    /// kubelet's `TestComputePodActions`, the cases our pod worker has.
    #[test]
    fn compute_pod_actions_table() {
        // No sandbox: create one (attempt 0), start every app container.
        let p = pod("Always", &[], &["a", "b"]);
        let a = plan(&p, &PodRuntime::default());
        assert_eq!(
            a.sandbox,
            SandboxPlan::Create {
                attempt: 0,
                kill_first: false
            }
        );
        assert_eq!(
            starts(&a),
            [("a", 0, &Replace::Nothing), ("b", 0, &Replace::Nothing)]
        );

        // Everything running: nothing to do.
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s", true, true, 0)],
            containers: vec![ctr("a", "s", RUN, 1, 0), ctr("b", "s", RUN, 1, 0)],
        };
        let a = plan(&p, &rt);
        assert_eq!(a.sandbox, SandboxPlan::Keep("s".to_owned()));
        assert!(a.start.is_empty(), "{a:?}");

        // Sandbox not ready: kill the pod, new sandbox with the next attempt, counts from 0.
        let mut dead = rt.clone();
        dead.sandboxes[0].ready = false;
        let a = plan(&p, &dead);
        assert_eq!(
            a.sandbox,
            SandboxPlan::Create {
                attempt: 1,
                kill_first: true
            }
        );
        assert_eq!(starts(&a).len(), 2);

        // Sandbox definition changed: the same.
        let mut changed = rt.clone();
        changed.sandboxes[0].current = false;
        assert!(matches!(
            plan(&p, &changed).sandbox,
            SandboxPlan::Create {
                kill_first: true,
                ..
            }
        ));

        // One container exited: restarted (Always), count from the highest, older exited
        // instances removed after the start.
        let mut exited = rt.clone();
        exited.containers[1] = ctr("b", "s", ERR, 5, 3);
        exited.containers.push(ctr("b", "s", ERR, 2, 2));
        let a = plan(&p, &exited);
        assert_eq!(
            starts(&a),
            [(
                "b",
                4,
                &Replace::Restart {
                    exited: "b-5".to_owned(),
                    backoff_key: "u/b/h-b".to_owned(),
                    remove_older: vec!["b-2".to_owned()],
                }
            )]
        );

        // OnFailure: exit 0 stays; Never: nothing restarts.
        exited.containers[1] = ctr("b", "s", OK, 5, 3);
        assert!(
            plan(&pod("OnFailure", &[], &["a", "b"]), &exited)
                .start
                .is_empty()
        );
        exited.containers[1] = ctr("b", "s", ERR, 5, 3);
        assert_eq!(
            plan(&pod("OnFailure", &[], &["a", "b"]), &exited)
                .start
                .len(),
            1
        );
        assert!(
            plan(&pod("Never", &[], &["a", "b"]), &exited)
                .start
                .is_empty()
        );

        // A running container of an old definition: stopped and replaced.
        let mut old = rt.clone();
        old.containers[0].current = false;
        assert_eq!(
            starts(&plan(&p, &old)),
            [("a", 1, &Replace::Stop("a-1".to_owned()))]
        );

        // Created and never started: started, not created again; unknown state: removed.
        let mut created = rt.clone();
        created.containers[0].state = RuntimeState::Created;
        created.containers[1].state = RuntimeState::Unknown;
        assert_eq!(
            starts(&plan(&p, &created)),
            [
                ("a", 1, &Replace::StartCreated("a-1".to_owned())),
                ("b", 1, &Replace::Remove("b-1".to_owned()))
            ]
        );
    }

    #[test]
    fn a_pod_that_ran_to_its_end_is_not_started_again() {
        let mut rt = PodRuntime {
            sandboxes: vec![sandbox("s", false, true, 0)],
            containers: vec![ctr("a", "s", OK, 1, 0)],
        };
        for policy in ["Never", "OnFailure"] {
            assert_eq!(
                plan(&pod(policy, &[], &["a"]), &rt).sandbox,
                SandboxPlan::Finished("s".to_owned()),
                "{policy}"
            );
        }
        // Always: a new sandbox.
        assert!(matches!(
            plan(&pod("Always", &[], &["a"]), &rt).sandbox,
            SandboxPlan::Create { attempt: 1, .. }
        ));
        // OnFailure with a failed container: a new sandbox; Never: finished.
        rt.containers[0].state = ERR;
        assert!(matches!(
            plan(&pod("OnFailure", &[], &["a"]), &rt).sandbox,
            SandboxPlan::Create { .. }
        ));
        assert_eq!(
            plan(&pod("Never", &[], &["a"]), &rt).sandbox,
            SandboxPlan::Finished("s".to_owned())
        );
    }

    #[test]
    fn init_containers_one_at_a_time_sidecars_keep_running() {
        let p = pod(
            "Always",
            &[("side", true), ("i1", false), ("i2", false)],
            &["app"],
        );
        let s = |containers| PodRuntime {
            sandboxes: vec![sandbox("s", true, true, 0)],
            containers,
        };
        // Fresh sandbox: the sidecar and the first init container start; nothing after.
        let a = plan(&p, &s(vec![]));
        let names: Vec<&str> = a.start.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["side", "i1"]);
        assert_eq!(a.start[0].kind, ContainerKind::Sidecar);
        // i1 running: wait.
        let a = plan(
            &p,
            &s(vec![ctr("side", "s", RUN, 1, 0), ctr("i1", "s", RUN, 1, 0)]),
        );
        assert!(a.start.is_empty(), "{a:?}");
        // i1 done: i2.
        let a = plan(
            &p,
            &s(vec![ctr("side", "s", RUN, 1, 0), ctr("i1", "s", OK, 1, 0)]),
        );
        assert_eq!(a.start.len(), 1);
        assert_eq!(a.start[0].name, "i2");
        // All done: the app.
        let a = plan(
            &p,
            &s(vec![
                ctr("side", "s", RUN, 1, 0),
                ctr("i1", "s", OK, 1, 0),
                ctr("i2", "s", OK, 1, 0),
            ]),
        );
        assert_eq!(a.start.len(), 1);
        assert_eq!(a.start[0].name, "app");
        // i1 failed under Always: restarted; under Never: the pod fails.
        let failed = s(vec![ctr("side", "s", RUN, 1, 0), ctr("i1", "s", ERR, 1, 0)]);
        let a = plan(&p, &failed);
        assert_eq!(a.start.len(), 1);
        assert!(!a.init_failed);
        let never = pod("Never", &[("side", true), ("i1", false)], &["app"]);
        let a = plan(&never, &failed);
        assert!(a.init_failed && a.start.is_empty(), "{a:?}");
        // The sidecar exited: restarted (whatever the pod's policy), and the sequence waits.
        let a = plan(&never, &s(vec![ctr("side", "s", OK, 1, 0)]));
        assert_eq!(starts(&a).len(), 1);
        assert_eq!(a.start[0].name, "side");
    }

    #[test]
    fn crash_backoff_waits_and_names_the_container() {
        let p = pod("Always", &[], &["c"]);
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s", true, true, 0)],
            containers: vec![ctr("c", "s", ERR, 2, 1)],
        };
        let t0 = Instant::now();
        let mut backoff = Backoff::default();
        // Restarted once already: the next exit waits 10 s from when it was seen.
        backoff.next("u/c/h-c", t0);
        let seen = HashMap::from([("c-2".to_owned(), t0)]);
        let a = compute_pod_actions(&p, &rt, &hash, &backoff, &seen, t0 + Duration::from_secs(3));
        assert!(a.start.is_empty());
        assert_eq!(a.wake, Some(t0 + Duration::from_secs(10)));
        assert_eq!(
            a.backoff[0].message,
            "back-off 10s restarting failed container=c pod=p_ns(u)"
        );
        let a = compute_pod_actions(
            &p,
            &rt,
            &hash,
            &backoff,
            &seen,
            t0 + Duration::from_secs(10),
        );
        assert_eq!(a.start.len(), 1);
        assert!(a.backoff.is_empty());
    }

    #[test]
    fn phases() {
        use AppState::*;
        use RestartPolicy::*;
        let cases: &[(RestartPolicy, bool, bool, &[AppState], PodPhase)] = &[
            (Always, false, true, &[Waiting], PodPhase::Pending),
            (Never, true, false, &[Waiting], PodPhase::Failed),
            (Always, false, false, &[Running, Waiting], PodPhase::Pending),
            (
                Always,
                false,
                false,
                &[Running, Exited { code: 1 }],
                PodPhase::Running,
            ),
            (
                Always,
                false,
                false,
                &[Exited { code: 0 }],
                PodPhase::Running,
            ),
            (
                OnFailure,
                false,
                false,
                &[Exited { code: 0 }],
                PodPhase::Succeeded,
            ),
            (
                OnFailure,
                false,
                false,
                &[Exited { code: 2 }],
                PodPhase::Running,
            ),
            (
                Never,
                false,
                false,
                &[Exited { code: 0 }, Exited { code: 0 }],
                PodPhase::Succeeded,
            ),
            (
                Never,
                false,
                false,
                &[Exited { code: 0 }, Exited { code: 137 }],
                PodPhase::Failed,
            ),
        ];
        for (policy, init_failed, init_pending, apps, want) in cases {
            assert_eq!(
                pod_phase(*policy, *init_failed, *init_pending, apps),
                *want,
                "{policy:?} {apps:?}"
            );
        }
    }

    #[test]
    fn phases_serialize_as_kubelets_strings() {
        for p in [
            PodPhase::Pending,
            PodPhase::Running,
            PodPhase::Succeeded,
            PodPhase::Failed,
            PodPhase::Terminating,
        ] {
            let json = serde_json::to_string(&p).expect("json");
            assert_eq!(json, format!("\"{}\"", p.as_str()));
            assert_eq!(serde_json::from_str::<PodPhase>(&json).expect("back"), p);
        }
    }
}
