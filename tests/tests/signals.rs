//! The signal pipeline on the real kernel: eBPF programs loaded and attached, real cgroups,
//! real memory pressure; and the eventfd / polling fallbacks on the same workload.

use std::{path::PathBuf, process::Command, time::Duration};

use enforcer::{
    cgroup::QosTier,
    kernel::{self, Capabilities, PipelineOptions, SourceChoice, Watch, tracefmt},
    signal::{SignalKind, SourceKind},
};
use enforcer_tests::{
    TestCgroup, layout, memory_is_v2, require_memory_v1, require_root, spawn_in, unique_name,
    wait_for,
};

const MIB: u64 = 1 << 20;

/// The OOM tests run one at a time: every eBPF pipeline sees every OOM kill and reclaim storm
/// on the node, and with two hogs at once a pump can read a cgroup v1 victim's
/// `/proc/<pid>/cgroup` after it exited (it then reads `/`), which would misattribute the kill.
static OOM_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn start(source: SourceChoice, watches: Vec<Watch>) -> kernel::Pipeline {
    start_with(source, watches, PipelineOptions::default().tracing_roots)
}

/// As `start`, with the tracepoint formats read from `tracing_roots` (first match wins).
fn start_with(
    source: SourceChoice,
    watches: Vec<Watch>,
    tracing_roots: Vec<PathBuf>,
) -> kernel::Pipeline {
    require_root();
    let layout = layout();
    let caps = Capabilities::probe(&layout);
    let opts = PipelineOptions {
        source,
        watches,
        poll_interval: Duration::from_millis(100),
        tracing_roots,
        ..Default::default()
    };
    let p = kernel::start(&opts, &caps, &layout).expect("signal pipeline starts");
    if let SourceChoice::Only(k) = source {
        assert_eq!(p.source, k);
    }
    p
}

fn memory_mount() -> std::path::PathBuf {
    let l = layout();
    l.controller("memory")
        .expect("a memory controller (v1 or v2) on this machine")
        .0
        .to_path_buf()
}

fn memhog(mib: u64, step_ms: u64, hold_ms: u64) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memhog"));
    c.args([mib.to_string(), step_ms.to_string(), hold_ms.to_string()]);
    c.stdout(std::process::Stdio::null());
    c
}

#[tokio::test]
async fn ebpf_reports_cgroup_mkdir_and_rmdir_with_paths_and_pods() {
    let mut p = start(SourceChoice::Only(SourceKind::Ebpf), vec![]);
    let l = layout();
    let name = unique_name("mkdir");
    let rel = format!("{name}/kubepods/burstable/pod0b1c2d3e-aaaa-bbbb-cccc-000000000001");
    let mut mem = TestCgroup::create(&memory_mount(), &rel);
    // On a v1 memory controller the unified hierarchy is another tree: a cgroup made there
    // is reported from it. On v2 the memory cgroup is in the unified hierarchy itself.
    let v2 = memory_is_v2();
    let uni = l
        .unified
        .as_deref()
        .filter(|_| !v2)
        .map(|u| TestCgroup::create(u, &name));

    let want = mem.rel();
    let s = wait_for(
        &mut p.signals,
        Duration::from_secs(5),
        "mkdir of the pod cgroup",
        |s| s.kind == SignalKind::CgroupCreated && s.cgroup.as_deref() == Some(want.as_str()),
    )
    .await;
    assert_eq!(s.source, SourceKind::Ebpf);
    if v2 {
        assert_eq!(s.hierarchy.as_deref(), Some("unified"));
    }
    assert_eq!(
        s.pod_uid.as_deref(),
        Some("0b1c2d3e-aaaa-bbbb-cccc-000000000001")
    );
    assert_eq!(s.qos, Some(QosTier::Burstable));
    assert_eq!(s.detail.level, Some(4));
    assert_eq!(
        s.cgroup_id,
        Some(mem.ino()),
        "mkdir carries the new cgroup's id (its inode)"
    );
    assert!(
        s.delay_ns().is_some_and(|d| d < 1_000_000_000),
        "delivered within a second: {:?}",
        s.delay_ns()
    );

    if let Some(uni) = &uni {
        let want = uni.rel();
        let s = wait_for(
            &mut p.signals,
            Duration::from_secs(5),
            "mkdir in the unified hierarchy",
            |s| s.kind == SignalKind::CgroupCreated && s.cgroup.as_deref() == Some(want.as_str()),
        )
        .await;
        assert_eq!(s.hierarchy.as_deref(), Some("unified"));
        assert_eq!(s.cgroup_id, Some(uni.ino()));
    }

    mem.remove();
    let s = wait_for(
        &mut p.signals,
        Duration::from_secs(5),
        "rmdir of the pod cgroup",
        |s| s.kind == SignalKind::CgroupRemoved && s.cgroup.as_deref() == Some(want.as_str()),
    )
    .await;
    assert_eq!(s.qos, Some(QosTier::Burstable));
    let top = format!("/{name}");
    wait_for(
        &mut p.signals,
        Duration::from_secs(5),
        "rmdir of the test root",
        |s| {
            s.kind == SignalKind::CgroupRemoved
                && s.cgroup.as_deref() == Some(top.as_str())
                && (s.hierarchy.as_deref() == Some("unified")) == v2
        },
    )
    .await;
}

/// The systemd driver's layout (`kubepods-burstable-pod<uid>.slice`, the uid's `-` as `_`,
/// `cri-containerd-<id>.scope` below it) is attributed to its pod and container as the
/// cgroupfs one is: the cgroups are made here by name, no systemd needed. On v2 also below a
/// long cgroup root, whose path does not fit the record (220 bytes): the whole path comes
/// from the cgroup's id.
#[tokio::test]
async fn ebpf_attributes_systemd_slices_and_scopes_to_their_pod() {
    use enforcer::policy::{
        cgroup_name::{self, CgroupDriver},
        qos::QosClass,
    };
    let mut p = start(SourceChoice::Only(SourceKind::Ebpf), vec![]);
    let uid = "0b1c2d3e-aaaa-bbbb-cccc-000000000009";
    let mut roots = vec![format!("/es{}", std::process::id())];
    if memory_is_v2() {
        roots.push(format!(
            "/{}",
            unique_name("slices-below-a-long-cgroup-root")
        ));
    }
    for root in roots {
        let pod = cgroup_name::pod(&root, QosClass::Burstable, uid).expect("pod name");
        let slice = CgroupDriver::Systemd.name(&pod);
        assert!(
            slice.ends_with("-kubepods-burstable-pod0b1c2d3e_aaaa_bbbb_cccc_000000000009.slice")
        );
        let rel = format!(
            "{}/cri-containerd-c0ffee.scope",
            slice.trim_start_matches('/')
        );
        let mut mem = TestCgroup::create(&memory_mount(), &rel);
        let want = mem.rel();
        let s = wait_for(
            &mut p.signals,
            Duration::from_secs(5),
            "mkdir of the container scope",
            |s| s.kind == SignalKind::CgroupCreated && s.cgroup.as_deref() == Some(want.as_str()),
        )
        .await;
        assert_eq!(
            s.pod_uid.as_deref(),
            Some(uid),
            "{want} ({} bytes)",
            want.len()
        );
        assert_eq!(s.qos, Some(QosTier::Burstable));
        let attributed = s.cgroup.as_deref().and_then(enforcer::cgroup::pod_of_path);
        assert_eq!(
            attributed.and_then(|a| a.container).as_deref(),
            Some("c0ffee")
        );
        mem.remove();
    }
}

#[tokio::test]
async fn ebpf_reports_memcg_reclaim_then_oom_kill_attributed_to_the_cgroup() {
    let _one_at_a_time = OOM_TESTS.lock().await;
    let mut p = start(SourceChoice::Only(SourceKind::Ebpf), vec![]);
    let l = layout();
    let name = unique_name("oom");
    let rel = format!("{name}/kubepods/besteffort/podfeedface-0000-0000-0000-000000000002");
    let mem = TestCgroup::create(&memory_mount(), &rel);
    let v1 = mem.dir.join("memory.limit_in_bytes").exists();
    mem.write(
        if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        },
        &(64 * MIB).to_string(),
    );
    if v1 {
        // On v1 a reclaim record names its memory cgroup by the task's `/proc` entry, read
        // when the record is: a consumer slowed by a loaded machine would find the hog already
        // OOM-killed. Hold it at the OOM (the kernel's `oom_kill_disable`) until the record is
        // read; the kill comes once the hold is lifted.
        mem.write("memory.oom_control", "1");
    } else {
        mem.write("memory.swap.max", "0");
    }
    // Also place the task in a unified cgroup, so the record's v2 id is checked too.
    let uni = l
        .unified
        .as_deref()
        .filter(|_| v1)
        .map(|u| TestCgroup::create(u, &name));
    let mut groups = vec![mem.dir.as_path()];
    if let Some(u) = &uni {
        groups.push(u.dir.as_path());
    }
    let mut child = spawn_in(memhog(200, 0, 0), &groups);
    let pid = child.id();

    let want = mem.rel();
    let s = wait_for(
        &mut p.signals,
        Duration::from_secs(10),
        "memcg reclaim in the test cgroup",
        |s| s.kind == SignalKind::MemcgReclaim && s.cgroup.as_deref() == Some(want.as_str()),
    )
    .await;
    assert_eq!(s.pid, Some(pid), "the reclaiming task is the hog");
    assert_eq!(s.qos, Some(QosTier::BestEffort));
    assert_eq!(
        s.pod_uid.as_deref(),
        Some("feedface-0000-0000-0000-000000000002")
    );
    if let Some(u) = &uni {
        assert_eq!(
            s.cgroup_id,
            Some(u.ino()),
            "the record carries the task's v2 cgroup id"
        );
    }
    if v1 {
        mem.write("memory.oom_control", "0");
    }
    // Other tests OOM-kill their own hogs meanwhile: this one names ours. The kernel takes
    // its time to give up reclaiming before the OOM kill (under emulation it reclaims and
    // re-reads the hog's own text from the 9p root: 40 s once in the VM tier), so the bound
    // is the kernel's, wider than the reclaim record's.
    let s = wait_for(
        &mut p.signals,
        Duration::from_secs(30),
        "the OOM kill of the hog",
        |s| s.kind == SignalKind::OomKill && s.pid == Some(pid),
    )
    .await;
    assert_eq!(
        s.cgroup.as_deref(),
        Some(want.as_str()),
        "in the test cgroup"
    );
    // This kernel's mark_victim has comm, anon_rss and oom_score_adj: read at the offsets its
    // format gives.
    assert_eq!(s.comm.as_deref(), Some("memhog"));
    assert!(
        s.detail
            .anon_rss_bytes
            .is_some_and(|b| b > 32 * MIB && b <= 64 * MIB),
        "{:?}",
        s.detail
    );
    let adj: i32 = std::fs::read_to_string("/proc/self/oom_score_adj")
        .expect("own oom_score_adj")
        .trim()
        .parse()
        .expect("a number");
    assert_eq!(
        s.detail.oom_score_adj,
        Some(adj),
        "the hog inherits the test's oom_score_adj"
    );
    let status = child.wait().expect("hog exits");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(9), "the kernel OOM-killed the hog");
}

/// Offsets of `category/name`'s fields as the running kernel's format file gives them, read
/// here independently of the loader: (name, offset, size).
fn kernel_fields(category: &str, name: &str) -> Vec<(String, u32, u32)> {
    let (_, text) = tracefmt::read_format(tracefmt::TRACING_ROOTS, category, name)
        .expect("the running kernel's format");
    tracefmt::parse_format(&text)
        .expect("parses")
        .into_iter()
        .map(|f| (f.name, f.offset, f.size))
        .collect()
}

#[tokio::test]
async fn ebpf_attaches_every_program_with_this_kernels_offsets() {
    let p = start(SourceChoice::Only(SourceKind::Ebpf), vec![]);
    let used: Vec<String> = kernel::probe::TRACEPOINTS
        .iter()
        .map(|t| format!("{}/{}", t.category, t.name))
        .collect();
    let got: Vec<&str> = p
        .tracepoints
        .iter()
        .map(|t| t.tracepoint.as_str())
        .collect();
    assert_eq!(got, used, "one status per tracepoint used");
    for tp in &p.tracepoints {
        assert!(tp.attached, "{} attached", tp.tracepoint);
        assert_eq!(tp.format_error, None, "{}", tp.tracepoint);
        let (category, name) = tp.tracepoint.split_once('/').expect("category/name");
        let kernel = kernel_fields(category, name);
        for f in &tp.fields {
            let k = kernel
                .iter()
                .find(|(n, _, _)| n == f.name)
                .unwrap_or_else(|| panic!("{}: {} in the kernel's format", tp.tracepoint, f.name));
            assert_eq!(
                (f.offset, f.size),
                (Some(k.1), Some(k.2)),
                "{}.{} at the running kernel's offset",
                tp.tracepoint,
                f.name
            );
        }
    }
    let summary = tracefmt::summary(&p.tracepoints);
    assert!(summary.starts_with("6/6 programs attached"), "{summary}");
}

#[tokio::test]
async fn ebpf_with_upstream_6_1_mark_victim_reads_only_pid_and_flags_the_rest_absent() {
    // Upstream 6.1's `oom/mark_victim` format (`int pid` alone) first, the running kernel's
    // formats for the rest: the programs load and attach with that table, the OOM program
    // never reads comm / anon_rss / oom_score_adj, and the signal leaves them unset.
    let _one_at_a_time = OOM_TESTS.lock().await;
    let old = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../enforcer/testdata/tracefs-6.1"
    ));
    let mut roots = vec![old];
    roots.extend(PipelineOptions::default().tracing_roots);
    let mut p = start_with(SourceChoice::Only(SourceKind::Ebpf), vec![], roots);
    let oom = p
        .tracepoints
        .iter()
        .find(|t| t.tracepoint == "oom/mark_victim")
        .expect("listed");
    assert!(oom.attached, "{:?}", oom.attach_error);
    assert_eq!(oom.absent_fields(), ["comm", "anon_rss", "oom_score_adj"]);
    assert!(p.tracepoints.iter().all(|t| t.attached));

    let name = unique_name("oom61");
    let mem = TestCgroup::create(&memory_mount(), &name);
    let v1 = mem.dir.join("memory.limit_in_bytes").exists();
    mem.write(
        if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        },
        &(64 * MIB).to_string(),
    );
    if v1 {
        // Held at the OOM until its reclaim record is read (see the test above).
        mem.write("memory.oom_control", "1");
    } else {
        mem.write("memory.swap.max", "0");
    }
    let mut child = spawn_in(memhog(200, 0, 0), &[mem.dir.as_path()]);
    let pid = child.id();
    if v1 {
        let want = mem.rel();
        wait_for(
            &mut p.signals,
            Duration::from_secs(10),
            "memcg reclaim in the test cgroup",
            |s| s.kind == SignalKind::MemcgReclaim && s.cgroup.as_deref() == Some(want.as_str()),
        )
        .await;
        mem.write("memory.oom_control", "0");
    }
    let s = wait_for(
        &mut p.signals,
        Duration::from_secs(10),
        "the OOM kill of the hog",
        |s| s.kind == SignalKind::OomKill && s.pid == Some(pid),
    )
    .await;
    assert_eq!(s.source, SourceKind::Ebpf);
    assert_eq!(s.cgroup.as_deref(), Some(mem.rel().as_str()));
    assert_eq!(s.comm, None, "comm absent, not empty or garbage");
    assert_eq!(s.detail.anon_rss_bytes, None);
    assert_eq!(s.detail.oom_score_adj, None);
    let status = child.wait().expect("hog exits");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(9));
}

#[tokio::test]
async fn reclaim_storms_are_folded_per_cgroup_in_the_kernel() {
    let mut p = start(SourceChoice::Only(SourceKind::Ebpf), vec![]);
    let name = unique_name("storm");
    let mem = TestCgroup::create(&memory_mount(), &name);
    let v1 = mem.dir.join("memory.limit_in_bytes").exists();
    mem.write(
        if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        },
        &(64 * MIB).to_string(),
    );
    if v1 {
        // Held at the OOM until its first reclaim record is read (see the OOM test).
        mem.write("memory.oom_control", "1");
    }
    let mut child = spawn_in(memhog(300, 0, 0), &[mem.dir.as_path()]);
    let want = mem.rel();
    let first = wait_for(
        &mut p.signals,
        Duration::from_secs(10),
        "first reclaim",
        |s| s.kind == SignalKind::MemcgReclaim && s.cgroup.as_deref() == Some(want.as_str()),
    )
    .await;
    if v1 {
        mem.write("memory.oom_control", "0");
    }
    assert_eq!(
        first.count, 1,
        "the first event of a burst goes out at once, alone"
    );
    let _ = child.wait();
    // Let the pump see the rest, then compare: the kernel saw more than it sent.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut records = 1u64;
    let mut events = 1u64;
    while let Ok(s) = p.signals.try_recv() {
        if s.kind == SignalKind::MemcgReclaim && s.cgroup.as_deref() == Some(want.as_str()) {
            records += 1;
            events += u64::from(s.count);
        }
    }
    let suppressed = p
        .stats
        .kernel_suppressed
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        suppressed > 0 || events == records,
        "burst folding counted ({suppressed} suppressed)"
    );
    assert_eq!(
        p.stats
            .kernel_ring_full
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "no record lost"
    );
}

/// v1 only: `cgroup.event_control` thresholds exist only on the v1 memory controller.
#[tokio::test]
async fn eventfd_fallback_reports_the_same_pressure_v1only() {
    require_memory_v1("the eventfd source (cgroup.event_control)");
    let mem_mount = memory_mount();
    let name = unique_name("eventfd");
    let mem = TestCgroup::create(
        &mem_mount,
        &format!("{name}/kubepods/burstable/podeeee-0003"),
    );
    assert!(
        mem.dir.join("cgroup.event_control").exists(),
        "the eventfd source needs the cgroup v1 memory controller; this machine has none"
    );
    mem.write("memory.limit_in_bytes", &(64 * MIB).to_string());
    let watch = Watch {
        cgroup: mem.dir.clone(),
        threshold_bytes: Some(48 * MIB),
    };
    let mut p = start(SourceChoice::Only(SourceKind::Eventfd), vec![watch]);
    let mut child = spawn_in(memhog(200, 0, 0), &[mem.dir.as_path()]);
    let want = mem.rel();
    let s = wait_for(
        &mut p.signals,
        Duration::from_secs(10),
        "threshold crossing",
        |s| s.kind == SignalKind::MemoryThreshold,
    )
    .await;
    assert_eq!(s.source, SourceKind::Eventfd);
    assert_eq!(s.cgroup.as_deref(), Some(want.as_str()));
    assert_eq!(s.pod_uid.as_deref(), Some("eeee-0003"));
    assert_eq!(s.detail.threshold_bytes, Some(48 * MIB));
    let s = wait_for(
        &mut p.signals,
        Duration::from_secs(10),
        "OOM notification",
        |s| s.kind == SignalKind::OomKill,
    )
    .await;
    assert_eq!(s.source, SourceKind::Eventfd);
    assert_eq!(s.cgroup.as_deref(), Some(want.as_str()));
    let _ = child.wait();
}

#[tokio::test]
async fn polling_fallback_reports_a_crossing_at_its_next_tick() {
    let name = unique_name("poll");
    let mem = TestCgroup::create(&memory_mount(), &name);
    let watch = Watch {
        cgroup: mem.dir.clone(),
        threshold_bytes: Some(16 * MIB),
    };
    let mut p = start(SourceChoice::Only(SourceKind::Poll), vec![watch]);
    let mut child = spawn_in(memhog(32, 0, 1500), &[mem.dir.as_path()]);
    let s = wait_for(
        &mut p.signals,
        Duration::from_secs(10),
        "polled crossing",
        |s| s.kind == SignalKind::MemoryThreshold,
    )
    .await;
    assert_eq!(s.source, SourceKind::Poll);
    assert!(s.detail.usage_bytes.is_some_and(|u| u >= 16 * MIB));
    assert_eq!(s.cgroup.as_deref(), Some(mem.rel().as_str()));
    let _ = child.wait();
}

#[tokio::test]
async fn psi_fallback_registers_triggers_with_the_allowed_window() {
    require_root();
    let l = layout();
    let caps = Capabilities::probe(&l);
    assert!(
        caps.psi,
        "PSI must be enabled on this kernel (/proc/pressure/memory)"
    );
    let p = start(SourceChoice::Only(SourceKind::Psi), vec![]);
    assert_eq!(p.source, SourceKind::Psi);
    // Without CAP_SYS_RESOURCE only 2 s windows are allowed; the source must have chosen so.
    assert_eq!(
        caps.psi_window_us(),
        if caps.cap_sys_resource {
            1_000_000
        } else {
            2_000_000
        }
    );
}

/// v1 only: the eventfd source (on v2 it refuses to start, whatever the watch).
#[tokio::test]
async fn a_missing_watch_is_a_clear_error_not_a_crash_v1only() {
    require_root();
    require_memory_v1("the eventfd source (cgroup.event_control)");
    let l = layout();
    let caps = Capabilities::probe(&l);
    let opts = PipelineOptions {
        source: SourceChoice::Only(SourceKind::Eventfd),
        watches: vec![Watch {
            cgroup: memory_mount().join("enforcer-no-such-cgroup"),
            threshold_bytes: Some(1),
        }],
        ..Default::default()
    };
    let err = kernel::start(&opts, &caps, &l).err().expect("an error");
    assert!(
        err.to_string().contains("enforcer-no-such-cgroup"),
        "names the path: {err}"
    );
}

/// The memory cgroup iterator (the crossing's one-call read of every pod's memory) reports,
/// for the cgroup it is linked to and each cgroup below it, by directory inode, what the
/// cgroup's usage file says, and nothing of the cgroups beside or above; the stats collector
/// that reads crossings through it finds each pod's working set as the file path does.
#[tokio::test]
async fn memcg_iterator_reads_every_pods_usage_as_its_file_says() {
    use enforcer::{
        kernel::memcg_iter::MemcgIter,
        stats::{Collector, PodScope, PodTarget, Refresh},
    };
    require_root();
    let mount = memory_mount();
    let root = format!("/{}", unique_name("memcg-iter"));
    let kubepods_rel = format!("{root}/kubepods");
    // Made from the leaves (so that on v2 each parent made here enables the memory
    // controller for its children); the first owns the test root and kubepods.
    let pods: Vec<TestCgroup> = (0..3)
        .map(|i| TestCgroup::create(&mount, &format!("{kubepods_rel}/pod{i}/c{i}")))
        .collect();
    let beside = TestCgroup::create(&mount, &format!("{root}/beside"));
    let deep = TestCgroup::create(&mount, &format!("{kubepods_rel}/pod0/c0/deeper"));
    let kubepods_dir = mount.join(kubepods_rel.trim_start_matches('/'));
    let mut hog = spawn_in(memhog(24, 0, 60_000), &[pods[1].dir.as_path()]);
    let usage_file = |dir: &std::path::Path| -> i64 {
        let f = if memory_is_v2() {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        std::fs::read_to_string(dir.join(f))
            .expect("usage file")
            .trim()
            .parse()
            .expect("a number")
    };
    let pod_dir = |i: usize| pods[i].dir.parent().expect("pod dir").to_path_buf();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while usage_file(&pod_dir(1)) < 20 << 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "memhog never reached 20 MiB"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Two levels below kubepods (its pods and their containers here), not three.
    let mut it =
        MemcgIter::open(&mount, &kubepods_dir, 2).expect("the iterator loads and links here");
    let mut walked = std::collections::HashMap::new();
    it.read_into(&mut walked).expect("a walk");
    let ino = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(p).expect("stat").ino()
    };
    // kubepods, 3 pods, 3 containers: every one, nothing else (not the cgroup below c0).
    assert_eq!(walked.len(), 7, "{walked:?}");
    assert!(!walked.contains_key(&deep.ino()));
    assert!(walked.contains_key(&ino(&kubepods_dir)));
    assert!(!walked.contains_key(&beside.ino()));
    assert!(!walked.contains_key(&ino(&mount.join(root.trim_start_matches('/')))));
    for (i, container) in pods.iter().enumerate() {
        for dir in [pod_dir(i), container.dir.clone()] {
            let file = usage_file(&dir);
            let got = walked[&ino(&dir)];
            // Read a moment apart: the kernel's own small charges may come and go.
            assert!(
                (got - file).abs() <= 1 << 20,
                "{}: iterator {got}, file {file}",
                dir.display()
            );
        }
    }
    assert!(walked[&ino(&pod_dir(1))] >= 20 << 20);
    assert!(walked[&ino(&kubepods_dir)] >= walked[&ino(&pod_dir(1))]);

    // The collector: a crossing's refresh through the iterator, beside one through the files.
    let logs = tempfile::tempdir().expect("tempdir");
    let observer = enforcer_tests::machine_observer(&kubepods_rel, logs.path());
    let targets: Vec<PodTarget> = (0..3)
        .map(|i| PodTarget {
            uid: format!("uid-{i}"),
            cgroup: format!("{kubepods_rel}/pod{i}"),
            containers: vec![("app".to_owned(), format!("c{i}"))],
        })
        .collect();
    let mut files = Collector::new(observer.clone());
    let mut walker = Collector::new(observer).with_memcg_iterator();
    let crossing = Refresh {
        pods: PodScope::Usage,
        logs: false,
    };
    let start = std::time::Instant::now();
    for c in [&mut files, &mut walker] {
        c.refresh(&Refresh::full(), &targets, start.elapsed())
            .expect("full refresh");
    }
    assert!(
        walker.wait_memcg_iterator(),
        "the collector loaded the iterator"
    );
    assert!(!files.reads_memcg_iterator());
    let a = walker
        .refresh(&crossing, &targets, start.elapsed())
        .expect("walk");
    let b = files
        .refresh(&crossing, &targets, start.elapsed())
        .expect("files");
    for t in &targets {
        let ws = |s: &enforcer::stats::NodeSnapshot| {
            s.pods[&t.uid]
                .stats
                .as_ref()
                .and_then(|s| s.memory)
                .expect("a working set")
        };
        assert!(
            (ws(&a) - ws(&b)).abs() <= 1 << 20,
            "{}: {} vs {}",
            t.uid,
            ws(&a),
            ws(&b)
        );
    }
    assert!(a.pods["uid-1"].stats.as_ref().and_then(|s| s.memory) >= Some(16 << 20));

    let _ = hog.kill();
    let _ = hog.wait();
    drop(it);
    drop(deep);
    drop(beside);
    for p in pods.into_iter().rev() {
        drop(p);
    }
}

/// The usage of a memory cgroup directory, in bytes (v1 `memory.usage_in_bytes`, v2
/// `memory.current`).
fn usage_of(dir: &std::path::Path) -> u64 {
    let file = if dir.join("memory.usage_in_bytes").exists() {
        "memory.usage_in_bytes"
    } else {
        "memory.current"
    };
    std::fs::read_to_string(dir.join(file))
        .expect("the usage file")
        .trim()
        .parse()
        .expect("a number")
}

/// The crossing check on the memory charge path attaches at the first point this kernel
/// takes (fexit, kprobe, then the memcg statistics tracepoints) and names why it passed over
/// each one before; what it takes follows from what the kernel offers.
/// The eBPF pipeline with the crossing check attached as `mode` allows.
fn start_crossing(mode: kernel::CrossingMode) -> kernel::Pipeline {
    require_root();
    let layout = layout();
    let caps = Capabilities::probe(&layout);
    let opts = PipelineOptions {
        source: SourceChoice::Only(SourceKind::Ebpf),
        crossing: mode,
        ..Default::default()
    };
    kernel::start(&opts, &caps, &layout).expect("signal pipeline starts")
}

#[tokio::test]
async fn the_crossing_check_attaches_where_this_kernel_allows_and_names_the_rest() {
    // Unpinned: fexit or kprobe, the statistics tracepoints passed over for their cost.
    let auto = start_crossing(kernel::CrossingMode::Auto);
    let choice = auto.crossing.choice.clone().expect("the check was tried");
    eprintln!("crossing check (auto): {}", choice.summary());
    assert_ne!(choice.chosen, Some(kernel::crossing::Attach::Tracepoint));
    if choice.chosen.is_none() {
        assert!(
            choice
                .skipped
                .iter()
                .any(|s| s.attach == kernel::crossing::Attach::Tracepoint
                    && s.reason == kernel::crossing::OVER_BUDGET),
            "{choice:?}"
        );
    }
    drop(auto);
    // `enforcer doctor` says the same choice, and names it a finding when there is none.
    let out = std::process::Command::new(enforcer_tests::enforcer_binary())
        .args(["doctor", "--json", "--state-dir"])
        .arg(tempfile::tempdir().expect("tmp").path())
        .output()
        .expect("enforcer doctor");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("$ enforcer doctor\n{stderr}{stdout}");
    let said = stderr
        .lines()
        .find_map(|l| l.strip_prefix("crossing check: "))
        .unwrap_or_else(|| panic!("no crossing check line: {stderr}"));
    let head = said.split(" (").next().unwrap_or_default();
    assert_eq!(
        head,
        choice.summary().split(" (").next().unwrap_or_default(),
        "{said}"
    );
    let findings: Vec<serde_json::Value> = serde_json::from_str(&stdout).expect("findings");
    let named = findings.iter().any(|f| {
        f["problem"]
            .as_str()
            .is_some_and(|p| p.starts_with("no crossing check on the memory charge path"))
    });
    assert_eq!(named, choice.chosen.is_none(), "{findings:?}");
    // Any point: the first this kernel takes.
    let p = start_crossing(kernel::CrossingMode::Any);
    let choice = p.crossing.choice.clone().expect("the check was tried");
    eprintln!("crossing check: {}", choice.summary());
    let chosen = choice.chosen.expect("a point attached on this kernel");
    assert!(p.crossing.levels.is_some(), "its level map is held");
    // Every point before the chosen one is named with a reason; none after it is tried.
    let order = |a| kernel::crossing::Attach::ALL.iter().position(|x| *x == a);
    for s in &choice.skipped {
        assert!(order(s.attach) < order(chosen), "{choice:?}");
        assert!(!s.reason.trim().is_empty(), "{choice:?}");
    }
    let kprobes = std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists();
    let stat_tracepoints =
        tracefmt::read_format(tracefmt::TRACING_ROOTS, "memcg", "mod_memcg_lruvec_state").is_ok();
    match chosen {
        kernel::crossing::Attach::Kprobe => assert!(kprobes, "a kprobe without kprobes"),
        kernel::crossing::Attach::Tracepoint => {
            assert!(stat_tracepoints, "the tracepoint without the tracepoint");
            if !kprobes {
                assert!(
                    choice
                        .skipped
                        .iter()
                        .any(|s| s.attach == kernel::crossing::Attach::Kprobe
                            && s.reason.contains("kprobe")),
                    "the kprobe's absence is named: {choice:?}"
                );
            }
        }
        kernel::crossing::Attach::Fexit => {}
    }
}

/// One record at the charge that brings the watched cgroup's page counter to the armed level,
/// none while it stays disarmed (the usage growing on), one again once armed higher; nothing
/// written to any cgroup file.
#[tokio::test]
async fn the_crossing_check_reports_the_crossing_charge_once_per_arming() {
    let _one_at_a_time = OOM_TESTS.lock().await;
    let mut p = start_crossing(kernel::CrossingMode::Any);
    let levels = p.crossing.levels.clone().expect("the check attached");
    let name = unique_name("crossing");
    let watched = TestCgroup::create(&memory_mount(), &format!("{name}/kubepods"));
    let pod = TestCgroup::create(
        &memory_mount(),
        &format!("{name}/kubepods/besteffort/podfeedface-0000-0000-0000-00000000c0c0"),
    );
    let ino = watched.ino();
    let high_before = std::fs::read_to_string(watched.dir.join("memory.high")).ok();
    let base = usage_of(&watched.dir);
    let first = base + 16 * MIB;
    levels.arm(ino, first).expect("armed");
    // 64 MiB, a MiB every 20 ms, then held.
    let mut child = spawn_in(memhog(64, 20, 30_000), &[pod.dir.as_path()]);
    let s = wait_for(
        &mut p.signals,
        Duration::from_secs(20),
        "the crossing of the first level",
        |s| s.kind == SignalKind::MemoryThreshold && s.cgroup_id == Some(ino),
    )
    .await;
    let usage = s.detail.usage_bytes.expect("the counter at the crossing");
    let level = s.detail.threshold_bytes.expect("the level");
    eprintln!(
        "first crossing: level {level} B, counter {usage} B (+{} KiB), by {:?} ({:?})",
        (usage - level) >> 10,
        s.comm,
        s.pid
    );
    assert_eq!(s.source, SourceKind::Ebpf);
    // The first page past the armed bytes, as `memory.high` is crossed (usage above it).
    assert_eq!(level, (first / 4096 + 1) * 4096, "the armed level");
    assert!(usage >= level, "at or past the level: {usage} < {level}");
    assert!(usage > first, "past the armed bytes: {usage} <= {first}");
    // Past it by at most the charge batches of the CPUs (64 pages each) and a step.
    let cpus = std::thread::available_parallelism().map_or(2, std::num::NonZero::get) as u64;
    assert!(
        usage - level <= cpus * 64 * 4096 + 2 * MIB,
        "the record comes at the crossing charge: {} KiB past",
        (usage - level) >> 10
    );
    // The charging task: the hog, or (rarely, seen once on a loaded CI machine) this test's
    // own process, charging a page to the pod's cgroup in its context; never another.
    assert!(
        s.pid == Some(child.id()) || s.pid == Some(std::process::id()),
        "the charging task is the hog ({}) or this test ({}): {:?}",
        child.id(),
        std::process::id(),
        s.pid
    );
    assert_eq!(levels.current().expect("the level").armed, 0, "disarmed");
    // Disarmed: the hog grows past 16 MiB more with no record.
    wait_until_usage(&watched.dir, first + 24 * MIB).await;
    while let Ok(other) = p.signals.try_recv() {
        assert!(
            !(other.kind == SignalKind::MemoryThreshold && other.cgroup_id == Some(ino)),
            "a second record while disarmed: {other:?}"
        );
    }
    // Armed again above the usage: one more.
    let second = usage_of(&watched.dir) + 8 * MIB;
    levels.arm(ino, second).expect("armed again");
    let s = wait_for(
        &mut p.signals,
        Duration::from_secs(20),
        "the crossing of the second level",
        |s| s.kind == SignalKind::MemoryThreshold && s.cgroup_id == Some(ino),
    )
    .await;
    assert!(s.detail.usage_bytes >= s.detail.threshold_bytes);
    assert_eq!(
        std::fs::read_to_string(watched.dir.join("memory.high")).ok(),
        high_before,
        "no cgroup file written"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits until the cgroup's usage reaches `bytes` (bounded).
async fn wait_until_usage(dir: &std::path::Path, bytes: u64) {
    let deadline = tokio::time::Instant::now() + enforcer_tests::scaled(Duration::from_secs(20));
    while usage_of(dir) < bytes {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the usage of {} never reached {bytes}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A kernel BTF whose `usage` members are renamed (as a kernel whose `struct page_counter`
/// changed): the check reads nothing, every point is passed over with that reason, and the
/// pipeline runs on (the crossing then the cgroup-file tripwire's).
#[tokio::test]
async fn a_btf_lacking_page_counter_usage_passes_every_point_over_and_says_why() {
    require_root();
    let mut btf = std::fs::read("/sys/kernel/btf/vmlinux").expect("the kernel's BTF");
    let at = |i: usize| u32::from_ne_bytes(btf[i..i + 4].try_into().expect("4 bytes")) as usize;
    // The header: magic, version, flags, hdr_len, type_off, type_len, str_off, str_len.
    let (hdr_len, str_off, str_len) = (at(4), at(16), at(20));
    let strings = hdr_len + str_off..hdr_len + str_off + str_len;
    let pos = btf[strings.clone()]
        .windows(7)
        .position(|w| w == b"\0usage\0")
        .expect("a member named usage");
    btf[strings.start + pos + 5] = b'X';
    let dir = tempfile::tempdir().expect("tempdir");
    let doctored = dir.path().join("vmlinux");
    std::fs::write(&doctored, &btf).expect("written");
    let layout = layout();
    let caps = Capabilities::probe(&layout);
    let opts = PipelineOptions {
        source: SourceChoice::Only(SourceKind::Ebpf),
        btf_path: Some(doctored),
        ..Default::default()
    };
    let p = kernel::start(&opts, &caps, &layout).expect("the pipeline starts all the same");
    let choice = p.crossing.choice.clone().expect("the check was tried");
    eprintln!("crossing check: {}", choice.summary());
    assert_eq!(choice.chosen, None);
    assert!(p.crossing.levels.is_none());
    assert_eq!(choice.skipped.len(), kernel::crossing::Attach::ALL.len());
    for s in &choice.skipped {
        assert!(
            s.reason.contains("struct page_counter has no member usage"),
            "{s:?}"
        );
    }
    assert!(
        choice
            .summary()
            .starts_with("none: the crossing falls back")
    );
    assert_eq!(p.source, SourceKind::Ebpf, "the tracepoints still run");
}

/// A record lost to a full ring is one of the programs' rare diagnostics: the program counts
/// it and logs it through aya-log (the 1st, 2nd, 4th... loss per CPU), and the daemon's
/// tracing prints it at debug level under `enforcer::ebpf`. Nobody reads the signal ring here
/// while a process makes 40 000 probe records (the 4 MiB ring holds about 15 000).
#[test]
fn a_record_lost_to_a_full_ring_reaches_tracing_through_aya_log() {
    use std::io::Write as _;

    use tracing_subscriber::util::SubscriberInitExt as _;
    require_root();
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let _log = tracing_subscriber::fmt()
        .with_env_filter("enforcer::ebpf=debug")
        .with_writer(std::sync::Mutex::new(file.reopen().expect("reopen")))
        .with_ansi(false)
        .finish()
        .set_default();
    let mut child = Command::new(env!("CARGO_BIN_EXE_memhog"))
        .args(["--getppid", "40000", "0"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the getppid load starts");
    let opts = PipelineOptions {
        source: SourceChoice::Only(SourceKind::Ebpf),
        probe_tgid: child.id(),
        ..PipelineOptions::default()
    };
    let mut loaded = kernel::ebpf::load(&opts).expect("the eBPF programs load");
    if let Some(stdin) = child.stdin.as_mut() {
        stdin.write_all(b"go\n").expect("start the load");
    }
    let out = child.wait_with_output().expect("the load ends");
    assert!(out.status.success(), "the getppid load: {:?}", out.status);
    let stats = enforcer::signal::PipelineStats::default();
    kernel::ebpf::refresh_stats(&loaded.stats, &stats);
    let lost = stats
        .kernel_ring_full
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(lost > 0, "the ring filled: {lost} records lost");
    loaded.logs.flush();
    let text = std::fs::read_to_string(file.path()).expect("the captured log");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("SIGNALS ring buffer full: a record lost"))
        .collect();
    assert!(
        lines.iter().any(|l| l.contains("DEBUG")
            && l.contains("enforcer::ebpf")
            && l.contains("(1 on this CPU)")),
        "the first loss on a CPU is logged at debug level: {text}"
    );
    // Rate-limited: one line per power of two of each CPU's count, never one per loss.
    let per_cpu = loaded
        .stats
        .get(&enforcer_common::stat::RING_FULL, 0)
        .expect("the per-CPU loss counters");
    let bound: u64 = per_cpu
        .iter()
        .map(|n| u64::from(64 - n.leading_zeros()))
        .sum();
    assert_eq!(
        lines.len() as u64,
        bound,
        "one line per power of two per CPU for {lost} losses: {text}"
    );
}
