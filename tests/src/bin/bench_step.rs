//! `cargo xtask bench step`: one eviction-manager step including its I/O, with 110 running
//! pods (kubelet's default `maxPods`), on real cgroups and real log directories.
//!
//! - "before": what every step did until the stats collector existed, inline on the step's
//!   thread: the node-level observations, every pod's cgroup files and the walk of every pod's
//!   log directory, then the decision core's step.
//! - "signal step": what a signal-driven step does now: ask the collector thread for the node
//!   and the one pod the signal names, then the decision core's step on the snapshot.
//! - "housekeeping step": the tick's full refresh, through the collector thread.
//!
//! The variants run interleaved, in one run; figures are medians and ratios to "before".

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use enforcer::{
    config::ConfigArgs,
    pods::ActiveEntry,
    policy::eviction::{
        State,
        manager::{ActivePod, Input, step},
    },
    stats::{Collector, NodeSnapshot, PodScope, PodTarget, Refresh, StatsCollector},
};
use enforcer_tests::{TestCgroup, layout, require_root, unique_name};

const PODS: usize = 110;
const LOG_FILES: usize = 4;
const LOG_BYTES: usize = 64 * 1024;

fn pct(v: &[Duration], q: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(((v.len().saturating_sub(1)) as f64 * q).round() as usize)
        .copied()
        .unwrap_or_default()
}

fn decide(
    config: &enforcer::config::Config,
    snapshot: &NodeSnapshot,
    active: &BTreeMap<String, ActiveEntry>,
    now: Duration,
) -> usize {
    let pods: Vec<ActivePod<'_>> = snapshot
        .pods
        .iter()
        .filter_map(|(uid, s)| {
            let e = active.get(uid)?;
            Some(ActivePod::new(&e.pod, s.stats.as_ref()).with_facts(&e.facts))
        })
        .collect();
    let (_, d) = step(
        &config.eviction,
        State::default(),
        &Input::new(&snapshot.observations, &pods, now),
    );
    usize::from(d.eviction().is_some()) + pods.len()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    require_root();
    let rounds = enforcer_tests::arg_u64("--rounds", 200);
    // `--crossing-only`: only the crossing's read and decision (to profile them alone, e.g.
    // under `perf record`); the other rows stay empty.
    let crossing_only = std::env::args().any(|a| a == "--crossing-only");
    // `--files`: with `--crossing-only`, the crossing reads each pod's usage file (not the
    // memory cgroup iterator).
    let files_only = std::env::args().any(|a| a == "--files");
    // `--cold MIB`: with `--crossing-only`, before each round write MIB MiB of memory and
    // sleep a millisecond, as a growing pod does to the caches while the daemon waits for a
    // crossing (0: warm rounds, one after another).
    let cold_mib = usize::try_from(enforcer_tests::arg_u64("--cold", 0))?;
    let mut thrash = vec![0u8; cold_mib << 20];
    let l = layout();
    let (mem, _) = l.controller("memory").context("memory controller")?;
    let root = format!("/{}", unique_name("bench-step"));
    let kubepods_rel = format!("{root}/kubepods");
    let kubepods = TestCgroup::create(mem, &kubepods_rel);
    let logs = tempfile::tempdir()?;
    let mut cgroups = Vec::new();
    let mut active = BTreeMap::new();
    let mut targets = Vec::new();
    for i in 0..PODS {
        let uid = format!("{i:04}-bench");
        let pod_rel = format!("{kubepods_rel}/pod{uid}");
        cgroups.push(TestCgroup::create(mem, &pod_rel));
        cgroups.push(TestCgroup::create(mem, &format!("{pod_rel}/c{i}")));
        let dir = logs.path().join("pods").join(&uid).join("app");
        std::fs::create_dir_all(&dir)?;
        for f in 0..LOG_FILES {
            std::fs::write(dir.join(format!("{f}.log")), vec![b'x'; LOG_BYTES])?;
        }
        active.insert(
            uid.clone(),
            ActiveEntry::new(
                Arc::new(enforcer_tests::besteffort_pod(&format!("p-{uid}"), &uid)),
                pod_rel.clone(),
            ),
        );
        targets.push(PodTarget {
            uid,
            cgroup: pod_rel,
            containers: vec![("app".to_owned(), format!("c{i}"))],
        });
    }
    let config = enforcer::config::load(&ConfigArgs {
        eviction_hard: vec!["memory.available<100Mi".to_owned()],
        http_address: Some("127.0.0.1:0".into()),
        ..ConfigArgs::default()
    })
    .context("configuration")?
    .config;
    let observer = enforcer_tests::machine_observer(&kubepods_rel, logs.path());
    let mut inline = Collector::new(observer.clone());
    let mut walker = Collector::new(observer.clone()).with_memcg_iterator();
    let stats = StatsCollector::spawn(observer)?;
    let signal = Refresh {
        pods: PodScope::Named(vec![targets[PODS / 2].uid.clone()]),
        logs: false,
    };
    let start = Instant::now();
    // Warm up both paths (first reads of every file).
    inline.refresh(&Refresh::full(), &targets, start.elapsed())?;
    walker.refresh(&Refresh::full(), &targets, start.elapsed())?;
    anyhow::ensure!(
        walker.wait_memcg_iterator(),
        "the memory cgroup iterator did not load (see the log)"
    );
    stats
        .refresh(Refresh::full(), targets.clone().into(), start.elapsed())
        .await?;
    let (mut before, mut after, mut tick) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cross_read, mut cross_decide, mut node_mem) = (Vec::new(), Vec::new(), Vec::new());
    let mut cross_walk = Vec::new();
    let crossing = Refresh {
        pods: PodScope::Usage,
        logs: false,
    };
    let mut sink = 0usize;
    for _ in 0..rounds {
        if crossing_only {
            let c = if files_only { &mut inline } else { &mut walker };
            if cold_mib > 0 {
                for b in thrash.iter_mut().step_by(64) {
                    *b = b.wrapping_add(1);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let t = Instant::now();
            let s = c.refresh(&crossing, &targets, start.elapsed())?;
            cross_read.push(t.elapsed());
            let t = Instant::now();
            sink += decide(&config, &s, &active, start.elapsed());
            cross_decide.push(t.elapsed());
            continue;
        }
        let t = Instant::now();
        let s = inline.refresh(&Refresh::full(), &targets, start.elapsed())?;
        sink += decide(&config, &s, &active, start.elapsed());
        before.push(t.elapsed());

        let t = Instant::now();
        let s = stats
            .refresh(signal.clone(), targets.clone().into(), start.elapsed())
            .await?;
        sink += decide(&config, &s, &active, start.elapsed());
        after.push(t.elapsed());

        let t = Instant::now();
        let s = stats
            .refresh(Refresh::full(), targets.clone().into(), start.elapsed())
            .await?;
        sink += decide(&config, &s, &active, start.elapsed());
        tick.push(t.elapsed());

        // A crossing's step (the crossing thread's): every pod's usage counter, inline.
        let t = Instant::now();
        let s = inline.refresh(&crossing, &targets, start.elapsed())?;
        cross_read.push(t.elapsed());
        let t = Instant::now();
        sink += decide(&config, &s, &active, start.elapsed());
        cross_decide.push(t.elapsed());

        // The same through the memory cgroup iterator (one walk for every pod).
        let t = Instant::now();
        let w = walker.refresh(&crossing, &targets, start.elapsed())?;
        cross_walk.push(t.elapsed());
        sink += w.pods.len();

        // Of which the node's memory observations.
        let t = Instant::now();
        sink += inline.observer.observe_memory(start.elapsed())?.len();
        node_mem.push(t.elapsed());
    }
    // NaN ratios under `--crossing-only` (no "before" row).
    let base = Some(pct(&before, 0.5).as_secs_f64())
        .filter(|b| *b > 0.0)
        .unwrap_or(f64::NAN);
    println!(
        "\n### One eviction step with its I/O, {PODS} pods ({LOG_FILES} x {} KiB logs each), {rounds} rounds, interleaved\n",
        LOG_BYTES / 1024
    );
    println!("| step | p50 | p90 | p50 vs before |");
    println!("|---|---|---|---|");
    for (name, v) in [
        (
            "before: every pod's cgroup files and log walk, inline",
            &before,
        ),
        (
            "signal step: node + the named pod, collector thread",
            &after,
        ),
        ("housekeeping step: full refresh, collector thread", &tick),
        (
            "crossing step, its read: every pod's usage counter, inline",
            &cross_read,
        ),
        (
            "crossing step, its read through one memory cgroup iterator walk, inline",
            &cross_walk,
        ),
        (
            "crossing step, its decision (the decision core on that snapshot)",
            &cross_decide,
        ),
        (
            "of a crossing's read, the node's memory observations",
            &node_mem,
        ),
    ] {
        println!(
            "| {name} | {:.1} us | {:.1} us | {:.3}x |",
            pct(v, 0.5).as_secs_f64() * 1e6,
            pct(v, 0.9).as_secs_f64() * 1e6,
            pct(v, 0.5).as_secs_f64() / base
        );
    }
    sink += usize::from(thrash.iter().step_by(4096).fold(0u8, |a, b| a ^ b));
    eprintln!("({sink} pods decided on)");
    drop(stats);
    for mut c in cgroups.into_iter().rev() {
        c.remove();
    }
    drop(kubepods);
    Ok(())
}
