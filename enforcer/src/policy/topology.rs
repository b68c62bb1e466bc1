//! Kubelet's topology manager (`pkg/kubelet/cm/topologymanager`), container scope: the hint
//! providers (the CPU manager's and the memory manager's static policies) each say on which
//! NUMA nodes a container's resources could sit ([`TopologyHint`]s), the policy merges them
//! into one best hint and decides admission, then each provider allocates along that hint.
//!
//! - [`bitmask`]: [`BitMask`], a set of NUMA node ids, and [`iterate_bit_masks`].
//! - [`merge`]: [`TopologyHint`], [`Policy`] (`none`, `best-effort`, `restricted`,
//!   `single-numa-node`) and kubelet's hint merging (`filterProvidersHints`,
//!   `mergePermutation`, `HintMerger`).
//! - [`scope`]: the container scope's admission over [`HintProvider`]s, with kubelet's
//!   refusal reasons.
//! - [`numa`]: [`NumaTopology`], the machine's NUMA cells (memory, hugepages, CPUs): the
//!   `MachineInfo.Topology` that kubelet gets from cAdvisor, read by
//!   [`crate::node::numa_topology`].
//!
//! Pure: the caller reads sysfs and the checkpoints.

pub mod bitmask;
pub mod merge;
pub mod numa;
pub mod scope;

#[cfg(test)]
mod tests;

pub use bitmask::{BitMask, iterate_bit_masks};
pub use merge::{Policy, ProviderHints, TopologyHint};
pub use numa::{HugePages, NumaCell, NumaTopology};
pub use scope::{HintProvider, ProviderError, Scope, admit_container_scope};

/// kubelet's `maxAllowableNUMANodes`: a policy other than `none` refuses larger machines.
pub const MAX_ALLOWABLE_NUMA_NODES: usize = 8;

/// What can go wrong in the topology manager.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// A NUMA node id beyond the mask.
    #[error("bit number must be in range 0-63")]
    BitOutOfRange,
    /// Too many NUMA nodes for a policy other than `none`.
    #[error("unsupported on machines with more than {0} NUMA Nodes")]
    TooManyNumaNodes(usize),
    /// An unknown policy name.
    #[error("unknown policy: \"{0}\"")]
    UnknownPolicy(String),
    /// An unknown scope name.
    #[error("unknown scope: \"{0}\"")]
    UnknownScope(String),
    /// A sysfs file is unreadable or malformed.
    #[error("{path}: {message}")]
    Sysfs {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// `NewManager`'s check: a policy other than `none` on more than
/// [`MAX_ALLOWABLE_NUMA_NODES`] NUMA nodes is refused.
pub fn check_numa_node_count(policy: Policy, numa_nodes: usize) -> Result<(), TopologyError> {
    if policy != Policy::None && numa_nodes > MAX_ALLOWABLE_NUMA_NODES {
        return Err(TopologyError::TooManyNumaNodes(MAX_ALLOWABLE_NUMA_NODES));
    }
    Ok(())
}
