//! kubelet's TCP prober (`pkg/probe/tcp`).

use std::time::Duration;

use tokio::net::TcpStream;

use super::{Outcome, dial_error, join_host_port};

/// kubelet's TCP probe: a connection within the timeout.
pub async fn tcp_probe(host: &str, port: u16, timeout: Duration) -> Outcome {
    let addr = join_host_port(host, port);
    match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => Outcome::Success(String::new()),
        Ok(Err(e)) => Outcome::Failure(dial_error(&addr, &e)),
        Err(_) => Outcome::Failure(format!("dial tcp {addr}: i/o timeout")),
    }
}
