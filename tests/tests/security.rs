//! Black-box security-context tests: the daemon (admission, pod workers) against a private
//! containerd, reading what each running container's process really got from the kernel in
//! `/proc/<pid>/status` (found through the container's cgroup): uid, gids, supplemental groups,
//! effective capabilities, `no_new_privs`, seccomp mode; a read-only root filesystem; the
//! sysctls set in the pod's IPC namespace; `runAsNonRoot` refused before the container is
//! created; unsafe sysctls and baseline violations refused at admission. Needs root,
//! containerd, runc and busybox-static; fails loudly without them.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use enforcer::{
    config::ConfigArgs,
    status_manager::{ContainerState, PodRecord},
};
use enforcer_tests::{
    containerd::Containerd,
    layout,
    node::{Node, find, status_file, wait_until},
};

/// A host-network busybox pod running `script` in container `app`, with the pod-level
/// `securityContext` `pod_sc` and the container-level `c_sc` (YAML flow maps, `{}` for none).
fn pod(name: &str, uid: &str, pod_sc: &str, c_sc: &str, script: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, uid: {uid}}}
spec:
  hostNetwork: true
  securityContext: {pod_sc}
  containers:
  - name: app
    image: busybox:local
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "{script}"]
    securityContext: {c_sc}
"#
    )
}

/// Tries to write to `/`, marks that it tried (in `/dev`, a tmpfs even under a read-only
/// root), then sleeps as pid 1.
const PROBE: &str = "touch /probe 2>/dev/null; touch /dev/probed; exec sleep 1000000";

fn record(state: &Path, name: &str) -> Option<PodRecord> {
    find(&status_file(state).pods, name).cloned()
}

fn running(state: &Path, name: &str) -> bool {
    record(state, name).is_some_and(|r| {
        r.phase == "Running"
            && r.container_statuses
                .iter()
                .all(|c| matches!(c.state, ContainerState::Running { .. }))
    })
}

/// The pid of the running container `app` of the pod: the one process in its cgroup.
fn pid_of(state: &Path, name: &str) -> u32 {
    let r = record(state, name).unwrap_or_else(|| panic!("{name}: no status"));
    let id = r
        .container_statuses
        .first()
        .map(|c| c.container_id.rsplit("://").next().unwrap_or("").to_owned())
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| panic!("{name}: no container id in {r:?}"));
    let l = layout();
    let (mount, _) = l.controller("memory").expect("memory controller");
    let dir = mount.join(r.cgroup.trim_start_matches('/')).join(&id);
    let procs = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let pids: Vec<u32> = procs
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert_eq!(
        pids.len(),
        1,
        "{name}: one process in {}: {pids:?}",
        dir.display()
    );
    pids[0]
}

/// The fields of `/proc/<pid>/status` (name -> value, whitespace-normalized).
fn proc_status(pid: u32) -> std::collections::BTreeMap<String, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| {
            (
                k.to_owned(),
                v.split_whitespace().collect::<Vec<_>>().join(" "),
            )
        })
        .collect()
}

fn field<'a>(s: &'a std::collections::BTreeMap<String, String>, k: &str) -> &'a str {
    s.get(k).map_or("<missing>", String::as_str)
}

/// A path inside the container's root, from the host.
fn in_root(pid: u32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root")).join(path.trim_start_matches('/'))
}

async fn wait_probed(pid: u32, name: &str) {
    wait_until(
        &format!("{name} tried to write /"),
        Duration::from_secs(20),
        || in_root(pid, "/dev/probed").exists(),
    )
    .await;
}

fn rejected(state: &Path, name: &str) -> Option<(String, String)> {
    record(state, name)
        .filter(|r| r.phase == "Failed" && !r.reason.is_empty())
        .map(|r| (r.reason, r.message))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_context_reaches_the_container_process_or_is_refused() {
    let node = Node::start(
        "security",
        ConfigArgs {
            allowed_unsafe_sysctls: vec!["kernel.sem".to_owned()],
            // Only a memory threshold: the machine's disk filling up must not turn these pods
            // away with DiskPressure.
            eviction_hard: vec!["memory.available<1Mi".to_owned()],
            ..ConfigArgs::default()
        },
        None,
    );
    let state = node.state.clone();
    let pods = [
        (
            "ids",
            pod(
                "ids",
                "sec-ids",
                "{runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000, supplementalGroups: [4000]}",
                "{allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}",
                "exec sleep 1000000",
            ),
        ),
        (
            "netbind",
            pod(
                "netbind",
                "sec-netbind",
                "{}",
                "{capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}}",
                PROBE,
            ),
        ),
        (
            "readonly",
            pod(
                "readonly",
                "sec-readonly",
                "{}",
                "{readOnlyRootFilesystem: true}",
                PROBE,
            ),
        ),
        (
            "sysctls",
            pod(
                "sysctls",
                "sec-sysctls",
                "{sysctls: [{name: kernel.shm_rmid_forced, value: '1'}, {name: kernel.sem, value: '250 32000 100 129'}]}",
                "{}",
                "cat /proc/sys/kernel/shm_rmid_forced /proc/sys/kernel/sem > /dev/sysctls; exec sleep 1000000",
            ),
        ),
        (
            "nonroot",
            pod(
                "nonroot",
                "sec-nonroot",
                "{runAsNonRoot: true}",
                "{}",
                PROBE,
            ),
        ),
        (
            "unsafe-sysctl",
            pod(
                "unsafe-sysctl",
                "sec-unsafe-sysctl",
                "{sysctls: [{name: kernel.msgmax, value: '65536'}]}",
                "{}",
                PROBE,
            ),
        ),
        (
            "sysadmin",
            pod(
                "sysadmin",
                "sec-sysadmin",
                "{}",
                "{capabilities: {add: [SYS_ADMIN]}}",
                PROBE,
            ),
        ),
        (
            "apparmor",
            pod(
                "apparmor",
                "sec-apparmor",
                "{}",
                "{appArmorProfile: {type: RuntimeDefault}}",
                "exec sleep 1000000",
            ),
        ),
        (
            "unconfined",
            pod(
                "unconfined",
                "sec-unconfined",
                "{seccompProfile: {type: Unconfined}}",
                "{}",
                PROBE,
            ),
        ),
    ];
    for (name, manifest) in &pods {
        node.submit(&format!("{name}.yaml"), manifest);
    }

    // Refused at admission: kubelet's sysctl allowlist, then Pod Security baseline.
    wait_until(
        "the three pods refused at admission",
        Duration::from_secs(30),
        || {
            ["unsafe-sysctl", "sysadmin", "unconfined"]
                .iter()
                .all(|n| rejected(&state, n).is_some())
        },
    )
    .await;
    assert_eq!(
        rejected(&state, "unsafe-sysctl"),
        Some((
            "SysctlForbidden".to_owned(),
            "Pod was rejected: forbidden sysctl: \"kernel.msgmax\" not allowlisted".to_owned()
        ))
    );
    let (reason, message) = rejected(&state, "sysadmin").expect("sysadmin rejected");
    assert_eq!(reason, "PodSecurity");
    assert_eq!(
        message,
        "Pod was rejected: pod with UID \"sec-sysadmin\" specified capability SYS_ADMIN, but is disallowed"
    );
    let (reason, message) = rejected(&state, "unconfined").expect("unconfined rejected");
    assert_eq!(reason, "PodSecurity");
    assert!(message.contains("seccomp profile Unconfined"), "{message}");

    // AppArmor: kubelet's admit handler refuses a profile the kernel cannot enforce; where
    // the kernel has AppArmor, the pod runs.
    if enforcer::kernel::apparmor_enabled() {
        wait_until("apparmor running", Duration::from_secs(60), || {
            running(&state, "apparmor")
        })
        .await;
    } else {
        wait_until(
            "apparmor refused at admission",
            Duration::from_secs(30),
            || rejected(&state, "apparmor").is_some(),
        )
        .await;
        assert_eq!(
            rejected(&state, "apparmor"),
            Some((
                "AppArmor".to_owned(),
                "Pod was rejected: Cannot enforce AppArmor: AppArmor is not enabled on the host"
                    .to_owned()
            ))
        );
    }

    // runAsNonRoot on the root busybox image: never created, waiting with kubelet's reason
    // and message.
    wait_until(
        "nonroot waiting with CreateContainerConfigError",
        Duration::from_secs(30),
        || {
            record(&state, "nonroot").is_some_and(|r| {
                r.container_statuses.first().is_some_and(|c| {
                    matches!(&c.state, ContainerState::Waiting { reason, .. } if reason == "CreateContainerConfigError")
                })
            })
        },
    )
    .await;
    let r = record(&state, "nonroot").expect("nonroot status");
    assert_eq!(r.phase, "Pending");
    assert_eq!(
        r.container_statuses[0].state,
        ContainerState::Waiting {
            reason: "CreateContainerConfigError".to_owned(),
            message: format!(
                "container has runAsNonRoot and image will run as root (pod: \"{}_{}({})\", container: app)",
                r.name, r.namespace, r.uid
            ),
        }
    );
    assert!(r.container_statuses[0].container_id.is_empty(), "{r:?}");

    wait_until(
        "the four admitted pods running",
        Duration::from_secs(60),
        || {
            ["ids", "netbind", "readonly", "sysctls"]
                .iter()
                .all(|n| running(&state, n))
        },
    )
    .await;

    // runAsUser / runAsGroup / fsGroup + supplementalGroups, all capabilities dropped,
    // allowPrivilegeEscalation false, RuntimeDefault seccomp.
    let pid = pid_of(&state, "ids");
    let s = proc_status(pid);
    assert_eq!(field(&s, "Uid"), "1000 1000 1000 1000", "{s:?}");
    assert_eq!(field(&s, "Gid"), "3000 3000 3000 3000", "{s:?}");
    // CRI gets fsGroup then supplementalGroups (2000, 4000); containerd adds the primary
    // group, as it does under kubelet; the kernel lists them sorted.
    assert_eq!(field(&s, "Groups"), "2000 3000 4000", "{s:?}");
    assert_eq!(field(&s, "CapEff"), "0000000000000000", "{s:?}");
    assert_eq!(field(&s, "CapPrm"), "0000000000000000", "{s:?}");
    assert_eq!(field(&s, "NoNewPrivs"), "1", "{s:?}");
    assert_eq!(field(&s, "Seccomp"), "2", "{s:?}");

    // Root with every capability dropped but NET_BIND_SERVICE; no seccomp profile named:
    // Unconfined (kubelet's default without seccompDefault); a writable root.
    let pid = pid_of(&state, "netbind");
    wait_probed(pid, "netbind").await;
    let s = proc_status(pid);
    assert_eq!(field(&s, "Uid"), "0 0 0 0", "{s:?}");
    assert_eq!(field(&s, "CapEff"), "0000000000000400", "{s:?}");
    assert_eq!(field(&s, "CapBnd"), "0000000000000400", "{s:?}");
    assert_eq!(field(&s, "NoNewPrivs"), "0", "{s:?}");
    assert_eq!(field(&s, "Seccomp"), "0", "{s:?}");
    assert!(
        in_root(pid, "/probe").exists(),
        "the writable root took the write"
    );

    // readOnlyRootFilesystem: the same write fails.
    let pid = pid_of(&state, "readonly");
    wait_probed(pid, "readonly").await;
    assert!(
        !in_root(pid, "/probe").exists(),
        "a write to / succeeded under readOnlyRootFilesystem"
    );
    let s = proc_status(pid);
    assert_eq!(field(&s, "Uid"), "0 0 0 0", "{s:?}");

    // Sysctls: the safe one and the allowed unsafe one, set in the pod's IPC namespace.
    let pid = pid_of(&state, "sysctls");
    let out = in_root(pid, "/dev/sysctls");
    wait_until(
        "the sysctls pod wrote what it read",
        Duration::from_secs(20),
        || std::fs::read_to_string(&out).is_ok_and(|t| t.lines().count() >= 2),
    )
    .await;
    let text = std::fs::read_to_string(&out).expect("sysctls read in the container");
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(lines, ["1", "250 32000 100 129"], "{text:?}");

    // The pod refused for runAsNonRoot still has no container after more syncs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = record(&state, "nonroot").expect("nonroot status");
    assert!(
        matches!(&r.container_statuses[0].state, ContainerState::Waiting { reason, .. } if reason == "CreateContainerConfigError"),
        "{r:?}"
    );

    drop(node.shutdown().await);
}

/// kubelet's safe `net.*` sysctls reach a pod with its own network namespace (a CNI bridge
/// here); the same sysctl with `hostNetwork` is refused at admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safe_net_sysctls_in_the_pod_network_namespace() {
    let cd = Containerd::start_with_cni("sec-net");
    let node = Node::start_on(
        cd,
        ConfigArgs {
            eviction_hard: vec!["memory.available<1Mi".to_owned()],
            ..ConfigArgs::default()
        },
        None,
    );
    let state = node.state.clone();
    let sysctls = "{sysctls: [{name: net.ipv4.ip_unprivileged_port_start, value: '80'}, {name: net.ipv4.tcp_syncookies, value: '2'}]}";
    let script = "cat /proc/sys/net/ipv4/ip_unprivileged_port_start /proc/sys/net/ipv4/tcp_syncookies > /dev/sysctls; exec sleep 1000000";
    let own_netns =
        pod("netns", "sec-netns", sysctls, "{}", script).replace("  hostNetwork: true\n", "");
    assert!(!own_netns.contains("hostNetwork"), "{own_netns}");
    node.submit("netns.yaml", &own_netns);
    node.submit(
        "hostnet.yaml",
        &pod("hostnet", "sec-hostnet", sysctls, "{}", script),
    );

    wait_until("hostnet refused", Duration::from_secs(30), || {
        rejected(&state, "hostnet").is_some()
    })
    .await;
    assert_eq!(
        rejected(&state, "hostnet"),
        Some((
            "SysctlForbidden".to_owned(),
            "Pod was rejected: forbidden sysctl: \"net.ipv4.ip_unprivileged_port_start\" not allowed with host Net enabled".to_owned()
        ))
    );
    wait_until("netns running", Duration::from_secs(60), || {
        running(&state, "netns")
    })
    .await;
    let pid = pid_of(&state, "netns");
    let out = in_root(pid, "/dev/sysctls");
    wait_until(
        "the netns pod wrote what it read",
        Duration::from_secs(20),
        || std::fs::read_to_string(&out).is_ok_and(|t| t.lines().count() >= 2),
    )
    .await;
    let text = std::fs::read_to_string(&out).expect("sysctls read in the container");
    assert_eq!(
        text.lines().map(str::trim).collect::<Vec<_>>(),
        ["80", "2"],
        "{text:?}"
    );
    drop(node.shutdown().await);
}
