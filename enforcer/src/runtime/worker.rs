//! Pod workers (kubelet's `pod_workers.go`): one task per pod uid, fed through its own channel,
//! in the states syncing -> terminating -> terminated. A sync reads the pod's sandboxes and
//! containers from the runtime and takes the next steps: pod cgroup, sandbox, image, init
//! containers one at a time in order, app containers, restarts with crash backoff. Termination
//! stops regular containers, then sidecars, then the sandbox, and removes everything including
//! the pod cgroup. All decisions are re-derived from the runtime's state, so a restarted
//! enforcer adopts what is running and never starts a second copy.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::{sync::mpsc, task::JoinSet, time::Instant};

use super::{
    cri::{ContainerRuntime, CriError},
    lifecycle::{self, Hook},
    podcgroup::PodCgroups,
    probe::{self, ProbeContext, ProbeType, Prober},
    source::is_valid_uid,
    spec::{self, ContainerKind, NodeFacts, PodIdent},
    status::{Condition, ContainerRecord, ContainerState, PodRecord, StatusManager, rfc3339},
    volumes,
};
use crate::{
    cgroup::CgroupError,
    cluster::events::{EventType, Involved},
    policy::{
        backoff::Backoff,
        objects::{ObjectRefs, PodObjects},
        pod_actions::{
            AppState, ContainerStart, ContainerView, PodPhase, PodRuntime, PullPolicy, Replace,
            RestartPolicy, RuntimeState, SandboxPlan, SandboxView, compute_pod_actions, pod_phase,
        },
        security::{self, ImageUser, SecurityOptions},
        volumes as volume_plan,
    },
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
    /// kubelet's `CreatePodSandboxError` for a DNS configuration that cannot be made.
    #[error("pod {uid}: Failed to create pod sandbox: {message}")]
    Dns { uid: String, message: String },
}

impl WorkerError {
    fn unavailable(&self) -> bool {
        matches!(self, Self::Cri { source, .. } if source.is_unavailable())
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
    pub cgroups: PodCgroups,
    /// `oom_score_adj` verification (and the node-level enforcement).
    pub enforce: Arc<super::enforce::Enforcer>,
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
    pub events: crate::cluster::events::Recorder,
    /// What containers' security contexts depend on (the seccomp profile root).
    pub security: SecurityOptions,
    /// Cluster mode: where API pods' ConfigMaps, Secrets and tokens are read.
    pub objects: Option<Arc<super::objects::ApiObjects>>,
    /// `clusterDNS`, `clusterDomain`, `resolvConf`: the pods' DNS.
    pub dns: crate::policy::dns::DnsSettings,
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

/// How soon a volume setup that failed is retried.
const VOLUME_RETRY: Duration = Duration::from_secs(2);

/// What a container is created with beyond its spec's literal values.
struct EnvAndMounts {
    env: Vec<cri::KeyValue>,
    command: Vec<String>,
    args: Vec<String>,
    mounts: Vec<cri::Mount>,
}

const RUNNING: i32 = cri::ContainerState::ContainerRunning as i32;
const EXITED: i32 = cri::ContainerState::ContainerExited as i32;
const CREATED: i32 = cri::ContainerState::ContainerCreated as i32;
const SANDBOX_READY: i32 = cri::PodSandboxState::SandboxReady as i32;

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
    fn for_container(&self, name: &str) -> Option<(Hook, Self)> {
        self.hooks.get(name).map(|h| (h.clone(), self.clone()))
    }
}

/// kubelet's `killContainer`: runs the container's preStop hook (bounded by the grace period;
/// a failure is reported and the stop goes on), then stops it with what is left of the grace
/// period, never less than the runtime floor. Under an override ([`PreStop::hook_grace`])
/// the hook has the pod's grace period and the stop the override.
async fn stop_container<R: ContainerRuntime>(
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
            Ok(Err(message)) => {
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

/// Whether an httpGet hook goes to the pod's address (no `host` of its own).
fn needs_pod_host(h: &Hook) -> bool {
    matches!(h, Hook::Probe(probe::Handler::Http { host: None, .. }))
}

fn ignore_not_found(r: Result<(), CriError>) -> Result<(), CriError> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

/// What a worker reports when its pod is terminated: the uid and the pod's last status (its
/// containers' terminated states, read before they were removed), `None` for an orphan.
#[derive(Debug, Clone)]
pub struct Terminated {
    pub uid: String,
    pub last: Option<PodRecord>,
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
    image_backoff: Backoff,
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
            image_backoff: Backoff::default(),
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
            image_backoff: Backoff::default(),
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
                if let Some(o) = &self.ctx.objects {
                    o.forget(&self.uid);
                }
                let _ = done.send(Terminated {
                    uid: self.uid.clone(),
                    last,
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
    async fn terminate(
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

    /// What the runtime holds of this pod: its sandboxes and containers (newest first), and
    /// the view [`compute_pod_actions`] decides from (exit codes from the cached statuses).
    async fn observe(
        &mut self,
        pod: &Pod,
        now: Instant,
    ) -> Result<(Vec<cri::PodSandbox>, Vec<cri::Container>, PodRuntime), WorkerError> {
        let rt = self.ctx.runtime.clone();
        let sandboxes = rt
            .list_pod_sandboxes(cri::PodSandboxFilter {
                label_selector: label_filter(&self.uid),
                ..Default::default()
            })
            .await
            .map_err(self.cri())?;
        let mut containers = self.pod_containers().await.map_err(self.cri())?;
        containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        self.probe_killed
            .retain(|id| containers.iter().any(|c| &c.id == id));
        let want_sandbox = spec::sandbox_hash(pod);
        let hashes: HashMap<&str, String> = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .map(|c| (c.name.as_str(), spec::container_hash(c)))
            .collect();
        let mut view = PodRuntime {
            sandboxes: sandboxes
                .iter()
                .map(|s| SandboxView {
                    id: s.id.clone(),
                    ready: s.state == SANDBOX_READY,
                    current: s.annotations.get(spec::SANDBOX_HASH_ANNOTATION)
                        == Some(&want_sandbox),
                    attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
                    created_at: s.created_at,
                })
                .collect(),
            containers: Vec::with_capacity(containers.len()),
        };
        for c in &containers {
            let state = match c.state {
                RUNNING => RuntimeState::Running,
                CREATED => RuntimeState::Created,
                EXITED => {
                    self.exit_seen.entry(c.id.clone()).or_insert(now);
                    let code = self.status_of(c).await?.exit_code;
                    RuntimeState::Exited {
                        code: self.effective_exit_code(&c.id, code),
                    }
                }
                _ => RuntimeState::Unknown,
            };
            view.containers.push(ContainerView {
                id: c.id.clone(),
                name: name_of(c).to_owned(),
                sandbox_id: c.pod_sandbox_id.clone(),
                state,
                current: c.annotations.get(spec::CONTAINER_HASH_ANNOTATION)
                    == hashes.get(name_of(c)),
                restart_count: restart_count_of(c),
                created_at: c.created_at,
            });
        }
        Ok((sandboxes, containers, view))
    }

    /// One sync: observe the runtime, plan ([`compute_pod_actions`]), execute the plan,
    /// publish the status. Returns when the worker wants to be woken next (backoff expiry).
    async fn sync(&mut self, pod: &Pod) -> Result<Option<Instant>, WorkerError> {
        let now = Instant::now();
        let rt = self.ctx.runtime.clone();
        let uid = self.uid.clone();
        let qos = spec::pod_qos(pod);
        self.waiting.clear();
        self.message.clear();
        // The pod cgroup (created and limited before the sandbox, as kubelet does), its
        // values re-written on every sync so they stay as decided.
        let values = spec::pod_cgroup_values(pod, self.ctx.cgroups.options());
        let cgroup = self
            .ctx
            .cgroups
            .ensure(&uid, qos, &values)
            .map_err(|source| WorkerError::Cgroup {
                uid: uid.clone(),
                source,
            })?;
        // The API objects the pod reads, for its volumes and environment.
        self.objects = Some(Arc::new(self.read_objects(pod).await));
        // The volumes, before the sandbox and every container (kubelet's
        // WaitForAttachAndMount): a volume that cannot be set up holds the pod in
        // ContainerCreating and is retried.
        if let Err(message) = self.setup_volumes(pod, values.memory_limit_bytes) {
            tracing::warn!(uid = %uid, error = %message, "volume setup failed");
            let (_, containers, view) = self.observe(pod, now).await?;
            let sandbox = view
                .sandboxes
                .iter()
                .find(|s| s.ready && s.current)
                .map(|s| s.id.clone())
                .unwrap_or_default();
            for c in pod
                .spec
                .iter()
                .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            {
                self.waiting.insert(
                    c.name.clone(),
                    ("ContainerCreating".to_owned(), message.clone()),
                );
            }
            self.publish(pod, qos, &cgroup, &sandbox, &containers, false)
                .await?;
            return Ok(Some(now + VOLUME_RETRY));
        }
        // Containers that failed their liveness or startup probe are killed first; the plan
        // then restarts them as their restart policy says (kubelet's computePodActions).
        self.probe_kills(pod).await?;
        let (sandboxes, containers, view) = self.observe(pod, now).await?;
        let mut actions = compute_pod_actions(
            pod,
            &view,
            &spec::container_hash,
            &self.backoff,
            &self.exit_seen,
            now,
        );
        self.gate_on_sidecar_startup(pod, &containers, &mut actions);
        for b in &actions.backoff {
            self.event(
                Some(&b.name),
                EventType::Warning,
                "BackOff",
                format!(
                    "Back-off restarting failed container {} in pod {}",
                    b.name,
                    crate::policy::security::format_pod(pod)
                ),
            );
            self.waiting.insert(
                b.name.clone(),
                ("CrashLoopBackOff".to_owned(), b.message.clone()),
            );
        }
        let log_dir = self.ctx.log_root.join(&uid);
        let log_dir_s = log_dir.display().to_string();
        let (sandbox_id, attempt) = match &actions.sandbox {
            SandboxPlan::Finished(old) => {
                self.state = PodWorkerState::Terminated;
                self.probes.clear();
                self.publish(pod, qos, &cgroup, old, &containers, false)
                    .await?;
                return Ok(None);
            }
            SandboxPlan::Keep(id) => {
                let attempt = view
                    .sandboxes
                    .iter()
                    .find(|s| &s.id == id)
                    .map_or(0, |s| s.attempt);
                (id.clone(), attempt)
            }
            SandboxPlan::Create {
                attempt,
                kill_first,
            } => {
                if *kill_first {
                    tracing::info!(uid = %uid, "sandbox changed or not ready; restarting the pod");
                    let hooks = self.pre_stop(pod).await;
                    kill_pod(&rt, &uid, spec::grace_seconds(pod), true, Some(&hooks))
                        .await
                        .map_err(self.cri())?;
                }
                std::fs::create_dir_all(&log_dir).map_err(|source| WorkerError::Io {
                    uid: uid.clone(),
                    path: log_dir.clone(),
                    source,
                })?;
                let mut config = spec::sandbox_config(pod, *attempt, &cgroup, &log_dir_s);
                config.dns_config = Some(self.pod_dns(pod)?);
                let sid = rt.run_pod_sandbox(config).await.map_err(self.cri())?;
                tracing::info!(uid = %uid, pod = %PodIdent::of(pod).name, sandbox = %sid, "sandbox started");
                if self.start_time.is_empty() {
                    self.start_time = rfc3339(super::status::now_nanos());
                }
                (sid, *attempt)
            }
        };
        if self.start_time.is_empty() {
            self.start_time = sandboxes
                .iter()
                .max_by_key(|s| s.created_at)
                .map(|s| rfc3339(s.created_at))
                .unwrap_or_default();
        }
        let sandbox_config = spec::sandbox_config(pod, attempt, &cgroup, &log_dir_s);
        for start in &actions.start {
            self.execute(pod, start, &sandbox_id, &sandbox_config, now)
                .await?;
        }
        // Status from a fresh listing.
        let mut after = self.pod_containers().await.map_err(self.cri())?;
        after.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        self.check_oom(pod, &cgroup, &sandbox_id, &after);
        self.sync_probes(pod, &sandbox_id, &after).await?;
        let phase = self
            .publish(pod, qos, &cgroup, &sandbox_id, &after, actions.init_failed)
            .await?;
        if phase.is_terminal() {
            tracing::info!(uid = %uid, %phase, "pod finished; stopping its sandbox");
            self.state = PodWorkerState::Terminated;
            self.probes.clear();
            let hooks = self.pre_stop(pod).await;
            kill_pod(&rt, &uid, spec::grace_seconds(pod), false, Some(&hooks))
                .await
                .map_err(self.cri())?;
        }
        Ok(actions.wake)
    }

    /// The pod's directory (`<log root>/<uid>`), its volumes under it.
    fn pod_dir(&self) -> Option<PathBuf> {
        is_valid_uid(&self.uid).then(|| self.ctx.log_root.join(&self.uid))
    }

    /// The sandbox's DNS configuration (kubelet's `GetPodDNS`), its warnings recorded on the
    /// pod (`MissingClusterDNS`, `DNSConfigForming`).
    fn pod_dns(&self, pod: &Pod) -> Result<cri::DnsConfig, WorkerError> {
        let settings = &self.ctx.dns;
        let host = if settings.resolv_conf.is_empty() {
            None
        } else {
            let text = std::fs::read_to_string(&settings.resolv_conf).map_err(|source| {
                WorkerError::Io {
                    uid: self.uid.clone(),
                    path: PathBuf::from(&settings.resolv_conf),
                    source,
                }
            })?;
            Some(crate::policy::dns::parse_resolv_conf(&text))
        };
        let (r, warnings) =
            crate::policy::dns::pod_dns(pod, settings, host.as_ref()).map_err(|message| {
                WorkerError::Dns {
                    uid: self.uid.clone(),
                    message,
                }
            })?;
        for (reason, message) in warnings {
            self.event(None, EventType::Warning, reason, message);
        }
        Ok(r.to_cri())
    }

    /// The managed `/etc/hosts` of the pod (`<pod dir>/etc-hosts`, rewritten at each
    /// container creation as kubelet's `makeHostsMount`) as a CRI mount, when the container
    /// gets one.
    fn hosts_mount(
        &self,
        pod: &Pod,
        c: &Container,
        pod_ips: &[String],
    ) -> Result<Option<cri::Mount>, String> {
        if !crate::policy::dns::mounts_hosts_file(c, pod_ips) {
            return Ok(None);
        }
        let dir = self
            .pod_dir()
            .ok_or_else(|| format!("invalid pod uid {:?}", self.uid))?;
        let node_hosts = if pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false)
        {
            std::fs::read_to_string("/etc/hosts").map_err(|e| format!("/etc/hosts: {e}"))?
        } else {
            String::new()
        };
        let text =
            crate::policy::dns::hosts_file(pod, pod_ips, &self.ctx.dns.cluster_domain, &node_hosts);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join("etc-hosts");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(Some(cri::Mount {
            container_path: "/etc/hosts".to_owned(),
            host_path: path.display().to_string(),
            readonly: false,
            ..Default::default()
        }))
    }

    /// Whether the pod reads API objects: it came from the API server, in cluster mode.
    fn reads_api(&self) -> bool {
        self.ctx.objects.is_some() && self.source == super::apiserver::API_SOURCE
    }

    /// The ConfigMaps, Secrets and tokens the pod names, read now (nothing, and kubelet's
    /// standalone messages, when the pod reads no API objects).
    async fn read_objects(&self, pod: &Pod) -> PodObjects {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let refs = ObjectRefs::of(pod);
        match &self.ctx.objects {
            // Every API pod reads services (its containers' service variables).
            Some(o) if self.reads_api() => o.snapshot(pod, &refs).await,
            _ => PodObjects::none(namespace),
        }
    }

    /// Sets up the pod's volumes (idempotent); the error is kubelet's mount failure message.
    /// Volumes from API objects are rewritten at every sync where their objects changed; a
    /// failure to refresh them once the pod runs is reported (`FailedMount`) and leaves
    /// their last content, the pod running on.
    fn setup_volumes(&mut self, pod: &Pod, pod_memory_limit: Option<i64>) -> Result<(), String> {
        let planned = volume_plan::plan_with(pod, self.reads_api())?;
        let from_api = planned.iter().any(|v| v.kind.from_api());
        let set_up = self
            .volumes_set_up
            .as_ref()
            .is_some_and(|(p, limit)| p == pod && *limit == pod_memory_limit);
        if set_up && !from_api {
            return Ok(());
        }
        if !planned.is_empty() {
            let dir = self
                .pod_dir()
                .ok_or_else(|| format!("invalid pod uid {:?}", self.uid))?;
            let none = PodObjects::none(pod.metadata.namespace.as_deref().unwrap_or("default"));
            let objects = self.objects.as_deref().unwrap_or(&none);
            let result = volumes::setup(
                &dir,
                pod,
                &planned,
                &self.ctx.downward.allocatable,
                pod_memory_limit,
                objects,
            )
            .map_err(|e| e.to_string());
            if let Err(message) = result {
                self.event(None, EventType::Warning, "FailedMount", message.clone());
                if set_up {
                    tracing::warn!(uid = %self.uid, error = %message, "volume refresh failed; the pod keeps their last content");
                    return Ok(());
                }
                return Err(message);
            }
        }
        self.volumes_set_up = Some((pod.clone(), pod_memory_limit));
        Ok(())
    }

    /// The container's environment, command and args expanded, and its CRI mounts (kubelet's
    /// `makeEnvironmentVariables`, `ExpandContainerCommandAndArgs`, `makeMounts`).
    fn env_and_mounts(
        &self,
        pod: &Pod,
        c: &Container,
        pod_ips: Vec<String>,
    ) -> Result<EnvAndMounts, String> {
        let hosts = self.hosts_mount(pod, c, &pod_ips)?;
        let ctx = crate::policy::env::EnvContext {
            pod_ips,
            objects: self.objects.clone(),
            ..self.ctx.downward.clone()
        };
        let env = crate::policy::env::container_env(pod, c, &ctx).map_err(|e| e.to_string())?;
        let (command, args) = crate::policy::env::expand_command_and_args(c, &env);
        let planned = volume_plan::plan_with(pod, self.reads_api())?;
        let mut mounts = Vec::new();
        if c.volume_mounts.as_ref().is_some_and(|m| !m.is_empty()) {
            let dir = self
                .pod_dir()
                .ok_or_else(|| format!("invalid pod uid {:?}", self.uid))?;
            for m in
                volume_plan::container_mounts(c, &planned, &dir, &env).map_err(|e| e.to_string())?
            {
                let host = volumes::mount_host_path(&m, &c.name).map_err(|e| e.to_string())?;
                mounts.push(m.to_cri(&host));
            }
        }
        mounts.extend(hosts);
        Ok(EnvAndMounts {
            env: env
                .into_iter()
                .map(|(key, value)| cri::KeyValue { key, value })
                .collect(),
            command,
            args,
            mounts,
        })
    }

    /// Executes one container start of the plan: deals with the earlier instance as the plan
    /// says, then creates and starts the container.
    async fn execute(
        &mut self,
        pod: &Pod,
        s: &ContainerStart,
        sandbox_id: &str,
        sandbox_config: &cri::PodSandboxConfig,
        now: Instant,
    ) -> Result<(), WorkerError> {
        let Some(def) = pod
            .spec
            .iter()
            .flat_map(|p| p.init_containers.iter().flatten().chain(&p.containers))
            .find(|c| c.name == s.name)
            .cloned()
        else {
            return Ok(());
        };
        let rt = self.ctx.runtime.clone();
        match &s.replace {
            Replace::Nothing => {}
            Replace::StartCreated(id) => match rt.start_container(id).await {
                Ok(()) => {
                    tracing::info!(uid = %self.uid, container = %s.name, id = %id, "started a container created earlier");
                    return Ok(());
                }
                Err(e) if e.is_not_found() => {
                    ignore_not_found(rt.remove_container(id).await).map_err(self.cri())?;
                }
                Err(e) => return Err(self.cri()(e)),
            },
            Replace::Remove(id) => {
                ignore_not_found(rt.remove_container(id).await).map_err(self.cri())?;
            }
            Replace::Stop(id) => {
                tracing::info!(uid = %self.uid, container = %s.name, "container definition changed; restarting it");
                let hooks = self.pre_stop(pod).await;
                ignore_not_found(
                    stop_container(
                        &*rt,
                        id,
                        &s.name,
                        spec::grace_seconds(pod),
                        hooks.for_container(&s.name),
                    )
                    .await,
                )
                .map_err(self.cri())?;
            }
            Replace::Restart { backoff_key, .. } => self.backoff.next(backoff_key, now),
        }
        self.start(
            pod,
            &def,
            s.kind,
            s.restart_count,
            sandbox_id,
            sandbox_config,
            now,
        )
        .await?;
        if let Replace::Restart { remove_older, .. } = &s.replace {
            // Keep the exited instance just replaced (last state); remove older ones.
            for old in remove_older {
                ignore_not_found(rt.remove_container(old).await).map_err(self.cri())?;
                self.statuses.remove(old);
                self.exit_seen.remove(old);
            }
        }
        Ok(())
    }

    /// Kills the containers whose liveness or startup probe failed past its threshold, with
    /// kubelet's `Killing` event and the probe's grace period when it sets one.
    async fn probe_kills(&mut self, pod: &Pod) -> Result<(), WorkerError> {
        for k in self.probes.take_kills() {
            let sidecar = pod
                .spec
                .iter()
                .flat_map(|s| s.init_containers.iter().flatten())
                .any(|c| c.name == k.name);
            let restart = sidecar || RestartPolicy::of(pod) != RestartPolicy::Never;
            let what = match k.probe {
                ProbeType::Startup => "startup",
                _ => "liveness",
            };
            // kubelet's computePodActions / computeInitContainerActions messages.
            let message = if sidecar {
                format!("Init container {} failed {what} probe", k.name)
            } else if restart {
                format!(
                    "Container {} failed {what} probe, will be restarted",
                    k.name
                )
            } else {
                format!("Container {} failed {what} probe", k.name)
            };
            // kubelet's setTerminationGracePeriod: the deletion's, else the probe's, else
            // the pod's; never below the runtime floor.
            let grace = pod
                .metadata
                .deletion_grace_period_seconds
                .or(k.grace)
                .unwrap_or_else(|| spec::grace_seconds(pod))
                .max(spec::MIN_GRACE_SECONDS);
            tracing::info!(uid = %self.uid, container = %k.name, id = %k.container_id, grace, "{message}");
            self.event(Some(&k.name), EventType::Normal, "Killing", message);
            let hooks = self.pre_stop(pod).await;
            if let Err(e) = ignore_not_found(
                stop_container(
                    &*self.ctx.runtime,
                    &k.container_id,
                    &k.name,
                    grace,
                    hooks.for_container(&k.name),
                )
                .await,
            ) {
                // Asked again at the next sync.
                self.probes.requeue(k);
                return Err(self.cri()(e));
            }
            self.probe_killed.insert(k.container_id);
        }
        Ok(())
    }

    /// The exit code the plan and the phase see: a probe kill the container answered with
    /// exit 0 (it handled SIGTERM) is still a failure, restarted under OnFailure and never
    /// a success of the pod (the status shows the real code).
    fn effective_exit_code(&self, id: &str, code: i32) -> i32 {
        if code == 0 && self.probe_killed.contains(id) {
            1
        } else {
            code
        }
    }

    /// kubelet's computeInitContainerActions: the containers after a sidecar with a startup
    /// probe are not started for the first time until that probe succeeded (a sidecar
    /// starting now has not). Restarts of containers that already ran are not held.
    fn gate_on_sidecar_startup(
        &self,
        pod: &Pod,
        containers: &[cri::Container],
        actions: &mut crate::policy::pod_actions::PodActions,
    ) {
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
                    || containers.iter().any(|x| {
                        Some(x.pod_sandbox_id.as_str()) == sandbox
                            && x.state == RUNNING
                            && name_of(x) == c.name
                            && !self.probes.started(&x.id, c)
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

    /// Where the pod's network probes go without a `host`: the pod IP; for host-network
    /// pods the node's IP; 127.0.0.1 without either (kubelet dials the empty host, local).
    async fn probe_host(&mut self, pod: &Pod, sandbox_id: &str) -> String {
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        let ips = if host_network {
            self.ctx.downward.host_ips.clone()
        } else {
            self.pod_ips(pod, sandbox_id).await
        };
        ips.into_iter()
            .next()
            .unwrap_or_else(|| "127.0.0.1".to_owned())
    }

    /// Probes exactly the running app containers and sidecars that have probes (new
    /// instances get new probes; the probes of stopped ones end).
    async fn sync_probes(
        &mut self,
        pod: &Pod,
        sandbox_id: &str,
        all: &[cri::Container],
    ) -> Result<(), WorkerError> {
        // The API refuses probes on regular init containers; a static pod may still carry
        // them: they are not run, and the log says so once.
        if !self.init_probes_reported {
            let ignored: Vec<&str> = pod
                .spec
                .iter()
                .flat_map(|s| s.init_containers.iter().flatten())
                .filter(|c| ContainerKind::of_init(c) != ContainerKind::Sidecar)
                .filter(|c| probe::has_probes(c))
                .map(|c| c.name.as_str())
                .collect();
            if !ignored.is_empty() {
                tracing::warn!(uid = %self.uid, containers = ?ignored, "probes on init containers without restartPolicy Always are not run (the API server refuses them)");
                self.init_probes_reported = true;
            }
        }
        let defs: Vec<Container> = pod
            .spec
            .iter()
            .flat_map(|s| {
                s.init_containers
                    .iter()
                    .flatten()
                    .filter(|c| ContainerKind::of_init(c) == ContainerKind::Sidecar)
                    .chain(&s.containers)
            })
            .filter(|c| probe::has_probes(c))
            .cloned()
            .collect();
        let mut targets = Vec::new();
        let mut host = None;
        for def in defs {
            let Some(c) = all.iter().find(|x| {
                x.pod_sandbox_id == sandbox_id && x.state == RUNNING && name_of(x) == def.name
            }) else {
                continue;
            };
            let started_at = self.status_of(c).await?.started_at;
            let pod_host = match &host {
                Some(h) => String::clone(h),
                None => {
                    let h = self.probe_host(pod, sandbox_id).await;
                    host = Some(h.clone());
                    h
                }
            };
            targets.push(probe::Target {
                container_id: c.id.clone(),
                container: def,
                started_at,
                pod_host,
            });
        }
        let id = PodIdent::of(pod);
        let ctx = ProbeContext {
            runtime: self.ctx.runtime.clone(),
            events: self.ctx.events.clone(),
            namespace: id.namespace,
            name: id.name,
            uid: self.uid.clone(),
        };
        self.probes.sync(&ctx, &targets);
        Ok(())
    }

    /// Verifies the `oom_score_adj` of the running containers' processes (corrects it when
    /// the runtime did not set the decided value, clamped where the node forbids it).
    fn check_oom(&mut self, pod: &Pod, cgroup: &str, sandbox_id: &str, all: &[cri::Container]) {
        let floor = spec::oom_score_adj_floor(self.ctx.node.cap_sys_resource);
        let spec_ref = pod.spec.as_ref();
        let defs = spec_ref.into_iter().flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        });
        let mut seen = HashMap::new();
        for def in defs {
            let Some(c) = all.iter().find(|x| {
                x.pod_sandbox_id == sandbox_id && x.state == RUNNING && name_of(x) == def.name
            }) else {
                continue;
            };
            let decided = spec::decided_oom_score_adj(pod, def, self.ctx.node.memory_capacity);
            let got = self.ctx.enforce.verify_oom(
                self.ctx.cgroups.kubepods(),
                cgroup,
                &c.id,
                decided,
                floor,
            );
            seen.insert(c.id.clone(), (decided, got));
        }
        self.oom = seen;
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

    /// Makes sure the image is there (pull policy), creates and starts a container.
    #[expect(
        clippy::too_many_arguments,
        reason = "the pieces of one CreateContainer"
    )]
    async fn start(
        &mut self,
        pod: &Pod,
        c: &Container,
        kind: ContainerKind,
        restart_count: u32,
        sandbox_id: &str,
        sandbox_config: &cri::PodSandboxConfig,
        now: Instant,
    ) -> Result<(), WorkerError> {
        let Some((image_ref, image)) = self.ensure_image(c, sandbox_config, now).await? else {
            return Ok(());
        };
        let rt = self.ctx.runtime.clone();
        // kubelet's getImageUser: the user the image runs as, from ImageStatus.
        let image = match image {
            Some(i) => Some(i),
            None => rt
                .image_status(c.image.as_deref().unwrap_or_default())
                .await
                .map_err(self.cri())?,
        };
        // Decided before anything is created: runAsNonRoot against the image's user, then
        // the CRI security context; a refusal leaves the container uncreated and waiting.
        let security_context = match security::decide_container_security(
            pod,
            c,
            &ImageUser::of(image.as_ref()),
            &self.ctx.security,
        ) {
            Ok(sc) => sc,
            Err(e) => {
                tracing::warn!(uid = %self.uid, container = %c.name, error = %e, "container config refused");
                self.waiting.insert(
                    c.name.clone(),
                    ("CreateContainerConfigError".to_owned(), e.to_string()),
                );
                return Ok(());
            }
        };
        // A host-network pod has the node's IPs (kubelet's `podIPs = hostIPs`); another the
        // sandbox's (`status.podIP(s)` and the managed /etc/hosts), asked once per sandbox
        // (shared with the status record).
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        let pod_ips = if host_network {
            self.ctx.downward.host_ips.clone()
        } else {
            self.pod_ips(pod, sandbox_id).await
        };
        let made = match self.env_and_mounts(pod, c, pod_ips) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(uid = %self.uid, container = %c.name, error = %e, "container config refused");
                self.waiting
                    .insert(c.name.clone(), ("CreateContainerConfigError".to_owned(), e));
                return Ok(());
            }
        };
        let dir = self.ctx.log_root.join(&self.uid).join(&c.name);
        std::fs::create_dir_all(&dir).map_err(|source| WorkerError::Io {
            uid: self.uid.clone(),
            path: dir.clone(),
            source,
        })?;
        let resources = spec::ResourceOptions {
            cgroup: *self.ctx.cgroups.options(),
            cpuset: self.ctx.enforce.cpuset(&self.uid, &c.name),
        };
        let mut config = spec::container_config_with(
            pod,
            c,
            kind,
            restart_count,
            &image_ref,
            self.ctx.node,
            &resources,
            security_context,
        );
        config.envs = made.env;
        config.command = made.command;
        config.args = made.args;
        config.mounts = made.mounts;
        if let Some(m) = self.termination_message_mount(c)? {
            config.mounts.push(m);
        }
        crate::metrics::global().container_started(kind);
        let id = rt
            .create_container(sandbox_id, config, sandbox_config.clone())
            .await
            .map_err(self.cri())?;
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Created",
            format!("Created container: {}", c.name),
        );
        if let Some(cpus) = &resources.cpuset {
            self.ctx.enforce.created_with(&id, cpus);
        }
        if let Err(e) = rt.start_container(&id).await {
            // The container is left exited; the next sync restarts it with backoff.
            tracing::warn!(uid = %self.uid, container = %c.name, error = %e, "starting container failed");
            self.event(
                Some(&c.name),
                EventType::Warning,
                "Failed",
                format!("Error: {e}"),
            );
            self.waiting.insert(
                c.name.clone(),
                ("RunContainerError".to_owned(), e.to_string()),
            );
            return Ok(());
        }
        tracing::info!(uid = %self.uid, container = %c.name, id = %id, restart_count, "container started");
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Started",
            format!("Started container {}", c.name),
        );
        self.post_start(pod, c, &id, sandbox_id).await
    }

    /// kubelet's postStart step of `startContainer`: runs the hook; when it fails, records
    /// `FailedPostStartHook`, kills the container (its preStop first) and leaves it waiting
    /// with `PostStartHookError`; the restart follows the restart policy.
    async fn post_start(
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
    async fn pre_stop(&mut self, pod: &Pod) -> PreStop {
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

    /// kubelet's `makeMounts` for `terminationMessagePath`: a new empty file (mode 0666) under
    /// `<pod dir>/containers/<name>/` for this instance, bind-mounted at the path.
    fn termination_message_mount(&self, c: &Container) -> Result<Option<cri::Mount>, WorkerError> {
        let path = c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| lifecycle::DEFAULT_MESSAGE_PATH.to_owned());
        let Some(pod_dir) = self.pod_dir() else {
            return Ok(None);
        };
        if path.is_empty() || !path.starts_with('/') {
            return Ok(None);
        }
        let io = |path: &std::path::Path| {
            let uid = self.uid.clone();
            let path = path.to_path_buf();
            move |source| WorkerError::Io { uid, path, source }
        };
        let dir = pod_dir.join("containers").join(&c.name);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let file = dir.join(format!("{:016x}", super::status::now_nanos()));
        std::fs::File::create(&file).map_err(io(&file))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666))
                .map_err(io(&file))?;
        }
        Ok(Some(cri::Mount {
            container_path: path,
            host_path: file.display().to_string(),
            ..Default::default()
        }))
    }

    /// The image reference to create from and, when it was already there, its status; `None`
    /// (with a waiting reason) when it is not there and cannot be pulled now.
    async fn ensure_image(
        &mut self,
        c: &Container,
        sandbox_config: &cri::PodSandboxConfig,
        now: Instant,
    ) -> Result<Option<(String, Option<cri::Image>)>, WorkerError> {
        let image = c.image.clone().unwrap_or_default();
        let policy = PullPolicy::of(c);
        let rt = self.ctx.runtime.clone();
        let present = rt.image_status(&image).await.map_err(self.cri())?;
        let is_present = present.is_some();
        if let Some(img) = present.filter(|_| policy != PullPolicy::Always) {
            self.event(
                Some(&c.name),
                EventType::Normal,
                "Pulled",
                format!("Container image \"{image}\" already present on machine"),
            );
            return Ok(Some((img.id.clone(), Some(img))));
        }
        if !is_present && policy == PullPolicy::Never {
            self.event(
                Some(&c.name),
                EventType::Warning,
                "ErrImageNeverPull",
                format!("Container image \"{image}\" is not present with pull policy of Never"),
            );
            self.waiting.insert(
                c.name.clone(),
                (
                    "ErrImageNeverPull".to_owned(),
                    format!("Container image \"{image}\" is not present with pull policy of Never"),
                ),
            );
            return Ok(None);
        }
        let key = format!("{}/{image}", self.uid);
        if self.image_backoff.retry_at(&key, now, now).is_some() {
            self.waiting.insert(
                c.name.clone(),
                (
                    "ImagePullBackOff".to_owned(),
                    format!("Back-off pulling image \"{image}\""),
                ),
            );
            return Ok(None);
        }
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Pulling",
            format!("Pulling image \"{image}\""),
        );
        let pulling = Instant::now();
        match rt.pull_image(&image, Some(sandbox_config.clone())).await {
            Ok(r) => {
                self.event(
                    Some(&c.name),
                    EventType::Normal,
                    "Pulled",
                    format!(
                        "Successfully pulled image \"{image}\" in {:?}",
                        pulling.elapsed()
                    ),
                );
                Ok(Some((r, None)))
            }
            Err(e) if e.is_unavailable() => Err(self.cri()(e)),
            Err(e) => {
                self.image_backoff.next(&key, now);
                tracing::warn!(uid = %self.uid, container = %c.name, image = %image, error = %e, "image pull failed");
                self.event(
                    Some(&c.name),
                    EventType::Warning,
                    "Failed",
                    format!("Failed to pull image \"{image}\": {e}"),
                );
                self.waiting
                    .insert(c.name.clone(), ("ErrImagePull".to_owned(), e.to_string()));
                Ok(None)
            }
        }
    }

    async fn record(
        &mut self,
        c: &Container,
        instances: &[&cri::Container],
    ) -> Result<(ContainerRecord, AppState), WorkerError> {
        let image = c.image.clone().unwrap_or_default();
        let Some(latest) = instances.first() else {
            let (reason, message) = self
                .waiting
                .get(&c.name)
                .cloned()
                .unwrap_or_else(|| ("ContainerCreating".to_owned(), String::new()));
            return Ok((
                ContainerRecord {
                    name: c.name.clone(),
                    container_id: String::new(),
                    image,
                    image_id: String::new(),
                    ready: false,
                    started: Some(false),
                    restart_count: 0,
                    state: ContainerState::Waiting { reason, message },
                    last_state: None,
                    oom_score_adj: None,
                    oom_score_adj_decided: None,
                },
                AppState::Waiting,
            ));
        };
        let st = self.status_of(latest).await?;
        let exit_code = self.effective_exit_code(&latest.id, st.exit_code);
        let term = |st: &cri::ContainerStatus| ContainerState::Terminated {
            exit_code: st.exit_code,
            reason: if st.reason.is_empty() {
                if st.exit_code == 0 {
                    "Completed"
                } else {
                    "Error"
                }
                .to_owned()
            } else {
                st.reason.clone()
            },
            message: st.message.clone(),
            started_at: rfc3339(st.started_at),
            finished_at: rfc3339(st.finished_at),
        };
        let last_state = match instances.get(1) {
            Some(prev) if prev.state == EXITED => Some(term(&self.status_of(prev).await?)),
            _ => None,
        };
        let (state, app, last_state) = if latest.state == RUNNING {
            (
                ContainerState::Running {
                    started_at: rfc3339(st.started_at),
                },
                AppState::Running,
                last_state,
            )
        } else if latest.state == EXITED {
            match self.waiting.get(&c.name) {
                Some((reason, message)) => (
                    ContainerState::Waiting {
                        reason: reason.clone(),
                        message: message.clone(),
                    },
                    AppState::Exited { code: exit_code },
                    Some(term(&st)),
                ),
                None => (term(&st), AppState::Exited { code: exit_code }, last_state),
            }
        } else {
            (
                ContainerState::Waiting {
                    reason: "ContainerCreating".to_owned(),
                    message: String::new(),
                },
                AppState::Waiting,
                last_state,
            )
        };
        // kubelet's prober manager: started once past the startup probe, ready once started
        // and past the readiness probe (each without its probe: as soon as running).
        let started = app == AppState::Running && self.probes.started(&latest.id, c);
        let ready = started && self.probes.ready(&latest.id, c);
        Ok((
            ContainerRecord {
                name: c.name.clone(),
                container_id: format!("containerd://{}", latest.id),
                image,
                image_id: st.image_ref.clone(),
                ready,
                started: Some(started),
                restart_count: restart_count_of(latest),
                state,
                last_state,
                oom_score_adj: self.oom.get(&latest.id).and_then(|(_, got)| *got),
                oom_score_adj_decided: self
                    .oom
                    .get(&latest.id)
                    .filter(|(decided, got)| Some(*decided) != *got)
                    .map(|(decided, _)| *decided),
            },
            app,
        ))
    }

    /// Builds and publishes the pod status; returns the phase.
    async fn publish(
        &mut self,
        pod: &Pod,
        qos: spec::Qos,
        cgroup: &str,
        sandbox_id: &str,
        all: &[cri::Container],
        init_failed: bool,
    ) -> Result<PodPhase, WorkerError> {
        let spec_ref = pod.spec.clone().unwrap_or_default();
        let in_sandbox: Vec<&cri::Container> = all
            .iter()
            .filter(|c| c.pod_sandbox_id == sandbox_id)
            .collect();
        let mut inits = Vec::new();
        let mut init_pending = false;
        let mut unready = Vec::new();
        let app_created = spec_ref
            .containers
            .iter()
            .any(|c| in_sandbox.iter().any(|x| name_of(x) == c.name));
        for c in spec_ref.init_containers.iter().flatten() {
            let inst: Vec<&cri::Container> = in_sandbox
                .iter()
                .copied()
                .filter(|x| name_of(x) == c.name)
                .collect();
            let (rec, st) = self.record(c, &inst).await?;
            let done = if ContainerKind::of_init(c) == ContainerKind::Sidecar {
                // Sidecars count towards ContainersReady (kubelet 1.29+), and are done
                // initializing once started (past their startup probe).
                if !rec.ready {
                    unready.push(c.name.clone());
                }
                st == AppState::Running && rec.started == Some(true)
            } else {
                st == AppState::Exited { code: 0 }
            };
            // kubelet's GeneratePodInitializedCondition: initialized for good once a regular
            // container started.
            init_pending |= !done && !app_created;
            inits.push(rec);
        }
        let mut apps = Vec::new();
        let mut states = Vec::new();
        for c in &spec_ref.containers {
            let inst: Vec<&cri::Container> = in_sandbox
                .iter()
                .copied()
                .filter(|x| name_of(x) == c.name)
                .collect();
            let (rec, st) = self.record(c, &inst).await?;
            if !rec.ready {
                unready.push(c.name.clone());
            }
            apps.push(rec);
            states.push(st);
        }
        let phase = pod_phase(RestartPolicy::of(pod), init_failed, init_pending, &states);
        crate::metrics::global().pod_phase(&self.uid, phase);
        let ready = phase == PodPhase::Running && unready.is_empty();
        let cond = Condition::new;
        // kubelet's GenerateContainersReadyCondition / GeneratePodReadyCondition.
        let ready_cond = |kind: &str| {
            let mut c = Condition::new(kind, ready);
            if phase == PodPhase::Succeeded {
                c.reason = "PodCompleted".to_owned();
            } else if !unready.is_empty() {
                c.reason = "ContainersNotReady".to_owned();
                c.message = format!("containers with unready status: [{}]", unready.join(" "));
            }
            if ready {
                c.reason.clear();
                c.message.clear();
            }
            c
        };
        let id = PodIdent::of(pod);
        let pod_ips = self.pod_ips(pod, sandbox_id).await;
        let record = PodRecord {
            uid: self.uid.clone(),
            name: id.name,
            namespace: id.namespace,
            source: self.source.clone(),
            phase,
            reason: String::new(),
            message: self.message.clone(),
            qos_class: qos.as_str().to_owned(),
            start_time: self.start_time.clone(),
            pod_ips,
            sandbox_id: sandbox_id.to_owned(),
            cgroup: cgroup.to_owned(),
            conditions: vec![
                cond(
                    "PodReadyToStartContainers",
                    self.state == PodWorkerState::Syncing,
                ),
                cond("Initialized", !init_pending),
                ready_cond("ContainersReady"),
                ready_cond("Ready"),
                cond("PodScheduled", true),
            ],
            init_container_statuses: inits,
            container_statuses: apps,
        };
        self.ctx.status.set(record);
        Ok(phase)
    }

    /// The sandbox's IPs (none for host-network pods); asked once per sandbox, again after
    /// a failed answer.
    async fn pod_ips(&mut self, pod: &Pod, sandbox_id: &str) -> Vec<String> {
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        if host_network || sandbox_id.is_empty() {
            return Vec::new();
        }
        if let Some((id, ips)) = &self.sandbox_ips
            && id == sandbox_id
        {
            return ips.clone();
        }
        match self.ctx.runtime.pod_sandbox_ips(sandbox_id).await {
            Ok(ips) => {
                self.sandbox_ips = Some((sandbox_id.to_owned(), ips.clone()));
                ips
            }
            Err(e) => {
                tracing::debug!(uid = %self.uid, error = %e, "sandbox status");
                Vec::new()
            }
        }
    }

    fn publish_error(&self, pod: &Pod) {
        let mut rec = self.ctx.status.get(&self.uid).unwrap_or_else(|| {
            super::records::blank_record(pod, &self.uid, &self.source, PodPhase::Pending)
        });
        rec.message = self.message.clone();
        self.ctx.status.set(rec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::{
        cgroup::CgroupLayout,
        runtime::{fake::FakeRuntime, podcgroup::PodCgroups},
    };

    struct Harness {
        fake: FakeRuntime,
        status: StatusManager,
        tx: mpsc::UnboundedSender<WorkUpdate>,
        done: mpsc::UnboundedReceiver<Terminated>,
        events: mpsc::Receiver<crate::cluster::events::EventRecord>,
        _dir: tempfile::TempDir,
    }

    impl Harness {
        /// The events recorded since the last call: (type, reason, message).
        fn events(&mut self) -> Vec<(EventType, String, String)> {
            let mut out = Vec::new();
            while let Ok(e) = self.events.try_recv() {
                out.push((e.type_, e.reason, e.message));
            }
            out
        }

        fn record(&self, uid: &str) -> PodRecord {
            self.status.get(uid).expect("status")
        }
    }

    fn condition(rec: &PodRecord, kind: &str) -> Condition {
        rec.conditions
            .iter()
            .find(|c| c.kind == kind)
            .cloned()
            .expect("condition")
    }

    fn harness(yaml: &str) -> Harness {
        let fake = FakeRuntime::with_images(&["busybox:local"]);
        let dir = tempfile::tempdir().expect("tempdir");
        let status = StatusManager::default();
        let (recorder, events) = crate::cluster::events::Recorder::channel();
        let ctx = Arc::new(WorkerContext {
            runtime: Arc::new(fake.clone()),
            cgroups: PodCgroups::new("/t", CgroupLayout::default()),
            enforce: Arc::default(),
            status: status.clone(),
            node: NodeFacts {
                memory_capacity: 1 << 30,
                cap_sys_resource: false,
            },
            log_root: dir.path().to_path_buf(),
            downward: crate::policy::env::EnvContext::default(),
            security: SecurityOptions::default(),
            resync: Duration::from_secs(60),
            events: recorder,
            objects: None,
            dns: crate::policy::dns::DnsSettings::default(),
        });
        let pod: Pod = serde_yaml_ng::from_str(yaml).expect("pod");
        let (tx, rx) = mpsc::unbounded_channel();
        let (done_tx, done) = mpsc::unbounded_channel();
        let w = PodWorker::new(ctx, Arc::new(pod), "test".to_owned());
        tokio::spawn(w.run(rx, done_tx));
        Harness {
            fake,
            status,
            tx,
            done,
            events,
            _dir: dir,
        }
    }

    fn starts(f: &FakeRuntime, name: &str) -> usize {
        f.calls()
            .iter()
            .filter(|c| *c == &format!("StartContainer {name}"))
            .count()
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    /// A pod on a pod network: `status.podIP` in two containers' env and the pod record
    /// come from one `PodSandboxStatus` (asked once per sandbox).
    #[tokio::test(start_paused = true)]
    async fn sandbox_ips_reach_env_and_status_asked_once() {
        let h = harness(
            "metadata: {name: p, uid: u9}\nspec:\n  containers:\n  - {name: a, image: 'busybox:local', env: [{name: IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]}\n  - {name: b, image: 'busybox:local', env: [{name: IPS, valueFrom: {fieldRef: {fieldPath: status.podIPs}}}]}",
        );
        settle().await;
        let ip = crate::runtime::fake::SANDBOX_IP.to_owned();
        assert_eq!(h.fake.env_of("a"), [("IP".to_owned(), ip.clone())]);
        assert_eq!(h.fake.env_of("b"), [("IPS".to_owned(), ip.clone())]);
        let _ = h.tx.send(WorkUpdate::Relist);
        settle().await;
        assert_eq!(h.status.get("u9").expect("status").pod_ips, [ip]);
        assert_eq!(h.fake.ip_asks(), 1, "{:?}", h.fake.calls());
    }

    /// A StartContainer that failed (or a CreateContainer that timed out and completed) leaves
    /// a created container: the next sync starts it, it never creates a second one.
    #[tokio::test(start_paused = true)]
    async fn a_created_container_is_started_not_created_again() {
        let h = harness(
            "metadata: {name: p, uid: u5}\nspec: {containers: [{name: c, image: 'busybox:local'}]}",
        );
        h.fake.fail_starts(1);
        settle().await;
        assert!(h.fake.running().is_empty(), "{:?}", h.fake.calls());
        let _ = h.tx.send(WorkUpdate::Relist);
        settle().await;
        assert_eq!(h.fake.running(), ["c"], "{:?}", h.fake.calls());
        let creates = h
            .fake
            .calls()
            .iter()
            .filter(|c| c.starts_with("CreateContainer"))
            .count();
        assert_eq!(creates, 1, "{:?}", h.fake.calls());
        assert_eq!(h.fake.counts().1, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn crash_backoff_on_the_paused_clock() {
        let h = harness(
            "metadata: {name: p, uid: u1}\nspec: {containers: [{name: c, image: 'busybox:local'}]}",
        );
        settle().await;
        assert_eq!(starts(&h.fake, "c"), 1);
        // First crash: restarted at once.
        assert!(h.fake.exit("c", 1, "Error"));
        let _ = h.tx.send(WorkUpdate::Relist);
        settle().await;
        assert_eq!(starts(&h.fake, "c"), 2);
        // Second crash: 10 s of CrashLoopBackOff.
        assert!(h.fake.exit("c", 1, "Error"));
        let _ = h.tx.send(WorkUpdate::Relist);
        settle().await;
        let rec = h.status.get("u1").expect("status");
        assert!(
            matches!(&rec.container_statuses[0].state, ContainerState::Waiting { reason, .. } if reason == "CrashLoopBackOff"),
            "{rec:?}"
        );
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(starts(&h.fake, "c"), 2);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(starts(&h.fake, "c"), 3);
        // Third crash: 20 s.
        assert!(h.fake.exit("c", 1, "Error"));
        let _ = h.tx.send(WorkUpdate::Relist);
        tokio::time::sleep(Duration::from_secs(19)).await;
        assert_eq!(starts(&h.fake, "c"), 3);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(starts(&h.fake, "c"), 4);
        let rec = h.status.get("u1").expect("status");
        assert_eq!(rec.container_statuses[0].restart_count, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn init_containers_one_at_a_time_then_apps() {
        let h = harness(
            "metadata: {name: p, uid: u2}\nspec:\n  initContainers: [{name: i1, image: 'busybox:local'}, {name: i2, image: 'busybox:local'}]\n  containers: [{name: app, image: 'busybox:local'}]",
        );
        settle().await;
        assert_eq!(
            (
                starts(&h.fake, "i1"),
                starts(&h.fake, "i2"),
                starts(&h.fake, "app")
            ),
            (1, 0, 0)
        );
        assert_eq!(h.status.get("u2").map(|r| r.phase), Some(PodPhase::Pending));
        h.fake.exit("i1", 0, "Completed");
        let _ = h.tx.send(WorkUpdate::Relist);
        settle().await;
        assert_eq!((starts(&h.fake, "i2"), starts(&h.fake, "app")), (1, 0));
        h.fake.exit("i2", 0, "Completed");
        let _ = h.tx.send(WorkUpdate::Relist);
        settle().await;
        assert_eq!(starts(&h.fake, "app"), 1);
        assert_eq!(h.status.get("u2").map(|r| r.phase), Some(PodPhase::Running));
    }

    #[tokio::test(start_paused = true)]
    async fn kill_stops_regular_containers_before_sidecars_then_the_sandbox() {
        let mut h = harness(
            "metadata: {name: p, uid: u3}\nspec:\n  terminationGracePeriodSeconds: 30\n  initContainers: [{name: side, image: 'busybox:local', restartPolicy: Always}]\n  containers: [{name: app, image: 'busybox:local'}]",
        );
        settle().await;
        assert_eq!(h.fake.running().len(), 2, "{:?}", h.fake.calls());
        let _ = h.tx.send(WorkUpdate::Kill { grace: Some(5) });
        let uid = tokio::time::timeout(Duration::from_secs(5), h.done.recv())
            .await
            .expect("terminated");
        assert_eq!(uid.map(|t| t.uid).as_deref(), Some("u3"));
        let calls = h.fake.calls();
        let pos = |p: &str| {
            calls
                .iter()
                .position(|c| c.starts_with(p))
                .unwrap_or(usize::MAX)
        };
        assert!(
            pos("StopContainer app 5") < pos("StopContainer side"),
            "{calls:?}"
        );
        assert!(
            pos("StopContainer side") < pos("StopPodSandbox"),
            "{calls:?}"
        );
        assert!(pos("StopPodSandbox") < pos("RemovePodSandbox"), "{calls:?}");
        assert_eq!(h.fake.counts(), (0, 0));
        assert!(h.status.get("u3").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn missing_image_never_and_pull_failure_are_clear_statuses() {
        let h = harness(
            "metadata: {name: p, uid: u4}\nspec:\n  containers:\n  - {name: never, image: 'nothere:1', imagePullPolicy: Never}\n  - {name: pull, image: 'nothere:2'}",
        );
        settle().await;
        let rec = h.status.get("u4").expect("status");
        let reason = |i: usize| match &rec.container_statuses[i].state {
            ContainerState::Waiting { reason, .. } => reason.clone(),
            other => format!("{other:?}"),
        };
        assert_eq!(reason(0), "ErrImageNeverPull");
        assert_eq!(reason(1), "ErrImagePull");
        let _ = h.tx.send(WorkUpdate::Relist);
        settle().await;
        let rec = h.status.get("u4").expect("status");
        assert!(
            matches!(&rec.container_statuses[1].state, ContainerState::Waiting { reason, .. } if reason == "ImagePullBackOff"),
            "{rec:?}"
        );
        assert_eq!(rec.phase, PodPhase::Pending);
    }

    /// runAsNonRoot against an image that names no user (root): the container is never
    /// created, and waits with kubelet's reason and message; the one that sets a non-root
    /// runAsUser starts.
    #[tokio::test(start_paused = true)]
    async fn run_as_non_root_refused_before_create() {
        let h = harness(
            "metadata: {name: p, namespace: ns, uid: u5}\nspec:\n  securityContext: {runAsNonRoot: true}\n  containers:\n  - {name: root, image: 'busybox:local'}\n  - {name: user, image: 'busybox:local', securityContext: {runAsUser: 1000}}",
        );
        settle().await;
        let rec = h.status.get("u5").expect("status");
        assert_eq!(
            rec.container_statuses[0].state,
            ContainerState::Waiting {
                reason: "CreateContainerConfigError".to_owned(),
                message: "container has runAsNonRoot and image will run as root (pod: \"p_ns(u5)\", container: root)".to_owned(),
            }
        );
        assert!(rec.container_statuses[1].ready, "{rec:?}");
        assert_eq!(starts(&h.fake, "root"), 0);
        assert_eq!(rec.phase, PodPhase::Pending);
        let creates = h
            .fake
            .calls()
            .iter()
            .filter(|c| c.starts_with("CreateContainer"))
            .count();
        assert_eq!(creates, 1, "{:?}", h.fake.calls());
    }

    #[tokio::test(start_paused = true)]
    async fn a_volume_that_cannot_be_set_up_holds_the_pod_before_the_sandbox() {
        let file = tempfile::NamedTempFile::new().expect("file");
        let path = file.path().display().to_string();
        let h = harness(&format!(
            "metadata: {{name: p, uid: u6}}\nspec:\n  volumes: [{{name: h, hostPath: {{path: '{path}', type: Directory}}}}]\n  containers:\n  - {{name: c, image: 'busybox:local', volumeMounts: [{{name: h, mountPath: /h}}]}}"
        ));
        settle().await;
        let rec = h.status.get("u6").expect("status");
        assert_eq!(
            rec.container_statuses[0].state,
            ContainerState::Waiting {
                reason: "ContainerCreating".to_owned(),
                message: format!(
                    "MountVolume.SetUp failed for volume \"h\" : hostPath type check failed: {path} is not a directory"
                ),
            }
        );
        assert_eq!(rec.phase, PodPhase::Pending);
        assert!(
            !h.fake
                .calls()
                .iter()
                .any(|c| c.starts_with("RunPodSandbox") || c.starts_with("CreateContainer")),
            "{:?}",
            h.fake.calls()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_env_or_sub_path_refusal_is_a_create_container_config_error() {
        let h = harness(
            "metadata: {name: p, uid: u7}\nspec:\n  volumes: [{name: v, emptyDir: {}}]\n  containers:\n  - {name: env, image: 'busybox:local', env: [{name: X, valueFrom: {secretKeyRef: {name: s, key: k}}}]}\n  - {name: sub, image: 'busybox:local', volumeMounts: [{name: v, mountPath: /v, subPath: /abs}]}\n  - {name: ok, image: 'busybox:local', volumeMounts: [{name: v, mountPath: /v}]}",
        );
        settle().await;
        let rec = h.status.get("u7").expect("status");
        let waiting = |i: usize| match &rec.container_statuses[i].state {
            ContainerState::Waiting { reason, message } => (reason.clone(), message.clone()),
            other => panic!("{other:?}"),
        };
        let (reason, message) = waiting(0);
        assert_eq!(reason, "CreateContainerConfigError");
        assert_eq!(
            message,
            "couldn't get secret default/s, no kubeClient defined"
        );
        assert_eq!(
            waiting(1),
            (
                "CreateContainerConfigError".to_owned(),
                "error SubPath `/abs` must not be an absolute path".to_owned()
            )
        );
        assert!(rec.container_statuses[2].ready, "{rec:?}");
        // The emptyDir is under the pod's directory.
        assert!(
            h._dir
                .path()
                .join("u7/volumes/kubernetes.io~empty-dir/v")
                .is_dir()
        );
    }
    fn has_event(
        events: &[(EventType, String, String)],
        t: EventType,
        reason: &str,
        msg: &str,
    ) -> bool {
        events
            .iter()
            .any(|(et, r, m)| *et == t && r == reason && m == msg)
    }

    fn stop_calls(f: &FakeRuntime) -> Vec<String> {
        f.calls()
            .into_iter()
            .filter(|c| c.starts_with("StopContainer"))
            .collect()
    }

    /// kubelet's killContainer: the preStop hook runs first and its time is taken from the
    /// grace period StopContainer gets.
    #[tokio::test(start_paused = true)]
    async fn pre_stop_time_is_counted_against_the_grace_period() {
        let mut h = harness(
            "metadata: {name: p, uid: ps1}\nspec:\n  terminationGracePeriodSeconds: 10\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {preStop: {sleep: {seconds: 3}}}}",
        );
        settle().await;
        assert_eq!(starts(&h.fake, "c"), 1);
        let _ = h.tx.send(WorkUpdate::Kill { grace: None });
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(stop_calls(&h.fake).is_empty(), "{:?}", h.fake.calls());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(stop_calls(&h.fake), vec!["StopContainer c 7".to_owned()]);
        let ev = h.events();
        assert!(
            !ev.iter().any(|(_, r, _)| r == "FailedPreStopHook"),
            "{ev:?}"
        );
    }

    /// An eviction's grace override (kubelet's `killContainer` with `gracePeriodOverride`):
    /// the preStop hook still has the pod's grace period, the stop then gets the override
    /// (never under the 2 s floor).
    #[tokio::test(start_paused = true)]
    async fn an_override_leaves_pre_stop_the_pods_grace_and_stops_with_the_override() {
        let h = harness(
            "metadata: {name: p, uid: ps4}\nspec:\n  terminationGracePeriodSeconds: 10\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {preStop: {sleep: {seconds: 3}}}}",
        );
        settle().await;
        let _ = h.tx.send(WorkUpdate::Kill { grace: Some(1) });
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(stop_calls(&h.fake).is_empty(), "{:?}", h.fake.calls());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(stop_calls(&h.fake), vec!["StopContainer c 2".to_owned()]);
    }

    /// A preStop that outlives the grace period is abandoned at its end; the stop gets the
    /// 2 s minimum. A failing one is an event, and the stop goes on with the grace left.
    #[tokio::test(start_paused = true)]
    async fn a_hanging_pre_stop_ends_with_the_grace_and_a_failing_one_is_reported() {
        let h = harness(
            "metadata: {name: p, uid: ps2}\nspec:\n  terminationGracePeriodSeconds: 5\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {preStop: {exec: {command: [drain]}}}}",
        );
        h.fake.set_exec("c drain", None);
        settle().await;
        let _ = h.tx.send(WorkUpdate::Kill { grace: None });
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(stop_calls(&h.fake).is_empty(), "{:?}", h.fake.calls());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(stop_calls(&h.fake), vec!["StopContainer c 2".to_owned()]);
        assert_eq!(h.fake.exec_count("c drain"), 1);

        let mut h = harness(
            "metadata: {name: p, uid: ps3}\nspec:\n  terminationGracePeriodSeconds: 5\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {preStop: {exec: {command: [drain]}}}}",
        );
        h.fake.set_exec("c drain", Some((3, "busy")));
        settle().await;
        let _ = h.tx.send(WorkUpdate::Kill { grace: None });
        settle().await;
        assert_eq!(stop_calls(&h.fake), vec!["StopContainer c 5".to_owned()]);
        let ev = h.events();
        assert!(
            has_event(
                &ev,
                EventType::Warning,
                "FailedPreStopHook",
                "Exec lifecycle hook ([drain]) for Container \"c\" in Pod \"p_default(ps3)\" failed - error: command 'drain' exited with 3: , message: \"busy\""
            ),
            "{ev:?}"
        );
    }

    /// A liveness kill runs the preStop hook first, its time taken from the probe's grace.
    #[tokio::test(start_paused = true)]
    async fn a_liveness_kill_runs_pre_stop_within_the_probe_grace() {
        let h = harness(
            "metadata: {name: p, uid: lps1}\nspec:\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {preStop: {sleep: {seconds: 2}}}, livenessProbe: {exec: {command: [check]}, periodSeconds: 10, failureThreshold: 1, terminationGracePeriodSeconds: 5}}",
        );
        h.fake.set_exec("c check", Some((1, "")));
        settle().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(stop_calls(&h.fake).is_empty(), "{:?}", h.fake.calls());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(stop_calls(&h.fake), vec!["StopContainer c 3".to_owned()]);
    }

    /// A failing postStart: `FailedPostStartHook`, the container killed (`Killing`), waiting
    /// with `PostStartHookError`, then restarted as the restart policy says (with backoff).
    #[tokio::test(start_paused = true)]
    async fn a_failing_post_start_kills_the_container_and_the_restart_follows_the_policy() {
        let mut h = harness(
            "metadata: {name: p, uid: pst1}\nspec:\n  terminationGracePeriodSeconds: 7\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {postStart: {exec: {command: [setup]}}}}",
        );
        h.fake.set_exec("c setup", Some((1, "no config")));
        settle().await;
        assert_eq!(starts(&h.fake, "c"), 1);
        assert_eq!(h.fake.exec_count("c setup"), 1);
        assert_eq!(stop_calls(&h.fake), vec!["StopContainer c 7".to_owned()]);
        let message = "Exec lifecycle hook ([setup]) for Container \"c\" in Pod \"p_default(pst1)\" failed - error: command 'setup' exited with 1: , message: \"no config\"";
        let ev = h.events();
        assert!(
            has_event(&ev, EventType::Warning, "FailedPostStartHook", message),
            "{ev:?}"
        );
        assert!(
            has_event(&ev, EventType::Normal, "Killing", "FailedPostStartHook"),
            "{ev:?}"
        );
        let rec = h.record("pst1");
        assert!(
            matches!(&rec.container_statuses[0].state, ContainerState::Waiting { reason, message: m } if reason == "PostStartHookError" && m == message),
            "{rec:?}"
        );
        // restartPolicy Always: restarted (the first restart at once), and it succeeds now.
        h.fake.set_exec("c setup", Some((0, "")));
        let _ = h.tx.send(WorkUpdate::Relist);
        settle().await;
        assert_eq!(starts(&h.fake, "c"), 2);
        assert_eq!(stop_calls(&h.fake).len(), 1);
        let rec = h.record("pst1");
        assert_eq!(rec.container_statuses[0].restart_count, 1);
        assert!(matches!(
            rec.container_statuses[0].state,
            ContainerState::Running { .. }
        ));

        // restartPolicy Never: killed and left terminated.
        let h = harness(
            "metadata: {name: p, uid: pst2}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {postStart: {exec: {command: [setup]}}}}",
        );
        h.fake.set_exec("c setup", Some((1, "")));
        settle().await;
        let _ = h.tx.send(WorkUpdate::Relist);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(starts(&h.fake, "c"), 1);
        let rec = h.record("pst2");
        assert_eq!(rec.phase, PodPhase::Failed);
        assert!(
            matches!(
                rec.container_statuses[0].state,
                ContainerState::Terminated { exit_code: 143, .. }
            ),
            "{rec:?}"
        );
    }

    /// The file bind-mounted at terminationMessagePath reaches the terminated state's
    /// message once the container exits.
    #[tokio::test(start_paused = true)]
    async fn the_termination_message_file_reaches_the_status() {
        let h = harness(
            "metadata: {name: p, uid: tm1}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: c, image: 'busybox:local', terminationMessagePath: /tmp/why}",
        );
        settle().await;
        let mounts = h.fake.mounts_of("c");
        let m = mounts
            .iter()
            .find(|m| m.container_path == "/tmp/why")
            .expect("the termination message mount");
        assert!(
            m.host_path.contains("/tm1/containers/c/"),
            "{}",
            m.host_path
        );
        std::fs::write(&m.host_path, "disk full").expect("write");
        assert!(h.fake.exit("c", 2, "Error"));
        let _ = h.tx.send(WorkUpdate::Relist);
        settle().await;
        let rec = h.record("tm1");
        assert!(
            matches!(&rec.container_statuses[0].state, ContainerState::Terminated { message, exit_code: 2, .. } if message == "disk full"),
            "{rec:?}"
        );
    }

    /// Liveness (exec) failing `failureThreshold` times in a row, one period apart: kubelet's
    /// `Unhealthy` events, then `Killing` with the probe's grace period, then the restart
    /// (restart count 1); the new instance is probed anew.
    #[tokio::test(start_paused = true)]
    async fn liveness_failures_kill_and_restart_the_container() {
        let mut h = harness(
            "metadata: {name: p, uid: l1}\nspec:\n  containers:\n  - {name: c, image: 'busybox:local', livenessProbe: {exec: {command: [check]}, periodSeconds: 10, failureThreshold: 3, terminationGracePeriodSeconds: 5}}",
        );
        h.fake.set_exec("c", Some((1, "boom")));
        settle().await;
        assert_eq!(starts(&h.fake, "c"), 1);
        assert_eq!(
            h.fake.exec_count("c"),
            1,
            "probed at once (no initial delay)"
        );
        // Two failures: below the threshold, still running.
        tokio::time::sleep(Duration::from_secs(15)).await;
        assert_eq!(h.fake.exec_count("c"), 2);
        assert_eq!(starts(&h.fake, "c"), 1);
        assert!(h.record("l1").container_statuses[0].ready);
        // The third, at 20 s: killed with the probe's grace, restarted at once.
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(
            h.fake.exec_count("c"),
            4,
            "the new instance is probed: {:?}",
            h.fake.calls()
        );
        assert!(
            h.fake.calls().contains(&"StopContainer c 5".to_owned()),
            "{:?}",
            h.fake.calls()
        );
        assert_eq!(starts(&h.fake, "c"), 2);
        let rec = h.record("l1");
        assert_eq!(rec.container_statuses[0].restart_count, 1, "{rec:?}");
        assert!(matches!(
            rec.container_statuses[0].state,
            ContainerState::Running { .. }
        ));
        let ev = h.events();
        assert!(
            has_event(
                &ev,
                EventType::Warning,
                "Unhealthy",
                "Liveness probe failed: boom"
            ),
            "{ev:?}"
        );
        assert!(
            has_event(
                &ev,
                EventType::Normal,
                "Killing",
                "Container c failed liveness probe, will be restarted"
            ),
            "{ev:?}"
        );
        // Healthy from now on: no more kills.
        h.fake.set_exec("c", Some((0, "")));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(starts(&h.fake, "c"), 2);
    }

    /// restartPolicy Never: the liveness kill says nothing of a restart, the container stays
    /// terminated and the pod fails.
    #[tokio::test(start_paused = true)]
    async fn liveness_kill_under_restart_policy_never_ends_the_pod() {
        let mut h = harness(
            "metadata: {name: p, uid: l2}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: c, image: 'busybox:local', livenessProbe: {exec: {command: [check]}, periodSeconds: 1, failureThreshold: 1}}",
        );
        h.fake.set_exec("c", Some((1, "")));
        settle().await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(starts(&h.fake, "c"), 1);
        let rec = h.record("l2");
        assert_eq!(rec.phase, PodPhase::Failed, "{rec:?}");
        let ev = h.events();
        assert!(
            has_event(
                &ev,
                EventType::Normal,
                "Killing",
                "Container c failed liveness probe"
            ),
            "{ev:?}"
        );
        assert!(
            h.fake.calls().contains(&"StopContainer c 30".to_owned()),
            "{:?}",
            h.fake.calls()
        );
    }

    /// Readiness drives the container's `ready` and the ContainersReady / Ready conditions,
    /// both ways, without restarting anything; a container without probes is ready.
    #[tokio::test(start_paused = true)]
    async fn readiness_drives_ready_and_the_pod_conditions() {
        let mut h = harness(
            "metadata: {name: p, uid: r1}\nspec:\n  containers:\n  - {name: web, image: 'busybox:local', readinessProbe: {exec: {command: [ready]}, periodSeconds: 5, successThreshold: 2, failureThreshold: 2}}\n  - {name: plain, image: 'busybox:local'}",
        );
        h.fake.set_exec("web", Some((1, "not yet")));
        settle().await;
        let rec = h.record("r1");
        assert_eq!(rec.phase, PodPhase::Running);
        assert!(!rec.container_statuses[0].ready);
        assert_eq!(rec.container_statuses[0].started, Some(true));
        assert!(rec.container_statuses[1].ready);
        let cr = condition(&rec, "ContainersReady");
        assert_eq!(
            (cr.status.as_str(), cr.reason.as_str(), cr.message.as_str()),
            (
                "False",
                "ContainersNotReady",
                "containers with unready status: [web]"
            )
        );
        assert_eq!(condition(&rec, "Ready").status, "False");
        // Two successes (successThreshold 2), 5 s apart.
        h.fake.set_exec("web", Some((0, "")));
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(
            !h.record("r1").container_statuses[0].ready,
            "one success is not enough"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        let rec = h.record("r1");
        assert!(rec.container_statuses[0].ready, "{rec:?}");
        assert_eq!(
            condition(&rec, "ContainersReady"),
            Condition::new("ContainersReady", true)
        );
        assert_eq!(condition(&rec, "Ready"), Condition::new("Ready", true));
        // Failing again (failureThreshold 2): unready, never restarted.
        h.fake.set_exec("web", Some((1, "overloaded")));
        tokio::time::sleep(Duration::from_secs(11)).await;
        let rec = h.record("r1");
        assert!(!rec.container_statuses[0].ready);
        assert_eq!(condition(&rec, "Ready").status, "False");
        assert_eq!(starts(&h.fake, "web"), 1);
        let ev = h.events();
        assert!(
            has_event(
                &ev,
                EventType::Warning,
                "Unhealthy",
                "Readiness probe failed: overloaded"
            ),
            "{ev:?}"
        );
    }

    /// The startup probe gates liveness and readiness: neither runs, the container is not
    /// started and not ready, until it succeeds; then readiness runs at once.
    #[tokio::test(start_paused = true)]
    async fn startup_probe_gates_liveness_and_readiness() {
        let mut h = harness(
            "metadata: {name: p, uid: s1}\nspec:\n  containers:\n  - name: c\n    image: 'busybox:local'\n    startupProbe: {exec: {command: [started]}, periodSeconds: 1, failureThreshold: 30}\n    livenessProbe: {exec: {command: [live]}, periodSeconds: 1}\n    readinessProbe: {exec: {command: [ready]}, periodSeconds: 10}",
        );
        h.fake.set_exec("c started", Some((1, "")));
        settle().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let rec = h.record("s1");
        assert!(h.fake.exec_count("c started") >= 5);
        assert_eq!(h.fake.exec_count("c live"), 0);
        assert_eq!(h.fake.exec_count("c ready"), 0);
        assert_eq!(rec.container_statuses[0].started, Some(false));
        assert!(!rec.container_statuses[0].ready);
        assert_eq!(condition(&rec, "Ready").status, "False");
        let ev = h.events();
        assert!(
            has_event(
                &ev,
                EventType::Warning,
                "Unhealthy",
                "Startup probe failed: "
            ),
            "{ev:?}"
        );
        // Started: readiness probes at once (not 10 s later), liveness on its period.
        h.fake.set_exec("c started", Some((0, "")));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let rec = h.record("s1");
        assert_eq!(rec.container_statuses[0].started, Some(true));
        assert!(rec.container_statuses[0].ready, "{rec:?}");
        assert_eq!(h.fake.exec_count("c ready"), 1);
        assert!(h.fake.exec_count("c live") >= 1);
        let startup_probes = h.fake.exec_count("c started");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            h.fake.exec_count("c started"),
            startup_probes,
            "no startup probe once started"
        );
        assert_eq!(starts(&h.fake, "c"), 1);
    }

    /// A startup probe failing past its threshold kills the container (kubelet's message).
    #[tokio::test(start_paused = true)]
    async fn startup_failure_kills_the_container() {
        let mut h = harness(
            "metadata: {name: p, uid: s2}\nspec:\n  containers:\n  - {name: c, image: 'busybox:local', startupProbe: {exec: {command: [started]}, initialDelaySeconds: 3, periodSeconds: 1, failureThreshold: 2}}",
        );
        h.fake.set_exec("c", Some((1, "")));
        settle().await;
        tokio::time::sleep(Duration::from_millis(2900)).await;
        assert_eq!(h.fake.exec_count("c"), 0, "initialDelaySeconds");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(starts(&h.fake, "c"), 2, "{:?}", h.fake.calls());
        let ev = h.events();
        assert!(
            has_event(
                &ev,
                EventType::Normal,
                "Killing",
                "Container c failed startup probe, will be restarted"
            ),
            "{ev:?}"
        );
    }

    /// A probe the prober cannot run (an unknown named port, no handler) is never
    /// dropped: each attempt is a Warning event saying why, its result is thrown away as
    /// kubelet does (readiness stays false, liveness never kills).
    #[tokio::test(start_paused = true)]
    async fn a_probe_that_cannot_run_is_reported_not_dropped() {
        let mut h = harness(
            "metadata: {name: p, uid: e1}\nspec:\n  containers:\n  - {name: c, image: 'busybox:local', livenessProbe: {httpGet: {port: nope}, periodSeconds: 1}, readinessProbe: {periodSeconds: 1}}",
        );
        settle().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let rec = h.record("e1");
        assert!(!rec.container_statuses[0].ready);
        assert_eq!(starts(&h.fake, "c"), 1);
        let ev = h.events();
        assert!(
            has_event(
                &ev,
                EventType::Warning,
                "Unhealthy",
                "Liveness probe errored and resulted in unknown state: port \"nope\" not found in container c"
            ),
            "{ev:?}"
        );
        assert!(
            ev.iter().any(|(t, r, m)| *t == EventType::Warning
                && r == "Unhealthy"
                && m
                    == "Readiness probe errored and resulted in unknown state: missing probe handler for container c"),
            "{ev:?}"
        );
    }

    /// An exec probe that times out (timeoutSeconds) fails with kubelet's message.
    #[tokio::test(start_paused = true)]
    async fn an_exec_probe_timeout_is_a_failure() {
        let mut h = harness(
            "metadata: {name: p, uid: t1}\nspec:\n  containers:\n  - {name: c, image: 'busybox:local', readinessProbe: {exec: {command: [sleep, '9']}, timeoutSeconds: 2, periodSeconds: 5}}",
        );
        h.fake.set_exec("c", None);
        settle().await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let ev = h.events();
        assert!(
            has_event(
                &ev,
                EventType::Warning,
                "Unhealthy",
                "Readiness probe failed: command \"sleep 9\" timed out"
            ),
            "{ev:?}"
        );
        assert!(!h.record("t1").container_statuses[0].ready);
    }

    /// restartPolicy OnFailure: a container killed for its liveness probe is restarted even
    /// when it exits 0 on SIGTERM (kubelet restarts unless the policy is Never).
    #[tokio::test(start_paused = true)]
    async fn a_liveness_kill_restarts_under_on_failure_whatever_the_exit_code() {
        let h = harness(
            "metadata: {name: p, uid: l3}\nspec:\n  restartPolicy: OnFailure\n  containers:\n  - {name: c, image: 'busybox:local', livenessProbe: {exec: {command: [check]}, periodSeconds: 1, failureThreshold: 1}}",
        );
        h.fake.set_exec("c", Some((1, "")));
        h.fake.set_stop_exit_code(0);
        settle().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(starts(&h.fake, "c"), 2, "{:?}", h.fake.calls());
        let rec = h.record("l3");
        assert_eq!(rec.phase, PodPhase::Running, "{rec:?}");
        assert_eq!(rec.container_statuses[0].restart_count, 1, "{rec:?}");
        assert!(
            !h.fake
                .calls()
                .iter()
                .any(|c| c.starts_with("StopPodSandbox")),
            "{:?}",
            h.fake.calls()
        );
    }

    /// A sidecar's readiness counts towards ContainersReady (kubelet 1.29+), and its
    /// liveness failure restarts it (sidecars always restart; kubelet's init container
    /// message).
    #[tokio::test(start_paused = true)]
    async fn sidecar_probes_count_for_ready_and_restart_it() {
        let mut h = harness(
            "metadata: {name: p, uid: sc1}\nspec:\n  restartPolicy: Never\n  initContainers:\n  - {name: side, image: 'busybox:local', restartPolicy: Always, readinessProbe: {exec: {command: [ready]}, periodSeconds: 1, failureThreshold: 1}, livenessProbe: {exec: {command: [live]}, periodSeconds: 1, failureThreshold: 2}}\n  containers:\n  - {name: app, image: 'busybox:local'}",
        );
        h.fake.set_exec("side ready", Some((1, "")));
        settle().await;
        let rec = h.record("sc1");
        assert_eq!(rec.phase, PodPhase::Running, "{rec:?}");
        let cr = condition(&rec, "ContainersReady");
        assert_eq!(
            (cr.status.as_str(), cr.message.as_str()),
            ("False", "containers with unready status: [side]"),
            "{rec:?}"
        );
        h.fake.set_exec("side ready", Some((0, "")));
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let rec = h.record("sc1");
        assert!(rec.init_container_statuses[0].ready, "{rec:?}");
        assert_eq!(condition(&rec, "Ready").status, "True", "{rec:?}");
        // Liveness fails twice: killed, restarted although the pod's policy is Never.
        h.fake.set_exec("side live", Some((1, "dead")));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(starts(&h.fake, "side"), 2, "{:?}", h.fake.calls());
        assert_eq!(starts(&h.fake, "app"), 1);
        let ev = h.events();
        assert!(
            has_event(
                &ev,
                EventType::Normal,
                "Killing",
                "Init container side failed liveness probe"
            ),
            "{ev:?}"
        );
    }

    /// A sidecar's startup probe holds the containers after it (kubelet starts the next
    /// container once the sidecar has started): Pending and not Initialized until then.
    #[tokio::test(start_paused = true)]
    async fn a_sidecar_startup_probe_holds_the_next_containers() {
        let h = harness(
            "metadata: {name: p, uid: sc2}\nspec:\n  initContainers:\n  - {name: side, image: 'busybox:local', restartPolicy: Always, startupProbe: {exec: {command: [up]}, periodSeconds: 1, failureThreshold: 100}}\n  - {name: init, image: 'busybox:local'}\n  containers:\n  - {name: app, image: 'busybox:local'}",
        );
        h.fake.set_exec("side", Some((1, "")));
        settle().await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(starts(&h.fake, "side"), 1);
        assert_eq!((starts(&h.fake, "init"), starts(&h.fake, "app")), (0, 0));
        let rec = h.record("sc2");
        assert_eq!(rec.phase, PodPhase::Pending, "{rec:?}");
        assert_eq!(condition(&rec, "Initialized").status, "False");
        assert_eq!(rec.init_container_statuses[0].started, Some(false));
        // Started: the init container runs, then the app.
        h.fake.set_exec("side", Some((0, "")));
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(starts(&h.fake, "init"), 1, "{:?}", h.fake.calls());
        h.fake.exit("init", 0, "Completed");
        let _ = h.tx.send(WorkUpdate::Relist);
        settle().await;
        assert_eq!(starts(&h.fake, "app"), 1, "{:?}", h.fake.calls());
        let rec = h.record("sc2");
        assert_eq!(rec.phase, PodPhase::Running, "{rec:?}");
        assert_eq!(condition(&rec, "Initialized").status, "True");
        assert_eq!(condition(&rec, "Ready").status, "True", "{rec:?}");
    }

    /// gRPC probes through the pod worker, on the real clock against an in-process
    /// `grpc.health.v1.Health` server (a host-network pod without node IPs is probed at
    /// 127.0.0.1): SERVING makes the container ready, NOT_SERVING unready, then its
    /// liveness failures restart it.
    #[tokio::test]
    async fn grpc_probes_drive_ready_and_restarts() {
        let (port, status, server) = probe::testing::grpc_health_server(2).await;
        let mut h = harness(&format!(
            "metadata: {{name: p, uid: g1}}\nspec:\n  hostNetwork: true\n  containers:\n  - {{name: c, image: 'busybox:local', readinessProbe: {{grpc: {{port: {port}}}, periodSeconds: 1, failureThreshold: 1}}, livenessProbe: {{grpc: {{port: {port}, service: live}}, initialDelaySeconds: 3, periodSeconds: 1, failureThreshold: 1}}}}"
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let wait = async |what: &str, f: &dyn Fn(&PodRecord) -> bool| loop {
            if h.status.get("g1").is_some_and(|r| f(&r)) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {what}: {:?}",
                h.status.get("g1")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        wait("running, unready", &|r| {
            r.phase == PodPhase::Running && !r.container_statuses[0].ready
        })
        .await;
        status.store(1, std::sync::atomic::Ordering::SeqCst);
        wait("ready on SERVING", &|r| {
            r.container_statuses[0].ready && condition(r, "Ready").status == "True"
        })
        .await;
        assert_eq!(starts(&h.fake, "c"), 1);
        // NOT_SERVING: unready at once, then (after the liveness delay) restarted.
        status.store(2, std::sync::atomic::Ordering::SeqCst);
        wait("restarted on NOT_SERVING", &|r| {
            r.container_statuses[0].restart_count >= 1
        })
        .await;
        server.abort();
        let ev = h.events();
        assert!(
            has_event(
                &ev,
                EventType::Warning,
                "Unhealthy",
                "Liveness probe failed: service unhealthy (responded with \"NOT_SERVING\")"
            ),
            "{ev:?}"
        );
        assert!(
            has_event(
                &ev,
                EventType::Normal,
                "Killing",
                "Container c failed liveness probe, will be restarted"
            ),
            "{ev:?}"
        );
    }
}
