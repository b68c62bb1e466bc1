//! `/metrics/cadvisor`: the cAdvisor series monitoring stacks read from kubelet (kube-prometheus'
//! `node_namespace_pod_container:*` rules, managed Prometheus services), with cAdvisor's names,
//! help texts and label set (`container`, `id`, `image`, `name`, `namespace`, `pod`, in that
//! order; `""` where the cgroup has none): the node's root cgroup (`id="/"`), each pod's cgroup
//! (`namespace`, `pod`), each container's (all six: `name` the runtime's container id). From
//! the same reading as `/stats/summary` ([`super::summary::StatsReader`]). The stat families
//! carry the reading's time, as cAdvisor stamps them with its read of the cgroup; the machine
//! families none. Served: `container_cpu_usage_seconds_total{cpu="total"}` (no series while a
//! cgroup's usage is 0, as cAdvisor), `container_memory_working_set_bytes`, the memory
//! gauges ([`MEMORY`]) and the CFS counters ([`CFS`], only where CFS periods elapsed), the
//! spec families ([`SPEC`], untimestamped), the six
//! `container_pressure_{cpu,memory,io}_{stalled,waiting}_seconds_total` (cgroup v2 only, as
//! kubelet registers them only where PSI is on), the filesystem families ([`fs`]: block I/O by
//! device, the root's filesystems), the process families ([`processes`]),
//! `container_last_seen`, `machine_cpu_cores`, `machine_memory_bytes`.

mod fs;
mod processes;

use axum::{extract::State, http::StatusCode, response::Response};
use prometheus_client::{metrics::family::Family, registry::Registry};

use super::{
    Shared,
    resource::{FloatCounter, FloatGauge, Labels, bytes as float, secs},
    summary::Reading,
    text,
};
use crate::stats::{
    figures::{Cfs, Figures, Spec},
    network::NetDev,
    psi::Pressure,
};

/// cAdvisor's label set, `cpu` placed in its sorted place when given.
fn labels(
    container: &str,
    cpu: Option<&str>,
    id: &str,
    image: &str,
    name: &str,
    namespace: &str,
    pod: &str,
) -> Labels {
    let mut l: Labels = vec![("container", container.to_owned())];
    if let Some(cpu) = cpu {
        l.push(("cpu", cpu.to_owned()));
    }
    l.extend([
        ("id", id.to_owned()),
        ("image", image.to_owned()),
        ("name", name.to_owned()),
        ("namespace", namespace.to_owned()),
        ("pod", pod.to_owned()),
    ]);
    l
}

/// cAdvisor's six pressure families (`PressureMetrics`): name, help, which file, which line
/// (`full`: stalled, `some`: waiting).
const PRESSURE: [(&str, &str, Resource, bool); 6] = [
    (
        "container_pressure_cpu_stalled_seconds",
        "Total time duration no tasks in the container could make progress due to CPU congestion.",
        Resource::Cpu,
        true,
    ),
    (
        "container_pressure_cpu_waiting_seconds",
        "Total time duration tasks in the container have waited due to CPU congestion.",
        Resource::Cpu,
        false,
    ),
    (
        "container_pressure_memory_stalled_seconds",
        "Total time duration no tasks in the container could make progress due to memory congestion.",
        Resource::Memory,
        true,
    ),
    (
        "container_pressure_memory_waiting_seconds",
        "Total time duration tasks in the container have waited due to memory congestion.",
        Resource::Memory,
        false,
    ),
    (
        "container_pressure_io_stalled_seconds",
        "Total time duration no tasks in the container could make progress due to IO congestion.",
        Resource::Io,
        true,
    ),
    (
        "container_pressure_io_waiting_seconds",
        "Total time duration tasks in the container have waited due to IO congestion.",
        Resource::Io,
        false,
    ),
];

#[derive(Clone, Copy)]
enum Resource {
    Cpu,
    Memory,
    Io,
}

/// One pressure line's total, in seconds (the kernel's µs over 10^6, as cAdvisor's
/// `asMicrosecondsToSeconds`).
fn pressure_seconds(p: &Pressure, resource: Resource, full: bool) -> Option<f64> {
    let stats = match resource {
        Resource::Cpu => p.cpu,
        Resource::Memory => p.memory,
        Resource::Io => p.io,
    }?;
    let line = if full { stats.full } else { stats.some };
    #[expect(
        clippy::cast_precision_loss,
        reason = "seconds of stall: a float as cAdvisor serves them"
    )]
    Some(line.total as f64 / 1e6)
}

/// One family of cAdvisor's: its name, its help, and how its value is read from a `T`.
type Series<T, V> = (&'static str, &'static str, fn(&T) -> V);

/// cAdvisor's memory gauges beside the working set: name, help, which figure.
const MEMORY: [Series<Figures, Option<u64>>; 4] = [
    (
        "container_memory_usage_bytes",
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
        |f| f.usage,
    ),
    ("container_memory_rss", "Size of RSS in bytes.", |f| f.rss),
    (
        "container_memory_cache",
        "Number of bytes of page cache memory.",
        |f| f.cache,
    ),
    (
        "container_memory_swap",
        "Container swap usage in bytes.",
        |f| f.swap,
    ),
];

/// cAdvisor's CFS counters (served where the cgroup has had CFS periods, that is a CPU
/// limit): name, help, value.
#[expect(
    clippy::cast_precision_loss,
    reason = "counters served as floats, as cAdvisor serves them"
)]
const CFS: [Series<Cfs, f64>; 3] = [
    (
        "container_cpu_cfs_periods",
        "Number of elapsed enforcement period intervals.",
        |c| c.periods as f64,
    ),
    (
        "container_cpu_cfs_throttled_periods",
        "Number of throttled period intervals.",
        |c| c.throttled_periods as f64,
    ),
    (
        "container_cpu_cfs_throttled_seconds",
        "Total time duration the container has been throttled.",
        |c| c.throttled_ns as f64 / 1e9,
    ),
];

/// cAdvisor's network counters (a pod's, by `interface`): name, help, which counter.
const NETWORK: [Series<NetDev, u64>; 8] = [
    (
        "container_network_receive_bytes",
        "Cumulative count of bytes received",
        |n| n.rx_bytes,
    ),
    (
        "container_network_receive_packets",
        "Cumulative count of packets received",
        |n| n.rx_packets,
    ),
    (
        "container_network_receive_packets_dropped",
        "Cumulative count of packets dropped while receiving",
        |n| n.rx_dropped,
    ),
    (
        "container_network_receive_errors",
        "Cumulative count of errors encountered while receiving",
        |n| n.rx_errors,
    ),
    (
        "container_network_transmit_bytes",
        "Cumulative count of bytes transmitted",
        |n| n.tx_bytes,
    ),
    (
        "container_network_transmit_packets",
        "Cumulative count of packets transmitted",
        |n| n.tx_packets,
    ),
    (
        "container_network_transmit_packets_dropped",
        "Cumulative count of packets dropped while transmitting",
        |n| n.tx_dropped,
    ),
    (
        "container_network_transmit_errors",
        "Cumulative count of errors encountered while transmitting",
        |n| n.tx_errors,
    ),
];

/// The stat families being filled.
struct Families {
    cpu: Family<Labels, FloatCounter>,
    ws: Family<Labels, FloatGauge>,
    memory: Vec<Family<Labels, FloatGauge>>,
    cfs: Vec<Family<Labels, FloatCounter>>,
    pressure: Vec<Family<Labels, FloatCounter>>,
    network: Vec<Family<Labels, FloatCounter>>,
    last_seen: Family<Labels, FloatGauge>,
}

/// One cgroup's labels and figures: (`id`, `image`, (`container`, `name`), (`namespace`,
/// `pod`)), its CPU usage and working set, and its key in the reading.
struct Cgroup {
    id: String,
    image: String,
    container: (String, String),
    pod: (String, String),
    cpu_ns: Option<u64>,
    working_set: Option<i64>,
    key: String,
}

impl Cgroup {
    fn labels(&self, cpu: Option<&str>) -> Labels {
        labels(
            &self.container.0,
            cpu,
            &self.id,
            &self.image,
            &self.container.1,
            &self.pod.0,
            &self.pod.1,
        )
    }
}

/// The cgroups cAdvisor reports: the root (`id="/"`), each pod's and each container's.
fn cgroups(r: &Reading) -> Vec<Cgroup> {
    let node_mem = r
        .snapshot
        .observations
        .get(&crate::policy::eviction::Signal::MemoryAvailable)
        .map(|o| o.capacity - o.available);
    let mut out = vec![Cgroup {
        id: "/".to_owned(),
        image: String::new(),
        container: (String::new(), String::new()),
        pod: (String::new(), String::new()),
        cpu_ns: r.node_cpu_ns,
        working_set: node_mem,
        key: String::new(),
    }];
    for t in &r.targets {
        let Some(rec) = r.records.get(&t.uid) else {
            continue;
        };
        let pod = (rec.namespace.clone(), rec.name.clone());
        let stats = r.snapshot.pods.get(&t.uid).and_then(|s| s.stats.as_ref());
        out.push(Cgroup {
            id: format!("/{}", t.cgroup.trim_start_matches('/')),
            image: String::new(),
            container: (String::new(), String::new()),
            pod: pod.clone(),
            cpu_ns: r.cpu_ns.get(&t.cgroup).copied(),
            working_set: stats.and_then(|s| s.memory),
            key: t.cgroup.clone(),
        });
        for (name, cid) in &t.containers {
            let key = format!("{}/{cid}", t.cgroup);
            let image = rec
                .container_statuses
                .iter()
                .chain(&rec.init_container_statuses)
                .find(|c| c.name == *name)
                .map(|c| c.image.clone())
                .unwrap_or_default();
            out.push(Cgroup {
                id: format!("/{}", key.trim_start_matches('/')),
                image,
                container: (name.clone(), cid.clone()),
                pod: pod.clone(),
                cpu_ns: r.cpu_ns.get(&key).copied(),
                working_set: stats
                    .and_then(|s| s.containers.iter().find(|c| c.name == *name))
                    .and_then(|c| c.memory),
                key,
            });
        }
    }
    out
}

impl Families {
    fn new() -> Self {
        Self {
            cpu: Family::default(),
            ws: Family::default(),
            memory: MEMORY.iter().map(|_| Family::default()).collect(),
            cfs: CFS.iter().map(|_| Family::default()).collect(),
            pressure: PRESSURE.iter().map(|_| Family::default()).collect(),
            network: NETWORK.iter().map(|_| Family::default()).collect(),
            last_seen: Family::default(),
        }
    }

    fn add(&self, r: &Reading, c: &Cgroup) {
        let l = c.labels(None);
        // cAdvisor's `container_last_seen`: the whole second of the reading, for every cgroup
        // it has stats of.
        if c.cpu_ns.is_some() || c.working_set.is_some() || r.figures.contains_key(&c.key) {
            self.last_seen
                .get_or_create(&l)
                .set(float(r.at_nanos.div_euclid(1_000_000_000)));
        }
        if let Some(ns) = c.cpu_ns.filter(|ns| *ns > 0) {
            self.cpu
                .get_or_create(&c.labels(Some("total")))
                .inc_by(secs(ns));
        }
        if let Some(m) = c.working_set {
            self.ws.get_or_create(&l).set(float(m.max(0)));
        }
        if let Some(f) = r.figures.get(&c.key) {
            for ((_, _, get), family) in MEMORY.iter().zip(&self.memory) {
                if let Some(v) = get(f) {
                    family
                        .get_or_create(&l)
                        .set(float(i64::try_from(v).unwrap_or(i64::MAX)));
                }
            }
            if let Some(cfs) = f.cfs.filter(|c| c.periods > 0) {
                for ((_, _, get), family) in CFS.iter().zip(&self.cfs) {
                    family.get_or_create(&l).inc_by(get(&cfs));
                }
            }
        }
        // A pod's network namespace is the pod cgroup's (cAdvisor reports it on the sandbox).
        if c.container.0.is_empty()
            && let Some(devs) = r.network.get(&c.key).filter(|_| !c.key.is_empty())
        {
            for (iface, dev) in devs {
                let mut li = l.clone();
                li.insert(3, ("interface", iface.clone()));
                for ((_, _, get), family) in NETWORK.iter().zip(&self.network) {
                    family.get_or_create(&li).inc_by(u64_f64(get(dev)));
                }
            }
        }
        if let Some(psi) = r.psi.get(&c.key) {
            for ((_, _, resource, full), family) in PRESSURE.iter().zip(&self.pressure) {
                if let Some(v) = pressure_seconds(psi, *resource, *full) {
                    family.get_or_create(&l).inc_by(v);
                }
            }
        }
    }

    fn register(self, psi: bool) -> Registry {
        let mut reg = Registry::default();
        reg.register(
            "container_cpu_usage_seconds",
            "Cumulative cpu time consumed in seconds.",
            self.cpu,
        );
        for ((name, help, _), family) in CFS.iter().zip(self.cfs) {
            reg.register(*name, *help, family);
        }
        reg.register(
            "container_memory_working_set_bytes",
            "Current working set in bytes.",
            self.ws,
        );
        for ((name, help, _), family) in MEMORY.iter().zip(self.memory) {
            reg.register(*name, *help, family);
        }
        for ((name, help, _), family) in NETWORK.iter().zip(self.network) {
            reg.register(*name, *help, family);
        }
        reg.register(
            "container_last_seen",
            "Last time a container was seen by the exporter",
            self.last_seen,
        );
        if psi {
            // Registered only where PSI is read: on cgroup v1 kubelet serves no such family.
            for ((name, help, _, _), family) in PRESSURE.iter().zip(self.pressure) {
                reg.register(*name, *help, family);
            }
        }
        reg
    }
}

/// The stat families of one reading (timestamped by [`page`]).
fn stats(r: &Reading, cgroups: &[Cgroup]) -> Registry {
    let families = Families::new();
    for c in cgroups {
        families.add(r, c);
    }
    families.register(!r.psi.is_empty())
}

/// cAdvisor's spec families (no timestamp, as cAdvisor's constant metrics): name, help,
/// which figure (a quota only when set).
const SPEC: [Series<Spec, Option<f64>>; 7] = [
    (
        "container_spec_cpu_period",
        "CPU period of the container.",
        |s| s.cpu_period.map(u64_f64),
    ),
    (
        "container_spec_cpu_quota",
        "CPU quota of the container.",
        |s| s.cpu_quota.filter(|q| *q != 0).map(u64_f64),
    ),
    (
        "container_spec_cpu_shares",
        "CPU share of the container.",
        |s| s.cpu_shares.map(u64_f64),
    ),
    (
        "container_spec_memory_limit_bytes",
        "Memory limit for the container.",
        |s| s.memory_limit.map(u64_f64),
    ),
    (
        "container_spec_memory_reservation_limit_bytes",
        "Memory reservation limit for the container.",
        |s| s.memory_reservation.map(u64_f64),
    ),
    (
        "container_spec_memory_swap_limit_bytes",
        "Memory swap limit for the container.",
        |s| s.swap_limit.map(u64_f64),
    ),
    (
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds.",
        |s| s.start_time,
    ),
];

#[expect(
    clippy::cast_precision_loss,
    reason = "served as floats, as cAdvisor serves them"
)]
fn u64_f64(v: u64) -> f64 {
    v as f64
}

/// The spec families of every cgroup the reading has figures of.
fn spec(r: &Reading, cgroups: &[Cgroup]) -> Registry {
    let families: Vec<Family<Labels, FloatGauge>> =
        SPEC.iter().map(|_| Family::default()).collect();
    for c in cgroups {
        let Some(f) = r.figures.get(&c.key) else {
            continue;
        };
        for ((_, _, get), family) in SPEC.iter().zip(&families) {
            if let Some(v) = get(&f.spec) {
                family.get_or_create(&c.labels(None)).set(v);
            }
        }
    }
    let mut reg = Registry::default();
    for ((name, help, _), family) in SPEC.iter().zip(families) {
        reg.register(*name, *help, family);
    }
    reg
}

/// The machine families (no timestamp): logical CPUs online, memory installed.
fn machine(r: &Reading) -> Registry {
    let mut reg = Registry::default();
    let cores = FloatGauge::default();
    cores.set(float(
        std::thread::available_parallelism().map_or(1, |n| i64::try_from(n.get()).unwrap_or(1)),
    ));
    reg.register("machine_cpu_cores", "Number of logical CPU cores.", cores);
    if let Some(o) = r
        .snapshot
        .observations
        .get(&crate::policy::eviction::Signal::MemoryAvailable)
    {
        let mem = FloatGauge::default();
        mem.set(float(o.capacity));
        reg.register(
            "machine_memory_bytes",
            "Amount of memory installed on the machine.",
            mem,
        );
    }
    reg
}

/// The page of one reading: the stat families stamped with the reading's time, then the
/// machine families.
fn page(r: &Reading) -> Result<String, std::fmt::Error> {
    let cgroups = cgroups(r);
    let stats = crate::metrics::encode(&[
        &stats(r, &cgroups),
        &fs::families(r, &cgroups),
        &processes::families(r, &cgroups),
    ])?;
    let stats = super::resource::timestamped(&stats, r.at_nanos);
    let machine = crate::metrics::encode(&[&spec(r, &cgroups), &machine(r)])?;
    Ok(format!(
        "{}{machine}",
        stats.strip_suffix("# EOF\n").unwrap_or(&stats)
    ))
}

pub(super) async fn handler(State(s): State<Shared>, headers: axum::http::HeaderMap) -> Response {
    if s.sources.config.enforcer.own_metrics_only {
        // Beside kubelet, kubelet serves it: nothing is scraped twice from one node.
        return super::metrics_answer(&headers, "# EOF\n".to_owned());
    }
    let reading = s
        .stats
        .read(
            &s.sources.link,
            &s.sources.status,
            super::summary::Page::Cadvisor,
        )
        .await;
    let body = match &reading {
        Ok(r) => page(r),
        Err(e) => {
            tracing::warn!(error = %e, "cadvisor metrics: reading the node failed");
            Ok("# EOF\n".to_owned())
        }
    };
    match body {
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
    use crate::stats::disk_io::DeviceIo;

    /// cAdvisor's label set on the root, the pod and the container cgroups, the reading's
    /// timestamp on the stat families, none on the machine's; promtool-style text once turned
    /// into the text format.
    #[test]
    fn cadvisors_series_for_the_node_its_pods_and_containers() {
        let reading = crate::server::summary::tests::reading();
        let text = page(&reading).expect("encode");
        for want in [
            "container_cpu_usage_seconds_total{container=\"\",cpu=\"total\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 10.0 1767225600.000\n",
            "container_cpu_usage_seconds_total{container=\"\",cpu=\"total\",id=\"/kubepods/podu1\",image=\"\",name=\"\",namespace=\"default\",pod=\"web\"} 3.0 1767225600.000\n",
            "container_cpu_usage_seconds_total{container=\"app\",cpu=\"total\",id=\"/kubepods/podu1/c1\",image=\"busybox\",name=\"c1\",namespace=\"default\",pod=\"web\"} 2.0 1767225600.000\n",
            "container_memory_working_set_bytes{container=\"app\",id=\"/kubepods/podu1/c1\",image=\"busybox\",name=\"c1\",namespace=\"default\",pod=\"web\"} 200.0 1767225600.000\n",
            "container_memory_working_set_bytes{container=\"\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 300.0 1767225600.000\n",
            "machine_memory_bytes 1000.0\n",
        ] {
            assert!(text.contains(want), "{want:?} missing in:\n{text}");
        }
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.ends_with("# EOF\n"));
        let plain = crate::metrics::exposition::to_text_004(&text);
        assert!(
            plain.contains("# TYPE container_cpu_usage_seconds_total counter\n")
                && plain.contains("} 2.0 1767225600000\n")
                && plain.contains("machine_cpu_cores "),
            "{plain}"
        );
    }

    /// The six pressure families in seconds (the kernel's µs / 10^6), full as stalled and
    /// some as waiting, with cAdvisor's labels; none at all without PSI (cgroup v1).
    #[test]
    fn pressure_series_where_psi_is_read_and_none_where_not() {
        use crate::stats::psi::{PsiData, PsiStats};
        let line = |total| PsiData {
            total,
            ..PsiData::default()
        };
        let p = |n: u64| Pressure {
            cpu: Some(PsiStats {
                full: line(n * 1_000_000),
                some: line(n * 2_000_000),
            }),
            memory: Some(PsiStats {
                full: line(n * 3_000_000),
                some: line(n * 4_000_000),
            }),
            io: Some(PsiStats {
                full: line(500_000),
                some: line(n * 6_000_000),
            }),
        };
        let mut reading = crate::server::summary::tests::reading();
        assert!(
            !page(&reading)
                .expect("encode")
                .contains("container_pressure")
        );
        reading.psi = std::collections::HashMap::from([
            (String::new(), p(1)),
            ("/kubepods/podu1".to_owned(), p(2)),
            ("/kubepods/podu1/c1".to_owned(), p(3)),
        ]);
        let text = page(&reading).expect("encode");
        let root = "{container=\"\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"}";
        let pod = "{container=\"\",id=\"/kubepods/podu1\",image=\"\",name=\"\",namespace=\"default\",pod=\"web\"}";
        let ctr = "{container=\"app\",id=\"/kubepods/podu1/c1\",image=\"busybox\",name=\"c1\",namespace=\"default\",pod=\"web\"}";
        for want in [
            format!("container_pressure_cpu_stalled_seconds_total{root} 1.0 1767225600.000\n"),
            format!("container_pressure_cpu_waiting_seconds_total{pod} 4.0 1767225600.000\n"),
            format!("container_pressure_memory_stalled_seconds_total{ctr} 9.0 1767225600.000\n"),
            format!("container_pressure_memory_waiting_seconds_total{ctr} 12.0 1767225600.000\n"),
            format!("container_pressure_io_stalled_seconds_total{pod} 0.5 1767225600.000\n"),
            format!("container_pressure_io_waiting_seconds_total{ctr} 18.0 1767225600.000\n"),
            "# HELP container_pressure_io_stalled_seconds Total time duration no tasks in the container could make progress due to IO congestion.\n".to_owned(),
            "# TYPE container_pressure_memory_waiting_seconds counter\n".to_owned(),
        ] {
            assert!(text.contains(&want), "{want:?} missing in:\n{text}");
        }
    }

    /// The memory gauges and CFS counters kube-prometheus' rules and `CPUThrottlingHigh` read,
    /// from the reading's figures (no CFS series for a cgroup that had no CFS period), and the
    /// spec families, untimestamped.
    #[test]
    fn memory_and_cfs_families_from_the_figures() {
        let mut reading = crate::server::summary::tests::reading();
        reading.figures = std::collections::HashMap::from([
            (
                "/kubepods/podu1/c1".to_owned(),
                Figures {
                    usage: Some(4096),
                    rss: Some(1024),
                    cache: Some(2048),
                    swap: Some(0),
                    cfs: Some(Cfs {
                        periods: 10,
                        throttled_periods: 4,
                        throttled_ns: 250_000_000,
                    }),
                    spec: Spec {
                        cpu_period: Some(100_000),
                        cpu_quota: Some(50_000),
                        cpu_shares: Some(512),
                        memory_limit: Some(268_435_456),
                        swap_limit: Some(0),
                        memory_reservation: Some(16 << 20),
                        start_time: Some(1_767_225_000.5),
                    },
                    io: std::collections::BTreeMap::from([
                        (
                            (253, 0),
                            DeviceIo {
                                read_bytes: 4096,
                                write_bytes: 8192,
                                reads: 1,
                                writes: 2,
                            },
                        ),
                        ((9, 9), DeviceIo::default()),
                    ]),
                    processes: Some(crate::stats::processes::Processes {
                        processes: 2,
                        fds: 9,
                        sockets: 3,
                        threads: Some(4),
                        threads_max: Some(0),
                        max_open_files: Some(1024),
                    }),
                },
            ),
            (
                "/kubepods/podu1".to_owned(),
                Figures {
                    rss: Some(1),
                    cfs: Some(Cfs::default()),
                    ..Figures::default()
                },
            ),
        ]);
        reading.disks = std::collections::BTreeMap::from([((253, 0), "/dev/vda".to_owned())]);
        reading.filesystems = vec![crate::stats::filesystems::Filesystem {
            device: "/dev/vda1".to_owned(),
            usage: 300,
            limit: 1000,
            inodes_free: 7,
        }];
        let text = page(&reading).expect("encode");
        let ctr = "{container=\"app\",id=\"/kubepods/podu1/c1\",image=\"busybox\",name=\"c1\",namespace=\"default\",pod=\"web\"}";
        let dev = "{container=\"app\",device=\"/dev/vda\",id=\"/kubepods/podu1/c1\",image=\"busybox\",name=\"c1\",namespace=\"default\",pod=\"web\"}";
        let root = "{container=\"\",device=\"/dev/vda1\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"}";
        for want in [
            // Block I/O by device (named from /sys/block; an unknown device's name is "").
            format!("container_fs_reads_bytes_total{dev} 4096.0 1767225600.000\n"),
            format!("container_fs_writes_bytes_total{dev} 8192.0 1767225600.000\n"),
            format!("container_fs_reads_total{dev} 1.0 1767225600.000\n"),
            format!("container_fs_writes_total{dev} 2.0 1767225600.000\n"),
            "container_fs_reads_total{container=\"app\",device=\"\",id=".to_owned(),
            // The root container's filesystems.
            format!("container_fs_usage_bytes{root} 300.0 1767225600.000\n"),
            format!("container_fs_limit_bytes{root} 1000.0 1767225600.000\n"),
            format!("container_fs_inodes_free{root} 7.0 1767225600.000\n"),
            format!("container_last_seen{ctr} 1767225600.0 1767225600.000\n"),
            format!("container_processes{ctr} 2.0 1767225600.000\n"),
            format!("container_file_descriptors{ctr} 9.0 1767225600.000\n"),
            format!("container_sockets{ctr} 3.0 1767225600.000\n"),
            format!("container_threads{ctr} 4.0 1767225600.000\n"),
            format!("container_threads_max{ctr} 0.0 1767225600.000\n"),
            "container_ulimits_soft{container=\"app\",id=\"/kubepods/podu1/c1\",image=\"busybox\",name=\"c1\",namespace=\"default\",pod=\"web\",ulimit=\"max_open_files\"} 1024.0 1767225600.000\n".to_owned(),
            format!("container_spec_memory_reservation_limit_bytes{ctr} 16777216.0\n"),
            format!("container_memory_usage_bytes{ctr} 4096.0 1767225600.000\n"),
            format!("container_memory_rss{ctr} 1024.0 1767225600.000\n"),
            format!("container_memory_cache{ctr} 2048.0 1767225600.000\n"),
            format!("container_memory_swap{ctr} 0.0 1767225600.000\n"),
            format!("container_cpu_cfs_periods_total{ctr} 10.0 1767225600.000\n"),
            format!("container_cpu_cfs_throttled_periods_total{ctr} 4.0 1767225600.000\n"),
            format!("container_cpu_cfs_throttled_seconds_total{ctr} 0.25 1767225600.000\n"),
            "# HELP container_memory_cache Number of bytes of page cache memory.\n".to_owned(),
            // The spec families carry no timestamp, as cAdvisor's constant metrics.
            format!("container_spec_cpu_quota{ctr} 50000.0\n"),
            format!("container_spec_cpu_period{ctr} 100000.0\n"),
            format!("container_spec_cpu_shares{ctr} 512.0\n"),
            format!("container_spec_memory_limit_bytes{ctr} 268435456.0\n"),
            format!("container_spec_memory_swap_limit_bytes{ctr} 0.0\n"),
            format!("container_start_time_seconds{ctr} 1767225000.5\n"),
        ] {
            assert!(text.contains(&want), "{want:?} missing in:\n{text}");
        }
        // cAdvisor's gauge `container_fs_inodes_total` is left out (promtool refuses it).
        assert!(!text.contains("container_fs_inodes_total"));
        assert!(
            !text.contains("container_cpu_cfs_periods_total{container=\"\",id=\"/kubepods/podu1\""),
            "no CFS period, no CFS series:\n{text}"
        );
    }

    /// A pod's network counters on its pod cgroup, one series per interface (`interface` in
    /// cAdvisor's sorted place); none on its containers.
    #[test]
    fn network_counters_per_pod_and_interface() {
        let mut reading = crate::server::summary::tests::reading();
        reading.network = std::collections::HashMap::from([(
            "/kubepods/podu1".to_owned(),
            vec![(
                "eth0".to_owned(),
                NetDev {
                    rx_bytes: 5000,
                    tx_bytes: 7000,
                    rx_dropped: 2,
                    ..NetDev::default()
                },
            )],
        )]);
        let text = page(&reading).expect("encode");
        let pod = "{container=\"\",id=\"/kubepods/podu1\",image=\"\",interface=\"eth0\",name=\"\",namespace=\"default\",pod=\"web\"}";
        for want in [
            format!("container_network_receive_bytes_total{pod} 5000.0 1767225600.000\n"),
            format!("container_network_transmit_bytes_total{pod} 7000.0 1767225600.000\n"),
            format!("container_network_receive_packets_dropped_total{pod} 2.0 1767225600.000\n"),
        ] {
            assert!(text.contains(&want), "{want:?} missing in:\n{text}");
        }
        assert_eq!(
            text.matches("container_network_receive_bytes_total{")
                .count(),
            1,
            "{text}"
        );
    }
}
