//! A small read-only HTTP endpoint: `/metrics` (Prometheus text), `/healthz`, `/capabilities`.
//!
//! Hardened so that nothing on this port can blind the eviction manager: at most
//! [`MAX_CONNECTIONS`] connections are open at once (the rest wait in the kernel's listen
//! backlog and hold no descriptor of ours), a connection that sends no complete request
//! within [`REQUEST_TIMEOUT`] is closed, accept errors (such as running out of descriptors)
//! back off instead of spinning, and requests are read until their header ends (split across
//! TCP writes is fine), with query strings ignored and `HEAD` answered.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

use crate::health::Health;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Time a connection has to deliver its request header, and to take the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request header read.
const MAX_REQUEST: usize = 8 * 1024;

/// What the server shows; each closure renders one page.
pub struct Pages {
    pub metrics: Box<dyn Fn() -> String + Send + Sync>,
    pub capabilities: String,
    pub health: Arc<Health>,
}

/// Binds and serves until the returned task is aborted (the daemon aborts it when it stops;
/// dropping the handle alone does not stop it).
pub async fn serve(
    addr: SocketAddr,
    pages: Arc<Pages>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let handle = tokio::spawn(accept_loop(listener, pages));
    Ok((local, handle))
}

async fn accept_loop(listener: TcpListener, pages: Arc<Pages>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = Duration::ZERO;
    loop {
        // A slot first: beyond the cap, connections wait in the backlog, not in our table.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((sock, _)) => {
                backoff = Duration::ZERO;
                let pages = pages.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT * 2, handle(sock, &pages)).await;
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
}

/// The request line's method and path (query string dropped), once the header is complete.
#[must_use]
pub fn parse_request(head: &[u8]) -> Option<(&str, &str)> {
    let text = std::str::from_utf8(head).ok()?;
    let line = text.lines().next()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?;
    let target = parts.next()?;
    let path = target.split(['?', '#']).next().unwrap_or("/");
    Some((method, path))
}

fn header_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

async fn handle(mut sock: TcpStream, pages: &Pages) {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head = loop {
        if let Some(end) = header_end(&buf) {
            break &buf[..end];
        }
        if buf.len() >= MAX_REQUEST {
            let _ = respond(
                &mut sock,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request header too large\n",
                true,
            )
            .await;
            return;
        }
        match tokio::time::timeout(REQUEST_TIMEOUT, sock.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return,
        }
    };
    let Some((method, path)) = parse_request(head) else {
        let _ = respond(
            &mut sock,
            "400 Bad Request",
            "text/plain",
            "bad request\n",
            true,
        )
        .await;
        return;
    };
    let with_body = method != "HEAD";
    if method != "GET" && method != "HEAD" {
        let _ = respond(
            &mut sock,
            "405 Method Not Allowed",
            "text/plain",
            "GET or HEAD only\n",
            true,
        )
        .await;
        return;
    }
    let (status, ctype, body) = match path {
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", (pages.metrics)()),
        "/healthz" => {
            let failures = pages.health.failures();
            if failures.is_empty() {
                ("200 OK", "text/plain", "ok\n".to_owned())
            } else {
                let mut body = String::new();
                for f in failures {
                    body.push_str("failed: ");
                    body.push_str(&f);
                    body.push('\n');
                }
                ("503 Service Unavailable", "text/plain", body)
            }
        }
        "/capabilities" => ("200 OK", "application/json", pages.capabilities.clone()),
        _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
    };
    let _ = respond(&mut sock, status, ctype, &body, with_body).await;
}

async fn respond(
    sock: &mut TcpStream,
    status: &str,
    ctype: &str,
    body: &str,
    with_body: bool,
) -> std::io::Result<()> {
    let mut resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if with_body {
        resp.push_str(body);
    }
    tokio::time::timeout(REQUEST_TIMEOUT, sock.write_all(resp.as_bytes()))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let _ = sock.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        for (head, want) in [
            (
                &b"GET /metrics HTTP/1.1\r\n\r\n"[..],
                Some(("GET", "/metrics")),
            ),
            (
                b"GET /healthz?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n",
                Some(("GET", "/healthz")),
            ),
            (
                b"HEAD /healthz HTTP/1.0\r\n\r\n",
                Some(("HEAD", "/healthz")),
            ),
            (b"GET\r\n\r\n", None),
            (b"\xff\xfe /x HTTP/1.1\r\n\r\n", None),
        ] {
            assert_eq!(
                parse_request(head),
                want,
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
        assert_eq!(header_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(header_end(b"GET / HTTP/1.1\r\n"), None);
    }

    async fn get(addr: SocketAddr, parts: &[&[u8]]) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        for p in parts {
            s.write_all(p).await.expect("write");
            s.flush().await.expect("flush");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn split_requests_head_and_health_failures() {
        let health = Arc::new(Health::default());
        let pages = Arc::new(Pages {
            metrics: Box::new(|| "m 1\n".to_owned()),
            capabilities: "{}".to_owned(),
            health: health.clone(),
        });
        let (addr, task) = serve("127.0.0.1:0".parse().expect("addr"), pages)
            .await
            .expect("serve");
        let split = get(addr, &[b"GET /metr", b"ics?x=1 HTTP/1.1\r\n", b"\r\n"]).await;
        assert!(
            split.starts_with("HTTP/1.1 200 OK") && split.ends_with("m 1\n"),
            "{split}"
        );
        let head = get(addr, &[b"HEAD /healthz HTTP/1.1\r\n\r\n"]).await;
        assert!(
            head.starts_with("HTTP/1.1 200 OK") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        health.set_runtime(false);
        let failed = get(addr, &[b"GET /healthz HTTP/1.1\r\n\r\n"]).await;
        assert!(
            failed.starts_with("HTTP/1.1 503") && failed.contains("failed: runtime"),
            "{failed}"
        );
        let post = get(addr, &[b"POST /healthz HTTP/1.1\r\n\r\n"]).await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        task.abort();
    }
}
