use k8s_openapi::api::core::v1::{Pod, Toleration};

use super::*;
use crate::{
    policy::{
        eviction::{Observation, PodStats, ThresholdValue},
        resources::test_pods::{container, pod},
    },
    quantity::Quantity,
};

/// One step on these observations and pods at `now`, every pod read, and the last victim
/// (if any) released: the thresholds' part of the step, as the simulator drives it.
pub(super) fn run(
    config: &EvictionConfig,
    state: State,
    observations: &Observations,
    pods: &[ActivePod<'_>],
    now: Duration,
) -> (State, StepDecision) {
    let input = Input {
        released: true,
        ..Input::new(observations, pods, now)
    };
    step(config, state, &input)
}

fn q(s: &str) -> Quantity {
    Quantity::parse(s).unwrap()
}
fn obs(signal: Signal, avail: &str, cap: &str, at: u64) -> Observations {
    [(
        signal,
        Observation {
            available: q(avail).value(),
            capacity: q(cap).value(),
            time: Some(Duration::from_secs(at)),
        },
    )]
    .into()
}
fn hard(signal: Signal, v: &str) -> Threshold {
    Threshold {
        signal,
        value: ThresholdValue::Quantity(q(v)),
        grace_period: Duration::ZERO,
        min_reclaim: None,
    }
}
fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn memory_pressure_hard_and_transition() {
    // After eviction_manager_test.go TestMemoryPressure (hard threshold part).
    let config = EvictionConfig {
        thresholds: vec![hard(Signal::MemoryAvailable, "1Gi")],
        max_pod_grace_period_seconds: 5,
        pressure_transition_period: Duration::from_secs(300),
        throttle_before_evict: Vec::new(),
    };
    let be = pod("best-effort-high", vec![container("a", "", "")]);
    let mut bu = pod(
        "burstable-below",
        vec![container("a", "memory=100Mi", "memory=1Gi")],
    );
    bu.spec.as_mut().unwrap().termination_grace_period_seconds = Some(30);
    let s_be = PodStats {
        memory: Some(400 << 20),
        ..Default::default()
    };
    let s_bu = PodStats {
        memory: Some(300 << 20),
        containers: vec![crate::policy::eviction::ContainerStats {
            name: "a".into(),
            memory: Some(300 << 20),
            ephemeral_storage: None,
        }]
        .into(),
        ..Default::default()
    };
    let pods = [
        ActivePod::new(&be, Some(&s_be)),
        ActivePod::new(&bu, Some(&s_bu)),
    ];
    let state = State::default();
    // No pressure.
    let (state, d) = run(
        &config,
        state,
        &obs(Signal::MemoryAvailable, "2Gi", "8Gi", 0),
        &pods,
        secs(0),
    );
    assert!(d.conditions.is_empty() && d.eviction().is_none());
    // Pressure: evict the best-effort pod (exceeds its zero request, larger usage over request).
    let (state, d) = run(
        &config,
        state,
        &obs(Signal::MemoryAvailable, "500Mi", "8Gi", 10),
        &pods,
        secs(10),
    );
    assert_eq!(d.conditions, [NodeCondition::MemoryPressure]);
    let e = d.eviction().unwrap();
    assert_eq!(e.name, "best-effort-high");
    assert_eq!(e.grace_period_seconds, 1);
    assert_eq!(
        e.message,
        "The node was low on resource: memory. Threshold quantity: 1Gi, available: 500Mi. "
    );
    assert_eq!(
        d.node_event.as_deref(),
        Some("Attempting to reclaim memory")
    );
    // Stale stats: no second eviction.
    let (state, d) = run(
        &config,
        state,
        &obs(Signal::MemoryAvailable, "500Mi", "8Gi", 10),
        &pods[1..],
        secs(20),
    );
    assert!(d.eviction().is_none());
    assert_eq!(d.conditions, [NodeCondition::MemoryPressure]);
    // Fresh stats: the burstable pod goes, with a container sentence; the node event was
    // emitted once for this episode, not again.
    let (state, d) = run(
        &config,
        state,
        &obs(Signal::MemoryAvailable, "500Mi", "8Gi", 30),
        &pods[1..],
        secs(30),
    );
    assert_eq!(d.node_event, None, "EvictionThresholdMet once per episode");
    let e = d.eviction().unwrap();
    assert_eq!(
        e.message,
        "The node was low on resource: memory. Threshold quantity: 1Gi, available: 500Mi. Container a was using 300Mi, request is 100Mi, has larger consumption of memory. "
    );
    // Pressure gone, but the condition stays for the transition period.
    let (state, d) = run(
        &config,
        state,
        &obs(Signal::MemoryAvailable, "2Gi", "8Gi", 40),
        &pods[1..],
        secs(40),
    );
    assert_eq!(d.conditions, [NodeCondition::MemoryPressure]);
    assert!(d.eviction().is_none());
    assert!(state.announced.is_empty(), "the episode ended");
    // A new episode announces again.
    let (state, d) = run(
        &config,
        state,
        &obs(Signal::MemoryAvailable, "500Mi", "8Gi", 50),
        &pods[1..],
        secs(50),
    );
    assert_eq!(
        d.node_event.as_deref(),
        Some("Attempting to reclaim memory")
    );
    let (_, d) = run(
        &config,
        state,
        &obs(Signal::MemoryAvailable, "2Gi", "8Gi", 400),
        &pods[1..],
        secs(400),
    );
    assert!(d.conditions.is_empty());
}

#[test]
fn node_level_reclaim_is_paced() {
    let mut p = ReclaimPacer::default();
    let ms = Duration::from_millis;
    let got: Vec<bool> = [0, 10, 999, 1000, 1500, 2100]
        .into_iter()
        .map(|t| p.due(ms(t)))
        .collect();
    assert_eq!(got, [true, false, false, true, false, true]);
}

#[test]
fn cleanup_wait_holds_evictions_until_released_or_timed_out() {
    let w = CleanupWait {
        uid: "u".into(),
        since: secs(10),
    };
    for (now, released, want) in [
        (10, false, Cleanup::Waiting),
        (39, false, Cleanup::Waiting),
        (40, false, Cleanup::TimedOut),
        (11, true, Cleanup::Released),
        (100, true, Cleanup::Released),
    ] {
        assert_eq!(
            w.check(secs(now), released),
            want,
            "at {now} s, released {released}"
        );
    }
}

#[test]
fn soft_grace_period_and_min_reclaim() {
    let mut soft = hard(Signal::MemoryAvailable, "2Gi");
    soft.grace_period = secs(120);
    let mut h = hard(Signal::MemoryAvailable, "1Gi");
    h.min_reclaim = Some(ThresholdValue::Quantity(q("500Mi")));
    let config = EvictionConfig {
        thresholds: vec![h, soft],
        max_pod_grace_period_seconds: 5,
        pressure_transition_period: secs(300),
        throttle_before_evict: Vec::new(),
    };
    let p = pod("p", vec![container("a", "", "")]);
    let s = PodStats {
        memory: Some(1),
        ..Default::default()
    };
    let pods = [ActivePod::new(&p, Some(&s))];
    // Soft met: condition at once, no eviction before the grace period.
    let (st, d) = run(
        &config,
        State::default(),
        &obs(Signal::MemoryAvailable, "1500Mi", "8Gi", 0),
        &pods,
        secs(0),
    );
    assert_eq!(d.conditions, [NodeCondition::MemoryPressure]);
    assert!(d.eviction().is_none());
    // The next step is due when the grace period ends (before the condition's transition).
    assert_eq!(next_deadline(&config, &st, secs(0)), Some(secs(120)));
    assert_eq!(next_deadline(&config, &st, secs(120)), Some(secs(300)));
    assert_eq!(next_deadline(&config, &st, secs(300)), None);
    let (st, d) = run(
        &config,
        st,
        &obs(Signal::MemoryAvailable, "1500Mi", "8Gi", 60),
        &pods,
        secs(60),
    );
    assert!(d.eviction().is_none());
    let (st, d) = run(
        &config,
        st,
        &obs(Signal::MemoryAvailable, "1500Mi", "8Gi", 120),
        &pods,
        secs(120),
    );
    assert_eq!(d.eviction().unwrap().grace_period_seconds, 5);
    // Hard met, then above the threshold but below threshold + min reclaim: still met.
    let (st, d) = run(
        &config,
        st,
        &obs(Signal::MemoryAvailable, "900Mi", "8Gi", 130),
        &pods,
        secs(130),
    );
    assert_eq!(d.eviction().unwrap().grace_period_seconds, 1);
    let (st, d) = run(
        &config,
        st,
        &obs(Signal::MemoryAvailable, "1100Mi", "8Gi", 140),
        &pods,
        secs(140),
    );
    assert_eq!(
        d.eviction().unwrap().threshold.value,
        ThresholdValue::Quantity(q("1Gi"))
    );
    // Past min reclaim (1.5Gi) the hard threshold is resolved; the soft one, met since
    // t=0, acts with its grace period.
    let (_, d) = run(
        &config,
        st,
        &obs(Signal::MemoryAvailable, "1600Mi", "8Gi", 150),
        &pods,
        secs(150),
    );
    assert_eq!(d.eviction().unwrap().grace_period_seconds, 5);
}

#[test]
fn critical_pods_are_skipped() {
    let config = EvictionConfig {
        thresholds: vec![hard(Signal::PidAvailable, "100")],
        pressure_transition_period: secs(60),
        throttle_before_evict: Vec::new(),
        ..EvictionConfig::default()
    };
    let mut crit = pod("critical", vec![container("a", "", "")]);
    crit.spec.as_mut().unwrap().priority = Some(-5);
    crit.metadata.annotations =
        Some([(resources::CONFIG_SOURCE_ANNOTATION.into(), "file".into())].into());
    let other = pod("other", vec![container("a", "", "")]);
    let s = PodStats {
        processes: Some(50),
        ..Default::default()
    };
    let pods = [
        ActivePod::new(&crit, Some(&s)),
        ActivePod::new(&other, Some(&s)),
    ];
    let (_, d) = run(
        &config,
        State::default(),
        &obs(Signal::PidAvailable, "10", "1000", 1),
        &pods,
        secs(1),
    );
    assert_eq!(d.skipped_critical, ["critical"]);
    let e = d.eviction().unwrap();
    assert_eq!(e.name, "other");
    assert_eq!(
        e.message,
        "The node was low on resource: pids. Threshold quantity: 100, available: 10. "
    );
    assert_eq!(d.conditions, [NodeCondition::PidPressure]);
    let (_, d) = run(
        &config,
        State::default(),
        &obs(Signal::PidAvailable, "10", "1000", 1),
        &pods[..1],
        secs(1),
    );
    assert!(d.eviction().is_none());
}

#[test]
fn admission_under_conditions() {
    // After eviction_manager_test.go (TestAdmit... within TestMemoryPressure / TestDiskPressure).
    let be = pod("be", vec![container("a", "", "")]);
    let bu = pod("bu", vec![container("a", "memory=1Gi", "")]);
    assert!(admit(&[], &be).admitted);
    assert!(admit(&[NodeCondition::MemoryPressure], &bu).admitted);
    let r = admit(&[NodeCondition::MemoryPressure], &be);
    assert_eq!(
        (r.admitted, r.reason.as_str(), r.message.as_str()),
        (
            false,
            "Evicted",
            "The node had condition: [MemoryPressure]. "
        )
    );
    let mut tol = be.clone();
    tol.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
        key: Some("node.kubernetes.io/memory-pressure".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }]);
    assert!(admit(&[NodeCondition::MemoryPressure], &tol).admitted);
    assert!(!admit(&[NodeCondition::DiskPressure], &bu).admitted);
    assert_eq!(
        admit(
            &[NodeCondition::DiskPressure, NodeCondition::MemoryPressure],
            &tol
        )
        .message,
        "The node had condition: [DiskPressure MemoryPressure]. "
    );
    let mut crit = be;
    crit.spec.as_mut().unwrap().priority = Some(2_000_000_000);
    assert!(admit(&[NodeCondition::DiskPressure], &crit).admitted);
}

// The decisions the executor used to take beside the step, one table each.

fn memory_config(t: Threshold) -> EvictionConfig {
    EvictionConfig {
        thresholds: vec![t],
        max_pod_grace_period_seconds: 5,
        pressure_transition_period: secs(60),
        throttle_before_evict: Vec::new(),
    }
}

fn low_memory(at: u64) -> Observations {
    obs(Signal::MemoryAvailable, "500Mi", "8Gi", at)
}

fn memory_stats() -> PodStats {
    PodStats {
        memory: Some(100 << 20),
        ..Default::default()
    }
}

fn waiting_on(uid: &str, since: u64) -> State {
    State {
        cleanup: Some(CleanupWait {
            uid: uid.into(),
            since: secs(since),
        }),
        ..State::default()
    }
}

/// kubelet's `waitForPodsCleanup`: no eviction while the victim holds its resources; the
/// wait ends on the release or after [`POD_CLEANUP_TIMEOUT`], and the same step may evict.
#[test]
fn cleanup_wait_decisions() {
    let config = memory_config(hard(Signal::MemoryAvailable, "1Gi"));
    let p = pod("p", vec![container("a", "", "")]);
    let s = memory_stats();
    let pods = [ActivePod::new(&p, Some(&s))];
    // (now, released, pressure) -> (action, the wait's end: released and how long, the wait
    // after)
    type Case = (
        u64,
        bool,
        bool,
        &'static str,
        Option<(bool, u64)>,
        Option<&'static str>,
    );
    let cases: [Case; 6] = [
        (15, false, true, "wait", None, Some("v")),
        (15, false, false, "wait", None, Some("v")),
        (15, true, true, "evict", Some((true, 5)), Some("uid-p")),
        (15, true, false, "nothing", Some((true, 5)), None),
        (39, false, true, "wait", None, Some("v")),
        (40, false, true, "evict", Some((false, 30)), Some("uid-p")),
    ];
    for (now, released, pressure, want, end, after) in cases {
        let state = waiting_on("v", 10);
        let awaited = state.awaited(secs(now), released).map(str::to_owned);
        let o = if pressure {
            low_memory(now)
        } else {
            obs(Signal::MemoryAvailable, "4Gi", "8Gi", now)
        };
        let input = Input {
            released,
            ..Input::new(&o, &pods, secs(now))
        };
        let (next, d) = step(&config, state, &input);
        let what = match d.action {
            Action::WaitForCleanup => "wait",
            Action::Evict { .. } => "evict",
            Action::Nothing(Idle::NotStarved) => "nothing",
            ref other => panic!("{other:?}"),
        };
        let case = format!("at {now} s, released {released}, pressure {pressure}");
        assert_eq!(what, want, "{case}");
        assert_eq!(
            d.cleanup.map(|e| (&*e.uid == "v", e.released, e.waited)),
            end.map(|(r, w)| (true, r, secs(w))),
            "{case}"
        );
        assert_eq!(next.cleanup.as_ref().map(|w| &*w.uid), after, "{case}");
        // The executor leaves the awaited victim out of what it observes.
        assert_eq!(awaited.is_some(), want == "wait", "{case}");
    }
}

/// A victim is chosen on every pod's fresh figures: on carried-over ones the step asks to
/// read every pod again and returns the state it was given.
#[test]
fn reobserve_decisions() {
    let config = memory_config(hard(Signal::MemoryAvailable, "1Gi"));
    let p = pod("p", vec![container("a", "", "")]);
    let s = memory_stats();
    let pods = [ActivePod::new(&p, Some(&s))];
    // (pods fresh, waiting for a cleanup, pressure) -> action
    for (fresh, waiting, pressure, want) in [
        (false, false, true, "reobserve"),
        (true, false, true, "evict"),
        (false, true, true, "wait"),
        (false, false, false, "nothing"),
    ] {
        let state = if waiting {
            waiting_on("v", 10)
        } else {
            State::default()
        };
        let given = state.clone();
        let o = if pressure {
            low_memory(11)
        } else {
            obs(Signal::MemoryAvailable, "4Gi", "8Gi", 11)
        };
        let input = Input {
            pods_fresh: fresh,
            ..Input::new(&o, &pods, secs(11))
        };
        let (next, d) = step(&config, state, &input);
        let what = match d.action {
            Action::Reobserve => {
                assert_eq!(next, given, "re-observing leaves the state as it was");
                "reobserve"
            }
            Action::Evict { .. } => "evict",
            Action::WaitForCleanup => "wait",
            Action::Nothing(_) => "nothing",
            ref other => panic!("{other:?}"),
        };
        assert_eq!(
            what, want,
            "fresh {fresh}, waiting {waiting}, pressure {pressure}"
        );
    }
}

/// SIGKILL before the orderly stop for hard memory thresholds only.
#[test]
fn kill_first_decisions() {
    let p = pod("p", vec![container("a", "", "")]);
    let s = PodStats {
        memory: Some(100 << 20),
        processes: Some(50),
        ..Default::default()
    };
    let pods = [ActivePod::new(&p, Some(&s))];
    let soft = |mut t: Threshold| {
        t.grace_period = secs(1);
        t
    };
    let pids = |at| obs(Signal::PidAvailable, "10", "1000", at);
    let allocatable = |at| obs(Signal::AllocatableMemoryAvailable, "500Mi", "8Gi", at);
    type Observe = fn(u64) -> Observations;
    let cases: [(Threshold, Observe, VictimStop); 4] = [
        (
            hard(Signal::MemoryAvailable, "1Gi"),
            low_memory,
            VictimStop::KillFirst,
        ),
        (
            hard(Signal::AllocatableMemoryAvailable, "1Gi"),
            allocatable,
            VictimStop::KillFirst,
        ),
        (
            soft(hard(Signal::MemoryAvailable, "1Gi")),
            low_memory,
            VictimStop::Orderly,
        ),
        (hard(Signal::PidAvailable, "100"), pids, VictimStop::Orderly),
    ];
    for (threshold, o, want) in cases {
        let signal = threshold.signal;
        let config = memory_config(threshold);
        // A soft threshold's grace period is met by a first observation a second earlier.
        let (state, _) = run(&config, State::default(), &o(9), &pods, secs(9));
        let (state, d) = run(&config, state, &o(10), &pods, secs(10));
        let Action::Evict { stop, .. } = d.action else {
            panic!("{signal}: {:?}", d.action);
        };
        assert_eq!(stop, want, "{signal}");
        assert!(state.throttled.is_none(), "{signal}");
    }
}

/// `throttleBeforeEvict`: the victim capped first with its own grace period while the node
/// has half the threshold left; a later step that finds the node below that floor while the
/// victim is still awaited kills it, once; a node already below the floor kills first.
#[test]
fn throttle_before_evict_caps_then_kills_below_the_floor() {
    let mut p = pod("p", vec![container("a", "", "")]);
    if let Some(spec) = p.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(20);
    }
    let s = PodStats {
        memory: Some(100 << 20),
        ..Default::default()
    };
    let pods = [ActivePod::new(&p, Some(&s))];
    let mut config = memory_config(hard(Signal::MemoryAvailable, "1Gi"));
    config.throttle_before_evict = vec![Signal::MemoryAvailable];
    config.max_pod_grace_period_seconds = 0;
    let available = |v: &str, at| obs(Signal::MemoryAvailable, v, "8Gi", at);
    // The victim is still awaited (not released) in the steps after its eviction.
    let awaited =
        |state, o: &Observations, at| step(&config, state, &Input::new(o, &pods, secs(at)));
    // 700Mi of a 1Gi threshold: above the 512Mi floor.
    let (state, d) = run(
        &config,
        State::default(),
        &available("700Mi", 10),
        &pods,
        secs(10),
    );
    let Action::Evict { stop, eviction } = &d.action else {
        panic!("{:?}", d.action);
    };
    assert_eq!(*stop, VictimStop::CapFirst { floor: 512 << 20 });
    assert_eq!(eviction.grace_period_seconds, 20, "the pod's own grace");
    assert_eq!(
        state.throttled.as_ref().map(|t| (&*t.uid, t.floor)),
        Some((&*eviction.uid, 512 << 20))
    );
    // Still stopping, the node above the floor: waited for.
    let (state, d) = awaited(state, &available("600Mi", 11), 11);
    assert_eq!(d.kill_throttled, None);
    assert_eq!(d.action, Action::WaitForCleanup);
    // Below the floor: killed now, and only once.
    let (state, d) = awaited(state, &available("400Mi", 12), 12);
    assert_eq!(d.kill_throttled.as_deref(), Some("uid-p"));
    assert!(state.throttled.is_none());
    let (_, d) = awaited(state, &available("300Mi", 13), 13);
    assert_eq!(d.kill_throttled, None);
    // Below the floor at the crossing: killed first.
    let (state, d) = run(
        &config,
        State::default(),
        &available("400Mi", 10),
        &pods,
        secs(10),
    );
    assert!(
        matches!(
            d.action,
            Action::Evict {
                stop: VictimStop::KillFirst,
                ..
            }
        ),
        "{:?}",
        d.action
    );
    assert!(state.throttled.is_none());
}

/// Disk signals reclaim node-level resources first (at most once per
/// [`NODE_RECLAIM_INTERVAL`]) and evict only if that did not resolve the pressure; the
/// conditions and the node event go with the reclaim.
#[test]
fn node_level_reclaim_decisions() {
    let config = memory_config(hard(Signal::NodeFsAvailable, "1Gi"));
    let p = pod("p", vec![container("a", "", "")]);
    let s = PodStats {
        ephemeral_storage: Some(1 << 30),
        ..Default::default()
    };
    let with_pod = [ActivePod::new(&p, Some(&s))];
    let low = |at| obs(Signal::NodeFsAvailable, "500Mi", "100Gi", at);
    let freed = obs(Signal::NodeFsAvailable, "10Gi", "100Gi", 10);
    // (pods, after the reclaim) -> action
    let cases: [(&[ActivePod<'_>], NodeReclaimed<'_>, &str); 4] = [
        (
            &with_pod,
            NodeReclaimed::Observed(&freed),
            "reclaimed enough",
        ),
        (&with_pod, NodeReclaimed::Observed(&low(10)), "evict"),
        (&with_pod, NodeReclaimed::Failed, "evict"),
        (&[], NodeReclaimed::Observed(&low(10)), "no pod"),
    ];
    for (pods, reclaimed, want) in cases {
        let o = low(10);
        let (state, d) = run(&config, State::default(), &o, pods, secs(10));
        assert_eq!(
            d.action,
            Action::ReclaimNodeLevel {
                signal: Signal::NodeFsAvailable,
                resource: Resource::EphemeralStorage
            }
        );
        assert_eq!(d.conditions, [NodeCondition::DiskPressure]);
        assert!(d.conditions_changed);
        assert_eq!(
            d.node_event.as_deref(),
            Some("Attempting to reclaim ephemeral-storage")
        );
        assert!(state.after_reclaim.is_some());
        let input = Input {
            node_reclaim: Some(reclaimed),
            ..Input::new(&o, pods, secs(10))
        };
        let (state, d) = step(&config, state, &input);
        assert!(state.after_reclaim.is_none());
        assert_eq!(
            d.node_event, None,
            "{want}: the event went with the reclaim"
        );
        assert!(!d.conditions_changed, "{want}");
        assert_eq!(d.conditions, [NodeCondition::DiskPressure], "{want}");
        match (want, &d.action) {
            ("reclaimed enough", Action::Nothing(Idle::ReclaimedEnough))
            | ("no pod", Action::Nothing(Idle::NoPodToEvict)) => {
                assert!(state.cleanup.is_none(), "{want}");
            }
            ("evict", Action::Evict { eviction, stop }) => {
                assert_eq!(*stop, VictimStop::Orderly, "disk is not killed first");
                assert_eq!(eviction.name, "p");
                assert_eq!(state.cleanup.as_ref().map(|w| w.since), Some(secs(10)));
            }
            (want, got) => panic!("{want}: {got:?}"),
        }
    }
    // Pacing: a step less than the interval after a reclaim evicts nobody for disk.
    let ms = Duration::from_millis;
    let (state, _) = run(&config, State::default(), &low(10), &[], secs(10));
    let (state, _) = step(
        &config,
        state,
        &Input {
            node_reclaim: Some(NodeReclaimed::Failed),
            ..Input::new(&low(10), &[], secs(10))
        },
    );
    let o = obs(Signal::NodeFsAvailable, "500Mi", "100Gi", 11);
    let (state, d) = run(&config, state, &o, &with_pod, secs(10) + ms(999));
    assert_eq!(d.action, Action::Nothing(Idle::ReclaimPaced));
    let o = obs(Signal::NodeFsAvailable, "500Mi", "100Gi", 12);
    let (state, d) = run(&config, state, &o, &with_pod, secs(11));
    assert!(matches!(d.action, Action::ReclaimNodeLevel { .. }));
    // A reclaim never reported back is dropped: the next step is a round of its own.
    let o = obs(Signal::NodeFsAvailable, "500Mi", "100Gi", 13);
    let (state, d) = run(&config, state, &o, &with_pod, secs(11) + ms(500));
    assert!(state.after_reclaim.is_none());
    assert_eq!(d.action, Action::Nothing(Idle::ReclaimPaced));
}

/// kubelet's `localStorageEviction` on walked figures: before any threshold and during a
/// cleanup wait, each pod asked once until it leaves.
#[test]
fn local_storage_decisions() {
    let yaml = |name: &str| {
        format!(
            "metadata: {{name: {name}, uid: {name}}}\nspec: {{volumes: [{{name: v, emptyDir: {{sizeLimit: 100Mi}}}}], containers: [{{name: c}}]}}"
        )
    };
    let a: Pod = serde_yaml_ng::from_str(&yaml("a")).unwrap();
    let b: Pod = serde_yaml_ng::from_str(&yaml("b")).unwrap();
    let under = PodStats {
        memory: Some(1 << 20),
        volumes: [("v".to_owned(), 1 << 20)].into(),
        ..Default::default()
    };
    let over = PodStats {
        memory: Some(1 << 20),
        volumes: [("v".to_owned(), 200 << 20)].into(),
        ..Default::default()
    };
    let pods = [
        ActivePod::new(&b, Some(&under)),
        ActivePod::new(&a, Some(&over)),
    ];
    let config = memory_config(hard(Signal::MemoryAvailable, "1Gi"));
    let gone = |uid: &str| uid != "a";
    // (state, walked, pressure, a active) -> pods evicted for local storage
    for (state, walked, pressure, a_active, want) in [
        (State::default(), true, false, true, vec![(1, "a")]),
        (State::default(), false, false, true, vec![]),
        (State::default(), true, true, true, vec![(1, "a")]),
        (waiting_on("v", 10), true, true, true, vec![(1, "a")]),
        (
            State {
                local_storage_evicted: ["a".to_owned()].into(),
                ..State::default()
            },
            true,
            false,
            true,
            vec![],
        ),
        // It left and came back: asked again.
        (
            State {
                local_storage_evicted: ["a".to_owned()].into(),
                ..State::default()
            },
            true,
            false,
            false,
            vec![(1, "a")],
        ),
    ] {
        let o = if pressure {
            low_memory(11)
        } else {
            obs(Signal::MemoryAvailable, "4Gi", "8Gi", 11)
        };
        let input = Input {
            local_storage_walked: walked,
            is_active: if a_active { &|_| true } else { &gone },
            ..Input::new(&o, &pods, secs(11))
        };
        let case = format!("walked {walked}, pressure {pressure}, a active {a_active}");
        let (next, d) = step(&config, state, &input);
        let got: Vec<(usize, &str)> = match &d.action {
            Action::EvictLocalStorage(e) => e.iter().map(|e| (e.index, e.uid.as_str())).collect(),
            _ => Vec::new(),
        };
        assert_eq!(got, want, "{case}");
        if !want.is_empty() {
            assert!(next.local_storage_evicted.contains("a"), "{case}");
            assert_eq!(
                d.node_event.is_some(),
                pressure,
                "{case}: the event as before"
            );
        }
    }
}
