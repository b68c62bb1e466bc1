//! Resource fit (the scheduler's `noderesources` fit, kubelet's `InsufficientResourceError`):
//! a pod's requests against what the admitted pods left of the node's allocatable.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::Admitter;
use crate::policy::{
    eviction::manager::AdmitResult,
    resources::{self, ResourceList},
};

/// `IsExtendedResourceName`.
#[must_use]
pub fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("requests.")
}

fn is_scalar(name: &str) -> bool {
    is_extended_resource(name)
        || name.starts_with("hugepages-")
        || name.starts_with("attachable-volumes-")
}

/// Requests summed the scheduler's way: milli-cpu, bytes, scalar values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Requested {
    milli_cpu: i64,
    memory: i64,
    ephemeral_storage: i64,
    scalar: BTreeMap<String, i64>,
}

impl Requested {
    pub(super) fn of(reqs: &ResourceList) -> Self {
        let mut r = Self::default();
        for (name, q) in reqs {
            match name.as_str() {
                "cpu" => r.milli_cpu = q.milli_value(),
                "memory" => r.memory = q.value(),
                "ephemeral-storage" => r.ephemeral_storage = q.value(),
                n if is_scalar(n) => {
                    r.scalar.insert(n.to_owned(), q.value());
                }
                _ => {}
            }
        }
        r
    }

    pub(super) fn add(&mut self, o: &Self, sign: i64) {
        self.milli_cpu = self
            .milli_cpu
            .saturating_add(sign.saturating_mul(o.milli_cpu));
        self.memory = self.memory.saturating_add(sign.saturating_mul(o.memory));
        self.ephemeral_storage = self
            .ephemeral_storage
            .saturating_add(sign.saturating_mul(o.ephemeral_storage));
        for (k, v) in &o.scalar {
            let e = self.scalar.entry(k.clone()).or_insert(0);
            *e = e.saturating_add(sign.saturating_mul(*v));
        }
    }
}

/// A resource a pod does not fit for (kubelet's `InsufficientResourceError`): cpu in
/// milli-cpu, `pods` in pods, others in their unit (bytes, devices).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insufficient {
    pub resource: String,
    pub requested: i64,
    pub used: i64,
    pub capacity: i64,
}

impl Insufficient {
    /// `GetInsufficientAmount`: how much more the node would need.
    #[must_use]
    pub fn amount(&self) -> i64 {
        self.requested
            .saturating_sub(self.capacity.saturating_sub(self.used))
    }

    /// The rejection reason (`OutOfcpu`, `OutOfpods`, ...).
    #[must_use]
    pub fn reason(&self) -> String {
        format!("OutOf{}", self.resource)
    }

    /// kubelet's rejection message.
    #[must_use]
    pub fn message(&self) -> String {
        format!(
            "Node didn't have enough resource: {}, requested: {}, used: {}, capacity: {}",
            self.resource, self.requested, self.used, self.capacity
        )
    }
}

impl Admitter {
    /// Every resource `pod` does not fit for (kubelet's `InsufficientResourceError`s, in
    /// `fitsRequest`'s order: pods, cpu, memory, ephemeral-storage, extended resources).
    #[must_use]
    pub fn insufficient_resources(&self, pod: &Pod) -> Vec<Insufficient> {
        let mut out = Vec::new();
        let mut insufficient = |name: &str, requested: i64, used: i64, capacity: i64| {
            out.push(Insufficient {
                resource: name.to_owned(),
                requested,
                used,
                capacity,
            });
        };
        if self.pods + 1 > self.allowed_pods {
            insufficient("pods", 1, self.pods, self.allowed_pods);
        }
        let mut reqs = resources::pod_requests(pod);
        // removeMissingExtendedResources: extended resources the node does not have are ignored.
        reqs.retain(|name, _| {
            !is_extended_resource(name) || self.allocatable.scalar.contains_key(name)
        });
        let want = Requested::of(&reqs);
        let (a, u) = (&self.allocatable, &self.requested);
        if want.milli_cpu > 0 && want.milli_cpu > a.milli_cpu - u.milli_cpu {
            insufficient("cpu", want.milli_cpu, u.milli_cpu, a.milli_cpu);
        }
        if want.memory > 0 && want.memory > a.memory - u.memory {
            insufficient("memory", want.memory, u.memory, a.memory);
        }
        if want.ephemeral_storage > 0
            && want.ephemeral_storage > a.ephemeral_storage - u.ephemeral_storage
        {
            insufficient(
                "ephemeral-storage",
                want.ephemeral_storage,
                u.ephemeral_storage,
                a.ephemeral_storage,
            );
        }
        for (name, v) in &want.scalar {
            if *v == 0 {
                continue;
            }
            let cap = a.scalar.get(name).copied().unwrap_or(0);
            let used = u.scalar.get(name).copied().unwrap_or(0);
            if *v > cap - used {
                insufficient(name, *v, used, cap);
            }
        }
        out
    }

    /// The first insufficient resource, as kubelet's rejection reports it.
    pub(super) fn resource_fit(&self, pod: &Pod) -> Option<AdmitResult> {
        self.insufficient_resources(pod)
            .first()
            .map(|i| AdmitResult::reject(i.reason(), i.message()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{
        admission::{SecurityPolicy, tests::node},
        eviction::NodeCondition,
        resources::test_pods::{container, pod},
    };

    /// kubelet's order: the eviction manager's and the sysctls' handlers run before the
    /// resource managers allocate; the resource fit after them.
    #[test]
    fn the_handlers_before_the_resource_managers_are_eviction_and_sysctls() {
        let a = Admitter::new(node(), SecurityPolicy::default(), []);
        let best_effort = pod("be", vec![container("a", "", "")]);
        let under_pressure = [NodeCondition::MemoryPressure];
        let r = a.admit_before_resources(&best_effort, &under_pressure);
        assert_eq!((r.admitted, r.reason.as_str()), (false, "Evicted"));
        let too_big = pod("big", vec![container("a", "cpu=30", "")]);
        assert!(
            a.admit_before_resources(&too_big, &[]).admitted,
            "the resource fit comes after the allocation"
        );
        assert_eq!(a.admit(&too_big, &[]).reason, "OutOfcpu");
    }

    #[test]
    fn resource_fit_messages() {
        let mut a = Admitter::new(node(), SecurityPolicy::default(), []);
        let p1 = pod("p1", vec![container("a", "cpu=1500m,memory=1Gi", "")]);
        assert!(a.admit(&p1, &[]).admitted);
        a.add(&p1);
        let big = pod("big", vec![container("a", "cpu=3", "")]);
        let r = a.admit(&big, &[]);
        assert_eq!(r.reason, "OutOfcpu");
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 3000, used: 1500, capacity: 4000"
        );
        let mem = pod("mem", vec![container("a", "memory=8Gi", "")]);
        assert_eq!(a.admit(&mem, &[]).reason, "OutOfmemory");
        let gpu = pod("gpu", vec![container("a", "example.com/gpu=2", "")]);
        assert_eq!(a.admit(&gpu, &[]).reason, "OutOfexample.com/gpu");
        // Extended resources the node lacks are ignored.
        let other = pod("other", vec![container("a", "example.org/fpga=2", "")]);
        assert!(a.admit(&other, &[]).admitted);
        a.add(&pod("p2", vec![container("a", "", "")]));
        a.add(&pod("p3", vec![container("a", "", "")]));
        let r = a.admit(&pod("p4", vec![container("a", "", "")]), &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "OutOfpods",
                "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
            )
        );
        // Every insufficient resource, with the amount missing; the rest of admission
        // without them.
        let both = pod("both", vec![container("a", "cpu=3,memory=8Gi", "")]);
        let all = a.insufficient_resources(&both);
        let amounts: Vec<(&str, i64)> = all
            .iter()
            .map(|i| (i.resource.as_str(), i.amount()))
            .collect();
        assert_eq!(amounts, [("pods", 1), ("cpu", 500), ("memory", 1 << 30)]);
        assert_eq!(a.admit(&both, &[]).reason, "OutOfpods");
        assert!(a.admit_except_resources(&both, &[]).admitted);
        a.remove(&p1);
        assert!(a.admit(&big, &[]).admitted);
        // Eviction admission comes first.
        assert_eq!(
            a.admit(
                &pod("be", vec![container("a", "", "")]),
                &[NodeCondition::MemoryPressure]
            )
            .reason,
            "Evicted"
        );
    }
}
