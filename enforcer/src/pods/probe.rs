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

mod exec;
mod grpc;
mod http;
mod runner;
mod spec;
mod tcp;
mod tls;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};

use crate::cri::ContainerRuntime;

pub use crate::cri::ExecOutput;
pub use exec::exec_probe;
pub use grpc::grpc_probe;
#[cfg(test)]
pub(crate) use grpc::testing;
pub use http::http_probe;
pub use runner::{Kill, ProbeContext, Prober, Run, Target, has_probes};
pub use spec::{Handler, ProbeSpec, ProbeSpecError, Scheme};
pub use tcp::tcp_probe;

/// The User-Agent of HTTP and gRPC probes (`kube-probe/<major>.<minor>`, from the kubelet
/// version the node reports).
#[must_use]
pub fn user_agent() -> String {
    let v = crate::node::kubelet_version();
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

/// An error and its sources, `: `-separated (as Go prints a wrapped error).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut m = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        m = format!("{m}: {s}");
        source = s.source();
    }
    m
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
