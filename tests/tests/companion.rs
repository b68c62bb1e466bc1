//! Companion mode beside a kubelet-shaped node: the pods run on the private containerd under
//! cgroup trees named exactly as kubelet names them for the run's driver (the enforcer's own
//! pod runtime stands in for kubelet: kubelet's labels, annotations, pod cgroups and
//! `oom_score_adj` formula), kubelet's configuration is a file, and the companion
//! (`DaemonOptions::companion`) runs beside it with no pod of its own.
//!
//! - Under memory pressure the companion kills the pod kubelet's ranking names (over its
//!   request and of a lower priority, though the other pod holds more memory), the API shows
//!   kubelet's eviction status and `Evicted` event, and no cgroup limit was written.
//! - Without an API server it ranks by what the node knows (the priority annotation) and stops
//!   the victim's sandbox through CRI.
//! - A kernel OOM kill on a node whose `oom_score_adj` the companion aligned kills the pod
//!   kubelet ranks first, where kubelet's own values let the kernel kill the other.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use enforcer::{
    config::ConfigArgs,
    cri::CriRuntime,
    daemon::{CompanionMode, DaemonOptions},
    policy::{pod_status::ContainerState, qos::QosClass},
};
use enforcer_tests::{
    Daemon,
    containerd::Containerd,
    fake_api::{FakeApi, Kind},
    kubelet::{Kubelet, grower, holder, pod_json},
    layout,
    node::wait_until,
    pods::{self, NODE},
};
use serde_json::{Value, json};

/// One scenario at a time: they share the machine's memory.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const VICTIM: &str = "cmp-victim-0001";
const KEEPER: &str = "cmp-keeper-0002";

/// Holds `mib` MiB in the container's main process, `dd` with one block of that size read
/// from /dev/zero and written to a FIFO nobody reads (one allocation: no transient peak, no
/// copy); a kernel OOM kill of it ends the container (exit 137), as a real workload's would.
fn oom_holder(mib: u32) -> String {
    format!(
        "mkfifo /tmp/hold; sleep 3600 < /tmp/hold & exec dd if=/dev/zero bs={} count=1 > /tmp/hold",
        u64::from(mib) << 20
    )
}

/// kubelet's configuration file for `cd`'s node, and the companion's configuration read
/// from it (`--kubelet-config`) with its own flags.
fn companion_config(
    cd: &Containerd,
    hard: &str,
    capacity: Option<&str>,
) -> enforcer::config::Config {
    let statics = cd.dir.join("kubelet-manifests");
    std::fs::create_dir_all(&statics).expect("static pod dir");
    let file = cd.dir.join("kubelet-config.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: {}\ncgroupRoot: {}\nstaticPodPath: {}\nevictionHard:\n  memory.available: {hard}\nevictionSoft:\n  memory.available: 900Mi\nevictionSoftGracePeriod:\n  memory.available: 1s\nevictionPressureTransitionPeriod: 5s\n",
            cd.driver.as_str(),
            cd.cgroup_root,
            statics.display()
        ),
    )
    .expect("kubelet config");
    let args = ConfigArgs {
        kubelet_config: Some(file),
        cri_socket: Some(cd.socket.clone()),
        state_dir: Some(cd.dir.join("companion-state")),
        http_address: Some("127.0.0.1:0".to_owned()),
        hostname_override: Some(NODE.to_owned()),
        node_capacity: capacity.map(|c| vec![c.to_owned()]).unwrap_or_default(),
        ..ConfigArgs::default()
    };
    let loaded = enforcer::config::load(&args).expect("the companion's configuration");
    assert_eq!(
        loaded.config.cgroup_driver, cd.driver,
        "kubelet's driver is read"
    );
    assert_eq!(
        loaded.config.enforcer.manifest_dir,
        cd.dir.join("kubelet-manifests"),
        "kubelet's staticPodPath is the static pod directory"
    );
    loaded.config
}

fn start_companion(config: enforcer::config::Config, kubeconfig: Option<PathBuf>) -> Daemon {
    Daemon::start_with(DaemonOptions {
        config,
        watches: vec![],
        run_pods: false,
        static_pods: false,
        kubeconfig,
        companion: Some(CompanionMode { soft: false }),
    })
}

fn memory_dir(rel: &str) -> PathBuf {
    let l = layout();
    let (mount, _) = l.controller("memory").expect("a memory controller");
    mount.join(rel.trim_start_matches('/'))
}

/// The kubepods cgroup's memory limit files, as text (what the companion must not change).
fn kubepods_limits(cd: &Containerd) -> Vec<(String, String)> {
    let dir = memory_dir(&cd.kubepods_path());
    ["memory.max", "memory.high", "memory.limit_in_bytes"]
        .iter()
        .filter_map(|f| {
            std::fs::read_to_string(dir.join(f))
                .ok()
                .map(|v| ((*f).to_owned(), v.trim().to_owned()))
        })
        .collect()
}

fn populated(cd: &Containerd, uid: &str) -> bool {
    !pod_pids(cd, uid).is_empty()
}

/// The processes in a Burstable pod's cgroups (the pod's and its containers').
fn pod_pids(cd: &Containerd, uid: &str) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        out.extend(procs.lines().map(str::to_owned));
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&e.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &memory_dir(&cd.pod_path(QosClass::Burstable, uid)),
        &mut out,
    );
    out
}

/// A `/proc/<pid>/status` field in kB (`RssAnon:`, ...), 0 when absent.
fn status_kb(status: &str, key: &str) -> i64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The companion's kill record of `uid`.
fn kill_record(state: &Path, uid: &str) -> Option<enforcer::kills::KillRecord> {
    let (recs, _) = enforcer::kills::read(state).ok()?;
    recs.into_iter().rev().find(|r| r.uid == uid)
}

/// Prints the record's chain (kernel event, received, decided, SIGKILL), checks its order and
/// that it says what kubelet would have done.
fn check_record(state: &Path, uid: &str) {
    // The record is written just after the kill (under emulation, a while after).
    let deadline = std::time::Instant::now() + enforcer_tests::scaled(Duration::from_secs(10));
    let r = loop {
        if let Some(r) = kill_record(state, uid) {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no kill record of {uid}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let chain = r.chain();
    eprintln!("companion kill of {uid}: {chain:?}");
    assert!(
        chain.windows(2).all(|w| w[0].1 <= w[1].1),
        "the chain is in order: {chain:?}"
    );
    assert!(
        r.sigkill_ns.is_some(),
        "a hard memory threshold kills first: {r:?}"
    );
    let first = chain.first().map_or(0, |c| c.1);
    if let Some(k) = r.sigkill_ns {
        eprintln!(
            "companion: first record -> SIGKILL {:.2} ms",
            (k.saturating_sub(first)) as f64 / 1e6
        );
    }
    assert!(
        r.kubelet.as_deref().is_some_and(|k| k.contains("10 s")),
        "the record says what kubelet would have done: {r:?}"
    );
    // Where this kernel takes the crossing check by default (fexit or a kprobe on the memory
    // charge path: the VM's 6.1 has both; this host's 6.18 neither), the companion's trigger
    // is the crossing record itself, with the page counter at or past its level: on cgroup v2
    // no reclaim has to come first.
    let check = enforcer::kernel::ebpf::probe_crossing(enforcer::kernel::CrossingMode::Auto)
        .ok()
        .and_then(|c| c.chosen);
    eprintln!("companion: the crossing check here: {check:?}");
    if check.is_some() {
        let t = r.trigger.as_ref();
        assert_eq!(
            t.map(|t| (t.kind.as_str(), t.source.as_str())),
            Some(("memoryThreshold", "ebpf")),
            "the crossing record triggered the kill: {r:?}"
        );
        assert!(
            t.and_then(|t| t.usage_bytes.zip(t.threshold_bytes))
                .is_some_and(|(u, l)| u >= l),
            "at or past its level: {r:?}"
        );
    }
    assert_eq!(
        r.candidates.first().map(|c| c.uid.as_str()),
        Some(uid),
        "kubelet's ranking names the victim first: {r:?}"
    );
}

/// Runs the keeper (more memory, under its large request, higher priority) and the victim
/// (over its small request, growing) until the companion acts.
async fn pressure_scenario(cd: &Containerd, kubelet: &Kubelet, submit: &dyn Fn(&Value)) {
    submit(&pod_json("keeper", KEEPER, 1000, "700Mi", &holder(400)));
    wait_until("keeper running", Duration::from_secs(60), || {
        kubelet.running(KEEPER)
    })
    .await;
    // The keeper holds its memory before the victim starts growing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    submit(&pod_json("victim", VICTIM, 0, "10Mi", &grower(600)));
    wait_until("victim running", Duration::from_secs(60), || {
        kubelet.running(VICTIM)
    })
    .await;
    wait_until(
        "the victim's processes killed by the companion",
        Duration::from_secs(90),
        || !populated(cd, VICTIM),
    )
    .await;
    assert!(populated(cd, KEEPER), "the keeper's processes are alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn companion_evicts_kubelets_choice_and_the_api_shows_kubelets_eviction() {
    let _serial = SERIAL.lock().await;
    enforcer_tests::capture_logs();
    let mut cd = Containerd::start("companion-api");
    let fake = FakeApi::start().await;
    let kubeconfig = fake.kubeconfig(&cd.dir);
    let mut kubelet = Kubelet::start(&cd, Some(kubeconfig.clone()));
    let config = companion_config(&cd, "300Mi", Some("memory=1Gi"));
    let state = config.enforcer.state_dir.clone();
    // The kubepods cgroup exists once the stand-in made its first pod's; its limits are
    // compared at the end.
    let submit = |p: &Value| {
        fake.put_pod(p.clone());
    };
    submit(&pod_json("keeper", KEEPER, 1000, "700Mi", &holder(400)));
    wait_until("keeper running", Duration::from_secs(60), || {
        kubelet.running(KEEPER)
    })
    .await;
    let limits_before = kubepods_limits(&cd);
    let companion = start_companion(config, Some(kubeconfig));
    pressure_scenario(&cd, &kubelet, &|p| {
        if p["metadata"]["uid"] != KEEPER {
            fake.put_pod(p.clone());
        }
    })
    .await;
    check_record(&state, VICTIM);
    // kubelet's eviction status, through pods/status.
    wait_until(
        "the victim's eviction status in the API",
        Duration::from_secs(30),
        || {
            fake.get(Kind::Pod, "default", "victim")
                .is_some_and(|p| p["status"]["reason"] == "Evicted")
        },
    )
    .await;
    let pod = fake.get(Kind::Pod, "default", "victim").expect("victim");
    assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
    let message = pod["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("The node was low on resource: memory. "),
        "{message}"
    );
    let conditions = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let dt = conditions
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
        .unwrap_or_else(|| panic!("DisruptionTarget: {conditions:?}"));
    assert_eq!(dt["status"], "True");
    assert_eq!(dt["reason"], "TerminationByKubelet");
    let keeper = fake.get(Kind::Pod, "default", "keeper").expect("keeper");
    assert_ne!(keeper["status"]["reason"], "Evicted", "{keeper}");
    // The Evicted event, with kubelet's reason and the kill record's annotation.
    let ev = fake.evicted_event(VICTIM).await;
    assert_eq!(ev["type"], "Warning");
    assert!(
        ev["metadata"]["annotations"]["enforcer/kill-record"].is_string(),
        "{ev}"
    );
    // What the companion never does: a cgroup limit, the Node, its Lease, a pod of its own.
    assert_eq!(
        kubepods_limits(&cd),
        limits_before,
        "no cgroup limit written"
    );
    let writes: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| r.method != "GET")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        writes.iter().all(|w| !w.contains("/nodes")
            && !w.contains("/leases")
            && !w.starts_with("POST /api/v1/namespaces/default/pods ")),
        "the companion writes only pod status and events: {writes:?}"
    );
    companion.stop().await;
    kubelet.stop().await;
    cd.remove_all_pods().await;
    cd.teardown();
}

/// Without an API server: the pods from the runtime's sandboxes (kubelet's labels, the
/// priority annotation), the victim's sandbox stopped through CRI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn companion_without_an_api_server_ranks_by_the_node_and_stops_the_sandbox() {
    let _serial = SERIAL.lock().await;
    enforcer_tests::capture_logs();
    let mut cd = Containerd::start("companion-cri");
    let kubelet = Kubelet::start(&cd, None);
    let config = companion_config(&cd, "300Mi", Some("memory=1Gi"));
    let state = config.enforcer.state_dir.clone();
    // The binary as deploy/companion runs it: `--companion --kubelet-config`, root with only
    // the DaemonSet's capabilities.
    let companion = CompanionProcess::start(&cd, "memory=1Gi");
    pressure_scenario(&cd, &kubelet, &|p| {
        let name = p["metadata"]["name"].as_str().unwrap_or("pod");
        pods::write_manifest(&cd, &format!("{name}.yaml"), &p.to_string());
    })
    .await;
    check_record(&state, VICTIM);
    let cri = CriRuntime::new(&cd.socket, Duration::from_secs(5));
    wait_until(
        "the victim's sandbox stopped",
        Duration::from_secs(30),
        || {
            let sandboxes = sandboxes_now(&cri);
            sandboxes
                .iter()
                .filter(|s| {
                    s.labels.get("io.kubernetes.pod.uid").map(String::as_str) == Some(VICTIM)
                })
                .all(|s| s.state != k8s_cri::v1::PodSandboxState::SandboxReady as i32)
        },
    )
    .await;
    let mut kubelet = kubelet;
    companion.stop();
    kubelet.stop().await;
    cd.remove_all_pods().await;
    cd.teardown();
}

/// The companion's flags for `cd`'s node: kubelet's file, the runtime, a state directory.
fn node_args(cd: &Containerd, state: &str) -> [String; 3] {
    [
        format!(
            "--kubelet-config={}",
            cd.dir.join("kubelet-config.yaml").display()
        ),
        format!("--cri-socket={}", cd.socket.display()),
        format!("--state-dir={}", cd.dir.join(state).display()),
    ]
}

/// `enforcer run --companion` as a process, root with only the DaemonSet's capabilities (its
/// bounding set: root's permitted set after exec).
struct CompanionProcess {
    child: std::process::Child,
    log: PathBuf,
}

impl CompanionProcess {
    fn start(cd: &Containerd, capacity: &str) -> Self {
        Self::start_on(cd, capacity, Some("127.0.0.1:0"))
    }

    /// [`Self::start`] with `--http-address` as given (none: the companion's default).
    fn start_on(cd: &Containerd, capacity: &str, http: Option<&str>) -> Self {
        let bin = enforcer_tests::enforcer_binary();
        // SYS_ADMIN is there for kernels whose perf_event_paranoid is 3 (Debian's patch asks
        // it for perf_event_open); below, the companion runs without it.
        let paranoid: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(3);
        let caps: Vec<String> = enforcer_tests::companion_daemonset_capabilities()
            .iter()
            .map(|c| c.to_lowercase())
            .filter(|c| paranoid > 2 || c != "sys_admin")
            .collect();
        let bounding = std::iter::once("-all".to_owned())
            .chain(caps.iter().map(|c| format!("+{c}")))
            .collect::<Vec<_>>()
            .join(",");
        let log = cd.dir.join("companion.log");
        let mut cmd = std::process::Command::new("setpriv");
        cmd.arg(format!("--bounding-set={bounding}"))
            .arg("--")
            .arg(&bin)
            // eBPF only: a missing capability fails the start instead of falling back.
            .args(["run", "--companion", "--signal-source=ebpf"])
            .args(node_args(cd, "companion-state"))
            .args(http.map(|a| format!("--http-address={a}")))
            .arg(format!("--hostname-override={NODE}"))
            .arg(format!("--node-capacity={capacity}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("companion log"));
        let child = cmd
            .spawn()
            .expect("setpriv (util-linux) runs the companion");
        eprintln!(
            "companion under setpriv --bounding-set={bounding} (perf_event_paranoid {paranoid})"
        );
        let mut me = Self { child, log };
        // Started: its signal pipeline runs (eBPF only), or it ended (the test fails now).
        let deadline = std::time::Instant::now() + enforcer_tests::scaled(Duration::from_secs(60));
        loop {
            let text = std::fs::read_to_string(&me.log).unwrap_or_default();
            if text.contains("signal pipeline started") {
                break;
            }
            let ended = me.child.try_wait().ok().flatten();
            assert!(
                ended.is_none() && std::time::Instant::now() < deadline,
                "the companion did not start its signal pipeline ({ended:?}): {text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        me
    }

    /// Stops it (SIGTERM); it must still have been running, and end cleanly.
    fn stop(mut self) {
        let log = || std::fs::read_to_string(&self.log).unwrap_or_default();
        assert!(
            matches!(self.child.try_wait(), Ok(None)),
            "the companion ended early: {}",
            log()
        );
        let pid = i32::try_from(self.child.id()).expect("pid");
        enforcer_tests::kill(pid, rustix::process::Signal::TERM);
        let status = self.child.wait().expect("wait");
        let text = log();
        assert!(
            status.success(),
            "the companion ended with {status}: {text}"
        );
        // The crossing check's start line names the attach points this kernel refused (this
        // host's 6.18 refuses fexit with EPERM whatever the caller's privileges): not a
        // permission the companion lacks.
        let lacked = text
            .lines()
            .filter(|l| !l.contains("crossing check"))
            .any(|l| l.contains("Operation not permitted") || l.contains("EPERM"));
        assert!(!lacked, "the companion lacked a permission: {text}");
    }
}

impl CompanionProcess {
    /// Kills it (SIGKILL), as an OOM kill or a node's crash would: nothing runs at its end.
    fn kill(mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            enforcer_tests::kill(pid, rustix::process::Signal::KILL);
        }
        let _ = self.child.wait();
    }
}

impl Drop for CompanionProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            eprintln!(
                "the companion's log, last lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if let Ok(None) = self.child.try_wait() {
            if let Ok(pid) = i32::try_from(self.child.id()) {
                enforcer_tests::kill(pid, rustix::process::Signal::KILL);
            }
            let _ = self.child.wait();
        }
    }
}

/// The runtime's sandboxes, listed from a synchronous check.
fn sandboxes_now(cri: &CriRuntime) -> Vec<k8s_cri::v1::PodSandbox> {
    use enforcer::cri::ContainerRuntime as _;
    tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current()
            .block_on(cri.list_pod_sandboxes(k8s_cri::v1::PodSandboxFilter::default()))
    })
    .unwrap_or_default()
}

/// Whether a Burstable pod's [`oom_holder`] holds its `mib` MiB (its `dd`'s anonymous memory).
fn holding(cd: &Containerd, uid: &str, mib: i64) -> bool {
    pod_pids(cd, uid).iter().any(|pid| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status_kb(&status, "RssAnon:") >> 10 >= mib
    })
}

/// The kernel's badness of a pod's container processes in an OOM domain of `unit` pages per
/// `oom_score_adj` point (`mm/oom_kill.c`), its highest task's.
fn badness(cd: &Containerd, uid: &str, unit: i64) -> i64 {
    let mut best = i64::MIN;
    for pid in pod_pids(cd, uid) {
        let adj: i64 = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if adj <= -998 {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kb = |k: &str| status_kb(&status, k);
        let points =
            (kb("RssAnon:") + kb("RssFile:") + kb("RssShmem:") + kb("VmSwap:") + kb("VmPTE:")) / 4;
        best = best.max(points + adj * unit);
    }
    best
}

/// The `oom_score_adj` of each process of the pods (here the sandbox's too: this machine's
/// containerd cannot give it kubelet's -998), by PID.
fn adjs_by_pid(cd: &Containerd, uids: &[&str]) -> BTreeMap<String, i64> {
    uids.iter()
        .flat_map(|uid| pod_pids(cd, uid))
        .filter_map(|pid| {
            let adj = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).ok()?;
            Some((pid, adj.trim().parse().ok()?))
        })
        .collect()
}

/// The processes of `kubelet` (kubelet's values by PID) still alive whose value is not
/// kubelet's any more: (pid, kubelet's, now).
fn changed(kubelet: &BTreeMap<String, i64>) -> Vec<(String, i64, i64)> {
    kubelet
        .iter()
        .filter_map(|(pid, v)| {
            let now: i64 = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            (now != *v).then(|| (pid.clone(), *v, now))
        })
        .collect()
}

/// A kernel OOM kill in kubepods: kubelet's own values let the kernel pick the keeper (more
/// resident memory); aligned by the companion, the kernel kills the pod kubelet ranks first.
/// The companion gives kubelet's values back when it stops, and `enforcer restore-oom-scores`
/// does after a companion that was killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_oom_kill_follows_kubelets_ranking_once_aligned() {
    let _serial = SERIAL.lock().await;
    enforcer_tests::capture_logs();
    let mut cd = Containerd::start("companion-oom");
    let fake = FakeApi::start().await;
    let kubeconfig = fake.kubeconfig(&cd.dir);
    let mut kubelet = Kubelet::start(&cd, Some(kubeconfig.clone()));
    // No threshold the node reaches: only the kernel acts here.
    let config = companion_config(&cd, "1Mi", None);
    let state = config.enforcer.state_dir.clone();
    // The keeper's request just above what it holds: below its request (kubelet ranks it
    // last), yet kubelet's formula gives it nearly the victim's score on a small node.
    fake.put_pod(pod_json("keeper", KEEPER, 0, "200Mi", &oom_holder(150)));
    fake.put_pod(pod_json("victim", VICTIM, 0, "10Mi", &oom_holder(60)));
    wait_until("both pods running", Duration::from_secs(60), || {
        kubelet.running(KEEPER) && kubelet.running(VICTIM)
    })
    .await;
    // Both hold their memory (under emulation the shell takes tens of seconds to fill it).
    wait_until(
        "both pods hold their memory",
        Duration::from_secs(120),
        || holding(&cd, KEEPER, 145) && holding(&cd, VICTIM, 58),
    )
    .await;
    // The OOM domain: kubepods limited just above what it uses now.
    let kubepods = memory_dir(&cd.kubepods_path());
    let usage: i64 = ["memory.current", "memory.usage_in_bytes"]
        .iter()
        .find_map(|f| std::fs::read_to_string(kubepods.join(f)).ok())
        .and_then(|s| s.trim().parse().ok())
        .expect("kubepods usage");
    // 48 MiB of headroom over what kubepods is charged now; the grower below outgrows it and
    // whatever page cache the kernel could reclaim first.
    let stat = std::fs::read_to_string(kubepods.join("memory.stat")).unwrap_or_default();
    let cache: i64 = stat
        .lines()
        .find_map(|l| {
            l.strip_prefix("total_cache ")
                .or_else(|| l.strip_prefix("file "))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let limit = usage + (48 << 20);
    let grow_mib = u32::try_from(((cache >> 20) + 48 + 72) / 12 * 12).unwrap_or(240);
    // kubelet's allocatable enforcement limits kubepods: the OOM domain the companion aligns
    // for.
    let file = if kubepods.join("memory.max").exists() {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    let before = std::fs::read_to_string(kubepods.join(file)).expect("limit");
    std::fs::write(kubepods.join(file), limit.to_string()).expect("limit kubepods");
    let unit = (limit / 4096 / 1000).max(1);
    let (k, v) = (badness(&cd, KEEPER, unit), badness(&cd, VICTIM, unit));
    assert!(
        k > v,
        "with kubelet's values the kernel would kill the keeper ({k} > {v}): the test's premise"
    );
    // kubelet's values (the stand-in's, by kubelet's formula).
    let kubelet_adj = adjs_by_pid(&cd, &[KEEPER, VICTIM]);
    let companion = start_companion(config, Some(kubeconfig));
    wait_until(
        "the companion aligned the scores",
        Duration::from_secs(30),
        || {
            // The scores written, then the round's report (an earlier round's may be there).
            badness(&cd, VICTIM, unit) > badness(&cd, KEEPER, unit)
                && std::fs::read_to_string(state.join("companion.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                    .is_some_and(|r| r["kubeletOrder"].as_array().is_some_and(|o| o.len() == 2))
        },
    )
    .await;
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(state.join("companion.json")).expect("companion.json"),
    )
    .expect("report");
    assert_eq!(report["kubeletOrder"][0], VICTIM, "{report}");
    assert_eq!(
        report["inversions"].as_array().map(Vec::len),
        Some(0),
        "{report}"
    );
    // A Guaranteed pod (kubelet: -997, ranked last) grows past the limit: the kernel picks
    // among all of kubepods.
    let g_limit = format!("{}Mi", grow_mib + 64);
    let mut g = pod_json("grower", "cmp-grower-0003", 0, &g_limit, &grower(grow_mib));
    g["spec"]["containers"][0]["resources"] = json!({
        "requests": {"cpu": "100m", "memory": g_limit},
        "limits": {"cpu": "100m", "memory": g_limit},
    });
    fake.put_pod(g);
    // The kernel's kill ends the container, as the runtime reports it (`OOMKilled`, or
    // exit 137 when the runtime read no OOM event for the container itself: the OOM was
    // kubepods').
    let ended = |uid: &str| {
        kubelet.status.get(uid).is_some_and(|p| {
            p.container_statuses.iter().any(|c| {
                c.restart_count > 0
                    || [Some(&c.state), c.last_state.as_ref()]
                        .into_iter()
                        .flatten()
                        .any(|s| {
                            matches!(s, ContainerState::Terminated { reason, exit_code, .. }
                            if reason == "OOMKilled" || *exit_code == 137)
                        })
            })
        })
    };
    wait_until(
        "a kernel OOM kill in kubepods",
        Duration::from_secs(90),
        || ended(VICTIM) || ended(KEEPER),
    )
    .await;
    let _ = std::fs::write(kubepods.join(file), before.trim());
    assert!(
        !ended(KEEPER),
        "the kernel killed the keeper; kubelet ranks the victim first: {:?}; the victim: {:?}; {}",
        kubelet.status.get(KEEPER),
        kubelet.status.get(VICTIM).map(|p| p.container_statuses),
        std::fs::read_to_string(state.join("companion.json")).unwrap_or_default()
    );
    assert!(ended(VICTIM));
    // The keeper lives: its processes' values, changed by the alignment, can be checked.
    assert!(
        !changed(&kubelet_adj).is_empty(),
        "the alignment changed kubelet's values: {kubelet_adj:?}"
    );
    let record = state.join(enforcer::companion::oom::ORIGINALS_FILE);
    assert!(
        record.exists(),
        "kubelet's values are kept in the state directory"
    );
    // Stopped, the companion gives kubelet's values back and forgets its record.
    companion.stop().await;
    assert_eq!(
        changed(&kubelet_adj),
        vec![],
        "kubelet's values {kubelet_adj:?} back after the companion stopped (pid, kubelet's, now)"
    );
    assert!(!record.exists(), "the record goes with the values restored");
    // A companion killed (SIGKILL) restores nothing; `enforcer restore-oom-scores` does.
    let process = CompanionProcess::start(&cd, "memory=4Gi");
    wait_until(
        "the companion process aligned the scores",
        Duration::from_secs(30),
        || record.exists() && !changed(&kubelet_adj).is_empty(),
    )
    .await;
    process.kill();
    assert!(
        !changed(&kubelet_adj).is_empty(),
        "a killed companion restored nothing"
    );
    let out = std::process::Command::new(enforcer_tests::enforcer_binary())
        .args(["restore-oom-scores", "--state-dir"])
        .arg(&state)
        .output()
        .expect("enforcer restore-oom-scores");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("kubelet's oom_score_adj restored on"),
        "restore-oom-scores: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        changed(&kubelet_adj),
        vec![],
        "kubelet's values {kubelet_adj:?} back after restore-oom-scores (pid, kubelet's, now)"
    );
    assert!(!record.exists(), "{said}");
    kubelet.stop().await;
    cd.remove_all_pods().await;
    cd.teardown();
}

/// On a kubeadm node kube-proxy's health server holds `0.0.0.0:10256` (the companion's old
/// port) and kubelet 10248/10250/10255: the companion, given no address, starts beside them and
/// serves on its own port; given one of kubelet's, it refuses to start and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn companion_starts_beside_kube_proxys_port_and_never_takes_kubelets() {
    let _serial = SERIAL.lock().await;
    enforcer_tests::capture_logs();
    let kube_proxy = std::net::TcpListener::bind("0.0.0.0:10256").unwrap_or_else(|e| {
        panic!("holding kube-proxy's 0.0.0.0:10256 for the test: {e} (is something on it?)")
    });
    let mut cd = Containerd::start("companion-port");
    let mut kubelet = Kubelet::start(&cd, None);
    let _ = companion_config(&cd, "100Mi", Some("memory=1Gi"));
    let companion = CompanionProcess::start_on(&cd, "memory=1Gi", None);
    let log = std::fs::read_to_string(&companion.log).unwrap_or_default();
    assert!(
        log.contains("the HTTP port is 127.0.0.1:10266"),
        "the companion says its port: {log}"
    );
    let mut answer = (String::new(), String::new());
    wait_until(
        "the companion's /healthz on 127.0.0.1:10266",
        Duration::from_secs(30),
        || {
            answer = enforcer_tests::http_get("127.0.0.1:10266", "/healthz").unwrap_or_default();
            answer.0.contains(" 200")
        },
    )
    .await;
    eprintln!(
        "kube-proxy's 0.0.0.0:10256 held; the companion answers on 127.0.0.1:10266: {}",
        answer.0
    );
    companion.stop();
    drop(kube_proxy);
    // One of kubelet's ports: refused at start, naming it.
    let out = std::process::Command::new(enforcer_tests::enforcer_binary())
        .args(["run", "--companion", "--signal-source=poll"])
        .args(node_args(&cd, "refused-state"))
        .arg("--http-address=127.0.0.1:10250")
        .output()
        .expect("run the companion");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "kubelet's port was taken: {err}");
    assert!(
        err.contains("127.0.0.1:10250") && err.contains("kubelet"),
        "the refusal names the port and why: {err}"
    );
    eprintln!("--http-address=127.0.0.1:10250 refused: {}", err.trim());
    // The runtime's socket not mounted: the companion runs, and `/readyz` says what it lacks.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let log = cd.dir.join("no-socket.log");
    let [config, _, state] = node_args(&cd, "no-socket-state");
    let child = std::process::Command::new(enforcer_tests::enforcer_binary())
        .args(["run", "--companion", "--signal-source=poll"])
        .args([config, state])
        .arg(format!(
            "--cri-socket={}",
            cd.dir.join("not-mounted.sock").display()
        ))
        .arg(format!("--http-address={addr}"))
        .arg(format!("--hostname-override={NODE}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("run the companion");
    let no_socket = CompanionProcess { child, log };
    let mut ready = (String::new(), String::new());
    wait_until(
        "/readyz names the runtime the companion cannot reach",
        Duration::from_secs(60),
        || {
            ready = enforcer_tests::http_get(&addr, "/readyz").unwrap_or_default();
            ready
                .1
                .contains("runtime: the container runtime does not answer")
        },
    )
    .await;
    assert!(!ready.0.contains(" 200"), "not ready: {ready:?}");
    eprintln!(
        "no runtime socket: /readyz {} {}",
        ready.0.trim(),
        ready.1.trim()
    );
    no_socket.stop();
    kubelet.stop().await;
    cd.remove_all_pods().await;
    cd.teardown();
}
