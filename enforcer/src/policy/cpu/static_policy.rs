//! Kubelet's CPU manager static policy (`pkg/kubelet/cm/cpumanager/policy_static.go`):
//! the reserved CPUs (`reservedSystemCPUs`, or the reserved millicores rounded up and taken
//! by topology), the start from a checkpoint (refused when another policy wrote it or its
//! CPUs do not match the machine), `Allocate` of exclusive CPUs to a Guaranteed pod's
//! containers with a whole number of CPUs (`guaranteedCPUs`), `RemoveContainer`, and the
//! cpuset each container runs on.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{Checkpoint, CpuError, CpuSet, CpuState, Topology, take_by_topology};
use crate::policy::{
    qos::{self, QosClass},
    resources,
};

/// The static policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPolicy {
    pub(super) topology: Topology,
    pub(super) reserved: CpuSet,
    pub(super) state: CpuState,
}

/// The exclusive CPUs a container needs: a whole number of CPUs in a Guaranteed pod, else 0.
#[must_use]
pub fn guaranteed_cpus(pod: &Pod, container: &Container) -> usize {
    if qos::pod_qos(pod) != QosClass::Guaranteed {
        return 0;
    }
    let milli = resources::container_requests(container)
        .get("cpu")
        .map_or(0, crate::quantity::Quantity::milli_value);
    if milli <= 0 || milli % 1000 != 0 {
        return 0;
    }
    usize::try_from(milli / 1000).unwrap_or(0)
}

impl StaticPolicy {
    /// A new policy. `reserved_system_cpus` wins; otherwise `ceil(reserved millicores / 1000)`
    /// CPUs are taken by topology. `checkpoint`, when present, must be a static one.
    pub fn new(
        topology: Topology,
        reserved_system_cpus: Option<&CpuSet>,
        reserved_milli_cpu: i64,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<Self, CpuError> {
        let all = topology.all();
        let reserved = match reserved_system_cpus.filter(|s| !s.is_empty()) {
            Some(r) => {
                if !r.is_subset(&all) {
                    return Err(CpuError::ReservedOutside(r.to_string()));
                }
                r.clone()
            }
            None => {
                let n =
                    usize::try_from((reserved_milli_cpu.max(0) + 999) / 1000).unwrap_or(usize::MAX);
                if n == 0 {
                    return Err(CpuError::NoReservedCpus);
                }
                take_by_topology(&topology, &all, n)?
            }
        };
        let state = match checkpoint {
            Some(cp) => {
                if cp.policy_name != "static" {
                    return Err(CpuError::PolicyChanged {
                        configured: "static".into(),
                        checkpoint: cp.policy_name.clone(),
                    });
                }
                let state = cp.to_state()?;
                let mut union = state.default_cpu_set.clone();
                for c in state.assignments.values().flat_map(BTreeMap::values) {
                    union = union.union(c);
                }
                if !state.default_cpu_set.is_empty() && union != all {
                    return Err(CpuError::Checkpoint(format!(
                        "current set of available CPUs {all} does not match with CPUs in state {union}"
                    )));
                }
                if state.default_cpu_set.is_empty() {
                    CpuState {
                        default_cpu_set: all,
                        ..state
                    }
                } else {
                    state
                }
            }
            None => CpuState {
                default_cpu_set: all,
                assignments: BTreeMap::new(),
            },
        };
        Ok(Self {
            topology,
            reserved,
            state,
        })
    }

    /// The reserved CPUs.
    #[must_use]
    pub fn reserved(&self) -> &CpuSet {
        &self.reserved
    }

    /// The state.
    #[must_use]
    pub fn state(&self) -> &CpuState {
        &self.state
    }

    /// CPUs that can still be given exclusively.
    #[must_use]
    pub fn assignable(&self) -> CpuSet {
        self.state.default_cpu_set.difference(&self.reserved)
    }

    /// `Allocate`: exclusive CPUs for a Guaranteed integer-CPU container (idempotent), or
    /// `None` for a container that shares the pool; without a NUMA affinity (see
    /// [`Self::allocate_aligned`]).
    pub fn allocate(
        &mut self,
        pod: &Pod,
        container: &Container,
    ) -> Result<Option<CpuSet>, CpuError> {
        self.allocate_aligned(pod, container, None)
    }

    /// `RemoveContainer`: gives the container's CPUs back to the shared pool.
    pub fn release(&mut self, pod_uid: &str, container: &str) {
        if let Some(m) = self.state.assignments.get_mut(pod_uid) {
            if let Some(set) = m.remove(container) {
                self.state.default_cpu_set = self.state.default_cpu_set.union(&set);
            }
            if m.is_empty() {
                self.state.assignments.remove(pod_uid);
            }
        }
    }

    /// The cpuset a container runs on: its exclusive CPUs, or the shared pool.
    #[must_use]
    pub fn container_cpus(&self, pod_uid: &str, container: &str) -> CpuSet {
        self.state
            .assignments
            .get(pod_uid)
            .and_then(|m| m.get(container))
            .cloned()
            .unwrap_or_else(|| self.state.default_cpu_set.clone())
    }

    /// The checkpoint of the current state.
    #[must_use]
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint::from_state("static", &self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{
        cpu::cpuset::set,
        resources::test_pods::{container, pod},
    };

    #[test]
    fn static_policy_allocate_release_checkpoint() {
        let topo = Topology::uniform(1, 4, 2); // cpus 0-7, core c = {c, c+4}
        assert_eq!(
            StaticPolicy::new(topo.clone(), None, 0, None),
            Err(CpuError::NoReservedCpus)
        );
        let mut p = StaticPolicy::new(topo.clone(), None, 1000, None).unwrap();
        assert_eq!(p.reserved(), &set("0"));
        let g = pod(
            "g",
            vec![
                container("a", "cpu=2,memory=1Gi", "cpu=2,memory=1Gi"),
                container("b", "cpu=500m,memory=1Gi", "cpu=500m,memory=1Gi"),
            ],
        );
        let a = g.spec.as_ref().unwrap().containers[0].clone();
        let b = g.spec.as_ref().unwrap().containers[1].clone();
        assert_eq!(p.allocate(&g, &a).unwrap(), Some(set("1,5")));
        assert_eq!(p.allocate(&g, &a).unwrap(), Some(set("1,5")));
        assert_eq!(p.allocate(&g, &b).unwrap(), None);
        assert_eq!(p.container_cpus("uid-g", "b"), set("0,2-4,6-7"));
        let burst = pod("bu", vec![container("a", "cpu=2", "")]);
        assert_eq!(
            p.allocate(&burst, &burst.spec.as_ref().unwrap().containers[0])
                .unwrap(),
            None
        );
        let big = pod(
            "big",
            vec![container("a", "cpu=6,memory=1Gi", "cpu=6,memory=1Gi")],
        );
        let err = p
            .allocate(&big, &big.spec.as_ref().unwrap().containers[0])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "not enough cpus available to satisfy request: requested=6, available=5"
        );

        let cp = p.checkpoint();
        assert_eq!(cp.default_cpu_set, "0,2-4,6-7");
        let json = cp.to_json();
        assert!(json.starts_with(r#"{"policyName":"static","defaultCpuSet":"0,2-4,6-7","entries":{"uid-g":{"a":"1,5"}},"checksum":"#), "{json}");
        let back = Checkpoint::from_json(&json).unwrap();
        assert_eq!(back, cp);
        let restored = StaticPolicy::new(topo.clone(), None, 1000, Some(&back)).unwrap();
        assert_eq!(restored.state(), p.state());
        // tampering is detected
        assert!(Checkpoint::from_json(&json.replace("0,2-4,6-7", "0,2-4,6")).is_err());
        // a policy change refuses to start
        let none = Checkpoint {
            policy_name: "none".into(),
            default_cpu_set: String::new(),
            entries: None,
            checksum: 0,
        };
        assert!(matches!(
            StaticPolicy::new(topo, None, 1000, Some(&none)),
            Err(CpuError::PolicyChanged { .. })
        ));

        p.release("uid-g", "a");
        assert_eq!(p.state().default_cpu_set, set("0-7"));
        assert!(p.state().assignments.is_empty());
    }
}
