//! The topology manager's admission (`scope.go`, `scope_container.go`, `scope_none.go`,
//! `topology_manager.go`, and `pkg/kubelet/cm/admission`): for each init then app container,
//! the providers' hints are merged by the policy; a hint the policy refuses rejects the pod
//! with `TopologyAffinityError`; otherwise each provider allocates along the hint, and a
//! provider's error rejects the pod with `UnexpectedAdmissionError`. Under the `none` policy no
//! hints are gathered and the providers allocate with an any-node hint.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{Policy, ProviderHints, TopologyError, TopologyHint};
use crate::policy::{eviction::manager::AdmitResult, resources};

/// `TopologyAffinityError`'s reason.
pub const TOPOLOGY_AFFINITY_ERROR: &str = "TopologyAffinityError";
/// `TopologyAffinityError`'s message.
pub const TOPOLOGY_AFFINITY_MESSAGE: &str = "Resources cannot be allocated with Topology Locality";
/// The reason of a provider's allocation error (`ErrorReasonUnexpected`).
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// `topologyManagerScope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// `container`: one alignment per container.
    #[default]
    Container,
    /// `pod`: one alignment for the whole pod (validated, not implemented: refused at start).
    Pod,
}

impl Scope {
    /// From kubelet's name.
    pub fn parse(name: &str) -> Result<Self, TopologyError> {
        match name {
            "container" => Ok(Self::Container),
            "pod" => Ok(Self::Pod),
            other => Err(TopologyError::UnknownScope(other.to_owned())),
        }
    }
}

/// A provider's `Allocate` error (the CPU manager's or the memory manager's own error type);
/// its text goes into the pod's `UnexpectedAdmissionError`.
pub type ProviderError = Box<dyn std::error::Error + Send + Sync>;

/// A hint provider (`topologymanager.HintProvider`): the CPU and memory managers.
pub trait HintProvider {
    /// `GetTopologyHints` for one container.
    fn topology_hints(&self, pod: &Pod, container: &Container) -> ProviderHints;
    /// `Allocate` for one container along the merged hint (kubelet's providers read it from
    /// the topology manager's store; here it is passed in). The error is the provider's own.
    fn allocate(
        &mut self,
        pod: &Pod,
        container: &Container,
        hint: &TopologyHint,
    ) -> Result<(), ProviderError>;
}

/// The result of the topology manager's admission: kubelet's admit result and, for an
/// admitted pod, each container's merged hint.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeAdmit {
    /// Admitted, or the refusal's reason and message.
    pub result: AdmitResult,
    /// Container name -> its merged hint, in the order the containers were admitted.
    pub hints: Vec<(String, TopologyHint)>,
}

fn unexpected(err: &ProviderError) -> AdmitResult {
    AdmitResult::reject(
        UNEXPECTED_ADMISSION_ERROR,
        format!("Allocate failed due to {err}, which is unexpected"),
    )
}

/// The container scope's `Admit` (or the none scope's when `policy` is `none`), for the
/// providers in kubelet's order (CPU manager, then memory manager). Allocations made for
/// containers before a refusal stay, as in kubelet (they are released when the pod goes).
pub fn admit_container_scope(
    policy: Policy,
    numa_nodes: &[usize],
    providers: &mut [&mut dyn HintProvider],
    pod: &Pod,
) -> ScopeAdmit {
    let mut hints = Vec::new();
    let containers = resources::init_containers(pod)
        .iter()
        .chain(resources::containers(pod));
    for container in containers {
        let hint = if policy == Policy::None {
            TopologyHint::default()
        } else {
            let provided: Vec<ProviderHints> = providers
                .iter()
                .map(|p| p.topology_hints(pod, container))
                .collect();
            let (best, admit) = policy.merge(numa_nodes, &provided);
            if !admit {
                return ScopeAdmit {
                    result: AdmitResult::reject(TOPOLOGY_AFFINITY_ERROR, TOPOLOGY_AFFINITY_MESSAGE),
                    hints,
                };
            }
            best
        };
        hints.push((container.name.clone(), hint));
        for p in providers.iter_mut() {
            if let Err(e) = p.allocate(pod, container, &hint) {
                return ScopeAdmit {
                    result: unexpected(&e),
                    hints,
                };
            }
        }
    }
    ScopeAdmit {
        result: AdmitResult::admit(),
        hints,
    }
}
