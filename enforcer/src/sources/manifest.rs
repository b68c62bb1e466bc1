//! A manifest file's text into pods: the nesting bound checked before parsing, the Pod
//! documents parsed and validated, and kubelet's file-source defaulting (namespace, name with
//! the node's, uid, the config source and hash annotations).

use std::{collections::BTreeMap, path::Path};

use k8s_openapi::api::core::v1::Pod;
use sha2::{Digest as _, Sha256};

use super::{CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION, SourceError};

/// The first line at which flow collections (`{`, `[`) nest deeper than `max`, outside quoted
/// strings and comments; checked before the YAML parser sees the text.
#[must_use]
pub fn too_deep(text: &str, max: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut line = 1usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut comment = false;
    let mut prev = '\n';
    for c in text.chars() {
        if c == '\n' {
            line += 1;
            comment = false;
            prev = c;
            continue;
        }
        if comment {
            continue;
        }
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if q == '"' && c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' if !prev.is_alphanumeric() => quote = Some(c),
                '#' if prev.is_whitespace() => comment = true,
                '{' | '[' => {
                    depth += 1;
                    if depth > max {
                        return Some(line);
                    }
                }
                '}' | ']' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        prev = c;
    }
    None
}

fn is_dns_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// DNS-1123 subdomain (pod names): labels separated by dots, at most 253 characters.
#[must_use]
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(|l| is_dns_label(l, 63))
}

/// A pod uid as the enforcer accepts it: letters, digits and `-`, at most 128 characters.
#[must_use]
pub fn is_valid_uid(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Why a pod is refused (the checks the file source and the pod workers rely on).
#[derive(Debug, thiserror::Error)]
pub enum InvalidPod {
    #[error("metadata.name: required")]
    NameRequired,
    #[error("metadata.name {0:?}: must be a lowercase DNS-1123 subdomain (no '/', no '..')")]
    Name(String),
    #[error("metadata.namespace {0:?}: must be a lowercase DNS-1123 label")]
    Namespace(String),
    #[error("metadata.uid {0:?}: only letters, digits and '-' are allowed (no '/', no '..')")]
    Uid(String),
    #[error("spec: required")]
    SpecRequired,
    #[error("spec.containers: must have at least one container")]
    NoContainers,
    /// `field` is `spec.initContainers` or `spec.containers`.
    #[error("{field}[{name:?}].name: must be a lowercase DNS-1123 label")]
    ContainerName { field: &'static str, name: String },
    #[error("{field}[{name:?}].name: duplicate container name")]
    DuplicateContainer { field: &'static str, name: String },
    #[error("{field}[{name:?}].image: required")]
    ImageRequired { field: &'static str, name: String },
    #[error("{field}[{name:?}].imagePullPolicy: unsupported value {policy:?}")]
    PullPolicy {
        field: &'static str,
        name: String,
        policy: String,
    },
    #[error("spec.restartPolicy: unsupported value {0:?}")]
    RestartPolicy(String),
    #[error("spec.terminationGracePeriodSeconds: must be >= 0, got {0}")]
    GracePeriod(i64),
    /// Quantities, requests <= limits (the decision core's validation).
    #[error("{0}")]
    Resources(#[from] crate::policy::resources::ResourceError),
}

/// Validates a pod (the checks the file source and the pod workers rely on).
pub fn validate(pod: &Pod) -> Result<(), InvalidPod> {
    let name = pod.metadata.name.as_deref().unwrap_or("");
    if name.is_empty() {
        return Err(InvalidPod::NameRequired);
    }
    if !is_dns_subdomain(name) {
        return Err(InvalidPod::Name(name.to_owned()));
    }
    if let Some(ns) = pod.metadata.namespace.as_deref()
        && !is_dns_label(ns, 63)
    {
        return Err(InvalidPod::Namespace(ns.to_owned()));
    }
    if let Some(uid) = pod.metadata.uid.as_deref()
        && !is_valid_uid(uid)
    {
        return Err(InvalidPod::Uid(uid.to_owned()));
    }
    let Some(spec) = pod.spec.as_ref() else {
        return Err(InvalidPod::SpecRequired);
    };
    if spec.containers.is_empty() {
        return Err(InvalidPod::NoContainers);
    }
    let mut seen = std::collections::HashSet::new();
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| ("spec.initContainers", c))
        .chain(spec.containers.iter().map(|c| ("spec.containers", c)));
    for (field, c) in all {
        let name = || c.name.clone();
        if !is_dns_label(&c.name, 63) {
            return Err(InvalidPod::ContainerName {
                field,
                name: name(),
            });
        }
        if !seen.insert(c.name.clone()) {
            return Err(InvalidPod::DuplicateContainer {
                field,
                name: name(),
            });
        }
        if c.image.as_deref().unwrap_or("").trim().is_empty() {
            return Err(InvalidPod::ImageRequired {
                field,
                name: name(),
            });
        }
        if let Some(p) = c.image_pull_policy.as_deref()
            && !matches!(p, "Always" | "IfNotPresent" | "Never")
        {
            return Err(InvalidPod::PullPolicy {
                field,
                name: name(),
                policy: p.to_owned(),
            });
        }
    }
    if let Some(p) = spec.restart_policy.as_deref()
        && !matches!(p, "Always" | "OnFailure" | "Never")
    {
        return Err(InvalidPod::RestartPolicy(p.to_owned()));
    }
    if let Some(g) = spec.termination_grace_period_seconds
        && g < 0
    {
        return Err(InvalidPod::GracePeriod(g));
    }
    // Quantities, requests <= limits (the decision core's validation).
    Ok(crate::policy::resources::validate_pod(pod)?)
}

/// Parses the documents of one manifest file into pods (kubelet's file source defaulting:
/// namespace `default`, name `<name>-<node>`, a uid from node, path and content when unset,
/// the config source and hash annotations).
pub fn parse_manifest(file: &Path, text: &str, node_name: &str) -> Result<Vec<Pod>, SourceError> {
    use serde::Deserialize as _;
    let mut pods = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let doc_no = i + 1;
        let value = serde_yaml_ng::Value::deserialize(doc).map_err(|e| SourceError::Yaml {
            file: file.to_path_buf(),
            message: e.to_string(),
        })?;
        if value.is_null() {
            continue;
        }
        let invalid = |message: String| SourceError::Invalid {
            file: file.to_path_buf(),
            doc: doc_no,
            message,
        };
        let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        if kind != "Pod" {
            return Err(invalid(format!("kind {kind:?}: only Pod is supported")));
        }
        let api = value
            .get("apiVersion")
            .and_then(|k| k.as_str())
            .unwrap_or("");
        if api != "v1" {
            return Err(invalid(format!("apiVersion {api:?}: expected \"v1\"")));
        }
        let mut pod: Pod = serde_path_to_error::deserialize(value)
            .map_err(|e| invalid(format!("{}: {}", e.path(), e.inner())))?;
        validate(&pod).map_err(|e| invalid(e.to_string()))?;
        crate::policy::resources::apply_defaults(&mut pod);
        // Static pod defaulting, as kubelet's file source does it.
        let ns = pod
            .metadata
            .namespace
            .get_or_insert_with(|| "default".to_owned())
            .clone();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let full_name = if node_name.is_empty() {
            name
        } else {
            format!("{name}-{}", node_name.to_lowercase())
        };
        if !is_dns_subdomain(&full_name) {
            return Err(invalid(format!(
                "metadata.name {full_name:?} (with the node name) is not a DNS-1123 subdomain"
            )));
        }
        pod.metadata.name = Some(full_name);
        if pod.metadata.uid.is_none() {
            let mut h = Sha256::new();
            h.update(node_name.as_bytes());
            h.update(file.as_os_str().as_encoded_bytes());
            // A change of the resizable containers' cpu or memory alone keeps the uid: the
            // pod is resized in place (`policy::resize::uid_basis`).
            h.update(
                serde_json::to_vec(&crate::policy::resize::uid_basis(&pod)).unwrap_or_default(),
            );
            h.update(ns.as_bytes());
            let hex: String = h
                .finalize()
                .iter()
                .take(16)
                .map(|b| format!("{b:02x}"))
                .collect();
            pod.metadata.uid = Some(hex);
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let ann = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
        ann.insert(CONFIG_SOURCE_ANNOTATION.to_owned(), "file".to_owned());
        ann.insert(CONFIG_HASH_ANNOTATION.to_owned(), uid);
        pods.push(pod);
    }
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, uid: u-1}\nspec:\n  containers: [{name: c, image: 'busybox:local'}]\n";

    #[test]
    fn static_uid_is_deterministic_and_follows_content() {
        let text = POD.replace("uid: u-1", "namespace: ns");
        let f = Path::new("/m/web.yaml");
        let a = parse_manifest(f, &text, "n").expect("a");
        let b = parse_manifest(f, &text, "n").expect("b");
        assert_eq!(a[0].metadata.uid, b[0].metadata.uid);
        let c = parse_manifest(Path::new("/m/other.yaml"), &text, "n").expect("c");
        assert_ne!(a[0].metadata.uid, c[0].metadata.uid);
        let d = parse_manifest(f, &text.replace("busybox:local", "busybox:2"), "n").expect("d");
        assert_ne!(a[0].metadata.uid, d[0].metadata.uid);
        // Resources: a resize keeps the uid; a change of QoS class or of a resource's
        // presence is a new pod.
        let with = |r: &str| {
            let t = text.replace(
                "image: 'busybox:local'",
                &format!("image: 'busybox:local', resources: {r}"),
            );
            parse_manifest(f, &t, "n").expect("resources")[0]
                .metadata
                .uid
                .clone()
        };
        let small = with("{requests: {cpu: 100m, memory: 64Mi}, limits: {memory: 128Mi}}");
        let grown = with("{requests: {cpu: 200m, memory: 96Mi}, limits: {memory: 256Mi}}");
        assert_eq!(small, grown, "a resize is the same pod");
        assert_ne!(
            small, a[0].metadata.uid,
            "BestEffort to Burstable is a new pod"
        );
        let guaranteed =
            with("{requests: {cpu: 100m, memory: 64Mi}, limits: {cpu: 100m, memory: 64Mi}}");
        assert_ne!(small, guaranteed, "Burstable to Guaranteed is a new pod");
        let no_limit = with("{requests: {cpu: 100m, memory: 64Mi}}");
        assert_ne!(small, no_limit, "a limit removed is a new pod");
        assert!(is_valid_uid(a[0].metadata.uid.as_deref().unwrap_or("")));
    }

    #[test]
    fn several_documents() {
        let text = format!(
            "{}---\n{}",
            POD,
            POD.replace("u-1", "u-2").replace("name: web", "name: db")
        );
        let got = parse_manifest(Path::new("/m/x.yaml"), &text, "").expect("parse");
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].metadata.name.as_deref(), Some("db"));
    }
}

#[cfg(test)]
mod examples {
    /// The example manifests `cargo xtask run` ships are valid pods of the three QoS classes.
    #[test]
    fn example_manifests_parse_into_three_qos_classes() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/manifests");
        let mut classes = Vec::new();
        for name in ["guaranteed.yaml", "burstable.yaml", "besteffort.yaml"] {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let pods = super::parse_manifest(&path, &text, "node");
            assert!(pods.is_ok(), "{name}: {pods:?}");
            for pod in pods.unwrap_or_default() {
                assert_eq!(
                    pod.spec.as_ref().and_then(|s| s.host_network),
                    Some(true),
                    "{name}"
                );
                classes.push(crate::cri::spec::pod_qos(&pod).as_str());
            }
        }
        assert_eq!(classes, ["Guaranteed", "Burstable", "BestEffort"]);
    }
}
