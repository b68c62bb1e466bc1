//! A strict fake of the Kubernetes API server, for the cluster-mode tests (no real API server is
//! reachable here): plain HTTP/1.1 on 127.0.0.1, written on tokio by hand.
//!
//! What it serves, as the real server does:
//! - pods: list and watch (`/api/v1/pods`, `/api/v1/namespaces/{ns}/pods`, with
//!   `fieldSelector=spec.nodeName=...` and `resourceVersion` to resume a watch), create, get,
//!   update (PUT), patch, delete (graceful: `deletionTimestamp` + `deletionGracePeriodSeconds`
//!   first, removal at grace 0 or when the pod is terminal or unscheduled), and the `status`
//!   subresource (get, update, patch: only `status` changes through it, only the rest through
//!   the main resource);
//! - nodes and `nodes/{name}/status`; `coordination.k8s.io/v1` leases; core/v1 and
//!   `events.k8s.io/v1` events (create, get, update, patch, list).
//!
//! Strictness: every body is decoded into k8s-openapi's type of the resource; an undecodable
//! body, a `kind`/`apiVersion` that is not the resource's, or a name / namespace differing from
//! the URL's is answered `422 Invalid` (the real server answers `400` for malformed JSON: both
//! are refusals, the client sees an error either way); a missing object `404 NotFound`; a create
//! of an existing name `409 AlreadyExists`; an update or patch whose `metadata.resourceVersion`
//! (or `metadata.uid`, kubelet's precondition) is not the stored one `409 Conflict`. Every write
//! assigns a new `resourceVersion` and is sent to the open watches.
//!
//! Patches: `application/merge-patch+json` is RFC 7386; `application/strategic-merge-patch+json`
//! of a pod merges its keyed lists (`status.conditions` by `type`, `podIPs` / `hostIPs` by
//! `ip`: `$setElementOrder`, `$patch: delete`), as kubelet's `PatchPodStatus` needs; of any
//! other kind it is applied as a JSON merge patch (lists replaced: the enforcer sends whole
//! lists there); JSON patch and server-side apply are answered `415`.
//!
//! [`FakeApi::stop`] and [`FakeApi::restart`] take it away and bring it back on the same port
//! (open connections, watches included, are cut), with its objects kept.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        authentication::v1::TokenRequest,
        coordination::v1::Lease,
        core::v1::{ConfigMap, Event, Node, Pod, Secret, Service},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::mpsc,
    task::JoinSet,
};

/// The resources the fake stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Pod,
    Node,
    Lease,
    /// core/v1 events.
    Event,
    /// events.k8s.io/v1 events (stored apart from core ones).
    EventV1,
    ConfigMap,
    Secret,
    Service,
}

impl Kind {
    fn api_version(self) -> &'static str {
        match self {
            Self::Pod
            | Self::Node
            | Self::Event
            | Self::ConfigMap
            | Self::Secret
            | Self::Service => "v1",
            Self::Lease => "coordination.k8s.io/v1",
            Self::EventV1 => "events.k8s.io/v1",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Self::Pod => "Pod",
            Self::Node => "Node",
            Self::Lease => "Lease",
            Self::Event | Self::EventV1 => "Event",
            Self::ConfigMap => "ConfigMap",
            Self::Secret => "Secret",
            Self::Service => "Service",
        }
    }

    fn namespaced(self) -> bool {
        self != Self::Node
    }

    /// Decodes `v` into the resource's k8s-openapi type and returns its metadata.
    fn decode(self, v: &Value) -> Result<ObjectMeta, String> {
        fn meta<T: DeserializeOwned>(
            v: &Value,
            f: impl Fn(T) -> ObjectMeta,
        ) -> Result<ObjectMeta, String> {
            serde_json::from_value::<T>(v.clone())
                .map(f)
                .map_err(|e| e.to_string())
        }
        match self {
            Self::Pod => meta::<Pod>(v, |p| p.metadata),
            Self::Node => meta::<Node>(v, |n| n.metadata),
            Self::Lease => meta::<Lease>(v, |l| l.metadata),
            Self::Event => meta::<Event>(v, |e| e.metadata),
            Self::EventV1 => meta::<k8s_openapi::api::events::v1::Event>(v, |e| e.metadata),
            Self::ConfigMap => meta::<ConfigMap>(v, |c| c.metadata),
            Self::Secret => meta::<Secret>(v, |s| s.metadata),
            Self::Service => meta::<Service>(v, |s| s.metadata),
        }
    }
}

/// One request as the fake received it.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    /// Path and query, percent-decoded.
    pub path: String,
    pub content_type: String,
    /// The body, when it was JSON.
    pub body: Option<Value>,
    pub status: u16,
    pub at: Instant,
}

type Key = (Kind, String, String);

#[derive(Default)]
struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// Every change: (resourceVersion, kind, watch event line, node of a pod).
    history: Vec<(u64, Kind, String, Option<String>)>,
    watches: Vec<Watch>,
    requests: Vec<Request>,
    uid_seq: u64,
    /// Writes to interfere with: (path fragment, how many more).
    interfere: Vec<(String, u32)>,
    /// Writes to fail: (path fragment, the fault, how many more).
    /// (path fragment, body fragment, fault, how many more).
    faults: Vec<(String, String, Fault, u32)>,
    /// How long every answer (but a watch's) is held back: a slow server.
    delay: Duration,
    /// Service-account tokens issued, in order.
    tokens: Vec<IssuedToken>,
    /// The TTL every token gets whatever was asked (`None`: as asked).
    token_ttl: Option<i64>,
    /// TokenReview: bearer token -> (user, groups).
    reviewed_tokens: BTreeMap<String, (String, Vec<String>)>,
    /// SubjectAccessReview: what is allowed, as (user or group, verb, resource/subresource).
    access_rules: Vec<(String, String, String)>,
    /// The reviews answered, in order: (kind, the request's spec).
    reviews: Vec<(String, Value)>,
    /// CertificateSigningRequests by name.
    csrs: BTreeMap<String, Value>,
    /// Where `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward` are proxied.
    node_proxy: Option<NodeProxy>,
}

/// The node's secure port, as the API server reaches it (its `kubelet-client` certificate).
#[derive(Clone, Debug)]
pub struct NodeProxy {
    pub port: u16,
    /// The name the node's certificate carries.
    pub server_name: String,
    /// The CA the node's certificate is verified against.
    pub server_ca: PathBuf,
    /// The API server's client certificate and key for the node.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// A token the fake's TokenRequest endpoint issued.
#[derive(Clone, Debug)]
pub struct IssuedToken {
    pub token: String,
    pub namespace: String,
    pub service_account: String,
    /// The request as it came (spec: audiences, expirationSeconds, boundObjectRef).
    pub request: Value,
    /// The TTL given, in seconds.
    pub ttl: i64,
    pub issued: Instant,
}

struct Watch {
    kind: Kind,
    namespace: Option<String>,
    node: Option<String>,
    tx: mpsc::UnboundedSender<String>,
}

impl Store {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Stores (or removes, for `DELETED`) and tells the watches.
    fn commit(&mut self, key: Key, mut obj: Value, event: &str) -> Value {
        let rv = self.next_rv();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        obj["apiVersion"] = json!(key.0.api_version());
        obj["kind"] = json!(key.0.kind());
        if event == "DELETED" {
            self.objects.remove(&key);
        } else {
            self.objects.insert(key.clone(), obj.clone());
        }
        let node = (key.0 == Kind::Pod)
            .then(|| obj["spec"]["nodeName"].as_str().map(str::to_owned))
            .flatten();
        let line = json!({"type": event, "object": obj}).to_string();
        self.history.push((rv, key.0, line.clone(), node.clone()));
        self.watches.retain(|w| {
            if w.kind != key.0
                || w.namespace.as_ref().is_some_and(|ns| *ns != key.1)
                || (w.node.is_some() && w.node != node)
            {
                return !w.tx.is_closed();
            }
            w.tx.send(line.clone()).is_ok()
        });
        obj
    }
}

/// The fake API server; stops on drop.
pub struct FakeApi {
    pub addr: SocketAddr,
    state: Arc<Mutex<Store>>,
    /// The accept loop (owning every connection), while it serves.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn lock(m: &Mutex<Store>) -> MutexGuard<'_, Store> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

impl FakeApi {
    /// Starts on a free port of 127.0.0.1.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(Store::default()));
        let task = tokio::spawn(accept(listener, state.clone()));
        Self {
            addr,
            state,
            task: Mutex::new(Some(task)),
        }
    }

    /// Takes the server away: the port refuses connections and every open one is cut.
    pub async fn stop(&self) {
        let task = self.task.lock().map(|mut t| t.take()).unwrap_or_default();
        if let Some(t) = task {
            t.abort();
            let _ = t.await;
        }
        // Watches end with their connections.
        lock(&self.state).watches.clear();
    }

    /// Brings it back on the same port, objects kept.
    pub async fn restart(&self) {
        self.stop().await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) => {
                    assert!(Instant::now() < deadline, "rebinding {}: {e}", self.addr);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let task = tokio::spawn(accept(listener, self.state.clone()));
        if let Ok(mut t) = self.task.lock() {
            *t = Some(task);
        }
    }

    /// A kubeconfig file in `dir` pointing at the fake.
    #[must_use]
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: nobody\nusers:\n- name: nobody\n  user: {{}}\ncurrent-context: fake\n",
            self.addr
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    fn key(kind: Kind, namespace: &str, name: &str) -> Key {
        let ns = if kind.namespaced() { namespace } else { "" };
        (kind, ns.to_owned(), name.to_owned())
    }

    /// Creates or replaces an object as a controller would (a pod's `uid` is kept if given).
    pub fn put(&self, kind: Kind, obj: Value) -> Value {
        kind.decode(&obj).expect("a valid object");
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let name = obj["metadata"]["name"].as_str().expect("name").to_owned();
        let mut obj = obj;
        if kind.namespaced() {
            obj["metadata"]["namespace"] = json!(ns);
        }
        let key = Self::key(kind, &ns, &name);
        let mut st = lock(&self.state);
        if obj["metadata"]["uid"].as_str().is_none() {
            st.uid_seq += 1;
            obj["metadata"]["uid"] = json!(format!("fake-uid-{}", st.uid_seq));
        }
        let event = if st.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        st.commit(key, obj, event)
    }

    /// A pod as a controller would create it.
    pub fn put_pod(&self, pod: Value) -> Value {
        self.put(Kind::Pod, pod)
    }

    /// The stored object.
    #[must_use]
    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.state)
            .objects
            .get(&Self::key(kind, namespace, name))
            .cloned()
    }

    /// Every stored object of a kind.
    #[must_use]
    pub fn list(&self, kind: Kind) -> Vec<Value> {
        lock(&self.state)
            .objects
            .iter()
            .filter(|(k, _)| k.0 == kind)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Deletes as `kubectl delete --grace-period=N` does (through the same code as DELETE).
    pub fn delete_pod(&self, namespace: &str, name: &str, grace: Option<i64>) -> u16 {
        let mut st = lock(&self.state);
        delete(&mut st, Kind::Pod, namespace, name, grace, &Value::Null).0
    }

    /// The next `n` updates or patches whose path contains `fragment` find the object changed
    /// by another writer just before (so they answer 409 Conflict).
    /// Holds every later answer (watches excepted) back by `delay`: a slow server.
    pub fn set_delay(&self, delay: Duration) {
        lock(&self.state).delay = delay;
    }

    /// The next `n` writes (POST, PUT, PATCH, DELETE) whose path contains `fragment` meet
    /// `fault` instead of being done.
    pub fn fail_writes(&self, fragment: &str, fault: Fault, n: u32) {
        self.fail_writes_with(fragment, "", fault, n);
    }

    /// [`Self::fail_writes`] for the writes whose body also contains `body` (e.g.
    /// `"reason":"Evicted"`: one kind of event, the others written).
    pub fn fail_writes_with(&self, fragment: &str, body: &str, fault: Fault, n: u32) {
        lock(&self.state)
            .faults
            .push((fragment.to_owned(), body.to_owned(), fault, n));
    }

    /// No write meets a fault any more.
    pub fn clear_faults(&self) {
        lock(&self.state).faults.clear();
    }

    pub fn interfere(&self, fragment: &str, n: u32) {
        lock(&self.state).interfere.push((fragment.to_owned(), n));
    }

    /// Every token issued later gets `ttl` seconds whatever it asked for (a real server
    /// honours at least 10 min; tests need tokens that age within seconds).
    pub fn set_token_ttl(&self, ttl: Option<i64>) {
        lock(&self.state).token_ttl = ttl;
    }

    /// TokenReview answers `token` as authenticating `user` in `groups` (any other token is
    /// not authenticated).
    pub fn review_token(&self, token: &str, user: &str, groups: &[&str]) {
        lock(&self.state).reviewed_tokens.insert(
            token.to_owned(),
            (
                user.to_owned(),
                groups.iter().map(|g| (*g).to_owned()).collect(),
            ),
        );
    }

    /// SubjectAccessReview allows `who` (a user or one of its groups) `verb` on
    /// `resource` (`nodes/proxy`, `nodes/stats`, ...; `*` for any).
    pub fn allow(&self, who: &str, verb: &str, resource: &str) {
        lock(&self.state)
            .access_rules
            .push((who.to_owned(), verb.to_owned(), resource.to_owned()));
    }

    /// Proxies the pods' `log`, `exec`, `attach` and `portforward` subresources to the node, as
    /// the API server does (kubectl's way to the node).
    pub fn proxy_to_node(&self, proxy: NodeProxy) {
        lock(&self.state).node_proxy = Some(proxy);
    }

    /// The CertificateSigningRequests made, by name.
    #[must_use]
    pub fn csrs(&self) -> Vec<Value> {
        lock(&self.state).csrs.values().cloned().collect()
    }

    /// Approves CSR `name` and issues `cert_pem` (what a signer controller does).
    pub fn issue_csr(&self, name: &str, cert_pem: &str) {
        let mut st = lock(&self.state);
        if let Some(c) = st.csrs.get_mut(name) {
            c["status"] = json!({
                "conditions": [{"type": "Approved", "status": "True", "reason": "Test",
                                "message": "approved by the test"}],
                "certificate": crate::registry::base64(cert_pem.as_bytes()),
            });
        }
    }

    /// Waits (at most 30 s, scaled) for the `Evicted` event of the pod `uid` and returns it.
    pub async fn evicted_event(&self, uid: &str) -> Value {
        let find = || {
            self.list(Kind::Event)
                .into_iter()
                .find(|e| e["reason"] == "Evicted" && e["involvedObject"]["uid"] == uid)
        };
        crate::node::wait_until(
            "the Evicted event in the API",
            Duration::from_secs(30),
            || find().is_some(),
        )
        .await;
        find().expect("the Evicted event")
    }

    /// The TokenReviews and SubjectAccessReviews answered: (kind, spec).
    #[must_use]
    pub fn reviews(&self) -> Vec<(String, Value)> {
        lock(&self.state).reviews.clone()
    }

    /// The tokens issued so far, in order.
    #[must_use]
    pub fn tokens(&self) -> Vec<IssuedToken> {
        lock(&self.state).tokens.clone()
    }

    /// The requests received so far.
    #[must_use]
    pub fn requests(&self) -> Vec<Request> {
        lock(&self.state).requests.clone()
    }

    /// The writes (not GET) received so far whose path contains `fragment`.
    #[must_use]
    pub fn writes(&self, fragment: &str) -> Vec<Request> {
        lock(&self.state)
            .requests
            .iter()
            .filter(|r| r.method != "GET" && r.path.contains(fragment))
            .cloned()
            .collect()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        if let Ok(mut t) = self.task.lock()
            && let Some(t) = t.take()
        {
            t.abort();
        }
    }
}

async fn accept(listener: TcpListener, state: Arc<Mutex<Store>>) {
    // Dropped (so every connection aborted) when this task is aborted.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            a = listener.accept() => match a {
                Ok((conn, _)) => { conns.spawn(serve(conn, state.clone())); }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
        } else {
            out.push(if b[i] == b'+' { b' ' } else { b[i] });
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(path: &str) -> BTreeMap<String, String> {
    path.split_once('?')
        .map(|(_, q)| q)
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), percent_decode(v)))
        .collect()
}

/// The request line, headers and body of one HTTP/1.1 request (Content-Length or chunked).
async fn read_request(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Option<(String, String, BTreeMap<String, String>, Vec<u8>)> {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 8192];
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end);
    let mut lines = head.lines();
    let first = lines.next()?;
    let mut parts = first.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut fill = async |buf: &mut Vec<u8>, n: usize| -> bool {
        while buf.len() < n {
            let mut chunk = [0u8; 8192];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
            }
        }
        true
    };
    let body = if let Some(len) = headers
        .get("content-length")
        .and_then(|l| l.parse::<usize>().ok())
    {
        if !fill(buf, len).await {
            return None;
        }
        buf.drain(..len).collect()
    } else if headers
        .get("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"))
    {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                let n = buf.len() + 1;
                if !fill(buf, n).await {
                    return None;
                }
            };
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&buf[..line_end])
                    .split(';')
                    .next()
                    .unwrap_or("0")
                    .trim(),
                16,
            )
            .ok()?;
            buf.drain(..line_end + 2);
            if !fill(buf, size + 2).await {
                return None;
            }
            body.extend(buf.drain(..size));
            buf.drain(..2);
            if size == 0 {
                break;
            }
        }
        body
    } else {
        Vec::new()
    };
    Some((method, path, headers, body))
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "code": code, "reason": reason, "message": message})
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        _ => "Error",
    }
}

async fn respond(conn: &mut TcpStream, code: u16, body: &Value) -> bool {
    let body = body.to_string();
    let resp = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        reason_phrase(code),
        body.len()
    );
    conn.write_all(resp.as_bytes()).await.is_ok()
}

/// How a write fails ([`FakeApi::fail_writes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answered with this status (409 Conflict, 500 InternalError...), nothing done.
    Status(u16),
    /// 429 TooManyRequests with `Retry-After: secs`, nothing done.
    TooMany { retry_after: u32 },
    /// The connection closed with no answer, nothing done.
    Close,
}

fn take_fault(st: &mut Store, method: &str, path: &str, body: &str) -> Option<Fault> {
    if !matches!(method, "POST" | "PUT" | "PATCH" | "DELETE") {
        return None;
    }
    let i = st.faults.iter().position(|(fragment, needle, _, left)| {
        *left > 0 && path.contains(fragment.as_str()) && body.contains(needle.as_str())
    })?;
    st.faults[i].3 -= 1;
    Some(st.faults[i].2)
}

/// Where a path points: the kind, namespace, name, and whether it is the `status` subresource.
struct Route {
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn route(path: &str) -> Option<Route> {
    let path = path.split('?').next().unwrap_or("");
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (rest, group): (&[&str], &str) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => (rest, "core"),
        ["apis", "coordination.k8s.io", "v1", rest @ ..] => (rest, "coordination"),
        ["apis", "events.k8s.io", "v1", rest @ ..] => (rest, "events"),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (resource, name, sub) = match rest {
        [r] => (*r, None, None),
        [r, n] => (*r, Some((*n).to_owned()), None),
        [r, n, s] => (*r, Some((*n).to_owned()), Some(*s)),
        _ => return None,
    };
    let kind = match (group, resource) {
        ("core", "pods") => Kind::Pod,
        ("core", "nodes") => Kind::Node,
        ("core", "events") => Kind::Event,
        ("core", "configmaps") => Kind::ConfigMap,
        ("core", "secrets") => Kind::Secret,
        ("core", "services") => Kind::Service,
        ("coordination", "leases") => Kind::Lease,
        ("events", "events") => Kind::EventV1,
        _ => return None,
    };
    let status = match sub {
        None => false,
        Some("status") if matches!(kind, Kind::Pod | Kind::Node) => true,
        Some(_) => return None,
    };
    if kind.namespaced() && name.is_some() && namespace.is_none() {
        return None;
    }
    Some(Route {
        kind,
        namespace,
        name,
        status,
    })
}

/// Checks a body against the URL and the resource's type: 422 when the real server refuses it.
fn validate(r: &Route, body: &Value) -> Result<(), (u16, Value)> {
    let invalid = |m: String| (422, status_body(422, "Invalid", &m));
    if !body.is_object() {
        return Err(invalid("the body is not a JSON object".to_owned()));
    }
    for (field, want) in [
        ("kind", r.kind.kind()),
        ("apiVersion", r.kind.api_version()),
    ] {
        if let Some(got) = body[field].as_str()
            && got != want
        {
            return Err(invalid(format!("{field}: {got}, expected {want}")));
        }
    }
    let meta = r
        .kind
        .decode(body)
        .map_err(|e| invalid(format!("decoding {}: {e}", r.kind.kind())))?;
    if let (Some(url), Some(got)) = (&r.name, &meta.name)
        && url != got
    {
        return Err(invalid(format!(
            "metadata.name: {got} does not match the URL's {url}"
        )));
    }
    if r.kind.namespaced()
        && let (Some(url), Some(got)) = (&r.namespace, &meta.namespace)
        && url != got
    {
        return Err(invalid(format!(
            "metadata.namespace: {got} does not match the URL's {url}"
        )));
    }
    Ok(())
}

fn not_found(r: &Route, name: &str) -> (u16, Value) {
    let what = match r.kind {
        Kind::Pod => "pods",
        Kind::Node => "nodes",
        Kind::Lease => "leases.coordination.k8s.io",
        Kind::Event | Kind::EventV1 => "events",
        Kind::ConfigMap => "configmaps",
        Kind::Secret => "secrets",
        Kind::Service => "services",
    };
    (
        404,
        status_body(404, "NotFound", &format!("{what} \"{name}\" not found")),
    )
}

fn conflict(message: &str) -> (u16, Value) {
    (409, status_body(409, "Conflict", message))
}

/// The preconditions a write carries in its body: `metadata.resourceVersion` and `uid`.
fn check_preconditions(stored: &Value, body: &Value) -> Result<(), (u16, Value)> {
    if let Some(rv) = body["metadata"]["resourceVersion"].as_str()
        && !rv.is_empty()
        && Some(rv) != stored["metadata"]["resourceVersion"].as_str()
    {
        return Err(conflict(
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    if let Some(uid) = body["metadata"]["uid"].as_str()
        && Some(uid) != stored["metadata"]["uid"].as_str()
    {
        return Err(conflict(&format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
            stored["metadata"]["uid"].as_str().unwrap_or("")
        )));
    }
    Ok(())
}

fn delete(
    st: &mut Store,
    kind: Kind,
    namespace: &str,
    name: &str,
    grace: Option<i64>,
    options: &Value,
) -> (u16, Value) {
    let key = FakeApi::key(kind, namespace, name);
    let Some(stored) = st.objects.get(&key).cloned() else {
        return (
            404,
            status_body(404, "NotFound", &format!("\"{name}\" not found")),
        );
    };
    if let Some(uid) = options["preconditions"]["uid"].as_str()
        && Some(uid) != stored["metadata"]["uid"].as_str()
    {
        return conflict(&format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
            stored["metadata"]["uid"].as_str().unwrap_or("")
        ));
    }
    let grace = grace.or_else(|| options["gracePeriodSeconds"].as_i64());
    if kind == Kind::Pod {
        let phase = stored["status"]["phase"].as_str().unwrap_or("");
        let scheduled = stored["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty());
        let default = stored["spec"]["terminationGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(30);
        let mut grace = grace.unwrap_or(default).max(0);
        // The pod storage's rules: unscheduled or terminal pods go at once.
        if !scheduled || phase == "Succeeded" || phase == "Failed" {
            grace = 0;
        }
        if grace > 0 {
            // A graceful deletion only ever shortens.
            let current = stored["metadata"]["deletionGracePeriodSeconds"].as_i64();
            if current.is_some_and(|c| c <= grace) {
                return (200, stored);
            }
            let mut obj = stored;
            let at = k8s_openapi::jiff::Timestamp::now()
                .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(grace))
                .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now())
                .round(k8s_openapi::jiff::Unit::Second)
                .map(|t| t.to_string())
                .unwrap_or_default();
            obj["metadata"]["deletionTimestamp"] = json!(at);
            obj["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            let obj = st.commit(key, obj, "MODIFIED");
            return (200, obj);
        }
    }
    let obj = st.commit(key, stored, "DELETED");
    (200, obj)
}

/// `POST /api/v1/namespaces/<ns>/serviceaccounts/<sa>/token`: a TokenRequest answered with
/// a fresh token and its expiry (the store's TTL, else the one asked, else 1 h).
fn token_request(st: &mut Store, path: &str, body: Option<&Value>) -> Option<(u16, Value)> {
    let p = path.split('?').next().unwrap_or("");
    let segs: Vec<&str> = p.trim_matches('/').split('/').collect();
    let [
        "api",
        "v1",
        "namespaces",
        ns,
        "serviceaccounts",
        sa,
        "token",
    ] = segs.as_slice()
    else {
        return None;
    };
    let Some(body) = body else {
        return Some((422, status_body(422, "Invalid", "the body is not JSON")));
    };
    if let Err(e) = serde_json::from_value::<TokenRequest>(body.clone()) {
        return Some((
            422,
            status_body(422, "Invalid", &format!("decoding TokenRequest: {e}")),
        ));
    }
    if body["kind"].as_str().is_some_and(|k| k != "TokenRequest") {
        return Some((
            422,
            status_body(422, "Invalid", "kind: expected TokenRequest"),
        ));
    }
    let asked = body["spec"]["expirationSeconds"].as_i64().unwrap_or(3600);
    let ttl = st.token_ttl.unwrap_or(asked);
    st.uid_seq += 1;
    let token = format!("fake-token-{}-{ns}-{sa}", st.uid_seq);
    let expires = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(ttl))
        .and_then(|t| t.round(k8s_openapi::jiff::Unit::Second))
        .map(|t| t.to_string())
        .unwrap_or_default();
    st.tokens.push(IssuedToken {
        token: token.clone(),
        namespace: (*ns).to_owned(),
        service_account: (*sa).to_owned(),
        request: body.clone(),
        ttl,
        issued: Instant::now(),
    });
    let mut spec = body["spec"].clone();
    spec["expirationSeconds"] = json!(ttl);
    Some((
        201,
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "metadata": {"name": sa, "namespace": ns},
               "spec": spec,
               "status": {"token": token, "expirationTimestamp": expires}}),
    ))
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews` and
/// `/apis/authorization.k8s.io/v1/subjectaccessreviews`, answered from the fake's tables.
fn review(st: &mut Store, path: &str, body: Option<&Value>) -> Option<(u16, Value)> {
    let p = path.split('?').next().unwrap_or("");
    let kind = match p {
        "/apis/authentication.k8s.io/v1/tokenreviews" => "TokenReview",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews" => "SubjectAccessReview",
        _ => return None,
    };
    let Some(body) = body else {
        return Some((422, status_body(422, "Invalid", "the body is not JSON")));
    };
    let decoded = if kind == "TokenReview" {
        serde_json::from_value::<k8s_openapi::api::authentication::v1::TokenReview>(body.clone())
            .map(drop)
    } else {
        serde_json::from_value::<k8s_openapi::api::authorization::v1::SubjectAccessReview>(
            body.clone(),
        )
        .map(drop)
    };
    if let Err(e) = decoded {
        return Some((
            422,
            status_body(422, "Invalid", &format!("decoding {kind}: {e}")),
        ));
    }
    let spec = body["spec"].clone();
    st.reviews.push((kind.to_owned(), spec.clone()));
    let status = if kind == "TokenReview" {
        match spec["token"]
            .as_str()
            .and_then(|t| st.reviewed_tokens.get(t))
        {
            Some((user, groups)) => json!({"authenticated": true,
                "user": {"username": user, "uid": format!("uid-{user}"), "groups": groups}}),
            None => json!({"authenticated": false}),
        }
    } else {
        let user = spec["user"].as_str().unwrap_or_default();
        let groups: Vec<&str> = spec["groups"]
            .as_array()
            .map(|g| g.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let ra = &spec["resourceAttributes"];
        let resource = format!(
            "{}/{}",
            ra["resource"].as_str().unwrap_or_default(),
            ra["subresource"].as_str().unwrap_or_default()
        );
        let verb = ra["verb"].as_str().unwrap_or_default();
        let allowed = st.access_rules.iter().any(|(who, v, r)| {
            (who == user || groups.contains(&who.as_str()))
                && (v == "*" || v == verb)
                && (r == "*" || *r == resource)
        });
        json!({"allowed": allowed})
    };
    Some((
        201,
        json!({"apiVersion": body["apiVersion"], "kind": kind, "metadata": {},
               "spec": spec, "status": status}),
    ))
}

/// `certificates.k8s.io/v1` CertificateSigningRequests: create (with `generateName`) and get.
fn csr(st: &mut Store, method: &str, path: &str, body: Option<&Value>) -> Option<(u16, Value)> {
    let p = path.split('?').next().unwrap_or("");
    let rest = p.strip_prefix("/apis/certificates.k8s.io/v1/certificatesigningrequests")?;
    match (method, rest.trim_matches('/')) {
        ("POST", "") => {
            let Some(body) = body else {
                return Some((422, status_body(422, "Invalid", "the body is not JSON")));
            };
            if let Err(e) = serde_json::from_value::<
                k8s_openapi::api::certificates::v1::CertificateSigningRequest,
            >(body.clone())
            {
                return Some((
                    422,
                    status_body(
                        422,
                        "Invalid",
                        &format!("decoding CertificateSigningRequest: {e}"),
                    ),
                ));
            }
            st.uid_seq += 1;
            let name = match body["metadata"]["name"].as_str() {
                Some(n) if !n.is_empty() => n.to_owned(),
                _ => format!(
                    "{}{}",
                    body["metadata"]["generateName"].as_str().unwrap_or("csr-"),
                    st.uid_seq
                ),
            };
            let mut obj = body.clone();
            obj["metadata"]["name"] = json!(name);
            obj["metadata"]["uid"] = json!(format!("csr-uid-{}", st.uid_seq));
            obj["metadata"]["resourceVersion"] = json!(st.uid_seq.to_string());
            st.csrs.insert(name, obj.clone());
            Some((201, obj))
        }
        ("GET", name) if !name.is_empty() => Some(match st.csrs.get(name) {
            Some(c) => (200, c.clone()),
            None => (
                404,
                status_body(
                    404,
                    "NotFound",
                    &format!("certificatesigningrequests.certificates.k8s.io \"{name}\" not found"),
                ),
            ),
        }),
        _ => None,
    }
}

/// Legacy discovery (`/api`, `/apis`, `/api/v1`), enough for kubectl to find pods and their
/// `log`, `exec`, `attach` and `portforward` subresources.
fn discovery(path: &str) -> Option<(u16, Value)> {
    let p = path.split('?').next().unwrap_or("");
    let answer = match p.trim_end_matches('/') {
        "/api" => json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        "/api/v1" => {
            let r = |name: &str, kind: &str, namespaced: bool, verbs: &[&str]| {
                json!({"name": name, "singularName": "", "namespaced": namespaced,
                       "kind": kind, "verbs": verbs})
            };
            json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                r("pods", "Pod", true, &["create", "delete", "get", "list", "patch", "update", "watch"]),
                r("pods/log", "Pod", true, &["get"]),
                r("pods/exec", "PodExecOptions", true, &["create", "get"]),
                r("pods/attach", "PodAttachOptions", true, &["create", "get"]),
                r("pods/portforward", "PodPortForwardOptions", true, &["create", "get"]),
                r("pods/status", "Pod", true, &["get", "patch", "update"]),
                r("nodes", "Node", false, &["create", "delete", "get", "list", "patch", "update", "watch"]),
                r("events", "Event", true, &["create", "get", "list", "patch"]),
                r("configmaps", "ConfigMap", true, &["get", "list", "watch"]),
                r("secrets", "Secret", true, &["get", "list", "watch"]),
                r("services", "Service", true, &["get", "list", "watch"]),
            ]})
        }
        _ => return None,
    };
    Some((200, answer))
}

/// Handles one non-watch request.
fn handle(
    st: &mut Store,
    method: &str,
    path: &str,
    content_type: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    if method == "POST"
        && let Some(answer) = token_request(st, path, body)
    {
        return answer;
    }
    if method == "POST"
        && let Some(answer) = review(st, path, body)
    {
        return answer;
    }
    if let Some(answer) = csr(st, method, path, body) {
        return answer;
    }
    if method == "GET"
        && let Some(answer) = discovery(path)
    {
        return answer;
    }
    let Some(r) = route(path) else {
        return (
            404,
            status_body(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
        );
    };
    let q = query(path);
    let ns = r.namespace.clone().unwrap_or_default();
    let body_or_422 = || -> Result<&Value, (u16, Value)> {
        body.ok_or_else(|| (422, status_body(422, "Invalid", "the body is not JSON")))
    };
    match (method, &r.name) {
        ("GET", None) => {
            let node = q
                .get("fieldSelector")
                .and_then(|s| s.strip_prefix("spec.nodeName="))
                .map(str::to_owned);
            let items: Vec<Value> = st
                .objects
                .iter()
                .filter(|(k, _)| k.0 == r.kind && (r.namespace.is_none() || k.1 == ns))
                .filter(|(_, v)| {
                    node.as_deref()
                        .is_none_or(|n| v["spec"]["nodeName"].as_str() == Some(n))
                })
                .map(|(_, v)| v.clone())
                .collect();
            (
                200,
                json!({"apiVersion": r.kind.api_version(), "kind": format!("{}List", r.kind.kind()),
                       "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
            )
        }
        ("POST", None) => {
            let body = match body_or_422() {
                Ok(b) => b,
                Err(e) => return e,
            };
            if let Err(e) = validate(&r, body) {
                return e;
            }
            let mut obj = body.clone();
            let Some(name) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
                return (
                    422,
                    status_body(422, "Invalid", "metadata.name: Required value"),
                );
            };
            if r.kind.namespaced() {
                obj["metadata"]["namespace"] = json!(ns);
            }
            let key = FakeApi::key(r.kind, &ns, &name);
            if st.objects.contains_key(&key) {
                return (
                    409,
                    status_body(409, "AlreadyExists", &format!("\"{name}\" already exists")),
                );
            }
            if !obj["metadata"]["resourceVersion"].is_null() {
                return (
                    422,
                    status_body(
                        422,
                        "Invalid",
                        "metadata.resourceVersion: must be empty on create",
                    ),
                );
            }
            st.uid_seq += 1;
            obj["metadata"]["uid"] = json!(format!("fake-uid-{}", st.uid_seq));
            obj["metadata"]["creationTimestamp"] = json!(now_rfc3339());
            (201, st.commit(key, obj, "ADDED"))
        }
        ("GET", Some(name)) => match st.objects.get(&FakeApi::key(r.kind, &ns, name)) {
            Some(v) => (200, v.clone()),
            None => not_found(&r, name),
        },
        ("DELETE", Some(name)) => {
            if let Some(b) = body
                && let Err(e) = serde_json::from_value::<
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions,
                >(b.clone())
            {
                return (
                    422,
                    status_body(422, "Invalid", &format!("decoding DeleteOptions: {e}")),
                );
            }
            let grace = q.get("gracePeriodSeconds").and_then(|g| g.parse().ok());
            delete(st, r.kind, &ns, name, grace, body.unwrap_or(&Value::Null))
        }
        ("PUT" | "PATCH", Some(name)) => {
            let key = FakeApi::key(r.kind, &ns, name);
            let Some(stored) = st.objects.get(&key).cloned() else {
                return not_found(&r, name);
            };
            let body = match body_or_422() {
                Ok(b) => b,
                Err(e) => return e,
            };
            let mut next = if method == "PUT" {
                if let Err(e) = validate(&r, body) {
                    return e;
                }
                body.clone()
            } else {
                let ct = content_type.split(';').next().unwrap_or("").trim();
                if ct != "application/merge-patch+json"
                    && ct != "application/strategic-merge-patch+json"
                {
                    return (
                        415,
                        status_body(
                            415,
                            "UnsupportedMediaType",
                            &format!("the fake does not apply {ct} patches"),
                        ),
                    );
                }
                let mut merged = stored.clone();
                if ct == "application/strategic-merge-patch+json" && r.kind == Kind::Pod {
                    use enforcer::cluster::strategic;
                    strategic::apply(&mut merged, body, strategic::POD_MERGE_KEYS);
                } else {
                    enforcer::cluster::merge_patch(&mut merged, body);
                }
                if let Err(e) = validate(&r, &merged) {
                    return e;
                }
                merged
            };
            if let Err(e) = check_preconditions(&stored, body) {
                return e;
            }
            // The status subresource changes only status; the main resource everything else.
            let mut obj = stored.clone();
            if r.status {
                obj["status"] = next["status"].take();
            } else {
                let status = stored["status"].clone();
                let mut meta = next["metadata"].take();
                for keep in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "namespace",
                    "name",
                ] {
                    if stored["metadata"].get(keep).is_some() {
                        meta[keep] = stored["metadata"][keep].clone();
                    }
                }
                obj = next;
                obj["metadata"] = meta;
                if !status.is_null() || r.kind == Kind::Pod || r.kind == Kind::Node {
                    obj["status"] = status;
                }
            }
            if obj == stored {
                return (200, stored);
            }
            (200, st.commit(key, obj, "MODIFIED"))
        }
        _ => (405, status_body(405, "MethodNotAllowed", "not allowed")),
    }
}

/// Another writer changes the object a matching write is about just before it arrives (a
/// label `fake/interference`), so the write's resourceVersion is stale.
fn interfere(st: &mut Store, path: &str) {
    let Some(i) = st
        .interfere
        .iter()
        .position(|(fragment, left)| *left > 0 && path.contains(fragment.as_str()))
    else {
        return;
    };
    st.interfere[i].1 -= 1;
    let Some(r) = route(path) else { return };
    let Some(name) = r.name.clone() else { return };
    let key = FakeApi::key(r.kind, &r.namespace.clone().unwrap_or_default(), &name);
    if let Some(mut obj) = st.objects.get(&key).cloned() {
        let n = st.rv;
        obj["metadata"]["labels"]["fake/interference"] = json!(n.to_string());
        st.commit(key, obj, "MODIFIED");
    }
}

/// The node path of a pod subresource request (`/api/v1/namespaces/N/pods/P/log?...`), with
/// the API's parameters turned into kubelet's (`stdin=true` -> `input=1`, the container into
/// the path), as the API server's `streamLocation` does.
fn node_location(path: &str) -> Option<String> {
    let (p, q) = path.split_once('?').unwrap_or((path, ""));
    let segs: Vec<&str> = p.trim_matches('/').split('/').collect();
    let ["api", "v1", "namespaces", ns, "pods", pod, sub] = segs.as_slice() else {
        return None;
    };
    let pairs: Vec<(String, String)> = q
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    let container = pairs
        .iter()
        .find(|(k, _)| k == "container")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let rest = |map: &dyn Fn(&str, &str) -> Option<String>| -> String {
        pairs
            .iter()
            .filter(|(k, _)| k != "container")
            .filter_map(|(k, v)| map(k, v))
            .collect::<Vec<_>>()
            .join("&")
    };
    let stream_param = |k: &str, v: &str| -> Option<String> {
        let on = v == "true" || v == "1";
        match k {
            "stdin" => on.then(|| "input=1".to_owned()),
            "stdout" => on.then(|| "output=1".to_owned()),
            "stderr" => on.then(|| "error=1".to_owned()),
            "tty" => on.then(|| "tty=1".to_owned()),
            "command" => Some(format!("command={v}")),
            _ => None,
        }
    };
    match *sub {
        "log" => Some(format!(
            "/containerLogs/{ns}/{pod}/{container}?{}",
            rest(&|k, v| Some(format!("{k}={v}")))
        )),
        "exec" => Some(format!(
            "/exec/{ns}/{pod}/{container}?{}",
            rest(&stream_param)
        )),
        "attach" => Some(format!(
            "/attach/{ns}/{pod}/{container}?{}",
            rest(&stream_param)
        )),
        "portforward" => Some(format!(
            "/portForward/{ns}/{pod}?{}",
            rest(&|k, v| (k == "ports").then(|| format!("port={v}")))
        )),
        _ => None,
    }
}

/// Takes the connection over: the request to the node's secure port (TLS, the API server's
/// client certificate), then the bytes both ways until either side closes (an upgrade
/// included).
async fn proxy_to_node(
    mut conn: TcpStream,
    proxy: NodeProxy,
    method: &str,
    location: &str,
    headers: &BTreeMap<String, String>,
    leftover: Vec<u8>,
) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject as _};
    let fail = |m: String| {
        let body = status_body(502, "InternalError", &m);
        async move { (502u16, body) }
    };
    let connected = async {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&proxy.server_ca).map_err(|e| e.to_string())? {
            roots
                .add(c.map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        }
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&proxy.client_cert)
            .map_err(|e| e.to_string())?
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let key = PrivateKeyDer::from_pem_file(&proxy.client_key).map_err(|e| e.to_string())?;
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| e.to_string())?;
        let tcp = TcpStream::connect(("127.0.0.1", proxy.port))
            .await
            .map_err(|e| e.to_string())?;
        let name = ServerName::try_from(proxy.server_name.clone()).map_err(|e| e.to_string())?;
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    let mut node = match connected {
        Ok(n) => n,
        Err(e) => {
            let (code, body) = fail(format!("error dialing the node: {e}")).await;
            let _ = respond(&mut conn, code, &body).await;
            return;
        }
    };
    let mut head = format!(
        "{method} {location} HTTP/1.1\r\nHost: {}\r\n",
        proxy.server_name
    );
    for (k, v) in headers {
        if matches!(k.as_str(), "host" | "authorization" | "content-length") {
            continue;
        }
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    if node.write_all(head.as_bytes()).await.is_err()
        || (!leftover.is_empty() && node.write_all(&leftover).await.is_err())
    {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut node).await;
}

async fn serve(mut conn: TcpStream, state: Arc<Mutex<Store>>) {
    let mut buf = Vec::new();
    while let Some((method, path, headers, raw)) = read_request(&mut conn, &mut buf).await {
        let node_proxy = lock(&state).node_proxy.clone();
        if let (Some(proxy), Some(location)) = (node_proxy, node_location(&path)) {
            let mut leftover = raw;
            leftover.append(&mut buf);
            proxy_to_node(conn, proxy, &method, &location, &headers, leftover).await;
            return;
        }
        let decoded = percent_decode(&path);
        let content_type = headers.get("content-type").cloned().unwrap_or_default();
        let body: Option<Value> = if raw.is_empty() {
            None
        } else {
            serde_json::from_slice(&raw).ok()
        };
        let q = query(&path);
        let watch = method == "GET" && q.get("watch").is_some_and(|w| w == "true" || w == "1");
        let log = |st: &mut Store, status: u16| {
            st.requests.push(Request {
                method: method.clone(),
                path: decoded.clone(),
                content_type: content_type.clone(),
                body: body.clone(),
                status,
                at: Instant::now(),
            });
        };
        if watch {
            let Some(r) = route(&path) else {
                {
                    let mut st = lock(&state);
                    log(&mut st, 404);
                }
                if !respond(&mut conn, 404, &status_body(404, "NotFound", "not found")).await {
                    return;
                }
                continue;
            };
            let node = q
                .get("fieldSelector")
                .and_then(|s| s.strip_prefix("spec.nodeName="))
                .map(str::to_owned);
            let since: u64 = q
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX);
            let (tx, mut rx) = mpsc::unbounded_channel::<String>();
            {
                let mut st = lock(&state);
                log(&mut st, 200);
                // Resume: what changed after the given version.
                if since != u64::MAX {
                    for (rv, kind, line, pod_node) in &st.history {
                        if *rv > since && *kind == r.kind && (node.is_none() || *pod_node == node) {
                            let _ = tx.send(line.clone());
                        }
                    }
                }
                st.watches.push(Watch {
                    kind: r.kind,
                    namespace: r.namespace.clone(),
                    node,
                    tx,
                });
            }
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
            if conn.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            while let Some(line) = rx.recv().await {
                let data = format!("{line}\n");
                let chunk = format!("{:x}\r\n{data}\r\n", data.len());
                if conn.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
            }
            let _ = conn.write_all(b"0\r\n\r\n").await;
            return;
        }
        let fault = take_fault(
            &mut lock(&state),
            &method,
            &path,
            &String::from_utf8_lossy(&raw),
        );
        match fault {
            Some(Fault::Close) => {
                log(&mut lock(&state), 0);
                return;
            }
            Some(Fault::Status(code)) => {
                log(&mut lock(&state), code);
                let reason = match code {
                    409 => "Conflict",
                    500 => "InternalError",
                    503 => "ServiceUnavailable",
                    _ => "Unknown",
                };
                let body = status_body(code, reason, "injected by the test");
                if !respond(&mut conn, code, &body).await {
                    return;
                }
                continue;
            }
            Some(Fault::TooMany { retry_after }) => {
                log(&mut lock(&state), 429);
                let body = status_body(429, "TooManyRequests", "injected by the test").to_string();
                let resp = format!(
                    "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: {retry_after}\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                if conn.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
                continue;
            }
            None => {}
        }
        let (code, answer) = {
            let mut st = lock(&state);
            if method == "PUT" || method == "PATCH" {
                interfere(&mut st, &path);
            }
            let (code, answer) = if !raw.is_empty() && body.is_none() {
                (422, status_body(422, "Invalid", "the body is not JSON"))
            } else {
                handle(&mut st, &method, &path, &content_type, body.as_ref())
            };
            log(&mut st, code);
            (code, answer)
        };
        let delay = lock(&state).delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if !respond(&mut conn, code, &answer).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let r = route("/api/v1/namespaces/ns/pods/p/status").expect("route");
        assert_eq!(
            (r.kind, r.name.as_deref(), r.status),
            (Kind::Pod, Some("p"), true)
        );
        assert!(
            route("/api/v1/pods/p").is_none(),
            "a pod needs its namespace"
        );
        let r = route("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n")
            .expect("route");
        assert_eq!(r.kind, Kind::Lease);
        assert!(route("/api/v1/nodes/n/proxy").is_none());
    }

    #[test]
    fn writes_are_strict() {
        let mut st = Store::default();
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}});
        let (code, created) = handle(
            &mut st,
            "POST",
            "/api/v1/nodes",
            "application/json",
            Some(&node),
        );
        assert_eq!(code, 201);
        let (code, _) = handle(
            &mut st,
            "POST",
            "/api/v1/nodes",
            "application/json",
            Some(&node),
        );
        assert_eq!(code, 409, "already exists");
        // Wrong name, wrong type, stale version.
        let (code, _) = handle(
            &mut st,
            "PUT",
            "/api/v1/nodes/n2",
            "application/json",
            Some(&node),
        );
        assert_eq!(code, 404);
        let renamed = json!({"metadata": {"name": "n9"}});
        let (code, _) = handle(
            &mut st,
            "PUT",
            "/api/v1/nodes/n1",
            "application/json",
            Some(&renamed),
        );
        assert_eq!(code, 422);
        let bad = json!({"metadata": {"name": "n1"}, "status": {"conditions": "nope"}});
        let (code, _) = handle(
            &mut st,
            "PATCH",
            "/api/v1/nodes/n1/status",
            "application/merge-patch+json",
            Some(&bad),
        );
        assert_eq!(code, 422);
        let mut stale = created.clone();
        stale["metadata"]["resourceVersion"] = json!("0");
        let (code, _) = handle(
            &mut st,
            "PUT",
            "/api/v1/nodes/n1",
            "application/json",
            Some(&stale),
        );
        assert_eq!(code, 409);
        let (code, _) = handle(
            &mut st,
            "PUT",
            "/api/v1/nodes/n1",
            "application/json",
            Some(&created),
        );
        assert_eq!(code, 200, "the current version");
        let (code, _) = handle(
            &mut st,
            "PATCH",
            "/api/v1/nodes/n1",
            "application/json-patch+json",
            Some(&json!([])),
        );
        assert_eq!(code, 415);
    }

    #[test]
    fn status_subresource_and_graceful_pod_deletion() {
        let mut st = Store::default();
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 5, "containers": [{"name": "c"}]},
            "status": {"phase": "Pending"}});
        assert_eq!(
            handle(
                &mut st,
                "POST",
                "/api/v1/namespaces/ns/pods",
                "application/json",
                Some(&pod)
            )
            .0,
            201
        );
        let patch = json!({"status": {"phase": "Running"}, "spec": {"nodeName": "other"}});
        let (code, got) = handle(
            &mut st,
            "PATCH",
            "/api/v1/namespaces/ns/pods/p/status",
            "application/strategic-merge-patch+json",
            Some(&patch),
        );
        assert_eq!(code, 200);
        assert_eq!(got["status"]["phase"], "Running");
        assert_eq!(
            got["spec"]["nodeName"], "n1",
            "status writes change only status"
        );
        let (code, got) = handle(&mut st, "DELETE", "/api/v1/namespaces/ns/pods/p", "", None);
        assert_eq!(code, 200);
        assert_eq!(got["metadata"]["deletionGracePeriodSeconds"], 5);
        assert!(st.objects.contains_key(&FakeApi::key(Kind::Pod, "ns", "p")));
        let wrong_uid = json!({"gracePeriodSeconds": 0, "preconditions": {"uid": "x"}});
        assert_eq!(
            handle(
                &mut st,
                "DELETE",
                "/api/v1/namespaces/ns/pods/p",
                "application/json",
                Some(&wrong_uid)
            )
            .0,
            409
        );
        let (code, _) = handle(
            &mut st,
            "DELETE",
            "/api/v1/namespaces/ns/pods/p?gracePeriodSeconds=0",
            "",
            None,
        );
        assert_eq!(code, 200);
        assert!(!st.objects.contains_key(&FakeApi::key(Kind::Pod, "ns", "p")));
        assert_eq!(
            handle(&mut st, "GET", "/api/v1/namespaces/ns/pods/p", "", None).0,
            404
        );
    }
}
