//! Kubelet's CPU assignment (`pkg/kubelet/cm/cpumanager/cpu_assignment.go`,
//! `takeByTopology` with the packed distribution): `n` CPUs out of the free ones, whole
//! sockets first, then whole cores, then single threads, preferring the sockets and cores
//! already partly used so whole ones stay free.

use super::{CpuError, CpuSet, Topology};

/// `takeByTopology` (packed): `n` CPUs out of `available`.
pub fn take_by_topology(
    topology: &Topology,
    available: &CpuSet,
    n: usize,
) -> Result<CpuSet, CpuError> {
    if n > available.len() {
        return Err(CpuError::NotEnough {
            requested: n,
            available: available.len(),
        });
    }
    if n == available.len() {
        return Ok(available.clone());
    }
    let mut taken = CpuSet::default();
    let mut free = available.clone();
    let all_sockets = topology.group(&topology.all(), |c| c.socket);
    let all_cores = topology.group(&topology.all(), |c| c.core);
    let take = |cpus: &CpuSet, taken: &mut CpuSet, free: &mut CpuSet| {
        *taken = taken.union(cpus);
        *free = free.difference(cpus);
    };
    // Sockets ordered by free CPUs (fewest first, i.e. partly used first), then id.
    let sorted_sockets = |free: &CpuSet| {
        let mut s: Vec<(usize, u32)> = topology
            .group(free, |c| c.socket)
            .iter()
            .map(|(id, cpus)| (cpus.len(), *id))
            .collect();
        s.sort_unstable();
        s.into_iter().map(|(_, id)| id).collect::<Vec<_>>()
    };
    let sorted_cores = |free: &CpuSet| {
        let by_core = topology.group(free, |c| c.core);
        let mut out = Vec::new();
        for socket in sorted_sockets(free) {
            let mut cores: Vec<(usize, u32)> = by_core
                .iter()
                .filter(|(_, cpus)| {
                    cpus.iter()
                        .next()
                        .and_then(|c| topology.cpus.get(&c))
                        .is_some_and(|i| i.socket == socket)
                })
                .map(|(id, cpus)| (cpus.len(), *id))
                .collect();
            cores.sort_unstable();
            out.extend(
                cores
                    .into_iter()
                    .map(|(_, id)| (id, by_core.get(&id).cloned().unwrap_or_default())),
            );
        }
        out
    };
    // 1. whole sockets
    let per_socket = topology.cpus_per_socket();
    if per_socket > 0 && n - taken.len() >= per_socket {
        for socket in sorted_sockets(&free) {
            if n - taken.len() < per_socket {
                break;
            }
            if let Some(cpus) = all_sockets.get(&socket)
                && cpus.is_subset(&free)
            {
                take(cpus, &mut taken, &mut free);
            }
        }
    }
    // 2. whole cores
    let per_core = topology.threads_per_core();
    if per_core > 0 && n - taken.len() >= per_core {
        for (core, _) in sorted_cores(&free) {
            if n - taken.len() < per_core {
                break;
            }
            if let Some(cpus) = all_cores.get(&core)
                && cpus.is_subset(&free)
            {
                take(cpus, &mut taken, &mut free);
            }
        }
    }
    // 3. single threads, partly used cores first
    while taken.len() < n {
        let Some(cpu) = sorted_cores(&free)
            .into_iter()
            .flat_map(|(_, cpus)| cpus.0)
            .next()
        else {
            return Err(CpuError::NotEnough {
                requested: n,
                available: available.len(),
            });
        };
        take(&[cpu].into_iter().collect(), &mut taken, &mut free);
    }
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::cpu::cpuset::set;

    #[test]
    fn take_by_topology_cases() {
        // After cpu_assignment_test.go TestTakeByTopology, topoDualSocketHT: 2 sockets x 6
        // cores x 2 threads; socket 0 = cores 0-5 = cpus 0-5,12-17.
        let topo = Topology::uniform(2, 6, 2);
        let all = topo.all();
        assert_eq!(take_by_topology(&topo, &all, 1).unwrap(), set("0"));
        assert_eq!(take_by_topology(&topo, &all, 2).unwrap(), set("0,12"));
        assert_eq!(take_by_topology(&topo, &all, 6).unwrap(), set("0-2,12-14"));
        assert_eq!(take_by_topology(&topo, &all, 12).unwrap(), set("0-5,12-17"));
        // a partly used core is preferred for a single thread
        assert_eq!(take_by_topology(&topo, &set("1-23"), 1).unwrap(), set("12"));
        // a partly used socket is preferred for a whole core
        assert_eq!(
            take_by_topology(&topo, &set("1-23"), 2).unwrap(),
            set("1,13")
        );
        assert_eq!(
            take_by_topology(&topo, &set("1-11,13-23"), 2).unwrap(),
            set("1,13")
        );
        assert!(matches!(
            take_by_topology(&topo, &set("0-1"), 3),
            Err(CpuError::NotEnough {
                requested: 3,
                available: 2
            })
        ));
    }
}
