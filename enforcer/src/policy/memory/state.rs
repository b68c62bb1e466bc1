//! The memory manager's state (`pkg/kubelet/cm/memorymanager/state/state.go`): per NUMA node
//! and resource, the memory table (total, system reserved, allocatable, reserved, free), the
//! number of assignments and the group of nodes it is allocated with; per container, its
//! [`Block`]s. Serialized as kubelet's JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// `MemoryTable`: one resource on one NUMA node, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryTable {
    /// `TotalMemSize`.
    #[serde(rename = "total")]
    pub total_mem_size: u64,
    /// `SystemReserved`.
    #[serde(rename = "systemReserved")]
    pub system_reserved: u64,
    /// `Allocatable`.
    pub allocatable: u64,
    /// `Reserved`: given to containers.
    pub reserved: u64,
    /// `Free`.
    pub free: u64,
}

/// `NUMANodeState`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNodeState {
    /// `NumberOfAssignments`: blocks placed on the node (a container with memory and
    /// hugepages counts two).
    #[serde(rename = "numberOfAssignments")]
    pub number_of_assignments: i64,
    /// `MemoryMap`: resource -> table.
    #[serde(rename = "memoryMap", default, deserialize_with = "null_as_default")]
    pub memory_map: BTreeMap<String, MemoryTable>,
    /// `Cells`: this node and the nodes it is allocated together with.
    #[serde(default, deserialize_with = "null_as_default")]
    pub cells: Vec<usize>,
}

/// `NUMANodeMap`: node id -> state.
pub type NumaNodeMap = BTreeMap<usize, NumaNodeState>;

/// `Block`: memory of one resource given to a container on a set of nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    /// `NUMAAffinity`: the node ids.
    #[serde(rename = "numaAffinity", default, deserialize_with = "null_as_default")]
    pub numa_affinity: Vec<usize>,
    /// `Type`: `memory` or `hugepages-<size>`.
    #[serde(rename = "type")]
    pub resource: String,
    /// `Size` in bytes.
    pub size: u64,
}

/// `ContainerMemoryAssignments`: pod uid -> container -> blocks.
pub type ContainerMemoryAssignments = BTreeMap<String, BTreeMap<String, Vec<Block>>>;

/// The state: the machine's and the containers'.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryState {
    /// `machineState`.
    pub machine_state: NumaNodeMap,
    /// `entries`.
    pub assignments: ContainerMemoryAssignments,
}

impl MemoryState {
    /// `GetMemoryBlocks`: a container's blocks, `None` when it has none recorded.
    #[must_use]
    pub fn blocks(&self, pod_uid: &str, container: &str) -> Option<&Vec<Block>> {
        self.assignments.get(pod_uid)?.get(container)
    }

    /// `SetMemoryBlocks`.
    pub fn set_blocks(&mut self, pod_uid: &str, container: &str, blocks: Vec<Block>) {
        self.assignments
            .entry(pod_uid.to_owned())
            .or_default()
            .insert(container.to_owned(), blocks);
    }

    /// `Delete`: a container's blocks, and the pod's entry once empty.
    pub fn delete(&mut self, pod_uid: &str, container: &str) {
        if let Some(m) = self.assignments.get_mut(pod_uid) {
            m.remove(container);
            if m.is_empty() {
                self.assignments.remove(pod_uid);
            }
        }
    }
}

/// Go's `null` for a slice or map reads as empty.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
