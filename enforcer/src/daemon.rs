//! The daemon's main loop (`enforcer run`): probe the kernel, start the signal pipeline, run
//! pods through their workers, and run the eviction manager on every relevant signal (and on
//! a housekeeping tick as a safety net), acting through the pod workers.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::{
    cgroup::{CgroupLayout, CrossingNotice},
    config::{Config, SignalSource},
    cri::CriRuntime,
    eviction_manager::TripwireHow,
    health::Health,
    kernel::{self, Capabilities, CrossingMode, PipelineOptions, SourceChoice, Watch},
    node::{self, NodeObserver},
    pods::{NodeLink, RunPodsOptions},
    policy::{admission, eviction::Signal as EvictionSignal},
    quantity::{Format, Quantity},
    server,
    signal::SourceKind,
    status_manager::StatusManager,
};

mod assemble;

use assemble::{Assembly, Mode, Started, Stop};

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
    /// Companion mode beside a running kubelet (`crate::companion`): no pods run, no cgroup
    /// limit written; `run_pods` is ignored.
    pub companion: Option<CompanionMode>,
}

/// `--companion`'s options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompanionMode {
    /// `--companion-soft`: act on soft thresholds too (kubelet's otherwise).
    pub soft: bool,
}

/// Errors that stop the daemon at start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Kernel(#[from] kernel::KernelError),
    #[error(
        "signalSource pins the crossing check to {attach}, which this kernel does not take: {why}"
    )]
    CrossingPinned { attach: &'static str, why: String },
    #[error(transparent)]
    Crossing(#[from] crate::eviction_manager::thread::StartError),
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::CgroupError),
    #[error(transparent)]
    Node(#[from] node::NodeError),
    #[error(transparent)]
    Runtime(#[from] crate::pods::RuntimeError),
    #[error(transparent)]
    Enforce(#[from] crate::container_manager::EnforceError),
    /// kubelet's `failSwapOn` refusal.
    #[error(
        "running with swap on is not supported, please disable swap or set --fail-swap-on flag to false (failSwapOn); /proc/swaps lists {areas:?}"
    )]
    SwapOn { areas: Vec<String> },
    #[error("starting {what}: {source}")]
    Thread {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Companion(#[from] crate::companion::CompanionConfigError),
    /// The secure metrics port authenticates through the API server.
    #[error(
        "--secure-metrics-address {addr} needs --kubeconfig: its TokenReviews and \
         SubjectAccessReviews go to the API server"
    )]
    SecureMetricsWithoutApi { addr: SocketAddr },
    /// kubelet's `BuildAuthn` / `BuildAuthz` without an API client (standalone): a webhook
    /// asked for cannot be used, and a port with no way to authenticate is refused.
    #[error("{0}")]
    SecurePortStandalone(&'static str),
    #[error("HTTP server on {addr}: {source}")]
    Http {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the secure port on {addr}: {source}")]
    Secure {
        addr: SocketAddr,
        #[source]
        source: crate::server::secure::SecureError,
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
    // cAdvisor's hugepages pools, every supported size (kubelet's `hugepages-<size>`).
    let pools = node::hugepages::machine_hugepages(Path::new("/sys"));
    for (name, bytes) in node::hugepages::capacity_of(&pools) {
        cap.insert(name, Quantity::from_int(bytes, Format::BinarySI));
    }
    for (k, v) in &config.enforcer.node_capacity {
        cap.insert(k.clone(), *v);
    }
    cap
}

fn source_choice(s: SignalSource) -> SourceChoice {
    match s {
        SignalSource::Auto => SourceChoice::Auto,
        SignalSource::Ebpf
        | SignalSource::EbpfFexit
        | SignalSource::EbpfKprobe
        | SignalSource::EbpfTracepoint
        | SignalSource::EbpfTripwire => SourceChoice::Only(SourceKind::Ebpf),
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

/// `--secure-metrics-address`: `/metrics` over TLS, its bearer tokens and access reviewed by
/// the API server (so it needs the kubeconfig); `None` when not asked for.
async fn secure_metrics_port(
    config: &Config,
    kubeconfig: Option<&std::path::Path>,
    sources: server::Sources,
) -> Result<Option<server::Server>, DaemonError> {
    let Some(addr) = config.enforcer.secure_metrics_address else {
        return Ok(None);
    };
    let Some(kubeconfig) = kubeconfig else {
        return Err(DaemonError::SecureMetricsWithoutApi { addr });
    };
    let secure = server::secure::SecureOptions {
        cert_files: None,
        cert_dir: config.enforcer.state_dir.join("pki"),
        hostname: config.node_name(),
        client_ca: None,
        anonymous: false,
        token_webhook: Some(std::time::Duration::from_secs(120)),
        authz: server::secure::AuthzMode::Webhook {
            allowed_ttl: std::time::Duration::from_secs(300),
            denied_ttl: std::time::Duration::from_secs(30),
        },
        node_name: config.node_name(),
        kubeconfig: Some(kubeconfig.to_path_buf()),
        bootstrap: false,
        addresses: vec![addr.ip().to_string()],
    };
    let s = server::serve_secure_metrics(addr, sources, secure)
        .await
        .map_err(|source| DaemonError::Secure { addr, source })?;
    tracing::info!(addr = %s.addr, "serving /metrics over TLS (TokenReview, SubjectAccessReview on nodes/metrics)");
    Ok(Some(s))
}

/// What every mode starts from: the node's health, its cgroup layout and kernel.
struct NodeStart {
    health: Arc<Health>,
    layout: CgroupLayout,
    caps: Capabilities,
}

/// The daemon's HTTP servers: the main one (`--http-address`) and the ports beside it.
struct Servers {
    main: server::Server,
    extra: Vec<server::Server>,
}

/// Runs until `shutdown` resolves.
pub async fn run(
    opts: DaemonOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let mode = Mode::of(&opts);
    let config = mode.config(opts.config.clone())?;
    let run_pods = opts.run_pods && !mode.is_companion();
    // Before anything starts, as kubelet's `BuildAuth`.
    let secure_port = secure_port_served(&config, mode, run_pods)?;
    let NodeStart {
        health,
        layout,
        caps,
    } = start_node(&config, run_pods)?;

    // The node: capacity (or its override), allocatable, and where the observer looks.
    let capacity = capacity(&config);
    let allocatable = admission::allocatable(
        &capacity,
        &config.system_reserved,
        &config.kube_reserved,
        &config.hard_eviction_thresholds,
    );
    let observer = config.node_observer(&layout, &capacity);
    let kubepods = observer.kubepods.clone();
    // The kubepods cgroup (allocatable: capacity minus reservations when `pods` is enforced)
    // and its QoS tiers exist before anything watches them (crate::container_manager); beside kubelet
    // they are kubelet's.
    let enforcer = match mode {
        Mode::Companion(_) => None,
        Mode::Standalone | Mode::Cluster => {
            Some(container_manager(&config, &layout, &capacity, run_pods)?)
        }
    };
    let watches = kubepods_watches(&config, &layout, &observer, mode, &opts.watches)?;
    let (pipeline, crossing) = start_pipeline(&config, &caps, &layout, watches).await?;
    health.watch_readers(&pipeline.heartbeats);

    let link = NodeLink::default();
    let status = StatusManager::default();
    // The container runtime's client, shared by the pod runtime, node-level reclaim and
    // `/stats/summary` (the image filesystem); where the enforcer runs the pods or watches
    // kubelet's.
    let cri = (run_pods || mode.is_companion()).then(|| {
        let defaults = RunPodsOptions::for_node(layout.clone(), &caps);
        Arc::new(CriRuntime::new(
            config.enforcer.cri_socket.clone(),
            defaults.cri_timeout,
        ))
    });
    let sources = || server::Sources {
        config: config.clone(),
        capabilities: serde_json::to_string(&caps).unwrap_or_default(),
        health: health.clone(),
        metrics: crate::metrics::global().clone(),
        pipeline: pipeline.stats.clone(),
        link: link.clone(),
        status: status.clone(),
        observer: observer.clone(),
        runtime: cri.clone(),
    };
    let servers = serve(&config, secure_port, opts.kubeconfig.as_deref(), sources).await?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop = Stop(stop_rx);
    let (events, recorder) = keep_events(&config, opts.kubeconfig.as_deref());
    let node = Assembly {
        mode,
        config: &config,
        opts: &opts,
        layout: &layout,
        caps: &caps,
        health: &health,
        link: &link,
        status: &status,
        recorder: &recorder,
        stop: &stop,
    };
    let started = match (mode, cri) {
        (Mode::Companion(_), Some(cri)) => node.assemble_companion(cri, events),
        (Mode::Companion(_), None) => Started::default(),
        (Mode::Standalone, cri) => {
            node.record_node_events();
            node.assemble_pods(cri, enforcer, run_pods, &capacity, &allocatable)
        }
        (Mode::Cluster, cri) => {
            let mut started = node.assemble_pods(cri, enforcer, run_pods, &capacity, &allocatable);
            started.cluster = node.assemble_cluster(
                events,
                &capacity,
                &allocatable,
                started.node_reclaim.clone(),
            );
            started
        }
    };
    health.expect_steps_every(config.enforcer.housekeeping_interval);
    let manager = node.eviction_manager(
        observer,
        &kubepods,
        &started,
        pipeline.crossing.levels.clone(),
    )?;
    let eviction = tokio::spawn(crossing.run(manager, stop.stopped()));
    health.set_started();

    shutdown.await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    let _ = eviction.await;
    stop_tasks(started, servers).await;
    Ok(())
}

/// Starts the signal pipeline on `watches`; its readers and the eviction manager run on the
/// crossing thread.
async fn start_pipeline(
    config: &Config,
    caps: &Capabilities,
    layout: &CgroupLayout,
    watches: Vec<Watch>,
) -> Result<
    (
        crate::eviction_manager::thread::PipelineInfo,
        crate::eviction_manager::thread::Runner,
    ),
    DaemonError,
> {
    let pipeline_opts = PipelineOptions {
        source: source_choice(config.enforcer.signal_source),
        crossing: config.enforcer.signal_source.crossing_mode(),
        watches,
        poll_interval: config.enforcer.housekeeping_interval,
        ..PipelineOptions::default()
    };
    let (pipeline, crossing) = crate::eviction_manager::thread::start(
        pipeline_opts,
        caps.clone(),
        layout.clone(),
        config.enforcer.crossing_realtime,
    )
    .await?;
    tracing::info!(source = ?pipeline.source, reason = %pipeline.reason, scheduling = %pipeline.scheduling, "signal pipeline started (with the eviction manager, on the crossing thread)");
    let pinned = match config.enforcer.signal_source.crossing_mode() {
        CrossingMode::Only(a) => Some(a),
        CrossingMode::Auto | CrossingMode::Any | CrossingMode::Off => None,
    };
    if let (Some(attach), Some(c)) = (pinned, &pipeline.crossing.choice)
        && c.chosen.is_none()
    {
        return Err(DaemonError::CrossingPinned {
            attach: attach.name(),
            why: c.summary(),
        });
    }
    match &pipeline.crossing.choice {
        Some(c) if c.chosen.is_some() => {
            tracing::info!(crossing = %c.summary(), "crossing check on the memory charge path");
        }
        Some(c) => {
            tracing::warn!(crossing = %c.summary(), "no crossing check on the memory charge path")
        }
        None => {}
    }
    Ok((pipeline, crossing))
}

/// Waits for the started tasks in the order they stop, then shuts the servers down.
async fn stop_tasks(started: Started, servers: Servers) {
    if let Some(t) = started.pods
        && let Ok(Err(e)) = t.await
    {
        tracing::error!(error = %e, "pod runtime");
    }
    if let Some(t) = started.cluster {
        let _ = t.await;
    }
    for t in started.companion {
        let _ = t.await;
    }
    servers.main.shutdown().await;
    for s in servers.extra {
        s.shutdown().await;
    }
}

/// The node's start in every mode: swap refused where the enforcer runs pods (kubelet's
/// `failSwapOn`), the open-files limit raised, the state directory checked, the cgroup
/// layout discovered and the kernel probed, the daemon's own OOM score set.
fn start_node(config: &Config, run_pods: bool) -> Result<NodeStart, DaemonError> {
    if let Some(ip) = config.node_ip {
        node::set_node_ip(ip);
    }
    // kubelet's container manager refuses to start with swap on unless failSwapOn is false.
    if run_pods && config.fail_swap_on {
        match node::swap::swap_on() {
            Ok(areas) if !areas.is_empty() => return Err(DaemonError::SwapOn { areas }),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "reading /proc/swaps; assuming swap is off"),
        }
    }
    raise_nofile_limit();
    let health = Arc::new(Health::default());
    if let Err(e) = crate::health::probe_writable(&config.enforcer.state_dir) {
        tracing::error!(error = %e, "the pod status and uid ownership cannot be persisted; /healthz reports it");
        health.set_state(Some(e.to_string()));
    }
    let layout = CgroupLayout::discover()?;
    if let Err(e) = kernel::ebpf::ensure_tracefs() {
        tracing::warn!(error = %e, "tracefs is not mounted and could not be mounted");
    }
    let caps = Capabilities::probe(&layout);
    tracing::info!(
        version = crate::build::VERSION,
        commit = crate::build::COMMIT,
        "enforcer {} starting",
        crate::build::VERSION_LINE
    );
    tracing::info!(capabilities = %caps.summary(), "kernel probed");
    if !caps.cap_sys_resource {
        tracing::warn!(
            "no CAP_SYS_RESOURCE: negative oom_score_adj values are clamped to 0 and PSI windows widened to 2 s"
        );
    }
    // kubelet's own score, or the lowest this node allows (logged).
    crate::container_manager::set_own_oom_score_adj(caps.cap_sys_resource);
    Ok(NodeStart {
        health,
        layout,
        caps,
    })
}

/// kubelet's container manager where the enforcer is the node agent (standalone and
/// cluster mode): the kubepods cgroup and its QoS tiers made, and the CPU, memory and
/// topology managers where it runs the pods.
fn container_manager(
    config: &Config,
    layout: &CgroupLayout,
    capacity: &BTreeMap<String, Quantity>,
    run_pods: bool,
) -> Result<Arc<crate::container_manager::Enforcer>, DaemonError> {
    let kubepods_cgroups = crate::cgroup::kubepods::Kubepods::for_driver(
        &config.cgroup_root,
        layout.clone(),
        config.cgroup_driver,
    )
    .map_err(|source| crate::pods::RuntimeError::Cgroups {
        driver: config.cgroup_driver.as_str(),
        source,
    })?;
    let enforcer =
        crate::container_manager::Enforcer::from_config(config, kubepods_cgroups, capacity);
    // The CPU, memory and topology managers only where the enforcer runs the pods.
    let enforcer = Arc::new(if run_pods {
        // The NUMA cells for the memory and topology managers (one cell where sysfs has
        // no NUMA nodes).
        let numa = crate::container_manager::numa_topology(Path::new("/sys"), capacity)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "reading the NUMA cells");
                crate::policy::topology::NumaTopology::default()
            });
        enforcer
            .with_cpu_manager(config)?
            .with_resource_managers(config, &numa, capacity)?
    } else {
        enforcer
    });
    enforcer.sync_node_logged(std::iter::empty());
    Ok(enforcer)
}

/// The memory cgroups the signal pipeline watches: kubepods (made here with the cgroupfs
/// driver outside companion mode), once per memory threshold crossing, and `extra`.
fn kubepods_watches(
    config: &Config,
    layout: &CgroupLayout,
    observer: &NodeObserver,
    mode: Mode,
    extra: &[PathBuf],
) -> Result<Vec<Watch>, DaemonError> {
    let mut watches = Vec::new();
    if let Some(memory) = layout.memory() {
        let dir = memory.dir(&observer.kubepods)?;
        // systemd made the kubepods slice (or says why it could not above).
        if config.cgroup_driver == crate::policy::cgroup_name::CgroupDriver::Cgroupfs
            && !mode.is_companion()
            && let Err(e) = std::fs::create_dir_all(&dir)
        {
            tracing::warn!(path = %dir.display(), error = %e, "creating the kubepods cgroup");
        }
        // Usage-threshold watches on kubepods where each memory threshold (hard and soft,
        // memory.available and allocatableMemory.available) is crossed, so the crossing
        // itself wakes the manager (condition raised, grace period started, eviction).
        let crossings = memory_crossings(config, observer);
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
    watches.extend(extra.iter().map(|c| Watch {
        cgroup: c.clone(),
        threshold_bytes: None,
    }));
    Ok(watches)
}

/// Whether kubelet's secure port is served: where the daemon runs the node's pods (beside
/// kubelet, kubelet serves it), its port set. Standalone, as kubelet's `BuildAuth` with no API
/// client: a webhook asked for (`authentication.webhook.enabled: true`, `authorization.mode:
/// Webhook`) refuses the start with kubelet's message; the defaulted Webhook mode leaves the
/// port unserved (said once); otherwise client certificates and anonymous access with
/// `AlwaysAllow`, and at least one of them (kubelet's "No authentication method configured").
fn secure_port_served(config: &Config, mode: Mode, run_pods: bool) -> Result<bool, DaemonError> {
    let serving = &config.serving;
    if mode.is_companion() || !run_pods || serving.port == 0 {
        return Ok(false);
    }
    if mode == Mode::Cluster {
        return Ok(true);
    }
    let (authn, authz) = (&serving.authentication, &serving.authorization);
    if authn.webhook && authn.webhook_given {
        return Err(DaemonError::SecurePortStandalone(
            "no client provided, cannot use webhook authentication",
        ));
    }
    if authz.webhook && authz.mode_given {
        return Err(DaemonError::SecurePortStandalone(
            "no client provided, cannot use webhook authorization",
        ));
    }
    if authz.webhook {
        tracing::info!(
            port = serving.port,
            "standalone: the secure port is not served: authorization.mode defaults to Webhook, which needs an API server; authorization.mode: AlwaysAllow with client certificates (authentication.x509.clientCAFile) serves it"
        );
        return Ok(false);
    }
    if authn.client_ca_file.is_empty() && !authn.anonymous {
        return Err(DaemonError::SecurePortStandalone(
            "No authentication method configured",
        ));
    }
    Ok(true)
}

/// The daemon's HTTP servers: kubelet's secure port (when `secure_port`:
/// [`secure_port_served`]), the read-only port, the secure metrics port, and the main one.
async fn serve(
    config: &Config,
    secure_port: bool,
    kubeconfig: Option<&Path>,
    sources: impl Fn() -> server::Sources,
) -> Result<Servers, DaemonError> {
    let mut extra = Vec::new();
    let serving = &config.serving;
    if secure_port {
        let addr = SocketAddr::new(serving.address, serving.port);
        let secure = secure_port_options(config, kubeconfig);
        let s = server::serve_secure(addr, sources(), secure)
            .await
            .map_err(|source| DaemonError::Secure { addr, source })?;
        tracing::info!(addr = %s.addr, "serving the secure port (TLS, authentication, authorization): the pages, /containerLogs, /exec, /attach, /portForward");
        extra.push(s);
    }
    if serving.read_only_port != 0 {
        let addr = SocketAddr::new(serving.address, serving.read_only_port);
        let s = server::serve(addr, sources())
            .await
            .map_err(|source| DaemonError::Http { addr, source })?;
        tracing::info!(addr = %s.addr, "serving the read-only port (no authentication)");
        extra.push(s);
    }
    if let Some(s) = secure_metrics_port(config, kubeconfig, sources()).await? {
        extra.push(s);
    }
    let main = server::serve(config.enforcer.http_address, sources())
        .await
        .map_err(|source| DaemonError::Http {
            addr: config.enforcer.http_address,
            source,
        })?;
    tracing::info!(addr = %main.addr, "serving /metrics, /healthz, /configz, /pods, /stats/summary, /debug");
    Ok(Servers { main, extra })
}

/// kubelet's secure port's options, from the configuration's `serving` section.
fn secure_port_options(
    config: &Config,
    kubeconfig: Option<&Path>,
) -> server::secure::SecureOptions {
    let serving = &config.serving;
    server::secure::SecureOptions {
        cert_files: (!serving.tls_cert_file.is_empty() || !serving.tls_private_key_file.is_empty())
            .then(|| {
                (
                    PathBuf::from(&serving.tls_cert_file),
                    PathBuf::from(&serving.tls_private_key_file),
                )
            }),
        cert_dir: config.enforcer.state_dir.join("pki"),
        hostname: config.node_name(),
        client_ca: (!serving.authentication.client_ca_file.is_empty())
            .then(|| PathBuf::from(&serving.authentication.client_ca_file)),
        anonymous: serving.authentication.anonymous,
        // Without an API server no TokenReview: a bearer token is ignored, as kubelet
        // ignores it with no client.
        token_webhook: (serving.authentication.webhook && kubeconfig.is_some())
            .then_some(serving.authentication.webhook_cache_ttl),
        authz: if serving.authorization.webhook {
            server::secure::AuthzMode::Webhook {
                allowed_ttl: serving.authorization.cache_authorized_ttl,
                denied_ttl: serving.authorization.cache_unauthorized_ttl,
            }
        } else {
            server::secure::AuthzMode::AlwaysAllow
        },
        node_name: config.node_name(),
        kubeconfig: kubeconfig.map(Path::to_path_buf),
        bootstrap: serving.server_tls_bootstrap,
        addresses: crate::node::node_ip()
            .into_iter()
            .map(|ip| ip.to_string())
            .collect(),
    }
}

/// Events: kept in the state directory in every mode (`enforcer events`), passed on to the
/// API-server writer where there is one. Returns that writer's queue and the recorder.
fn keep_events(
    config: &Config,
    kubeconfig: Option<&Path>,
) -> (
    Option<crate::cluster::EventQueue>,
    crate::recorder::Recorder,
) {
    let events = kubeconfig.map(|_| crate::cluster::EventQueue::new());
    let kept = crate::cluster::EventQueue::new();
    let recorder = kept.recorder.clone();
    let store = match crate::cluster::event_store::EventStore::open(&config.enforcer.state_dir) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "events are not kept in the state directory");
            None
        }
    };
    tokio::spawn(crate::cluster::event_store::keep(
        kept.rx,
        store,
        config.node_name(),
        events.as_ref().map(|e| e.recorder.clone()),
    ));
    (events, recorder)
}

/// The kubepods cgroup of the crossing tripwire, with at least one memory threshold: the eBPF
/// crossing check's level where it attached (`levels`: nothing written, so also beside
/// kubelet), else, with `memoryTripwire` on (the default), v2 `memory.high` or a v1
/// usage-threshold eventfd.
fn tripwire_cgroup(
    config: &Config,
    layout: &CgroupLayout,
    kubepods: &str,
    levels: Option<crate::kernel::crossing::CrossingLevels>,
) -> Option<crate::eviction_manager::TripwireCgroup> {
    let memory = layout.memory()?;
    let memory_threshold = config.eviction.thresholds.iter().any(|t| {
        matches!(
            t.signal,
            EvictionSignal::MemoryAvailable | EvictionSignal::AllocatableMemoryAvailable
        )
    });
    if !memory_threshold || (levels.is_none() && !config.enforcer.memory_tripwire) {
        return None;
    }
    let dir = memory.dir(kubepods).ok()?;
    Some(crate::eviction_manager::TripwireCgroup::new(
        dir,
        memory.mount().to_path_buf(),
        match memory.crossing_notice() {
            CrossingNotice::UsageEventfd => TripwireHow::UsageEventfd,
            CrossingNotice::MemoryEvents => TripwireHow::MemoryHigh,
        },
        levels,
    ))
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

/// kubelet's image settings for the image manager and its collector.
fn image_options(config: &Config) -> crate::cri::images::ImageOptions {
    crate::cri::images::ImageOptions {
        serialize: config.serialize_image_pulls,
        max_parallel: config.images.max_parallel_image_pulls,
        qps: config.registry_pull_qps,
        burst: config.registry_burst,
        gc: crate::policy::images::gc::GcPolicy {
            high_percent: config.images.image_gc_high_threshold_percent,
            low_percent: config.images.image_gc_low_threshold_percent,
            min_age: config.images.image_minimum_gc_age,
            max_age: config.images.image_maximum_gc_age,
        },
        gc_period: config.enforcer.image_gc_period,
        secret_dir: config.enforcer.image_pull_secret_dir.clone(),
        // kubelet's `<root dir>/config.json`.
        node_config: config.enforcer.state_dir.join("config.json"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kubelet's `BuildAuth` standalone: a webhook asked for refuses the start with kubelet's
    /// message; the defaulted Webhook mode leaves the port unserved; `AlwaysAllow` with client
    /// certificates or anonymous serves it, with neither kubelet's "No authentication method
    /// configured"; in cluster mode and with port 0 nothing changes.
    #[test]
    fn the_secure_port_standalone_as_kubelets_build_auth() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("kubelet.yaml");
        std::fs::write(
            &file,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nauthentication:\n  webhook:\n    enabled: true\n",
        )
        .expect("config file");
        let served = |args: crate::config::ConfigArgs, mode: Mode| {
            let config = crate::config::load(&args).expect("config").config;
            secure_port_served(&config, mode, true).map_err(|e| e.to_string())
        };
        let always_allow = || crate::config::ConfigArgs {
            authorization_mode: Some("AlwaysAllow".to_owned()),
            client_ca_file: Some("/etc/enforcer/ca.crt".to_owned()),
            ..Default::default()
        };
        let defaults = crate::config::ConfigArgs::default;
        assert_eq!(served(defaults(), Mode::Standalone), Ok(false));
        assert_eq!(served(defaults(), Mode::Cluster), Ok(true));
        assert_eq!(served(always_allow(), Mode::Standalone), Ok(true));
        assert_eq!(
            served(
                crate::config::ConfigArgs {
                    port: Some(0),
                    ..always_allow()
                },
                Mode::Standalone
            ),
            Ok(false)
        );
        assert_eq!(
            served(
                crate::config::ConfigArgs {
                    authorization_mode: Some("Webhook".to_owned()),
                    ..defaults()
                },
                Mode::Standalone
            ),
            Err("no client provided, cannot use webhook authorization".to_owned())
        );
        assert_eq!(
            served(
                crate::config::ConfigArgs {
                    config: Some(file.clone()),
                    ..always_allow()
                },
                Mode::Standalone
            ),
            Err("no client provided, cannot use webhook authentication".to_owned())
        );
        assert_eq!(
            served(
                crate::config::ConfigArgs {
                    client_ca_file: None,
                    ..always_allow()
                },
                Mode::Standalone
            ),
            Err("No authentication method configured".to_owned())
        );
        assert_eq!(
            served(
                crate::config::ConfigArgs {
                    client_ca_file: None,
                    anonymous_auth: Some(true),
                    ..always_allow()
                },
                Mode::Standalone
            ),
            Ok(true)
        );
    }

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
        let observer = config.node_observer(&CgroupLayout::default(), &caps);
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
        let observer = plain.node_observer(&CgroupLayout::default(), &caps);
        assert!(memory_crossings(&plain, &observer).is_empty());
    }
}
