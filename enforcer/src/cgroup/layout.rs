//! Which cgroup hierarchies this node has and where they are mounted.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use super::{CgroupError, WithPath as _};

/// cgroup version of a controller's hierarchy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

impl CgroupVersion {
    /// `v1` or `v2`, as reports print it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
        }
    }
}

/// One mounted cgroup v1 hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V1Mount {
    /// Where it is mounted, e.g. `/sys/fs/cgroup/memory`.
    pub mount: PathBuf,
    /// Controllers bound to it (`memory`, `cpu`, `cpuacct`, ...) or `name=systemd`.
    pub controllers: Vec<String>,
    /// Kernel hierarchy id (from /proc/cgroups), when a controller names it.
    pub hierarchy_id: Option<u32>,
}

/// The node's cgroup layout: v1 hierarchies, the unified (v2) hierarchy and its controllers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupLayout {
    pub v1: Vec<V1Mount>,
    pub unified: Option<PathBuf>,
    pub unified_controllers: Vec<String>,
}

impl CgroupLayout {
    /// Reads /proc/self/mountinfo, /proc/cgroups and the unified root's cgroup.controllers.
    pub fn discover() -> Result<Self, CgroupError> {
        let mountinfo =
            fs::read_to_string("/proc/self/mountinfo").with_path("/proc/self/mountinfo")?;
        let proc_cgroups = fs::read_to_string("/proc/cgroups").unwrap_or_default();
        let mut layout = Self::parse(&mountinfo, &proc_cgroups);
        if let Some(unified) = &layout.unified {
            let path = unified.join("cgroup.controllers");
            let text = fs::read_to_string(&path).with_path(&path)?;
            layout.unified_controllers = text.split_whitespace().map(str::to_owned).collect();
        }
        Ok(layout)
    }

    /// Pure parse of mountinfo and /proc/cgroups text.
    #[must_use]
    pub fn parse(mountinfo: &str, proc_cgroups: &str) -> Self {
        let mut ids: HashMap<&str, u32> = HashMap::new();
        for line in proc_cgroups.lines().filter(|l| !l.starts_with('#')) {
            let mut f = line.split_whitespace();
            if let (Some(name), Some(id)) = (f.next(), f.next())
                && let Ok(id) = id.parse()
            {
                ids.insert(name, id);
            }
        }
        let mut layout = Self::default();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let left: Vec<&str> = left.split_whitespace().collect();
            let right: Vec<&str> = right.split_whitespace().collect();
            let (Some(mount), Some(fstype)) = (left.get(4), right.first()) else {
                continue;
            };
            let mount = PathBuf::from(unescape_mount(mount));
            match *fstype {
                "cgroup2" if layout.unified.is_none() => layout.unified = Some(mount),
                "cgroup" => {
                    let opts = right.get(2).copied().unwrap_or("");
                    let controllers: Vec<String> = opts
                        .split(',')
                        .filter(|o| ids.contains_key(o) || o.starts_with("name="))
                        .map(str::to_owned)
                        .collect();
                    let hierarchy_id = controllers
                        .iter()
                        .find_map(|c| ids.get(c.as_str()).copied());
                    if !layout.v1.iter().any(|m| m.controllers == controllers) {
                        layout.v1.push(V1Mount {
                            mount,
                            controllers,
                            hierarchy_id,
                        });
                    }
                }
                _ => {}
            }
        }
        layout
    }

    /// Whether the memory controller is mounted (v1, or enabled in the unified hierarchy).
    #[must_use]
    pub fn memory_mounted(&self) -> bool {
        self.controller("memory").is_some()
    }

    /// Whether the memory controller is on cgroup v2 (memory QoS, PSI, `memory.high`).
    #[must_use]
    pub fn memory_on_v2(&self) -> bool {
        matches!(self.controller("memory"), Some((_, CgroupVersion::V2)))
    }

    /// Where a controller lives: its v1 mount, or the unified mount when enabled there.
    #[must_use]
    pub fn controller(&self, name: &str) -> Option<(&Path, CgroupVersion)> {
        if let Some(m) = self
            .v1
            .iter()
            .find(|m| m.controllers.iter().any(|c| c == name))
        {
            return Some((&m.mount, CgroupVersion::V1));
        }
        let unified = self.unified.as_deref()?;
        self.unified_controllers
            .iter()
            .any(|c| c == name)
            .then_some((unified, CgroupVersion::V2))
    }

    /// The mount of the hierarchy with this kernel id (0 is the unified hierarchy).
    #[must_use]
    pub fn hierarchy_mount(&self, id: u32) -> Option<&Path> {
        if id == 0 {
            return self.unified.as_deref();
        }
        self.v1
            .iter()
            .find(|m| m.hierarchy_id == Some(id))
            .map(|m| m.mount.as_path())
    }

    /// A short name for a hierarchy id: `unified`, or its controllers joined by `,`.
    #[must_use]
    pub fn hierarchy_name(&self, id: u32) -> String {
        if id == 0 {
            return "unified".to_owned();
        }
        self.v1
            .iter()
            .find(|m| m.hierarchy_id == Some(id))
            .map_or_else(|| format!("hierarchy-{id}"), |m| m.controllers.join(","))
    }

    /// `v1`, `v2` or `hybrid` (v1 controllers with a cgroup2 mount beside them).
    #[must_use]
    pub fn mode(&self) -> &'static str {
        match (
            self.v1.iter().any(|m| m.hierarchy_id.is_some()),
            self.unified.is_some(),
        ) {
            (true, true) => "hybrid",
            (true, false) => "v1",
            (false, true) => "v2",
            (false, false) => "none",
        }
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
24 30 0:22 / /sys rw - sysfs sysfs rw
31 24 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
33 31 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
36 31 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
37 31 0:32 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
";
    const PROC_CGROUPS: &str = "#subsys_name\thierarchy\tnum_cgroups\tenabled
cpu\t3\t1\t1
cpuacct\t3\t1\t1
memory\t4\t40\t1
hugetlb\t0\t1\t1
";

    #[test]
    fn parses_hybrid_layout() {
        let l = CgroupLayout::parse(HYBRID, PROC_CGROUPS);
        assert_eq!(
            l.unified.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(l.mode(), "hybrid");
        assert_eq!(
            l.controller("memory"),
            Some((Path::new("/sys/fs/cgroup/memory"), CgroupVersion::V1))
        );
        assert_eq!(
            l.hierarchy_mount(4),
            Some(Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            l.hierarchy_mount(0),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(l.hierarchy_name(3), "cpu,cpuacct");
        assert_eq!(l.hierarchy_name(9), "hierarchy-9");
        assert_eq!(l.controller("pids"), None);
    }

    #[test]
    fn parses_pure_v2_layout() {
        let mi = "30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let mut l = CgroupLayout::parse(mi, "");
        l.unified_controllers = vec!["memory".into(), "pids".into()];
        assert_eq!(l.mode(), "v2");
        assert_eq!(
            l.controller("memory"),
            Some((Path::new("/sys/fs/cgroup"), CgroupVersion::V2))
        );
    }

    #[test]
    fn ignores_garbage_lines() {
        let l = CgroupLayout::parse("garbage\n1 2 3\n - cgroup\n", "x y z\n");
        assert_eq!(l, CgroupLayout::default());
    }
}
