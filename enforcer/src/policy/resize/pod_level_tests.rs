//! In-place resize of pod-level resources (KEP-5419, `InPlacePodLevelResourcesVerticalScaling`,
//! beta in 1.36), after kubelet's `TestAllocationManagerAddPodWithPLR`,
//! `TestIsResizeIncreasingRequests`' pod-level rows and `TestComputePodActionsForPodResize`'s
//! inherited limits.

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};

use super::{actions::ContainerResources, *};
use crate::policy::{
    admission::Node,
    resources::test_pods::{container, pod, rl},
};

fn with_pod_level(mut p: Pod, requests: &str, limits: &str) -> Pod {
    if let Some(s) = p.spec.as_mut() {
        s.resources = Some(ResourceRequirements {
            requests: rl(requests),
            limits: rl(limits),
            ..ResourceRequirements::default()
        });
    }
    p
}

fn node(pod_level_resize: bool) -> ResizeNode {
    ResizeNode {
        node: Node {
            name: "node".into(),
            allocatable: [("cpu", "4"), ("memory", "4Gi"), ("pods", "40")]
                .into_iter()
                .map(|(k, v)| {
                    (
                        k.to_owned(),
                        crate::quantity::Quantity::parse(v).expect("q"),
                    )
                })
                .collect(),
            ..Node::default()
        },
        allocatable_absolute_milli_cpu: 4000,
        allocatable_absolute_memory: 4 << 30,
        pod_level_resize,
        ..ResizeNode::default()
    }
}

fn small() -> Pod {
    with_pod_level(
        pod("pod1", vec![container("c1", "cpu=500m,memory=512Mi", "")]),
        "cpu=1,memory=1Gi",
        "cpu=2,memory=2Gi",
    )
}

/// "PLR IPPR Enabled - New pod admitted and allocated resources updated": the allocation
/// carries the pod-level resources beside the containers'; a pod without them, none. The
/// checkpoint keeps them under kubelet's `PodLevelResources`.
#[test]
fn the_allocation_carries_pod_level_resources_through_the_checkpoint() {
    let a = PodAllocation::of(&small());
    assert!(same_resources(
        a.pod.as_ref(),
        resources::pod_level(&small())
    ));
    assert_eq!(
        PodAllocation::of(&pod("p", vec![container("c", "cpu=1", "")])).pod,
        None
    );
    let all = BTreeMap::from([("uid-1".to_owned(), a.clone())]);
    let json = checkpoint::to_json(&all);
    assert!(json.contains("PodLevelResources"), "{json}");
    let back = checkpoint::from_json(&json).expect("read back");
    assert!(same_resources(back["uid-1"].pod.as_ref(), a.pod.as_ref()));
}

/// A pod-level change is a resize: the allocated pod keeps the allocated pod-level
/// resources until it is allocated; it fits, does not, or the gate is off.
#[test]
fn a_pod_level_resize_is_allocated_refused_or_pending_as_kubelets() {
    let allocated = PodAllocation::of(&small());
    let grown = with_pod_level(
        pod("pod1", vec![container("c1", "cpu=500m,memory=512Mi", "")]),
        "cpu=2,memory=2Gi",
        "cpu=3,memory=3Gi",
    );
    let back = update_pod_from_allocation(&grown, Some(&allocated)).expect("a resize");
    assert!(same_resources(
        resources::pod_level(&back),
        resources::pod_level(&small())
    ));
    assert_eq!(
        handle_pod_resources_resize(&node(true), &grown, Some(&allocated), []),
        ResizeDecision::Allocate
    );
    assert_eq!(
        handle_pod_resources_resize(&node(false), &grown, Some(&allocated), []),
        ResizeDecision::Pending {
            reason: PendingReason::Infeasible,
            message: MSG_POD_LEVEL_GATE.to_owned(),
        }
    );
    let huge = with_pod_level(grown.clone(), "cpu=1,memory=5Gi", "cpu=3,memory=6Gi");
    assert_eq!(
        handle_pod_resources_resize(&node(true), &huge, Some(&allocated), []),
        ResizeDecision::Pending {
            reason: PendingReason::Infeasible,
            message: "Node didn't have enough capacity: memory, requested: 5368709120, capacity: 4294967296".to_owned(),
        }
    );
    // Unchanged: nothing to decide.
    assert_eq!(
        handle_pod_resources_resize(&node(true), &small(), Some(&allocated), []),
        ResizeDecision::Unchanged
    );
    // An allocation checkpointed without pod-level resources is not a removal of them.
    let legacy = PodAllocation {
        pod: None,
        ..allocated
    };
    assert!(update_pod_from_allocation(&small(), Some(&legacy)).is_none());
}

/// `TestIsResizeIncreasingRequests`' pod-level rows: increase cpu (true), decrease memory
/// (false), increase cpu and decrease memory (true).
#[test]
fn kubelets_is_resize_increasing_requests_pod_level_rows() {
    let allocated = PodAllocation::of(&with_pod_level(
        pod("p", vec![container("c", "", "")]),
        "cpu=2000m,memory=2500Mi",
        "",
    ));
    for (name, requests, want) in [
        ("pod-level: increase cpu", "cpu=3000m,memory=2500Mi", true),
        (
            "pod-level: decrease memory",
            "cpu=2000m,memory=2000Mi",
            false,
        ),
        (
            "pod-level: increase cpu, decrease memory",
            "cpu=3000m,memory=2000Mi",
            true,
        ),
    ] {
        let desired = with_pod_level(pod("p", vec![container("c", "", "")]), requests, "");
        assert_eq!(
            is_resize_increasing_requests(&desired, Some(&allocated)),
            want,
            "{name}"
        );
    }
}

/// What a resize may change at pod level: cpu and memory, added or changed, never removed.
#[test]
fn pod_level_resize_validation() {
    let old = small();
    assert!(validate_resize(&old, &old).is_empty());
    let grown = with_pod_level(old.clone(), "cpu=2,memory=1Gi", "cpu=4,memory=2Gi");
    assert!(
        validate_resize(&old, &grown).is_empty(),
        "cpu and memory change"
    );
    let plain = pod("pod1", vec![container("c1", "cpu=500m,memory=512Mi", "")]);
    let added = with_pod_level(plain.clone(), "cpu=1,memory=1Gi", "");
    assert!(validate_resize(&plain, &added).is_empty(), "added");
    assert_eq!(
        validate_resize(&old, &plain),
        ["spec.resources: Forbidden: pod-level resources cannot be removed"]
    );
    let no_limit = with_pod_level(old.clone(), "cpu=1,memory=1Gi", "cpu=2");
    assert_eq!(
        validate_resize(&old, &no_limit),
        ["spec.resources.limits: Forbidden: pod-level resource limits cannot be removed"]
    );
    let pages = with_pod_level(
        old.clone(),
        "cpu=1,memory=1Gi,hugepages-2Mi=2Mi",
        "cpu=2,memory=2Gi,hugepages-2Mi=2Mi",
    );
    assert_eq!(
        validate_resize(&old, &pages),
        ["spec: Forbidden: only cpu and memory resources are mutable at pod-level"]
    );
}

/// "Update pod-level limits and container updated by default": a container that sets no
/// limit runs with the pod-level ones, so a pod-level resize resizes it; one with its own
/// limits keeps them ("does not mutate container resources").
#[test]
fn a_container_without_limits_inherits_the_pod_levels() {
    let p = with_pod_level(
        pod(
            "p",
            vec![
                container("c1", "", ""),
                container("c2", "cpu=100m,memory=100Mi", "cpu=200m,memory=200Mi"),
            ],
        ),
        "",
        "cpu=600m,memory=600Mi",
    );
    let spec = p.spec.as_ref().expect("spec");
    let c1 =
        ContainerResources::desired(&resources::with_pod_level_limits(&p, &spec.containers[0]));
    assert_eq!((c1.cpu_limit, c1.memory_limit), (600, 600 << 20));
    let c2 =
        ContainerResources::desired(&resources::with_pod_level_limits(&p, &spec.containers[1]));
    assert_eq!((c2.cpu_limit, c2.memory_limit), (200, 200 << 20));
    let plain = pod("q", vec![container("c1", "", "")]);
    let c = ContainerResources::desired(&resources::with_pod_level_limits(
        &plain,
        &plain.spec.as_ref().expect("spec").containers[0],
    ));
    assert_eq!((c.cpu_limit, c.memory_limit), (0, 0));
}
