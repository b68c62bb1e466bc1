//! Reading the API objects pods need on the node (kubelet's configMap and secret managers
//! and its token manager), for pods from the API server in cluster mode.
//!
//! - ConfigMaps, Secrets and the Services of the pods' environment variables are read with a
//!   GET (a LIST for a namespace's Services) and kept: a read returns the last answer at
//!   once and refreshes it in the background when it is older than [`OBJECT_TTL`], so pods
//!   syncing together (every pod of a namespace mounts `kube-root-ca.crt`) share one request,
//!   and a slow or absent API server never holds a sync (a failed refresh keeps the last
//!   good answer, as an informer's cache would). Only the first read waits; an answer no
//!   pod read for [`CACHE_IDLE`] is dropped. A change reaches
//!   the volume within a sync or two (kubelet's `syncFrequency`), as with kubelet's
//!   watch-based managers.
//! - Service-account tokens come from the TokenRequest API (`serviceaccounts/<sa>/token`),
//!   bound to the pod, and are kept per pod until kubelet's token manager would refresh them:
//!   at 80 % of their life or 24 h of age, less up to 10 s of jitter. The pod worker wakes at
//!   that time ([`ApiObjects::next_refresh`]), so a token is rewritten before it expires
//!   whatever the sync period. A refresh that fails keeps the old token while it is valid.
//! - A pod's tokens are forgotten when its worker ends ([`ApiObjects::forget`]).

use crate::locks::lock;
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use kube::api::{ListParams, PostParams};

use crate::policy::objects::{self, Fetched, ObjectKind, ObjectRefs, PodObjects, TokenRef};

/// How long one answer about a ConfigMap, Secret or a namespace's Services is fresh.
pub const OBJECT_TTL: Duration = Duration::from_secs(2);
/// Each request's time limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A token as the token manager keeps it.
#[derive(Debug, Clone)]
struct CachedToken {
    token: String,
    expires: SystemTime,
    /// The TTL the server gave, and the jitter drawn for this token.
    ttl_seconds: i64,
    jitter: Duration,
    refresh_at: SystemTime,
}

type TokenKey = (String, TokenRef);

/// What is read: an object by namespace and name, or a namespace's services.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum What {
    ConfigMap(String, String),
    Secret(String, String),
    Services(String),
}

/// An answer of the API server.
#[derive(Debug, Clone)]
enum Answer {
    ConfigMap(Fetched<ConfigMap>),
    Secret(Fetched<Secret>),
    Services(Fetched<Vec<Service>>),
}

impl Answer {
    fn failed(&self) -> bool {
        matches!(
            self,
            Self::ConfigMap(Fetched::Failed(_))
                | Self::Secret(Fetched::Failed(_))
                | Self::Services(Fetched::Failed(_))
        )
    }
}

/// One cached answer: when it came, and whether a refresh is under way.
#[derive(Debug)]
struct Cached {
    at: Instant,
    answer: Answer,
    refreshing: bool,
    /// When a pod last read it: unread for [`CACHE_IDLE`] (its pods are gone), it is dropped.
    read_at: Instant,
}

/// How long an answer no pod reads is kept.
const CACHE_IDLE: Duration = Duration::from_secs(600);

/// The API objects of this node's pods: a client (made on first use from the kubeconfig,
/// made again after a failure), the last answer for each object, the tokens.
///
/// Like kubelet's informer caches, a read never waits on the API server once an answer is
/// known: an answer older than [`OBJECT_TTL`] is returned as is and refreshed in the
/// background, and a refresh that fails keeps the last good answer (an API outage or a slow
/// server changes nothing on the node). Only the first read of an object waits.
pub struct ApiObjects {
    kubeconfig: PathBuf,
    client: tokio::sync::Mutex<Option<kube::Client>>,
    answers: Mutex<HashMap<What, Cached>>,
    tokens: Mutex<HashMap<TokenKey, CachedToken>>,
}

impl std::fmt::Debug for ApiObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiObjects")
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

/// Why an object, the services or a token could not be read (the text a pod's status or
/// volume error shows; kept as text in the snapshot and the answer cache).
#[derive(Debug, thiserror::Error)]
enum ApiObjectsError {
    /// The API server client could not be made (the kubeconfig).
    #[error("{0}")]
    Client(#[source] Box<crate::sources::apiserver::ApiSourceError>),
    /// A read that failed (the cached answer's message).
    #[error("{0}")]
    Read(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The API server's answer: its message, else the error.
    #[error("{}", message(.0))]
    Api(Box<kube::Error>),
    #[error("the TokenRequest came back without a status")]
    NoTokenStatus,
    #[error("the TokenRequest came back without a token or its expiry")]
    NoToken,
    /// No token yet, and the request failed.
    #[error("failed to fetch token: {0}")]
    Token(#[source] Box<ApiObjectsError>),
    /// The token expired and its refresh failed.
    #[error("token of service account {service_account:?} expired and refresh failed: {source}")]
    Expired {
        service_account: String,
        #[source]
        source: Box<ApiObjectsError>,
    },
}

/// A kube error as kubelet shows it: the API server's message, else the error.
fn message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// kubelet's jitter: whole seconds in `[0, 10)`, drawn per token.
fn jitter() -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Duration::from_secs(u64::from(nanos % 10))
}

/// One GET of a namespaced object, with the time limit.
async fn get_one<T>(
    client: kube::Client,
    kind: ObjectKind,
    namespace: &str,
    name: &str,
) -> Fetched<T>
where
    T: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    T::DynamicType: Default,
{
    if !objects::valid_name(name) {
        return Fetched::Failed(format!("{name:?} is not a valid object name"));
    }
    let api: kube::Api<T> = kube::Api::namespaced(client, namespace);
    match tokio::time::timeout(REQUEST_TIMEOUT, api.get(name)).await {
        Err(_) => Fetched::Failed(format!(
            "get {} {namespace}/{name}: no answer within {REQUEST_TIMEOUT:?}",
            kind.resource()
        )),
        Ok(Ok(o)) => Fetched::Found(Arc::new(o)),
        Ok(Err(e)) if is_not_found(&e) => Fetched::NotFound,
        Ok(Err(e)) => Fetched::Failed(message(&e)),
    }
}

impl ApiObjects {
    #[must_use]
    pub fn new(kubeconfig: PathBuf) -> Self {
        Self {
            kubeconfig,
            client: tokio::sync::Mutex::new(None),
            answers: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
        }
    }

    async fn client(&self) -> Result<kube::Client, ApiObjectsError> {
        let mut c = self.client.lock().await;
        if let Some(c) = c.as_ref() {
            return Ok(c.clone());
        }
        let made = crate::sources::apiserver::client_from_kubeconfig(&self.kubeconfig)
            .await
            .map_err(|e| ApiObjectsError::Client(Box::new(e)))?;
        *c = Some(made.clone());
        Ok(made)
    }

    /// Asks the API server.
    async fn fetch(&self, what: &What) -> Answer {
        let client = match self.client().await {
            Ok(c) => c,
            Err(e) => {
                let e = e.to_string();
                return match what {
                    What::ConfigMap(..) => Answer::ConfigMap(Fetched::Failed(e)),
                    What::Secret(..) => Answer::Secret(Fetched::Failed(e)),
                    What::Services(_) => Answer::Services(Fetched::Failed(e)),
                };
            }
        };
        match what {
            What::ConfigMap(ns, name) => {
                Answer::ConfigMap(get_one(client, ObjectKind::ConfigMap, ns, name).await)
            }
            What::Secret(ns, name) => {
                Answer::Secret(get_one(client, ObjectKind::Secret, ns, name).await)
            }
            What::Services(ns) => {
                let api: kube::Api<Service> = kube::Api::namespaced(client, ns);
                Answer::Services(
                    match tokio::time::timeout(REQUEST_TIMEOUT, api.list(&ListParams::default()))
                        .await
                    {
                        Err(_) => Fetched::Failed(format!(
                            "list services in {ns}: no answer within {REQUEST_TIMEOUT:?}"
                        )),
                        Ok(Ok(list)) => Fetched::Found(Arc::new(
                            list.items
                                .into_iter()
                                .map(|mut s| {
                                    s.metadata.namespace.get_or_insert_with(|| ns.clone());
                                    s
                                })
                                .collect(),
                        )),
                        Ok(Err(e)) => Fetched::Failed(message(&e)),
                    },
                )
            }
        }
    }

    /// Keeps a new answer; a failure does not replace a good answer.
    fn store(&self, what: What, answer: Answer) -> Answer {
        let mut answers = lock(&self.answers);
        match answers.get_mut(&what) {
            Some(c) if answer.failed() && !c.answer.failed() => {
                tracing::debug!(?what, "API read failed; the last answer stays");
                c.refreshing = false;
                c.answer.clone()
            }
            _ => {
                let now = Instant::now();
                answers.retain(|_, c| now.duration_since(c.read_at) < CACHE_IDLE);
                answers.insert(
                    what,
                    Cached {
                        at: now,
                        answer: answer.clone(),
                        refreshing: false,
                        read_at: now,
                    },
                );
                answer
            }
        }
    }

    /// The answer for `what`: the cached one (refreshed in the background when older than
    /// [`OBJECT_TTL`]), else the API server's.
    async fn read(self: &Arc<Self>, what: What) -> Answer {
        {
            let mut answers = lock(&self.answers);
            if let Some(c) = answers.get_mut(&what)
                && !c.answer.failed()
            {
                c.read_at = Instant::now();
                if c.at.elapsed() >= OBJECT_TTL && !c.refreshing {
                    c.refreshing = true;
                    let me = self.clone();
                    let w = what.clone();
                    tokio::spawn(async move {
                        let a = me.fetch(&w).await;
                        me.store(w, a);
                    });
                }
                return c.answer.clone();
            }
        }
        let a = self.fetch(&what).await;
        self.store(what, a)
    }

    /// An image pull secret (kubelet's `getPullSecretsForPod`): a `kubernetes.io/dockerconfigjson`
    /// Secret's `.dockerconfigjson` or a `kubernetes.io/dockercfg` one's `.dockercfg`.
    pub async fn pull_secret(
        self: &Arc<Self>,
        namespace: &str,
        name: &str,
    ) -> crate::cri::images::PullSecret {
        use crate::cri::images::PullSecret;
        let what = What::Secret(namespace.to_owned(), name.to_owned());
        let secret = match self.read(what).await {
            Answer::Secret(Fetched::Found(s)) => s,
            Answer::Secret(Fetched::Failed(e)) => return PullSecret::Unavailable(e),
            _ => return PullSecret::Unavailable("not found".to_owned()),
        };
        let data = secret.data.clone().unwrap_or_default();
        let kind = secret.type_.as_deref().unwrap_or_default();
        let key = match kind {
            "kubernetes.io/dockerconfigjson" => ".dockerconfigjson",
            "kubernetes.io/dockercfg" => ".dockercfg",
            // Another type holds no registry credentials (kubelet skips it).
            _ => return PullSecret::Found(crate::policy::images::keyring::Keyring::default()),
        };
        match data.get(key) {
            Some(b) if !b.0.is_empty() => {
                PullSecret::parse(&format!("secret {namespace}/{name}"), &b.0)
            }
            _ => PullSecret::Invalid(format!("secret {namespace}/{name}: no {key} data")),
        }
    }

    /// The services of `namespace`.
    async fn services_of(
        self: &Arc<Self>,
        namespace: &str,
    ) -> Result<Vec<Service>, ApiObjectsError> {
        match self.read(What::Services(namespace.to_owned())).await {
            Answer::Services(Fetched::Found(s)) => Ok(s.as_ref().clone()),
            Answer::Services(Fetched::Failed(e)) => Err(ApiObjectsError::Read(e)),
            _ => Ok(Vec::new()),
        }
    }

    /// The services a pod's variables come from: `default`'s (its master services) and, with
    /// `enableServiceLinks`, the pod's namespace's.
    async fn pod_services(
        self: &Arc<Self>,
        pod: &Pod,
        namespace: &str,
    ) -> Result<Vec<Service>, ApiObjectsError> {
        let mut all = self.services_of("default").await?;
        if objects::service_links(pod) && namespace != "default" {
            all.extend(self.services_of(namespace).await?);
        }
        Ok(all)
    }

    /// A token for the pod (the token manager's `GetServiceAccountToken`).
    async fn token(&self, pod: &Pod, r: &TokenRef) -> Result<String, ApiObjectsError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let key = (uid, r.clone());
        let now = SystemTime::now();
        let cached = lock(&self.tokens).get(&key).cloned();
        if let Some(c) = &cached
            && !objects::token_needs_refresh(now, c.expires, c.ttl_seconds, c.jitter)
            && now < c.expires
        {
            return Ok(c.token.clone());
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let asked = self.request_token(pod, namespace, r).await;
        match (asked, cached) {
            (Ok(c), _) => {
                tracing::info!(pod = ?pod.metadata.name, service_account = %r.service_account, expires = ?c.expires, "service account token issued");
                let t = c.token.clone();
                lock(&self.tokens).insert(key, c);
                Ok(t)
            }
            (Err(e), None) => Err(ApiObjectsError::Token(Box::new(e))),
            (Err(e), Some(c)) if now >= c.expires => Err(ApiObjectsError::Expired {
                service_account: r.service_account.clone(),
                source: Box::new(e),
            }),
            (Err(e), Some(c)) => {
                tracing::warn!(error = %e, service_account = %r.service_account, "couldn't update token; the current one is still valid");
                Ok(c.token)
            }
        }
    }

    async fn request_token(
        &self,
        pod: &Pod,
        namespace: &str,
        r: &TokenRef,
    ) -> Result<CachedToken, ApiObjectsError> {
        let client = self.client().await?;
        let api: kube::Api<ServiceAccount> = kube::Api::namespaced(client, namespace);
        let tr = objects::token_request(pod, r);
        let got = tokio::time::timeout(
            REQUEST_TIMEOUT,
            api.create_token_request(&r.service_account, &PostParams::default(), &tr),
        )
        .await
        .map_err(|_| ApiObjectsError::Timeout(REQUEST_TIMEOUT))?
        .map_err(|e| ApiObjectsError::Api(Box::new(e)))?;
        let status = got.status.ok_or(ApiObjectsError::NoTokenStatus)?;
        let (Some(token), Some(expires)) = (status.token, status.expiration_timestamp) else {
            return Err(ApiObjectsError::NoToken);
        };
        let expires = SystemTime::from(expires.0);
        // The server's TTL (it may shorten or lengthen the request), as kubelet reads it.
        let ttl = got
            .spec
            .and_then(|s| s.expiration_seconds)
            .unwrap_or(r.expiration_seconds);
        let jitter = jitter();
        Ok(CachedToken {
            token,
            expires,
            ttl_seconds: ttl,
            jitter,
            refresh_at: objects::token_refresh_at(expires, ttl, jitter),
        })
    }

    /// The objects `refs` names, read for `pod`, and the services of its variables.
    pub async fn snapshot(self: &Arc<Self>, pod: &Pod, refs: &ObjectRefs) -> PodObjects {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let mut out = PodObjects {
            api: true,
            namespace: namespace.clone(),
            ..PodObjects::default()
        };
        for name in &refs.config_maps {
            let what = What::ConfigMap(namespace.clone(), name.clone());
            if let Answer::ConfigMap(f) = self.read(what).await {
                out.config_maps.insert(name.clone(), f);
            }
        }
        for name in &refs.secrets {
            let what = What::Secret(namespace.clone(), name.clone());
            if let Answer::Secret(f) = self.read(what).await {
                out.secrets.insert(name.clone(), f);
            }
        }
        for t in &refs.tokens {
            let got = self.token(pod, t).await.map_err(|e| e.to_string());
            out.tokens.insert(t.clone(), got);
        }
        out.services = Some(
            self.pod_services(pod, &namespace)
                .await
                .map_err(|e| e.to_string()),
        );
        out
    }

    /// When the pod's first token is due for refresh.
    #[must_use]
    pub fn next_refresh(&self, uid: &str) -> Option<SystemTime> {
        lock(&self.tokens)
            .iter()
            .filter(|((u, _), _)| u == uid)
            .map(|(_, c)| c.refresh_at)
            .min()
    }

    /// Drops the pod's tokens (kubelet's `DeleteServiceAccountToken`).
    pub fn forget(&self, uid: &str) {
        lock(&self.tokens).retain(|(u, _), _| u != uid);
    }
}
