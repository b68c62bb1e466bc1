//! The API-server pod source: the Pods whose `spec.nodeName` is this node, watched with
//! `kube` (list, then watch, re-listing with backoff when the watch breaks), turned into the
//! same ADD / UPDATE / DELETE [`PodUpdate`] stream the manifest directory produces.
//!
//! - A pod that is new is ADD, a changed one UPDATE, an unchanged one nothing.
//! - A pod deleted, or given a `deletionTimestamp` (graceful deletion), or finished
//!   (`status.phase` Succeeded / Failed: kubelet never restarts those) is DELETE.
//! - After a re-list, known pods that are no longer listed are DELETE (missed deletions).
//! - A pod that fails validation (the manifest source's rules) is reported as rejected under
//!   `api:<namespace>/<name>` and otherwise ignored; nothing else changes.
//!
//! [`ApiPods::step`] is the pure part (watch events in, source events out); [`spawn`] runs the
//! watcher against a kubeconfig's cluster.

pub mod retry_after;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::{sync::mpsc, task::JoinHandle};

use crate::sources::{PodOp, PodUpdate, SourceEvent, validate};

/// The `source` of API-server pod updates.
pub const API_SOURCE: &str = "api";

/// Errors of the API-server source; each names the kubeconfig it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ApiSourceError {
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("API client from kubeconfig {path}: {source}")]
    Client {
        path: PathBuf,
        #[source]
        source: kube::Error,
    },
}

/// A kube client for the cluster (and user) of the kubeconfig's current context, honouring
/// `Retry-After` as client-go does ([`retry_after`]).
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, ApiSourceError> {
    let kubeconfig =
        kube::config::Kubeconfig::read_from(path).map_err(|source| ApiSourceError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|source| ApiSourceError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    })?;
    let builder =
        kube::client::ClientBuilder::try_from(config).map_err(|source| ApiSourceError::Client {
            path: path.to_path_buf(),
            source,
        })?;
    // client-go's `Retry-After`: the retry needs a service it can call again (the buffer).
    Ok(builder
        .with_layer(&tower::buffer::BufferLayer::new(1024))
        .with_layer(&tower::retry::RetryLayer::new(
            retry_after::RetryAfter::default(),
        ))
        .build())
}

/// The rejection key of an API pod (where a manifest source would name its file).
fn key_of(pod: &Pod) -> String {
    format!(
        "{API_SOURCE}:{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// Whether the pod should not (or no longer) run here.
fn is_gone(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed")
}

/// The API-server source's state: the pods it has reported, by uid.
#[derive(Debug, Default)]
pub struct ApiPods {
    known: HashMap<String, Arc<Pod>>,
    /// Rejection keys currently reported.
    rejected: HashMap<String, String>,
    /// Pods listed since the last `Init` (a re-list in progress).
    listing: Option<HashMap<String, Pod>>,
    synced: bool,
}

impl ApiPods {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The pods currently running from this source, by uid.
    #[must_use]
    pub fn known(&self) -> &HashMap<String, Arc<Pod>> {
        &self.known
    }

    fn delete(&mut self, uid: &str, out: &mut Vec<SourceEvent>) {
        if let Some(pod) = self.known.remove(uid) {
            out.push(SourceEvent::Pod(PodUpdate {
                op: PodOp::Delete,
                pod,
                source: API_SOURCE.to_owned(),
            }));
        }
    }

    fn clear_rejection(&mut self, key: &str, out: &mut Vec<SourceEvent>) {
        if self.rejected.remove(key).is_some() {
            out.push(SourceEvent::Rejected {
                file: key.to_owned(),
                message: None,
            });
        }
    }

    /// One pod as listed or watched: ADD, UPDATE, DELETE, a rejection, or nothing.
    fn apply(&mut self, mut pod: Pod, out: &mut Vec<SourceEvent>) {
        // A mirror pod is the API's copy of a static pod this node runs from its manifest
        // directory: never run it again.
        if crate::policy::resources::is_mirror(&pod) {
            return;
        }
        let key = key_of(&pod);
        let Some(uid) = pod.metadata.uid.clone().filter(|u| !u.is_empty()) else {
            let message = format!("{key}: metadata.uid: required");
            if self.rejected.get(&key) != Some(&message) {
                tracing::warn!(pod = %key, "API pod rejected: no uid");
                self.rejected.insert(key.clone(), message.clone());
                out.push(SourceEvent::Rejected {
                    file: key,
                    message: Some(message),
                });
            }
            return;
        };
        if is_gone(&pod) {
            self.clear_rejection(&key, out);
            self.delete(&uid, out);
            return;
        }
        if let Err(why) = validate(&pod) {
            let message = format!("{key}: {why}");
            if self.rejected.get(&key) != Some(&message) {
                tracing::warn!(pod = %key, uid = %uid, error = %why, "API pod rejected; the pod (if it ran) is kept as it was");
                self.rejected.insert(key.clone(), message.clone());
                out.push(SourceEvent::Rejected {
                    file: key,
                    message: Some(message),
                });
            }
            return;
        }
        self.clear_rejection(&key, out);
        crate::policy::resources::apply_defaults(&mut pod);
        // Status and bookkeeping fields change all the time; only the desired state matters.
        pod.status = None;
        pod.metadata.resource_version = None;
        pod.metadata.managed_fields = None;
        let op = match self.known.get(&uid) {
            Some(old) if **old == pod => return,
            Some(_) => PodOp::Update,
            None => PodOp::Add,
        };
        let pod = Arc::new(pod);
        self.known.insert(uid, pod.clone());
        out.push(SourceEvent::Pod(PodUpdate {
            op,
            pod,
            source: API_SOURCE.to_owned(),
        }));
    }

    /// Folds one watcher event into source events.
    pub fn step(&mut self, event: watcher::Event<Pod>) -> Vec<SourceEvent> {
        let mut out = Vec::new();
        match event {
            watcher::Event::Init => self.listing = Some(HashMap::new()),
            watcher::Event::InitApply(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                match self.listing.as_mut() {
                    Some(listing) => {
                        listing.insert(uid, pod);
                    }
                    None => self.apply(pod, &mut out),
                }
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let missing: Vec<String> = self
                    .known
                    .keys()
                    .filter(|uid| !listed.contains_key(*uid))
                    .cloned()
                    .collect();
                for uid in missing {
                    self.delete(&uid, &mut out);
                }
                for (_, pod) in listed {
                    self.apply(pod, &mut out);
                }
                if !self.synced {
                    self.synced = true;
                    out.push(SourceEvent::Synced);
                }
            }
            watcher::Event::Apply(pod) => self.apply(pod, &mut out),
            watcher::Event::Delete(pod) => {
                let key = key_of(&pod);
                self.clear_rejection(&key, &mut out);
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    self.delete(uid, &mut out);
                }
            }
        }
        out
    }
}

/// The watcher config: this node's pods only (`spec.nodeName=<node>`).
#[must_use]
pub fn watch_config(node_name: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("spec.nodeName={node_name}"))
}

/// Watches the pods of `node_name` through `client` until `tx` is closed, sending source
/// events; the watch is restarted with backoff whenever it fails.
pub async fn watch_pods(
    client: kube::Client,
    node_name: String,
    tx: mpsc::UnboundedSender<SourceEvent>,
    health: Option<Arc<crate::health::Health>>,
    status: Option<crate::status_manager::StatusManager>,
) {
    let ready = |why: Option<String>| api_ready(health.as_deref(), why);
    let api: kube::Api<Pod> = kube::Api::all(client);
    let stream = watcher(api, watch_config(&node_name)).default_backoff();
    futures::pin_mut!(stream);
    let mut state = ApiPods::new();
    let mut failing = false;
    loop {
        let next = tokio::select! {
            () = tx.closed() => return,
            next = stream.next() => next,
        };
        match next {
            None => return,
            Some(Err(e)) => {
                if !failing {
                    tracing::warn!(node = %node_name, error = %e, "API-server pod watch failed; retrying with backoff");
                }
                ready(Some(format!(
                    "the pod watch of node {node_name} fails: {e}"
                )));
                failing = true;
            }
            Some(Ok(event)) => {
                if failing {
                    tracing::info!(node = %node_name, "API-server pod watch resumed");
                    failing = false;
                }
                ready(None);
                if let Some(status) = &status {
                    note_api_status(status, &event);
                }
                for ev in state.step(event) {
                    if tx.send(ev).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// The API's copy of a watched pod's status for the status writer's `needsReconcile`: by the
/// node's uid of the pod (a mirror pod's is the static pod's, its `config.mirror` hash).
fn note_api_status(status: &crate::status_manager::StatusManager, event: &watcher::Event<Pod>) {
    let node_uid = |pod: &Pod| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::policy::resources::CONFIG_MIRROR_ANNOTATION))
            .or(pod.metadata.uid.as_ref())
            .cloned()
    };
    match event {
        watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
            if let Some(uid) = node_uid(pod) {
                status.api_seen(&uid, Some(pod.status.clone().unwrap_or_default()));
            }
        }
        watcher::Event::Delete(pod) => {
            if let Some(uid) = node_uid(pod) {
                status.api_seen(&uid, None);
            }
        }
        watcher::Event::Init | watcher::Event::InitDone => {}
    }
}

/// The API server's part of `/readyz`: `why` it is not reachable, or `None`.
fn api_ready(health: Option<&crate::health::Health>, why: Option<String>) {
    if let Some(h) = health {
        h.set_not_ready("apiserver", why);
    }
}

/// Starts the API-server source for the kubeconfig's cluster: the receiver gets its events;
/// dropping it stops the watch. A kubeconfig that cannot be loaded is retried every 10 s
/// (and logged), so a bad file never stops the other pod sources.
#[must_use]
pub fn spawn(
    kubeconfig: PathBuf,
    node_name: String,
    health: Option<Arc<crate::health::Health>>,
    status: Option<crate::status_manager::StatusManager>,
) -> (mpsc::UnboundedReceiver<SourceEvent>, JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        api_ready(health.as_deref(), Some("connecting".to_owned()));
        let client = loop {
            match client_from_kubeconfig(&kubeconfig).await {
                Ok(c) => break c,
                Err(e) => {
                    api_ready(health.as_deref(), Some(e.to_string()));
                    tracing::error!(error = %e, "API-server pod source cannot start; retrying in 10 s");
                    tokio::select! {
                        () = tx.closed() => return,
                        () = tokio::time::sleep(Duration::from_secs(10)) => {}
                    }
                }
            }
        };
        tracing::info!(kubeconfig = %kubeconfig.display(), node = %node_name, "watching API-server pods");
        watch_pods(client, node_name, tx, health, status).await;
    });
    (rx, task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
    use kube::api::ObjectMeta;

    fn pod(name: &str, uid: &str, image: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("default".to_owned()),
                uid: Some(uid.to_owned()),
                resource_version: Some("1".to_owned()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".to_owned()),
                containers: vec![Container {
                    name: "c".to_owned(),
                    image: Some(image.to_owned()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    fn ops(evs: &[SourceEvent]) -> Vec<String> {
        evs.iter()
            .map(|e| match e {
                SourceEvent::Pod(u) => format!(
                    "{:?} {}",
                    u.op,
                    u.pod.metadata.uid.as_deref().unwrap_or_default()
                ),
                SourceEvent::Rejected { file, message } => {
                    format!("Rejected {file} {}", message.is_some())
                }
                SourceEvent::Synced => "Synced".to_owned(),
            })
            .collect()
    }

    #[test]
    fn list_then_watch_becomes_add_update_delete() {
        let mut s = ApiPods::new();
        assert!(s.step(watcher::Event::Init).is_empty());
        assert!(
            s.step(watcher::Event::InitApply(pod("a", "u1", "busybox")))
                .is_empty()
        );
        assert_eq!(ops(&s.step(watcher::Event::InitDone)), ["Add u1", "Synced"]);
        // Only the resource version / status changed: nothing.
        let mut same = pod("a", "u1", "busybox");
        same.metadata.resource_version = Some("2".to_owned());
        same.status = Some(PodStatus {
            phase: Some("Running".to_owned()),
            ..Default::default()
        });
        assert!(s.step(watcher::Event::Apply(same)).is_empty());
        assert_eq!(
            ops(&s.step(watcher::Event::Apply(pod("a", "u1", "busybox:2")))),
            ["Update u1"]
        );
        assert_eq!(
            ops(&s.step(watcher::Event::Apply(pod("b", "u2", "busybox")))),
            ["Add u2"]
        );
        assert_eq!(
            ops(&s.step(watcher::Event::Delete(pod("a", "u1", "busybox")))),
            ["Delete u1"]
        );
        // A deleted pod deleted again: nothing.
        assert!(
            s.step(watcher::Event::Delete(pod("a", "u1", "busybox")))
                .is_empty()
        );
    }

    #[test]
    fn relist_deletes_missed_pods_and_graceful_deletion_kills() {
        let mut s = ApiPods::new();
        s.step(watcher::Event::Init);
        s.step(watcher::Event::InitApply(pod("a", "u1", "busybox")));
        s.step(watcher::Event::InitApply(pod("b", "u2", "busybox")));
        s.step(watcher::Event::InitDone);
        s.step(watcher::Event::Init);
        s.step(watcher::Event::InitApply(pod("b", "u2", "busybox")));
        assert_eq!(ops(&s.step(watcher::Event::InitDone)), ["Delete u1"]);
        let mut deleting = pod("b", "u2", "busybox");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(ops(&s.step(watcher::Event::Apply(deleting))), ["Delete u2"]);
        let mut done = pod("c", "u3", "busybox");
        done.status = Some(PodStatus {
            phase: Some("Succeeded".to_owned()),
            ..Default::default()
        });
        assert!(s.step(watcher::Event::Apply(done)).is_empty());
        assert!(s.known().is_empty());
    }

    #[test]
    fn invalid_pods_are_rejected_without_touching_others() {
        let mut s = ApiPods::new();
        s.step(watcher::Event::Apply(pod("a", "u1", "busybox")));
        let mut bad = pod("b", "../x", "busybox");
        bad.metadata.name = Some("b".to_owned());
        assert_eq!(
            ops(&s.step(watcher::Event::Apply(bad))),
            ["Rejected api:default/b true"]
        );
        let mut no_containers = pod("a", "u1", "busybox");
        if let Some(spec) = no_containers.spec.as_mut() {
            spec.containers.clear();
        }
        assert_eq!(
            ops(&s.step(watcher::Event::Apply(no_containers))),
            ["Rejected api:default/a true"]
        );
        assert_eq!(s.known().len(), 1, "the running pod is kept");
        assert_eq!(
            ops(&s.step(watcher::Event::Apply(pod("a", "u1", "busybox")))),
            ["Rejected api:default/a false"]
        );
    }

    /// A mirror pod (a static pod's copy in the API) is never run from the API.
    #[test]
    fn mirror_pods_are_not_run() {
        let mut s = ApiPods::new();
        let mut mirror = pod("etcd-n1", "m1", "etcd");
        mirror.metadata.annotations = Some(std::collections::BTreeMap::from([(
            "kubernetes.io/config.mirror".to_owned(),
            "hash".to_owned(),
        )]));
        assert!(s.step(watcher::Event::Apply(mirror)).is_empty());
        assert!(s.known().is_empty());
    }

    #[test]
    fn the_watch_selects_this_node() {
        let c = watch_config("node-1");
        assert_eq!(c.field_selector.as_deref(), Some("spec.nodeName=node-1"));
    }
}
