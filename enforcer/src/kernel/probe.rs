//! Kernel feature probe, logged as one capability line at start.

use std::{fs, path::Path};

use crate::cgroup::{CgroupLayout, CgroupVersion};

/// Tracepoints the eBPF programs attach to, with the fields they read.
pub use super::tracefmt::TRACEPOINTS;

/// Where tracefs is (or will be) mounted.
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// What the kernel offers the enforcer.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    pub kernel: String,
    pub btf: bool,
    pub tracefs_mounted: bool,
    /// Tracepoints found in tracefs (unknown until tracefs is mounted).
    pub tracepoints_missing: Vec<String>,
    pub cgroup_mode: &'static str,
    pub memory_controller: Option<CgroupVersion>,
    pub pids_controller: Option<CgroupVersion>,
    pub psi: bool,
    /// CAP_SYS_RESOURCE: negative oom_score_adj and PSI windows under 2 s need it.
    pub cap_sys_resource: bool,
    pub cap_bpf_or_sys_admin: bool,
    /// The kernel enforces AppArmor (`/sys/module/apparmor/parameters/enabled` is `Y`).
    pub apparmor: bool,
}

/// Where the kernel says whether AppArmor is enabled.
const APPARMOR_ENABLED: &str = "/sys/module/apparmor/parameters/enabled";

/// Whether the kernel enforces AppArmor (kubelet's AppArmor admission needs it for any
/// profile other than `unconfined`).
#[must_use]
pub fn apparmor_enabled() -> bool {
    crate::policy::security::apparmor_enabled_from(
        fs::read_to_string(APPARMOR_ENABLED).ok().as_deref(),
    )
}

impl Capabilities {
    /// Probes this machine.
    #[must_use]
    pub fn probe(layout: &CgroupLayout) -> Self {
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".to_owned());
        let tracefs_mounted = Path::new(TRACEFS).join("events").is_dir();
        let tracepoints_missing = if tracefs_mounted {
            TRACEPOINTS
                .iter()
                .filter(|t| {
                    !Path::new(TRACEFS)
                        .join("events")
                        .join(t.category)
                        .join(t.name)
                        .is_dir()
                })
                .map(|t| format!("{}/{}", t.category, t.name))
                .collect()
        } else {
            Vec::new()
        };
        let caps = effective_caps();
        Self {
            kernel,
            btf: Path::new("/sys/kernel/btf/vmlinux").exists(),
            tracefs_mounted,
            tracepoints_missing,
            cgroup_mode: layout.mode(),
            memory_controller: layout.memory().map(|m| m.version()),
            pids_controller: layout.pids().map(|m| m.version()),
            psi: fs::read_to_string("/proc/pressure/memory").is_ok(),
            cap_sys_resource: caps & (1 << 24) != 0,
            cap_bpf_or_sys_admin: caps & ((1 << 39) | (1 << 21)) != 0,
            apparmor: apparmor_enabled(),
        }
    }

    /// One line for the log.
    #[must_use]
    pub fn summary(&self) -> String {
        let v = |c: Option<CgroupVersion>| c.map_or("absent", CgroupVersion::name);
        format!(
            "kernel {} btf={} tracefs={} tracepoints_missing=[{}] cgroups={} memory={} pids={} psi={} \
             cap_sys_resource={} cap_bpf={} apparmor={}",
            self.kernel,
            self.btf,
            if self.tracefs_mounted {
                "mounted"
            } else {
                "unmounted"
            },
            self.tracepoints_missing.join(","),
            self.cgroup_mode,
            v(self.memory_controller),
            v(self.pids_controller),
            self.psi,
            self.cap_sys_resource,
            self.cap_bpf_or_sys_admin,
            self.apparmor,
        )
    }

    /// The PSI trigger window this process may use: 1 s with CAP_SYS_RESOURCE, else 2 s
    /// (unprivileged triggers need multiples of 2 s).
    #[must_use]
    pub fn psi_window_us(&self) -> u64 {
        if self.cap_sys_resource {
            1_000_000
        } else {
            2_000_000
        }
    }
}

/// Effective capability bits of this process (0 when unreadable).
fn effective_caps() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}
