//! The pods (kubelet's `pkg/kubelet` core): the pod loop (`syncLoopIteration`), one pod worker
//! each, admission, probes and lifecycle hooks. The pods come from [`crate::sources`], run on
//! containerd through [`crate::cri`], in cgroups that [`crate::container_manager`] keeps, and
//! their statuses go to [`crate::status_manager`].
//!
//! - `pod_workers`: the loop's pods, one worker each (kubelet's `podWorkers`), and the loop's
//!   handlers (`pod_workers::sync_loop`).
//! - `admissions`: pod admission in the loop, with critical-pod preemption.
//! - [`worker`]: pod workers (syncing -> terminating -> terminated), crash backoff, kill.
//! - [`lifecycle`]: postStart and preStop hooks, the termination message.
//! - [`probe`]: startup, liveness and readiness probes (exec, httpGet, tcpSocket, grpc).
//! - [`volumes`]: the volumes a pod mounts, set up and torn down.
//! - [`objects`]: the configMaps, secrets and tokens pods read from the API server.
//! - [`records`]: the blank, Failed (rejected, evicted) and evicted status records.
//! - [`link`]: the link to the eviction manager (conditions, active pods, evictions).
//!
//! The private containerd with a local busybox image that tests, benchmarks and
//! `cargo xtask run` use is test tooling and lives in the `enforcer-tests` crate
//! (`enforcer_tests::local`, the `local-containerd` binary), not in the daemon.

mod admissions;
pub mod lifecycle;
pub mod link;
mod node_state;
pub mod objects;
mod pod_workers;
pub mod probe;
pub mod records;
pub mod volumes;
pub mod worker;

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::mpsc;

pub use admissions::Admission;
pub use link::{ActiveEntry, Evict, KillCompletion, KillDone, NodeLink};
pub use node_state::NodeStateCollector;
pub use records::{DISRUPTION_TARGET_REASON, evicted_status};
pub use worker::{PodWorker, Terminated, WorkUpdate, WorkerContext};

use crate::{
    cgroup::CgroupLayout,
    cri::{ContainerRuntime, CriRuntime, spec::NodeFacts},
    kernel::Capabilities,
    policy::admission::Admitter,
    quantity::{Format, Quantity},
    sources::{
        ManifestDir, PodUpdate,
        feeds::{ApiFeed, DirFeed, next_pod_events},
    },
    status_manager::{PodPhase, StatusManager},
};
use pod_workers::Pods;

/// Default manifest directory.
pub const DEFAULT_MANIFEST_DIR: &str = "/etc/enforcer/manifests";
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/enforcer";
/// Default CRI socket.
pub const DEFAULT_CRI_SOCKET: &str = "/run/containerd/containerd.sock";

/// Errors of the runtime module.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("state directory {path}: {source}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Status(#[from] crate::status_manager::StatusError),
    #[error("pod cgroups (cgroupDriver {driver}): {source}")]
    Cgroups {
        driver: &'static str,
        #[source]
        source: crate::cgroup::CgroupError,
    },
    /// kubelet's refusal of a driver the runtime does not run (`cmd/kubelet/app/server.go`).
    #[error(
        "misconfiguration: kubelet cgroup driver: {ours:?} is different from {runtime} cgroup driver: {theirs:?}"
    )]
    CgroupDriver {
        ours: &'static str,
        runtime: String,
        theirs: &'static str,
    },
}

/// Refuses to run pods with a cgroup driver the runtime does not use (its containers would
/// land outside the pod cgroups); a runtime that does not answer or say is not refused here.
async fn check_cgroup_driver<R: ContainerRuntime>(
    runtime: &R,
    ours: crate::policy::cgroup_name::CgroupDriver,
) -> Result<(), RuntimeError> {
    match runtime.cgroup_driver().await {
        Ok(Some(theirs)) if theirs != ours => {
            let name = runtime
                .version()
                .await
                .map_or_else(|_| "the runtime".to_owned(), |v| v.runtime_name);
            Err(RuntimeError::CgroupDriver {
                ours: ours.as_str(),
                runtime: name,
                theirs: theirs.as_str(),
            })
        }
        Ok(Some(_)) => Ok(()),
        Ok(None) => {
            tracing::info!(
                driver = ours.as_str(),
                "the runtime does not say which cgroup driver it uses: not checked"
            );
            Ok(())
        }
        Err(e) => {
            tracing::warn!(error = %e, "the runtime's cgroup driver could not be read: not checked");
            Ok(())
        }
    }
}

/// Everything `run_pods` needs; the world is passed in.
#[derive(Clone, Debug)]
pub struct RunPodsOptions {
    pub cri_socket: PathBuf,
    /// Per-call CRI timeout (calls that wait, like StopContainer, get their wait on top).
    pub cri_timeout: Duration,
    /// The cgroup root pods live under (`/` on a node, `/enforcer-test-<id>` in tests).
    pub cgroup_root: String,
    /// `cgroupDriver`: how pod cgroups are made when `enforce` has no kubepods hierarchy
    /// (with one, its driver).
    pub cgroup_driver: crate::policy::cgroup_name::CgroupDriver,
    pub layout: CgroupLayout,
    pub manifest_dir: PathBuf,
    pub state_dir: PathBuf,
    /// Static pod names get `-<node name>` appended, as kubelet does.
    pub node_name: String,
    pub node: NodeFacts,
    /// How often the manifest directory is read.
    pub poll: Duration,
    /// How often the runtime is relisted (kubelet's PLEG period).
    pub relist: Duration,
    /// Periodic resync of each pod worker.
    pub resync: Duration,
    /// Treat manifest-directory pods as kubelet static pods (critical: always admitted, never
    /// evicted). Off by default in standalone mode, where they are the node's workload.
    pub static_pods: bool,
    /// Admission (the node and its pod-security rules); `None` admits every pod.
    pub admission: Option<Admission>,
    /// Node conditions in; active pods and evictions out.
    pub link: NodeLink,
    /// The API-server pod source: this node's pods, watched with this kubeconfig.
    pub kubeconfig: Option<PathBuf>,
    /// kubepods / QoS tier cgroups, cgroup options, `oom_score_adj` verification.
    pub enforce: Arc<crate::container_manager::Enforcer>,
    /// Where the runtime's reachability and the state directory's writes are reported.
    pub health: Arc<crate::health::Health>,
    /// The pod workers' events (`Pulled`, `Created`, `Started`, `Killing`, `BackOff`,
    /// `Failed`); a default recorder drops them.
    pub events: crate::recorder::Recorder,
    /// `clusterDNS`, `clusterDomain`, `resolvConf`.
    pub dns: crate::policy::dns::DnsSettings,
    /// The image manager (pulls, secrets, the garbage collector); the daemon shares its
    /// collector with the eviction manager.
    pub images: Arc<crate::cri::images::ImageManager>,
}

/// The annotation manifest pods carry instead of `kubernetes.io/config.source` when they are
/// not treated as static pods.
pub const WORKLOAD_SOURCE_ANNOTATION: &str = "enforcer.io/config.source";

/// A manifest pod as a workload pod: not static, so admission and eviction apply to it.
pub(crate) fn as_workload(mut u: PodUpdate) -> PodUpdate {
    let has = u
        .pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(crate::sources::CONFIG_SOURCE_ANNOTATION));
    if has {
        let mut pod = (*u.pod).clone();
        if let Some(a) = pod.metadata.annotations.as_mut()
            && let Some(v) = a.remove(crate::sources::CONFIG_SOURCE_ANNOTATION)
        {
            a.insert(WORKLOAD_SOURCE_ANNOTATION.to_owned(), v);
        }
        u.pod = Arc::new(pod);
    }
    u
}

impl RunPodsOptions {
    /// Defaults for this node: socket, directories, node name from the hostname, memory
    /// capacity from /proc/meminfo, CAP_SYS_RESOURCE from the capability probe.
    #[must_use]
    pub fn for_node(layout: CgroupLayout, caps: &Capabilities) -> Self {
        Self {
            cri_socket: DEFAULT_CRI_SOCKET.into(),
            cri_timeout: Duration::from_secs(10),
            cgroup_root: "/".to_owned(),
            cgroup_driver: crate::policy::cgroup_name::CgroupDriver::Cgroupfs,
            layout,
            manifest_dir: DEFAULT_MANIFEST_DIR.into(),
            state_dir: DEFAULT_STATE_DIR.into(),
            node_name: crate::node::node_name(),
            node: NodeFacts {
                memory_capacity: crate::node::machine_memory().unwrap_or(0),
                cap_sys_resource: caps.cap_sys_resource,
            },
            poll: Duration::from_secs(1),
            relist: Duration::from_secs(1),
            resync: Duration::from_secs(10),
            static_pods: false,
            admission: None,
            link: NodeLink::default(),
            kubeconfig: None,
            enforce: Arc::default(),
            health: Arc::default(),
            events: crate::recorder::Recorder::default(),
            dns: crate::policy::dns::DnsSettings::default(),
            images: Arc::new(crate::cri::images::ImageManager::new(
                &crate::cri::images::ImageOptions {
                    node_config: std::path::Path::new(DEFAULT_STATE_DIR).join("config.json"),
                    ..Default::default()
                },
            )),
        }
    }
}

/// Runs pods from the manifest directory on the CRI runtime at `opts.cri_socket` until
/// `shutdown` resolves. Pods keep running after it returns; the next start adopts them.
pub async fn run_pods(
    opts: RunPodsOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RuntimeError> {
    let runtime = Arc::new(CriRuntime::new(opts.cri_socket.clone(), opts.cri_timeout));
    run_pods_with(runtime, opts, StatusManager::default(), shutdown).await
}

/// Relist period right after a poke.
const FAST_RELIST: Duration = Duration::from_millis(20);
/// How long relisting stays fast after a poke.
const FAST_RELIST_WINDOW: Duration = Duration::from_secs(2);

/// The node's allocatable as the downward API and memory emptyDirs read it: admission's,
/// else the machine's memory and CPUs.
fn downward_allocatable(opts: &RunPodsOptions) -> crate::policy::resources::ResourceList {
    if let Some(a) = &opts.admission {
        return a.node.allocatable.clone();
    }
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    [
        (
            "cpu",
            Quantity::from_int(i64::try_from(cpus).unwrap_or(1), Format::DecimalSI),
        ),
        (
            "memory",
            Quantity::from_int(opts.node.memory_capacity, Format::BinarySI),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The node's facts an in-place resize is decided against: admission's allocatable (else the
/// machine's), the allocatable before the eviction thresholds, the CPU and memory managers'
/// policies, swap.
fn resize_node(opts: &RunPodsOptions) -> crate::policy::resize::ResizeNode {
    let allocatable = downward_allocatable(opts);
    let node = opts.admission.as_ref().map_or_else(
        || crate::policy::admission::Node {
            allocatable: allocatable.clone(),
            ..Default::default()
        },
        |a| a.node.clone(),
    );
    let (cpu, memory) = opts.enforce.allocatable_absolute().unwrap_or_else(|| {
        let get = |k: &str| allocatable.get(k).copied().unwrap_or_default();
        (get("cpu").milli_value(), get("memory").value())
    });
    let cgroup = opts.enforce.cgroup_options();
    crate::policy::resize::ResizeNode {
        node,
        allocatable_absolute_milli_cpu: cpu,
        allocatable_absolute_memory: memory,
        cpu_manager_static: opts.enforce.cpu_manager_enabled(),
        memory_manager_static: opts.enforce.memory_manager_enabled(),
        swap: cgroup.swap,
        cgroup_v2: cgroup.v2,
        pod_level_resize: opts.enforce.pod_level_resize(),
    }
}

/// Unmounts the volumes of, and removes, every `<log root>/<uid>` whose uid is not `known`.
pub(crate) fn remove_stale_pod_dirs(log_root: &std::path::Path, known: impl Fn(&str) -> bool) {
    let Ok(rd) = std::fs::read_dir(log_root) else {
        return;
    };
    for e in rd.flatten() {
        let uid = e.file_name().to_string_lossy().into_owned();
        if !crate::sources::is_valid_uid(&uid) || known(&uid) || !e.path().is_dir() {
            continue;
        }
        let dir = e.path();
        tracing::info!(uid = %uid, path = %dir.display(), "removing the directory of a pod that no longer exists");
        match volumes::teardown(&dir) {
            Ok(()) => {
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    tracing::warn!(uid = %uid, path = %dir.display(), error = %e, "removing pod directory");
                }
            }
            Err(e) => {
                tracing::warn!(uid = %uid, error = %e, "tearing down volumes; the directory stays");
            }
        }
    }
}

/// [`run_pods`] with any runtime and a status manager the caller can read.
pub async fn run_pods_with<R: ContainerRuntime>(
    runtime: Arc<R>,
    opts: RunPodsOptions,
    status: StatusManager,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RuntimeError> {
    let kubepods = kubepods_of(&opts)?;
    check_cgroup_driver(runtime.as_ref(), kubepods.driver()).await?;
    let log_root = opts.state_dir.join("pods");
    std::fs::create_dir_all(&log_root).map_err(|source| RuntimeError::StateDir {
        path: log_root.clone(),
        source,
    })?;
    if !opts.node.cap_sys_resource {
        tracing::warn!(
            "no CAP_SYS_RESOURCE: negative oom_score_adj values (Guaranteed pods) are clamped to 0"
        );
    }
    let ctx = worker_context(&runtime, &opts, &status, kubepods, log_root);
    let (stop_writer_tx, stop_writer_rx) = tokio::sync::oneshot::channel::<()>();
    let writer = tokio::spawn(crate::status_manager::writer(
        status.clone(),
        opts.state_dir.clone(),
        opts.health.clone(),
        async {
            let _ = stop_writer_rx.await;
        },
    ));
    let mut source = DirFeed::start(
        ManifestDir::new(&opts.manifest_dir, &opts.node_name)
            .with_ownership_file(opts.state_dir.join(crate::sources::UID_OWNERS_FILE)),
        opts.poll,
    );
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Terminated>();
    let mut relist = pod_workers::Relist::new(opts.relist);
    let link = opts.link.clone();
    let (cpu_reconcile, cpu_task) = cpu_reconciler(&opts.enforce, &runtime);
    // kubelet's image garbage collection: at once, then every period.
    let image_gc = tokio::spawn(opts.images.gc.clone().run(
        runtime.clone(),
        opts.events.clone(),
        opts.node_name.clone(),
        std::future::pending(),
    ));
    let mut pods = pods_of(ctx.clone(), link.clone(), done_tx, &opts);
    // Evictions a previous run decided and the API server never heard of: those pods stay
    // evicted (not run again when their source lists them), their status delivered first.
    for rec in crate::status_manager::outbox::Outbox::evictions(&opts.state_dir) {
        tracing::info!(uid = %rec.uid, pod = %rec.name, "evicted by the last run: kept evicted");
        pods.keep_evicted(rec, &status);
    }
    tracing::info!(dir = %opts.manifest_dir.display(), socket = %opts.cri_socket.display(), cgroup_root = %opts.cgroup_root, "pod runtime started");
    // kubepods and the QoS tiers: kept in step with the admitted pods, re-checked every 10 s.
    opts.enforce.sync_node_logged(std::iter::empty());
    let mut reconcile = tokio::time::interval(crate::container_manager::RECONCILE_PERIOD);
    reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut api_source = opts
        .kubeconfig
        .clone()
        .map(|k| ApiFeed::start(k, &opts.node_name, opts.health.clone(), status.clone()));
    tokio::pin!(shutdown);

    loop {
        tokio::select! {
            () = &mut shutdown => break,
            events = next_pod_events(&mut source, &mut api_source) => {
                pods.handle_pod_events(events, &status, opts.static_pods, &cpu_reconcile);
            }
            _ = relist.timer.tick() => {
                let synced = source.synced && api_source.as_ref().is_none_or(|a| a.synced);
                pods.handle_relist(&mut relist, runtime.as_ref(), &opts.health, &opts.cri_socket, synced).await;
            }
            () = link.pokes_pending() => pods.handle_pokes(&mut relist),
            _ = reconcile.tick() => {
                pods.sync_node();
                cpu_reconcile.notify_one();
                pods.retry_resizes();
            }
            Some(terminated) = done_rx.recv() => {
                pods.handle_terminated(terminated, &status, &opts.enforce, &cpu_reconcile);
            }
            () = link.evictions_pending() => pods.handle_evictions(),
        }
        // Pods whose worker terminated while an update was queued are handled above; drop
        // pending entries of workers that are syncing normally.
        pods.settle_pending();
        crate::metrics::global().working_pods(&pods.working_pods(&status));
    }
    tracing::info!(
        pods = pods.worker_count(),
        "pod runtime stopping; pods keep running"
    );
    stop_pod_workers(source, pods, &status).await;
    if let Some(t) = cpu_task {
        t.abort();
    }
    image_gc.abort();
    let _ = stop_writer_tx.send(());
    let _ = writer.await;
    Ok(())
}

/// The longest the pod runtime waits for its workers when it stops.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// The enforcer's kubepods hierarchy (its driver) when it has one, else the driver's own.
fn kubepods_of(opts: &RunPodsOptions) -> Result<crate::cgroup::kubepods::Kubepods, RuntimeError> {
    Ok(match opts.enforce.kubepods() {
        Some(k) => k.clone(),
        None => crate::cgroup::kubepods::Kubepods::for_driver(
            &opts.cgroup_root,
            opts.layout.clone(),
            opts.cgroup_driver,
        )
        .map_err(|source| RuntimeError::Cgroups {
            driver: opts.cgroup_driver.as_str(),
            source,
        })?,
    })
}

/// The pods as the sync loop starts them: no worker yet, the admitter on the node's
/// allocatable, the allocations checkpoint read back.
fn pods_of<R: ContainerRuntime>(
    ctx: Arc<WorkerContext<R>>,
    link: NodeLink,
    done: mpsc::UnboundedSender<Terminated>,
    opts: &RunPodsOptions,
) -> Pods<R> {
    let admitter = opts
        .admission
        .clone()
        .map(|a| Admitter::new(a.node, a.security, std::iter::empty()));
    let allocations = crate::container_manager::allocation::Allocations::load(
        Some(
            opts.state_dir
                .join(crate::policy::resize::ALLOCATED_PODS_STATE_FILE),
        ),
        resize_node(opts),
        ctx.resizes.clone(),
    );
    Pods::new(ctx, link, done, admitter, allocations)
}

/// What every pod worker shares: the runtime, the pod cgroups under `kubepods`, the
/// container manager, the status manager, the downward API's node facts, the images.
fn worker_context<R: ContainerRuntime>(
    runtime: &Arc<R>,
    opts: &RunPodsOptions,
    status: &StatusManager,
    kubepods: crate::cgroup::kubepods::Kubepods,
    log_root: PathBuf,
) -> Arc<WorkerContext<R>> {
    Arc::new(WorkerContext {
        link: opts.link.clone(),
        runtime: runtime.clone(),
        cgroups: crate::container_manager::podcgroup::PodCgroups::with_kubepods(kubepods)
            .with_options(opts.enforce.cgroup_options()),
        enforce: opts.enforce.clone(),
        status: status.clone(),
        node: opts.node,
        log_root,
        downward: crate::policy::env::EnvContext {
            node_name: opts.node_name.clone(),
            // The Node's InternalIP (cluster mode's `status.hostIP`): the same probe.
            host_ips: crate::node::node_ip().into_iter().collect(),
            pod_ips: Vec::new(),
            allocatable: downward_allocatable(opts),
            objects: None,
        },
        resync: opts.resync,
        events: opts.events.clone(),
        dns: opts.dns.clone(),
        // Cluster mode: the ConfigMaps, Secrets and tokens of API pods.
        objects: opts
            .kubeconfig
            .clone()
            .map(|k| Arc::new(objects::ApiObjects::new(k))),
        images: opts.images.clone(),
        // kubelet's seccompProfileRoot: `<root dir>/seccomp`.
        security: crate::policy::security::SecurityOptions {
            seccomp_profile_root: opts.state_dir.join("seccomp").display().to_string(),
            seccomp_default: false,
        },
        resizes: crate::container_manager::allocation::ResizeBoard::default(),
    })
}

/// The pod runtime's stop: the manifest scans first (none runs, or writes the uid ownership
/// file, after this returns), then the pod workers, waited for a bounded time.
async fn stop_pod_workers<R: ContainerRuntime>(
    source: DirFeed,
    pods: Pods<R>,
    status: &StatusManager,
) {
    source.stop().await;
    let mut tasks = pods.into_tasks();
    // Bounded: a worker whose kill keeps failing (runtime gone, a stuck container) does not
    // hold the shutdown; what it leaves stays `Terminating` in the status file, and the next
    // start finishes it (the pod is no longer in any source: an orphan).
    let bound = tokio::time::sleep(SHUTDOWN_TIMEOUT);
    tokio::pin!(bound);
    loop {
        tokio::select! {
            r = tasks.join_next() => if r.is_none() { break },
            () = &mut bound => {
                let left = status.uids_in_phase(PodPhase::Terminating);
                tracing::warn!(
                    workers = tasks.len(),
                    terminating = ?left,
                    "shutdown: pod workers still killing after {SHUTDOWN_TIMEOUT:?}; leaving them to the next start"
                );
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
                break;
            }
        }
    }
}

/// The CPU manager's reconcile (cpusets through CRI): one task off the runtime loop, woken
/// by the returned `Notify` (wakes while it runs coalesce into one more pass); `None` task
/// without a CPU manager.
fn cpu_reconciler<R: ContainerRuntime>(
    enforce: &Arc<crate::container_manager::Enforcer>,
    runtime: &Arc<R>,
) -> (
    Arc<tokio::sync::Notify>,
    Option<tokio::task::JoinHandle<()>>,
) {
    let wake = Arc::new(tokio::sync::Notify::new());
    if !enforce.cpu_manager_enabled() {
        return (wake, None);
    }
    let (e, r, w) = (enforce.clone(), runtime.clone(), wake.clone());
    let task = tokio::spawn(async move {
        loop {
            w.notified().await;
            e.reconcile_cpusets(r.as_ref()).await;
        }
    });
    (wake, Some(task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cri::fake::FakeRuntime,
        policy::{
            admission::{self, SecurityPolicy},
            preemption,
        },
    };
    use std::path::Path;

    fn options(dir: &Path) -> RunPodsOptions {
        RunPodsOptions {
            cri_socket: dir.join("none.sock"),
            cri_timeout: Duration::from_secs(1),
            cgroup_root: "/".to_owned(),
            cgroup_driver: crate::policy::cgroup_name::CgroupDriver::Cgroupfs,
            layout: CgroupLayout::default(),
            manifest_dir: dir.join("manifests"),
            state_dir: dir.join("state"),
            node_name: "n1".to_owned(),
            node: NodeFacts {
                memory_capacity: 1 << 30,
                cap_sys_resource: false,
            },
            poll: Duration::from_secs(1),
            relist: Duration::from_secs(1),
            resync: Duration::from_secs(60),
            static_pods: true,
            admission: None,
            link: NodeLink::default(),
            kubeconfig: None,
            enforce: Arc::default(),
            health: Arc::default(),
            events: crate::recorder::Recorder::default(),
            dns: crate::policy::dns::DnsSettings::default(),
            images: Arc::new(crate::cri::images::ImageManager::new(
                &crate::cri::images::ImageOptions {
                    node_config: dir.join("state/config.json"),
                    ..Default::default()
                },
            )),
        }
    }

    /// kubelet's critical-pod preemption through the pod loop: a node-critical pod that
    /// lacks only cpu evicts the Burstable pod that frees it (status `Preempting` with
    /// kubelet's message and `DisruptionTarget`, kubelet's event, the metric), then runs; a
    /// second critical pod with nothing left to preempt is rejected as kubelet does.
    #[tokio::test(start_paused = true)]
    async fn a_critical_pod_preempts_the_pod_it_needs_room_from() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut opts = options(dir.path());
        opts.static_pods = false;
        let allocatable = [("cpu", "1"), ("memory", "1Gi"), ("pods", "110")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Quantity::parse(v).expect("quantity")))
            .collect();
        opts.admission = Some(Admission {
            node: admission::Node {
                name: "n1".to_owned(),
                allocatable,
                ..admission::Node::default()
            },
            security: SecurityPolicy::default(),
        });
        let events = crate::cluster::EventQueue::new();
        opts.events = events.recorder.clone();
        let mut events_rx = events.rx;
        std::fs::create_dir_all(&opts.manifest_dir).expect("mkdir");
        let manifest = |name: &str, uid: &str, class: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, uid: {uid}}}\nspec: {{{class}containers: [{{name: {name}, image: 'busybox:local', resources: {{requests: {{cpu: 600m}}}}}}]}}"
            )
        };
        let write = |file: &str, text: String| {
            std::fs::write(opts.manifest_dir.join(file), text).expect("manifest");
        };
        write("low.yaml", manifest("low", "u-low", ""));
        let fake = FakeRuntime::with_images(&["busybox:local"]);
        let status = StatusManager::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(run_pods_with(
            Arc::new(fake.clone()),
            opts.clone(),
            status.clone(),
            async {
                let _ = stopped.await;
            },
        ));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(fake.running(), ["low"]);
        let preemptions = || {
            let text =
                crate::metrics::encode(&[crate::metrics::global().registry()]).expect("encode");
            text.lines()
                .find_map(|l| {
                    l.strip_prefix("kubelet_preemptions_total{preemption_signal=\"cpu\"} ")
                })
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let before = preemptions();
        let critical = "priorityClassName: system-node-critical, ";
        write("crit.yaml", manifest("crit", "u-crit", critical));
        tokio::time::sleep(Duration::from_secs(40)).await;
        assert_eq!(fake.running(), ["crit"], "{:?}", status.snapshot());
        let low = status.get("u-low").expect("the preempted pod's status");
        assert_eq!(low.phase, PodPhase::Failed);
        assert_eq!(
            (low.reason.as_str(), low.message.as_str()),
            (preemption::REASON, preemption::MESSAGE)
        );
        let target = low
            .conditions
            .iter()
            .find(|c| c.kind == "DisruptionTarget")
            .expect("DisruptionTarget");
        assert_eq!(
            (target.reason.as_str(), target.message.as_str()),
            (DISRUPTION_TARGET_REASON, preemption::CONDITION_MESSAGE)
        );
        assert_eq!(
            status.get("u-crit").map(|r| r.phase),
            Some(PodPhase::Running)
        );
        assert!(
            preemptions() >= before + 1.0,
            "{before} -> {}",
            preemptions()
        );
        let mut preempting = Vec::new();
        while let Ok(e) = events_rx.try_recv() {
            if e.reason == preemption::REASON {
                preempting.push((e.involved.uid, e.message));
            }
        }
        assert_eq!(
            preempting,
            [("u-low".to_owned(), preemption::MESSAGE.to_owned())]
        );
        // Nothing left to preempt (the other critical pod is not preemptable): rejected.
        write("crit2.yaml", manifest("crit2", "u-crit2", critical));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let r = status.get("u-crit2").expect("the rejected pod's status");
        assert_eq!(
            (r.phase, r.reason.as_str()),
            (PodPhase::Failed, preemption::UNEXPECTED_ADMISSION_ERROR)
        );
        assert!(
            r.message.ends_with(
                "no set of running pods found to reclaim resources: [(res: cpu, q: 200), ]"
            ),
            "{}",
            r.message
        );
        assert_eq!(fake.running(), ["crit"]);
        let _ = stop.send(());
        run.await.expect("join").expect("run");
    }

    /// A restarted loop must not take the pods it is about to read from its manifest
    /// directory for orphans: the first relist and the first scan fire together.
    #[tokio::test(start_paused = true)]
    async fn restarts_adopt_running_pods_and_never_kill_them_as_orphans() {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = options(dir.path());
        std::fs::create_dir_all(&opts.manifest_dir).expect("mkdir");
        std::fs::write(
            opts.manifest_dir.join("p.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, uid: u1}\nspec: {containers: [{name: c, image: 'busybox:local'}]}",
        )
        .expect("manifest");
        let fake = FakeRuntime::with_images(&["busybox:local"]);
        let status = StatusManager::default();
        for _ in 0..12 {
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let run = tokio::spawn(run_pods_with(
                Arc::new(fake.clone()),
                options(dir.path()),
                status.clone(),
                async {
                    let _ = stopped.await;
                },
            ));
            tokio::time::sleep(Duration::from_secs(3)).await;
            let _ = stop.send(());
            run.await.expect("join").expect("run");
        }
        let calls = fake.calls();
        let snapshot = status.snapshot();
        let count = |op: &str| calls.iter().filter(|c| c.starts_with(op)).count();
        assert_eq!(count("RunPodSandbox"), 1, "{calls:?} {snapshot:?}");
        assert_eq!(count("StartContainer"), 1, "{calls:?}");
        assert_eq!(count("StopContainer"), 0, "{calls:?}");
        assert_eq!(count("StopPodSandbox"), 0, "{calls:?}");
        assert_eq!(fake.running(), ["c"]);
    }
}
