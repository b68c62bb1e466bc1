//! The companion's `oom_score_adj` alignment on the node: each watched pod's processes read in
//! `/proc` (resident memory, swap, page tables, current value), the pods ranked as kubelet's
//! eviction manager ranks them for memory, the pure alignment (`policy::oom::align`) computed,
//! the changed values written, and what it could not fix kept for `companion.json`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::Serialize;

use crate::{
    cgroup::{CgroupLayout, CgroupVersion, join_inside},
    policy::{
        eviction::{ActivePod, PodStats, Signal, rank::rank},
        oom::align::{self, Candidate, Score},
        qos::{QosClass, pod_qos},
        resources::is_node_critical,
    },
    runtime::ActiveEntry,
};

/// kubelet's `oom_score_adj` of a pod's sandbox (pause) process: never a container's.
const SANDBOX_OOM_SCORE_ADJ: i64 = -998;

/// One process of a pod as the kernel scores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Task {
    pid: i32,
    /// rss + swap entries + page tables, in pages.
    points: i64,
    adj: i64,
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

/// The process ids in `dir` and below (v2 keeps them in leaves; v1 in every level).
pub(super) fn pids_below(dir: &Path, depth: u8, out: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if depth == 0 {
        return;
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                pids_below(&e.path(), depth - 1, out);
            }
        }
    }
}

/// A process's points as `oom_badness` counts them, and its current value.
fn task(pid: i32, page_kb: i64) -> Option<Task> {
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
    Some(Task { pid, points, adj })
}

/// The OOM domain's total pages: the kubepods cgroup's memory limit when it has one (the OOM
/// kill there is the memcg's), else the machine's memory and swap.
#[must_use]
pub fn total_pages(kubepods: Option<&Path>, version: Option<CgroupVersion>) -> u64 {
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
    let limit = kubepods.and_then(|d| {
        let file = match version? {
            CgroupVersion::V2 => "memory.max",
            CgroupVersion::V1 => "memory.limit_in_bytes",
        };
        std::fs::read_to_string(d.join(file))
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    });
    limit.filter(|l| *l < machine).unwrap_or(machine) / page
}

/// One alignment pass over the watched pods (blocking: file reads and writes).
#[must_use]
pub fn align_once(
    layout: &CgroupLayout,
    kubepods: &str,
    active: &BTreeMap<String, ActiveEntry>,
) -> AlignReport {
    let Some((mount, version)) = layout.controller("memory") else {
        return AlignReport::default();
    };
    let page_kb = i64::try_from(rustix::param::page_size() / 1024).unwrap_or(4);
    let kubepods_dir = join_inside(mount, kubepods).ok();
    let total = total_pages(kubepods_dir.as_deref(), Some(version));
    let unit = align::unit(total);
    // Per pod: its tasks and its working set.
    let mut tasks: BTreeMap<&str, Vec<Task>> = BTreeMap::new();
    let mut stats: BTreeMap<&str, PodStats> = BTreeMap::new();
    for (uid, e) in active {
        let Ok(dir) = join_inside(mount, &e.cgroup) else {
            continue;
        };
        let mut pids = Vec::new();
        pids_below(&dir, 2, &mut pids);
        pids.sort_unstable();
        pids.dedup();
        let ts: Vec<Task> = pids
            .into_iter()
            .filter_map(|p| task(p, page_kb))
            .filter(|t| t.adj > SANDBOX_OOM_SCORE_ADJ)
            .collect();
        if ts.is_empty() {
            continue;
        }
        stats.insert(
            uid,
            PodStats {
                memory: crate::node::working_set(&dir).ok(),
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
    for (uid, value) in &al.values {
        for t in tasks.get(uid.as_str()).into_iter().flatten() {
            if t.adj == *value {
                continue;
            }
            let path = PathBuf::from(format!("/proc/{}/oom_score_adj", t.pid));
            match std::fs::write(&path, value.to_string()) {
                Ok(()) => {}
                // Exited meanwhile.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => report.failed.push(format!("{}: {e}", t.pid)),
            }
        }
    }
    report
}
