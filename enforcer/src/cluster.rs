//! Cluster mode (`--kubeconfig`): what the node writes back to the API server, as kubelet does.
//!
//! - [`node_status`]: the Node object (registration, labels, capacity, allocatable, nodeInfo,
//!   addresses, the Ready / MemoryPressure / DiskPressure / PIDPressure conditions with
//!   kubelet's reasons), checked every `nodeStatusUpdateFrequency`, patched when it changed or
//!   every `nodeStatusReportFrequency`, and at once when a pressure condition changes;
//! - [`lease`]: the node's Lease in `kube-node-lease`, renewed every `nodeLeaseDurationSeconds /
//!   4`;
//! - [`pod_status`]: kubelet's status manager: each pod's status through `pods/{name}/status`
//!   (merged with the API's as `mergePodStatus` does, terminal phases never reverted, sent
//!   only when changed, 409 retried on a fresh GET), and the final delete (grace 0) of a pod
//!   whose graceful deletion completed;
//! - [`limiter`]: one token bucket (`kubeAPIQPS` / `kubeAPIBurst`) in front of every request,
//!   the lease first.
//!
//! Every request goes through the small [`ClusterApi`] trait: [`KubeApi`] (kube's client) on a
//! node, a recording fake in the unit tests. Nothing the node does waits on the API server:
//! the writers are tasks of their own that read the [`StatusManager`] and keep the newest
//! status per pod until it is delivered.

pub mod event_store;
pub mod events;
pub mod lease;
pub mod limiter;
pub mod mirror;
pub mod node_status;
pub mod pod_status;
pub mod strategic;

use std::{future::Future, path::PathBuf, sync::Arc, time::Duration};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Event, Node, Pod},
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use tokio::task::JoinSet;

use crate::{health::Health, status_manager::StatusManager};
use limiter::Limiter;

/// How long one API request may take before it counts as failed (and is retried later).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of the API-server writers; each names the request and the object.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The server answered with an error status.
    #[error("{op} {object}: {code} {reason}: {message}")]
    Status {
        op: &'static str,
        object: String,
        code: u16,
        reason: String,
        message: String,
    },
    /// No answer (connection refused, reset, a body that does not decode).
    #[error("{op} {object}: {message}")]
    Transport {
        op: &'static str,
        object: String,
        message: String,
    },
    #[error("{op} {object}: no answer within {after:?}")]
    Timeout {
        op: &'static str,
        object: String,
        after: Duration,
    },
}

impl ClusterError {
    /// The HTTP status the server answered, if it answered.
    #[must_use]
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// 409 Conflict (a stale resourceVersion or a failed precondition).
    #[must_use]
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Status { code: 409, reason, .. } if reason != "AlreadyExists")
    }

    /// 409 AlreadyExists (a create of an existing name).
    #[must_use]
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Self::Status { code: 409, reason, .. } if reason == "AlreadyExists")
    }

    /// 404.
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    fn from_kube(op: &'static str, object: &str, e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => Self::Status {
                op,
                object: object.to_owned(),
                code: s.code,
                reason: s.reason.clone(),
                message: s.message.clone(),
            },
            other => Self::Transport {
                op,
                object: object.to_owned(),
                message: other.to_string(),
            },
        }
    }
}

/// The API-server requests the node makes (kubelet's, no more).
pub trait ClusterApi: Send + Sync + 'static {
    fn get_node(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Node>, ClusterError>> + Send;
    fn create_node(&self, node: &Node) -> impl Future<Output = Result<Node, ClusterError>> + Send;
    /// A patch of the node object (labels at re-registration).
    fn patch_node(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> impl Future<Output = Result<Node, ClusterError>> + Send;
    /// A patch of `nodes/{name}/status` (`{"status": {...}}`).
    fn patch_node_status(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> impl Future<Output = Result<Node, ClusterError>> + Send;
    fn get_lease(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Lease>, ClusterError>> + Send;
    fn create_lease(
        &self,
        lease: &Lease,
    ) -> impl Future<Output = Result<Lease, ClusterError>> + Send;
    /// An update (PUT) carrying the lease's resourceVersion.
    fn replace_lease(
        &self,
        lease: &Lease,
    ) -> impl Future<Output = Result<Lease, ClusterError>> + Send;
    fn get_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Pod>, ClusterError>> + Send;
    /// A create of a pod (a mirror pod).
    fn create_pod(&self, pod: &Pod) -> impl Future<Output = Result<Pod, ClusterError>> + Send;
    /// A strategic merge patch of `pods/{name}/status` (kubelet's `PatchPodStatus`: the
    /// node's statuses, the companion's eviction status).
    fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> impl Future<Output = Result<Pod, ClusterError>> + Send;
    /// DELETE with grace period 0 and the pod's uid as precondition.
    fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// A core/v1 Event.
    fn create_event(
        &self,
        event: &Event,
    ) -> impl Future<Output = Result<Event, ClusterError>> + Send;
    /// A patch of an Event (`count`, `lastTimestamp`, `message` of a repeat).
    fn patch_event(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> impl Future<Output = Result<Event, ClusterError>> + Send;
}

/// [`ClusterApi`] on kube's client, every request with [`REQUEST_TIMEOUT`] (the daemon puts
/// it behind the [`Limiter`] with [`limiter::Limited`]).
#[derive(Clone)]
pub struct KubeApi {
    client: kube::Client,
}

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApi").finish_non_exhaustive()
    }
}

/// The namespace of node leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

impl KubeApi {
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// A request with its timeout.
    async fn call<T>(
        &self,
        op: &'static str,
        object: &str,
        f: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ClusterError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
            Ok(r) => r.map_err(|e| ClusterError::from_kube(op, object, e)),
            Err(_) => Err(ClusterError::Timeout {
                op,
                object: object.to_owned(),
                after: REQUEST_TIMEOUT,
            }),
        }
    }

    fn nodes(&self) -> kube::Api<Node> {
        kube::Api::all(self.client.clone())
    }

    fn leases(&self, ns: &str) -> kube::Api<Lease> {
        kube::Api::namespaced(self.client.clone(), ns)
    }

    fn pods(&self, ns: &str) -> kube::Api<Pod> {
        kube::Api::namespaced(self.client.clone(), ns)
    }
}

fn name_of(meta: &kube::api::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

impl ClusterApi for KubeApi {
    async fn get_node(&self, name: &str) -> Result<Option<Node>, ClusterError> {
        let api = self.nodes();
        self.call("get node", name, api.get_opt(name)).await
    }

    async fn create_node(&self, node: &Node) -> Result<Node, ClusterError> {
        let api = self.nodes();
        let name = name_of(&node.metadata);
        self.call(
            "create node",
            &name,
            api.create(&PostParams::default(), node),
        )
        .await
    }

    async fn patch_node(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Node, ClusterError> {
        let api = self.nodes();
        self.call(
            "patch node",
            name,
            api.patch(name, &PatchParams::default(), &Patch::Strategic(patch)),
        )
        .await
    }

    async fn patch_node_status(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Node, ClusterError> {
        let api = self.nodes();
        self.call(
            "patch node status",
            name,
            api.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch)),
        )
        .await
    }

    async fn get_lease(&self, namespace: &str, name: &str) -> Result<Option<Lease>, ClusterError> {
        let api = self.leases(namespace);
        self.call("get lease", name, api.get_opt(name)).await
    }

    async fn create_lease(&self, lease: &Lease) -> Result<Lease, ClusterError> {
        let ns = lease.metadata.namespace.clone().unwrap_or_default();
        let api = self.leases(&ns);
        self.call(
            "create lease",
            &name_of(&lease.metadata),
            api.create(&PostParams::default(), lease),
        )
        .await
    }

    async fn replace_lease(&self, lease: &Lease) -> Result<Lease, ClusterError> {
        let ns = lease.metadata.namespace.clone().unwrap_or_default();
        let name = name_of(&lease.metadata);
        let api = self.leases(&ns);
        self.call(
            "update lease",
            &name,
            api.replace(&name, &PostParams::default(), lease),
        )
        .await
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ClusterError> {
        let api = self.pods(namespace);
        self.call("get pod", &format!("{namespace}/{name}"), api.get_opt(name))
            .await
    }

    async fn create_pod(&self, pod: &Pod) -> Result<Pod, ClusterError> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = name_of(&pod.metadata);
        let api = self.pods(&ns);
        self.call(
            "create pod",
            &format!("{ns}/{name}"),
            api.create(&PostParams::default(), pod),
        )
        .await
    }

    async fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Pod, ClusterError> {
        let api = self.pods(namespace);
        self.call(
            "patch pod status",
            &format!("{namespace}/{name}"),
            api.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch)),
        )
        .await
    }

    async fn delete_pod(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ClusterError> {
        let api = self.pods(namespace);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.call(
            "delete pod",
            &format!("{namespace}/{name}"),
            api.delete(name, &dp),
        )
        .await
        .map(|_| ())
    }

    async fn create_event(&self, event: &Event) -> Result<Event, ClusterError> {
        let ns = event.metadata.namespace.clone().unwrap_or_default();
        let api: kube::Api<Event> = kube::Api::namespaced(self.client.clone(), &ns);
        self.call(
            "create event",
            &name_of(&event.metadata),
            api.create(&PostParams::default(), event),
        )
        .await
    }

    async fn patch_event(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Event, ClusterError> {
        let api: kube::Api<Event> = kube::Api::namespaced(self.client.clone(), namespace);
        self.call(
            "patch event",
            name,
            api.patch(name, &PatchParams::default(), &Patch::Strategic(patch)),
        )
        .await
    }
}

/// What cluster mode needs: the node's facts and the periods (the daemon takes them from
/// the validated configuration: [`spawn_for_daemon`]).
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub kubeconfig: PathBuf,
    pub node: node_status::NodeFacts,
    /// `nodeStatusUpdateFrequency` (10 s) and `nodeStatusReportFrequency` (5 m).
    pub status_periods: node_status::Periods,
    /// `nodeLeaseDurationSeconds` (40).
    pub lease_duration_seconds: i32,
    /// `kubeAPIQPS` / `kubeAPIBurst`.
    pub qps: u32,
    pub burst: u32,
    /// `eventRecordQPS` / `eventBurst`.
    pub event_qps: u32,
    pub event_burst: u32,
    /// The pod loop's active pods: static pods among them get mirror pods (`None`: no
    /// mirror pods).
    pub link: Option<crate::pods::NodeLink>,
    /// Where the pod status writer keeps the statuses not delivered yet
    /// ([`crate::status_manager::outbox::OUTBOX_FILE`]; `None`: in memory only).
    pub state_dir: Option<PathBuf>,
}

/// The events the node's parts record, and the queue the writer reads.
#[derive(Debug)]
pub struct EventQueue {
    pub recorder: crate::recorder::Recorder,
    pub rx: tokio::sync::mpsc::Receiver<crate::recorder::EventRecord>,
}

impl EventQueue {
    #[must_use]
    pub fn new() -> Self {
        let (recorder, rx) = crate::recorder::Recorder::channel();
        Self { recorder, rx }
    }
}

impl Default for EventQueue {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs the node status, lease and pod status writers against `api` until `shutdown`.
pub async fn run_with<A: ClusterApi>(
    api: Arc<A>,
    opts: ClusterOptions,
    status: StatusManager,
    health: Arc<Health>,
    events: EventQueue,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let mut tasks = JoinSet::new();
    if let Some(link) = opts.link.clone() {
        tasks.spawn(mirror::run(
            api.clone(),
            link,
            status.clone(),
            opts.node.name.clone(),
        ));
    }
    tasks.spawn(events::run(
        api.clone(),
        events.rx,
        opts.node.name.clone(),
        opts.event_qps,
        opts.event_burst,
        opts.state_dir
            .as_deref()
            .map(|d| crate::status_manager::outbox::Outbox::at(d.join(events::OUTBOX_FILE))),
    ));
    tasks.spawn(node_status::run(
        api.clone(),
        opts.node.clone(),
        opts.status_periods,
        status.clone(),
        health,
        events.recorder,
    ));
    tasks.spawn(lease::run(
        api.clone(),
        opts.node.name.clone(),
        opts.lease_duration_seconds,
    ));
    tasks.spawn(pod_status::run(
        api,
        status,
        opts.node.host_ip.clone(),
        opts.link.clone(),
        opts.state_dir
            .as_deref()
            .map(crate::status_manager::outbox::Outbox::new),
    ));
    shutdown.await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

/// Cluster mode on a node: a kube client from the kubeconfig (retried every 10 s while it
/// cannot be loaded), the [`Limiter`], then [`run_with`].
pub async fn run(
    opts: ClusterOptions,
    status: StatusManager,
    health: Arc<Health>,
    events: EventQueue,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let limiter = Arc::new(Limiter::new(opts.qps, opts.burst));
    let mut shutdown = Box::pin(shutdown);
    let client = loop {
        match crate::sources::apiserver::client_from_kubeconfig(&opts.kubeconfig).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::error!(error = %e, "cluster mode cannot start; retrying in 10 s");
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
            }
        }
    };
    tracing::info!(node = %opts.node.name, kubeconfig = %opts.kubeconfig.display(), "cluster mode: writing node, lease and pod status");
    run_with(
        Arc::new(limiter::Limited::new(KubeApi::new(client), limiter)),
        opts,
        status,
        health,
        events,
        shutdown,
    )
    .await;
}

/// Cluster mode as the daemon starts it: the node's facts (the container runtime's version
/// asked once, 5 s at most), then [`run`].
#[must_use]
pub fn spawn_for_daemon(
    config: &crate::config::Config,
    start: DaemonStart,
    status: StatusManager,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    use crate::cri::ContainerRuntime as _;
    let DaemonStart {
        kubeconfig,
        resources,
        runtime,
        events,
        link,
    } = start;
    let name = config.node_name();
    let labels = config.node_labels.clone();
    let status_periods = node_status::Periods {
        update: config.node_status_update_frequency,
        report: config.node_status_report_frequency,
    };
    // Validated as a positive int32 when the configuration was loaded; the Lease field is
    // an int32.
    let lease = i32::try_from(config.node_lease_duration_seconds).unwrap_or_else(|_| {
        tracing::error!(
            seconds = config.node_lease_duration_seconds,
            "nodeLeaseDurationSeconds is past the Lease's int32; using {}",
            i32::MAX
        );
        i32::MAX
    });
    let (qps, burst) = (config.kube_api_qps, config.kube_api_burst);
    let (event_qps, event_burst) = (config.event_record_qps, config.event_burst);
    let state_dir = config.enforcer.state_dir.clone();
    // From now on: a pod that terminates before the writers run still has its final status.
    status.track_removed();
    tokio::spawn(async move {
        let version = match &runtime {
            Some(rt) => match tokio::time::timeout(Duration::from_secs(5), rt.version()).await {
                Ok(Ok(v)) => format!("{}://{}", v.runtime_name, v.runtime_version),
                _ => String::new(),
            },
            None => String::new(),
        };
        let node = node_status::NodeFacts::gather(
            &name,
            labels,
            &resources.capacity,
            &resources.allocatable,
            version,
        );
        let opts = ClusterOptions {
            kubeconfig,
            node,
            status_periods,
            lease_duration_seconds: lease,
            qps,
            burst,
            event_qps,
            event_burst,
            link: Some(link),
            state_dir: Some(state_dir),
        };
        run(opts, status, health, events, shutdown).await;
    })
}

/// What the daemon hands cluster mode.
#[derive(Debug)]
pub struct DaemonStart {
    pub kubeconfig: PathBuf,
    pub resources: NodeResources,
    /// The container runtime (its `Version` is the node's `containerRuntimeVersion`).
    pub runtime: Option<Arc<crate::cri::CriRuntime>>,
    pub events: EventQueue,
    /// The pod loop's active pods (for mirror pods).
    pub link: crate::pods::NodeLink,
}

/// The node's capacity and allocatable as the daemon computed them.
#[derive(Clone, Debug, Default)]
pub struct NodeResources {
    pub capacity: std::collections::BTreeMap<String, crate::quantity::Quantity>,
    pub allocatable: std::collections::BTreeMap<String, crate::quantity::Quantity>,
}

/// A JSON merge patch (RFC 7386, `application/merge-patch+json`) applied to `target`: objects
/// merge key by key, `null` removes a key, anything else replaces. The fake API servers (the
/// unit tests' and `enforcer-tests`') apply patches with it.
pub fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = serde_json::Value::Object(serde_json::Map::new());
    }
    if let Some(t) = target.as_object_mut() {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
    }
}

/// Now, as the API's time (the writers' `lastTransitionTime`s and heartbeats).
fn now_time() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}

/// Retry delay after the `failures`-th failure in a row: 200 ms doubling up to 7 s (the
/// lease controller's backoff), used by every writer.
#[must_use]
pub fn backoff(failures: u32) -> Duration {
    crate::policy::backoff::exponential(
        Duration::from_millis(200),
        Duration::from_secs(7),
        failures,
    )
}

#[cfg(test)]
pub(crate) mod fake;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_is_rfc7386() {
        let mut t = serde_json::json!({"a": {"b": 1, "c": [1, 2]}, "d": 1, "f": 2});
        merge_patch(
            &mut t,
            &serde_json::json!({"a": {"b": null, "c": [3]}, "e": "x", "f": {"g": null, "h": 1}}),
        );
        assert_eq!(
            t,
            serde_json::json!({"a": {"c": [3]}, "d": 1, "e": "x", "f": {"h": 1}}),
            "null removes; a non-object target is replaced by the patch without its nulls"
        );
    }

    #[test]
    fn backoff_doubles_to_seven_seconds() {
        let got: Vec<u64> = (1..=8)
            .map(|f| u64::try_from(backoff(f).as_millis()).unwrap_or(0))
            .collect();
        assert_eq!(got, [200, 400, 800, 1600, 3200, 6400, 7000, 7000]);
    }
}
