use super::*;

mod probes;

use crate::{
    cgroup::CgroupLayout,
    container_manager::podcgroup::PodCgroups,
    cri::fake::FakeRuntime,
    status_manager::{Condition, ContainerState, PodPhase},
};

struct Harness {
    fake: FakeRuntime,
    status: StatusManager,
    tx: mpsc::UnboundedSender<WorkUpdate>,
    done: mpsc::UnboundedReceiver<Terminated>,
    events: mpsc::Receiver<crate::recorder::EventRecord>,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// The events recorded since the last call: (type, reason, message).
    fn events(&mut self) -> Vec<(EventType, String, String)> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            out.push((e.type_, e.reason, e.message));
        }
        out
    }

    fn record(&self, uid: &str) -> PodRecord {
        self.status.get(uid).expect("status")
    }
}

fn condition(rec: &PodRecord, kind: &str) -> Condition {
    rec.conditions
        .iter()
        .find(|c| c.kind == kind)
        .cloned()
        .expect("condition")
}

fn harness(yaml: &str) -> Harness {
    let fake = FakeRuntime::with_images(&["busybox:local"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let status = StatusManager::default();
    let (recorder, events) = crate::recorder::Recorder::channel();
    let ctx = Arc::new(WorkerContext {
        link: crate::pods::NodeLink::default(),
        runtime: Arc::new(fake.clone()),
        cgroups: PodCgroups::new("/t", CgroupLayout::default()),
        enforce: Arc::default(),
        status: status.clone(),
        node: NodeFacts {
            memory_capacity: 1 << 30,
            cap_sys_resource: false,
        },
        log_root: dir.path().to_path_buf(),
        downward: crate::policy::env::EnvContext::default(),
        security: SecurityOptions::default(),
        resync: Duration::from_secs(60),
        events: recorder,
        objects: None,
        dns: crate::policy::dns::DnsSettings::default(),
        images: Arc::new(crate::cri::images::ImageManager::new(
            &crate::cri::images::ImageOptions {
                node_config: dir.path().join("config.json"),
                ..Default::default()
            },
        )),
        resizes: crate::container_manager::allocation::ResizeBoard::default(),
    });
    let pod: Pod = serde_yaml_ng::from_str(yaml).expect("pod");
    let (tx, rx) = mpsc::unbounded_channel();
    let (done_tx, done) = mpsc::unbounded_channel();
    let w = PodWorker::new(ctx, Arc::new(pod), "test".to_owned());
    tokio::spawn(w.run(rx, done_tx));
    Harness {
        fake,
        status,
        tx,
        done,
        events,
        _dir: dir,
    }
}

fn starts(f: &FakeRuntime, name: &str) -> usize {
    f.calls()
        .iter()
        .filter(|c| *c == &format!("StartContainer {name}"))
        .count()
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// A pod on a pod network: `status.podIP` in two containers' env and the pod record
/// come from one `PodSandboxStatus` (asked once per sandbox).
#[tokio::test(start_paused = true)]
async fn sandbox_ips_reach_env_and_status_asked_once() {
    let h = harness(
        "metadata: {name: p, uid: u9}\nspec:\n  containers:\n  - {name: a, image: 'busybox:local', env: [{name: IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]}\n  - {name: b, image: 'busybox:local', env: [{name: IPS, valueFrom: {fieldRef: {fieldPath: status.podIPs}}}]}",
    );
    settle().await;
    let ip = crate::cri::fake::SANDBOX_IP.to_owned();
    assert_eq!(h.fake.env_of("a"), [("IP".to_owned(), ip.clone())]);
    assert_eq!(h.fake.env_of("b"), [("IPS".to_owned(), ip.clone())]);
    let _ = h.tx.send(WorkUpdate::Relist);
    settle().await;
    assert_eq!(h.status.get("u9").expect("status").pod_ips, [ip]);
    assert_eq!(h.fake.ip_asks(), 1, "{:?}", h.fake.calls());
}

/// A StartContainer that failed (or a CreateContainer that timed out and completed) leaves
/// a created container: the next sync starts it, it never creates a second one.
#[tokio::test(start_paused = true)]
async fn a_created_container_is_started_not_created_again() {
    let h = harness(
        "metadata: {name: p, uid: u5}\nspec: {containers: [{name: c, image: 'busybox:local'}]}",
    );
    h.fake.fail_starts(1);
    settle().await;
    assert!(h.fake.running().is_empty(), "{:?}", h.fake.calls());
    let _ = h.tx.send(WorkUpdate::Relist);
    settle().await;
    assert_eq!(h.fake.running(), ["c"], "{:?}", h.fake.calls());
    let creates = h
        .fake
        .calls()
        .iter()
        .filter(|c| c.starts_with("CreateContainer"))
        .count();
    assert_eq!(creates, 1, "{:?}", h.fake.calls());
    assert_eq!(h.fake.counts().1, 1);
}

#[tokio::test(start_paused = true)]
async fn crash_backoff_on_the_paused_clock() {
    let h = harness(
        "metadata: {name: p, uid: u1}\nspec: {containers: [{name: c, image: 'busybox:local'}]}",
    );
    settle().await;
    assert_eq!(starts(&h.fake, "c"), 1);
    // First crash: restarted at once.
    assert!(h.fake.exit("c", 1, "Error"));
    let _ = h.tx.send(WorkUpdate::Relist);
    settle().await;
    assert_eq!(starts(&h.fake, "c"), 2);
    // Second crash: 10 s of CrashLoopBackOff.
    assert!(h.fake.exit("c", 1, "Error"));
    let _ = h.tx.send(WorkUpdate::Relist);
    settle().await;
    let rec = h.status.get("u1").expect("status");
    assert!(
        matches!(&rec.container_statuses[0].state, ContainerState::Waiting { reason, .. } if reason == "CrashLoopBackOff"),
        "{rec:?}"
    );
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(starts(&h.fake, "c"), 2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(starts(&h.fake, "c"), 3);
    // Third crash: 20 s.
    assert!(h.fake.exit("c", 1, "Error"));
    let _ = h.tx.send(WorkUpdate::Relist);
    tokio::time::sleep(Duration::from_secs(19)).await;
    assert_eq!(starts(&h.fake, "c"), 3);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(starts(&h.fake, "c"), 4);
    let rec = h.status.get("u1").expect("status");
    assert_eq!(rec.container_statuses[0].restart_count, 3);
}

#[tokio::test(start_paused = true)]
async fn init_containers_one_at_a_time_then_apps() {
    let h = harness(
        "metadata: {name: p, uid: u2}\nspec:\n  initContainers: [{name: i1, image: 'busybox:local'}, {name: i2, image: 'busybox:local'}]\n  containers: [{name: app, image: 'busybox:local'}]",
    );
    settle().await;
    assert_eq!(
        (
            starts(&h.fake, "i1"),
            starts(&h.fake, "i2"),
            starts(&h.fake, "app")
        ),
        (1, 0, 0)
    );
    assert_eq!(h.status.get("u2").map(|r| r.phase), Some(PodPhase::Pending));
    h.fake.exit("i1", 0, "Completed");
    let _ = h.tx.send(WorkUpdate::Relist);
    settle().await;
    assert_eq!((starts(&h.fake, "i2"), starts(&h.fake, "app")), (1, 0));
    h.fake.exit("i2", 0, "Completed");
    let _ = h.tx.send(WorkUpdate::Relist);
    settle().await;
    assert_eq!(starts(&h.fake, "app"), 1);
    assert_eq!(h.status.get("u2").map(|r| r.phase), Some(PodPhase::Running));
}

#[tokio::test(start_paused = true)]
async fn kill_stops_regular_containers_before_sidecars_then_the_sandbox() {
    let mut h = harness(
        "metadata: {name: p, uid: u3}\nspec:\n  terminationGracePeriodSeconds: 30\n  initContainers: [{name: side, image: 'busybox:local', restartPolicy: Always}]\n  containers: [{name: app, image: 'busybox:local'}]",
    );
    settle().await;
    assert_eq!(h.fake.running().len(), 2, "{:?}", h.fake.calls());
    let _ = h.tx.send(WorkUpdate::Kill { grace: Some(5) });
    let uid = tokio::time::timeout(Duration::from_secs(5), h.done.recv())
        .await
        .expect("terminated");
    assert_eq!(uid.map(|t| t.uid).as_deref(), Some("u3"));
    let calls = h.fake.calls();
    let pos = |p: &str| {
        calls
            .iter()
            .position(|c| c.starts_with(p))
            .unwrap_or(usize::MAX)
    };
    assert!(
        pos("StopContainer app 5") < pos("StopContainer side"),
        "{calls:?}"
    );
    assert!(
        pos("StopContainer side") < pos("StopPodSandbox"),
        "{calls:?}"
    );
    assert!(pos("StopPodSandbox") < pos("RemovePodSandbox"), "{calls:?}");
    assert_eq!(h.fake.counts(), (0, 0));
    assert!(h.status.get("u3").is_none());
}

#[tokio::test(start_paused = true)]
async fn missing_image_never_and_pull_failure_are_clear_statuses() {
    let h = harness(
        "metadata: {name: p, uid: u4}\nspec:\n  containers:\n  - {name: never, image: 'nothere:1', imagePullPolicy: Never}\n  - {name: pull, image: 'nothere:2'}",
    );
    settle().await;
    let rec = h.status.get("u4").expect("status");
    let reason = |i: usize| match &rec.container_statuses[i].state {
        ContainerState::Waiting { reason, .. } => reason.clone(),
        other => format!("{other:?}"),
    };
    assert_eq!(reason(0), "ErrImageNeverPull");
    assert_eq!(reason(1), "ErrImagePull");
    let _ = h.tx.send(WorkUpdate::Relist);
    settle().await;
    let rec = h.status.get("u4").expect("status");
    assert!(
        matches!(&rec.container_statuses[1].state, ContainerState::Waiting { reason, .. } if reason == "ImagePullBackOff"),
        "{rec:?}"
    );
    assert_eq!(rec.phase, PodPhase::Pending);
}

/// runAsNonRoot against an image that names no user (root): the container is never
/// created, and waits with kubelet's reason and message; the one that sets a non-root
/// runAsUser starts.
#[tokio::test(start_paused = true)]
async fn run_as_non_root_refused_before_create() {
    let h = harness(
        "metadata: {name: p, namespace: ns, uid: u5}\nspec:\n  securityContext: {runAsNonRoot: true}\n  containers:\n  - {name: root, image: 'busybox:local'}\n  - {name: user, image: 'busybox:local', securityContext: {runAsUser: 1000}}",
    );
    settle().await;
    let rec = h.status.get("u5").expect("status");
    assert_eq!(
        rec.container_statuses[0].state,
        ContainerState::Waiting {
            reason: "CreateContainerConfigError".to_owned(),
            message: "container has runAsNonRoot and image will run as root (pod: \"p_ns(u5)\", container: root)".to_owned(),
        }
    );
    assert!(rec.container_statuses[1].ready, "{rec:?}");
    assert_eq!(starts(&h.fake, "root"), 0);
    assert_eq!(rec.phase, PodPhase::Pending);
    let creates = h
        .fake
        .calls()
        .iter()
        .filter(|c| c.starts_with("CreateContainer"))
        .count();
    assert_eq!(creates, 1, "{:?}", h.fake.calls());
}

#[tokio::test(start_paused = true)]
async fn a_volume_that_cannot_be_set_up_holds_the_pod_before_the_sandbox() {
    let file = tempfile::NamedTempFile::new().expect("file");
    let path = file.path().display().to_string();
    let h = harness(&format!(
        "metadata: {{name: p, uid: u6}}\nspec:\n  volumes: [{{name: h, hostPath: {{path: '{path}', type: Directory}}}}]\n  containers:\n  - {{name: c, image: 'busybox:local', volumeMounts: [{{name: h, mountPath: /h}}]}}"
    ));
    settle().await;
    let rec = h.status.get("u6").expect("status");
    assert_eq!(
        rec.container_statuses[0].state,
        ContainerState::Waiting {
            reason: "ContainerCreating".to_owned(),
            message: format!(
                "MountVolume.SetUp failed for volume \"h\" : hostPath type check failed: {path} is not a directory"
            ),
        }
    );
    assert_eq!(rec.phase, PodPhase::Pending);
    assert!(
        !h.fake
            .calls()
            .iter()
            .any(|c| c.starts_with("RunPodSandbox") || c.starts_with("CreateContainer")),
        "{:?}",
        h.fake.calls()
    );
}

#[tokio::test(start_paused = true)]
async fn an_env_or_sub_path_refusal_is_a_create_container_config_error() {
    let h = harness(
        "metadata: {name: p, uid: u7}\nspec:\n  volumes: [{name: v, emptyDir: {}}]\n  containers:\n  - {name: env, image: 'busybox:local', env: [{name: X, valueFrom: {secretKeyRef: {name: s, key: k}}}]}\n  - {name: sub, image: 'busybox:local', volumeMounts: [{name: v, mountPath: /v, subPath: /abs}]}\n  - {name: ok, image: 'busybox:local', volumeMounts: [{name: v, mountPath: /v}]}",
    );
    settle().await;
    let rec = h.status.get("u7").expect("status");
    let waiting = |i: usize| match &rec.container_statuses[i].state {
        ContainerState::Waiting { reason, message } => (reason.clone(), message.clone()),
        other => panic!("{other:?}"),
    };
    let (reason, message) = waiting(0);
    assert_eq!(reason, "CreateContainerConfigError");
    assert_eq!(
        message,
        "couldn't get secret default/s, no kubeClient defined"
    );
    assert_eq!(
        waiting(1),
        (
            "CreateContainerConfigError".to_owned(),
            "error SubPath `/abs` must not be an absolute path".to_owned()
        )
    );
    assert!(rec.container_statuses[2].ready, "{rec:?}");
    // The emptyDir is under the pod's directory.
    assert!(
        h._dir
            .path()
            .join("u7/volumes/kubernetes.io~empty-dir/v")
            .is_dir()
    );
}
fn has_event(
    events: &[(EventType, String, String)],
    t: EventType,
    reason: &str,
    msg: &str,
) -> bool {
    events
        .iter()
        .any(|(et, r, m)| *et == t && r == reason && m == msg)
}

fn stop_calls(f: &FakeRuntime) -> Vec<String> {
    f.calls()
        .into_iter()
        .filter(|c| c.starts_with("StopContainer"))
        .collect()
}

/// kubelet's killContainer: the preStop hook runs first and its time is taken from the
/// grace period StopContainer gets.
#[tokio::test(start_paused = true)]
async fn pre_stop_time_is_counted_against_the_grace_period() {
    let mut h = harness(
        "metadata: {name: p, uid: ps1}\nspec:\n  terminationGracePeriodSeconds: 10\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {preStop: {sleep: {seconds: 3}}}}",
    );
    settle().await;
    assert_eq!(starts(&h.fake, "c"), 1);
    let _ = h.tx.send(WorkUpdate::Kill { grace: None });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(stop_calls(&h.fake).is_empty(), "{:?}", h.fake.calls());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(stop_calls(&h.fake), vec!["StopContainer c 7".to_owned()]);
    let ev = h.events();
    assert!(
        !ev.iter().any(|(_, r, _)| r == "FailedPreStopHook"),
        "{ev:?}"
    );
}

/// An eviction's grace override (kubelet's `killContainer` with `gracePeriodOverride`):
/// the preStop hook still has the pod's grace period, the stop then gets the override
/// (never under the 2 s floor).
#[tokio::test(start_paused = true)]
async fn an_override_leaves_pre_stop_the_pods_grace_and_stops_with_the_override() {
    let h = harness(
        "metadata: {name: p, uid: ps4}\nspec:\n  terminationGracePeriodSeconds: 10\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {preStop: {sleep: {seconds: 3}}}}",
    );
    settle().await;
    let _ = h.tx.send(WorkUpdate::Kill { grace: Some(1) });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(stop_calls(&h.fake).is_empty(), "{:?}", h.fake.calls());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(stop_calls(&h.fake), vec!["StopContainer c 2".to_owned()]);
}

/// A preStop that outlives the grace period is abandoned at its end; the stop gets the
/// 2 s minimum. A failing one is an event, and the stop goes on with the grace left.
#[tokio::test(start_paused = true)]
async fn a_hanging_pre_stop_ends_with_the_grace_and_a_failing_one_is_reported() {
    let h = harness(
        "metadata: {name: p, uid: ps2}\nspec:\n  terminationGracePeriodSeconds: 5\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {preStop: {exec: {command: [drain]}}}}",
    );
    h.fake.set_exec("c drain", None);
    settle().await;
    let _ = h.tx.send(WorkUpdate::Kill { grace: None });
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(stop_calls(&h.fake).is_empty(), "{:?}", h.fake.calls());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(stop_calls(&h.fake), vec!["StopContainer c 2".to_owned()]);
    assert_eq!(h.fake.exec_count("c drain"), 1);

    let mut h = harness(
        "metadata: {name: p, uid: ps3}\nspec:\n  terminationGracePeriodSeconds: 5\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {preStop: {exec: {command: [drain]}}}}",
    );
    h.fake.set_exec("c drain", Some((3, "busy")));
    settle().await;
    let _ = h.tx.send(WorkUpdate::Kill { grace: None });
    settle().await;
    assert_eq!(stop_calls(&h.fake), vec!["StopContainer c 5".to_owned()]);
    let ev = h.events();
    assert!(
        has_event(
            &ev,
            EventType::Warning,
            "FailedPreStopHook",
            "Exec lifecycle hook ([drain]) for Container \"c\" in Pod \"p_default(ps3)\" failed - error: command 'drain' exited with 3: , message: \"busy\""
        ),
        "{ev:?}"
    );
}

/// A liveness kill runs the preStop hook first, its time taken from the probe's grace.
#[tokio::test(start_paused = true)]
async fn a_liveness_kill_runs_pre_stop_within_the_probe_grace() {
    let h = harness(
        "metadata: {name: p, uid: lps1}\nspec:\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {preStop: {sleep: {seconds: 2}}}, livenessProbe: {exec: {command: [check]}, periodSeconds: 10, failureThreshold: 1, terminationGracePeriodSeconds: 5}}",
    );
    h.fake.set_exec("c check", Some((1, "")));
    settle().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(stop_calls(&h.fake).is_empty(), "{:?}", h.fake.calls());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(stop_calls(&h.fake), vec!["StopContainer c 3".to_owned()]);
}

/// A failing postStart: `FailedPostStartHook`, the container killed (`Killing`), waiting
/// with `PostStartHookError`, then restarted as the restart policy says (with backoff).
#[tokio::test(start_paused = true)]
async fn a_failing_post_start_kills_the_container_and_the_restart_follows_the_policy() {
    let mut h = harness(
        "metadata: {name: p, uid: pst1}\nspec:\n  terminationGracePeriodSeconds: 7\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {postStart: {exec: {command: [setup]}}}}",
    );
    h.fake.set_exec("c setup", Some((1, "no config")));
    settle().await;
    assert_eq!(starts(&h.fake, "c"), 1);
    assert_eq!(h.fake.exec_count("c setup"), 1);
    assert_eq!(stop_calls(&h.fake), vec!["StopContainer c 7".to_owned()]);
    let message = "Exec lifecycle hook ([setup]) for Container \"c\" in Pod \"p_default(pst1)\" failed - error: command 'setup' exited with 1: , message: \"no config\"";
    let ev = h.events();
    assert!(
        has_event(&ev, EventType::Warning, "FailedPostStartHook", message),
        "{ev:?}"
    );
    assert!(
        has_event(&ev, EventType::Normal, "Killing", "FailedPostStartHook"),
        "{ev:?}"
    );
    let rec = h.record("pst1");
    assert!(
        matches!(&rec.container_statuses[0].state, ContainerState::Waiting { reason, message: m } if reason == "PostStartHookError" && m == message),
        "{rec:?}"
    );
    // restartPolicy Always: restarted (the first restart at once), and it succeeds now.
    h.fake.set_exec("c setup", Some((0, "")));
    let _ = h.tx.send(WorkUpdate::Relist);
    settle().await;
    assert_eq!(starts(&h.fake, "c"), 2);
    assert_eq!(stop_calls(&h.fake).len(), 1);
    let rec = h.record("pst1");
    assert_eq!(rec.container_statuses[0].restart_count, 1);
    assert!(matches!(
        rec.container_statuses[0].state,
        ContainerState::Running { .. }
    ));

    // restartPolicy Never: killed and left terminated.
    let h = harness(
        "metadata: {name: p, uid: pst2}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: c, image: 'busybox:local', lifecycle: {postStart: {exec: {command: [setup]}}}}",
    );
    h.fake.set_exec("c setup", Some((1, "")));
    settle().await;
    let _ = h.tx.send(WorkUpdate::Relist);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(starts(&h.fake, "c"), 1);
    let rec = h.record("pst2");
    assert_eq!(rec.phase, PodPhase::Failed);
    assert!(
        matches!(
            rec.container_statuses[0].state,
            ContainerState::Terminated { exit_code: 143, .. }
        ),
        "{rec:?}"
    );
}

/// The file bind-mounted at terminationMessagePath reaches the terminated state's
/// message once the container exits.
#[tokio::test(start_paused = true)]
async fn the_termination_message_file_reaches_the_status() {
    let h = harness(
        "metadata: {name: p, uid: tm1}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: c, image: 'busybox:local', terminationMessagePath: /tmp/why}",
    );
    settle().await;
    let mounts = h.fake.mounts_of("c");
    let m = mounts
        .iter()
        .find(|m| m.container_path == "/tmp/why")
        .expect("the termination message mount");
    assert!(
        m.host_path.contains("/tm1/containers/c/"),
        "{}",
        m.host_path
    );
    std::fs::write(&m.host_path, "disk full").expect("write");
    assert!(h.fake.exit("c", 2, "Error"));
    let _ = h.tx.send(WorkUpdate::Relist);
    settle().await;
    let rec = h.record("tm1");
    assert!(
        matches!(&rec.container_statuses[0].state, ContainerState::Terminated { message, exit_code: 2, .. } if message == "disk full"),
        "{rec:?}"
    );
}
