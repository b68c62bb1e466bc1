//! Pod admission, in kubelet's order: eviction admission under node conditions, then resource
//! fit and the predicates (`pkg/kubelet/lifecycle/predicate.go`: `generalFilter`, the
//! scheduler's `AdmissionCheck`), then the node's pod-security rules. Only the first failure is
//! reported.
//!
//! [`Admitter`] keeps the running totals of the admitted pods, so admitting pods one after
//! another costs O(pod) each, not O(node).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint};

use super::{
    eviction::{
        NodeCondition, Signal, Threshold,
        manager::{self, AdmitResult, toleration_tolerates},
    },
    resources::{self, ResourceList},
    security::{self, SysctlAllowlist},
};
use crate::quantity::{Format, Quantity};

/// What is wrong with admission inputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// A reservation exceeds nothing sensible.
    #[error("resource {0}: arithmetic overflow")]
    Overflow(String),
}

/// Reason of a pod-security rejection.
pub const SECURITY_REASON: &str = "PodSecurity";

/// The capabilities Pod Security "baseline" lets a container add; any other is refused
/// unless privileged containers are allowed.
pub const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The node's pod-security rules: Pod Security "baseline" (privileged containers, added
/// capabilities beyond baseline's list, seccomp `Unconfined`, `procMount: Unmasked`, AppArmor
/// `unconfined`, SELinux types and users beyond baseline's, each host namespace, hostPath
/// volumes), each refused unless allowed; kubelet's sysctl allowlist (`allowedUnsafeSysctls`)
/// and whether the host enforces AppArmor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SecurityPolicy {
    /// Allow `securityContext.privileged: true`, capabilities beyond
    /// [`BASELINE_CAPABILITIES`], and the other container settings baseline refuses (seccomp
    /// `Unconfined`, `procMount: Unmasked`, AppArmor `unconfined`, SELinux beyond baseline):
    /// the node's containers then run at Pod Security level "privileged".
    pub allow_privileged: bool,
    /// Allow `hostNetwork`.
    pub allow_host_namespaces: bool,
    /// Allow `hostPID`.
    pub allow_host_pid: bool,
    /// Allow `hostIPC`.
    pub allow_host_ipc: bool,
    /// Allow `hostPath` volumes.
    pub allow_host_paths: bool,
    /// The safe sysctls plus `allowedUnsafeSysctls` (kubelet's sysctl admission, reason
    /// `SysctlForbidden`).
    pub sysctls: SysctlAllowlist,
    /// Whether the kernel enforces AppArmor (`/sys/module/apparmor/parameters/enabled`); a pod
    /// asking for a profile other than `unconfined` is refused (reason `AppArmor`) when not.
    pub apparmor_enabled: bool,
}

/// The node as admission sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Node {
    /// `metadata.name`.
    pub name: String,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// Node taints.
    pub taints: Vec<Taint>,
    /// Allocatable resources ([`allocatable`]).
    pub allocatable: ResourceList,
}

/// kubelet's `getNodeAllocatableAbsolute` for memory: the kubepods cgroup's memory limit,
/// `capacity - systemReserved - kubeReserved`, floored at zero. It does NOT subtract the hard
/// eviction threshold: `allocatableMemory.available` is this limit minus the pods' working
/// set, and the copied hard `memory.available` threshold then fires when the pods' working
/// set passes [`allocatable`]'s memory. Subtracting the threshold here too counts it twice.
#[must_use]
pub fn kubepods_memory_limit(
    capacity: &ResourceList,
    system_reserved: &ResourceList,
    kube_reserved: &ResourceList,
) -> i64 {
    let reserved = [system_reserved, kube_reserved]
        .iter()
        .filter_map(|m| m.get("memory"))
        .fold(0i64, |a, q| a.saturating_add(q.value()));
    capacity
        .get("memory")
        .map_or(0, Quantity::value)
        .saturating_sub(reserved)
        .max(0)
}

/// `allocatable = capacity - kubeReserved - systemReserved - hard eviction thresholds`
/// (`memory.available` -> memory, `nodefs.available` -> ephemeral-storage; percentages of
/// capacity), floored at zero. `hard` are the hard thresholds without allocatable copies.
#[must_use]
pub fn allocatable(
    capacity: &ResourceList,
    system_reserved: &ResourceList,
    kube_reserved: &ResourceList,
    hard: &[Threshold],
) -> ResourceList {
    let mut reservation: ResourceList = ResourceList::new();
    for list in [system_reserved, kube_reserved] {
        for (k, v) in list {
            reservation
                .entry(k.clone())
                .and_modify(|r| *r = r.saturating_add(*v))
                .or_insert(*v);
        }
    }
    let mut eviction = ResourceList::new();
    for t in hard.iter().filter(|t| t.is_hard()) {
        let resource = match t.signal {
            Signal::MemoryAvailable => "memory",
            Signal::NodeFsAvailable => "ephemeral-storage",
            _ => continue,
        };
        let cap = capacity.get(resource).map_or(0, Quantity::value);
        eviction.insert(resource.to_owned(), t.value.resolve(cap));
    }
    for (k, v) in eviction {
        reservation
            .entry(k)
            .and_modify(|r| *r = r.saturating_add(v))
            .or_insert(v);
    }
    capacity
        .iter()
        .map(|(k, cap)| {
            let reserved = reservation.get(k).copied().unwrap_or_default();
            let v = if reserved > *cap {
                Quantity::zero(cap.format())
            } else {
                cap.saturating_add(
                    Quantity::from_nanos(-reserved.nanos(), cap.format()).unwrap_or_default(),
                )
            };
            (k.clone(), v)
        })
        .collect()
}

/// `IsExtendedResourceName`.
#[must_use]
pub fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("requests.")
}

fn is_scalar(name: &str) -> bool {
    is_extended_resource(name)
        || name.starts_with("hugepages-")
        || name.starts_with("attachable-volumes-")
}

/// Requests summed the scheduler's way: milli-cpu, bytes, scalar values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Requested {
    milli_cpu: i64,
    memory: i64,
    ephemeral_storage: i64,
    scalar: BTreeMap<String, i64>,
}

impl Requested {
    fn of(reqs: &ResourceList) -> Self {
        let mut r = Self::default();
        for (name, q) in reqs {
            match name.as_str() {
                "cpu" => r.milli_cpu = q.milli_value(),
                "memory" => r.memory = q.value(),
                "ephemeral-storage" => r.ephemeral_storage = q.value(),
                n if is_scalar(n) => {
                    r.scalar.insert(n.to_owned(), q.value());
                }
                _ => {}
            }
        }
        r
    }

    fn add(&mut self, o: &Self, sign: i64) {
        self.milli_cpu = self
            .milli_cpu
            .saturating_add(sign.saturating_mul(o.milli_cpu));
        self.memory = self.memory.saturating_add(sign.saturating_mul(o.memory));
        self.ephemeral_storage = self
            .ephemeral_storage
            .saturating_add(sign.saturating_mul(o.ephemeral_storage));
        for (k, v) in &o.scalar {
            let e = self.scalar.entry(k.clone()).or_insert(0);
            *e = e.saturating_add(sign.saturating_mul(*v));
        }
    }
}

/// A host port in use: (protocol, port) -> host IPs.
type Ports = BTreeMap<(String, i32), Vec<String>>;

fn host_ports(pod: &Pod) -> Vec<(String, i32, String)> {
    resources::containers(pod)
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|p| *p > 0)?;
            let proto = p.protocol.clone().unwrap_or_else(|| "TCP".to_owned());
            let ip = p
                .host_ip
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "0.0.0.0".to_owned());
            Some((proto, port, ip))
        })
        .collect()
}

/// A resource a pod does not fit for (kubelet's `InsufficientResourceError`): cpu in
/// milli-cpu, `pods` in pods, others in their unit (bytes, devices).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insufficient {
    pub resource: String,
    pub requested: i64,
    pub used: i64,
    pub capacity: i64,
}

impl Insufficient {
    /// `GetInsufficientAmount`: how much more the node would need.
    #[must_use]
    pub fn amount(&self) -> i64 {
        self.requested
            .saturating_sub(self.capacity.saturating_sub(self.used))
    }

    /// The rejection reason (`OutOfcpu`, `OutOfpods`, ...).
    #[must_use]
    pub fn reason(&self) -> String {
        format!("OutOf{}", self.resource)
    }

    /// kubelet's rejection message.
    #[must_use]
    pub fn message(&self) -> String {
        format!(
            "Node didn't have enough resource: {}, requested: {}, used: {}, capacity: {}",
            self.resource, self.requested, self.used, self.capacity
        )
    }
}

/// The admission state of a node: its description, its security rules, and the totals of the
/// pods admitted so far.
#[derive(Debug, Clone)]
pub struct Admitter {
    node: Node,
    security: SecurityPolicy,
    allocatable: Requested,
    allowed_pods: i64,
    requested: Requested,
    pods: i64,
    ports: Ports,
}

impl Admitter {
    /// A node with `active` pods already admitted.
    #[must_use]
    pub fn new<'a>(
        node: Node,
        security: SecurityPolicy,
        active: impl IntoIterator<Item = &'a Pod>,
    ) -> Self {
        let allocatable = Requested::of(&node.allocatable);
        let allowed_pods = node.allocatable.get("pods").map_or(0, Quantity::value);
        let mut me = Self {
            node,
            security,
            allocatable,
            allowed_pods,
            requested: Requested::default(),
            pods: 0,
            ports: Ports::new(),
        };
        for p in active {
            me.add(p);
        }
        me
    }

    /// The node.
    #[must_use]
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Counts `pod` as admitted and active.
    pub fn add(&mut self, pod: &Pod) {
        self.requested
            .add(&Requested::of(&resources::pod_requests(pod)), 1);
        self.pods += 1;
        for (proto, port, ip) in host_ports(pod) {
            self.ports.entry((proto, port)).or_default().push(ip);
        }
    }

    /// Removes `pod` from the totals (it left the active set).
    pub fn remove(&mut self, pod: &Pod) {
        self.requested
            .add(&Requested::of(&resources::pod_requests(pod)), -1);
        self.pods -= 1;
        for (proto, port, ip) in host_ports(pod) {
            if let Some(ips) = self.ports.get_mut(&(proto.clone(), port)) {
                if let Some(i) = ips.iter().position(|x| *x == ip) {
                    ips.remove(i);
                }
                if ips.is_empty() {
                    self.ports.remove(&(proto, port));
                }
            }
        }
    }

    /// Decides on `pod` under the node `conditions` (sorted by name). Does not count it: call
    /// [`Admitter::add`] when admitted.
    pub fn admit(&self, pod: &Pod, conditions: &[NodeCondition]) -> AdmitResult {
        self.admit_checking(pod, conditions, true)
    }

    /// [`Admitter::admit`] without the resource fit: whether `pod` would be admitted if the
    /// resources it lacks were freed (kubelet's critical-pod preemption only helps a pod whose
    /// every failure is an insufficient resource).
    pub fn admit_except_resources(&self, pod: &Pod, conditions: &[NodeCondition]) -> AdmitResult {
        self.admit_checking(pod, conditions, false)
    }

    /// Every resource `pod` does not fit for (kubelet's `InsufficientResourceError`s, in
    /// `fitsRequest`'s order: pods, cpu, memory, ephemeral-storage, extended resources).
    #[must_use]
    pub fn insufficient_resources(&self, pod: &Pod) -> Vec<Insufficient> {
        let mut out = Vec::new();
        let mut insufficient = |name: &str, requested: i64, used: i64, capacity: i64| {
            out.push(Insufficient {
                resource: name.to_owned(),
                requested,
                used,
                capacity,
            });
        };
        if self.pods + 1 > self.allowed_pods {
            insufficient("pods", 1, self.pods, self.allowed_pods);
        }
        let mut reqs = resources::pod_requests(pod);
        // removeMissingExtendedResources: extended resources the node does not have are ignored.
        reqs.retain(|name, _| {
            !is_extended_resource(name) || self.allocatable.scalar.contains_key(name)
        });
        let want = Requested::of(&reqs);
        let (a, u) = (&self.allocatable, &self.requested);
        if want.milli_cpu > 0 && want.milli_cpu > a.milli_cpu - u.milli_cpu {
            insufficient("cpu", want.milli_cpu, u.milli_cpu, a.milli_cpu);
        }
        if want.memory > 0 && want.memory > a.memory - u.memory {
            insufficient("memory", want.memory, u.memory, a.memory);
        }
        if want.ephemeral_storage > 0
            && want.ephemeral_storage > a.ephemeral_storage - u.ephemeral_storage
        {
            insufficient(
                "ephemeral-storage",
                want.ephemeral_storage,
                u.ephemeral_storage,
                a.ephemeral_storage,
            );
        }
        for (name, v) in &want.scalar {
            if *v == 0 {
                continue;
            }
            let cap = a.scalar.get(name).copied().unwrap_or(0);
            let used = u.scalar.get(name).copied().unwrap_or(0);
            if *v > cap - used {
                insufficient(name, *v, used, cap);
            }
        }
        out
    }

    fn admit_checking(&self, pod: &Pod, conditions: &[NodeCondition], fit: bool) -> AdmitResult {
        let r = manager::admit(conditions, pod);
        if !r.admitted {
            return r;
        }
        // kubelet's admit handlers in order: eviction, sysctls, resource fit and predicates,
        // AppArmor; then the node's pod-security rules.
        if let Err((reason, message)) = self.security.sysctls.admit(pod) {
            return AdmitResult::reject(reason, message);
        }
        if fit && let Some(r) = self.resource_fit(pod) {
            return r;
        }
        if let Some(r) = self.predicates(pod) {
            return r;
        }
        if let Err((reason, message)) =
            security::validate_apparmor(pod, self.security.apparmor_enabled)
        {
            return AdmitResult::reject(reason, message);
        }
        self.security_check(pod)
    }

    /// The first insufficient resource, as kubelet's rejection reports it.
    fn resource_fit(&self, pod: &Pod) -> Option<AdmitResult> {
        self.insufficient_resources(pod)
            .first()
            .map(|i| AdmitResult::reject(i.reason(), i.message()))
    }

    fn predicates(&self, pod: &Pod) -> Option<AdmitResult> {
        let fail = |name: &str, reason: &str| {
            Some(AdmitResult::reject(
                name,
                format!("Predicate {name} failed: {reason}"),
            ))
        };
        if !node_affinity_matches(pod, &self.node) {
            return fail(
                "NodeAffinity",
                "node(s) didn't match Pod's node affinity/selector",
            );
        }
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("");
        if !node_name.is_empty() && node_name != self.node.name {
            return fail("NodeName", "node(s) didn't match the requested node name");
        }
        for (proto, port, ip) in host_ports(pod) {
            if let Some(ips) = self.ports.get(&(proto, port))
                && ips
                    .iter()
                    .any(|used| used == "0.0.0.0" || ip == "0.0.0.0" || *used == ip)
            {
                return fail(
                    "NodePorts",
                    "node(s) didn't have free ports for the requested pod ports",
                );
            }
        }
        if !resources::is_static(pod) {
            let tolerations = pod
                .spec
                .as_ref()
                .and_then(|s| s.tolerations.as_deref())
                .unwrap_or(&[]);
            let untolerated = self
                .node
                .taints
                .iter()
                .filter(|t| t.effect == "NoExecute")
                .any(|t| !tolerations.iter().any(|tol| toleration_tolerates(tol, t)));
            if untolerated {
                return fail(
                    "TaintToleration",
                    "node(s) had taints that the pod didn't tolerate",
                );
            }
        }
        None
    }

    fn security_check(&self, pod: &Pod) -> AdmitResult {
        let uid = resources::pod_uid(pod);
        let Some(spec) = pod.spec.as_ref() else {
            return AdmitResult::admit();
        };
        let reject = |what: &str| {
            AdmitResult::reject(
                SECURITY_REASON,
                format!("pod with UID {uid:?} specified {what}, but is disallowed"),
            )
        };
        if !self.security.allow_privileged {
            let all = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten());
            let privileged =
                all.clone()
                    .any(|c| c.security_context.as_ref().and_then(|s| s.privileged) == Some(true))
                    || spec.ephemeral_containers.iter().flatten().any(|c| {
                        c.security_context.as_ref().and_then(|s| s.privileged) == Some(true)
                    });
            if privileged {
                return reject("privileged container");
            }
            let added = all
                .filter_map(|c| c.security_context.as_ref())
                .filter_map(|s| s.capabilities.as_ref())
                .filter_map(|c| c.add.as_ref())
                .flatten()
                .chain(
                    spec.ephemeral_containers
                        .iter()
                        .flatten()
                        .filter_map(|c| c.security_context.as_ref())
                        .filter_map(|s| s.capabilities.as_ref())
                        .filter_map(|c| c.add.as_ref())
                        .flatten(),
                )
                .find(|cap| !BASELINE_CAPABILITIES.contains(&cap.as_str()));
            if let Some(cap) = added {
                return reject(&format!("capability {cap}"));
            }
            if let Some(what) = baseline_container_settings(pod) {
                return reject(&what);
            }
        }
        if !self.security.allow_host_namespaces && spec.host_network == Some(true) {
            return reject("host networking");
        }
        if !self.security.allow_host_pid && spec.host_pid == Some(true) {
            return reject("host PID");
        }
        if !self.security.allow_host_ipc && spec.host_ipc == Some(true) {
            return reject("host ipc");
        }
        if !self.security.allow_host_paths
            && spec.volumes.iter().flatten().any(|v| v.host_path.is_some())
        {
            return reject("hostPath volume");
        }
        AdmitResult::admit()
    }
}

/// The SELinux types Pod Security baseline allows (besides none).
pub const BASELINE_SELINUX_TYPES: &[&str] = &[
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// The first container-level setting Pod Security baseline refuses beyond privileged and
/// capabilities: an explicit seccomp `Unconfined` (pod or container), `procMount` other than
/// `Default`, an AppArmor profile `unconfined` (field or annotation), SELinux options with a
/// user, a role or a type outside [`BASELINE_SELINUX_TYPES`]. `None` when there is none.
fn baseline_container_settings(pod: &Pod) -> Option<String> {
    if let Some((c, _)) = security::explicit_seccomp_types(pod)
        .into_iter()
        .find(|(_, t)| t == "Unconfined")
    {
        return Some(format!("seccomp profile Unconfined for {c}"));
    }
    if let Some((c, m)) =
        security::proc_mounts(pod).find_map(|(c, m)| m.filter(|m| m != "Default").map(|m| (c, m)))
    {
        return Some(format!("procMount {m} for {c}"));
    }
    let annotation_unconfined = pod.metadata.annotations.iter().flatten().find(|(k, v)| {
        k.starts_with(security::APPARMOR_ANNOTATION_PREFIX)
            && !(v.is_empty() || v.as_str() == "runtime/default" || v.starts_with("localhost/"))
    });
    if let Some((k, v)) = annotation_unconfined {
        return Some(format!("AppArmor profile {v} in annotation {k}"));
    }
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let field_unconfined = pod_sc
        .and_then(|s| s.app_armor_profile.as_ref())
        .map(|p| ("<pod>", p))
        .into_iter()
        .chain(
            security::security_contexts(pod)
                .filter_map(|(c, s)| s.and_then(|s| s.app_armor_profile.as_ref()).map(|p| (c, p))),
        )
        .find(|(_, p)| p.type_ == "Unconfined");
    if let Some((c, _)) = field_unconfined {
        return Some(format!("AppArmor profile Unconfined for {c}"));
    }
    let selinux = pod_sc
        .and_then(|s| s.se_linux_options.as_ref())
        .map(|o| ("<pod>", o))
        .into_iter()
        .chain(
            security::security_contexts(pod)
                .filter_map(|(c, s)| s.and_then(|s| s.se_linux_options.as_ref()).map(|o| (c, o))),
        )
        .find(|(_, o)| {
            o.user.as_deref().is_some_and(|u| !u.is_empty())
                || o.role.as_deref().is_some_and(|r| !r.is_empty())
                || o.type_
                    .as_deref()
                    .is_some_and(|t| !t.is_empty() && !BASELINE_SELINUX_TYPES.contains(&t))
        });
    if let Some((c, _)) = selinux {
        return Some(format!("SELinux options beyond baseline for {c}"));
    }
    None
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or(&[]);
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [bound]) = (value.and_then(|v| v.parse::<i64>().ok()), values) else {
                return false;
            };
            let Ok(bound) = bound.parse::<i64>() else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(node.name.as_str())))
}

/// `GetRequiredNodeAffinity(pod).Match(node)`: nodeSelector and required node affinity.
#[must_use]
pub fn node_affinity_matches(pod: &Pod, node: &Node) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    if let Some(sel) = spec.node_selector.as_ref()
        && !sel.iter().all(|(k, v)| node.labels.get(k) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, node)))
}

/// A rejected pod's status message: `Pod was rejected: <message>`.
#[must_use]
pub fn rejected_status_message(result: &AdmitResult) -> String {
    format!("Pod was rejected: {}", result.message)
}

/// The default `pods` capacity when neither the node nor the configuration says.
#[must_use]
pub fn pods_quantity(max_pods: u32) -> Quantity {
    Quantity::from_int(i64::from(max_pods), Format::DecimalSI)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ContainerPort, HostPathVolumeSource, SecurityContext, Toleration, Volume,
    };

    use super::*;
    use crate::policy::{
        eviction::ThresholdValue,
        resources::test_pods::{container, pod},
    };

    fn list(s: &str) -> ResourceList {
        s.split(',')
            .map(|kv| kv.split_once('=').unwrap())
            .map(|(k, v)| (k.to_owned(), Quantity::parse(v).unwrap()))
            .collect()
    }

    fn node() -> Node {
        Node {
            name: "node-a".into(),
            labels: [("zone".to_owned(), "a".to_owned())].into(),
            taints: vec![],
            allocatable: list("cpu=4,memory=8Gi,ephemeral-storage=100Gi,pods=3,example.com/gpu=1"),
        }
    }

    #[test]
    fn allocatable_subtracts_reservations_and_hard_thresholds() {
        let hard = vec![
            Threshold {
                signal: Signal::MemoryAvailable,
                value: ThresholdValue::Quantity(Quantity::parse("500Mi").unwrap()),
                grace_period: Default::default(),
                min_reclaim: None,
            },
            Threshold {
                signal: Signal::NodeFsAvailable,
                value: ThresholdValue::Percentage(0.1),
                grace_period: Default::default(),
                min_reclaim: None,
            },
        ];
        let a = allocatable(
            &list("cpu=4,memory=8Gi,ephemeral-storage=100Gi"),
            &list("cpu=500m,memory=1Gi"),
            &list("cpu=500m"),
            &hard,
        );
        assert_eq!(a["cpu"].milli_value(), 3000);
        assert_eq!(a["memory"].value(), (8 << 30) - (1 << 30) - (500 << 20));
        // 10% is float32(0.1) x capacity, as kubelet computes it.
        assert_eq!(a["ephemeral-storage"].value(), 96_636_764_000);
    }

    #[test]
    fn resource_fit_messages() {
        let mut a = Admitter::new(node(), SecurityPolicy::default(), []);
        let p1 = pod("p1", vec![container("a", "cpu=1500m,memory=1Gi", "")]);
        assert!(a.admit(&p1, &[]).admitted);
        a.add(&p1);
        let big = pod("big", vec![container("a", "cpu=3", "")]);
        let r = a.admit(&big, &[]);
        assert_eq!(r.reason, "OutOfcpu");
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 3000, used: 1500, capacity: 4000"
        );
        let mem = pod("mem", vec![container("a", "memory=8Gi", "")]);
        assert_eq!(a.admit(&mem, &[]).reason, "OutOfmemory");
        let gpu = pod("gpu", vec![container("a", "example.com/gpu=2", "")]);
        assert_eq!(a.admit(&gpu, &[]).reason, "OutOfexample.com/gpu");
        // Extended resources the node lacks are ignored.
        let other = pod("other", vec![container("a", "example.org/fpga=2", "")]);
        assert!(a.admit(&other, &[]).admitted);
        a.add(&pod("p2", vec![container("a", "", "")]));
        a.add(&pod("p3", vec![container("a", "", "")]));
        let r = a.admit(&pod("p4", vec![container("a", "", "")]), &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "OutOfpods",
                "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
            )
        );
        // Every insufficient resource, with the amount missing; the rest of admission
        // without them.
        let both = pod("both", vec![container("a", "cpu=3,memory=8Gi", "")]);
        let all = a.insufficient_resources(&both);
        let amounts: Vec<(&str, i64)> = all
            .iter()
            .map(|i| (i.resource.as_str(), i.amount()))
            .collect();
        assert_eq!(amounts, [("pods", 1), ("cpu", 500), ("memory", 1 << 30)]);
        assert_eq!(a.admit(&both, &[]).reason, "OutOfpods");
        assert!(a.admit_except_resources(&both, &[]).admitted);
        a.remove(&p1);
        assert!(a.admit(&big, &[]).admitted);
        // Eviction admission comes first.
        assert_eq!(
            a.admit(
                &pod("be", vec![container("a", "", "")]),
                &[NodeCondition::MemoryPressure]
            )
            .reason,
            "Evicted"
        );
    }

    #[test]
    fn predicates() {
        let mut a = Admitter::new(node(), SecurityPolicy::default(), []);
        let mut p = pod("p", vec![container("a", "", "")]);
        p.spec.as_mut().unwrap().node_selector = Some([("zone".to_owned(), "b".to_owned())].into());
        let r = a.admit(&p, &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "NodeAffinity",
                "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
            )
        );
        let mut p = pod("p", vec![container("a", "", "")]);
        p.spec.as_mut().unwrap().node_name = Some("node-b".into());
        assert_eq!(a.admit(&p, &[]).reason, "NodeName");
        let mut web = pod("web", vec![container("a", "", "")]);
        web.spec.as_mut().unwrap().containers[0].ports = Some(vec![ContainerPort {
            container_port: 80,
            host_port: Some(8080),
            ..Default::default()
        }]);
        assert!(a.admit(&web, &[]).admitted);
        a.add(&web);
        assert_eq!(a.admit(&web, &[]).reason, "NodePorts");
        let mut n = node();
        n.taints = vec![Taint {
            key: "k".into(),
            value: Some("v".into()),
            effect: "NoExecute".into(),
            ..Default::default()
        }];
        let a = Admitter::new(n, SecurityPolicy::default(), []);
        let mut p = pod("p", vec![container("a", "", "")]);
        assert_eq!(a.admit(&p, &[]).reason, "TaintToleration");
        p.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some("k".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }]);
        assert!(a.admit(&p, &[]).admitted);
    }

    #[test]
    fn pod_security() {
        let strict = Admitter::new(node(), SecurityPolicy::default(), []);
        let lax = Admitter::new(
            node(),
            SecurityPolicy {
                allow_privileged: true,
                allow_host_namespaces: true,
                allow_host_pid: true,
                allow_host_ipc: true,
                allow_host_paths: true,
                ..SecurityPolicy::default()
            },
            [],
        );
        let mut p = pod("p", vec![container("a", "", "")]);
        p.spec.as_mut().unwrap().containers[0].security_context = Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        let r = strict.admit(&p, &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "PodSecurity",
                "pod with UID \"uid-p\" specified privileged container, but is disallowed"
            )
        );
        assert!(lax.admit(&p, &[]).admitted);
        let mut p = pod("p", vec![container("a", "", "")]);
        p.spec.as_mut().unwrap().host_network = Some(true);
        assert!(!strict.admit(&p, &[]).admitted);
        // Host network allowed does not allow hostPID or hostIPC.
        let host_net = Admitter::new(
            node(),
            SecurityPolicy {
                allow_host_namespaces: true,
                ..SecurityPolicy::default()
            },
            [],
        );
        assert!(host_net.admit(&p, &[]).admitted);
        for (pid, ipc, what) in [(true, false, "host PID"), (false, true, "host ipc")] {
            let mut q = p.clone();
            q.spec.as_mut().unwrap().host_pid = Some(pid);
            q.spec.as_mut().unwrap().host_ipc = Some(ipc);
            let r = host_net.admit(&q, &[]);
            assert_eq!(
                r.message,
                format!("pod with UID \"uid-p\" specified {what}, but is disallowed")
            );
            assert!(lax.admit(&q, &[]).admitted);
        }
        // Capabilities: baseline's list may be added, anything else is privileged.
        let caps = |add: &[&str]| {
            let mut q = pod("p", vec![container("a", "", "")]);
            q.spec.as_mut().unwrap().containers[0].security_context = Some(SecurityContext {
                capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
                    add: Some(add.iter().map(|s| (*s).to_owned()).collect()),
                    drop: Some(vec!["ALL".to_owned()]),
                }),
                ..Default::default()
            });
            q
        };
        assert!(
            strict
                .admit(&caps(&["NET_BIND_SERVICE", "CHOWN"]), &[])
                .admitted
        );
        let r = strict.admit(&caps(&["NET_BIND_SERVICE", "SYS_ADMIN"]), &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "PodSecurity",
                "pod with UID \"uid-p\" specified capability SYS_ADMIN, but is disallowed"
            )
        );
        assert!(lax.admit(&caps(&["SYS_ADMIN"]), &[]).admitted);
        let mut p = pod("p", vec![container("a", "", "")]);
        p.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: "h".into(),
            host_path: Some(HostPathVolumeSource {
                path: "/".into(),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        assert!(!strict.admit(&p, &[]).admitted);
        assert!(lax.admit(&p, &[]).admitted);
    }

    fn yaml_pod(y: &str) -> Pod {
        let mut p: Pod = serde_yaml_ng::from_str(y).unwrap();
        p.metadata.uid = Some("uid-p".into());
        p
    }

    /// kubelet's sysctl admission (before resource fit), the AppArmor admit handler, and the
    /// baseline container settings beyond privileged and capabilities.
    #[test]
    fn sysctls_apparmor_and_baseline_settings() {
        let strict = Admitter::new(node(), SecurityPolicy::default(), []);
        let sysctl = |name: &str, extra: &str| {
            yaml_pod(&format!(
                "metadata: {{name: p}}\nspec: {{{extra}securityContext: {{sysctls: [{{name: {name}, value: '1'}}]}}, containers: [{{name: a}}]}}"
            ))
        };
        assert!(
            strict
                .admit(&sysctl("kernel.shm_rmid_forced", ""), &[])
                .admitted
        );
        let r = strict.admit(&sysctl("kernel.msgmax", ""), &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "SysctlForbidden",
                "forbidden sysctl: \"kernel.msgmax\" not allowlisted"
            )
        );
        // A safe net.* sysctl with the host's network namespace: refused.
        let r = strict.admit(
            &sysctl("net.ipv4.tcp_syncookies", "hostNetwork: true, "),
            &[],
        );
        assert_eq!(
            r.message,
            "forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host Net enabled"
        );
        let allowing = Admitter::new(
            node(),
            SecurityPolicy {
                sysctls: SysctlAllowlist::new(&["kernel.msg*".to_owned()]).unwrap(),
                ..SecurityPolicy::default()
            },
            [],
        );
        assert!(allowing.admit(&sysctl("kernel.msgmax", ""), &[]).admitted);
        assert_eq!(
            allowing.admit(&sysctl("kernel.sem", ""), &[]).reason,
            "SysctlForbidden"
        );
        // Sysctls come before resource fit, as in kubelet's handler order.
        let mut big = sysctl("kernel.sem", "");
        big.spec.as_mut().unwrap().containers[0] = container("a", "cpu=100", "");
        assert_eq!(strict.admit(&big, &[]).reason, "SysctlForbidden");

        // AppArmor: no AppArmor on the host refuses a profile; unconfined is baseline's
        // refusal instead.
        let runtime_default = yaml_pod(
            "metadata: {name: p}\nspec: {containers: [{name: a, securityContext: {appArmorProfile: {type: RuntimeDefault}}}]}",
        );
        let r = strict.admit(&runtime_default, &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "AppArmor",
                "Cannot enforce AppArmor: AppArmor is not enabled on the host"
            )
        );
        let with_apparmor = Admitter::new(
            node(),
            SecurityPolicy {
                apparmor_enabled: true,
                ..SecurityPolicy::default()
            },
            [],
        );
        assert!(with_apparmor.admit(&runtime_default, &[]).admitted);

        let lax = Admitter::new(
            node(),
            SecurityPolicy {
                allow_privileged: true,
                ..SecurityPolicy::default()
            },
            [],
        );
        for (spec, what) in [
            (
                "{securityContext: {seccompProfile: {type: Unconfined}}, containers: [{name: a}]}",
                "seccomp profile Unconfined for <pod>",
            ),
            (
                "{containers: [{name: a, securityContext: {seccompProfile: {type: Unconfined}}}]}",
                "seccomp profile Unconfined for a",
            ),
            (
                "{containers: [{name: a, securityContext: {procMount: Unmasked}}]}",
                "procMount Unmasked for a",
            ),
            (
                "{containers: [{name: a, securityContext: {appArmorProfile: {type: Unconfined}}}]}",
                "AppArmor profile Unconfined for a",
            ),
            (
                "{securityContext: {seLinuxOptions: {type: spc_t}}, containers: [{name: a}]}",
                "SELinux options beyond baseline for <pod>",
            ),
            (
                "{initContainers: [{name: i, securityContext: {seLinuxOptions: {user: system_u}}}], containers: [{name: a}]}",
                "SELinux options beyond baseline for i",
            ),
        ] {
            let p = yaml_pod(&format!("metadata: {{name: p}}\nspec: {spec}"));
            let r = strict.admit(&p, &[]);
            assert_eq!(
                (r.reason.as_str(), r.message),
                (
                    "PodSecurity",
                    format!("pod with UID \"uid-p\" specified {what}, but is disallowed")
                ),
                "{spec}"
            );
            assert!(lax.admit(&p, &[]).admitted, "{spec}");
        }
        for ok in [
            "{securityContext: {seccompProfile: {type: RuntimeDefault}}, containers: [{name: a, securityContext: {procMount: Default, seLinuxOptions: {type: container_t, level: 's0:c1'}}}]}",
            "{containers: [{name: a, securityContext: {seccompProfile: {type: Localhost, localhostProfile: p.json}}}]}",
        ] {
            let p = yaml_pod(&format!("metadata: {{name: p}}\nspec: {ok}"));
            assert!(strict.admit(&p, &[]).admitted, "{ok}");
        }
        let annotated = yaml_pod(
            "metadata: {name: p, annotations: {container.apparmor.security.beta.kubernetes.io/a: unconfined}}\nspec: {containers: [{name: a}]}",
        );
        assert_eq!(
            strict.admit(&annotated, &[]).message,
            "pod with UID \"uid-p\" specified AppArmor profile unconfined in annotation container.apparmor.security.beta.kubernetes.io/a, but is disallowed"
        );
    }
}
