//! What a crossing reads of each pod ([`super::PodScope::Usage`]): its memory cgroup's
//! usage counter through a file descriptor opened at the pod's first full read: one
//! `pread(2)` of a few bytes into a buffer on the stack, no path walked, no file opened, no
//! `memory.stat` generated. The working set is that usage less the inactive file pages the
//! last full read found (kubelet's own figures are up to 10 s old; the usage here is read at
//! the crossing itself). Where the kernel offers it, the usage counters of every pod come
//! from one walk of the memory cgroup iterator ([`crate::kernel::memcg_iter`]) instead, found
//! by the pod cgroup directory's inode; the file stays open as the fallback.

use std::{
    fs::File,
    os::unix::fs::{FileExt as _, MetadataExt as _},
    path::Path,
};

/// One pod's usage file, open, and the inactive file pages of its last full read.
#[derive(Debug)]
pub(super) struct UsageFd {
    /// The pod cgroup it was opened for (a pod whose cgroup changed is opened again).
    pub cgroup: String,
    file: File,
    /// The pod cgroup directory's inode number (what the memory cgroup iterator reports).
    pub ino: u64,
    pub inactive: i64,
}

impl UsageFd {
    /// Opens the usage file of the memory cgroup `dir` (the pod cgroup `cgroup`).
    pub fn open(cgroup: &str, dir: &Path, inactive: i64) -> Option<Self> {
        let file = File::open(crate::node::usage_file(dir)).ok()?;
        let ino = std::fs::metadata(dir).ok()?.ino();
        Some(Self {
            cgroup: cgroup.to_owned(),
            file,
            ino,
            inactive,
        })
    }

    /// The working set for a usage figure read elsewhere (the iterator's walk).
    pub fn working_set_of(&self, usage: i64) -> i64 {
        usage.saturating_sub(self.inactive).max(0)
    }

    /// The working set now: the usage counter less the last inactive figure (`None`: the
    /// cgroup is gone or the file unreadable).
    pub fn working_set(&self) -> Option<i64> {
        let mut buf = [0u8; 24];
        let n = self.file.read_at(&mut buf, 0).ok()?;
        let usage = parse_counter(buf.get(..n)?)?;
        Some(self.working_set_of(usage))
    }
}

/// A cgroup counter file's text (`123456\n`) as a number, without allocating.
pub(super) fn parse_counter(text: &[u8]) -> Option<i64> {
    let digits = text.strip_suffix(b"\n").unwrap_or(text);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0i64, |acc, b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(i64::from(b - b'0'))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_parse_without_allocating_and_garbage_is_refused() {
        assert_eq!(parse_counter(b"8832905216\n"), Some(8_832_905_216));
        assert_eq!(parse_counter(b"0"), Some(0));
        for bad in [
            &b""[..],
            b"\n",
            b"max\n",
            b"12 34\n",
            b"-1\n",
            b"99999999999999999999\n",
        ] {
            assert_eq!(parse_counter(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_working_set_is_the_fresh_usage_less_the_last_inactive_figure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let usage = dir.path().join("memory.current");
        std::fs::write(&usage, "1000\n").expect("write");
        let fd = UsageFd::open("/kubepods/podu", dir.path(), 300).expect("open");
        assert_eq!(fd.working_set(), Some(700));
        // The counter read again, through the same descriptor.
        std::fs::write(&usage, "5000\n").expect("write");
        assert_eq!(fd.working_set(), Some(4700));
        std::fs::write(&usage, "100\n").expect("write");
        assert_eq!(fd.working_set(), Some(0), "floored at 0");
    }
}
