//! The daemon's metrics: one [`Metrics`] registry with kubelet's instruments (same names,
//! labels and buckets as `pkg/kubelet/metrics`) and the enforcer's own (`enforcer_`), exposed
//! as OpenMetrics text on `/metrics` (see [`crate::server`]).
//!
//! As kubelet's legacy registry, the registry is process-wide ([`global`]): the CRI client,
//! the relister, the pod workers and the eviction manager record into it without a handle
//! being threaded through. What is a view of the node's state (pods desired and active, node
//! conditions, the signal pipeline's counters) is read at scrape time by `crate::pods::NodeStateCollector`.
//!
//! OpenMetrics names every counter `<name>_total`: kubelet's `kubelet_evictions` and
//! `kubelet_preemptions` are therefore scraped as `kubelet_evictions_total` and
//! `kubelet_preemptions_total` (what Prometheus' Go client serves in OpenMetrics too).

pub mod exposition;
mod families;
pub mod probes;
mod working_pods;

use families::*;

use crate::locks::lock;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use prometheus_client::registry::Registry;

pub use working_pods::{WorkingConfig, WorkingLifecycle, WorkingPod, WorkingPods};

use crate::policy::pod_actions::{ContainerKind, PodPhase};

/// Prometheus' default buckets (`prometheus.DefBuckets`).
pub const DEF_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// kubelet's `podStartupDurationBuckets`.
pub const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];
/// Buckets of the enforcer's latency chain (signal -> decision -> SIGKILL -> memory
/// released): 10 us to 10 s, the range between an eBPF signal and a housekeeping tick.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.5, 2.0, 10.0,
];

#[derive(Debug)]
struct Inner {
    registry: Registry,
    runtime: RuntimeFamilies,
    pods: PodFamilies,
    eviction: EvictionFamilies,
    /// When each pod was first seen, until it runs (kubelet's pod start duration).
    first_seen: Mutex<HashMap<String, Instant>>,
    last_relist: Mutex<Option<Instant>>,
}

/// Pods remembered for `kubelet_pod_start_duration_seconds` at most (pods that never run and
/// are never reported gone cannot grow the map without bound).
const FIRST_SEEN_MAX: usize = 10_000;

/// The registry and its instruments; a cheap handle (`Arc`).
#[derive(Clone, Debug)]
pub struct Metrics(Arc<Inner>);

/// The process-wide registry (kubelet's `legacyregistry`).
#[must_use]
pub fn global() -> &'static Metrics {
    static GLOBAL: OnceLock<Metrics> = OnceLock::new();
    GLOBAL.get_or_init(Metrics::new)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every instrument registered (tests make their own; the daemon uses
    /// [`global`]).
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let runtime = RuntimeFamilies::register(&mut registry);
        let pods = PodFamilies::register(&mut registry);
        let eviction = EvictionFamilies::register(&mut registry);
        Self(Arc::new(Inner {
            registry,
            runtime,
            pods,
            eviction,
            first_seen: Mutex::new(HashMap::new()),
            last_relist: Mutex::new(None),
        }))
    }

    /// The registry (to encode).
    #[must_use]
    pub fn registry(&self) -> &Registry {
        &self.0.registry
    }

    // --- the container runtime (CRI client) ---

    /// Times one CRI call `method` (its gRPC name, e.g. `RunPodSandbox`): counted in
    /// `kubelet_runtime_operations_total` and timed when the guard drops; an error unless
    /// [`RuntimeOperation::ok`] was called. `RunPodSandbox` also counts
    /// `kubelet_started_pods_total` (and its errors), as kubelet counts every attempt.
    pub fn runtime_operation(&self, method: &'static str) -> RuntimeOperation {
        let operation_type = operation_type(method);
        self.0
            .runtime
            .runtime_operations
            .get_or_create(&OperationType {
                operation_type: operation_type.to_owned(),
            })
            .inc();
        if method == "RunPodSandbox" {
            self.0.pods.started_pods.inc();
        }
        RuntimeOperation {
            metrics: self.clone(),
            method,
            start: Instant::now(),
            ok: false,
        }
    }

    /// An image was pulled: `kubelet_image_pull_duration_seconds` (the time including the
    /// wait for a pull slot) by the image's size bucket.
    pub fn image_pulled(&self, size: u64, elapsed: Duration) {
        self.0
            .runtime
            .image_pull_duration
            .get_or_create(&ImageSize {
                image_size_in_bytes: crate::policy::images::image_size_bucket(size).to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// An image was removed by the collector (`reason`: `age` or `space`).
    pub fn image_garbage_collected(&self, reason: &str) {
        self.0
            .runtime
            .image_garbage_collected
            .get_or_create(&GcReason {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// A container is about to be created and started (`kubelet_started_containers_total`).
    pub fn container_started(&self, kind: ContainerKind) {
        let container_type = match kind {
            ContainerKind::Regular => "container",
            ContainerKind::Init | ContainerKind::Sidecar => "init_container",
        };
        self.0
            .pods
            .started_containers
            .get_or_create(&ContainerType {
                container_type: container_type.to_owned(),
            })
            .inc();
    }

    // --- pod workers ---

    /// Times one pod worker operation (`sync`, `kill`) until the guard drops.
    pub fn pod_worker(&self, operation_type: &'static str) -> Timer {
        Timer::new(self.clone(), TimerKind::PodWorker(operation_type))
    }

    /// Times one cgroup manager operation (`create`, `update`, `destroy`) until the guard
    /// drops.
    pub fn cgroup_manager(&self, operation_type: &'static str) -> Timer {
        Timer::new(self.clone(), TimerKind::CgroupManager(operation_type))
    }

    /// Runs `f` as one cgroup manager operation (`create`, `update`, `destroy`).
    pub fn time_cgroup_manager<T>(&self, operation_type: &'static str, f: impl FnOnce() -> T) -> T {
        let _timer = self.cgroup_manager(operation_type);
        f()
    }

    /// A pod's worker was created: the start of `kubelet_pod_start_duration_seconds`.
    pub fn pod_seen(&self, uid: &str) {
        let mut seen = lock(&self.0.first_seen);
        if seen.len() < FIRST_SEEN_MAX {
            seen.entry(uid.to_owned()).or_insert_with(Instant::now);
        }
    }

    /// A pod's status phase, published: the first `Running` of a pod seen by
    /// [`Self::pod_seen`] ends its start duration; a terminal phase forgets it.
    pub fn pod_phase(&self, uid: &str, phase: PodPhase) {
        if phase == PodPhase::Pending {
            return;
        }
        let Some(seen) = lock(&self.0.first_seen).remove(uid) else {
            return;
        };
        if phase == PodPhase::Running {
            self.0
                .pods
                .pod_start_duration
                .observe(seen.elapsed().as_secs_f64());
        }
    }

    // --- the relister (PLEG) ---

    /// Times one relist until the guard drops (`kubelet_pleg_relist_duration_seconds`), and
    /// records the interval since the previous one.
    pub fn pleg_relist(&self) -> Timer {
        let now = Instant::now();
        if let Some(prev) = lock(&self.0.last_relist).replace(now) {
            self.0
                .pods
                .pleg_relist_interval
                .observe(now.duration_since(prev).as_secs_f64());
        }
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.0.pods.pleg_last_seen.set(unix);
        Timer::new(self.clone(), TimerKind::PlegRelist)
    }

    /// Memory QoS's `TieredReservation` totals (kubelet 1.36's alpha gauges): `memory.min` of
    /// the Guaranteed pods, `memory.low` of the Burstable ones (0 under `None`).
    pub fn memory_qos(&self, min: i64, low: i64) {
        self.0.pods.memory_qos_min.set(min);
        self.0.pods.memory_qos_low.set(low);
    }

    /// What a relist found: pod sandboxes ready (`kubelet_running_pods`) and containers by
    /// state (`kubelet_running_containers{container_state}`).
    pub fn relisted(
        &self,
        sandboxes: &[k8s_cri::v1::PodSandbox],
        containers: &[k8s_cri::v1::Container],
    ) {
        use k8s_cri::v1::{ContainerState as S, PodSandboxState};
        let ready = sandboxes
            .iter()
            .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
            .count();
        self.0
            .pods
            .running_pods
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
        for (state, name) in [
            (S::ContainerCreated, "created"),
            (S::ContainerRunning, "running"),
            (S::ContainerExited, "exited"),
            (S::ContainerUnknown, "unknown"),
        ] {
            let n = containers
                .iter()
                .filter(|c| c.state == state as i32)
                .count();
            self.0
                .pods
                .running_containers
                .get_or_create(&ContainerStateLabel {
                    container_state: name.to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The pod workers by lifecycle, config and static (`kubelet_working_pods`): every one
    /// of kubelet's 15 series is set, 0 when no worker is in it (kubelet's
    /// `HandlePodCleanups` sets them so).
    pub fn working_pods(&self, counts: &WorkingPods) {
        for (config, statics) in [
            (WorkingConfig::Desired, &[Some(false), Some(true)][..]),
            (WorkingConfig::Orphan, &[Some(false), Some(true)][..]),
            (WorkingConfig::RuntimeOnly, &[None][..]),
        ] {
            for &is_static in statics {
                for lifecycle in [
                    WorkingLifecycle::Sync,
                    WorkingLifecycle::Terminating,
                    WorkingLifecycle::Terminated,
                ] {
                    let n = counts.get(WorkingPod {
                        lifecycle,
                        config,
                        is_static,
                    });
                    self.0
                        .pods
                        .working_pods
                        .get_or_create(&WorkingLabels {
                            lifecycle: lifecycle.as_str().to_owned(),
                            config: config.as_str().to_owned(),
                            r#static: is_static
                                .map_or("unknown", |s| if s { "true" } else { "false" })
                                .to_owned(),
                        })
                        .set(n);
                }
            }
        }
    }

    // --- the eviction manager ---

    /// A pod was evicted for `signal` (kubelet's signal name, e.g. `memory.available`):
    /// `kubelet_evictions{eviction_signal}`.
    pub fn eviction(&self, signal: &str) {
        let label = EvictionSignal {
            eviction_signal: signal.to_owned(),
        };
        self.0.eviction.evictions.get_or_create(&label).inc();
        self.0.eviction.own_evictions.get_or_create(&label).inc();
    }

    /// The age of the stats an eviction for `signal` was decided on:
    /// `kubelet_eviction_stats_age_seconds{eviction_signal}`.
    pub fn eviction_stats_age(&self, signal: &str, age: Duration) {
        self.0
            .eviction
            .eviction_stats_age
            .get_or_create(&EvictionSignal {
                eviction_signal: signal.to_owned(),
            })
            .observe(age.as_secs_f64());
    }

    /// A pod was preempted by admission for `resource` (e.g. `memory`):
    /// `kubelet_preemptions{preemption_signal}`.
    pub fn preemption(&self, resource: &str) {
        self.0
            .eviction
            .preemptions
            .get_or_create(&PreemptionSignal {
                preemption_signal: resource.to_owned(),
            })
            .inc();
    }

    /// A signal from `source` (`ebpf`, `eventfd`, `psi`, `poll`) reached the daemon `delay`
    /// after the kernel's timestamp: `enforcer_signal_delay_seconds{source}`.
    pub fn signal_delay(&self, source: &str, delay: Duration) {
        self.0
            .eviction
            .signal_delay
            .get_or_create(&Source {
                source: source.to_owned(),
            })
            .observe(delay.as_secs_f64());
    }

    /// From a threshold crossing (the triggering signal's kernel time) to the eviction
    /// decision for `signal`: `enforcer_eviction_crossing_to_decision_seconds{eviction_signal}`.
    pub fn crossing_to_decision(&self, signal: &str, elapsed: Duration) {
        self.0
            .eviction
            .crossing_to_decision
            .get_or_create(&EvictionSignal {
                eviction_signal: signal.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// From the eviction decision to SIGKILL reaching the victim:
    /// `enforcer_eviction_decision_to_sigkill_seconds`.
    pub fn decision_to_sigkill(&self, elapsed: Duration) {
        self.0
            .eviction
            .decision_to_sigkill
            .observe(elapsed.as_secs_f64());
    }

    /// From SIGKILL to the victim's memory released:
    /// `enforcer_eviction_sigkill_to_memory_released_seconds`.
    pub fn sigkill_to_released(&self, elapsed: Duration) {
        self.0
            .eviction
            .sigkill_to_released
            .observe(elapsed.as_secs_f64());
    }

    /// A kernel OOM kill inside a pod of `qos_class` (`Guaranteed`, `Burstable`,
    /// `BestEffort`): `enforcer_kernel_oom_kills_total{qos_class}`.
    pub fn oom_kill(&self, qos_class: &str) {
        self.0
            .eviction
            .oom_kills
            .get_or_create(&QosClass {
                qos_class: qos_class.to_owned(),
            })
            .inc();
    }
}

/// kubelet's `operation_type` of a CRI method (its `instrumentedRuntimeService` names).
#[must_use]
pub fn operation_type(method: &str) -> &'static str {
    match method {
        "Version" => "version",
        "RunPodSandbox" => "run_podsandbox",
        "StopPodSandbox" => "stop_podsandbox",
        "RemovePodSandbox" => "remove_podsandbox",
        "PodSandboxStatus" => "podsandbox_status",
        "ListPodSandbox" => "list_podsandbox",
        "CreateContainer" => "create_container",
        "StartContainer" => "start_container",
        "StopContainer" => "stop_container",
        "RemoveContainer" => "remove_container",
        "ListContainers" => "list_containers",
        "ContainerStatus" => "container_status",
        "UpdateContainerResources" => "update_container_resources",
        "UpdatePodSandboxResources" => "update_podsandbox_resources",
        "ExecSync" => "exec_sync",
        "Status" => "status",
        "ListImages" => "list_images",
        "ImageStatus" => "image_status",
        "PullImage" => "pull_image",
        "RemoveImage" => "remove_image",
        "ImageFsInfo" => "image_fs_info",
        "ContainerStats" => "container_stats",
        "ListContainerStats" => "list_container_stats",
        "PodSandboxStats" => "podsandbox_stats",
        "ListPodSandboxStats" => "list_podsandbox_stats",
        _ => "other",
    }
}

/// A CRI call in flight ([`Metrics::runtime_operation`]).
#[derive(Debug)]
#[must_use]
pub struct RuntimeOperation {
    metrics: Metrics,
    method: &'static str,
    start: Instant,
    ok: bool,
}

impl RuntimeOperation {
    /// The call succeeded; returns `v`.
    pub fn ok<T>(mut self, v: T) -> T {
        self.ok = true;
        v
    }
}

impl Drop for RuntimeOperation {
    fn drop(&mut self) {
        let label = OperationType {
            operation_type: operation_type(self.method).to_owned(),
        };
        let m = &self.metrics.0;
        m.runtime
            .runtime_operations_duration
            .get_or_create(&label)
            .observe(self.start.elapsed().as_secs_f64());
        if !self.ok {
            m.runtime
                .runtime_operations_errors
                .get_or_create(&label)
                .inc();
            if self.method == "RunPodSandbox" {
                m.pods.started_pods_errors.inc();
            }
        }
    }
}

#[derive(Debug)]
enum TimerKind {
    PodWorker(&'static str),
    CgroupManager(&'static str),
    PlegRelist,
}

/// Observes the time from its creation to its drop into one histogram.
#[derive(Debug)]
#[must_use]
pub struct Timer {
    metrics: Metrics,
    kind: TimerKind,
    start: Instant,
}

impl Timer {
    fn new(metrics: Metrics, kind: TimerKind) -> Self {
        Self {
            metrics,
            kind,
            start: Instant::now(),
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        let secs = self.start.elapsed().as_secs_f64();
        let m = &self.metrics.0;
        match self.kind {
            TimerKind::PodWorker(op) => m
                .pods
                .pod_worker_duration
                .get_or_create(&OperationType {
                    operation_type: op.to_owned(),
                })
                .observe(secs),
            TimerKind::CgroupManager(op) => m
                .pods
                .cgroup_manager_duration
                .get_or_create(&OperationType {
                    operation_type: op.to_owned(),
                })
                .observe(secs),
            TimerKind::PlegRelist => m.pods.pleg_relist_duration.observe(secs),
        }
    }
}

/// Whether a pod record's source is not the API server (kubelet's `static` label).
#[must_use]
pub fn is_static(source: &str) -> &'static str {
    if source == "api" { "false" } else { "true" }
}

/// OpenMetrics text of `registries`, in order, ended by `# EOF`.
pub fn encode(registries: &[&Registry]) -> Result<String, std::fmt::Error> {
    let mut raw = String::new();
    for r in registries {
        prometheus_client::encoding::text::encode_registry(&mut raw, r)?;
    }
    prometheus_client::encoding::text::encode_eof(&mut raw)?;
    // prometheus_client ends every help text with a '.' of its own; the help is served as
    // registered (kubelet's and cAdvisor's texts, some with their own '.', some without).
    let mut out = String::with_capacity(raw.len());
    for line in raw.lines() {
        let line = if line.starts_with("# HELP ") {
            line.strip_suffix('.').unwrap_or(line)
        } else {
            line
        };
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

/// The families of an OpenMetrics text whose names start with `prefix` (their `# HELP`,
/// `# TYPE`, `# UNIT` and samples), and the `# EOF`: what a companion serves, so that no
/// family the node's kubelet also serves (`kubelet_*`, `prober_*`, `process_*`, ...) is
/// scraped twice from one node.
#[must_use]
pub fn only_families(text: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let name = line
            .strip_prefix("# HELP ")
            .or_else(|| line.strip_prefix("# TYPE "))
            .or_else(|| line.strip_prefix("# UNIT "))
            .unwrap_or(line);
        if line == "# EOF" || name.starts_with(prefix) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests;
