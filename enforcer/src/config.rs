//! Configuration: a `KubeletConfiguration` document (`kubelet.config.k8s.io/v1beta1`, camelCase
//! fields) with kubelet's defaults, plus an `enforcer:` section of our own, overridden by
//! command-line flags in kubelet's syntax, validated into a [`Config`].
//!
//! Unknown fields are warnings (kubelet has many fields the enforcer does not use); invalid
//! values are errors naming the field or flag and the value.

pub mod duration;
pub mod flags;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::{
    policy::eviction::{EvictionConfig, Threshold, ThresholdValue, threshold},
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

/// Where the enforcer gets its pressure signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SignalSource {
    /// eBPF, falling back to the others when it cannot load.
    #[default]
    Auto,
    /// eBPF tracepoints only.
    Ebpf,
    /// cgroup v1 eventfd thresholds.
    Eventfd,
    /// PSI triggers.
    Psi,
    /// Polling.
    Poll,
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

fn plain(m: &ScalarMap) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect()
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
    /// Metrics / health endpoint, default 127.0.0.1:10255.
    pub http_address: Option<String>,
    /// Static pod manifests, default /etc/enforcer/manifests.
    pub manifest_dir: Option<PathBuf>,
    /// State (checkpoints), default /var/lib/enforcer.
    pub state_dir: Option<PathBuf>,
    /// CRI socket, default /run/containerd/containerd.sock.
    pub cri_socket: Option<PathBuf>,
    /// Memory QoS (cgroup v2 `memory.min` / `memory.high`), default false.
    #[serde(rename = "memoryQoS")]
    pub memory_qos: Option<bool>,
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
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: Option<bool>,
    pub memory_throttling_factor: Option<f64>,
    pub enforcer: Option<EnforcerSection>,
}

/// Command-line configuration: `--config FILE` and kubelet-syntax flags that override it.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// KubeletConfiguration file (YAML or JSON) with an optional `enforcer:` section.
    #[arg(long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
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
    /// Cgroup driver (only cgroupfs).
    #[arg(long, value_name = "DRIVER")]
    pub cgroup_driver: Option<String>,
    /// CPU manager policy: none or static.
    #[arg(long, value_name = "POLICY")]
    pub cpu_manager_policy: Option<String>,
    /// CPUs reserved for the system (a cpuset, e.g. 0-1).
    #[arg(long = "reserved-cpus", value_name = "CPUSET")]
    pub reserved_cpus: Option<String>,
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
    /// Enforce cpu limits with CFS quota.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub cpu_cfs_quota: Option<bool>,
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
    /// Static pod manifest directory.
    #[arg(long, value_name = "DIR")]
    pub manifest_dir: Option<PathBuf>,
    /// State directory.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// CRI socket (kubelet: --container-runtime-endpoint).
    #[arg(long, alias = "container-runtime-endpoint", value_name = "PATH")]
    pub cri_socket: Option<PathBuf>,
    /// Memory QoS on cgroup v2.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub memory_qos: Option<bool>,
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
    /// `cgroupDriver` (cgroupfs).
    pub cgroup_driver: String,
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
    /// `cpuCFSQuota`.
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: bool,
    /// `memoryThrottlingFactor`.
    pub memory_throttling_factor: f64,
    /// The `enforcer:` section.
    pub enforcer: EnforcerConfig,
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
    pub manifest_dir: PathBuf,
    pub state_dir: PathBuf,
    pub cri_socket: PathBuf,
    #[serde(rename = "memoryQoS")]
    pub memory_qos: bool,
    pub allow_privileged: bool,
    pub allow_host_namespaces: bool,
    #[serde(rename = "allowHostPID")]
    pub allow_host_pid: bool,
    #[serde(rename = "allowHostIPC")]
    pub allow_host_ipc: bool,
    pub allow_host_paths: bool,
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

/// Parses a KubeletConfiguration document from text; `name` names it in errors. Returns the
/// document and the unknown-field warnings.
pub fn parse_document(
    name: &str,
    text: &str,
) -> Result<(KubeletConfiguration, Vec<String>), ConfigError> {
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse {
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

/// Loads `--config` (if any), applies the flags, and validates.
pub fn load(args: &ConfigArgs) -> Result<LoadedConfig, ConfigError> {
    let (doc, name, warnings) = match args.config.as_deref() {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            let name = path.display().to_string();
            let (doc, w) = parse_document(&name, &text)?;
            (doc, name, w)
        }
        None => (
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

/// Where a value came from, to name it in errors.
struct Namer<'a> {
    file: &'a str,
}

impl Namer<'_> {
    fn err(
        &self,
        from_flag: bool,
        field: &str,
        flag: &str,
        value: impl Into<String>,
        reason: impl ToString,
    ) -> ConfigError {
        ConfigError::Invalid {
            source_name: if from_flag {
                "command line".to_owned()
            } else {
                self.file.to_owned()
            },
            field: if from_flag {
                flag.to_owned()
            } else {
                field.to_owned()
            },
            value: value.into(),
            reason: reason.to_string(),
        }
    }
}

fn quantity_map(
    n: &Namer<'_>,
    from_flag: bool,
    field: &str,
    flag: &str,
    m: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, Quantity>, ConfigError> {
    let mut out = BTreeMap::new();
    for (k, v) in m {
        let q = Quantity::parse(v.trim())
            .map_err(|e| n.err(from_flag, &format!("{field}.{k}"), flag, v.clone(), e))?;
        if q.signum() < 0 {
            return Err(n.err(
                from_flag,
                &format!("{field}.{k}"),
                flag,
                v.clone(),
                "must not be negative",
            ));
        }
        out.insert(k.clone(), q);
    }
    Ok(out)
}

fn non_negative(
    n: &Namer<'_>,
    from_flag: bool,
    field: &str,
    flag: &str,
    v: i32,
) -> Result<u32, ConfigError> {
    u32::try_from(v).map_err(|_| {
        n.err(
            from_flag,
            field,
            flag,
            v.to_string(),
            "must not be negative",
        )
    })
}

/// Applies `args` over `doc` (named `name` in errors) and validates.
pub fn resolve(
    name: &str,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<LoadedConfig, ConfigError> {
    let n = Namer { file: name };
    let mut warnings = Vec::new();
    let flag_map = |v: &Vec<String>,
                    sep: char,
                    flag: &str|
     -> Result<Option<BTreeMap<String, String>>, ConfigError> {
        if v.is_empty() {
            return Ok(None);
        }
        flags::parse_map(v, sep)
            .map(Some)
            .map_err(|e| n.err(true, flag, flag, v.join(","), e))
    };
    // Maps: a flag replaces the file's map.
    let pick = |flag: Option<BTreeMap<String, String>>, file: Option<&ScalarMap>| match flag {
        Some(m) => (Some(m), true),
        None => (file.map(plain), false),
    };
    let (hard, hard_flag) = pick(
        flag_map(&args.eviction_hard, '<', "--eviction-hard")?,
        doc.eviction_hard.as_ref(),
    );
    let (soft, soft_flag) = pick(
        flag_map(&args.eviction_soft, '<', "--eviction-soft")?,
        doc.eviction_soft.as_ref(),
    );
    let (grace, grace_flag) = pick(
        flag_map(
            &args.eviction_soft_grace_period,
            '=',
            "--eviction-soft-grace-period",
        )?,
        doc.eviction_soft_grace_period.as_ref(),
    );
    let (reclaim, reclaim_flag) = pick(
        flag_map(
            &args.eviction_minimum_reclaim,
            '=',
            "--eviction-minimum-reclaim",
        )?,
        doc.eviction_minimum_reclaim.as_ref(),
    );
    let (system_reserved, sr_flag) = pick(
        flag_map(&args.system_reserved, '=', "--system-reserved")?,
        doc.system_reserved.as_ref(),
    );
    let (kube_reserved, kr_flag) = pick(
        flag_map(&args.kube_reserved, '=', "--kube-reserved")?,
        doc.kube_reserved.as_ref(),
    );
    let hard = hard.unwrap_or_else(threshold::default_eviction_hard);
    let soft = soft.unwrap_or_default();
    let grace = grace.unwrap_or_default();
    let reclaim = reclaim.unwrap_or_default();

    let (enforce, enforce_flag) = match args.enforce_node_allocatable.as_deref() {
        Some(v) => (flags::parse_list(v), true),
        None => (
            doc.enforce_node_allocatable
                .clone()
                .unwrap_or_else(|| vec!["pods".to_owned()]),
            false,
        ),
    };
    for k in &enforce {
        if ![
            "pods",
            "system-reserved",
            "kube-reserved",
            "system-reserved-compressible",
            "kube-reserved-compressible",
            "none",
        ]
        .contains(&k.as_str())
        {
            return Err(n.err(
                enforce_flag,
                "enforceNodeAllocatable",
                "--enforce-node-allocatable",
                k.clone(),
                "must be one of pods, system-reserved, kube-reserved, none",
            ));
        }
    }
    if enforce.len() > 1 && enforce.iter().any(|k| k == "none") {
        return Err(n.err(
            enforce_flag,
            "enforceNodeAllocatable",
            "--enforce-node-allocatable",
            enforce.join(","),
            "\"none\" cannot be combined with other values",
        ));
    }

    // Thresholds: each map checked on its own first so the error names the right field.
    let check = |field: &str,
                 flag: &str,
                 from_flag: bool,
                 r: Result<Vec<Threshold>, threshold::ThresholdError>,
                 m: &BTreeMap<String, String>| {
        r.map_err(|e| {
            let value = m
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            n.err(from_flag, field, flag, value, e)
        })
    };
    let empty = BTreeMap::new();
    check(
        "evictionHard",
        "--eviction-hard",
        hard_flag,
        threshold::parse_threshold_config(&[], &hard, &empty, &empty, &empty),
        &hard,
    )?;
    if let Err(e) = threshold::parse_threshold_config(&[], &empty, &soft, &grace, &empty) {
        let grace_error = matches!(
            e,
            threshold::ThresholdError::NegativeGracePeriod(_)
                | threshold::ThresholdError::GracePeriod(..)
        ) || (soft.is_empty()
            && matches!(e, threshold::ThresholdError::UnsupportedSignal(_)));
        let (field, flag, from, m) = if grace_error {
            (
                "evictionSoftGracePeriod",
                "--eviction-soft-grace-period",
                grace_flag,
                &grace,
            )
        } else {
            ("evictionSoft", "--eviction-soft", soft_flag, &soft)
        };
        check(field, flag, from, Err(e), m)?;
    }
    check(
        "evictionMinimumReclaim",
        "--eviction-minimum-reclaim",
        reclaim_flag,
        threshold::parse_threshold_config(&[], &empty, &empty, &empty, &reclaim),
        &reclaim,
    )?;
    let thresholds = check(
        "evictionHard",
        "--eviction-hard",
        hard_flag,
        threshold::parse_threshold_config(&enforce, &hard, &soft, &grace, &reclaim),
        &hard,
    )?;
    let hard_eviction_thresholds =
        threshold::parse_threshold_config(&[], &hard, &empty, &empty, &empty).unwrap_or_default();
    for t in &thresholds {
        if let ThresholdValue::Percentage(p) = t.value
            && p == 0.0
        {
            warnings.push(format!(
                "{name}: threshold {} at 0% can never be met",
                t.signal
            ));
        }
    }

    let (max_grace, mg_flag) = match args.eviction_max_pod_grace_period {
        Some(v) => (v, true),
        None => (doc.eviction_max_pod_grace_period.unwrap_or(0), false),
    };
    if max_grace < 0 {
        return Err(n.err(
            mg_flag,
            "evictionMaxPodGracePeriod",
            "--eviction-max-pod-grace-period",
            max_grace.to_string(),
            "must not be negative",
        ));
    }
    let duration_of = |flag_v: Option<&String>,
                       file_v: Option<&Scalar>,
                       field: &str,
                       flag: &str,
                       default: Duration|
     -> Result<Duration, ConfigError> {
        match (flag_v, file_v) {
            (Some(v), _) => duration::parse(v).map_err(|e| n.err(true, field, flag, v.clone(), e)),
            (None, Some(v)) => {
                duration::parse(&v.0).map_err(|e| n.err(false, field, flag, v.0.clone(), e))
            }
            (None, None) => Ok(default),
        }
    };
    let transition = duration_of(
        args.eviction_pressure_transition_period.as_ref(),
        doc.eviction_pressure_transition_period.as_ref(),
        "evictionPressureTransitionPeriod",
        "--eviction-pressure-transition-period",
        Duration::from_secs(300),
    )?;
    let system_reserved = quantity_map(
        &n,
        sr_flag,
        "systemReserved",
        "--system-reserved",
        &system_reserved.unwrap_or_default(),
    )?;
    let kube_reserved = quantity_map(
        &n,
        kr_flag,
        "kubeReserved",
        "--kube-reserved",
        &kube_reserved.unwrap_or_default(),
    )?;
    for (field, flag, from, m) in [
        (
            "systemReserved",
            "--system-reserved",
            sr_flag,
            &system_reserved,
        ),
        ("kubeReserved", "--kube-reserved", kr_flag, &kube_reserved),
    ] {
        for k in m.keys() {
            if !(["cpu", "memory", "ephemeral-storage", "pid"].contains(&k.as_str())
                || k.starts_with("hugepages-"))
            {
                return Err(n.err(
                    from,
                    &format!("{field}.{k}"),
                    flag,
                    k.clone(),
                    "only cpu, memory, ephemeral-storage, pid and hugepages-* can be reserved",
                ));
            }
        }
    }

    let cgroup_root = args
        .cgroup_root
        .clone()
        .or_else(|| doc.cgroup_root.clone())
        .unwrap_or_else(|| "/".to_owned());
    let cgroup_root = if cgroup_root.is_empty() {
        "/".to_owned()
    } else {
        cgroup_root
    };
    if !cgroup_root.starts_with('/') {
        return Err(n.err(
            args.cgroup_root.is_some(),
            "cgroupRoot",
            "--cgroup-root",
            cgroup_root,
            "must be an absolute path",
        ));
    }
    let cgroup_driver = args
        .cgroup_driver
        .clone()
        .or_else(|| doc.cgroup_driver.clone())
        .unwrap_or_else(|| "cgroupfs".to_owned());
    if cgroup_driver != "cgroupfs" {
        return Err(n.err(
            args.cgroup_driver.is_some(),
            "cgroupDriver",
            "--cgroup-driver",
            cgroup_driver,
            "the enforcer supports only the cgroupfs driver",
        ));
    }
    let policy = args
        .cpu_manager_policy
        .clone()
        .or_else(|| doc.cpu_manager_policy.clone())
        .unwrap_or_else(|| "none".to_owned());
    let cpu_manager_policy = match policy.as_str() {
        "none" => CpuManagerPolicy::None,
        "static" => CpuManagerPolicy::Static,
        _ => {
            return Err(n.err(
                args.cpu_manager_policy.is_some(),
                "cpuManagerPolicy",
                "--cpu-manager-policy",
                policy,
                "must be none or static",
            ));
        }
    };
    let reserved_system_cpus = args
        .reserved_cpus
        .clone()
        .or_else(|| doc.reserved_system_cpus.clone())
        .unwrap_or_default();
    if !reserved_system_cpus.trim().is_empty() && !valid_cpuset(&reserved_system_cpus) {
        return Err(n.err(
            args.reserved_cpus.is_some(),
            "reservedSystemCPUs",
            "--reserved-cpus",
            reserved_system_cpus,
            "not a cpuset (e.g. 0-1,4)",
        ));
    }
    let reconcile = duration_of(
        None,
        doc.cpu_manager_reconcile_period.as_ref(),
        "cpuManagerReconcilePeriod",
        "cpuManagerReconcilePeriod",
        Duration::from_secs(10),
    )?;

    let int = |flag_v: Option<i32>,
               file_v: Option<i32>,
               field: &str,
               flag: &str,
               default: i32|
     -> Result<u32, ConfigError> {
        match flag_v {
            Some(v) => non_negative(&n, true, field, flag, v),
            None => non_negative(&n, false, field, flag, file_v.unwrap_or(default)),
        }
    };
    let max_pods = int(args.max_pods, doc.max_pods, "maxPods", "--max-pods", 110)?;
    let kube_api_qps = int(
        args.kube_api_qps,
        doc.kube_api_qps,
        "kubeAPIQPS",
        "--kube-api-qps",
        50,
    )?;
    let kube_api_burst = int(
        args.kube_api_burst,
        doc.kube_api_burst,
        "kubeAPIBurst",
        "--kube-api-burst",
        100,
    )?;
    let event_record_qps = int(
        args.event_qps,
        doc.event_record_qps,
        "eventRecordQPS",
        "--event-qps",
        50,
    )?;
    let event_burst = int(
        args.event_burst,
        doc.event_burst,
        "eventBurst",
        "--event-burst",
        100,
    )?;
    let registry_pull_qps = int(
        args.registry_qps,
        doc.registry_pull_qps,
        "registryPullQPS",
        "--registry-qps",
        5,
    )?;
    let registry_burst = int(
        args.registry_burst,
        doc.registry_burst,
        "registryBurst",
        "--registry-burst",
        10,
    )?;
    let factor = doc.memory_throttling_factor.unwrap_or(0.9);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(n.err(
            false,
            "memoryThrottlingFactor",
            "memoryThrottlingFactor",
            factor.to_string(),
            "must be greater than 0 and less than or equal to 1.0",
        ));
    }

    let e = doc.enforcer.clone().unwrap_or_default();
    let housekeeping_interval = duration_of(
        args.housekeeping_interval.as_ref(),
        e.housekeeping_interval.as_ref(),
        "enforcer.housekeepingInterval",
        "--housekeeping-interval",
        Duration::from_secs(10),
    )?;
    if housekeeping_interval.is_zero() {
        return Err(n.err(
            args.housekeeping_interval.is_some(),
            "enforcer.housekeepingInterval",
            "--housekeeping-interval",
            "0s",
            "must be greater than zero",
        ));
    }
    let (cap_map, cap_flag) = pick(
        flag_map(&args.node_capacity, '=', "--node-capacity")?,
        e.node_capacity.as_ref(),
    );
    let node_capacity = quantity_map(
        &n,
        cap_flag,
        "enforcer.nodeCapacity",
        "--node-capacity",
        &cap_map.unwrap_or_default(),
    )?;
    let http = args
        .http_address
        .clone()
        .or(e.http_address.clone())
        .unwrap_or_else(|| "127.0.0.1:10255".to_owned());
    let http_address: SocketAddr = http.parse().map_err(|err| {
        n.err(
            args.http_address.is_some(),
            "enforcer.httpAddress",
            "--http-address",
            http.clone(),
            err,
        )
    })?;
    let path_of = |f: &Option<PathBuf>,
                   d: &Option<PathBuf>,
                   default: &str,
                   field: &str,
                   flag: &str|
     -> Result<PathBuf, ConfigError> {
        let p = f
            .clone()
            .or_else(|| d.clone())
            .unwrap_or_else(|| PathBuf::from(default));
        if p.as_os_str().is_empty() {
            return Err(n.err(f.is_some(), field, flag, "", "must not be empty"));
        }
        Ok(p)
    };
    let enforcer = EnforcerConfig {
        signal_source: args.signal_source.or(e.signal_source).unwrap_or_default(),
        housekeeping_interval,
        node_capacity,
        http_address,
        manifest_dir: path_of(
            &args.manifest_dir,
            &e.manifest_dir,
            "/etc/enforcer/manifests",
            "enforcer.manifestDir",
            "--manifest-dir",
        )?,
        state_dir: path_of(
            &args.state_dir,
            &e.state_dir,
            "/var/lib/enforcer",
            "enforcer.stateDir",
            "--state-dir",
        )?,
        cri_socket: path_of(
            &args.cri_socket,
            &e.cri_socket,
            "/run/containerd/containerd.sock",
            "enforcer.criSocket",
            "--cri-socket",
        )?,
        memory_qos: args.memory_qos.or(e.memory_qos).unwrap_or(false),
        allow_privileged: args
            .allow_privileged
            .or(e.allow_privileged)
            .unwrap_or(false),
        allow_host_namespaces: args
            .allow_host_namespaces
            .or(e.allow_host_namespaces)
            .unwrap_or(false),
        allow_host_pid: args.allow_host_pid.or(e.allow_host_pid).unwrap_or(false),
        allow_host_ipc: args.allow_host_ipc.or(e.allow_host_ipc).unwrap_or(false),
        allow_host_paths: args
            .allow_host_paths
            .or(e.allow_host_paths)
            .unwrap_or(false),
    };

    let config = Config {
        eviction: EvictionConfig {
            thresholds,
            max_pod_grace_period_seconds: i64::from(max_grace),
            pressure_transition_period: transition,
        },
        hard_eviction_thresholds,
        eviction_hard: hard,
        eviction_soft: soft,
        eviction_soft_grace_period: grace,
        eviction_minimum_reclaim: reclaim,
        eviction_max_pod_grace_period: max_grace,
        eviction_pressure_transition_period: transition,
        system_reserved,
        kube_reserved,
        enforce_node_allocatable: enforce,
        cgroup_root,
        cgroup_driver,
        cgroups_per_qos: doc.cgroups_per_q_o_s.unwrap_or(true),
        cpu_manager_policy,
        cpu_manager_reconcile_period: reconcile,
        reserved_system_cpus,
        max_pods,
        kube_api_qps,
        kube_api_burst,
        event_record_qps,
        event_burst,
        serialize_image_pulls: args
            .serialize_image_pulls
            .or(doc.serialize_image_pulls)
            .unwrap_or(true),
        registry_pull_qps,
        registry_burst,
        cpu_cfs_quota: args.cpu_cfs_quota.or(doc.cpu_cfs_quota).unwrap_or(true),
        memory_throttling_factor: factor,
        enforcer,
    };
    if !config.cgroups_per_qos {
        warnings.push(format!(
            "{name}: cgroupsPerQOS=false is not supported; the enforcer always uses QoS cgroups"
        ));
    }
    Ok(LoadedConfig { config, warnings })
}

fn valid_cpuset(s: &str) -> bool {
    s.split(',').map(str::trim).all(|part| {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        match (a.trim().parse::<u32>(), b.trim().parse::<u32>()) {
            (Ok(a), Ok(b)) => a <= b,
            _ => false,
        }
    })
}

impl Config {
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
mod tests {
    use super::*;
    use crate::policy::eviction::Signal;

    fn doc(yaml: &str) -> KubeletConfiguration {
        parse_document("test.yaml", yaml).unwrap().0
    }

    #[test]
    fn defaults_are_kubelets() {
        let c = Config::defaults().unwrap();
        assert_eq!(c.eviction.thresholds.len(), 6); // 5 defaults + allocatable copy
        assert_eq!(
            c.eviction.pressure_transition_period,
            Duration::from_secs(300)
        );
        assert_eq!(c.max_pods, 110);
        assert_eq!(c.enforce_node_allocatable, ["pods"]);
        assert_eq!(c.cgroup_root, "/");
        assert_eq!(c.enforcer.http_address.to_string(), "127.0.0.1:10255");
        assert_eq!(c.enforcer.housekeeping_interval, Duration::from_secs(10));
        assert_eq!(c.kube_api_qps, 50);
        assert!(c.serialize_image_pulls);
    }

    #[test]
    fn file_then_flags() {
        let d = doc(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard: {memory.available: 1Gi}\nevictionSoft: {memory.available: 2Gi}\nevictionSoftGracePeriod: {memory.available: 1m30s}\nmaxPods: 20\nsomethingElse: 1\nenforcer: {nodeCapacity: {memory: 2Gi, cpu: \"2\"}, memoryQoS: true, bogus: 1}\n",
        );
        let args = ConfigArgs::default();
        let l = resolve("test.yaml", &d, &args).unwrap();
        assert_eq!(l.config.eviction.thresholds.len(), 3);
        assert_eq!(l.config.max_pods, 20);
        assert!(l.config.enforcer.memory_qos);
        assert_eq!(l.config.enforcer.node_capacity["memory"].to_string(), "2Gi");
        let (_, w) =
            parse_document("test.yaml", "somethingElse: 1\nenforcer: {bogus: 1}\n").unwrap();
        assert_eq!(
            w,
            [
                "test.yaml: unknown field \"somethingElse\" ignored",
                "test.yaml: unknown field \"enforcer.bogus\" ignored"
            ]
        );
        // A flag replaces the file's map.
        let args = ConfigArgs {
            eviction_hard: vec!["memory.available<500Mi,nodefs.available<10%".into()],
            max_pods: Some(30),
            ..Default::default()
        };
        let l = resolve("test.yaml", &d, &args).unwrap();
        let hard: Vec<_> = l
            .config
            .eviction
            .thresholds
            .iter()
            .filter(|t| t.is_hard())
            .map(|t| t.signal)
            .collect();
        assert_eq!(
            hard,
            [
                Signal::MemoryAvailable,
                Signal::NodeFsAvailable,
                Signal::AllocatableMemoryAvailable
            ]
        );
        assert_eq!(l.config.max_pods, 30);
    }

    #[test]
    fn every_struct_field_is_known() {
        let mut v = serde_yaml_ng::to_value(KubeletConfiguration::default()).unwrap();
        v["enforcer"] = serde_yaml_ng::to_value(EnforcerSection::default()).unwrap();
        let (_, w) = from_value("t.yaml", v).unwrap();
        assert!(w.is_empty(), "{w:?}");
        let (_, w) = parse_document(
            "t.yaml",
            "enforcer: {nested: {x: 1}}\nmaxPods: 3\n\"odd key\": [1]\n",
        )
        .unwrap();
        assert_eq!(
            w,
            [
                "t.yaml: unknown field \"enforcer.nested\" ignored",
                "t.yaml: unknown field \"odd key\" ignored"
            ]
        );
    }

    #[test]
    fn errors_name_field_and_value() {
        let err = |yaml: &str, args: ConfigArgs| {
            resolve("c.yaml", &doc(yaml), &args)
                .unwrap_err()
                .to_string()
        };
        let e = err(
            "evictionHard: {memory.available: -1Gi}",
            ConfigArgs::default(),
        );
        assert!(e.contains("evictionHard") && e.contains("-1Gi"), "{e}");
        let e = err(
            "",
            ConfigArgs {
                eviction_hard: vec!["memory.available<abc".into()],
                ..Default::default()
            },
        );
        assert!(e.contains("--eviction-hard") && e.contains("abc"), "{e}");
        let e = err(
            "evictionSoft: {memory.available: 1Gi}",
            ConfigArgs::default(),
        );
        assert!(
            e.contains("evictionSoft") && e.contains("grace period"),
            "{e}"
        );
        let e = err(
            "evictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: -1s}",
            ConfigArgs::default(),
        );
        assert!(e.contains("evictionSoftGracePeriod"), "{e}");
        let e = err("maxPods: -1", ConfigArgs::default());
        assert!(e.contains("maxPods"), "{e}");
        let e = err("systemReserved: {memory: 1e30}", ConfigArgs::default());
        assert!(e.contains("systemReserved.memory"), "{e}");
        let e = err(
            "evictionPressureTransitionPeriod: 5x",
            ConfigArgs::default(),
        );
        assert!(e.contains("evictionPressureTransitionPeriod"), "{e}");
        let e = err("cgroupDriver: systemd", ConfigArgs::default());
        assert!(e.contains("cgroupDriver"), "{e}");
        assert!(
            parse_document("c.yaml", "maxPods: [1]")
                .unwrap_err()
                .to_string()
                .contains("maxPods")
        );
        assert!(parse_document("c.yaml", "maxPods: 99999999999").is_err());
        assert!(parse_document("c.yaml", ": : :").is_err());
        assert!(
            parse_document("c.yaml", "evictionHard: 3")
                .unwrap_err()
                .to_string()
                .contains("evictionHard")
        );
    }

    #[test]
    fn clap_flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            c: ConfigArgs,
        }
        let t = T::try_parse_from([
            "t",
            "--eviction-hard=memory.available<500Mi,nodefs.available<10%",
            "--eviction-soft=memory.available<1Gi",
            "--eviction-soft-grace-period=memory.available=1m30s",
            "--system-reserved=cpu=500m,memory=1Gi",
            "--serialize-image-pulls=false",
            "--memory-qos",
            "--max-pods=50",
        ])
        .unwrap();
        let l = resolve("defaults", &KubeletConfiguration::default(), &t.c).unwrap();
        assert_eq!(l.config.system_reserved["cpu"].milli_value(), 500);
        assert!(!l.config.serialize_image_pulls);
        assert!(l.config.enforcer.memory_qos);
        let soft = l
            .config
            .eviction
            .thresholds
            .iter()
            .find(|t| !t.is_hard())
            .unwrap();
        assert_eq!(soft.grace_period, Duration::from_secs(90));
    }
}
