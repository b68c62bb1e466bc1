//! kubelet's `/metrics/probes` (`pkg/kubelet/prober`): `prober_probe_total` (every probe's
//! raw result, before the thresholds: `successful`, `failed`, `unknown`; a prober error is not
//! counted), `prober_probe_duration_seconds` (the successful and unknown ones), and
//! `process_start_time_seconds`. A container's series go when its probe worker stops, as
//! kubelet deletes them.

use std::{sync::OnceLock, time::Duration};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// `prober_probe_total`'s labels (sorted, as kubelet's output is).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    container: String,
    namespace: String,
    pod: String,
    pod_uid: String,
    probe_type: String,
    result: String,
}

/// `prober_probe_duration_seconds`'s labels (no `result`, no `pod_uid`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    container: String,
    namespace: String,
    pod: String,
    probe_type: String,
}

/// One container's probe of one type, as its series name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeOf {
    pub probe_type: &'static str,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

/// kubelet's probe result label values.
const RESULTS: [&str; 3] = ["successful", "failed", "unknown"];

/// The `/metrics/probes` registry and its families.
#[derive(Debug)]
pub struct ProbeMetrics {
    registry: Registry,
    total: Family<ProbeLabels, Counter>,
    duration: Family<DurationLabels, Histogram>,
}

/// The process-wide one.
#[must_use]
pub fn global() -> &'static ProbeMetrics {
    static GLOBAL: OnceLock<ProbeMetrics> = OnceLock::new();
    GLOBAL.get_or_init(ProbeMetrics::new)
}

impl Default for ProbeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ProbeMetrics {
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let start = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        start.set(process_start_time_seconds().unwrap_or(0.0));
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            start,
        );
        let total = Family::<ProbeLabels, Counter>::default();
        registry.register(
            "prober_probe",
            "Cumulative number of a liveness, readiness or startup probe for a container by result.",
            total.clone(),
        );
        let duration = Family::<DurationLabels, Histogram>::new_with_constructor(
            super::families::def_histogram as fn() -> Histogram,
        );
        registry.register(
            "prober_probe_duration_seconds",
            "Duration in seconds for a probe response.",
            duration.clone(),
        );
        Self {
            registry,
            total,
            duration,
        }
    }

    #[must_use]
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    fn labels(p: &ProbeOf, result: &str) -> ProbeLabels {
        ProbeLabels {
            container: p.container.clone(),
            namespace: p.namespace.clone(),
            pod: p.pod.clone(),
            pod_uid: p.pod_uid.clone(),
            probe_type: p.probe_type.to_owned(),
            result: result.to_owned(),
        }
    }

    fn duration_labels(p: &ProbeOf) -> DurationLabels {
        DurationLabels {
            container: p.container.clone(),
            namespace: p.namespace.clone(),
            pod: p.pod.clone(),
            probe_type: p.probe_type.to_owned(),
        }
    }

    /// One probe's result (`successful`, `failed`, `unknown`) and how long it took (observed
    /// for the successful and unknown ones, as kubelet observes them).
    pub fn probed(&self, p: &ProbeOf, result: &'static str, took: Duration) {
        self.total.get_or_create(&Self::labels(p, result)).inc();
        if result != "failed" {
            self.duration
                .get_or_create(&Self::duration_labels(p))
                .observe(took.as_secs_f64());
        }
    }

    /// The probe worker stopped: its series go.
    pub fn forget(&self, p: &ProbeOf) {
        for r in RESULTS {
            self.total.remove(&Self::labels(p, r));
        }
        self.duration.remove(&Self::duration_labels(p));
    }
}

/// The process's start, seconds since the epoch: its start in clock ticks after boot
/// (`/proc/self/stat`, field 22) plus the boot time (`/proc/stat` `btime`).
fn process_start_time_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command's closing parenthesis; starttime is the 22nd field overall.
    let after = stat.rsplit_once(')')?.1;
    let ticks: f64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let btime: f64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let hz = f64::from(u32::try_from(rustix::param::clock_ticks_per_second()).ok()?);
    Some(btime + ticks / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A result counted per container and type; the duration of the successful and unknown
    /// ones only; the series gone once forgotten; the process's start within the last day.
    #[test]
    fn probes_are_counted_and_forgotten() {
        let m = ProbeMetrics::new();
        let p = ProbeOf {
            probe_type: "Readiness",
            container: "app".to_owned(),
            pod: "web".to_owned(),
            namespace: "default".to_owned(),
            pod_uid: "u1".to_owned(),
        };
        m.probed(&p, "successful", Duration::from_millis(3));
        m.probed(&p, "successful", Duration::from_millis(3));
        m.probed(&p, "failed", Duration::from_millis(3));
        let text = crate::metrics::encode(&[m.registry()]).expect("encode");
        assert!(
            text.contains(r#"prober_probe_total{container="app",namespace="default",pod="web",pod_uid="u1",probe_type="Readiness",result="successful"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"result="failed"} 1"#), "{text}");
        assert!(
            text.contains(r#"prober_probe_duration_seconds_count{container="app",namespace="default",pod="web",probe_type="Readiness"} 2"#),
            "{text}"
        );
        m.forget(&p);
        let text = crate::metrics::encode(&[m.registry()]).expect("encode");
        assert!(!text.contains("pod_uid=\"u1\""), "{text}");
        let start = process_start_time_seconds().expect("the start time");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("now")
            .as_secs_f64();
        assert!(
            start <= now + 1.0 && now - start < 86_400.0,
            "{start} {now}"
        );
    }
}
