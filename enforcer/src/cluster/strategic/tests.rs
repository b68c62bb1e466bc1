use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition, PodStatus};
use serde_json::json;

use super::*;

/// kubelet's `pkg/util/pod/pod_test.go` fixture `getPodStatus()`.
fn pod_status() -> PodStatus {
    let cond = |t: &str| PodCondition {
        type_: t.to_owned(),
        status: "True".to_owned(),
        ..PodCondition::default()
    };
    let container = |n: &str| ContainerStatus {
        name: n.to_owned(),
        ready: true,
        ..ContainerStatus::default()
    };
    PodStatus {
        phase: Some("Running".to_owned()),
        conditions: Some(vec![cond("Ready"), cond("PodScheduled")]),
        container_statuses: Some(vec![container("container1"), container("container2")]),
        message: Some("Message".to_owned()),
        ..PodStatus::default()
    }
}

fn patch_of(new: &PodStatus) -> Option<String> {
    pod_status_patch("myuid", &pod_status(), new)
        .expect("serializable")
        .map(|p| p.to_string())
}

/// `TestPatchPodStatus`, byte for byte where k8s-openapi serializes a status as Go does.
#[test]
fn kubelets_pod_status_patches() {
    // "no change": nothing is sent.
    assert_eq!(patch_of(&pod_status()), None);
    // "message change".
    let mut s = pod_status();
    s.message = Some("random message".to_owned());
    assert_eq!(
        patch_of(&s).as_deref(),
        Some(r#"{"metadata":{"uid":"myuid"},"status":{"message":"random message"}}"#)
    );
    // "pod condition change".
    let mut s = pod_status();
    s.conditions.as_mut().expect("conditions")[0].status = "False".to_owned();
    assert_eq!(
        patch_of(&s).as_deref(),
        Some(
            r#"{"metadata":{"uid":"myuid"},"status":{"$setElementOrder/conditions":[{"type":"Ready"},{"type":"PodScheduled"}],"conditions":[{"status":"False","type":"Ready"}]}}"#
        )
    );
    // "additional init container condition": Go writes the zero `lastState` and `state` as
    // `{}`, k8s-openapi leaves the absent ones out; the rest is the same.
    let mut s = pod_status();
    s.init_container_statuses = Some(vec![ContainerStatus {
        name: "init-container".to_owned(),
        ready: true,
        ..ContainerStatus::default()
    }]);
    assert_eq!(
        patch_of(&s).as_deref(),
        Some(
            r#"{"metadata":{"uid":"myuid"},"status":{"initContainerStatuses":[{"image":"","imageID":"","name":"init-container","ready":true,"restartCount":0}]}}"#
        )
    );
}

fn list(items: &[(&str, i64)]) -> Value {
    json!({ "status": { "conditions": items.iter().map(|(t, v)| json!({"type": t, "value": v})).collect::<Vec<_>>() } })
}

fn order(types: &[&str]) -> Value {
    Value::Array(types.iter().map(|t| json!({ "type": t })).collect())
}

/// strategicpatch's "preserve order" cases (its `patch_test.go`, two-way), on a keyed list,
/// each applied back to the original giving the modified object.
#[test]
fn keyed_lists_as_strategicpatch_orders_them() {
    let cases = [
        // Delete and reorder.
        (
            list(&[("a", 1), ("b", 2)]),
            list(&[("b", 2)]),
            json!({"status": {"$setElementOrder/conditions": order(&["b"]), "conditions": [{"$patch": "delete", "type": "a"}]}}),
        ),
        // Add and delete.
        (
            list(&[("1", 1), ("3", 3), ("2", 2)]),
            list(&[("4", 4), ("2", 2), ("1", 1)]),
            json!({"status": {"$setElementOrder/conditions": order(&["4", "2", "1"]), "conditions": [{"type": "4", "value": 4}, {"$patch": "delete", "type": "3"}]}}),
        ),
        // Add several: in the new order.
        (
            list(&[("1", 1), ("2", 2)]),
            list(&[("1", 1), ("4", 4), ("2", 2), ("3", 3)]),
            json!({"status": {"$setElementOrder/conditions": order(&["1", "4", "2", "3"]), "conditions": [{"type": "4", "value": 4}, {"type": "3", "value": 3}]}}),
        ),
        // Reorder only.
        (
            list(&[("1", 1), ("3", 3), ("4", 4), ("2", 2)]),
            list(&[("4", 4), ("2", 2), ("3", 3), ("1", 1)]),
            json!({"status": {"$setElementOrder/conditions": order(&["4", "2", "3", "1"])}}),
        ),
        // A changed element: its changed field and its key.
        (
            list(&[("1", 1), ("2", 2)]),
            list(&[("1", 1), ("2", 5)]),
            json!({"status": {"$setElementOrder/conditions": order(&["1", "2"]), "conditions": [{"type": "2", "value": 5}]}}),
        ),
    ];
    for (old, new, want) in cases {
        let patch = Value::Object(two_way(&old, &new, POD_MERGE_KEYS));
        assert_eq!(patch, want, "{old} -> {new}");
        let mut applied = old.clone();
        apply(&mut applied, &patch, POD_MERGE_KEYS);
        assert_eq!(applied, new, "{patch} applied to {old}");
    }
}

/// What the patch does not name is the API's: another writer's condition, and a field of a
/// condition the node does not model (`observedGeneration`), stay; a removed field is `null`;
/// an unkeyed list is replaced whole.
#[test]
fn other_writers_fields_survive_a_patch() {
    let stored = json!({"status": {
        "conditions": [
            {"type": "Ready", "status": "True", "observedGeneration": 3},
            {"type": "example.com/gate", "status": "True"}
        ],
        "containerStatuses": [{"name": "a", "ready": true}, {"name": "b", "ready": true}],
        "nominatedNodeName": "n1",
        "reason": "Old"
    }});
    let old = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": [{"name": "a", "ready": true}, {"name": "b", "ready": true}], "reason": "Old"}});
    let new = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}], "containerStatuses": [{"name": "a", "ready": false}]}});
    let patch = Value::Object(two_way(&old, &new, POD_MERGE_KEYS));
    assert_eq!(patch["status"]["reason"], Value::Null);
    assert_eq!(
        patch["status"]["containerStatuses"],
        new["status"]["containerStatuses"]
    );
    let mut applied = stored;
    apply(&mut applied, &patch, POD_MERGE_KEYS);
    assert_eq!(
        applied,
        json!({"status": {
            "conditions": [
                {"type": "Ready", "status": "False", "observedGeneration": 3},
                {"type": "example.com/gate", "status": "True"}
            ],
            "containerStatuses": [{"name": "a", "ready": false}],
            "nominatedNodeName": "n1"
        }})
    );
}

/// A list the API does not have yet comes whole, with no element order.
#[test]
fn a_first_status_is_sent_whole() {
    let old = json!({"status": {"phase": "Pending"}});
    let new = json!({"metadata": {"uid": "U"}, "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.5"}]}});
    assert_eq!(
        Value::Object(two_way(&old, &new, POD_MERGE_KEYS)),
        json!({"metadata": {"uid": "U"}, "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.5"}]}})
    );
}
