use k8s_cri::v1 as cri;
use tokio::sync::mpsc;

use super::*;
use crate::signal::Signal;

#[test]
fn imagefs_is_the_first_existing_absolute_mountpoint() {
    let dir = tempfile::tempdir().unwrap();
    let fs = |m: &str| cri::FilesystemUsage {
        fs_id: Some(cri::FilesystemIdentifier {
            mountpoint: m.to_owned(),
        }),
        ..Default::default()
    };
    let here = dir.path().display().to_string();
    let answer = [
        fs("relative/path"),
        fs("/does/not/exist/enforcer"),
        fs(&here),
    ];
    assert_eq!(imagefs_mountpoint(&answer), Some(dir.path().to_path_buf()));
    assert_eq!(imagefs_mountpoint(&answer[..2]), None);
    assert_eq!(imagefs_mountpoint(&[]), None);
}

/// A reclaim record right after a step waits for the floor, gathering what comes; an
/// urgent signal arriving during that wait ends it at once and leads the step (it did
/// not wait out the floor behind the record before).
#[tokio::test(start_paused = true)]
async fn an_urgent_signal_cuts_the_floor_short() {
    use crate::signal::{SignalKind as K, SourceKind as S};
    use tokio::time::{Duration, Instant};
    let (tx, mut rx) = mpsc::channel(8);
    let start = Instant::now();
    let floor = start + MIN_STEP_INTERVAL;
    let sender = tokio::spawn(async move {
        tx.send(Signal::new(K::Fork, S::Ebpf)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        tx.send(Signal::new(K::MemoryEvents, S::Psi)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(tx);
    });
    let mut taken = Vec::new();
    let urgent = gather_burst(
        &mut rx,
        false,
        floor,
        std::future::pending(),
        |s, before| {
            taken.push((s.kind, before));
        },
    )
    .await;
    let waited = start.elapsed();
    assert!(urgent, "the burst turned urgent");
    assert_eq!(
        taken,
        vec![(K::Fork, false), (K::MemoryEvents, false)],
        "both taken, the crossing with no urgent signal before it"
    );
    // (tokio's timers tick in milliseconds: the crossing came 1 ms in, the floor is 2.)
    assert_eq!(waited, Duration::from_millis(1), "stepped on the crossing");
    assert!(waited < MIN_STEP_INTERVAL, "before the floor");
    sender.abort();
}

/// The v1 tripwire firing while a reclaim record waits for the floor ends the wait at once,
/// as an urgent signal from the channel does (it is waited on beside the channel).
#[tokio::test(start_paused = true)]
async fn the_tripwire_cuts_the_floor_short() {
    use crate::signal::{SignalKind as K, SourceKind as S};
    use tokio::time::{Duration, Instant};
    let (tx, mut rx) = mpsc::channel(8);
    tx.send(Signal::new(K::MemcgReclaim, S::Ebpf))
        .await
        .unwrap();
    let start = Instant::now();
    let wire = async {
        tokio::time::sleep(Duration::from_millis(1)).await;
        Signal::new(K::MemoryThreshold, S::Eventfd)
    };
    let mut taken = Vec::new();
    let urgent = gather_burst(
        &mut rx,
        false,
        start + MIN_STEP_INTERVAL,
        wire,
        |s, before| {
            taken.push((s.kind, before));
        },
    )
    .await;
    assert!(urgent);
    assert_eq!(
        taken,
        vec![(K::MemcgReclaim, false), (K::MemoryThreshold, false)]
    );
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(1),
        "stepped on the tripwire"
    );
    drop(tx);
}

/// With no urgent signal the burst ends at the floor, not before; an urgent first
/// signal does not wait at all; a closed channel ends the wait.
#[tokio::test(start_paused = true)]
async fn a_burst_of_records_waits_for_the_floor() {
    use crate::signal::{SignalKind as K, SourceKind as S};
    use tokio::time::Instant;
    let (tx, mut rx) = mpsc::channel(8);
    tx.send(Signal::new(K::MemcgReclaim, S::Ebpf))
        .await
        .unwrap();
    let start = Instant::now();
    let mut n = 0;
    let urgent = gather_burst(
        &mut rx,
        false,
        start + MIN_STEP_INTERVAL,
        std::future::pending(),
        |_, _| n += 1,
    )
    .await;
    assert!(!urgent);
    assert_eq!(n, 1, "the queued record was gathered");
    assert_eq!(
        start.elapsed(),
        MIN_STEP_INTERVAL,
        "and the floor waited out"
    );

    let start = Instant::now();
    let urgent = gather_burst(
        &mut rx,
        true,
        start + MIN_STEP_INTERVAL,
        std::future::pending(),
        |_, _| n += 1,
    )
    .await;
    assert!(urgent);
    assert_eq!(start.elapsed(), Duration::ZERO, "urgent: no wait");

    drop(tx);
    let urgent = gather_burst(
        &mut rx,
        false,
        start + MIN_STEP_INTERVAL,
        std::future::pending(),
        |_, _| n += 1,
    )
    .await;
    assert!(!urgent);
    assert_eq!(start.elapsed(), Duration::ZERO, "closed: no wait");
    assert_eq!(n, 1);
}

/// Crossings step at once (a v1 threshold eventfd, a v2 `memory.events` count moving,
/// an OOM kill); reclaim, fork and PSI records wake the manager but are coalesced.
#[test]
fn crossings_are_urgent_bursts_are_coalesced() {
    use crate::signal::{SignalKind as K, SourceKind as S};
    for (kind, source, urgent) in [
        (K::MemoryThreshold, S::Eventfd, true),
        (K::MemoryEvents, S::Psi, true),
        (K::OomKill, S::Ebpf, true),
        (K::MemcgReclaim, S::Ebpf, false),
        (K::DirectReclaim, S::Ebpf, false),
        (K::MemoryPressure, S::Psi, false),
        (K::Fork, S::Ebpf, false),
    ] {
        let s = Signal::new(kind, source);
        assert!(is_pressure(&s), "{kind:?} wakes the manager");
        assert_eq!(is_urgent(&s), urgent, "{kind:?}");
    }
}
