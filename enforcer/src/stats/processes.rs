//! A cgroup's processes as cAdvisor reads them for its `ProcessMetrics`: the processes listed
//! in its own `cgroup.procs` (not its children's), the threads and their limit of the pids
//! controller (`pids.current`, `pids.max`), and over those processes their open file
//! descriptors, the sockets among them, and the soft `Max open files` limit.

use std::path::Path;

/// One cgroup's process figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Processes {
    pub processes: u64,
    pub fds: u64,
    pub sockets: u64,
    /// `pids.current`.
    pub threads: Option<u64>,
    /// `pids.max` (0 when `max`, cAdvisor's unlimited).
    pub threads_max: Option<u64>,
    /// The soft `Max open files` of the cgroup's first process.
    pub max_open_files: Option<u64>,
}

/// The soft limit of `Max open files` in a `/proc/<pid>/limits` text (`unlimited` is none).
#[must_use]
pub fn soft_max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The figures of the cgroup directory `dir` (any hierarchy listing its processes) and of its
/// pids controller's directory `pids`, reading `/proc` under `proc_root`; `None` where the
/// cgroup is not there.
#[must_use]
pub fn read(dir: &Path, pids: Option<&Path>, proc_root: &Path) -> Option<Processes> {
    let mut out = Processes::default();
    let listed = std::fs::read_to_string(dir.join("cgroup.procs")).ok()?;
    for pid in listed.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
        out.processes += 1;
        let proc_dir = proc_root.join(pid.to_string());
        if out.max_open_files.is_none() {
            out.max_open_files = std::fs::read_to_string(proc_dir.join("limits"))
                .ok()
                .as_deref()
                .and_then(soft_max_open_files);
        }
        let Ok(fds) = std::fs::read_dir(proc_dir.join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            out.fds += 1;
            if std::fs::read_link(fd.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
            {
                out.sockets += 1;
            }
        }
    }
    if let Some(pids) = pids {
        let read = |f: &str| std::fs::read_to_string(pids.join(f)).ok();
        out.threads = read("pids.current").and_then(|v| v.trim().parse().ok());
        out.threads_max = read("pids.max").and_then(|v| match v.trim() {
            "max" => Some(0),
            n => n.parse().ok(),
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_descriptors_sockets_and_threads_as_cadvisor_counts_them() {
        let d = tempfile::tempdir().expect("tempdir");
        let (cg, pids, proc_root) = (
            d.path().join("cg"),
            d.path().join("pids"),
            d.path().join("proc"),
        );
        for p in [&cg, &pids] {
            std::fs::create_dir_all(p).expect("mkdir");
        }
        std::fs::write(cg.join("cgroup.procs"), "10\n11\nx\n").expect("procs");
        std::fs::write(pids.join("pids.current"), "7\n").expect("current");
        std::fs::write(pids.join("pids.max"), "max\n").expect("max");
        for (pid, targets) in [
            ("10", vec!["/dev/null", "socket:[123]", "pipe:[9]"]),
            ("11", vec!["socket:[5]"]),
        ] {
            let fd = proc_root.join(pid).join("fd");
            std::fs::create_dir_all(&fd).expect("fd dir");
            for (i, t) in targets.iter().enumerate() {
                std::os::unix::fs::symlink(t, fd.join(i.to_string())).expect("symlink");
            }
        }
        std::fs::write(
            proc_root.join("10").join("limits"),
            "Limit                     Soft Limit           Hard Limit           Units\n\
             Max open files            1024                 524288               files\n",
        )
        .expect("limits");
        let p = read(&cg, Some(&pids), &proc_root);
        assert_eq!(
            p,
            Some(Processes {
                processes: 2,
                fds: 4,
                sockets: 2,
                threads: Some(7),
                threads_max: Some(0),
                max_open_files: Some(1024),
            })
        );
        assert_eq!(read(&d.path().join("gone"), None, &proc_root), None);
        assert_eq!(
            soft_max_open_files(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
    }
}
