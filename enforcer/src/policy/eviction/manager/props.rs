use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;

use super::{tests::run, *};
use crate::{
    policy::{
        eviction::{Observation, PodFacts, PodStats, ThresholdValue, rank::first_eligible},
        resources::test_pods::{container, pod},
    },
    quantity::Quantity,
};

/// (priority, critical, memory request MiB, usage MiB or no stats)
fn pods_strategy() -> impl Strategy<Value = Vec<(i32, bool, u32, Option<u32>)>> {
    prop::collection::vec(
        (
            -5i32..5,
            any::<bool>(),
            0u32..64,
            prop::option::of(0u32..128),
        ),
        0..24,
    )
}

fn build(spec: &[(i32, bool, u32, Option<u32>)]) -> (Vec<Pod>, Vec<Option<PodStats>>) {
    let pods = spec
        .iter()
        .enumerate()
        .map(|(i, (prio, critical, req, _))| {
            let mut p = pod(
                &format!("p{i}"),
                vec![container("c", &format!("memory={req}Mi"), "")],
            );
            p.spec.as_mut().unwrap().priority = Some(if *critical { 2_000_000_000 } else { *prio });
            p
        })
        .collect();
    let stats = spec
        .iter()
        .map(|(.., usage)| {
            usage.map(|u| PodStats {
                memory: Some(i64::from(u) << 20),
                processes: Some(i64::from(u)),
                ..Default::default()
            })
        })
        .collect();
    (pods, stats)
}

proptest! {
    #[test]
    fn ranking_is_input_order_independent(spec in pods_strategy(), seed in any::<u64>(), pids in any::<bool>()) {
        let (pods, stats) = build(&spec);
        let signal = if pids { Signal::PidAvailable } else { Signal::MemoryAvailable };
        let active: Vec<ActivePod<'_>> = pods.iter().zip(&stats).map(|(p, s)| ActivePod::new(p, s.as_ref())).collect();
        let names = |a: &[ActivePod<'_>]| -> Vec<String> {
            crate::policy::eviction::rank::rank(signal, a).into_iter().map(|i| resources::pod_name(a[i].pod).to_owned()).collect()
        };
        let first = names(&active);
        // A deterministic shuffle from the seed.
        let mut shuffled = active.clone();
        let mut x = seed | 1;
        for i in (1..shuffled.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            shuffled.swap(i, usize::try_from(x % (i as u64 + 1)).unwrap());
        }
        prop_assert_eq!(&first, &names(&shuffled));
        prop_assert_eq!(first.len(), active.len());
        // Facts kept per pod rank exactly as facts read from the spec.
        let facts: Vec<PodFacts> = pods.iter().map(PodFacts::of).collect();
        let kept: Vec<ActivePod<'_>> = active.iter().zip(&facts).map(|(a, f)| a.with_facts(f)).collect();
        prop_assert_eq!(&first, &names(&kept));
    }

    #[test]
    fn first_eligible_is_the_first_of_the_ranking(spec in pods_strategy(), pids in any::<bool>()) {
        let (pods, stats) = build(&spec);
        let signal = if pids { Signal::PidAvailable } else { Signal::MemoryAvailable };
        let active: Vec<ActivePod<'_>> = pods.iter().zip(&stats).map(|(p, s)| ActivePod::new(p, s.as_ref())).collect();
        let ranked = crate::policy::eviction::rank::rank(signal, &active);
        let eligible = |a: &ActivePod<'_>| !resources::is_critical(a.pod);
        let at = ranked.iter().position(|&i| eligible(&active[i]));
        let (first, skipped) = first_eligible(signal, &active, eligible);
        prop_assert_eq!(first, at.map(|p| ranked[p]));
        prop_assert_eq!(&skipped[..], &ranked[..at.unwrap_or(ranked.len())]);
    }

    #[test]
    fn step_never_evicts_critical_nor_more_than_one(
        spec in pods_strategy(),
        avail in prop::collection::vec(0i64..4096, 1..6),
    ) {
        let (pods, stats) = build(&spec);
        let active: Vec<ActivePod<'_>> = pods.iter().zip(&stats).map(|(p, s)| ActivePod::new(p, s.as_ref())).collect();
        let config = EvictionConfig {
            thresholds: vec![
                Threshold { signal: Signal::MemoryAvailable, value: ThresholdValue::Quantity(Quantity::from_int(1 << 30, crate::quantity::Format::BinarySI)), grace_period: Duration::ZERO, min_reclaim: None },
                Threshold { signal: Signal::MemoryAvailable, value: ThresholdValue::Percentage(0.5), grace_period: Duration::from_secs(20), min_reclaim: None },
            ],
            max_pod_grace_period_seconds: 10,
            pressure_transition_period: Duration::from_secs(30),
            throttle_before_evict: Vec::new(),
        };
        let mut state = State::default();
        for (i, a) in avail.iter().enumerate() {
            let now = Duration::from_secs(10 * i as u64);
            let obs: Observations = [(Signal::MemoryAvailable, Observation { available: a << 20, capacity: 4 << 30, time: Some(now) })].into();
            let (next, d) = run(&config, state, &obs, &active, now);
            state = next;
            if let Some(e) = d.eviction() {
                prop_assert!(!resources::is_critical(active[e.index].pod));
                prop_assert!(e.grace_period_seconds >= 1);
            }
            let non_critical = active.iter().filter(|a| !resources::is_critical(a.pod)).count();
            if d.reclaim.is_some() && non_critical > 0 {
                prop_assert!(d.eviction().is_some());
            }
        }
    }
}
