//! The Node object: registration and status, as kubelet's `kubelet_node_status.go` and
//! `nodestatus/setters.go` write them.
//!
//! Pure parts: [`node_for_registration`] (the object kubelet creates: name, the default labels
//! and `--node-labels`, the status), [`build_status`] (capacity, allocatable, addresses,
//! nodeInfo and the four conditions, each keeping its `lastTransitionTime` while its status
//! holds), [`status_changed`] (kubelet's `nodeStatusHasChanged`: heartbeat times ignored) and
//! [`status_patch`]. The loop ([`run`]) registers the node (create; on AlreadyExists, reconcile
//! the default labels), then every `nodeStatusUpdateFrequency` builds the status and patches it
//! when it changed or `nodeStatusReportFrequency` passed; a change of the eviction manager's
//! pressure conditions triggers the same at once.

mod facts;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::{
    api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus, NodeSystemInfo},
    apimachinery::pkg::{
        api::resource::Quantity as ApiQuantity,
        apis::meta::v1::{ObjectMeta, Time},
    },
};
use serde_json::json;

use super::{ClusterApi, backoff, now_time};
use crate::recorder::{EventType, Involved, Recorder};
pub use facts::{NodeFacts, default_labels, go_arch, node_labels, os_image};

use crate::{
    health::Health,
    status_manager::{NodeRecord, StatusManager},
};

/// The node's pressure and readiness as the rest of the daemon knows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeHealth {
    pub memory_pressure: bool,
    pub disk_pressure: bool,
    pub pid_pressure: bool,
    /// Why the node is not ready (kubelet's runtime / network / storage errors); empty: ready.
    pub not_ready: Vec<String>,
}

impl NodeHealth {
    /// From the eviction manager's node record and the daemon's health.
    #[must_use]
    pub fn of(record: &NodeRecord, health: &Health) -> Self {
        let on = |kind: &str| record.true_conditions().contains(&kind);
        let mut not_ready = Vec::new();
        if health.runtime_down() {
            not_ready.push("container runtime is down".to_owned());
        }
        Self {
            memory_pressure: on("MemoryPressure"),
            disk_pressure: on("DiskPressure"),
            pid_pressure: on("PIDPressure"),
            not_ready,
        }
    }
}

/// One condition the way a setter writes it: the previous one's `lastTransitionTime` kept
/// while the status holds, the heartbeat `now`.
fn condition(
    previous: &[NodeCondition],
    kind: &str,
    on: bool,
    (reason, message): (&str, &str),
    now: &Time,
) -> NodeCondition {
    let status = if on { "True" } else { "False" };
    let transition = previous
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    NodeCondition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(transition),
    }
}

/// kubelet's four conditions, in its order (MemoryPressure, DiskPressure, PIDPressure,
/// Ready), with its reasons and messages.
#[must_use]
pub fn conditions(previous: &[NodeCondition], h: &NodeHealth, now: &Time) -> Vec<NodeCondition> {
    let memory = if h.memory_pressure {
        (
            "KubeletHasInsufficientMemory",
            "kubelet has insufficient memory available",
        )
    } else {
        (
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        )
    };
    let disk = if h.disk_pressure {
        ("KubeletHasDiskPressure", "kubelet has disk pressure")
    } else {
        ("KubeletHasNoDiskPressure", "kubelet has no disk pressure")
    };
    let pid = if h.pid_pressure {
        (
            "KubeletHasInsufficientPID",
            "kubelet has insufficient PID available",
        )
    } else {
        (
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        )
    };
    let not_ready = h.not_ready.join(", ");
    let ready = if h.not_ready.is_empty() {
        ("KubeletReady", "kubelet is posting ready status")
    } else {
        ("KubeletNotReady", not_ready.as_str())
    };
    vec![
        condition(previous, "MemoryPressure", h.memory_pressure, memory, now),
        condition(previous, "DiskPressure", h.disk_pressure, disk, now),
        condition(previous, "PIDPressure", h.pid_pressure, pid, now),
        condition(previous, "Ready", h.not_ready.is_empty(), ready, now),
    ]
}

/// The conditions this node owns.
const OWNED: [&str; 4] = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"];

fn quantities(m: &BTreeMap<String, String>) -> BTreeMap<String, ApiQuantity> {
    m.iter()
        .map(|(k, v)| (k.clone(), ApiQuantity(v.clone())))
        .collect()
}

/// The node's status: capacity, allocatable, addresses, nodeInfo, and the conditions built
/// over `previous` (the API's, whose conditions of other owners are kept).
#[must_use]
pub fn build_status(
    facts: &NodeFacts,
    previous: Option<&NodeStatus>,
    h: &NodeHealth,
    now: &Time,
) -> NodeStatus {
    let prev_conditions = previous
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let mut conds: Vec<NodeCondition> = prev_conditions
        .iter()
        .filter(|c| !OWNED.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    conds.extend(conditions(&prev_conditions, h, now));
    let mut addresses = Vec::new();
    if let Some(ip) = &facts.host_ip {
        addresses.push(NodeAddress {
            type_: "InternalIP".to_owned(),
            address: ip.clone(),
        });
    }
    addresses.push(NodeAddress {
        type_: "Hostname".to_owned(),
        address: facts.name.clone(),
    });
    NodeStatus {
        capacity: Some(quantities(&facts.capacity)),
        allocatable: Some(quantities(&facts.allocatable)),
        conditions: Some(conds),
        addresses: Some(addresses),
        node_info: Some(NodeSystemInfo {
            architecture: go_arch().to_owned(),
            boot_id: facts.boot_id.clone(),
            container_runtime_version: facts.container_runtime_version.clone(),
            kernel_version: facts.kernel_version.clone(),
            kube_proxy_version: String::new(),
            kubelet_version: crate::node::kubelet_version(),
            machine_id: facts.machine_id.clone(),
            operating_system: "linux".to_owned(),
            os_image: facts.os_image.clone(),
            system_uuid: facts.system_uuid.clone(),
            swap: None,
            running_in_user_namespace: None,
        }),
        ..previous.cloned().unwrap_or_default()
    }
}

/// The Node kubelet creates at registration.
#[must_use]
pub fn node_for_registration(facts: &NodeFacts, h: &NodeHealth, now: &Time) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(facts.name.clone()),
            labels: Some(default_labels(facts)),
            annotations: Some(BTreeMap::from([(
                "volumes.kubernetes.io/controller-managed-attach-detach".to_owned(),
                "true".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec::default()),
        status: Some(build_status(facts, None, h, now)),
    }
}

/// kubelet's `nodeStatusHasChanged`: any difference but the conditions' heartbeat times.
#[must_use]
pub fn status_changed(old: Option<&NodeStatus>, new: &NodeStatus) -> bool {
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        s
    };
    old.is_none_or(|o| strip(o) != strip(new))
}

/// The body of the `nodes/{name}/status` patch: the whole status (lists complete, so a
/// strategic merge and a JSON merge give the same object).
#[must_use]
pub fn status_patch(status: &NodeStatus) -> serde_json::Value {
    json!({ "status": status })
}

/// The labels of an existing Node to reconcile at re-registration (kubelet's
/// `updateDefaultLabels`): `None` when they already match.
#[must_use]
pub fn label_patch(existing: &Node, facts: &NodeFacts) -> Option<serde_json::Value> {
    let want = default_labels(facts);
    let have = existing.metadata.labels.clone().unwrap_or_default();
    let missing: BTreeMap<&String, &String> = want
        .iter()
        .filter(|(k, v)| have.get(*k) != Some(*v))
        .collect();
    (!missing.is_empty()).then(|| json!({"metadata": {"labels": missing}}))
}

/// The node events of condition changes between two builds (the setters' `recordEventFunc`):
/// `NodeHasSufficientMemory` / `NodeHasInsufficientMemory`, `NodeHasNoDiskPressure` /
/// `NodeHasDiskPressure`, `NodeHasSufficientPID` / `NodeHasInsufficientPID`, `NodeReady` /
/// `NodeNotReady`.
#[must_use]
pub fn condition_events(previous: &[NodeCondition], next: &[NodeCondition]) -> Vec<&'static str> {
    next.iter()
        .filter(|c| {
            previous
                .iter()
                .find(|p| p.type_ == c.type_)
                .is_none_or(|p| p.status != c.status)
        })
        .filter_map(|c| {
            let on = c.status == "True";
            Some(match (c.type_.as_str(), on) {
                ("MemoryPressure", true) => "NodeHasInsufficientMemory",
                ("MemoryPressure", false) => "NodeHasSufficientMemory",
                ("DiskPressure", true) => "NodeHasDiskPressure",
                ("DiskPressure", false) => "NodeHasNoDiskPressure",
                ("PIDPressure", true) => "NodeHasInsufficientPID",
                ("PIDPressure", false) => "NodeHasSufficientPID",
                ("Ready", true) => "NodeReady",
                ("Ready", false) => "NodeNotReady",
                _ => return None,
            })
        })
        .collect()
}

/// Records the node events of the condition changes from `previous` to `next`.
fn record_condition_events(
    events: &Recorder,
    name: &str,
    previous: &[NodeCondition],
    next: &[NodeCondition],
) {
    for reason in condition_events(previous, next) {
        let type_ = if reason == "NodeNotReady" {
            EventType::Warning
        } else {
            EventType::Normal
        };
        events.event(
            Involved::node(name),
            type_,
            reason,
            format!("Node {name} status is now: {reason}"),
        );
    }
}

/// Standalone (no API server): the node events cluster mode records while it builds the
/// status, `Starting` and then each condition change, checked on every change of the
/// node's status and every `period`, until `shutdown`.
pub async fn record_node_events(
    status: StatusManager,
    health: Arc<Health>,
    name: String,
    period: Duration,
    events: Recorder,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let changed = status.subscribe();
    events.event(
        Involved::node(&name),
        EventType::Normal,
        "Starting",
        "Starting kubelet.".to_owned(),
    );
    let mut built: Vec<NodeCondition> = Vec::new();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        let h = NodeHealth::of(&status.node(), &health);
        let conds = conditions(&built, &h, &now_time());
        record_condition_events(&events, &name, &built, &conds);
        built = conds;
        tokio::select! {
            () = &mut shutdown => return,
            _ = tick.tick() => {}
            () = changed.notified() => {}
        }
    }
}

/// The update and report periods.
#[derive(Clone, Copy, Debug)]
pub struct Periods {
    /// `nodeStatusUpdateFrequency`.
    pub update: Duration,
    /// `nodeStatusReportFrequency`.
    pub report: Duration,
}

/// Registers the node: create; on AlreadyExists, reconcile the default labels. Retries with
/// backoff until it works; returns the node as the API has it.
async fn register<A: ClusterApi>(api: &A, facts: &NodeFacts, h: &NodeHealth) -> Node {
    let mut failures = 0u32;
    loop {
        let node = node_for_registration(facts, h, &now_time());
        let result = match api.create_node(&node).await {
            Ok(n) => {
                tracing::info!(node = %facts.name, "node registered");
                Ok(n)
            }
            Err(e) if e.is_already_exists() => match api.get_node(&facts.name).await {
                Ok(Some(existing)) => match label_patch(&existing, facts) {
                    Some(p) => api.patch_node(&facts.name, &p).await,
                    None => Ok(existing),
                },
                Ok(None) => continue,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match result {
            Ok(n) => return n,
            Err(e) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(node = %facts.name, error = %e, "registering the node failed; retrying");
                }
                tokio::time::sleep(backoff(failures)).await;
            }
        }
    }
}

/// Registers the node, then keeps its status current (see the module doc).
pub async fn run<A: ClusterApi>(
    api: Arc<A>,
    facts: NodeFacts,
    periods: Periods,
    status: StatusManager,
    health: Arc<Health>,
    events: Recorder,
) {
    let changed = status.subscribe();
    let involved = Involved::node(&facts.name);
    events.event(
        involved.clone(),
        EventType::Normal,
        "Starting",
        "Starting kubelet.".to_owned(),
    );
    let mut built: Vec<NodeCondition> = Vec::new();
    let health_now = || NodeHealth::of(&status.node(), &health);
    let mut current = Some(register(api.as_ref(), &facts, &health_now()).await);
    let mut last_report: Option<tokio::time::Instant> = None;
    let mut last_health: Option<NodeHealth> = None;
    let mut tick = tokio::time::interval(periods.update);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failures = 0u32;
    // After a failure: try again once the backoff passed, without waiting for the next tick
    // (a pressure change must get through).
    let mut retry = false;
    loop {
        if !std::mem::take(&mut retry) {
            tokio::select! {
                _ = tick.tick() => {}
                () = changed.notified() => {
                    // Only a change of the node's own conditions is pushed at once.
                    if last_health.as_ref() == Some(&health_now()) {
                        continue;
                    }
                }
            }
        }
        let h = health_now();
        // The node as last seen (kubelet reads its informer's copy); fetched after a failure.
        let node = match current.take() {
            Some(n) => Ok(Some(n)),
            None => api.get_node(&facts.name).await,
        };
        let node = match node {
            Ok(Some(n)) => n,
            Ok(None) => register(api.as_ref(), &facts, &h).await,
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::debug!(error = %e, "reading the node failed");
                tokio::time::sleep(backoff(failures).min(periods.update)).await;
                retry = true;
                continue;
            }
        };
        let new = build_status(&facts, node.status.as_ref(), &h, &now_time());
        let conds = new.conditions.clone().unwrap_or_default();
        record_condition_events(&events, &facts.name, &built, &conds);
        built = conds;
        let due = last_report.is_none_or(|t| t.elapsed() >= periods.report);
        if !status_changed(node.status.as_ref(), &new) && !due {
            current = Some(node);
            last_health = Some(h);
            continue;
        }
        match api
            .patch_node_status(&facts.name, &status_patch(&new))
            .await
        {
            Ok(n) => {
                if failures > 0 {
                    tracing::info!(node = %facts.name, "node status delivered again");
                }
                failures = 0;
                current = Some(n);
                last_report = Some(tokio::time::Instant::now());
                last_health = Some(h);
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(node = %facts.name, error = %e, "updating the node status failed; retrying");
                }
                tokio::time::sleep(backoff(failures).min(periods.update)).await;
                retry = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::fake::{Call, FakeApi};

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("time"))
    }

    fn facts() -> NodeFacts {
        NodeFacts {
            name: "node-1".to_owned(),
            labels: BTreeMap::from([("role".to_owned(), "edge".to_owned())]),
            capacity: BTreeMap::from([("memory".to_owned(), "1Gi".to_owned())]),
            allocatable: BTreeMap::from([("memory".to_owned(), "900Mi".to_owned())]),
            host_ip: Some("10.0.0.5".to_owned()),
            kernel_version: "6.1.0".to_owned(),
            os_image: "Debian GNU/Linux 12 (bookworm)".to_owned(),
            container_runtime_version: "containerd://1.6.20".to_owned(),
            ..NodeFacts::default()
        }
    }

    fn by_type<'a>(s: &'a NodeStatus, kind: &str) -> &'a NodeCondition {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == kind)
            .expect("condition")
    }

    #[test]
    fn kubelets_reasons_and_messages() {
        let calm = conditions(&[], &NodeHealth::default(), &t(1));
        let got: Vec<(&str, &str, &str, &str)> = calm
            .iter()
            .map(|c| {
                (
                    c.type_.as_str(),
                    c.status.as_str(),
                    c.reason.as_deref().unwrap_or(""),
                    c.message.as_deref().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available"
                ),
                (
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure"
                ),
                (
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available"
                ),
                (
                    "Ready",
                    "True",
                    "KubeletReady",
                    "kubelet is posting ready status"
                )
            ]
        );
        let h = NodeHealth {
            memory_pressure: true,
            disk_pressure: true,
            pid_pressure: true,
            not_ready: vec!["container runtime is down".to_owned()],
        };
        let hot = conditions(&calm, &h, &t(2));
        let reasons: Vec<_> = hot
            .iter()
            .map(|c| (c.status.as_str(), c.reason.as_deref().unwrap_or("")))
            .collect();
        assert_eq!(
            reasons,
            [
                ("True", "KubeletHasInsufficientMemory"),
                ("True", "KubeletHasDiskPressure"),
                ("True", "KubeletHasInsufficientPID"),
                ("False", "KubeletNotReady")
            ]
        );
        assert_eq!(
            hot[0].message.as_deref(),
            Some("kubelet has insufficient memory available")
        );
        assert_eq!(hot[3].message.as_deref(), Some("container runtime is down"));
        assert_eq!(hot[0].last_transition_time, Some(t(2)));
    }

    #[test]
    fn transition_time_is_kept_while_the_status_holds() {
        let first = build_status(&facts(), None, &NodeHealth::default(), &t(10));
        let second = build_status(&facts(), Some(&first), &NodeHealth::default(), &t(20));
        let m = by_type(&second, "MemoryPressure");
        assert_eq!(m.last_transition_time, Some(t(10)));
        assert_eq!(m.last_heartbeat_time, Some(t(20)));
        assert!(
            !status_changed(Some(&first), &second),
            "a heartbeat alone is no change"
        );
        let pressure = NodeHealth {
            memory_pressure: true,
            ..NodeHealth::default()
        };
        let third = build_status(&facts(), Some(&second), &pressure, &t(30));
        assert_eq!(
            by_type(&third, "MemoryPressure").last_transition_time,
            Some(t(30))
        );
        assert!(status_changed(Some(&second), &third));
    }

    #[test]
    fn other_owners_conditions_are_kept() {
        let mut prev = build_status(&facts(), None, &NodeHealth::default(), &t(1));
        prev.conditions.get_or_insert_default().push(NodeCondition {
            type_: "NetworkUnavailable".to_owned(),
            status: "False".to_owned(),
            ..NodeCondition::default()
        });
        let next = build_status(&facts(), Some(&prev), &NodeHealth::default(), &t(2));
        let types: Vec<_> = next
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            [
                "NetworkUnavailable",
                "MemoryPressure",
                "DiskPressure",
                "PIDPressure",
                "Ready"
            ]
        );
    }

    #[test]
    fn registration_object() {
        let n = node_for_registration(&facts(), &NodeHealth::default(), &t(1));
        let labels = n.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels["kubernetes.io/hostname"], "node-1");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["kubernetes.io/arch"], go_arch());
        assert_eq!(labels["role"], "edge");
        let s = n.status.expect("status");
        let info = s.node_info.expect("nodeInfo");
        assert_eq!(info.container_runtime_version, "containerd://1.6.20");
        assert!(
            info.kubelet_version.starts_with("v1."),
            "{}",
            info.kubelet_version
        );
        assert_eq!(s.capacity.expect("capacity")["memory"].0, "1Gi");
        assert_eq!(s.allocatable.expect("allocatable")["memory"].0, "900Mi");
        let addresses: Vec<_> = s
            .addresses
            .expect("addresses")
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        assert_eq!(
            addresses,
            [
                ("InternalIP".to_owned(), "10.0.0.5".to_owned()),
                ("Hostname".to_owned(), "node-1".to_owned())
            ]
        );
        let mut existing = Node::default();
        existing.metadata.labels = Some(default_labels(&facts()));
        assert!(label_patch(&existing, &facts()).is_none());
        existing.metadata.labels = None;
        assert!(label_patch(&existing, &facts()).is_some());
    }

    #[test]
    fn condition_change_events() {
        let calm = conditions(&[], &NodeHealth::default(), &t(1));
        assert_eq!(
            condition_events(&[], &calm),
            [
                "NodeHasSufficientMemory",
                "NodeHasNoDiskPressure",
                "NodeHasSufficientPID",
                "NodeReady"
            ]
        );
        assert!(condition_events(&calm, &calm).is_empty());
        let hot = conditions(
            &calm,
            &NodeHealth {
                memory_pressure: true,
                ..NodeHealth::default()
            },
            &t(2),
        );
        assert_eq!(condition_events(&calm, &hot), ["NodeHasInsufficientMemory"]);
    }
    /// Registered once, patched when it changes or the report period passes, and a pressure
    /// change goes out at once (not at the next update tick).
    #[tokio::test(start_paused = true)]
    async fn patched_when_changed_or_due_and_pressure_pushed_at_once() {
        let api = Arc::new(FakeApi::default());
        let status = StatusManager::default();
        let health = Arc::new(Health::default());
        let task = tokio::spawn(run(
            api.clone(),
            facts(),
            Periods {
                update: Duration::from_secs(10),
                report: Duration::from_secs(300),
            },
            status.clone(),
            health,
            Recorder::default(),
        ));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(api.count(|c| matches!(c, Call::CreateNode(_))), 1);
        // The first tick patches (no report yet), the next ones only heartbeat locally.
        tokio::time::sleep(Duration::from_secs(35)).await;
        assert_eq!(api.count(|c| matches!(c, Call::PatchNodeStatus(_))), 1);
        // Pressure: pushed within the same instant.
        status.set_node(NodeRecord {
            conditions: vec![crate::status_manager::Condition::new(
                "MemoryPressure",
                true,
            )],
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(api.count(|c| matches!(c, Call::PatchNodeStatus(_))), 2);
        let node = api.node("node-1").expect("node");
        let s = node.status.expect("status");
        assert_eq!(by_type(&s, "MemoryPressure").status, "True");
        // Report period: a patch without change after 5 m.
        tokio::time::sleep(Duration::from_secs(311)).await;
        assert_eq!(api.count(|c| matches!(c, Call::PatchNodeStatus(_))), 3);
        task.abort();
    }

    /// Standalone: `Starting`, the first conditions, then a pressure change at once (not at
    /// the next tick), and nothing while nothing changes.
    #[tokio::test(start_paused = true)]
    async fn standalone_node_events_follow_the_conditions() {
        let status = StatusManager::default();
        let (rec, mut rx) = Recorder::channel();
        let task = tokio::spawn(record_node_events(
            status.clone(),
            Arc::new(Health::default()),
            "node-1".to_owned(),
            Duration::from_secs(10),
            rec,
            std::future::pending(),
        ));
        let mut reasons = || {
            let mut out = Vec::new();
            while let Ok(e) = rx.try_recv() {
                assert_eq!(e.involved, Involved::node("node-1"));
                out.push(e.reason);
            }
            out
        };
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(
            reasons(),
            [
                "Starting",
                "NodeHasSufficientMemory",
                "NodeHasNoDiskPressure",
                "NodeHasSufficientPID",
                "NodeReady"
            ]
        );
        status.set_node(NodeRecord {
            conditions: vec![crate::status_manager::Condition::new(
                "MemoryPressure",
                true,
            )],
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(reasons(), ["NodeHasInsufficientMemory"]);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(reasons().is_empty());
        task.abort();
    }

    /// A pressure change whose patch fails, and whose node read then fails too, is retried
    /// after the backoff, not at the next update tick.
    #[tokio::test(start_paused = true)]
    async fn failed_writes_are_retried_before_the_next_tick() {
        let api = Arc::new(FakeApi::default());
        let status = StatusManager::default();
        let task = tokio::spawn(run(
            api.clone(),
            facts(),
            Periods {
                update: Duration::from_secs(10),
                report: Duration::from_secs(300),
            },
            status.clone(),
            Arc::new(Health::default()),
            Recorder::default(),
        ));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(api.count(|c| matches!(c, Call::PatchNodeStatus(_))), 1);
        api.set_down(true);
        status.set_node(NodeRecord {
            conditions: vec![crate::status_manager::Condition::new(
                "MemoryPressure",
                true,
            )],
        });
        // The patch fails at once, the read of the node 200 ms later.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let failed = |op| api.count(|c| *c == Call::Failed(op));
        assert_eq!((failed("patch node status"), failed("get node")), (1, 1));
        api.set_down(false);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(api.count(|c| matches!(c, Call::PatchNodeStatus(_))), 2);
        let s = api.node("node-1").and_then(|n| n.status).expect("status");
        assert_eq!(by_type(&s, "MemoryPressure").status, "True");
        task.abort();
    }
}
