//! A small HTTP endpoint: `/metrics` (Prometheus text), `/healthz`, `/capabilities`.
//! Hand-rolled on tokio to keep the daemon small; it answers GET only.

use std::{net::SocketAddr, sync::Arc};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
};

/// What the server shows; each closure renders one page.
pub struct Pages {
    pub metrics: Box<dyn Fn() -> String + Send + Sync>,
    pub capabilities: String,
}

/// Binds and serves until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    pages: Arc<Pages>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let handle = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            let pages = pages.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let Ok(n) = sock.read(&mut buf).await else {
                    return;
                };
                let req = String::from_utf8_lossy(&buf[..n]);
                let path = req.split_whitespace().nth(1).unwrap_or("/");
                let (status, ctype, body) = match (req.starts_with("GET "), path) {
                    (true, "/metrics") => {
                        ("200 OK", "text/plain; version=0.0.4", (pages.metrics)())
                    }
                    (true, "/healthz") => ("200 OK", "text/plain", "ok\n".to_owned()),
                    (true, "/capabilities") => {
                        ("200 OK", "application/json", pages.capabilities.clone())
                    }
                    (true, _) => ("404 Not Found", "text/plain", "not found\n".to_owned()),
                    (false, _) => (
                        "405 Method Not Allowed",
                        "text/plain",
                        "GET only\n".to_owned(),
                    ),
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    Ok((local, handle))
}
