//! Harness for the black-box suite: test-owned cgroups that clean up after themselves,
//! processes started inside them, and waiting for signals with a deadline; and the
//! development tooling the daemon does not carry: a private containerd ([`local`], also the
//! `local-containerd` binary that `cargo xtask run` uses) with a local busybox image
//! ([`image`]); and three real OCI registries to pull from ([`registry`]).
//!
//! Everything here needs root and the real kernel; a missing piece fails loudly.

pub mod containerd;
pub mod fake_api;
pub mod image;
pub mod kubelet;
pub mod local;
pub mod neighbours;
pub mod node;
pub mod pods;
pub mod process;
pub mod registry;
pub mod streams;
pub mod swap;

use std::{
    fs,
    io::Write as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use enforcer::{cgroup::CgroupLayout, signal::Signal};
use tokio::sync::mpsc;

/// Fails the test unless it runs as root (CI runs as root; a skip would hide a gap).
pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root (real cgroups and eBPF); run the suite as root"
    );
}

/// The node's cgroup layout (panics with the reason when it cannot be read).
#[must_use]
pub fn layout() -> CgroupLayout {
    CgroupLayout::discover().expect("cgroup layout of this machine")
}

/// The cgroup driver the tests run with: `ENFORCER_CGROUP_DRIVER` (`cgroupfs` when unset),
/// the same variable the enforcer's `--cgroup-driver` flag reads, so a spawned enforcer and
/// the fixture's containerd (`SystemdCgroup`) agree; `cargo xtask vm-test --systemd` sets it.
/// Any other value fails the test loudly.
#[must_use]
pub fn cgroup_driver() -> enforcer::policy::cgroup_name::CgroupDriver {
    use enforcer::policy::cgroup_name::CgroupDriver;
    match std::env::var("ENFORCER_CGROUP_DRIVER") {
        Err(_) => CgroupDriver::Cgroupfs,
        Ok(v) => CgroupDriver::parse(&v)
            .unwrap_or_else(|| panic!("ENFORCER_CGROUP_DRIVER={v:?}: must be cgroupfs or systemd")),
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A unique name for a test-owned cgroup subtree: `enforcer-test-<pid>-<n>-<tag>`.
#[must_use]
pub fn unique_name(tag: &str) -> String {
    format!(
        "enforcer-test-{}-{}-{tag}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A cgroup directory this test created (with its parents up to `top`); removed on drop,
/// after killing any process left inside. Never touches anything it did not create.
#[derive(Debug)]
pub struct TestCgroup {
    /// The hierarchy mount, e.g. /sys/fs/cgroup/memory.
    pub mount: PathBuf,
    /// The deepest directory (where processes go).
    pub dir: PathBuf,
    /// The directories created, outermost first.
    created: Vec<PathBuf>,
}

impl TestCgroup {
    /// Creates `mount/<rel>` (every missing component, all owned by the test).
    ///
    /// On cgroup v2 a cgroup gets a controller's files only when its parent lists the
    /// controller in `cgroup.subtree_control`: each directory created here that has a child
    /// below it enables [`SUBTREE_CONTROLLERS`] (those its `cgroup.controllers` offers) for
    /// that child. Directories the test did not create are never written.
    pub fn create(mount: &Path, rel: &str) -> Self {
        let mut created = Vec::new();
        let mut dir = mount.to_path_buf();
        let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
        for (i, part) in parts.iter().enumerate() {
            dir.push(part);
            if !dir.exists() {
                fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
                created.push(dir.clone());
                if i + 1 < parts.len() {
                    enable_subtree_controllers(&dir);
                }
            }
        }
        Self {
            mount: mount.to_path_buf(),
            dir,
            created,
        }
    }

    /// The path relative to the hierarchy root, as signals report it.
    #[must_use]
    pub fn rel(&self) -> String {
        format!(
            "/{}",
            self.dir
                .strip_prefix(&self.mount)
                .unwrap_or(&self.dir)
                .display()
        )
    }

    /// Writes a cgroup file of this cgroup.
    pub fn write(&self, file: &str, value: &str) {
        let p = self.dir.join(file);
        fs::write(&p, value).unwrap_or_else(|e| panic!("write {value:?} to {}: {e}", p.display()));
    }

    /// The directory's inode: the cgroup v2 id.
    #[must_use]
    pub fn ino(&self) -> u64 {
        use std::os::unix::fs::MetadataExt as _;
        fs::metadata(&self.dir).map(|m| m.ino()).unwrap_or(0)
    }

    /// Removes now (also done on drop).
    pub fn remove(&mut self) {
        for dir in self.created.iter().rev() {
            kill_all_in(dir);
            let deadline = Instant::now() + Duration::from_secs(5);
            while dir.exists() && fs::remove_dir(dir).is_err() && Instant::now() < deadline {
                kill_all_in(dir);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.created.clear();
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The controllers a test-created v2 cgroup enables for its children (when offered).
pub const SUBTREE_CONTROLLERS: &[&str] = &["memory", "cpu", "io", "pids"];

/// On cgroup v2, writes `+<controller>` to `dir`'s `cgroup.subtree_control` for each of
/// [`SUBTREE_CONTROLLERS`] its `cgroup.controllers` lists (nothing on a v1 hierarchy).
pub fn enable_subtree_controllers(dir: &Path) {
    let Ok(offered) = fs::read_to_string(dir.join("cgroup.controllers")) else {
        return;
    };
    let offered: Vec<&str> = offered.split_whitespace().collect();
    let enable: Vec<String> = SUBTREE_CONTROLLERS
        .iter()
        .filter(|c| offered.contains(c))
        .map(|c| format!("+{c}"))
        .collect();
    if enable.is_empty() {
        return;
    }
    let p = dir.join("cgroup.subtree_control");
    fs::write(&p, enable.join(" "))
        .unwrap_or_else(|e| panic!("write {:?} to {}: {e}", enable.join(" "), p.display()));
}

/// The `oom_kill` counter of one memory cgroup directory (v1 `memory.oom_control`, v2
/// `memory.events`), through the daemon's own parser.
#[must_use]
pub fn oom_kills_in(dir: &Path) -> u64 {
    fs::read_to_string(dir.join("memory.oom_control"))
        .or_else(|_| fs::read_to_string(dir.join("memory.events")))
        .map_or(0, |t| {
            enforcer::kernel::fallback::parse_mem_events(&t).oom_kill
        })
}

/// This kernel's release (`uname -r`), for reports.
#[must_use]
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Whether the node's memory controller is on cgroup v2 (pure v2, or moved to the unified
/// hierarchy).
#[must_use]
pub fn memory_is_v2() -> bool {
    matches!(
        layout().controller("memory"),
        Some((_, enforcer::cgroup::CgroupVersion::V2))
    )
}

/// Fails the test unless the memory controller is on cgroup v1 (tests named `*_v1only`:
/// run on a v1 host, skipped by name in the v2 VM tier; elsewhere they must not pass
/// vacuously).
pub fn require_memory_v1(what: &str) {
    assert!(
        !memory_is_v2(),
        "{what} needs the cgroup v1 memory controller; this machine's is v2 \
         (a `_v1only` test: `cargo xtask vm-test` skips it, the host tier runs it)"
    );
}

/// Fails the test unless the memory controller is on cgroup v2 (tests named `*_v2only`:
/// run by `cargo xtask vm-test`; the host tier skips them when its memory is v1).
pub fn require_memory_v2(what: &str) {
    assert!(
        memory_is_v2(),
        "{what} needs the cgroup v2 memory controller; this machine's is v1 \
         (a `_v2only` test: `cargo xtask vm-test` runs it on a pure cgroup v2 kernel)"
    );
}

fn kill_all_in(dir: &Path) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        // A pid listed in a cgroup this test created.
        for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            kill(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Sends `sig` to `pid`, best effort (the process may be gone already).
pub fn kill(pid: i32, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// Starts `cmd` with the child placed in each of `cgroups` before it executes.
pub fn spawn_in(mut cmd: Command, cgroups: &[&Path]) -> Child {
    let procs: Vec<std::ffi::CString> = cgroups
        .iter()
        .map(|c| {
            std::ffi::CString::new(c.join("cgroup.procs").into_os_string().into_encoded_bytes())
                .expect("no NUL")
        })
        .collect();
    // SAFETY: `pre_exec` runs the closure in the forked child before exec, where only
    // async-signal-safe work is allowed. The closure allocates nothing and takes no lock: the
    // paths are C strings built above (rustix passes a `&CStr` through without copying), and
    // it makes three raw system calls through rustix (open, write, close on drop of the fd).
    // Moving the child into its cgroups before exec is the point (no allocation of the
    // workload happens outside them), so it cannot be done after spawn.
    unsafe {
        cmd.pre_exec(move || {
            for p in &procs {
                let fd = rustix::fs::open(
                    p.as_c_str(),
                    rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )?;
                rustix::io::write(&fd, b"0")?;
            }
            Ok(())
        });
    }
    cmd.spawn().expect("spawning a test process")
}

/// Receives signals until `pred` matches one, or panics after `timeout` (stretched by
/// [`time_scale`] where the machine is slow) listing what came.
pub async fn wait_for(
    rx: &mut mpsc::Receiver<Signal>,
    timeout: Duration,
    what: &str,
    mut pred: impl FnMut(&Signal) -> bool,
) -> Signal {
    let timeout = scaled(timeout);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(s)) if pred(&s) => return s,
            Ok(Some(s)) => {
                if seen.len() < 50 {
                    seen.push(s);
                }
            }
            Ok(None) => panic!("signal stream ended while waiting for {what}"),
            Err(_) => panic!("no {what} within {timeout:?}; saw (first 50): {seen:#?}"),
        }
    }
}

/// The factor timed bounds are stretched by where the machine is slow:
/// `ENFORCER_TEST_TIME_SCALE` (a whole number, 1 when unset; `cargo xtask vm-test` sets it
/// for software emulation). A test that stretches a bound stretches the periods it measures
/// against with it, so what it proves stays the same.
#[must_use]
pub fn time_scale() -> u32 {
    std::env::var("ENFORCER_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// `d` stretched by [`time_scale`].
#[must_use]
pub fn scaled(d: Duration) -> Duration {
    d * time_scale()
}

/// Appends a line to a file (for tests that write manifests or configs).
pub fn append(path: &Path, line: &str) {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open");
    writeln!(f, "{line}").expect("write");
}

/// A BestEffort pod of one busybox container named `app` (the benchmarks' pods: they run as
/// plain cgroups, the spec only feeds the eviction manager's ranking).
#[must_use]
pub fn besteffort_pod(name: &str, uid: &str) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(uid.into());
    p.spec = Some(PodSpec {
        containers: vec![Container {
            name: "app".into(),
            image: Some("busybox".into()),
            ..Default::default()
        }],
        ..Default::default()
    });
    p
}

/// The number after `name` on the command line of a benchmark binary, or `default`.
#[must_use]
pub fn arg_u64(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `.yaml` files directly in `dir`, sorted; panics when there is none.
#[must_use]
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .yaml files in {}", dir.display());
    files
}

/// The daemon (`enforcer::daemon::run`) in-process, running pods, until [`Daemon::stop`].
pub struct Daemon {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), enforcer::daemon::DaemonError>>,
}

/// The in-process daemon's log, captured by the test harness per test (shown for a failing
/// test, with `--nocapture` always); `RUST_LOG` overrides the filter (`enforcer=info`).
pub fn capture_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("enforcer=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

impl Daemon {
    /// Starts the daemon with `config` (no extra watches, pods as workloads, no API server).
    #[must_use]
    pub fn start(config: enforcer::config::Config) -> Self {
        Self::start_with_kubeconfig(config, None)
    }

    /// Starts the daemon with `config`, in cluster mode when a kubeconfig is given.
    #[must_use]
    pub fn start_with_kubeconfig(
        config: enforcer::config::Config,
        kubeconfig: Option<PathBuf>,
    ) -> Self {
        Self::start_with(enforcer::daemon::DaemonOptions {
            config,
            watches: vec![],
            run_pods: true,
            static_pods: false,
            kubeconfig,
            companion: None,
        })
    }

    /// Starts the daemon with `opts`.
    #[must_use]
    pub fn start_with(opts: enforcer::daemon::DaemonOptions) -> Self {
        capture_logs();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(enforcer::daemon::run(opts, async {
            let _ = stopped.await;
        }));
        Self { stop, task }
    }

    /// Stops it and fails the test if it ended with an error.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let bound = scaled(Duration::from_secs(90));
        match tokio::time::timeout(bound, self.task).await {
            Ok(r) => r.expect("join").expect("daemon ran"),
            Err(_) => panic!(
                "the daemon did not stop within {bound:?} of being asked to (its log above \
                 says where it was)"
            ),
        }
    }
}

/// The `enforcer` binary next to this test's target directory, built if needed.
#[must_use]
pub fn enforcer_binary() -> PathBuf {
    workspace_binary("enforcer", "enforcer")
}

/// The `xtask` binary (the project's tasks: `xtask image`, ...), built if needed.
#[must_use]
pub fn xtask_binary() -> PathBuf {
    workspace_binary("xtask", "xtask")
}

/// The binary `bin` of the workspace's `package` next to this test's target directory,
/// built if needed (in the same profile).
#[must_use]
pub fn workspace_binary(package: &str, bin: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/simulate-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_owned();
    let target_dir = profile_dir.parent().expect("target dir").to_owned();
    let path = profile_dir.join(bin);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut build = std::process::Command::new(cargo);
    build
        .args(["build", "-p", package, "--bin", bin, "--target-dir"])
        .arg(&target_dir);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    // The test's environment is cargo's for a test run (`CARGO_*`, `LD_LIBRARY_PATH`, ...):
    // passed on, it gives the nested build other fingerprints than the test build's, and the
    // two rebuilt ring, rustls, kube and the enforcer over each other at every call.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if (k.starts_with("CARGO_") && k != "CARGO_HOME") || k == "LD_LIBRARY_PATH" {
            build.env_remove(k.as_ref());
        }
    }
    let status = build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("running cargo build");
    assert!(status.success(), "cargo build -p {package} failed");
    assert!(path.exists(), "{} missing after the build", path.display());
    path
}

/// `kubectl kustomize deploy/kustomize/<overlay>`: the objects an operator applies, as JSON
/// values, in kustomize's order (kubectl is installed by `cargo xtask setup`).
#[must_use]
pub fn kustomize(overlay: &str) -> Vec<serde_json::Value> {
    use serde::Deserialize as _;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kustomize")
        .join(overlay);
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl (kubernetes-client) renders the kustomization");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| {
            let v = serde_yaml_ng::Value::deserialize(doc).expect("a YAML document");
            serde_json::to_value(&v).expect("as JSON")
        })
        .collect()
}

/// The capabilities the companion overlay's DaemonSet adds (`securityContext.capabilities.add`,
/// as written there: `BPF`, ...); the DaemonSet must not be privileged.
#[must_use]
pub fn companion_daemonset_capabilities() -> Vec<String> {
    let ds = kustomize("companion")
        .into_iter()
        .find(|v| v["kind"] == "DaemonSet")
        .expect("a DaemonSet in deploy/kustomize/companion");
    let c = &ds["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(c["privileged"].as_bool(), Some(false), "not privileged");
    c["capabilities"]["add"]
        .as_array()
        .expect("capabilities.add")
        .iter()
        .filter_map(|c| c.as_str().map(str::to_owned))
        .collect()
}

/// The node as the stats collector reads it on this machine: its memory (no capacity
/// override), kubepods at `kubepods_rel` of every hierarchy, nodefs at `nodefs`.
pub fn machine_observer(kubepods_rel: &str, nodefs: &Path) -> enforcer::node::NodeObserver {
    let capacity = enforcer::node::machine_memory().expect("the machine's memory");
    enforcer::node::NodeObserver {
        layout: layout(),
        kubepods: kubepods_rel.to_owned(),
        memory_capacity: capacity,
        capacity_override: false,
        kubepods_memory_limit: capacity,
        nodefs: nodefs.to_path_buf(),
        imagefs: None,
        pid_capacity: None,
    }
}

/// `args` made independent of how full this machine's disk is, for a test that does not test
/// disk pressure: a fresh clone's build files can leave the disk near kubelet's default
/// `imagefs.available<15%` and its image GC's 85 %, which would put the test's node in
/// DiskPressure (pods refused at admission) or collect its only image. With no hard threshold
/// given, only kubelet's memory one (`memory.available<100Mi`, no disk defaults); with no
/// image GC threshold given, image GC only on a full disk (100 %, 99 %). A test that sets
/// either keeps its own.
#[must_use]
pub fn disk_neutral(args: &enforcer::config::ConfigArgs) -> enforcer::config::ConfigArgs {
    let mut args = args.clone();
    if args.eviction_hard.is_empty() {
        args.eviction_hard = vec!["memory.available<100Mi".to_owned()];
    }
    if args.image_gc_high_threshold.is_none() && args.image_gc_low_threshold.is_none() {
        args.image_gc_high_threshold = Some(100);
        args.image_gc_low_threshold = Some(99);
    }
    args
}

/// An HTTP/1.0 GET on loopback: (status line, body).
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(String, String)> {
    use std::io::Read as _;
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    Ok((
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    ))
}

/// A query's answer from Prometheus' HTTP API (`data.result`).
pub fn prometheus_query(addr: &str, query: &str) -> Vec<serde_json::Value> {
    let q: String = query
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let Ok((status, body)) = http_get(addr, &format!("/api/v1/query?query={q}")) else {
        return Vec::new();
    };
    if !status.contains(" 200") {
        return Vec::new();
    }
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["data"]["result"].as_array().cloned())
        .unwrap_or_default()
}
