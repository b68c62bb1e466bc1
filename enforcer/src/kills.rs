//! The causal record of every kill: for each eviction and each kernel OOM kill the node saw,
//! one record with the pod, what triggered the step (the kernel signal, its source and
//! timestamps), the observation and threshold that decided it, kubelet's ranking's first
//! candidates with their usage and requests, the grace period, and the chain of times:
//! kernel event -> received -> decided -> SIGKILL -> memory released.
//!
//! Kept under the state directory (`kills/kills.jsonl`, bounded and rotating as the event
//! store is: at most 2 x 1 MiB), shown by `enforcer why POD` and `enforcer evictions`. A
//! record is written when the kill is decided (or seen, for the kernel's) and again when the
//! victim's memory is released; the last line of an id wins. The pod's `Evicted` event
//! carries the record's id in its `enforcer/kill-record` annotation.
//!
//! All chain times are CLOCK_MONOTONIC nanoseconds (the clock of the eBPF timestamps), so
//! their differences are exact; `at` is the wall-clock time of the decision for people.

use std::{collections::BTreeMap, path::Path};

use serde::{Deserialize, Serialize};

use crate::{
    policy::{
        eviction::{Observations, Resource, Signal as EvictionSignal, manager::ActivePod, rank},
        qos, resources,
    },
    signal::Signal,
    state_log::{self, LineStore, StoreError},
};

/// The directory under the state directory.
pub const DIR: &str = "kills";
const FILE: &str = "kills.jsonl";
/// One file's bound (the log keeps two).
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Candidates kept per record.
pub const CANDIDATES: usize = 5;
/// The annotation of the `Evicted` event naming the record.
pub const ANNOTATION: &str = "enforcer/kill-record";

/// Who killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum KillKind {
    /// The eviction manager evicted the pod.
    Eviction,
    /// The kernel's OOM killer killed a process (seen, not decided, by the node).
    KernelOomKill,
}

/// The kernel signal that started the step.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TriggerSignal {
    /// `memcgReclaim`, `thresholdCrossed`, `oomKill`, ... (as `enforcer signals` prints).
    pub kind: String,
    /// `ebpf`, `memcgEventfd`, `psi`, `poll`, ...
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_ns: Option<u64>,
    pub received_ns: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The watched cgroup's usage when the kernel checked it (the crossing check's record:
    /// its page counter at the crossing charge), and the level it was compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_bytes: Option<u64>,
}

impl TriggerSignal {
    /// From a decoded signal.
    #[must_use]
    pub fn of(s: &Signal) -> Self {
        let name = |v: serde_json::Result<serde_json::Value>| {
            v.ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        };
        Self {
            kind: name(serde_json::to_value(s.kind)),
            source: s.source.as_str().to_owned(),
            kernel_ns: s.kernel_ns,
            received_ns: s.received_ns,
            pid: s.pid,
            comm: s.comm.clone(),
            cgroup: s.cgroup.clone(),
            usage_bytes: s.detail.usage_bytes,
            threshold_bytes: s.detail.threshold_bytes,
        }
    }
}

/// One pod of the ranking.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub qos: String,
    pub priority: i32,
    /// Usage of the starved resource (bytes, inodes or processes); `None`: no stats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<i64>,
    /// The request of the starved resource (memory and ephemeral storage; else 0).
    pub request: i64,
    /// Critical: ranked but never evicted.
    #[serde(default)]
    pub critical: bool,
}

/// The observation the threshold was compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observed {
    pub available: i64,
    pub capacity: i64,
}

/// One kill.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KillRecord {
    /// `<wall-clock ns, hex>-<uid or pid>`.
    pub id: String,
    pub kind: KillKind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub qos: String,
    /// Wall-clock time of the decision (or of the kill seen), RFC 3339.
    pub at: String,
    /// What woke the eviction manager: `crossing`, `signal`, `housekeeping`, `deadline`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub step: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<TriggerSignal>,
    /// The eviction signal (`memory.available`), empty for the kernel's kills.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signal: String,
    /// The threshold met (`memory.available<250Mi`), with `hard` or its grace period.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub threshold: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<Observed>,
    /// Every signal's available amount in the step's observations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub observations: BTreeMap<String, i64>,
    /// kubelet's ranking for the starved resource, first [`CANDIDATES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<Candidate>,
    pub message: String,
    #[serde(default)]
    pub grace_period_seconds: i64,
    /// When the step began reading the node and the pods the decision was taken on, and
    /// when that read was done (CLOCK_MONOTONIC ns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observe_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sigkill_ns: Option<u64>,
    /// When process_mrelease(2) had reclaimed the victim's memory, right after the SIGKILL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reaped_ns: Option<u64>,
    /// What reclaiming the victim's memory did (`process_mrelease: 2 processes reaped`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reaped: String,
    /// Throttle, then evict: how the victim was capped and stopped.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub throttled: String,
    /// CLOCK_MONOTONIC ns when the pod worker's kill had stopped and removed everything (the
    /// eviction's answer; none beside kubelet, whose worker does it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_ns: Option<u64>,
    /// `released`, `timed out` (kubelet's cleanup wait), or empty while waiting.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub release: String,
    /// Companion mode: what kubelet would have done, and by when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<String>,
    /// An eviction's victim's pod cgroup (where its release is looked for, also after a
    /// restart of the daemon).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cgroup: String,
}

/// A hard eviction's SIGKILL: when it was sent, and what reclaiming the victims' memory did
/// and when that ended (`None`: `reapMemory` off).
#[derive(Clone, Debug)]
pub struct Killed {
    pub sigkill_ns: u64,
    pub reaped: Option<(crate::cgroup::kill::Reaped, u64)>,
}

impl KillRecord {
    /// Records `k`: the SIGKILL's time, what the reclaim did, and its time when it reaped a
    /// process (one found exiting already frees its own memory: its exit is the release then).
    pub fn set_killed(&mut self, k: &Killed) {
        self.sigkill_ns = Some(k.sigkill_ns);
        if let Some((reaped, at)) = &k.reaped {
            if reaped.processes > 0 {
                self.reaped_ns = Some(*at);
            }
            self.reaped = reaped.to_string();
        }
    }

    /// A record of `kind` about the pod `uid` (`pod`: its spec, when known: its namespace,
    /// name and QoS class), stamped now; the one way the daemon starts a record. `who` names
    /// the record when there is no pod (`pid<N>` for a kill outside any pod).
    #[must_use]
    pub fn for_pod(
        kind: KillKind,
        who: &str,
        uid: &str,
        pod: Option<&k8s_openapi::api::core::v1::Pod>,
    ) -> Self {
        use crate::policy::{qos::pod_qos, resources};
        Self {
            namespace: pod.map_or_else(String::new, |p| resources::pod_namespace(p).to_owned()),
            name: pod.map_or_else(String::new, |p| resources::pod_name(p).to_owned()),
            uid: uid.to_owned(),
            qos: pod.map_or_else(String::new, |p| format!("{:?}", pod_qos(p))),
            ..Self::new(kind, who)
        }
    }

    /// A record of `kind` about `who` (a pod's uid, or `pid<N>` for a kill outside any pod),
    /// stamped now (its id and wall-clock time); every other field empty, to be filled in.
    #[must_use]
    pub fn new(kind: KillKind, who: &str) -> Self {
        Self {
            id: record_id(who),
            kind,
            namespace: String::new(),
            name: String::new(),
            uid: String::new(),
            qos: String::new(),
            at: now_rfc3339(),
            step: String::new(),
            trigger: None,
            signal: String::new(),
            threshold: String::new(),
            observed: None,
            observations: BTreeMap::new(),
            candidates: Vec::new(),
            message: String::new(),
            grace_period_seconds: 0,
            observe_ns: None,
            observed_ns: None,
            decision_ns: None,
            sigkill_ns: None,
            reaped_ns: None,
            reaped: String::new(),
            throttled: String::new(),
            stopped_ns: None,
            released_ns: None,
            release: String::new(),
            kubelet: None,
            cgroup: String::new(),
        }
    }

    /// The chain's times in order of the chain: (what, monotonic ns).
    #[must_use]
    pub fn chain(&self) -> Vec<(&'static str, u64)> {
        let mut out = Vec::new();
        if let Some(t) = &self.trigger {
            if let Some(k) = t.kernel_ns {
                out.push(("kernel event", k));
            }
            out.push(("received by the daemon", t.received_ns));
        }
        let steps = [
            ("reading node and pods", self.observe_ns),
            ("node and pods read", self.observed_ns),
            ("decided", self.decision_ns),
            ("SIGKILL sent", self.sigkill_ns),
            ("memory reaped (process_mrelease)", self.reaped_ns),
            ("pod stopped by its worker", self.stopped_ns),
            ("memory released", self.released_ns),
        ];
        out.extend(steps.into_iter().filter_map(|(w, t)| t.map(|t| (w, t))));
        out
    }
}

/// kubelet's ranking for `signal` over `pods`, the first `n` with their figures.
#[must_use]
pub fn candidates(signal: EvictionSignal, pods: &[ActivePod<'_>], n: usize) -> Vec<Candidate> {
    let resource = signal.resource();
    rank::rank(signal, pods)
        .into_iter()
        .take(n)
        .filter_map(|i| pods.get(i))
        .map(|p| {
            let facts = p
                .facts
                .copied()
                .unwrap_or_else(|| rank::PodFacts::of(p.pod));
            let usage = p.stats.and_then(|s| match resource {
                Resource::Memory => s.memory,
                Resource::EphemeralStorage => s.ephemeral_storage,
                Resource::Inodes => s.inodes,
                Resource::Pids => s.processes,
            });
            let request = match resource {
                Resource::Memory => facts.memory_request,
                Resource::EphemeralStorage => facts.storage_request,
                Resource::Inodes | Resource::Pids => 0,
            } / 1_000_000_000;
            Candidate {
                namespace: resources::pod_namespace(p.pod).to_owned(),
                name: resources::pod_name(p.pod).to_owned(),
                uid: p.pod.metadata.uid.clone().unwrap_or_default(),
                qos: format!("{:?}", qos::pod_qos(p.pod)),
                priority: facts.priority,
                usage,
                request: i64::try_from(request).unwrap_or(i64::MAX),
                critical: facts.critical,
            }
        })
        .collect()
}

/// Every signal's available amount, by name.
#[must_use]
pub fn observation_map(obs: &Observations) -> BTreeMap<String, i64> {
    obs.iter()
        .map(|(s, o)| (s.as_str().to_owned(), o.available))
        .collect()
}

/// The append end, held by the eviction manager; a log that cannot be written is reported
/// once and costs the node nothing.
#[derive(Debug, Default)]
pub struct KillLog {
    store: Option<LineStore>,
    failed: bool,
    /// Evictions whose memory is not released yet, by uid.
    waiting: BTreeMap<String, KillRecord>,
}

impl KillLog {
    /// Opens `<state_dir>/kills`.
    #[must_use]
    pub fn open(state_dir: &Path) -> Self {
        match LineStore::open(&state_dir.join(DIR), FILE, MAX_FILE_BYTES) {
            Ok(s) => Self {
                store: Some(s),
                ..Self::default()
            },
            Err(e) => {
                tracing::warn!(error = %e, "kill records are not kept");
                Self::default()
            }
        }
    }

    /// The evictions a previous run left open (decided, their release not seen: the daemon
    /// stopped or was killed meanwhile). The last one is waited for again and returned (its
    /// release is recorded by [`Self::released`]); older ones are closed as `daemon
    /// restarted`.
    pub fn reopen(&mut self, state_dir: &Path) -> Option<KillRecord> {
        let open: Vec<KillRecord> = read(state_dir)
            .map(|(records, _)| records)
            .unwrap_or_default()
            .into_iter()
            // An eviction waited for names its cgroup (a local-storage one is not waited for).
            .filter(|r| {
                r.kind == KillKind::Eviction && r.release.is_empty() && !r.cgroup.is_empty()
            })
            .collect();
        let (last, older) = open.split_last()?;
        for r in older {
            let mut r = r.clone();
            "daemon restarted".clone_into(&mut r.release);
            self.write(&r);
        }
        tracing::info!(uid = %last.uid, pod = %format!("{}/{}", last.namespace, last.name), record = %last.id, "an eviction the last run decided is still open: its release is waited for before another");
        self.waiting.insert(last.uid.clone(), last.clone());
        Some(last.clone())
    }

    fn write(&mut self, r: &KillRecord) {
        let Some(s) = self.store.as_mut() else {
            return;
        };
        match s.append(r) {
            Ok(()) => self.failed = false,
            Err(e) if !self.failed => {
                tracing::warn!(error = %e, "writing a kill record failed (logged once until it works again)");
                self.failed = true;
            }
            Err(_) => {}
        }
    }

    /// Records a decided eviction; its release is recorded by [`Self::released`].
    pub fn evicted(&mut self, r: KillRecord) {
        self.write(&r);
        if self.waiting.len() >= 64 {
            self.waiting.clear();
        }
        self.waiting.insert(r.uid.clone(), r);
    }

    /// A capped victim killed after all (the node fell below its floor while it stopped):
    /// its SIGKILL and what reclaiming its memory did.
    pub fn killed_later(&mut self, uid: &str, killed: &Killed) {
        if let Some(r) = self.waiting.get_mut(uid) {
            r.set_killed(killed);
            r.throttled
                .push_str("; killed: the node fell below the floor");
            let r = r.clone();
            self.write(&r);
        }
    }

    /// The victim `uid`'s memory reaped (on the reaping threads, after its SIGKILL): what
    /// reaping did, and when it ended when it reaped a process.
    pub fn reaped(&mut self, uid: &str, reaped: &crate::cgroup::kill::Reaped, at: u64) {
        if let Some(r) = self.waiting.get_mut(uid) {
            if reaped.processes > 0 {
                r.reaped_ns = Some(at);
            }
            r.reaped = reaped.to_string();
            let r = r.clone();
            self.write(&r);
        }
    }

    /// Records the end of the cleanup wait of `uid` (`released`: its resources were freed;
    /// else the wait timed out), and when its pod worker's kill had stopped everything
    /// (`stopped_ns`, the eviction's answer).
    pub fn released(&mut self, uid: &str, released: bool, stopped_ns: Option<u64>) {
        if let Some(mut r) = self.waiting.remove(uid) {
            r.stopped_ns = stopped_ns;
            if released {
                let now = crate::signal::monotonic_ns();
                r.released_ns = Some(now);
                if let Some(k) = r.sigkill_ns {
                    crate::metrics::global().sigkill_to_released(std::time::Duration::from_nanos(
                        now.saturating_sub(k),
                    ));
                }
                "released".clone_into(&mut r.release);
            } else {
                "timed out".clone_into(&mut r.release);
            }
            self.write(&r);
        }
    }

    /// Records a kill nobody waits on (a kernel OOM kill, a local-storage eviction).
    pub fn record(&mut self, r: &KillRecord) {
        self.write(r);
    }
}

/// A record's id: the wall-clock time and who.
#[must_use]
pub fn record_id(who: &str) -> String {
    format!("{:x}-{who}", crate::clock::now_nanos())
}

/// The wall-clock time now, RFC 3339.
#[must_use]
pub fn now_rfc3339() -> String {
    crate::clock::rfc3339(crate::clock::now_nanos())
}

/// The records kept under `state_dir`, the last line of each id, oldest first; with the
/// count of unreadable lines.
///
/// # Errors
/// A file exists but cannot be read.
pub fn read(state_dir: &Path) -> Result<(Vec<KillRecord>, usize), StoreError> {
    let (lines, bad) = state_log::read::<KillRecord>(&state_dir.join(DIR), FILE)?;
    Ok((state_log::last_by_key(lines, |r| r.id.clone()), bad))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn record(uid: &str) -> KillRecord {
        KillRecord {
            namespace: "default".to_owned(),
            name: "hog".to_owned(),
            uid: uid.to_owned(),
            qos: "BestEffort".to_owned(),
            at: "2026-12-01T12:00:00Z".to_owned(),
            step: "crossing".to_owned(),
            trigger: Some(TriggerSignal {
                kind: "memcgReclaim".to_owned(),
                source: "ebpf".to_owned(),
                kernel_ns: Some(1_000_000),
                received_ns: 1_100_000,
                pid: Some(42),
                comm: None,
                cgroup: Some("/kubepods/besteffort/podu1/c".to_owned()),
                usage_bytes: None,
                threshold_bytes: None,
            }),
            signal: "memory.available".to_owned(),
            threshold: "memory.available<250Mi (hard)".to_owned(),
            observed: Some(Observed {
                available: 200 << 20,
                capacity: 1 << 30,
            }),
            candidates: vec![Candidate {
                namespace: "default".to_owned(),
                name: "hog".to_owned(),
                uid: uid.to_owned(),
                qos: "BestEffort".to_owned(),
                priority: 0,
                usage: Some(100 << 20),
                request: 0,
                critical: false,
            }],
            message: "The node was low on resource: memory. ".to_owned(),
            grace_period_seconds: 1,
            observe_ns: Some(1_200_000),
            observed_ns: Some(1_700_000),
            decision_ns: Some(2_000_000),
            sigkill_ns: Some(2_100_000),
            ..KillRecord::new(KillKind::Eviction, uid)
        }
    }

    /// Written at the decision, again at the release: read back as one record with the
    /// whole chain, in order (`enforcer why` shows it: `cli::why`).
    #[test]
    fn decided_then_released_reads_back_as_one_record() {
        let dir = std::env::temp_dir().join(format!("enforcer-kills-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut log = KillLog::open(&dir);
        log.evicted(record("u1"));
        log.released("u1", true, Some(2_400_000));
        log.released("u-unknown", true, None);
        let (records, bad) = read(&dir).expect("read");
        assert_eq!((records.len(), bad), (1, 0));
        let r = &records[0];
        assert_eq!(r.release, "released");
        let chain = r.chain();
        let names: Vec<&str> = chain.iter().map(|c| c.0).collect();
        assert_eq!(
            names,
            [
                "kernel event",
                "received by the daemon",
                "reading node and pods",
                "node and pods read",
                "decided",
                "SIGKILL sent",
                "pod stopped by its worker",
                "memory released"
            ]
        );
        assert!(chain.windows(2).all(|w| w[0].1 <= w[1].1), "{chain:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A restart: the last open eviction (its cgroup named) is waited for again and closed
    /// by its release; an older open one is closed as `daemon restarted`; a local-storage
    /// eviction (no cgroup: never waited for) and a closed one are left as they are.
    #[test]
    fn the_last_open_eviction_is_waited_for_again_after_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let with_cgroup = |uid: &str| KillRecord {
            id: format!("id-{uid}"),
            cgroup: format!("/kubepods/besteffort/pod{uid}"),
            ..record(uid)
        };
        let mut log = KillLog::open(dir.path());
        log.evicted(with_cgroup("old"));
        log.evicted(with_cgroup("done"));
        log.released("done", true, None);
        log.record(&KillRecord {
            id: "id-storage".to_owned(),
            ..record("storage")
        });
        log.evicted(with_cgroup("last"));
        drop(log);
        let mut log = KillLog::open(dir.path());
        let r = log.reopen(dir.path()).expect("an open eviction");
        assert_eq!(r.uid, "last");
        log.released("last", true, None);
        let (records, _) = read(dir.path()).expect("read");
        let release = |uid: &str| {
            records
                .iter()
                .find(|r| r.uid == uid)
                .map(|r| r.release.clone())
        };
        assert_eq!(release("last").as_deref(), Some("released"));
        assert_eq!(release("old").as_deref(), Some("daemon restarted"));
        assert_eq!(release("done").as_deref(), Some("released"));
        assert_eq!(release("storage").as_deref(), Some(""));
        assert!(KillLog::open(dir.path()).reopen(dir.path()).is_none());
    }
}
