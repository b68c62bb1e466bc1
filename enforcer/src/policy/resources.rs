//! Pod requests and limits, API defaulting and the pod facts kubelet's policies share.
//!
//! Kubelet: `k8s.io/component-helpers/resource` (`PodRequests`, `PodLimits`,
//! `AggregateContainerRequests`), `pkg/apis/core/v1/defaults.go`, `pkg/kubelet/types`
//! (`IsCriticalPod`, `IsStaticPod`, `IsMirrorPod`).

pub mod cgroup;
#[cfg(test)]
mod memory_qos_tests;
#[cfg(test)]
mod pod_level_tests;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};

use crate::quantity::{Format, Quantity, QuantityError};

/// Resource name -> quantity.
pub type ResourceList = BTreeMap<String, Quantity>;

/// `scheduling.SystemCriticalPriority`: pods at or above it are critical.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// The priority class of node-critical pods.
pub const SYSTEM_NODE_CRITICAL: &str = "system-node-critical";
/// The default `terminationGracePeriodSeconds`.
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;

/// The pod's grace period to kill it with, in seconds: its `terminationGracePeriodSeconds`, the
/// API's default when unset, at least 1 (the runtime's floor of 2 s applies per container
/// stop).
#[must_use]
pub fn termination_grace_seconds(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS)
        .max(1)
}
/// Annotation naming a pod's source (`file`, `http`, `api`).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// Annotation marking a mirror pod.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What is wrong with a pod's resources.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// A quantity in the pod does not parse.
    #[error("pod {pod:?}: {place}: {source}")]
    Quantity {
        /// The pod's name.
        pod: String,
        /// Where, e.g. `spec.containers[0].resources.requests.memory`.
        place: String,
        /// The parse error.
        source: QuantityError,
    },
    /// A request or limit is negative.
    #[error("pod {pod:?}: {place}: must be greater than or equal to 0, got {value}")]
    Negative {
        /// The pod's name.
        pod: String,
        /// Where.
        place: String,
        /// The value as written.
        value: String,
    },
    /// A request exceeds its limit.
    #[error(
        "pod {pod:?}: {place}: request {request} must be less than or equal to the limit {limit}"
    )]
    RequestAboveLimit {
        /// The pod's name.
        pod: String,
        /// Where.
        place: String,
        /// The request.
        request: String,
        /// The limit.
        limit: String,
    },
    /// The pod has no containers.
    #[error("pod {0:?}: spec.containers: must have at least one container")]
    NoContainers(String),
}

/// The pod's name (`metadata.name`), or `""`.
#[must_use]
pub fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}

/// The pod's namespace, or `default`.
#[must_use]
pub fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// The pod's uid, or `""`.
#[must_use]
pub fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}

/// `PodPriority`: `spec.priority`, 0 when unset.
#[must_use]
pub fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// `IsStaticPod`: the source annotation is present and not `api`.
#[must_use]
pub fn is_static(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION).is_some_and(|s| s != "api")
}

/// `IsMirrorPod`: the mirror annotation is present.
#[must_use]
pub fn is_mirror(pod: &Pod) -> bool {
    annotation(pod, CONFIG_MIRROR_ANNOTATION).is_some()
}

/// `IsCriticalPod`: static, mirror, or priority >= 2000000000.
#[must_use]
pub fn is_critical(pod: &Pod) -> bool {
    is_static(pod) || is_mirror(pod) || priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

/// `IsNodeCriticalPod`: critical and of priority class `system-node-critical`.
#[must_use]
pub fn is_node_critical(pod: &Pod) -> bool {
    is_critical(pod)
        && pod
            .spec
            .as_ref()
            .and_then(|s| s.priority_class_name.as_deref())
            == Some(SYSTEM_NODE_CRITICAL)
}

/// The pod's regular containers.
#[must_use]
pub fn containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().map_or(&[], |s| s.containers.as_slice())
}

/// The pod's init containers.
#[must_use]
pub fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[])
}

/// A sidecar: an init container with `restartPolicy: Always`.
#[must_use]
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// Parses a k8s quantity leniently: a malformed one counts as zero. Pods reaching the policy
/// have been checked with [`validate_pod`]; this only keeps the policy total.
#[must_use]
pub fn lenient(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Quantity {
    Quantity::from_k8s(q).unwrap_or_default()
}

fn list(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> ResourceList {
    map.map(|m| m.iter().map(|(k, v)| (k.clone(), lenient(v))).collect())
        .unwrap_or_default()
}

/// A container's requests.
#[must_use]
pub fn container_requests(container: &Container) -> ResourceList {
    list(
        container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref()),
    )
}

/// A container's limits.
#[must_use]
pub fn container_limits(container: &Container) -> ResourceList {
    list(container.resources.as_ref().and_then(|r| r.limits.as_ref()))
}

/// The pod-level `spec.resources`, when set.
#[must_use]
pub fn pod_level(pod: &Pod) -> Option<&ResourceRequirements> {
    pod.spec.as_ref().and_then(|s| s.resources.as_ref())
}

/// `container` with the pod-level cpu and memory limits in place of those it does not set
/// (kubelet's `GetLimits` for a container of a pod with pod-level resources): what it runs
/// with, and what a pod-level resize changes for it.
#[must_use]
pub fn with_pod_level_limits(pod: &Pod, container: &Container) -> Container {
    let mut out = container.clone();
    let Some(pod_limits) = pod_level(pod)
        .filter(|_| is_pod_level_resources_set(pod))
        .and_then(|r| r.limits.as_ref())
    else {
        return out;
    };
    let own = container_limits(container);
    for r in ["cpu", "memory"] {
        let Some(q) = pod_limits.get(r) else {
            continue;
        };
        if own.get(r).is_some_and(|v| !v.is_zero()) {
            continue;
        }
        out.resources
            .get_or_insert_with(ResourceRequirements::default)
            .limits
            .get_or_insert_with(BTreeMap::new)
            .insert(r.to_owned(), q.clone());
    }
    out
}

/// Resources that may be set at pod level (`IsSupportedPodLevelResource`): cpu, memory and
/// hugepages.
#[must_use]
pub fn is_supported_pod_level_resource(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with(HUGEPAGES_PREFIX)
}

/// The prefix of hugepages resources (`hugepages-2Mi`).
pub const HUGEPAGES_PREFIX: &str = "hugepages-";

fn has_supported(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> bool {
    map.is_some_and(|m| m.keys().any(|k| is_supported_pod_level_resource(k)))
}

/// `IsPodLevelResourcesSet`: pod-level requests or limits name a supported resource.
#[must_use]
pub fn is_pod_level_resources_set(pod: &Pod) -> bool {
    pod_level(pod)
        .is_some_and(|r| has_supported(r.requests.as_ref()) || has_supported(r.limits.as_ref()))
}

/// `IsPodLevelRequestsSet`: pod-level requests name a supported resource.
#[must_use]
pub fn is_pod_level_requests_set(pod: &Pod) -> bool {
    pod_level(pod).is_some_and(|r| has_supported(r.requests.as_ref()))
}

/// `IsPodLevelLimitsSet`: pod-level limits name a supported resource.
#[must_use]
pub fn is_pod_level_limits_set(pod: &Pod) -> bool {
    pod_level(pod).is_some_and(|r| has_supported(r.limits.as_ref()))
}

fn add(into: &mut ResourceList, from: &ResourceList) {
    for (name, q) in from {
        into.entry(name.clone())
            .and_modify(|v| *v = v.saturating_add(*q))
            .or_insert(*q);
    }
}

fn max_into(into: &mut ResourceList, from: &ResourceList) {
    for (name, q) in from {
        match into.get_mut(name) {
            Some(v) if *v >= *q => {}
            Some(v) => *v = *q,
            None => {
                into.insert(name.clone(), *q);
            }
        }
    }
}

/// Which aggregate: requests or limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Requests,
    Limits,
}

/// `AggregateContainerRequests` / `AggregateContainerLimits` with the sidecar rules;
/// `each` sees every container's (cumulative for init containers) list, as `ContainerFn`.
fn aggregate(pod: &Pod, kind: Kind, mut each: impl FnMut(&ResourceList)) -> ResourceList {
    let get = |c: &Container| {
        if kind == Kind::Requests {
            container_requests(c)
        } else {
            container_limits(c)
        }
    };
    let mut total = ResourceList::new();
    for c in containers(pod) {
        let l = get(c);
        each(&l);
        add(&mut total, &l);
    }
    let mut sidecars = ResourceList::new();
    let mut init_max = ResourceList::new();
    for c in init_containers(pod) {
        let l = get(c);
        let effective = if is_sidecar(c) {
            add(&mut total, &l);
            add(&mut sidecars, &l);
            sidecars.clone()
        } else {
            let mut tmp = l;
            add(&mut tmp, &sidecars);
            tmp
        };
        each(&effective);
        max_into(&mut init_max, &effective);
    }
    max_into(&mut total, &init_max);
    total
}

/// `PodRequests`: container requests aggregated (sidecar-aware), pod-level requests for cpu
/// and memory when set, plus pod overhead.
#[must_use]
pub fn pod_requests(pod: &Pod) -> ResourceList {
    let mut reqs = aggregate(pod, Kind::Requests, |_| {});
    if let Some(pl) = pod_level(pod) {
        for (name, q) in list(pl.requests.as_ref()) {
            if is_supported_pod_level_resource(&name) {
                reqs.insert(name, q);
            }
        }
    }
    if let Some(overhead) = pod.spec.as_ref().and_then(|s| s.overhead.as_ref()) {
        add(&mut reqs, &list(Some(overhead)));
    }
    reqs
}

/// `PodLimits`, with `each` called for every container's limits (as `ContainerFn`).
#[must_use]
pub fn pod_limits_with(pod: &Pod, each: impl FnMut(&ResourceList)) -> ResourceList {
    let mut limits = aggregate(pod, Kind::Limits, each);
    if let Some(pl) = pod_level(pod) {
        for (name, q) in list(pl.limits.as_ref()) {
            if is_supported_pod_level_resource(&name) {
                limits.insert(name, q);
            }
        }
    }
    if let Some(overhead) = pod.spec.as_ref().and_then(|s| s.overhead.as_ref()) {
        for (name, q) in list(Some(overhead)) {
            if let Some(v) = limits.get_mut(&name) {
                *v = v.saturating_add(q);
            }
        }
    }
    limits
}

/// `PodLimits`.
#[must_use]
pub fn pod_limits(pod: &Pod) -> ResourceList {
    pod_limits_with(pod, |_| {})
}

/// One resource of a container's requests.
fn container_request(container: &Container, resource: &str) -> i128 {
    container
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(resource))
        .map_or(0, |q| lenient(q).nanos())
}

/// [`pod_requests`] for a single resource, in nano-units, without building the maps (the
/// eviction ranking computes it for every pod).
#[must_use]
pub fn pod_request_nanos(pod: &Pod, resource: &str) -> i128 {
    if is_supported_pod_level_resource(resource)
        && let Some(q) = pod_level(pod)
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource))
    {
        return lenient(q)
            .nanos()
            .saturating_add(overhead_nanos(pod, resource));
    }
    let mut total: i128 = containers(pod)
        .iter()
        .map(|c| container_request(c, resource))
        .fold(0, i128::saturating_add);
    let mut sidecars: i128 = 0;
    let mut init_max: i128 = 0;
    for c in init_containers(pod) {
        let r = container_request(c, resource);
        let effective = if is_sidecar(c) {
            total = total.saturating_add(r);
            sidecars = sidecars.saturating_add(r);
            sidecars
        } else {
            r.saturating_add(sidecars)
        };
        init_max = init_max.max(effective);
    }
    total
        .max(init_max)
        .saturating_add(overhead_nanos(pod, resource))
}

fn overhead_nanos(pod: &Pod, resource: &str) -> i128 {
    pod.spec
        .as_ref()
        .and_then(|s| s.overhead.as_ref())
        .and_then(|o| o.get(resource))
        .map_or(0, |q| lenient(q).nanos())
}

/// `GetResourceRequestQuantity`: the pod's request for one resource (zero when none).
#[must_use]
pub fn pod_request(pod: &Pod, resource: &str) -> Quantity {
    let format = match resource {
        "memory" | "storage" | "ephemeral-storage" => Format::BinarySI,
        _ => Format::DecimalSI,
    };
    Quantity::from_nanos(pod_request_nanos(pod, resource), format).unwrap_or(Quantity::zero(format))
}

/// The part of API defaulting that policy depends on (`SetDefaults_Pod`,
/// `SetDefaults_PodSpec`): container (and pod-level) requests default to their limits, and
/// `terminationGracePeriodSeconds` to 30. Kubelet sees API-server pods already defaulted and
/// defaults static pods read from files the same way.
pub fn apply_defaults(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let default_requests = |r: &mut ResourceRequirements| {
        if let Some(limits) = r.limits.clone() {
            let requests = r.requests.get_or_insert_with(BTreeMap::new);
            for (name, q) in limits {
                requests.entry(name).or_insert(q);
            }
        }
    };
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        if let Some(r) = c.resources.as_mut() {
            default_requests(r);
        }
    }
    if let Some(r) = spec.resources.as_mut() {
        default_requests(r);
    }
    if spec.termination_grace_period_seconds.is_none() {
        spec.termination_grace_period_seconds = Some(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
    }
    // The API server's Priority admission resolves the built-in priority classes; pods read
    // from files (no API server) get the same value, so `system-node-critical` is critical.
    if spec.priority.is_none() {
        spec.priority = spec
            .priority_class_name
            .as_deref()
            .and_then(builtin_priority);
    }
}

/// The value of a built-in priority class (`system-node-critical` 2000001000,
/// `system-cluster-critical` 2000000000), as the API server defines them.
#[must_use]
pub fn builtin_priority(class: &str) -> Option<i32> {
    match class {
        SYSTEM_NODE_CRITICAL => Some(SYSTEM_CRITICAL_PRIORITY + 1000),
        "system-cluster-critical" => Some(SYSTEM_CRITICAL_PRIORITY),
        _ => None,
    }
}

/// Checks every quantity in a pod: parseable, not negative, request <= limit.
pub fn validate_pod(pod: &Pod) -> Result<(), ResourceError> {
    let name = pod_name(pod).to_owned();
    let Some(spec) = pod.spec.as_ref() else {
        return Err(ResourceError::NoContainers(name));
    };
    if spec.containers.is_empty() {
        return Err(ResourceError::NoContainers(name));
    }
    let check = |place: String, r: &ResourceRequirements| -> Result<(), ResourceError> {
        let mut parsed: [ResourceList; 2] = Default::default();
        for (i, (kind, map)) in [("requests", &r.requests), ("limits", &r.limits)]
            .into_iter()
            .enumerate()
        {
            for (res, q) in map.iter().flatten() {
                let at = format!("{place}.{kind}.{res}");
                let v = Quantity::from_k8s(q).map_err(|source| ResourceError::Quantity {
                    pod: name.clone(),
                    place: at.clone(),
                    source,
                })?;
                if v.signum() < 0 {
                    return Err(ResourceError::Negative {
                        pod: name.clone(),
                        place: at,
                        value: q.0.clone(),
                    });
                }
                parsed[i].insert(res.clone(), v);
            }
        }
        for (res, req) in &parsed[0] {
            if let Some(lim) = parsed[1].get(res)
                && req > lim
            {
                return Err(ResourceError::RequestAboveLimit {
                    pod: name.clone(),
                    place: format!("{place}.requests.{res}"),
                    request: req.to_string(),
                    limit: lim.to_string(),
                });
            }
        }
        Ok(())
    };
    for (field, list) in [
        ("containers", Some(&spec.containers)),
        ("initContainers", spec.init_containers.as_ref()),
    ] {
        for (i, c) in list.into_iter().flatten().enumerate() {
            if let Some(r) = c.resources.as_ref() {
                check(format!("spec.{field}[{i}].resources"), r)?;
            }
        }
    }
    if let Some(r) = spec.resources.as_ref() {
        check("spec.resources".to_owned(), r)?;
    }
    for (res, q) in spec.overhead.iter().flatten() {
        let place = format!("spec.overhead.{res}");
        let v = Quantity::from_k8s(q).map_err(|source| ResourceError::Quantity {
            pod: name.clone(),
            place: place.clone(),
            source,
        })?;
        if v.signum() < 0 {
            return Err(ResourceError::Negative {
                pod: name.clone(),
                place,
                value: q.0.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod test_pods {
    //! Compact pod builders for the policy tests.
    use k8s_openapi::{
        api::core::v1::{Container, Pod, PodSpec, ResourceRequirements},
        apimachinery::pkg::{api::resource::Quantity as K8sQuantity, apis::meta::v1::ObjectMeta},
    };

    /// `"cpu=100m,memory=1Gi"` -> a resource map.
    pub fn rl(s: &str) -> Option<std::collections::BTreeMap<String, K8sQuantity>> {
        if s.is_empty() {
            return None;
        }
        Some(
            s.split(',')
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_owned(), K8sQuantity(v.to_owned()))
                })
                .collect(),
        )
    }

    /// A container with requests and limits in `rl` syntax.
    pub fn container(name: &str, requests: &str, limits: &str) -> Container {
        Container {
            name: name.to_owned(),
            resources: Some(ResourceRequirements {
                requests: rl(requests),
                limits: rl(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A pod with the given containers.
    pub fn pod(name: &str, containers: Vec<Container>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("default".to_owned()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers,
                ..Default::default()
            }),
            status: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{test_pods::*, *};

    #[test]
    fn requests_with_init_and_sidecars() {
        // Cases after component-helpers' TestPodRequestsAndLimits / sidecar KEP examples.
        let mut p = pod(
            "p",
            vec![
                container("a", "cpu=1,memory=1Gi", ""),
                container("b", "cpu=500m", ""),
            ],
        );
        assert_eq!(pod_requests(&p)["cpu"].milli_value(), 1500);
        // A regular init container raises the request when bigger.
        p.spec.as_mut().unwrap().init_containers =
            Some(vec![container("i", "cpu=2,memory=512Mi", "")]);
        let r = pod_requests(&p);
        assert_eq!(r["cpu"].milli_value(), 2000);
        assert_eq!(r["memory"].value(), 1 << 30);
        // A sidecar adds to the regular containers and to later init containers.
        let mut sidecar = container("s", "cpu=1", "");
        sidecar.restart_policy = Some("Always".to_owned());
        p.spec.as_mut().unwrap().init_containers = Some(vec![sidecar, container("i", "cpu=2", "")]);
        assert_eq!(pod_requests(&p)["cpu"].milli_value(), 3000);
        // Overhead is added.
        p.spec.as_mut().unwrap().overhead = rl("cpu=250m");
        assert_eq!(pod_requests(&p)["cpu"].milli_value(), 3250);
        assert_eq!(pod_request(&p, "cpu").milli_value(), 3250);
        assert_eq!(pod_request(&p, "memory").value(), 1 << 30);
        assert_eq!(
            pod_request(&p, "example.com/gpu"),
            Quantity::zero(Format::DecimalSI)
        );
    }

    #[test]
    fn defaults_and_critical() {
        let mut p = pod("p", vec![container("a", "", "cpu=1,memory=1Gi")]);
        apply_defaults(&mut p);
        assert_eq!(pod_requests(&p)["memory"].value(), 1 << 30);
        assert_eq!(
            p.spec.as_ref().unwrap().termination_grace_period_seconds,
            Some(30)
        );
        assert!(!is_critical(&p));
        p.spec.as_mut().unwrap().priority = Some(SYSTEM_CRITICAL_PRIORITY);
        assert!(is_critical(&p));
        assert!(!is_node_critical(&p));
        p.spec.as_mut().unwrap().priority_class_name = Some(SYSTEM_NODE_CRITICAL.to_owned());
        assert!(is_node_critical(&p));
        let mut s = pod("s", vec![container("a", "", "")]);
        s.metadata.annotations =
            Some([(CONFIG_SOURCE_ANNOTATION.to_owned(), "file".to_owned())].into());
        assert!(is_critical(&s));
        s.metadata.annotations =
            Some([(CONFIG_SOURCE_ANNOTATION.to_owned(), "api".to_owned())].into());
        assert!(!is_critical(&s));
        // Built-in priority classes resolve as the API server resolves them; a given
        // priority and other classes are left alone.
        for (class, given, want) in [
            ("system-node-critical", None, Some(2_000_001_000)),
            ("system-cluster-critical", None, Some(2_000_000_000)),
            ("high", None, None),
            ("system-node-critical", Some(5), Some(5)),
        ] {
            let mut c = pod("c", vec![container("a", "", "")]);
            let spec = c.spec.as_mut().unwrap();
            spec.priority_class_name = Some(class.to_owned());
            spec.priority = given;
            apply_defaults(&mut c);
            assert_eq!(c.spec.as_ref().unwrap().priority, want, "{class} {given:?}");
            assert_eq!(is_critical(&c), want.is_some_and(|p| p >= 2_000_000_000));
        }
    }

    #[test]
    fn validation() {
        assert!(validate_pod(&pod("p", vec![container("a", "cpu=1", "cpu=2")])).is_ok());
        assert!(validate_pod(&pod("p", vec![container("a", "cpu=abc", "")])).is_err());
        assert!(validate_pod(&pod("p", vec![container("a", "memory=-1", "")])).is_err());
        assert!(validate_pod(&pod("p", vec![container("a", "cpu=3", "cpu=2")])).is_err());
        assert!(validate_pod(&pod("p", vec![container("a", "memory=1e30", "")])).is_err());
        assert!(validate_pod(&pod("p", vec![])).is_err());
    }
}
