//! The API-server pod source against an in-process fake of the Kubernetes HTTP API (no real
//! API server is reachable here): a plain-HTTP server on 127.0.0.1 that answers the list and
//! the watch of `/api/v1/pods`, honouring `fieldSelector=spec.nodeName=<node>`, and pushes
//! ADDED / MODIFIED / DELETED watch events when the test changes its pods.

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use enforcer::runtime::{
    CriRuntime, PodOp, RunPodsOptions, SourceEvent, StatusManager, apiserver, run_pods_with,
    status::ContainerState,
};
use enforcer_tests::{containerd::Containerd, layout};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};

const NODE: &str = "testnode";

#[derive(Default)]
struct FakeState {
    /// uid -> pod JSON.
    pods: HashMap<String, Value>,
    rv: u64,
    /// Open watches: (node selector, sender of event lines).
    watches: Vec<(Option<String>, mpsc::UnboundedSender<String>)>,
    requests: Vec<String>,
}

/// The fake API server.
struct FakeApi {
    addr: SocketAddr,
    state: Arc<Mutex<FakeState>>,
    task: tokio::task::JoinHandle<()>,
}

fn node_of(pod: &Value) -> Option<&str> {
    pod["spec"]["nodeName"].as_str()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
        } else {
            out.push(if b[i] == b'+' { b' ' } else { b[i] });
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(path: &str) -> HashMap<String, String> {
    path.split_once('?')
        .map(|(_, q)| q)
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), percent_decode(v)))
        .collect()
}

fn with_rv(pod: &Value, rv: u64) -> Value {
    let mut p = pod.clone();
    p["apiVersion"] = json!("v1");
    p["kind"] = json!("Pod");
    p["metadata"]["resourceVersion"] = json!(rv.to_string());
    p
}

impl FakeApi {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(FakeState::default()));
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, st.clone()));
            }
        });
        Self { addr, state, task }
    }

    fn event(&self, kind: &str, pod: &Value) {
        let mut st = self.state.lock().expect("lock");
        st.rv += 1;
        let obj = with_rv(pod, st.rv);
        let line = json!({"type": kind, "object": obj}).to_string();
        let node = node_of(pod).map(str::to_owned);
        st.watches.retain(|(sel, tx)| {
            if sel.is_some() && *sel != node {
                return !tx.is_closed();
            }
            tx.send(line.clone()).is_ok()
        });
    }

    fn put(&self, pod: Value) {
        let uid = pod["metadata"]["uid"].as_str().expect("uid").to_owned();
        let existed = {
            let mut st = self.state.lock().expect("lock");
            st.pods.insert(uid, pod.clone()).is_some()
        };
        self.event(if existed { "MODIFIED" } else { "ADDED" }, &pod);
    }

    fn delete(&self, uid: &str) {
        let pod = self.state.lock().expect("lock").pods.remove(uid);
        if let Some(pod) = pod {
            self.event("DELETED", &pod);
        }
    }

    fn requests(&self) -> Vec<String> {
        self.state.lock().expect("lock").requests.clone()
    }

    fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: nobody\nusers:\n- name: nobody\n  user: {{}}\ncurrent-context: fake\n",
            self.addr
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut conn: TcpStream, state: Arc<Mutex<FakeState>>) {
    let mut buf = Vec::new();
    loop {
        // One request head (the requests here have no body).
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.drain(..head_end);
        let path = head
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("/")
            .to_owned();
        let q = query(&path);
        let selector = q
            .get("fieldSelector")
            .and_then(|s| s.strip_prefix("spec.nodeName="))
            .map(str::to_owned);
        state
            .lock()
            .expect("lock")
            .requests
            .push(percent_decode(&path));
        if !path.starts_with("/api/v1/pods") {
            let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound", "message": "not found"}).to_string();
            let resp = format!(
                "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if conn.write_all(resp.as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
            let (tx, mut rx) = mpsc::unbounded_channel::<String>();
            state
                .lock()
                .expect("lock")
                .watches
                .push((selector.clone(), tx));
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
            if conn.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            while let Some(line) = rx.recv().await {
                let data = format!("{line}\n");
                let chunk = format!("{:x}\r\n{data}\r\n", data.len());
                if conn.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
            }
            return;
        }
        let body = {
            let st = state.lock().expect("lock");
            let items: Vec<Value> = st
                .pods
                .values()
                .filter(|p| selector.is_none() || node_of(p) == selector.as_deref())
                .map(|p| with_rv(p, st.rv))
                .collect();
            json!({
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {"resourceVersion": st.rv.to_string()},
                "items": items,
            })
            .to_string()
        };
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if conn.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}

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
    fake.put(api_pod("a", "uid-a", NODE, "sleep 1"));
    fake.put(api_pod("elsewhere", "uid-x", "othernode", "sleep 1"));
    let (mut rx, task) = apiserver::spawn(fake.kubeconfig(dir.path()), NODE.to_owned());

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
                fake.requests()
            ),
        }
    }
    assert_eq!(first, ["Add uid-a", "Synced"], "only this node's pod");
    let reqs = fake.requests();
    assert!(
        reqs.iter()
            .any(|r| r.starts_with("/api/v1/pods")
                && r.contains("fieldSelector=spec.nodeName=testnode")),
        "the list must select this node: {reqs:?}"
    );

    // Wait for the watch to be open before changing pods.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !fake.requests().iter().any(|r| r.contains("watch=true")) {
        assert!(Instant::now() < deadline, "no watch: {:?}", fake.requests());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    fake.put(api_pod("a", "uid-a", NODE, "sleep 2"));
    assert_eq!(
        next_pod_event(&mut rx, "update").await,
        (PodOp::Update, "uid-a".to_owned(), "sleep 2".to_owned())
    );
    fake.put(api_pod("elsewhere", "uid-x", "othernode", "sleep 2"));
    fake.put(api_pod("b", "uid-b", NODE, "sleep 3"));
    assert_eq!(
        next_pod_event(&mut rx, "add").await,
        (PodOp::Add, "uid-b".to_owned(), "sleep 3".to_owned())
    );
    fake.delete("uid-a");
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
    fake.put(api_pod(
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
            fake.requests()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let record = status.get("api-uid-1").expect("record");
    assert_eq!(record.source, "api");
    assert_eq!(record.name, "api-pod", "API pods keep their name");
    fake.delete("api-uid-1");
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
