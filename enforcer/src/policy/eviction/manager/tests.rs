use k8s_openapi::api::core::v1::Toleration;

use super::*;
use crate::{
    policy::{
        eviction::{Observation, ThresholdValue},
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
        }],
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
