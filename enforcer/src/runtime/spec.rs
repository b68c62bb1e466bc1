//! From a Pod to CRI requests: kubelet's labels and annotations, the sandbox and container
//! configs, container hashes, and the resource values a container gets.

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use sha2::{Digest as _, Sha256};

use crate::quantity::Quantity;

pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";
pub const CONTAINER_HASH_ANNOTATION: &str = "io.kubernetes.container.hash";
pub const CONTAINER_RESTART_COUNT_ANNOTATION: &str = "io.kubernetes.container.restartCount";
pub const TERMINATION_MESSAGE_PATH_ANNOTATION: &str =
    "io.kubernetes.container.terminationMessagePath";
pub const GRACE_PERIOD_ANNOTATION: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Marks sandboxes and containers this enforcer manages (recovery touches nothing else).
pub const MANAGED_LABEL: &str = "io.kubernetes.enforcer.managed";
/// `init`, `sidecar` or `regular`.
pub const CONTAINER_KIND_ANNOTATION: &str = "io.kubernetes.enforcer.container-kind";
/// Hash of the sandbox-relevant parts of the pod spec.
pub const SANDBOX_HASH_ANNOTATION: &str = "io.kubernetes.enforcer.sandbox-hash";
/// Relative cgroup path of the pod cgroup.
pub const CGROUP_ANNOTATION: &str = "io.kubernetes.enforcer.pod-cgroup";

/// The runtime's stop-timeout floor (kubelet's `minimumGracePeriodInSeconds`).
pub const MIN_GRACE_SECONDS: i64 = 2;
/// `terminationGracePeriodSeconds` when unset.
pub const DEFAULT_GRACE_SECONDS: i64 = 30;

/// What a container is in the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerKind {
    Init,
    Sidecar,
    Regular,
}

impl ContainerKind {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Init => "init",
            Self::Sidecar => "sidecar",
            Self::Regular => "regular",
        }
    }

    #[must_use]
    pub fn parse(s: &str) -> Self {
        match s {
            "init" => Self::Init,
            "sidecar" => Self::Sidecar,
            _ => Self::Regular,
        }
    }
}

/// QoS class (the decision core's, as the runtime names cgroup tiers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}

fn quantity(c: &Container, which: &str, resource: &str) -> Option<Quantity> {
    let res = c.resources.as_ref()?;
    let map = if which == "limits" {
        res.limits.as_ref()?
    } else {
        res.requests.as_ref()?
    };
    Quantity::parse(&map.get(resource)?.0).ok()
}

/// Request with API defaulting (a missing request takes the limit).
fn request(c: &Container, resource: &str) -> Option<Quantity> {
    quantity(c, "requests", resource).or_else(|| quantity(c, "limits", resource))
}

/// The pod's QoS class, from the decision core (`policy::qos::pod_qos`).
#[must_use]
pub fn pod_qos(pod: &Pod) -> Qos {
    // The decision core expects API-defaulted pods (a missing request takes the limit).
    let mut defaulted = pod.clone();
    crate::policy::resources::apply_defaults(&mut defaulted);
    match crate::policy::qos::pod_qos(&defaulted) {
        crate::policy::qos::QosClass::Guaranteed => Qos::Guaranteed,
        crate::policy::qos::QosClass::Burstable => Qos::Burstable,
        crate::policy::qos::QosClass::BestEffort => Qos::BestEffort,
    }
}

/// kubelet's cpu.shares for a number of millicores.
#[must_use]
pub fn cpu_shares(milli: i64) -> i64 {
    if milli <= 0 {
        2
    } else {
        (milli.saturating_mul(1024) / 1000).clamp(2, 262_144)
    }
}

/// CFS quota for a cpu limit in millicores (period 100 ms); `None` when unlimited.
#[must_use]
pub fn cpu_quota(milli: i64) -> Option<i64> {
    (milli > 0).then(|| (milli.saturating_mul(100_000) / 1000).max(1000))
}

/// `oom_score_adj` from a QoS class alone (the fallback when the decision core refuses the
/// node's memory capacity); [`container_config`] uses `policy::oom::container_oom_score_adj`.
#[must_use]
pub fn oom_score_adj(qos: Qos, memory_request: i64, node_memory: i64, clamp_negative: bool) -> i64 {
    let v = match qos {
        Qos::Guaranteed => -997,
        Qos::BestEffort => 1000,
        Qos::Burstable => {
            let cap = node_memory.max(1);
            let v = 1000 - (1000_i128 * i128::from(memory_request) / i128::from(cap)) as i64;
            if v < 3 {
                3
            } else if v >= 1000 {
                999
            } else {
                v
            }
        }
    };
    if clamp_negative { v.max(0) } else { v }
}

/// Values for the pod cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCgroupValues {
    pub cpu_shares: i64,
    pub cpu_quota: Option<i64>,
    pub memory_limit: Option<i64>,
}

/// The pod cgroup's values (kubelet's `ResourceConfigForPod`, container-level resources).
// TODO(policy): use crate::policy::resources::cgroup once wired.
#[must_use]
pub fn pod_cgroup_values(pod: &Pod, qos: Qos) -> PodCgroupValues {
    if qos == Qos::BestEffort {
        return PodCgroupValues {
            cpu_shares: 2,
            ..Default::default()
        };
    }
    let app: Vec<&Container> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.iter().collect())
        .unwrap_or_default();
    let sum = |f: &dyn Fn(&Container) -> Option<Quantity>, milli: bool| -> (i64, bool) {
        let mut total = 0_i64;
        let mut all = true;
        for c in &app {
            match f(c) {
                Some(q) => {
                    total = total.saturating_add(if milli { q.milli_value() } else { q.value() });
                }
                None => all = false,
            }
        }
        (total, all)
    };
    let (cpu_req, _) = sum(&|c| request(c, "cpu"), true);
    let (cpu_lim, all_cpu) = sum(&|c| quantity(c, "limits", "cpu"), true);
    let (mem_lim, all_mem) = sum(&|c| quantity(c, "limits", "memory"), false);
    PodCgroupValues {
        cpu_shares: cpu_shares(cpu_req),
        cpu_quota: if all_cpu { cpu_quota(cpu_lim) } else { None },
        memory_limit: (all_mem && mem_lim > 0).then_some(mem_lim),
    }
}

/// Hex sha256 of a serializable value (its JSON form), first 16 hex digits.
#[must_use]
pub fn hash_of<T: serde::Serialize>(value: &T) -> String {
    let json = serde_json::to_vec(value).unwrap_or_default();
    let d = Sha256::digest(&json);
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Hash of a container's spec: a change means the container is restarted.
#[must_use]
pub fn container_hash(c: &Container) -> String {
    hash_of(c)
}

/// Hash of what the sandbox depends on: a change means the whole pod restarts.
#[must_use]
pub fn sandbox_hash(pod: &Pod) -> String {
    let s = pod.spec.as_ref();
    hash_of(&(
        s.and_then(|s| s.host_network),
        s.and_then(|s| s.host_pid),
        s.and_then(|s| s.host_ipc),
        s.and_then(|s| s.hostname.clone()),
        s.and_then(|s| s.share_process_namespace),
    ))
}

/// Grace period in seconds for killing the pod: the spec's, default 30, floor 1 (the runtime
/// floor of 2 s applies per container stop).
#[must_use]
pub fn grace_seconds(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS)
        .max(1)
}

/// The pod's restart policy (`Always` by default).
#[must_use]
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

fn host_network(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_network) == Some(true)
}

fn namespace_options(pod: &Pod) -> cri::NamespaceOption {
    let s = pod.spec.as_ref();
    let node = |b: Option<bool>| b == Some(true);
    cri::NamespaceOption {
        network: if host_network(pod) {
            cri::NamespaceMode::Node as i32
        } else {
            cri::NamespaceMode::Pod as i32
        },
        pid: if node(s.and_then(|s| s.host_pid)) {
            cri::NamespaceMode::Node as i32
        } else if node(s.and_then(|s| s.share_process_namespace)) {
            cri::NamespaceMode::Pod as i32
        } else {
            cri::NamespaceMode::Container as i32
        },
        ipc: if node(s.and_then(|s| s.host_ipc)) {
            cri::NamespaceMode::Node as i32
        } else {
            cri::NamespaceMode::Pod as i32
        },
        target_id: String::new(),
        userns_options: None,
    }
}

/// Pod identity: name, namespace, uid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodIdent {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

impl PodIdent {
    #[must_use]
    pub fn of(pod: &Pod) -> Self {
        Self {
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned()),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

fn pod_labels(id: &PodIdent) -> HashMap<String, String> {
    HashMap::from([
        (POD_NAME_LABEL.to_owned(), id.name.clone()),
        (POD_NAMESPACE_LABEL.to_owned(), id.namespace.clone()),
        (POD_UID_LABEL.to_owned(), id.uid.clone()),
        (MANAGED_LABEL.to_owned(), "true".to_owned()),
    ])
}

/// The sandbox config (kubelet's `generatePodSandboxConfig`).
#[must_use]
pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    cgroup_parent: &str,
    log_directory: &str,
) -> cri::PodSandboxConfig {
    let id = PodIdent::of(pod);
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    labels.extend(pod_labels(&id));
    labels.insert("io.kubernetes.pod.uid".to_owned(), id.uid.clone());
    let mut annotations: HashMap<String, String> = pod
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    annotations.insert(SANDBOX_HASH_ANNOTATION.to_owned(), sandbox_hash(pod));
    annotations.insert(CGROUP_ANNOTATION.to_owned(), cgroup_parent.to_owned());
    let hostname = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .unwrap_or_else(|| id.name.clone());
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: id.name.clone(),
            uid: id.uid.clone(),
            namespace: id.namespace.clone(),
            attempt,
        }),
        hostname: if host_network(pod) {
            String::new()
        } else {
            hostname
        },
        log_directory: log_directory.to_owned(),
        dns_config: None,
        port_mappings: Vec::new(),
        labels,
        annotations,
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.to_owned(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        windows: None,
    }
}

/// Node facts a container config depends on.
#[derive(Clone, Copy, Debug)]
pub struct NodeFacts {
    /// Machine memory in bytes (for Burstable oom_score_adj).
    pub memory_capacity: i64,
    /// Whether negative oom_score_adj values can be written (CAP_SYS_RESOURCE).
    pub cap_sys_resource: bool,
}

/// The container config (kubelet's `generateContainerConfig`).
#[must_use]
pub fn container_config(
    pod: &Pod,
    c: &Container,
    kind: ContainerKind,
    restart_count: u32,
    image_ref: &str,
    node: NodeFacts,
) -> cri::ContainerConfig {
    let id = PodIdent::of(pod);
    let qos = pod_qos(pod);
    let mut labels = pod_labels(&id);
    labels.insert(CONTAINER_NAME_LABEL.to_owned(), c.name.clone());
    let annotations = HashMap::from([
        (CONTAINER_HASH_ANNOTATION.to_owned(), container_hash(c)),
        (
            CONTAINER_RESTART_COUNT_ANNOTATION.to_owned(),
            restart_count.to_string(),
        ),
        (
            TERMINATION_MESSAGE_PATH_ANNOTATION.to_owned(),
            c.termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".to_owned()),
        ),
        (
            GRACE_PERIOD_ANNOTATION.to_owned(),
            grace_seconds(pod).to_string(),
        ),
        (
            CONTAINER_KIND_ANNOTATION.to_owned(),
            kind.as_str().to_owned(),
        ),
    ]);
    let cpu_req = request(c, "cpu").map_or(0, |q| q.milli_value());
    let cpu_lim = quantity(c, "limits", "cpu").map_or(0, |q| q.milli_value());
    let mem_req = request(c, "memory").map_or(0, |q| q.value());
    let mem_lim = quantity(c, "limits", "memory").map_or(0, |q| q.value());
    let resources = cri::LinuxContainerResources {
        cpu_period: if cpu_lim > 0 { 100_000 } else { 0 },
        cpu_quota: cpu_quota(cpu_lim).unwrap_or(0),
        cpu_shares: cpu_shares(cpu_req),
        memory_limit_in_bytes: mem_lim.max(0),
        // No swap for pods (kubelet's NoSwap on cgroup v1).
        memory_swap_limit_in_bytes: mem_lim.max(0),
        oom_score_adj: oom_score_adj(qos, mem_req, node.memory_capacity, !node.cap_sys_resource),
        ..Default::default()
    };
    let envs = c
        .env
        .iter()
        .flatten()
        .map(|e| cri::KeyValue {
            key: e.name.clone(),
            value: e.value.clone().unwrap_or_default(),
        })
        .collect();
    let privileged = c
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false);
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt: restart_count,
        }),
        image: Some(cri::ImageSpec {
            image: image_ref.to_owned(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        labels,
        annotations,
        log_path: format!("{}/{restart_count}.log", c.name),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources),
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                privileged,
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

/// kubelet's default pull policy: `Always` for `:latest` or untagged images, else
/// `IfNotPresent`.
#[must_use]
pub fn pull_policy(c: &Container) -> &str {
    if let Some(p) = c.image_pull_policy.as_deref() {
        return p;
    }
    let image = c.image.as_deref().unwrap_or("");
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        "IfNotPresent"
    } else {
        match last.split_once(':') {
            Some((_, "latest")) | None => "Always",
            Some(_) => "IfNotPresent",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).expect("pod yaml")
    }

    #[test]
    fn qos_and_values() {
        let be = pod("metadata: {name: a}\nspec: {containers: [{name: c}]}");
        assert_eq!(pod_qos(&be), Qos::BestEffort);
        let g = pod(
            "metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {cpu: 500m, memory: 64Mi}}}]}",
        );
        assert_eq!(pod_qos(&g), Qos::Guaranteed);
        assert_eq!(
            pod_cgroup_values(&g, Qos::Guaranteed),
            PodCgroupValues {
                cpu_shares: 512,
                cpu_quota: Some(50_000),
                memory_limit: Some(64 << 20)
            }
        );
        let b = pod(
            "metadata: {name: a}\nspec: {containers: [{name: c, resources: {requests: {memory: 1Gi}}}]}",
        );
        assert_eq!(pod_qos(&b), Qos::Burstable);
        assert_eq!(oom_score_adj(Qos::Burstable, 1 << 30, 4 << 30, true), 750);
        assert_eq!(oom_score_adj(Qos::Guaranteed, 0, 1, true), 0);
        assert_eq!(oom_score_adj(Qos::Guaranteed, 0, 1, false), -997);
        assert_eq!(oom_score_adj(Qos::Burstable, 0, 1 << 30, false), 999);
        assert_eq!(oom_score_adj(Qos::Burstable, 1 << 40, 1 << 30, false), 3);
    }

    #[test]
    fn shares_and_quota() {
        assert_eq!(cpu_shares(0), 2);
        assert_eq!(cpu_shares(1), 2);
        assert_eq!(cpu_shares(1000), 1024);
        assert_eq!(cpu_shares(10_000_000), 262_144);
        assert_eq!(cpu_quota(0), None);
        assert_eq!(cpu_quota(5), Some(1000));
        assert_eq!(cpu_quota(250), Some(25_000));
    }

    #[test]
    fn labels_and_annotations_as_kubelet_writes_them() {
        let p = pod(
            "metadata: {name: web, namespace: ns, uid: u1, labels: {app: x}}\nspec: {hostNetwork: true, containers: [{name: c, image: 'busybox:local', command: [sleep], args: ['9'], env: [{name: A, value: b}]}]}",
        );
        let sb = sandbox_config(&p, 0, "/r/kubepods/besteffort/podu1", "/logs");
        assert_eq!(
            sb.labels.get(POD_NAME_LABEL).map(String::as_str),
            Some("web")
        );
        assert_eq!(
            sb.labels.get(POD_NAMESPACE_LABEL).map(String::as_str),
            Some("ns")
        );
        assert_eq!(sb.labels.get(POD_UID_LABEL).map(String::as_str), Some("u1"));
        assert_eq!(sb.labels.get("app").map(String::as_str), Some("x"));
        let ns = sb
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .map(|n| n.network);
        assert_eq!(ns, Some(cri::NamespaceMode::Node as i32));
        let spec = p.spec.as_ref().expect("spec");
        let cc = container_config(
            &p,
            &spec.containers[0],
            ContainerKind::Regular,
            3,
            "sha256:x",
            NodeFacts {
                memory_capacity: 1 << 30,
                cap_sys_resource: false,
            },
        );
        assert_eq!(
            cc.labels.get(CONTAINER_NAME_LABEL).map(String::as_str),
            Some("c")
        );
        assert_eq!(
            cc.annotations
                .get(CONTAINER_RESTART_COUNT_ANNOTATION)
                .map(String::as_str),
            Some("3")
        );
        assert_eq!(cc.command, ["sleep"]);
        assert_eq!(cc.args, ["9"]);
        assert_eq!(
            cc.envs.first().map(|e| (e.key.as_str(), e.value.as_str())),
            Some(("A", "b"))
        );
        assert_eq!(cc.log_path, "c/3.log");
    }

    #[test]
    fn default_pull_policy() {
        let c = |image: &str| Container {
            name: "c".into(),
            image: Some(image.into()),
            ..Default::default()
        };
        assert_eq!(pull_policy(&c("busybox")), "Always");
        assert_eq!(pull_policy(&c("busybox:latest")), "Always");
        assert_eq!(pull_policy(&c("busybox:local")), "IfNotPresent");
        assert_eq!(pull_policy(&c("reg:5000/busybox")), "Always");
        assert_eq!(pull_policy(&c("busybox@sha256:00")), "IfNotPresent");
    }
}
