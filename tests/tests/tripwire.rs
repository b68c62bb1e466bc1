//! The crossing tripwire on the real kernel, cgroups and containerd. cgroup v2: `memory.high`
//! on kubepods where the memory threshold is crossed, so the kernel itself signals the
//! crossing (reclaim above `memory.high`, counted as `high` in kubepods' `memory.events`), the
//! eviction follows, and the tripwire is lifted while the victim is killed and placed again
//! after (run by `cargo xtask vm-test`: Debian 6.1, pure v2). cgroup v1: a usage-threshold
//! eventfd at the same place, waited on by the crossing thread itself (the host tier).

use std::{path::Path, time::Duration};

use enforcer::config::{ConfigArgs, SignalSource};
use enforcer_tests::{
    layout,
    node::{Node, find, phase, pod, status_file, wait_until},
};

const MI: i64 = 1 << 20;

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn high_events(kubepods: &Path) -> u64 {
    enforcer::kernel::fallback::parse_mem_events(&read(&kubepods.join("memory.events"))).high
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_high_tripwire_signals_the_crossing_and_is_lifted_for_the_eviction_v2only() {
    enforcer_tests::require_memory_v2("the memory.high tripwire");
    let l = layout();
    let (mount, _) = l.controller("memory").expect("a memory controller");
    let args = ConfigArgs {
        node_capacity: vec!["memory=400Mi".to_owned()],
        eviction_hard: vec!["memory.available<100Mi".to_owned()],
        // The cgroup file's tripwire, not the crossing check on the charge path.
        signal_source: Some(SignalSource::EbpfTripwire),
        // Nothing rests on the housekeeping tick: the crossing must come from the kernel.
        housekeeping_interval: Some("600s".to_owned()),
        ..ConfigArgs::default()
    };
    let node = Node::start("tripwire", args, None);
    let state = node.state.clone();
    let kubepods = mount.join(node.cd.kubepods_path().trim_start_matches('/'));
    node.submit(
        "steady.yaml",
        &pod(
            "steady",
            "cccccccc-0000-0000-0000-000000000001",
            "",
            "    resources: {requests: {memory: 16Mi}}",
            "trap 'exit 0' TERM; sleep 3600 & wait",
        ),
    );
    wait_until("the steady pod running", Duration::from_secs(60), || {
        phase(&state, "steady").as_deref() == Some("Running")
    })
    .await;
    // Armed: memory.high at kubepods' usage plus the distance to the threshold, i.e. where
    // the pods' usage reaches 400Mi - 100Mi (capacity override: measured on kubepods).
    wait_until("the tripwire armed", Duration::from_secs(30), || {
        read(&kubepods.join("memory.high")) != "max"
    })
    .await;
    let high: i64 = read(&kubepods.join("memory.high"))
        .parse()
        .expect("a number");
    let usage: i64 = read(&kubepods.join("memory.current"))
        .parse()
        .expect("a number");
    assert!(
        high > usage && high <= 300 * MI + 4 * MI,
        "memory.high {high} with kubepods at {usage}: expected between the usage and 300Mi"
    );
    let before = high_events(&kubepods);

    // A pod that grows past the threshold towards the 400Mi capacity in one process, without
    // forking on the way (a fork-heavy grower wakes the eviction manager through the fork
    // tracepoint, which may then see the crossing before the kernel reports it; here only
    // the tripwire can tell): `tail` keeps the last 360 MiB of a stream of zeros.
    let hog =
        "dd if=/dev/zero bs=1048576 count=360 2>/dev/null | tail -c 360m >/dev/null; sleep 3600";
    node.submit(
        "hog.yaml",
        &pod("hog", "cccccccc-0000-0000-0000-000000000002", "", "", hog),
    );
    wait_until("the hog pod evicted", Duration::from_secs(120), || {
        find(&status_file(&state).pods, "hog").is_some_and(|r| r.reason == "Evicted")
    })
    .await;
    assert!(
        high_events(&kubepods) > before,
        "the kernel never reported usage above memory.high: the tripwire did not trip"
    );
    assert_eq!(phase(&state, "steady").as_deref(), Some("Running"));
    // After the victim's release the tripwire is placed again.
    wait_until("the tripwire re-armed", Duration::from_secs(60), || {
        read(&kubepods.join("memory.high")) != "max"
    })
    .await;
    // The stopped daemon leaves kubepods unthrottled.
    let mut node = node;
    node.stop_daemon().await;
    assert_eq!(read(&kubepods.join("memory.high")), "max");
    drop(node.shutdown().await);
}

/// cgroup v1: with no signal source but a poll every 600 s, only the usage-threshold tripwire
/// can tell the crossing; the eviction follows, its kill record naming a crossing step
/// started by the tripwire's usage-threshold signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_threshold_tripwire_signals_the_crossing_v1only() {
    enforcer_tests::require_memory_v1("the usage-threshold tripwire");
    let args = ConfigArgs {
        node_capacity: vec!["memory=400Mi".to_owned()],
        eviction_hard: vec!["memory.available<100Mi".to_owned()],
        signal_source: Some(SignalSource::Poll),
        // Nothing rests on the housekeeping tick (nor the poll, at the same period).
        housekeeping_interval: Some("600s".to_owned()),
        ..ConfigArgs::default()
    };
    let node = Node::start("tripwire-v1", args, None);
    let state = node.state.clone();
    node.submit(
        "steady.yaml",
        &pod(
            "steady",
            "cccccccc-0000-0000-0000-000000000011",
            "",
            "    resources: {requests: {memory: 16Mi}}",
            "trap 'exit 0' TERM; sleep 3600 & wait",
        ),
    );
    wait_until("the steady pod running", Duration::from_secs(60), || {
        phase(&state, "steady").as_deref() == Some("Running")
    })
    .await;
    let hog =
        "dd if=/dev/zero bs=1048576 count=360 2>/dev/null | tail -c 360m >/dev/null; sleep 3600";
    node.submit(
        "hog.yaml",
        &pod("hog", "cccccccc-0000-0000-0000-000000000012", "", "", hog),
    );
    wait_until("the hog pod evicted", Duration::from_secs(120), || {
        find(&status_file(&state).pods, "hog").is_some_and(|r| r.reason == "Evicted")
    })
    .await;
    let record = enforcer::kills::read(&state)
        .expect("the kill records")
        .0
        .into_iter()
        .rev()
        .find(|r| r.kind == enforcer::kills::KillKind::Eviction && r.name.starts_with("hog-"))
        .expect("the hog's kill record");
    assert_eq!(record.step, "crossing", "{record:?}");
    let trigger = record.trigger.as_ref().expect("a trigger signal");
    assert_eq!(
        (trigger.kind.as_str(), trigger.source.as_str()),
        ("memoryThreshold", "eventfd"),
        "{record:?}"
    );
    assert_eq!(phase(&state, "steady").as_deref(), Some("Running"));
    drop(node.shutdown().await);
}
