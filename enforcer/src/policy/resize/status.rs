//! What a container's status says of its resources during and after a resize (kubelet's
//! `convertToAPIContainerStatuses`): `allocatedResources` (the allocated requests) and
//! `resources` (the allocated requirements, with the cpu and memory the runtime reports it
//! actually runs with); and, with `InPlacePodLevelResourcesVerticalScaling` (KEP-5419), the
//! pod's own (`convertToAPIPodLevelResourcesStatus`, from the pod cgroup).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Container, Pod, ResourceRequirements},
    apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};

use super::actions::{ActualResources, MIN_MILLI_CPU_LIMIT};
use crate::{
    policy::resources::{
        self,
        cgroup::{MIN_SHARES, PodCgroupValues},
    },
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
    if running {
        overlay(&mut out, actual.unwrap_or_default(), old);
    }
    out
}

/// The figures read back from a running cgroup over the allocated requirements (kubelet's
/// rules for containers and, since KEP-5419, for the pod cgroup).
fn overlay(
    out: &mut ResourceRequirements,
    actual: ActualResources,
    old: Option<&ResourceRequirements>,
) {
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
}

fn k8s_list(list: resources::ResourceList) -> BTreeMap<String, K8sQuantity> {
    list.into_iter()
        .map(|(k, q)| (k, K8sQuantity(q.canonical())))
        .collect()
}

/// The pod's `status.allocatedResources` (KEP-5419, with
/// `InPlacePodLevelResourcesVerticalScaling`): kubelet's `PodRequests` of the allocated pod
/// (pod-level requests where set, else the containers' aggregate; overhead included).
#[must_use]
pub fn pod_allocated_resources(allocated: &Pod) -> BTreeMap<String, K8sQuantity> {
    k8s_list(resources::pod_requests(allocated))
}

/// The pod's `status.resources` (kubelet's `convertToAPIPodLevelResourcesStatus`): for a pod
/// not running, its effective allocated requirements (`PodRequests`, `PodLimits`); for a
/// running one, its pod-level requirements with the cpu request, cpu limit and memory limit
/// of the pod cgroup (`actual`; the smallest values keep the allocated ones, as for a
/// container) and a memory request never read from the cgroup (the pod-level one, else the
/// aggregate). A value not read keeps the last status's (`old`, given only while the pod was
/// running), else the allocated one with the pod's overhead added (a limit only when set).
#[must_use]
pub fn pod_status_resources(
    allocated: &Pod,
    running: bool,
    actual: Option<ActualResources>,
    old: Option<&ResourceRequirements>,
) -> ResourceRequirements {
    if !running {
        return ResourceRequirements {
            requests: Some(k8s_list(resources::pod_requests(allocated))),
            limits: Some(k8s_list(resources::pod_limits(allocated))),
            ..ResourceRequirements::default()
        };
    }
    let overhead = allocated.spec.as_ref().and_then(|s| s.overhead.as_ref());
    // kubelet's `preserveOldResourcesValue`.
    let preserve = |name: &str,
                    old: Option<&BTreeMap<String, K8sQuantity>>,
                    list: &mut BTreeMap<String, K8sQuantity>,
                    is_limit: bool| {
        if let Some(v) = old.and_then(|o| o.get(name)) {
            list.insert(name.to_owned(), v.clone());
            return;
        }
        if let (Some(v), Some(o)) = (list.get(name), overhead.and_then(|o| o.get(name))) {
            let v = resources::lenient(v);
            if !is_limit || !v.is_zero() {
                let sum = v.saturating_add(resources::lenient(o));
                list.insert(name.to_owned(), K8sQuantity(sum.canonical()));
            }
        }
    };
    let (old_requests, old_limits) = (
        old.and_then(|o| o.requests.as_ref()),
        old.and_then(|o| o.limits.as_ref()),
    );
    let mut out = resources::pod_level(allocated).cloned().unwrap_or_default();
    let mut requests = out.requests.take().unwrap_or_default();
    let mut limits = out.limits.take().unwrap_or_default();
    let actual = actual.unwrap_or_default();
    let min_shares = i64::try_from(MIN_SHARES).unwrap_or(2);
    match actual.cpu_request {
        Some(m) => {
            if m > min_shares || milli_of(&requests, "cpu") > min_shares {
                requests.insert("cpu".to_owned(), milli(m));
            }
        }
        None => preserve("cpu", old_requests, &mut requests, false),
    }
    if requests.contains_key("memory") {
        preserve("memory", old_requests, &mut requests, false);
    } else if let Some(m) = resources::pod_requests(allocated).get("memory") {
        requests.insert("memory".to_owned(), K8sQuantity(m.canonical()));
    }
    match actual.cpu_limit {
        Some(m) => {
            if m > MIN_MILLI_CPU_LIMIT || milli_of(&limits, "cpu") > MIN_MILLI_CPU_LIMIT {
                limits.insert("cpu".to_owned(), milli(m));
            }
        }
        None => preserve("cpu", old_limits, &mut limits, true),
    }
    match actual.memory_limit {
        Some(b) => {
            limits.insert("memory".to_owned(), bytes(b));
        }
        None => preserve("memory", old_limits, &mut limits, true),
    }
    out.requests = (!requests.is_empty()).then_some(requests);
    out.limits = (!limits.is_empty()).then_some(limits);
    out
}

/// What the pod cgroup was last written with, as the figures kubelet reads back from it
/// (`GetPodCgroupConfig`): cpu shares, CFS quota and period, memory limit.
#[must_use]
pub fn pod_cgroup_actual(v: &PodCgroupValues) -> ActualResources {
    ActualResources::from_linux(
        v.cpu_period_micros
            .and_then(|p| i64::try_from(p).ok())
            .unwrap_or(0),
        v.cpu_quota_micros.unwrap_or(-1),
        i64::try_from(v.cpu_shares).unwrap_or(0),
        v.memory_limit_bytes.unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::resources::test_pods::{container, pod, rl};

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

    /// kubelet's `convertToAPIPodLevelResourcesStatus` and the pod's `allocatedResources`.
    #[test]
    fn pod_level_status_resources_follow_the_pod_cgroup() {
        let mut p = pod(
            "p",
            vec![
                container("a", "cpu=100m,memory=64Mi", ""),
                container("b", "cpu=50m,memory=32Mi", "cpu=100m,memory=32Mi"),
            ],
        );
        p.spec.as_mut().expect("spec").resources = Some(ResourceRequirements {
            requests: rl("cpu=200m"),
            limits: rl("cpu=500m,memory=256Mi"),
            ..ResourceRequirements::default()
        });
        // allocatedResources: the pod-level cpu request, the containers' memory.
        assert_eq!(
            Some(pod_allocated_resources(&p)),
            rl("cpu=200m,memory=96Mi")
        );
        // Not running: the effective allocated requirements (PodRequests, PodLimits).
        let r = pod_status_resources(&p, false, None, None);
        assert_eq!(r.requests, rl("cpu=200m,memory=96Mi"));
        assert_eq!(r.limits, rl("cpu=500m,memory=256Mi"));
        // Running: the pod cgroup's cpu shares, quota and memory limit (mid-resize here), the
        // memory request from the aggregate (none at pod level).
        let values = PodCgroupValues {
            cpu_shares: 307,
            cpu_weight: None,
            cpu_quota_micros: Some(75_000),
            cpu_period_micros: Some(100_000),
            memory_limit_bytes: Some(300 << 20),
            memory_min_bytes: None,
            memory_low_bytes: None,
            pids_limit: None,
        };
        let r = pod_status_resources(&p, true, Some(pod_cgroup_actual(&values)), None);
        assert_eq!(r.requests, rl("cpu=300m,memory=96Mi"));
        assert_eq!(r.limits, rl("cpu=750m,memory=300Mi"));
        // Nothing read: the last status's values are kept.
        let old = ResourceRequirements {
            requests: rl("cpu=180m,memory=90Mi"),
            limits: rl("cpu=400m,memory=200Mi"),
            ..ResourceRequirements::default()
        };
        let r = pod_status_resources(&p, true, None, Some(&old));
        assert_eq!(r.requests, rl("cpu=180m,memory=96Mi"));
        assert_eq!(r.limits, rl("cpu=400m,memory=200Mi"));
        // A pod without pod-level resources, running, without a CPU limit: its cgroup's
        // shares as the cpu request, no cpu limit (quota unlimited).
        let plain = pod(
            "q",
            vec![container("a", "cpu=100m,memory=64Mi", "memory=64Mi")],
        );
        let values = PodCgroupValues {
            cpu_shares: 102,
            cpu_quota_micros: None,
            memory_limit_bytes: Some(64 << 20),
            ..values
        };
        let r = pod_status_resources(&plain, true, Some(pod_cgroup_actual(&values)), None);
        assert_eq!(r.requests, rl("cpu=100m,memory=64Mi"));
        assert_eq!(r.limits, rl("memory=64Mi"));
    }

    /// kubelet's `TestConvertToAPIPodLevelResourcesStatus` (both rows: the pod cgroup's config
    /// cannot be read): a running pod's pod-level requirements with its overhead added, or the
    /// last status's values without adding it again.
    #[test]
    fn kubelets_convert_to_api_pod_level_resources_status() {
        let mut p = pod("p", vec![container("c", "", "")]);
        let spec = p.spec.as_mut().expect("spec");
        spec.resources = Some(ResourceRequirements {
            requests: rl("cpu=1,memory=1Gi"),
            limits: rl("cpu=2,memory=2Gi"),
            ..ResourceRequirements::default()
        });
        spec.overhead = rl("cpu=500m,memory=200Mi");
        let value = |r: &Option<BTreeMap<String, K8sQuantity>>, k: &str| {
            r.as_ref()
                .and_then(|m| m.get(k))
                .map(|q| resources::lenient(q).milli_value())
        };
        // "running pod with overhead adds overhead to fallback requests and limits"
        let r = pod_status_resources(&p, true, None, None);
        assert_eq!(value(&r.requests, "cpu"), Some(1500));
        assert_eq!(value(&r.requests, "memory"), Some(1_283_457_024_000));
        assert_eq!(value(&r.limits, "cpu"), Some(2500));
        assert_eq!(value(&r.limits, "memory"), Some(2_357_198_848_000));
        // "running pod preserves old status resources without double-adding overhead"
        let old = ResourceRequirements {
            requests: rl("cpu=1.5,memory=1.2Gi"),
            limits: rl("cpu=2.5,memory=2.2Gi"),
            ..ResourceRequirements::default()
        };
        let r = pod_status_resources(&p, true, None, Some(&old));
        assert_eq!((r.requests, r.limits), (old.requests, old.limits));
    }
}
