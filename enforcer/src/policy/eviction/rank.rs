//! Ranking pods for eviction (`rankMemoryPressure`, `rankPIDPressure`, `rankDiskPressureFunc`).
//!
//! Kubelet sorts with chains of comparators: pods without stats first, then (memory / disk)
//! usage above request, priority, usage minus request; (pids) priority, process count. Go's
//! `sort.Sort` is not stable, so kubelet leaves the order of complete ties unspecified; the
//! enforcer breaks them by namespace, name and uid so that the ranking is a deterministic
//! strict weak order independent of the input order.

use std::cmp::Reverse;

use super::{PodStats, Resource, Signal, manager::ActivePod};
use crate::policy::resources;

/// The sort key of one pod for one resource, compared lexicographically; complete ties are
/// broken by (namespace, name, uid, input index).
type Key = (i64, i64, i64, Reverse<i128>);

fn usage(stats: &PodStats, resource: Resource) -> i64 {
    match resource {
        Resource::Memory => stats.memory.unwrap_or(0),
        Resource::EphemeralStorage => stats.ephemeral_storage.unwrap_or(0),
        Resource::Inodes => stats.inodes.unwrap_or(0),
        Resource::Pids => stats.processes.unwrap_or(0),
    }
}

fn key(pod: &ActivePod<'_>, resource: Resource) -> Key {
    let priority = i64::from(resources::priority(pod.pod));
    match (pod.stats, resource) {
        // orderedBy(priority, process): lower priority, then no stats, then more processes.
        (None, Resource::Pids) => (priority, 0, 0, Reverse(0)),
        (Some(s), Resource::Pids) => (priority, 1, 0, Reverse(i128::from(usage(s, resource)))),
        // orderedBy(exceedRequests, priority, usage - request): no stats first.
        (None, _) => (0, 0, priority, Reverse(0)),
        (Some(s), r) => {
            let used = i128::from(usage(s, r)) * 1_000_000_000;
            let request_for_exceeds = resources::pod_request_nanos(pod.pod, r.as_str());
            // kubelet's disk() subtracts the ephemeral-storage request also for inodes.
            let request_for_order = match r {
                Resource::Inodes => {
                    resources::pod_request_nanos(pod.pod, Resource::EphemeralStorage.as_str())
                }
                _ => request_for_exceeds,
            };
            let exceeds = used > request_for_exceeds;
            (
                1,
                i64::from(!exceeds),
                priority,
                Reverse(used - request_for_order),
            )
        }
    }
}

fn identity<'a>(pod: &ActivePod<'a>) -> (&'a str, &'a str, &'a str) {
    (
        resources::pod_namespace(pod.pod),
        resources::pod_name(pod.pod),
        resources::pod_uid(pod.pod),
    )
}

/// Ranks `pods` for the resource `signal` starves: the first is evicted first. Returns the
/// indices into `pods`, in eviction order.
#[must_use]
pub fn rank(signal: Signal, pods: &[ActivePod<'_>]) -> Vec<usize> {
    let resource = signal.resource();
    let mut keyed: Vec<(Key, usize)> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| (key(p, resource), i))
        .collect();
    keyed.sort_unstable_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| match (pods.get(a.1), pods.get(b.1)) {
                (Some(x), Some(y)) => identity(x).cmp(&identity(y)).then(a.1.cmp(&b.1)),
                _ => a.1.cmp(&b.1),
            })
    });
    keyed.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{
        eviction::PodStats,
        resources::test_pods::{container, pod},
    };

    fn stats(memory: i64) -> PodStats {
        PodStats {
            memory: Some(memory),
            ephemeral_storage: Some(memory),
            processes: Some(memory),
            ..Default::default()
        }
    }

    #[test]
    fn memory_ranking() {
        // After helpers_test.go TestOrderedByExceedsRequestMemory / TestOrderedByPriority /
        // TestOrderedbyMemory.
        let mi = 1 << 20;
        let mut below = pod("below-requests", vec![container("a", "memory=200Mi", "")]);
        below.spec.as_mut().unwrap().priority = Some(-10);
        let exceeds = pod("exceeds-requests", vec![container("a", "memory=100Mi", "")]);
        let mut high = pod(
            "high-priority-exceeds",
            vec![container("a", "memory=10Mi", "")],
        );
        high.spec.as_mut().unwrap().priority = Some(100);
        let nostats = pod("no-stats", vec![container("a", "", "")]);
        let big = pod("exceeds-more", vec![container("a", "memory=100Mi", "")]);
        let s_below = stats(150 * mi);
        let s_exceeds = stats(150 * mi);
        let s_high = stats(500 * mi);
        let s_big = stats(300 * mi);
        let pods = vec![
            ActivePod {
                pod: &below,
                stats: Some(&s_below),
            },
            ActivePod {
                pod: &high,
                stats: Some(&s_high),
            },
            ActivePod {
                pod: &exceeds,
                stats: Some(&s_exceeds),
            },
            ActivePod {
                pod: &nostats,
                stats: None,
            },
            ActivePod {
                pod: &big,
                stats: Some(&s_big),
            },
        ];
        let order: Vec<_> = rank(Signal::MemoryAvailable, &pods)
            .into_iter()
            .map(|i| resources::pod_name(pods[i].pod))
            .collect();
        assert_eq!(
            order,
            [
                "no-stats",
                "exceeds-more",
                "exceeds-requests",
                "high-priority-exceeds",
                "below-requests"
            ]
        );
    }

    #[test]
    fn pid_ranking() {
        // After helpers_test.go TestOrderedByPriorityProcess: priority first, then processes.
        let mut low = pod("low", vec![container("a", "", "")]);
        low.spec.as_mut().unwrap().priority = Some(-1);
        let a = pod("a", vec![container("a", "", "")]);
        let b = pod("b", vec![container("a", "", "")]);
        let (sl, sa, sb) = (stats(1), stats(10), stats(20));
        let nostats = pod("n", vec![container("a", "", "")]);
        let pods = vec![
            ActivePod {
                pod: &a,
                stats: Some(&sa),
            },
            ActivePod {
                pod: &b,
                stats: Some(&sb),
            },
            ActivePod {
                pod: &low,
                stats: Some(&sl),
            },
            ActivePod {
                pod: &nostats,
                stats: None,
            },
        ];
        let order: Vec<_> = rank(Signal::PidAvailable, &pods)
            .into_iter()
            .map(|i| resources::pod_name(pods[i].pod))
            .collect();
        assert_eq!(order, ["low", "n", "b", "a"]);
    }
}
