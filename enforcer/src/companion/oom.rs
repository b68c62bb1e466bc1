//! The companion's `oom_score_adj` alignment on the node: each watched pod's processes read in
//! `/proc` (resident memory, swap, page tables, current value), the pods ranked as kubelet's
//! eviction manager ranks them for memory, the pure alignment (`policy::oom::align`) computed,
//! the changed values written, and what it could not fix kept for `companion.json`. The value
//! kubelet gave each container (what its processes had before the first write) is kept in the
//! state directory ([`Originals`]) and written back when the companion stops ([`restore`]):
//! without the companion, the node has kubelet's values again.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::{
    cgroup::{CgroupLayout, PodCgroup},
    pods::ActiveEntry,
    policy::{
        eviction::{ActivePod, PodStats, Signal, rank::rank},
        oom::align::{self, Candidate, Score},
        qos::{QosClass, pod_qos},
        resources::is_node_critical,
    },
};

/// kubelet's `oom_score_adj` of a pod's sandbox (pause) process: never a container's.
const SANDBOX_OOM_SCORE_ADJ: i64 = -998;

/// The state directory's record of kubelet's values ([`Originals`]).
pub const ORIGINALS_FILE: &str = "oom-score-adj.json";

/// One process of a pod as the kernel scores it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Task {
    pid: i32,
    /// rss + swap entries + page tables, in pages.
    points: i64,
    adj: i64,
    /// Its cgroup (the container's), relative to the memory controller's mount.
    cgroup: String,
}

/// kubelet's `oom_score_adj` of each container the companion re-scored: the value its processes
/// had before the companion's first write (kubelet sets it once, when it creates the
/// container), by the container's cgroup relative to the memory controller's mount. Kept in
/// [`ORIGINALS_FILE`] so a restarted companion does not take its own values for kubelet's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Originals(BTreeMap<String, i64>);

/// The record of kubelet's values could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OriginalsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a record of oom_score_adj values: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: crate::status_manager::StatusError,
    },
    #[error("removing {path}: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Originals {
    /// The record in `state_dir` (empty when there is none).
    ///
    /// # Errors
    /// The file exists but cannot be read or parsed.
    pub fn load(state_dir: &Path) -> Result<Self, OriginalsError> {
        let path = state_dir.join(ORIGINALS_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|source| OriginalsError::Parse { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(OriginalsError::Read { path, source }),
        }
    }

    /// Writes the record to `state_dir` (atomically); an empty record removes the file.
    ///
    /// # Errors
    /// The file cannot be written or removed.
    pub fn save(&self, state_dir: &Path) -> Result<(), OriginalsError> {
        let path = state_dir.join(ORIGINALS_FILE);
        if self.0.is_empty() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(OriginalsError::Remove { path, source: e })
                }
                _ => Ok(()),
            };
        }
        let bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        crate::status_manager::write_atomic(&path, &bytes)
            .map_err(|source| OriginalsError::Write { path, source })
    }

    /// The containers recorded.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no container is recorded.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Keeps `adj` as kubelet's value of `cgroup` unless one is kept already.
    fn note(&mut self, cgroup: &str, adj: i64) {
        self.0.entry(cgroup.to_owned()).or_insert(adj);
    }

    /// Forgets the containers whose cgroup is gone.
    fn prune(&mut self, layout: &CgroupLayout) {
        self.0
            .retain(|rel, _| PodCgroup::resolve(layout, rel).is_some_and(|c| c.exists()));
    }
}

/// What [`restore`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Processes given kubelet's value back.
    pub processes: usize,
    /// Processes whose value could not be written (pid: error).
    pub failed: Vec<String>,
}

/// Writes kubelet's values back: each recorded container's processes (not a sandbox's, nor one
/// at -998 or below) that no longer have it get it.
#[must_use]
pub fn restore(layout: &CgroupLayout, originals: &Originals) -> Restored {
    let mut done = Restored::default();
    for (rel, value) in &originals.0 {
        let Some(container) = PodCgroup::resolve(layout, rel) else {
            continue;
        };
        for (pid, _) in container.processes(0) {
            let path = PathBuf::from(format!("/proc/{pid}/oom_score_adj"));
            let Some(adj) = read_i64(&path) else {
                continue;
            };
            if adj <= SANDBOX_OOM_SCORE_ADJ || adj == *value {
                continue;
            }
            match write_adj(&path, *value) {
                Ok(true) => done.processes += 1,
                Ok(false) => {}
                Err(e) => done.failed.push(format!("{pid}: {e}")),
            }
        }
    }
    done
}

/// Writes a process's `oom_score_adj`; `Ok(false)` when the process is gone.
fn write_adj(path: &Path, value: i64) -> std::io::Result<bool> {
    match std::fs::write(path, value.to_string()) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// What the last alignment did and found (`companion.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AlignReport {
    /// The OOM domain's pages (`totalpages`): the kubepods limit, else memory and swap.
    pub total_pages: u64,
    /// kubelet's eviction order for memory, first the pod it evicts first.
    pub kubelet_order: Vec<String>,
    /// The value each Burstable pod's processes got.
    pub values: BTreeMap<String, i64>,
    /// The pod the kernel OOM killer would pick now.
    pub kernel_first: Option<String>,
    /// `(kubelet's earlier, kernel's earlier)` pairs no value in kubelet's range can order.
    pub inversions: Vec<(String, String)>,
    /// Processes whose value could not be written (pid: error).
    pub failed: Vec<String>,
}

fn read_i64(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A process's points as `oom_badness` counts them, and its current value.
fn task(pid: i32, cgroup: String, page_kb: i64) -> Option<Task> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| -> i64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    let rss = kb("RssAnon:") + kb("RssFile:") + kb("RssShmem:");
    let points = (rss + kb("VmSwap:") + kb("VmPTE:")) / page_kb.max(1);
    let adj = read_i64(Path::new(&format!("/proc/{pid}/oom_score_adj")))?;
    Some(Task {
        pid,
        points,
        adj,
        cgroup,
    })
}

/// The OOM domain's total pages: the kubepods cgroup's memory limit when it has one (the OOM
/// kill there is the memcg's), else the machine's memory and swap.
#[must_use]
pub fn total_pages(kubepods: Option<&PodCgroup>) -> u64 {
    let page = u64::try_from(rustix::param::page_size()).unwrap_or(4096);
    let machine = u64::try_from(crate::node::machine_memory().unwrap_or(0)).unwrap_or(0)
        + std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("SwapTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map_or(0, |kb| kb * 1024);
    let limit = kubepods
        .and_then(PodCgroup::limit)
        .and_then(|l| u64::try_from(l).ok());
    limit.filter(|l| *l < machine).unwrap_or(machine) / page
}

/// One alignment pass over the watched pods (blocking: file reads and writes); kubelet's
/// value of each container it re-scores is kept in `originals` first.
#[must_use]
pub fn align_once(
    layout: &CgroupLayout,
    kubepods: &str,
    active: &BTreeMap<String, ActiveEntry>,
    originals: &mut Originals,
) -> AlignReport {
    if !layout.memory_mounted() {
        return AlignReport::default();
    }
    let page_kb = i64::try_from(rustix::param::page_size() / 1024).unwrap_or(4);
    let total = total_pages(PodCgroup::resolve(layout, kubepods).as_ref());
    let unit = align::unit(total);
    // Per pod: its tasks and its working set.
    let mut tasks: BTreeMap<&str, Vec<Task>> = BTreeMap::new();
    let mut stats: BTreeMap<&str, PodStats> = BTreeMap::new();
    for (uid, e) in active {
        let Some(pod) = PodCgroup::resolve(layout, &e.cgroup) else {
            continue;
        };
        let mut pids = pod.processes(2);
        pids.sort_unstable();
        pids.dedup_by_key(|(p, _)| *p);
        let ts: Vec<Task> = pids
            .into_iter()
            .filter_map(|(p, d)| task(p, pod.relative(&d)?, page_kb))
            .filter(|t| t.adj > SANDBOX_OOM_SCORE_ADJ)
            .collect();
        if ts.is_empty() {
            continue;
        }
        stats.insert(
            uid,
            PodStats {
                memory: crate::node::working_set(pod.dir()).ok(),
                ..PodStats::default()
            },
        );
        tasks.insert(uid, ts);
    }
    // kubelet's memory ranking; the pods it never evicts (critical) after the others.
    let uids: Vec<&str> = tasks.keys().copied().collect();
    let pods: Vec<ActivePod<'_>> = uids
        .iter()
        .filter_map(|u| {
            let e = active.get(*u)?;
            Some(ActivePod::new(&e.pod, stats.get(u)).with_facts(&e.facts))
        })
        .collect();
    let mut order: Vec<usize> = rank(Signal::MemoryAvailable, &pods);
    order.sort_by_key(|&i| pods.get(i).is_some_and(ActivePod::is_critical));
    let ranked: Vec<Candidate<'_>> = order
        .iter()
        .filter_map(|&i| {
            let uid = *uids.get(i)?;
            let pod = pods.get(i)?.pod;
            let ts = tasks.get(uid)?;
            let adjustable = pod_qos(pod) == QosClass::Burstable && !is_node_critical(pod);
            let score = if adjustable {
                Score::Adjustable {
                    points: ts.iter().map(|t| t.points).max().unwrap_or(0),
                }
            } else {
                Score::Fixed {
                    badness: ts
                        .iter()
                        .filter(|t| t.adj > -1000)
                        .map(|t| t.points + t.adj * unit)
                        .max()
                        .unwrap_or(i64::MIN),
                }
            };
            Some(Candidate { uid, score })
        })
        .collect();
    let al = align::align(&ranked, unit);
    let mut report = AlignReport {
        total_pages: total,
        kubelet_order: ranked.iter().map(|c| c.uid.to_owned()).collect(),
        values: al.values.iter().cloned().collect(),
        kernel_first: al.kernel_first.clone(),
        inversions: al.inversions.clone(),
        failed: Vec::new(),
    };
    originals.prune(layout);
    for (uid, value) in &al.values {
        for t in tasks.get(uid.as_str()).into_iter().flatten() {
            if t.adj == *value {
                continue;
            }
            originals.note(&t.cgroup, t.adj);
            let path = PathBuf::from(format!("/proc/{}/oom_score_adj", t.pid));
            // `Ok(false)`: exited meanwhile.
            if let Err(e) = write_adj(&path, *value) {
                report.failed.push(format!("{}: {e}", t.pid));
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelets_value_is_kept_once_saved_loaded_and_pruned() {
        let state = tempfile::tempdir().expect("tempdir");
        let mount = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(mount.path().join("kubepods/pod1/c1")).expect("mkdir");
        let mut o = Originals::load(state.path()).expect("no record: empty");
        assert!(o.is_empty());
        o.note("kubepods/pod1/c1", 992);
        // The companion's own value, seen at the next round, is not kubelet's.
        o.note("kubepods/pod1/c1", 999);
        o.note("kubepods/pod2/c2", 500);
        let layout = CgroupLayout::parse(
            &format!(
                "1 0 0:1 / {} rw - cgroup cgroup rw,memory\n",
                mount.path().display()
            ),
            "#subsys_name\thierarchy\nmemory\t3\t1\t1\n",
        );
        o.prune(&layout);
        assert_eq!(o.len(), 1, "the gone container is forgotten: {o:?}");
        o.save(state.path()).expect("save");
        let back = Originals::load(state.path()).expect("load");
        assert_eq!(back, o);
        assert_eq!(back.0.get("kubepods/pod1/c1"), Some(&992));
        Originals::default().save(state.path()).expect("empty");
        assert!(
            !state.path().join(ORIGINALS_FILE).exists(),
            "an empty record is no file"
        );
    }

    #[test]
    fn a_damaged_record_is_an_error_naming_it() {
        let state = tempfile::tempdir().expect("tempdir");
        std::fs::write(state.path().join(ORIGINALS_FILE), "{not json").expect("write");
        let e = Originals::load(state.path()).expect_err("damaged");
        assert!(e.to_string().contains(ORIGINALS_FILE), "{e}");
    }
}
