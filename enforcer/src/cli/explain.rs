//! `enforcer explain POD.yaml`: QoS class, cgroup parent, cgroup values and per-container OOM
//! score of each pod in the file.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use super::{CliError, read, yaml_error};
use crate::{
    config::{self, ConfigArgs, CpuManagerPolicy},
    policy::{
        cpu::{CpuSet, StaticPolicy, Topology},
        oom,
        qos::{self, QosClass},
        resources::{
            self,
            cgroup::{self, CgroupOptions, PodCgroupValues},
        },
    },
    quantity::Quantity,
};

/// Options of `enforcer explain`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ExplainArgs {
    /// The pod manifest (several YAML documents: one line per pod).
    pub pod: PathBuf,
    /// Node cpu capacity (default: this machine's).
    #[arg(long, value_name = "QUANTITY")]
    pub node_cpu: Option<String>,
    /// Node memory capacity (default: this machine's).
    #[arg(long, value_name = "QUANTITY")]
    pub node_memory: Option<String>,
    /// cgroup version, 1 or 2 (default: this machine's).
    #[arg(long, value_name = "1|2")]
    pub cgroup_version: Option<u8>,
    /// KubeletConfiguration file.
    #[arg(long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Explained {
    pod: String,
    qos_class: QosClass,
    cgroup_parent: String,
    pod_cgroup: PodCgroupValues,
    containers: Vec<ContainerOut>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ContainerOut {
    name: String,
    oom_score_adj: i64,
    cpu_shares: u64,
    cpu_quota_micros: Option<i64>,
    memory_limit_bytes: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_min_bytes: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_low_bytes: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_high_bytes: Option<i64>,
    /// The CPUs the container runs on under the static CPU manager policy (its exclusive
    /// CPUs, or the shared pool); absent under `none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpuset: Option<String>,
}

/// This machine's memory (`MemTotal`, as cAdvisor's `MemoryCapacity`), in bytes.
fn machine_memory() -> Option<i64> {
    crate::node::machine_memory().ok()
}

/// This machine's cgroup version: 2 when `/sys/fs/cgroup` is the unified hierarchy.
fn machine_cgroup_version() -> u8 {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        2
    } else {
        1
    }
}

fn capacity_arg(
    value: Option<&str>,
    flag: &str,
    default: impl FnOnce() -> Option<i64>,
    cpu: bool,
) -> Result<i64, CliError> {
    let invalid = |m: String| CliError::invalid(Path::new("command line"), flag, m);
    match value {
        Some(s) => {
            let q = Quantity::parse(s.trim()).map_err(|e| invalid(e.to_string()))?;
            if q.signum() <= 0 {
                return Err(invalid(format!("{s:?} must be greater than zero")));
            }
            Ok(if cpu { q.milli_value() } else { q.value() })
        }
        None => {
            default().ok_or_else(|| invalid("cannot read this machine's value; pass it".to_owned()))
        }
    }
}

/// The static CPU manager the node would run, when `cpuManagerPolicy` is `static`: over
/// `--node-cpu` CPUs (one socket, one thread per core) when given, else this machine's
/// topology; reserved CPUs from `reservedSystemCPUs` or the reserved cpu. The pods of the
/// file are allocated in order, as the node would admit them.
fn static_cpu_manager(
    args: &ExplainArgs,
    cfg: &config::Config,
    cpu_milli: i64,
) -> Result<Option<StaticPolicy>, CliError> {
    if cfg.cpu_manager_policy != CpuManagerPolicy::Static {
        return Ok(None);
    }
    let config_path = args
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from("command line"));
    let topology = match args.node_cpu {
        Some(_) => {
            let cpus = u32::try_from(cpu_milli / 1000)
                .unwrap_or(u32::MAX)
                .min(4096);
            if cpus == 0 {
                return Err(CliError::invalid(
                    Path::new("command line"),
                    "--node-cpu",
                    "the static CPU manager policy needs at least one whole CPU",
                ));
            }
            Topology::uniform(1, cpus, 1)
        }
        None => crate::node::cpu_topology(Path::new("/sys")).map_err(|e| {
            CliError::invalid(
                Path::new("/sys/devices/system/cpu"),
                "topology",
                format!("{e}; pass --node-cpu"),
            )
        })?,
    };
    let reserved = match cfg.reserved_system_cpus.trim() {
        "" => None,
        r => Some(
            CpuSet::parse(r)
                .map_err(|e| CliError::invalid(&config_path, "reservedSystemCPUs", e))?,
        ),
    };
    let reserved_milli = [&cfg.system_reserved, &cfg.kube_reserved]
        .iter()
        .filter_map(|m| m.get("cpu"))
        .fold(0i64, |a, q| a.saturating_add(q.milli_value()));
    StaticPolicy::new(topology, reserved.as_ref(), reserved_milli, None)
        .map(Some)
        .map_err(|e| CliError::invalid(&config_path, "cpuManagerPolicy", e))
}

/// The pod of the `i`th YAML document of `path`; an error names the document and the place
/// in it.
fn pod_of_document(path: &Path, i: usize, value: serde_yaml_ng::Value) -> Result<Pod, CliError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let inner = yaml_error(path, e);
        match inner {
            CliError::Invalid {
                path,
                place,
                message,
            } => CliError::Invalid {
                path,
                place: format!("document {}: {place}", i + 1),
                message,
            },
            other => other,
        }
    })
}

/// Explains every pod in `args.pod`; one JSON line per pod.
pub fn explain(args: &ExplainArgs) -> Result<Vec<String>, CliError> {
    let cfg = config::load(&ConfigArgs {
        config: args.config.clone(),
        ..ConfigArgs::default()
    })?
    .config;
    let memory = capacity_arg(
        args.node_memory.as_deref(),
        "--node-memory",
        machine_memory,
        false,
    )?;
    let cpu_milli = capacity_arg(
        args.node_cpu.as_deref(),
        "--node-cpu",
        || {
            std::thread::available_parallelism()
                .ok()
                .and_then(|n| i64::try_from(n.get()).ok())
                .map(|n| n * 1000)
        },
        true,
    )?;
    let mut cpu_manager = static_cpu_manager(args, &cfg, cpu_milli)?;
    let version = match args.cgroup_version {
        None => machine_cgroup_version(),
        Some(v @ (1 | 2)) => v,
        Some(v) => {
            return Err(CliError::invalid(
                Path::new("command line"),
                "--cgroup-version",
                format!("{v} is not 1 or 2"),
            ));
        }
    };
    let reserved = [&cfg.system_reserved, &cfg.kube_reserved]
        .iter()
        .filter_map(|m| m.get("memory"))
        .fold(0i64, |a, q| a.saturating_add(q.value()));
    let opts = CgroupOptions {
        v2: version == 2,
        enforce_cpu_limits: cfg.cpu_cfs_quota,
        memory_qos: cfg.enforcer.memory_qos,
        memory_throttling_factor: cfg.memory_throttling_factor,
        tiered_reservation: cfg.memory_reservation_policy
            == crate::config::MemoryReservationPolicy::TieredReservation,
        single_process_oom_kill: cfg.single_process_oom_kill,
        pod_pids_limit: cfg.pod_pids_limit,
        allocatable_memory: memory.saturating_sub(reserved).max(0),
        ..CgroupOptions::default()
    };

    let path = &args.pod;
    let text = read(path)?;
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
        let value: serde_yaml_ng::Value = serde_yaml_ng::Value::deserialize(doc)
            .map_err(|e| CliError::invalid(path, format!("document {}", i + 1), e))?;
        if value.is_null() {
            continue;
        }
        let mut pod = pod_of_document(path, i, value)?;
        resources::validate_pod(&pod)
            .map_err(|e| CliError::invalid(path, format!("document {}", i + 1), e))?;
        resources::apply_defaults(&mut pod);
        let qos_class = qos::pod_qos(&pod);
        let mut containers = Vec::new();
        for c in resources::init_containers(&pod)
            .iter()
            .chain(resources::containers(&pod))
        {
            let score = oom::container_oom_score_adj(&pod, c, memory)
                .map_err(|e| CliError::invalid(Path::new("command line"), "--node-memory", e))?;
            let v = cgroup::container_cgroup_values_in(&pod, c, &opts);
            let cpuset = match cpu_manager.as_mut() {
                Some(m) => {
                    let set = m.allocate(&pod, c).map_err(|e| {
                        CliError::invalid(
                            path,
                            format!("document {}: container {:?}", i + 1, c.name),
                            format!("cpu manager (static policy): {e}"),
                        )
                    })?;
                    Some(
                        set.unwrap_or_else(|| m.state().default_cpu_set.clone())
                            .to_string(),
                    )
                }
                None => None,
            };
            containers.push(ContainerOut {
                name: c.name.clone(),
                oom_score_adj: score.value,
                cpu_shares: v.cpu_shares,
                cpu_quota_micros: v.cpu_quota_micros,
                memory_limit_bytes: v.memory_limit_bytes,
                memory_min_bytes: v.memory_min_bytes,
                memory_low_bytes: v.memory_low_bytes,
                memory_high_bytes: v.memory_high_bytes,
                cpuset,
            });
        }
        let e = Explained {
            pod: resources::pod_name(&pod).to_owned(),
            qos_class,
            cgroup_parent: cgroup::cgroup_parent_of(&pod, cfg.cgroup_driver, &cfg.cgroup_root),
            pod_cgroup: cgroup::pod_cgroup_values(&pod, &opts),
            containers,
        };
        out.push(
            serde_json::to_string(&e)
                .map_err(|err| CliError::invalid(path, format!("document {}", i + 1), err))?,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_example() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pod.yaml");
        std::fs::write(
            &p,
            "metadata: {name: web, uid: 6f1c}\nspec:\n  containers:\n    - name: app\n      resources: {requests: {memory: 100Mi}, limits: {memory: 1Gi}}\n---\nmetadata: {name: g, uid: g1}\nspec: {containers: [{name: a, resources: {limits: {cpu: 1, memory: 1Gi}}}]}\n",
        )
        .unwrap();
        let args = ExplainArgs {
            pod: p.clone(),
            node_cpu: Some("4".into()),
            node_memory: Some("8Gi".into()),
            cgroup_version: Some(2),
            config: None,
        };
        let out = explain(&args).unwrap();
        assert_eq!(
            out[0],
            r#"{"pod":"web","qosClass":"Burstable","cgroupParent":"/kubepods/burstable/pod6f1c","podCgroup":{"cpuShares":2,"cpuWeight":1,"cpuQuotaMicros":null,"cpuPeriodMicros":100000,"memoryLimitBytes":1073741824},"containers":[{"name":"app","oomScoreAdj":988,"cpuShares":2,"cpuQuotaMicros":null,"memoryLimitBytes":1073741824}]}"#
        );
        assert!(
            out[1].contains(r#""qosClass":"Guaranteed","cgroupParent":"/kubepods/podg1""#),
            "{}",
            out[1]
        );
        assert!(out[1].contains(r#""oomScoreAdj":-997"#));
        std::fs::write(&p, "metadata: {name: x}\nspec: {containers: [{name: a, resources: {limits: {memory: lots}}}]}\n").unwrap();
        let e = explain(&args).unwrap_err().to_string();
        assert!(e.contains("pod.yaml") && e.contains("limits.memory"), "{e}");
        std::fs::write(&p, "metadata: {name: x}\nspec: {containers: 3}\n").unwrap();
        let e = explain(&args).unwrap_err().to_string();
        assert!(e.contains("spec.containers"), "{e}");
    }

    #[test]
    fn node_cpu_sizes_the_static_cpu_manager() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("kubelet.yaml");
        std::fs::write(
            &cfg,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n",
        )
        .unwrap();
        let p = dir.path().join("pods.yaml");
        let guaranteed = |name: &str, cpu: &str| {
            format!(
                "metadata: {{name: {name}, uid: {name}}}\nspec: {{containers: [{{name: a, resources: {{limits: {{cpu: '{cpu}', memory: 1Gi}}}}}}]}}\n"
            )
        };
        std::fs::write(
            &p,
            [
                guaranteed("two", "2"),
                guaranteed("half", "500m"),
                guaranteed("three", "3"),
            ]
            .join("---\n"),
        )
        .unwrap();
        let args = |cpu: &str| ExplainArgs {
            pod: p.clone(),
            node_cpu: Some(cpu.into()),
            node_memory: Some("8Gi".into()),
            cgroup_version: Some(2),
            config: Some(cfg.clone()),
        };
        // 8 CPUs, cpu 0 reserved: 1-2 for "two", 3-5 for "three"; "half" shares the pool.
        let out = explain(&args("8")).unwrap();
        assert!(out[0].contains(r#""cpuset":"1-2""#), "{}", out[0]);
        assert!(out[1].contains(r#""cpuset":"0,3-7""#), "{}", out[1]);
        assert!(out[2].contains(r#""cpuset":"3-5""#), "{}", out[2]);
        // 4 CPUs: "three" no longer fits, and the error names the pod's document and container.
        let e = explain(&args("4")).unwrap_err().to_string();
        assert!(e.contains("document 3") && e.contains("\"a\""), "{e}");
        // Without the static policy there is no cpuset.
        let none = ExplainArgs {
            config: None,
            ..args("4")
        };
        assert!(!explain(&none).unwrap()[0].contains("cpuset"));
    }
}
