//! A recording [`ClusterApi`] for the unit tests: objects in maps, every call logged, and
//! switches for an API server that is down or answers 409 Conflict.

use std::{
    collections::BTreeMap,
    sync::{Mutex, MutexGuard},
};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Event, Node, Pod},
};

use super::{ClusterApi, ClusterError};

/// One call, as recorded.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    GetNode,
    CreateNode(String),
    PatchNode,
    PatchNodeStatus(String),
    GetLease,
    CreateLease,
    ReplaceLease,
    GetPod,
    DeletePod(String),
    /// The pod's name.
    PatchPodStatus(String),
    CreatePod(String),
    CreateEvent(String),
    PatchEvent,
    /// Answered 409.
    Conflict,
    /// Failed: the API server is down.
    Failed(&'static str),
}

#[derive(Debug, Default)]
struct State {
    nodes: BTreeMap<String, Node>,
    leases: BTreeMap<String, Lease>,
    /// By uid.
    pods: BTreeMap<String, Pod>,
    events: BTreeMap<String, Event>,
    rv: u64,
    down: bool,
    conflicts: u32,
    calls: Vec<Call>,
    /// When each call came (tokio's clock).
    times: Vec<tokio::time::Instant>,
    /// The pod status patches applied, in order.
    patches: Vec<serde_json::Value>,
}

/// The fake API (clones of it share its state through [`FakeApi::clone_of`]).
#[derive(Debug, Default)]
pub struct FakeApi {
    state: std::sync::Arc<Mutex<State>>,
}

fn status(code: u16, reason: &str) -> ClusterError {
    ClusterError::Status {
        op: "fake",
        object: String::new(),
        code,
        reason: reason.to_owned(),
        message: String::new(),
    }
}

/// `object` with the JSON merge patch applied, as the API server answers a patch (422 when
/// the result is not a valid object of its type).
fn patched<T: serde::Serialize + serde::de::DeserializeOwned>(
    object: &T,
    patch: &serde_json::Value,
) -> Result<T, ClusterError> {
    let mut v = serde_json::to_value(object).map_err(|_| status(422, "Invalid"))?;
    super::merge_patch(&mut v, patch);
    serde_json::from_value(v).map_err(|_| status(422, "Invalid"))
}

impl FakeApi {
    fn lock(&self) -> MutexGuard<'_, State> {
        crate::locks::lock(&self.state)
    }

    /// Logs the call; fails it while down.
    fn enter(&self, call: Call, op: &'static str) -> Result<MutexGuard<'_, State>, ClusterError> {
        let mut s = self.lock();
        if s.down {
            s.calls.push(Call::Failed(op));
            return Err(ClusterError::Transport {
                op,
                object: String::new(),
                message: "connection refused".to_owned(),
            });
        }
        s.calls.push(call);
        s.times.push(tokio::time::Instant::now());
        s.rv += 1;
        Ok(s)
    }

    /// Another handle on the same state (to wrap one in a decorator and inspect the other).
    #[must_use]
    pub fn clone_of(other: &Self) -> Self {
        Self {
            state: other.state.clone(),
        }
    }

    /// The calls with the time each came.
    #[must_use]
    pub fn timed_calls(&self) -> Vec<(tokio::time::Instant, Call)> {
        let s = self.lock();
        s.times
            .iter()
            .copied()
            .zip(s.calls.iter().cloned())
            .collect()
    }

    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// The next `n` pod status updates answer 409.
    pub fn conflict_next(&self, n: u32) {
        self.lock().conflicts = n;
    }

    pub fn add_pod(&self, pod: Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.lock().pods.insert(uid, pod);
    }

    /// Sets the pod's `deletionTimestamp` (a graceful deletion began).
    pub fn mark_deleting(&self, uid: &str) {
        if let Some(p) = self.lock().pods.get_mut(uid) {
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
    }

    #[must_use]
    pub fn pod(&self, uid: &str) -> Option<Pod> {
        self.lock().pods.get(uid).cloned()
    }

    #[must_use]
    pub fn pod_named(&self, ns: &str, name: &str) -> Option<Pod> {
        self.lock()
            .pods
            .values()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && p.metadata.name.as_deref() == Some(name)
            })
            .cloned()
    }

    #[must_use]
    pub fn node(&self, name: &str) -> Option<Node> {
        self.lock().nodes.get(name).cloned()
    }

    #[must_use]
    pub fn events(&self) -> Vec<Event> {
        self.lock().events.values().cloned().collect()
    }

    #[must_use]
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The pod status patches applied, in order.
    #[must_use]
    pub fn patches(&self) -> Vec<serde_json::Value> {
        self.lock().patches.clone()
    }

    /// The phases the applied pod status patches set, in order.
    #[must_use]
    pub fn phases_patched(&self) -> Vec<String> {
        self.patches()
            .iter()
            .filter_map(|p| p["status"]["phase"].as_str().map(str::to_owned))
            .collect()
    }

    #[must_use]
    pub fn count(&self, f: impl Fn(&Call) -> bool) -> usize {
        self.lock().calls.iter().filter(|c| f(c)).count()
    }
}

/// A patch of the stored node (its object or its status: the fake keeps them as one).
fn patch_node(
    mut s: MutexGuard<'_, State>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<Node, ClusterError> {
    let n = patched(s.nodes.get(name).ok_or(status(404, "NotFound"))?, patch)?;
    s.nodes.insert(name.to_owned(), n.clone());
    Ok(n)
}

impl ClusterApi for FakeApi {
    async fn get_node(&self, name: &str) -> Result<Option<Node>, ClusterError> {
        let s = self.enter(Call::GetNode, "get node")?;
        Ok(s.nodes.get(name).cloned())
    }

    async fn create_node(&self, node: &Node) -> Result<Node, ClusterError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let mut s = self.enter(Call::CreateNode(name.clone()), "create node")?;
        if s.nodes.contains_key(&name) {
            return Err(status(409, "AlreadyExists"));
        }
        let mut n = node.clone();
        n.metadata.uid = Some(format!("node-uid-{name}"));
        s.nodes.insert(name, n.clone());
        Ok(n)
    }

    async fn patch_node(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Node, ClusterError> {
        let s = self.enter(Call::PatchNode, "patch node")?;
        patch_node(s, name, patch)
    }

    async fn patch_node_status(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Node, ClusterError> {
        let s = self.enter(Call::PatchNodeStatus(name.to_owned()), "patch node status")?;
        patch_node(s, name, patch)
    }

    async fn get_lease(&self, _ns: &str, name: &str) -> Result<Option<Lease>, ClusterError> {
        let s = self.enter(Call::GetLease, "get lease")?;
        Ok(s.leases.get(name).cloned())
    }

    async fn create_lease(&self, lease: &Lease) -> Result<Lease, ClusterError> {
        let mut s = self.enter(Call::CreateLease, "create lease")?;
        let name = lease.metadata.name.clone().unwrap_or_default();
        if s.leases.contains_key(&name) {
            return Err(status(409, "AlreadyExists"));
        }
        let mut l = lease.clone();
        l.metadata.resource_version = Some(s.rv.to_string());
        s.leases.insert(name, l.clone());
        Ok(l)
    }

    async fn replace_lease(&self, lease: &Lease) -> Result<Lease, ClusterError> {
        let mut s = self.enter(Call::ReplaceLease, "update lease")?;
        let name = lease.metadata.name.clone().unwrap_or_default();
        let stored = s.leases.get(&name).ok_or(status(404, "NotFound"))?;
        if stored.metadata.resource_version != lease.metadata.resource_version {
            return Err(status(409, "Conflict"));
        }
        let mut l = lease.clone();
        l.metadata.resource_version = Some(s.rv.to_string());
        s.leases.insert(name, l.clone());
        Ok(l)
    }

    async fn get_pod(&self, ns: &str, name: &str) -> Result<Option<Pod>, ClusterError> {
        let s = self.enter(Call::GetPod, "get pod")?;
        Ok(s.pods
            .values()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && p.metadata.name.as_deref() == Some(name)
            })
            .cloned())
    }

    async fn create_pod(&self, pod: &Pod) -> Result<Pod, ClusterError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let mut s = self.enter(Call::CreatePod(name.clone()), "create pod")?;
        let ns = pod.metadata.namespace.clone();
        if s.pods.values().any(|p| {
            p.metadata.namespace == ns && p.metadata.name.as_deref() == Some(name.as_str())
        }) {
            return Err(status(409, "AlreadyExists"));
        }
        let uid = format!("pod-uid-{}", s.rv);
        let mut p = pod.clone();
        p.metadata.uid = Some(uid.clone());
        p.metadata.resource_version = Some(s.rv.to_string());
        s.pods.insert(uid, p.clone());
        Ok(p)
    }

    async fn patch_pod_status(
        &self,
        ns: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Pod, ClusterError> {
        let mut s = self.enter(Call::PatchPodStatus(name.to_owned()), "patch pod status")?;
        if s.conflicts > 0 {
            s.conflicts -= 1;
            s.calls.pop();
            s.calls.push(Call::Conflict);
            return Err(status(409, "Conflict"));
        }
        let rv = s.rv.to_string();
        let stored = s
            .pods
            .values_mut()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && p.metadata.name.as_deref() == Some(name)
            })
            .ok_or(status(404, "NotFound"))?;
        let want = patch.pointer("/metadata/uid").and_then(|u| u.as_str());
        if want.is_some_and(|u| Some(u) != stored.metadata.uid.as_deref()) {
            return Err(status(409, "Conflict"));
        }
        let mut v = serde_json::to_value(&*stored).map_err(|_| status(500, "Internal"))?;
        if let Some(st) = patch.get("status") {
            super::strategic::apply(
                &mut v,
                &serde_json::json!({ "status": st }),
                super::strategic::POD_MERGE_KEYS,
            );
        }
        *stored = serde_json::from_value(v).map_err(|_| status(422, "Invalid"))?;
        stored.metadata.resource_version = Some(rv);
        let out = stored.clone();
        s.patches.push(patch.clone());
        Ok(out)
    }

    async fn delete_pod(&self, _ns: &str, _name: &str, uid: &str) -> Result<(), ClusterError> {
        let mut s = self.enter(Call::DeletePod(uid.to_owned()), "delete pod")?;
        s.pods
            .remove(uid)
            .map(|_| ())
            .ok_or(status(404, "NotFound"))
    }

    async fn create_event(&self, event: &Event) -> Result<Event, ClusterError> {
        let reason = event.reason.clone().unwrap_or_default();
        let mut s = self.enter(Call::CreateEvent(reason), "create event")?;
        let name = event.metadata.name.clone().unwrap_or_default();
        if s.events.contains_key(&name) {
            return Err(status(409, "AlreadyExists"));
        }
        s.events.insert(name, event.clone());
        Ok(event.clone())
    }

    async fn patch_event(
        &self,
        _ns: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Event, ClusterError> {
        let mut s = self.enter(Call::PatchEvent, "patch event")?;
        let e = patched(s.events.get(name).ok_or(status(404, "NotFound"))?, patch)?;
        s.events.insert(name.to_owned(), e.clone());
        Ok(e)
    }
}
