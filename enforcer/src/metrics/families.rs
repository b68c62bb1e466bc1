//! The metric families the registry holds, their labels and buckets: kubelet's runtime
//! operations and images, its pods, workers and PLEG, and the evictions and the enforcer's
//! latencies, each group registered in `/metrics` order.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::{DEF_BUCKETS, LATENCY_BUCKETS, POD_START_BUCKETS};

pub(super) fn def_histogram() -> Histogram {
    Histogram::new(DEF_BUCKETS)
}

/// `metrics.ExponentialBuckets(.005, 2.5, 14)` (kubelet's runtime operation buckets).
pub(super) fn runtime_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.005, 2.5, 14,
    ))
}

pub(super) fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OperationType {
    pub(super) operation_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ContainerType {
    pub(super) container_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ContainerStateLabel {
    pub(super) container_state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EvictionSignal {
    pub(super) eviction_signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PreemptionSignal {
    pub(super) preemption_signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct WorkingLabels {
    pub(super) lifecycle: String,
    pub(super) config: String,
    pub(super) r#static: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct QosClass {
    pub(super) qos_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Source {
    pub(super) source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ImageSize {
    pub(super) image_size_in_bytes: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct GcReason {
    pub(super) reason: String,
}

pub(super) fn image_pull_histogram() -> Histogram {
    Histogram::new(crate::policy::images::IMAGE_PULL_DURATION_BUCKETS)
}

pub(super) type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The families of kubelet's runtime operations and images.
#[derive(Debug)]
pub(super) struct RuntimeFamilies {
    pub(super) runtime_operations: Family<OperationType, Counter>,
    pub(super) runtime_operations_errors: Family<OperationType, Counter>,
    pub(super) runtime_operations_duration: HistogramFamily<OperationType>,
    pub(super) image_pull_duration: HistogramFamily<ImageSize>,
    pub(super) image_garbage_collected: Family<GcReason, Counter>,
}

impl RuntimeFamilies {
    /// Registered in `registry`, in /metrics order.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let runtime_operations = Family::<OperationType, Counter>::default();
        registry.register(
            "kubelet_runtime_operations",
            "Cumulative number of runtime operations by operation type.",
            runtime_operations.clone(),
        );
        let runtime_operations_errors = Family::<OperationType, Counter>::default();
        registry.register(
            "kubelet_runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type.",
            runtime_operations_errors.clone(),
        );
        let runtime_operations_duration: HistogramFamily<OperationType> =
            Family::new_with_constructor(runtime_histogram);
        registry.register(
            "kubelet_runtime_operations_duration_seconds",
            "Duration in seconds of runtime operations. Broken down by operation type.",
            runtime_operations_duration.clone(),
        );
        let image_pull_duration: HistogramFamily<ImageSize> =
            Family::new_with_constructor(image_pull_histogram);
        registry.register(
            "kubelet_image_pull_duration_seconds",
            "Duration in seconds to pull an image.",
            image_pull_duration.clone(),
        );
        let image_garbage_collected = Family::<GcReason, Counter>::default();
        registry.register(
            "kubelet_image_garbage_collected",
            "Total number of images garbage collected by the kubelet, whether through disk usage or image age.",
            image_garbage_collected.clone(),
        );
        Self {
            runtime_operations,
            runtime_operations_errors,
            runtime_operations_duration,
            image_pull_duration,
            image_garbage_collected,
        }
    }
}

/// The families of kubelet's pods, containers, pod workers, PLEG and cgroup manager.
#[derive(Debug)]
pub(super) struct PodFamilies {
    pub(super) started_pods: Counter,
    pub(super) started_pods_errors: Counter,
    pub(super) started_containers: Family<ContainerType, Counter>,
    pub(super) pod_start_duration: Histogram,
    pub(super) pod_worker_duration: HistogramFamily<OperationType>,
    pub(super) pleg_relist_duration: Histogram,
    pub(super) pleg_relist_interval: Histogram,
    pub(super) pleg_last_seen: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub(super) running_pods: Gauge,
    pub(super) running_containers: Family<ContainerStateLabel, Gauge>,
    pub(super) working_pods: Family<WorkingLabels, Gauge>,
    pub(super) cgroup_manager_duration: HistogramFamily<OperationType>,
    pub(super) memory_qos_min: Gauge,
    pub(super) memory_qos_low: Gauge,
}

impl PodFamilies {
    /// Registered in `registry`, in /metrics order.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let started_pods = Counter::default();
        registry.register(
            "kubelet_started_pods",
            "Cumulative number of pods started",
            started_pods.clone(),
        );
        let started_pods_errors = Counter::default();
        registry.register(
            "kubelet_started_pods_errors",
            "Cumulative number of errors when starting pods",
            started_pods_errors.clone(),
        );
        let started_containers = Family::<ContainerType, Counter>::default();
        registry.register(
            "kubelet_started_containers",
            "Cumulative number of containers started",
            started_containers.clone(),
        );
        let pod_start_duration = Histogram::new(POD_START_BUCKETS);
        registry.register(
            "kubelet_pod_start_duration_seconds",
            "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            pod_start_duration.clone(),
        );
        let pod_worker_duration: HistogramFamily<OperationType> =
            Family::new_with_constructor(def_histogram);
        registry.register(
            "kubelet_pod_worker_duration_seconds",
            "Duration in seconds to sync a single pod. Broken down by operation type: sync or kill",
            pod_worker_duration.clone(),
        );
        let pleg_relist_duration = def_histogram();
        registry.register(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG.",
            pleg_relist_duration.clone(),
        );
        let pleg_relist_interval = def_histogram();
        registry.register(
            "kubelet_pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG.",
            pleg_relist_interval.clone(),
        );
        let pleg_last_seen = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "kubelet_pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active.",
            pleg_last_seen.clone(),
        );
        let running_pods = Gauge::default();
        registry.register(
            "kubelet_running_pods",
            "Number of pods that have a running pod sandbox",
            running_pods.clone(),
        );
        let running_containers = Family::<ContainerStateLabel, Gauge>::default();
        registry.register(
            "kubelet_running_containers",
            "Number of containers currently running",
            running_containers.clone(),
        );
        let working_pods = Family::<WorkingLabels, Gauge>::default();
        registry.register(
            "kubelet_working_pods",
            "Number of pods the kubelet is actually running, broken down by lifecycle phase, whether the pod is desired, orphaned, or runtime only (also orphaned), and whether the pod is static. An orphaned pod has been removed from local configuration or force deleted in the API and consumes resources that are not otherwise visible.",
            working_pods.clone(),
        );
        let cgroup_manager_duration: HistogramFamily<OperationType> =
            Family::new_with_constructor(def_histogram);
        registry.register(
            "kubelet_cgroup_manager_duration_seconds",
            "Duration in seconds for cgroup manager operations. Broken down by method.",
            cgroup_manager_duration.clone(),
        );
        let memory_qos_min = Gauge::default();
        registry.register(
            "kubelet_memory_qos_node_memory_min_bytes",
            "[ALPHA] Total memory.min in bytes for Guaranteed pods",
            memory_qos_min.clone(),
        );
        let memory_qos_low = Gauge::default();
        registry.register(
            "kubelet_memory_qos_node_memory_low_bytes",
            "[ALPHA] Total memory.low in bytes for Burstable pods",
            memory_qos_low.clone(),
        );
        Self {
            memory_qos_min,
            memory_qos_low,
            started_pods,
            started_pods_errors,
            started_containers,
            pod_start_duration,
            pod_worker_duration,
            pleg_relist_duration,
            pleg_relist_interval,
            pleg_last_seen,
            running_pods,
            running_containers,
            working_pods,
            cgroup_manager_duration,
        }
    }
}

/// The families of evictions and preemptions, the signal and eviction latencies, the kernel's OOM kills.
#[derive(Debug)]
pub(super) struct EvictionFamilies {
    pub(super) evictions: Family<EvictionSignal, Counter>,
    pub(super) own_evictions: Family<EvictionSignal, Counter>,
    pub(super) eviction_stats_age: HistogramFamily<EvictionSignal>,
    pub(super) preemptions: Family<PreemptionSignal, Counter>,
    pub(super) signal_delay: HistogramFamily<Source>,
    pub(super) crossing_to_decision: HistogramFamily<EvictionSignal>,
    pub(super) decision_to_sigkill: Histogram,
    pub(super) sigkill_to_released: Histogram,
    pub(super) oom_kills: Family<QosClass, Counter>,
}

impl EvictionFamilies {
    /// Registered in `registry`, in /metrics order.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let evictions = Family::<EvictionSignal, Counter>::default();
        registry.register(
            "kubelet_evictions",
            "Cumulative number of pod evictions by eviction signal",
            evictions.clone(),
        );
        let own_evictions = Family::<EvictionSignal, Counter>::default();
        registry.register(
            "enforcer_evictions",
            "Pod evictions this enforcer made, by eviction signal (kubelet_evictions under the \
             enforcer's name: a companion serves only its own families)",
            own_evictions.clone(),
        );
        let eviction_stats_age: HistogramFamily<EvictionSignal> =
            Family::new_with_constructor(def_histogram);
        registry.register(
            "kubelet_eviction_stats_age_seconds",
            "Time between when stats are collected, and when pod is evicted based on those stats by eviction signal",
            eviction_stats_age.clone(),
        );
        let preemptions = Family::<PreemptionSignal, Counter>::default();
        registry.register(
            "kubelet_preemptions",
            "Cumulative number of pod preemptions by preemption resource",
            preemptions.clone(),
        );
        let signal_delay: HistogramFamily<Source> = Family::new_with_constructor(latency_histogram);
        registry.register(
            "enforcer_signal_delay_seconds",
            "Delay from the kernel's timestamp of a signal to the daemon receiving it, by signal source.",
            signal_delay.clone(),
        );
        let crossing_to_decision: HistogramFamily<EvictionSignal> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "enforcer_eviction_crossing_to_decision_seconds",
            "Time from a threshold crossing (the signal's kernel timestamp) to the eviction decision, by eviction signal.",
            crossing_to_decision.clone(),
        );
        let decision_to_sigkill = latency_histogram();
        registry.register(
            "enforcer_eviction_decision_to_sigkill_seconds",
            "Time from the eviction decision to SIGKILL reaching the victim's processes.",
            decision_to_sigkill.clone(),
        );
        let sigkill_to_released = latency_histogram();
        registry.register(
            "enforcer_eviction_sigkill_to_memory_released_seconds",
            "Time from SIGKILL to the victim's memory being released (its cgroup emptied).",
            sigkill_to_released.clone(),
        );
        let oom_kills = Family::<QosClass, Counter>::default();
        registry.register(
            "enforcer_kernel_oom_kills",
            "Kernel OOM kills seen in pods, by the pod's QoS class.",
            oom_kills.clone(),
        );
        Self {
            evictions,
            own_evictions,
            eviction_stats_age,
            preemptions,
            signal_delay,
            crossing_to_decision,
            decision_to_sigkill,
            sigkill_to_released,
            oom_kills,
        }
    }
}
