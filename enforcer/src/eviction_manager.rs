//! The daemon's eviction manager: kubelet's `synchronize` driven by kernel signals, the
//! housekeeping tick and due instants; it observes the node, steps the pure decision core
//! (`policy::eviction::manager::step`) and acts through the pod workers ([`NodeLink`]) and the
//! pod-cgroup kill ([`crate::cgroup::kill`]).

mod act;
mod observe;
mod report;
mod signals;
pub mod thread;
mod tripwire;

#[cfg(test)]
mod tests;

use std::{sync::Arc, time::Duration};

pub use observe::imagefs_mountpoint;
pub use signals::{is_pressure, is_urgent};
pub use tripwire::{TripwireCgroup, TripwireHow};

use self::{
    act::Observed,
    observe::{active_pods, refresh_for, trigger_walks},
    signals::{gather_burst, log_signal},
};
use crate::{
    cgroup::{CgroupLayout, writer::CgroupWriter},
    config::Config,
    cri::CriRuntime,
    health::Health,
    kernel,
    kills::{KillLog, TriggerSignal},
    pods::{KillDone, NodeLink},
    policy::eviction::{
        Resource, State,
        manager::{Action, Input, NodeReclaimed, next_deadline, step},
        tripwire::Tripwire,
    },
    stats::{NodeSnapshot, PodScope, Refresh, StatsCollector},
    status_manager::StatusManager,
};

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
    /// The last victim's stop answered: its resources are released.
    Released,
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Signal => "signal",
            Self::Crossing => "crossing",
            Self::Housekeeping => "housekeeping",
            Self::Deadline => "deadline",
            Self::Released => "released",
        })
    }
}

/// What woke the run loop.
enum Woke {
    Trigger(Trigger),
    Signal(Box<crate::signal::Signal>),
}

/// What the run loop keeps between steps besides the decision core's state, in parts that
/// own their state: each function takes the part it needs.
#[derive(Debug, Default)]
struct Parts {
    /// The crossing tripwire as laid (`tripwire`).
    wire: tripwire::Wire,
    /// `eviction.json`, `cgroups.json` and the signal delays (`report`).
    reporter: report::Reporter,
    /// The runtime's image filesystem, asked until it answers (`observe`).
    imagefs: observe::ImagefsProbe,
    /// The pods last read and the active set they came from: what a crossing reuses while
    /// the active set is the same (`observe::TargetCache`).
    targets: Option<observe::TargetCache>,
    /// The kill records (`kills`).
    kills: KillLog,
    /// The pod cgroup of the last victim: where its release is looked for while the decision
    /// core waits for its cleanup, and where a capped victim is killed.
    victim_cgroup: Option<String>,
    /// The last eviction's answer, awaited ([`crate::pods::KillCompletion`]).
    answer: Option<tokio::sync::oneshot::Receiver<KillDone>>,
    /// The last eviction answered: its pod's stop is done.
    answered: Option<KillDone>,
    /// The kernel signal that started this step (`None` on a tick or a due instant).
    trigger: Option<TriggerSignal>,
    /// The reaping threads (`reapMemory`): a victim's memory reclaimed off this thread.
    reaping: Option<Reaping>,
}

/// A pod's processes reaped: its uid, what reaping did, when it ended (monotonic ns).
type ReapedPod = (String, crate::cgroup::kill::Reaped, u64);

/// The reaping threads and the way their results come back to the run loop (written to the
/// victim's kill record there).
#[derive(Debug)]
struct Reaping {
    reaper: crate::cgroup::reaper::Reaper,
    tx: tokio::sync::mpsc::UnboundedSender<ReapedPod>,
    rx: tokio::sync::mpsc::UnboundedReceiver<ReapedPod>,
}

impl Reaping {
    fn start() -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        Self {
            reaper: crate::cgroup::reaper::Reaper::start(crate::cgroup::reaper::THREADS),
            tx,
            rx,
        }
    }

    /// `kill`s the processes in `dir` (the pod `uid`'s cgroup) with the reaping threads
    /// waiting for them ([`crate::cgroup::reaper::Reaper::reap_around`]).
    fn reap_around<R>(&self, uid: &str, dir: &std::path::Path, kill: impl FnOnce() -> R) -> R {
        let tx = self.tx.clone();
        let uid = uid.to_owned();
        self.reaper.reap_around(dir, kill, move |r, at| {
            let _ = tx.send((uid, r, at));
        })
    }
}

/// The next reaped pod, or never without reaping threads.
async fn reaped(reaping: &mut Option<Reaping>) -> ReapedPod {
    match reaping {
        Some(r) => match r.rx.recv().await {
            Some(p) => p,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// How soon the manager looks again when the victim's stop answered but its memory cgroup is
/// still there (the kernel removes it a moment later).
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
    /// The kubepods cgroup of the crossing tripwire (v2 `memory.high`, v1 a usage threshold).
    pub tripwire: Option<TripwireCgroup>,
    /// The node's stats collector: all reading happens on its thread.
    pub stats: StatsCollector,
    pub link: NodeLink,
    /// Container names and ids of the running pods (for per-container usage).
    pub status: StatusManager,
    pub housekeeping: Duration,
    /// The runtime for node-level reclaim before disk-pressure evictions (`None`: no pods run).
    pub node_reclaim: Option<Arc<CriRuntime>>,
    /// The image garbage collector node-level reclaim asks to delete unused images
    /// (`DeleteUnusedImages`); `None`: images are left.
    pub image_gc: Option<Arc<crate::cri::images::ImageGc>>,
    /// Told of every wakeup and of the signal pipeline ending (`/healthz`).
    pub health: Arc<Health>,
    /// `EvictionThresholdMet` on the node, `Evicted` on the pod (cluster mode).
    pub events: crate::recorder::Recorder,
    /// Companion mode (`crate::companion`): kubelet removes the victim's pod cgroup, so its
    /// release is its processes being gone (the companion says so), and each kill record
    /// says what kubelet would have done.
    pub companion: bool,
}

impl EvictionManager {
    /// An eviction the last run decided and did not see released: waited for again (its
    /// cgroup gone), so a restart never means a second victim before the first is freed.
    fn reopen_last_eviction(&self, parts: &mut Parts, state: &mut State, now: Duration) {
        if let Some(r) = parts.kills.reopen(&self.config.enforcer.state_dir) {
            state.cleanup = Some(crate::policy::eviction::manager::CleanupWait {
                uid: r.uid.as_str().into(),
                since: now,
            });
            parts.victim_cgroup = Some(r.cgroup);
            parts.answered = Some(crate::pods::KillDone { stopped_ns: None });
        }
    }

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
        let mut parts = Parts {
            kills: KillLog::open(&self.config.enforcer.state_dir),
            reaping: self.config.enforcer.reap_memory.then(Reaping::start),
            ..Parts::default()
        };
        self.reopen_last_eviction(&mut parts, &mut state, start.elapsed());
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
            parts.trigger = None;
            let woke = tokio::select! {
                () = &mut stop => break,
                _ = tick.tick() => Woke::Trigger(Trigger::Housekeeping),
                () = deadline => Woke::Trigger(Trigger::Deadline),
                s = pipeline.signals.recv(), if signals_open => match s {
                    None => {
                        tracing::error!("signal pipeline ended; housekeeping continues");
                        self.health.set_pipeline(false);
                        signals_open = false;
                        continue;
                    }
                    Some(s) => Woke::Signal(Box::new(s)),
                },
                // The v1 tripwire: a usage threshold this thread's reactor waits on itself.
                s = self.wire_fired(parts.wire.fd.as_deref(), parts.wire.missed) => {
                    parts.wire.missed = false;
                    Woke::Signal(Box::new(s))
                }
                done = answered(&mut parts.answer) => {
                    parts.answered = Some(done);
                    Woke::Trigger(Trigger::Released)
                }
                r = tripwire::wire_registered(&mut parts.wire.pending) => {
                    self.install_wire(r, &mut parts.wire);
                    continue;
                }
                (uid, r, at) = reaped(&mut parts.reaping) => {
                    tracing::debug!(%uid, reaped = %r, "the victim's memory reaped");
                    parts.kills.reaped(&uid, &r, at);
                    continue;
                }
            };
            let trigger = match woke {
                Woke::Trigger(t) => t,
                Woke::Signal(s) => {
                    let s = *s;
                    log_signal(&s);
                    if !is_pressure(&s) {
                        continue;
                    }
                    let floor = last_step + MIN_STEP_INTERVAL;
                    self.absorb(&s, &mut parts, &mut named, false);
                    let wire = parts.wire.fd.clone();
                    let urgent = gather_burst(
                        &mut pipeline.signals,
                        is_urgent(&s),
                        floor,
                        self.wire_fired(wire.as_deref(), false),
                        |more, urgent| {
                            log_signal(more);
                            self.absorb(more, &mut parts, &mut named, urgent);
                        },
                    )
                    .await;
                    if urgent {
                        Trigger::Crossing
                    } else {
                        Trigger::Signal
                    }
                }
            };
            last_step = tokio::time::Instant::now();
            if trigger == Trigger::Housekeeping {
                // Off the signal path: a slow runtime never delays a signal-driven step.
                self.learn_imagefs(start.elapsed(), &mut parts.imagefs)
                    .await;
            }
            state = self
                .step(state, start.elapsed(), trigger, &named, &mut parts)
                .await;
            self.report(&state, &mut parts.reporter);
            due = next_deadline(&self.config.eviction, &state, start.elapsed()).map(|d| start + d);
            // The victim's stop answered, its memory cgroup not gone yet: look again soon.
            if state.cleanup.is_some() && parts.answered.is_some() {
                let soon = tokio::time::Instant::now() + CLEANUP_POLL;
                due = Some(due.map_or(soon, |d| d.min(soon)));
            }
        }
        // Nobody watches the tripwire once the manager stops: leave kubepods unthrottled.
        self.write_tripwire(Tripwire::Off, &mut parts.wire);
    }

    /// One step: observe, let the decision core decide (`policy::eviction::manager::step`),
    /// carry out and record what it decided. After [`Action::Reobserve`] (every pod read
    /// again) or [`Action::ReclaimNodeLevel`] (reclaimed, the node observed again) the core
    /// is asked again with what that observed: at most three rounds.
    async fn step(
        &self,
        state: State,
        now: Duration,
        trigger: Trigger,
        named: &[String],
        parts: &mut Parts,
    ) -> State {
        // What reaping ended before this step is in its victim's kill record first.
        if let Some(r) = parts.reaping.as_mut() {
            while let Ok((uid, reaped, at)) = r.rx.try_recv() {
                parts.kills.reaped(&uid, &reaped, at);
            }
        }
        // kubelet's waitForPodsCleanup: whether the last victim is released is looked at
        // before observing, so the step that sees it released observes what it freed.
        let released = state.cleanup.as_ref().is_some_and(|_| self.released(parts));
        let (active, targets) =
            self.targets_for(trigger, state.awaited(now, released), &mut parts.targets);
        let refresh = refresh_for(trigger, named);
        let mut pods_fresh = refresh.pods.every_pod();
        let began = std::time::Instant::now();
        let mut read_from = crate::signal::monotonic_ns();
        let mut snapshot = match self.stats.refresh(refresh, targets.clone(), now).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "observing the node failed; skipping this step");
                return state;
            }
        };
        let mut read = (read_from, crate::signal::monotonic_ns());
        let is_active = |uid: &str| active.contains_key(uid);
        // After node-level reclaim: the node observed again (`None`: that failed).
        let mut reclaimed: Option<Option<Arc<NodeSnapshot>>> = None;
        let mut decision_ns = None;
        let mut state = state;
        for _round in 0..3 {
            let pods = active_pods(&snapshot, &active);
            let input = Input {
                observations: &snapshot.observations,
                pods: &pods,
                now,
                pods_fresh,
                local_storage_walked: trigger_walks(trigger),
                released,
                is_active: &is_active,
                node_reclaim: reclaimed.as_ref().map(|r| match r {
                    Some(s) => NodeReclaimed::Observed(&s.observations),
                    None => NodeReclaimed::Failed,
                }),
            };
            let (next, decision) = step(&self.config.eviction, state, &input);
            state = next;
            // A capped victim still stopping, the node below its floor: killed first.
            if let Some(uid) = &decision.kill_throttled {
                self.kill_throttled(uid, parts);
            }
            if decision.action == Action::Reobserve {
                // A victim is chosen on every pod's fresh figures: before evicting on figures
                // some of which were carried over, read every pod again and decide again. For
                // memory, as at a crossing, every pod's usage counter (microseconds each); for
                // the other resources every pod in full.
                let memory = matches!(decision.reclaim, Some((_, Resource::Memory)));
                let again = Refresh {
                    pods: if memory {
                        PodScope::Usage
                    } else {
                        PodScope::All
                    },
                    logs: false,
                };
                read_from = crate::signal::monotonic_ns();
                match self.stats.refresh(again, targets.clone(), now).await {
                    Ok(s) => {
                        snapshot = s;
                        read = (read_from, crate::signal::monotonic_ns());
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "observing the pods failed; skipping this step");
                        return state;
                    }
                }
                pods_fresh = true;
                continue;
            }
            let decided = *decision_ns.get_or_insert_with(crate::signal::monotonic_ns);
            if let Action::ReclaimNodeLevel { signal, .. } = decision.action {
                // The conditions and the node event before the reclaim, as kubelet's.
                self.report_decision(&decision, trigger, parts);
                tracing::debug!(%signal, "node-level reclaim before evicting");
                reclaimed = Some(self.node_level_reclaim(now, targets.clone()).await);
                continue;
            }
            let evict = decision.eviction().is_some();
            let seen = Observed {
                snapshot: &snapshot,
                pods: &pods,
                active: &active,
                now,
                trigger,
                read,
                decision_ns: decided,
            };
            if !self.carry_out(decision, &seen, parts) {
                state.throttled = None;
            }
            tracing::debug!(%trigger, observe_decide_act_us = began.elapsed().as_micros(), evict, "step done");
            break;
        }
        self.place_tripwire(&snapshot, state.cleanup.is_some(), &mut parts.wire);
        state
    }
}

/// Resolves with the last eviction's answer; never while none is awaited. A stop that can no
/// longer answer (the pod had no worker) answers "done, no times".
async fn answered(answer: &mut Option<tokio::sync::oneshot::Receiver<KillDone>>) -> KillDone {
    let Some(rx) = answer.as_mut() else {
        return std::future::pending().await;
    };
    let done = rx.await.unwrap_or(KillDone { stopped_ns: None });
    *answer = None;
    done
}
