//! The CPU manager's static policy as a topology manager hint provider
//! (`pkg/kubelet/cm/cpumanager/policy_static.go`: `GetTopologyHints`,
//! `generateCPUTopologyHints`, `allocateCPUs` with a NUMA affinity): a hint for every set of
//! NUMA nodes with enough free CPUs, preferred when the set is as small as the smallest set
//! that has enough CPUs at all; the allocation takes CPUs from the hint's nodes first.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{CpuError, CpuSet, StaticPolicy, guaranteed_cpus, take_by_topology};
use crate::policy::{
    resources,
    topology::{BitMask, HintProvider, ProviderHints, TopologyHint, iterate_bit_masks},
};

impl StaticPolicy {
    /// `generateCPUTopologyHints` (without the `align-by-socket` option).
    #[must_use]
    pub fn generate_cpu_topology_hints(
        &self,
        available: &CpuSet,
        reusable: &CpuSet,
        request: usize,
    ) -> Vec<TopologyHint> {
        let nodes = self.topology.numa_nodes();
        let mut min_affinity_size = nodes.len();
        let mut hints = Vec::new();
        let node_of = |c: u32| self.topology.cpus.get(&c).map(|i| i.numa_node);
        for mask in iterate_bit_masks(&nodes) {
            let in_mask = self.topology.cpus_in_numa_nodes(mask).len();
            if in_mask >= request && mask.count() < min_affinity_size {
                min_affinity_size = mask.count();
            }
            if reusable
                .iter()
                .any(|c| !node_of(c).is_some_and(|n| mask.is_set(n)))
            {
                continue;
            }
            let matching = reusable.len()
                + available
                    .iter()
                    .filter(|c| node_of(*c).is_some_and(|n| mask.is_set(n)))
                    .count();
            if matching < request {
                continue;
            }
            hints.push(TopologyHint::new(mask, false));
        }
        for h in &mut hints {
            h.preferred = h.affinity.is_some_and(|m| m.count() == min_affinity_size);
        }
        hints
    }

    /// `GetTopologyHints`: none (no preference) for a container that shares the pool; the
    /// hints of its CPUs when already allocated (no possible placement when their number
    /// differs from the request); else the hints of the assignable CPUs.
    #[must_use]
    pub fn topology_hints(&self, pod: &Pod, container: &Container) -> ProviderHints {
        let requested = guaranteed_cpus(pod, container);
        if requested == 0 {
            return ProviderHints::new();
        }
        let uid = resources::pod_uid(pod);
        let hints = match self
            .state
            .assignments
            .get(uid)
            .and_then(|m| m.get(&container.name))
        {
            Some(allocated) if allocated.len() != requested => Vec::new(),
            Some(allocated) => {
                self.generate_cpu_topology_hints(allocated, &CpuSet::default(), requested)
            }
            None => {
                self.generate_cpu_topology_hints(&self.assignable(), &CpuSet::default(), requested)
            }
        };
        [("cpu".to_owned(), Some(hints))].into()
    }

    /// `Allocate` along a NUMA affinity (`allocateCPUs`): as many CPUs as possible from the
    /// affinity's nodes, the rest from anywhere, each part taken by topology.
    pub fn allocate_aligned(
        &mut self,
        pod: &Pod,
        container: &Container,
        affinity: Option<BitMask>,
    ) -> Result<Option<CpuSet>, CpuError> {
        let n = guaranteed_cpus(pod, container);
        if n == 0 {
            return Ok(None);
        }
        let uid = resources::pod_uid(pod).to_owned();
        if let Some(set) = self
            .state
            .assignments
            .get(&uid)
            .and_then(|m| m.get(&container.name))
        {
            return Ok(Some(set.clone()));
        }
        let allocatable = self.assignable();
        let mut set = CpuSet::default();
        if let Some(mask) = affinity {
            let aligned = allocatable.intersection(&self.topology.cpus_in_numa_nodes(mask));
            let take = n.min(aligned.len());
            set = take_by_topology(&self.topology, &aligned, take)?;
        }
        // The error names what was left to take, as kubelet's does.
        let rest = take_by_topology(
            &self.topology,
            &allocatable.difference(&set),
            n.saturating_sub(set.len()),
        )?;
        let set = set.union(&rest);
        self.state.default_cpu_set = self.state.default_cpu_set.difference(&set);
        self.state
            .assignments
            .entry(uid)
            .or_default()
            .insert(container.name.clone(), set.clone());
        Ok(Some(set))
    }
}

impl HintProvider for StaticPolicy {
    fn topology_hints(&self, pod: &Pod, container: &Container) -> ProviderHints {
        Self::topology_hints(self, pod, container)
    }

    fn allocate(
        &mut self,
        pod: &Pod,
        container: &Container,
        hint: &TopologyHint,
    ) -> Result<(), crate::policy::topology::ProviderError> {
        self.allocate_aligned(pod, container, hint.affinity)
            .map(|_| ())
            .map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    //! After policy_static_test.go `TestTopologyHints`-style cases on a two-node machine.
    use super::*;
    use crate::policy::{
        cpu::{Topology, cpuset::set},
        resources::test_pods::{container, pod},
    };

    fn mask(bits: &[usize]) -> BitMask {
        BitMask::new(bits).unwrap()
    }

    /// `topology_hints_test.go` `TestGetTopologyHints` (`returnTestCases`): 2 sockets = 2
    /// NUMA nodes x 3 cores x 2 threads (node 0 = cpus 0-2,6-8), no reserved CPUs.
    #[test]
    fn get_topology_hints_table() {
        let first = mask(&[0]);
        let second = mask(&[1]);
        let cross = mask(&[0, 1]);
        let h = TopologyHint::new;
        // (name, cpus requested, shared pool, already allocated, hints)
        type Case = (
            &'static str,
            usize,
            &'static str,
            Option<&'static str>,
            Vec<TopologyHint>,
        );
        let cases: Vec<Case> = vec![
            (
                "Request 2 CPUs, 4 available on NUMA 0, 6 available on NUMA 1",
                2,
                "2-11",
                None,
                vec![h(first, true), h(second, true), h(cross, false)],
            ),
            (
                "Request 5 CPUs, 4 available on NUMA 0, 6 available on NUMA 1",
                5,
                "2-11",
                None,
                vec![h(second, true), h(cross, false)],
            ),
            (
                "Request 7 CPUs, 4 available on NUMA 0, 6 available on NUMA 1",
                7,
                "2-11",
                None,
                vec![h(cross, true)],
            ),
            (
                "Request 11 CPUs, 4 available on NUMA 0, 6 available on NUMA 1",
                11,
                "2-11",
                None,
                vec![],
            ),
            (
                "Request 2 CPUs, 1 available on NUMA 0, 1 available on NUMA 1",
                2,
                "0,3",
                None,
                vec![h(cross, false)],
            ),
            ("Request more CPUs than available", 5, "0-3", None, vec![]),
            (
                "Regenerate Single-Node NUMA Hints if already allocated 1/2",
                2,
                "",
                Some("0,6"),
                vec![h(first, true), h(cross, false)],
            ),
            (
                "Regenerate Single-Node NUMA Hints if already allocated 2/2",
                2,
                "",
                Some("3,9"),
                vec![h(second, true), h(cross, false)],
            ),
            (
                "Regenerate Cross-NUMA Hints if already allocated",
                11,
                "",
                Some("0-10"),
                vec![h(cross, true)],
            ),
            (
                "Requested less than already allocated",
                2,
                "",
                Some("0,3,6,9"),
                vec![],
            ),
            (
                "Requested more than already allocated",
                11,
                "",
                Some("0,3,6,9"),
                vec![],
            ),
        ];
        for (name, cpus, default, allocated, want) in cases {
            let r = format!("cpu={cpus},memory=1G");
            let p = pod("fakePod", vec![container("fakeContainer", &r, &r)]);
            let c = p.spec.as_ref().unwrap().containers[0].clone();
            let mut assignments = std::collections::BTreeMap::new();
            if let Some(a) = allocated {
                assignments.insert(
                    "uid-fakePod".to_owned(),
                    [("fakeContainer".to_owned(), set(a))].into(),
                );
            }
            let policy = StaticPolicy {
                topology: Topology::uniform(2, 3, 2),
                reserved: CpuSet::default(),
                state: crate::policy::cpu::CpuState {
                    default_cpu_set: set(default),
                    assignments,
                },
            };
            let got = policy.topology_hints(&p, &c);
            assert_eq!(got["cpu"].as_ref(), Some(&want), "{name}");
        }
    }

    #[test]
    fn hints_and_aligned_allocation() {
        // 2 sockets = 2 NUMA nodes x 2 cores x 2 threads: node 0 = cpus 0,1,4,5.
        let topo = Topology::uniform(2, 2, 2);
        let mut p = StaticPolicy::new(topo, Some(&set("0")), 0, None).unwrap();
        let g = |n: &str, cpus: u32| {
            let r = format!("cpu={cpus},memory=1Gi");
            pod(n, vec![container("c", &r, &r)])
        };
        let two = g("two", 2);
        let c = two.spec.as_ref().unwrap().containers[0].clone();
        let h = p.topology_hints(&two, &c);
        assert_eq!(
            h["cpu"],
            Some(vec![
                TopologyHint::new(mask(&[0]), true),
                TopologyHint::new(mask(&[1]), true),
                TopologyHint::new(mask(&[0, 1]), false),
            ])
        );
        // Aligned on node 1: CPUs of node 1 only.
        let got = p.allocate_aligned(&two, &c, Some(mask(&[1]))).unwrap();
        assert_eq!(got, Some(set("2,6")));
        // Already allocated: the hints of its CPUs.
        assert_eq!(
            p.topology_hints(&two, &c)["cpu"],
            Some(vec![
                TopologyHint::new(mask(&[1]), true),
                TopologyHint::new(mask(&[0, 1]), false),
            ])
        );
        // Four CPUs: node 0 has three free (1,4,5), node 1 two: only both nodes fit, and
        // that is not the smallest set with four CPUs.
        let four = g("four", 4);
        let c4 = four.spec.as_ref().unwrap().containers[0].clone();
        assert_eq!(
            p.topology_hints(&four, &c4)["cpu"],
            Some(vec![TopologyHint::new(mask(&[0, 1]), false)])
        );
        // Aligned on node 1 but it has only two free: those, then a whole core elsewhere.
        assert_eq!(
            p.allocate_aligned(&four, &c4, Some(mask(&[1]))).unwrap(),
            Some(set("1,3,5,7"))
        );
        // A shared-pool container has no preference.
        let bu = pod("bu", vec![container("c", "cpu=1", "")]);
        assert!(
            p.topology_hints(&bu, &bu.spec.as_ref().unwrap().containers[0])
                .is_empty()
        );
    }
}
