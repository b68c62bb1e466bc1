//! The status manager: the latest status of every pod, in kubelet's vocabulary (phase,
//! conditions, container states with reasons and exit codes, restart counts, start times),
//! written atomically to `<state dir>/pods.json` for `enforcer pods` and for recovery.

pub mod outbox;
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use serde::{Deserialize, Serialize};

pub use crate::policy::{
    pod_actions::PodPhase,
    pod_status::{Condition, ContainerRecord, ContainerState, PodRecord, rfc3339},
};
use tokio::sync::Notify;

/// The file `enforcer pods` reads.
pub const PODS_FILE: &str = "pods.json";

/// Errors of the status module.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// A manifest the source refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub file: String,
    pub message: String,
}

/// The node's status as the eviction manager reports it: kubelet's pressure conditions
/// (`MemoryPressure`, `DiskPressure`, `PIDPressure`), each `True` or `False`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

impl NodeRecord {
    /// The conditions whose status is `True`.
    #[must_use]
    pub fn true_conditions(&self) -> Vec<&str> {
        self.conditions
            .iter()
            .filter(|c| c.status == "True")
            .map(|c| c.kind.as_str())
            .collect()
    }
}

/// What `pods.json` holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusFile {
    pub pods: Vec<PodRecord>,
    #[serde(default)]
    pub rejected: Vec<Rejection>,
    #[serde(default)]
    pub node: NodeRecord,
}

#[derive(Debug, Default)]
struct Inner {
    pods: BTreeMap<String, PodRecord>,
    rejected: BTreeMap<String, Rejection>,
    node: NodeRecord,
    generation: u64,
    /// Told of every change (the API-server writers).
    subscribers: Vec<Arc<Notify>>,
    /// Whether removed records are kept for [`StatusManager::take_removed`].
    track_removed: bool,
    removed: Vec<PodRecord>,
    /// Pods being evicted: their final status is the eviction's, not the removed record
    /// (here as the eviction decided it, until its worker ends and the pod loop sets it).
    evicting: BTreeMap<String, PodRecord>,
    /// The API server's copy of each API pod's status, as its watch last showed it (kubelet's
    /// pod manager: what `needsReconcile` compares with).
    api: BTreeMap<String, k8s_openapi::api::core::v1::PodStatus>,
}

/// Shared, cheap to clone; workers set, the writer task persists.
#[derive(Clone, Debug, Default)]
pub struct StatusManager {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
}

impl StatusManager {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        let mut g = crate::locks::lock(&self.inner);
        f(&mut g)
    }

    /// Wakes the file writer and every subscriber.
    fn notify(&self) {
        self.changed.notify_one();
        for s in self.with(|i| i.subscribers.clone()) {
            s.notify_one();
        }
    }

    /// A wake-up for every later change (a permit is stored while nobody waits, so no change
    /// is missed between two waits).
    #[must_use]
    pub fn subscribe(&self) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        self.with(|i| i.subscribers.push(n.clone()));
        n
    }

    /// From now on, removed records are kept until [`Self::take_removed`] (the API-server
    /// pod status writer sends a terminated pod's final status from them).
    pub fn track_removed(&self) {
        self.with(|i| i.track_removed = true);
    }

    /// The records removed since the last call (pods whose worker terminated).
    #[must_use]
    pub fn take_removed(&self) -> Vec<PodRecord> {
        self.with(|i| std::mem::take(&mut i.removed))
    }

    /// The pod is being evicted, to end with the status `evicted`: its final status is that
    /// one, set once its worker terminated, not the record its worker removes. Until then the
    /// API writer keeps `evicted` in its outbox (a daemon that dies meanwhile still delivers
    /// it after the restart).
    pub fn evicting(&self, evicted: PodRecord) {
        self.with(|i| i.evicting.insert(evicted.uid.clone(), evicted));
        self.notify();
    }

    /// The final statuses of the pods being evicted, as the evictions decided them.
    #[must_use]
    pub fn evictions(&self) -> Vec<PodRecord> {
        self.with(|i| i.evicting.values().cloned().collect())
    }

    /// Sets a pod's status (no-op when unchanged).
    pub fn set(&self, record: PodRecord) {
        let changed = self.with(|i| {
            if i.pods.get(&record.uid) == Some(&record) {
                return false;
            }
            i.pods.insert(record.uid.clone(), record);
            i.generation += 1;
            true
        });
        if changed {
            self.notify();
        }
    }

    /// Forgets a pod (after it terminated).
    pub fn remove(&self, uid: &str) {
        if self.with(|i| {
            i.generation += 1;
            let removed = i.pods.remove(uid);
            let evicting = i.evicting.remove(uid).is_some();
            if let Some(rec) = &removed
                && i.track_removed
                && !evicting
            {
                i.removed.push(rec.clone());
            }
            removed.is_some()
        }) {
            self.notify();
        }
    }

    /// Records (or clears, with `None`) the rejection of a manifest file.
    pub fn set_rejection(&self, file: &str, message: Option<String>) {
        self.with(|i| {
            match message {
                Some(message) => i.rejected.insert(
                    file.to_owned(),
                    Rejection {
                        file: file.to_owned(),
                        message,
                    },
                ),
                None => i.rejected.remove(file),
            };
            i.generation += 1;
        });
        self.notify();
    }

    /// Sets the node's status (no-op when unchanged).
    pub fn set_node(&self, node: NodeRecord) {
        let changed = self.with(|i| {
            if i.node == node {
                return false;
            }
            i.node = node;
            i.generation += 1;
            true
        });
        if changed {
            self.notify();
        }
    }

    /// The node's status.
    #[must_use]
    pub fn node(&self) -> NodeRecord {
        self.with(|i| i.node.clone())
    }

    /// One pod's status.
    #[must_use]
    pub fn get(&self, uid: &str) -> Option<PodRecord> {
        self.with(|i| i.pods.get(uid).cloned())
    }

    /// The uids of the pods whose status is in `phase`.
    #[must_use]
    pub fn uids_in_phase(&self, phase: PodPhase) -> Vec<String> {
        self.with(|i| {
            i.pods
                .values()
                .filter(|r| r.phase == phase)
                .map(|r| r.uid.clone())
                .collect()
        })
    }

    /// Everything, as written to `pods.json`.
    #[must_use]
    pub fn snapshot(&self) -> (u64, StatusFile) {
        self.with(|i| {
            (
                i.generation,
                StatusFile {
                    pods: i.pods.values().cloned().collect(),
                    rejected: i.rejected.values().cloned().collect(),
                    node: i.node.clone(),
                },
            )
        })
    }

    /// The API server's copy of the pod `uid`'s status as its watch shows it now (`None`:
    /// the pod is gone from the API).
    pub fn api_seen(&self, uid: &str, status: Option<k8s_openapi::api::core::v1::PodStatus>) {
        self.with(|i| match status {
            Some(s) => {
                i.api.insert(uid.to_owned(), s);
            }
            None => {
                i.api.remove(uid);
            }
        });
    }

    /// The API server's copy of the pod `uid`'s status, as the watch last showed it.
    #[must_use]
    pub fn api_copy(&self, uid: &str) -> Option<k8s_openapi::api::core::v1::PodStatus> {
        self.with(|i| i.api.get(uid).cloned())
    }

    /// Waits for the next change.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// Writes `file` atomically (temp file in the same directory, fsync, rename, fsync of the
/// directory so the rename itself survives a crash).
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), StatusError> {
    use std::io::Write as _;
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| StatusError::Io { path: p, source }
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(data).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))?;
    }
    Ok(())
}

/// Persists the status on every change (at most every 100 ms) until `shutdown`.
pub async fn writer(
    status: StatusManager,
    state_dir: PathBuf,
    health: Arc<crate::health::Health>,
    shutdown: impl Future<Output = ()>,
) {
    let path = state_dir.join(PODS_FILE);
    let mut written = u64::MAX;
    tokio::pin!(shutdown);
    loop {
        let (generation, file) = status.snapshot();
        if generation != written {
            match serde_json::to_vec_pretty(&file) {
                Ok(data) => match write_atomic(&path, &data) {
                    Ok(()) => {
                        written = generation;
                        health.set_state(None);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "writing pod status");
                        health.set_state(Some(format!("writing pod status: {e}")));
                    }
                },
                Err(e) => tracing::warn!(error = %e, "encoding pod status"),
            }
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = status.changed() => {}
            () = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Final write so a restart starts from the latest status.
    let (generation, file) = status.snapshot();
    if generation != written
        && let Ok(data) = serde_json::to_vec_pretty(&file)
        && let Err(e) = write_atomic(&path, &data)
    {
        tracing::warn!(error = %e, "writing pod status");
    }
}

/// Reads `pods.json` from a state directory.
pub fn read(state_dir: &Path) -> Result<StatusFile, StatusError> {
    let path = state_dir.join(PODS_FILE);
    let text = std::fs::read(&path).map_err(|source| StatusError::Io {
        path: path.clone(),
        source,
    })?;
    serde_json::from_slice(&text).map_err(|source| StatusError::Json { path, source })
}

pub use crate::clock::now_nanos;
