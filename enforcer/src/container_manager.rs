//! Enforcement beside the pod workers: the kubepods cgroup and its QoS tiers kept in step with
//! the admitted pods, and every container process's `oom_score_adj` verified in /proc (and
//! corrected) after start, since runtimes differ (containerd with `restrict_oom_score_adj`
//! clamps negative values to its own).
//!
//! Where the node forbids negative values (no CAP_SYS_RESOURCE) the decided value is clamped to
//! 0, the lowest a process may set there: Guaranteed (-997 -> 0) stays below every Burstable
//! value (3..999) and BestEffort (1000), so the classes keep their order. The clamp is logged
//! once and each container's decided and actual values are in its status.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;

use crate::{
    cgroup::{
        CgroupError, WithPath as _,
        kubepods::{self, Kubepods, NodeResources},
    },
    config::{Config, CpuManagerPolicy},
    cri::{ContainerRuntime, spec},
    policy::{
        cpu::{Checkpoint, CpuError, CpuSet, StaticPolicy, Topology},
        oom::KUBELET_OOM_SCORE_ADJ,
        resources::cgroup::CgroupOptions,
    },
};

pub mod allocation;
mod managers;
pub mod podcgroup;

pub use managers::numa_topology;

/// The CPU manager's checkpoint file in the state directory (kubelet's name).
pub const CPU_MANAGER_STATE_FILE: &str = "cpu_manager_state";

/// Errors that stop the enforcement from starting.
#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    /// The CPU manager cannot start (policy change against the checkpoint, bad reserved
    /// CPUs, unreadable topology...).
    #[error("cpu manager ({path}): {source}")]
    CpuManager {
        path: PathBuf,
        #[source]
        source: CpuError,
    },
    /// The memory manager cannot start (policy change against the checkpoint,
    /// `reservedMemory` that does not add up, a checkpoint that does not match the machine...).
    #[error(
        "memory manager ({path}): {source}; if the checkpoint is at fault, drain this node and delete it before restarting"
    )]
    MemoryManager {
        path: PathBuf,
        #[source]
        source: crate::policy::memory::MemoryError,
    },
    /// The topology manager cannot start.
    #[error("topology manager: {0}")]
    TopologyManager(#[source] crate::policy::topology::TopologyError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The CPU manager's static policy with its checkpoint file.
#[derive(Debug)]
struct CpuManager {
    policy: StaticPolicy,
    checkpoint: PathBuf,
}

impl CpuManager {
    fn save(&self) {
        let text = self.policy.checkpoint().to_json();
        let tmp = self.checkpoint.with_extension("tmp");
        let r = std::fs::write(&tmp, &text).and_then(|()| std::fs::rename(&tmp, &self.checkpoint));
        if let Err(e) = r {
            tracing::warn!(path = %self.checkpoint.display(), error = %e, "writing the cpu manager checkpoint");
        }
    }
}

/// Reads the checkpoint at `path`, if any.
fn read_checkpoint(path: &Path) -> Result<Option<Checkpoint>, EnforceError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            Checkpoint::from_json(&text)
                .map(Some)
                .map_err(|source| EnforceError::CpuManager {
                    path: path.to_path_buf(),
                    source,
                })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(EnforceError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Starts the CPU manager: the static policy from the topology, `reservedSystemCPUs` (or the
/// reserved cpu) and the checkpoint; `None` for the `none` policy, which refuses a checkpoint
/// of another policy (as kubelet does) and writes its own.
fn start_cpu_manager(
    policy: CpuManagerPolicy,
    topology: Result<Topology, CpuError>,
    reserved_system_cpus: &str,
    reserved_milli_cpu: i64,
    state_dir: &Path,
) -> Result<Option<CpuManager>, EnforceError> {
    let path = state_dir.join(CPU_MANAGER_STATE_FILE);
    let err = |source| EnforceError::CpuManager {
        path: path.clone(),
        source,
    };
    let checkpoint = read_checkpoint(&path)?;
    if policy == CpuManagerPolicy::None {
        if let Some(cp) = checkpoint.filter(|cp| cp.policy_name != "none") {
            return Err(err(CpuError::PolicyChanged {
                configured: "none".into(),
                checkpoint: cp.policy_name,
            }));
        }
        return Ok(None);
    }
    let reserved = if reserved_system_cpus.trim().is_empty() {
        None
    } else {
        Some(CpuSet::parse(reserved_system_cpus.trim()).map_err(err)?)
    };
    let policy = StaticPolicy::new(
        topology.map_err(err)?,
        reserved.as_ref(),
        reserved_milli_cpu,
        checkpoint.as_ref(),
    )
    .map_err(err)?;
    std::fs::create_dir_all(state_dir).map_err(|source| EnforceError::Io {
        path: state_dir.to_path_buf(),
        source,
    })?;
    let m = CpuManager {
        policy,
        checkpoint: path,
    };
    m.save();
    tracing::info!(
        reserved = %m.policy.reserved(),
        shared = %m.policy.state().default_cpu_set,
        "cpu manager static policy started"
    );
    Ok(Some(m))
}

/// How often kubepods, the QoS tiers and the pod cgroups are re-checked (kubelet's housekeeping).
pub const RECONCILE_PERIOD: Duration = Duration::from_secs(10);

/// The node-level enforcement the pod runtime applies.
#[derive(Debug, Default)]
pub struct Enforcer {
    /// The kubepods hierarchy and the node's numbers; `None` leaves kubepods and the QoS tiers
    /// alone (pod cgroups are still created and limited).
    node: Option<(Kubepods, NodeResources)>,
    /// Options of the pod and container values (`cpuCFSQuota`, Memory QoS, ...).
    cgroup: CgroupOptions,
    oom_clamp_logged: AtomicBool,
    node_logged: AtomicBool,
    /// The CPU manager (static policy only).
    cpu: Option<Mutex<CpuManager>>,
    /// The memory manager (static policy only).
    memory: Option<Mutex<managers::MemoryManager>>,
    /// The topology manager's policy and the NUMA nodes.
    topology: managers::TopologyManager,
    /// Container id -> the cpuset last pushed through CRI.
    pushed: Mutex<HashMap<String, String>>,
    /// Read the containers' `oom_score_adj` without correcting it (kubelet's behaviour: the
    /// value is set once, at creation, through CRI).
    oom_read_only: bool,
    /// `InPlacePodLevelResourcesVerticalScaling` (kubelet's default: on).
    pod_level_resize: bool,
}

impl Enforcer {
    /// The kubepods hierarchy (its root, driver and writer), when kubepods is enforced.
    #[must_use]
    pub fn kubepods(&self) -> Option<&Kubepods> {
        self.node.as_ref().map(|(k, _)| k)
    }

    /// Enforcement of the kubepods cgroup and QoS tiers below `kubepods`' root.
    #[must_use]
    pub fn new(node: Option<(Kubepods, NodeResources)>, cgroup: CgroupOptions) -> Self {
        Self {
            node,
            cgroup,
            oom_clamp_logged: AtomicBool::new(false),
            node_logged: AtomicBool::new(false),
            cpu: None,
            memory: None,
            topology: managers::TopologyManager::default(),
            pushed: Mutex::new(HashMap::new()),
            oom_read_only: false,
            pod_level_resize: true,
        }
    }

    /// Whether pod-level resources are resized in place (`InPlacePodLevelResourcesVerticalScaling`).
    #[must_use]
    pub fn pod_level_resize(&self) -> bool {
        self.pod_level_resize
    }

    /// Leaves the containers' `oom_score_adj` as the runtime set it at creation, as kubelet
    /// does (the tests' kubelet stand-in beside a companion that aligns it).
    #[must_use]
    pub fn with_oom_scores_left(mut self) -> Self {
        self.oom_read_only = true;
        self
    }

    /// From the configuration: `kubepods` below `cgroupRoot` sized from `capacity` (the node's,
    /// or its override) minus `kubeReserved` + `systemReserved` when `enforceNodeAllocatable`
    /// has `pods`; `cpuCFSQuota`, Memory QoS (cgroup v2 only) and `memoryThrottlingFactor`.
    #[must_use]
    pub fn from_config(
        config: &crate::config::Config,
        kubepods: Kubepods,
        capacity: &std::collections::BTreeMap<String, crate::quantity::Quantity>,
    ) -> Self {
        let layout = kubepods.layout().clone();
        let get = |l: &std::collections::BTreeMap<String, crate::quantity::Quantity>,
                   k: &str,
                   milli: bool| {
            l.get(k)
                .map_or(0, |q| if milli { q.milli_value() } else { q.value() })
        };
        let reserved = |k: &str, milli: bool| {
            get(&config.system_reserved, k, milli).saturating_add(get(
                &config.kube_reserved,
                k,
                milli,
            ))
        };
        let node = NodeResources {
            cpu_milli: get(capacity, "cpu", true),
            memory: get(capacity, "memory", false),
            reserved_cpu_milli: reserved("cpu", true),
            reserved_memory: reserved("memory", false),
            enforce_pods: config.enforce_node_allocatable.iter().any(|e| e == "pods"),
        };
        let v2 = layout.memory_on_v2();
        let tiered = config.memory_reservation_policy
            == crate::config::MemoryReservationPolicy::TieredReservation;
        if config.enforcer.memory_qos
            && !v2
            && (tiered || config.memory_throttling_factor.is_some())
        {
            tracing::warn!(
                "Memory QoS (memoryThrottlingFactor, memoryReservationPolicy) needs the memory controller on cgroup v2; nothing of it is written on this node"
            );
        }
        if config.enforcer.memory_qos && v2 {
            let release = rustix::system::uname()
                .release()
                .to_string_lossy()
                .into_owned();
            if crate::policy::resources::cgroup::kernel_before(&release, (5, 9)) {
                tracing::warn!(
                    kernel = %release,
                    "MemoryQoS is on and the kernel is older than 5.9 (MemoryQoSMinKernelVersion): memory.high may livelock a container's tasks in reclaim; the feature goes on (kubelet warns of it too)"
                );
            }
        }
        let cgroup = CgroupOptions {
            v2,
            enforce_cpu_limits: config.cpu_cfs_quota,
            memory_qos: config.enforcer.memory_qos && v2,
            memory_throttling_factor: config.memory_throttling_factor,
            tiered_reservation: tiered,
            single_process_oom_kill: config.single_process_oom_kill,
            pod_pids_limit: config.pod_pids_limit,
            allocatable_memory: node.memory.saturating_sub(node.reserved_memory).max(0),
            swap: swap_options(config, &layout, node.memory),
            ..CgroupOptions::default()
        };
        let mut enforcer = Self::new(Some((kubepods, node)), cgroup);
        enforcer.pod_level_resize = config
            .feature_gates
            .get("InPlacePodLevelResourcesVerticalScaling")
            .copied()
            .unwrap_or(true);
        enforcer
    }

    /// Adds the CPU manager from the configuration (`cpuManagerPolicy`, `reservedSystemCPUs`,
    /// the reserved cpu, `<stateDir>/cpu_manager_state`); refuses a policy change against an
    /// existing checkpoint.
    pub fn with_cpu_manager(mut self, config: &Config) -> Result<Self, EnforceError> {
        let reserved_milli = [&config.system_reserved, &config.kube_reserved]
            .iter()
            .filter_map(|m| m.get("cpu"))
            .fold(0i64, |a, q| a.saturating_add(q.milli_value()));
        let topology = if config.cpu_manager_policy == CpuManagerPolicy::Static {
            // Each CPU's NUMA node, for the topology manager's hints.
            let nodes = crate::node::numa_topology(Path::new("/sys"))
                .map(|n| n.cpu_nodes())
                .unwrap_or_default();
            crate::node::cpu_topology(Path::new("/sys")).map(|t| t.with_numa_nodes(&nodes))
        } else {
            Ok(Topology::uniform(1, 1, 1))
        };
        self.cpu = start_cpu_manager(
            config.cpu_manager_policy,
            topology,
            &config.reserved_system_cpus,
            reserved_milli,
            &config.enforcer.state_dir,
        )?
        .map(Mutex::new);
        Ok(self)
    }

    /// Gives a terminated pod's exclusive CPUs back to the shared pool.
    pub fn release_cpus(&self, uid: &str) {
        let Some(cpu) = &self.cpu else { return };
        let mut m = crate::locks::lock(cpu);
        let names: Vec<String> = m
            .policy
            .state()
            .assignments
            .get(uid)
            .map(|a| a.keys().cloned().collect())
            .unwrap_or_default();
        for n in &names {
            m.policy.release(uid, n);
        }
        if !names.is_empty() {
            tracing::info!(uid, shared = %m.policy.state().default_cpu_set, "exclusive cpus released");
            m.save();
        }
    }

    /// The cpuset a container runs on under the static policy (its exclusive CPUs or the
    /// shared pool); `None` without the CPU manager.
    #[must_use]
    pub fn cpuset(&self, uid: &str, container: &str) -> Option<String> {
        let m = crate::locks::lock(self.cpu.as_ref()?);
        Some(m.policy.container_cpus(uid, container).to_string())
    }

    /// Pushes each running managed container's cpuset through CRI `UpdateContainerResources`
    /// when it differs from what was last pushed (the CPU manager's reconcile loop).
    pub async fn reconcile_cpusets<R: ContainerRuntime>(&self, runtime: &R) {
        if self.cpu.is_none() {
            return;
        }
        let filter = k8s_cri::v1::ContainerFilter {
            label_selector: HashMap::from([(spec::MANAGED_LABEL.to_owned(), "true".to_owned())]),
            ..Default::default()
        };
        let containers = match runtime.list_containers(filter).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "cpu manager reconcile: listing containers");
                return;
            }
        };
        let running = k8s_cri::v1::ContainerState::ContainerRunning as i32;
        let mut live = Vec::new();
        for c in containers.iter().filter(|c| c.state == running) {
            live.push(c.id.clone());
            let (Some(uid), Some(name)) = (
                c.labels.get(spec::POD_UID_LABEL),
                c.labels.get(spec::CONTAINER_NAME_LABEL),
            ) else {
                continue;
            };
            let Some(want) = self.cpuset(uid, name) else {
                return;
            };
            let last = crate::locks::lock(&self.pushed).get(&c.id).cloned();
            if last.as_deref() == Some(want.as_str()) {
                continue;
            }
            let res = k8s_cri::v1::LinuxContainerResources {
                cpuset_cpus: want.clone(),
                ..Default::default()
            };
            match runtime.update_container_resources(&c.id, res).await {
                Ok(()) => {
                    tracing::info!(uid = %uid, container = %name, cpus = %want, "cpuset updated");
                    crate::locks::lock(&self.pushed).insert(c.id.clone(), want);
                }
                Err(e) => {
                    tracing::warn!(uid = %uid, container = %name, error = %e, "updating the cpuset")
                }
            }
        }
        crate::locks::lock(&self.pushed).retain(|id, _| live.contains(id));
    }

    /// kubelet's `GetNodeAllocatableAbsolute` (capacity less kube and system reserved, before
    /// the eviction thresholds): cpu in millicores and memory in bytes, when kubepods is
    /// enforced from the node's numbers.
    #[must_use]
    pub fn allocatable_absolute(&self) -> Option<(i64, i64)> {
        self.node.as_ref().map(|(_, n)| {
            (
                n.cpu_milli.saturating_sub(n.reserved_cpu_milli),
                n.memory.saturating_sub(n.reserved_memory),
            )
        })
    }

    /// Whether the CPU manager's static policy is on.
    #[must_use]
    pub fn cpu_manager_enabled(&self) -> bool {
        self.cpu.is_some()
    }

    /// Records the cpuset a container was created with (no update needed for it).
    pub fn created_with(&self, container_id: &str, cpuset: &str) {
        crate::locks::lock(&self.pushed).insert(container_id.to_owned(), cpuset.to_owned());
    }

    /// The cgroup options pod and container values are computed with.
    #[must_use]
    pub fn cgroup_options(&self) -> CgroupOptions {
        self.cgroup
    }

    /// Writes `kubepods` (allocatable) and the QoS tiers (from `pods`, the admitted pods).
    pub fn sync_node<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a Pod>,
    ) -> Result<(), CgroupError> {
        let Some((k, node)) = &self.node else {
            return Ok(());
        };
        // Where the node has Memory QoS's files (cgroup v2): tiered, or reset to 0.
        let tiered = k
            .memory()
            .is_some_and(|m| m.has_memory_qos())
            .then_some(self.cgroup.memory_qos && self.cgroup.tiered_reservation);
        let tiers = kubepods::qos_tier_values(pods, tiered);
        let low = tiers.burstable.memory_low.unwrap_or(0);
        crate::metrics::global().memory_qos(
            tiers.kubepods_memory_min.unwrap_or(0).saturating_sub(low),
            low,
        );
        let top = kubepods::kubepods_values(node);
        k.apply_node(&top, &tiers)?;
        if !self.node_logged.swap(true, Ordering::Relaxed) {
            tracing::info!(
                cgroup = %k.kubepods_path(),
                cpu_shares = ?top.cpu_shares,
                memory_limit = ?top.memory_limit.flatten(),
                "kubepods cgroup and QoS tiers set"
            );
        }
        Ok(())
    }

    /// [`Enforcer::sync_node`], logging a failure instead of returning it.
    pub fn sync_node_logged<'a>(&self, pods: impl IntoIterator<Item = &'a Pod>) {
        if let Err(e) = self.sync_node(pods) {
            tracing::warn!(error = %e, "updating the kubepods and QoS tier cgroups");
        }
    }

    /// Logs the first clamp of a decided `oom_score_adj` (once per enforcer).
    fn note_clamp(&self, decided: i64, got: i64) {
        if decided != got && !self.oom_clamp_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                decided,
                got,
                "oom_score_adj clamped: this node forbids negative values (no CAP_SYS_RESOURCE); \
                 classes keep their order (Guaranteed 0 < Burstable 3..999 < BestEffort 1000)"
            );
        }
    }

    /// Verifies (and corrects) the `oom_score_adj` of every process of a container, found in
    /// `<memory mount>/<pod cgroup>/<container id>/cgroup.procs`. Returns the value the
    /// container's processes have (the first process's), or `None` when none was found.
    pub fn verify_oom(
        &self,
        k: &Kubepods,
        pod_cgroup: &str,
        container_id: &str,
        decided: i64,
        floor: i64,
    ) -> Option<i64> {
        let pod = crate::cgroup::PodCgroup::resolve(k.layout(), pod_cgroup)?;
        let dir = crate::cgroup::container_dir(pod.dir(), container_id).ok()?;
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).ok()?;
        let wanted = clamp_oom_score_adj(decided, floor);
        let mut first = None;
        for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            if self.oom_read_only {
                let now = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
                if let Some(v) = now {
                    first.get_or_insert(v);
                }
                continue;
            }
            let got = match ensure_oom_score_adj(pid, wanted) {
                Ok(v) => v,
                Err(e) => {
                    tracing::debug!(pid, error = %e, "oom_score_adj of a container process");
                    continue;
                }
            };
            if got != wanted {
                tracing::warn!(
                    pid,
                    container = container_id,
                    wanted,
                    got,
                    "oom_score_adj could not be set"
                );
            }
            self.note_clamp(decided, got);
            first.get_or_insert(got);
        }
        first
    }
}

/// Reads a process's `oom_score_adj` and writes `wanted` when it differs; returns the value it
/// has afterwards.
pub fn ensure_oom_score_adj(pid: u32, wanted: i64) -> Result<i64, CgroupError> {
    let path = Path::new("/proc")
        .join(pid.to_string())
        .join("oom_score_adj");
    let read = |p: &Path| -> Result<i64, CgroupError> {
        let text = std::fs::read_to_string(p).with_path(p)?;
        text.trim().parse().map_err(|_| CgroupError::Invalid {
            path: p.to_path_buf(),
            what: format!("not a number: {:?}", text.trim()),
        })
    };
    let now = read(&path)?;
    if now == wanted {
        return Ok(now);
    }
    if let Err(e) = std::fs::write(&path, wanted.to_string()) {
        tracing::debug!(pid, wanted, error = %e, "writing oom_score_adj");
    }
    read(&path)
}

/// The value to give a process whose decided `oom_score_adj` is `decided` on a node whose
/// lowest settable value is `floor`.
#[must_use]
pub fn clamp_oom_score_adj(decided: i64, floor: i64) -> i64 {
    decided.clamp(floor.min(1000), 1000)
}

/// Sets the enforcer's own `oom_score_adj` to kubelet's -999, or the lowest this node allows;
/// logs and returns what it got.
pub fn set_own_oom_score_adj(cap_sys_resource: bool) -> Option<i64> {
    let floor = crate::cri::spec::oom_score_adj_floor(cap_sys_resource);
    let path = Path::new("/proc/self/oom_score_adj");
    let mut got = None;
    for wanted in [
        KUBELET_OOM_SCORE_ADJ,
        clamp_oom_score_adj(KUBELET_OOM_SCORE_ADJ, floor),
    ] {
        if std::fs::write(path, wanted.to_string()).is_ok() {
            got = Some(wanted);
            break;
        }
    }
    let now = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok());
    match (got, now) {
        (Some(v), Some(n)) if v == KUBELET_OOM_SCORE_ADJ && n == v => {
            tracing::info!(oom_score_adj = n, "enforcer oom_score_adj set");
        }
        (_, Some(n)) => tracing::warn!(
            wanted = KUBELET_OOM_SCORE_ADJ,
            got = n,
            "enforcer oom_score_adj clamped: this node forbids negative values (no CAP_SYS_RESOURCE)"
        ),
        (_, None) => tracing::warn!("cannot read /proc/self/oom_score_adj"),
    }
    now
}

/// The node's swap as containers see it: `memorySwap.swapBehavior`, kubelet's swap
/// controller check, the node's memory (`memory`: the capacity pods are sized against) and
/// `SwapTotal`.
fn swap_options(
    config: &Config,
    layout: &crate::cgroup::CgroupLayout,
    memory: i64,
) -> crate::policy::swap::SwapOptions {
    use crate::{node::swap, policy::swap::SwapBehavior};
    let behavior = config.memory_swap.swap_behavior;
    let swap_capacity = match swap::machine_swap() {
        Ok((total, _)) => total,
        Err(e) => {
            tracing::warn!(error = %e, "reading the node's swap; pods get none");
            0
        }
    };
    let controller_available = swap::swap_controller_available(layout);
    if behavior == SwapBehavior::LimitedSwap {
        tracing::info!(
            memory_capacity = memory,
            swap_capacity,
            controller_available,
            "memorySwap.swapBehavior LimitedSwap: Burstable containers get memory.swap.max in proportion to their memory requests"
        );
    }
    crate::policy::swap::SwapOptions {
        behavior,
        controller_available,
        memory_capacity: memory,
        swap_capacity,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamping_keeps_the_class_order() {
        // Guaranteed, Burstable (smallest and largest), BestEffort.
        let decided = [-997, 3, 999, 1000];
        for floor in [-1000, 0] {
            let got: Vec<i64> = decided
                .iter()
                .map(|d| clamp_oom_score_adj(*d, floor))
                .collect();
            assert!(got.windows(2).all(|w| w[0] < w[1]), "{floor}: {got:?}");
        }
        assert_eq!(clamp_oom_score_adj(-997, 0), 0);
        assert_eq!(clamp_oom_score_adj(-997, -1000), -997);
        assert_eq!(clamp_oom_score_adj(500, 0), 500);
        assert_eq!(clamp_oom_score_adj(2000, 0), 1000);
    }

    #[test]
    fn cpu_manager_checkpoint_and_policy_change() {
        let dir = tempfile::tempdir().unwrap();
        let topo = || Ok(Topology::uniform(1, 2, 1));
        // static: a checkpoint is written; reserved cpu 0 stays in the shared pool.
        let m = start_cpu_manager(CpuManagerPolicy::Static, topo(), "0", 0, dir.path())
            .unwrap()
            .unwrap();
        assert_eq!(m.policy.reserved().to_string(), "0");
        let text = std::fs::read_to_string(dir.path().join(CPU_MANAGER_STATE_FILE)).unwrap();
        assert!(
            text.starts_with(r#"{"policyName":"static","defaultCpuSet":"0-1""#),
            "{text}"
        );
        // A policy change against it refuses to start.
        let e = start_cpu_manager(CpuManagerPolicy::None, topo(), "", 0, dir.path()).unwrap_err();
        assert!(
            e.to_string()
                .contains("differs from state checkpoint policy"),
            "{e}"
        );
        // Restarting with the same policy keeps the state; a bad reserved set is an error.
        assert!(start_cpu_manager(CpuManagerPolicy::Static, topo(), "0", 0, dir.path()).is_ok());
        assert!(start_cpu_manager(CpuManagerPolicy::Static, topo(), "7", 0, dir.path()).is_err());
        let empty = tempfile::tempdir().unwrap();
        assert!(
            start_cpu_manager(CpuManagerPolicy::None, topo(), "", 0, empty.path())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_process_value_is_verified_and_corrected() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        // Raising is always allowed.
        let got = ensure_oom_score_adj(child.id(), 900);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(got.ok(), Some(900));
        assert!(ensure_oom_score_adj(u32::MAX, 0).is_err());
    }
}
