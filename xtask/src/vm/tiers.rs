//! The tiers each boot of `vm-test` runs, those it leaves to the host and why, and the jobs
//! of one boot.

use anyhow::Context as _;

use super::{GUEST_TEST_BOUND, Init, Options, TestBinary, list_tests};
use crate::say;

/// The tiers the busybox boot (cgroupfs driver) runs by default, in this order, each with
/// the name filters it runs (none: all its tests): what the kernel decides (eBPF, cgroup v2,
/// PSI, containerd on a v2 node). Of the unit tests only those that read the running
/// kernel (its BTF, its cgroup mounts, its memory): the rest is pure logic, run on the host.
pub const BUSYBOX_TIERS: &[(&str, &[&str])] = &[
    ("unit", &["kernel::", "cgroup::", "node::"]),
    ("signals", &[]),
    // Memory, OOM and pid pressure on v2's files; disk pressure (a tmpfs, no cgroup in it)
    // stays on the host.
    ("pressure", &["memory", "oom_kill", "pid_pressure"]),
    ("enforcement", &[]),
    ("eviction", &[]),
    ("tripwire", &[]),
    // The runtime where cgroups are made, limited, adopted and removed; its CRI logic
    // (backoff, grace periods, init containers, manifests, CNI, image filesystem) is the
    // same on either version and stays on the host.
    (
        "runtime",
        &[
            "manifest_runs_edit_restarts_changed_removal_cleans_up",
            "over_the_memory_limit_is_oom_killed",
            "enforcer_restart_adopts",
            "containerd_restart_reconnects",
        ],
    ),
    // kubelet's node e2e: the memory eviction and OOM scenarios (what cgroup v2 changes:
    // its working set, memory.oom.group, the memory.high tripwire, the cap of a throttled
    // victim); the ranking scenarios (the decision core's order, the same on either version)
    // and the disk ones (a tmpfs nodefs) stay on the host, for time.
    (
        "e2e_eviction",
        &[
            "memory_allocatable_eviction",
            "memory_throttle_then_graceful_stop",
            "oom_killer",
            "pod_using_more",
        ],
    ),
    // Beside a kubelet-shaped node: the companion's kills, its CRI fallback and the kernel
    // OOM killer's choice once aligned, on a v2 node.
    ("companion", &[]),
];

/// The name suffix of tests that need systemd as PID 1 (the systemd driver's own checks):
/// only the systemd boot runs them.
pub const SYSTEMD_ONLY: &str = "_systemdonly";

/// The tests the systemd boot runs (with the systemd driver): what depends on systemd or on
/// the driver, not every kernel tier a second time. The driver decides where pods' cgroups
/// are and who makes them (slices over D-Bus, containerd's scopes), so: pods made, restarted
/// and removed; every cgroup value written through them; a signal attributed to a slice;
/// the kills and OOM kills that find a pod by its slice; the tripwire on `kubepods.slice`;
/// kubeadm's node with the companion beside kubelet. The rest (thresholds, ranking, PSI,
/// signals) is the same code on either driver and runs in the busybox boot.
pub const SYSTEMD_TIERS: &[(&str, &[&str])] = &[
    ("signals", &["systemd"]),
    (
        "runtime",
        &[
            SYSTEMD_ONLY,
            "manifest_runs_edit_restarts_changed_removal_cleans_up",
            "over_the_memory_limit_is_oom_killed",
            "enforcer_restart_adopts",
        ],
    ),
    ("enforcement", &[]),
    ("pressure", &["a_kernel_oom_kill_inside_a_pod"]),
    (
        "e2e_eviction",
        &[
            "memory_allocatable_eviction",
            "oom_killer_single_process",
            "oom_killer_multi_process",
            "pod_using_more",
        ],
    ),
    // kubeadm's node: kubelet's systemd slices and scopes, the companion beside it.
    ("companion", &[]),
];

/// Tiers the busybox boot runs and the systemd boot leaves out, and why.
pub const SYSTEMD_LEFT_OUT: &[(&str, &str)] = &[
    (
        "unit",
        "the kernel-reading unit tests run in the busybox boot on this kernel",
    ),
    (
        "eviction",
        "thresholds and ranking are the driver's same code; the kills through slices run in \
         e2e_eviction here",
    ),
    (
        "tripwire",
        "the tripwire on kubepods.slice runs here in e2e_eviction's pod_using_more scenario",
    ),
];

/// Tiers left out by default, and why (printed on every run, so none is left out silently).
pub const LEFT_OUT: &[(&str, &str)] = &[
    (
        "simulate",
        "the decision core on files: no kernel or cgroup in it",
    ),
    (
        "fuzz",
        "parsers under mutation: no kernel or cgroup in it, and ~10x slower under emulation",
    ),
    (
        "apiserver",
        "the API write-back against an in-process fake API server: its eviction and OOM cases ride on the e2e_eviction paths that run here",
    ),
    (
        "hardening",
        "descriptor limits and hostile input: nothing cgroup-version specific",
    ),
    (
        "security",
        "the security context reaches the process through containerd and runc: nothing \
         cgroup-version specific",
    ),
    (
        "volumes",
        "mounts and files under the pod directory (a memory emptyDir's limit is the pod \
         cgroup's, checked on both versions by enforcement)",
    ),
    (
        "probes",
        "exec, HTTP, TCP and gRPC probes through containerd and the network: nothing \
         cgroup-version specific",
    ),
    (
        "lifecycle",
        "postStart / preStop hooks and termination messages through containerd: nothing \
         cgroup-version specific",
    ),
    (
        "operations",
        "the HTTP endpoints and metrics of a running daemon: nothing cgroup-version specific",
    ),
    (
        "operator_cli",
        "enforcer status and doctor over a running daemon's state: nothing cgroup-version \
         specific",
    ),
    (
        "deploy",
        "the systemd unit and the cluster manifests: files, no kernel in them",
    ),
    (
        "install",
        "the image, the registry, the rendered overlay and Prometheus: the companion's own \
         kernel-facing paths run in the companion tier here",
    ),
];

/// The jobs of one boot: the asked tiers' tests (the boot's default tiers, `all`, or those
/// named), less those this boot cannot run, each said with why; the tiers left out said too.
pub(super) fn plan_jobs(
    built: &[TestBinary],
    opts: &Options,
) -> anyhow::Result<Vec<crate::runner::Job>> {
    let defaults = match opts.init {
        Init::Busybox => BUSYBOX_TIERS,
        Init::Systemd => SYSTEMD_TIERS,
    };
    let wanted: Vec<(String, Vec<String>)> = if opts.tiers.is_empty() {
        defaults
            .iter()
            .map(|(t, f)| ((*t).to_owned(), f.iter().map(|s| (*s).to_owned()).collect()))
            .collect()
    } else if opts.tiers.iter().any(|t| t == "all") {
        let mut names: Vec<String> = built
            .iter()
            .map(|b| b.name.clone())
            .filter(|n| n == "unit" || !n.ends_with("-unit"))
            .collect();
        names.sort_by_key(|n| (n != "unit", n.clone()));
        names.into_iter().map(|n| (n, Vec::new())).collect()
    } else {
        opts.tiers.iter().map(|t| (t.clone(), Vec::new())).collect()
    };
    let user_filters: Vec<String> = opts
        .test_args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .cloned()
        .collect();
    let mut jobs = Vec::new();
    for (tier, filters) in &wanted {
        let bin = built.iter().find(|b| &b.name == tier).with_context(|| {
            let names: Vec<&str> = built.iter().map(|b| b.name.as_str()).collect();
            format!("no test binary {tier}; built: {}", names.join(" "))
        })?;
        let filters = if user_filters.is_empty() {
            filters
        } else {
            &user_filters
        };
        for t in list_tests(&bin.path)? {
            let why_not = if t.ends_with("_v1only") {
                Some("needs the cgroup v1 memory controller: the host tiers run it".to_owned())
            } else if opts.init == Init::Busybox && t.ends_with(SYSTEMD_ONLY) {
                Some(
                    "needs systemd as PID 1: the systemd boot (cargo xtask vm-test --systemd) \
                     runs it"
                        .to_owned(),
                )
            } else if !filters.is_empty() && !filters.iter().any(|f| t.contains(f.as_str())) {
                Some(format!(
                    "this boot runs the tests of the tier matching {}: {}",
                    filters.join(", "),
                    match opts.init {
                        Init::Busybox => "the host tiers run it",
                        Init::Systemd =>
                            "the host tiers and the busybox boot (cgroupfs driver) run it",
                    }
                ))
            } else {
                None
            };
            match why_not {
                Some(why) => say(format!(
                    "vm-test: {tier}::{t} is not run in this boot ({why})"
                )),
                None => jobs.push(crate::runner::Job {
                    tier: tier.clone(),
                    bin: bin.path.clone(),
                    cwd: bin.cwd.clone(),
                    test: t,
                    group: Some("guest".to_owned()),
                    bound: GUEST_TEST_BOUND,
                }),
            }
        }
    }
    for b in built {
        if !wanted.iter().any(|(t, _)| t == &b.name) {
            let left_out = match opts.init {
                Init::Systemd => SYSTEMD_LEFT_OUT.iter().chain(LEFT_OUT),
                Init::Busybox => [].iter().chain(LEFT_OUT),
            };
            let why = if b.name.ends_with("-unit") {
                "unit tests of another crate or binary: pure logic"
            } else {
                left_out
                    .clone()
                    .find(|(n, _)| *n == b.name)
                    .map_or("not asked for", |(_, why)| why)
            };
            say(format!(
                "vm-test: tier {} is not run in the VM ({why}); the host tiers run it",
                b.name
            ));
        }
    }
    Ok(jobs)
}
