//! kubelet's part on a test node: the enforcer's own pod runtime in process (kubelet's labels,
//! annotations, pod cgroups and `oom_score_adj` formula; no eviction manager), its pods from
//! the API server or the manifest directory; and the memory workloads the companion and
//! install tests put beside it.

use std::{path::PathBuf, sync::Arc, time::Duration};

use enforcer::{cri::CriRuntime, pods::run_pods_with, status_manager::StatusManager};
use serde_json::{Value, json};

use crate::{
    containerd::Containerd,
    pods::{self, NODE},
};

/// A busybox pod of this node: `request` of memory (a Burstable pod), `priority`, `script`.
pub fn pod_json(name: &str, uid: &str, priority: i32, request: &str, script: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "default", "uid": uid,
            "annotations": {"enforcer/priority": priority.to_string()},
        },
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "priority": priority,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": "busybox:local",
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "resources": {"requests": {"memory": request}},
            }],
        },
        "status": {"phase": "Pending"},
    })
}

/// Holds `mib` of anonymous memory at once.
pub fn holder(mib: u32) -> String {
    format!(
        "(head -c {} /dev/zero; sleep 3600) | tail -c {mib}m >/dev/null; sleep 3600",
        u64::from(mib) << 20
    )
}

/// Grows by 12 MiB every 0.5 s up to `max_mib`, then holds it.
pub fn grower(max_mib: u32) -> String {
    let steps = max_mib / 12;
    format!(
        "(i=0; while [ $i -lt {steps} ]; do head -c 12582912 /dev/zero; i=$((i+1)); sleep 0.5; done; sleep 3600) | tail -c {max_mib}m >/dev/null; sleep 3600"
    )
}

/// The kubelet stand-in: the enforcer's pod runtime in process (no eviction manager), its
/// pods from the API server when `kubeconfig`, else from its manifest directory, as workload
/// pods (not static).
pub struct Kubelet {
    pub status: StatusManager,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Kubelet {
    pub fn start(cd: &Containerd, kubeconfig: Option<PathBuf>) -> Self {
        std::fs::create_dir_all(pods::manifests(cd)).expect("manifest dir");
        let mut o = pods::opts(cd);
        o.static_pods = false;
        o.kubeconfig = kubeconfig;
        // kubelet sets oom_score_adj once, at creation; it does not correct it afterwards.
        o.enforce =
            Arc::new(enforcer::container_manager::Enforcer::default().with_oom_scores_left());
        let status = StatusManager::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let rt = Arc::new(CriRuntime::new(&cd.socket, Duration::from_secs(5)));
        let s = status.clone();
        let task = tokio::spawn(async move {
            run_pods_with(rt, o, s, async {
                let _ = rx.await;
            })
            .await
            .expect("the kubelet stand-in");
        });
        Self {
            status,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn running(&self, uid: &str) -> bool {
        self.status.get(uid).is_some_and(|p| p.phase == "Running")
    }

    pub async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(60), t).await;
        }
    }
}
