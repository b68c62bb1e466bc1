//! The topology manager's tables: `policy_test.go` (`commonPolicyMergeTestCases`, the
//! best-effort and single-numa-node merge cases, `TestMaxOfMinAffinityCounts`,
//! `TestCompareHints`), `policy_none_test.go`, `policy_restricted_test.go`,
//! `policy_single_numa_node_test.go` (`TestPolicySingleNumaNodeCanAdmitPodResult`,
//! `TestPolicySingleNumaNodeFilterHints`), `topology_manager_test.go` (too many NUMA nodes)
//! and `scope_container_test.go`-style admission.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    BitMask, HintProvider, Policy, ProviderHints, TopologyError, TopologyHint,
    admit_container_scope, check_numa_node_count,
    merge::{HintMerger, max_of_min_affinity_counts},
};
use crate::policy::resources::test_pods::{container, pod};

fn m(bits: &[usize]) -> BitMask {
    BitMask::new(bits).unwrap()
}

fn h(bits: &[usize], preferred: bool) -> TopologyHint {
    TopologyHint::new(m(bits), preferred)
}

fn any(preferred: bool) -> TopologyHint {
    TopologyHint {
        affinity: None,
        preferred,
    }
}

/// A provider's hints: resource -> hints (`None`: Go's nil slice).
fn p(items: &[(&str, Option<Vec<TopologyHint>>)]) -> ProviderHints {
    items
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn one(resource: &str, hints: Vec<TopologyHint>) -> ProviderHints {
    p(&[(resource, Some(hints))])
}

type Case = (&'static str, Vec<ProviderHints>, TopologyHint);

/// `commonPolicyMergeTestCases`.
fn common() -> Vec<Case> {
    vec![
        (
            "Two providers, 1 hint each, same mask, both preferred 1/2",
            vec![
                one("resource1", vec![h(&[0], true)]),
                one("resource2", vec![h(&[0], true)]),
            ],
            h(&[0], true),
        ),
        (
            "Two providers, 1 hint each, same mask, both preferred 2/2",
            vec![
                one("resource1", vec![h(&[1], true)]),
                one("resource2", vec![h(&[1], true)]),
            ],
            h(&[1], true),
        ),
        (
            "Two providers, 1 no hints, 1 single hint preferred 1/2",
            vec![p(&[]), one("resource", vec![h(&[0], true)])],
            h(&[0], true),
        ),
        (
            "Two providers, 1 no hints, 1 single hint preferred 2/2",
            vec![p(&[]), one("resource", vec![h(&[1], true)])],
            h(&[1], true),
        ),
        (
            "Two providers, 1 with 2 hints, 1 with single hint matching 1/2",
            vec![
                one("resource1", vec![h(&[0], true), h(&[1], true)]),
                one("resource2", vec![h(&[0], true)]),
            ],
            h(&[0], true),
        ),
        (
            "Two providers, 1 with 2 hints, 1 with single hint matching 2/2",
            vec![
                one("resource1", vec![h(&[0], true), h(&[1], true)]),
                one("resource2", vec![h(&[1], true)]),
            ],
            h(&[1], true),
        ),
        (
            "Two providers, both with 2 hints, matching narrower preferred hint from both",
            vec![
                one("resource1", vec![h(&[0], true), h(&[1], true)]),
                one("resource2", vec![h(&[0], true), h(&[0, 1], false)]),
            ],
            h(&[0], true),
        ),
        (
            "Ensure less narrow preferred hints are chosen over narrower non-preferred hints",
            vec![
                one("resource1", vec![h(&[1], true), h(&[0, 1], false)]),
                one(
                    "resource2",
                    vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)],
                ),
            ],
            h(&[1], true),
        ),
        (
            "Multiple resources, same provider",
            vec![p(&[
                ("resource1", Some(vec![h(&[1], true), h(&[0, 1], false)])),
                (
                    "resource2",
                    Some(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                ),
            ])],
            h(&[1], true),
        ),
    ]
}

/// `(*bestEffortPolicy).mergeTestCases` (also the restricted policy's), on `nodes`.
fn best_effort(nodes: &[usize]) -> Vec<Case> {
    let all = m(nodes);
    vec![
        (
            "Two providers, 2 hints each, same mask (some with different bits), same preferred",
            vec![
                one("resource1", vec![h(&[0, 1], true), h(&[0, 2], true)]),
                one("resource2", vec![h(&[0, 1], true), h(&[0, 2], true)]),
            ],
            h(&[0, 1], true),
        ),
        ("TopologyHint not set", vec![], TopologyHint::new(all, true)),
        (
            "HintProvider returns empty non-nil map[string][]TopologyHint",
            vec![p(&[])],
            TopologyHint::new(all, true),
        ),
        (
            "HintProvider returns -nil map[string][]TopologyHint from provider",
            vec![p(&[("resource", None)])],
            TopologyHint::new(all, true),
        ),
        (
            "HintProvider returns empty non-nil map[string][]TopologyHint from provider",
            vec![one("resource", vec![])],
            TopologyHint::new(all, false),
        ),
        (
            "Single TopologyHint with Preferred as true and NUMANodeAffinity as nil",
            vec![one("resource", vec![any(true)])],
            TopologyHint::new(all, true),
        ),
        (
            "Single TopologyHint with Preferred as false and NUMANodeAffinity as nil",
            vec![one("resource", vec![any(false)])],
            TopologyHint::new(all, false),
        ),
        (
            "Two providers, 1 hint each, no common mask",
            vec![
                one("resource1", vec![h(&[0], true)]),
                one("resource2", vec![h(&[1], true)]),
            ],
            TopologyHint::new(all, false),
        ),
        (
            "Two providers, 1 hint each, same mask, 1 preferred, 1 not 1/2",
            vec![
                one("resource1", vec![h(&[0], true)]),
                one("resource2", vec![h(&[0], false)]),
            ],
            h(&[0], false),
        ),
        (
            "Two providers, 1 hint each, same mask, 1 preferred, 1 not 2/2",
            vec![
                one("resource1", vec![h(&[1], true)]),
                one("resource2", vec![h(&[1], false)]),
            ],
            h(&[1], false),
        ),
        (
            "Two providers, 1 hint each, 1 wider mask, both preferred 1/2",
            vec![
                one("resource1", vec![h(&[0], true)]),
                one("resource2", vec![h(&[0, 1], true)]),
            ],
            h(&[0], false),
        ),
        (
            "Two providers, 1 with 2 hints, 1 with single non-preferred hint matching",
            vec![
                one("resource1", vec![h(&[0], true), h(&[1], true)]),
                one("resource2", vec![h(&[0, 1], false)]),
            ],
            h(&[0], false),
        ),
        (
            "Two providers, 1 hint each, 1 wider mask, both preferred 2/2",
            vec![
                one("resource1", vec![h(&[1], true)]),
                one("resource2", vec![h(&[0, 1], true)]),
            ],
            h(&[1], false),
        ),
        (
            "bestNonPreferredAffinityCount (1)",
            vec![
                one(
                    "resource1",
                    vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)],
                ),
                one("resource2", vec![h(&[0, 1], false)]),
            ],
            h(&[0, 1], false),
        ),
        (
            "bestNonPreferredAffinityCount (2)",
            vec![
                one(
                    "resource1",
                    vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)],
                ),
                one("resource2", vec![h(&[0, 3], false)]),
            ],
            h(&[0, 3], false),
        ),
        (
            "bestNonPreferredAffinityCount (3)",
            vec![
                one(
                    "resource1",
                    vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)],
                ),
                one("resource2", vec![h(&[1, 2], false)]),
            ],
            h(&[1, 2], false),
        ),
        (
            "bestNonPreferredAffinityCount (4)",
            vec![
                one(
                    "resource1",
                    vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)],
                ),
                one("resource2", vec![h(&[2, 3], false)]),
            ],
            h(&[2, 3], false),
        ),
        (
            "bestNonPreferredAffinityCount (5)",
            vec![
                one(
                    "resource1",
                    vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)],
                ),
                one("resource2", vec![h(&[1, 2], false), h(&[2, 3], false)]),
            ],
            h(&[1, 2], false),
        ),
        (
            "bestNonPreferredAffinityCount (6)",
            vec![
                one(
                    "resource1",
                    vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)],
                ),
                one(
                    "resource2",
                    vec![
                        h(&[1, 2, 3], false),
                        h(&[1, 2], false),
                        h(&[1, 3], false),
                        h(&[2, 3], false),
                    ],
                ),
            ],
            h(&[1, 2], false),
        ),
    ]
}

/// `(*singleNumaNodePolicy).mergeTestCases`.
fn single_numa_node() -> Vec<Case> {
    vec![
        ("TopologyHint not set", vec![], any(true)),
        (
            "HintProvider returns empty non-nil map[string][]TopologyHint",
            vec![p(&[])],
            any(true),
        ),
        (
            "HintProvider returns -nil map[string][]TopologyHint from provider",
            vec![p(&[("resource", None)])],
            any(true),
        ),
        (
            "HintProvider returns empty non-nil map[string][]TopologyHint from provider",
            vec![one("resource", vec![])],
            any(false),
        ),
        (
            "Single TopologyHint with Preferred as true and NUMANodeAffinity as nil",
            vec![one("resource", vec![any(true)])],
            any(true),
        ),
        (
            "Single TopologyHint with Preferred as false and NUMANodeAffinity as nil",
            vec![one("resource", vec![any(false)])],
            any(false),
        ),
        (
            "Two providers, 1 hint each, no common mask",
            vec![
                one("resource1", vec![h(&[0], true)]),
                one("resource2", vec![h(&[1], true)]),
            ],
            any(false),
        ),
        (
            "Two providers, 1 hint each, same mask, 1 preferred, 1 not 1/2",
            vec![
                one("resource1", vec![h(&[0], true)]),
                one("resource2", vec![h(&[0], false)]),
            ],
            any(false),
        ),
        (
            "Two providers, 1 hint each, same mask, 1 preferred, 1 not 2/2",
            vec![
                one("resource1", vec![h(&[1], true)]),
                one("resource2", vec![h(&[1], false)]),
            ],
            any(false),
        ),
        (
            "Two providers, 1 with 2 hints, 1 with single non-preferred hint matching",
            vec![
                one("resource1", vec![h(&[0], true), h(&[1], true)]),
                one("resource2", vec![h(&[0, 1], false)]),
            ],
            any(false),
        ),
        (
            "Single NUMA hint generation",
            vec![p(&[
                ("resource1", Some(vec![h(&[0, 1], true)])),
                (
                    "resource2",
                    Some(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                ),
            ])],
            any(false),
        ),
        (
            "One no-preference provider",
            vec![
                one(
                    "resource1",
                    vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)],
                ),
                p(&[]),
            ],
            h(&[0], true),
        ),
    ]
}

fn run(policy: Policy, nodes: &[usize], cases: Vec<Case>) {
    for (name, providers, want) in cases {
        let (got, admit) = policy.merge(nodes, &providers);
        assert_eq!(got, want, "{} {name}", policy.name());
        assert_eq!(admit, policy.can_admit(&got), "{name}");
    }
}

#[test]
fn policy_best_effort_merge() {
    let nodes = [0, 1, 2, 3];
    let mut cases = common();
    cases.extend(best_effort(&nodes));
    run(Policy::BestEffort, &nodes, cases);
}

#[test]
fn policy_restricted_merge() {
    let nodes = [0, 1, 2, 3];
    let mut cases = common();
    cases.extend(best_effort(&nodes));
    run(Policy::Restricted, &nodes, cases);
}

#[test]
fn policy_single_numa_node_merge() {
    let nodes = [0, 1];
    let mut cases = common();
    cases.extend(single_numa_node());
    run(Policy::SingleNumaNode, &nodes, cases);
}

#[test]
fn policy_none_merge_and_admit() {
    // policy_none_test.go: any hints merge to the empty hint, always admitted.
    for providers in [
        vec![],
        vec![one("resource", vec![h(&[0], true)])],
        vec![one("resource", vec![])],
    ] {
        assert_eq!(
            Policy::None.merge(&[0, 1], &providers),
            (TopologyHint::default(), true)
        );
    }
}

#[test]
fn can_admit_pod_result() {
    // TestPolicy{BestEffort,Restricted,SingleNumaNode}CanAdmitPodResult.
    for (policy, preferred, want) in [
        (Policy::BestEffort, false, true),
        (Policy::BestEffort, true, true),
        (Policy::Restricted, false, false),
        (Policy::Restricted, true, true),
        (Policy::SingleNumaNode, false, false),
        (Policy::SingleNumaNode, true, true),
    ] {
        assert_eq!(
            policy.can_admit(&any(preferred)),
            want,
            "{policy:?} {preferred}"
        );
    }
}

#[test]
fn filter_single_numa_hints() {
    // TestPolicySingleNumaNodeFilterHints, via the merge: only preferred one-node or any-node
    // hints survive.
    let (got, _) = Policy::SingleNumaNode.merge(
        &[0, 1],
        &[one("resource", vec![h(&[0, 1], true), h(&[1], false)])],
    );
    assert_eq!(got, any(false));
    let (got, _) = Policy::SingleNumaNode.merge(
        &[0, 1],
        &[one(
            "resource",
            vec![h(&[0, 1], true), h(&[1], true), any(true)],
        )],
    );
    assert_eq!(got, h(&[1], true));
}

#[test]
fn max_of_min_counts() {
    let cases: Vec<(Vec<Vec<TopologyHint>>, usize)> = vec![
        (vec![], 0),
        (vec![vec![h(&[], true)]], 0),
        (vec![vec![h(&[0], true)]], 1),
        (vec![vec![h(&[0, 1], true)]], 2),
        (vec![vec![h(&[0, 1], true), h(&[0, 1, 2], true)]], 2),
        (
            vec![
                vec![h(&[0, 1], true), h(&[0, 1, 2], true)],
                vec![h(&[0, 1, 2], true)],
            ],
            3,
        ),
        (
            vec![
                vec![h(&[0, 1], true), h(&[0, 1, 2], true)],
                vec![h(&[0, 1, 2], true), h(&[0, 1, 2, 3], true)],
            ],
            3,
        ),
    ];
    for (hints, want) in cases {
        assert_eq!(max_of_min_affinity_counts(&hints), want, "{hints:?}");
    }
}

#[test]
fn compare_hints() {
    // TestCompareHints: (best non-preferred count, current, candidate, "current"/"candidate")
    let cases: Vec<(&str, usize, Option<TopologyHint>, TopologyHint, &str)> = vec![
        (
            "candidate.NUMANodeAffinity.Count() == 0 (1)",
            0,
            None,
            h(&[], false),
            "current",
        ),
        (
            "candidate.NUMANodeAffinity.Count() == 0 (2)",
            0,
            Some(h(&[], true)),
            h(&[], false),
            "current",
        ),
        ("current == nil (1)", 0, None, h(&[0], true), "candidate"),
        ("current == nil (2)", 0, None, h(&[0], false), "candidate"),
        (
            "!current.Preferred && candidate.Preferred",
            0,
            Some(h(&[0], false)),
            h(&[0], true),
            "candidate",
        ),
        (
            "current.Preferred && !candidate.Preferred",
            0,
            Some(h(&[0], true)),
            h(&[0], false),
            "current",
        ),
        (
            "current.Preferred && candidate.Preferred (1)",
            0,
            Some(h(&[0], true)),
            h(&[0], true),
            "current",
        ),
        (
            "current.Preferred && candidate.Preferred (2)",
            0,
            Some(h(&[0, 1], true)),
            h(&[0], true),
            "candidate",
        ),
        (
            "current.Preferred && candidate.Preferred (3)",
            0,
            Some(h(&[0], true)),
            h(&[0, 1], true),
            "current",
        ),
        (
            "(1.1)",
            1,
            Some(h(&[0, 1], false)),
            h(&[0, 1], false),
            "current",
        ),
        (
            "(1.2)",
            1,
            Some(h(&[1, 2], false)),
            h(&[0, 1], false),
            "candidate",
        ),
        (
            "(1.3)",
            1,
            Some(h(&[0, 1], false)),
            h(&[1, 2], false),
            "current",
        ),
        (
            "(2.1)",
            2,
            Some(h(&[0, 1], false)),
            h(&[0], false),
            "current",
        ),
        (
            "(2.2)",
            2,
            Some(h(&[0, 1], false)),
            h(&[0, 1], false),
            "current",
        ),
        (
            "(2.3)",
            2,
            Some(h(&[1, 2], false)),
            h(&[0, 1], false),
            "candidate",
        ),
        (
            "(2.4)",
            2,
            Some(h(&[0, 1], false)),
            h(&[1, 2], false),
            "current",
        ),
        (
            "(3a)",
            2,
            Some(h(&[0], false)),
            h(&[0, 1, 2], false),
            "current",
        ),
        (
            "(3b)",
            2,
            Some(h(&[0], false)),
            h(&[0, 1], false),
            "candidate",
        ),
        (
            "(3ca.1)",
            3,
            Some(h(&[0], false)),
            h(&[0, 1], false),
            "candidate",
        ),
        (
            "(3ca.2)",
            3,
            Some(h(&[0], false)),
            h(&[1, 2], false),
            "candidate",
        ),
        (
            "(3ca.3)",
            4,
            Some(h(&[0, 1], false)),
            h(&[1, 2, 3], false),
            "candidate",
        ),
        (
            "(3cb)",
            4,
            Some(h(&[1, 2, 3], false)),
            h(&[0, 1], false),
            "current",
        ),
        (
            "(3cc.1)",
            4,
            Some(h(&[0, 1, 2], false)),
            h(&[0, 1, 2], false),
            "current",
        ),
        (
            "(3cc.2)",
            4,
            Some(h(&[0, 1, 2], false)),
            h(&[1, 2, 3], false),
            "current",
        ),
        (
            "(3cc.3)",
            4,
            Some(h(&[1, 2, 3], false)),
            h(&[0, 1, 2], false),
            "candidate",
        ),
    ];
    for (name, best, current, candidate, want) in cases {
        let mut merger = HintMerger::new(m(&[0, 1, 2, 3]), vec![]);
        merger.best_non_preferred_affinity_count = best;
        let got = merger.compare(current, candidate);
        let expected = if want == "current" {
            current
        } else {
            Some(candidate)
        };
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn too_many_numa_nodes() {
    assert_eq!(
        check_numa_node_count(Policy::BestEffort, 9)
            .unwrap_err()
            .to_string(),
        "unsupported on machines with more than 8 NUMA Nodes"
    );
    assert!(check_numa_node_count(Policy::None, 9).is_ok());
    assert!(check_numa_node_count(Policy::Restricted, 8).is_ok());
    assert_eq!(
        Policy::parse("x"),
        Err(TopologyError::UnknownPolicy("x".into()))
    );
}

/// A provider answering fixed hints and recording allocations (kubelet's `mockHintProvider`).
struct Mock {
    hints: ProviderHints,
    fail: Option<&'static str>,
    allocated: Vec<(String, TopologyHint)>,
}

impl HintProvider for Mock {
    fn topology_hints(&self, _: &Pod, _: &Container) -> ProviderHints {
        self.hints.clone()
    }
    fn allocate(
        &mut self,
        _: &Pod,
        c: &Container,
        hint: &TopologyHint,
    ) -> Result<(), super::ProviderError> {
        if let Some(e) = self.fail {
            return Err(e.into());
        }
        self.allocated.push((c.name.clone(), *hint));
        Ok(())
    }
}

#[test]
fn container_scope_admit() {
    // TestContainerScopeAdmit-style: the policy's verdict and the reasons.
    let pod = pod(
        "p",
        vec![container("c", "cpu=1,memory=1Gi", "cpu=1,memory=1Gi")],
    );
    let mock = |hints, fail| Mock {
        hints,
        fail,
        allocated: vec![],
    };
    // Restricted: no common preferred placement -> TopologyAffinityError.
    let mut a = mock(one("cpu", vec![h(&[0], true)]), None);
    let mut b = mock(one("memory", vec![h(&[1], true)]), None);
    let r = admit_container_scope(Policy::Restricted, &[0, 1], &mut [&mut a, &mut b], &pod);
    assert!(!r.result.admitted);
    assert_eq!(r.result.reason, "TopologyAffinityError");
    assert_eq!(
        r.result.message,
        "Resources cannot be allocated with Topology Locality"
    );
    assert!(a.allocated.is_empty());
    // Best-effort admits the same, allocating along the non-preferred merged hint.
    let r = admit_container_scope(Policy::BestEffort, &[0, 1], &mut [&mut a, &mut b], &pod);
    assert!(r.result.admitted);
    assert_eq!(a.allocated, vec![("c".to_owned(), h(&[0, 1], false))]);
    // A provider's allocation error -> UnexpectedAdmissionError.
    let mut c = mock(
        p(&[]),
        Some("not enough cpus available to satisfy request: requested=4, available=2"),
    );
    let r = admit_container_scope(Policy::SingleNumaNode, &[0, 1], &mut [&mut c], &pod);
    assert_eq!(r.result.reason, "UnexpectedAdmissionError");
    assert_eq!(
        r.result.message,
        "Allocate failed due to not enough cpus available to satisfy request: requested=4, available=2, which is unexpected"
    );
    // None: no hints asked, an any-node hint given.
    let mut d = mock(one("cpu", vec![]), None);
    let r = admit_container_scope(Policy::None, &[0, 1], &mut [&mut d], &pod);
    assert!(r.result.admitted);
    assert_eq!(d.allocated, vec![("c".to_owned(), TopologyHint::default())]);
}
