//! kubelet's `TerminatePod` tables (`pkg/kubelet/status/status_manager_test.go`) against
//! [`finished`].

use super::*;

fn running_record(uid: &str) -> PodRecord {
    super::tests::running_record(uid)
}

/// kubelet's `TestTerminatePod_DefaultUnknownStatus` (`pkg/kubelet/status/status_manager_test.go`),
/// the rows [`finished`] agrees with: once the pod shows it initialized, a container without a
/// final state ends `ContainerStatusUnknown` (137), a terminated one keeps its state, and a
/// last state is kept; a pod that was running ends Failed; a terminal record is left as it is.
/// (kubelet's empty state with a last state is a container waiting to restart here.)
#[test]
fn kubelets_terminate_pod_default_unknown_status_table() {
    let failed = PodRecord {
        phase: PodPhase::Failed,
        start_time: "1970-01-01T00:00:01Z".to_owned(),
        conditions: Vec::new(),
        container_statuses: Vec::new(),
        ..running_record("12345678")
    };
    assert_eq!(
        finished(failed.clone()),
        failed,
        "a terminal record without containers is kept as it is"
    );
    check_terminate_rows(vec![
        TerminateRow {
            name: "running pod without container statuses",
            phase: PodPhase::Running,
            init: vec![],
            apps: vec![],
            want_init: vec![],
            want_apps: vec![],
            want_phase: Some(PodPhase::Failed),
        },
        TerminateRow {
            name: "running pod with a failed container",
            phase: PodPhase::Running,
            init: vec![],
            apps: vec![(exited(2, "Test"), None)],
            want_init: vec![],
            want_apps: vec![exited(2, "Test")],
            want_phase: Some(PodPhase::Failed),
        },
        TerminateRow {
            name: "last termination state set",
            phase: PodPhase::Running,
            init: vec![],
            apps: vec![(waiting(), Some(exited(2, "Test")))],
            want_init: vec![],
            want_apps: vec![unknown()],
            want_phase: Some(PodPhase::Failed),
        },
        TerminateRow {
            name: "no previous state",
            phase: PodPhase::Running,
            init: vec![],
            apps: vec![(waiting(), None)],
            want_init: vec![],
            want_apps: vec![unknown()],
            want_phase: Some(PodPhase::Failed),
        },
        TerminateRow {
            name: "successful last container is initialized",
            phase: PodPhase::Running,
            init: vec![(waiting(), None), (waiting(), None), (exited(0, ""), None)],
            apps: vec![(waiting(), None)],
            want_init: vec![unknown(), unknown(), exited(0, "")],
            want_apps: vec![unknown()],
            want_phase: Some(PodPhase::Failed),
        },
        TerminateRow {
            name: "successful last previous container is initialized, and container state is overwritten",
            phase: PodPhase::Running,
            init: vec![
                (waiting(), None),
                (waiting(), None),
                (waiting(), Some(exited(0, ""))),
            ],
            apps: vec![(waiting(), None)],
            want_init: vec![unknown(), unknown(), unknown()],
            want_apps: vec![unknown()],
            want_phase: Some(PodPhase::Failed),
        },
        TerminateRow {
            name: "running container proves initialization",
            phase: PodPhase::Running,
            init: vec![(waiting(), None)],
            apps: vec![(running(), None)],
            want_init: vec![unknown()],
            want_apps: vec![unknown()],
            want_phase: Some(PodPhase::Failed),
        },
        TerminateRow {
            name: "evidence of terminated container proves initialization",
            phase: PodPhase::Running,
            init: vec![(waiting(), None)],
            apps: vec![(exited(0, ""), None)],
            want_init: vec![unknown()],
            want_apps: vec![exited(0, "")],
            // kubelet's row does not say; every app container ended 0: Succeeded here.
            want_phase: None,
        },
        TerminateRow {
            name: "evidence of previously terminated container proves initialization",
            phase: PodPhase::Running,
            init: vec![(waiting(), None)],
            apps: vec![(waiting(), Some(exited(0, "")))],
            want_init: vec![unknown()],
            want_apps: vec![unknown()],
            want_phase: Some(PodPhase::Failed),
        },
    ]);
}

/// kubelet's `TerminatePod` where the pod never initialized or was already terminal
/// (`TestTerminatePod`, `TestTerminatePodWaiting` and the uninitialized rows of
/// `TestTerminatePod_DefaultUnknownStatus`): the app containers and the init containers after
/// the last one that started stay waiting; a terminal pod's containers are defaulted all the
/// same, its phase kept; a pod that never initialized ends Failed.
/// (kubelet's empty state is a running container here.)
#[test]
fn kubelets_terminate_pod_keeps_uninitialized_containers_waiting() {
    let waiting_for = |reason: &str| ContainerState::Waiting {
        reason: reason.to_owned(),
        message: String::new(),
    };
    check_terminate_rows(vec![
        TerminateRow {
            name: "uninitialized pod defaults the first init container",
            phase: PodPhase::Pending,
            init: vec![(waiting(), None)],
            apps: vec![(waiting(), None)],
            want_init: vec![unknown()],
            want_apps: vec![waiting()],
            want_phase: Some(PodPhase::Failed),
        },
        TerminateRow {
            name: "uninitialized pod defaults only the first init container",
            phase: PodPhase::Pending,
            init: vec![(waiting(), None), (waiting(), None)],
            apps: vec![(waiting(), None)],
            want_init: vec![unknown(), waiting()],
            want_apps: vec![waiting()],
            want_phase: Some(PodPhase::Failed),
        },
        TerminateRow {
            name: "uninitialized pod defaults gaps",
            phase: PodPhase::Pending,
            init: vec![
                (waiting(), None),
                (waiting(), None),
                (exited(1, ""), None),
                (waiting(), None),
            ],
            apps: vec![(waiting(), None)],
            want_init: vec![unknown(), unknown(), exited(1, ""), waiting()],
            want_apps: vec![waiting()],
            want_phase: Some(PodPhase::Failed),
        },
        TerminateRow {
            name: "failed last container is uninitialized",
            phase: PodPhase::Pending,
            init: vec![(waiting(), None), (waiting(), None), (exited(1, ""), None)],
            apps: vec![(waiting(), None)],
            want_init: vec![unknown(), unknown(), exited(1, "")],
            want_apps: vec![waiting()],
            want_phase: Some(PodPhase::Failed),
        },
        TerminateRow {
            name: "TestTerminatePod",
            phase: PodPhase::Failed,
            init: vec![
                (running(), None),
                (exited(0, "InitTest"), None),
                (exited(3, "InitTest"), None),
            ],
            apps: vec![
                (running(), None),
                (exited(2, "Test"), None),
                (exited(0, "Test"), None),
            ],
            want_init: vec![unknown(), exited(0, "InitTest"), exited(3, "InitTest")],
            want_apps: vec![unknown(), exited(2, "Test"), exited(0, "Test")],
            want_phase: Some(PodPhase::Failed),
        },
        TerminateRow {
            name: "TestTerminatePodWaiting",
            phase: PodPhase::Failed,
            init: vec![
                (running(), None),
                (exited(0, "InitTest"), None),
                (waiting_for("InitTest"), None),
            ],
            apps: vec![
                (running(), None),
                (exited(2, "Test"), None),
                (waiting_for("Test"), None),
            ],
            want_init: vec![unknown(), exited(0, "InitTest"), waiting_for("InitTest")],
            want_apps: vec![unknown(), exited(2, "Test"), unknown()],
            want_phase: Some(PodPhase::Failed),
        },
    ]);
}

/// kubelet's `TerminatePod` state for a container with no final state.
fn unknown() -> ContainerState {
    ContainerState::Terminated {
        exit_code: 137,
        reason: "ContainerStatusUnknown".to_owned(),
        message: "The container could not be located when the pod was terminated".to_owned(),
        started_at: String::new(),
        finished_at: String::new(),
    }
}

/// A container not started yet (kubelet's empty `Waiting`).
fn waiting() -> ContainerState {
    ContainerState::Waiting {
        reason: String::new(),
        message: String::new(),
    }
}

/// A running container.
fn running() -> ContainerState {
    ContainerState::Running {
        started_at: String::new(),
    }
}

/// A container that exited with `exit_code`.
fn exited(exit_code: i32, reason: &str) -> ContainerState {
    ContainerState::Terminated {
        exit_code,
        reason: reason.to_owned(),
        message: String::new(),
        started_at: String::new(),
        finished_at: String::new(),
    }
}

/// A container's state and its last state.
type States = (ContainerState, Option<ContainerState>);

/// Container statuses named `{prefix}0`, `{prefix}1`, ... (kubelet's `init-0` and `0`).
fn named(prefix: &str, states: Vec<States>) -> Vec<ContainerRecord> {
    states
        .into_iter()
        .enumerate()
        .map(|(i, (state, last_state))| {
            let started = matches!(state, ContainerState::Running { .. });
            ContainerRecord {
                name: format!("{prefix}{i}"),
                container_id: String::new(),
                image: "busybox:local".to_owned(),
                image_id: String::new(),
                ready: false,
                started: Some(started),
                restart_count: 0,
                state,
                last_state,
                oom_score_adj: None,
                oom_score_adj_decided: None,
                resources: Default::default(),
            }
        })
        .collect()
}

/// One row of kubelet's `TerminatePod` tests: the pod's phase and container states before,
/// the states and phase after.
struct TerminateRow {
    name: &'static str,
    phase: PodPhase,
    init: Vec<States>,
    apps: Vec<States>,
    want_init: Vec<ContainerState>,
    want_apps: Vec<ContainerState>,
    /// `None` where kubelet's row does not say.
    want_phase: Option<PodPhase>,
}

/// Runs [`finished`] on each row's record (kubelet's `newPod`: started at 1 s, no
/// conditions) and checks the container states, the phase, the start time, and that a last
/// termination state is kept.
fn check_terminate_rows(rows: Vec<TerminateRow>) {
    fn states(cs: &[ContainerRecord]) -> Vec<ContainerState> {
        cs.iter().map(|c| c.state.clone()).collect()
    }
    for row in rows {
        let name = row.name;
        let rec = PodRecord {
            phase: row.phase,
            start_time: "1970-01-01T00:00:01Z".to_owned(),
            conditions: Vec::new(),
            init_container_statuses: named("init-", row.init),
            container_statuses: named("", row.apps),
            ..running_record("12345678")
        };
        let got = finished(rec.clone());
        assert_eq!(
            states(&got.init_container_statuses),
            row.want_init,
            "{name}: init containers"
        );
        assert_eq!(
            states(&got.container_statuses),
            row.want_apps,
            "{name}: containers"
        );
        if let Some(phase) = row.want_phase {
            assert_eq!(got.phase, phase, "{name}: phase");
        }
        assert_eq!(got.start_time, rec.start_time, "{name}: start time");
        let before = rec
            .init_container_statuses
            .iter()
            .chain(&rec.container_statuses);
        let after = got
            .init_container_statuses
            .iter()
            .chain(&got.container_statuses);
        for (b, a) in before.zip(after) {
            if b.last_state.is_some() {
                assert_eq!(a.last_state, b.last_state, "{name}: {}: last state", b.name);
            }
        }
    }
}
