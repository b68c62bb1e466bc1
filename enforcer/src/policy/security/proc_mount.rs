//! `procMount`: the masked and read-only `/proc` paths kubelet gives a container
//! (`pkg/securitycontext/util.go`), and every container's effective `procMount`.

use k8s_openapi::api::core::v1::Pod;

use super::{effective_of, security_contexts};

/// kubelet's (and moby's) default masked paths.
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// kubelet's (and moby's) default read-only paths.
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// `procMount: Unmasked`.
pub const UNMASKED_PROC_MOUNT: &str = "Unmasked";

/// `ConvertToRuntimeMaskedPaths`: none for `procMount: Unmasked`, else the defaults.
#[must_use]
pub fn masked_paths(proc_mount: Option<&str>) -> Vec<String> {
    if proc_mount == Some(UNMASKED_PROC_MOUNT) {
        Vec::new()
    } else {
        DEFAULT_MASKED_PATHS
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    }
}

/// `ConvertToRuntimeReadonlyPaths`: none for `procMount: Unmasked`, else the defaults.
#[must_use]
pub fn readonly_paths(proc_mount: Option<&str>) -> Vec<String> {
    if proc_mount == Some(UNMASKED_PROC_MOUNT) {
        Vec::new()
    } else {
        DEFAULT_READONLY_PATHS
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    }
}

/// The effective `procMount` of every container (init, regular, ephemeral).
pub fn proc_mounts(pod: &Pod) -> impl Iterator<Item = (&str, Option<String>)> {
    security_contexts(pod).map(move |(n, s)| (n, effective_of(pod, s).proc_mount))
}
