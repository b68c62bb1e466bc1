//! The pod worker's side of an in-place resize (kubelet's `computePodResizeAction` and
//! `doPodResizeAction`): the running containers' allocated cpu and memory against what was
//! last actuated for them, CRI `UpdateContainerResources` and the pod cgroup's writes in
//! kubelet's order ([`resize_steps`]), a restart where a container's `resizePolicy` asks for
//! one, and the `PodResizeInProgress` condition while it is not done.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{PodWorker, RUNNING, WorkerError, name_of};
use crate::{
    cri::{ContainerRuntime, sandbox_resources, spec},
    policy::{
        pod_status::Condition,
        resize::{
            PodAllocation, ResizeCondition,
            actions::{
                ActualResources, ContainerResize, ContainerResources, PodCgroupResize,
                PodResizePlan, ResizeStep, compute_container_resize, resize_steps, update_values,
            },
        },
        resources::{self, cgroup::PodCgroupValues},
    },
};

/// What the worker knows of the pod's resize between syncs.
#[derive(Debug, Default)]
pub(super) struct ResizeState {
    /// What was last actuated for each running container (by id); a container not in it
    /// was created with its annotation's figures ([`spec::RESOURCES_ANNOTATION`]).
    actuated: HashMap<String, ContainerResources>,
    /// Containers (by id) to restart for a resize: not current for the plan.
    pub(super) restart: HashSet<String>,
    /// The pod cgroup's values as last written.
    pod_values: Option<PodCgroupValues>,
    /// Some container's allocated resources are not actuated yet.
    in_progress: bool,
    /// Why the last actuation failed (retried at the next sync).
    error: Option<String>,
    /// The allocation last found fully actuated: while the pod's is the same, nothing is
    /// listed or compared (containers started since were created with it).
    settled: Option<PodAllocation>,
}

impl ResizeState {
    /// What a running container runs with (its status's `resources`): as last actuated, else
    /// as created (its annotation's figures).
    pub(super) fn actual_of(&self, c: &k8s_cri::v1::Container) -> Option<ActualResources> {
        self.actuated
            .get(&c.id)
            .copied()
            .or_else(|| {
                c.annotations
                    .get(spec::RESOURCES_ANNOTATION)
                    .and_then(|a| serde_json::from_str(a).ok())
            })
            .map(|a| ActualResources::actuated(&a))
    }

    /// The pod cgroup's values as last written.
    pub(super) fn pod_values(&self) -> Option<&PodCgroupValues> {
        self.pod_values.as_ref()
    }

    /// The resize conditions the pod's status carries besides kubelet's usual ones.
    pub(super) fn conditions(&self, pending: Option<Condition>, generation: i64) -> Vec<Condition> {
        let mut out: Vec<Condition> = pending.into_iter().collect();
        if self.in_progress || self.error.is_some() {
            out.push(ResizeCondition::in_progress(self.error.as_deref(), generation).condition());
        }
        out
    }
}

impl<R: ContainerRuntime> PodWorker<R> {
    /// Actuates what is allocated to the pod's running containers: returns the pod cgroup
    /// values to write now (`target`, the allocated pod's, unless the resize could not be
    /// done, when they stay as they were).
    pub(super) async fn actuate_resize(
        &mut self,
        pod: &Pod,
        qos: spec::Qos,
        target: &PodCgroupValues,
    ) -> Result<PodCgroupValues, WorkerError> {
        let allocation = PodAllocation::of(pod);
        if self.resize.settled.as_ref() == Some(&allocation) {
            self.resize.pod_values = Some(target.clone());
            return Ok(target.clone());
        }
        let containers = self.pod_containers().await.map_err(self.cri())?;
        let live: HashSet<&str> = containers.iter().map(|c| c.id.as_str()).collect();
        let st = &mut self.resize;
        st.actuated.retain(|id, _| live.contains(id.as_str()));
        st.restart.retain(|id| live.contains(id.as_str()));
        st.in_progress = false;
        // kubelet's order: sidecars, then the regular containers; each with the pod-level
        // limits it inherits (`containerResourcesFromRequirements`: a pod-level resize resizes
        // a container that sets no limit of its own).
        let defs: Vec<Container> = resources::init_containers(pod)
            .iter()
            .filter(|c| resources::is_sidecar(c))
            .chain(resources::containers(pod))
            .map(|c| resources::with_pod_level_limits(pod, c))
            .collect();
        let mut plan = PodResizePlan::default();
        let mut running: HashMap<String, (String, ContainerResources, Container)> = HashMap::new();
        for def in &defs {
            let Some(c) = containers
                .iter()
                .filter(|c| c.state == RUNNING && name_of(c) == def.name)
                .max_by_key(|c| c.created_at)
            else {
                continue;
            };
            let Some(actuated) = st.actuated.get(&c.id).copied().or_else(|| {
                c.annotations
                    .get(spec::RESOURCES_ANNOTATION)
                    .and_then(|a| serde_json::from_str(a).ok())
            }) else {
                continue;
            };
            let r = compute_container_resize(def, true, Some(ActualResources::actuated(&actuated)));
            if matches!(r, ContainerResize::Restart { .. }) {
                st.restart.insert(c.id.clone());
            }
            plan.add(&def.name, r);
            running.insert(def.name.clone(), (c.id.clone(), actuated, def.clone()));
        }
        let current = st.pod_values.clone().unwrap_or_else(|| target.clone());
        if plan.is_empty() {
            st.error = None;
            st.settled = st.restart.is_empty().then_some(allocation);
            st.pod_values = Some(target.clone());
            return Ok(target.clone());
        }
        st.in_progress = true;
        st.settled = None;
        let usage = self.ctx.cgroups.memory_usage(&self.uid, qos).unwrap_or(0);
        let steps = match resize_steps(
            &self.uid,
            &plan,
            &PodCgroupResize::new(&current, target, usage),
        ) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(uid = %self.uid, error = %e, "pod resize not actuated; retrying");
                self.resize.error = Some(e.to_string());
                return Ok(current);
            }
        };
        let sandbox = containers
            .iter()
            .find(|c| c.state == RUNNING)
            .map(|c| c.pod_sandbox_id.clone())
            .unwrap_or_default();
        let mut values = current.clone();
        for step in steps {
            if let ResizeStep::Containers { memory, names } = step {
                for name in names {
                    let Some((id, actuated, def)) = running.get_mut(&name) else {
                        continue;
                    };
                    if let Err(e) = self.update_container(pod, id, actuated, def, memory).await {
                        tracing::warn!(uid = %self.uid, container = %name, error = %e, "pod resize: updating a container failed; retrying");
                        self.resize.error = Some(e.to_string());
                        self.resize.pod_values = Some(values.clone());
                        return Ok(values);
                    }
                }
                continue;
            }
            let Some((next, resource)) = pod_step(&step, &values, target) else {
                continue;
            };
            if !self
                .set_pod_values(pod, qos, &sandbox, (&values, &next), resource)
                .await?
            {
                return Ok(values);
            }
            values = next;
        }
        tracing::info!(uid = %self.uid, restarts = plan.restart.len(), "pod resize actuated");
        let st = &mut self.resize;
        st.error = None;
        st.in_progress = !plan.restart.is_empty();
        st.pod_values = Some(target.clone());
        Ok(target.clone())
    }

    /// Remembers the pod cgroup's values written by the sync itself.
    pub(super) fn pod_values_written(&mut self, values: &PodCgroupValues) {
        self.resize.pod_values = Some(values.clone());
    }

    /// kubelet 1.36's `setPodCgroupConfig` for one step, `(values, next)`: the runtime told
    /// first (a refusal rejects the step: false, the error kept for the status), then the pod
    /// cgroup written (the runtime told again of the values kept if that fails).
    async fn set_pod_values(
        &mut self,
        pod: &Pod,
        qos: spec::Qos,
        sandbox: &str,
        (values, next): (&PodCgroupValues, &PodCgroupValues),
        resource: &str,
    ) -> Result<bool, WorkerError> {
        if let Err(e) = self.tell_sandbox(pod, sandbox, next).await {
            let e = format!(
                "failed to notify runtime for UpdatePodSandboxResources (resource={resource}); resize rejected: {e}"
            );
            tracing::warn!(uid = %self.uid, error = %e, "pod resize: retrying");
            self.resize.error = Some(e);
            self.resize.pod_values = Some(values.clone());
            return Ok(false);
        }
        if let Err(e) = self.write_pod_values(qos, next) {
            if let Err(back) = self.tell_sandbox(pod, sandbox, values).await {
                tracing::warn!(uid = %self.uid, error = %back, "telling the runtime the pod's resources kept");
            }
            return Err(e);
        }
        Ok(true)
    }

    /// CRI `UpdatePodSandboxResources` with the pod cgroup's `values`; a runtime without the
    /// call (`Unimplemented`, as containerd before 2.0) is not an error.
    async fn tell_sandbox(
        &self,
        pod: &Pod,
        sandbox: &str,
        values: &PodCgroupValues,
    ) -> Result<(), crate::cri::CriError> {
        if sandbox.is_empty() {
            return Ok(());
        }
        let period = self.ctx.cgroups.options().cpu_period_us;
        let req = sandbox_resources::request(sandbox, pod, values, period);
        match self.ctx.runtime.update_pod_sandbox_resources(req).await {
            Err(crate::cri::CriError::Status {
                code: tonic::Code::Unimplemented,
                ..
            }) => {
                tracing::debug!(uid = %self.uid, "the runtime has no UpdatePodSandboxResources");
                Ok(())
            }
            other => other,
        }
    }

    fn write_pod_values(
        &self,
        qos: spec::Qos,
        values: &PodCgroupValues,
    ) -> Result<(), WorkerError> {
        self.ctx
            .cgroups
            .ensure(&self.uid, qos, values)
            .map(|_| ())
            .map_err(|source| WorkerError::Cgroup {
                uid: self.uid.clone(),
                source,
            })
    }

    /// CRI `UpdateContainerResources` for one resource of one container: its memory (or cpu)
    /// as allocated, the other resource as last actuated (`actuated`, updated on success).
    async fn update_container(
        &mut self,
        pod: &Pod,
        id: &str,
        actuated: &mut ContainerResources,
        def: &Container,
        memory: bool,
    ) -> Result<(), crate::cri::CriError> {
        let next = update_values(actuated, &ContainerResources::desired(def), memory);
        let opts = spec::ResourceOptions {
            cgroup: *self.ctx.cgroups.options(),
            cpuset: self.ctx.enforce.cpuset(&self.uid, &def.name),
            cpuset_mems: self.ctx.enforce.cpuset_mems(&self.uid, &def.name),
        };
        // The container is found in the pod by name (for the pod's defaults): the pod carries
        // the values to apply.
        let applied = next.applied_to(def);
        let mut with = pod.clone();
        if let Some(s) = with.spec.as_mut() {
            let all = s.init_containers.iter_mut().flatten();
            for c in all.chain(s.containers.iter_mut()) {
                if c.name == applied.name {
                    c.clone_from(&applied);
                }
            }
        }
        let res = spec::linux_resources(&with, &applied, self.ctx.node, &opts);
        self.ctx.runtime.update_container_resources(id, res).await?;
        tracing::info!(uid = %self.uid, container = %def.name, memory, "container resources updated in place");
        *actuated = next;
        self.resize.actuated.insert(id.to_owned(), next);
        Ok(())
    }
}

/// The pod cgroup's values after one of its steps (`None` for a containers' step), and the
/// resource it changes.
fn pod_step(
    step: &ResizeStep,
    values: &PodCgroupValues,
    target: &PodCgroupValues,
) -> Option<(PodCgroupValues, &'static str)> {
    let mut next = values.clone();
    let resource = match step {
        ResizeStep::PodMemoryLimit(_) => {
            next.memory_limit_bytes = target.memory_limit_bytes;
            next.memory_min_bytes = target.memory_min_bytes;
            next.memory_low_bytes = target.memory_low_bytes;
            "memory"
        }
        ResizeStep::PodCpuQuota(_) => {
            next.cpu_quota_micros = target.cpu_quota_micros;
            next.cpu_period_micros = target.cpu_period_micros;
            "cpu"
        }
        ResizeStep::PodCpuShares(_) => {
            next.cpu_shares = target.cpu_shares;
            next.cpu_weight = target.cpu_weight;
            "cpu"
        }
        ResizeStep::Containers { .. } => return None,
    };
    Some((next, resource))
}
