//! A private containerd for the runtime tests: the busybox OCI image built from the node's
//! `busybox-static`, containerd with its own root, state, socket and runc root under a temp dir,
//! the image imported, and everything torn down afterwards (processes by PID only, mounts under
//! the temp dir, the test's cgroup root). Never touches a system-wide containerd.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use enforcer::policy::{
    cgroup_name::{self, CgroupDriver, CgroupName},
    qos::QosClass,
};

use crate::local::{CniBridge, LocalContainerd};

/// Paths of the tools the fixture needs; a missing one fails the test loudly.
pub fn require_tools() {
    if let Err(e) = crate::local::require_tools() {
        panic!("{e}");
    }
}

/// A private containerd ([`LocalContainerd`]) and the test's cgroup root.
#[derive(Debug)]
pub struct Containerd {
    /// The temp dir holding everything (root, state, socket, config, image, manifests).
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub config: PathBuf,
    /// The cgroup root for pods as kubelet's `cgroupRoot` (cgroupfs form), e.g.
    /// `/enforcer-test-1-2-x`; with systemd its cgroup is `/enforcer_test_1_2_x.slice`.
    pub cgroup_root: String,
    /// The cgroup driver of this run ([`crate::cgroup_driver`]), containerd's too.
    pub driver: CgroupDriver,
    /// The pod network, when started with [`Containerd::start_with_cni`].
    pub network: Option<CniBridge>,
    local: LocalContainerd,
    torn_down: bool,
}

impl Containerd {
    /// Builds the image, starts containerd, imports the image (host-network pods only).
    pub fn start(tag: &str) -> Self {
        Self::start_inner(tag, false)
    }

    /// As [`Containerd::start`], with containerd inside a network namespace of the test's own
    /// holding a bridge + host-local CNI network (unique bridge name, a 10.x/24 subnet), so
    /// pods without `hostNetwork` get an IP; all of it goes with the namespace at teardown.
    pub fn start_with_cni(tag: &str) -> Self {
        Self::start_inner(tag, true)
    }

    /// As [`Containerd::start`], with containerd's root (its content store and snapshots: the
    /// image filesystem `ImageFsInfo` reports) on a tmpfs of `bytes` of the test's own, so
    /// image disk usage is the test's to fill (unmounted at teardown).
    pub fn start_with_imagefs(tag: &str, bytes: u64) -> Self {
        crate::require_root();
        require_tools();
        let name = crate::unique_name(tag);
        let dir = std::env::temp_dir().join(&name);
        let mut local = LocalContainerd::new(&dir, None)
            .unwrap_or_else(|e| panic!("preparing a private containerd in {}: {e}", dir.display()));
        let root = local.dir().join("root");
        std::fs::create_dir_all(&root).expect("containerd root");
        let data = std::ffi::CString::new(format!("mode=0711,size={bytes}")).unwrap_or_default();
        rustix::mount::mount(
            "tmpfs",
            &root,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            data.as_c_str(),
        )
        .unwrap_or_else(|e| panic!("tmpfs on {}: {e}", root.display()));
        if let Err(e) = local
            .launch()
            .and_then(|()| local.import_image().map(|_| ()))
        {
            local.teardown();
            panic!("starting a private containerd in {}: {e}", dir.display());
        }
        Self::of(&name, local, None)
    }

    /// The fixture of a started `local` named `name`.
    fn of(name: &str, local: LocalContainerd, network: Option<CniBridge>) -> Self {
        Self {
            dir: local.dir().to_path_buf(),
            socket: local.socket().to_path_buf(),
            config: local.config().to_path_buf(),
            cgroup_root: format!("/{name}"),
            driver: crate::cgroup_driver(),
            network,
            local,
            torn_down: false,
        }
    }

    fn start_inner(tag: &str, cni: bool) -> Self {
        crate::require_root();
        require_tools();
        let name = crate::unique_name(tag);
        let dir = std::env::temp_dir().join(&name);
        let network = cni.then(|| {
            // A subnet per process and fixture: 10.(pid % 200 + 50).(seq).0/24.
            let pid = std::process::id();
            let seq = name
                .split('-')
                .nth(3)
                .and_then(|s| s.parse::<u32>().ok())
                .unwrap_or(0);
            let a = u8::try_from(pid % 200 + 50).unwrap_or(50);
            let b = u8::try_from(seq % 250).unwrap_or(0);
            CniBridge::new(&format!("{}-{}", pid % 100_000, seq), a, b)
                .unwrap_or_else(|e| panic!("CNI network: {e}"))
        });
        let local = LocalContainerd::start(&dir, network.clone())
            .unwrap_or_else(|e| panic!("starting a private containerd in {}: {e}", dir.display()));
        Self::of(&name, local, network)
    }

    /// Starts (again) the containerd process and waits for its socket.
    pub fn launch(&mut self) {
        if let Err(e) = self.local.launch() {
            panic!("{e}");
        }
    }

    /// Stops the containerd process (SIGTERM, then SIGKILL after 10 s); containers keep
    /// running under their shims.
    pub fn stop(&mut self) {
        self.local.stop();
    }

    /// The registry hosts directory (`<dir>/certs.d`, CRI `registry.config_path`): a
    /// `<host[:port]>/hosts.toml` written there is honoured at the next pull
    /// (see [`crate::registry::Registries::write_hosts`]).
    #[must_use]
    pub fn certs_dir(&self) -> PathBuf {
        self.local.certs_dir()
    }

    /// The containerd log so far (for assertion messages).
    #[must_use]
    pub fn log(&self) -> String {
        self.local.log()
    }

    /// The transient unit containerd runs as under the systemd driver.
    #[must_use]
    pub fn containerd_unit(&self) -> String {
        self.local.unit()
    }

    /// The test's cgroup root as a path in every hierarchy, in the driver's form
    /// (`/enforcer-test-1-2-x` or `/enforcer_test_1_2_x.slice`).
    #[must_use]
    pub fn root_path(&self) -> String {
        self.driver
            .name(&CgroupName::from_cgroupfs(&self.cgroup_root))
    }

    /// The kubepods cgroup below the root, in the driver's form.
    #[must_use]
    pub fn kubepods_path(&self) -> String {
        self.driver.name(&cgroup_name::kubepods(&self.cgroup_root))
    }

    /// A QoS tier's cgroup (kubepods itself for Guaranteed), in the driver's form.
    #[must_use]
    pub fn tier_path(&self, qos: QosClass) -> String {
        self.driver
            .name(&cgroup_name::qos_tier(&self.cgroup_root, qos))
    }

    /// A pod's cgroup, in the driver's form.
    #[must_use]
    pub fn pod_path(&self, qos: QosClass, uid: &str) -> String {
        let name = cgroup_name::pod(&self.cgroup_root, qos, uid)
            .unwrap_or_else(|e| panic!("pod uid {uid:?}: {e}"));
        self.driver.name(&name)
    }

    /// A container's cgroup below its pod's (`<pod>/<id>`, or with systemd
    /// `<pod>/cri-containerd-<id>.scope`).
    #[must_use]
    pub fn container_path(&self, pod: &str, id: &str) -> String {
        match self.driver {
            CgroupDriver::Cgroupfs => format!("{pod}/{id}"),
            CgroupDriver::Systemd => format!("{pod}/cri-containerd-{id}.scope"),
        }
    }

    /// The uid of each pod cgroup directory of [`Self::pod_cgroups`] (either layout).
    #[must_use]
    pub fn pod_cgroup_uids(&self) -> Vec<String> {
        self.pod_cgroups()
            .iter()
            .filter_map(|p| enforcer::cgroup::pod_of_path(&p.to_string_lossy()))
            .map(|r| r.uid)
            .collect()
    }

    /// The pod cgroup directories of the test's cgroup root that exist, in any hierarchy
    /// (either driver's layout).
    #[must_use]
    pub fn pod_cgroups(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for mount in hierarchy_mounts() {
            let root = mount.join(self.root_path().trim_start_matches('/'));
            walk_dirs(&root, &mut |p| {
                let rel = p.strip_prefix(&mount).unwrap_or(p).to_string_lossy();
                if enforcer::cgroup::pod_of_path(&rel).is_some_and(|r| r.container.is_none()) {
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
        // 1. Container processes: everything inside the test's cgroup root (with systemd,
        //    its slice stopped first: the scopes and slices in it go with it).
        if self.driver == CgroupDriver::Systemd {
            let unit = CgroupName::from_cgroupfs(&self.cgroup_root).systemd_unit();
            let mut stop = std::process::Command::new("systemctl");
            stop.args(["stop", &unit]);
            let _ = crate::local::bounded(&stop, 60).status();
        }
        // `cgroup.kill` (cgroup v2, Linux 5.14) kills the whole subtree at once: a fork loop
        // cannot outrun it, as it can a walk that reads `cgroup.procs` and kills what it read
        // (a fork-heavy pod once outlived its test that way and held the CPUs after it).
        for mount in hierarchy_mounts() {
            let root = mount.join(self.root_path().trim_start_matches('/'));
            let _ = fs::write(root.join("cgroup.kill"), "1");
            walk_dirs(&root, &mut |p| kill_procs_in(p));
        }
        // 2. The shims of this containerd (by PID), containerd, the mounts below the temp
        //    dir, and the test's network namespace (with its bridge).
        self.local.teardown();
        // 3. The cgroup root in every hierarchy (after the processes are gone).
        for mount in hierarchy_mounts() {
            let root = mount.join(self.root_path().trim_start_matches('/'));
            let deadline = Instant::now() + Duration::from_secs(5);
            while root.exists() && Instant::now() < deadline {
                walk_dirs(&root, &mut |p| kill_procs_in(p));
                remove_cgroup_tree(&root);
                if root.exists() {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        // 4. The temp dir.
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
        // A PID inside the test's own cgroup root.
        for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            crate::kill(pid, rustix::process::Signal::KILL);
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

impl Containerd {
    /// Stops and removes every sandbox through CRI (clean shim exits); call before drop.
    pub async fn remove_all_pods(&self) {
        self.local.remove_all_pods().await;
    }
}
