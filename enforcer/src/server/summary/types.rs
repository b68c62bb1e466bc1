//! kubelet's `stats/v1alpha1` types, reduced to the fields served.

use serde::Serialize;

pub use crate::stats::psi::{PsiData, PsiStats};

/// `Summary`.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

/// `NodeStats`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    pub start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

/// `RuntimeStats`.
#[derive(Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
    /// The filesystem of the containers' writable layers (the image filesystem's figures
    /// when the runtime names none apart, as kubelet's CRI stats provider reports it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_fs: Option<FsStats>,
}

/// `MemoryStats`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Memory PSI (cgroup v2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// `IOStats`: the cgroup's IO pressure (cgroup v2).
#[derive(Debug, Serialize)]
pub struct IoStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// `SwapStats`: usage, and what is left below the limit (none when unlimited).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_usage_bytes: Option<u64>,
}

/// `FsStats` (also the body of `VolumeStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

/// `PodReference`.
#[derive(Debug, Serialize)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

/// `VolumeStats`.
#[derive(Debug, Serialize)]
pub struct VolumeStats {
    pub name: String,
    #[serde(flatten)]
    pub fs: FsStats,
}

/// `ProcessStats`.
#[derive(Debug, Serialize)]
pub struct ProcessStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_count: Option<u64>,
}

/// `PodStats`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub start_time: String,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volume: Vec<VolumeStats>,
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
    #[serde(rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
}

/// `ContainerStats`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
}

/// `RlimitStats`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RlimitStats {
    pub time: String,
    pub maxpid: Option<i64>,
    pub curproc: Option<i64>,
}

/// `CPUStats`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
    /// CPU PSI (cgroup v2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}
