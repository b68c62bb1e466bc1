//! `cargo xtask bench pods`: pods started and stopped through the enforcer vs through direct
//! CRI calls, against one private containerd, in one run.
//!
//! Both sides do the same work per pod, the work kubelet does: pod cgroup (created with its
//! limits, removed after), image status, RunPodSandbox, CreateContainer, StartContainer; then
//! StopContainer (the container exits on SIGTERM), StopPodSandbox, RemoveContainer,
//! RemovePodSandbox. The direct side is a loop of CRI calls; the enforcer side writes manifests
//! into its directory (the in-process pod runtime, `run_pods_with`, manifest poll
//! `--poll-ms`) and waits for its status manager to report the pods Running, then gone.
//! Each side runs twice: sequentially (one pod at a time) and in parallel (all at once).
//!
//! Then the daemon (`enforcer run`, the release binary next to this one) runs `--rss-pods`
//! pods from its manifest directory and its RSS is read from /proc.
//!
//! Needs root, containerd, runc and busybox-static. Prints markdown tables.

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use enforcer::{
    container_manager::podcgroup::PodCgroups,
    cri::{
        ContainerRuntime as _, CriRuntime,
        spec::{self, ContainerKind, NodeFacts},
    },
    kernel::Capabilities,
    pods::{RunPodsOptions, run_pods_with},
    status_manager::{self, ContainerState, PodRecord, StatusManager},
};
use enforcer_tests::{containerd::Containerd, layout, require_root};
use k8s_openapi::api::core::v1::Pod;
use tokio::task::JoinSet;

const NODE: &str = "benchnode";
/// The stop timeout on both sides (the pods' `terminationGracePeriodSeconds`). The containers
/// exit on SIGTERM, except one stopped before its shell installed the trap (PID 1 ignores an
/// unhandled SIGTERM): that one costs this long on either side.
const GRACE_SECONDS: i64 = 2;

fn arg(name: &str, default: u64) -> u64 {
    enforcer_tests::arg_u64(name, default)
}

fn pod_yaml(name: &str, uid: &str) -> String {
    image_pod_yaml(name, uid, "busybox:local")
}

fn image_pod_yaml(name: &str, uid: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  uid: {uid}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: '{image}'\n    imagePullPolicy: IfNotPresent\n    command: [/bin/sh, -c]\n    args: [\"trap 'exit 0' TERM; sleep 3600 & wait\"]\n"
    )
}

fn write_manifest(dir: &Path, file: &str, text: &str) -> anyhow::Result<()> {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(file)).with_context(|| format!("rename {}", tmp.display()))
}

fn running(p: &PodRecord) -> bool {
    p.phase == "Running"
        && !p.container_statuses.is_empty()
        && p.container_statuses
            .iter()
            .all(|c| matches!(c.state, ContainerState::Running { .. }))
}

/// Timings of one side in one mode.
#[derive(Clone, Copy, Debug)]
struct Run {
    start: Duration,
    stop: Duration,
}

impl Run {
    fn total(self) -> Duration {
        self.start + self.stop
    }
}

struct Direct {
    rt: Arc<CriRuntime>,
    cgroups: Arc<PodCgroups>,
    node: NodeFacts,
}

impl Direct {
    async fn start_one(&self, pod: &Pod) -> anyhow::Result<(String, String, String)> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let qos = spec::pod_qos(pod);
        let cg = self.cgroups.ensure(
            &uid,
            qos,
            &spec::pod_cgroup_values(pod, self.cgroups.options()),
        )?;
        let c = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .context("pod without containers")?;
        let image = self
            .rt
            .image_status(c.image.as_deref().unwrap_or_default())
            .await?
            .context("busybox:local is not in containerd")?
            .id;
        let sb = spec::sandbox_config(pod, 0, &cg, "");
        let sid = self.rt.run_pod_sandbox(sb.clone()).await?;
        let mut cc = spec::container_config(pod, c, ContainerKind::Regular, 0, &image, self.node);
        cc.log_path.clear();
        let cid = self.rt.create_container(&sid, cc, sb).await?;
        self.rt.start_container(&cid).await?;
        Ok((uid, sid, cid))
    }

    async fn stop_one(&self, uid: &str, sid: &str, cid: &str) -> anyhow::Result<()> {
        self.rt.stop_container(cid, GRACE_SECONDS).await?;
        self.rt.stop_pod_sandbox(sid).await?;
        self.rt.remove_container(cid).await?;
        self.rt.remove_pod_sandbox(sid).await?;
        self.cgroups.remove(uid).await?;
        Ok(())
    }
}

fn bench_pods(prefix: &str, n: usize) -> anyhow::Result<Vec<Arc<Pod>>> {
    (0..n)
        .map(|i| {
            let text = pod_yaml(&format!("{prefix}{i}"), &format!("{prefix}-{i}"));
            enforcer::sources::parse_manifest(Path::new("/bench.yaml"), &text, NODE)
                .map_err(anyhow::Error::from)
                .and_then(|mut v| v.pop().context("no pod"))
                .map(Arc::new)
        })
        .collect()
}

async fn direct_run(d: &Arc<Direct>, n: usize, parallel: bool, tag: &str) -> anyhow::Result<Run> {
    let pods = bench_pods(tag, n)?;
    let t = Instant::now();
    let mut ids = Vec::new();
    if parallel {
        let mut set = JoinSet::new();
        for pod in pods {
            let d = d.clone();
            set.spawn(async move { d.start_one(&pod).await });
        }
        while let Some(r) = set.join_next().await {
            ids.push(r??);
        }
    } else {
        for pod in &pods {
            ids.push(d.start_one(pod).await?);
        }
    }
    let start = t.elapsed();
    let t = Instant::now();
    if parallel {
        let mut set = JoinSet::new();
        for (uid, sid, cid) in ids {
            let d = d.clone();
            set.spawn(async move { d.stop_one(&uid, &sid, &cid).await });
        }
        while let Some(r) = set.join_next().await {
            r??;
        }
    } else {
        for (uid, sid, cid) in &ids {
            d.stop_one(uid, sid, cid).await?;
        }
    }
    Ok(Run {
        start,
        stop: t.elapsed(),
    })
}

async fn wait_until(
    status: &StatusManager,
    what: &str,
    timeout: Duration,
    done: impl FnMut(&StatusManager) -> bool,
) -> anyhow::Result<()> {
    wait_every(status, what, timeout, Duration::from_millis(2), done).await
}

async fn wait_every(
    status: &StatusManager,
    what: &str,
    timeout: Duration,
    every: Duration,
    mut done: impl FnMut(&StatusManager) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !done(status) {
        if Instant::now() > deadline {
            let (_, snap) = status.snapshot();
            bail!(
                "{what}: not within {timeout:?}; status:\n{}",
                serde_json::to_string_pretty(&snap).unwrap_or_default()
            );
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

async fn enforcer_run(
    status: &StatusManager,
    manifests: &Path,
    n: usize,
    parallel: bool,
    tag: &str,
) -> anyhow::Result<Run> {
    let uids: Vec<String> = (0..n).map(|i| format!("{tag}-{i}")).collect();
    let file = |i: usize| format!("{tag}{i}.yaml");
    let limit = Duration::from_secs(120);
    let t = Instant::now();
    if parallel {
        for (i, uid) in uids.iter().enumerate() {
            write_manifest(manifests, &file(i), &pod_yaml(&format!("{tag}{i}"), uid))?;
        }
        wait_until(status, "all running", limit, |s| {
            uids.iter().all(|u| s.get(u).is_some_and(|p| running(&p)))
        })
        .await?;
    } else {
        for (i, uid) in uids.iter().enumerate() {
            write_manifest(manifests, &file(i), &pod_yaml(&format!("{tag}{i}"), uid))?;
            wait_until(status, "running", limit, |s| {
                s.get(uid).is_some_and(|p| running(&p))
            })
            .await?;
        }
    }
    let start = t.elapsed();
    let t = Instant::now();
    if parallel {
        for i in 0..n {
            std::fs::remove_file(manifests.join(file(i)))?;
        }
        wait_until(status, "all gone", limit, |s| {
            uids.iter().all(|u| s.get(u).is_none())
        })
        .await?;
    } else {
        for (i, uid) in uids.iter().enumerate() {
            std::fs::remove_file(manifests.join(file(i)))?;
            wait_until(status, "gone", limit, |s| s.get(uid).is_none()).await?;
        }
    }
    Ok(Run {
        start,
        stop: t.elapsed(),
    })
}

fn node_facts() -> NodeFacts {
    let caps = Capabilities::probe(&layout());
    NodeFacts {
        memory_capacity: enforcer::node::machine_memory().unwrap_or(0),
        cap_sys_resource: caps.cap_sys_resource,
    }
}

fn proc_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(10_297, |a| a.port())
}

struct DaemonFigures {
    pods: usize,
    to_running: Duration,
    rss_kib: u64,
    hwm_kib: u64,
    idle_rss_kib: u64,
    cpu_pct: f64,
    to_gone: Duration,
}

fn cpu_ticks(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = text.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12)
}

/// `enforcer run` (the release binary) with `n` pods in its manifest directory.
async fn daemon_rss(cd: &Containerd, n: usize) -> anyhow::Result<DaemonFigures> {
    let exe = std::env::current_exe()?.with_file_name("enforcer");
    if !exe.exists() {
        bail!(
            "{} is missing: `cargo build --release -p enforcer` first",
            exe.display()
        );
    }
    let manifests = cd.dir.join("daemon-manifests");
    let state = cd.dir.join("daemon-state");
    std::fs::create_dir_all(&manifests)?;
    let log_path = cd.dir.join("daemon.log");
    let log = std::fs::File::create(&log_path)?;
    let mut cmd = Command::new(&exe);
    cmd.arg("run")
        .arg("--cri-socket")
        .arg(&cd.socket)
        .arg("--manifest-dir")
        .arg(&manifests)
        .arg("--state-dir")
        .arg(&state)
        .arg("--cgroup-root")
        .arg(&cd.cgroup_root)
        // The benchmark pods use the host network (no CNI needed).
        .arg("--allow-host-namespaces")
        .arg("--http-address")
        .arg(format!("127.0.0.1:{}", free_port()))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log);
    let mut daemon = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    let pid = daemon.id();
    let result = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        if let Ok(Some(st)) = daemon.try_wait() {
            bail!(
                "{cmd:?} exited ({st}); log:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        let idle_rss_kib = proc_kib(pid, "VmRSS:");
        let t = Instant::now();
        for i in 0..n {
            write_manifest(
                &manifests,
                &format!("d{i}.yaml"),
                &pod_yaml(&format!("d{i}"), &format!("daemon-{i}")),
            )?;
        }
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let s = status_manager::read(&state).unwrap_or_default();
            if s.pods.iter().filter(|p| running(p)).count() == n {
                break;
            }
            if let Ok(Some(st)) = daemon.try_wait() {
                bail!("the daemon exited ({st}) while starting pods");
            }
            if let Some(p) = s.pods.iter().find(|p| p.phase == "Failed") {
                bail!(
                    "the daemon failed pod {}: {} {}",
                    p.uid,
                    p.reason,
                    p.message
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{n} pods not running within 300 s: {} running",
                    s.pods.iter().filter(|p| running(p)).count()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let to_running = t.elapsed();
        // Settle (a few relists and resyncs), then measure.
        tokio::time::sleep(Duration::from_secs(12)).await;
        let hz = rustix::param::clock_ticks_per_second() as f64;
        let t0 = cpu_ticks(pid);
        let window = Duration::from_secs(10);
        tokio::time::sleep(window).await;
        let cpu_pct = (cpu_ticks(pid) - t0) as f64 / hz / window.as_secs_f64() * 100.0;
        let rss_kib = proc_kib(pid, "VmRSS:");
        let hwm_kib = proc_kib(pid, "VmHWM:");
        let t = Instant::now();
        for i in 0..n {
            std::fs::remove_file(manifests.join(format!("d{i}.yaml")))?;
        }
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let s = status_manager::read(&state).unwrap_or_default();
            if s.pods.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                bail!("{} pods still there after 300 s", s.pods.len());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(DaemonFigures {
            pods: n,
            to_running,
            rss_kib,
            hwm_kib,
            idle_rss_kib,
            cpu_pct,
            to_gone: t.elapsed(),
        })
    }
    .await;
    // The daemon this benchmark started, by its PID.
    enforcer_tests::kill(pid as i32, rustix::process::Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    while daemon.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            let _ = daemon.kill();
            let _ = daemon.wait();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    result
}

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

fn pps(n: usize, d: Duration) -> String {
    format!("{:.1}", n as f64 / d.as_secs_f64().max(1e-9))
}

fn overhead(direct: Duration, via: Duration) -> String {
    format!(
        "{:+.0} %",
        (via.as_secs_f64() / direct.as_secs_f64().max(1e-9) - 1.0) * 100.0
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    require_root();
    let n = usize::try_from(arg("--pods", 50)).unwrap_or(50);
    let rss_pods = usize::try_from(arg("--rss-pods", 100)).unwrap_or(100);
    let poll = Duration::from_millis(arg("--poll-ms", 20));
    let mut cd = Containerd::start("bench-pods");
    let result = if std::env::args().any(|a| a == "--pull") {
        pull_bench(&cd, usize::try_from(arg("--pods", 20)).unwrap_or(20), poll).await
    } else if n > 100 {
        burst(&cd, n, poll).await
    } else {
        bench(&cd, n, rss_pods, poll).await
    };
    cd.remove_all_pods().await;
    cd.teardown();
    result
}

/// The in-process pod runtime's options on the benchmark's containerd.
fn pod_runtime_options(
    cd: &Containerd,
    node: NodeFacts,
    poll: Duration,
    manifests: &Path,
    state: std::path::PathBuf,
) -> RunPodsOptions {
    let mut opts = RunPodsOptions::for_node(layout(), &Capabilities::probe(&layout()));
    opts.cri_socket = cd.socket.clone();
    opts.cri_timeout = Duration::from_secs(30);
    opts.cgroup_root = cd.cgroup_root.clone();
    opts.manifest_dir = manifests.to_path_buf();
    opts.state_dir = state;
    opts.node_name = NODE.to_owned();
    opts.node = node;
    opts.poll = poll;
    opts.relist = Duration::from_secs(1);
    opts.resync = Duration::from_secs(10);
    opts
}

/// `pid: command line` of the processes whose command line contains `needle` (and, when
/// given, `also`).
fn process_lines(needle: &str, also: Option<&str>) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            Some(format!(
                "{}: {}",
                e.file_name().to_string_lossy(),
                String::from_utf8_lossy(&cmd).replace('\0', " ")
            ))
        })
        .filter(|c| c.contains(needle) && also.is_none_or(|a| c.contains(a)))
        .collect()
}

fn processes_with(needle: &str, also: Option<&str>) -> usize {
    process_lines(needle, also).len()
}

fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// What a burst left behind.
#[derive(Debug, Default, PartialEq, Eq)]
struct Leftovers {
    sandboxes: usize,
    containers: usize,
    shims: usize,
    runc_init: usize,
    pod_cgroups: usize,
}

impl Leftovers {
    fn total(&self) -> usize {
        self.sandboxes + self.containers + self.shims + self.runc_init + self.pod_cgroups
    }
}

async fn leftovers(cd: &Containerd, rt: &CriRuntime) -> Leftovers {
    let socket = cd.socket.display().to_string();
    Leftovers {
        sandboxes: rt
            .list_pod_sandboxes(k8s_cri::v1::PodSandboxFilter::default())
            .await
            .map_or(usize::MAX, |v| v.len()),
        containers: rt
            .list_containers(k8s_cri::v1::ContainerFilter::default())
            .await
            .map_or(usize::MAX, |v| v.len()),
        shims: processes_with("containerd-shim", Some(&socket)),
        runc_init: processes_with("runc init", None),
        pod_cgroups: cd.pod_cgroups().len(),
    }
}

/// `--pods N` above 100: N pods at once through the enforcer's pod runtime, then every
/// manifest deleted; the time to all Running and to all gone, the peak load, and what is
/// left behind once it has converged (it must be nothing).
async fn burst(cd: &Containerd, n: usize, poll: Duration) -> anyhow::Result<()> {
    let node = node_facts();
    let rt = Arc::new(CriRuntime::new(&cd.socket, Duration::from_secs(30)));
    let version = rt.version().await?;
    let manifests = cd.dir.join("manifests");
    let state = cd.dir.join("enforcer-state");
    std::fs::create_dir_all(&manifests)?;
    let opts = pod_runtime_options(cd, node, poll, &manifests, state);
    let status = StatusManager::default();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let enforcer_rt = Arc::new(CriRuntime::new(&cd.socket, Duration::from_secs(30)));
    let limit_view = enforcer_rt.clone();
    let task = tokio::spawn(run_pods_with(enforcer_rt, opts, status.clone(), async {
        let _ = stop_rx.await;
    }));
    let peak = Arc::new(std::sync::Mutex::new((0.0f64, usize::MAX, 0usize)));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(mut p) = peak.lock() {
                    p.0 = p.0.max(load1());
                    p.1 = p.1.min(limit_view.start_limit());
                    p.2 = p.2.max(limit_view.start_limit());
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let uids: Vec<String> = (0..n).map(|i| format!("burst-{i}")).collect();
    let t = Instant::now();
    for (i, uid) in uids.iter().enumerate() {
        write_manifest(
            &manifests,
            &format!("burst{i}.yaml"),
            &pod_yaml(&format!("burst{i}"), uid),
        )?;
    }
    let limit = Duration::from_secs(900);
    let every = Duration::from_millis(250);
    let up = wait_every(&status, "all running", limit, every, |s| {
        uids.iter().all(|u| s.get(u).is_some_and(|p| running(&p)))
    })
    .await;
    let to_running = t.elapsed();
    let t = Instant::now();
    for i in 0..n {
        std::fs::remove_file(manifests.join(format!("burst{i}.yaml")))?;
    }
    let down = wait_every(&status, "all gone", limit, every, |s| {
        uids.iter().all(|u| s.get(u).is_none())
    })
    .await;
    let to_gone = t.elapsed();
    // Converged: nothing of the burst left (up to a minute for shims to exit).
    let t = Instant::now();
    let mut left = leftovers(cd, &rt).await;
    while left.total() > 0 && t.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        left = leftovers(cd, &rt).await;
    }
    let converged = t.elapsed();
    sampler.abort();
    let _ = stop_tx.send(());
    task.await??;
    let (load, min_limit, max_limit) = peak.lock().map(|p| *p).unwrap_or_default();
    println!(
        "\n### A burst of {n} pods through the enforcer ({} {}, 2 cores)\n",
        version.runtime_name, version.runtime_version
    );
    println!(
        "| pods | to all Running (s) | to all gone (s) | then converged (s) | peak load (1 min) | start limit (min-max) | sandboxes | containers | shims | runc init | pod cgroups |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {n} | {} | {} | {} | {load:.1} | {min_limit}-{max_limit} | {} | {} | {} | {} | {} |",
        secs(to_running),
        secs(to_gone),
        secs(converged),
        left.sandboxes,
        left.containers,
        left.shims,
        left.runc_init,
        left.pod_cgroups
    );
    up?;
    down?;
    if left.total() > 0 {
        for line in process_lines("containerd-shim", Some(&cd.socket.display().to_string())) {
            eprintln!("left: {line}");
        }
        bail!("the burst left {left:?}");
    }
    Ok(())
}

async fn bench(cd: &Containerd, n: usize, rss_pods: usize, poll: Duration) -> anyhow::Result<()> {
    let node = node_facts();
    let rt = Arc::new(CriRuntime::new(&cd.socket, Duration::from_secs(30)));
    let version = rt.version().await?;
    let direct = Arc::new(Direct {
        rt: rt.clone(),
        cgroups: Arc::new(PodCgroups::new(&cd.cgroup_root, layout())),
        node,
    });
    // Warm-up: one pod each way, not counted (first snapshot, shim binary in the page cache).
    direct_run(&direct, 1, false, "warm").await?;

    let d_seq = direct_run(&direct, n, false, "dseq").await?;
    let d_par = direct_run(&direct, n, true, "dpar").await?;

    let manifests = cd.dir.join("manifests");
    let state = cd.dir.join("enforcer-state");
    std::fs::create_dir_all(&manifests)?;
    let opts = pod_runtime_options(cd, node, poll, &manifests, state);
    let status = StatusManager::default();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let enforcer_rt = Arc::new(CriRuntime::new(&cd.socket, Duration::from_secs(30)));
    let task = tokio::spawn(run_pods_with(enforcer_rt, opts, status.clone(), async {
        let _ = stop_rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let measured = async {
        enforcer_run(&status, &manifests, 1, false, "ewarm").await?;
        let e_seq = enforcer_run(&status, &manifests, n, false, "eseq").await?;
        let e_par = enforcer_run(&status, &manifests, n, true, "epar").await?;
        anyhow::Ok((e_seq, e_par))
    }
    .await;
    let _ = stop_tx.send(());
    task.await??;
    let (e_seq, e_par) = measured?;

    println!(
        "\n### Pods through the enforcer vs direct CRI ({n} pods, {} {}, 2 cores)\n",
        version.runtime_name, version.runtime_version
    );
    println!(
        "Same work per pod on both sides (pod cgroup, image status, sandbox, container, stop, remove); \
         the enforcer's manifest poll is {} ms, its relist 1 s.\n",
        poll.as_millis()
    );
    println!(
        "| mode | phase | direct CRI (s) | direct pods/s | enforcer (s) | enforcer pods/s | enforcer overhead |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (mode, d, e) in [("sequential", d_seq, e_seq), ("parallel", d_par, e_par)] {
        for (phase, dd, ee) in [
            ("start", d.start, e.start),
            ("stop", d.stop, e.stop),
            ("start + stop", d.total(), e.total()),
        ] {
            println!(
                "| {mode} | {phase} | {} | {} | {} | {} | {} |",
                secs(dd),
                pps(n, dd),
                secs(ee),
                pps(n, ee),
                overhead(dd, ee)
            );
        }
    }

    match daemon_rss(cd, rss_pods).await {
        Ok(f) => {
            println!("\n### The daemon (`enforcer run`) with {} pods\n", f.pods);
            println!(
                "| pods | to all Running (s) | RSS idle, 0 pods (MiB) | RSS with pods (MiB) | peak RSS (MiB) | CPU with pods (% of a core) | to all gone (s) |"
            );
            println!("|---|---|---|---|---|---|---|");
            println!(
                "| {} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {} |",
                f.pods,
                secs(f.to_running),
                f.idle_rss_kib as f64 / 1024.0,
                f.rss_kib as f64 / 1024.0,
                f.hwm_kib as f64 / 1024.0,
                f.cpu_pct,
                secs(f.to_gone)
            );
        }
        Err(e) => {
            println!("\n### The daemon (`enforcer run`)\n\nnot measured: {e:#}");
            return Err(e);
        }
    }
    Ok(())
}

/// `--pull`: `n` pods, each of its own image in a real registry (Debian's `docker-registry` on
/// loopback with TLS, `enforcer_tests::registry`), all at once: direct CRI (`PullImage` then
/// the pod, every pod in parallel) versus the enforcer's pod runtime with kubelet's defaults
/// (`serializeImagePulls`, `registryPullQPS` 5, `registryBurst` 10: pulls past the burst fail
/// with `pull QPS exceeded` and wait their backoff, as on kubelet) and with parallel,
/// unthrottled pulls. Each row its own images (none present before).
async fn pull_bench(cd: &Containerd, n: usize, poll: Duration) -> anyhow::Result<()> {
    use enforcer::cri::images::{ImageManager, ImageOptions};
    use enforcer_tests::registry::{OciImage, Registries};
    let dir = tempfile::tempdir()?;
    let regs = Registries::start(dir.path())?;
    regs.write_hosts(&cd.certs_dir())?;
    let rows = ["direct", "kubelet", "parallel"];
    let t = Instant::now();
    for row in rows {
        for i in 0..n {
            let seed = u64::try_from(i).unwrap_or(0) + 1000 * u64::try_from(row.len()).unwrap_or(0);
            regs.tls.push(
                &format!("{row}{i}"),
                "v1",
                &OciImage::busybox(1 << 20, seed)?,
            )?;
        }
    }
    eprintln!("pushed {} images in {:?}", rows.len() * n, t.elapsed());
    let image = |row: &str, i: usize| regs.tls.reference(&format!("{row}{i}"), "v1");
    let node = node_facts();
    let rt = Arc::new(CriRuntime::new(&cd.socket, Duration::from_secs(120)));
    let direct = Arc::new(Direct {
        rt: rt.clone(),
        cgroups: Arc::new(PodCgroups::new(&cd.cgroup_root, layout())),
        node,
    });
    // Direct: pull and start every pod at once.
    let t = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..n {
        let d = direct.clone();
        let img = image("direct", i);
        set.spawn(async move {
            d.rt.pull_image(&img, None, None).await?;
            let text = image_pod_yaml(&format!("direct{i}"), &format!("direct-{i}"), &img);
            let pod = enforcer::sources::parse_manifest(Path::new("/bench.yaml"), &text, NODE)?
                .pop()
                .context("no pod")?;
            d.start_one(&pod).await
        });
    }
    let mut ids = Vec::new();
    while let Some(r) = set.join_next().await {
        ids.push(r??);
    }
    let direct_time = t.elapsed();
    for (uid, sid, cid) in &ids {
        direct.stop_one(uid, sid, cid).await?;
    }
    let mut results = vec![("direct CRI, parallel pulls", direct_time)];
    for (row, label, serialize, qps) in [
        (
            "kubelet",
            "enforcer, kubelet's defaults (serialized, QPS 5, burst 10)",
            true,
            5,
        ),
        (
            "parallel",
            "enforcer, parallel pulls, no QPS limit",
            false,
            0,
        ),
    ] {
        let manifests = cd.dir.join(format!("manifests-{row}"));
        let state = cd.dir.join(format!("state-{row}"));
        std::fs::create_dir_all(&manifests)?;
        let mut opts = pod_runtime_options(cd, node, poll, &manifests, state.clone());
        opts.images = Arc::new(ImageManager::new(&ImageOptions {
            serialize,
            qps,
            burst: 10,
            node_config: state.join("config.json"),
            ..Default::default()
        }));
        let status = StatusManager::default();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run_pods_with(
            Arc::new(CriRuntime::new(&cd.socket, Duration::from_secs(120))),
            opts,
            status.clone(),
            async {
                let _ = stop_rx.await;
            },
        ));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let uids: Vec<String> = (0..n).map(|i| format!("{row}-{i}")).collect();
        let t = Instant::now();
        for (i, uid) in uids.iter().enumerate() {
            write_manifest(
                &manifests,
                &format!("{row}{i}.yaml"),
                &image_pod_yaml(&format!("{row}{i}"), uid, &image(row, i)),
            )?;
        }
        let measured = wait_every(
            &status,
            "all running",
            Duration::from_secs(600),
            Duration::from_millis(5),
            |s| uids.iter().all(|u| s.get(u).is_some_and(|p| running(&p))),
        )
        .await
        .map(|()| t.elapsed());
        for i in 0..n {
            std::fs::remove_file(manifests.join(format!("{row}{i}.yaml")))?;
        }
        let gone = wait_until(&status, "all gone", Duration::from_secs(120), |s| {
            uids.iter().all(|u| s.get(u).is_none())
        })
        .await;
        let _ = stop_tx.send(());
        task.await??;
        gone?;
        results.push((label, measured?));
    }
    let version = rt.version().await?;
    println!(
        "\n### Pods with their images pulled from a registry ({n} pods, one 1 MiB-layer image each, {} {}, docker-registry over TLS on loopback, 2 cores)\n",
        version.runtime_name, version.runtime_version
    );
    println!("| mode | to all Running (s) | pods/s | vs direct CRI |");
    println!("|---|---|---|---|");
    let base = direct_time.as_secs_f64();
    for (label, d) in results {
        let s = d.as_secs_f64();
        println!(
            "| {label} | {s:.2} | {:.1} | {:.2}x |",
            n as f64 / s,
            s / base
        );
    }
    Ok(())
}
