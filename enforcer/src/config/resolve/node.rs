//! The node: reservations, cgroups, the CPU manager, rate limits, the memory throttling
//! factor and swap.

use std::{collections::BTreeMap, time::Duration};

use super::{Key, Maps, Namer, Sourced, StringMap, count, duration_setting, key, quantity_map};
use crate::{
    config::{ConfigArgs, ConfigError, CpuManagerPolicy, KubeletConfiguration},
    policy::{cgroup_name::CgroupDriver, swap::SwapBehavior},
    quantity::Quantity,
};

/// The resources `systemReserved` and `kubeReserved` may name (besides `hugepages-*`).
const RESERVABLE: &[&str] = &["cpu", "memory", "ephemeral-storage", "pid"];

/// The validated reservations.
pub(super) struct Reservations {
    pub system: BTreeMap<String, Quantity>,
    pub kube: BTreeMap<String, Quantity>,
}

/// `systemReserved` and `kubeReserved`: non-negative quantities of reservable resources.
pub(super) fn reservations(n: &Namer<'_>, maps: &Maps) -> Result<Reservations, ConfigError> {
    let quantities = |key: Key, m: &Sourced<Option<StringMap>>| {
        quantity_map(
            n,
            key,
            m.from_flag,
            m.value.as_ref().unwrap_or(&BTreeMap::new()),
        )
    };
    let system = quantities(key::SYSTEM_RESERVED, &maps.system_reserved)?;
    let kube = quantities(key::KUBE_RESERVED, &maps.kube_reserved)?;
    for (key, m, reserved) in [
        (key::SYSTEM_RESERVED, &maps.system_reserved, &system),
        (key::KUBE_RESERVED, &maps.kube_reserved, &kube),
    ] {
        for k in reserved.keys() {
            if !(RESERVABLE.contains(&k.as_str()) || k.starts_with("hugepages-")) {
                return Err(n.invalid_entry(
                    key,
                    k,
                    m.from_flag,
                    k.clone(),
                    "only cpu, memory, ephemeral-storage, pid and hugepages-* can be reserved",
                ));
            }
        }
    }
    Ok(Reservations { system, kube })
}

/// The validated cgroup settings.
pub(super) struct Cgroups {
    pub root: String,
    pub driver: CgroupDriver,
    pub per_qos: bool,
}

/// `cgroupRoot` (absolute, default `/`), `cgroupDriver` (`cgroupfs`, the default, or
/// `systemd`), `cgroupsPerQOS`.
pub(super) fn cgroups(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<Cgroups, ConfigError> {
    let root = Sourced::pick(args.cgroup_root.clone(), doc.cgroup_root.clone());
    let from_flag = root.from_flag;
    let root = root
        .value
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "/".to_owned());
    if !root.starts_with('/') {
        return Err(n.invalid(
            key::CGROUP_ROOT,
            from_flag,
            root,
            "must be an absolute path",
        ));
    }
    let driver = Sourced::pick(args.cgroup_driver.clone(), doc.cgroup_driver.clone());
    let from_flag = driver.from_flag;
    let driver = driver.value.unwrap_or_else(|| "cgroupfs".to_owned());
    let Some(driver) = CgroupDriver::parse(&driver) else {
        return Err(n.invalid(
            key::CGROUP_DRIVER,
            from_flag,
            driver,
            "must be cgroupfs or systemd",
        ));
    };
    Ok(Cgroups {
        root,
        driver,
        per_qos: doc.cgroups_per_q_o_s.unwrap_or(true),
    })
}

/// The validated CPU manager settings.
pub(super) struct CpuManager {
    pub policy: CpuManagerPolicy,
    pub reserved_system_cpus: String,
    pub reconcile_period: Duration,
}

/// `cpuManagerPolicy` (none or static), `reservedSystemCPUs` (a cpuset),
/// `cpuManagerReconcilePeriod` (default 10s).
pub(super) fn cpu_manager(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<CpuManager, ConfigError> {
    let policy = Sourced::pick(
        args.cpu_manager_policy.clone(),
        doc.cpu_manager_policy.clone(),
    );
    let from_flag = policy.from_flag;
    let policy = match policy.value.as_deref().unwrap_or("none") {
        "none" => CpuManagerPolicy::None,
        "static" => CpuManagerPolicy::Static,
        other => {
            return Err(n.invalid(
                key::CPU_MANAGER_POLICY,
                from_flag,
                other,
                "must be none or static",
            ));
        }
    };
    let cpus = Sourced::pick(args.reserved_cpus.clone(), doc.reserved_system_cpus.clone());
    let from_flag = cpus.from_flag;
    let reserved_system_cpus = cpus.value.unwrap_or_default();
    if !reserved_system_cpus.trim().is_empty() && !valid_cpuset(&reserved_system_cpus) {
        return Err(n.invalid(
            key::RESERVED_SYSTEM_CPUS,
            from_flag,
            reserved_system_cpus,
            "not a cpuset (e.g. 0-1,4)",
        ));
    }
    let reconcile_period = duration_setting(
        n,
        key::CPU_MANAGER_RECONCILE_PERIOD,
        None,
        doc.cpu_manager_reconcile_period.as_ref(),
        Duration::from_secs(10),
    )?;
    Ok(CpuManager {
        policy,
        reserved_system_cpus,
        reconcile_period,
    })
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

/// The validated counts and rate limits.
pub(super) struct Rates {
    pub max_pods: u32,
    pub kube_api_qps: u32,
    pub kube_api_burst: u32,
    pub event_record_qps: u32,
    pub event_burst: u32,
    pub registry_pull_qps: u32,
    pub registry_burst: u32,
}

/// `maxPods` and the API, event and registry rate limits, with kubelet's defaults; none
/// negative.
pub(super) fn rates(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<Rates, ConfigError> {
    Ok(Rates {
        max_pods: count(n, key::MAX_PODS, args.max_pods, doc.max_pods, 110)?,
        kube_api_qps: count(
            n,
            key::KUBE_API_QPS,
            args.kube_api_qps,
            doc.kube_api_qps,
            50,
        )?,
        kube_api_burst: count(
            n,
            key::KUBE_API_BURST,
            args.kube_api_burst,
            doc.kube_api_burst,
            100,
        )?,
        event_record_qps: count(
            n,
            key::EVENT_RECORD_QPS,
            args.event_qps,
            doc.event_record_qps,
            50,
        )?,
        event_burst: count(n, key::EVENT_BURST, args.event_burst, doc.event_burst, 100)?,
        registry_pull_qps: count(
            n,
            key::REGISTRY_PULL_QPS,
            args.registry_qps,
            doc.registry_pull_qps,
            5,
        )?,
        registry_burst: count(
            n,
            key::REGISTRY_BURST,
            args.registry_burst,
            doc.registry_burst,
            10,
        )?,
    })
}

/// `memorySwap.swapBehavior`: `""` or `NoSwap` (the default), or `LimitedSwap` (kubelet's
/// validation message).
pub(super) fn memory_swap(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
) -> Result<crate::config::MemorySwapConfig, ConfigError> {
    let given = doc
        .memory_swap
        .as_ref()
        .and_then(|m| m.swap_behavior.as_deref())
        .unwrap_or("");
    let swap_behavior = SwapBehavior::parse(given).ok_or_else(|| {
        n.invalid(
            key::MEMORY_SWAP_BEHAVIOR,
            false,
            given,
            format!(
                "must be one of: \"\", {:?} or {:?}",
                SwapBehavior::LimitedSwap.as_str(),
                SwapBehavior::NoSwap.as_str()
            ),
        )
    })?;
    Ok(crate::config::MemorySwapConfig { swap_behavior })
}

/// The validated cluster-mode settings.
pub(super) struct Cluster {
    pub hostname_override: String,
    pub node_ip: Option<std::net::IpAddr>,
    pub node_labels: BTreeMap<String, String>,
    pub status_update: Duration,
    pub status_report: Duration,
    pub lease_duration_seconds: u32,
}

/// `hostnameOverride`, `--node-labels`, `nodeStatusUpdateFrequency`,
/// `nodeStatusReportFrequency` (kubelet's defaulting: 5 m, or the update frequency when only
/// that is set) and `nodeLeaseDurationSeconds` (40, more than 0).
pub(super) fn cluster(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<Cluster, ConfigError> {
    let hostname = Sourced::pick(
        args.hostname_override.clone(),
        doc.hostname_override.clone(),
    );
    let hostname_override = hostname.value.unwrap_or_default().trim().to_owned();
    if hostname_override.contains(char::is_whitespace) || hostname_override.contains('/') {
        return Err(n.invalid(
            key::HOSTNAME_OVERRIDE,
            hostname.from_flag,
            hostname_override,
            "not a valid node name",
        ));
    }
    let node_ip = args.node_ip;
    let mut node_labels = BTreeMap::new();
    for part in args.node_labels.iter().flat_map(|l| l.split(',')) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        match part.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                node_labels.insert(k.trim().to_owned(), v.trim().to_owned());
            }
            _ => {
                return Err(n.err(
                    true,
                    "--node-labels",
                    "--node-labels",
                    part,
                    "expected KEY=VALUE",
                ));
            }
        }
    }
    let update_given =
        args.node_status_update_frequency.is_some() || doc.node_status_update_frequency.is_some();
    let status_update = duration_setting(
        n,
        key::NODE_STATUS_UPDATE_FREQUENCY,
        args.node_status_update_frequency.as_ref(),
        doc.node_status_update_frequency.as_ref(),
        Duration::from_secs(10),
    )?;
    if status_update.is_zero() {
        return Err(n.invalid(
            key::NODE_STATUS_UPDATE_FREQUENCY,
            args.node_status_update_frequency.is_some(),
            "0s",
            "must be greater than 0",
        ));
    }
    let status_report = duration_setting(
        n,
        key::NODE_STATUS_REPORT_FREQUENCY,
        None,
        doc.node_status_report_frequency.as_ref(),
        if update_given {
            status_update
        } else {
            Duration::from_secs(300)
        },
    )?;
    let lease = doc.node_lease_duration_seconds.unwrap_or(40);
    if lease <= 0 {
        return Err(n.invalid(
            key::NODE_LEASE_DURATION_SECONDS,
            false,
            lease.to_string(),
            "must be greater than 0",
        ));
    }
    Ok(Cluster {
        node_ip,
        hostname_override,
        node_labels,
        status_update,
        status_report,
        lease_duration_seconds: u32::try_from(lease).unwrap_or(40),
    })
}

/// `podPidsLimit` / `--pod-max-pids` (default -1): a positive value is the pod cgroup's
/// `pids.max`; -1 and 0 leave pods unlimited (kubelet sets the limit only when positive).
pub(super) fn pod_pids_limit(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<i64, ConfigError> {
    let v = Sourced::pick(args.pod_max_pids, doc.pod_pids_limit);
    let limit = v.value.unwrap_or(-1);
    if limit < -1 {
        return Err(n.invalid(
            key::POD_PIDS_LIMIT,
            v.from_flag,
            limit.to_string(),
            "must be -1 (unlimited), 0 (unlimited) or a positive number of processes",
        ));
    }
    Ok(limit)
}

/// `syncFrequency` / `--sync-frequency` (1 m), greater than 0.
pub(super) fn sync_frequency(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<Duration, ConfigError> {
    let d = duration_setting(
        n,
        key::SYNC_FREQUENCY,
        args.sync_frequency.as_ref(),
        doc.sync_frequency.as_ref(),
        Duration::from_secs(60),
    )?;
    if d.is_zero() {
        return Err(n.invalid(
            key::SYNC_FREQUENCY,
            args.sync_frequency.is_some(),
            "0s",
            "must be greater than 0",
        ));
    }
    Ok(d)
}

/// `clusterDNS` / `--cluster-dns` (the flag's list if given, comma-separated, else the
/// file's): each an IP address.
pub(super) fn cluster_dns(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<Vec<String>, ConfigError> {
    let from_flag = !args.cluster_dns.is_empty();
    let list: Vec<String> = if from_flag {
        args.cluster_dns
            .iter()
            .flat_map(|s| s.split(','))
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    } else {
        doc.cluster_dns.clone().unwrap_or_default()
    };
    for ip in &list {
        if ip.parse::<std::net::IpAddr>().is_err() {
            return Err(n.invalid(
                key::CLUSTER_DNS,
                from_flag,
                ip.clone(),
                "must be an IP address",
            ));
        }
    }
    Ok(list)
}

/// `allowedUnsafeSysctls` (the flag's list if given, else the file's): each a sysctl name or
/// `prefix*` pattern known to be namespaced, as kubelet refuses to start otherwise.
pub(super) fn allowed_unsafe_sysctls(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<Vec<String>, ConfigError> {
    let from_flag = !args.allowed_unsafe_sysctls.is_empty();
    let list = if from_flag {
        args.allowed_unsafe_sysctls.clone()
    } else {
        doc.allowed_unsafe_sysctls.clone().unwrap_or_default()
    };
    for s in &list {
        crate::policy::security::SysctlAllowlist::new(std::slice::from_ref(s))
            .map_err(|e| n.invalid(key::ALLOWED_UNSAFE_SYSCTLS, from_flag, s.clone(), e))?;
    }
    Ok(list)
}
