//! The pods a companion watches over, folded from what it can read of the kubelet's node: the
//! API server's pods of this node, the runtime's pod sandboxes (kubelet's labels) and the
//! static pod directory. Pure: the companion's loop reads, this decides.
//!
//! - An API pod is watched while it is not terminating (the API source turns a deletion, a
//!   `deletionTimestamp` or a terminal phase into its removal: kubelet is already stopping it).
//! - A mirror pod is not: its static pod is, under the static pod's own uid (the sandbox's).
//! - A sandbox that is not ready is not: kubelet is stopping or has stopped that pod.
//! - With an API server, a ready sandbox the API does not list is watched only when it is a
//!   static pod's (the API's deletion of any other means kubelet is terminating it).
//! - Without one, every ready sandbox is watched: a static pod with its manifest's spec, any
//!   other with what the node knows of it (name, namespace, uid, labels, the pod's annotations
//!   kubelet copies to the sandbox, its QoS class from where kubelet put its cgroup, the
//!   `enforcer/priority` annotation as its priority).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use k8s_openapi::{
    api::core::v1::{Container, Pod, PodSpec, PodStatus, ResourceRequirements},
    apimachinery::pkg::api::resource::Quantity,
};

use crate::{
    cri::spec::{POD_NAME_LABEL, POD_NAMESPACE_LABEL, POD_UID_LABEL},
    policy::{
        qos::QosClass,
        resources::{CONFIG_MIRROR_ANNOTATION, CONFIG_SOURCE_ANNOTATION},
    },
};

/// The annotation a pod run without an API server carries its priority in (kubelet copies
/// the pod's annotations to its sandbox; the priority itself is not on the node).
pub const PRIORITY_ANNOTATION: &str = "enforcer/priority";

/// A pod sandbox as the runtime lists it, with kubelet's labels read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sandbox {
    pub id: String,
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub ready: bool,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Its containers' names (from the runtime's container list).
    pub containers: Vec<String>,
}

impl Sandbox {
    /// A listed sandbox, when it carries kubelet's pod labels (others are not kubelet's).
    #[must_use]
    pub fn from_cri(s: &k8s_cri::v1::PodSandbox) -> Option<Self> {
        let label = |k: &str| s.labels.get(k).filter(|v| !v.is_empty()).cloned();
        Some(Self {
            id: s.id.clone(),
            uid: label(POD_UID_LABEL)?,
            name: label(POD_NAME_LABEL)?,
            namespace: label(POD_NAMESPACE_LABEL)?,
            ready: s.state == k8s_cri::v1::PodSandboxState::SandboxReady as i32,
            labels: s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            annotations: s
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            containers: Vec::new(),
        })
    }

    fn is_static(&self) -> bool {
        self.annotations
            .get(CONFIG_SOURCE_ANNOTATION)
            .is_some_and(|s| s != "api")
    }
}

/// Where a watched pod's spec came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The API server.
    Api,
    /// The static pod directory (matched to its sandbox by namespace and name).
    StaticManifest,
    /// The runtime only: what the node knows of it.
    Runtime,
}

/// A pod the companion watches over.
#[derive(Clone, Debug)]
pub struct Member {
    pub pod: Arc<Pod>,
    pub origin: Origin,
    /// Its ready sandbox, when the runtime listed one.
    pub sandbox: Option<String>,
    /// Its QoS class when the spec does not give it (a runtime-only pod: where its cgroup is).
    pub tier: Option<QosClass>,
}

/// What the companion read this round.
#[derive(Clone, Copy, Debug)]
pub struct Sources<'a> {
    /// The API server's pods of this node by uid (`None`: no API server).
    pub api: Option<&'a BTreeMap<String, Arc<Pod>>>,
    pub sandboxes: &'a [Sandbox],
    /// The static pod directory's pods (kubelet's defaulting: `<name>-<node>`).
    pub statics: &'a [Arc<Pod>],
}

/// For a runtime-only pod: the QoS class of the tier its cgroup is in, and the memory limit
/// of its pod cgroup (a Guaranteed pod's request: kubelet writes requests = limits there).
pub type TierOf<'f> = dyn Fn(&str) -> Option<(QosClass, Option<i64>)> + 'f;

/// The pods to watch over, by the uid their cgroup is named after.
#[must_use]
pub fn members(src: Sources<'_>, tier_of: &TierOf<'_>) -> BTreeMap<String, Member> {
    let mut out = BTreeMap::new();
    let ready: BTreeMap<&str, &Sandbox> = src
        .sandboxes
        .iter()
        .filter(|s| s.ready)
        .map(|s| (s.uid.as_str(), s))
        .collect();
    // Uids whose every listed sandbox is stopped: kubelet is done with or stopping them.
    let listed: BTreeSet<&str> = src.sandboxes.iter().map(|s| s.uid.as_str()).collect();
    if let Some(api) = src.api {
        for (uid, pod) in api {
            let mirror = pod
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(CONFIG_MIRROR_ANNOTATION));
            if mirror || (listed.contains(uid.as_str()) && !ready.contains_key(uid.as_str())) {
                continue;
            }
            out.insert(
                uid.clone(),
                Member {
                    pod: pod.clone(),
                    origin: Origin::Api,
                    sandbox: ready.get(uid.as_str()).map(|s| s.id.clone()),
                    tier: None,
                },
            );
        }
    }
    for (uid, sb) in ready {
        if out.contains_key(uid) || (src.api.is_some() && !sb.is_static()) {
            continue;
        }
        let manifest = sb
            .is_static()
            .then(|| {
                src.statics.iter().find(|p| {
                    p.metadata.namespace.as_deref() == Some(sb.namespace.as_str())
                        && p.metadata.name.as_deref() == Some(sb.name.as_str())
                })
            })
            .flatten();
        let member = match manifest {
            Some(p) => {
                let mut pod = (**p).clone();
                pod.metadata.uid = Some(uid.to_owned());
                Member {
                    pod: Arc::new(pod),
                    origin: Origin::StaticManifest,
                    sandbox: Some(sb.id.clone()),
                    tier: None,
                }
            }
            None => {
                let tier = tier_of(uid);
                Member {
                    pod: Arc::new(runtime_pod(sb, tier)),
                    origin: Origin::Runtime,
                    sandbox: Some(sb.id.clone()),
                    tier: tier.map(|(q, _)| q),
                }
            }
        };
        out.insert(uid.to_owned(), member);
    }
    out
}

/// What the node knows of a pod without its spec: its identity, labels and annotations from
/// the sandbox, its containers by name, its QoS class from where its cgroup is (its
/// `status.qosClass`), a Guaranteed pod's memory request from its pod cgroup's limit, its
/// priority from [`PRIORITY_ANNOTATION`].
#[must_use]
pub fn runtime_pod(sb: &Sandbox, tier: Option<(QosClass, Option<i64>)>) -> Pod {
    let labels: BTreeMap<String, String> = sb
        .labels
        .iter()
        .filter(|(k, _)| !k.starts_with("io.kubernetes."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let priority = sb
        .annotations
        .get(PRIORITY_ANNOTATION)
        .and_then(|p| p.trim().parse::<i32>().ok());
    let guaranteed_memory = match tier {
        Some((QosClass::Guaranteed, Some(limit))) if limit > 0 => Some(limit),
        _ => None,
    };
    let n = i64::try_from(sb.containers.len().max(1)).unwrap_or(1);
    let containers = if sb.containers.is_empty() {
        vec![String::from("unknown")]
    } else {
        sb.containers.clone()
    };
    let containers = containers
        .into_iter()
        .map(|name| Container {
            name,
            // The pod cgroup's limit shared equally: only the pod's sum is ranked.
            resources: guaranteed_memory.map(|m| {
                let q = BTreeMap::from([("memory".to_owned(), Quantity((m / n).to_string()))]);
                ResourceRequirements {
                    requests: Some(q.clone()),
                    limits: Some(q),
                    ..ResourceRequirements::default()
                }
            }),
            ..Container::default()
        })
        .collect();
    Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(sb.name.clone()),
            namespace: Some(sb.namespace.clone()),
            uid: Some(sb.uid.clone()),
            labels: Some(labels),
            annotations: Some(sb.annotations.clone()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers,
            priority,
            ..PodSpec::default()
        }),
        status: tier.map(|(q, _)| PodStatus {
            qos_class: Some(format!("{q:?}")),
            ..PodStatus::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(uid: &str, ready: bool, annotations: &[(&str, &str)]) -> Sandbox {
        Sandbox {
            id: format!("sb-{uid}"),
            uid: uid.to_owned(),
            name: format!("pod-{uid}"),
            namespace: "ns".to_owned(),
            ready,
            labels: BTreeMap::from([("app".to_owned(), "x".to_owned())]),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            containers: vec!["c".to_owned()],
        }
    }

    fn api_pod(uid: &str, annotations: &[(&str, &str)]) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.to_owned());
        p.metadata.name = Some(format!("pod-{uid}"));
        p.metadata.namespace = Some("ns".to_owned());
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        Arc::new(p)
    }

    fn no_tier(_: &str) -> Option<(QosClass, Option<i64>)> {
        None
    }

    /// With an API server: its pods (not a mirror, not one whose sandboxes all stopped), and
    /// of the sandboxes it does not list only static pods', with their manifest's spec.
    #[test]
    fn with_an_api_server_its_pods_and_the_static_ones() {
        let api = BTreeMap::from([
            ("a".to_owned(), api_pod("a", &[])),
            ("pending".to_owned(), api_pod("pending", &[])),
            ("stopped".to_owned(), api_pod("stopped", &[])),
            (
                "mirror".to_owned(),
                api_pod("mirror", &[(CONFIG_MIRROR_ANNOTATION, "s")]),
            ),
        ]);
        let mut manifest = Pod::default();
        manifest.metadata.name = Some("pod-s".to_owned());
        manifest.metadata.namespace = Some("ns".to_owned());
        manifest.metadata.uid = Some("ours".to_owned());
        let statics = [Arc::new(manifest)];
        let sandboxes = [
            sandbox("a", true, &[]),
            sandbox("stopped", false, &[]),
            sandbox("s", true, &[(CONFIG_SOURCE_ANNOTATION, "file")]),
            // Deleted from the API (kubelet is terminating it): not watched.
            sandbox("gone", true, &[(CONFIG_SOURCE_ANNOTATION, "api")]),
        ];
        let m = members(
            Sources {
                api: Some(&api),
                sandboxes: &sandboxes,
                statics: &statics,
            },
            &no_tier,
        );
        assert_eq!(
            m.keys().map(String::as_str).collect::<Vec<_>>(),
            ["a", "pending", "s"]
        );
        assert_eq!(m["a"].origin, Origin::Api);
        assert_eq!(m["a"].sandbox.as_deref(), Some("sb-a"));
        assert_eq!(m["pending"].sandbox, None);
        // The static pod under the sandbox's uid (kubelet's hash), with its manifest.
        assert_eq!(m["s"].origin, Origin::StaticManifest);
        assert_eq!(m["s"].pod.metadata.uid.as_deref(), Some("s"));
    }

    /// Without one: every ready sandbox, a runtime-only pod with what the node knows.
    #[test]
    fn without_an_api_server_every_ready_sandbox() {
        let sandboxes = [
            sandbox("g", true, &[]),
            sandbox("b", true, &[(PRIORITY_ANNOTATION, "1000")]),
            sandbox("down", false, &[]),
        ];
        let tier = |uid: &str| match uid {
            "g" => Some((QosClass::Guaranteed, Some(200 << 20))),
            "b" => Some((QosClass::Burstable, Some(500 << 20))),
            _ => None,
        };
        let m = members(
            Sources {
                api: None,
                sandboxes: &sandboxes,
                statics: &[],
            },
            &tier,
        );
        assert_eq!(m.keys().map(String::as_str).collect::<Vec<_>>(), ["b", "g"]);
        let g = &m["g"];
        assert_eq!(g.origin, Origin::Runtime);
        assert_eq!(
            crate::policy::qos::pod_qos(&g.pod),
            QosClass::Guaranteed,
            "{g:?}"
        );
        let req = crate::policy::resources::pod_requests(&g.pod);
        assert_eq!(req.get("memory").map(|q| q.value()), Some(200 << 20));
        let b = &m["b"];
        assert_eq!(crate::policy::qos::pod_qos(&b.pod), QosClass::Burstable);
        assert_eq!(crate::policy::resources::priority(&b.pod), 1000);
        // A Burstable pod's request is not on the node: none is assumed.
        assert!(
            crate::policy::resources::pod_requests(&b.pod)
                .get("memory")
                .is_none_or(|q| q.value() == 0)
        );
        assert_eq!(
            b.pod.metadata.labels.as_ref().map(BTreeMap::len),
            Some(1),
            "kubelet's own labels are not the pod's"
        );
    }
}
