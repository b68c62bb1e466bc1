//! kubelet's secure port (`pkg/kubelet/server`, `server/auth.go`, `cmd/kubelet/app/auth.go`):
//! TLS (rustls) with the configured serving certificate or, without one, a self-signed pair as
//! kubelet makes it (`<stateDir>/pki/kubelet.crt`, `kubelet.key`); every request
//! authenticated (a client certificate signed by `authentication.x509.clientCAFile`: user its
//! CN, groups its O; else a bearer token through a TokenReview, cached for
//! `authentication.webhook.cacheTTL`; else, when `authentication.anonymous.enabled`,
//! `system:anonymous`) and authorized (`authorization.mode: Webhook`: a SubjectAccessReview
//! on `nodes/<subresource>` as kubelet maps the path, allowed answers cached for
//! `cacheAuthorizedTTL`, others for `cacheUnauthorizedTTL`; `AlwaysAllow`).
//!
//! As kubelet's (`tls.RequestClientCert`), the handshake asks for a client certificate but
//! never fails on one: a certificate that does not verify (expired, another CA, no client-auth
//! usage) is refused at the HTTP layer with 401 `Unauthorized`, and so is a token the
//! TokenReview rejects; anonymous applies only to a request with no credentials at all.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    extract::{Request, State},
    http::{Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use rustls::{
    pki_types::{CertificateDer, UnixTime},
    server::danger::ClientCertVerifier,
};

mod cert;

pub use cert::{
    BOOTSTRAP_CURRENT, BootstrapCert, Tls, bootstrap, ensure_self_signed, tls, tls_with,
};

/// Errors of the secure port: setting it up (each names its file), bootstrapping its
/// serving certificate, and the reviews of its requests.
#[derive(Debug, thiserror::Error)]
pub enum SecureError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("the serving certificate: {0}")]
    Generate(String),
    #[error("TLS: {0}")]
    Tls(String),
    /// The API server client (the kubeconfig unreadable or refused).
    #[error("{0}")]
    ApiClient(#[source] Box<crate::sources::apiserver::ApiSourceError>),
    #[error("serverTLSBootstrap needs an API server")]
    CsrNoApiServer,
    /// The CSR's key or request could not be made.
    #[error("{0}")]
    Csr(#[source] rcgen::Error),
    #[error("creating the CSR: {0}")]
    CsrCreate(#[source] Box<kube::Error>),
    #[error("reading CSR {name}: {source}")]
    CsrRead {
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// The CSR was denied or failed (`condition`), with the signer's message.
    #[error("CSR {name} {condition}: {message}")]
    CsrRefused {
        name: String,
        condition: String,
        message: String,
    },
    #[error("no API server (no kubeconfig) for the reviews")]
    NoReviewClient,
    #[error("TokenReview: {0}")]
    TokenReview(#[source] Box<kube::Error>),
    /// The TokenReview's own error (its status).
    #[error("{0}")]
    TokenRejected(String),
    #[error("SubjectAccessReview: {0}")]
    AccessReview(#[source] Box<kube::Error>),
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> SecureError {
    SecureError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// `authorization.mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthzMode {
    AlwaysAllow,
    Webhook {
        allowed_ttl: Duration,
        denied_ttl: Duration,
    },
}

/// What the secure port is set up from.
#[derive(Clone, Debug)]
pub struct SecureOptions {
    /// `tlsCertFile` and `tlsPrivateKeyFile` (both or neither).
    pub cert_files: Option<(PathBuf, PathBuf)>,
    /// Where the self-signed pair is kept (kubelet's `--cert-dir`).
    pub cert_dir: PathBuf,
    /// The name in the self-signed certificate (the node's hostname).
    pub hostname: String,
    /// `authentication.x509.clientCAFile`.
    pub client_ca: Option<PathBuf>,
    /// `authentication.anonymous.enabled`.
    pub anonymous: bool,
    /// `authentication.webhook`: the TokenReview cache TTL when enabled.
    pub token_webhook: Option<Duration>,
    pub authz: AuthzMode,
    /// The node's name (the reviews' `nodes/<name>`).
    pub node_name: String,
    /// Where TokenReviews and SubjectAccessReviews go.
    pub kubeconfig: Option<PathBuf>,
    /// `serverTLSBootstrap`: the serving certificate from a CSR to the API server
    /// (`kubernetes.io/kubelet-serving`), kept as `<cert_dir>/kubelet-server-current.pem`.
    pub bootstrap: bool,
    /// The node's addresses for the CSR's SANs.
    pub addresses: Vec<String>,
}

/// The client's certificate chain of one connection (none: no certificate given).
#[derive(Clone, Debug, Default)]
pub struct Peer {
    pub certs: Vec<CertificateDer<'static>>,
}

/// An authenticated user (`user.Info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    fn anonymous() -> Self {
        Self {
            name: "system:anonymous".to_owned(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".to_owned()],
        }
    }
}

/// kubelet's request attributes: the API verb of a method (`""` for any other).
#[must_use]
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::GET => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

fn is_subpath(subpath: &str, path: &str) -> bool {
    let path = path.trim_end_matches('/');
    subpath == path
        || (subpath.starts_with(path) && subpath.as_bytes().get(path.len()) == Some(&b'/'))
}

/// `GetRequestAttributes`: the `nodes/<subresource>` checks of a path, tried in order (the
/// first allowed wins): with `KubeletFineGrainedAuthz` (on since 1.33) `/pods`, `/healthz`,
/// `/configz`, `/statusz`, `/runningpods` first, falling back to `proxy`; `/stats`, `/metrics`,
/// `/logs`, `/checkpoint` alone; anything else `proxy`.
#[must_use]
pub fn subresources(path: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    for (prefix, sub) in [
        ("/pods", "pods"),
        ("/healthz", "healthz"),
        ("/configz", "configz"),
        ("/statusz", "statusz"),
        ("/runningpods", "pods"),
    ] {
        if is_subpath(path, prefix) {
            out.push(sub);
            break;
        }
    }
    let second = [
        ("/stats", "stats"),
        ("/metrics", "metrics"),
        ("/logs", "log"),
        ("/checkpoint", "checkpoint"),
    ]
    .iter()
    .find(|(prefix, _)| is_subpath(path, prefix))
    .map_or("proxy", |(_, s)| s);
    out.push(second);
    out
}

/// kubelet's 403 body.
#[must_use]
pub fn forbidden_message(user: &str, verb: &str, subresources: &[&str]) -> String {
    format!(
        "Forbidden (user={user}, verb={verb}, resource=nodes, subresource(s)=[{}])\n",
        subresources.join(" ")
    )
}

/// Authentication and authorization of the secure port, with their caches.
pub struct Auth {
    opts: SecureOptions,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    client: tokio::sync::OnceCell<kube::Client>,
    tokens: Mutex<HashMap<String, (Instant, Option<UserInfo>)>>,
    decisions: Mutex<HashMap<String, (Instant, bool)>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth").finish_non_exhaustive()
    }
}

/// A cache holds at most this many entries.
const CACHE_MAX: usize = 8192;

/// Keeps `value` under `key` from now; a full cache starts over (its entries are short-lived).
fn cache_put<V>(map: &Mutex<HashMap<String, (Instant, V)>>, key: String, value: V) {
    let mut m = crate::locks::lock(map);
    if m.len() >= CACHE_MAX {
        m.clear();
    }
    m.insert(key, (Instant::now(), value));
}

/// The outcome of authentication.
enum Authn {
    User(UserInfo),
    Unauthorized(String),
}

impl Auth {
    #[must_use]
    pub fn new(opts: SecureOptions, tls: &Tls) -> Self {
        Self {
            opts,
            verifier: tls.verifier.clone(),
            client: tokio::sync::OnceCell::new(),
            tokens: Mutex::new(HashMap::new()),
            decisions: Mutex::new(HashMap::new()),
        }
    }

    async fn client(&self) -> Result<kube::Client, SecureError> {
        let Some(k) = &self.opts.kubeconfig else {
            return Err(SecureError::NoReviewClient);
        };
        self.client
            .get_or_try_init(|| async {
                crate::sources::apiserver::client_from_kubeconfig(k)
                    .await
                    .map_err(|e| SecureError::ApiClient(Box::new(e)))
            })
            .await
            .cloned()
    }

    fn by_certificate(&self, peer: &Peer) -> Option<Authn> {
        let (verifier, leaf) = (self.verifier.as_ref()?, peer.certs.first()?);
        if let Err(e) = verifier.verify_client_cert(leaf, &peer.certs[1..], UnixTime::now()) {
            return Some(Authn::Unauthorized(format!(
                "verifying the client certificate: {e}"
            )));
        }
        let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok())
            .unwrap_or_default();
        if cn.is_empty() {
            return None;
        }
        let mut groups: Vec<String> = cert
            .subject()
            .iter_organization()
            .filter_map(|a| a.as_str().ok().map(str::to_owned))
            .collect();
        groups.push("system:authenticated".to_owned());
        Some(Authn::User(UserInfo {
            name: cn.to_owned(),
            uid: String::new(),
            groups,
        }))
    }

    async fn by_token(&self, token: &str, ttl: Duration) -> Authn {
        // The token itself is not kept: its digest is the key (kubelet's cache keys on an
        // HMAC of it).
        let key = {
            use sha2::Digest as _;
            format!("{:x}", sha2::Sha256::digest(token.as_bytes()))
        };
        let cached = crate::locks::lock(&self.tokens)
            .get(&key)
            .filter(|(at, _)| at.elapsed() < ttl)
            .map(|(_, u)| u.clone());
        let answer = match cached {
            Some(a) => a,
            None => match self.token_review(token).await {
                Ok(a) => {
                    cache_put(&self.tokens, key, a.clone());
                    a
                }
                // Errors are not cached.
                Err(e) => return Authn::Unauthorized(e.to_string()),
            },
        };
        match answer {
            Some(mut u) => {
                u.groups.push("system:authenticated".to_owned());
                Authn::User(u)
            }
            None => Authn::Unauthorized("invalid bearer token".to_owned()),
        }
    }

    async fn token_review(&self, token: &str) -> Result<Option<UserInfo>, SecureError> {
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        let api: kube::Api<TokenReview> = kube::Api::all(self.client().await?);
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                ..Default::default()
            },
            ..Default::default()
        };
        let got = api
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(|e| SecureError::TokenReview(Box::new(e)))?;
        let status = got.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return match status.error {
                Some(e) if !e.is_empty() => Err(SecureError::TokenRejected(e)),
                _ => Ok(None),
            };
        }
        let u = status.user.unwrap_or_default();
        Ok(Some(UserInfo {
            name: u.username.unwrap_or_default(),
            uid: u.uid.unwrap_or_default(),
            groups: u.groups.unwrap_or_default(),
        }))
    }

    /// The request's user: certificate, then bearer token, then anonymous.
    async fn authenticate(&self, peer: Option<Arc<Peer>>, bearer: Option<String>) -> Authn {
        if let Some(peer) = peer
            && let Some(a) = self.by_certificate(&peer)
        {
            return a;
        }
        if let (Some(token), Some(ttl)) = (bearer, self.opts.token_webhook) {
            return self.by_token(&token, ttl).await;
        }
        if self.opts.anonymous {
            return Authn::User(UserInfo::anonymous());
        }
        Authn::Unauthorized("no credentials".to_owned())
    }

    /// One `nodes/<sub>` check: allowed or not, or the review's error.
    async fn authorize_one(
        &self,
        user: &UserInfo,
        verb: &str,
        sub: &str,
    ) -> Result<bool, SecureError> {
        let AuthzMode::Webhook {
            allowed_ttl,
            denied_ttl,
        } = self.opts.authz
        else {
            return Ok(true);
        };
        let key = format!(
            "{}\u{0}{}\u{0}{}\u{0}{verb}\u{0}{sub}",
            user.name,
            user.uid,
            user.groups.join(",")
        );
        let cached = crate::locks::lock(&self.decisions)
            .get(&key)
            .filter(|(at, allowed)| at.elapsed() < if *allowed { allowed_ttl } else { denied_ttl })
            .map(|(_, a)| *a);
        if let Some(a) = cached {
            return Ok(a);
        }
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.client().await?);
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(user.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_owned()),
                    version: Some("v1".to_owned()),
                    resource: Some("nodes".to_owned()),
                    subresource: Some(sub.to_owned()),
                    name: Some(self.opts.node_name.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let got = api
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(|e| SecureError::AccessReview(Box::new(e)))?;
        let st = got.status.unwrap_or_default();
        let allowed = st.allowed && st.denied != Some(true);
        cache_put(&self.decisions, key, allowed);
        Ok(allowed)
    }
}

fn plain(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// The secure port's filter (kubelet's `InstallAuthFilter`): 401, 403 or 500 with kubelet's
/// texts, else the handler.
pub async fn filter(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<Arc<Peer>>().cloned();
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty());
    let path = req.uri().path().to_owned();
    let user = match auth.authenticate(peer, bearer).await {
        Authn::User(u) => u,
        Authn::Unauthorized(why) => {
            tracing::info!(path = %path, reason = %why, "secure port: unauthorized");
            return plain(StatusCode::UNAUTHORIZED, "Unauthorized".to_owned());
        }
    };
    let verb = verb(req.method());
    let subs = subresources(&path);
    for sub in &subs {
        match auth.authorize_one(&user, verb, sub).await {
            Ok(true) => return next.run(req).await,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, user = %user.name, "secure port: authorization error");
                return plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "Authorization error (user={}, verb={verb}, resource=nodes, subresource={sub})",
                        user.name
                    ),
                );
            }
        }
    }
    plain(
        StatusCode::FORBIDDEN,
        forbidden_message(&user.name, verb, &subs),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// auth_test.go's `TestAuthzAttributes` paths, with the fine-grained checks.
    #[test]
    fn paths_map_to_kubelets_subresources() {
        for (path, want) in [
            ("/pods", vec!["pods", "proxy"]),
            ("/pods/", vec!["pods", "proxy"]),
            ("/runningpods/", vec!["pods", "proxy"]),
            ("/healthz", vec!["healthz", "proxy"]),
            ("/healthz/log", vec!["healthz", "proxy"]),
            ("/configz", vec!["configz", "proxy"]),
            ("/stats/summary", vec!["stats"]),
            ("/stats", vec!["stats"]),
            ("/metrics", vec!["metrics"]),
            ("/metrics/resource", vec!["metrics"]),
            ("/logs/", vec!["log"]),
            ("/containerLogs/ns/pod/c", vec!["proxy"]),
            ("/exec/ns/pod/c", vec!["proxy"]),
            ("/portForward/ns/pod", vec!["proxy"]),
            ("/podsx", vec!["proxy"]),
            ("/statsx", vec!["proxy"]),
            ("/debug/pprof/profile", vec!["proxy"]),
        ] {
            assert_eq!(subresources(path), want, "{path}");
        }
        assert_eq!(verb(&Method::GET), "get");
        assert_eq!(verb(&Method::POST), "create");
        assert_eq!(verb(&Method::HEAD), "");
        assert_eq!(
            forbidden_message("bob", "get", &["pods", "proxy"]),
            "Forbidden (user=bob, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
        );
    }

    #[test]
    fn the_self_signed_pair_is_made_once_and_loads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (crt, key) = ensure_self_signed(dir.path(), "node-1").expect("generate");
        let first = std::fs::read(&crt).expect("crt");
        let text = String::from_utf8_lossy(&first).into_owned();
        assert_eq!(text.matches("BEGIN CERTIFICATE").count(), 2, "leaf then CA");
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&key).expect("key").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let again = ensure_self_signed(dir.path(), "node-1").expect("reuse");
        assert_eq!(
            std::fs::read(&again.0).expect("crt"),
            first,
            "kept, not remade"
        );
        let opts = SecureOptions {
            cert_files: None,
            cert_dir: dir.path().to_path_buf(),
            hostname: "node-1".to_owned(),
            client_ca: Some(crt.clone()),
            anonymous: false,
            token_webhook: None,
            authz: AuthzMode::AlwaysAllow,
            node_name: "node-1".to_owned(),
            kubeconfig: None,
            bootstrap: false,
            addresses: Vec::new(),
        };
        let t = tls(&opts).expect("tls");
        assert!(t.verifier.is_some());
        let bad = SecureOptions {
            cert_files: Some((dir.path().join("nope.crt"), key)),
            ..opts
        };
        let e = tls(&bad).map(|_| ()).map_err(|e| e.to_string());
        assert!(e.as_ref().is_err_and(|m| m.contains("nope.crt")), "{e:?}");
    }
}
