//! The daemon's eviction manager: kubelet's `synchronize` driven by kernel signals, the
//! housekeeping tick and due instants; it observes the node, steps the pure decision core
//! (`policy::eviction::manager::step`) and acts through the pod workers ([`NodeLink`]) and the
//! pod-cgroup kill ([`crate::cgroup::kill`]).

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::mpsc;

use crate::{
    cgroup::{CgroupLayout, join_inside, writer::CgroupWriter},
    cluster::events::{EventRecord, EventType, Involved},
    config::Config,
    health::Health,
    kernel,
    kills::{self, KillKind, KillLog, KillRecord, TriggerSignal},
    policy::eviction::tripwire::{self, Tripwire},
    policy::eviction::{
        ActivePod, NodeCondition, State,
        manager::{Cleanup, CleanupWait, ReclaimPacer, next_deadline},
        step,
    },
    runtime::{
        self, ActiveEntry, CriRuntime, Evict, NodeLink, StatusManager,
        status::{Condition as StatusCondition, NodeRecord},
    },
    signal::{Signal, SignalKind},
    stats::{NodeSnapshot, PodScope, PodTarget, Refresh, StatsCollector},
};

/// The node's pressure conditions for the status file: each `True` or `False`.
fn node_record(conditions: &[NodeCondition]) -> NodeRecord {
    let conditions = [
        NodeCondition::MemoryPressure,
        NodeCondition::DiskPressure,
        NodeCondition::PidPressure,
    ]
    .into_iter()
    .map(|c| StatusCondition::new(c.as_str(), conditions.contains(&c)))
    .collect();
    NodeRecord { conditions }
}

/// Whether a signal should wake the eviction manager.
#[must_use]
pub fn is_pressure(s: &Signal) -> bool {
    matches!(
        s.kind,
        SignalKind::MemcgReclaim
            | SignalKind::DirectReclaim
            | SignalKind::OomKill
            | SignalKind::MemoryThreshold
            | SignalKind::MemoryPressure
            | SignalKind::MemoryEvents
            | SignalKind::Fork
    )
}

/// Whether a signal calls for a step at once, without the [`MIN_STEP_INTERVAL`] floor: a
/// usage threshold crossed (a v1 threshold eventfd; on v2 a watched cgroup's `memory.events`
/// `high` or `max` count moving, which the `memory.high` tripwire makes the crossing) or a
/// kernel OOM kill. Reclaim and fork records come in bursts and are coalesced; a crossing
/// comes once and is the moment to act.
#[must_use]
pub fn is_urgent(s: &Signal) -> bool {
    matches!(
        s.kind,
        SignalKind::MemoryThreshold | SignalKind::MemoryEvents | SignalKind::OomKill
    )
}

/// Gathers the rest of a burst into the coming step (`take`, told whether an urgent signal
/// came before): every signal already queued, then, unless one was urgent, what comes before
/// `floor` (reclaim and fork records wait for [`MIN_STEP_INTERVAL`] since the last step; an
/// urgent signal arriving meanwhile ends the wait at once). Whether the burst was urgent.
async fn gather_burst(
    signals: &mut mpsc::Receiver<Signal>,
    mut urgent: bool,
    floor: tokio::time::Instant,
    mut take: impl FnMut(&Signal, bool),
) -> bool {
    while let Ok(more) = signals.try_recv() {
        take(&more, urgent);
        urgent |= is_urgent(&more);
    }
    while !urgent {
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(floor) => break,
            more = signals.recv() => match more {
                Some(more) => {
                    take(&more, urgent);
                    urgent |= is_urgent(&more);
                }
                // Closed: the manager's next turn says so.
                None => break,
            },
        }
    }
    urgent
}

/// The kubepods cgroup of the v2 tripwire: its directory and the hierarchy's mount.
#[derive(Clone, Debug)]
pub struct TripwireCgroup {
    pub dir: PathBuf,
    pub mount: PathBuf,
}

/// The tripwire is never placed closer than this above kubepods' usage: two charge batches
/// of the kernel's per-CPU stock (64 pages each), the noise of `memory.current`. Every MiB
/// above the threshold is growth the tripwire lets through before it fires, so it is small.
const TRIPWIRE_FLOOR: i64 = 512 << 10;
/// Moves of an armed tripwire smaller than this are not written. Smaller than the floor: a
/// tripwire the usage went past is always moved above it (one left below the usage would
/// throttle kubepods until the next step).
const TRIPWIRE_SLACK: i64 = 256 << 10;
const _: () = assert!(TRIPWIRE_SLACK < TRIPWIRE_FLOOR);

/// What started an eviction-manager step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Kernel signals (coalesced reclaim and fork records).
    Signal,
    /// A usage threshold crossed or a kernel OOM kill ([`is_urgent`]).
    Crossing,
    /// The housekeeping tick.
    Housekeeping,
    /// A grace or transition period ending.
    Deadline,
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Signal => "signal",
            Self::Crossing => "crossing",
            Self::Housekeeping => "housekeeping",
            Self::Deadline => "deadline",
        })
    }
}

/// What the run loop remembers between steps besides the decision core's state.
#[derive(Debug, Default)]
struct Memo {
    /// Paces node-level reclaim.
    reclaim: ReclaimPacer,
    /// The last evicted pod and its pod cgroup, until its resources are released.
    cleanup: Option<(CleanupWait, String)>,
    /// When the runtime was last asked for its image filesystem, and whether it answered.
    imagefs_asked: Option<Duration>,
    imagefs_known: bool,
    /// The v2 tripwire as last written.
    tripwire: Option<Tripwire>,
    /// Pods evicted for their local storage (asked once; forgotten when they leave).
    local_storage_evicted: std::collections::BTreeSet<String>,
    /// The kill records (`kills`).
    kills: KillLog,
    /// The kernel signal that started this step (`None` on a tick or a due instant).
    trigger: Option<TriggerSignal>,
    /// The record of the eviction this step decided, completed when it is carried out.
    pending: Option<KillRecord>,
    /// Signal delays per source, for `enforcer status`.
    delays: crate::node_report::Delays,
    /// When `eviction.json` was last written, and with which conditions.
    reported: Option<(tokio::time::Instant, Vec<NodeCondition>)>,
    /// The age of the observation the pending eviction was decided on.
    pending_age: Option<Duration>,
    /// The generation of the cgroup-value ledger last written to `cgroups.json`.
    cgroups_written: Option<u64>,
}

/// How often the runtime is asked for its image filesystem until it answers.
const IMAGEFS_RETRY: Duration = Duration::from_secs(10);

/// The imagefs mountpoint from a CRI `ImageFsInfo` answer: the first absolute path that exists.
#[must_use]
pub fn imagefs_mountpoint(filesystems: &[k8s_cri::v1::FilesystemUsage]) -> Option<PathBuf> {
    filesystems
        .iter()
        .filter_map(|f| f.fs_id.as_ref())
        .map(|id| PathBuf::from(&id.mountpoint))
        .find(|p| p.is_absolute() && p.exists())
}

/// How often the manager looks whether an evicted pod's resources were released (kubelet's
/// `podCleanupPollFreq` is 1 s).
const CLEANUP_POLL: Duration = Duration::from_millis(100);

/// Minimum time between two eviction-manager steps driven by reclaim or fork records: enough
/// to coalesce a burst of records into one step, far below any grace period. Urgent signals
/// ([`is_urgent`]) do not wait for it.
const MIN_STEP_INTERVAL: Duration = Duration::from_millis(2);

/// The eviction manager of the daemon: kubelet's `synchronize`, run on every pressure signal
/// (coalesced) and on the housekeeping tick, acting through the [`NodeLink`].
#[derive(Debug)]
pub struct EvictionManager {
    pub config: Config,
    /// Where the pod cgroups are (the kill, the release check).
    pub layout: CgroupLayout,
    /// Through which the pod cgroup is killed and the tripwire placed.
    pub cgroups: Arc<dyn CgroupWriter>,
    /// The kubepods cgroup whose `memory.high` is the crossing tripwire (cgroup v2 only).
    pub tripwire: Option<TripwireCgroup>,
    /// The node's stats collector: all reading happens on its thread.
    pub stats: StatsCollector,
    pub link: NodeLink,
    /// Container names and ids of the running pods (for per-container usage).
    pub status: StatusManager,
    pub housekeeping: Duration,
    /// The runtime for node-level reclaim before disk-pressure evictions (`None`: no pods run).
    pub node_reclaim: Option<Arc<CriRuntime>>,
    /// Told of every wakeup and of the signal pipeline ending (`/healthz`).
    pub health: Arc<Health>,
    /// `EvictionThresholdMet` on the node, `Evicted` on the pod (cluster mode).
    pub events: crate::cluster::events::Recorder,
}

impl EvictionManager {
    /// Runs until `stop` resolves.
    pub async fn run(
        mut self,
        mut pipeline: kernel::Pipeline,
        stop: impl std::future::Future<Output = ()>,
    ) {
        // tokio's clock: a paused test clock drives the periods here.
        let start = tokio::time::Instant::now();
        let mut state = State::default();
        let mut tick = tokio::time::interval(self.housekeeping);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_step = tokio::time::Instant::now() - MIN_STEP_INTERVAL;
        // A soft threshold's grace period or a condition's transition period ending: a step
        // is due then even if no signal comes.
        let mut due: Option<tokio::time::Instant> = None;
        let mut memo = Memo {
            kills: KillLog::open(&self.config.enforcer.state_dir),
            ..Memo::default()
        };
        let mut signals_open = true;
        // The pods the signals of this round named (their memory is re-read).
        let mut named: Vec<String> = Vec::new();
        tokio::pin!(stop);
        loop {
            // Alive: every wakeup beats the heartbeat (`/healthz`); the housekeeping tick
            // wakes the loop at least every period.
            self.health.step_done();
            let deadline = async {
                match due {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            named.clear();
            memo.trigger = None;
            let trigger = tokio::select! {
                () = &mut stop => break,
                _ = tick.tick() => Trigger::Housekeeping,
                () = deadline => Trigger::Deadline,
                s = pipeline.signals.recv(), if signals_open => match s {
                    None => {
                        tracing::error!("signal pipeline ended; housekeeping continues");
                        self.health.set_pipeline(false);
                        signals_open = false;
                        continue;
                    }
                    Some(s) => {
                        log_signal(&s);
                        if !is_pressure(&s) {
                            continue;
                        }
                        let floor = last_step + MIN_STEP_INTERVAL;
                        self.absorb(&s, &mut memo, &mut named, false);
                        let urgent = gather_burst(
                            &mut pipeline.signals,
                            is_urgent(&s),
                            floor,
                            |more, urgent| {
                                log_signal(more);
                                self.absorb(more, &mut memo, &mut named, urgent);
                            },
                        )
                        .await;
                        if urgent { Trigger::Crossing } else { Trigger::Signal }
                    }
                },
            };
            last_step = tokio::time::Instant::now();
            if trigger == Trigger::Housekeeping {
                // Off the signal path: a slow runtime never delays a signal-driven step.
                self.learn_imagefs(start.elapsed(), &mut memo).await;
            }
            state = self
                .step(state, start.elapsed(), trigger, &named, &mut memo)
                .await;
            self.report(&state, &mut memo);
            due = next_deadline(&self.config.eviction, &state, start.elapsed()).map(|d| start + d);
            // Waiting for an evicted pod's cleanup: look again soon, as kubelet polls it.
            if memo.cleanup.is_some() {
                let soon = tokio::time::Instant::now() + CLEANUP_POLL;
                due = Some(due.map_or(soon, |d| d.min(soon)));
            }
        }
        // Nobody watches the tripwire once the manager stops: leave kubepods unthrottled.
        self.write_tripwire(Tripwire::Off, &mut memo);
    }

    /// Writes `eviction.json` for `enforcer status` (`node_report`): at most once a second,
    /// and at once when the conditions change.
    fn report(&self, state: &State, memo: &mut Memo) {
        let now = tokio::time::Instant::now();
        if memo.reported.as_ref().is_some_and(|(at, conds)| {
            now.duration_since(*at) < Duration::from_secs(1) && *conds == state.conditions
        }) {
            return;
        }
        memo.reported = Some((now, state.conditions.clone()));
        let met: Vec<usize> = state.first_observed.keys().copied().collect();
        let nanos = crate::runtime::status::now_nanos();
        let report = crate::node_report::Report {
            updated: crate::runtime::status::rfc3339(nanos),
            updated_ns: nanos,
            conditions: state.conditions.iter().map(ToString::to_string).collect(),
            thresholds: crate::node_report::threshold_lines(
                &self.config.eviction,
                &state.last_observations,
                &met,
            ),
            sources: memo.delays.summary(),
        };
        if let Err(e) = crate::node_report::write(&self.config.enforcer.state_dir, &report) {
            tracing::debug!(error = %e, "writing eviction.json");
        }
        let (generation, files) = crate::cgroup::writer::written();
        if memo.cgroups_written != Some(generation) {
            memo.cgroups_written = Some(generation);
            if let Err(e) =
                crate::node_report::write_cgroups(&self.config.enforcer.state_dir, &files)
            {
                tracing::debug!(error = %e, "writing cgroups.json");
            }
        }
    }

    /// kubelet's imagefs is where the runtime keeps its images (CRI `ImageFsInfo`); until the
    /// runtime answers (or without a runtime) the observer keeps its default.
    async fn learn_imagefs(&mut self, now: Duration, memo: &mut Memo) {
        let Some(rt) = &self.node_reclaim else {
            return;
        };
        if memo.imagefs_known
            || memo
                .imagefs_asked
                .is_some_and(|t| now.saturating_sub(t) < IMAGEFS_RETRY)
        {
            return;
        }
        memo.imagefs_asked = Some(now);
        match rt.image_fs_info().await {
            Ok(fs) => {
                memo.imagefs_known = true;
                match imagefs_mountpoint(&fs) {
                    Some(p) => {
                        tracing::info!(path = %p.display(), "imagefs from the runtime's ImageFsInfo");
                        self.stats.set_imagefs(p);
                    }
                    None => tracing::warn!(
                        answer = ?fs,
                        "ImageFsInfo named no existing mountpoint; keeping the default imagefs"
                    ),
                }
            }
            Err(e) => tracing::debug!(error = %e, "ImageFsInfo: the runtime did not answer yet"),
        }
    }

    /// Whether an evicted pod's resources are released: its worker finished (containers
    /// stopped and removed, logs and pod cgroup removed) and its memory cgroup is gone.
    fn released(&self, uid: &str, cgroup: &str) -> bool {
        let gone = self
            .layout
            .controller("memory")
            .and_then(|(m, _)| join_inside(m, cgroup).ok())
            .is_none_or(|d| !d.exists());
        gone && self.link.take_released(uid)
    }

    /// Disk pressure: dead containers, then unused images, through CRI; then re-observe.
    /// Returns true when no threshold is met any more (no pod needs to be evicted).
    async fn node_level_reclaim(&self, now: Duration, targets: Vec<PodTarget>) -> bool {
        let Some(rt) = &self.node_reclaim else {
            return false;
        };
        let active = self.link.active();
        let status = self.status.clone();
        let running = move |uid: &str| {
            active.contains_key(uid) && status.get(uid).is_none_or(|r| !r.phase.is_terminal())
        };
        match runtime::gc::reclaim_node_level(rt.as_ref(), &running).await {
            Ok(r) => tracing::info!(
                containers = r.containers,
                log_bytes = r.log_bytes,
                images = r.images,
                "node-level reclaim"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "node-level reclaim failed");
                return false;
            }
        }
        let again = Refresh {
            pods: PodScope::New,
            logs: false,
        };
        match self.stats.refresh(again, targets, now).await {
            Ok(snapshot) => {
                let resolved = crate::policy::eviction::manager::resolved_after_node_reclaim(
                    &self.config.eviction,
                    &snapshot.observations,
                );
                if resolved {
                    tracing::info!("able to reduce resource pressure without evicting pods");
                }
                resolved
            }
            Err(e) => {
                tracing::warn!(error = %e, "observing the node after reclaim failed");
                false
            }
        }
    }

    /// Takes one signal of a burst into the coming step: an OOM kill is noted, the delay
    /// observed; a pressure signal names its pod and, the first urgent one (else the first),
    /// becomes the step's trigger (`urgent`: whether the burst had an urgent signal before
    /// this one).
    fn absorb(&self, s: &Signal, memo: &mut Memo, named: &mut Vec<String>, urgent: bool) {
        self.poke_oom_killed(s, &mut memo.kills);
        observe_signal(&mut memo.delays, s);
        if !is_pressure(s) {
            return;
        }
        if memo.trigger.is_none() || (!urgent && is_urgent(s)) {
            memo.trigger = Some(TriggerSignal::of(s));
        }
        named.extend(s.pod_uid.clone());
    }

    /// A kernel OOM kill inside a pod: its worker resyncs now, so the container's `OOMKilled`
    /// shows at once instead of on the next relist.
    fn poke_oom_killed(&self, s: &Signal, kills: &mut KillLog) {
        if s.kind != SignalKind::OomKill {
            return;
        }
        let entry = s
            .pod_uid
            .as_ref()
            .and_then(|uid| self.link.active().get(uid).cloned());
        if let Some(uid) = &s.pod_uid {
            tracing::warn!(uid, pid = s.pid, "kernel OOM kill in a pod");
            self.link.poke(uid);
        }
        let pod = entry.as_ref().map(|e| e.pod.as_ref());
        if let Some(p) = pod {
            crate::metrics::global().oom_kill(&format!("{:?}", crate::policy::qos::pod_qos(p)));
        }
        let who = s
            .pod_uid
            .clone()
            .unwrap_or_else(|| format!("pid{}", s.pid.unwrap_or(0)));
        kills.record(&KillRecord {
            id: kills::record_id(&who),
            kind: KillKind::KernelOomKill,
            namespace: pod
                .map(|p| crate::policy::resources::pod_namespace(p).to_owned())
                .unwrap_or_default(),
            name: pod
                .map(|p| crate::policy::resources::pod_name(p).to_owned())
                .unwrap_or_default(),
            uid: s.pod_uid.clone().unwrap_or_default(),
            qos: pod
                .map(|p| format!("{:?}", crate::policy::qos::pod_qos(p)))
                .unwrap_or_default(),
            at: kills::now_rfc3339(),
            step: String::new(),
            trigger: Some(TriggerSignal::of(s)),
            signal: String::new(),
            threshold: String::new(),
            observed: None,
            observations: BTreeMap::new(),
            candidates: Vec::new(),
            message: format!(
                "The kernel's OOM killer killed pid {} ({}) in cgroup {}",
                s.pid.unwrap_or(0),
                s.comm.as_deref().unwrap_or("?"),
                s.cgroup.as_deref().unwrap_or("?")
            ),
            grace_period_seconds: 0,
            decision_ns: None,
            sigkill_ns: None,
            released_ns: None,
            release: String::new(),
        });
    }

    /// The pods to collect stats of: the active pods (kubelet's active pods: not one that ran
    /// to its end, which holds no memory worth reclaiming, nor the victim being cleaned up),
    /// with their containers' runtime ids.
    fn targets(&self, memo: &Memo) -> (Arc<BTreeMap<String, ActiveEntry>>, Vec<PodTarget>) {
        let active = self.link.active();
        let victim = memo.cleanup.as_ref().map(|(w, _)| w.uid.as_str());
        let mut targets = Vec::with_capacity(active.len());
        for (uid, e) in active.iter() {
            if Some(uid.as_str()) == victim {
                continue;
            }
            let record = self.status.get(uid);
            if record.as_ref().is_some_and(|r| r.phase.is_terminal()) {
                continue;
            }
            targets.push(PodTarget::of(uid, &e.cgroup, record.as_ref()));
        }
        (active, targets)
    }

    async fn step(
        &self,
        state: State,
        now: Duration,
        trigger: Trigger,
        named: &[String],
        memo: &mut Memo,
    ) -> State {
        // kubelet's waitForPodsCleanup, checked before observing: the step that sees the
        // victim released observes what it freed.
        if let Some((wait, cgroup)) = &memo.cleanup {
            let uid = wait.uid.clone();
            match wait.check(now, self.released(&wait.uid, cgroup)) {
                Cleanup::Waiting => {}
                Cleanup::Released => {
                    tracing::info!(uid = %wait.uid, after_ms = now.saturating_sub(wait.since).as_millis(), "evicted pod's resources released");
                    memo.cleanup = None;
                    memo.kills.released(&uid, true);
                }
                Cleanup::TimedOut => {
                    tracing::warn!(uid = %wait.uid, "timed out waiting for the evicted pod to be cleaned up");
                    memo.cleanup = None;
                    memo.kills.released(&uid, false);
                }
            }
        }
        let (active, targets) = self.targets(memo);
        // What to read: everything on the housekeeping tick and at a due instant; on a
        // signal, the node and the pods it names.
        let refresh = match trigger {
            // A crossing is the moment to evict: every pod's memory now, in one read.
            Trigger::Crossing => Refresh {
                pods: PodScope::All,
                logs: false,
            },
            Trigger::Signal => Refresh {
                pods: PodScope::Named(named.to_vec()),
                logs: false,
            },
            Trigger::Housekeeping | Trigger::Deadline => Refresh::full(),
        };
        let all_read = refresh.pods == PodScope::All;
        let began = std::time::Instant::now();
        let mut snapshot = match self.stats.refresh(refresh, targets.clone(), now).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "observing the node failed; skipping this step");
                return state;
            }
        };
        let (next, decision) = self.decide(&state, &snapshot, &active, now);
        // A victim is chosen on every pod's fresh memory: before evicting on figures some of
        // which were carried over, read every pod again and decide again.
        let (next, decision) = if decision.eviction.is_some() && !all_read {
            let again = Refresh {
                pods: PodScope::All,
                logs: false,
            };
            match self.stats.refresh(again, targets.clone(), now).await {
                Ok(s) => {
                    snapshot = s;
                    self.decide(&state, &snapshot, &active, now)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "observing the pods failed; skipping this step");
                    return state;
                }
            }
        } else {
            (next, decision)
        };
        let decision_ns = crate::signal::monotonic_ns();
        tracing::debug!(%trigger, observe_and_decide_us = began.elapsed().as_micros(), evict = decision.eviction.is_some(), "step decided");
        memo.pending_age = decision.eviction.as_ref().and_then(|ev| {
            let at = snapshot.observations.get(&ev.signal)?.time?;
            Some(now.saturating_sub(at))
        });
        memo.pending = decision.eviction.as_ref().map(|ev| {
            self.kill_record(
                ev,
                &snapshot,
                &active,
                trigger,
                memo.trigger.clone(),
                decision_ns,
            )
        });
        // kubelet's localStorageEviction, before any threshold: on the figures of a full
        // walk (housekeeping), every pod over an emptyDir sizeLimit or its ephemeral-storage
        // limits is evicted at once.
        let mut decision = decision;
        if trigger_walks(trigger) && self.local_storage_eviction(&snapshot, &active, memo) {
            decision.eviction = None;
        }
        self.act(
            state.conditions,
            decision,
            now,
            trigger,
            &active,
            targets,
            memo,
        )
        .await;
        memo.pending = None;
        memo.pending_age = None;
        self.place_tripwire(&snapshot, memo);
        next
    }

    /// The record of an eviction just decided (`kills`): what triggered the step, the
    /// observation and threshold, kubelet's ranking's first candidates.
    fn kill_record(
        &self,
        ev: &crate::policy::eviction::manager::Eviction,
        snapshot: &NodeSnapshot,
        active: &BTreeMap<String, ActiveEntry>,
        trigger: Trigger,
        signal: Option<TriggerSignal>,
        decision_ns: u64,
    ) -> KillRecord {
        let pods = active_pods(snapshot, active);
        let t = &ev.threshold;
        let kind = if t.is_hard() {
            "hard".to_owned()
        } else {
            format!("soft, grace {:?}", t.grace_period)
        };
        KillRecord {
            id: kills::record_id(&ev.uid),
            kind: KillKind::Eviction,
            namespace: ev.namespace.clone(),
            name: ev.name.clone(),
            uid: ev.uid.clone(),
            qos: active
                .get(&ev.uid)
                .map(|e| format!("{:?}", crate::policy::qos::pod_qos(&e.pod)))
                .unwrap_or_default(),
            at: kills::now_rfc3339(),
            step: trigger.to_string(),
            trigger: signal,
            signal: ev.signal.to_string(),
            threshold: format!("{}<{} ({kind})", t.signal, t.value),
            observed: snapshot
                .observations
                .get(&ev.signal)
                .map(|o| kills::Observed {
                    available: o.available,
                    capacity: o.capacity,
                }),
            observations: kills::observation_map(&snapshot.observations),
            candidates: kills::candidates(ev.signal, &pods, kills::CANDIDATES),
            message: ev.message.clone(),
            grace_period_seconds: ev.grace_period_seconds,
            decision_ns: Some(decision_ns),
            sigkill_ns: None,
            released_ns: None,
            release: String::new(),
        }
    }

    /// Places the v2 tripwire for the next crossing (`policy::eviction::tripwire`): off while
    /// a memory threshold is met or an evicted pod is being cleaned up.
    fn place_tripwire(&self, snapshot: &NodeSnapshot, memo: &mut Memo) {
        if self.tripwire.is_none() {
            return;
        }
        let next = match snapshot.kubepods_usage {
            Some(usage) if memo.cleanup.is_none() => tripwire::place(
                &self.config.eviction,
                &snapshot.observations,
                usage,
                TRIPWIRE_FLOOR,
            ),
            _ => Tripwire::Off,
        };
        self.write_tripwire(next, memo);
    }

    fn write_tripwire(&self, next: Tripwire, memo: &mut Memo) {
        let Some(t) = &self.tripwire else {
            return;
        };
        if !tripwire::worth_writing(memo.tripwire, next, TRIPWIRE_SLACK) {
            return;
        }
        let high = match next {
            Tripwire::At(v) => Some(v),
            Tripwire::Off => None,
        };
        match self.cgroups.set_memory_high(&t.dir, &t.mount, high) {
            Ok(()) => {
                let armed_changed = memo
                    .tripwire
                    .is_none_or(|was| (was == Tripwire::Off) != (next == Tripwire::Off));
                if armed_changed {
                    tracing::info!(tripwire = ?next, cgroup = %t.dir.display(), "memory.high tripwire");
                } else {
                    tracing::debug!(tripwire = ?next, "memory.high tripwire moved");
                }
                memo.tripwire = Some(next);
            }
            Err(e) => tracing::warn!(error = %e, "placing the memory.high tripwire"),
        }
    }

    /// Evicts the pods over their local storage limits
    /// (`policy::eviction::local_storage`); true when any was evicted now.
    fn local_storage_eviction(
        &self,
        snapshot: &NodeSnapshot,
        active: &BTreeMap<String, ActiveEntry>,
        memo: &mut Memo,
    ) -> bool {
        memo.local_storage_evicted
            .retain(|uid| active.contains_key(uid));
        let pods: Vec<ActivePod<'_>> = snapshot
            .pods
            .iter()
            .filter(|(uid, _)| !memo.local_storage_evicted.contains(*uid))
            .filter_map(|(uid, sample)| {
                let e = active.get(uid)?;
                Some(ActivePod::new(&e.pod, sample.stats.as_ref()).with_facts(&e.facts))
            })
            .collect();
        let evictions = crate::policy::eviction::local_storage::evictions(&pods);
        for ev in &evictions {
            tracing::warn!(uid = %ev.uid, message = %ev.message, "eviction for local storage");
            memo.local_storage_evicted.insert(ev.uid.clone());
            // kubelet's evictPod: the Evicted event, without annotations for these.
            if let Some(p) = pods.get(ev.index) {
                let meta = &p.pod.metadata;
                memo.kills.record(&KillRecord {
                    id: kills::record_id(&ev.uid),
                    kind: KillKind::Eviction,
                    namespace: meta.namespace.clone().unwrap_or_default(),
                    name: meta.name.clone().unwrap_or_default(),
                    uid: ev.uid.clone(),
                    qos: format!("{:?}", crate::policy::qos::pod_qos(p.pod)),
                    at: kills::now_rfc3339(),
                    step: "housekeeping".to_owned(),
                    trigger: None,
                    signal: String::new(),
                    threshold: "the pod's own local storage limits".to_owned(),
                    observed: None,
                    observations: BTreeMap::new(),
                    candidates: Vec::new(),
                    message: ev.message.clone(),
                    grace_period_seconds: 0,
                    decision_ns: Some(crate::signal::monotonic_ns()),
                    sigkill_ns: None,
                    released_ns: None,
                    release: String::new(),
                });
                self.events.record(EventRecord {
                    involved: Involved::pod(
                        meta.namespace.as_deref().unwrap_or_default(),
                        meta.name.as_deref().unwrap_or_default(),
                        &ev.uid,
                        None,
                    ),
                    type_: EventType::Warning,
                    reason: crate::policy::eviction::manager::REASON.to_owned(),
                    message: ev.message.clone(),
                    annotations: BTreeMap::new(),
                });
            }
            self.link.evict(Evict {
                uid: ev.uid.clone(),
                grace_seconds: 0,
                message: ev.message.clone(),
                sigkill_ns: None,
                disruption_target: false,
            });
        }
        !evictions.is_empty()
    }

    /// The decision core's step on a snapshot.
    fn decide(
        &self,
        state: &State,
        snapshot: &NodeSnapshot,
        active: &BTreeMap<String, ActiveEntry>,
        now: Duration,
    ) -> (State, crate::policy::eviction::manager::StepDecision) {
        let pods = active_pods(snapshot, active);
        step(
            &self.config.eviction,
            state,
            &snapshot.observations,
            &pods,
            now,
        )
    }

    /// Acts on a decision: conditions, the node event, node-level reclaim, the eviction.
    #[expect(clippy::too_many_arguments, reason = "one step's values")]
    async fn act(
        &self,
        before: Vec<crate::policy::eviction::NodeCondition>,
        decision: crate::policy::eviction::manager::StepDecision,
        now: Duration,
        trigger: Trigger,
        active: &BTreeMap<String, ActiveEntry>,
        targets: Vec<PodTarget>,
        memo: &mut Memo,
    ) {
        // A hard memory threshold frees the victim's memory now: SIGKILL to every process of
        // the pod cgroup first (the node's bookkeeping below can wait microseconds; memory
        // cannot), then the orderly stop through the pod worker.
        let mut sigkill_ns = None;
        if memo.cleanup.is_none()
            && !(decision.node_level_reclaim_first && decision.reclaim.is_some())
            && let Some(ev) = &decision.eviction
            && ev.threshold.is_hard()
            && ev.signal.resource() == crate::policy::eviction::Resource::Memory
            && let Some(e) = active.get(&ev.uid)
        {
            let killed = crate::cgroup::kill::kill_pod_cgroup(
                self.cgroups.as_ref(),
                &self.layout,
                &e.cgroup,
            );
            sigkill_ns = Some(crate::signal::monotonic_ns());
            tracing::warn!(uid = %ev.uid, killed, "hard memory threshold: SIGKILL sent to the pod's processes");
        }
        if self.link.set_conditions(decision.conditions.clone()) || before != decision.conditions {
            tracing::info!(conditions = ?decision.conditions, %trigger, "node conditions changed");
        }
        self.status.set_node(node_record(&decision.conditions));
        if let Some(text) = &decision.node_event {
            tracing::warn!(event = "EvictionThresholdMet", message = %text, %trigger, "eviction threshold met");
            self.events.event(
                Involved::node(&self.config.node_name()),
                EventType::Warning,
                "EvictionThresholdMet",
                text.clone(),
            );
        }
        let mut eviction = decision.eviction;
        if memo.cleanup.is_some() {
            eviction = None;
        } else if decision.node_level_reclaim_first && decision.reclaim.is_some() {
            // At most one node-level reclaim per interval (signal bursts must not turn into
            // CRI storms); a step in between evicts nobody for disk.
            if !memo.reclaim.due(now) || self.node_level_reclaim(now, targets).await {
                eviction = None;
            }
        }
        if let Some(ev) = eviction {
            let entry = active.get(&ev.uid);
            tracing::warn!(
                pod = %format!("{}/{}", ev.namespace, ev.name),
                uid = %ev.uid,
                signal = %ev.signal,
                grace = ev.grace_period_seconds,
                %trigger,
                message = %ev.message,
                "eviction"
            );
            if let Some(e) = entry {
                memo.cleanup = Some((
                    CleanupWait {
                        uid: ev.uid.clone(),
                        since: now,
                    },
                    e.cgroup.clone(),
                ));
            }
            let mut annotations = ev.annotations.clone();
            let m = crate::metrics::global();
            m.eviction(ev.signal.as_str());
            if let Some(age) = memo.pending_age.take() {
                m.eviction_stats_age(ev.signal.as_str(), age);
            }
            if let Some(mut r) = memo.pending.take() {
                r.sigkill_ns = sigkill_ns;
                if let Some(d) = r.decision_ns {
                    if let Some(t) = r.trigger.as_ref() {
                        let from = t.kernel_ns.unwrap_or(t.received_ns);
                        m.crossing_to_decision(
                            ev.signal.as_str(),
                            Duration::from_nanos(d.saturating_sub(from)),
                        );
                    }
                    if let Some(k) = sigkill_ns {
                        m.decision_to_sigkill(Duration::from_nanos(k.saturating_sub(d)));
                    }
                }
                annotations.insert(kills::ANNOTATION.to_owned(), r.id.clone());
                memo.kills.evicted(r);
            }
            self.events.record(EventRecord {
                involved: Involved::pod(&ev.namespace, &ev.name, &ev.uid, None),
                type_: EventType::Warning,
                reason: crate::policy::eviction::manager::REASON.to_owned(),
                message: ev.message.clone(),
                annotations,
            });
            self.link.evict(Evict {
                uid: ev.uid.clone(),
                grace_seconds: ev.grace_period_seconds,
                message: ev.message.clone(),
                sigkill_ns,
                disruption_target: true,
            });
        }
    }
}

/// The decision core's view of the active pods that have a sample in `snapshot`.
fn active_pods<'a>(
    snapshot: &'a NodeSnapshot,
    active: &'a BTreeMap<String, ActiveEntry>,
) -> Vec<ActivePod<'a>> {
    snapshot
        .pods
        .iter()
        .filter_map(|(uid, sample)| {
            let e = active.get(uid)?;
            Some(ActivePod::new(&e.pod, sample.stats.as_ref()).with_facts(&e.facts))
        })
        .collect()
}

/// Counts a signal for `enforcer status` and its delay for `enforcer_signal_delay_seconds`.
fn observe_signal(delays: &mut crate::node_report::Delays, s: &Signal) {
    delays.observe(s);
    if let Some(k) = s.kernel_ns {
        crate::metrics::global().signal_delay(
            s.source.as_str(),
            Duration::from_nanos(s.received_ns.saturating_sub(k)),
        );
    }
}

/// Whether a step on this trigger walks the pods' directories (local storage figures).
fn trigger_walks(t: Trigger) -> bool {
    matches!(t, Trigger::Housekeeping | Trigger::Deadline)
}

fn log_signal(s: &Signal) {
    let cgroup = s.cgroup.as_deref().unwrap_or("");
    let pod = s.pod_uid.as_deref().unwrap_or("");
    match s.kind {
        SignalKind::CgroupCreated
        | SignalKind::CgroupRemoved
        | SignalKind::Fork
        | SignalKind::Probe
        | SignalKind::MemcgReclaim
        | SignalKind::DirectReclaim => {
            tracing::debug!(signal = ?s.kind, cgroup, pod, count = s.count, "signal");
        }
        _ => tracing::info!(
            signal = ?s.kind,
            source = ?s.source,
            cgroup,
            pod,
            pid = s.pid,
            count = s.count,
            delay_us = s.delay_ns().map(|d| d / 1000),
            "signal"
        ),
    }
}

#[cfg(test)]
mod tests {
    use k8s_cri::v1 as cri;

    use super::*;

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
        let urgent = gather_burst(&mut rx, false, floor, |s, before| {
            taken.push((s.kind, before));
        })
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
        let urgent = gather_burst(&mut rx, false, start + MIN_STEP_INTERVAL, |_, _| n += 1).await;
        assert!(!urgent);
        assert_eq!(n, 1, "the queued record was gathered");
        assert_eq!(
            start.elapsed(),
            MIN_STEP_INTERVAL,
            "and the floor waited out"
        );

        let start = Instant::now();
        let urgent = gather_burst(&mut rx, true, start + MIN_STEP_INTERVAL, |_, _| n += 1).await;
        assert!(urgent);
        assert_eq!(start.elapsed(), Duration::ZERO, "urgent: no wait");

        drop(tx);
        let urgent = gather_burst(&mut rx, false, start + MIN_STEP_INTERVAL, |_, _| n += 1).await;
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
}
