//! A container's probe as kubelet reads it: the handler (exec, httpGet, tcpSocket, grpc)
//! with its port resolved and command expanded, and the API server's timing defaults.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::core::v1::{Container, Probe},
    apimachinery::pkg::util::intstr::IntOrString,
};

use super::ProbeType;

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

/// Why a probe (or a lifecycle hook run as one) has no handler that can run: the text of
/// its `Error` outcome.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeSpecError {
    #[error("may not specify more than 1 handler type")]
    TwoHandlers,
    #[error("exec probe without a command")]
    NoCommand,
    #[error("unsupported HTTP probe scheme {0:?}")]
    Scheme(String),
    /// A named port the container does not declare (and not a number).
    #[error("port {port:?} not found in container {container}")]
    PortNotFound { port: String, container: String },
    #[error("invalid port number: {0}")]
    InvalidPort(i64),
    #[error("missing probe handler for container {container}")]
    NoHandler { container: String },
    /// A liveness or startup probe whose successThreshold is not 1 (`kind` in lower case).
    #[error("successThreshold must be 1 for {kind} probes (is {threshold})")]
    SuccessThreshold { kind: String, threshold: u32 },
}

/// A probe with kubelet's defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    /// The handler, or why there is none that can run.
    pub handler: Result<Handler, ProbeSpecError>,
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
fn extract_port(port: &IntOrString, c: &Container) -> Result<u16, ProbeSpecError> {
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
                .map_err(|_| ProbeSpecError::PortNotFound {
                    port: name.clone(),
                    container: c.name.clone(),
                })?,
        },
    };
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or(ProbeSpecError::InvalidPort(n))
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

fn handler(p: &Probe, c: &Container) -> Result<Handler, ProbeSpecError> {
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
        return Err(ProbeSpecError::TwoHandlers);
    }
    if let Some(e) = &p.exec {
        let command = expand_static(e.command.as_deref().unwrap_or_default(), c);
        if command.is_empty() {
            return Err(ProbeSpecError::NoCommand);
        }
        return Ok(Handler::Exec { command });
    }
    if let Some(h) = &p.http_get {
        let scheme = match h.scheme.as_deref().unwrap_or("HTTP") {
            "HTTP" | "http" | "" => Scheme::Http,
            "HTTPS" | "https" => Scheme::Https,
            other => return Err(ProbeSpecError::Scheme(other.to_owned())),
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
            .ok_or(ProbeSpecError::InvalidPort(i64::from(g.port)))?;
        return Ok(Handler::Grpc {
            port,
            service: g.service.clone().unwrap_or_default(),
        });
    }
    Err(ProbeSpecError::NoHandler {
        container: c.name.clone(),
    })
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
                Err(ProbeSpecError::SuccessThreshold {
                    kind: kind.as_str().to_lowercase(),
                    threshold: success_threshold,
                })
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
            l.handler.map_err(|e| e.to_string()),
            Err("port \"nope\" not found in container c".to_owned())
        );
        let r = ProbeSpec::parse(
            ProbeType::Readiness,
            c.readiness_probe.as_ref().expect("r"),
            &c,
        );
        assert_eq!(
            r.handler.map_err(|e| e.to_string()),
            Err("missing probe handler for container c".to_owned())
        );
        let s = ProbeSpec::parse(ProbeType::Startup, c.startup_probe.as_ref().expect("s"), &c);
        assert_eq!(
            s.handler.map_err(|e| e.to_string()),
            Err("successThreshold must be 1 for startup probes (is 2)".to_owned())
        );
        let bad = container("{name: c, livenessProbe: {tcpSocket: {port: 70000}}}");
        let b = ProbeSpec::parse(
            ProbeType::Liveness,
            bad.liveness_probe.as_ref().expect("b"),
            &bad,
        );
        assert_eq!(
            b.handler.map_err(|e| e.to_string()),
            Err("invalid port number: 70000".to_owned())
        );
    }
}
