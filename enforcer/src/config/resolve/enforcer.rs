//! The `enforcer:` section: what kubelet has no field for.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use super::{Key, Namer, Sourced, duration_setting, key, map_setting, quantity_map};
use crate::config::{ConfigArgs, ConfigError, EnforcerConfig, KubeletConfiguration};

/// The `enforcer:` section with its defaults.
pub(super) fn section(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<EnforcerConfig, ConfigError> {
    let e = doc.enforcer.clone().unwrap_or_default();
    let housekeeping_interval = duration_setting(
        n,
        key::HOUSEKEEPING_INTERVAL,
        args.housekeeping_interval.as_ref(),
        e.housekeeping_interval.as_ref(),
        Duration::from_secs(10),
    )?;
    if housekeeping_interval.is_zero() {
        return Err(n.invalid(
            key::HOUSEKEEPING_INTERVAL,
            args.housekeeping_interval.is_some(),
            "0s",
            "must be greater than zero",
        ));
    }
    let capacity = map_setting(
        n,
        key::NODE_CAPACITY,
        '=',
        &args.node_capacity,
        e.node_capacity.as_ref(),
    )?;
    let node_capacity = quantity_map(
        n,
        key::NODE_CAPACITY,
        capacity.from_flag,
        &capacity.value.unwrap_or_default(),
    )?;
    let http = Sourced::pick(args.http_address.clone(), e.http_address.clone());
    let from_flag = http.from_flag;
    let http_address_given = http.value.is_some();
    let http = http
        .value
        .unwrap_or_else(|| crate::config::DEFAULT_HTTP_ADDRESS.to_owned());
    let http_address: SocketAddr = http
        .parse()
        .map_err(|err| n.invalid(key::HTTP_ADDRESS, from_flag, http.clone(), err))?;
    let secure = Sourced::pick(
        args.secure_metrics_address.clone(),
        e.secure_metrics_address.clone(),
    );
    let secure_metrics_address = match secure.value {
        None => None,
        Some(a) => Some(a.parse::<SocketAddr>().map_err(|err| {
            n.invalid(
                key::SECURE_METRICS_ADDRESS,
                secure.from_flag,
                a.clone(),
                err,
            )
        })?),
    };
    let (image_gc_period, image_pull_secret_dir) = super::images::section(n, doc)?;
    let path = |key: Key, flag: &Option<PathBuf>, file: &Option<PathBuf>, default: &str| {
        path_setting(n, key, flag.clone(), file.clone(), default)
    };
    Ok(EnforcerConfig {
        signal_source: args.signal_source.or(e.signal_source).unwrap_or_default(),
        housekeeping_interval,
        node_capacity,
        http_address,
        http_address_given,
        own_metrics_only: false,
        secure_metrics_address,
        manifest_dir: path(
            key::MANIFEST_DIR,
            &args.manifest_dir,
            // kubelet's `staticPodPath` when the section names no directory of its own (the
            // companion reads kubelet's static pods there).
            &e.manifest_dir
                .clone()
                .or_else(|| doc.static_pod_path.as_ref().map(PathBuf::from)),
            "/etc/enforcer/manifests",
        )?,
        state_dir: path(
            key::STATE_DIR,
            &args.state_dir,
            &e.state_dir,
            "/var/lib/enforcer",
        )?,
        cri_socket: path(
            key::CRI_SOCKET,
            &args.cri_socket,
            &e.cri_socket,
            "/run/containerd/containerd.sock",
        )?,
        // The `MemoryQoS` gate's, set by the caller (`gates::memory_qos`).
        memory_qos: false,
        memory_tripwire: args.memory_tripwire.or(e.memory_tripwire).unwrap_or(true),
        crossing_realtime: args
            .crossing_realtime
            .or(e.crossing_realtime)
            .unwrap_or(true),
        reap_memory: args.reap_memory.or(e.reap_memory).unwrap_or(true),
        // Checked against the thresholds once they are known (`throttle_before_evict`).
        throttle_before_evict: Vec::new(),
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
        image_gc_period,
        image_pull_secret_dir,
    })
}

/// A path: the flag's, else the file's, else `default`; not empty.
fn path_setting(
    n: &Namer<'_>,
    key: Key,
    flag: Option<PathBuf>,
    file: Option<PathBuf>,
    default: &str,
) -> Result<PathBuf, ConfigError> {
    let p = Sourced::pick(flag, file);
    let from_flag = p.from_flag;
    let p = p.value.unwrap_or_else(|| PathBuf::from(default));
    if p.as_os_str().is_empty() {
        return Err(n.invalid(key, from_flag, "", "must not be empty"));
    }
    Ok(p)
}

/// `enforcer.throttleBeforeEvict`: memory signals, each with a hard threshold among
/// `thresholds`.
pub(super) fn throttle_before_evict(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
    thresholds: &[crate::policy::eviction::Threshold],
) -> Result<Vec<crate::policy::eviction::Signal>, ConfigError> {
    use crate::policy::eviction::{Signal, throttle};
    let from_flag = !args.throttle_before_evict.is_empty();
    let list = if from_flag {
        args.throttle_before_evict.clone()
    } else {
        doc.enforcer
            .as_ref()
            .and_then(|e| e.throttle_before_evict.clone())
            .unwrap_or_default()
    };
    let mut out: Vec<Signal> = Vec::new();
    for name in list {
        let name = name.trim().to_owned();
        let Some(signal) = Signal::parse(&name).filter(|s| throttle::applies_to(*s)) else {
            return Err(n.invalid(
                key::THROTTLE_BEFORE_EVICT,
                from_flag,
                name,
                "must be memory.available or allocatableMemory.available",
            ));
        };
        if !thresholds.iter().any(|t| t.signal == signal && t.is_hard()) {
            return Err(n.invalid(
                key::THROTTLE_BEFORE_EVICT,
                from_flag,
                name,
                "has no hard eviction threshold (evictionHard) to throttle before",
            ));
        }
        if !out.contains(&signal) {
            out.push(signal);
        }
    }
    Ok(out)
}
