//! A pod's cgroup in the memory hierarchy, resolved once (mount, version, directory), and
//! what the eviction manager and the companion do to a pod through it: kill, reap, cap, its
//! limit, whether processes are left, which processes are in it. The callers hold a handle
//! and never ask which cgroup version they are on (youki's cgroup manager).

use std::path::{Path, PathBuf};

use super::{
    CgroupError, CgroupLayout, CgroupVersion, join_inside,
    kill::Reaped,
    writer::{CgroupValues, CgroupWriter},
};

/// A pod cgroup (or any cgroup below kubepods) of the memory hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCgroup {
    mount: PathBuf,
    version: CgroupVersion,
    dir: PathBuf,
}

impl PodCgroup {
    /// `rel` (relative to the hierarchy roots, as kubelet names it for the driver) in
    /// `layout`'s memory hierarchy; `None` without a memory controller or for a path that
    /// would leave the hierarchy.
    #[must_use]
    pub fn resolve(layout: &CgroupLayout, rel: &str) -> Option<Self> {
        let (mount, version) = layout.controller("memory")?;
        let dir = join_inside(mount, rel).ok()?;
        Some(Self {
            mount: mount.to_path_buf(),
            version,
            dir,
        })
    }

    /// Its directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A directory below the same hierarchy's mount, relative to it (a process's cgroup
    /// found under this one), as `resolve` takes it.
    #[must_use]
    pub fn relative(&self, below: &Path) -> Option<String> {
        below
            .strip_prefix(&self.mount)
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    }

    /// Whether the directory is there.
    #[must_use]
    pub fn exists(&self) -> bool {
        self.dir.is_dir()
    }

    /// SIGKILL to every process in it and below, through `writer` (`cgroup.kill` where v2
    /// offers it); how many were signalled (1 for `cgroup.kill`).
    pub fn kill(&self, writer: &dyn CgroupWriter) -> usize {
        writer.kill(&self.dir, self.version)
    }

    /// After [`Self::kill`]: the memory of every process still in it reclaimed now
    /// (`process_mrelease(2)`).
    #[must_use]
    pub fn reap(&self) -> Reaped {
        super::kill::reap_dir(&self.dir)
    }

    /// Caps it at `bytes`: its allocations throttled from there (v2 `memory.high`), or
    /// reclaimed and, past that, OOM-killed inside the pod (v1 `memory.limit_in_bytes`).
    ///
    /// # Errors
    /// The controller file could not be written (named in the error).
    pub fn cap(&self, writer: &dyn CgroupWriter, bytes: i64) -> Result<(), CgroupError> {
        match self.version {
            CgroupVersion::V2 => writer.set_memory_high(&self.dir, &self.mount, Some(bytes)),
            CgroupVersion::V1 => writer.set_memory(
                &self.dir,
                &self.mount,
                self.version,
                &CgroupValues {
                    memory_limit: Some(Some(bytes)),
                    ..Default::default()
                },
            ),
        }
    }

    /// Its memory usage in bytes, page cache included (v2 `memory.current`, v1
    /// `memory.usage_in_bytes`); `None` when unreadable.
    #[must_use]
    pub fn usage(&self) -> Option<i64> {
        let file = match self.version {
            CgroupVersion::V2 => "memory.current",
            CgroupVersion::V1 => "memory.usage_in_bytes",
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Its memory limit in bytes (`None`: unlimited or unreadable).
    #[must_use]
    pub fn limit(&self) -> Option<i64> {
        memory_limit(&self.dir, self.version)
    }

    /// Whether a process is left in it or below.
    #[must_use]
    pub fn populated(&self) -> bool {
        match self.version {
            CgroupVersion::V2 => std::fs::read_to_string(self.dir.join("cgroup.events"))
                .map(|t| t.lines().any(|l| l.trim() == "populated 1"))
                .unwrap_or(false),
            CgroupVersion::V1 => !self.processes(2).is_empty(),
        }
    }

    /// The processes in it and below (down `depth` levels), each with its cgroup directory
    /// (v2 keeps them in leaves; v1 in every level).
    #[must_use]
    pub fn processes(&self, depth: u8) -> Vec<(i32, PathBuf)> {
        let mut out = Vec::new();
        processes_below(&self.dir, depth, &mut out);
        out
    }
}

/// The memory limit in bytes of the memory cgroup `dir` (`None`: unlimited or unreadable).
#[must_use]
pub fn memory_limit(dir: &Path, version: CgroupVersion) -> Option<i64> {
    let file = match version {
        CgroupVersion::V2 => "memory.max",
        CgroupVersion::V1 => "memory.limit_in_bytes",
    };
    let v: i64 = std::fs::read_to_string(dir.join(file))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // v1's "unlimited" is a page-rounded i64::MAX.
    (v < i64::MAX / 2).then_some(v)
}

fn processes_below(dir: &Path, depth: u8, out: &mut Vec<(i32, PathBuf)>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(
            text.lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .map(|p| (p, dir.to_path_buf())),
        );
    }
    if depth == 0 {
        return;
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                processes_below(&e.path(), depth - 1, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(mount: &Path, v1: bool) -> CgroupLayout {
        let fs = if v1 {
            format!(
                "1 0 0:1 / {} rw - cgroup cgroup rw,memory\n",
                mount.display()
            )
        } else {
            format!("1 0 0:1 / {} rw - cgroup2 cgroup2 rw\n", mount.display())
        };
        let mut l = CgroupLayout::parse(&fs, "#subsys_name\thierarchy\nmemory\t3\t1\t1\n");
        if !v1 {
            l.unified_controllers = vec!["memory".to_owned()];
        }
        l
    }

    #[test]
    fn resolved_once_and_read_on_either_version() {
        for v1 in [false, true] {
            let root = tempfile::tempdir().expect("tempdir");
            let pod = root.path().join("kubepods/podu1");
            std::fs::create_dir_all(pod.join("c1")).expect("mkdir");
            let (limit, unlimited) = if v1 {
                ("memory.limit_in_bytes", "9223372036854771712")
            } else {
                ("memory.max", "max")
            };
            std::fs::write(pod.join(limit), "1048576\n").expect("limit");
            let usage = if v1 {
                "memory.usage_in_bytes"
            } else {
                "memory.current"
            };
            std::fs::write(pod.join(usage), "4096\n").expect("usage");
            std::fs::write(pod.join("cgroup.procs"), "").expect("procs");
            std::fs::write(pod.join("c1/cgroup.procs"), "42\n").expect("procs");
            std::fs::write(pod.join("cgroup.events"), "populated 1\n").expect("events");
            let l = layout(root.path(), v1);
            let p = PodCgroup::resolve(&l, "kubepods/podu1").expect("resolved");
            assert!(p.exists());
            assert_eq!(p.limit(), Some(1 << 20), "v1 {v1}");
            assert_eq!(p.usage(), Some(4096), "v1 {v1}");
            assert!(p.populated(), "v1 {v1}");
            assert_eq!(p.processes(2), vec![(42, pod.join("c1"))]);
            assert_eq!(
                p.relative(&pod.join("c1")).as_deref(),
                Some("kubepods/podu1/c1")
            );
            std::fs::write(pod.join(limit), unlimited).expect("limit");
            assert_eq!(p.limit(), None, "unlimited, v1 {v1}");
            assert!(PodCgroup::resolve(&l, "../etc").is_none(), "never outside");
        }
    }
}
