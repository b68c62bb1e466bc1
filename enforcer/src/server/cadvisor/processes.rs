//! cAdvisor's `ProcessMetrics` on `/metrics/cadvisor` (kubelet enables them): each cgroup's
//! processes, open descriptors, sockets, threads and their limit, and the soft open-files
//! limit of its first process (`container_ulimits_soft{ulimit="max_open_files"}`).

use prometheus_client::{metrics::family::Family, registry::Registry};

use super::{
    super::resource::{FloatGauge, Labels},
    Cgroup, Series, u64_f64,
};
use crate::{server::summary::Reading, stats::processes::Processes};

/// The families: name, help, which figure (`None`: not served for the cgroup).
const FAMILIES: [Series<Processes, Option<u64>>; 5] = [
    (
        "container_file_descriptors",
        "Number of open file descriptors for the container.",
        |p| Some(p.fds),
    ),
    (
        "container_processes",
        "Number of processes running inside the container.",
        |p| Some(p.processes),
    ),
    (
        "container_sockets",
        "Number of open sockets for the container.",
        |p| Some(p.sockets),
    ),
    (
        "container_threads",
        "Number of threads running inside the container",
        |p| p.threads,
    ),
    (
        "container_threads_max",
        "Maximum number of threads allowed inside the container, infinity if value is zero",
        |p| p.threads_max,
    ),
];

/// The process families of the cgroups of a reading (timestamped by the page).
pub(super) fn families(r: &Reading, cgroups: &[Cgroup]) -> Registry {
    let gauges: Vec<Family<Labels, FloatGauge>> =
        FAMILIES.iter().map(|_| Family::default()).collect();
    let ulimits: Family<Labels, FloatGauge> = Family::default();
    for c in cgroups {
        let Some(p) = r.figures.get(&c.key).and_then(|f| f.processes) else {
            continue;
        };
        let l = c.labels(None);
        for ((_, _, get), family) in FAMILIES.iter().zip(&gauges) {
            if let Some(v) = get(&p) {
                family.get_or_create(&l).set(u64_f64(v));
            }
        }
        if let Some(v) = p.max_open_files {
            let mut lu = l.clone();
            lu.push(("ulimit", "max_open_files".to_owned()));
            ulimits.get_or_create(&lu).set(u64_f64(v));
        }
    }
    let mut reg = Registry::default();
    for ((name, help, _), family) in FAMILIES.iter().zip(gauges) {
        reg.register(*name, *help, family);
    }
    reg.register(
        "container_ulimits_soft",
        "Soft ulimit values for the container root process. Unlimited if -1, except priority and nice",
        ulimits,
    );
    reg
}
