//! kubelet's HTTP prober (`pkg/probe/http`): a GET with kubelet's request headers
//! (`NewProbeRequest`) over a hyper HTTP/1.1 client connection, TLS without certificate
//! verification for HTTPS, redirects to the same host followed as Go's `http.Client`
//! follows them (kubelet's `followNonLocalRedirects=false`), at most 10 KiB of the body kept
//! for the output, all within the probe's timeout.

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::{
    Request,
    body::Incoming,
    header::{self, HeaderMap, HeaderName, HeaderValue},
};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    task::JoinHandle,
    time::{Duration, Instant},
};

use super::{
    Outcome, Scheme, dial_error, error_chain, join_host_port,
    tls::{TlsError, tls_config},
    user_agent,
};

/// Why an HTTP probe got no answer, in Go's words (the probe's failure is
/// `Get "<url>": <this>`; a body that cannot be read is a prober error).
#[derive(Debug, thiserror::Error)]
enum HttpProbeError {
    #[error("net/http: invalid header field name {0:?}")]
    HeaderName(String),
    #[error("net/http: invalid header field value for {0:?}")]
    HeaderValue(String),
    #[error("net/http: invalid User-Agent: {0}")]
    UserAgent(#[source] header::InvalidHeaderValue),
    #[error("parse {path:?}: {source}")]
    Path {
        path: String,
        source: hyper::http::uri::InvalidUri,
    },
    #[error("http: invalid Host header {authority:?}: {source}")]
    Host {
        authority: String,
        source: header::InvalidHeaderValue,
    },
    /// Go's wording of the dial error.
    #[error("{0}")]
    Dial(String),
    #[error("invalid server name {host:?}: {source}")]
    ServerName {
        host: String,
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("{0}")]
    Tls(#[from] TlsError),
    #[error("tls: {0}")]
    Handshake(#[source] std::io::Error),
    /// The exchange or the body's read failed: the error and its sources, as Go prints them.
    #[error("{}", error_chain(.0))]
    Http(hyper::Error),
    #[error("stopped after {} redirects", MAX_REDIRECTS)]
    Redirects,
}

/// kubelet's `maxRespBodyLength` for HTTP probes.
const MAX_BODY: usize = 10 * 1024;
/// Go's `http.Client` follows at most this many redirects.
const MAX_REDIRECTS: usize = 10;

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

/// kubelet's probe request headers (`newProbeRequest`) from the probe's `httpHeaders`:
/// `User-Agent: kube-probe/<major.minor>` and `Accept: */*` unless given (an empty `Accept`
/// removes it), and the `Host` override apart (Go's `req.Host`: the first `Host` header,
/// unless empty). Go writes only the first `User-Agent`, and none when it is empty. A header
/// Go would refuse is refused with its words.
fn probe_headers(
    given: &[(String, String)],
) -> Result<(HeaderMap, Option<HeaderValue>), HttpProbeError> {
    let mut headers = HeaderMap::new();
    for (k, v) in given {
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| HttpProbeError::HeaderName(k.clone()))?;
        let value = HeaderValue::from_bytes(v.as_bytes())
            .map_err(|_| HttpProbeError::HeaderValue(k.clone()))?;
        headers.append(name, value);
    }
    let host = headers.remove(header::HOST).filter(|h| !h.is_empty());
    match headers.remove(header::USER_AGENT) {
        None => {
            let ua = HeaderValue::from_str(&user_agent()).map_err(HttpProbeError::UserAgent)?;
            headers.insert(header::USER_AGENT, ua);
        }
        Some(ua) if !ua.is_empty() => {
            headers.insert(header::USER_AGENT, ua);
        }
        Some(_) => {}
    }
    match headers.get(header::ACCEPT) {
        None => {
            headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        }
        Some(a) if a.is_empty() => {
            headers.remove(header::ACCEPT);
        }
        Some(_) => {}
    }
    Ok((headers, host))
}

/// The GET of `path` as sent: `Host` (the override or `host:port`), the probe headers and
/// `Connection: close` (kubelet's transport disables keep-alives).
fn request(
    authority: &str,
    host: Option<&HeaderValue>,
    path: &str,
    headers: &HeaderMap,
) -> Result<Request<Empty<Bytes>>, HttpProbeError> {
    let mut req = Request::new(Empty::new());
    *req.uri_mut() = escape_path(path)
        .parse()
        .map_err(|source| HttpProbeError::Path {
            path: path.to_owned(),
            source,
        })?;
    let host = match host {
        Some(h) => h.clone(),
        None => HeaderValue::from_str(authority).map_err(|source| HttpProbeError::Host {
            authority: authority.to_owned(),
            source,
        })?,
    };
    let h = req.headers_mut();
    h.insert(header::HOST, host);
    for (name, value) in headers {
        h.append(name, value.clone());
    }
    if !h
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
    {
        h.append(header::CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(req)
}

/// Aborts the task driving a connection when the exchange ends (or times out).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A response head, its body still to read, and the connection it comes on.
struct Answer {
    code: u16,
    location: Option<String>,
    body: Incoming,
    _connection: AbortOnDrop,
}

/// One GET over a new connection (TLS for HTTPS).
async fn get_once(
    scheme: Scheme,
    host: &str,
    port: u16,
    req: Request<Empty<Bytes>>,
) -> Result<Answer, HttpProbeError> {
    let addr = join_host_port(host, port);
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| HttpProbeError::Dial(dial_error(&addr, &e)))?;
    match scheme {
        Scheme::Http => exchange(tcp, req).await,
        Scheme::Https => {
            let name =
                rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|source| {
                    HttpProbeError::ServerName {
                        host: host.to_owned(),
                        source,
                    }
                })?;
            let tls = tokio_rustls::TlsConnector::from(tls_config()?)
                .connect(name, tcp)
                .await
                .map_err(HttpProbeError::Handshake)?;
            exchange(tls, req).await
        }
    }
}

/// Sends the request over an HTTP/1.1 client connection (header names in Go's canonical
/// case) and waits for the response head.
async fn exchange<S>(io: S, req: Request<Empty<Bytes>>) -> Result<Answer, HttpProbeError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(TokioIo::new(io))
        .await
        .map_err(HttpProbeError::Http)?;
    let connection = AbortOnDrop(tokio::spawn(async move {
        // Its error, if any, is the pending request's.
        let _ = connection.await;
    }));
    let resp = sender
        .send_request(req)
        .await
        .map_err(HttpProbeError::Http)?;
    Ok(Answer {
        code: resp.status().as_u16(),
        location: resp
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body: resp.into_body(),
        _connection: connection,
    })
}

/// kubelet's `ReadAtMost`: up to [`MAX_BODY`] of the body (the rest is not read).
async fn read_body(mut body: Incoming) -> Result<String, HttpProbeError> {
    let mut buf = Vec::new();
    while buf.len() < MAX_BODY {
        match body.frame().await {
            None => break,
            Some(Err(e)) => return Err(HttpProbeError::Http(e)),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
    buf.truncate(MAX_BODY);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The codes Go's `http.Client` follows.
fn is_redirect(code: u16) -> bool {
    matches!(code, 301 | 302 | 303 | 307 | 308)
}

/// The next request of a followed redirect.
#[derive(Debug, PartialEq, Eq)]
struct Hop {
    scheme: Scheme,
    port: u16,
    path: String,
    /// An absolute `Location` (Go then sends the URL's host, not the `Host` override).
    absolute: bool,
}

/// Whether `s` starts with a URL scheme (`[a-zA-Z][a-zA-Z0-9+.-]*:`).
fn has_scheme(s: &str) -> bool {
    let Some((scheme, _)) = s.split_once(':') else {
        return false;
    };
    scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
}

/// Where a redirect from `scheme://host:port/path` leads (Go's `URL.Parse(location)`),
/// `None` for another host (not followed, as kubelet's `followNonLocalRedirects=false`) or
/// a scheme other than HTTP(S).
fn redirect_target(
    location: &str,
    scheme: Scheme,
    host: &str,
    port: u16,
    path: &str,
) -> Option<Hop> {
    let location = location.split_once('#').map_or(location, |(l, _)| l);
    let lower = location.to_ascii_lowercase();
    let (next, rest) = if lower.starts_with("http://") {
        (Scheme::Http, &location[7..])
    } else if lower.starts_with("https://") {
        (Scheme::Https, &location[8..])
    } else if let Some(rest) = location.strip_prefix("//") {
        (scheme, rest)
    } else if has_scheme(location) {
        return None;
    } else {
        // A reference relative to the request's URL.
        let (base, _) = path.split_once('?').unwrap_or((path, ""));
        let path = if location.starts_with('/') {
            location.to_owned()
        } else if location.is_empty() {
            path.to_owned()
        } else if location.starts_with('?') {
            format!("{base}{location}")
        } else {
            let dir = base.rfind('/').map_or("/", |i| &base[..=i]);
            format!("{dir}{location}")
        };
        return Some(Hop {
            scheme,
            port,
            path,
            absolute: false,
        });
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest[i..].starts_with('?') => (&rest[..i], format!("/{}", &rest[i..])),
        Some(i) => (&rest[..i], rest[i..].to_owned()),
        None => (rest, "/".to_owned()),
    };
    let (h, p) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            (h.trim_matches(['[', ']']), p.parse().ok()?)
        }
        _ => (authority.trim_matches(['[', ']']), next.default_port()),
    };
    (h == host).then_some(Hop {
        scheme: next,
        port: p,
        path,
        absolute: true,
    })
}

fn url(scheme: Scheme, host: &str, port: u16, path: &str) -> String {
    format!("{}://{}{path}", scheme.as_str(), join_host_port(host, port))
}

/// kubelet's HTTP(S) probe (`DoHTTPProbe`): 200..399 succeeds; redirects to the same host
/// are followed (at most 10), one to another host ends the probe with a warning (a
/// success); the output is at most 10 KiB of the body; a body that cannot be read is a
/// prober error. HTTPS does not verify the server's certificate, as kubelet.
pub async fn http_probe(
    scheme: Scheme,
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Outcome {
    let deadline = Instant::now() + timeout;
    // The URL errors name: the request's, after redirects.
    let mut current = url(scheme, host, port, path);
    let run = async {
        let (mut headers, mut host_override) = probe_headers(headers)?;
        let explicit_referer = headers.contains_key(header::REFERER);
        let (mut sc, mut p, mut path) = (scheme, port, path.to_owned());
        let mut redirects = 0;
        loop {
            let req = request(
                &join_host_port(host, p),
                host_override.as_ref(),
                &path,
                &headers,
            )?;
            let answer = get_once(sc, host, p, req).await?;
            let hop = match &answer.location {
                Some(loc) if is_redirect(answer.code) => {
                    redirect_target(loc, sc, host, p, &path).map(|hop| (loc, hop))
                }
                _ => None,
            };
            let Some((loc, hop)) = hop else {
                return Ok(answer);
            };
            if redirects >= MAX_REDIRECTS {
                current = loc.clone();
                return Err(HttpProbeError::Redirects);
            }
            redirects += 1;
            // Go's `Referer` of a redirect: the previous URL, none from HTTPS to HTTP.
            if !explicit_referer {
                headers.remove(header::REFERER);
                if !(sc == Scheme::Https && hop.scheme == Scheme::Http)
                    && let Ok(r) = HeaderValue::from_str(&current)
                {
                    headers.insert(header::REFERER, r);
                }
            }
            if hop.absolute {
                host_override = None;
            }
            (sc, p, path) = (hop.scheme, hop.port, hop.path);
            current = url(sc, host, p, &path);
        }
    };
    let head = tokio::time::timeout_at(deadline, run).await;
    let answer = match head {
        Err(_) => {
            return Outcome::Failure(format!(
                "Get {current:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            ));
        }
        Ok(Err(e)) => return Outcome::Failure(format!("Get {current:?}: {e}")),
        Ok(Ok(answer)) => answer,
    };
    let code = answer.code;
    let body = match tokio::time::timeout_at(deadline, read_body(answer.body)).await {
        Err(_) => {
            return Outcome::Error(
                "context deadline exceeded (Client.Timeout or context cancellation while reading body)"
                    .to_owned(),
            );
        }
        Ok(Err(e)) => return Outcome::Error(e.to_string()),
        Ok(Ok(body)) => body,
    };
    match code {
        200..300 => Outcome::Success(body),
        300..400 => Outcome::Warning(format!("Probe terminated redirects, Response body: {body}")),
        _ => Outcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    fn wire(req: &Request<Empty<Bytes>>) -> Vec<(String, String)> {
        req.headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect()
    }

    fn pairs(h: &[(&str, &str)]) -> Vec<(String, String)> {
        h.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn requests_carry_kubelets_headers() {
        let (h, host) = probe_headers(&pairs(&[("X-Y", "z")])).expect("headers");
        let r = request("10.0.0.1:80", host.as_ref(), "/h", &h).expect("request");
        assert_eq!(r.uri(), "/h");
        assert_eq!(
            wire(&r),
            pairs(&[
                ("host", "10.0.0.1:80"),
                ("x-y", "z"),
                ("user-agent", &user_agent()),
                ("accept", "*/*"),
                ("connection", "close"),
            ])
        );
        // The Host override, a given User-Agent, an empty Accept (removed).
        let (h, host) = probe_headers(&pairs(&[
            ("host", "example"),
            ("User-Agent", "me"),
            ("Accept", ""),
        ]))
        .expect("headers");
        let r = request("10.0.0.1:80", host.as_ref(), "/", &h).expect("request");
        assert_eq!(
            wire(&r),
            pairs(&[
                ("host", "example"),
                ("user-agent", "me"),
                ("connection", "close"),
            ])
        );
        // An empty Host is no override; an empty User-Agent sends none.
        let (h, host) =
            probe_headers(&pairs(&[("Host", ""), ("User-Agent", "")])).expect("headers");
        let r = request("h:1", host.as_ref(), "/", &h).expect("request");
        assert_eq!(
            wire(&r),
            pairs(&[("host", "h:1"), ("accept", "*/*"), ("connection", "close")])
        );
        assert!(
            user_agent().starts_with("kube-probe/1."),
            "{}",
            user_agent()
        );
        // A path never breaks the request line; a header that would is refused, as Go does.
        let r = request("h:1", None, "/a b\r\nX: y", &HeaderMap::new()).expect("request");
        assert_eq!(r.uri(), "/a%20b%0D%0AX:%20y");
        assert_eq!(
            probe_headers(&pairs(&[("X", "a\r\nEvil: 1")]))
                .err()
                .map(|e| e.to_string()),
            Some("net/http: invalid header field value for \"X\"".to_owned())
        );
        assert_eq!(
            probe_headers(&pairs(&[("Bad Name", "v")]))
                .err()
                .map(|e| e.to_string()),
            Some("net/http: invalid header field name \"Bad Name\"".to_owned())
        );
    }

    #[test]
    fn redirects_resolve_as_go_does() {
        let hop = |scheme, port, path: &str, absolute| {
            Some(Hop {
                scheme,
                port,
                path: path.to_owned(),
                absolute,
            })
        };
        let http = Scheme::Http;
        assert_eq!(
            redirect_target("/a", http, "h", 8, "/x"),
            hop(http, 8, "/a", false)
        );
        assert_eq!(
            redirect_target("b?c", http, "h", 8, "/x/y?q"),
            hop(http, 8, "/x/b?c", false)
        );
        assert_eq!(
            redirect_target("?c", http, "h", 8, "/x/y?q"),
            hop(http, 8, "/x/y?c", false)
        );
        assert_eq!(
            redirect_target("http://h:9/b?c#f", http, "h", 8, "/"),
            hop(http, 9, "/b?c", true)
        );
        assert_eq!(
            redirect_target("HTTP://h", http, "h", 8, "/"),
            hop(http, 80, "/", true)
        );
        assert_eq!(
            redirect_target("//h:7?x", http, "h", 8, "/"),
            hop(http, 7, "/?x", true)
        );
        assert_eq!(redirect_target("http://other:8/", http, "h", 8, "/"), None);
        assert_eq!(
            redirect_target("https://h/", http, "h", 8, "/"),
            hop(Scheme::Https, 443, "/", true)
        );
        assert_eq!(
            redirect_target("http://[::1]:5/", http, "::1", 8, "/"),
            hop(http, 5, "/", true)
        );
        assert_eq!(redirect_target("ftp://h/", http, "h", 8, "/"), None);
        assert_eq!(join_host_port("::1", 80), "[::1]:80");
    }

    /// A one-request-per-connection HTTP server answering each `(code, location)` in turn
    /// (with `Location` for 3xx), and the requests it saw.
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

    /// A server answering one request with `response` as written.
    async fn raw_server(response: Vec<u8>) -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(&response).await;
            let _ = s.shutdown().await;
        });
        port
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
        assert!(seen[0].contains("Accept: */*\r\n"), "{seen:?}");
        assert!(
            seen[0].contains(&format!("Host: 127.0.0.1:{port}\r\n")),
            "{seen:?}"
        );

        let (port, _) = http_server(vec![(500, "")]).await;
        assert_eq!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Failure("HTTP probe failed with statuscode: 500".to_owned())
        );
        // A redirect to the same host is followed (the headers and the Host override
        // kept for a relative one, the Referer set); 400 fails.
        let (port, seen) = http_server(vec![(301, "/next"), (204, "")]).await;
        let h = [
            ("X-Probe".to_owned(), "1".to_owned()),
            ("Host".to_owned(), "svc".to_owned()),
        ];
        // (A 204 has no body, whatever the server writes after its head, as in Go.)
        assert_eq!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/", &h, t).await,
            Outcome::Success(String::new())
        );
        let seen = seen.await.expect("server");
        assert!(seen[1].starts_with("GET /next HTTP/1.1\r\n"), "{seen:?}");
        assert!(
            seen[1].contains("Host: svc\r\n") && seen[1].contains("X-Probe: 1\r\n"),
            "{seen:?}"
        );
        assert!(
            seen[1].contains(&format!("Referer: http://127.0.0.1:{port}/\r\n")),
            "{seen:?}"
        );
        let (port, _) = http_server(vec![(302, "http://elsewhere.invalid/")]).await;
        assert_eq!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Warning("Probe terminated redirects, Response body: hi".to_owned())
        );
        // A 3xx Go does not follow is a warning too.
        let (port, _) = http_server(vec![(300, "/x")]).await;
        assert_eq!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Warning("Probe terminated redirects, Response body: hi".to_owned())
        );
        // At most 10 redirects.
        let (port, _) = http_server(vec![(302, "/loop"); 11]).await;
        assert_eq!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Failure("Get \"/loop\": stopped after 10 redirects".to_owned())
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
            super::super::tcp_probe("127.0.0.1", closed, t).await,
            Outcome::Failure(format!(
                "dial tcp 127.0.0.1:{closed}: connect: connection refused"
            ))
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let open = l.local_addr().expect("addr").port();
        assert_eq!(
            super::super::tcp_probe("127.0.0.1", open, t).await,
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

    /// A chunked body is decoded; the output keeps 10 KiB of a longer one; a body cut short
    /// is a prober error (kubelet's body read error).
    #[tokio::test]
    async fn http_probe_reads_chunked_bodies_up_to_10_kib() {
        let t = Duration::from_secs(2);
        let port = raw_server(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
                .to_vec(),
        )
        .await;
        assert_eq!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Success("hello world".to_owned())
        );
        let mut big = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..3 {
            big.extend_from_slice(b"1000\r\n");
            big.extend_from_slice(&[b'x'; 0x1000]);
            big.extend_from_slice(b"\r\n");
        }
        big.extend_from_slice(b"0\r\n\r\n");
        let port = raw_server(big).await;
        assert_eq!(
            http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await,
            Outcome::Success("x".repeat(MAX_BODY))
        );
        let port = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort".to_vec()).await;
        let out = http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await;
        assert!(matches!(&out, Outcome::Error(_)), "{out:?}");
        // Not HTTP at all: a failure.
        let port = raw_server(b"garbage\r\n\r\n".to_vec()).await;
        let out = http_probe(Scheme::Http, "127.0.0.1", port, "/", &[], t).await;
        assert!(
            matches!(&out, Outcome::Failure(m) if m.starts_with(&format!("Get \"http://127.0.0.1:{port}/\": "))),
            "{out:?}"
        );
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
}
