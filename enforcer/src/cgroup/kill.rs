//! Killing a pod through its cgroup: what a hard memory eviction does first.

use crate::cgroup::{CgroupLayout, CgroupVersion, join_inside};

/// Sends SIGKILL to every process in a pod cgroup (and its container cgroups) of the memory
/// hierarchy; `cgroup.kill` where cgroup v2 offers it. Returns how many processes were signalled
/// (1 for cgroup.kill).
pub fn kill_pod_cgroup(layout: &CgroupLayout, rel: &str) -> usize {
    let Some((mount, version)) = layout.controller("memory") else {
        return 0;
    };
    let Ok(dir) = join_inside(mount, rel) else {
        return 0;
    };
    if version == CgroupVersion::V2 && std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return 1;
    }
    let mut killed = 0;
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            for pid in text
                .lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .filter(|p| *p > 1)
            {
                let Some(pid) = rustix::process::Pid::from_raw(pid) else {
                    continue;
                };
                if rustix::process::kill_process(pid, rustix::process::Signal::KILL).is_ok() {
                    killed += 1;
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            stack.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    killed
}
