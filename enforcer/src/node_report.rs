//! The operator's view of the node: `enforcer status` (one screen: conditions, each threshold
//! with its observation and margin, the signal sources in use with their delays, the last
//! kills, pods by QoS class) and `enforcer doctor` (the node checked against what the
//! enforcer expects, each finding with its fix).
//!
//! The eviction manager writes what only it knows to `<state>/eviction.json` (at most once a
//! second, and whenever a condition changes): the thresholds against the step's
//! observations, and per signal source the delay from the kernel event to the daemon over
//! the last [`DELAY_WINDOW`] signals. The rest comes from the state directory (`pods.json`,
//! the kill records) and from the kernel itself.

use std::{
    collections::{BTreeMap, VecDeque},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::{
    policy::{
        cgroup_name::{self, CgroupDriver},
        eviction::{Observations, manager::EvictionConfig},
        qos::QosClass,
    },
    signal::Signal,
    state_log::cell,
};

/// The file under the state directory.
pub const FILE: &str = "eviction.json";
/// The cgroup values the daemon wrote (file -> value), for `enforcer doctor`.
pub const CGROUPS_FILE: &str = "cgroups.json";
/// Signals per source the delay percentiles are taken over.
pub const DELAY_WINDOW: usize = 1024;

/// One threshold against the latest observation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThresholdLine {
    pub signal: String,
    /// As configured: `100Mi`, `10%`.
    pub threshold: String,
    /// `hard`, or the soft threshold's grace period.
    pub kind: String,
    /// The threshold resolved against the capacity (base units); `None`: no observation.
    #[serde(default)]
    pub threshold_value: Option<i64>,
    #[serde(default)]
    pub available: Option<i64>,
    #[serde(default)]
    pub capacity: Option<i64>,
    /// Whether the decision core counts it met.
    pub met: bool,
}

/// Delays of one signal source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceDelay {
    pub source: String,
    /// Signals seen since the daemon started.
    pub signals: u64,
    /// Kernel event -> daemon, over the last signals that carry a kernel time (µs).
    #[serde(default)]
    pub p50_us: Option<u64>,
    #[serde(default)]
    pub p99_us: Option<u64>,
}

/// What the eviction manager writes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Wall-clock time of the step, RFC 3339.
    pub updated: String,
    /// Nanoseconds since the Unix epoch of the same (for ages).
    pub updated_ns: i64,
    pub conditions: Vec<String>,
    pub thresholds: Vec<ThresholdLine>,
    pub sources: Vec<SourceDelay>,
}

/// The thresholds of `config` against `obs` (`met`: the decision core's indices).
#[must_use]
pub fn threshold_lines(
    config: &EvictionConfig,
    obs: &Observations,
    met: &[usize],
) -> Vec<ThresholdLine> {
    config
        .thresholds
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let o = obs.get(&t.signal);
            ThresholdLine {
                signal: t.signal.to_string(),
                threshold: t.value.to_string(),
                kind: if t.is_hard() {
                    "hard".to_owned()
                } else {
                    format!("soft, grace {:?}", t.grace_period)
                },
                threshold_value: o.map(|o| t.value.resolve(o.capacity).value()),
                available: o.map(|o| o.available),
                capacity: o.map(|o| o.capacity),
                met: met.contains(&i),
            }
        })
        .collect()
}

/// Signal delays per source, over a window.
#[derive(Debug, Default)]
pub struct Delays {
    by_source: BTreeMap<&'static str, (u64, VecDeque<u64>)>,
}

impl Delays {
    /// Counts `s` and, when it carries a kernel time, its delay.
    pub fn observe(&mut self, s: &Signal) {
        let (count, window) = self.by_source.entry(s.source.as_str()).or_default();
        *count = count.saturating_add(1);
        if let Some(k) = s.kernel_ns {
            if window.len() >= DELAY_WINDOW {
                window.pop_front();
            }
            window.push_back(s.received_ns.saturating_sub(k) / 1000);
        }
    }

    /// The sources with their percentiles.
    #[must_use]
    pub fn summary(&self) -> Vec<SourceDelay> {
        self.by_source
            .iter()
            .map(|(source, (signals, window))| {
                let mut v: Vec<u64> = window.iter().copied().collect();
                v.sort_unstable();
                let pct = |p: usize| (!v.is_empty()).then(|| v[(v.len() - 1) * p / 100]);
                SourceDelay {
                    source: (*source).to_owned(),
                    signals: *signals,
                    p50_us: pct(50),
                    p99_us: pct(99),
                }
            })
            .collect()
    }
}

/// Writes the report (a temporary file renamed over the old one: readers see a whole one).
///
/// # Errors
/// Writing or renaming failed.
pub fn write(state_dir: &Path, report: &Report) -> std::io::Result<()> {
    let data = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    let path = state_dir.join(FILE);
    let tmp = state_dir.join(format!(".{FILE}.tmp"));
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, &path)
}

/// Writes the cgroup values the daemon wrote (`cgroup::writer::written`).
///
/// # Errors
/// Writing or renaming failed.
pub fn write_cgroups(state_dir: &Path, files: &BTreeMap<PathBuf, String>) -> std::io::Result<()> {
    let map: BTreeMap<String, &String> = files
        .iter()
        .map(|(f, v)| (f.display().to_string(), v))
        .collect();
    let data = serde_json::to_vec_pretty(&map).map_err(std::io::Error::other)?;
    let tmp = state_dir.join(format!(".{CGROUPS_FILE}.tmp"));
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, state_dir.join(CGROUPS_FILE))
}

/// Whether `have` (read back from `file`) is the `want` the daemon wrote: memory values are
/// rounded down to pages by the kernel, and v1's unlimited reads back as a huge number.
#[must_use]
pub fn same_cgroup_value(file: &str, want: &str, have: &str) -> bool {
    const PAGE: i64 = 4096;
    let huge = |v: &str| v.parse::<i64>().is_ok_and(|n| n >= 1 << 62);
    if file.starts_with("memory.") {
        return match (want, want.parse::<i64>()) {
            ("max", _) => have == "max" || huge(have),
            (_, Ok(w)) => have
                .parse::<i64>()
                .is_ok_and(|h| h == w / PAGE * PAGE || h == w),
            _ => want == have,
        };
    }
    want == have
}

/// Reads the report; `None` when the daemon has not written one.
///
/// # Errors
/// The file exists but cannot be read or decoded.
pub fn read(state_dir: &Path) -> Result<Option<Report>, ReportError> {
    let path = state_dir.join(FILE);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|source| ReportError::Decode { path, source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ReportError::Read { path, source }),
    }
}

/// A report file that exists but cannot be read or decoded.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", .path.display())]
    Decode {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// One finding of `enforcer doctor`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub problem: String,
    pub fix: String,
}

/// Whether `adj` is what kubelet gives a process of a pod of `qos` (its sandbox -998).
#[must_use]
pub fn oom_score_fits(qos: &str, adj: i32) -> bool {
    adj == -998
        || match qos {
            "Guaranteed" => adj == -997,
            "BestEffort" => adj == 1000,
            "Burstable" => (2..=999).contains(&adj),
            _ => true,
        }
}

fn processes_below(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            stack.extend(
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    pids
}

/// The checks (see the module doc); an empty list: the node is as the enforcer expects.
#[must_use]
pub fn doctor(config: &crate::config::Config) -> Doctor {
    let mut crossing = String::new();
    let findings = doctor_findings(config, &mut crossing);
    Doctor { crossing, findings }
}

/// What `enforcer doctor` found.
#[derive(Debug)]
pub struct Doctor {
    /// Where the crossing check attaches on this kernel (or why nowhere), in a line.
    pub crossing: String,
    pub findings: Vec<Finding>,
}

fn doctor_findings(config: &crate::config::Config, crossing: &mut String) -> Vec<Finding> {
    let mut out = Vec::new();
    let layout = match crate::cgroup::CgroupLayout::discover() {
        Ok(l) => l,
        Err(e) => {
            out.push(Finding {
                check: "cgroups",
                problem: format!("no cgroup hierarchy found: {e}"),
                fix: "mount cgroup2 on /sys/fs/cgroup".to_owned(),
            });
            return out;
        }
    };
    check_kernel(config, &layout, crossing, &mut out);
    let state = &config.enforcer.state_dir;
    let pods = match crate::status_manager::read(state) {
        Ok(p) => p,
        Err(e) => {
            out.push(Finding {
                check: "state",
                problem: format!("cannot read the pods' status: {e}"),
                fix: "start the daemon (enforcer run) with this --state-dir".to_owned(),
            });
            return out;
        }
    };
    let Some(mount) = layout.memory().map(|m| m.mount()) else {
        return out;
    };
    check_pods(&pods, mount, &mut out);
    check_cgroup_values(state, &mut out);
    check_leftover_cgroups(config, &pods, mount, &mut out);
    out
}

/// The kernel, the cgroups, the capabilities and the scheduling the daemon needs.
fn check_kernel(
    config: &crate::config::Config,
    layout: &crate::cgroup::CgroupLayout,
    crossing: &mut String,
    out: &mut Vec<Finding>,
) {
    let mut add = |check, problem: String, fix: &str| {
        out.push(Finding {
            check,
            problem,
            fix: fix.to_owned(),
        });
    };
    let caps = crate::kernel::Capabilities::probe(layout);
    if !caps.btf {
        add(
            "kernel",
            "no BTF (/sys/kernel/btf/vmlinux)".to_owned(),
            "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y; until then the fallback signal sources are used",
        );
    }
    if !caps.tracefs_mounted {
        add(
            "kernel",
            "tracefs is not mounted".to_owned(),
            "mount -t tracefs nodev /sys/kernel/tracing (the daemon tries at start)",
        );
    }
    if !caps.tracepoints_missing.is_empty() {
        add(
            "kernel",
            format!(
                "tracepoints missing: {}",
                caps.tracepoints_missing.join(", ")
            ),
            "a kernel with these tracepoints (see `enforcer probe`); the signals they carry come from the fallbacks",
        );
    }
    *crossing = check_crossing(config, &caps, &mut add);
    if !caps.psi {
        add(
            "kernel",
            "PSI is off".to_owned(),
            "boot with psi=1 (CONFIG_PSI)",
        );
    }
    if caps.memory_controller.is_none() {
        add(
            "cgroups",
            "no memory controller".to_owned(),
            "enable the memory controller (cgroup_enable=memory; on v2, +memory in the root's cgroup.subtree_control)",
        );
    }
    if !caps.cap_sys_resource {
        add(
            "capabilities",
            "no CAP_SYS_RESOURCE: negative oom_score_adj values (Guaranteed pods, -997) are clamped".to_owned(),
            "run the daemon with CAP_SYS_RESOURCE (deploy/systemd/enforcer.service keeps it)",
        );
    }
    if !caps.cap_bpf_or_sys_admin {
        add(
            "capabilities",
            "neither CAP_BPF nor CAP_SYS_ADMIN: the eBPF programs cannot load".to_owned(),
            "run the daemon with CAP_BPF and CAP_PERFMON",
        );
    }
    if config.enforcer.crossing_realtime
        && let Err(e) = crate::kernel::realtime::realtime_allowed()
    {
        add(
            "scheduling",
            format!(
                "the crossing thread (signal readers, eviction manager) cannot run at real-time priority (SCHED_FIFO {}): {e}; it runs at ordinary priority",
                crate::kernel::realtime::PRIORITY
            ),
            "run the daemon with CAP_SYS_NICE (deploy/ keeps it); with CONFIG_RT_GROUP_SCHED, give its cgroup real-time runtime (cpu.rt_runtime_us)",
        );
    }
    if config.enforcer.reap_memory && !crate::cgroup::kill::process_mrelease_supported() {
        add(
            "kernel",
            "no process_mrelease(2) (Linux 5.15+): an evicted pod's memory comes back only as its processes exit".to_owned(),
            "boot Linux 5.15 or later; until then the kernel frees it at exit",
        );
    }
    if caps.btf
        && caps.cap_bpf_or_sys_admin
        && let Some(mount) = layout.memory().map(|m| m.mount())
        && let Err(e) = crate::kernel::memcg_iter::MemcgIter::open(mount, mount, 1)
    {
        add(
            "kernel",
            format!(
                "no memory cgroup iterator ({e}): a crossing reads each pod's usage file, slower with many pods"
            ),
            "boot Linux 6.1 or later with BTF (6.5 or later on cgroup v1)",
        );
    }
    if config.cgroup_driver == CgroupDriver::Systemd
        && let Err(e) = crate::cgroup::systemd::Systemd::connect()
    {
        add(
            "cgroups",
            format!("cgroupDriver is systemd, but systemd does not answer: {e}"),
            "run systemd as PID 1 with the system bus (dbus), or set cgroupDriver: cgroupfs together with containerd's SystemdCgroup = false",
        );
    }
}

/// Where the crossing check attaches as the configuration allows (the programs loaded and
/// detached again), in a line; a kernel where it attaches nowhere is a finding.
fn check_crossing(
    config: &crate::config::Config,
    caps: &crate::kernel::Capabilities,
    add: &mut impl FnMut(&'static str, String, &str),
) -> String {
    let mode = config.enforcer.signal_source.crossing_mode();
    let mut crossing = if mode == crate::kernel::CrossingMode::Off {
        format!(
            "off (signalSource {})",
            config.enforcer.signal_source.name()
        )
    } else if !caps.btf || !caps.cap_bpf_or_sys_admin {
        "none: no BTF or no CAP_BPF (below)".to_owned()
    } else {
        String::new()
    };
    if crossing.is_empty() {
        let probed = crate::kernel::ebpf::probe_crossing(mode);
        crossing = match &probed {
            Ok(c) => c.summary(),
            Err(e) => format!("none: the eBPF programs do not load ({e})"),
        };
        match probed {
            Ok(c) if c.chosen.is_none() => add(
                "kernel",
                format!(
                    "no crossing check on the memory charge path ({})",
                    c.skipped
                        .iter()
                        .map(|s| format!("{}: {}", s.attach.name(), s.reason))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
                "a kernel with BTF and fentry (CONFIG_FUNCTION_TRACER) or kprobes (CONFIG_KPROBES) on try_charge_memcg, as Debian, Ubuntu, RHEL and COS kernels have; until then a crossing is learned by the cgroup-file tripwire (v2 memory.high, v1 a usage-threshold eventfd)",
            ),
            Ok(_) => {}
            Err(e) => add(
                "kernel",
                format!("the eBPF programs do not load: {e}"),
                "see `enforcer probe`; until then the fallback signal sources are used",
            ),
        }
    }
    crossing
}

/// Each running pod's cgroup still there, its processes' `oom_score_adj` as its QoS class
/// wants.
fn check_pods(pods: &crate::status_manager::StatusFile, mount: &Path, out: &mut Vec<Finding>) {
    let mut add = |check, problem: String, fix: &str| {
        out.push(Finding {
            check,
            problem,
            fix: fix.to_owned(),
        });
    };
    for p in &pods.pods {
        if p.cgroup.is_empty()
            || matches!(
                p.phase,
                crate::status_manager::PodPhase::Succeeded
                    | crate::status_manager::PodPhase::Failed
            )
        {
            continue;
        }
        let Ok(dir) = crate::cgroup::join_inside(mount, &p.cgroup) else {
            add(
                "cgroups",
                format!(
                    "pod {}/{}: cgroup {:?} escapes the hierarchy",
                    p.namespace, p.name, p.cgroup
                ),
                "delete the pod; its state is corrupt",
            );
            continue;
        };
        if !dir.exists() {
            add(
                "cgroups",
                format!(
                    "pod {}/{} is running but its cgroup {} is gone",
                    cell(&p.namespace),
                    cell(&p.name),
                    dir.display()
                ),
                "restart the daemon: it adopts running pods and recreates their cgroups",
            );
            continue;
        }
        for pid in processes_below(&dir) {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")) else {
                continue;
            };
            let Ok(adj) = text.trim().parse::<i32>() else {
                continue;
            };
            if !oom_score_fits(&p.qos_class, adj) {
                add(
                    "oom_score_adj",
                    format!(
                        "pod {}/{} ({}): pid {pid} has oom_score_adj {adj}",
                        cell(&p.namespace),
                        cell(&p.name),
                        p.qos_class
                    ),
                    "the daemon sets it at container start; with CAP_SYS_RESOURCE a restart of the container fixes it",
                );
            }
        }
    }
}

/// The values the daemon wrote (its cgroups file in `state`) against what is on disk now.
fn check_cgroup_values(state: &Path, out: &mut Vec<Finding>) {
    let mut add = |check, problem: String, fix: &str| {
        out.push(Finding {
            check,
            problem,
            fix: fix.to_owned(),
        });
    };
    if let Ok(text) = std::fs::read(state.join(CGROUPS_FILE)) {
        let written: BTreeMap<String, String> = serde_json::from_slice(&text).unwrap_or_default();
        for (file, want) in &written {
            let path = Path::new(file);
            if !path.parent().is_some_and(Path::exists) {
                continue;
            }
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            match std::fs::read_to_string(path) {
                Ok(have) if same_cgroup_value(&name, want, have.trim()) => {}
                Ok(have) => add(
                    "cgroup values",
                    format!("{file} is {} on disk; the daemon wrote {want}", have.trim()),
                    "another writer changed it (a second node agent, an operator): find it; a restart of the daemon writes the values again",
                ),
                Err(e) => add(
                    "cgroup values",
                    format!("{file}: {e}"),
                    "the controller file is gone from an existing cgroup: check the controllers enabled for it",
                ),
            }
        }
    }
}

/// Pod cgroups of pods the daemon no longer knows (either driver's layout).
fn check_leftover_cgroups(
    config: &crate::config::Config,
    pods: &crate::status_manager::StatusFile,
    mount: &Path,
    out: &mut Vec<Finding>,
) {
    let mut add = |check, problem: String, fix: &str| {
        out.push(Finding {
            check,
            problem,
            fix: fix.to_owned(),
        });
    };
    let known: std::collections::BTreeSet<&str> =
        pods.pods.iter().map(|p| p.cgroup.as_str()).collect();
    let tiers = [
        QosClass::Guaranteed,
        QosClass::Burstable,
        QosClass::BestEffort,
    ]
    .map(|q| {
        config
            .cgroup_driver
            .name(&cgroup_name::qos_tier(&config.cgroup_root, q))
    });
    for tier in tiers {
        let Ok(tier) = crate::cgroup::join_inside(mount, &tier) else {
            continue;
        };
        let Ok(rd) = std::fs::read_dir(&tier) else {
            continue;
        };
        for e in rd.flatten() {
            if !e.path().is_dir() {
                continue;
            }
            let rel = e
                .path()
                .strip_prefix(mount)
                .map(|r| format!("/{}", r.display()))
                .unwrap_or_default();
            if crate::cgroup::pod_of_path(&rel).is_none_or(|p| p.container.is_some())
                || known.contains(rel.as_str())
            {
                continue;
            }
            let procs = processes_below(&e.path()).len();
            add(
                "cgroups",
                format!(
                    "leftover pod cgroup {} ({procs} processes): no pod of this node has it",
                    e.path().display()
                ),
                if procs == 0 {
                    match config.cgroup_driver {
                        CgroupDriver::Cgroupfs => "rmdir it (and its container cgroups first)",
                        CgroupDriver::Systemd => "systemctl stop its slice",
                    }
                } else {
                    "its processes run outside any pod the node knows: stop them, then remove it"
                },
            );
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn cgroup_values_as_the_kernel_shows_them() {
        assert!(same_cgroup_value("memory.max", "max", "max"));
        assert!(same_cgroup_value(
            "memory.limit_in_bytes",
            "max",
            "9223372036854771712"
        ));
        assert!(
            same_cgroup_value("memory.max", "104857601", "104857600"),
            "page rounding"
        );
        assert!(!same_cgroup_value("memory.max", "104857600", "52428800"));
        assert!(same_cgroup_value("cpu.weight", "39", "39"));
        assert!(!same_cgroup_value("pids.max", "100", "max"));
        assert!(same_cgroup_value("cpu.max", "max 100000", "max 100000"));
    }

    #[test]
    fn oom_scores_by_class() {
        assert!(oom_score_fits("Guaranteed", -997));
        assert!(!oom_score_fits("Guaranteed", 0));
        assert!(oom_score_fits("BestEffort", 1000));
        assert!(!oom_score_fits("BestEffort", 999));
        assert!(oom_score_fits("Burstable", 2) && oom_score_fits("Burstable", 999));
        assert!(!oom_score_fits("Burstable", 1000) && !oom_score_fits("Burstable", 0));
        assert!(oom_score_fits("Burstable", -998), "the sandbox");
    }

    /// 100 eBPF signals with delays 1..=100 us (also for `cli::status`' tests).
    pub(crate) fn sample_delays() -> Delays {
        let mut d = Delays::default();
        for i in 0..100u64 {
            d.observe(&Signal {
                kernel_ns: Some(1_000_000),
                received_ns: 1_000_000 + (i + 1) * 1000,
                ..Signal::new(
                    crate::signal::SignalKind::MemcgReclaim,
                    crate::signal::SourceKind::Ebpf,
                )
            });
        }
        d
    }

    #[test]
    fn delays_by_source() {
        let s = sample_delays().summary();
        assert_eq!(s.len(), 1);
        assert_eq!(
            (s[0].signals, s[0].p50_us, s[0].p99_us),
            (100, Some(50), Some(99))
        );
    }
}
