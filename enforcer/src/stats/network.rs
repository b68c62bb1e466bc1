//! A pod's network counters as cAdvisor reads a container's: `/proc/<pid>/net/dev` of a process
//! in the pod (its network namespace), each interface but those cAdvisor ignores (`lo`,
//! `veth*`, `docker*`, `nerdctl*`).

use std::path::Path;

use crate::cgroup::{CgroupLayout, paths};

/// One interface's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetDev {
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

/// cAdvisor's `ignoredDevicePrefixes`.
const IGNORED: [&str; 4] = ["lo", "veth", "docker", "nerdctl"];

/// `/proc/<pid>/net/dev`'s text: each interface not ignored with its counters, in the file's
/// order; a line that does not parse is left out.
#[must_use]
pub fn parse(text: &str) -> Vec<(String, NetDev)> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            if IGNORED.iter().any(|p| name.starts_with(p)) {
                return None;
            }
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            let g = |i: usize| f.get(i).copied();
            Some((
                name.to_owned(),
                NetDev {
                    rx_bytes: g(0)?,
                    rx_packets: g(1)?,
                    rx_errors: g(2)?,
                    rx_dropped: g(3)?,
                    tx_bytes: g(8)?,
                    tx_packets: g(9)?,
                    tx_errors: g(10)?,
                    tx_dropped: g(11)?,
                },
            ))
        })
        .collect()
}

/// The network counters of the pod whose cgroup is `pod` (relative), read through the first
/// process of the first of `containers` (runtime ids) that has one; `None` when none has.
#[must_use]
pub fn read_pod(
    layout: &CgroupLayout,
    pod: &str,
    containers: &[String],
) -> Option<Vec<(String, NetDev)>> {
    let (mount, _) = layout.controller("memory")?;
    let pod_dir = paths::join_inside(mount, pod).ok()?;
    containers.iter().find_map(|id| {
        let dir = paths::container_dir(&pod_dir, id).ok()?;
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).ok()?;
        let pid: u32 = procs.lines().next()?.trim().parse().ok()?;
        let text =
            std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("net/dev"))
                .ok()?;
        Some(parse(&text))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's format; the interfaces cAdvisor ignores left out; a bad line dropped.
    #[test]
    fn net_dev_as_cadvisor_reads_it() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
            face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
            lo: 100 2 0 0 0 0 0 0 100 2 0 0 0 0 0 0\n  \
            eth0: 5000 40 1 2 0 0 0 0 7000 50 3 4 0 0 0 0\n\
            veth12: 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1\n  \
            eth1: garbage\n";
        assert_eq!(
            parse(text),
            [(
                "eth0".to_owned(),
                NetDev {
                    rx_bytes: 5000,
                    rx_packets: 40,
                    rx_errors: 1,
                    rx_dropped: 2,
                    tx_bytes: 7000,
                    tx_packets: 50,
                    tx_errors: 3,
                    tx_dropped: 4,
                }
            )]
        );
    }
}
