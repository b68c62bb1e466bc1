//! Pod workers (kubelet's `pod_workers.go`): one task per pod uid, fed through its own channel,
//! in the states syncing -> terminating -> terminated. A sync reads the pod's sandboxes and
//! containers from the runtime and takes the next steps: pod cgroup, sandbox, image, init
//! containers one at a time in order, app containers, restarts with crash backoff. Termination
//! stops regular containers, then sidecars, then the sandbox, and removes everything including
//! the pod cgroup. All decisions are re-derived from the runtime's state, so a restarted
//! enforcer adopts what is running and never starts a second copy.
//!
//! The worker decides nothing itself: the plan is
//! [`crate::policy::pod_actions::compute_pod_actions`]'s, a probe kill
//! [`crate::policy::pod_actions::probe_kill`]'s, the status
//! [`crate::policy::pod_status::pod_status`]'s; it gathers their inputs and acts. This file
//! holds the worker, its loop and lifecycle; by job:
//!
//! - `sync`: one sync (observe, plan, execute, probes, publish the status);
//! - `start`: what a sandbox and a container start with (DNS, volumes, image, environment,
//!   mounts) and the start itself;
//! - `terminate`: kubelet's `killContainer` and `killPod`, the terminating state;
//! - `hooks`: postStart and preStop hooks.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use tokio::{sync::mpsc, time::Instant};

use crate::{
    cgroup::CgroupError,
    container_manager::podcgroup::PodCgroups,
    cri::{
        ContainerRuntime, CriError,
        spec::{self, ContainerKind, NodeFacts, PodIdent},
    },
    pods::{lifecycle, probe::Prober},
    policy::{backoff::Backoff, objects::PodObjects, security::SecurityOptions},
    recorder::{EventType, Involved},
    sources::is_valid_uid,
    status_manager::{PodRecord, StatusManager},
};

/// Errors of one sync or kill; the worker retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("pod {uid}: {source}")]
    Cri {
        uid: String,
        #[source]
        source: CriError,
    },
    #[error("pod {uid}: pod cgroup: {source}")]
    Cgroup {
        uid: String,
        #[source]
        source: CgroupError,
    },
    #[error("pod {uid}: {path}: {source}")]
    Io {
        uid: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The runtime could not be reached for a pull.
    #[error("pod {uid}: pulling an image: {message}")]
    Image { uid: String, message: String },
    /// kubelet's `CreatePodSandboxError` for a DNS configuration that cannot be made.
    #[error("pod {uid}: Failed to create pod sandbox: {source}")]
    Dns {
        uid: String,
        #[source]
        source: crate::policy::dns::DnsError,
    },
}

impl WorkerError {
    fn unavailable(&self) -> bool {
        matches!(self, Self::Cri { source, .. } if source.is_unavailable())
            || matches!(self, Self::Image { .. })
    }
}

/// What a pod worker is told.
#[derive(Clone, Debug)]
pub enum WorkUpdate {
    /// The pod (new or changed spec).
    Sync { pod: Arc<Pod>, source: String },
    /// Delete the pod, with an optional shorter grace period in seconds.
    Kill { grace: Option<i64> },
    /// The runtime state of the pod changed (from the relister).
    Relist,
}

/// What every worker shares.
#[derive(Debug)]
pub struct WorkerContext<R> {
    pub runtime: Arc<R>,
    /// The kernel's OOM kills by container (the eviction manager's eBPF records).
    pub link: crate::pods::NodeLink,
    pub cgroups: PodCgroups,
    /// `oom_score_adj` verification (and the node-level enforcement).
    pub enforce: Arc<crate::container_manager::Enforcer>,
    pub status: StatusManager,
    pub node: NodeFacts,
    /// Where container logs go (`<state dir>/pods`); `<log root>/<uid>/volumes` holds the
    /// pod's volumes.
    pub log_root: PathBuf,
    /// What the downward API (env and volumes) reads beyond the pod: node name, IPs, the
    /// node's allocatable.
    pub downward: crate::policy::env::EnvContext,
    /// Periodic resync when nothing else wakes the worker.
    pub resync: Duration,
    /// The pod's events (kubelet's container events).
    pub events: crate::recorder::Recorder,
    /// What containers' security contexts depend on (the seccomp profile root).
    pub security: SecurityOptions,
    /// Cluster mode: where API pods' ConfigMaps, Secrets and tokens are read.
    pub objects: Option<Arc<crate::pods::objects::ApiObjects>>,
    /// `clusterDNS`, `clusterDomain`, `resolvConf`: the pods' DNS.
    pub dns: crate::policy::dns::DnsSettings,
    /// kubelet's image manager: pull slots, the registry limiter, pull secrets, the image
    /// garbage collector.
    pub images: Arc<crate::cri::images::ImageManager>,
    /// The pods' `PodResizePending` conditions (the runtime loop's allocation decisions).
    pub resizes: crate::container_manager::allocation::ResizeBoard,
}

fn label_filter(uid: &str) -> HashMap<String, String> {
    HashMap::from([
        (spec::POD_UID_LABEL.to_owned(), uid.to_owned()),
        (spec::MANAGED_LABEL.to_owned(), "true".to_owned()),
    ])
}

fn name_of(c: &cri::Container) -> &str {
    c.labels
        .get(spec::CONTAINER_NAME_LABEL)
        .map_or("", String::as_str)
}

fn restart_count_of(c: &cri::Container) -> u32 {
    c.annotations
        .get(spec::CONTAINER_RESTART_COUNT_ANNOTATION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn kind_of(c: &cri::Container) -> ContainerKind {
    ContainerKind::parse(
        c.annotations
            .get(spec::CONTAINER_KIND_ANNOTATION)
            .map_or("", String::as_str),
    )
}

const RUNNING: i32 = cri::ContainerState::ContainerRunning as i32;
const EXITED: i32 = cri::ContainerState::ContainerExited as i32;
const CREATED: i32 = cri::ContainerState::ContainerCreated as i32;
const SANDBOX_READY: i32 = cri::PodSandboxState::SandboxReady as i32;

mod hooks;
mod resize;
mod start;
mod sync;
mod terminate;
#[cfg(test)]
mod tests;

pub use hooks::{HookFailed, PreStop};
pub use terminate::kill_pod;

/// What a worker reports when its pod is terminated: the uid and the pod's last status (its
/// containers' terminated states, read before they were removed), `None` for an orphan.
#[derive(Debug, Clone)]
pub struct Terminated {
    pub uid: String,
    pub last: Option<PodRecord>,
    /// CLOCK_MONOTONIC ns when the worker's kill had stopped and removed everything.
    pub stopped_ns: u64,
}

/// A pod worker's lifecycle (kubelet's `PodWorkerState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodWorkerState {
    /// Running the pod towards its spec.
    Syncing,
    /// Being killed with this grace period in seconds (`None`: an orphan's, read from its
    /// containers' annotation); the worker ends when everything is removed.
    Terminating { grace: Option<i64> },
    /// Ran to its end (Succeeded or Failed): containers stopped and kept, for their final
    /// status, until the pod is deleted.
    Terminated,
}

/// One pod's worker.
#[derive(Debug)]
pub struct PodWorker<R> {
    ctx: Arc<WorkerContext<R>>,
    uid: String,
    pod: Option<Arc<Pod>>,
    source: String,
    backoff: Backoff,
    image_backoff: crate::cri::images::ImageBackoff,
    /// When each exited container was first seen exited (crash backoff counts from there).
    exit_seen: HashMap<String, Instant>,
    /// Container statuses by id (refreshed when the listed state changes).
    statuses: HashMap<String, cri::ContainerStatus>,
    /// Waiting reasons found in this sync, by container name.
    waiting: HashMap<String, (String, String)>,
    /// Pod-level message of the last sync (errors).
    message: String,
    state: PodWorkerState,
    start_time: String,
    /// Container id -> (decided, actual) `oom_score_adj`, from the last check in /proc.
    oom: HashMap<String, (i64, Option<i64>)>,
    /// The sandbox's IPs, by sandbox id (asked once per sandbox).
    sandbox_ips: Option<(String, Vec<String>)>,
    /// The pod (and pod memory limit) the volumes were last set up for: setup runs again
    /// only when the spec or metadata change (kubelet's volume manager mounts once).
    volumes_set_up: Option<(Pod, Option<i64>)>,
    /// The API objects (ConfigMaps, Secrets, tokens) read for the current sync.
    objects: Option<Arc<PodObjects>>,
    /// The pod's container probes and their results (kubelet's probe manager).
    probes: Prober,
    /// Containers killed for a failed liveness or startup probe: restarted unless the
    /// restart policy is Never, whatever their exit code (kubelet's computePodActions).
    probe_killed: HashSet<String>,
    /// Whether the probes of regular init containers (which kubelet's API refuses) were
    /// reported as not run.
    init_probes_reported: bool,
    /// The kill carries a grace-period override (an eviction).
    grace_override: bool,
    /// The in-place resize's actuation.
    resize: resize::ResizeState,
}

impl<R: ContainerRuntime> PodWorker<R> {
    /// A worker for a pod from a source.
    #[must_use]
    pub fn new(ctx: Arc<WorkerContext<R>>, pod: Arc<Pod>, source: String) -> Self {
        Self {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            ctx,
            pod: Some(pod),
            source,
            backoff: Backoff::default(),
            image_backoff: crate::cri::images::ImageBackoff::default(),
            exit_seen: HashMap::new(),
            statuses: HashMap::new(),
            waiting: HashMap::new(),
            message: String::new(),
            state: PodWorkerState::Syncing,
            start_time: String::new(),
            oom: HashMap::new(),
            sandbox_ips: None,
            volumes_set_up: None,
            objects: None,
            probes: Prober::default(),
            probe_killed: HashSet::new(),
            init_probes_reported: false,
            grace_override: false,
            resize: resize::ResizeState::default(),
        }
    }

    /// A worker that only removes what the runtime still holds of an unknown pod.
    #[must_use]
    pub fn orphan(ctx: Arc<WorkerContext<R>>, uid: String) -> Self {
        Self {
            uid,
            ctx,
            pod: None,
            source: String::new(),
            backoff: Backoff::default(),
            image_backoff: crate::cri::images::ImageBackoff::default(),
            exit_seen: HashMap::new(),
            statuses: HashMap::new(),
            waiting: HashMap::new(),
            message: String::new(),
            state: PodWorkerState::Terminating { grace: None },
            start_time: String::new(),
            oom: HashMap::new(),
            sandbox_ips: None,
            volumes_set_up: None,
            objects: None,
            probes: Prober::default(),
            probe_killed: HashSet::new(),
            init_probes_reported: false,
            grace_override: false,
            resize: resize::ResizeState::default(),
        }
    }

    fn cri(&self) -> impl Fn(CriError) -> WorkerError + '_ {
        |source| WorkerError::Cri {
            uid: self.uid.clone(),
            source,
        }
    }

    /// Runs until the pod is terminated (reports its uid on `done`) or the channel closes
    /// (enforcer shutdown: the pod keeps running for the next start to adopt).
    pub async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<WorkUpdate>,
        done: mpsc::UnboundedSender<Terminated>,
    ) {
        let mut failures: u32 = 0;
        let probed = self.probes.notifier();
        crate::metrics::global().pod_seen(&self.uid);
        loop {
            if let PodWorkerState::Terminating { grace } = self.state {
                let _timer = crate::metrics::global().pod_worker("kill");
                let last = self.terminate(grace, &mut rx).await;
                let stopped_ns = crate::signal::monotonic_ns();
                if let Some(o) = &self.ctx.objects {
                    o.forget(&self.uid);
                }
                let _ = done.send(Terminated {
                    uid: self.uid.clone(),
                    last,
                    stopped_ns,
                });
                return;
            }
            let mut wake = Instant::now() + self.ctx.resync;
            if let Some(pod) = self.pod.clone()
                && self.state == PodWorkerState::Syncing
            {
                let _timer = crate::metrics::global().pod_worker("sync");
                match self.sync(&pod).await {
                    Ok(next) => {
                        failures = 0;
                        if let Some(next) = next {
                            wake = wake.min(next);
                        }
                        // A projected token is rewritten before kubelet's token manager
                        // would let it age out, whatever the sync period.
                        if let Some(at) = self
                            .ctx
                            .objects
                            .as_ref()
                            .and_then(|o| o.next_refresh(&self.uid))
                        {
                            let after = at
                                .duration_since(std::time::SystemTime::now())
                                .unwrap_or(Duration::ZERO);
                            wake = wake.min(Instant::now() + after);
                        }
                    }
                    Err(e) => {
                        failures = failures.saturating_add(1);
                        let delay = Duration::from_millis(500)
                            .saturating_mul(1 << failures.min(5))
                            .min(Duration::from_secs(10));
                        if e.unavailable() {
                            tracing::debug!(uid = %self.uid, error = %e, "runtime unavailable; retrying");
                        } else {
                            tracing::warn!(uid = %self.uid, error = %e, "pod sync failed; retrying");
                        }
                        self.message = e.to_string();
                        self.publish_error(&pod);
                        wake = Instant::now() + delay;
                    }
                }
            }
            tokio::select! {
                u = rx.recv() => {
                    let Some(u) = u else { return };
                    self.apply(u);
                    while let Ok(u) = rx.try_recv() {
                        self.apply(u);
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
                // A probe result changed, or a container failed its liveness probe.
                () = probed.notified() => {}
            }
        }
    }

    fn apply(&mut self, u: WorkUpdate) {
        match u {
            WorkUpdate::Sync { pod, source } => {
                if !matches!(self.state, PodWorkerState::Terminating { .. }) {
                    self.pod = Some(pod);
                    self.source = source;
                }
            }
            WorkUpdate::Kill { grace } => {
                self.grace_override |= grace.is_some();
                let spec_grace = self
                    .pod
                    .as_deref()
                    .map_or(spec::DEFAULT_GRACE_SECONDS, spec::grace_seconds);
                let g = grace.unwrap_or(spec_grace).max(1);
                let grace = match self.state {
                    PodWorkerState::Terminating { grace: Some(k) } => k.min(g),
                    _ => g,
                };
                self.state = PodWorkerState::Terminating { grace: Some(grace) };
            }
            WorkUpdate::Relist => {}
        }
    }

    /// The runtime's containers of this pod (by its uid label).
    async fn pod_containers(&self) -> Result<Vec<cri::Container>, CriError> {
        self.ctx
            .runtime
            .list_containers(cri::ContainerFilter {
                label_selector: label_filter(&self.uid),
                ..Default::default()
            })
            .await
    }

    /// A container's status (cached while the listed state is unchanged).
    async fn status_of(&mut self, c: &cri::Container) -> Result<cri::ContainerStatus, WorkerError> {
        if let Some(s) = self.statuses.get(&c.id)
            && s.state == c.state
        {
            return Ok(s.clone());
        }
        let s = self
            .ctx
            .runtime
            .container_status(&c.id)
            .await
            .map_err(self.cri())?;
        let mut s = s;
        if s.state == EXITED {
            // kubelet's toKubeContainerStatus: the runtime's message, then the
            // container's termination message.
            let message = lifecycle::termination_message(&s);
            if !message.is_empty() {
                if !s.message.is_empty() {
                    s.message.push_str(": ");
                }
                s.message.push_str(&message);
            }
        }
        self.statuses.insert(c.id.clone(), s.clone());
        Ok(s)
    }

    /// Records an event about the pod (or one of its containers).
    fn event(&self, container: Option<&str>, type_: EventType, reason: &str, message: String) {
        let Some(p) = &self.pod else { return };
        let involved = match container {
            Some(c) => Involved::container(p, &self.uid, c),
            None => {
                let id = PodIdent::of(p);
                Involved::pod(&id.namespace, &id.name, &self.uid, None)
            }
        };
        self.ctx.events.event(involved, type_, reason, message);
    }

    /// The pod's directory (`<log root>/<uid>`), its volumes under it.
    fn pod_dir(&self) -> Option<PathBuf> {
        is_valid_uid(&self.uid).then(|| self.ctx.log_root.join(&self.uid))
    }
}
