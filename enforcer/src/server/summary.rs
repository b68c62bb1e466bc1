//! `/stats/summary`: kubelet's Summary API (`stats/v1alpha1`), reduced to the fields the
//! eviction manager reads (node memory, nodefs, imagefs, pids, the `pods` system container's
//! memory against allocatable; per pod memory working set, ephemeral storage, emptyDir
//! volumes, processes; per container memory and storage) plus CPU usage.
//!
//! `node.runtime.imageFs` and `containerFs` are the container runtime's, as kubelet's CRI stats
//! provider reads them (CRI `ImageFsInfo`: used bytes and inodes from the runtime, capacity
//! and free space from statvfs of the mountpoint it names); without a runtime answer, the
//! eviction manager's imagefs observation when there is one.
//!
//! The figures are read on demand by the stats collector's own code ([`Collector`]), on a
//! blocking thread, one reading at a time: the same functions that feed the eviction
//! manager, read at the time of the request. A container's `rootfs.usedBytes` is its writable
//! layer plus its logs (what eviction ranks by); `logs` is not reported separately.

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{extract::State, http::StatusCode, response::Response};

#[cfg(test)]
mod psi_tests;
mod types;

pub use types::*;

use super::{Shared, json, text};
use crate::{
    cgroup::CgroupLayout,
    node::{NodeError, NodeObserver},
    pods::NodeLink,
    policy::eviction::Signal,
    stats::{
        Collector, NodeSnapshot, PodScope, PodTarget, Refresh,
        disk_io::{self, DeviceNumber},
        figures::{self, Figures},
        filesystems::{self, Filesystem},
        network::{self, NetDev},
        psi::{self, Pressure},
    },
    status_manager::{PodRecord, StatusManager},
};

/// One on-demand reading of the node.
#[derive(Debug)]
pub struct Reading {
    pub snapshot: Arc<NodeSnapshot>,
    /// Cumulative CPU time in nanoseconds by cgroup (relative path), pods and containers.
    pub cpu_ns: HashMap<String, u64>,
    /// CPU rate in nano-cores since the previous reading, by cgroup (`""`: the node).
    pub nano_cores: HashMap<String, u64>,
    /// The node's cumulative CPU time in nanoseconds.
    pub node_cpu_ns: Option<u64>,
    /// Wall-clock time of the reading (ns since the epoch).
    pub at_nanos: i64,
    /// The pod records (name, namespace, start times, container ids), by uid.
    pub records: HashMap<String, PodRecord>,
    /// Each pod's cgroup and containers, as read.
    pub targets: Vec<PodTarget>,
    /// cgroup v2 swap by cgroup (relative path), pods and containers: (`memory.swap.current`,
    /// `memory.swap.max`, `None` when `max`).
    pub swap: HashMap<String, (u64, Option<u64>)>,
    /// The machine's swap: (`SwapTotal`, `SwapFree`) in bytes.
    pub node_swap: Option<(i64, i64)>,
    /// Pressure stall information by cgroup (relative path; `""`: the root, the node's), pods
    /// and containers; empty where kubelet serves none (cgroup v1, `psi=0`).
    pub psi: HashMap<String, Pressure>,
    /// cAdvisor's other figures (memory usage, RSS, cache, swap, CFS) by cgroup, keyed as
    /// `psi` (`""`: the root).
    pub figures: HashMap<String, Figures>,
    /// Each pod's network counters by interface, by pod cgroup ([`network::read_pod`]).
    pub network: HashMap<String, Vec<(String, NetDev)>>,
    /// The machine's disks by device number (cAdvisor's names of the I/O figures' devices).
    pub disks: BTreeMap<DeviceNumber, String>,
    /// The machine's filesystems (cAdvisor's root container's).
    pub filesystems: Vec<Filesystem>,
    /// The kubepods cgroup (the summary's `pods` system container), relative to the roots.
    pub kubepods: String,
}

/// Reads the node for the summary and the resource metrics.
#[derive(Debug)]
pub struct StatsReader {
    inner: Arc<Mutex<ReaderState>>,
}

#[derive(Debug)]
struct ReaderState {
    collector: Collector,
    layout: CgroupLayout,
    kubepods: String,
    /// The previous CPU figures (for rates).
    last_cpu: HashMap<String, (Instant, u64)>,
}

impl StatsReader {
    #[must_use]
    pub fn new(observer: NodeObserver) -> Self {
        let layout = observer.layout.clone();
        let kubepods = observer.kubepods.clone();
        Self {
            inner: Arc::new(Mutex::new(ReaderState {
                collector: Collector::new(observer),
                layout,
                kubepods,
                last_cpu: HashMap::new(),
            })),
        }
    }

    /// Reads the node and the active pods now, what `page` serves: the pods' log directories
    /// for the summary, PSI for the summary and cAdvisor, cAdvisor's other figures and the
    /// pods' network for cAdvisor only.
    pub async fn read(
        &self,
        link: &NodeLink,
        status: &StatusManager,
        page: Page,
    ) -> Result<Reading, StatsError> {
        let logs = page == Page::Summary;
        let (targets, records) = targets(link, status);
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || -> Result<Reading, StatsError> {
            let mut st = crate::locks::lock(&inner);
            let now = Duration::from_nanos(crate::signal::monotonic_ns());
            let snapshot = st.collector.refresh(
                &Refresh {
                    pods: PodScope::All,
                    logs,
                },
                &targets,
                now,
            )?;
            let taken = Instant::now();
            let mut cpu_ns = HashMap::new();
            for t in &targets {
                if let Some(ns) = st.layout.cpu_usage_ns(&t.cgroup) {
                    cpu_ns.insert(t.cgroup.clone(), ns);
                }
                for (_, id) in &t.containers {
                    let c = format!("{}/{id}", t.cgroup);
                    if let Some(ns) = st.layout.cpu_usage_ns(&c) {
                        cpu_ns.insert(c, ns);
                    }
                }
            }
            let kubepods = st.kubepods.clone();
            if page == Page::Summary
                && let Some(ns) = st.layout.cpu_usage_ns(&kubepods)
            {
                cpu_ns.insert(kubepods.clone(), ns);
            }
            let swap = swap_readings(&st.layout, &targets);
            let psi = if page == Page::Resource {
                HashMap::new()
            } else {
                psi_readings(&st.layout, &targets, &kubepods)
            };
            let (figures, network, disks, filesystems) = if page == Page::Cadvisor {
                (
                    figure_readings(&st.layout, &targets),
                    network_readings(&st.layout, &targets),
                    disk_io::disks(Path::new("/sys/block")),
                    filesystems::read(),
                )
            } else {
                Default::default()
            };
            let node_swap = crate::node::swap::machine_swap().ok();
            let node_cpu_ns = st.layout.cpu_usage_ns("/").or_else(proc_stat_cpu_ns);
            let mut nano_cores = HashMap::new();
            let mut next = HashMap::new();
            for (k, v) in cpu_ns
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .chain(node_cpu_ns.map(|v| ("", v)))
            {
                if let Some((t0, v0)) = st.last_cpu.get(k) {
                    let dt = taken.duration_since(*t0).as_nanos();
                    if dt > 0 && v >= *v0 {
                        let rate = u128::from(v - v0) * 1_000_000_000 / dt;
                        nano_cores.insert(k.to_owned(), u64::try_from(rate).unwrap_or(u64::MAX));
                    }
                }
                next.insert(k.to_owned(), (taken, v));
            }
            st.last_cpu = next;
            Ok(Reading {
                snapshot,
                cpu_ns,
                nano_cores,
                node_cpu_ns,
                at_nanos: crate::clock::now_nanos(),
                records,
                targets,
                swap,
                node_swap,
                psi,
                figures,
                network,
                disks,
                filesystems,
                kubepods,
            })
        })
        .await?
    }
}

/// The page a reading is for: what it reads beside the figures every page serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// `/stats/summary`: the pods' logs walked, PSI.
    Summary,
    /// `/metrics/resource`.
    Resource,
    /// `/metrics/cadvisor`: PSI, memory / CFS / spec figures, network.
    Cadvisor,
}

/// Why the node's stats could not be read (the 500's text).
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("{0}")]
    Node(#[from] NodeError),
    #[error("the stats reading failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// The active pods to read (not finished), with their containers' runtime ids, and every
/// pod record by uid.
fn targets(
    link: &NodeLink,
    status: &StatusManager,
) -> (Vec<PodTarget>, HashMap<String, PodRecord>) {
    let (_, file) = status.snapshot();
    let records: HashMap<String, PodRecord> =
        file.pods.into_iter().map(|r| (r.uid.clone(), r)).collect();
    let mut out = Vec::new();
    for (uid, e) in link.active().iter() {
        let record = records.get(uid);
        if record.is_some_and(|r| r.phase.is_terminal()) {
            continue;
        }
        out.push(PodTarget::of(uid, &e.cgroup, record));
    }
    (out, records)
}

/// cgroup v2 swap (`memory.swap.current`, `memory.swap.max`) of every pod and container
/// cgroup in `targets`, by relative path; nothing on cgroup v1 (kubelet's swap is v2 only).
fn swap_readings(
    layout: &CgroupLayout,
    targets: &[PodTarget],
) -> HashMap<String, (u64, Option<u64>)> {
    let mut out = HashMap::new();
    let Some(memory) = layout.memory() else {
        return out;
    };
    for t in targets {
        let rels = std::iter::once(t.cgroup.clone()).chain(
            t.containers
                .iter()
                .map(|(_, id)| format!("{}/{id}", t.cgroup)),
        );
        for rel in rels {
            if let Some(v) = memory
                .swap_dir(&rel)
                .and_then(|dir| crate::node::swap::cgroup_swap(&dir))
            {
                out.insert(rel, v);
            }
        }
    }
    out
}

/// The pressure files of the root cgroup (key `""`) and of every pod and container cgroup
/// in `targets`, by relative path; nothing where kubelet reads none (cgroup v1, `psi=0`).
fn psi_readings(
    layout: &CgroupLayout,
    targets: &[PodTarget],
    kubepods: &str,
) -> HashMap<String, Pressure> {
    let mut out = HashMap::new();
    let Some(memory) = layout.memory() else {
        return out;
    };
    let Some(root) = memory.psi_dir("") else {
        return out;
    };
    out.insert(String::new(), psi::read(&root));
    if let Some(dir) = memory.psi_dir(kubepods) {
        out.insert(kubepods.to_owned(), psi::read(&dir));
    }
    for t in targets {
        let Some(pod) = memory.psi_dir(&t.cgroup) else {
            continue;
        };
        out.insert(t.cgroup.clone(), psi::read(&pod));
        for (_, id) in &t.containers {
            // Either driver's layout (`<pod>/<id>`, `<pod>/cri-containerd-<id>.scope`).
            if let Ok(dir) = crate::cgroup::paths::container_dir(&pod, id) {
                out.insert(format!("{}/{id}", t.cgroup), psi::read(&dir));
            }
        }
    }
    out
}

/// Each pod's network counters ([`network::read_pod`]), by pod cgroup.
fn network_readings(
    layout: &CgroupLayout,
    targets: &[PodTarget],
) -> HashMap<String, Vec<(String, NetDev)>> {
    targets
        .iter()
        .filter_map(|t| {
            let ids: Vec<String> = t.containers.iter().map(|(_, id)| id.clone()).collect();
            network::read_pod(layout, &t.cgroup, &ids).map(|n| (t.cgroup.clone(), n))
        })
        .collect()
}

/// cAdvisor's other figures ([`figures::read`]) of the root cgroup (key `""`) and of every
/// pod and container cgroup in `targets`.
fn figure_readings(layout: &CgroupLayout, targets: &[PodTarget]) -> HashMap<String, Figures> {
    let mut out = HashMap::from([(String::new(), figures::read(layout, "", None))]);
    for t in targets {
        out.insert(t.cgroup.clone(), figures::read(layout, &t.cgroup, None));
        for (_, id) in &t.containers {
            out.insert(
                format!("{}/{id}", t.cgroup),
                figures::read(layout, &t.cgroup, Some(id)),
            );
        }
    }
    out
}

/// The node's busy CPU time from `/proc/stat` (user, nice, system, irq, softirq, steal), in
/// nanoseconds.
fn proc_stat_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string(Path::new("/proc/stat")).ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let busy: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|i| f.get(*i)).sum();
    let hz = rustix::param::clock_ticks_per_second();
    Some(busy.saturating_mul(1_000_000_000) / hz.max(1))
}

/// statvfs of a mountpoint: (available bytes, capacity bytes, free inodes, inode capacity).
pub type Statvfs = (i64, i64, i64, i64);

/// kubelet's CRI `ImageFsStats`: the first image filesystem of an `ImageFsInfo` answer (its
/// used bytes and inodes, its time) with capacity, available bytes and inodes from `statvfs`
/// of its mountpoint when that answers; the container filesystem likewise from the first
/// container filesystem, else the image filesystem's. `None` when the answer names no image
/// filesystem.
#[must_use]
pub fn runtime_stats(
    info: &k8s_cri::v1::ImageFsInfoResponse,
    statvfs: impl Fn(&Path) -> Option<Statvfs>,
) -> Option<RuntimeStats> {
    let fs = |f: &k8s_cri::v1::FilesystemUsage| {
        let mut out = FsStats {
            time: crate::clock::rfc3339(f.timestamp),
            used_bytes: f.used_bytes.as_ref().map(|v| v.value),
            inodes_used: f.inodes_used.as_ref().map(|v| v.value),
            ..FsStats::default()
        };
        if let Some((available, capacity, inodes_free, inodes)) = f
            .fs_id
            .as_ref()
            .map(|id| Path::new(&id.mountpoint))
            .filter(|p| p.is_absolute())
            .and_then(&statvfs)
        {
            out.available_bytes = u(available);
            out.capacity_bytes = u(capacity);
            out.inodes_free = u(inodes_free);
            out.inodes = u(inodes);
        }
        out
    };
    let image_fs = fs(info.image_filesystems.first()?);
    let container_fs = match info.container_filesystems.first() {
        Some(c) => fs(c),
        None => image_fs.clone(),
    };
    Some(RuntimeStats {
        image_fs: Some(image_fs),
        container_fs: Some(container_fs),
    })
}

fn u(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

/// The node's boot time (RFC 3339), from `/proc/uptime`.
fn boot_time(now_nanos: i64) -> String {
    let up = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "uptime in ns fits an i64 for 292 years"
    )]
    let up_ns = (up * 1e9) as i64;
    crate::clock::rfc3339(now_nanos - up_ns)
}

/// The Summary of one reading; `runtime`: the container runtime's filesystems
/// ([`runtime_stats`]), else the eviction manager's imagefs observation.
#[must_use]
/// kubelet's cadvisorInfoToSwapStats for the cgroup `key`: usage, and the limit minus usage
/// unless unlimited.
fn swap_stats(r: &Reading, time: &str, key: &str) -> Option<SwapStats> {
    r.swap.get(key).map(|(usage, max)| SwapStats {
        time: time.to_owned(),
        swap_available_bytes: max.map(|m| m.saturating_sub(*usage)),
        swap_usage_bytes: Some(*usage),
    })
}

/// The cgroup `key`'s CPU: its `total` usage, its rate and its pressure, when the usage was
/// read.
fn cpu_stats(r: &Reading, time: &str, key: &str, total: Option<u64>) -> Option<CpuStats> {
    total.map(|ns| CpuStats {
        time: time.to_owned(),
        usage_nano_cores: r.nano_cores.get(key).copied(),
        usage_core_nano_seconds: Some(ns),
        psi: r.psi.get(key).and_then(|p| p.cpu),
    })
}

/// A cgroup's memory: its working set (and what is available, for the node) and, for the
/// cgroup `key` when given, its pressure.
fn memory_stats(
    r: &Reading,
    time: &str,
    key: Option<&str>,
    available: Option<u64>,
    working_set: Option<u64>,
) -> MemoryStats {
    MemoryStats {
        time: time.to_owned(),
        available_bytes: available,
        working_set_bytes: working_set,
        psi: key.and_then(|k| r.psi.get(k)).and_then(|p| p.memory),
    }
}

/// The cgroup `key`'s IO: its pressure, where PSI is read (kubelet's `cadvisorInfoToIOStats`
/// carries nothing else).
fn io_stats(r: &Reading, time: &str, key: &str) -> Option<IoStats> {
    r.psi.get(key).and_then(|p| p.io).map(|psi| IoStats {
        time: time.to_owned(),
        psi: Some(psi),
    })
}

/// One pod's stats, its containers' and volumes'; `None` for a pod the snapshot has not
/// sampled.
fn pod_stats(r: &Reading, time: &str, t: &PodTarget) -> Option<PodStats> {
    let sample = r.snapshot.pods.get(&t.uid)?;
    let rec = r.records.get(&t.uid);
    let stats = sample.stats.as_ref();
    let containers = t
        .containers
        .iter()
        .map(|(name, id)| {
            let cs = stats.and_then(|s| s.containers.iter().find(|c| c.name == *name));
            let started = rec
                .and_then(|r| r.container_statuses.iter().find(|c| c.name == *name))
                .and_then(|c| match &c.state {
                    crate::status_manager::ContainerState::Running { started_at } => {
                        Some(started_at.clone())
                    }
                    _ => None,
                })
                .unwrap_or_default();
            let key = format!("{}/{id}", t.cgroup);
            ContainerStats {
                name: name.clone(),
                start_time: started,
                cpu: cpu_stats(r, time, &key, r.cpu_ns.get(&key).copied()),
                memory: cs
                    .and_then(|c| c.memory)
                    .map(|m| memory_stats(r, time, Some(&key), None, u(m))),
                io: io_stats(r, time, &key),
                swap: swap_stats(r, time, &key),
                rootfs: cs.and_then(|c| c.ephemeral_storage).map(|b| FsStats {
                    time: time.to_owned(),
                    used_bytes: u(b),
                    ..FsStats::default()
                }),
            }
        })
        .collect();
    Some(PodStats {
        pod_ref: PodReference {
            name: rec.map(|r| r.name.clone()).unwrap_or_default(),
            namespace: rec.map(|r| r.namespace.clone()).unwrap_or_default(),
            uid: t.uid.clone(),
        },
        start_time: rec.map(|r| r.start_time.clone()).unwrap_or_default(),
        containers,
        cpu: cpu_stats(r, time, &t.cgroup, r.cpu_ns.get(&t.cgroup).copied()),
        memory: stats
            .and_then(|s| s.memory)
            .map(|m| memory_stats(r, time, Some(&t.cgroup), None, u(m))),
        io: io_stats(r, time, &t.cgroup),
        swap: swap_stats(r, time, &t.cgroup),
        volume: stats
            .map(|s| {
                s.volumes
                    .iter()
                    .map(|(name, used)| VolumeStats {
                        name: name.clone(),
                        fs: FsStats {
                            time: time.to_owned(),
                            used_bytes: u(*used),
                            ..FsStats::default()
                        },
                    })
                    .collect()
            })
            .unwrap_or_default(),
        ephemeral_storage: stats.and_then(|s| s.ephemeral_storage).map(|b| FsStats {
            time: time.to_owned(),
            used_bytes: u(b),
            ..FsStats::default()
        }),
        process_stats: stats.map(|s| ProcessStats {
            process_count: s.processes.and_then(u),
        }),
    })
}

pub fn summarize(r: &Reading, node_name: &str, runtime: Option<RuntimeStats>) -> Summary {
    let time = crate::clock::rfc3339(r.at_nanos);
    let obs = &r.snapshot.observations;
    let fs = |avail: Signal, inodes: Signal| {
        let o = obs.get(&avail)?;
        let i = obs.get(&inodes);
        Some(FsStats {
            time: time.clone(),
            available_bytes: u(o.available),
            capacity_bytes: u(o.capacity),
            used_bytes: u(o.capacity - o.available),
            inodes_free: i.and_then(|i| u(i.available)),
            inodes: i.and_then(|i| u(i.capacity)),
            inodes_used: None,
        })
    };
    // The node's pressure is the root cgroup's (key ""); the `pods` container's is kubepods'.
    let memory = |s: Signal, key: Option<&str>| {
        obs.get(&s)
            .map(|o| memory_stats(r, &time, key, u(o.available), u(o.capacity - o.available)))
    };
    let cpu = |key: &str, total: Option<u64>| cpu_stats(r, &time, key, total);
    let node = NodeStats {
        node_name: node_name.to_owned(),
        // kubelet's `pods` system container: the kubepods cgroup's cpu, memory and io.
        system_containers: memory(Signal::AllocatableMemoryAvailable, Some(&r.kubepods))
            .map(|m| ContainerStats {
                name: "pods".to_owned(),
                start_time: String::new(),
                cpu: cpu(&r.kubepods, r.cpu_ns.get(&r.kubepods).copied()),
                memory: Some(m),
                io: io_stats(r, &time, &r.kubepods),
                swap: None,
                rootfs: None,
            })
            .into_iter()
            .collect(),
        start_time: boot_time(r.at_nanos),
        cpu: cpu("", r.node_cpu_ns),
        memory: memory(Signal::MemoryAvailable, Some("")),
        io: io_stats(r, &time, ""),
        // The root cgroup's swap is the machine's: used = SwapTotal - SwapFree.
        swap: r.node_swap.map(|(total, free)| SwapStats {
            time: time.clone(),
            swap_available_bytes: u(free),
            swap_usage_bytes: u(total.saturating_sub(free)),
        }),
        fs: fs(Signal::NodeFsAvailable, Signal::NodeFsInodesFree),
        runtime: runtime.or_else(|| {
            fs(Signal::ImageFsAvailable, Signal::ImageFsInodesFree).map(|image_fs| RuntimeStats {
                image_fs: Some(image_fs),
                container_fs: None,
            })
        }),
        rlimit: obs.get(&Signal::PidAvailable).map(|o| RlimitStats {
            time: time.clone(),
            maxpid: Some(o.capacity),
            curproc: Some(o.capacity - o.available),
        }),
    };
    let pods = r
        .targets
        .iter()
        .filter_map(|t| pod_stats(r, &time, t))
        .collect();
    Summary { node, pods }
}

/// The runtime's filesystems ([`runtime_stats`]): `None` without a runtime or an answer.
async fn read_runtime_stats(rt: Option<&crate::cri::CriRuntime>) -> Option<RuntimeStats> {
    let info = match rt?.fs_info().await {
        Ok(i) => i,
        Err(e) => {
            tracing::debug!(error = %e, "ImageFsInfo for /stats/summary");
            return None;
        }
    };
    // statvfs off the async threads (a mountpoint may be slow to answer).
    tokio::task::spawn_blocking(move || runtime_stats(&info, |p| crate::node::statvfs(p).ok()))
        .await
        .ok()
        .flatten()
}

pub(super) async fn handler(State(s): State<Shared>) -> Response {
    let runtime = read_runtime_stats(s.sources.runtime.as_deref()).await;
    match s
        .stats
        .read(&s.sources.link, &s.sources.status, Page::Summary)
        .await
    {
        Ok(r) => json(&summarize(&r, &s.sources.config.node_name(), runtime)),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            format!("reading the node's stats: {e}\n"),
        ),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        policy::eviction::{ContainerStats as CStats, Observation, PodStats as PStats},
        stats::PodSample,
        status_manager::{ContainerRecord, ContainerState},
    };

    /// A reading of one pod `web` (uid `u1`) with container `app` (id `c1`).
    pub(in crate::server) fn reading() -> Reading {
        let obs = |available, capacity| Observation {
            available,
            capacity,
            time: None,
        };
        let mut observations = crate::policy::eviction::Observations::new();
        observations.insert(Signal::MemoryAvailable, obs(700, 1000));
        observations.insert(Signal::AllocatableMemoryAvailable, obs(500, 900));
        observations.insert(Signal::NodeFsAvailable, obs(40, 100));
        observations.insert(Signal::NodeFsInodesFree, obs(7, 10));
        observations.insert(Signal::PidAvailable, obs(900, 1000));
        let pod = PStats {
            memory: Some(300),
            ephemeral_storage: Some(4096),
            processes: Some(2),
            containers: vec![CStats {
                name: "app".to_owned(),
                memory: Some(200),
                ephemeral_storage: Some(1024),
            }]
            .into(),
            volumes: BTreeMap::from([("scratch".to_owned(), 512)]),
            ..PStats::default()
        };
        let snapshot = NodeSnapshot {
            observations,
            pods: BTreeMap::from([(
                "u1".to_owned(),
                PodSample {
                    stats: Some(pod),
                    ..PodSample::default()
                },
            )]),
            kubepods_usage: None,
        };
        let record = PodRecord {
            uid: "u1".to_owned(),
            name: "web".to_owned(),
            namespace: "default".to_owned(),
            source: "api".to_owned(),
            phase: crate::status_manager::PodPhase::Running,
            reason: String::new(),
            message: String::new(),
            qos_class: "BestEffort".to_owned(),
            start_time: "2026-01-01T00:00:00Z".to_owned(),
            pod_ips: Vec::new(),
            sandbox_id: String::new(),
            cgroup: "/kubepods/podu1".to_owned(),
            conditions: Vec::new(),
            init_container_statuses: Vec::new(),
            container_statuses: vec![ContainerRecord {
                name: "app".to_owned(),
                container_id: "containerd://c1".to_owned(),
                image: "busybox".to_owned(),
                image_id: String::new(),
                ready: true,
                started: Some(true),
                restart_count: 0,
                state: ContainerState::Running {
                    started_at: "2026-01-01T00:00:01Z".to_owned(),
                },
                last_state: None,
                oom_score_adj: None,
                oom_score_adj_decided: None,
                resources: Default::default(),
            }],
            resources: Default::default(),
        };
        Reading {
            snapshot: Arc::new(snapshot),
            cpu_ns: HashMap::from([
                ("/kubepods/podu1".to_owned(), 3_000_000_000),
                ("/kubepods/podu1/c1".to_owned(), 2_000_000_000),
                ("/kubepods".to_owned(), 4_000_000_000),
            ]),
            nano_cores: HashMap::from([("".to_owned(), 1_500_000_000)]),
            node_cpu_ns: Some(10_000_000_000),
            at_nanos: 1_767_225_600_000_000_000,
            records: HashMap::from([("u1".to_owned(), record)]),
            targets: vec![PodTarget {
                uid: "u1".to_owned(),
                cgroup: "/kubepods/podu1".to_owned(),
                containers: vec![("app".to_owned(), "c1".to_owned())],
            }],
            swap: HashMap::from([
                ("/kubepods/podu1".to_owned(), (4096, None)),
                ("/kubepods/podu1/c1".to_owned(), (4096, Some(134_217_728))),
            ]),
            node_swap: Some((5 << 30, 4 << 30)),
            psi: HashMap::new(),
            figures: HashMap::new(),
            network: HashMap::new(),
            disks: BTreeMap::new(),
            filesystems: Vec::new(),
            kubepods: "/kubepods".to_owned(),
        }
    }

    fn usage(mountpoint: &str, used: u64, inodes: Option<u64>) -> k8s_cri::v1::FilesystemUsage {
        k8s_cri::v1::FilesystemUsage {
            timestamp: 1_767_225_600_000_000_000,
            fs_id: Some(k8s_cri::v1::FilesystemIdentifier {
                mountpoint: mountpoint.to_owned(),
            }),
            used_bytes: Some(k8s_cri::v1::UInt64Value { value: used }),
            inodes_used: inodes.map(|value| k8s_cri::v1::UInt64Value { value }),
        }
    }

    /// kubelet's CRI `ImageFsStats`: used figures from the runtime, the rest from statvfs of
    /// the mountpoint; the container filesystem is the image filesystem's unless the runtime
    /// names its own.
    #[test]
    fn runtime_filesystems_from_image_fs_info() {
        let statvfs = |p: &Path| match p.to_str() {
            Some("/var/lib/containerd") => Some((600, 1000, 70, 100)),
            Some("/mnt/layers") => Some((5, 50, 1, 10)),
            _ => None,
        };
        let info = k8s_cri::v1::ImageFsInfoResponse {
            image_filesystems: vec![usage("/var/lib/containerd", 300, Some(20))],
            container_filesystems: Vec::new(),
        };
        let rt = runtime_stats(&info, statvfs).expect("an image filesystem");
        let image = rt.image_fs.clone().expect("imageFs");
        assert_eq!(
            image,
            FsStats {
                time: "2026-01-01T00:00:00Z".to_owned(),
                available_bytes: Some(600),
                capacity_bytes: Some(1000),
                used_bytes: Some(300),
                inodes_free: Some(70),
                inodes: Some(100),
                inodes_used: Some(20),
            }
        );
        assert_eq!(rt.container_fs, Some(image));
        // A container filesystem of its own, and a mountpoint statvfs cannot read.
        let info = k8s_cri::v1::ImageFsInfoResponse {
            image_filesystems: vec![usage("/gone", 1, None)],
            container_filesystems: vec![usage("/mnt/layers", 40, Some(9))],
        };
        let rt = runtime_stats(&info, statvfs).expect("an image filesystem");
        let image = rt.image_fs.expect("imageFs");
        assert_eq!(
            (image.used_bytes, image.capacity_bytes, image.inodes_used),
            (Some(1), None, None)
        );
        let c = rt.container_fs.expect("containerFs");
        assert_eq!(
            (
                c.used_bytes,
                c.capacity_bytes,
                c.available_bytes,
                c.inodes_used
            ),
            (Some(40), Some(50), Some(5), Some(9))
        );
        assert!(runtime_stats(&k8s_cri::v1::ImageFsInfoResponse::default(), statvfs).is_none());
        // In the summary, kubelet's field names.
        let s = serde_json::to_value(summarize(
            &reading(),
            "n1",
            runtime_stats(
                &k8s_cri::v1::ImageFsInfoResponse {
                    image_filesystems: vec![usage("/var/lib/containerd", 300, Some(20))],
                    container_filesystems: Vec::new(),
                },
                statvfs,
            ),
        ))
        .expect("json");
        let rt = &s["node"]["runtime"];
        assert_eq!(rt["imageFs"]["usedBytes"], 300);
        assert_eq!(rt["imageFs"]["inodesUsed"], 20);
        assert_eq!(rt["imageFs"]["capacityBytes"], 1000);
        assert_eq!(rt["containerFs"]["availableBytes"], 600);
    }

    #[test]
    fn the_summary_carries_what_eviction_reads() {
        let s = serde_json::to_value(summarize(&reading(), "n1", None)).expect("json");
        let node = &s["node"];
        assert_eq!(node["nodeName"], "n1");
        assert_eq!(node["memory"]["availableBytes"], 700);
        assert_eq!(node["memory"]["workingSetBytes"], 300);
        assert_eq!(node["memory"]["time"], "2026-01-01T00:00:00Z");
        assert_eq!(node["cpu"]["usageCoreNanoSeconds"], 10_000_000_000_u64);
        assert_eq!(node["cpu"]["usageNanoCores"], 1_500_000_000_u64);
        assert_eq!(node["fs"]["usedBytes"], 60);
        assert_eq!(node["fs"]["inodesFree"], 7);
        assert_eq!(node["rlimit"]["maxpid"], 1000);
        assert_eq!(node["rlimit"]["curproc"], 100);
        assert!(node.get("runtime").is_none(), "no imagefs observed");
        assert_eq!(node["systemContainers"][0]["name"], "pods");
        assert_eq!(node["systemContainers"][0]["memory"]["availableBytes"], 500);
        // The `pods` container's CPU is the kubepods cgroup's.
        assert_eq!(
            node["systemContainers"][0]["cpu"]["usageCoreNanoSeconds"],
            4_000_000_000_u64
        );
        let pod = &s["pods"][0];
        assert_eq!(pod["podRef"]["uid"], "u1");
        assert_eq!(pod["podRef"]["name"], "web");
        assert_eq!(pod["memory"]["workingSetBytes"], 300);
        assert_eq!(pod["cpu"]["usageCoreNanoSeconds"], 3_000_000_000_u64);
        assert_eq!(pod["ephemeral-storage"]["usedBytes"], 4096);
        assert_eq!(pod["volume"][0]["name"], "scratch");
        assert_eq!(pod["volume"][0]["usedBytes"], 512);
        assert_eq!(pod["process_stats"]["process_count"], 2);
        let c = &pod["containers"][0];
        assert_eq!(c["name"], "app");
        assert_eq!(c["startTime"], "2026-01-01T00:00:01Z");
        assert_eq!(c["memory"]["workingSetBytes"], 200);
        assert_eq!(c["rootfs"]["usedBytes"], 1024);
        assert_eq!(c["cpu"]["usageCoreNanoSeconds"], 2_000_000_000_u64);
        // Swap (kubelet's cadvisorInfoToSwapStats): the node's from /proc/meminfo, a pod's
        // and a container's from memory.swap.current, available only below a set limit.
        assert_eq!(node["swap"]["swapUsageBytes"], 1_u64 << 30);
        assert_eq!(node["swap"]["swapAvailableBytes"], 4_u64 << 30);
        assert_eq!(pod["swap"]["swapUsageBytes"], 4096);
        assert!(pod["swap"].get("swapAvailableBytes").is_none());
        assert_eq!(c["swap"]["swapUsageBytes"], 4096);
        assert_eq!(c["swap"]["swapAvailableBytes"], 134_217_728 - 4096);
        assert!(node["systemContainers"][0].get("swap").is_none());
    }
}
