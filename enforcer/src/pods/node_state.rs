//! The node's state read at scrape time ([`NodeStateCollector`]): node conditions, the signal
//! pipeline's counters, the pods desired and active.

use std::{collections::HashMap, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use crate::{
    metrics::is_static, pods::NodeLink, signal::PipelineStats, status_manager::StatusManager,
};

/// The node's state as series, read at each scrape: `enforcer_node_condition{condition}`,
/// the signal pipeline's counters, `kubelet_desired_pods{static}` and
/// `kubelet_active_pods{static}`.
#[derive(Debug)]
pub struct NodeStateCollector {
    pub pipeline: Arc<PipelineStats>,
    pub link: NodeLink,
    pub status: StatusManager,
}

impl Collector for NodeStateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        {
            let mut family = encoder.encode_descriptor(
                "enforcer_build_info",
                "The enforcer's version and the commit it was built from (always 1).",
                None,
                MetricType::Gauge,
            )?;
            let labels = vec![
                ("version", crate::build::VERSION),
                ("commit", crate::build::COMMIT),
            ];
            ConstGauge::new(1_i64).encode(family.encode_family(&labels)?)?;
        }
        {
            let mut family = encoder.encode_descriptor(
                "enforcer_signal_source_active",
                "The signal source the daemon runs on (1), by source: ebpf, or a fallback.",
                None,
                MetricType::Gauge,
            )?;
            let active = self.pipeline.active();
            for k in crate::signal::SourceKind::ALL {
                let labels = vec![("source", k.as_str())];
                ConstGauge::new(i64::from(active == Some(k)))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        if let Some(attach) = self.pipeline.crossing_attach.get() {
            let mut family = encoder.encode_descriptor(
                "enforcer_crossing_check_attach",
                "Where the crossing check on the memory charge path attached (1), by attach point: fexit, kprobe, tracepoint, or none (the cgroup-file tripwire).",
                None,
                MetricType::Gauge,
            )?;
            for a in ["fexit", "kprobe", "tracepoint", "none"] {
                let labels = vec![("attach", a)];
                ConstGauge::new(i64::from(*attach == a)).encode(family.encode_family(&labels)?)?;
            }
        }
        let conds = self.link.conditions();
        {
            let mut family = encoder.encode_descriptor(
                "enforcer_node_condition",
                "Node conditions from the eviction manager (1 = reported).",
                None,
                MetricType::Gauge,
            )?;
            for c in ["DiskPressure", "MemoryPressure", "PIDPressure"] {
                let on = conds.iter().any(|x| x.as_str() == c);
                let labels = vec![("condition", c)];
                ConstGauge::new(i64::from(on)).encode(family.encode_family(&labels)?)?;
            }
        }
        let p = &self.pipeline;
        let g = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        for (name, help, v) in [
            (
                "enforcer_signals_decoded",
                "Ring-buffer records decoded into signals.",
                g(&p.decoded),
            ),
            (
                "enforcer_signals_malformed",
                "Records that failed to decode.",
                g(&p.malformed),
            ),
            (
                "enforcer_signals_dropped",
                "Signals dropped because the consumer lagged.",
                g(&p.dropped),
            ),
            (
                "enforcer_kernel_records_emitted",
                "Records the eBPF programs wrote.",
                g(&p.kernel_emitted),
            ),
            (
                "enforcer_kernel_ringbuf_full",
                "Ring-buffer reservations that failed (records lost).",
                g(&p.kernel_ring_full),
            ),
            (
                "enforcer_kernel_events_suppressed",
                "Events folded into a later record by the per-cgroup burst limiter.",
                g(&p.kernel_suppressed),
            ),
            (
                "enforcer_kernel_events_seen",
                "Events the eBPF programs saw.",
                g(&p.kernel_seen),
            ),
            (
                "enforcer_crossing_checks",
                "Memory charges the crossing check compared with an armed level.",
                g(&p.crossing_checks),
            ),
            (
                "enforcer_crossing_read_faults",
                "Reads of the kernel's structures by the crossing check that faulted.",
                g(&p.crossing_read_faults),
            ),
        ] {
            let counter = ConstCounter::new(v);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        self.encode_pod_counts(&mut encoder)
    }
}

impl NodeStateCollector {
    /// kubelet's `kubelet_desired_pods` and `kubelet_active_pods`, by `static`.
    fn encode_pod_counts(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        // Desired: every pod a source gave that is not finished; active: admitted and
        // running (the eviction manager's candidates).
        let (_, file) = self.status.snapshot();
        let source_of: HashMap<&str, &str> = file
            .pods
            .iter()
            .map(|r| (r.uid.as_str(), r.source.as_str()))
            .collect();
        let mut desired = [0i64; 2];
        for r in file.pods.iter().filter(|r| !r.phase.is_terminal()) {
            desired[usize::from(is_static(&r.source) == "true")] += 1;
        }
        let mut active = [0i64; 2];
        for uid in self.link.active().keys() {
            let source = source_of.get(uid.as_str()).copied().unwrap_or("");
            active[usize::from(is_static(source) == "true")] += 1;
        }
        for (name, help, counts) in [
            (
                "kubelet_desired_pods",
                "The number of pods the kubelet is being instructed to run. static is true if the pod is not from the apiserver.",
                desired,
            ),
            (
                "kubelet_active_pods",
                "The number of pods the kubelet considers active and which are being considered when admitting new pods. static is true if the pod is not from the apiserver.",
                active,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (i, s) in ["false", "true"].into_iter().enumerate() {
                let labels = vec![("static", s)];
                ConstGauge::new(counts[i]).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;
    use crate::metrics::encode;

    fn record(uid: &str, source: &str, phase: &str) -> crate::status_manager::PodRecord {
        serde_json::from_value(serde_json::json!({
            "uid": uid, "name": uid, "namespace": "default", "source": source,
            "phase": phase, "qosClass": "BestEffort", "conditions": [],
            "initContainerStatuses": [], "containerStatuses": [],
        }))
        .expect("record")
    }

    /// Desired: not finished, by source; active: the eviction manager's set; conditions and
    /// the pipeline's counters as they are at the scrape.
    #[test]
    fn node_state_is_read_at_each_scrape() {
        let status = StatusManager::default();
        let link = NodeLink::default();
        status.set(record("a", "/etc/manifests/a.yaml", "Running"));
        status.set(record("b", "api", "Running"));
        status.set(record("c", "api", "Pending"));
        status.set(record("d", "api", "Succeeded"));
        for uid in ["a", "b"] {
            link.set_active(
                uid,
                crate::pods::link::ActiveEntry::new(
                    Arc::new(k8s_openapi::api::core::v1::Pod::default()),
                    format!("/kubepods/pod{uid}"),
                ),
            );
        }
        let pipeline = Arc::new(PipelineStats::default());
        pipeline
            .dropped
            .store(3, std::sync::atomic::Ordering::Relaxed);
        let mut reg = Registry::default();
        reg.register_collector(Box::new(NodeStateCollector {
            pipeline: pipeline.clone(),
            link: link.clone(),
            status,
        }));
        let text = encode(&[&reg]).expect("encode");
        for want in [
            "kubelet_desired_pods{static=\"false\"} 2\n",
            "kubelet_desired_pods{static=\"true\"} 1\n",
            "kubelet_active_pods{static=\"false\"} 1\n",
            "kubelet_active_pods{static=\"true\"} 1\n",
            "enforcer_signals_dropped_total 3\n",
            "enforcer_node_condition{condition=\"MemoryPressure\"} 0\n",
        ] {
            assert!(text.contains(want), "{want:?} missing in:\n{text}");
        }
        let build = format!(
            "enforcer_build_info{{version=\"{}\",commit=\"{}\"}} 1\n",
            crate::build::VERSION,
            crate::build::COMMIT
        );
        assert!(text.contains(&build), "{build:?} missing in:\n{text}");
        // No source yet: every source 0; then the one it runs on 1.
        assert!(
            text.contains("enforcer_signal_source_active{source=\"ebpf\"} 0\n"),
            "{text}"
        );
        pipeline.set_active(crate::signal::SourceKind::Psi);
        let text = encode(&[&reg]).expect("encode");
        assert!(
            text.contains("enforcer_signal_source_active{source=\"psi\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("enforcer_signal_source_active{source=\"ebpf\"} 0\n"),
            "{text}"
        );
        link.set_conditions(vec![crate::policy::eviction::NodeCondition::MemoryPressure]);
        pipeline
            .dropped
            .store(4, std::sync::atomic::Ordering::Relaxed);
        let text = encode(&[&reg]).expect("encode");
        assert!(
            text.contains("enforcer_node_condition{condition=\"MemoryPressure\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("enforcer_signals_dropped_total 4\n"),
            "{text}"
        );
    }
}
