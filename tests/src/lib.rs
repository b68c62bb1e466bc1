//! Harness for the black-box suite: test-owned cgroups that clean up after themselves,
//! processes started inside them, and waiting for signals with a deadline; and the
//! development tooling the daemon does not carry: a private containerd ([`local`], also the
//! `local-containerd` binary that `cargo xtask run` uses) with a local busybox image
//! ([`image`]).
//!
//! Everything here needs root and the real kernel; a missing piece fails loudly.

pub mod containerd;
pub mod image;
pub mod local;
pub mod node;

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
    pub fn create(mount: &Path, rel: &str) -> Self {
        let mut created = Vec::new();
        let mut dir = mount.to_path_buf();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            dir.push(part);
            if !dir.exists() {
                fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
                created.push(dir.clone());
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

/// Receives signals until `pred` matches one, or panics after `timeout` listing what came.
pub async fn wait_for(
    rx: &mut mpsc::Receiver<Signal>,
    timeout: Duration,
    what: &str,
    mut pred: impl FnMut(&Signal) -> bool,
) -> Signal {
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

impl Daemon {
    /// Starts the daemon with `config` (no extra watches, pods as workloads, no API server).
    #[must_use]
    pub fn start(config: enforcer::config::Config) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(enforcer::daemon::run(
            enforcer::daemon::DaemonOptions {
                config,
                watches: vec![],
                run_pods: true,
                static_pods: false,
                kubeconfig: None,
            },
            async {
                let _ = stopped.await;
            },
        ));
        Self { stop, task }
    }

    /// Stops it and fails the test if it ended with an error.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("join").expect("daemon ran");
    }
}

/// The `enforcer` binary next to this test's target directory, built if needed.
#[must_use]
pub fn enforcer_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/simulate-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_owned();
    let target_dir = profile_dir.parent().expect("target dir").to_owned();
    let bin = profile_dir.join("enforcer");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut build = std::process::Command::new(cargo);
    build
        .args([
            "build",
            "-p",
            "enforcer",
            "--bin",
            "enforcer",
            "--target-dir",
        ])
        .arg(&target_dir);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("running cargo build");
    assert!(status.success(), "cargo build -p enforcer failed");
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}
