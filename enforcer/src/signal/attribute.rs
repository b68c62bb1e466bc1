//! Attribution: from a kernel record to the cgroup (and pod) it concerns.
//!
//! - mkdir/rmdir records carry the hierarchy id and the path itself.
//! - A slot the record flags as absent (the running kernel's tracepoint lacks the field) is
//!   left unset in the signal, never read as zero.
//! - Memory events (reclaim, OOM) concern the task's *memory* cgroup. On cgroup v2 that is the
//!   task's v2 cgroup, whose id the record carries (`bpf_get_current_cgroup_id`); the id is the
//!   inode of the cgroup directory, mapped to a path by a table built from a walk of the
//!   unified hierarchy and kept current by mkdir/rmdir records. On cgroup v1 the v2 id says
//!   nothing about the memory cgroup, so the task's `/proc/<pid>/cgroup` line for the memory
//!   controller is read (the task is alive: it is the one reclaiming or being killed). An OOM
//!   victim may already have exited when its record is read (an exited task reads `/` there):
//!   it is then attributed to the memory cgroup its last reclaim record resolved to.
//! - Fork records concern the `pids` controller, resolved the same way.

use std::{collections::HashMap, fs, os::unix::fs::MetadataExt as _, path::PathBuf};

use enforcer_common::{RecordKind, absent};

use super::{Signal, SignalKind, SourceKind, decode::RawRecord};
use crate::cgroup::CgroupLayout;

/// Turns raw records into attributed signals. Owned by the one task that reads the ring.
#[derive(Debug)]
pub struct Attributor {
    layout: CgroupLayout,
    proc_root: PathBuf,
    /// v2 cgroup id (directory inode) -> path relative to the unified root.
    v2_paths: HashMap<u64, String>,
    /// pid -> the memory cgroup its last memory event resolved to (bounded, see
    /// [`Self::remember`]): an OOM victim may have exited (a zombie reads `/` on cgroup v1)
    /// before its record is attributed, but it reclaimed in its cgroup just before.
    recent_memcg: HashMap<u32, (String, String)>,
}

/// Tasks whose memory cgroup is remembered at most (the map is cleared when full).
const RECENT_MEMCG_TASKS: usize = 4096;

impl Attributor {
    /// Builds the attributor and indexes the unified hierarchy (if mounted).
    #[must_use]
    pub fn new(layout: CgroupLayout) -> Self {
        let mut a = Self {
            layout,
            proc_root: PathBuf::from("/proc"),
            v2_paths: HashMap::new(),
            recent_memcg: HashMap::new(),
        };
        a.reindex();
        a
    }

    /// The layout this attributor resolves against.
    #[must_use]
    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    /// Re-walks the unified hierarchy to rebuild the id -> path table.
    pub fn reindex(&mut self) {
        self.v2_paths.clear();
        let Some(root) = self.layout.unified.clone() else {
            return;
        };
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = fs::metadata(&dir) else {
                continue;
            };
            let rel = dir
                .strip_prefix(&root)
                .map(|r| format!("/{}", r.display()))
                .unwrap_or_default();
            self.v2_paths
                .insert(meta.ino(), if rel == "/" { "/".to_owned() } else { rel });
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }

    /// Number of v2 cgroups indexed.
    #[must_use]
    pub fn indexed(&self) -> usize {
        self.v2_paths.len()
    }

    /// The path of a v2 cgroup id, re-walking once on a miss.
    fn v2_path(&mut self, id: u64) -> Option<String> {
        if let Some(p) = self.v2_paths.get(&id) {
            return Some(p.clone());
        }
        self.reindex();
        self.v2_paths.get(&id).cloned()
    }

    /// The task's cgroup path for a controller, from `/proc/<pid>/cgroup`.
    fn task_path(&self, pid: u32, controller: &str) -> Option<(String, String)> {
        let text = fs::read_to_string(self.proc_root.join(pid.to_string()).join("cgroup")).ok()?;
        task_cgroup_line(&text, controller)
    }

    /// Notes the memory cgroup a task's event resolved to (not the root: where exited tasks
    /// appear).
    fn remember(&mut self, pid: u32, resolved: &(String, String)) {
        if resolved.0 == "/" {
            return;
        }
        if self.recent_memcg.len() >= RECENT_MEMCG_TASKS && !self.recent_memcg.contains_key(&pid) {
            self.recent_memcg.clear();
        }
        self.recent_memcg.insert(pid, resolved.clone());
    }

    /// A task's memory cgroup from `/proc`, or, when it is gone or reads as the root (an exited
    /// task does), where its last memory event was.
    fn task_memcg(&self, pid: u32) -> Option<(String, String)> {
        match self.task_path(pid, "memory") {
            Some(p) if p.0 != "/" => Some(p),
            live => self.recent_memcg.get(&pid).cloned().or(live),
        }
    }

    /// The memory-side cgroup of a task event: (path, hierarchy name).
    fn resolve_task(&mut self, pid: u32, v2_id: u64, controller: &str) -> Option<(String, String)> {
        let hierarchy = match controller {
            "memory" => self.layout.memory(),
            _ => self.layout.pids(),
        };
        if hierarchy.is_none_or(|h| h.ids_name_cgroups()) && v2_id > 1 {
            self.v2_path(v2_id).map(|p| (p, "unified".to_owned()))
        } else {
            self.task_path(pid, controller)
        }
    }

    /// Attributes one record.
    pub fn attribute(&mut self, raw: &RawRecord) -> Signal {
        let r = &raw.rec;
        let kind = match raw.kind {
            RecordKind::CgroupMkdir => SignalKind::CgroupCreated,
            RecordKind::CgroupRmdir => SignalKind::CgroupRemoved,
            RecordKind::MemcgReclaim => SignalKind::MemcgReclaim,
            RecordKind::DirectReclaim => SignalKind::DirectReclaim,
            RecordKind::OomVictim => SignalKind::OomKill,
            RecordKind::Fork => SignalKind::Fork,
            RecordKind::Probe => SignalKind::Probe,
            RecordKind::MemcgCrossing => SignalKind::MemoryThreshold,
        };
        let mut s = Signal::new(kind, SourceKind::Ebpf);
        s.kernel_ns = Some(r.ts_ns);
        s.count = r.count;
        match raw.kind {
            RecordKind::CgroupMkdir | RecordKind::CgroupRmdir => {
                let mut path = raw.path();
                let id = raw.has(absent::CGROUP_ID).then_some(r.cgroup_id);
                let v2 = raw.has(absent::HIERARCHY) && r.hierarchy == 0;
                // A path cut short by the record: the whole one by the cgroup's id (the
                // index, walked again for a new cgroup; an rmdir's from its mkdir).
                if let (true, true, Some(id)) = (raw.path_truncated(), v2, id) {
                    let full = if raw.kind == RecordKind::CgroupMkdir {
                        self.v2_paths.remove(&id);
                        self.v2_path(id)
                    } else {
                        self.v2_paths.get(&id).cloned()
                    };
                    if let Some(full) = full {
                        path = full;
                    }
                }
                if let (true, Some(id), true) = (v2, id, raw.has(absent::PATH)) {
                    if raw.kind == RecordKind::CgroupMkdir {
                        self.v2_paths.insert(id, path.clone());
                    } else {
                        self.v2_paths.remove(&id);
                    }
                }
                s.cgroup_id = id;
                s.detail.level = raw.has(absent::ARG0).then_some(r.arg0);
                if raw.has(absent::PATH) {
                    let name = if raw.has(absent::HIERARCHY) {
                        self.layout.hierarchy_name(r.hierarchy)
                    } else {
                        "unknown".to_owned()
                    };
                    s.set_cgroup(path, name);
                }
            }
            RecordKind::MemcgReclaim | RecordKind::DirectReclaim => {
                s.pid = Some(r.pid);
                s.detail.order = raw.has(absent::ARG0).then_some(r.arg0);
                s.detail.gfp_flags = raw.has(absent::ARG1).then_some(r.arg1);
                if r.cgroup_id > 1 {
                    s.cgroup_id = Some(r.cgroup_id);
                }
                if let Some(resolved) = self.resolve_task(r.pid, r.cgroup_id, "memory") {
                    self.remember(r.pid, &resolved);
                    s.set_cgroup(resolved.0, resolved.1);
                }
            }
            RecordKind::OomVictim => {
                // Fields this kernel's `oom/mark_victim` lacks (upstream 6.1 has only `pid`) stay
                // unset: a zero there is not a value.
                let victim = raw.has(absent::PID).then_some(r.pid);
                s.pid = victim;
                s.comm = raw
                    .has(absent::PATH)
                    .then(|| raw.path())
                    .filter(|c| !c.is_empty());
                s.detail.oom_score_adj = raw.has(absent::ARG0).then_some(r.arg0 as i32);
                s.detail.anon_rss_bytes =
                    raw.has(absent::ARG1).then_some(r.arg1.saturating_mul(1024));
                // The victim first; if it is already gone, the task that hit the OOM (which,
                // for a memcg OOM, is in the same memory cgroup).
                let victim_path = victim.and_then(|p| self.task_memcg(p));
                let resolved = if self.layout.memory().is_some_and(|m| m.ids_name_cgroups()) {
                    victim_path
                        .or_else(|| self.v2_path(r.cgroup_id).map(|p| (p, "unified".to_owned())))
                } else {
                    victim_path.or_else(|| self.task_memcg(r.tid))
                };
                if let Some((path, h)) = resolved {
                    s.set_cgroup(path, h);
                }
                if let Some(v) = victim {
                    self.recent_memcg.remove(&v);
                }
            }
            RecordKind::Fork => {
                s.pid = Some(r.pid);
                if let Some((path, h)) = self.resolve_task(r.pid, r.cgroup_id, "pids") {
                    s.set_cgroup(path, h);
                }
            }
            RecordKind::Probe => {
                s.pid = Some(r.pid);
            }
            RecordKind::MemcgCrossing => {
                // One crossing, whatever attach point saw it.
                s.count = 1;
                s.pid = Some(r.pid);
                s.comm = raw
                    .has(absent::PATH)
                    .then(|| raw.path())
                    .filter(|c| !c.is_empty());
                s.cgroup_id = Some(r.cgroup_id);
                let page = rustix::param::page_size() as u64;
                s.detail.threshold_bytes = Some(u64::from(r.arg0).saturating_mul(page));
                s.detail.usage_bytes = Some(r.arg1.saturating_mul(page));
            }
        }
        s
    }
}

/// Finds a controller's line in `/proc/<pid>/cgroup` text: (path, hierarchy name). On a v2-only
/// controller the `0::` line answers.
#[must_use]
pub fn task_cgroup_line(text: &str, controller: &str) -> Option<(String, String)> {
    let mut unified = None;
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        // A cgroup removed while the task is still dying (a container's scope, as the kernel
        // OOM-kills its last process) reads with the kernel's " (deleted)" after its path.
        let path = path.strip_suffix(" (deleted)").unwrap_or(path);
        if id == "0" && ctrls.is_empty() {
            unified = Some((path.to_owned(), "unified".to_owned()));
        } else if ctrls.split(',').any(|c| c == controller) {
            return Some((path.to_owned(), ctrls.to_owned()));
        }
    }
    unified
}

#[cfg(test)]
mod tests {
    use enforcer_common::{ABI_VERSION, PATH_LEN, SignalRecord};

    use super::*;
    use crate::signal::decode::{decode, encode};

    fn raw(kind: RecordKind, flags: u32, path: &str) -> RawRecord {
        let mut rec = SignalRecord {
            abi: ABI_VERSION,
            kind: kind as u16,
            hierarchy: 0,
            ts_ns: 5,
            // No such task: attribution by /proc finds nothing.
            pid: u32::MAX - 1,
            tid: u32::MAX - 1,
            cgroup_id: 1,
            count: 1,
            arg0: 0,
            arg1: 0,
            flags,
            path: [0; PATH_LEN],
        };
        rec.path[..path.len()].copy_from_slice(path.as_bytes());
        decode(&encode(&rec)).expect("decodes")
    }

    #[test]
    fn a_crossing_record_is_a_memory_threshold_in_bytes() {
        let mut rec = raw(RecordKind::MemcgCrossing, 0, "memhog").rec;
        rec.cgroup_id = 4242;
        rec.arg0 = 25_600;
        rec.arg1 = 25_601;
        rec.count = enforcer_common::crossing_attach::TRACEPOINT;
        let s = Attributor::new(CgroupLayout::default())
            .attribute(&decode(&encode(&rec)).expect("decodes"));
        let page = rustix::param::page_size() as u64;
        assert_eq!(s.kind, SignalKind::MemoryThreshold);
        assert_eq!(s.source, SourceKind::Ebpf);
        assert_eq!(s.count, 1, "one crossing, not the attach point's number");
        assert_eq!(s.cgroup_id, Some(4242));
        assert_eq!(s.comm.as_deref(), Some("memhog"));
        assert_eq!(s.detail.threshold_bytes, Some(25_600 * page));
        assert_eq!(s.detail.usage_bytes, Some(25_601 * page));
        assert!(
            crate::eviction_manager::is_urgent(&s),
            "a crossing steps at once"
        );
    }

    #[test]
    fn oom_fields_the_kernel_lacks_stay_unset_not_zero() {
        let mut a = Attributor::new(CgroupLayout::default());
        // Upstream 6.1: mark_victim has only `pid`.
        let s = a.attribute(&raw(
            RecordKind::OomVictim,
            absent::ARG0 | absent::ARG1 | absent::PATH,
            "",
        ));
        assert_eq!(s.kind, SignalKind::OomKill);
        assert_eq!(s.pid, Some(u32::MAX - 1));
        assert_eq!(
            (s.comm, s.detail.oom_score_adj, s.detail.anon_rss_bytes),
            (None, None, None)
        );
        // A kernel with every field: zeroes are values.
        let s = a.attribute(&raw(RecordKind::OomVictim, 0, "memhog"));
        assert_eq!(s.comm.as_deref(), Some("memhog"));
        assert_eq!(
            (s.detail.oom_score_adj, s.detail.anon_rss_bytes),
            (Some(0), Some(0))
        );
        // No pid: no victim named.
        let s = a.attribute(&raw(RecordKind::OomVictim, absent::PID, "x"));
        assert_eq!(s.pid, None);
    }

    #[test]
    fn an_exited_oom_victim_is_attributed_where_it_last_reclaimed() {
        let proc = tempfile::tempdir().expect("tempdir");
        let task = proc.path().join((u32::MAX - 1).to_string());
        fs::create_dir_all(&task).expect("mkdir");
        let mut a = Attributor::new(CgroupLayout::default());
        a.proc_root = proc.path().to_owned();
        fs::write(task.join("cgroup"), "4:memory:/kubepods/podA/c1\n0::/\n").expect("write");
        let s = a.attribute(&raw(RecordKind::MemcgReclaim, 0, ""));
        assert_eq!(s.cgroup.as_deref(), Some("/kubepods/podA/c1"));
        // Killed: a zombie reads the root on cgroup v1.
        fs::write(task.join("cgroup"), "4:memory:/\n0::/\n").expect("write");
        let s = a.attribute(&raw(RecordKind::OomVictim, 0, "hog"));
        assert_eq!(s.cgroup.as_deref(), Some("/kubepods/podA/c1"));
        assert_eq!(s.hierarchy.as_deref(), Some("memory"));
        // Forgotten once its OOM record is attributed: /proc answers again.
        let s = a.attribute(&raw(RecordKind::OomVictim, 0, "hog"));
        assert_eq!(s.cgroup.as_deref(), Some("/"));
    }

    #[test]
    fn cgroup_and_reclaim_fields_the_kernel_lacks_stay_unset() {
        let mut a = Attributor::new(CgroupLayout::default());
        let s = a.attribute(&raw(RecordKind::CgroupMkdir, 0, "/a/b"));
        assert_eq!(
            (s.cgroup.as_deref(), s.cgroup_id, s.detail.level),
            (Some("/a/b"), Some(1), Some(0))
        );
        assert_eq!(s.hierarchy.as_deref(), Some("unified"));
        let s = a.attribute(&raw(
            RecordKind::CgroupMkdir,
            absent::CGROUP_ID | absent::ARG0 | absent::HIERARCHY,
            "/a/c",
        ));
        assert_eq!(
            (s.cgroup.as_deref(), s.cgroup_id, s.detail.level),
            (Some("/a/c"), None, None)
        );
        assert_eq!(s.hierarchy.as_deref(), Some("unknown"));
        let s = a.attribute(&raw(RecordKind::CgroupRmdir, absent::PATH, ""));
        assert_eq!(s.cgroup, None);
        let s = a.attribute(&raw(RecordKind::MemcgReclaim, absent::ARG1, ""));
        assert_eq!((s.detail.order, s.detail.gfp_flags), (Some(0), None));
    }

    #[test]
    fn proc_cgroup_lines() {
        let text = "9:name=systemd:/\n4:memory:/kubepods/podA/c1\n1:cpu,cpuacct:/x\n0::/u/v\n";
        assert_eq!(
            task_cgroup_line(text, "memory"),
            Some(("/kubepods/podA/c1".to_owned(), "memory".to_owned()))
        );
        assert_eq!(
            task_cgroup_line(text, "cpuacct"),
            Some(("/x".to_owned(), "cpu,cpuacct".to_owned()))
        );
        assert_eq!(
            task_cgroup_line(text, "pids"),
            Some(("/u/v".to_owned(), "unified".to_owned()))
        );
        assert_eq!(task_cgroup_line("garbage", "memory"), None);
        // A dying task whose container scope is already removed (the systemd boot's OOM kill
        // test met it): the path without the kernel's suffix, so the container is found.
        let dying = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu1.slice/cri-containerd-abc.scope (deleted)\n";
        assert_eq!(
            task_cgroup_line(dying, "memory"),
            Some((
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu1.slice/cri-containerd-abc.scope".to_owned(),
                "unified".to_owned()
            ))
        );
    }
}
