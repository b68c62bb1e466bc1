//! Kubelet's memory manager (`pkg/kubelet/cm/memorymanager`), static policy: Guaranteed
//! pods' containers get their memory and hugepages reserved on NUMA nodes (one node, or a
//! group of nodes used only together), along the topology manager's hint; the reservations
//! are checkpointed as kubelet's `memory_manager_state` with its checksum; `reservedMemory`
//! is validated against node allocatable as kubelet validates it.
//!
//! - [`reserved`]: `reservedMemory` ([`MemoryReservation`]) validated and converted.
//! - [`state`]: the machine state ([`NumaNodeMap`]) and the containers' [`Block`]s.
//! - [`checkpoint`]: [`Checkpoint`] (`memory_manager_state`), checksummed.
//! - [`static_policy`]: [`StaticPolicy`]: `Allocate`, `RemoveContainer`, the topology
//!   hints, init containers' memory reuse, the start from a checkpoint.
//!
//! Pure: the NUMA cells come from [`crate::node::numa_topology`], the checkpoint file is read
//! and written by the caller.

pub mod checkpoint;
pub mod reserved;
pub mod state;
pub mod static_policy;

#[cfg(test)]
mod tests;

pub use checkpoint::Checkpoint;
pub use reserved::{MemoryReservation, SystemReservedMemory, system_reserved_memory};
pub use state::{
    Block, ContainerMemoryAssignments, MemoryState, MemoryTable, NumaNodeMap, NumaNodeState,
};
pub use static_policy::StaticPolicy;

/// The state file's name in the state directory (kubelet's `memoryManagerStateFileName`).
pub const STATE_FILE: &str = "memory_manager_state";

/// `memoryManagerPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum MemoryManagerPolicy {
    /// `None`: no NUMA placement.
    #[default]
    None,
    /// `Static`: Guaranteed pods' memory reserved on NUMA nodes.
    Static,
}

impl MemoryManagerPolicy {
    /// From kubelet's name.
    pub fn parse(name: &str) -> Result<Self, MemoryError> {
        match name {
            "None" => Ok(Self::None),
            "Static" => Ok(Self::Static),
            other => Err(MemoryError::UnknownPolicy(other.to_owned())),
        }
    }

    /// Kubelet's name (also the checkpoint's `policyName`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::Static => "Static",
        }
    }
}

/// What can go wrong in the memory manager, with kubelet's texts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// An unknown policy name.
    #[error("unknown policy: \"{0}\"")]
    UnknownPolicy(String),
    /// The static policy without reserved memory.
    #[error("[memorymanager] you should specify the system reserved memory")]
    NoSystemReserved,
    /// A reservation on a NUMA node the machine lacks.
    #[error(
        "the reserved memory configuration references a NUMA node {0} that does not exist on this machine"
    )]
    ReservedNodeMissing(i64),
    /// The reservations' sum differs from node allocatable's reservation.
    #[error(
        "the total amount {total:?} of type {resource:?} is not equal to the value {allocatable:?} determined by Node Allocatable feature"
    )]
    ReservedNotEqual {
        /// Sum of `reservedMemory` for the resource.
        total: String,
        /// The resource.
        resource: String,
        /// kube-reserved + system-reserved + the hard eviction threshold.
        allocatable: String,
    },
    /// A reservation that is not a whole number of bytes.
    #[error("could not covert a variable of type Quantity to int64")]
    ReservedNotInt,
    /// A request that is not a whole number of bytes.
    #[error("[memorymanager] failed to represent quantity as int64")]
    NotInt64,
    /// A checkpoint with assignments but no machine state.
    #[error("[memorymanager] machine state can not be empty when it has memory assignments")]
    EmptyMachineState,
    /// A checkpointed assignment on a node the machine lacks.
    #[error(
        "[memorymanager] (pod: {pod}, container: {container}) the memory assignment uses the NUMA that does not exist"
    )]
    AssignmentNodeMissing {
        /// Pod uid.
        pod: String,
        /// Container.
        container: String,
    },
    /// A checkpointed assignment of a resource the machine lacks.
    #[error(
        "[memorymanager] (pod: {pod}, container: {container}) the memory assignment uses memory resource that does not exist"
    )]
    AssignmentResourceMissing {
        /// Pod uid.
        pod: String,
        /// Container.
        container: String,
    },
    /// The checkpoint's machine state does not match the machine and the reservations.
    #[error("[memorymanager] the expected machine state is different from the real one")]
    MachineStateDiffers,
    /// The topology manager's hint was preferred, the memory manager's default is not.
    #[error("[memorymanager] failed to find the default preferred hint")]
    NoDefaultPreferredHint,
    /// The topology manager's hint was preferred, its extension is not.
    #[error("[memorymanager] failed to find the extended preferred hint")]
    NoExtendedPreferredHint,
    /// The hint mixes single- and multi-node allocations.
    #[error("[memorymanager] preferred hint violates NUMA node allocation")]
    ViolatesNumaAllocation,
    /// No NUMA node set fits the request.
    #[error(
        "[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available"
    )]
    NoDefaultAffinity,
    /// No NUMA node set extends the hint to fit the request.
    #[error("[memorymanager] failed to find NUMA nodes to extend the current topology hint")]
    NoExtension,
    /// The checkpoint was written by another policy.
    #[error(
        "[memorymanager] configured policy {configured:?} differs from state checkpoint policy {checkpoint:?}"
    )]
    PolicyChanged {
        /// The configured policy.
        configured: String,
        /// The checkpoint's.
        checkpoint: String,
    },
    /// The checkpoint does not parse or its checksum does not match.
    #[error("{0}")]
    Checkpoint(String),
}
