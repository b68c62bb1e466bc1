//! Companion mode (`enforcer run --companion`): beside an unmodified kubelet that keeps running
//! the pods, the enforcer does only what kubelet is too slow to do, with kubelet's decisions.
//!
//! - **It reads** kubelet's configuration (`--kubelet-config`), kubelet's cgroup tree (either
//!   driver), and the pods of this node: from the API server when it has one, else from the
//!   runtime's pod sandboxes (kubelet's labels) and the static pod directory
//!   ([`inventory`]). It writes no cgroup limit and runs no pod.
//! - **It acts** through the same signals and eviction manager as standalone: the manager
//!   reads the watched pods from the [`NodeLink`], and on a hard threshold the victim's pod
//!   cgroup is killed at once; this loop takes the eviction and makes it known as kubelet
//!   does ([`evicted`]: the pod's status and the `Evicted` event with an API server, the
//!   sandbox stopped through CRI without one), then tells the manager the victim's processes
//!   are gone (its cleanup wait).
//! - **It aligns the kernel's choice** with kubelet's ranking ([`oom`]): every Burstable pod's
//!   `oom_score_adj` within kubelet's range for the class, so a kernel OOM kill strikes the pod
//!   kubelet would evict.
//! - **It never fights kubelet**: a pod kubelet is terminating (deleted, terminal, its sandbox
//!   stopped) is not watched, and soft thresholds are kubelet's unless `--companion-soft`.

pub mod evicted;
pub mod inventory;
pub mod oom;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;

use crate::{
    cgroup::{CgroupLayout, PodCgroup, writer::CgroupWriter},
    config::Config,
    cri::{ContainerRuntime as _, CriRuntime},
    pods::{ActiveEntry, Evict, NodeLink},
    policy::{
        cgroup_name::{self, CgroupDriver},
        eviction::{Signal, Threshold},
        qos::pod_qos,
    },
    sources::{ManifestDir, PodOp, SourceEvent},
};
use inventory::{Member, Sandbox, Sources};

/// How long an evicted pod stays out of the watched set at most (the API or the runtime
/// normally shows it terminating well before).
const EVICTED_FOR: Duration = Duration::from_secs(120);

/// How often the companion lists the runtime and the static pod directory and aligns the
/// OOM scores (API pods arrive as the watch sends them).
pub const RELIST: Duration = Duration::from_secs(1);

/// The name of the companion's report in the state directory.
pub const REPORT_FILE: &str = "companion.json";

/// What `--companion` changes in the configuration: soft thresholds are kubelet's unless
/// `soft`; disk thresholds are kubelet's (it reclaims images and containers first, which the
/// companion never touches); the v2 tripwire (a `memory.high` write on kubepods) is off.
/// Returns the configuration and one line per change.
///
/// The HTTP port: with none given, [`crate::config::COMPANION_HTTP_ADDRESS`] (kubelet's
/// read-only port is kubelet's, kube-proxy's health port 10256 is taken on every kubeadm node);
/// one of kubelet's own ports given is refused.
pub fn adjust_config(
    mut config: Config,
    soft: bool,
) -> Result<(Config, Vec<String>), CompanionConfigError> {
    let mut changes = Vec::new();
    config.enforcer.own_metrics_only = true;
    // kubelet's file names kubelet's own ports (`port`, `readOnlyPort`): kubelet serves them.
    if config.serving.read_only_port != 0 || config.serving.port != 0 {
        changes.push(format!(
            "kubelet's ports in its file (port {}, readOnlyPort {}) are kubelet's: not served",
            config.serving.port, config.serving.read_only_port
        ));
        config.serving.read_only_port = 0;
        config.serving.port = 0;
    }
    changes.push(
        "only the enforcer's own metric families are served (kubelet serves its own)".to_owned(),
    );
    if !config.enforcer.http_address_given {
        config.enforcer.http_address = crate::config::COMPANION_HTTP_ADDRESS;
        changes.push(format!(
            "the HTTP port is {} (kubelet has 10248, 10250 and 10255, kube-proxy 10249 and \
             10256)",
            config.enforcer.http_address
        ));
    } else if crate::config::KUBELET_PORTS.contains(&config.enforcer.http_address.port()) {
        return Err(CompanionConfigError::KubeletPort {
            flag: "--http-address (enforcer.httpAddress)",
            addr: config.enforcer.http_address.to_string(),
        });
    }
    if let Some(a) = config.enforcer.secure_metrics_address
        && crate::config::KUBELET_PORTS.contains(&a.port())
    {
        return Err(CompanionConfigError::KubeletPort {
            flag: "--secure-metrics-address (enforcer.secureMetricsAddress)",
            addr: a.to_string(),
        });
    }
    let kept = |t: &Threshold| {
        let disk = !matches!(
            t.signal,
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable | Signal::PidAvailable
        );
        !(disk || (!soft && !t.is_hard()))
    };
    let (keep, left): (Vec<Threshold>, Vec<Threshold>) =
        config.eviction.thresholds.into_iter().partition(kept);
    for t in &left {
        changes.push(format!("{}<{} is left to kubelet", t.signal, t.value));
    }
    config.eviction.thresholds = keep;
    if config.enforcer.memory_tripwire {
        config.enforcer.memory_tripwire = false;
        changes.push("the memory.high tripwire is off (no cgroup limit is written)".to_owned());
    }
    Ok((config, changes))
}

/// A configuration the companion cannot run with.
#[derive(Debug, thiserror::Error)]
pub enum CompanionConfigError {
    #[error(
        "{flag} {addr}: that port is kubelet's (10248 healthz, 10250 secure, 10255 read-only); \
         the companion runs beside kubelet and never binds its ports: give another (the HTTP \
         port's default is {})",
        crate::config::COMPANION_HTTP_ADDRESS
    )]
    KubeletPort { flag: &'static str, addr: String },
}

/// What the companion loop needs.
#[derive(Debug)]
pub struct Companion {
    pub node_name: String,
    pub cgroup_root: String,
    pub driver: CgroupDriver,
    pub layout: CgroupLayout,
    pub cri: Arc<CriRuntime>,
    /// The API server (pods watched, evicted pods' status written).
    pub kubeconfig: Option<PathBuf>,
    /// kubelet's static pod directory.
    pub static_dir: PathBuf,
    pub state_dir: PathBuf,
    pub link: NodeLink,
    /// Through which a pod cgroup is killed (an eviction the manager did not kill first).
    pub cgroups: Arc<dyn CgroupWriter>,
    /// How often the runtime and the static directory are listed and the OOM scores aligned.
    pub relist: Duration,
    /// Align the pods' `oom_score_adj` with kubelet's ranking.
    pub align_oom: bool,
    /// Where an unreachable API server is reported (`/readyz`).
    pub health: Option<Arc<crate::health::Health>>,
}

/// An eviction taken: the victim stays out of the watched set until it is gone.
#[derive(Debug)]
struct Evicting {
    cgroup: String,
    since: Instant,
    released: bool,
    /// The eviction's answer, sent once the victim's processes are gone.
    completed: Option<crate::pods::KillCompletion>,
}

impl Companion {
    /// The pod cgroup of `uid` in QoS class `qos`, as kubelet names it for the driver.
    fn pod_cgroup(&self, uid: &str, qos: crate::policy::qos::QosClass) -> Option<String> {
        match cgroup_name::pod(&self.cgroup_root, qos, uid) {
            Ok(name) => Some(self.driver.name(&name)),
            Err(e) => {
                tracing::warn!(%uid, error = %e, "a pod uid kubelet could not have named a cgroup after; not watched");
                None
            }
        }
    }

    /// For a runtime-only pod: the tier its pod cgroup is in, and that cgroup's memory limit.
    fn tier_of(&self, uid: &str) -> Option<(crate::policy::qos::QosClass, Option<i64>)> {
        use crate::policy::qos::QosClass::{BestEffort, Burstable, Guaranteed};
        [Guaranteed, Burstable, BestEffort]
            .into_iter()
            .find_map(|q| {
                let pod = PodCgroup::resolve(&self.layout, &self.pod_cgroup(uid, q)?)?;
                pod.exists().then(|| (q, pod.limit()))
            })
    }

    /// The runtime's pod sandboxes with kubelet's labels, their containers' names.
    async fn list_runtime(&self) -> Result<Vec<Sandbox>, crate::cri::CriError> {
        let sandboxes = self
            .cri
            .list_pod_sandboxes(k8s_cri::v1::PodSandboxFilter::default())
            .await?;
        let containers = self
            .cri
            .list_containers(k8s_cri::v1::ContainerFilter::default())
            .await?;
        let mut out: Vec<Sandbox> = sandboxes.iter().filter_map(Sandbox::from_cri).collect();
        for c in &containers {
            if let (Some(sb), Some(m)) = (
                out.iter_mut().find(|s| s.id == c.pod_sandbox_id),
                c.metadata.as_ref(),
            ) && !sb.containers.contains(&m.name)
            {
                sb.containers.push(m.name.clone());
            }
        }
        Ok(out)
    }

    /// Lists the runtime's pods into `sandboxes`; a runtime that does not answer (its socket
    /// not mounted, containerd down) keeps the last list and makes the companion not ready,
    /// named in `/readyz`, until it answers again.
    async fn relist_runtime(&self, sandboxes: &mut Vec<Sandbox>, failing: &mut bool) {
        match self.list_runtime().await {
            Ok(s) => {
                if *failing {
                    tracing::info!("the container runtime answers again");
                }
                *failing = false;
                *sandboxes = s;
                self.not_ready("runtime", None);
            }
            Err(e) => {
                if !*failing {
                    tracing::warn!(error = %e, "listing the runtime's pod sandboxes; keeping the last list");
                }
                *failing = true;
                self.not_ready(
                    "runtime",
                    Some(format!(
                        "the container runtime does not answer ({e}); is its socket mounted?"
                    )),
                );
            }
        }
    }

    /// Reports `check` not ready for `why` in `/readyz` (`None`: ready again).
    fn not_ready(&self, check: &'static str, why: Option<String>) {
        if let Some(h) = &self.health {
            h.set_not_ready(check, why);
        }
    }

    /// Publishes the watched pods to the eviction manager (the [`NodeLink`]'s active set).
    fn publish(&self, members: &BTreeMap<String, Member>, evicting: &BTreeMap<String, Evicting>) {
        let now = self.link.active();
        for uid in now.keys() {
            if !members.contains_key(uid) || evicting.contains_key(uid) {
                self.link.remove_active(uid);
            }
        }
        for (uid, m) in members {
            if evicting.contains_key(uid) {
                continue;
            }
            let qos = m.tier.unwrap_or_else(|| pod_qos(&m.pod));
            let Some(cgroup) = self.pod_cgroup(uid, qos) else {
                continue;
            };
            let same = now.get(uid).is_some_and(|e| {
                Arc::ptr_eq(&e.pod, &m.pod) || (e.cgroup == cgroup && *e.pod == *m.pod)
            });
            if !same {
                self.link
                    .set_active(uid, ActiveEntry::new(m.pod.clone(), cgroup));
            }
        }
    }

    /// Takes the manager's evictions: the pod leaves the watched set, its cgroup is killed
    /// when the manager did not (a threshold other than memory), and the eviction is made
    /// known (`report`).
    fn take_evictions(
        &self,
        evicting: &mut BTreeMap<String, Evicting>,
        members: &BTreeMap<String, Member>,
        report: &dyn Fn(&Evict, &Pod, Option<&str>),
    ) {
        let active = self.link.active();
        for mut e in self.link.take_evictions() {
            let Some(entry) = active.get(&e.uid) else {
                tracing::debug!(uid = %e.uid, "eviction of a pod no longer watched");
                continue;
            };
            self.link.remove_active(&e.uid);
            if e.sigkill_ns.is_none() {
                let killed = crate::cgroup::kill::kill_pod_cgroup(
                    self.cgroups.as_ref(),
                    &self.layout,
                    &entry.cgroup,
                );
                tracing::warn!(uid = %e.uid, killed, "eviction: SIGKILL sent to the pod's processes");
            }
            let sandbox = members.get(&e.uid).and_then(|m| m.sandbox.as_deref());
            report(&e, &entry.pod, sandbox);
            evicting.insert(
                e.uid.clone(),
                Evicting {
                    cgroup: entry.cgroup.clone(),
                    since: Instant::now(),
                    released: false,
                    completed: e.completed.take(),
                },
            );
        }
    }

    /// The victims whose processes are all gone are released (the manager's cleanup wait
    /// ends); the ones no source lists any more, or evicted long enough ago, are forgotten.
    fn check_released(
        &self,
        evicting: &mut BTreeMap<String, Evicting>,
        members: &BTreeMap<String, Member>,
    ) {
        for (uid, ev) in evicting.iter_mut() {
            if ev.released {
                continue;
            }
            let gone = PodCgroup::resolve(&self.layout, &ev.cgroup).is_none_or(|p| !p.populated());
            if gone {
                ev.released = true;
                if let Some(c) = ev.completed.take() {
                    c.complete(crate::pods::KillDone { stopped_ns: None });
                }
                tracing::info!(%uid, after_ms = ev.since.elapsed().as_millis(), "evicted pod's processes are gone");
            }
        }
        evicting.retain(|uid, ev| {
            !(ev.released && (!members.contains_key(uid) || ev.since.elapsed() > EVICTED_FOR))
        });
    }

    /// Runs until `stop` resolves. `report_to_api` writes an evicted pod's status (cluster
    /// mode); without it the victim's sandbox is stopped through CRI.
    pub async fn run(
        self,
        report_to_api: Option<tokio::sync::mpsc::UnboundedSender<evicted::Report>>,
        stop: impl std::future::Future<Output = ()>,
    ) {
        if !self.layout.memory_mounted() {
            self.not_ready(
                "cgroup",
                Some("no memory cgroup controller is mounted: the companion sees no pod's memory (mount the host's /sys/fs/cgroup)".to_owned()),
            );
        }
        let mut api_rx = self.kubeconfig.clone().map(|k| {
            crate::sources::apiserver::spawn(k, self.node_name.clone(), self.health.clone(), None)
        });
        let mut api_pods: Option<BTreeMap<String, Arc<Pod>>> =
            self.kubeconfig.as_ref().map(|_| BTreeMap::new());
        let mut dir = Some(ManifestDir::new(&self.static_dir, &self.node_name));
        let mut statics: Vec<Arc<Pod>> = Vec::new();
        let mut sandboxes: Vec<Sandbox> = Vec::new();
        let mut members: BTreeMap<String, Member> = BTreeMap::new();
        let mut evicting: BTreeMap<String, Evicting> = BTreeMap::new();
        let mut tick = tokio::time::interval(self.relist);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut runtime_failing = false;
        let mut aligner = Aligner::load(&self.state_dir);
        let mut aligned_at: Option<Instant> = None;
        let kubepods = self.driver.name(&cgroup_name::kubepods(&self.cgroup_root));
        let report = |e: &Evict, pod: &Pod, sandbox: Option<&str>| {
            report_eviction(report_to_api.as_ref(), &self.cri, e, pod, sandbox);
        };
        tokio::pin!(stop);
        loop {
            let api_event = async {
                match api_rx.as_mut() {
                    Some((rx, _)) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut stop => break,
                () = self.link.evictions_pending() => {
                    self.take_evictions(&mut evicting, &members, &report);
                    continue;
                }
                ev = api_event => {
                    let Some(ev) = ev else {
                        tracing::warn!("the API-server pod source stopped");
                        api_rx = None;
                        continue;
                    };
                    if let (SourceEvent::Pod(u), Some(pods)) = (ev, api_pods.as_mut()) {
                        let uid = u.pod.metadata.uid.clone().unwrap_or_default();
                        match u.op {
                            PodOp::Add | PodOp::Update => { pods.insert(uid, u.pod); }
                            PodOp::Delete => { pods.remove(&uid); }
                        }
                    }
                }
                _ = tick.tick() => {
                    self.relist_runtime(&mut sandboxes, &mut runtime_failing).await;
                    rescan_statics(&mut dir, &mut statics).await;
                }
            }
            members = inventory::members(
                Sources {
                    api: api_pods.as_ref(),
                    sandboxes: &sandboxes,
                    statics: &statics,
                },
                &|uid| self.tier_of(uid),
            );
            self.check_released(&mut evicting, &members);
            self.publish(&members, &evicting);
            if self.align_oom && aligned_at.is_none_or(|t| t.elapsed() >= self.relist) {
                aligned_at = Some(Instant::now());
                aligner = self.align(aligner, &kubepods).await;
            }
        }
        if self.align_oom {
            self.restore_oom_scores(aligner).await;
        }
    }

    /// One alignment of the watched pods' `oom_score_adj` with kubelet's ranking, off the
    /// async threads; its report in `companion.json`, kubelet's values kept.
    async fn align(&self, mut aligner: Aligner, kubepods: &str) -> Aligner {
        let layout = self.layout.clone();
        let kubepods = kubepods.to_owned();
        let active = self.link.active();
        let before = aligner.originals.clone();
        let Ok((r, originals)) = tokio::task::spawn_blocking(move || {
            let mut originals = before;
            let r = oom::align_once(&layout, &kubepods, &active, &mut originals);
            (r, originals)
        })
        .await
        else {
            return aligner;
        };
        if r.inversions != aligner.last_inversions {
            if r.inversions.is_empty() {
                tracing::info!("the kernel's OOM choice follows kubelet's ranking again");
            } else {
                tracing::warn!(inversions = ?r.inversions, kernel_first = ?r.kernel_first, "the kernel's OOM choice differs from kubelet's ranking beyond what oom_score_adj can fix");
            }
            aligner.last_inversions.clone_from(&r.inversions);
        }
        if !r.failed.is_empty() {
            tracing::warn!(failed = ?r.failed, "oom_score_adj could not be written");
        }
        write_report(&self.state_dir, &r);
        if originals != aligner.originals {
            if let Err(e) = originals.save(&self.state_dir) {
                tracing::warn!(error = %e, "keeping kubelet's oom_score_adj values");
            }
            aligner.originals = originals;
        }
        aligner
    }

    /// At stop: kubelet's `oom_score_adj` back on every process the companion re-scored, so
    /// the node without the companion is as kubelet left it; the record goes once all are
    /// written.
    async fn restore_oom_scores(&self, aligner: Aligner) {
        if aligner.originals.is_empty() {
            return;
        }
        let layout = self.layout.clone();
        let state_dir = self.state_dir.clone();
        let done = tokio::task::spawn_blocking(move || {
            restore_recorded(&layout, &state_dir, &aligner.originals)
        })
        .await;
        match done {
            Ok(Ok(r)) => {
                tracing::info!(
                    processes = r.processes,
                    "kubelet's oom_score_adj values restored"
                )
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "restoring kubelet's oom_score_adj values"),
            Err(e) => tracing::warn!(error = %e, "restoring kubelet's oom_score_adj values"),
        }
    }
}

/// The alignment's state across rounds: kubelet's values kept, the last inversions logged.
#[derive(Debug, Default)]
struct Aligner {
    originals: oom::Originals,
    last_inversions: Vec<(String, String)>,
}

impl Aligner {
    /// kubelet's values as a previous run of the companion kept them in `state_dir`.
    fn load(state_dir: &Path) -> Self {
        let originals = oom::Originals::load(state_dir).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "kubelet's oom_score_adj values from an earlier run are lost; starting a new record");
            oom::Originals::default()
        });
        Self {
            originals,
            last_inversions: Vec::new(),
        }
    }
}

/// Restores kubelet's recorded values ([`oom::restore`]) and removes the record when every
/// process took its value.
///
/// # Errors
/// A process's value could not be written (the record is kept), or the record not removed.
pub fn restore_recorded(
    layout: &CgroupLayout,
    state_dir: &Path,
    originals: &oom::Originals,
) -> Result<oom::Restored, RestoreError> {
    let r = oom::restore(layout, originals);
    if !r.failed.is_empty() {
        return Err(RestoreError::Failed(r.failed));
    }
    oom::Originals::default().save(state_dir)?;
    Ok(r)
}

/// kubelet's `oom_score_adj` values could not all be restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("oom_score_adj could not be written for {0:?}; the record is kept for another try")]
    Failed(Vec<String>),
    #[error(transparent)]
    Record(#[from] oom::OriginalsError),
}

/// An eviction made known: its status written to the API server (cluster mode), else the
/// victim's sandbox stopped through CRI (kubelet then reports it).
fn report_eviction(
    report_to_api: Option<&tokio::sync::mpsc::UnboundedSender<evicted::Report>>,
    cri: &Arc<CriRuntime>,
    e: &Evict,
    pod: &Pod,
    sandbox: Option<&str>,
) {
    let meta = &pod.metadata;
    if let Some(tx) = report_to_api {
        let _ = tx.send(evicted::Report {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: e.uid.clone(),
            message: e.message.clone(),
            disruption_target: e.disruption_target,
        });
        return;
    }
    let Some(id) = sandbox.map(str::to_owned) else {
        return;
    };
    let cri = cri.clone();
    let uid = e.uid.clone();
    tokio::spawn(async move {
        match cri.stop_pod_sandbox(&id).await {
            Ok(()) => {
                tracing::info!(%uid, sandbox = %id, "evicted pod's sandbox stopped; kubelet reports it")
            }
            Err(e) => {
                tracing::warn!(%uid, sandbox = %id, error = %e, "stopping the evicted pod's sandbox")
            }
        }
    });
}

/// kubelet's static pod directory read again (off the async threads) into `statics`; a
/// scan that did not come back leaves the directory unread from then on.
async fn rescan_statics(dir: &mut Option<ManifestDir>, statics: &mut Vec<Arc<Pod>>) {
    let Some(mut d) = dir.take() else {
        return;
    };
    let (d, pods) = tokio::task::spawn_blocking(move || {
        let events = d.scan();
        (d, events)
    })
    .await
    .map_or_else(|_| (None, Vec::new()), |(d, e)| (Some(d), e));
    *dir = d;
    for ev in pods {
        if let SourceEvent::Pod(u) = ev {
            let uid = u.pod.metadata.uid.clone();
            statics.retain(|p| p.metadata.uid != uid);
            if u.op != PodOp::Delete {
                statics.push(u.pod);
            }
        }
    }
}

/// `companion.json` in the state directory: the last alignment.
fn write_report(state_dir: &Path, r: &oom::AlignReport) {
    let path = state_dir.join(REPORT_FILE);
    if let Ok(bytes) = serde_json::to_vec_pretty(r)
        && let Err(e) = crate::status_manager::write_atomic(&path, &bytes)
    {
        tracing::debug!(path = %path.display(), error = %e, "writing the companion report");
    }
}

/// The API-server writers of companion mode: the evicted pods' status, and the events (no
/// Node, no Lease, no mirror pod, no other pod status: those are kubelet's). Both keep what
/// the API server has not taken in outboxes under `state_dir` and send it after a restart.
/// Runs until `stop`.
pub async fn run_api_writers(
    config: &Config,
    kubeconfig: PathBuf,
    state_dir: PathBuf,
    mut reports: tokio::sync::mpsc::UnboundedReceiver<evicted::Report>,
    events: crate::cluster::EventQueue,
    stop: impl std::future::Future<Output = ()>,
) {
    use crate::cluster::{KubeApi, limiter};
    tokio::pin!(stop);
    let client = loop {
        match crate::sources::apiserver::client_from_kubeconfig(&kubeconfig).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::error!(error = %e, "the companion's API writers cannot start; retrying in 10 s");
                tokio::select! {
                    () = &mut stop => return,
                    () = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
            }
        }
    };
    let api = Arc::new(limiter::Limited::new(
        KubeApi::new(client),
        Arc::new(limiter::Limiter::new(
            config.kube_api_qps,
            config.kube_api_burst,
        )),
    ));
    let outbox = |file: &str| crate::status_manager::outbox::Outbox::at(state_dir.join(file));
    let writer = tokio::spawn(crate::cluster::events::run(
        api.clone(),
        events.rx,
        config.node_name(),
        config.event_record_qps,
        config.event_burst,
        Some(outbox(crate::cluster::events::OUTBOX_FILE)),
    ));
    let mut evictions = outbox(evicted::OUTBOX_FILE);
    // Kept until written: the last run's first, each new one before it is sent.
    let mut pending: Vec<evicted::Report> = evictions.load();
    let mut tasks = tokio::task::JoinSet::new();
    let write = |tasks: &mut tokio::task::JoinSet<_>, r: evicted::Report, after: Duration| {
        let api = api.clone();
        tasks.spawn(async move {
            tokio::time::sleep(after).await;
            let written = evicted::write_status(api.as_ref(), &r).await;
            (r, written)
        });
    };
    for r in &pending {
        write(&mut tasks, r.clone(), Duration::ZERO);
    }
    loop {
        tokio::select! {
            () = &mut stop => break,
            r = reports.recv() => {
                let Some(r) = r else { break };
                pending.retain(|p| p.uid != r.uid);
                pending.push(r.clone());
                evictions.keep(&pending);
                write(&mut tasks, r, Duration::ZERO);
            }
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                let Ok((r, written)) = done else { continue };
                let pod = format!("{}/{}", r.namespace, r.name);
                match written {
                    Ok(true) => tracing::info!(%pod, uid = %r.uid, "evicted pod's status written (Failed, Evicted)"),
                    Ok(false) => tracing::info!(%pod, uid = %r.uid, "evicted pod already settled in the API"),
                    Err(e) => {
                        tracing::warn!(%pod, uid = %r.uid, error = %e, "writing the evicted pod's status failed; kept, tried again in {:?}", evicted::RETRY_AFTER_FAILURE);
                        write(&mut tasks, r, evicted::RETRY_AFTER_FAILURE);
                        continue;
                    }
                }
                pending.retain(|p| p != &r);
                evictions.keep(&pending);
            }
        }
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    writer.abort();
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigArgs, KUBELET_PORTS, load};

    fn companion(http: Option<&str>) -> Result<(Config, Vec<String>), CompanionConfigError> {
        let args = ConfigArgs {
            http_address: http.map(str::to_owned),
            ..ConfigArgs::default()
        };
        adjust_config(load(&args).expect("config").config, false)
    }

    #[test]
    fn the_companion_port_is_clear_of_kubelet_and_kube_proxy_and_never_kubelets() {
        // None given: off kubelet's read-only port and kube-proxy's 10256.
        let (c, changes) = companion(None).expect("default");
        assert_eq!(c.enforcer.http_address.to_string(), "127.0.0.1:10266");
        assert!(changes.iter().any(|c| c.contains("10266")), "{changes:?}");
        for taken in [
            10248, 10249, 10250, 10255, 10256, 10257, 10259, 2379, 2380, 2381,
        ] {
            assert_ne!(c.enforcer.http_address.port(), taken);
        }
        // Given: kept, unless it is one of kubelet's own.
        let (c, _) = companion(Some("0.0.0.0:9901")).expect("given");
        assert_eq!(c.enforcer.http_address.to_string(), "0.0.0.0:9901");
        for port in KUBELET_PORTS {
            let e = companion(Some(&format!("127.0.0.1:{port}")))
                .expect_err("kubelet's port")
                .to_string();
            assert!(
                e.contains(&format!("127.0.0.1:{port}")) && e.contains("kubelet"),
                "{e}"
            );
        }
        // kubelet's own ports in its file are never served by the companion.
        let (c, _) = companion(None).expect("default");
        assert_eq!((c.serving.port, c.serving.read_only_port), (0, 0));
        assert!(c.enforcer.own_metrics_only);
        // Standalone keeps kubelet's read-only port (it is the node's kubelet there).
        let standalone = load(&ConfigArgs::default()).expect("config").config;
        assert_eq!(
            standalone.enforcer.http_address.to_string(),
            crate::config::DEFAULT_HTTP_ADDRESS
        );
    }
}
