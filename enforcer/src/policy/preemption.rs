//! kubelet's critical-pod admission preemption (`pkg/kubelet/preemption`,
//! `CriticalPodAdmissionHandler`): a critical pod that fails admission only because the node
//! lacks resources is admitted after evicting a set of pods that frees them.
//!
//! The set minimises impact in QoS order (Guaranteed pods spared before Burstable, Burstable
//! before BestEffort); within a class, fewest pods first, then the smallest requests
//! (`getPodsToPreempt`, `getPodsToPreemptByDistance`). Only pods the critical pod may preempt
//! are candidates (`Preemptable`): non-critical pods, or pods of a lower priority.

use k8s_openapi::api::core::v1::Pod;

use super::{
    admission::{Admitter, Insufficient},
    eviction::{NodeCondition, manager::AdmitResult},
    qos::{self, QosClass},
    resources,
};

/// The status message of a preempted pod (kubelet's `message`).
pub const MESSAGE: &str = "Preempted in order to admit critical pod";
/// The status reason and event reason of a preempted pod (`events.PreemptContainer`).
pub const REASON: &str = "Preempting";
/// The message of a preempted pod's `DisruptionTarget` condition.
pub const CONDITION_MESSAGE: &str = "Pod was preempted by Kubelet to accommodate a critical pod.";
/// The rejection reason when no set of pods frees enough (`UnexpectedAdmissionError`).
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// Why no pods can be preempted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreemptionError {
    /// Even every candidate together does not free the requirements (what is left missing,
    /// in kubelet's `toString` form).
    #[error("no set of running pods found to reclaim resources: {0}")]
    NoVictims(String),
}

/// One resource to free (kubelet's `admissionRequirement`): cpu in milli-cpu, `pods` in pods,
/// others in their unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub resource: String,
    pub quantity: i64,
}

/// The resources to free (kubelet's `admissionRequirementList`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements(pub Vec<Requirement>);

/// `GetResourceRequest`: a pod's request of one resource as preemption counts it (`pods`: 1;
/// cpu in milli-cpu; others in their unit).
#[must_use]
pub fn request(pod: &Pod, resource: &str) -> i64 {
    if resource == "pods" {
        return 1;
    }
    let q = resources::pod_request(pod, resource);
    if resource == "cpu" {
        q.milli_value()
    } else {
        q.value()
    }
}

impl Requirements {
    /// The requirements of the resources a pod does not fit for (their insufficient amounts).
    #[must_use]
    pub fn of(insufficient: &[Insufficient]) -> Self {
        Self(
            insufficient
                .iter()
                .map(|i| Requirement {
                    resource: i.resource.clone(),
                    quantity: i.amount(),
                })
                .collect(),
        )
    }

    /// Whether nothing is left to free.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `distance`: how far `pod`'s requests are from the requirements, each requirement
    /// weighted equally whatever its magnitude (the squared fraction left unmet, summed).
    #[must_use]
    pub fn distance(&self, pod: &Pod) -> f64 {
        self.0
            .iter()
            .map(|r| {
                let remaining = r.quantity.saturating_sub(request(pod, &r.resource));
                if remaining > 0 {
                    #[expect(clippy::cast_precision_loss, reason = "a ratio, as kubelet's float64")]
                    let f = remaining as f64 / r.quantity as f64;
                    f * f
                } else {
                    0.0
                }
            })
            .sum()
    }

    /// `subtract`: what is left to free once `pods` are preempted.
    #[must_use]
    pub fn subtract(&self, pods: &[&Pod]) -> Self {
        Self(
            self.0
                .iter()
                .filter_map(|r| {
                    let mut left = r.quantity;
                    for p in pods {
                        left = left.saturating_sub(request(p, &r.resource));
                        if left <= 0 {
                            break;
                        }
                    }
                    (left > 0).then(|| Requirement {
                        resource: r.resource.clone(),
                        quantity: left,
                    })
                })
                .collect(),
        )
    }
}

impl std::fmt::Display for Requirements {
    /// kubelet's `toString`: `[(res: cpu, q: 100), ]`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[")?;
        for r in &self.0 {
            write!(f, "(res: {}, q: {}), ", r.resource, r.quantity)?;
        }
        f.write_str("]")
    }
}

/// `Preemptable`: a critical pod may preempt any non-critical pod; otherwise only a pod of a
/// lower priority (both priorities set).
#[must_use]
pub fn preemptable(preemptor: &Pod, preemptee: &Pod) -> bool {
    if resources::is_critical(preemptor) && !resources::is_critical(preemptee) {
        return true;
    }
    let prio = |p: &Pod| p.spec.as_ref().and_then(|s| s.priority);
    match (prio(preemptor), prio(preemptee)) {
        (Some(a), Some(b)) => a > b,
        _ => false,
    }
}

/// `smallerResourceRequest`: whether `a` requests less than `b` (memory first, then cpu;
/// equal counts as smaller).
fn smaller_request(a: &Pod, b: &Pod) -> bool {
    for r in ["memory", "cpu"] {
        let (x, y) = (request(a, r), request(b, r));
        if x != y {
            return x < y;
        }
    }
    true
}

/// `getPodsToPreemptByDistance`: repeatedly the pod closest to what is left (the smaller
/// request among equals), until nothing is left. Returns indices into `pods`.
fn by_distance(
    pods: &[&Pod],
    mut candidates: Vec<usize>,
    mut requirements: Requirements,
) -> Result<Vec<usize>, PreemptionError> {
    let mut out = Vec::new();
    while !requirements.is_empty() {
        if candidates.is_empty() {
            return Err(PreemptionError::NoVictims(requirements.to_string()));
        }
        // Every distance is below len + 1 (at most 1 per requirement).
        #[expect(clippy::cast_precision_loss, reason = "a handful of requirements")]
        let mut best_distance = (requirements.0.len() + 1) as f64;
        let mut best = 0;
        for (i, &c) in candidates.iter().enumerate() {
            let d = requirements.distance(pods[c]);
            if d < best_distance
                || (d == best_distance && smaller_request(pods[c], pods[candidates[best]]))
            {
                best_distance = d;
                best = i;
            }
        }
        let chosen = candidates.swap_remove(best);
        requirements = requirements.subtract(&[pods[chosen]]);
        out.push(chosen);
    }
    Ok(out)
}

/// `getPodsToPreempt`: the pods of `pods` to evict so that `requirements` are freed for
/// `preemptor`, as indices into `pods` (BestEffort first, then Burstable, then Guaranteed, as
/// kubelet lists them).
pub fn pods_to_preempt(
    preemptor: &Pod,
    pods: &[&Pod],
    requirements: &Requirements,
) -> Result<Vec<usize>, PreemptionError> {
    let (mut best_effort, mut burstable, mut guaranteed) = (Vec::new(), Vec::new(), Vec::new());
    for (i, p) in pods.iter().enumerate() {
        if preemptable(preemptor, p) {
            match qos::pod_qos(p) {
                QosClass::BestEffort => best_effort.push(i),
                QosClass::Burstable => burstable.push(i),
                QosClass::Guaranteed => guaranteed.push(i),
            }
        }
    }
    let of = |idx: &[usize]| idx.iter().map(|&i| pods[i]).collect::<Vec<_>>();
    let all: Vec<usize> = best_effort
        .iter()
        .chain(&burstable)
        .chain(&guaranteed)
        .copied()
        .collect();
    let unable = requirements.subtract(&of(&all));
    if !unable.is_empty() {
        return Err(PreemptionError::NoVictims(unable.to_string()));
    }
    // The Guaranteed pods needed if every BestEffort and Burstable pod went.
    let lower: Vec<usize> = best_effort.iter().chain(&burstable).copied().collect();
    let guaranteed_out = by_distance(pods, guaranteed, requirements.subtract(&of(&lower)))?;
    // The Burstable pods needed if every BestEffort pod and those Guaranteed ones went.
    let spared: Vec<usize> = best_effort.iter().chain(&guaranteed_out).copied().collect();
    let burstable_out = by_distance(pods, burstable, requirements.subtract(&of(&spared)))?;
    // The BestEffort pods needed besides those Burstable and Guaranteed ones.
    let chosen: Vec<usize> = burstable_out
        .iter()
        .chain(&guaranteed_out)
        .copied()
        .collect();
    let best_effort_out = by_distance(pods, best_effort, requirements.subtract(&of(&chosen)))?;
    Ok(best_effort_out
        .into_iter()
        .chain(burstable_out)
        .chain(guaranteed_out)
        .collect())
}

/// What admission does with a pod the admitter rejected (`HandleAdmissionFailure`).
#[must_use]
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Rejected with this result (the admitter's, another check's, or kubelet's
    /// `UnexpectedAdmissionError` when no set of pods frees enough).
    Reject(AdmitResult),
    /// Admitted once these candidates (indices) are evicted; `signal` is the first
    /// insufficient resource (`kubelet_preemptions{preemption_signal}`).
    Preempt { victims: Vec<usize>, signal: String },
}

/// kubelet's `HandleAdmissionFailure` for `pod`, which `admitter` rejected with `rejected`
/// under `conditions`: a non-critical pod, or one that fails anything but resources, stays
/// rejected; a critical pod that lacks only resources preempts pods among `candidates` (the
/// active pods), or is rejected with `UnexpectedAdmissionError` when they cannot free
/// enough.
pub fn handle_admission_failure(
    admitter: &Admitter,
    pod: &Pod,
    conditions: &[NodeCondition],
    rejected: AdmitResult,
    candidates: &[&Pod],
) -> Decision {
    if !resources::is_critical(pod) {
        return Decision::Reject(rejected);
    }
    let other = admitter.admit_except_resources(pod, conditions);
    if !other.admitted {
        return Decision::Reject(other);
    }
    let insufficient = admitter.insufficient_resources(pod);
    let Some(signal) = insufficient.first().map(|i| i.resource.clone()) else {
        return Decision::Reject(rejected);
    };
    match pods_to_preempt(pod, candidates, &Requirements::of(&insufficient)) {
        Ok(victims) => Decision::Preempt { victims, signal },
        Err(e) => Decision::Reject(AdmitResult::reject(
            UNEXPECTED_ADMISSION_ERROR,
            format!(
                "Unexpected error while attempting to recover from admission failure: preemption: error finding a set of pods to preempt: {e}"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    //! kubelet's `preemption_test.go` vectors.
    use std::collections::BTreeMap;

    use super::*;
    use crate::policy::{
        admission::{Node, SecurityPolicy},
        resources::{
            SYSTEM_CRITICAL_PRIORITY,
            test_pods::{container, pod},
        },
    };

    const CLUSTER_CRITICAL: &str = "cluster-critical";
    const NODE_CRITICAL: &str = "node-critical";
    const BEST_EFFORT: &str = "bestEffort";
    const BURSTABLE: &str = "burstable";
    const HIGH_REQUEST_BURSTABLE: &str = "high-request-burstable";
    const GUARANTEED: &str = "guaranteed";
    const HIGH_REQUEST_GUARANTEED: &str = "high-request-guaranteed";
    const TINY_BURSTABLE: &str = "tiny";

    /// `getTestPods`.
    fn test_pods() -> BTreeMap<&'static str, Pod> {
        let with = |name: &str, requests: &str, limits: &str| {
            pod(
                name,
                vec![container(&format!("{name}-container"), requests, limits)],
            )
        };
        let mut all = BTreeMap::from([
            (
                TINY_BURSTABLE,
                with(TINY_BURSTABLE, "cpu=1m,memory=1Mi", ""),
            ),
            (BEST_EFFORT, with(BEST_EFFORT, "", "")),
            (
                CLUSTER_CRITICAL,
                with(CLUSTER_CRITICAL, "cpu=100m,memory=100Mi", ""),
            ),
            (
                NODE_CRITICAL,
                with(NODE_CRITICAL, "cpu=100m,memory=100Mi", ""),
            ),
            (BURSTABLE, with(BURSTABLE, "cpu=100m,memory=100Mi", "")),
            (
                GUARANTEED,
                with(GUARANTEED, "cpu=100m,memory=100Mi", "cpu=100m,memory=100Mi"),
            ),
            (
                HIGH_REQUEST_BURSTABLE,
                with(HIGH_REQUEST_BURSTABLE, "cpu=300m,memory=300Mi", ""),
            ),
            (
                HIGH_REQUEST_GUARANTEED,
                with(
                    HIGH_REQUEST_GUARANTEED,
                    "cpu=300m,memory=300Mi",
                    "cpu=300m,memory=300Mi",
                ),
            ),
        ]);
        for (name, class, priority) in [
            (
                CLUSTER_CRITICAL,
                "system-cluster-critical",
                SYSTEM_CRITICAL_PRIORITY,
            ),
            (
                NODE_CRITICAL,
                "system-node-critical",
                SYSTEM_CRITICAL_PRIORITY + 100,
            ),
        ] {
            let p = all.get_mut(name).expect("pod");
            p.metadata.namespace = Some("kube-system".to_owned());
            let spec = p.spec.as_mut().expect("spec");
            spec.priority_class_name = Some(class.to_owned());
            spec.priority = Some(priority);
        }
        all
    }

    /// `getAdmissionRequirementList`.
    fn reqs(cpu: i64, memory: i64, pods: i64) -> Requirements {
        let mut r = Vec::new();
        if cpu > 0 {
            r.push(Requirement {
                resource: "cpu".into(),
                quantity: cpu,
            });
        }
        if memory > 0 {
            r.push(Requirement {
                resource: "memory".into(),
                quantity: memory << 20,
            });
        }
        if pods > 0 {
            r.push(Requirement {
                resource: "pods".into(),
                quantity: pods,
            });
        }
        Requirements(r)
    }

    /// A `TestGetPodsToPreempt` case: name, preemptor, inputs, requirements, expected
    /// victims (`None`: an error).
    type Case = (
        &'static str,
        &'static str,
        &'static [&'static str],
        Requirements,
        Option<&'static [&'static str]>,
    );

    /// `TestGetPodsToPreempt`.
    #[test]
    fn get_pods_to_preempt() {
        let all = test_pods();
        let cases: &[Case] = &[
            (
                "no requirements",
                CLUSTER_CRITICAL,
                &[],
                reqs(0, 0, 0),
                Some(&[]),
            ),
            ("no pods", CLUSTER_CRITICAL, &[], reqs(0, 0, 1), None),
            (
                "equal pods and resources requirements",
                CLUSTER_CRITICAL,
                &[BURSTABLE],
                reqs(100, 100, 1),
                Some(&[BURSTABLE]),
            ),
            (
                "higher requirements than pod requests",
                CLUSTER_CRITICAL,
                &[BURSTABLE],
                reqs(200, 200, 2),
                None,
            ),
            (
                "choose between bestEffort and burstable",
                CLUSTER_CRITICAL,
                &[BURSTABLE, BEST_EFFORT],
                reqs(0, 0, 1),
                Some(&[BEST_EFFORT]),
            ),
            (
                "choose between burstable and guaranteed",
                CLUSTER_CRITICAL,
                &[BURSTABLE, GUARANTEED],
                reqs(0, 0, 1),
                Some(&[BURSTABLE]),
            ),
            (
                "choose lower request burstable if it meets requirements",
                CLUSTER_CRITICAL,
                &[BEST_EFFORT, HIGH_REQUEST_BURSTABLE, BURSTABLE],
                reqs(100, 100, 0),
                Some(&[BURSTABLE]),
            ),
            (
                "choose higher request burstable if lower does not meet requirements",
                CLUSTER_CRITICAL,
                &[BEST_EFFORT, BURSTABLE, HIGH_REQUEST_BURSTABLE],
                reqs(150, 150, 0),
                Some(&[HIGH_REQUEST_BURSTABLE]),
            ),
            (
                "multiple pods required",
                CLUSTER_CRITICAL,
                &[
                    BEST_EFFORT,
                    BURSTABLE,
                    HIGH_REQUEST_BURSTABLE,
                    GUARANTEED,
                    HIGH_REQUEST_GUARANTEED,
                ],
                reqs(350, 350, 0),
                Some(&[BURSTABLE, HIGH_REQUEST_BURSTABLE]),
            ),
            (
                "evict guaranteed when we have to, and dont evict the extra burstable",
                CLUSTER_CRITICAL,
                &[
                    BEST_EFFORT,
                    BURSTABLE,
                    HIGH_REQUEST_BURSTABLE,
                    GUARANTEED,
                    HIGH_REQUEST_GUARANTEED,
                ],
                reqs(0, 550, 0),
                Some(&[HIGH_REQUEST_BURSTABLE, HIGH_REQUEST_GUARANTEED]),
            ),
            (
                "evict cluster critical pod for node critical pod",
                NODE_CRITICAL,
                &[CLUSTER_CRITICAL],
                reqs(100, 0, 0),
                Some(&[CLUSTER_CRITICAL]),
            ),
            (
                "can not evict node critical pod for cluster critical pod",
                CLUSTER_CRITICAL,
                &[NODE_CRITICAL],
                reqs(100, 0, 0),
                None,
            ),
        ];
        for (name, preemptor, inputs, requirements, want) in cases {
            let pods: Vec<&Pod> = inputs.iter().map(|n| &all[n]).collect();
            let got = pods_to_preempt(&all[preemptor], &pods, requirements);
            match (want, got) {
                (Some(want), Ok(got)) => {
                    let mut got: Vec<&str> = got.iter().map(|&i| inputs[i]).collect();
                    let mut want = want.to_vec();
                    got.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(got, want, "{name}");
                }
                (None, Err(e)) => assert!(
                    e.to_string()
                        .starts_with("no set of running pods found to reclaim resources: [(res: "),
                    "{name}: {e}"
                ),
                (want, got) => panic!("{name}: want {want:?}, got {got:?}"),
            }
        }
    }

    /// `TestEvictPodsToFreeRequests`: critical pods are never candidates; a BestEffort pod
    /// frees no memory.
    #[test]
    fn critical_and_best_effort_pods_free_nothing() {
        let all = test_pods();
        let cc = &all[CLUSTER_CRITICAL];
        for (input, r) in [
            (CLUSTER_CRITICAL, reqs(0, 0, 1)),
            (BEST_EFFORT, reqs(0, 1, 0)),
        ] {
            assert!(
                pods_to_preempt(cc, &[&all[input]], &r).is_err(),
                "{input} preempted"
            );
        }
    }

    /// `TestAdmissionRequirementsDistance`.
    #[test]
    fn distance() {
        let all = test_pods();
        for (name, r, p, want) in [
            ("no requirements", reqs(0, 0, 0), BURSTABLE, 0.0),
            (
                "no requests, some requirements",
                reqs(100, 100, 1),
                BEST_EFFORT,
                2.0,
            ),
            (
                "equal requests and requirements",
                reqs(100, 100, 1),
                BURSTABLE,
                0.0,
            ),
            (
                "higher requests than requirements",
                reqs(50, 50, 0),
                BURSTABLE,
                0.0,
            ),
        ] {
            assert!((r.distance(&all[p]) - want).abs() < f64::EPSILON, "{name}");
        }
    }

    /// `TestAdmissionRequirementsSubtract`.
    #[test]
    fn subtract() {
        let all = test_pods();
        for (name, initial, p, want) in [
            (
                "subtract a pod from no requirements",
                reqs(0, 0, 0),
                BURSTABLE,
                reqs(0, 0, 0),
            ),
            (
                "subtract no requests from some requirements",
                reqs(100, 100, 1),
                BEST_EFFORT,
                reqs(100, 100, 0),
            ),
            (
                "equal requests and requirements",
                reqs(100, 100, 1),
                BURSTABLE,
                reqs(0, 0, 0),
            ),
            (
                "subtract higher requests than requirements",
                reqs(50, 50, 0),
                BURSTABLE,
                reqs(0, 0, 0),
            ),
            (
                "subtract lower requests than requirements",
                reqs(200, 200, 1),
                BURSTABLE,
                reqs(100, 100, 0),
            ),
        ] {
            assert_eq!(initial.subtract(&[&all[p]]), want, "{name}");
        }
        assert_eq!(
            reqs(100, 1, 0).to_string(),
            "[(res: cpu, q: 100), (res: memory, q: 1048576), ]"
        );
    }

    /// `BenchmarkGetPodsToPreempt`'s input: 110 tiny Burstable pods, 110m of cpu to free:
    /// all 110 are needed.
    #[test]
    fn many_tiny_pods() {
        let all = test_pods();
        let pods: Vec<&Pod> = std::iter::repeat_n(&all[TINY_BURSTABLE], 110).collect();
        let got = pods_to_preempt(&all[BEST_EFFORT], &pods, &reqs(110, 0, 0));
        // A BestEffort preemptor is not critical and has no priority: nothing is
        // preemptable.
        assert!(got.is_err());
        let got = pods_to_preempt(&all[CLUSTER_CRITICAL], &pods, &reqs(110, 0, 0)).expect("fits");
        assert_eq!(got.len(), 110);
    }

    /// The admission side: a critical pod lacking only resources preempts; one failing
    /// another check, a non-critical one, or one no set of pods makes room for is rejected.
    #[test]
    fn handle_admission_failure_as_kubelet() {
        let all = test_pods();
        let node = Node {
            name: "n".into(),
            allocatable: [("cpu", "450m"), ("memory", "1Gi"), ("pods", "110")]
                .into_iter()
                .map(|(k, v)| {
                    (
                        k.to_owned(),
                        crate::quantity::Quantity::parse(v).expect("quantity"),
                    )
                })
                .collect(),
            ..Node::default()
        };
        let running = [&all[HIGH_REQUEST_BURSTABLE], &all[BURSTABLE]];
        let admitter = Admitter::new(node, SecurityPolicy::default(), running);
        let cc = &all[CLUSTER_CRITICAL];
        let rejected = admitter.admit(cc, &[]);
        assert_eq!(rejected.reason, "OutOfcpu");
        assert_eq!(
            handle_admission_failure(&admitter, cc, &[], rejected.clone(), &running),
            Decision::Preempt {
                victims: vec![1],
                signal: "cpu".into()
            }
        );
        // Not critical: the admitter's rejection stands.
        let other = &all[GUARANTEED];
        let r = admitter.admit(other, &[]);
        assert_eq!(
            handle_admission_failure(&admitter, other, &[], r.clone(), &running),
            Decision::Reject(r)
        );
        // Nothing preemptable: kubelet's UnexpectedAdmissionError.
        let Decision::Reject(r) = handle_admission_failure(&admitter, cc, &[], rejected, &[])
        else {
            panic!("preempted nothing");
        };
        assert_eq!(r.reason, UNEXPECTED_ADMISSION_ERROR);
        assert_eq!(
            r.message,
            "Unexpected error while attempting to recover from admission failure: preemption: error finding a set of pods to preempt: no set of running pods found to reclaim resources: [(res: cpu, q: 50), ]"
        );
        // A failure besides resources (here a node name) is reported instead.
        let mut elsewhere = cc.clone();
        if let Some(s) = elsewhere.spec.as_mut() {
            s.node_name = Some("other".into());
        }
        let r = admitter.admit(&elsewhere, &[]);
        let Decision::Reject(r) = handle_admission_failure(&admitter, &elsewhere, &[], r, &running)
        else {
            panic!("preempted for a pod of another node");
        };
        assert_eq!(r.reason, "NodeName");
    }
}
