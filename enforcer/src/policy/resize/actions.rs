//! Actuating an allocated resize: which running containers are updated in place and which
//! restarted (kubelet's `computePodResizeAction`), and the order of the cgroup writes
//! (`doPodResizeAction`): per resource, the pod cgroup grows before its containers and
//! shrinks after them, limits grow before requests and requests shrink before limits, and a
//! pod memory limit is never set at or below the pod's memory usage.

use k8s_openapi::api::core::v1::Container;
use serde::{Deserialize, Serialize};

use crate::policy::resources::{
    self,
    cgroup::{MIN_SHARES, PodCgroupValues},
};

/// `cm.MinMilliCPULimit`: the smallest effective cpu limit (1000 us of a 100000 us period).
pub const MIN_MILLI_CPU_LIMIT: i64 = 10;

/// A container's cpu and memory as kubelet compares them (`containerResources`): millicores
/// and bytes, 0 when unset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerResources {
    pub memory_limit: i64,
    pub memory_request: i64,
    pub cpu_limit: i64,
    pub cpu_request: i64,
}

impl ContainerResources {
    /// A container's resources with these cpu and memory values in place of its own
    /// (what CRI `UpdateContainerResources` is computed from), requests and limits kept where
    /// the container has them.
    #[must_use]
    pub fn applied_to(&self, container: &Container) -> Container {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let mut c = container.clone();
        let r = c.resources.get_or_insert_with(Default::default);
        let set =
            |l: &mut Option<std::collections::BTreeMap<String, Quantity>>, key: &str, v: String| {
                if let Some(m) = l.as_mut()
                    && m.contains_key(key)
                {
                    m.insert(key.to_owned(), Quantity(v));
                }
            };
        set(&mut r.requests, "cpu", format!("{}m", self.cpu_request));
        set(&mut r.requests, "memory", self.memory_request.to_string());
        set(&mut r.limits, "cpu", format!("{}m", self.cpu_limit));
        set(&mut r.limits, "memory", self.memory_limit.to_string());
        c
    }

    /// What `container`'s spec (its allocated resources) asks for.
    #[must_use]
    pub fn desired(container: &Container) -> Self {
        let req = resources::container_requests(container);
        let lim = resources::container_limits(container);
        let v = |l: &resources::ResourceList, k: &str| l.get(k).map_or(0, |q| q.value());
        let m = |l: &resources::ResourceList, k: &str| l.get(k).map_or(0, |q| q.milli_value());
        Self {
            memory_limit: v(&lim, "memory"),
            memory_request: v(&req, "memory"),
            cpu_limit: m(&lim, "cpu"),
            cpu_request: m(&req, "cpu"),
        }
    }
}

/// What the runtime reports a running container has (CRI `ContainerStatus.resources`, read
/// back as kubelet's `ContainerResources`): `None` fields were not reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ActualResources {
    pub memory_limit: Option<i64>,
    pub cpu_limit: Option<i64>,
    pub cpu_request: Option<i64>,
}

/// `sharesToMilliCPU`: the millicores cpu shares stand for (0 below the minimum shares).
#[must_use]
pub fn shares_to_milli_cpu(shares: i64) -> i64 {
    let min = i64::try_from(MIN_SHARES).unwrap_or(2);
    if shares < min {
        return 0;
    }
    // ceil(shares * 1000 / 1024)
    shares.saturating_mul(1000).saturating_add(1023) / 1024
}

/// `quotaToMilliCPU`: the millicores a cfs quota stands for (0 for no quota).
#[must_use]
pub fn quota_to_milli_cpu(quota: i64, period: i64) -> i64 {
    if quota == -1 || period <= 0 {
        return 0;
    }
    quota.saturating_mul(1000) / period
}

impl ActualResources {
    /// What was last actuated for a container (kubelet 1.33+ compares the allocation with its
    /// actuated resources, not with what the runtime reports): each figure only when positive.
    #[must_use]
    pub fn actuated(r: &ContainerResources) -> Self {
        let positive = |v: i64| (v > 0).then_some(v);
        Self {
            memory_limit: positive(r.memory_limit),
            cpu_limit: positive(r.cpu_limit),
            cpu_request: positive(r.cpu_request),
        }
    }

    /// What CRI `ContainerStatus.resources.linux` says (kubelet's `getContainerResources`):
    /// a cpu limit from quota and period, a cpu request from shares, a memory limit; each
    /// only when positive.
    #[must_use]
    pub fn from_linux(cpu_period: i64, cpu_quota: i64, cpu_shares: i64, memory_limit: i64) -> Self {
        let positive = |v: i64| (v > 0).then_some(v);
        Self {
            cpu_limit: positive(cpu_period)
                .and_then(|p| positive(quota_to_milli_cpu(cpu_quota, p))),
            cpu_request: positive(cpu_shares).and_then(|s| positive(shares_to_milli_cpu(s))),
            memory_limit: positive(memory_limit),
        }
    }
}

/// Which way a value moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Direction {
    Increase,
    Decrease,
}

/// A container to update in place for one resource (`containerToUpdateInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerUpdate {
    pub name: String,
    pub desired: ContainerResources,
    pub current: ContainerResources,
    pub direction: Direction,
}

/// `computePodResizeAction` for one running container.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ContainerResize {
    /// Nothing to do (not running, resources unknown, or already as allocated).
    Keep,
    /// A changed resource's `resizePolicy` is `RestartContainer`: kill with this message and
    /// start again; the pod's cgroup is updated as for a resize (`UpdatePodResources`).
    Restart { message: String },
    /// Update in place through CRI `UpdateContainerResources`.
    Update {
        memory: Option<ContainerUpdate>,
        cpu: Option<ContainerUpdate>,
    },
}

fn restart_policy(container: &Container, resource: &str) -> bool {
    // Without a policy for the resource the implicit default is NotRequired.
    container
        .resize_policy
        .iter()
        .flatten()
        .find(|p| p.resource_name == resource)
        .is_some_and(|p| p.restart_policy == "RestartContainer")
}

/// `computePodResizeAction`: compares the container's allocated resources with what the
/// runtime says it runs with. `running` is false for a container not running; `actual` is
/// `None` when the runtime reported no resources.
pub fn compute_container_resize(
    container: &Container,
    running: bool,
    actual: Option<ActualResources>,
) -> ContainerResize {
    if !running {
        return ContainerResize::Keep;
    }
    let Some(actual) = actual else {
        return ContainerResize::Keep;
    };
    let mut desired = ContainerResources::desired(container);
    let current = ContainerResources {
        // The runtime does not report the memory request: take the desired one.
        memory_request: desired.memory_request,
        memory_limit: actual.memory_limit.unwrap_or(0),
        cpu_limit: actual.cpu_limit.unwrap_or(0),
        cpu_request: actual.cpu_request.unwrap_or(0),
    };
    let min_shares = i64::try_from(MIN_SHARES).unwrap_or(2);
    if desired.cpu_request <= min_shares && current.cpu_request <= min_shares {
        desired.cpu_request = current.cpu_request;
    }
    if desired.cpu_limit <= MIN_MILLI_CPU_LIMIT && current.cpu_limit <= MIN_MILLI_CPU_LIMIT {
        desired.cpu_limit = current.cpu_limit;
    }
    if desired == current {
        return ContainerResize::Keep;
    }
    let decide = |resource: &str, want: i64, have: i64| -> (bool, bool) {
        if want == have {
            (false, false)
        } else {
            (true, restart_policy(container, resource))
        }
    };
    let (mem_lim, restart_mem_lim) = decide("memory", desired.memory_limit, current.memory_limit);
    let (cpu_lim, restart_cpu_lim) = decide("cpu", desired.cpu_limit, current.cpu_limit);
    let (cpu_req, restart_cpu_req) = decide("cpu", desired.cpu_request, current.cpu_request);
    if restart_cpu_lim || restart_cpu_req || restart_mem_lim {
        return ContainerResize::Restart {
            message: format!("Container {} resize requires restart", container.name),
        };
    }
    let update = |want: i64, have: i64| ContainerUpdate {
        name: container.name.clone(),
        desired,
        current,
        direction: if want > have {
            Direction::Increase
        } else {
            Direction::Decrease
        },
    };
    let memory = mem_lim.then(|| update(desired.memory_limit, current.memory_limit));
    let cpu = if cpu_lim {
        Some(update(desired.cpu_limit, current.cpu_limit))
    } else if cpu_req {
        Some(update(desired.cpu_request, current.cpu_request))
    } else {
        None
    };
    if memory.is_none() && cpu.is_none() {
        return ContainerResize::Keep;
    }
    ContainerResize::Update { memory, cpu }
}

/// The containers to update for one resource, decreases before increases (kubelet prepends
/// a decrease and appends an increase as it walks the containers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UpdateQueue(pub Vec<ContainerUpdate>);

impl UpdateQueue {
    /// Adds `u` where kubelet's `markContainerForUpdate` puts it.
    pub fn push(&mut self, u: ContainerUpdate) {
        match u.direction {
            Direction::Increase => self.0.push(u),
            Direction::Decrease => self.0.insert(0, u),
        }
    }
}

/// A pod's resize plan, from [`compute_container_resize`] over its running containers in
/// kubelet's order (sidecars, then regular containers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PodResizePlan {
    pub memory: UpdateQueue,
    pub cpu: UpdateQueue,
    /// Containers to restart, with the kill message.
    pub restart: Vec<(String, String)>,
    /// A restart for a resize also resizes the pod cgroup.
    pub update_pod_resources: bool,
}

impl PodResizePlan {
    /// Folds one container's decision in.
    pub fn add(&mut self, name: &str, r: ContainerResize) {
        match r {
            ContainerResize::Keep => {}
            ContainerResize::Restart { message } => {
                self.restart.push((name.to_owned(), message));
                self.update_pod_resources = true;
            }
            ContainerResize::Update { memory, cpu } => {
                if let Some(m) = memory {
                    self.memory.push(m);
                }
                if let Some(c) = cpu {
                    self.cpu.push(c);
                }
            }
        }
    }

    /// Nothing to actuate.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.memory.0.is_empty() && self.cpu.0.is_empty() && !self.update_pod_resources
    }
}

/// One write of [`resize_steps`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ResizeStep {
    /// The pod cgroup's memory limit (bytes).
    PodMemoryLimit(i64),
    /// The pod cgroup's cfs quota (microseconds per period; -1 for none).
    PodCpuQuota(i64),
    /// The pod cgroup's cpu shares.
    PodCpuShares(u64),
    /// CRI `UpdateContainerResources` for these containers, for memory (`true`) or cpu.
    Containers { memory: bool, names: Vec<String> },
}

/// The pod cgroup's current and new values (`GetPodCgroupConfig` and `ResourceConfigForPod`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PodCgroupResize {
    pub current_memory_limit: i64,
    /// `None` when the pod has no memory limit: it stays as it is.
    pub new_memory_limit: Option<i64>,
    pub current_cpu_quota: i64,
    /// `None` when the pod has no cpu limit: it stays as it is.
    pub new_cpu_quota: Option<i64>,
    pub current_cpu_shares: u64,
    pub new_cpu_shares: u64,
    /// The pod cgroup's memory usage now (bytes).
    pub memory_usage: u64,
}

impl PodCgroupResize {
    /// From the pod cgroup's values as read now (`current`: no memory limit and no quota
    /// read as `None`) and as computed for the allocated pod (`target`,
    /// [`crate::policy::resources::cgroup::pod_cgroup_values`]), and the pod's memory usage.
    /// An absent current limit counts as unlimited (`i64::MAX`, no quota as -1), as kubelet's
    /// `GetPodCgroupConfig` reads `max`.
    #[must_use]
    pub fn new(current: &PodCgroupValues, target: &PodCgroupValues, memory_usage: u64) -> Self {
        Self {
            current_memory_limit: current.memory_limit_bytes.unwrap_or(i64::MAX),
            new_memory_limit: target.memory_limit_bytes,
            current_cpu_quota: current.cpu_quota_micros.unwrap_or(-1),
            new_cpu_quota: target.cpu_quota_micros,
            current_cpu_shares: current.cpu_shares,
            new_cpu_shares: target.cpu_shares,
            memory_usage,
        }
    }
}

/// Why [`resize_steps`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResizeError {
    /// The new pod memory limit is not above the pod's usage (kubelet aborts the resize and
    /// retries it on a later sync).
    #[error("aborting attempt to set pod memory limit less than current memory usage for pod {0}")]
    MemoryBelowUsage(String),
}

/// `doPodResizeAction`'s writes in order, memory first, then cpu; per resource: a growing
/// pod limit, a growing pod request, the containers, a shrinking request, a shrinking limit.
/// Memory requests are not written to cgroups. Errors (the memory guard) leave everything
/// unwritten: the caller sets `PodResizeInProgress` with reason `Error` and retries.
pub fn resize_steps(
    pod: &str,
    plan: &PodResizePlan,
    cg: &PodCgroupResize,
) -> Result<Vec<ResizeStep>, ResizeError> {
    let mut steps = Vec::new();
    if !plan.memory.0.is_empty() || plan.update_pod_resources {
        let new_limit = match cg.new_memory_limit {
            Some(limit) => {
                if i64::try_from(cg.memory_usage).unwrap_or(i64::MAX) >= limit {
                    return Err(ResizeError::MemoryBelowUsage(pod.to_owned()));
                }
                limit
            }
            None => cg.current_memory_limit,
        };
        let grow = new_limit > cg.current_memory_limit;
        if grow {
            steps.push(ResizeStep::PodMemoryLimit(new_limit));
        }
        if !plan.memory.0.is_empty() {
            steps.push(ResizeStep::Containers {
                memory: true,
                names: plan.memory.0.iter().map(|u| u.name.clone()).collect(),
            });
        }
        if new_limit < cg.current_memory_limit {
            steps.push(ResizeStep::PodMemoryLimit(new_limit));
        }
    }
    if !plan.cpu.0.is_empty() || plan.update_pod_resources {
        let new_quota = cg.new_cpu_quota.unwrap_or(cg.current_cpu_quota);
        if new_quota > cg.current_cpu_quota {
            steps.push(ResizeStep::PodCpuQuota(new_quota));
        }
        if cg.new_cpu_shares > cg.current_cpu_shares {
            steps.push(ResizeStep::PodCpuShares(cg.new_cpu_shares));
        }
        if !plan.cpu.0.is_empty() {
            steps.push(ResizeStep::Containers {
                memory: false,
                names: plan.cpu.0.iter().map(|u| u.name.clone()).collect(),
            });
        }
        if cg.new_cpu_shares < cg.current_cpu_shares {
            steps.push(ResizeStep::PodCpuShares(cg.new_cpu_shares));
        }
        if new_quota < cg.current_cpu_quota {
            steps.push(ResizeStep::PodCpuQuota(new_quota));
        }
    }
    Ok(steps)
}

/// The resources CRI `UpdateContainerResources` gets for one update (kubelet's
/// `updatePodContainerResources`): the updated resource (memory, or cpu) as `desired`, the
/// other as last actuated (`actuated`: a cpu update after a memory update keeps the new
/// memory).
#[must_use]
pub fn update_values(
    actuated: &ContainerResources,
    desired: &ContainerResources,
    memory: bool,
) -> ContainerResources {
    let mut next = *actuated;
    if memory {
        next.memory_limit = desired.memory_limit;
        next.memory_request = desired.memory_request;
    } else {
        next.cpu_limit = desired.cpu_limit;
        next.cpu_request = desired.cpu_request;
    }
    next
}

/// `isPodResizeInProgress` for one running resizable container: its allocated cpu and memory
/// differ from what was last actuated.
#[must_use]
pub fn container_resize_in_progress(allocated: &Container, actuated: &ContainerResources) -> bool {
    let a = ContainerResources::desired(allocated);
    a.cpu_request != actuated.cpu_request
        || a.cpu_limit != actuated.cpu_limit
        || a.memory_request != actuated.memory_request
        || a.memory_limit != actuated.memory_limit
}

#[cfg(test)]
mod tests;
