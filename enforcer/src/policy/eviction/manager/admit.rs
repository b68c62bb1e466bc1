//! The eviction manager's `Admit`: pods admitted under the node's pressure conditions.

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};

use super::REASON;
use crate::policy::{eviction::NodeCondition, qos, resources};

/// The result of an admission check.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitResult {
    /// Admitted or not.
    pub admitted: bool,
    /// `Evicted`, `OutOfcpu`, ... when rejected.
    pub reason: String,
    /// The message when rejected.
    pub message: String,
}

impl AdmitResult {
    /// Admitted.
    pub fn admit() -> Self {
        Self {
            admitted: true,
            reason: String::new(),
            message: String::new(),
        }
    }
    /// Rejected.
    pub fn reject(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            admitted: false,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// `TolerationsTolerateTaint` for one taint.
#[must_use]
pub fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| toleration_tolerates(t, taint))
}

/// `Toleration.ToleratesTaint`.
#[must_use]
pub fn toleration_tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect = t.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = t.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

/// The eviction manager's `Admit` under the current node conditions (sorted by name).
pub fn admit(conditions: &[NodeCondition], pod: &Pod) -> AdmitResult {
    if conditions.is_empty() || resources::is_critical(pod) {
        return AdmitResult::admit();
    }
    if conditions == [NodeCondition::MemoryPressure] {
        if qos::pod_qos(pod) != qos::QosClass::BestEffort {
            return AdmitResult::admit();
        }
        let taint = Taint {
            key: NodeCondition::MemoryPressure.taint_key().to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        };
        let tolerations = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or(&[]);
        if tolerates(tolerations, &taint) {
            return AdmitResult::admit();
        }
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
    AdmitResult::reject(
        REASON,
        format!("The node had condition: [{}]. ", names.join(" ")),
    )
}
