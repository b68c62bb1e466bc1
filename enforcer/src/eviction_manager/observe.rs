//! What the eviction manager observes for a step: the pods to read, the node and pods
//! themselves (through the stats collector), the last victim's release, the imagefs, and the
//! node after a node-level reclaim.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use super::{EvictionManager, Trigger};
use crate::{
    cgroup::PodCgroup,
    pods::ActiveEntry,
    policy::eviction::ActivePod,
    stats::{NodeSnapshot, PodScope, PodTarget, Refresh},
};

/// The targets of the last step ([`EvictionManager::targets_for`]).
#[derive(Debug)]
pub(super) struct TargetCache {
    active: Arc<BTreeMap<String, ActiveEntry>>,
    victim: Option<String>,
    targets: Arc<[PodTarget]>,
}

/// How often the runtime is asked for its image filesystem until it answers.
const IMAGEFS_RETRY: Duration = Duration::from_secs(10);

pub use crate::cri::images::imagefs_mountpoint;

/// What a step on `trigger` reads: everything on the housekeeping tick, at a due instant and
/// once the last victim is released (what it freed); on a signal, the node and the pods it
/// names (`named`).
pub(super) fn refresh_for(trigger: Trigger, named: &[String]) -> Refresh {
    match trigger {
        // A crossing is the moment to evict: every pod's memory now, one usage counter
        // each through its open file (`stats::PodScope::Usage`).
        Trigger::Crossing => Refresh {
            pods: PodScope::Usage,
            logs: false,
        },
        Trigger::Signal => Refresh {
            pods: PodScope::Named(named.to_vec()),
            logs: false,
        },
        Trigger::Housekeeping | Trigger::Deadline | Trigger::Released => Refresh::full(),
    }
}

/// Whether a step on this trigger walks the pods' directories (local storage figures).
pub(super) fn trigger_walks(t: Trigger) -> bool {
    matches!(
        t,
        Trigger::Housekeeping | Trigger::Deadline | Trigger::Released
    )
}

/// The decision core's view of the active pods that have a sample in `snapshot`.
pub(super) fn active_pods<'a>(
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

/// Whether the runtime told its image filesystem yet, and when it was last asked.
#[derive(Debug, Default)]
pub(super) struct ImagefsProbe {
    asked: Option<Duration>,
    known: bool,
}

impl EvictionManager {
    /// kubelet's imagefs is where the runtime keeps its images (CRI `ImageFsInfo`); until the
    /// runtime answers (or without a runtime) the observer keeps its default.
    pub(super) async fn learn_imagefs(&mut self, now: Duration, imagefs: &mut ImagefsProbe) {
        let Some(rt) = &self.node_reclaim else {
            return;
        };
        if imagefs.known
            || imagefs
                .asked
                .is_some_and(|t| now.saturating_sub(t) < IMAGEFS_RETRY)
        {
            return;
        }
        imagefs.asked = Some(now);
        match rt.image_fs_info().await {
            Ok(fs) => {
                imagefs.known = true;
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

    /// Whether the last victim's resources are released: its stop answered (its worker
    /// finished: containers stopped and removed, logs and pod cgroup removed; beside kubelet,
    /// its processes gone, the companion's word) and, with a worker of ours, its memory cgroup
    /// is gone.
    pub(super) fn released(&self, parts: &super::Parts) -> bool {
        if parts.answered.is_none() {
            return false;
        }
        if self.companion {
            return true;
        }
        parts.victim_cgroup.as_deref().is_none_or(|cgroup| {
            PodCgroup::resolve(&self.layout, cgroup).is_none_or(|p| !p.exists())
        })
    }

    /// Disk pressure: dead containers, then unused images, through CRI; then re-observe.
    /// Returns the node observed after the reclaim (`None`: no runtime, or the reclaim or the
    /// observation failed).
    pub(super) async fn node_level_reclaim(
        &self,
        now: Duration,
        targets: Arc<[PodTarget]>,
    ) -> Option<Arc<NodeSnapshot>> {
        let rt = self.node_reclaim.as_ref()?;
        let active = self.link.active();
        let status = self.status.clone();
        let running = move |uid: &str| {
            active.contains_key(uid) && status.get(uid).is_none_or(|r| !r.phase.is_terminal())
        };
        match crate::cri::gc::reclaim_node_level(rt.as_ref(), self.image_gc.as_deref(), &running)
            .await
        {
            Ok(r) => tracing::info!(
                containers = r.containers,
                log_bytes = r.log_bytes,
                images = r.images,
                "node-level reclaim"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "node-level reclaim failed");
                return None;
            }
        }
        let again = Refresh {
            pods: PodScope::New,
            logs: false,
        };
        self.stats
            .refresh(again, targets, now)
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "observing the node after reclaim failed"))
            .ok()
    }

    /// [`Self::targets`]; at a crossing, the last ones again while the active set and the
    /// victim are the same (no status record copied, nothing allocated on the crossing's
    /// path; a container restarted since shows its new figures at the next step).
    pub(super) fn targets_for(
        &self,
        trigger: Trigger,
        victim: Option<&str>,
        cache: &mut Option<TargetCache>,
    ) -> (Arc<BTreeMap<String, ActiveEntry>>, Arc<[PodTarget]>) {
        let active = self.link.active();
        if trigger == Trigger::Crossing
            && let Some(c) = cache
            && Arc::ptr_eq(&c.active, &active)
            && c.victim.as_deref() == victim
        {
            return (active, c.targets.clone());
        }
        let targets = self.targets(&active, victim);
        *cache = Some(TargetCache {
            active: active.clone(),
            victim: victim.map(str::to_owned),
            targets: targets.clone(),
        });
        (active, targets)
    }

    /// The pods to collect stats of: the active pods (kubelet's active pods: not one that ran
    /// to its end, which holds no memory worth reclaiming, nor the victim being cleaned up),
    /// with their containers' runtime ids.
    pub(super) fn targets(
        &self,
        active: &BTreeMap<String, ActiveEntry>,
        victim: Option<&str>,
    ) -> Arc<[PodTarget]> {
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
        targets.into()
    }
}
