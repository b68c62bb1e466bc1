//! The machine's CPU topology, after kubelet's `pkg/kubelet/cm/cpumanager/topology`
//! (`topology.go`: `CPUTopology`, `CPUDetails`, `CPUInfo`): for each online CPU, its socket
//! and its core (numbered uniquely across sockets), and the grouping by socket and core the
//! assignment uses. Built from ids the caller read ([`crate::node::cpu_topology`] reads sysfs
//! where kubelet asks cAdvisor), or as a uniform machine for tests and `enforcer explain`.

use std::collections::{BTreeMap, BTreeSet};

use super::CpuSet;

/// Where one CPU sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuInfo {
    /// Socket (physical package).
    pub socket: u32,
    /// Core, unique across sockets.
    pub core: u32,
    /// NUMA node (0 on a machine without NUMA nodes in sysfs).
    pub numa_node: usize,
}

/// The machine's CPU topology.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    /// CPU id -> place.
    pub cpus: BTreeMap<u32, CpuInfo>,
}

impl Topology {
    /// A uniform machine numbered as Linux usually does: thread `t` of core `c` of socket `s`
    /// is CPU `t * sockets * cores + s * cores + c`.
    #[must_use]
    pub fn uniform(sockets: u32, cores_per_socket: u32, threads_per_core: u32) -> Self {
        let mut cpus = BTreeMap::new();
        for t in 0..threads_per_core {
            for s in 0..sockets {
                for c in 0..cores_per_socket {
                    cpus.insert(
                        t * sockets * cores_per_socket + s * cores_per_socket + c,
                        CpuInfo {
                            socket: s,
                            core: s * cores_per_socket + c,
                            numa_node: s as usize,
                        },
                    );
                }
            }
        }
        Self { cpus }
    }

    /// The topology from each online CPU's `(cpu, physical_package_id, core_id)`, as the
    /// node reads them from sysfs ([`crate::node::cpu_topology`]).
    #[must_use]
    pub fn from_ids(raw: impl IntoIterator<Item = (u32, u32, u32)>) -> Self {
        // core_id repeats across sockets: number (socket, core_id) pairs globally.
        let mut ids = BTreeMap::new();
        let mut cpus = BTreeMap::new();
        for (cpu, socket, core_id) in raw {
            let next = u32::try_from(ids.len()).unwrap_or(u32::MAX);
            let core = *ids.entry((socket, core_id)).or_insert(next);
            cpus.insert(
                cpu,
                CpuInfo {
                    socket,
                    core,
                    numa_node: 0,
                },
            );
        }
        Self { cpus }
    }

    /// The NUMA node of each CPU (CPU id -> node, from
    /// [`crate::policy::topology::NumaTopology::cpu_nodes`]); CPUs not listed keep theirs.
    #[must_use]
    pub fn with_numa_nodes(mut self, nodes: &BTreeMap<u32, usize>) -> Self {
        for (cpu, info) in &mut self.cpus {
            if let Some(n) = nodes.get(cpu) {
                info.numa_node = *n;
            }
        }
        self
    }

    /// The NUMA nodes of the CPUs, ascending (`CPUDetails.NUMANodes()`).
    #[must_use]
    pub fn numa_nodes(&self) -> Vec<usize> {
        let set: BTreeSet<usize> = self.cpus.values().map(|c| c.numa_node).collect();
        set.into_iter().collect()
    }

    /// The CPUs on the NUMA nodes of `mask` (`CPUsInNUMANodes`).
    #[must_use]
    pub fn cpus_in_numa_nodes(&self, mask: crate::policy::topology::BitMask) -> CpuSet {
        self.cpus
            .iter()
            .filter(|(_, i)| mask.is_set(i.numa_node))
            .map(|(c, _)| *c)
            .collect()
    }

    /// All CPUs.
    #[must_use]
    pub fn all(&self) -> CpuSet {
        self.cpus.keys().copied().collect()
    }

    pub(super) fn cpus_per_socket(&self) -> usize {
        let sockets: BTreeSet<u32> = self.cpus.values().map(|c| c.socket).collect();
        self.cpus.len() / sockets.len().max(1)
    }

    pub(super) fn threads_per_core(&self) -> usize {
        let cores: BTreeSet<u32> = self.cpus.values().map(|c| c.core).collect();
        self.cpus.len() / cores.len().max(1)
    }

    pub(super) fn group(
        &self,
        set: &CpuSet,
        key: impl Fn(&CpuInfo) -> u32,
    ) -> BTreeMap<u32, CpuSet> {
        let mut out: BTreeMap<u32, CpuSet> = BTreeMap::new();
        for cpu in set.iter() {
            if let Some(info) = self.cpus.get(&cpu) {
                out.entry(key(info)).or_default().0.insert(cpu);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::cpu::cpuset::set;

    #[test]
    fn topology_from_ids_numbers_cores_across_sockets() {
        let topo = Topology::from_ids([(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]);
        assert_eq!(
            topo.cpus[&2],
            CpuInfo {
                socket: 1,
                core: 2,
                numa_node: 0
            }
        );
        assert_eq!(topo.all(), set("0-3"));
    }
}
