//! Policy benchmarks: rank 10,000 pods; one eviction step over 10,000 pods; admit 1,000 pods
//! one after another. Goal: each under 2 ms.

use std::{collections::BTreeMap, hint::black_box, time::Duration};

use criterion::{Criterion, criterion_group, criterion_main};
use enforcer::{
    policy::{
        admission::{Admitter, Node, SecurityPolicy},
        eviction::{
            ActivePod, EvictionConfig, Input, Observation, Observations, PodStats, Signal, State,
            Threshold, ThresholdValue,
            rank::{PodFacts, rank},
            step,
        },
    },
    quantity::Quantity,
};
use k8s_openapi::{
    api::core::v1::{Container, Pod, PodSpec, ResourceRequirements},
    apimachinery::pkg::{api::resource::Quantity as K8sQuantity, apis::meta::v1::ObjectMeta},
};

fn pod(i: usize) -> Pod {
    let requests: BTreeMap<String, K8sQuantity> = [
        ("cpu".to_owned(), K8sQuantity("10m".into())),
        (
            "memory".to_owned(),
            K8sQuantity(format!("{}Mi", 10 + i % 50)),
        ),
    ]
    .into();
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod-{i}")),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{i}")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            priority: Some(i32::try_from(i % 7).unwrap_or(0)),
            containers: vec![Container {
                name: "app".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(requests),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

fn stats(i: usize) -> PodStats {
    let mem = i64::try_from((i * 7919) % 100).unwrap_or(0) << 20;
    PodStats {
        memory: Some(mem),
        ephemeral_storage: Some(mem),
        processes: Some(mem >> 20),
        ..Default::default()
    }
}

fn benches(c: &mut Criterion) {
    let pods: Vec<Pod> = (0..10_000).map(pod).collect();
    let stats: Vec<PodStats> = (0..10_000).map(stats).collect();
    // The daemon keeps each pod's facts (priority, critical, requests) from its admission;
    // ranking with facts parsed from the spec at every step is the baseline.
    let facts: Vec<PodFacts> = pods.iter().map(PodFacts::of).collect();
    let active: Vec<ActivePod<'_>> = pods
        .iter()
        .zip(&stats)
        .zip(&facts)
        .map(|((pod, s), f)| ActivePod::new(pod, Some(s)).with_facts(f))
        .collect();
    let parsing: Vec<ActivePod<'_>> = pods
        .iter()
        .zip(&stats)
        .map(|(pod, s)| ActivePod::new(pod, Some(s)))
        .collect();
    c.bench_function("rank 10000 pods (memory)", |b| {
        b.iter(|| black_box(rank(Signal::MemoryAvailable, black_box(&active))))
    });
    c.bench_function("rank 10000 pods (memory), specs parsed each time", |b| {
        b.iter(|| black_box(rank(Signal::MemoryAvailable, black_box(&parsing))))
    });

    let config = EvictionConfig {
        thresholds: vec![Threshold {
            signal: Signal::MemoryAvailable,
            value: ThresholdValue::Quantity(Quantity::from_int(
                1 << 30,
                enforcer::quantity::Format::BinarySI,
            )),
            grace_period: Duration::ZERO,
            min_reclaim: None,
        }],
        max_pod_grace_period_seconds: 30,
        pressure_transition_period: Duration::from_secs(300),
        throttle_before_evict: Vec::new(),
    };
    let observations: Observations = [(
        Signal::MemoryAvailable,
        Observation {
            available: 500 << 20,
            capacity: 64 << 30,
            time: Some(Duration::from_secs(10)),
        },
    )]
    .into();
    let state = State::default();
    c.bench_function("eviction step over 10000 pods", |b| {
        b.iter(|| {
            black_box(step(
                &config,
                state.clone(),
                &Input::new(
                    black_box(&observations),
                    black_box(&active),
                    Duration::from_secs(10),
                ),
            ))
        });
    });

    let node = Node {
        name: "node".into(),
        allocatable: [
            ("cpu".to_owned(), Quantity::parse("64").unwrap_or_default()),
            (
                "memory".to_owned(),
                Quantity::parse("256Gi").unwrap_or_default(),
            ),
            (
                "pods".to_owned(),
                Quantity::parse("2000").unwrap_or_default(),
            ),
        ]
        .into(),
        ..Default::default()
    };
    let incoming: Vec<Pod> = (0..1000).map(pod).collect();
    c.bench_function("admit 1000 pods one after another", |b| {
        b.iter(|| {
            let mut admitter = Admitter::new(node.clone(), SecurityPolicy::default(), []);
            for p in &incoming {
                if admitter.admit(p, &[]).admitted {
                    admitter.add(p);
                }
            }
            black_box(admitter)
        });
    });
}

criterion_group!(policy, benches);
criterion_main!(policy);
