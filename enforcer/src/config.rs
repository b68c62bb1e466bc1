//! Configuration: a `KubeletConfiguration` document (`kubelet.config.k8s.io/v1beta1`, camelCase
//! fields) with kubelet's defaults, plus an `enforcer:` section of our own, overridden by
//! command-line flags in kubelet's syntax, validated into a [`Config`].
//!
//! Unknown fields are warnings (kubelet has many fields the enforcer does not use); invalid
//! values are errors naming the field or flag and the value.

mod document;
pub use crate::duration;
pub mod flags;
mod resolve;

pub use document::{
    EnforcerSection, KubeletConfiguration, MemorySwapDoc, ReservedMemory, Scalar, ScalarMap,
    SignalSource, from_value, parse_document,
};
pub use resolve::resolve;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Serialize;

use crate::{
    cgroup::CgroupLayout,
    node::NodeObserver,
    policy::eviction::{EvictionConfig, Threshold, ThresholdValue},
    quantity::Quantity,
};

/// What is wrong with the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid YAML, or a field has the wrong type.
    #[error("{path}: {place}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// Where in it (`evictionHard`, `.`).
        place: String,
        /// What is wrong.
        message: String,
    },
    /// A value is invalid.
    #[error("{source_name}: invalid value {value:?} for {field}: {reason}")]
    Invalid {
        /// The file or `command line`.
        source_name: String,
        /// The field (`evictionHard`) or flag (`--eviction-hard`).
        field: String,
        /// The value as given.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
}

/// `memoryReservationPolicy` (kubelet 1.36+, Memory QoS): `None` protects nothing;
/// `TieredReservation` gives Guaranteed pods `memory.min` and Burstable ones `memory.low` of
/// their memory requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum MemoryReservationPolicy {
    #[default]
    None,
    TieredReservation,
}

/// The HTTP port's address when none is given: kubelet's read-only port, on loopback (the
/// enforcer in place of kubelet serves kubelet's ports).
pub const DEFAULT_HTTP_ADDRESS: &str = "127.0.0.1:10255";

/// The companion's HTTP port when none is given: beside kubelet (10248, 10250, 10255) and
/// kube-proxy (10249, 10256) on a kubeadm node, and clear of the controller manager (10257),
/// the scheduler (10259) and etcd (2379-2381).
pub const COMPANION_HTTP_ADDRESS: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    10266,
));

/// kubelet's own ports (healthz, the secure port, the read-only port): a companion never
/// binds them.
pub const KUBELET_PORTS: [u16; 3] = [10248, 10250, 10255];

/// Command-line configuration: `--config FILE` and kubelet-syntax flags that override it.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// KubeletConfiguration file (YAML or JSON) with an optional `enforcer:` section.
    #[arg(long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The kubelet's own KubeletConfiguration file (companion mode): its kubelet fields are
    /// the node's; `--config` then adds only its `enforcer:` section.
    #[arg(long = "kubelet-config", value_name = "FILE")]
    pub kubelet_config: Option<PathBuf>,
    /// Hard eviction thresholds, e.g. memory.available<500Mi,nodefs.available<10%.
    #[arg(long, value_name = "SIGNAL<VALUE,...")]
    pub eviction_hard: Vec<String>,
    /// Soft eviction thresholds, e.g. memory.available<1Gi.
    #[arg(long, value_name = "SIGNAL<VALUE,...")]
    pub eviction_soft: Vec<String>,
    /// Soft threshold grace periods, e.g. memory.available=1m30s.
    #[arg(long, value_name = "SIGNAL=DURATION,...")]
    pub eviction_soft_grace_period: Vec<String>,
    /// Minimum reclaims, e.g. memory.available=500Mi.
    #[arg(long, value_name = "SIGNAL=VALUE,...")]
    pub eviction_minimum_reclaim: Vec<String>,
    /// Maximum grace period (seconds) for soft evictions.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub eviction_max_pod_grace_period: Option<i32>,
    /// How long a pressure condition stays after it was last observed.
    #[arg(long, value_name = "DURATION")]
    pub eviction_pressure_transition_period: Option<String>,
    /// Resources reserved for the system, e.g. cpu=500m,memory=1Gi.
    #[arg(long, value_name = "RESOURCE=QUANTITY,...")]
    pub system_reserved: Vec<String>,
    /// Resources reserved for Kubernetes daemons.
    #[arg(long, value_name = "RESOURCE=QUANTITY,...")]
    pub kube_reserved: Vec<String>,
    /// Node allocatable enforcement: pods, system-reserved, kube-reserved or none.
    #[arg(long, value_name = "LIST")]
    pub enforce_node_allocatable: Option<String>,
    /// Root of the pod cgroup hierarchy.
    #[arg(long, value_name = "PATH")]
    pub cgroup_root: Option<String>,
    /// Cgroup driver: cgroupfs or systemd (containerd's `SystemdCgroup` must match).
    #[arg(long, value_name = "DRIVER", env = "ENFORCER_CGROUP_DRIVER")]
    pub cgroup_driver: Option<String>,
    /// CPU manager policy: none or static.
    #[arg(long, value_name = "POLICY")]
    pub cpu_manager_policy: Option<String>,
    /// CPUs reserved for the system (a cpuset, e.g. 0-1).
    #[arg(long = "reserved-cpus", value_name = "CPUSET")]
    pub reserved_cpus: Option<String>,
    /// Memory manager policy: None or Static.
    #[arg(long, value_name = "POLICY")]
    pub memory_manager_policy: Option<String>,
    /// Memory reserved per NUMA node (repeatable; e.g. 0:memory=1Gi,hugepages-2Mi=2Gi;1:memory=2Gi).
    #[arg(long, value_name = "NODE:RESOURCE=QUANTITY,...")]
    pub reserved_memory: Vec<String>,
    /// Topology manager policy: none, best-effort, restricted or single-numa-node.
    #[arg(long, value_name = "POLICY")]
    pub topology_manager_policy: Option<String>,
    /// Topology manager scope: container or pod.
    #[arg(long, value_name = "SCOPE")]
    pub topology_manager_scope: Option<String>,
    /// Maximum number of pods.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_pods: Option<i32>,
    /// API server QPS.
    #[arg(long, value_name = "QPS", allow_negative_numbers = true)]
    pub kube_api_qps: Option<i32>,
    /// API server burst.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub kube_api_burst: Option<i32>,
    /// Event QPS.
    #[arg(long, value_name = "QPS", allow_negative_numbers = true)]
    pub event_qps: Option<i32>,
    /// Event burst.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub event_burst: Option<i32>,
    /// Pull images one at a time.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub serialize_image_pulls: Option<bool>,
    /// Image pull QPS.
    #[arg(long, value_name = "QPS", allow_negative_numbers = true)]
    pub registry_qps: Option<i32>,
    /// Image pull burst.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub registry_burst: Option<i32>,
    /// The secure port's address.
    #[arg(long, value_name = "IP")]
    pub address: Option<String>,
    /// The secure port (HTTPS with authentication and authorization; 0: none).
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    pub port: Option<i32>,
    /// The read-only port (plain HTTP, no authentication; 0: none).
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    pub read_only_port: Option<i32>,
    /// The secure port's certificate (PEM); with no file a self-signed one is made.
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<String>,
    /// The secure port's private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_private_key_file: Option<String>,
    /// CA bundle: client certificates signed by it authenticate as their CN (groups: O).
    #[arg(long, value_name = "FILE")]
    pub client_ca_file: Option<String>,
    /// serverTLSBootstrap: the secure port's certificate from a CSR to the API server.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub rotate_server_certificates: Option<bool>,
    /// Serve anonymous requests (as system:anonymous) on the secure port.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub anonymous_auth: Option<bool>,
    /// Webhook (SubjectAccessReview) or AlwaysAllow.
    #[arg(long, value_name = "MODE")]
    pub authorization_mode: Option<String>,
    /// Image disk usage percent at or above which image garbage collection runs.
    #[arg(long, value_name = "PERCENT", allow_negative_numbers = true)]
    pub image_gc_high_threshold: Option<i32>,
    /// Image disk usage percent image garbage collection frees down to.
    #[arg(long, value_name = "PERCENT", allow_negative_numbers = true)]
    pub image_gc_low_threshold: Option<i32>,
    /// Minimum age of an unused image before it is garbage collected (Go duration).
    #[arg(long, value_name = "DURATION")]
    pub minimum_image_ttl_duration: Option<String>,
    /// Enforce cpu limits with CFS quota.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub cpu_cfs_quota: Option<bool>,
    /// Refuse to run pods when the node has swap on (kubelet's `failSwapOn`, default true).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub fail_swap_on: Option<bool>,
    /// The node's name instead of the hostname (cluster mode).
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,
    /// kubelet's `--node-ip`: the node's IP (the Node's `InternalIP`, pods' `status.hostIP`)
    /// instead of the default route's address.
    #[arg(long, value_name = "IP")]
    pub node_ip: Option<std::net::IpAddr>,
    /// Labels the node registers with, e.g. role=edge,zone=a (cluster mode).
    #[arg(long, value_name = "KEY=VALUE,...")]
    pub node_labels: Vec<String>,
    /// How often the node status is computed (and patched when it changed).
    #[arg(long, value_name = "DURATION")]
    pub node_status_update_frequency: Option<String>,
    /// Most processes in one pod (`pids.max` of the pod cgroup); -1 or 0: unlimited.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub pod_max_pids: Option<i64>,
    /// How often each pod is synced when nothing else happens (and its configMap, secret
    /// and projected volumes refreshed); default 1m.
    #[arg(long, value_name = "DURATION")]
    pub sync_frequency: Option<String>,
    /// DNS server IPs of ClusterFirst pods (comma-separated, repeatable).
    #[arg(long, value_name = "IP,...")]
    pub cluster_dns: Vec<String>,
    /// The cluster's domain (ClusterFirst pods search `<ns>.svc.<domain>`).
    #[arg(long, value_name = "DOMAIN")]
    pub cluster_domain: Option<String>,
    /// The resolver file of Default-policy pods (`""`: none, pods get 127.0.0.1).
    #[arg(long, value_name = "PATH")]
    pub resolv_conf: Option<String>,
    /// Where pressure signals come from.
    #[arg(
        long = "signal-source",
        value_enum,
        value_name = "SOURCE",
        id = "config_signal_source"
    )]
    pub signal_source: Option<SignalSource>,
    /// Housekeeping period (the eviction manager also runs on every signal).
    #[arg(long, value_name = "DURATION")]
    pub housekeeping_interval: Option<String>,
    /// Node capacity overrides, e.g. memory=2Gi,cpu=2.
    #[arg(long, value_name = "RESOURCE=QUANTITY,...")]
    pub node_capacity: Vec<String>,
    /// Metrics / health endpoint address.
    #[arg(long = "http-address", value_name = "ADDR", id = "config_http_address")]
    pub http_address: Option<String>,
    /// `/metrics` over TLS for a cluster's Prometheus (`IP:PORT`): bearer tokens checked by
    /// TokenReview, access by SubjectAccessReview on `nodes/metrics` (needs `--kubeconfig`).
    #[arg(long = "secure-metrics-address", value_name = "ADDR")]
    pub secure_metrics_address: Option<String>,
    /// Static pod manifest directory.
    #[arg(long, value_name = "DIR")]
    pub manifest_dir: Option<PathBuf>,
    /// State directory.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// CRI socket (kubelet: --container-runtime-endpoint).
    #[arg(long, alias = "container-runtime-endpoint", value_name = "PATH")]
    pub cri_socket: Option<PathBuf>,
    /// Memory QoS on cgroup v2: the `MemoryQoS` feature gate's other name.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub memory_qos: Option<bool>,
    /// kubelet feature gates, e.g. MemoryQoS=false (only those the enforcer decides by).
    #[arg(long, value_name = "GATE=BOOL,...")]
    pub feature_gates: Vec<String>,
    /// The cgroup v2 crossing tripwire (`memory.high` on kubepods at the nearest memory
    /// threshold); default true.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub memory_tripwire: Option<bool>,
    /// The signal readers and the eviction manager at real-time priority (`SCHED_FIFO` 1)
    /// where the kernel allows it; default true.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub crossing_realtime: Option<bool>,
    /// After a hard memory eviction's SIGKILL, reclaim the victim's memory at once with
    /// process_mrelease(2) (Linux 5.15+); default true.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub reap_memory: Option<bool>,
    /// Allow privileged containers.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub allow_privileged: Option<bool>,
    /// Allow the host network namespace (hostNetwork).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub allow_host_namespaces: Option<bool>,
    /// Allow hostPID.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub allow_host_pid: Option<bool>,
    /// Allow hostIPC.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub allow_host_ipc: Option<bool>,
    /// Allow hostPath volumes.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub allow_host_paths: Option<bool>,
    /// Unsafe sysctls pods may set beyond the safe ones: names or `prefix*` patterns,
    /// comma-separated (e.g. kernel.msg*,net.core.somaxconn).
    #[arg(long, value_name = "SYSCTL,...", value_delimiter = ',')]
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Hard memory thresholds whose victim is capped at its usage, then stopped gracefully
    /// while the node keeps half the threshold available (comma-separated signals, e.g.
    /// memory.available); default none.
    #[arg(long, value_name = "SIGNAL,...", value_delimiter = ',')]
    pub throttle_before_evict: Vec<String>,
}

/// CPU manager policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuManagerPolicy {
    /// Everything shares all CPUs.
    None,
    /// Exclusive CPUs for Guaranteed integer-CPU containers.
    Static,
}

/// The validated, effective configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// Eviction thresholds and timing.
    #[serde(skip)]
    pub eviction: EvictionConfig,
    /// The hard thresholds as written (no allocatable copies), for node allocatable.
    #[serde(skip)]
    pub hard_eviction_thresholds: Vec<Threshold>,
    /// `evictionHard` after defaulting (for display).
    pub eviction_hard: BTreeMap<String, String>,
    /// `evictionSoft`.
    pub eviction_soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod`.
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// `evictionMinimumReclaim`.
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
    /// `evictionMaxPodGracePeriod`.
    pub eviction_max_pod_grace_period: i32,
    /// `evictionPressureTransitionPeriod`.
    #[serde(serialize_with = "ser_duration")]
    pub eviction_pressure_transition_period: Duration,
    /// `systemReserved`.
    pub system_reserved: BTreeMap<String, Quantity>,
    /// `kubeReserved`.
    pub kube_reserved: BTreeMap<String, Quantity>,
    /// `enforceNodeAllocatable`.
    pub enforce_node_allocatable: Vec<String>,
    /// `cgroupRoot`.
    pub cgroup_root: String,
    /// `cgroupDriver`.
    pub cgroup_driver: crate::policy::cgroup_name::CgroupDriver,
    /// `cgroupsPerQOS`.
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: bool,
    /// `cpuManagerPolicy`.
    pub cpu_manager_policy: CpuManagerPolicy,
    /// `cpuManagerReconcilePeriod`.
    #[serde(serialize_with = "ser_duration")]
    pub cpu_manager_reconcile_period: Duration,
    /// `reservedSystemCPUs`.
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: String,
    /// `memoryManagerPolicy`.
    pub memory_manager_policy: crate::policy::memory::MemoryManagerPolicy,
    /// `reservedMemory`.
    pub reserved_memory: Vec<crate::policy::memory::MemoryReservation>,
    /// `topologyManagerPolicy`.
    pub topology_manager_policy: crate::policy::topology::Policy,
    /// `topologyManagerScope`.
    pub topology_manager_scope: crate::policy::topology::Scope,
    /// `maxPods`.
    pub max_pods: u32,
    /// `kubeAPIQPS`.
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: u32,
    /// `kubeAPIBurst`.
    #[serde(rename = "kubeAPIBurst")]
    pub kube_api_burst: u32,
    /// `eventRecordQPS`.
    #[serde(rename = "eventRecordQPS")]
    pub event_record_qps: u32,
    /// `eventBurst`.
    pub event_burst: u32,
    /// `serializeImagePulls`.
    pub serialize_image_pulls: bool,
    /// `registryPullQPS`.
    #[serde(rename = "registryPullQPS")]
    pub registry_pull_qps: u32,
    /// `registryBurst`.
    pub registry_burst: u32,
    /// `maxParallelImagePulls` (unset: no limit when pulls are not serialized), the image
    /// garbage collector's thresholds and ages.
    #[serde(flatten)]
    pub images: ImageConfig,
    /// The secure port, its TLS, authentication and authorization; the read-only port.
    #[serde(flatten)]
    pub serving: ServingConfig,
    /// `cpuCFSQuota`.
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: bool,
    /// The feature gates the enforcer decides by, each with its value (`featureGates`).
    pub feature_gates: BTreeMap<String, bool>,
    /// `memoryThrottlingFactor`: unset by default (kubelet 1.37: no `memory.high`).
    pub memory_throttling_factor: Option<f64>,
    /// `memoryReservationPolicy`.
    pub memory_reservation_policy: MemoryReservationPolicy,
    /// `singleProcessOOMKill`: on cgroup v2, false puts `memory.oom.group` on every container
    /// (the kernel OOM killer then kills the whole container, kubelet's default since 1.28).
    #[serde(rename = "singleProcessOOMKill")]
    pub single_process_oom_kill: bool,
    /// `memorySwap`: `swapBehavior` `NoSwap` (also `""`, the default) or `LimitedSwap`.
    pub memory_swap: MemorySwapConfig,
    /// `failSwapOn` (true): with swap on the node, refuse to start running pods.
    pub fail_swap_on: bool,
    /// `hostnameOverride` (empty: the hostname).
    pub hostname_override: String,
    /// `--node-ip` (none: the default route's address).
    pub node_ip: Option<std::net::IpAddr>,
    /// `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    /// `nodeStatusUpdateFrequency` (10 s).
    #[serde(serialize_with = "ser_duration")]
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency` (5 m, or the update frequency when only that is set).
    #[serde(serialize_with = "ser_duration")]
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds` (40).
    pub node_lease_duration_seconds: u32,
    /// `podPidsLimit`: `pids.max` of every pod cgroup; -1 (the default) or 0 is unlimited.
    pub pod_pids_limit: i64,
    /// `syncFrequency` (1 m): the pod workers' periodic sync, which also refreshes the
    /// volumes of API objects.
    #[serde(serialize_with = "ser_duration")]
    pub sync_frequency: Duration,
    /// `clusterDNS` (IPs), `clusterDomain`, `resolvConf` (`/etc/resolv.conf`): the pods'
    /// DNS, as kubelet's `GetPodDNS` makes it.
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    pub resolv_conf: String,
    /// `allowedUnsafeSysctls`: sysctls (names or `prefix*` patterns, each known to be
    /// namespaced) pods may set beyond kubelet's safe ones.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// The `enforcer:` section.
    pub enforcer: EnforcerConfig,
}

/// The validated `memorySwap`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemorySwapConfig {
    /// `swapBehavior`.
    pub swap_behavior: crate::policy::swap::SwapBehavior,
}

/// The validated serving settings (kubelet's names).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServingConfig {
    /// `address` (0.0.0.0).
    pub address: std::net::IpAddr,
    /// `port` (10250; 0: the secure port is not served).
    pub port: u16,
    /// `readOnlyPort` (0: none).
    pub read_only_port: u16,
    pub tls_cert_file: String,
    pub tls_private_key_file: String,
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: bool,
    pub authentication: AuthenticationConfig,
    pub authorization: AuthorizationConfig,
}

/// `authentication`: client certificates, bearer tokens (TokenReview), anonymous.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticationConfig {
    /// `x509.clientCAFile` (empty: no client certificates).
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: String,
    /// `webhook.enabled` (true): bearer tokens through TokenReview.
    pub webhook: bool,
    /// `webhook.cacheTTL` (2m).
    #[serde(rename = "webhookCacheTTL", serialize_with = "ser_duration")]
    pub webhook_cache_ttl: Duration,
    /// `anonymous.enabled` (false).
    pub anonymous: bool,
    /// Whether `webhook.enabled` was set (not its default): standalone, a webhook asked for
    /// is refused as kubelet refuses it; a defaulted one is off (no API server to ask).
    #[serde(skip)]
    pub webhook_given: bool,
}

/// `authorization`: `Webhook` (SubjectAccessReview) or `AlwaysAllow`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationConfig {
    /// `mode`: true for `Webhook` (the default), false for `AlwaysAllow`.
    pub webhook: bool,
    /// Whether `mode` was set (a flag or the file), not its default.
    #[serde(skip)]
    pub mode_given: bool,
    #[serde(rename = "cacheAuthorizedTTL", serialize_with = "ser_duration")]
    pub cache_authorized_ttl: Duration,
    #[serde(rename = "cacheUnauthorizedTTL", serialize_with = "ser_duration")]
    pub cache_unauthorized_ttl: Duration,
}

/// The validated image settings (kubelet's names).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageConfig {
    /// `maxParallelImagePulls`: at most this many pulls at once when `serializeImagePulls` is
    /// false (unset: no limit).
    pub max_parallel_image_pulls: Option<u32>,
    /// `imageGCHighThresholdPercent` (85).
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: u8,
    /// `imageGCLowThresholdPercent` (80).
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: u8,
    /// `imageMinimumGCAge` (2m).
    #[serde(rename = "imageMinimumGCAge", serialize_with = "ser_duration")]
    pub image_minimum_gc_age: Duration,
    /// `imageMaximumGCAge` (0: off).
    #[serde(rename = "imageMaximumGCAge", serialize_with = "ser_duration")]
    pub image_maximum_gc_age: Duration,
}

/// The validated `enforcer:` section.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
#[expect(missing_docs, reason = "see EnforcerSection")]
pub struct EnforcerConfig {
    pub signal_source: SignalSource,
    #[serde(serialize_with = "ser_duration")]
    pub housekeeping_interval: Duration,
    pub node_capacity: BTreeMap<String, Quantity>,
    pub http_address: SocketAddr,
    /// Whether `http_address` was given (flag or file), not the default: companion mode
    /// moves the default off kubelet's and kube-proxy's ports.
    #[serde(skip)]
    pub http_address_given: bool,
    /// Serve only the enforcer's own metric families (`enforcer_*`): beside kubelet, whose
    /// families a cluster already scrapes from the node (companion mode sets it).
    #[serde(skip)]
    pub own_metrics_only: bool,
    /// `enforcer.secureMetricsAddress` (`--secure-metrics-address`): `/metrics` over TLS,
    /// authenticated by TokenReview and authorized by SubjectAccessReview on `nodes/metrics`
    /// as kubelet's secure port does (needs `--kubeconfig`), for a cluster's Prometheus.
    pub secure_metrics_address: Option<SocketAddr>,
    pub manifest_dir: PathBuf,
    pub state_dir: PathBuf,
    pub cri_socket: PathBuf,
    #[serde(rename = "memoryQoS")]
    pub memory_qos: bool,
    pub memory_tripwire: bool,
    pub crossing_realtime: bool,
    pub reap_memory: bool,
    /// The signals of the hard memory thresholds that throttle, then evict
    /// (`policy::eviction::throttle`; the decisions read the same list in
    /// [`EvictionConfig::throttle_before_evict`]).
    pub throttle_before_evict: Vec<crate::policy::eviction::Signal>,
    pub allow_privileged: bool,
    pub allow_host_namespaces: bool,
    #[serde(rename = "allowHostPID")]
    pub allow_host_pid: bool,
    #[serde(rename = "allowHostIPC")]
    pub allow_host_ipc: bool,
    pub allow_host_paths: bool,
    #[serde(rename = "imageGCPeriod", serialize_with = "ser_duration")]
    pub image_gc_period: Duration,
    pub image_pull_secret_dir: PathBuf,
}

impl Config {
    /// The node observer of this node: `capacity` is the node's (with any override), the configuration gives
    /// the reservations and the state directory (nodefs).
    #[must_use]
    pub fn node_observer(
        &self,
        layout: &CgroupLayout,
        capacity: &crate::policy::resources::ResourceList,
    ) -> NodeObserver {
        let memory_capacity = capacity
            .get("memory")
            .map_or(0, crate::quantity::Quantity::value);
        NodeObserver {
            layout: layout.clone(),
            kubepods: self
                .cgroup_driver
                .name(&crate::policy::cgroup_name::kubepods(&self.cgroup_root)),
            memory_capacity,
            capacity_override: self.enforcer.node_capacity.contains_key("memory"),
            kubepods_memory_limit: crate::policy::admission::kubepods_memory_limit(
                capacity,
                &self.system_reserved,
                &self.kube_reserved,
            ),
            nodefs: self.enforcer.state_dir.clone(),
            imagefs: Some(PathBuf::from("/var/lib/containerd")).filter(|p| p.exists()),
            pid_capacity: self
                .enforcer
                .node_capacity
                .get("pids")
                .map(crate::quantity::Quantity::value),
        }
    }

    /// kubelet's sysctl admission: the safe sysctls plus `allowedUnsafeSysctls` (validated
    /// when the configuration was resolved).
    #[must_use]
    pub fn sysctl_allowlist(&self) -> crate::policy::security::SysctlAllowlist {
        crate::policy::security::SysctlAllowlist::new(&self.allowed_unsafe_sysctls)
            .unwrap_or_default()
    }
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&duration::format(*d))
}

/// A loaded configuration and the warnings found on the way.
#[must_use]
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedConfig {
    /// The configuration.
    pub config: Config,
    /// Unknown fields and other things worth saying.
    pub warnings: Vec<String>,
}

/// Loads `--config` (if any), applies the flags, and validates.
pub fn load(args: &ConfigArgs) -> Result<LoadedConfig, ConfigError> {
    let read = |path: &Path| -> Result<(KubeletConfiguration, String, Vec<String>), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let name = path.display().to_string();
        let (doc, w) = parse_document(&name, &text)?;
        Ok((doc, name, w))
    };
    let (doc, name, warnings) = match (args.kubelet_config.as_deref(), args.config.as_deref()) {
        (Some(kubelet), own) => {
            let (mut doc, mut name, mut warnings) = read(kubelet)?;
            if let Some(own) = own {
                let (mine, own_name, mut w) = read(own)?;
                warnings.append(&mut w);
                warnings.extend(kubelet_fields_ignored(&mine, &own_name, &name));
                doc.enforcer = mine.enforcer;
                name = format!("{name} + {own_name}");
            }
            (doc, name, warnings)
        }
        (None, Some(path)) => read(path)?,
        (None, None) => (
            KubeletConfiguration::default(),
            "defaults".to_owned(),
            Vec::new(),
        ),
    };
    let mut loaded = resolve(&name, &doc, args)?;
    let mut all = warnings;
    all.append(&mut loaded.warnings);
    loaded.warnings = all;
    Ok(loaded)
}

/// With `--kubelet-config`, the kubelet's file decides every kubelet field: one warning per
/// field `--config` (`own`) sets besides its `enforcer:` section.
fn kubelet_fields_ignored(
    own: &KubeletConfiguration,
    own_name: &str,
    kubelet: &str,
) -> Vec<String> {
    let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(own) else {
        return Vec::new();
    };
    fields
        .iter()
        .filter(|(k, v)| !v.is_null() && !matches!(k.as_str(), "enforcer" | "apiVersion" | "kind"))
        .map(|(k, _)| {
            format!("{own_name}: {k} is ignored: the kubelet's configuration {kubelet} decides it")
        })
        .collect()
}

impl Config {
    /// The node's name: `hostnameOverride`, else the hostname; lower-cased (kubelet's
    /// `nodeutil.GetHostname`).
    #[must_use]
    pub fn node_name(&self) -> String {
        let name = self.hostname_override.trim();
        if name.is_empty() {
            crate::node::node_name()
        } else {
            name.to_lowercase()
        }
    }

    /// The defaults (no file, no flags).
    pub fn defaults() -> Result<Self, ConfigError> {
        resolve(
            "defaults",
            &KubeletConfiguration::default(),
            &ConfigArgs::default(),
        )
        .map(|l| l.config)
    }

    /// A JSON view of the thresholds, resolved against `capacity` where a capacity is known.
    #[must_use]
    pub fn thresholds_json(&self, capacity: &BTreeMap<String, Quantity>) -> Vec<serde_json::Value> {
        self.eviction
            .thresholds
            .iter()
            .map(|t| {
                let cap = match t.signal.resource() {
                    crate::policy::eviction::Resource::Memory => capacity.get("memory"),
                    crate::policy::eviction::Resource::EphemeralStorage => {
                        capacity.get("ephemeral-storage")
                    }
                    crate::policy::eviction::Resource::Pids => capacity.get("pids"),
                    crate::policy::eviction::Resource::Inodes => None,
                };
                let resolved = match (t.value, cap) {
                    (ThresholdValue::Quantity(q), _) => Some(q.to_string()),
                    (v, Some(c)) => Some(v.resolve(c.value()).to_string()),
                    (_, None) => None,
                };
                serde_json::json!({
                    "signal": t.signal.as_str(),
                    "operator": "LessThan",
                    "value": t.value.to_string(),
                    "quantity": resolved,
                    "hard": t.is_hard(),
                    "gracePeriod": duration::format(t.grace_period),
                    "minReclaim": t.min_reclaim.map(|m| m.to_string()),
                })
            })
            .collect()
    }
}

/// Reads a file for a command, naming it in errors.
pub fn read_file(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod gates_tests;
#[cfg(test)]
mod tests;
