//! Cgroup values for pods, containers, QoS tiers and `kubepods` (cgroupfs driver).
//!
//! Kubelet: `pkg/kubelet/cm/helpers_linux.go` (`MilliCPUToShares`, `MilliCPUToQuota`,
//! `ResourceConfigForPod`, `CpuSharesToCpuWeight`), `pkg/kubelet/kuberuntime/
//! kuberuntime_container_linux.go` (`calculateLinuxResources`, Memory QoS),
//! `pkg/kubelet/cm/qos_container_manager_linux.go`.

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Serialize;

use super::{container_limits, container_requests, pod_limits_with, pod_requests, pod_uid};
use crate::{
    policy::{
        cgroup_name::{self, CgroupDriver},
        qos::{self, QosClass},
        swap::SwapOptions,
    },
    quantity::Quantity,
};

/// Minimum cpu.shares.
pub const MIN_SHARES: u64 = 2;
/// Maximum cpu.shares.
pub const MAX_SHARES: u64 = 262_144;
/// Default CFS period, in microseconds.
pub const QUOTA_PERIOD_US: u64 = 100_000;
/// Minimum CFS quota, in microseconds.
pub const MIN_QUOTA_PERIOD_US: i64 = 1000;
/// Page size used to round `memory.high`.
pub const PAGE_SIZE: i64 = 4096;

/// `MilliCPUToShares`.
#[must_use]
pub fn milli_cpu_to_shares(milli_cpu: i64) -> u64 {
    if milli_cpu <= 0 {
        return MIN_SHARES;
    }
    let shares = i128::from(milli_cpu) * 1024 / 1000;
    u64::try_from(shares)
        .unwrap_or(MAX_SHARES)
        .clamp(MIN_SHARES, MAX_SHARES)
}

/// `MilliCPUToQuota`: `None` (unset) for 0 millicores, else at least 1000 us.
#[must_use]
pub fn milli_cpu_to_quota(milli_cpu: i64, period_us: u64) -> Option<i64> {
    if milli_cpu <= 0 {
        return None;
    }
    let quota = i128::from(milli_cpu) * i128::from(period_us) / 1000;
    Some(
        i64::try_from(quota)
            .unwrap_or(i64::MAX)
            .max(MIN_QUOTA_PERIOD_US),
    )
}

/// `CpuSharesToCpuWeight` (cgroup v2 `cpu.weight`).
#[must_use]
pub fn shares_to_weight(shares: u64) -> u64 {
    1 + (shares.saturating_sub(2) * 9999) / 262_142
}

/// The cgroup parent of a pod under `cgroup_root`, in `driver`'s names (kubelet's
/// `GetPodContainerName`); a uid that is not one cgroup component is written as it is, for
/// the runtime to refuse.
#[must_use]
pub fn pod_cgroup_parent(
    driver: CgroupDriver,
    cgroup_root: &str,
    qos: QosClass,
    uid: &str,
) -> String {
    let name = cgroup_name::pod(cgroup_root, qos, uid)
        .unwrap_or_else(|_| cgroup_name::qos_tier(cgroup_root, qos).child(&format!("pod{uid}")));
    driver.name(&name)
}

/// Values for a pod's cgroup (`ResourceConfigForPod`). `None` means not set / unlimited.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodCgroupValues {
    /// cgroup v1 cpu.shares.
    pub cpu_shares: u64,
    /// cgroup v2 cpu.weight (None on cgroup v1).
    pub cpu_weight: Option<u64>,
    /// CFS quota in microseconds.
    pub cpu_quota_micros: Option<i64>,
    /// CFS period in microseconds.
    pub cpu_period_micros: Option<u64>,
    /// Memory limit in bytes.
    pub memory_limit_bytes: Option<i64>,
    /// Memory QoS `memory.min` (cgroup v2, `TieredReservation`, Guaranteed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_min_bytes: Option<i64>,
    /// Memory QoS `memory.low` (cgroup v2, `TieredReservation`, Burstable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_low_bytes: Option<i64>,
    /// `pids.max` (`podPidsLimit` when positive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<i64>,
}

/// Options for the cgroup computations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CgroupOptions {
    /// cgroup v2 (unified) rather than v1.
    pub v2: bool,
    /// `cpuCFSQuota`: enforce cpu limits with CFS quota.
    pub enforce_cpu_limits: bool,
    /// CFS period in microseconds.
    pub cpu_period_us: u64,
    /// Memory QoS (the `MemoryQoS` gate, cgroup v2 only).
    pub memory_qos: bool,
    /// `memoryThrottlingFactor`: `memory.high` of containers only when set (kubelet 1.37).
    pub memory_throttling_factor: Option<f64>,
    /// `memoryReservationPolicy: TieredReservation`: `memory.min` of Guaranteed pods and
    /// containers, `memory.low` of Burstable ones, from their memory requests.
    pub tiered_reservation: bool,
    /// Node allocatable memory (for `memory.high` of containers without a limit).
    pub allocatable_memory: i64,
    /// `singleProcessOOMKill`; when false on cgroup v2 each container gets
    /// `memory.oom.group = 1`.
    pub single_process_oom_kill: bool,
    /// `podPidsLimit`: the pod cgroup's `pids.max` when positive.
    pub pod_pids_limit: i64,
    /// Node swap: `memorySwap.swapBehavior`, the swap controller, the node's memory and swap.
    pub swap: SwapOptions,
}

impl Default for CgroupOptions {
    fn default() -> Self {
        Self {
            v2: true,
            enforce_cpu_limits: true,
            cpu_period_us: QUOTA_PERIOD_US,
            memory_qos: false,
            memory_throttling_factor: None,
            tiered_reservation: false,
            allocatable_memory: 0,
            single_process_oom_kill: false,
            pod_pids_limit: -1,
            swap: SwapOptions::default(),
        }
    }
}

/// `ResourceConfigForPod` for the pod's own cgroup.
pub fn pod_cgroup_values(pod: &Pod, opts: &CgroupOptions) -> PodCgroupValues {
    let reqs = pod_requests(pod);
    let mut cpu_limits_declared = true;
    let mut memory_limits_declared = true;
    let limits = pod_limits_with(pod, |l| {
        if l.get("cpu").is_none_or(|q| q.is_zero()) {
            cpu_limits_declared = false;
        }
        if l.get("memory").is_none_or(|q| q.is_zero()) {
            memory_limits_declared = false;
        }
    });
    if let Some(pl) = super::pod_level(pod).and_then(|r| r.limits.as_ref()) {
        if pl.get("cpu").is_some_and(|q| !super::lenient(q).is_zero()) {
            cpu_limits_declared = true;
        }
        if pl
            .get("memory")
            .is_some_and(|q| !super::lenient(q).is_zero())
        {
            memory_limits_declared = true;
        }
    }
    let cpu_requests = reqs.get("cpu").map_or(0, |q| q.milli_value());
    let cpu_limits = limits.get("cpu").map_or(0, |q| q.milli_value());
    let memory_limits = limits.get("memory").map_or(0, |q| q.value());
    let shares = milli_cpu_to_shares(cpu_requests);
    let quota = if opts.enforce_cpu_limits {
        milli_cpu_to_quota(cpu_limits, opts.cpu_period_us)
    } else {
        None
    };
    let qos = qos::pod_qos(pod);
    let (cpu_shares, cpu_quota, cpu_period, memory) = match qos {
        QosClass::Guaranteed => (shares, quota, Some(opts.cpu_period_us), Some(memory_limits)),
        QosClass::Burstable => (
            shares,
            if cpu_limits_declared { quota } else { None },
            cpu_limits_declared.then_some(opts.cpu_period_us),
            memory_limits_declared.then_some(memory_limits),
        ),
        QosClass::BestEffort => (MIN_SHARES, None, None, None),
    };
    let (memory_min, memory_low) = tiered_reservation(opts, qos, reqs.get("memory"));
    PodCgroupValues {
        cpu_shares,
        cpu_weight: opts.v2.then(|| shares_to_weight(cpu_shares)),
        cpu_quota_micros: cpu_quota,
        // The period is always written with the quota; report it as kubelet's ResourceConfig does.
        cpu_period_micros: cpu_period.or(Some(opts.cpu_period_us)),
        memory_limit_bytes: memory.filter(|m| *m != 0),
        memory_min_bytes: memory_min,
        memory_low_bytes: memory_low,
        // kubelet's pod container manager sets PidsLimit only when podPidsLimit > 0.
        pids_limit: (opts.pod_pids_limit > 0).then_some(opts.pod_pids_limit),
    }
}

/// Values for one container (`calculateLinuxResources` + Memory QoS).
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerCgroupValues {
    /// cpu.shares.
    pub cpu_shares: u64,
    /// CFS quota in microseconds.
    pub cpu_quota_micros: Option<i64>,
    /// Memory limit in bytes.
    pub memory_limit_bytes: Option<i64>,
    /// Memory QoS `memory.min` (`TieredReservation`, Guaranteed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_min_bytes: Option<i64>,
    /// Memory QoS `memory.low` (`TieredReservation`, Burstable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_low_bytes: Option<i64>,
    /// Memory QoS `memory.high`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_high_bytes: Option<i64>,
}

/// kubelet's `getCPULimit` / `getMemoryLimit`: the container's limit of `resource`; when it
/// has none (or zero) and the pod has pod-level resources, the pod-level limit (zero when
/// that is unset too).
fn effective_limit(pod: Option<&Pod>, lims: &super::ResourceList, resource: &str) -> Quantity {
    let own = lims.get(resource).copied().unwrap_or_default();
    match pod {
        Some(p) if own.is_zero() && super::is_pod_level_resources_set(p) => super::pod_level(p)
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(resource))
            .map(super::lenient)
            .unwrap_or_default(),
        _ => own,
    }
}

/// `calculateLinuxResources` for one container, plus Memory QoS values when enabled.
pub fn container_cgroup_values(
    container: &Container,
    opts: &CgroupOptions,
) -> ContainerCgroupValues {
    container_values(None, container, opts)
}

/// `generateLinuxContainerResources`' values for `container` of `pod`: as
/// [`container_cgroup_values`], with a missing container cpu or memory limit taken from the
/// pod-level limits (KEP-2837).
pub fn container_cgroup_values_in(
    pod: &Pod,
    container: &Container,
    opts: &CgroupOptions,
) -> ContainerCgroupValues {
    container_values(Some(pod), container, opts)
}

fn container_values(
    pod: Option<&Pod>,
    container: &Container,
    opts: &CgroupOptions,
) -> ContainerCgroupValues {
    let reqs = container_requests(container);
    let lims = container_limits(container);
    let cpu_limit = effective_limit(pod, &lims, "cpu").milli_value();
    // kubelet: no cpu request -> shares from the (effective) cpu limit, 2 when that is 0.
    let cpu_shares = match reqs.get("cpu") {
        None => milli_cpu_to_shares(cpu_limit),
        Some(r) => milli_cpu_to_shares(r.milli_value()),
    };
    let memory_limit = effective_limit(pod, &lims, "memory").value();
    // Memory QoS reads the container's own limit (kubelet's `container.Resources.Limits`).
    let own_memory_limit = lims.get("memory").map_or(0, |q| q.value());
    let cpu_quota = if opts.enforce_cpu_limits {
        milli_cpu_to_quota(cpu_limit, opts.cpu_period_us)
    } else {
        None
    };
    let (memory_min, memory_low) = match pod {
        Some(p) => tiered_reservation(opts, qos::pod_qos(p), reqs.get("memory")),
        None => (None, None),
    };
    let mut memory_high = None;
    if opts.v2
        && opts.memory_qos
        && let Some(factor) = opts.memory_throttling_factor
    {
        let request = reqs.get("memory").map_or(0, |q| q.value());
        // kubelet (since kubernetes#138139): skipped only for an equal, positive request and
        // limit; a BestEffort container (both 0) is throttled below node allocatable.
        if request != own_memory_limit || request == 0 {
            let base = if own_memory_limit != 0 {
                own_memory_limit
            } else {
                opts.allocatable_memory
            };
            if base > 0 {
                #[expect(
                    clippy::cast_precision_loss,
                    clippy::cast_possible_truncation,
                    reason = "kubelet computes memory.high in float64"
                )]
                let high = ((request as f64 + (base as f64 - request as f64) * factor)
                    / PAGE_SIZE as f64)
                    .floor() as i64
                    * PAGE_SIZE;
                if high != 0 && high > request {
                    memory_high = Some(high);
                }
            }
        }
    }
    ContainerCgroupValues {
        cpu_shares,
        cpu_quota_micros: cpu_quota,
        memory_limit_bytes: (memory_limit != 0).then_some(memory_limit),
        memory_min_bytes: memory_min,
        memory_low_bytes: memory_low,
        memory_high_bytes: memory_high,
    }
}

/// Whether a kernel release (`uname -r`: `5.4.0-150-generic`, `6.1.0-57-amd64`) is older than
/// `major.minor`; a release that does not parse is not (nothing to warn of).
#[must_use]
pub fn kernel_before(release: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(a)), Some(Ok(b))) => (a, b) < (major, minor),
        _ => false,
    }
}

/// `memoryReservationPolicy: TieredReservation` (kubelet 1.36+, Memory QoS on cgroup v2):
/// (`memory.min`, `memory.low`) of a cgroup whose memory request is `request` in a pod of
/// class `qos`: Guaranteed protects its request with `memory.min`, Burstable with
/// `memory.low`, BestEffort nothing; nothing without a request or under `None`.
fn tiered_reservation(
    opts: &CgroupOptions,
    qos: QosClass,
    request: Option<&crate::quantity::Quantity>,
) -> (Option<i64>, Option<i64>) {
    if !(opts.v2 && opts.memory_qos && opts.tiered_reservation) {
        return (None, None);
    }
    let Some(r) = request
        .map(crate::quantity::Quantity::value)
        .filter(|v| *v > 0)
    else {
        return (None, None);
    };
    match qos {
        QosClass::Guaranteed => (Some(r), None),
        QosClass::Burstable => (None, Some(r)),
        QosClass::BestEffort => (None, None),
    }
}

/// The QoS-tier cgroups: besteffort shares 2, burstable shares from the sum of the cpu
/// requests of the Burstable pods (`setCPUCgroupConfig`).
#[must_use]
pub fn burstable_tier_shares<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> u64 {
    let milli: i64 = pods
        .into_iter()
        .filter(|p| qos::pod_qos(p) == QosClass::Burstable)
        .map(|p| pod_requests(p).get("cpu").map_or(0, |q| q.milli_value()))
        .fold(0i64, i64::saturating_add);
    milli_cpu_to_shares(milli)
}

/// The pod's cgroup parent under `cgroup_root`.
#[must_use]
pub fn cgroup_parent_of(pod: &Pod, driver: CgroupDriver, cgroup_root: &str) -> String {
    pod_cgroup_parent(driver, cgroup_root, qos::pod_qos(pod), pod_uid(pod))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::resources::test_pods::{container, pod};

    #[test]
    fn shares_quota_weight() {
        // After pkg/kubelet/cm/helpers_linux_test.go.
        for (m, s) in [
            (0, 2),
            (1, 2),
            (2, 2),
            (100, 102),
            (1000, 1024),
            (500, 512),
            (300_000, 262_144),
        ] {
            assert_eq!(milli_cpu_to_shares(m), s, "{m}");
        }
        for (m, q) in [
            (0, None),
            (5, Some(1000)),
            (9, Some(1000)),
            (10, Some(1000)),
            (200, Some(20000)),
            (500, Some(50000)),
        ] {
            assert_eq!(milli_cpu_to_quota(m, QUOTA_PERIOD_US), q, "{m}");
        }
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10000);
    }

    #[test]
    fn pod_values_by_qos() {
        let opts = CgroupOptions::default();
        let g = pod(
            "g",
            vec![container("a", "cpu=1,memory=1Gi", "cpu=1,memory=1Gi")],
        );
        let v = pod_cgroup_values(&g, &opts);
        assert_eq!(
            (v.cpu_shares, v.cpu_quota_micros, v.memory_limit_bytes),
            (1024, Some(100_000), Some(1 << 30))
        );
        let b = pod(
            "b",
            vec![
                container("a", "memory=100Mi", "memory=1Gi"),
                container("b", "cpu=200m", ""),
            ],
        );
        let v = pod_cgroup_values(&b, &opts);
        assert_eq!(
            (v.cpu_shares, v.cpu_quota_micros, v.memory_limit_bytes),
            (204, None, None)
        );
        let be = pod("e", vec![container("a", "", "")]);
        assert_eq!(pod_cgroup_values(&be, &opts).cpu_shares, 2);
        let fs = CgroupDriver::Cgroupfs;
        assert_eq!(
            cgroup_parent_of(&b, fs, "/"),
            "/kubepods/burstable/poduid-b"
        );
        assert_eq!(cgroup_parent_of(&g, fs, "/"), "/kubepods/poduid-g");
        assert_eq!(
            cgroup_parent_of(&b, CgroupDriver::Systemd, "/"),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poduid_b.slice"
        );
        let c = container("a", "memory=100Mi", "memory=1Gi");
        let v = container_cgroup_values(
            &c,
            &CgroupOptions {
                memory_qos: true,
                memory_throttling_factor: Some(0.9),
                ..opts
            },
        );
        assert_eq!(v.memory_min_bytes, None, "memoryReservationPolicy None");
        // floor((100Mi + 0.9 * (1Gi - 100Mi)) / 4096) * 4096
        assert_eq!(v.memory_high_bytes, Some(976_850_944));
    }

    /// kubelet's Memory QoS warning: a kernel older than 5.9.
    #[test]
    fn kernel_releases_before_5_9() {
        assert!(kernel_before("5.4.0-150-generic", (5, 9)));
        assert!(kernel_before("4.19.0", (5, 9)));
        assert!(!kernel_before("5.9.0", (5, 9)));
        assert!(!kernel_before("5.10.0-28-amd64", (5, 9)));
        assert!(!kernel_before("6.1.0-57-amd64", (5, 9)));
        assert!(!kernel_before("garbage", (5, 9)));
    }

    /// kubelet 1.37's Memory QoS: its defaults (the gate on, `memoryThrottlingFactor` unset,
    /// `memoryReservationPolicy: None`) write nothing; the factor gives `memory.high` (never
    /// for a container whose positive request equals its limit; a BestEffort container's from
    /// node allocatable, kubelet's `BestEffortUsesNodeAllocatableForMemoryHigh`); `TieredReservation` gives Guaranteed
    /// pods and containers `memory.min` and Burstable ones `memory.low` of their requests,
    /// BestEffort nothing; cgroup v1 nothing at all.
    #[test]
    fn memory_qos_as_kubelet_1_37_writes_it() {
        let g = pod(
            "g",
            vec![container("a", "cpu=1,memory=100Mi", "cpu=1,memory=100Mi")],
        );
        let b = pod("b", vec![container("a", "memory=64Mi", "memory=256Mi")]);
        let bn = pod("n", vec![container("a", "memory=64Mi", "")]);
        let be = pod("e", vec![container("a", "", "")]);
        let on = CgroupOptions {
            memory_qos: true,
            allocatable_memory: 1 << 30,
            ..CgroupOptions::default()
        };
        let tiered = CgroupOptions {
            tiered_reservation: true,
            ..on
        };
        let factor = CgroupOptions {
            memory_throttling_factor: Some(0.5),
            ..on
        };
        let mem = |p: &Pod, o: &CgroupOptions| {
            let pv = pod_cgroup_values(p, o);
            let cv =
                container_cgroup_values_in(p, &p.spec.as_ref().expect("spec").containers[0], o);
            (
                (pv.memory_min_bytes, pv.memory_low_bytes),
                (
                    cv.memory_min_bytes,
                    cv.memory_low_bytes,
                    cv.memory_high_bytes,
                ),
            )
        };
        let mi = |v: i64| Some(v << 20);
        for (name, p, o, want) in [
            (
                "defaults, Guaranteed",
                &g,
                on,
                ((None, None), (None, None, None)),
            ),
            (
                "defaults, Burstable",
                &b,
                on,
                ((None, None), (None, None, None)),
            ),
            (
                "tiered, Guaranteed",
                &g,
                tiered,
                ((mi(100), None), (mi(100), None, None)),
            ),
            (
                "tiered, Burstable",
                &b,
                tiered,
                ((None, mi(64)), (None, mi(64), None)),
            ),
            (
                "tiered, BestEffort",
                &be,
                tiered,
                ((None, None), (None, None, None)),
            ),
            // floor((64Mi + 0.5 * (256Mi - 64Mi)) / 4096) * 4096 = 160Mi
            (
                "factor, Burstable",
                &b,
                factor,
                ((None, None), (None, None, mi(160))),
            ),
            (
                "factor, Guaranteed",
                &g,
                factor,
                ((None, None), (None, None, None)),
            ),
            // No limit: allocatable (1Gi) in its place: 64Mi + 0.5 * (1Gi - 64Mi).
            (
                "factor, no limit",
                &bn,
                factor,
                ((None, None), (None, None, mi(544))),
            ),
            // Request = limit = 0 (kubernetes#138139): allocatable x factor, 512Mi.
            (
                "factor, BestEffort",
                &be,
                factor,
                ((None, None), (None, None, mi(512))),
            ),
            (
                "cgroup v1",
                &b,
                CgroupOptions {
                    v2: false,
                    tiered_reservation: true,
                    memory_throttling_factor: Some(0.5),
                    ..on
                },
                ((None, None), (None, None, None)),
            ),
            (
                "gate off",
                &g,
                CgroupOptions {
                    memory_qos: false,
                    ..tiered
                },
                ((None, None), (None, None, None)),
            ),
        ] {
            assert_eq!(mem(p, &o), want, "{name}");
        }
    }
}
