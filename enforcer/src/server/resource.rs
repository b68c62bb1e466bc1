//! `/metrics/resource`: kubelet's resource metrics (what metrics-server scrapes), with
//! kubelet's names and labels: `node_cpu_usage_seconds_total`, `node_memory_working_set_bytes`,
//! `pod_cpu_usage_seconds_total{namespace,pod}`, `pod_memory_working_set_bytes{namespace,pod}`,
//! `container_cpu_usage_seconds_total{container,namespace,pod}`,
//! `container_memory_working_set_bytes{container,namespace,pod}` and `resource_scrape_error`.
//! Read on demand ([`super::summary::StatsReader`]), without the log walk. OpenMetrics text
//! with kubelet's per-sample timestamps: every node, pod and container sample carries the
//! time of the reading it comes from (OpenMetrics: seconds since the epoch);
//! `resource_scrape_error` carries none, as kubelet's.

use std::sync::atomic::AtomicU64;

use axum::{extract::State, http::StatusCode, response::Response};
use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{Shared, summary::Reading, text};

pub(super) type Labels = Vec<(&'static str, String)>;
pub(super) type FloatCounter = Counter<f64, AtomicU64>;
pub(super) type FloatGauge = Gauge<f64, AtomicU64>;

#[expect(clippy::cast_precision_loss, reason = "metric values are floats")]
pub(super) fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

#[expect(clippy::cast_precision_loss, reason = "metric values are floats")]
pub(super) fn bytes(b: i64) -> f64 {
    b as f64
}

/// The registry of one reading (`None`: the reading failed: only `resource_scrape_error 1`).
#[must_use]
pub fn registry(reading: Option<&Reading>) -> Registry {
    let mut reg = Registry::default();
    let scrape_error = Gauge::<i64>::default();
    reg.register(
        "resource_scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        scrape_error.clone(),
    );
    let Some(r) = reading else {
        scrape_error.set(1);
        return reg;
    };
    let node_cpu = FloatCounter::default();
    let node_mem = FloatGauge::default();
    let pod_cpu = Family::<Labels, FloatCounter>::default();
    let pod_mem = Family::<Labels, FloatGauge>::default();
    let container_cpu = Family::<Labels, FloatCounter>::default();
    let container_mem = Family::<Labels, FloatGauge>::default();
    if let Some(ns) = r.node_cpu_ns {
        node_cpu.inc_by(secs(ns));
    }
    if let Some(o) = r
        .snapshot
        .observations
        .get(&crate::policy::eviction::Signal::MemoryAvailable)
    {
        node_mem.set(bytes(o.capacity - o.available));
    }
    for t in &r.targets {
        let Some(rec) = r.records.get(&t.uid) else {
            continue;
        };
        let pod_labels: Labels = vec![
            ("namespace", rec.namespace.clone()),
            ("pod", rec.name.clone()),
        ];
        let stats = r.snapshot.pods.get(&t.uid).and_then(|s| s.stats.as_ref());
        if let Some(ns) = r.cpu_ns.get(&t.cgroup) {
            pod_cpu.get_or_create(&pod_labels).inc_by(secs(*ns));
        }
        if let Some(m) = stats.and_then(|s| s.memory) {
            pod_mem.get_or_create(&pod_labels).set(bytes(m));
        }
        for (name, id) in &t.containers {
            let labels: Labels = vec![
                ("container", name.clone()),
                ("namespace", rec.namespace.clone()),
                ("pod", rec.name.clone()),
            ];
            if let Some(ns) = r.cpu_ns.get(&format!("{}/{id}", t.cgroup)) {
                container_cpu.get_or_create(&labels).inc_by(secs(*ns));
            }
            if let Some(m) = stats
                .and_then(|s| s.containers.iter().find(|c| c.name == *name))
                .and_then(|c| c.memory)
            {
                container_mem.get_or_create(&labels).set(bytes(m));
            }
        }
    }
    reg.register(
        "node_cpu_usage_seconds",
        "Cumulative cpu time consumed by the node in core-seconds",
        node_cpu,
    );
    reg.register(
        "node_memory_working_set_bytes",
        "Current working set of the node in bytes",
        node_mem,
    );
    reg.register(
        "pod_cpu_usage_seconds",
        "Cumulative cpu time consumed by the pod in core-seconds",
        pod_cpu,
    );
    reg.register(
        "pod_memory_working_set_bytes",
        "Current working set of the pod in bytes",
        pod_mem,
    );
    reg.register(
        "container_cpu_usage_seconds",
        "Cumulative cpu time consumed by the container in core-seconds",
        container_cpu,
    );
    reg.register(
        "container_memory_working_set_bytes",
        "Current working set of the container in bytes",
        container_mem,
    );
    reg
}

/// OpenMetrics text of `registry`, each sample but `resource_scrape_error`'s timestamped with
/// `at_nanos` (ns since the epoch) in seconds with millisecond precision (what kubelet's
/// `NewLazyMetricWithTimestamp` keeps).
pub(super) fn timestamped(text: &str, at_nanos: i64) -> String {
    let ts = format!(
        " {}.{:03}",
        at_nanos.div_euclid(1_000_000_000),
        at_nanos.rem_euclid(1_000_000_000) / 1_000_000
    );
    let mut out = String::with_capacity(text.len() + 32 * text.lines().count());
    for line in text.lines() {
        out.push_str(line);
        let sample = !line.is_empty() && !line.starts_with('#');
        if sample && !line.starts_with("resource_scrape_error") {
            out.push_str(&ts);
        }
        out.push('\n');
    }
    out
}

/// The page of one reading: [`registry`] encoded, timestamped with the reading's time.
fn page(reading: Option<&Reading>) -> Result<String, std::fmt::Error> {
    let text = crate::metrics::encode(&[&registry(reading)])?;
    Ok(match reading {
        Some(r) => timestamped(&text, r.at_nanos),
        None => text,
    })
}

pub(super) async fn handler(State(s): State<Shared>, headers: axum::http::HeaderMap) -> Response {
    let reading = s
        .stats
        .read(
            &s.sources.link,
            &s.sources.status,
            super::summary::Page::Resource,
        )
        .await;
    if let Err(e) = &reading {
        tracing::warn!(error = %e, "resource metrics: reading the node failed");
    }
    match page(reading.as_ref().ok()) {
        Ok(body) => super::metrics_answer(&headers, body),
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            "encoding the metrics failed\n".to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelets_resource_series() {
        let mut reading = crate::server::summary::tests::reading();
        reading.at_nanos += 123_456_789;
        let text = page(Some(&reading)).expect("encode");
        for want in [
            "resource_scrape_error 0\n",
            "node_cpu_usage_seconds_total 10.0 1767225600.123\n",
            "node_memory_working_set_bytes 300.0 1767225600.123\n",
            "pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"web\"} 3.0 1767225600.123\n",
            "pod_memory_working_set_bytes{namespace=\"default\",pod=\"web\"} 300.0 1767225600.123\n",
            "container_cpu_usage_seconds_total{container=\"app\",namespace=\"default\",pod=\"web\"} 2.0 1767225600.123\n",
            "container_memory_working_set_bytes{container=\"app\",namespace=\"default\",pod=\"web\"} 200.0 1767225600.123\n",
        ] {
            assert!(text.contains(want), "{want:?} missing in:\n{text}");
        }
        // Every sample but the scrape error is timestamped; comments and `# EOF` are not.
        for line in text.lines() {
            let fields = line.split(' ').count();
            let is_sample = !line.starts_with('#');
            let want = match () {
                () if !is_sample => fields,
                () if line.starts_with("resource_scrape_error") => 2,
                () => 3,
            };
            assert_eq!(fields, want, "{line:?}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        let failed = page(None).expect("encode");
        assert_eq!(
            failed
                .lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>(),
            ["resource_scrape_error 1"]
        );
    }
}
