//! From a Pod to CRI requests: kubelet's labels and annotations, the sandbox and container
//! configs, container hashes, and the resource values a container gets.

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use sha2::{Digest as _, Sha256};

use crate::{
    policy::{
        resize::actions::ContainerResources,
        resources::cgroup::{self, CgroupOptions, PodCgroupValues},
        security,
        swap::{self, SwapSetting},
    },
    quantity::Quantity,
};

pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";
pub const CONTAINER_HASH_ANNOTATION: &str = "io.kubernetes.container.hash";
pub const CONTAINER_RESTART_COUNT_ANNOTATION: &str = "io.kubernetes.container.restartCount";
pub const TERMINATION_MESSAGE_PATH_ANNOTATION: &str =
    "io.kubernetes.container.terminationMessagePath";
/// `terminationMessagePolicy` (kubelet's annotation).
pub const TERMINATION_MESSAGE_POLICY_ANNOTATION: &str =
    "io.kubernetes.container.terminationMessagePolicy";
pub const GRACE_PERIOD_ANNOTATION: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Marks sandboxes and containers this enforcer manages (recovery touches nothing else).
pub const MANAGED_LABEL: &str = "io.kubernetes.enforcer.managed";
/// `init`, `sidecar` or `regular`.
pub const CONTAINER_KIND_ANNOTATION: &str = "io.kubernetes.enforcer.container-kind";
/// Hash of the sandbox-relevant parts of the pod spec.
pub const SANDBOX_HASH_ANNOTATION: &str = "io.kubernetes.enforcer.sandbox-hash";
/// The cpu and memory a container was created with (kubelet's actuated resources, JSON of
/// `policy::resize::actions::ContainerResources`): what an in-place resize compares with.
pub const RESOURCES_ANNOTATION: &str = "io.kubernetes.enforcer.container-resources";
/// Relative cgroup path of the pod cgroup.
pub const CGROUP_ANNOTATION: &str = "io.kubernetes.enforcer.pod-cgroup";

/// cgroup v2's swap limit file (kubelet's `Cgroup2MaxSwapFilename`), set through CRI `unified`.
pub const MEMORY_SWAP_MAX: &str = "memory.swap.max";

/// The runtime's stop-timeout floor (kubelet's `minimumGracePeriodInSeconds`).
pub const MIN_GRACE_SECONDS: i64 = 2;
/// `terminationGracePeriodSeconds` when unset.
pub const DEFAULT_GRACE_SECONDS: i64 =
    crate::policy::resources::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS;

pub use crate::policy::pod_actions::ContainerKind;

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

/// The pod cgroup's values: the decision core's (`policy::resources::cgroup`) for the
/// API-defaulted pod.
pub fn pod_cgroup_values(pod: &Pod, opts: &CgroupOptions) -> PodCgroupValues {
    let mut defaulted = pod.clone();
    crate::policy::resources::apply_defaults(&mut defaulted);
    cgroup::pod_cgroup_values(&defaulted, opts)
}

/// The container as the API would default it (a missing request takes the limit), found by
/// name in the defaulted pod; the container itself when it is not in the pod.
fn defaulted_container(pod: &Pod, c: &Container) -> (Pod, Container) {
    let mut defaulted = pod.clone();
    crate::policy::resources::apply_defaults(&mut defaulted);
    let found = defaulted
        .spec
        .as_ref()
        .and_then(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .find(|x| x.name == c.name)
        })
        .cloned()
        .unwrap_or_else(|| c.clone());
    (defaulted, found)
}

/// The decision core's `oom_score_adj` for a container (`policy::oom`), before any clamp; the
/// QoS-only fallback when the node's memory capacity is unknown.
#[must_use]
pub fn decided_oom_score_adj(pod: &Pod, c: &Container, memory_capacity: i64) -> i64 {
    let (defaulted, dc) = defaulted_container(pod, c);
    crate::policy::oom::container_oom_score_adj(&defaulted, &dc, memory_capacity).map_or_else(
        |_| {
            let mem_req = request(c, "memory").map_or(0, |q| q.value());
            oom_score_adj(pod_qos(pod), mem_req, memory_capacity, false)
        },
        |s| s.value,
    )
}

/// The lowest `oom_score_adj` this node lets a process set: -1000 with CAP_SYS_RESOURCE, else
/// 0 (a negative value needs the capability; see `crate::container_manager`).
#[must_use]
pub fn oom_score_adj_floor(cap_sys_resource: bool) -> i64 {
    if cap_sys_resource { -1000 } else { 0 }
}

/// Hex sha256 of a serializable value (its JSON form), first 16 hex digits.
#[must_use]
pub fn hash_of<T: serde::Serialize>(value: &T) -> String {
    let json = serde_json::to_vec(value).unwrap_or_default();
    let d = Sha256::digest(&json);
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Hash of a container's spec without its resources (kubelet's `HashContainer` leaves them
/// out): a change means the container is restarted; a change of resources is a resize.
#[must_use]
pub fn container_hash(c: &Container) -> String {
    let mut c = c.clone();
    c.resources = None;
    hash_of(&c)
}

/// The hash containers were annotated with before resources were left out of it: a container
/// created by an earlier enforcer with the same spec is current, not restarted.
#[must_use]
pub fn legacy_container_hash(c: &Container) -> String {
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
    crate::policy::resources::termination_grace_seconds(pod)
}

fn host_network(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_network) == Some(true)
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
            security_context: Some(security::sandbox_security_context(pod)),
            sysctls: security::pod_sysctls(pod),
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

/// What a container's linux resources depend on beyond the pod and the node.
#[derive(Clone, Debug, Default)]
pub struct ResourceOptions {
    /// cgroup options (`cpuCFSQuota`, Memory QoS on cgroup v2, ...).
    pub cgroup: CgroupOptions,
    /// The CPU manager's cpuset for this container (static policy), if any.
    pub cpuset: Option<String>,
    /// The memory manager's NUMA nodes for this container (`cpuset.mems`), if any.
    pub cpuset_mems: Option<String>,
}

/// The container config (kubelet's `generateContainerConfig`) with default resource options
/// and the security context of an image that names no user (root) on a node with default
/// security options; a security context kubelet would refuse leaves the CRI default.
#[must_use]
pub fn container_config(
    pod: &Pod,
    c: &Container,
    kind: ContainerKind,
    restart_count: u32,
    image_ref: &str,
    node: NodeFacts,
) -> cri::ContainerConfig {
    let opts = ResourceOptions {
        cgroup: CgroupOptions {
            v2: false,
            ..CgroupOptions::default()
        },
        cpuset: None,
        cpuset_mems: None,
    };
    let sc = security::container_security_context(
        pod,
        c,
        &security::ImageUser::default(),
        &security::SecurityOptions::default(),
    )
    .unwrap_or_default();
    container_config_with(pod, c, kind, restart_count, image_ref, node, &opts, sc)
}

/// The linux resources of a container: the decision core's values
/// (`calculateLinuxResources`, Memory QoS in `unified`), its `oom_score_adj` clamped to what
/// the node allows, and the CPU manager's cpuset.
#[must_use]
pub fn linux_resources(
    pod: &Pod,
    c: &Container,
    node: NodeFacts,
    opts: &ResourceOptions,
) -> cri::LinuxContainerResources {
    let (dpod, dc) = defaulted_container(pod, c);
    let v = cgroup::container_cgroup_values_in(&dpod, &dc, &opts.cgroup);
    let mem_lim = v.memory_limit_bytes.unwrap_or(0).max(0);
    let mut unified = HashMap::new();
    if let Some(min) = v.memory_min_bytes {
        unified.insert("memory.min".to_owned(), min.to_string());
    }
    if let Some(low) = v.memory_low_bytes {
        unified.insert("memory.low".to_owned(), low.to_string());
    }
    if let Some(high) = v.memory_high_bytes {
        unified.insert("memory.high".to_owned(), high.to_string());
    }
    if opts.cgroup.v2 {
        if !opts.cgroup.memory_qos {
            // kubelet 1.37 (kubernetes#139377): with MemoryQoS off, a `memory.high` an earlier
            // configuration left is cleared wherever the container's resources are generated
            // (creation, restart, in-place resize).
            unified.insert("memory.high".to_owned(), "max".to_owned());
        } else if !opts.cgroup.tiered_reservation {
            // kubelet 1.36+: MemoryQoS on without `TieredReservation` resets the container's
            // `memory.low`.
            unified
                .entry("memory.low".to_owned())
                .or_insert_with(|| "0".to_owned());
        }
    }
    // kubelet (kuberuntime_container_linux.go, since 1.28): on cgroup v2 the kernel OOM killer
    // kills the whole container unless singleProcessOOMKill.
    if opts.cgroup.v2 && !opts.cgroup.single_process_oom_kill {
        unified.insert("memory.oom.group".to_owned(), "1".to_owned());
    }
    // kubelet's configureContainerSwapResources.
    let swap = swap::container_swap(&dpod, &dc, opts.cgroup.v2, &opts.cgroup.swap);
    let memory_swap_limit_in_bytes = match swap.setting {
        SwapSetting::Untouched => 0,
        SwapSetting::SwapLimitIsMemoryLimit => mem_lim,
        SwapSetting::SwapMax(bytes) => {
            unified.insert(MEMORY_SWAP_MAX.to_owned(), bytes.to_string());
            0
        }
    };
    let decided = decided_oom_score_adj(pod, c, node.memory_capacity);
    cri::LinuxContainerResources {
        cpu_period: if v.cpu_quota_micros.is_some() {
            i64::try_from(opts.cgroup.cpu_period_us).unwrap_or(100_000)
        } else {
            0
        },
        cpu_quota: v.cpu_quota_micros.unwrap_or(0),
        cpu_shares: i64::try_from(v.cpu_shares).unwrap_or(2),
        memory_limit_in_bytes: mem_lim,
        memory_swap_limit_in_bytes,
        oom_score_adj: decided.max(oom_score_adj_floor(node.cap_sys_resource)),
        cpuset_cpus: opts.cpuset.clone().unwrap_or_default(),
        cpuset_mems: opts.cpuset_mems.clone().unwrap_or_default(),
        unified,
        ..Default::default()
    }
}

/// The container config (kubelet's `generateContainerConfig`), with the security context
/// decided for it ([`security::decide_container_security`]).
#[must_use]
#[expect(
    clippy::too_many_arguments,
    reason = "the pieces of one generateContainerConfig"
)]
pub fn container_config_with(
    pod: &Pod,
    c: &Container,
    kind: ContainerKind,
    restart_count: u32,
    image_ref: &str,
    node: NodeFacts,
    opts: &ResourceOptions,
    security_context: cri::LinuxContainerSecurityContext,
) -> cri::ContainerConfig {
    let id = PodIdent::of(pod);
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
            TERMINATION_MESSAGE_POLICY_ANNOTATION.to_owned(),
            c.termination_message_policy
                .clone()
                .unwrap_or_else(|| "File".to_owned()),
        ),
        (
            GRACE_PERIOD_ANNOTATION.to_owned(),
            grace_seconds(pod).to_string(),
        ),
        (
            CONTAINER_KIND_ANNOTATION.to_owned(),
            kind.as_str().to_owned(),
        ),
        (
            RESOURCES_ANNOTATION.to_owned(),
            serde_json::to_string(&ContainerResources::desired(
                &crate::policy::resources::with_pod_level_limits(pod, c),
            ))
            .unwrap_or_default(),
        ),
    ]);
    let resources = linux_resources(pod, c, node, opts);
    let envs = c
        .env
        .iter()
        .flatten()
        .map(|e| cri::KeyValue {
            key: e.name.clone(),
            value: e.value.clone().unwrap_or_default(),
        })
        .collect();
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
            security_context: Some(security_context),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pod_actions::PullPolicy;

    fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).expect("pod yaml")
    }

    #[test]
    fn qos_and_values() {
        let be = pod("metadata: {name: a}\nspec: {containers: [{name: c}]}");
        assert_eq!(pod_qos(&be), Qos::BestEffort);
        let g = pod(
            "metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {cpu: 500m, memory: 64Mi}}}]}",
        );
        assert_eq!(pod_qos(&g), Qos::Guaranteed);
        let v = pod_cgroup_values(&g, &CgroupOptions::default());
        assert_eq!(
            (v.cpu_shares, v.cpu_quota_micros, v.memory_limit_bytes),
            (512, Some(50_000), Some(64 << 20))
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
    fn container_resources_from_the_decision_core() {
        let node = NodeFacts {
            memory_capacity: 4 << 30,
            cap_sys_resource: false,
        };
        let b = pod(
            "metadata: {name: a}\nspec: {containers: [{name: c, resources: {requests: {cpu: 250m, memory: 1Gi}, limits: {memory: 2Gi}}}]}",
        );
        let c = &b.spec.as_ref().expect("spec").containers[0];
        let opts = ResourceOptions {
            cgroup: CgroupOptions {
                memory_qos: true,
                memory_throttling_factor: Some(0.9),
                tiered_reservation: true,
                ..CgroupOptions::default()
            },
            cpuset: Some("1".into()),
            cpuset_mems: Some("0".into()),
        };
        let r = linux_resources(&b, c, node, &opts);
        assert_eq!((r.cpu_shares, r.cpu_quota, r.cpu_period), (256, 0, 0));
        assert_eq!(r.memory_limit_in_bytes, 2 << 30);
        assert_eq!(r.oom_score_adj, 750);
        assert_eq!(r.cpuset_cpus, "1");
        assert_eq!(r.cpuset_mems, "0");
        // TieredReservation: a Burstable container's request is its memory.low.
        assert_eq!(
            r.unified.get("memory.low").map(String::as_str),
            Some("1073741824")
        );
        assert!(!r.unified.contains_key("memory.min"));
        assert!(r.unified.contains_key("memory.high"));
        // cgroup v2: the container is one OOM unit (kubelet's default since 1.28) unless
        // singleProcessOOMKill; never on v1.
        assert_eq!(
            r.unified.get("memory.oom.group").map(String::as_str),
            Some("1")
        );
        let single = ResourceOptions {
            cgroup: CgroupOptions {
                single_process_oom_kill: true,
                ..opts.cgroup
            },
            cpuset: None,
            cpuset_mems: None,
        };
        assert!(
            !linux_resources(&b, c, node, &single)
                .unified
                .contains_key("memory.oom.group")
        );
        let v1 = ResourceOptions {
            cgroup: CgroupOptions {
                v2: false,
                ..opts.cgroup
            },
            cpuset: None,
            cpuset_mems: None,
        };
        assert!(
            !linux_resources(&b, c, node, &v1)
                .unified
                .contains_key("memory.oom.group")
        );
        // A Guaranteed container: -997, clamped to 0 without CAP_SYS_RESOURCE.
        let g = pod(
            "metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {cpu: 500m, memory: 64Mi}}}]}",
        );
        let c = &g.spec.as_ref().expect("spec").containers[0];
        assert_eq!(decided_oom_score_adj(&g, c, 4 << 30), -997);
        let r = linux_resources(&g, c, node, &ResourceOptions::default());
        assert_eq!(
            (r.oom_score_adj, r.cpu_quota, r.cpu_period),
            (0, 50_000, 100_000)
        );
        let r = linux_resources(
            &g,
            c,
            NodeFacts {
                cap_sys_resource: true,
                ..node
            },
            &ResourceOptions::default(),
        );
        assert_eq!(r.oom_score_adj, -997);
        // No Memory QoS on cgroup v2: the OOM group, and `memory.high` cleared to `max`
        // (kubelet 1.37's rollback of a value an earlier configuration left).
        let mut keys: Vec<_> = r.unified.iter().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                (&"memory.high".to_owned(), &"max".to_owned()),
                (&"memory.oom.group".to_owned(), &"1".to_owned())
            ]
        );
        // On cgroup v1 nothing of the kind.
        let v1 = ResourceOptions {
            cgroup: CgroupOptions {
                v2: false,
                ..CgroupOptions::default()
            },
            ..ResourceOptions::default()
        };
        assert!(linux_resources(&g, c, node, &v1).unified.is_empty());
        // Memory QoS on without `TieredReservation`: the container's `memory.low` reset to 0,
        // no `memory.min`, no `memory.high` without a throttling factor.
        let none = ResourceOptions {
            cgroup: CgroupOptions {
                memory_qos: true,
                ..CgroupOptions::default()
            },
            ..ResourceOptions::default()
        };
        let r = linux_resources(
            &b,
            &b.spec.as_ref().expect("spec").containers[0],
            node,
            &none,
        );
        assert_eq!(r.unified.get("memory.low").map(String::as_str), Some("0"));
        assert!(!r.unified.contains_key("memory.min"));
        assert!(!r.unified.contains_key("memory.high"));
    }

    #[test]
    fn swap_and_pod_level_limits_in_the_container_resources() {
        use crate::policy::swap::{SwapBehavior, SwapOptions};
        let node = NodeFacts {
            memory_capacity: 40 << 30,
            cap_sys_resource: false,
        };
        let b = pod(
            "metadata: {name: a}\nspec: {containers: [{name: c, resources: {requests: {memory: 1Gi}, limits: {memory: 2Gi}}}]}",
        );
        let c = &b.spec.as_ref().expect("spec").containers[0];
        let with = |v2: bool, behavior, controller_available| ResourceOptions {
            cgroup: CgroupOptions {
                v2,
                swap: SwapOptions {
                    behavior,
                    controller_available,
                    memory_capacity: 40 << 30,
                    swap_capacity: 5 << 30,
                },
                ..CgroupOptions::default()
            },
            cpuset: None,
            cpuset_mems: None,
        };
        // After TestGenerateLinuxContainerResourcesWithSwap's expectSwap / expectNoSwap /
        // expectSwapDisabled, on the CRI message.
        let r = linux_resources(&b, c, node, &with(true, SwapBehavior::LimitedSwap, true));
        assert_eq!(
            r.unified.get(MEMORY_SWAP_MAX).map(String::as_str),
            Some("134217728")
        );
        assert_eq!(r.memory_swap_limit_in_bytes, 0);
        let r = linux_resources(&b, c, node, &with(true, SwapBehavior::NoSwap, true));
        assert_eq!(
            r.unified.get(MEMORY_SWAP_MAX).map(String::as_str),
            Some("0")
        );
        let r = linux_resources(&b, c, node, &with(false, SwapBehavior::LimitedSwap, true));
        assert_eq!(r.memory_swap_limit_in_bytes, r.memory_limit_in_bytes);
        assert!(!r.unified.contains_key(MEMORY_SWAP_MAX));
        for v2 in [true, false] {
            let r = linux_resources(&b, c, node, &with(v2, SwapBehavior::LimitedSwap, false));
            assert_eq!(r.memory_swap_limit_in_bytes, 0);
            assert!(!r.unified.contains_key(MEMORY_SWAP_MAX));
        }
        // Pod-level resources (getCPULimit / getMemoryLimit): a container without its own
        // limit takes the pod's; one with its own keeps it.
        let p = pod(
            "metadata: {name: a}\nspec: {resources: {requests: {cpu: 500m, memory: 1Gi}, limits: {cpu: '2', memory: 4Gi}}, containers: [{name: c}, {name: d, resources: {requests: {cpu: 100m}, limits: {cpu: 200m, memory: 1Gi}}}]}",
        );
        let spec = p.spec.as_ref().expect("spec");
        let opts = ResourceOptions::default();
        let r = linux_resources(&p, &spec.containers[0], node, &opts);
        // No cpu request: shares from the (pod-level) cpu limit, as kubelet computes them.
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes),
            (2048, 200_000, 4 << 30)
        );
        let r = linux_resources(&p, &spec.containers[1], node, &opts);
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes),
            (102, 20_000, 1 << 30)
        );
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
        // The security context: the pod's namespaces, the image's user (root), the sandbox
        // under RuntimeDefault seccomp.
        let sc = cc
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .expect("security context");
        assert_eq!(
            sc.namespace_options.as_ref().map(|n| n.network),
            Some(cri::NamespaceMode::Node as i32)
        );
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 0 }));
        assert_eq!(
            sb.linux
                .as_ref()
                .and_then(|l| l.security_context.as_ref())
                .and_then(|s| s.seccomp.as_ref())
                .map(|s| s.profile_type),
            Some(cri::security_profile::ProfileType::RuntimeDefault as i32)
        );
    }

    #[test]
    fn default_pull_policy() {
        let c = |image: &str| Container {
            name: "c".into(),
            image: Some(image.into()),
            ..Default::default()
        };
        assert_eq!(PullPolicy::of(&c("busybox")), PullPolicy::Always);
        assert_eq!(PullPolicy::of(&c("busybox:latest")), PullPolicy::Always);
        assert_eq!(
            PullPolicy::of(&c("busybox:local")),
            PullPolicy::IfNotPresent
        );
        assert_eq!(PullPolicy::of(&c("reg:5000/busybox")), PullPolicy::Always);
        assert_eq!(
            PullPolicy::of(&c("busybox@sha256:00")),
            PullPolicy::IfNotPresent
        );
    }
}
