//! Idle neighbour pods for `cargo xtask bench eviction --pods N`: each one a Burstable pod
//! cgroup with its container cgroup, a process holding 1 MiB and appending a line to its log
//! file every second (`memhog --log`), known to the eviction manager as an active pod with a
//! status record naming its container (so a refresh reads the pod and the container, as it
//! does on a node). Under its memory request: never the victim while a BestEffort pod grows.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    sync::Arc,
};

use anyhow::Context as _;
use enforcer::{
    pods::{ActiveEntry, NodeLink},
    policy::{
        cgroup_name::{self, CgroupDriver},
        pod_actions::PodPhase,
        pod_status::{ContainerRecord, ContainerState, PodRecord},
        qos::QosClass,
    },
    status_manager::StatusManager,
};
use k8s_openapi::{
    api::core::v1::{Container, Pod, PodSpec, ResourceRequirements},
    apimachinery::pkg::api::resource::Quantity,
};

use crate::{TestCgroup, spawn_in};

/// The neighbours' container id (the container cgroup's name under each pod cgroup).
const CONTAINER_ID: &str = "idle";

/// The running neighbours; dropping them kills their processes and removes their cgroups.
pub struct Neighbours {
    children: Vec<Child>,
    link: NodeLink,
    uids: Vec<String>,
    // Declared before `burstable`: the pods' cgroups go first.
    cgroups: Vec<TestCgroup>,
    _burstable: Option<TestCgroup>,
    _logs: tempfile::TempDir,
}

/// A Burstable pod requesting 64Mi (its process holds about 2).
fn burstable_pod(name: &str, uid: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.to_owned());
    p.metadata.namespace = Some("default".to_owned());
    p.metadata.uid = Some(uid.to_owned());
    p.spec = Some(PodSpec {
        containers: vec![Container {
            name: "app".to_owned(),
            image: Some("busybox".to_owned()),
            resources: Some(ResourceRequirements {
                requests: Some([("memory".to_owned(), Quantity("64Mi".to_owned()))].into()),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }],
        ..PodSpec::default()
    });
    p
}

impl Neighbours {
    /// Starts `n` neighbours under `<root>/kubepods/burstable` of the memory hierarchy at
    /// `mount` (the cgroupfs driver's names), `memhog` being the workload binary.
    pub fn start(
        n: usize,
        root: &str,
        mount: &Path,
        memhog: &Path,
        link: &NodeLink,
        status: &StatusManager,
    ) -> anyhow::Result<Self> {
        let logs = tempfile::tempdir().context("the neighbours' log directory")?;
        let log_dir = logs.path().to_path_buf();
        let mut out = Self {
            children: Vec::with_capacity(n),
            link: link.clone(),
            uids: Vec::with_capacity(n),
            cgroups: Vec::with_capacity(n),
            _burstable: (n > 0).then(|| {
                TestCgroup::create(
                    mount,
                    &CgroupDriver::Cgroupfs.name(&cgroup_name::qos_tier(root, QosClass::Burstable)),
                )
            }),
            _logs: logs,
        };
        // On v2 the pods below get the memory controller's files.
        if let Some(b) = &out._burstable {
            crate::enable_subtree_controllers(&b.dir);
        }
        for i in 0..n {
            let uid = format!("aaaaaaaa-0000-0000-0000-{i:012}");
            let pod_rel =
                CgroupDriver::Cgroupfs.name(&cgroup_name::pod(root, QosClass::Burstable, &uid)?);
            let ctr = TestCgroup::create(mount, &format!("{pod_rel}/{CONTAINER_ID}"));
            let log = log_dir.join(format!("{uid}.log"));
            let mut cmd = Command::new(memhog);
            cmd.arg("--log")
                .arg(&log)
                .args(["1", "1000"])
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            out.children.push(spawn_in(cmd, &[ctr.dir.as_path()]));
            out.cgroups.push(ctr);
            let pod = burstable_pod(&format!("idle-{i}"), &uid);
            status.set(running_record(&pod, &uid));
            link.set_active(&uid, ActiveEntry::new(Arc::new(pod), pod_rel));
            out.uids.push(uid);
        }
        Ok(out)
    }
}

/// A running pod's status record with its one container (id [`CONTAINER_ID`]).
fn running_record(pod: &Pod, uid: &str) -> PodRecord {
    PodRecord {
        uid: uid.to_owned(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        namespace: "default".to_owned(),
        source: "bench".to_owned(),
        phase: PodPhase::Running,
        reason: String::new(),
        message: String::new(),
        qos_class: "Burstable".to_owned(),
        start_time: String::new(),
        pod_ips: Vec::new(),
        sandbox_id: String::new(),
        cgroup: String::new(),
        conditions: Vec::new(),
        init_container_statuses: Vec::new(),
        container_statuses: vec![ContainerRecord {
            name: "app".to_owned(),
            container_id: format!("containerd://{CONTAINER_ID}"),
            image: "busybox".to_owned(),
            image_id: String::new(),
            ready: true,
            started: Some(true),
            restart_count: 0,
            state: ContainerState::Running {
                started_at: String::new(),
            },
            last_state: None,
            oom_score_adj: None,
            oom_score_adj_decided: None,
            resources: Default::default(),
        }],
        resources: Default::default(),
    }
}

impl Drop for Neighbours {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for uid in &self.uids {
            self.link.remove_active(uid);
        }
    }
}
