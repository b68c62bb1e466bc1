//! kubelet's allocation manager for the runtime loop: the resources allocated to each admitted
//! pod (checkpointed in `allocated_pods_state`, kubelet's file and checksum), the in-place
//! resizes decided against them ([`crate::policy::resize`]), and the resizes left pending
//! (`PodResizePending`), retried when a pod leaves the node and every
//! [`resize::RETRY_DELAY`] (the first time [`resize::INITIAL_RETRY_DELAY`] after start).

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{Arc, Mutex},
};

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use crate::policy::{
    pod_status::Condition,
    resize::{self, PodAllocation, ResizeCondition, ResizeDecision, ResizeNode, checkpoint},
};

/// The `PodResizePending` condition of each pod that has one, by uid: set by the runtime loop,
/// published by the pod's worker with its status.
#[derive(Clone, Debug, Default)]
pub struct ResizeBoard(Arc<Mutex<HashMap<String, Condition>>>);

impl ResizeBoard {
    /// The pod's `PodResizePending` condition, if its resize is pending.
    #[must_use]
    pub fn pending(&self, uid: &str) -> Option<Condition> {
        crate::locks::lock(&self.0).get(uid).cloned()
    }

    fn set(&self, uid: &str, c: Option<Condition>) {
        let mut m = crate::locks::lock(&self.0);
        match c {
            Some(c) => m.insert(uid.to_owned(), c),
            None => m.remove(uid),
        };
    }
}

/// The allocated resources of the admitted pods and their pending resizes.
#[derive(Debug)]
pub(crate) struct Allocations {
    /// The checkpoint file (`None`: not kept, the unit tests').
    path: Option<PathBuf>,
    pods: BTreeMap<String, PodAllocation>,
    /// Resizes not allocated (the desired pod, pending since), by uid.
    pending: BTreeMap<String, (Arc<Pod>, std::time::Duration)>,
    started: Instant,
    board: ResizeBoard,
    node: ResizeNode,
    retry_at: Instant,
}

impl Allocations {
    /// The allocations checkpointed at `path` (a missing, unreadable or corrupted file: none,
    /// said in the log, a corrupted one set aside as `<file>.corrupt`; the pods are allocated
    /// again as they are admitted).
    pub(crate) fn load(path: Option<PathBuf>, node: ResizeNode, board: ResizeBoard) -> Self {
        let pods = path
            .as_ref()
            .and_then(|p| match std::fs::read_to_string(p) {
                Ok(text) => checkpoint::from_json(&text)
                    .inspect_err(|e| {
                        // Kept for a look, never overwritten: the next save writes a new one.
                        let aside = p.with_extension("corrupt");
                        let moved = std::fs::rename(p, &aside).map_err(|r| r.to_string());
                        tracing::error!(file = %p.display(), error = %e, set_aside = ?moved.map(|()| aside.display().to_string()), "the allocation checkpoint is unreadable: set aside; the pods are allocated again as they are admitted");
                    })
                    .ok(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    tracing::warn!(file = %p.display(), error = %e, "reading the allocation checkpoint");
                    None
                }
            })
            .unwrap_or_default();
        Self {
            path,
            pods,
            pending: BTreeMap::new(),
            board,
            node,
            started: Instant::now(),
            retry_at: Instant::now() + resize::INITIAL_RETRY_DELAY,
        }
    }

    fn save(&self) {
        let Some(path) = &self.path else { return };
        let text = checkpoint::to_json(&self.pods);
        if let Err(e) = crate::status_manager::write_atomic(path, text.as_bytes()) {
            tracing::warn!(file = %path.display(), error = %e, "writing the allocation checkpoint");
        }
    }

    /// `pod` was admitted: its resources are allocated as its spec has them.
    pub(crate) fn admitted(&mut self, uid: &str, pod: &Pod) {
        let a = PodAllocation::of(pod);
        if self.pods.get(uid) != Some(&a) {
            self.pods.insert(uid.to_owned(), a);
            self.save();
        }
        self.set_pending(uid, None);
    }

    /// The pod left the node: its allocation goes, and pending resizes are retried.
    pub(crate) fn remove(&mut self, uid: &str) {
        self.set_pending(uid, None);
        if self.pods.remove(uid).is_some() {
            self.save();
        }
        self.retry_at = Instant::now();
    }

    fn set_pending(&mut self, uid: &str, pending: Option<(Arc<Pod>, ResizeCondition)>) {
        match pending {
            Some((pod, c)) => {
                self.board.set(uid, Some(c.condition()));
                let since = self
                    .pending
                    .get(uid)
                    .map_or_else(|| self.started.elapsed(), |(_, t)| *t);
                self.pending.insert(uid.to_owned(), (pod, since));
            }
            None => {
                self.board.set(uid, None);
                self.pending.remove(uid);
            }
        }
    }

    /// kubelet's `handlePodResourcesResize` for an admitted pod's update `desired`, beside the
    /// `others` admitted pods: the pod its worker is to run (`desired` when its resources are
    /// allocated, else `desired` with the allocated resources), and whether the allocation
    /// changed (the admission totals and the eviction manager's view follow it).
    pub(crate) fn update<'a>(
        &mut self,
        uid: &str,
        desired: Arc<Pod>,
        others: impl IntoIterator<Item = &'a Pod>,
    ) -> (Arc<Pod>, bool) {
        let Some(alloc) = self.pods.get(uid) else {
            self.admitted(uid, &desired);
            return (desired, false);
        };
        let generation = desired.metadata.generation.unwrap_or(0);
        match resize::handle_pod_resources_resize(&self.node, &desired, Some(alloc), others) {
            ResizeDecision::Unchanged => {
                self.set_pending(uid, None);
                (desired, false)
            }
            ResizeDecision::Allocate => {
                tracing::info!(uid = %uid, "pod resize allocated");
                self.pods
                    .insert(uid.to_owned(), PodAllocation::of(&desired));
                self.save();
                self.set_pending(uid, None);
                (desired, true)
            }
            ResizeDecision::Pending { reason, message } => {
                tracing::info!(uid = %uid, reason = reason.as_str(), message = %message, "pod resize pending");
                let run = resize::update_pod_from_allocation(&desired, Some(alloc))
                    .map_or_else(|| desired.clone(), Arc::new);
                let c = ResizeCondition::pending(reason, &message, generation);
                self.set_pending(uid, Some((desired, c)));
                (run, false)
            }
        }
    }

    /// The pending resizes to decide again now (after a pod left, and every
    /// [`resize::RETRY_DELAY`]), in kubelet's retry order: increases last, and higher priority
    /// first.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<(String, Arc<Pod>)> {
        if now < self.retry_at || self.pending.is_empty() {
            return Vec::new();
        }
        self.retry_at = now + resize::RETRY_DELAY;
        let mut queue = Vec::new();
        for (uid, (pod, since)) in &self.pending {
            let p = resize::PendingResize::of(uid, pod, self.pods.get(uid), Some(*since));
            resize::push_pending_resize(&mut queue, p);
        }
        queue
            .into_iter()
            .filter_map(|p| {
                let pod = self.pending.get(&p.uid)?.0.clone();
                Some((p.uid, pod))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        policy::{
            admission,
            resources::test_pods::{container, pod},
        },
        quantity::Quantity,
    };

    fn node(cpu: &str, memory: &str) -> ResizeNode {
        let allocatable = [("cpu", cpu), ("memory", memory), ("pods", "110")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Quantity::parse(v).expect("quantity")))
            .collect();
        let q = |v: &str| Quantity::parse(v).expect("quantity");
        ResizeNode {
            node: admission::Node {
                allocatable,
                ..admission::Node::default()
            },
            allocatable_absolute_milli_cpu: q(cpu).milli_value(),
            allocatable_absolute_memory: q(memory).value(),
            ..ResizeNode::default()
        }
    }

    fn p(uid: &str, requests: &str, limits: &str) -> Arc<Pod> {
        let mut p = pod(uid, vec![container("c", requests, limits)]);
        p.metadata.uid = Some(uid.to_owned());
        Arc::new(p)
    }

    fn memory_request(p: &Pod) -> String {
        p.spec.as_ref().expect("spec").containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("memory"))
            .map(|q| q.0.clone())
            .unwrap_or_default()
    }

    /// kubelet's allocation flow: a resize that fits is allocated (checkpointed, read back by
    /// the decoder kubelet's format needs); one beside pods that leave no room is Deferred
    /// (the worker keeps the allocated resources, the condition is on the board) and is
    /// allocated when the pod in its way leaves; one beyond the node is Infeasible.
    #[test]
    fn resizes_are_allocated_deferred_until_room_and_refused_beyond_the_node() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join(resize::ALLOCATED_PODS_STATE_FILE);
        let board = ResizeBoard::default();
        let mut a = Allocations::load(Some(file.clone()), node("2", "1Gi"), board.clone());
        let small = p("a", "cpu=100m,memory=100Mi", "memory=200Mi");
        let other = p("b", "cpu=100m,memory=600Mi", "memory=600Mi");
        a.admitted("a", &small);
        a.admitted("b", &other);

        // Fits beside b: allocated and checkpointed.
        let grown = p("a", "cpu=100m,memory=300Mi", "memory=400Mi");
        let (run, changed) = a.update("a", grown.clone(), [&*other]);
        assert!(changed);
        assert_eq!(memory_request(&run), "300Mi");
        assert!(board.pending("a").is_none());
        let saved = checkpoint::from_json(&std::fs::read_to_string(&file).expect("checkpoint"))
            .expect("kubelet's checkpoint decodes");
        assert_eq!(saved.get("a"), Some(&PodAllocation::of(&grown)));

        // 600Mi beside b's 600Mi of 1Gi: deferred; the worker keeps 300Mi.
        let big = p("a", "cpu=100m,memory=600Mi", "memory=700Mi");
        let (run, changed) = a.update("a", big.clone(), [&*other]);
        assert!(!changed);
        assert_eq!(memory_request(&run), "300Mi");
        let c = board.pending("a").expect("pending");
        assert_eq!(
            (c.kind.as_str(), c.reason.as_str()),
            ("PodResizePending", "Deferred")
        );
        assert!(
            c.message
                .starts_with("Node didn't have enough resource: memory"),
            "{}",
            c.message
        );
        // Not due before the retry delay; due once b leaves.
        assert!(a.due(Instant::now()).is_empty());
        a.remove("b");
        let due = a.due(Instant::now());
        assert_eq!(due.len(), 1);
        let (run, changed) = a.update("a", due[0].1.clone(), std::iter::empty());
        assert!(changed);
        assert_eq!(memory_request(&run), "600Mi");
        assert!(board.pending("a").is_none());

        // Beyond the node: infeasible.
        let (_, changed) = a.update("a", p("a", "cpu=100m,memory=2Gi", "memory=2Gi"), []);
        assert!(!changed);
        let c = board.pending("a").expect("pending");
        assert_eq!(c.reason, "Infeasible");
        assert!(
            c.message
                .starts_with("Node didn't have enough capacity: memory"),
            "{}",
            c.message
        );

        // A restart reads the checkpoint back.
        let again = Allocations::load(Some(file), node("2", "1Gi"), ResizeBoard::default());
        assert_eq!(
            again.pods.get("a"),
            Some(&PodAllocation::of(&p(
                "a",
                "cpu=100m,memory=600Mi",
                "memory=700Mi"
            )))
        );
        assert!(!again.pods.contains_key("b"), "b left");
    }

    /// A corrupted checkpoint is set aside, kept as it was (the pods are allocated again as
    /// admitted).
    #[test]
    fn a_corrupted_checkpoint_is_set_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join(resize::ALLOCATED_PODS_STATE_FILE);
        let bad = r#"{"data":"{}","checksum":1}"#;
        std::fs::write(&file, bad).expect("write");
        let a = Allocations::load(Some(file.clone()), node("1", "1Gi"), ResizeBoard::default());
        assert!(a.pods.is_empty());
        assert!(!file.exists());
        assert_eq!(
            std::fs::read_to_string(file.with_extension("corrupt")).expect("set aside"),
            bad
        );
    }
}
