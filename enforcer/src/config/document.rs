//! The configuration file: a `KubeletConfiguration` document with the `enforcer:` section, as
//! written (every field optional), and its parsing, which reports unknown fields as warnings.

use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Where the enforcer gets its pressure signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SignalSource {
    /// eBPF, falling back to the others when it cannot load.
    #[default]
    Auto,
    /// eBPF tracepoints only.
    Ebpf,
    /// eBPF, its crossing check pinned to fexit on `try_charge_memcg`.
    #[serde(rename = "ebpf-fexit")]
    #[value(name = "ebpf-fexit")]
    EbpfFexit,
    /// eBPF, its crossing check pinned to a kprobe on `try_charge_memcg`.
    #[serde(rename = "ebpf-kprobe")]
    #[value(name = "ebpf-kprobe")]
    EbpfKprobe,
    /// eBPF, its crossing check pinned to the memcg statistics tracepoints (Linux 6.14+).
    #[serde(rename = "ebpf-tracepoint")]
    #[value(name = "ebpf-tracepoint")]
    EbpfTracepoint,
    /// eBPF without the crossing check: the crossing is the cgroup-file tripwire's (v2
    /// `memory.high`, v1 a usage-threshold eventfd).
    #[serde(rename = "ebpf-tripwire")]
    #[value(name = "ebpf-tripwire")]
    EbpfTripwire,
    /// cgroup v1 eventfd thresholds.
    Eventfd,
    /// PSI triggers.
    Psi,
    /// Polling.
    Poll,
}

impl SignalSource {
    /// The name the configuration and `--signal-source` give it.
    #[must_use]
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }

    /// Where this source lets the crossing check attach: anywhere within the cost budget
    /// (`auto`, `ebpf`), at one point (`ebpf-fexit`, ...), or nowhere.
    #[must_use]
    pub fn crossing_mode(self) -> crate::kernel::CrossingMode {
        use crate::kernel::{CrossingMode, crossing::Attach};
        match self {
            Self::Auto | Self::Ebpf => CrossingMode::Auto,
            Self::EbpfFexit => CrossingMode::Only(Attach::Fexit),
            Self::EbpfKprobe => CrossingMode::Only(Attach::Kprobe),
            Self::EbpfTracepoint => CrossingMode::Only(Attach::Tracepoint),
            Self::EbpfTripwire | Self::Eventfd | Self::Psi | Self::Poll => CrossingMode::Off,
        }
    }
}

/// A string-valued map entry that also accepts YAML numbers and booleans (`pid.available: 100`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Scalar(pub String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_owned()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A map of [`Scalar`]s.
pub type ScalarMap = BTreeMap<String, Scalar>;

/// One `reservedMemory` entry (kubelet's `MemoryReservation`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReservedMemory {
    /// `numaNode`.
    pub numa_node: Option<i32>,
    /// `limits`: resource -> quantity.
    pub limits: Option<ScalarMap>,
}

/// The `enforcer:` section: what kubelet has no field for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnforcerSection {
    /// auto | ebpf | eventfd | psi | poll.
    pub signal_source: Option<SignalSource>,
    /// Go duration, default 10s.
    pub housekeeping_interval: Option<Scalar>,
    /// Overrides of the node capacity (`{memory: 2Gi, cpu: "2"}`).
    pub node_capacity: Option<ScalarMap>,
    /// Metrics / health endpoint, default 127.0.0.1:10255 (companion mode: 127.0.0.1:10266).
    pub http_address: Option<String>,
    /// `/metrics` over TLS behind TokenReview and SubjectAccessReview (`nodes/metrics`).
    pub secure_metrics_address: Option<String>,
    /// Static pod manifests, default /etc/enforcer/manifests.
    pub manifest_dir: Option<PathBuf>,
    /// State (checkpoints), default /var/lib/enforcer.
    pub state_dir: Option<PathBuf>,
    /// CRI socket, default /run/containerd/containerd.sock.
    pub cri_socket: Option<PathBuf>,
    /// Memory QoS (cgroup v2 `memory.min` / `memory.high`), default false.
    #[serde(rename = "memoryQoS")]
    pub memory_qos: Option<bool>,
    /// The cgroup v2 crossing tripwire (`memory.high` on kubepods where the nearest memory
    /// threshold is crossed), default true; used only on a v2 memory controller.
    pub memory_tripwire: Option<bool>,
    /// The crossing thread (signal readers and eviction manager) at real-time priority where
    /// the kernel allows it, default true.
    pub crossing_realtime: Option<bool>,
    /// process_mrelease(2) of a hard memory eviction's victim right after its SIGKILL,
    /// default true.
    pub reap_memory: Option<bool>,
    /// Hard memory thresholds (by signal) whose victim is capped, then stopped gracefully
    /// while the node has headroom, default none.
    pub throttle_before_evict: Option<Vec<String>>,
    /// Allow privileged containers, default false.
    pub allow_privileged: Option<bool>,
    /// Allow hostNetwork, default false.
    pub allow_host_namespaces: Option<bool>,
    /// Allow hostPID, default false.
    #[serde(rename = "allowHostPID")]
    pub allow_host_pid: Option<bool>,
    /// Allow hostIPC, default false.
    #[serde(rename = "allowHostIPC")]
    pub allow_host_ipc: Option<bool>,
    /// Allow hostPath volumes, default false.
    pub allow_host_paths: Option<bool>,
    /// How often the image garbage collector runs (kubelet's fixed `ImageGCPeriod`), default 5m.
    #[serde(rename = "imageGCPeriod")]
    pub image_gc_period: Option<Scalar>,
    /// Standalone pods' `imagePullSecrets`: the secret `NAME` is the docker config file
    /// `<dir>/NAME.json`, default /etc/enforcer/pull-secrets.
    pub image_pull_secret_dir: Option<PathBuf>,
}

/// `authentication` (kubelet's `KubeletAuthentication`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
/// Kubelet's fields of the same names.
pub struct AuthenticationDoc {
    pub x509: Option<X509Doc>,
    pub webhook: Option<WebhookAuthnDoc>,
    pub anonymous: Option<AnonymousDoc>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
/// Kubelet's fields of the same names.
pub struct X509Doc {
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
/// Kubelet's fields of the same names.
pub struct WebhookAuthnDoc {
    pub enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: Option<Scalar>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
/// Kubelet's fields of the same names.
pub struct AnonymousDoc {
    pub enabled: Option<bool>,
}

/// `authorization` (kubelet's `KubeletAuthorization`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
/// Kubelet's fields of the same names.
pub struct AuthorizationDoc {
    pub mode: Option<String>,
    pub webhook: Option<WebhookAuthzDoc>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
/// Kubelet's fields of the same names.
pub struct WebhookAuthzDoc {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: Option<Scalar>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: Option<Scalar>,
}

/// `memorySwap` (kubelet's `MemorySwapConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemorySwapDoc {
    /// `""`, `NoSwap` or `LimitedSwap`.
    pub swap_behavior: Option<String>,
}

/// The `KubeletConfiguration` fields the enforcer reads (all optional: unset means kubelet's
/// default).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[expect(missing_docs, reason = "the fields are kubelet's, documented there")]
pub struct KubeletConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub eviction_hard: Option<ScalarMap>,
    pub eviction_soft: Option<ScalarMap>,
    pub eviction_soft_grace_period: Option<ScalarMap>,
    pub eviction_minimum_reclaim: Option<ScalarMap>,
    pub eviction_max_pod_grace_period: Option<i32>,
    pub eviction_pressure_transition_period: Option<Scalar>,
    pub system_reserved: Option<ScalarMap>,
    pub kube_reserved: Option<ScalarMap>,
    pub enforce_node_allocatable: Option<Vec<String>>,
    pub cgroup_root: Option<String>,
    pub cgroup_driver: Option<String>,
    pub cgroups_per_q_o_s: Option<bool>,
    pub cpu_manager_policy: Option<String>,
    pub cpu_manager_reconcile_period: Option<Scalar>,
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: Option<String>,
    pub memory_manager_policy: Option<String>,
    pub reserved_memory: Option<Vec<ReservedMemory>>,
    pub topology_manager_policy: Option<String>,
    pub topology_manager_scope: Option<String>,
    pub max_pods: Option<i32>,
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: Option<i32>,
    #[serde(rename = "kubeAPIBurst")]
    pub kube_api_burst: Option<i32>,
    #[serde(rename = "eventRecordQPS")]
    pub event_record_qps: Option<i32>,
    pub event_burst: Option<i32>,
    pub serialize_image_pulls: Option<bool>,
    #[serde(rename = "registryPullQPS")]
    pub registry_pull_qps: Option<i32>,
    pub registry_burst: Option<i32>,
    pub max_parallel_image_pulls: Option<i32>,
    pub address: Option<String>,
    pub port: Option<i32>,
    pub read_only_port: Option<i32>,
    pub tls_cert_file: Option<String>,
    pub tls_private_key_file: Option<String>,
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: Option<bool>,
    pub authentication: Option<AuthenticationDoc>,
    pub authorization: Option<AuthorizationDoc>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: Option<i32>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: Option<i32>,
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: Option<Scalar>,
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: Option<Scalar>,
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: Option<bool>,
    pub memory_throttling_factor: Option<f64>,
    /// `None` (default) or `TieredReservation`.
    pub memory_reservation_policy: Option<String>,
    /// kubelet's feature gates (name: bool).
    pub feature_gates: Option<BTreeMap<String, bool>>,
    #[serde(rename = "singleProcessOOMKill")]
    pub single_process_oom_kill: Option<bool>,
    pub memory_swap: Option<MemorySwapDoc>,
    pub fail_swap_on: Option<bool>,
    pub hostname_override: Option<String>,
    pub node_status_update_frequency: Option<Scalar>,
    pub node_status_report_frequency: Option<Scalar>,
    pub node_lease_duration_seconds: Option<i32>,
    pub pod_pids_limit: Option<i64>,
    pub sync_frequency: Option<Scalar>,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    pub cluster_domain: Option<String>,
    pub resolv_conf: Option<String>,
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    pub static_pod_path: Option<String>,
    pub enforcer: Option<EnforcerSection>,
}

/// Parses a KubeletConfiguration document from text; `name` names it in errors. Returns the
/// document and the unknown-field warnings.
pub fn parse_document(
    name: &str,
    text: &str,
) -> Result<(KubeletConfiguration, Vec<String>), ConfigError> {
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse {
            path: name.to_owned(),
            place: e.location().map_or_else(
                || ".".to_owned(),
                |l| format!("line {} column {}", l.line(), l.column()),
            ),
            message: e.to_string(),
        })?;
    let value = if value.is_null() {
        serde_yaml_ng::Value::Mapping(serde_yaml_ng::Mapping::new())
    } else {
        value
    };
    from_value(name, value)
}

/// Reads a KubeletConfiguration already parsed as YAML (e.g. a scenario's `config:`).
pub fn from_value(
    name: &str,
    value: serde_yaml_ng::Value,
) -> Result<(KubeletConfiguration, Vec<String>), ConfigError> {
    let mut warnings = Vec::new();
    // Unknown fields are whatever serde ignores: the structs are the only list of known ones.
    let mut unknown = |path: serde_ignored::Path<'_>| {
        warnings.push(format!(
            "{name}: unknown field {:?} ignored",
            ignored_path(&path)
        ));
    };
    let doc: Result<KubeletConfiguration, _> =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(value, &mut unknown));
    let doc = doc.map_err(|e| ConfigError::Parse {
        path: name.to_owned(),
        place: e.path().to_string(),
        message: e.into_inner().to_string(),
    })?;
    if let Some(kind) = doc.kind.as_deref()
        && kind != "KubeletConfiguration"
    {
        warnings.push(format!("{name}: kind {kind:?} is not KubeletConfiguration"));
    }
    if let Some(v) = doc.api_version.as_deref()
        && v != "kubelet.config.k8s.io/v1beta1"
    {
        warnings.push(format!(
            "{name}: apiVersion {v:?} is not kubelet.config.k8s.io/v1beta1"
        ));
    }
    Ok((doc, warnings))
}

/// An ignored field's path as the configuration spells it (`enforcer.bogus`, `a[0].b`).
fn ignored_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        Path::Map { parent, key } => match ignored_path(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => ignored_path(parent),
    }
}
