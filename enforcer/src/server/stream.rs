//! `/exec`, `/attach` and `/portForward` (kubelet's `getExec`, `getAttach`,
//! `getPortForward` and `proxyStream`): the runtime's streaming URL from CRI (`Exec`,
//! `Attach`, `PortForward`), then the client's upgrade (SPDY or WebSocket) relayed to it byte
//! for byte: the runtime's streaming server speaks the protocols, the node only carries
//! them. kubelet's answers: 400 `you must specify at least 1 of stdin, stdout, stderr`, 404
//! `pod does not exist`, 500 `Upgrade request required` for a request that is not an upgrade.

use axum::{
    body::Body,
    extract::{Path, RawQuery, Request, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};

use super::{Shared, logs::query_pairs};
use crate::policy::pod_status::PodRecord;

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// A stream request kubelet refuses with 400 (the error's text is the body).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("you must specify at least 1 of stdin, stdout, stderr")]
    NoStreams,
    #[error("query parameter \"port\" is required")]
    PortRequired,
    #[error("query parameter \"port\" cannot be empty")]
    PortEmpty,
    #[error("unable to parse {port:?} as a port: {source}")]
    PortParse {
        port: String,
        source: std::num::ParseIntError,
    },
    #[error("port {0:?} must be > 0")]
    PortZero(String),
}

/// The exec and attach streams asked for (`input`, `output`, `error`, `tty`: each on only as
/// `1`) and the command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
    pub command: Vec<String>,
}

/// kubelet's `NewOptions`: the streams and command; `Err` when none of the three streams
/// is asked for.
pub fn stream_options(query: &str) -> Result<StreamOptions, StreamError> {
    let pairs = query_pairs(query);
    let on = |k: &str| {
        pairs
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .is_some_and(|(_, v)| v == "1")
    };
    let tty = on("tty");
    let o = StreamOptions {
        stdin: on("input"),
        stdout: on("output"),
        // A tty merges stderr into stdout.
        stderr: on("error") && !tty,
        tty,
        command: pairs
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect(),
    };
    if !(o.stdin || o.stdout || o.stderr) {
        return Err(StreamError::NoStreams);
    }
    Ok(o)
}

/// `portforward.NewV4Options`: WebSocket requests must name their ports (`port`, repeated or
/// comma-separated); SPDY ones give them later, per stream.
pub fn forward_ports(query: &str, websocket: bool) -> Result<Vec<i32>, StreamError> {
    if !websocket {
        return Ok(Vec::new());
    }
    let pairs = query_pairs(query);
    let values: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "port")
        .map(|(_, v)| v.as_str())
        .collect();
    if values.is_empty() {
        return Err(StreamError::PortRequired);
    }
    let mut out = Vec::new();
    for v in values.iter().flat_map(|v| v.split(',')) {
        if v.is_empty() {
            return Err(StreamError::PortEmpty);
        }
        let p: u16 = v.parse().map_err(|source| StreamError::PortParse {
            port: v.to_owned(),
            source,
        })?;
        if p == 0 {
            return Err(StreamError::PortZero(v.to_owned()));
        }
        out.push(i32::from(p));
    }
    Ok(out)
}

fn is_websocket(h: &HeaderMap) -> bool {
    h.get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

fn is_upgrade(h: &HeaderMap) -> bool {
    h.get(header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
}

fn find_pod(s: &Shared, namespace: &str, pod: &str) -> Option<PodRecord> {
    let (_, file) = s.sources.status.snapshot();
    file.pods
        .into_iter()
        .find(|p| p.namespace == namespace && p.name == pod)
}

fn running_container(rec: &PodRecord, name: &str) -> Option<String> {
    rec.container_statuses
        .iter()
        .chain(&rec.init_container_statuses)
        .find(|c| c.name == name)
        .map(|c| {
            c.container_id
                .split_once("://")
                .map_or(c.container_id.as_str(), |(_, id)| id)
                .to_owned()
        })
        .filter(|id| !id.is_empty())
}

/// Whether the container's spec asks for a TTY (attach takes it from the spec).
fn spec_tty(s: &Shared, uid: &str, name: &str) -> bool {
    s.sources.link.active().get(uid).is_some_and(|e| {
        e.pod.spec.as_ref().is_some_and(|sp| {
            sp.containers
                .iter()
                .chain(sp.init_containers.iter().flatten())
                .any(|c| c.name == name && c.tty == Some(true))
        })
    })
}

fn cri_error(e: &crate::cri::CriError) -> Response {
    let status = match e {
        crate::cri::CriError::Status {
            code: tonic::Code::NotFound,
            ..
        } => StatusCode::NOT_FOUND,
        crate::cri::CriError::Status {
            code: tonic::Code::ResourceExhausted,
            ..
        } => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    text(status, e.to_string())
}

enum Kind {
    Exec,
    Attach,
}

/// Which container an exec or attach is for.
struct Target {
    namespace: String,
    pod: String,
    uid: Option<String>,
    container: String,
}

async fn exec_or_attach(
    s: Shared,
    kind: Kind,
    t: Target,
    query: Option<String>,
    req: Request,
) -> Response {
    let Target {
        namespace,
        pod,
        uid,
        container,
    } = t;
    let opts = match stream_options(query.as_deref().unwrap_or("")) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let Some(rec) = find_pod(&s, &namespace, &pod) else {
        return text(StatusCode::NOT_FOUND, "pod does not exist".to_owned());
    };
    if matches!(kind, Kind::Attach) && uid.as_ref().is_some_and(|u| *u != rec.uid) {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("pod {pod} not found"),
        );
    }
    let Some(id) = running_container(&rec, &container) else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("container not found ({container:?})"),
        );
    };
    let Some(rt) = s.sources.runtime.clone() else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no container runtime".to_owned(),
        );
    };
    let url = match kind {
        Kind::Exec => {
            rt.exec_url(cri::ExecRequest {
                container_id: id,
                cmd: opts.command.clone(),
                tty: opts.tty,
                stdin: opts.stdin,
                stdout: opts.stdout,
                stderr: opts.stderr,
            })
            .await
        }
        Kind::Attach => {
            let tty = spec_tty(&s, &rec.uid, &container);
            rt.attach_url(cri::AttachRequest {
                container_id: id,
                stdin: opts.stdin,
                tty,
                stdout: opts.stdout,
                stderr: opts.stderr && !tty,
            })
            .await
        }
    };
    match url {
        Ok(url) => proxy(req, &url).await,
        Err(e) => cri_error(&e),
    }
}

/// The path's parameters (`namespace`, `pod`, optional `uid`, `container`).
type Params = Path<std::collections::HashMap<String, String>>;

fn target(p: &std::collections::HashMap<String, String>) -> Target {
    let get = |k: &str| p.get(k).cloned().unwrap_or_default();
    Target {
        namespace: get("namespace"),
        pod: get("pod"),
        uid: p.get("uid").cloned(),
        container: get("container"),
    }
}

/// `/exec/{namespace}/{pod}[/{uid}]/{container}` (the uid is not checked, as kubelet).
pub(super) async fn exec(
    State(s): State<Shared>,
    Path(p): Params,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    exec_or_attach(s, Kind::Exec, target(&p), query, req).await
}

/// `/attach/{namespace}/{pod}[/{uid}]/{container}`.
pub(super) async fn attach(
    State(s): State<Shared>,
    Path(p): Params,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    exec_or_attach(s, Kind::Attach, target(&p), query, req).await
}

/// `/portForward/{namespace}/{pod}[/{uid}]`.
pub(super) async fn port_forward(
    State(s): State<Shared>,
    Path(p): Params,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let t = target(&p);
    forward(s, t.namespace, t.pod, t.uid, query, req).await
}

async fn forward(
    s: Shared,
    namespace: String,
    pod: String,
    uid: Option<String>,
    query: Option<String>,
    req: Request,
) -> Response {
    let ports = match forward_ports(query.as_deref().unwrap_or(""), is_websocket(req.headers())) {
        Ok(p) => p,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let Some(rec) = find_pod(&s, &namespace, &pod) else {
        return text(StatusCode::NOT_FOUND, "pod does not exist".to_owned());
    };
    if uid.as_ref().is_some_and(|u| *u != rec.uid) || rec.sandbox_id.is_empty() {
        return text(StatusCode::NOT_FOUND, "pod not found".to_owned());
    }
    let Some(rt) = s.sources.runtime.clone() else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no container runtime".to_owned(),
        );
    };
    match rt
        .port_forward_url(cri::PortForwardRequest {
            pod_sandbox_id: rec.sandbox_id.clone(),
            port: ports,
        })
        .await
    {
        Ok(url) => proxy(req, &url).await,
        Err(e) => cri_error(&e),
    }
}

/// The largest response head read from the runtime's streaming server.
const MAX_HEAD: usize = 16 * 1024;

/// kubelet's `UpgradeAwareHandler` with `upgradeRequired`: the request (its upgrade headers,
/// not its credentials) to the runtime's URL, the runtime's answer back, and after a 101 the
/// two connections joined.
async fn proxy(mut req: Request, url: &str) -> Response {
    if !is_upgrade(req.headers()) {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Upgrade request required\n".to_owned(),
        );
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unsupported streaming URL {url}"),
        );
    };
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut backend = match TcpStream::connect(host).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(url, error = %e, "error while proxying request");
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("error dialing backend: {e}"),
            );
        }
    };
    let path = match req.uri().query() {
        Some(q) if !path.contains('?') => format!("{path}?{q}"),
        _ => path,
    };
    let mut head = format!("{} {path} HTTP/1.1\r\nHost: {host}\r\n", req.method());
    for (name, value) in req.headers() {
        if name == header::HOST || name == header::AUTHORIZATION || name == header::CONTENT_LENGTH {
            continue;
        }
        if let Ok(v) = value.to_str() {
            head.push_str(&format!("{name}: {v}\r\n"));
        }
    }
    head.push_str("\r\n");
    if let Err(e) = backend.write_all(head.as_bytes()).await {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("error proxying request: {e}"),
        );
    }
    let mut got = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if got.len() > MAX_HEAD {
            return text(
                StatusCode::BAD_GATEWAY,
                "the runtime's answer is too large".to_owned(),
            );
        }
        match backend.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                return text(
                    StatusCode::BAD_GATEWAY,
                    "the runtime closed the stream".to_owned(),
                );
            }
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
    };
    let head_text = String::from_utf8_lossy(&got[..end]).into_owned();
    let leftover = got[end..].to_vec();
    let mut lines = head_text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .unwrap_or(StatusCode::BAD_GATEWAY);
    let mut resp = Response::builder().status(status);
    let mut length = None;
    for line in lines.filter(|l| !l.is_empty()) {
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse::<usize>().ok();
            }
            resp = resp.header(k.trim(), v.trim());
        }
    }
    if status != StatusCode::SWITCHING_PROTOCOLS {
        // An error page: relay its body (bounded).
        let mut body = leftover;
        let want = length.unwrap_or(MAX_HEAD).min(MAX_HEAD);
        while body.len() < want {
            match backend.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        body.truncate(want);
        return resp
            .body(Body::from(body))
            .unwrap_or_else(|_| text(StatusCode::BAD_GATEWAY, "bad answer".to_owned()));
    }
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let client = match upgrade.await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "stream: the client's upgrade failed");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        if !leftover.is_empty() && client.write_all(&leftover).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
    });
    resp.body(Body::empty())
        .unwrap_or_else(|_| text(StatusCode::BAD_GATEWAY, "bad answer".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The errors as their text (the 400's body).
    fn stream_options(query: &str) -> Result<StreamOptions, String> {
        super::stream_options(query).map_err(|e| e.to_string())
    }

    fn forward_ports(query: &str, websocket: bool) -> Result<Vec<i32>, String> {
        super::forward_ports(query, websocket).map_err(|e| e.to_string())
    }

    #[test]
    fn stream_options_as_kubelet_reads_them() {
        let o = stream_options("command=ls&command=-l&output=1&error=1").expect("opts");
        assert_eq!(o.command, ["ls", "-l"]);
        assert!(o.stdout && o.stderr && !o.stdin && !o.tty);
        // Only "1" is on; a tty drops stderr.
        let o = stream_options("input=true&output=1&error=1&tty=1").expect("opts");
        assert!(!o.stdin && o.stdout && !o.stderr && o.tty);
        assert_eq!(
            stream_options("command=ls&stdout=1"),
            Err("you must specify at least 1 of stdin, stdout, stderr".to_owned())
        );
        assert_eq!(forward_ports("", false), Ok(vec![]));
        assert_eq!(
            forward_ports("port=80&port=8080,9090", true),
            Ok(vec![80, 8080, 9090])
        );
        assert_eq!(
            forward_ports("", true),
            Err("query parameter \"port\" is required".to_owned())
        );
        assert!(forward_ports("port=0", true).is_err_and(|e| e.contains("must be > 0")));
        assert!(forward_ports("port=x", true).is_err_and(|e| e.contains("unable to parse")));
    }
}
