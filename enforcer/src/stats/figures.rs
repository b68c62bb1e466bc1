//! The figures of a cgroup cAdvisor serves beside CPU usage and the working set, as it reads
//! them on either cgroup version: memory usage (`memory.current` / `memory.usage_in_bytes`),
//! RSS and page cache (`memory.stat` `anon` / `file` on v2, `total_rss` / `total_cache` on
//! v1), swap (`memory.swap.current` on v2, memory+swap less memory on v1) and the CFS
//! counters of `cpu.stat` (`nr_periods`, `nr_throttled`, `throttled_usec` on v2 or
//! `throttled_time` in ns on v1), and its spec: CPU period, quota and shares, memory and swap
//! limits, start time (the cgroup directory's modification time, as cAdvisor's `GetSpec`).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use super::{
    disk_io::{self, DeviceIo, DeviceNumber},
    processes::{self, Processes},
};
use crate::cgroup::{CgroupLayout, CgroupVersion, paths};

/// A cgroup's figures; each `None` where its file is absent or unreadable.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    pub usage: Option<u64>,
    pub rss: Option<u64>,
    pub cache: Option<u64>,
    pub swap: Option<u64>,
    pub cfs: Option<Cfs>,
    pub spec: Spec,
    /// Block I/O by device ([`disk_io`]).
    pub io: BTreeMap<DeviceNumber, DeviceIo>,
    /// Its own processes ([`processes`]).
    pub processes: Option<Processes>,
}

/// A cgroup's spec as cAdvisor reads it; `None` where unread or unlimited (a quota of `max`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spec {
    pub cpu_period: Option<u64>,
    pub cpu_quota: Option<u64>,
    pub cpu_shares: Option<u64>,
    /// Bytes; 0 when unlimited (cAdvisor's `specMemoryValue`).
    pub memory_limit: Option<u64>,
    pub swap_limit: Option<u64>,
    /// Bytes: v2 `memory.min`, v1 `memory.soft_limit_in_bytes` (0 when unlimited).
    pub memory_reservation: Option<u64>,
    /// Seconds since the epoch.
    pub start_time: Option<f64>,
}

/// A limit file's value (`max` and v1's page-rounded "unlimited" are 0, as cAdvisor serves an
/// unlimited value).
fn limit(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim();
    if text == "max" {
        return Some(0);
    }
    let v: u64 = text.parse().ok()?;
    Some(if v > 1 << 62 { 0 } else { v })
}

/// cAdvisor's `convertCPUWeightToCPULimit`: the shares a cgroup v2 `cpu.weight` stands for
/// (the inverse of runc's shares-to-weight conversion).
fn weight_to_shares(weight: u64) -> u64 {
    2 + (weight.saturating_sub(1) * 262_142) / 9_999
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
    if let Some((dir, version)) = dir_of(layout, "memory", rel, id) {
        let (mem, swap, reservation) = match version {
            CgroupVersion::V2 => ("memory.max", "memory.swap.max", "memory.min"),
            CgroupVersion::V1 => (
                "memory.limit_in_bytes",
                "memory.memsw.limit_in_bytes",
                "memory.soft_limit_in_bytes",
            ),
        };
        out.spec.memory_limit = limit(&dir.join(mem));
        out.spec.swap_limit = limit(&dir.join(swap));
        out.spec.memory_reservation = limit(&dir.join(reservation));
        out.spec.start_time = std::fs::metadata(&dir)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs_f64());
    }
    if let Some((dir, _)) = dir_of(layout, "memory", rel, id) {
        let pids = dir_of(layout, "pids", rel, id).map(|(d, _)| d);
        out.processes = processes::read(&dir, pids.as_deref(), Path::new("/proc"));
    }
    if let Some((dir, version)) =
        dir_of(layout, "io", rel, id).or_else(|| dir_of(layout, "blkio", rel, id))
    {
        out.io = disk_io::read(&dir, version);
    }
    if let Some((dir, version)) = dir_of(layout, "cpu", rel, id) {
        out.cfs = std::fs::read_to_string(dir.join("cpu.stat"))
            .ok()
            .and_then(|text| cfs(&text, version));
        match version {
            CgroupVersion::V2 => {
                if let Ok(max) = std::fs::read_to_string(dir.join("cpu.max")) {
                    let mut f = max.split_whitespace();
                    let quota = f.next();
                    out.spec.cpu_period = f.next().and_then(|p| p.parse().ok());
                    out.spec.cpu_quota = quota.and_then(|q| q.parse().ok());
                }
                out.spec.cpu_shares = read_u64(&dir.join("cpu.weight")).map(weight_to_shares);
            }
            CgroupVersion::V1 => {
                out.spec.cpu_period = read_u64(&dir.join("cpu.cfs_period_us"));
                out.spec.cpu_quota = std::fs::read_to_string(dir.join("cpu.cfs_quota_us"))
                    .ok()
                    .and_then(|q| q.trim().parse::<i64>().ok())
                    .and_then(|q| u64::try_from(q).ok());
                out.spec.cpu_shares = read_u64(&dir.join("cpu.shares"));
            }
        }
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
        w("u/kubepods/podx", "memory.max", "max\n");
        w("u/kubepods/podx", "memory.swap.max", "0\n");
        w("u/kubepods/podx", "memory.min", "1048576\n");
        w(
            "u/kubepods/podx",
            "io.stat",
            "253:0 rbytes=4096 wbytes=512 rios=1 wios=2 dbytes=0 dios=0\n",
        );
        w("u/kubepods/podx", "cpu.max", "50000 100000\n");
        w("u/kubepods/podx", "cpu.weight", "10\n");
        w(
            "u/kubepods/podx/c1",
            "cpu.stat",
            "usage_usec 9\nnr_periods 20\nnr_throttled 5\nthrottled_usec 1500\n",
        );
        let mountinfo = format!(
            "30 25 0:26 / {} rw - cgroup2 cgroup2 rw\n",
            d.path().join("u").display()
        );
        let mut v2 = CgroupLayout::parse(&mountinfo, "memory 0 1 1\ncpu 0 1 1\nio 0 1 1\n");
        v2.unified_controllers = vec!["memory".into(), "cpu".into(), "io".into()];
        let f = read(&v2, "/kubepods/podx", None);
        assert_eq!(f.spec.memory_reservation, Some(1 << 20), "memory.min");
        assert_eq!(
            f.io.get(&(253, 0))
                .map(|d| (d.read_bytes, d.write_bytes, d.reads, d.writes)),
            Some((4096, 512, 1, 2))
        );
        assert_eq!(
            (f.usage, f.rss, f.cache, f.swap),
            (Some(1000), Some(600), Some(300), Some(50))
        );
        assert_eq!(
            (
                f.spec.memory_limit,
                f.spec.swap_limit,
                f.spec.cpu_quota,
                f.spec.cpu_period,
                f.spec.cpu_shares
            ),
            (Some(0), Some(0), Some(50_000), Some(100_000), Some(237)),
            "max is 0; weight 10 is 237 shares (runc gives weight 10 for 256 shares, roughly)"
        );
        assert!(f.spec.start_time.is_some_and(|t| t > 1.7e9));
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
        w("c/kubepods/podx", "cpu.cfs_quota_us", "-1\n");
        w("c/kubepods/podx", "cpu.cfs_period_us", "100000\n");
        w("c/kubepods/podx", "cpu.shares", "512\n");
        w(
            "m/kubepods/podx",
            "memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        let mountinfo = format!(
            "30 25 0:26 / {} rw - cgroup cgroup rw,memory\n31 25 0:27 / {} rw - cgroup cgroup rw,cpu\n",
            d.path().join("m").display(),
            d.path().join("c").display()
        );
        w(
            "m/kubepods/podx",
            "memory.soft_limit_in_bytes",
            "9223372036854771712\n",
        );
        let v1 = CgroupLayout::parse(&mountinfo, "memory 5 1 1\ncpu 6 1 1\n");
        let f = read(&v1, "/kubepods/podx", None);
        assert_eq!(f.spec.memory_reservation, Some(0), "v1: no soft limit is 0");
        assert_eq!(
            (f.usage, f.rss, f.cache, f.swap),
            (Some(2000), Some(900), Some(800), Some(500))
        );
        assert_eq!(
            (
                f.spec.cpu_quota,
                f.spec.cpu_period,
                f.spec.cpu_shares,
                f.spec.memory_limit
            ),
            (None, Some(100_000), Some(512), Some(0)),
            "v1: quota -1 is none, the page-rounded maximum is unlimited"
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
