//! The daemon's main loop (`enforcer run`): probe the kernel, start the signal pipeline, run
//! pods through their workers, and run the eviction manager on every relevant signal (and on
//! a housekeeping tick as a safety net), acting through the pod workers.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    cgroup::{CgroupLayout, CgroupVersion, join_inside},
    config::{Config, SignalSource},
    health::Health,
    kernel::{self, Capabilities, PipelineOptions, SourceChoice, Watch},
    node::{self, NodeObserver},
    policy::{
        admission::{self, SecurityPolicy},
        eviction::{
            ActivePod, NodeCondition, Signal as EvictionSignal, State,
            manager::{Cleanup, CleanupWait, next_deadline},
            step,
        },
    },
    quantity::{Format, Quantity},
    runtime::{
        self, Admission, CriRuntime, Evict, NodeLink, RunPodsOptions, StatusManager,
        status::{Condition as StatusCondition, NodeRecord, PodRecord},
    },
    server,
    signal::{Signal, SignalKind, SourceKind},
};

/// What `enforcer run` starts with.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    pub config: Config,
    /// Extra memory cgroups the fallback sources watch (the kubepods cgroup always is).
    pub watches: Vec<PathBuf>,
    /// Run pods (off: signals and eviction decisions only, e.g. beside a kubelet).
    pub run_pods: bool,
    /// Treat manifest pods as kubelet static pods (critical: never evicted).
    pub static_pods: bool,
    /// Watch the API server for this node's pods too (kubeconfig file).
    pub kubeconfig: Option<PathBuf>,
}

/// Errors that stop the daemon at start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Kernel(#[from] kernel::KernelError),
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::CgroupError),
    #[error(transparent)]
    Node(#[from] node::NodeError),
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    #[error(transparent)]
    Enforce(#[from] runtime::enforce::EnforceError),
    #[error("HTTP server on {addr}: {source}")]
    Http {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The node's capacity: the configured override, else this machine's.
fn capacity(config: &Config) -> BTreeMap<String, Quantity> {
    let mut cap = BTreeMap::new();
    let machine_memory = node::machine_memory().unwrap_or(0);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    cap.insert(
        "memory".to_owned(),
        Quantity::from_int(machine_memory, Format::BinarySI),
    );
    cap.insert(
        "cpu".to_owned(),
        Quantity::from_int(i64::try_from(cpus).unwrap_or(1), Format::DecimalSI),
    );
    if let Ok((_, bytes, _, _)) =
        node::statvfs(&config.enforcer.state_dir).or_else(|_| node::statvfs(Path::new("/")))
    {
        cap.insert(
            "ephemeral-storage".to_owned(),
            Quantity::from_int(bytes, Format::BinarySI),
        );
    }
    cap.insert("pods".to_owned(), admission::pods_quantity(config.max_pods));
    for (k, v) in &config.enforcer.node_capacity {
        cap.insert(k.clone(), *v);
    }
    cap
}

fn source_choice(s: SignalSource) -> SourceChoice {
    match s {
        SignalSource::Auto => SourceChoice::Auto,
        SignalSource::Ebpf => SourceChoice::Only(SourceKind::Ebpf),
        SignalSource::Eventfd => SourceChoice::Only(SourceKind::Eventfd),
        SignalSource::Psi => SourceChoice::Only(SourceKind::Psi),
        SignalSource::Poll => SourceChoice::Only(SourceKind::Poll),
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (systemd gives services 1024 soft), so
/// descriptors are not what runs out first; logs what it got.
fn raise_nofile_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        let raised = rustix::process::Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => {
                tracing::info!(from = ?lim.current, to = ?lim.maximum, "raised the open-files limit")
            }
            Err(e) => tracing::warn!(error = %e, "could not raise the open-files limit"),
        }
    }
}

/// Runs until `shutdown` resolves.
pub async fn run(
    opts: DaemonOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let config = opts.config;
    raise_nofile_limit();
    let health = Arc::new(Health::default());
    if let Err(e) = crate::health::probe_writable(&config.enforcer.state_dir) {
        tracing::error!(error = %e, "the pod status and uid ownership cannot be persisted; /healthz reports it");
        health.set_state(Some(e));
    }
    let layout = CgroupLayout::discover()?;
    if let Err(e) = kernel::ebpf::ensure_tracefs() {
        tracing::warn!(error = %e, "tracefs is not mounted and could not be mounted");
    }
    let caps = Capabilities::probe(&layout);
    tracing::info!(capabilities = %caps.summary(), "kernel probed");
    if !caps.cap_sys_resource {
        tracing::warn!(
            "no CAP_SYS_RESOURCE: negative oom_score_adj values are clamped to 0 and PSI windows widened to 2 s"
        );
    }
    // kubelet's own score, or the lowest this node allows (logged).
    runtime::enforce::set_own_oom_score_adj(caps.cap_sys_resource);

    // The node: capacity (or its override), allocatable, and where the observer looks.
    let capacity = capacity(&config);
    let allocatable = admission::allocatable(
        &capacity,
        &config.system_reserved,
        &config.kube_reserved,
        &config.hard_eviction_thresholds,
    );
    let memory_capacity = capacity.get("memory").map_or(0, Quantity::value);
    let observer = NodeObserver::for_node(&config, &layout, &capacity);
    let kubepods = observer.kubepods.clone();
    // The kubepods cgroup (allocatable: capacity minus reservations when `pods` is enforced)
    // and its QoS tiers exist before anything watches them (runtime::enforce).
    let enforcer = runtime::enforce::Enforcer::from_config(&config, &layout, &capacity);
    // The CPU manager only where the enforcer runs the pods (beside a kubelet, kubelet owns it).
    let enforcer = Arc::new(if opts.run_pods {
        enforcer.with_cpu_manager(&config)?
    } else {
        enforcer
    });
    enforcer.sync_node_logged(std::iter::empty());
    let mut watches = Vec::new();
    if let Some((mount, _)) = layout.controller("memory") {
        let dir = join_inside(mount, &kubepods)?;
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!(path = %dir.display(), error = %e, "creating the kubepods cgroup");
        }
        // Usage-threshold watches on kubepods where each memory threshold (hard and soft,
        // memory.available and allocatableMemory.available) is crossed, so the crossing
        // itself wakes the manager (condition raised, grace period started, eviction).
        let crossings = memory_crossings(&config, &observer);
        if crossings.is_empty() {
            watches.push(Watch {
                cgroup: dir,
                threshold_bytes: None,
            });
        } else {
            watches.extend(crossings.into_iter().map(|at| Watch {
                cgroup: dir.clone(),
                threshold_bytes: Some(at),
            }));
        }
    }
    watches.extend(opts.watches.iter().map(|c| Watch {
        cgroup: c.clone(),
        threshold_bytes: None,
    }));

    let pipeline_opts = PipelineOptions {
        source: source_choice(config.enforcer.signal_source),
        watches,
        poll_interval: config.enforcer.housekeeping_interval,
        ..PipelineOptions::default()
    };
    let pipeline = kernel::start(&pipeline_opts, &caps, &layout)?;
    tracing::info!(source = ?pipeline.source, reason = %pipeline.reason, "signal pipeline started");

    let stats = pipeline.stats.clone();
    let link = NodeLink::default();
    let metrics_link = link.clone();
    let pages = Arc::new(server::Pages {
        metrics: Box::new(move || {
            let mut out = stats.render();
            out.push_str(&render_conditions(&metrics_link));
            out
        }),
        capabilities: serde_json::to_string(&caps).unwrap_or_default(),
        health: health.clone(),
    });
    let (addr, server_task) = server::serve(config.enforcer.http_address, pages)
        .await
        .map_err(|source| DaemonError::Http {
            addr: config.enforcer.http_address,
            source,
        })?;
    tracing::info!(%addr, "serving /metrics, /healthz, /capabilities");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    let status = StatusManager::default();
    let mut pods_task = None;
    let mut node_reclaim = None;
    if opts.run_pods {
        let mut ro = RunPodsOptions::for_node(layout.clone(), &caps);
        ro.cri_socket = config.enforcer.cri_socket.clone();
        ro.cgroup_root = config.cgroup_root.clone();
        ro.manifest_dir = config.enforcer.manifest_dir.clone();
        ro.state_dir = config.enforcer.state_dir.clone();
        ro.node.memory_capacity = memory_capacity;
        ro.static_pods = opts.static_pods;
        ro.kubeconfig = opts.kubeconfig.clone();
        ro.enforce = enforcer.clone();
        ro.link = link.clone();
        ro.health = health.clone();
        ro.admission = Some(Admission {
            node: admission::Node {
                name: ro.node_name.clone(),
                labels: BTreeMap::from([(
                    "kubernetes.io/hostname".to_owned(),
                    ro.node_name.clone(),
                )]),
                taints: Vec::new(),
                allocatable: allocatable.clone(),
            },
            security: SecurityPolicy {
                allow_privileged: config.enforcer.allow_privileged,
                allow_host_namespaces: config.enforcer.allow_host_namespaces,
                allow_host_pid: config.enforcer.allow_host_pid,
                allow_host_ipc: config.enforcer.allow_host_ipc,
                allow_host_paths: config.enforcer.allow_host_paths,
            },
        });
        let cri = Arc::new(CriRuntime::new(ro.cri_socket.clone(), ro.cri_timeout));
        node_reclaim = Some(cri.clone());
        pods_task = Some(tokio::spawn(runtime::run_pods_with(
            cri,
            ro,
            status.clone(),
            stopped(),
        )));
    }

    health.expect_steps_within(config.enforcer.housekeeping_interval.saturating_mul(2));
    let manager = EvictionManager {
        config: config.clone(),
        observer,
        link,
        status,
        housekeeping: config.enforcer.housekeeping_interval,
        node_reclaim,
        health: health.clone(),
    };
    let eviction = tokio::spawn(manager.run(pipeline, stopped()));

    shutdown.await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    let _ = eviction.await;
    if let Some(t) = pods_task
        && let Ok(Err(e)) = t.await
    {
        tracing::error!(error = %e, "pod runtime");
    }
    server_task.abort();
    Ok(())
}

/// The kubepods memory usages at which the memory thresholds are crossed, lowest first:
/// `memory.available` at capacity - threshold (exact with a capacity override, where it is
/// measured on kubepods), `allocatableMemory.available` at the kubepods limit - threshold.
#[must_use]
pub fn memory_crossings(config: &Config, observer: &NodeObserver) -> Vec<u64> {
    let mut out: Vec<u64> = config
        .eviction
        .thresholds
        .iter()
        .filter_map(|t| {
            let base = match t.signal {
                EvictionSignal::MemoryAvailable => observer.memory_capacity,
                EvictionSignal::AllocatableMemoryAvailable => observer.kubepods_memory_limit,
                _ => return None,
            };
            u64::try_from(base - t.value.resolve(base).value())
                .ok()
                .filter(|at| *at > 0)
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

fn render_conditions(link: &NodeLink) -> String {
    let conds = link.conditions();
    let mut out = String::from(
        "# HELP enforcer_node_condition Node conditions from the eviction manager (1 = reported).\n# TYPE enforcer_node_condition gauge\n",
    );
    for c in ["DiskPressure", "MemoryPressure", "PIDPressure"] {
        let on = conds.iter().any(|x| x.as_str() == c);
        out.push_str(&format!(
            "enforcer_node_condition{{condition=\"{c}\"}} {}\n",
            u8::from(on)
        ));
    }
    out
}

/// The node's pressure conditions for the status file: each `True` or `False`.
fn node_record(conditions: &[NodeCondition]) -> NodeRecord {
    let conditions = [
        NodeCondition::MemoryPressure,
        NodeCondition::DiskPressure,
        NodeCondition::PidPressure,
    ]
    .into_iter()
    .map(|c| StatusCondition::new(c.as_str(), conditions.contains(&c)))
    .collect();
    NodeRecord { conditions }
}

/// Whether a signal should wake the eviction manager.
#[must_use]
pub fn is_pressure(s: &Signal) -> bool {
    matches!(
        s.kind,
        SignalKind::MemcgReclaim
            | SignalKind::DirectReclaim
            | SignalKind::OomKill
            | SignalKind::MemoryThreshold
            | SignalKind::MemoryPressure
            | SignalKind::MemoryEvents
            | SignalKind::Fork
    )
}

/// Whether a signal calls for a step at once, without the [`MIN_STEP_INTERVAL`] floor: a
/// usage threshold crossed or a kernel OOM kill. Reclaim and fork records come in bursts and
/// are coalesced; a crossing comes once and is the moment to act.
#[must_use]
pub fn is_urgent(s: &Signal) -> bool {
    matches!(s.kind, SignalKind::MemoryThreshold | SignalKind::OomKill)
}

/// What the run loop remembers between steps besides the decision core's state.
#[derive(Debug, Default)]
struct Memo {
    /// When node-level reclaim last ran.
    last_reclaim: Option<Duration>,
    /// The last evicted pod and its pod cgroup, until its resources are released.
    cleanup: Option<(CleanupWait, String)>,
    /// When the runtime was last asked for its image filesystem, and whether it answered.
    imagefs_asked: Option<Duration>,
    imagefs_known: bool,
}

/// How often the runtime is asked for its image filesystem until it answers.
const IMAGEFS_RETRY: Duration = Duration::from_secs(10);

/// The imagefs mountpoint from a CRI `ImageFsInfo` answer: the first absolute path that exists.
#[must_use]
pub fn imagefs_mountpoint(filesystems: &[k8s_cri::v1::FilesystemUsage]) -> Option<PathBuf> {
    filesystems
        .iter()
        .filter_map(|f| f.fs_id.as_ref())
        .map(|id| PathBuf::from(&id.mountpoint))
        .find(|p| p.is_absolute() && p.exists())
}

/// How often the manager looks whether an evicted pod's resources were released (kubelet's
/// `podCleanupPollFreq` is 1 s).
const CLEANUP_POLL: Duration = Duration::from_millis(100);

/// Minimum time between two node-level reclaims (and so between two disk-pressure evictions);
/// kubelet's is its 10 s housekeeping period.
const NODE_RECLAIM_INTERVAL: Duration = Duration::from_secs(1);

/// Minimum time between two eviction-manager steps driven by reclaim or fork records: enough
/// to coalesce a burst of records into one step, far below any grace period. Urgent signals
/// ([`is_urgent`]) do not wait for it.
const MIN_STEP_INTERVAL: Duration = Duration::from_millis(2);

/// The eviction manager of the daemon: kubelet's `synchronize`, run on every pressure signal
/// (coalesced) and on the housekeeping tick, acting through the [`NodeLink`].
#[derive(Debug)]
pub struct EvictionManager {
    pub config: Config,
    pub observer: NodeObserver,
    pub link: NodeLink,
    /// Container names and ids of the running pods (for per-container usage).
    pub status: StatusManager,
    pub housekeeping: Duration,
    /// The runtime for node-level reclaim before disk-pressure evictions (`None`: no pods run).
    pub node_reclaim: Option<Arc<CriRuntime>>,
    /// Told of every completed step and of the signal pipeline ending (`/healthz`).
    pub health: Arc<Health>,
}

impl EvictionManager {
    /// Runs until `stop` resolves.
    pub async fn run(
        mut self,
        mut pipeline: kernel::Pipeline,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let start = Instant::now();
        let mut state = State::default();
        let mut tick = tokio::time::interval(self.housekeeping);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_step = Instant::now() - MIN_STEP_INTERVAL;
        // A soft threshold's grace period or a condition's transition period ending: a step
        // is due then even if no signal comes.
        let mut due: Option<tokio::time::Instant> = None;
        let mut memo = Memo::default();
        let mut signals_open = true;
        tokio::pin!(stop);
        loop {
            let deadline = async {
                match due {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            let trigger = tokio::select! {
                () = &mut stop => break,
                _ = tick.tick() => "housekeeping",
                () = deadline => "deadline",
                s = pipeline.signals.recv(), if signals_open => match s {
                    None => {
                        tracing::error!("signal pipeline ended; housekeeping continues");
                        self.health.set_pipeline(false);
                        signals_open = false;
                        continue;
                    }
                    Some(s) => {
                        log_signal(&s);
                        if !is_pressure(&s) {
                            continue;
                        }
                        self.poke_oom_killed(&s);
                        let mut urgent = is_urgent(&s);
                        // Coalesce the rest of the burst.
                        while let Ok(more) = pipeline.signals.try_recv() {
                            log_signal(&more);
                            self.poke_oom_killed(&more);
                            urgent |= is_urgent(&more);
                        }
                        let since = last_step.elapsed();
                        if !urgent && since < MIN_STEP_INTERVAL {
                            tokio::time::sleep(MIN_STEP_INTERVAL - since).await;
                        }
                        "signal"
                    }
                },
            };
            last_step = Instant::now();
            if trigger == "housekeeping" {
                // Off the signal path: a slow runtime never delays a signal-driven step.
                self.learn_imagefs(start.elapsed(), &mut memo).await;
            }
            state = self.step(state, start.elapsed(), trigger, &mut memo).await;
            self.health.step_done();
            due = next_deadline(&self.config.eviction, &state, start.elapsed())
                .map(|d| tokio::time::Instant::from_std(start + d));
            // Waiting for an evicted pod's cleanup: look again soon, as kubelet polls it.
            if memo.cleanup.is_some() {
                let soon = tokio::time::Instant::now() + CLEANUP_POLL;
                due = Some(due.map_or(soon, |d| d.min(soon)));
            }
        }
    }

    /// kubelet's imagefs is where the runtime keeps its images (CRI `ImageFsInfo`); until the
    /// runtime answers (or without a runtime) the observer keeps its default.
    async fn learn_imagefs(&mut self, now: Duration, memo: &mut Memo) {
        let Some(rt) = &self.node_reclaim else {
            return;
        };
        if memo.imagefs_known
            || memo
                .imagefs_asked
                .is_some_and(|t| now.saturating_sub(t) < IMAGEFS_RETRY)
        {
            return;
        }
        memo.imagefs_asked = Some(now);
        match rt.image_fs_info().await {
            Ok(fs) => {
                memo.imagefs_known = true;
                match imagefs_mountpoint(&fs) {
                    Some(p) => {
                        tracing::info!(path = %p.display(), "imagefs from the runtime's ImageFsInfo");
                        self.observer.imagefs = Some(p);
                    }
                    None => tracing::warn!(
                        answer = ?fs,
                        kept = ?self.observer.imagefs,
                        "ImageFsInfo named no existing mountpoint; keeping the default imagefs"
                    ),
                }
            }
            Err(e) => tracing::debug!(error = %e, "ImageFsInfo: the runtime did not answer yet"),
        }
    }

    /// Whether an evicted pod's resources are released: its worker finished (containers
    /// stopped and removed, logs and pod cgroup removed) and its memory cgroup is gone.
    fn released(&self, uid: &str, cgroup: &str) -> bool {
        let gone = self
            .observer
            .layout
            .controller("memory")
            .and_then(|(m, _)| join_inside(m, cgroup).ok())
            .is_none_or(|d| !d.exists());
        gone && self.link.take_released(uid)
    }

    /// Disk pressure: dead containers, then unused images, through CRI; then re-observe.
    /// Returns true when no threshold is met any more (no pod needs to be evicted).
    async fn node_level_reclaim(&self, now: Duration) -> bool {
        let Some(rt) = &self.node_reclaim else {
            return false;
        };
        let active = self.link.active();
        let status = self.status.clone();
        let running = move |uid: &str| {
            active.contains_key(uid)
                && status
                    .get(uid)
                    .is_none_or(|r| r.phase != "Succeeded" && r.phase != "Failed")
        };
        match runtime::gc::reclaim_node_level(rt.as_ref(), &running).await {
            Ok(r) => tracing::info!(
                containers = r.containers,
                log_bytes = r.log_bytes,
                images = r.images,
                "node-level reclaim"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "node-level reclaim failed");
                return false;
            }
        }
        match self.observer.observe(now) {
            Ok(obs) => {
                let resolved = crate::policy::eviction::manager::resolved_after_node_reclaim(
                    &self.config.eviction,
                    &obs,
                );
                if resolved {
                    tracing::info!("able to reduce resource pressure without evicting pods");
                }
                resolved
            }
            Err(e) => {
                tracing::warn!(error = %e, "observing the node after reclaim failed");
                false
            }
        }
    }

    /// A kernel OOM kill inside a pod: its worker resyncs now, so the container's `OOMKilled`
    /// shows at once instead of on the next relist.
    fn poke_oom_killed(&self, s: &Signal) {
        if s.kind == SignalKind::OomKill
            && let Some(uid) = &s.pod_uid
        {
            tracing::warn!(uid, pid = s.pid, "kernel OOM kill in a pod");
            self.link.poke(uid);
        }
    }

    async fn step(&self, state: State, now: Duration, trigger: &str, memo: &mut Memo) -> State {
        // kubelet's waitForPodsCleanup, checked before observing: the step that sees the
        // victim released observes what it freed.
        if let Some((wait, cgroup)) = &memo.cleanup {
            match wait.check(now, self.released(&wait.uid, cgroup)) {
                Cleanup::Waiting => {}
                Cleanup::Released => {
                    tracing::info!(uid = %wait.uid, after_ms = now.saturating_sub(wait.since).as_millis(), "evicted pod's resources released");
                    memo.cleanup = None;
                }
                Cleanup::TimedOut => {
                    tracing::warn!(uid = %wait.uid, "timed out waiting for the evicted pod to be cleaned up");
                    memo.cleanup = None;
                }
            }
        }
        let observations = match self.observer.observe(now) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "observing the node failed; skipping this step");
                return state;
            }
        };
        // kubelet's active pods: a pod that ran to its end (Succeeded or Failed, e.g.
        // restartPolicy Never) holds no memory worth reclaiming and is not ranked.
        let mut active = self.link.active();
        let records: BTreeMap<String, PodRecord> = active
            .keys()
            .filter_map(|uid| self.status.get(uid).map(|r| (uid.clone(), r)))
            .collect();
        active.retain(|uid, _| {
            records
                .get(uid)
                .is_none_or(|r| r.phase != "Succeeded" && r.phase != "Failed")
        });
        let stats: Vec<_> = active
            .iter()
            .map(|(uid, e)| {
                let containers: Vec<(String, String)> = records
                    .get(uid)
                    .map(|r| {
                        r.container_statuses
                            .iter()
                            .filter(|c| !c.container_id.is_empty())
                            .map(|c| {
                                // kubelet's form `<runtime>://<id>`; the cgroup is named by the id.
                                let id = c.container_id.rsplit("://").next().unwrap_or_default();
                                (c.name.clone(), id.to_owned())
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let mut stats = self.observer.pod_stats(&e.cgroup, &containers);
                // Ephemeral storage: the pod's container logs on nodefs.
                if let Some(s) = stats.as_mut()
                    && let Some((total, per_container)) = self.observer.pod_log_usage(uid)
                {
                    s.ephemeral_storage = Some(total);
                    for c in &mut s.containers {
                        c.ephemeral_storage = per_container
                            .iter()
                            .find(|(n, _)| *n == c.name)
                            .map(|(_, b)| *b);
                    }
                }
                stats
            })
            .collect();
        let pods: Vec<ActivePod<'_>> = active
            .values()
            .zip(&stats)
            .map(|(e, s)| ActivePod::new(&e.pod, s.as_ref()).with_facts(&e.facts))
            .collect();
        let before = state.conditions.clone();
        let (state, decision) = step(&self.config.eviction, &state, &observations, &pods, now);
        if self.link.set_conditions(decision.conditions.clone()) || before != decision.conditions {
            tracing::info!(conditions = ?decision.conditions, trigger, "node conditions changed");
        }
        self.status.set_node(node_record(&decision.conditions));
        if let Some(text) = &decision.node_event {
            tracing::warn!(event = "EvictionThresholdMet", message = %text, trigger, "eviction threshold met");
        }
        let mut eviction = decision.eviction;
        if memo.cleanup.is_some() {
            eviction = None;
        } else if decision.node_level_reclaim_first && decision.reclaim.is_some() {
            // At most one node-level reclaim per NODE_RECLAIM_INTERVAL (signal bursts must not
            // turn into CRI storms); a step in between evicts nobody for disk.
            if memo
                .last_reclaim
                .is_some_and(|at| now.saturating_sub(at) < NODE_RECLAIM_INTERVAL)
            {
                eviction = None;
            } else {
                memo.last_reclaim = Some(now);
                if self.node_level_reclaim(now).await {
                    eviction = None;
                }
            }
        }
        if let Some(ev) = eviction {
            let entry = active.get(&ev.uid);
            let hard = ev.threshold.is_hard();
            // A hard memory threshold frees the victim's memory now: SIGKILL to every process
            // of the pod cgroup, then the orderly stop through the pod worker.
            let mut sigkill_ns = None;
            if hard
                && ev.signal.resource() == crate::policy::eviction::Resource::Memory
                && let Some(e) = entry
            {
                let killed = kill_pod_cgroup(&self.observer.layout, &e.cgroup);
                sigkill_ns = Some(crate::signal::monotonic_ns());
                tracing::warn!(uid = %ev.uid, killed, "hard memory threshold: SIGKILL sent to the pod's processes");
            }
            tracing::warn!(
                pod = %format!("{}/{}", ev.namespace, ev.name),
                uid = %ev.uid,
                signal = %ev.signal,
                grace = ev.grace_period_seconds,
                trigger,
                message = %ev.message,
                "eviction"
            );
            if let Some(e) = entry {
                memo.cleanup = Some((
                    CleanupWait {
                        uid: ev.uid.clone(),
                        since: now,
                    },
                    e.cgroup.clone(),
                ));
            }
            self.link.evict(Evict {
                uid: ev.uid.clone(),
                grace_seconds: ev.grace_period_seconds,
                message: ev.message.clone(),
                sigkill_ns,
            });
        }
        state
    }
}

/// Sends SIGKILL to every process in a pod cgroup (and its container cgroups) of the memory
/// hierarchy; `cgroup.kill` where cgroup v2 offers it. Returns how many processes were signalled
/// (1 for cgroup.kill).
pub fn kill_pod_cgroup(layout: &CgroupLayout, rel: &str) -> usize {
    let Some((mount, version)) = layout.controller("memory") else {
        return 0;
    };
    let Ok(dir) = join_inside(mount, rel) else {
        return 0;
    };
    if version == CgroupVersion::V2 && std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return 1;
    }
    let mut killed = 0;
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            for pid in text
                .lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .filter(|p| *p > 1)
            {
                // SAFETY: kill(2) on a pid listed in the pod's own cgroup.
                if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                    killed += 1;
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            stack.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    killed
}

fn log_signal(s: &Signal) {
    let cgroup = s.cgroup.as_deref().unwrap_or("");
    let pod = s.pod_uid.as_deref().unwrap_or("");
    match s.kind {
        SignalKind::CgroupCreated
        | SignalKind::CgroupRemoved
        | SignalKind::Fork
        | SignalKind::Probe
        | SignalKind::MemcgReclaim
        | SignalKind::DirectReclaim => {
            tracing::debug!(signal = ?s.kind, cgroup, pod, count = s.count, "signal");
        }
        _ => tracing::info!(
            signal = ?s.kind,
            source = ?s.source,
            cgroup,
            pod,
            pid = s.pid,
            count = s.count,
            delay_us = s.delay_ns().map(|d| d / 1000),
            "signal"
        ),
    }
}

#[cfg(test)]
mod tests {
    use k8s_cri::v1 as cri;

    use super::*;

    /// Each memory threshold gets a crossing on kubepods usage; allocatable's is measured
    /// against the kubepods limit (below memory.available's when reservations exist).
    #[test]
    fn memory_crossings_cover_allocatable_and_soft_thresholds() {
        const MI: u64 = 1 << 20;
        let args = crate::config::ConfigArgs {
            node_capacity: vec!["memory=1Gi".to_owned()],
            kube_reserved: vec!["memory=358Mi".to_owned()],
            eviction_hard: vec!["memory.available<250Mi".to_owned()],
            eviction_soft: vec!["memory.available<300Mi".to_owned()],
            eviction_soft_grace_period: vec!["memory.available=10s".to_owned()],
            ..Default::default()
        };
        let config = crate::config::load(&args).expect("config").config;
        let caps = config.enforcer.node_capacity.clone();
        let observer = NodeObserver::for_node(&config, &CgroupLayout::default(), &caps);
        assert_eq!(
            memory_crossings(&config, &observer),
            [
                (1024 - 358 - 250) * MI,
                (1024 - 300) * MI,
                (1024 - 250) * MI
            ]
        );
        let plain = crate::config::load(&crate::config::ConfigArgs {
            node_capacity: vec!["memory=1Gi".to_owned()],
            eviction_hard: vec!["memory.available<0%".to_owned()],
            ..Default::default()
        })
        .expect("config")
        .config;
        let observer = NodeObserver::for_node(&plain, &CgroupLayout::default(), &caps);
        assert!(memory_crossings(&plain, &observer).is_empty());
    }

    #[test]
    fn imagefs_is_the_first_existing_absolute_mountpoint() {
        let dir = tempfile::tempdir().unwrap();
        let fs = |m: &str| cri::FilesystemUsage {
            fs_id: Some(cri::FilesystemIdentifier {
                mountpoint: m.to_owned(),
            }),
            ..Default::default()
        };
        let here = dir.path().display().to_string();
        let answer = [
            fs("relative/path"),
            fs("/does/not/exist/enforcer"),
            fs(&here),
        ];
        assert_eq!(imagefs_mountpoint(&answer), Some(dir.path().to_path_buf()));
        assert_eq!(imagefs_mountpoint(&answer[..2]), None);
        assert_eq!(imagefs_mountpoint(&[]), None);
    }
}
