//! Node swap (KEP-2400, GA in 1.34): which containers may swap and how much.
//!
//! Kubelet: `pkg/kubelet/kuberuntime/kuberuntime_container_linux.go`
//! (`configureContainerSwapResources`, `GetContainerSwapBehavior`, `swapConfigurationHelper`,
//! `calcSwapForBurstablePods`), `pkg/kubelet/types` (`NoSwap`, `LimitedSwap`),
//! `pkg/kubelet/apis/config/validation` (`memorySwap.swapBehavior`).
//!
//! - `NoSwap` (the default, also for `""`): no container swaps. On cgroup v2 every container
//!   gets `memory.swap.max = 0`; on cgroup v1 the memory+swap limit equals the memory limit.
//! - `LimitedSwap` (cgroup v2 only): a container of a Burstable, non-critical pod whose
//!   memory request is set and differs from its limit gets
//!   `memory.swap.max = (request / node memory) * node swap`; every other container 0.
//! - Without a swap controller (no `memory.swap.max` in the kubelet's own cgroup on v2, no
//!   `memory.memsw.limit_in_bytes` on v1) nothing is written at all.
//!
//! Upstream the eviction manager does not count swap (the swap-aware eviction of
//! kubernetes#129578 was closed unmerged, KEP-5433 is open): `memory.available` stays
//! capacity minus the working set, which excludes swapped-out pages, and the memory ranking
//! uses the working set. The enforcer does the same.

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Serialize;

use super::{
    qos::{self, QosClass},
    resources,
};

/// `memorySwap.swapBehavior`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum SwapBehavior {
    /// No swap for any pod (kubelet's default, also written `""`).
    #[default]
    NoSwap,
    /// Burstable pods swap in proportion to their memory requests (cgroup v2 only).
    LimitedSwap,
}

impl SwapBehavior {
    /// The configuration's spelling: `""` and `NoSwap` are [`SwapBehavior::NoSwap`].
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "" | "NoSwap" => Some(Self::NoSwap),
            "LimitedSwap" => Some(Self::LimitedSwap),
            _ => None,
        }
    }

    /// kubelet's name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSwap => "NoSwap",
            Self::LimitedSwap => "LimitedSwap",
        }
    }
}

/// What a node offers containers in swap: the configured behaviour and what the node has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapOptions {
    /// `memorySwap.swapBehavior`.
    pub behavior: SwapBehavior,
    /// kubelet's `swapControllerAvailable`: `memory.swap.max` in its own cgroup (v2) or
    /// `memory.memsw.limit_in_bytes` (v1) exists.
    pub controller_available: bool,
    /// The machine's memory in bytes (cAdvisor's `MemoryCapacity`, `MemTotal`).
    pub memory_capacity: i64,
    /// The machine's swap in bytes (cAdvisor's `SwapCapacity`, `SwapTotal`).
    pub swap_capacity: i64,
}

/// Why the swap formula has no answer (kubelet then gives the container no swap).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SwapError {
    /// The node's memory is unknown.
    #[error("total node memory is 0")]
    NoNodeMemory,
    /// The request is larger than the machine.
    #[error("container request {request} is larger than total node memory {memory}")]
    RequestAboveNodeMemory {
        /// The container's memory request.
        request: i64,
        /// The node's memory.
        memory: i64,
    },
}

/// `calcSwapForBurstablePods`: `(request / node memory) * node swap`, in float64 as kubelet
/// computes it, truncated.
pub fn calc_swap_for_burstable_pods(
    container_memory_request: i64,
    node_total_memory: i64,
    total_pods_swap_available: i64,
) -> Result<i64, SwapError> {
    if node_total_memory <= 0 {
        return Err(SwapError::NoNodeMemory);
    }
    if container_memory_request > node_total_memory {
        return Err(SwapError::RequestAboveNodeMemory {
            request: container_memory_request,
            memory: node_total_memory,
        });
    }
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        reason = "kubelet computes the proportion in float64 and truncates"
    )]
    let swap = (container_memory_request as f64 / node_total_memory as f64
        * total_pods_swap_available as f64) as i64;
    Ok(swap)
}

/// What is written for a container's swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SwapSetting {
    /// Nothing: the node has no swap controller.
    Untouched,
    /// cgroup v1 `NoSwap`: the memory+swap limit equals the memory limit
    /// (CRI `memory_swap_limit_in_bytes = memory_limit_in_bytes`).
    SwapLimitIsMemoryLimit,
    /// cgroup v2: `memory.swap.max` (CRI `unified`), in bytes; 0 is no swap.
    SwapMax(i64),
}

/// Why a container got its swap setting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SwapReason {
    /// No swap controller on the node.
    NoController,
    /// The node's behaviour is `NoSwap`.
    NoSwapConfigured,
    /// `LimitedSwap` needs cgroup v2.
    CgroupV1,
    /// Critical pods never swap.
    CriticalPod,
    /// Only Burstable pods swap.
    NotBurstable(QosClass),
    /// The container has neither a memory request nor a memory limit.
    NoMemoryRequest,
    /// The container's memory request equals its limit.
    RequestEqualsLimit,
    /// The formula has no answer.
    Formula(SwapError),
    /// `LimitedSwap`: the request's share of the node's swap.
    Limited,
}

/// A container's swap decision and its reason.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerSwap {
    /// What to write.
    pub setting: SwapSetting,
    /// Why.
    pub reason: SwapReason,
}

fn memory(list: &resources::ResourceList) -> i128 {
    list.get("memory")
        .map_or(0, crate::quantity::Quantity::nanos)
}

/// `GetContainerSwapBehavior`: `LimitedSwap` only on cgroup v2 with a swap controller, for a
/// non-critical Burstable pod's container that requests memory other than its limit; else
/// `NoSwap`, with the reason.
pub fn container_swap_behavior(
    pod: &Pod,
    container: &Container,
    v2: bool,
    opts: &SwapOptions,
) -> (SwapBehavior, SwapReason) {
    let no = |reason| (SwapBehavior::NoSwap, reason);
    if opts.behavior != SwapBehavior::LimitedSwap {
        return no(SwapReason::NoSwapConfigured);
    }
    if !opts.controller_available {
        return no(SwapReason::NoController);
    }
    if !v2 {
        return no(SwapReason::CgroupV1);
    }
    if resources::is_critical(pod) {
        return no(SwapReason::CriticalPod);
    }
    let qos = qos::pod_qos(pod);
    if qos != QosClass::Burstable {
        return no(SwapReason::NotBurstable(qos));
    }
    let request = memory(&resources::container_requests(container));
    let limit = memory(&resources::container_limits(container));
    if request == 0 && limit == 0 {
        return no(SwapReason::NoMemoryRequest);
    }
    if request == limit {
        return no(SwapReason::RequestEqualsLimit);
    }
    (SwapBehavior::LimitedSwap, SwapReason::Limited)
}

/// `configureContainerSwapResources` for `container` of `pod` (API-defaulted) on a node
/// whose memory hierarchy is cgroup v2 (`v2`) or v1.
pub fn container_swap(
    pod: &Pod,
    container: &Container,
    v2: bool,
    opts: &SwapOptions,
) -> ContainerSwap {
    if !opts.controller_available {
        return ContainerSwap {
            setting: SwapSetting::Untouched,
            reason: SwapReason::NoController,
        };
    }
    let no_swap = |reason| ContainerSwap {
        setting: if v2 {
            SwapSetting::SwapMax(0)
        } else {
            SwapSetting::SwapLimitIsMemoryLimit
        },
        reason,
    };
    match container_swap_behavior(pod, container, v2, opts) {
        (SwapBehavior::NoSwap, reason) => no_swap(reason),
        (SwapBehavior::LimitedSwap, reason) => {
            let request = resources::container_requests(container)
                .get("memory")
                .map_or(0, crate::quantity::Quantity::value);
            match calc_swap_for_burstable_pods(request, opts.memory_capacity, opts.swap_capacity) {
                Ok(bytes) => ContainerSwap {
                    setting: SwapSetting::SwapMax(bytes),
                    reason,
                },
                Err(e) => no_swap(SwapReason::Formula(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests;
