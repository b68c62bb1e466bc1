//! Container probes (kubelet's `pkg/kubelet/prober`): startup, liveness and readiness probes
//! with exec (CRI `ExecSync`), httpGet, tcpSocket and grpc (`grpc.health.v1.Health/Check`)
//! handlers, run by one task per container instance and probe type on kubelet's timing
//! (initialDelaySeconds, periodSeconds, timeoutSeconds, success and failure thresholds).
//!
//! The results are kept as kubelet's results managers keep them, by container id: readiness
//! starts as `Failure`, liveness as `Success`, startup as `Unknown`. Liveness and readiness
//! probes wait until the startup probe succeeded. A liveness or startup result turning
//! `Failure` asks the pod worker to kill the container ([`Prober::take_kills`]); the worker
//! restarts it per the restart policy. Every failed probe is a `Warning` `Unhealthy` event
//! (`Liveness probe failed: ...`). HTTPS probes do not verify the server's certificate, as
//! kubelet. A probe that cannot run (no handler, an unknown named port, a liveness
//! successThreshold other than 1) is a prober error, as in kubelet: its result is thrown away
//! (the initial value stays) and each attempt is a `Warning` event saying why; it is never
//! dropped silently.
//!
//! Timing differs from kubelet's in phase only: kubelet's probe workers tick from when the
//! pod was added (and skip ticks inside the initial delay); here a container's first probe
//! runs as soon as its initial delay (counted from the container's start) has passed, then
//! every period. Readiness probes run at once when the startup probe succeeds (kubelet
//! triggers them from the status update), liveness probes at their next period.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Container, Probe},
    apimachinery::pkg::util::intstr::IntOrString,
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    sync::{Notify, watch},
    task::JoinSet,
    time::Instant,
};

use super::cri::{ContainerRuntime, CriError};
use crate::cluster::events::{EventType, Involved, Recorder};

/// kubelet's `maxProbeRetries`: a probe that errors is retried this many times at once.
const MAX_PROBE_RETRIES: usize = 3;
/// kubelet's `maxRespBodyLength` for HTTP probes.
const MAX_BODY: usize = 10 * 1024;
/// kubelet's exec probe keeps at most this much output (`maxReadLength`).
const MAX_EXEC_OUTPUT: usize = 10 * 1024;
/// Go's `http.Client` follows at most this many redirects.
const MAX_REDIRECTS: usize = 10;

/// The User-Agent of HTTP and gRPC probes (`kube-probe/<major>.<minor>`, from the kubelet
/// version the node reports).
#[must_use]
pub fn user_agent() -> String {
    let v = crate::cluster::node_status::kubelet_version();
    let mut parts = v.trim_start_matches('v').split(['.', '+', '-']);
    let major = parts.next().unwrap_or("1");
    let minor = parts.next().unwrap_or("0");
    format!("kube-probe/{major}.{minor}")
}

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeType {
    Startup,
    Liveness,
    Readiness,
}

impl ProbeType {
    /// kubelet's `probeType.String()` (`Liveness`), as in event messages.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Startup => "Startup",
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
        }
    }

    /// The container's probe of this type.
    #[must_use]
    pub fn of(self, c: &Container) -> Option<&Probe> {
        match self {
            Self::Startup => c.startup_probe.as_ref(),
            Self::Liveness => c.liveness_probe.as_ref(),
            Self::Readiness => c.readiness_probe.as_ref(),
        }
    }

    /// kubelet's initial value of the results manager for a new container.
    #[must_use]
    pub fn initial(self) -> ProbeResult {
        match self {
            Self::Startup => ProbeResult::Unknown,
            Self::Liveness => ProbeResult::Success,
            Self::Readiness => ProbeResult::Failure,
        }
    }
}

/// A result as kubelet's results manager keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    Unknown,
    Success,
    Failure,
}

/// What one run of a handler found (kubelet's `probe.Result` with its output; `Error` is a
/// prober error, whose result kubelet throws away).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success(String),
    /// Success with a warning (an HTTP redirect to another host).
    Warning(String),
    Failure(String),
    Error(String),
}

/// HTTP or HTTPS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// What a probe runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handler {
    Exec {
        command: Vec<String>,
    },
    Http {
        scheme: Scheme,
        /// `host` of the probe; the pod IP when unset.
        host: Option<String>,
        port: u16,
        path: String,
        headers: Vec<(String, String)>,
    },
    Tcp {
        host: Option<String>,
        port: u16,
    },
    Grpc {
        port: u16,
        service: String,
    },
}

/// A probe with kubelet's defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    /// The handler, or why there is none that can run.
    pub handler: Result<Handler, String>,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
    /// The probe-level `terminationGracePeriodSeconds` (liveness and startup kills).
    pub termination_grace: Option<i64>,
}

fn seconds(v: Option<i32>, default: u64) -> Duration {
    match v {
        Some(s) if s > 0 => Duration::from_secs(u64::try_from(s).unwrap_or(default)),
        _ => Duration::from_secs(default),
    }
}

fn count(v: Option<i32>, default: u32) -> u32 {
    match v {
        Some(n) if n > 0 => u32::try_from(n).unwrap_or(default),
        _ => default,
    }
}

/// kubelet's `extractPort`: a number, or a named container port (or a number in a string).
fn extract_port(port: &IntOrString, c: &Container) -> Result<u16, String> {
    let n: i64 = match port {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(name) => match c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
        {
            Some(p) => i64::from(p.container_port),
            None => name
                .parse::<i64>()
                .map_err(|_| format!("port {name:?} not found in container {}", c.name))?,
        },
    };
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("invalid port number: {n}"))
}

/// kubelet's `ExpandContainerCommandOnlyStatic`: `$(VAR)` from the container's literal env.
fn expand_static(command: &[String], c: &Container) -> Vec<String> {
    let env: BTreeMap<&str, &str> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or("")))
        .collect();
    command
        .iter()
        .map(|s| crate::policy::env::expand(s, &|name| env.get(name).map(|v| (*v).to_owned())))
        .collect()
}

fn handler(p: &Probe, c: &Container) -> Result<Handler, String> {
    let given = [
        p.exec.is_some(),
        p.http_get.is_some(),
        p.tcp_socket.is_some(),
        p.grpc.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if given > 1 {
        return Err("may not specify more than 1 handler type".to_owned());
    }
    if let Some(e) = &p.exec {
        let command = expand_static(e.command.as_deref().unwrap_or_default(), c);
        if command.is_empty() {
            return Err("exec probe without a command".to_owned());
        }
        return Ok(Handler::Exec { command });
    }
    if let Some(h) = &p.http_get {
        let scheme = match h.scheme.as_deref().unwrap_or("HTTP") {
            "HTTP" | "http" | "" => Scheme::Http,
            "HTTPS" | "https" => Scheme::Https,
            other => return Err(format!("unsupported HTTP probe scheme {other:?}")),
        };
        let path = h.path.clone().unwrap_or_default();
        return Ok(Handler::Http {
            scheme,
            host: h.host.clone().filter(|s| !s.is_empty()),
            port: extract_port(&h.port, c)?,
            path: if path.starts_with('/') {
                path
            } else {
                format!("/{path}")
            },
            headers: h
                .http_headers
                .iter()
                .flatten()
                .map(|x| (x.name.clone(), x.value.clone()))
                .collect(),
        });
    }
    if let Some(t) = &p.tcp_socket {
        return Ok(Handler::Tcp {
            host: t.host.clone().filter(|s| !s.is_empty()),
            port: extract_port(&t.port, c)?,
        });
    }
    if let Some(g) = &p.grpc {
        let port = u16::try_from(g.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("invalid port number: {}", g.port))?;
        return Ok(Handler::Grpc {
            port,
            service: g.service.clone().unwrap_or_default(),
        });
    }
    Err(format!("missing probe handler for container {}", c.name))
}

impl ProbeSpec {
    /// The probe of `kind` of container `c` with the API server's defaults (period 10 s,
    /// timeout 1 s, success threshold 1, failure threshold 3). A liveness or startup probe
    /// whose successThreshold is not 1 (the API server refuses it) cannot run.
    #[must_use]
    pub fn parse(kind: ProbeType, p: &Probe, c: &Container) -> Self {
        let success_threshold = count(p.success_threshold, 1);
        let handler = handler(p, c).and_then(|h| {
            if kind != ProbeType::Readiness && success_threshold != 1 {
                Err(format!(
                    "successThreshold must be 1 for {} probes (is {success_threshold})",
                    kind.as_str().to_lowercase()
                ))
            } else {
                Ok(h)
            }
        });
        Self {
            handler,
            initial_delay: Duration::from_secs(
                u64::try_from(p.initial_delay_seconds.unwrap_or(0).max(0)).unwrap_or(0),
            ),
            period: seconds(p.period_seconds, 10),
            timeout: seconds(p.timeout_seconds, 1),
            success_threshold,
            failure_threshold: count(p.failure_threshold, 3),
            termination_grace: p.termination_grace_period_seconds.filter(|g| *g >= 0),
        }
    }
}

/// A run of equal results (kubelet's worker `lastResult` / `resultRun`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Run {
    last: Option<ProbeResult>,
    count: u32,
}

impl Run {
    /// Counts one result; returns the result to record once its threshold is reached.
    #[must_use]
    pub fn step(
        &mut self,
        r: ProbeResult,
        success_threshold: u32,
        failure_threshold: u32,
    ) -> Option<ProbeResult> {
        if self.last == Some(r) {
            self.count = self.count.saturating_add(1);
        } else {
            self.last = Some(r);
            self.count = 1;
        }
        let below = match r {
            ProbeResult::Failure => self.count < failure_threshold,
            ProbeResult::Success => self.count < success_threshold,
            ProbeResult::Unknown => false,
        };
        (!below).then_some(r)
    }
}

/// `host:port`, IPv6 hosts bracketed (Go's `net.JoinHostPort`).
#[must_use]
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Go's wording of a dial error.
fn dial_error(addr: &str, e: &std::io::Error) -> String {
    let what = match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connect: connection refused".to_owned(),
        std::io::ErrorKind::HostUnreachable => "connect: no route to host".to_owned(),
        std::io::ErrorKind::NetworkUnreachable => "connect: network is unreachable".to_owned(),
        _ => e.to_string(),
    };
    format!("dial tcp {addr}: {what}")
}

/// kubelet's TCP probe: a connection within the timeout.
pub async fn tcp_probe(host: &str, port: u16, timeout: Duration) -> Outcome {
    let addr = join_host_port(host, port);
    match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => Outcome::Success(String::new()),
        Ok(Err(e)) => Outcome::Failure(dial_error(&addr, &e)),
        Err(_) => Outcome::Failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

/// The status line and headers of an HTTP/1.x response: (code, headers lowercased, offset of
/// the body); `None` while the head is incomplete.
/// An HTTP response head: status code, headers (names lowercased), offset of the body.
type Head = (u16, Vec<(String, String)>, usize);

fn parse_head(buf: &[u8]) -> Option<Result<Head, String>> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default();
    let mut parts = status.split_whitespace();
    let version = parts.next().unwrap_or_default();
    let code = parts.next().and_then(|c| c.parse::<u16>().ok());
    let Some(code) = code.filter(|_| version.starts_with("HTTP/")) else {
        return Some(Err(format!("malformed HTTP response {status:?}")));
    };
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Ok((code, headers, end + 4)))
}

/// The request kubelet's HTTP prober sends (Go's `http.Client` with kubelet's headers).
/// The request path as sent: spaces, control and non-ASCII bytes percent-encoded (Go's
/// URL encoding of a path it parsed), so a path never breaks the request line.
fn escape_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b <= b' ' || b >= 0x7f {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(char::from(b));
        }
    }
    out
}

/// Whether a header name is an HTTP token (Go refuses others).
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn request(host_port: &str, path: &str, headers: &[(String, String)]) -> Result<String, String> {
    for (k, v) in headers {
        if !is_token(k) {
            return Err(format!("net/http: invalid header field name {k:?}"));
        }
        if v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(format!("net/http: invalid header field value for {k:?}"));
        }
    }
    let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    let host = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("host"))
        .map_or(host_port, |(_, v)| v.as_str());
    let mut r = format!("GET {} HTTP/1.1\r\nHost: {host}\r\n", escape_path(path));
    if !has("user-agent") {
        r.push_str(&format!("User-Agent: {}\r\n", user_agent()));
    }
    if !has("accept") {
        r.push_str("Accept: */*\r\n");
    }
    for (k, v) in headers {
        // An empty Accept removes it, as kubelet does; Host went into the Host line.
        if k.eq_ignore_ascii_case("host") || (k.eq_ignore_ascii_case("accept") && v.is_empty()) {
            continue;
        }
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("Connection: close\r\n\r\n");
    Ok(r)
}

/// One GET: (status code, headers, body up to [`MAX_BODY`]).
type Response = (u16, Vec<(String, String)>, String);

/// The TLS client of HTTPS probes: no certificate verification, as kubelet's
/// `InsecureSkipVerify` (a probe checks health, not identity).
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>> =
        std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS client: {e}"))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
        .clone()
}

/// Accepts any server certificate (signatures are still checked, so the handshake is sound).
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }
}

/// One GET over a new connection (TLS for HTTPS).
async fn get_once(
    scheme: Scheme,
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> Result<Response, String> {
    let addr = join_host_port(host, port);
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| dial_error(&addr, &e))?;
    match scheme {
        Scheme::Http => exchange(tcp, &addr, path, headers).await,
        Scheme::Https => {
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| format!("invalid server name {host:?}: {e}"))?;
            let tls = tokio_rustls::TlsConnector::from(tls_config()?)
                .connect(name, tcp)
                .await
                .map_err(|e| format!("tls: {e}"))?;
            exchange(tls, &addr, path, headers).await
        }
    }
}

/// Sends the request and reads the response head and up to [`MAX_BODY`] of its body.
async fn exchange<S>(
    mut s: S,
    addr: &str,
    path: &str,
    headers: &[(String, String)],
) -> Result<Response, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    s.write_all(request(addr, path, headers)?.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let (code, hdrs, body_at) = loop {
        if let Some(head) = parse_head(&buf) {
            break head?;
        }
        if buf.len() > 64 * 1024 {
            return Err("HTTP response head too long".to_owned());
        }
        let n = s.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("EOF".to_owned());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let length = hdrs
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    let want = length.unwrap_or(MAX_BODY).min(MAX_BODY);
    let mut body = buf.split_off(body_at.min(buf.len()));
    while body.len() < want {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    body.truncate(MAX_BODY);
    Ok((code, hdrs, String::from_utf8_lossy(&body).into_owned()))
}

/// Where a redirect leads: (scheme, host, port, path), `None` for another host (not
/// followed, as kubelet's `followNonLocalRedirects=false`) or a scheme other than HTTP(S).
fn redirect_target(
    location: &str,
    scheme: Scheme,
    host: &str,
    port: u16,
) -> Option<(Scheme, String, u16, String)> {
    if location.starts_with('/') {
        return Some((scheme, host.to_owned(), port, location.to_owned()));
    }
    let (scheme, rest) = if let Some(rest) = location.strip_prefix("http://") {
        (Scheme::Http, rest)
    } else {
        (Scheme::Https, location.strip_prefix("https://")?)
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_owned()),
        None => (rest, "/".to_owned()),
    };
    let (h, p) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            (h.trim_matches(['[', ']']), p.parse().ok()?)
        }
        _ => (authority.trim_matches(['[', ']']), scheme.default_port()),
    };
    (h == host).then(|| (scheme, h.to_owned(), p, path))
}

/// kubelet's HTTP(S) probe: 200..399 succeeds; redirects to the same host are followed,
/// one to another host ends the probe with a warning (a success). HTTPS does not verify
/// the server's certificate, as kubelet.
pub async fn http_probe(
    scheme: Scheme,
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Outcome {
    let url = format!("{}://{}{path}", scheme.as_str(), join_host_port(host, port));
    let run = async {
        let (mut sc, mut h, mut p, mut path) = (scheme, host.to_owned(), port, path.to_owned());
        let mut redirects = 0;
        loop {
            let (code, hdrs, body) = get_once(sc, &h, p, &path, headers).await?;
            if (300..400).contains(&code)
                && let Some((_, loc)) = hdrs.iter().find(|(k, _)| k == "location")
            {
                match redirect_target(loc, sc, &h, p) {
                    Some(next) if redirects < MAX_REDIRECTS => {
                        redirects += 1;
                        (sc, h, p, path) = next;
                        continue;
                    }
                    Some(_) => return Err("stopped after 10 redirects".to_owned()),
                    None => return Ok((code, body)),
                }
            }
            return Ok((code, body));
        }
    };
    match tokio::time::timeout(timeout, run).await {
        Err(_) => Outcome::Failure(format!(
            "Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )),
        Ok(Err(e)) => Outcome::Failure(format!("Get {url:?}: {e}")),
        Ok(Ok((code, body))) if (200..300).contains(&code) => Outcome::Success(body),
        Ok(Ok((code, body))) if (300..400).contains(&code) => {
            Outcome::Warning(format!("Probe terminated redirects, Response body: {body}"))
        }
        Ok(Ok((code, _))) => Outcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
    }
}

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    pub status: i32,
}

/// `grpc.health.v1.HealthCheckResponse.ServingStatus` names.
#[must_use]
pub fn serving_status_name(s: i32) -> &'static str {
    match s {
        0 => "UNKNOWN",
        1 => "SERVING",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "INVALID",
    }
}

/// The gRPC method kubelet's gRPC probe calls.
pub const HEALTH_CHECK_PATH: &str = "/grpc.health.v1.Health/Check";

/// kubelet's gRPC probe: `grpc.health.v1.Health/Check` for `service`, `SERVING` succeeds.
pub async fn grpc_probe(host: &str, port: u16, service: &str, timeout: Duration) -> Outcome {
    let addr = join_host_port(host, port);
    let started = Instant::now();
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .and_then(|e| e.user_agent(user_agent()))
    {
        Ok(e) => e.connect_timeout(timeout),
        Err(e) => {
            return Outcome::Failure(format!("error: failed to connect service at {addr:?}: {e}"));
        }
    };
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            let mut m = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                m = format!("{m}: {s}");
                src = s.source();
            }
            return Outcome::Failure(format!("error: failed to connect service at {addr:?}: {m}"));
        }
        Err(_) => {
            return Outcome::Failure(format!(
                "timeout: failed to connect service {addr:?} within {timeout:?}: context deadline exceeded"
            ));
        }
    };
    let mut grpc = tonic::client::Grpc::new(channel);
    let call = async {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(HEALTH_CHECK_PATH);
        let codec = tonic_prost::ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default();
        grpc.unary(
            tonic::Request::new(HealthCheckRequest {
                service: service.to_owned(),
            }),
            path,
            codec,
        )
        .await
    };
    let left = timeout.saturating_sub(started.elapsed());
    match tokio::time::timeout(left, call).await {
        Err(_) => Outcome::Failure(format!(
            "timeout: health rpc did not complete within {timeout:?}"
        )),
        Ok(Err(s)) => match s.code() {
            tonic::Code::Unimplemented => Outcome::Failure(format!(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                s.message()
            )),
            tonic::Code::DeadlineExceeded => Outcome::Failure(format!(
                "timeout: health rpc did not complete within {timeout:?}"
            )),
            _ => Outcome::Failure(format!("error: health rpc probe failed: {s}")),
        },
        Ok(Ok(resp)) => {
            let status = resp.into_inner().status;
            if status == 1 {
                Outcome::Success("service healthy".to_owned())
            } else {
                Outcome::Failure(format!(
                    "service unhealthy (responded with {:?})",
                    serving_status_name(status)
                ))
            }
        }
    }
}

/// What an `ExecSync` answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Whether a CRI error is the exec's own timeout (kubelet's `DeadlineExceeded` check).
fn is_exec_timeout(e: &CriError) -> bool {
    match e {
        CriError::Timeout { .. } => true,
        CriError::Status { code, message, .. } => {
            *code == tonic::Code::DeadlineExceeded || message.contains("deadline exceeded")
        }
        _ => false,
    }
}

/// stdout then stderr, at most kubelet's `maxReadLength` (10 KiB) of them.
fn combined_output(out: &ExecOutput) -> String {
    let bytes: Vec<u8> = out
        .stdout
        .iter()
        .chain(&out.stderr)
        .take(MAX_EXEC_OUTPUT)
        .copied()
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// kubelet's exec probe through CRI `ExecSync`: exit 0 succeeds; the output is stdout then
/// stderr; a timeout fails with kubelet's `command "..." timed out`.
pub async fn exec_probe<R: ContainerRuntime>(
    rt: &R,
    container_id: &str,
    command: &[String],
    timeout: Duration,
) -> Outcome {
    match rt.exec_sync(container_id, command.to_vec(), timeout).await {
        Ok(out) => {
            let text = combined_output(&out);
            if out.exit_code == 0 {
                Outcome::Success(text)
            } else {
                Outcome::Failure(text)
            }
        }
        Err(e) if is_exec_timeout(&e) => {
            Outcome::Failure(format!("command {:?} timed out", command.join(" ")))
        }
        Err(e) => Outcome::Error(e.to_string()),
    }
}

/// Runs a handler once against a container whose pod answers at `pod_host`.
pub async fn run_handler<R: ContainerRuntime>(
    rt: &R,
    container_id: &str,
    handler: &Handler,
    timeout: Duration,
    pod_host: &str,
) -> Outcome {
    match handler {
        Handler::Exec { command } => exec_probe(rt, container_id, command, timeout).await,
        Handler::Http {
            scheme,
            host,
            port,
            path,
            headers,
        } => {
            http_probe(
                *scheme,
                host.as_deref().unwrap_or(pod_host),
                *port,
                path,
                headers,
                timeout,
            )
            .await
        }
        Handler::Tcp { host, port } => {
            tcp_probe(host.as_deref().unwrap_or(pod_host), *port, timeout).await
        }
        Handler::Grpc { port, service } => grpc_probe(pod_host, *port, service, timeout).await,
    }
}

/// A liveness or startup failure: the pod worker kills the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kill {
    pub container_id: String,
    pub name: String,
    pub probe: ProbeType,
    /// The probe's `terminationGracePeriodSeconds`, when set.
    pub grace: Option<i64>,
}

#[derive(Debug, Default)]
struct SharedState {
    results: HashMap<(String, ProbeType), ProbeResult>,
    kills: Vec<Kill>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<SharedState>,
    changed: Arc<Notify>,
}

impl Shared {
    fn with<T>(&self, f: impl FnOnce(&mut SharedState) -> T) -> T {
        let mut g = match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut g)
    }

    /// Sets a result; wakes the pod worker when it changed.
    fn set(&self, id: &str, kind: ProbeType, r: ProbeResult) {
        let changed = self.with(|s| s.results.insert((id.to_owned(), kind), r) != Some(r));
        if changed {
            self.changed.notify_one();
        }
    }

    /// Sets a new container's initial result (kubelet's `initialValue`) without waking the
    /// pod worker: it is the value its status already assumes.
    fn init(&self, id: &str, kind: ProbeType) {
        self.with(|s| s.results.insert((id.to_owned(), kind), kind.initial()));
    }

    fn get(&self, id: &str, kind: ProbeType) -> Option<ProbeResult> {
        self.with(|s| s.results.get(&(id.to_owned(), kind)).copied())
    }
}

/// A running container the pod worker wants probed.
#[derive(Clone, Debug)]
pub struct Target {
    pub container_id: String,
    pub container: Container,
    /// When the container started (nanoseconds since the epoch, from the runtime).
    pub started_at: i64,
    /// Where network probes go without a `host`: the pod IP (the node's for host-network
    /// pods, 127.0.0.1 without either).
    pub pod_host: String,
}

/// Whether a container has any probe.
#[must_use]
pub fn has_probes(c: &Container) -> bool {
    c.startup_probe.is_some() || c.liveness_probe.is_some() || c.readiness_probe.is_some()
}

#[derive(Debug)]
struct Probing {
    _tasks: JoinSet<()>,
}

/// One pod's probes (kubelet's probe manager, per pod): a task per probed container instance
/// and probe type, and their results. Dropping it stops every probe.
#[derive(Debug, Default)]
pub struct Prober {
    shared: Arc<Shared>,
    running: HashMap<String, Probing>,
}

/// What the probe tasks of one pod share with their pod worker.
#[derive(Clone, Debug)]
pub struct ProbeContext<R> {
    pub runtime: Arc<R>,
    pub events: Recorder,
    /// The pod's namespace, name and uid (the events' involved object).
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Prober {
    /// Woken whenever a result changed or a container is to be killed.
    #[must_use]
    pub fn notifier(&self) -> Arc<Notify> {
        self.shared.changed.clone()
    }

    /// Probes exactly these containers: starts the probes of new container instances,
    /// stops (and forgets the results of) those no longer running.
    pub fn sync<R: ContainerRuntime>(&mut self, ctx: &ProbeContext<R>, targets: &[Target]) {
        let keep: Vec<&str> = targets.iter().map(|t| t.container_id.as_str()).collect();
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|id| !keep.contains(&id.as_str()))
            .cloned()
            .collect();
        for id in gone {
            self.running.remove(&id);
            self.shared.with(|s| {
                s.results.retain(|(cid, _), _| *cid != id);
                s.kills.retain(|k| k.container_id != id);
            });
        }
        for t in targets {
            if self.running.contains_key(&t.container_id) || !has_probes(&t.container) {
                continue;
            }
            self.running
                .insert(t.container_id.clone(), self.start(ctx, t));
        }
    }

    /// Stops every probe (the pod is being killed or has finished).
    pub fn clear(&mut self) {
        self.running.clear();
        self.shared.with(|s| {
            s.results.clear();
            s.kills.clear();
        });
    }

    fn start<R: ContainerRuntime>(&self, ctx: &ProbeContext<R>, t: &Target) -> Probing {
        let has_startup = t.container.startup_probe.is_some();
        let (started_tx, _) = watch::channel(!has_startup);
        let started_tx = Arc::new(started_tx);
        // How much of the initial delays already passed (a container adopted after an
        // enforcer restart, or seen late): measured on the wall clock, waited on tokio's.
        let since_start = u64::try_from(
            super::status::now_nanos()
                .saturating_sub(t.started_at)
                .max(0),
        )
        .map(Duration::from_nanos)
        .unwrap_or_default();
        let now = Instant::now();
        let mut tasks = JoinSet::new();
        for kind in [
            ProbeType::Startup,
            ProbeType::Liveness,
            ProbeType::Readiness,
        ] {
            let Some(p) = kind.of(&t.container) else {
                continue;
            };
            let spec = ProbeSpec::parse(kind, p, &t.container);
            self.shared.init(&t.container_id, kind);
            let first = now + spec.initial_delay.saturating_sub(since_start);
            let task = ProbeTask {
                kind,
                spec,
                runtime: ctx.runtime.clone(),
                shared: self.shared.clone(),
                events: ctx.events.clone(),
                involved: {
                    let mut i =
                        Involved::pod(&ctx.namespace, &ctx.name, &ctx.uid, Some(&t.container.name));
                    // A sidecar (the only init container with probes) is an init container.
                    if t.container.restart_policy.as_deref() == Some("Always") {
                        i.field_path = format!("spec.initContainers{{{}}}", t.container.name);
                    }
                    i
                },
                container_id: t.container_id.clone(),
                name: t.container.name.clone(),
                pod_host: t.pod_host.clone(),
                started: started_tx.clone(),
            };
            tasks.spawn(task.run(first));
        }
        Probing { _tasks: tasks }
    }

    /// Gives back a kill that could not be done (tried again at the next sync), unless its
    /// container is no longer probed.
    pub fn requeue(&self, k: Kill) {
        if self.running.contains_key(&k.container_id) {
            self.shared.with(|s| s.kills.push(k));
        }
    }

    /// The kills asked since the last call.
    #[must_use]
    pub fn take_kills(&self) -> Vec<Kill> {
        self.shared.with(|s| std::mem::take(&mut s.kills))
    }

    /// kubelet's `started`: a running container without a startup probe has started; with
    /// one, once it succeeded.
    #[must_use]
    pub fn started(&self, container_id: &str, c: &Container) -> bool {
        c.startup_probe.is_none()
            || self.shared.get(container_id, ProbeType::Startup) == Some(ProbeResult::Success)
    }

    /// kubelet's `ready` of a running, started container: without a readiness probe, ready;
    /// with one, once it succeeded.
    #[must_use]
    pub fn ready(&self, container_id: &str, c: &Container) -> bool {
        c.readiness_probe.is_none()
            || self.shared.get(container_id, ProbeType::Readiness) == Some(ProbeResult::Success)
    }
}

/// One probe of one container instance (kubelet's probe worker).
struct ProbeTask<R> {
    kind: ProbeType,
    spec: ProbeSpec,
    runtime: Arc<R>,
    shared: Arc<Shared>,
    events: Recorder,
    involved: Involved,
    container_id: String,
    name: String,
    pod_host: String,
    started: Arc<watch::Sender<bool>>,
}

impl<R: ContainerRuntime> ProbeTask<R> {
    fn event(&self, type_: EventType, reason: &str, message: String) {
        self.events
            .event(self.involved.clone(), type_, reason, message);
    }

    /// One probe with kubelet's retries of prober errors; the result to count, `None` for
    /// an error (thrown away).
    async fn probe(&self) -> Option<ProbeResult> {
        let kind = self.kind.as_str();
        let mut outcome = Outcome::Error(String::new());
        for _ in 0..MAX_PROBE_RETRIES {
            outcome = match &self.spec.handler {
                Ok(h) => {
                    run_handler(
                        &*self.runtime,
                        &self.container_id,
                        h,
                        self.spec.timeout,
                        &self.pod_host,
                    )
                    .await
                }
                Err(e) => Outcome::Error(e.clone()),
            };
            if !matches!(outcome, Outcome::Error(_)) || self.spec.handler.is_err() {
                break;
            }
        }
        match outcome {
            Outcome::Success(_) => Some(ProbeResult::Success),
            Outcome::Warning(out) => {
                self.event(
                    EventType::Warning,
                    "ProbeWarning",
                    format!("{kind} probe warning: {out}"),
                );
                Some(ProbeResult::Success)
            }
            Outcome::Failure(out) => {
                tracing::debug!(uid = %self.involved.uid, container = %self.name, probe = kind, output = %out, "probe failed");
                self.event(
                    EventType::Warning,
                    "Unhealthy",
                    format!("{kind} probe failed: {out}"),
                );
                Some(ProbeResult::Failure)
            }
            Outcome::Error(e) => {
                tracing::warn!(uid = %self.involved.uid, container = %self.name, probe = kind, error = %e, "probe errored");
                self.event(
                    EventType::Warning,
                    "Unhealthy",
                    format!("{kind} probe errored and resulted in unknown state: {e}"),
                );
                None
            }
        }
    }

    /// Probes every period from `first` until a liveness or startup failure (the container
    /// is killed; a new instance gets new tasks) or a startup success.
    async fn run(self, first: Instant) {
        let mut started_rx = self.started.subscribe();
        let mut run = Run::default();
        tokio::time::sleep_until(first).await;
        let mut next = first;
        loop {
            let started = *started_rx.borrow_and_update();
            let gated = match self.kind {
                ProbeType::Startup => {
                    if started {
                        return;
                    }
                    false
                }
                _ => !started,
            };
            if !gated
                && let Some(r) = self.probe().await
                && let Some(set) =
                    run.step(r, self.spec.success_threshold, self.spec.failure_threshold)
            {
                self.shared.set(&self.container_id, self.kind, set);
                match (self.kind, set) {
                    (ProbeType::Startup, ProbeResult::Success) => {
                        self.started.send_replace(true);
                        return;
                    }
                    (ProbeType::Startup | ProbeType::Liveness, ProbeResult::Failure) => {
                        self.shared.with(|s| {
                            s.kills.push(Kill {
                                container_id: self.container_id.clone(),
                                name: self.name.clone(),
                                probe: self.kind,
                                grace: self.spec.termination_grace,
                            });
                        });
                        self.shared.changed.notify_one();
                        // On hold until a new container instance (new tasks).
                        return;
                    }
                    _ => {}
                }
            }
            next += self.spec.period;
            let now = Instant::now();
            if next < now {
                next = now;
            }
            if self.kind == ProbeType::Readiness && gated {
                // kubelet probes readiness as soon as the container has started.
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {}
                    ok = async { started_rx.wait_for(|s| *s).await.is_ok() } => {
                        if !ok {
                            tokio::time::sleep_until(next).await;
                        }
                    }
                }
            } else {
                tokio::time::sleep_until(next).await;
            }
        }
    }
}

/// An in-process `grpc.health.v1.Health` server for tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::{
        convert::Infallible,
        future::Future,
        pin::Pin,
        sync::{
            Arc,
            atomic::{AtomicI32, Ordering},
        },
        task::{Context, Poll},
    };

    use tokio::net::TcpStream;
    use tonic::codegen::http;

    use super::{HEALTH_CHECK_PATH, HealthCheckRequest, HealthCheckResponse};

    /// Answers the status it holds (Unimplemented for any other method, NotFound for the
    /// service `missing`).
    #[derive(Clone)]
    struct Health(Arc<AtomicI32>);

    impl tonic::server::NamedService for Health {
        const NAME: &'static str = "grpc.health.v1.Health";
    }

    struct Check(i32);

    type Answer<T> = Pin<Box<dyn Future<Output = T> + Send>>;

    impl tonic::server::UnaryService<HealthCheckRequest> for Check {
        type Response = HealthCheckResponse;
        type Future = Answer<Result<tonic::Response<Self::Response>, tonic::Status>>;
        fn call(&mut self, req: tonic::Request<HealthCheckRequest>) -> Self::Future {
            let status = self.0;
            Box::pin(async move {
                if req.get_ref().service == "missing" {
                    return Err(tonic::Status::not_found("unknown service"));
                }
                Ok(tonic::Response::new(HealthCheckResponse { status }))
            })
        }
    }

    impl tower::Service<http::Request<tonic::body::Body>> for Health {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = Answer<Result<Self::Response, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            let status = self.0.load(Ordering::SeqCst);
            Box::pin(async move {
                if req.uri().path() == HEALTH_CHECK_PATH {
                    let codec =
                        tonic_prost::ProstCodec::<HealthCheckResponse, HealthCheckRequest>::default(
                        );
                    let mut grpc = tonic::server::Grpc::new(codec);
                    Ok(grpc.unary(Check(status), req).await)
                } else {
                    Ok(tonic::Status::unimplemented("no such method").into_http())
                }
            })
        }
    }

    /// A server on 127.0.0.1 answering `status` (1 SERVING, 2 NOT_SERVING), switchable
    /// through the returned cell; aborting the task stops it.
    pub(crate) async fn grpc_health_server(
        status: i32,
    ) -> (u16, Arc<AtomicI32>, tokio::task::JoinHandle<()>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let cell = Arc::new(AtomicI32::new(status));
        let incoming = futures::stream::unfold(l, |l| async move {
            let r: Result<TcpStream, std::io::Error> = l.accept().await.map(|(s, _)| s);
            Some((r, l))
        });
        let health = Health(cell.clone());
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_incoming(incoming)
                .await;
        });
        (port, cell, task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(yaml: &str) -> Container {
        serde_yaml_ng::from_str(yaml).expect("container")
    }

    #[test]
    fn defaults_and_handlers_as_kubelet() {
        let c = container(
            "{name: c, ports: [{name: web, containerPort: 8080}], env: [{name: F, value: /ok}], livenessProbe: {httpGet: {port: web, path: healthz, httpHeaders: [{name: X-A, value: b}]}}, readinessProbe: {exec: {command: [cat, '$(F)']}, periodSeconds: 3, timeoutSeconds: 2, successThreshold: 2, failureThreshold: 5, initialDelaySeconds: 4}, startupProbe: {tcpSocket: {port: '9000'}, terminationGracePeriodSeconds: 7}}",
        );
        let l = ProbeSpec::parse(
            ProbeType::Liveness,
            c.liveness_probe.as_ref().expect("l"),
            &c,
        );
        assert_eq!(
            l,
            ProbeSpec {
                handler: Ok(Handler::Http {
                    scheme: Scheme::Http,
                    host: None,
                    port: 8080,
                    path: "/healthz".to_owned(),
                    headers: vec![("X-A".to_owned(), "b".to_owned())],
                }),
                initial_delay: Duration::ZERO,
                period: Duration::from_secs(10),
                timeout: Duration::from_secs(1),
                success_threshold: 1,
                failure_threshold: 3,
                termination_grace: None,
            }
        );
        let r = ProbeSpec::parse(
            ProbeType::Readiness,
            c.readiness_probe.as_ref().expect("r"),
            &c,
        );
        assert_eq!(
            r.handler,
            Ok(Handler::Exec {
                command: vec!["cat".to_owned(), "/ok".to_owned()]
            })
        );
        assert_eq!(
            (
                r.period,
                r.timeout,
                r.success_threshold,
                r.failure_threshold,
                r.initial_delay
            ),
            (
                Duration::from_secs(3),
                Duration::from_secs(2),
                2,
                5,
                Duration::from_secs(4)
            )
        );
        let s = ProbeSpec::parse(ProbeType::Startup, c.startup_probe.as_ref().expect("s"), &c);
        assert_eq!(
            s.handler,
            Ok(Handler::Tcp {
                host: None,
                port: 9000
            })
        );
        assert_eq!(s.termination_grace, Some(7));
    }

    #[test]
    fn probes_that_cannot_run_say_why() {
        let c = container(
            "{name: c, livenessProbe: {httpGet: {port: nope}}, readinessProbe: {}, startupProbe: {exec: {command: [true]}, successThreshold: 2}}",
        );
        let l = ProbeSpec::parse(
            ProbeType::Liveness,
            c.liveness_probe.as_ref().expect("l"),
            &c,
        );
        assert_eq!(
            l.handler,
            Err("port \"nope\" not found in container c".to_owned())
        );
        let r = ProbeSpec::parse(
            ProbeType::Readiness,
            c.readiness_probe.as_ref().expect("r"),
            &c,
        );
        assert_eq!(
            r.handler,
            Err("missing probe handler for container c".to_owned())
        );
        let s = ProbeSpec::parse(ProbeType::Startup, c.startup_probe.as_ref().expect("s"), &c);
        assert_eq!(
            s.handler,
            Err("successThreshold must be 1 for startup probes (is 2)".to_owned())
        );
        let bad = container("{name: c, livenessProbe: {tcpSocket: {port: 70000}}}");
        let b = ProbeSpec::parse(
            ProbeType::Liveness,
            bad.liveness_probe.as_ref().expect("b"),
            &bad,
        );
        assert_eq!(b.handler, Err("invalid port number: 70000".to_owned()));
    }

    #[test]
    fn exec_output_is_stdout_then_stderr_capped_at_10_kib() {
        let out = ExecOutput {
            exit_code: 1,
            stdout: b"out ".to_vec(),
            stderr: b"err".to_vec(),
        };
        assert_eq!(combined_output(&out), "out err");
        let big = ExecOutput {
            exit_code: 1,
            stdout: vec![b'x'; 8 * 1024],
            stderr: vec![b'y'; 8 * 1024],
        };
        let text = combined_output(&big);
        assert_eq!(text.len(), MAX_EXEC_OUTPUT);
        assert!(text.starts_with('x') && text.ends_with('y'));
    }

    #[test]
    fn thresholds_count_runs_of_equal_results() {
        let mut run = Run::default();
        let f = ProbeResult::Failure;
        let s = ProbeResult::Success;
        assert_eq!(run.step(f, 1, 3), None);
        assert_eq!(run.step(f, 1, 3), None);
        assert_eq!(run.step(s, 1, 3), Some(s));
        assert_eq!(run.step(f, 1, 3), None);
        assert_eq!(run.step(f, 1, 3), None);
        assert_eq!(run.step(f, 1, 3), Some(f));
        assert_eq!(run.step(f, 1, 3), Some(f));
        let mut run = Run::default();
        assert_eq!(run.step(s, 2, 1), None);
        assert_eq!(run.step(s, 2, 1), Some(s));
        assert_eq!(run.step(f, 2, 1), Some(f));
    }

    #[test]
    fn http_heads_requests_and_redirects() {
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Le"), None);
        assert_eq!(
            parse_head(b"HTTP/1.0 302 Found\r\nLocation: /x\r\n\r\nbody"),
            Some(Ok((
                302,
                vec![("location".to_owned(), "/x".to_owned())],
                36
            )))
        );
        assert!(matches!(parse_head(b"garbage\r\n\r\n"), Some(Err(_))));
        let r =
            request("10.0.0.1:80", "/h", &[("X-Y".to_owned(), "z".to_owned())]).expect("request");
        assert!(
            r.starts_with("GET /h HTTP/1.1\r\nHost: 10.0.0.1:80\r\n"),
            "{r}"
        );
        assert!(
            r.contains(&format!("User-Agent: {}\r\n", user_agent())),
            "{r}"
        );
        assert!(r.contains("Accept: */*\r\nX-Y: z\r\n"), "{r}");
        let r = request(
            "10.0.0.1:80",
            "/",
            &[
                ("host".to_owned(), "example".to_owned()),
                ("User-Agent".to_owned(), "me".to_owned()),
                ("Accept".to_owned(), String::new()),
            ],
        )
        .expect("request");
        assert!(
            r.contains("Host: example\r\n") && r.contains("User-Agent: me\r\n"),
            "{r}"
        );
        assert!(!r.contains("Accept") && !r.contains("kube-probe"), "{r}");
        assert!(
            user_agent().starts_with("kube-probe/1."),
            "{}",
            user_agent()
        );
        // A path never breaks the request line; a header that would is refused, as Go does.
        let r = request("h:1", "/a b\r\nX: y", &[]).expect("request");
        assert!(r.starts_with("GET /a%20b%0D%0AX:%20y HTTP/1.1\r\n"), "{r}");
        assert_eq!(
            request("h:1", "/", &[("X".to_owned(), "a\r\nEvil: 1".to_owned())]),
            Err("net/http: invalid header field value for \"X\"".to_owned())
        );
        assert_eq!(
            request("h:1", "/", &[("Bad Name".to_owned(), "v".to_owned())]),
            Err("net/http: invalid header field name \"Bad Name\"".to_owned())
        );
        assert_eq!(
            redirect_target("/a", Scheme::Http, "h", 8),
            Some((Scheme::Http, "h".to_owned(), 8, "/a".to_owned()))
        );
        assert_eq!(
            redirect_target("http://h:9/b?c", Scheme::Http, "h", 8),
            Some((Scheme::Http, "h".to_owned(), 9, "/b?c".to_owned()))
        );
        assert_eq!(
            redirect_target("http://h", Scheme::Http, "h", 8),
            Some((Scheme::Http, "h".to_owned(), 80, "/".to_owned()))
        );
        assert_eq!(
            redirect_target("http://other:8/", Scheme::Http, "h", 8),
            None
        );
        assert_eq!(
            redirect_target("https://h/", Scheme::Http, "h", 8),
            Some((Scheme::Https, "h".to_owned(), 443, "/".to_owned()))
        );
        assert_eq!(redirect_target("ftp://h/", Scheme::Http, "h", 8), None);
        assert_eq!(join_host_port("::1", 80), "[::1]:80");
    }

    /// A one-shot-per-connection HTTP server answering `code` (with `Location` for 3xx),
    /// and the requests it saw.
    async fn http_server(
        answers: Vec<(u16, &'static str)>,
    ) -> (u16, tokio::task::JoinHandle<Vec<String>>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            for (code, location) in answers {
                let Ok((mut s, _)) = l.accept().await else {
                    break;
                };
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let resp = format!(
                    "HTTP/1.1 {code} X\r\nLocation: {location}\r\nContent-Length: 2\r\n\r\nhi"
                );
                let _ = s.write_all(resp.as_bytes()).await;
            }
            seen
        });
        (port, task)
    }

    #[tokio::test]
    async fn http_probe_codes_redirects_and_refusals() {
        let (port, seen) = http_server(vec![(200, "")]).await;
        let h = [("X-Probe".to_owned(), "1".to_owned())];
        let t = Duration::from_secs(2);
        assert_eq!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/ok", &h, t).await,
            Outcome::Success("hi".to_owned())
        );
        let seen = seen.await.expect("server");
        assert!(seen[0].starts_with("GET /ok HTTP/1.1\r\n"), "{seen:?}");
        assert!(seen[0].contains("X-Probe: 1\r\n"), "{seen:?}");
        assert!(seen[0].contains("User-Agent: kube-probe/1."), "{seen:?}");

        let (port, _) = http_server(vec![(500, "")]).await;
        assert_eq!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Failure("HTTP probe failed with statuscode: 500".to_owned())
        );
        // A redirect to the same host is followed; 400 fails.
        let (port, _) = http_server(vec![(301, "/next"), (204, "")]).await;
        assert_eq!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Success("hi".to_owned())
        );
        let (port, _) = http_server(vec![(302, "http://elsewhere.invalid/")]).await;
        assert_eq!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Warning("Probe terminated redirects, Response body: hi".to_owned())
        );
        let (port, _) = http_server(vec![(400, "")]).await;
        assert!(matches!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Failure(_)
        ));
        // Nothing listening.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let closed = l.local_addr().expect("addr").port();
        drop(l);
        assert_eq!(
            http_probe(Scheme::Http, "127.0.0.1", closed, "/h", &[], t).await,
            Outcome::Failure(format!(
                "Get \"http://127.0.0.1:{closed}/h\": dial tcp 127.0.0.1:{closed}: connect: connection refused"
            ))
        );
        assert_eq!(
            tcp_probe("127.0.0.1", closed, t).await,
            Outcome::Failure(format!(
                "dial tcp 127.0.0.1:{closed}: connect: connection refused"
            ))
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let open = l.local_addr().expect("addr").port();
        assert_eq!(
            tcp_probe("127.0.0.1", open, t).await,
            Outcome::Success(String::new())
        );
        // A server that accepts and never answers: the timeout.
        let silent = tokio::spawn(async move {
            let c = l.accept().await;
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(c);
        });
        let out = http_probe(
            Scheme::Http,
            "127.0.0.1",
            open,
            "/",
            &[],
            Duration::from_millis(300),
        )
        .await;
        assert!(
            matches!(&out, Outcome::Failure(m) if m.contains("Client.Timeout exceeded")),
            "{out:?}"
        );
        silent.abort();
    }

    /// A self-signed certificate (P-256, `CN=probe-test`) and its key for the HTTPS server.
    const TEST_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBgjCCASegAwIBAgIUF8Hxgl1JRTvZvPxGn8C3VVcArM4wCgYIKoZIzj0EAwIw
FTETMBEGA1UEAwwKcHJvYmUtdGVzdDAgFw0yNjEyMDExMjIzNTlaGA8yMTI2MTEw
NzEyMjM1OVowFTETMBEGA1UEAwwKcHJvYmUtdGVzdDBZMBMGByqGSM49AgEGCCqG
SM49AwEHA0IABNBuZHtcPdoIefGNsz4vhCcuIH7crJWa5paIstxSStJB81eABAj+
V/7QjWbO+X3vX/njuN3IVRe2IeSJdUpjVSyjUzBRMB0GA1UdDgQWBBSEj7AjhGOl
iXKDgU7OKbSVBHQshDAfBgNVHSMEGDAWgBSEj7AjhGOliXKDgU7OKbSVBHQshDAP
BgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0kAMEYCIQCLw5NA/g/MJ/u6woIH
rAcnVSNAhy+Ghxcxu/CryE5angIhAPfKt8StjuKapo96N7U64oGpvsIcakCe5sR9
Nr75DKju
-----END CERTIFICATE-----";
    const TEST_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgwwsNHELlpIcuuS2e
AYJbKT4Tf8sp/f8vz37ezZ8X7mahRANCAATQbmR7XD3aCHnxjbM+L4QnLiB+3KyV
muaWiLLcUkrSQfNXgAQI/lf+0I1mzvl971/547jdyFUXtiHkiXVKY1Us
-----END PRIVATE KEY-----";

    /// An HTTPS server (self-signed certificate) answering one request with `code`.
    async fn https_server(code: u16) -> u16 {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
        let cert = CertificateDer::from_pem_slice(TEST_CERT.as_bytes()).expect("cert");
        let key = PrivateKeyDer::from_pem_slice(TEST_KEY.as_bytes()).expect("key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let Ok((s, _)) = l.accept().await else { return };
            let Ok(mut tls) = acceptor.accept(s).await else {
                return;
            };
            let mut buf = vec![0u8; 4096];
            let _ = tls.read(&mut buf).await;
            let resp = format!("HTTP/1.1 {code} X\r\nContent-Length: 6\r\n\r\nsecure");
            let _ = tls.write_all(resp.as_bytes()).await;
            let _ = tls.shutdown().await;
        });
        port
    }

    /// HTTPS probes do not verify the certificate (kubelet's InsecureSkipVerify).
    #[tokio::test]
    async fn https_probe_skips_certificate_verification() {
        let t = Duration::from_secs(2);
        let port = https_server(200).await;
        assert_eq!(
            http_probe(Scheme::Https, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Success("secure".to_owned())
        );
        let port = https_server(503).await;
        assert_eq!(
            http_probe(Scheme::Https, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Failure("HTTP probe failed with statuscode: 503".to_owned())
        );
        // Plain HTTP against a TLS server: a failure, not a hang.
        let port = https_server(200).await;
        assert!(matches!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Failure(_)
        ));
    }

    #[tokio::test]
    async fn grpc_probe_against_an_in_process_health_server() {
        let t = Duration::from_secs(2);
        let (port, _status, serving) = testing::grpc_health_server(1).await;
        assert_eq!(
            grpc_probe("127.0.0.1", port, "", t).await,
            Outcome::Success("service healthy".to_owned())
        );
        let out = grpc_probe("127.0.0.1", port, "missing", t).await;
        assert!(
            matches!(&out, Outcome::Failure(m) if m.starts_with("error: health rpc probe failed:") && m.contains("unknown service")),
            "{out:?}"
        );
        serving.abort();
        let (port, _status, not_serving) = testing::grpc_health_server(2).await;
        assert_eq!(
            grpc_probe("127.0.0.1", port, "svc", t).await,
            Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".to_owned())
        );
        not_serving.abort();
        // An HTTP server that is not gRPC at all, and nothing listening.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let closed = l.local_addr().expect("addr").port();
        drop(l);
        let out = grpc_probe("127.0.0.1", closed, "", t).await;
        assert!(
            matches!(&out, Outcome::Failure(m) if m.starts_with(&format!("error: failed to connect service at \"127.0.0.1:{closed}\""))),
            "{out:?}"
        );
    }
}
