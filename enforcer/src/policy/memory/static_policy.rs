//! The memory manager's static policy (`policy_static.go`): Guaranteed pods' containers get
//! their memory and hugepages requests reserved on a set of NUMA nodes. A node serves either
//! single-node allocations or one group of nodes allocated together, never both. Hints are
//! every node set with enough allocatable (and free) memory for all the requested types;
//! preferred are the smallest. `Allocate` takes the topology manager's hint (or the best
//! default one), widens it when it does not fit, and updates the machine state; memory given
//! to regular init containers is reused by the containers that follow them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    Block, MemoryError, MemoryState, MemoryTable, NumaNodeMap, NumaNodeState, SystemReservedMemory,
};
use crate::policy::{
    qos::{self, QosClass},
    resources,
    topology::{BitMask, NumaTopology, ProviderHints, TopologyHint, iterate_bit_masks},
};

/// `reusableMemory`: pod uid -> NUMA mask (printed) -> resource -> bytes.
type ReusableMemory = BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>>;

/// Requested bytes by resource (`memory`, `hugepages-*`).
type Requested = BTreeMap<String, u64>;

/// The static policy with its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPolicy {
    machine: NumaTopology,
    system_reserved: SystemReservedMemory,
    /// `initContainersReusableMemory`: not checkpointed, as in kubelet.
    reusable: ReusableMemory,
    state: MemoryState,
}

fn mask_of(bits: &[usize]) -> BitMask {
    BitMask::new(bits).unwrap_or_default()
}

/// `areGroupsEqual`.
fn groups_equal(a: &[usize], b: &[usize]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

fn table(state: &NumaNodeMap, node: usize, resource: &str) -> MemoryTable {
    state
        .get(&node)
        .and_then(|n| n.memory_map.get(resource))
        .copied()
        .unwrap_or_default()
}

/// `isRegularInitContainer`.
fn is_regular_init_container(pod: &Pod, container: &Container) -> bool {
    resources::init_containers(pod)
        .iter()
        .find(|c| c.name == container.name)
        .is_some_and(|c| !resources::is_sidecar(c))
}

/// kubelet's `IsPodLevelResourcesSet` (the gate is on by default in 1.35).
fn pod_level_resources_set(pod: &Pod) -> bool {
    resources::pod_level(pod).is_some_and(|r| {
        r.requests
            .iter()
            .chain(r.limits.iter())
            .flat_map(BTreeMap::keys)
            .any(|k| resources::is_supported_pod_level_resource(k))
    })
}

/// `getRequestedResources`: the container's memory and hugepages requests in bytes, or the
/// resources allocated at admission when its status records them (in-place resize).
pub fn requested_resources(pod: &Pod, container: &Container) -> Result<Requested, MemoryError> {
    let status = pod.status.as_ref();
    let mut statuses: Vec<&k8s_openapi::api::core::v1::ContainerStatus> = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .collect();
    if resources::is_sidecar(container) {
        statuses.extend(
            status
                .and_then(|s| s.init_container_statuses.as_ref())
                .into_iter()
                .flatten(),
        );
    }
    let list = match statuses.iter().find(|s| s.name == container.name) {
        Some(cs) => cs
            .allocated_resources
            .as_ref()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), resources::lenient(v)))
                    .collect()
            })
            .unwrap_or_default(),
        None => resources::container_requests(container),
    };
    let mut out = Requested::new();
    for (name, q) in list {
        if name != "memory" && !name.starts_with("hugepages-") {
            continue;
        }
        let v = super::reserved::as_u64(&q).ok_or(MemoryError::NotInt64)?;
        out.insert(name, v);
    }
    Ok(out)
}

/// `findBestHint`: preferred first, then the narrowest.
fn find_best_hint(hints: &[TopologyHint]) -> TopologyHint {
    let mut best = TopologyHint::default();
    for h in hints {
        let (Some(b), Some(m)) = (best.affinity, h.affinity) else {
            if best.affinity.is_none() {
                best = *h;
            }
            continue;
        };
        if h.preferred && !best.preferred {
            best = *h;
            continue;
        }
        if h.preferred == best.preferred && m.is_narrower_than(b) {
            best = *h;
        }
    }
    best
}

/// `isAffinitySatisfyRequest`.
fn affinity_satisfies(state: &NumaNodeMap, mask: BitMask, requested: &Requested) -> bool {
    requested.iter().all(|(res, size)| {
        mask.bits()
            .iter()
            .map(|n| table(state, *n, res).free)
            .fold(0u64, u64::saturating_add)
            >= *size
    })
}

/// `isAffinityViolatingNUMAAllocations`.
fn violates_numa_allocations(state: &NumaNodeMap, mask: BitMask) -> bool {
    let bits = mask.bits();
    let single = bits.len() == 1;
    bits.iter().any(|n| {
        let Some(node) = state.get(n) else {
            return false;
        };
        if node.number_of_assignments == 0 || single {
            return false;
        }
        node.cells.len() == 1 || !groups_equal(&node.cells, &bits)
    })
}

/// `updateMachineState` (also `validateState`'s replay of the assignments): counts the
/// assignment on every node of the mask and takes `size` from their free memory in order.
fn reserve(state: &mut NumaNodeMap, bits: &[usize], resource: &str, mut size: u64) {
    for n in bits {
        let Some(node) = state.get_mut(n) else {
            continue;
        };
        node.number_of_assignments = node.number_of_assignments.saturating_add(1);
        node.cells = bits.to_vec();
        if size == 0 {
            continue;
        }
        let Some(t) = node.memory_map.get_mut(resource) else {
            continue;
        };
        if t.free == 0 {
            continue;
        }
        if t.free >= size {
            t.reserved = t.reserved.saturating_add(size);
            t.free -= size;
            size = 0;
            continue;
        }
        size -= t.free;
        t.reserved = t.reserved.saturating_add(t.free);
        t.free = 0;
    }
}

impl StaticPolicy {
    /// `NewPolicyStatic`: refuses a machine without reserved memory. The state starts empty;
    /// [`Self::start`] fills it.
    pub fn new(machine: NumaTopology, reserved: SystemReservedMemory) -> Result<Self, MemoryError> {
        let total: u64 = reserved
            .values()
            .filter_map(|m| m.get("memory"))
            .fold(0, |a, v| a.saturating_add(*v));
        if total == 0 {
            return Err(MemoryError::NoSystemReserved);
        }
        Ok(Self {
            machine,
            system_reserved: reserved,
            reusable: ReusableMemory::new(),
            state: MemoryState::default(),
        })
    }

    /// A policy on a given state, unvalidated (kubelet's tests' `initTests`).
    #[cfg(test)]
    pub(super) fn with_state(mut self, state: MemoryState) -> Self {
        self.state = state;
        self
    }

    /// The init containers' reusable memory, preset (kubelet's tests).
    #[cfg(test)]
    pub(super) fn with_reusable(mut self, pod: &str) -> Self {
        self.reusable.insert(pod.to_owned(), BTreeMap::new());
        self
    }

    /// The state (for the checkpoint).
    #[must_use]
    pub fn state(&self) -> &MemoryState {
        &self.state
    }

    /// The checkpoint of the state.
    #[must_use]
    pub fn checkpoint(&self) -> super::Checkpoint {
        super::Checkpoint::from_state(super::MemoryManagerPolicy::Static.name(), &self.state)
    }

    fn system_reserved(&self, node: usize, resource: &str) -> u64 {
        self.system_reserved
            .get(&node)
            .and_then(|m| m.get(resource))
            .copied()
            .unwrap_or(0)
    }

    /// `getDefaultMachineState`: every cell's memory and hugepages pools, minus the reserved,
    /// memory also minus the hugepages.
    #[must_use]
    pub fn default_machine_state(&self) -> NumaNodeMap {
        let mut out = NumaNodeMap::new();
        for cell in &self.machine.cells {
            let mut node = NumaNodeState {
                number_of_assignments: 0,
                memory_map: BTreeMap::new(),
                cells: vec![cell.id],
            };
            let mut hugepages = 0u64;
            for hp in &cell.hugepages {
                let name = hp.resource_name();
                let reserved = self.system_reserved(cell.id, &name);
                let total = hp.total_bytes();
                let allocatable = total.saturating_sub(reserved);
                node.memory_map.insert(
                    name,
                    MemoryTable {
                        total_mem_size: total,
                        system_reserved: reserved,
                        allocatable,
                        reserved: 0,
                        free: allocatable,
                    },
                );
                hugepages = hugepages.saturating_add(total);
            }
            let reserved = self.system_reserved(cell.id, "memory");
            let allocatable = cell
                .memory
                .saturating_sub(reserved)
                .saturating_sub(hugepages);
            node.memory_map.insert(
                "memory".to_owned(),
                MemoryTable {
                    total_mem_size: cell.memory,
                    system_reserved: reserved,
                    allocatable,
                    reserved: 0,
                    free: allocatable,
                },
            );
            out.insert(cell.id, node);
        }
        out
    }

    /// `Start` (`validateState`): takes the checkpointed state; an empty machine state is
    /// filled from the machine; otherwise it must equal the machine state the assignments
    /// imply (a changed machine or reservation refuses to start).
    pub fn start(&mut self, mut state: MemoryState) -> Result<(), MemoryError> {
        if state.machine_state.is_empty() {
            if !state.assignments.is_empty() {
                return Err(MemoryError::EmptyMachineState);
            }
            state.machine_state = self.default_machine_state();
            self.state = state;
            return Ok(());
        }
        let mut expected = self.default_machine_state();
        for (pod, containers) in &state.assignments {
            for (name, blocks) in containers {
                for b in blocks {
                    for n in &b.numa_affinity {
                        let Some(node) = expected.get(n) else {
                            return Err(MemoryError::AssignmentNodeMissing {
                                pod: pod.clone(),
                                container: name.clone(),
                            });
                        };
                        if !node.memory_map.contains_key(&b.resource) {
                            return Err(MemoryError::AssignmentResourceMissing {
                                pod: pod.clone(),
                                container: name.clone(),
                            });
                        }
                    }
                    reserve(&mut expected, &b.numa_affinity, &b.resource, b.size);
                }
            }
        }
        if !machine_states_equal(&state.machine_state, &expected) {
            return Err(MemoryError::MachineStateDiffers);
        }
        self.state = state;
        Ok(())
    }

    fn pod_reusable(&self, pod_uid: &str, mask: BitMask, resource: &str) -> u64 {
        self.reusable
            .get(pod_uid)
            .and_then(|m| m.get(&mask.to_string()))
            .and_then(|m| m.get(resource))
            .copied()
            .unwrap_or(0)
    }

    /// `updatePodReusableMemory`.
    fn update_pod_reusable(&mut self, pod: &Pod, container: &Container, blocks: &[Block]) {
        let uid = resources::pod_uid(pod).to_owned();
        self.reusable.retain(|k, _| *k == uid);
        if is_regular_init_container(pod, container) {
            let pod_map = self.reusable.entry(uid).or_default();
            for b in blocks {
                let slot = pod_map
                    .entry(mask_of(&b.numa_affinity).to_string())
                    .or_default()
                    .entry(b.resource.clone())
                    .or_insert(0);
                if b.size > *slot {
                    *slot = b.size;
                }
            }
            return;
        }
        for b in blocks {
            let key = mask_of(&b.numa_affinity).to_string();
            if let Some(slot) = self
                .reusable
                .get_mut(&uid)
                .and_then(|m| m.get_mut(&key))
                .and_then(|m| m.get_mut(&b.resource))
                .filter(|v| **v != 0)
            {
                *slot = slot.saturating_sub(b.size);
            }
        }
    }

    /// `calculateHints`: every node set (smallest first) with enough allocatable and free
    /// memory (counting the pod's reusable memory) for all requested types, and not mixing
    /// single- and multi-node allocations; preferred are those of the smallest size that has
    /// enough allocatable memory.
    fn calculate_hints(
        &self,
        state: &NumaNodeMap,
        pod: &Pod,
        requested: &Requested,
    ) -> BTreeMap<String, Vec<TopologyHint>> {
        let nodes: Vec<usize> = state.keys().copied().collect();
        let uid = resources::pod_uid(pod);
        let mut min_affinity_size = nodes.len();
        let mut hints: BTreeMap<String, Vec<TopologyHint>> = BTreeMap::new();
        for mask in iterate_bit_masks(&nodes) {
            let bits = mask.bits();
            let single = bits.len() == 1;
            let sum = |f: fn(&MemoryTable) -> u64, res: &str| {
                bits.iter()
                    .map(|n| f(&table(state, *n, res)))
                    .fold(0u64, u64::saturating_add)
            };
            if requested
                .iter()
                .any(|(res, size)| sum(|t| t.allocatable, res.as_str()) < *size)
            {
                continue;
            }
            min_affinity_size = min_affinity_size.min(mask.count());
            if single
                && bits
                    .first()
                    .and_then(|n| state.get(n))
                    .is_some_and(|s| s.cells.len() > 1)
            {
                continue;
            }
            let conflicting = bits.iter().any(|n| {
                let Some(s) = state.get(n) else { return false };
                !single
                    && s.number_of_assignments > 0
                    && (s.cells.len() == 1 || !groups_equal(&s.cells, &bits))
            });
            if conflicting {
                continue;
            }
            let fits = requested.iter().all(|(res, size)| {
                sum(|t| t.free, res.as_str()).saturating_add(self.pod_reusable(uid, mask, res))
                    >= *size
            });
            if !fits {
                continue;
            }
            for res in requested.keys() {
                hints
                    .entry(res.clone())
                    .or_default()
                    .push(TopologyHint::new(mask, false));
            }
        }
        for list in hints.values_mut() {
            for h in list.iter_mut() {
                h.preferred = h.affinity.is_some_and(|m| m.count() == min_affinity_size);
            }
        }
        hints
    }

    /// `regenerateHints`: the hints of a container already allocated (after a restart).
    fn regenerate_hints(blocks: &[Block], requested: &Requested) -> ProviderHints {
        let mut hints: BTreeMap<String, Vec<TopologyHint>> =
            requested.keys().map(|k| (k.clone(), Vec::new())).collect();
        if blocks.len() != requested.len() {
            return ProviderHints::new();
        }
        for b in blocks {
            if requested.get(&b.resource) != Some(&b.size) {
                return ProviderHints::new();
            }
            let Ok(mask) = BitMask::new(&b.numa_affinity) else {
                return ProviderHints::new();
            };
            hints
                .entry(b.resource.clone())
                .or_default()
                .push(TopologyHint::new(mask, true));
        }
        hints.into_iter().map(|(k, v)| (k, Some(v))).collect()
    }

    /// `GetTopologyHints`: none for a pod that is not Guaranteed or uses pod-level resources
    /// (no preference); the regenerated hints of an allocated container; else
    /// [`Self::calculate_hints`] on the current state.
    #[must_use]
    pub fn topology_hints(&self, pod: &Pod, container: &Container) -> ProviderHints {
        if qos::pod_qos(pod) != QosClass::Guaranteed {
            return ProviderHints::new();
        }
        let Ok(requested) = requested_resources(pod, container) else {
            return ProviderHints::new();
        };
        if pod_level_resources_set(pod) {
            return ProviderHints::new();
        }
        if let Some(blocks) = self.state.blocks(resources::pod_uid(pod), &container.name) {
            return Self::regenerate_hints(blocks, &requested);
        }
        self.calculate_hints(&self.state.machine_state, pod, &requested)
            .into_iter()
            .map(|(k, v)| (k, Some(v)))
            .collect()
    }

    /// `extendTopologyManagerHint`: the best computed hint that contains `mask`.
    fn extend_hint(
        &self,
        state: &NumaNodeMap,
        pod: &Pod,
        requested: &Requested,
        mask: BitMask,
    ) -> Result<TopologyHint, MemoryError> {
        let hints = self.calculate_hints(state, pod, requested);
        let filtered: Vec<TopologyHint> = hints
            .get("memory")
            .into_iter()
            .flatten()
            .filter(|h| h.affinity.is_some_and(|a| a.and(&[mask]) == mask))
            .copied()
            .collect();
        if filtered.is_empty() {
            return Err(MemoryError::NoExtension);
        }
        Ok(find_best_hint(&filtered))
    }

    /// `Allocate` (idempotent): reserves a Guaranteed container's memory and hugepages along
    /// `hint` (the topology manager's merged hint; `TopologyHint::default()` when it has none).
    pub fn allocate(
        &mut self,
        pod: &Pod,
        container: &Container,
        hint: &TopologyHint,
    ) -> Result<(), MemoryError> {
        if qos::pod_qos(pod) != QosClass::Guaranteed || pod_level_resources_set(pod) {
            return Ok(());
        }
        let uid = resources::pod_uid(pod).to_owned();
        if let Some(blocks) = self.state.blocks(&uid, &container.name).cloned() {
            self.update_pod_reusable(pod, container, &blocks);
            return Ok(());
        }
        let requested = requested_resources(pod, container)?;
        let mut machine = self.state.machine_state.clone();
        let mut best = *hint;
        if hint.affinity.is_none() {
            let hints = self.calculate_hints(&machine, pod, &requested);
            if hints.is_empty() {
                return Err(MemoryError::NoDefaultAffinity);
            }
            let default = find_best_hint(hints.get("memory").map_or(&[][..], Vec::as_slice));
            if !default.preferred && best.preferred {
                return Err(MemoryError::NoDefaultPreferredHint);
            }
            best = default;
        }
        let mask = best.affinity.unwrap_or_default();
        if !affinity_satisfies(&machine, mask, &requested) {
            let extended = self.extend_hint(&machine, pod, &requested, mask)?;
            if !extended.preferred && best.preferred {
                return Err(MemoryError::NoExtendedPreferredHint);
            }
            best = extended;
        }
        let mask = best.affinity.unwrap_or_default();
        if violates_numa_allocations(&machine, mask) {
            return Err(MemoryError::ViolatesNumaAllocation);
        }
        let bits = mask.bits();
        let mut blocks = Vec::new();
        for (res, size) in &requested {
            blocks.push(Block {
                numa_affinity: bits.clone(),
                resource: res.clone(),
                size: *size,
            });
            let reusable = self.pod_reusable(&uid, mask, res);
            reserve(&mut machine, &bits, res, size.saturating_sub(reusable));
        }
        self.update_pod_reusable(pod, container, &blocks);
        self.state.machine_state = machine;
        self.state.set_blocks(&uid, &container.name, blocks.clone());
        self.update_init_containers_blocks(pod, container, &blocks);
        Ok(())
    }

    /// `updateInitContainersMemoryBlocks`: the earlier regular init containers' blocks shrink
    /// by what this container reuses, so the pod's blocks sum to what it holds.
    fn update_init_containers_blocks(
        &mut self,
        pod: &Pod,
        container: &Container,
        blocks: &[Block],
    ) {
        let uid = resources::pod_uid(pod).to_owned();
        for cb in blocks {
            let mut size = cb.size;
            for init in resources::init_containers(pod) {
                if init.name == container.name || size == 0 {
                    break;
                }
                if resources::is_sidecar(init) {
                    continue;
                }
                let Some(mut init_blocks) = self.state.blocks(&uid, &init.name).cloned() else {
                    continue;
                };
                if init_blocks.is_empty() {
                    continue;
                }
                for ib in &mut init_blocks {
                    if ib.size == 0
                        || ib.resource != cb.resource
                        || mask_of(&ib.numa_affinity) != mask_of(&cb.numa_affinity)
                    {
                        continue;
                    }
                    if ib.size > size {
                        ib.size -= size;
                        size = 0;
                    } else {
                        size -= ib.size;
                        ib.size = 0;
                    }
                }
                self.state.set_blocks(&uid, &init.name, init_blocks);
            }
        }
    }

    /// `RemoveContainer` (idempotent): gives the container's blocks back to their nodes.
    pub fn remove_container(&mut self, pod_uid: &str, container: &str) {
        let Some(blocks) = self.state.blocks(pod_uid, container).cloned() else {
            return;
        };
        self.state.delete(pod_uid, container);
        let machine = &mut self.state.machine_state;
        for b in &blocks {
            let mut released = b.size;
            for n in &b.numa_affinity {
                let Some(node) = machine.get_mut(n) else {
                    continue;
                };
                node.number_of_assignments = node.number_of_assignments.saturating_sub(1);
                if node.number_of_assignments == 0 {
                    node.cells = vec![*n];
                }
                if released == 0 {
                    continue;
                }
                let Some(t) = node.memory_map.get_mut(&b.resource) else {
                    continue;
                };
                if t.reserved == 0 {
                    continue;
                }
                if t.reserved < released {
                    released -= t.reserved;
                    t.free = t.free.saturating_add(t.reserved);
                    t.reserved = 0;
                    continue;
                }
                t.free = t.free.saturating_add(released);
                t.reserved -= released;
                released = 0;
            }
        }
    }

    /// The manager's `removeStaleState`: removes the containers of the state that are not
    /// among `active` (pod uid -> container names).
    pub fn remove_stale_state(&mut self, active: &BTreeMap<String, BTreeSet<String>>) {
        let stale: Vec<(String, String)> = self
            .state
            .assignments
            .iter()
            .flat_map(|(uid, m)| m.keys().map(move |c| (uid.clone(), c.clone())))
            .filter(|(uid, c)| !active.get(uid).is_some_and(|s| s.contains(c)))
            .collect();
        for (uid, c) in stale {
            self.remove_container(&uid, &c);
        }
    }

    /// `GetMemoryNUMANodes`: the nodes of a container's blocks (its `cpuset.mems`), `None`
    /// when it has no allocation.
    #[must_use]
    pub fn container_numa_nodes(&self, pod_uid: &str, container: &str) -> Option<BTreeSet<usize>> {
        let nodes: BTreeSet<usize> = self
            .state
            .blocks(pod_uid, container)?
            .iter()
            .flat_map(|b| b.numa_affinity.iter().copied())
            .collect();
        (!nodes.is_empty()).then_some(nodes)
    }

    /// `GetAllocatableMemory`: a block per node and resource with allocatable memory.
    #[must_use]
    pub fn allocatable_memory(&self) -> Vec<Block> {
        self.state
            .machine_state
            .iter()
            .flat_map(|(id, node)| {
                node.memory_map
                    .iter()
                    .filter(|(_, t)| t.allocatable != 0)
                    .map(move |(res, t)| Block {
                        numa_affinity: vec![*id],
                        resource: res.clone(),
                        size: t.allocatable,
                    })
            })
            .collect()
    }
}

/// `areMachineStatesEqual`: per node the assignments, the group, and per resource the
/// total, system reserved and allocatable, and the free and reserved summed over the group.
pub(super) fn machine_states_equal(a: &NumaNodeMap, b: &NumaNodeMap) -> bool {
    if a.len() != b.len() {
        return false;
    }
    for (id, n1) in a {
        let Some(n2) = b.get(id) else {
            return false;
        };
        if n1.number_of_assignments != n2.number_of_assignments
            || !groups_equal(&n1.cells, &n2.cells)
            || n1.memory_map.len() != n2.memory_map.len()
        {
            return false;
        }
        for (res, t1) in &n1.memory_map {
            let Some(t2) = n2.memory_map.get(res) else {
                return false;
            };
            if t1.total_mem_size != t2.total_mem_size
                || t1.system_reserved != t2.system_reserved
                || t1.allocatable != t2.allocatable
            {
                return false;
            }
            let sum = |m: &NumaNodeMap, f: fn(&MemoryTable) -> u64| {
                n1.cells
                    .iter()
                    .map(|n| f(&table(m, *n, res)))
                    .fold(0u64, u64::saturating_add)
            };
            if sum(a, |t| t.free) != sum(b, |t| t.free)
                || sum(a, |t| t.reserved) != sum(b, |t| t.reserved)
            {
                return false;
            }
        }
    }
    true
}

impl crate::policy::topology::HintProvider for StaticPolicy {
    fn topology_hints(&self, pod: &Pod, container: &Container) -> ProviderHints {
        Self::topology_hints(self, pod, container)
    }

    fn allocate(
        &mut self,
        pod: &Pod,
        container: &Container,
        hint: &TopologyHint,
    ) -> Result<(), crate::policy::topology::ProviderError> {
        Self::allocate(self, pod, container, hint).map_err(Into::into)
    }
}
