//! The API-server pod source and cluster mode against the strict fake of the Kubernetes HTTP
//! API (`enforcer_tests::fake_api`; no real API server is reachable here): the list and watch
//! of this node's pods, and what the node writes back (Node, Lease, pod status, the final
//! delete), with real pods on a private containerd where the outcome depends on them.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use enforcer::{
    cluster::{self, node_status::NodeFacts},
    config::ConfigArgs,
    cri::CriRuntime,
    health::Health,
    pods::{RunPodsOptions, run_pods_with},
    sources::{PodOp, SourceEvent, apiserver},
    status_manager::{Condition, ContainerState, NodeRecord, StatusManager},
};
use enforcer_tests::{
    containerd::Containerd,
    fake_api::{FakeApi, Fault, Kind},
    layout,
    node::{Node, Tmpfs, status_file, wait_until},
    process::DaemonProcess,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;

const NODE: &str = "testnode";

/// The daemon tests share the machine's memory (one eviction) and containerd start-up time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn api_pod(name: &str, uid: &str, node: &str, args: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "c",
                "image": "busybox:local",
                "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/sh", "-c"],
                "args": [args],
            }],
        },
        "status": {"phase": "Pending"},
    })
}

async fn next_pod_event(
    rx: &mut mpsc::UnboundedReceiver<SourceEvent>,
    what: &str,
) -> (PodOp, String, String) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(SourceEvent::Pod(u))) => {
                let c = u
                    .pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .and_then(|c| c.args.clone())
                    .unwrap_or_default()
                    .join(" ");
                return (u.op, u.pod.metadata.uid.clone().unwrap_or_default(), c);
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("API source ended while waiting for {what}"),
            Err(_) => panic!("no {what} within 20 s"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_source_turns_list_and_watch_of_this_node_into_pod_updates() {
    let fake = FakeApi::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    fake.put_pod(api_pod("a", "uid-a", NODE, "sleep 1"));
    fake.put_pod(api_pod("elsewhere", "uid-x", "othernode", "sleep 1"));
    let (mut rx, task) = apiserver::spawn(fake.kubeconfig(dir.path()), NODE.to_owned(), None, None);

    let mut first = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !first.contains(&"Synced".to_owned()) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(SourceEvent::Pod(u))) => first.push(format!(
                "{:?} {}",
                u.op,
                u.pod.metadata.uid.as_deref().unwrap_or_default()
            )),
            Ok(Some(SourceEvent::Synced)) => first.push("Synced".to_owned()),
            Ok(Some(other)) => panic!("unexpected {other:?}"),
            Ok(None) | Err(_) => panic!(
                "no initial list within 20 s; got {first:?}; requests {:?}",
                paths(&fake)
            ),
        }
    }
    assert_eq!(first, ["Add uid-a", "Synced"], "only this node's pod");
    let reqs = paths(&fake);
    assert!(
        reqs.iter()
            .any(|r| r.starts_with("/api/v1/pods")
                && r.contains("fieldSelector=spec.nodeName=testnode")),
        "the list must select this node: {reqs:?}"
    );

    // Wait for the watch to be open before changing pods.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !paths(&fake).iter().any(|r| r.contains("watch=true")) {
        assert!(Instant::now() < deadline, "no watch: {:?}", paths(&fake));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    fake.put_pod(api_pod("a", "uid-a", NODE, "sleep 2"));
    assert_eq!(
        next_pod_event(&mut rx, "update").await,
        (PodOp::Update, "uid-a".to_owned(), "sleep 2".to_owned())
    );
    fake.put_pod(api_pod("elsewhere", "uid-x", "othernode", "sleep 2"));
    fake.put_pod(api_pod("b", "uid-b", NODE, "sleep 3"));
    assert_eq!(
        next_pod_event(&mut rx, "add").await,
        (PodOp::Add, "uid-b".to_owned(), "sleep 3".to_owned())
    );
    assert_eq!(fake.delete_pod("default", "a", Some(0)), 200);
    assert_eq!(
        next_pod_event(&mut rx, "delete").await,
        (PodOp::Delete, "uid-a".to_owned(), "sleep 2".to_owned())
    );
    drop(rx);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the source stops when its receiver is dropped")
        .expect("task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_pod_runs_on_containerd_and_its_deletion_stops_it() {
    let mut cd = Containerd::start("rt-api");
    let fake = FakeApi::start().await;
    fake.put_pod(api_pod(
        "api-pod",
        "api-uid-1",
        NODE,
        "trap 'exit 0' TERM; sleep 3600 & wait",
    ));
    let manifests = cd.dir.join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifest dir");
    let caps = enforcer::kernel::Capabilities::probe(&layout());
    let mut opts = RunPodsOptions::for_node(layout(), &caps);
    opts.cri_socket = cd.socket.clone();
    opts.cgroup_root = cd.cgroup_root.clone();
    opts.manifest_dir = manifests;
    opts.state_dir = cd.dir.join("state");
    opts.node_name = NODE.to_owned();
    opts.poll = Duration::from_millis(200);
    opts.relist = Duration::from_millis(200);
    opts.kubeconfig = Some(fake.kubeconfig(&cd.dir));
    let status = StatusManager::default();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let rt = Arc::new(CriRuntime::new(&cd.socket, Duration::from_secs(5)));
    let task = tokio::spawn(run_pods_with(rt, opts, status.clone(), async {
        let _ = stop_rx.await;
    }));
    let running = |s: &StatusManager| {
        s.get("api-uid-1").is_some_and(|p| {
            p.phase == "Running"
                && p.container_statuses
                    .iter()
                    .all(|c| matches!(c.state, ContainerState::Running { .. }))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    while !running(&status) {
        assert!(
            Instant::now() < deadline,
            "API pod not running: {:?}; requests {:?}",
            status.get("api-uid-1"),
            paths(&fake)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let record = status.get("api-uid-1").expect("record");
    assert_eq!(record.source, "api");
    assert_eq!(record.name, "api-pod", "API pods keep their name");
    assert_eq!(fake.delete_pod("default", "api-pod", Some(0)), 200);
    let deadline = Instant::now() + Duration::from_secs(40);
    while status.get("api-uid-1").is_some() || !cd.pod_cgroups().is_empty() {
        assert!(
            Instant::now() < deadline,
            "deleted API pod left: {:?} {:?}",
            status.get("api-uid-1"),
            cd.pod_cgroups()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("stops")
        .expect("task")
        .expect("run_pods");
    cd.remove_all_pods().await;
    cd.teardown();
}

/// The paths the fake received.
fn paths(fake: &FakeApi) -> Vec<String> {
    fake.requests().into_iter().map(|r| r.path).collect()
}

/// Whether the fake holds an event of `reason` about the object named `name`.
fn event<'a>(events: &'a [Value], reason: &str, name: &str) -> Option<&'a Value> {
    events
        .iter()
        .find(|e| e["reason"] == reason && e["involvedObject"]["name"] == name)
}

/// Waits until the fake holds an event of `reason` about `name`, and returns it.
async fn wait_event(fake: &FakeApi, reason: &str, name: &str) -> Value {
    let mut found = None;
    wait_until(
        &format!("event {reason} about {name}"),
        Duration::from_secs(10),
        || {
            found = event(&fake.list(Kind::Event), reason, name).cloned();
            found.is_some()
        },
    )
    .await;
    found.unwrap_or_default()
}

/// The condition `kind` of an object's `status.conditions`.
fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn facts(name: &str) -> NodeFacts {
    NodeFacts {
        name: name.to_owned(),
        labels: BTreeMap::from([("example.com/role".to_owned(), "edge".to_owned())]),
        capacity: BTreeMap::from([
            ("cpu".to_owned(), "2".to_owned()),
            ("memory".to_owned(), "1Gi".to_owned()),
            ("pods".to_owned(), "110".to_owned()),
        ]),
        allocatable: BTreeMap::from([
            ("cpu".to_owned(), "2".to_owned()),
            ("memory".to_owned(), "924Mi".to_owned()),
            ("pods".to_owned(), "110".to_owned()),
        ]),
        host_ip: Some("127.0.0.1".to_owned()),
        kernel_version: "6.1.0".to_owned(),
        os_image: "Debian GNU/Linux 12 (bookworm)".to_owned(),
        container_runtime_version: "containerd://1.6.20".to_owned(),
        ..NodeFacts::default()
    }
}

/// Cluster mode alone (no pods run) as node `name` against `fake`, with kubelet's periods.
struct ClusterMode {
    status: StatusManager,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    /// Holds the kubeconfig.
    _dir: tempfile::TempDir,
}

impl ClusterMode {
    fn start(fake: &FakeApi, name: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let status = StatusManager::default();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(cluster::run(
            cluster::ClusterOptions {
                kubeconfig: fake.kubeconfig(dir.path()),
                node: facts(name),
                status_periods: cluster::node_status::Periods {
                    update: Duration::from_secs(10),
                    report: Duration::from_secs(300),
                },
                lease_duration_seconds: 40,
                qps: 50,
                burst: 100,
                event_qps: 50,
                event_burst: 100,
                link: None,
                state_dir: Some(dir.path().to_path_buf()),
            },
            status.clone(),
            Arc::new(Health::default()),
            cluster::EventQueue::new(),
            async {
                let _ = stop_rx.await;
            },
        ));
        Self {
            status,
            stop,
            task,
            _dir: dir,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("cluster mode stops")
            .expect("task");
    }
}

/// Registration, the lease, and a pressure condition pushed within 1 s; nothing rejected by
/// the strict fake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_registers_the_node_renews_its_lease_and_pushes_pressure() {
    let fake = FakeApi::start().await;
    let cluster = ClusterMode::start(&fake, "cluster-node-1");
    let status = cluster.status.clone();
    wait_until("the node and its lease", Duration::from_secs(20), || {
        fake.get(Kind::Node, "", "cluster-node-1").is_some()
            && fake
                .get(Kind::Lease, "kube-node-lease", "cluster-node-1")
                .is_some()
    })
    .await;
    let node = fake.get(Kind::Node, "", "cluster-node-1").expect("node");
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], "cluster-node-1");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert!(labels["kubernetes.io/arch"].is_string(), "{labels}");
    assert_eq!(labels["example.com/role"], "edge", "--node-labels");
    assert_eq!(node["status"]["capacity"]["memory"], "1Gi");
    assert_eq!(node["status"]["allocatable"]["memory"], "924Mi");
    let info = &node["status"]["nodeInfo"];
    assert_eq!(info["containerRuntimeVersion"], "containerd://1.6.20");
    assert_eq!(info["operatingSystem"], "linux");
    assert!(
        info["kubeletVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("v1.")),
        "{info}"
    );
    let memory = condition(&node, "MemoryPressure").expect("MemoryPressure");
    assert_eq!(memory["status"], "False");
    assert_eq!(memory["reason"], "KubeletHasSufficientMemory");
    assert_eq!(memory["message"], "kubelet has sufficient memory available");
    let ready = condition(&node, "Ready").expect("Ready");
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("True"), &json!("KubeletReady"))
    );
    let lease = fake
        .get(Kind::Lease, "kube-node-lease", "cluster-node-1")
        .expect("lease");
    assert_eq!(lease["spec"]["holderIdentity"], "cluster-node-1");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
    assert!(lease["spec"]["renewTime"].is_string(), "{lease}");
    // Owned by the Node (set at the first renewal that finds the Node, as kubelet's lease
    // controller does when the lease was created first).
    wait_until(
        "the lease owned by the Node",
        Duration::from_secs(15),
        || {
            fake.get(Kind::Lease, "kube-node-lease", "cluster-node-1")
                .is_some_and(|l| l["metadata"]["ownerReferences"][0]["kind"] == "Node")
        },
    )
    .await;

    // kubelet's node events.
    let starting = wait_event(&fake, "Starting", "cluster-node-1").await;
    assert_eq!(starting["message"], "Starting kubelet.");
    assert_eq!(starting["source"]["component"], "kubelet");
    let ready_event = wait_event(&fake, "NodeReady", "cluster-node-1").await;
    assert_eq!(
        ready_event["message"],
        "Node cluster-node-1 status is now: NodeReady"
    );

    // The eviction manager decides MemoryPressure: the API has it within 1 s.
    let decided = Instant::now();
    status.set_node(NodeRecord {
        conditions: vec![Condition::new("MemoryPressure", true)],
    });
    let seen = wait_until("MemoryPressure in the API", Duration::from_secs(5), || {
        fake.get(Kind::Node, "", "cluster-node-1")
            .and_then(|n| condition(&n, "MemoryPressure").map(|c| c["status"] == "True"))
            .unwrap_or(false)
    })
    .await;
    let delay = seen.into_std().saturating_duration_since(decided);
    assert!(delay < Duration::from_secs(1), "pushed after {delay:?}");
    let node = fake.get(Kind::Node, "", "cluster-node-1").expect("node");
    let memory = condition(&node, "MemoryPressure").expect("MemoryPressure");
    assert_eq!(memory["reason"], "KubeletHasInsufficientMemory");
    assert_eq!(
        memory["message"],
        "kubelet has insufficient memory available"
    );
    wait_event(&fake, "NodeHasInsufficientMemory", "cluster-node-1").await;
    // Every write was accepted by the strict fake.
    let refused: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.status >= 400 && !(r.status == 404 && r.method == "GET"))
        .map(|r| format!("{} {} -> {}", r.method, r.path, r.status))
        .collect();
    assert!(refused.is_empty(), "refused: {refused:?}");
    // A lease renewal meeting another writer: a 409, then a fresh read and a renewal.
    fake.interfere("/leases/cluster-node-1", 1);
    wait_until(
        "a renewal after a conflict",
        Duration::from_secs(30),
        || {
            let codes: Vec<u16> = fake
                .writes("/leases/cluster-node-1")
                .iter()
                .map(|r| r.status)
                .collect();
            codes
                .iter()
                .position(|c| *c == 409)
                .is_some_and(|i| codes[i + 1..].contains(&200))
        },
    )
    .await;
    cluster.stop().await;
}

/// kubelet's `PatchPodStatus` against an API server that misbehaves: another writer changes
/// the pod between the node's GET and its write (no conflict: the patch names only what the
/// node changes, with the uid as precondition), then the writes meet a 409, a 429 with
/// `Retry-After` (waited for, as client-go waits), a 500 and a connection closed with no
/// answer, each retried, and the status
/// lands once; the other writers' label and condition are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_status_survives_conflicts_throttling_errors_and_closed_connections() {
    let fake = FakeApi::start().await;
    let mut pod = node_pod("web", "uid-web", "n-conflict", json!({}), "sleep 1");
    pod["status"] = json!({"phase": "Pending", "conditions": [
        {"type": "example.com/gate", "status": "True"}
    ]});
    fake.put_pod(pod);
    let cluster = ClusterMode::start(&fake, "n-conflict");
    let status = cluster.status.clone();
    fake.interfere("/pods/web/status", 1);
    for fault in [
        Fault::Status(409),
        Fault::TooMany { retry_after: 2 },
        Fault::Status(500),
        Fault::Close,
    ] {
        fake.fail_writes("/pods/web/status", fault, 1);
    }
    status.set(enforcer::status_manager::PodRecord {
        uid: "uid-web".to_owned(),
        name: "web".to_owned(),
        namespace: "default".to_owned(),
        source: apiserver::API_SOURCE.to_owned(),
        phase: enforcer::status_manager::PodPhase::Running,
        reason: String::new(),
        message: String::new(),
        qos_class: "BestEffort".to_owned(),
        start_time: "2026-01-01T00:00:00Z".to_owned(),
        pod_ips: vec![],
        sandbox_id: String::new(),
        cgroup: String::new(),
        conditions: vec![Condition::new("Ready", true)],
        init_container_statuses: vec![],
        container_statuses: vec![],
        resources: Default::default(),
    });
    wait_until("the status delivered", Duration::from_secs(30), || {
        api_phase(&fake, "web").as_deref() == Some("Running")
    })
    .await;
    let writes = fake.writes("/pods/web/status");
    let codes: Vec<u16> = writes.iter().map(|r| r.status).collect();
    eprintln!("the status writes met: {codes:?} (0: the connection closed unanswered)");
    assert_eq!(
        codes,
        [409, 429, 500, 0, 200],
        "each fault retried, then one write"
    );
    // client-go's `checkWait`: the 429's `Retry-After: 2` is waited for (the writer's own
    // backoff after a second failure is 400 ms).
    let waited = writes[2].at.duration_since(writes[1].at);
    eprintln!("after the 429 with Retry-After: 2, the next write came {waited:?} later");
    assert!(
        waited >= Duration::from_secs(2),
        "Retry-After honoured: {waited:?}"
    );
    for w in &writes {
        assert_eq!(w.method, "PATCH");
        assert!(
            w.content_type
                .starts_with("application/strategic-merge-patch+json"),
            "{}",
            w.content_type
        );
        let body = w.body.as_ref().expect("a body");
        assert_eq!(
            body["metadata"]["uid"], "uid-web",
            "the uid precondition: {body}"
        );
    }
    let pod = fake.get(Kind::Pod, "default", "web").expect("pod");
    assert!(
        pod["metadata"]["labels"]["fake/interference"].is_string(),
        "the other writer's change is kept: {pod}"
    );
    assert!(
        condition(&pod, "example.com/gate").is_some_and(|c| c["status"] == "True"),
        "the other writer's condition is kept: {pod}"
    );
    assert_eq!(
        condition(&pod, "Ready").map(|c| c["status"].clone()),
        Some(json!("True"))
    );
    cluster.stop().await;
}

/// A busybox API pod for the daemon's node.
fn node_pod(name: &str, uid: &str, node: &str, extra: Value, script: &str) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "app",
                "image": "busybox:local",
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
            }],
        },
        "status": {"phase": "Pending"},
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        if k == "resources" {
            pod["spec"]["containers"][0]["resources"] = v;
        } else {
            pod["spec"][k] = v;
        }
    }
    pod
}

/// The start of a daemon test: the lock the daemon tests share, a fresh strict fake API, and
/// the daemon in cluster mode on a private containerd, named `node` (`hostnameOverride`),
/// registered; manifest pods run as static pods when `static_pods`.
async fn cluster_test(
    tag: &str,
    node: &str,
    args: ConfigArgs,
    static_pods: bool,
) -> (tokio::sync::MutexGuard<'static, ()>, FakeApi, Node) {
    let serial = SERIAL.lock().await;
    let fake = FakeApi::start().await;
    let cd = Containerd::start(tag);
    let kubeconfig = fake.kubeconfig(&cd.dir);
    let args = ConfigArgs {
        hostname_override: Some(node.to_owned()),
        node_capacity: vec!["memory=1Gi".to_owned()],
        eviction_hard: if args.eviction_hard.is_empty() {
            vec!["memory.available<100Mi".to_owned()]
        } else {
            args.eviction_hard.clone()
        },
        ..args
    };
    let n = Node::start_in_cluster(cd, args, None, Some(kubeconfig), static_pods);
    wait_until("the node registered", Duration::from_secs(30), || {
        fake.get(Kind::Node, "", node).is_some()
    })
    .await;
    (serial, fake, n)
}

/// Puts the API pod [`node_pod`] on `node` and waits until the API has it Running, its
/// container running.
async fn run_api_pod(
    fake: &FakeApi,
    node: &str,
    name: &str,
    uid: &str,
    extra: Value,
    script: &str,
) {
    fake.put_pod(node_pod(name, uid, node, extra, script));
    wait_until("Running in the API", Duration::from_secs(60), || {
        fake.get(Kind::Pod, "default", name).is_some_and(|p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        })
    })
    .await;
}

fn api_phase(fake: &FakeApi, name: &str) -> Option<String> {
    fake.get(Kind::Pod, "default", name)
        .and_then(|p| p["status"]["phase"].as_str().map(str::to_owned))
}

/// A running API pod's status in the API; its graceful deletion completes: the final status,
/// then the delete with grace 0 (the pod is gone from the API).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_status_is_written_back_and_graceful_deletion_completes() {
    let (_serial, fake, node) =
        cluster_test("cl-del", "cl-del-node", ConfigArgs::default(), false).await;
    run_api_pod(
        &fake,
        "cl-del-node",
        "web",
        "cl-uid-web",
        json!({"resources": {"requests": {"memory": "10Mi"}}}),
        "trap 'exit 0' TERM; sleep 3600 & wait",
    )
    .await;
    // The daemon's node: its real facts.
    let node_obj = fake.get(Kind::Node, "", "cl-del-node").expect("node");
    let info = &node_obj["status"]["nodeInfo"];
    assert!(
        info["containerRuntimeVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("containerd://1.")),
        "CRI Version: {info}"
    );
    for field in ["kernelVersion", "osImage", "bootID"] {
        assert!(
            info[field].as_str().is_some_and(|v| !v.is_empty()),
            "{field}: {info}"
        );
    }
    assert_eq!(
        node_obj["status"]["capacity"]["memory"], "1Gi",
        "nodeCapacity"
    );
    assert!(
        node_obj["status"]["allocatable"]["memory"].is_string(),
        "{node_obj}"
    );
    assert_eq!(
        node_obj["metadata"]["labels"]["kubernetes.io/hostname"],
        "cl-del-node"
    );
    let pod = fake.get(Kind::Pod, "default", "web").expect("pod");
    let st = &pod["status"];
    assert_eq!(st["qosClass"], "Burstable");
    assert!(st["hostIP"].is_string(), "{st}");
    assert_eq!(st["podIP"], st["hostIP"], "host network: {st}");
    assert!(st["startTime"].is_string(), "{st}");
    let c = &st["containerStatuses"][0];
    assert!(
        c["containerID"]
            .as_str()
            .is_some_and(|id| id.starts_with("containerd://")),
        "{c}"
    );
    assert_eq!(c["image"], "busybox:local");
    assert!(c["imageID"].as_str().is_some_and(|i| !i.is_empty()), "{c}");
    assert_eq!((&c["ready"], &c["started"]), (&json!(true), &json!(true)));
    // What kubelet reports of resources since in-place resize: the container's allocated
    // requests and what it runs with; the pod's own (KEP-5419, on by default in 1.36).
    assert_eq!(c["allocatedResources"], json!({"memory": "10Mi"}), "{c}");
    assert_eq!(
        c["resources"],
        json!({"requests": {"memory": "10Mi"}}),
        "{c}"
    );
    assert_eq!(st["allocatedResources"], json!({"memory": "10Mi"}), "{st}");
    assert_eq!(
        st["resources"]["requests"]["memory"], "10Mi",
        "the pod-level status resources: {st}"
    );
    for kind in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        let cond = condition(&pod, kind).unwrap_or_else(|| panic!("{kind} in {st}"));
        assert_eq!(cond["status"], "True", "{kind}: {st}");
        assert!(cond["lastTransitionTime"].is_string(), "{cond}");
    }
    // kubelet's container events.
    for (reason, message) in [
        (
            "Pulled",
            "Container image \"busybox:local\" already present on machine",
        ),
        ("Created", "Created container: app"),
        ("Started", "Started container app"),
    ] {
        let e = wait_event(&fake, reason, "web").await;
        assert_eq!(e["message"], message);
        assert_eq!(e["type"], "Normal");
        assert_eq!(e["involvedObject"]["fieldPath"], "spec.containers{app}");
        assert_eq!(e["involvedObject"]["uid"], "cl-uid-web");
    }
    // Only sent when changed: no more status writes while nothing changes.
    let writes = fake.writes("/pods/web/status").len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        fake.writes("/pods/web/status").len(),
        writes,
        "unchanged status resent"
    );

    // kubectl delete: graceful (2 s), then the node completes it.
    assert_eq!(fake.delete_pod("default", "web", None), 200);
    wait_until("the pod gone from the API", Duration::from_secs(60), || {
        fake.get(Kind::Pod, "default", "web").is_none()
    })
    .await;
    let writes = fake.writes("/pods/web");
    let delete = writes
        .iter()
        .rposition(|r| r.method == "DELETE")
        .expect("the node's delete");
    let d = &writes[delete];
    assert!(
        d.path.contains("gracePeriodSeconds=0")
            || d.body
                .as_ref()
                .is_some_and(|b| b["gracePeriodSeconds"] == 0),
        "grace 0: {d:?}"
    );
    assert_eq!(
        d.body.as_ref().map(|b| b["preconditions"]["uid"].clone()),
        Some(json!("cl-uid-web")),
        "uid precondition: {d:?}"
    );
    let killing = wait_event(&fake, "Killing", "web").await;
    assert_eq!(killing["message"], "Stopping container app");
    let last_status = writes[..delete]
        .iter()
        .rev()
        .find(|r| r.path.contains("/pods/web/status"))
        .and_then(|r| r.body.clone())
        .expect("a final status");
    assert_eq!(
        last_status["status"]["phase"], "Succeeded",
        "trap exit 0: {last_status}"
    );
    drop(node.shutdown().await);
}

/// An OOM-killed container: exit 137, `OOMKilled`, phase Failed, in the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oom_killed_container_shows_in_the_api() {
    let (_serial, fake, node) =
        cluster_test("cl-oom", "cl-oom-node", ConfigArgs::default(), false).await;
    fake.put_pod(node_pod(
        "oom",
        "cl-uid-oom",
        "cl-oom-node",
        json!({"restartPolicy": "Never",
               "resources": {"requests": {"memory": "15Mi"}, "limits": {"memory": "15Mi"}}}),
        "sleep 1 && dd if=/dev/zero of=/dev/null bs=20M",
    ));
    wait_until("Failed in the API", Duration::from_secs(60), || {
        api_phase(&fake, "oom").as_deref() == Some("Failed")
    })
    .await;
    let pod = fake.get(Kind::Pod, "default", "oom").expect("pod");
    let t = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["exitCode"], 137, "{pod}");
    assert_eq!(t["reason"], "OOMKilled", "{pod}");
    assert!(t["containerID"].is_string(), "{t}");
    let ready = condition(&pod, "Ready").expect("Ready");
    assert_eq!(ready["status"], "False");
    drop(node.shutdown().await);
}

/// A memory eviction: the node's MemoryPressure reaches the API within 1 s of the node
/// deciding it (the status file's time, itself up to 100 ms late), and the pod's status
/// (Failed, Evicted, kubelet's message, DisruptionTarget TerminationByKubelet, the container's
/// terminated state) once its containers stopped: within the 1 s grace period + 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_reaches_the_api_within_a_second() {
    // Allocatable memory 50Mi (1Gi - 724Mi reserved - 250Mi threshold): a 240Mi hog trips it.
    let args = ConfigArgs {
        kube_reserved: vec!["memory=724Mi".to_owned()],
        eviction_hard: vec!["memory.available<250Mi".to_owned()],
        eviction_pressure_transition_period: Some("5s".to_owned()),
        enforce_node_allocatable: Some("pods".to_owned()),
        ..ConfigArgs::default()
    };
    let (_serial, fake, node) = cluster_test("cl-evict", "cl-evict-node", args, false).await;
    fake.put_pod(node_pod(
        "hog",
        "cl-uid-hog",
        "cl-evict-node",
        json!({"terminationGracePeriodSeconds": 1}),
        "(i=0; while [ $i -lt 20 ]; do head -c 12582912 /dev/zero; i=$((i+1)); sleep 0.5; done; sleep 3600) | tail -c 240m >/dev/null; sleep 3600",
    ));
    let state = node.state.clone();
    let mut local_pressure = None;
    let mut api_pressure = None;
    let mut api_evicted = None;
    let deadline = Instant::now() + enforcer_tests::scaled(Duration::from_secs(120));
    while api_evicted.is_none() || local_pressure.is_none() || api_pressure.is_none() {
        assert!(
            Instant::now() < deadline,
            "no eviction in the API: local {local_pressure:?}, API {api_pressure:?} {api_evicted:?}; pod {:?}",
            fake.get(Kind::Pod, "default", "hog")
        );
        let now = Instant::now();
        let file = status_file(&state);
        if local_pressure.is_none() && file.node.true_conditions().contains(&"MemoryPressure") {
            local_pressure = Some(now);
        }
        if api_pressure.is_none()
            && fake
                .get(Kind::Node, "", "cl-evict-node")
                .and_then(|n| condition(&n, "MemoryPressure").map(|c| c["status"] == "True"))
                .unwrap_or(false)
        {
            api_pressure = Some(now);
        }
        if api_evicted.is_none()
            && fake
                .get(Kind::Pod, "default", "hog")
                .is_some_and(|p| p["status"]["reason"] == "Evicted")
        {
            api_evicted = Some(now);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lag = |api: Option<Instant>, local: Option<Instant>| {
        api.zip(local)
            .map(|(a, l)| a.saturating_duration_since(l))
            .unwrap_or_default()
    };
    let condition_lag = lag(api_pressure, local_pressure);
    let pod_lag = lag(api_evicted, local_pressure);
    eprintln!(
        "MemoryPressure in the API {condition_lag:?} after the node; evicted status {pod_lag:?} after"
    );
    assert!(
        condition_lag < Duration::from_secs(1),
        "MemoryPressure after {condition_lag:?}"
    );
    // The pod's status is posted once its containers stopped (kubelet's rule): the hard
    // eviction's 1 s grace period, then at most 1 s to the API.
    assert!(
        pod_lag < Duration::from_secs(2),
        "evicted status {pod_lag:?} after the node's MemoryPressure"
    );
    let pod = fake.get(Kind::Pod, "default", "hog").expect("pod");
    let st = &pod["status"];
    assert_eq!(st["phase"], "Failed", "{st}");
    assert!(
        st["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("The node was low on resource: memory. ")),
        "{st}"
    );
    let dt = condition(&pod, "DisruptionTarget").expect("DisruptionTarget");
    assert_eq!(dt["status"], "True");
    assert_eq!(dt["reason"], "TerminationByKubelet");
    assert!(
        st["containerStatuses"][0]["state"]["terminated"].is_object(),
        "terminated state kept: {st}"
    );
    let node_obj = fake.get(Kind::Node, "", "cl-evict-node").expect("node");
    let memory = condition(&node_obj, "MemoryPressure").expect("MemoryPressure");
    assert_eq!(memory["reason"], "KubeletHasInsufficientMemory");
    // kubelet's eviction events.
    let evicted = wait_event(&fake, "Evicted", "hog").await;
    assert_eq!(evicted["type"], "Warning");
    assert_eq!(evicted["message"], st["message"]);
    let annotations = &evicted["metadata"]["annotations"];
    assert_eq!(annotations["starved_resource"], "memory", "{evicted}");
    assert_eq!(annotations["offending_containers"], "app", "{evicted}");
    assert!(
        annotations["offending_containers_usage"].is_string(),
        "{evicted}"
    );
    let met = wait_event(&fake, "EvictionThresholdMet", "cl-evict-node").await;
    assert_eq!(met["type"], "Warning");
    assert_eq!(met["message"], "Attempting to reclaim memory");
    // What the fake holds (docs/cluster-mode.md, "As the API server holds them after an
    // eviction"; `--nocapture` shows it).
    for (what, obj) in [("Node", &node_obj), ("Pod", &pod), ("Event", &evicted)] {
        eprintln!(
            "--- {what} as the fake API server holds it:\n{}",
            serde_json::to_string_pretty(obj).unwrap_or_default()
        );
    }
    drop(node.shutdown().await);
}

/// The daemon stopped while its eviction's status could not reach the API server (gone):
/// the `Failed` / `Evicted` status waits in the state directory's outbox (kubelet's checkpoint
/// form), and the next run sends it first, once the server answers, without running the pod
/// again; then the outbox is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_status_survives_a_restart_of_the_daemon() {
    let args = ConfigArgs {
        kube_reserved: vec!["memory=724Mi".to_owned()],
        eviction_hard: vec!["memory.available<250Mi".to_owned()],
        enforce_node_allocatable: Some("pods".to_owned()),
        ..ConfigArgs::default()
    };
    let (_serial, fake, mut node) =
        cluster_test("cl-restart", "cl-restart-node", args, false).await;
    run_api_pod(
        &fake,
        "cl-restart-node",
        "hog",
        "cl-uid-rhog",
        json!({"terminationGracePeriodSeconds": 1}),
        "sleep 2; (i=0; while [ $i -lt 20 ]; do head -c 12582912 /dev/zero; i=$((i+1)); sleep 0.5; done; sleep 3600) | tail -c 240m >/dev/null; sleep 3600",
    )
    .await;
    fake.stop().await;
    let state = node.state.clone();
    wait_until(
        "the hog evicted on the node",
        Duration::from_secs(90),
        || {
            status_file(&state)
                .pods
                .iter()
                .any(|p| p.name == "hog" && p.reason == "Evicted")
        },
    )
    .await;
    node.stop_daemon().await;
    let outbox = std::fs::read_to_string(state.join(enforcer::status_manager::outbox::OUTBOX_FILE))
        .expect("the outbox");
    let pending = enforcer::status_manager::outbox::decode::<
        enforcer::status_manager::outbox::Pending,
    >(Path::new("outbox"), &outbox)
    .expect("decodes");
    eprintln!("the outbox as the daemon stopped: {pending:?}");
    assert!(
        pending
            .iter()
            .any(|p| p.record.uid == "cl-uid-rhog" && p.record.reason == "Evicted"),
        "{pending:?}"
    );
    assert_ne!(api_reason(&fake, "hog").as_deref(), Some("Evicted"));
    fake.restart().await;
    node.restart().await;
    // The evicted pod is not run again: its source lists it (still Running in the API) before
    // the replayed status lands, and the new run keeps it evicted.
    let mut ran_again = false;
    wait_until(
        "the eviction's status delivered after the restart",
        Duration::from_secs(60),
        || {
            ran_again |= node
                .cd
                .pod_cgroups()
                .iter()
                .any(|p| p.to_string_lossy().contains("cl-uid-rhog"));
            api_reason(&fake, "hog").as_deref() == Some("Evicted")
        },
    )
    .await;
    assert!(
        !ran_again,
        "the evicted pod was started again after the restart"
    );
    let pod = fake.get(Kind::Pod, "default", "hog").expect("pod");
    assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
    let dt = condition(&pod, "DisruptionTarget").expect("DisruptionTarget");
    assert_eq!(dt["reason"], "TerminationByKubelet");
    wait_until("the outbox emptied", Duration::from_secs(30), || {
        std::fs::read_to_string(state.join(enforcer::status_manager::outbox::OUTBOX_FILE))
            .ok()
            .and_then(|t| {
                enforcer::status_manager::outbox::decode::<enforcer::status_manager::outbox::Pending>(
                    Path::new("outbox"),
                    &t,
                )
                .ok()
            })
            .is_some_and(|p| p.iter().all(|p| p.record.uid != "cl-uid-rhog"))
    })
    .await;
    drop(node.shutdown().await);
}

fn api_reason(fake: &FakeApi, name: &str) -> Option<String> {
    fake.get(Kind::Pod, "default", name)
        .and_then(|p| p["status"]["reason"].as_str().map(str::to_owned))
}

/// An eviction storm while the API server is unreachable: 20 pods grow until the node has
/// evicted every one, the server gone for 60 s from before the first eviction. Once it is
/// back, every pod has its `Failed` / `Evicted` status and exactly one `Evicted` event, and no
/// pod is left on the node: nothing lost, duplicated or orphaned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_storm_during_an_api_outage_loses_nothing() {
    const PODS: usize = 20;
    // Allocatable memory 150Mi (1Gi - 624Mi reserved - 250Mi threshold): once told to (a file
    // in a hostPath the test writes), each pod grows by 2 MiB a second to 160 MiB, so the node
    // keeps evicting until none is left. The start is the test's, not a timer's: 20 pods may
    // take long to start on a loaded machine, and the first must not grow before the last runs.
    // Starting them costs memory too (20 `runc init` at once: 37 MiB at the peak on a quiet
    // machine, more on a loaded one), hence the allocatable memory well above it.
    let args = ConfigArgs {
        kube_reserved: vec!["memory=624Mi".to_owned()],
        eviction_hard: vec!["memory.available<250Mi".to_owned()],
        enforce_node_allocatable: Some("pods".to_owned()),
        allow_host_paths: Some(true),
        ..ConfigArgs::default()
    };
    let (_serial, fake, node) = cluster_test("cl-storm", "cl-storm-node", args, false).await;
    let go = node.cd.dir.join("go");
    std::fs::create_dir_all(&go).expect("the start directory");
    let name = |i: usize| format!("storm-{i}");
    let script = "(until [ -e /go/start ]; do sleep 1; done; i=0; while [ $i -lt 80 ]; do head -c 2097152 /dev/zero; i=$((i+1)); sleep 1; done; sleep 3600) | tail -c 160m >/dev/null; sleep 3600";
    for i in 0..PODS {
        let mut pod = node_pod(
            &name(i),
            &format!("cl-uid-storm-{i}"),
            "cl-storm-node",
            json!({
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "go", "hostPath": {"path": go.display().to_string(), "type": "Directory"}}],
            }),
            script,
        );
        pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "go", "mountPath": "/go"}]);
        fake.put_pod(pod);
    }
    wait_until(
        "every pod Running in the API",
        Duration::from_secs(120),
        || {
            let phases: Vec<_> = (0..PODS).map(|i| api_phase(&fake, &name(i))).collect();
            assert!(
                !phases.iter().any(|p| p.as_deref() == Some("Failed")),
                "a pod failed before the storm began: {phases:?}"
            );
            phases.iter().all(|p| p.as_deref() == Some("Running"))
        },
    )
    .await;
    fake.stop().await;
    let down = Instant::now();
    std::fs::write(go.join("start"), "").expect("the start file");
    let state = node.state.clone();
    let evicted_on_node = || {
        status_file(&state)
            .pods
            .iter()
            .filter(|p| p.name.starts_with("storm-") && p.reason == "Evicted")
            .count()
    };
    assert_eq!(
        evicted_on_node(),
        0,
        "the outage began before the first eviction"
    );
    wait_until(
        "every pod evicted on the node",
        Duration::from_secs(180),
        || evicted_on_node() == PODS,
    )
    .await;
    let storm = down.elapsed();
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(storm)).await;
    let outage = down.elapsed();
    fake.restart().await;
    let back = Instant::now();
    wait_until(
        "every pod Failed / Evicted in the API",
        Duration::from_secs(60),
        || (0..PODS).all(|i| api_reason(&fake, &name(i)).as_deref() == Some("Evicted")),
    )
    .await;
    let statuses_in = back.elapsed();
    let evicted_events = |i: usize| {
        fake.list(Kind::Event)
            .into_iter()
            .filter(|e| e["reason"] == "Evicted" && e["involvedObject"]["name"] == name(i))
            .collect::<Vec<_>>()
    };
    wait_until(
        "an Evicted event for every pod",
        Duration::from_secs(60),
        || (0..PODS).all(|i| !evicted_events(i).is_empty()),
    )
    .await;
    let events_in = back.elapsed();
    for i in 0..PODS {
        let events = evicted_events(i);
        assert_eq!(
            events.len(),
            1,
            "one Evicted event for {}: {events:?}",
            name(i)
        );
        assert_eq!(events[0]["count"], 1, "{}", events[0]);
        let pod = fake.get(Kind::Pod, "default", &name(i)).expect("pod");
        assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
        assert!(condition(&pod, "DisruptionTarget").is_some(), "{pod}");
    }
    wait_until("no pod left on the node", Duration::from_secs(60), || {
        node.cd.pod_cgroups().is_empty()
    })
    .await;
    eprintln!(
        "{PODS} pods evicted in {storm:?} with the API server gone ({outage:?} in all); once back, every status in {statuses_in:?}, every Evicted event in {events_in:?}"
    );
    drop(node.shutdown().await);
}

/// The daemon SIGKILLed in the middle of an eviction, between its decision and the API
/// server taking its status and event (the server drops every such write unanswered), then
/// started again on the same state directory: the pod's `Failed` / `Evicted` status with
/// `DisruptionTarget` and exactly one `Evicted` event reach the API server, the pod is not run
/// again, the other pod keeps running once (no second sandbox), nothing else is evicted, and
/// the kill record is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_eviction_loses_nothing_once_restarted() {
    let _serial = SERIAL.lock().await;
    enforcer_tests::require_root();
    let fake = FakeApi::start().await;
    let cd = Containerd::start("cl-kill");
    let kubeconfig = fake.kubeconfig(&cd.dir);
    let go = cd.dir.join("go");
    let manifests = cd.dir.join("manifests");
    let state = cd.dir.join("enforcer-state");
    for d in [&go, &manifests] {
        std::fs::create_dir_all(d).expect("dir");
    }
    // Allocatable memory 50Mi (1Gi - 724Mi reserved - 250Mi threshold); the hog grows to
    // 80 MiB once the test says so.
    let args = vec![
        "run".to_owned(),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--hostname-override=cl-kill-node".to_owned(),
        "--node-capacity=memory=1Gi".to_owned(),
        "--kube-reserved=memory=724Mi".to_owned(),
        "--eviction-hard=memory.available<250Mi".to_owned(),
        "--enforce-node-allocatable=pods".to_owned(),
        "--image-gc-high-threshold=100".to_owned(),
        "--image-gc-low-threshold=99".to_owned(),
        "--allow-host-namespaces".to_owned(),
        "--allow-host-paths".to_owned(),
        "--port=0".to_owned(),
        "--http-address=127.0.0.1:0".to_owned(),
        format!("--cri-socket={}", cd.socket.display()),
        format!("--cgroup-root={}", cd.cgroup_root),
        format!("--cgroup-driver={}", cd.driver.as_str()),
        format!("--manifest-dir={}", manifests.display()),
        format!("--state-dir={}", state.display()),
    ];
    let log = cd.dir.join("enforcer.log");
    let mut daemon = DaemonProcess::spawn(&args, &log);
    wait_until("the node registered", Duration::from_secs(60), || {
        fake.get(Kind::Node, "", "cl-kill-node").is_some()
    })
    .await;
    let hostpath = json!([{"name": "go", "hostPath": {"path": go.display().to_string(), "type": "Directory"}}]);
    let mut hog = node_pod(
        "hog",
        "cl-uid-khog",
        "cl-kill-node",
        json!({"terminationGracePeriodSeconds": 1, "volumes": hostpath}),
        "(until [ -e /go/start ]; do sleep 1; done; head -c 83886080 /dev/zero; sleep 3600) | tail -c 80m >/dev/null; sleep 3600",
    );
    hog["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "go", "mountPath": "/go"}]);
    fake.put_pod(hog);
    fake.put_pod(node_pod(
        "calm",
        "cl-uid-kcalm",
        "cl-kill-node",
        json!({}),
        "sleep 3600",
    ));
    wait_until(
        "both pods Running in the API",
        Duration::from_secs(60),
        || {
            ["hog", "calm"]
                .iter()
                .all(|n| api_phase(&fake, n).as_deref() == Some("Running"))
        },
    )
    .await;
    // From now on the server drops the hog's status writes and its Evicted event unanswered.
    fake.fail_writes("/pods/hog/status", Fault::Close, 10_000);
    fake.fail_writes_with("/events", r#""reason":"Evicted""#, Fault::Close, 10_000);
    std::fs::write(go.join("start"), "").expect("the start file");
    let tried = |fragment: &str, what: &dyn Fn(&Value) -> bool| {
        fake.requests().iter().any(|r| {
            r.path.contains(fragment) && r.status == 0 && r.body.as_ref().is_some_and(what)
        })
    };
    let dropped = || {
        tried("/pods/hog/status", &|b| b["status"]["reason"] == "Evicted")
            && tried("/events", &|b| {
                b["reason"] == "Evicted" && b["involvedObject"]["name"] == "hog"
            })
    };
    let deadline = Instant::now() + enforcer_tests::scaled(Duration::from_secs(90));
    while !dropped() {
        if Instant::now() > deadline {
            let sent: Vec<String> = fake
                .requests()
                .iter()
                .filter(|r| r.method != "GET")
                .map(|r| format!("{} {} {} {:?}", r.method, r.path, r.status, r.body))
                .collect();
            panic!("the Evicted status and event were not sent: {sent:#?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    daemon.kill();
    let killed_at = Instant::now();
    assert_eq!(
        api_phase(&fake, "hog").as_deref(),
        Some("Running"),
        "nothing of the eviction reached the API before the kill"
    );
    let calm_sandboxes = || {
        let cri = CriRuntime::new(cd.socket.clone(), Duration::from_secs(10));
        let calm = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                use enforcer::cri::ContainerRuntime as _;
                cri.list_pod_sandboxes(k8s_cri::v1::PodSandboxFilter::default())
                    .await
                    .unwrap_or_default()
            })
        });
        calm.iter()
            .filter(|s| s.metadata.as_ref().is_some_and(|m| m.uid == "cl-uid-kcalm"))
            .count()
    };
    assert_eq!(calm_sandboxes(), 1);
    fake.clear_faults();
    let mut daemon = DaemonProcess::spawn(&args, &log);
    wait_until(
        "the hog Failed / Evicted in the API",
        Duration::from_secs(60),
        || api_reason(&fake, "hog").as_deref() == Some("Evicted"),
    )
    .await;
    let status_in = killed_at.elapsed();
    let evicted_events = |name: &str| {
        fake.list(Kind::Event)
            .into_iter()
            .filter(|e| e["reason"] == "Evicted" && e["involvedObject"]["name"] == name)
            .collect::<Vec<_>>()
    };
    wait_until("the Evicted event", Duration::from_secs(60), || {
        !evicted_events("hog").is_empty()
    })
    .await;
    let event_in = killed_at.elapsed();
    wait_until(
        "the hog gone from the node",
        Duration::from_secs(60),
        || !cd.pod_cgroup_uids().iter().any(|u| u == "cl-uid-khog"),
    )
    .await;
    // A few resyncs of the new run: nothing more happens.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let events = evicted_events("hog");
    assert_eq!(events.len(), 1, "one Evicted event: {events:?}");
    assert_eq!(events[0]["count"], 1, "{}", events[0]);
    assert!(evicted_events("calm").is_empty(), "only the hog evicted");
    let pod = fake.get(Kind::Pod, "default", "hog").expect("pod");
    assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
    assert!(condition(&pod, "DisruptionTarget").is_some(), "{pod}");
    let after_restart: Vec<Value> = fake
        .writes("/pods/hog/status")
        .into_iter()
        .filter(|w| w.status == 200 && w.at > killed_at)
        .filter_map(|w| w.body)
        .collect();
    assert!(
        after_restart
            .iter()
            .all(|b| b["status"]["phase"].as_str().is_none_or(|p| p == "Failed")),
        "the hog never reported running again: {after_restart:?}"
    );
    assert_eq!(api_phase(&fake, "calm").as_deref(), Some("Running"));
    assert_eq!(
        calm_sandboxes(),
        1,
        "the other pod adopted, not started twice"
    );
    let (records, _) = enforcer::kills::read(&state).expect("kill records");
    let hog_record = records
        .iter()
        .find(|r| r.uid == "cl-uid-khog")
        .expect("the hog's kill record");
    assert!(
        !hog_record.release.is_empty(),
        "the kill record closed: {hog_record:?}"
    );
    eprintln!(
        "SIGKILLed after the eviction's status and event were dropped; restarted: the status in the API {status_in:?} after the kill, the event {event_in:?}; the kill record: {}",
        hog_record.release
    );
    let stopped = daemon.terminate(Duration::from_secs(60)).await;
    assert!(stopped.success(), "{stopped}");
    cd.remove_all_pods().await;
}

/// containerd restarted while pods start and stop in cluster mode: with containerd gone, one
/// pod is deleted (graceful) and another is created in the API; once containerd is back the
/// running pod is the same container (not restarted, one sandbox), the new one runs once, the
/// deleted one is stopped, its final status written and its API object removed, and no pod is
/// left on the node that should not be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_restarted_while_pods_start_and_stop_loses_nothing() {
    let (_serial, fake, mut node) =
        cluster_test("cl-crestart", "cl-cr-node", ConfigArgs::default(), false).await;
    for (name, uid) in [("steady", "cl-uid-steady"), ("leaving", "cl-uid-leaving")] {
        fake.put_pod(node_pod(name, uid, "cl-cr-node", json!({}), "sleep 3600"));
    }
    wait_until(
        "both pods Running in the API",
        Duration::from_secs(60),
        || {
            ["steady", "leaving"]
                .iter()
                .all(|n| api_phase(&fake, n).as_deref() == Some("Running"))
        },
    )
    .await;
    let container_of = |name: &str| {
        fake.get(Kind::Pod, "default", name).and_then(|p| {
            p["status"]["containerStatuses"][0]["containerID"]
                .as_str()
                .map(str::to_owned)
        })
    };
    let steady_container = container_of("steady").expect("steady's container");
    node.cd.stop();
    let down = Instant::now();
    assert_eq!(fake.delete_pod("default", "leaving", Some(2)), 200);
    fake.put_pod(node_pod(
        "arriving",
        "cl-uid-arriving",
        "cl-cr-node",
        json!({}),
        "sleep 3600",
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    node.cd.launch();
    let back = Instant::now();
    wait_until(
        "the new pod Running and the deleted one gone from the API",
        Duration::from_secs(90),
        || {
            api_phase(&fake, "arriving").as_deref() == Some("Running")
                && fake.get(Kind::Pod, "default", "leaving").is_none()
        },
    )
    .await;
    let settled = back.elapsed();
    wait_until(
        "the deleted pod gone from the node",
        Duration::from_secs(30),
        || {
            !node
                .cd
                .pod_cgroup_uids()
                .iter()
                .any(|u| u == "cl-uid-leaving")
        },
    )
    .await;
    assert_eq!(api_phase(&fake, "steady").as_deref(), Some("Running"));
    assert_eq!(
        container_of("steady").as_deref(),
        Some(steady_container.as_str()),
        "the running pod survived containerd's restart, not restarted"
    );
    let steady = fake.get(Kind::Pod, "default", "steady").expect("steady");
    assert_eq!(steady["status"]["containerStatuses"][0]["restartCount"], 0);
    let cri = CriRuntime::new(node.cd.socket.clone(), Duration::from_secs(10));
    let sandboxes = {
        use enforcer::cri::ContainerRuntime as _;
        cri.list_pod_sandboxes(k8s_cri::v1::PodSandboxFilter::default())
            .await
            .expect("sandboxes")
    };
    let of = |uid: &str| {
        sandboxes
            .iter()
            .filter(|s| s.metadata.as_ref().is_some_and(|m| m.uid == uid))
            .count()
    };
    assert_eq!(
        (
            of("cl-uid-steady"),
            of("cl-uid-arriving"),
            of("cl-uid-leaving")
        ),
        (1, 1, 0),
        "one sandbox per running pod, none for the deleted one"
    );
    let started = |name: &str| {
        fake.list(Kind::Event)
            .into_iter()
            .filter(|e| e["reason"] == "Started" && e["involvedObject"]["name"] == name)
            .map(|e| e["count"].as_i64().unwrap_or(1))
            .sum::<i64>()
    };
    wait_until(
        "the new pod's Started event",
        Duration::from_secs(30),
        || started("arriving") == 1,
    )
    .await;
    assert_eq!(started("steady"), 1, "the running pod was started once");
    eprintln!(
        "containerd down {:?}; once back, the new pod running and the deleted one removed in {settled:?}",
        back.duration_since(down)
    );
    drop(node.shutdown().await);
}

/// The state directory full, then freed: the daemon keeps running, the pod's final status
/// reaches the API server (nothing of it waits on the disk), and the status file is current
/// once there is room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_state_directory_loses_no_status() {
    let serial = SERIAL.lock().await;
    let fake = FakeApi::start().await;
    let cd = Containerd::start("cl-full");
    let kubeconfig = fake.kubeconfig(&cd.dir);
    // Not `state`: that is containerd's own.
    let state = cd.dir.join("enforcer-state");
    let tmpfs = Tmpfs::mount(&state, "size=4m");
    let args = ConfigArgs {
        hostname_override: Some("cl-full-node".to_owned()),
        node_capacity: vec!["memory=1Gi".to_owned()],
        eviction_hard: vec!["memory.available<100Mi".to_owned()],
        ..ConfigArgs::default()
    };
    let node = Node::start_in_cluster(cd, args, Some(state.clone()), Some(kubeconfig), false);
    run_api_pod(
        &fake,
        "cl-full-node",
        "job",
        "cl-uid-full",
        json!({"restartPolicy": "Never"}),
        "sleep 5; exit 3",
    )
    .await;
    let running_on_disk = || {
        status_file(&state)
            .pods
            .iter()
            .any(|p| p.name == "job" && p.phase == "Running")
    };
    wait_until(
        "Running in the status file",
        Duration::from_secs(10),
        running_on_disk,
    )
    .await;
    // Fill what is left of the state directory's filesystem.
    let filler = state.join("filler");
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&filler).expect("filler");
        for size in [64 << 10, 4 << 10, 1] {
            let block = vec![0u8; size];
            while f.write_all(&block).is_ok() {}
        }
        let _ = f.sync_all();
    }
    wait_until("Failed in the API", Duration::from_secs(60), || {
        api_phase(&fake, "job").as_deref() == Some("Failed")
    })
    .await;
    // (The file may have been written meanwhile: the pod's own logs in the state directory
    // are removed as it ends, which frees some room.)
    eprintln!(
        "the state directory full: Failed in the API; the status file still Running: {}",
        running_on_disk()
    );
    std::fs::remove_file(&filler).expect("free the disk");
    // Room again: the file is written with the node's state (the pod ended, and forgotten
    // once the API has it terminal).
    wait_until(
        "the status file written again",
        Duration::from_secs(30),
        || !running_on_disk(),
    )
    .await;
    let pod = fake.get(Kind::Pod, "default", "job").expect("pod");
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 3,
        "{pod}"
    );
    let cd = node.shutdown().await;
    drop(tmpfs);
    drop(cd);
    drop(serial);
}

/// The API server gone for 30 s: the node carries on, the pod's final status is kept and
/// delivered when the server answers again, and the lease is renewed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_final_status_is_lost_while_the_api_server_is_gone() {
    let (_serial, fake, node) =
        cluster_test("cl-gone", "cl-gone-node", ConfigArgs::default(), false).await;
    run_api_pod(
        &fake,
        "cl-gone-node",
        "job",
        "cl-uid-job",
        json!({"restartPolicy": "Never"}),
        "sleep 4; exit 3",
    )
    .await;
    fake.stop().await;
    let gone = Instant::now();
    // The node does not wait: the pod ends and its status is kept locally.
    let state = node.state.clone();
    wait_until(
        "the pod Failed on the node",
        Duration::from_secs(30),
        || {
            status_file(&state)
                .pods
                .iter()
                .any(|p| p.name == "job" && p.phase == "Failed")
        },
    )
    .await;
    let away = Duration::from_secs(30).saturating_sub(gone.elapsed());
    tokio::time::sleep(away).await;
    assert_eq!(
        api_phase(&fake, "job").as_deref(),
        Some("Running"),
        "nothing got through"
    );
    let renewals_before = fake.writes("/leases/cl-gone-node").len();
    fake.restart().await;
    wait_until(
        "the final status delivered",
        Duration::from_secs(30),
        || api_phase(&fake, "job").as_deref() == Some("Failed"),
    )
    .await;
    let pod = fake.get(Kind::Pod, "default", "job").expect("pod");
    let t = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["exitCode"], 3, "{pod}");
    wait_until("the lease renewed again", Duration::from_secs(20), || {
        fake.writes("/leases/cl-gone-node").len() > renewals_before
    })
    .await;
    // The pod watch resumes too: a pod created after the outage runs and reports.
    fake.put_pod(node_pod(
        "after",
        "cl-uid-after",
        "cl-gone-node",
        json!({}),
        "trap 'exit 0' TERM; sleep 3600 & wait",
    ));
    wait_until(
        "the new pod Running in the API",
        Duration::from_secs(90),
        || api_phase(&fake, "after").as_deref() == Some("Running"),
    )
    .await;
    drop(node.shutdown().await);
}

/// A static pod (manifest directory, `--static-pods`) gets a mirror pod in the API (the
/// `kubernetes.io/config.mirror` annotation, the Node as controller), its status written
/// there; the API source does not run the mirror; removing the manifest deletes the mirror.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_pods_get_mirror_pods() {
    let (_serial, fake, node) =
        cluster_test("cl-mirror", "cl-mirror-node", ConfigArgs::default(), true).await;
    node.submit(
        "static.yaml",
        &enforcer_tests::node::pod(
            "static-web",
            "cl-static-uid-1",
            "",
            "",
            "trap 'exit 0' TERM; sleep 3600 & wait",
        ),
    );
    let mirror_name = "static-web-cl-mirror-node";
    wait_until("the mirror pod Running", Duration::from_secs(60), || {
        api_phase(&fake, mirror_name).as_deref() == Some("Running")
    })
    .await;
    let mirror = fake
        .get(Kind::Pod, "default", mirror_name)
        .expect("mirror pod");
    let annotations = &mirror["metadata"]["annotations"];
    assert!(
        annotations["kubernetes.io/config.mirror"].is_string(),
        "{mirror}"
    );
    let owner = &mirror["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Node");
    assert_eq!(owner["name"], "cl-mirror-node");
    assert_eq!(owner["controller"], true);
    assert_eq!(mirror["spec"]["nodeName"], "cl-mirror-node");
    // Only one pod runs: the API source leaves the mirror alone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let running: Vec<_> = status_file(&node.state)
        .pods
        .into_iter()
        .map(|p| (p.name, p.source))
        .collect();
    assert_eq!(running.len(), 1, "{running:?}");
    node.delete("static.yaml");
    wait_until("the mirror pod deleted", Duration::from_secs(60), || {
        fake.get(Kind::Pod, "default", mirror_name).is_none()
    })
    .await;
    drop(node.shutdown().await);
}

/// A slow API server (every answer 3 s late): the node does not wait on it. A pod's container
/// ends and the node's own status shows it sooner than one API answer could come (its 1 s
/// relist, the worker's sync and the status file write: 1-2 s here); the API gets it later,
/// the newest status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_api_server_delays_nothing_on_the_node() {
    let (_serial, fake, node) =
        cluster_test("cl-slow", "cl-slow-node", ConfigArgs::default(), false).await;
    run_api_pod(
        &fake,
        "cl-slow-node",
        "slowjob",
        "cl-uid-slowjob",
        json!({"restartPolicy": "Never"}),
        "sleep 3; exit 4",
    )
    .await;
    let api_delay = Duration::from_secs(3);
    fake.set_delay(api_delay);
    let state = node.state.clone();
    // When the node's status file first shows Failed (wall clock), and that record.
    let mut failed = None;
    wait_until("Failed on the node", Duration::from_secs(30), || {
        failed = status_file(&state)
            .pods
            .into_iter()
            .find(|p| p.name == "slowjob" && p.phase == "Failed")
            .map(|p| (k8s_openapi::jiff::Timestamp::now(), p));
        failed.is_some()
    })
    .await;
    let (seen, record) = failed.expect("the Failed record");
    let finished = match &record.container_statuses[0].state {
        ContainerState::Terminated { finished_at, .. } => finished_at
            .parse::<k8s_openapi::jiff::Timestamp>()
            .unwrap_or_else(|e| panic!("finishedAt {finished_at:?}: {e}")),
        other => panic!("not terminated: {other:?}"),
    };
    let lag = Duration::from_millis(
        u64::try_from(seen.as_millisecond() - finished.as_millisecond()).unwrap_or(0),
    );
    eprintln!("slow API: the node showed Failed {lag:?} after the container finished");
    assert!(
        lag < api_delay,
        "the node's status came {lag:?} after the container finished: it waited on the API"
    );
    wait_until("Failed in the API", Duration::from_secs(60), || {
        api_phase(&fake, "slowjob").as_deref() == Some("Failed")
    })
    .await;
    let pod = fake.get(Kind::Pod, "default", "slowjob").expect("pod");
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 4,
        "{pod}"
    );
    fake.set_delay(Duration::ZERO);
    drop(node.shutdown().await);
}

/// The last line of the container's log holding `prefix`, without the CRI log prefix.
fn last_log_line(node: &Node, uid: &str, prefix: &str) -> Option<String> {
    let log = std::fs::read_to_string(node.state.join("pods").join(uid).join("app/0.log"))
        .unwrap_or_default();
    log.lines()
        .rev()
        .filter_map(|l| l.split_once(" F ").map(|(_, t)| t.to_owned()))
        .find(|t| t.starts_with(prefix))
}

/// kubelet's `imagePullSecrets` in cluster mode: the Secret (`kubernetes.io/dockerconfigjson`)
/// read from the API server authenticates the pull at a real registry with basic auth; a
/// secret that does not exist is kubelet's `FailedToRetrieveImagePullSecret` warning on the
/// pod, and the pull goes on with the others; the pull's events reach the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_pull_secrets_come_from_the_api_server() {
    use enforcer_tests::registry::{self, AUTH_PASSWORD, AUTH_USER, OciImage, Registries};
    let (_serial, fake, node) =
        cluster_test("cl-pull", "cl-pull-node", ConfigArgs::default(), false).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let regs = Registries::start(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    regs.write_hosts(&node.cd.certs_dir())
        .unwrap_or_else(|e| panic!("{e}"));
    let image = OciImage::busybox(256 << 10, 41).expect("image");
    regs.auth
        .push("team/private", "v1", &image)
        .unwrap_or_else(|e| panic!("{e}"));
    let config = registry::docker_config(&regs.auth, AUTH_USER, AUTH_PASSWORD);
    fake.put(
        Kind::Secret,
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
               "metadata": {"name": "regcred", "namespace": "default"},
               "data": {".dockerconfigjson": registry::base64(config.as_bytes())}}),
    );
    let reference = regs.auth.reference("team/private", "v1");
    let mut pod = node_pod(
        "pulled",
        "cl-uid-pulled",
        "cl-pull-node",
        json!({"imagePullSecrets": [{"name": "absent"}, {"name": "regcred"}]}),
        "sleep 3600",
    );
    pod["spec"]["containers"][0]["image"] = json!(reference);
    pod["spec"]["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
    fake.put_pod(pod);
    wait_until("Running in the API", Duration::from_secs(60), || {
        fake.get(Kind::Pod, "default", "pulled")
            .is_some_and(|p| p["status"]["phase"] == "Running")
    })
    .await;
    let warned = wait_event(&fake, "FailedToRetrieveImagePullSecret", "pulled").await;
    assert_eq!(
        warned["message"],
        "Unable to retrieve some image pull secrets (default/absent); attempting to pull the image may not succeed."
    );
    let pulled = wait_event(&fake, "Pulled", "pulled").await;
    let text = pulled["message"].as_str().unwrap_or_default();
    assert!(
        text.starts_with(&format!("Successfully pulled image \"{reference}\" in ")),
        "{text}"
    );
    // The registry saw the credentials: its log has the pull's requests answered 200.
    let log = regs.auth.access_log().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        log.iter().any(|a| a.is_pull()
            && a.repo.as_deref() == Some("team/private")
            && a.status == Some(200)),
        "no authorized pull in the registry's log"
    );
    drop(node.shutdown().await);
}

/// kubelet's configMap, secret and projected-volume e2e tests on the node
/// (`test/e2e/common/storage/{configmap,secret,projected}_*.go`): an API pod's configMap,
/// secret and kube-api-access volumes and its env from both, as the container (uid 1000 with
/// fsGroup 2000) reads them; the secret on a tmpfs with the fsGroup's ownership; the token
/// bound to the pod and refreshed before it expires; a ConfigMap change reaching the running
/// container; a pod whose ConfigMap does not exist yet waiting in ContainerCreating with
/// kubelet's FailedMount event, and starting once it appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_maps_secrets_and_tokens_reach_the_container() {
    let args = ConfigArgs {
        sync_frequency: Some("2s".to_owned()),
        ..ConfigArgs::default()
    };
    let (_serial, fake, node) = cluster_test("cl-obj", "cl-obj-node", args, false).await;
    // Tokens live 20 s (a real server gives at least 10 min): refreshed within the test.
    fake.set_token_ttl(Some(20));
    fake.put(
        Kind::ConfigMap,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "app", "namespace": "default"},
               "data": {"mode": "fast", "greeting": "hello"}}),
    );
    fake.put(
        Kind::ConfigMap,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "kube-root-ca.crt", "namespace": "default"},
               "data": {"ca.crt": "PEM-DATA"}}),
    );
    fake.put(
        Kind::Secret,
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "creds", "namespace": "default"},
               // base64 of "s3cret"
               "data": {"password": "czNjcmV0"}}),
    );
    // The API server's own service (every pod's KUBERNETES_SERVICE_*) and one of the pod's
    // namespace (enableServiceLinks).
    for (name, ip, port) in [
        ("kubernetes", "10.96.0.1", 443),
        ("my-db", "10.96.0.20", 5432),
    ] {
        fake.put(
            Kind::Service,
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": name, "namespace": "default"},
                   "spec": {"clusterIP": ip, "ports": [{"name": "main", "port": port}]}}),
        );
    }
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    let script = format!(
        "echo \"env MODE=$MODE PW=$PW G=$C_greeting\"; echo \"id $(id -u) $(id -G)\"; \
         echo \"svc $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT $KUBERNETES_PORT $MY_DB_SERVICE_PORT_MAIN\"; \
         echo \"secret $(cat /etc/sec/password)\"; echo \"ca $(cat {sa}/ca.crt) ns $(cat {sa}/namespace)\"; \
         while true; do echo \"tick cfg=$(cat /etc/cfg/mode) tok=$(cat {sa}/token)\"; sleep 1; done"
    );
    let mut pod = node_pod(
        "objs",
        "cl-uid-objs",
        "cl-obj-node",
        json!({
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000},
            "volumes": [
                {"name": "cfg", "configMap": {"name": "app"}},
                // 0400: readable by uid 1000 only through the fsGroup's ownership.
                {"name": "sec", "secret": {"secretName": "creds", "defaultMode": 256}},
                {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt",
                                   "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}},
            ],
        }),
        &script,
    );
    pod["spec"]["containers"][0]["volumeMounts"] = json!([
        {"name": "cfg", "mountPath": "/etc/cfg"},
        {"name": "sec", "mountPath": "/etc/sec"},
        {"name": "kube-api-access", "mountPath": sa},
    ]);
    pod["spec"]["containers"][0]["env"] = json!([
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "mode"}}},
        {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
        {"name": "NONE", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "x", "optional": true}}},
    ]);
    pod["spec"]["containers"][0]["envFrom"] =
        json!([{"configMapRef": {"name": "app"}, "prefix": "C_"}]);
    fake.put_pod(pod);
    let uid = "cl-uid-objs";
    wait_until(
        "the container's first tick",
        Duration::from_secs(60),
        || last_log_line(&node, uid, "tick").is_some(),
    )
    .await;
    let line = |p: &str| last_log_line(&node, uid, p).unwrap_or_default();
    assert_eq!(line("env"), "env MODE=fast PW=s3cret G=hello");
    assert_eq!(
        line("id"),
        "id 1000 1000 2000",
        "fsGroup as a supplemental group"
    );
    assert_eq!(
        line("secret"),
        "secret s3cret",
        "0400 secret read through the fsGroup"
    );
    assert_eq!(line("ca"), "ca PEM-DATA ns default");
    assert_eq!(
        line("svc"),
        "svc 10.96.0.1:443 tcp://10.96.0.1:443 5432",
        "service variables"
    );
    // The secret never reaches a disk: its volume is a tmpfs, its files the fsGroup's.
    let vols = node.state.join("pods").join(uid).join("volumes");
    let sec = vols.join("kubernetes.io~secret/sec");
    assert!(
        enforcer::pods::volumes::is_mount_point(&sec),
        "tmpfs at {}",
        sec.display()
    );
    assert!(enforcer::pods::volumes::is_mount_point(
        &vols.join("kubernetes.io~projected/kube-api-access")
    ));
    assert!(
        !enforcer::pods::volumes::is_mount_point(&vols.join("kubernetes.io~configmap/cfg")),
        "configMaps on disk, as kubelet"
    );
    {
        use std::os::unix::fs::MetadataExt as _;
        let md = std::fs::metadata(sec.join("password")).expect("password");
        assert_eq!(
            (md.gid(), md.mode() & 0o7777),
            (2000, 0o440),
            "SetVolumeOwnership"
        );
    }
    // The token: bound to the pod, as asked, and what the container reads.
    let tokens = fake.tokens();
    let first = tokens.first().expect("a TokenRequest").clone();
    assert_eq!(first.service_account, "default");
    assert_eq!(first.request["spec"]["expirationSeconds"], 3607);
    assert_eq!(
        first.request["spec"]["boundObjectRef"],
        json!({"apiVersion": "v1", "kind": "Pod", "name": "objs", "uid": uid})
    );
    assert!(
        line("tick").ends_with(&format!("tok={}", first.token)),
        "{}",
        line("tick")
    );
    // A ConfigMap change reaches the running container at a sync.
    fake.put(
        Kind::ConfigMap,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "app", "namespace": "default"},
               "data": {"mode": "slow", "greeting": "hello"}}),
    );
    wait_until(
        "the ConfigMap change in the volume",
        Duration::from_secs(20),
        || line("tick").starts_with("tick cfg=slow"),
    )
    .await;
    // The token is refreshed before it expires (kubelet: at 80 % of its 20 s, less up to
    // 10 s of jitter), and the container reads the new one.
    wait_until("a refreshed token", Duration::from_secs(30), || {
        fake.tokens().len() >= 2
    })
    .await;
    let second = fake.tokens()[1].clone();
    let age = second.issued.duration_since(first.issued);
    assert!(
        age >= Duration::from_secs(5) && age < Duration::from_secs(20),
        "refreshed {age:?} after issue, the token living 20 s"
    );
    wait_until(
        "the new token in the volume",
        Duration::from_secs(10),
        || line("tick").ends_with(&format!("tok={}", second.token)),
    )
    .await;

    // A pod whose ConfigMap does not exist yet: ContainerCreating and FailedMount, then it
    // starts once the ConfigMap appears.
    let mut later = node_pod(
        "later",
        "cl-uid-later",
        "cl-obj-node",
        json!({
            "volumes": [{"name": "cfg", "configMap": {"name": "late"}}],
        }),
        "cat /etc/cfg/k; sleep 3600",
    );
    later["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "cfg", "mountPath": "/etc/cfg"}]);
    fake.put_pod(later);
    let e = wait_event(&fake, "FailedMount", "later").await;
    assert_eq!(e["type"], "Warning");
    assert_eq!(
        e["message"],
        "MountVolume.SetUp failed for volume \"cfg\" : configmaps \"late\" not found"
    );
    // The status is written on its own path (the status manager's sync), not with the event:
    // it may arrive a moment after it.
    let creating = |p: &Value| {
        p["status"]["phase"] == "Pending"
            && p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
                == "ContainerCreating"
    };
    wait_until(
        "the pod Pending in ContainerCreating in the API",
        Duration::from_secs(10),
        || {
            fake.get(Kind::Pod, "default", "later")
                .is_some_and(|p| creating(&p))
        },
    )
    .await;
    fake.put(
        Kind::ConfigMap,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "late", "namespace": "default"}, "data": {"k": "v"}}),
    );
    wait_until("the late pod running", Duration::from_secs(30), || {
        api_phase(&fake, "later").as_deref() == Some("Running")
    })
    .await;
    for name in ["objs", "later"] {
        assert_eq!(fake.delete_pod("default", name, Some(0)), 200);
    }
    wait_until("the pods' volumes gone", Duration::from_secs(60), || {
        !vols.exists() && !node.state.join("pods/cl-uid-later/volumes").exists()
    })
    .await;
    drop(node.shutdown().await);
}
