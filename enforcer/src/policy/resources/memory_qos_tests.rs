//! kubelet's Memory QoS tables, ported: `TestResourceConfigForPodWithEnforceMemoryQoS` and
//! `TestEnsureExists` (pkg/kubelet/cm, the pod cgroup under `TieredReservation`) and
//! `TestGenerateContainerConfigWithMemoryQoSEnforced` (pkg/kubelet/kuberuntime, the
//! container's `memory.high`, with the BestEffort row of kubernetes#138139).

use super::{
    cgroup::{CgroupOptions, container_cgroup_values_in, pod_cgroup_values},
    test_pods::{container, pod},
};

fn tiered() -> CgroupOptions {
    CgroupOptions {
        memory_qos: true,
        tiered_reservation: true,
        ..CgroupOptions::default()
    }
}

/// `TestResourceConfigForPodWithEnforceMemoryQoS`: every row with and without CPU limit
/// enforcement and with the tuned quota period; only `Unified` (memory.min / memory.low) is
/// compared, as kubelet's test does.
#[test]
fn kubelets_resource_config_for_pod_with_enforce_memory_qos() {
    let rows = [
        ("besteffort", vec![container("c", "", "")], (None, None)),
        (
            "burstable-no-limits",
            vec![container("c", "cpu=100m,memory=100Mi", "")],
            (None, Some(104_857_600)),
        ),
        (
            "burstable-with-limits",
            vec![container(
                "c",
                "cpu=100m,memory=100Mi",
                "cpu=200m,memory=200Mi",
            )],
            (None, Some(104_857_600)),
        ),
        (
            "burstable-partial-limits",
            vec![
                container("c1", "cpu=100m,memory=100Mi", "cpu=200m,memory=200Mi"),
                container("c2", "cpu=100m,memory=100Mi", ""),
            ],
            (None, Some(209_715_200)),
        ),
        (
            "guaranteed",
            vec![container(
                "c",
                "cpu=100m,memory=100Mi",
                "cpu=100m,memory=100Mi",
            )],
            (Some(104_857_600), None),
        ),
    ];
    for (name, containers, want) in rows {
        let p = pod(name, containers);
        for enforce in [true, false] {
            for period in [100_000, 5_000] {
                let opts = CgroupOptions {
                    enforce_cpu_limits: enforce,
                    cpu_period_us: period,
                    ..tiered()
                };
                let v = pod_cgroup_values(&p, &opts);
                assert_eq!(
                    (v.memory_min_bytes, v.memory_low_bytes),
                    want,
                    "{name} enforce={enforce} period={period}"
                );
            }
        }
    }
}

/// `TestEnsureExists`: a Burstable pod (128Mi request, 256Mi limit) gets `memory.low`
/// 134217728 with the gate on, nothing with it off.
#[test]
fn kubelets_ensure_exists_memory_low() {
    let p = pod("b", vec![container("c", "memory=128Mi", "memory=256Mi")]);
    let on = pod_cgroup_values(&p, &tiered());
    assert_eq!(on.memory_low_bytes, Some(134_217_728));
    let off = pod_cgroup_values(
        &p,
        &CgroupOptions {
            memory_qos: false,
            ..tiered()
        },
    );
    assert_eq!((off.memory_min_bytes, off.memory_low_bytes), (None, None));
}

/// `TestGenerateContainerConfigWithMemoryQoSEnforced` with kubelet's fake runtime manager
/// (memoryThrottlingFactor 0.9, node allocatable 32Gi) and a 4 KiB page: `memory.high` of a
/// container with a 256Mi limit, of one without a limit, of a BestEffort one.
#[test]
fn kubelets_generate_container_config_with_memory_qos_enforced() {
    let opts = CgroupOptions {
        memory_throttling_factor: Some(0.9),
        allocatable_memory: 32 << 30,
        ..tiered()
    };
    for (name, c, high, low) in [
        (
            "Request128MBLimit256MB",
            container("foo", "memory=128Mi", "memory=256Mi"),
            255_012_864,
            Some(134_217_728),
        ),
        (
            "Request128MBWithoutLimit",
            container("foo", "memory=128Mi", ""),
            30_937_186_304,
            Some(134_217_728),
        ),
        (
            "BestEffortUsesNodeAllocatableForMemoryHigh",
            container("foo", "", ""),
            30_923_763_712,
            None,
        ),
    ] {
        let p = pod(name, vec![c]);
        let spec = p.spec.as_ref().expect("spec");
        let v = container_cgroup_values_in(&p, &spec.containers[0], &opts);
        assert_eq!(v.memory_high_bytes, Some(high), "{name}");
        // 1.36+ (TieredReservation): a Burstable container's request is its memory.low.
        assert_eq!(v.memory_low_bytes, low, "{name}");
    }
}
