//! Enforcement on the real kernel, cgroups and containerd: the daemon (`enforcer::daemon::run`)
//! runs a Guaranteed, a Burstable and a BestEffort pod under a test-owned cgroup root; their
//! pod cgroups hold exactly what `enforcer explain` says, the QoS tiers and kubepods are sized
//! as kubelet sizes them, every container process has the decided `oom_score_adj` (clamped
//! where the node forbids negative values, as here), the daemon runs at -999 (or the lowest
//! allowed), and a deleted pod's cgroups are removed.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use enforcer::{
    cli::explain::{ExplainArgs, explain},
    config::ConfigArgs,
    daemon::{DaemonOptions, run},
    kernel::Capabilities,
    policy::qos::QosClass,
    status_manager::{self, PodRecord},
};
use enforcer_tests::{Daemon, TestCgroup, containerd::Containerd, layout, swap::ZramSwap};

const MIB: i64 = 1 << 20;

thread_local! {
    /// The state directory of the running test (status dumped on a timeout).
    static STATE: std::cell::RefCell<Option<PathBuf>> = const { std::cell::RefCell::new(None) };
}

fn pod(name: &str, uid: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, uid: {uid}}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: busybox:local\n    imagePullPolicy: Never\n    command: [/bin/sleep, '3600']\n{resources}"
    )
}

/// A test node's files: the manifest and state directories (the status dumped on a timeout
/// comes from this state) and a KubeletConfiguration with `cgroupRoot` and `extra` lines.
struct Files {
    manifests: PathBuf,
    state: PathBuf,
    config_file: PathBuf,
}

impl Files {
    fn new(cd: &Containerd, extra: &str) -> Self {
        let manifests = cd.dir.join("manifests");
        let state = cd.dir.join("state");
        STATE.with(|s| *s.borrow_mut() = Some(state.clone()));
        std::fs::create_dir_all(&manifests).expect("manifest dir");
        let config_file = cd.dir.join("kubelet.yaml");
        std::fs::write(
            &config_file,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: {}\ncgroupDriver: {}\n{extra}",
                cd.cgroup_root,
                cd.driver.as_str()
            ),
        )
        .expect("config");
        Self {
            manifests,
            state,
            config_file,
        }
    }

    /// The daemon's flags: this config, containerd and directories, host network allowed,
    /// and only a memory threshold (these tests are not about pressure, and a build
    /// machine's disk may well be under kubelet's default nodefs/imagefs thresholds).
    fn args(&self, cd: &Containerd) -> ConfigArgs {
        ConfigArgs {
            config: Some(self.config_file.clone()),
            cri_socket: Some(cd.socket.clone()),
            manifest_dir: Some(self.manifests.clone()),
            state_dir: Some(self.state.clone()),
            http_address: Some("127.0.0.1:0".to_owned()),
            allow_host_namespaces: Some(true),
            eviction_hard: vec!["memory.available<100Mi".to_owned()],
            ..ConfigArgs::default()
        }
    }

    /// [`Files::args`] as `enforcer run` flags (for a daemon run as a child process).
    fn flags(&self, cd: &Containerd) -> Vec<String> {
        vec![
            format!("--config={}", self.config_file.display()),
            format!("--cri-socket={}", cd.socket.display()),
            format!("--manifest-dir={}", self.manifests.display()),
            format!("--state-dir={}", self.state.display()),
            "--http-address=127.0.0.1:0".to_owned(),
            "--allow-host-namespaces".to_owned(),
            "--eviction-hard=memory.available<100Mi".to_owned(),
            // Image GC only on a full disk (see `enforcer_tests::disk_neutral`).
            "--image-gc-high-threshold=100".to_owned(),
            "--image-gc-low-threshold=99".to_owned(),
        ]
    }
}

fn records(state: &Path) -> Vec<PodRecord> {
    status_manager::read(state)
        .map(|f| f.pods)
        .unwrap_or_default()
}

async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    // Stretched under emulation (the VM tier), as the shared harness's waits are.
    let timeout = enforcer_tests::scaled(timeout);
    let deadline = tokio::time::Instant::now() + timeout;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; pods: {}",
            STATE.with(|s| s
                .borrow()
                .as_ref()
                .map(|p| serde_json::to_string_pretty(&records(p)).unwrap_or_default())
                .unwrap_or_default())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_owned()
}

fn read_i64(p: &Path) -> i64 {
    read(p)
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `<mount of controller>/<rel>`.
fn dir_of(controller: &str, rel: &str) -> PathBuf {
    let l = layout();
    let (mount, _) = l
        .controller(controller)
        .unwrap_or_else(|| panic!("no {controller} controller"));
    mount.join(rel.trim_start_matches('/'))
}

fn is_v2(controller: &str) -> bool {
    matches!(
        layout().controller(controller),
        Some((_, enforcer::cgroup::CgroupVersion::V2))
    )
}

/// memory limit of a cgroup in bytes, `None` when unlimited.
fn memory_limit(rel: &str) -> Option<i64> {
    let dir = dir_of("memory", rel);
    if is_v2("memory") {
        let v = read(&dir.join("memory.max"));
        (v != "max").then(|| v.parse().unwrap_or(-1))
    } else {
        let v = read_i64(&dir.join("memory.limit_in_bytes"));
        // v1 reports "unlimited" as the page-rounded maximum.
        (v < (1 << 62)).then_some(v)
    }
}

/// (cpu.shares or the weight it maps to, CFS quota or None).
fn cpu_values(rel: &str) -> (i64, Option<i64>) {
    let dir = dir_of("cpu", rel);
    if is_v2("cpu") {
        let max = read(&dir.join("cpu.max"));
        let quota = max.split_whitespace().next().and_then(|q| q.parse().ok());
        (read_i64(&dir.join("cpu.weight")), quota)
    } else {
        let q = read_i64(&dir.join("cpu.cfs_quota_us"));
        (read_i64(&dir.join("cpu.shares")), (q > 0).then_some(q))
    }
}

fn shares_as_written(shares: i64) -> i64 {
    if is_v2("cpu") {
        let s = u64::try_from(shares).unwrap_or(2);
        i64::try_from(enforcer::policy::resources::cgroup::shares_to_weight(s)).unwrap_or(0)
    } else {
        shares
    }
}

fn pids_of(rel: &str) -> Vec<u32> {
    std::fs::read_to_string(dir_of("memory", rel).join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn oom_score_adj(pid: u32) -> i64 {
    read_i64(&PathBuf::from(format!("/proc/{pid}/oom_score_adj")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroups_and_oom_scores_match_explain_and_follow_the_pods() {
    let cd = Containerd::start("enforce");
    let caps = Capabilities::probe(&layout());
    // One configuration for the daemon and for `enforcer explain`.
    let files = Files::new(&cd, "systemReserved: {cpu: 500m, memory: 100Mi}\n");
    let (manifests, state, config_file) = (
        files.manifests.clone(),
        files.state.clone(),
        files.config_file.clone(),
    );
    let node_memory = 2048 * MIB;
    let pods = [
        (
            "guaranteed",
            "eeeeeeee-0000-0000-0000-000000000001",
            "    resources: {limits: {cpu: 500m, memory: 64Mi}}\n",
        ),
        (
            "burstable",
            "eeeeeeee-0000-0000-0000-000000000002",
            "    resources: {requests: {cpu: 200m, memory: 512Mi}, limits: {memory: 1Gi}}\n",
        ),
        ("besteffort", "eeeeeeee-0000-0000-0000-000000000003", ""),
    ];
    for (name, uid, res) in &pods {
        std::fs::write(manifests.join(format!("{name}.yaml")), pod(name, uid, res)).expect("write");
    }

    let args = ConfigArgs {
        node_capacity: vec!["memory=2Gi".to_owned()],
        ..files.args(&cd)
    };
    let config = enforcer::config::load(&enforcer_tests::disk_neutral(&args))
        .expect("configuration")
        .config;
    assert_eq!(config.cgroup_root, cd.cgroup_root);
    let daemon = Daemon::start(config);

    wait_until("three pods running", Duration::from_secs(60), || {
        let r = records(&state);
        pods.iter().all(|(n, ..)| {
            r.iter().any(|x| {
                x.name.starts_with(n)
                    && x.phase == "Running"
                    && x.container_statuses
                        .iter()
                        .all(|c| c.oom_score_adj.is_some())
            })
        })
    })
    .await;

    // The daemon's own score: kubelet's -999, or the lowest this node allows (0 here).
    let own = read_i64(Path::new("/proc/self/oom_score_adj"));
    assert_eq!(
        own,
        if caps.cap_sys_resource { -999 } else { 0 },
        "the daemon's oom_score_adj"
    );

    let floor = if caps.cap_sys_resource { -1000 } else { 0 };
    let recs = records(&state);
    for (name, _, _) in &pods {
        let out = explain(&ExplainArgs {
            pod: manifests.join(format!("{name}.yaml")),
            node_cpu: None,
            node_memory: Some(format!("{node_memory}")),
            cgroup_version: None,
            config: Some(config_file.clone()),
        })
        .expect("explain");
        let e: serde_json::Value = serde_json::from_str(&out[0]).expect("explain json");
        let parent = e["cgroupParent"].as_str().expect("cgroupParent").to_owned();
        let pc = &e["podCgroup"];
        // Pod cgroup values exactly as explained.
        assert_eq!(
            memory_limit(&parent),
            pc["memoryLimitBytes"].as_i64(),
            "{name} memory limit"
        );
        let (shares, quota) = cpu_values(&parent);
        assert_eq!(
            shares,
            shares_as_written(pc["cpuShares"].as_i64().expect("shares")),
            "{name} cpu shares"
        );
        assert_eq!(quota, pc["cpuQuotaMicros"].as_i64(), "{name} cpu quota");
        // Every container process has the decided score, clamped to what the node allows.
        let rec = recs
            .iter()
            .find(|r| r.name.starts_with(name))
            .expect("record");
        assert_eq!(rec.cgroup, parent, "{name} status names the pod cgroup");
        let decided = e["containers"][0]["oomScoreAdj"]
            .as_i64()
            .expect("oomScoreAdj");
        let want = decided.max(floor);
        let c = &rec.container_statuses[0];
        let id = c.container_id.rsplit("://").next().expect("container id");
        let pids = pids_of(&cd.container_path(&parent, id));
        assert!(
            !pids.is_empty(),
            "{name}: no processes in the container cgroup"
        );
        for pid in pids {
            assert_eq!(
                oom_score_adj(pid),
                want,
                "{name}: pid {pid} (decided {decided})"
            );
        }
        assert_eq!(c.oom_score_adj, Some(want), "{name} status");
        assert_eq!(
            c.oom_score_adj_decided,
            (want != decided).then_some(decided),
            "{name} clamp reported"
        );
    }
    // The classes keep their order: Guaranteed < Burstable < BestEffort.
    let score = |n: &str| {
        recs.iter()
            .find(|r| r.name.starts_with(n))
            .and_then(|r| r.container_statuses[0].oom_score_adj)
            .expect("score")
    };
    assert!(score("guaranteed") < score("burstable") && score("burstable") < score("besteffort"));

    // kubepods: allocatable (capacity minus systemReserved); the QoS tiers.
    let kubepods = cd.kubepods_path();
    assert_eq!(
        memory_limit(&kubepods),
        Some(node_memory - 100 * MIB),
        "kubepods memory limit"
    );
    let cpus =
        i64::try_from(std::thread::available_parallelism().map_or(1, |n| n.get())).unwrap_or(1);
    assert_eq!(
        cpu_values(&kubepods).0,
        shares_as_written((cpus * 1000 - 500) * 1024 / 1000),
        "kubepods shares"
    );
    assert_eq!(
        cpu_values(&cd.tier_path(QosClass::BestEffort)).0,
        shares_as_written(2),
        "besteffort tier"
    );
    assert_eq!(
        cpu_values(&cd.tier_path(QosClass::Burstable)).0,
        shares_as_written(204),
        "burstable tier"
    );

    // A deleted pod: its cgroups are removed in every hierarchy, the tier follows.
    std::fs::remove_file(manifests.join("burstable.yaml")).expect("delete");
    wait_until(
        "burstable pod cgroup removed",
        Duration::from_secs(30),
        || {
            !cd.pod_cgroups().iter().any(|p| {
                p.ends_with(
                    cd.pod_path(QosClass::Burstable, pods[1].1)
                        .trim_start_matches('/'),
                )
            })
        },
    )
    .await;
    wait_until(
        "burstable tier back to 2 shares",
        Duration::from_secs(15),
        || cpu_values(&cd.tier_path(QosClass::Burstable)).0 == shares_as_written(2),
    )
    .await;

    daemon.stop().await;
    cd.remove_all_pods().await;
    drop(cd);
}

/// The cpuset a container runs on (its cgroup in the cpuset hierarchy, v1 or v2).
fn cpuset_of(container: &str) -> String {
    let dir = dir_of("cpuset", container);
    let eff = dir.join("cpuset.cpus.effective");
    let p = if is_v2("cpuset") && eff.exists() {
        eff
    } else {
        dir.join("cpuset.cpus")
    };
    read(&p)
}

fn container_of(recs: &[PodRecord], name: &str) -> Option<(String, String)> {
    let r = recs
        .iter()
        .find(|r| r.name.starts_with(name) && r.phase == "Running")?;
    let id = r
        .container_statuses
        .first()?
        .container_id
        .rsplit("://")
        .next()?
        .to_owned();
    (!id.is_empty()).then(|| (r.cgroup.clone(), id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_manager_static_gives_an_exclusive_cpu_and_restores_it() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(cpus >= 2, "this test needs 2 cpus, the machine has {cpus}");
    let cd = Containerd::start("cpuman");
    let files = Files::new(&cd, "cpuManagerPolicy: static\nreservedSystemCPUs: '0'\n");
    let (manifests, state) = (files.manifests.clone(), files.state.clone());
    let shared_uid = "cccccccc-0000-0000-0000-000000000001";
    let pinned_uid = "cccccccc-0000-0000-0000-000000000002";
    std::fs::write(manifests.join("shared.yaml"), pod("shared", shared_uid, "")).expect("write");
    let args = files.args(&cd);
    let config = enforcer::config::load(&enforcer_tests::disk_neutral(&args))
        .expect("configuration")
        .config;
    let daemon = Daemon::start(config.clone());
    let all = format!("0-{}", cpus - 1);
    wait_until("shared pod on every cpu", Duration::from_secs(60), || {
        container_of(&records(&state), "shared")
            .is_some_and(|(p, id)| cpuset_of(&cd.container_path(&p, &id)) == all)
    })
    .await;

    // A Guaranteed pod with cpu 1: cpu 1 is its alone (cpu 0 is reserved), the shared pool
    // loses it, and the checkpoint says so in kubelet's format.
    std::fs::write(
        manifests.join("pinned.yaml"),
        pod(
            "pinned",
            pinned_uid,
            "    resources: {limits: {cpu: '1', memory: 64Mi}}\n",
        ),
    )
    .expect("write");
    wait_until("pinned pod on cpu 1", Duration::from_secs(60), || {
        container_of(&records(&state), "pinned")
            .is_some_and(|(p, id)| cpuset_of(&cd.container_path(&p, &id)) == "1")
    })
    .await;
    let shared_pool = if cpus == 2 {
        "0".to_owned()
    } else {
        format!("0,2-{}", cpus - 1)
    };
    wait_until("shared pod off cpu 1", Duration::from_secs(30), || {
        container_of(&records(&state), "shared")
            .is_some_and(|(p, id)| cpuset_of(&cd.container_path(&p, &id)) == shared_pool)
    })
    .await;
    let cp_path = state.join("cpu_manager_state");
    let cp = enforcer::policy::cpu::Checkpoint::from_json(&read(&cp_path)).expect("checkpoint");
    assert_eq!(cp.policy_name, "static");
    assert_eq!(cp.default_cpu_set, shared_pool);
    assert_eq!(
        cp.entries
            .as_ref()
            .and_then(|e| e.get(pinned_uid))
            .and_then(|m| m.get("app"))
            .map(String::as_str),
        Some("1")
    );

    // Deleted: cpu 1 goes back to the shared pool.
    std::fs::remove_file(manifests.join("pinned.yaml")).expect("delete");
    wait_until(
        "shared pod back on every cpu",
        Duration::from_secs(60),
        || {
            container_of(&records(&state), "shared")
                .is_some_and(|(p, id)| cpuset_of(&cd.container_path(&p, &id)) == all)
        },
    )
    .await;
    let cp = enforcer::policy::cpu::Checkpoint::from_json(&read(&cp_path)).expect("checkpoint");
    assert_eq!(
        (
            cp.default_cpu_set.as_str(),
            cp.entries.unwrap_or_default().len()
        ),
        (all.as_str(), 0)
    );

    daemon.stop().await;

    // A policy change against the checkpoint refuses to start.
    let mut none = config;
    none.cpu_manager_policy = enforcer::config::CpuManagerPolicy::None;
    let refused = run(
        DaemonOptions {
            config: none,
            watches: vec![],
            run_pods: true,
            static_pods: false,
            kubeconfig: None,
            companion: None,
        },
        async {},
    )
    .await;
    let e = refused.expect_err("a policy change is refused").to_string();
    assert!(
        e.contains("cpu_manager_state") && e.contains("differs"),
        "{e}"
    );

    cd.remove_all_pods().await;
    drop(cd);
}

/// The pod `uid`'s Running record and its container `name`'s (id, restart count).
fn container_named(state: &Path, uid: &str, name: &str) -> Option<(PodRecord, String, u32)> {
    let r = records(state)
        .into_iter()
        .find(|r| r.uid == uid && r.phase == "Running")?;
    let c = r.container_statuses.iter().find(|c| c.name == name)?;
    let id = c.container_id.rsplit("://").next()?.to_owned();
    let restarts = c.restart_count;
    (!id.is_empty()).then_some((r, id, restarts))
}

/// A two-container pod: `app` resized in place (no `resizePolicy`: NotRequired), `db` with
/// `resizePolicy` memory `RestartContainer`.
fn resizable_pod(uid: &str, app: &str, db: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: resize, uid: {uid}}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: busybox:local\n    imagePullPolicy: Never\n    command: [/bin/sleep, '3600']\n    resources: {app}\n  - name: db\n    image: busybox:local\n    imagePullPolicy: Never\n    command: [/bin/sleep, '3600']\n    resizePolicy: [{{resourceName: memory, restartPolicy: RestartContainer}}]\n    resources: {db}\n"
    )
}

/// In-place resize (KEP-1287) of a manifest pod: a changed manifest's cpu and memory are a
/// resize, not a new pod. Read back from the real cgroup files: the running container's
/// memory limit and CFS quota (and the pod cgroup's) change while its id and restart count
/// stay; growing and shrinking both; the container whose `resizePolicy` says
/// `RestartContainer` for memory is restarted with the new limit; the allocation is
/// checkpointed in kubelet's `allocated_pods_state` (read back by its decoder and checksum);
/// a resize beyond the node is `PodResizePending` / `Infeasible` and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_resize_changes_running_containers_without_a_restart() {
    let cd = Containerd::start("resize");
    let files = Files::new(&cd, "");
    let (manifests, state) = (files.manifests.clone(), files.state.clone());
    let uid = "abababab-0000-0000-0000-000000000001";
    let db = "{requests: {cpu: 100m, memory: 32Mi}, limits: {cpu: 100m, memory: 64Mi}}";
    let write = |app: &str, db: &str| {
        std::fs::write(manifests.join("resize.yaml"), resizable_pod(uid, app, db)).expect("write");
    };
    write(
        "{requests: {cpu: 100m, memory: 32Mi}, limits: {cpu: 200m, memory: 64Mi}}",
        db,
    );
    let config = enforcer::config::load(&enforcer_tests::disk_neutral(&files.args(&cd)))
        .expect("configuration")
        .config;
    let daemon = Daemon::start(config);
    let running = || {
        let (r, app, app_restarts) = container_named(&state, uid, "app")?;
        let (_, db, db_restarts) = container_named(&state, uid, "db")?;
        Some((r, app, app_restarts, db, db_restarts))
    };
    wait_until("the pod running", Duration::from_secs(60), || {
        running().is_some()
    })
    .await;
    let (rec, app_id, _, db_id, _) = running().expect("running");
    let pod_cg = rec.cgroup.clone();
    let app_cg = cd.container_path(&pod_cg, &app_id);
    let period = 100_000;
    assert_eq!(memory_limit(&app_cg), Some(64 * MIB));
    assert_eq!(cpu_values(&app_cg).1, Some(200 * period / 1000));
    assert_eq!(memory_limit(&pod_cg), Some(128 * MIB), "pod: 64Mi + 64Mi");

    // Grown: memory 64Mi -> 128Mi, cpu 200m -> 500m, in place.
    write(
        "{requests: {cpu: 200m, memory: 48Mi}, limits: {cpu: 500m, memory: 128Mi}}",
        db,
    );
    wait_until("app grown in place", Duration::from_secs(60), || {
        memory_limit(&app_cg) == Some(128 * MIB) && cpu_values(&app_cg).1 == Some(50_000)
    })
    .await;
    let (rec, app_now, app_restarts, db_now, _) = running().expect("running");
    assert_eq!(
        (app_now.as_str(), app_restarts),
        (app_id.as_str(), 0),
        "app not restarted"
    );
    assert_eq!(db_now, db_id, "db untouched");
    assert_eq!(rec.uid, uid, "the same pod");
    assert_eq!(memory_limit(&pod_cg), Some(192 * MIB), "pod: 128Mi + 64Mi");
    assert_eq!(
        cpu_values(&pod_cg).1,
        Some(60_000),
        "pod quota: 500m + 100m"
    );
    assert_eq!(
        cpu_values(&app_cg).0,
        shares_as_written(204),
        "app shares from its 200m request"
    );

    // Shrunk: memory 128Mi -> 96Mi, cpu 500m -> 300m.
    write(
        "{requests: {cpu: 200m, memory: 48Mi}, limits: {cpu: 300m, memory: 96Mi}}",
        db,
    );
    wait_until("app shrunk in place", Duration::from_secs(60), || {
        memory_limit(&app_cg) == Some(96 * MIB)
            && cpu_values(&app_cg).1 == Some(30_000)
            && memory_limit(&pod_cg) == Some(160 * MIB)
    })
    .await;
    let (_, app_now, app_restarts, ..) = running().expect("running");
    assert_eq!((app_now.as_str(), app_restarts), (app_id.as_str(), 0));

    // The allocation, in kubelet's checkpoint.
    let text = read(&state.join("allocated_pods_state"));
    let alloc = enforcer::policy::resize::checkpoint::from_json(&text).expect("checkpoint");
    let app = &alloc[uid].containers["app"];
    let limit = |k: &str| {
        app.limits
            .as_ref()
            .and_then(|l| l.get(k))
            .map(|q| q.0.clone())
    };
    assert_eq!(
        (limit("memory"), limit("cpu")),
        (Some("96Mi".into()), Some("300m".into()))
    );

    // db's memory policy is RestartContainer: restarted, with the new limit.
    let db2 = "{requests: {cpu: 100m, memory: 32Mi}, limits: {cpu: 100m, memory: 80Mi}}";
    write(
        "{requests: {cpu: 200m, memory: 48Mi}, limits: {cpu: 300m, memory: 96Mi}}",
        db2,
    );
    wait_until("db restarted with 80Mi", Duration::from_secs(60), || {
        running().is_some_and(|(_, _, _, db_now, restarts)| {
            db_now != db_id
                && restarts == 1
                && memory_limit(&cd.container_path(&pod_cg, &db_now)) == Some(80 * MIB)
        })
    })
    .await;
    let (_, app_now, app_restarts, ..) = running().expect("running");
    assert_eq!(
        (app_now.as_str(), app_restarts),
        (app_id.as_str(), 0),
        "app untouched"
    );

    // Beyond the node: pending, infeasible, nothing changed.
    write(
        "{requests: {cpu: 200m, memory: 4000Gi}, limits: {cpu: 300m, memory: 4000Gi}}",
        db2,
    );
    wait_until(
        "PodResizePending Infeasible",
        Duration::from_secs(60),
        || {
            records(&state).iter().any(|r| {
                r.uid == uid
                    && r.conditions.iter().any(|c| {
                        c.kind == "PodResizePending"
                            && c.reason == "Infeasible"
                            && c.message
                                .starts_with("Node didn't have enough capacity: memory")
                    })
            })
        },
    )
    .await;
    assert_eq!(
        memory_limit(&app_cg),
        Some(96 * MIB),
        "an infeasible resize changes nothing"
    );

    daemon.stop().await;
    cd.remove_all_pods().await;
    drop(cd);
}

/// In-place resize of pod-level resources (KEP-5419, beta and on in 1.36) of a manifest pod:
/// `app` sets no limit and runs with the pod's, `db` sets its own. Growing the pod-level
/// memory limit 96Mi -> 160Mi and cpu 300m -> 500m is taken in place, read back from the real
/// cgroup files: the pod cgroup's memory limit and CFS quota, `app`'s inherited ones (same
/// container, no restart), `db`'s untouched; the allocation checkpointed with its
/// `PodLevelResources`; the runtime told of each pod cgroup change (`UpdatePodSandboxResources`).
/// With MemoryQoS off, on cgroup v2, `app`'s stale `memory.high` is `max` after the resize
/// (kubelet 1.37's rollback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_level_resize_is_taken_in_place() {
    let cd = Containerd::start("plr");
    // MemoryQoS off (its gate is on by default in 1.37): on cgroup v2 the resize clears a
    // stale container `memory.high` to `max`, as kubelet 1.37's rollback does.
    let files = Files::new(&cd, "featureGates: {MemoryQoS: false}\n");
    let (manifests, state) = (files.manifests.clone(), files.state.clone());
    let uid = "abababab-0000-0000-0000-000000000002";
    let write = |pod_level: &str| {
        let manifest = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: plr, uid: {uid}}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  resources: {pod_level}\n  containers:\n  - name: app\n    image: busybox:local\n    imagePullPolicy: Never\n    command: [/bin/sleep, '3600']\n  - name: db\n    image: busybox:local\n    imagePullPolicy: Never\n    command: [/bin/sleep, '3600']\n    resources: {{requests: {{cpu: 50m, memory: 16Mi}}, limits: {{cpu: 100m, memory: 32Mi}}}}\n"
        );
        std::fs::write(manifests.join("plr.yaml"), manifest).expect("write");
    };
    write("{requests: {cpu: 200m, memory: 64Mi}, limits: {cpu: 300m, memory: 96Mi}}");
    let config = enforcer::config::load(&enforcer_tests::disk_neutral(&files.args(&cd)))
        .expect("configuration")
        .config;
    let daemon = Daemon::start(config);
    let running = || {
        let (r, app, app_restarts) = container_named(&state, uid, "app")?;
        let (_, db, _) = container_named(&state, uid, "db")?;
        Some((r, app, app_restarts, db))
    };
    wait_until("the pod running", Duration::from_secs(60), || {
        running().is_some()
    })
    .await;
    let (rec, app_id, _, db_id) = running().expect("running");
    let pod_cg = rec.cgroup.clone();
    let (app_cg, db_cg) = (
        cd.container_path(&pod_cg, &app_id),
        cd.container_path(&pod_cg, &db_id),
    );
    assert_eq!(memory_limit(&pod_cg), Some(96 * MIB), "the pod-level limit");
    assert_eq!(memory_limit(&app_cg), Some(96 * MIB), "app inherits it");
    assert_eq!(memory_limit(&db_cg), Some(32 * MIB), "db's own");
    assert_eq!(cpu_values(&pod_cg).1, Some(30_000));
    let high = dir_of("memory", &app_cg).join("memory.high");
    let v2 = is_v2("memory");
    if v2 {
        // What an earlier configuration (MemoryQoS on with a throttling factor) left.
        std::fs::write(&high, (80 * MIB).to_string()).expect("write memory.high");
        assert_eq!(read(&high), (80 * MIB).to_string());
    }

    write("{requests: {cpu: 200m, memory: 64Mi}, limits: {cpu: 500m, memory: 160Mi}}");
    wait_until("the pod grown in place", Duration::from_secs(60), || {
        memory_limit(&pod_cg) == Some(160 * MIB)
            && memory_limit(&app_cg) == Some(160 * MIB)
            && cpu_values(&pod_cg).1 == Some(50_000)
            && cpu_values(&app_cg).1 == Some(50_000)
    })
    .await;
    let (_, app_now, app_restarts, db_now) = running().expect("running");
    assert_eq!(
        (app_now.as_str(), app_restarts, db_now.as_str()),
        (app_id.as_str(), 0, db_id.as_str()),
        "no container restarted"
    );
    assert_eq!(
        memory_limit(&db_cg),
        Some(32 * MIB),
        "db keeps its own limit"
    );
    if v2 {
        assert_eq!(
            read(&high),
            "max",
            "the stale memory.high cleared by the resize"
        );
    }
    // The runtime was told of each pod cgroup change (CRI UpdatePodSandboxResources, kubelet
    // 1.36's order); containerd 1.x answers Unimplemented, which rejects nothing.
    let metrics =
        enforcer::metrics::encode(&[enforcer::metrics::global().registry()]).expect("metrics");
    let told = metrics
        .lines()
        .find(|l| {
            l.starts_with(
                "kubelet_runtime_operations_total{operation_type=\"update_podsandbox_resources\"}",
            )
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        told.is_some_and(|n| n >= 2.0),
        "the memory and the cpu steps told the runtime: {told:?}"
    );
    let text = read(&state.join("allocated_pods_state"));
    let alloc = enforcer::policy::resize::checkpoint::from_json(&text).expect("checkpoint");
    let pod_level = alloc[uid].pod.as_ref().expect("PodLevelResources");
    assert_eq!(
        pod_level
            .limits
            .as_ref()
            .and_then(|l| l.get("memory"))
            .map(|q| q.0.as_str()),
        Some("160Mi")
    );

    daemon.stop().await;
    cd.remove_all_pods().await;
    drop(cd);
}

/// Memory QoS as kubelet 1.37 has it (the gate on by default) on a pure cgroup v2 node, read
/// back from the real files: `memoryReservationPolicy: TieredReservation` gives the
/// Guaranteed container and pod `memory.min`, the Burstable ones `memory.low`, the burstable
/// tier `memory.low` and kubepods `memory.min` (kubelet's `setMemoryQoS` sums); the set
/// `memoryThrottlingFactor` gives the Burstable container `memory.high` (kubelet's formula,
/// page-aligned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_qos_on_real_files_v2only() {
    enforcer_tests::require_memory_v2("Memory QoS");
    let cd = Containerd::start("memqos");
    let files = Files::new(
        &cd,
        "memoryThrottlingFactor: 0.8\nmemoryReservationPolicy: TieredReservation\n",
    );
    let (manifests, state) = (files.manifests.clone(), files.state.clone());
    std::fs::write(
        manifests.join("burstable.yaml"),
        pod(
            "burstable",
            "dddddddd-0000-0000-0000-000000000001",
            "    resources: {requests: {memory: 64Mi}, limits: {memory: 256Mi}}\n",
        ),
    )
    .expect("write");
    std::fs::write(
        manifests.join("guaranteed.yaml"),
        pod(
            "guaranteed",
            "dddddddd-0000-0000-0000-000000000002",
            "    resources: {limits: {cpu: 100m, memory: 32Mi}}\n",
        ),
    )
    .expect("write");
    let args = ConfigArgs {
        node_capacity: vec!["memory=2Gi".to_owned()],
        ..files.args(&cd)
    };
    let config = enforcer::config::load(&enforcer_tests::disk_neutral(&args))
        .expect("configuration")
        .config;
    assert!(config.enforcer.memory_qos);
    let daemon = Daemon::start(config);
    wait_until("both pods running", Duration::from_secs(60), || {
        let r = records(&state);
        container_of(&r, "burstable").is_some() && container_of(&r, "guaranteed").is_some()
    })
    .await;
    let recs = records(&state);
    let (burstable_pod, burstable_id) = container_of(&recs, "burstable").expect("burstable");
    let (guaranteed_pod, guaranteed_id) = container_of(&recs, "guaranteed").expect("guaranteed");
    let memory = |rel: &str, file: &str| read(&dir_of("memory", rel).join(file));

    // Containers: Burstable memory.low = request, Guaranteed memory.min = request;
    // memory.high = request + (limit - request) * factor, rounded down to a page (kubelet's
    // float64 arithmetic); a Guaranteed container has no memory.high (request == limit).
    let container = cd.container_path(&burstable_pod, &burstable_id);
    assert_eq!(memory(&container, "memory.low"), (64 * MIB).to_string());
    assert_eq!(memory(&container, "memory.min"), "0");
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        reason = "kubelet computes memory.high in float64"
    )]
    let high =
        (((64 * MIB) as f64 + ((256 - 64) * MIB) as f64 * 0.8) / 4096.0).floor() as i64 * 4096;
    assert_eq!(memory(&container, "memory.high"), high.to_string());
    assert_eq!(memory(&container, "memory.max"), (256 * MIB).to_string());
    let g = cd.container_path(&guaranteed_pod, &guaranteed_id);
    assert_eq!(memory(&g, "memory.min"), (32 * MIB).to_string());
    assert_eq!(memory(&g, "memory.low"), "0");
    assert_eq!(memory(&g, "memory.high"), "max");
    // Pods, the burstable tier and kubepods: the sums of the requests below them.
    assert_eq!(memory(&burstable_pod, "memory.low"), (64 * MIB).to_string());
    assert_eq!(memory(&burstable_pod, "memory.min"), "0");
    assert_eq!(
        memory(&guaranteed_pod, "memory.min"),
        (32 * MIB).to_string()
    );
    let kubepods = cd.kubepods_path();
    wait_until(
        "tier memory.low and kubepods memory.min summed",
        Duration::from_secs(15),
        || {
            memory(&cd.tier_path(QosClass::Burstable), "memory.low") == (64 * MIB).to_string()
                && memory(&kubepods, "memory.min") == (96 * MIB).to_string()
        },
    )
    .await;
    assert_eq!(memory(&kubepods, "memory.low"), "0");
    // kubelet's alpha gauges of the totals.
    let metrics =
        enforcer::metrics::encode(&[enforcer::metrics::global().registry()]).expect("metrics");
    for want in [
        format!("kubelet_memory_qos_node_memory_min_bytes {}\n", 32 * MIB),
        format!("kubelet_memory_qos_node_memory_low_bytes {}\n", 64 * MIB),
    ] {
        assert!(metrics.contains(&want), "{want:?} in {metrics}");
    }
    assert_eq!(
        memory(&cd.tier_path(QosClass::BestEffort), "memory.min"),
        "0"
    );

    daemon.stop().await;
    cd.remove_all_pods().await;
    drop(cd);
}

/// `memorySwap.swapBehavior: LimitedSwap` on a pure cgroup v2 node with swap, read back from
/// the real files (kubelet's `configureContainerSwapResources`): the Burstable container's
/// `memory.swap.max` is kubelet's `calcSwapForBurstablePods` (request / node memory x node
/// swap, with the node memory and swap the daemon logged, which are this machine's
/// `MemTotal` and `SwapTotal`), the Guaranteed and BestEffort containers' 0.
///
/// What kubelet needs to write anything, set up by the test and undone on drop: swap on the
/// node (a zram swap area of its own, [`ZramSwap`]; `failSwapOn: false` so the daemon runs
/// pods with it), and the swap controller where kubelet looks for it, `memory.swap.max` in
/// the daemon's own cgroup (the root has none, and the guest runs the tests there): the
/// daemon is the `enforcer` binary, started by this test in a cgroup of its own under the v2
/// root (moved there before it executes). Nothing else is moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limited_swap_on_real_files_v2only() {
    enforcer_tests::require_memory_v2("LimitedSwap");
    let l = layout();
    let (mount, _) = l.controller("memory").expect("the memory controller");
    let swap = ZramSwap::on(256 << 20);
    let (swap_total, _) = enforcer::node::swap::machine_swap().expect("SwapTotal");
    let memory_total = enforcer::node::machine_memory().expect("MemTotal");
    assert!(
        swap_total > 0,
        "SwapTotal 0 with {} on",
        swap.device.display()
    );
    let daemon_cgroup = TestCgroup::create(mount, &enforcer_tests::unique_name("swapcheck"));
    assert!(
        daemon_cgroup.dir.join("memory.swap.max").exists(),
        "{} has no memory.swap.max: no swap controller on this kernel",
        daemon_cgroup.dir.display()
    );
    let cd = Containerd::start("swap");
    let files = Files::new(
        &cd,
        "failSwapOn: false\nmemorySwap: {swapBehavior: LimitedSwap}\n",
    );
    let (manifests, state) = (files.manifests.clone(), files.state.clone());
    let pods = [
        (
            "burstable",
            "dddddddd-0000-0000-0000-000000000011",
            "    resources: {requests: {memory: 256Mi}, limits: {memory: 512Mi}}\n",
        ),
        (
            "guaranteed",
            "dddddddd-0000-0000-0000-000000000012",
            "    resources: {limits: {cpu: 100m, memory: 32Mi}}\n",
        ),
        ("besteffort", "dddddddd-0000-0000-0000-000000000013", ""),
    ];
    for (name, uid, res) in &pods {
        std::fs::write(manifests.join(format!("{name}.yaml")), pod(name, uid, res)).expect("write");
    }
    let daemon = ChildDaemon::start(&files, &cd, &daemon_cgroup.dir);
    wait_until("three pods running", Duration::from_secs(60), || {
        let r = records(&state);
        pods.iter().all(|(n, ..)| container_of(&r, n).is_some())
    })
    .await;

    // The daemon's view of the node: this machine's memory and swap, and the swap controller
    // found in its cgroup.
    let log = daemon.log();
    let (memory_capacity, swap_capacity, controller) = logged_swap_options(&log)
        .unwrap_or_else(|| panic!("no LimitedSwap line in the daemon's log:\n{log}"));
    assert!(controller, "the daemon found no swap controller:\n{log}");
    assert_eq!(
        (memory_capacity, swap_capacity),
        (memory_total, swap_total),
        "the daemon's node memory and swap"
    );
    let recs = records(&state);
    let memory = |name: &str| {
        let (pod_cgroup, id) = container_of(&recs, name).expect("running");
        read(&dir_of("memory", &cd.container_path(&pod_cgroup, &id)).join("memory.swap.max"))
    };
    let want = enforcer::policy::swap::calc_swap_for_burstable_pods(
        256 * MIB,
        memory_capacity,
        swap_capacity,
    )
    .expect("formula");
    assert!(want > 0, "the formula gives {want}");
    // The kernel keeps the limit in pages: what reads back is rounded down to one.
    let burstable = memory("burstable");
    eprintln!(
        "node MemTotal {memory_capacity}, SwapTotal {swap_capacity}; burstable (256Mi request) \
         memory.swap.max {burstable} (formula {want}); guaranteed {}, besteffort {}",
        memory("guaranteed"),
        memory("besteffort")
    );
    assert_eq!(burstable, (want / 4096 * 4096).to_string());
    assert_eq!(memory("guaranteed"), "0");
    assert_eq!(memory("besteffort"), "0");

    daemon.stop();
    cd.remove_all_pods().await;
    drop(cd);
    // What the test set up is gone: its cgroup, and its swap area (the node's swap as before).
    let dir = daemon_cgroup.dir.clone();
    drop(daemon_cgroup);
    assert!(!dir.exists(), "{} left behind", dir.display());
    let device = swap.device.to_string_lossy().into_owned();
    drop(swap);
    let areas = enforcer::node::swap::swap_on().expect("/proc/swaps");
    assert!(!areas.contains(&device), "{device} still on: {areas:?}");
}

/// (`memory_capacity`, `swap_capacity`, `controller_available`) of the daemon's
/// `memorySwap.swapBehavior LimitedSwap` line in its JSON log.
fn logged_swap_options(log: &str) -> Option<(i64, i64, bool)> {
    let v = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("memorySwap.swapBehavior LimitedSwap"))
        })?;
    let f = &v["fields"];
    Some((
        f["memory_capacity"].as_i64()?,
        f["swap_capacity"].as_i64()?,
        f["controller_available"].as_bool()?,
    ))
}

/// The `enforcer` binary as the test's child (`enforcer --log-format=json run` with
/// [`Files::flags`]), moved into `cgroup` before it executes, its log in
/// `<containerd dir>/enforcer.log`; stopped with SIGTERM (on drop too).
struct ChildDaemon {
    child: std::process::Child,
    log: PathBuf,
}

impl ChildDaemon {
    fn start(files: &Files, cd: &Containerd, cgroup: &Path) -> Self {
        let log = cd.dir.join("enforcer.log");
        let mut cmd = std::process::Command::new(enforcer_tests::enforcer_binary());
        cmd.args(["--log-format=json", "run"])
            .args(files.flags(cd))
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the daemon's log"));
        let child = enforcer_tests::spawn_in(cmd, &[cgroup]);
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status (`None`: killed after a bounded wait).
    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        if let Ok(Some(s)) = self.child.try_wait() {
            return Some(s);
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            enforcer_tests::kill(pid, rustix::process::Signal::TERM);
        }
        let deadline = std::time::Instant::now() + enforcer_tests::scaled(Duration::from_secs(20));
        while std::time::Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }

    /// Stops it; fails the test unless it exited cleanly.
    fn stop(mut self) {
        let status = self.terminate();
        assert!(
            status.is_some_and(|s| s.success()),
            "the daemon's exit: {status:?}; log:\n{}",
            self.log()
        );
    }
}

impl Drop for ChildDaemon {
    fn drop(&mut self) {
        let _ = self.terminate();
    }
}

/// `podPidsLimit` on the real pids controller (v1 here, v2 in the VM tier): `pids.max` on
/// every pod cgroup and not on kubepods, and a fork loop held at it: the kernel refused
/// forks (`pids.events`) and the pod keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_pids_limit_holds_a_fork_loop() {
    assert!(
        layout().controller("pids").is_some(),
        "this test needs the pids controller"
    );
    let cd = Containerd::start("pidslimit");
    const PIDS: i64 = 24;
    let files = Files::new(&cd, &format!("podPidsLimit: {PIDS}\n"));
    let (manifests, state) = (files.manifests.clone(), files.state.clone());
    std::fs::write(
        manifests.join("forker.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: forker, uid: dddddddd-0000-0000-0000-000000000003}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: busybox:local\n    imagePullPolicy: Never\n    command: [/bin/sh, -c, 'sh -c \"while true; do sleep 3600 & done\"; exec sleep 3600']\n",
    )
    .expect("write");
    std::fs::write(
        manifests.join("quiet.yaml"),
        pod("quiet", "dddddddd-0000-0000-0000-000000000004", ""),
    )
    .expect("write");
    let config = enforcer::config::load(&enforcer_tests::disk_neutral(&files.args(&cd)))
        .expect("configuration")
        .config;
    assert_eq!(config.pod_pids_limit, PIDS);
    let daemon = Daemon::start(config);
    wait_until("both pods running", Duration::from_secs(60), || {
        let r = records(&state);
        container_of(&r, "forker").is_some() && container_of(&r, "quiet").is_some()
    })
    .await;
    let recs = records(&state);
    let (forker_pod, forker_id) = container_of(&recs, "forker").expect("forker");
    let (quiet_pod, _) = container_of(&recs, "quiet").expect("quiet");
    let container = cd.container_path(&forker_pod, &forker_id);
    let kubepods = cd.kubepods_path();
    let pids = |rel: &str, file: &str| read(&dir_of("pids", rel).join(file));
    assert_eq!(pids(&forker_pod, "pids.max"), PIDS.to_string());
    assert_eq!(pids(&quiet_pod, "pids.max"), PIDS.to_string());
    assert_eq!(pids(&kubepods, "pids.max"), "max");
    // The refused forks are counted in the forking task's cgroup (the container's) on v1 and
    // 6.1, and also up the hierarchy on newer v2 kernels: either counts.
    let refused = |rel: &str| {
        pids(rel, "pids.events")
            .lines()
            .find_map(|l| l.strip_prefix("max "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    wait_until(
        "the fork loop held at pids.max",
        Duration::from_secs(60),
        || refused(&container) + refused(&forker_pod) > 0,
    )
    .await;
    let current: i64 = pids(&forker_pod, "pids.current")
        .parse()
        .expect("pids.current");
    assert!(
        current <= PIDS && current > PIDS / 2,
        "pids.current {current} with pids.max {PIDS}"
    );
    assert!(
        container_of(&records(&state), "forker").is_some(),
        "the forker pod keeps running under its pids limit"
    );

    daemon.stop().await;
    cd.remove_all_pods().await;
    drop(cd);
}
