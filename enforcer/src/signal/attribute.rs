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
//!   controller is read (the task is alive: it is the one reclaiming or being killed).
//! - Fork records concern the `pids` controller, resolved the same way.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use enforcer_common::{RecordKind, absent};

use super::{Signal, SignalKind, SourceKind, decode::RawRecord};
use crate::cgroup::{CgroupLayout, CgroupVersion};

/// Turns raw records into attributed signals. Owned by the one task that reads the ring.
#[derive(Debug)]
pub struct Attributor {
    layout: CgroupLayout,
    proc_root: PathBuf,
    /// v2 cgroup id (directory inode) -> path relative to the unified root.
    v2_paths: HashMap<u64, String>,
}

impl Attributor {
    /// Builds the attributor and indexes the unified hierarchy (if mounted).
    #[must_use]
    pub fn new(layout: CgroupLayout) -> Self {
        let mut a = Self {
            layout,
            proc_root: PathBuf::from("/proc"),
            v2_paths: HashMap::new(),
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

    /// The memory-side cgroup of a task event: (path, hierarchy name).
    fn resolve_task(&mut self, pid: u32, v2_id: u64, controller: &str) -> Option<(String, String)> {
        match self.layout.controller(controller) {
            Some((_, CgroupVersion::V1)) => self.task_path(pid, controller),
            _ if v2_id > 1 => self.v2_path(v2_id).map(|p| (p, "unified".to_owned())),
            _ => self.task_path(pid, controller),
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
        };
        let mut s = Signal::new(kind, SourceKind::Ebpf);
        s.kernel_ns = Some(r.ts_ns);
        s.count = r.count;
        match raw.kind {
            RecordKind::CgroupMkdir | RecordKind::CgroupRmdir => {
                let path = raw.path();
                let id = raw.has(absent::CGROUP_ID).then_some(r.cgroup_id);
                let v2 = raw.has(absent::HIERARCHY) && r.hierarchy == 0;
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
                if let Some((path, h)) = self.resolve_task(r.pid, r.cgroup_id, "memory") {
                    s.set_cgroup(path, h);
                }
            }
            RecordKind::OomVictim => {
                // Fields this kernel's `oom/mark_victim` lacks (Debian 6.1 has only `pid`) stay
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
                let victim_path = victim.and_then(|p| self.task_path(p, "memory"));
                let resolved = match self.layout.controller("memory") {
                    Some((_, CgroupVersion::V1)) | None => {
                        victim_path.or_else(|| self.task_path(r.tid, "memory"))
                    }
                    Some((_, CgroupVersion::V2)) => victim_path
                        .or_else(|| self.v2_path(r.cgroup_id).map(|p| (p, "unified".to_owned()))),
                };
                if let Some((path, h)) = resolved {
                    s.set_cgroup(path, h);
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
        }
        s
    }

    /// Root of a hierarchy by name (`unified` or a controller): for tests and the CLI.
    #[must_use]
    pub fn mount_of(&self, controller: &str) -> Option<&Path> {
        self.layout.controller(controller).map(|(p, _)| p)
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
    fn oom_fields_the_kernel_lacks_stay_unset_not_zero() {
        let mut a = Attributor::new(CgroupLayout::default());
        // Debian 6.1: mark_victim has only `pid`.
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
    }
}
