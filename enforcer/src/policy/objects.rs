//! The API-server objects a pod reads on the node: the ConfigMaps and Secrets its volumes
//! and environment name, and the service-account tokens its projected volumes ask for.
//! Pure: [`ObjectRefs::of`] lists what a pod needs, `crate::pods::objects` fetches it into a
//! [`PodObjects`] snapshot, and the payload functions here turn a snapshot into files and
//! values as kubelet's `configmap.MakePayload`, `secret.MakePayload` and
//! `makeEnvironmentVariables` do.
//!
//! Only pods from the API server read objects (kubelet's mirror-pod rules forbid static pods
//! to); a standalone node has none, and says so with kubelet's own message.
//!
//! By job: [`payload`] (configMap and secret files), [`env_refs`] (`envFrom` and
//! `valueFrom` key references), [`services`] (the service environment variables) and
//! [`tokens`] (service-account token requests and refreshes); here, what a pod reads and the
//! snapshot it is read into.

pub mod env_refs;
pub mod payload;
pub mod services;
pub mod tokens;

pub use env_refs::{EnvFromVars, env_from, env_key, valid_env_name};
pub use payload::{
    KeyToPath, ObjectProjection, config_map_data, config_map_payload, secret_data, secret_payload,
};
pub use services::{MASTER_SERVICES, service_env, service_links};
pub use tokens::{
    TOKEN_MAX_JITTER, TOKEN_MAX_TTL, token_needs_refresh, token_refresh_at, token_request,
};

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};

/// A payload file: its path inside the volume, content and mode.
pub type File = (String, Vec<u8>, u32);

/// The expiry a projected token gets when the spec names none (the API's default).
pub const DEFAULT_TOKEN_EXPIRATION_SECONDS: i64 = 3600;

/// One object as the API server answered for it.
#[derive(Debug, Clone)]
pub enum Fetched<T> {
    Found(Arc<T>),
    /// The API server says there is no such object.
    NotFound,
    /// The object could not be read (the API's or the network's error).
    Failed(String),
}

/// A service-account token a projected volume asks for (kubelet's token cache key, less
/// the pod, which the snapshot is of).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokenRef {
    pub service_account: String,
    pub audience: Option<String>,
    pub expiration_seconds: i64,
}

/// Everything API-side a pod reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectRefs {
    pub config_maps: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
    pub tokens: BTreeSet<TokenRef>,
}

/// `spec.serviceAccountName`, `default` when unset (as the API defaults it).
#[must_use]
pub fn service_account(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".to_owned())
}

impl ObjectRefs {
    /// The objects `pod` names: in its volumes (configMap, secret, projected sources) and in
    /// every container's `env` / `envFrom`.
    #[must_use]
    pub fn of(pod: &Pod) -> Self {
        let mut r = Self::default();
        let Some(spec) = pod.spec.as_ref() else {
            return r;
        };
        for v in spec.volumes.iter().flatten() {
            if let Some(c) = &v.config_map {
                r.config_maps.insert(c.name.clone());
            }
            if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
                r.secrets.insert(s);
            }
            for s in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
                if let Some(c) = &s.config_map {
                    r.config_maps.insert(c.name.clone());
                }
                if let Some(c) = &s.secret {
                    r.secrets.insert(c.name.clone());
                }
                if let Some(t) = &s.service_account_token {
                    r.tokens.insert(TokenRef {
                        service_account: service_account(pod),
                        audience: t.audience.clone().filter(|a| !a.is_empty()),
                        expiration_seconds: t
                            .expiration_seconds
                            .unwrap_or(DEFAULT_TOKEN_EXPIRATION_SECONDS),
                    });
                }
            }
        }
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers);
        for c in containers {
            for f in c.env_from.iter().flatten() {
                if let Some(m) = &f.config_map_ref {
                    r.config_maps.insert(m.name.clone());
                }
                if let Some(s) = &f.secret_ref {
                    r.secrets.insert(s.name.clone());
                }
            }
            for e in c.env.iter().flatten() {
                let Some(src) = &e.value_from else { continue };
                if let Some(k) = &src.config_map_key_ref {
                    r.config_maps.insert(k.name.clone());
                }
                if let Some(k) = &src.secret_key_ref {
                    r.secrets.insert(k.name.clone());
                }
            }
        }
        r
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.config_maps.is_empty() && self.secrets.is_empty() && self.tokens.is_empty()
    }
}

/// The objects of one pod as read for one sync. `api` is false on a standalone node (and
/// for static pods): nothing can be read.
#[derive(Debug, Clone, Default)]
pub struct PodObjects {
    pub api: bool,
    pub namespace: String,
    pub config_maps: BTreeMap<String, Fetched<ConfigMap>>,
    pub secrets: BTreeMap<String, Fetched<Secret>>,
    pub tokens: BTreeMap<TokenRef, Result<String, String>>,
    /// The services whose variables the pod's containers get (the master services of
    /// `default`, and the pod's namespace's when `enableServiceLinks`); `None` when not read
    /// (standalone: no variables), an error when they could not be.
    pub services: Option<Result<Vec<Service>, String>>,
}

/// Why an object a pod needs is not there to use, in kubelet's words (a pod status, an
/// event).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// The read failed: the runtime's message.
    #[error("{0}")]
    Failed(String),
    /// A standalone node (or a static pod): nothing can be read.
    #[error("couldn't get {} {namespace}/{name}, no kubeClient defined", .kind.env_word())]
    NoClient {
        kind: ObjectKind,
        namespace: String,
        name: String,
    },
    #[error("{} {name:?} was not read", .kind.resource())]
    NotRead { kind: ObjectKind, name: String },
    /// The API server's NotFound message.
    #[error("{} \"{name}\" not found", .kind.resource())]
    NotFound { kind: ObjectKind, name: String },
    /// A `valueFrom` key the object does not have.
    #[error("couldn't find key {key} in {} {namespace}/{name}", .kind.type_name())]
    NoKey {
        kind: ObjectKind,
        key: String,
        namespace: String,
        name: String,
    },
    /// An `items` key the object does not have (`MakePayload`'s words per kind).
    #[error("configmap references non-existent config key: {0}")]
    NoConfigMapKey(String),
    #[error("references non-existent secret key: {0}")]
    NoSecretKey(String),
    #[error("cannot use TokenManager when kubelet is in standalone mode")]
    TokenStandalone,
    #[error("token of service account {0:?} was not requested")]
    TokenNotRequested(String),
    /// The services could not be read: the runtime's message.
    #[error("services have not yet been read at least once, cannot construct envvars: {0}")]
    Services(String),
}

/// A kind of object, for kubelet's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    ConfigMap,
    Secret,
}

impl ObjectKind {
    /// The resource (`configmaps`), as the API server's errors name it.
    #[must_use]
    pub fn resource(self) -> &'static str {
        match self {
            Self::ConfigMap => "configmaps",
            Self::Secret => "secrets",
        }
    }

    /// kubelet's word in its env messages (`configMap`, `secret`).
    fn env_word(self) -> &'static str {
        match self {
            Self::ConfigMap => "configMap",
            Self::Secret => "secret",
        }
    }

    /// The type's name (`ConfigMap`, `Secret`).
    fn type_name(self) -> &'static str {
        match self {
            Self::ConfigMap => "ConfigMap",
            Self::Secret => "Secret",
        }
    }
}

/// A name the API server can hold (a DNS-1123 subdomain): anything else is refused before a
/// request is built from it.
#[must_use]
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl PodObjects {
    /// A snapshot with nothing in it: what a standalone node (or a static pod) reads.
    #[must_use]
    pub fn none(namespace: &str) -> Self {
        Self {
            api: false,
            namespace: namespace.to_owned(),
            ..Self::default()
        }
    }

    /// The object, `None` when it does not exist, or the error to report.
    fn lookup<'a, T>(
        &self,
        map: &'a BTreeMap<String, Fetched<T>>,
        kind: ObjectKind,
        name: &str,
    ) -> Result<Option<&'a T>, ObjectError> {
        match map.get(name) {
            Some(Fetched::Found(o)) => Ok(Some(o)),
            Some(Fetched::NotFound) => Ok(None),
            Some(Fetched::Failed(e)) => Err(ObjectError::Failed(e.clone())),
            None if !self.api => Err(ObjectError::NoClient {
                kind,
                namespace: self.namespace.clone(),
                name: name.to_owned(),
            }),
            None => Err(ObjectError::NotRead {
                kind,
                name: name.to_owned(),
            }),
        }
    }

    pub fn config_map(&self, name: &str) -> Result<Option<&ConfigMap>, ObjectError> {
        self.lookup(&self.config_maps, ObjectKind::ConfigMap, name)
    }

    pub fn secret(&self, name: &str) -> Result<Option<&Secret>, ObjectError> {
        self.lookup(&self.secrets, ObjectKind::Secret, name)
    }

    pub fn token(&self, r: &TokenRef) -> Result<&str, ObjectError> {
        match self.tokens.get(r) {
            Some(Ok(t)) => Ok(t),
            Some(Err(e)) => Err(ObjectError::Failed(e.clone())),
            None if !self.api => Err(ObjectError::TokenStandalone),
            None => Err(ObjectError::TokenNotRequested(r.service_account.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    pub(super) fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("pod yaml: {e}"))
    }

    fn cm(data: &[(&str, &str)]) -> Fetched<ConfigMap> {
        Fetched::Found(Arc::new(ConfigMap {
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            binary_data: Some(BTreeMap::from([(
                "bin".to_owned(),
                ByteString(vec![0, 1, 2]),
            )])),
            ..ConfigMap::default()
        }))
    }

    fn secret(data: &[(&str, &str)]) -> Fetched<Secret> {
        Fetched::Found(Arc::new(Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }))
    }

    pub(super) fn objects() -> PodObjects {
        PodObjects {
            api: true,
            namespace: "ns".to_owned(),
            config_maps: BTreeMap::from([
                ("cfg".to_owned(), cm(&[("a", "1"), ("b.txt", "hello")])),
                ("gone".to_owned(), Fetched::NotFound),
                ("broken".to_owned(), Fetched::Failed("timed out".to_owned())),
            ]),
            secrets: BTreeMap::from([
                (
                    "sec".to_owned(),
                    secret(&[("pw", "s3cret"), ("bad=name", "x")]),
                ),
                ("nosec".to_owned(), Fetched::NotFound),
            ]),
            tokens: BTreeMap::new(),
            services: None,
        }
    }

    #[test]
    fn refs_of_volumes_and_env() {
        let p = pod(r#"
metadata: {name: p, namespace: ns, uid: u}
spec:
  serviceAccountName: robot
  volumes:
  - {name: a, configMap: {name: cm1}}
  - {name: b, secret: {secretName: s1}}
  - name: c
    projected:
      sources:
      - serviceAccountToken: {path: token, expirationSeconds: 600, audience: vault}
      - serviceAccountToken: {path: t2}
      - configMap: {name: kube-root-ca.crt}
      - secret: {name: s2}
  initContainers:
  - {name: i, envFrom: [{configMapRef: {name: cm2}}]}
  containers:
  - name: c
    envFrom: [{secretRef: {name: s3}, prefix: X_}]
    env:
    - {name: A, valueFrom: {configMapKeyRef: {name: cm3, key: k}}}
    - {name: B, valueFrom: {secretKeyRef: {name: s1, key: k}}}
"#);
        let r = ObjectRefs::of(&p);
        assert_eq!(
            r.config_maps.iter().map(String::as_str).collect::<Vec<_>>(),
            ["cm1", "cm2", "cm3", "kube-root-ca.crt"]
        );
        assert_eq!(
            r.secrets.iter().map(String::as_str).collect::<Vec<_>>(),
            ["s1", "s2", "s3"]
        );
        let tokens: Vec<_> = r.tokens.iter().cloned().collect();
        assert_eq!(
            tokens,
            [
                TokenRef {
                    service_account: "robot".to_owned(),
                    audience: None,
                    expiration_seconds: 3600
                },
                TokenRef {
                    service_account: "robot".to_owned(),
                    audience: Some("vault".to_owned()),
                    expiration_seconds: 600
                },
            ]
        );
        assert!(
            ObjectRefs::of(&pod("metadata: {name: p}\nspec: {containers: [{name: c}]}")).is_empty()
        );
    }

    #[test]
    fn names_that_could_leave_the_url_are_invalid() {
        for ok in ["cfg", "kube-root-ca.crt", "a.b-c"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "../secrets/x",
            "a/b",
            "UP",
            "a..b",
            "-a",
            "a b",
            "a?x=1",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
