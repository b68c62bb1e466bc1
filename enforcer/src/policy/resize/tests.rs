//! Tables ported from kubelet's `allocation/allocation_manager_test.go`
//! (`TestUpdatePodFromAllocation`, `TestHandlePodResourcesResize`,
//! `TestHandlePodResourcesResizeWithSwap`, `TestIsResizeIncreasingAnyRequests`,
//! `TestSortPendingPodsByPriority`) and the API's resize errors of the e2e tests
//! (`doPodResizeErrorTests`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerResizePolicy, Pod, PodStatus};

use super::{
    actions::{ActualResources, ContainerResources, container_resize_in_progress},
    *,
};
use crate::{
    policy::{
        admission::Node,
        resources::test_pods::{container, pod, rl},
        swap::{SwapBehavior, SwapOptions},
    },
    quantity::Quantity,
};

fn list(s: &str) -> ResourceList {
    s.split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split_once('=').unwrap())
        .map(|(k, v)| (k.to_owned(), Quantity::parse(v).unwrap()))
        .collect()
}

fn sidecar(name: &str, requests: &str, limits: &str) -> Container {
    Container {
        restart_policy: Some("Always".into()),
        ..container(name, requests, limits)
    }
}

fn with_uid(mut p: Pod, uid: &str) -> Pod {
    p.metadata.uid = Some(uid.to_owned());
    p
}

fn set_resources(c: &mut Container, requests: &str, limits: &str) {
    let r = c.resources.get_or_insert_with(Default::default);
    r.requests = rl(requests);
    r.limits = rl(limits);
}

// --- TestUpdatePodFromAllocation ---------------------------------------------------------

fn allocation_pod() -> Pod {
    let mut p = pod(
        "test",
        vec![
            container("c1", "cpu=100m,memory=200", "cpu=300m,memory=400"),
            container("c2", "cpu=500m,memory=600", "cpu=700m,memory=800"),
        ],
    );
    p.spec.as_mut().unwrap().init_containers = Some(vec![
        sidecar(
            "c1-restartable-init",
            "cpu=200m,memory=300",
            "cpu=400m,memory=500",
        ),
        container("c1-init", "cpu=500m,memory=600", "cpu=700m,memory=800"),
    ]);
    p
}

fn all_of(p: &Pod) -> PodAllocation {
    let mut a = BTreeMap::new();
    for c in resources::containers(p)
        .iter()
        .chain(resources::init_containers(p))
    {
        a.insert(c.name.clone(), c.resources.clone().unwrap_or_default());
    }
    PodAllocation {
        containers: a,
        pod: None,
    }
}

#[test]
fn update_pod_from_allocation_table() {
    let p = allocation_pod();
    let mut resized = p.clone();
    {
        let s = resized.spec.as_mut().unwrap();
        set_resources(
            &mut s.containers[0],
            "cpu=200m,memory=200",
            "cpu=300m,memory=400",
        );
        set_resources(
            &mut s.init_containers.as_mut().unwrap()[0],
            "cpu=300m,memory=300",
            "cpu=400m,memory=500",
        );
    }
    // steady state
    assert!(update_pod_from_allocation(&p, Some(&all_of(&p))).is_none());
    // no allocations
    assert!(update_pod_from_allocation(&p, None).is_none());
    // missing container allocation
    let mut only_c2 = all_of(&p);
    only_c2.containers.retain(|n, _| n == "c2");
    assert!(update_pod_from_allocation(&p, Some(&only_c2)).is_none());
    // resized container
    let got = update_pod_from_allocation(&p, Some(&all_of(&resized))).unwrap();
    assert_eq!(got, resized);
    assert_ne!(got, p);
}

// --- TestHandlePodResourcesResize ---------------------------------------------------------

/// `makeAllocationManager`'s node: allocatable 4 cpus, 4Gi, 40 pods.
fn test_node() -> ResizeNode {
    ResizeNode {
        node: Node {
            name: "node".into(),
            allocatable: list("cpu=4,memory=4Gi,pods=40"),
            ..Node::default()
        },
        allocatable_absolute_milli_cpu: 4000,
        allocatable_absolute_memory: 4 << 30,
        ..ResizeNode::default()
    }
}

/// `testPod1` (uid 1111, container c1), `testPod2` (uid 2222, sidecar c1-init), `testPod3`.
fn test_pods() -> [Pod; 3] {
    let p1 = with_uid(
        pod("pod1", vec![container("c1", "cpu=1,memory=1Gi", "")]),
        "1111",
    );
    let mut p2 = with_uid(pod("pod2", vec![]), "2222");
    p2.spec.as_mut().unwrap().init_containers =
        Some(vec![sidecar("c1-init", "cpu=1,memory=1Gi", "")]);
    let p3 = with_uid(
        pod("pod3", vec![container("c1", "cpu=1,memory=1Gi", "")]),
        "3333",
    );
    [p1, p2, p3]
}

struct Case {
    name: &'static str,
    original_requests: &'static str,
    new_requests: &'static str,
    original_limits: &'static str,
    new_limits: &'static str,
    new_resources_allocated: bool,
    expected_allocated_requests: &'static str,
    expected_allocated_limits: &'static str,
    /// `None`: no condition; `Some((type, reason, message substring))`.
    expected: Option<(&'static str, &'static str, &'static str)>,
    static_pod: bool,
}

const IN_PROGRESS: Option<(&str, &str, &str)> = Some((POD_RESIZE_IN_PROGRESS, "", ""));

fn case(name: &'static str, orig: &'static str, new: &'static str) -> Case {
    Case {
        name,
        original_requests: orig,
        new_requests: new,
        original_limits: "",
        new_limits: "",
        new_resources_allocated: false,
        expected_allocated_requests: new,
        expected_allocated_limits: "",
        expected: IN_PROGRESS,
        static_pod: false,
    }
}

fn handle_cases() -> Vec<Case> {
    let pending = |reason, message| Some((POD_RESIZE_PENDING, reason, message));
    let orig = "cpu=1,memory=1Gi";
    vec![
        case(
            "Request CPU and memory decrease - expect InProgress",
            orig,
            "cpu=500m,memory=500Mi",
        ),
        case(
            "Request CPU increase, memory decrease - expect InProgress",
            orig,
            "cpu=1500m,memory=500Mi",
        ),
        case(
            "Request CPU decrease, memory increase - expect InProgress",
            orig,
            "cpu=500m,memory=1500Mi",
        ),
        Case {
            expected_allocated_requests: orig,
            expected: pending("Deferred", ""),
            ..case(
                "Request CPU and memory increase beyond current capacity - expect Deferred",
                orig,
                "cpu=2500m,memory=2500Mi",
            )
        },
        Case {
            expected_allocated_requests: orig,
            expected: pending("Deferred", "Node didn't have enough resource: memory"),
            ..case(
                "Request CPU decrease and memory increase beyond current capacity - expect Deferred",
                orig,
                "cpu=500m,memory=2500Mi",
            )
        },
        Case {
            expected_allocated_requests: orig,
            expected: pending(
                "Infeasible",
                "Node didn't have enough capacity: memory, requested: 4718592000, capacity: 4294967296",
            ),
            ..case(
                "Request memory increase beyond node capacity - expect Infeasible",
                orig,
                "cpu=1,memory=4500Mi",
            )
        },
        Case {
            expected_allocated_requests: orig,
            expected: pending(
                "Infeasible",
                "Node didn't have enough capacity: cpu, requested: 5000, capacity: 4000",
            ),
            ..case(
                "Request CPU increase beyond node capacity - expect Infeasible",
                orig,
                "cpu=5000m,memory=1Gi",
            )
        },
        Case {
            new_resources_allocated: true,
            ..case(
                "CPU increase in progress - expect InProgress",
                orig,
                "cpu=1500m,memory=1Gi",
            )
        },
        Case {
            expected: None,
            ..case("No resize", orig, orig)
        },
        Case {
            expected_allocated_requests: orig,
            static_pod: true,
            expected: pending(
                "Infeasible",
                "In-place resize of static-pods is not supported",
            ),
            ..case(
                "static pod, expect Infeasible",
                orig,
                "cpu=500m,memory=500Mi",
            )
        },
        case("Increase CPU from min shares", "cpu=2m", "cpu=1"),
        case("Decrease CPU to min shares", "cpu=1", "cpu=2m"),
        Case {
            original_limits: "cpu=10m",
            new_limits: "cpu=20m",
            expected_allocated_limits: "cpu=20m",
            ..case("Increase CPU from min limit", "cpu=10m", "cpu=10m")
        },
        Case {
            original_limits: "cpu=20m",
            new_limits: "cpu=10m",
            expected_allocated_limits: "cpu=10m",
            ..case("Decrease CPU to min limit", "cpu=10m", "cpu=10m")
        },
    ]
}

fn first_container(p: &mut Pod, sidecar: bool) -> &mut Container {
    let s = p.spec.as_mut().unwrap();
    if sidecar {
        &mut s.init_containers.as_mut().unwrap()[0]
    } else {
        &mut s.containers[0]
    }
}

/// What the runtime reports for a container running with `c`'s resources
/// (`setContainerStatus`).
fn actual_of(c: &Container) -> ActualResources {
    let r = ContainerResources::desired(c);
    let some = |v: i64| (v != 0).then_some(v);
    ActualResources {
        memory_limit: some(r.memory_limit),
        cpu_limit: some(r.cpu_limit),
        cpu_request: some(r.cpu_request),
    }
}

#[test]
fn handle_pod_resources_resize_table() {
    let node = test_node();
    for tt in handle_cases() {
        for is_sidecar in [false, true] {
            let name = format!("{}/sidecar={is_sidecar}", tt.name);
            let pods = test_pods();
            let mut original = pods[usize::from(is_sidecar)].clone();
            if tt.static_pod {
                original.metadata.annotations = Some(
                    [(
                        resources::CONFIG_SOURCE_ANNOTATION.to_owned(),
                        "file".to_owned(),
                    )]
                    .into(),
                );
            }
            set_resources(
                first_container(&mut original, is_sidecar),
                tt.original_requests,
                tt.original_limits,
            );
            let mut new = original.clone();
            set_resources(
                first_container(&mut new, is_sidecar),
                tt.new_requests,
                tt.new_limits,
            );
            let mut alloc = PodAllocation::of(if tt.new_resources_allocated {
                &new
            } else {
                &original
            });
            // The container runs with the original resources (actuated = original).
            let actuated = actual_of(first_container(&mut original.clone(), is_sidecar));

            let decision = handle_pod_resources_resize(&node, &new, Some(&alloc), &pods);
            let mut conditions = Vec::new();
            match &decision {
                ResizeDecision::Pending { reason, message } => {
                    conditions.push((POD_RESIZE_PENDING, reason.as_str(), message.clone()));
                }
                ResizeDecision::Allocate => {
                    alloc = PodAllocation::of(&new);
                    conditions.push((POD_RESIZE_IN_PROGRESS, "", String::new()));
                }
                ResizeDecision::Unchanged => {
                    let allocated = update_pod_from_allocation(&new, Some(&alloc))
                        .unwrap_or_else(|| new.clone());
                    let c = first_container(&mut allocated.clone(), is_sidecar).clone();
                    let act = ContainerResources {
                        memory_limit: actuated.memory_limit.unwrap_or(0),
                        memory_request: ContainerResources::desired(first_container(
                            &mut original.clone(),
                            is_sidecar,
                        ))
                        .memory_request,
                        cpu_limit: actuated.cpu_limit.unwrap_or(0),
                        cpu_request: actuated.cpu_request.unwrap_or(0),
                    };
                    if container_resize_in_progress(&c, &act) {
                        conditions.push((POD_RESIZE_IN_PROGRESS, "", String::new()));
                    }
                }
            }
            let cname = first_container(&mut new.clone(), is_sidecar).name.clone();
            let stored = alloc.containers.get(&cname).unwrap();
            assert_eq!(
                requirement_lists(Some(stored)),
                (
                    list(tt.expected_allocated_requests),
                    list(tt.expected_allocated_limits)
                ),
                "{name}: stored allocation"
            );
            match (tt.expected, conditions.as_slice()) {
                (None, []) => {}
                (Some((t, reason, message)), [(gt, greason, gmessage)]) => {
                    assert_eq!((t, reason), (*gt, *greason), "{name}");
                    assert!(gmessage.contains(message), "{name}: {gmessage:?}");
                }
                (want, got) => panic!("{name}: want {want:?}, got {got:?}"),
            }
        }
    }
}

// --- TestHandlePodResourcesResizeWithSwap -------------------------------------------------

#[test]
fn handle_pod_resources_resize_with_swap() {
    let cases = [
        (
            "NoSwap Request Memory decrease ResizePolicy RestartContainer - expect InProgress",
            SwapBehavior::NoSwap,
            "RestartContainer",
            None,
        ),
        (
            "LimitedSwap Request Memory increase with ResizePolicy RestartContainer - expect InProgress",
            SwapBehavior::LimitedSwap,
            "RestartContainer",
            None,
        ),
        (
            "LimitedSwap Request Memory increase with ResizePolicy NotRequired - expect Infeasible",
            SwapBehavior::LimitedSwap,
            "NotRequired",
            Some("In-place resize of containers with swap is not supported"),
        ),
    ];
    for (name, behavior, policy, want) in cases {
        let mut node = test_node();
        node.cgroup_v2 = true;
        node.swap = SwapOptions {
            behavior,
            controller_available: true,
            memory_capacity: 8 << 30,
            swap_capacity: 1 << 30,
        };
        let mut original = with_uid(
            pod("pod1", vec![container("c1", "cpu=1,memory=1Gi", "")]),
            "1111",
        );
        original.spec.as_mut().unwrap().containers[0].resize_policy =
            Some(vec![ContainerResizePolicy {
                resource_name: "memory".into(),
                restart_policy: policy.into(),
            }]);
        let mut new = original.clone();
        set_resources(
            &mut new.spec.as_mut().unwrap().containers[0],
            "cpu=500m,memory=500Mi",
            "",
        );
        let alloc = PodAllocation::of(&original);
        let got = handle_pod_resources_resize(&node, &new, Some(&alloc), [&original]);
        match want {
            None => assert_eq!(got, ResizeDecision::Allocate, "{name}"),
            Some(m) => match got {
                ResizeDecision::Pending {
                    reason: PendingReason::Infeasible,
                    message,
                } => assert!(message.contains(m), "{name}: {message}"),
                other => panic!("{name}: {other:?}"),
            },
        }
    }
}

// --- Guaranteed pods beside the static CPU and memory managers (handlers.go) -------------

#[test]
fn guaranteed_resize_beside_static_managers() {
    let original = with_uid(
        pod(
            "g",
            vec![container("c", "cpu=1,memory=1Gi", "cpu=1,memory=1Gi")],
        ),
        "g1",
    );
    let alloc = PodAllocation::of(&original);
    let resized = |req: &str| {
        let mut p = original.clone();
        set_resources(&mut p.spec.as_mut().unwrap().containers[0], req, req);
        p
    };
    let mut node = test_node();
    node.cpu_manager_static = true;
    // A cpu resize is refused; a memory-only resize is not (no cpu change).
    let got = handle_pod_resources_resize(&node, &resized("cpu=2,memory=1Gi"), Some(&alloc), []);
    assert_eq!(got, infeasible(MSG_CPU_MANAGER));
    let got = handle_pod_resources_resize(&node, &resized("cpu=1,memory=2Gi"), Some(&alloc), []);
    assert_eq!(got, ResizeDecision::Allocate);
    node.memory_manager_static = true;
    let got = handle_pod_resources_resize(&node, &resized("cpu=1,memory=2Gi"), Some(&alloc), []);
    assert_eq!(got, infeasible(MSG_MEMORY_MANAGER));
    // A Burstable pod is not concerned.
    let b = with_uid(pod("b", vec![container("c", "cpu=1", "cpu=2")]), "b1");
    let ba = PodAllocation::of(&b);
    let mut b2 = b.clone();
    set_resources(
        &mut b2.spec.as_mut().unwrap().containers[0],
        "cpu=2",
        "cpu=3",
    );
    assert_eq!(
        handle_pod_resources_resize(&node, &b2, Some(&ba), []),
        ResizeDecision::Allocate
    );
}

// --- TestIsResizeIncreasingAnyRequests ----------------------------------------------------

#[test]
fn is_resize_increasing_any_requests_table() {
    let mut p = with_uid(
        pod(
            "pod1",
            vec![
                container("c1", "cpu=1,memory=1Gi", ""),
                container("c2", "cpu=1,memory=1Gi", ""),
                container("c3", "", ""),
                container("c4", "", ""),
            ],
        ),
        "1111",
    );
    // c3 has an empty request list, c4 none.
    p.spec.as_mut().unwrap().containers[2]
        .resources
        .as_mut()
        .unwrap()
        .requests = Some(BTreeMap::new());
    let alloc = PodAllocation::of(&p);
    let up = "cpu=1500m,memory=1500Mi";
    let down = "cpu=500m,memory=500Mi";
    let one = "cpu=1,memory=1Gi";
    // The Go test changes the same pod case after case; so does this.
    type Change<'a> = (usize, Option<&'a str>);
    let cases: [(&str, &[Change], bool); 10] = [
        ("increase requests, one container", &[(0, Some(up))], true),
        (
            "decrease requests, one container",
            &[(0, Some(down))],
            false,
        ),
        (
            "increase cpu, decrease memory, one container",
            &[(0, Some("cpu=1500m,memory=500Mi"))],
            true,
        ),
        (
            "increase memory, decrease cpu, one container",
            &[(0, Some("cpu=500m,memory=1500Mi"))],
            true,
        ),
        (
            "increase one container, decrease another container",
            &[(0, Some(up)), (1, Some(down))],
            true,
        ),
        (
            "decrease requests, two containers",
            &[(0, Some(down)), (1, Some(down))],
            false,
        ),
        (
            "remove requests, set as empty struct",
            &[(0, Some(""))],
            false,
        ),
        ("remove requests, set as nil", &[(0, None)], false),
        ("add requests, set as empty struct", &[(2, Some(one))], true),
        ("add requests, set as nil", &[(3, Some(one))], true),
    ];
    for (name, changes, want) in cases {
        for (i, req) in changes {
            let r = p.spec.as_mut().unwrap().containers[*i]
                .resources
                .get_or_insert_with(Default::default);
            r.requests = match req {
                None => None,
                Some("") => Some(BTreeMap::new()),
                Some(s) => rl(s),
            };
        }
        assert_eq!(
            is_resize_increasing_requests(&p, Some(&alloc)),
            want,
            "{name}"
        );
    }
}

// --- TestSortPendingPodsByPriority --------------------------------------------------------

#[test]
fn sort_pending_pods_by_priority() {
    use std::time::Duration;
    let item = |i: usize| PendingResize {
        uid: i.to_string(),
        increasing: i != 0,
        priority: if i == 1 { 100 } else { 0 },
        qos: if i == 2 {
            QosClass::Guaranteed
        } else {
            QosClass::Burstable
        },
        pending_since: match i {
            3 => Some(Duration::from_millis(1)),
            4 => Some(Duration::from_millis(6)),
            _ => None,
        },
    };
    let expected: Vec<String> = (0..6).map(|i| i.to_string()).collect();
    let mut q = Vec::new();
    for i in 0..6 {
        push_pending_resize(&mut q, item(i));
    }
    assert_eq!(
        q.iter().map(|p| p.uid.clone()).collect::<Vec<_>>(),
        expected
    );
    let mut q = Vec::new();
    for i in (0..6).rev() {
        push_pending_resize(&mut q, item(i));
    }
    assert_eq!(
        q.iter().map(|p| p.uid.clone()).collect::<Vec<_>>(),
        expected
    );
    // A uid already queued is not queued twice.
    push_pending_resize(&mut q, item(3));
    assert_eq!(q.len(), 6);
}

// --- the API's refusals (doPodResizeErrorTests) --------------------------------------------

#[test]
fn api_refuses_qos_changes_and_removed_limits() {
    let be = pod("p", vec![container("c1", "", "")]);
    let mut asks_memory = be.clone();
    set_resources(
        &mut asks_memory.spec.as_mut().unwrap().containers[0],
        "memory=40Mi",
        "",
    );
    assert!(
        validate_resize(&be, &asks_memory)
            .iter()
            .any(|e| e.contains("Pod QOS Class may not change as a result of resizing"))
    );
    let b = pod(
        "p",
        vec![container(
            "c1",
            "cpu=100m,memory=100Mi",
            "cpu=200m,memory=200Mi",
        )],
    );
    let mut no_mem_limit = b.clone();
    set_resources(
        &mut no_mem_limit.spec.as_mut().unwrap().containers[0],
        "cpu=100m,memory=100Mi",
        "cpu=200m",
    );
    assert!(
        validate_resize(&b, &no_mem_limit)
            .iter()
            .any(|e| e.contains("resource limits cannot be removed"))
    );
    let mut storage = b.clone();
    set_resources(
        &mut storage.spec.as_mut().unwrap().containers[0],
        "cpu=100m,memory=100Mi,ephemeral-storage=1Gi",
        "cpu=200m,memory=200Mi",
    );
    assert!(
        validate_resize(&b, &storage)
            .iter()
            .any(|e| e.contains("only cpu and memory resources are mutable"))
    );
    let mut fine = b.clone();
    set_resources(
        &mut fine.spec.as_mut().unwrap().containers[0],
        "cpu=150m,memory=150Mi",
        "cpu=300m,memory=300Mi",
    );
    assert!(validate_resize(&b, &fine).is_empty());
    // Guaranteed stays Guaranteed when requests and limits move together.
    let g = pod(
        "g",
        vec![container("c", "cpu=1,memory=1Gi", "cpu=1,memory=1Gi")],
    );
    let mut g2 = g.clone();
    set_resources(
        &mut g2.spec.as_mut().unwrap().containers[0],
        "cpu=2,memory=1Gi",
        "cpu=2,memory=1Gi",
    );
    assert!(validate_resize(&g, &g2).is_empty());
    let mut g3 = g.clone();
    set_resources(
        &mut g3.spec.as_mut().unwrap().containers[0],
        "cpu=500m,memory=1Gi",
        "cpu=1,memory=1Gi",
    );
    assert!(!validate_resize(&g, &g3).is_empty());
    // status.qosClass decides the old class.
    let mut g4 = g.clone();
    g4.status = Some(PodStatus {
        qos_class: Some("Guaranteed".into()),
        ..PodStatus::default()
    });
    assert!(validate_resize(&g4, &g2).is_empty());
}

#[test]
fn resize_conditions() {
    let p = ResizeCondition::pending(PendingReason::Deferred, "m", 3);
    assert_eq!(
        (p.type_, p.status, p.reason.as_str(), p.observed_generation),
        ("PodResizePending", "True", "Deferred", 3)
    );
    let e = ResizeCondition::in_progress(Some("boom"), 4);
    assert_eq!((e.reason.as_str(), e.message.as_str()), ("Error", "boom"));
    let ok = ResizeCondition::in_progress(None, 4);
    assert_eq!((ok.reason.as_str(), ok.message.as_str()), ("", ""));
}
