//! The kubepods hierarchy below the configured cgroup root (cgroupfs driver, kubelet's
//! `qos_container_manager_linux.go` and `node_container_manager_linux.go`):
//!
//! ```text
//! <root>/kubepods                 cpu.shares from allocatable cpu, memory limit = allocatable
//! <root>/kubepods/burstable       cpu.shares = shares(sum of Burstable cpu requests)
//! <root>/kubepods/besteffort      cpu.shares = 2
//! <root>/kubepods[/<tier>]/pod<uid>   the decision core's pod values
//! ```
//!
//! The values are computed by pure functions ([`kubepods_values`], [`qos_tier_values`],
//! [`pod_values`]); [`Kubepods::apply`] creates the directories (memory and cpu hierarchies, v1
//! or v2) and writes the values through `cgroups-rs` controllers. Every path is joined with
//! [`join_inside`]; nothing outside the configured root is created or written (on cgroup v2
//! the controllers are delegated only from the root down).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

pub use super::writer::CgroupValues;
use super::{
    CgroupError, CgroupLayout, QosTier, join_inside,
    manager::{CgroupManager, Cgroupfs, SystemdSlices},
    writer::{CgroupWriter, KernelCgroups},
};
use crate::policy::{
    cgroup_name::{self, CgroupDriver, CgroupName},
    qos::{self, QosClass},
    resources::{
        self,
        cgroup::{PodCgroupValues, burstable_tier_shares, milli_cpu_to_shares},
    },
};

/// The node's numbers the `kubepods` cgroup is sized from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeResources {
    /// cpu capacity in millicores.
    pub cpu_milli: i64,
    /// memory capacity in bytes (the capacity override when configured).
    pub memory: i64,
    /// cpu reserved (kubeReserved + systemReserved) in millicores.
    pub reserved_cpu_milli: i64,
    /// memory reserved (kubeReserved + systemReserved) in bytes.
    pub reserved_memory: i64,
    /// `enforceNodeAllocatable` contains `pods`.
    pub enforce_pods: bool,
}

/// Values of the `kubepods` cgroup (`createNodeAllocatableCgroups`): the allocatable amounts
/// (capacity minus reservations) when `pods` is enforced, else the capacity.
pub fn kubepods_values(node: &NodeResources) -> CgroupValues {
    let (cpu, memory) = if node.enforce_pods {
        (
            node.cpu_milli.saturating_sub(node.reserved_cpu_milli),
            node.memory.saturating_sub(node.reserved_memory),
        )
    } else {
        (node.cpu_milli, node.memory)
    };
    CgroupValues {
        cpu_shares: Some(milli_cpu_to_shares(cpu)),
        memory_limit: (memory > 0).then_some(Some(memory)),
        ..CgroupValues::default()
    }
}

/// The QoS-tier values kubelet keeps in step with the pods (`UpdateCgroups`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierValues {
    pub burstable: CgroupValues,
    pub besteffort: CgroupValues,
    /// `memory.min` of `kubepods` itself under `TieredReservation` (Guaranteed + Burstable
    /// requests), 0 otherwise on cgroup v2.
    pub kubepods_memory_min: Option<i64>,
    /// `memory.low` of `kubepods`: 0 on cgroup v2 (kubelet 1.37 resets it).
    pub kubepods_memory_low: Option<i64>,
}

/// `burstable` shares = shares(sum of Burstable cpu requests), `besteffort` shares 2. Memory
/// QoS (`setMemoryQoS`, kubelet 1.37), where the node has its files (`tiered`: `None` on
/// cgroup v1): under `TieredReservation` (`Some(true)`), `memory.low` of burstable = the sum
/// of Burstable memory requests and `memory.min` of kubepods = that plus the Guaranteed
/// requests; otherwise (`Some(false)`: the gate off or the policy `None`) those and kubepods'
/// `memory.low` reset to 0, as kubelet resets them. Pods are API-defaulted here.
pub fn qos_tier_values<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    tiered: Option<bool>,
) -> TierValues {
    let pods: Vec<Pod> = pods
        .into_iter()
        .map(|p| {
            let mut p = p.clone();
            resources::apply_defaults(&mut p);
            p
        })
        .collect();
    let memory_of = |class: QosClass| -> i64 {
        pods.iter()
            .filter(|p| qos::pod_qos(p) == class)
            .map(|p| {
                resources::pod_requests(p)
                    .get("memory")
                    .map_or(0, crate::quantity::Quantity::value)
            })
            .fold(0, i64::saturating_add)
    };
    let (burstable_low, kubepods_min) = match tiered {
        None => (None, None),
        Some(false) => (Some(0), Some(0)),
        Some(true) => {
            let b = memory_of(QosClass::Burstable);
            (
                Some(b),
                Some(b.saturating_add(memory_of(QosClass::Guaranteed))),
            )
        }
    };
    TierValues {
        burstable: CgroupValues {
            cpu_shares: Some(burstable_tier_shares(&pods)),
            memory_low: burstable_low,
            ..CgroupValues::default()
        },
        besteffort: CgroupValues {
            cpu_shares: Some(milli_cpu_to_shares(0)),
            ..CgroupValues::default()
        },
        kubepods_memory_min: kubepods_min,
        kubepods_memory_low: tiered.map(|_| 0),
    }
}

/// What a pod cgroup gets from the decision core's [`PodCgroupValues`]: shares, quota (or
/// unlimited), period, memory limit (or unlimited), and `memory.min` under Memory QoS.
pub fn pod_values(v: &PodCgroupValues) -> CgroupValues {
    CgroupValues {
        cpu_shares: Some(v.cpu_shares),
        cpu_quota: Some(v.cpu_quota_micros),
        cpu_period: v.cpu_period_micros,
        memory_limit: Some(v.memory_limit_bytes),
        memory_min: v.memory_min_bytes,
        memory_low: v.memory_low_bytes,
        pids_max: v.pids_limit,
    }
}

/// The kubepods hierarchy below one cgroup root on this node's hierarchies, made and removed
/// by the driver's [`CgroupManager`], the values written through the [`CgroupWriter`].
#[derive(Clone, Debug)]
pub struct Kubepods {
    /// The cgroup root (cgroupfs form: `/` or e.g. `/enforcer-test-1`).
    root: String,
    layout: CgroupLayout,
    writer: Arc<dyn CgroupWriter>,
    manager: Arc<dyn CgroupManager>,
}

impl Kubepods {
    /// The cgroupfs driver on the real hierarchies ([`KernelCgroups`]).
    #[must_use]
    pub fn new(root: &str, layout: CgroupLayout) -> Self {
        Self::with_writer(root, layout, Arc::new(KernelCgroups))
    }

    /// The cgroupfs driver, writing through `writer`.
    #[must_use]
    pub fn with_writer(root: &str, layout: CgroupLayout, writer: Arc<dyn CgroupWriter>) -> Self {
        let manager = Arc::new(Cgroupfs::new(root, layout.clone(), writer.clone()));
        Self::with_manager(root, layout, writer, manager)
    }

    /// The driver `manager` makes the cgroups, `writer` writes their values.
    #[must_use]
    pub fn with_manager(
        root: &str,
        layout: CgroupLayout,
        writer: Arc<dyn CgroupWriter>,
        manager: Arc<dyn CgroupManager>,
    ) -> Self {
        Self {
            root: format!("/{}", root.trim_matches('/')),
            layout,
            writer,
            manager,
        }
    }

    /// For `driver` on the real hierarchies: cgroupfs, or systemd over the system bus (an
    /// error when systemd does not answer there).
    pub fn for_driver(
        root: &str,
        layout: CgroupLayout,
        driver: CgroupDriver,
    ) -> Result<Self, CgroupError> {
        Ok(match driver {
            CgroupDriver::Cgroupfs => Self::new(root, layout),
            CgroupDriver::Systemd => {
                let manager = Arc::new(SystemdSlices::connect(layout.clone())?);
                Self::with_manager(root, layout, Arc::new(KernelCgroups), manager)
            }
        })
    }

    /// Where every cgroup value goes.
    #[must_use]
    pub fn writer(&self) -> &Arc<dyn CgroupWriter> {
        &self.writer
    }

    /// How cgroups are made and removed.
    #[must_use]
    pub fn manager(&self) -> &Arc<dyn CgroupManager> {
        &self.manager
    }

    #[must_use]
    pub fn driver(&self) -> CgroupDriver {
        self.manager.driver()
    }

    #[must_use]
    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    /// The cgroup root as kubelet's configuration gives it (`/`, `/enforcer-test-1`).
    #[must_use]
    pub fn root(&self) -> &str {
        &self.root
    }

    /// A cgroup's path relative to each hierarchy, in the driver's form.
    #[must_use]
    pub fn path_of(&self, name: &CgroupName) -> String {
        self.driver().name(name)
    }

    /// `<root>/kubepods` (`/kubepods.slice` with systemd).
    #[must_use]
    pub fn kubepods_path(&self) -> String {
        self.path_of(&cgroup_name::kubepods(&self.root))
    }

    /// The relative path of a QoS tier cgroup (`kubepods` itself for Guaranteed).
    #[must_use]
    pub fn tier_path(&self, tier: QosTier) -> String {
        self.path_of(&cgroup_name::qos_tier(&self.root, tier_class(tier)))
    }

    /// The memory hierarchy (v2 values such as `memory.min` need it).
    #[must_use]
    pub fn memory(&self) -> Option<super::Hierarchy<'_>> {
        self.layout.memory()
    }

    /// Makes `name` exist (the driver) where the memory and cpu controllers live (and the
    /// pids controller, when a limit is set) and writes `values` there.
    pub fn apply(&self, name: &CgroupName, values: &CgroupValues) -> Result<(), CgroupError> {
        self.manager.create(name, values)?;
        let rel = self.path_of(name);
        for ctrl in ["memory", "cpu"] {
            let Some((mount, version)) = self.layout.controller(ctrl) else {
                continue;
            };
            let dir = join_inside(mount, &rel)?;
            match ctrl {
                "memory" => self.writer.set_memory(&dir, mount, version, values)?,
                _ => self.writer.set_cpu(&dir, mount, version, values)?,
            }
        }
        if let Some(max) = values.pids_max
            && let Some((mount, version)) = self.layout.controller("pids")
        {
            let dir = join_inside(mount, &rel)?;
            self.writer.set_pids(&dir, mount, version, max)?;
        }
        Ok(())
    }

    /// Writes the kubepods cgroup and both QoS tiers.
    pub fn apply_node(
        &self,
        kubepods: &CgroupValues,
        tiers: &TierValues,
    ) -> Result<(), CgroupError> {
        let mut top = kubepods.clone();
        if tiers.kubepods_memory_min.is_some() {
            top.memory_min = tiers.kubepods_memory_min;
        }
        if tiers.kubepods_memory_low.is_some() {
            top.memory_low = tiers.kubepods_memory_low;
        }
        self.apply(&cgroup_name::kubepods(&self.root), &top)?;
        let tier = |t| cgroup_name::qos_tier(&self.root, t);
        self.apply(&tier(QosClass::Burstable), &tiers.burstable)?;
        self.apply(&tier(QosClass::BestEffort), &tiers.besteffort)
    }
}

fn tier_class(tier: QosTier) -> QosClass {
    match tier {
        QosTier::Guaranteed => QosClass::Guaranteed,
        QosTier::Burstable => QosClass::Burstable,
        QosTier::BestEffort => QosClass::BestEffort,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::policy::resources::{
        cgroup::{CgroupOptions, pod_cgroup_values, shares_to_weight},
        test_pods::{container, pod},
    };

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    #[test]
    fn kubepods_from_allocatable_or_capacity() {
        let node = NodeResources {
            cpu_milli: 2000,
            memory: 400 << 20,
            reserved_cpu_milli: 500,
            reserved_memory: 100 << 20,
            enforce_pods: true,
        };
        let v = kubepods_values(&node);
        assert_eq!(v.cpu_shares, Some(1536));
        assert_eq!(v.memory_limit, Some(Some(300 << 20)));
        let v = kubepods_values(&NodeResources {
            enforce_pods: false,
            ..node
        });
        assert_eq!(
            (v.cpu_shares, v.memory_limit),
            (Some(2048), Some(Some(400 << 20)))
        );
    }

    #[test]
    fn tiers_follow_the_pods() {
        let g = pod(
            "g",
            vec![container("a", "cpu=1,memory=1Gi", "cpu=1,memory=1Gi")],
        );
        let b1 = pod("b1", vec![container("a", "cpu=200m,memory=100Mi", "")]);
        let b2 = pod("b2", vec![container("a", "cpu=300m", "cpu=1")]);
        let be = pod("e", vec![container("a", "", "")]);
        let t = qos_tier_values([&g, &b1, &b2, &be], None);
        assert_eq!(t.burstable.cpu_shares, Some(512));
        assert_eq!(t.besteffort.cpu_shares, Some(2));
        let memory = |t: &TierValues| {
            (
                t.burstable.memory_low,
                t.burstable.memory_min,
                t.kubepods_memory_min,
                t.kubepods_memory_low,
                t.besteffort.memory_min,
                t.besteffort.memory_low,
            )
        };
        assert_eq!(
            memory(&t),
            (None, None, None, None, None, None),
            "cgroup v1"
        );
        // TieredReservation: burstable memory.low = Burstable requests, kubepods memory.min
        // = those and the Guaranteed ones; kubepods memory.low 0.
        let t = qos_tier_values([&g, &b1, &be], Some(true));
        assert_eq!(
            memory(&t),
            (
                Some(100 << 20),
                None,
                Some((100 << 20) + (1 << 30)),
                Some(0),
                None,
                None
            )
        );
        // The gate off or the policy None on cgroup v2: reset to 0, as kubelet 1.37 does.
        let t = qos_tier_values([&g, &b1], Some(false));
        assert_eq!(memory(&t), (Some(0), None, Some(0), Some(0), None, None));
        // No Burstable pods: the minimum shares.
        assert_eq!(qos_tier_values([&g], None).burstable.cpu_shares, Some(2));
    }

    /// kubelet's `TestQoSContainerCgroup` (its rows without DRA) and
    /// `TestQoSContainerCgroupWithMemoryReservationPolicyNone`: kubepods `memory.min` and the
    /// burstable tier's `memory.low` under `TieredReservation`, 0 under `None`.
    #[test]
    fn kubelets_qos_container_cgroup() {
        let g = pod(
            "guaranteed-pod",
            vec![container("c", "cpu=1,memory=128Mi", "cpu=1,memory=128Mi")],
        );
        let b1 = pod(
            "burstable-pod-1",
            vec![container("c", "cpu=1,memory=128Mi", "cpu=2,memory=256Mi")],
        );
        let b2 = pod(
            "burstable-pod-2",
            vec![container("c", "cpu=2,memory=256Mi", "")],
        );
        let be = pod("best-effort", vec![container("c", "", "")]);
        let no_memory = pod("burstable-cpu", vec![container("c", "cpu=1", "")]);
        let mut pod_level = pod(
            "burstable-pod-level",
            vec![container("c", "memory=128Mi", "memory=256Mi")],
        );
        if let Some(spec) = pod_level.spec.as_mut() {
            spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
                requests: Some(
                    [(
                        "memory".to_owned(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity("512Mi".into()),
                    )]
                    .into(),
                ),
                ..Default::default()
            });
        }
        let mi = |v: i64| Some(v << 20);
        for (name, pods, want) in [
            (
                "writes aggregated memory min",
                vec![&g, &b1, &b2],
                (mi(512), mi(384)),
            ),
            (
                "writes zero memory min for best effort pod",
                vec![&be],
                (mi(0), mi(0)),
            ),
            (
                "writes zero memory min for burstable pod without memory request",
                vec![&no_memory],
                (mi(0), mi(0)),
            ),
            (
                "clears stale memory min when all pods removed",
                vec![],
                (mi(0), mi(0)),
            ),
            (
                "writes memory min with pod-level resources",
                vec![&g, &pod_level],
                (mi(640), mi(512)),
            ),
        ] {
            let t = qos_tier_values(pods.iter().copied(), Some(true));
            assert_eq!(
                (t.kubepods_memory_min, t.burstable.memory_low),
                want,
                "{name}"
            );
        }
        let none = qos_tier_values([&g, &b1], Some(false));
        assert_eq!(
            (none.kubepods_memory_min, none.burstable.memory_low),
            (mi(0), mi(0)),
            "TestQoSContainerCgroupWithMemoryReservationPolicyNone"
        );
    }

    /// A fake hierarchy in a temp dir: plain files, so what the controllers write is visible.
    fn fake_layout(root: &Path, v2: bool) -> CgroupLayout {
        if v2 {
            CgroupLayout {
                v1: Vec::new(),
                unified: Some(root.to_path_buf()),
                unified_controllers: vec!["cpu".into(), "memory".into(), "pids".into()],
            }
        } else {
            let mount = |c: &str| super::super::V1Mount {
                mount: root.join(c),
                controllers: vec![c.to_owned()],
                hierarchy_id: Some(1),
            };
            CgroupLayout {
                v1: vec![mount("memory"), mount("cpu")],
                unified: None,
                unified_controllers: Vec::new(),
            }
        }
    }

    /// The plan of writes, through the recording writer: on v2 each directory below the root
    /// is created after its parent delegated the controllers; never above the root.
    #[test]
    fn apply_node_creates_delegates_and_writes_in_order() {
        let w = Arc::new(crate::cgroup::writer::RecordingCgroups::default());
        let k = Kubepods::with_writer("/r", fake_layout(Path::new("/u"), true), w.clone());
        let kubepods = CgroupValues {
            memory_limit: Some(Some(1 << 30)),
            ..CgroupValues::default()
        };
        let tiers = qos_tier_values([], None);
        k.apply_node(&kubepods, &tiers).unwrap();
        let ops = w.ops();
        let memory: Vec<&String> = ops.iter().filter(|o| o.starts_with("memory ")).collect();
        assert_eq!(
            memory,
            [
                "memory /u/r/kubepods V2 limit=Some(Some(1073741824)) min=None low=None",
                "memory /u/r/kubepods/burstable V2 limit=None min=None low=None",
                "memory /u/r/kubepods/besteffort V2 limit=None min=None low=None",
            ]
        );
        let pos = |op: &str| ops.iter().position(|o| o == op).unwrap_or(usize::MAX);
        assert!(pos("delegate /u/r cpu,memory,pids") < pos("mkdir /u/r/kubepods"));
        assert!(
            pos("delegate /u/r/kubepods cpu,memory,pids") < pos("mkdir /u/r/kubepods/burstable")
        );
        assert!(
            !ops.iter().any(|o| o.starts_with("delegate /u ")),
            "{ops:?}"
        );
    }

    #[test]
    fn writes_v1_and_v2_files_inside_the_root() {
        let g = pod(
            "g",
            vec![container(
                "a",
                "cpu=500m,memory=64Mi",
                "cpu=500m,memory=64Mi",
            )],
        );
        let dir = tempfile::tempdir().unwrap();
        // cgroup v1
        for m in ["memory", "cpu"] {
            std::fs::create_dir_all(dir.path().join(m)).unwrap();
        }
        let k = Kubepods::new("/r", fake_layout(dir.path(), false));
        let rel = &CgroupName::from_cgroupfs("/r/kubepods/podg");
        let v = pod_cgroup_values(
            &g,
            &CgroupOptions {
                v2: false,
                ..CgroupOptions::default()
            },
        );
        k.apply(rel, &pod_values(&v)).unwrap();
        // podPidsLimit unset (-1): pids.max is left alone (and no pids hierarchy here).
        assert_eq!((v.pids_limit, pod_values(&v).pids_max), (None, None));
        let mem = dir.path().join("memory/r/kubepods/podg");
        let cpu = dir.path().join("cpu/r/kubepods/podg");
        assert_eq!(
            read(&mem.join("memory.limit_in_bytes")),
            (64 << 20).to_string()
        );
        assert_eq!(read(&cpu.join("cpu.shares")), "512");
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "50000");
        assert_eq!(read(&cpu.join("cpu.cfs_period_us")), "100000");
        // cgroup v2, with Memory QoS
        let dir2 = tempfile::tempdir().unwrap();
        let k = Kubepods::new("/r", fake_layout(dir2.path(), true));
        let cg = dir2.path().join("r/kubepods/podg");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("cpu.max"), "max 100000\n").unwrap();
        let v = pod_cgroup_values(
            &g,
            &CgroupOptions {
                memory_qos: true,
                tiered_reservation: true,
                pod_pids_limit: 100,
                ..CgroupOptions::default()
            },
        );
        assert_eq!(v.pids_limit, Some(100));
        k.apply(rel, &pod_values(&v)).unwrap();
        assert_eq!(read(&cg.join("pids.max")), "100");
        assert_eq!(read(&cg.join("memory.max")), (64 << 20).to_string());
        assert_eq!(read(&cg.join("memory.min")), (64 << 20).to_string());
        assert_eq!(
            read(&cg.join("cpu.weight")),
            shares_to_weight(512).to_string()
        );
        assert_eq!(read(&cg.join("cpu.max")), "50000 100000");
        // Controllers are delegated from the root down, never above it.
        assert!(dir2.path().join("r/cgroup.subtree_control").exists());
        assert!(!dir2.path().join("cgroup.subtree_control").exists());
        // Unlimited is written as such.
        k.apply(
            rel,
            &CgroupValues {
                memory_limit: Some(None),
                cpu_quota: Some(None),
                ..CgroupValues::default()
            },
        )
        .unwrap();
        assert_eq!(read(&cg.join("memory.max")), "max");
        assert!(read(&cg.join("cpu.max")).starts_with("max"));
        // Escapes are refused.
        assert!(
            k.apply(
                &CgroupName::from_cgroupfs("/r/../x"),
                &CgroupValues::default()
            )
            .is_err()
        );
    }
}
