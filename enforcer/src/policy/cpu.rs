//! The CPU manager's static policy (`pkg/kubelet/cm/cpumanager`: `policy_static.go`,
//! `cpu_assignment.go`, `state/checkpoint.go`).
//!
//! Guaranteed pods' containers with a whole number of CPUs get exclusive CPUs, taken by
//! topology (whole sockets, then whole cores, then single threads, preferring already partly
//! used sockets and cores); everything else runs on the shared (default) pool, which keeps the
//! reserved CPUs. The state is checkpointed in kubelet's JSON format with its checksum. The
//! policy does no I/O: the topology is read by the caller ([`crate::node::cpu_topology`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::{Deserialize, Serialize};

use super::{
    qos::{self, QosClass},
    resources,
};

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

/// A set of CPU ids, printed as kubelet does (`0-3,8,10-11`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet(BTreeSet<u32>);

impl CpuSet {
    /// Parses `0-3,8` (the empty string is the empty set).
    pub fn parse(s: &str) -> Result<Self, CpuError> {
        let mut set = BTreeSet::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let a: u32 = a
                .trim()
                .parse()
                .map_err(|_| CpuError::CpuSet(s.to_owned()))?;
            let b: u32 = b
                .trim()
                .parse()
                .map_err(|_| CpuError::CpuSet(s.to_owned()))?;
            if a > b || b - a > 65_536 {
                return Err(CpuError::CpuSet(s.to_owned()));
            }
            set.extend(a..=b);
        }
        Ok(Self(set))
    }

    /// The ids.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// Number of CPUs.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Membership.
    #[must_use]
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    /// `self ∪ other`.
    #[must_use]
    pub fn union(&self, other: &Self) -> Self {
        Self(self.0.union(&other.0).copied().collect())
    }

    /// `self \ other`.
    #[must_use]
    pub fn difference(&self, other: &Self) -> Self {
        Self(self.0.difference(&other.0).copied().collect())
    }

    /// `self ⊆ other`.
    #[must_use]
    pub fn is_subset(&self, other: &Self) -> bool {
        self.0.is_subset(&other.0)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.0.iter().copied().peekable();
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?
            } else {
                write!(f, "{start}-{end}")?
            }
        }
        Ok(())
    }
}

/// Where one CPU sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuInfo {
    /// Socket (physical package).
    pub socket: u32,
    /// Core, unique across sockets.
    pub core: u32,
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
            cpus.insert(cpu, CpuInfo { socket, core });
        }
        Self { cpus }
    }

    /// All CPUs.
    #[must_use]
    pub fn all(&self) -> CpuSet {
        self.cpus.keys().copied().collect()
    }

    fn cpus_per_socket(&self) -> usize {
        let sockets: BTreeSet<u32> = self.cpus.values().map(|c| c.socket).collect();
        self.cpus.len() / sockets.len().max(1)
    }

    fn threads_per_core(&self) -> usize {
        let cores: BTreeSet<u32> = self.cpus.values().map(|c| c.core).collect();
        self.cpus.len() / cores.len().max(1)
    }

    fn group(&self, set: &CpuSet, key: impl Fn(&CpuInfo) -> u32) -> BTreeMap<u32, CpuSet> {
        let mut out: BTreeMap<u32, CpuSet> = BTreeMap::new();
        for cpu in set.iter() {
            if let Some(info) = self.cpus.get(&cpu) {
                out.entry(key(info)).or_default().0.insert(cpu);
            }
        }
        out
    }
}

/// `takeByTopology` (packed): `n` CPUs out of `available`.
pub fn take_by_topology(
    topology: &Topology,
    available: &CpuSet,
    n: usize,
) -> Result<CpuSet, CpuError> {
    if n > available.len() {
        return Err(CpuError::NotEnough {
            requested: n,
            available: available.len(),
        });
    }
    if n == available.len() {
        return Ok(available.clone());
    }
    let mut taken = CpuSet::default();
    let mut free = available.clone();
    let all_sockets = topology.group(&topology.all(), |c| c.socket);
    let all_cores = topology.group(&topology.all(), |c| c.core);
    let take = |cpus: &CpuSet, taken: &mut CpuSet, free: &mut CpuSet| {
        *taken = taken.union(cpus);
        *free = free.difference(cpus);
    };
    // Sockets ordered by free CPUs (fewest first, i.e. partly used first), then id.
    let sorted_sockets = |free: &CpuSet| {
        let mut s: Vec<(usize, u32)> = topology
            .group(free, |c| c.socket)
            .iter()
            .map(|(id, cpus)| (cpus.len(), *id))
            .collect();
        s.sort_unstable();
        s.into_iter().map(|(_, id)| id).collect::<Vec<_>>()
    };
    let sorted_cores = |free: &CpuSet| {
        let by_core = topology.group(free, |c| c.core);
        let mut out = Vec::new();
        for socket in sorted_sockets(free) {
            let mut cores: Vec<(usize, u32)> = by_core
                .iter()
                .filter(|(_, cpus)| {
                    cpus.iter()
                        .next()
                        .and_then(|c| topology.cpus.get(&c))
                        .is_some_and(|i| i.socket == socket)
                })
                .map(|(id, cpus)| (cpus.len(), *id))
                .collect();
            cores.sort_unstable();
            out.extend(
                cores
                    .into_iter()
                    .map(|(_, id)| (id, by_core.get(&id).cloned().unwrap_or_default())),
            );
        }
        out
    };
    // 1. whole sockets
    let per_socket = topology.cpus_per_socket();
    if per_socket > 0 && n - taken.len() >= per_socket {
        for socket in sorted_sockets(&free) {
            if n - taken.len() < per_socket {
                break;
            }
            if let Some(cpus) = all_sockets.get(&socket)
                && cpus.is_subset(&free)
            {
                take(cpus, &mut taken, &mut free);
            }
        }
    }
    // 2. whole cores
    let per_core = topology.threads_per_core();
    if per_core > 0 && n - taken.len() >= per_core {
        for (core, _) in sorted_cores(&free) {
            if n - taken.len() < per_core {
                break;
            }
            if let Some(cpus) = all_cores.get(&core)
                && cpus.is_subset(&free)
            {
                take(cpus, &mut taken, &mut free);
            }
        }
    }
    // 3. single threads, partly used cores first
    while taken.len() < n {
        let Some(cpu) = sorted_cores(&free)
            .into_iter()
            .flat_map(|(_, cpus)| cpus.0)
            .next()
        else {
            return Err(CpuError::NotEnough {
                requested: n,
                available: available.len(),
            });
        };
        take(&[cpu].into_iter().collect(), &mut taken, &mut free);
    }
    Ok(taken)
}

/// The static policy's state: the shared pool and the exclusive assignments.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuState {
    /// The shared (default) pool.
    pub default_cpu_set: CpuSet,
    /// pod uid -> container -> exclusive CPUs.
    pub assignments: BTreeMap<String, BTreeMap<String, CpuSet>>,
}

/// The static policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPolicy {
    topology: Topology,
    reserved: CpuSet,
    state: CpuState,
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
    /// `None` for a container that shares the pool.
    pub fn allocate(
        &mut self,
        pod: &Pod,
        container: &Container,
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
        let set = take_by_topology(&self.topology, &self.assignable(), n)?;
        self.state.default_cpu_set = self.state.default_cpu_set.difference(&set);
        self.state
            .assignments
            .entry(uid)
            .or_default()
            .insert(container.name.clone(), set.clone());
        Ok(Some(set))
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

/// Kubelet's `cpu_manager_state` file (`CPUManagerCheckpointV2`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// `static` or `none`.
    #[serde(rename = "policyName")]
    pub policy_name: String,
    /// The shared pool.
    #[serde(rename = "defaultCpuSet")]
    pub default_cpu_set: String,
    /// pod uid -> container -> cpuset.
    #[serde(rename = "entries", default, skip_serializing_if = "no_entries")]
    pub entries: Option<BTreeMap<String, BTreeMap<String, String>>>,
    /// FNV-32a of the checkpoint as Go's spew prints it, with checksum 0.
    pub checksum: u64,
}

/// Go's `omitempty` on the entries map: absent when empty.
fn no_entries(e: &Option<BTreeMap<String, BTreeMap<String, String>>>) -> bool {
    e.as_ref().is_none_or(BTreeMap::is_empty)
}

impl Checkpoint {
    /// From a state, with its checksum.
    #[must_use]
    pub fn from_state(policy: &str, state: &CpuState) -> Self {
        let entries = state
            .assignments
            .iter()
            .map(|(uid, m)| {
                (
                    uid.clone(),
                    m.iter().map(|(c, s)| (c.clone(), s.to_string())).collect(),
                )
            })
            .collect();
        let mut cp = Self {
            policy_name: policy.to_owned(),
            default_cpu_set: state.default_cpu_set.to_string(),
            entries: Some(entries),
            checksum: 0,
        };
        cp.checksum = cp.compute_checksum();
        cp
    }

    /// The text kubelet hashes: `spew` `%#v` of `*state.CPUManagerCheckpoint` (its v2 format;
    /// `CPUManagerCheckpointV2` is an alias, so reflection names it so), sorted keys, map
    /// values untyped, the checksum field 0. Kubelet's entries map is never nil (it reads into
    /// a checkpoint made with an empty map), so absent entries hash as `map[]`.
    #[must_use]
    pub fn spew(&self) -> String {
        let entries = match &self.entries {
            None => "map[]".to_owned(),
            Some(e) => {
                let inner: Vec<String> = e
                    .iter()
                    .map(|(uid, m)| {
                        let cs: Vec<String> = m.iter().map(|(c, s)| format!("{c}:{s}")).collect();
                        format!("{uid}:map[{}]", cs.join(" "))
                    })
                    .collect();
                format!("map[{}]", inner.join(" "))
            }
        };
        format!(
            "(*state.CPUManagerCheckpoint){{PolicyName:(string){} DefaultCPUSet:(string){} Entries:(map[string]map[string]string){} Checksum:(checksum.Checksum)0}}",
            self.policy_name, self.default_cpu_set, entries
        )
    }

    fn compute_checksum(&self) -> u64 {
        let mut hash: u32 = 0x811c_9dc5;
        for b in self.spew().bytes() {
            hash ^= u32::from(b);
            hash = hash.wrapping_mul(0x0100_0193);
        }
        u64::from(hash)
    }

    /// Parses and verifies a checkpoint file's JSON.
    pub fn from_json(text: &str) -> Result<Self, CpuError> {
        let cp: Self =
            serde_json::from_str(text).map_err(|e| CpuError::Checkpoint(e.to_string()))?;
        if cp.checksum != 0 && cp.checksum != cp.compute_checksum() {
            return Err(CpuError::Checkpoint(
                "checkpoint is corrupted: checksum mismatch".into(),
            ));
        }
        Ok(cp)
    }

    /// The JSON to write.
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The state it holds.
    pub fn to_state(&self) -> Result<CpuState, CpuError> {
        let mut assignments = BTreeMap::new();
        for (uid, m) in self.entries.iter().flatten() {
            let mut cs = BTreeMap::new();
            for (c, s) in m {
                cs.insert(c.clone(), CpuSet::parse(s)?);
            }
            assignments.insert(uid.clone(), cs);
        }
        Ok(CpuState {
            default_cpu_set: CpuSet::parse(&self.default_cpu_set)?,
            assignments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::resources::test_pods::{container, pod};

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap()
    }

    #[test]
    fn cpusets() {
        assert_eq!(set("0-3,8,10-11").to_string(), "0-3,8,10-11");
        assert_eq!(set("").to_string(), "");
        assert_eq!(set("3,1,2").to_string(), "1-3");
        assert!(CpuSet::parse("3-1").is_err());
        assert!(CpuSet::parse("a").is_err());
        assert!(CpuSet::parse("0-4294967295").is_err());
    }

    #[test]
    fn take_by_topology_cases() {
        // After cpu_assignment_test.go TestTakeByTopology, topoDualSocketHT: 2 sockets x 6
        // cores x 2 threads; socket 0 = cores 0-5 = cpus 0-5,12-17.
        let topo = Topology::uniform(2, 6, 2);
        let all = topo.all();
        assert_eq!(take_by_topology(&topo, &all, 1).unwrap(), set("0"));
        assert_eq!(take_by_topology(&topo, &all, 2).unwrap(), set("0,12"));
        assert_eq!(take_by_topology(&topo, &all, 6).unwrap(), set("0-2,12-14"));
        assert_eq!(take_by_topology(&topo, &all, 12).unwrap(), set("0-5,12-17"));
        // a partly used core is preferred for a single thread
        assert_eq!(take_by_topology(&topo, &set("1-23"), 1).unwrap(), set("12"));
        // a partly used socket is preferred for a whole core
        assert_eq!(
            take_by_topology(&topo, &set("1-23"), 2).unwrap(),
            set("1,13")
        );
        assert_eq!(
            take_by_topology(&topo, &set("1-11,13-23"), 2).unwrap(),
            set("1,13")
        );
        assert!(matches!(
            take_by_topology(&topo, &set("0-1"), 3),
            Err(CpuError::NotEnough {
                requested: 3,
                available: 2
            })
        ));
    }

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

    #[test]
    fn topology_from_ids_numbers_cores_across_sockets() {
        let topo = Topology::from_ids([(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]);
        assert_eq!(topo.cpus[&2], CpuInfo { socket: 1, core: 2 });
        assert_eq!(topo.all(), set("0-3"));
    }

    #[test]
    fn checksums_of_checkpoints_a_kubelet_wrote() {
        // A cpu_manager_state file written by a real kubelet (quoted in public notes on the
        // CPU manager): our spew + FNV-32a gives its checksum, and a changed byte is refused.
        let text = r#"{"policyName":"static","defaultCpuSet":"0,2-12,14-23","entries":{"235148fe-393f-47a8-a17d-bd55bc1a836b":{"cgroup1-0":"1,13"}},"checksum":1552716370}"#;
        let cp = Checkpoint::from_json(text).unwrap();
        assert_eq!(cp.checksum, 1_552_716_370);
        let state = cp.to_state().unwrap();
        assert_eq!(
            Checkpoint::from_state("static", &state).checksum,
            1_552_716_370
        );
        assert!(Checkpoint::from_json(&text.replace("1,13", "1,14")).is_err());
        // Without entries (kubelet's none policy writes none): hashed as an empty map, the
        // same as written with an empty map.
        let empty = Checkpoint::from_state(
            "none",
            &CpuState {
                default_cpu_set: CpuSet::default(),
                assignments: BTreeMap::new(),
            },
        );
        let json = format!(
            r#"{{"policyName":"none","defaultCpuSet":"","checksum":{}}}"#,
            empty.checksum
        );
        assert!(Checkpoint::from_json(&json).is_ok(), "{json}");
        // Written as kubelet writes it: an empty map is omitted.
        assert_eq!(empty.to_json(), json);
    }
}
