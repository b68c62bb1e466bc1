//! The pure decision layer: kubelet's decisions as plain functions from values to values.
//!
//! Nothing here does I/O or reads a clock: time is a parameter (a [`std::time::Duration`] since
//! an epoch the caller picks), and every decision is a `#[must_use]` value that carries its
//! reason, so it can be printed, tested and audited. The semantics are kubelet's (1.32-1.34):
//! see `../shared/KUBELET.md` and the kubelet sources each module names.
//!
//! - [`resources`]: pod requests and limits (sidecar-aware), API defaulting, critical pods.
//! - [`qos`]: the pod QoS class.
//! - [`swap`]: node swap (`NoSwap` / `LimitedSwap`): each container's `memory.swap.max`.
//! - [`cgroup_name`]: kubelet's cgroup names under the cgroupfs and systemd drivers.
//! - [`oom`]: per-container `oom_score_adj`, and cgroup values (shares, weight, quota, limits).
//! - [`eviction`]: signals, thresholds, ranking and the eviction manager's step.
//! - [`admission`]: eviction admission, resource fit, predicates, pod security.
//! - [`preemption`]: the pods a critical pod that does not fit preempts (kubelet's
//!   `CriticalPodAdmissionHandler`).
//! - [`cpu`]: the CPU manager's static policy and its checkpoint.
//! - [`memory`]: the memory manager's static policy, `reservedMemory` and its checkpoint.
//! - [`topology`]: the topology manager: NUMA cells, hint merging and its admission.
//! - [`checksum`]: kubelet's checkpoint checksum.
//! - [`pod_actions`]: the pod worker's plan (kubelet's `computePodActions`) and the pod phase.
//! - [`pod_status`]: the pod's status (kubelet's `generateAPIPodStatus`) from what the worker
//!   observed.
//! - [`backoff`]: crash-loop and image-pull backoff.
//! - [`images`]: image references, the registry pull limiter, pull errors, pull secrets'
//!   keyring and the image garbage collector's choices.
//! - [`env`]: a container's environment (`fieldRef`, `resourceFieldRef`, `$(VAR)` expansion).
//! - [`volumes`]: the volumes a pod asks for, as set-up steps and CRI mounts, or a refusal.
//! - [`resize`]: in-place pod resize: the allocation's decision (`Deferred` / `Infeasible`),
//!   the resize actions and cgroup order, the `allocated_pods_state` checkpoint.
//! - [`security`]: the pod's security context as CRI runs it, sysctl and AppArmor admission.

pub mod admission;
pub mod backoff;
pub mod cgroup_name;
pub mod checksum;
pub mod cpu;
pub mod dns;
pub mod env;
pub mod eviction;
pub mod images;
pub mod memory;
pub mod objects;
pub mod oom;
pub mod pod_actions;
pub mod pod_status;
pub mod preemption;
pub mod qos;
pub mod resize;
pub mod resources;
pub mod security;
pub mod swap;
pub mod topology;
pub mod volumes;
