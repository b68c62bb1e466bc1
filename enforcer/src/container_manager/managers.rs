//! The memory manager and the topology manager beside the CPU manager (kubelet's
//! `containerManagerImpl` with `memorymanager` and `topologymanager`): started from the
//! configuration, the NUMA cells read from sysfs and `<stateDir>/memory_manager_state`; at
//! admission the topology manager merges the CPU and memory managers' hints per container and
//! both allocate along the merged hint (a refusal fails the pod with kubelet's reason); the
//! memory manager's NUMA nodes become the container's `cpuset.mems`.

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
};

use k8s_openapi::api::core::v1::Pod;

use super::{EnforceError, Enforcer};
use crate::{
    config::Config,
    policy::{
        admission::node_allocatable,
        cpu::CpuSet,
        eviction::manager::AdmitResult,
        memory::{self, Checkpoint, MemoryError, MemoryManagerPolicy, StaticPolicy},
        resources::{self, ResourceList},
        topology::{
            self, HintProvider, NumaCell, NumaTopology, Policy as TopologyPolicy, Scope,
            TopologyError,
        },
    },
    quantity::{Format, Quantity},
};

/// The memory manager's static policy with its checkpoint file.
#[derive(Debug)]
pub(crate) struct MemoryManager {
    policy: StaticPolicy,
    checkpoint: PathBuf,
}

impl MemoryManager {
    fn save(&self) {
        let text = self.policy.checkpoint().to_json();
        let tmp = self.checkpoint.with_extension("tmp");
        let r = std::fs::write(&tmp, &text).and_then(|()| std::fs::rename(&tmp, &self.checkpoint));
        if let Err(e) = r {
            tracing::warn!(path = %self.checkpoint.display(), error = %e, "writing the memory manager checkpoint");
        }
    }
}

/// The topology manager: its policy and the machine's NUMA nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopologyManager {
    pub(crate) policy: TopologyPolicy,
    pub(crate) numa_nodes: Vec<usize>,
}

impl Default for TopologyManager {
    fn default() -> Self {
        Self {
            policy: TopologyPolicy::None,
            numa_nodes: vec![0],
        }
    }
}

/// The machine's NUMA cells, or one cell with the node's memory and CPUs where sysfs has no
/// NUMA nodes (cAdvisor's single-node machine).
pub(crate) fn numa_or_single(
    read: Result<NumaTopology, TopologyError>,
    memory: u64,
    cpus: CpuSet,
) -> Result<NumaTopology, TopologyError> {
    let t = read?;
    if !t.cells.is_empty() {
        return Ok(t);
    }
    Ok(NumaTopology {
        cells: vec![NumaCell {
            id: 0,
            memory,
            hugepages: Vec::new(),
            cpus,
        }],
    })
}

fn read_checkpoint(path: &Path) -> Result<Option<Checkpoint>, EnforceError> {
    let err = |source| EnforceError::MemoryManager {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => Checkpoint::from_json(&text).map(Some).map_err(err),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(EnforceError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Starts the memory manager (`NewManager`, then `Start`): `None` for the `None` policy
/// (which refuses a checkpoint of another policy); the static policy validates
/// `reservedMemory` against node allocatable's reservation of `capacity` (its hugepages
/// added from the cells), restores the checkpoint and checks it against the machine.
pub(crate) fn start_memory_manager(
    config: &Config,
    numa: &NumaTopology,
    capacity: &ResourceList,
    state_dir: &Path,
) -> Result<Option<MemoryManager>, EnforceError> {
    let path = state_dir.join(memory::STATE_FILE);
    let err = |source| EnforceError::MemoryManager {
        path: path.clone(),
        source,
    };
    let name = config.memory_manager_policy.name();
    let checkpoint = read_checkpoint(&path)?;
    if let Some(cp) = checkpoint.as_ref().filter(|cp| cp.policy_name != name) {
        return Err(err(MemoryError::PolicyChanged {
            configured: name.to_owned(),
            checkpoint: cp.policy_name.clone(),
        }));
    }
    if config.memory_manager_policy == MemoryManagerPolicy::None {
        return Ok(None);
    }
    // The hugepages pools summed over the cells, where the node's capacity (the machine's
    // pools, `node::hugepages`) does not already name them.
    let mut pools = ResourceList::new();
    for cell in &numa.cells {
        for hp in &cell.hugepages {
            let bytes = i64::try_from(hp.total_bytes()).unwrap_or(i64::MAX);
            let q = Quantity::from_int(bytes, Format::BinarySI);
            pools
                .entry(hp.resource_name())
                .and_modify(|v| *v = v.saturating_add(q))
                .or_insert(q);
        }
    }
    let mut capacity = capacity.clone();
    for (name, q) in pools {
        capacity.entry(name).or_insert(q);
    }
    let reservation = node_allocatable::reservation(
        &capacity,
        &config.system_reserved,
        &config.kube_reserved,
        &config.hard_eviction_thresholds,
    );
    let nodes = numa.node_ids();
    let reserved = memory::system_reserved_memory(&nodes, &reservation, &config.reserved_memory)
        .map_err(err)?;
    let mut policy = StaticPolicy::new(numa.clone(), reserved).map_err(err)?;
    let state = match &checkpoint {
        Some(cp) => cp.to_state(name).map_err(err)?,
        None => memory::MemoryState::default(),
    };
    policy.start(state).map_err(err)?;
    std::fs::create_dir_all(state_dir).map_err(|source| EnforceError::Io {
        path: state_dir.to_path_buf(),
        source,
    })?;
    let m = MemoryManager {
        policy,
        checkpoint: path,
    };
    m.save();
    tracing::info!(numa_nodes = ?nodes, "memory manager static policy started");
    Ok(Some(m))
}

impl Enforcer {
    /// Adds the memory and topology managers from the configuration (`memoryManagerPolicy`,
    /// `reservedMemory`, `topologyManagerPolicy`, `topologyManagerScope`), on the NUMA cells
    /// of `numa` and the node's `capacity`. Refuses what kubelet refuses (a policy change
    /// against the checkpoint, reservations that do not add up, more than 8 NUMA nodes under
    /// a topology policy) and the `pod` scope, which is not implemented.
    pub fn with_resource_managers(
        mut self,
        config: &Config,
        numa: &NumaTopology,
        capacity: &ResourceList,
    ) -> Result<Self, EnforceError> {
        let policy = config.topology_manager_policy;
        let numa_nodes = numa.node_ids();
        topology::check_numa_node_count(policy, numa_nodes.len())
            .map_err(EnforceError::TopologyManager)?;
        if policy != TopologyPolicy::None && config.topology_manager_scope == Scope::Pod {
            return Err(EnforceError::TopologyManager(TopologyError::UnknownScope(
                "pod (not implemented by the enforcer; use container)".into(),
            )));
        }
        self.topology = TopologyManager {
            policy,
            numa_nodes: if numa_nodes.is_empty() {
                vec![0]
            } else {
                numa_nodes
            },
        };
        self.memory = start_memory_manager(config, numa, capacity, &config.enforcer.state_dir)?
            .map(Mutex::new);
        Ok(self)
    }

    /// kubelet's resource allocation admission (the topology manager's `Admit` over the CPU
    /// and memory managers): every container's exclusive CPUs and NUMA memory allocated
    /// along the merged hint, or the pod refused (`TopologyAffinityError`,
    /// `UnexpectedAdmissionError`). The checkpoints are written.
    pub fn admit_resources(&self, pod: &Pod) -> AdmitResult {
        if self.cpu.is_none() && self.memory.is_none() {
            return AdmitResult::admit();
        }
        let mut defaulted = pod.clone();
        resources::apply_defaults(&mut defaulted);
        let mut cpu = self.cpu.as_ref().map(crate::locks::lock);
        let mut mem = self.memory.as_ref().map(crate::locks::lock);
        let mut providers: Vec<&mut dyn HintProvider> = Vec::new();
        if let Some(c) = cpu.as_deref_mut() {
            providers.push(&mut c.policy);
        }
        if let Some(m) = mem.as_deref_mut() {
            providers.push(&mut m.policy);
        }
        let r = topology::admit_container_scope(
            self.topology.policy,
            &self.topology.numa_nodes,
            &mut providers,
            &defaulted,
        );
        drop(providers);
        if let Some(c) = cpu.as_deref() {
            c.save();
        }
        if let Some(m) = mem.as_deref() {
            m.save();
        }
        let uid = resources::pod_uid(&defaulted);
        for (container, hint) in &r.hints {
            tracing::debug!(uid, container = %container, hint = %hint, "topology affinity");
        }
        if !r.result.admitted {
            tracing::info!(uid, reason = %r.result.reason, message = %r.result.message, "resource allocation refused");
        }
        r.result
    }

    /// Gives a terminated (or refused) pod's exclusive CPUs and NUMA memory back.
    pub fn release_resources(&self, uid: &str) {
        self.release_cpus(uid);
        let Some(mem) = &self.memory else { return };
        let mut m = crate::locks::lock(mem);
        let names: Vec<String> = m
            .policy
            .state()
            .assignments
            .get(uid)
            .map(|a| a.keys().cloned().collect())
            .unwrap_or_default();
        for n in &names {
            m.policy.remove_container(uid, n);
        }
        if !names.is_empty() {
            tracing::info!(uid, "numa memory released");
            m.save();
        }
    }

    /// The container's `cpuset.mems` (kubelet's `PreCreateContainer`): the NUMA nodes of its
    /// memory manager allocation, `None` without one.
    #[must_use]
    pub fn cpuset_mems(&self, uid: &str, container: &str) -> Option<String> {
        let m = crate::locks::lock(self.memory.as_ref()?);
        let nodes = m.policy.container_numa_nodes(uid, container)?;
        let list: Vec<String> = nodes.iter().map(ToString::to_string).collect();
        Some(list.join(","))
    }

    /// Whether the memory manager's static policy is on.
    #[must_use]
    pub fn memory_manager_enabled(&self) -> bool {
        self.memory.is_some()
    }
}

/// The machine's NUMA cells for the managers: sysfs' (`<sys>/devices/system/node`), or one
/// cell of the node's memory and CPUs.
pub fn numa_topology(sys: &Path, capacity: &ResourceList) -> Result<NumaTopology, TopologyError> {
    let memory = capacity
        .get("memory")
        .map_or(0, |q| u64::try_from(q.value()).unwrap_or(0));
    let cpus = crate::node::cpu_topology(sys)
        .map(|t| t.all())
        .unwrap_or_default();
    numa_or_single(crate::node::numa_topology(sys), memory, cpus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::resources::test_pods::{container, pod};

    fn config(yaml: &str, state_dir: &Path) -> Config {
        let doc = crate::config::parse_document("t.yaml", yaml).unwrap().0;
        let mut c = crate::config::resolve("t.yaml", &doc, &crate::config::ConfigArgs::default())
            .unwrap()
            .config;
        c.enforcer.state_dir = state_dir.to_path_buf();
        c
    }

    fn two_cells() -> NumaTopology {
        NumaTopology {
            cells: (0..2)
                .map(|id| NumaCell {
                    id,
                    memory: 4 << 30,
                    hugepages: vec![],
                    cpus: CpuSet::default(),
                })
                .collect(),
        }
    }

    #[test]
    fn memory_manager_start_admit_release() {
        let dir = tempfile::tempdir().unwrap();
        let capacity: ResourceList =
            [("memory".to_owned(), Quantity::parse("8Gi").unwrap())].into();
        // kube-reserved 900Mi + the default hard memory.available 100Mi = 1000Mi.
        let good = "kubeReserved: {memory: 900Mi}\nmemoryManagerPolicy: Static\ntopologyManagerPolicy: single-numa-node\nreservedMemory: [{numaNode: 0, limits: {memory: 500Mi}}, {numaNode: 1, limits: {memory: 500Mi}}]\n";
        let e = Enforcer::default()
            .with_resource_managers(&config(good, dir.path()), &two_cells(), &capacity)
            .unwrap();
        assert!(e.memory_manager_enabled());
        let text = std::fs::read_to_string(dir.path().join(memory::STATE_FILE)).unwrap();
        assert!(
            text.starts_with(r#"{"policyName":"Static","machineState":{"0":"#),
            "{text}"
        );
        // A Guaranteed pod fitting one node gets it.
        let g = |name: &str, mem: &str| {
            let r = format!("cpu=1,memory={mem}");
            pod(name, vec![container("c", &r, &r)])
        };
        assert!(e.admit_resources(&g("a", "3Gi")).admitted);
        assert_eq!(e.cpuset_mems("uid-a", "c").as_deref(), Some("0"));
        // 5Gi: node 0 serves a single-node allocation, so no node set fits: no hints (no
        // preference), then no default affinity at Allocate, as in kubelet.
        let r = e.admit_resources(&g("b", "5Gi"));
        assert_eq!(r.reason, "UnexpectedAdmissionError");
        assert_eq!(
            r.message,
            "Allocate failed due to [memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available, which is unexpected"
        );
        // A Burstable pod has no allocation.
        let bu = pod("bu", vec![container("c", "memory=1Gi", "")]);
        assert!(e.admit_resources(&bu).admitted);
        assert_eq!(e.cpuset_mems("uid-bu", "c"), None);
        e.release_resources("uid-a");
        assert_eq!(e.cpuset_mems("uid-a", "c"), None);
        // Now 5Gi fits both nodes together only: single-numa-node refuses it.
        let r = e.admit_resources(&g("c", "5Gi"));
        assert_eq!(r.reason, "TopologyAffinityError");
        assert_eq!(
            r.message,
            "Resources cannot be allocated with Topology Locality"
        );
        // Reservations that do not add up refuse to start, with kubelet's text.
        let bad = good.replace("500Mi}}]", "400Mi}}]");
        let err = Enforcer::default()
            .with_resource_managers(&config(&bad, dir.path()), &two_cells(), &capacity)
            .unwrap_err()
            .to_string();
        assert!(err.contains(r#"the total amount "900Mi" of type "memory" is not equal to the value "1000Mi" determined by Node Allocatable feature"#), "{err}");
        // A policy change against the checkpoint refuses to start.
        let none = "memoryManagerPolicy: None\n";
        let err = Enforcer::default()
            .with_resource_managers(&config(none, dir.path()), &two_cells(), &capacity)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                r#"configured policy "None" differs from state checkpoint policy "Static""#
            ),
            "{err}"
        );
        // The pod scope is refused.
        let pod_scope = format!("{good}topologyManagerScope: pod\n");
        assert!(
            Enforcer::default()
                .with_resource_managers(&config(&pod_scope, dir.path()), &two_cells(), &capacity)
                .is_err()
        );
    }

    #[test]
    fn single_cell_without_numa_in_sysfs() {
        let t = numa_or_single(
            Ok(NumaTopology::default()),
            1 << 30,
            CpuSet::parse("0-3").unwrap(),
        )
        .unwrap();
        assert_eq!(t.node_ids(), vec![0]);
        assert_eq!(t.cells[0].memory, 1 << 30);
    }
}
