//! The CPU manager's static policy (`pkg/kubelet/cm/cpumanager`: `policy_static.go`,
//! `cpu_assignment.go`, `state/checkpoint.go`).
//!
//! Guaranteed pods' containers with a whole number of CPUs get exclusive CPUs, taken by
//! topology (whole sockets, then whole cores, then single threads, preferring already partly
//! used sockets and cores); everything else runs on the shared (default) pool, which keeps the
//! reserved CPUs. The state is checkpointed in kubelet's JSON format with its checksum. The
//! policy does no I/O: the topology is read by the caller ([`crate::node::cpu_topology`]), and
//! the checkpoint file is read and written by the caller ([`crate::container_manager`]).
//!
//! - [`cpuset`]: [`CpuSet`], kubelet's cpuset with its `0-3,8` syntax.
//! - [`topology`]: [`Topology`], which socket and core each CPU sits on.
//! - [`assignment`]: [`take_by_topology`], kubelet's packed CPU assignment.
//! - [`static_policy`]: [`StaticPolicy`], allocation and release of exclusive CPUs.
//! - [`hints`]: the static policy as a topology manager hint provider (`GetTopologyHints`,
//!   NUMA-aligned `Allocate`).
//! - [`checkpoint`]: [`CpuState`] and its [`Checkpoint`] (`cpu_manager_state`), checksummed.

pub mod assignment;
pub mod checkpoint;
pub mod cpuset;
pub mod hints;
pub mod static_policy;
pub mod topology;

pub use assignment::take_by_topology;
pub use checkpoint::{Checkpoint, CpuState};
pub use cpuset::CpuSet;
pub use static_policy::{StaticPolicy, guaranteed_cpus};
pub use topology::{CpuInfo, Topology};

/// What can go wrong in the CPU manager.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuError {
    /// A cpuset string does not parse.
    #[error("invalid cpuset {0:?}")]
    CpuSet(String),
    /// Reading the topology failed.
    #[error("{path}: {message}")]
    Sysfs {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// No CPUs reserved.
    #[error(
        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
    )]
    NoReservedCpus,
    /// Reserved CPUs outside the topology.
    #[error("[cpumanager] reserved cpus {0} are not all online cpus")]
    ReservedOutside(String),
    /// Not enough free CPUs.
    #[error(
        "not enough cpus available to satisfy request: requested={requested}, available={available}"
    )]
    NotEnough {
        /// Requested.
        requested: usize,
        /// Available.
        available: usize,
    },
    /// The checkpoint was written by another policy.
    #[error("configured policy {configured:?} differs from state checkpoint policy {checkpoint:?}")]
    PolicyChanged {
        /// The configured policy.
        configured: String,
        /// The checkpoint's.
        checkpoint: String,
    },
    /// The checkpoint is corrupt.
    #[error("cpu manager checkpoint: {0}")]
    Checkpoint(String),
}
