//! Typed signals: what the kernel (or a fallback source) reported, attributed to a cgroup and,
//! under a kubepods hierarchy, to a pod.

pub mod attribute;
pub mod decode;

pub use attribute::Attributor;
pub use decode::{DecodeError, RawRecord, decode};

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::cgroup::QosTier;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SignalKind {
    /// A cgroup was created.
    CgroupCreated,
    /// A cgroup was removed.
    CgroupRemoved,
    /// A memory cgroup reached its limit and reclaims (eBPF).
    MemcgReclaim,
    /// The node ran short of free memory: direct reclaim (eBPF).
    DirectReclaim,
    /// The kernel OOM killer chose a victim.
    OomKill,
    /// Processes were forked (pid pressure input).
    Fork,
    /// A memory usage threshold was crossed (eventfd or poll).
    MemoryThreshold,
    /// A PSI memory-pressure trigger fired.
    MemoryPressure,
    /// cgroup v2 `memory.events` counted `high` or `max` events.
    MemoryEvents,
    /// Synthetic record of the pipeline probe (benchmarks).
    Probe,
}

/// Which source delivered a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
pub enum SourceKind {
    /// eBPF tracepoints through the BPF ring buffer.
    Ebpf,
    /// cgroup v1 `memory.usage_in_bytes` threshold and `memory.oom_control` eventfds.
    Eventfd,
    /// PSI triggers and cgroup v2 `memory.events`.
    Psi,
    /// Plain polling of cgroup memory usage.
    Poll,
}

impl SourceKind {
    /// Every source, best first.
    pub const ALL: [Self; 4] = [Self::Ebpf, Self::Eventfd, Self::Psi, Self::Poll];

    /// Its name as `enforcer signals` prints it (`ebpf`, `eventfd`, `psi`, `poll`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ebpf => "ebpf",
            Self::Eventfd => "eventfd",
            Self::Psi => "psi",
            Self::Poll => "poll",
        }
    }
}

/// One signal, as the rest of the daemon (and `enforcer signals`) sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Signal {
    pub kind: SignalKind,
    pub source: SourceKind,
    /// CLOCK_MONOTONIC nanoseconds of the kernel event, when the source knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_ns: Option<u64>,
    /// CLOCK_MONOTONIC nanoseconds when the daemon decoded the signal.
    pub received_ns: u64,
    /// Events this signal stands for (a burst folded in the kernel counts them all).
    pub count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// cgroup path relative to its hierarchy's root, e.g. `/kubepods/burstable/pod<uid>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// `unified` or the v1 controllers of the hierarchy the path is in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hierarchy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosTier>,
    /// Event details: allocation order, gfp flags, oom_score_adj, usage, threshold, ...
    #[serde(skip_serializing_if = "Detail::is_empty")]
    pub detail: Detail,
}

/// Kind-specific fields; absent ones are not printed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Detail {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gfp_flags: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_score_adj: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anon_rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold_bytes: Option<u64>,
}

impl Detail {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl Signal {
    /// A signal with only its kind, source and reception time set.
    #[must_use]
    pub fn new(kind: SignalKind, source: SourceKind) -> Self {
        Self {
            kind,
            source,
            kernel_ns: None,
            received_ns: monotonic_ns(),
            count: 1,
            pid: None,
            comm: None,
            cgroup: None,
            hierarchy: None,
            cgroup_id: None,
            pod_uid: None,
            qos: None,
            detail: Detail::default(),
        }
    }

    /// Sets the cgroup path and, when it lies under kubepods, the pod uid and QoS tier.
    pub fn set_cgroup(&mut self, path: String, hierarchy: String) {
        if let Some(pod) = crate::cgroup::pod_of_path(&path) {
            self.pod_uid = Some(pod.uid);
            self.qos = Some(pod.qos);
        }
        self.cgroup = Some(path);
        self.hierarchy = Some(hierarchy);
    }

    /// Delay from the kernel event to reception, when known.
    #[must_use]
    pub fn delay_ns(&self) -> Option<u64> {
        self.kernel_ns.map(|k| self.received_ns.saturating_sub(k))
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
#[must_use]
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Counters of the signal pipeline, shared by the sources and exported as metrics.
#[derive(Debug, Default)]
pub struct PipelineStats {
    /// Records decoded into signals.
    pub decoded: AtomicU64,
    /// Records that could not be decoded (wrong size, unknown kind, other ABI).
    pub malformed: AtomicU64,
    /// Signals dropped because the consumer was behind.
    pub dropped: AtomicU64,
    /// Kernel counters, refreshed from the eBPF statistics map.
    pub kernel_emitted: AtomicU64,
    pub kernel_ring_full: AtomicU64,
    pub kernel_suppressed: AtomicU64,
    pub kernel_seen: AtomicU64,
    /// Charges the crossing check compared with an armed level, and its reads that faulted.
    pub crossing_checks: AtomicU64,
    pub crossing_read_faults: AtomicU64,
    /// Where the crossing check attached (`fexit`, `kprobe`, `tracepoint`), `none` when it
    /// did not; unset when the pipeline runs without eBPF.
    pub crossing_attach: std::sync::OnceLock<&'static str>,
    /// The source the pipeline runs on (`SourceKind::ALL`'s index + 1; 0 before it starts).
    pub active: std::sync::atomic::AtomicU8,
}

impl PipelineStats {
    /// Marks `kind` as the source the pipeline runs on.
    pub fn set_active(&self, kind: SourceKind) {
        let i = SourceKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        self.active
            .store(u8::try_from(i + 1).unwrap_or(0), Ordering::Relaxed);
    }

    /// The source the pipeline runs on, once it started.
    #[must_use]
    pub fn active(&self) -> Option<SourceKind> {
        let i = usize::from(self.active.load(Ordering::Relaxed));
        i.checked_sub(1)
            .and_then(|i| SourceKind::ALL.get(i).copied())
    }

    /// Prometheus text exposition of the counters.
    #[must_use]
    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rows = [
            (
                "enforcer_signals_decoded_total",
                "Ring-buffer records decoded into signals.",
                g(&self.decoded),
            ),
            (
                "enforcer_signals_malformed_total",
                "Records that failed to decode.",
                g(&self.malformed),
            ),
            (
                "enforcer_signals_dropped_total",
                "Signals dropped because the consumer lagged.",
                g(&self.dropped),
            ),
            (
                "enforcer_kernel_records_emitted_total",
                "Records the eBPF programs wrote.",
                g(&self.kernel_emitted),
            ),
            (
                "enforcer_kernel_ringbuf_full_total",
                "Ring-buffer reservations that failed (records lost).",
                g(&self.kernel_ring_full),
            ),
            (
                "enforcer_kernel_events_suppressed_total",
                "Events folded into a later record by the per-cgroup burst limiter.",
                g(&self.kernel_suppressed),
            ),
            (
                "enforcer_kernel_events_seen_total",
                "Events the eBPF programs saw.",
                g(&self.kernel_seen),
            ),
            (
                "enforcer_crossing_checks_total",
                "Memory charges the crossing check compared with an armed level.",
                g(&self.crossing_checks),
            ),
            (
                "enforcer_crossing_read_faults_total",
                "Reads of the kernel's structures by the crossing check that faulted.",
                g(&self.crossing_read_faults),
            ),
        ];
        let mut out = String::new();
        for (name, help, v) in rows {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_names_match_the_json() {
        for k in [
            SourceKind::Ebpf,
            SourceKind::Eventfd,
            SourceKind::Psi,
            SourceKind::Poll,
        ] {
            assert_eq!(
                serde_json::to_value(k).ok(),
                Some(serde_json::json!(k.as_str()))
            );
        }
    }
}
