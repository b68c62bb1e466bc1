//! cAdvisor's filesystem families on `/metrics/cadvisor`, each with its `device` label:
//! `DiskIOMetrics` from each cgroup's block I/O (`container_fs_{reads,writes}{,_bytes}_total`,
//! the devices of `/sys/block` by name), and `DiskUsageMetrics` of the root container only
//! (`container_fs_{usage,limit}_bytes`, `container_fs_inodes_free` of the machine's
//! filesystems: containerd's containers have none in cAdvisor).

use prometheus_client::{metrics::family::Family, registry::Registry};

use super::{
    super::resource::{FloatCounter, FloatGauge, Labels},
    Cgroup, Series, u64_f64,
};
use crate::{
    server::summary::Reading,
    stats::{disk_io::DeviceIo, filesystems::Filesystem},
};

/// `DiskIOMetrics` served from cgroup files: name, help, which counter.
const IO: [Series<DeviceIo, u64>; 4] = [
    (
        "container_fs_reads_bytes",
        "Cumulative count of bytes read",
        |d| d.read_bytes,
    ),
    (
        "container_fs_reads",
        "Cumulative count of reads completed",
        |d| d.reads,
    ),
    (
        "container_fs_writes_bytes",
        "Cumulative count of bytes written",
        |d| d.write_bytes,
    ),
    (
        "container_fs_writes",
        "Cumulative count of writes completed",
        |d| d.writes,
    ),
];

/// `DiskUsageMetrics` of the root container: name, help, which figure. cAdvisor's
/// `container_fs_inodes_total` is left out: a gauge named `_total`, which `promtool check
/// metrics` refuses (the summary's `node.fs.inodes` has the figure).
const USAGE: [Series<Filesystem, u64>; 3] = [
    (
        "container_fs_inodes_free",
        "Number of available Inodes",
        |f| f.inodes_free,
    ),
    (
        "container_fs_limit_bytes",
        "Number of bytes that can be consumed by the container on this filesystem.",
        |f| f.limit,
    ),
    (
        "container_fs_usage_bytes",
        "Number of bytes that are consumed by the container on this filesystem.",
        |f| f.usage,
    ),
];

/// A cgroup's labels with `device` in its sorted place (after `container`).
fn with_device(c: &Cgroup, device: &str) -> Labels {
    let mut l = c.labels(None);
    l.insert(1, ("device", device.to_owned()));
    l
}

/// The filesystem families of the cgroups of a reading (timestamped by the page).
pub(super) fn families(r: &Reading, cgroups: &[Cgroup]) -> Registry {
    let io: Vec<Family<Labels, FloatCounter>> = IO.iter().map(|_| Family::default()).collect();
    let usage: Vec<Family<Labels, FloatGauge>> = USAGE.iter().map(|_| Family::default()).collect();
    for c in cgroups {
        if let Some(f) = r.figures.get(&c.key) {
            for (dev, counters) in &f.io {
                let name = r.disks.get(dev).map_or("", String::as_str);
                let l = with_device(c, name);
                for ((_, _, get), family) in IO.iter().zip(&io) {
                    family.get_or_create(&l).inc_by(u64_f64(get(counters)));
                }
            }
        }
        if c.key.is_empty() {
            for fs in &r.filesystems {
                let l = with_device(c, &fs.device);
                for ((_, _, get), family) in USAGE.iter().zip(&usage) {
                    family.get_or_create(&l).set(u64_f64(get(fs)));
                }
            }
        }
    }
    let mut reg = Registry::default();
    for ((name, help, _), family) in IO.iter().zip(io) {
        reg.register(*name, *help, family);
    }
    for ((name, help, _), family) in USAGE.iter().zip(usage) {
        reg.register(*name, *help, family);
    }
    reg
}
