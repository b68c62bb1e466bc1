//! The pod's status, pure: kubelet's `generateAPIPodStatus` and
//! `convertToAPIContainerStatuses` (`kubelet_pods.go`) from the pod spec, what the runtime
//! reports of the sandbox's containers, the waiting reasons of the last sync, the prober's
//! results and the `oom_score_adj` check. The pod worker (`crate::pods::worker`) gathers those
//! values and publishes what [`pod_status`] returns; nothing here talks to the runtime or
//! reads a clock. The status types live here, below the status manager that keeps them
//! (`crate::status_manager` re-exports them).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use serde::{Deserialize, Serialize};

use super::{
    pod_actions::{
        AppState, ContainerKind, PodPhase, RestartPolicy, RuntimeState, effective_exit_code,
        pod_phase,
    },
    resize::{
        actions::ActualResources,
        status::{allocated_resources, container_status_resources},
    },
    resources,
};

mod resources_status;
pub use resources_status::{Requirements, ResourcesStatus};

/// A container's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ContainerState {
    Waiting {
        reason: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        message: String,
    },
    Running {
        started_at: String,
    },
    #[serde(rename_all = "camelCase")]
    Terminated {
        exit_code: i32,
        reason: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        message: String,
        started_at: String,
        finished_at: String,
    },
}

impl ContainerState {
    /// `Running`, `Waiting` or `Terminated` with its reason, for the table.
    #[must_use]
    pub fn short(&self) -> String {
        match self {
            Self::Waiting { reason, .. } => reason.clone(),
            Self::Running { .. } => "Running".to_owned(),
            Self::Terminated {
                reason, exit_code, ..
            } => format!("{reason}({exit_code})"),
        }
    }
}

/// One container's status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecord {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container_id: String,
    pub image: String,
    /// The image's digest reference as the runtime reports it (the API's `imageID`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_id: String,
    pub ready: bool,
    /// kubelet's `started`: running, and past its startup probe if it has one (`None` in
    /// records written before probes existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<bool>,
    pub restart_count: u32,
    pub state: ContainerState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_state: Option<ContainerState>,
    /// The `oom_score_adj` the container's processes have (read in /proc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_score_adj: Option<i64>,
    /// The decision core's value, when the node made it differ (clamped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_score_adj_decided: Option<i64>,
    /// `allocatedResources` and `resources` (kubelet reports them since in-place resize).
    #[serde(flatten, default)]
    pub resources: ResourcesStatus,
}

impl ContainerRecord {
    /// kubelet's `TerminatePod`: a container of a pod whose worker ended without a final state
    /// is `ContainerStatusUnknown` (137), never left running in a terminal pod's status (the
    /// status writer would take it for a pod that could still run, and hold the phase back).
    pub fn terminated_unknown(&mut self) {
        self.ready = false;
        if matches!(self.state, ContainerState::Terminated { .. }) {
            return;
        }
        // The last state is left as it is, as kubelet leaves `LastTerminationState`.
        self.state = ContainerState::Terminated {
            exit_code: 137,
            reason: "ContainerStatusUnknown".to_owned(),
            message: "The container could not be located when the pod was terminated".to_owned(),
            started_at: String::new(),
            finished_at: String::new(),
        };
    }
}

/// A pod condition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl Condition {
    /// A condition with only its type and status (`True` / `False`).
    #[must_use]
    pub fn new(kind: &str, ok: bool) -> Self {
        Self {
            kind: kind.to_owned(),
            status: if ok { "True" } else { "False" }.to_owned(),
            reason: String::new(),
            message: String::new(),
        }
    }
}

/// One pod's status as the status manager keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    /// Where the pod came from (manifest file path, or `api`).
    pub source: String,
    /// Pending, Running, Succeeded, Failed (or Terminating while being killed).
    pub phase: PodPhase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    pub qos_class: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub start_time: String,
    /// The pod's IP addresses (the sandbox's; none for host-network pods).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cgroup: String,
    pub conditions: Vec<Condition>,
    pub init_container_statuses: Vec<ContainerRecord>,
    pub container_statuses: Vec<ContainerRecord>,
    /// The pod-level `allocatedResources` and `resources` (KEP-5419, with
    /// `InPlacePodLevelResourcesVerticalScaling`; none without it).
    #[serde(flatten, default)]
    pub resources: ResourcesStatus,
}

/// What the runtime reports of one container instance (CRI's `ContainerStatus`; an exited
/// one's message with its termination message appended, as kubelet's
/// `toKubeContainerStatus`). Its exit code is the instance's [`RuntimeState::Exited`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeStatus {
    pub reason: String,
    pub message: String,
    /// Nanoseconds since the Unix epoch (0: not yet).
    pub started_at: i64,
    pub finished_at: i64,
    /// The image's digest reference (the API's `imageID`).
    pub image_ref: String,
}

/// One container instance in the pod's sandbox, as the pod worker observed it (kubelet's
/// `kubecontainer.Status` with the prober's results).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerObservation {
    pub id: String,
    /// The container's name in the spec.
    pub name: String,
    /// The listed state; an exited instance's exit code is the runtime status's.
    pub state: RuntimeState,
    pub restart_count: u32,
    /// The runtime's status; read for the newest instance of each container and the exited
    /// one before it (its last state), default for the others (only their state counts).
    pub status: RuntimeStatus,
    /// Killed for a failed liveness or startup probe ([`effective_exit_code`]).
    pub probe_killed: bool,
    /// The prober's `started`: past its startup probe, or without one.
    pub started: bool,
    /// The prober's readiness: past its readiness probe, or without one.
    pub ready: bool,
    /// The `oom_score_adj` check: the decided value and the one the processes have (read in
    /// /proc), when the container was checked.
    pub oom_score_adj: Option<(i64, Option<i64>)>,
    /// The cpu and memory the runtime runs a running instance with (as last actuated).
    pub actual: Option<ActualResources>,
}

/// What [`pod_status`] builds the pod's status from: plain values the pod worker gathered.
#[derive(Clone, Debug)]
pub struct PodStatusInput<'a> {
    pub pod: &'a Pod,
    pub uid: String,
    /// Where the pod came from (manifest file path, or `api`).
    pub source: String,
    /// The pod-level message of the last sync (errors).
    pub message: String,
    pub qos_class: String,
    pub start_time: String,
    /// The pod's IPs (the sandbox's; none for host-network pods).
    pub pod_ips: Vec<String>,
    pub sandbox_id: String,
    pub cgroup: String,
    /// The container instances of the sandbox, newest first.
    pub containers: Vec<ContainerObservation>,
    /// Waiting reasons and messages found in the last sync, by container name.
    pub waiting: &'a HashMap<String, (String, String)>,
    /// A non-restartable init container failed (the plan's `init_failed`).
    pub init_failed: bool,
    /// The worker is syncing the pod (`PodReadyToStartContainers`; false once the pod ran to
    /// its end).
    pub syncing: bool,
}

/// kubelet's `generateAPIPodStatus`: the containers' statuses
/// ([`container_status`]), the phase (`getPhase`) and the conditions
/// (`PodReadyToStartContainers`, `Initialized`, `ContainersReady`, `Ready`,
/// `PodScheduled`).
#[must_use]
pub fn pod_status(input: PodStatusInput<'_>) -> PodRecord {
    let PodStatusInput {
        pod,
        uid,
        source,
        message,
        qos_class,
        start_time,
        pod_ips,
        sandbox_id,
        cgroup,
        containers,
        waiting,
        init_failed,
        syncing,
    } = input;
    let no_spec;
    let spec_ref = match &pod.spec {
        Some(s) => s,
        None => {
            no_spec = PodSpec::default();
            &no_spec
        }
    };
    let instances = |name: &str| -> Vec<&ContainerObservation> {
        containers.iter().filter(|x| x.name == name).collect()
    };
    let mut inits = Vec::new();
    let mut init_pending = false;
    let mut unready = Vec::new();
    let app_created = spec_ref
        .containers
        .iter()
        .any(|c| containers.iter().any(|x| x.name == c.name));
    for c in spec_ref.init_containers.iter().flatten() {
        let (rec, st) = container_status(c, &instances(&c.name), waiting.get(&c.name));
        let done = if ContainerKind::of_init(c) == ContainerKind::Sidecar {
            // Sidecars count towards ContainersReady (kubelet 1.29+), and are done
            // initializing once started (past their startup probe).
            if !rec.ready {
                unready.push(c.name.clone());
            }
            st == AppState::Running && rec.started == Some(true)
        } else {
            st == AppState::Exited { code: 0 }
        };
        // kubelet's GeneratePodInitializedCondition: initialized for good once a regular
        // container started.
        init_pending |= !done && !app_created;
        inits.push(rec);
    }
    let mut apps = Vec::new();
    let mut states = Vec::new();
    for c in &spec_ref.containers {
        let (rec, st) = container_status(c, &instances(&c.name), waiting.get(&c.name));
        if !rec.ready {
            unready.push(c.name.clone());
        }
        apps.push(rec);
        states.push(st);
    }
    let phase = pod_phase(RestartPolicy::of(pod), init_failed, init_pending, &states);
    let ready = phase == PodPhase::Running && unready.is_empty();
    let cond = Condition::new;
    // kubelet's GenerateContainersReadyCondition / GeneratePodReadyCondition.
    let ready_cond = |kind: &str| {
        let mut c = Condition::new(kind, ready);
        if phase == PodPhase::Succeeded {
            c.reason = "PodCompleted".to_owned();
        } else if !unready.is_empty() {
            c.reason = "ContainersNotReady".to_owned();
            c.message = format!("containers with unready status: [{}]", unready.join(" "));
        }
        if ready {
            c.reason.clear();
            c.message.clear();
        }
        c
    };
    PodRecord {
        uid,
        name: resources::pod_name(pod).to_owned(),
        namespace: resources::pod_namespace(pod).to_owned(),
        source,
        phase,
        reason: String::new(),
        message,
        qos_class,
        start_time,
        pod_ips,
        sandbox_id,
        cgroup,
        conditions: vec![
            cond("PodReadyToStartContainers", syncing),
            cond("Initialized", !init_pending),
            ready_cond("ContainersReady"),
            ready_cond("Ready"),
            cond("PodScheduled", true),
        ],
        init_container_statuses: inits,
        container_statuses: apps,
        // The pod-level figures are the worker's (the pod cgroup's values and the gate).
        resources: ResourcesStatus::default(),
    }
}

/// kubelet's `convertToAPIContainerStatuses` for one container of the spec: its newest
/// instance's state (`waiting` from the last sync overrides an exited one's, which becomes
/// the last state), the exited instance before it as the last state, started and ready from
/// the prober; and what the container does for the phase.
#[must_use]
pub fn container_status(
    c: &Container,
    instances: &[&ContainerObservation],
    waiting: Option<&(String, String)>,
) -> (ContainerRecord, AppState) {
    let image = c.image.clone().unwrap_or_default();
    let Some(latest) = instances.first() else {
        let (reason, message) = waiting
            .cloned()
            .unwrap_or_else(|| ("ContainerCreating".to_owned(), String::new()));
        return (
            ContainerRecord {
                name: c.name.clone(),
                container_id: String::new(),
                image,
                image_id: String::new(),
                ready: false,
                started: Some(false),
                restart_count: 0,
                state: ContainerState::Waiting { reason, message },
                last_state: None,
                oom_score_adj: None,
                oom_score_adj_decided: None,
                resources: ResourcesStatus::new(
                    allocated_resources(c),
                    &container_status_resources(c, false, None, None),
                ),
            },
            AppState::Waiting,
        );
    };
    let st = &latest.status;
    let term = |x: &ContainerObservation, exit_code: i32| ContainerState::Terminated {
        exit_code,
        reason: if x.status.reason.is_empty() {
            if exit_code == 0 { "Completed" } else { "Error" }.to_owned()
        } else {
            x.status.reason.clone()
        },
        message: x.status.message.clone(),
        started_at: rfc3339(x.status.started_at),
        finished_at: rfc3339(x.status.finished_at),
    };
    let last_state = match instances.get(1) {
        Some(prev) => match prev.state {
            RuntimeState::Exited { code } => Some(term(prev, code)),
            _ => None,
        },
        None => None,
    };
    let (state, app, last_state) = match latest.state {
        RuntimeState::Running => (
            ContainerState::Running {
                started_at: rfc3339(st.started_at),
            },
            AppState::Running,
            last_state,
        ),
        RuntimeState::Exited { code } => {
            let app = AppState::Exited {
                code: effective_exit_code(code, latest.probe_killed),
            };
            match waiting {
                Some((reason, message)) => (
                    ContainerState::Waiting {
                        reason: reason.clone(),
                        message: message.clone(),
                    },
                    app,
                    Some(term(latest, code)),
                ),
                None => (term(latest, code), app, last_state),
            }
        }
        RuntimeState::Created | RuntimeState::Unknown => (
            ContainerState::Waiting {
                reason: "ContainerCreating".to_owned(),
                message: String::new(),
            },
            AppState::Waiting,
            last_state,
        ),
    };
    // kubelet's prober manager: started once past the startup probe, ready once started
    // and past the readiness probe (each without its probe: as soon as running).
    let started = app == AppState::Running && latest.started;
    let ready = started && latest.ready;
    (
        ContainerRecord {
            name: c.name.clone(),
            container_id: format!("containerd://{}", latest.id),
            image,
            image_id: st.image_ref.clone(),
            ready,
            started: Some(started),
            restart_count: latest.restart_count,
            state,
            last_state,
            oom_score_adj: latest.oom_score_adj.and_then(|(_, got)| got),
            oom_score_adj_decided: latest
                .oom_score_adj
                .filter(|(decided, got)| Some(*decided) != *got)
                .map(|(decided, _)| decided),
            resources: ResourcesStatus::new(
                allocated_resources(c),
                &container_status_resources(
                    c,
                    latest.state == RuntimeState::Running,
                    latest.actual,
                    None,
                ),
            ),
        },
        app,
    )
}

pub use crate::clock::rfc3339;

/// An exited container's reason: the runtime's, except that an exit 137 the kernel's OOM
/// killer is known to have caused (the enforcer's own eBPF record of the victim's cgroup) is
/// `OOMKilled` where the runtime said otherwise (containerd under the systemd driver loses
/// the OOM event with the container's scope).
#[must_use]
pub fn exit_reason(runtime_reason: &str, exit_code: i32, kernel_oom_killed: bool) -> String {
    if kernel_oom_killed && exit_code == 137 && runtime_reason != "OOMKilled" {
        "OOMKilled".to_owned()
    } else {
        runtime_reason.to_owned()
    }
}

#[cfg(test)]
mod tests;
