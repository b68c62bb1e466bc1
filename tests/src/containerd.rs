//! A private containerd for the runtime tests: the busybox OCI image built from the node's
//! `busybox-static`, containerd with its own root, state, socket and runc root under a temp dir,
//! the image imported, and everything torn down afterwards (processes by PID only, mounts under
//! the temp dir, the test's cgroup root). Never touches a system-wide containerd.

use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use enforcer::runtime::image::{LOCAL_IMAGE, build_busybox_image};

/// Paths of the tools the fixture needs; a missing one fails the test loudly.
pub fn require_tools() {
    for tool in ["/usr/bin/containerd", "/usr/bin/ctr", "/bin/busybox"] {
        assert!(
            Path::new(tool).exists(),
            "{tool} is missing: install containerd and busybox-static (apt-get install containerd runc busybox-static)"
        );
    }
    assert!(
        Path::new("/usr/sbin/runc").exists() || Path::new("/usr/bin/runc").exists(),
        "runc is missing: apt-get install runc"
    );
}

/// A private containerd and the test's cgroup root.
#[derive(Debug)]
pub struct Containerd {
    /// The temp dir holding everything (root, state, socket, config, image, manifests).
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub config: PathBuf,
    /// The cgroup root for pods (relative to every hierarchy), e.g. `/enforcer-test-1-2-x`.
    pub cgroup_root: String,
    child: Option<Child>,
    torn_down: bool,
}

fn config_toml(dir: &Path, socket: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
oom_score = 0

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  address = ""
  level = "warn"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{LOCAL_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
"#,
        socket = socket.display()
    )
}

impl Containerd {
    /// Builds the image, starts containerd, imports the image.
    pub fn start(tag: &str) -> Self {
        crate::require_root();
        require_tools();
        let name = crate::unique_name(tag);
        let dir = std::env::temp_dir().join(&name);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let socket = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        fs::write(&config, config_toml(&dir, &socket)).expect("write containerd config");
        let mut me = Self {
            dir,
            socket,
            config,
            cgroup_root: format!("/{name}"),
            child: None,
            torn_down: false,
        };
        me.launch();
        let archive = me.dir.join("busybox.tar");
        let built = build_busybox_image(Path::new("/bin/busybox"), LOCAL_IMAGE, &archive)
            .unwrap_or_else(|e| panic!("building the busybox image: {e}"));
        let out = Command::new("ctr")
            .arg("-a")
            .arg(&me.socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&built.archive)
            .output()
            .expect("running ctr");
        assert!(
            out.status.success(),
            "ctr images import failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        me
    }

    /// Starts (again) the containerd process and waits for its socket.
    pub fn launch(&mut self) {
        assert!(self.child.is_none(), "containerd already running");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("containerd.log"))
            .expect("containerd log");
        let log2 = log.try_clone().expect("log fd");
        let mut cmd = Command::new("containerd");
        cmd.arg("-c")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        // SAFETY: setsid is async-signal-safe; the child gets its own session (`setsid containerd`).
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let child = cmd.spawn().expect("starting containerd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                // The CRI plugin needs a moment after the socket answers.
                std::thread::sleep(Duration::from_millis(300));
                return;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!(
                    "containerd exited ({status}); log:\n{}",
                    fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "containerd socket {} did not answer in 20 s",
                self.socket.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the containerd process (SIGTERM, then SIGKILL after 10 s); containers keep
    /// running under their shims.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = i32::try_from(child.id()).unwrap_or(0);
        if pid > 0 {
            // SAFETY: kill on the PID of the containerd this fixture started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The containerd log so far (for assertion messages).
    #[must_use]
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// The `pod<uid>` cgroup directories of the test's cgroup root that exist, in any
    /// hierarchy.
    #[must_use]
    pub fn pod_cgroups(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for mount in hierarchy_mounts() {
            let root = mount.join(self.cgroup_root.trim_start_matches('/'));
            walk_dirs(&root, &mut |p| {
                if p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("pod"))
                {
                    out.push(p.to_path_buf());
                }
            });
        }
        out
    }

    /// Tears everything down (also done on drop).
    pub fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        // 1. Container processes: everything inside the test's cgroup root.
        for mount in hierarchy_mounts() {
            let root = mount.join(self.cgroup_root.trim_start_matches('/'));
            walk_dirs(&root, &mut |p| kill_procs_in(p));
        }
        // 2. The shims of this containerd (found by their -address argument), then containerd.
        for pid in shims_of(&self.socket) {
            // SAFETY: kill on the PID of a shim serving this fixture's containerd.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        self.stop();
        // 3. Mounts below the temp dir, deepest first.
        let mut mounts = mounts_under(&self.dir);
        mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
        for m in mounts {
            if let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) {
                // SAFETY: umount2 on a mount point below this fixture's own temp dir.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
        // 4. The cgroup root in every hierarchy (after the processes are gone).
        for mount in hierarchy_mounts() {
            let root = mount.join(self.cgroup_root.trim_start_matches('/'));
            let deadline = Instant::now() + Duration::from_secs(5);
            while root.exists() && Instant::now() < deadline {
                walk_dirs(&root, &mut |p| kill_procs_in(p));
                remove_cgroup_tree(&root);
                if root.exists() {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        // 5. The temp dir.
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("removing {}: {e}", self.dir.display());
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Every cgroup hierarchy mount of this machine.
#[must_use]
pub fn hierarchy_mounts() -> Vec<PathBuf> {
    let layout = crate::layout();
    let mut out: Vec<PathBuf> = layout.v1.iter().map(|m| m.mount.clone()).collect();
    out.extend(layout.unified);
    out
}

fn walk_dirs(dir: &Path, f: &mut dyn FnMut(&Path)) {
    if !dir.is_dir() {
        return;
    }
    f(dir);
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk_dirs(&e.path(), f);
            }
        }
    }
}

fn kill_procs_in(dir: &Path) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kill on a PID inside the test's own cgroup root.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

/// PIDs of containerd shims started for the containerd at `socket`.
fn shims_of(socket: &Path) -> Vec<i32> {
    let want = socket.as_os_str().as_encoded_bytes().to_vec();
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let is_shim = args
            .first()
            .is_some_and(|a| a.windows(14).any(|w| w == b"containerd-shi"));
        let ours = args
            .windows(2)
            .any(|w| w[0] == b"-address" && w[1] == want.as_slice());
        if is_shim && ours {
            out.push(pid);
        }
    }
    out
}

/// Mount points at or below `dir` (from /proc/self/mountinfo).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(dir))
        .collect()
}

impl Containerd {
    /// Stops and removes every sandbox through CRI (clean shim exits); call before drop.
    pub async fn remove_all_pods(&self) {
        use enforcer::runtime::{ContainerRuntime as _, CriRuntime};
        let rt = CriRuntime::new(&self.socket, Duration::from_secs(10));
        let Ok(sandboxes) = rt.list_pod_sandboxes(Default::default()).await else {
            return;
        };
        for s in sandboxes {
            let _ = rt.stop_pod_sandbox(&s.id).await;
            let _ = rt.remove_pod_sandbox(&s.id).await;
        }
    }
}
