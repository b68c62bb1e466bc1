//! The status records the pod loop and the pod workers start from or end with: a pod's blank
//! record (identity, source, QoS class, phase), the Failed record of a pod admission rejected
//! (kubelet's `rejectPod`) or the eviction manager evicted, and the status kubelet leaves on
//! an evicted pod (`pkg/kubelet/eviction`'s `Evicted` status with the `DisruptionTarget`
//! condition, the containers' terminated states kept).

use k8s_openapi::api::core::v1::Pod;

use crate::{
    cri::spec,
    status_manager::{self, PodPhase, PodRecord},
};

/// The status of a pod admission rejected or the eviction manager evicted: phase Failed.
pub(super) fn failed_record(pod: &Pod, source: &str, reason: &str, message: String) -> PodRecord {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    PodRecord {
        reason: reason.to_owned(),
        message,
        ..blank_record(pod, &uid, source, PodPhase::Failed)
    }
}

/// kubelet's `DisruptionTarget` condition reason for a pod the node evicted.
pub const DISRUPTION_TARGET_REASON: &str = "TerminationByKubelet";

/// The status kubelet leaves on a pod it evicted: `evicted` (phase `Failed`, reason `Evicted`,
/// the eviction message) with the containers' terminated states of the pod's `last` status
/// kept (one without a final state `ContainerStatusUnknown`, as kubelet's `TerminatePod`),
/// the source of `last` where `evicted` has none, nothing ready, and, with `disruption_target` (threshold evictions; not local storage
/// limit evictions, for which kubelet passes no condition), the `DisruptionTarget` condition
/// (reason `TerminationByKubelet`, the eviction message).
#[must_use]
pub fn evicted_status(
    evicted: PodRecord,
    last: Option<PodRecord>,
    disruption_target: bool,
) -> PodRecord {
    let mut rec = evicted;
    if let Some(last) = last {
        if rec.source.is_empty() {
            rec.source = last.source;
        }
        rec.start_time = last.start_time;
        rec.pod_ips = last.pod_ips;
        rec.sandbox_id = last.sandbox_id;
        rec.cgroup = last.cgroup;
        rec.init_container_statuses = last.init_container_statuses;
        rec.container_statuses = last.container_statuses;
        rec.conditions = last.conditions;
    }
    for c in rec
        .container_statuses
        .iter_mut()
        .chain(rec.init_container_statuses.iter_mut())
    {
        // Set once the worker ended: a container its last status still shows running (the
        // final states could not be read) is not, any more.
        c.terminated_unknown();
        c.started = Some(false);
    }
    rec.conditions.retain(|c| c.kind != "DisruptionTarget");
    for c in &mut rec.conditions {
        if matches!(
            c.kind.as_str(),
            "Ready" | "ContainersReady" | "PodReadyToStartContainers"
        ) {
            c.status = "False".to_owned();
        }
    }
    if disruption_target {
        // A preempted pod's condition says why in kubelet's words; an evicted pod's repeats
        // the eviction message.
        let message = if rec.reason == crate::policy::preemption::REASON {
            crate::policy::preemption::CONDITION_MESSAGE.to_owned()
        } else {
            rec.message.clone()
        };
        rec.conditions.push(status_manager::Condition {
            reason: DISRUPTION_TARGET_REASON.to_owned(),
            message,
            ..crate::status_manager::Condition::new("DisruptionTarget", true)
        });
    }
    rec
}

/// A pod's status record with only its identity, source, QoS class and phase set.
pub(crate) fn blank_record(pod: &Pod, uid: &str, source: &str, phase: PodPhase) -> PodRecord {
    let id = spec::PodIdent::of(pod);
    PodRecord {
        uid: uid.to_owned(),
        name: id.name,
        namespace: id.namespace,
        source: source.to_owned(),
        phase,
        reason: String::new(),
        message: String::new(),
        qos_class: spec::pod_qos(pod).as_str().to_owned(),
        start_time: String::new(),
        pod_ips: Vec::new(),
        sandbox_id: String::new(),
        cgroup: String::new(),
        conditions: Vec::new(),
        init_container_statuses: Vec::new(),
        container_statuses: Vec::new(),
        resources: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pod's one container, ready, in `state`.
    fn app_container(
        state: status_manager::ContainerState,
        started: bool,
    ) -> status_manager::ContainerRecord {
        status_manager::ContainerRecord {
            name: "app".to_owned(),
            container_id: "containerd://abc".to_owned(),
            image: "busybox:local".to_owned(),
            image_id: String::new(),
            ready: true,
            started: Some(started),
            restart_count: 0,
            state,
            last_state: None,
            oom_score_adj: None,
            oom_score_adj_decided: None,
            resources: Default::default(),
        }
    }

    /// kubelet's evicted pod status: Failed/Evicted with the message, the containers'
    /// terminated states kept (not emptied), nothing ready, and DisruptionTarget.
    #[test]
    fn evicted_status_keeps_container_states_and_adds_disruption_target() {
        let pod: Pod = serde_yaml_ng::from_str(
            "metadata: {name: p, uid: u1}\nspec: {containers: [{name: app, image: 'busybox:local'}]}",
        )
        .expect("pod");
        let evicted = failed_record(
            &pod,
            "f.yaml",
            "Evicted",
            "The node was low on resource: memory. ".to_owned(),
        );
        let terminated = status_manager::ContainerState::Terminated {
            exit_code: 137,
            reason: "Error".to_owned(),
            message: String::new(),
            started_at: "t0".to_owned(),
            finished_at: "t1".to_owned(),
        };
        let last = PodRecord {
            phase: PodPhase::Terminating,
            start_time: "t0".to_owned(),
            conditions: vec![
                status_manager::Condition::new("Initialized", true),
                status_manager::Condition::new("Ready", true),
                status_manager::Condition::new("ContainersReady", true),
                status_manager::Condition::new("PodScheduled", true),
            ],
            container_statuses: vec![app_container(terminated.clone(), false)],
            ..blank_record(&pod, "u1", "f.yaml", PodPhase::Running)
        };
        let local = evicted_status(evicted.clone(), Some(last.clone()), false);
        assert!(
            !local
                .conditions
                .iter()
                .any(|c| c.kind == "DisruptionTarget")
        );
        let rec = evicted_status(evicted.clone(), Some(last), true);
        assert_eq!(
            (rec.phase.as_str(), rec.reason.as_str()),
            ("Failed", "Evicted")
        );
        assert_eq!(rec.message, "The node was low on resource: memory. ");
        assert_eq!(rec.start_time, "t0");
        assert_eq!(rec.container_statuses.len(), 1);
        assert_eq!(rec.container_statuses[0].state, terminated);
        assert!(!rec.container_statuses[0].ready);
        let cond = |k: &str| rec.conditions.iter().find(|c| c.kind == k).cloned();
        assert_eq!(cond("Ready").map(|c| c.status).as_deref(), Some("False"));
        assert_eq!(
            cond("ContainersReady").map(|c| c.status).as_deref(),
            Some("False")
        );
        assert_eq!(
            cond("Initialized").map(|c| c.status).as_deref(),
            Some("True")
        );
        let dt = cond("DisruptionTarget").expect("DisruptionTarget");
        assert_eq!(
            (dt.status.as_str(), dt.reason.as_str(), dt.message.as_str()),
            (
                "True",
                "TerminationByKubelet",
                "The node was low on resource: memory. "
            )
        );
        // Without a last status (the worker could not read it) the condition is still there,
        // and applying it twice keeps one DisruptionTarget.
        let bare = evicted_status(evicted_status(evicted, None, true), None, true);
        assert_eq!(
            bare.conditions
                .iter()
                .filter(|c| c.kind == "DisruptionTarget")
                .count(),
            1
        );
    }

    /// The lost `Evicted` status (`apiserver::eviction_reaches_the_api_within_a_second`
    /// failed so once): an eviction taken before the worker published anything had no source,
    /// and the API writer, which takes the `api` source's records only, never saw it; and a
    /// last status whose final container states could not be read left a container
    /// running in the Failed record, which the writer took for a pod that could still run
    /// (the phase held back). The source now comes from the worker's pod and `last`; a
    /// container with no final state is `ContainerStatusUnknown` (137).
    #[test]
    fn an_evicted_status_keeps_its_source_and_runs_no_container() {
        let pod: Pod = serde_yaml_ng::from_str(
            "metadata: {name: p, uid: u1}\nspec: {containers: [{name: app, image: 'busybox:local'}]}",
        )
        .expect("pod");
        let evicted = failed_record(&pod, "", "Evicted", "low on memory".to_owned());
        let running = status_manager::ContainerState::Running {
            started_at: "t0".to_owned(),
        };
        let last = PodRecord {
            phase: PodPhase::Terminating,
            container_statuses: vec![app_container(running.clone(), true)],
            ..blank_record(&pod, "u1", "api", PodPhase::Running)
        };
        let rec = evicted_status(evicted.clone(), Some(last), true);
        assert_eq!(rec.source, "api", "the source of the pod's last status");
        let c = &rec.container_statuses[0];
        assert!(
            matches!(&c.state, status_manager::ContainerState::Terminated { exit_code: 137, reason, .. } if reason == "ContainerStatusUnknown"),
            "{:?}",
            c.state
        );
        assert_eq!(
            c.last_state, None,
            "the last state left as kubelet leaves it"
        );
        assert!(!c.ready);
        // A source given with the eviction is kept.
        let given = failed_record(&pod, "api", "Evicted", "m".to_owned());
        assert_eq!(evicted_status(given, None, true).source, "api");
    }
}
