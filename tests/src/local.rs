//! A private containerd with the local busybox image, for standalone runs (`cargo xtask run`,
//! the `local-containerd start|stop` binary of this crate), the benchmarks and the black-box
//! tests. Test and development tooling: the release daemon does not carry it.
//!
//! Everything lives in one directory: the config, `root`, `state`, runc's root, the socket
//! (`containerd.sock`), the log, the PID file, the CNI configuration and the host-local IPAM
//! state. containerd runs in a process group of its own (so a terminal's Ctrl-C does not reach
//! it), with `restrict_oom_score_adj = true` and the cgroupfs driver, and its `sandbox_image`
//! is the local busybox image, which is built from the node's `busybox-static`
//! ([`crate::image`]) and imported with `ctr`.
//!
//! Pod networking: with a [`CniBridge`], containerd runs inside a network namespace this module
//! creates (`ip netns add`), so the bridge, its 10.x subnet and the pods' veth pairs exist only
//! there, and deleting the namespace removes them all. containerd is spawned from a short-lived
//! thread that entered that namespace (`setns` changes the calling thread only), so it inherits
//! the namespace and nothing else of ours moves. Without one, only `hostNetwork` pods run.
//!
//! Stopping is by PID only: the containerd this module started (checked against its command
//! line) and the shims whose `-address` is this socket; then the mounts below the directory.

use std::{
    fs,
    os::{fd::AsFd as _, unix::process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use rustix::process::Signal;

use crate::image::{BuiltImage, ImageError, LOCAL_IMAGE, build_busybox_image};

/// The PID file of the containerd started in a directory.
pub const PID_FILE: &str = "containerd.pid";
/// The socket inside the directory.
pub const SOCKET_FILE: &str = "containerd.sock";
/// The log inside the directory.
pub const LOG_FILE: &str = "containerd.log";
/// The registry hosts directory inside the directory (CRI `registry.config_path`): a
/// `<host[:port]>/hosts.toml` there says how containerd reaches that registry (its CA, a
/// mirror, plain HTTP); containerd reads it again at each pull.
pub const CERTS_DIR: &str = "certs.d";
/// The CNI network name of the bridge configuration.
pub const CNI_NETWORK: &str = "enforcer-local";

/// Errors of the local containerd; each names the path, tool or process it concerns.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} is missing: {hint}")]
    MissingTool { tool: String, hint: &'static str },
    #[error("starting containerd with {config}: {source}")]
    Spawn {
        config: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "containerd ({config}) exited ({status}) before its socket answered; log {log}:\n{tail}"
    )]
    Exited {
        config: PathBuf,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("containerd socket {socket} did not answer within {secs} s (log {log})")]
    Timeout {
        socket: PathBuf,
        secs: u64,
        log: PathBuf,
    },
    #[error("building the busybox image: {0}")]
    Image(#[from] ImageError),
    #[error("`{command}` failed: {message}")]
    Command { command: String, message: String },
    #[error("{dir}: no containerd of ours runs there ({why})")]
    NotRunning { dir: PathBuf, why: String },
    #[error("containerd already runs in {dir} (pid {pid})")]
    AlreadyRunning { dir: PathBuf, pid: i32 },
    #[error("invalid CNI bridge {name:?} / subnet {subnet:?}: {why}")]
    InvalidNetwork {
        name: String,
        subnet: String,
        why: &'static str,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LocalError + '_ {
    move |source| LocalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A bridge + host-local CNI network, inside a network namespace of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniBridge {
    /// The network namespace containerd runs in (`/run/netns/<netns>`), created and deleted by
    /// [`LocalContainerd`].
    pub netns: String,
    /// The bridge's name (at most 15 characters).
    pub bridge: String,
    /// The pod subnet, inside 10.0.0.0/8 (e.g. `10.77.3.0/24`).
    pub subnet: String,
}

impl CniBridge {
    /// A network named after `tag` (letters, digits and `-`), with subnet 10.`a`.`b`.0/24.
    pub fn new(tag: &str, a: u8, b: u8) -> Result<Self, LocalError> {
        let clean: String = tag
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let short: String = clean
            .chars()
            .rev()
            .take(11)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let me = Self {
            netns: format!("enforcer-{clean}"),
            bridge: format!("enf-{short}"),
            subnet: format!("10.{a}.{b}.0/24"),
        };
        me.validate()?;
        Ok(me)
    }

    fn validate(&self) -> Result<(), LocalError> {
        let bad = |why| LocalError::InvalidNetwork {
            name: self.bridge.clone(),
            subnet: self.subnet.clone(),
            why,
        };
        let name_ok = |s: &str, max: usize| {
            !s.is_empty()
                && s.len() <= max
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        if !name_ok(&self.bridge, 15) {
            return Err(bad("bridge name: 1-15 letters, digits or '-'"));
        }
        if !name_ok(&self.netns, 64) {
            return Err(bad("netns name: 1-64 letters, digits or '-'"));
        }
        let ok = self
            .subnet
            .strip_prefix("10.")
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(addr, len)| {
                addr.split('.').count() == 3
                    && addr.split('.').all(|o| o.parse::<u8>().is_ok())
                    && len.parse::<u8>().is_ok_and(|l| (8..=30).contains(&l))
            });
        if !ok {
            return Err(bad("subnet must be 10.x.y.z/len inside 10.0.0.0/8"));
        }
        Ok(())
    }

    /// The CNI conflist (bridge + host-local IPAM with its state below `ipam_dir`, and
    /// loopback); no masquerading and no port maps, so nothing outside the namespace changes.
    #[must_use]
    pub fn conflist(&self, ipam_dir: &Path) -> String {
        serde_json::json!({
            "cniVersion": "0.4.0",
            "name": CNI_NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": self.subnet }]],
                        "dataDir": ipam_dir.display().to_string(),
                    },
                },
                { "type": "loopback" },
            ],
        })
        .to_string()
    }
}

/// The containerd config for a private instance in `dir`; runc puts containers in systemd
/// scopes when `systemd_cgroup` (`SystemdCgroup = true`, the systemd cgroup driver).
#[must_use]
pub fn config_toml(dir: &Path, socket: &Path, systemd_cgroup: bool) -> String {
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
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = {systemd_cgroup}
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{d}/{CERTS_DIR}"
"#,
        socket = socket.display()
    )
}

/// Whether something answers on the unix socket `path`.
#[must_use]
pub fn socket_answers(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

/// Fails with a clear message when containerd, ctr, runc or busybox is missing.
pub fn require_tools() -> Result<(), LocalError> {
    const HINT: &str = "apt-get install containerd runc busybox-static";
    for tool in ["/usr/bin/containerd", "/usr/bin/ctr", "/bin/busybox"] {
        if !Path::new(tool).exists() {
            return Err(LocalError::MissingTool {
                tool: tool.to_owned(),
                hint: HINT,
            });
        }
    }
    if !Path::new("/usr/sbin/runc").exists() && !Path::new("/usr/bin/runc").exists() {
        return Err(LocalError::MissingTool {
            tool: "runc".to_owned(),
            hint: HINT,
        });
    }
    Ok(())
}

/// `cmd` under coreutils' `timeout` (SIGTERM after `secs`, SIGKILL 10 s later): a tool that
/// waits on a stuck containerd (`ctr images import`, `systemd-run`) fails the fixture with
/// its name instead of holding the test forever.
#[must_use]
pub fn bounded(cmd: &Command, secs: u64) -> Command {
    let mut c = Command::new("timeout");
    c.args(["-k", "10", &secs.to_string()])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        c.current_dir(d);
    }
    c
}

/// How long one tool a fixture runs may take (stretched by `ENFORCER_TEST_TIME_SCALE`).
fn tool_bound_secs() -> u64 {
    120 * u64::from(crate::time_scale())
}

fn run_cmd(cmd: &mut Command) -> Result<(), LocalError> {
    let command = format!("{cmd:?}");
    let secs = tool_bound_secs();
    let out = bounded(cmd, secs)
        .output()
        .map_err(|e| LocalError::Command {
            command: command.clone(),
            message: e.to_string(),
        })?;
    if out.status.success() {
        Ok(())
    } else if matches!(out.status.code(), Some(124 | 137)) {
        Err(LocalError::Command {
            command,
            message: format!(
                "did not finish within {secs} s (killed); output so far: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    } else {
        Err(LocalError::Command {
            command,
            message: format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }
}

/// A private containerd in a directory of its own.
#[derive(Debug)]
pub struct LocalContainerd {
    dir: PathBuf,
    socket: PathBuf,
    config: PathBuf,
    network: Option<CniBridge>,
    netns_created: bool,
    child: Option<Child>,
    /// The PID of a containerd started by another process (`attach`), or as a unit.
    pid: Option<i32>,
    /// How many times containerd was started as a unit (each start is a new unit: the one
    /// before may stay loaded while its shims live on in its cgroup).
    unit_starts: u32,
}

impl LocalContainerd {
    /// Prepares `dir` (created when missing): config and, with `network`, the CNI conflist.
    /// Starts nothing.
    pub fn new(dir: &Path, network: Option<CniBridge>) -> Result<Self, LocalError> {
        require_tools()?;
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let dir = fs::canonicalize(dir).map_err(io_err(dir))?;
        let socket = dir.join(SOCKET_FILE);
        let config = dir.join("config.toml");
        let systemd =
            crate::cgroup_driver() == enforcer::policy::cgroup_name::CgroupDriver::Systemd;
        fs::write(&config, config_toml(&dir, &socket, systemd)).map_err(io_err(&config))?;
        let cni_dir = dir.join("cni");
        fs::create_dir_all(&cni_dir).map_err(io_err(&cni_dir))?;
        let certs_dir = dir.join(CERTS_DIR);
        fs::create_dir_all(&certs_dir).map_err(io_err(&certs_dir))?;
        if let Some(net) = &network {
            net.validate()?;
            let file = cni_dir.join("10-enforcer.conflist");
            fs::write(&file, net.conflist(&dir.join("cni-ipam"))).map_err(io_err(&file))?;
        }
        Ok(Self {
            dir,
            socket,
            config,
            network,
            netns_created: false,
            child: None,
            pid: None,
            unit_starts: 0,
        })
    }

    /// Prepares `dir`, starts containerd and imports the local busybox image.
    pub fn start(dir: &Path, network: Option<CniBridge>) -> Result<Self, LocalError> {
        let mut me = Self::new(dir, network)?;
        if let Some(pid) = read_pid(&me.dir).filter(|p| is_our_containerd(*p, &me.config)) {
            return Err(LocalError::AlreadyRunning { dir: me.dir, pid });
        }
        if let Err(e) = me.launch().and_then(|()| me.import_image().map(|_| ())) {
            me.teardown();
            return Err(e);
        }
        Ok(me)
    }

    /// The containerd started earlier in `dir` (by `start` in another process), from its PID
    /// file; fails unless that PID is a containerd running with this directory's config.
    pub fn attach(dir: &Path) -> Result<Self, LocalError> {
        let dir = fs::canonicalize(dir).map_err(io_err(dir))?;
        let config = dir.join("config.toml");
        let pid = read_pid(&dir).ok_or_else(|| LocalError::NotRunning {
            dir: dir.clone(),
            why: format!("no readable {PID_FILE}"),
        })?;
        let alive = is_our_containerd(pid, &config);
        let netns = fs::read_to_string(dir.join("netns"))
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        Ok(Self {
            socket: dir.join(SOCKET_FILE),
            network: netns.map(|netns| CniBridge {
                netns,
                bridge: String::new(),
                subnet: String::new(),
            }),
            netns_created: dir.join("netns").exists(),
            dir,
            config,
            child: None,
            pid: alive.then_some(pid),
            unit_starts: 0,
        })
    }

    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    #[must_use]
    pub fn config(&self) -> &Path {
        &self.config
    }

    /// The registry hosts directory ([`CERTS_DIR`]): `<host[:port]>/hosts.toml` files there
    /// are honoured at the next pull.
    #[must_use]
    pub fn certs_dir(&self) -> PathBuf {
        self.dir.join(CERTS_DIR)
    }

    /// The containerd PID, while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<i32> {
        self.child
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
            .or(self.pid)
    }

    /// The network namespace containerd runs in (`None`: the host's).
    #[must_use]
    pub fn netns(&self) -> Option<&str> {
        self.network.as_ref().map(|n| n.netns.as_str())
    }

    /// The log so far.
    #[must_use]
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join(LOG_FILE)).unwrap_or_default()
    }

    fn ensure_netns(&mut self) -> Result<Option<fs::File>, LocalError> {
        let Some(net) = &self.network else {
            return Ok(None);
        };
        let path = Path::new("/run/netns").join(&net.netns);
        if !path.exists() {
            run_cmd(Command::new("ip").args(["netns", "add", &net.netns]))?;
            self.netns_created = true;
            let marker = self.dir.join("netns");
            fs::write(&marker, &net.netns).map_err(io_err(&marker))?;
            run_cmd(Command::new("ip").args(["-n", &net.netns, "link", "set", "lo", "up"]))?;
        }
        fs::File::open(&path).map(Some).map_err(io_err(&path))
    }

    /// Starts (again) the containerd process and waits for its socket (20 s).
    pub fn launch(&mut self) -> Result<(), LocalError> {
        if let Some(pid) = self.pid() {
            return Err(LocalError::AlreadyRunning {
                dir: self.dir.clone(),
                pid,
            });
        }
        let netns = self.ensure_netns()?;
        let log_path = self.dir.join(LOG_FILE);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io_err(&log_path))?;
        let log2 = log.try_clone().map_err(io_err(&log_path))?;
        // With the systemd driver (systemd as PID 1), containerd runs as a unit, as
        // containerd.service does on a kubeadm node (outside a network namespace of the
        // test's: one with a CNI bridge keeps the plain child).
        if netns.is_none()
            && crate::cgroup_driver() == enforcer::policy::cgroup_name::CgroupDriver::Systemd
        {
            return self.launch_unit(&log_path);
        }
        let mut cmd = Command::new("containerd");
        cmd.arg("-c")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0);
        let child = match &netns {
            None => cmd.spawn(),
            Some(ns) => spawn_in_netns(&mut cmd, ns),
        }
        .map_err(|source| LocalError::Spawn {
            config: self.config.clone(),
            source,
        })?;
        drop(netns);
        let pid_path = self.dir.join(PID_FILE);
        fs::write(&pid_path, child.id().to_string()).map_err(io_err(&pid_path))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if socket_answers(&self.socket) {
                // The CRI plugin needs a moment after the socket answers.
                std::thread::sleep(Duration::from_millis(300));
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                let log = self.log();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                return Err(LocalError::Exited {
                    config: self.config.clone(),
                    status: status.to_string(),
                    log: log_path,
                    tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                });
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(LocalError::Timeout {
                    socket: self.socket.clone(),
                    secs: 20,
                    log: log_path,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The transient unit containerd runs as under the systemd driver (the latest start's).
    #[must_use]
    pub fn unit(&self) -> String {
        let name = self
            .dir
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        format!("{name}-containerd-{}.service", self.unit_starts)
    }

    /// `systemd-run` containerd as a transient service (`KillMode=process`, as
    /// containerd.service: the shims outlive a stop; `Delegate=yes`), its output appended to
    /// the log; its main PID is then the one stopped by PID.
    fn launch_unit(&mut self, log_path: &Path) -> Result<(), LocalError> {
        self.unit_starts += 1;
        let unit = self.unit();
        let log = format!("append:{}", log_path.display());
        run_cmd(
            Command::new("systemd-run")
                .args(["--quiet", "--collect", "--unit", &unit])
                .args(["--property=KillMode=process", "--property=Delegate=yes"])
                .arg(format!("--property=StandardOutput={log}"))
                .arg(format!("--property=StandardError={log}"))
                .arg("containerd")
                .arg("-c")
                .arg(&self.config),
        )?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let main_pid = Command::new("systemctl")
                .args(["show", &unit, "-p", "MainPID", "--value"])
                .output()
                .ok()
                .and_then(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .trim()
                        .parse::<i32>()
                        .ok()
                })
                .filter(|p| *p > 0);
            if let Some(pid) = main_pid
                && socket_answers(&self.socket)
            {
                let pid_path = self.dir.join(PID_FILE);
                fs::write(&pid_path, pid.to_string()).map_err(io_err(&pid_path))?;
                self.pid = Some(pid);
                std::thread::sleep(Duration::from_millis(300));
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(LocalError::Timeout {
                    socket: self.socket.clone(),
                    secs: 20,
                    log: log_path.to_path_buf(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Builds the busybox image from `/bin/busybox` and imports it (`ctr images import`).
    pub fn import_image(&self) -> Result<BuiltImage, LocalError> {
        let archive = self.dir.join("busybox.tar");
        let built = build_busybox_image(Path::new("/bin/busybox"), LOCAL_IMAGE, &archive)?;
        run_cmd(
            Command::new("ctr")
                .arg("-a")
                .arg(&self.socket)
                .args(["-n", "k8s.io", "images", "import"])
                .arg(&built.archive),
        )?;
        Ok(built)
    }

    /// Stops the containerd process: SIGTERM, SIGKILL after 10 s. Containers keep running
    /// under their shims (see [`Self::teardown`]).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(i32::try_from(child.id()).unwrap_or(0), Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        } else if let Some(pid) = self.pid.take() {
            if !is_our_containerd(pid, &self.config) {
                return;
            }
            signal(pid, Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if !alive(pid) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if is_our_containerd(pid, &self.config) {
                signal(pid, Signal::KILL);
            }
        }
    }

    /// Stops and removes every sandbox through CRI (clean shim exits). All sandboxes of a
    /// private containerd are ours.
    pub async fn remove_all_pods(&self) {
        use enforcer::cri::{ContainerRuntime as _, CriRuntime};
        if !socket_answers(&self.socket) {
            return;
        }
        let rt = CriRuntime::new(&self.socket, Duration::from_secs(10));
        let Ok(sandboxes) = rt.list_pod_sandboxes(Default::default()).await else {
            return;
        };
        for s in sandboxes {
            if let Err(e) = rt.stop_pod_sandbox(&s.id).await {
                eprintln!("warning: stopping sandbox {}: {e}", s.id);
            }
            if let Err(e) = rt.remove_pod_sandbox(&s.id).await {
                eprintln!("warning: removing sandbox {}: {e}", s.id);
            }
        }
    }

    /// Kills the shims of this containerd (by PID, found by their `-address`), stops
    /// containerd, unmounts everything below the directory and deletes the network namespace.
    /// Container processes die with their shims' pid namespaces; pod cgroups are the caller's.
    pub fn teardown(&mut self) {
        for pid in shims_of(&self.socket) {
            signal(pid, Signal::KILL);
        }
        self.stop();
        let mut mounts = mounts_under(&self.dir);
        mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
        for m in mounts {
            // Best effort: a mount point below this containerd's own directory.
            let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
        }
        let _ = fs::remove_file(self.dir.join(PID_FILE));
        if self.netns_created
            && let Some(net) = &self.network
        {
            if let Err(e) = run_cmd(Command::new("ip").args(["netns", "delete", &net.netns])) {
                eprintln!("warning: deleting the network namespace {}: {e}", net.netns);
            }
            self.netns_created = false;
            let _ = fs::remove_file(self.dir.join("netns"));
        }
    }

    /// [`Self::teardown`], then removes the directory (all but the log when `keep_log`).
    pub fn remove(mut self, keep_log: bool) -> Result<(), LocalError> {
        self.teardown();
        if !keep_log {
            return fs::remove_dir_all(&self.dir).map_err(io_err(&self.dir));
        }
        let rd = fs::read_dir(&self.dir).map_err(io_err(&self.dir))?;
        for e in rd.flatten() {
            if e.file_name() == LOG_FILE {
                continue;
            }
            let p = e.path();
            let r = if e.file_type().is_ok_and(|t| t.is_dir()) {
                fs::remove_dir_all(&p)
            } else {
                fs::remove_file(&p)
            };
            r.map_err(io_err(&p))?;
        }
        Ok(())
    }
}

/// Sends `sig` to `pid` (a process this module started, checked by the callers); best effort.
fn signal(pid: i32, sig: Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// Spawns `cmd` inside the network namespace `netns` (an open `/run/netns/<name>`): a scoped
/// thread enters the namespace (`setns(CLONE_NEWNET)` moves only the calling thread) and
/// spawns, so the child inherits the namespace; the thread, and the namespace change with it,
/// ends right after.
fn spawn_in_netns(cmd: &mut Command, netns: &fs::File) -> std::io::Result<Child> {
    std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::move_into_link_name_space(
                netns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            cmd.spawn()
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the spawning thread panicked")))
    })
}

fn read_pid(dir: &Path) -> Option<i32> {
    fs::read_to_string(dir.join(PID_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|p: &i32| *p > 0)
}

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

/// Whether `pid` is a live containerd started with `config`.
fn is_our_containerd(pid: i32, config: &Path) -> bool {
    let Ok(cmd) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
    let want = config.as_os_str().as_encoded_bytes();
    alive(pid) && args.first().is_some_and(|a| a.ends_with(b"containerd")) && args.contains(&want)
}

/// PIDs of containerd shims started for the containerd at `socket`.
#[must_use]
pub fn shims_of(socket: &Path) -> Vec<i32> {
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
#[must_use]
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(dir))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_names_and_subnets_are_checked() {
        let ok = CniBridge::new("rt-cni-12345-7", 77, 3);
        assert!(ok.is_ok(), "{ok:?}");
        let net = ok.unwrap_or_else(|_| unreachable!());
        assert!(net.bridge.len() <= 15, "{}", net.bridge);
        assert_eq!(net.subnet, "10.77.3.0/24");
        let bad = CniBridge {
            netns: "x".into(),
            bridge: "b".into(),
            subnet: "192.168.1.0/24".into(),
        };
        assert!(bad.validate().is_err());
        let bad = CniBridge {
            netns: "x".into(),
            bridge: "a-very-long-bridge-name".into(),
            subnet: "10.1.1.0/24".into(),
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn conflist_keeps_ipam_state_in_the_directory() {
        let net = CniBridge {
            netns: "n".into(),
            bridge: "enf-x".into(),
            subnet: "10.9.8.0/24".into(),
        };
        let text = net.conflist(Path::new("/tmp/x/cni-ipam"));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(v["plugins"][0]["ipam"]["dataDir"], "/tmp/x/cni-ipam");
        assert_eq!(v["plugins"][0]["ipMasq"], false);
        assert_eq!(v["plugins"][0]["bridge"], "enf-x");
    }

    #[test]
    fn config_points_everything_into_the_directory() {
        let d = Path::new("/tmp/cd");
        let text = config_toml(d, &d.join(SOCKET_FILE), false);
        assert!(config_toml(d, &d.join(SOCKET_FILE), true).contains("SystemdCgroup = true"));
        assert!(text.contains("root = \"/tmp/cd/root\""));
        assert!(text.contains("address = \"/tmp/cd/containerd.sock\""));
        assert!(text.contains("restrict_oom_score_adj = true"));
        assert!(text.contains("netns_mounts_under_state_dir = true"));
        assert!(text.contains("conf_dir = \"/tmp/cd/cni\""));
        assert!(text.contains("config_path = \"/tmp/cd/certs.d\""));
    }
}
