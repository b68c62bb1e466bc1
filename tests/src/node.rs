//! A small node for the pressure and e2e tiers: a private containerd, a manifest directory,
//! a state directory and the daemon in-process; manifests in, `pods.json` out.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use enforcer::{
    config::ConfigArgs,
    status_manager::{self, ContainerState, PodRecord},
};
use tokio::time::Instant;

use crate::{Daemon, containerd::Containerd};

/// A busybox pod manifest running `script` under `sh -c` in container `app`; `extra_spec`
/// and `resources` are YAML lines at spec / container level (each ending in a newline).
#[must_use]
pub fn pod(name: &str, uid: &str, extra_spec: &str, resources: &str, script: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, uid: {uid}}}
spec:
  hostNetwork: true
{extra_spec}  containers:
  - name: app
    image: busybox:local
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "{script}"]
{resources}"#
    )
}

/// The status file (empty before the first write).
#[must_use]
pub fn status_file(state: &Path) -> status_manager::StatusFile {
    status_manager::read(state).unwrap_or_default()
}

/// The record whose (node-suffixed) name starts with `prefix`.
#[must_use]
pub fn find<'a>(recs: &'a [PodRecord], prefix: &str) -> Option<&'a PodRecord> {
    recs.iter().find(|r| r.name.starts_with(prefix))
}

/// The phase of the pod named `prefix...`.
#[must_use]
pub fn phase(state: &Path, prefix: &str) -> Option<String> {
    find(&status_file(state).pods, prefix).map(|r| r.phase.to_string())
}

/// Whether the node reports `condition` (`MemoryPressure`, ...) as `True`.
#[must_use]
pub fn pressure(state: &Path, condition: &str) -> bool {
    status_file(state)
        .node
        .true_conditions()
        .contains(&condition)
}

/// Polls `f` every 20 ms until it holds; fails the test naming `what` after `timeout`
/// (stretched by [`crate::time_scale`] where the machine is slow).
pub async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Instant {
    let timeout = crate::scaled(timeout);
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what} ({timeout:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Instant::now()
}

/// Whether a container of the pod ended `OOMKilled` (now or as its last state).
#[must_use]
pub fn oom_killed(state: &Path, prefix: &str) -> bool {
    find(&status_file(state).pods, prefix).is_some_and(|r| {
        r.container_statuses
            .iter()
            .chain(&r.init_container_statuses)
            .any(|c| {
                matches!(&c.state, ContainerState::Terminated { reason, .. } if reason == "OOMKilled")
                || matches!(&c.last_state, Some(ContainerState::Terminated { reason, .. }) if reason == "OOMKilled")
            })
    })
}

/// Sum of the `oom_kill` counters below a memory cgroup directory (v1 counts the kill in the
/// cgroup whose limit was hit; v2 in `memory.events`).
#[must_use]
pub fn oom_kills_below(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        total += crate::oom_kills_in(&d);
        if let Ok(rd) = std::fs::read_dir(&d) {
            stack.extend(
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    total
}

/// The node's kernel OOM kills (`/proc/vmstat`).
#[must_use]
pub fn node_oom_kills() -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("oom_kill ")
                .and_then(|v| v.trim().parse().ok())
        })
        .expect("/proc/vmstat has oom_kill")
}

/// A private containerd, the manifest and state directories, and the daemon running with
/// `args` (socket, directories, cgroup root and HTTP address filled in).
pub struct Node {
    pub cd: Containerd,
    pub manifests: PathBuf,
    pub state: PathBuf,
    config: enforcer::config::Config,
    kubeconfig: Option<PathBuf>,
    static_pods: bool,
    daemon: Option<Daemon>,
}

impl Node {
    /// A new containerd and the daemon on it.
    #[must_use]
    pub fn start(tag: &str, args: ConfigArgs, state: Option<PathBuf>) -> Self {
        let cd = Containerd::start(tag);
        Self::start_on(cd, args, state)
    }

    /// The daemon on `cd`, with its state in `state` (default: under the containerd dir).
    #[must_use]
    pub fn start_on(cd: Containerd, args: ConfigArgs, state: Option<PathBuf>) -> Self {
        Self::start_in_cluster(cd, args, state, None, false)
    }

    /// [`Self::start_on`], in cluster mode with `kubeconfig` when given, manifest pods run as
    /// static pods when `static_pods`.
    #[must_use]
    pub fn start_in_cluster(
        cd: Containerd,
        args: ConfigArgs,
        state: Option<PathBuf>,
        kubeconfig: Option<PathBuf>,
        static_pods: bool,
    ) -> Self {
        let manifests = cd.dir.join("manifests");
        let state = state.unwrap_or_else(|| cd.dir.join("state"));
        std::fs::create_dir_all(&manifests).expect("manifest dir");
        // No secure port unless the test asks for one (it would be 0.0.0.0:10250).
        let port = args.port.or(Some(0));
        // The local port where the test names one, else any free one.
        let http_address = args
            .http_address
            .clone()
            .or_else(|| Some("127.0.0.1:0".to_owned()));
        let args = ConfigArgs {
            port,
            cgroup_root: Some(cd.cgroup_root.clone()),
            cgroup_driver: Some(cd.driver.as_str().to_owned()),
            cri_socket: Some(cd.socket.clone()),
            manifest_dir: Some(manifests.clone()),
            state_dir: Some(state.clone()),
            http_address,
            allow_host_namespaces: Some(true),
            ..args
        };
        let config = enforcer::config::load(&crate::disk_neutral(&args))
            .expect("configuration")
            .config;
        let node = Self {
            cd,
            manifests,
            state,
            config,
            kubeconfig,
            static_pods,
            daemon: None,
        };
        node.with_daemon()
    }

    fn with_daemon(mut self) -> Self {
        self.daemon = Some(Daemon::start_with(enforcer::daemon::DaemonOptions {
            config: self.config.clone(),
            watches: vec![],
            run_pods: true,
            static_pods: self.static_pods,
            kubeconfig: self.kubeconfig.clone(),
            companion: None,
        }));
        self
    }

    /// Stops the daemon (the pods keep running) and starts it again with the same
    /// configuration, as a restart of the service would.
    pub async fn restart(&mut self) {
        self.stop_daemon().await;
        self.daemon = Some(Daemon::start_with(enforcer::daemon::DaemonOptions {
            config: self.config.clone(),
            watches: vec![],
            run_pods: true,
            static_pods: self.static_pods,
            kubeconfig: self.kubeconfig.clone(),
            companion: None,
        }));
    }

    /// Stops the daemon only; the pods keep running.
    pub async fn stop_daemon(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.stop().await;
        }
    }

    /// Writes a manifest file.
    pub fn submit(&self, file: &str, manifest: &str) {
        std::fs::write(self.manifests.join(file), manifest).expect("write manifest");
    }

    /// Deletes a manifest file (the pod is deleted).
    pub fn delete(&self, file: &str) {
        std::fs::remove_file(self.manifests.join(file)).expect("remove manifest");
    }

    /// The memory cgroup directory of the node's kubepods.
    #[must_use]
    pub fn kubepods_memory_dir(&self) -> PathBuf {
        let l = crate::layout();
        let (mount, _) = l.controller("memory").expect("memory controller");
        mount.join(self.cd.kubepods_path().trim_start_matches('/'))
    }

    /// Stops the daemon, removes the pods through CRI and tears containerd down.
    pub async fn shutdown(mut self) -> Containerd {
        if let Some(d) = self.daemon.take() {
            d.stop().await;
        }
        self.cd.remove_all_pods().await;
        self.cd
    }
}

/// A tmpfs mounted by the test (a small node filesystem), unmounted on drop.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `options` (`size=64m`, `size=64m,nr_inodes=2000`) on `path`.
    #[must_use]
    pub fn mount(path: &Path, options: &str) -> Self {
        std::fs::create_dir_all(path).expect("mount point");
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(path)
            .status()
            .expect("running mount");
        assert!(ok.success(), "mounting a tmpfs on {}", path.display());
        Self(path.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}
