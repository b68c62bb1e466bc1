//! Pod admission, in kubelet's order: eviction admission under node conditions, then resource
//! fit and the predicates (`pkg/kubelet/lifecycle/predicate.go`: `generalFilter`, the
//! scheduler's `AdmissionCheck`), then the node's pod-security rules. Only the first failure is
//! reported.
//!
//! [`Admitter`] keeps the running totals of the admitted pods, so admitting pods one after
//! another costs O(pod) each, not O(node).
//!
//! By job: [`node_allocatable`] (what the node offers pods), [`resource_fit`] (requests against
//! it), [`predicates`] (node affinity and selector, node name, host ports, taints) and
//! [`pod_security`] (the node's Pod Security rules); here, the [`Admitter`] that holds the
//! totals and runs them in order.

pub mod node_allocatable;
pub mod pod_security;
pub mod predicates;
pub mod resource_fit;

pub use node_allocatable::{allocatable, kubepods_memory_limit};
pub use pod_security::{
    BASELINE_CAPABILITIES, BASELINE_SELINUX_TYPES, SECURITY_REASON, SecurityPolicy,
};
pub use predicates::node_affinity_matches;
pub use resource_fit::{Insufficient, is_extended_resource};

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Taint};

use self::resource_fit::Requested;
use super::{
    eviction::{
        NodeCondition,
        manager::{self, AdmitResult},
    },
    resources::{self, ResourceList},
    security,
};
use crate::quantity::{Format, Quantity};

/// What is wrong with admission inputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// A reservation exceeds nothing sensible.
    #[error("resource {0}: arithmetic overflow")]
    Overflow(String),
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
    /// The admit handlers kubelet runs before the container manager allocates resources (the
    /// topology, CPU and memory managers' handler): the eviction manager's, then the sysctls'.
    pub fn admit_before_resources(&self, pod: &Pod, conditions: &[NodeCondition]) -> AdmitResult {
        let r = manager::admit(conditions, pod);
        if !r.admitted {
            return r;
        }
        if let Err((reason, message)) = self.security.sysctls.admit(pod) {
            return AdmitResult::reject(reason, message);
        }
        AdmitResult::admit()
    }

    fn admit_checking(&self, pod: &Pod, conditions: &[NodeCondition], fit: bool) -> AdmitResult {
        // kubelet's admit handlers in order: eviction, sysctls, (the resource managers'
        // allocation, run by the pod loop between these), resource fit and predicates,
        // AppArmor; then the node's pod-security rules.
        let r = self.admit_before_resources(pod, conditions);
        if !r.admitted {
            return r;
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
    use super::*;

    pub(super) fn list(s: &str) -> ResourceList {
        s.split(',')
            .map(|kv| kv.split_once('=').unwrap())
            .map(|(k, v)| (k.to_owned(), Quantity::parse(v).unwrap()))
            .collect()
    }

    pub(super) fn node() -> Node {
        Node {
            name: "node-a".into(),
            labels: [("zone".to_owned(), "a".to_owned())].into(),
            taints: vec![],
            allocatable: list("cpu=4,memory=8Gi,ephemeral-storage=100Gi,pods=3,example.com/gpu=1"),
        }
    }
}
