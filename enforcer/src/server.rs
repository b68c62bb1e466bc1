//! The operator's HTTP surface, kubelet's read-only port in the small (axum on hyper 1):
//!
//! | path | what |
//! |---|---|
//! | `/metrics` | OpenMetrics text: kubelet's `kubelet_*` series and the enforcer's `enforcer_*` ([`crate::metrics`]) |
//! | `/metrics/resource` | kubelet's resource metrics: `node_`, `pod_`, `container_` CPU and memory working set ([`resource`]) |
//! | `/healthz` | `ok`, or 503 naming every failing check ([`crate::health`]): signal pipeline ended, eviction loop stalled, runtime unreachable, state directory not writable |
//! | `/configz` | the effective configuration, as kubelet prints it: `{"kubeletconfig": {...}}` |
//! | `/pods` | a `PodList` of the pods as the node runs them |
//! | `/stats/summary` | kubelet's Summary API (`stats/v1alpha1`), the fields eviction reads ([`summary`]) |
//! | `/debug/flags/v` | `PUT` a number: log verbosity at run time ([`debug`]) |
//! | `/debug/pprof/profile?seconds=N` | a CPU profile in pprof protobuf (N from 1 to [`debug::MAX_PROFILE_SECONDS`], default 30) |
//! | `/debug/pprof/heap` | 501: the system allocator keeps no heap profile |
//! | `/capabilities` | the kernel capability probe (JSON) |
//!
//! Hardened so that nothing on this port can blind the eviction manager: at most
//! [`MAX_CONNECTIONS`] connections are served at once (the rest wait in the kernel's listen
//! backlog and hold no descriptor of ours); a connection that does not deliver a complete
//! request header within [`HEADER_TIMEOUT`] (also between keep-alive requests) is closed;
//! a request is answered within [`REQUEST_TIMEOUT`] (a profile: its bounded seconds)
//! or gets 503; no connection lives longer than [`MAX_CONNECTION_LIFETIME`]; accept errors
//! (such as running out of descriptors) back off instead of spinning. On the daemon's
//! shutdown the server stops accepting, lets requests in flight finish for up to
//! [`SHUTDOWN_GRACE`], then closes what is left.

pub mod cadvisor;
pub mod debug;
pub mod logs;
pub mod resource;
pub mod secure;
pub mod stream;
pub mod summary;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Router,
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
    service::TowerToHyperService,
};
use tokio::{net::TcpListener, sync::Semaphore};

use crate::{
    config::Config,
    health::Health,
    metrics::Metrics,
    node::NodeObserver,
    pods::{NodeLink, NodeStateCollector},
    signal::PipelineStats,
    status_manager::StatusManager,
};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Time a request has to be answered.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a connection has to deliver a complete request header, counted from its opening or
/// from the end of its previous answer (the keep-alive idle time): short, so that idle
/// connections give their slot back quickly, and so that a client reading an answer until
/// the connection closes gets its end at once.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(1);
/// No connection is kept longer (keep-alive clients reconnect).
pub const MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(120);
/// Time requests in flight get to finish when the daemon stops.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Largest request header read.
const MAX_REQUEST_HEADER: usize = 8 * 1024;

/// What the pages are made of (the daemon's handles).
#[derive(Debug)]
pub struct Sources {
    /// The effective configuration (`/configz`).
    pub config: Config,
    /// The capability probe as JSON (`/capabilities`).
    pub capabilities: String,
    pub health: Arc<Health>,
    /// The process-wide instruments ([`crate::metrics::global`]).
    pub metrics: Metrics,
    pub pipeline: Arc<PipelineStats>,
    pub link: NodeLink,
    pub status: StatusManager,
    /// Where `/stats/summary` and `/metrics/resource` read (the stats collector's own
    /// reading code, run on demand off the async threads).
    pub observer: NodeObserver,
    /// The container runtime `/stats/summary` asks for its image and container filesystems
    /// (CRI `ImageFsInfo`); `None` where the enforcer runs no pods.
    pub runtime: Option<Arc<crate::cri::CriRuntime>>,
}

struct AppState {
    sources: Sources,
    node: prometheus_client::registry::Registry,
    stats: summary::StatsReader,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

type Shared = Arc<AppState>;

/// The running server.
#[derive(Debug)]
pub struct Server {
    /// The address bound (the configured one, with its port resolved).
    pub addr: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Stops accepting, gives requests in flight [`SHUTDOWN_GRACE`], then closes the rest.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Binds `addr` and serves `sources` until [`Server::shutdown`].
pub async fn serve(addr: SocketAddr, sources: Sources) -> std::io::Result<Server> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let state = app_state(sources);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(accept_loop(
        listener,
        router(state),
        stopped,
        None,
        MAX_CONNECTION_LIFETIME,
    ));
    Ok(Server {
        addr: local,
        stop,
        task,
    })
}

/// How long a connection of the secure port may live (kubelet's
/// `streamingConnectionIdleTimeout`, 4 h: log follows and exec sessions).
pub const SECURE_CONNECTION_LIFETIME: Duration = Duration::from_secs(4 * 3600);

/// kubelet's secure port on `addr`: TLS, authentication and authorization in front of the
/// same pages plus the container streams (`/containerLogs`, `/exec`, `/attach`,
/// `/portForward`), until [`Server::shutdown`].
pub async fn serve_secure(
    addr: SocketAddr,
    sources: Sources,
    opts: secure::SecureOptions,
) -> Result<Server, secure::SecureError> {
    let bootstrap = opts
        .bootstrap
        .then(|| Arc::new(secure::BootstrapCert::default()));
    let tls = secure::tls_with(&opts, bootstrap.clone())?;
    if let Some(b) = bootstrap {
        tokio::spawn(secure::bootstrap(opts.clone(), b));
    }
    let auth = Arc::new(secure::Auth::new(opts, &tls));
    let state = app_state(sources);
    let streams = Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(logs::handler),
        )
        .route(
            "/exec/{namespace}/{pod}/{container}",
            get(stream::exec).post(stream::exec),
        )
        .route(
            "/exec/{namespace}/{pod}/{uid}/{container}",
            get(stream::exec).post(stream::exec),
        )
        .route(
            "/attach/{namespace}/{pod}/{container}",
            get(stream::attach).post(stream::attach),
        )
        .route(
            "/attach/{namespace}/{pod}/{uid}/{container}",
            get(stream::attach).post(stream::attach),
        )
        .route(
            "/portForward/{namespace}/{pod}",
            get(stream::port_forward).post(stream::port_forward),
        )
        .route(
            "/portForward/{namespace}/{pod}/{uid}",
            get(stream::port_forward).post(stream::port_forward),
        )
        .with_state(state.clone());
    let app = router(state)
        .merge(streams)
        .layer(middleware::from_fn_with_state(auth, secure::filter));
    serve_tls(addr, app, tls).await
}

/// Binds `addr` and serves `app` over `tls` until the [`Server`] is stopped.
async fn serve_tls(
    addr: SocketAddr,
    app: Router,
    tls: secure::Tls,
) -> Result<Server, secure::SecureError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| secure::SecureError::Tls(format!("binding {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| secure::SecureError::Tls(e.to_string()))?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(accept_loop(
        listener,
        app,
        stopped,
        Some(Arc::new(tls)),
        SECURE_CONNECTION_LIFETIME,
    ));
    Ok(Server {
        addr: local,
        stop,
        task,
    })
}

/// `/metrics` alone over TLS, authenticated and authorized as on the secure port (a bearer
/// token through a TokenReview, a SubjectAccessReview on `nodes/metrics`): what a cluster's
/// Prometheus scrapes from a companion (kubelet keeps its own secure port).
pub async fn serve_secure_metrics(
    addr: SocketAddr,
    sources: Sources,
    opts: secure::SecureOptions,
) -> Result<Server, secure::SecureError> {
    let tls = secure::tls_with(&opts, None)?;
    let auth = Arc::new(secure::Auth::new(opts, &tls));
    let app = Router::new()
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn(deadline))
        .with_state(app_state(sources))
        .layer(middleware::from_fn_with_state(auth, secure::filter));
    serve_tls(addr, app, tls).await
}

fn app_state(sources: Sources) -> Shared {
    let mut node = prometheus_client::registry::Registry::default();
    // kubelet's `kubelet_node_name{node}` (always 1): what kube-prometheus's rules join on.
    let node_name = prometheus_client::metrics::family::Family::<
        Vec<(&'static str, String)>,
        prometheus_client::metrics::gauge::Gauge,
    >::default();
    node_name
        .get_or_create(&vec![("node", sources.config.node_name())])
        .set(1);
    node.register(
        "kubelet_node_name",
        "The node's name. The count is always 1.",
        node_name,
    );
    node.register_collector(Box::new(NodeStateCollector {
        pipeline: sources.pipeline.clone(),
        link: sources.link.clone(),
        status: sources.status.clone(),
    }));
    let stats = summary::StatsReader::new(sources.observer.clone());
    Arc::new(AppState {
        sources,
        node,
        stats,
    })
}

fn router(state: Shared) -> Router {
    let bounded = Router::new()
        .route("/metrics", get(metrics))
        .route("/metrics/resource", get(resource::handler))
        .route("/metrics/probes", get(probe_metrics))
        .route("/metrics/cadvisor", get(cadvisor::handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/configz", get(configz))
        .route("/pods", get(pods))
        .route("/stats/summary", get(summary::handler))
        .route("/capabilities", get(capabilities))
        .route("/debug/flags/v", axum::routing::put(debug::set_verbosity))
        .route("/debug/pprof/heap", get(debug::heap))
        .layer(middleware::from_fn(deadline));
    Router::new()
        // Bounded by its own `seconds` (see debug::profile).
        .route("/debug/pprof/profile", get(debug::profile))
        .merge(bounded)
        .fallback(not_found)
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

/// Answers within [`REQUEST_TIMEOUT`] or 503.
async fn deadline(req: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
        Ok(r) => r,
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not answered within {REQUEST_TIMEOUT:?}\n"),
        )
            .into_response(),
    }
}

/// Logs each request at `debug` (kubelet logs them from verbosity 3: see [`debug`]).
async fn log_request(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let t0 = std::time::Instant::now();
    let resp = next.run(req).await;
    tracing::debug!(%method, %path, status = resp.status().as_u16(), elapsed_ms = t0.elapsed().as_millis() as u64, "HTTP request");
    resp
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, content_type)], body).into_response()
}

fn json(value: &impl serde::Serialize) -> Response {
    match serde_json::to_string(value) {
        Ok(body) => text(StatusCode::OK, "application/json", body),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            format!("encoding JSON: {e}\n"),
        ),
    }
}

/// The OpenMetrics content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn metrics(State(s): State<Shared>, headers: axum::http::HeaderMap) -> Response {
    registries_page(&s, &headers, &[s.sources.metrics.registry(), &s.node])
}

/// kubelet's `/metrics/probes` (`metrics::probes`); beside kubelet, kubelet serves it.
async fn probe_metrics(State(s): State<Shared>, headers: axum::http::HeaderMap) -> Response {
    registries_page(&s, &headers, &[crate::metrics::probes::global().registry()])
}

/// `registries` as a metrics page ([`metrics_answer`]); beside kubelet only the enforcer's
/// own families.
fn registries_page(
    s: &Shared,
    headers: &axum::http::HeaderMap,
    registries: &[&prometheus_client::registry::Registry],
) -> Response {
    match crate::metrics::encode(registries) {
        Ok(body) if s.sources.config.enforcer.own_metrics_only => {
            metrics_answer(headers, crate::metrics::only_families(&body, "enforcer_"))
        }
        Ok(body) => metrics_answer(headers, body),
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            "encoding the metrics failed\n".to_owned(),
        ),
    }
}

/// A metrics page (OpenMetrics text) in the format the scraper asks for: OpenMetrics when its
/// `Accept` names it, else the Prometheus text format 0.0.4 kubelet serves.
pub(crate) fn metrics_answer(headers: &axum::http::HeaderMap, openmetrics: String) -> Response {
    use crate::metrics::exposition;
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if exposition::wants_openmetrics(accept) {
        text(StatusCode::OK, OPENMETRICS, openmetrics)
    } else {
        text(
            StatusCode::OK,
            exposition::TEXT_004,
            exposition::to_text_004(&openmetrics),
        )
    }
}

async fn healthz(State(s): State<Shared>) -> Response {
    checks_page(&s.sources.health.failures(), "failed")
}

/// Ready: alive, started, and nothing it needs missing; else 503 with one line per reason
/// (a readiness probe's answer an operator can read: `kubectl describe pod` shows it).
async fn readyz(State(s): State<Shared>) -> Response {
    checks_page(&s.sources.health.not_ready(), "not ready")
}

/// `200 ok`, or `503` with one `<label>: <reason>` line per reason.
fn checks_page(reasons: &[String], label: &str) -> Response {
    if reasons.is_empty() {
        return text(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "ok\n".to_owned(),
        );
    }
    let body: String = reasons.iter().map(|r| format!("{label}: {r}\n")).collect();
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain; charset=utf-8",
        body,
    )
}

async fn capabilities(State(s): State<Shared>) -> Response {
    text(
        StatusCode::OK,
        "application/json",
        s.sources.capabilities.clone(),
    )
}

async fn configz(State(s): State<Shared>) -> Response {
    json(&serde_json::json!({ "kubeletconfig": &s.sources.config }))
}

/// kubelet's `/pods`: every pod the node has a status for, with its spec while the pod is
/// active (admitted and not terminating; a pod past that shows metadata and status only), its
/// status as the API server gets it.
async fn pods(State(s): State<Shared>) -> Response {
    use k8s_openapi::{
        api::core::v1::Pod,
        apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta},
    };
    let active = s.sources.link.active();
    let (_, file) = s.sources.status.snapshot();
    let items = file
        .pods
        .iter()
        .map(|rec| {
            let mut pod = active.get(&rec.uid).map_or_else(
                || Pod {
                    metadata: ObjectMeta {
                        name: Some(rec.name.clone()),
                        namespace: Some(rec.namespace.clone()),
                        uid: Some(rec.uid.clone()),
                        ..ObjectMeta::default()
                    },
                    ..Pod::default()
                },
                |e| Pod::clone(&e.pod),
            );
            let host_network = pod
                .spec
                .as_ref()
                .and_then(|sp| sp.host_network)
                .unwrap_or(false);
            pod.status = Some(crate::cluster::pod_status::api_status(
                rec,
                None,
                host_network,
            ));
            pod
        })
        .collect();
    json(&k8s_openapi::List::<Pod> {
        items,
        metadata: ListMeta::default(),
    })
}

async fn accept_loop(
    listener: TcpListener,
    app: Router,
    mut stopped: tokio::sync::watch::Receiver<bool>,
    tls: Option<Arc<secure::Tls>>,
    lifetime: Duration,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    let mut backoff = Duration::ZERO;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_REQUEST_HEADER.max(8192))
        .keep_alive(true);
    loop {
        // A slot first: beyond the cap, connections wait in the backlog, not in our table.
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => break,
            },
            _ = stopped.wait_for(|s| *s) => break,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopped.wait_for(|s| *s) => break,
        };
        match accepted {
            Ok((sock, _)) => {
                backoff = Duration::ZERO;
                if let Some(tls) = &tls {
                    // The handshake off the accept loop, bounded; then the connection with
                    // its client's certificates as a request extension.
                    let (tls, app, http, mut stop) =
                        (tls.clone(), app.clone(), http.clone(), stopped.clone());
                    tokio::spawn(async move {
                        let handshake =
                            tokio::time::timeout(HEADER_TIMEOUT * 5, tls.acceptor.accept(sock))
                                .await;
                        let Ok(Ok(stream)) = handshake else {
                            drop(slot);
                            return;
                        };
                        let peer = Arc::new(secure::Peer {
                            certs: stream
                                .get_ref()
                                .1
                                .peer_certificates()
                                .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                                .unwrap_or_default(),
                        });
                        let svc =
                            tower::service_fn(move |mut req: Request<hyper::body::Incoming>| {
                                req.extensions_mut().insert(peer.clone());
                                tower::ServiceExt::oneshot(app.clone(), req)
                            });
                        let conn = http
                            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc))
                            .with_upgrades();
                        tokio::pin!(conn);
                        let ended = tokio::select! {
                            r = tokio::time::timeout(lifetime, conn.as_mut()) => r.is_ok(),
                            _ = stop.wait_for(|s| *s) => false,
                        };
                        if !ended {
                            conn.as_mut().graceful_shutdown();
                            let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn).await;
                        }
                        drop(slot);
                    });
                    continue;
                }
                let conn = http
                    .serve_connection(TokioIo::new(sock), TowerToHyperService::new(app.clone()));
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(lifetime, conn).await;
                    drop(slot);
                });
            }
            Err(e) => {
                drop(slot);
                backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                if backoff == Duration::from_millis(10) {
                    tracing::warn!(error = %e, "HTTP accept failed; backing off");
                }
                tokio::time::sleep(backoff).await;
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("HTTP connections still open after the shutdown grace; closed");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::{
        io::{AsyncReadExt as _, AsyncWriteExt as _},
        net::TcpStream,
    };

    use super::*;

    fn sources(health: Arc<Health>) -> Sources {
        let config = crate::config::load(&crate::config::ConfigArgs::default())
            .expect("config")
            .config;
        let observer = config.node_observer(
            &crate::cgroup::CgroupLayout::default(),
            &config.enforcer.node_capacity,
        );
        Sources {
            config,
            capabilities: "{}".to_owned(),
            health,
            metrics: Metrics::new(),
            pipeline: Arc::default(),
            link: NodeLink::default(),
            status: StatusManager::default(),
            observer,
            runtime: None,
        }
    }

    /// Writes `parts` with pauses, then reads until the server closes.
    async fn exchange(addr: SocketAddr, parts: &[&[u8]]) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        for p in parts {
            s.write_all(p).await.expect("write");
            s.flush().await.expect("flush");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    }

    #[tokio::test]
    async fn split_requests_head_health_failures_and_methods() {
        let health = Arc::new(Health::default());
        let server = serve(
            "127.0.0.1:0".parse().expect("addr"),
            sources(health.clone()),
        )
        .await
        .expect("serve");
        let addr = server.addr;
        let split = exchange(
            addr,
            &[
                b"GET /metr",
                b"ics?x=1 HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\n",
                b"Connection: close\r\n\r\n",
            ],
        )
        .await;
        assert!(
            split.starts_with("HTTP/1.1 200 OK")
                && split.contains("application/openmetrics-text")
                && split.contains("enforcer_node_condition")
                && split.contains("kubelet_node_name{node=")
                && split.trim_end().ends_with("# EOF"),
            "{split}"
        );
        // Without asking for OpenMetrics: kubelet's text format.
        let plain = exchange(
            addr,
            &[b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"],
        )
        .await;
        assert!(
            plain.contains("text/plain; version=0.0.4")
                && plain.contains("# TYPE kubelet_started_pods_errors_total counter")
                && !plain.contains("# EOF"),
            "{plain}"
        );
        let head = exchange(
            addr,
            &[b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"],
        )
        .await;
        assert!(
            head.starts_with("HTTP/1.1 200 OK") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        health.set_runtime(false);
        let failed = exchange(
            addr,
            &[b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"],
        )
        .await;
        assert!(
            failed.starts_with("HTTP/1.1 503") && failed.contains("failed: runtime"),
            "{failed}"
        );
        let post = exchange(
            addr,
            &[b"POST /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"],
        )
        .await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let missing = exchange(
            addr,
            &[b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"],
        )
        .await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let heap = exchange(
            addr,
            &[b"GET /debug/pprof/heap HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"],
        )
        .await;
        assert!(
            heap.starts_with("HTTP/1.1 501") && heap.contains("allocator"),
            "{heap}"
        );
        server.shutdown().await;
        assert!(TcpStream::connect(addr).await.is_err(), "still listening");
    }

    /// A connection that sends nothing, or nothing after its first request (keep-alive), is
    /// closed after HEADER_TIMEOUT (real time: the sockets are real).
    #[tokio::test]
    async fn idle_connections_are_closed() {
        let server = serve(
            "127.0.0.1:0".parse().expect("addr"),
            sources(Arc::default()),
        )
        .await
        .expect("serve");
        let mut silent = TcpStream::connect(server.addr).await.expect("connect");
        let mut kept = TcpStream::connect(server.addr).await.expect("connect");
        kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut buf = vec![0u8; 4096];
        let n = kept.read(&mut buf).await.expect("read");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        let t0 = Instant::now();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(HEADER_TIMEOUT * 3, async {
            let _ = silent.read_to_end(&mut rest).await;
            let _ = kept.read_to_end(&mut rest).await;
        })
        .await;
        assert!(closed.is_ok(), "an idle connection stayed open");
        assert!(t0.elapsed() <= HEADER_TIMEOUT * 2, "{:?}", t0.elapsed());
        server.shutdown().await;
    }

    /// Shutdown lets a request in flight finish.
    #[tokio::test]
    async fn shutdown_is_graceful() {
        let server = serve(
            "127.0.0.1:0".parse().expect("addr"),
            sources(Arc::default()),
        )
        .await
        .expect("serve");
        let addr = server.addr;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /configz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut buf = vec![0u8; 64 * 1024];
        let n = s.read(&mut buf).await.expect("read");
        let got = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(got.contains("\"kubeletconfig\""), "{got}");
        let t0 = Instant::now();
        server.shutdown().await;
        assert!(t0.elapsed() < SHUTDOWN_GRACE + Duration::from_secs(1));
        // The idle keep-alive connection was closed by the shutdown.
        let mut rest = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(1), s.read_to_end(&mut rest))
            .await
            .expect("closed")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }
}
