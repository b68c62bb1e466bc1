//! Drills: what hostile input and faults did to the daemon, each one a test that failed before
//! the fix. Real kernel, cgroups and a private containerd.
//!
//! - descriptor exhaustion: 1,100 idle connections to the HTTP port under `ulimit -n 1024`;
//! - a deeply nested manifest (100,000 levels) beside pods that must keep being handled;
//! - a file squatting a running pod's uid, across a daemon restart;
//! - shutdown while a pod's kill keeps failing because containerd is gone.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use enforcer::{
    config::ConfigArgs,
    cri::{ContainerRuntime as _, CriRuntime},
};
use enforcer_tests::{
    containerd::Containerd,
    node::{Node, find, phase, pod, status_file, wait_until},
};
use tokio::time::Instant;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SLEEP: &str = "trap 'exit 0' TERM; sleep 3600 & wait";

/// A 1Gi node with kubelet's default memory threshold only (the default disk thresholds
/// would follow the build machine's disk).
fn args() -> ConfigArgs {
    ConfigArgs {
        node_capacity: vec!["memory=1Gi".to_owned()],
        eviction_hard: vec!["memory.available<100Mi".to_owned()],
        ..ConfigArgs::default()
    }
}

fn uid(n: u32) -> String {
    format!("d0000000-0000-0000-0000-{n:012}")
}

/// GET `path` with a short timeout: the status line, or `None`.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines().next().map(str::to_owned)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat; `after` starts at field 3.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// The daemon process this test started: SIGTERM on drop (also when the test fails), then
/// SIGKILL if it has not exited within 20 s; ended by its PID only.
struct Stopper(std::process::Child);

impl Drop for Stopper {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0.id()) {
            // SAFETY: kill on the PID of a child this test spawned and has not reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Raises this test process's own descriptor limit (it opens 1,100 sockets).
fn raise_own_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim), 0);
    }
    assert!(
        lim.rlim_cur >= 2048,
        "the test needs 2048 descriptors: {lim:?}"
    );
}

/// kubelet's default service limit for descriptors is 1024 (systemd's soft limit); with the
/// hard limit at 1024 too the daemon cannot raise it. 1,100 idle connections must not
/// exhaust its descriptors: the eviction manager keeps observing, a new manifest starts,
/// the accept loop does not spin, and `/healthz` answers once the connections go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_under_a_1024_descriptor_limit_do_not_blind_the_daemon() {
    let _serial = SERIAL.lock().await;
    raise_own_nofile();
    let bin = enforcer_tests::enforcer_binary();
    let mut cd = Containerd::start("fds");
    let manifests = cd.dir.join("manifests");
    let state = cd.dir.join("state");
    std::fs::create_dir_all(&manifests).expect("manifests");
    let addr: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        l.local_addr().expect("addr")
    };
    let log_path = cd.dir.join("enforcer.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let mut cmd = Command::new(&bin);
    cmd.args([
        "run",
        "--housekeeping-interval=1s",
        "--node-capacity=memory=1Gi",
        "--eviction-hard=memory.available<100Mi",
        "--image-gc-high-threshold=100",
        "--image-gc-low-threshold=99",
    ])
    .arg(format!("--http-address={addr}"))
    .arg(format!("--cri-socket={}", cd.socket.display()))
    .arg(format!("--manifest-dir={}", manifests.display()))
    .arg(format!("--state-dir={}", state.display()))
    .arg(format!("--cgroup-root={}", cd.cgroup_root))
    .arg("--allow-host-namespaces")
    .stdout(Stdio::null())
    .stderr(log);
    // SAFETY: the closure only calls setrlimit, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 1024,
                rlim_max: 1024,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let daemon = Stopper(cmd.spawn().expect("enforcer run"));
    let pid = daemon.0.id();
    let log_text = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_until("the daemon answering", Duration::from_secs(60), || {
        http_get(addr, "/healthz").is_some()
    })
    .await;
    let limit = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
    assert!(
        limit
            .lines()
            .any(|l| l.starts_with("Max open files") && l.contains("1024")),
        "{limit}"
    );
    std::fs::write(
        manifests.join("before.yaml"),
        pod("before", &uid(1), "", "", SLEEP),
    )
    .expect("manifest");
    wait_until("the first pod running", Duration::from_secs(60), || {
        phase(&state, "before").as_deref() == Some("Running")
    })
    .await;

    // The flood: 1,100 idle connections, held open. Beyond the daemon's cap they wait in
    // the listen backlog; beyond the backlog the kernel stops answering (a short timeout).
    let mut held = Vec::new();
    for _ in 0..1100 {
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(50)) {
            held.push(s);
        }
    }
    let ticks_before = cpu_ticks(pid);
    let t0 = std::time::Instant::now();
    std::fs::write(
        manifests.join("during.yaml"),
        pod("during", &uid(2), "", "", SLEEP),
    )
    .expect("manifest");
    let mut max_fds = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while phase(&state, "during").as_deref() != Some("Running") {
        max_fds = max_fds.max(open_fds(pid));
        assert!(
            Instant::now() < deadline,
            "no pod started during the flood; log:\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Watch a few seconds more with the connections still held.
    let watch_until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < watch_until {
        max_fds = max_fds.max(open_fds(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    let cpu = (cpu_ticks(pid) - ticks_before) as f64 / hz as f64;
    let wall = t0.elapsed().as_secs_f64();
    eprintln!(
        "held {} connections; daemon peak {max_fds} descriptors; CPU {cpu:.2} s in {wall:.1} s",
        held.len()
    );
    assert!(
        held.len() > 2 * enforcer::server::MAX_CONNECTIONS,
        "the flood opened only {} connections",
        held.len()
    );
    assert!(
        max_fds < 1024 - 64,
        "the daemon used {max_fds} of its 1024 descriptors"
    );
    assert!(
        cpu < wall * 0.5,
        "the daemon used {cpu:.2} s of CPU in {wall:.1} s: the accept loop spins"
    );
    let text = log_text();
    for bad in ["observing the node failed", "Too many open files"] {
        assert!(!text.contains(bad), "{bad:?} in the log:\n{text}");
    }
    drop(held);
    wait_until("/healthz after the flood", Duration::from_secs(20), || {
        http_get(addr, "/healthz").is_some_and(|l| l.contains("200"))
    })
    .await;
    // /healthz tells the truth about the runtime: containerd gone -> 503 naming it.
    cd.stop();
    wait_until(
        "/healthz failing without containerd",
        Duration::from_secs(20),
        || http_get(addr, "/healthz").is_some_and(|l| l.contains("503")),
    )
    .await;
    cd.launch();
    wait_until(
        "/healthz ok with containerd back",
        Duration::from_secs(30),
        || http_get(addr, "/healthz").is_some_and(|l| l.contains("200")),
    )
    .await;

    drop(daemon);
    cd.remove_all_pods().await;
    drop(cd);
}

/// 100,000 levels of `{"a":` (0.6 MB) are refused before the parser sees them, and the pod
/// loop keeps handling the other manifests meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeply_nested_manifest_is_refused_and_blocks_nothing() {
    let _serial = SERIAL.lock().await;
    let mut node = Node::start("deep", args(), None);
    node.submit("canary.yaml", &pod("canary", &uid(11), "", "", SLEEP));
    wait_until("canary running", Duration::from_secs(60), || {
        phase(&node.state, "canary").as_deref() == Some("Running")
    })
    .await;
    let mut deep = String::with_capacity(600_000);
    for _ in 0..100_000 {
        deep.push_str("{\"a\":");
    }
    node.submit("deep.json", &deep);
    let t0 = Instant::now();
    node.submit("after.yaml", &pod("after", &uid(12), "", "", SLEEP));
    wait_until(
        "the pod after the deep file",
        Duration::from_secs(20),
        || phase(&node.state, "after").as_deref() == Some("Running"),
    )
    .await;
    eprintln!("pod after the deep manifest running in {:?}", t0.elapsed());
    let file = status_file(&node.state);
    let rejected = file
        .rejected
        .iter()
        .find(|r| r.file.ends_with("deep.json"))
        .unwrap_or_else(|| panic!("deep.json listed as rejected: {:?}", file.rejected));
    assert!(
        rejected.message.contains("nested deeper than 64 levels"),
        "{rejected:?}"
    );
    // A restart adopts the running pods at once, the deep file notwithstanding.
    node.restart().await;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    wait_until(
        "pods adopted after the restart",
        Duration::from_secs(15),
        || {
            ["canary", "after"]
                .iter()
                .all(|p| phase(&node.state, p).as_deref() == Some("Running"))
        },
    )
    .await;
    eprintln!("adopted after the restart in {:?}", t0.elapsed());
    drop(node.shutdown().await);
}

fn container_id(state: &Path, prefix: &str) -> Option<String> {
    find(&status_file(state).pods, prefix)
        .and_then(|r| r.container_statuses.first().map(|c| c.container_id.clone()))
        .filter(|id| !id.is_empty())
}

/// `0-hijack.yaml` claims the uid of the running `canary.yaml`: refused, and still refused
/// after a restart, where it is read first; the canary keeps its container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_squatter_never_wins_across_a_restart() {
    let _serial = SERIAL.lock().await;
    let mut node = Node::start("squat", args(), None);
    let u = uid(21);
    node.submit("canary.yaml", &pod("canary", &u, "", "", SLEEP));
    wait_until("canary running", Duration::from_secs(60), || {
        phase(&node.state, "canary").as_deref() == Some("Running")
    })
    .await;
    let id = container_id(&node.state, "canary").expect("canary's container");
    node.submit(
        "0-hijack.yaml",
        &pod("hijack", &u, "", "", "echo hijacked; sleep 3600"),
    );
    let refused = |state: &Path| {
        status_file(state)
            .rejected
            .iter()
            .any(|r| r.file.ends_with("0-hijack.yaml") && r.message.contains("canary.yaml"))
    };
    wait_until("the squatter refused", Duration::from_secs(10), || {
        refused(&node.state)
    })
    .await;
    node.restart().await;
    wait_until(
        "the squatter refused after the restart",
        Duration::from_secs(20),
        || refused(&node.state),
    )
    .await;
    // Give a wrong adoption time to show.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let recs = status_file(&node.state).pods;
    assert!(
        find(&recs, "hijack").is_none(),
        "the squatter runs: {recs:?}"
    );
    assert_eq!(
        phase(&node.state, "canary").as_deref(),
        Some("Running"),
        "{recs:?}"
    );
    assert_eq!(
        container_id(&node.state, "canary").as_deref(),
        Some(id.as_str()),
        "the canary's container was replaced"
    );
    drop(node.shutdown().await);
}

/// containerd goes away while a pod is being deleted: the kill keeps failing, yet stopping
/// the daemon finishes within its bound, leaving the pod `Terminating` in the status file for
/// the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_bounded_while_a_kill_keeps_failing() {
    let _serial = SERIAL.lock().await;
    let mut node = Node::start("shutdown", args(), None);
    node.submit("victim.yaml", &pod("victim", &uid(31), "", "", SLEEP));
    wait_until("victim running", Duration::from_secs(60), || {
        phase(&node.state, "victim").as_deref() == Some("Running")
    })
    .await;
    node.cd.stop();
    node.delete("victim.yaml");
    wait_until("victim terminating", Duration::from_secs(10), || {
        phase(&node.state, "victim").as_deref() == Some("Terminating")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), node.stop_daemon())
        .await
        .expect("the daemon stopped within 30 s with containerd gone");
    let took = t0.elapsed();
    eprintln!("stopped in {took:?} with a kill failing");
    assert_eq!(
        phase(&node.state, "victim").as_deref(),
        Some("Terminating"),
        "what it left is recorded"
    );
    // The next start, with containerd back, finishes the deletion.
    node.cd.launch();
    node.restart().await;
    let cri = CriRuntime::new(node.cd.socket.clone(), Duration::from_secs(5));
    let filter = k8s_cri::v1::PodSandboxFilter {
        label_selector: std::collections::HashMap::from([(
            "io.kubernetes.pod.uid".to_owned(),
            uid(31),
        )]),
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = cri
            .list_pod_sandboxes(filter.clone())
            .await
            .unwrap_or_default();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the next start did not remove the victim: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(node.shutdown().await);
}

/// `enforcer events` on a store with a damaged line (a crash, a disk error): the line is
/// skipped and said, the rest is shown and filtered; a state directory it cannot read is a
/// clear error (exit 2) naming the path.
#[test]
fn events_cli_skips_a_damaged_line_and_names_an_unreadable_store() {
    use enforcer::{
        cluster::{
            event_store::{self, EventStore},
            events::event_object,
        },
        recorder::{EventRecord, EventType, Involved},
    };
    let bin = enforcer_tests::enforcer_binary();
    let dir = std::env::temp_dir().join(format!("enforcer-events-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut store = EventStore::open(&dir).expect("store");
    let t =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    for (i, name) in ["hog", "web"].into_iter().enumerate() {
        let e = EventRecord {
            involved: Involved::pod("default", name, &format!("u{i}"), None),
            type_: EventType::Warning,
            reason: "Evicted".to_owned(),
            message: "The node was low on resource: memory. ".to_owned(),
            annotations: std::collections::BTreeMap::new(),
        };
        store
            .append(&event_object(
                &e,
                "n1",
                t.clone(),
                i128::try_from(i).unwrap_or(0),
            ))
            .expect("append");
    }
    drop(store);
    let file = dir.join(event_store::DIR).join("events.jsonl");
    let mut text = std::fs::read_to_string(&file).expect("read");
    text.insert_str(0, "{\"kind\": 1\n");
    std::fs::write(&file, text).expect("damage");
    let out = Command::new(&bin)
        .args(["events", "-o", "json", "--pod", "hog", "--state-dir"])
        .arg(&dir)
        .output()
        .expect("enforcer events");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("skipped 1 unreadable line"), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = v["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|e| e["involvedObject"]["name"].as_str())
        .collect();
    assert_eq!(names, ["hog"]);
    // A state directory that is a file: exit 2, the path named.
    let out = Command::new(&bin)
        .args(["events", "--state-dir"])
        .arg(&file)
        .output()
        .expect("enforcer events");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&file.display().to_string()), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
