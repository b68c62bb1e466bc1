use super::*;

#[test]
fn only_the_prefixed_families_are_kept() {
    let text = "# HELP kubelet_evictions Evictions.\n# TYPE kubelet_evictions counter\n\
                kubelet_evictions_total{eviction_signal=\"memory.available\"} 1\n\
                # HELP enforcer_build_info Build.\n# TYPE enforcer_build_info gauge\n\
                enforcer_build_info{version=\"0.1.0\"} 1\n\
                # HELP process_start_time_seconds Start.\nprocess_start_time_seconds 5\n# EOF\n";
    assert_eq!(
        only_families(text, "enforcer_"),
        "# HELP enforcer_build_info Build.\n# TYPE enforcer_build_info gauge\n\
         enforcer_build_info{version=\"0.1.0\"} 1\n# EOF\n"
    );
}

#[test]
fn kubelet_names_labels_and_buckets() {
    let m = Metrics::new();
    let op = m.runtime_operation("RunPodSandbox");
    drop(op);
    let op = m.runtime_operation("ListContainers");
    assert_eq!(op.ok(7), 7);
    m.container_started(ContainerKind::Init);
    m.eviction("memory.available");
    m.pod_seen("u1");
    m.pod_phase("u1", PodPhase::Running);
    m.pod_phase("u1", PodPhase::Running);
    let text = encode(&[m.registry()]).expect("encode");
    for want in [
        "kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"} 1",
        "kubelet_runtime_operations_errors_total{operation_type=\"run_podsandbox\"} 1",
        "kubelet_runtime_operations_total{operation_type=\"list_containers\"} 1",
        "kubelet_started_pods_total 1",
        "kubelet_started_pods_errors_total 1",
        "kubelet_started_containers_total{container_type=\"init_container\"} 1",
        "kubelet_evictions_total{eviction_signal=\"memory.available\"} 1",
        "enforcer_evictions_total{eviction_signal=\"memory.available\"} 1",
        "kubelet_pod_start_duration_seconds_count 1",
        "kubelet_runtime_operations_duration_seconds_bucket{le=\"0.005\",operation_type=\"list_containers\"} 1",
        "# EOF",
    ] {
        assert!(text.contains(want), "{want} missing in:\n{text}");
    }
    assert!(
        !text.contains(
            "kubelet_runtime_operations_errors_total{operation_type=\"list_containers\"}"
        ),
        "{text}"
    );
    // ExponentialBuckets(.005, 2.5, 14): the last finite bucket is .005 * 2.5^13.
    assert!(text.contains("le=\"745.058059692382"), "{text}");
}
