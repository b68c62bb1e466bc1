use super::*;
use crate::{
    cgroup::{CgroupLayout, V1Mount},
    policy::eviction::Signal,
};

/// A v1-shaped memory hierarchy in a temporary directory: enough for the reading logic.
fn fake_node() -> (tempfile::TempDir, NodeObserver) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mem = dir.path().join("memory");
    let stat = |p: &std::path::Path, usage: i64| {
        std::fs::create_dir_all(p).expect("mkdir");
        std::fs::write(p.join("memory.usage_in_bytes"), usage.to_string()).expect("usage");
        std::fs::write(p.join("memory.stat"), "total_inactive_file 0\n").expect("stat");
    };
    stat(&mem, 1 << 30);
    stat(&mem.join("kubepods"), 1 << 29);
    stat(&mem.join("kubepods/poda"), 1 << 20);
    stat(&mem.join("kubepods/podb"), 2 << 20);
    let layout = CgroupLayout {
        v1: vec![V1Mount {
            mount: mem.clone(),
            controllers: vec!["memory".to_owned()],
            hierarchy_id: Some(1),
        }],
        ..CgroupLayout::default()
    };
    let observer = NodeObserver {
        layout,
        kubepods: "/kubepods".to_owned(),
        memory_capacity: 2 << 30,
        capacity_override: false,
        kubepods_memory_limit: 1 << 30,
        nodefs: dir.path().to_path_buf(),
        imagefs: None,
        pid_capacity: Some(1000),
    };
    (dir, observer)
}

fn target(uid: &str) -> PodTarget {
    PodTarget {
        uid: uid.to_owned(),
        cgroup: format!("/kubepods/pod{uid}"),
        containers: Vec::new(),
    }
}

/// A crossing's refresh: every pod's usage through the descriptor its first full read
/// opened, less that read's inactive file pages; the node's memory re-read, its other
/// observations carried over with their time; a pod never read in full is read in full.
#[test]
fn a_crossing_reads_each_pods_usage_through_its_open_file() {
    let (dir, observer) = fake_node();
    let mem = dir.path().join("memory/kubepods");
    std::fs::write(mem.join("poda/memory.stat"), "total_inactive_file 4096\n").expect("stat");
    let mut c = Collector::new(observer);
    let s = c
        .refresh(&Refresh::full(), &[target("a")], Duration::from_secs(1))
        .expect("refresh");
    assert_eq!(
        s.pods["a"].stats.as_ref().and_then(|s| s.memory),
        Some((1 << 20) - 4096)
    );
    // Pod a grows; its memory.stat says nothing new (not read at a crossing).
    std::fs::write(
        mem.join("poda/memory.usage_in_bytes"),
        (6 << 20).to_string(),
    )
    .expect("usage");
    std::fs::write(mem.join("poda/memory.stat"), "total_inactive_file 999999\n").expect("stat");
    let crossing = Refresh {
        pods: PodScope::Usage,
        logs: false,
    };
    let s = c
        .refresh(
            &crossing,
            &[target("a"), target("b")],
            Duration::from_secs(2),
        )
        .expect("refresh");
    assert_eq!(
        s.pods["a"].stats.as_ref().and_then(|s| s.memory),
        Some((6 << 20) - 4096),
        "the fresh usage less the last full read's inactive pages"
    );
    assert_eq!(s.pods["a"].memory_at, Duration::from_secs(2));
    assert_eq!(
        s.pods["b"].stats.as_ref().and_then(|s| s.memory),
        Some(2 << 20),
        "a pod never read in full is read in full"
    );
    let times = |sig: Signal| s.observations.get(&sig).and_then(|o| o.time);
    assert_eq!(times(Signal::MemoryAvailable), Some(Duration::from_secs(2)));
    assert_eq!(times(Signal::PidAvailable), Some(Duration::from_secs(1)));
    assert_eq!(times(Signal::NodeFsAvailable), Some(Duration::from_secs(1)));
}

/// A crossing steps along its targets and the last samples in uid order and finds them
/// out of order too; it walks no pod's directory, not even one never walked (the next
/// full refresh does).
#[test]
fn a_crossing_finds_its_pods_in_any_order_and_walks_nothing() {
    let (dir, observer) = fake_node();
    let mut c = Collector::new(observer);
    let sorted = [target("a"), target("b")];
    c.refresh(&Refresh::full(), &sorted, Duration::from_secs(1))
        .expect("refresh");
    // Pod a's log directory appears after its first walk found none.
    let logs = dir.path().join("pods/a/c");
    std::fs::create_dir_all(&logs).expect("mkdir");
    std::fs::write(logs.join("0.log"), vec![b'x'; 8192]).expect("log");
    let mem = dir.path().join("memory/kubepods");
    std::fs::write(mem.join("poda/memory.usage_in_bytes"), "3145728").expect("usage");
    std::fs::write(mem.join("podb/memory.usage_in_bytes"), "5242880").expect("usage");
    let crossing = Refresh {
        pods: PodScope::Usage,
        logs: false,
    };
    let reversed = [target("b"), target("a")];
    for (secs, targets) in [(2, &sorted), (3, &reversed)] {
        let now = Duration::from_secs(secs);
        let s = c.refresh(&crossing, targets, now).expect("refresh");
        let memory = |uid: &str| s.pods[uid].stats.as_ref().and_then(|s| s.memory);
        assert_eq!((memory("a"), memory("b")), (Some(3 << 20), Some(5 << 20)));
        assert!(s.pods.values().all(|p| p.memory_at == now), "{s:?}");
        assert_eq!(s.pods["a"].logs_at, None, "a crossing walks no directory");
    }
    let s = c
        .refresh(&Refresh::full(), &sorted, Duration::from_secs(4))
        .expect("refresh");
    assert_eq!(s.pods["a"].logs_at, Some(Duration::from_secs(4)));
}

#[test]
fn a_sorted_cursor_finds_keys_in_order_out_of_order_and_absent() {
    let map: BTreeMap<String, u32> = [("a", 1), ("c", 3), ("e", 5)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    let mut cursor = SortedCursor::new(&map);
    let found: Vec<Option<u32>> = ["a", "b", "e", "c", "f", "a"]
        .into_iter()
        .map(|k| cursor.find(k).copied())
        .collect();
    assert_eq!(found, [Some(1), None, Some(5), Some(3), None, Some(1)]);
}

#[test]
fn a_refresh_reads_only_what_it_is_asked_for() {
    let (dir, observer) = fake_node();
    let mut c = Collector::new(observer);
    let targets = [target("a"), target("b")];
    let s = c
        .refresh(&Refresh::full(), &targets, Duration::from_secs(1))
        .expect("refresh");
    assert_eq!(
        s.pods["a"].stats.as_ref().and_then(|s| s.memory),
        Some(1 << 20)
    );
    assert_eq!(s.pods["a"].memory_at, Duration::from_secs(1));
    // Pod b grows; a signal names pod a only: b keeps its old figure and time.
    let b = dir
        .path()
        .join("memory/kubepods/podb/memory.usage_in_bytes");
    std::fs::write(&b, (8 << 20).to_string()).expect("write");
    let s = c
        .refresh(
            &Refresh {
                pods: PodScope::Named(vec!["a".to_owned()]),
                logs: false,
            },
            &targets,
            Duration::from_secs(2),
        )
        .expect("refresh");
    assert_eq!(s.pods["a"].memory_at, Duration::from_secs(2));
    assert_eq!(s.pods["b"].memory_at, Duration::from_secs(1));
    assert_eq!(
        s.pods["b"].stats.as_ref().and_then(|s| s.memory),
        Some(2 << 20)
    );
    // Node-level figures are always re-read.
    assert!(
        s.observations
            .values()
            .all(|o| o.time == Some(Duration::from_secs(2)))
    );
    // Before an eviction every pod is re-read.
    let s = c
        .refresh(
            &Refresh {
                pods: PodScope::All,
                logs: false,
            },
            &targets,
            Duration::from_secs(3),
        )
        .expect("refresh");
    assert_eq!(
        s.pods["b"].stats.as_ref().and_then(|s| s.memory),
        Some(8 << 20)
    );
    // A pod that left is dropped; a new one is read even when not named.
    let s = c
        .refresh(
            &Refresh {
                pods: PodScope::New,
                logs: false,
            },
            &[target("b"), target("c")],
            Duration::from_secs(4),
        )
        .expect("refresh");
    assert!(!s.pods.contains_key("a"));
    assert_eq!(s.pods["c"].stats, None, "pod c has no cgroup");
    assert_eq!(s.pods["c"].memory_at, Duration::from_secs(4));
}

#[test]
fn log_usage_is_carried_over_between_walks() {
    let (dir, observer) = fake_node();
    let logs = dir.path().join("pods/a/c");
    std::fs::create_dir_all(&logs).expect("mkdir");
    std::fs::write(logs.join("0.log"), vec![b'x'; 64 * 1024]).expect("log");
    let mut c = Collector::new(observer);
    let mut t = target("a");
    t.containers = vec![("c".to_owned(), "cid".to_owned())];
    std::fs::create_dir_all(dir.path().join("memory/kubepods/poda/cid")).expect("mkdir");
    let s = c
        .refresh(
            &Refresh::full(),
            std::slice::from_ref(&t),
            Duration::from_secs(1),
        )
        .expect("refresh");
    let used = s.pods["a"].stats.as_ref().and_then(|s| s.ephemeral_storage);
    assert!(used.is_some_and(|u| u >= 64 * 1024), "{used:?}");
    let s = c
        .refresh(
            &Refresh {
                pods: PodScope::All,
                logs: false,
            },
            std::slice::from_ref(&t),
            Duration::from_secs(2),
        )
        .expect("refresh");
    assert_eq!(
        s.pods["a"].stats.as_ref().and_then(|s| s.ephemeral_storage),
        used
    );
    assert_eq!(s.pods["a"].logs_at, Some(Duration::from_secs(1)));
    assert_eq!(s.pods["a"].memory_at, Duration::from_secs(2));
}

#[tokio::test]
async fn the_thread_publishes_each_snapshot() {
    let (_dir, observer) = fake_node();
    let stats = StatsCollector::spawn(observer).expect("spawn");
    assert!(stats.latest().pods.is_empty());
    let s = stats
        .refresh(
            Refresh::full(),
            vec![target("a")].into(),
            Duration::from_secs(5),
        )
        .await
        .expect("refresh");
    assert!(Arc::ptr_eq(&s, &stats.latest()));
}
