//! Ranking pods for eviction (`rankMemoryPressure`, `rankPIDPressure`, `rankDiskPressureFunc`).
//!
//! Kubelet sorts with chains of comparators: pods without stats first, then (memory / disk)
//! usage above request, priority, usage minus request; (pids) priority, process count. Go's
//! `sort.Sort` is not stable, so kubelet leaves the order of complete ties unspecified; the
//! enforcer breaks them by namespace, name and uid so that the ranking is a deterministic
//! strict weak order independent of the input order.

use k8s_openapi::api::core::v1::Pod;

use super::{ActivePod, PodStats, Resource, Signal};
use crate::policy::resources;

/// The sort key of one pod for one resource, packed into one integer so that comparing two
/// pods is one comparison: the top 34 bits hold the flags and the priority, the low 94 bits
/// the amount, biased to be unsigned (see [`pack`]). Complete ties are broken by (namespace,
/// name, uid, input index).
type Key = u128;

/// Bits of the amount part of a [`Key`].
const AMOUNT_BITS: u32 = 94;
/// Amounts are clamped to +-2^93 nano-units (about 9.9e18 bytes, beyond any i64 usage):
/// pods past that only tie, and are ordered by identity.
const AMOUNT_LIMIT: i128 = 1 << (AMOUNT_BITS - 1);

/// A priority as an unsigned number of the same order.
fn biased(priority: i32) -> u64 {
    u64::from(priority.cast_unsigned() ^ 0x8000_0000)
}

/// `(high, amount)` compared lexicographically, as one integer: `high` must fit in 34 bits.
fn pack(high: u64, amount: i128) -> Key {
    let amount = amount.clamp(-AMOUNT_LIMIT, AMOUNT_LIMIT - 1) + AMOUNT_LIMIT;
    (u128::from(high) << AMOUNT_BITS) | amount.cast_unsigned()
}

fn usage(stats: &PodStats, resource: Resource) -> i64 {
    match resource {
        Resource::Memory => stats.memory.unwrap_or(0),
        Resource::EphemeralStorage => stats.ephemeral_storage.unwrap_or(0),
        Resource::Inodes => stats.inodes.unwrap_or(0),
        Resource::Pids => stats.processes.unwrap_or(0),
    }
}

/// What ranking and the critical-pod check read from a pod's spec: parsed once per pod (when
/// it is admitted or its spec changes) rather than at every eviction step, since reading a
/// request means walking the spec and parsing a quantity string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodFacts {
    /// `spec.priority` (0 when unset).
    pub priority: i32,
    /// `IsCriticalPod`.
    pub critical: bool,
    /// The pod's memory request, in nano-units.
    pub memory_request: i128,
    /// The pod's ephemeral-storage request, in nano-units.
    pub storage_request: i128,
    /// The start of its identity, for ties (see [`identity_prefix`]).
    pub identity_prefix: u128,
}

impl PodFacts {
    /// The facts of `pod`.
    #[must_use]
    pub fn of(pod: &Pod) -> Self {
        Self {
            priority: resources::priority(pod),
            critical: resources::is_critical(pod),
            memory_request: resources::pod_request_nanos(pod, Resource::Memory.as_str()),
            storage_request: resources::pod_request_nanos(pod, Resource::EphemeralStorage.as_str()),
            identity_prefix: identity_prefix(pod),
        }
    }
}

/// The pod's request for `r` in nano-units: from its facts when kept, else from the spec.
fn request(pod: &ActivePod<'_>, r: Resource) -> i128 {
    match (pod.facts, r) {
        (Some(f), Resource::Memory) => f.memory_request,
        (Some(f), Resource::EphemeralStorage) => f.storage_request,
        _ => resources::pod_request_nanos(pod.pod, r.as_str()),
    }
}

fn key(pod: &ActivePod<'_>, resource: Resource) -> Key {
    let priority = biased(
        pod.facts
            .map_or_else(|| resources::priority(pod.pod), |f| f.priority),
    );
    match (pod.stats, resource) {
        // orderedBy(priority, process): lower priority, then no stats, then more processes.
        (None, Resource::Pids) => pack(priority << 1, 0),
        (Some(s), Resource::Pids) => pack(
            (priority << 1) | 1,
            i128::from(usage(s, resource)).saturating_neg(),
        ),
        // orderedBy(exceedRequests, priority, usage - request): no stats first.
        (None, _) => pack(priority, 0),
        (Some(s), r) => {
            let used = i128::from(usage(s, r)) * 1_000_000_000;
            // kubelet's disk() compares inodes with the inodes request (none exists: zero) but
            // subtracts the ephemeral-storage request for the order.
            let (request_for_exceeds, request_for_order) = match r {
                Resource::Inodes => (
                    resources::pod_request_nanos(pod.pod, r.as_str()),
                    request(pod, Resource::EphemeralStorage),
                ),
                _ => {
                    let q = request(pod, r);
                    (q, q)
                }
            };
            let exceeds = used > request_for_exceeds;
            pack(
                (1 << 33) | (u64::from(!exceeds) << 32) | priority,
                request_for_order.saturating_sub(used),
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

/// The first 16 bytes of `namespace NUL name NUL uid`, as a big-endian integer (zero-padded).
/// Names and uids hold no NUL, so comparing prefixes agrees with comparing the identity
/// tuples wherever the prefixes differ.
fn identity_prefix(pod: &Pod) -> u128 {
    let (ns, name, uid) = (
        resources::pod_namespace(pod),
        resources::pod_name(pod),
        resources::pod_uid(pod),
    );
    let mut out = [0u8; 16];
    let mut at = 0;
    for part in [ns, name, uid] {
        let bytes = part.as_bytes();
        let n = bytes.len().min(out.len().saturating_sub(at));
        if let (Some(dst), Some(src)) = (out.get_mut(at..at + n), bytes.get(..n)) {
            dst.copy_from_slice(src);
        }
        // The NUL separator is the zero already there.
        at = (at + n + 1).min(out.len());
    }
    u128::from_be_bytes(out)
}

/// The full order of two keyed pods: key, then identity, then input index.
fn order(pods: &[ActivePod<'_>], a: &(Key, usize), b: &(Key, usize)) -> std::cmp::Ordering {
    a.0.cmp(&b.0).then_with(|| tie(pods, a.1, b.1))
}

/// Complete ties of the key: namespace, name, uid, then input index.
fn tie(pods: &[ActivePod<'_>], a: usize, b: usize) -> std::cmp::Ordering {
    match (pods.get(a), pods.get(b)) {
        (Some(x), Some(y)) => identity(x).cmp(&identity(y)).then(a.cmp(&b)),
        _ => a.cmp(&b),
    }
}

/// Ranks `pods` for the resource `signal` starves: the first is evicted first. Returns the
/// indices into `pods`, in eviction order.
///
/// Each pod's key is computed once (its requests are parsed once, not per comparison); the
/// integer keys are sorted first and only runs of equal keys are then ordered by identity, so
/// string comparisons stay off the common path.
#[must_use]
pub fn rank(signal: Signal, pods: &[ActivePod<'_>]) -> Vec<usize> {
    let resource = signal.resource();
    let mut keyed: Vec<(Key, usize)> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| (key(p, resource), i))
        .collect();
    keyed.sort_unstable();
    for run in keyed.chunk_by_mut(|a, b| a.0 == b.0) {
        if run.len() < 2 {
            continue;
        }
        // Each pod's identity is read once per run, and compared as an integer prefix;
        // strings are compared only where prefixes tie.
        let mut ids: Vec<(u128, usize)> = run
            .iter()
            .map(|&(_, i)| {
                let prefix = pods.get(i).map_or(0, |p| {
                    p.facts
                        .map_or_else(|| identity_prefix(p.pod), |f| f.identity_prefix)
                });
                (prefix, i)
            })
            .collect();
        ids.sort_unstable();
        for same in ids.chunk_by_mut(|a, b| a.0 == b.0) {
            if same.len() > 1 {
                same.sort_unstable_by(|a, b| tie(pods, a.1, b.1));
            }
        }
        for (slot, (_, i)) in run.iter_mut().zip(ids) {
            slot.1 = i;
        }
    }
    keyed.into_iter().map(|(_, i)| i).collect()
}

/// The first pod of [`rank`]'s order that `eligible` accepts, found in one pass without
/// sorting (the eviction step needs only that pod), and the pods ranked before it that
/// `eligible` refused, in rank order.
#[must_use]
pub fn first_eligible(
    signal: Signal,
    pods: &[ActivePod<'_>],
    eligible: impl Fn(&ActivePod<'_>) -> bool,
) -> (Option<usize>, Vec<usize>) {
    let resource = signal.resource();
    let mut best: Option<(Key, usize)> = None;
    let mut refused: Vec<(Key, usize)> = Vec::new();
    for (i, p) in pods.iter().enumerate() {
        let k = (key(p, resource), i);
        if !eligible(p) {
            refused.push(k);
        } else if best
            .as_ref()
            .is_none_or(|b| order(pods, &k, b) == std::cmp::Ordering::Less)
        {
            best = Some(k);
        }
    }
    if let Some(b) = &best {
        refused.retain(|r| order(pods, r, b) == std::cmp::Ordering::Less);
    }
    refused.sort_unstable_by(|a, b| order(pods, a, b));
    (
        best.map(|(_, i)| i),
        refused.into_iter().map(|(_, i)| i).collect(),
    )
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
            ActivePod::new(&below, Some(&s_below)),
            ActivePod::new(&high, Some(&s_high)),
            ActivePod::new(&exceeds, Some(&s_exceeds)),
            ActivePod::new(&nostats, None),
            ActivePod::new(&big, Some(&s_big)),
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
            ActivePod::new(&a, Some(&sa)),
            ActivePod::new(&b, Some(&sb)),
            ActivePod::new(&low, Some(&sl)),
            ActivePod::new(&nostats, None),
        ];
        let order: Vec<_> = rank(Signal::PidAvailable, &pods)
            .into_iter()
            .map(|i| resources::pod_name(pods[i].pod))
            .collect();
        assert_eq!(order, ["low", "n", "b", "a"]);
    }

    #[test]
    fn extreme_amounts_keep_their_order() {
        // The packed key clamps amounts at 2^93 nano-units: i64::MAX bytes of usage and a
        // request of 14Ei (two containers near the largest quantity) still order as kubelet's
        // unbounded arithmetic would.
        let huge = pod(
            "huge-request",
            vec![
                container("a", "memory=7Ei", ""),
                container("b", "memory=7Ei", ""),
            ],
        );
        let max = pod("max-usage", vec![container("a", "", "")]);
        let small = pod("small-usage", vec![container("a", "", "")]);
        let mut low = pod("low-priority", vec![container("a", "", "")]);
        low.spec.as_mut().unwrap().priority = Some(i32::MIN);
        let mut high = pod("high-priority", vec![container("a", "", "")]);
        high.spec.as_mut().unwrap().priority = Some(i32::MAX);
        let (s_max, s_small, s_huge) = (stats(i64::MAX), stats(1), stats(1));
        let pods = vec![
            ActivePod::new(&high, Some(&s_max)),
            ActivePod::new(&huge, Some(&s_huge)),
            ActivePod::new(&small, Some(&s_small)),
            ActivePod::new(&max, Some(&s_max)),
            ActivePod::new(&low, Some(&s_small)),
        ];
        let names = |signal| -> Vec<&str> {
            rank(signal, &pods)
                .into_iter()
                .map(|i| resources::pod_name(pods[i].pod))
                .collect()
        };
        assert_eq!(
            names(Signal::MemoryAvailable),
            [
                "low-priority",
                "max-usage",
                "small-usage",
                "high-priority",
                "huge-request"
            ]
        );
        assert_eq!(
            names(Signal::PidAvailable),
            [
                "low-priority",
                "max-usage",
                "huge-request",
                "small-usage",
                "high-priority"
            ]
        );
    }

    fn ident(ns: &str, name: &str, uid: &str) -> Pod {
        let mut p = pod(name, vec![]);
        p.metadata.namespace = Some(ns.to_owned());
        p.metadata.uid = Some(uid.to_owned());
        p
    }

    proptest::proptest! {
        #[test]
        fn identity_prefixes_order_as_the_identities(
            a in ("[a-z0-9-]{0,12}", "[a-z0-9.-]{0,20}", "[a-f0-9-]{0,12}"),
            b in ("[a-z0-9-]{0,12}", "[a-z0-9.-]{0,20}", "[a-f0-9-]{0,12}"),
        ) {
            let (pa, pb) = (ident(&a.0, &a.1, &a.2), ident(&b.0, &b.1, &b.2));
            let (xa, xb) = (identity_prefix(&pa), identity_prefix(&pb));
            if xa != xb {
                proptest::prop_assert_eq!(xa.cmp(&xb), a.cmp(&b));
            }
        }
    }
}
