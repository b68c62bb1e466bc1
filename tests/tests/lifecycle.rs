//! Black-box lifecycle tests on a private containerd: `postStart` and `preStop` hooks run by
//! the enforcer's pod workers as kubelet runs them (preStop before SIGTERM, within the grace
//! period; a failing postStart kills the container with `FailedPostStartHook`), and the
//! termination message (the file kubelet bind-mounts at `terminationMessagePath`, or the log
//! tail with `FallbackToLogsOnError`) in the container status. Needs root, containerd, runc
//! and busybox-static; fails loudly without them.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use enforcer::{
    recorder::EventType,
    status_manager::{ContainerRecord, ContainerState, StatusFile},
};
use enforcer_tests::{
    containerd::Containerd,
    pods::{Enforcer, finish, manifests, pod, wait_status, write_manifest},
};

fn container<'a>(s: &'a StatusFile, uid: &str, name: &str) -> Option<&'a ContainerRecord> {
    pod(s, uid).and_then(|p| p.container_statuses.iter().find(|c| c.name == name))
}

fn terminated(s: &StatusFile, uid: &str, name: &str) -> Option<(i32, String)> {
    match container(s, uid, name).map(|c| &c.state) {
        Some(ContainerState::Terminated {
            exit_code, message, ..
        }) => Some((*exit_code, message.clone())),
        _ => None,
    }
}

async fn wait_file(path: &Path, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && !s.is_empty()
        {
            return s;
        }
        assert!(
            Instant::now() <= deadline,
            "{} not written within {timeout:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// postStart exec runs in the started container; on deletion the preStop exec runs before
/// SIGTERM reaches the main process (which records whether the preStop's marker was there
/// when TERM arrived), and the pod is gone within its grace period although the preStop took
/// part of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_start_runs_and_pre_stop_runs_before_sigterm_within_the_grace() {
    let cd = Containerd::start("lifecycle-hooks");
    let mut e = Enforcer::start(&cd);
    let host = cd.dir.join("hooks-shared");
    std::fs::create_dir_all(&host).expect("host dir");
    write_manifest(
        &cd,
        "hooks.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: hooks, uid: hooks-1}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 8\n  volumes: [{{name: h, hostPath: {{path: '{}', type: Directory}}}}]\n  containers:\n  - name: c\n    image: busybox:local\n    volumeMounts: [{{name: h, mountPath: /h}}]\n    command: [sh, -c, 'trap \"if [ -e /h/prestop ]; then echo seen > /h/term; else echo missing > /h/term; fi; exit 0\" TERM; while true; do sleep 1; done']\n    lifecycle:\n      postStart: {{exec: {{command: [sh, -c, 'echo started > /h/poststart']}}}}\n      preStop: {{exec: {{command: [sh, -c, 'sleep 2; echo done > /h/prestop']}}}}\n",
            host.display()
        ),
    );
    wait_status(&cd, Duration::from_secs(30), "hooks running", |s| {
        matches!(
            container(s, "hooks-1", "c").map(|c| &c.state),
            Some(ContainerState::Running { .. })
        )
    })
    .await;
    assert_eq!(
        wait_file(&host.join("poststart"), Duration::from_secs(10)).await,
        "started\n",
        "postStart ran in the container"
    );
    assert!(!host.join("prestop").exists());
    assert!(!host.join("term").exists());
    // Deleted: preStop (2 s), then SIGTERM, all within the 8 s grace.
    let deleted = Instant::now();
    std::fs::remove_file(manifests(&cd).join("hooks.yaml")).expect("delete manifest");
    let term = wait_file(&host.join("term"), Duration::from_secs(20)).await;
    let took = deleted.elapsed();
    assert_eq!(
        term, "seen\n",
        "SIGTERM came after the preStop hook had finished"
    );
    assert!(
        took >= Duration::from_secs(2),
        "SIGTERM only after the 2 s preStop: {took:?}"
    );
    assert!(
        took < Duration::from_secs(8),
        "SIGTERM within the grace period: {took:?}"
    );
    wait_status(&cd, Duration::from_secs(20), "hooks pod gone", |s| {
        pod(s, "hooks-1").is_none()
    })
    .await;
    let ev = e.events_of("hooks", "c");
    assert!(
        !ev.iter()
            .any(|(_, r, _)| r == "FailedPreStopHook" || r == "FailedPostStartHook"),
        "{ev:?}"
    );
    finish(e, cd).await;
}

/// A server on 127.0.0.1 that records each request's path and when it came, answers
/// `/poststart` with 500 at once and `/prestop` with 200 after 2 s.
async fn hook_server() -> (u16, Arc<std::sync::Mutex<Vec<(String, Instant)>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = l.local_addr().expect("addr").port();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                log.lock()
                    .expect("log")
                    .push((path.clone(), Instant::now()));
                let answer: &[u8] = if path == "/prestop" {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                } else {
                    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                };
                let _ = s.write_all(answer).await;
            });
        }
    });
    (port, seen)
}

/// httpGet hooks: the postStart request is made (its 500 is no failure: kubelet's lifecycle
/// client does not look at the status code), and on deletion the preStop request is made and
/// answered (2 s later) before SIGTERM reaches the main process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_hooks_run_and_pre_stop_is_answered_before_sigterm() {
    let cd = Containerd::start("lifecycle-http");
    let mut e = Enforcer::start(&cd);
    let (port, seen) = hook_server().await;
    let host = cd.dir.join("http-shared");
    std::fs::create_dir_all(&host).expect("host dir");
    write_manifest(
        &cd,
        "web.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, uid: web-1}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 8\n  volumes: [{{name: h, hostPath: {{path: '{}', type: Directory}}}}]\n  containers:\n  - name: c\n    image: busybox:local\n    volumeMounts: [{{name: h, mountPath: /h}}]\n    command: [sh, -c, 'trap \"echo term > /h/term; exit 0\" TERM; while true; do sleep 1; done']\n    lifecycle:\n      postStart: {{httpGet: {{host: 127.0.0.1, port: {port}, path: /poststart}}}}\n      preStop: {{httpGet: {{host: 127.0.0.1, port: {port}, path: prestop}}}}\n",
            host.display()
        ),
    );
    wait_status(&cd, Duration::from_secs(30), "web running", |s| {
        matches!(
            container(s, "web-1", "c").map(|c| &c.state),
            Some(ContainerState::Running { .. })
        )
    })
    .await;
    let paths = |seen: &std::sync::Mutex<Vec<(String, Instant)>>| -> Vec<String> {
        seen.lock()
            .expect("log")
            .iter()
            .map(|(p, _)| p.clone())
            .collect()
    };
    assert_eq!(paths(&seen), vec!["/poststart".to_owned()]);
    std::fs::remove_file(manifests(&cd).join("web.yaml")).expect("delete manifest");
    wait_file(&host.join("term"), Duration::from_secs(20)).await;
    let term_seen = Instant::now();
    assert_eq!(
        paths(&seen),
        vec!["/poststart".to_owned(), "/prestop".to_owned()]
    );
    let asked = seen.lock().expect("log")[1].1;
    assert!(
        term_seen.duration_since(asked) >= Duration::from_secs(2),
        "SIGTERM only after the preStop request was answered"
    );
    wait_status(&cd, Duration::from_secs(20), "web gone", |s| {
        pod(s, "web-1").is_none()
    })
    .await;
    let ev = e.events_of("web", "c");
    assert!(
        !ev.iter()
            .any(|(_, r, _)| r == "FailedPreStopHook" || r == "FailedPostStartHook"),
        "{ev:?}"
    );
    finish(e, cd).await;
}

/// A failing postStart: kubelet's `FailedPostStartHook` event with the hook's output, the
/// container killed, and under `restartPolicy: Never` left terminated (the pod Failed).
/// A failing preStop is reported (`FailedPreStopHook`) and the stop goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_post_start_kills_the_container_and_a_failing_pre_stop_is_reported() {
    let cd = Containerd::start("lifecycle-fail");
    let mut e = Enforcer::start(&cd);
    write_manifest(
        &cd,
        "bad.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bad, uid: bad-1}\nspec:\n  hostNetwork: true\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: busybox:local\n    command: [sleep, '3600']\n    lifecycle:\n      postStart: {exec: {command: [sh, -c, 'echo no config; exit 7']}}\n",
    );
    write_manifest(
        &cd,
        "stopfail.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: stopfail, uid: stopfail-1}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: busybox:local\n    command: [sleep, '3600']\n    lifecycle:\n      preStop: {exec: {command: [sh, -c, 'echo cannot drain; exit 4']}}\n",
    );
    let s = wait_status(&cd, Duration::from_secs(40), "bad killed", |s| {
        terminated(s, "bad-1", "c").is_some()
            && pod(s, "bad-1")
                .is_some_and(|p| p.phase == enforcer::status_manager::PodPhase::Failed)
    })
    .await;
    assert_ne!(terminated(&s, "bad-1", "c").map(|t| t.0), Some(0));
    let ev = e.events_of("bad", "c");
    assert!(
        ev.iter().any(|(t, r, m)| *t == EventType::Warning
            && r == "FailedPostStartHook"
            && m.starts_with("Exec lifecycle hook ([sh -c echo no config; exit 7]) for Container \"c\" in Pod \"bad-")
            && m.contains("exited with 7")
            && m.ends_with("message: \"no config\\n\"")),
        "{ev:?}"
    );
    assert!(
        ev.iter()
            .any(|(_, r, m)| r == "Killing" && m == "FailedPostStartHook"),
        "{ev:?}"
    );
    wait_status(&cd, Duration::from_secs(30), "stopfail running", |s| {
        matches!(
            container(s, "stopfail-1", "c").map(|c| &c.state),
            Some(ContainerState::Running { .. })
        )
    })
    .await;
    std::fs::remove_file(manifests(&cd).join("stopfail.yaml")).expect("delete manifest");
    wait_status(&cd, Duration::from_secs(20), "stopfail gone", |s| {
        pod(s, "stopfail-1").is_none()
    })
    .await;
    let ev = e.events_of("stopfail", "c");
    assert!(
        ev.iter().any(|(t, r, m)| *t == EventType::Warning
            && r == "FailedPreStopHook"
            && m.contains("exited with 4")
            && m.ends_with("message: \"cannot drain\\n\"")),
        "{ev:?}"
    );
    finish(e, cd).await;
}

/// The termination message: what the container wrote to `terminationMessagePath` (the
/// default and a custom path), and with `FallbackToLogsOnError` the tail of the log when the
/// container failed without writing one (not when it succeeded). The log lines are all on
/// stdout: stdout and stderr reach the log through separate pipes, in no fixed order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_messages_from_the_file_or_the_log_tail_reach_the_status() {
    let cd = Containerd::start("lifecycle-msg");
    let e = Enforcer::start(&cd);
    write_manifest(
        &cd,
        "msg.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: msg, uid: msg-1}\nspec:\n  hostNetwork: true\n  restartPolicy: Never\n  containers:\n  - name: file\n    image: busybox:local\n    command: [sh, -c, 'printf \"bye from file\" > /dev/termination-log; exit 3']\n  - name: custom\n    image: busybox:local\n    terminationMessagePath: /tmp/why\n    command: [sh, -c, 'printf \"custom path\" > /tmp/why']\n  - name: logs\n    image: busybox:local\n    terminationMessagePolicy: FallbackToLogsOnError\n    command: [sh, -c, 'for i in $(seq 1 100); do echo line $i; done; echo last words; exit 1']\n  - name: logsok\n    image: busybox:local\n    terminationMessagePolicy: FallbackToLogsOnError\n    command: [sh, -c, 'echo fine']\n",
    );
    let s = wait_status(&cd, Duration::from_secs(40), "all four exited", |s| {
        ["file", "custom", "logs", "logsok"]
            .iter()
            .all(|n| terminated(s, "msg-1", n).is_some())
    })
    .await;
    assert_eq!(
        terminated(&s, "msg-1", "file"),
        Some((3, "bye from file".to_owned()))
    );
    assert_eq!(
        terminated(&s, "msg-1", "custom"),
        Some((0, "custom path".to_owned()))
    );
    let (code, tail) = terminated(&s, "msg-1", "logs").expect("logs terminated");
    assert_eq!(code, 1);
    let expected: String = (22..=100)
        .map(|i| format!("line {i}\n"))
        .chain(std::iter::once("last words\n".to_owned()))
        .collect();
    assert_eq!(tail, expected, "the last 80 log lines");
    assert_eq!(terminated(&s, "msg-1", "logsok"), Some((0, String::new())));
    finish(e, cd).await;
}
