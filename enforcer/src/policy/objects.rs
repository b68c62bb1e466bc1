//! The API-server objects a pod reads on the node: the ConfigMaps and Secrets its volumes
//! and environment name, and the service-account tokens its projected volumes ask for.
//! Pure: [`ObjectRefs::of`] lists what a pod needs, `runtime::objects` fetches it into a
//! [`PodObjects`] snapshot, and the payload functions here turn a snapshot into files and
//! values as kubelet's `configmap.MakePayload`, `secret.MakePayload` and
//! `makeEnvironmentVariables` do.
//!
//! Only pods from the API server read objects (kubelet's mirror-pod rules forbid static pods
//! to); a standalone node has none, and says so with kubelet's own message.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{ConfigMap, Pod, Secret, Service},
};

/// A payload file: its path inside the volume, content and mode.
pub type File = (String, Vec<u8>, u32);

/// The expiry a projected token gets when the spec names none (the API's default).
pub const DEFAULT_TOKEN_EXPIRATION_SECONDS: i64 = 3600;
/// kubelet's token manager: a token older than this is refreshed whatever its TTL.
pub const TOKEN_MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// kubelet's token manager: the most jitter subtracted from a refresh time.
pub const TOKEN_MAX_JITTER: Duration = Duration::from_secs(10);

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

/// The master services every pod gets variables for, whatever `enableServiceLinks` says.
pub const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// Whether the pod asks for its namespace's service variables (`enableServiceLinks`,
/// default true).
#[must_use]
pub fn service_links(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true)
}

/// `makeEnvVariableName`.
fn env_prefix(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

/// kubelet's `getServiceEnvVarMap` + `envvars.FromServices`: for each service with a cluster
/// IP, the master services of `default` always and the pod's namespace's when
/// `enable_links` (a namespace service of a master's name takes its place, as in kubelet's
/// map):
/// `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT` (the first port), `<NAME>_SERVICE_PORT_<PORT
/// NAME>` for named ports, and Docker's link variables (`<NAME>_PORT`,
/// `<NAME>_PORT_<port>_<PROTO>` with `_PROTO`, `_PORT`, `_ADDR`).
#[must_use]
pub fn service_env(
    services: &[Service],
    namespace: &str,
    enable_links: bool,
) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<String, &Service> = BTreeMap::new();
    for s in services {
        let Some(spec) = s.spec.as_ref() else {
            continue;
        };
        let ip = spec.cluster_ip.as_deref().unwrap_or("");
        let name = s.metadata.name.as_deref().unwrap_or("");
        if ip.is_empty() || ip == "None" || name.is_empty() {
            continue;
        }
        let ns = s.metadata.namespace.as_deref().unwrap_or("default");
        if ns == "default" && MASTER_SERVICES.contains(&name) {
            chosen.entry(name.to_owned()).or_insert(s);
        } else if ns == namespace && enable_links {
            chosen.insert(name.to_owned(), s);
        }
    }
    let mut out = BTreeMap::new();
    for (name, s) in chosen {
        let Some(spec) = s.spec.as_ref() else {
            continue;
        };
        let Some(ports) = spec.ports.as_ref().filter(|p| !p.is_empty()) else {
            continue;
        };
        let ip = spec.cluster_ip.clone().unwrap_or_default();
        let prefix = env_prefix(&name);
        out.insert(format!("{prefix}_SERVICE_HOST"), ip.clone());
        out.insert(format!("{prefix}_SERVICE_PORT"), ports[0].port.to_string());
        for p in ports {
            if let Some(pn) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.insert(
                    format!("{prefix}_SERVICE_PORT_{}", env_prefix(pn)),
                    p.port.to_string(),
                );
            }
        }
        for (i, p) in ports.iter().enumerate() {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let host_port = if ip.contains(':') {
                format!("[{ip}]:{}", p.port)
            } else {
                format!("{ip}:{}", p.port)
            };
            let url = format!("{}://{host_port}", proto.to_lowercase());
            if i == 0 {
                out.insert(format!("{prefix}_PORT"), url.clone());
            }
            let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
            out.insert(format!("{pp}_PROTO"), proto.to_lowercase());
            out.insert(format!("{pp}_PORT"), p.port.to_string());
            out.insert(format!("{pp}_ADDR"), ip.clone());
            out.insert(pp, url);
        }
    }
    out
}

impl PodObjects {
    /// The service variables of the pod's containers: none when services were not read
    /// (standalone), kubelet's error when they could not be.
    pub fn service_env(&self, enable_links: bool) -> Result<BTreeMap<String, String>, String> {
        match &self.services {
            None => Ok(BTreeMap::new()),
            Some(Ok(s)) => Ok(service_env(s, &self.namespace, enable_links)),
            Some(Err(e)) => Err(format!(
                "services have not yet been read at least once, cannot construct envvars: {e}"
            )),
        }
    }
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
}

/// The API server's NotFound message.
#[must_use]
pub fn not_found(kind: ObjectKind, name: &str) -> String {
    format!("{} \"{name}\" not found", kind.resource())
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
    ) -> Result<Option<&'a T>, String> {
        match map.get(name) {
            Some(Fetched::Found(o)) => Ok(Some(o)),
            Some(Fetched::NotFound) => Ok(None),
            Some(Fetched::Failed(e)) => Err(e.clone()),
            None if !self.api => Err(format!(
                "couldn't get {} {}/{name}, no kubeClient defined",
                kind.env_word(),
                self.namespace
            )),
            None => Err(format!("{} {name:?} was not read", kind.resource())),
        }
    }

    pub fn config_map(&self, name: &str) -> Result<Option<&ConfigMap>, String> {
        self.lookup(&self.config_maps, ObjectKind::ConfigMap, name)
    }

    pub fn secret(&self, name: &str) -> Result<Option<&Secret>, String> {
        self.lookup(&self.secrets, ObjectKind::Secret, name)
    }

    pub fn token(&self, r: &TokenRef) -> Result<&str, String> {
        match self.tokens.get(r) {
            Some(Ok(t)) => Ok(t),
            Some(Err(e)) => Err(e.clone()),
            None if !self.api => {
                Err("cannot use TokenManager when kubelet is in standalone mode".to_owned())
            }
            None => Err(format!(
                "token of service account {:?} was not requested",
                r.service_account
            )),
        }
    }
}

/// One `items` entry of a configMap or secret projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyToPath {
    pub key: String,
    pub path: String,
    pub mode: Option<u32>,
}

/// A configMap or secret projected into a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectProjection {
    pub name: String,
    pub items: Vec<KeyToPath>,
    pub default_mode: u32,
    pub optional: bool,
}

/// The files of one object (`MakePayload`): every key when there are no items, else each
/// item's key at its path (a missing key is an error unless optional).
fn make_payload(
    kind: ObjectKind,
    p: &ObjectProjection,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<Vec<File>, String> {
    if p.items.is_empty() {
        return Ok(data
            .iter()
            .map(|(k, v)| (k.clone(), v.clone(), p.default_mode))
            .collect());
    }
    let mut out = Vec::new();
    for i in &p.items {
        let Some(v) = data.get(&i.key) else {
            if p.optional {
                continue;
            }
            return Err(match kind {
                ObjectKind::ConfigMap => {
                    format!("configmap references non-existent config key: {}", i.key)
                }
                ObjectKind::Secret => {
                    format!("references non-existent secret key: {}", i.key)
                }
            });
        };
        out.push((i.path.clone(), v.clone(), i.mode.unwrap_or(p.default_mode)));
    }
    Ok(out)
}

/// A ConfigMap's keys and values: `data` and `binaryData`.
#[must_use]
pub fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        out.insert(k.clone(), v.0.clone());
    }
    out
}

/// A Secret's keys and values.
#[must_use]
pub fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    s.data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

/// The files of a configMap projection: the object's keys, an empty payload for a missing
/// optional object, or kubelet's error.
pub fn config_map_payload(objects: &PodObjects, p: &ObjectProjection) -> Result<Vec<File>, String> {
    match objects.config_map(&p.name)? {
        Some(cm) => make_payload(ObjectKind::ConfigMap, p, &config_map_data(cm)),
        None if p.optional => Ok(Vec::new()),
        None => Err(not_found(ObjectKind::ConfigMap, &p.name)),
    }
}

/// The files of a secret projection (as [`config_map_payload`]).
pub fn secret_payload(objects: &PodObjects, p: &ObjectProjection) -> Result<Vec<File>, String> {
    match objects.secret(&p.name)? {
        Some(s) => make_payload(ObjectKind::Secret, p, &secret_data(s)),
        None if p.optional => Ok(Vec::new()),
        None => Err(not_found(ObjectKind::Secret, &p.name)),
    }
}

/// The TokenRequest kubelet sends for a projected token: the audience (if any), the
/// expiry, and the pod as the bound object (the token dies with the pod).
#[must_use]
pub fn token_request(pod: &Pod, r: &TokenRef) -> TokenRequest {
    TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: r.audience.clone().map(|a| vec![a]),
            expiration_seconds: Some(r.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    }
}

/// When kubelet's token manager (`requiresRefresh`) first refreshes a token that expires at
/// `expires` and was issued for `ttl_seconds`: at 80 % of its life, at 24 h of age, less
/// `jitter` (kubelet draws up to [`TOKEN_MAX_JITTER`]).
#[must_use]
pub fn token_refresh_at(expires: SystemTime, ttl_seconds: i64, jitter: Duration) -> SystemTime {
    let ttl = Duration::from_secs(u64::try_from(ttl_seconds.max(0)).unwrap_or(0));
    let issued = expires.checked_sub(ttl).unwrap_or(expires);
    let by_age = issued
        .checked_add(TOKEN_MAX_TTL.saturating_sub(jitter))
        .unwrap_or(expires);
    let by_ttl = expires.checked_sub(ttl / 5 + jitter).unwrap_or(issued);
    by_age.min(by_ttl)
}

/// Whether a cached token must be refreshed at `now` (also when the clock is before its
/// issue time, as kubelet does).
#[must_use]
pub fn token_needs_refresh(
    now: SystemTime,
    expires: SystemTime,
    ttl_seconds: i64,
    jitter: Duration,
) -> bool {
    let ttl = Duration::from_secs(u64::try_from(ttl_seconds.max(0)).unwrap_or(0));
    let issued = expires.checked_sub(ttl).unwrap_or(expires);
    now >= token_refresh_at(expires, ttl_seconds, jitter) || now < issued
}

/// Variables (name, value) and the keys skipped as invalid names.
pub type EnvFromVars = (Vec<(String, String)>, Vec<String>);

/// kubelet's (relaxed) environment variable name rule: printable ASCII, no `=`.
#[must_use]
pub fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'=')
}

/// One `envFrom` source's variables (`makeEnvironmentVariables`): each key with the prefix,
/// in key order; keys that are no valid names are skipped and returned apart (kubelet's
/// `InvalidEnvironmentVariableNames` event). A missing optional object gives nothing.
pub fn env_from(
    objects: &PodObjects,
    kind: ObjectKind,
    name: &str,
    prefix: &str,
    optional: bool,
) -> Result<EnvFromVars, String> {
    let data = match kind {
        ObjectKind::ConfigMap => objects.config_map(name)?.map(|cm| {
            cm.data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>()
        }),
        ObjectKind::Secret => objects.secret(name)?.map(|s| {
            secret_data(s)
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect()
        }),
    };
    let Some(data) = data else {
        return if optional {
            Ok((Vec::new(), Vec::new()))
        } else {
            Err(not_found(kind, name))
        };
    };
    let mut vars = Vec::new();
    let mut invalid = Vec::new();
    for (k, v) in data {
        let k = format!("{prefix}{k}");
        if valid_env_name(&k) {
            vars.push((k, v));
        } else {
            invalid.push(k);
        }
    }
    invalid.sort();
    Ok((vars, invalid))
}

/// One `valueFrom.configMapKeyRef` / `secretKeyRef`: the value, `None` to leave the variable
/// out (an optional object or key that is missing), or kubelet's error.
pub fn env_key(
    objects: &PodObjects,
    kind: ObjectKind,
    name: &str,
    key: &str,
    optional: bool,
) -> Result<Option<String>, String> {
    let value = match kind {
        ObjectKind::ConfigMap => objects
            .config_map(name)?
            .map(|cm| cm.data.as_ref().and_then(|d| d.get(key)).cloned()),
        ObjectKind::Secret => objects.secret(name)?.map(|s| {
            s.data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        }),
    };
    match value {
        None if optional => Ok(None),
        None => Err(not_found(kind, name)),
        Some(Some(v)) => Ok(Some(v)),
        Some(None) if optional => Ok(None),
        Some(None) => Err(format!(
            "couldn't find key {key} in {} {}/{name}",
            match kind {
                ObjectKind::ConfigMap => "ConfigMap",
                ObjectKind::Secret => "Secret",
            },
            objects.namespace
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn pod(yaml: &str) -> Pod {
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

    fn objects() -> PodObjects {
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

    fn proj(name: &str, items: &[(&str, &str, Option<u32>)], optional: bool) -> ObjectProjection {
        ObjectProjection {
            name: name.to_owned(),
            items: items
                .iter()
                .map(|(k, p, m)| KeyToPath {
                    key: (*k).to_owned(),
                    path: (*p).to_owned(),
                    mode: *m,
                })
                .collect(),
            default_mode: 0o644,
            optional,
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
    fn payloads_as_make_payload() {
        let o = objects();
        let all = config_map_payload(&o, &proj("cfg", &[], false)).expect("all keys");
        assert_eq!(
            all,
            [
                ("a".to_owned(), b"1".to_vec(), 0o644),
                ("b.txt".to_owned(), b"hello".to_vec(), 0o644),
                ("bin".to_owned(), vec![0, 1, 2], 0o644),
            ]
        );
        let items = config_map_payload(
            &o,
            &proj(
                "cfg",
                &[("a", "dir/a", Some(0o400)), ("b.txt", "b", None)],
                false,
            ),
        )
        .expect("items");
        assert_eq!(
            items,
            [
                ("dir/a".to_owned(), b"1".to_vec(), 0o400),
                ("b".to_owned(), b"hello".to_vec(), 0o644),
            ]
        );
        assert_eq!(
            config_map_payload(&o, &proj("cfg", &[("zz", "z", None)], false)),
            Err("configmap references non-existent config key: zz".to_owned())
        );
        assert_eq!(
            config_map_payload(&o, &proj("cfg", &[("zz", "z", None)], true)),
            Ok(Vec::new())
        );
        assert_eq!(
            config_map_payload(&o, &proj("gone", &[], false)),
            Err("configmaps \"gone\" not found".to_owned())
        );
        assert_eq!(
            config_map_payload(&o, &proj("gone", &[], true)),
            Ok(Vec::new())
        );
        // An error that is not NotFound is never taken for an absent optional object.
        assert_eq!(
            config_map_payload(&o, &proj("broken", &[], true)),
            Err("timed out".to_owned())
        );
        assert_eq!(
            secret_payload(&o, &proj("sec", &[("pw", "pw", Some(0o400))], false)),
            Ok(vec![("pw".to_owned(), b"s3cret".to_vec(), 0o400)])
        );
        assert_eq!(
            secret_payload(&o, &proj("sec", &[("nope", "x", None)], false)),
            Err("references non-existent secret key: nope".to_owned())
        );
        assert_eq!(
            secret_payload(&o, &proj("nosec", &[], false)),
            Err("secrets \"nosec\" not found".to_owned())
        );
        // Standalone: kubelet's message.
        assert_eq!(
            secret_payload(&PodObjects::none("ns"), &proj("sec", &[], false)),
            Err("couldn't get secret ns/sec, no kubeClient defined".to_owned())
        );
    }

    #[test]
    fn env_values_as_kubelet() {
        let o = objects();
        use ObjectKind::{ConfigMap as C, Secret as S};
        assert_eq!(env_key(&o, C, "cfg", "a", false), Ok(Some("1".to_owned())));
        assert_eq!(
            env_key(&o, S, "sec", "pw", false),
            Ok(Some("s3cret".to_owned()))
        );
        assert_eq!(
            env_key(&o, C, "cfg", "zz", false),
            Err("couldn't find key zz in ConfigMap ns/cfg".to_owned())
        );
        assert_eq!(
            env_key(&o, S, "sec", "zz", false),
            Err("couldn't find key zz in Secret ns/sec".to_owned())
        );
        assert_eq!(env_key(&o, C, "cfg", "zz", true), Ok(None));
        assert_eq!(env_key(&o, C, "gone", "a", true), Ok(None));
        assert_eq!(
            env_key(&o, C, "gone", "a", false),
            Err("configmaps \"gone\" not found".to_owned())
        );
        assert_eq!(
            env_key(&PodObjects::none("ns"), C, "cfg", "a", false),
            Err("couldn't get configMap ns/cfg, no kubeClient defined".to_owned())
        );
        let (vars, invalid) = env_from(&o, S, "sec", "P_", false).expect("envFrom");
        assert_eq!(vars, [("P_pw".to_owned(), "s3cret".to_owned())]);
        assert_eq!(invalid, ["P_bad=name"]);
        assert_eq!(
            env_from(&o, C, "gone", "", true),
            Ok((Vec::new(), Vec::new()))
        );
        assert!(env_from(&o, C, "gone", "", false).is_err());
    }

    #[test]
    fn token_refresh_as_the_token_manager() {
        let exp = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        // 1 h token: refreshed at 80 % of its life (48 min after issue), less the jitter.
        assert_eq!(
            token_refresh_at(exp, 3600, Duration::ZERO),
            exp - Duration::from_secs(720)
        );
        assert_eq!(
            token_refresh_at(exp, 3600, Duration::from_secs(7)),
            exp - Duration::from_secs(727)
        );
        // A week-long token: refreshed at 24 h of age.
        let week = 7 * 24 * 3600;
        assert_eq!(
            token_refresh_at(exp, week, Duration::ZERO),
            exp - Duration::from_secs(u64::try_from(week).expect("week")) + TOKEN_MAX_TTL
        );
        let issued = exp - Duration::from_secs(3600);
        assert!(!token_needs_refresh(
            issued + Duration::from_secs(60),
            exp,
            3600,
            Duration::ZERO
        ));
        assert!(token_needs_refresh(
            exp - Duration::from_secs(700),
            exp,
            3600,
            Duration::ZERO
        ));
        // The clock ran back before the issue time.
        assert!(token_needs_refresh(
            issued - Duration::from_secs(1),
            exp,
            3600,
            Duration::ZERO
        ));
    }

    /// kubelet's `TestMakeEnvironmentVariables` service cases: master services always, the
    /// namespace's with links, headless ones never, a namespace service of a master's name
    /// taking its place.
    #[test]
    fn service_variables_as_from_services() {
        let svc = |ns: &str, name: &str, ip: &str, ports: serde_json::Value| -> Service {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": ns},
                "spec": {"clusterIP": ip, "ports": ports},
            }))
            .expect("service")
        };
        let services = vec![
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                serde_json::json!([{"name": "https", "port": 443}]),
            ),
            svc(
                "ns",
                "kubernetes",
                "10.96.9.9",
                serde_json::json!([{"port": 1}]),
            ),
            svc(
                "ns",
                "my-db",
                "10.96.0.20",
                serde_json::json!([{"port": 5432}, {"name": "metrics", "port": 9187, "protocol": "UDP"}]),
            ),
            svc("ns", "headless", "None", serde_json::json!([{"port": 80}])),
            svc(
                "other",
                "elsewhere",
                "10.96.0.30",
                serde_json::json!([{"port": 80}]),
            ),
        ];
        // Without the namespace's own "kubernetes": the master service's variables.
        let no_local: Vec<Service> = services
            .iter()
            .filter(|s| s.spec.as_ref().and_then(|p| p.cluster_ip.as_deref()) != Some("10.96.9.9"))
            .cloned()
            .collect();
        let env = service_env(&no_local, "ns", true);
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_PROTO"), Some("tcp"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_ADDR"), Some("10.96.0.1"));
        assert_eq!(get("MY_DB_SERVICE_HOST"), Some("10.96.0.20"));
        assert_eq!(get("MY_DB_SERVICE_PORT"), Some("5432"));
        assert_eq!(get("MY_DB_SERVICE_PORT_METRICS"), Some("9187"));
        assert_eq!(get("MY_DB_PORT_9187_UDP"), Some("udp://10.96.0.20:9187"));
        assert_eq!(env.len(), 8 + 2 + 1 + 1 + 4 + 4, "{env:?}");
        assert!(
            !env.keys()
                .any(|k| k.starts_with("HEADLESS") || k.starts_with("ELSEWHERE"))
        );
        // kubelet's map: a service of the pod's namespace replaces a master service of the
        // same name (the master is only added where the name is free).
        let env = service_env(&services, "ns", true);
        assert_eq!(
            env.get("KUBERNETES_SERVICE_HOST").map(String::as_str),
            Some("10.96.9.9")
        );
        // enableServiceLinks: false keeps only the master service.
        let env = service_env(&services, "ns", false);
        assert!(env.keys().all(|k| k.starts_with("KUBERNETES_")), "{env:?}");
        assert_eq!(env.len(), 8);
    }

    #[test]
    fn token_request_binds_the_pod() {
        let p =
            pod("metadata: {name: web, namespace: ns, uid: u-1}\nspec: {containers: [{name: c}]}");
        let tr = token_request(
            &p,
            &TokenRef {
                service_account: "default".to_owned(),
                audience: Some("api".to_owned()),
                expiration_seconds: 3607,
            },
        );
        let v = serde_json::to_value(&tr).expect("json");
        assert_eq!(v["spec"]["audiences"], serde_json::json!(["api"]));
        assert_eq!(v["spec"]["expirationSeconds"], 3607);
        assert_eq!(
            v["spec"]["boundObjectRef"],
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "u-1"})
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
