//! Kubelet's node e2e eviction tests (`test/e2e_node/eviction_test.go`,
//! `oomkiller_linux_test.go`, `system_node_critical_test.go`), ported to busybox on the real
//! kernel, cgroups and a private containerd, with the daemon in-process.
//!
//! Each scenario follows kubelet's `runEvictionTest`: run the pods, wait for the node
//! condition, check kubelet's ordering rules at every poll until every pod with a non-zero
//! eviction priority is `Failed` (no pod `Succeeded`; a `Failed` pod has reason `Evicted`; a
//! priority-0 pod never fails; a pod never fails while one of a higher eviction priority is
//! still `Running`), check the evicted pods' status (kubelet's message, `DisruptionTarget`,
//! the containers' terminated states kept), wait for the condition to clear, check that it
//! stays clear and that the rules still hold, delete the pods and run a new one.
//!
//! Where this port differs from kubelet's, and why (the rules do not depend on these):
//! - A small node by capacity override (`memory=1Gi`, `pids=200`) or a tmpfs state directory
//!   (nodefs) instead of thresholds computed from the machine's free memory or disk.
//! - Memory hogs are busybox (`tail -c` holding what a pipe feeds it, 12 MiB every 0.5 s)
//!   instead of agnhost `stress` (12 MiB every 10 s). Disk hogs `dd` 1 MiB every 0.1 s to
//!   their log (the enforcer's ephemeral-storage accounting counts logs today; the writable
//!   layer and emptyDir variants wait on the "Pod spec fidelity" issue, below).
//! - Periods: `evictionPressureTransitionPeriod` 5 s (kubelet's e2e: the 5 m default), the
//!   soft grace 3 s (1 m), polls every 50 ms (2 s), the "stays clear" check 10 s (1 m), no
//!   20 s `pressureDelay` (the enforcer's conditions are not behind an API server), the
//!   critical pod's "not evicted" watch 10 s (8 m), OOM targets sleep 1 s (5 s).
//! - No API server here: the starved resource is checked in the pod's status message and in
//!   the `Evicted` event kept in the state directory (what `enforcer events` shows); the
//!   event as the API server gets it is checked against the fake API server in
//!   `apiserver.rs`.
//! - "OOM killer for a pod using more than node allocatable": kubelet lets the kernel OOM-kill
//!   at the kubepods limit; the enforcer's `allocatableMemory.available` threshold evicts the
//!   pod first. The test asserts the eviction and that no kernel OOM kill happened.

use std::{path::PathBuf, time::Duration};

use enforcer::{
    config::ConfigArgs,
    status_manager::{ContainerState, PodRecord},
};
use enforcer_tests::{
    containerd::Containerd,
    node::{Node, Tmpfs, find, node_oom_kills, phase, pod, pressure, status_file, wait_until},
};
use tokio::time::Instant;

/// One scenario at a time: they share the machine's memory, pids and disk.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Holds the serial lock and prints the scenario's wall time when it ends.
struct Scenario {
    name: &'static str,
    start: std::time::Instant,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl Scenario {
    async fn begin(name: &'static str) -> Self {
        let serial = SERIAL.lock().await;
        Self {
            name,
            start: std::time::Instant::now(),
            _serial: serial,
        }
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        eprintln!(
            "e2e scenario {}: {:.1} s",
            self.name,
            self.start.elapsed().as_secs_f64()
        );
    }
}

/// kubelet's `evictionPriority`: 0 must never be evicted; higher numbers go first.
struct Spec {
    name: String,
    priority: u32,
    manifest: String,
}

const UID_PREFIX: &str = "e2e00000-0000-0000-0000-";

fn uid(n: u32) -> String {
    format!("{UID_PREFIX}{n:012}")
}

/// kubelet's e2e high priority class value.
const HIGH_PRIORITY: &str = "  priority: 999999999\n";
/// A Guaranteed pod's resources, 300Mi of memory.
const GUARANTEED_300MI: &str =
    "    resources: {requests: {cpu: 100m, memory: 300Mi}, limits: {cpu: 100m, memory: 300Mi}}\n";

/// A pod of kubelet's helpers: `terminationGracePeriodSeconds: 1`, then `extra_spec`.
fn spec(
    name: &str,
    priority: u32,
    n: u32,
    extra_spec: &str,
    resources: &str,
    script: &str,
) -> Spec {
    Spec {
        name: name.to_owned(),
        priority,
        manifest: pod(
            name,
            &uid(n),
            &format!("  terminationGracePeriodSeconds: 1\n{extra_spec}"),
            resources,
            script,
        ),
    }
}

/// kubelet's `innocentPod`: requests = limits of 50Mi memory and ephemeral storage.
fn innocent(n: u32, extra_spec: &str) -> Spec {
    spec(
        "innocent-pod",
        0,
        n,
        extra_spec,
        "    resources: {requests: {memory: 50Mi, ephemeral-storage: 50Mi}, limits: {memory: 50Mi, ephemeral-storage: 50Mi}}\n",
        "while true; do sleep 5; done",
    )
}

/// A memory hog: grows by 12 MiB every 0.5 s up to `max_mib`, then holds it.
fn memory_hog_script(max_mib: u32) -> String {
    let steps = max_mib / 12;
    format!(
        "(i=0; while [ $i -lt {steps} ]; do head -c 12582912 /dev/zero; i=$((i+1)); sleep 0.5; done; sleep 3600) | tail -c {max_mib}m >/dev/null; sleep 3600"
    )
}

/// Holds `mib` of anonymous memory at once.
fn memory_holder_script(mib: u32) -> String {
    format!(
        "(head -c {} /dev/zero; sleep 3600) | tail -c {mib}m >/dev/null; sleep 3600",
        u64::from(mib) << 20
    )
}

/// kubelet's `diskConsumingPod` loop, writing to the container's log: 1 MiB every 0.1 s.
fn disk_hog_script(mib: u32) -> String {
    format!(
        "i=0; while [ $i -lt {mib} ]; do dd if=/dev/zero bs=1048576 count=1 2>/dev/null; sleep .1; i=$((i+1)); done; while true; do sleep 5; done"
    )
}

/// kubelet's `pidConsumingPod` loop.
fn pid_hog_script(processes: u32) -> String {
    format!(
        "i=0; while [ $i -lt {processes} ]; do sleep 0.05; (sleep 3600)& i=$((i+1)); done; while true; do sleep 5; done"
    )
}

fn record(state: &std::path::Path, name: &str) -> Option<PodRecord> {
    find(&status_file(state).pods, &format!("{name}-")).cloned()
}

/// kubelet's `verifyEvictionOrdering` over the node's pod statuses: panics on a violation,
/// returns whether every pod with a non-zero priority was evicted.
fn verify_eviction_ordering(state: &std::path::Path, specs: &[Spec]) -> bool {
    // One read of the status file for the whole check (a consistent view of every pod).
    let pods = status_file(state).pods;
    let recs: Vec<Option<&PodRecord>> = specs
        .iter()
        .map(|s| find(&pods, &format!("{}-", s.name)))
        .collect();
    let phase_of = |i: usize| recs[i].map_or("", |r| r.phase.as_str());
    let mut done = true;
    for (i, s) in specs.iter().enumerate() {
        let p = phase_of(i);
        assert_ne!(p, "Succeeded", "pod {} succeeded unexpectedly", s.name);
        for (j, low) in specs.iter().enumerate() {
            if s.priority < low.priority && phase_of(j) == "Running" {
                assert_ne!(
                    p, "Failed",
                    "priority {} pod {} failed before priority {} pod {}",
                    s.priority, s.name, low.priority, low.name
                );
            }
        }
        if p == "Failed" {
            let r = recs[i].expect("a Failed pod has a record");
            assert_eq!(
                r.reason, "Evicted",
                "pod {} failed; expected reason Evicted: {r:?}",
                s.name
            );
        }
        if s.priority == 0 {
            assert_ne!(p, "Failed", "priority 0 pod {} failed", s.name);
        }
        if s.priority != 0 && p != "Failed" {
            done = false;
        }
    }
    done
}

/// The evicted pod's status as kubelet leaves it.
fn verify_evicted_status(state: &std::path::Path, spec: &Spec, resource: &str) {
    let r = record(state, &spec.name).expect("evicted pod's record");
    assert_eq!((r.phase.as_str(), r.reason.as_str()), ("Failed", "Evicted"));
    if resource == LOCAL_STORAGE {
        // kubelet's localStorageEviction messages (no starved node resource), checked in
        // its order: an emptyDir over its sizeLimit, then the pod over its containers' total
        // limit (a single container's logs and writable layer count there first).
        let want = if spec.name.starts_with("emptydir-") {
            "Usage of EmptyDir volume \"test-volume\" exceeds the limit \"100Mi\". "
        } else {
            "Pod ephemeral local storage usage exceeds the total limit of containers 100Mi. "
        };
        assert_eq!(
            r.message, want,
            "{}: kubelet's local storage message",
            spec.name
        );
    } else {
        let prefix = format!("The node was low on resource: {resource}. ");
        assert!(
            r.message.starts_with(&prefix),
            "{}: kubelet's message, starved resource {resource}: {:?}",
            spec.name,
            r.message
        );
    }
    if resource == LOCAL_STORAGE {
        // kubelet evicts for local storage limits with no pod condition (`evictPod(..., nil)`).
        assert!(
            !r.conditions.iter().any(|c| c.kind == "DisruptionTarget"),
            "{}: no DisruptionTarget for a local storage eviction: {r:?}",
            spec.name
        );
    } else {
        let dt = r
            .conditions
            .iter()
            .find(|c| c.kind == "DisruptionTarget")
            .unwrap_or_else(|| panic!("{}: no DisruptionTarget condition: {r:?}", spec.name));
        assert_eq!(
            (dt.status.as_str(), dt.reason.as_str(), dt.message.as_str()),
            ("True", "TerminationByKubelet", r.message.as_str()),
            "{}",
            spec.name
        );
    }
    assert!(
        !r.container_statuses.is_empty(),
        "{}: the containers' statuses are kept: {r:?}",
        spec.name
    );
    for c in &r.container_statuses {
        assert!(
            matches!(c.state, ContainerState::Terminated { .. }) && !c.ready,
            "{}: container {} terminated: {c:?}",
            spec.name,
            c.name
        );
    }
}

/// The `Evicted` event kept in the state directory (standalone: what `enforcer events` shows),
/// as kubelet records it: Warning, on the pod, the status message, and for threshold
/// evictions the `starved_resource` annotation.
async fn verify_evicted_event(state: &std::path::Path, spec: &Spec, resource: &str) {
    // The pod's name is node-suffixed: the record's.
    let r = record(state, &spec.name).expect("evicted pod's record");
    let find = || {
        enforcer::cluster::event_store::read(state)
            .expect("the event store")
            .0
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("Evicted")
                    && e.involved_object.name.as_deref() == Some(r.name.as_str())
            })
    };
    wait_until(
        &format!("{}: the Evicted event kept", spec.name),
        Duration::from_secs(5),
        || find().is_some(),
    )
    .await;
    let e = find().expect("the Evicted event");
    // What `enforcer events` prints here (`--nocapture` shows it).
    let (all, _) = enforcer::cluster::event_store::read(state).expect("the event store");
    eprintln!(
        "{}",
        enforcer::cli::events::render(
            &all,
            &enforcer::cli::events::EventsArgs {
                output: enforcer::cli::events::EventsOutput::Table,
                pod: None,
                namespace: None,
                state_dir: state.to_path_buf(),
            },
            k8s_openapi::jiff::Timestamp::now(),
        )
    );
    assert_eq!(
        (
            e.type_.as_deref(),
            e.involved_object.kind.as_deref(),
            e.message.as_deref()
        ),
        (Some("Warning"), Some("Pod"), Some(r.message.as_str())),
        "{}: {e:?}",
        spec.name
    );
    if resource != LOCAL_STORAGE {
        let starved = e
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("starved_resource"))
            .map(String::as_str);
        assert_eq!(starved, Some(resource), "{}: {e:?}", spec.name);
    }
}

/// The `resource` of local storage capacity isolation: pods over their own limits, no
/// starved node resource, kubelet's `localStorageEviction` messages.
const LOCAL_STORAGE: &str = "local-storage";

/// What a scenario expects.
struct Expect {
    /// The node condition (`None`: kubelet's `noPressure`).
    condition: Option<&'static str>,
    /// The starved resource named in the eviction message.
    resource: &'static str,
    /// How long the pressure may take to build and the evictions to happen.
    pressure_timeout: Duration,
}

/// kubelet's `runEvictionTest` (see the module comment for the shortened periods).
async fn run_eviction_test(node: &Node, specs: &[Spec], expect: &Expect) {
    let state = node.state.clone();
    for s in specs {
        node.submit(&format!("{}.yaml", s.name), &s.manifest);
    }
    wait_until("every pod running", Duration::from_secs(60), || {
        specs
            .iter()
            .all(|s| record(&state, &s.name).is_some_and(|r| r.phase == "Running"))
    })
    .await;
    if let Some(c) = expect.condition {
        wait_until(c, expect.pressure_timeout, || pressure(&state, c)).await;
    }
    let deadline = Instant::now() + expect.pressure_timeout;
    while !verify_eviction_ordering(&state, specs) {
        assert!(
            Instant::now() < deadline,
            "pods that should be evicted are still running: {:?}",
            specs
                .iter()
                .filter(|s| s.priority != 0)
                .map(|s| (s.name.clone(), record(&state, &s.name).map(|r| r.phase)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for s in specs.iter().filter(|s| s.priority != 0) {
        verify_evicted_status(&state, s, expect.resource);
        verify_evicted_event(&state, s, expect.resource).await;
    }
    if let Some(c) = expect.condition {
        wait_until(&format!("{c} cleared"), Duration::from_secs(60), || {
            !pressure(&state, c)
        })
        .await;
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            assert!(!pressure(&state, c), "{c} disappeared and then reappeared");
            verify_eviction_ordering(&state, specs);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    delete_and_admit(node, specs).await;
}

/// kubelet's AfterEach: delete the pods, then a new pod must run.
async fn delete_and_admit(node: &Node, specs: &[Spec]) {
    let state = node.state.clone();
    for s in specs {
        node.delete(&format!("{}.yaml", s.name));
    }
    wait_until("the pods deleted", Duration::from_secs(60), || {
        specs.iter().all(|s| record(&state, &s.name).is_none())
    })
    .await;
    node.submit(
        "test-admit-pod.yaml",
        &pod(
            "test-admit-pod",
            &uid(999),
            "  restartPolicy: Never\n",
            "",
            "sleep 3600",
        ),
    );
    wait_until("test-admit-pod running", Duration::from_secs(60), || {
        phase(&state, "test-admit-pod").as_deref() == Some("Running")
    })
    .await;
}

/// A 1Gi node. Without a scenario's own thresholds, only kubelet's default memory one: the
/// default disk thresholds (`imagefs.available<15%`) would follow the build machine's disk.
fn memory_node(extra: ConfigArgs) -> ConfigArgs {
    let eviction_hard = if extra.eviction_hard.is_empty() {
        vec!["memory.available<100Mi".to_owned()]
    } else {
        extra.eviction_hard.clone()
    };
    ConfigArgs {
        node_capacity: vec!["memory=1Gi".to_owned()],
        eviction_pressure_transition_period: Some("5s".to_owned()),
        eviction_hard,
        ..extra
    }
}

const MEMORY: Expect = Expect {
    condition: Some("MemoryPressure"),
    resource: "memory",
    pressure_timeout: Duration::from_secs(90),
};

/// `MemoryAllocatableEviction`: kubeReserved = capacity - 300Mi, the hard threshold 250Mi
/// copied to allocatableMemory.available: the node is not under pressure before the hog
/// grows (the threshold is not counted twice), then the hog goes and the innocent pod stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_allocatable_eviction() {
    let _scenario = Scenario::begin("memory_allocatable_eviction").await;
    let args = memory_node(ConfigArgs {
        kube_reserved: vec!["memory=724Mi".to_owned()],
        eviction_hard: vec!["memory.available<250Mi".to_owned()],
        enforce_node_allocatable: Some("pods".to_owned()),
        ..ConfigArgs::default()
    });
    let node = Node::start("e2e-alloc", args, None);
    let specs = [
        spec("memory-hog-pod", 1, 1, "", "", &memory_hog_script(240)),
        innocent(2, ""),
    ];
    // Before any hog grows: no pressure (kubelet: 300Mi limit - ~0 working set > 250Mi).
    node.submit("innocent-pod.yaml", &specs[1].manifest);
    wait_until("innocent running", Duration::from_secs(60), || {
        phase(&node.state, "innocent-pod").as_deref() == Some("Running")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !pressure(&node.state, "MemoryPressure"),
        "MemoryPressure with no hog running: allocatable counted the threshold twice"
    );
    run_eviction_test(&node, &specs, &MEMORY).await;
    verify_why(&node.state, "memory-hog-pod").await;
    drop(node.shutdown().await);
}

/// Throttle, then evict (`enforcer.throttleBeforeEvict`): at the crossing the hog's pod
/// cgroup is capped at its usage and the pod gets its graceful stop instead of SIGKILL: its
/// SIGTERM handler runs (its container exits 0, not 137), the pod is Failed/Evicted, and the
/// kill record says it was capped and sent no SIGKILL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_throttle_then_graceful_stop() {
    let _scenario = Scenario::begin("memory_throttle_then_graceful_stop").await;
    let args = memory_node(ConfigArgs {
        kube_reserved: vec!["memory=724Mi".to_owned()],
        eviction_hard: vec!["memory.available<250Mi".to_owned()],
        enforce_node_allocatable: Some("pods".to_owned()),
        throttle_before_evict: vec![
            "memory.available".to_owned(),
            "allocatableMemory.available".to_owned(),
        ],
        ..ConfigArgs::default()
    });
    let node = Node::start("e2e-throttle", args, None);
    // The hog grows in the background; the container's main process sleeps in short steps
    // and exits 0 on SIGTERM (a shell runs its trap between foreground commands).
    let script = format!(
        "({}) & trap 'echo stopping gracefully; exit 0' TERM; while true; do sleep 0.2; done",
        memory_hog_script(240)
    );
    let hog = spec("throttled-pod", 0, 1, "", "", &script);
    node.submit("throttled-pod.yaml", &hog.manifest);
    wait_until(
        "the throttled pod evicted",
        Duration::from_secs(120),
        || {
            record(&node.state, "throttled-pod")
                .is_some_and(|r| r.reason == "Evicted" && r.phase.is_terminal())
        },
    )
    .await;
    let rec = record(&node.state, "throttled-pod").expect("its status");
    assert_eq!(rec.phase.to_string(), "Failed", "{rec:?}");
    match &rec.container_statuses.first().map(|c| &c.state) {
        Some(ContainerState::Terminated { exit_code, .. }) => assert_eq!(
            *exit_code, 0,
            "the graceful stop ran the SIGTERM handler, no SIGKILL: {rec:?}"
        ),
        other => panic!("the container terminated: {other:?}"),
    }
    let r = enforcer::kills::read(&node.state)
        .expect("the kill records")
        .0
        .into_iter()
        .rev()
        .find(|r| r.name.starts_with("throttled-pod-"))
        .expect("the kill record");
    assert!(r.throttled.starts_with("capped at "), "{r:?}");
    assert_eq!(r.sigkill_ns, None, "no SIGKILL above the floor: {r:?}");
    assert!(r.grace_period_seconds >= 1, "{r:?}");
    drop(node.shutdown().await);
}

/// The causal record of the eviction, as `enforcer why` shows it: every time of the chain
/// (kernel event, received, decided, SIGKILL, memory released) present and in order, the
/// threshold and the ranking with the victim first; `enforcer evictions -o json` lists it.
async fn verify_why(state: &std::path::Path, prefix: &str) {
    let find = || {
        enforcer::kills::read(state)
            .expect("the kill records")
            .0
            .into_iter()
            .rev()
            .find(|r| {
                r.kind == enforcer::kills::KillKind::Eviction
                    && r.name.starts_with(&format!("{prefix}-"))
            })
    };
    wait_until(
        &format!("{prefix}: the kill record with its release"),
        Duration::from_secs(30),
        || find().is_some_and(|r| !r.release.is_empty()),
    )
    .await;
    let r = find().expect("the kill record");
    assert_eq!(r.release, "released", "{r:?}");
    // The victim's memory reclaimed right after its SIGKILL (the default `reapMemory`).
    assert!(r.reaped.starts_with("process_mrelease:"), "{r:?}");
    let chain = r.chain();
    let names: Vec<&str> = chain.iter().map(|c| c.0).collect();
    for want in [
        "reading node and pods",
        "node and pods read",
        "decided",
        "SIGKILL sent",
        "memory released",
    ] {
        assert!(names.contains(&want), "{want} missing: {r:?}");
    }
    if matches!(r.step.as_str(), "crossing" | "signal") {
        assert!(
            names.contains(&"received by the daemon"),
            "a signal step names its signal: {r:?}"
        );
    }
    assert!(
        chain.windows(2).all(|w| w[0].1 <= w[1].1),
        "the chain in order: {chain:?}"
    );
    assert!(r.threshold.contains('<') && r.observed.is_some(), "{r:?}");
    assert_eq!(
        r.candidates.first().map(|c| c.uid.as_str()),
        Some(r.uid.as_str()),
        "the victim ranks first: {r:?}"
    );
    let bin = enforcer_tests::enforcer_binary();
    let out = std::process::Command::new(&bin)
        .args(["why", &r.name, "--state-dir"])
        .arg(state)
        .output()
        .expect("enforcer why");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("$ enforcer why {}\n{text}", r.name);
    // The printed timeline: the chain's steps, each later than the one before.
    let mut last = -1.0_f64;
    let mut seen = Vec::new();
    for line in text
        .lines()
        .skip_while(|l| !l.starts_with("Timeline:"))
        .skip(1)
    {
        let Some((what, t)) = line.trim().rsplit_once('+') else {
            break;
        };
        let ms: f64 = t
            .trim_end_matches(" ms")
            .parse()
            .unwrap_or_else(|_| panic!("a time in {line:?}"));
        assert!(ms >= last, "out of order at {line:?}:\n{text}");
        last = ms;
        seen.push(what.trim().to_owned());
    }
    assert_eq!(seen, names, "{text}");
    let out = std::process::Command::new(&bin)
        .args(["evictions", "-o", "json", "--state-dir"])
        .arg(state)
        .output()
        .expect("enforcer evictions");
    let all: Vec<enforcer::kills::KillRecord> =
        serde_json::from_slice(&out.stdout).expect("evictions -o json");
    assert!(all.iter().any(|x| x.id == r.id), "{all:?}");
    // The same chain in the metrics (the daemon runs in this process).
    let text =
        enforcer::metrics::encode(&[enforcer::metrics::global().registry()]).expect("the metrics");
    let value = |prefix: &str, label: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let signal = format!("eviction_signal=\"{}\"", r.signal);
    assert!(value("kubelet_evictions", &signal) >= 1.0, "{text}");
    for h in [
        "enforcer_eviction_decision_to_sigkill_seconds_count",
        "enforcer_eviction_sigkill_to_memory_released_seconds_count",
    ] {
        assert!(value(h, "") >= 1.0, "{h}: {text}");
    }
}

/// A 1Gi node with a hard `memory.available<500Mi`, the specs run through
/// [`run_eviction_test`].
async fn memory_ordering(tag: &str, specs: &[Spec]) {
    let args = memory_node(ConfigArgs {
        eviction_hard: vec!["memory.available<500Mi".to_owned()],
        ..ConfigArgs::default()
    });
    let node = Node::start(tag, args, None);
    run_eviction_test(&node, specs, &MEMORY).await;
    drop(node.shutdown().await);
}

/// `PriorityMemoryEvictionOrdering`: the default-priority hog goes first, then the
/// high-priority hog; the Guaranteed pod (under its request) never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_memory_eviction_ordering() {
    let _scenario = Scenario::begin("priority_memory_eviction_ordering").await;
    let specs = [
        spec("memory-hog-pod", 2, 11, "", "", &memory_hog_script(456)),
        spec(
            "high-priority-memory-hog-pod",
            1,
            12,
            HIGH_PRIORITY,
            "",
            &memory_hog_script(456),
        ),
        spec(
            "guaranteed-pod",
            0,
            13,
            "",
            GUARANTEED_300MI,
            &memory_holder_script(240),
        ),
    ];
    memory_ordering("e2e-prio-mem", &specs).await;
}

/// QoS memory ordering (kubelet's ranking: over request first, then priority, then usage
/// over request): BestEffort before Burstable; Guaranteed never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_memory_eviction_ordering() {
    let _scenario = Scenario::begin("qos_memory_eviction_ordering").await;
    let specs = [
        spec("besteffort-hog-pod", 2, 21, "", "", &memory_hog_script(456)),
        spec(
            "burstable-hog-pod",
            1,
            22,
            "",
            "    resources: {requests: {memory: 50Mi}}\n",
            &memory_hog_script(456),
        ),
        spec(
            "guaranteed-pod",
            0,
            23,
            "",
            GUARANTEED_300MI,
            &memory_holder_script(200),
        ),
    ];
    memory_ordering("e2e-qos-mem", &specs).await;
}

/// `PriorityPidEvictionOrdering`: the default-priority fork bomb first, then the
/// high-priority one; the innocent pod (high priority, few processes) never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_pid_eviction_ordering() {
    let _scenario = Scenario::begin("priority_pid_eviction_ordering").await;
    let args = ConfigArgs {
        // 200 pids for the pods: pid.available = 200 - tasks of kubepods. One fork bomb
        // alone (100 processes) crosses the threshold, as one of kubelet's (5000) does.
        node_capacity: vec!["memory=1Gi".to_owned(), "pids=200".to_owned()],
        eviction_hard: vec!["pid.available<130".to_owned()],
        eviction_pressure_transition_period: Some("5s".to_owned()),
        ..ConfigArgs::default()
    };
    let node = Node::start("e2e-prio-pid", args, None);
    let specs = [
        spec(
            "fork-bomb-container-with-low-priority-pod",
            2,
            31,
            "",
            "",
            &pid_hog_script(100),
        ),
        innocent(32, HIGH_PRIORITY),
        spec(
            "fork-bomb-container-with-high-priority-pod",
            1,
            33,
            HIGH_PRIORITY,
            "",
            &pid_hog_script(100),
        ),
    ];
    run_eviction_test(
        &node,
        &specs,
        &Expect {
            condition: Some("PIDPressure"),
            resource: "pids",
            pressure_timeout: Duration::from_secs(90),
        },
    )
    .await;
    drop(node.shutdown().await);
}

/// A node whose filesystem (the state directory: logs) is a tmpfs of `size`.
fn disk_node(tag: &str, size: &str, args: ConfigArgs) -> (Node, Tmpfs) {
    let cd = Containerd::start(tag);
    let state: PathBuf = cd.dir.join("state");
    let tmpfs = Tmpfs::mount(&state, &format!("size={size}"));
    let args = ConfigArgs {
        node_capacity: vec!["memory=1Gi".to_owned()],
        eviction_pressure_transition_period: Some("5s".to_owned()),
        // Disk has no kernel trigger: the housekeeping tick observes it (kubelet: 10 s).
        housekeeping_interval: Some("1s".to_owned()),
        ..args
    };
    (Node::start_on(cd, args, Some(state)), tmpfs)
}

async fn stop_disk_node(node: Node, tmpfs: Tmpfs) {
    let cd = node.shutdown().await;
    drop(tmpfs);
    drop(cd);
}

const DISK: Expect = Expect {
    condition: Some("DiskPressure"),
    resource: "ephemeral-storage",
    pressure_timeout: Duration::from_secs(90),
};

/// `LocalStorageEviction` (hard nodefs.available): the disk hog goes; the innocent pod stays,
/// also after the hog's eviction while its log is being removed (no over-eviction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_storage_eviction() {
    let _scenario = Scenario::begin("local_storage_eviction").await;
    let args = ConfigArgs {
        eviction_hard: vec!["nodefs.available<40Mi".to_owned()],
        ..ConfigArgs::default()
    };
    let (node, tmpfs) = disk_node("e2e-disk", "128m", args);
    let specs = [
        spec(
            "container-disk-hog-pod",
            1,
            41,
            "",
            "",
            &disk_hog_script(110),
        ),
        innocent(42, ""),
    ];
    run_eviction_test(&node, &specs, &DISK).await;
    stop_disk_node(node, tmpfs).await;
}

/// `LocalStorageSoftEviction` and `...NotOverwriteTerminationGracePeriodSeconds`: a soft
/// nodefs threshold evicts after its grace period (3 s here), and the pod is killed with
/// min(evictionMaxPodGracePeriod 30, its terminationGracePeriodSeconds 1): its own grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_storage_soft_eviction() {
    let _scenario = Scenario::begin("local_storage_soft_eviction").await;
    let args = ConfigArgs {
        eviction_hard: vec!["memory.available<0%".to_owned()],
        eviction_soft: vec!["nodefs.available<40Mi".to_owned()],
        eviction_soft_grace_period: vec!["nodefs.available=3s".to_owned()],
        eviction_max_pod_grace_period: Some(30),
        ..ConfigArgs::default()
    };
    let (node, tmpfs) = disk_node("e2e-disk-soft", "128m", args);
    let state = node.state.clone();
    // Ignores SIGTERM: its stop lasts exactly the grace period used (runtime floor 2 s).
    let specs = [
        spec(
            "container-disk-hog-pod",
            1,
            51,
            "",
            "",
            &format!("trap '' TERM; {}", disk_hog_script(110)),
        ),
        innocent(52, ""),
    ];
    let watch = async {
        let raised = wait_until("DiskPressure", Duration::from_secs(60), || {
            pressure(&state, "DiskPressure")
        })
        .await;
        let terminating = wait_until("the hog terminating", Duration::from_secs(60), || {
            record(&state, "container-disk-hog-pod")
                .is_some_and(|r| r.phase == "Terminating" || r.phase == "Failed")
        })
        .await;
        let failed = wait_until("the hog evicted", Duration::from_secs(60), || {
            record(&state, "container-disk-hog-pod").is_some_and(|r| r.phase == "Failed")
        })
        .await;
        (raised, terminating, failed)
    };
    let (_, (raised, terminating, failed)) =
        tokio::join!(run_eviction_test(&node, &specs, &DISK), watch);
    let waited = terminating - raised;
    assert!(
        waited >= Duration::from_millis(2500),
        "evicted {waited:?} after DiskPressure; the soft grace period is 3 s"
    );
    // kubelet's verifyEvictionPeriod: within min(max 30 + grace 3, pod 1 + grace 3) + 15 s.
    assert!(
        failed - raised < Duration::from_secs(4 + 15),
        "evicted {:?} after DiskPressure",
        failed - raised
    );
    let stop = failed - terminating;
    assert!(
        stop < Duration::from_secs(10),
        "the stop took {stop:?}: the pod's own 1 s grace (runtime floor 2 s), not evictionMaxPodGracePeriod 30 s"
    );
    stop_disk_node(node, tmpfs).await;
}

/// `PriorityLocalStorageEvictionOrdering`: the default-priority disk hog first, then the
/// high-priority one; the Guaranteed pod writing under its ephemeral-storage request never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_local_storage_eviction_ordering() {
    let _scenario = Scenario::begin("priority_local_storage_eviction_ordering").await;
    let args = ConfigArgs {
        eviction_hard: vec!["nodefs.available<60Mi".to_owned()],
        ..ConfigArgs::default()
    };
    let (node, tmpfs) = disk_node("e2e-disk-prio", "192m", args);
    let specs = [
        spec("best-effort-disk-pod", 2, 61, "", "", &disk_hog_script(120)),
        spec(
            "high-priority-disk-pod",
            1,
            62,
            HIGH_PRIORITY,
            "",
            &disk_hog_script(120),
        ),
        spec(
            "guaranteed-disk-pod",
            0,
            63,
            "",
            "    resources: {requests: {cpu: 100m, memory: 50Mi, ephemeral-storage: 40Mi}, limits: {cpu: 100m, memory: 50Mi, ephemeral-storage: 40Mi}}\n",
            &disk_hog_script(30),
        ),
    ];
    run_eviction_test(&node, &specs, &DISK).await;
    stop_disk_node(node, tmpfs).await;
}

/// `SystemNodeCriticalPod`: a `system-node-critical` pod filling the disk raises
/// DiskPressure and is never evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_node_critical_pod_is_not_evicted_under_disk_pressure() {
    let _scenario =
        Scenario::begin("system_node_critical_pod_is_not_evicted_under_disk_pressure").await;
    let args = ConfigArgs {
        eviction_hard: vec!["nodefs.available<40Mi".to_owned()],
        ..ConfigArgs::default()
    };
    let (node, tmpfs) = disk_node("e2e-critical", "96m", args);
    let state = node.state.clone();
    let name = "static-disk-hog";
    node.submit(
        "static-disk-hog.yaml",
        &pod(
            name,
            &uid(71),
            "  namespace: kube-system\n  priorityClassName: system-node-critical\n",
            "",
            &disk_hog_script(70),
        ),
    );
    wait_until("the critical pod running", Duration::from_secs(60), || {
        phase(&state, name).as_deref() == Some("Running")
    })
    .await;
    wait_until("DiskPressure", Duration::from_secs(60), || {
        pressure(&state, "DiskPressure")
    })
    .await;
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        assert_eq!(
            phase(&state, name).as_deref(),
            Some("Running"),
            "the system-node-critical pod must not be evicted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    node.delete("static-disk-hog.yaml");
    wait_until("the critical pod gone", Duration::from_secs(60), || {
        phase(&state, name).is_none()
    })
    .await;
    wait_until("DiskPressure cleared", Duration::from_secs(60), || {
        !pressure(&state, "DiskPressure")
    })
    .await;
    stop_disk_node(node, tmpfs).await;
}

/// kubelet's `getOOMTargetContainer`: a 20M buffer in a 15Mi container.
const OOM_TARGET: &str = "sleep 1 && dd if=/dev/zero of=/dev/null bs=20M";

/// kubelet's `verifyReasonForOOMKilledContainer`: the pod terminated, the target container
/// (app or init) terminated with exit code 137; the enforcer also reports `OOMKilled`.
async fn verify_oom_killed(node: &Node, name: &str, container: &str, init: bool) -> PodRecord {
    let state = node.state.clone();
    wait_until("the pod terminated", Duration::from_secs(60), || {
        phase(&state, name).as_deref() == Some("Failed")
    })
    .await;
    let r = record(&state, name).expect("record");
    let statuses = if init {
        &r.init_container_statuses
    } else {
        &r.container_statuses
    };
    let c = statuses
        .iter()
        .find(|c| c.name == container)
        .unwrap_or_else(|| panic!("container {container} in {r:?}"));
    match &c.state {
        ContainerState::Terminated {
            exit_code, reason, ..
        } => {
            assert_eq!(*exit_code, 137, "{r:?}");
            assert_eq!(reason, "OOMKilled", "{r:?}");
        }
        other => panic!("{container} not terminated: {other:?}"),
    }
    // kubelet's phase rule, not an eviction: `Failed` with no pod-level reason.
    assert_eq!(
        (r.reason.as_str(), r.message.as_str()),
        ("", ""),
        "an OOM-killed pod is not evicted: {r:?}"
    );
    r
}

/// kubelet's OOM target pod: `restartPolicy: Never`, one container of 15Mi running `command`.
fn oom_pod(name: &str, n: u32, container: &str, command: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, uid: {uid}}}
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
  - name: {container}
    image: busybox:local
    imagePullPolicy: Never
    command: ["sh", "-c", "{command}"]
    resources: {{requests: {{memory: 15Mi}}, limits: {{memory: 15Mi}}}}
"#,
        uid = uid(n)
    )
}

/// `OOMKiller`: single process container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oom_killer_single_process_container() {
    let _scenario = Scenario::begin("oom_killer_single_process_container").await;
    let node = Node::start("e2e-oom", memory_node(ConfigArgs::default()), None);
    let manifest = oom_pod(
        "oomkill-target-pod",
        81,
        "oomkill-single-target-container",
        OOM_TARGET,
    );
    node.submit("oom.yaml", &manifest);
    let r = verify_oom_killed(
        &node,
        "oomkill-target-pod",
        "oomkill-single-target-container",
        false,
    )
    .await;
    assert_eq!(
        r.reason, "",
        "a container OOM kill is not an eviction: {r:?}"
    );
    drop(node.shutdown().await);
}

/// `OOMKiller`: init container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oom_killer_init_container() {
    let _scenario = Scenario::begin("oom_killer_init_container").await;
    let node = Node::start("e2e-oom-init", memory_node(ConfigArgs::default()), None);
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: initcontinar-oomkill-target-pod, uid: {uid}}}
spec:
  hostNetwork: true
  restartPolicy: Never
  initContainers:
  - name: oomkill-target-init-container
    image: busybox:local
    imagePullPolicy: Never
    command: ["sh", "-c", "{OOM_TARGET}"]
    resources: {{requests: {{memory: 15Mi}}, limits: {{memory: 15Mi}}}}
  containers:
  - name: busybox
    image: busybox:local
    imagePullPolicy: Never
    command: ["sleep", "3600"]
"#,
        uid = uid(82)
    );
    node.submit("oom.yaml", &manifest);
    let r = verify_oom_killed(
        &node,
        "initcontinar-oomkill-target-pod",
        "oomkill-target-init-container",
        true,
    )
    .await;
    assert!(
        r.container_statuses
            .iter()
            .all(|c| !matches!(c.state, ContainerState::Running { .. })),
        "the main container never starts: {r:?}"
    );
    drop(node.shutdown().await);
}

/// `OOMKiller`: multi process container (kubelet runs it on cgroup v2 only: with
/// `memory.oom.group` the whole container dies and ends with 137). v2 only: run by
/// `cargo xtask vm-test`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oom_killer_multi_process_container_v2only() {
    enforcer_tests::require_memory_v2("memory.oom.group (the multi-process OOM kill)");
    let _scenario = Scenario::begin("oom_killer_multi_process_container").await;
    let node = Node::start("e2e-oom-multi", memory_node(ConfigArgs::default()), None);
    let manifest = oom_pod(
        "oomkill-target-pod",
        83,
        "oomkill-multi-target-container",
        &format!("{OOM_TARGET} & sleep 86400"),
    );
    node.submit("oom.yaml", &manifest);
    verify_oom_killed(
        &node,
        "oomkill-target-pod",
        "oomkill-multi-target-container",
        false,
    )
    .await;
    drop(node.shutdown().await);
}

/// `OOMKiller for pod using more memory than node allocatable`: kubeReserved is 35 % of the
/// node, the pod has no limit and asks for far more. kubelet expects the kernel to OOM-kill
/// it at the kubepods limit; the enforcer evicts it first (allocatableMemory.available) and
/// no kernel OOM kill happens (a deliberate difference, docs/differences.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_using_more_than_node_allocatable_is_evicted_before_the_oom_killer() {
    let _scenario =
        Scenario::begin("pod_using_more_than_node_allocatable_is_evicted_before_the_oom_killer")
            .await;
    let args = memory_node(ConfigArgs {
        // 35 % of 1Gi.
        kube_reserved: vec!["memory=358Mi".to_owned()],
        eviction_hard: vec!["memory.available<250Mi".to_owned()],
        ..ConfigArgs::default()
    });
    let node = Node::start("e2e-oom-alloc", args, None);
    let state = node.state.clone();
    let before = node_oom_kills();
    node.submit(
        "oom.yaml",
        &pod(
            "oomkill-nodeallocatable-pod",
            &uid(84),
            "  restartPolicy: Never\n",
            "",
            "sleep 1 && dd if=/dev/zero of=/dev/null iflag=fullblock count=10 bs=1G",
        ),
    );
    wait_until("the pod terminated", Duration::from_secs(60), || {
        phase(&state, "oomkill-nodeallocatable-pod").as_deref() == Some("Failed")
    })
    .await;
    let r = record(&state, "oomkill-nodeallocatable-pod").expect("record");
    assert_eq!(r.reason, "Evicted", "evicted before the kernel acts: {r:?}");
    assert!(
        r.message
            .starts_with("The node was low on resource: memory. Threshold quantity: 250Mi"),
        "{r:?}"
    );
    match &r.container_statuses.first().map(|c| &c.state) {
        Some(ContainerState::Terminated { exit_code, .. }) => {
            assert_eq!(*exit_code, 137, "killed by SIGKILL: {r:?}");
        }
        other => panic!("container terminated: {other:?}"),
    }
    assert_eq!(
        node_oom_kills(),
        before,
        "no kernel OOM kill: the enforcer evicted first"
    );
    drop(node.shutdown().await);
}

/// `LocalStorageCapacityIsolationEviction`: emptyDir over its sizeLimit, a container over its
/// ephemeral-storage limit (writable layer, and emptyDir counted in it) are evicted; a memory
/// emptyDir at its size and pods under their limits are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_storage_capacity_isolation_eviction() {
    let _scenario = Scenario::begin("local_storage_capacity_isolation_eviction").await;
    let node = Node::start(
        "e2e-isolation",
        memory_node(ConfigArgs {
            eviction_hard: vec!["memory.available<0%".to_owned()],
            housekeeping_interval: Some("1s".to_owned()),
            ..ConfigArgs::default()
        }),
        None,
    );
    let dd = |mib: u32, path: &str| {
        format!(
            "i=0; while [ $i -lt {mib} ]; do dd if=/dev/urandom of={path}file${{i}} bs=1048576 count=1 2>/dev/null; sleep .1; i=$((i+1)); done; while true; do sleep 5; done"
        )
    };
    let with_volume =
        |name: &str, n: u32, volume: &str, resources: &str, script: &str, p: u32| Spec {
            name: name.to_owned(),
            priority: p,
            manifest: format!(
                r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, uid: {uid}}}
spec:
  hostNetwork: true
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: {name}-container
    image: busybox:local
    imagePullPolicy: Never
    command: ["sh", "-c", "{script}"]
{resources}    volumeMounts: [{{name: test-volume, mountPath: /test-mnt}}]
  volumes:
  - name: test-volume
{volume}"#,
                uid = uid(n)
            ),
        };
    let specs = [
        with_volume(
            "emptydir-disk-sizelimit-pod",
            91,
            "    emptyDir: {sizeLimit: 100Mi}\n",
            "",
            &dd(101, "/test-mnt/"),
            1,
        ),
        with_volume(
            "container-disk-limit-pod",
            92,
            "    emptyDir: {}\n",
            "    resources: {limits: {ephemeral-storage: 100Mi}}\n",
            &dd(101, ""),
            1,
        ),
        with_volume(
            "container-emptydir-disk-limit-pod",
            93,
            "    emptyDir: {}\n",
            "    resources: {limits: {ephemeral-storage: 100Mi}}\n",
            &dd(101, "/test-mnt/"),
            1,
        ),
        with_volume(
            "emptydir-memory-sizelimit-pod",
            94,
            "    emptyDir: {medium: Memory, sizeLimit: 100Mi}\n",
            "",
            &dd(101, "/test-mnt/"),
            0,
        ),
        with_volume(
            "emptydir-disk-below-sizelimit-pod",
            95,
            "    emptyDir: {sizeLimit: 100Mi}\n",
            "",
            &dd(99, "/test-mnt/"),
            0,
        ),
        with_volume(
            "container-disk-below-sizelimit-pod",
            96,
            "    emptyDir: {}\n",
            "    resources: {limits: {ephemeral-storage: 100Mi}}\n",
            &dd(99, ""),
            0,
        ),
    ];
    run_eviction_test(
        &node,
        &specs,
        &Expect {
            condition: None,
            resource: LOCAL_STORAGE,
            pressure_timeout: Duration::from_secs(120),
        },
    )
    .await;
    drop(node.shutdown().await);
}

/// `InodeEviction`: a pod creating files in an emptyDir on nodefs is evicted for
/// `nodefs.inodesFree`; the innocent pod stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inode_eviction() {
    let _scenario = Scenario::begin("inode_eviction").await;
    let cd = Containerd::start("e2e-inodes");
    let state: PathBuf = cd.dir.join("state");
    let tmpfs = Tmpfs::mount(&state, "size=256m,nr_inodes=4000");
    let args = ConfigArgs {
        node_capacity: vec!["memory=1Gi".to_owned()],
        eviction_hard: vec!["nodefs.inodesFree<1500".to_owned()],
        eviction_pressure_transition_period: Some("5s".to_owned()),
        housekeeping_interval: Some("1s".to_owned()),
        ..ConfigArgs::default()
    };
    let node = Node::start_on(cd, args, Some(state));
    let specs = [
        Spec {
            name: "volume-inode-hog-pod".to_owned(),
            priority: 1,
            manifest: format!(
                r#"apiVersion: v1
kind: Pod
metadata: {{name: volume-inode-hog-pod, uid: {uid}}}
spec:
  hostNetwork: true
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: volume-inode-hog-container
    image: busybox:local
    imagePullPolicy: Never
    command: ["sh", "-c", "i=0; while [ $i -lt 100000 ]; do touch /test-mnt/file${{i}}.txt; i=$((i+1)); done; while true; do sleep 5; done"]
    volumeMounts: [{{name: test-volume, mountPath: /test-mnt}}]
  volumes:
  - {{name: test-volume, emptyDir: {{}}}}
"#,
                uid = uid(101)
            ),
        },
        innocent(102, ""),
    ];
    run_eviction_test(
        &node,
        &specs,
        &Expect {
            condition: Some("DiskPressure"),
            resource: "inodes",
            pressure_timeout: Duration::from_secs(120),
        },
    )
    .await;
    stop_disk_node(node, tmpfs).await;
}
