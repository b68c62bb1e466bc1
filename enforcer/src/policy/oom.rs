//! Per-container `oom_score_adj` (`pkg/kubelet/qos/policy.go`: `GetContainerOOMScoreAdjust`).

pub mod align;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    qos::{self, QosClass},
    resources,
};

/// `oom_score_adj` of Guaranteed and node-critical containers.
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// `oom_score_adj` of BestEffort containers.
pub const BESTEFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// `oom_score_adj` of the kubelet (and the enforcer) process.
pub const KUBELET_OOM_SCORE_ADJ: i64 = -999;

/// What is wrong with the input of an OOM score computation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OomError {
    /// The node memory capacity must be positive.
    #[error("node memory capacity must be greater than zero, got {0}")]
    Capacity(i64),
}

/// Why a container got its score.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomReason {
    /// A node-critical pod.
    NodeCritical,
    /// A Guaranteed pod.
    Guaranteed,
    /// A BestEffort pod.
    BestEffort,
    /// A Burstable pod: from the memory request.
    Burstable,
}

/// An `oom_score_adj` decision.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomScore {
    /// The value to write to `/proc/<pid>/oom_score_adj`.
    pub value: i64,
    /// Why.
    pub reason: OomReason,
}

fn memory_request(c: &Container) -> i64 {
    resources::container_requests(c)
        .get("memory")
        .map_or(0, crate::quantity::Quantity::value)
}

/// `remainingPodMemReqPerContainer`: pod-level memory request not given to containers,
/// shared equally among all containers.
fn remaining_per_container(pod: &Pod) -> i64 {
    let pod_req = resources::pod_level(pod)
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("memory"))
        .map_or(0, |q| resources::lenient(q).value());
    if pod_req == 0 {
        return 0;
    }
    let n = resources::containers(pod).len() + resources::init_containers(pod).len();
    let Ok(n) = i64::try_from(n) else { return 0 };
    if n == 0 {
        return 0;
    }
    let mut tmp = pod.clone();
    if let Some(spec) = tmp.spec.as_mut() {
        spec.resources = None;
        spec.overhead = None;
    }
    let aggregated = resources::pod_requests(&tmp)
        .get("memory")
        .map_or(0, crate::quantity::Quantity::value);
    pod_req.saturating_sub(aggregated) / n
}

fn pod_level_requests_set(pod: &Pod) -> bool {
    resources::pod_level(pod)
        .and_then(|r| r.requests.as_ref())
        .is_some_and(|r| {
            r.iter().any(|(k, v)| {
                resources::is_supported_pod_level_resource(k) && !resources::lenient(v).is_zero()
            })
        })
}

fn burstable_formula(request: i64, capacity: i64) -> i64 {
    let r = i128::from(request);
    let v = 1000 - (1000 * r) / i128::from(capacity);
    i64::try_from(v).unwrap_or(i64::MIN)
}

/// `GetContainerOOMScoreAdjust` for `container` of `pod` on a node with `memory_capacity`
/// bytes. The pod should be API-defaulted ([`resources::apply_defaults`]).
pub fn container_oom_score_adj(
    pod: &Pod,
    container: &Container,
    memory_capacity: i64,
) -> Result<OomScore, OomError> {
    if memory_capacity <= 0 {
        return Err(OomError::Capacity(memory_capacity));
    }
    if resources::is_node_critical(pod) {
        return Ok(OomScore {
            value: GUARANTEED_OOM_SCORE_ADJ,
            reason: OomReason::NodeCritical,
        });
    }
    match qos::pod_qos(pod) {
        QosClass::Guaranteed => {
            return Ok(OomScore {
                value: GUARANTEED_OOM_SCORE_ADJ,
                reason: OomReason::Guaranteed,
            });
        }
        QosClass::BestEffort => {
            return Ok(OomScore {
                value: BESTEFFORT_OOM_SCORE_ADJ,
                reason: OomReason::BestEffort,
            });
        }
        QosClass::Burstable => {}
    }
    let pod_level = pod_level_requests_set(pod);
    let remaining = if pod_level {
        remaining_per_container(pod)
    } else {
        0
    };
    let mut adj = burstable_formula(
        memory_request(container).saturating_add(remaining),
        memory_capacity,
    );
    let is_sidecar = resources::init_containers(pod)
        .iter()
        .any(|c| c.name == container.name)
        && resources::is_sidecar(container);
    if is_sidecar && let Some(min) = resources::containers(pod).iter().map(memory_request).min() {
        let min_adj = burstable_formula(min.saturating_add(remaining), memory_capacity);
        adj = adj.min(min_adj);
    }
    let value = if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        1000 + GUARANTEED_OOM_SCORE_ADJ
    } else if adj == BESTEFFORT_OOM_SCORE_ADJ {
        adj - 1
    } else {
        adj
    };
    Ok(OomScore {
        value,
        reason: OomReason::Burstable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::resources::test_pods::{container, pod};

    const CAP: i64 = 4_000_000_000;

    #[test]
    fn kubelet_policy_cases() {
        // After pkg/kubelet/qos/policy_test.go (TestGetContainerOOMScoreAdjust), standardMemoryAmount = 8000000000.
        let cap = 8_000_000_000;
        let cases: Vec<(Vec<(&str, &str)>, i64)> = vec![
            (vec![("", "")], 1000),                                   // best effort
            (vec![("cpu=10,memory=10G", "cpu=10,memory=10G")], -997), // guaranteed
            (vec![("memory=4000000000", "memory=8000000000")], 500),  // burstable, half of node
            (vec![("memory=1", "memory=8000000000")], 999), // nearly zero request -> 1000 -> 999
            (vec![("memory=8000000000", "memory=9000000000")], 3), // whole node -> 0 -> 3
            (vec![("cpu=1", "")], 999),                     // no memory request
            (vec![("memory=7999999999", "memory=8000000000")], 3),
        ];
        for (i, (cs, want)) in cases.into_iter().enumerate() {
            let containers: Vec<_> = cs
                .iter()
                .enumerate()
                .map(|(j, (r, l))| container(&format!("c{j}"), r, l))
                .collect();
            let p = pod("p", containers.clone());
            assert_eq!(
                container_oom_score_adj(&p, &containers[0], cap)
                    .unwrap()
                    .value,
                want,
                "case {i}"
            );
        }
    }

    #[test]
    fn node_critical_and_sidecars() {
        let mut p = pod("p", vec![container("a", "memory=1G", "memory=2G")]);
        p.spec.as_mut().unwrap().priority = Some(2_000_001_000);
        p.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
        let c = p.spec.as_ref().unwrap().containers[0].clone();
        assert_eq!(container_oom_score_adj(&p, &c, CAP).unwrap().value, -997);

        // A sidecar requesting less than the smallest regular container gets the regular value.
        let mut p = pod(
            "p",
            vec![
                container("a", "memory=2G", "memory=3G"),
                container("b", "memory=1G", ""),
            ],
        );
        let mut s = container("s", "memory=100M", "");
        s.restart_policy = Some("Always".into());
        p.spec.as_mut().unwrap().init_containers = Some(vec![s.clone()]);
        assert_eq!(container_oom_score_adj(&p, &s, CAP).unwrap().value, 750);
        let b = p.spec.as_ref().unwrap().containers[1].clone();
        assert_eq!(container_oom_score_adj(&p, &b, CAP).unwrap().value, 750);
        assert!(container_oom_score_adj(&p, &b, 0).is_err());
    }
}
