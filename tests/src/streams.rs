//! Clients of the node's secure port for the tests and benchmarks: a TLS connection verified
//! against the node's certificate, and a WebSocket session on kubectl's `v4.channel.k8s.io`
//! (exec, attach, port-forward), written out here rather than taken from a crate.

use std::{path::Path, sync::Arc, time::Duration};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A TLS connection to the node's secure port (the server verified against its CA).
pub async fn tls_connect(
    port: u16,
    server_ca: &Path,
    name: &str,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject as _};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(server_ca).expect("ca") {
        roots.add(c.expect("cert")).expect("add");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(name.to_owned()).expect("name"), tcp)
        .await
        .expect("TLS")
}

/// A WebSocket session on kubectl's `v4.channel.k8s.io` (each binary message: a channel
/// byte, then data).
pub struct Ws {
    io: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    buf: Vec<u8>,
}

impl Ws {
    /// Opens `path` on the node's secure port (`name` its certificate's name), with a bearer
    /// token; `Err` carries the answer when it is not a 101.
    pub async fn open(
        port: u16,
        server_ca: &Path,
        name: &str,
        path: &str,
        token: &str,
    ) -> Result<Self, String> {
        let mut io = tls_connect(port, server_ca, name).await;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {name}\r\nAuthorization: Bearer {token}\r\n\
             Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n"
        );
        io.write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = io.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!("closed: {}", String::from_utf8_lossy(&buf)));
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        if !head.starts_with("HTTP/1.1 101") {
            return Err(head + &String::from_utf8_lossy(&buf[end..]));
        }
        assert!(
            head.to_lowercase()
                .contains("sec-websocket-protocol: v4.channel.k8s.io"),
            "{head}"
        );
        Ok(Self {
            io,
            buf: buf[end..].to_vec(),
        })
    }

    /// Sends `data` on `channel` (a masked binary frame, as a client must).
    pub async fn send(&mut self, channel: u8, data: &[u8]) {
        let mut payload = vec![channel];
        payload.extend_from_slice(data);
        let mask = [0x12u8, 0x34, 0x56, 0x78];
        let mut frame = vec![0x82u8];
        let n = payload.len();
        if n < 126 {
            frame.push(0x80 | u8::try_from(n).expect("len"));
        } else {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&u16::try_from(n).expect("len").to_be_bytes());
        }
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.io.write_all(&frame).await.expect("send");
    }

    /// The next message: `Some((channel, data))`, `None` at close.
    pub async fn recv(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if self.buf.len() >= 2 {
                let op = self.buf[0] & 0x0f;
                let mut len = usize::from(self.buf[1] & 0x7f);
                let mut at = 2;
                if len == 126 && self.buf.len() >= 4 {
                    len = usize::from(u16::from_be_bytes([self.buf[2], self.buf[3]]));
                    at = 4;
                } else if len == 127 && self.buf.len() >= 10 {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&self.buf[2..10]);
                    len = usize::try_from(u64::from_be_bytes(b)).expect("len");
                    at = 10;
                }
                if (len < 126 || at > 2) && self.buf.len() >= at + len {
                    let payload: Vec<u8> = self.buf[at..at + len].to_vec();
                    self.buf.drain(..at + len);
                    match op {
                        0x8 => return None,
                        0x1 | 0x2 if !payload.is_empty() => {
                            return Some((payload[0], payload[1..].to_vec()));
                        }
                        _ => continue,
                    }
                }
            }
            let mut chunk = [0u8; 4096];
            let n = self.io.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Everything received on `channel` until close (or `timeout`).
    pub async fn collect(&mut self, channel: u8, timeout: Duration) -> (String, String) {
        let mut out = Vec::new();
        let mut status = String::new();
        let _ = tokio::time::timeout(timeout, async {
            while let Some((c, d)) = self.recv().await {
                if c == channel {
                    out.extend_from_slice(&d);
                } else if c == 3 {
                    status.push_str(&String::from_utf8_lossy(&d));
                }
            }
        })
        .await;
        (String::from_utf8_lossy(&out).into_owned(), status)
    }
}

/// A streaming load beside the eviction manager, in the same process: a private containerd
/// running a pod that prints ten lines a second (the in-process pod runtime), the secure
/// port (`AlwaysAllow`, anonymous) over it, `follows` clients following the container's log
/// and one exec session printing twenty lines a second, each reading all it gets.
pub struct StreamLoad {
    cd: Option<crate::containerd::Containerd>,
    stop_pods: Option<tokio::sync::oneshot::Sender<()>>,
    pods: Option<tokio::task::JoinHandle<()>>,
    server: Option<enforcer::server::Server>,
    clients: Vec<tokio::task::JoinHandle<()>>,
    /// Bytes the clients received.
    pub received: Arc<std::sync::atomic::AtomicU64>,
    _dir: tempfile::TempDir,
}

impl StreamLoad {
    /// Starts it and waits until every client receives.
    pub async fn start(follows: usize) -> anyhow::Result<Self> {
        use std::sync::atomic::{AtomicU64, Ordering};

        use anyhow::Context as _;
        let cd = crate::containerd::Containerd::start("streams");
        let dir = tempfile::tempdir().context("tempdir")?;
        let status = enforcer::status_manager::StatusManager::default();
        let rt = Arc::new(enforcer::cri::CriRuntime::new(
            &cd.socket,
            Duration::from_secs(10),
        ));
        let opts = crate::pods::opts(&cd);
        std::fs::create_dir_all(crate::pods::manifests(&cd))?;
        crate::pods::write_manifest(
            &cd,
            "ticker.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: ticker, uid: stream-ticker}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:local\n    imagePullPolicy: Never\n    command: [/bin/sh, -c, 'i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.1; done']\n",
        );
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let pods = tokio::spawn({
            let (rt, status) = (rt.clone(), status.clone());
            async move {
                let _ = enforcer::pods::run_pods_with(rt, opts, status, async {
                    let _ = stop_rx.await;
                })
                .await;
            }
        });
        let config = enforcer::config::load(&enforcer::config::ConfigArgs::default())?.config;
        let observer = config.node_observer(
            &enforcer::cgroup::CgroupLayout::default(),
            &config.enforcer.node_capacity,
        );
        let sources = enforcer::server::Sources {
            config,
            capabilities: "{}".to_owned(),
            health: Arc::default(),
            metrics: enforcer::metrics::global().clone(),
            pipeline: Arc::default(),
            link: enforcer::pods::NodeLink::default(),
            status: status.clone(),
            observer,
            runtime: Some(rt.clone()),
        };
        let secure = enforcer::server::secure::SecureOptions {
            cert_files: None,
            cert_dir: dir.path().join("pki"),
            hostname: "stream-node".to_owned(),
            client_ca: None,
            anonymous: true,
            token_webhook: None,
            authz: enforcer::server::secure::AuthzMode::AlwaysAllow,
            node_name: "stream-node".to_owned(),
            kubeconfig: None,
            bootstrap: false,
            addresses: Vec::new(),
        };
        let server =
            enforcer::server::serve_secure("127.0.0.1:0".parse().context("addr")?, sources, secure)
                .await?;
        let port = server.addr.port();
        let ca = dir.path().join("pki").join("kubelet.crt");
        // The pod running.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let name = format!("ticker-{}", crate::pods::NODE);
        loop {
            let (_, file) = status.snapshot();
            if file
                .pods
                .iter()
                .any(|p| p.name == name && p.phase == "Running")
            {
                break;
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the ticker pod is not running within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let received = Arc::new(AtomicU64::new(0));
        let mut clients = Vec::new();
        for _ in 0..follows {
            let (ca, name, received) = (ca.clone(), name.clone(), received.clone());
            clients.push(tokio::spawn(async move {
                let mut io = tls_connect(port, &ca, "stream-node").await;
                let req = format!(
                    "GET /containerLogs/default/{name}/c?follow=true HTTP/1.1\r\nHost: stream-node\r\n\r\n"
                );
                if io.write_all(req.as_bytes()).await.is_err() {
                    return;
                }
                let mut buf = [0u8; 8192];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    received.fetch_add(n as u64, Ordering::Relaxed);
                }
            }));
        }
        let mut ws = Ws::open(
            port,
            &ca,
            "stream-node",
            &format!(
                "/exec/default/{name}/c?command=sh&command=-c&command=while%20true;%20do%20echo%20exec;%20sleep%200.05;%20done&output=1"
            ),
            "",
        )
        .await
        .map_err(|e| anyhow::anyhow!("the exec session: {e}"))?;
        let r = received.clone();
        clients.push(tokio::spawn(async move {
            while let Some((_, d)) = ws.recv().await {
                r.fetch_add(d.len() as u64, Ordering::Relaxed);
            }
        }));
        tokio::time::sleep(Duration::from_secs(1)).await;
        anyhow::ensure!(
            received.load(Ordering::Relaxed) > 0,
            "the stream clients receive nothing"
        );
        Ok(Self {
            cd: Some(cd),
            stop_pods: Some(stop_tx),
            pods: Some(pods),
            server: Some(server),
            clients,
            received,
            _dir: dir,
        })
    }

    /// Ends the clients, the port, the pod runtime; removes the pods and containerd.
    pub async fn stop(mut self) {
        for c in self.clients.drain(..) {
            c.abort();
        }
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
        if let Some(tx) = self.stop_pods.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.pods.take() {
            let _ = t.await;
        }
        if let Some(mut cd) = self.cd.take() {
            cd.remove_all_pods().await;
            cd.teardown();
        }
    }
}
