use super::*;

use k8s_openapi::api::core::v1::{PodSpec, Probe};

#[test]
fn dates() {
    assert_eq!(rfc3339(0), "");
    assert_eq!(rfc3339(1_000_000_000), "1970-01-01T00:00:01Z");
    assert_eq!(
        rfc3339(1_709_251_200 * 1_000_000_000),
        "2024-03-01T00:00:00Z"
    );
    assert_eq!(
        rfc3339(951_782_400 * 1_000_000_000 + 1),
        "2000-02-29T00:00:00Z"
    );
}

const S: i64 = 1_000_000_000;
const RUN: RuntimeState = RuntimeState::Running;

fn ctr(name: &str) -> Container {
    Container {
        name: name.to_owned(),
        image: Some("busybox:local".to_owned()),
        ..Default::default()
    }
}

/// Instance `id` of container `name`: state, restart count, started at `at` seconds (and
/// finished a second later), started and ready per the prober.
fn inst(name: &str, id: &str, state: RuntimeState, n: u32, at: i64) -> ContainerObservation {
    ContainerObservation {
        id: id.to_owned(),
        name: name.to_owned(),
        state,
        restart_count: n,
        status: RuntimeStatus {
            reason: String::new(),
            message: String::new(),
            started_at: at * S,
            finished_at: if matches!(state, RuntimeState::Exited { .. }) {
                (at + 1) * S
            } else {
                0
            },
            image_ref: "sha256:b".to_owned(),
        },
        probe_killed: false,
        started: true,
        ready: true,
        oom_score_adj: None,
        actual: None,
    }
}

fn exited(code: i32) -> RuntimeState {
    RuntimeState::Exited { code }
}

fn terminated(code: i32, reason: &str, at: i64) -> ContainerState {
    ContainerState::Terminated {
        exit_code: code,
        reason: reason.to_owned(),
        message: String::new(),
        started_at: rfc3339(at * S),
        finished_at: rfc3339((at + 1) * S),
    }
}

fn waiting(reason: &str, message: &str) -> ContainerState {
    ContainerState::Waiting {
        reason: reason.to_owned(),
        message: message.to_owned(),
    }
}

fn running(at: i64) -> ContainerState {
    ContainerState::Running {
        started_at: rfc3339(at * S),
    }
}

/// kubelet's `TestConvertToAPIContainerStatuses` and the waiting-reason cases of
/// `TestGenerateAPIPodStatusWithReasonCache`, for one container.
#[test]
fn container_status_table() {
    let c = ctr("c");
    let crash = ("CrashLoopBackOff".to_owned(), "back-off 10s".to_owned());
    let pull = ("ErrImagePull".to_owned(), "not found".to_owned());
    let mut oom_reason = inst("c", "c2", exited(137), 1, 20);
    oom_reason.status.reason = "OOMKilled".to_owned();
    let mut not_started = inst("c", "c1", RUN, 0, 10);
    not_started.started = false;
    let mut unready = inst("c", "c1", RUN, 0, 10);
    unready.ready = false;
    let mut probe_killed = inst("c", "c1", exited(0), 0, 10);
    probe_killed.probe_killed = true;
    #[expect(clippy::type_complexity, reason = "a table")]
    let cases: Vec<(
        &str,
        Vec<ContainerObservation>,
        Option<&(String, String)>,
        ContainerState,
        Option<ContainerState>,
        AppState,
        bool,
        bool,
    )> = vec![
        (
            "never created: ContainerCreating",
            vec![],
            None,
            waiting("ContainerCreating", ""),
            None,
            AppState::Waiting,
            false,
            false,
        ),
        (
            "never created: the sync's reason",
            vec![],
            Some(&pull),
            waiting("ErrImagePull", "not found"),
            None,
            AppState::Waiting,
            false,
            false,
        ),
        (
            "running, started and ready",
            vec![inst("c", "c1", RUN, 0, 10)],
            None,
            running(10),
            None,
            AppState::Running,
            true,
            true,
        ),
        (
            "running, before its startup probe: neither started nor ready",
            vec![not_started],
            None,
            running(10),
            None,
            AppState::Running,
            false,
            false,
        ),
        (
            "running, readiness failing",
            vec![unready],
            None,
            running(10),
            None,
            AppState::Running,
            true,
            false,
        ),
        (
            "restarted: the exited instance is the last state",
            vec![
                inst("c", "c2", RUN, 1, 20),
                inst("c", "c1", exited(1), 0, 10),
            ],
            None,
            running(20),
            Some(terminated(1, "Error", 10)),
            AppState::Running,
            true,
            true,
        ),
        (
            "the instance before a running one is not a last state",
            vec![inst("c", "c2", RUN, 1, 20), inst("c", "c1", RUN, 0, 10)],
            None,
            running(20),
            None,
            AppState::Running,
            true,
            true,
        ),
        (
            "exited 0: Completed",
            vec![inst("c", "c1", exited(0), 0, 10)],
            None,
            terminated(0, "Completed", 10),
            None,
            AppState::Exited { code: 0 },
            false,
            false,
        ),
        (
            "exited with the runtime's reason",
            vec![oom_reason.clone(), inst("c", "c1", exited(2), 0, 10)],
            None,
            terminated(137, "OOMKilled", 20),
            Some(terminated(2, "Error", 10)),
            AppState::Exited { code: 137 },
            false,
            false,
        ),
        (
            "in crash backoff: waiting, the exit as the last state",
            vec![oom_reason, inst("c", "c1", exited(2), 0, 10)],
            Some(&crash),
            waiting("CrashLoopBackOff", "back-off 10s"),
            Some(terminated(137, "OOMKilled", 20)),
            AppState::Exited { code: 137 },
            false,
            false,
        ),
        (
            "probe-killed exit 0: shown as 0, a failure for the phase",
            vec![probe_killed],
            None,
            terminated(0, "Completed", 10),
            None,
            AppState::Exited { code: 1 },
            false,
            false,
        ),
        (
            "created, not started",
            vec![inst("c", "c1", RuntimeState::Created, 0, 10)],
            None,
            waiting("ContainerCreating", ""),
            None,
            AppState::Waiting,
            false,
            false,
        ),
    ];
    for (what, instances, w, state, last, app, started, ready) in cases {
        let refs: Vec<&ContainerObservation> = instances.iter().collect();
        let (rec, got) = container_status(&c, &refs, w);
        assert_eq!(rec.state, state, "{what}");
        assert_eq!(rec.last_state, last, "{what}");
        assert_eq!(got, app, "{what}");
        assert_eq!(rec.started, Some(started), "{what}");
        assert_eq!(rec.ready, ready, "{what}");
        assert_eq!(rec.image, "busybox:local", "{what}");
        match instances.first() {
            Some(x) => {
                assert_eq!(rec.container_id, format!("containerd://{}", x.id), "{what}");
                assert_eq!(rec.image_id, "sha256:b", "{what}");
                assert_eq!(rec.restart_count, x.restart_count, "{what}");
            }
            None => {
                assert_eq!(rec.container_id, "", "{what}");
                assert_eq!(rec.restart_count, 0, "{what}");
            }
        }
    }
}

#[test]
fn oom_score_adj_is_shown_and_the_decision_only_when_it_differs() {
    let c = ctr("c");
    for (check, shown, decided) in [
        (None, None, None),
        (Some((-997, Some(-997))), Some(-997), None),
        (Some((-998, Some(-997))), Some(-997), Some(-998)),
        (Some((1000, None)), None, Some(1000)),
    ] {
        let mut x = inst("c", "c1", RUN, 0, 10);
        x.oom_score_adj = check;
        let (rec, _) = container_status(&c, &[&x], None);
        assert_eq!(
            (rec.oom_score_adj, rec.oom_score_adj_decided),
            (shown, decided),
            "{check:?}"
        );
    }
}

fn pod(policy: &str, inits: &[Container], apps: &[&str]) -> Pod {
    let mut p = Pod::default();
    p.metadata.uid = Some("u".to_owned());
    p.metadata.name = Some("p".to_owned());
    p.spec = Some(PodSpec {
        restart_policy: Some(policy.to_owned()),
        init_containers: Some(inits.to_vec()),
        containers: apps.iter().map(|n| ctr(n)).collect(),
        ..Default::default()
    });
    p
}

fn sidecar(name: &str) -> Container {
    Container {
        restart_policy: Some("Always".to_owned()),
        startup_probe: Some(Probe::default()),
        ..ctr(name)
    }
}

fn status(
    p: &Pod,
    containers: Vec<ContainerObservation>,
    waiting: &HashMap<String, (String, String)>,
    init_failed: bool,
) -> PodRecord {
    pod_status(PodStatusInput {
        pod: p,
        uid: "u".to_owned(),
        source: "test".to_owned(),
        message: String::new(),
        qos_class: "BestEffort".to_owned(),
        start_time: rfc3339(S),
        pod_ips: vec!["10.0.0.2".to_owned()],
        sandbox_id: "s".to_owned(),
        cgroup: "/kubepods/podu".to_owned(),
        containers,
        waiting,
        init_failed,
        syncing: true,
    })
}

/// The conditions as (type, status, reason, message).
fn conditions(rec: &PodRecord) -> Vec<(&str, &str, &str, &str)> {
    rec.conditions
        .iter()
        .map(|c| {
            (
                c.kind.as_str(),
                c.status.as_str(),
                c.reason.as_str(),
                c.message.as_str(),
            )
        })
        .collect()
}

/// kubelet's `TestGenerateAPIPodStatus` shapes: phase and conditions from the containers.
#[test]
fn pod_status_table() {
    let none = HashMap::new();
    let unready = |name: &str, id: &str| ContainerObservation {
        ready: false,
        ..inst(name, id, RUN, 0, 10)
    };
    let not_started = |name: &str| ContainerObservation {
        started: false,
        ..inst(name, "side1", RUN, 0, 10)
    };
    #[expect(clippy::type_complexity, reason = "a table")]
    let cases: Vec<(
        &str,
        Pod,
        Vec<ContainerObservation>,
        bool,
        PodPhase,
        [&str; 3],
        &str,
        &str,
    )> = vec![
        (
            "nothing created yet",
            pod("Always", &[], &["a"]),
            vec![],
            false,
            PodPhase::Pending,
            ["True", "True", "False"],
            "ContainersNotReady",
            "containers with unready status: [a]",
        ),
        (
            "all running and ready",
            pod("Always", &[], &["a", "b"]),
            vec![inst("a", "a1", RUN, 0, 10), inst("b", "b1", RUN, 0, 10)],
            false,
            PodPhase::Running,
            ["True", "True", "True"],
            "",
            "",
        ),
        (
            "one not ready",
            pod("Always", &[], &["a", "b"]),
            vec![inst("a", "a1", RUN, 0, 10), unready("b", "b1")],
            false,
            PodPhase::Running,
            ["True", "True", "False"],
            "ContainersNotReady",
            "containers with unready status: [b]",
        ),
        (
            "an init container running: Pending, not initialized",
            pod("Always", &[ctr("i")], &["a"]),
            vec![inst("i", "i1", RUN, 0, 10)],
            false,
            PodPhase::Pending,
            ["True", "False", "False"],
            "ContainersNotReady",
            "containers with unready status: [a]",
        ),
        (
            "a sidecar before its startup probe: not initialized, counted unready",
            pod("Always", &[sidecar("side")], &["a"]),
            vec![not_started("side")],
            false,
            PodPhase::Pending,
            ["True", "False", "False"],
            "ContainersNotReady",
            "containers with unready status: [side a]",
        ),
        (
            "a started sidecar and the app: ready",
            pod("Always", &[sidecar("side"), ctr("i")], &["a"]),
            vec![
                inst("a", "a1", RUN, 0, 12),
                inst("i", "i1", exited(0), 0, 11),
                inst("side", "side1", RUN, 0, 10),
            ],
            false,
            PodPhase::Running,
            ["True", "True", "True"],
            "",
            "",
        ),
        (
            "initialized for good once an app container was created",
            pod("Always", &[ctr("i")], &["a"]),
            vec![inst("a", "a1", RUN, 0, 12), inst("i", "i2", RUN, 1, 13)],
            false,
            PodPhase::Running,
            ["True", "True", "True"],
            "",
            "",
        ),
        (
            "an init container failed under Never",
            pod("Never", &[ctr("i")], &["a"]),
            vec![inst("i", "i1", exited(1), 0, 10)],
            true,
            PodPhase::Failed,
            ["True", "False", "False"],
            "ContainersNotReady",
            "containers with unready status: [a]",
        ),
        (
            "all succeeded: PodCompleted",
            pod("Never", &[], &["a"]),
            vec![inst("a", "a1", exited(0), 0, 10)],
            false,
            PodPhase::Succeeded,
            ["True", "True", "False"],
            "PodCompleted",
            "",
        ),
        (
            "one failed under Never",
            pod("Never", &[], &["a", "b"]),
            vec![
                inst("a", "a1", exited(0), 0, 10),
                inst("b", "b1", exited(3), 0, 10),
            ],
            false,
            PodPhase::Failed,
            ["True", "True", "False"],
            "ContainersNotReady",
            "containers with unready status: [a b]",
        ),
    ];
    for (what, p, containers, init_failed, phase, [started, initialized, ready], reason, message) in
        cases
    {
        let rec = status(&p, containers, &none, init_failed);
        assert_eq!(rec.phase, phase, "{what}");
        assert_eq!(
            conditions(&rec),
            [
                ("PodReadyToStartContainers", started, "", ""),
                ("Initialized", initialized, "", ""),
                ("ContainersReady", ready, reason, message),
                ("Ready", ready, reason, message),
                ("PodScheduled", "True", "", ""),
            ],
            "{what}"
        );
    }
}

#[test]
fn the_record_carries_the_pods_values() {
    let p = pod("Always", &[ctr("i")], &["a"]);
    let reasons = HashMap::from([(
        "a".to_owned(),
        ("CreateContainerConfigError".to_owned(), "no".to_owned()),
    )]);
    let mut input = PodStatusInput {
        pod: &p,
        uid: "u".to_owned(),
        source: "/m/p.yaml".to_owned(),
        message: "pod u: boom".to_owned(),
        qos_class: "Burstable".to_owned(),
        start_time: rfc3339(S),
        pod_ips: vec!["10.0.0.2".to_owned()],
        sandbox_id: "s".to_owned(),
        cgroup: "/kubepods/burstable/podu".to_owned(),
        containers: vec![inst("i", "i1", exited(0), 0, 10)],
        waiting: &reasons,
        init_failed: false,
        syncing: false,
    };
    let rec = pod_status(input.clone());
    assert_eq!(
        (
            rec.uid.as_str(),
            rec.name.as_str(),
            rec.namespace.as_str(),
            rec.source.as_str(),
            rec.message.as_str(),
            rec.qos_class.as_str(),
            rec.start_time.as_str(),
            rec.sandbox_id.as_str(),
            rec.cgroup.as_str(),
        ),
        (
            "u",
            "p",
            "default",
            "/m/p.yaml",
            "pod u: boom",
            "Burstable",
            "1970-01-01T00:00:01Z",
            "s",
            "/kubepods/burstable/podu"
        )
    );
    assert_eq!(rec.pod_ips, ["10.0.0.2"]);
    assert_eq!(rec.reason, "");
    assert_eq!(rec.phase, PodPhase::Pending);
    assert_eq!(
        rec.conditions[0],
        Condition::new("PodReadyToStartContainers", false)
    );
    assert_eq!(rec.init_container_statuses.len(), 1);
    assert_eq!(
        rec.init_container_statuses[0].state,
        terminated(0, "Completed", 10)
    );
    assert_eq!(
        rec.container_statuses[0].state,
        waiting("CreateContainerConfigError", "no")
    );
    // Instances of other sandboxes are the caller's to leave out; names not in the spec
    // are ignored.
    input.containers.push(inst("gone", "g1", RUN, 0, 10));
    assert_eq!(pod_status(input), rec);
}

#[test]
fn a_kernel_oom_kill_names_the_reason_the_runtime_missed() {
    assert_eq!(exit_reason("Error", 137, true), "OOMKilled");
    assert_eq!(exit_reason("OOMKilled", 137, true), "OOMKilled");
    // Not the kernel's kill, or not a SIGKILL exit: the runtime's word stands.
    assert_eq!(exit_reason("Error", 137, false), "Error");
    assert_eq!(exit_reason("Error", 1, true), "Error");
    assert_eq!(exit_reason("Completed", 0, true), "Completed");
}
