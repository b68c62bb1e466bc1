//! In-place pod resize (KEP-1287, GA in kubelet 1.35), kubelet's side: whether a resize the
//! pod's spec asks for can be allocated now (`Deferred`), never on this node (`Infeasible`),
//! or is allocated and goes on to be actuated (`PodResizeInProgress`).
//!
//! Kubelet: `pkg/kubelet/allocation/allocation_manager.go` (`handlePodResourcesResize`,
//! `UpdatePodFromAllocation`, `allocationFromPod`, `isResizeIncreasingRequests`,
//! `sortPendingResizes`), `allocation/handlers.go` (the resize admit handler: static pods, swap,
//! Guaranteed pods beside the static CPU or memory manager, node allocatable), and the API
//! server's `ValidatePodResize` for what a resize may change at all (a standalone node has no
//! API server to refuse it, so [`validate_resize`] does).
//!
//! By job: [`actions`] (what the pod worker does with an allocated resize: kubelet's
//! `computePodResizeAction` and the order of `doPodResizeAction`), [`checkpoint`] (the
//! `allocated_pods_state` file), [`status`] (a container status's `resources` and
//! `allocatedResources`); here, the allocation and its decision.
//!
//! Pure: the caller passes the pods, the allocation it holds and the node's facts, and gets a
//! [`ResizeDecision`] carrying its reason and message.

pub mod actions;
pub mod checkpoint;
#[cfg(test)]
mod checkpoint_tests;
#[cfg(test)]
mod pod_level_tests;
pub mod status;
#[cfg(test)]
mod tests;

use std::{cmp::Ordering, collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use serde::Serialize;

use super::{
    admission::{Admitter, Node, SecurityPolicy},
    qos::{self, QosClass},
    resources::{self, ResourceList},
    swap::{self, SwapBehavior, SwapOptions},
};

/// The checkpoint file of the allocated resources, in kubelet's root directory.
pub const ALLOCATED_PODS_STATE_FILE: &str = "allocated_pods_state";
/// A deferred resize is first retried this long after kubelet starts (`initialRetryDelay`).
pub const INITIAL_RETRY_DELAY: Duration = Duration::from_secs(30);
/// Then every this long (`retryDelay`).
pub const RETRY_DELAY: Duration = Duration::from_secs(180);

/// The condition type of a resize that is not allocated.
pub const POD_RESIZE_PENDING: &str = "PodResizePending";
/// The condition type of an allocated resize not yet actuated.
pub const POD_RESIZE_IN_PROGRESS: &str = "PodResizeInProgress";
/// The `PodResizeInProgress` reason when actuating failed.
pub const REASON_ERROR: &str = "Error";

/// The static-pod refusal (`IsInPlacePodVerticalScalingAllowed`).
pub const MSG_STATIC_POD: &str = "In-place resize of static-pods is not supported";
/// The swap refusal (`disallowResizeForSwappableContainers`).
pub const MSG_SWAP: &str = "In-place resize of containers with swap is not supported.";
/// The refusal beside the static CPU manager.
pub const MSG_CPU_MANAGER: &str =
    "Resize is infeasible for Guaranteed Pods alongside CPU Manager policy \"static\"";
/// The refusal beside the static memory manager.
pub const MSG_MEMORY_MANAGER: &str =
    "Resize is infeasible for Guaranteed Pods alongside Memory Manager policy \"Static\"";

/// Why a resize is pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum PendingReason {
    /// It fits the node's allocatable but not beside the other pods now: retried later.
    Deferred,
    /// It can never be allocated on this node as it is.
    Infeasible,
}

impl PendingReason {
    /// The condition's reason.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Deferred => "Deferred",
            Self::Infeasible => "Infeasible",
        }
    }
}

/// What [`handle_pod_resources_resize`] decided.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ResizeDecision {
    /// The spec asks for what is allocated: no resize; clear `PodResizePending`.
    Unchanged,
    /// The resize is allocated: checkpoint [`PodAllocation::of`] the desired pod, clear
    /// `PodResizePending`, set `PodResizeInProgress` (observed generation = the pod's).
    Allocate,
    /// Not allocated: set `PodResizePending` with this reason and message; a deferred one is
    /// queued for retry.
    Pending {
        reason: PendingReason,
        message: String,
    },
}

/// The resources allocated to one pod (kubelet's `state.PodResourceInfo`): the resizable
/// containers' requirements by name, and the pod-level requirements (`PodLevelResources`,
/// KEP-5419) when the pod has them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodAllocation {
    pub containers: BTreeMap<String, ResourceRequirements>,
    pub pod: Option<ResourceRequirements>,
}

/// The refusal of a pod-level resize with the gate off (`IsInPlacePodLevelResourcesVerticalScalingAllowed`).
pub const MSG_POD_LEVEL_GATE: &str = "InPlacePodLevelResourcesVerticalScaling is disabled";

/// `IsResizableContainer` (1.35 defaults): regular containers and sidecars.
#[must_use]
pub fn is_resizable(container: &Container, init: bool) -> bool {
    !init || resources::is_sidecar(container)
}

impl PodAllocation {
    /// `allocationFromPod`: the resizable containers' resources as the spec has them.
    pub fn of(pod: &Pod) -> Self {
        let mut containers = BTreeMap::new();
        let all = resources::init_containers(pod)
            .iter()
            .map(|c| (c, true))
            .chain(resources::containers(pod).iter().map(|c| (c, false)));
        for (c, init) in all {
            if is_resizable(c, init) {
                containers.insert(c.name.clone(), c.resources.clone().unwrap_or_default());
            }
        }
        let pod = resources::is_pod_level_resources_set(pod)
            .then(|| resources::pod_level(pod).cloned())
            .flatten();
        Self { containers, pod }
    }
}

/// The pod's pod-level requirements differ from the allocated ones. An allocation without
/// them (one checkpointed before pod-level resources were allocated, as kubelet's alpha
/// wrote `null`) is not taken as removing them.
fn pod_level_differs(pod: &Pod, alloc: &PodAllocation) -> bool {
    alloc
        .pod
        .as_ref()
        .is_some_and(|a| !same_resources(resources::pod_level(pod), Some(a)))
}

type K8sList = BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>;

fn parsed(m: Option<&K8sList>) -> ResourceList {
    m.map(|m| {
        m.iter()
            .map(|(k, v)| (k.clone(), resources::lenient(v)))
            .collect()
    })
    .unwrap_or_default()
}

fn requirement_lists(r: Option<&ResourceRequirements>) -> (ResourceList, ResourceList) {
    (
        parsed(r.and_then(|r| r.requests.as_ref())),
        parsed(r.and_then(|r| r.limits.as_ref())),
    )
}

/// `apiequality.Semantic.DeepEqual` of two requirements: quantities by value, a missing map
/// and an empty one alike.
#[must_use]
pub fn same_resources(a: Option<&ResourceRequirements>, b: Option<&ResourceRequirements>) -> bool {
    requirement_lists(a) == requirement_lists(b)
}

/// `UpdatePodFromAllocation`: the pod with its containers' resources replaced by the
/// allocation, or `None` when nothing differs (no allocation, or it matches the spec).
#[must_use]
pub fn update_pod_from_allocation(pod: &Pod, allocation: Option<&PodAllocation>) -> Option<Pod> {
    let alloc = allocation?;
    let differs = |c: &Container| {
        alloc
            .containers
            .get(&c.name)
            .filter(|a| !same_resources(c.resources.as_ref(), Some(a)))
    };
    let any = resources::containers(pod)
        .iter()
        .chain(resources::init_containers(pod))
        .any(|c| differs(c).is_some());
    let pod_level = pod_level_differs(pod, alloc);
    if !any && !pod_level {
        return None;
    }
    let mut out = pod.clone();
    if let Some(spec) = out.spec.as_mut() {
        if pod_level {
            spec.resources.clone_from(&alloc.pod);
        }
        let containers = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten());
        for c in containers {
            if let Some(a) = alloc.containers.get(&c.name) {
                c.resources = Some(a.clone());
            }
        }
    }
    Some(out)
}

/// The node's facts a resize is decided against.
#[derive(Debug, Clone, Default)]
pub struct ResizeNode {
    /// `node.status.allocatable` (capacity - reserved - hard eviction thresholds), the resource
    /// fit's; its `pods` entry is ignored (a resize adds no pod).
    pub node: Node,
    /// `GetNodeAllocatableAbsolute` (capacity - reserved): cpu in millicores.
    pub allocatable_absolute_milli_cpu: i64,
    /// The same, memory in bytes.
    pub allocatable_absolute_memory: i64,
    /// The CPU manager runs the `static` policy.
    pub cpu_manager_static: bool,
    /// The memory manager runs the `Static` policy.
    pub memory_manager_static: bool,
    /// The node's swap configuration, and whether its memory hierarchy is cgroup v2.
    pub swap: SwapOptions,
    pub cgroup_v2: bool,
    /// `InPlacePodLevelResourcesVerticalScaling`: pod-level resources resized in place.
    pub pod_level_resize: bool,
}

fn container_pairs<'a>(
    desired: &'a Pod,
    allocated: &'a Pod,
) -> impl Iterator<Item = (&'a Container, &'a Container)> {
    let all = |p: &'a Pod| {
        resources::containers(p)
            .iter()
            .chain(resources::init_containers(p))
    };
    all(desired).filter_map(move |d| all(allocated).find(|a| a.name == d.name).map(|a| (d, a)))
}

fn memory_request(c: &Container) -> crate::quantity::Quantity {
    resources::container_requests(c)
        .get("memory")
        .copied()
        .unwrap_or_default()
}

fn restart_on_memory_resize(c: &Container) -> bool {
    c.resize_policy
        .iter()
        .flatten()
        .find(|p| p.resource_name == "memory")
        .is_some_and(|p| p.restart_policy == "RestartContainer")
}

/// `disallowResizeForSwappableContainers`: a container whose memory request changes in place
/// (its allocated resize policy for memory is not `RestartContainer`) while it has, or would
/// have, swap.
#[must_use]
pub fn swap_forbids_resize(node: &ResizeNode, desired: &Pod, allocated: &Pod) -> bool {
    container_pairs(desired, allocated).any(|(d, a)| {
        memory_request(d) != memory_request(a)
            && !restart_on_memory_resize(a)
            && (swap::container_swap_behavior(desired, d, node.cgroup_v2, &node.swap).0
                != SwapBehavior::NoSwap
                || swap::container_swap_behavior(allocated, a, node.cgroup_v2, &node.swap).0
                    != SwapBehavior::NoSwap)
    })
}

/// `guaranteedPodResourceResizeRequired`: a resizable container's request for `resource`
/// differs from its allocation.
fn resource_resize_required(desired: &Pod, alloc: &PodAllocation, resource: &str) -> bool {
    let all = resources::init_containers(desired)
        .iter()
        .map(|c| (c, true))
        .chain(resources::containers(desired).iter().map(|c| (c, false)));
    for (c, init) in all {
        if !is_resizable(c, init) {
            continue;
        }
        let want = resources::container_requests(c).get(resource).copied();
        let have = requirement_lists(alloc.containers.get(&c.name))
            .0
            .get(resource)
            .copied();
        if want.unwrap_or_default() != have.unwrap_or_default() {
            return true;
        }
    }
    false
}

fn infeasible(message: impl Into<String>) -> ResizeDecision {
    ResizeDecision::Pending {
        reason: PendingReason::Infeasible,
        message: message.into(),
    }
}

/// `handlePodResourcesResize`: decides on the resize `desired`'s spec asks for, given the
/// pod's allocation and the `others` admitted pods (with their allocated resources, the pod
/// itself left out or not: it is filtered by uid). The checks run in kubelet's order:
/// static pod, swap, Guaranteed beside the static CPU / memory manager, node allocatable
/// (`Infeasible`), then the resource fit beside the others (`Deferred`).
pub fn handle_pod_resources_resize<'a>(
    node: &ResizeNode,
    desired: &Pod,
    allocation: Option<&PodAllocation>,
    others: impl IntoIterator<Item = &'a Pod>,
) -> ResizeDecision {
    let (Some(alloc), Some(allocated)) =
        (allocation, update_pod_from_allocation(desired, allocation))
    else {
        return ResizeDecision::Unchanged;
    };
    if resources::is_static(desired) {
        return infeasible(MSG_STATIC_POD);
    }
    // kubelet: a pending pod-level resize the gate does not allow keeps the allocation.
    if !node.pod_level_resize && pod_level_differs(desired, alloc) {
        return infeasible(MSG_POD_LEVEL_GATE);
    }
    if swap_forbids_resize(node, desired, &allocated) {
        return infeasible(MSG_SWAP);
    }
    if qos::pod_qos(desired) == QosClass::Guaranteed {
        if node.cpu_manager_static && resource_resize_required(desired, alloc, "cpu") {
            return infeasible(MSG_CPU_MANAGER);
        }
        if node.memory_manager_static && resource_resize_required(desired, alloc, "memory") {
            return infeasible(MSG_MEMORY_MANAGER);
        }
    }
    let cpu = resources::pod_request(desired, "cpu").milli_value();
    let memory = resources::pod_request(desired, "memory").value();
    if cpu > node.allocatable_absolute_milli_cpu || memory > node.allocatable_absolute_memory {
        let what = if memory > node.allocatable_absolute_memory {
            format!(
                "memory, requested: {memory}, capacity: {}",
                node.allocatable_absolute_memory
            )
        } else {
            format!(
                "cpu, requested: {cpu}, capacity: {}",
                node.allocatable_absolute_milli_cpu
            )
        };
        return infeasible(format!("Node didn't have enough capacity: {what}"));
    }
    match fit_beside(node, desired, others) {
        Some(message) => ResizeDecision::Pending {
            reason: PendingReason::Deferred,
            message,
        },
        None => ResizeDecision::Allocate,
    }
}

/// The resource fit of `pod` beside `others` (kubelet's `canAdmitPod` with the resize
/// operation): the first insufficient resource's message, or `None` when it fits. The pod
/// count is not checked: the pod is already on the node.
fn fit_beside<'a>(
    node: &ResizeNode,
    pod: &Pod,
    others: impl IntoIterator<Item = &'a Pod>,
) -> Option<String> {
    let uid = resources::pod_uid(pod);
    let others = others
        .into_iter()
        .filter(|p| uid.is_empty() || resources::pod_uid(p) != uid);
    let admitter = Admitter::new(node.node.clone(), SecurityPolicy::default(), others);
    admitter
        .insufficient_resources(pod)
        .into_iter()
        .find(|i| i.resource != "pods")
        .map(|i| i.message())
}

/// `isResizeIncreasingAnyRequests`: some resizable container of the desired pod requests more
/// cpu or memory than its allocation (`false` when nothing is allocated or nothing differs).
#[must_use]
pub fn is_resize_increasing_requests(desired: &Pod, allocation: Option<&PodAllocation>) -> bool {
    let Some(alloc) = allocation else {
        return false;
    };
    // kubelet compares the pods' requests (`PodRequests`, pod-level ones first).
    if let Some(a) = &alloc.pod {
        let want = requirement_lists(resources::pod_level(desired)).0;
        let have = requirement_lists(Some(a)).0;
        let more = |r: &str| {
            want.get(r).copied().unwrap_or_default() > have.get(r).copied().unwrap_or_default()
        };
        if more("cpu") || more("memory") {
            return true;
        }
    }
    let all = resources::init_containers(desired)
        .iter()
        .map(|c| (c, true))
        .chain(resources::containers(desired).iter().map(|c| (c, false)));
    for (c, init) in all {
        let Some(a) = alloc
            .containers
            .get(&c.name)
            .filter(|_| is_resizable(c, init))
        else {
            continue;
        };
        let want = resources::container_requests(c);
        let have = requirement_lists(Some(a)).0;
        let more = |r: &str| {
            want.get(r).copied().unwrap_or_default() > have.get(r).copied().unwrap_or_default()
        };
        if more("cpu") || more("memory") {
            return true;
        }
    }
    false
}

/// A pod waiting for its resize to be retried, with what `sortPendingResizes` orders by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingResize {
    pub uid: String,
    /// [`is_resize_increasing_requests`].
    pub increasing: bool,
    /// `spec.priority`.
    pub priority: i32,
    pub qos: QosClass,
    /// When its `PodResizePending` condition last changed (a time since the caller's epoch),
    /// if it has one.
    pub pending_since: Option<Duration>,
}

impl PendingResize {
    /// The pod `uid` whose spec asks for `desired`'s resources, its allocation `allocation`,
    /// pending since `pending_since`.
    #[must_use]
    pub fn of(
        uid: &str,
        desired: &Pod,
        allocation: Option<&PodAllocation>,
        pending_since: Option<Duration>,
    ) -> Self {
        Self {
            uid: uid.to_owned(),
            increasing: is_resize_increasing_requests(desired, allocation),
            priority: resources::priority(desired),
            qos: qos::pod_qos(desired),
            pending_since,
        }
    }
}

/// `sortPendingResizes`' comparator: resizes that do not increase requests first, then higher
/// priority, then Guaranteed before others, then the longest pending (one without a pending
/// condition last).
#[must_use]
pub fn pending_order(a: &PendingResize, b: &PendingResize) -> Ordering {
    if !a.increasing {
        return Ordering::Less;
    }
    if !b.increasing {
        return Ordering::Greater;
    }
    match b.priority.cmp(&a.priority) {
        Ordering::Equal => {}
        o => return o,
    }
    let g = |p: &PendingResize| p.qos == QosClass::Guaranteed;
    match (g(a), g(b)) {
        (true, false) => return Ordering::Less,
        (false, true) => return Ordering::Greater,
        _ => {}
    }
    match (a.pending_since, b.pending_since) {
        (None, _) => Ordering::Greater,
        (_, None) => Ordering::Less,
        (Some(x), Some(y)) if x < y => Ordering::Less,
        _ => Ordering::Greater,
    }
}

/// Inserts `item` into the queue (a uid already queued is left where it is) and sorts it as
/// kubelet's `PushPendingResize` does.
pub fn push_pending_resize(queue: &mut Vec<PendingResize>, item: PendingResize) {
    if queue.iter().any(|p| p.uid == item.uid) {
        return;
    }
    queue.push(item);
    // A stable insertion sort with kubelet's comparator (which is not a total order: Go's
    // pdqsort and Rust's sorts may panic or disagree on such comparators, so do it by hand).
    for i in 1..queue.len() {
        let mut j = i;
        while j > 0 && pending_order(&queue[j], &queue[j - 1]) == Ordering::Less {
            queue.swap(j, j - 1);
            j -= 1;
        }
    }
}

/// The resize conditions kubelet reports (`status.conditions` entries).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResizeCondition {
    /// [`POD_RESIZE_PENDING`] or [`POD_RESIZE_IN_PROGRESS`].
    pub type_: &'static str,
    /// Always `True` while present.
    pub status: &'static str,
    pub reason: String,
    pub message: String,
    /// The pod generation the condition is about (`observedGeneration`).
    pub observed_generation: i64,
}

impl ResizeCondition {
    /// `PodResizePending` with its reason and message.
    #[must_use]
    pub fn pending(reason: PendingReason, message: &str, generation: i64) -> Self {
        Self {
            type_: POD_RESIZE_PENDING,
            status: "True",
            reason: reason.as_str().to_owned(),
            message: message.to_owned(),
            observed_generation: generation,
        }
    }

    /// `PodResizeInProgress`: reason empty while actuating, [`REASON_ERROR`] with the error.
    #[must_use]
    pub fn in_progress(error: Option<&str>, generation: i64) -> Self {
        Self {
            type_: POD_RESIZE_IN_PROGRESS,
            status: "True",
            reason: error.map_or_else(String::new, |_| REASON_ERROR.to_owned()),
            message: error.unwrap_or_default().to_owned(),
            observed_generation: generation,
        }
    }
}

impl ResizeCondition {
    /// The pod status condition it is.
    #[must_use]
    pub fn condition(&self) -> super::pod_status::Condition {
        super::pod_status::Condition {
            kind: self.type_.to_owned(),
            status: self.status.to_owned(),
            reason: self.reason.clone(),
            message: self.message.clone(),
        }
    }
}

/// What a manifest pod's uid is derived from: the pod with its resizable containers' and its
/// pod-level cpu and memory values left out (their names kept), and its QoS class. A manifest that changes
/// only those values, keeping the QoS class and every resource name, is the same pod
/// resized (a change [`validate_resize`] accepts); any other change is a new pod.
#[must_use]
pub fn uid_basis(pod: &Pod) -> (Pod, QosClass) {
    let qos = qos::compute(pod);
    let mut out = pod.clone();
    let blank = |l: &mut Option<K8sList>| {
        for (k, v) in l.iter_mut().flatten() {
            if k == "cpu" || k == "memory" {
                *v = k8s_openapi::apimachinery::pkg::api::resource::Quantity(String::new());
            }
        }
    };
    if let Some(spec) = out.spec.as_mut() {
        let inits = spec.init_containers.iter_mut().flatten().map(|c| (c, true));
        for (c, init) in inits.chain(spec.containers.iter_mut().map(|c| (c, false))) {
            if is_resizable(c, init)
                && let Some(r) = c.resources.as_mut()
            {
                blank(&mut r.requests);
                blank(&mut r.limits);
            }
        }
        // Pod-level cpu and memory are resized in place too (KEP-5419).
        if let Some(r) = spec.resources.as_mut() {
            blank(&mut r.requests);
            blank(&mut r.limits);
        }
    }
    (out, qos)
}

/// What the API server's `ValidatePodResize` refuses in a resize of `old` to `new` (the same
/// pod): a QoS class change, a change to a resource other than cpu and memory, removed
/// requests or limits, a resized non-sidecar init container, containers added, removed or
/// reordered. Empty when the resize may proceed to the kubelet's decision.
#[must_use]
pub fn validate_resize(old: &Pod, new: &Pod) -> Vec<String> {
    let mut errs = Vec::new();
    if qos::pod_qos(old) != qos::compute(new) {
        errs.push("spec: Pod QOS Class may not change as a result of resizing".to_owned());
    }
    let names = |cs: &[Container]| cs.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    let (oc, nc) = (resources::containers(old), resources::containers(new));
    let (oi, ni) = (
        resources::init_containers(old),
        resources::init_containers(new),
    );
    if names(oc) != names(nc) || names(oi) != names(ni) {
        errs.push("spec: containers may not be added, removed or reordered by a resize".into());
        return errs;
    }
    let pairs = oi
        .iter()
        .zip(ni)
        .enumerate()
        .map(|(i, p)| (format!("spec.initContainers[{i}].resources"), p, true))
        .chain(
            oc.iter()
                .zip(nc)
                .enumerate()
                .map(|(i, p)| (format!("spec.containers[{i}].resources"), p, false)),
        );
    for (path, (o, n), init) in pairs {
        let (or, ol) = requirement_lists(o.resources.as_ref());
        let (nr, nl) = requirement_lists(n.resources.as_ref());
        if or == nr && ol == nl {
            continue;
        }
        if init && !resources::is_sidecar(o) {
            errs.push(format!(
                "{path}: Forbidden: resources for non-sidecar init containers are immutable"
            ));
            continue;
        }
        let changed_other = |a: &ResourceList, b: &ResourceList| {
            a.iter()
                .chain(b.iter())
                .any(|(k, _)| k != "cpu" && k != "memory" && a.get(k) != b.get(k))
        };
        if changed_other(&or, &nr) || changed_other(&ol, &nl) {
            errs.push(format!(
                "{path}: Forbidden: only cpu and memory resources are mutable"
            ));
        }
        for r in ["cpu", "memory"] {
            if or.contains_key(r) && !nr.contains_key(r) {
                errs.push(format!(
                    "{path}.requests[{r}]: Forbidden: resource requests cannot be removed"
                ));
            }
            if ol.contains_key(r) && !nl.contains_key(r) {
                errs.push(format!(
                    "{path}.limits[{r}]: Forbidden: resource limits cannot be removed"
                ));
            }
        }
    }
    errs.extend(validate_pod_level_resize(old, new));
    errs
}

/// `ValidatePodResize`'s pod-level part (KEP-5419; its 1.36 wording is not in the corpus:
/// the messages follow the container ones): pod-level resources may be added or changed, not
/// removed, nor their requests or limits; only cpu and memory may change.
fn validate_pod_level_resize(old: &Pod, new: &Pod) -> Vec<String> {
    let (o, n) = (resources::pod_level(old), resources::pod_level(new));
    let ((or, ol), (nr, nl)) = (requirement_lists(o), requirement_lists(n));
    if or == nr && ol == nl {
        return Vec::new();
    }
    if resources::is_pod_level_resources_set(old) && !resources::is_pod_level_resources_set(new) {
        return vec!["spec.resources: Forbidden: pod-level resources cannot be removed".to_owned()];
    }
    let mut errs = Vec::new();
    let changed_other = |a: &ResourceList, b: &ResourceList| {
        a.iter()
            .chain(b.iter())
            .any(|(k, _)| k != "cpu" && k != "memory" && a.get(k) != b.get(k))
    };
    // kubelet 1.36's `validatePodLevelResourcesResize` (its wording as ported from v1.36).
    let removed = |a: &ResourceList, b: &ResourceList| {
        ["cpu", "memory"]
            .iter()
            .any(|r| a.contains_key(*r) && !b.contains_key(*r))
    };
    if removed(&or, &nr) {
        errs.push(
            "spec.resources.requests: Forbidden: pod-level resource requests cannot be removed"
                .into(),
        );
    }
    if removed(&ol, &nl) {
        errs.push(
            "spec.resources.limits: Forbidden: pod-level resource limits cannot be removed".into(),
        );
    }
    if changed_other(&or, &nr) || changed_other(&ol, &nl) {
        errs.push("spec: Forbidden: only cpu and memory resources are mutable at pod-level".into());
    }
    errs
}
