//! Mirror pods (kubelet's `pkg/kubelet/pod/mirror_client.go`): every static pod (a
//! manifest-directory pod run with `--static-pods`) gets a read-only copy in the API server,
//! so the cluster sees it: the same name, namespace, labels and spec, the annotation
//! `kubernetes.io/config.mirror` set to the static pod's hash, and the Node as its controller
//! owner. A mirror whose hash is not the static pod's any more is deleted and created again; a
//! mirror deleted by someone else is created again; the mirror of a static pod that is gone is
//! deleted (grace 0, its uid as precondition). The static pod's status is written to its
//! mirror ([`super::pod_status`]). The API-server source never runs a mirror pod.
//!
//! Mirrors created by an earlier run of the daemon whose static pod is gone are not found (the
//! node does not list its pods for them).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::OwnerReference};

use super::{ClusterApi, ClusterError, backoff};
use crate::{
    cri::spec::PodIdent,
    pods::NodeLink,
    policy::resources::{CONFIG_MIRROR_ANNOTATION, is_mirror, is_static},
    sources::CONFIG_HASH_ANNOTATION,
    status_manager::StatusManager,
};

/// A mirror pod's hash (its static pod's `kubernetes.io/config.hash`).
#[must_use]
pub fn mirror_hash(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_MIRROR_ANNOTATION))
        .map(String::as_str)
}

/// A static pod's hash: `kubernetes.io/config.hash`, else its uid.
#[must_use]
pub fn static_hash(pod: &Pod) -> String {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION))
        .cloned()
        .or_else(|| pod.metadata.uid.clone())
        .unwrap_or_default()
}

/// The mirror of a static pod (kubelet's `CreateMirrorPod`).
#[must_use]
pub fn mirror_of(static_pod: &Pod, node: &str, node_uid: &str) -> Pod {
    let mut pod = static_pod.clone();
    let hash = static_hash(static_pod);
    pod.metadata.uid = None;
    pod.metadata.resource_version = None;
    pod.metadata.managed_fields = None;
    pod.metadata.creation_timestamp = None;
    pod.metadata
        .annotations
        .get_or_insert_default()
        .insert(CONFIG_MIRROR_ANNOTATION.to_owned(), hash);
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: node.to_owned(),
        uid: node_uid.to_owned(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node.to_owned());
    }
    pod.status = None;
    pod
}

/// The static pods the node runs, by (namespace, name).
fn desired(link: &NodeLink) -> BTreeMap<(String, String), Arc<Pod>> {
    link.active()
        .values()
        .filter(|e| is_static(&e.pod))
        .map(|e| {
            let id = PodIdent::of(&e.pod);
            ((id.namespace, id.name), e.pod.clone())
        })
        .collect()
}

/// Makes the mirror of `static_pod` exist with its hash; returns whether it does.
async fn ensure<A: ClusterApi>(
    api: &A,
    static_pod: &Pod,
    node: &str,
    node_uid: &str,
) -> Result<bool, ClusterError> {
    let PodIdent {
        name,
        namespace: ns,
        ..
    } = PodIdent::of(static_pod);
    let hash = static_hash(static_pod);
    match api.get_pod(&ns, &name).await? {
        Some(existing) if mirror_hash(&existing) == Some(hash.as_str()) => return Ok(true),
        Some(existing) if is_mirror(&existing) => {
            tracing::info!(pod = %name, namespace = %ns, "mirror pod out of date; recreating it");
            let uid = existing.metadata.uid.clone().unwrap_or_default();
            match api.delete_pod(&ns, &name, &uid).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() || e.is_conflict() => {}
                Err(e) => return Err(e),
            }
        }
        Some(_) => {
            tracing::warn!(pod = %name, namespace = %ns, "a pod that is no mirror has the static pod's name; no mirror pod");
            return Ok(false);
        }
        None => {}
    }
    match api.create_pod(&mirror_of(static_pod, node, node_uid)).await {
        Ok(_) => {
            tracing::info!(pod = %name, namespace = %ns, "mirror pod created");
            Ok(true)
        }
        Err(e) if e.is_already_exists() => Ok(false),
        Err(e) => Err(e),
    }
}

/// How often the mirrors are checked without a change (kubelet checks on every pod sync).
const RECHECK: Duration = Duration::from_secs(10);

/// Keeps a mirror pod for every static pod until cancelled.
pub async fn run<A: ClusterApi>(api: Arc<A>, link: NodeLink, status: StatusManager, node: String) {
    let changed = status.subscribe();
    // (namespace, name) -> hash of the mirrors known to exist.
    let mut mirrors: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut node_uid: Option<String> = None;
    let mut failures = 0u32;
    let mut tick = tokio::time::interval(RECHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let recheck = tokio::select! {
            _ = tick.tick() => true,
            () = changed.notified() => false,
        };
        let want = desired(&link);
        let mut failed = false;
        if !want.is_empty() && node_uid.is_none() {
            node_uid = api
                .get_node(&node)
                .await
                .ok()
                .flatten()
                .and_then(|n| n.metadata.uid);
        }
        let Some(uid) = node_uid.clone().filter(|_| !want.is_empty()) else {
            // No static pod (or no Node yet): only stale mirrors to delete.
            failed |= delete_stale(api.as_ref(), &mut mirrors, &BTreeSet::new()).await;
            settle(&mut failures, failed).await;
            continue;
        };
        for (key, pod) in &want {
            let hash = static_hash(pod);
            if !recheck && mirrors.get(key) == Some(&hash) {
                continue;
            }
            match ensure(api.as_ref(), pod, &node, &uid).await {
                Ok(true) => {
                    mirrors.insert(key.clone(), hash);
                }
                Ok(false) => {}
                Err(e) => {
                    failed = true;
                    tracing::debug!(pod = %key.1, error = %e, "mirror pod");
                }
            }
        }
        let keep: BTreeSet<(String, String)> = want.keys().cloned().collect();
        failed |= delete_stale(api.as_ref(), &mut mirrors, &keep).await;
        settle(&mut failures, failed).await;
    }
}

/// Deletes the known mirrors not in `keep`; returns whether a delete failed.
async fn delete_stale<A: ClusterApi>(
    api: &A,
    mirrors: &mut BTreeMap<(String, String), String>,
    keep: &BTreeSet<(String, String)>,
) -> bool {
    let stale: Vec<(String, String)> = mirrors
        .keys()
        .filter(|k| !keep.contains(*k))
        .cloned()
        .collect();
    let mut failed = false;
    for (ns, name) in stale {
        let uid = match api.get_pod(&ns, &name).await {
            Ok(Some(p)) if is_mirror(&p) => p.metadata.uid.unwrap_or_default(),
            Ok(_) => {
                mirrors.remove(&(ns, name));
                continue;
            }
            Err(_) => {
                failed = true;
                continue;
            }
        };
        match api.delete_pod(&ns, &name, &uid).await {
            Ok(()) => {
                tracing::info!(pod = %name, namespace = %ns, "mirror pod deleted");
                mirrors.remove(&(ns, name));
            }
            Err(e) if e.is_not_found() || e.is_conflict() => {
                mirrors.remove(&(ns, name));
            }
            Err(_) => failed = true,
        }
    }
    failed
}

/// Backoff after failed rounds.
async fn settle(failures: &mut u32, failed: bool) {
    if failed {
        *failures = failures.saturating_add(1);
        tokio::time::sleep(backoff(*failures)).await;
    } else {
        *failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cluster::fake::{Call, FakeApi},
        pods::{ActiveEntry, records::blank_record},
        status_manager::PodPhase,
    };

    fn static_pod(hash: &str, image: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "etcd-n1", "namespace": "kube-system", "uid": hash,
                         "annotations": {"kubernetes.io/config.source": "file",
                                         "kubernetes.io/config.hash": hash}},
            "spec": {"nodeName": "n1", "containers": [{"name": "etcd", "image": image}]}
        }))
        .expect("pod")
    }

    #[test]
    fn the_mirror_object() {
        let m = mirror_of(&static_pod("h1", "etcd:1"), "n1", "node-uid");
        assert_eq!(mirror_hash(&m), Some("h1"));
        assert!(m.metadata.uid.is_none(), "the API server assigns it");
        let owner = &m.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Node", "node-uid", Some(true))
        );
        // The API source recognizes the mirror (and never runs it); the static pod is none.
        assert!(is_mirror(&m));
        assert!(!is_mirror(&static_pod("h1", "etcd:1")));
        assert_eq!(
            m.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some("n1")
        );
        assert!(m.status.is_none(), "its status is the node's to write");
    }

    /// Created for a static pod, recreated when its hash changes, deleted when it is gone.
    #[tokio::test(start_paused = true)]
    async fn mirrors_follow_the_static_pods() {
        let api = Arc::new(FakeApi::default());
        let link = NodeLink::default();
        let status = StatusManager::default();
        let node: k8s_openapi::api::core::v1::Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}})).expect("node");
        api.create_node(&node).await.expect("node");
        let task = tokio::spawn(run(
            api.clone(),
            link.clone(),
            status.clone(),
            "n1".to_owned(),
        ));
        // As the pod loop does: active, then its worker's status (which wakes the loop).
        let start = |hash: &str, image: &str| {
            let pod = Arc::new(static_pod(hash, image));
            link.set_active(hash, ActiveEntry::new(pod.clone(), String::new()));
            status.set(blank_record(&pod, hash, "file", PodPhase::Running));
        };
        let stop = |hash: &str| {
            link.remove_active(hash);
            status.remove(hash);
        };
        start("h1", "etcd:1");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mirror = api.pod_named("kube-system", "etcd-n1").expect("mirror");
        assert_eq!(mirror_hash(&mirror), Some("h1"));
        // The manifest changed: a new hash.
        stop("h1");
        start("h2", "etcd:2");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mirror = api.pod_named("kube-system", "etcd-n1").expect("mirror");
        assert_eq!(mirror_hash(&mirror), Some("h2"));
        assert_eq!(api.count(|c| matches!(c, Call::DeletePod(_))), 1);
        // Gone: the mirror is deleted.
        stop("h2");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(api.pod_named("kube-system", "etcd-n1").is_none());
        task.abort();
    }
}
