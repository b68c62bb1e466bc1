//! Ported from kubelet's `kuberuntime/kuberuntime_manager_test.go`
//! (`TestComputePodActionsForPodResize`), and the order of `doPodResizeAction`.

use k8s_openapi::api::core::v1::{Container, ContainerResizePolicy};

use super::*;
use crate::{policy::resources::test_pods::container, quantity::Quantity};

// --- TestComputePodActionsForPodResize ----------------------------------------------------

fn with_policy(mut c: Container, cpu: &str, memory: &str) -> Container {
    c.resize_policy = Some(vec![
        ContainerResizePolicy {
            resource_name: "cpu".into(),
            restart_policy: cpu.into(),
        },
        ContainerResizePolicy {
            resource_name: "memory".into(),
            restart_policy: memory.into(),
        },
    ]);
    c
}

fn actual(
    cpu_limit: Option<&str>,
    mem_limit: Option<&str>,
    cpu_req: Option<&str>,
) -> ActualResources {
    ActualResources {
        memory_limit: mem_limit.map(|q| Quantity::parse(q).unwrap().value()),
        cpu_limit: cpu_limit.map(|q| Quantity::parse(q).unwrap().milli_value()),
        cpu_request: cpu_req.map(|q| Quantity::parse(q).unwrap().milli_value()),
    }
}

#[test]
fn compute_pod_actions_for_pod_resize_table() {
    const NR: &str = "NotRequired";
    const RC: &str = "RestartContainer";
    let mib = |n: i64| n << 20;
    let res = |cpu_limit, memory_limit| ContainerResources {
        memory_limit,
        memory_request: 0,
        cpu_limit,
        cpu_request: 0,
    };
    // (name, container, actual, want memory update (dir), want cpu update (dir), restart)
    type Want = (Option<Direction>, Option<Direction>, bool);
    let cases: Vec<(&str, Container, ActualResources, Want)> = vec![
        (
            "Update container CPU and memory resources",
            with_policy(container("foo2", "", "cpu=100m,memory=100Mi"), NR, NR),
            actual(Some("200m"), Some("200Mi"), None),
            (Some(Direction::Decrease), Some(Direction::Decrease), false),
        ),
        (
            "Update container CPU resources",
            with_policy(container("foo2", "", "cpu=100m,memory=100Mi"), NR, NR),
            actual(Some("200m"), Some("100Mi"), None),
            (None, Some(Direction::Decrease), false),
        ),
        (
            "Update container memory resources",
            with_policy(container("foo3", "", "cpu=200m,memory=200Mi"), NR, NR),
            actual(Some("200m"), Some("100Mi"), None),
            (Some(Direction::Increase), None, false),
        ),
        (
            "Nothing when spec.Resources and status.Resources are equal",
            with_policy(container("foo2", "", "cpu=200m"), NR, NR),
            actual(Some("200m"), None, None),
            (None, None, false),
        ),
        (
            "Nothing when spec.Resources and status.Resources are equivalent",
            with_policy(container("foo2", "", ""), NR, NR),
            actual(None, None, Some("2m")),
            (None, None, false),
        ),
        (
            "Update container CPU resources to equivalent value",
            with_policy(container("foo2", "cpu=1m", "cpu=1m"), NR, NR),
            actual(Some("10m"), None, Some("2m")),
            (None, None, false),
        ),
        (
            "Update container CPU and memory resources with Restart policy for CPU",
            with_policy(container("foo1", "", "cpu=200m,memory=200Mi"), RC, NR),
            actual(Some("100m"), Some("100Mi"), None),
            (None, None, true),
        ),
        (
            "Update container CPU and memory resources with Restart policy for memory",
            with_policy(container("foo3", "", "cpu=200m,memory=200Mi"), NR, RC),
            actual(Some("100m"), Some("100Mi"), None),
            (None, None, true),
        ),
        (
            "Update container memory resources with Restart policy for CPU",
            with_policy(container("foo2", "", "cpu=100m,memory=200Mi"), RC, NR),
            actual(Some("100m"), Some("100Mi"), None),
            (Some(Direction::Increase), None, false),
        ),
        (
            "Update container CPU resources with Restart policy for memory",
            with_policy(container("foo3", "", "cpu=200m,memory=100Mi"), NR, RC),
            actual(Some("100m"), Some("100Mi"), None),
            (None, Some(Direction::Increase), false),
        ),
    ];
    for (name, c, act, (want_mem, want_cpu, want_restart)) in cases {
        let got = compute_container_resize(&c, true, Some(act));
        match got {
            ContainerResize::Keep => {
                assert_eq!(
                    (want_mem, want_cpu, want_restart),
                    (None, None, false),
                    "{name}"
                );
            }
            ContainerResize::Restart { message } => {
                assert!(want_restart, "{name}");
                assert_eq!(
                    message,
                    format!("Container {} resize requires restart", c.name)
                );
            }
            ContainerResize::Update { memory, cpu } => {
                assert!(!want_restart, "{name}");
                assert_eq!(memory.as_ref().map(|u| u.direction), want_mem, "{name}");
                assert_eq!(cpu.as_ref().map(|u| u.direction), want_cpu, "{name}");
                let d = ContainerResources::desired(&c);
                for u in memory.iter().chain(cpu.iter()) {
                    assert_eq!(u.desired, d, "{name}");
                }
            }
        }
    }
    // The first case's values, as the Go test spells them.
    let c = with_policy(container("foo2", "", "cpu=100m,memory=100Mi"), NR, NR);
    let ContainerResize::Update {
        memory: Some(m), ..
    } = compute_container_resize(&c, true, Some(actual(Some("200m"), Some("200Mi"), None)))
    else {
        panic!("expected an update");
    };
    assert_eq!(m.desired, res(100, mib(100)));
    assert_eq!(m.current, res(200, mib(200)));
    // Not running, or no runtime resources: nothing.
    assert_eq!(
        compute_container_resize(&c, false, Some(actual(Some("200m"), None, None))),
        ContainerResize::Keep
    );
    assert_eq!(
        compute_container_resize(&c, true, None),
        ContainerResize::Keep
    );
}

// --- doPodResizeAction's order -------------------------------------------------------------

fn plan_of(updates: &[(&str, bool, Direction)]) -> PodResizePlan {
    let mut plan = PodResizePlan::default();
    for (name, memory, direction) in updates {
        let u = ContainerUpdate {
            name: (*name).to_owned(),
            desired: ContainerResources::default(),
            current: ContainerResources::default(),
            direction: *direction,
        };
        let r = if *memory {
            ContainerResize::Update {
                memory: Some(u),
                cpu: None,
            }
        } else {
            ContainerResize::Update {
                memory: None,
                cpu: Some(u),
            }
        };
        plan.add(name, r);
    }
    plan
}

#[test]
fn pod_cgroup_grows_first_and_shrinks_last() {
    use Direction::{Decrease, Increase};
    let plan = plan_of(&[("a", true, Increase), ("a", false, Increase)]);
    let cg = PodCgroupResize {
        current_memory_limit: mib(100),
        new_memory_limit: Some(mib(200)),
        current_cpu_quota: 10_000,
        new_cpu_quota: Some(20_000),
        current_cpu_shares: 102,
        new_cpu_shares: 204,
        memory_usage: 1 << 20,
    };
    let steps = resize_steps("p", &plan, &cg).unwrap();
    assert_eq!(
        steps,
        vec![
            ResizeStep::PodMemoryLimit(mib(200)),
            ResizeStep::Containers {
                memory: true,
                names: vec!["a".into()]
            },
            ResizeStep::PodCpuQuota(20_000),
            ResizeStep::PodCpuShares(204),
            ResizeStep::Containers {
                memory: false,
                names: vec!["a".into()]
            },
        ]
    );
    // Shrinking: containers first, then requests (shares), then limits (quota).
    let plan = plan_of(&[("a", true, Decrease), ("a", false, Decrease)]);
    let shrink = PodCgroupResize {
        current_memory_limit: mib(200),
        new_memory_limit: Some(mib(100)),
        current_cpu_quota: 20_000,
        new_cpu_quota: Some(10_000),
        current_cpu_shares: 204,
        new_cpu_shares: 102,
        memory_usage: 1 << 20,
    };
    assert_eq!(
        resize_steps("p", &plan, &shrink).unwrap(),
        vec![
            ResizeStep::Containers {
                memory: true,
                names: vec!["a".into()]
            },
            ResizeStep::PodMemoryLimit(mib(100)),
            ResizeStep::Containers {
                memory: false,
                names: vec!["a".into()]
            },
            ResizeStep::PodCpuShares(102),
            ResizeStep::PodCpuQuota(10_000),
        ]
    );
    // The guard: a pod limit at or below usage aborts everything.
    let over = PodCgroupResize {
        memory_usage: u64::try_from(mib(150)).unwrap(),
        ..shrink
    };
    assert_eq!(
        resize_steps("p", &plan, &over),
        Err(ResizeError::MemoryBelowUsage("p".into()))
    );
    // No pod limit: the pod's limit stays; no memory step beside the containers.
    let unlimited = PodCgroupResize {
        new_memory_limit: None,
        new_cpu_quota: None,
        ..shrink
    };
    let steps = resize_steps("p", &plan_of(&[("a", true, Decrease)]), &unlimited).unwrap();
    assert_eq!(
        steps,
        vec![ResizeStep::Containers {
            memory: true,
            names: vec!["a".into()]
        }]
    );
}

fn mib(n: i64) -> i64 {
    n << 20
}

#[test]
fn decreases_are_applied_before_increases() {
    use Direction::{Decrease, Increase};
    let plan = plan_of(&[
        ("a", true, Increase),
        ("b", true, Decrease),
        ("c", true, Increase),
        ("d", true, Decrease),
    ]);
    let names: Vec<_> = plan.memory.0.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["d", "b", "a", "c"]);
}

#[test]
fn update_values_keep_the_other_resource() {
    let u = ContainerUpdate {
        name: "a".into(),
        desired: ContainerResources {
            memory_limit: 2,
            memory_request: 1,
            cpu_limit: 200,
            cpu_request: 100,
        },
        current: ContainerResources {
            memory_limit: 4,
            memory_request: 1,
            cpu_limit: 400,
            cpu_request: 300,
        },
        direction: Direction::Decrease,
    };
    let m = update_values(&u.current, &u.desired, true);
    assert_eq!((m.memory_limit, m.cpu_limit, m.cpu_request), (2, 400, 300));
    let c = update_values(&u.current, &u.desired, false);
    assert_eq!((c.memory_limit, c.cpu_limit, c.cpu_request), (4, 200, 100));
}

#[test]
fn actual_resources_from_cri() {
    // cpu.shares 512 -> 500m, quota 50000 / 100000 -> 500m, 2 shares -> 2m, no quota -> none.
    let a = ActualResources::from_linux(100_000, 50_000, 512, 128 << 20);
    assert_eq!(
        a,
        ActualResources {
            memory_limit: Some(128 << 20),
            cpu_limit: Some(500),
            cpu_request: Some(500)
        }
    );
    assert_eq!(shares_to_milli_cpu(1024), 1000);
    assert_eq!(shares_to_milli_cpu(2), 2);
    assert_eq!(shares_to_milli_cpu(1), 0);
    let none = ActualResources::from_linux(100_000, -1, 0, 0);
    assert_eq!(none, ActualResources::default());
}

#[test]
fn pod_cgroup_resize_from_values() {
    use crate::policy::resources::cgroup::PodCgroupValues;
    let values = |shares, quota, memory| PodCgroupValues {
        cpu_shares: shares,
        cpu_weight: None,
        cpu_quota_micros: quota,
        cpu_period_micros: quota.map(|_| 100_000),
        memory_limit_bytes: memory,
        memory_min_bytes: None,
        memory_low_bytes: None,
        pids_limit: None,
    };
    let r = PodCgroupResize::new(
        &values(102, None, None),
        &values(204, Some(20_000), Some(256 << 20)),
        1 << 20,
    );
    assert_eq!(
        (
            r.current_memory_limit,
            r.current_cpu_quota,
            r.new_cpu_shares
        ),
        (i64::MAX, -1, 204)
    );
    // From unlimited to a limit is a decrease: the containers first, the pod last.
    let plan = plan_of(&[("a", true, Direction::Decrease)]);
    let steps = resize_steps("p", &plan, &r).unwrap();
    assert_eq!(steps.last(), Some(&ResizeStep::PodMemoryLimit(256 << 20)));
}
