//! Ported from kubelet's `TestGenerateLinuxContainerResourcesWithSwap`
//! (`pkg/kubelet/kuberuntime/kuberuntime_container_linux_test.go`), plus the formula and the
//! reasons.

use super::*;
use crate::policy::resources::{
    SYSTEM_CRITICAL_PRIORITY,
    test_pods::{container, pod},
};

const GI: i64 = 1 << 30;
/// The test's machine: 40Gi of memory, 5Gi of swap.
const MEMORY: i64 = 40 * GI;
const SWAP: i64 = 5 * GI;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Qos {
    Burstable,
    Guaranteed,
    BestEffort,
}

struct Case {
    name: &'static str,
    v2: bool,
    qos: Qos,
    swap_disabled_on_node: bool,
    behavior: &'static str,
    add_container_without_requests: bool,
    add_guaranteed_container: bool,
    critical: bool,
}

const fn case(name: &'static str, v2: bool, qos: Qos, behavior: &'static str) -> Case {
    Case {
        name,
        v2,
        qos,
        swap_disabled_on_node: false,
        behavior,
        add_container_without_requests: false,
        add_guaranteed_container: false,
        critical: false,
    }
}

/// The pod of the kubelet test: containers c1 and c2 with the QoS class's resources.
fn test_pod(c: &Case) -> k8s_openapi::api::core::v1::Pod {
    let (c1, c2) = match c.qos {
        Qos::Burstable => {
            let c2 = if c.add_container_without_requests {
                container("c2", "", "")
            } else if c.add_guaranteed_container {
                container("c2", "memory=2Gi", "memory=2Gi")
            } else {
                container("c2", "memory=2Gi", "")
            };
            (container("c1", "memory=1Gi", ""), c2)
        }
        Qos::Guaranteed => (
            container("c1", "memory=1Gi,cpu=1", "memory=1Gi,cpu=1"),
            container("c2", "memory=2Gi,cpu=1", "memory=2Gi,cpu=1"),
        ),
        Qos::BestEffort => (container("c1", "", ""), container("c2", "", "")),
    };
    let mut p = pod("foo", vec![c1, c2]);
    if c.critical {
        p.spec.as_mut().unwrap().priority = Some(SYSTEM_CRITICAL_PRIORITY);
        assert!(resources::is_critical(&p), "pod is expected to be critical");
    }
    p
}

#[test]
fn generate_linux_container_resources_with_swap() {
    use Qos::*;
    // The kubelet table's two "NodeSwap feature gate turned off" rows are left out: the gate
    // is GA and locked on in 1.34.
    let mut cases = vec![
        // With cgroup v1.
        case(
            "cgroups v1, LimitedSwap, Burstable QoS",
            false,
            Burstable,
            "LimitedSwap",
        ),
        case(
            "cgroups v1, LimitedSwap, Best-effort QoS",
            false,
            BestEffort,
            "LimitedSwap",
        ),
        // With no swapBehavior, NoSwap should be the default.
        case(
            "With no swapBehavior - NoSwap should be the default",
            true,
            BestEffort,
            "",
        ),
        // With Guaranteed and Best-effort QoS.
        case(
            "Best-effort QoS, cgroups v2, NoSwap",
            true,
            BestEffort,
            "NoSwap",
        ),
        case(
            "Best-effort QoS, cgroups v2, LimitedSwap",
            true,
            Burstable,
            "LimitedSwap",
        ),
        case(
            "Guaranteed QoS, cgroups v2, LimitedSwap",
            true,
            Guaranteed,
            "LimitedSwap",
        ),
        // With a "guaranteed" container (memory request equal to the limit).
        Case {
            add_guaranteed_container: true,
            ..case(
                "Burstable QoS, cgroups v2, LimitedSwap, with a guaranteed container",
                true,
                Burstable,
                "LimitedSwap",
            )
        },
        // Swap is expected to be allocated.
        case(
            "Burstable QoS, cgroups v2, LimitedSwap",
            true,
            Burstable,
            "LimitedSwap",
        ),
        Case {
            add_container_without_requests: true,
            ..case(
                "Burstable QoS, cgroups v2, LimitedSwap, with a container with no requests",
                true,
                Burstable,
                "LimitedSwap",
            )
        },
        // When the pod is critical, no swap.
        Case {
            critical: true,
            ..case(
                "Best-effort QoS, cgroups v2, LimitedSwap, critical pod",
                true,
                Burstable,
                "LimitedSwap",
            )
        },
    ];
    // All the above (but the critical pod) with swap disabled on the node.
    let disabled: Vec<Case> = cases
        .iter()
        .filter(|c| !c.critical)
        .map(|c| Case {
            swap_disabled_on_node: true,
            ..*c
        })
        .collect();
    cases.extend(disabled);
    assert_eq!(cases.len(), 19);

    for c in &cases {
        let p = test_pod(c);
        let opts = SwapOptions {
            behavior: SwapBehavior::parse(c.behavior).unwrap(),
            controller_available: !c.swap_disabled_on_node,
            memory_capacity: MEMORY,
            swap_capacity: SWAP,
        };
        let spec = p.spec.as_ref().unwrap();
        let got: Vec<SwapSetting> = spec
            .containers
            .iter()
            .map(|ct| container_swap(&p, ct, c.v2, &opts).setting)
            .collect();
        let name = format!(
            "{}{}",
            if c.swap_disabled_on_node {
                "Swap disabled on node, "
            } else {
                ""
            },
            c.name
        );
        if c.swap_disabled_on_node {
            // expectSwapDisabled: nothing written.
            assert_eq!(got, [SwapSetting::Untouched; 2], "{name}");
            continue;
        }
        let no_swap = if c.v2 {
            SwapSetting::SwapMax(0)
        } else {
            SwapSetting::SwapLimitIsMemoryLimit
        };
        if c.critical
            || !c.v2
            || (c.behavior == "LimitedSwap" && c.qos != Burstable)
            || c.behavior == "NoSwap"
            || c.behavior.is_empty()
        {
            assert_eq!(got, [no_swap; 2], "{name}");
            continue;
        }
        let c1 = calc_swap_for_burstable_pods(GI, MEMORY, SWAP).unwrap();
        let c2 = if !c.add_container_without_requests && !c.add_guaranteed_container {
            calc_swap_for_burstable_pods(2 * GI, MEMORY, SWAP).unwrap()
        } else {
            0
        };
        assert_eq!(
            got,
            [SwapSetting::SwapMax(c1), SwapSetting::SwapMax(c2)],
            "{name}"
        );
    }
}

#[test]
fn formula() {
    // (request / memory) * swap, truncated.
    assert_eq!(
        calc_swap_for_burstable_pods(GI, MEMORY, SWAP),
        Ok(128 << 20)
    );
    assert_eq!(
        calc_swap_for_burstable_pods(2 * GI, MEMORY, SWAP),
        Ok(256 << 20)
    );
    assert_eq!(calc_swap_for_burstable_pods(0, MEMORY, SWAP), Ok(0));
    assert_eq!(calc_swap_for_burstable_pods(GI, MEMORY, 0), Ok(0));
    assert_eq!(calc_swap_for_burstable_pods(MEMORY, MEMORY, SWAP), Ok(SWAP));
    assert_eq!(calc_swap_for_burstable_pods(1, 3, 10), Ok(3));
    assert_eq!(
        calc_swap_for_burstable_pods(GI, 0, SWAP),
        Err(SwapError::NoNodeMemory)
    );
    assert_eq!(
        calc_swap_for_burstable_pods(MEMORY + 1, MEMORY, SWAP),
        Err(SwapError::RequestAboveNodeMemory {
            request: MEMORY + 1,
            memory: MEMORY
        })
    );
}

#[test]
fn reasons() {
    let opts = SwapOptions {
        behavior: SwapBehavior::LimitedSwap,
        controller_available: true,
        memory_capacity: MEMORY,
        swap_capacity: SWAP,
    };
    let b = pod(
        "b",
        vec![
            container("a", "memory=1Gi", "memory=2Gi"),
            container("z", "memory=0", ""),
        ],
    );
    let spec = b.spec.as_ref().unwrap();
    let d = container_swap(&b, &spec.containers[0], true, &opts);
    assert_eq!(d.reason, SwapReason::Limited);
    assert_eq!(d.setting, SwapSetting::SwapMax(128 << 20));
    // A zero request and no limit: no swap.
    let d = container_swap(&b, &spec.containers[1], true, &opts);
    assert_eq!(d.reason, SwapReason::NoMemoryRequest);
    // A request larger than the machine: the formula fails, no swap.
    let small = SwapOptions {
        memory_capacity: GI / 2,
        ..opts
    };
    let d = container_swap(&b, &spec.containers[0], true, &small);
    assert_eq!(d.setting, SwapSetting::SwapMax(0));
    assert!(matches!(d.reason, SwapReason::Formula(_)));
    // A static pod is critical.
    let mut s = b.clone();
    s.metadata.annotations = Some(
        [(
            resources::CONFIG_SOURCE_ANNOTATION.to_owned(),
            "file".to_owned(),
        )]
        .into(),
    );
    let d = container_swap(&s, &spec.containers[0], true, &opts);
    assert_eq!(d.reason, SwapReason::CriticalPod);
    // Pod-level resources decide the QoS class: a pod-level Guaranteed pod does not swap.
    let mut g = b.clone();
    g.spec.as_mut().unwrap().resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: crate::policy::resources::test_pods::rl("cpu=1,memory=4Gi"),
        limits: crate::policy::resources::test_pods::rl("cpu=1,memory=4Gi"),
        ..Default::default()
    });
    let d = container_swap(&g, &spec.containers[0], true, &opts);
    assert_eq!(d.reason, SwapReason::NotBurstable(QosClass::Guaranteed));
    assert_eq!(SwapBehavior::parse("Unlimited"), None);
    assert_eq!(SwapBehavior::parse(""), Some(SwapBehavior::NoSwap));
    assert_eq!(SwapBehavior::LimitedSwap.as_str(), "LimitedSwap");
}
