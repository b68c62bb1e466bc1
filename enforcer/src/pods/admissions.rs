//! The runtime loop's admission: kubelet's pod admission (the admitter's totals and the pods
//! counted in them) with its critical-pod preemption.

use std::{collections::HashMap, sync::Arc};

use k8s_openapi::api::core::v1::Pod;

use crate::{
    pods::NodeLink,
    policy::{
        admission::{self, Admitter, SecurityPolicy},
        eviction::manager::AdmitResult,
        preemption,
    },
};

/// What pod admission needs to know about the node.
#[derive(Clone, Debug)]
pub struct Admission {
    pub node: admission::Node,
    pub security: SecurityPolicy,
}

/// The pods a critical pod's admission preempts (uid, pod) and the first resource it lacked.
#[derive(Default)]
pub(super) struct Preemption {
    pub(super) victims: Vec<(String, Arc<Pod>)>,
    pub(super) signal: String,
}

/// Admission state of the runtime loop: the admitter's totals and the pods counted in them.
pub(super) struct Admissions {
    pub(super) admitter: Option<Admitter>,
    pub(super) admitted: HashMap<String, Arc<Pod>>,
    /// Admitted pods being killed because their source removed them: never preempted
    /// (kubelet's active pods leave out those whose termination was requested).
    pub(super) terminating: std::collections::HashSet<String>,
}

impl Admissions {
    /// `from_api`: the pod came from the API server and the node reads API objects
    /// (configMap, secret and token volumes are admitted).
    /// The admit handlers before the resource managers' allocation (eviction, sysctls); a
    /// node without an admitter admits.
    pub(super) fn admit_before_resources(&self, pod: &Pod, link: &NodeLink) -> AdmitResult {
        self.admitter.as_ref().map_or_else(AdmitResult::admit, |a| {
            a.admit_before_resources(pod, &link.conditions())
        })
    }

    pub(super) fn try_admit(
        &mut self,
        uid: &str,
        pod: &Arc<Pod>,
        link: &NodeLink,
        from_api: bool,
    ) -> Result<Preemption, AdmitResult> {
        let mut preemption = Preemption::default();
        if let Some(a) = &self.admitter {
            let r = a.admit(pod, &link.conditions());
            if !r.admitted {
                preemption = self.preemption(a, uid, pod, r, link)?;
            }
        }
        // Never run a pod without a volume it asked for.
        let r = crate::policy::volumes::admit_with(pod, from_api);
        if !r.admitted {
            return Err(r);
        }
        // The victims no longer count (kubelet's active pods leave out those being killed).
        for (victim, _) in &preemption.victims {
            self.release(victim);
        }
        if let Some(a) = &mut self.admitter {
            a.add(pod);
        }
        self.admitted.insert(uid.to_owned(), pod.clone());
        Ok(preemption)
    }

    /// kubelet's critical-pod admission preemption (`policy::preemption`) for `pod`, which
    /// the admitter rejected with `rejected`: the active pods to evict so that it fits, or
    /// the rejection.
    fn preemption(
        &self,
        admitter: &Admitter,
        uid: &str,
        pod: &Pod,
        rejected: AdmitResult,
        link: &NodeLink,
    ) -> Result<Preemption, AdmitResult> {
        let active = link.active();
        let candidates: Vec<(&String, &Arc<Pod>)> = active
            .iter()
            .filter(|(u, _)| {
                u.as_str() != uid
                    && self.admitted.contains_key(*u)
                    && !self.terminating.contains(*u)
            })
            .map(|(u, e)| (u, &e.pod))
            .collect();
        let pods: Vec<&Pod> = candidates.iter().map(|(_, p)| &***p).collect();
        match preemption::handle_admission_failure(
            admitter,
            pod,
            &link.conditions(),
            rejected,
            &pods,
        ) {
            preemption::Decision::Reject(r) => Err(r),
            preemption::Decision::Preempt { victims, signal } => Ok(Preemption {
                victims: victims
                    .into_iter()
                    .filter_map(|i| candidates.get(i))
                    .map(|(u, p)| ((*u).clone(), (*p).clone()))
                    .collect(),
                signal,
            }),
        }
    }

    /// An admitted pod's resize was allocated: the admission totals count `pod` in its place.
    pub(super) fn resize(&mut self, uid: &str, pod: Arc<Pod>) {
        if let Some(old) = self.admitted.insert(uid.to_owned(), pod.clone())
            && let Some(a) = &mut self.admitter
        {
            a.remove(&old);
            a.add(&pod);
        }
    }

    pub(super) fn release(&mut self, uid: &str) {
        self.terminating.remove(uid);
        if let Some(pod) = self.admitted.remove(uid)
            && let Some(a) = &mut self.admitter
        {
            a.remove(&pod);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{pods::ActiveEntry, quantity::Quantity};

    /// A pod its source removed (being killed) is no candidate for preemption: with it the
    /// only pod that would free enough, the critical pod is rejected; once it is released,
    /// nothing is in the way.
    #[test]
    fn pods_being_deleted_are_not_preempted() {
        use crate::policy::resources::test_pods::{container, pod};
        let allocatable = [("cpu", "1"), ("memory", "1Gi"), ("pods", "110")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Quantity::parse(v).expect("quantity")))
            .collect();
        let node = admission::Node {
            name: "n1".to_owned(),
            allocatable,
            ..admission::Node::default()
        };
        let low = Arc::new(pod("low", vec![container("c", "cpu=600m", "")]));
        let mut critical = pod("crit", vec![container("c", "cpu=600m", "")]);
        if let Some(s) = critical.spec.as_mut() {
            s.priority = Some(crate::policy::resources::SYSTEM_CRITICAL_PRIORITY);
        }
        let critical = Arc::new(critical);
        let link = NodeLink::default();
        link.set_active(
            "uid-low",
            ActiveEntry::new(low.clone(), "/kubepods/burstable/poduid-low".to_owned()),
        );
        let mut a = Admissions {
            admitter: Some(Admitter::new(node, SecurityPolicy::default(), [&*low])),
            admitted: HashMap::from([("uid-low".to_owned(), low)]),
            terminating: std::collections::HashSet::from(["uid-low".to_owned()]),
        };
        let Err(r) = a.try_admit("uid-crit", &critical, &link, false) else {
            panic!("a pod being deleted was preempted");
        };
        assert_eq!(r.reason, preemption::UNEXPECTED_ADMISSION_ERROR);
        a.terminating.clear();
        let p = a
            .try_admit("uid-crit", &critical, &link, false)
            .expect("admitted");
        let victims: Vec<&str> = p.victims.iter().map(|(u, _)| u.as_str()).collect();
        assert_eq!((victims, p.signal.as_str()), (vec!["uid-low"], "cpu"));
        assert!(!a.admitted.contains_key("uid-low") && a.admitted.contains_key("uid-crit"));
    }
}
