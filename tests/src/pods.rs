//! The enforcer's pod runtime in process (`run_pods_with`) against a test's private
//! containerd, with the manifest and state directories beside it: the harness of the
//! `runtime` and `volumes` tiers.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use enforcer::{
    cri::{CriRuntime, spec::NodeFacts},
    kernel::Capabilities,
    pods::{RunPodsOptions, run_pods_with},
    recorder::{EventRecord, EventType, Recorder},
    status_manager::{self, PodRecord, StatusFile, StatusManager},
};
use tokio::{sync::oneshot, task::JoinHandle};

use crate::{containerd::Containerd, layout, local::mounts_under};

/// The node name the pods run on.
pub const NODE: &str = "testnode";

/// The manifest directory of `cd`'s enforcer.
#[must_use]
pub fn manifests(cd: &Containerd) -> PathBuf {
    cd.dir.join("manifests")
}

/// The state directory of `cd`'s enforcer.
#[must_use]
pub fn state(cd: &Containerd) -> PathBuf {
    cd.dir.join("enforcer-state")
}

/// The pod runtime's options for `cd`: its socket, cgroup root and directories, fast polls.
#[must_use]
pub fn opts(cd: &Containerd) -> RunPodsOptions {
    let layout = layout();
    let caps = Capabilities::probe(&layout);
    RunPodsOptions {
        cri_socket: cd.socket.clone(),
        cri_timeout: Duration::from_secs(5),
        cgroup_root: cd.cgroup_root.clone(),
        cgroup_driver: cd.driver,
        layout,
        manifest_dir: manifests(cd),
        state_dir: state(cd),
        node_name: NODE.to_owned(),
        node: NodeFacts {
            memory_capacity: enforcer::node::machine_memory().unwrap_or(0),
            cap_sys_resource: caps.cap_sys_resource,
        },
        poll: Duration::from_millis(200),
        relist: Duration::from_millis(200),
        resync: Duration::from_secs(2),
        static_pods: true,
        admission: None,
        link: enforcer::pods::NodeLink::default(),
        enforce: Arc::default(),
        kubeconfig: None,
        health: Arc::default(),
        events: enforcer::recorder::Recorder::default(),
        dns: enforcer::policy::dns::DnsSettings::default(),
        images: Arc::new(enforcer::cri::images::ImageManager::new(
            &enforcer::cri::images::ImageOptions {
                node_config: state(cd).join("config.json"),
                secret_dir: cd.dir.join("pull-secrets"),
                // Image GC only on a full disk: the build machine's disk is not the test's
                // subject (see `crate::disk_neutral`).
                gc: enforcer::policy::images::gc::GcPolicy {
                    high_percent: 100,
                    low_percent: 99,
                    ..Default::default()
                },
                ..Default::default()
            },
        )),
    }
}

/// The enforcer's pod runtime, in process, against the fixture's containerd; the events it
/// records are kept for [`Enforcer::events_of`].
pub struct Enforcer {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    events: tokio::sync::mpsc::Receiver<EventRecord>,
    seen: Vec<EventRecord>,
}

impl Enforcer {
    /// Starts it with [`opts`].
    #[must_use]
    pub fn start(cd: &Containerd) -> Self {
        Self::start_with(cd, |_| {})
    }

    /// Starts it with [`opts`] as `change` leaves them.
    #[must_use]
    pub fn start_with(cd: &Containerd, change: impl FnOnce(&mut RunPodsOptions)) -> Self {
        std::fs::create_dir_all(manifests(cd)).expect("manifest dir");
        let (tx, rx) = oneshot::channel();
        let rt = Arc::new(CriRuntime::new(&cd.socket, Duration::from_secs(5)));
        let (recorder, events) = Recorder::channel();
        let mut o = opts(cd);
        change(&mut o);
        o.events = recorder;
        let task = tokio::spawn(async move {
            run_pods_with(rt, o, StatusManager::default(), async {
                let _ = rx.await;
            })
            .await
            .expect("run_pods");
        });
        Self {
            stop: Some(tx),
            task: Some(task),
            events,
            seen: Vec::new(),
        }
    }

    /// Every event so far (type, reason, message) of the container `container` of the pod
    /// whose name starts with `name` (static pods are named `<name>-<node>`).
    pub fn events_of(&mut self, name: &str, container: &str) -> Vec<(EventType, String, String)> {
        while let Ok(e) = self.events.try_recv() {
            self.seen.push(e);
        }
        let field = format!("spec.containers{{{container}}}");
        self.seen
            .iter()
            .filter(|e| e.involved.name.starts_with(name) && e.involved.field_path == field)
            .map(|e| (e.type_, e.reason.clone(), e.message.clone()))
            .collect()
    }

    /// Stops it (within 60 s, or the test fails).
    pub async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("enforcer stops within 60 s")
                .expect("enforcer task");
        }
    }
}

/// Writes a manifest atomically (a temporary file renamed), as an operator's tool would.
pub fn write_manifest(cd: &Containerd, file: &str, text: &str) {
    let dir = manifests(cd);
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).expect("write manifest");
    std::fs::rename(&tmp, dir.join(file)).expect("rename manifest");
}

/// The status file now (empty before the first write).
#[must_use]
pub fn read_status(cd: &Containerd) -> StatusFile {
    status_manager::read(&state(cd)).unwrap_or_default()
}

/// Polls the status file until `pred` holds; fails after `timeout` with the last status and
/// containerd's log tail.
pub async fn wait_status(
    cd: &Containerd,
    timeout: Duration,
    what: &str,
    mut pred: impl FnMut(&StatusFile) -> bool,
) -> StatusFile {
    let deadline = Instant::now() + timeout;
    loop {
        let s = read_status(cd);
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() <= deadline,
            "no {what} within {timeout:?}; last status:\n{}\ncontainerd log tail:\n{}",
            serde_json::to_string_pretty(&s).unwrap_or_default(),
            cd.log()
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The record of pod `uid`.
#[must_use]
pub fn pod<'a>(s: &'a StatusFile, uid: &str) -> Option<&'a PodRecord> {
    s.pods.iter().find(|p| p.uid == uid)
}

/// Stops the enforcer, removes the pods, unmounts what a failed test left below the
/// fixture's directory (volume tmpfs mounts) and tears containerd down.
pub async fn finish(mut e: Enforcer, mut cd: Containerd) {
    e.stop().await;
    cd.remove_all_pods().await;
    for m in mounts_under(&cd.dir) {
        let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
    }
    cd.teardown();
}
