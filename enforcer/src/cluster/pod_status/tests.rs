use super::*;
use crate::{
    cluster::fake::{Call, FakeApi},
    status_manager::Condition,
};

fn t(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("time"))
}

pub(super) fn running_record(uid: &str) -> PodRecord {
    PodRecord {
        uid: uid.to_owned(),
        name: "web".to_owned(),
        namespace: "default".to_owned(),
        source: API_SOURCE.to_owned(),
        phase: PodPhase::Running,
        reason: String::new(),
        message: String::new(),
        qos_class: "Burstable".to_owned(),
        start_time: "2026-01-01T00:00:00Z".to_owned(),
        pod_ips: vec![],
        sandbox_id: "s".to_owned(),
        cgroup: String::new(),
        conditions: vec![
            Condition::new("PodReadyToStartContainers", true),
            Condition::new("Initialized", true),
            Condition::new("ContainersReady", true),
            Condition::new("Ready", true),
            Condition::new("PodScheduled", true),
        ],
        init_container_statuses: vec![],
        container_statuses: vec![ContainerRecord {
            name: "app".to_owned(),
            container_id: "containerd://abc".to_owned(),
            image: "busybox:local".to_owned(),
            image_id: "sha256:1".to_owned(),
            ready: true,
            started: Some(true),
            restart_count: 1,
            state: ContainerState::Running {
                started_at: "2026-01-01T00:00:01Z".to_owned(),
            },
            last_state: Some(ContainerState::Terminated {
                exit_code: 137,
                reason: "OOMKilled".to_owned(),
                message: String::new(),
                started_at: "2026-01-01T00:00:00Z".to_owned(),
                finished_at: "2026-01-01T00:00:01Z".to_owned(),
            }),
            oom_score_adj: None,
            oom_score_adj_decided: None,
            resources: Default::default(),
        }],
        resources: Default::default(),
    }
}

#[test]
fn a_record_as_api_status() {
    let s = api_status(&running_record("u"), Some("10.0.0.5"), true);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(s.qos_class.as_deref(), Some("Burstable"));
    assert_eq!(s.host_ip.as_deref(), Some("10.0.0.5"));
    assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.5"), "host network");
    assert_eq!(s.start_time, Some(t(1_767_225_600)));
    let c = &s.container_statuses.as_ref().expect("statuses")[0];
    assert_eq!(c.container_id.as_deref(), Some("containerd://abc"));
    assert_eq!(c.image_id, "sha256:1");
    assert_eq!(c.restart_count, 1);
    assert_eq!(c.started, Some(true));
    let last = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("last terminated");
    assert_eq!(
        (last.exit_code, last.reason.as_deref()),
        (137, Some("OOMKilled"))
    );
    let s = api_status(&running_record("u"), Some("10.0.0.5"), false);
    assert_eq!(s.pod_ip, None, "a pod network address is not the host's");
    let mut rec = running_record("u");
    rec.pod_ips = vec!["10.88.0.7".to_owned()];
    let s = api_status(&rec, Some("10.0.0.5"), false);
    assert_eq!(s.pod_ip.as_deref(), Some("10.88.0.7"));
    assert_eq!(s.pod_ips.map(|v| v.len()), Some(1));
}

#[test]
fn merge_keeps_foreign_conditions_times_and_terminal_phases() {
    let mut old = PodStatus {
        phase: Some("Running".to_owned()),
        conditions: Some(vec![
            PodCondition {
                type_: "Ready".to_owned(),
                status: "True".to_owned(),
                last_transition_time: Some(t(5)),
                ..PodCondition::default()
            },
            PodCondition {
                type_: "example.com/Gate".to_owned(),
                status: "True".to_owned(),
                ..PodCondition::default()
            },
        ]),
        ..PodStatus::default()
    };
    let new = api_status(&running_record("u"), None, false);
    let merged = merge(&old, new.clone(), true, &t(9));
    let cond = |s: &PodStatus, k: &str| {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == k)
            .cloned()
    };
    assert_eq!(
        cond(&merged, "Ready").and_then(|c| c.last_transition_time),
        Some(t(5)),
        "unchanged: its time is kept"
    );
    assert_eq!(
        cond(&merged, "Initialized").and_then(|c| c.last_transition_time),
        Some(t(9))
    );
    assert!(cond(&merged, "example.com/Gate").is_some(), "not kubelet's");
    // Merging again changes nothing: no write.
    assert_eq!(merge(&merged, new.clone(), true, &t(20)), merged);
    // Terminal is never reverted.
    old.phase = Some("Failed".to_owned());
    old.reason = Some("Evicted".to_owned());
    let merged = merge(&old, new, true, &t(9));
    assert_eq!(merged.phase.as_deref(), Some("Failed"));
    assert_eq!(merged.reason.as_deref(), Some("Evicted"));
}

/// The resize conditions are kubelet's: written while the record has them, removed with
/// it once the resize is done.
#[test]
fn resize_conditions_come_and_go_with_the_record() {
    let mut rec = running_record("u");
    rec.conditions.push(crate::policy::pod_status::Condition {
        kind: "PodResizePending".to_owned(),
        status: "True".to_owned(),
        reason: "Deferred".to_owned(),
        message: "Node didn't have enough resource: memory".to_owned(),
    });
    let pending = merge(
        &PodStatus::default(),
        api_status(&rec, None, false),
        true,
        &t(1),
    );
    let has = |s: &PodStatus| {
        s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "PodResizePending" && c.reason.as_deref() == Some("Deferred"))
    };
    assert!(has(&pending));
    let done = merge(
        &pending,
        api_status(&running_record("u"), None, false),
        true,
        &t(2),
    );
    assert!(!has(&done), "removed once the record no longer has it");
}

#[test]
fn disruption_target_only_when_terminal_and_stopped() {
    let old = PodStatus {
        phase: Some("Running".to_owned()),
        ..PodStatus::default()
    };
    let mut rec = finished(running_record("u"));
    rec.phase = PodPhase::Failed;
    rec.reason = "Evicted".to_owned();
    rec.conditions.push(Condition {
        reason: "TerminationByKubelet".to_owned(),
        message: "The node was low on resource: memory. ".to_owned(),
        ..Condition::new("DisruptionTarget", true)
    });
    let new = api_status(&rec, None, false);
    let early = merge(&old, new.clone(), true, &t(1));
    assert_eq!(
        early.phase.as_deref(),
        Some("Running"),
        "containers may run"
    );
    assert!(
        !early
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "DisruptionTarget")
    );
    let done = merge(&old, new, false, &t(1));
    assert_eq!(done.phase.as_deref(), Some("Failed"));
    assert_eq!(done.reason.as_deref(), Some("Evicted"));
    let dt = done
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("DisruptionTarget");
    assert_eq!(dt.reason.as_deref(), Some("TerminationByKubelet"));
    assert!(
        done.conditions
            .iter()
            .flatten()
            .filter(|c| c.type_ == "Ready")
            .all(|c| c.status == "False")
    );
}

#[test]
fn finished_pods_get_kubelets_terminal_phase() {
    let mut rec = running_record("u");
    rec.phase = PodPhase::Terminating;
    rec.container_statuses[0].state = completed();
    assert_eq!(finished(rec.clone()).phase, PodPhase::Succeeded);
    rec.container_statuses[0].state = ContainerState::Running {
        started_at: String::new(),
    };
    let f = finished(rec);
    assert_eq!(f.phase, PodPhase::Failed);
    assert!(matches!(
        &f.container_statuses[0].state,
        ContainerState::Terminated { exit_code: 137, reason, .. } if reason == "ContainerStatusUnknown"
    ));
}

/// kubelet's `TestMergePodStatus` (`pkg/kubelet/status/status_manager_test.go`), every row:
/// `mergePodStatus(old, new, couldHaveRunningContainers)` from its `getPodStatus()` base
/// (Running, Ready and PodScheduled true, message "Message"), conditions compared as its
/// `conditionsEqual` does (by type: status and reason, in any order).
#[test]
fn kubelets_merge_pod_status_table() {
    fn cond(t: &str, status: &str, reason: Option<&str>) -> PodCondition {
        PodCondition {
            type_: t.to_owned(),
            status: status.to_owned(),
            reason: reason.map(str::to_owned),
            ..PodCondition::default()
        }
    }
    fn base() -> PodStatus {
        PodStatus {
            phase: Some("Running".to_owned()),
            conditions: Some(vec![
                cond("Ready", "True", None),
                cond("PodScheduled", "True", None),
            ]),
            message: Some("Message".to_owned()),
            ..PodStatus::default()
        }
    }
    let with = |f: &dyn Fn(&mut PodStatus)| {
        let mut s = base();
        f(&mut s);
        s
    };
    let add = |c: PodCondition| {
        move |s: &mut PodStatus| s.conditions.get_or_insert_with(Vec::new).push(c.clone())
    };
    let dt = |reason: &str| cond("DisruptionTarget", "True", Some(reason));
    let failed = |s: &mut PodStatus| s.phase = Some("Failed".to_owned());
    let not_ready = |s: &mut PodStatus| {
        for c in s.conditions.iter_mut().flatten() {
            if c.type_ == "Ready" {
                c.status = "False".to_owned();
            }
        }
    };
    let both = |a: &dyn Fn(&mut PodStatus), b: &dyn Fn(&mut PodStatus)| {
        with(&|s: &mut PodStatus| {
            a(s);
            b(s);
        })
    };
    let feature = cond("example.com/feature", "True", None);
    let evicting = |s: &mut PodStatus| {
        s.phase = Some("Failed".to_owned());
        s.reason = Some("Evicted".to_owned());
        s.message = Some("Was Evicted".to_owned());
    };
    let unknown = |s: &mut PodStatus| s.reason = Some("Unknown".to_owned());
    let ready_false_failed = [
        cond("Ready", "False", Some("PodFailed")),
        cond("ContainersReady", "False", Some("PodFailed")),
        cond("PodScheduled", "True", None),
    ];
    // (name, couldHaveRunningContainers, old, new, expected phase, reason, message, conditions)
    type Row = (
        &'static str,
        bool,
        PodStatus,
        PodStatus,
        &'static str,
        Option<&'static str>,
        &'static str,
        Vec<PodCondition>,
    );
    let rows: Vec<Row> = vec![
        (
            "no change",
            false,
            base(),
            base(),
            "Running",
            None,
            "Message",
            base().conditions.unwrap_or_default(),
        ),
        (
            "add DisruptionTarget condition when transitioning into failed phase",
            false,
            base(),
            both(&failed, &add(dt("TerminationByKubelet"))),
            "Failed",
            None,
            "Message",
            [
                ready_false_failed.to_vec(),
                vec![dt("TerminationByKubelet")],
            ]
            .concat(),
        ),
        (
            "don't add DisruptionTarget condition when transitioning into failed phase, but there might still be running containers",
            true,
            base(),
            both(&failed, &add(dt("TerminationByKubelet"))),
            "Running",
            None,
            "Message",
            base().conditions.unwrap_or_default(),
        ),
        (
            "preserve DisruptionTarget condition",
            false,
            with(&add(dt("TerminationByKubelet"))),
            base(),
            "Running",
            None,
            "Message",
            [
                base().conditions.unwrap_or_default(),
                vec![dt("TerminationByKubelet")],
            ]
            .concat(),
        ),
        (
            "override DisruptionTarget condition",
            false,
            with(&add(dt("EvictedByEvictionAPI"))),
            both(&failed, &add(dt("TerminationByKubelet"))),
            "Failed",
            None,
            "Message",
            [
                ready_false_failed.to_vec(),
                vec![dt("TerminationByKubelet")],
            ]
            .concat(),
        ),
        (
            "don't override DisruptionTarget condition when remaining in running phase",
            false,
            with(&add(dt("EvictedByEvictionAPI"))),
            with(&add(dt("TerminationByKubelet"))),
            "Running",
            None,
            "Message",
            [
                base().conditions.unwrap_or_default(),
                vec![dt("EvictedByEvictionAPI")],
            ]
            .concat(),
        ),
        (
            "don't override DisruptionTarget condition when transitioning to failed phase but there might still be running containers",
            true,
            with(&add(dt("EvictedByEvictionAPI"))),
            both(&failed, &add(dt("TerminationByKubelet"))),
            "Running",
            None,
            "Message",
            [
                base().conditions.unwrap_or_default(),
                vec![dt("EvictedByEvictionAPI")],
            ]
            .concat(),
        ),
        (
            "readiness changes",
            false,
            base(),
            with(&not_ready),
            "Running",
            None,
            "Message",
            vec![
                cond("Ready", "False", None),
                cond("PodScheduled", "True", None),
            ],
        ),
        (
            "additional pod condition",
            false,
            with(&add(feature.clone())),
            base(),
            "Running",
            None,
            "Message",
            [base().conditions.unwrap_or_default(), vec![feature.clone()]].concat(),
        ),
        (
            "additional pod condition and readiness changes",
            false,
            with(&add(feature.clone())),
            with(&not_ready),
            "Running",
            None,
            "Message",
            vec![
                cond("Ready", "False", None),
                cond("PodScheduled", "True", None),
                feature.clone(),
            ],
        ),
        (
            "additional pod condition changes",
            false,
            with(&add(feature.clone())),
            with(&add(cond("example.com/feature", "False", None))),
            "Running",
            None,
            "Message",
            [base().conditions.unwrap_or_default(), vec![feature.clone()]].concat(),
        ),
        (
            "phase is transitioning to failed and no containers running",
            false,
            with(&unknown),
            with(&evicting),
            "Failed",
            Some("Evicted"),
            "Was Evicted",
            ready_false_failed.to_vec(),
        ),
        (
            "phase is transitioning to failed and containers running",
            true,
            with(&unknown),
            with(&evicting),
            "Running",
            Some("Unknown"),
            "Message",
            base().conditions.unwrap_or_default(),
        ),
    ];
    let key = |c: &[PodCondition]| {
        let mut v: Vec<(String, String, Option<String>)> = c
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect();
        v.sort();
        v
    };
    for (name, running, old, new, phase, reason, message, conditions) in rows {
        let got = merge(&old, new, running, &t(100));
        assert_eq!(got.phase.as_deref(), Some(phase), "{name}");
        assert_eq!(got.reason.as_deref(), reason, "{name}");
        assert_eq!(got.message.as_deref(), Some(message), "{name}");
        assert_eq!(
            key(&got.conditions.unwrap_or_default()),
            key(&conditions),
            "{name}"
        );
    }
}

fn api_pod(uid: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": uid, "resourceVersion": "1"},
        "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": "busybox:local"}]},
        "status": {"phase": "Pending"}
    }))
    .expect("pod")
}

/// Sent when changed only; a 409 is retried on a fresh GET; the final status of a pod being
/// deleted goes out, then the delete with grace 0.
#[tokio::test(start_paused = true)]
async fn sends_changes_retries_conflicts_and_completes_deletion() {
    let api = Arc::new(FakeApi::default());
    api.add_pod(api_pod("u1"));
    let status = StatusManager::default();
    let task = tokio::spawn(run(
        api.clone(),
        status.clone(),
        Some("10.0.0.5".to_owned()),
        None,
        None,
    ));
    tokio::time::sleep(Duration::from_millis(1)).await;
    status.set(running_record("u1"));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(api.count(|c| matches!(c, Call::PatchPodStatus(_))), 1);
    assert_eq!(
        api.pod("u1")
            .and_then(|p| p.status)
            .and_then(|s| s.phase)
            .as_deref(),
        Some("Running")
    );
    // The same status again: nothing sent, nor read back, even at the resync.
    let gets = api.count(|c| matches!(c, Call::GetPod));
    status.set(running_record("u1"));
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(api.count(|c| matches!(c, Call::PatchPodStatus(_))), 1);
    assert_eq!(api.count(|c| matches!(c, Call::GetPod)), gets);
    // A conflict: read again, sent again.
    api.conflict_next(1);
    let mut rec = running_record("u1");
    rec.container_statuses[0].restart_count = 2;
    status.set(rec.clone());
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(api.count(|c| matches!(c, Call::Conflict)), 1);
    assert_eq!(api.count(|c| matches!(c, Call::PatchPodStatus(_))), 2);
    // Graceful deletion: the worker terminates, the final status is sent, then DELETE.
    api.mark_deleting("u1");
    rec.phase = PodPhase::Terminating;
    rec.container_statuses[0].state = completed();
    status.set(rec);
    status.remove("u1");
    tokio::time::sleep(Duration::from_millis(1)).await;
    let last = api.phases_patched().pop().expect("a final status");
    assert_eq!(last.as_str(), "Succeeded");
    // kubelet's `PatchPodStatus`: each patch carries the pod's uid as its precondition.
    assert!(
        api.patches().iter().all(|p| p["metadata"]["uid"] == "u1"),
        "{:?}",
        api.patches()
    );
    assert_eq!(api.count(|c| matches!(c, Call::DeletePod(_))), 1);
    assert!(api.pod("u1").is_none());
    task.abort();
}

/// A pod missing from the API when its status changed (a mirror pod not created yet) gets
/// it at the next resync once it is there.
#[tokio::test(start_paused = true)]
async fn a_pod_missing_from_the_api_is_tried_again_at_the_resync() {
    let api = Arc::new(FakeApi::default());
    let status = StatusManager::default();
    let task = tokio::spawn(run(api.clone(), status.clone(), None, None, None));
    tokio::time::sleep(Duration::from_millis(1)).await;
    status.set(running_record("u1"));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(api.count(|c| matches!(c, Call::GetPod)), 1);
    api.add_pod(api_pod("u1"));
    tokio::time::sleep(RESYNC).await;
    assert_eq!(
        api.pod("u1")
            .and_then(|p| p.status)
            .and_then(|s| s.phase)
            .as_deref(),
        Some("Running")
    );
    task.abort();
}

/// The API server gone: statuses queue (the newest wins) and are delivered when it answers.
#[tokio::test(start_paused = true)]
async fn statuses_wait_for_the_api_server_newest_wins() {
    let api = Arc::new(FakeApi::default());
    api.add_pod(api_pod("u1"));
    api.set_down(true);
    let status = StatusManager::default();
    let task = tokio::spawn(run(api.clone(), status.clone(), None, None, None));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let mut rec = running_record("u1");
    status.set(rec.clone());
    rec.phase = PodPhase::Failed;
    rec.reason = "Evicted".to_owned();
    rec.container_statuses[0].state = ContainerState::Terminated {
        exit_code: 137,
        reason: "Error".to_owned(),
        message: String::new(),
        started_at: String::new(),
        finished_at: String::new(),
    };
    status.set(rec);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(api.count(|c| matches!(c, Call::PatchPodStatus(_))), 0);
    api.set_down(false);
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(api.phases_patched(), ["Failed"], "only the newest status");
    task.abort();
}

/// kubelet's `needsReconcile`: at the resync, a delivered status whose API copy (as the pod
/// watch shows it) another writer changed in a field the node owns is patched back; a change
/// of a condition the node does not own is left alone.
#[tokio::test(start_paused = true)]
async fn a_status_another_writer_changed_is_put_back_at_the_resync() {
    let api = Arc::new(FakeApi::default());
    api.add_pod(api_pod("u1"));
    let status = StatusManager::default();
    let task = tokio::spawn(run(api.clone(), status.clone(), None, None, None));
    tokio::time::sleep(Duration::from_millis(1)).await;
    status.set(running_record("u1"));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(api.patches().len(), 1);
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone())
    };
    // Another writer: a condition the node does not own. The watch shows it; nothing is sent.
    let mut pod = api.pod("u1").expect("pod");
    let conditions = pod
        .status
        .as_mut()
        .and_then(|s| s.conditions.as_mut())
        .expect("conditions");
    conditions.push(PodCondition {
        type_: "example.com/gate".to_owned(),
        status: "True".to_owned(),
        ..PodCondition::default()
    });
    api.add_pod(pod.clone());
    status.api_seen("u1", pod.status.clone());
    tokio::time::sleep(RESYNC).await;
    assert_eq!(api.patches().len(), 1, "{:?}", api.patches());
    // Another writer turns Ready false: put back at the next resync, the gate kept.
    for c in pod
        .status
        .as_mut()
        .and_then(|s| s.conditions.as_mut())
        .expect("conditions")
    {
        if c.type_ == "Ready" {
            c.status = "False".to_owned();
        }
    }
    api.add_pod(pod.clone());
    status.api_seen("u1", pod.status.clone());
    tokio::time::sleep(RESYNC).await;
    assert_eq!(api.patches().len(), 2, "{:?}", api.patches());
    let now = api.pod("u1").expect("pod");
    assert_eq!(ready(&now).as_deref(), Some("True"));
    assert!(
        now.status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "example.com/gate")),
        "the other writer's condition is kept"
    );
    task.abort();
}

/// A terminal record whose containers could still run: `mergePodStatus` holds the phase
/// back, and the record is not taken as delivered: once the pod's worker terminated (its
/// record removed) the final phase goes out.
#[tokio::test(start_paused = true)]
async fn a_phase_held_back_is_sent_once_the_containers_cannot_run() {
    let api = Arc::new(FakeApi::default());
    api.add_pod(api_pod("u1"));
    let status = StatusManager::default();
    let task = tokio::spawn(run(api.clone(), status.clone(), None, None, None));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let mut rec = running_record("u1");
    rec.phase = PodPhase::Failed;
    rec.reason = "Evicted".to_owned();
    status.set(rec);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let phase = || {
        api.pod("u1")
            .and_then(|p| p.status)
            .and_then(|s| s.phase)
            .unwrap_or_default()
    };
    assert_eq!(phase(), "Pending", "held while the container could run");
    status.remove("u1");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(phase(), "Failed");
    task.abort();
}

/// A container that exited 0 (`Completed`).
fn completed() -> ContainerState {
    ContainerState::Terminated {
        exit_code: 0,
        reason: "Completed".to_owned(),
        message: String::new(),
        started_at: String::new(),
        finished_at: String::new(),
    }
}
