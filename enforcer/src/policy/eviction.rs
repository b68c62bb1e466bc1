//! Kubelet's eviction manager as pure values and functions (`pkg/kubelet/eviction`).
//!
//! - [`threshold`]: signals' thresholds: parsing (`ParseThresholdConfig`), percent resolution,
//!   allocatable copies, met / minimum reclaim.
//! - [`rank`]: memory, disk and pid ranking of pods.
//! - [`manager`]: the eviction manager's `synchronize` as a step function over a [`State`],
//!   the eviction message and node conditions; [`admit`](manager::admit) for eviction admission.

pub mod local_storage;
pub mod manager;
pub mod rank;
pub mod threshold;
pub mod throttle;
pub mod tripwire;

use std::{collections::BTreeMap, fmt, time::Duration};

use serde::{Deserialize, Serialize};

pub use manager::{Action, Eviction, EvictionConfig, Input, State, StepDecision, step};
pub use threshold::{Threshold, ThresholdError, ThresholdValue, parse_threshold_config};

use k8s_openapi::api::core::v1::Pod;

use crate::{policy::resources, quantity::Format};
use rank::PodFacts;

/// An eviction signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Signal {
    /// `memory.available`: node memory capacity - working set of the root cgroup.
    #[serde(rename = "memory.available")]
    MemoryAvailable,
    /// `allocatableMemory.available`: allocatable - working set of kubepods.
    #[serde(rename = "allocatableMemory.available")]
    AllocatableMemoryAvailable,
    /// `nodefs.available`.
    #[serde(rename = "nodefs.available")]
    NodeFsAvailable,
    /// `nodefs.inodesFree`.
    #[serde(rename = "nodefs.inodesFree")]
    NodeFsInodesFree,
    /// `imagefs.available`.
    #[serde(rename = "imagefs.available")]
    ImageFsAvailable,
    /// `imagefs.inodesFree`.
    #[serde(rename = "imagefs.inodesFree")]
    ImageFsInodesFree,
    /// `containerfs.available`.
    #[serde(rename = "containerfs.available")]
    ContainerFsAvailable,
    /// `containerfs.inodesFree`.
    #[serde(rename = "containerfs.inodesFree")]
    ContainerFsInodesFree,
    /// `pid.available`.
    #[serde(rename = "pid.available")]
    PidAvailable,
}

/// The resource an eviction reclaims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Resource {
    /// `memory`.
    #[serde(rename = "memory")]
    Memory,
    /// `ephemeral-storage`.
    #[serde(rename = "ephemeral-storage")]
    EphemeralStorage,
    /// `inodes`.
    #[serde(rename = "inodes")]
    Inodes,
    /// `pids`.
    #[serde(rename = "pids")]
    Pids,
}

impl Resource {
    /// The kubelet resource name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::EphemeralStorage => "ephemeral-storage",
            Self::Inodes => "inodes",
            Self::Pids => "pids",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node condition raised by eviction signals. Ordered by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum NodeCondition {
    /// Disk signals.
    DiskPressure,
    /// Memory signals.
    MemoryPressure,
    /// `pid.available`.
    #[serde(rename = "PIDPressure")]
    PidPressure,
}

impl NodeCondition {
    /// The API name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::DiskPressure => "DiskPressure",
            Self::MemoryPressure => "MemoryPressure",
            Self::PidPressure => "PIDPressure",
        }
    }

    /// The taint key matching the condition (`node.kubernetes.io/memory-pressure`, ...).
    #[must_use]
    pub const fn taint_key(self) -> &'static str {
        match self {
            Self::DiskPressure => "node.kubernetes.io/disk-pressure",
            Self::MemoryPressure => "node.kubernetes.io/memory-pressure",
            Self::PidPressure => "node.kubernetes.io/pid-pressure",
        }
    }
}

impl fmt::Display for NodeCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Signal {
    /// Every signal, in the order the enforcer acts on them.
    pub const ALL: [Self; 9] = [
        Self::MemoryAvailable,
        Self::AllocatableMemoryAvailable,
        Self::NodeFsAvailable,
        Self::NodeFsInodesFree,
        Self::ImageFsAvailable,
        Self::ImageFsInodesFree,
        Self::ContainerFsAvailable,
        Self::ContainerFsInodesFree,
        Self::PidAvailable,
    ];

    /// The kubelet name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::AllocatableMemoryAvailable => "allocatableMemory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::ContainerFsAvailable => "containerfs.available",
            Self::ContainerFsInodesFree => "containerfs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }

    /// Parses a kubelet signal name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|sig| sig.as_str() == s)
    }

    /// `signalToResource`.
    #[must_use]
    pub const fn resource(self) -> Resource {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => Resource::Memory,
            Self::NodeFsAvailable | Self::ImageFsAvailable | Self::ContainerFsAvailable => {
                Resource::EphemeralStorage
            }
            Self::NodeFsInodesFree | Self::ImageFsInodesFree | Self::ContainerFsInodesFree => {
                Resource::Inodes
            }
            Self::PidAvailable => Resource::Pids,
        }
    }

    /// `signalToNodeCondition`.
    #[must_use]
    pub const fn node_condition(self) -> NodeCondition {
        match self.resource() {
            Resource::Memory => NodeCondition::MemoryPressure,
            Resource::EphemeralStorage | Resource::Inodes => NodeCondition::DiskPressure,
            Resource::Pids => NodeCondition::PidPressure,
        }
    }

    /// A memory signal (acted on first).
    #[must_use]
    pub const fn is_memory(self) -> bool {
        matches!(
            self,
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable
        )
    }

    /// A disk signal: kubelet reclaims node-level resources (dead containers, unused images)
    /// before evicting pods for it.
    #[must_use]
    pub const fn reclaims_node_level_first(self) -> bool {
        matches!(
            self.resource(),
            Resource::EphemeralStorage | Resource::Inodes
        )
    }

    /// How kubelet formats observed values of this signal (bytes binary, counts decimal).
    #[must_use]
    pub const fn format(self) -> Format {
        match self.resource() {
            Resource::Memory | Resource::EphemeralStorage => Format::BinarySI,
            Resource::Inodes | Resource::Pids => Format::DecimalSI,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One observation of a signal (`signalObservation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Available amount (bytes, inodes or pids); may be negative.
    pub available: i64,
    /// Capacity the percentages resolve against.
    pub capacity: i64,
    /// When the underlying stats were collected; `None` counts as always fresh.
    pub time: Option<Duration>,
}

/// The observations of one round, by signal.
pub type Observations = std::collections::BTreeMap<Signal, Observation>;

/// Usage of one container (for the eviction message).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerStats {
    /// The container's name.
    pub name: String,
    /// Memory working set in bytes.
    pub memory: Option<i64>,
    /// Ephemeral storage (rootfs + logs) in bytes.
    pub ephemeral_storage: Option<i64>,
}

/// Usage of one pod (kubelet's `statsapi.PodStats`, reduced to what eviction reads).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodStats {
    /// Memory working set in bytes.
    pub memory: Option<i64>,
    /// Ephemeral storage in bytes (containers' rootfs and logs, local volumes).
    pub ephemeral_storage: Option<i64>,
    /// Inodes used.
    pub inodes: Option<i64>,
    /// Processes.
    pub processes: Option<i64>,
    /// Per container, in the order the runtime reports them (shared: a crossing's sample
    /// carries its last figures over without copying them).
    pub containers: std::sync::Arc<[ContainerStats]>,
    /// Bytes used by each emptyDir volume, by volume name (kubelet's `VolumeStats`).
    pub volumes: BTreeMap<String, i64>,
}

/// A pod the manager may evict: the pod and its usage (`None`: no stats).
#[derive(Debug, Clone, Copy)]
pub struct ActivePod<'a> {
    /// The pod (API-defaulted).
    pub pod: &'a Pod,
    /// Its usage.
    pub stats: Option<&'a PodStats>,
    /// What ranking reads from the spec, when the caller keeps it per pod (computed from
    /// `pod` at every step otherwise); it must be [`PodFacts::of`] this pod.
    pub facts: Option<&'a PodFacts>,
}

impl<'a> ActivePod<'a> {
    /// A pod and its usage; its facts are read from the spec when needed.
    #[must_use]
    pub fn new(pod: &'a Pod, stats: Option<&'a PodStats>) -> Self {
        Self {
            pod,
            stats,
            facts: None,
        }
    }

    /// With the pod's facts computed ahead (when it was admitted).
    #[must_use]
    pub fn with_facts(mut self, facts: &'a PodFacts) -> Self {
        self.facts = Some(facts);
        self
    }

    /// `IsCriticalPod`.
    #[must_use]
    pub fn is_critical(&self) -> bool {
        self.facts
            .map_or_else(|| resources::is_critical(self.pod), |f| f.critical)
    }
}
