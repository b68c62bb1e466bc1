//! What a crossing reads of the node ([`super::PodScope::Usage`]): the working sets of the
//! node and of kubepods, as [`crate::node::NodeObserver::observe_memory`] computes them, from
//! files opened once (at a full refresh) and read again with `pread(2)` into one buffer: no
//! path walked, no file opened or allocated at the crossing. Still read whole and fresh, as
//! kubelet's figures are (usage less the inactive file pages of the same moment).

use std::{fs::File, os::unix::fs::FileExt as _, path::Path};

use super::usage::parse_counter;
use crate::{
    cgroup::{Hierarchy, RootMemory},
    node::{NodeObserver, meminfo_bytes, stat_value},
};

/// A memory cgroup's usage and `memory.stat`, open.
#[derive(Debug)]
struct CgroupFiles {
    usage: File,
    stat: File,
    /// The inactive file pages' key: v1 `total_inactive_file` (hierarchical), v2
    /// `inactive_file`.
    inactive_key: &'static str,
}

impl CgroupFiles {
    fn open(dir: &Path, memory: Hierarchy<'_>) -> Option<Self> {
        let (usage, key) = memory.usage_files();
        Some(Self {
            usage: File::open(dir.join(usage)).ok()?,
            stat: File::open(dir.join("memory.stat")).ok()?,
            inactive_key: key,
        })
    }

    /// (usage - inactive_file floored at 0, usage).
    fn working_set(&self, buf: &mut Vec<u8>) -> Option<(i64, i64)> {
        let usage = parse_counter(pread_all(&self.usage, buf)?)?;
        let stat = std::str::from_utf8(pread_all(&self.stat, buf)?).ok()?;
        let inactive = stat_value(stat, self.inactive_key).unwrap_or(0);
        Some((usage.saturating_sub(inactive).max(0), usage))
    }
}

/// The node's own figure.
#[derive(Debug)]
enum Root {
    /// v1: the root memory cgroup.
    Cgroup(CgroupFiles),
    /// v2 (no root `memory.current`): `/proc/meminfo`, MemTotal - MemFree - Inactive(file).
    Meminfo(File),
    /// A capacity override: the node is kubepods.
    Kubepods,
}

/// The node's and kubepods' memory files, open.
#[derive(Debug)]
pub(super) struct NodeMemory {
    kubepods: CgroupFiles,
    root: Root,
    /// Read buffer, reused.
    buf: Vec<u8>,
}

impl NodeMemory {
    /// Opens the files `observer` reads (`None`: one is missing; the caller reads by path).
    pub fn open(observer: &NodeObserver) -> Option<Self> {
        let memory = observer.layout.memory()?;
        let kubepods = CgroupFiles::open(&observer.pod_memory_dir(&observer.kubepods)?, memory)?;
        let root = match (observer.capacity_override, memory.root_memory()) {
            (true, _) => Root::Kubepods,
            (false, RootMemory::Cgroup(dir)) => Root::Cgroup(CgroupFiles::open(dir, memory)?),
            (false, RootMemory::Meminfo) => Root::Meminfo(File::open("/proc/meminfo").ok()?),
        };
        Some(Self {
            kubepods,
            root,
            buf: Vec::with_capacity(16 * 1024),
        })
    }

    /// The node's figures now (`None`: a read failed).
    pub fn read(&mut self) -> Option<NodeMemoryNow> {
        let (kubepods, kubepods_usage) = self.kubepods.working_set(&mut self.buf)?;
        let node = match &self.root {
            Root::Kubepods => kubepods,
            Root::Cgroup(files) => files.working_set(&mut self.buf)?.0,
            Root::Meminfo(file) => {
                let text = std::str::from_utf8(pread_all(file, &mut self.buf)?).ok()?;
                let bytes = |key: &str| meminfo_bytes(text, key).unwrap_or(0);
                (bytes("MemTotal:") - bytes("MemFree:") - bytes("Inactive(file):")).max(0)
            }
        };
        Some(NodeMemoryNow {
            node_ws: node,
            kubepods_ws: kubepods,
            kubepods_usage,
        })
    }
}

/// What [`NodeMemory::read`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct NodeMemoryNow {
    pub node_ws: i64,
    pub kubepods_ws: i64,
    /// kubepods' usage, page cache included ([`crate::node::NodeObserver::kubepods_usage`]).
    pub kubepods_usage: i64,
}

/// The whole file from offset 0, into `buf` (grown when a read fills it).
fn pread_all<'a>(file: &File, buf: &'a mut Vec<u8>) -> Option<&'a [u8]> {
    if buf.len() < 4096 {
        buf.resize(buf.capacity().max(4096), 0);
    }
    loop {
        let n = file.read_at(buf, 0).ok()?;
        if n < buf.len() {
            return buf.get(..n);
        }
        // Filled: the file may be longer; read it again whole into a larger buffer.
        let more = buf.len() * 2;
        buf.resize(more, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_longer_than_the_buffer_is_read_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("memory.stat");
        let mut text = "x 1\n".repeat(3000);
        text.push_str("total_inactive_file 77\n");
        std::fs::write(&path, &text).expect("write");
        let file = File::open(&path).expect("open");
        let mut buf = Vec::new();
        let got = pread_all(&file, &mut buf).expect("read");
        assert_eq!(got.len(), text.len());
        let text = std::str::from_utf8(got).expect("text");
        assert_eq!(stat_value(text, "total_inactive_file"), Some(77));
    }
}
