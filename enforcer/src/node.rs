//! Observations of the node for the eviction manager: memory working sets from cgroup files
//! (not MemAvailable), filesystems by statvfs, pids from the kernel's limits, and per-pod usage
//! from the pod cgroups. Reading only; no decisions.

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

pub mod hugepages;
pub mod swap;

use crate::{
    cgroup::{CgroupLayout, RootMemory, join_inside},
    policy::eviction::{ContainerStats, Observation, Observations, PodStats, Signal},
};

/// Errors of the node observer; each names the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Parse { path: PathBuf, what: String },
    #[error("no memory controller is mounted")]
    NoMemoryController,
    #[error("the stats collector thread has ended")]
    CollectorGone,
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::CgroupError),
}

fn read(path: &Path) -> Result<String, NodeError> {
    fs::read_to_string(path).map_err(|source| NodeError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn read_i64(path: &Path) -> Result<i64, NodeError> {
    let text = read(path)?;
    let t = text.trim();
    if t == "max" {
        return Ok(i64::MAX);
    }
    t.parse().map_err(|_| NodeError::Parse {
        path: path.to_path_buf(),
        what: format!("not a number: {t:?}"),
    })
}

/// A value from a `memory.stat`-style `key value` file.
#[must_use]
pub fn stat_value(text: &str, key: &str) -> Option<i64> {
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next() == Some(key))
            .then(|| f.next().and_then(|v| v.parse().ok()))
            .flatten()
    })
}

/// Memory working set of a cgroup directory: usage - inactive_file, floored at 0 (kubelet's
/// and cAdvisor's definition). v1: `memory.usage_in_bytes` and `total_inactive_file`; v2:
/// `memory.current` and `inactive_file`.
pub fn working_set(dir: &Path) -> Result<i64, NodeError> {
    let (usage, inactive) = memory_figures(dir)?;
    Ok(usage.saturating_sub(inactive).max(0))
}

/// The usage file of a memory cgroup directory: v1 `memory.usage_in_bytes`, v2
/// `memory.current`.
#[must_use]
pub fn usage_file(dir: &Path) -> PathBuf {
    let v1 = dir.join("memory.usage_in_bytes");
    if v1.exists() {
        v1
    } else {
        dir.join("memory.current")
    }
}

/// A memory cgroup's usage and its inactive file pages (the working set is their difference).
pub fn memory_figures(dir: &Path) -> Result<(i64, i64), NodeError> {
    let v1 = dir.join("memory.usage_in_bytes");
    let (usage, stat, key) = if v1.exists() {
        (
            read_i64(&v1)?,
            read(&dir.join("memory.stat"))?,
            "total_inactive_file",
        )
    } else {
        (
            read_i64(&dir.join("memory.current"))?,
            read(&dir.join("memory.stat"))?,
            "inactive_file",
        )
    };
    let inactive = stat_value(&stat, key).unwrap_or(0);
    Ok((usage, inactive))
}

/// statvfs of a path: (available bytes, capacity bytes, free inodes, inode capacity).
pub fn statvfs(path: &Path) -> Result<(i64, i64, i64, i64), NodeError> {
    let st = rustix::fs::statvfs(path).map_err(|e| NodeError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    let frsize = i64::try_from(st.f_frsize).unwrap_or(4096);
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    Ok((
        n(st.f_bavail).saturating_mul(frsize),
        n(st.f_blocks).saturating_mul(frsize),
        n(st.f_ffree),
        n(st.f_files),
    ))
}

/// A `/proc/meminfo` line's value (`MemTotal:`, `MemFree:`, ...), in bytes: the one parser of
/// that file.
#[must_use]
pub fn meminfo_bytes(text: &str, key: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|k| k.parse::<i64>().ok())
        .and_then(|kib| kib.checked_mul(1024))
}

/// MemTotal from /proc/meminfo, in bytes (cAdvisor's `MemoryCapacity`).
pub fn machine_memory() -> Result<i64, NodeError> {
    let path = Path::new("/proc/meminfo");
    let text = read(path)?;
    meminfo_bytes(&text, "MemTotal:").ok_or_else(|| NodeError::Parse {
        path: path.to_path_buf(),
        what: "no MemTotal".into(),
    })
}

/// This node's name as kubelet defaults it without `--hostname-override`: the hostname,
/// lower-cased (`localhost` when unreadable).
#[must_use]
pub fn node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_lowercase())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// The version the node reports as `kubeletVersion`: kubelet's minor it follows, with the
/// enforcer's own version as build metadata (`v1.37.0+enforcer.0.1.0`), which semver parsers
/// (and `kubectl get nodes`) accept.
#[must_use]
pub fn kubelet_version() -> String {
    format!("v1.37.0+enforcer.{}", env!("CARGO_PKG_VERSION"))
}

/// `--node-ip`, set once at the daemon's start: [`node_ip`] answers it.
static NODE_IP: std::sync::OnceLock<std::net::IpAddr> = std::sync::OnceLock::new();

/// Sets the node's IP (`--node-ip`) for the process (once; a second call is ignored).
pub fn set_node_ip(ip: std::net::IpAddr) {
    let _ = NODE_IP.set(ip);
}

/// The node's IP: `--node-ip` when given, else as kubelet picks one without it (the address of
/// the default route's interface): the source address the kernel picks for a route to a public
/// address (found by connecting a UDP socket, which sends nothing); `None` without a default
/// route. The Node's `InternalIP`, pods' `status.hostIP`, and the downward API's
/// `status.hostIP(s)`.
#[must_use]
pub fn node_ip() -> Option<String> {
    if let Some(ip) = NODE_IP.get() {
        return Some(ip.to_string());
    }
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("8.8.8.8:53").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then(|| ip.to_string())
}

/// The pid limit and the number of processes (kubelet's `rlimit.Stats`).
pub fn pids() -> Result<(i64, i64), NodeError> {
    let pid_max = read_i64(Path::new("/proc/sys/kernel/pid_max"))?;
    let threads_max = read_i64(Path::new("/proc/sys/kernel/threads-max"))?;
    let info = rustix::system::sysinfo();
    Ok((pid_max.min(threads_max), i64::from(info.procs)))
}

/// The CPU topology of the node from sysfs (`<root>/devices/system/cpu`; root is `/sys` on a
/// real node): the online CPUs and each one's `physical_package_id` and `core_id`.
pub fn cpu_topology(
    root: &Path,
) -> Result<crate::policy::cpu::Topology, crate::policy::cpu::CpuError> {
    use crate::policy::cpu::{CpuError, CpuSet, Topology};
    let base = root.join("devices/system/cpu");
    let read = |p: &Path| {
        fs::read_to_string(p).map_err(|e| CpuError::Sysfs {
            path: p.display().to_string(),
            message: e.to_string(),
        })
    };
    let online = CpuSet::parse(read(&base.join("online"))?.trim())?;
    let mut raw = Vec::new();
    for cpu in online.iter() {
        let dir = base.join(format!("cpu{cpu}/topology"));
        let num = |name: &str| -> Result<u32, CpuError> {
            let p = dir.join(name);
            let text = read(&p)?;
            text.trim().parse().map_err(|_| CpuError::Sysfs {
                path: p.display().to_string(),
                message: format!("not a number: {text:?}"),
            })
        };
        raw.push((cpu, num("physical_package_id")?, num("core_id")?));
    }
    Ok(Topology::from_ids(raw))
}

/// The NUMA cells of the node from sysfs (`<root>/devices/system/node/node*`; root is `/sys`
/// on a real node), as cAdvisor reads them for kubelet's `MachineInfo.Topology`: each cell's
/// `MemTotal` (`meminfo`), hugepages pools (`hugepages/hugepages-<size>kB/nr_hugepages`) and
/// CPUs (`cpulist`). A kernel without NUMA nodes in sysfs gives no cells.
pub fn numa_topology(
    root: &Path,
) -> Result<crate::policy::topology::NumaTopology, crate::policy::topology::TopologyError> {
    use crate::policy::{
        cpu::CpuSet,
        topology::{
            HugePages, NumaCell, NumaTopology, TopologyError,
            numa::{hugepages_dir_size_kib, node_dir_id, node_meminfo_total},
        },
    };
    let err = |p: &Path, message: String| TopologyError::Sysfs {
        path: p.display().to_string(),
        message,
    };
    let read = |p: &Path| fs::read_to_string(p).map_err(|e| err(p, e.to_string()));
    let base = root.join("devices/system/node");
    let entries = match fs::read_dir(&base) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(NumaTopology::default()),
        Err(e) => return Err(err(&base, e.to_string())),
    };
    let mut cells = Vec::new();
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().and_then(node_dir_id) else {
            continue;
        };
        let dir = entry.path();
        let meminfo = dir.join("meminfo");
        let memory = node_meminfo_total(&read(&meminfo)?)
            .ok_or_else(|| err(&meminfo, "no MemTotal".into()))?;
        let cpulist = dir.join("cpulist");
        let cpus =
            CpuSet::parse(read(&cpulist)?.trim()).map_err(|e| err(&cpulist, e.to_string()))?;
        let mut hugepages = Vec::new();
        if let Ok(pools) = fs::read_dir(dir.join("hugepages")) {
            for pool in pools.flatten() {
                let Some(page_size_kib) =
                    pool.file_name().to_str().and_then(hugepages_dir_size_kib)
                else {
                    continue;
                };
                let nr = pool.path().join("nr_hugepages");
                let text = read(&nr)?;
                let num_pages = text
                    .trim()
                    .parse()
                    .map_err(|_| err(&nr, format!("not a number: {text:?}")))?;
                hugepages.push(HugePages {
                    page_size_kib,
                    num_pages,
                });
            }
        }
        hugepages.sort_by_key(|h| h.page_size_kib);
        cells.push(NumaCell {
            id,
            memory,
            hugepages,
            cpus,
        });
    }
    cells.sort_by_key(|c| c.id);
    Ok(NumaTopology { cells })
}

/// Where the observer looks.
#[derive(Clone, Debug)]
pub struct NodeObserver {
    pub layout: CgroupLayout,
    /// cgroupRoot + `/kubepods`, relative to each hierarchy's root.
    pub kubepods: String,
    /// Machine memory, or the configured capacity override.
    pub memory_capacity: i64,
    /// Whether `memory_capacity` is an override: then memory.available is computed against the
    /// kubepods cgroup instead of the root cgroup.
    pub capacity_override: bool,
    /// The kubepods cgroup's memory limit (capacity - systemReserved - kubeReserved, without
    /// the eviction threshold: [`crate::policy::admission::kubepods_memory_limit`]), against
    /// which allocatableMemory.available is measured.
    pub kubepods_memory_limit: i64,
    /// The kubelet root dir's filesystem (nodefs).
    pub nodefs: PathBuf,
    /// The runtime's image filesystem (imagefs), if observed.
    pub imagefs: Option<PathBuf>,
    /// A pid capacity override (`nodeCapacity: {pids: N}`): pid.available is then this minus
    /// the tasks of the kubepods cgroup (pids controller), as memory is with its override.
    pub pid_capacity: Option<i64>,
}

impl NodeObserver {
    /// kubelet's two memory signals from the working sets of the node (or, with a capacity
    /// override, of kubepods) and of kubepods: `memory.available` against the node's
    /// capacity, `allocatableMemory.available` against the kubepods limit.
    #[must_use]
    pub fn memory_observations(
        &self,
        node_ws: i64,
        kubepods_ws: i64,
        time: Option<Duration>,
    ) -> [(Signal, Observation); 2] {
        [
            (
                Signal::MemoryAvailable,
                Observation {
                    available: self.memory_capacity - node_ws,
                    capacity: self.memory_capacity,
                    time,
                },
            ),
            (
                Signal::AllocatableMemoryAvailable,
                Observation {
                    available: self.kubepods_memory_limit - kubepods_ws,
                    capacity: self.kubepods_memory_limit,
                    time,
                },
            ),
        ]
    }

    fn memory_dir(&self, rel: &str) -> Result<PathBuf, NodeError> {
        let memory = self.layout.memory().ok_or(NodeError::NoMemoryController)?;
        Ok(memory.dir(rel)?)
    }

    /// One round of observations at `now` (monotonic time of the caller's clock).
    pub fn observe(&self, now: Duration) -> Result<Observations, NodeError> {
        let mut obs = self.observe_memory(now)?;
        self.observe_others(now, &mut obs)?;
        Ok(obs)
    }

    /// The memory observations only (`memory.available`, `allocatableMemory.available`), at
    /// `now`: what a crossing reads of the node.
    pub fn observe_memory(&self, now: Duration) -> Result<Observations, NodeError> {
        let mut obs = Observations::new();
        let at = Some(now);
        let kubepods_ws = working_set(&self.memory_dir(&self.kubepods)?).unwrap_or(0);
        let node_ws = if self.capacity_override {
            kubepods_ws
        } else {
            let memory = self.layout.memory().ok_or(NodeError::NoMemoryController)?;
            match memory.root_memory() {
                RootMemory::Cgroup(root) => working_set(root)?,
                // The v2 root has no memory.current: use /proc/meminfo minus inactive file.
                RootMemory::Meminfo => root_working_set_meminfo()?,
            }
        };
        obs.extend(self.memory_observations(node_ws, kubepods_ws, at));
        Ok(obs)
    }

    /// The filesystem and process observations at `now`, into `obs`.
    fn observe_others(&self, now: Duration, obs: &mut Observations) -> Result<(), NodeError> {
        let at = Some(now);
        if let Ok((avail, cap, ifree, icap)) = statvfs(&self.nodefs) {
            obs.insert(
                Signal::NodeFsAvailable,
                Observation {
                    available: avail,
                    capacity: cap,
                    time: at,
                },
            );
            obs.insert(
                Signal::NodeFsInodesFree,
                Observation {
                    available: ifree,
                    capacity: icap,
                    time: at,
                },
            );
        }
        if let Some(imagefs) = &self.imagefs
            && let Ok((avail, cap, ifree, icap)) = statvfs(imagefs)
        {
            obs.insert(
                Signal::ImageFsAvailable,
                Observation {
                    available: avail,
                    capacity: cap,
                    time: at,
                },
            );
            obs.insert(
                Signal::ImageFsInodesFree,
                Observation {
                    available: ifree,
                    capacity: icap,
                    time: at,
                },
            );
        }
        let (max, procs) = match self.pid_capacity {
            Some(cap) => (cap, self.kubepods_tasks()),
            None => pids()?,
        };
        obs.insert(
            Signal::PidAvailable,
            Observation {
                available: max - procs,
                capacity: max,
                time: at,
            },
        );
        Ok(())
    }

    /// The kubepods cgroup's memory usage, page cache included (v2 `memory.current`, v1
    /// `memory.usage_in_bytes`): where the tripwire is placed from.
    #[must_use]
    pub fn kubepods_usage(&self) -> Option<i64> {
        crate::cgroup::PodCgroup::resolve(&self.layout, &self.kubepods)?.usage()
    }

    /// Tasks in the kubepods cgroup (`pids.current`, hierarchical); 0 before any pod ran.
    fn kubepods_tasks(&self) -> i64 {
        self.layout
            .pids()
            .and_then(|m| m.dir(&self.kubepods).ok())
            .and_then(|d| read_i64(&d.join("pids.current")).ok())
            .unwrap_or(0)
    }

    /// Ephemeral storage of one pod as far as the node sees it, in one walk of
    /// `<nodefs>/pods/<uid>/` (bytes allocated, like `du`): its container logs
    /// (`<container>/`) and its volumes (`volumes/kubernetes.io~<plugin>/<name>`). A volume
    /// on another file system (a memory emptyDir's tmpfs) is not in the total (it is memory)
    /// but its emptyDir usage is measured all the same, for `sizeLimit`. `None` when the pod
    /// has no directory.
    #[must_use]
    pub fn pod_disk_usage(&self, uid: &str) -> Option<PodDiskUsage> {
        use std::os::unix::fs::MetadataExt as _;
        let dir = join_inside(&self.nodefs.join("pods"), uid).ok()?;
        let dev = fs::symlink_metadata(&dir).ok()?.dev();
        let mut usage = PodDiskUsage::default();
        for e in fs::read_dir(&dir).ok()?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if !is_dir {
                usage.total = usage.total.saturating_add(disk_usage(&e.path()));
                continue;
            }
            if name != "volumes" {
                let used = disk_usage(&e.path());
                usage.total = usage.total.saturating_add(used);
                usage.containers.push((name, used));
                continue;
            }
            // `volumes/`: the plugins' volumes (the pod's local ephemeral volumes, in its
            // total as kubelet counts them), and whatever else is there (the logs of a
            // container named `volumes`).
            let mut own = fs::symlink_metadata(e.path()).map_or(0, |m| {
                i64::try_from(m.blocks().saturating_mul(512)).unwrap_or(i64::MAX)
            });
            for v in fs::read_dir(e.path()).into_iter().flatten().flatten() {
                let plugin = v.file_name().to_string_lossy().into_owned();
                if !plugin.starts_with("kubernetes.io~") {
                    own = own.saturating_add(disk_usage(&v.path()));
                    continue;
                }
                usage.total =
                    usage
                        .total
                        .saturating_add(fs::symlink_metadata(v.path()).map_or(0, |m| {
                            i64::try_from(m.blocks().saturating_mul(512)).unwrap_or(0)
                        }));
                for vol in fs::read_dir(v.path()).into_iter().flatten().flatten() {
                    let used = disk_usage(&vol.path());
                    if fs::symlink_metadata(vol.path()).is_ok_and(|m| m.dev() == dev) {
                        usage.total = usage.total.saturating_add(used);
                    }
                    if plugin == crate::policy::volumes::EMPTY_DIR_PLUGIN {
                        usage
                            .empty_dirs
                            .insert(vol.file_name().to_string_lossy().into_owned(), used);
                    }
                }
            }
            usage.total = usage.total.saturating_add(own);
            usage.containers.push((name, own));
        }
        Some(usage)
    }

    /// Usage of one pod from its cgroup (`pod_rel`: the pod cgroup's path relative to the
    /// hierarchy roots). `None` when the pod cgroup is gone (no stats).
    /// `containers` are (name, runtime id) pairs: a container's cgroup is `<pod>/<id>`.
    #[must_use]
    pub fn pod_stats(&self, pod_rel: &str, containers: &[(String, String)]) -> Option<PodStats> {
        self.pod_stats_and_inactive(pod_rel, containers)
            .map(|(s, _)| s)
    }

    /// [`Self::pod_stats`], with the pod cgroup's inactive file pages (what its working set
    /// left out of its usage).
    pub fn pod_stats_and_inactive(
        &self,
        pod_rel: &str,
        containers: &[(String, String)],
    ) -> Option<(PodStats, i64)> {
        let mem_dir = self.memory_dir(pod_rel).ok()?;
        let (usage, inactive) = memory_figures(&mem_dir).ok()?;
        let memory = usage.saturating_sub(inactive).max(0);
        let containers: Vec<ContainerStats> = containers
            .iter()
            .filter_map(|(name, id)| {
                let dir = crate::cgroup::container_dir(&mem_dir, id).ok()?;
                Some(ContainerStats {
                    name: name.clone(),
                    memory: working_set(&dir).ok(),
                    ephemeral_storage: None,
                })
            })
            .collect();
        let processes = self
            .layout
            .pids()
            .and_then(|m| m.dir(pod_rel).ok())
            .and_then(|d| read_i64(&d.join("pids.current")).ok());
        Some((
            PodStats {
                memory: Some(memory),
                processes,
                containers: containers.into(),
                ..PodStats::default()
            },
            inactive,
        ))
    }

    /// The memory cgroup directory of a pod cgroup (inside the hierarchy).
    pub fn pod_memory_dir(&self, pod_rel: &str) -> Option<PathBuf> {
        self.memory_dir(pod_rel).ok()
    }
}

/// One pod's local storage ([`NodeObserver::pod_disk_usage`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodDiskUsage {
    /// Logs and disk volumes.
    pub total: i64,
    /// Each container's logs, by container name.
    pub containers: Vec<(String, i64)>,
    /// Each emptyDir's usage (a memory emptyDir's too), by volume name.
    pub empty_dirs: BTreeMap<String, i64>,
}

/// The writable layer of each wanted container (kubelet reads CRI `ContainerStats`
/// `writable_layer`): the `upperdir` of the overlay mounted at a runtime's
/// `.../<container id>/rootfs` in `/proc/self/mountinfo`, measured like `du`; the other
/// containers on the host are not walked. Container id -> bytes.
#[must_use]
pub fn writable_layers(wanted: &std::collections::HashSet<&str>) -> HashMap<String, i64> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let mount_point = f.get(4)?;
            let id = mount_point.strip_suffix("/rootfs")?.rsplit('/').next()?;
            if !wanted.contains(id) {
                return None;
            }
            let sep = f.iter().position(|x| *x == "-")?;
            if *f.get(sep + 1)? != "overlay" {
                return None;
            }
            let upper = f
                .get(sep + 3)?
                .split(',')
                .find_map(|o| o.strip_prefix("upperdir="))?;
            Some((id.to_owned(), disk_usage(Path::new(upper))))
        })
        .collect()
}

/// Bytes allocated to a file or directory tree (st_blocks x 512), symlinks not followed, on
/// the tree's own file system only (a memory emptyDir's tmpfs inside is memory, not disk).
#[must_use]
pub fn disk_usage(path: &Path) -> i64 {
    use std::os::unix::fs::MetadataExt as _;
    match fs::symlink_metadata(path) {
        Ok(meta) => usage_on(path, meta.dev()),
        Err(_) => 0,
    }
}

fn usage_on(path: &Path, dev: u64) -> i64 {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.dev() != dev {
        return 0;
    }
    let own = i64::try_from(meta.blocks())
        .unwrap_or(i64::MAX)
        .saturating_mul(512);
    if !meta.is_dir() {
        return own;
    }
    fs::read_dir(path)
        .map(|rd| {
            rd.flatten()
                .map(|e| usage_on(&e.path(), dev))
                .fold(own, i64::saturating_add)
        })
        .unwrap_or(own)
}

fn root_working_set_meminfo() -> Result<i64, NodeError> {
    let path = Path::new("/proc/meminfo");
    let text = read(path)?;
    let kib = |key: &str| meminfo_bytes(&text, key).unwrap_or(0);
    let used = kib("MemTotal:") - kib("MemFree:");
    Ok((used - kib("Inactive(file):")).max(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_values() {
        let text = "cache 10\ntotal_inactive_file 4096\ninactive_file 7\n";
        assert_eq!(stat_value(text, "total_inactive_file"), Some(4096));
        assert_eq!(stat_value(text, "inactive_file"), Some(7));
        assert_eq!(stat_value(text, "missing"), None);
        assert_eq!(stat_value("inactive_file x", "inactive_file"), None);
    }

    #[test]
    fn host_readings_are_sane() {
        let mem = machine_memory().expect("meminfo");
        assert!(mem > 0);
        let (max, procs) = pids().expect("pids");
        assert!(max > procs && procs > 0);
        let (avail, cap, _, icap) = statvfs(Path::new("/")).expect("statvfs /");
        assert!(cap > 0 && avail <= cap && icap >= 0);
        assert!(statvfs(Path::new("/no/such/dir")).is_err());
    }

    /// kubelet measures allocatableMemory.available against the kubepods limit (capacity -
    /// reservations, without the threshold); the copied hard threshold then fires once the
    /// pods' working set passes allocatable. The e2e setting (kubeReserved = capacity - 300Mi,
    /// threshold 250Mi) must not be under pressure with no pod running.
    #[test]
    fn allocatable_memory_is_measured_against_the_kubepods_limit() {
        const MI: i64 = 1 << 20;
        // (capacity, kubeReserved, hard memory.available, kubepods working set, met)
        let cases = [
            ("2Gi", Some("1748Mi"), "250Mi", 0, false),
            ("2Gi", Some("1748Mi"), "250Mi", 40 * MI, false),
            ("2Gi", Some("1748Mi"), "250Mi", 60 * MI, true),
            ("1Gi", None, "100Mi", 180 * MI, false),
            ("1Gi", None, "100Mi", 600 * MI, false),
            ("1Gi", None, "100Mi", 920 * MI, false),
            ("1Gi", None, "100Mi", 930 * MI, true),
            ("1Gi", Some("200Mi"), "100Mi", 720 * MI, false),
            ("1Gi", Some("200Mi"), "100Mi", 730 * MI, true),
        ];
        for (capacity, kube_reserved, threshold, ws, met) in cases {
            let args = crate::config::ConfigArgs {
                node_capacity: vec![format!("memory={capacity}")],
                kube_reserved: kube_reserved
                    .map(|r| vec![format!("memory={r}")])
                    .unwrap_or_default(),
                eviction_hard: vec![format!("memory.available<{threshold}")],
                ..Default::default()
            };
            let config = crate::config::load(&args).expect("config").config;
            let caps = config.enforcer.node_capacity.clone();
            let observer = config.node_observer(&CgroupLayout::default(), &caps);
            let obs: Observations = observer
                .memory_observations(ws, ws, Some(Duration::ZERO))
                .into_iter()
                .collect();
            let t = config
                .eviction
                .thresholds
                .iter()
                .find(|t| t.signal == Signal::AllocatableMemoryAvailable)
                .expect("the hard threshold is copied for allocatable");
            assert_eq!(
                t.is_met(&obs, false),
                met,
                "capacity {capacity}, kubeReserved {kube_reserved:?}, threshold {threshold}, \
                 pods' working set {} MiB: {:?}",
                ws / MI,
                obs.get(&Signal::AllocatableMemoryAvailable)
            );
        }
    }

    #[test]
    fn sysfs_topology() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("devices/system/cpu");
        std::fs::create_dir_all(&base).unwrap();
        std::fs::write(base.join("online"), "0-3\n").unwrap();
        for (cpu, pkg, core) in [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)] {
            let t = base.join(format!("cpu{cpu}/topology"));
            std::fs::create_dir_all(&t).unwrap();
            std::fs::write(t.join("physical_package_id"), format!("{pkg}\n")).unwrap();
            std::fs::write(t.join("core_id"), format!("{core}\n")).unwrap();
        }
        let topo = cpu_topology(dir.path()).unwrap();
        assert_eq!(topo.all().iter().count(), 4);
        assert!(cpu_topology(&dir.path().join("nope")).is_err());
    }

    #[test]
    fn sysfs_numa_topology() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("devices/system/node");
        for (id, cpus, kib, pages) in [(0, "0-1", 8_000_000, 4), (1, "2-3", 4_000_000, 0)] {
            let n = base.join(format!("node{id}"));
            std::fs::create_dir_all(n.join("hugepages/hugepages-2048kB")).unwrap();
            std::fs::create_dir_all(n.join("hugepages/hugepages-1048576kB")).unwrap();
            std::fs::write(
                n.join("meminfo"),
                format!("Node {id} MemTotal:       {kib} kB\nNode {id} MemFree: 1 kB\n"),
            )
            .unwrap();
            std::fs::write(n.join("cpulist"), format!("{cpus}\n")).unwrap();
            std::fs::write(
                n.join("hugepages/hugepages-2048kB/nr_hugepages"),
                format!("{pages}\n"),
            )
            .unwrap();
            std::fs::write(n.join("hugepages/hugepages-1048576kB/nr_hugepages"), "1\n").unwrap();
        }
        std::fs::write(base.join("possible"), "0-1\n").unwrap();
        let topo = numa_topology(dir.path()).unwrap();
        assert_eq!(topo.node_ids(), vec![0, 1]);
        let c0 = topo.cell(0).unwrap();
        assert_eq!(c0.memory, 8_000_000 * 1024);
        assert_eq!(c0.hugepages[0].resource_name(), "hugepages-2Mi");
        assert_eq!(c0.hugepages[0].num_pages, 4);
        assert_eq!(c0.hugepages[1].resource_name(), "hugepages-1Gi");
        assert_eq!(topo.cpu_nodes()[&3], 1);
        // No NUMA nodes in sysfs: no cells.
        assert!(
            numa_topology(&dir.path().join("none"))
                .unwrap()
                .cells
                .is_empty()
        );
        // A malformed file names its path.
        std::fs::write(base.join("node1/cpulist"), "x").unwrap();
        assert!(
            numa_topology(dir.path())
                .unwrap_err()
                .to_string()
                .contains("node1/cpulist")
        );
    }

    #[test]
    fn disk_usage_of_a_pod() {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = dir.path().join("pods/u1/app");
        fs::create_dir_all(&logs).expect("mkdir");
        fs::write(logs.join("0.log"), vec![b'x'; 64 * 1024]).expect("write");
        let observer = NodeObserver {
            layout: CgroupLayout::default(),
            kubepods: "/kubepods".into(),
            memory_capacity: 0,
            capacity_override: true,
            kubepods_memory_limit: 0,
            nodefs: dir.path().to_path_buf(),
            imagefs: None,
            pid_capacity: Some(100),
        };
        let vol = dir
            .path()
            .join("pods/u1/volumes/kubernetes.io~empty-dir/cache");
        fs::create_dir_all(&vol).expect("mkdir");
        fs::write(vol.join("f"), vec![b'y'; 128 * 1024]).expect("write");
        let u = observer.pod_disk_usage("u1").expect("usage");
        // The logs and the disk emptyDir, each walked once.
        assert!(u.total >= (64 + 128) * 1024, "{u:?}");
        let app = u.containers.iter().find(|(n, _)| n == "app").expect("app");
        assert!(app.1 >= 64 * 1024 && app.1 < 128 * 1024, "{u:?}");
        let volumes = u
            .containers
            .iter()
            .find(|(n, _)| n == "volumes")
            .expect("volumes");
        assert!(
            volumes.1 < 64 * 1024,
            "the volumes are not a container's logs: {u:?}"
        );
        assert!(u.empty_dirs["cache"] >= 128 * 1024, "{u:?}");
        assert!(observer.pod_disk_usage("u2").is_none());
        assert!(observer.pod_disk_usage("../u1").is_none());
    }
}
