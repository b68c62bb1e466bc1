//! `enforcer simulate SCENARIO.yaml`: replay a node's life through the eviction manager and
//! admission, one JSON line per step.

use std::{collections::BTreeMap, path::Path, time::Duration};

use k8s_openapi::api::core::v1::{Pod, Taint};
use serde::{Deserialize, Serialize};

use super::{CliError, read, yaml_error};
use crate::{
    config::{self, ConfigArgs, Scalar, duration},
    policy::{
        admission::{self, Admitter, Node, SecurityPolicy},
        eviction::{
            self, ActivePod, ContainerStats, NodeCondition, Observation, Observations, PodStats,
            Signal, State,
        },
        resources,
    },
    quantity::Quantity,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    #[serde(default)]
    config: Option<serde_yaml_ng::Value>,
    node: NodeSpec,
    #[serde(default)]
    pods: Vec<Pod>,
    #[serde(default)]
    steps: Vec<Step>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeSpec {
    #[serde(default)]
    name: Option<String>,
    capacity: BTreeMap<String, Quantity>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    taints: Vec<Taint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    at: Scalar,
    #[serde(default)]
    observe: BTreeMap<Signal, Quantity>,
    #[serde(default)]
    usage: BTreeMap<String, Usage>,
    #[serde(default)]
    admit: Vec<Pod>,
    #[serde(default)]
    delete: Vec<String>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct Usage {
    memory: Option<Quantity>,
    #[serde(rename = "ephemeral-storage")]
    ephemeral_storage: Option<Quantity>,
    inodes: Option<Quantity>,
    pids: Option<Quantity>,
    #[serde(default)]
    containers: BTreeMap<String, ContainerUsage>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct ContainerUsage {
    memory: Option<Quantity>,
    #[serde(rename = "ephemeral-storage")]
    ephemeral_storage: Option<Quantity>,
}

/// One output line.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StepOutput {
    at: serde_json::Number,
    conditions: Vec<NodeCondition>,
    evicted: Vec<Evicted>,
    admission: Vec<Admission>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Evicted {
    pod: String,
    signal: Signal,
    grace_period_seconds: i64,
    message: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Admission {
    pod: String,
    admitted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

struct Active {
    pod: Pod,
    stats: Option<PodStats>,
}

fn prepare_pod(path: &Path, place: &str, mut pod: Pod) -> Result<Pod, CliError> {
    if resources::pod_name(&pod).is_empty() {
        return Err(CliError::invalid(
            path,
            format!("{place}.metadata.name"),
            "a pod needs a name",
        ));
    }
    resources::validate_pod(&pod).map_err(|e| CliError::invalid(path, place, e))?;
    resources::apply_defaults(&mut pod);
    Ok(pod)
}

fn at_seconds(path: &Path, place: &str, at: &Scalar) -> Result<Duration, CliError> {
    let s = at.0.trim();
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Duration::from_secs(n));
    }
    if let Ok(f) = s.parse::<f64>() {
        if (0.0..1e12).contains(&f) {
            return Ok(Duration::from_secs_f64(f));
        }
        return Err(CliError::invalid(
            path,
            place,
            format!("invalid time {s:?}: must be a non-negative number of seconds or a duration"),
        ));
    }
    duration::parse(s).map_err(|e| CliError::invalid(path, place, e))
}

fn to_bytes(path: &Path, place: &str, q: Option<Quantity>) -> Result<Option<i64>, CliError> {
    match q {
        Some(q) if q.signum() < 0 => Err(CliError::invalid(
            path,
            place,
            format!("usage {q} must not be negative"),
        )),
        Some(q) => Ok(Some(q.value())),
        None => Ok(None),
    }
}

fn stats_of(path: &Path, place: &str, pod: &Pod, usage: &Usage) -> Result<PodStats, CliError> {
    let mut containers = Vec::new();
    for name in usage.containers.keys() {
        if !resources::containers(pod)
            .iter()
            .chain(resources::init_containers(pod))
            .any(|c| c.name == *name)
        {
            return Err(CliError::invalid(
                path,
                format!("{place}.containers.{name}"),
                format!(
                    "pod {:?} has no container {name:?}",
                    resources::pod_name(pod)
                ),
            ));
        }
    }
    // Spec order, as the runtime lists containers.
    for c in resources::containers(pod)
        .iter()
        .chain(resources::init_containers(pod))
    {
        if let Some(u) = usage.containers.get(&c.name) {
            let cp = format!("{place}.containers.{}", c.name);
            containers.push(ContainerStats {
                name: c.name.clone(),
                memory: to_bytes(path, &cp, u.memory)?,
                ephemeral_storage: to_bytes(path, &cp, u.ephemeral_storage)?,
            });
        }
    }
    let sum = |f: fn(&ContainerStats) -> Option<i64>| -> Option<i64> {
        let v: Vec<i64> = containers.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().fold(0i64, |a, b| a.saturating_add(*b)))
    };
    Ok(PodStats {
        memory: to_bytes(path, place, usage.memory)?.or_else(|| sum(|c| c.memory)),
        ephemeral_storage: to_bytes(path, place, usage.ephemeral_storage)?
            .or_else(|| sum(|c| c.ephemeral_storage)),
        inodes: to_bytes(path, place, usage.inodes)?,
        processes: to_bytes(path, place, usage.pids)?,
        containers: containers.into(),
        volumes: std::collections::BTreeMap::new(),
    })
}

fn capacity_of(
    signal: Signal,
    capacity: &BTreeMap<String, Quantity>,
    allocatable_memory: i64,
) -> i64 {
    let get = |k: &str| capacity.get(k).map_or(0, Quantity::value);
    match signal {
        Signal::MemoryAvailable => get("memory"),
        Signal::AllocatableMemoryAvailable => allocatable_memory,
        Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
            get("ephemeral-storage")
        }
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree | Signal::ContainerFsInodesFree => {
            get("inodes")
        }
        Signal::PidAvailable => get("pids"),
    }
}

/// The scenario's node: its capacity (the configuration's override on top, `pods` from
/// `maxPods` when not given), the kubepods memory limit, and the node admission sees.
fn scenario_node(
    path: &Path,
    spec: &NodeSpec,
    cfg: &config::Config,
) -> Result<(BTreeMap<String, Quantity>, i64, Node), CliError> {
    let mut capacity = spec.capacity.clone();
    for (k, v) in &capacity {
        if v.signum() < 0 {
            return Err(CliError::invalid(
                path,
                format!("node.capacity.{k}"),
                format!("capacity {v} must not be negative"),
            ));
        }
    }
    for (k, v) in &cfg.enforcer.node_capacity {
        capacity.insert(k.clone(), *v);
    }
    capacity
        .entry("pods".to_owned())
        .or_insert_with(|| admission::pods_quantity(cfg.max_pods));
    let allocatable = admission::allocatable(
        &capacity,
        &cfg.system_reserved,
        &cfg.kube_reserved,
        &cfg.hard_eviction_thresholds,
    );
    let kubepods_memory =
        admission::kubepods_memory_limit(&capacity, &cfg.system_reserved, &cfg.kube_reserved);
    let node_name = spec
        .name
        .clone()
        .or_else(|| spec.labels.get("kubernetes.io/hostname").cloned())
        .unwrap_or_else(|| "node".to_owned());
    let node = Node {
        name: node_name,
        labels: spec.labels.clone(),
        taints: spec.taints.clone(),
        allocatable,
    };
    Ok((capacity, kubepods_memory, node))
}

/// The security policy of admission: the configuration's, on a node without AppArmor.
fn security_policy(cfg: &config::Config) -> SecurityPolicy {
    SecurityPolicy {
        allow_privileged: cfg.enforcer.allow_privileged,
        allow_host_namespaces: cfg.enforcer.allow_host_namespaces,
        allow_host_pid: cfg.enforcer.allow_host_pid,
        allow_host_ipc: cfg.enforcer.allow_host_ipc,
        allow_host_paths: cfg.enforcer.allow_host_paths,
        sysctls: cfg.sysctl_allowlist(),
        // A scenario's node is described by the file alone, not by the machine simulate runs
        // on: it has no AppArmor (any profile but `unconfined` is refused, as on a node
        // without it).
        apparmor_enabled: false,
    }
}

/// A step's `admit`: each pod through admission under the step's node conditions; an
/// admitted one becomes active.
fn admit_pods(
    path: &Path,
    sp: &str,
    admit: Vec<Pod>,
    active: &mut Vec<Active>,
    admitter: &mut Admitter,
    conditions: &[NodeCondition],
) -> Result<Vec<Admission>, CliError> {
    let mut admissions = Vec::new();
    for (j, pod) in admit.into_iter().enumerate() {
        let place = format!("{sp}.admit[{j}]");
        let pod = prepare_pod(path, &place, pod)?;
        let name = resources::pod_name(&pod).to_owned();
        if active.iter().any(|a| resources::pod_name(&a.pod) == name) {
            return Err(CliError::invalid(
                path,
                format!("{place}.metadata.name"),
                format!("a pod named {name:?} is already active"),
            ));
        }
        let r = admitter.admit(&pod, conditions);
        if r.admitted {
            admitter.add(&pod);
            active.push(Active { pod, stats: None });
            admissions.push(Admission {
                pod: name,
                admitted: true,
                reason: None,
                message: None,
            });
        } else {
            admissions.push(Admission {
                pod: name,
                admitted: false,
                reason: Some(r.reason),
                message: Some(r.message),
            });
        }
    }
    Ok(admissions)
}

/// A step's time in its output: whole seconds as an integer, else a float.
fn at_json(at: Duration) -> serde_json::Number {
    let secs = at.as_secs_f64();
    if at.subsec_nanos() == 0 {
        serde_json::Number::from(at.as_secs())
    } else {
        serde_json::Number::from_f64(secs).unwrap_or_else(|| serde_json::Number::from(at.as_secs()))
    }
}

/// The scenario's pods already running, each validated and defaulted; names are unique.
fn running_pods(path: &Path, pods: Vec<Pod>) -> Result<Vec<Active>, CliError> {
    let mut active: Vec<Active> = Vec::new();
    for (i, pod) in pods.into_iter().enumerate() {
        let place = format!("pods[{i}]");
        let pod = prepare_pod(path, &place, pod)?;
        if active
            .iter()
            .any(|a| resources::pod_name(&a.pod) == resources::pod_name(&pod))
        {
            return Err(CliError::invalid(
                path,
                format!("{place}.metadata.name"),
                format!("duplicate pod name {:?}", resources::pod_name(&pod)),
            ));
        }
        active.push(Active { pod, stats: None });
    }
    Ok(active)
}

/// A step's `delete`: each named pod leaves the active pods and admission.
fn delete_pods(
    path: &Path,
    sp: &str,
    delete: &[String],
    active: &mut Vec<Active>,
    admitter: &mut Admitter,
) -> Result<(), CliError> {
    for (j, name) in delete.iter().enumerate() {
        let Some(idx) = active
            .iter()
            .position(|a| resources::pod_name(&a.pod) == name)
        else {
            return Err(CliError::invalid(
                path,
                format!("{sp}.delete[{j}]"),
                format!("no active pod named {name:?}"),
            ));
        };
        let gone = active.remove(idx);
        admitter.remove(&gone.pod);
    }
    Ok(())
}

/// The scenario's configuration (a KubeletConfiguration; none: the defaults), resolved.
fn scenario_config(
    path: &Path,
    config: Option<serde_yaml_ng::Value>,
) -> Result<config::Config, CliError> {
    let name = format!("{}: config", path.display());
    let doc = match config {
        Some(v) if !v.is_null() => {
            let (doc, _warnings) = config::from_value(&name, v)?;
            doc
        }
        _ => config::KubeletConfiguration::default(),
    };
    Ok(config::resolve(&name, &doc, &ConfigArgs::default())?.config)
}

/// Runs the scenario at `path`; returns one JSON line per step.
pub fn simulate(path: &Path) -> Result<Vec<String>, CliError> {
    let text = read(path)?;
    let de = serde_yaml_ng::Deserializer::from_str(&text);
    let scenario: Scenario =
        serde_path_to_error::deserialize(de).map_err(|e| yaml_error(path, e))?;

    let cfg = scenario_config(path, scenario.config)?;

    // Node.
    let (capacity, kubepods_memory, node) = scenario_node(path, &scenario.node, &cfg)?;
    let security = security_policy(&cfg);

    // Pods already running.
    let mut active = running_pods(path, scenario.pods)?;
    let mut admitter = Admitter::new(node, security, active.iter().map(|a| &a.pod));

    let mut state = State::default();
    let mut observations = Observations::new();
    let mut last_at = Duration::ZERO;
    let mut out = Vec::new();
    for (i, step) in scenario.steps.into_iter().enumerate() {
        let sp = format!("steps[{i}]");
        let at = at_seconds(path, &format!("{sp}.at"), &step.at)?;
        if at < last_at {
            return Err(CliError::invalid(
                path,
                format!("{sp}.at"),
                format!(
                    "time {} goes backwards (previous step at {})",
                    duration::format(at),
                    duration::format(last_at)
                ),
            ));
        }
        last_at = at;
        // delete
        delete_pods(path, &sp, &step.delete, &mut active, &mut admitter)?;
        // observe
        for (signal, q) in &step.observe {
            observations.insert(
                *signal,
                Observation {
                    available: q.value(),
                    capacity: capacity_of(*signal, &capacity, kubepods_memory),
                    time: Some(at),
                },
            );
        }
        // usage
        for (name, usage) in &step.usage {
            let up = format!("{sp}.usage.{name}");
            let Some(a) = active
                .iter_mut()
                .find(|a| resources::pod_name(&a.pod) == name)
            else {
                return Err(CliError::invalid(
                    path,
                    up,
                    format!("no active pod named {name:?}"),
                ));
            };
            a.stats = Some(stats_of(path, &up, &a.pod, usage)?);
        }
        // one eviction-manager step
        let pods: Vec<ActivePod<'_>> = active
            .iter()
            .map(|a| ActivePod::new(&a.pod, a.stats.as_ref()))
            .collect();
        // The evicted pod leaves at once (its cleanup is over by the next step); the simulated
        // node has no dead containers or unused images: node-level reclaim frees nothing, and
        // is not paced.
        let input = eviction::Input {
            released: true,
            ..eviction::Input::new(&observations, &pods, at)
        };
        state.reclaim = eviction::manager::ReclaimPacer::default();
        let (mut next, mut decision) = eviction::step(&cfg.eviction, state, &input);
        if matches!(decision.action, eviction::Action::ReclaimNodeLevel { .. }) {
            let input = eviction::Input {
                node_reclaim: Some(eviction::manager::NodeReclaimed::Observed(&observations)),
                ..input
            };
            (next, decision) = eviction::step(&cfg.eviction, next, &input);
        }
        state = next;
        let mut evicted = Vec::new();
        if let eviction::Action::Evict { eviction: e, .. } = decision.action {
            evicted.push(Evicted {
                pod: e.name.clone(),
                signal: e.signal,
                grace_period_seconds: e.grace_period_seconds,
                message: e.message,
            });
            let gone = active.remove(e.index);
            admitter.remove(&gone.pod);
        }
        // admit
        let admissions = admit_pods(
            path,
            &sp,
            step.admit,
            &mut active,
            &mut admitter,
            &decision.conditions,
        )?;
        let line = StepOutput {
            at: at_json(at),
            conditions: decision.conditions,
            evicted,
            admission: admissions,
        };
        out.push(serde_json::to_string(&line).map_err(|e| CliError::invalid(path, sp, e))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(yaml: &str) -> Result<Vec<String>, CliError> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.yaml");
        std::fs::write(&p, yaml).unwrap();
        simulate(&p)
    }

    #[test]
    fn documented_example_shape() {
        let out = run(r#"
config:
  evictionHard: {memory.available: 1Gi}
  evictionSoft: {memory.available: 2Gi}
  evictionSoftGracePeriod: {memory.available: 2m}
  evictionMaxPodGracePeriod: 5
node:
  capacity: {cpu: "4", memory: 8Gi, ephemeral-storage: 100Gi, pods: "110", pids: "2000"}
pods:
  - metadata: {name: web, namespace: default, uid: u1}
    spec:
      containers:
        - name: app
          image: busybox
          resources: {requests: {memory: 100Mi}, limits: {memory: 1Gi}}
steps:
  - at: 0s
    observe: {memory.available: 1500Mi}
    usage: {web: {memory: 400Mi, containers: {app: {memory: 400Mi}}}}
  - at: 2m
    observe: {memory.available: 1500Mi}
    admit:
      - metadata: {name: batch}
        spec: {containers: [{name: c, image: busybox}]}
"#)
        .unwrap();
        assert_eq!(
            out[0],
            r#"{"at":0,"conditions":["MemoryPressure"],"evicted":[],"admission":[]}"#
        );
        assert_eq!(
            out[1],
            r#"{"at":120,"conditions":["MemoryPressure"],"evicted":[{"pod":"web","signal":"memory.available","gracePeriodSeconds":5,"message":"The node was low on resource: memory. Threshold quantity: 2Gi, available: 1500Mi. Container app was using 400Mi, request is 100Mi, has larger consumption of memory. "}],"admission":[{"pod":"batch","admitted":false,"reason":"Evicted","message":"The node had condition: [MemoryPressure]. "}]}"#
        );
    }

    #[test]
    fn malformed_inputs_name_the_place() {
        let base = "node: {capacity: {memory: 1Gi}}\n";
        for (yaml, place) in [
            (
                format!("{base}steps: [{{at: 0s, observe: {{memory.available: abc}}}}]"),
                "steps[0].observe",
            ),
            (
                format!("{base}steps: [{{at: 0s, observe: {{bogus.signal: 1Gi}}}}]"),
                "steps[0].observe",
            ),
            (
                format!("{base}steps: [{{at: 5s}}, {{at: 1s}}]"),
                "steps[1].at",
            ),
            (
                format!("{base}steps: [{{at: 0s, usage: {{nope: {{memory: 1Mi}}}}}}]"),
                "steps[0].usage.nope",
            ),
            (
                format!("{base}steps: [{{at: 0s, delete: [x]}}]"),
                "steps[0].delete[0]",
            ),
            (format!("{base}stepz: []"), "."),
            (
                format!(
                    "{base}pods: [{{metadata: {{name: a}}, spec: {{containers: [{{name: c, resources: {{requests: {{cpu: 1e30}}}}}}]}}}}]"
                ),
                "pods[0]",
            ),
            (
                "node: {capacity: {memory: -1Gi}}".to_owned(),
                "node.capacity.memory",
            ),
            (
                "config: {evictionHard: {memory.available: 200%}}\nnode: {capacity: {}}".to_owned(),
                "evictionHard",
            ),
            (
                "config: {maxPods: nope}\nnode: {capacity: {}}".to_owned(),
                "maxPods",
            ),
            ("node: [".to_owned(), "line"),
        ] {
            let e = run(&yaml).unwrap_err().to_string();
            assert!(e.contains(place), "{yaml}\n=> {e}");
            assert!(e.contains("s.yaml"), "{e}");
        }
    }
}
