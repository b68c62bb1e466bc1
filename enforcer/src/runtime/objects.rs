//! Reading the API objects pods need on the node (kubelet's configMap and secret managers
//! and its token manager), for pods from the API server in cluster mode.
//!
//! - ConfigMaps and Secrets are read with a GET at each pod sync that needs them, each
//!   answer kept for [`OBJECT_TTL`] so that pods syncing together (every pod of a namespace
//!   mounts `kube-root-ca.crt`) share one request. A change reaches the volume at the next
//!   sync (kubelet's `syncFrequency`), as with kubelet's watch-based managers.
//! - Service-account tokens come from the TokenRequest API (`serviceaccounts/<sa>/token`),
//!   bound to the pod, and are kept per pod until kubelet's token manager would refresh them:
//!   at 80 % of their life or 24 h of age, less up to 10 s of jitter. The pod worker wakes at
//!   that time ([`ApiObjects::next_refresh`]), so a token is rewritten before it expires
//!   whatever the sync period. A refresh that fails keeps the old token while it is valid.
//! - A pod's tokens are forgotten when its worker ends ([`ApiObjects::forget`]).

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::PostParams;

use crate::policy::objects::{self, Fetched, ObjectKind, ObjectRefs, PodObjects, TokenRef};

/// How long one answer about a ConfigMap or Secret is reused.
pub const OBJECT_TTL: Duration = Duration::from_secs(2);
/// Each request's time limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A token as the token manager keeps it.
#[derive(Debug, Clone)]
struct CachedToken {
    token: String,
    expires: SystemTime,
    refresh_at: SystemTime,
}

type TokenKey = (String, TokenRef);
/// Answers by (namespace, name), with when they came.
type Answers<T> = Mutex<HashMap<(String, String), (Instant, Fetched<T>)>>;

/// The API objects of this node's pods: a client (made on first use from the kubeconfig,
/// made again after a failure), the answers of the last [`OBJECT_TTL`], the tokens.
pub struct ApiObjects {
    kubeconfig: PathBuf,
    client: tokio::sync::Mutex<Option<kube::Client>>,
    config_maps: Answers<ConfigMap>,
    secrets: Answers<Secret>,
    tokens: Mutex<HashMap<TokenKey, CachedToken>>,
}

impl std::fmt::Debug for ApiObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiObjects")
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

impl ApiObjects {
    #[must_use]
    pub fn new(kubeconfig: PathBuf) -> Self {
        Self {
            kubeconfig,
            client: tokio::sync::Mutex::new(None),
            config_maps: Mutex::new(HashMap::new()),
            secrets: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
        }
    }

    async fn client(&self) -> Result<kube::Client, String> {
        let mut c = self.client.lock().await;
        if let Some(c) = c.as_ref() {
            return Ok(c.clone());
        }
        let made = super::apiserver::client_from_kubeconfig(&self.kubeconfig)
            .await
            .map_err(|e| e.to_string())?;
        *c = Some(made.clone());
        Ok(made)
    }

    /// One object, from the last [`OBJECT_TTL`] or the API server.
    async fn get<T>(
        &self,
        cache: &Answers<T>,
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
        let key = (namespace.to_owned(), name.to_owned());
        if let Some((at, f)) = lock(cache).get(&key)
            && at.elapsed() < OBJECT_TTL
        {
            return f.clone();
        }
        let fetched = if objects::valid_name(name) {
            match self.client().await {
                Err(e) => Fetched::Failed(e),
                Ok(client) => {
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
            }
        } else {
            Fetched::Failed(format!("{name:?} is not a valid object name"))
        };
        lock(cache).insert(key, (Instant::now(), fetched.clone()));
        fetched
    }

    /// A token for the pod (the token manager's `GetServiceAccountToken`).
    async fn token(&self, pod: &Pod, r: &TokenRef) -> Result<String, String> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let key = (uid, r.clone());
        let now = SystemTime::now();
        let cached = lock(&self.tokens).get(&key).cloned();
        if let Some(c) = &cached
            && now < c.refresh_at
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
            (Err(e), None) => Err(format!("failed to fetch token: {e}")),
            (Err(e), Some(c)) if now >= c.expires => Err(format!(
                "token of service account {:?} expired and refresh failed: {e}",
                r.service_account
            )),
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
    ) -> Result<CachedToken, String> {
        let client = self.client().await?;
        let api: kube::Api<ServiceAccount> = kube::Api::namespaced(client, namespace);
        let tr = objects::token_request(pod, r);
        let got = tokio::time::timeout(
            REQUEST_TIMEOUT,
            api.create_token_request(&r.service_account, &PostParams::default(), &tr),
        )
        .await
        .map_err(|_| format!("no answer within {REQUEST_TIMEOUT:?}"))?
        .map_err(|e| message(&e))?;
        let status = got
            .status
            .ok_or_else(|| "the TokenRequest came back without a status".to_owned())?;
        let (Some(token), Some(expires)) = (status.token, status.expiration_timestamp) else {
            return Err("the TokenRequest came back without a token or its expiry".to_owned());
        };
        let expires = SystemTime::from(expires.0);
        // The server's TTL (it may shorten or lengthen the request), as kubelet reads it.
        let ttl = got
            .spec
            .and_then(|s| s.expiration_seconds)
            .unwrap_or(r.expiration_seconds);
        Ok(CachedToken {
            token,
            expires,
            refresh_at: objects::token_refresh_at(expires, ttl, jitter()),
        })
    }

    /// The objects `refs` names, read for `pod`.
    pub async fn snapshot(&self, pod: &Pod, refs: &ObjectRefs) -> PodObjects {
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
            let f = self
                .get(&self.config_maps, ObjectKind::ConfigMap, &namespace, name)
                .await;
            out.config_maps.insert(name.clone(), f);
        }
        for name in &refs.secrets {
            let f = self
                .get(&self.secrets, ObjectKind::Secret, &namespace, name)
                .await;
            out.secrets.insert(name.clone(), f);
        }
        for t in &refs.tokens {
            let got = self.token(pod, t).await;
            out.tokens.insert(t.clone(), got);
        }
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
