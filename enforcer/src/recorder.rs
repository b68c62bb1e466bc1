//! The event recorder the node's parts hold (client-go's `record.EventRecorder`): a cheap,
//! never-waiting handle on a bounded queue (1000, client-go's `maxQueuedEvents`; an event is
//! dropped when it is full). What reads the queue, keeps the events on the node and writes them
//! to the API server is `cluster::events` and `cluster::event_store`, above the runtime that
//! records.

use std::collections::BTreeMap;

use tokio::sync::mpsc;

/// `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// The object an event is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Involved {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.containers{app}` for a container's events.
    pub field_path: String,
}

impl Involved {
    /// The node (kubelet's node reference: uid = name).
    #[must_use]
    pub fn node(name: &str) -> Self {
        Self {
            kind: "Node".to_owned(),
            name: name.to_owned(),
            uid: name.to_owned(),
            ..Self::default()
        }
    }

    /// A pod, or one of its containers.
    #[must_use]
    pub fn pod(namespace: &str, name: &str, uid: &str, container: Option<&str>) -> Self {
        Self {
            kind: "Pod".to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            field_path: container
                .map(|c| format!("spec.containers{{{c}}}"))
                .unwrap_or_default(),
        }
    }

    /// One of the pod's containers, with kubelet's `fieldPath` for its kind
    /// (`spec.initContainers{x}` for an init container or sidecar, else `spec.containers{x}`).
    #[must_use]
    pub fn container(pod: &k8s_openapi::api::core::v1::Pod, uid: &str, container: &str) -> Self {
        let init = pod.spec.as_ref().is_some_and(|s| {
            s.init_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
        });
        let mut me = Self::pod(
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            pod.metadata.name.as_deref().unwrap_or(""),
            uid,
            Some(container),
        );
        if init {
            me.field_path = format!("spec.initContainers{{{container}}}");
        }
        me
    }
}

/// One event to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRecord {
    pub involved: Involved,
    pub type_: EventType,
    pub reason: String,
    pub message: String,
    pub annotations: BTreeMap<String, String>,
}

/// The handle the node's parts record events through; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    tx: Option<mpsc::Sender<EventRecord>>,
}

/// client-go's `maxQueuedEvents`.
const QUEUE: usize = 1000;

impl Recorder {
    /// A recorder and the receiving end its writer ([`run`]) reads.
    #[must_use]
    pub fn channel() -> (Self, mpsc::Receiver<EventRecord>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (Self { tx: Some(tx) }, rx)
    }

    /// Records an event (never waits; dropped when the queue is full).
    pub fn record(&self, event: EventRecord) {
        if let Some(tx) = &self.tx {
            // Full: dropped, as client-go drops past maxQueuedEvents.
            let _ = tx.try_send(event);
        }
    }

    /// Shorthand for an event without annotations.
    pub fn event(&self, involved: Involved, type_: EventType, reason: &str, message: String) {
        self.record(EventRecord {
            involved,
            type_,
            reason: reason.to_owned(),
            message,
            annotations: BTreeMap::new(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kubelet's `fieldPath`: init containers (sidecars included) under `spec.initContainers`.
    #[test]
    fn container_field_paths() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"initContainers": [{"name": "setup"}, {"name": "proxy", "restartPolicy": "Always"}],
                     "containers": [{"name": "app"}]},
        }))
        .expect("pod");
        let path = |c: &str| Involved::container(&pod, "u", c).field_path;
        assert_eq!(path("setup"), "spec.initContainers{setup}");
        assert_eq!(path("proxy"), "spec.initContainers{proxy}");
        assert_eq!(path("app"), "spec.containers{app}");
        let i = Involved::container(&pod, "u", "app");
        assert_eq!(
            (i.namespace.as_str(), i.name.as_str(), i.uid.as_str()),
            ("ns", "p", "u")
        );
    }
}
