//! The pod QoS class (`pkg/apis/core/v1/helper/qos`: `GetPodQOS`, `ComputePodQOS`).

use std::{collections::BTreeMap, fmt};

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::resources::{self, ResourceList};
use crate::quantity::Quantity;

/// A pod's QoS class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum QosClass {
    /// Every container has equal cpu and memory requests and limits.
    Guaranteed,
    /// Anything in between.
    Burstable,
    /// No requests and no limits at all.
    BestEffort,
}

impl QosClass {
    /// The API name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }

    /// Parses `status.qosClass`.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Guaranteed" => Some(Self::Guaranteed),
            "Burstable" => Some(Self::Burstable),
            "BestEffort" => Some(Self::BestEffort),
            _ => None,
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn supported(name: &str) -> bool {
    name == "cpu" || name == "memory"
}

/// Adds the positive cpu/memory values of `from` into `into`; returns the names seen.
fn accumulate(into: &mut BTreeMap<String, Quantity>, from: &ResourceList) -> (bool, bool) {
    let (mut cpu, mut mem) = (false, false);
    for (name, q) in from {
        if !supported(name) || q.signum() <= 0 {
            continue;
        }
        cpu |= name == "cpu";
        mem |= name == "memory";
        into.entry(name.clone())
            .and_modify(|v| *v = v.saturating_add(*q))
            .or_insert(*q);
    }
    (cpu, mem)
}

/// `GetPodQOS`: `status.qosClass` when set, else [`compute`].
#[must_use]
pub fn pod_qos(pod: &Pod) -> QosClass {
    pod.status
        .as_ref()
        .and_then(|s| s.qos_class.as_deref())
        .and_then(QosClass::parse)
        .unwrap_or_else(|| compute(pod))
}

/// `ComputePodQOS`. App and init containers count (ephemeral containers do not); only cpu and
/// memory with values > 0. Pod-level `spec.resources`, when set, alone decides.
#[must_use]
pub fn compute(pod: &Pod) -> QosClass {
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    let mut guaranteed = true;
    if let Some(pl) = resources::pod_level(pod) {
        let reqs = pl.requests.as_ref().map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), resources::lenient(v)))
                .collect()
        });
        let lims: Option<ResourceList> = pl.limits.as_ref().map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), resources::lenient(v)))
                .collect()
        });
        if let Some(reqs) = reqs.filter(|r: &ResourceList| !r.is_empty()) {
            accumulate(&mut requests, &reqs);
        }
        if let Some(lims) = lims.filter(|l| !l.is_empty()) {
            let (cpu, mem) = accumulate(&mut limits, &lims);
            if !(cpu && mem) {
                guaranteed = false;
            }
        }
    } else {
        for c in resources::containers(pod)
            .iter()
            .chain(resources::init_containers(pod))
        {
            accumulate(&mut requests, &resources::container_requests(c));
            let (cpu, mem) = accumulate(&mut limits, &resources::container_limits(c));
            if !(cpu && mem) {
                guaranteed = false;
            }
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    if guaranteed
        && requests
            .iter()
            .any(|(name, req)| limits.get(name) != Some(req))
    {
        guaranteed = false;
    }
    if guaranteed && requests.len() == limits.len() {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::resources::test_pods::{container, pod, rl};

    #[test]
    fn kubelet_qos_cases() {
        // After pkg/apis/core/v1/helper/qos/qos_test.go (TestComputePodQOS).
        let cases: Vec<(Vec<(&str, &str)>, QosClass)> = vec![
            (
                vec![("cpu=100m,memory=100Mi", "cpu=100m,memory=100Mi")],
                QosClass::Guaranteed,
            ),
            (
                vec![("cpu=100m,memory=100Mi", "cpu=100m,memory=100Mi"); 2],
                QosClass::Guaranteed,
            ),
            (vec![("", "")], QosClass::BestEffort),
            (vec![("", ""), ("", "")], QosClass::BestEffort),
            (vec![("", ""), ("cpu=100m", "")], QosClass::Burstable),
            (
                vec![("cpu=100m,memory=100Mi", "cpu=100m,memory=100Mi"), ("", "")],
                QosClass::Burstable,
            ),
            (
                vec![("cpu=100m,memory=100Mi", "cpu=200m,memory=100Mi")],
                QosClass::Burstable,
            ),
            (vec![("cpu=100m", "cpu=100m")], QosClass::Burstable),
            (
                vec![("cpu=100m,memory=100Mi", "cpu=100m")],
                QosClass::Burstable,
            ),
            // Zero values do not count.
            (vec![("cpu=0,memory=0", "")], QosClass::BestEffort),
            // Extended resources do not count.
            (
                vec![("nvidia.com/gpu=1", "nvidia.com/gpu=1")],
                QosClass::BestEffort,
            ),
            (
                vec![(
                    "cpu=100m,memory=100Mi,nvidia.com/gpu=1",
                    "cpu=100m,memory=100Mi,nvidia.com/gpu=2",
                )],
                QosClass::Guaranteed,
            ),
            // Requests summed across containers compared against summed limits.
            (
                vec![
                    ("cpu=100m,memory=50Mi", "cpu=100m,memory=100Mi"),
                    ("cpu=100m,memory=100Mi", "cpu=100m,memory=100Mi"),
                ],
                QosClass::Burstable,
            ),
        ];
        for (i, (cs, want)) in cases.into_iter().enumerate() {
            let containers = cs
                .iter()
                .enumerate()
                .map(|(j, (r, l))| container(&format!("c{j}"), r, l))
                .collect();
            assert_eq!(compute(&pod("p", containers)), want, "case {i}");
        }
    }

    #[test]
    fn init_containers_and_pod_level() {
        let mut p = pod(
            "p",
            vec![container("a", "cpu=1,memory=1Gi", "cpu=1,memory=1Gi")],
        );
        p.spec.as_mut().unwrap().init_containers = Some(vec![container("i", "cpu=1", "")]);
        assert_eq!(compute(&p), QosClass::Burstable);
        // Pod-level resources decide alone.
        let mut p = pod("p", vec![container("a", "", "")]);
        p.spec.as_mut().unwrap().resources =
            Some(k8s_openapi::api::core::v1::ResourceRequirements {
                requests: rl("cpu=1,memory=1Gi"),
                limits: rl("cpu=1,memory=1Gi"),
                ..Default::default()
            });
        assert_eq!(compute(&p), QosClass::Guaranteed);
        p.spec.as_mut().unwrap().resources.as_mut().unwrap().limits = None;
        assert_eq!(compute(&p), QosClass::Burstable);
        // status.qosClass wins.
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            qos_class: Some("BestEffort".into()),
            ..Default::default()
        });
        assert_eq!(pod_qos(&p), QosClass::BestEffort);
    }
}
