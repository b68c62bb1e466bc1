//! A controller's hierarchy resolved once (where it is mounted, which cgroup version), asked
//! what it offers: the rest of the daemon never matches on the version nor looks a controller
//! up by name; it asks the handle.

use std::path::{Path, PathBuf};

use super::{CgroupError, CgroupLayout, CgroupVersion, join_inside};

/// One controller's hierarchy: its mount and version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hierarchy<'a> {
    mount: &'a Path,
    version: CgroupVersion,
}

/// How the kernel tells of a memory cgroup's usage crossing a level, on this hierarchy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrossingNotice {
    /// cgroup v1: a usage-threshold eventfd (`cgroup.event_control` on
    /// `memory.usage_in_bytes`), signalled when usage crosses the registered level.
    UsageEventfd,
    /// cgroup v2: `memory.high` placed at the level, whose `high` count in `memory.events`
    /// moves (a file notification) when usage crosses it.
    MemoryEvents,
}

/// Where the node's (the hierarchy root's) memory figures are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootMemory<'a> {
    /// The root cgroup's own usage and stat files (cgroup v1), in this directory.
    Cgroup(&'a Path),
    /// `/proc/meminfo`: the cgroup v2 root has no `memory.current`.
    Meminfo,
}

impl<'a> Hierarchy<'a> {
    /// Where the hierarchy is mounted.
    #[must_use]
    pub fn mount(&self) -> &'a Path {
        self.mount
    }

    /// The cgroup version, for reports (`enforcer doctor`, the probe).
    #[must_use]
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// A cgroup of this hierarchy by its path relative to the root, never outside the mount.
    pub fn dir(&self, rel: &str) -> Result<PathBuf, CgroupError> {
        join_inside(self.mount, rel)
    }

    /// Whether the hierarchy is the unified one, where the kernel's cgroup id of a record
    /// names the cgroup (v1 records carry the unified id, not this hierarchy's).
    #[must_use]
    pub fn ids_name_cgroups(&self) -> bool {
        self.version == CgroupVersion::V2
    }

    /// How the kernel tells of a usage crossing (a memory hierarchy).
    #[must_use]
    pub fn crossing_notice(&self) -> CrossingNotice {
        match self.version {
            CgroupVersion::V1 => CrossingNotice::UsageEventfd,
            CgroupVersion::V2 => CrossingNotice::MemoryEvents,
        }
    }

    /// A memory cgroup's usage file and the `memory.stat` key of its inactive file pages: v1
    /// `memory.usage_in_bytes` and `total_inactive_file` (hierarchical), v2 `memory.current`
    /// and `inactive_file`.
    #[must_use]
    pub fn usage_files(&self) -> (&'static str, &'static str) {
        match self.version {
            CgroupVersion::V1 => ("memory.usage_in_bytes", "total_inactive_file"),
            CgroupVersion::V2 => ("memory.current", "inactive_file"),
        }
    }

    /// Where the root's memory figures are (a memory hierarchy).
    #[must_use]
    pub fn root_memory(&self) -> RootMemory<'a> {
        match self.version {
            CgroupVersion::V1 => RootMemory::Cgroup(self.mount),
            CgroupVersion::V2 => RootMemory::Meminfo,
        }
    }

    /// Whether memory cgroups have a memory QoS (`memory.min`, `memory.low`, `memory.high`)
    /// and a pressure stall file: cgroup v2.
    #[must_use]
    pub fn has_memory_qos(&self) -> bool {
        self.version == CgroupVersion::V2
    }

    /// kubelet's `swapControllerAvailable`: on cgroup v2, `memory.swap.max` in the process's
    /// own cgroup (the root has none; `self_cgroup` is `/proc/self/cgroup`'s text); on v1,
    /// `memory.memsw.limit_in_bytes` at the root.
    #[must_use]
    pub fn swap_controller_available(&self, self_cgroup: &str) -> bool {
        match self.version {
            CgroupVersion::V2 => unified_self_cgroup(self_cgroup)
                .and_then(|own| self.dir(own).ok())
                .is_some_and(|dir| dir.join("memory.swap.max").exists()),
            CgroupVersion::V1 => self.mount.join("memory.memsw.limit_in_bytes").exists(),
        }
    }

    /// A cgroup's pressure files' directory (`cpu.pressure`, `memory.pressure`, `io.pressure`):
    /// cgroup v2 with the root's `cpu.pressure` present (kubelet's `IsPsiEnabled`), so none on
    /// cgroup v1 or with `psi=0`.
    #[must_use]
    pub fn psi_dir(&self, rel: &str) -> Option<PathBuf> {
        (self.version == CgroupVersion::V2 && self.mount.join("cpu.pressure").exists())
            .then(|| self.dir(rel).ok())
            .flatten()
    }

    /// A cgroup's swap files' directory (`memory.swap.current`, `memory.swap.max`): cgroup v2
    /// only, kubelet's swap is v2 only.
    #[must_use]
    pub fn swap_dir(&self, rel: &str) -> Option<PathBuf> {
        (self.version == CgroupVersion::V2)
            .then(|| self.dir(rel).ok())
            .flatten()
    }
}

/// The process's own cgroup on the unified hierarchy (`0::<path>` of `/proc/self/cgroup`).
#[must_use]
pub fn unified_self_cgroup(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim)
}

impl CgroupLayout {
    fn hierarchy(&self, name: &str) -> Option<Hierarchy<'_>> {
        self.controller(name)
            .map(|(mount, version)| Hierarchy { mount, version })
    }

    /// The memory controller's hierarchy, if mounted.
    #[must_use]
    pub fn memory(&self) -> Option<Hierarchy<'_>> {
        self.hierarchy("memory")
    }

    /// The pids controller's hierarchy, if mounted.
    #[must_use]
    pub fn pids(&self) -> Option<Hierarchy<'_>> {
        self.hierarchy("pids")
    }

    /// A cgroup's cumulative CPU time (its path relative to the hierarchy roots), in
    /// nanoseconds: `cpuacct.usage` on cgroup v1, `cpu.stat` `usage_usec` on v2.
    #[must_use]
    pub fn cpu_usage_ns(&self, rel: &str) -> Option<u64> {
        if let Some(Hierarchy {
            mount,
            version: CgroupVersion::V1,
        }) = self.hierarchy("cpuacct")
        {
            let dir = join_inside(mount, rel).ok()?;
            return std::fs::read_to_string(dir.join("cpuacct.usage"))
                .ok()?
                .trim()
                .parse()
                .ok();
        }
        let unified = self.unified.as_deref()?;
        let dir = join_inside(unified, rel).ok()?;
        let stat = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
        stat.lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|us| us.saturating_mul(1000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(mountinfo: &str) -> CgroupLayout {
        let mut l = CgroupLayout::parse(mountinfo, "memory 5 1 1\npids 6 1 1\n");
        if l.unified.is_some() {
            l.unified_controllers = vec!["memory".into(), "pids".into()];
        }
        l
    }

    const V1: &str = "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
    const V2: &str = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";

    #[test]
    fn a_hierarchy_answers_by_its_version() {
        let v1 = layout(V1);
        let m = v1.memory().expect("v1 memory");
        assert_eq!(m.mount(), Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(m.crossing_notice(), CrossingNotice::UsageEventfd);
        assert_eq!(
            m.root_memory(),
            RootMemory::Cgroup(Path::new("/sys/fs/cgroup/memory"))
        );
        assert!(!m.ids_name_cgroups() && !m.has_memory_qos());
        assert_eq!(m.swap_dir("kubepods"), None);
        assert_eq!(m.psi_dir("kubepods"), None, "no PSI on cgroup v1");
        assert_eq!(v1.pids(), None);
        assert_eq!(
            m.usage_files(),
            ("memory.usage_in_bytes", "total_inactive_file")
        );

        let v2 = layout(V2);
        let m = v2.memory().expect("v2 memory");
        assert_eq!(m.crossing_notice(), CrossingNotice::MemoryEvents);
        assert_eq!(m.root_memory(), RootMemory::Meminfo);
        assert_eq!(m.usage_files(), ("memory.current", "inactive_file"));
        assert!(m.ids_name_cgroups() && m.has_memory_qos());
        assert_eq!(
            m.swap_dir("kubepods/pod1"),
            Some(PathBuf::from("/sys/fs/cgroup/kubepods/pod1"))
        );
        assert!(m.dir("../escape").is_err());
        assert_eq!(v2.pids().map(|p| p.version()), Some(CgroupVersion::V2));
    }

    #[test]
    fn the_unified_self_cgroup_is_the_zero_line() {
        let text = "12:memory:/user.slice\n0::/system.slice/enforcer.service\n";
        assert_eq!(
            unified_self_cgroup(text),
            Some("/system.slice/enforcer.service")
        );
        assert_eq!(unified_self_cgroup("12:memory:/x\n"), None);
    }
}
