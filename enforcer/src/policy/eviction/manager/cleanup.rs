//! kubelet's `waitForPodsCleanup`: after an eviction the manager waits for the victim's
//! resources to be released before it evicts another pod.

use std::{sync::Arc, time::Duration};

/// kubelet's `podCleanupTimeout`: the longest the manager waits for an evicted pod's
/// resources to be released before it may evict another.
pub const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// kubelet's `waitForPodsCleanup` as state: after an eviction no further pod is evicted until
/// the victim's resources are released (its worker finished: containers, logs and pod cgroup
/// removed) or [`POD_CLEANUP_TIMEOUT`] passed. kubelet blocks its loop in that wait; stepping
/// on kernel signals, the enforcer keeps stepping (conditions stay current) but holds back
/// evictions, and the step after the release observes anew, so what the victim freed is seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupWait {
    /// The evicted pod.
    pub uid: Arc<str>,
    /// When it was evicted.
    pub since: Duration,
}

/// What a [`CleanupWait`] says at a step.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleanup {
    /// Still waiting: no eviction in this step.
    Waiting,
    /// The victim's resources were released: observe anew, then evictions may resume.
    Released,
    /// The wait timed out (kubelet logs and goes on).
    TimedOut,
}

impl CleanupWait {
    /// Whether the wait is over at `now`, given whether the victim's resources are released.
    pub fn check(&self, now: Duration, released: bool) -> Cleanup {
        if released {
            Cleanup::Released
        } else if now.saturating_sub(self.since) >= POD_CLEANUP_TIMEOUT {
            Cleanup::TimedOut
        } else {
            Cleanup::Waiting
        }
    }
}

/// The end of a cleanup wait, decided by a step (for the kill record and the log).
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupEnd {
    /// The evicted pod.
    pub uid: Arc<str>,
    /// True when its resources were released; false when the wait timed out.
    pub released: bool,
    /// How long the wait lasted.
    pub waited: Duration,
}

/// The wait at `now`: the wait going on (`None` once it is over) and how it ended, if it
/// ended now.
pub(super) fn advance(
    wait: Option<CleanupWait>,
    now: Duration,
    released: bool,
) -> (Option<CleanupWait>, Option<CleanupEnd>) {
    let Some(wait) = wait else {
        return (None, None);
    };
    let released = match wait.check(now, released) {
        Cleanup::Waiting => return (Some(wait), None),
        Cleanup::Released => true,
        Cleanup::TimedOut => false,
    };
    let waited = now.saturating_sub(wait.since);
    let end = CleanupEnd {
        uid: wait.uid,
        released,
        waited,
    };
    (None, Some(end))
}
