//! Black-box volume tests: emptyDir (disk and memory), readOnly mounts, downwardAPI files, env
//! from fieldRef/resourceFieldRef, and refusals, against a private containerd (real runc
//! containers, real mounts). Needs root, containerd, runc and busybox-static.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use enforcer::{
    policy::qos::QosClass,
    status_manager::{self, ContainerState, StatusFile},
};
use enforcer_tests::{
    containerd::Containerd,
    layout,
    pods::{Enforcer, NODE, finish, manifests, pod, state, wait_status, write_manifest},
};

async fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut probe: impl FnMut() -> Option<T>,
    last: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "no {what} within {timeout:?}; last:\n{}",
            last()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Mounts under `dir` (from /proc/self/mounts): (mount point, fs type, options).
fn mounts_under(dir: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let prefix = dir.display().to_string();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && f[1].starts_with(&prefix))
                .then(|| (f[1].to_owned(), f[2].to_owned(), f[3].to_owned()))
        })
        .collect()
}

fn log_of(cd: &Containerd, uid: &str, container: &str) -> String {
    std::fs::read_to_string(
        state(cd)
            .join("pods")
            .join(uid)
            .join(container)
            .join("0.log"),
    )
    .unwrap_or_default()
}

fn memory_usage(rel: &str) -> u64 {
    let l = layout();
    let (mount, _) = l.controller("memory").expect("a memory controller");
    let dir = mount.join(rel.trim_start_matches('/'));
    ["memory.usage_in_bytes", "memory.current"]
        .iter()
        .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

const SHARED: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: vols
  uid: vol-1
  labels: {app: web, tier: front}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 2
  volumes:
  - {name: shared, emptyDir: {}}
  - {name: mem, emptyDir: {medium: Memory, sizeLimit: 32Mi}}
  - name: info
    downwardAPI:
      items:
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
      - {path: cpu_limit, resourceFieldRef: {containerName: reader, resource: limits.cpu, divisor: 1m}}
  containers:
  - name: writer
    image: busybox:local
    command: [sh, -c, 'echo hello-from-writer > /data/msg; sleep 3600']
    volumeMounts: [{name: shared, mountPath: /data}]
  - name: reader
    image: busybox:local
    command: [sh, -c]
    args:
    - |
      while [ ! -s /data/msg ]; do sleep 0.1; done
      echo "READ $(cat /data/msg)"
      if touch /ro/x 2>/dev/null; then echo RO-WRITABLE; else echo RO-REFUSED; fi
      echo "LABELS $(cat /etc/info/labels | tr '\n' ' ')"
      echo "CPU $(cat /etc/info/cpu_limit)"
      echo "ENV $MY_POD $MY_NS $MY_UID $MY_APP $MEM_MI $GREETING"
      echo "IPS host=$HOST_IP pod=$POD_IP"
      grep ' /mem ' /proc/mounts | sed 's/^/MOUNT /'
      dd if=/dev/zero of=/mem/blob bs=1M count=16 2>/dev/null && echo WROTE-MEM
      sleep 3600
    resources: {limits: {cpu: 500m, memory: 256Mi}}
    env:
    - {name: MY_POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: MY_NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    - {name: MY_UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}
    - {name: MY_APP, valueFrom: {fieldRef: {fieldPath: "metadata.labels['app']"}}}
    - {name: MEM_MI, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    - {name: GREETING, value: "hi-$(MY_APP)"}
    - {name: HOST_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    volumeMounts:
    - {name: shared, mountPath: /data}
    - {name: shared, mountPath: /ro, readOnly: true}
    - {name: mem, mountPath: /mem}
    - {name: info, mountPath: /etc/info}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emptydirs_readonly_downward_api_and_env_as_kubelet_runs_them() {
    let cd = Containerd::start("vol-run");
    let e = Enforcer::start(&cd);
    let uid = "vol-1";
    write_manifest(&cd, "vols.yaml", SHARED);
    wait_status(&cd, Duration::from_secs(60), "running pod", |s| {
        pod(s, uid).is_some_and(|p| {
            p.phase == "Running"
                && p.container_statuses
                    .iter()
                    .all(|c| matches!(c.state, ContainerState::Running { .. }))
        })
    })
    .await;
    // The reader sees what the writer wrote, through the shared emptyDir.
    let log = wait_for(
        Duration::from_secs(60),
        "reader output",
        || {
            let l = log_of(&cd, uid, "reader");
            l.contains("WROTE-MEM").then_some(l)
        },
        || {
            format!(
                "reader log:\n{}\nstatus:\n{}",
                log_of(&cd, uid, "reader"),
                serde_json::to_string_pretty(
                    &status_manager::read(&state(&cd)).unwrap_or_default()
                )
                .unwrap_or_default()
            )
        },
    )
    .await;
    assert!(log.contains("READ hello-from-writer"), "{log}");
    // The readOnly mount refuses writes.
    assert!(log.contains("RO-REFUSED"), "{log}");
    // The downward API file: labels as fieldpath.FormatMap writes them; the cpu limit in
    // millicores.
    assert!(log.contains(r#"LABELS app="web" tier="front""#), "{log}");
    assert!(log.contains("CPU 500"), "{log}");
    // Env from fieldRef / resourceFieldRef, and $(VAR) expansion.
    assert!(
        log.contains(&format!("ENV vols-{NODE} default vol-1 web 256 hi-web")),
        "{log}"
    );
    // A host-network pod's IP is the node's (kubelet's podIPs = hostIPs; both empty on a
    // machine without a default route).
    let ips = log.lines().find(|l| l.contains("IPS ")).unwrap_or_default();
    let host = ips
        .split("host=")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_default();
    assert!(ips.ends_with(&format!("pod={host}")), "{log}");
    // The memory emptyDir is a tmpfs of the sizeLimit (32Mi = 32768k).
    let mount_line = log
        .lines()
        .find(|l| l.contains("MOUNT "))
        .unwrap_or_default()
        .to_owned();
    assert!(
        mount_line.contains(" /mem tmpfs ") && mount_line.contains("size=32768k"),
        "{log}"
    );
    // On the host too, under the pod's directory in the state dir.
    let vol_root = state(&cd).join("pods").join(uid).join("volumes");
    let host = mounts_under(&vol_root);
    assert!(
        host.iter()
            .any(|(m, t, o)| m.ends_with("kubernetes.io~empty-dir/mem")
                && t == "tmpfs"
                && o.contains("size=32768k")),
        "{host:?}"
    );
    assert!(
        vol_root
            .join("kubernetes.io~empty-dir/shared/msg")
            .is_file()
    );
    assert!(
        vol_root
            .join("kubernetes.io~downward-api/info/..data")
            .exists()
    );
    // 16 MiB written to the tmpfs are charged to the pod's memory cgroup.
    let used = memory_usage(&cd.pod_path(QosClass::Burstable, uid));
    assert!(used >= 16 << 20, "pod memory usage {used} < 16Mi");

    // Removal: the tmpfs is unmounted and the volumes are gone.
    std::fs::remove_file(manifests(&cd).join("vols.yaml")).expect("rm");
    wait_status(&cd, Duration::from_secs(60), "pod gone", |s| {
        pod(s, uid).is_none()
    })
    .await;
    // The worker removes the pod's status record after its teardown.
    let left = mounts_under(&state(&cd));
    assert!(left.is_empty(), "mounts left: {left:?}");
    assert!(!vol_root.exists(), "{} left", vol_root.display());
    finish(e, cd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_volumes_refused_host_path_checked_sub_path_refused() {
    let cd = Containerd::start("vol-refuse");
    let e = Enforcer::start(&cd);
    let file = cd.dir.join("a-file");
    std::fs::write(&file, b"x").expect("file");
    let pod_yaml = |name: &str, uid: &str, volumes: &str, mounts: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, uid: {uid}}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  volumes: [{volumes}]\n  containers:\n  - name: c\n    image: busybox:local\n    command: [sleep, '3600']\n    volumeMounts: [{mounts}]\n"
        )
    };
    write_manifest(
        &cd,
        "cm.yaml",
        &pod_yaml(
            "cm",
            "vol-cm",
            "{name: cfg, configMap: {name: x}}",
            "{name: cfg, mountPath: /cfg}",
        ),
    );
    write_manifest(
        &cd,
        "hp.yaml",
        &pod_yaml(
            "hp",
            "vol-hp",
            &format!(
                "{{name: h, hostPath: {{path: '{}', type: Directory}}}}",
                file.display()
            ),
            "{name: h, mountPath: /h}",
        ),
    );
    write_manifest(
        &cd,
        "sub.yaml",
        &pod_yaml(
            "sub",
            "vol-sub",
            "{name: s, emptyDir: {}}",
            "{name: s, mountPath: /s, subPath: ../escape}",
        ),
    );
    let waiting = |s: &StatusFile, uid: &str, want: &str| {
        pod(s, uid)
            .and_then(|p| p.container_statuses.first())
            .is_some_and(
                |c| matches!(&c.state, ContainerState::Waiting { reason, .. } if reason == want),
            )
    };
    let s = wait_status(&cd, Duration::from_secs(60), "refusals", |s| {
        pod(s, "vol-cm").is_some_and(|p| p.phase == "Failed")
            && waiting(s, "vol-hp", "ContainerCreating")
            && waiting(s, "vol-sub", "CreateContainerConfigError")
    })
    .await;
    // An unsupported volume: refused at admission, with the reason and a clear message.
    let cm = pod(&s, "vol-cm").expect("cm");
    assert_eq!(cm.reason, "UnsupportedVolume", "{cm:?}");
    assert!(
        cm.message
            .contains("configMap volume needs API server objects"),
        "{}",
        cm.message
    );
    // A hostPath of the wrong type: kubelet's type-check message, the container not created.
    let message = |uid: &str| match &pod(&s, uid).expect("pod").container_statuses[0].state {
        ContainerState::Waiting { message, .. } => message.clone(),
        other => format!("{other:?}"),
    };
    let hp = message("vol-hp");
    assert!(
        hp.contains(&format!(
            "hostPath type check failed: {} is not a directory",
            file.display()
        )),
        "{hp}"
    );
    // A subPath with `..`: kubelet's makeMounts refusal.
    let sub = message("vol-sub");
    assert!(
        sub.contains("unable to provision SubPath `../escape`: must not contain '..'"),
        "{sub}"
    );
    for f in ["cm.yaml", "hp.yaml", "sub.yaml"] {
        std::fs::remove_file(manifests(&cd).join(f)).expect("rm");
    }
    wait_status(&cd, Duration::from_secs(60), "pods gone", |s| {
        ["vol-cm", "vol-hp", "vol-sub"]
            .iter()
            .all(|u| pod(s, u).is_none())
    })
    .await;
    assert!(!state(&cd).join("pods/vol-sub/volumes").exists());
    finish(e, cd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_of_a_pod_removed_while_the_enforcer_was_down_are_torn_down_on_start() {
    let cd = Containerd::start("vol-restart");
    let mut e = Enforcer::start(&cd);
    let uid = "vol-r";
    write_manifest(
        &cd,
        "r.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: r, uid: vol-r}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  volumes: [{name: mem, emptyDir: {medium: Memory, sizeLimit: 8Mi}}]\n  containers:\n  - {name: c, image: 'busybox:local', command: [sleep, '3600'], volumeMounts: [{name: mem, mountPath: /mem}]}\n",
    );
    wait_status(&cd, Duration::from_secs(60), "running pod", |s| {
        pod(s, uid).is_some_and(|p| p.phase == "Running")
    })
    .await;
    // The enforcer stops (pods keep running); meanwhile the pod is deleted and the runtime
    // forgets it.
    e.stop().await;
    std::fs::remove_file(manifests(&cd).join("r.yaml")).expect("rm");
    cd.remove_all_pods().await;
    let pod_dir = state(&cd).join("pods").join(uid);
    assert_eq!(
        mounts_under(&pod_dir).len(),
        1,
        "the tmpfs is still mounted"
    );
    // On start, the pod directory no source and no runtime knows is torn down.
    let e = Enforcer::start(&cd);
    wait_for(
        Duration::from_secs(30),
        "the stale pod directory removed",
        || (mounts_under(&pod_dir).is_empty() && !pod_dir.exists()).then_some(()),
        || format!("{:?}", mounts_under(&pod_dir)),
    )
    .await;
    finish(e, cd).await;
}
