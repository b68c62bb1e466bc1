//! The prober through the worker: liveness, readiness and startup probes, sidecars, grpc.

use super::*;

use crate::pods::probe;

/// Liveness (exec) failing `failureThreshold` times in a row, one period apart: kubelet's
/// `Unhealthy` events, then `Killing` with the probe's grace period, then the restart
/// (restart count 1); the new instance is probed anew.
#[tokio::test(start_paused = true)]
async fn liveness_failures_kill_and_restart_the_container() {
    let mut h = harness(
        "metadata: {name: p, uid: l1}\nspec:\n  containers:\n  - {name: c, image: 'busybox:local', livenessProbe: {exec: {command: [check]}, periodSeconds: 10, failureThreshold: 3, terminationGracePeriodSeconds: 5}}",
    );
    h.fake.set_exec("c", Some((1, "boom")));
    settle().await;
    assert_eq!(starts(&h.fake, "c"), 1);
    assert_eq!(
        h.fake.exec_count("c"),
        1,
        "probed at once (no initial delay)"
    );
    // Two failures: below the threshold, still running.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(h.fake.exec_count("c"), 2);
    assert_eq!(starts(&h.fake, "c"), 1);
    assert!(h.record("l1").container_statuses[0].ready);
    // The third, at 20 s: killed with the probe's grace, restarted at once.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        h.fake.exec_count("c"),
        4,
        "the new instance is probed: {:?}",
        h.fake.calls()
    );
    assert!(
        h.fake.calls().contains(&"StopContainer c 5".to_owned()),
        "{:?}",
        h.fake.calls()
    );
    assert_eq!(starts(&h.fake, "c"), 2);
    let rec = h.record("l1");
    assert_eq!(rec.container_statuses[0].restart_count, 1, "{rec:?}");
    assert!(matches!(
        rec.container_statuses[0].state,
        ContainerState::Running { .. }
    ));
    let ev = h.events();
    assert!(
        has_event(
            &ev,
            EventType::Warning,
            "Unhealthy",
            "Liveness probe failed: boom"
        ),
        "{ev:?}"
    );
    assert!(
        has_event(
            &ev,
            EventType::Normal,
            "Killing",
            "Container c failed liveness probe, will be restarted"
        ),
        "{ev:?}"
    );
    // Healthy from now on: no more kills.
    h.fake.set_exec("c", Some((0, "")));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(starts(&h.fake, "c"), 2);
}

/// restartPolicy Never: the liveness kill says nothing of a restart, the container stays
/// terminated and the pod fails.
#[tokio::test(start_paused = true)]
async fn liveness_kill_under_restart_policy_never_ends_the_pod() {
    let mut h = harness(
        "metadata: {name: p, uid: l2}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: c, image: 'busybox:local', livenessProbe: {exec: {command: [check]}, periodSeconds: 1, failureThreshold: 1}}",
    );
    h.fake.set_exec("c", Some((1, "")));
    settle().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(starts(&h.fake, "c"), 1);
    let rec = h.record("l2");
    assert_eq!(rec.phase, PodPhase::Failed, "{rec:?}");
    let ev = h.events();
    assert!(
        has_event(
            &ev,
            EventType::Normal,
            "Killing",
            "Container c failed liveness probe"
        ),
        "{ev:?}"
    );
    assert!(
        h.fake.calls().contains(&"StopContainer c 30".to_owned()),
        "{:?}",
        h.fake.calls()
    );
}

/// Readiness drives the container's `ready` and the ContainersReady / Ready conditions,
/// both ways, without restarting anything; a container without probes is ready.
#[tokio::test(start_paused = true)]
async fn readiness_drives_ready_and_the_pod_conditions() {
    let mut h = harness(
        "metadata: {name: p, uid: r1}\nspec:\n  containers:\n  - {name: web, image: 'busybox:local', readinessProbe: {exec: {command: [ready]}, periodSeconds: 5, successThreshold: 2, failureThreshold: 2}}\n  - {name: plain, image: 'busybox:local'}",
    );
    h.fake.set_exec("web", Some((1, "not yet")));
    settle().await;
    let rec = h.record("r1");
    assert_eq!(rec.phase, PodPhase::Running);
    assert!(!rec.container_statuses[0].ready);
    assert_eq!(rec.container_statuses[0].started, Some(true));
    assert!(rec.container_statuses[1].ready);
    let cr = condition(&rec, "ContainersReady");
    assert_eq!(
        (cr.status.as_str(), cr.reason.as_str(), cr.message.as_str()),
        (
            "False",
            "ContainersNotReady",
            "containers with unready status: [web]"
        )
    );
    assert_eq!(condition(&rec, "Ready").status, "False");
    // Two successes (successThreshold 2), 5 s apart.
    h.fake.set_exec("web", Some((0, "")));
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        !h.record("r1").container_statuses[0].ready,
        "one success is not enough"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rec = h.record("r1");
    assert!(rec.container_statuses[0].ready, "{rec:?}");
    assert_eq!(
        condition(&rec, "ContainersReady"),
        Condition::new("ContainersReady", true)
    );
    assert_eq!(condition(&rec, "Ready"), Condition::new("Ready", true));
    // Failing again (failureThreshold 2): unready, never restarted.
    h.fake.set_exec("web", Some((1, "overloaded")));
    tokio::time::sleep(Duration::from_secs(11)).await;
    let rec = h.record("r1");
    assert!(!rec.container_statuses[0].ready);
    assert_eq!(condition(&rec, "Ready").status, "False");
    assert_eq!(starts(&h.fake, "web"), 1);
    let ev = h.events();
    assert!(
        has_event(
            &ev,
            EventType::Warning,
            "Unhealthy",
            "Readiness probe failed: overloaded"
        ),
        "{ev:?}"
    );
}

/// The startup probe gates liveness and readiness: neither runs, the container is not
/// started and not ready, until it succeeds; then readiness runs at once.
#[tokio::test(start_paused = true)]
async fn startup_probe_gates_liveness_and_readiness() {
    let mut h = harness(
        "metadata: {name: p, uid: s1}\nspec:\n  containers:\n  - name: c\n    image: 'busybox:local'\n    startupProbe: {exec: {command: [started]}, periodSeconds: 1, failureThreshold: 30}\n    livenessProbe: {exec: {command: [live]}, periodSeconds: 1}\n    readinessProbe: {exec: {command: [ready]}, periodSeconds: 10}",
    );
    h.fake.set_exec("c started", Some((1, "")));
    settle().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rec = h.record("s1");
    assert!(h.fake.exec_count("c started") >= 5);
    assert_eq!(h.fake.exec_count("c live"), 0);
    assert_eq!(h.fake.exec_count("c ready"), 0);
    assert_eq!(rec.container_statuses[0].started, Some(false));
    assert!(!rec.container_statuses[0].ready);
    assert_eq!(condition(&rec, "Ready").status, "False");
    let ev = h.events();
    assert!(
        has_event(
            &ev,
            EventType::Warning,
            "Unhealthy",
            "Startup probe failed: "
        ),
        "{ev:?}"
    );
    // Started: readiness probes at once (not 10 s later), liveness on its period.
    h.fake.set_exec("c started", Some((0, "")));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rec = h.record("s1");
    assert_eq!(rec.container_statuses[0].started, Some(true));
    assert!(rec.container_statuses[0].ready, "{rec:?}");
    assert_eq!(h.fake.exec_count("c ready"), 1);
    assert!(h.fake.exec_count("c live") >= 1);
    let startup_probes = h.fake.exec_count("c started");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        h.fake.exec_count("c started"),
        startup_probes,
        "no startup probe once started"
    );
    assert_eq!(starts(&h.fake, "c"), 1);
}

/// A startup probe failing past its threshold kills the container (kubelet's message).
#[tokio::test(start_paused = true)]
async fn startup_failure_kills_the_container() {
    let mut h = harness(
        "metadata: {name: p, uid: s2}\nspec:\n  containers:\n  - {name: c, image: 'busybox:local', startupProbe: {exec: {command: [started]}, initialDelaySeconds: 3, periodSeconds: 1, failureThreshold: 2}}",
    );
    h.fake.set_exec("c", Some((1, "")));
    settle().await;
    tokio::time::sleep(Duration::from_millis(2900)).await;
    assert_eq!(h.fake.exec_count("c"), 0, "initialDelaySeconds");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(starts(&h.fake, "c"), 2, "{:?}", h.fake.calls());
    let ev = h.events();
    assert!(
        has_event(
            &ev,
            EventType::Normal,
            "Killing",
            "Container c failed startup probe, will be restarted"
        ),
        "{ev:?}"
    );
}

/// A probe the prober cannot run (an unknown named port, no handler) is never
/// dropped: each attempt is a Warning event saying why, its result is thrown away as
/// kubelet does (readiness stays false, liveness never kills).
#[tokio::test(start_paused = true)]
async fn a_probe_that_cannot_run_is_reported_not_dropped() {
    let mut h = harness(
        "metadata: {name: p, uid: e1}\nspec:\n  containers:\n  - {name: c, image: 'busybox:local', livenessProbe: {httpGet: {port: nope}, periodSeconds: 1}, readinessProbe: {periodSeconds: 1}}",
    );
    settle().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rec = h.record("e1");
    assert!(!rec.container_statuses[0].ready);
    assert_eq!(starts(&h.fake, "c"), 1);
    let ev = h.events();
    assert!(
        has_event(
            &ev,
            EventType::Warning,
            "Unhealthy",
            "Liveness probe errored and resulted in unknown state: port \"nope\" not found in container c"
        ),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(|(t, r, m)| *t == EventType::Warning
            && r == "Unhealthy"
            && m
                == "Readiness probe errored and resulted in unknown state: missing probe handler for container c"),
        "{ev:?}"
    );
}

/// An exec probe that times out (timeoutSeconds) fails with kubelet's message.
#[tokio::test(start_paused = true)]
async fn an_exec_probe_timeout_is_a_failure() {
    let mut h = harness(
        "metadata: {name: p, uid: t1}\nspec:\n  containers:\n  - {name: c, image: 'busybox:local', readinessProbe: {exec: {command: [sleep, '9']}, timeoutSeconds: 2, periodSeconds: 5}}",
    );
    h.fake.set_exec("c", None);
    settle().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ev = h.events();
    assert!(
        has_event(
            &ev,
            EventType::Warning,
            "Unhealthy",
            "Readiness probe failed: command \"sleep 9\" timed out"
        ),
        "{ev:?}"
    );
    assert!(!h.record("t1").container_statuses[0].ready);
}

/// restartPolicy OnFailure: a container killed for its liveness probe is restarted even
/// when it exits 0 on SIGTERM (kubelet restarts unless the policy is Never).
#[tokio::test(start_paused = true)]
async fn a_liveness_kill_restarts_under_on_failure_whatever_the_exit_code() {
    let h = harness(
        "metadata: {name: p, uid: l3}\nspec:\n  restartPolicy: OnFailure\n  containers:\n  - {name: c, image: 'busybox:local', livenessProbe: {exec: {command: [check]}, periodSeconds: 1, failureThreshold: 1}}",
    );
    h.fake.set_exec("c", Some((1, "")));
    h.fake.set_stop_exit_code(0);
    settle().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(starts(&h.fake, "c"), 2, "{:?}", h.fake.calls());
    let rec = h.record("l3");
    assert_eq!(rec.phase, PodPhase::Running, "{rec:?}");
    assert_eq!(rec.container_statuses[0].restart_count, 1, "{rec:?}");
    assert!(
        !h.fake
            .calls()
            .iter()
            .any(|c| c.starts_with("StopPodSandbox")),
        "{:?}",
        h.fake.calls()
    );
}

/// A sidecar's readiness counts towards ContainersReady (kubelet 1.29+), and its
/// liveness failure restarts it (sidecars always restart; kubelet's init container
/// message).
#[tokio::test(start_paused = true)]
async fn sidecar_probes_count_for_ready_and_restart_it() {
    let mut h = harness(
        "metadata: {name: p, uid: sc1}\nspec:\n  restartPolicy: Never\n  initContainers:\n  - {name: side, image: 'busybox:local', restartPolicy: Always, readinessProbe: {exec: {command: [ready]}, periodSeconds: 1, failureThreshold: 1}, livenessProbe: {exec: {command: [live]}, periodSeconds: 1, failureThreshold: 2}}\n  containers:\n  - {name: app, image: 'busybox:local'}",
    );
    h.fake.set_exec("side ready", Some((1, "")));
    settle().await;
    let rec = h.record("sc1");
    assert_eq!(rec.phase, PodPhase::Running, "{rec:?}");
    let cr = condition(&rec, "ContainersReady");
    assert_eq!(
        (cr.status.as_str(), cr.message.as_str()),
        ("False", "containers with unready status: [side]"),
        "{rec:?}"
    );
    h.fake.set_exec("side ready", Some((0, "")));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let rec = h.record("sc1");
    assert!(rec.init_container_statuses[0].ready, "{rec:?}");
    assert_eq!(condition(&rec, "Ready").status, "True", "{rec:?}");
    // Liveness fails twice: killed, restarted although the pod's policy is Never.
    h.fake.set_exec("side live", Some((1, "dead")));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(starts(&h.fake, "side"), 2, "{:?}", h.fake.calls());
    assert_eq!(starts(&h.fake, "app"), 1);
    let ev = h.events();
    assert!(
        has_event(
            &ev,
            EventType::Normal,
            "Killing",
            "Init container side failed liveness probe"
        ),
        "{ev:?}"
    );
}

/// A sidecar's startup probe holds the containers after it (kubelet starts the next
/// container once the sidecar has started): Pending and not Initialized until then.
#[tokio::test(start_paused = true)]
async fn a_sidecar_startup_probe_holds_the_next_containers() {
    let h = harness(
        "metadata: {name: p, uid: sc2}\nspec:\n  initContainers:\n  - {name: side, image: 'busybox:local', restartPolicy: Always, startupProbe: {exec: {command: [up]}, periodSeconds: 1, failureThreshold: 100}}\n  - {name: init, image: 'busybox:local'}\n  containers:\n  - {name: app, image: 'busybox:local'}",
    );
    h.fake.set_exec("side", Some((1, "")));
    settle().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(starts(&h.fake, "side"), 1);
    assert_eq!((starts(&h.fake, "init"), starts(&h.fake, "app")), (0, 0));
    let rec = h.record("sc2");
    assert_eq!(rec.phase, PodPhase::Pending, "{rec:?}");
    assert_eq!(condition(&rec, "Initialized").status, "False");
    assert_eq!(rec.init_container_statuses[0].started, Some(false));
    // Started: the init container runs, then the app.
    h.fake.set_exec("side", Some((0, "")));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(starts(&h.fake, "init"), 1, "{:?}", h.fake.calls());
    h.fake.exit("init", 0, "Completed");
    let _ = h.tx.send(WorkUpdate::Relist);
    settle().await;
    assert_eq!(starts(&h.fake, "app"), 1, "{:?}", h.fake.calls());
    let rec = h.record("sc2");
    assert_eq!(rec.phase, PodPhase::Running, "{rec:?}");
    assert_eq!(condition(&rec, "Initialized").status, "True");
    assert_eq!(condition(&rec, "Ready").status, "True", "{rec:?}");
}

/// gRPC probes through the pod worker, on the real clock against an in-process
/// `grpc.health.v1.Health` server (a host-network pod without node IPs is probed at
/// 127.0.0.1): SERVING makes the container ready, NOT_SERVING unready, then its
/// liveness failures restart it.
#[tokio::test]
async fn grpc_probes_drive_ready_and_restarts() {
    let (port, status, server) = probe::testing::grpc_health_server(2).await;
    let mut h = harness(&format!(
        "metadata: {{name: p, uid: g1}}\nspec:\n  hostNetwork: true\n  containers:\n  - {{name: c, image: 'busybox:local', readinessProbe: {{grpc: {{port: {port}}}, periodSeconds: 1, failureThreshold: 1}}, livenessProbe: {{grpc: {{port: {port}, service: live}}, initialDelaySeconds: 3, periodSeconds: 1, failureThreshold: 1}}}}"
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let wait = async |what: &str, f: &dyn Fn(&PodRecord) -> bool| loop {
        if h.status.get("g1").is_some_and(|r| f(&r)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {what}: {:?}",
            h.status.get("g1")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    wait("running, unready", &|r| {
        r.phase == PodPhase::Running && !r.container_statuses[0].ready
    })
    .await;
    status.store(1, std::sync::atomic::Ordering::SeqCst);
    wait("ready on SERVING", &|r| {
        r.container_statuses[0].ready && condition(r, "Ready").status == "True"
    })
    .await;
    assert_eq!(starts(&h.fake, "c"), 1);
    // NOT_SERVING: unready at once, then (after the liveness delay) restarted.
    status.store(2, std::sync::atomic::Ordering::SeqCst);
    wait("restarted on NOT_SERVING", &|r| {
        r.container_statuses[0].restart_count >= 1
    })
    .await;
    server.abort();
    let ev = h.events();
    assert!(
        has_event(
            &ev,
            EventType::Warning,
            "Unhealthy",
            "Liveness probe failed: service unhealthy (responded with \"NOT_SERVING\")"
        ),
        "{ev:?}"
    );
    assert!(
        has_event(
            &ev,
            EventType::Normal,
            "Killing",
            "Container c failed liveness probe, will be restarted"
        ),
        "{ev:?}"
    );
}
