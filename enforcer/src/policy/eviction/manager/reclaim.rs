//! Node-level reclaim before disk-pressure evictions (`reclaimNodeLevelResources`): its
//! pacing and whether it resolved the pressure.

use std::time::Duration;

use super::{EvictionConfig, synchronize::met};
use crate::policy::eviction::Observations;

/// Minimum time between two node-level reclaims (and so between two disk-pressure
/// evictions); kubelet's is its 10 s housekeeping period.
pub const NODE_RECLAIM_INTERVAL: Duration = Duration::from_secs(1);

/// Paces node-level reclaim: at most one per [`NODE_RECLAIM_INTERVAL`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimPacer {
    last: Option<Duration>,
}

impl ReclaimPacer {
    /// Whether a reclaim may run at `now`; when it may, it is counted as run.
    pub fn due(&mut self, now: Duration) -> bool {
        let ready = self.ready(now);
        if ready {
            self.ran(now);
        }
        ready
    }

    /// Whether a reclaim may run at `now` (nothing counted).
    #[must_use]
    pub fn ready(&self, now: Duration) -> bool {
        self.last
            .is_none_or(|at| now.saturating_sub(at) >= NODE_RECLAIM_INTERVAL)
    }

    /// Counts a reclaim as run at `now`.
    pub fn ran(&mut self, now: Duration) {
        self.last = Some(now);
    }
}

/// After node-level reclaim for a disk signal: true when, with the new observations, no
/// threshold is met counting minimum reclaim, so no pod needs to be evicted
/// (`reclaimNodeLevelResources`).
#[must_use]
pub fn resolved_after_node_reclaim(config: &EvictionConfig, observations: &Observations) -> bool {
    met(config, 0..config.thresholds.len(), observations, true).is_empty()
}
