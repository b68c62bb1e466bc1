//! The node's stats collector (kubelet's stats provider): one thread, off the async runtime,
//! owns the [`NodeObserver`] and does all the reading the eviction manager needs (cgroup files,
//! statvfs, the walk of the pods' log directories; a signal's small refresh runs on the
//! caller's thread, see [`StatsCollector`]). Each refresh publishes an
//! `Arc<NodeSnapshot>` through a `tokio::sync::watch` channel; every figure in it carries the
//! time it was taken.
//!
//! A refresh reads only what it is asked for: the node-level observations always (two
//! working sets, two statvfs calls and the pid count: cheap), the memory of the pods a signal
//! names (or of every pod before an eviction is decided), and the log walk (the expensive
//! part, linear in the files the pods wrote) on the housekeeping tick only. Figures not
//! re-read are carried over from the previous snapshot with their old time.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard, mpsc as std_mpsc},
    time::Duration,
};

use tokio::sync::{oneshot, watch};

use crate::{
    node::{NodeError, NodeObserver},
    policy::eviction::{Observations, PodStats},
};

pub mod disk_io;
pub mod figures;
pub mod filesystems;
pub mod network;
mod node_memory;
pub mod processes;
pub mod psi;
mod usage;

/// A pod to collect stats of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodTarget {
    pub uid: String,
    /// The pod cgroup, relative to the hierarchy roots.
    pub cgroup: String,
    /// (name, runtime id) of its containers: a container's cgroup is `<pod>/<id>`.
    pub containers: Vec<(String, String)>,
}

impl PodTarget {
    /// The target of the active pod `uid` in `cgroup`, its containers from its status record
    /// (those with a runtime id, kubelet's form `<runtime>://<id>`: the cgroup is named by
    /// the id).
    #[must_use]
    pub fn of(
        uid: &str,
        cgroup: &str,
        record: Option<&crate::policy::pod_status::PodRecord>,
    ) -> Self {
        let containers = record
            .map(|r| {
                r.container_statuses
                    .iter()
                    .filter(|c| !c.container_id.is_empty())
                    .map(|c| {
                        let id = c.container_id.rsplit("://").next().unwrap_or_default();
                        (c.name.clone(), id.to_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            uid: uid.to_owned(),
            cgroup: cgroup.to_owned(),
            containers,
        }
    }
}

/// One pod's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSample {
    /// `None`: the pod cgroup is gone.
    pub stats: Option<PodStats>,
    /// When the memory and process figures were read.
    pub memory_at: Duration,
    /// When the log directory was walked (`None`: not yet).
    pub logs_at: Option<Duration>,
}

/// What the node looked like, figure by figure.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSnapshot {
    /// Node-level observations (each with its time).
    pub observations: Observations,
    /// Per pod, by uid.
    pub pods: BTreeMap<String, PodSample>,
    /// The kubepods cgroup's memory usage, page cache included (where the tripwire is placed
    /// from).
    pub kubepods_usage: Option<i64>,
}

/// Which pods' memory a refresh re-reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodScope {
    /// None (new pods are read anyway).
    New,
    /// These pods (the ones a signal names).
    Named(Vec<String>),
    /// Every pod.
    All,
    /// Every pod's memory usage counter through its open file descriptor (`usage`), less
    /// the inactive file pages of its last full read; its containers' and processes' figures
    /// carried over; of the node, only the memory observations: a crossing's refresh.
    Usage,
}

impl PodScope {
    /// Whether every pod's memory is read now.
    #[must_use]
    pub fn every_pod(&self) -> bool {
        matches!(self, Self::All | Self::Usage)
    }
}

/// What one refresh reads besides the node-level observations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refresh {
    pub pods: PodScope,
    /// Walk the pods' log directories (ephemeral storage).
    pub logs: bool,
}

impl Refresh {
    /// Everything: every pod's memory and log walk.
    #[must_use]
    pub fn full() -> Self {
        Self {
            pods: PodScope::All,
            logs: true,
        }
    }
}

/// The reading itself, synchronous; [`StatsCollector`] runs it on its own thread.
#[derive(Debug)]
pub struct Collector {
    pub observer: NodeObserver,
    last: Arc<NodeSnapshot>,
    /// Each pod's usage file, open (by uid): what [`PodScope::Usage`] reads.
    usage: BTreeMap<String, usage::UsageFd>,
    /// The memory cgroup iterator over kubepods: every pod's usage in one walk.
    memcg: MemcgReader,
    /// The last walk's usage by cgroup inode (kept: its capacity is reused).
    walked: HashMap<u64, i64>,
    /// The node's and kubepods' memory files, open (at a full refresh) for crossings.
    node_memory: Option<node_memory::NodeMemory>,
    /// The snapshot a crossing's refresh replaced, kept until the next refresh.
    retired: Option<Arc<NodeSnapshot>>,
}

/// Whether [`PodScope::Usage`] reads through the memory cgroup iterator.
#[derive(Debug, Default)]
enum MemcgReader {
    /// Not tried yet: loaded at the next full refresh with pods, on a thread of its own at
    /// `SCHED_IDLE` (reading the kernel's BTF and verifying the program take a fraction of a
    /// second, seconds under emulation: never at a crossing, nor under the collector's lock,
    /// nor before the node's own processes).
    #[default]
    Untried,
    /// Being loaded; taken at the next refresh that finds it done.
    Loading(
        std_mpsc::Receiver<
            Result<crate::kernel::memcg_iter::MemcgIter, crate::kernel::memcg_iter::MemcgIterError>,
        >,
    ),
    Ready(Box<crate::kernel::memcg_iter::MemcgIter>),
    /// Not here (said once in the log): the per-pod usage files are read.
    Unavailable,
    /// Not wanted (unit tests of the file path).
    Off,
}

impl Collector {
    #[must_use]
    pub fn new(observer: NodeObserver) -> Self {
        Self {
            observer,
            last: Arc::default(),
            usage: BTreeMap::new(),
            memcg: MemcgReader::Off,
            walked: HashMap::new(),
            node_memory: None,
            retired: None,
        }
    }

    /// Reads crossings through the memory cgroup iterator where the kernel has it (loaded at
    /// the first full refresh with pods).
    #[must_use]
    pub fn with_memcg_iterator(mut self) -> Self {
        self.memcg = MemcgReader::Untried;
        self
    }

    /// Whether crossings read through the iterator (it loaded and walked).
    #[must_use]
    pub fn reads_memcg_iterator(&self) -> bool {
        matches!(self.memcg, MemcgReader::Ready(_))
    }

    /// Starts loading the iterator over the kubepods memory cgroup (once; a failure is logged
    /// and the usage files are read from then on).
    fn load_memcg_iterator(&mut self) {
        let mount = self
            .observer
            .layout
            .memory()
            .map(|m| m.mount().to_path_buf());
        let root = self.observer.pod_memory_dir(&self.observer.kubepods);
        let (tx, rx) = std_mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("memcg-iter-load".to_owned())
            .spawn(move || {
                // Reading the BTF twice takes a CPU for a while (seconds under emulation):
                // only when nothing else wants it. The kernel's part (verifying, linking, one
                // walk under `cgroup_mutex`) runs at normal priority again: starved at
                // SCHED_IDLE while holding that mutex, the loader once held every cgroup
                // operation of a busy node for minutes.
                if let Err(e) = crate::kernel::realtime::make_idle() {
                    tracing::debug!(error = %e, "the iterator's loader stays at normal priority");
                }
                let loaded = mount
                    .zip(root)
                    .ok_or(crate::kernel::memcg_iter::MemcgIterError::NoRoot)
                    .and_then(|(mount, root)| {
                        crate::kernel::memcg_iter::MemcgIter::open_with(&mount, &root, 2, || {
                            if let Err(e) = crate::kernel::realtime::make_normal() {
                                tracing::warn!(error = %e, "the iterator's loader could not return to normal priority");
                            }
                        })
                    });
                let _ = tx.send(loaded);
            });
        self.memcg = match spawned {
            Ok(_) => MemcgReader::Loading(rx),
            Err(e) => {
                tracing::warn!(error = %e, "the memory cgroup iterator could not be loaded: crossings read each pod's usage file");
                MemcgReader::Unavailable
            }
        };
    }

    /// Takes the loaded iterator once its thread is done (`block`: waits for it).
    fn take_memcg_iterator(&mut self, block: bool) {
        let MemcgReader::Loading(rx) = &self.memcg else {
            return;
        };
        let loaded = if block {
            rx.recv().map_err(|_| std_mpsc::TryRecvError::Disconnected)
        } else {
            rx.try_recv()
        };
        self.memcg = match loaded {
            Err(std_mpsc::TryRecvError::Empty) => return,
            Ok(Ok(it)) => {
                tracing::info!("crossings read every pod's memory with one cgroup iterator walk");
                MemcgReader::Ready(Box::new(it))
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the memory cgroup iterator is not available: crossings read each pod's usage file");
                MemcgReader::Unavailable
            }
            Err(std_mpsc::TryRecvError::Disconnected) => MemcgReader::Unavailable,
        };
    }

    /// Waits for the iterator's loading (benchmarks and tests: the next crossing then reads
    /// through it); true when it loaded.
    pub fn wait_memcg_iterator(&mut self) -> bool {
        self.take_memcg_iterator(true);
        self.reads_memcg_iterator()
    }

    /// One walk of the iterator into `walked` (`false`: no iterator, or it failed: the files
    /// are read, and the iterator is given up after a failure).
    fn walk_memcg(&mut self) -> bool {
        let MemcgReader::Ready(it) = &mut self.memcg else {
            return false;
        };
        match it.read_into(&mut self.walked) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "the memory cgroup iterator failed: crossings read each pod's usage file from now on");
                self.memcg = MemcgReader::Unavailable;
                false
            }
        }
    }

    /// A pod's full memory read (its working set, containers, processes); keeps its usage
    /// file open for [`PodScope::Usage`] with the inactive figure found.
    fn read_pod(&mut self, t: &PodTarget) -> Option<PodStats> {
        let (stats, inactive) = self
            .observer
            .pod_stats_and_inactive(&t.cgroup, &t.containers)?;
        match self.usage.get_mut(&t.uid) {
            Some(u) if u.cgroup == t.cgroup => u.inactive = inactive,
            _ => {
                if let Some(u) = self
                    .observer
                    .pod_memory_dir(&t.cgroup)
                    .and_then(|dir| usage::UsageFd::open(&t.cgroup, &dir, inactive))
                {
                    self.usage.insert(t.uid.clone(), u);
                }
            }
        }
        Some(stats)
    }

    /// A crossing's samples (`PodScope::Usage`), one per target in its order: the pod's
    /// working set now through its open usage file (or the walk), the rest of its last
    /// sample (`olds`, the targets') carried over (`None`: not read before, no open file, or
    /// unreadable: a full read is needed). The targets come in uid order (the active set's),
    /// as the open files are kept: each file is found by stepping along them, not by a search
    /// (a crossing's 110 lookups of cold keys were most of its loop).
    fn usage_samples(
        &self,
        targets: &[PodTarget],
        olds: &[Option<&PodSample>],
        now: Duration,
        walked: bool,
    ) -> Vec<Option<PodSample>> {
        let mut files = SortedCursor::new(&self.usage);
        targets
            .iter()
            .zip(olds)
            .map(|(t, old)| {
                let old = (*old)?;
                let u = files.find(&t.uid).filter(|u| u.cgroup == t.cgroup)?;
                let ws = match self.walked.get(&u.ino) {
                    Some(usage) if walked => u.working_set_of(*usage),
                    _ => u.working_set()?,
                };
                let mut sample = old.clone();
                sample.stats.as_mut()?.memory = Some(ws);
                sample.memory_at = now;
                Some(sample)
            })
            .collect()
    }

    /// One refresh at `now` for the pods in `targets` (pods not in it are dropped).
    pub fn refresh(
        &mut self,
        req: &Refresh,
        targets: &[PodTarget],
        now: Duration,
    ) -> Result<Arc<NodeSnapshot>, NodeError> {
        if matches!(self.memcg, MemcgReader::Untried)
            && req.pods == PodScope::All
            && !targets.is_empty()
        {
            self.load_memcg_iterator();
        }
        self.take_memcg_iterator(false);
        if req.pods == PodScope::All && self.node_memory.is_none() {
            self.node_memory = node_memory::NodeMemory::open(&self.observer);
        }
        let walked = req.pods == PodScope::Usage && self.walk_memcg();
        let mut node_now = None;
        let observations = if req.pods == PodScope::Usage {
            // The node's memory now (through its open files; by path when they fail, opened
            // again at the next full refresh); its filesystems and processes as last read.
            node_now = self
                .node_memory
                .as_mut()
                .and_then(node_memory::NodeMemory::read);
            let mut o = match node_now {
                Some(n) => self
                    .observer
                    .memory_observations(n.node_ws, n.kubepods_ws, Some(now))
                    .into_iter()
                    .collect(),
                None => {
                    self.node_memory = None;
                    self.observer.observe_memory(now)?
                }
            };
            for (k, v) in &self.last.observations {
                o.entry(*k).or_insert(*v);
            }
            o
        } else {
            self.observer.observe(now)?
        };
        // Writable layers: read once per refresh that walks a pod (one pass over mountinfo),
        // of the targets' containers only.
        let mut layers: Option<HashMap<String, i64>> = None;
        let mut pods = BTreeMap::new();
        let last = self.last.clone();
        // Each target's last sample, found once.
        let mut cursor = SortedCursor::new(&last.pods);
        let olds: Vec<Option<&PodSample>> = targets.iter().map(|t| cursor.find(&t.uid)).collect();
        let mut fast = if req.pods == PodScope::Usage {
            self.usage_samples(targets, &olds, now, walked)
        } else {
            Vec::new()
        }
        .into_iter();
        for (t, &old) in targets.iter().zip(&olds) {
            let read_memory = old.is_none()
                || match &req.pods {
                    PodScope::New => false,
                    PodScope::Named(uids) => uids.contains(&t.uid),
                    PodScope::All | PodScope::Usage => true,
                };
            let fast = fast.next().flatten();
            // A sample carried over from `old` (in full, or but for its memory) has its
            // storage figures already.
            let carried = !read_memory || fast.is_some();
            let mut sample = match (read_memory, old, fast) {
                (false, Some(old), _) => old.clone(),
                (true, _, Some(fast)) => fast,
                _ => PodSample {
                    stats: self.read_pod(t),
                    memory_at: now,
                    logs_at: None,
                },
            };
            // Local storage: walked now (the housekeeping walk, or a pod never walked), or
            // carried over from the last walk. A crossing walks nothing (its step decides on
            // memory; a pod with no directory to walk would be looked for at every crossing).
            let walk = req.logs
                || (req.pods != PodScope::Usage && old.is_none_or(|o| o.logs_at.is_none()));
            if walk && let Some(usage) = self.observer.pod_disk_usage(&t.uid) {
                walked_storage(&mut sample, usage, t, targets, &mut layers, now);
            } else if !walk
                && !carried
                && let Some(o) = old
            {
                // Carried over: the last walk's figures and time.
                carried_storage(&mut sample, o);
            }
            pods.insert(t.uid.clone(), sample);
        }
        // Pods gone from the targets: their files closed.
        if self.usage.len() > pods.len() {
            self.usage.retain(|uid, _| pods.contains_key(uid));
        }
        let prev = std::mem::replace(
            &mut self.last,
            Arc::new(NodeSnapshot {
                observations,
                pods,
                kubepods_usage: match node_now {
                    Some(n) => Some(n.kubepods_usage),
                    None => self.observer.kubepods_usage(),
                },
            }),
        );
        // A crossing frees nothing on its path: the snapshot it replaces (the publisher drops
        // its own hold as it publishes) is freed at the next refresh that is not a
        // crossing's.
        self.retired = (req.pods == PodScope::Usage).then_some(prev);
        Ok(self.last.clone())
    }
}

/// A pod's local storage as walked now: its logs and local volumes (`usage`), and its
/// containers' writable layers (`layers`, read once per refresh for every target's
/// containers).
fn walked_storage(
    sample: &mut PodSample,
    usage: crate::node::PodDiskUsage,
    t: &PodTarget,
    targets: &[PodTarget],
    layers: &mut Option<HashMap<String, i64>>,
    now: Duration,
) {
    if let Some(s) = sample.stats.as_mut() {
        s.ephemeral_storage = Some(usage.total);
        let mut containers = s.containers.to_vec();
        for c in &mut containers {
            c.ephemeral_storage = usage
                .containers
                .iter()
                .find(|(n, _)| *n == c.name)
                .map(|(_, b)| *b);
        }
        s.volumes = usage.empty_dirs;
        // kubelet's pod and container ephemeral storage: logs, local volumes
        // and the containers' writable layers.
        let layers = layers.get_or_insert_with(|| {
            let wanted = targets
                .iter()
                .flat_map(|t| t.containers.iter().map(|(_, id)| id.as_str()))
                .collect();
            crate::node::writable_layers(&wanted)
        });
        for (name, id) in &t.containers {
            let Some(layer) = layers.get(id) else {
                continue;
            };
            s.ephemeral_storage = Some(s.ephemeral_storage.unwrap_or(0).saturating_add(*layer));
            if let Some(c) = containers.iter_mut().find(|c| c.name == *name) {
                c.ephemeral_storage = Some(c.ephemeral_storage.unwrap_or(0).saturating_add(*layer));
            }
        }
        s.containers = containers.into();
        sample.logs_at = Some(now);
    }
}

/// A pod's local storage carried over from its `old` sample: the last walk's figures and
/// time.
fn carried_storage(sample: &mut PodSample, o: &PodSample) {
    if let (Some(s), Some(os)) = (sample.stats.as_mut(), o.stats.as_ref()) {
        s.ephemeral_storage = os.ephemeral_storage;
        let mut containers = s.containers.to_vec();
        for c in &mut containers {
            c.ephemeral_storage = os
                .containers
                .iter()
                .find(|oc| oc.name == c.name)
                .and_then(|oc| oc.ephemeral_storage);
        }
        s.containers = containers.into();
        s.volumes = os.volumes.clone();
    }
    sample.logs_at = o.logs_at;
}

/// Finds keys of a map in ascending order by stepping along it (one comparison per key when
/// the keys asked for come in order, as the active set's do); a key asked for out of order is
/// searched for.
struct SortedCursor<'a, V> {
    map: &'a BTreeMap<String, V>,
    at: std::iter::Peekable<std::collections::btree_map::Iter<'a, String, V>>,
}

impl<'a, V> SortedCursor<'a, V> {
    fn new(map: &'a BTreeMap<String, V>) -> Self {
        Self {
            map,
            at: map.iter().peekable(),
        }
    }

    fn find(&mut self, key: &str) -> Option<&'a V> {
        while let Some((k, v)) = self.at.peek() {
            match k.as_str().cmp(key) {
                std::cmp::Ordering::Less => {
                    self.at.next();
                }
                std::cmp::Ordering::Equal => {
                    let v = *v;
                    self.at.next();
                    return Some(v);
                }
                std::cmp::Ordering::Greater => break,
            }
        }
        // Not ahead: absent, or asked for out of order.
        self.map.get(key)
    }
}

#[derive(Debug)]
enum Request {
    Refresh {
        refresh: Refresh,
        targets: Arc<[PodTarget]>,
        now: Duration,
        reply: oneshot::Sender<Result<Arc<NodeSnapshot>, NodeError>>,
    },
}

/// One refresh under the collector's lock (released before publishing); the new snapshot is
/// published to [`StatsCollector::latest`]'s readers.
fn publish_refresh(
    mut collector: MutexGuard<'_, Collector>,
    publish: &watch::Sender<Arc<NodeSnapshot>>,
    refresh: &Refresh,
    targets: &[PodTarget],
    now: Duration,
) -> Result<Arc<NodeSnapshot>, NodeError> {
    let r = collector.refresh(refresh, targets, now);
    drop(collector);
    if let Ok(s) = &r {
        publish.send_replace(s.clone());
    }
    r
}

/// The collector thread's handle: ask for a refresh, read the newest snapshot.
///
/// A refresh that walks no log directory (a signal's: a few cgroup files, microseconds) is
/// read on the caller's own thread when the collector is free: the hop to the collector
/// thread and back costs two thread wakeups, which on a loaded node are most of the time
/// between a crossing and the SIGKILL. A walk (the housekeeping tick's) goes to the thread.
#[derive(Debug)]
pub struct StatsCollector {
    tx: std_mpsc::Sender<Request>,
    collector: Arc<Mutex<Collector>>,
    publish: Arc<watch::Sender<Arc<NodeSnapshot>>>,
    snapshots: watch::Receiver<Arc<NodeSnapshot>>,
}

impl StatsCollector {
    /// Starts the collector thread; it ends when the handle is dropped.
    pub fn spawn(observer: NodeObserver) -> std::io::Result<Self> {
        Self::spawn_with(observer, true)
    }

    /// As [`Self::spawn`]; `iterator`: crossings read the memory cgroup iterator where the
    /// kernel has it (false: each pod's usage file, for comparison).
    pub fn spawn_with(observer: NodeObserver, iterator: bool) -> std::io::Result<Self> {
        let (tx, rx) = std_mpsc::channel::<Request>();
        let (publish, snapshots) = watch::channel(Arc::<NodeSnapshot>::default());
        let publish = Arc::new(publish);
        let mut collector = Collector::new(observer);
        if iterator {
            collector = collector.with_memcg_iterator();
        }
        let collector = Arc::new(Mutex::new(collector));
        {
            let collector = collector.clone();
            let publish = publish.clone();
            std::thread::Builder::new()
                .name("stats".to_owned())
                .spawn(move || {
                    while let Ok(Request::Refresh {
                        refresh,
                        targets,
                        now,
                        reply,
                    }) = rx.recv()
                    {
                        let c = crate::locks::lock(&collector);
                        let _ = reply.send(publish_refresh(c, &publish, &refresh, &targets, now));
                    }
                })?;
        }
        Ok(Self {
            tx,
            collector,
            publish,
            snapshots,
        })
    }

    /// Refreshes what `refresh` names for `targets` at `now` and returns the new snapshot.
    pub async fn refresh(
        &self,
        refresh: Refresh,
        targets: Arc<[PodTarget]>,
        now: Duration,
    ) -> Result<Arc<NodeSnapshot>, NodeError> {
        if !refresh.logs
            && let Ok(c) = self.collector.try_lock()
        {
            return publish_refresh(c, &self.publish, &refresh, &targets, now);
        }
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Request::Refresh {
                refresh,
                targets,
                now,
                reply,
            })
            .map_err(|_| NodeError::CollectorGone)?;
        answer.await.map_err(|_| NodeError::CollectorGone)?
    }

    /// The imagefs the runtime named (CRI `ImageFsInfo`).
    pub fn set_imagefs(&self, path: PathBuf) {
        crate::locks::lock(&self.collector).observer.imagefs = Some(path);
    }

    /// The newest snapshot (cheap: an `Arc`).
    #[must_use]
    pub fn latest(&self) -> Arc<NodeSnapshot> {
        self.snapshots.borrow().clone()
    }
}

#[cfg(test)]
mod tests;
