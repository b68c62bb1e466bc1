//! Making a companion's eviction known as kubelet makes its own: the pod's status in the API
//! server (phase `Failed`, reason `Evicted`, kubelet's message, nothing ready, the
//! `DisruptionTarget` condition), so kubelet treats the pod as terminal (it does not restart it
//! in place) and its controller replaces it. The `Evicted` event goes through the node's event
//! writer like every other.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{Pod, PodCondition},
    apimachinery::pkg::apis::meta::v1::Time,
};

use crate::{
    cluster::{ClusterApi, ClusterError},
    pods::records::DISRUPTION_TARGET_REASON,
    policy::eviction::manager::REASON,
};

/// How many times a status patch is tried in a row (then the report waits
/// [`RETRY_AFTER_FAILURE`] in the outbox and is tried again).
const ATTEMPTS: u32 = 8;

/// The strategic merge patch of `pods/{name}/status` kubelet's eviction amounts to, over the
/// pod's status as the API has it: phase `Failed`, reason `Evicted`, `message`, `Ready` and
/// `ContainersReady` false, and with `disruption_target` the `DisruptionTarget` condition
/// (reason `TerminationByKubelet`, the message): the two-way patch from the API's status,
/// the pod's uid as precondition (kubelet's `PatchPodStatus`).
#[must_use]
pub fn status_patch(
    pod: &Pod,
    message: &str,
    disruption_target: bool,
    now: &Time,
) -> serde_json::Value {
    let mut conditions: Vec<PodCondition> = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let mut set = |kind: &str, status: &str, reason: &str, message: &str| {
        let changed = |c: &PodCondition| c.status != status;
        match conditions.iter_mut().find(|c| c.type_ == kind) {
            Some(c) => {
                if changed(c) {
                    c.last_transition_time = Some(now.clone());
                }
                c.status = status.to_owned();
                c.reason = Some(reason.to_owned());
                c.message = (!message.is_empty()).then(|| message.to_owned());
            }
            None => conditions.push(PodCondition {
                type_: kind.to_owned(),
                status: status.to_owned(),
                reason: Some(reason.to_owned()),
                message: (!message.is_empty()).then(|| message.to_owned()),
                last_transition_time: Some(now.clone()),
                ..PodCondition::default()
            }),
        }
    };
    set("Ready", "False", "PodFailed", "");
    set("ContainersReady", "False", "PodFailed", "");
    if disruption_target {
        set(
            "DisruptionTarget",
            "True",
            DISRUPTION_TARGET_REASON,
            message,
        );
    }
    let old = pod.status.clone().unwrap_or_default();
    let new = k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Failed".to_owned()),
        reason: Some(REASON.to_owned()),
        message: Some(message.to_owned()),
        conditions: Some(conditions),
        ..old.clone()
    };
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    // A status serializes (strings, maps and lists only); the bare precondition otherwise.
    crate::cluster::strategic::pod_status_patch(uid, &old, &new)
        .ok()
        .flatten()
        .unwrap_or_else(|| serde_json::json!({ "metadata": { "uid": uid } }))
}

/// Whether the pod in the API is already out of the companion's hands: gone, another pod
/// under the name, being deleted, or terminal.
fn settled(pod: Option<&Pod>, uid: &str) -> bool {
    pod.is_none_or(|p| {
        p.metadata.uid.as_deref() != Some(uid)
            || p.metadata.deletion_timestamp.is_some()
            || p.status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|ph| ph == "Failed" || ph == "Succeeded")
    })
}

/// The companion's outbox of eviction statuses (in its state directory): every report kept
/// until its status is written or the pod settled, replayed after a restart.
pub const OUTBOX_FILE: &str = "companion_eviction_outbox";

/// How long a report whose writes all failed waits before it is tried again.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// What to write of one eviction.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub message: String,
    pub disruption_target: bool,
}

/// Writes the evicted pod's status: a GET, then the patch over what it returned, retried on a
/// conflict or a failure with the API writers' backoff; a pod already settled
/// ([`settled`]) is left as it is. Returns whether the status was written.
pub async fn write_status<A: ClusterApi>(api: &A, r: &Report) -> Result<bool, ClusterError> {
    let mut failures = 0;
    loop {
        let attempt = async {
            let pod = api.get_pod(&r.namespace, &r.name).await?;
            let Some(pod) = pod.filter(|p| !settled(Some(p), &r.uid)) else {
                return Ok(false);
            };
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            let patch = status_patch(&pod, &r.message, r.disruption_target, &now);
            api.patch_pod_status(&r.namespace, &r.name, &patch).await?;
            Ok(true)
        };
        match attempt.await {
            Ok(written) => return Ok(written),
            Err(e) if failures + 1 >= ATTEMPTS => return Err(e),
            Err(e) => {
                failures += 1;
                tracing::debug!(pod = %format!("{}/{}", r.namespace, r.name), error = %e, "evicted pod's status: retrying");
                let wait = if e.is_conflict() {
                    Duration::ZERO
                } else {
                    crate::cluster::backoff(failures)
                };
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::fake::{Call, FakeApi};

    fn running_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
                {"type": "PodScheduled", "status": "True"}
            ]}
        }))
        .expect("pod")
    }

    #[test]
    fn the_patch_is_kubelets_eviction_status() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let p = status_patch(
            &running_pod(),
            "The node was low on resource: memory. ",
            true,
            &now,
        );
        assert_eq!(p["metadata"]["uid"], "u1");
        assert_eq!(p["status"]["phase"], "Failed");
        assert_eq!(p["status"]["reason"], "Evicted");
        // Only what changed is sent: the conditions turned false and the new one.
        let sent: Vec<&str> = p["status"]["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .filter_map(|c| c["type"].as_str())
            .collect();
        assert_eq!(sent, ["Ready", "ContainersReady", "DisruptionTarget"]);
        // Applied as the API server does: every condition kept.
        let mut pod = serde_json::to_value(running_pod()).expect("json");
        crate::cluster::strategic::apply(&mut pod, &p, crate::cluster::strategic::POD_MERGE_KEYS);
        let conds = pod["status"]["conditions"].as_array().expect("conditions");
        let of = |t: &str| {
            conds
                .iter()
                .find(|c| c["type"] == t)
                .cloned()
                .unwrap_or_default()
        };
        assert_eq!(conds.len(), 5, "every condition is kept: {conds:?}");
        assert_eq!(of("Ready")["status"], "False");
        assert_eq!(of("ContainersReady")["status"], "False");
        assert_eq!(of("Initialized")["status"], "True");
        let dt = of("DisruptionTarget");
        assert_eq!(dt["status"], "True");
        assert_eq!(dt["reason"], "TerminationByKubelet");
        assert_eq!(dt["message"], "The node was low on resource: memory. ");
        let bare = status_patch(&running_pod(), "m", false, &now);
        assert_eq!(
            bare["status"]["$setElementOrder/conditions"]
                .as_array()
                .map(Vec::len),
            Some(4)
        );
    }

    /// Written once; a pod that is gone, another under the name, or already terminal is
    /// left alone; a conflict is retried on a fresh GET.
    #[tokio::test(start_paused = true)]
    async fn the_status_is_written_unless_the_pod_is_settled() {
        let api = FakeApi::default();
        api.add_pod(running_pod());
        let r = Report {
            namespace: "ns".into(),
            name: "web".into(),
            uid: "u1".into(),
            message: "m".into(),
            disruption_target: true,
        };
        assert!(write_status(&api, &r).await.expect("written"));
        let stored = api.pod("u1").expect("pod");
        assert_eq!(
            stored.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Failed")
        );
        // Terminal now: a second report changes nothing.
        assert!(!write_status(&api, &r).await.expect("settled"));
        let other = Report {
            uid: "u2".into(),
            ..r.clone()
        };
        assert!(!write_status(&api, &other).await.expect("another pod"));
        assert_eq!(
            api.calls()
                .iter()
                .filter(|c| matches!(c, Call::PatchPodStatus(_)))
                .count(),
            1
        );
    }
}
