//! The figures of a cgroup cAdvisor serves beside CPU usage and the working set, as it reads
//! them on either cgroup version: memory usage (`memory.current` / `memory.usage_in_bytes`),
//! RSS and page cache (`memory.stat` `anon` / `file` on v2, `total_rss` / `total_cache` on
//! v1), swap (`memory.swap.current` on v2, memory+swap less memory on v1) and the CFS
//! counters of `cpu.stat` (`nr_periods`, `nr_throttled`, `throttled_usec` on v2 or
//! `throttled_time` in ns on v1).

use std::path::{Path, PathBuf};

use crate::cgroup::{CgroupLayout, CgroupVersion, paths};

/// A cgroup's figures; each `None` where its file is absent or unreadable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    pub usage: Option<u64>,
    pub rss: Option<u64>,
    pub cache: Option<u64>,
    pub swap: Option<u64>,
    pub cfs: Option<Cfs>,
}

/// The CFS bandwidth counters of `cpu.stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cfs {
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
}

/// The directory of the cgroup `rel` (with the container `id` below it, in either driver's
/// layout) in the hierarchy of `controller`.
fn dir_of(
    layout: &CgroupLayout,
    controller: &str,
    rel: &str,
    id: Option<&str>,
) -> Option<(PathBuf, CgroupVersion)> {
    let (mount, version) = layout.controller(controller)?;
    let dir = paths::join_inside(mount, rel).ok()?;
    let dir = match id {
        Some(id) => paths::container_dir(&dir, id).ok()?,
        None => dir,
    };
    Some((dir, version))
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The value of `key` in a flat keyed file (`memory.stat`, `cpu.stat`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// The figures of the cgroup `rel` (or its container `id`).
#[must_use]
pub fn read(layout: &CgroupLayout, rel: &str, id: Option<&str>) -> Figures {
    let mut out = Figures::default();
    if let Some((dir, version)) = dir_of(layout, "memory", rel, id) {
        let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
        match version {
            CgroupVersion::V2 => {
                out.usage = read_u64(&dir.join("memory.current"));
                out.rss = keyed(&stat, "anon");
                out.cache = keyed(&stat, "file");
                out.swap = read_u64(&dir.join("memory.swap.current"));
            }
            CgroupVersion::V1 => {
                out.usage = read_u64(&dir.join("memory.usage_in_bytes"));
                out.rss = keyed(&stat, "total_rss");
                out.cache = keyed(&stat, "total_cache");
                out.swap = read_u64(&dir.join("memory.memsw.usage_in_bytes"))
                    .zip(out.usage)
                    .map(|(memsw, usage)| memsw.saturating_sub(usage));
            }
        }
    }
    if let Some((dir, version)) = dir_of(layout, "cpu", rel, id) {
        out.cfs = std::fs::read_to_string(dir.join("cpu.stat"))
            .ok()
            .and_then(|text| cfs(&text, version));
    }
    out
}

/// The CFS counters of a `cpu.stat` text.
fn cfs(text: &str, version: CgroupVersion) -> Option<Cfs> {
    let throttled_ns = match version {
        CgroupVersion::V2 => keyed(text, "throttled_usec")?.saturating_mul(1000),
        CgroupVersion::V1 => keyed(text, "throttled_time")?,
    };
    Some(Cfs {
        periods: keyed(text, "nr_periods")?,
        throttled_periods: keyed(text, "nr_throttled")?,
        throttled_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both versions' files, read as cAdvisor reads them, in a fake hierarchy.
    #[test]
    fn both_versions_files_read_as_cadvisor_reads_them() {
        let d = tempfile::tempdir().expect("tempdir");
        let w = |rel: &str, file: &str, text: &str| {
            let dir = d.path().join(rel);
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join(file), text).expect("write");
        };
        // cgroup v2: one hierarchy.
        w("u/kubepods/podx", "memory.current", "1000\n");
        w(
            "u/kubepods/podx",
            "memory.stat",
            "anon 600\nfile 300\nkernel 100\nfile_mapped 7\n",
        );
        w("u/kubepods/podx", "memory.swap.current", "50\n");
        w(
            "u/kubepods/podx/c1",
            "cpu.stat",
            "usage_usec 9\nnr_periods 20\nnr_throttled 5\nthrottled_usec 1500\n",
        );
        let mountinfo = format!(
            "30 25 0:26 / {} rw - cgroup2 cgroup2 rw\n",
            d.path().join("u").display()
        );
        let mut v2 = CgroupLayout::parse(&mountinfo, "memory 0 1 1\ncpu 0 1 1\n");
        v2.unified_controllers = vec!["memory".into(), "cpu".into()];
        let f = read(&v2, "/kubepods/podx", None);
        assert_eq!(
            (f.usage, f.rss, f.cache, f.swap),
            (Some(1000), Some(600), Some(300), Some(50))
        );
        assert_eq!(
            read(&v2, "/kubepods/podx", Some("c1")).cfs,
            Some(Cfs {
                periods: 20,
                throttled_periods: 5,
                throttled_ns: 1_500_000
            })
        );
        // cgroup v1: a hierarchy per controller; swap is memory+swap less memory.
        w("m/kubepods/podx", "memory.usage_in_bytes", "2000\n");
        w("m/kubepods/podx", "memory.memsw.usage_in_bytes", "2500\n");
        w(
            "m/kubepods/podx",
            "memory.stat",
            "cache 1\nrss 2\ntotal_cache 800\ntotal_rss 900\n",
        );
        w(
            "c/kubepods/podx",
            "cpu.stat",
            "nr_periods 3\nnr_throttled 1\nthrottled_time 777\n",
        );
        let mountinfo = format!(
            "30 25 0:26 / {} rw - cgroup cgroup rw,memory\n31 25 0:27 / {} rw - cgroup cgroup rw,cpu\n",
            d.path().join("m").display(),
            d.path().join("c").display()
        );
        let v1 = CgroupLayout::parse(&mountinfo, "memory 5 1 1\ncpu 6 1 1\n");
        let f = read(&v1, "/kubepods/podx", None);
        assert_eq!(
            (f.usage, f.rss, f.cache, f.swap),
            (Some(2000), Some(900), Some(800), Some(500))
        );
        assert_eq!(
            f.cfs,
            Some(Cfs {
                periods: 3,
                throttled_periods: 1,
                throttled_ns: 777
            })
        );
        // A cgroup that is not there, or a name that would leave the root: nothing.
        assert_eq!(read(&v1, "/kubepods/gone", None), Figures::default());
        assert_eq!(read(&v1, "/../../etc", None), Figures::default());
    }
}
