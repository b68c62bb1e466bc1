//! The link between the pod runtime and the eviction manager: node conditions flow to
//! admission, the active pods flow to the eviction manager, and evictions flow back to the
//! pod workers. Cheap to clone; every side holds the same state.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, RwLock},
};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Notify;

use crate::locks::lock;

use crate::policy::eviction::{NodeCondition, rank::PodFacts};

/// A pod the runtime runs (admitted and not being evicted).
#[derive(Clone, Debug)]
pub struct ActiveEntry {
    pub pod: Arc<Pod>,
    /// The pod cgroup, relative to the hierarchy roots (`<root>/kubepods/.../pod<uid>`).
    pub cgroup: String,
    /// What eviction ranking reads from the spec, parsed once here, not at every step.
    pub facts: PodFacts,
}

impl ActiveEntry {
    /// The entry of `pod` in `cgroup`, its facts computed now.
    #[must_use]
    pub fn new(pod: Arc<Pod>, cgroup: String) -> Self {
        let facts = PodFacts::of(&pod);
        Self { pod, cgroup, facts }
    }
}

/// What an evicted pod's stop answers (kubelet's `KillPodOptions.CompletedCh`): sent once
/// what the pod held is released (its worker finished: containers stopped and removed, logs
/// and pod cgroup removed; beside kubelet, its processes gone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KillDone {
    /// CLOCK_MONOTONIC ns when the pod worker's kill had stopped and removed everything
    /// (`None` beside kubelet, where kubelet's worker does it).
    pub stopped_ns: Option<u64>,
}

/// The answering half an eviction carries to the side that stops the pod; dropped unsent
/// (the pod had no worker), the eviction manager finds the pod gone by itself.
#[derive(Debug)]
pub struct KillCompletion(tokio::sync::oneshot::Sender<KillDone>);

impl KillCompletion {
    /// A completion and the receiver the eviction manager awaits.
    #[must_use]
    pub fn new() -> (Self, tokio::sync::oneshot::Receiver<KillDone>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Self(tx), rx)
    }

    /// Answers the eviction.
    pub fn complete(self, done: KillDone) {
        // The manager stopped waiting (it stopped, or the wait timed out): nobody to tell.
        let _ = self.0.send(done);
    }
}

/// An eviction the eviction manager decided.
#[derive(Debug)]
pub struct Evict {
    pub uid: String,
    /// Grace period in seconds for the orderly stop.
    pub grace_seconds: i64,
    /// The pod status message (kubelet's text).
    pub message: String,
    /// CLOCK_MONOTONIC ns when SIGKILL went to the pod's processes (hard memory thresholds).
    pub sigkill_ns: Option<u64>,
    /// Whether the pod gets the `DisruptionTarget` condition: kubelet adds it for threshold
    /// evictions, not for local storage limit evictions (condition `nil`).
    pub disruption_target: bool,
    /// Answered when the pod's resources are released (`None`: nobody waits).
    pub completed: Option<KillCompletion>,
}

#[derive(Debug, Default)]
struct Inner {
    conditions: RwLock<Vec<NodeCondition>>,
    /// Written by the runtime loop only; readers take the `Arc` (copy on write).
    active: RwLock<Arc<BTreeMap<String, ActiveEntry>>>,
    evictions: Mutex<Vec<Evict>>,
    notify: Notify,
    /// Pods whose runtime state changed in a way the relister has not seen yet (a kernel OOM
    /// kill): their workers resync at once.
    pokes: Mutex<std::collections::BTreeSet<String>>,
    poked: Notify,
    /// Containers the kernel's OOM killer killed a process of (eBPF records, by pod uid):
    /// what names the reason where the runtime could not (containerd under the systemd
    /// driver, its scope gone before it read the OOM event).
    oom_killed: Mutex<BTreeMap<String, std::collections::BTreeSet<String>>>,
}

/// Shared between the runtime loop and the eviction manager.
#[derive(Clone, Debug, Default)]
pub struct NodeLink(Arc<Inner>);

fn read<T: Clone>(l: &RwLock<T>) -> T {
    crate::locks::read(l).clone()
}

fn write<T>(l: &RwLock<T>, f: impl FnOnce(&mut T)) {
    f(&mut crate::locks::write(l));
}

impl NodeLink {
    /// The node conditions now reported (sorted by name).
    #[must_use]
    pub fn conditions(&self) -> Vec<NodeCondition> {
        read(&self.0.conditions)
    }

    /// Sets the node conditions; returns whether they changed.
    pub fn set_conditions(&self, c: Vec<NodeCondition>) -> bool {
        let mut changed = false;
        write(&self.0.conditions, |cur| {
            changed = *cur != c;
            *cur = c;
        });
        changed
    }

    /// The active pods, by uid: a cheap read (the map is shared, not copied).
    #[must_use]
    pub fn active(&self) -> Arc<BTreeMap<String, ActiveEntry>> {
        read(&self.0.active)
    }

    /// Marks a pod active (admitted and running). The runtime loop only.
    pub fn set_active(&self, uid: &str, entry: ActiveEntry) {
        write(&self.0.active, |a| {
            Arc::make_mut(a).insert(uid.to_owned(), entry);
        });
    }

    /// The pod left the active set (terminating, evicted or gone). The runtime loop only.
    pub fn remove_active(&self, uid: &str) {
        write(&self.0.active, |a| {
            Arc::make_mut(a).remove(uid);
        });
    }

    /// Asks the runtime to evict a pod; the runtime takes it out of the active set when it
    /// takes the eviction (the eviction manager ignores it meanwhile: its cleanup wait).
    pub fn evict(&self, e: Evict) {
        lock(&self.0.evictions).push(e);
        self.0.notify.notify_one();
    }

    /// Evictions asked for since the last call.
    #[must_use]
    pub fn take_evictions(&self) -> Vec<Evict> {
        std::mem::take(&mut *lock(&self.0.evictions))
    }

    /// Resolves when an eviction was asked for.
    pub async fn evictions_pending(&self) {
        self.0.notify.notified().await;
    }

    /// Asks the runtime to resync a pod's worker now (and to relist the runtime quickly for a
    /// moment), e.g. after a kernel OOM kill inside the pod.
    pub fn poke(&self, uid: &str) {
        lock(&self.0.pokes).insert(uid.to_owned());
        self.0.poked.notify_one();
    }

    /// Pods poked since the last call.
    #[must_use]
    pub fn take_pokes(&self) -> Vec<String> {
        let set = std::mem::take(&mut *lock(&self.0.pokes));
        set.into_iter().collect()
    }

    /// The kernel OOM-killed a process of the container `container_id` of pod `uid`.
    pub fn note_oom_kill(&self, uid: &str, container_id: &str) {
        lock(&self.0.oom_killed)
            .entry(uid.to_owned())
            .or_default()
            .insert(container_id.to_owned());
    }

    /// Whether the kernel OOM-killed a process of that container ([`Self::note_oom_kill`]).
    #[must_use]
    pub fn oom_killed(&self, uid: &str, container_id: &str) -> bool {
        lock(&self.0.oom_killed)
            .get(uid)
            .is_some_and(|c| c.contains(container_id))
    }

    /// Forgets a finished pod's OOM kills.
    pub fn forget_oom_kills(&self, uid: &str) {
        lock(&self.0.oom_killed).remove(uid);
    }

    /// Resolves when a pod was poked.
    pub async fn pokes_pending(&self) {
        self.0.poked.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn evictions_wake_the_runtime_and_leave_the_active_set() {
        let link = NodeLink::default();
        link.set_active(
            "u1",
            ActiveEntry::new(Arc::new(Pod::default()), "/kubepods/podu1".into()),
        );
        assert_eq!(link.active().len(), 1);
        let other = link.clone();
        let waiter = tokio::spawn(async move {
            other.evictions_pending().await;
            other.take_evictions()
        });
        let (completion, answer) = KillCompletion::new();
        link.evict(Evict {
            uid: "u1".into(),
            grace_seconds: 1,
            message: "m".into(),
            sigkill_ns: None,
            disruption_target: true,
            completed: Some(completion),
        });
        let mut got = waiter.await.expect("join");
        // The runtime loop, which owns the active set, takes the pod out.
        link.remove_active("u1");
        assert_eq!(got.len(), 1);
        let e = got.remove(0);
        assert_eq!(
            (
                e.uid.as_str(),
                e.grace_seconds,
                e.message.as_str(),
                e.disruption_target
            ),
            ("u1", 1, "m", true)
        );
        // The stop answers the eviction.
        let done = KillDone {
            stopped_ns: Some(7),
        };
        e.completed.expect("completion").complete(done);
        assert_eq!(answer.await.ok(), Some(done));
        assert!(link.active().is_empty());
        assert!(link.set_conditions(vec![NodeCondition::MemoryPressure]));
        assert!(!link.set_conditions(vec![NodeCondition::MemoryPressure]));
        assert_eq!(link.conditions(), vec![NodeCondition::MemoryPressure]);
    }

    #[tokio::test]
    async fn pokes_wake_the_runtime_once_per_pod() {
        let link = NodeLink::default();
        link.poke("u2");
        link.poke("u1");
        link.poke("u2");
        link.pokes_pending().await;
        assert_eq!(link.take_pokes(), vec!["u1".to_owned(), "u2".to_owned()]);
        assert!(link.take_pokes().is_empty());
    }
}
