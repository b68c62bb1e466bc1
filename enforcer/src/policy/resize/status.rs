//! What a container's status says of its resources during and after a resize (kubelet's
//! `convertToAPIContainerStatuses`): `allocatedResources` (the allocated requests) and
//! `resources` (the allocated requirements, with the cpu and memory the runtime reports it
//! actually runs with).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Container, ResourceRequirements},
    apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};

use super::actions::{ActualResources, MIN_MILLI_CPU_LIMIT};
use crate::{
    policy::resources::{self, cgroup::MIN_SHARES},
    quantity::{Format, Quantity},
};

/// `status.containerStatuses[].allocatedResources`: the allocated container's requests.
#[must_use]
pub fn allocated_resources(allocated: &Container) -> Option<BTreeMap<String, K8sQuantity>> {
    allocated
        .resources
        .as_ref()
        .and_then(|r| r.requests.clone())
}

fn milli(milli: i64) -> K8sQuantity {
    K8sQuantity(Quantity::from_milli(milli, Format::DecimalSI).canonical())
}

fn bytes(bytes: i64) -> K8sQuantity {
    K8sQuantity(Quantity::from_int(bytes, Format::BinarySI).canonical())
}

fn milli_of(list: &BTreeMap<String, K8sQuantity>, name: &str) -> i64 {
    list.get(name)
        .map_or(0, |q| resources::lenient(q).milli_value())
}

fn preserve(
    into: &mut BTreeMap<String, K8sQuantity>,
    name: &str,
    old: Option<&BTreeMap<String, K8sQuantity>>,
) {
    if let Some(v) = old.and_then(|o| o.get(name)) {
        into.insert(name.to_owned(), v.clone());
    }
}

/// `convertContainerStatusResources`: for a container not running, its allocated
/// requirements; for a running one, those with the cpu limit, memory limit and cpu request
/// the runtime reports (a value the runtime does not report keeps the last status's, `old`,
/// given only for the same running container). A cpu limit or request at or below the
/// smallest effective value on both sides keeps the allocated value.
#[must_use]
pub fn container_status_resources(
    allocated: &Container,
    running: bool,
    actual: Option<ActualResources>,
    old: Option<&ResourceRequirements>,
) -> ResourceRequirements {
    let mut out = allocated.resources.clone().unwrap_or_default();
    if !running {
        return out;
    }
    let actual = actual.unwrap_or_default();
    let min_shares = i64::try_from(MIN_SHARES).unwrap_or(2);
    if let Some(limits) = out.limits.as_mut() {
        let old_limits = old.and_then(|o| o.limits.as_ref());
        match actual.cpu_limit {
            Some(m) if m > MIN_MILLI_CPU_LIMIT || milli_of(limits, "cpu") > MIN_MILLI_CPU_LIMIT => {
                limits.insert("cpu".to_owned(), milli(m));
            }
            Some(_) => {}
            None => preserve(limits, "cpu", old_limits),
        }
        match actual.memory_limit {
            Some(b) => {
                limits.insert("memory".to_owned(), bytes(b));
            }
            None => preserve(limits, "memory", old_limits),
        }
    }
    if let Some(requests) = out.requests.as_mut() {
        match actual.cpu_request {
            Some(m) if m > min_shares || milli_of(requests, "cpu") > min_shares => {
                requests.insert("cpu".to_owned(), milli(m));
            }
            Some(_) => {}
            None => preserve(requests, "cpu", old.and_then(|o| o.requests.as_ref())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::resources::test_pods::{container, rl};

    #[test]
    fn status_resources_follow_the_runtime() {
        let c = container("c", "cpu=500m,memory=100Mi", "cpu=1,memory=200Mi");
        let actual = ActualResources {
            memory_limit: Some(100 << 20),
            cpu_limit: Some(750),
            cpu_request: Some(250),
        };
        // Not running: the allocated requirements.
        let r = container_status_resources(&c, false, Some(actual), None);
        assert_eq!(r.limits, rl("cpu=1,memory=200Mi"));
        // Running mid-resize: what the runtime runs with; the memory request stays allocated.
        let r = container_status_resources(&c, true, Some(actual), None);
        assert_eq!(r.limits, rl("cpu=750m,memory=100Mi"));
        assert_eq!(r.requests, rl("cpu=250m,memory=100Mi"));
        assert_eq!(allocated_resources(&c), rl("cpu=500m,memory=100Mi"));
        // Nothing reported: the last status's values, else the allocated ones.
        let old = ResourceRequirements {
            limits: rl("cpu=900m"),
            requests: rl("cpu=400m"),
            ..ResourceRequirements::default()
        };
        let r = container_status_resources(&c, true, None, Some(&old));
        assert_eq!(r.limits, rl("cpu=900m,memory=200Mi"));
        assert_eq!(r.requests, rl("cpu=400m,memory=100Mi"));
        // At or below the minimum on both sides: the allocated value.
        let tiny = container("t", "cpu=1m", "cpu=5m");
        let low = ActualResources {
            memory_limit: None,
            cpu_limit: Some(10),
            cpu_request: Some(2),
        };
        let r = container_status_resources(&tiny, true, Some(low), None);
        assert_eq!((r.limits, r.requests), (rl("cpu=5m"), rl("cpu=1m")));
    }
}
