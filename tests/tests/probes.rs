//! Black-box probe tests: startup, liveness and readiness probes (exec, httpGet, tcpSocket)
//! run by the enforcer's pod workers against real containers on a private containerd, with
//! kubelet's outcomes: restarts after liveness failures (restart count, last state, the
//! `Killing` and `Unhealthy` events), the container `ready` and the pod's `Ready` condition
//! following readiness, startup gating. Needs root, containerd, runc and busybox-static (whose
//! `httpd` serves the HTTP probes); fails loudly without them. The pods use the host network
//! (the enforcer in this process reaches them at the node's IP); the gRPC probe is tested
//! against an in-process tonic health server in the enforcer's unit tests (busybox has no
//! gRPC server).

use std::time::Duration;

use enforcer::{
    recorder::EventType,
    status_manager::{ContainerState, PodRecord, StatusFile},
};
use enforcer_tests::{
    containerd::Containerd,
    pods::{Enforcer, finish, pod, read_status, wait_status, write_manifest},
};

fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn manifest(name: &str, uid: &str, containers: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  uid: {uid}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n{containers}"
    )
}

fn container<'a>(
    s: &'a StatusFile,
    uid: &str,
    name: &str,
) -> Option<&'a enforcer::status_manager::ContainerRecord> {
    pod(s, uid).and_then(|p| p.container_statuses.iter().find(|c| c.name == name))
}

fn condition(p: &PodRecord, kind: &str) -> String {
    p.conditions
        .iter()
        .find(|c| c.kind == kind)
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

fn running(s: &StatusFile, uid: &str, name: &str) -> bool {
    container(s, uid, name).is_some_and(|c| matches!(c.state, ContainerState::Running { .. }))
}

/// An exec liveness probe that starts failing kills the container (kubelet's `Killing`
/// message, `Unhealthy` events with the command's output) and the restart policy restarts
/// it: the restart count rises, the last state is the killed instance. An exec readiness
/// probe holds the pod's `Ready` condition at False until it succeeds, then True, then False
/// again when it fails, without any restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_liveness_restarts_and_exec_readiness_drives_the_ready_condition() {
    let cd = Containerd::start("probe-exec");
    let mut e = Enforcer::start(&cd);
    // Healthy for 3 s, then the liveness file goes away (each new instance starts healthy).
    write_manifest(
        &cd,
        "live.yaml",
        &manifest(
            "live",
            "live-1",
            "  - name: c\n    image: busybox:local\n    command: [sh, -c, 'touch /tmp/healthy; sleep 3; rm /tmp/healthy; echo gone >&2; sleep 3600']\n    livenessProbe: {exec: {command: [sh, -c, 'cat /tmp/healthy || { echo no-health-file; exit 1; }']}, periodSeconds: 1, failureThreshold: 2, terminationGracePeriodSeconds: 1}\n",
        ),
    );
    // Not ready until /tmp/ready exists (after 3 s); unready again once it is removed.
    write_manifest(
        &cd,
        "ready.yaml",
        &manifest(
            "ready",
            "ready-1",
            "  - name: r\n    image: busybox:local\n    command: [sh, -c, 'sleep 3; touch /tmp/ready; sleep 4; rm /tmp/ready; sleep 3600']\n    readinessProbe: {exec: {command: [cat, /tmp/ready]}, periodSeconds: 1, failureThreshold: 1}\n",
        ),
    );
    // An exec probe past its timeoutSeconds: killed by the runtime, a failure with
    // kubelet's message.
    write_manifest(
        &cd,
        "slow.yaml",
        &manifest(
            "slow",
            "slow-1",
            "  - name: s\n    image: busybox:local\n    command: [sleep, '3600']\n    readinessProbe: {exec: {command: [sleep, '5']}, timeoutSeconds: 1, periodSeconds: 2}\n",
        ),
    );
    // Readiness: running but not ready, Ready=False...
    let s = wait_status(&cd, Duration::from_secs(30), "running, unready pod", |s| {
        running(s, "ready-1", "r")
    })
    .await;
    let p = pod(&s, "ready-1").expect("ready pod");
    assert_eq!(condition(p, "Ready"), "False", "{p:?}");
    assert_eq!(condition(p, "ContainersReady"), "False", "{p:?}");
    assert!(!p.container_statuses[0].ready, "{p:?}");
    assert_eq!(p.container_statuses[0].started, Some(true), "{p:?}");
    // ... then True once the probe succeeds ...
    wait_status(&cd, Duration::from_secs(15), "Ready=True", |s| {
        pod(s, "ready-1")
            .is_some_and(|p| condition(p, "Ready") == "True" && p.container_statuses[0].ready)
    })
    .await;
    // ... and False again when it fails, the container never restarted.
    let s = wait_status(&cd, Duration::from_secs(15), "Ready=False again", |s| {
        pod(s, "ready-1").is_some_and(|p| condition(p, "Ready") == "False")
    })
    .await;
    let r = container(&s, "ready-1", "r").expect("r");
    assert_eq!(r.restart_count, 0, "{r:?}");
    assert!(matches!(r.state, ContainerState::Running { .. }), "{r:?}");
    let ev = e.events_of("ready", "r");
    assert!(
        ev.iter().any(|(t, reason, m)| *t == EventType::Warning
            && reason == "Unhealthy"
            && m.starts_with("Readiness probe failed: ")
            && m.contains("/tmp/ready")),
        "{ev:?}"
    );

    let ev = e.events_of("slow", "s");
    assert!(
        ev.iter().any(|(t, reason, m)| *t == EventType::Warning
            && reason == "Unhealthy"
            && m == "Readiness probe failed: command \"sleep 5\" timed out"),
        "{ev:?}"
    );
    let s = read_status(&cd);
    let slow = container(&s, "slow-1", "s").expect("s");
    assert!(!slow.ready && slow.restart_count == 0, "{slow:?}");

    // Liveness: killed and restarted (the first restart is immediate).
    let s = wait_status(&cd, Duration::from_secs(40), "a liveness restart", |s| {
        container(s, "live-1", "c").is_some_and(|c| {
            c.restart_count >= 1 && matches!(c.state, ContainerState::Running { .. })
        })
    })
    .await;
    let c = container(&s, "live-1", "c").expect("c");
    assert!(
        matches!(&c.last_state, Some(ContainerState::Terminated { exit_code, .. }) if *exit_code != 0),
        "the killed instance is the last state: {c:?}"
    );
    let ev = e.events_of("live", "c");
    assert!(
        ev.iter().any(|(t, reason, m)| *t == EventType::Normal
            && reason == "Killing"
            && m == "Container c failed liveness probe, will be restarted"),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(|(t, reason, m)| *t == EventType::Warning
            && reason == "Unhealthy"
            && m.starts_with("Liveness probe failed: ")
            && m.contains("no-health-file")),
        "{ev:?}"
    );
    // It keeps failing after each restart: the count keeps rising (with crash backoff).
    wait_status(
        &cd,
        Duration::from_secs(60),
        "a second liveness restart",
        |s| container(s, "live-1", "c").is_some_and(|c| c.restart_count >= 2),
    )
    .await;
    finish(e, cd).await;
}

/// httpGet readiness against busybox httpd (named port, path, a custom header) and tcpSocket
/// liveness: the pod turns Ready when the server answers 200 and unready on 404; a tcpSocket
/// liveness probe on a port nobody listens on restarts its container, one on the server's
/// port never does. A startup probe holds `started` (and readiness) until the server is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_readiness_tcp_liveness_and_startup_gating() {
    let cd = Containerd::start("probe-net");
    let mut e = Enforcer::start(&cd);
    let port = free_port();
    let closed = free_port();
    // The server comes up after 4 s; /healthz disappears 6 s later (404).
    let web = format!(
        "  - name: web\n    image: busybox:local\n    command: [sh, -c, 'mkdir -p /www; echo ok > /www/healthz; sleep 4; httpd -f -p {port} -h /www & sleep 6; rm /www/healthz; wait']\n    ports: [{{name: http, containerPort: {port}}}]\n    startupProbe: {{tcpSocket: {{port: {port}}}, periodSeconds: 1, failureThreshold: 30}}\n    readinessProbe: {{httpGet: {{port: http, path: /healthz, httpHeaders: [{{name: X-Probe, value: enforcer}}]}}, periodSeconds: 1, failureThreshold: 1}}\n    livenessProbe: {{tcpSocket: {{port: {port}}}, periodSeconds: 1, failureThreshold: 2}}\n"
    );
    let dead = format!(
        "  - name: dead\n    image: busybox:local\n    command: [sleep, '3600']\n    livenessProbe: {{tcpSocket: {{port: {closed}}}, initialDelaySeconds: 1, periodSeconds: 1, failureThreshold: 2}}\n"
    );
    write_manifest(
        &cd,
        "net.yaml",
        &manifest("net", "net-1", &format!("{web}{dead}")),
    );
    // Running, but not started (the startup probe has not seen the server): not ready.
    let s = wait_status(&cd, Duration::from_secs(30), "web running", |s| {
        running(s, "net-1", "web")
    })
    .await;
    let w = container(&s, "net-1", "web").expect("web");
    assert_eq!(w.started, Some(false), "{w:?}");
    assert!(!w.ready, "{w:?}");
    // The server is up: started, then ready (HTTP 200), Ready once `dead` is ready too.
    wait_status(&cd, Duration::from_secs(20), "web started and ready", |s| {
        container(s, "net-1", "web").is_some_and(|c| c.started == Some(true) && c.ready)
    })
    .await;
    // /healthz gone: 404, unready; never restarted (its liveness port still answers).
    let s = wait_status(&cd, Duration::from_secs(20), "web unready on 404", |s| {
        container(s, "net-1", "web").is_some_and(|c| c.started == Some(true) && !c.ready)
    })
    .await;
    let p = pod(&s, "net-1").expect("pod");
    assert_eq!(condition(p, "Ready"), "False", "{p:?}");
    let ev = e.events_of("net", "web");
    assert!(
        ev.iter().any(|(t, reason, m)| *t == EventType::Warning
            && reason == "Unhealthy"
            && m == "Readiness probe failed: HTTP probe failed with statuscode: 404"),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(|(t, reason, m)| *t == EventType::Warning
            && reason == "Unhealthy"
            && m.starts_with("Startup probe failed: dial tcp ")
            && m.ends_with("connect: connection refused")),
        "{ev:?}"
    );
    // `dead`: its liveness port refuses, so it is killed and restarted.
    let s = wait_status(&cd, Duration::from_secs(40), "dead restarted", |s| {
        container(s, "net-1", "dead").is_some_and(|c| c.restart_count >= 1)
    })
    .await;
    assert_eq!(
        container(&s, "net-1", "web").map(|c| c.restart_count),
        Some(0),
        "{s:?}"
    );
    let ev = e.events_of("net", "dead");
    assert!(
        ev.iter().any(|(t, reason, m)| *t == EventType::Normal
            && reason == "Killing"
            && m == "Container dead failed liveness probe, will be restarted"),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(|(t, reason, m)| *t == EventType::Warning
            && reason == "Unhealthy"
            && m.starts_with("Liveness probe failed: dial tcp ")
            && m.contains(&format!(":{closed}: connect: connection refused"))),
        "{ev:?}"
    );
    finish(e, cd).await;
}
