//! The runtime side of the daemon: pods from their sources, through one pod worker each, onto
//! containerd over CRI, the way kubelet runs them.
//!
//! - [`cri`]: the [`ContainerRuntime`] trait and its CRI implementation (timeouts, reconnect).
//! - [`fake`]: a recording runtime for pipeline tests.
//! - [`source`]: the manifest directory (static pods), polled.
//! - [`worker`]: pod workers (syncing -> terminating -> terminated), crash backoff, kill.
//! - [`spec`]: Pod -> CRI configs, kubelet's labels and annotations.
//! - [`podcgroup`]: pod cgroups below the cgroup root.
//! - [`status`]: the status manager, `pods.json`, `enforcer pods`.
//! - [`image`]: the local busybox OCI image (tests, `cargo xtask run`).

pub mod backoff;
pub mod cri;
pub mod fake;
pub mod image;
pub mod podcgroup;
pub mod source;
pub mod spec;
pub mod status;
pub mod worker;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use k8s_cri::v1 as cri_api;
use tokio::{sync::mpsc, task::JoinSet};

pub use cri::{ContainerRuntime, CriError, CriRuntime};
pub use source::{ManifestDir, PodOp, PodUpdate, SourceEvent};
pub use spec::NodeFacts;
pub use status::StatusManager;
pub use worker::{PodWorker, WorkUpdate, WorkerContext};

use crate::{cgroup::CgroupLayout, kernel::Capabilities};

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
    Status(#[from] status::StatusError),
}

/// Everything `run_pods` needs; the world is passed in.
#[derive(Clone, Debug)]
pub struct RunPodsOptions {
    pub cri_socket: PathBuf,
    /// Per-call CRI timeout (calls that wait, like StopContainer, get their wait on top).
    pub cri_timeout: Duration,
    /// The cgroup root pods live under (`/` on a node, `/enforcer-test-<id>` in tests).
    pub cgroup_root: String,
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
            layout,
            manifest_dir: DEFAULT_MANIFEST_DIR.into(),
            state_dir: DEFAULT_STATE_DIR.into(),
            node_name: node_name(),
            node: NodeFacts {
                memory_capacity: memory_capacity(),
                cap_sys_resource: caps.cap_sys_resource,
            },
            poll: Duration::from_secs(1),
            relist: Duration::from_secs(1),
            resync: Duration::from_secs(10),
        }
    }
}

/// This machine's hostname, lowercased ("localhost" if unreadable).
#[must_use]
pub fn node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_lowercase())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// MemTotal in bytes (0 if unreadable).
#[must_use]
pub fn memory_capacity() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        })
        .map_or(0, |kb| kb.saturating_mul(1024))
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

struct Handle {
    tx: mpsc::UnboundedSender<WorkUpdate>,
}

/// [`run_pods`] with any runtime and a status manager the caller can read.
pub async fn run_pods_with<R: ContainerRuntime>(
    runtime: Arc<R>,
    opts: RunPodsOptions,
    status: StatusManager,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RuntimeError> {
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
    let ctx = Arc::new(WorkerContext {
        runtime: runtime.clone(),
        cgroups: podcgroup::PodCgroups::new(&opts.cgroup_root, opts.layout.clone()),
        status: status.clone(),
        node: opts.node,
        log_root,
        resync: opts.resync,
    });
    let (stop_writer_tx, stop_writer_rx) = tokio::sync::oneshot::channel::<()>();
    let writer = tokio::spawn(status::writer(
        status.clone(),
        opts.state_dir.clone(),
        async {
            let _ = stop_writer_rx.await;
        },
    ));
    let mut source = ManifestDir::new(&opts.manifest_dir, &opts.node_name);
    let mut workers: HashMap<String, Handle> = HashMap::new();
    let mut pending: HashMap<String, PodUpdate> = HashMap::new();
    let mut tasks = JoinSet::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<String>();
    let mut fingerprints: HashMap<String, String> = HashMap::new();
    let mut poll = tokio::time::interval(opts.poll);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut relist = tokio::time::interval(opts.relist);
    relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut orphans_pending = true;
    tracing::info!(dir = %opts.manifest_dir.display(), socket = %opts.cri_socket.display(), cgroup_root = %opts.cgroup_root, "pod runtime started");
    tokio::pin!(shutdown);

    let spawn = |tasks: &mut JoinSet<()>,
                 workers: &mut HashMap<String, Handle>,
                 worker: PodWorker<R>,
                 uid: String,
                 done: mpsc::UnboundedSender<String>| {
        let (tx, rx) = mpsc::unbounded_channel();
        workers.insert(uid, Handle { tx });
        tasks.spawn(worker.run(rx, done));
    };

    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = poll.tick() => {
                for ev in source.scan() {
                    match ev {
                        SourceEvent::Rejected { file, message } => status.set_rejection(&file, message),
                        SourceEvent::Synced => {}
                        SourceEvent::Pod(u) => {
                            let uid = u.pod.metadata.uid.clone().unwrap_or_default();
                            tracing::info!(uid = %uid, op = ?u.op, source = %u.source, "pod update");
                            match (u.op, workers.get(&uid)) {
                                (PodOp::Delete, Some(h)) => {
                                    pending.remove(&uid);
                                    let _ = h.tx.send(WorkUpdate::Kill { grace: None });
                                }
                                (PodOp::Delete, None) => { pending.remove(&uid); }
                                (_, Some(h)) => {
                                    // A terminating worker ignores it; it is re-added when done.
                                    pending.insert(uid.clone(), u.clone());
                                    let _ = h.tx.send(WorkUpdate::Sync { pod: u.pod, source: u.source });
                                }
                                (_, None) => {
                                    let w = PodWorker::new(ctx.clone(), u.pod, u.source);
                                    spawn(&mut tasks, &mut workers, w, uid, done_tx.clone());
                                }
                            }
                        }
                    }
                }
            }
            _ = relist.tick() => {
                match relist_runtime(runtime.as_ref()).await {
                    Ok(now) => {
                        if orphans_pending {
                            orphans_pending = false;
                            for uid in now.keys() {
                                if !workers.contains_key(uid) {
                                    tracing::info!(uid = %uid, "removing pod unknown to every source");
                                    let w = PodWorker::orphan(ctx.clone(), uid.clone());
                                    spawn(&mut tasks, &mut workers, w, uid.clone(), done_tx.clone());
                                }
                            }
                        }
                        for (uid, fp) in &now {
                            if fingerprints.get(uid) != Some(fp)
                                && let Some(h) = workers.get(uid)
                            {
                                let _ = h.tx.send(WorkUpdate::Relist);
                            }
                        }
                        fingerprints = now;
                    }
                    Err(e) => tracing::debug!(error = %e, "relist failed"),
                }
            }
            Some(uid) = done_rx.recv() => {
                workers.remove(&uid);
                if let Some(u) = pending.remove(&uid)
                    && u.op != PodOp::Delete
                {
                    let w = PodWorker::new(ctx.clone(), u.pod, u.source);
                    spawn(&mut tasks, &mut workers, w, uid, done_tx.clone());
                }
            }
        }
        // Pods whose worker terminated while an update was queued are handled above; drop
        // pending entries of workers that are syncing normally.
        pending.retain(|uid, _| workers.contains_key(uid));
    }
    tracing::info!(
        pods = workers.len(),
        "pod runtime stopping; pods keep running"
    );
    drop(workers);
    while tasks.join_next().await.is_some() {}
    let _ = stop_writer_tx.send(());
    let _ = writer.await;
    Ok(())
}

/// Lists the managed sandboxes and containers: per pod uid, a fingerprint of their states.
async fn relist_runtime<R: ContainerRuntime>(
    runtime: &R,
) -> Result<HashMap<String, String>, CriError> {
    let managed = HashMap::from([(spec::MANAGED_LABEL.to_owned(), "true".to_owned())]);
    let sandboxes = runtime
        .list_pod_sandboxes(cri_api::PodSandboxFilter {
            label_selector: managed.clone(),
            ..Default::default()
        })
        .await?;
    let containers = runtime
        .list_containers(cri_api::ContainerFilter {
            label_selector: managed,
            ..Default::default()
        })
        .await?;
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    let mut seen = HashSet::new();
    for s in &sandboxes {
        if let Some(uid) = s.labels.get(spec::POD_UID_LABEL) {
            seen.insert(uid.clone());
            out.entry(uid.clone())
                .or_default()
                .push(format!("s{}:{}", s.id, s.state));
        }
    }
    for c in &containers {
        if let Some(uid) = c.labels.get(spec::POD_UID_LABEL) {
            out.entry(uid.clone())
                .or_default()
                .push(format!("c{}:{}", c.id, c.state));
        }
    }
    Ok(out
        .into_iter()
        .map(|(uid, mut v)| {
            v.sort();
            (uid, v.join(","))
        })
        .collect())
}
