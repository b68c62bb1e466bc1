//! Pod-level resources (KEP-2837), ported from component-helpers' `resource/helpers_test.go`:
//! `TestPodLevelResourceRequests`, `TestIsPodLevelResourcesSet`, `TestIsPodLevelLimitsSet`.

use k8s_openapi::api::core::v1::ResourceRequirements;

use super::{test_pods::*, *};

fn with_pod_level(p: &mut Pod, requests: &str, limits: &str) {
    if let Some(spec) = p.spec.as_mut() {
        spec.resources = Some(ResourceRequirements {
            requests: rl(requests),
            limits: rl(limits),
            ..Default::default()
        });
    }
}

fn list(s: &str) -> ResourceList {
    rl(s)
        .unwrap_or_default()
        .iter()
        .map(|(k, v)| (k.clone(), lenient(v)))
        .collect()
}

#[test]
fn pod_level_resource_requests() {
    // (name, pod-level requests, pod-level limits, containers' requests, init containers'
    // requests with "sidecar", expected). The SkipPodLevelResources rows are left out: the
    // feature is on in 1.35.
    #[expect(clippy::type_complexity, reason = "a test table")]
    let cases: &[(&str, &str, &str, &[&str], &[(&str, bool)], &str)] = &[
        ("nil", "", "", &[], &[], ""),
        (
            "pod level memory resource",
            "memory=2Mi",
            "",
            &[],
            &[],
            "memory=2Mi",
        ),
        (
            "pod level memory and container level cpu resources",
            "memory=2Mi",
            "",
            &["cpu=2m"],
            &[],
            "memory=2Mi,cpu=2m",
        ),
        (
            "pod level unsupported resources set at both pod-level and container-level",
            "storage=2Mi",
            "",
            &["storage=3Mi"],
            &[],
            "storage=3Mi",
        ),
        (
            "pod level unsupported resources set at pod-level",
            "storage=2Mi",
            "",
            &["memory=3Mi"],
            &[],
            "memory=3Mi",
        ),
        (
            "only container level resources set",
            "",
            "",
            &["memory=3Mi,cpu=2m"],
            &[],
            "memory=3Mi,cpu=2m",
        ),
        (
            "both container-level and pod-level resources set",
            "memory=6Mi,cpu=8m",
            "",
            &["memory=3Mi,cpu=2m"],
            &[],
            "memory=6Mi,cpu=8m",
        ),
        (
            "container-level resources and init container set",
            "",
            "",
            &["memory=3Mi,cpu=2m"],
            &[("memory=5Mi,cpu=4m", false)],
            "memory=5Mi,cpu=4m",
        ),
        (
            "container-level resources and sidecar container set",
            "",
            "",
            &["memory=3Mi,cpu=2m"],
            &[("memory=5Mi,cpu=4m", true)],
            "memory=8Mi,cpu=6m",
        ),
        (
            "container-level resources, init and sidecar container set",
            "",
            "",
            &["memory=3Mi,cpu=2m"],
            &[("memory=5Mi,cpu=4m", true), ("memory=6Mi,cpu=8m", false)],
            "memory=11Mi,cpu=12m",
        ),
        (
            "pod-level resources, container-level resources, init and sidecar container set",
            "memory=15Mi,cpu=18m",
            "",
            &["memory=3Mi,cpu=2m"],
            &[("memory=5Mi,cpu=4m", true), ("memory=6Mi,cpu=8m", false)],
            "memory=15Mi,cpu=18m",
        ),
        (
            "pod-level resources, hugepage request/limit single page size",
            "memory=10Mi,hugepages-2Mi=2Mi",
            "hugepages-2Mi=2Mi",
            &[],
            &[],
            "memory=10Mi,hugepages-2Mi=2Mi",
        ),
        (
            "pod-level resources, hugepage request/limit multiple page sizes",
            "cpu=1,hugepages-2Mi=2Mi,hugepages-1Gi=1Gi",
            "hugepages-2Mi=2Mi,hugepages-1Gi=1Gi",
            &[],
            &[],
            "cpu=1,hugepages-2Mi=2Mi,hugepages-1Gi=1Gi",
        ),
        (
            "pod-level resources, container-level resources, hugepage request/limit single page size",
            "cpu=1,hugepages-2Mi=10Mi",
            "hugepages-2Mi=10Mi",
            &["hugepages-2Mi=6Mi"],
            &[],
            "cpu=1,hugepages-2Mi=10Mi",
        ),
    ];
    for (name, pod_requests_s, pod_limits_s, cs, inits, want) in cases {
        let containers = cs
            .iter()
            .enumerate()
            .map(|(i, r)| container(&format!("c{i}"), r, ""))
            .collect();
        let mut p = pod("p", containers);
        let inits: Vec<Container> = inits
            .iter()
            .enumerate()
            .map(|(i, (r, sidecar))| {
                let mut c = container(&format!("i{i}"), r, "");
                if *sidecar {
                    c.restart_policy = Some("Always".to_owned());
                }
                c
            })
            .collect();
        if !inits.is_empty() {
            p.spec.as_mut().unwrap().init_containers = Some(inits);
        }
        if !pod_requests_s.is_empty() || !pod_limits_s.is_empty() {
            with_pod_level(&mut p, pod_requests_s, pod_limits_s);
        }
        let want = list(want);
        assert_eq!(pod_requests(&p), want, "{name}");
        // The one-resource form the eviction ranking uses agrees.
        for (res, q) in &want {
            assert_eq!(pod_request_nanos(&p, res), q.nanos(), "{name}: {res}");
        }
    }
}

#[test]
fn pod_level_resources_set() {
    // TestIsPodLevelResourcesSet, then TestIsPodLevelLimitsSet (requests, limits, set).
    let mut p = pod("p", vec![container("c", "", "")]);
    assert!(!is_pod_level_resources_set(&p), "nil resources struct");
    for (name, requests, limits, want) in [
        ("empty resources struct", "", "", false),
        (
            "only unsupported resource requests set",
            "ephemeral-storage=1Mi",
            "",
            false,
        ),
        (
            "only unsupported resource limits set",
            "",
            "ephemeral-storage=1Mi",
            false,
        ),
        (
            "unsupported and suported resources requests set",
            "ephemeral-storage=1Mi,cpu=1m",
            "",
            true,
        ),
        (
            "unsupported and suported resources limits set",
            "",
            "ephemeral-storage=1Mi,cpu=1m",
            true,
        ),
    ] {
        with_pod_level(&mut p, requests, limits);
        assert_eq!(is_pod_level_resources_set(&p), want, "{name}");
    }
    p.spec.as_mut().unwrap().resources = None;
    assert!(!is_pod_level_limits_set(&p), "nil resources struct");
    for (name, requests, limits, want) in [
        ("empty resources struct", "", "", false),
        ("only resource requests set", "memory=100Mi", "", false),
        (
            "only unsupported resource limits set",
            "",
            "ephemeral-storage=1Mi",
            false,
        ),
        (
            "unsupported and suported resources limits set",
            "",
            "ephemeral-storage=1Mi,cpu=1m",
            true,
        ),
    ] {
        with_pod_level(&mut p, requests, limits);
        assert_eq!(is_pod_level_limits_set(&p), want, "{name}");
        assert_eq!(
            is_pod_level_requests_set(&p),
            name == "only resource requests set",
            "{name}: requests"
        );
    }
}
