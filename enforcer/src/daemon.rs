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

use tokio::sync::mpsc;

use crate::{
    cgroup::{CgroupLayout, CgroupVersion, join_inside},
    config::{Config, SignalSource},
    kernel::{self, Capabilities, PipelineOptions, SourceChoice, Watch},
    node::{self, NodeObserver},
    policy::{
        admission::{self, SecurityPolicy},
        eviction::{ActivePod, Signal as EvictionSignal, State, step},
    },
    quantity::{Format, Quantity},
    runtime::{self, Admission, CriRuntime, Evict, NodeLink, RunPodsOptions, StatusManager},
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
    cap.insert("memory".to_owned(), Quantity::from_int(machine_memory, Format::BinarySI));
    cap.insert(
        "cpu".to_owned(),
        Quantity::from_int(i64::try_from(cpus).unwrap_or(1), Format::DecimalSI),
    );
    if let Ok((_, bytes, _, _)) = node::statvfs(&config.enforcer.state_dir).or_else(|_| node::statvfs(Path::new("/"))) {
        cap.insert("ephemeral-storage".to_owned(), Quantity::from_int(bytes, Format::BinarySI));
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

/// Runs until `shutdown` resolves.
pub async fn run(
    opts: DaemonOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let config = opts.config;
    let layout = CgroupLayout::discover()?;
    if let Err(e) = kernel::ebpf::ensure_tracefs() {
        tracing::warn!(error = %e, "tracefs is not mounted and could not be mounted");
    }
    let caps = Capabilities::probe(&layout);
    tracing::info!(capabilities = %caps.summary(), "kernel probed");
    if !caps.cap_sys_resource {
        tracing::warn!("no CAP_SYS_RESOURCE: negative oom_score_adj values are clamped to 0 and PSI windows widened to 2 s");
    }

    // The node: capacity (or its override), allocatable, and where the observer looks.
    let capacity = capacity(&config);
    let allocatable = admission::allocatable(
        &capacity,
        &config.system_reserved,
        &config.kube_reserved,
        &config.hard_eviction_thresholds,
    );
    let memory_capacity = capacity.get("memory").map_or(0, Quantity::value);
    let kubepods = format!("{}/kubepods", config.cgroup_root.trim_end_matches('/'));
    let observer = NodeObserver {
        layout: layout.clone(),
        kubepods: kubepods.clone(),
        memory_capacity,
        capacity_override: config.enforcer.node_capacity.contains_key("memory"),
        memory_allocatable: allocatable.get("memory").map_or(memory_capacity, Quantity::value),
        nodefs: config.enforcer.state_dir.clone(),
        imagefs: Some(PathBuf::from("/var/lib/containerd")).filter(|p| p.exists()),
    };
    // The kubepods cgroup exists before anything watches it.
    let mut watches = Vec::new();
    if let Some((mount, _)) = layout.controller("memory") {
        let dir = join_inside(mount, &kubepods)?;
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!(path = %dir.display(), error = %e, "creating the kubepods cgroup");
        }
        // Fallback sources fire where memory.available would cross the hard threshold.
        let hard_mem = config
            .hard_eviction_thresholds
            .iter()
            .find(|t| t.signal == EvictionSignal::MemoryAvailable)
            .map(|t| t.value.resolve(memory_capacity).value());
        let threshold = hard_mem.map(|h| u64::try_from(memory_capacity - h).unwrap_or(0)).filter(|t| *t > 0);
        // Node allocatable enforcement (`pods`): kubepods is limited to capacity minus the
        // reservations, as kubelet does (hard eviction thresholds are not subtracted).
        if config.enforce_node_allocatable.iter().any(|e| e == "pods") {
            let reserved = |l: &BTreeMap<String, Quantity>| l.get("memory").map_or(0, Quantity::value);
            let limit = memory_capacity - reserved(&config.system_reserved) - reserved(&config.kube_reserved);
            let (file, value) = match layout.controller("memory") {
                Some((_, CgroupVersion::V2)) => ("memory.max", limit.to_string()),
                _ => ("memory.limit_in_bytes", limit.to_string()),
            };
            if limit > 0 {
                match std::fs::write(dir.join(file), &value) {
                    Ok(()) => tracing::info!(cgroup = %kubepods, limit, "kubepods memory limit set"),
                    Err(e) => tracing::warn!(path = %dir.join(file).display(), error = %e, "setting the kubepods memory limit"),
                }
            }
        }
        watches.push(Watch { cgroup: dir, threshold_bytes: threshold });
    }
    watches.extend(opts.watches.iter().map(|c| Watch { cgroup: c.clone(), threshold_bytes: None }));

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
    });
    let (addr, _server) = server::serve(config.enforcer.http_address, pages)
        .await
        .map_err(|source| DaemonError::Http { addr: config.enforcer.http_address, source })?;
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
    if opts.run_pods {
        let mut ro = RunPodsOptions::for_node(layout.clone(), &caps);
        ro.cri_socket = config.enforcer.cri_socket.clone();
        ro.cgroup_root = config.cgroup_root.clone();
        ro.manifest_dir = config.enforcer.manifest_dir.clone();
        ro.state_dir = config.enforcer.state_dir.clone();
        ro.node.memory_capacity = memory_capacity;
        ro.static_pods = opts.static_pods;
        ro.link = link.clone();
        ro.admission = Some(Admission {
            node: admission::Node {
                name: ro.node_name.clone(),
                labels: BTreeMap::from([("kubernetes.io/hostname".to_owned(), ro.node_name.clone())]),
                taints: Vec::new(),
                allocatable: allocatable.clone(),
            },
            security: SecurityPolicy {
                allow_privileged: config.enforcer.allow_privileged,
                allow_host_namespaces: config.enforcer.allow_host_namespaces,
                allow_host_paths: config.enforcer.allow_host_paths,
            },
        });
        let cri = Arc::new(CriRuntime::new(ro.cri_socket.clone(), ro.cri_timeout));
        pods_task = Some(tokio::spawn(runtime::run_pods_with(cri, ro, status.clone(), stopped())));
    }

    let manager = EvictionManager {
        config: config.clone(),
        observer,
        link,
        status,
        housekeeping: config.enforcer.housekeeping_interval,
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
    Ok(())
}

fn render_conditions(link: &NodeLink) -> String {
    let conds = link.conditions();
    let mut out = String::from(
        "# HELP enforcer_node_condition Node conditions from the eviction manager (1 = reported).\n# TYPE enforcer_node_condition gauge\n",
    );
    for c in ["DiskPressure", "MemoryPressure", "PIDPressure"] {
        let on = conds.iter().any(|x| x.as_str() == c);
        out.push_str(&format!("enforcer_node_condition{{condition=\"{c}\"}} {}\n", u8::from(on)));
    }
    out
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

/// Minimum time between two eviction-manager steps driven by signals: enough to coalesce a
/// burst of records into one step, far below any grace period.
const MIN_STEP_INTERVAL: Duration = Duration::from_millis(2);

struct EvictionManager {
    config: Config,
    observer: NodeObserver,
    link: NodeLink,
    /// Container names and ids of the running pods (for per-container usage).
    status: StatusManager,
    housekeeping: Duration,
}

impl EvictionManager {
    async fn run(self, mut pipeline: kernel::Pipeline, stop: impl std::future::Future<Output = ()>) {
        let start = Instant::now();
        let mut state = State::default();
        let mut tick = tokio::time::interval(self.housekeeping);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_step = Instant::now() - MIN_STEP_INTERVAL;
        tokio::pin!(stop);
        loop {
            let trigger = tokio::select! {
                () = &mut stop => break,
                _ = tick.tick() => "housekeeping",
                s = pipeline.signals.recv() => match s {
                    None => {
                        tracing::error!("signal pipeline ended; housekeeping continues");
                        pipeline.signals = mpsc::channel(1).1;
                        continue;
                    }
                    Some(s) => {
                        log_signal(&s);
                        if !is_pressure(&s) {
                            continue;
                        }
                        if s.kind == SignalKind::OomKill && let Some(uid) = &s.pod_uid {
                            tracing::warn!(uid, pid = s.pid, "kernel OOM kill in a pod");
                        }
                        // Coalesce the rest of the burst.
                        while let Ok(more) = pipeline.signals.try_recv() {
                            log_signal(&more);
                        }
                        let since = last_step.elapsed();
                        if since < MIN_STEP_INTERVAL {
                            tokio::time::sleep(MIN_STEP_INTERVAL - since).await;
                        }
                        "signal"
                    }
                },
            };
            last_step = Instant::now();
            state = self.step(state, start.elapsed(), trigger);
        }
    }

    fn step(&self, state: State, now: Duration, trigger: &str) -> State {
        let observations = match self.observer.observe(now) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "observing the node failed; skipping this step");
                return state;
            }
        };
        let active = self.link.active();
        let stats: Vec<_> = active
            .iter()
            .map(|(uid, e)| {
                let containers: Vec<(String, String)> = self
                    .status
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
                self.observer.pod_stats(&e.cgroup, &containers)
            })
            .collect();
        let pods: Vec<ActivePod<'_>> = active
            .values()
            .zip(&stats)
            .map(|(e, s)| ActivePod { pod: &e.pod, stats: s.as_ref() })
            .collect();
        let before = state.conditions.clone();
        let (state, decision) = step(&self.config.eviction, &state, &observations, &pods, now);
        if self.link.set_conditions(decision.conditions.clone()) || before != decision.conditions {
            tracing::info!(conditions = ?decision.conditions, trigger, "node conditions changed");
        }
        if let Some(text) = &decision.node_event {
            tracing::warn!(event = "EvictionThresholdMet", message = %text, trigger, "eviction threshold met");
        }
        if let Some(ev) = decision.eviction {
            let entry = active.get(&ev.uid);
            let hard = ev.threshold.is_hard();
            // A hard memory threshold frees the victim's memory now: SIGKILL to every process
            // of the pod cgroup, then the orderly stop through the pod worker.
            if hard && ev.signal.resource() == crate::policy::eviction::Resource::Memory
                && let Some(e) = entry
            {
                let killed = kill_pod_cgroup(&self.observer.layout, &e.cgroup);
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
            self.link.evict(Evict {
                uid: ev.uid.clone(),
                grace_seconds: ev.grace_period_seconds,
                message: ev.message.clone(),
            });
        }
        state
    }
}

/// Sends SIGKILL to every process in a pod cgroup (and its container cgroups) of the memory
/// hierarchy; `cgroup.kill` where cgroup v2 offers it. Returns how many processes were signalled
/// (1 for cgroup.kill).
pub fn kill_pod_cgroup(layout: &CgroupLayout, rel: &str) -> usize {
    let Some((mount, version)) = layout.controller("memory") else { return 0 };
    let Ok(dir) = join_inside(mount, rel) else { return 0 };
    if version == CgroupVersion::V2 && std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return 1;
    }
    let mut killed = 0;
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()).filter(|p| *p > 1) {
                // SAFETY: kill(2) on a pid listed in the pod's own cgroup.
                if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                    killed += 1;
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            stack.extend(entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
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
