//! Applying the command-line flags over a `KubeletConfiguration` document and validating the
//! result into a [`Config`], topic by topic: eviction (with node allocatable enforcement), the
//! node's reservations, cgroups, CPU manager and rate limits, then the `enforcer:` section.
//!
//! The topics run in a fixed order, so that of several invalid values the same one is always
//! reported first.

mod enforcer;
mod eviction;
mod gates;
mod images;
mod managers;
mod node;
mod serving;

use std::{collections::BTreeMap, time::Duration};

use super::{
    Config, ConfigArgs, ConfigError, KubeletConfiguration, LoadedConfig, Scalar, ScalarMap,
    duration, flags,
};
use crate::{policy::eviction::EvictionConfig, quantity::Quantity};

/// A setting's two names: its field in the file and its flag on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Key {
    /// The field, dotted below the top level (`enforcer.stateDir`).
    pub field: &'static str,
    /// The flag (`--state-dir`); the field again for a setting without a flag.
    pub flag: &'static str,
}

macro_rules! keys {
    ($($(#[$doc:meta])* $name:ident = $field:literal, $flag:literal;)*) => {
        $($(#[$doc])* pub(super) const $name: Key = Key { field: $field, flag: $flag };)*
        /// Every key, for the test that holds the table to the structs and the flags.
        #[cfg(test)]
        pub(super) const ALL: &[Key] = &[$($name),*];
    };
}

/// The settings that can be invalid, each named once: its field and its flag.
pub(super) mod key {
    use super::Key;

    keys! {
        EVICTION_HARD = "evictionHard", "--eviction-hard";
        EVICTION_SOFT = "evictionSoft", "--eviction-soft";
        EVICTION_SOFT_GRACE_PERIOD = "evictionSoftGracePeriod", "--eviction-soft-grace-period";
        EVICTION_MINIMUM_RECLAIM = "evictionMinimumReclaim", "--eviction-minimum-reclaim";
        EVICTION_MAX_POD_GRACE_PERIOD =
            "evictionMaxPodGracePeriod", "--eviction-max-pod-grace-period";
        EVICTION_PRESSURE_TRANSITION_PERIOD =
            "evictionPressureTransitionPeriod", "--eviction-pressure-transition-period";
        ENFORCE_NODE_ALLOCATABLE = "enforceNodeAllocatable", "--enforce-node-allocatable";
        SYSTEM_RESERVED = "systemReserved", "--system-reserved";
        KUBE_RESERVED = "kubeReserved", "--kube-reserved";
        CGROUP_ROOT = "cgroupRoot", "--cgroup-root";
        CGROUP_DRIVER = "cgroupDriver", "--cgroup-driver";
        CPU_MANAGER_POLICY = "cpuManagerPolicy", "--cpu-manager-policy";
        /// File only.
        CPU_MANAGER_RECONCILE_PERIOD = "cpuManagerReconcilePeriod", "cpuManagerReconcilePeriod";
        RESERVED_SYSTEM_CPUS = "reservedSystemCPUs", "--reserved-cpus";
        MEMORY_MANAGER_POLICY = "memoryManagerPolicy", "--memory-manager-policy";
        RESERVED_MEMORY = "reservedMemory", "--reserved-memory";
        TOPOLOGY_MANAGER_POLICY = "topologyManagerPolicy", "--topology-manager-policy";
        TOPOLOGY_MANAGER_SCOPE = "topologyManagerScope", "--topology-manager-scope";
        MAX_PODS = "maxPods", "--max-pods";
        KUBE_API_QPS = "kubeAPIQPS", "--kube-api-qps";
        KUBE_API_BURST = "kubeAPIBurst", "--kube-api-burst";
        EVENT_RECORD_QPS = "eventRecordQPS", "--event-qps";
        EVENT_BURST = "eventBurst", "--event-burst";
        REGISTRY_PULL_QPS = "registryPullQPS", "--registry-qps";
        REGISTRY_BURST = "registryBurst", "--registry-burst";
        ADDRESS = "address", "--address";
        PORT = "port", "--port";
        READ_ONLY_PORT = "readOnlyPort", "--read-only-port";
        AUTHORIZATION = "authorization", "--authorization-mode";
        /// File only.
        AUTHENTICATION = "authentication", "authentication";
        /// File only.
        MAX_PARALLEL_IMAGE_PULLS = "maxParallelImagePulls", "maxParallelImagePulls";
        IMAGE_GC_HIGH_THRESHOLD_PERCENT =
            "imageGCHighThresholdPercent", "--image-gc-high-threshold";
        IMAGE_GC_LOW_THRESHOLD_PERCENT = "imageGCLowThresholdPercent", "--image-gc-low-threshold";
        IMAGE_MINIMUM_GC_AGE = "imageMinimumGCAge", "--minimum-image-ttl-duration";
        /// File only.
        IMAGE_MAXIMUM_GC_AGE = "imageMaximumGCAge", "imageMaximumGCAge";
        /// File only.
        IMAGE_GC_PERIOD = "enforcer.imageGCPeriod", "enforcer.imageGCPeriod";
        /// File only.
        IMAGE_PULL_SECRET_DIR = "enforcer.imagePullSecretDir", "enforcer.imagePullSecretDir";
        /// File only.
        MEMORY_THROTTLING_FACTOR = "memoryThrottlingFactor", "memoryThrottlingFactor";
        /// File only.
        MEMORY_RESERVATION_POLICY = "memoryReservationPolicy", "memoryReservationPolicy";
        FEATURE_GATES = "featureGates", "--feature-gates";
        MEMORY_QOS = "enforcer.memoryQoS", "--memory-qos";
        /// File only.
        MEMORY_SWAP_BEHAVIOR = "memorySwap.swapBehavior", "memorySwap.swapBehavior";
        POD_PIDS_LIMIT = "podPidsLimit", "--pod-max-pids";
        SYNC_FREQUENCY = "syncFrequency", "--sync-frequency";
        CLUSTER_DNS = "clusterDNS", "--cluster-dns";
        ALLOWED_UNSAFE_SYSCTLS = "allowedUnsafeSysctls", "--allowed-unsafe-sysctls";
        HOUSEKEEPING_INTERVAL = "enforcer.housekeepingInterval", "--housekeeping-interval";
        THROTTLE_BEFORE_EVICT = "enforcer.throttleBeforeEvict", "--throttle-before-evict";
        NODE_CAPACITY = "enforcer.nodeCapacity", "--node-capacity";
        HTTP_ADDRESS = "enforcer.httpAddress", "--http-address";
        SECURE_METRICS_ADDRESS = "enforcer.secureMetricsAddress", "--secure-metrics-address";
        MANIFEST_DIR = "enforcer.manifestDir", "--manifest-dir";
        STATE_DIR = "enforcer.stateDir", "--state-dir";
        CRI_SOCKET = "enforcer.criSocket", "--cri-socket";
        HOSTNAME_OVERRIDE = "hostnameOverride", "--hostname-override";
        NODE_STATUS_UPDATE_FREQUENCY =
            "nodeStatusUpdateFrequency", "--node-status-update-frequency";
        /// File only.
        NODE_STATUS_REPORT_FREQUENCY = "nodeStatusReportFrequency", "nodeStatusReportFrequency";
        /// File only.
        NODE_LEASE_DURATION_SECONDS = "nodeLeaseDurationSeconds", "nodeLeaseDurationSeconds";
    }
}

/// A value and whether it came from a flag (else from the file or the default).
#[derive(Debug, Clone)]
struct Sourced<T> {
    value: T,
    from_flag: bool,
}

impl<T> Sourced<Option<T>> {
    /// The flag's value if given, else the file's.
    fn pick(flag: Option<T>, file: Option<T>) -> Self {
        match flag {
            Some(v) => Self {
                value: Some(v),
                from_flag: true,
            },
            None => Self {
                value: file,
                from_flag: false,
            },
        }
    }
}

/// Names the file in errors, or the command line for a value from a flag.
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

    /// `value` is invalid for the setting `key`.
    fn invalid(
        &self,
        key: Key,
        from_flag: bool,
        value: impl Into<String>,
        reason: impl ToString,
    ) -> ConfigError {
        self.err(from_flag, key.field, key.flag, value, reason)
    }

    /// `value` is invalid for the entry `entry` of the map setting `key` (`systemReserved.memory`).
    fn invalid_entry(
        &self,
        key: Key,
        entry: &str,
        from_flag: bool,
        value: impl Into<String>,
        reason: impl ToString,
    ) -> ConfigError {
        self.err(
            from_flag,
            &format!("{}.{entry}", key.field),
            key.flag,
            value,
            reason,
        )
    }
}

type StringMap = BTreeMap<String, String>;

fn plain(m: &ScalarMap) -> StringMap {
    m.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect()
}

/// A map setting: the flag's map (`sep` separated, repeated flags accumulate) replaces the
/// file's.
fn map_setting(
    n: &Namer<'_>,
    key: Key,
    sep: char,
    flag: &[String],
    file: Option<&ScalarMap>,
) -> Result<Sourced<Option<StringMap>>, ConfigError> {
    let flag = if flag.is_empty() {
        None
    } else {
        let m = flags::parse_map(flag, sep).map_err(|e| n.invalid(key, true, flag.join(","), e))?;
        Some(m)
    };
    Ok(Sourced::pick(flag, file.map(plain)))
}

/// The map-valued settings of the eviction and reservation topics, read (and the flags'
/// syntax checked) before either is validated.
struct Maps {
    hard: Sourced<Option<StringMap>>,
    soft: Sourced<Option<StringMap>>,
    grace: Sourced<Option<StringMap>>,
    reclaim: Sourced<Option<StringMap>>,
    system_reserved: Sourced<Option<StringMap>>,
    kube_reserved: Sourced<Option<StringMap>>,
}

impl Maps {
    fn read(
        n: &Namer<'_>,
        doc: &KubeletConfiguration,
        args: &ConfigArgs,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            hard: map_setting(
                n,
                key::EVICTION_HARD,
                '<',
                &args.eviction_hard,
                doc.eviction_hard.as_ref(),
            )?,
            soft: map_setting(
                n,
                key::EVICTION_SOFT,
                '<',
                &args.eviction_soft,
                doc.eviction_soft.as_ref(),
            )?,
            grace: map_setting(
                n,
                key::EVICTION_SOFT_GRACE_PERIOD,
                '=',
                &args.eviction_soft_grace_period,
                doc.eviction_soft_grace_period.as_ref(),
            )?,
            reclaim: map_setting(
                n,
                key::EVICTION_MINIMUM_RECLAIM,
                '=',
                &args.eviction_minimum_reclaim,
                doc.eviction_minimum_reclaim.as_ref(),
            )?,
            system_reserved: map_setting(
                n,
                key::SYSTEM_RESERVED,
                '=',
                &args.system_reserved,
                doc.system_reserved.as_ref(),
            )?,
            kube_reserved: map_setting(
                n,
                key::KUBE_RESERVED,
                '=',
                &args.kube_reserved,
                doc.kube_reserved.as_ref(),
            )?,
        })
    }
}

/// Each entry parsed as a non-negative quantity.
fn quantity_map(
    n: &Namer<'_>,
    key: Key,
    from_flag: bool,
    m: &StringMap,
) -> Result<BTreeMap<String, Quantity>, ConfigError> {
    let mut out = BTreeMap::new();
    for (k, v) in m {
        let q = Quantity::parse(v.trim())
            .map_err(|e| n.invalid_entry(key, k, from_flag, v.clone(), e))?;
        if q.signum() < 0 {
            return Err(n.invalid_entry(key, k, from_flag, v.clone(), "must not be negative"));
        }
        out.insert(k.clone(), q);
    }
    Ok(out)
}

fn non_negative(n: &Namer<'_>, key: Key, from_flag: bool, v: i32) -> Result<u32, ConfigError> {
    u32::try_from(v).map_err(|_| n.invalid(key, from_flag, v.to_string(), "must not be negative"))
}

/// A count (`maxPods`, a QPS): the flag's, else the file's, else `default`; not negative.
fn count(
    n: &Namer<'_>,
    key: Key,
    flag: Option<i32>,
    file: Option<i32>,
    default: i32,
) -> Result<u32, ConfigError> {
    let v = Sourced::pick(flag, file);
    non_negative(n, key, v.from_flag, v.value.unwrap_or(default))
}

/// A Go duration: the flag's, else the file's, else `default`.
fn duration_setting(
    n: &Namer<'_>,
    key: Key,
    flag: Option<&String>,
    file: Option<&Scalar>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match (flag, file) {
        (Some(v), _) => duration::parse(v).map_err(|e| n.invalid(key, true, v.clone(), e)),
        (None, Some(v)) => duration::parse(&v.0).map_err(|e| n.invalid(key, false, v.0.clone(), e)),
        (None, None) => Ok(default),
    }
}

/// Applies `args` over `doc` (named `name` in errors) and validates.
pub fn resolve(
    name: &str,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<LoadedConfig, ConfigError> {
    let n = Namer { file: name };
    let mut warnings = Vec::new();
    let serialize_image_pulls = args
        .serialize_image_pulls
        .or(doc.serialize_image_pulls)
        .unwrap_or(true);
    let images = images::images(&n, doc, args, serialize_image_pulls)?;
    let serving = serving::serving(&n, doc, args)?;

    let maps = Maps::read(&n, doc, args)?;
    let enforce = eviction::enforce_node_allocatable(&n, doc, args)?;
    let eviction = eviction::eviction(&n, doc, args, &maps, &enforce, &mut warnings)?;
    let reserved = node::reservations(&n, &maps)?;
    let cgroups = node::cgroups(&n, doc, args)?;
    let cpu_manager = node::cpu_manager(&n, doc, args)?;
    let managers = managers::managers(&n, doc, args)?;
    let rates = node::rates(&n, doc, args)?;
    let mut feature_gates = gates::feature_gates(&n, doc, args, &mut warnings)?;
    let (memory_qos, memory_throttling_factor, memory_reservation_policy) =
        gates::memory_qos(&n, doc, args, &mut feature_gates)?;
    let memory_swap = node::memory_swap(&n, doc)?;
    let cluster = node::cluster(&n, doc, args)?;
    let allowed_unsafe_sysctls = node::allowed_unsafe_sysctls(&n, doc, args)?;
    let mut enforcer = enforcer::section(&n, doc, args)?;
    enforcer.memory_qos = memory_qos;
    enforcer.throttle_before_evict =
        enforcer::throttle_before_evict(&n, doc, args, &eviction.thresholds)?;

    let config = Config {
        eviction: EvictionConfig {
            thresholds: eviction.thresholds,
            max_pod_grace_period_seconds: i64::from(eviction.max_pod_grace_period),
            pressure_transition_period: eviction.pressure_transition_period,
            throttle_before_evict: enforcer.throttle_before_evict.clone(),
        },
        hard_eviction_thresholds: eviction.hard_thresholds,
        eviction_hard: eviction.hard,
        eviction_soft: eviction.soft,
        eviction_soft_grace_period: eviction.grace,
        eviction_minimum_reclaim: eviction.reclaim,
        eviction_max_pod_grace_period: eviction.max_pod_grace_period,
        eviction_pressure_transition_period: eviction.pressure_transition_period,
        system_reserved: reserved.system,
        kube_reserved: reserved.kube,
        enforce_node_allocatable: enforce,
        cgroup_root: cgroups.root,
        cgroup_driver: cgroups.driver,
        cgroups_per_qos: cgroups.per_qos,
        cpu_manager_policy: cpu_manager.policy,
        cpu_manager_reconcile_period: cpu_manager.reconcile_period,
        reserved_system_cpus: cpu_manager.reserved_system_cpus,
        memory_manager_policy: managers.memory_manager_policy,
        reserved_memory: managers.reserved_memory,
        topology_manager_policy: managers.topology_manager_policy,
        topology_manager_scope: managers.topology_manager_scope,
        max_pods: rates.max_pods,
        kube_api_qps: rates.kube_api_qps,
        kube_api_burst: rates.kube_api_burst,
        event_record_qps: rates.event_record_qps,
        event_burst: rates.event_burst,
        serialize_image_pulls,
        registry_pull_qps: rates.registry_pull_qps,
        registry_burst: rates.registry_burst,
        images,
        serving,
        cpu_cfs_quota: args.cpu_cfs_quota.or(doc.cpu_cfs_quota).unwrap_or(true),
        feature_gates,
        memory_throttling_factor,
        memory_reservation_policy,
        single_process_oom_kill: doc.single_process_oom_kill.unwrap_or(false),
        memory_swap,
        fail_swap_on: args.fail_swap_on.or(doc.fail_swap_on).unwrap_or(true),
        hostname_override: cluster.hostname_override,
        node_ip: cluster.node_ip,
        node_labels: cluster.node_labels,
        node_status_update_frequency: cluster.status_update,
        node_status_report_frequency: cluster.status_report,
        node_lease_duration_seconds: cluster.lease_duration_seconds,
        pod_pids_limit: node::pod_pids_limit(&n, doc, args)?,
        sync_frequency: node::sync_frequency(&n, doc, args)?,
        cluster_dns: node::cluster_dns(&n, doc, args)?,
        cluster_domain: args
            .cluster_domain
            .clone()
            .or_else(|| doc.cluster_domain.clone())
            .unwrap_or_default()
            .trim_matches('.')
            .to_owned(),
        resolv_conf: args
            .resolv_conf
            .clone()
            .or_else(|| doc.resolv_conf.clone())
            .unwrap_or_else(|| crate::policy::dns::DEFAULT_RESOLV_CONF.to_owned()),
        allowed_unsafe_sysctls,
        enforcer,
    };
    if !config.cgroups_per_qos {
        warnings.push(format!(
            "{name}: cgroupsPerQOS=false is not supported; the enforcer always uses QoS cgroups"
        ));
    }
    Ok(LoadedConfig { config, warnings })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EnforcerSection;

    /// The key table names real fields and real flags.
    #[test]
    fn keys_name_fields_and_flags() {
        use clap::CommandFactory as _;
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            c: ConfigArgs,
        }
        let cmd = T::command();
        let flags: Vec<String> = cmd
            .get_arguments()
            .flat_map(|a| {
                a.get_long()
                    .into_iter()
                    .chain(a.get_all_aliases().into_iter().flatten())
                    .map(|l| format!("--{l}"))
            })
            .collect();
        let top = serde_json::to_value(KubeletConfiguration::default()).unwrap();
        let section = serde_json::to_value(EnforcerSection::default()).unwrap();
        for k in key::ALL {
            let known = match k.field.split_once('.') {
                Some(("enforcer", f)) => section.get(f).is_some(),
                // A field of a nested kubelet struct (`memorySwap.swapBehavior`).
                Some((outer, _)) => top.get(outer).is_some(),
                None => top.get(k.field).is_some(),
            };
            assert!(known, "{} is not a field", k.field);
            assert!(
                k.flag == k.field || flags.iter().any(|f| f == k.flag),
                "{} is not a flag",
                k.flag
            );
        }
    }
}
